//! The step scheduler (vLLM V1's `schedule()`) and the block pool it allocates from: which
//! sequences a step holds and how many tokens each, admission from the queue when the new blocks
//! fit, recompute preemption when a running sequence cannot grow, and what a finished step does
//! (tokens out, finished requests freed or held for a decoder's pull).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::cache::{HostCache, PrefixCache};
use crate::config::SimConfig;
use crate::metrics::{Counters, Latencies};

use super::offload::write_through;
use super::seq::Seq;
use super::transfer::Held;
use super::{Outcome, PullSource, SeqEvent};

pub(super) enum Plan {
    Idle(Option<Instant>),
    Step {
        sim: Duration,
        /// Latest time a sequence new to this step became able to run.
        fresh_since: Option<Instant>,
    },
}

pub(super) struct State {
    /// Arrived, not yet queued (per-request overhead α0 + α1 · input length).
    pub(super) arriving: Vec<Seq>,
    pub(super) waiting: VecDeque<Seq>,
    pub(super) transferring: Vec<Seq>,
    pub(super) running: Vec<Seq>,
    pub(super) held: Vec<Held>,
    pub(super) cache: PrefixCache,
    /// The host-memory tier (capacity 0 without one).
    pub(super) host: HostCache,
    pub(super) counters: Counters,
    pub(super) latencies: Latencies,
    pub(super) next_block_id: u64,
    pub(super) closed: bool,
    /// How far the shared KV link's progress has been computed.
    pub(super) link_clock: Option<Instant>,
    /// How far the host tier link's progress has been computed.
    pub(super) host_clock: Option<Instant>,
    /// Pulls completed since the loop last told their sources.
    pub(super) pulled: Vec<PullSource>,
    /// LoRA adapters in the GPU's slots, least recently used first (at most `max_loras`).
    pub(super) lora_slots: Vec<String>,
    /// Adapters the step being planned loads (each makes it `lora_load_ms` longer).
    pub(super) lora_loads: usize,
}

impl State {
    /// Ends every sequence, arriving to held: their receivers end without an outcome.
    pub(super) fn drop_sequences(&mut self) {
        self.arriving.clear();
        self.waiting.clear();
        self.transferring.clear();
        self.running.clear();
        self.held.clear();
    }

    fn private_blocks(&self, cfg: &SimConfig) -> usize {
        self.running
            .iter()
            .chain(&self.transferring)
            .chain(self.held.iter().map(|h| &h.seq))
            .map(|s| s.private_blocks(cfg))
            .sum()
    }

