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
//! in the shared prefix cache (counted once however many requests use them); blocks nobody uses stay
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
//! Per-request overheads of a fitted profile, applied as BLIS applies them: α0 + α1 · input length
//! from arrival until the request is queued, and α2 per output token on its way to the client
//! (BLIS's `OutputTokenProcessingTime`: every inter-token latency is the step plus α2, so a request
//! sees α2 per output token in its E2E). The GPU's steps and the request's KV blocks do not wait
//! for it: the engine frees a finished request at its last step.
//!
//! Time: step durations are simulated and slept scaled by `time_scale`. Deadlines chain from the
//! previous step's deadline rather than from "now", so timer granularity (~1 ms) does not accumulate
//! into slower decoding at small time scales, and metrics record the modelled durations exactly.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::cache::PrefixCache;
use super::config::SimConfig;
use super::metrics::{Counters, Latencies, Snapshot};

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
    /// Prompt tokens not computed here: local prefix-cache hits plus KV pulled from a prefill pod
    /// (vLLM reports both as `cached_tokens`).
    pub cached_tokens: usize,
    pub block_ids: Vec<u64>,
}

/// Where a sequence's events go: straight to the HTTP layer, or through a per-request delivery task
/// that holds each event until its delivery time (a profile with per-output-token host time).
enum Sink {
    Direct(mpsc::UnboundedSender<SeqEvent>),
    Delayed(mpsc::UnboundedSender<(Instant, SeqEvent)>),
}

impl Sink {
    /// Sends `event` for delivery at `at`; false if the receiver is gone.
    fn send(&self, at: Instant, event: SeqEvent) -> bool {
        match self {
            Sink::Direct(tx) => tx.send(event).is_ok(),
            Sink::Delayed(tx) => tx.send((at, event)).is_ok(),
        }
    }

    fn is_closed(&self) -> bool {
        match self {
            Sink::Direct(tx) => tx.is_closed(),
            Sink::Delayed(tx) => tx.is_closed(),
        }
    }
}

/// Forwards events at their delivery times; ends (and so closes the engine's side) when the
/// receiver goes away.
async fn deliver(
    mut rx: mpsc::UnboundedReceiver<(Instant, SeqEvent)>,
    tx: mpsc::UnboundedSender<SeqEvent>,
) {
    loop {
        let item = tokio::select! {
            _ = tx.closed() => return,
            item = rx.recv() => item,
        };
        let Some((at, event)) = item else { return };
        if at > Instant::now() {
            tokio::select! {
                _ = tx.closed() => return,
                _ = tokio::time::sleep_until(at) => {}
            }
        }
        if tx.send(event).is_err() {
            return;
        }
    }
}

struct Seq {
    spec: SeqSpec,
    tx: Sink,
    arrival: Instant,
    /// When the request reaches the scheduler's queue (arrival + α0 + α1 · input length).
    queued_at: Instant,
    /// Prompt tokens found in the prefix cache at first admission.
    cached: usize,
    /// Prompt tokens pulled from a prefill pod at first admission.
    transferred: usize,
    /// Tokens whose KV exists on this pod.
    computed: usize,
    prefill_remaining: usize,
    generated: usize,
    /// How many leading prompt blocks this sequence holds pinned in the cache.
    pinned: usize,
    /// Tokens this sequence holds KV slots for (its blocks: `blocks_for(alloc)`).
    alloc: usize,
    /// Simulated seconds of exclusive link time its pull still needs (shared link only).
    xfer_left: f64,
    /// When the pulled KV has arrived (transferring sequences whose `xfer_left` is 0).
    ready_at: Instant,
    /// Delivery time of the last token.
    last_token: Option<Instant>,
    sched_prefill: usize,
    sched_decode: bool,
    /// Joined the batch since the last step started: the next step cannot start before `eligible`
    /// (its queueing, or the end of its KV transfer).
    fresh: bool,
    eligible: Instant,
    aborted: bool,
    /// Admitted at least once (a preempted sequence is not counted again).
    started: bool,
}

impl Seq {
    /// Blocks held outside the shared cache: the partial last block, prompt blocks not yet full or
    /// cached, and generated tokens.
    fn private_blocks(&self, cfg: &SimConfig) -> usize {
        cfg.blocks_for(self.alloc).saturating_sub(self.pinned)
    }

    /// Pins (and so caches) every full prompt block whose KV now exists.
    fn cover(&mut self, cache: &mut PrefixCache, block_size: usize) {
        let full = (self.computed / block_size).min(self.spec.block_hashes.len());
        for h in self
            .spec
            .block_hashes
            .get(self.pinned..full)
            .unwrap_or_default()
        {
            cache.pin(*h);
        }
        self.pinned = self.pinned.max(full);
    }

    /// Unpins in reverse, as vLLM frees blocks: the tail of a prefix becomes the least recently used
    /// and is evicted first, so a partly evicted prefix still hits on its head.
    fn release(&self, cache: &mut PrefixCache) {
        for h in self.spec.block_hashes.iter().take(self.pinned).rev() {
            cache.unpin(*h);
        }
    }

    fn pull_done(&self) -> bool {
        self.xfer_left <= 0.0
    }
}

/// A finished remote-decode prefill whose blocks wait for the decoder's pull.
struct Held {
    first_block: u64,
    until: Instant,
    seq: Seq,
}

enum Plan {
    Idle(Option<Instant>),
    Step {
        sim: Duration,
        /// Latest time a sequence new to this step became able to run.
        fresh_since: Option<Instant>,
    },
}

struct State {
    /// Arrived, not yet queued (per-request overhead α0 + α1 · input length).
    arriving: Vec<Seq>,
    waiting: VecDeque<Seq>,
    transferring: Vec<Seq>,
    running: Vec<Seq>,
    held: Vec<Held>,
    cache: PrefixCache,
    counters: Counters,
    latencies: Latencies,
    next_block_id: u64,
    closed: bool,
    /// How far the shared KV link's progress has been computed.
    link_clock: Option<Instant>,
    /// Pulls completed since the loop last told their sources.
    pulled: Vec<PullSource>,
}

pub struct Engine {
    cfg: SimConfig,
    state: Mutex<State>,
    wake: Notify,
    pull_hook: Mutex<Option<PullHook>>,
}

