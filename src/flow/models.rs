//! The gateway's own model list: `GET /v1/models` (and `GET /v1/models/{id}`) through kvroute is
//! answered with every name the pods kvroute routes to (those not down) serve, each once, in vLLM's card shape (`id`,
//! `root`, `parent` for a LoRA adapter, `max_model_len`), from the load table: the names a request
//! through this gateway can use. Passed through, it would be one random pod's list, which in a pool
//! of several models or adapters names a different subset on every call. Where no healthy pod has
//! reported any name (engines without `/v1/models` nor a `model_name` label) it passes through.

use super::Reply;
use crate::health::{health_of, Health};
use crate::pod::load::LoadTable;
use serde_json::{json, Value};

/// The answer for `path` (`/v1/models` or `/v1/models/{id}`), or `None` to pass it through.
pub fn answer(table: &LoadTable, path: &str, now_ms: u64, stale_after_ms: u64) -> Option<Reply> {
    let path = path.split('?').next().unwrap_or(path).trim_end_matches('/');
    let wanted = match path.strip_prefix("/v1/models") {
        Some("") => None,
        Some(rest) => Some(rest.strip_prefix('/').filter(|id| !id.is_empty())?),
        None => return None,
    };
    let created = now_ms / 1000;
    let mut cards: Vec<Value> = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for pod in table
        .pods
        .iter()
        .filter(|p| health_of(p, now_ms, stale_after_ms) != Health::Down)
    {
        for model in &pod.served {
            if !seen.contains(&model.id.as_str()) {
                seen.push(&model.id);
                cards.push(
                    json!({"id": model.id, "object": "model", "created": created,
                    "owned_by": "kvroute", "root": model.root, "parent": model.parent,
                    "max_model_len": model.max_model_len}),
                );
            }
        }
        // Names known only from metrics (an engine without a model list, or an adapter loaded
        // since the list was read).
        for name in &pod.serves {
            if !seen.contains(&name.as_str()) {
                seen.push(name);
                cards.push(json!({"id": name, "object": "model", "created": created,
                    "owned_by": "kvroute", "root": null, "parent": null, "max_model_len": null}));
            }
        }
    }
    if cards.is_empty() {
        return None;
    }
    let body = match wanted {
        None => json!({"object": "list", "data": cards}),
        Some(id) => match cards.into_iter().find(|c| c["id"] == id) {
            Some(card) => card,
            None => {
                let message = format!("The model `{id}` does not exist.");
                return Some(Reply::error(super::ErrorCode::UnknownModel, &message));
            }
        },
    };
    Some(Reply {
        status: 200,
        headers: vec![("content-type", "application/json".to_string())],
        body: body.to_string().into_bytes(),
    })
}
