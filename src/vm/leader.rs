//! The leader's bookkeeping, free of host calls: which pods exist (static pools plus members read
//! from the admin API), when each was last polled and what it said, and the load table to publish. The host glue dispatches the polls this asks for and feeds back
//! the answers.

use crate::config::{Config, Members, Role};
use crate::health::{PassiveHealth, Tally};
use crate::pod::load::{LoadTable, PodLoad};
use crate::pod::models::{self, ServedModel};
use crate::pod::prom::{self, Figures, GatewayShare, PodMetrics};
use crate::pod::seats::SeatCap;
use hashbrown::HashMap;

#[derive(Debug, Clone, PartialEq)]
struct PodRecord {
    role: Role,
    /// The first configured pool listing the pod.
    pool: String,
    metrics: PodMetrics,
    metrics_at_ms: u64,
    failing: bool,
    late: bool,
    /// What its last page said about its load (`None` before one was read): for the log lines
    /// on a change.
    figures: Option<Figures>,
    /// The pod's `/v1/models` list as last read, and when it was last asked for (0 = never).
    served: Vec<ServedModel>,
    models_asked_ms: u64,
    /// Samples of its last page that could not be true (`prom::Page::implausible`).
    implausible: u32,
    /// Restarts seen ([`restarted`]), published as `PodLoad::restarts`.
    restarts: u32,
    /// The last poll saw a restart (the caller counts it: `kvroute.pod.restarts`).
    just_restarted: bool,
    /// Its cap on running requests, as its polls show it.
    seats: SeatCap,
}

#[derive(Debug, Default)]
pub struct Leader {
    /// Members per pool, in the config's pool order.
    members: Vec<Vec<String>>,
    pods: HashMap<String, PodRecord>,
    version: u64,
    last_poll_ms: u64,
    last_discovery_ms: u64,
    passive: PassiveHealth,
    /// Where Envoy says each discovered member is (`crate::pd::topology`).
    localities: HashMap<String, crate::pod::locality::Locality>,
}

/// Outcome of one metrics poll.
pub enum PollResult<'a> {
    /// HTTP status and body.
    Answered(u32, &'a [u8]),
    /// Refused or reset (well before the timeout, see `crate::health::poll_timed_out`).
    Failed,
    /// No answer within the poll timeout: the pod is late, its figures stale.
    TimedOut,
}

impl Leader {
    pub fn new(config: &Config) -> Leader {
        let mut leader = Leader {
            members: config
                .pools
                .iter()
                .map(|p| match &p.members {
                    Members::Static(endpoints) => endpoints.clone(),
                    Members::Cluster(_) => Vec::new(),
                })
                .collect(),
            ..Leader::default()
        };
        leader.sync_pods(config);
        leader
    }

    fn sync_pods(&mut self, config: &Config) {
        let mut wanted: Vec<(&String, Role, &String)> = Vec::new();
        for (pool, members) in config.pools.iter().zip(&self.members) {
            for addr in members {
                if wanted.len() < crate::common::MAX_PODS
                    && !wanted.iter().any(|(a, _, _)| *a == addr)
                {
                    wanted.push((addr, pool.role, &pool.name));
                }
            }
        }
        self.pods
            .retain(|addr, _| wanted.iter().any(|(a, _, _)| *a == addr));
        for (addr, role, pool) in wanted {
            let record = self.pods.entry_ref(addr.as_str()).or_insert(PodRecord {
                role,
                pool: pool.clone(),
                metrics: PodMetrics::default(),
                metrics_at_ms: 0,
                failing: false,
                late: false,
                figures: None,
                served: Vec::new(),
                models_asked_ms: 0,
                implausible: 0,
                restarts: 0,
                just_restarted: false,
                seats: SeatCap::default(),
            });
            record.role = role;
            if record.pool != *pool {
                record.pool.clone_from(pool);
            }
        }
    }