impl Engine {
    pub fn new(cfg: SimConfig) -> Arc<Self> {
        let latencies = Latencies::new(cfg.engine);
        Arc::new(Self {
            cfg,
            state: Mutex::new(State {
                arriving: Vec::new(),
                waiting: VecDeque::new(),
                transferring: Vec::new(),
                running: Vec::new(),
                held: Vec::new(),
                cache: PrefixCache::default(),
                counters: Counters::default(),
                latencies,
                next_block_id: 0,
                closed: false,
                link_clock: None,
                pulled: Vec::new(),
            }),
            wake: Notify::new(),
            pull_hook: Mutex::new(None),
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
            let seq = Seq {
                spec,
                tx,
                arrival: now,
                queued_at,
                cached: 0,
                transferred: 0,
                computed: 0,
                prefill_remaining: 0,
                generated: 0,
                pinned: 0,
                alloc: 0,
                xfer_left: 0.0,
                ready_at: now,
                last_token: None,
                sched_prefill: 0,
                sched_decode: false,
                fresh: false,
                eligible: queued_at,
                aborted: false,
                started: false,
            };
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
        Snapshot {
            running: st.running.len(),
            // vLLM counts requests waiting for remote KV as waiting.
            waiting: st.waiting.len() + st.transferring.len(),
            used_blocks: st.used_blocks(&self.cfg),
            counters: st.counters.clone(),
            latencies: st.latencies.clone(),
        }
    }

    pub fn reset_cache(&self) {
        self.lock().cache.clear_unpinned();
    }

    /// Number of blocks currently in the prefix cache (in use or evictable).
    pub fn cached_blocks(&self) -> usize {
        self.lock().cache.block_count()
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
        st.arriving.clear();
        st.waiting.clear();
        st.transferring.clear();
        st.running.clear();
        st.held.clear();
        drop(st);
        self.wake.notify_one();
    }

    fn tell_pulled(&self) {
        let pulled = std::mem::take(&mut self.lock().pulled);
        if pulled.is_empty() {
            return;
        }
        let hook = self
            .pull_hook
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(hook) = hook {
            for p in pulled {
                hook(p);
            }
        }
    }

    /// The step loop; runs until the task is aborted.
    pub async fn run(self: Arc<Self>) {
        let mut prev_deadline: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let floor = now.checked_sub(MAX_LAG).unwrap_or(now);
            // A busy engine's clock is its last step boundary; an idle one has none.
            let boundary = prev_deadline.filter(|p| *p >= floor);
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
                        tokio::time::sleep_until(deadline).await;
                    }
                    prev_deadline = Some(deadline);
                    self.lock().finish_step(&self.cfg, deadline);
                }
            }
        }
    }
}

impl State {
    fn private_blocks(&self, cfg: &SimConfig) -> usize {
        self.running
            .iter()
            .chain(&self.transferring)
            .chain(self.held.iter().map(|h| &h.seq))
            .map(|s| s.private_blocks(cfg))
            .sum()
    }

    /// Blocks in use (vLLM: referenced by a request): shared prefix blocks once, plus private ones.
    fn used_blocks(&self, cfg: &SimConfig) -> usize {
        self.cache.pinned_len() + self.private_blocks(cfg)
    }

    /// Evicts cached-but-unused blocks until the pool fits in `num_gpu_blocks`.
    fn evict(&mut self, cfg: &SimConfig) {
        let private = self.private_blocks(cfg);
        self.cache
            .evict_to(cfg.num_gpu_blocks.saturating_sub(private));
    }

    fn drop_seq(&mut self, s: Seq) {
        s.release(&mut self.cache);
        self.counters.aborted += 1;
    }

    /// vLLM's recompute preemption: the request's blocks are freed and it goes back to the front of
    /// the queue with its generated tokens, to be prefilled again (prompt and output) when it fits.
    /// Returns how many blocks that freed.
    fn preempt(&mut self, cfg: &SimConfig, mut s: Seq) -> usize {
        let before = self.cache.pinned_len();
        s.release(&mut self.cache);
        let freed = before - self.cache.pinned_len() + s.private_blocks(cfg);
        s.pinned = 0;
        s.alloc = 0;
        s.computed = 0;
        s.prefill_remaining = 0;
        s.sched_prefill = 0;
        s.sched_decode = false;
        s.fresh = false;
        // Pulled KV is gone with the blocks; the prompt is recomputed here.
        s.spec.remote_tokens = 0;
        self.counters.preemptions += 1;
        self.waiting.push_front(s);
        freed
    }

    /// Moves requests whose per-request overhead has elapsed into the queue, in queueing order.
    fn queue_arrivals(&mut self, now: Instant) {
        if self.arriving.is_empty() {
            return;
        }
        self.arriving.sort_by_key(|s| s.queued_at);
        let due = self.arriving.partition_point(|s| s.queued_at <= now);
        self.waiting.extend(self.arriving.drain(..due));
    }

    /// Advances the shared KV link to `to`: concurrent pulls share its bandwidth equally, so each of
    /// `n` pulls progresses at 1/n of the link until one completes and the others speed up.
    fn advance_link(&mut self, cfg: &SimConfig, to: Instant) {
        if cfg.kv_link_gbps.is_none() {
            return;
        }
        let mut t = match self.link_clock {
            Some(c) if c < to => c,
            Some(_) => return,
            None => {
                self.link_clock = Some(to);
                return;
            }
        };
        loop {
            let active: Vec<usize> = (0..self.transferring.len())
                .filter(|i| !self.transferring[*i].pull_done())
                .collect();
            if active.is_empty() {
                break;
            }
            let n = active.len() as f64;
            let min_left = active
                .iter()
                .map(|i| self.transferring[*i].xfer_left)
                .fold(f64::INFINITY, f64::min);
            let span = cfg.to_sim_secs(to.saturating_duration_since(t));
            if min_left * n <= span {
                t += cfg.to_wall(Duration::from_secs_f64(min_left * n));
                for i in active {
                    let s = &mut self.transferring[i];
                    s.xfer_left -= min_left;
                    if s.xfer_left <= 1e-12 {
                        s.xfer_left = 0.0;
                        s.ready_at = t;
                    }
                }
            } else {
                for i in active {
                    self.transferring[i].xfer_left -= span / n;
                }
                break;
            }
        }
        self.link_clock = Some(to);
    }

    /// When the next pull completes (or completed, if it still waits for a batch slot).
    fn transfer_wake(&self, cfg: &SimConfig) -> Option<Instant> {
        let done = self
            .transferring
            .iter()
            .filter(|s| s.pull_done())
            .map(|s| s.ready_at)
            .min();
        let active: Vec<f64> = self
            .transferring
            .iter()
            .filter(|s| !s.pull_done())
            .map(|s| s.xfer_left)
            .collect();
        let next = match (self.link_clock, active.iter().copied().reduce(f64::min)) {
            (Some(clock), Some(min_left)) => {
                Some(clock + cfg.to_wall(Duration::from_secs_f64(min_left * active.len() as f64)))
            }
            _ => None,
        };
        [done, next].into_iter().flatten().min()
    }

