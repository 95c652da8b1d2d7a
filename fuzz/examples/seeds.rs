//! Writes the seed corpora (`fuzz/corpus/<target>/`) from real samples:
//!
//! * `fuzz/seeds/samples/` — what `fuzz/seeds/capture.sh` recorded from simulated vLLM and SGLang
//!   pods (metrics pages idle and busy, streamed and whole responses, a prefill pod's answer) and
//!   from the real Envoy's admin API, and what `fuzz/seeds/capture_llamacpp.sh` recorded from a
//!   real llama.cpp server (its metrics pages);
//! * `fuzz/seeds/requests/` — OpenAI request bodies of every shape kvroute reads (the API
//!   reference's examples: tools, tool results, image parts, batches, token ids, schemas);
//! * the plugin configurations shipped in `envoy/` and `deploy/kustomize/`;
//! * every shared-data value and queue message, as VMs on the fake host write them while routing
//!   those requests (lease, load table, work and fits boards, pages, snapshot, observations,
//!   evictions, capacity hints);
//! * request headers with bytes that are not UTF-8, as the host serialises them, and the shapes of
//!   answer Envoy hands back for a dispatched call (none, its own 503/504, a refusal, an answer).
//!
//! Run from the repository root: `cargo run --manifest-path fuzz/Cargo.toml --example seeds`
//! (`make fuzz-seeds`). Deterministic: the same samples give the same files.

use kvroute::flow::{BodyOutcome, HeadersOutcome, RequestFlow};
use kvroute::port::Host;
use kvroute::state::{
    page_key, FITS_KEY, INFLIGHT_KEY, LEASE_KEY, LOAD_KEY, PAGE_HEAD_KEY, QUEUE_ID_KEY,
    SNAPSHOT_KEY,
};
use kvroute_fuzz::harness::{aggregated_config, inline_pd_config, Gateway};
use std::fs;
use std::path::{Path, PathBuf};

struct Corpus {
    root: PathBuf,
    written: usize,
}

impl Corpus {
    fn put(&mut self, target: &str, name: &str, bytes: &[u8]) {
        let dir = self.root.join(target);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(name), bytes).unwrap();
        self.written += 1;
    }
}

/// A header map in the Proxy-Wasm ABI's serialised form, from raw bytes (values need not be UTF-8).
fn raw_header_map(headers: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut out = (headers.len() as u32).to_le_bytes().to_vec();
    for (name, value) in headers {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    }
    for (name, value) in headers {
        out.extend_from_slice(name);
        out.push(0);
        out.extend_from_slice(value);
        out.push(0);
    }
    out
}

fn read_dir_sorted(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x != "sh"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, fs::read(&p).unwrap())
        })
        .collect();
    out.sort();
    out
}

/// Every `.yaml` file under `dir`, at any depth.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for path in fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
    {
        if path.is_dir() {
            out.extend(yaml_files(&path));
        } else if path.extension().is_some_and(|x| x == "yaml") {
            out.push(path);
        }
    }
    out
}

/// The JSON plugin configurations inside the shipped Envoy and Istio YAML: `value: '{…}'` lines
/// and `value: |` blocks that hold an object.
fn shipped_configs(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for dir in ["envoy", "deploy/kustomize"] {
        let mut files = yaml_files(&root.join(dir));
        files.sort();
        for file in files {
            let text = fs::read_to_string(&file).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
            for (i, line) in lines.iter().enumerate() {
                let t = line.trim_start();
                let json = if let Some(v) = t.strip_prefix("value: '{") {
                    Some(format!("{{{}", v.trim_end().trim_end_matches('\'')))
                } else if t == "value: |" && lines.get(i + 1).is_some_and(|l| l.trim() == "{") {
                    let indent = lines[i + 1].len() - lines[i + 1].trim_start().len();
                    let body: Vec<&str> = lines[i + 1..]
                        .iter()
                        .take_while(|l| {
                            l.trim().is_empty() || l.len() - l.trim_start().len() >= indent
                        })
                        .copied()
                        .collect();
                    Some(body.join("\n"))
                } else {
                    None
                };
                if let Some(json) = json.filter(|j| j.contains("\"pools\"")) {
                    out.push((format!("{dir}-{stem}-{}", i + 1), json.into_bytes()));
                }
            }
        }
    }
    out
}

