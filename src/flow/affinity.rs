//! Prefix affinity's part of one request, every hook in one place: what the index learns when the
//! request is routed (provisionally, until the pod accepts it), where it moves when a retry took
//! the request elsewhere, and the check of the index against the `usage` the response reports.
//! The index itself and its pages are `crate::affinity`; what the VM tells the leader is
//! `crate::vm` (`mailbox.rs`).

use crate::metrics::{self, Counter};
use crate::port::Host;
use crate::router::{Blocks, CacheExpectation, CacheVerdict};
use crate::scheduler::Choice;
use crate::state::messages::Observation;
use crate::vm::Vm;

use super::RouteLabels;

/// Bytes of a response chunk kept for the next one, so a `usage` object split across two is read.
const CARRY_BYTES: usize = 256;

/// What one request holds for prefix affinity between the host's callbacks.
#[derive(Debug, Default)]
pub(super) struct AffinityLeg {
    /// What the index expects the response's `usage` to report, until it does.
    cache_check: Option<CacheExpectation>,
    /// The end of the last response chunk, so a `usage` object split across two is read.
    carry: Vec<u8>,
    /// What this request taught the index, until the pod accepts it.
    provisional: Provisional,
    /// The request's block hashes, until the upstream that answers is known (Envoy's retries may
    /// have taken it to a fallback).
    hashes: Vec<u64>,
}

/// How a routed request goes out, as far as prefix affinity cares.
#[derive(Debug, Clone, Copy)]
pub(super) struct RouteShape {
    /// A prefill pod computes the prompt (P/D).
    pub split: bool,
    /// The response will carry `usage` (`RequestView::stream_usage`): only then is it read.
    pub usage_in_response: bool,
    /// Envoy may retry on a fallback pod.
    pub has_fallbacks: bool,
}

impl AffinityLeg {
    /// The request was routed to `primary`: what the index expects its `usage` to report (taken
    /// before the routing is observed; not for a split request, whose decode pod reports the
    /// pulled KV as cached too, nor for a response without `usage`), then the
    /// index learns the blocks on `primary`, provisionally. The hashes are kept while a fallback
    /// may serve it instead.
    pub(super) fn on_routed(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        (primary, blocks): (&Choice, &Blocks),
        shape: RouteShape,
        now: u64,
    ) {
        if !shape.split && shape.usage_in_response {
            let affinity = &vm.router.affinity;
            self.cache_check = affinity.expect_cache(&primary.addr, blocks, primary.matched_blocks);
        }
        let observation = Observation {
            addr: primary.addr.clone(),
            hashes: blocks.hashes.clone(),
        };
        vm.observe_routing(host, observation, primary.matched_blocks, now);
        self.provisional
            .add(&primary.addr, &blocks.hashes, primary.matched_blocks);
        if !shape.split && shape.has_fallbacks {
            self.hashes.clone_from(&blocks.hashes);
        }
    }

    /// A split's prefill pod computes the same blocks: its index learns them too.
    pub(super) fn on_split(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        prefill_addr: &str,
        blocks: Blocks,
        prefill_held: usize,
    ) {
        self.provisional
            .add(prefill_addr, &blocks.hashes, prefill_held);
        let observation = Observation {
            addr: prefill_addr.to_string(),
            hashes: blocks.hashes,
        };
        vm.observe(host, observation);
    }

    /// Envoy sent the request to `upstream`, not `primary` (a retry took it to a fallback): what
    /// it taught the index moves to `upstream`, and its `usage` says nothing of the primary.
    /// Returns whether it moved.
    pub(super) fn on_upstream(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        primary: &str,
        upstream: &str,
    ) -> bool {
        let hashes = std::mem::take(&mut self.hashes);
        if upstream == primary || hashes.is_empty() {
            return false;
        }
        self.provisional.withdraw(vm, host, Some(primary));
        self.cache_check = None;
        let affinity = &vm.router.affinity;
        if affinity.slot_of(upstream).is_none() {
            return true;
        }
        let held = affinity.matched_of(&affinity.match_lengths(&hashes), upstream);
        self.provisional.add(upstream, &hashes, held);
        vm.observe(
            host,
            Observation {
                addr: upstream.to_string(),
                hashes,
            },
        );
        true
    }

