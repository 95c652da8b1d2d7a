//! Fuzz targets for every kvroute parser and decoder that reads bytes from outside the plugin, and
//! the properties each is held to beyond "never panics". One function per target (the libFuzzer
//! binaries in `fuzz_targets/` only call them), so the checks also run on the committed corpora
//! without instrumentation (`tests/corpus.rs`).
//!
//! | target           | bytes from                          | checked besides no panic                               |
//! |------------------|-------------------------------------|--------------------------------------------------------|
//! | `request_body`   | the client (chat / completions / responses) | parser memory bound; the same view or refusal as the whole-tree parser it replaced; a budget only refuses what it would route; the body routed twice through a VM (and its inline prefill) ends with no work left counted and only known pods named |
//! | `prom`           | a pod's `/metrics`                  | linear memory; values finite, ≥ 0, KV use ≤ 1; polled into the leader, published, read back equal and routed on |
//! | `admin_clusters` | Envoy's admin `/clusters` JSON      | members sorted, unique, each an `ip:port`; at most 64 pods; every member survives the work board's encoding |
//! | `config`         | the plugin configuration            | a parsed config re-validates and runs: VMs elect, poll, route a request |
//! | `lease`          | shared data `kvroute.lease`         | decode ∘ encode = id, byte-exact; a claim is ours or none |
//! | `load_table`     | shared data `kvroute.load`          | linear memory; round trip; adopted by a VM and routed on |
//! | `messages`       | the shared observation queue        | linear memory; round trip; drained by a leader        |
//! | `pages`          | shared data `kvroute.idx.*`          | linear memory; round trip; applied and re-snapshotted |
//! | `work_board`     | shared data `kvroute.inflight`      | linear memory; round trip of sums; adopted and routed on |
//! | `fits_board`     | shared data `kvroute.fits`          | linear memory; encode ∘ decode idempotent; adopted fits give finite predictions |
//! | `inline_prefill` | the prefill pod's answer            | the decode body is the client's with only the pod's `kv_transfer_params`; 4xx passed back as is |
//! | `usage`          | a pod's response (`usage`)          | no allocation at all; the numbers found are the digits after the last key |
//! | `header_bytes`   | a request's headers, as the host serialises them | linear memory; sizes that lie refused; only UTF-8 values read, the first of a repeated name; the request's path through a VM ends with no work left |
//! | `body_differential` | the client, in shapes Python's `json` reads and serde_json refuses | what reaches the pod has no top-level `kv_transfer_params` as Python reads it (`python_json`), whether kvroute refuses such bodies or passes them on; every inference path variant is waited on |
//! | `call_answers`   | what Envoy hands back for a dispatched call | any status (0: reset, overflow) and body on every poll, model list and admin call leaves the leader leading, a failed poll counted; an inline prefill answered so is resumed or answered, never left paused, and a status 0 is decode-only |

pub mod alloc;
pub mod gen;
pub mod harness;
pub mod python_json;

use alloc::{linear_bound, peak_during};
use gen::Gen;
use harness::{aggregated_config, inline_pd_config, passthrough_config, Gateway, PODS};
use kvroute::affinity::Blocks;
use kvroute::config::{is_host_port, Config, Role, MAX_PODS};
use kvroute::cost::fit_board::{FitBoard, PodFit};
use kvroute::flow::{BodyOutcome, HeadersOutcome, PrefillOutcome, RequestFlow};
use kvroute::headermap;
use kvroute::metrics::Counter;
use kvroute::pd::inline::{self, Answer};
use kvroute::pod::load::{LoadTable, PodLoad, LOAD_FORMAT};
use kvroute::pod::prom::{self, GatewayShare, PodMetrics};
use kvroute::port::Host;
use kvroute::protocol::parse::{self, Endpoint};
use kvroute::router::Router;
use kvroute::scheduler::{Decision, Hints};
use kvroute::state::lease::{self, Lease};
use kvroute::state::messages::{Message, Observation, Page};
use kvroute::state::QUEUE_ID_KEY;
use kvroute::vm::discovery;
use kvroute::vm::leader::{Leader, PollResult};
use kvroute::work::{Board, PodWork};
use serde_json::Value;

/// The most a request body costs to parse, per input byte: the rendered prompt (reserved at the
/// body's size; text is copied once), serde_json's scratch for a string with escapes, and the
/// buffers that put members in rendering order. `tests/amplification.rs` measures the costliest
/// shapes (at most 2.1x: numbers that print longer than they were written, `1e9` as
/// `1000000000.0`); the whole-tree parser it replaced took up to 99x.
pub const REQUEST_PARSE_FACTOR: usize = 100;
/// Decoders of shared data and of pods' pages build at most this many bytes per input byte: each
/// element they keep is at most a few dozen bytes and takes at least a few input bytes.
pub const DECODE_FACTOR: usize = 32;
/// JSON documents decoded with serde (load table, admin API, prefill answers): the tree's worst case.
pub const JSON_FACTOR: usize = 40;

/// Splits at the first `0xff` (a byte no UTF-8 text contains): a body, then a second input.
fn split_ff(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|b| *b == 0xff) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// With `KVROUTE_FUZZ_REPORT` set, each new worst ratio of bytes allocated to input bytes (inputs
/// of 1 KiB and more) is printed: how close the fuzzer came to a bound.
fn report_ratio(what: &str, peak: usize, input: usize) {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    static WORST_X100: AtomicUsize = AtomicUsize::new(0);
    if input < 1024 || !*ON.get_or_init(|| std::env::var_os("KVROUTE_FUZZ_REPORT").is_some()) {
        return;
    }
    let ratio = peak * 100 / input;
    if WORST_X100.fetch_max(ratio, Relaxed) < ratio {
        eprintln!(
            "worst ratio {what}: {:.2} ({peak} bytes for {input})",
            ratio as f64 / 100.0
        );
    }
}

