//! The leader lease: renewed or taken by compare-and-swap on every tick; a VM that becomes the
//! leader starts from what the shared data holds.

use super::*;

impl Vm {
    pub(super) fn elect(&mut self, host: &mut dyn Host, now: u64) {
        let (mut bytes, mut cas) = host.shared_get(LEASE_KEY);
        if bytes.is_none() {
            // CAS does not guard a key's first insert: create an expired lease first (every VM
            // writes the same value), then claim it with a real compare-and-swap.
            let expired = Lease {
                holder: 0,
                expires_ms: 0,
            };
            let _ = host.shared_set(LEASE_KEY, &expired.encode(), None);
            (bytes, cas) = host.shared_get(LEASE_KEY);
        }
        let current = bytes.and_then(|b| Lease::decode(&b));
        let claim = lease::claim(
            current,
            self.id,
            now,
            self.config.leader_lease_ms,
            self.config.singleton,
        );
        let won = match claim {
            Some(l) => host.shared_set(LEASE_KEY, &l.encode(), cas).is_ok(),
            None => false,
        };
        if won && self.leader.is_none() {
            self.become_leader(host);
        } else if !won && self.leader.is_some() {
            log::info!("kvroute: VM {:x} is no longer the leader", self.id);
            self.leader = None;
        }
    }

    /// Whether the lease is still this VM's, read again at the time of the leader's writes.
    pub(super) fn still_leads(&self, host: &dyn Host) -> bool {
        let now = host.now_ms();
        host.shared_get(LEASE_KEY)
            .0
            .and_then(|b| Lease::decode(&b))
            .is_some_and(|l| l.holder == self.id && l.expires_ms > now)
    }

    pub(super) fn become_leader(&mut self, host: &mut dyn Host) {
        let Ok(queue) = host.queue_register(QUEUE_NAME).ok_or(()) else {
            log::warn!("kvroute: cannot register the observation queue; not leading");
            return;
        };
        let _ = host.shared_set(QUEUE_ID_KEY, &queue.to_le_bytes(), None);
        self.queue = Some(queue);
        // Catch up with what the previous leader published before taking over the sequence.
        self.sync_pages(host);
        let head = get_u64(host, PAGE_HEAD_KEY)
            .unwrap_or(0)
            .max(self.router.affinity.applied_page);
        self.router.affinity.applied_page = head;
        let epoch = match get_u64(host, EPOCH_KEY) {
            Some(epoch) => epoch,
            None => {
                // The first leader of this Envoy names its numbering; later ones continue it.
                let epoch = self.id.max(1);
                set_u64(host, EPOCH_KEY, epoch);
                epoch
            }
        };
        self.leader = Some(LeaderState {
            book: Leader::new(&self.config),
            queue,
            polls: HashMap::new(),
            model_polls: HashMap::new(),
            admin_call: None,
            pages: Publisher::new(head),
            published_pods: None,
            epoch,
            pullers: peers::Pullers::new(&self.config.peers),
        });
        host.count(Counter::LeaderChanges, 1);
        let kind = if self.config.singleton {
            "bootstrap singleton"
        } else {
            "elected by lease"
        };
        log::info!(
            "kvroute: VM {:x} is the leader ({kind}, page head {head})",
            self.id
        );
    }
}
