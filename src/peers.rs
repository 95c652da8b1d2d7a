//! Placements shared between gateway replicas.
//!
//! Several Envoys with kvroute in front of the same pods each keep their own prefix index, and each
//! knows only the prefixes it routed itself. Behind a layer-4 balancer a tenant's requests reach
//! every replica; each replica placed the tenant's prompt on a pod of its own choice whenever their
//! predictions did not tie, each of those pods computed it, and the pool's cache held copies instead
//! of more prompts (`make bench-replicas`, multi-tenant: hit ratio 73% with two gateways against 97%
//! with one). Guessing where the other replica went did not fix it (docs/results.md, "Several gateway
//! replicas"); being told does. With no store shared between the replicas:
//!
//! * **Serving.** Each replica answers `GET <peers.path>?epoch=E&after=N` itself (the filter replies
//!   before routing) with the delta pages its leader published after page `N`. Only pages of its
//!   own workers' observations and evictions are served; pages learned from a replica are marked
//!   (`Page::from_peer`) and never served again, so nothing echoes between replicas.
//! * **Pulling.** Each leader asks every other replica every `peers.interval_ms` for the pages after
//!   the last it applied, applies them to its index and publishes them to its own workers, as if its
//!   own workers had observed them. Pods are named by address, so a page names the same pod in
//!   every replica; a pod this replica does not route to is ignored.
//! * **Epochs.** A replica's pages are numbered from its start, under a random epoch. A puller whose
//!   epoch is not the replica's (the replica restarted, or this is the first ask) gets the oldest
//!   pages still kept; one that fell a whole ring behind too. A replica that answers with this
//!   replica's own epoch is itself (the same list configured on every replica) and is not asked
//!   again.
//! * **Trust.** The answer only reveals placements (pod addresses and block hashes); nothing is
//!   written by a request to the path. With `peers.token` set, only requests carrying it in
//!   `x-kvroute-peer-token` get an answer (others get 404), and the leader sends it.
//!
//! * **Work.** The answer also carries the replica's own unfinished work per pod (its workers' rows
//!   of the work board, summed). The puller's leader writes it on its own board as a row of that
//!   replica's (`crate::work`), so every worker's queue term sees the other replica's
//!   queued prefills a pull later, in tokens, instead of a pod poll later, in requests.
//!
//! Answer body: `format:u8(=1) epoch:u64 through:u64 n:u32 (len:u32 page)×n m:u32 (len:u16
//! entry)×m`, at most [`MAX_ANSWER_BYTES`] of pages; `through` is the newest page considered (the
//! puller's next `after`); an entry is a work-board entry as the board writes it.

use crate::common::{is_host_port, ConfigError};
use crate::port::Host;
use crate::state::get_u64;
use crate::state::messages::Page;
use crate::state::rows::Entry;
use crate::state::{page_key, EPOCH_KEY, INFLIGHT_KEY, PAGE_HEAD_KEY, PAGE_RING};
use crate::work::{Board, WorkEntry};
use serde::Deserialize;

/// The header that carries `peers.token`.
pub const TOKEN_HEADER: &str = "x-kvroute-peer-token";
/// Pages of one answer at most (bytes): a puller that is further behind catches up over several.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
const ANSWER_FORMAT: u8 = 1;
/// Replicas one kvroute pulls from at most.
const MAX_PEERS: usize = 64;
/// The top bit of a work-board row id marks a replica's row (a VM's id never has it).
pub const REPLICA_ROW: u64 = 1 << 63;
/// Pods of a replica's work one answer carries at most.
const MAX_WORK_ENTRIES: usize = 4096;

