//! KV moved between pods. A decode pod pulls a prefill pod's KV over a link shared equally by
//! concurrent pulls, and tells the source when a pull completes; a prefill pod holds the blocks of a
//! finished remote-decode prefill until the decoder has pulled them or the hold times out.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::SimConfig;

use super::scheduler::State;
use super::seq::Seq;
use super::Engine;

/// A finished remote-decode prefill whose blocks wait for the decoder's pull.
pub(super) struct Held {
    pub(super) first_block: u64,
    pub(super) until: Instant,
    pub(super) seq: Seq,
}

impl State {
    /// Advances the shared KV link to `to`: concurrent pulls share its bandwidth equally, so each of
    /// `n` pulls progresses at 1/n of the link until one completes and the others speed up.
    pub(super) fn advance_link(&mut self, cfg: &SimConfig, to: Instant) {
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
    pub(super) fn transfer_wake(&self, cfg: &SimConfig) -> Option<Instant> {
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

    pub(super) fn start_transfer(&mut self, cfg: &SimConfig, mut s: Seq, start: Instant) {
        let source = s
            .spec
            .pull_source
            .as_ref()
            .and_then(|p| p.locality.as_deref());
        let time = cfg.transfer_time_from(s.transferred, source);
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
    pub(super) fn expire_holds(&mut self, now: Instant) {
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
}

impl Engine {
    pub(super) fn tell_pulled(&self) {
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
}