fn assert_bounded(what: &str, peak: usize, input: usize, factor: usize) {
    report_ratio(what, peak, input);
    assert!(
        peak <= linear_bound(input, factor),
        "{what}: {peak} bytes allocated at once for {input} input bytes"
    );
}

/// Every pod named in a decision is one the VM knows, at most `max` of them.
fn check_destinations(destinations: &str, known: &[&str], max: usize) {
    let named: Vec<&str> = destinations.split(',').collect();
    assert!(!named.is_empty() && named.len() <= max, "{destinations}");
    for n in named {
        assert!(known.contains(&n), "routed to unknown pod `{n}`");
    }
}

fn route_some_prompt(router: &Router, config: &Config, now: u64) -> Decision {
    let body =
        br#"{"model":"m","messages":[{"role":"user","content":"hello there, general kenobi"}]}"#;
    let view = parse::parse(Endpoint::ChatCompletions, body).unwrap();
    let blocks = Blocks::of(&config.block, &view, None);
    let decision = router.route(
        config,
        "m",
        &[Role::Aggregated, Role::Decode],
        &blocks,
        Hints::default(),
        now,
    );
    if let Decision::Route { ranked, .. } = &decision {
        for choice in ranked {
            assert!(
                !choice.prediction.ttft_ms.is_nan(),
                "a NaN prediction for {}: {:?}",
                choice.addr,
                choice.prediction
            );
        }
    }
    decision
}

/// `request_body`: flags byte (bit 0 chat, bit 3 Responses, both Anthropic Messages; bit 1 inline
/// P/D, bit 2 a second worker VM; the high four bits the parse budget), the body,
/// `0xff`, what the pod answers (then optionally `0xfe`, the upstream address, a newline and the
/// response details the proxy reports at the end).
pub fn request_body(data: &[u8]) {
    let Some((flags, rest)) = data.split_first() else {
        return;
    };
    let (body, response) = split_ff(rest);
    let (endpoint, path) = match (flags & 8 == 8, flags & 1 == 1) {
        (true, true) => (Endpoint::Messages, "/v1/messages"),
        (true, false) => (Endpoint::Responses, "/v1/responses"),
        (false, true) => (Endpoint::ChatCompletions, "/v1/chat/completions"),
        (false, false) => (Endpoint::Completions, "/v1/completions"),
    };
    let (parsed, peak) = peak_during(|| parse::parse(endpoint, body));
    assert_bounded("parse", peak, body.len(), REQUEST_PARSE_FACTOR);
    if let Some(before) = parse::reference::parse(endpoint, body) {
        assert_eq!(parsed, before, "the whole-tree parser read it otherwise");
    }
    // A budget refuses only what would be routed, and changes nothing else.
    let budget = match flags >> 4 {
        15 => usize::MAX,
        b => usize::from(b) * 64,
    };
    let (bounded, peak) = peak_during(|| parse::parse_request(endpoint, body, budget));
    assert_bounded("parse_request", peak, body.len(), REQUEST_PARSE_FACTOR);
    match (&bounded.view, &parsed) {
        (Err(parse::ParseError::OverBudget), Ok(_)) => {}
        (view, unbounded) => assert_eq!(view, unbounded, "the budget changed the outcome"),
    }

    let config = if flags & 2 == 2 {
        inline_pd_config()
    } else {
        aggregated_config()
    };
    let vms = if flags & 4 == 4 { 2 } else { 1 };
    let mut g = Gateway::ready(&config, vms);
    // Twice: the second time the index holds the prompt, so the response's `usage` is checked
    // against it.
    for i in [0, vms - 1] {
        match g.request(i, path, body, response) {
            BodyOutcome::Route(route) => {
                check_destinations(&route.destinations, &PODS, config.max_endpoints_in_header);
                if let Some(call) = &route.prefill_call {
                    let sent: Value = serde_json::from_slice(call.body.as_deref().unwrap_or(b""))
                        .expect("the prefill body is JSON");
                    assert_eq!(sent["kv_transfer_params"]["do_remote_decode"], true);
                    assert_eq!(sent["stream"], false);
                    assert!(PODS.contains(&call.authority.as_str()));
                }
                assert!(parsed.is_ok(), "routed a body the parser refused");
            }
            BodyOutcome::Reply(reply) => {
                assert!(reply.status >= 400);
                let _: Value = serde_json::from_slice(&reply.body).expect("errors are JSON");
            }
            BodyOutcome::Continue => {}
            BodyOutcome::Hold => {
                panic!("held, but flow control is off in the fuzzed configurations")
            }
        }
        g.tick();
    }
    assert_eq!(g.leftover_work(), 0, "finished requests still counted");
    for (vm, _) in &g.vms {
        let held: usize = PODS
            .iter()
            .filter_map(|p| vm.router.affinity.slot_of(p))
            .map(|s| vm.router.affinity.index().blocks_held(s))
            .sum();
        // Two requests, each observed on its pod (and an inline prefill pod).
        assert!(held <= 4 * kvroute::router::MAX_BLOCKS_PER_REQUEST);
    }
}

