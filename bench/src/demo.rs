//! The hands-on stories: `kvbench demo` (three chat requests through kvroute, then through plain
//! round-robin, showing the prefix cache follow a system prompt) and `kvbench up` (Envoy with kvroute
//! in the foreground in front of given endpoints or simulated pods, until Ctrl-C).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use rand::SeedableRng;
use serde_json::{json, Value};

use super::compare::{Policy, Stack, StackOptions};
use super::driver::{SseBuffer, POD_HEADER};
use super::workload::Vocab;
use harness::Sim;

/// The response header kvroute explains its choice in.
pub const DEBUG_HEADER: &str = "x-kvroute-debug";

/// Words in each demo system prompt (≈ simulator tokens): about 3 s of prefill at real speed.
pub const DEMO_SYSTEM_WORDS: usize = 7500;

/// What one streamed chat request showed.
#[derive(Clone, Debug)]
pub struct Probe {
    pub label: String,
    pub pod: Option<String>,
    /// Wall time to the first non-empty content chunk.
    pub ttft: Option<Duration>,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    /// The whole `x-kvroute-debug` header, if any.
    pub debug: Option<String>,
}

impl Probe {
    /// A `key=value` field of the debug header (`reason`, `matched_blocks`, …).
    pub fn debug_field(&self, key: &str) -> Option<String> {
        self.debug.as_ref()?.split(';').find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == key).then(|| v.to_owned())
        })
    }
}

/// Sends one streaming chat request (system prompt + question) and measures it.
pub async fn probe(
    client: &reqwest::Client,
    base_url: &str,
    model: &str,
    label: &str,
    system: &str,
    question: &str,
    max_tokens: u32,
) -> Result<Probe> {
    let body = json!({
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let url = format!("{}/v1/chat/completions", base_url.trim_end_matches('/'));
    let start = Instant::now();
    let resp = client
        .post(&url)
        .json(&body)
        .send()
        .await
        .with_context(|| format!("{label}: POST {url}"))?;
    let status = resp.status();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (pod, debug) = (header(POD_HEADER), header(DEBUG_HEADER));
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        bail!(
            "{label}: HTTP {status}: {}",
            text.chars().take(300).collect::<String>()
        );
    }
    let mut p = Probe {
        label: label.to_owned(),
        pod,
        ttft: None,
        prompt_tokens: None,
        cached_tokens: None,
        debug,
    };
    let mut stream = resp.bytes_stream();
    let mut sse = SseBuffer::default();
    let mut done = false;
    while let Some(item) = stream.next().await {
        let bytes = item.with_context(|| format!("{label}: reading the stream"))?;
        for data in sse.push(&bytes) {
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let Ok(chunk) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            if let Some(err) = chunk.get("error") {
                bail!("{label}: error event: {err}");
            }
            let has_content = chunk
                .get("choices")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|c| c.pointer("/delta/content").and_then(Value::as_str))
                .any(|c| !c.is_empty());
            if has_content && p.ttft.is_none() {
                p.ttft = Some(start.elapsed());
            }
            if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
                p.prompt_tokens = usage.get("prompt_tokens").and_then(Value::as_u64);
                p.cached_tokens = usage
                    .pointer("/prompt_tokens_details/cached_tokens")
                    .and_then(Value::as_u64);
            }
        }
    }
    if !done {
        bail!("{label}: the stream ended without [DONE]");
    }
    Ok(p)
}

/// `7488` → `7,488`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn fmt_secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else {
        format!("{s:.2} s")
    }
}

/// A duration, plus the real-speed (simulated) equivalent when the simulator is scaled.
fn secs(d: Option<Duration>, time_scale: f64) -> String {
    match d {
        None => "-".to_owned(),
        Some(d) if time_scale == 1.0 => fmt_secs(d.as_secs_f64()),
        Some(d) => format!(
            "{} ({} simulated)",
            fmt_secs(d.as_secs_f64()),
            fmt_secs(d.as_secs_f64() / time_scale)
        ),
    }
}