fn main() {
    let root = std::env::current_dir().unwrap();
    let seeds = root.join("fuzz/seeds");
    let samples: Vec<(String, Vec<u8>)> = read_dir_sorted(&seeds.join("samples"));
    let sample = |name: &str| -> Vec<u8> {
        samples
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no sample {name}: run fuzz/seeds/capture.sh"))
            .1
            .clone()
    };
    let requests = read_dir_sorted(&seeds.join("requests"));
    let mut c = Corpus {
        root: root.join("fuzz/corpus"),
        written: 0,
    };

    // Pods' pages and answers.
    for (name, bytes) in &samples {
        if name.contains("metrics") {
            c.put("prom", name, bytes);
        }
        if !name.contains("metrics") && !name.contains("clusters") {
            c.put("usage", name, bytes);
        }
    }
    c.put("prom", "tiny-trtllm", b"trtllm_num_requests_waiting 2\ntrtllm_num_requests_running 5\ntrtllm_kv_cache_utilization 0.5\n");
    let clusters = sample("envoy-clusters");
    for name in [
        "pool",
        "checked",
        "outbound|8000||vllm.default.svc.cluster.local",
    ] {
        let mut input = name.as_bytes().to_vec();
        input.push(b'\n');
        input.extend_from_slice(&clusters);
        c.put(
            "admin_clusters",
            &format!("envoy-{}", name.replace('|', "_")),
            &input,
        );
    }

    // Request bodies, each with what a pod answers (streamed with usage, whole, a prefill answer).
    let stream = sample("vllm-chat-stream");
    let whole = sample("vllm-chat");
    let prefill = sample("prefill-answer");
    for (name, body) in &requests {
        // Flag bits 3 and 0 together read the body as an Anthropic Messages request.
        let chat = if name.starts_with("messages") {
            8 | 1
        } else {
            u8::from(name.starts_with("chat") || name.starts_with("pd"))
        };
        for (flags, response, tag) in [
            (chat, &stream, "stream"),
            (chat | 4, &whole, "whole-2vm"),
            (chat | 2, &prefill, "inline"),
        ] {
            let mut input = vec![flags];
            input.extend_from_slice(body);
            input.push(0xff);
            input.extend_from_slice(response);
            c.put("request_body", &format!("{name}-{tag}"), &input);
        }
        // The prefill pod's answer to this client body.
        for (status, response, tag) in [(200u8, &prefill, "ok"), (0, &sample("vllm-error"), "404")]
        {
            let mut input = if status == 200 {
                vec![1, 0]
            } else {
                vec![3, 0]
            };
            input.extend_from_slice(body);
            input.push(0xff);
            input.extend_from_slice(response);
            c.put("inline_prefill", &format!("{name}-{tag}"), &input);
        }
    }

    // Bodies Python's `json` reads and serde_json refuses, after the client's KV handle (flag
    // bit 1): strict and passed through (bit 0), as UTF-8, UTF-16 (bit 2) and behind a BOM
    // (bit 3), on plain and encoded paths (bits 4-5).
    let tails: [(&str, &str); 6] = [
        (
            "valid",
            r#""model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        ),
        ("nan", r#""model":"m","prompt":"p","temperature":NaN}"#),
        ("infinity", r#""model":"m","prompt":"p","top_p":-Infinity}"#),
        ("1e400", r#""model":"m","prompt":"p","n":1e400}"#),
        ("surrogate", r#""model":"m","prompt":"\ud800"}"#),
        (
            "escaped-key",
            r#""kv_transfer_param\u0073":1,"model":"m","prompt":"p"}"#,
        ),
    ];
    for (name, tail) in tails {
        for flags in [2u8, 3, 6, 7, 10, 11, 0x22, 0x33] {
            let input = [&[flags][..], tail.as_bytes()].concat();
            c.put("body_differential", &format!("{name}-{flags:02x}"), &input);
        }
    }
    let deep = format!(
        r#""model":"m","prompt":"p","x":{}{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    for flags in [2u8, 3] {
        let input = [&[flags][..], deep.as_bytes()].concat();
        c.put("body_differential", &format!("deep-{flags:02x}"), &input);
    }

    // Request headers as the host serialises them, with bytes that are not UTF-8 where kvroute
    // reads (session, priority, SLO, its own routing headers) and where it does not.
    let post: [(&[u8], &[u8]); 4] = [
        (b":method", b"POST"),
        (b":path", b"/v1/chat/completions"),
        (b"content-type", b"application/json"),
        (b"content-length", b"64"),
    ];
    let hostile: [(&str, &[u8]); 7] = [
        ("plain", b""),
        ("session-latin1", b"x-session-id\0caf\xe9"),
        ("priority-ff", b"x-kvroute-priority\0\xff\xfe"),
        ("slo-80", b"x-slo-ttft-ms\0\x80"),
        (
            "spoofed-destination",
            b"x-gateway-destination-endpoint\0\xc3\x28",
        ),
        ("authorization", b"authorization\0Bearer \xa0"),
        ("user-agent", b"user-agent\0\xff\xfe"),
    ];
    for (name, extra) in hostile {
        let mut headers: Vec<(&[u8], &[u8])> = post.to_vec();
        if let Some(nul) = extra.iter().position(|b| *b == 0) {
            headers.push((&extra[..nul], &extra[nul + 1..]));
        }
        for flags in [0u8, 1] {
            let mut input = vec![flags];
            input.extend_from_slice(&raw_header_map(&headers));
            c.put("header_bytes", &format!("{name}-{flags}"), &input);
        }
    }
    let get: [(&[u8], &[u8]); 3] = [
        (b":method", b"GET"),
        (b":path", b"/health"),
        (b"user-agent", b"\xff\xfe"),
    ];
    c.put(
        "header_bytes",
        "get-user-agent",
        &[&[0][..], &raw_header_map(&get)].concat(),
    );

    // Call answers: the leader's calls and an inline prefill call, each without an answer (a
    // reset), with Envoy's 503 and 504, a refusal, and answered.
    for (kind, flags) in [("leader", 0u8), ("prefill", 1)] {
        let answered = if flags == 1 {
            prefill.clone()
        } else {
            sample("vllm-metrics-idle")
        };
        for (tag, status, body) in [
            ("reset", 0u8, &b""[..]),
            ("ok", 1, &answered[..]),
            (
                "503",
                2,
                b"upstream connect error or disconnect/reset before headers",
            ),
            ("504", 3, b"upstream request timeout"),
            ("401", 4, br#"{"error":"unauthorized"}"#),
        ] {
            let mut input = vec![flags, status];
            input.extend_from_slice(body);
            c.put("call_answers", &format!("{kind}-{tag}"), &input);
        }
    }

    // Configurations.
    for (name, json) in shipped_configs(&root) {
        c.put("config", &name, &json);
    }
    c.put(
        "config",
        "full",
        br#"{"pools":[{"name":"a","role":"decode","endpoints":["127.0.0.1:8000","10.0.0.2:9000"]},
              {"name":"p","role":"prefill","cluster":"outbound|8000||p.svc"}],
             "admin_cluster":"kvroute_admin","debug_header":true,"on_no_endpoint":"passthrough",
             "poll_interval_ms":100,"poll_timeout_ms":500,"stale_after_ms":1000,"discovery_interval_ms":500,
             "leader_lease_ms":900,"max_endpoints_in_header":2,"max_body_bytes":1048576,
             "default_pod_capacity_blocks":1000,"max_pod_capacity_blocks":2000,"rendezvous_load_slack":1,
             "overload_guard":{"abs_gap":4,"rel_gap":2},"block":{"mode":"chars","tokens_per_block":32,"chars_per_token":3},
             "prediction":{"prior":{"overhead_ms":5,"us_per_token":20,"us_per_decoding":10},"prior_samples":4,"tie_band":0.1},
             "pd":{"mode":"inline","prefill_timeout_ms":5000,"split_overhead_ms":10},
             "session":{"header":"X-Session-Id","max_slowdown":2},
             "shedding":{"priority_header":"x-priority","queue_depth":3,"kv_cache":0.9},
             "slo":{"ttft_header":"x-slo-ttft-ms","tpot_header":""}}"#,
    );
    c.put("config", "empty", b"");

    // Shared data and queue messages, as VMs write them while routing the requests above.
    for (config_name, config) in [("agg", aggregated_config()), ("pd", inline_pd_config())] {
        let mut g = Gateway::ready(&config, 3);
        let mut n = 0;
        for (name, body) in &requests {
            let path = if name.starts_with("completion") {
                "/v1/completions"
            } else {
                "/v1/chat/completions"
            };
            // A worker VM routes it; the queue holds its messages until the leader's next tick.
            let worker = 1 + n % 2;
            n += 1;
            let mut flow = RequestFlow::new();
            let (vm, host) = &mut g.vms[worker];
            let length = body.len().to_string();
            let header = |h: &str| match h {
                ":method" => Some("POST".to_string()),
                ":path" => Some(path.to_string()),
                "content-length" => Some(length.clone()),
                _ => None,
            };
            if flow.on_request_headers(vm, host, &header, false) != HeadersOutcome::WaitForBody {
                continue;
            }
            let routed = matches!(
                flow.on_request_body(vm, host, Some(body)),
                BodyOutcome::Route(_)
            );
            if routed && n <= 3 {
                // The work board while the request is open.
                let board = host.shared_get(INFLIGHT_KEY).0.unwrap_or_default();
                c.put("work_board", &format!("{config_name}-open-{name}"), &board);
            }
            let _ = flow.on_prefill_answer(vm, host, 200, &prefill);
            let _ = flow.on_response_headers(vm, host, Some("200"), false);
            host.advance_ms(30);
            // A response reporting fewer cached tokens than expected makes an eviction message.
            let answer: &[u8] = if n % 3 == 0 {
                br#"data: {"usage":{"prompt_tokens":4000,"prompt_tokens_details":{"cached_tokens":0}}}"#
            } else {
                &stream
            };
            for chunk in answer.chunks(700) {
                let bytes = flow.wants_response_bytes().then_some(chunk);
                flow.on_response_body(vm, host, chunk.len(), bytes, false);
                host.advance_ms(2);
            }
            flow.on_done(vm, host, None, None);
            let queue = host
                .shared_get(QUEUE_ID_KEY)
                .0
                .map(|b| u32::from_le_bytes(b[..4].try_into().unwrap()))
                .unwrap();
            let mut taken = Vec::new();
            while let Some(m) = host.queue_pop(queue) {
                taken.push(m);
            }
            for (i, m) in taken.iter().enumerate() {
                c.put("messages", &format!("{config_name}-{name}-{i}"), m);
                host.queue_push(queue, m);
            }
            g.advance_ms(400);
            g.tick();
        }
        for _ in 0..4 {
            g.advance_ms(600);
            g.tick();
        }
        let (_, host) = &g.vms[0];
        let get = |k: &str| host.shared_get(k).0.unwrap_or_default();
        c.put("lease", &format!("{config_name}-lease"), &get(LEASE_KEY));
        c.put("load_table", &format!("{config_name}-load"), &get(LOAD_KEY));
        c.put(
            "work_board",
            &format!("{config_name}-idle"),
            &get(INFLIGHT_KEY),
        );
        c.put("fits_board", &format!("{config_name}-fits"), &get(FITS_KEY));
        c.put(
            "pages",
            &format!("{config_name}-snapshot"),
            &get(SNAPSHOT_KEY),
        );
        let head = u64::from_le_bytes(get(PAGE_HEAD_KEY)[..8].try_into().unwrap());
        for seq in 1..=head {
            c.put(
                "pages",
                &format!("{config_name}-page-{seq}"),
                &get(&page_key(seq)),
            );
        }
    }
    println!("wrote {} seed files under {}", c.written, c.root.display());
}
