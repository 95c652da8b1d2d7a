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
//! Each concern owns its step on shared data; the tick calls them: the prefix index's pages
//! (`crate::affinity::pages`: the leader's [`Publisher`], a follower's `catch_up`), this VM's row on
//! the work board (`crate::work::WorkRow`) and on the fits board (`crate::cost::fit_board::FitsRow`).
//!
//! Files: `election` (the lease), `lead` (the leader's step and its calls' answers), `leader`
//! (polling and discovery state), `discovery` (the admin API's members), `mailbox` (what this VM
//! tells the leader through the shared queue).

pub mod discovery;
mod election;
mod lead;
pub mod leader;
mod mailbox;

use crate::affinity::pages::{self, Change, Publisher, RecentTouches};
use crate::config::Config;
use crate::cost::fit_board::FitsRow;
use crate::health::{health_of, Health, Tally, Verdict};
use crate::metrics::{self, Counter, Gauge};
use crate::peers;
use crate::pod::load::{LoadTable, PodLoad};
use crate::pod::prom::GatewayShare;
use crate::port::{Host, HttpCall};
use crate::router::{Router, Tokenizer};
use crate::state::lease::{self, Lease};
use crate::state::messages::{Message, Observation};
use crate::state::{get_u64, set_u64};
use crate::state::{EPOCH_KEY, LEASE_KEY, LOAD_KEY, PAGE_HEAD_KEY, QUEUE_ID_KEY, QUEUE_NAME};
use crate::vm::leader::{Leader, PollResult};
use crate::work::{Board, WorkRow};
use hashbrown::HashMap;

/// Queue messages the leader handles per tick at most, so one tick never stalls its worker.
const MAX_DRAIN_PER_TICK: usize = 20_000;
/// Observations kept while no leader has registered the queue (start-up only).
const MAX_UNSENT: usize = 256;

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
    work_row: WorkRow,
    fits_row: FitsRow,
    /// Observations made before any leader registered the queue.
    unsent: Vec<Vec<u8>>,
    /// How this VM's requests ended, per pod, since it last told the leader (`crate::health`).
    verdicts: HashMap<String, Tally>,
    /// What this VM observed lately, to tell the index only what it needs to hear again.
    recent_touches: RecentTouches,
    /// When this VM last split a request (P/D probes, `crate::pd::SplitClock`).
    pub split_clock: crate::pd::SplitClock,
    /// Requests this VM holds while every pod is full (`crate::admission`).
    pub held: crate::admission::HeldQueue,
    /// This VM's part in the whole Envoy's queue (`crate::admission::board`).
    pub held_row: crate::admission::board::HeldRow,
}

struct LeaderState {
    book: Leader,
    queue: u32,
    /// Polls under way: their pod, when they were sent and this gateway's requests on the pod then.
    polls: HashMap<u32, (String, u64, GatewayShare)>,
    /// `/v1/models` reads under way, by call token.
    model_polls: HashMap<u32, String>,
    admin_call: Option<u32>,
    /// The index's pages: changes drained from the queue, until they are published.
    pages: Publisher,
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
            work_row: WorkRow::default(),
            fits_row: FitsRow::default(),
            unsent: Vec::new(),
            verdicts: HashMap::new(),
            recent_touches: RecentTouches::default(),
            split_clock: crate::pd::SplitClock::default(),
            held: crate::admission::HeldQueue::default(),
            held_row: crate::admission::board::HeldRow::default(),
        }
    }

    /// Records how a request ended for the pods involved (see `crate::health::judge`); the leader
    /// hears of it on the next tick.
    pub fn record_verdicts(&mut self, verdicts: Vec<(String, Verdict)>) {
        for (addr, verdict) in verdicts {
            self.verdicts.entry(addr).or_default().add(verdict);
        }
    }

    /// Learns from a first byte (see `crate::cost::Costs::learn`). The cost fit models the
    /// tokens' work: a load priced beside it is taken off first, both the prediction and the
    /// observation. A warm tier's load is configured (`crate::affinity::tiers`); an adapter's is
    /// learned here, from what the first byte took beyond its tokens (`crate::adapters`).
    pub fn learn(&mut self, first: &crate::router::FirstToken, observed_ms: f64) {
        if first.adapter_load_ms <= 0.0 && first.warm_load_ms <= 0.0 {
            let settings = self.config.costs();
            self.router.costs.learn(&settings, first, observed_ms);
            return;
        }
        let mut predicted_ms = first.predicted_ms - first.warm_load_ms.max(0.0);
        let mut observed_ms = observed_ms - first.warm_load_ms.max(0.0);
        if first.adapter_load_ms > 0.0 {
            predicted_ms -= first.adapter_load_ms;
            let adapters = &mut self.router.adapters;
            adapters.learn(&self.config.adapters, predicted_ms, observed_ms);
            observed_ms -= adapters.load_ms(&self.config.adapters);
        }
        let tokens_only = crate::router::FirstToken {
            predicted_ms,
            adapter_load_ms: 0.0,
            warm_load_ms: 0.0,
            ..first.clone()
        };
        let settings = self.config.costs();
        self.router
            .costs
            .learn(&settings, &tokens_only, observed_ms.max(0.0));
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
        if self.config.flow_control.is_some() {
            let leader = self.leader.is_some();
            self.held_row.follow(&self.held, host, self.id, now, leader);
        }
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
        self.work_row
            .follow(&mut self.router.work, host, self.id, now);
        self.fits_row
            .follow(&mut self.router.costs, host, self.id, now);
        self.sync_pages(host);
    }

    /// Reads the work board and adopts the other VMs' unfinished work ([`WorkRow::read`]).
    pub fn read_inflight_board(&mut self, host: &mut dyn Host, now: u64) -> (Board, Option<u32>) {
        self.work_row
            .read(&mut self.router.work, host, self.id, now)
    }

    /// Rewrites this VM's row on the work board ([`WorkRow::write`]).
    pub fn write_inflight_row(&mut self, host: &mut dyn Host, now: u64) {
        self.write_inflight_row_over(host, now, None);
    }

    /// [`Self::write_inflight_row`], its first compare-and-swap on a board this VM read earlier in
    /// the same callback ([`Self::read_inflight_board`]).
    pub fn write_inflight_row_over(
        &mut self,
        host: &mut dyn Host,
        now: u64,
        read: Option<(Board, Option<u32>)>,
    ) {
        self.work_row
            .write(&mut self.router.work, host, self.id, now, read);
    }

    /// Adopts the leader's load table if it changed since this VM last read it, and tells every
    /// VM what it routed to a pod the table shows restarted after the new process started.
    pub fn refresh_load_table(&mut self, host: &mut dyn Host) {
        let (bytes, cas) = host.shared_get(LOAD_KEY);
        if cas != self.load_cas {
            if let Some(table) = bytes.and_then(|b| LoadTable::decode(&b)) {
                let held_again = self.router.apply_load_table(&self.config, table);
                self.load_cas = cas;
                for observation in held_again {
                    self.tell_leader(
                        host,
                        Message::Observation {
                            vm: self.id,
                            observation,
                        },
                    );
                }
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