/// The work-board row id of the replica whose pages are numbered under `epoch`.
pub fn replica_row(epoch: u64) -> u64 {
    REPLICA_ROW | epoch
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct PeersConfig {
    /// Every gateway replica's inference listener, `ip:port` (this one's own may be listed: it is
    /// recognised and skipped). Empty: no sharing, and the path is not served.
    pub endpoints: Vec<String>,
    /// Or: an Envoy cluster whose members are the replicas (read from the admin API like a pool's,
    /// e.g. Istio's cluster of a Service selecting the gateway pods).
    pub cluster: Option<String>,
    /// The path each replica answers on.
    pub path: String,
    /// How often the leader asks each replica for its new pages.
    pub interval_ms: u64,
    /// A shared secret: when set, only requests carrying it in `x-kvroute-peer-token` are answered.
    pub token: Option<String>,
}

impl Default for PeersConfig {
    fn default() -> Self {
        PeersConfig {
            endpoints: Vec::new(),
            cluster: None,
            path: "/kvroute/v1/placements".to_string(),
            interval_ms: 200,
            token: None,
        }
    }
}

impl PeersConfig {
    /// `admin_cluster`: the configuration's, needed to read a `cluster`'s members.
    pub fn validate(&self, admin_cluster: Option<&str>) -> Result<(), ConfigError> {
        match &self.cluster {
            Some(_) if !self.endpoints.is_empty() => {
                return Err(ConfigError::at(
                    "peers.endpoints",
                    "give either `endpoints` or `cluster`, not both",
                ))
            }
            Some(c) if c.trim().is_empty() => {
                return Err(ConfigError::at("peers.cluster", "must not be empty"))
            }
            Some(_) if admin_cluster.is_none() => {
                return Err(ConfigError::at(
                    "admin_cluster",
                    "required when `peers` is given by `cluster` (membership is read from the admin API)",
                ))
            }
            _ => {}
        }
        if self.endpoints.len() > MAX_PEERS {
            return Err(ConfigError::at(
                "peers.endpoints",
                format!("at most {MAX_PEERS} replicas"),
            ));
        }
        for (i, ep) in self.endpoints.iter().enumerate() {
            if !is_host_port(ep) {
                return Err(ConfigError::at(
                    format!("peers.endpoints[{i}]"),
                    format!("`{ep}` is not `ip:port`"),
                ));
            }
        }
        if !self.path.starts_with('/') || self.path.contains(['?', '#']) || self.path.len() < 2 {
            return Err(ConfigError::at(
                "peers.path",
                "must be an absolute path without a query",
            ));
        }
        if self.interval_ms < 10 {
            return Err(ConfigError::at("peers.interval_ms", "must be at least 10"));
        }
        if self
            .token
            .as_deref()
            .is_some_and(|t| t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(ConfigError::at(
                "peers.token",
                "must be non-empty printable ASCII without spaces",
            ));
        }
        Ok(())
    }

    /// Whether a `GET` of `path` is a replica asking for this one's pages.
    pub fn serves(&self, path: &str) -> bool {
        self.enabled() && path.split('?').next() == Some(self.path.as_str())
    }

    /// Whether replicas are configured at all.
    pub fn enabled(&self) -> bool {
        !self.endpoints.is_empty() || self.cluster.is_some()
    }

    /// Whether the request may be answered (`token` is the request's token header).
    pub fn admits(&self, token: Option<&str>) -> bool {
        // Compared in constant time: a replica's token guards the index of every prefix placed.
        self.token
            .as_deref()
            .is_none_or(|t| token.is_some_and(|c| crate::common::same_secret(t, c)))
    }
}

/// What a replica asked for: `epoch=E&after=N` (a missing or unreadable value is 0).
fn query(path: &str) -> (u64, u64) {
    let (mut epoch, mut after) = (0, 0);
    let query = path.split_once('?').map(|(_, q)| q).unwrap_or_default();
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = value.parse().unwrap_or(0);
        match name {
            "epoch" => epoch = value,
            "after" => after = value,
            _ => {}
        }
    }
    (epoch, after)
}

