//! The prefix index across VMs: every VM sends what it learned (routings, withdrawals,
//! evictions) to the leader; the leader folds it into the index and publishes it as delta pages
//! and snapshots; every VM catches up on them before routing.

use super::*;

impl Vm {
    /// Applies the delta pages the leader published since this VM last looked: one shared-data
    /// read when nothing is new.
    pub fn sync_pages(&mut self, host: &mut dyn Host) {
        let Some(head) = get_u64(host, PAGE_HEAD_KEY) else {
            return;
        };
        let applied = self.router.affinity.applied_page;
        if head <= applied || self.leader.is_some() {
            return;
        }
        if head - applied >= PAGE_RING - 1 {
            self.load_snapshot(host, head);
        }
        let from = self.router.affinity.applied_page + 1;
        for seq in from..=head.min(from + MAX_PAGES_PER_SYNC - 1) {
            let page = host
                .shared_get(&page_key(seq))
                .0
                .and_then(|b| Page::decode(&b));
            match page {
                Some(p) if p.seq == seq => self.router.affinity.apply_page(&p),
                // Overwritten while we read (we are a full ring behind): start from the snapshot.
                _ => {
                    self.load_snapshot(host, head);
                    return;
                }
            }
        }
    }

    pub(super) fn load_snapshot(&mut self, host: &mut dyn Host, head: u64) {
        match host
            .shared_get(SNAPSHOT_KEY)
            .0
            .and_then(|b| Page::decode(&b))
        {
            Some(snapshot) if snapshot.seq + PAGE_RING > head => {
                self.router.affinity.load_snapshot(&snapshot)
            }
            // No usable snapshot yet: skip ahead and let new observations rebuild the view.
            _ => self.router.affinity.applied_page = head.saturating_sub(1),
        }
    }

    /// Records a routing decision locally and tells the leader.
    pub fn observe(&mut self, host: &mut dyn Host, observation: Observation) {
        self.router.affinity.observe(&observation);
        self.tell_leader(
            host,
            Message::Observation {
                vm: self.id,
                observation,
            },
        );
    }

