//! The work each pod has to do first: this VM's requests in flight and its prefills not yet at
//! their first byte (what its row on the work board carries, see `super::board`), plus
//! the other VMs' rows.

use super::PodWork;
use hashbrown::HashMap;

/// Whose prefill a routed request is and what was predicted for it: what the work board carries
/// until its first byte, and what that first byte teaches (`crate::cost`).
#[derive(Debug, Clone, PartialEq)]
pub struct FirstToken {
    /// The pod that prefills (the prefill pod of a split request).
    pub addr: String,
    pub uncached_tokens: f64,
    /// The whole prompt: what the pod computes if it loses its cache before it gets there.
    pub prompt_tokens: f64,
    /// The last block of the prompt's prefix the pod was believed to hold (0: none): requests
    /// queued behind one that recomputes that prefix hit it.
    pub held_prefix: u64,
    /// The model's features at routing time: tokens ahead + uncached, sequences decoding.
    pub tokens: f64,
    pub decoding: f64,
    pub predicted_ms: f64,
    /// Of `predicted_ms`, the time to load the request's LoRA adapter (`crate::adapters`).
    pub adapter_load_ms: f64,
    /// Of `predicted_ms`, the time to load its cached blocks from tiers beyond the GPU.
    pub warm_load_ms: f64,
}

/// This VM's work in flight per pod and the other VMs' as last read from the board.
#[derive(Debug, Default)]
pub struct WorkBook {
    /// This VM's unfinished requests per pod, live.
    local_inflight: HashMap<String, u32>,
    /// This VM's prefills not yet at their first byte.
    pending: Vec<PendingPrefill>,
    next_pending_id: u64,
    /// Every other VM's unfinished work per pod, from the work board.
    others_work: HashMap<String, PodWork>,
    /// Running mean of the uncached tokens of the requests this VM routed.
    typical_tokens: Option<f64>,
}

/// A prefill this VM routed that has not produced its first byte yet.
#[derive(Debug, Clone, PartialEq)]
struct PendingPrefill {
    id: u64,
    addr: String,
    tokens: u64,
    /// The whole prompt ([`FirstToken::prompt_tokens`]).
    prompt_tokens: u64,
    /// [`FirstToken::held_prefix`].
    held_prefix: u64,
    /// Since when the pod can have been computing it: when it was routed, or when the prefill before
    /// it on the same pod ended, whichever is later (the board's head, see `super::board`).
    since_ms: u64,
    /// When it counts as done even without a first byte seen: a non-streaming response shows its
    /// first byte only at the end, so the predicted first token with margin; a streamed one shows it
    /// at the first token, so only the first-byte timeout (a safety net: `on_done` clears it too).
    until_ms: u64,
}

/// Before any request was routed, requests a pod reports waiting that the board does not show are
/// counted at this size.
pub const DEFAULT_TYPICAL_TOKENS: f64 = 512.0;
/// Weight of the newest request in the running mean of request sizes.
const TYPICAL_TOKENS_ALPHA: f64 = 0.05;
/// A prefill with no first byte seen counts as done after its predicted TTFT times this (plus
/// `PENDING_MARGIN_MS`): a non-streaming response only shows its first byte when it is complete.
const PENDING_SLACK: f64 = 2.0;
const PENDING_MARGIN_MS: u64 = 50;
/// At most this many prefills are tracked per VM; beyond it the oldest stops counting (bounded
/// memory whatever the traffic; a VM has far fewer requests in flight than this).
pub const MAX_PENDING: usize = 4096;

impl WorkBook {
    /// Unfinished work on `addr`: the other VMs' rows on the board plus this VM's live state.
    pub fn of(&self, addr: &str) -> PodWork {
        let mut w = self.others_work.get(addr).copied().unwrap_or_default();
        w.inflight = w
            .inflight
            .saturating_add(self.local_inflight.get(addr).copied().unwrap_or(0));
        for p in self.pending.iter().filter(|p| p.addr == addr) {
            w.prefill_tokens = w.prefill_tokens.saturating_add(p.tokens);
            w.prefill_requests = w.prefill_requests.saturating_add(1);
            w.add_head(p.since_ms, p.tokens);
        }
        w
    }

    /// How many prefills this VM tracks (bounded by [`MAX_PENDING`]).
    #[cfg(test)]
    pub fn pending_prefills(&self) -> usize {
        self.pending.len()
    }

    /// The mean uncached size of the requests this VM routed ([`DEFAULT_TYPICAL_TOKENS`] before
    /// the first): what a request a pod reports waiting, unseen on the board, is counted as.
    pub fn typical_tokens(&self) -> f64 {
        self.typical_tokens.unwrap_or(DEFAULT_TYPICAL_TOKENS)
    }

    pub fn inflight_start(&mut self, addr: &str) {
        *self.local_inflight.entry_ref(addr).or_insert(0) += 1;
    }

    pub fn inflight_end(&mut self, addr: &str) {
        if let Some(n) = self.local_inflight.get_mut(addr) {
            *n = n.saturating_sub(1);
        }
    }