/// `prom`: a pod's `/metrics` page.
pub fn prom(data: &[u8]) {
    let (parsed, peak) = peak_during(|| prom::parse(data));
    assert_bounded("prom::parse", peak, data.len(), DECODE_FACTOR);
    let Ok(m) = parsed else {
        return;
    };
    for v in [m.waiting, m.running, m.kv_usage] {
        assert!(v.is_finite() && v >= 0.0, "{m:?}");
    }
    assert!(m.kv_usage <= 1.0);
    assert!(m.block_size != Some(0) && m.num_gpu_blocks != Some(0));
    let mut models = m.models.clone();
    models.sort();
    models.dedup();
    assert_eq!(models.len(), m.models.len(), "models are listed once");

    // The leader polls it, publishes the table, a worker reads it back and routes on it.
    let config = aggregated_config();
    let mut leader = Leader::new(&config);
    let now = 1_000_000;
    assert!(leader.on_poll(
        PODS[0],
        PollResult::Answered(200, data),
        GatewayShare::default(),
        now
    ));
    let table = leader.table(now);
    let decoded = LoadTable::decode(&table.encode()).expect("the leader's table reads back");
    assert_eq!(decoded, table);
    let mut router = Router::new();
    router.apply_load_table(&config, decoded);
    if let Some(slot) = router.affinity.slot_of(PODS[0]) {
        router.affinity.observe(&Observation {
            addr: PODS[0].to_string(),
            hashes: (1..=64).collect(),
        });
        assert!(
            router.affinity.index().blocks_held(slot) <= config.max_pod_capacity_blocks as usize,
            "capacity bounded by configuration"
        );
    }
    let _ = route_some_prompt(&router, &config, now);
}

/// `admin_clusters`: the cluster's name, a newline, then the admin API's answer.
pub fn admin_clusters(data: &[u8]) {
    let (name, json) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&b"pool"[..], data),
    };
    let name = String::from_utf8_lossy(name).into_owned();
    let (members, peak) = peak_during(|| discovery::cluster_members(json, &name));
    assert_bounded("cluster_members", peak, json.len(), JSON_FACTOR);
    let Some(members) = members else {
        return;
    };
    let mut sorted = members.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, members, "sorted and unique");
    for m in &members {
        assert!(is_host_port(m), "member `{m}` is not ip:port");
    }
    if name.trim().is_empty() {
        return;
    }
    let config = Config::parse(
        serde_json::json!({"admin_cluster": "admin", "pools": [{"name": "a", "cluster": name}]})
            .to_string()
            .as_bytes(),
    )
    .expect("a config naming this cluster");
    let mut leader = Leader::new(&config);
    leader.on_admin_clusters(&config, json);
    let table = leader.table(5);
    assert!(table.pods.len() <= MAX_PODS);
    // Each member's work, on the board other VMs read, comes back as it was written.
    let work: Vec<(String, PodWork)> = table
        .pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let n = i as u32 + 1;
            (
                p.addr.clone(),
                PodWork {
                    inflight: n,
                    prefill_tokens: u64::from(n) * 10,
                    prefill_requests: n,
                    head_since_ms: 900,
                    head_tokens: 10,
                },
            )
        })
        .collect();
    let mut board = Board::default();
    board.put_row(7, 5, &work, 3000);
    let others = Board::decode(&board.encode()).others(8, 5, 3000);
    assert_eq!(others.len(), work.len(), "{work:?} came back as {others:?}");
    for (addr, w) in &work {
        assert_eq!(others.get(addr), Some(w), "{addr}");
    }
}

/// `config`: the plugin configuration.
pub fn config(data: &[u8]) {
    let Ok(config) = Config::parse(data) else {
        return;
    };
    let mut g = Gateway::ready(&config, 2);
    let body = br#"{"model":"m","messages":[{"role":"user","content":"a config's first request"}],"stream":true}"#;
    let response =
        br#"data: {"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":0}}}"#;
    for i in [0, 1, 1] {
        let _ = g.request(i, "/v1/chat/completions", body, response);
        g.tick();
    }
    assert_eq!(g.leftover_work(), 0);
    let leaders = g.vms.iter().filter(|(vm, _)| vm.is_leader()).count();
    assert!(leaders <= 1 || config.singleton, "{leaders} leaders");
}

/// `lease`: the lease value; the same bytes also build a lease and a claim.
pub fn lease(data: &[u8]) {
    if let Some(l) = Lease::decode(data) {
        assert_eq!(&l.encode()[..], data, "byte-exact");
    }
    let mut g = Gen::new(data);
    let built = Lease {
        holder: g.u64(),
        expires_ms: g.u64(),
    };
    assert_eq!(Lease::decode(&built.encode()), Some(built));
    // Any clock and any configured lease time (`leader_lease_ms` is a u64).
    let (me, now, ttl) = (g.u64(), g.u64(), g.u64());
    let current = Lease::decode(data).or(Some(built));
    match lease::claim(current, me, now, ttl, g.u8() & 1 == 1) {
        Some(new) => {
            assert_eq!(new.holder, me);
            assert!(new.expires_ms >= now, "a claim that has already expired");
        }
        None => assert!(current.is_some_and(|c| c.holder != me && c.expires_ms > now)),
    }
}

