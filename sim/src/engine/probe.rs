//! The what-if estimate behind `POST /sim/probe`: the pod steps a copy of its batch and queue with
//! its own cost model to tell when a prompt arriving now would get its first token.

use std::collections::VecDeque;

use tokio::time::Instant;

use crate::config::SimConfig;

use super::seq::Seq;
use super::transfer::Link;
use super::Engine;

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
    /// Prompt tokens after those that the host-memory tier holds: loaded, not computed (only on a
    /// pod with a tier).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_cached_tokens: Option<usize>,
    /// Uncached prefill tokens queued or running ahead of it (running: what is left to compute,
    /// the step in progress included).
    pub queued_prefill_tokens: usize,
    pub running: usize,
    /// Queued, and waiting for pulled KV.
    pub waiting: usize,
    /// Time from now to this request's first token, by stepping the pod's batch with its own cost
    /// model (the step in progress counted from its estimated start; loads from the host tier over
    /// its shared link, as the engine runs them; KV-memory admission limits and later arrivals not
    /// modelled).
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
    /// Simulated ms of exclusive host-link time its load from the host tier still needs (0: none):
    /// admitted, it waits out the load (shared equally with the other loads) before it joins.
    load_ms: f64,
}

/// Advances the host-tier loads by `ms`: the link is shared equally by the loads in progress, as
/// the engine's `transfer.rs` shares it.
fn advance_loads(loading: &mut [WhatIf], mut ms: f64) {
    loop {
        let n = loading.iter().filter(|v| v.load_ms > 0.0).count();
        if n == 0 || ms <= 0.0 {
            return;
        }
        let min_left = loading
            .iter()
            .filter(|v| v.load_ms > 0.0)
            .map(|v| v.load_ms)
            .fold(f64::INFINITY, f64::min);
        let step = (min_left * n as f64).min(ms);
        for v in loading.iter_mut().filter(|v| v.load_ms > 0.0) {
            v.load_ms -= step / n as f64;
            if v.load_ms <= 1e-9 {
                v.load_ms = 0.0;
            }
        }
        ms -= step;
    }
}

/// Time until the first load in progress completes (∞ if none).
fn next_load_done(loading: &[WhatIf]) -> f64 {
    let n = loading.iter().filter(|v| v.load_ms > 0.0).count() as f64;
    loading
        .iter()
        .filter(|v| v.load_ms > 0.0)
        .map(|v| v.load_ms * n)
        .fold(f64::INFINITY, f64::min)
}

