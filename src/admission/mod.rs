//! Flow control: when every pod that could serve a request is full, the request waits at the
//! gateway instead of in one engine's queue, and is released late, in order, to the pod that frees
//! first.
//!
//! **Full.** A pod is full when its queue (requests not yet started: the engine's polled waiting
//! count or this gateway's own requests before their first byte, whichever is more,
//! `PodView::queue`) reaches `flow_control.queue_depth`, or its KV cache is `kv_cache` used. The
//! board's count moves the moment a request is routed or its first byte comes back, so the gate
//! reacts at once where the polled count alone would lag a poll interval (the Inference
//! Extension's saturation detector reads only the poll). A request is held when every candidate is
//! full, and also whenever a request for the same model is already held in this VM: a newcomer
//! must not pass the queue (that is the hysteresis: holding starts when the last pod fills and
//! ends only when the queue has drained, not each time one slot opens).
//!
//! **Release.** On every tick (at least every 20 ms with flow control on; completions in any VM
//! show on the shared board there), the queue's next request is planned again with
//! the then-current view, the pods' caches and load as they are now; if a pod has room it goes
//! there and the next is tried, otherwise it stays at the head. Late binding: a request goes to
//! the pod that freed first, holding the freshest prefix placement, not to whichever looked best
//! when it arrived.
//!
//! **Order** ([`HeldQueue`]). Strict priority between bands (the priority header; higher first),
//! round-robin between flows within a band (the fairness header, `x-gateway-inference-fairness-id`
//! as in the Inference Extension; else the session; else one shared flow), FIFO within a flow: a
//! tenant sending a burst gets one release per turn like every other tenant waiting, not all of
//! its burst first.
//!
//! **Bounds.** At most `max_held` requests per VM (a request beyond gets 429 `queue_full` at
//! once); a request held `ttl_ms` gets 429 `queue_timeout` with `Retry-After`; a client that
//! disconnects leaves the queue at once. Envoy keeps each held request's body in its buffer, as
//! for any paused request; kvroute keeps a few dozen bytes per request.
//!
//! **Across workers** ([`board`]): each worker VM holds its own requests (only it can resume them);
//! a held board in shared data carries what each holds and which flows it served lately, so the
//! strict priority and the flows' turns hold across the whole Envoy.
//!
//! **Left for later.** Round-robin counts requests, not tokens. A head of the queue whose pods are
//! still full blocks the requests behind it, those for other models too. Negative priorities are still shed
//! (`crate::scheduler::saturation`) before they would be held.

pub mod board;

use crate::common::{at_least, ConfigError};
use hashbrown::HashMap;
use serde::Deserialize;
use std::collections::{BTreeMap, VecDeque};

/// `flow_control` in the configuration's wire form.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct FlowControlConfig {
    /// Hold requests at the gateway while every candidate pod is full (off by default).
    pub enabled: bool,
    /// Requests not yet started at which a pod is full.
    pub queue_depth: f64,
    /// KV-cache utilisation (0..1] at which a pod is full.
    pub kv_cache: f64,
    /// Held requests per worker VM; past it a request is answered 429 `queue_full`.
    pub max_held: usize,
    /// A request held this long is answered 429 `queue_timeout`.
    pub ttl_ms: u64,
    /// Request header naming the request's flow (tenant); empty: flows are sessions.
    pub fairness_header: String,
}

impl Default for FlowControlConfig {
    fn default() -> Self {
        FlowControlConfig {
            enabled: false,
            queue_depth: 4.0,
            kv_cache: 0.9,
            max_held: 1024,
            ttl_ms: 30_000,
            fairness_header: "x-gateway-inference-fairness-id".to_string(),
        }
    }
}

/// Flow control as the request path uses it; `None` in the configuration when it is off.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowControl {
    pub queue_depth: f64,
    pub kv_cache: f64,
    pub max_held: usize,
    pub ttl_ms: u64,
    pub fairness_header: Option<crate::common::HeaderName>,
}

impl FlowControlConfig {
    pub fn compile(&self) -> Result<Option<FlowControl>, ConfigError> {
        at_least("flow_control.queue_depth", self.queue_depth, 1.0)?;
        if !(self.kv_cache > 0.0 && self.kv_cache <= 1.0) {
            return Err(ConfigError::at(
                "flow_control.kv_cache",
                "must be in (0, 1]",
            ));
        }
        if self.max_held == 0 {
            return Err(ConfigError::at("flow_control.max_held", "must be positive"));
        }
        if self.ttl_ms == 0 {
            return Err(ConfigError::at("flow_control.ttl_ms", "must be positive"));
        }
        let fairness_header = crate::common::HeaderName::optional(
            "flow_control.fairness_header",
            &self.fairness_header,
        )?;
        Ok(self.enabled.then_some(FlowControl {
            queue_depth: self.queue_depth,
            kv_cache: self.kv_cache,
            max_held: self.max_held,
            ttl_ms: self.ttl_ms,
            fairness_header,
        }))
    }
}

impl FlowControl {
    /// Whether a pod with `queue` requests not yet started (`PodView::queue`) and `kv_usage` of
    /// its KV cache used is full.
    pub fn is_full(&self, queue: f64, kv_usage: f64) -> bool {
        queue >= self.queue_depth || kv_usage >= self.kv_cache
    }

    /// Whole seconds a client is told to wait before retrying a request that timed out held.
    pub fn retry_after_s(&self) -> u64 {
        self.ttl_ms.div_ceil(1000).clamp(1, 60)
    }
}

/// One held request: the host's handle for it (its HTTP context) and what orders it.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    pub id: u32,
    pub model: String,
    pub priority: i32,
    pub flow: u64,
    pub since_ms: u64,
}

