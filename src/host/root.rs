//! The root context of each VM: configuration, the tick that elects a leader and keeps this VM's
//! view current, and, in the leader, polling, discovery and publishing.

use super::filter::Filter;
use super::shared;
use super::stats::{Counter, Gauge, Stats};
use crate::config::BlockMode;
use crate::config::Config;
use crate::leader::{Leader, PollResult};
use crate::router::{Router, Tokenizer};
use crate::state::fits::FitBoard;
use crate::state::inflight::Board;
use crate::state::lease::{self, Lease};
use crate::state::load::{LoadTable, PodLoad};
use crate::state::messages::{Message, Observation, Page};
use crate::state::{
    page_key, FITS_KEY, INFLIGHT_KEY, LEASE_KEY, LOAD_KEY, PAGE_HEAD_KEY, PAGE_RING, QUEUE_ID_KEY,
    QUEUE_NAME, SNAPSHOT_EVERY_PAGES, SNAPSHOT_KEY,
};
use hashbrown::HashMap;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};
use std::cell::RefCell;
use std::hash::{BuildHasher, Hasher};
use std::rc::Rc;
use std::time::Duration;

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
const INFLIGHT_ROW_TTL_MS: u64 = 3 * INFLIGHT_HEARTBEAT_MS;
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
    pub stats: Stats,
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
}

struct LeaderState {
    book: Leader,
    queue: u32,
    polls: HashMap<u32, String>,
    admin_call: Option<u32>,
    pending: Vec<Observation>,
    pending_evictions: Vec<Observation>,
    head: u64,
    snapshot_seq: u64,
    published_pods: Option<Vec<PodLoad>>,
}

impl Vm {
    fn new(config: Config, tokenizer: Option<Box<dyn Tokenizer>>) -> Vm {
        Vm {
            config,
            router: Router::new(),
            tokenizer,
            stats: Stats::define(),
            id: random_u64(),
            queue: None,
            leader: None,
            load_cas: None,
            last_row_write_ms: 0,
            row_write_pending: false,
            last_fits_write_ms: 0,
            fits_cas: None,
            unsent: Vec::new(),
        }
    }

    /// This VM's identity (lease holder id; shown in the debug header).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Applies the delta pages the leader published since this VM last looked: one shared-data
    /// read when nothing is new.
    pub fn sync_pages(&mut self) {
        let Some(head) = shared::get_u64(PAGE_HEAD_KEY) else {
            return;
        };
        let applied = self.router.applied_page;
        if head <= applied || self.leader.is_some() {
            return;
        }
        if head - applied >= PAGE_RING - 1 {
            self.load_snapshot(head);
        }
        let from = self.router.applied_page + 1;
        for seq in from..=head.min(from + MAX_PAGES_PER_SYNC - 1) {
            let page = shared::get(&page_key(seq)).0.and_then(|b| Page::decode(&b));
            match page {
                Some(p) if p.seq == seq => self.router.apply_page(&p),
                // Overwritten while we read (we are a full ring behind): start from the snapshot.
                _ => {
                    self.load_snapshot(head);
                    return;
                }
            }
        }
    }

    fn load_snapshot(&mut self, head: u64) {
        match shared::get(SNAPSHOT_KEY).0.and_then(|b| Page::decode(&b)) {
            Some(snapshot) if snapshot.seq + PAGE_RING > head => {
                self.router.load_snapshot(&snapshot)
            }
            // No usable snapshot yet: skip ahead and let new observations rebuild the view.
            _ => self.router.applied_page = head.saturating_sub(1),
        }
    }

    /// Records a routing decision locally and tells the leader.
    pub fn observe(&mut self, observation: Observation) {
        self.router.observe(&observation);
        self.tell_leader(Message::Observation {
            vm: self.id,
            observation,
        });
    }

    /// Tells the leader what a response showed a pod had lost (already applied here): the blocks,
    /// for every VM's index, and how many of ours the pod evidently keeps.
    pub fn report_eviction(&mut self, addr: String, blocks: u32, lost: Vec<u64>) {
        self.tell_leader(Message::Eviction {
            vm: self.id,
            eviction: Observation {
                addr: addr.clone(),
                hashes: lost,
            },
        });
        self.tell_leader(Message::CapacityHint {
            vm: self.id,
            addr,
            blocks,
        });
    }

    fn tell_leader(&mut self, message: Message) {
        let message = message.encode();
        match self.resolve_queue() {
            Some(queue) => {
                shared::enqueue(queue, &message);
            }
            // No leader has registered the queue yet: keep it for the first tick that finds one,
            // so other VMs still learn what this VM routed during start-up.
            None if self.unsent.len() < MAX_UNSENT => self.unsent.push(message),
            None => {}
        }
    }

