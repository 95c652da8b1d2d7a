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

pub mod discovery;
pub mod leader;

use crate::config::Config;
use crate::health::{health_of, Health, Tally, Verdict};
use crate::metrics::{self, Counter, Gauge};
use crate::peers;
use crate::pod::load::{LoadTable, PodLoad};
use crate::pod::prom::GatewayShare;
use crate::port::{Host, HttpCall};
use crate::router::{Router, Tokenizer};
use crate::scheduler::fit_board::FitBoard;
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
        }
    }

    /// Records how a request ended for the pods involved (see `crate::health::judge`); the leader
    /// hears of it on the next tick.
    pub fn record_verdicts(&mut self, verdicts: Vec<(String, Verdict)>) {
        for (addr, verdict) in verdicts {
            self.verdicts.entry(addr).or_default().add(verdict);
        }
    }

    /// Learns from a first byte (see `crate::router::Router::learn`).
    pub fn learn(&mut self, first: &crate::router::FirstToken, observed_ms: f64) {
        self.router.learn(&self.config, first, observed_ms);
    }

    /// Whether this VM holds the lease (polls and publishes).
    pub fn is_leader(&self) -> bool {
        self.leader.is_some()
    }

    /// This VM's identity (lease holder id; shown in the debug header).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Applies the delta pages the leader published since this VM last looked: one shared-data
    /// read when nothing is new.
    pub fn sync_pages(&mut self, host: &mut dyn Host) {
        let Some(head) = get_u64(host, PAGE_HEAD_KEY) else {
            return;
        };
        let applied = self.router.applied_page;
        if head <= applied || self.leader.is_some() {
            return;
        }
        if head - applied >= PAGE_RING - 1 {
            self.load_snapshot(host, head);
        }
        let from = self.router.applied_page + 1;
        for seq in from..=head.min(from + MAX_PAGES_PER_SYNC - 1) {
            let page = host
                .shared_get(&page_key(seq))
                .0
                .and_then(|b| Page::decode(&b));
            match page {
                Some(p) if p.seq == seq => self.router.apply_page(&p),
                // Overwritten while we read (we are a full ring behind): start from the snapshot.
                _ => {
                    self.load_snapshot(host, head);
                    return;
                }
            }
        }
    }

    fn load_snapshot(&mut self, host: &mut dyn Host, head: u64) {
        match host
            .shared_get(SNAPSHOT_KEY)
            .0
            .and_then(|b| Page::decode(&b))
        {
            Some(snapshot) if snapshot.seq + PAGE_RING > head => {
                self.router.load_snapshot(&snapshot)
            }
            // No usable snapshot yet: skip ahead and let new observations rebuild the view.
            _ => self.router.applied_page = head.saturating_sub(1),
        }
    }

    /// Records a routing decision locally and tells the leader.
    pub fn observe(&mut self, host: &mut dyn Host, observation: Observation) {
        self.router.observe(&observation);
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
        let slot = self.router.slot_of(&observation.addr);
        let turnover = slot.and_then(|slot| self.router.index().turnover(slot));
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
            .and_then(|slot| self.router.index().turnover(slot))
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
        self.router.forget(&observation);
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

    fn tell_leader(&mut self, host: &mut dyn Host, message: Message) {
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

    fn resolve_queue(&mut self, host: &mut dyn Host) -> Option<u32> {
        if self.queue.is_none() {
            self.queue = host
                .shared_get(QUEUE_ID_KEY)
                .0
                .and_then(|b| Some(u32::from_le_bytes(b.get(..4)?.try_into().ok()?)));
        }
        self.queue
    }

    pub fn tick(&mut self, host: &mut dyn Host, now: u64) {
        self.elect(host, now);
        if self.leader.is_some() {
            self.lead(host, now);
        }
        self.follow(host, now);
    }

    fn elect(&mut self, host: &mut dyn Host, now: u64) {
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
    fn still_leads(&self, host: &dyn Host) -> bool {
        let now = host.now_ms();
        host.shared_get(LEASE_KEY)
            .0
            .and_then(|b| Lease::decode(&b))
            .is_some_and(|l| l.holder == self.id && l.expires_ms > now)
    }

    fn become_leader(&mut self, host: &mut dyn Host) {
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
            .max(self.router.applied_page);
        self.router.applied_page = head;
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
            pending: Vec::new(),
            head,
            snapshot_seq: 0,
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

    #[allow(clippy::too_many_lines)] // tools/size_allowlist.txt
    fn lead(&mut self, host: &mut dyn Host, now: u64) {
        let Some(mut st) = self.leader.take() else {
            return;
        };
        for _ in 0..MAX_DRAIN_PER_TICK {
            let Some(bytes) = host.queue_pop(st.queue) else {
                break;
            };
            match Message::decode(&bytes) {
                Some(Message::Observation { observation, .. }) => {
                    self.router.observe(&observation);
                    st.pending.push(Change::Observed(observation));
                }
                Some(Message::Eviction { eviction, .. }) => {
                    self.router.forget(&eviction);
                    st.pending.push(Change::Forgotten(eviction));
                }
                Some(Message::Verdicts { pods, .. }) => {
                    for (addr, tally) in pods {
                        st.book.on_outcomes(&self.config, &addr, tally, now);
                    }
                }
                None => log::debug!("kvroute: dropped an undecodable queue message"),
            }
        }
        for (addr, tally) in std::mem::take(&mut self.verdicts) {
            st.book.on_outcomes(&self.config, &addr, tally, now);
        }
        if !self.still_leads(host) {
            // Paused between the election and here (a stopped worker thread) for longer than the
            // lease: another VM leads now, and this one's writes would overwrite its pages and table.
            log::info!(
                "kvroute: VM {:x} lost the lease mid-tick; not publishing",
                self.id
            );
            return;
        }
        let ejected = st.book.update_health(&self.config, now);
        host.count(Counter::Ejections, u64::from(ejected));
        self.publish_pages(host, &mut st);
        if st.book.discovery_due(&self.config, now) && st.admin_call.is_none() {
            if let Some(cluster) = &self.config.admin_cluster {
                st.admin_call = dispatch(
                    host,
                    cluster,
                    "/clusters?format=json",
                    "admin",
                    None,
                    None,
                    self.timeout(),
                );
            }
        }
        let polling: hashbrown::HashSet<String> =
            st.polls.values().map(|(a, _, _)| a.clone()).collect();
        let due = st.book.poll_due(&self.config, now);
        if !due.is_empty() {
            // Each poll is read against what this gateway had on the pod when it was sent (see
            // `GatewayShare`): the other VMs' rows as of now, one shared-data read per round.
            self.read_inflight_board(host, now);
        }
        for addr in due {
            if polling.contains(&addr) {
                // The previous poll of this pod has not answered yet: polls never pile up on a
                // slow pod; it is polled again once that one answers or times out.
                continue;
            }
            match dispatch(
                host,
                &self.config.poll_cluster,
                "/metrics",
                &addr,
                Some(&addr),
                self.config.pod_authorization.as_ref(),
                self.timeout(),
            ) {
                Some(token) => {
                    let work = self.router.work(&addr);
                    let ours = GatewayShare {
                        prefilling: f64::from(work.prefill_requests),
                        inflight: f64::from(work.inflight),
                    };
                    st.polls.insert(token, (addr, now, ours));
                }
                None => {
                    st.book
                        .on_poll(&addr, PollResult::Failed, GatewayShare::default(), now);
                    host.count(Counter::PollFailures, 1);
                }
            }
        }
        self.ask_peers(host, &mut st, now);
        let listing: hashbrown::HashSet<String> = st.model_polls.values().cloned().collect();
        for addr in st.book.models_due(&self.config, now) {
            if listing.contains(&addr) {
                continue;
            }
            if let Some(token) = dispatch(
                host,
                &self.config.poll_cluster,
                "/v1/models",
                &addr,
                Some(&addr),
                self.config.pod_authorization.as_ref(),
                self.timeout(),
            ) {
                st.model_polls.insert(token, addr);
            }
        }
        let table = st.book.table(now);
        // Every VM re-reads the table when it changes; unchanged ticks (most of them, between polls)
        // cost no write and no parse.
        if st.published_pods.as_ref() != Some(&table.pods) {
            let _ = host.shared_set(LOAD_KEY, &table.encode(), None);
            st.published_pods = Some(table.pods.clone());
        }
        self.publish_gauges(host, &table, now);
        self.leader = Some(st);
    }

    /// Asks the other gateway replicas that are due for the pages they published since the last
    /// answer (`peers`).
    fn ask_peers(&self, host: &mut dyn Host, st: &mut LeaderState, now: u64) {
        let peers = &self.config.peers;
        for ask in st.pullers.due(peers, now, self.timeout()) {
            let mut headers = vec![(crate::headers::DESTINATION.into(), ask.addr.clone())];
            if let Some(token) = &peers.token {
                headers.push((peers::TOKEN_HEADER.into(), token.clone()));
            }
            let call = HttpCall {
                cluster: self.config.poll_cluster.clone(),
                method: "GET",
                path: ask.path,
                authority: ask.addr.clone(),
                headers,
                body: None,
                timeout_ms: self.timeout(),
            };
            let token = host.http_call(&call);
            if token.is_none() {
                host.count(Counter::PeerSyncFailures, 1);
            }
            st.pullers.sent(&ask.addr, token, now);
        }
    }

    /// The leader's gauges, per configured pool (every pool has its series, empty or not), and
    /// each pod's learned TTFT model.
    fn publish_gauges(&self, host: &mut dyn Host, table: &LoadTable, now: u64) {
        let stale_after = self.config.stale_after_ms;
        for pool in &self.config.pools {
            let labels = [
                (metrics::POOL, pool.name.as_str()),
                (metrics::ROLE, metrics::role_label(pool.role)),
            ];
            let members = || table.pods.iter().filter(|p| p.pool == pool.name);
            let in_state = |wanted: Health| {
                members().filter(move |p| health_of(p, now, stale_after) == wanted)
            };
            let (fresh, stale) = (
                in_state(Health::Fresh).count(),
                in_state(Health::Stale).count(),
            );
            // Only fresh figures: a stale pod's queue is an old reading, a down pod's none.
            let waiting: f64 = in_state(Health::Fresh).map(|p| p.metrics.waiting).sum();
            host.gauge_in(Gauge::PodsKnown, &labels, members().count() as u64);
            host.gauge_in(Gauge::PodsHealthy, &labels, (fresh + stale) as u64);
            host.gauge_in(Gauge::PodsStale, &labels, stale as u64);
            host.gauge_in(
                Gauge::PodsEjected,
                &labels,
                members().filter(|p| p.ejected_until_ms > now).count() as u64,
            );
            host.gauge_in(Gauge::PoolRequestsWaiting, &labels, waiting.round() as u64);
        }
        host.gauge(Gauge::IndexEntries, self.router.index_entries() as u64);
        let pool_costs = self.router.pool_costs();
        for pod in &table.pods {
            let cost = self
                .router
                .cost_in(&self.config, &pod.addr, pod.role, &pool_costs);
            let labels = [
                (metrics::POOL, pod.pool.as_str()),
                (metrics::ROLE, metrics::role_label(pod.role)),
                (metrics::POD, pod.addr.as_str()),
            ];
            host.gauge_in(
                Gauge::PodTtftOverheadUs,
                &labels,
                (cost.overhead_ms * 1e3).max(0.0) as u64,
            );
            // The per-token cost is µs; its inverse, tokens per second, is an integer worth reading.
            let tokens_per_second = if cost.us_per_token > 0.0 {
                1e6 / cost.us_per_token
            } else {
                0.0
            };
            host.gauge_in(
                Gauge::PodPrefillTokensPerSecond,
                &labels,
                tokens_per_second.round() as u64,
            );
            host.gauge_in(
                Gauge::PodFitSamples,
                &labels,
                self.router.fit_samples(&pod.addr).max(0.0).round() as u64,
            );
        }
    }

    /// Publishes the drained changes as delta pages, in their order: a page applies its
    /// observations before its evictions, so an observation that follows an eviction (a block
    /// withdrawn, then learned again) starts a new page.
    fn publish_pages(&mut self, host: &mut dyn Host, st: &mut LeaderState) {
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
        self.router.applied_page = st.head;
        if st.head >= st.snapshot_seq + SNAPSHOT_EVERY_PAGES
            || (st.snapshot_seq == 0 && st.head > 0)
        {
            let _ = host.shared_set(SNAPSHOT_KEY, &self.router.snapshot(st.head).encode(), None);
            st.snapshot_seq = st.head;
        }
    }

    fn put_page(host: &mut dyn Host, st: &mut LeaderState, mut page: Page) {
        st.head += 1;
        page.seq = st.head;
        // Page before head: a reader that sees the new head finds its page.
        let _ = host.shared_set(&page_key(st.head), &page.encode(), None);
        set_u64(host, PAGE_HEAD_KEY, st.head);
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
        let expired = self.router.expire_prefills(now);
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

    /// Reads the board (one shared-data read) and adopts the other VMs' unfinished work; returns
    /// the board and its compare-and-swap token for a write.
    pub fn read_inflight_board(&mut self, host: &mut dyn Host, now: u64) -> (Board, Option<u32>) {
        let (board, cas) = read_board(host);
        if self
            .router
            .set_others_work(board.others(self.id, now, INFLIGHT_ROW_TTL_MS), now)
        {
            self.row_write_pending = true;
        }
        (board, cas)
    }

    /// Adopts the other VMs' cost fits when the key changed, and publishes this VM's own at most
    /// once per heartbeat.
    fn sync_fits(&mut self, host: &mut dyn Host, now: u64) {
        let (bytes, cas) = host.shared_get(FITS_KEY);
        if cas != self.fits_cas {
            let board = bytes.as_deref().map(FitBoard::decode).unwrap_or_default();
            self.router
                .set_others_fits(board.others(self.id, now, FITS_ROW_TTL_MS));
            self.fits_cas = cas;
        }
        if now.saturating_sub(self.last_fits_write_ms) < FITS_HEARTBEAT_MS {
            return;
        }
        let own = self.router.own_fits();
        if own.is_empty() {
            return;
        }
        let mut board = bytes.as_deref().map(FitBoard::decode).unwrap_or_default();
        board.put_row(self.id, now, own, FITS_ROW_TTL_MS);
        // One attempt: a lost race is retried on the next tick.
        if host.shared_set(FITS_KEY, &board.encode(), cas).is_ok() {
            self.last_fits_write_ms = now;
        }
    }

    /// Rewrites this VM's row on the in-flight board (and re-reads the others on the way). The key's
    /// first insert is not guarded by compare-and-swap; two VMs racing on it lose one row until that
    /// VM's next write, at most a heartbeat later.
    pub fn write_inflight_row(&mut self, host: &mut dyn Host, now: u64) {
        self.write_inflight_row_over(host, now, None);
    }

    /// [`Self::write_inflight_row`], its first compare-and-swap on a board this VM read earlier in
    /// the same callback ([`Self::read_inflight_board`]): one shared-data read per routed request
    /// instead of two. Nothing runs on this VM's thread in between, so only another VM's write can
    /// make that attempt lose; the next ones read afresh.
    pub fn write_inflight_row_over(
        &mut self,
        host: &mut dyn Host,
        now: u64,
        read: Option<(Board, Option<u32>)>,
    ) {
        let own = self.router.own_work();
        let (id, router) = (self.id, &mut self.router);
        // A re-read that moves this VM's own prefills on leaves the row just written behind.
        let mut moved = false;
        let written = put_board_row(host, id, now, &own, read, |board| {
            moved |= router.set_others_work(board.others(id, now, INFLIGHT_ROW_TTL_MS), now);
        });
        if written {
            self.last_row_write_ms = now;
        }
        self.row_write_pending = !written || moved;
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

    pub fn on_call_response(
        &mut self,
        host: &mut dyn Host,
        token: u32,
        status: u32,
        body: &[u8],
        now: u64,
    ) {
        let Some(st) = self.leader.as_mut() else {
            return;
        };
        let pulled = st.pullers.on_answer(token, status, body, st.epoch);
        if !matches!(pulled, peers::Pulled::Unknown) {
            match pulled {
                peers::Pulled::Fresh(answer) => {
                    // Another replica's work, as its row; a write that loses every race waits for
                    // the next answer, a pull later.
                    let row = peers::replica_row(answer.epoch);
                    put_board_row(host, row, now, &answer.work, None, |_| {});
                    for mut page in answer.pages {
                        let blocks: usize = page.observations.iter().map(|o| o.hashes.len()).sum();
                        host.count(Counter::PeerBlocksLearned, blocks as u64);
                        self.router.apply_changes(&page);
                        page.from_peer = true;
                        st.pending.push(Change::FromPeer(page));
                    }
                }
                peers::Pulled::Itself => {
                    log::info!(
                        "kvroute: a configured replica is this Envoy itself; not asking it again"
                    )
                }
                peers::Pulled::Failed => {
                    host.count(Counter::PeerSyncFailures, 1);
                    log::debug!(
                        "kvroute: a gateway replica's pages were unreadable (status {status})"
                    );
                }
                peers::Pulled::Unknown => {}
            }
        } else if st.admin_call == Some(token) {
            st.admin_call = None;
            if status == 200 {
                st.book.on_admin_clusters(&self.config, body);
                if let Some(cluster) = &self.config.peers.cluster {
                    if let Some(members) = discovery::cluster_members(body, cluster) {
                        st.pullers.set_members(&members);
                    }
                }
            } else {
                log::warn!("kvroute: admin /clusters answered {status}");
            }
        } else if let Some(addr) = st.model_polls.remove(&token) {
            let result = if status == 200 {
                PollResult::Answered(status, body)
            } else {
                PollResult::Failed
            };
            if !st.book.on_models(&addr, result) {
                log::debug!("kvroute: {addr} /v1/models unreadable (status {status}); its metrics' model label alone names it");
            }
        } else if let Some((addr, sent_ms, ours)) = st.polls.remove(&token) {
            let timeout = self.config.poll_timeout_ms;
            // Envoy answers a call that timed out with its own 504 (and a refused or reset one
            // with a 503, at once): only the time it took tells a late pod from a failing one.
            let elapsed = now.saturating_sub(sent_ms);
            let result = match status {
                0 | 504 if crate::health::poll_timed_out(elapsed, timeout) => PollResult::TimedOut,
                0 => PollResult::Failed,
                _ => PollResult::Answered(status, body),
            };
            let late = matches!(result, PollResult::TimedOut);
            let fresh = st.book.on_poll(&addr, result, ours, now);
            if let Some((pool, role, n)) = st.book.implausible(&addr) {
                let labels = [
                    (metrics::POOL, pool),
                    (metrics::ROLE, metrics::role_label(role)),
                    (metrics::POD, addr.as_str()),
                ];
                host.count_in(Counter::PodReportedImplausible, &labels, u64::from(n));
            }
            if late {
                host.count(Counter::PollsLate, 1);
                log::debug!("kvroute: poll of {addr} timed out: its figures are stale");
            } else if !fresh {
                host.count(Counter::PollFailures, 1);
                log::debug!("kvroute: poll of {addr} failed (status {status})");
            }
        }
    }
}

/// A GET through `cluster`; `credential` is the pool's `Authorization` value, for calls to pods
/// (`pod_api_key`), never for the admin API.
fn dispatch(
    host: &mut dyn Host,
    cluster: &str,
    path: &str,
    authority: &str,
    destination: Option<&str>,
    credential: Option<&crate::common::Secret>,
    timeout_ms: u64,
) -> Option<u32> {
    let mut headers = Vec::new();
    if let Some(d) = destination {
        headers.push((crate::headers::DESTINATION.into(), d.to_string()));
    }
    if let Some(c) = credential {
        headers.push(("authorization".into(), c.expose().to_string()));
    }
    let call = HttpCall {
        cluster: cluster.to_string(),
        method: "GET",
        path: path.to_string(),
        authority: authority.to_string(),
        headers,
        body: None,
        timeout_ms,
    };
    let token = host.http_call(&call);
    if token.is_none() {
        log::warn!("kvroute: dispatch to cluster `{cluster}` failed (is the cluster configured?)");
    }
    token
}

/// The work board and its compare-and-swap token (empty when absent or another version's).
fn read_board(host: &dyn Host) -> (Board, Option<u32>) {
    let (bytes, cas) = host.shared_get(INFLIGHT_KEY);
    (bytes.map(|b| Board::decode(&b)).unwrap_or_default(), cas)
}

/// Replaces row `row` of the work board by compare-and-swap, at most `INFLIGHT_CAS_ATTEMPTS`
/// times: the first attempt on `read` when given (the board as read earlier in the same callback),
/// the others on a fresh read, which `on_read` sees. Whether the write went through.
fn put_board_row(
    host: &mut dyn Host,
    row: u64,
    now: u64,
    entries: &[(String, PodWork)],
    mut read: Option<(Board, Option<u32>)>,
    mut on_read: impl FnMut(&Board),
) -> bool {
    for _ in 0..INFLIGHT_CAS_ATTEMPTS {
        let (mut board, cas) = match read.take() {
            Some(read) => read,
            None => {
                let (board, cas) = read_board(host);
                on_read(&board);
                (board, cas)
            }
        };
        board.put_row(row, now, entries, INFLIGHT_ROW_TTL_MS);
        if host.shared_set(INFLIGHT_KEY, &board.encode(), cas).is_ok() {
            return true;
        }
    }
    false
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
#[allow(clippy::too_many_lines)] // tests: the size limits are for production code
pub(crate) mod tests;

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
#[allow(clippy::too_many_lines)] // tests: the size limits are for production code
mod churn_tests;