fn probe_line(p: &Probe, time_scale: f64) -> String {
    let cached = match (p.cached_tokens, p.prompt_tokens) {
        (Some(c), Some(t)) => format!("{} of {} cached", thousands(c), thousands(t)),
        (Some(c), None) => format!("{} cached", thousands(c)),
        _ => "cached ?".to_owned(),
    };
    let route = match (p.debug_field("reason"), p.debug_field("matched_blocks")) {
        (Some(r), Some(m)) => format!("kvroute: reason={r} matched_blocks={m}"),
        (Some(r), None) => format!("kvroute: reason={r}"),
        _ => "(no x-kvroute-debug: no plugin)".to_owned(),
    };
    format!(
        "  {:<22}  pod {:<16}  TTFT {:<26}  {:<22}  {route}",
        p.label,
        p.pod.as_deref().unwrap_or("?"),
        secs(p.ttft, time_scale),
        cached
    )
}

/// Options of `kvbench demo`.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    pub pods: usize,
    pub time_scale: f64,
    pub sim_args: Vec<String>,
    pub max_tokens: u32,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            pods: 4,
            time_scale: 1.0,
            sim_args: Vec::new(),
            max_tokens: 24,
        }
    }
}

/// The three requests of the demo, through one stack, on one connection (one Envoy worker).
async fn demo_round(
    policy: Policy,
    opts: &DemoOptions,
    prompts: &[(String, String, String)],
) -> Result<Vec<Probe>> {
    let stack_opts = StackOptions {
        pods: opts.pods,
        sim_args: opts.sim_args.clone(),
        time_scale: opts.time_scale,
        plugin_extra: json!({"poll_interval_ms": 100, "stale_after_ms": 1000, "debug_header": true}),
        ..StackOptions::default()
    };
    println!(
        "\n{}: {} fresh simulated pods behind Envoy (2 workers){}",
        policy.label(),
        opts.pods,
        if policy == Policy::Kvroute {
            " with the kvroute plugin"
        } else {
            ", plain round-robin, no plugin"
        }
    );
    let stack = Stack::start_simulated(policy, &stack_opts).await?;
    println!("  pods: {}", stack.pods.join(", "));
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(600))
        .build()?;
    let mut probes = Vec::new();
    for (label, system, question) in prompts {
        let p = probe(
            &client,
            &stack.url(),
            "sim-model",
            label,
            system,
            question,
            opts.max_tokens,
        )
        .await
        .with_context(|| format!("demo request with {}", policy.label()))?;
        println!("{}", probe_line(&p, opts.time_scale));
        probes.push(p);
    }
    drop(stack);
    Ok(probes)
}

fn summary_line(name: &str, probes: &[Probe], time_scale: f64) -> String {
    let (Some(first), Some(second)) = (probes.first(), probes.get(1)) else {
        return format!("{name}: -");
    };
    let same = first.pod.is_some() && first.pod == second.pod;
    let mut line = format!(
        "{name}: 2nd request {} on {} ({} cached tokens)",
        secs(second.ttft, time_scale),
        if same { "the same pod" } else { "another pod" },
        thousands(second.cached_tokens.unwrap_or(0)),
    );
    let _ = write!(line, "; 1st {}", secs(first.ttft, time_scale));
    if let Some(third) = probes.get(2) {
        let _ = write!(line, ", 3rd {}", secs(third.ttft, time_scale));
    }
    line
}

/// `kvbench demo`: the same three requests through kvroute and then through round-robin.
pub async fn demo(opts: &DemoOptions) -> Result<()> {
    anyhow::ensure!(
        opts.time_scale.is_finite() && opts.time_scale > 0.0,
        "time scale must be > 0"
    );
    let vocab = Vocab::new(7);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let system_a = vocab.text(&mut rng, DEMO_SYSTEM_WORDS);
    let system_b = vocab.text(&mut rng, DEMO_SYSTEM_WORDS);
    let prompts = vec![
        (
            "A + question 1".to_owned(),
            system_a.clone(),
            "How do I reset my password?".to_owned(),
        ),
        (
            "A + question 2".to_owned(),
            system_a,
            "Which plans include priority support?".to_owned(),
        ),
        (
            "B + question 3".to_owned(),
            system_b,
            "Summarise the refund policy in one sentence.".to_owned(),
        ),
    ];
    println!(
        "Three streaming chat requests: system prompt A ({} words) + question 1, A + question 2, then \
         system prompt B ({} words) + question 3.",
        thousands(DEMO_SYSTEM_WORDS as u64),
        thousands(DEMO_SYSTEM_WORDS as u64)
    );
    if opts.time_scale != 1.0 {
        println!(
            "Simulator time scale {}: wall times, with the real-speed (simulated) equivalent.",
            opts.time_scale
        );
    }
    let kv = demo_round(Policy::Kvroute, opts, &prompts).await?;
    let rr = demo_round(Policy::RoundRobin, opts, &prompts).await?;
    println!();
    println!("{}", summary_line("kvroute", &kv, opts.time_scale));
    println!("{}", summary_line("round-robin", &rr, opts.time_scale));
    Ok(())
}