    fn start_transfer(&mut self, cfg: &SimConfig, mut s: Seq, start: Instant) {
        let time = cfg.transfer_time(s.transferred);
        if cfg.kv_link_gbps.is_some() {
            // An idle link starts the pull when it was admitted (the loop may have woken later); a
            // busy one cannot share time it has already accounted for.
            let busy = self.transferring.iter().any(|t| !t.pull_done());
            let start = match self.link_clock {
                Some(c) if busy => c.max(start),
                _ => start,
            };
            if !busy {
                self.link_clock = Some(start);
            }
            self.advance_link(cfg, start);
            s.xfer_left = time.as_secs_f64();
            s.ready_at = start;
            if s.xfer_left <= 0.0 {
                s.xfer_left = 0.0;
            }
        } else {
            s.ready_at = start + cfg.to_wall(time);
        }
        self.transferring.push(s);
    }

    /// Frees the blocks of remote-decode prefills nobody pulled in time.
    fn expire_holds(&mut self, now: Instant) {
        if self.held.iter().all(|h| h.until > now) {
            return;
        }
        let (expired, kept): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.until <= now);
        self.held = kept;
        for h in expired {
            h.seq.release(&mut self.cache);
        }
    }

    /// Gives running sequence `i` KV slots for `target` tokens, preempting lower-priority running
    /// sequences (from the back) while the pool has too few free blocks. False if `i` itself had to
    /// be preempted (it is then gone from `running`). `used` tracks the blocks in use.
    fn grow(&mut self, cfg: &SimConfig, i: usize, target: usize, used: &mut usize) -> bool {
        loop {
            let s = &self.running[i];
            let need = cfg
                .blocks_for(target)
                .saturating_sub(cfg.blocks_for(s.alloc));
            if need == 0 {
                break;
            }
            if need <= cfg.num_gpu_blocks.saturating_sub(*used) {
                *used += need;
                break;
            }
            if self.running.len() > i + 1 {
                if let Some(victim) = self.running.pop() {
                    *used -= self.preempt(cfg, victim).min(*used);
                }
            } else if i > 0 {
                let victim = self.running.remove(i);
                *used -= self.preempt(cfg, victim).min(*used);
                return false;
            } else {
                // Alone and still too big: over-commit rather than preempt itself forever (vLLM
                // refuses to start when max_model_len exceeds the KV pool).
                *used += need;
                break;
            }
        }
        let s = &mut self.running[i];
        s.alloc = s.alloc.max(target);
        let private = used.saturating_sub(self.cache.pinned_len());
        self.cache
            .evict_to(cfg.num_gpu_blocks.saturating_sub(private));
        true
    }

    /// vLLM V1's `schedule()`: running sequences first, in order, then the queue. Returns the
    /// step's (uncached prefill tokens, decode tokens).
    fn schedule(
        &mut self,
        cfg: &SimConfig,
        now: Instant,
        boundary: Option<Instant>,
    ) -> (usize, usize) {
        let counts_decodes = cfg.budget_counts_decodes();
        let whole_prompt = !counts_decodes;
        let bs = cfg.block_size;
        let mut budget = match cfg.chunked_prefill_tokens {
            0 => usize::MAX,
            n => n,
        };

        // Requests whose pulled KV has arrived join the batch ahead of the queue.
        for mut s in std::mem::take(&mut self.transferring) {
            if s.tx.is_closed() {
                self.drop_seq(s);
            } else if s.pull_done() && s.ready_at <= now && self.running.len() < cfg.max_num_seqs {
                s.cover(&mut self.cache, bs);
                s.fresh = true;
                s.eligible = s.ready_at;
                if let Some(src) = s.spec.pull_source.take() {
                    self.pulled.push(src);
                }
                self.running.push(s);
            } else {
                self.transferring.push(s);
            }
        }

        let mut used = self.used_blocks(cfg);
        let preemptions_before = self.counters.preemptions;
        let mut i = 0;
        while i < self.running.len() {
            let s = &mut self.running[i];
            s.sched_prefill = 0;
            s.sched_decode = false;
            let decoding = s.prefill_remaining == 0;
            let want = match (decoding, counts_decodes) {
                (false, _) => s.prefill_remaining.min(budget),
                (true, true) => budget.min(1),
                (true, false) => 1,
            };
            if want == 0 {
                i += 1;
                continue;
            }
            let target = if decoding {
                s.spec.prompt_tokens + s.generated
            } else {
                s.computed + want
            };
            if !self.grow(cfg, i, target, &mut used) {
                continue;
            }
            let s = &mut self.running[i];
            if decoding {
                s.sched_decode = true;
            } else {
                s.sched_prefill = want;
            }
            if !decoding || counts_decodes {
                budget -= want;
            }
            i += 1;
        }

        // vLLM schedules no waiting request in a step that had to preempt.
        let preempted = self.counters.preemptions > preemptions_before;
        while !preempted && self.running.len() < cfg.max_num_seqs && (budget > 0 || !counts_decodes)
        {
            let Some(front) = self.waiting.front() else {
                break;
            };
            if front.tx.is_closed() {
                if let Some(s) = self.waiting.pop_front() {
                    self.drop_seq(s);
                }
                continue;
            }
            let prompt = front.spec.prompt_tokens;
            let total = prompt + front.generated;
            // vLLM always recomputes the last token, so only blocks ending before it can hit.
            let hashable = (total.saturating_sub(1) / bs).min(front.spec.block_hashes.len());
            let candidates = front.spec.block_hashes.get(..hashable).unwrap_or_default();
            let hit = self.cache.longest_prefix(candidates);
            let shared = candidates
                .iter()
                .take(hit)
                .filter(|h| self.cache.is_pinned(**h))
                .count();
            let cached = hit * bs;
            let transferred = front
                .spec
                .remote_tokens
                .min(prompt.saturating_sub(1))
                .saturating_sub(cached);
            let computed = cached + transferred;
            let mut prefill_remaining = total.saturating_sub(computed);
            // Computing one last token costs no more than a decode step: it rides along with the
            // decode batch (as in vLLM, where it shares the forward pass of the first sampled token).
            if prefill_remaining <= 1 {
                prefill_remaining = 0;
            }
            let (want, mut target) = if transferred > 0 {
                (0, computed)
            } else if prefill_remaining > 0 {
                let w = prefill_remaining.min(budget);
                (w, computed + w)
            } else {
                (1, total)
            };
            // New blocks, plus cached blocks nobody uses that this request revives.
            let mut need = (hit - shared) + cfg.blocks_for(target).saturating_sub(hit);
            if whole_prompt {
                target = target.max(total);
                need = cfg.blocks_for(total + 1).saturating_sub(shared);
            }
            let free = cfg.num_gpu_blocks.saturating_sub(used);
            let idle = self.running.is_empty() && self.transferring.is_empty();
            if need > free && !idle {
                break;
            }
            let Some(mut s) = self.waiting.pop_front() else {
                break;
            };
            for h in s.spec.block_hashes.iter().take(hit) {
                self.cache.pin(*h);
            }
            s.pinned = hit;
            s.computed = computed;
            s.prefill_remaining = prefill_remaining;
            s.alloc = target;
            used += (hit - shared) + cfg.blocks_for(target).saturating_sub(hit);
            if !s.started {
                s.started = true;
                s.cached = cached;
                s.transferred = transferred;
                self.counters.prefix_queries += prompt as u64;
                self.counters.prefix_hits += cached as u64;
                self.counters.transferred_tokens += transferred as u64;
            }
            if transferred > 0 {
                let start = boundary.map_or(s.queued_at, |b| b.max(s.queued_at));
                self.start_transfer(cfg, s, start);
            } else {
                // Nothing to pull (all cached here): the producer may free its blocks now.
                if let Some(src) = s.spec.pull_source.take() {
                    self.pulled.push(src);
                }
                if prefill_remaining > 0 {
                    s.sched_prefill = want;
                    budget -= want;
                } else {
                    s.sched_decode = true;
                    if counts_decodes {
                        budget -= 1;
                    }
                }
                s.fresh = true;
                s.eligible = s.queued_at;
                self.running.push(s);
            }
            self.evict(cfg);
        }

        let prefill: usize = self.running.iter().map(|s| s.sched_prefill).sum();
        let decode = self.running.iter().filter(|s| s.sched_decode).count();
        (prefill, decode)
    }

    fn plan(&mut self, cfg: &SimConfig, now: Instant, boundary: Option<Instant>) -> Plan {
        if self.closed {
            return Plan::Idle(None);
        }
        self.expire_holds(now);
        self.advance_link(cfg, now);
        self.queue_arrivals(now);
        let (prefill_tokens, decoding) = self.schedule(cfg, now, boundary);
        if prefill_tokens == 0 && decoding == 0 {
            let wake = [
                self.transfer_wake(cfg),
                self.arriving.iter().map(|s| s.queued_at).min(),
                self.held.iter().map(|h| h.until).min(),
            ]
            .into_iter()
            .flatten()
            .min();
            return Plan::Idle(wake);
        }
        let mut fresh_since: Option<Instant> = None;
        for s in &mut self.running {
            if std::mem::take(&mut s.fresh) {
                fresh_since = Some(fresh_since.map_or(s.eligible, |f| f.max(s.eligible)));
            }
        }
        Plan::Step {
            sim: cfg.step_time(prefill_tokens, decoding),
            fresh_since,
        }
    }

    fn finish_step(&mut self, cfg: &SimConfig, at: Instant) {
        let State {
            running,
            cache,
            counters,
            latencies,
            ..
        } = self;
        for s in running.iter_mut() {
            if s.sched_prefill > 0 {
                s.prefill_remaining -= s.sched_prefill;
                s.computed += s.sched_prefill;
                s.cover(cache, cfg.block_size);
                if s.prefill_remaining == 0 {
                    emit_token(s, at, cfg, cache, counters, latencies);
                }
            } else if s.sched_decode {
                s.computed = s.computed.max(s.spec.prompt_tokens + s.generated);
                emit_token(s, at, cfg, cache, counters, latencies);
            }
            s.sched_prefill = 0;
            s.sched_decode = false;
        }

        for s in std::mem::take(&mut self.running) {
            if s.aborted {
                self.drop_seq(s);
            } else if s.generated >= s.spec.max_tokens {
                let done = s.last_token.unwrap_or(at);
                self.counters.success += 1;
                self.latencies
                    .e2e
                    .observe(cfg.to_sim_secs(done.saturating_duration_since(s.arrival)));
                let block_ids = if s.spec.report_block_ids {
                    let n = cfg.blocks_for(s.spec.prompt_tokens) as u64;
                    let first = self.next_block_id;
                    self.next_block_id = (first + n) % cfg.num_gpu_blocks as u64;
                    (0..n)
                        .map(|i| (first + i) % cfg.num_gpu_blocks as u64)
                        .collect()
                } else {
                    Vec::new()
                };
                // The receiver may be gone by now; the request is complete either way.
                let _ = s.tx.send(
                    done,
                    SeqEvent::Finished(Outcome {
                        prompt_tokens: s.spec.prompt_tokens,
                        completion_tokens: s.generated,
                        cached_tokens: s.cached + s.transferred,
                        block_ids: block_ids.clone(),
                    }),
                );
                match block_ids.first() {
                    // The NIXL producer keeps the blocks until the decoder has read them.
                    Some(first) => self.held.push(Held {
                        first_block: *first,
                        until: at + cfg.to_wall(Duration::from_secs_f64(cfg.kv_hold_timeout_s)),
                        seq: s,
                    }),
                    None => s.release(&mut self.cache),
                }
            } else {
                self.running.push(s);
            }
        }
        self.evict(cfg);
    }
}

