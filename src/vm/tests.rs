//! Several VMs of one Envoy on the fake host: election, publishing and catch-up, the boards under
//! lost races, and values written by another module version.

use super::*;
use crate::state::{page_key, FITS_KEY, INFLIGHT_KEY, PAGE_RING, SNAPSHOT_KEY};
use crate::testing::{FakeHost, Store};
use crate::work::PodWork;
use std::cell::RefCell;
use std::rc::Rc;

pub const PODS: [&str; 2] = ["10.0.0.1:8000", "10.0.0.2:8000"];

pub fn metrics(model: &str, waiting: u32) -> Vec<u8> {
    format!(
        "vllm:num_requests_waiting{{model_name=\"{model}\"}} {waiting}\n\
         vllm:num_requests_running{{model_name=\"{model}\"}} 0\n\
         vllm:kv_cache_usage_perc{{model_name=\"{model}\"}} 0.1\n"
    )
    .into_bytes()
}

pub fn config(extra: &str) -> Config {
    Config::parse(
        format!(
            r#"{{"pools":[{{"name":"p","endpoints":["{}","{}"]}}]{extra}}}"#,
            PODS[0], PODS[1]
        )
        .as_bytes(),
    )
    .unwrap()
}

/// A prefill of `tokens` uncached tokens on `addr`, with nothing ahead of it, predicted `ms`.
fn prefill_on(addr: &str, tokens: f64, ms: f64) -> crate::router::FirstToken {
    crate::router::FirstToken {
        addr: addr.to_string(),
        uncached_tokens: tokens,
        prompt_tokens: tokens,
        held_prefix: 0,
        tokens,
        decoding: 0.0,
        predicted_ms: ms,
        adapter_load_ms: 0.0,
        warm_load_ms: 0.0,
    }
}

pub struct Cluster {
    pub store: Rc<RefCell<Store>>,
    pub vms: Vec<(Vm, FakeHost)>,
    /// Every pod's `/v1/models` answer (`None`: 404, an engine without one).
    pub models: Option<Vec<u8>>,
    /// Appended to every pod's metrics page.
    pub extra_metrics: String,
}

impl Cluster {
    pub fn new(config: &Config, n: usize) -> Cluster {
        let store = Rc::new(RefCell::new(Store::default()));
        let vms = (0..n)
            .map(|i| {
                (
                    Vm::new(config.clone(), None, 0x1000 + i as u64),
                    FakeHost::new(&store),
                )
            })
            .collect();
        Cluster {
            store,
            vms,
            models: None,
            extra_metrics: String::new(),
        }
    }

    /// Every VM ticks once at its own clock; the leader's polls are answered at once (other calls
    /// are left for the test).
    pub fn tick(&mut self) {
        for (vm, host) in &mut self.vms {
            let now = host.now_ms();
            vm.tick(host, now);
            for (token, call) in host.take_calls() {
                if call.path == "/metrics" {
                    let mut page = metrics("m", 0);
                    page.extend_from_slice(self.extra_metrics.as_bytes());
                    vm.on_call_response(host, token, 200, &page, now);
                } else if call.path == "/v1/models" {
                    match &self.models {
                        Some(body) => vm.on_call_response(host, token, 200, body, now),
                        None => vm.on_call_response(host, token, 404, b"{}", now),
                    }
                } else {
                    host.calls.push((token, call)); // for the test to answer
                }
            }
        }
    }

    pub fn advance_ms(&mut self, ms: u64) {
        for (_, host) in &mut self.vms {
            host.advance_ms(ms);
        }
    }

    pub fn leaders(&self) -> Vec<usize> {
        (0..self.vms.len())
            .filter(|i| self.vms[*i].0.is_leader())
            .collect()
    }

    /// Ticks until every VM has a load table with both pods.
    pub fn ready(&mut self) {
        for _ in 0..5 {
            self.tick();
            self.advance_ms(100);
        }
        for (vm, _) in &self.vms {
            assert_eq!(vm.router.load_table().pods.len(), 2);
        }
    }
}

