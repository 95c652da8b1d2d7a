//! Bounded state under churn: 100,000 distinct prefixes routed through three VMs of one Envoy while
//! pool members join, leave and come back (membership from the admin API), on the fake host.
//!
//! Checked after every round, in every VM: each pod's index holds at most its capacity and the
//! index as a whole at most the live pods' capacities; every block the index credits to a pod was
//! routed to that pod since it (last) joined, so a pod that left is never named, not even through
//! a slot a newcomer reuses; every shared-data key is within its stated bound and the key space is
//! fixed. At the end, each VM's heap (measured: the bytes its drop frees) and the shared data's
//! total are printed and held to their bounds.

use super::*;
use crate::affinity::pages::MAX_PAGE_BYTES;
use crate::flow::{BodyOutcome, HeadersOutcome, RequestFlow};
use crate::protocol::parse::{parse, Endpoint};
use crate::router::MAX_BLOCKS_PER_REQUEST;
use crate::state::{FITS_KEY, INFLIGHT_KEY, PAGE_RING, SNAPSHOT_KEY};
use crate::testing::{FakeHost, Store};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap as StdMap, HashSet};
use std::rc::Rc;

/// Bytes live per thread (tests run one per thread): what dropping a VM frees is its heap.
struct PerThread;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    // `try_with`: never fails the allocation, also while the thread is being torn down.
    let _ = LIVE.try_with(|l| l.set(l.get() + delta));
}

unsafe impl std::alloc::GlobalAlloc for PerThread {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count(layout.size() as isize);
        std::alloc::System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        count(-(layout.size() as isize));
        std::alloc::System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        count(new as isize - layout.size() as isize);
        std::alloc::System.realloc(ptr, layout, new)
    }
}

#[global_allocator]
static ALLOCATOR: PerThread = PerThread;

fn live_bytes() -> isize {
    LIVE.with(Cell::get)
}

const PREFIXES: usize = 100_000;
const ROUNDS: usize = 500;
const PER_ROUND: usize = PREFIXES / ROUNDS;
/// Membership changes every this many rounds (of 100 ms).
const CHANGE_EVERY: usize = 10;
/// Blocks each pod reports (`num_gpu_blocks` of 16 tokens = our blocks of 16 tokens).
const POD_BLOCKS: usize = 250;
/// Addresses pods come from: more than the 64 index slots, so slots are reused by newcomers.
const ROSTER: usize = 100;

fn roster(i: usize) -> String {
    format!("10.{}.{}.{}:8000", 1 + i / 250, i % 250, 7)
}

/// Who is in the pool in each phase: 6 to 10 pods, some of last phase's leave, new ones join, and
/// now and then one that left comes back.
fn membership(phase: usize) -> Vec<String> {
    let size = 6 + phase % 5;
    let mut members: Vec<String> = (0..size)
        .map(|k| roster((phase * 3 + k * 7) % ROSTER))
        .collect();
    if phase % 4 == 3 && phase >= 2 {
        members.push(roster(((phase - 2) * 3) % ROSTER)); // back after a phase away
    }
    members.sort();
    members.dedup();
    members
}

fn admin_answer(members: &[String]) -> Vec<u8> {
    let hosts: Vec<serde_json::Value> = members
        .iter()
        .filter_map(|m| m.rsplit_once(':'))
        .map(|(ip, port)| {
            serde_json::json!({"address":{"socket_address":{"address":ip,"port_value":port.parse::<u16>().unwrap()}}})
        })
        .collect();
    serde_json::json!({"cluster_statuses":[{"name":"pool","host_statuses":hosts}]})
        .to_string()
        .into_bytes()
}

fn page() -> Vec<u8> {
    format!(
        "vllm:num_requests_waiting{{engine=\"0\"}} 0\nvllm:num_requests_running{{engine=\"0\"}} 2\n\
         vllm:kv_cache_usage_perc{{engine=\"0\"}} 0.3\n\
         vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"{POD_BLOCKS}\"}} 1\n"
    )
    .into_bytes()
}

struct Churn {
    store: Rc<RefCell<Store>>,
    vms: Vec<(Vm, FakeHost)>,
    members: Vec<String>,
    /// Blocks routed to each pod since it last joined.
    routed: StdMap<String, HashSet<u64>>,
    max_shared_bytes: usize,
    max_index_entries: usize,
    max_pod_blocks: usize,
}