/// This Envoy's own pages after the one the asker applied, and its own unfinished work, from shared
/// data (any worker answers); `row_ttl_ms`: how old a work-board row may be and still count.
pub fn answer(host: &dyn Host, path: &str, row_ttl_ms: u64) -> Vec<u8> {
    let (asked_epoch, after) = query(path);
    let epoch = get_u64(host, EPOCH_KEY).unwrap_or(0);
    let head = get_u64(host, PAGE_HEAD_KEY).unwrap_or(0);
    // The ring's oldest slot may be rewritten while we read: start one later.
    let oldest = head.saturating_sub(PAGE_RING - 2).max(1);
    let same_epoch = asked_epoch == epoch;
    // Another epoch's numbering means nothing here: start over from the oldest page kept.
    let from = if same_epoch {
        after.saturating_add(1)
    } else {
        1
    }
    .max(oldest);
    let mut through = if same_epoch {
        after.min(head)
    } else {
        from - 1
    };
    let mut pages: Vec<Vec<u8>> = Vec::new();
    let mut bytes = 0;
    for seq in from..=head {
        let Some(raw) = host.shared_get(&page_key(seq)).0 else {
            break;
        };
        let Some(page) = Page::decode(&raw) else {
            break;
        };
        if page.seq != seq {
            break; // overwritten while we read: the rest on the next ask
        }
        if !page.from_peer {
            if bytes + raw.len() > MAX_ANSWER_BYTES && !pages.is_empty() {
                break;
            }
            bytes += raw.len();
            pages.push(raw);
        }
        through = seq;
    }
    let mut out = vec![ANSWER_FORMAT];
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&through.to_le_bytes());
    out.extend_from_slice(&(pages.len() as u32).to_le_bytes());
    for page in pages {
        out.extend_from_slice(&(page.len() as u32).to_le_bytes());
        out.extend_from_slice(&page);
    }
    let board = host
        .shared_get(INFLIGHT_KEY)
        .0
        .map(|b| Board::decode(&b))
        .unwrap_or_default();
    let mut work: Vec<WorkEntry> = board
        .sum_where(host.now_ms(), row_ttl_ms, |id| id & REPLICA_ROW == 0)
        .into_iter()
        .collect();
    work.sort_by(|a, b| a.0.cmp(&b.0));
    work.truncate(MAX_WORK_ENTRIES);
    out.extend_from_slice(&(work.len() as u32).to_le_bytes());
    let mut text = String::new();
    for entry in &work {
        text.clear();
        entry.write(&mut text);
        let n = text.len().min(u16::MAX as usize);
        out.extend_from_slice(&(n as u16).to_le_bytes());
        out.extend_from_slice(text.as_bytes().get(..n).unwrap_or_default());
    }
    out
}

/// A decoded answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub epoch: u64,
    pub through: u64,
    pub pages: Vec<Page>,
    /// The replica's own unfinished work per pod.
    pub work: Vec<WorkEntry>,
}

impl Answer {
    /// `None` for anything that is not a whole answer of this format (never trusts a length).
    pub fn decode(bytes: &[u8]) -> Option<Answer> {
        let (&format, rest) = bytes.split_first()?;
        if format != ANSWER_FORMAT {
            return None;
        }
        let epoch = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
        let through = u64::from_le_bytes(rest.get(8..16)?.try_into().ok()?);
        let n = u32::from_le_bytes(rest.get(16..20)?.try_into().ok()?) as usize;
        let mut rest = rest.get(20..)?;
        if n > rest.len() / 4 {
            return None;
        }
        let mut pages = Vec::new();
        for _ in 0..n {
            let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
            let page = rest.get(4..4usize.checked_add(len)?)?;
            pages.push(Page::decode(page)?);
            rest = rest.get(4 + len..)?;
        }
        let m = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        rest = rest.get(4..)?;
        if m > rest.len() / 2 || m > MAX_WORK_ENTRIES {
            return None;
        }
        let mut work = Vec::new();
        for _ in 0..m {
            let len = u16::from_le_bytes(rest.get(..2)?.try_into().ok()?) as usize;
            let text = std::str::from_utf8(rest.get(2..2 + len)?).ok()?;
            work.push(WorkEntry::parse(text)?);
            rest = rest.get(2 + len..)?;
        }
        rest.is_empty().then_some(Answer {
            epoch,
            through,
            pages,
            work,
        })
    }
}

/// Where the leader stands with one replica.
#[derive(Debug, Clone, PartialEq)]
struct Cursor {
    addr: String,
    epoch: u64,
    through: u64,
    /// The ask under way: its call token and when it was sent.
    asking: Option<(u32, u64)>,
    last_ask_ms: u64,
    /// The replica answered with this Envoy's own epoch: it is this Envoy.
    is_self: bool,
}

/// The leader's cursors over every other replica's pages.
#[derive(Debug, Clone, Default)]
pub struct Pullers {
    cursors: Vec<Cursor>,
}

/// One ask to send: the replica and the path to `GET`.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    pub addr: String,
    pub path: String,
}