    /// The response's status: a 2xx makes what the index learned final; anything else withdraws
    /// it.
    pub(super) fn on_response_headers(&mut self, vm: &mut Vm, host: &mut dyn Host, ok: bool) {
        if ok {
            self.provisional.confirm();
        } else {
            self.provisional.withdraw(vm, host, None);
        }
    }

    /// The pod the request was split to (`None`: every pod) holds nothing of it after all.
    pub(super) fn withdraw(&mut self, vm: &mut Vm, host: &mut dyn Host, addr: Option<&str>) {
        self.provisional.withdraw(vm, host, addr);
    }

    /// Whether response bytes are still wanted (the `usage` not read yet).
    pub(super) fn wants_response_bytes(&self) -> bool {
        self.cache_check.is_some()
    }

    /// Looks for the response's `usage` in this chunk (and the end of the last one); once found,
    /// checks the index's expectation against it and tells every VM what the pod lost.
    pub(super) fn on_response_body(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        chunk: &[u8],
        labels: &RouteLabels,
    ) {
        if self.cache_check.is_none() {
            return;
        }
        self.carry.extend_from_slice(chunk);
        let Some((cached, prompt)) = crate::protocol::usage::cache_report(&self.carry) else {
            let keep = self.carry.len().saturating_sub(CARRY_BYTES);
            self.carry.drain(..keep);
            return;
        };
        self.carry = Vec::new();
        let Some(expected) = self.cache_check.take() else {
            return;
        };
        if !crate::protocol::usage::plausible(cached, prompt) {
            let pod = expected.addr.as_str();
            log::debug!(
                "kvroute: {pod} reported {cached} of {prompt} tokens cached: impossible, ignored"
            );
            let labels = [
                (metrics::POOL, labels.pool.as_str()),
                (metrics::ROLE, labels.role),
                (metrics::POD, pod),
            ];
            host.count_in(Counter::PodReportedImplausible, &labels, 1);
            return;
        }
        let share = expected.matched_blocks as f64 / expected.total_blocks.max(1) as f64;
        let labels = labels.pairs();
        host.count_in(
            Counter::CachePredictedTokens,
            &labels,
            (share.min(1.0) * prompt as f64) as u64,
        );
        host.count_in(Counter::CacheReportedTokens, &labels, cached);
        if let CacheVerdict::Evicted { kept, lost } = vm
            .router
            .affinity
            .on_cache_report(&expected, cached, prompt)
        {
            log::debug!(
                "kvroute: {} reported {cached} of {prompt} tokens cached, the index expected more; it keeps about {kept} blocks",
                expected.addr
            );
            host.count(Counter::CacheEvictionsDetected, 1);
            vm.report_eviction(host, expected.addr.clone(), lost);
        }
    }
}

/// Blocks a request taught the index about a pod before the pod accepted it: the blocks past the
/// leading run the index already believed the pod held (those were there before this request and
/// stay). Withdrawn if the answer is not a 2xx; a request with the same prefix routed in between
/// loses them too, until the next observation (the window is one pod's time to refuse).
#[derive(Debug, Clone, Default, PartialEq)]
struct Provisional {
    learned: Vec<Observation>,
}

impl Provisional {
    fn add(&mut self, addr: &str, hashes: &[u64], already_held: usize) {
        let added = hashes.get(already_held..).unwrap_or_default();
        if !added.is_empty() {
            self.learned.push(Observation {
                addr: addr.to_string(),
                hashes: added.to_vec(),
            });
        }
    }

    /// The pod answered 2xx: the observations are final.
    fn confirm(&mut self) {
        self.learned.clear();
    }

    /// Withdraws what was learned about `addr` (every pod with `None`).
    fn withdraw(&mut self, vm: &mut Vm, host: &mut dyn Host, addr: Option<&str>) {
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