/// Options of `kvbench up`.
#[derive(Clone, Debug)]
pub struct UpOptions {
    /// `host:port` of existing OpenAI-compatible servers; empty = start simulated pods.
    pub endpoints: Vec<String>,
    pub pods: usize,
    pub port: u16,
    /// 0 = OS-chosen.
    pub admin_port: u16,
    pub time_scale: f64,
    pub sim_args: Vec<String>,
    /// Prefill and decode servers (`host:port`): a P/D pair of pools beside `endpoints`.
    pub prefill_endpoints: Vec<String>,
    pub decode_endpoints: Vec<String>,
    /// `sidecar` or `inline` (kvroute's `pd.mode`).
    pub pd_mode: String,
    /// Started by `make up`: errors name the make variables the user typed, not the flags.
    pub via_make: bool,
    /// `--config FILE`: kvroute's configuration (JSON, or the same fields in YAML) to run as it
    /// is, its pools' static endpoints the pods.
    pub config: Option<std::path::PathBuf>,
}

impl UpOptions {
    /// What the user calls an option: the flag, or under `make up` its variable.
    pub fn name(&self, flag: &'static str) -> &'static str {
        if !self.via_make {
            return flag;
        }
        match flag {
            "--endpoints" => "ENDPOINTS=",
            "--port" => "PORT=",
            "--prefill-endpoints" => "PREFILL=",
            "--decode-endpoints" => "DECODE=",
            "--pd-mode" => "PD_MODE=",
            "--config" => "CONFIG=",
            other => other,
        }
    }
}

/// `http://host:port/` or `host:port` → an `ip:port` Envoy's static cluster accepts.
/// `list` names the option the endpoint came from, for the error.
pub async fn resolve_endpoint(endpoint: &str, list: &str) -> Result<String> {
    let e = endpoint.trim();
    let e = e.strip_prefix("http://").unwrap_or(e).trim_end_matches('/');
    if e.is_empty() {
        bail!("empty endpoint in {list}");
    }
    if let Ok(addr) = e.parse::<SocketAddr>() {
        return Ok(addr.to_string());
    }
    let mut addrs: Vec<SocketAddr> = tokio::net::lookup_host(e)
        .await
        .with_context(|| format!("{list} endpoint {endpoint:?}: expected ip:port or host:port"))?
        .collect();
    addrs.sort_by_key(|a| !a.is_ipv4());
    addrs
        .first()
        .map(SocketAddr::to_string)
        .with_context(|| format!("{list} endpoint {endpoint:?} resolves to no address"))
}

/// The first model `GET /v1/models` of `endpoint` lists.
pub async fn first_model(endpoint: &str) -> Option<String> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .ok()?;
    let v: Value = client
        .get(format!("http://{endpoint}/v1/models"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    v.pointer("/data/0/id")?.as_str().map(str::to_owned)
}

/// Waits for Ctrl-C or SIGTERM, or for Envoy to exit on its own (an error).
async fn wait_for_shutdown(stack: &mut Stack) -> Result<&'static str> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            r = tokio::signal::ctrl_c() => {
                r.context("waiting for Ctrl-C")?;
                return Ok("Ctrl-C");
            }
            _ = term.recv() => return Ok("SIGTERM"),
            _ = tick.tick() => {
                if !stack.envoy.proc.is_running() {
                    bail!("Envoy exited; log:\n{}", super::compare::log_tail(&stack.envoy, 30));
                }
                if let Some(sim) = stack.sim.as_mut() {
                    if !sim.proc.is_running() {
                        bail!("the simulated pods (kvsim) exited");
                    }
                }
            }
        }
    }
}