/// What an answer did.
#[derive(Debug, Clone, PartialEq)]
pub enum Pulled {
    /// Not one of this module's asks.
    Unknown,
    /// The replica's new pages (possibly none, in order) and its work now.
    Fresh(Answer),
    /// The replica is this Envoy: never asked again.
    Itself,
    /// No usable answer (refused, timed out, not this format); asked again next interval.
    Failed,
}

impl Pullers {
    pub fn new(config: &PeersConfig) -> Pullers {
        let mut pullers = Pullers::default();
        pullers.set_members(&config.endpoints);
        pullers
    }

    /// The replicas now (a `cluster`'s members as the admin API lists them): a replica still
    /// listed keeps its place in its pages, a new one starts from its oldest, a gone one is
    /// dropped (at most `MAX_PEERS`).
    pub fn set_members(&mut self, addrs: &[String]) {
        let mut old = std::mem::take(&mut self.cursors);
        for addr in addrs.iter().take(MAX_PEERS) {
            if self.cursors.iter().any(|c| &c.addr == addr) {
                continue;
            }
            let cursor = match old.iter().position(|c| &c.addr == addr) {
                Some(i) => old.swap_remove(i),
                None => Cursor {
                    addr: addr.clone(),
                    epoch: 0,
                    through: 0,
                    asking: None,
                    last_ask_ms: 0,
                    is_self: false,
                },
            };
            self.cursors.push(cursor);
        }
    }

    /// The asks due now; an ask not answered within `timeout_ms` is given up.
    pub fn due(&mut self, config: &PeersConfig, now: u64, timeout_ms: u64) -> Vec<Ask> {
        let mut asks = Vec::new();
        for c in &mut self.cursors {
            if let Some((_, sent)) = c.asking {
                if now.saturating_sub(sent) < timeout_ms {
                    continue;
                }
                c.asking = None;
            }
            if c.is_self || now.saturating_sub(c.last_ask_ms) < config.interval_ms {
                continue;
            }
            c.last_ask_ms = now;
            asks.push(Ask {
                addr: c.addr.clone(),
                path: format!("{}?epoch={}&after={}", config.path, c.epoch, c.through),
            });
        }
        asks
    }

    /// The ask to `addr` went out as call `token` (or could not be sent: `None`).
    pub fn sent(&mut self, addr: &str, token: Option<u32>, now: u64) {
        if let Some(c) = self.cursors.iter_mut().find(|c| c.addr == addr) {
            c.asking = token.map(|t| (t, now));
        }
    }

