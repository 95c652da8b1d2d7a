//! kvsim under published engine profiles, end to end over HTTP: per-pod speed, the vLLM V1 KV pool
//! (preemption counted in `/metrics`), and P/D pulls that free the prefill pod's held blocks.
//!
//! Latencies are checked on the pods' own histograms, which record simulated time exactly, so the
//! checks do not depend on how loaded the machine is.

use std::time::Duration;

use kvsim::{profile, spawn_pod, spawn_pods, Role, SimConfig};
use serde_json::{json, Value};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
}

fn llama8b(time_scale: f64) -> SimConfig {
    SimConfig {
        time_scale,
        ..SimConfig::default().with_profile(profile::find("llama-3.1-8b-h100").expect("profile"))
    }
}

/// `n` distinct short words: exactly `n` simulator tokens.
fn prompt(tag: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("{tag}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn post(url: &str, body: Value) -> Value {
    let r = client()
        .post(url)
        .json(&body)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    r.json().await.expect("json")
}

async fn metric(base: &str, name: &str) -> f64 {
    let text = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_speed_pod_takes_twice_the_step_time() {
    let cfg = SimConfig {
        pod_speed: vec![1.0, 0.5],
        ..llama8b(0.05)
    };
    let p = cfg.profile;
    let pods = spawn_pods(cfg, 2).await.expect("pods");
    for pod in &pods {
        post(
            &format!("{}/v1/completions", pod.url()),
            json!({"prompt": prompt("s", 2000), "max_tokens": 1}),
        )
        .await;
    }
    // TTFT = α0 + α1·2000 + (β0 + β1·2000) / speed + α2, in µs.
    let overhead = p.queueing_us(2000) + p.output_token_us();
    let step = p.step_us(2000, 0).expect("fitted");
    for (pod, speed) in pods.iter().zip([1.0, 0.5]) {
        let ttft = metric(&pod.url(), "vllm:time_to_first_token_seconds_sum").await * 1e6;
        let want = overhead + step / speed;
        assert!(
            (ttft - want).abs() < 100.0,
            "speed {speed}: TTFT {ttft} us, want {want}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_preempts_and_every_request_still_completes() {
    // 8 blocks of 16 tokens; two 48-token prompts that each grow to 88 tokens (6 blocks).
    let pod = spawn_pod(SimConfig {
        num_gpu_blocks: 8,
        ..llama8b(0.2)
    })
    .await
    .expect("pod");
    let url = format!("{}/v1/completions", pod.url());
    let asks = ["a", "b"].map(|tag| {
        let url = url.clone();
        tokio::spawn(async move {
            post(&url, json!({"prompt": prompt(tag, 48), "max_tokens": 40})).await
        })
    });
    for a in asks {
        let r = a.await.expect("task");
        assert_eq!(r["usage"]["completion_tokens"], 40);
    }
    let preempted = metric(&pod.url(), "vllm:num_preemptions_total").await;
    assert!(preempted >= 1.0);
    let stats = pod.stats();
    assert_eq!(stats.preemptions_total as f64, preempted);
    assert!(stats.profile.starts_with("llama-3.1-8b-h100: BLIS fit"));
    assert_eq!(metric(&pod.url(), "vllm:kv_cache_usage_perc").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_pod_frees_its_blocks_once_the_decoder_has_pulled() {
    // Separate spawns: not siblings, so the decoder tells the producer over HTTP, as across hosts.
    let prefill = spawn_pod(SimConfig {
        role: Role::Prefill,
        ..llama8b(0.05)
    })
    .await
    .expect("prefill pod");
    let decode = spawn_pod(SimConfig {
        role: Role::Decode,
        ..llama8b(0.05)
    })
    .await
    .expect("decode pod");
    let text = prompt("p", 4000);
    let r = post(
        &format!("{}/v1/completions", prefill.url()),
        json!({"prompt": text, "max_tokens": 20,
               "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false}}),
    )
    .await;
    let kv = r["kv_transfer_params"].clone();
    assert_eq!(kv["remote_block_ids"].as_array().map(Vec::len), Some(250));
    // 250 blocks are held for the decoder (vLLM reports them as used).
    let held = metric(&prefill.url(), "vllm:kv_cache_usage_perc").await;
    assert!((held - 250.0 / 29205.0).abs() < 1e-9, "held usage {held}");

    let r = post(
        &format!("{}/v1/completions", decode.url()),
        json!({"prompt": text, "max_tokens": 3, "kv_transfer_params": kv}),
    )
    .await;
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 3999);
    let mut usage = held;
    for _ in 0..100 {
        usage = metric(&prefill.url(), "vllm:kv_cache_usage_perc").await;
        if usage == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(usage, 0.0, "the pull notification freed the held blocks");
    // The decoder's TTFT: α0 + α1·4000, the 3,999-token pull over 100 Gb/s, one decode step, α2.
    let cfg = llama8b(1.0);
    let p = cfg.profile;
    let want = p.queueing_us(4000)
        + cfg.transfer_time(3999).as_secs_f64() * 1e6
        + p.step_us(0, 1).expect("fitted")
        + p.output_token_us();
    let ttft = metric(&decode.url(), "vllm:time_to_first_token_seconds_sum").await * 1e6;
    assert!((ttft - want).abs() < 100.0, "TTFT {ttft} us, want {want}");
}