    /// [`Self::observe`] for a routed request whose pod was known to hold its first `held` blocks.
    /// Where this VM observed that prefix on the same pod less than `RETOUCH_AFTER_MS` ago, and
    /// the pod's LRU in the index has not turned over enough since to push it out, only the blocks
    /// after it are observed (nothing, for a prompt held whole).
    ///
    /// `recent_touches` keeps, per (block, pod), since when the prefix ending in that block has
    /// been fresh and the pod's LRU touch count then: an observation from the start freshens the
    /// held prefix and the whole prompt now; one of the new blocks alone leaves the whole prompt
    /// as fresh as its prefix was, so the prefix is observed again a second after it last was,
    /// whatever is routed behind it.
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
        host: &mut dyn Host,
        observation: Observation,
        held: usize,
        now_ms: u64,
    ) {
        let hashes = &observation.hashes;
        let Some(&last) = hashes.last() else {
            return;
        };
        let pod = xxhash_rust::xxh3::xxh3_64(observation.addr.as_bytes());
        let held = held.min(hashes.len());
        let new_blocks = (hashes.len() - held) as u64;
        let slot = self.router.affinity.slot_of(&observation.addr);
        let turnover = slot.and_then(|slot| self.router.affinity.index().turnover(slot));
        let prefix_fresh_since = held
            .checked_sub(1)
            .and_then(|i| hashes.get(i))
            .and_then(|end| self.recent_touches.get(&(*end, pod)).copied())
            .filter(|&(since_ms, touches_then)| {
                let within_capacity = turnover.is_some_and(|(capacity, touches)| {
                    touches.saturating_sub(touches_then) + new_blocks + held as u64
                        <= capacity as u64
                });
                now_ms.saturating_sub(since_ms) < RETOUCH_AFTER_MS && within_capacity
            });
        if self.recent_touches.len() >= MAX_RECENT_TOUCHES {
            self.recent_touches
                .retain(|_, (since_ms, _)| now_ms.saturating_sub(*since_ms) < RETOUCH_AFTER_MS);
            if self.recent_touches.len() >= MAX_RECENT_TOUCHES {
                self.recent_touches.clear();
            }
        }
        if let Some(fresh) = prefix_fresh_since {
            self.recent_touches.insert((last, pod), fresh);
            if let Some(new) = observation.hashes.get(held..).filter(|n| !n.is_empty()) {
                let hashes = new.to_vec();
                self.observe(
                    host,
                    Observation {
                        addr: observation.addr,
                        hashes,
                    },
                );
            }
            return;
        }
        let held_end = held.checked_sub(1).and_then(|i| hashes.get(i)).copied();
        self.observe(host, observation);
        let touches_now = slot
            .and_then(|slot| self.router.affinity.index().turnover(slot))
            .map_or(0, |(_, touches)| touches);
        self.recent_touches
            .insert((last, pod), (now_ms, touches_now));
        if let Some(end) = held_end {
            self.recent_touches
                .insert((end, pod), (now_ms, touches_now));
        }
    }

    /// Takes back what a routing decision taught (the pod refused the request): applied here at
    /// once, and in every VM through the leader's pages like an eviction, in order after the
    /// observation it undoes.
    pub fn withdraw(&mut self, host: &mut dyn Host, observation: Observation) {
        self.router.affinity.forget(&observation);
        self.tell_leader(
            host,
            Message::Eviction {
                vm: self.id,
                eviction: observation,
            },
        );
    }

    /// Tells the leader what a response showed a pod had lost (already applied here), for every
    /// VM's index.
    pub fn report_eviction(&mut self, host: &mut dyn Host, addr: String, lost: Vec<u64>) {
        self.tell_leader(
            host,
            Message::Eviction {
                vm: self.id,
                eviction: Observation { addr, hashes: lost },
            },
        );
    }

    pub(super) fn tell_leader(&mut self, host: &mut dyn Host, message: Message) {
        let message = message.encode();
        match self.resolve_queue(host) {
            Some(queue) => {
                host.queue_push(queue, &message);
            }
            // No leader has registered the queue yet: keep it for the first tick that finds one,
            // so other VMs still learn what this VM routed during start-up.
            None if self.unsent.len() < MAX_UNSENT => self.unsent.push(message),
            None => {}
        }
    }

    pub(super) fn resolve_queue(&mut self, host: &mut dyn Host) -> Option<u32> {
        if self.queue.is_none() {
            self.queue = host
                .shared_get(QUEUE_ID_KEY)
                .0
                .and_then(|b| Some(u32::from_le_bytes(b.get(..4)?.try_into().ok()?)));
        }
        self.queue
    }

    /// Publishes the drained changes as delta pages, in their order: a page applies its
    /// observations before its evictions, so an observation that follows an eviction (a block
    /// withdrawn, then learned again) starts a new page.
    pub(super) fn publish_pages(&mut self, host: &mut dyn Host, st: &mut LeaderState) {
        let mut page = Page::default();
        let mut bytes = 0;
        for change in std::mem::take(&mut st.pending) {
            let (change, observed) = match change {
                Change::FromPeer(peer_page) => {
                    if !page.observations.is_empty() || !page.evictions.is_empty() {
                        Self::put_page(host, st, std::mem::take(&mut page));
                        bytes = 0;
                    }
                    Self::put_page(host, st, peer_page);
                    continue;
                }
                Change::Observed(o) => (o, true),
                Change::Forgotten(e) => (e, false),
            };
            let full = bytes >= MAX_PAGE_BYTES;
            if full || (observed && !page.evictions.is_empty()) {
                Self::put_page(host, st, std::mem::take(&mut page));
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
            Self::put_page(host, st, page);
        }
        self.router.affinity.applied_page = st.head;
        if st.head >= st.snapshot_seq + SNAPSHOT_EVERY_PAGES
            || (st.snapshot_seq == 0 && st.head > 0)
        {
            let _ = host.shared_set(
                SNAPSHOT_KEY,
                &self.router.affinity.snapshot(st.head).encode(),
                None,
            );
            st.snapshot_seq = st.head;
        }
    }

    pub(super) fn put_page(host: &mut dyn Host, st: &mut LeaderState, mut page: Page) {
        st.head += 1;
        page.seq = st.head;
        // Page before head: a reader that sees the new head finds its page.
        let _ = host.shared_set(&page_key(st.head), &page.encode(), None);
        set_u64(host, PAGE_HEAD_KEY, st.head);
    }
}
