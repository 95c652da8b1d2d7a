//! One pod's inference engine: vLLM V1-style continuous batching over a simulated GPU.
//!
//! Each step is scheduled as vLLM V1's scheduler does (`vllm/v1/core/sched/scheduler.py`): first
//! the running requests in order, each taking from one token budget (a decode one token, a prefill
//! its next chunk), then waiting requests FIFO while the budget and `max_num_seqs` allow. The
//! step lasts what the profile's cost model gives for exactly the tokens it holds (seed model:
//! `prefill overhead + per-token prefill cost + decode base + per-sequence decode cost`, with a
//! prefill-only budget; fitted profiles: β0 + β1 · prefill tokens + β2 · decode tokens with vLLM's
//! shared `max_num_batched_tokens`), divided by the pod's speed factor. A long prefill therefore
//! delays every running stream's next token, which is the prefill/decode interference P/D
//! disaggregation removes.
//!
//! KV blocks follow vLLM's block pool (`vllm/v1/core/kv_cache_manager.py`, `block_pool.py`): a
//! request holds the blocks of the tokens it has computed or is computing; full prompt blocks live
//! in the shared prefix cache (counted once however many requests use them) from the moment the
//! step computing them is scheduled, as `allocate_slots` caches them, so a request admitted after
//! them in the same step hits them (`Seq::reserve`); blocks nobody uses stay
//! cached but count as free and are evicted least recently used first. A waiting request is admitted
//! only if its new blocks (plus cached blocks it revives) fit in the free ones; a running request
//! that needs a block when none is free preempts the lowest-priority running request (the last
//! admitted; itself if it is the last), whose blocks are freed and which is recomputed later from
//! the front of the queue (`vllm:num_preemptions_total`). Fitted profiles allocate per chunk as
//! vLLM does; the seed model reserves a whole prompt at admission, as kvsim always did.
//!
//! Cache hits are decided here, at admission, from the pod's own prefix cache; nothing a router sends
//! can claim a hit. A decode pod that received `kv_transfer_params` pulls the missing prompt KV instead
//! of computing it (blocks allocated up front, as the NIXL connector does): the pull costs
//! `kv_transfer_us_per_token` (seed model) or the KV bytes over the pod's link, shared equally by
//! concurrent pulls (fitted profiles), and like NIXL's asynchronous reads it delays only that
//! request, not the batch. When it completes the prefill pod is told, and only then frees the blocks
//! it held for the pull (or after `kv_hold_timeout_s`).
//!
//! A pod may have a host-memory tier behind the GPU (`cpu_offload_blocks`; none by default), as
//! vLLM's native CPU offloading connector gives it: write-through, every full prompt block that
//! lands on the GPU is also stored in host memory (an LRU of block hashes, asynchronously: no step
//! waits). A request admitted with blocks beyond its GPU prefix hit that host memory holds, in a row,
//! loads them instead of computing them: like a pull it waits (counted as waiting, vLLM's
//! `WAITING_FOR_REMOTE_KVS`) for their bytes over `cpu_offload_gbps`, shared equally by concurrent
//! loads, then joins the batch with them computed, and they become GPU cache blocks. Loaded tokens
//! count in the request's `cached_tokens` and in vLLM's `external_prefix_cache_*` counters, not in
//! the GPU prefix cache's. A request that brings a prefill pod's KV pulls it rather than loading.
//!
//! Per-request overheads of a fitted profile, applied as BLIS applies them: α0 + α1 · input length
//! from arrival until the request is queued, and α2 per output token on its way to the client
//! (BLIS's `OutputTokenProcessingTime`: every inter-token latency is the step plus α2, so a request
//! sees α2 per output token in its E2E). The GPU's steps and the request's KV blocks do not wait
//! for it: the engine frees a finished request at its last step.
//!
//! Time: step durations are simulated and slept scaled by `time_scale`. Deadlines chain from the
//! previous step's deadline rather than from "now", so timer granularity (~1 ms) does not accumulate
//! into slower decoding at small time scales, and metrics record the modelled durations exactly.
//!
//! LoRA adapters follow vLLM V1 (`scheduler.py`, `lora/worker_manager.py`): a step runs at most
//! `max_loras` distinct adapters; a waiting request whose adapter would be one too many is skipped
//! (it keeps its place at the head of the queue and later requests may pass it) until the
//! adapters of the running requests leave a slot. A request whose adapter is not in one of the
//! `max_loras` GPU slots loads it first, least recently used slot evicted: the load runs before
//! the step's forward pass, so the whole step takes `lora_load_ms` longer (vLLM's
//! `set_active_adapters` in the model runner; vllm-project/vllm#31941 "LoRA must first
//! sequentially load all the LoRA layers before beginning Pre-Fill"). `max_cpu_loras` is left at
//! its default (equal to `max_loras`), so every load reads the adapter anew.
//!
//! Files: `seq.rs` a request inside the engine (its progress, blocks and event delivery);
//! `scheduler.rs` the step loop's state and vLLM's `schedule()`, admission, preemption and the end
//! of a step; `transfer.rs` KV pulled from and held for other pods, and the links pulls and host
//! loads share; `offload.rs` the host tier's write-through and lookup; `probe.rs` the what-if
//! estimate behind `POST /sim/probe`; `tests.rs` step-by-step scheduler and block-pool cases.