/// `kvbench up`: Envoy + kvroute in the foreground until Ctrl-C / SIGTERM.
pub async fn up(opts: &UpOptions) -> Result<()> {
    super::compare::check_envoy_installed()?;
    harness::wasm_path()?;
    if opts.port != 0 {
        std::net::TcpListener::bind(("127.0.0.1", opts.port)).with_context(|| {
            format!(
                "port {} is not free on 127.0.0.1: choose another with {}",
                opts.port,
                opts.name("--port")
            )
        })?;
    }
    anyhow::ensure!(
        opts.prefill_endpoints.is_empty() || !opts.decode_endpoints.is_empty(),
        "{} needs {} (the pods that decode what they prefill)",
        opts.name("--prefill-endpoints"),
        opts.name("--decode-endpoints")
    );
    if let Some(path) = &opts.config {
        anyhow::ensure!(
            opts.endpoints.is_empty()
                && opts.decode_endpoints.is_empty()
                && opts.prefill_endpoints.is_empty(),
            "{} takes the pods from the configuration's pools: drop the endpoint options",
            opts.name("--config")
        );
        return up_config(opts, path).await;
    }
    if !opts.decode_endpoints.is_empty() {
        return up_pd(opts).await;
    }
    let (pods, sim) = if opts.endpoints.is_empty() {
        anyhow::ensure!(
            opts.time_scale.is_finite() && opts.time_scale > 0.0,
            "time scale must be > 0"
        );
        let scale = opts.time_scale.to_string();
        let mut args: Vec<&str> = vec!["--time-scale", &scale];
        args.extend(opts.sim_args.iter().map(String::as_str));
        let sim = Sim::start(opts.pods, &args).context("starting the simulated pods (kvsim)")?;
        (sim.pods.clone(), Some(sim))
    } else {
        let mut pods = Vec::new();
        for e in &opts.endpoints {
            pods.push(resolve_endpoint(e, opts.name("--endpoints")).await?);
        }
        (pods, None)
    };
    let simulated = sim.is_some();
    let stack_opts = StackOptions {
        pods: pods.len(),
        plugin_extra: json!({"poll_interval_ms": 200, "stale_after_ms": 2000,
                             "leader_lease_ms": 1500, "debug_header": true}),
        listen_port: opts.port,
        admin_port: opts.admin_port,
        ready_timeout: Duration::from_secs(if simulated { 30 } else { 15 }),
        require_healthy: simulated,
        ..StackOptions::default()
    };
    eprintln!(
        "kvbench up: starting Envoy with kvroute in front of {} pod(s); waiting up to {:?} for them to be healthy…",
        pods.len(),
        stack_opts.ready_timeout
    );
    let mut stack = Stack::start(Policy::Kvroute, pods, sim, &stack_opts).await?;
    let model = match stack.pods.first() {
        Some(p) => first_model(p).await,
        None => None,
    }
    .unwrap_or_else(|| "sim-model".to_owned());
    let url = stack.url();
    let admin = stack.admin_url();
    println!("kvroute is up (Envoy, 2 workers, kvroute plugin; loopback only).");
    println!("  listening on  {url}");
    if simulated {
        println!(
            "  pods          {} (simulated, time scale {})",
            stack.pods.join(", "),
            opts.time_scale
        );
    } else {
        println!("  pods          {}", stack.pods.join(", "));
    }
    let healthy = stack.healthy.unwrap_or(0);
    if healthy < stack.pods.len() as u64 {
        println!(
            "  WARNING       kvroute sees {healthy} of {} pods healthy so far (it keeps polling /metrics)",
            stack.pods.len()
        );
    }
    println!("  admin         {admin}");
    println!("  kvroute stats curl -s {admin}/stats | grep wasmcustom.kvroute");
    println!();
    println!("Try (the x-kvroute-debug response header says which pod kvroute chose and why):");
    println!("{}", curl_line(&url, &model));
    println!(
        "  Run it twice: the second answer's x-kvroute-debug says reason=prefix, the same pod."
    );
    println!();
    println!("Ctrl-C to stop.");
    let why = wait_for_shutdown(&mut stack).await?;
    eprintln!(
        "kvbench up: {why}: stopping Envoy{}",
        if simulated { " and the pods" } else { "" }
    );
    drop(stack);
    Ok(())
}

