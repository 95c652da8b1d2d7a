//! Flow control's hooks on one request (`crate::admission`): it is held when every pod is full or
//! others for its model already wait, planned again each time the host releases it, and leaves the
//! queue when it is routed, answered, timed out or its client goes away.

use super::body_steps::Planned;
use super::{BodyOutcome, ErrorCode, Reply, RequestFlow};
use crate::admission::{band_label, Held};
use crate::metrics::{Counter, Histogram, BAND, REASON};
use crate::port::Host;
use crate::protocol::parse::{Endpoint, RequestView};
use crate::vm::Vm;
use crate::work::Board;

/// The work board as read before planning, with its compare-and-swap token (for the row written
/// when the request is committed).
type BoardRead = (Board, Option<u32>);

/// This request's place in flow control.
#[derive(Debug, Default)]
pub(super) struct HeldLeg {
    /// Its flow: who it is fair to (see [`flow_of`]).
    pub flow: u64,
    /// When it was held; `None` while it is not.
    pub since_ms: Option<u64>,
}

/// The request's flow: the fairness header's value, else its session, else the one shared flow.
pub(super) fn flow_of(
    vm: &Vm,
    header: &dyn Fn(&str) -> Option<String>,
    session: Option<u64>,
) -> u64 {
    let named = vm
        .config
        .flow_control
        .as_ref()
        .and_then(|f| f.fairness_header.as_ref())
        .and_then(|name| header(name.as_str()))
        .filter(|value| !value.is_empty());
    match named {
        Some(value) => xxhash_rust::xxh3::xxh3_64_with_seed(value.as_bytes(), 0xf10e),
        None => session.unwrap_or(0),
    }
}

/// What the host does next for one of its VM's held requests.
#[derive(Debug, Clone, PartialEq)]
pub enum Release {
    /// Plan it again (`RequestFlow::on_request_body` with its buffered body): it is routed, or
    /// stays held at the head of the queue (then the host stops releasing for now).
    Plan(u32),
    /// It was held `flow_control.ttl_ms`: answer it this.
    Expire(u32, Reply),
}

/// The next thing to do for this VM's held requests, in the queue's order (`crate::admission`):
/// first any past its TTL, then the next to release. `None` when nothing is held.
pub fn next_release(vm: &mut Vm, host: &mut dyn Host, now_ms: u64) -> Option<Release> {
    let flow_control = vm.config.flow_control.as_ref()?;
    if vm.held.is_empty() {
        return None;
    }
    let ttl_ms = flow_control.ttl_ms;
    let retry_after = flow_control.retry_after_s();
    if let Some(&id) = vm.held.expired(now_ms, ttl_ms).first() {
        vm.held.remove(id);
        host.count_in(Counter::FlowDropped, &[(REASON, "queue_timeout")], 1);
        let message = format!(
            "kvroute: every pod that serves this model stayed full for {ttl_ms} ms (flow_control.ttl_ms) while this request waited at the gateway; retry later"
        );
        let reply = Reply::error(ErrorCode::QueueTimeout, &message).retry_after(retry_after);
        return Some(Release::Expire(id, reply));
    }
    vm.held_row.next(&vm.held).map(|h| Release::Plan(h.id))
}

impl RequestFlow {
    /// Whether this request must queue behind others already held for its model: a newcomer does
    /// not pass the queue, even where a slot has just opened (the queue's head takes it).
    fn queue_ahead(&self, vm: &Vm, model: &str) -> bool {
        vm.config.flow_control.is_some()
            && self.held.since_ms.is_none()
            && (vm.held.holds_model(model)
                || vm.held_row.others().holds_model(model, self.hints.priority))
    }

    /// The other VMs' work read in and the request planned, unless flow control holds it: others
    /// for its model already wait, every pod that could serve it is full, or another worker's queue
    /// should take the room first. `Err`: what to answer the host (held, or refused).
    pub(super) fn plan_unless_held(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        (view, endpoint): (&RequestView, Endpoint),
        now: u64,
        decode_only: bool,
    ) -> Result<(Planned, BoardRead), Box<BodyOutcome>> {
        if self.queue_ahead(vm, &view.model) {
            return Err(Box::new(self.hold(vm, host, endpoint, &view.model, now)));
        }
        let board = vm.read_inflight_board(host, now);
        match self.plan_request(vm, host, view, now, decode_only) {
            Ok(planned) if !self.yields_to_other_workers(vm, now) => Ok((planned, board)),
            Err(outcome) if *outcome != BodyOutcome::Hold => Err(outcome),
            // Every pod full, or room that another worker's queue takes first.
            _ => Err(Box::new(self.hold(vm, host, endpoint, &view.model, now))),
        }
    }

    /// Whether this held request, which a pod has room for now, stays held a little longer so
    /// that another worker's queue takes the room first (`crate::admission::board`).
    fn yields_to_other_workers(&self, vm: &mut Vm, now_ms: u64) -> bool {
        let Vm { held, held_row, .. } = vm;
        held.get(self.context)
            .is_some_and(|candidate| held_row.yields(candidate, now_ms))
    }

    /// Holds the request (or keeps holding it, when planned again on release), or answers 429
    /// `queue_full` when this VM already holds `flow_control.max_held`.
    pub(super) fn hold(
        &mut self,
        vm: &mut Vm,
        host: &mut dyn Host,
        endpoint: Endpoint,
        model: &str,
        now_ms: u64,
    ) -> BodyOutcome {
        let Some(flow_control) = vm.config.flow_control.as_ref() else {
            return BodyOutcome::Continue;
        };
        if self.held.since_ms.is_some() {
            self.endpoint = Some(endpoint);
            return BodyOutcome::Hold;
        }
        let max_held = flow_control.max_held;
        let retry_after = flow_control.retry_after_s();
        let held = Held {
            id: self.context,
            model: model.to_string(),
            priority: self.hints.priority,
            flow: self.held.flow,
            since_ms: now_ms,
        };
        if vm.held.hold(held, max_held).is_err() {
            host.count_in(Counter::FlowDropped, &[(REASON, "queue_full")], 1);
            let message = format!(
                "kvroute: every pod that serves this model is full and {max_held} requests already wait at this gateway worker (flow_control.max_held); retry later"
            );
            return BodyOutcome::Reply(
                Reply::error(ErrorCode::QueueFull, &message).retry_after(retry_after),
            );
        }
        host.count(Counter::FlowHeld, 1);
        self.held.since_ms = Some(now_ms);
        self.endpoint = Some(endpoint);
        BodyOutcome::Hold
    }

    /// The request was held and is on its way now (routed, answered or passed on): out of the
    /// queue, its wait recorded.
    pub(super) fn leave_queue(&mut self, vm: &mut Vm, host: &mut dyn Host, now_ms: u64) {
        let Some(since) = self.held.since_ms.take() else {
            return;
        };
        if let Some(held) = vm.held.remove(self.context) {
            vm.held_row.served(held.flow, now_ms);
            host.count(Counter::FlowReleased, 1);
            let band = [(BAND, band_label(held.priority))];
            host.histogram_in(Histogram::FlowWaitMs, &band, now_ms.saturating_sub(since));
        }
    }

    /// The stream ended (the client went away) while the request was still held.
    pub(super) fn abandon_queue(&mut self, vm: &mut Vm, host: &mut dyn Host) {
        if self.held.since_ms.take().is_some() && vm.held.remove(self.context).is_some() {
            host.count_in(Counter::FlowDropped, &[(REASON, "disconnected")], 1);
        }
    }
}
