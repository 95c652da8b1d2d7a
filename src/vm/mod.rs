//! One VM: everything a worker's Wasm VM knows and does between requests — leader election, and in
//! the leader polling, discovery and publishing; in every VM, following what the leader publishes
//! and keeping this VM's rows on the work and fits boards. Written against the host port
//! (`crate::port::Host`), so the whole protocol runs natively in tests with several VMs sharing one
//! fake store (`tests.rs` beside this file).
//!
//! One tick: **elect** (renew or take the lease by compare-and-swap) → **lead** (drain the
//! observation queue into the index, publish delta pages and snapshots, dispatch due polls and the
//! admin-API read, publish the load table when it changed, set the gauges) → **follow** (send what
//! was kept while no leader existed, adopt a new load table, expire unseen prefills, rewrite this
//! VM's work row when due, exchange fits, apply new pages).
//!
//! Files: `election` (the lease), `lead` (the leader's step and its calls' answers), `leader`
//! (polling and discovery state), `discovery` (the admin API's members), `prefix_sync` (the
//! prefix index across VMs: observations in, pages out), `boards` (this VM's rows on the work and
//! fits boards).

mod boards;
pub mod discovery;
mod election;
mod lead;
pub mod leader;
mod prefix_sync;

use crate::config::Config;
use crate::cost::fit_board::FitBoard;
use crate::health::{health_of, Health, Tally, Verdict};
use crate::metrics::{self, Counter, Gauge};
use crate::peers;
use crate::pod::load::{LoadTable, PodLoad};
use crate::pod::prom::GatewayShare;
use crate::port::{Host, HttpCall};
use crate::router::{Router, Tokenizer};
use crate::state::lease::{self, Lease};
use crate::state::messages::{Message, Observation, Page};
use crate::state::{get_u64, set_u64};
use crate::state::{
    page_key, EPOCH_KEY, FITS_KEY, INFLIGHT_KEY, LEASE_KEY, LOAD_KEY, PAGE_HEAD_KEY, PAGE_RING,
    QUEUE_ID_KEY, QUEUE_NAME, SNAPSHOT_EVERY_PAGES, SNAPSHOT_KEY,
};
use crate::vm::leader::{Leader, PollResult};
use crate::work::{Board, PodWork};
use hashbrown::HashMap;

/// Queue messages the leader handles per tick at most, so one tick never stalls its worker.
const MAX_DRAIN_PER_TICK: usize = 20_000;
/// Observations per delta page: bounds one shared-data value (~ 8 bytes a block).
const MAX_PAGE_BYTES: usize = 512 * 1024;
/// Pages a request applies at most before routing; the rest wait for the next request or tick.
const MAX_PAGES_PER_SYNC: u64 = 8;
/// Observations kept while no leader has registered the queue (start-up only).
const MAX_UNSENT: usize = 256;
/// A VM rewrites its in-flight row at least this often, so readers can tell it is alive.
const INFLIGHT_HEARTBEAT_MS: u64 = 1000;
/// Rows not rewritten for this long belong to a VM that is gone; its requests stop counting.
pub(crate) const INFLIGHT_ROW_TTL_MS: u64 = 3 * INFLIGHT_HEARTBEAT_MS;
/// Compare-and-swap attempts per row write; a write that loses them all is retried on the next tick.
const INFLIGHT_CAS_ATTEMPTS: usize = 4;
/// A VM publishes its cost fits this often (they change slowly; read on every tick).
const FITS_HEARTBEAT_MS: u64 = 1000;
const FITS_ROW_TTL_MS: u64 = 10 * FITS_HEARTBEAT_MS;

/// Everything one VM knows; shared by its root and HTTP contexts (one thread per VM).
pub struct Vm {
    pub config: Config,
    pub router: Router,
    /// Built once per VM when the configuration asks for real tokens.
    pub tokenizer: Option<Box<dyn Tokenizer>>,
    id: u64,
    queue: Option<u32>,
    leader: Option<LeaderState>,
    load_cas: Option<u32>,
    last_row_write_ms: u64,
    /// The last row write lost every compare-and-swap; the next tick writes again.
    row_write_pending: bool,
    last_fits_write_ms: u64,
    fits_cas: Option<u32>,
    /// Observations made before any leader registered the queue.
    unsent: Vec<Vec<u8>>,
    /// How this VM's requests ended, per pod, since it last told the leader (`crate::health`).
    verdicts: HashMap<String, Tally>,
    /// Since when a prompt prefix has been fresh on a pod in the index, as this VM observed it:
    /// (the prefix's last block, the pod) → (ms, the pod's LRU touches then) (see
    /// [`Vm::observe_routing`]).
    recent_touches: HashMap<(u64, u64), (u64, u64)>,
    /// When this VM last split a request (P/D probes, `crate::pd::SplitClock`).
    pub split_clock: crate::pd::SplitClock,
}