fn emit_token(
    s: &mut Seq,
    at: Instant,
    cfg: &SimConfig,
    cache: &mut PrefixCache,
    counters: &mut Counters,
    latencies: &mut Latencies,
) {
    let index = s.generated;
    // Output processing (α2 per token, BLIS's OutputTokenProcessingTime) adds to every token's
    // observed latency: token k reaches the client (k + 1) · α2 after its step, never before the
    // token ahead of it.
    let behind = cfg
        .to_wall(cfg.output_token_time())
        .mul_f64((index + 1) as f64);
    let delivered = s
        .last_token
        .map_or(at + behind, |prev| prev.max(at + behind));
    if index == 0 {
        // The first sampled token means the whole prompt's KV exists (including a last token that
        // rode along with the decode batch).
        s.computed = s.computed.max(s.spec.prompt_tokens);
        s.cover(cache, cfg.block_size);
        counters.prompt_tokens += s.spec.prompt_tokens as u64;
        latencies
            .ttft
            .observe(cfg.to_sim_secs(delivered.saturating_duration_since(s.arrival)));
    } else if let Some(prev) = s.last_token {
        latencies
            .itl
            .observe(cfg.to_sim_secs(delivered.saturating_duration_since(prev)));
    }
    s.generated += 1;
    s.last_token = Some(delivered);
    counters.generation_tokens += 1;
    let token = SeqEvent::Token {
        index,
        prompt_tokens: s.spec.prompt_tokens,
        cached_tokens: s.cached + s.transferred,
    };
    if !s.tx.send(delivered, token) {
        // The client went away: vLLM aborts the request and frees its blocks.
        s.aborted = true;
    }
}

