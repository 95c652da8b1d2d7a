//! What a request taught the index before its pod accepted it (see the module map in `super`).

use crate::metrics::Counter;
use crate::port::Host;
use crate::state::messages::Observation;
use crate::vm::Vm;

/// Blocks a request taught the index about a pod before the pod accepted it: the blocks past the
/// leading run the index already believed the pod held (those were there before this request and
/// stay). Withdrawn if the answer is not a 2xx; a request with the same prefix routed in between
/// loses them too, until the next observation (the window is one pod's time to refuse).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Provisional {
    learned: Vec<Observation>,
}

impl Provisional {
    pub(super) fn add(&mut self, addr: &str, hashes: &[u64], already_held: usize) {
        let added = hashes.get(already_held..).unwrap_or_default();
        if !added.is_empty() {
            self.learned.push(Observation {
                addr: addr.to_string(),
                hashes: added.to_vec(),
            });
        }
    }

    /// The pod answered 2xx: the observations are final.
    pub(super) fn confirm(&mut self) {
        self.learned.clear();
    }

    /// Withdraws what was learned about `addr` (every pod with `None`).
    pub(super) fn withdraw(&mut self, vm: &mut Vm, host: &mut dyn Host, addr: Option<&str>) {
        let (gone, kept) = std::mem::take(&mut self.learned)
            .into_iter()
            .partition(|o| addr.is_none_or(|a| o.addr == a));
        self.learned = kept;
        for observation in gone {
            host.count(Counter::ObservationsWithdrawn, 1);
            vm.withdraw(host, observation);
        }
    }
}