#[test]
fn one_vm_leads_and_another_takes_over_when_it_stops_ticking() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 3);
    c.ready();
    assert_eq!(c.leaders(), vec![0], "the first to tick took the lease");
    // VM 0 stops ticking (its worker hangs or its VM was reloaded): within the lease the others wait.
    let (_, rest) = c.vms.split_at_mut(1);
    for _ in 0..((cfg.leader_lease_ms / 100) + 2) {
        for (vm, host) in rest.iter_mut() {
            host.advance_ms(100);
            let now = host.now_ms();
            vm.tick(host, now);
        }
    }
    let leaders: Vec<usize> = (1..3).filter(|i| c.vms[*i].0.is_leader()).collect();
    assert_eq!(leaders.len(), 1, "exactly one successor: {leaders:?}");
    let successor = leaders[0];
    assert_eq!(c.vms[successor].1.counter(Counter::LeaderChanges), 1);
    // The old leader comes back: it finds the lease held and steps down; no split brain.
    c.advance_ms(100);
    c.tick();
    assert_eq!(c.leaders(), vec![successor]);
}

#[test]
fn a_vm_a_whole_page_ring_behind_reloads_the_snapshot() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 3);
    c.ready();
    let (leader, worker, laggard) = (0, 1, 2);
    // The worker routes 70 distinct prompts; the leader publishes a page per tick. The laggard
    // neither ticks nor routes meanwhile.
    let mut all = Vec::new();
    for i in 0..70u64 {
        let hashes: Vec<u64> = (0..4).map(|b| i * 100 + b + 1).collect();
        let (vm, host) = &mut c.vms[worker];
        vm.observe(
            host,
            Observation {
                addr: PODS[(i % 2) as usize].to_string(),
                hashes: hashes.clone(),
            },
        );
        all.push(hashes);
        let (vm, host) = &mut c.vms[leader];
        host.advance_ms(50);
        let now = host.now_ms();
        vm.tick(host, now);
    }
    let head = get_u64(&c.vms[leader].1, PAGE_HEAD_KEY).unwrap();
    assert!(head >= PAGE_RING + 2, "head {head}");
    let (vm, host) = &mut c.vms[laggard];
    assert!(vm.router.affinity.applied_page + PAGE_RING < head);
    vm.sync_pages(host);
    for hashes in &all {
        let holders: usize = vm
            .router
            .affinity
            .index()
            .match_lengths(hashes, 64)
            .iter()
            .filter(|n| **n == hashes.len())
            .count();
        assert_eq!(holders, 1, "{hashes:?} is known after the catch-up");
    }
    // It continues from the ring: a few more syncs reach the head.
    for _ in 0..3 {
        vm.sync_pages(host);
    }
    assert_eq!(vm.router.affinity.applied_page, head);
}

#[test]
fn a_work_row_that_loses_every_race_is_written_on_the_next_tick() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 2);
    c.ready();
    c.store.borrow_mut().lose_cas_races = 1000;
    let (vm, host) = &mut c.vms[1];
    vm.router.work.inflight_start(PODS[0]);
    let now = host.now_ms();
    vm.write_inflight_row(host, now);
    let others = |c: &Cluster| {
        let (bytes, _) = c.vms[0].1.shared_get(INFLIGHT_KEY);
        Board::decode(&bytes.unwrap_or_default()).others(0x1000, c.vms[0].1.now_ms(), 3000)
    };
    assert!(others(&c).get(PODS[0]).is_none(), "every attempt lost");
    c.store.borrow_mut().lose_cas_races = 0;
    let (vm, host) = &mut c.vms[1];
    let now = host.now_ms();
    vm.tick(host, now);
    assert_eq!(
        others(&c).get(PODS[0]).copied(),
        Some(PodWork {
            inflight: 1,
            ..PodWork::default()
        }),
        "written as soon as a race is won"
    );
}

#[test]
fn values_another_module_version_wrote_are_never_misread() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 2);
    // Before this version's first tick, another version left its values in every key.
    for key in [
        LEASE_KEY,
        LOAD_KEY,
        INFLIGHT_KEY,
        FITS_KEY,
        SNAPSHOT_KEY,
        &page_key(1),
    ] {
        let foreign: &[u8] = b"1 5 10.0.0.1:8000=99\n{\"version\":9,\"pods\":[]}";
        let (_, host) = &mut c.vms[0];
        let _ = host.shared_set(key, foreign, None);
    }
    set_u64(&mut c.vms[0].1, PAGE_HEAD_KEY, 1);
    c.ready();
    assert_eq!(c.leaders().len(), 1, "the unreadable lease was taken");
    let (vm, host) = &mut c.vms[1];
    let now = host.now_ms();
    vm.read_inflight_board(host, now);
    // The foreign in-flight entry is not counted against the pod ...
    assert_eq!(vm.router.work.of(PODS[0]), PodWork::default());
    // ... and the foreign page is not applied as observations.
    vm.sync_pages(host);
    assert_eq!(vm.router.affinity.index_entries(), 0);
}

