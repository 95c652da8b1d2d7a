//! The held board: what each worker VM holds and which flows it served lately, in one shared-data
//! key, so that flow control's order holds for the whole Envoy and not only within one worker
//! (each worker VM keeps its own held requests: only it can resume them).
//!
//! **Algorithm.**
//! * Each VM's row lists its held requests per (priority, model, flow) and the flows it released
//!   in the last [`SERVED_WINDOW_MS`], with when. The VM's tick reads the board and rewrites its row
//!   when that changed (so another worker sees a hold or a release within one tick, 10–20 ms with
//!   flow control on) and at least every [`HEARTBEAT_MS`] while the row is not empty.
//! * **Fairness across workers**: a flow's "last served" is the latest release of it by any VM.
//!   Within a band a VM releases the flow served longest ago ([`super::HeldQueue::next_by`]), and
//!   holds back while another VM holds, for the same model and band, a flow served longer ago than
//!   its own candidate, or an older request of the candidate's own flow (first in, first out within
//!   a flow): the capacity that frees goes to the tenant that waited longest for a turn, whichever
//!   worker took its connection.
//! * **Priority across workers**: a VM holds back its next request while another VM holds one for
//!   the same model at a higher priority.
//! * **Bounded**: holding back lasts at most [`YIELD_LIMIT_MS`] in a row (the other VM's head may be
//!   unable to go anywhere this VM's could: a session pin, an SLO), and rows not rewritten for
//!   [`ROW_TTL_MS`] are a VM gone. A newcomer also queues when another VM holds its model
//!   ([`Whole::holds_model`]), so no worker lets new requests pass the whole Envoy's queue.
//! * The leader reports the whole Envoy's queue per band from the board it reads on its tick, when
//!   that changed ([`HeldRow::follow`]).
//!
//! Costs one shared-data read per tick while flow control is on, a write only when a VM's row
//! changes, and nothing on the request path.
//!
//! Encoding: the format line `kvroute-held/1`, then one row per VM: `<vm id hex> <written ms>
//! w<priority>:<model hex>:<flow hex>:<count>:<oldest held ms> … s<flow hex>:<ms> …`. Models are
//! hashed (names may hold any byte). Values of another format decode as empty; unreadable entries
//! are skipped.

use super::{band_label, Held, HeldQueue, BANDS};
use crate::metrics::{Gauge, BAND};
use crate::port::Host;
use crate::state::rows::{Entry, RowBoard};
use crate::state::HELD_KEY;
use hashbrown::{HashMap, HashSet};

const FORMAT: &str = "kvroute-held/1";
/// A VM with a non-empty row rewrites it at least this often.
pub const HEARTBEAT_MS: u64 = 1000;
/// Rows not rewritten for this long belong to a VM that is gone.
pub const ROW_TTL_MS: u64 = 3 * HEARTBEAT_MS;
/// How long a flow's release counts as recent service (its place in the turn order).
pub const SERVED_WINDOW_MS: u64 = 10_000;
/// The longest a VM holds back a release that another VM's queue should have first.
pub const YIELD_LIMIT_MS: u64 = 200;
/// Entries per row of each kind: a row stays small under a flood of distinct flows (the highest
/// priorities and the latest releases are kept).
const ROW_ENTRIES: usize = 128;
const CAS_ATTEMPTS: usize = 4;

/// Requests one VM holds for one (priority, model, flow).
#[derive(Debug, Clone, PartialEq)]
pub struct Waiting {
    pub priority: i32,
    pub model: u64,
    pub flow: u64,
    pub count: u32,
    /// When the oldest of them was held (ms, the host's clock, one per process).
    pub oldest_ms: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum HeldEntry {
    Waiting(Waiting),
    /// The VM released a request of `flow` at `at_ms`.
    Served {
        flow: u64,
        at_ms: u64,
    },
}

impl Entry for HeldEntry {
    const FORMAT: &'static str = FORMAT;

    fn write(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = match self {
            HeldEntry::Waiting(w) => write!(
                out,
                "w{}:{:x}:{:x}:{}:{}",
                w.priority, w.model, w.flow, w.count, w.oldest_ms
            ),
            HeldEntry::Served { flow, at_ms } => write!(out, "s{flow:x}:{at_ms}"),
        };
    }