#[cfg(test)]
mod tests {
    //! Hand-made cases for the scheduler and the block pool, driven step by step with synthetic
    //! times (no sleeping): `plan` at a step boundary, `finish_step` at its end.
    use super::*;
    use crate::profile;

    fn fitted(blocks: usize, budget: usize) -> SimConfig {
        let p = profile::find("llama-3.1-8b-h100").expect("profile");
        SimConfig {
            num_gpu_blocks: blocks,
            chunked_prefill_tokens: budget,
            ..SimConfig::default().with_profile(p)
        }
    }

    /// A prompt of `tokens` tokens whose block hashes are unique to `tag`.
    fn spec(tag: u64, tokens: usize, max_tokens: usize) -> SeqSpec {
        SeqSpec {
            prompt_tokens: tokens,
            block_hashes: (0..(tokens / 16) as u64).map(|i| (tag << 32) | i).collect(),
            max_tokens,
            remote_tokens: 0,
            report_block_ids: false,
            pull_source: None,
        }
    }

    /// Submits at `now`, queued at once (tests of the α0/α1 delay use `Engine::submit`).
    fn push(eng: &Engine, s: SeqSpec, now: Instant) -> mpsc::UnboundedReceiver<SeqEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut st = eng.lock();
        st.waiting.push_back(Seq {
            spec: s,
            tx: Sink::Direct(tx),
            arrival: now,
            queued_at: now,
            cached: 0,
            transferred: 0,
            computed: 0,
            prefill_remaining: 0,
            generated: 0,
            pinned: 0,
            alloc: 0,
            xfer_left: 0.0,
            ready_at: now,
            last_token: None,
            sched_prefill: 0,
            sched_decode: false,
            fresh: false,
            eligible: now,
            aborted: false,
            started: false,
        });
        rx
    }

    /// Plans a step at `now` and finishes it; returns its simulated duration (zero if idle) and the
    /// (prefill, decode) tokens it held.
    fn step(eng: &Engine, now: Instant) -> (Duration, usize, usize) {
        let cfg = &eng.cfg;
        let mut st = eng.lock();
        let plan = st.plan(cfg, now, Some(now));
        let prefill: usize = st.running.iter().map(|s| s.sched_prefill).sum();
        let decode = st.running.iter().filter(|s| s.sched_decode).count();
        match plan {
            Plan::Idle(_) => (Duration::ZERO, 0, 0),
            Plan::Step { sim, .. } => {
                st.finish_step(cfg, now + cfg.to_wall(sim));
                (sim, prefill, decode)
            }
        }
    }

    fn us(cfg: &SimConfig, prefill: usize, decode: usize) -> Duration {
        Duration::from_secs_f64(cfg.profile.step_us(prefill, decode).expect("fitted") / 1e6)
    }

    #[test]
    fn one_budget_is_shared_by_decodes_and_prefill_chunks() {
        let cfg = SimConfig {
            max_num_seqs: 4,
            ..fitted(1000, 100)
        };
        let eng = Engine::new(cfg.clone());
        let t0 = Instant::now();
        let _rx: Vec<_> = (0..3).map(|i| push(&eng, spec(i, 17, 50), t0)).collect();
        // Three 17-token prompts fit the 100-token budget together: one step of 51 prefill tokens.
        assert_eq!(step(&eng, t0), (us(&cfg, 51, 0), 51, 0));
        let _long = push(&eng, spec(9, 500, 5), t0);
        let _fifth = push(&eng, spec(10, 20, 5), t0);
        // Three decodes take 3 tokens of the budget; the 500-token prompt gets the other 97.
        assert_eq!(step(&eng, t0), (us(&cfg, 97, 3), 97, 3));
        assert_eq!(step(&eng, t0), (us(&cfg, 97, 3), 97, 3));
        // max_num_seqs = 4: the fifth request waits.
        let st = eng.lock();
        assert_eq!((st.running.len(), st.waiting.len()), (4, 1));
        // 5752.705191348184 + 17.25086436834028·97 + 5.999143920128404·3 µs, by hand:
        let want = 5752.705191348184 + 17.25086436834028 * 97.0 + 5.999143920128404 * 3.0;
        assert!((us(&cfg, 97, 3).as_secs_f64() * 1e6 - want).abs() < 1e-3);
    }

    #[test]
    fn admission_counts_shared_prefix_blocks_once_and_waits_for_room() {
        let cfg = fitted(10, 0);
        let eng = Engine::new(cfg.clone());
        let t0 = Instant::now();
        // A: 64 tokens = 4 full blocks.
        let _a = push(&eng, spec(1, 64, 100), t0);
        step(&eng, t0);
        assert_eq!(eng.lock().used_blocks(&cfg), 4);
        // B: A's 64 tokens + 16 more. Its first 4 blocks are A's (pinned, shared), 1 is new.
        let mut b = spec(1, 80, 100);
        b.block_hashes.push(99);
        let _b = push(&eng, b, t0);
        let (_, prefill, decode) = step(&eng, t0);
        assert_eq!(
            (prefill, decode),
            (16, 1),
            "B computes only its uncached block"
        );
        // A now holds 5 blocks (65 tokens), B 5 of which 4 are A's: 6 in use, not 10.
        assert_eq!(eng.lock().used_blocks(&cfg), 6);
        // C needs 5 blocks for 80 uncached tokens; 4 are free: it waits, nothing is preempted.
        let _c = push(&eng, spec(3, 80, 1), t0);
        step(&eng, t0);
        let st = eng.lock();
        assert_eq!((st.running.len(), st.waiting.len()), (2, 1));
        assert_eq!(st.counters.preemptions, 0);
        assert_eq!(st.counters.prefix_hits, 64);
    }

    #[test]
    fn a_request_that_cannot_grow_preempts_the_last_admitted_which_is_recomputed() {
        let cfg = fitted(8, 0);
        let eng = Engine::new(cfg.clone());
        let t0 = Instant::now();
        let _a = push(&eng, spec(1, 48, 20), t0);
        let mut b_rx = push(&eng, spec(2, 48, 30), t0);
        // Both 3-block prompts fit (6 of 8); each decode step needs slots for prompt + generated.
        assert_eq!(step(&eng, t0).1, 96);
        for _ in 0..16 {
            step(&eng, t0);
        }
        // 48 + 16 = 64 tokens: 4 blocks each, the pool is full.
        {
            let st = eng.lock();
            assert_eq!(st.used_blocks(&cfg), 8);
            assert_eq!(st.counters.preemptions, 0);
        }
        // The next decode needs a 5th block for A: B (admitted last) is preempted, A runs alone.
        assert_eq!(step(&eng, t0), (us(&cfg, 0, 1), 0, 1));
        {
            let st = eng.lock();
            assert_eq!(st.counters.preemptions, 1);
            assert_eq!((st.running.len(), st.waiting.len()), (1, 1));
            assert_eq!(
                st.waiting[0].generated, 17,
                "B keeps the tokens it streamed"
            );
            assert_eq!(st.used_blocks(&cfg), 5, "B's blocks are free");
        }
        let mut b_tokens = Vec::new();
        while let Ok(SeqEvent::Token { index, .. }) = b_rx.try_recv() {
            b_tokens.push(index);
        }
        assert_eq!(b_tokens, (0..17).collect::<Vec<_>>());
        // B cannot come back while A holds 5 blocks: reviving its 3 cached prompt blocks and 2 more
        // for its 65 tokens needs 5, and 3 are free. A's last two tokens (19 and 20):
        for _ in 0..2 {
            assert_eq!(step(&eng, t0), (us(&cfg, 0, 1), 0, 1));
            assert_eq!(eng.lock().waiting.len(), 1);
        }
        // A is done; B resumes, hits its 3 cached prompt blocks and recomputes the 17 tokens it had
        // generated (one step of 17 prefill tokens), then streams token 17 on.
        assert!(eng.lock().running.is_empty());
        assert_eq!(step(&eng, t0), (us(&cfg, 17, 0), 17, 0));
        assert!(matches!(
            b_rx.try_recv(),
            Ok(SeqEvent::Token { index: 17, .. })
        ));
        assert_eq!(
            eng.lock().counters.prefix_hits,
            0,
            "hits counted once, at first admission"
        );
    }

    #[test]
    fn a_preempted_request_goes_back_to_the_front_of_the_queue() {
        let cfg = fitted(8, 0);
        let eng = Engine::new(cfg.clone());
        let t0 = Instant::now();
        let _a = push(&eng, spec(1, 48, 40), t0);
        let _b = push(&eng, spec(2, 48, 40), t0);
        for _ in 0..17 {
            step(&eng, t0);
        }
        assert_eq!(eng.lock().used_blocks(&cfg), 8);
        // C (one block) arrives while the pool is full; B's preemption puts B ahead of it.
        let _c = push(&eng, spec(3, 15, 1), t0);
        assert_eq!(step(&eng, t0).2, 1);
        {
            let st = eng.lock();
            assert_eq!(st.counters.preemptions, 1);
            assert_eq!(st.waiting.len(), 2, "B at the front, C behind it");
            assert_eq!(
                st.waiting[0].spec.block_hashes,
                spec(2, 48, 40).block_hashes
            );
        }
        // Next step: B (front) does not fit, and FIFO holds C back behind it although C would fit.
        step(&eng, t0);
        assert_eq!(eng.lock().waiting.len(), 2);
    }

    #[test]
    fn unused_cached_blocks_are_free_and_evicted_lru() {
        let cfg = fitted(10, 0);
        let eng = Engine::new(cfg.clone());
        let t0 = Instant::now();
        let _a = push(&eng, spec(1, 64, 1), t0);
        step(&eng, t0);
        {
            let st = eng.lock();
            assert!(st.running.is_empty());
            assert_eq!(
                st.used_blocks(&cfg),
                0,
                "finished: nothing referenced (usage 0)"
            );
            assert_eq!(st.cache.block_count(), 4, "but still cached");
        }
        // B needs 8 blocks: 6 are unused, 4 more come from A's cached blocks, tail first.
        let _b = push(&eng, spec(2, 128, 5), t0);
        step(&eng, t0);
        let st = eng.lock();
        assert_eq!(st.used_blocks(&cfg), 8);
        let a = spec(1, 64, 1).block_hashes;
        assert_eq!(
            st.cache.longest_prefix(&a),
            2,
            "A's head survives, its tail went first"
        );
        assert_eq!(st.cache.block_count(), 10);
    }

    #[test]
    fn concurrent_pulls_share_the_link() {
        let cfg = SimConfig {
            role: super::super::config::Role::Decode,
            ..fitted(10_000, 0)
        };
        let one = cfg.to_wall(cfg.transfer_time(1000));
        let eng = Engine::new(cfg.clone());
        let t0 = Instant::now();
        let pull = |tag| SeqSpec {
            remote_tokens: 1000,
            ..spec(tag, 1001, 2)
        };
        let _a = push(&eng, pull(1), t0);
        let _b = push(&eng, pull(2), t0);
        let mut st = eng.lock();
        let Plan::Idle(Some(wake)) = st.plan(&cfg, t0, None) else {
            panic!("both requests wait for their KV");
        };
        // Two 1,000-token pulls at half the link each end together after twice one pull's time.
        let err = wake.saturating_duration_since(t0).abs_diff(one * 2);
        assert!(err < Duration::from_micros(1), "{wake:?} vs {:?}", one * 2);
        let plan = st.plan(&cfg, t0 + one, None);
        assert!(matches!(plan, Plan::Idle(_)), "not done at one pull's time");
        assert_eq!(st.transferring.len(), 2);
        let plan = st.plan(&cfg, t0 + one * 2 + Duration::from_micros(1), None);
        assert!(matches!(plan, Plan::Step { .. }));
        assert_eq!(st.running.len(), 2);
        assert_eq!(st.counters.transferred_tokens, 2000);
    }

    #[test]
    fn a_prefill_pod_holds_pulled_blocks_until_told_or_timed_out() {
        let cfg = SimConfig {
            kv_hold_timeout_s: 10.0,
            ..fitted(100, 0)
        };
        let eng = Engine::new(cfg.clone());
        let t0 = Instant::now();
        let prefill = |tag| SeqSpec {
            report_block_ids: true,
            ..spec(tag, 64, 1)
        };
        let mut rx = push(&eng, prefill(1), t0);
        step(&eng, t0);
        let _ = rx.try_recv();
        let Ok(SeqEvent::Finished(o)) = rx.try_recv() else {
            panic!("finished");
        };
        assert_eq!(o.block_ids, vec![0, 1, 2, 3]);
        assert_eq!(eng.lock().used_blocks(&cfg), 4, "held for the decoder");
        assert!(eng.release_held(0));
        assert!(!eng.release_held(0));
        assert_eq!(eng.lock().used_blocks(&cfg), 0);
        // Nobody pulls the second one: freed at the timeout.
        let _rx = push(&eng, prefill(2), t0);
        step(&eng, t0);
        assert_eq!(eng.lock().used_blocks(&cfg), 4);
        let mut st = eng.lock();
        let _ = st.plan(&cfg, t0 + Duration::from_secs(9), None);
        assert_eq!(st.used_blocks(&cfg), 4);
        let _ = st.plan(&cfg, t0 + Duration::from_secs(11), None);
        assert_eq!(st.used_blocks(&cfg), 0);
    }

    #[tokio::test]
    async fn fitted_ttft_is_queueing_plus_step_plus_output_processing() {
        let cfg = fitted(1000, 0);
        let eng = Engine::new(cfg.clone());
        let t0 = Instant::now();
        let mut rx = eng.submit(spec(1, 1000, 2));
        let queued = {
            let mut st = eng.lock();
            let Plan::Idle(Some(q)) = st.plan(&cfg, t0, None) else {
                panic!("queued after α0 + α1·1000");
            };
            q
        };
        let arrival = eng.lock().arriving[0].arrival;
        let alpha = cfg.queueing_time(1000);
        assert!(
            queued.saturating_duration_since(arrival).abs_diff(alpha) < Duration::from_micros(1)
        );
        let step_end = {
            let mut st = eng.lock();
            let Plan::Step { sim, .. } = st.plan(&cfg, queued, None) else {
                panic!("a step once queued");
            };
            assert_eq!(sim, us(&cfg, 1000, 0));
            let end = queued + sim;
            st.finish_step(&cfg, end);
            end
        };
        // BLIS: TTFT = α0 + α1·in + β0 + β1·in + α2.
        let want = (232.46191091038054 + 1.752360364195244 * 1000.0)
            + (5752.705191348184 + 17.25086436834028 * 1000.0)
            + 3357.4400353290152;
        let ttft = eng.lock().latencies.ttft.sum() * 1e6;
        assert!((ttft - want).abs() < 2.0, "TTFT {ttft} us, want {want}");
        // The token reaches the client α2 after the step, not before.
        let first = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        assert!(matches!(first, Ok(Some(SeqEvent::Token { index: 0, .. }))));
        assert!(Instant::now() >= step_end + cfg.output_token_time());
        // BLIS: each inter-token latency is the decode step plus α2.
        {
            let mut st = eng.lock();
            let Plan::Step { sim, .. } = st.plan(&cfg, step_end, Some(step_end)) else {
                panic!("the decode step");
            };
            assert_eq!(sim, us(&cfg, 0, 1));
            st.finish_step(&cfg, step_end + sim);
        }
        let itl = eng.lock().latencies.itl.sum() * 1e6;
        let want = 5752.705191348184 + 5.999143920128404 + 3357.4400353290152;
        assert!((itl - want).abs() < 2.0, "ITL {itl} us, want {want}");
    }
}