    /// Pools whose membership comes from the admin API, if a refresh is due.
    pub fn discovery_due(&mut self, config: &Config, now_ms: u64) -> bool {
        let any = config.peers.cluster.is_some()
            || config
                .pools
                .iter()
                .any(|p| matches!(p.members, Members::Cluster(_)));
        if any && now_ms.saturating_sub(self.last_discovery_ms) >= config.discovery_interval_ms {
            self.last_discovery_ms = now_ms;
            return true;
        }
        false
    }

    /// Applies a fresh `/clusters?format=json` answer to every cluster-backed pool.
    pub fn on_admin_clusters(&mut self, config: &Config, body: &[u8]) {
        for (i, pool) in config.pools.iter().enumerate() {
            let Members::Cluster(cluster) = &pool.members else {
                continue;
            };
            if let (Some(members), Some(slot)) = (
                crate::vm::discovery::members_with_localities(body, cluster),
                self.members.get_mut(i),
            ) {
                slot.clear();
                for (addr, locality) in members {
                    if locality.is_known() {
                        self.localities.insert(addr.clone(), locality);
                    } else {
                        self.localities.remove(&addr);
                    }
                    slot.push(addr);
                }
            }
        }
        self.sync_pods(config);
        let pods = &self.pods;
        self.localities.retain(|addr, _| pods.contains_key(addr));
    }

    /// The pods to poll now, if a round is due.
    pub fn poll_due(&mut self, config: &Config, now_ms: u64) -> Vec<String> {
        if now_ms.saturating_sub(self.last_poll_ms) < config.poll_interval_ms {
            return Vec::new();
        }
        self.last_poll_ms = now_ms;
        let mut addrs: Vec<String> = self.pods.keys().cloned().collect();
        addrs.sort();
        addrs
    }

    /// Applies a poll's outcome, `ours` being this gateway's requests on the pod when the poll was
    /// sent; `true` when it brought fresh metrics.
    ///
    /// A page that names no load gauge kvroute knows (an engine other than vLLM, SGLang, TRT-LLM,
    /// llama.cpp and TGI) makes the pod fresh with waiting and running 0, not stale: the router
    /// would rank it the same either way (a stale pod's figures are replaced by zeros, and zeros
    /// leave the gateway's own work board as the pod's whole load), but stale says its polls are
    /// late, which these are not, and a pool of such pods would then be all stale on every
    /// request: counted as a suspect observer (`kvroute.health.observer_suspect`) and shown as
    /// `pods_stale`, which the shipped alerts and autoscaling read as lost sight of the pods.
    pub fn on_poll(
        &mut self,
        addr: &str,
        result: PollResult<'_>,
        ours: GatewayShare,
        now_ms: u64,
    ) -> bool {
        let Some(record) = self.pods.get_mut(addr) else {
            return false;
        };
        let read = match result {
            PollResult::TimedOut => {
                // It took the connection and is still thinking: alive, its figures stale.
                record.late = true;
                record.failing = false;
                return false;
            }
            PollResult::Answered(200, body) => Some(prom::read(body)),
            _ => None,
        };
        record.late = false;
        record.implausible = 0;
        record.just_restarted = false;
        match read {
            Some(Ok(page)) => {
                record.implausible = page.implausible;
                if restarted(record, &page.metrics) {
                    record.restarts = record.restarts.wrapping_add(1);
                    record.just_restarted = true;
                    record.seats = SeatCap::default();
                    log::info!(
                        "kvroute: pod {addr} restarted (process start {:?} after {:?}, polls failing before: {}): its KV cache is empty, its prefix entries are dropped",
                        page.metrics.started_at,
                        record.metrics.started_at,
                        record.failing
                    );
                }
                if page.figures == Figures::Unknown && record.figures != Some(Figures::Unknown) {
                    log::info!(
                        "kvroute: pod {addr}'s /metrics names no load gauge kvroute reads (vLLM, SGLang, TRT-LLM, llama.cpp, TGI): routed on this gateway's own count of its requests"
                    );
                }
                record.figures = Some(page.figures);
                let seats = record.seats.seats();
                record.seats.observe(&page.metrics);
                if record.seats.seats() != seats {
                    match record.seats.seats() {
                        Some(n) => log::info!(
                            "kvroute: pod {addr} keeps requests waiting while it runs {n} and generates: taken as its cap on running requests (the overload guard's seats; `overload_guard.max_running` overrides)"
                        ),
                        None => log::info!(
                            "kvroute: pod {addr} runs more than {seats:?} requests at once: that was no cap"
                        ),
                    }
                }
                if record.metrics_at_ms > 0 && page.metrics.models != record.metrics.models {
                    // The pod serves other models now (restarted with other weights, or under
                    // other names): its model list is stale too, and a name it dropped would
                    // still be routed to it until the slow interval re-read it. Asked at once.
                    record.models_asked_ms = 0;
                }
                record.metrics = PodMetrics {
                    ours,
                    ..page.metrics
                };
                record.metrics_at_ms = now_ms;
                record.failing = false;
                true
            }
            Some(Err(e)) => {
                if !record.failing {
                    log::warn!(
                        "kvroute: pod {addr}'s /metrics is unusable ({}): not routed until a poll reads it",
                        e.as_str()
                    );
                }
                record.failing = true;
                false
            }
            None => {
                record.failing = true;
                false
            }
        }
    }