// `crate::probe` answers with this module's `ProbeEstimate` (and its docs link to it).
mod offload;
pub(super) mod probe;
mod scheduler;
mod seq;
#[cfg(test)]
mod tests;
mod transfer;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::cache::{HostCache, PrefixCache};
use super::config::SimConfig;
use super::metrics::{Counters, Latencies, Snapshot};

use scheduler::{Plan, State};
use seq::{deliver, Seq, Sink};

/// If the engine fell this far behind its own schedule (an overloaded host), it stops catching up and
/// restarts the clock from now instead of bursting through missed steps.
const MAX_LAG: Duration = Duration::from_millis(50);

/// What the HTTP layer asks the engine to run.
#[derive(Debug, Clone)]
pub struct SeqSpec {
    pub prompt_tokens: usize,
    /// Chained hashes of the prompt's full blocks.
    pub block_hashes: Vec<u64>,
    pub max_tokens: usize,
    /// Prompt tokens whose KV a prefill pod computed for this request (0 = none); the engine pulls
    /// whatever its own cache lacks.
    pub remote_tokens: usize,
    /// The request is a prefill for a remote decoder: report the KV block ids it occupies.
    pub report_block_ids: bool,
    /// Where pulled KV comes from: told when the pull has completed, so it can free its blocks.
    pub pull_source: Option<PullSource>,
    /// The LoRA adapter the request runs with (`None`: the base model).
    pub adapter: Option<String>,
}

/// The prefill pod a decode request pulls from (from its `kv_transfer_params`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullSource {
    /// `remote_engine_id` (kvsim: the prefill pod's `ip:port`).
    pub engine_id: String,
    /// `remote_host:remote_port`, when given.
    pub host_port: Option<String>,
    /// The first of `remote_block_ids`: the key the prefill pod holds the blocks under.
    pub first_block: u64,
    /// Where the prefill pod is (its `kvsim_locality`), which times the pull.
    pub locality: Option<String>,
}

type PullHook = Arc<dyn Fn(PullSource) + Send + Sync>;