    fn resolve_queue(&mut self) -> Option<u32> {
        if self.queue.is_none() {
            self.queue = shared::get(QUEUE_ID_KEY)
                .0
                .and_then(|b| Some(u32::from_le_bytes(b.get(..4)?.try_into().ok()?)));
        }
        self.queue
    }

    fn tick(&mut self, now: u64) {
        self.elect(now);
        if self.leader.is_some() {
            self.lead(now);
        }
        self.follow(now);
    }

    fn elect(&mut self, now: u64) {
        let (mut bytes, mut cas) = shared::get(LEASE_KEY);
        if bytes.is_none() {
            // CAS does not guard a key's first insert: create an expired lease first (every VM
            // writes the same value), then claim it with a real compare-and-swap.
            let expired = Lease {
                holder: 0,
                expires_ms: 0,
            };
            shared::set(LEASE_KEY, &expired.encode());
            (bytes, cas) = shared::get(LEASE_KEY);
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
            Some(l) => shared::cas(LEASE_KEY, &l.encode(), cas).is_ok(),
            None => false,
        };
        if won && self.leader.is_none() {
            self.become_leader();
        } else if !won && self.leader.is_some() {
            log::info!("kvroute: VM {:x} is no longer the leader", self.id);
            self.leader = None;
        }
    }

    fn become_leader(&mut self) {
        let Ok(queue) = hostcalls::register_shared_queue(QUEUE_NAME) else {
            log::warn!("kvroute: cannot register the observation queue; not leading");
            return;
        };
        shared::set(QUEUE_ID_KEY, &queue.to_le_bytes());
        self.queue = Some(queue);
        // Catch up with what the previous leader published before taking over the sequence.
        self.sync_pages();
        let head = shared::get_u64(PAGE_HEAD_KEY)
            .unwrap_or(0)
            .max(self.router.applied_page);
        self.router.applied_page = head;
        self.leader = Some(LeaderState {
            book: Leader::new(&self.config),
            queue,
            polls: HashMap::new(),
            admin_call: None,
            pending: Vec::new(),
            pending_evictions: Vec::new(),
            head,
            snapshot_seq: 0,
            published_pods: None,
        });
        self.stats.inc(Counter::LeaderChanges);
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

    fn lead(&mut self, now: u64) {
        let Some(mut st) = self.leader.take() else {
            return;
        };
        for _ in 0..MAX_DRAIN_PER_TICK {
            let Some(bytes) = shared::dequeue(st.queue) else {
                break;
            };
            match Message::decode(&bytes) {
                Some(Message::Observation { observation, .. }) => {
                    self.router.observe(&observation);
                    st.pending.push(observation);
                }
                Some(Message::CapacityHint { addr, blocks, .. }) => {
                    st.book.on_capacity_hint(&addr, blocks, now);
                }
                Some(Message::Eviction { eviction, .. }) => {
                    self.router.forget(&eviction);
                    st.pending_evictions.push(eviction);
                }
                None => log::debug!("kvroute: dropped an undecodable queue message"),
            }
        }
        self.publish_pages(&mut st);
        if st.book.discovery_due(&self.config, now) && st.admin_call.is_none() {
            if let Some(cluster) = &self.config.admin_cluster {
                st.admin_call = dispatch(
                    cluster,
                    "/clusters?format=json",
                    "admin",
                    None,
                    self.timeout(),
                );
            }
        }
        for addr in st.book.poll_due(&self.config, now) {
            if st.polls.values().any(|a| *a == addr) {
                continue; // the previous poll of this pod has not answered yet
            }
            match dispatch(
                &self.config.poll_cluster,
                "/metrics",
                &addr,
                Some(&addr),
                self.timeout(),
            ) {
                Some(token) => {
                    st.polls.insert(token, addr);
                }
                None => {
                    st.book.on_poll(&addr, PollResult::Failed, now);
                    self.stats.inc(Counter::PollFailures);
                }
            }
        }
        let table = st.book.table(now);
        // Every VM re-reads the table when it changes; unchanged ticks (most of them, between polls)
        // cost no write and no parse.
        if st.published_pods.as_ref() != Some(&table.pods) {
            shared::set(LOAD_KEY, &table.encode());
            st.published_pods = Some(table.pods.clone());
        }
        self.stats.set(Gauge::PodsKnown, table.pods.len() as u64);
        self.stats.set(
            Gauge::PodsHealthy,
            st.book.healthy_pods(now, self.config.stale_after_ms) as u64,
        );
        self.stats
            .set(Gauge::IndexEntries, self.router.index_entries() as u64);
        let (prefill_queue, decode_queue) = table.pd_queues(now, self.config.stale_after_ms);
        self.stats.set(
            Gauge::PdPrefillPoolQueueX1000,
            (prefill_queue * 1000.0) as u64,
        );
        self.stats.set(
            Gauge::PdDecodePoolQueueX1000,
            (decode_queue * 1000.0) as u64,
        );
        for pod in &table.pods {
            let cost = self.router.cost_of(&self.config, &pod.addr);
            let samples = self.router.fit_samples(&pod.addr);
            self.stats.set_pod_cost(&pod.addr, &cost, samples);
        }
        self.leader = Some(st);
    }

    fn publish_pages(&mut self, st: &mut LeaderState) {
        let mut start = 0;
        while start < st.pending.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < st.pending.len() && (end == start || bytes < MAX_PAGE_BYTES) {
                bytes += st
                    .pending
                    .get(end)
                    .map_or(0, |o| o.hashes.len() * 8 + o.addr.len() + 8);
                end += 1;
            }
            st.head += 1;
            let page = Page {
                seq: st.head,
                observations: st
                    .pending
                    .get(start..end)
                    .map(<[Observation]>::to_vec)
                    .unwrap_or_default(),
                evictions: Vec::new(),
            };
            // Page before head: a reader that sees the new head finds its page.
            shared::set(&page_key(st.head), &page.encode());
            shared::set_u64(PAGE_HEAD_KEY, st.head);
            start = end;
        }
        st.pending.clear();
        if !st.pending_evictions.is_empty() {
            // Rare (a response reported a miss the index did not expect): one page of their own.
            st.head += 1;
            let page = Page {
                seq: st.head,
                observations: Vec::new(),
                evictions: std::mem::take(&mut st.pending_evictions),
            };
            shared::set(&page_key(st.head), &page.encode());
            shared::set_u64(PAGE_HEAD_KEY, st.head);
        }
        self.router.applied_page = st.head;
        if st.head >= st.snapshot_seq + SNAPSHOT_EVERY_PAGES
            || (st.snapshot_seq == 0 && st.head > 0)
        {
            shared::set(SNAPSHOT_KEY, &self.router.snapshot(st.head).encode());
            st.snapshot_seq = st.head;
        }
    }