#[test]
fn a_leader_that_lost_the_lease_mid_tick_writes_nothing() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 2);
    c.ready();
    assert_eq!(c.leaders(), vec![0]);
    // VM 0's worker stops after its election; meanwhile the lease expires and VM 1 takes it.
    let (vm, host) = &mut c.vms[0];
    vm.observe(
        host,
        Observation {
            addr: PODS[0].to_string(),
            hashes: vec![1, 2, 3],
        },
    );
    let successor = Lease {
        holder: 0x1001,
        expires_ms: host.now_ms() + 10_000,
    };
    host.shared_set(LEASE_KEY, &successor.encode(), None)
        .unwrap();
    let head = get_u64(host, PAGE_HEAD_KEY);
    let table = host.shared_get(LOAD_KEY);
    let now = host.now_ms();
    vm.lead(host, now);
    assert!(!vm.is_leader(), "it stepped down");
    assert_eq!(get_u64(host, PAGE_HEAD_KEY), head, "no page published");
    assert_eq!(host.shared_get(LOAD_KEY), table, "no table published");
}

/// Two Envoys (two stores, two VMs each) configured as replicas of each other (`peers`), the
/// same list on both, each its own address included. A replica's ask is answered from the store
/// of the Envoy at its destination.
#[test]
fn replicas_learn_each_others_placements_without_echo() {
    const GATEWAYS: [&str; 2] = ["10.9.0.1:80", "10.9.0.2:80"];
    let cfg = config(&format!(
        r#","peers":{{"endpoints":["{}","{}"],"interval_ms":100}}"#,
        GATEWAYS[0], GATEWAYS[1]
    ));
    let mut envoys = [Cluster::new(&cfg, 2), Cluster::new(&cfg, 2)];
    // Distinct VM ids (so distinct epochs) in the two Envoys.
    for (i, (vm, _)) in envoys[1].vms.iter_mut().enumerate() {
        vm.id = 0x2000 + i as u64;
    }
    let mut asks_of = [[0usize; 2]; 2];
    let round = |envoys: &mut [Cluster; 2], asks_of: &mut [[usize; 2]; 2]| {
        for e in 0..2 {
            envoys[e].tick();
            for v in 0..2 {
                let calls = envoys[e].vms[v].1.take_calls();
                for (token, call) in calls {
                    let dest = call
                        .headers
                        .iter()
                        .find(|(h, _)| *h == crate::headers::DESTINATION);
                    let target = GATEWAYS
                        .iter()
                        .position(|g| Some(*g) == dest.map(|d| d.1.as_str()));
                    let Some(target) = target else { continue };
                    asks_of[e][target] += 1;
                    let body = peers::answer(
                        &envoys[target].vms[0].1,
                        &call.path,
                        crate::work::ROW_TTL_MS,
                    );
                    let (vm, host) = &mut envoys[e].vms[v];
                    let now = host.now_ms();
                    vm.on_call_response(host, token, 200, &body, now);
                }
            }
            envoys[e].advance_ms(100);
        }
    };
    for _ in 0..5 {
        round(&mut envoys, &mut asks_of);
    }
    // A worker of Envoy 0 routes a prompt to pod 0; its 640 uncached tokens are queued there.
    let hashes: Vec<u64> = (100..140).collect();
    let (vm, host) = &mut envoys[0].vms[1];
    vm.observe(
        host,
        Observation {
            addr: PODS[0].to_string(),
            hashes: hashes.clone(),
        },
    );
    let first = prefill_on(PODS[0], 640.0, 100.0);
    let now = host.now_ms();
    let queued = vm.router.work.prefill_start(&first, now, Some(60_000));
    vm.write_inflight_row(host, now);
    for _ in 0..4 {
        round(&mut envoys, &mut asks_of);
    }
    for (v, (vm, host)) in envoys[1].vms.iter().enumerate() {
        let slot = vm.router.affinity.slot_of(PODS[0]).unwrap();
        assert_eq!(
            vm.router.affinity.index().match_lengths(&hashes, 64)[slot],
            hashes.len(),
            "VM {v} of the other Envoy knows the placement"
        );
        assert_eq!(
            host.counter(Counter::PeerBlocksLearned) > 0,
            vm.is_leader(),
            "only its leader asked"
        );
    }
    // Every VM of Envoy 1 counts Envoy 0's queued prefill as work ahead on pod 0 (from the row its
    // leader wrote), once.
    for (v, (vm, host)) in envoys[1].vms.iter_mut().enumerate() {
        let now = host.now_ms();
        vm.read_inflight_board(host, now);
        let work = vm.router.work.of(PODS[0]);
        assert_eq!(
            (work.prefill_tokens, work.prefill_requests),
            (640, 1),
            "VM {v}"
        );
    }
    // Envoy 0 does not count its own work twice (the other replica serves none of it back).
    let (vm, host) = &mut envoys[0].vms[0];
    let now = host.now_ms();
    vm.read_inflight_board(host, now);
    assert_eq!(vm.router.work.of(PODS[0]).prefill_tokens, 640);
    // The prefill ends: the other replica stops counting it a pull later.
    let (vm, host) = &mut envoys[0].vms[1];
    let now = host.now_ms();
    vm.router.work.prefill_done(queued, now);
    vm.write_inflight_row(host, now);
    for _ in 0..3 {
        round(&mut envoys, &mut asks_of);
    }
    let (vm, host) = &mut envoys[1].vms[1];
    let now = host.now_ms();
    vm.read_inflight_board(host, now);
    assert_eq!(vm.router.work.of(PODS[0]).prefill_tokens, 0);
    // What Envoy 1 learned is not served back: its answer holds no pages at all.
    let served = peers::Answer::decode(&peers::answer(
        &envoys[1].vms[0].1,
        "/x?epoch=0&after=0",
        crate::work::ROW_TTL_MS,
    ))
    .unwrap();
    assert!(served.pages.is_empty(), "{served:?}");
    // Each Envoy asked itself once, recognised itself, and kept asking the other.
    for (e, asks) in asks_of.iter().enumerate() {
        assert_eq!(asks[e], 1, "Envoy {e} asked itself {} times", asks[e]);
        assert!(
            asks[1 - e] >= 8,
            "Envoy {e} asked the other {} times",
            asks[1 - e]
        );
    }
}