/// The request `kvbench up` suggests. Its system prompt spans several 64-byte blocks, so the
/// second identical request finds them on the pod the first one went to: the prefix hit shows.
pub fn try_request(model: &str) -> Value {
    let system = "You are the support assistant of a cloud hosting company. Answer in two short \
                  sentences, name the relevant product page, never invent prices, and ask one \
                  clarifying question when the customer does not say which region or plan they \
                  use. Products: compute instances, managed databases, object storage, load \
                  balancers, private networks and the command line tool.";
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "How do I resize a compute instance?"}
        ],
        "max_tokens": 32
    })
}

/// `  curl …` with [`try_request`]'s body, on one line for copy and paste.
pub fn curl_line(url: &str, model: &str) -> String {
    format!(
        "  curl -si {url}/v1/chat/completions -H 'content-type: application/json' -d '{}'",
        try_request(model)
    )
}

async fn resolve_all(endpoints: &[String], list: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for e in endpoints {
        out.push(resolve_endpoint(e, list).await?);
    }
    Ok(out)
}

/// `kvbench up` in front of your own prefill/decode servers (and aggregated ones, if given):
/// Envoy's pool cluster holds the decode and aggregated pods, kvroute knows all three pools and
/// disaggregates long prompts in `pd_mode`.
async fn up_pd(opts: &UpOptions) -> Result<()> {
    anyhow::ensure!(
        matches!(opts.pd_mode.as_str(), "sidecar" | "inline"),
        "{} must be sidecar or inline, not {:?}",
        opts.name("--pd-mode"),
        opts.pd_mode
    );
    let aggregated = resolve_all(&opts.endpoints, opts.name("--endpoints")).await?;
    let prefill = resolve_all(&opts.prefill_endpoints, opts.name("--prefill-endpoints")).await?;
    let decode = resolve_all(&opts.decode_endpoints, opts.name("--decode-endpoints")).await?;
    let mut pools = vec![
        json!({"name": "prefill", "role": "prefill", "endpoints": prefill}),
        json!({"name": "decode", "role": "decode", "endpoints": decode}),
    ];
    if !aggregated.is_empty() {
        pools.push(json!({"name": "aggregated", "role": "aggregated", "endpoints": aggregated}));
    }
    let routed: Vec<String> = decode.iter().chain(&aggregated).cloned().collect();
    let stack_opts = StackOptions {
        pods: routed.len() + prefill.len(),
        plugin_extra: json!({"poll_interval_ms": 200, "stale_after_ms": 2000, "leader_lease_ms": 1500,
                             "debug_header": true, "pools": pools, "pd": {"mode": opts.pd_mode}}),
        listen_port: opts.port,
        admin_port: opts.admin_port,
        ready_timeout: Duration::from_secs(15),
        require_healthy: false,
        ..StackOptions::default()
    };
    let mut stack = Stack::start(Policy::Kvroute, routed, None, &stack_opts).await?;
    let model = served_model(decode.first()).await;
    println!(
        "kvroute is up (Envoy, 2 workers, kvroute plugin, P/D {} mode; loopback only).",
        opts.pd_mode
    );
    println!("  listening on  {}", stack.url());
    println!("  prefill pods  {}", prefill.join(", "));
    println!("  decode pods   {}", decode.join(", "));
    if !aggregated.is_empty() {
        println!("  aggregated    {}", aggregated.join(", "));
    }
    print_admin_and_try(&stack, &model);
    println!(
        "  (x-kvroute-debug shows pd=disaggregated|decode_only and the prefill pod; Ctrl-C stops)"
    );
    let why = wait_for_shutdown(&mut stack).await?;
    eprintln!("kvbench up: {why}: stopping Envoy");
    Ok(())
}