    fn parse(field: &str) -> Option<HeldEntry> {
        let hex = |t: &str| u64::from_str_radix(t, 16).ok();
        if let Some(rest) = field.strip_prefix('w') {
            let parts: Vec<&str> = rest.split(':').collect();
            let [priority, model, flow, count, oldest_ms] = parts.as_slice() else {
                return None;
            };
            return Some(HeldEntry::Waiting(Waiting {
                priority: priority.parse().ok()?,
                model: hex(model)?,
                flow: hex(flow)?,
                count: count.parse().ok()?,
                oldest_ms: oldest_ms.parse().ok()?,
            }));
        }
        let (flow, at_ms) = field.strip_prefix('s')?.split_once(':')?;
        Some(HeldEntry::Served {
            flow: hex(flow)?,
            at_ms: at_ms.parse().ok()?,
        })
    }
}

/// How a model is named on the board.
pub fn model_key(model: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(model.as_bytes())
}

/// What the other VMs hold and served, as this VM last read it.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Whole {
    waiting: Vec<Waiting>,
    served: HashMap<u64, u64>,
}

impl Whole {
    fn of_others(board: &RowBoard<HeldEntry>, vm: u64, now: u64) -> Whole {
        let mut whole = Whole::default();
        for entry in board.others(vm, now, ROW_TTL_MS) {
            match entry {
                HeldEntry::Waiting(w) => whole.waiting.push(w.clone()),
                HeldEntry::Served { flow, at_ms } => {
                    let last = whole.served.entry(*flow).or_default();
                    *last = (*last).max(*at_ms);
                }
            }
        }
        whole
    }

    /// Whether another VM holds a request for `model` at `priority` or higher.
    pub fn holds_model(&self, model: &str, priority: i32) -> bool {
        let model = model_key(model);
        self.waiting
            .iter()
            .any(|w| w.model == model && w.priority >= priority)
    }

    /// Whether another VM's queue should take free capacity before `candidate`: it holds the
    /// same model at a higher priority, or in the same band a flow served longer ago, or an older
    /// request of the same flow.
    fn defers(&self, candidate: &Held, last_served: impl Fn(u64) -> u64) -> bool {
        let model = model_key(&candidate.model);
        let mine = last_served(candidate.flow);
        self.waiting.iter().any(|w| {
            let same_band = w.priority == candidate.priority;
            w.model == model
                && (w.priority > candidate.priority
                    || (same_band && w.flow != candidate.flow && last_served(w.flow) < mine)
                    || (same_band && w.flow == candidate.flow && w.oldest_ms < candidate.since_ms))
        })
    }
}

/// This VM's part in the whole Envoy's queue: its row on the held board and what it read there.
#[derive(Debug, Default)]
pub struct HeldRow {
    /// Flows this VM released lately: when.
    served: HashMap<u64, u64>,
    /// The row as last written.
    written: Vec<HeldEntry>,
    /// The last write lost every compare-and-swap: the next tick writes again.
    pending: bool,
    last_write_ms: u64,
    /// The other VMs, as read on the last tick.
    others: Whole,
    /// Since when this VM has held back its next release for another VM's queue.
    yielding_since: Option<u64>,
    /// What this VM last set the per-band gauges to, as the leader.
    reported: Option<[(u64, u64); 3]>,
}

impl HeldRow {
    /// The other VMs' held requests and releases, as read on the last tick.
    pub fn others(&self) -> &Whole {
        &self.others
    }

    /// When `flow` was last served by any VM (0: not within [`SERVED_WINDOW_MS`]).
    pub fn last_served(&self, flow: u64) -> u64 {
        let own = self.served.get(&flow).copied().unwrap_or(0);
        own.max(self.others.served.get(&flow).copied().unwrap_or(0))
    }