fn gen_metrics(g: &mut Gen) -> PodMetrics {
    PodMetrics {
        waiting: g.number(1e4),
        running: g.number(1e4),
        kv_usage: g.number(1.0),
        block_size: (g.u8() & 1 == 1).then(|| g.u32()),
        num_gpu_blocks: (g.u8() & 1 == 1).then(|| g.u64()),
        models: (0..g.len(3)).map(|_| g.string(12)).collect(),
        adapters: (0..g.len(2)).map(|_| g.string(12)).collect(),
        adapters_running: (0..g.len(2)).map(|_| g.string(12)).collect(),
        adapter_slots: (g.u8() & 1 == 1).then(|| g.u32()),
        ours: GatewayShare {
            prefilling: g.number(1e3),
            inflight: g.number(1e3),
        },
        started_at: (g.u8() & 1 == 1).then(|| g.number(2e9)),
        generated_tokens: (g.u8() & 1 == 1).then(|| g.number(1e12)),
    }
}

fn gen_table(g: &mut Gen) -> LoadTable {
    let pods = (0..g.len(8))
        .map(|_| PodLoad {
            addr: g.addr(),
            role: [Role::Aggregated, Role::Prefill, Role::Decode][usize::from(g.u8() % 3)],
            pool: String::new(),
            metrics_at_ms: g.u64() >> 1,
            failing: g.u8() & 1 == 1,
            late: g.u8() & 1 == 1,
            ejected_until_ms: g.u64() >> 1,
            metrics: gen_metrics(g),
            served: (0..g.len(2))
                .map(|_| kvroute::pod::models::ServedModel {
                    id: g.string(12),
                    parent: (g.u8() & 1 == 1).then(|| g.string(12)),
                    root: None,
                    max_model_len: (g.u8() & 1 == 1).then(|| g.u64() >> 1),
                })
                .collect(),
            serves: (0..g.len(3)).map(|_| g.string(12)).collect(),
            locality: None,
            restarts: u32::from(g.u8() & 3),
            seats: (g.u8() & 1 == 1).then(|| g.u32()),
        })
        .collect();
    LoadTable {
        format: LOAD_FORMAT,
        version: g.u64(),
        published_ms: g.u64(),
        pods,
    }
}

/// `load_table`: the leader's published table; the same bytes also build one.
pub fn load_table(data: &[u8]) {
    let (decoded, peak) = peak_during(|| LoadTable::decode(data));
    assert_bounded("LoadTable::decode", peak, data.len(), JSON_FACTOR);
    let config = aggregated_config();
    if let Some(t) = decoded {
        assert_eq!(LoadTable::decode(&t.encode()).as_ref(), Some(&t));
        let now = t.published_ms;
        let mut router = Router::new();
        router.apply_load_table(&config, t);
        let _ = route_some_prompt(&router, &config, now);
        router.apply_load_table(&config, LoadTable::default());
        assert_eq!(router.affinity.index_entries(), 0);
    }
    let built = gen_table(&mut Gen::new(data));
    assert_eq!(LoadTable::decode(&built.encode()).as_ref(), Some(&built));
    let mut router = Router::new();
    let now = built.published_ms;
    router.apply_load_table(&config, built.clone());
    for p in &built.pods {
        if let Some(slot) = router.affinity.slot_of(&p.addr) {
            router.affinity.observe(&Observation {
                addr: p.addr.clone(),
                hashes: vec![1, 2, 3],
            });
            assert!(router.affinity.index().blocks_held(slot) <= 3);
        }
    }
    let _ = route_some_prompt(&router, &config, now);
}

fn gen_observation(g: &mut Gen) -> Observation {
    let addr = if g.u8() & 1 == 1 {
        PODS[usize::from(g.u8()) % PODS.len()].to_string()
    } else {
        g.string(40)
    };
    Observation {
        addr,
        hashes: (0..g.len(20)).map(|_| g.u64()).collect(),
    }
}

/// `messages`: a queue message; the same bytes also build one, and a leader drains the bytes.
pub fn messages(data: &[u8]) {
    let (decoded, peak) = peak_during(|| Message::decode(data));
    assert_bounded("Message::decode", peak, data.len(), DECODE_FACTOR);
    if let Some(m) = &decoded {
        assert_eq!(Message::decode(&m.encode()).as_ref(), Some(m));
    }
    let mut g = Gen::new(data);
    let vm = g.u64();
    let built = match g.u8() % 3 {
        2 => Message::Verdicts {
            vm,
            pods: (0..g.len(5))
                .map(|_| {
                    let tally = kvroute::health::Tally {
                        served: g.u32(),
                        failed: g.u32(),
                        trailing_failures: g.u32(),
                    };
                    (g.string(30), tally)
                })
                .collect(),
        },
        0 => Message::Observation {
            vm,
            observation: gen_observation(&mut g),
        },
        _ => Message::Eviction {
            vm,
            eviction: gen_observation(&mut g),
        },
    };
    assert_eq!(Message::decode(&built.encode()), Some(built));

    // A worker's queue carries the bytes to the leader.
    let config = aggregated_config();
    let mut gw = Gateway::ready(&config, 1);
    let (vm, host) = &mut gw.vms[0];
    let queue = host
        .shared_get(QUEUE_ID_KEY)
        .0
        .and_then(|b| Some(u32::from_le_bytes(b.get(..4)?.try_into().ok()?)))
        .expect("the leader registered its queue");
    assert!(host.queue_push(queue, data));
    let now = host.now_ms();
    vm.tick(host, now);
    let held: usize = PODS
        .iter()
        .filter_map(|p| vm.router.affinity.slot_of(p))
        .map(|s| vm.router.affinity.index().blocks_held(s))
        .sum();
    assert!(held <= data.len() / 8);
}

