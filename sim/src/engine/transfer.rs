//! KV moved between pods, and between the GPU and the host tier. A decode pod pulls a prefill pod's
//! KV over a link shared equally by concurrent pulls, and tells the source when a pull completes; a
//! prefill pod holds the blocks of a finished remote-decode prefill until the decoder has pulled
//! them or the hold times out. A load from the host tier (`offload.rs`) is a transfer of the same
//! kind over the host link, shared equally by concurrent loads (not with pulls: another path).

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

/// The two ways KV reaches this pod's GPU without being computed, each with its own bandwidth
/// shared equally by the transfers on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Link {
    /// Pulled from a prefill pod (shared only where `kv_link_gbps` is set; the seed model's fixed
    /// per-token cost otherwise).
    Pull,
    /// Loaded from the host-memory tier over the GPU's DMA path (`cpu_offload_gbps`).
    Host,
}

impl State {
    fn clock(&mut self, link: Link) -> &mut Option<Instant> {
        match link {
            Link::Pull => &mut self.link_clock,
            Link::Host => &mut self.host_clock,
        }
    }

    /// Advances the KV links to `to`: the pull link where `kv_link_gbps` is set, and the host
    /// tier's where the pod has one.
    pub(super) fn advance_link(&mut self, cfg: &SimConfig, to: Instant) {
        if cfg.kv_link_gbps.is_some() {
            self.advance(cfg, to, Link::Pull);
        }
        if cfg.host_tier() {
            self.advance(cfg, to, Link::Host);
        }
    }

    /// Advances one link to `to`: concurrent transfers share its bandwidth equally, so each of `n`
    /// progresses at 1/n of the link until one completes and the others speed up.
    fn advance(&mut self, cfg: &SimConfig, to: Instant, link: Link) {
        let mut t = match *self.clock(link) {
            Some(c) if c < to => c,
            Some(_) => return,
            None => {
                *self.clock(link) = Some(to);
                return;
            }
        };
        loop {
            let active: Vec<usize> = (0..self.transferring.len())
                .filter(|i| {
                    let s = &self.transferring[*i];
                    s.link() == link && !s.pull_done()
                })
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
        *self.clock(link) = Some(to);
    }

    /// When the next transfer completes (or completed, if it still waits for a batch slot).
    pub(super) fn transfer_wake(&self, cfg: &SimConfig) -> Option<Instant> {
        let done = self
            .transferring
            .iter()
            .filter(|s| s.pull_done())
            .map(|s| s.ready_at)
            .min();
        let next = |link: Link, clock: Option<Instant>| {
            let active: Vec<f64> = self
                .transferring
                .iter()
                .filter(|s| s.link() == link && !s.pull_done())
                .map(|s| s.xfer_left)
                .collect();
            match (clock, active.iter().copied().reduce(f64::min)) {
                (Some(clock), Some(min_left)) => Some(
                    clock + cfg.to_wall(Duration::from_secs_f64(min_left * active.len() as f64)),
                ),
                _ => None,
            }
        };
        [
            done,
            next(Link::Pull, self.link_clock),
            next(Link::Host, self.host_clock),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Starts `s`'s transfer at `start`: its pull from a prefill pod, or its load from the host
    /// tier (`s.loading` tokens).
    pub(super) fn start_transfer(&mut self, cfg: &SimConfig, mut s: Seq, start: Instant) {
        let link = s.link();
        let (time, shared) = match link {
            Link::Host => (cfg.host_load_time(s.loading), true),
            Link::Pull => {
                let source = s
                    .spec
                    .pull_source
                    .as_ref()
                    .and_then(|p| p.locality.as_deref());
                (
                    cfg.transfer_time_from(s.transferred, source),
                    cfg.kv_link_gbps.is_some(),
                )
            }
        };
        if shared {
            // An idle link starts the transfer when it was admitted (the loop may have woken
            // later); a busy one cannot share time it has already accounted for.
            let busy = self
                .transferring
                .iter()
                .any(|t| t.link() == link && !t.pull_done());
            let start = match *self.clock(link) {
                Some(c) if busy => c.max(start),
                _ => start,
            };
            if !busy {
                *self.clock(link) = Some(start);
            }
            self.advance(cfg, start, link);
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