    /// Takes in the answer to call `token`.
    pub fn on_answer(&mut self, token: u32, status: u32, body: &[u8], own_epoch: u64) -> Pulled {
        let Some(c) = self
            .cursors
            .iter_mut()
            .find(|c| c.asking.is_some_and(|(t, _)| t == token))
        else {
            return Pulled::Unknown;
        };
        c.asking = None;
        let Some(answer) = (status == 200).then(|| Answer::decode(body)).flatten() else {
            return Pulled::Failed;
        };
        if answer.epoch == own_epoch && own_epoch != 0 {
            c.is_self = true;
            return Pulled::Itself;
        }
        c.epoch = answer.epoch;
        c.through = answer.through;
        Pulled::Fresh(answer)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::state::messages::Observation;
    use crate::testing::FakeHost;

    fn page(seq: u64, addr: &str, hashes: &[u64], from_peer: bool) -> Page {
        Page {
            seq,
            observations: vec![Observation {
                addr: addr.into(),
                hashes: hashes.to_vec(),
            }],
            evictions: vec![],
            from_peer,
        }
    }

    fn publish(host: &mut FakeHost, pages: &[Page]) {
        for p in pages {
            host.shared_set(&page_key(p.seq), &p.encode(), None)
                .unwrap();
            host.shared_set(PAGE_HEAD_KEY, &p.seq.to_le_bytes(), None)
                .unwrap();
        }
    }

    fn config() -> PeersConfig {
        PeersConfig {
            endpoints: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
            ..PeersConfig::default()
        }
    }

    #[test]
    fn serves_its_own_pages_after_the_asked_one_and_never_a_replicas() {
        let mut host = FakeHost::new(&Default::default());
        host.shared_set(EPOCH_KEY, &7u64.to_le_bytes(), None)
            .unwrap();
        publish(
            &mut host,
            &[
                page(1, "a:1", &[1], false),
                page(2, "a:1", &[2], true),
                page(3, "b:1", &[3], false),
            ],
        );
        // A first ask (another epoch) gets every own page kept.
        let all = Answer::decode(&answer(&host, "/p?epoch=0&after=0", 3000)).unwrap();
        assert_eq!((all.epoch, all.through), (7, 3));
        assert_eq!(
            all.pages.iter().map(|p| p.seq).collect::<Vec<_>>(),
            vec![1, 3]
        );
        // Then only what is new; nothing new is an empty answer at the same place.
        let next = Answer::decode(&answer(&host, "/p?epoch=7&after=1", 3000)).unwrap();
        assert_eq!(next.pages.iter().map(|p| p.seq).collect::<Vec<_>>(), [3]);
        let none = Answer::decode(&answer(&host, "/p?epoch=7&after=3", 3000)).unwrap();
        assert_eq!((none.through, none.pages.len()), (3, 0));
        // A page ahead of the head (the replica restarted under the same epoch: impossible, but
        // never an error) is an empty answer at the head.
        let ahead = Answer::decode(&answer(&host, "/p?epoch=7&after=99", 3000)).unwrap();
        assert_eq!((ahead.through, ahead.pages.len()), (3, 0));
        // Any query is an answer, never a panic.
        for odd in [
            "/p?after=18446744073709551615&epoch=7",
            "/p?epoch=x&&after",
            "/p?=&=",
        ] {
            assert!(Answer::decode(&answer(&host, odd, 3000)).is_some(), "{odd}");
        }
        // An Envoy that has published nothing yet answers an empty page list.
        let fresh =
            Answer::decode(&answer(&FakeHost::new(&Default::default()), "/p", 3000)).unwrap();
        assert_eq!((fresh.epoch, fresh.through, fresh.pages.len()), (0, 0, 0));
    }

    #[test]
    fn a_puller_follows_a_replica_and_starts_over_when_it_restarts() {
        let cfg = config();
        let mut pullers = Pullers::new(&cfg);
        let asks = pullers.due(&cfg, 1000, 500);
        assert_eq!(asks.len(), 2);
        assert_eq!(asks[0].path, "/kvroute/v1/placements?epoch=0&after=0");
        pullers.sent(&asks[0].addr, Some(11), 1000);
        pullers.sent(&asks[1].addr, Some(12), 1000);
        // Not again while the asks are under way, nor before the interval.
        assert!(pullers.due(&cfg, 1100, 500).is_empty());
        let mut host = FakeHost::new(&Default::default());
        host.shared_set(EPOCH_KEY, &7u64.to_le_bytes(), None)
            .unwrap();
        publish(&mut host, &[page(1, "a:1", &[1], false)]);
        let body = answer(&host, &asks[0].path, 3000);
        assert_eq!(
            pullers.on_answer(11, 200, &body, 5),
            Pulled::Fresh(Answer {
                epoch: 7,
                through: 1,
                pages: vec![page(1, "a:1", &[1], false)],
                work: vec![],
            })
        );
        // The second replica is this Envoy (its answer carries our epoch).
        assert_eq!(pullers.on_answer(12, 200, &body, 7), Pulled::Itself);
        assert_eq!(pullers.on_answer(12, 200, &body, 7), Pulled::Unknown);
        let asks = pullers.due(&cfg, 1300, 500);
        assert_eq!(asks.len(), 1, "itself is not asked again");
        assert_eq!(asks[0].path, "/kvroute/v1/placements?epoch=7&after=1");
        pullers.sent(&asks[0].addr, Some(13), 1300);
        // Garbage or an error status: nothing applied, asked again next interval.
        assert_eq!(pullers.on_answer(13, 200, b"<html>", 5), Pulled::Failed);
        assert_eq!(pullers.due(&cfg, 1500, 500)[0].path, asks[0].path);
        // An ask never answered is given up after the timeout.
        pullers.sent("127.0.0.1:1", Some(14), 1500);
        assert!(pullers.due(&cfg, 1900, 500).is_empty());
        assert_eq!(pullers.due(&cfg, 2000, 500).len(), 1);
    }

    #[test]
    fn a_cluster_of_replicas_keeps_each_ones_place_as_members_change() {
        let cfg = config();
        let mut pullers = Pullers::new(&cfg);
        for ask in pullers.due(&cfg, 1000, 500) {
            pullers.sent(
                &ask.addr,
                Some(if ask.addr.ends_with(":1") { 1 } else { 2 }),
                1000,
            );
        }
        let mut host = FakeHost::new(&Default::default());
        host.shared_set(EPOCH_KEY, &7u64.to_le_bytes(), None)
            .unwrap();
        publish(&mut host, &[page(1, "a:1", &[1], false)]);
        let body = answer(&host, "/p?epoch=0&after=0", 3000);
        assert!(matches!(
            pullers.on_answer(1, 200, &body, 5),
            Pulled::Fresh(_)
        ));
        assert!(matches!(
            pullers.on_answer(2, 200, &body, 7),
            Pulled::Itself
        ));
        // Replica 2 (itself) leaves the listing, replica 3 joins; replica 1 goes on from page 1.
        pullers.set_members(&[
            "127.0.0.1:3".into(),
            "127.0.0.1:1".into(),
            "127.0.0.1:1".into(),
        ]);
        let mut paths: Vec<String> = pullers
            .due(&cfg, 1300, 500)
            .into_iter()
            .map(|a| a.path)
            .collect();
        paths.sort();
        assert_eq!(
            paths,
            [
                "/kvroute/v1/placements?epoch=0&after=0",
                "/kvroute/v1/placements?epoch=7&after=1"
            ]
        );
    }

    #[test]
    fn answers_are_bounded_and_truncations_are_refused() {
        let mut host = FakeHost::new(&Default::default());
        host.shared_set(EPOCH_KEY, &7u64.to_le_bytes(), None)
            .unwrap();
        let big: Vec<u64> = (0..40_000).collect();
        let pages: Vec<Page> = (1..=40).map(|s| page(s, "a:1", &big, false)).collect();
        publish(&mut host, &pages);
        let body = answer(&host, "/p?epoch=7&after=0", 3000);
        assert!(body.len() <= MAX_ANSWER_BYTES + 64, "{}", body.len());
        let first = Answer::decode(&body).unwrap();
        assert!(first.through < 40 && first.through == first.pages.len() as u64);
        let rest = Answer::decode(&answer(
            &host,
            &format!("/p?epoch=7&after={}", first.through),
            3000,
        ));
        assert_eq!(rest.unwrap().pages[0].seq, first.through + 1);
        for cut in 0..body.len().min(400) {
            assert_eq!(Answer::decode(&body[..cut]), None, "cut at {cut}");
        }
        let mut huge = vec![ANSWER_FORMAT];
        huge.extend_from_slice(&[0; 16]);
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Answer::decode(&huge), None);
    }