    /// The pod's pool and role when its last poll saw it restarted (the caller counts it:
    /// `kvroute.pod.restarts`).
    pub fn restarted(&self, addr: &str) -> Option<(&str, Role)> {
        let record = self.pods.get(addr)?;
        record
            .just_restarted
            .then_some((record.pool.as_str(), record.role))
    }

    /// The pod's pool and role and how many samples of its last page could not be true, when
    /// some could not (the caller counts them: `kvroute.pod.reported_implausible`).
    pub fn implausible(&self, addr: &str) -> Option<(&str, Role, u32)> {
        let record = self.pods.get(addr)?;
        (record.implausible > 0).then_some((record.pool.as_str(), record.role, record.implausible))
    }

    /// The pods whose model list is due: never read (a pod just configured or discovered), or
    /// last asked `models_poll_interval_ms` ago.
    pub fn models_due(&mut self, config: &Config, now_ms: u64) -> Vec<String> {
        let mut due: Vec<String> = self
            .pods
            .iter_mut()
            .filter(|(_, r)| {
                r.models_asked_ms == 0
                    || now_ms.saturating_sub(r.models_asked_ms) >= config.models_poll_interval_ms
            })
            .map(|(addr, r)| {
                r.models_asked_ms = now_ms.max(1);
                addr.clone()
            })
            .collect();
        due.sort();
        due
    }

    /// A `/v1/models` answer. An unreadable one keeps the last list (a pod without the endpoint
    /// is known by its metrics' model label alone); returns whether it was read.
    pub fn on_models(&mut self, addr: &str, result: PollResult<'_>) -> bool {
        let Some(record) = self.pods.get_mut(addr) else {
            return false;
        };
        match result {
            PollResult::Answered(200, body) => match models::parse(body) {
                Some(served) => {
                    record.served = served;
                    true
                }
                None => false,
            },
            _ => false,
        }
    }

    /// A VM's verdicts on the requests it sent `addr` (see `crate::health`).
    pub fn on_outcomes(&mut self, config: &Config, addr: &str, tally: Tally, now_ms: u64) {
        if self.pods.contains_key(addr) {
            self.passive.record(&config.health, addr, tally, now_ms);
        }
    }

    /// Ejects the pods whose requests fail (see `crate::health`); returns how many were ejected now.
    pub fn update_health(&mut self, config: &Config, now_ms: u64) -> u32 {
        let pods: Vec<(&str, Role)> = self
            .pods
            .iter()
            .map(|(addr, r)| (addr.as_str(), r.role))
            .collect();
        self.passive.update(&config.health, &pods, now_ms)
    }