/// kvroute's configuration from `path` (JSON, or YAML with the same fields), checked by the
/// plugin's own parser: its compiled form and the JSON the plugin is given.
pub fn read_up_config(path: &std::path::Path) -> Result<(kvroute::config::Config, String)> {
    let name = path.display();
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {name}"))?;
    let value: Value =
        serde_yaml_ng::from_str(&text).with_context(|| format!("{name}: neither JSON nor YAML"))?;
    anyhow::ensure!(
        value.is_object(),
        "{name}: expected kvroute's configuration, a mapping with `pools`"
    );
    let json = value.to_string();
    let config = kvroute::config::Config::parse(json.as_bytes())
        .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    Ok((config, json))
}

/// The pods of a configuration `kvbench up` can run: every pool's static endpoints, those Envoy
/// routes to (aggregated and decode) apart from the prefill pods kvroute reaches by its poll
/// cluster. A pool read from an Envoy cluster (`cluster`) needs the mesh's membership.
pub fn up_config_pods(config: &kvroute::config::Config) -> Result<(Vec<String>, Vec<String>)> {
    use kvroute::common::Role;
    use kvroute::config::Members;
    anyhow::ensure!(
        config.poll_cluster == "kvroute_poll",
        "poll_cluster: kvbench up's Envoy names its polling cluster `kvroute_poll`, not {:?}",
        config.poll_cluster
    );
    let (mut routed, mut prefill) = (Vec::new(), Vec::new());
    for (i, pool) in config.pools.iter().enumerate() {
        let Members::Static(endpoints) = &pool.members else {
            bail!(
                "pools[{i}] ({}): kvbench up runs pools of static `endpoints`; a pool read from an Envoy cluster needs the mesh's membership",
                pool.name
            );
        };
        let into = if pool.role == Role::Prefill {
            &mut prefill
        } else {
            &mut routed
        };
        into.extend(endpoints.iter().cloned());
    }
    anyhow::ensure!(
        !routed.is_empty(),
        "pools: no aggregated or decode pool with endpoints to route to"
    );
    Ok((routed, prefill))
}

/// The model `pod` serves (its first in `/v1/models`), or the simulator's.
async fn served_model(pod: Option<&String>) -> String {
    match pod {
        Some(p) => first_model(p).await,
        None => None,
    }
    .unwrap_or_else(|| "sim-model".to_owned())
}

/// The admin line and a request to try, as `kvbench up` prints them for pools it was given.
fn print_admin_and_try(stack: &Stack, model: &str) {
    println!(
        "  admin         {}  (curl -s {}/stats | grep wasmcustom.kvroute)",
        stack.admin_url(),
        stack.admin_url()
    );
    println!(
        "  try           {}",
        curl_line(&stack.url(), model).trim_start()
    );
}

/// `kvbench up --config FILE`: the user's own configuration in front of the pods it names.
async fn up_config(opts: &UpOptions, path: &std::path::Path) -> Result<()> {
    let (config, json) = read_up_config(path)?;
    let (routed, prefill) = up_config_pods(&config)?;
    let stack_opts = StackOptions {
        pods: routed.len() + prefill.len(),
        plugin_config: Some(json),
        listen_port: opts.port,
        admin_port: opts.admin_port,
        ready_timeout: Duration::from_secs(15),
        require_healthy: false,
        ..StackOptions::default()
    };
    let mut stack = Stack::start(Policy::Kvroute, routed.clone(), None, &stack_opts).await?;
    let model = served_model(routed.first()).await;
    println!(
        "kvroute is up with {} (Envoy, 2 workers; loopback only).",
        path.display()
    );
    println!("  listening on  {}", stack.url());
    println!("  routed pods   {}", routed.join(", "));
    if !prefill.is_empty() {
        println!("  prefill pods  {}", prefill.join(", "));
    }
    print_admin_and_try(&stack, &model);
    println!("Ctrl-C to stop.");
    let why = wait_for_shutdown(&mut stack).await?;
    eprintln!("kvbench up: {why}: stopping Envoy");
    Ok(())
}
