//! The prefix index across the VMs of one Envoy: every VM sends what it learned (routings,
//! withdrawals, evictions) to the leader through the shared queue; the leader folds it into its
//! index and publishes it as numbered delta pages in a ring of shared-data keys, with a snapshot
//! every `SNAPSHOT_EVERY_PAGES`; every other VM catches up on them before routing and at its tick.
//!
//! * [`catch_up`] — a follower's step: apply the pages published since it last looked, or the
//!   snapshot when it fell a ring behind;
//! * [`Publisher`] — the leader's step: the drained changes as pages, in their order;
//! * [`RecentTouches`] — what a routed request needs to tell the index at all (most of a repeated
//!   prompt only refreshes recency, which a second's delay barely moves).

use super::Affinity;
use crate::port::Host;
use crate::state::messages::{Observation, Page};
use crate::state::{get_u64, page_key, set_u64, PAGE_HEAD_KEY, PAGE_RING};
use crate::state::{SNAPSHOT_EVERY_PAGES, SNAPSHOT_KEY};
use hashbrown::HashMap;

/// Observations per delta page: bounds one shared-data value (~ 8 bytes a block).
pub const MAX_PAGE_BYTES: usize = 512 * 1024;
/// Pages a request applies at most before routing; the rest wait for the next request or tick.
const MAX_PAGES_PER_SYNC: u64 = 8;

/// Applies the delta pages the leader published since this VM last looked: one shared-data read
/// when nothing is new. Not for the leader, whose index is the source of the pages.
pub fn catch_up(affinity: &mut Affinity, host: &dyn Host) {
    let Some(head) = get_u64(host, PAGE_HEAD_KEY) else {
        return;
    };
    if head <= affinity.applied_page {
        return;
    }
    if head - affinity.applied_page >= PAGE_RING - 1 {
        load_snapshot(affinity, host, head);
    }
    let from = affinity.applied_page + 1;
    for seq in from..=head.min(from + MAX_PAGES_PER_SYNC - 1) {
        let page = host
            .shared_get(&page_key(seq))
            .0
            .and_then(|b| Page::decode(&b));
        match page {
            Some(p) if p.seq == seq => affinity.apply_page(&p),
            // Overwritten while we read (we are a full ring behind): start from the snapshot.
            _ => {
                load_snapshot(affinity, host, head);
                return;
            }
        }
    }
}

fn load_snapshot(affinity: &mut Affinity, host: &dyn Host, head: u64) {
    match host
        .shared_get(SNAPSHOT_KEY)
        .0
        .and_then(|b| Page::decode(&b))
    {
        Some(snapshot) if snapshot.seq + PAGE_RING > head => affinity.load_snapshot(&snapshot),
        // No usable snapshot yet: skip ahead and let new observations rebuild the view.
        _ => affinity.applied_page = head.saturating_sub(1),
    }
}

/// One change to the index, as the leader publishes it.
pub enum Change {
    Observed(Observation),
    Forgotten(Observation),
    /// Another gateway replica's page (`crate::peers`): published whole, as a page of its own.
    FromPeer(Page),
}

/// The leader's pages: the changes drained from the queue, until they are published, and where
/// the page numbering stands.
pub struct Publisher {
    pending: Vec<Change>,
    head: u64,
    snapshot_seq: u64,
}

impl Publisher {
    /// A new leader's publisher, numbering on from `head` (the last page published by anyone).
    pub fn new(head: u64) -> Publisher {
        Publisher {
            pending: Vec::new(),
            head,
            snapshot_seq: 0,
        }
    }

    /// A change the leader applied to its own index, to publish at the end of the tick.
    pub fn push(&mut self, change: Change) {
        self.pending.push(change);
    }

    /// Publishes the drained changes as delta pages, in their order: a page applies its
    /// observations before its evictions, so an observation that follows an eviction (a block
    /// withdrawn, then learned again) starts a new page.
    pub fn publish(&mut self, affinity: &mut Affinity, host: &mut dyn Host) {
        let mut page = Page::default();
        let mut bytes = 0;
        for change in std::mem::take(&mut self.pending) {
            let (change, observed) = match change {
                Change::FromPeer(peer_page) => {
                    if !page.observations.is_empty() || !page.evictions.is_empty() {
                        self.put_page(host, std::mem::take(&mut page));
                        bytes = 0;
                    }
                    self.put_page(host, peer_page);
                    continue;
                }
                Change::Observed(o) => (o, true),
                Change::Forgotten(e) => (e, false),
            };
            let full = bytes >= MAX_PAGE_BYTES;
            if full || (observed && !page.evictions.is_empty()) {
                self.put_page(host, std::mem::take(&mut page));
                bytes = 0;
            }
            bytes += change.hashes.len() * 8 + change.addr.len() + 8;
            if observed {
                page.observations.push(change);
            } else {
                page.evictions.push(change);
            }
        }
        if !page.observations.is_empty() || !page.evictions.is_empty() {
            self.put_page(host, page);
        }
        affinity.applied_page = self.head;
        if self.head >= self.snapshot_seq + SNAPSHOT_EVERY_PAGES
            || (self.snapshot_seq == 0 && self.head > 0)
        {
            let _ = host.shared_set(SNAPSHOT_KEY, &affinity.snapshot(self.head).encode(), None);
            self.snapshot_seq = self.head;
        }
    }