/// What a routed prompt's pod was already known to hold, observed there within this long, is not
/// observed again: only the blocks after it are. Observing held blocks only refreshes their recency
/// in the index's LRU (here, in the leader and, through the pages, in every VM), which a second's
/// delay barely moves, and it is most of an observation's cost: a tenant's 16 KB system prompt
/// with a new question is 256 held blocks and one new one. In V8 observing was 37 µs of a 130 µs
/// decision for a 16 KB prompt (`make bench-phases`), paid again by every other VM replaying it.
const RETOUCH_AFTER_MS: u64 = 1000;
/// Bounds `recent_touches` (~40 KB): when full, the entries older than the interval go, then all
/// if that is not enough (the next observations are then just whole). Only prefixes routed again
/// within the interval need an entry: about the request rate of one worker over a second.
const MAX_RECENT_TOUCHES: usize = 1024;

/// One change to the index, as the leader publishes it.
enum Change {
    Observed(Observation),
    Forgotten(Observation),
    /// Another gateway replica's page (`peers`): published whole, as a page of its own.
    FromPeer(Page),
}

struct LeaderState {
    book: Leader,
    queue: u32,
    /// Polls under way: their pod, when they were sent and this gateway's requests on the pod then.
    polls: HashMap<u32, (String, u64, GatewayShare)>,
    /// `/v1/models` reads under way, by call token.
    model_polls: HashMap<u32, String>,
    admin_call: Option<u32>,
    /// Index changes drained from the queue, in arrival order, until they are published.
    pending: Vec<Change>,
    head: u64,
    snapshot_seq: u64,
    published_pods: Option<Vec<PodLoad>>,
    /// This Envoy's page numbering (`EPOCH_KEY`).
    epoch: u64,
    /// Where this leader stands with each other gateway replica's pages.
    pullers: peers::Pullers,
}

impl Vm {
    /// A VM with its identity (random, from the host: the lease holder id).
    pub fn new(config: Config, tokenizer: Option<Box<dyn Tokenizer>>, id: u64) -> Vm {
        Vm {
            config,
            router: Router::new(),
            tokenizer,
            // The top bit marks a gateway replica's row on the work board.
            id: id & !peers::REPLICA_ROW,
            queue: None,
            leader: None,
            load_cas: None,
            last_row_write_ms: 0,
            row_write_pending: false,
            last_fits_write_ms: 0,
            fits_cas: None,
            unsent: Vec::new(),
            verdicts: HashMap::new(),
            recent_touches: HashMap::new(),
            split_clock: crate::pd::SplitClock::default(),
        }
    }

    /// Records how a request ended for the pods involved (see `crate::health::judge`); the leader
    /// hears of it on the next tick.
    pub fn record_verdicts(&mut self, verdicts: Vec<(String, Verdict)>) {
        for (addr, verdict) in verdicts {
            self.verdicts.entry(addr).or_default().add(verdict);
        }
    }

    /// Learns from a first byte (see `crate::cost::Costs::learn`).
    pub fn learn(&mut self, first: &crate::router::FirstToken, observed_ms: f64) {
        self.router
            .costs
            .learn(&self.config.costs(), first, observed_ms);
    }

    /// Whether this VM holds the lease (polls and publishes).
    pub fn is_leader(&self) -> bool {
        self.leader.is_some()
    }

    /// This VM's identity (lease holder id; shown in the debug header).
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn tick(&mut self, host: &mut dyn Host, now: u64) {
        self.elect(host, now);
        if self.leader.is_some() {
            self.lead(host, now);
        }
        self.follow(host, now);
    }

    fn follow(&mut self, host: &mut dyn Host, now: u64) {
        if let Some(queue) = self.resolve_queue(host) {
            for message in self.unsent.drain(..) {
                host.queue_push(queue, &message);
            }
            if self.leader.is_none() && !self.verdicts.is_empty() {
                let pods = std::mem::take(&mut self.verdicts).into_iter().collect();
                let message = Message::Verdicts { vm: self.id, pods };
                host.queue_push(queue, &message.encode());
            }
        }
        self.refresh_load_table(host);
        let expired = self.router.work.expire_prefills(now);
        if expired
            || self.row_write_pending
            || now.saturating_sub(self.last_row_write_ms) >= INFLIGHT_HEARTBEAT_MS
        {
            self.write_inflight_row(host, now);
        }
        self.sync_fits(host, now);
        if self.leader.is_none() {
            self.sync_pages(host);
        }
    }

    /// Adopts the leader's load table if it changed since this VM last read it.
    pub fn refresh_load_table(&mut self, host: &mut dyn Host) {
        let (bytes, cas) = host.shared_get(LOAD_KEY);
        if cas != self.load_cas {
            if let Some(table) = bytes.and_then(|b| LoadTable::decode(&b)) {
                self.router.apply_load_table(&self.config, table);
                self.load_cas = cas;
            }
        }
    }

    fn timeout(&self) -> u64 {
        self.config.poll_timeout_ms
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
#[allow(clippy::too_many_lines)] // tests: the size limits are for production code
pub(crate) mod tests;

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
#[allow(clippy::too_many_lines)] // tests: the size limits are for production code
mod churn_tests;