    /// Puts a routed request's prefill on the board until [`Self::prefill_done`] (or its deadline:
    /// `streamed_deadline_ms` after `now_ms` for a streamed response, else twice the predicted
    /// first token); returns its handle.
    pub fn prefill_start(
        &mut self,
        first: &FirstToken,
        now_ms: u64,
        streamed_deadline_ms: Option<u64>,
    ) -> u64 {
        let alpha = TYPICAL_TOKENS_ALPHA;
        self.typical_tokens = Some(match self.typical_tokens {
            Some(t) => t * (1.0 - alpha) + first.uncached_tokens * alpha,
            None => first.uncached_tokens,
        });
        if self.pending.len() >= MAX_PENDING {
            self.pending.remove(0);
        }
        self.next_pending_id += 1;
        let wait = streamed_deadline_ms
            .unwrap_or((first.predicted_ms.max(0.0) * PENDING_SLACK) as u64 + PENDING_MARGIN_MS);
        self.pending.push(PendingPrefill {
            id: self.next_pending_id,
            addr: first.addr.clone(),
            tokens: first.uncached_tokens.max(0.0) as u64,
            prompt_tokens: first.prompt_tokens.max(0.0) as u64,
            held_prefix: first.held_prefix,
            since_ms: now_ms,
            until_ms: now_ms.saturating_add(wait),
        });
        self.next_pending_id
    }

    /// The prefill's first byte arrived, or the request ended: it no longer counts as queued work,
    /// and the pod's next prefills can have been computing only since now. Returns whether it was
    /// still counted (the board row changed).
    pub fn prefill_done(&mut self, id: u64, now_ms: u64) -> bool {
        let Some(at) = self.pending.iter().position(|p| p.id == id) else {
            return false;
        };
        let done = self.pending.remove(at);
        self.pending_moved_on(&done.addr, now_ms);
        true
    }

    /// `addr` restarted with an empty cache: the first prefill queued there for each prefix it
    /// was believed to hold computes its whole prompt; those behind it for the same prefix hit
    /// what it computes (an engine caches blocks as it schedules them) and stay as priced. The
    /// restart is seen a poll after it happened, and the requests routed to the new process in
    /// between were priced as hits: left so, a pod recomputing three prompts showed a queue of
    /// 200 tokens and was given a fourth. (Those routed to the old process fail, and leave the
    /// board as they do.) Only this VM's book is known here: where another worker holds an
    /// earlier request for the same prefix, this one is counted whole too, though it will hit
    /// (docs/results.md, "A restart that ends the process"). Returns whether any changed (the row
    /// did).
    pub fn pod_restarted(&mut self, addr: &str) -> bool {
        let mut recomputed: Vec<u64> = Vec::new();
        let mut changed = false;
        for p in self.pending.iter_mut().filter(|p| p.addr == addr) {
            if p.held_prefix == 0 || recomputed.contains(&p.held_prefix) {
                continue;
            }
            recomputed.push(p.held_prefix);
            if p.prompt_tokens > p.tokens {
                p.tokens = p.prompt_tokens;
                changed = true;
            }
        }
        changed
    }

    /// Drops prefills past their deadline; returns whether any was dropped (the row changed).
    pub fn expire_prefills(&mut self, now_ms: u64) -> bool {
        let (expired, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| p.until_ms <= now_ms);
        self.pending = kept;
        for p in &expired {
            self.pending_moved_on(&p.addr, now_ms);
        }
        !expired.is_empty()
    }

    fn pending_moved_on(&mut self, addr: &str, now_ms: u64) {
        for p in self.pending.iter_mut().filter(|p| p.addr == addr) {
            p.since_ms = p.since_ms.max(now_ms);
        }
    }

    /// This VM's unfinished work per pod, for its row on the work board.
    pub fn own_work(&mut self) -> Vec<(String, PodWork)> {
        self.local_inflight.retain(|_, n| *n > 0);
        let mut rows: HashMap<&str, PodWork> = HashMap::new();
        for (addr, n) in &self.local_inflight {
            rows.entry(addr.as_str()).or_default().inflight = *n;
        }
        for p in &self.pending {
            let w = rows.entry(p.addr.as_str()).or_default();
            w.prefill_tokens = w.prefill_tokens.saturating_add(p.tokens);
            w.prefill_requests = w.prefill_requests.saturating_add(1);
            w.add_head(p.since_ms, p.tokens);
        }
        let mut out: Vec<(String, PodWork)> =
            rows.into_iter().map(|(a, w)| (a.to_string(), w)).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Adopts the other VMs' work read from the board at `now_ms`; returns whether this VM's own
    /// prefills moved on (its row changed).
    ///
    /// A prefill another VM routed that ended on a pod where this VM has prefills queued ended
    /// for them too: they can have been computing only since then, as when one of this VM's own
    /// ends (`pending_moved_on`). Without this, a request queued behind another worker's counted
    /// as computing since it was routed, and the board's head (the earliest) was taken as done
    /// seconds early: on `make bench-pd`'s interference scenario a prefill pod halfway through a
    /// 9,000-token prompt was predicted idle and given the next long prompt as well. The signal
    /// is the others' prefill count on the pod falling, or their head becoming another request
    /// (other tokens); not their head's start moving, which is their own moving on and would
    /// echo between VMs. It is seen at this VM's next board read (every routed request and every
    /// tick), so the start is late by up to that, which counts the work ahead as more, not less.
    pub fn set_others_work(&mut self, others: HashMap<String, PodWork>, now_ms: u64) -> bool {
        let before = std::mem::replace(&mut self.others_work, others);
        let mut moved = false;
        for (addr, was) in &before {
            let now = self.others_work.get(addr).copied().unwrap_or_default();
            let ended = now.prefill_requests < was.prefill_requests
                || (was.head_tokens > 0 && now.head_tokens != was.head_tokens);
            if ended
                && self
                    .pending
                    .iter()
                    .any(|p| p.addr == *addr && p.since_ms < now_ms)
            {
                self.pending_moved_on(addr, now_ms);
                moved = true;
            }
        }
        moved
    }
}
