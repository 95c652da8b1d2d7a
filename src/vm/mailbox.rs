//! What this VM tells the leader through the shared queue — routings, withdrawals, evictions,
//! verdicts — and the prefix index's catch-up on what the leader published
//! (`crate::affinity::pages`).

use super::*;

impl Vm {
    /// Applies the delta pages the leader published since this VM last looked (not in the
    /// leader, whose index the pages come from).
    pub fn sync_pages(&mut self, host: &mut dyn Host) {
        if self.leader.is_none() {
            pages::catch_up(&mut self.router.affinity, host);
        }
    }

    /// Records a routing decision locally and tells the leader.
    pub fn observe(&mut self, host: &mut dyn Host, observation: Observation) {
        self.router.affinity.set_clock(host.now_ms());
        self.router.affinity.observe_routed(&observation);
        self.tell_leader(
            host,
            Message::Observation {
                vm: self.id,
                observation,
            },
        );
    }

    /// Observes a routed request whose pod was known to hold its first `held` blocks: only what
    /// the index needs to hear again ([`RecentTouches::observe_routing`]).
    pub fn observe_routing(
        &mut self,
        host: &mut dyn Host,
        observation: Observation,
        held: usize,
        now_ms: u64,
    ) {
        self.router.affinity.set_clock(now_ms);
        let (vm, queue, unsent) = (self.id, &mut self.queue, &mut self.unsent);
        self.recent_touches.observe_routing(
            &mut self.router.affinity,
            observation,
            held,
            now_ms,
            |observation| {
                tell(
                    host,
                    queue,
                    unsent,
                    Message::Observation { vm, observation },
                )
            },
        );
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
        tell(host, &mut self.queue, &mut self.unsent, message);
    }

    pub(super) fn resolve_queue(&mut self, host: &mut dyn Host) -> Option<u32> {
        resolve_queue(host, &mut self.queue)
    }
}

/// Sends `message` to the leader's queue, or keeps it while no leader has registered the queue
/// yet (start-up): the first tick that finds one sends it, so other VMs still learn what this VM
/// routed meanwhile.
fn tell(host: &mut dyn Host, queue: &mut Option<u32>, unsent: &mut Vec<Vec<u8>>, message: Message) {
    let message = message.encode();
    match resolve_queue(host, queue) {
        Some(queue) => {
            host.queue_push(queue, &message);
        }
        None if unsent.len() < MAX_UNSENT => unsent.push(message),
        None => {}
    }
}

/// The leader's queue, once a leader has registered it.
fn resolve_queue(host: &dyn Host, queue: &mut Option<u32>) -> Option<u32> {
    if queue.is_none() {
        *queue = host
            .shared_get(QUEUE_ID_KEY)
            .0
            .and_then(|b| Some(u32::from_le_bytes(b.get(..4)?.try_into().ok()?)));
    }
    *queue
}