    /// The next request to release from `queue`, in the whole Envoy's turn order.
    pub fn next<'q>(&self, queue: &'q HeldQueue) -> Option<&'q Held> {
        queue.next_by(|flow| self.last_served(flow))
    }

    /// Whether `candidate`, held, which a pod has room for now, stays held so that another VM's
    /// queue takes the room first; for at most [`YIELD_LIMIT_MS`] in a row (asked only when there
    /// is room, so the limit counts time the room waited).
    pub fn yields(&mut self, candidate: &Held, now: u64) -> bool {
        if !self.others.defers(candidate, |f| self.last_served(f)) {
            self.yielding_since = None;
            return false;
        }
        let since = *self.yielding_since.get_or_insert(now);
        now.saturating_sub(since) < YIELD_LIMIT_MS
    }

    /// A request of `flow` was released at `now`.
    pub fn served(&mut self, flow: u64, now: u64) {
        self.served.insert(flow, now);
        self.yielding_since = None;
    }

    /// The tick's step: reads the other VMs' rows, and rewrites this VM's when it changed, when
    /// the last write did not go through, or at the heartbeat while it is not empty. The `leader`
    /// also reports the whole Envoy's queue per band, as `kvroute.flow.held_requests{band}` and
    /// `kvroute.flow.waiting_flows{band}`, when it changed (gauges keep their value).
    pub fn follow(
        &mut self,
        queue: &HeldQueue,
        host: &mut dyn Host,
        vm: u64,
        now: u64,
        leader: bool,
    ) {
        self.served
            .retain(|_, at| now.saturating_sub(*at) < SERVED_WINDOW_MS);
        let entries = self.entries(queue);
        for _ in 0..CAS_ATTEMPTS {
            let (bytes, cas) = host.shared_get(HELD_KEY);
            let mut board = bytes
                .map(|b| RowBoard::<HeldEntry>::decode(&b))
                .unwrap_or_default();
            self.others = Whole::of_others(&board, vm, now);
            if leader {
                self.report(&board, host, now);
            }
            let due = self.pending
                || self.written != entries
                || (!entries.is_empty() && now.saturating_sub(self.last_write_ms) >= HEARTBEAT_MS);
            if !due {
                return;
            }
            board.put_row(vm, now, entries.clone(), ROW_TTL_MS);
            if host.shared_set(HELD_KEY, &board.encode(), cas).is_ok() {
                self.written = entries;
                self.last_write_ms = now;
                self.pending = false;
                return;
            }
        }
        self.pending = true;
    }

    fn report(&mut self, board: &RowBoard<HeldEntry>, host: &mut dyn Host, now: u64) {
        let totals = totals(board, now);
        if self.reported == Some(totals) {
            return;
        }
        for (band, (held, flows)) in BANDS.iter().zip(totals) {
            let labels = [(BAND, *band)];
            host.gauge_in(Gauge::FlowHeldRequests, &labels, held);
            host.gauge_in(Gauge::FlowWaitingFlows, &labels, flows);
        }
        self.reported = Some(totals);
    }

    fn entries(&self, queue: &HeldQueue) -> Vec<HeldEntry> {
        let mut served: Vec<(u64, u64)> = self.served.iter().map(|(f, at)| (*at, *f)).collect();
        served.sort_unstable_by(|a, b| b.cmp(a));
        served.truncate(ROW_ENTRIES);
        queue
            .summary(ROW_ENTRIES)
            .into_iter()
            .map(HeldEntry::Waiting)
            .chain(
                served
                    .into_iter()
                    .map(|(at_ms, flow)| HeldEntry::Served { flow, at_ms }),
            )
            .collect()
    }
}

/// The whole Envoy's held requests and waiting flows per band (every fresh row, this VM's own as
/// last written included), in the order of [`BANDS`].
fn totals(board: &RowBoard<HeldEntry>, now: u64) -> [(u64, u64); 3] {
    BANDS.map(|band| {
        let mut held = 0;
        let mut flows = HashSet::new();
        for entry in board.entries_where(now, ROW_TTL_MS, |_| true) {
            if let HeldEntry::Waiting(w) = entry {
                if band_label(w.priority) == band {
                    held += u64::from(w.count);
                    flows.insert(w.flow);
                }
            }
        }
        (held, flows.len() as u64)
    })
}
#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests;