    fn follow(&mut self, now: u64) {
        if let Some(queue) = self.resolve_queue() {
            for message in self.unsent.drain(..) {
                shared::enqueue(queue, &message);
            }
        }
        self.refresh_load_table();
        let expired = self.router.expire_prefills(now);
        if expired
            || self.row_write_pending
            || now.saturating_sub(self.last_row_write_ms) >= INFLIGHT_HEARTBEAT_MS
        {
            self.write_inflight_row(now);
        }
        self.sync_fits(now);
        if self.leader.is_none() {
            self.sync_pages();
        }
    }

    /// Reads the board (one shared-data read) and adopts the other VMs' unfinished work; returns
    /// the board and its compare-and-swap token for a write.
    pub fn read_inflight_board(&mut self, now: u64) -> (Board, Option<u32>) {
        let (bytes, cas) = shared::get(INFLIGHT_KEY);
        let board = bytes.map(|b| Board::decode(&b)).unwrap_or_default();
        self.router
            .set_others_work(board.others(self.id, now, INFLIGHT_ROW_TTL_MS));
        (board, cas)
    }

    /// Adopts the other VMs' cost fits when the key changed, and publishes this VM's own at most
    /// once per heartbeat.
    fn sync_fits(&mut self, now: u64) {
        let (bytes, cas) = shared::get(FITS_KEY);
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
        if shared::cas(FITS_KEY, &board.encode(), cas).is_ok() {
            self.last_fits_write_ms = now;
        }
    }

    /// Rewrites this VM's row on the in-flight board (and re-reads the others on the way). The key's
    /// first insert is not guarded by compare-and-swap; two VMs racing on it lose one row until that
    /// VM's next write, at most a heartbeat later.
    pub fn write_inflight_row(&mut self, now: u64) {
        let own = self.router.own_work();
        for _ in 0..INFLIGHT_CAS_ATTEMPTS {
            let (mut board, cas) = self.read_inflight_board(now);
            board.put_row(self.id, now, &own, INFLIGHT_ROW_TTL_MS);
            if shared::cas(INFLIGHT_KEY, &board.encode(), cas).is_ok() {
                self.last_row_write_ms = now;
                self.row_write_pending = false;
                return;
            }
        }
        self.row_write_pending = true;
    }