    /// The table to publish, with a new version.
    pub fn table(&mut self, now_ms: u64) -> LoadTable {
        self.version += 1;
        let mut pods: Vec<PodLoad> = self
            .pods
            .iter()
            .map(|(addr, r)| PodLoad {
                addr: addr.clone(),
                role: r.role,
                pool: r.pool.clone(),
                metrics_at_ms: r.metrics_at_ms,
                failing: r.failing,
                late: r.late,
                ejected_until_ms: self.passive.ejected_until(addr),
                metrics: r.metrics.clone(),
                served: r.served.clone(),
                serves: served_names(&r.metrics, &r.served),
                locality: self.localities.get(addr).cloned(),
                restarts: r.restarts,
                seats: r.seats.seats(),
            })
            .collect();
        pods.sort_by(|a, b| a.addr.cmp(&b.addr));
        LoadTable {
            format: crate::pod::load::LOAD_FORMAT,
            version: self.version,
            published_ms: now_ms,
            pods,
        }
    }
}

/// Whether a page read after `record`'s last shows the pod restarted, its KV cache emptied: a
/// process start time other than the last page's (vLLM and SGLang export it), or, where the pod
/// exports none, a page after polls that failed outright (refused, reset, non-200: the server was
/// down, as an engine is while it loads its weights). A poll that only timed out is a busy pod,
/// not a restart; a pod that reports its start time is never judged by its failed polls (a
/// network fault is not a restart). The first page of a pod is no restart: nothing was routed.
fn restarted(record: &PodRecord, page: &PodMetrics) -> bool {
    if record.metrics_at_ms == 0 {
        return false;
    }
    match (record.metrics.started_at, page.started_at) {
        // The same process prints the same start every time (prometheus_client: ten
        // significant digits, 10 ms at today's epoch); half a second is far beyond any rounding
        // and far below any engine's restart (it loads its weights).
        (Some(before), Some(now)) => (now - before).abs() >= 0.5,
        _ => record.failing,
    }
}

