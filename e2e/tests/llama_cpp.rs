//! kvroute in front of real llama.cpp servers (`llama-server --metrics`, SmolLM2-135M on the CPU,
//! installed by `make llama` into `.tools/llama/`): their `/metrics` pages, which name none of
//! vLLM's gauges, keep every pod routable; a repeated system prompt goes back to the pod that
//! holds it, and that pod's own answer (`usage.prompt_tokens_details.cached_tokens`) and counters
//! (`llamacpp:prompt_tokens_cached_total`) confirm the hit; a different system prompt finds nothing
//! cached on its first request. Skips, saying so, where `make llama` has not installed the server.

mod common;

use common::{fresh_client, post, Reply};
use harness::{
    free_port, plugin_config, repo_root, scratch_dir, wait_for, Envoy, EnvoyOptions, Lb, Proc,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The name the pods serve (`--alias`), as their `/v1/models` lists it.
const MODEL: &str = "SmolLM2-135M-Instruct";

struct LlamaPod {
    addr: String,
    log: PathBuf,
    _proc: Proc,
}

impl LlamaPod {
    /// One slot of 2048 tokens on one thread: small and quick to start (the model is 98 MB).
    /// Prompt caching is llama-server's default (`--cache-prompt`).
    fn start(bin: &Path, model: &Path, dir: &Path, n: usize) -> LlamaPod {
        let port = free_port().unwrap();
        let log = dir.join(format!("llama-{n}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let proc = Proc::spawn(
            "llama-server",
            Command::new(bin)
                .arg("-m")
                .arg(model)
                .args(["--alias", MODEL, "--host", "127.0.0.1", "--port"])
                .arg(port.to_string())
                .args(["-c", "2048", "-np", "1", "-t", "1", "--metrics"])
                .stdin(Stdio::null())
                .stdout(Stdio::from(out))
                .stderr(Stdio::from(err)),
        )
        .unwrap();
        LlamaPod {
            addr: format!("127.0.0.1:{port}"),
            log,
            _proc: proc,
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The pod's own `llamacpp:` series.
    async fn counters(&self) -> HashMap<String, f64> {
        let text = reqwest::get(format!("http://{}/metrics", self.addr))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (name, value) = l.split_once(' ')?;
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect()
    }

    /// Tokens of `text` alone, as the pod's tokenizer counts them.
    async fn tokens(&self, text: &str) -> u64 {
        let r: Value = fresh_client()
            .post(format!("http://{}/tokenize", self.addr))
            .json(&json!({"content": text}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["tokens"].as_array().unwrap().len() as u64
    }
}

/// A system prompt of distinct sentences for `tenant` (about 30 tokens each); tenants differ from
/// their first word.
fn system_prompt(tenant: &str, sentences: usize) -> String {
    (0..sentences)
        .map(|i| {
            format!(
                "{tenant} rule {i}: vessels of class {} berth at pier {} and report cargo code {}.",
                char::from(b'A' + (i % 26) as u8),
                i * 3 + 1,
                1000 + i * 17
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn chat(system: &str, user: &str) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 4,
        "temperature": 0
    })
}

/// One request through Envoy: the reply, the pod kvroute chose, the cached tokens the pod reported,
/// and the pod whose own counters moved (with how many cached tokens they counted).
struct Served {
    reply: Reply,
    chosen: String,
    cached: u64,
    prompt_tokens: u64,
    counted_by: Vec<(String, u64)>,
}

async fn send(url: &str, pods: &[LlamaPod], body: &Value) -> Served {
    let before = futures::future::join_all(pods.iter().map(|p| p.counters())).await;
    let reply = post(&fresh_client(), url, body, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let after = futures::future::join_all(pods.iter().map(|p| p.counters())).await;
    let usage = &reply.json()["usage"];
    let counted_by = pods
        .iter()
        .zip(before.iter().zip(&after))
        .filter_map(|(pod, (b, a))| {
            let delta = |name: &str| {
                a.get(name).copied().unwrap_or(0.0) - b.get(name).copied().unwrap_or(0.0)
            };
            let prompt = delta("llamacpp:prompt_tokens_total")
                + delta("llamacpp:prompt_tokens_cached_total");
            (prompt > 0.0).then(|| {
                (
                    pod.addr.clone(),
                    delta("llamacpp:prompt_tokens_cached_total") as u64,
                )
            })
        })
        .collect();
    Served {
        chosen: reply.debug_field("pod").unwrap_or_default(),
        cached: usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("no cached_tokens in {}", reply.body)),
        prompt_tokens: usage["prompt_tokens"].as_u64().unwrap(),
        counted_by,
        reply,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_cpp_pods_are_routed_by_the_prefix_they_hold() {
    let dir = repo_root().join(".tools/llama");
    let (bin, model) = (
        dir.join("bin/llama-server"),
        dir.join("SmolLM2-135M-Instruct.Q4_1.gguf"),
    );
    if !bin.exists() || !model.exists() {
        eprintln!(
            "SKIP llama_cpp_pods_are_routed_by_the_prefix_they_hold: {} or {} is missing (`make llama` \
             builds llama.cpp's server and installs SmolLM2-135M there)",
            bin.display(),
            model.display()
        );
        return;
    }
    let started = Instant::now();
    let scratch = scratch_dir("llama").unwrap();
    let pods: Vec<LlamaPod> = (0..2)
        .map(|n| LlamaPod::start(&bin, &model, &scratch, n))
        .collect();
    for pod in &pods {
        let ready = wait_for(Duration::from_secs(30), "llama-server /health", || async {
            reqwest::get(format!("http://{}/health", pod.addr))
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        if let Err(e) = ready {
            panic!("{e}; {} log:\n{}", pod.addr, pod.log_tail());
        }
        let models: Value = reqwest::get(format!("http://{}/v1/models", pod.addr))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(models["data"][0]["id"], MODEL, "{models}");
    }
    let addrs: Vec<String> = pods.iter().map(|p| p.addr.clone()).collect();
    let envoy = Envoy::start(&EnvoyOptions::new(
        &addrs,
        Lb::OverrideHost,
        Some(plugin_config(&addrs, json!({}))),
    ))
    .await
    .unwrap();
    // Both pods' pages read: healthy, and none still waiting for its first poll.
    let polled = wait_for(Duration::from_secs(20), "both pods polled", || async {
        let stats = envoy.stats().await.unwrap_or_default();
        stats.get("wasmcustom.kvroute.pods_healthy") == Some(&2)
            && stats
                .get("wasmcustom.kvroute.pods_stale")
                .copied()
                .unwrap_or(0)
                == 0
    })
    .await;
    if let Err(e) = polled {
        panic!("{e}; envoy log:\n{}", envoy.log());
    }
    // Every worker VM adopts the leader's table on its next tick (25 ms).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let url = envoy.url("/v1/chat/completions");

    let harbour = system_prompt("Harbour", 14);
    let orchard = system_prompt("Orchard", 14);
    let (harbour_tokens, orchard_tokens) = (
        pods[0].tokens(&harbour).await,
        pods[0].tokens(&orchard).await,
    );
    assert!(
        harbour_tokens >= 300 && orchard_tokens >= 300,
        "several blocks: {harbour_tokens}, {orchard_tokens} tokens"
    );
    eprintln!("system prompts: harbour {harbour_tokens} tokens, orchard {orchard_tokens}");

    let report = |what: &str, s: &Served| {
        eprintln!(
            "{what}: pod {} ({}), prompt {} tokens, cached {} (the pod's counters: {:?}); {}",
            s.chosen,
            s.reply.debug_field("reason").unwrap_or_default(),
            s.prompt_tokens,
            s.cached,
            s.counted_by,
            s.reply.debug_field("matched_blocks").unwrap_or_default(),
        );
    };
    // The pod's answer and its own counters agree on who served it and what was cached.
    let served_where_chosen = |s: &Served| {
        assert_eq!(
            s.counted_by,
            vec![(s.chosen.clone(), s.cached)],
            "{:?}",
            s.reply.debug
        );
    };

    let first = send(&url, &pods, &chat(&harbour, "Which pier for class C?")).await;
    report("harbour, first", &first);
    served_where_chosen(&first);
    let holder = first.chosen.clone();
    assert!(addrs.contains(&holder), "{:?}", first.reply.debug);
    assert!(
        first.cached < harbour_tokens / 10,
        "nothing of the prompt was cached before: {}",
        first.cached
    );

    let again = send(
        &url,
        &pods,
        &chat(&harbour, "What is the cargo code of rule 5?"),
    )
    .await;
    report("harbour, again", &again);
    served_where_chosen(&again);
    assert_eq!(again.chosen, holder, "{:?}", again.reply.debug);
    assert_eq!(
        again.reply.debug_field("reason").as_deref(),
        Some("prefix"),
        "{:?}",
        again.reply.debug
    );
    assert!(
        again.cached >= harbour_tokens,
        "the whole system prompt ({harbour_tokens} tokens) was a hit on {holder}: {} cached",
        again.cached
    );

    let other = send(&url, &pods, &chat(&orchard, "Which pier for class C?")).await;
    report("orchard, first", &other);
    served_where_chosen(&other);
    assert_ne!(
        other.reply.debug_field("reason").as_deref(),
        Some("prefix"),
        "{:?}",
        other.reply.debug
    );
    assert!(
        other
            .reply
            .debug_field("matched_blocks")
            .is_some_and(|m| m.starts_with("0/")),
        "{:?}",
        other.reply.debug
    );
    // At most the chat template's opening (`<|im_start|>system\n`) is shared with the harbour
    // prompt, on the pod that served it.
    assert!(
        other.cached <= 8,
        "a new system prompt found {} tokens cached",
        other.cached
    );

    let other_again = send(
        &url,
        &pods,
        &chat(&orchard, "Which class berths at pier 4?"),
    )
    .await;
    report("orchard, again", &other_again);
    served_where_chosen(&other_again);
    assert_eq!(other_again.chosen, other.chosen);
    assert!(
        other_again.cached >= orchard_tokens,
        "{orchard_tokens} system tokens, {} cached",
        other_again.cached
    );

    // Never down: both pods healthy after it all (a pod mid-prefill may be late, never failing).
    let stats = envoy.stats().await.unwrap();
    assert_eq!(stats.get("wasmcustom.kvroute.pods_healthy"), Some(&2));
    assert!(
        !envoy.log().contains("/metrics is unusable"),
        "{}",
        envoy.log()
    );
    eprintln!("took {:.1} s", started.elapsed().as_secs_f64());
}