impl Churn {
    fn tick(&mut self) {
        let admin = admin_answer(&self.members);
        // One clock for the process: requests moved each VM's a little within the round.
        let now_us = self.vms.iter().map(|(_, h)| h.now_us).max().unwrap_or(0) + 100_000;
        for (vm, host) in &mut self.vms {
            host.now_us = now_us;
            let now = host.now_ms();
            vm.tick(host, now);
            for (token, call) in host.take_calls() {
                let body = if call.path == "/metrics" {
                    page()
                } else {
                    admin.clone()
                };
                vm.on_call_response(host, token, 200, &body, now);
            }
        }
    }

    fn route(&mut self, vm_index: usize, i: usize) {
        let body = serde_json::json!({"model":"m","stream":true,"messages":[
            {"role":"system","content":format!("tenant {i:06} has its own instructions, which run to a few blocks: {}", "x".repeat(i % 97))},
            {"role":"user","content":"and asks a question"}]})
        .to_string();
        let (vm, host) = &mut self.vms[vm_index];
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
        let start_us = host.now_us;
        let outcome = flow.on_request_body(vm, host, Some(body.as_bytes()));
        if let BodyOutcome::Route(route) = &outcome {
            let primary = route.destinations.split(',').next().unwrap().to_string();
            let view = parse(Endpoint::ChatCompletions, body.as_bytes()).unwrap();
            let blocks = crate::router::Blocks::of(&vm.config.block, &view, None);
            self.routed
                .entry(primary)
                .or_default()
                .extend(blocks.hashes);
            let _ = flow.on_response_headers(vm, host, Some("200"), false);
            // Its first byte 20 ms later on any pod (the clock goes back for the next request, so
            // the VMs' clocks stay within the round), so the pods' learned costs stay alike.
            host.now_us += 20_000;
            let usage = br#"data: {"usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":0}}}"#;
            let bytes = flow.wants_response_bytes().then_some(&usage[..]);
            flow.on_response_body(vm, host, usage.len(), bytes, true);
        }
        let (upstream, details) = match &outcome {
            BodyOutcome::Route(route) => (
                route.destinations.split(',').next().map(str::to_string),
                Some("via_upstream".to_string()),
            ),
            _ => (None, None),
        };
        flow.on_done(vm, host, upstream, details);
        host.now_us = start_us + 100;
    }

    fn check(&mut self, round: usize) {
        for (i, (vm, _)) in self.vms.iter().enumerate() {
            let table: Vec<&str> = vm
                .router
                .load_table()
                .pods
                .iter()
                .map(|p| p.addr.as_str())
                .collect();
            let mut held_total = 0;
            for addr in ROSTER_ADDRS.with(|r| r.clone()) {
                let slot = vm.router.affinity.slot_of(&addr);
                if !table.contains(&addr.as_str()) {
                    assert_eq!(
                        slot, None,
                        "round {round}: VM {i} keeps a slot for {addr}, which left"
                    );
                    continue;
                }
                let Some(slot) = slot else { continue };
                let blocks = vm.router.affinity.index().slot_blocks_oldest_first(slot);
                assert!(
                    blocks.len() <= POD_BLOCKS,
                    "round {round}: {addr} holds {}",
                    blocks.len()
                );
                held_total += blocks.len();
                self.max_pod_blocks = self.max_pod_blocks.max(blocks.len());
                let routed = self.routed.get(&addr);
                let foreign = blocks
                    .iter()
                    .filter(|h| !routed.is_some_and(|r| r.contains(h)))
                    .count();
                assert_eq!(
                    foreign, 0,
                    "round {round}: VM {i} credits {addr} with {foreign} blocks never routed to it since it joined"
                );
            }
            let entries = vm.router.affinity.index_entries();
            assert!(
                entries <= held_total,
                "round {round}: {entries} entries, {held_total} held"
            );
            assert!(entries <= table.len() * POD_BLOCKS);
            self.max_index_entries = self.max_index_entries.max(entries);
        }
        let store = self.store.borrow();
        assert!(
            store.data.len() <= 8 + PAGE_RING as usize,
            "the key space is fixed: {:?}",
            store.data.keys().collect::<Vec<_>>()
        );
        let pods = MAX_MEMBERS;
        let mut total = 0;
        for (key, (value, _)) in &store.data {
            let bound = match key.as_str() {
                // An observation closes a page once it is past MAX_PAGE_BYTES.
                k if k.starts_with("kvroute.idx.page.") => {
                    MAX_PAGE_BYTES + MAX_BLOCKS_PER_REQUEST * 8 + 1024
                }
                SNAPSHOT_KEY => 16 + pods * (POD_BLOCKS * 8 + 64),
                LOAD_KEY => 1024 + pods * 400,
                INFLIGHT_KEY | FITS_KEY => 64 + self.vms.len() * (32 + pods * 64),
                _ => 32,
            };
            assert!(
                value.len() <= bound,
                "round {round}: {key} is {} bytes (bound {bound})",
                value.len()
            );
            total += value.len();
        }
        self.max_shared_bytes = self.max_shared_bytes.max(total);
    }
}