/// Steps `running` + `queue` from `t0_ms` with the engine's rules (FIFO admission behind
/// `max_num_seqs`, the prefill budget, the step cost; host-tier loads, `loading` already under way
/// from 0, joining the batch when done and a seat is free); returns the probe's first-token time,
/// the sum of the pending sequences' first-token times, and whether it gave up.
fn step_what_if(
    cfg: &SimConfig,
    mut running: Vec<WhatIf>,
    mut loading: Vec<WhatIf>,
    mut queue: VecDeque<WhatIf>,
    t0_ms: f64,
) -> (Option<f64>, f64, bool) {
    let all = || running.iter().chain(&loading).chain(&queue);
    let has_probe = all().any(|v| v.probe);
    let mut left = all().filter(|v| v.pending).count();
    let (mut t, mut sum, mut probe_t) = (t0_ms, 0.0, None);
    advance_loads(&mut loading, t0_ms);
    for _ in 0..PROBE_MAX_STEPS {
        if left == 0 && (!has_probe || probe_t.is_some()) {
            return (probe_t, sum, false);
        }
        // Loaded requests join ahead of the queue, as the engine's `schedule()` takes them.
        let mut i = 0;
        while i < loading.len() && running.len() < cfg.max_num_seqs {
            if loading[i].load_ms <= 0.0 {
                running.push(loading.remove(i));
            } else {
                i += 1;
            }
        }
        while running.len() < cfg.max_num_seqs {
            let Some(v) = queue.pop_front() else { break };
            if v.load_ms > 0.0 {
                loading.push(v);
            } else {
                running.push(v);
            }
        }
        if running.is_empty() {
            if loading.is_empty() {
                return (probe_t, sum, false);
            }
            // Idle until the next load completes.
            let wait = next_load_done(&loading);
            if !wait.is_finite() {
                return (probe_t, sum, true);
            }
            advance_loads(&mut loading, wait);
            t += wait;
            continue;
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
        let step_ms = cfg.step_time(prefill_tokens, decoding).as_secs_f64() * 1e3;
        advance_loads(&mut loading, step_ms);
        t += step_ms;
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
        // Beyond those, what the host tier holds loads instead of computing.
        let host_at_admission = st.host_lookup(cfg, mine, at_admission);
        let load_ms = |blocks: usize| cfg.host_load_time(blocks * bs).as_secs_f64() * 1e3;

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
                    load_ms: 0.0,
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
        // Pulls in progress join at once; host-tier loads in progress go on from where the host
        // link's clock left them.
        let (host_loads, pulls): (Vec<&Seq>, Vec<&Seq>) =
            st.transferring.iter().partition(|s| s.link() == Link::Host);
        let mut queue: VecDeque<WhatIf> = pulls
            .iter()
            .map(|s| WhatIf {
                prefill: 0,
                out: s.spec.max_tokens.max(1),
                probe: false,
                pending: true,
                load_ms: 0.0,
            })
            .collect();
        let mut loading: Vec<WhatIf> = host_loads
            .iter()
            .map(|s| WhatIf {
                prefill: s.prefill_remaining,
                out: s.spec.max_tokens.max(1),
                probe: false,
                pending: true,
                load_ms: s.xfer_left * 1e3,
            })
            .collect();
        if let Some(clock) = st.host_clock {
            advance_loads(
                &mut loading,
                cfg.to_sim_secs(now.saturating_duration_since(clock)) * 1e3,
            );
        }
        for s in &st.waiting {
            let hashes = s
                .spec
                .block_hashes
                .get(..hashable(s.spec.prompt_tokens, &s.spec.block_hashes))
                .unwrap_or_default();
            let hit = st.cache.longest_prefix(hashes);
            let host = if s.spec.remote_tokens == 0 {
                st.host_lookup(cfg, hashes, hit)
            } else {
                0
            };
            queue.push_back(WhatIf {
                prefill: uncached(s.spec.prompt_tokens, hit + host),
                out: s.spec.max_tokens.max(1),
                probe: false,
                pending: true,
                load_ms: load_ms(host),
            });
        }
        // Running prefills count whole, the step in progress included: that work is still ahead.
        let queued_prefill_tokens = st
            .running
            .iter()
            .map(|s| s.prefill_remaining)
            .sum::<usize>()
            + loading
                .iter()
                .chain(&queue)
                .map(|v| v.prefill)
                .sum::<usize>();
        let (n_running, n_waiting) = (st.running.len(), st.waiting.len() + st.transferring.len());
        drop(st);

        let (_, without, _) =
            step_what_if(cfg, running.clone(), loading.clone(), queue.clone(), t0_ms);
        queue.push_back(WhatIf {
            prefill: uncached(prompt_tokens, at_admission + host_at_admission),
            out: max_tokens.max(1),
            probe: true,
            pending: false,
            load_ms: load_ms(host_at_admission),
        });
        let (first, with, capped) = step_what_if(cfg, running, loading, queue, t0_ms);
        ProbeEstimate {
            prompt_tokens,
            cached_tokens: cached_now * bs,
            cached_at_admission_tokens: at_admission * bs,
            host_cached_tokens: cfg.host_tier().then_some(host_at_admission * bs),
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
mod tests {
    use super::*;

    fn v(prefill: usize, out: usize, probe: bool, pending: bool) -> WhatIf {
        WhatIf {
            prefill,
            out,
            probe,
            pending,
            load_ms: 0.0,
        }
    }

    #[test]
    fn a_prefill_that_joins_a_queued_one_shares_its_step_and_delays_it() {
        let cfg = SimConfig::default();
        let queued = VecDeque::from([v(1000, 4, false, true)]);
        let (none, alone, capped) = step_what_if(&cfg, Vec::new(), Vec::new(), queued.clone(), 0.0);
        assert_eq!((none, capped), (None, false));
        assert!((alone - 440.0).abs() < 1e-6, "{alone}");
        let mut both = queued;
        both.push_back(v(1000, 4, true, false));
        let (first, with, _) = step_what_if(&cfg, Vec::new(), Vec::new(), both, 0.0);
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
        let (first, _, capped) = step_what_if(&cfg, running, Vec::new(), queue, 10.0);
        assert!(!capped);
        assert!((first.expect("probe") - (10.0 + 3.0 * 15.5 + 80.0)).abs() < 1e-6);
    }

    #[test]
    fn host_loads_share_the_link_and_join_when_done() {
        let cfg = SimConfig::default();
        // A load under way with 10 ms of the link to go, and the probe's own 10 ms load: each gets
        // half the link, both end at 20 ms, then one step holds the 16-token prefill and a decode.
        let under_way = vec![WhatIf {
            load_ms: 10.0,
            ..v(0, 2, false, true)
        }];
        let probe = VecDeque::from([WhatIf {
            load_ms: 10.0,
            ..v(16, 1, true, false)
        }]);
        let (first, sum, capped) = step_what_if(&cfg, Vec::new(), under_way, probe, 0.0);
        assert!(!capped);
        let step = cfg.step_time(16, 1).as_secs_f64() * 1e3;
        assert!((first.expect("probe") - (20.0 + step)).abs() < 1e-9);
        assert!(
            (sum - (20.0 + step)).abs() < 1e-9,
            "the other's first token"
        );
    }
}