#[derive(Debug)]
pub enum SeqEvent {
    /// Token `index` (0-based) was generated, for a prompt of `prompt_tokens` of which
    /// `cached_tokens` were not computed here (as `Outcome` counts them: SGLang reports them in
    /// every streamed chunk).
    Token {
        index: usize,
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    Finished(Outcome),
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens not computed here: local prefix-cache hits, KV pulled from a prefill pod and
    /// KV loaded from the host tier (vLLM V1 reports them all as `cached_tokens`: external computed
    /// tokens count in `num_cached_tokens`).
    pub cached_tokens: usize,
    pub block_ids: Vec<u64>,
}

pub struct Engine {
    cfg: SimConfig,
    state: Mutex<State>,
    wake: Notify,
    pull_hook: Mutex<Option<PullHook>>,
    /// Bumped by `restart`; a step planned before it is never finished.
    restarts: AtomicU64,
    /// Wakes a step in progress when the engine restarts.
    restarted: Notify,
}

impl Engine {
    pub fn new(cfg: SimConfig) -> Arc<Self> {
        let latencies = Latencies::new(cfg.engine);
        let host = HostCache::new(cfg.cpu_offload_blocks);
        Arc::new(Self {
            cfg,
            state: Mutex::new(State {
                arriving: Vec::new(),
                waiting: VecDeque::new(),
                transferring: Vec::new(),
                running: Vec::new(),
                held: Vec::new(),
                cache: PrefixCache::default(),
                host,
                counters: Counters::default(),
                latencies,
                next_block_id: 0,
                closed: false,
                link_clock: None,
                host_clock: None,
                pulled: Vec::new(),
                lora_slots: Vec::new(),
                lora_loads: 0,
            }),
            wake: Notify::new(),
            pull_hook: Mutex::new(None),
            restarts: AtomicU64::new(0),
            restarted: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere must not take the pod down with a poisoned lock.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called (outside the engine's lock) for every completed pull that named its source.
    pub fn set_pull_hook(&self, hook: impl Fn(PullSource) + Send + Sync + 'static) {
        *self.pull_hook.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(hook));
    }

    /// Queues a request. The receiver yields its tokens and then its outcome; it ends without an
    /// outcome if the engine shuts down. Dropping the receiver aborts the request.
    pub fn submit(&self, spec: SeqSpec) -> mpsc::UnboundedReceiver<SeqEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let tx = if self.cfg.output_token_time().is_zero() {
            Sink::Direct(tx)
        } else {
            let (inner_tx, inner_rx) = mpsc::unbounded_channel();
            tokio::spawn(deliver(inner_rx, tx));
            Sink::Delayed(inner_tx)
        };
        let now = Instant::now();
        let queued_at = now + self.cfg.to_wall(self.cfg.queueing_time(spec.prompt_tokens));
        let mut st = self.lock();
        if !st.closed {
            let seq = Seq::new(spec, tx, now, queued_at);
            if queued_at > now {
                st.arriving.push(seq);
            } else {
                st.waiting.push_back(seq);
            }
        }
        drop(st);
        self.wake.notify_one();
        rx
    }

    pub fn snapshot(&self) -> Snapshot {
        let st = self.lock();
        let adapters = |seqs: &mut dyn Iterator<Item = &Seq>| {
            seqs.filter_map(|s| s.spec.adapter.clone())
                .collect::<std::collections::BTreeSet<_>>()
        };
        Snapshot {
            running: st.running.len(),
            // vLLM counts requests waiting for remote KV as waiting.
            waiting: st.waiting.len() + st.transferring.len(),
            running_adapters: adapters(&mut st.running.iter()),
            waiting_adapters: adapters(
                &mut st
                    .waiting
                    .iter()
                    .chain(&st.transferring)
                    .chain(&st.arriving),
            ),
            used_blocks: st.used_blocks(&self.cfg),
            counters: st.counters.clone(),
            latencies: st.latencies.clone(),
        }
    }

    /// Empties the prefix cache (but the blocks in use) and the host tier, as a restart would.
    pub fn reset_cache(&self) {
        let mut st = self.lock();
        st.cache.clear_unpinned();
        st.host.clear();
    }

    /// The process ends and starts again: every request in flight ends without an outcome (its
    /// client gets the error a dead engine gives: a 500, or an error event on a stream), and the
    /// whole cache goes with it, blocks in use included, as do the host tier and loaded adapters.
    /// `reset_cache` (vLLM's `/reset_prefix_cache`) is the gentler event: requests run on and keep
    /// the blocks they use. A step in progress is abandoned, so the engine serves at once.
    pub fn restart(&self) {
        let mut st = self.lock();
        st.drop_sequences();
        st.cache.clear();
        st.host.clear();
        st.lora_slots.clear();
        self.restarts.fetch_add(1, Ordering::SeqCst);
        drop(st);
        self.restarted.notify_waiters();
        self.wake.notify_one();
    }

    /// Number of blocks currently in the prefix cache (in use or evictable).
    pub fn cached_blocks(&self) -> usize {
        self.lock().cache.block_count()
    }

    /// Number of blocks the host tier holds.
    pub fn host_cached_blocks(&self) -> usize {
        self.lock().host.block_count()
    }

    /// A decoder has pulled the KV held under `first_block`: free it. False if nothing was held
    /// under that id (already pulled, or timed out).
    pub fn release_held(&self, first_block: u64) -> bool {
        let mut st = self.lock();
        let Some(i) = st.held.iter().position(|h| h.first_block == first_block) else {
            return false;
        };
        let h = st.held.swap_remove(i);
        h.seq.release(&mut st.cache);
        drop(st);
        self.wake.notify_one();
        true
    }

    /// Drops every queued and running request (their receivers end) and refuses new ones.
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        st.drop_sequences();
        drop(st);
        self.wake.notify_one();
    }

    /// The step loop; runs until the task is aborted.
    pub async fn run(self: Arc<Self>) {
        let mut prev_deadline: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let floor = now.checked_sub(MAX_LAG).unwrap_or(now);
            // A busy engine's clock is its last step boundary; an idle one has none.
            let boundary = prev_deadline.filter(|p| *p >= floor);
            let restarts = self.restarts.load(Ordering::SeqCst);
            let plan = self.lock().plan(&self.cfg, now, boundary);
            self.tell_pulled();
            match plan {
                Plan::Idle(wake_at) => {
                    prev_deadline = None;
                    match wake_at {
                        Some(at) => {
                            tokio::select! {
                                _ = self.wake.notified() => {}
                                _ = tokio::time::sleep_until(at) => {}
                            }
                        }
                        None => self.wake.notified().await,
                    }
                }
                Plan::Step { sim, fresh_since } => {
                    // The step starts when the previous one ended (busy engine) or when its newest
                    // sequence could first run (idle engine), not when this task happened to wake:
                    // timer and scheduler latency must not leak into simulated latencies.
                    let now = Instant::now();
                    let floor = now.checked_sub(MAX_LAG).unwrap_or(now);
                    let base = match (prev_deadline, fresh_since) {
                        (Some(prev), fresh) if prev >= floor => fresh.map_or(prev, |f| f.max(prev)),
                        (_, Some(fresh)) => fresh.max(floor),
                        (_, None) => now,
                    };
                    let deadline = base + self.cfg.to_wall(sim);
                    // A zero-cost step (every latency parameter 0, as `kvbench overhead` runs the
                    // pods) does not sleep at all: even a past deadline waits for the timer's next
                    // millisecond tick, which would dominate a sub-millisecond request.
                    if !sim.is_zero() {
                        tokio::select! {
                            _ = tokio::time::sleep_until(deadline) => {}
                            _ = self.restarted.notified() => {}
                        }
                    }
                    let mut st = self.lock();
                    if self.restarts.load(Ordering::SeqCst) != restarts {
                        // The step's sequences died with the process it ran in.
                        prev_deadline = None;
                        continue;
                    }
                    prev_deadline = Some(deadline);
                    st.finish_step(&self.cfg, deadline);
                }
            }
        }
    }
}