fn gen_page(g: &mut Gen) -> Page {
    Page {
        seq: g.u64(),
        observations: (0..g.len(6)).map(|_| gen_observation(g)).collect(),
        evictions: (0..g.len(3)).map(|_| gen_observation(g)).collect(),
        from_peer: g.u8() & 1 == 1,
    }
}

fn index_held(router: &Router) -> usize {
    PODS.iter()
        .filter_map(|p| router.affinity.slot_of(p))
        .map(|s| router.affinity.index().blocks_held(s))
        .sum()
}

/// `pages`: a delta page or snapshot; the same bytes also build one.
pub fn pages(data: &[u8]) {
    let (decoded, peak) = peak_during(|| Page::decode(data));
    assert_bounded("Page::decode", peak, data.len(), DECODE_FACTOR);
    // The same bytes as another gateway replica's answer (`peers`): bounded, never a panic.
    let (_, peak) = peak_during(|| kvroute::peers::Answer::decode(data));
    assert_bounded("peers::Answer::decode", peak, data.len(), DECODE_FACTOR);
    let config = aggregated_config();
    let table = harness_table();
    let built = gen_page(&mut Gen::new(data));
    assert_eq!(Page::decode(&built.encode()).as_ref(), Some(&built));
    for page in decoded.iter().chain([&built]) {
        assert_eq!(Page::decode(&page.encode()).as_ref(), Some(page));
        let mut router = Router::new();
        router.apply_load_table(&config, table.clone());
        router.affinity.apply_page(page);
        assert_eq!(router.affinity.applied_page, page.seq);
        let held = index_held(&router);
        // What a VM re-publishes from it reads back as the same index.
        let snapshot = router.affinity.snapshot(page.seq);
        assert_eq!(Page::decode(&snapshot.encode()).as_ref(), Some(&snapshot));
        let mut follower = Router::new();
        follower.apply_load_table(&config, table.clone());
        follower.affinity.load_snapshot(&snapshot);
        assert_eq!(index_held(&follower), held);
        for p in PODS {
            let (a, b) = (router.affinity.slot_of(p), follower.affinity.slot_of(p));
            if let (Some(a), Some(b)) = (a, b) {
                assert_eq!(
                    router.affinity.index().slot_blocks_oldest_first(a),
                    follower.affinity.index().slot_blocks_oldest_first(b)
                );
            }
        }
        let _ = route_some_prompt(&router, &config, table.published_ms);
    }
}

/// A table with every harness pod fresh.
fn harness_table() -> LoadTable {
    let config = aggregated_config();
    let mut leader = Leader::new(&config);
    for p in PODS {
        leader.on_poll(
            p,
            PollResult::Answered(200, &harness::vllm_page(1, None)),
            GatewayShare::default(),
            1000,
        );
    }
    leader.table(1000)
}

/// `work_board`: the work board; the same bytes also build rows.
pub fn work_board(data: &[u8]) {
    let (decoded, peak) = peak_during(|| Board::decode(data));
    assert_bounded("Board::decode", peak, data.len(), DECODE_FACTOR);
    let now = 10_000;
    let others = decoded.others(0, now, 3000);
    let again = Board::decode(&decoded.encode()).others(0, now, 3000);
    assert_eq!(others, again, "what was read is written back the same");

    let mut g = Gen::new(data);
    let mut board = Board::default();
    let mut expected: std::collections::HashMap<String, PodWork> = Default::default();
    for vm in 1..=u64::from(g.u8() % 6) {
        let row: Vec<(String, PodWork)> = (0..g.len(5))
            .map(|_| {
                let w = PodWork {
                    inflight: g.u32() >> 8,
                    prefill_tokens: g.u64() >> 16,
                    prefill_requests: g.u32() >> 8,
                    head_since_ms: g.u64() >> 24,
                    head_tokens: g.u64() >> 40,
                };
                (g.addr(), w)
            })
            .collect();
        // A row is replaced as a whole; entries for one pod within a row are the VM's own sum.
        let mut merged: Vec<(String, PodWork)> = Vec::new();
        for (a, w) in row {
            match merged.iter_mut().find(|(m, _)| *m == a) {
                Some((_, m)) => *m = w,
                None => merged.push((a, w)),
            }
        }
        for (a, w) in &merged {
            if *w != PodWork::default() {
                let e = expected.entry(a.clone()).or_default();
                e.inflight += w.inflight;
                e.prefill_tokens += w.prefill_tokens;
                e.prefill_requests += w.prefill_requests;
                e.add_head(w.head_since_ms, w.head_tokens);
            }
        }
        board.put_row(vm, now, &merged, 3000);
    }
    let read: std::collections::HashMap<String, PodWork> = Board::decode(&board.encode())
        .others(0, now, 3000)
        .into_iter()
        .collect();
    assert_eq!(read, expected);

    let config = aggregated_config();
    let mut router = Router::new();
    router.apply_load_table(&config, harness_table());
    router
        .work
        .set_others_work(decoded.others(0, now, 3000), now);
    let _ = route_some_prompt(&router, &config, 1000);
}