/// A pod's own answer to "what would happen to this prompt if it arrived now" (`POST /sim/probe`):
/// the truth a perfect-knowledge router routes by. Token counts are the pod's own tokens; times are
/// simulated milliseconds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProbeEstimate {
    pub prompt_tokens: usize,
    /// Prompt tokens this pod's prefix cache holds for the prompt now.
    pub cached_tokens: usize,
    /// Prompt tokens it would not compute if admitted after the requests ahead of it: the cache now
    /// plus the blocks those requests will have computed.
    pub cached_at_admission_tokens: usize,
    /// Uncached prefill tokens queued or running ahead of it (running: what is left to compute,
    /// the step in progress included).
    pub queued_prefill_tokens: usize,
    pub running: usize,
    /// Queued, and waiting for pulled KV.
    pub waiting: usize,
    /// Time from now to this request's first token, by stepping the pod's batch with its own cost
    /// model (the step in progress counted from its estimated start; KV-memory admission limits and
    /// later arrivals not modelled).
    pub estimated_ttft_ms: f64,
    /// How much later, summed, the requests already here that have no first token yet would get it
    /// if this request joined (it lengthens the step they share): the cost it puts on others.
    pub added_wait_ms: f64,
    /// The stepping gave up (too many steps); the estimate is a lower bound.
    pub capped: bool,
}