    fn put_page(&mut self, host: &mut dyn Host, mut page: Page) {
        self.head += 1;
        page.seq = self.head;
        // Page before head: a reader that sees the new head finds its page.
        let _ = host.shared_set(&page_key(self.head), &page.encode(), None);
        set_u64(host, PAGE_HEAD_KEY, self.head);
    }
}

/// What a routed prompt's pod was already known to hold, observed there within this long, is not
/// observed again: only the blocks after it are. Observing held blocks only refreshes their recency
/// in the index's LRU (here, in the leader and, through the pages, in every VM), which a second's
/// delay barely moves, and it is most of an observation's cost: a tenant's 16 KB system prompt
/// with a new question is 256 held blocks and one new one. In V8 observing was 37 µs of a 130 µs
/// decision for a 16 KB prompt (`make bench-phases`), paid again by every other VM replaying it.
const RETOUCH_AFTER_MS: u64 = 1000;
/// Bounds the touches kept (~40 KB): when full, the entries older than the interval go, then all
/// if that is not enough (the next observations are then just whole). Only prefixes routed again
/// within the interval need an entry: about the request rate of one worker over a second.
const MAX_RECENT_TOUCHES: usize = 1024;

/// Since when a prompt prefix has been fresh on a pod in the index, as this VM observed it:
/// (the prefix's last block, the pod) → (ms, the pod's LRU touches then).
#[derive(Debug, Default)]
pub struct RecentTouches(HashMap<(u64, u64), (u64, u64)>);

impl RecentTouches {
    /// Observes a routed request whose pod was known to hold its first `held` blocks, in this
    /// VM's index and through `tell` (to the leader). Where this VM observed that prefix on the same
    /// pod less than `RETOUCH_AFTER_MS` ago, and the pod's LRU in the index has not turned over
    /// enough since to push it out, only the blocks after it are observed (nothing, for a prompt
    /// held whole).
    ///
    /// An observation from the start freshens the held prefix and the whole prompt now; one of the
    /// new blocks alone leaves the whole prompt as fresh as its prefix was, so the prefix is
    /// observed again a second after it last was, whatever is routed behind it.
    ///
    /// The turnover bound: an engine re-touches a prefix with every request that uses it, and
    /// frees a finished request's tail first; left untouched, the prefix here ages behind the new
    /// blocks routed after it and would be evicted from the index before them, the opposite of
    /// the engine. So the prefix is left untouched only while every block touched on the pod since
    /// it was, the new ones included, and the prefix itself fit the pod's capacity: then nothing of
    /// it can have been evicted. (A prefix nearly as large as the pod's cache is thus observed
    /// whole every time, as before.)
    pub fn observe_routing(
        &mut self,
        affinity: &mut Affinity,
        observation: Observation,
        held: usize,
        now_ms: u64,
        mut tell: impl FnMut(Observation),
    ) {
        let hashes = &observation.hashes;
        let Some(&last) = hashes.last() else {
            return;
        };
        let pod = xxhash_rust::xxh3::xxh3_64(observation.addr.as_bytes());
        let held = held.min(hashes.len());
        let new_blocks = (hashes.len() - held) as u64;
        let slot = affinity.slot_of(&observation.addr);
        let turnover = slot.and_then(|slot| affinity.index().turnover(slot));
        let prefix_fresh_since = held
            .checked_sub(1)
            .and_then(|i| hashes.get(i))
            .and_then(|end| self.0.get(&(*end, pod)).copied())
            .filter(|&(since_ms, touches_then)| {
                let within_capacity = turnover.is_some_and(|(capacity, touches)| {
                    touches.saturating_sub(touches_then) + new_blocks + held as u64
                        <= capacity as u64
                });
                now_ms.saturating_sub(since_ms) < RETOUCH_AFTER_MS && within_capacity
            });
        if self.0.len() >= MAX_RECENT_TOUCHES {
            self.0
                .retain(|_, (since_ms, _)| now_ms.saturating_sub(*since_ms) < RETOUCH_AFTER_MS);
            if self.0.len() >= MAX_RECENT_TOUCHES {
                self.0.clear();
            }
        }
        if let Some(fresh) = prefix_fresh_since {
            affinity.note_routing(&observation.addr, hashes.get(..held).unwrap_or_default());
            self.0.insert((last, pod), fresh);
            if let Some(new) = observation.hashes.get(held..).filter(|n| !n.is_empty()) {
                let new = Observation {
                    addr: observation.addr,
                    hashes: new.to_vec(),
                };
                affinity.observe_routed(&new);
                tell(new);
            }
            return;
        }
        let held_end = held.checked_sub(1).and_then(|i| hashes.get(i)).copied();
        affinity.observe_routed(&observation);
        tell(observation);
        let touches_now = slot
            .and_then(|slot| affinity.index().turnover(slot))
            .map_or(0, |(_, touches)| touches);
        self.0.insert((last, pod), (now_ms, touches_now));
        if let Some(end) = held_end {
            self.0.insert((end, pod), (now_ms, touches_now));
        }
    }
}