/// `fits_board`: the fits board; the same bytes also build rows.
pub fn fits_board(data: &[u8]) {
    let (decoded, peak) = peak_during(|| FitBoard::decode(data));
    assert_bounded("FitBoard::decode", peak, data.len(), DECODE_FACTOR);
    let now = 10_000;
    // Numbers are written rounded: after one pass, writing what was read changes nothing.
    let once = FitBoard::decode(&decoded.encode());
    let twice = FitBoard::decode(&once.encode());
    assert_eq!(once.others(0, now, 10_000), twice.others(0, now, 10_000));
    for fits in decoded.others(0, now, 10_000).values() {
        for f in fits {
            for v in [
                f.cost.overhead_ms,
                f.cost.us_per_token,
                f.cost.us_per_decoding,
                f.samples,
            ] {
                assert!(v.is_finite() && v >= 0.0, "{f:?}");
            }
        }
    }

    let mut g = Gen::new(data);
    let mut board = FitBoard::default();
    for vm in 1..=u64::from(g.u8() % 4) {
        let fits = (0..g.len(4))
            .map(|_| PodFit {
                addr: PODS[usize::from(g.u8()) % PODS.len()].to_string(),
                cost: kvroute::cost::Coefficients {
                    overhead_ms: g.number(1e3),
                    us_per_token: g.number(1e3),
                    us_per_decoding: g.number(1e3),
                },
                samples: g.number(1e6),
                itl_ms: (g.u8() & 1 == 1).then(|| g.number(100.0)),
            })
            .collect();
        board.put_row(vm, now, fits, 10_000);
    }
    let read = FitBoard::decode(&board.encode()).others(0, now, 10_000);
    let written = board.others(0, now, 10_000);
    assert_eq!(read.len(), written.len());
    for (addr, fits) in &written {
        let back = &read[addr];
        assert_eq!(back.len(), fits.len());
        for (a, b) in fits.iter().zip(back) {
            assert!((a.cost.us_per_token - b.cost.us_per_token).abs() <= 5e-5);
            assert!((a.samples - b.samples).abs() <= 5e-3);
            assert_eq!(a.itl_ms.is_some(), b.itl_ms.is_some());
        }
    }

    let config = aggregated_config();
    let mut router = Router::new();
    router.apply_load_table(&config, harness_table());
    router.costs.set_others_fits(decoded.others(0, now, 10_000));
    let _ = route_some_prompt(&router, &config, 1000);
}

const DEFAULT_ORIGINAL: &[u8] = br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 64, "stream": true, "stream_options": {"include_usage": true}}"#;

/// `inline_prefill`: status (2 bytes), the client's body, `0xff`, the prefill pod's answer.
pub fn inline_prefill(data: &[u8]) {
    let mut g = Gen::new(data);
    let status = 100 + u32::from(g.u8()) % 5 * 100 + u32::from(g.u8()) % 4;
    let status = if g.is_empty() { 200 } else { status };
    let (client, answer) = split_ff(g.rest());
    // The flow keeps the bodies the parser accepted as objects.
    let original = match parse::parse(Endpoint::ChatCompletions, client) {
        Ok(_) => client,
        Err(_) => DEFAULT_ORIGINAL,
    };
    let Value::Object(client_object) = serde_json::from_slice(original).unwrap() else {
        panic!("an accepted body is an object");
    };
    let sent: Value = serde_json::from_slice(&inline::prefill_body(original)).unwrap();
    assert_eq!(sent["max_tokens"], 1);
    assert_eq!(sent["stream"], false);
    assert!(sent.get("stream_options").is_none());
    assert_eq!(sent["kv_transfer_params"]["do_remote_decode"], true);
    if client_object.contains_key("max_completion_tokens") {
        assert_eq!(sent["max_completion_tokens"], 1);
    }

    let (params, peak) = peak_during(|| inline::transfer_params(answer));
    assert_bounded("transfer_params", peak, answer.len(), JSON_FACTOR);
    match inline::answer(status, answer, original) {
        Answer::Refused { status: s, body } => {
            assert!((400..500).contains(&status) && s == status && body == answer);
            assert!(
                status != 401 && status != 403,
                "the pod refusing kvroute's call"
            );
        }
        Answer::Unauthorized => assert!(status == 401 || status == 403),
        Answer::Decode(body) => {
            assert_eq!(status, 200);
            let Value::Object(decode) = serde_json::from_slice(&body).unwrap() else {
                panic!("the decode body is not an object");
            };
            assert_eq!(decode.get("kv_transfer_params"), params.as_ref());
            assert!(params.as_ref().is_some_and(Value::is_object));
            for (k, v) in &client_object {
                if k != "kv_transfer_params" {
                    assert_eq!(decode.get(k), Some(v), "the client's `{k}` changed");
                }
            }
            assert_eq!(
                decode.len(),
                client_object.len()
                    + usize::from(!client_object.contains_key("kv_transfer_params"))
            );
        }
        Answer::Fallback => {
            assert!(!(400..500).contains(&status));
            assert!(status != 200 || params.is_none());
        }
    }
}

/// `usage`: a chunk of a pod's response.
pub fn usage(data: &[u8]) {
    let (report, peak) = peak_during(|| kvroute::protocol::usage::cache_report(data));
    assert_eq!(peak, 0, "scanning a response chunk allocates");
    // The number after the last `key` and its colon (and spaces), if it is a plain integer that
    // does not run to the end of the chunk (its rest may come in the next one).
    let after = |key: &[u8]| -> Option<u64> {
        let at = data.windows(key.len()).rposition(|w| w == key)?;
        let rest = &data[at + key.len()..];
        let spaces = |b: &[u8]| b.iter().take_while(|c| c.is_ascii_whitespace()).count();
        let rest = &rest[spaces(rest)..];
        let rest = rest.strip_prefix(b":")?;
        let rest = &rest[spaces(rest)..];
        let digits: String = rest
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .map(|c| char::from(*c))
            .collect();
        if digits.len() == rest.len() {
            return None;
        }
        digits.parse::<u64>().ok()
    };
    let expected = match after(b"\"cached_tokens\"") {
        // Chat and completions name the prompt `prompt_tokens`, the Responses API `input_tokens`.
        Some(cached) => after(b"\"prompt_tokens\"")
            .or_else(|| after(b"\"input_tokens\""))
            .map(|prompt| (cached, prompt)),
        // Anthropic's: `input_tokens` counts only what was neither read from nor written to the
        // cache.
        None => (|| {
            let read = after(b"\"cache_read_input_tokens\"")?;
            let uncached = after(b"\"input_tokens\"")?;
            let written = after(b"\"cache_creation_input_tokens\"").unwrap_or(0);
            Some((read, uncached.checked_add(read)?.checked_add(written)?))
        })(),
    };
    assert_eq!(report, expected);
}