/// The held requests of one VM, in release order (see the module header).
#[derive(Debug, Default)]
pub struct HeldQueue {
    /// By priority, highest first (iterated from the back).
    bands: BTreeMap<i32, Band>,
    /// Where each held request is: its band and flow.
    at: HashMap<u32, (i32, u64)>,
    /// Held requests per model (a newcomer for a model with any held waits behind them).
    per_model: HashMap<String, usize>,
}

#[derive(Debug, Default)]
struct Band {
    /// Flows with held requests, in turn order: the front's next request is the band's next.
    turns: VecDeque<u64>,
    flows: HashMap<u64, VecDeque<Held>>,
}

/// The queue is at `max_held`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

impl HeldQueue {
    pub fn len(&self) -> usize {
        self.at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    pub fn holds_model(&self, model: &str) -> bool {
        self.per_model.get(model).is_some_and(|n| *n > 0)
    }

    pub fn contains(&self, id: u32) -> bool {
        self.at.contains_key(&id)
    }

    /// Adds `held` behind its flow's earlier requests; a flow new to its band takes its turn last.
    pub fn hold(&mut self, held: Held, max_held: usize) -> Result<(), QueueFull> {
        if self.at.len() >= max_held {
            return Err(QueueFull);
        }
        if self.at.contains_key(&held.id) {
            return Ok(());
        }
        self.at.insert(held.id, (held.priority, held.flow));
        *self.per_model.entry(held.model.clone()).or_default() += 1;
        let band = self.bands.entry(held.priority).or_default();
        let flow = band.flows.entry(held.flow).or_default();
        if flow.is_empty() {
            band.turns.push_back(held.flow);
        }
        flow.push_back(held);
        Ok(())
    }

    /// The held request `id`, if it is held.
    pub fn get(&self, id: u32) -> Option<&Held> {
        let (priority, flow) = self.at.get(&id)?;
        self.bands
            .get(priority)?
            .flows
            .get(flow)?
            .iter()
            .find(|h| h.id == id)
    }

    /// The request to release next: in the highest band, the flow `last_served` (ms; 0 for never)
    /// says was served longest ago, turn order breaking ties (round-robin when every flow counts
    /// as never served); its oldest request. With other workers' releases in `last_served`
    /// (`board::HeldRow::next`), the round-robin between flows holds across the whole Envoy.
    pub fn next_by(&self, last_served: impl Fn(u64) -> u64) -> Option<&Held> {
        let band = self.bands.values().next_back()?;
        let flow = band
            .turns
            .iter()
            .enumerate()
            .min_by_key(|(turn, flow)| (last_served(**flow), *turn))
            .map(|(_, flow)| flow)?;
        band.flows.get(flow)?.front()
    }

    /// What this VM holds, for the other workers: the number held per (priority, model, flow) and
    /// since when the oldest waits, highest priority first, at most `limit` of them
    /// (`board::HeldRow`).
    pub fn summary(&self, limit: usize) -> Vec<board::Waiting> {
        let mut out = Vec::new();
        for (priority, band) in self.bands.iter().rev() {
            for flow in &band.turns {
                let Some(requests) = band.flows.get(flow) else {
                    continue;
                };
                // Per model: how many, and since when the oldest waits (the flow is FIFO).
                let mut per_model: Vec<(u64, u32, u64)> = Vec::new();
                for held in requests {
                    let model = board::model_key(&held.model);
                    match per_model.iter_mut().find(|(m, _, _)| *m == model) {
                        Some((_, n, _)) => *n += 1,
                        None => per_model.push((model, 1, held.since_ms)),
                    }
                }
                for (model, count, oldest_ms) in per_model {
                    if out.len() >= limit {
                        return out;
                    }
                    out.push(board::Waiting {
                        priority: *priority,
                        model,
                        flow: *flow,
                        count,
                        oldest_ms,
                    });
                }
            }
        }
        out
    }

    /// Takes `id` out of the queue (released, expired or gone). Releasing the head of a flow
    /// passes the band's turn to the next flow.
    pub fn remove(&mut self, id: u32) -> Option<Held> {
        let (priority, flow_id) = self.at.remove(&id)?;
        let band = self.bands.get_mut(&priority)?;
        let flow = band.flows.get_mut(&flow_id)?;
        let position = flow.iter().position(|h| h.id == id)?;
        let held = flow.remove(position)?;
        let was_turn = band.turns.front() == Some(&flow_id);
        if flow.is_empty() {
            band.flows.remove(&flow_id);
            band.turns.retain(|f| *f != flow_id);
        } else if was_turn && position == 0 {
            band.turns.rotate_left(1);
        }
        if band.turns.is_empty() {
            self.bands.remove(&priority);
        }
        if let Some(n) = self.per_model.get_mut(&held.model) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_model.remove(&held.model);
            }
        }
        Some(held)
    }

    /// The requests held `ttl_ms` or longer by `now_ms`, oldest first (still in the queue).
    pub fn expired(&self, now_ms: u64, ttl_ms: u64) -> Vec<u32> {
        let mut old: Vec<(u64, u32)> = self
            .bands
            .values()
            .flat_map(|b| b.flows.values().flatten())
            .filter(|h| now_ms.saturating_sub(h.since_ms) >= ttl_ms)
            .map(|h| (h.since_ms, h.id))
            .collect();
        old.sort_unstable();
        old.into_iter().map(|(_, id)| id).collect()
    }
}

/// Every `band` label value ([`band_label`]).
pub const BANDS: [&str; 3] = ["high", "default", "sheddable"];

/// The `band` label of a priority: bounded, so a client cannot mint series.
pub fn band_label(priority: i32) -> &'static str {
    match priority {
        p if p > 0 => "high",
        0 => "default",
        _ => "sheddable",
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests;