    #[test]
    fn config_is_checked() {
        assert!(config().validate(None).is_ok());
        let bad = |f: &dyn Fn(&mut PeersConfig)| {
            let mut c = config();
            f(&mut c);
            c.validate(Some("admin")).unwrap_err().field
        };
        assert_eq!(bad(&|c| c.cluster = Some("gw".into())), "peers.endpoints");
        let by_cluster = PeersConfig {
            endpoints: vec![],
            cluster: Some("gw".into()),
            ..config()
        };
        assert!(by_cluster.validate(Some("admin")).is_ok());
        assert_eq!(
            by_cluster.validate(None).unwrap_err().field,
            "admin_cluster"
        );
        assert!(by_cluster.serves("/kvroute/v1/placements"));
        assert_eq!(
            bad(&|c| c.endpoints.push("nope".into())),
            "peers.endpoints[2]"
        );
        assert_eq!(bad(&|c| c.path = "/a?b".into()), "peers.path");
        assert_eq!(bad(&|c| c.path = "relative".into()), "peers.path");
        assert_eq!(bad(&|c| c.interval_ms = 1), "peers.interval_ms");
        assert_eq!(bad(&|c| c.token = Some("a b".into())), "peers.token");
        assert!(config().serves("/kvroute/v1/placements?epoch=1&after=2"));
        assert!(!config().serves("/kvroute/v1/placementsX"));
        assert!(!PeersConfig::default().serves("/kvroute/v1/placements"));
        let with_token = PeersConfig {
            token: Some("s3cret".into()),
            ..config()
        };
        assert!(with_token.admits(Some("s3cret")));
        assert!(!with_token.admits(Some("guess")) && !with_token.admits(None));
        assert!(config().admits(None));
    }
}