/// A target's checks, given one input.
pub type Check = fn(&[u8]);

/// Every target by name, for the corpus replay.
/// `header_bytes`: a flags byte (bit 0: the inline P/D configuration), then a request's headers in
/// the Proxy-Wasm ABI's serialised form (what Envoy hands the filter, bytes 0x80–0xFF included).
pub fn header_bytes(data: &[u8]) {
    let Some((flags, map)) = data.split_first() else {
        return;
    };
    let (decoded, peak) = peak_during(|| headermap::decode(map));
    assert_bounded("headermap::decode", peak, map.len(), DECODE_FACTOR);
    let Some(headers) = decoded else {
        return;
    };
    let held: usize = headers.iter().map(|(n, v)| 10 + n.len() + v.len()).sum();
    // An empty input is an empty map; any other holds its count, sizes and fields.
    assert!(
        map.is_empty() || 4 + held <= map.len(),
        "more decoded than the input holds"
    );
    for (name, _) in &headers {
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        let first = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| *v);
        assert!(headermap::has(&headers, name));
        assert_eq!(
            headermap::find(&headers, name),
            first.and_then(|v| std::str::from_utf8(v).ok()),
            "`{name}`: read otherwise than its first value as UTF-8"
        );
    }
    let text: Option<Vec<(&str, &str)>> = headers
        .iter()
        .map(|(n, v)| Some((std::str::from_utf8(n).ok()?, std::str::from_utf8(v).ok()?)))
        .collect();
    if let Some(text) = text {
        let again = headermap::encode(&text);
        assert_eq!(
            headermap::decode(&again).as_deref(),
            Some(&headers[..]),
            "encode ∘ decode"
        );
    }

    // The request as the filter hands it to the core: its headers, a body, a prefill call Envoy
    // ends without an answer, the response.
    let config = if flags & 1 == 1 {
        inline_pd_config()
    } else {
        aggregated_config()
    };
    let mut g = Gateway::ready(&config, 1);
    let Some((vm, host)) = g.vms.get_mut(0) else {
        return;
    };
    let mut flow = RequestFlow::new();
    let header = |name: &str| headermap::find(&headers, name).map(str::to_string);
    match flow.on_request_headers(vm, host, &header, false) {
        HeadersOutcome::WaitForBody => {
            let body = long_chat_body();
            if let BodyOutcome::Route(route) = flow.on_request_body(vm, host, Some(&body)) {
                if route.prefill_call.is_some() {
                    let _ = flow.on_prefill_answer(vm, host, 0, b"");
                }
                let _ = flow.on_response_headers(vm, host, Some("200"), true);
            }
        }
        HeadersOutcome::Reply(reply) => assert!(reply.status >= 200),
        HeadersOutcome::Route(pod) => {
            assert!(PODS.contains(&pod.as_str()), "a stored response on `{pod}`")
        }
        HeadersOutcome::Continue => {}
    }
    flow.on_done(vm, host, None, None);
    assert_eq!(g.leftover_work(), 0, "a finished request still counted");
}

/// A chat body long enough for the inline P/D configuration to split it.
fn long_chat_body() -> Vec<u8> {
    let prompt: String = (0..1500).map(|i| format!("w{} ", i % 97)).collect();
    serde_json::json!({"model": "m", "messages": [{"role": "user", "content": prompt}]})
        .to_string()
        .into_bytes()
}

/// The status Envoy hands back for a dispatched call, from one byte: none (0: a reset, an answer
/// past the async client's buffer), its own 503 and 504, a pod's, or any.
fn call_status(g: &mut Gen<'_>) -> u32 {
    match g.u8() % 6 {
        0 => 0,
        1 => 200,
        2 => 503,
        3 => 504,
        4 => 401,
        _ => g.u32() % 1000,
    }
}