/// Most engine steps one probe simulates.
const PROBE_MAX_STEPS: usize = 100_000;

/// A sequence in a probe's what-if batch.
#[derive(Clone, Debug)]
struct WhatIf {
    /// Prefill tokens left.
    prefill: usize,
    /// Tokens still to generate.
    out: usize,
    /// The probed request.
    probe: bool,
    /// Has not produced its first token yet.
    pending: bool,
}

/// Steps `running` + `queue` from `t0_ms` with the engine's rules (FIFO admission behind
/// `max_num_seqs`, the prefill budget, the step cost); returns the probe's first-token time, the sum
/// of the pending sequences' first-token times, and whether it gave up.
fn step_what_if(
    cfg: &SimConfig,
    mut running: Vec<WhatIf>,
    mut queue: VecDeque<WhatIf>,
    t0_ms: f64,
) -> (Option<f64>, f64, bool) {
    let has_probe = running.iter().chain(&queue).any(|v| v.probe);
    let mut left = running.iter().chain(&queue).filter(|v| v.pending).count();
    let (mut t, mut sum, mut probe_t) = (t0_ms, 0.0, None);
    for _ in 0..PROBE_MAX_STEPS {
        if left == 0 && (!has_probe || probe_t.is_some()) {
            return (probe_t, sum, false);
        }
        while running.len() < cfg.max_num_seqs {
            let Some(v) = queue.pop_front() else { break };
            running.push(v);
        }
        if running.is_empty() {
            return (probe_t, sum, false);
        }
        let mut budget = match cfg.chunked_prefill_tokens {
            0 => usize::MAX,
            n => n,
        };
        let mut sched: Vec<usize> = Vec::with_capacity(running.len());
        let (mut prefill_tokens, mut decoding) = (0, 0);
        for v in &running {
            if v.prefill > 0 {
                let n = v.prefill.min(budget);
                budget -= n;
                prefill_tokens += n;
                sched.push(n);
            } else {
                decoding += 1;
                sched.push(0);
            }
        }
        t += cfg.step_time(prefill_tokens, decoding).as_secs_f64() * 1e3;
        for (v, n) in running.iter_mut().zip(sched) {
            let token = if v.prefill > 0 {
                v.prefill -= n;
                n > 0 && v.prefill == 0
            } else {
                true
            };
            if token {
                if v.probe && probe_t.is_none() {
                    probe_t = Some(t);
                } else if v.pending {
                    v.pending = false;
                    sum += t;
                    left -= 1;
                }
                v.out = v.out.saturating_sub(1);
            }
        }
        running.retain(|v| v.out > 0);
    }
    (probe_t, sum, true)
}