#[test]
fn a_poll_is_read_against_the_requests_on_the_pod_when_it_was_sent() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 2);
    c.ready();
    let leader = c.leaders()[0];
    let worker = 1 - leader;
    // The other worker has a prefill waiting on the first pod.
    let (vm, host) = &mut c.vms[worker];
    let now = host.now_ms();
    vm.router.work.inflight_start(PODS[0]);
    let first = prefill_on(PODS[0], 7000.0, 50.0);
    let id = vm.router.work.prefill_start(&first, now, Some(60_000));
    vm.write_inflight_row(host, now);
    // The leader sends its polls now ...
    c.advance_ms(cfg.poll_interval_ms);
    let (vm, host) = &mut c.vms[leader];
    let now = host.now_ms();
    vm.tick(host, now);
    let polls: Vec<(u32, String)> = host
        .take_calls()
        .into_iter()
        .filter(|(_, call)| call.path == "/metrics")
        .map(|(token, call)| (token, call.authority))
        .collect();
    assert_eq!(polls.len(), 2);
    // ... the request finishes before the answers come, which still count it as waiting.
    let (vm, host) = &mut c.vms[worker];
    let now = host.now_ms();
    assert!(vm.router.work.prefill_done(id, now));
    vm.router.work.inflight_end(PODS[0]);
    vm.write_inflight_row(host, now);
    let (vm, host) = &mut c.vms[leader];
    let now = host.now_ms();
    for (token, _) in &polls {
        vm.on_call_response(host, *token, 200, &metrics("m", 1), now);
    }
    c.advance_ms(10);
    c.tick();
    for (vm, _) in &c.vms {
        let table = vm.router.load_table();
        let ours = |addr: &str| {
            table
                .pods
                .iter()
                .find(|p| p.addr == addr)
                .map(|p| p.metrics.ours)
        };
        assert_eq!(
            ours(PODS[0]),
            Some(crate::pod::prom::GatewayShare {
                prefilling: 1.0,
                inflight: 1.0,
            }),
            "ours when the poll was sent, though finished since"
        );
        assert_eq!(ours(PODS[1]), Some(Default::default()));
    }
}