/// `call_answers`: a flags byte (bit 0: an inline prefill call, else the leader's calls), a
/// status byte (and four more for "any"), then the answer's body.
pub fn call_answers(data: &[u8]) {
    let mut g = Gen::new(data);
    let flags = g.u8();
    let status = call_status(&mut g);
    let body = g.rest();
    if flags & 1 == 0 {
        let config = aggregated_config();
        let mut gateway = Gateway::ready(&config, 1);
        // Past every interval: polls, model lists and the admin API are all due.
        gateway.advance_ms(60_000);
        let Some((vm, host)) = gateway.vms.get_mut(0) else {
            return;
        };
        let now = host.now_ms();
        vm.tick(host, now);
        let calls = host.take_calls();
        let polls = calls.iter().filter(|(_, c)| c.path == "/metrics").count() as u64;
        assert!(polls > 0, "no poll due");
        let failures = host.counter(Counter::PollFailures);
        for (token, _) in &calls {
            vm.on_call_response(host, *token, status, body, now + 1);
        }
        assert!(vm.is_leader(), "the answers cost the VM its leadership");
        if status == 0 {
            assert_eq!(
                host.counter(Counter::PollFailures),
                failures + polls,
                "a poll without an answer is a failed poll"
            );
        }
        // The leader still publishes and routes.
        gateway.advance_ms(100);
        gateway.tick();
        let Some((vm, _)) = gateway.vms.first() else {
            return;
        };
        let _ = route_some_prompt(&vm.router, &config, now);
        return;
    }
    let config = inline_pd_config();
    let mut gateway = Gateway::ready(&config, 1);
    let Some((vm, host)) = gateway.vms.get_mut(0) else {
        return;
    };
    let mut flow = RequestFlow::new();
    let header = |name: &str| match name {
        ":method" => Some("POST".to_string()),
        ":path" => Some("/v1/chat/completions".to_string()),
        _ => None,
    };
    assert_eq!(
        flow.on_request_headers(vm, host, &header, false),
        HeadersOutcome::WaitForBody
    );
    let BodyOutcome::Route(route) = flow.on_request_body(vm, host, Some(&long_chat_body())) else {
        panic!("a long chat request is routed");
    };
    assert!(route.prefill_call.is_some(), "a long new prompt is split");
    let decode_only = host.counter(Counter::PdDecodeOnly);
    match flow.on_prefill_answer(vm, host, status, body) {
        PrefillOutcome::Reply(reply) => {
            assert!((400..500).contains(&status) && status != 401 && status != 403);
            assert_eq!(reply.status, status);
        }
        PrefillOutcome::Resume(Some(_)) => assert_eq!(status, 200),
        PrefillOutcome::Resume(None) => {
            assert_eq!(host.counter(Counter::PdDecodeOnly), decode_only + 1);
        }
    }
    if status == 0 {
        assert_eq!(
            host.counter(Counter::PdDecodeOnly),
            decode_only + 1,
            "no answer: decode-only"
        );
    }
    let _ = flow.on_response_headers(vm, host, Some("200"), true);
    flow.on_done(vm, host, None, None);
    assert_eq!(
        gateway.leftover_work(),
        0,
        "a finished request still counted"
    );
}

pub const TARGETS: &[(&str, Check)] = &[
    ("request_body", request_body),
    ("prom", prom),
    ("admin_clusters", admin_clusters),
    ("config", config),
    ("lease", lease),
    ("load_table", load_table),
    ("messages", messages),
    ("pages", pages),
    ("work_board", work_board),
    ("fits_board", fits_board),
    ("inline_prefill", inline_prefill),
    ("usage", usage),
    ("header_bytes", header_bytes),
    ("call_answers", call_answers),
    ("body_differential", body_differential),
];

/// The KV handle a client must not hand a pod, as the fuzzer may prefix it to a body.
const CLIENT_KV: &[u8] =
    br#"{"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.6.6.6"},"#;

/// `body_differential`: flags byte (bit 0 `passthrough_unparseable_bodies`; bit 1 the body opens
/// with [`CLIENT_KV`]; bit 2 sent as UTF-16LE with its byte order mark, bit 3 behind a UTF-8 one;
/// bits 4-5 the path: plain chat, completions, chat percent-encoded, completions with doubled
/// slashes), then the body. Whatever kvroute lets through (routed, passed on, its rewritten body or
/// the client's) must hold no top-level `kv_transfer_params` as Python's `json` reads it.
pub fn body_differential(data: &[u8]) {
    let Some((flags, rest)) = data.split_first() else {
        return;
    };
    let mut body = Vec::new();
    if flags & 2 != 0 {
        body.extend_from_slice(CLIENT_KV);
    }
    body.extend_from_slice(rest);
    if flags & 4 != 0 {
        let text = String::from_utf8_lossy(&body).into_owned();
        body = [0xff, 0xfe].to_vec();
        body.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
    }
    if flags & 8 != 0 {
        body.splice(0..0, [0xef, 0xbb, 0xbf]);
    }
    let path = match (flags >> 4) & 3 {
        0 => "/v1/chat/completions",
        1 => "/v1/completions",
        2 => "/v1/chat/%63ompletions",
        _ => "//v1//completions/",
    };
    let config = if flags & 1 != 0 {
        passthrough_config()
    } else {
        aggregated_config()
    };
    let mut g = Gateway::ready(&config, 1);
    let (vm, host) = &mut g.vms[0];
    let mut flow = RequestFlow::new();
    let header = |name: &str| match name {
        ":method" => Some("POST".to_string()),
        ":path" => Some(path.to_string()),
        _ => None,
    };
    let waits = flow.on_request_headers(vm, host, &header, false);
    assert_eq!(
        waits,
        HeadersOutcome::WaitForBody,
        "{path} is an inference path"
    );
    let sent = match flow.on_request_body(vm, host, Some(&body)) {
        BodyOutcome::Reply(reply) => {
            assert!(reply.status >= 400);
            return;
        }
        BodyOutcome::Continue | BodyOutcome::Route(_) => flow.take_rewritten_body().unwrap_or(body),
        BodyOutcome::Hold => panic!("held, but flow control is off in the fuzzed configuration"),
    };
    if let Some(keys) = python_json::top_level_keys(&sent) {
        assert!(
            !keys.iter().any(|k| k == "kv_transfer_params"),
            "a client's kv_transfer_params reaches the pod: {:?}",
            String::from_utf8_lossy(&sent)
        );
    }
}
