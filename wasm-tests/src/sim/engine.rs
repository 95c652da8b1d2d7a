//! One pod's inference engine: vLLM-style continuous batching over a simulated GPU.
//!
//! Requests queue FIFO; at most `max_num_seqs` run at once, and a request is only admitted when the
//! KV pool has room for its prompt (unless nothing else runs), as vLLM's scheduler does. Every step
//! runs the whole running batch once: sequences still prefilling contribute their uncached prompt
//! tokens (all of them, or a shared `chunked_prefill_tokens` budget), decoding sequences one token each,
//! and the step lasts `prefill overhead + per-token prefill cost + decode base + per-sequence decode
//! cost`. A long prefill therefore delays every running stream's next token, which is the
//! prefill/decode interference P/D disaggregation removes.
//!
//! Cache hits are decided here, at admission, from the pod's own prefix cache; nothing a router sends
//! can claim a hit. A decode pod that received `kv_transfer_params` pulls the missing prompt KV instead
//! of computing it: the pull costs `kv_transfer_us_per_token` and, like NIXL's asynchronous reads, it
//! delays only that request, not the batch.
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
}

#[derive(Debug)]
pub enum SeqEvent {
    /// Token `index` (0-based) was generated.
    Token {
        index: usize,
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

struct Seq {
    spec: SeqSpec,
    tx: mpsc::UnboundedSender<SeqEvent>,
    arrival: Instant,
    cached: usize,
    transferred: usize,
    /// Prompt tokens whose KV exists on this pod.
    computed: usize,
    prefill_remaining: usize,
    generated: usize,
    /// How many leading prompt blocks this sequence holds pinned in the cache.
    pinned: usize,
    /// When the pulled KV has arrived (transferring sequences only).
    ready_at: Instant,
    last_token: Option<Instant>,
    sched_prefill: usize,
    sched_decode: bool,
    /// Joined the batch since the last step started: the next step cannot start before `eligible`
    /// (its arrival, or the end of its KV transfer).
    fresh: bool,
    eligible: Instant,
    aborted: bool,
}

impl Seq {
    /// Blocks held outside the shared cache: the partial last block, uncomputed/untransferred
    /// prompt blocks and generated tokens.
    fn private_blocks(&self, cfg: &SimConfig) -> usize {
        cfg.blocks_for(self.spec.prompt_tokens + self.generated)
            .saturating_sub(self.pinned)
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
    waiting: VecDeque<Seq>,
    transferring: Vec<Seq>,
    running: Vec<Seq>,
    cache: PrefixCache,
    counters: Counters,
    latencies: Latencies,
    next_block_id: u64,
    closed: bool,
}

pub struct Engine {
    cfg: SimConfig,
    state: Mutex<State>,
    wake: Notify,
}

impl Engine {
    pub fn new(cfg: SimConfig) -> Arc<Self> {
        let latencies = Latencies::new(cfg.engine);
        Arc::new(Self {
            cfg,
            state: Mutex::new(State {
                waiting: VecDeque::new(),
                transferring: Vec::new(),
                running: Vec::new(),
                cache: PrefixCache::default(),
                counters: Counters::default(),
                latencies,
                next_block_id: 0,
                closed: false,
            }),
            wake: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere must not take the pod down with a poisoned lock.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a request. The receiver yields its tokens and then its outcome; it ends without an
    /// outcome if the engine shuts down. Dropping the receiver aborts the request.
    pub fn submit(&self, spec: SeqSpec) -> mpsc::UnboundedReceiver<SeqEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let now = Instant::now();
        let mut st = self.lock();
        if !st.closed {
            st.waiting.push_back(Seq {
                spec,
                tx,
                arrival: now,
                cached: 0,
                transferred: 0,
                computed: 0,
                prefill_remaining: 0,
                generated: 0,
                pinned: 0,
                ready_at: now,
                last_token: None,
                sched_prefill: 0,
                sched_decode: false,
                fresh: false,
                eligible: now,
                aborted: false,
            });
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

    /// Drops every queued and running request (their receivers end) and refuses new ones.
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        st.waiting.clear();
        st.transferring.clear();
        st.running.clear();
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
            let plan = self.lock().plan(&self.cfg, now, boundary);
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
    fn used_blocks(&self, cfg: &SimConfig) -> usize {
        let private: usize = self
            .running
            .iter()
            .chain(&self.transferring)
            .map(|s| s.private_blocks(cfg))
            .sum();
        self.cache.pinned_len() + private
    }

    /// Evicts cached-but-unused blocks until the pool fits in `num_gpu_blocks`.
    fn evict(&mut self, cfg: &SimConfig) {
        let private: usize = self
            .running
            .iter()
            .chain(&self.transferring)
            .map(|s| s.private_blocks(cfg))
            .sum();
        self.cache
            .evict_to(cfg.num_gpu_blocks.saturating_sub(private));
    }

    fn drop_seq(&mut self, s: Seq) {
        s.release(&mut self.cache);
        self.counters.aborted += 1;
    }

    /// `boundary` is the step boundary at which a busy engine admits; an idle engine admits a request
    /// at its arrival (the loop may wake a little later than that; the simulated GPU does not).
    fn admit(&mut self, cfg: &SimConfig, now: Instant, boundary: Option<Instant>) {
        // Requests whose pulled KV has arrived join the batch ahead of the queue.
        for mut s in std::mem::take(&mut self.transferring) {
            if s.tx.is_closed() {
                self.drop_seq(s);
            } else if s.ready_at <= now && self.running.len() < cfg.max_num_seqs {
                s.cover(&mut self.cache, cfg.block_size);
                s.fresh = true;
                s.eligible = s.ready_at;
                self.running.push(s);
            } else {
                self.transferring.push(s);
            }
        }

        while self.running.len() < cfg.max_num_seqs {
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
            // vLLM always recomputes the last prompt token, so only blocks ending before it can hit.
            let hashable =
                (prompt.saturating_sub(1) / cfg.block_size).min(front.spec.block_hashes.len());
            let candidates = front.spec.block_hashes.get(..hashable).unwrap_or_default();
            let hit = self.cache.longest_prefix(candidates);
            let shared = candidates
                .iter()
                .take(hit)
                .filter(|h| self.cache.is_pinned(**h))
                .count();
            let need = cfg.blocks_for(prompt + 1).saturating_sub(shared);
            let free = cfg.num_gpu_blocks.saturating_sub(self.used_blocks(cfg));
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
            s.cached = hit * cfg.block_size;
            s.transferred = s
                .spec
                .remote_tokens
                .min(prompt.saturating_sub(1))
                .saturating_sub(s.cached);
            s.computed = s.cached + s.transferred;
            s.prefill_remaining = prompt.saturating_sub(s.computed);
            // Computing one last token costs no more than a decode step: it rides along with the
            // decode batch (as in vLLM, where it shares the forward pass of the first sampled token).
            if s.prefill_remaining <= 1 {
                s.prefill_remaining = 0;
            }
            self.counters.prefix_queries += prompt as u64;
            self.counters.prefix_hits += s.cached as u64;
            self.counters.transferred_tokens += s.transferred as u64;
            if s.transferred > 0 {
                let start = boundary.map_or(s.arrival, |b| b.max(s.arrival));
                s.ready_at = start + cfg.to_wall(cfg.transfer_time(s.transferred));
                self.transferring.push(s);
            } else {
                s.fresh = true;
                s.eligible = s.arrival;
                self.running.push(s);
            }
            self.evict(cfg);
        }
    }

    fn plan(&mut self, cfg: &SimConfig, now: Instant, boundary: Option<Instant>) -> Plan {
        if self.closed {
            return Plan::Idle(None);
        }
        self.admit(cfg, now, boundary);
        if self.running.is_empty() {
            return Plan::Idle(self.transferring.iter().map(|s| s.ready_at).min());
        }
        let mut budget = match cfg.chunked_prefill_tokens {
            0 => usize::MAX,
            n => n,
        };
        let (mut prefill_tokens, mut decoding) = (0, 0);
        let mut fresh_since: Option<Instant> = None;
        for s in &mut self.running {
            s.sched_prefill = 0;
            s.sched_decode = false;
            if s.prefill_remaining > 0 {
                let n = s.prefill_remaining.min(budget);
                budget -= n;
                s.sched_prefill = n;
                prefill_tokens += n;
            } else {
                s.sched_decode = true;
                decoding += 1;
            }
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
                emit_token(s, at, cfg, cache, counters, latencies);
            }
            s.sched_prefill = 0;
            s.sched_decode = false;
        }

        for s in std::mem::take(&mut self.running) {
            if s.aborted {
                self.drop_seq(s);
            } else if s.generated >= s.spec.max_tokens {
                s.release(&mut self.cache);
                self.counters.success += 1;
                self.latencies
                    .e2e
                    .observe(cfg.to_sim_secs(at.saturating_duration_since(s.arrival)));
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
                let _ = s.tx.send(SeqEvent::Finished(Outcome {
                    prompt_tokens: s.spec.prompt_tokens,
                    completion_tokens: s.generated,
                    cached_tokens: s.cached + s.transferred,
                    block_ids,
                }));
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
    if index == 0 {
        // The first sampled token means the whole prompt's KV exists (including a last token that
        // rode along with the decode batch).
        s.computed = s.spec.prompt_tokens;
        s.cover(cache, cfg.block_size);
        counters.prompt_tokens += s.spec.prompt_tokens as u64;
        latencies
            .ttft
            .observe(cfg.to_sim_secs(at.saturating_duration_since(s.arrival)));
    } else if let Some(prev) = s.last_token {
        latencies
            .itl
            .observe(cfg.to_sim_secs(at.saturating_duration_since(prev)));
    }
    s.generated += 1;
    s.last_token = Some(at);
    counters.generation_tokens += 1;
    if s.tx.send(SeqEvent::Token { index }).is_err() {
        // The client went away: vLLM aborts the request and frees its blocks.
        s.aborted = true;
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
