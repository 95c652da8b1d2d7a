//! Which names a pod answers to, from its OpenAI model list (`GET /v1/models`, as vLLM and SGLang
//! serve it): every entry's `id` is a name a request's `model` may use — each of vLLM's
//! `--served-model-name` aliases, and each loaded LoRA adapter (`--lora-modules`, or loaded at run
//! time), which carries `parent`, its base model's name. `root` is what the entry was loaded from
//! (the base model's path for every alias, the adapter's path for an adapter); `max_model_len` is
//! the context length.
//!
//! The prefix cache follows the weights, not the name: a pod's aliases share one KV cache, and each
//! adapter has its own (vLLM keys cached blocks by the LoRA adapter too). So a request's hash chain
//! is seeded by its cache key: an alias's key is the pod's first base name with the same `root`
//! (the name vLLM labels its metrics with), an adapter's key is its own name.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Entries kept per pod: bounds the load table whatever a pod lists.
pub const MAX_MODELS_PER_POD: usize = 64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServedModel {
    pub id: String,
    /// A LoRA adapter's base model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u64>,
}

/// The entries of a `/v1/models` answer; `None` when the body is not an OpenAI model list.
pub fn parse(body: &[u8]) -> Option<Vec<ServedModel>> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let data = value.get("data")?.as_array()?;
    let text = |entry: &Value, key: &str| {
        entry
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let mut models: Vec<ServedModel> = Vec::new();
    for entry in data {
        let Some(id) = text(entry, "id") else {
            continue;
        };
        if models.len() >= MAX_MODELS_PER_POD || models.iter().any(|m| m.id == id) {
            continue;
        }
        models.push(ServedModel {
            id,
            parent: text(entry, "parent"),
            root: text(entry, "root"),
            max_model_len: entry.get("max_model_len").and_then(Value::as_u64),
        });
    }
    Some(models)
}

/// The name whose KV cache a request for `name` uses on a pod serving `models`, if it lists `name`.
pub fn cache_key<'a>(models: &'a [ServedModel], name: &str) -> Option<&'a str> {
    let entry = models.iter().find(|m| m.id == name)?;
    if entry.parent.is_some() {
        return Some(&entry.id);
    }
    let base = models
        .iter()
        .find(|m| m.parent.is_none() && entry.root.is_some() && m.root == entry.root)
        .unwrap_or(entry);
    Some(&base.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vLLM 0.10's answer for `--model meta-llama/Llama-3.1-8B-Instruct --served-model-name llama
    /// llama-8b --enable-lora --lora-modules sql-lora=/adapters/sql`.
    const VLLM: &str = r#"{"object":"list","data":[
        {"id":"llama","object":"model","created":1735000000,"owned_by":"vllm","root":"meta-llama/Llama-3.1-8B-Instruct","parent":null,"max_model_len":131072,"permission":[{"id":"modelperm-1","object":"model_permission"}]},
        {"id":"llama-8b","object":"model","created":1735000000,"owned_by":"vllm","root":"meta-llama/Llama-3.1-8B-Instruct","parent":null,"max_model_len":131072,"permission":[]},
        {"id":"sql-lora","object":"model","created":1735000000,"owned_by":"vllm","root":"/adapters/sql","parent":"llama","max_model_len":null,"permission":[]}]}"#;

    #[test]
    fn aliases_share_the_base_cache_and_adapters_have_their_own() {
        let models = parse(VLLM.as_bytes()).unwrap();
        let ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, vec!["llama", "llama-8b", "sql-lora"]);
        assert_eq!(models[0].max_model_len, Some(131072));
        assert_eq!(models[2].parent.as_deref(), Some("llama"));
        assert_eq!(models[2].max_model_len, None);
        assert_eq!(cache_key(&models, "llama"), Some("llama"));
        assert_eq!(cache_key(&models, "llama-8b"), Some("llama"));
        assert_eq!(cache_key(&models, "sql-lora"), Some("sql-lora"));
        assert_eq!(cache_key(&models, "gpt-4"), None);
    }

    #[test]
    fn sglang_and_odd_answers() {
        let sglang = br#"{"object":"list","data":[{"id":"qwen","object":"model","created":1,"owned_by":"sglang","root":"Qwen/Qwen2.5-7B-Instruct","max_model_len":32768}]}"#;
        let models = parse(sglang).unwrap();
        assert_eq!(models.len(), 1);
        assert_eq!(cache_key(&models, "qwen"), Some("qwen"));
        assert_eq!(parse(b"<html>404</html>"), None);
        assert_eq!(parse(br#"{"detail":"Not Found"}"#), None);
        let odd = br#"{"data":[{"id":""},{"object":"model"},{"id":"a"},{"id":"a"},{"id":"b","max_model_len":-1}]}"#;
        let ids: Vec<String> = parse(odd).unwrap().into_iter().map(|m| m.id).collect();
        assert_eq!(
            ids,
            vec!["a", "b"],
            "nameless and repeated entries are skipped"
        );
        let many = format!(
            r#"{{"data":[{}]}}"#,
            (0..100)
                .map(|i| format!(r#"{{"id":"m{i}"}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(parse(many.as_bytes()).unwrap().len(), MAX_MODELS_PER_POD);
    }
}