/// Members in one phase, at most (`membership`: 10, and one that comes back).
const MAX_MEMBERS: usize = 11;

thread_local! {
    static ROSTER_ADDRS: Vec<String> = (0..ROSTER).map(roster).collect();
}

#[test]
fn a_hundred_thousand_prefixes_and_pods_coming_and_going_stay_bounded() {
    let config = Config::parse(
        br#"{"admin_cluster":"admin","pools":[{"name":"p","cluster":"pool"}],
             "poll_interval_ms":100,"discovery_interval_ms":100,"stale_after_ms":1000}"#,
    )
    .unwrap();
    let store = Rc::new(RefCell::new(Store::default()));
    let before = live_bytes();
    let vms = (0..3)
        .map(|i| {
            (
                Vm::new(config.clone(), None, 0x2000 + i),
                FakeHost::new(&store),
            )
        })
        .collect();
    let mut c = Churn {
        store: Rc::clone(&store),
        vms,
        members: membership(0),
        routed: StdMap::new(),
        max_shared_bytes: 0,
        max_index_entries: 0,
        max_pod_blocks: 0,
    };
    for _ in 0..3 {
        c.tick();
    }
    let mut routed = 0;
    for round in 0..ROUNDS {
        if round % CHANGE_EVERY == 0 && round > 0 {
            let next = membership(round / CHANGE_EVERY);
            for addr in &next {
                if !c.members.contains(addr) {
                    c.routed.remove(addr); // joins (or comes back) holding nothing
                }
            }
            c.members = next;
        }
        for k in 0..PER_ROUND {
            c.route(1 + k % 2, routed);
            routed += 1;
        }
        c.tick();
        c.check(round);
    }
    assert_eq!(routed, PREFIXES);
    assert_eq!(
        c.max_pod_blocks, POD_BLOCKS,
        "pods filled up: their LRUs evicted"
    );
    let routed_requests: u64 = c
        .vms
        .iter()
        .map(|(_, h)| h.counter(Counter::RequestsRouted))
        .sum();
    assert!(
        routed_requests as usize > PREFIXES * 9 / 10,
        "{routed_requests} routed"
    );
    // Each VM's heap: what dropping it frees.
    let mut heaps = Vec::new();
    let held: Vec<usize> = c
        .vms
        .iter()
        .map(|(vm, _)| vm.router.affinity.index_entries())
        .collect();
    while let Some((vm, host)) = c.vms.pop() {
        drop(host);
        let live = live_bytes();
        drop(vm);
        heaps.push(live - live_bytes());
    }
    heaps.reverse();
    let shared: usize = store.borrow().data.values().map(|(v, _)| v.len()).sum();
    println!(
        "churn: {PREFIXES} prefixes, {} membership phases, {ROSTER} addresses: index entries max {} (now {held:?}), \
         VM heaps {heaps:?} bytes, shared data max {} bytes (now {shared}), before {before}",
        ROUNDS / CHANGE_EVERY,
        c.max_index_entries,
        c.max_shared_bytes
    );
    // A VM's heap is its index and small per-pod state: measured 133 bytes per index entry plus
    // 14 KB (this test at 250 and at 1,000 blocks per pod), so a VM stays within 64 KiB plus
    // 192 bytes per block its pods can hold.
    let bound = 64 * 1024 + 192 * MAX_MEMBERS * POD_BLOCKS;
    for heap in &heaps {
        assert!(
            *heap as usize <= bound,
            "a VM's heap is {heap} bytes, bound {bound}"
        );
    }
}
