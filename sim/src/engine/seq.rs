//! A request inside the engine: how far its prompt and output have got, the KV blocks it holds,
//! and where its tokens go.

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::cache::PrefixCache;
use crate::config::SimConfig;

use super::transfer::Link;
use super::{SeqEvent, SeqSpec};

/// Where a sequence's events go: straight to the HTTP layer, or through a per-request delivery task
/// that holds each event until its delivery time (a profile with per-output-token host time).
pub(super) enum Sink {
    Direct(mpsc::UnboundedSender<SeqEvent>),
    Delayed(mpsc::UnboundedSender<(Instant, SeqEvent)>),
}

impl Sink {
    /// Sends `event` for delivery at `at`; false if the receiver is gone.
    pub(super) fn send(&self, at: Instant, event: SeqEvent) -> bool {
        match self {
            Sink::Direct(tx) => tx.send(event).is_ok(),
            Sink::Delayed(tx) => tx.send((at, event)).is_ok(),
        }
    }

    pub(super) fn is_closed(&self) -> bool {
        match self {
            Sink::Direct(tx) => tx.is_closed(),
            Sink::Delayed(tx) => tx.is_closed(),
        }
    }
}

/// Forwards events at their delivery times; ends (and so closes the engine's side) when the
/// receiver goes away.
pub(super) async fn deliver(
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

pub(super) struct Seq {
    pub(super) spec: SeqSpec,
    pub(super) tx: Sink,
    pub(super) arrival: Instant,
    /// When the request reaches the scheduler's queue (arrival + α0 + α1 · input length).
    pub(super) queued_at: Instant,
    /// Prompt tokens found in the prefix cache at first admission.
    pub(super) cached: usize,
    /// Prompt tokens pulled from a prefill pod at first admission.
    pub(super) transferred: usize,
    /// Prompt tokens loaded from the host-memory tier at first admission.
    pub(super) host_hit: usize,
    /// Tokens the host-tier load in progress brings (0: none, or a pull from a prefill pod).
    pub(super) loading: usize,
    /// Tokens whose KV exists on this pod.
    pub(super) computed: usize,
    pub(super) prefill_remaining: usize,
    pub(super) generated: usize,
    /// How many leading prompt blocks this sequence holds pinned in the cache: those computed and
    /// those the step being run computes (cached when scheduled, see [`Seq::reserve`]).
    pub(super) pinned: usize,
    /// How many leading prompt blocks were computed and written through to the host tier.
    pub(super) written: usize,
    /// Tokens this sequence holds KV slots for (its blocks: `blocks_for(alloc)`).
    pub(super) alloc: usize,
    /// Simulated seconds of exclusive link time its pull still needs (shared link only).
    pub(super) xfer_left: f64,
    /// When the pulled KV has arrived (transferring sequences whose `xfer_left` is 0).
    pub(super) ready_at: Instant,
    /// Delivery time of the last token.
    pub(super) last_token: Option<Instant>,
    pub(super) sched_prefill: usize,
    pub(super) sched_decode: bool,
    /// Joined the batch since the last step started: the next step cannot start before `eligible`
    /// (its queueing, or the end of its KV transfer).
    pub(super) fresh: bool,
    pub(super) eligible: Instant,
    pub(super) aborted: bool,
    /// Admitted at least once (a preempted sequence is not counted again).
    pub(super) started: bool,
}

impl Seq {
    /// A request that arrived at `arrival` and joins the queue at `queued_at` (after the
    /// profile's per-request overhead), nothing of it computed yet.
    pub(super) fn new(spec: SeqSpec, tx: Sink, arrival: Instant, queued_at: Instant) -> Seq {
        Seq {
            spec,
            tx,
            arrival,
            queued_at,
            cached: 0,
            transferred: 0,
            host_hit: 0,
            loading: 0,
            computed: 0,
            prefill_remaining: 0,
            generated: 0,
            pinned: 0,
            written: 0,
            alloc: 0,
            xfer_left: 0.0,
            ready_at: arrival,
            last_token: None,
            sched_prefill: 0,
            sched_decode: false,
            fresh: false,
            eligible: queued_at,
            aborted: false,
            started: false,
        }
    }

    /// Blocks held outside the shared cache: the partial last block, prompt blocks not yet full or
    /// cached, and generated tokens.
    pub(super) fn private_blocks(&self, cfg: &SimConfig) -> usize {
        cfg.blocks_for(self.alloc).saturating_sub(self.pinned)
    }

    /// Pins (and so caches) every full prompt block whose KV now exists. Returns whether that
    /// computed any new one (their KV is then written through to the host tier, if the pod has
    /// one).
    pub(super) fn cover(&mut self, cache: &mut PrefixCache, block_size: usize) -> bool {
        let full = (self.computed / block_size).min(self.spec.block_hashes.len());
        self.reserve(cache, full);
        let computed_more = full > self.written;
        self.written = self.written.max(full);
        computed_more
    }

    /// Pins (and so caches) the first `blocks` prompt blocks when the step that computes them is
    /// scheduled, before it runs, as vLLM V1 does: `KVCacheManager.allocate_slots` caches a
    /// request's full blocks up to `num_computed_tokens + num_new_tokens` as it allocates them, so
    /// a request scheduled after it, in the same step or a later one, hits them instead of
    /// computing the same prefix again (both read it once the forward pass has written it).
    pub(super) fn reserve(&mut self, cache: &mut PrefixCache, blocks: usize) {
        let blocks = blocks.min(self.spec.block_hashes.len());
        for h in self
            .spec
            .block_hashes
            .get(self.pinned..blocks)
            .unwrap_or_default()
        {
            cache.pin(*h);
        }
        self.pinned = self.pinned.max(blocks);
    }

    /// The prompt blocks whose KV is computed on the GPU for this sequence, in chain order.
    pub(super) fn covered(&self) -> &[u64] {
        self.spec
            .block_hashes
            .get(..self.written)
            .unwrap_or_default()
    }

    /// Prompt tokens not computed here: local prefix-cache hits, KV pulled from a prefill pod and
    /// KV loaded from the host tier (vLLM reports them all as `cached_tokens`).
    pub(super) fn not_computed(&self) -> usize {
        self.cached + self.transferred + self.host_hit
    }

    /// Unpins in reverse, as vLLM frees blocks: the tail of a prefix becomes the least recently used
    /// and is evicted first, so a partly evicted prefix still hits on its head.
    pub(super) fn release(&self, cache: &mut PrefixCache) {
        for h in self.spec.block_hashes.iter().take(self.pinned).rev() {
            cache.unpin(*h);
        }
    }

    pub(super) fn pull_done(&self) -> bool {
        self.xfer_left <= 0.0
    }

    /// Which link its KV transfer uses: the host tier's for a host load, else the pull link.
    pub(super) fn link(&self) -> Link {
        if self.loading > 0 {
            Link::Host
        } else {
            Link::Pull
        }
    }
}