    /// Adopts the leader's load table if it changed since this VM last read it.
    pub fn refresh_load_table(&mut self) {
        let (bytes, cas) = shared::get(LOAD_KEY);
        if cas != self.load_cas {
            if let Some(table) = bytes.and_then(|b| LoadTable::decode(&b)) {
                self.router.apply_load_table(&self.config, table);
                self.load_cas = cas;
            }
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.poll_timeout_ms)
    }

    fn on_call_response(&mut self, token: u32, body_size: usize, now: u64) {
        let Some(st) = self.leader.as_mut() else {
            return;
        };
        let (status, body) = super::call_response(body_size);
        if st.admin_call == Some(token) {
            st.admin_call = None;
            if status == 200 {
                st.book.on_admin_clusters(&self.config, &body);
            } else {
                log::warn!("kvroute: admin /clusters answered {status}");
            }
        } else if let Some(addr) = st.polls.remove(&token) {
            let result = if status == 0 {
                PollResult::Failed
            } else {
                PollResult::Answered(status, &body)
            };
            if !st.book.on_poll(&addr, result, now) {
                self.stats.inc(Counter::PollFailures);
                log::debug!("kvroute: poll of {addr} failed (status {status})");
            }
        }
    }
}

fn dispatch(
    cluster: &str,
    path: &str,
    authority: &str,
    destination: Option<&str>,
    timeout: Duration,
) -> Option<u32> {
    let mut headers = vec![
        (":method", "GET"),
        (":path", path),
        (":authority", authority),
    ];
    if let Some(d) = destination {
        headers.push((crate::headers::DESTINATION, d));
    }
    match hostcalls::dispatch_http_call(cluster, headers, None, vec![], timeout) {
        Ok(token) => Some(token),
        Err(e) => {
            log::warn!("kvroute: dispatch to cluster `{cluster}` failed: {e:?} (is the cluster configured?)");
            None
        }
    }
}

/// A VM identity unlikely to collide: the standard library seeds its hasher from WASI random_get.
fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(super::now_ms());
    h.finish()
}

pub struct Root {
    vm: Option<Rc<RefCell<Vm>>>,
}

impl Root {
    pub fn new() -> Root {
        Root { vm: None }
    }
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        if let Some(vm) = &self.vm {
            if let Ok(mut vm) = vm.try_borrow_mut() {
                vm.on_call_response(token_id, body_size, super::now_ms());
            }
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        let config = match Config::parse(&bytes) {
            Ok(c) => c,
            Err(e) => {
                log::error!("{e}");
                return false;
            }
        };
        let tokenizer = match build_tokenizer(&config) {
            Ok(t) => t,
            Err(e) => {
                log::error!("kvroute: {e}");
                return false;
            }
        };
        let tick = Duration::from_millis((config.poll_interval_ms / 2).clamp(10, 100));
        if hostcalls::set_tick_period(tick).is_err() {
            log::warn!("kvroute: the host refused a tick period");
        }
        log::info!(
            "kvroute: configured with {} pool(s), poll every {} ms",
            config.pools.len(),
            config.poll_interval_ms
        );
        self.vm = Some(Rc::new(RefCell::new(Vm::new(config, tokenizer))));
        true
    }

    fn on_tick(&mut self) {
        if let Some(vm) = &self.vm {
            if let Ok(mut vm) = vm.try_borrow_mut() {
                if !vm.config.pools.is_empty() {
                    vm.tick(super::now_ms());
                }
            }
        }
    }

    fn on_queue_ready(&mut self, _queue_id: u32) {
        // Drained on the next tick; draining here too would only split the same work.
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Never None (the SDK would panic): without a valid configuration the filter still strips
        // spoofed routing headers and passes everything through.
        Some(Box::new(Filter::new(self.vm.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// The tokenizer `block.mode` asks for (none in chars mode). Config validation already refused
/// tiktoken mode in a build without it.
fn build_tokenizer(config: &Config) -> Result<Option<Box<dyn Tokenizer>>, String> {
    match config.block.mode {
        BlockMode::Chars => Ok(None),
        #[cfg(feature = "tiktoken")]
        BlockMode::Tiktoken => crate::tokenize::Tiktoken::new(&config.block.encoding)
            .map(|t| Some(Box::new(t) as Box<dyn Tokenizer>)),
        #[cfg(not(feature = "tiktoken"))]
        BlockMode::Tiktoken => Err("this build has no tiktoken tables".to_string()),
    }
}