/// Every name a pod answers to, each once: the metrics' model label, running adapters, and the
/// model list's ids.
fn served_names(metrics: &PodMetrics, served: &[ServedModel]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let all = metrics
        .models
        .iter()
        .chain(&metrics.adapters)
        .chain(served.iter().map(|m| &m.id));
    for name in all {
        if !names.contains(name) && names.len() < models::MAX_MODELS_PER_POD {
            names.push(name.clone());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &[u8] = b"vllm:num_requests_running 2\nvllm:num_requests_waiting 1\n";

    fn config(json: &str) -> Config {
        Config::parse(json.as_bytes()).unwrap()
    }

    #[test]
    fn a_restart_is_seen_by_its_process_start_or_by_a_page_after_failed_polls() {
        let cfg = config(r#"{"pools":[{"name":"a","endpoints":["10.0.0.1:1","10.0.0.2:1"]}]}"#);
        let mut l = Leader::new(&cfg);
        let started = |at: f64| {
            format!(
                "process_start_time_seconds {at:e}\n{}",
                String::from_utf8_lossy(PAGE)
            )
        };
        let poll = |l: &mut Leader, addr: &str, result: PollResult<'_>, now: u64| {
            l.on_poll(addr, result, GatewayShare::default(), now);
            (
                l.restarted(addr).is_some(),
                l.table(now)
                    .pods
                    .iter()
                    .find(|p| p.addr == addr)
                    .unwrap()
                    .restarts,
            )
        };
        let (a, b) = ("10.0.0.1:1", "10.0.0.2:1");
        let first = started(1.712345678e9);
        // A pod's first page is no restart; the same start again, after a timeout or failed
        // polls (a network fault), neither.
        assert_eq!(
            poll(&mut l, a, PollResult::Answered(200, first.as_bytes()), 1000),
            (false, 0)
        );
        assert_eq!(poll(&mut l, a, PollResult::TimedOut, 1100), (false, 0));
        assert_eq!(
            poll(&mut l, a, PollResult::Answered(200, first.as_bytes()), 1200),
            (false, 0)
        );
        assert_eq!(poll(&mut l, a, PollResult::Failed, 1300), (false, 0));
        assert_eq!(
            poll(&mut l, a, PollResult::Answered(200, first.as_bytes()), 1400),
            (false, 0)
        );
        // A later start, even without a failed poll between (a restart quicker than a poll): one
        // restart, counted once.
        let second = started(1.712345999e9);
        assert_eq!(
            poll(
                &mut l,
                a,
                PollResult::Answered(200, second.as_bytes()),
                1500
            ),
            (true, 1)
        );
        assert_eq!(
            poll(
                &mut l,
                a,
                PollResult::Answered(200, second.as_bytes()),
                1600
            ),
            (false, 1)
        );
        // A pod that exports no start (llama.cpp): back after polls that failed outright is a
        // restart; after a late one, not.
        assert_eq!(
            poll(&mut l, b, PollResult::Answered(200, PAGE), 1000),
            (false, 0)
        );
        assert_eq!(poll(&mut l, b, PollResult::TimedOut, 1100), (false, 0));
        assert_eq!(
            poll(&mut l, b, PollResult::Answered(200, PAGE), 1200),
            (false, 0)
        );
        assert_eq!(poll(&mut l, b, PollResult::Failed, 1300), (false, 0));
        assert_eq!(
            poll(&mut l, b, PollResult::Answered(503, b""), 1400),
            (false, 0)
        );
        assert_eq!(
            poll(&mut l, b, PollResult::Answered(200, PAGE), 1500),
            (true, 1)
        );
        assert_eq!(
            poll(&mut l, b, PollResult::Answered(200, PAGE), 1600),
            (false, 1)
        );
    }

    #[test]
    fn a_cap_on_running_requests_its_polls_show_is_in_the_table_until_a_restart() {
        let cfg = config(r#"{"pools":[{"name":"a","endpoints":["10.0.0.1:1"]}]}"#);
        let mut l = Leader::new(&cfg);
        let a = "10.0.0.1:1";
        let page = |started: f64, waiting: u32, running: u32, generated: u32| {
            format!(
                "process_start_time_seconds {started:e}\n\
                 vllm:num_requests_waiting {waiting}\nvllm:num_requests_running {running}\n\
                 vllm:generation_tokens_total{{engine=\"0\"}} {generated}\n"
            )
        };
        let poll = |l: &mut Leader, body: String, now: u64| {
            l.on_poll(
                a,
                PollResult::Answered(200, body.as_bytes()),
                GatewayShare::default(),
                now,
            );
            l.table(now).pods[0].seats
        };
        let mut now = 1000;
        for i in 0..=crate::pod::seats::STREAK {
            now += 100;
            poll(&mut l, page(1.7e9, 20, 8, 100 * i), now);
        }
        assert_eq!(poll(&mut l, page(1.7e9, 20, 8, 10_000), now + 100), Some(8));
        // The new process starts over: nothing learned of the old one holds.
        assert_eq!(poll(&mut l, page(1.8e9, 20, 8, 10_100), now + 200), None);
    }

    #[test]
    fn polls_feed_the_table_and_failures_mark_pods() {
        let cfg = config(r#"{"pools":[{"name":"a","endpoints":["10.0.0.1:1","10.0.0.2:1"]}]}"#);
        let mut l = Leader::new(&cfg);
        assert_eq!(l.poll_due(&cfg, 1000).len(), 2);
        assert!(l.poll_due(&cfg, 1100).is_empty(), "not before the interval");
        assert!(l.on_poll(
            "10.0.0.1:1",
            PollResult::Answered(200, PAGE),
            GatewayShare::default(),
            1000
        ));
        assert!(!l.on_poll(
            "10.0.0.2:1",
            PollResult::Answered(200, b"<html>garbage</html>"),
            GatewayShare::default(),
            1000
        ));
        assert!(
            !l.on_poll(
                "9.9.9.9:1",
                PollResult::Failed,
                GatewayShare::default(),
                1000
            ),
            "unknown pods are ignored"
        );
        let t = l.table(1000);
        assert_eq!(t.pods.len(), 2);
        assert!(t.pods[0].is_fresh(1000, 2000) && t.pods[0].metrics.running == 2.0);
        // What this gateway had on the pod when the poll was sent is published with the figures.
        let ours = GatewayShare {
            prefilling: 1.0,
            inflight: 3.0,
        };
        assert!(l.on_poll("10.0.0.1:1", PollResult::Answered(200, PAGE), ours, 1000));
        assert_eq!(l.table(1000).pods[0].metrics.ours, ours);
        assert!(!t.pods[1].is_fresh(1000, 2000) && t.pods[1].failing);
        l.on_poll(
            "10.0.0.1:1",
            PollResult::TimedOut,
            GatewayShare::default(),
            1200,
        );
        let late = l.table(1200);
        assert!(
            late.pods[0].late && !late.pods[0].failing,
            "a late poll is not a failure"
        );
        assert_eq!(
            late.pods[0].metrics.running, 2.0,
            "the last figures are kept"
        );
        l.on_poll(
            "10.0.0.1:1",
            PollResult::Failed,
            GatewayShare::default(),
            1300,
        );
        let t2 = l.table(1300);
        assert!(t2.pods[0].failing && !t2.pods[0].late, "a refused poll is");
        assert!(t2.version > t.version);
    }

    #[test]
    fn a_page_without_known_load_gauges_leaves_the_pod_routable_on_our_own_view() {
        let cfg = config(r#"{"pools":[{"name":"a","endpoints":["10.0.0.1:1","10.0.0.2:1"]}]}"#);
        let mut l = Leader::new(&cfg);
        let other_engine = b"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\nmy_engine_slots_busy 3\n";
        let ours = GatewayShare {
            prefilling: 1.0,
            inflight: 2.0,
        };
        assert!(l.on_poll(
            "10.0.0.1:1",
            PollResult::Answered(200, other_engine),
            ours,
            1000
        ));
        assert!(l.on_poll(
            "10.0.0.2:1",
            PollResult::Answered(200, PAGE),
            GatewayShare::default(),
            1000
        ));
        let t = l.table(1000);
        let unknown = &t.pods[0];
        assert_eq!(
            crate::health::health_of(unknown, 1000, cfg.stale_after_ms),
            crate::health::Health::Fresh
        );
        assert!(!unknown.failing && !unknown.late);
        assert_eq!(
            (unknown.metrics.waiting, unknown.metrics.running),
            (0.0, 0.0),
            "nothing beyond the gateway's own requests"
        );
        assert_eq!(unknown.metrics.ours, ours);
        assert_eq!(t.pods[1].metrics.running, 2.0);
        // Back to a known engine's page (a restart into vLLM): its figures are read again.
        assert!(l.on_poll(
            "10.0.0.1:1",
            PollResult::Answered(200, PAGE),
            GatewayShare::default(),
            1100
        ));
        assert_eq!(l.table(1100).pods[0].metrics.running, 2.0);
        // Not a metrics page, or an empty one: down.
        for body in [&b"<!DOCTYPE html><html></html>"[..], b"", b"{\"ok\":true}"] {
            assert!(!l.on_poll(
                "10.0.0.1:1",
                PollResult::Answered(200, body),
                GatewayShare::default(),
                1200
            ));
            let t = l.table(1200);
            assert_eq!(
                crate::health::health_of(&t.pods[0], 1200, cfg.stale_after_ms),
                crate::health::Health::Down,
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn model_lists_are_read_at_once_then_on_the_slow_interval() {
        let cfg = config(r#"{"pools":[{"name":"a","endpoints":["10.0.0.1:1","10.0.0.2:1"]}]}"#);
        let mut l = Leader::new(&cfg);
        assert_eq!(l.models_due(&cfg, 1000).len(), 2, "new pods at once");
        assert!(l
            .models_due(&cfg, 1000 + cfg.models_poll_interval_ms - 1)
            .is_empty());
        let list = br#"{"data":[{"id":"base","root":"org/base"},{"id":"lora-a","parent":"base"}]}"#;
        assert!(l.on_models("10.0.0.1:1", PollResult::Answered(200, list)));
        assert!(!l.on_models("10.0.0.2:1", PollResult::Answered(404, b"{}")));
        assert!(l.on_poll(
            "10.0.0.1:1",
            PollResult::Answered(200, PAGE),
            GatewayShare::default(),
            1000
        ));
        let t = l.table(1000);
        assert_eq!(t.pods[0].serves, vec!["base", "lora-a"]);
        assert!(t.pods[1].serves.is_empty(), "unknown: any model");
        // A failed read keeps the last list.
        assert!(!l.on_models("10.0.0.1:1", PollResult::Failed));
        assert_eq!(l.table(1001).pods[0].served.len(), 2);
        assert_eq!(
            l.models_due(&cfg, 1000 + cfg.models_poll_interval_ms).len(),
            2
        );
    }

    #[test]
    fn a_pod_whose_metrics_name_other_models_has_its_model_list_read_again_at_once() {
        let cfg = config(r#"{"pools":[{"name":"a","endpoints":["10.0.0.1:1","10.0.0.2:1"]}]}"#);
        let mut l = Leader::new(&cfg);
        assert_eq!(l.models_due(&cfg, 1000).len(), 2);
        let page = |model: &str| {
            format!("vllm:num_requests_running{{model_name=\"{model}\"}} 0\nvllm:num_requests_waiting{{model_name=\"{model}\"}} 0\n")
        };
        for at in [1000, 1200] {
            for pod in ["10.0.0.1:1", "10.0.0.2:1"] {
                let body = page("base");
                assert!(l.on_poll(
                    pod,
                    PollResult::Answered(200, body.as_bytes()),
                    GatewayShare::default(),
                    at
                ));
            }
        }
        assert!(l.models_due(&cfg, 1400).is_empty(), "nothing changed");
        let body = page("other");
        assert!(l.on_poll(
            "10.0.0.2:1",
            PollResult::Answered(200, body.as_bytes()),
            GatewayShare::default(),
            1400
        ));
        assert_eq!(l.models_due(&cfg, 1400), vec!["10.0.0.2:1".to_string()]);
        assert!(l.models_due(&cfg, 1600).is_empty(), "asked once");
    }

    #[test]
    fn discovery_replaces_cluster_members() {
        let cfg = config(
            r#"{"admin_cluster":"admin","pools":[{"name":"a","cluster":"pool"},{"name":"s","endpoints":["1.1.1.1:1"]}]}"#,
        );
        let mut l = Leader::new(&cfg);
        assert!(l.discovery_due(&cfg, 5000));
        assert!(!l.discovery_due(&cfg, 5001));
        let admin = |ips: &[&str]| {
            let hosts: Vec<String> = ips
                .iter()
                .map(|ip| {
                    format!(
                        r#"{{"address":{{"socket_address":{{"address":"{ip}","port_value":80}}}}}}"#
                    )
                })
                .collect();
            format!(
                r#"{{"cluster_statuses":[{{"name":"pool","host_statuses":[{}]}}]}}"#,
                hosts.join(",")
            )
        };
        l.on_admin_clusters(&cfg, admin(&["10.0.0.1", "10.0.0.2"]).as_bytes());
        assert_eq!(l.table(0).pods.len(), 3);
        l.on_admin_clusters(&cfg, admin(&["10.0.0.2"]).as_bytes());
        let t = l.table(0);
        let addrs: Vec<&str> = t.pods.iter().map(|p| p.addr.as_str()).collect();
        assert_eq!(addrs, vec!["1.1.1.1:1", "10.0.0.2:80"]);
        l.on_admin_clusters(&cfg, b"{broken");
        assert_eq!(
            l.table(0).pods.len(),
            2,
            "a broken answer keeps the last membership"
        );
    }
}