    /// Blocks in use (vLLM: referenced by a request): shared prefix blocks once, plus private ones.
    pub(super) fn used_blocks(&self, cfg: &SimConfig) -> usize {
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
        s.written = 0;
        s.alloc = 0;
        s.computed = 0;
        s.prefill_remaining = 0;
        s.sched_prefill = 0;
        s.sched_decode = false;
        s.fresh = false;
        s.loading = 0;
        // Pulled KV is gone with the blocks; the prompt is recomputed here (or loaded again from
        // the host tier, which keeps its copy).
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

    /// Puts `adapter` in a GPU slot for a request admitted this step: marked most recently used if
    /// there, else loaded (the step pays for it) into a free slot or over the least recently used
    /// one no request of this step runs with.
    fn activate_lora(&mut self, cfg: &SimConfig, adapter: &str, scheduled: &[String]) {
        if let Some(i) = self.lora_slots.iter().position(|a| a == adapter) {
            let a = self.lora_slots.remove(i);
            self.lora_slots.push(a);
            return;
        }
        if self.lora_slots.len() >= cfg.max_loras.max(1) {
            let victim = self.lora_slots.iter().position(|a| !scheduled.contains(a));
            self.lora_slots.remove(victim.unwrap_or(0));
        }
        self.lora_slots.push(adapter.to_string());
        self.lora_loads += 1;
        self.counters.adapter_loads += 1;
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

        // Requests whose pulled or loaded KV has arrived join the batch ahead of the queue.
        for mut s in std::mem::take(&mut self.transferring) {
            if s.tx.is_closed() {
                self.drop_seq(s);
            } else if s.pull_done() && s.ready_at <= now && self.running.len() < cfg.max_num_seqs {
                if s.cover(&mut self.cache, bs) {
                    write_through(cfg, &mut self.host, &mut self.counters, s.covered());
                }
                self.counters.offload_loaded_bytes += (s.loading * cfg.kv_bytes_per_token()) as u64;
                s.loading = 0;
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
                s.reserve(&mut self.cache, (s.computed + want) / bs);
            }
            if !decoding || counts_decodes {
                budget -= want;
            }
            i += 1;
        }

        // vLLM schedules no waiting request in a step that had to preempt.
        let preempted = self.counters.preemptions > preemptions_before;
        let mut scheduled_loras: Vec<String> = Vec::new();
        for s in &self.running {
            if let Some(a) = s
                .spec
                .adapter
                .as_ref()
                .filter(|a| !scheduled_loras.contains(a))
            {
                scheduled_loras.push(a.clone());
            }
        }
        let mut skipped: VecDeque<Seq> = VecDeque::new();
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
            let adapter = front.spec.adapter.clone();
            if let Some(a) = &adapter {
                if !scheduled_loras.contains(a) && scheduled_loras.len() >= cfg.max_loras.max(1) {
                    // One adapter too many for this step: skipped, ahead of the rest next step.
                    if let Some(s) = self.waiting.pop_front() {
                        skipped.push_back(s);
                    }
                    continue;
                }
            }
            let prompt = front.spec.prompt_tokens;
            let total = prompt + front.generated;
            // vLLM always recomputes the last token, so only blocks ending before it can hit.
            let hashable = (total.saturating_sub(1) / bs).min(front.spec.block_hashes.len());
            let candidates = front.spec.block_hashes.get(..hashable).unwrap_or_default();
            let hit = self.cache.longest_prefix(candidates);
            // The host tier's blocks after the GPU hit load instead of computing (a request that
            // brings a prefill pod's KV pulls it instead).
            let host_hit = if front.spec.remote_tokens == 0 {
                self.host_lookup(cfg, candidates, hit)
            } else {
                0
            };
            let shared = candidates
                .iter()
                .take(hit)
                .filter(|h| self.cache.is_pinned(**h))
                .count();
            let cached = hit * bs;
            let loaded = host_hit * bs;
            let transferred = front
                .spec
                .remote_tokens
                .min(prompt.saturating_sub(1))
                .saturating_sub(cached);
            let computed = cached + loaded + transferred;
            let mut prefill_remaining = total.saturating_sub(computed);
            // Computing one last token costs no more than a decode step: it rides along with the
            // decode batch (as in vLLM, where it shares the forward pass of the first sampled token).
            if prefill_remaining <= 1 {
                prefill_remaining = 0;
            }
            let (want, mut target) = if transferred + loaded > 0 {
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
            if let Some(a) = adapter {
                self.activate_lora(cfg, &a, &scheduled_loras);
                if !scheduled_loras.contains(&a) {
                    scheduled_loras.push(a);
                }
            }
            for h in s.spec.block_hashes.iter().take(hit) {
                self.cache.pin(*h);
            }
            s.pinned = hit;
            s.written = hit;
            s.computed = computed;
            s.loading = loaded;
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
                if cfg.host_tier() {
                    s.host_hit = loaded;
                    self.counters.external_queries += prompt.saturating_sub(cached) as u64;
                    self.counters.external_hits += loaded as u64;
                }
            }
            self.host_admit(cfg, &s.spec.block_hashes, hit, host_hit);
            if transferred + loaded > 0 {
                let start = boundary.map_or(s.queued_at, |b| b.max(s.queued_at));
                self.start_transfer(cfg, s, start);
            } else {
                // Nothing to pull (all cached here): the producer may free its blocks now.
                if let Some(src) = s.spec.pull_source.take() {
                    self.pulled.push(src);
                }
                if prefill_remaining > 0 {
                    s.sched_prefill = want;
                    s.reserve(&mut self.cache, (s.computed + want) / bs);
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
        while let Some(s) = skipped.pop_back() {
            self.waiting.push_front(s);
        }

        let prefill: usize = self.running.iter().map(|s| s.sched_prefill).sum();
        let decode = self.running.iter().filter(|s| s.sched_decode).count();
        (prefill, decode)
    }

    pub(super) fn plan(
        &mut self,
        cfg: &SimConfig,
        now: Instant,
        boundary: Option<Instant>,
    ) -> Plan {
        if self.closed {
            return Plan::Idle(None);
        }
        self.expire_holds(now);
        self.advance_link(cfg, now);
        self.queue_arrivals(now);
        self.lora_loads = 0;
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
        let loads = cfg.lora_load_time().mul_f64(self.lora_loads as f64);
        Plan::Step {
            sim: cfg.step_time(prefill_tokens, decoding) + loads,
            fresh_since,
        }
    }

    pub(super) fn finish_step(&mut self, cfg: &SimConfig, at: Instant) {
        let State {
            running,
            cache,
            host,
            counters,
            latencies,
            ..
        } = self;
        for s in running.iter_mut() {
            if s.sched_prefill > 0 {
                s.prefill_remaining -= s.sched_prefill;
                s.computed += s.sched_prefill;
                if s.cover(cache, cfg.block_size) {
                    write_through(cfg, host, counters, s.covered());
                }
                if s.prefill_remaining == 0 {
                    emit_token(s, at, cfg, (cache, host), counters, latencies);
                }
            } else if s.sched_decode {
                s.computed = s.computed.max(s.spec.prompt_tokens + s.generated);
                emit_token(s, at, cfg, (cache, host), counters, latencies);
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
                        cached_tokens: s.not_computed(),
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
    (cache, host): (&mut PrefixCache, &mut HostCache),
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
        if s.cover(cache, cfg.block_size) {
            write_through(cfg, host, counters, s.covered());
        }
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
        cached_tokens: s.not_computed(),
    };
    if !s.tx.send(delivered, token) {
        // The client went away: vLLM aborts the request and frees its blocks.
        s.aborted = true;
    }
}