#[test]
fn impossible_gauges_are_clamped_and_counted_per_pod() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 1);
    c.extra_metrics = "vllm:num_requests_waiting{model_name=\"m\"} 1e300\n".to_string();
    c.ready();
    let (vm, host) = &c.vms[0];
    for pod in PODS {
        let counted = host.counter_where(Counter::PodReportedImplausible, metrics::POD, pod);
        assert!(counted >= 1, "{pod}: {counted}");
        let table = vm.router.load_table();
        let waiting = table
            .pods
            .iter()
            .find(|p| p.addr == pod)
            .map(|p| p.metrics.waiting);
        assert_eq!(
            waiting,
            Some(crate::pod::prom::MAX_POD_REQUESTS),
            "{pod}: still the fullest pod"
        );
    }
}

#[test]
fn a_poll_envoy_ended_without_an_answer_is_a_failed_poll() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 1);
    c.ready();
    c.advance_ms(cfg.poll_interval_ms);
    let (vm, host) = &mut c.vms[0];
    let now = host.now_ms();
    vm.tick(host, now);
    let polls: Vec<u32> = host
        .take_calls()
        .into_iter()
        .filter(|(_, call)| call.path == "/metrics")
        .map(|(token, _)| token)
        .collect();
    assert_eq!(polls.len(), 2);
    let failures = host.counter(Counter::PollFailures);
    // Status 0, no body: the host's word for a reset or an answer past its buffer.
    for token in polls {
        vm.on_call_response(host, token, 0, b"", now + 1);
    }
    assert_eq!(host.counter(Counter::PollFailures), failures + 2);
    assert!(vm.is_leader());
}

/// A prompt one worker routed to its holder after the holder's process restarted, and that the
/// index was not told of again (it was held), is held there in every worker once the restart is
/// seen: the other workers never heard of that routing, and asked for the prompt they would send
/// it elsewhere, a second recompute while the first runs on the new process.
#[test]
fn what_one_worker_routed_to_a_restarted_pod_after_its_start_is_held_there_in_every_worker() {
    let cfg = config("");
    let mut c = Cluster::new(&cfg, 2);
    let started = |at_ms: u64| format!("process_start_time_seconds {:e}\n", at_ms as f64 / 1e3);
    c.extra_metrics = started(c.vms[0].1.now_ms() - 60_000);
    c.ready();
    let leader = c.leaders()[0];
    let worker = 1 - leader;
    let prompt: Vec<u64> = (1..=8).collect();
    let route = |c: &mut Cluster, hashes: &[u64], held: usize| {
        let (vm, host) = &mut c.vms[worker];
        let now = host.now_ms();
        let observation = Observation {
            addr: PODS[0].to_string(),
            hashes: hashes.to_vec(),
        };
        vm.observe_routing(host, observation, held, now);
    };
    route(&mut c, &prompt, 0);
    for _ in 0..3 {
        c.tick();
        c.advance_ms(100);
    }
    // The pod restarts; the worker routes the prompt again (with a new last block) before any
    // poll shows it, as a hit the index is not told of again.
    let restart_ms = c.vms[worker].1.now_ms();
    c.advance_ms(50);
    let mut again = prompt.clone();
    again.push(99);
    route(&mut c, &again, prompt.len());
    c.extra_metrics = started(restart_ms);
    for _ in 0..4 {
        c.tick();
        c.advance_ms(100);
    }
    for (i, (vm, _)) in c.vms.iter().enumerate() {
        assert_eq!(
            vm.router.load_table().pods[0].restarts,
            1,
            "VM {i} saw the restart"
        );
        let slot = vm.router.affinity.slot_of(PODS[0]).unwrap();
        assert_eq!(
            vm.router.affinity.index().match_lengths(&prompt, 64)[slot],
            prompt.len(),
            "VM {i} (the worker is {worker}) holds the prompt on the restarted pod"
        );
    }
}