impl Engine {
    /// See [`ProbeEstimate`]. `block_hashes` are the prompt's full blocks as the pod hashes them.
    pub fn probe(
        &self,
        prompt_tokens: usize,
        block_hashes: &[u64],
        max_tokens: usize,
    ) -> ProbeEstimate {
        let cfg = &self.cfg;
        let bs = cfg.block_size;
        let now = Instant::now();
        let st = self.lock();
        let hashable = |prompt: usize, hashes: &[u64]| -> usize {
            (prompt.saturating_sub(1) / bs).min(hashes.len())
        };
        let mine = block_hashes
            .get(..hashable(prompt_tokens, block_hashes))
            .unwrap_or_default();
        let cached_now = st.cache.longest_prefix(mine);
        let ahead: std::collections::HashSet<u64> = st
            .running
            .iter()
            .chain(&st.transferring)
            .chain(&st.waiting)
            .flat_map(|s| s.spec.block_hashes.iter().copied())
            .collect();
        let at_admission = mine
            .iter()
            .take_while(|h| {
                st.cache.longest_prefix(std::slice::from_ref(h)) == 1 || ahead.contains(h)
            })
            .count();

        // The step in progress: its sequences carry their schedule; it started at the previous step's
        // end (the last token any of them got) or when its newest sequence could first run.
        let in_step = |s: &Seq| s.sched_prefill > 0 || s.sched_decode;
        let step_prefill: usize = st.running.iter().map(|s| s.sched_prefill).sum();
        let step_decode = st.running.iter().filter(|s| s.sched_decode).count();
        let mut t0_ms = 0.0;
        if st.running.iter().any(in_step) {
            let dur = cfg.to_wall(cfg.step_time(step_prefill, step_decode));
            let started = st
                .running
                .iter()
                .flat_map(|s| [s.last_token, Some(s.eligible)])
                .flatten()
                .max();
            let left = match started {
                Some(start) => (start + dur).saturating_duration_since(now).min(dur),
                None => dur,
            };
            t0_ms = cfg.to_sim_secs(left) * 1e3;
        }
        // After the step in progress.
        let mut running: Vec<WhatIf> = Vec::with_capacity(st.running.len() + 1);
        for s in &st.running {
            let mut prefill = s.prefill_remaining;
            let mut out = s.spec.max_tokens.saturating_sub(s.generated);
            if s.sched_prefill > 0 {
                prefill = prefill.saturating_sub(s.sched_prefill);
                if prefill == 0 {
                    out = out.saturating_sub(1);
                }
            } else if s.sched_decode {
                out = out.saturating_sub(1);
            }
            if out > 0 {
                running.push(WhatIf {
                    prefill,
                    out,
                    probe: false,
                    pending: prefill > 0,
                });
            }
        }
        let uncached = |prompt: usize, cached_blocks: usize| {
            let left = prompt.saturating_sub(cached_blocks * bs);
            if left <= 1 {
                0
            } else {
                left
            }
        };
        let mut queue: VecDeque<WhatIf> = st
            .transferring
            .iter()
            .map(|s| WhatIf {
                prefill: 0,
                out: s.spec.max_tokens.max(1),
                probe: false,
                pending: true,
            })
            .collect();
        for s in &st.waiting {
            let hashes = s
                .spec
                .block_hashes
                .get(..hashable(s.spec.prompt_tokens, &s.spec.block_hashes))
                .unwrap_or_default();
            queue.push_back(WhatIf {
                prefill: uncached(s.spec.prompt_tokens, st.cache.longest_prefix(hashes)),
                out: s.spec.max_tokens.max(1),
                probe: false,
                pending: true,
            });
        }
        // Running prefills count whole, the step in progress included: that work is still ahead.
        let queued_prefill_tokens = st
            .running
            .iter()
            .map(|s| s.prefill_remaining)
            .sum::<usize>()
            + queue.iter().map(|v| v.prefill).sum::<usize>();
        let (n_running, n_waiting) = (st.running.len(), st.waiting.len() + st.transferring.len());
        drop(st);

        let (_, without, _) = step_what_if(cfg, running.clone(), queue.clone(), t0_ms);
        queue.push_back(WhatIf {
            prefill: uncached(prompt_tokens, at_admission),
            out: max_tokens.max(1),
            probe: true,
            pending: false,
        });
        let (first, with, capped) = step_what_if(cfg, running, queue, t0_ms);
        ProbeEstimate {
            prompt_tokens,
            cached_tokens: cached_now * bs,
            cached_at_admission_tokens: at_admission * bs,
            queued_prefill_tokens,
            running: n_running,
            waiting: n_waiting,
            estimated_ttft_ms: first.unwrap_or(f64::INFINITY).min(1e12),
            added_wait_ms: (with - without).max(0.0),
            capped: capped || first.is_none(),
        }
    }
}

#[cfg(test)]
mod probe_tests {
    use super::*;

    fn v(prefill: usize, out: usize, probe: bool, pending: bool) -> WhatIf {
        WhatIf {
            prefill,
            out,
            probe,
            pending,
        }
    }

    #[test]
    fn a_prefill_that_joins_a_queued_one_shares_its_step_and_delays_it() {
        let cfg = SimConfig::default();
        let queued = VecDeque::from([v(1000, 4, false, true)]);
        let (none, alone, capped) = step_what_if(&cfg, Vec::new(), queued.clone(), 0.0);
        assert_eq!((none, capped), (None, false));
        assert!((alone - 440.0).abs() < 1e-6, "{alone}");
        let mut both = queued;
        both.push_back(v(1000, 4, true, false));
        let (first, with, _) = step_what_if(&cfg, Vec::new(), both, 0.0);
        // Without chunking both prefills run in one step: 40 ms + 2,000 × 0.4 ms.
        assert!((first.expect("probe") - 840.0).abs() < 1e-6);
        assert!(
            (with - alone - 400.0).abs() < 1e-6,
            "the queued one waits 400 ms more"
        );
    }

    #[test]
    fn a_decode_batch_and_the_seat_limit_are_stepped_like_the_engine() {
        let cfg = SimConfig {
            max_num_seqs: 1,
            ..SimConfig::default()
        };
        // One running stream with 3 tokens left holds the only seat: the probe waits 3 decode steps
        // (15.5 ms each), then its own 100-token prefill (80 ms).
        let running = vec![v(0, 3, false, false)];
        let queue = VecDeque::from([v(100, 1, true, false)]);
        let (first, _, capped) = step_what_if(&cfg, running, queue, 10.0);
        assert!(!capped);
        assert!((first.expect("probe") - (10.0 + 3.0 * 15.5 + 80.0)).abs() < 1e-6);
    }
}
