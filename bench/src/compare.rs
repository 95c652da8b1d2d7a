//! The policy comparison behind `kvbench compare` (and the stacks `kvbench demo` / `up` run): for
//! each load-balancing policy, fresh simulated pods and a fresh Envoy, the same seeded workload
//! through it, then one table and kvroute's ratios against round-robin.
//!
//! Every policy gets new pods so that no run inherits another's warm prefix caches, and the same
//! [`WorkloadSpec`] (same seed) so that every run offers identical traffic. Fresh pods start with
//! empty caches, and that cold start (every tenant's first prefill, arriving at once) is an overload
//! burst whose length varies from run to run; so a comparison can leave the first `warmup` seconds
//! out of the figures: those requests are sent like the others, but latencies count only for requests
//! started after it, and the pods' counters are read at that moment instead of before the run.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};

use super::peers::{PeerPolicy, PeerStack};
use super::report::CacheReset;
use super::routing::{ClientRouter, OracleObjective};
use super::table::Table;
use super::workload::WorkloadGen;
use super::{
    driver, metrics, render_json, render_table, run, Api, Load, RunReport, WorkloadKind,
    WorkloadSpec,
};
use harness::{self, plugin_config, Envoy, EnvoyOptions, Lb, Sim};

/// How Envoy chooses a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// The kvroute plugin picks the pod (`override_host`, round-robin fallback).
    Kvroute,
    /// The same with flow control on ([`flow_control_config`]): while every pod is full, requests
    /// wait at the gateway and are released by priority and fairly between flows.
    KvrouteFlow,
    /// The same Envoy and configuration with the previous version's module
    /// ([`StackOptions::previous_wasm`], by default the build of the commit pinned in
    /// `bench/previous-version`, see [`previous_version`]): what a routing change is judged
    /// against besides the peers.
    KvroutePrevious,
    /// The same Envoy, module and configuration with the signal the workload is about turned off
    /// ([`BenchDefaults::signal_off`], e.g. adapter loads not priced): what the signal is worth.
    KvrouteWithoutSignal,
    /// Envoy's own round-robin, no plugin.
    RoundRobin,
    /// Envoy's own least-request (power of two choices), no plugin.
    LeastRequest,
    /// The perfect-knowledge bound: the client asks every simulated pod for its true state
    /// (`/sim/probe`) and names the pod with the earliest first token in
    /// `x-gateway-destination-endpoint`; a plain Envoy with `override_host` (no plugin) forwards it
    /// (see [`routing`](super::routing)).
    Oracle,
    /// The same, minimising each request's TTFT plus the wait it adds to the requests queued on the
    /// pod ([`OracleObjective::TotalWait`]); not in the verdicts.
    OracleTotal,
    /// Another router in place of Envoy (see [`peers`](super::peers)): sglang-router, smg or
    /// vllm-router with its cache-aware or its round-robin policy.
    Peer(PeerPolicy),
}

impl Policy {
    pub const ALL: [Policy; 8] = [
        Policy::Kvroute,
        Policy::KvrouteFlow,
        Policy::KvroutePrevious,
        Policy::KvrouteWithoutSignal,
        Policy::RoundRobin,
        Policy::LeastRequest,
        Policy::Oracle,
        Policy::OracleTotal,
    ];

    /// The row label: `kvroute`, `kvroute-flow`, `kvroute-previous`, `round-robin`, `least-request`,
    /// `perfect-knowledge`, `perfect-knowledge-total`, or a peer's ([`PeerPolicy::label`]).
    pub fn label(self) -> &'static str {
        match self {
            Policy::Kvroute => "kvroute",
            Policy::KvrouteFlow => "kvroute-flow",
            Policy::KvroutePrevious => "kvroute-previous",
            Policy::KvrouteWithoutSignal => "kvroute-without-signal",
            Policy::RoundRobin => "round-robin",
            Policy::LeastRequest => "least-request",
            Policy::Oracle => "perfect-knowledge",
            Policy::OracleTotal => "perfect-knowledge-total",
            Policy::Peer(p) => p.label(),
        }
    }

    pub fn from_name(name: &str) -> Result<Self> {
        Policy::ALL
            .into_iter()
            .chain(PeerPolicy::ALL.map(Policy::Peer))
            .find(|p| p.label() == name)
            .ok_or_else(|| {
                let known: Vec<&str> = Policy::ALL
                    .into_iter()
                    .chain(PeerPolicy::ALL.map(Policy::Peer))
                    .map(Policy::label)
                    .collect();
                anyhow!("unknown policy {name:?} ({})", known.join(", "))
            })
    }

    /// How Envoy's cluster picks a host; `None` for a peer, which runs without Envoy.
    pub fn lb(self) -> Option<Lb> {
        match self {
            Policy::Kvroute
            | Policy::KvrouteFlow
            | Policy::KvroutePrevious
            | Policy::KvrouteWithoutSignal
            | Policy::Oracle
            | Policy::OracleTotal => Some(Lb::OverrideHost),
            Policy::RoundRobin => Some(Lb::RoundRobin),
            Policy::LeastRequest => Some(Lb::LeastRequest),
            Policy::Peer(_) => None,
        }
    }

    /// Whether Envoy runs the kvroute plugin: this version's module or the previous one's.
    pub fn is_kvroute(self) -> bool {
        matches!(
            self,
            Policy::Kvroute
                | Policy::KvrouteFlow
                | Policy::KvroutePrevious
                | Policy::KvrouteWithoutSignal
        )
    }
}

/// The queue time after which kvroute-flow answers a held request 429 `queue_timeout`, in
/// simulated seconds (the plugin's default `ttl_ms`, 30 s, at real speed; the plugin's clock is
/// the wall clock, so [`flow_control_config`] scales it by the time scale).
pub const FLOW_TTL_S: f64 = 30.0;

/// kvroute-flow's `flow_control`: the plugin's defaults (queue depth 4, KV 0.9, 1,024 held per
/// worker, the Inference Extension's fairness header) with the TTL of [`FLOW_TTL_S`] simulated
/// seconds in wall-clock milliseconds at `time_scale`.
pub fn flow_control_config(time_scale: f64) -> Value {
    json!({
        "enabled": true,
        "queue_depth": 4,
        "kv_cache": 0.9,
        "max_held": 1024,
        "ttl_ms": ((FLOW_TTL_S * time_scale * 1000.0).round() as u64).max(1),
        "fairness_header": super::workload::FAIRNESS_HEADER,
    })
}

/// The file that pins the previous version (`bench/previous-version`): the first word of its
/// first line that is neither empty nor a comment is the commit.
pub const PREVIOUS_VERSION_FILE: &str = "bench/previous-version";

/// The pinned previous version's full commit hash, from [`PREVIOUS_VERSION_FILE`].
pub fn previous_version() -> Result<String> {
    let path = harness::repo_root().join(PREVIOUS_VERSION_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    parse_previous_version(&text).with_context(|| format!("{}: no commit", path.display()))
}

fn parse_previous_version(text: &str) -> Result<String> {
    let commit = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .and_then(|l| l.split_whitespace().next())
        .ok_or_else(|| anyhow!("no line names a commit"))?;
    anyhow::ensure!(
        commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit()),
        "{commit:?} is not a full 40-digit commit hash"
    );
    Ok(commit.to_owned())
}

/// Where `make previous-module` builds the module of `commit`:
/// `target/previous/<commit>/kvroute.wasm`.
pub fn previous_wasm_path(commit: &str) -> PathBuf {
    harness::repo_root()
        .join("target/previous")
        .join(commit)
        .join("kvroute.wasm")
}

/// The previous version's module: `explicit` when given, else the build of the pinned commit.
/// Fails, with the fix, when the file is missing.
pub fn resolve_previous_wasm(explicit: Option<&Path>) -> Result<PathBuf> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => previous_wasm_path(&previous_version()?),
    };
    if !path.exists() {
        bail!(
            "the previous version's module {} is missing: run `make previous-module` (or give \
             --previous-wasm PATH)",
            path.display()
        );
    }
    Ok(path)
}

/// The plugin settings of a benchmark run: polling fast enough for a 20× simulator, and the debug
/// header on, from which kvbench reads kvroute's `predicted_ttft_ms` per request.
pub fn bench_plugin_extra() -> Value {
    bench_plugin_extra_polling(BENCH_POLL_INTERVAL_MS)
}

/// How often a benchmark's kvroute polls the pods (`kvbench compare --poll-interval-ms`).
pub const BENCH_POLL_INTERVAL_MS: u64 = 100;

/// [`bench_plugin_extra`] polling every `poll_ms`: a pod is stale after ten polls missed and the
/// leader's lease lasts four (1 s and 400 ms at the default 100 ms, the harness's lease).
pub fn bench_plugin_extra_polling(poll_ms: u64) -> Value {
    json!({
        "poll_interval_ms": poll_ms,
        "stale_after_ms": poll_ms * 10,
        "leader_lease_ms": poll_ms * 4,
        "debug_header": true
    })
}

/// One `kvsim` process of a pool: its pods and the arguments that set them apart.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PodGroup {
    pub pods: usize,
    /// `kvsim` arguments added to the stack's own for this process.
    pub sim_args: Vec<String>,
}

impl PodGroup {
    pub fn new(pods: usize, sim_args: &[&str]) -> Self {
        Self {
            pods,
            sim_args: sim_args.iter().map(|s| (*s).to_owned()).collect(),
        }
    }
}

/// The kvsim arguments of a pod half as fast as the default one: every cost doubled.
pub const HALF_SPEED_SIM_ARGS: [&str; 8] = [
    "--prefill-overhead-ms",
    "80",
    "--prefill-us-per-token",
    "800",
    "--decode-base-ms",
    "30",
    "--decode-us-per-seq",
    "1000",
];

/// How a [`Stack`] is started.
#[derive(Clone, Debug)]
pub struct StackOptions {
    /// Pods to simulate (ignored when endpoints are given, or `groups` are).
    pub pods: usize,
    /// Several `kvsim` processes whose pods form one pool (e.g. pods of unequal speed); empty = one
    /// process of `pods` pods.
    pub groups: Vec<PodGroup>,
    /// Extra `kvsim` arguments (`--time-scale` is added from `time_scale`).
    pub sim_args: Vec<String>,
    pub time_scale: f64,
    /// Merged into the test-speed plugin configuration ([`plugin_config`]) for kvroute (and for
    /// the previous version's module).
    pub plugin_extra: Value,
    /// The module of [`Policy::KvroutePrevious`]; `None` = the build of the pinned commit
    /// ([`resolve_previous_wasm`]).
    pub previous_wasm: Option<PathBuf>,
    /// Envoy worker threads.
    pub workers: usize,
    /// Gateways in front of the same pods: each its own Envoy with the policy (with kvroute, its
    /// own leader, index and boards; nothing shared but the pods). The driver spreads requests
    /// over them (see [`driver::DriveOptions::other_gateways`]).
    pub replicas: usize,
    /// With kvroute and several replicas: each replica is told the others' listeners
    /// (`peers.endpoints`, the same list in each, its own included) and they exchange placements.
    pub replica_sync: bool,
    /// With kvroute: probe every pod before each request and report the gateway's choices against
    /// the pods' own estimates (`ClientRouter::Shadow`, a diagnostic).
    pub shadow_probe: bool,
    /// Inference listener port (0 = OS-chosen).
    pub listen_port: u16,
    /// Admin port (0 = OS-chosen).
    pub admin_port: u16,
    /// How long to wait for kvroute to see every pod healthy.
    pub ready_timeout: Duration,
    /// With kvroute, fail when the pods are not all healthy by then (else only warn).
    pub require_healthy: bool,
    /// kvroute's configuration exactly as given (`kvbench up --config`), instead of the
    /// test-speed one with `plugin_extra` merged in.
    pub plugin_config: Option<String>,
    /// Merged into `plugin_extra` for [`Policy::KvrouteWithoutSignal`] ([`BenchDefaults::signal_off`]).
    pub signal_off: Value,
    /// Merged into `plugin_extra` for this version's module only (sections the previous version
    /// does not have, which its configuration parser refuses: [`time_scaled_extra`]).
    pub current_module_extra: Value,
}

impl Default for StackOptions {
    fn default() -> Self {
        Self {
            pods: 4,
            groups: Vec::new(),
            sim_args: Vec::new(),
            time_scale: 1.0,
            plugin_extra: bench_plugin_extra(),
            previous_wasm: None,
            workers: 2,
            replicas: 1,
            replica_sync: true,
            shadow_probe: false,
            listen_port: 0,
            admin_port: 0,
            ready_timeout: Duration::from_secs(30),
            require_healthy: true,
            plugin_config: None,
            signal_off: Value::Null,
            current_module_extra: Value::Null,
        }
    }
}

/// Envoy with one policy in front of pods, and the simulator process if the pods are simulated.
/// Dropping it kills Envoy, then the simulator.
pub struct Stack {
    pub envoy: Envoy,
    /// Further gateway replicas (`StackOptions::replicas`), listening on ports of their own.
    pub replicas: Vec<Envoy>,
    pub sim: Option<Sim>,
    /// Further simulator processes of the same pool (`StackOptions::groups`).
    pub extra_sims: Vec<Sim>,
    /// `ip:port` of each pod.
    pub pods: Vec<String>,
    pub policy: Policy,
    /// Pods kvroute reported healthy when the stack became ready (kvroute only).
    pub healthy: Option<u64>,
}

impl Stack {
    /// Starts `opts.pods` fresh simulated pods and Envoy with `policy` in front of them.
    pub async fn start_simulated(policy: Policy, opts: &StackOptions) -> Result<Stack> {
        // Fail on a missing Envoy or plugin before starting anything.
        check_envoy_installed()?;
        match policy {
            Policy::Kvroute | Policy::KvrouteFlow | Policy::KvrouteWithoutSignal => {
                harness::wasm_path()?;
            }
            Policy::KvroutePrevious => {
                resolve_previous_wasm(opts.previous_wasm.as_deref())?;
            }
            _ => {}
        }
        let sims = start_sims(opts)?;
        let pods: Vec<String> = sims.iter().flat_map(|s| s.pods.clone()).collect();
        let mut sims = sims.into_iter();
        let first = sims.next();
        let mut stack = Self::start(policy, pods, first, opts).await?;
        stack.extra_sims = sims.collect();
        Ok(stack)
    }

    /// Starts Envoy with `policy` in front of `pods` (which `sim` serves, if given) and waits until
    /// it is ready: listening, and with kvroute, every pod seen healthy.
    pub async fn start(
        policy: Policy,
        pods: Vec<String>,
        sim: Option<Sim>,
        opts: &StackOptions,
    ) -> Result<Stack> {
        let lb = policy.lb().ok_or_else(|| {
            anyhow!(
                "{} is a router of its own, not an Envoy policy: start it with PeerStack",
                policy.label()
            )
        })?;
        check_envoy_installed()?;
        let gateways = opts.replicas.max(1);
        // Replicas that exchange placements must know each other's listeners before they start.
        let mut listen_ports = vec![opts.listen_port];
        let mut extra = opts.plugin_extra.clone();
        if policy.is_kvroute() && gateways > 1 && opts.replica_sync {
            if listen_ports[0] == 0 {
                listen_ports[0] = harness::free_port()?;
            }
            for _ in 1..gateways {
                listen_ports.push(harness::free_port()?);
            }
            let endpoints: Vec<String> = listen_ports
                .iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect();
            // As often as the bench polls the pods (`bench_plugin_extra`).
            extra["peers"] = json!({"endpoints": endpoints, "interval_ms": 100});
        }
        if policy == Policy::KvrouteFlow {
            extra["flow_control"] = flow_control_config(opts.time_scale);
        }
        if policy.is_kvroute() && policy != Policy::KvroutePrevious {
            merge_sections(&mut extra, &opts.current_module_extra);
        }
        if policy == Policy::KvrouteWithoutSignal {
            merge_sections(&mut extra, &opts.signal_off);
        }
        let plugin = policy.is_kvroute().then(|| {
            opts.plugin_config
                .clone()
                .unwrap_or_else(|| plugin_config(&pods, extra))
        });
        let wasm = match policy {
            Policy::Kvroute | Policy::KvrouteFlow | Policy::KvrouteWithoutSignal => {
                Some(harness::wasm_path()?)
            }
            Policy::KvroutePrevious => Some(resolve_previous_wasm(opts.previous_wasm.as_deref())?),
            _ => None,
        };
        let mut eo = EnvoyOptions::new(&pods, lb, plugin);
        eo.wasm = wasm;
        eo.concurrency = opts.workers;
        eo.listen_port = listen_ports[0];
        eo.admin_port = opts.admin_port;
        let envoy = Envoy::start(&eo)
            .await
            .with_context(|| format!("starting Envoy with {}", policy.label()))?;
        let mut replicas = Vec::new();
        for i in 1..gateways {
            eo.listen_port = listen_ports.get(i).copied().unwrap_or(0);
            eo.admin_port = 0;
            replicas.push(Envoy::start(&eo).await.with_context(|| {
                format!("starting gateway replica {} with {}", i + 1, policy.label())
            })?);
        }
        let mut stack = Stack {
            envoy,
            replicas,
            sim,
            extra_sims: Vec::new(),
            pods,
            policy,
            healthy: None,
        };
        if policy.is_kvroute() {
            stack.healthy = Some(stack.wait_healthy(opts).await?);
        }
        Ok(stack)
    }

    /// Waits until kvroute reports every pod healthy in every replica; returns the first's count.
    async fn wait_healthy(&self, opts: &StackOptions) -> Result<u64> {
        let want = self.pods.len() as u64;
        for replica in &self.replicas {
            wait_kvroute_healthy(replica, want, opts).await?;
        }
        wait_kvroute_healthy(&self.envoy, want, opts).await
    }

    /// Base URL of the inference listener.
    pub fn url(&self) -> String {
        self.envoy.url("")
    }

    /// Base URLs of the other gateway replicas.
    pub fn other_urls(&self) -> Vec<String> {
        self.replicas.iter().map(|e| e.url("")).collect()
    }

    pub fn admin_url(&self) -> String {
        format!("http://{}", self.envoy.admin)
    }
}

/// Starts the simulated pods of `opts`: one `kvsim` process per group (or one of `opts.pods`).
pub fn start_sims(opts: &StackOptions) -> Result<Vec<Sim>> {
    let groups = if opts.groups.is_empty() {
        vec![PodGroup::new(opts.pods, &[])]
    } else {
        opts.groups.clone()
    };
    anyhow::ensure!(groups.iter().all(|g| g.pods >= 1), "need at least one pod");
    let scale = opts.time_scale.to_string();
    let mut sims = Vec::with_capacity(groups.len());
    for g in &groups {
        let mut args: Vec<&str> = vec!["--time-scale", &scale];
        args.extend(opts.sim_args.iter().map(String::as_str));
        args.extend(g.sim_args.iter().map(String::as_str));
        sims.push(Sim::start(g.pods, &args).context("starting the simulated pods (kvsim)")?);
    }
    Ok(sims)
}

/// What a comparison sends its workload to: Envoy with a policy, or a peer router.
enum Front {
    Envoy(Stack),
    Peer(PeerStack),
}

impl Front {
    async fn start(policy: Policy, opts: &StackOptions) -> Result<Front> {
        Ok(match policy {
            Policy::Peer(peer) => {
                anyhow::ensure!(
                    opts.replicas <= 1,
                    "{}: gateway replicas are Envoy stacks only",
                    policy.label()
                );
                // Fail on a router that is not installed before starting the pods.
                peer.router.check_installed()?;
                let sims = start_sims(opts)?;
                let pods = sims.iter().flat_map(|s| s.pods.clone()).collect();
                Front::Peer(PeerStack::start(peer, pods, sims).await?)
            }
            _ => Front::Envoy(Stack::start_simulated(policy, opts).await?),
        })
    }

    fn url(&self) -> String {
        match self {
            Front::Envoy(s) => s.url(),
            Front::Peer(s) => s.url(),
        }
    }

    fn pods(&self) -> &[String] {
        match self {
            Front::Envoy(s) => &s.pods,
            Front::Peer(s) => &s.pods,
        }
    }

    fn other_urls(&self) -> Vec<String> {
        match self {
            Front::Envoy(s) => s.other_urls(),
            Front::Peer(_) => Vec::new(),
        }
    }
}

/// Waits until kvroute in `envoy` reports `want` pods healthy (every pool's pods count); returns the
/// last count seen. Past `opts.ready_timeout` it fails if `opts.require_healthy`, else returns.
pub async fn wait_kvroute_healthy(envoy: &Envoy, want: u64, opts: &StackOptions) -> Result<u64> {
    let deadline = Instant::now() + opts.ready_timeout;
    loop {
        let n = envoy.stat("wasmcustom.kvroute.pods_healthy").await;
        if n == want {
            return Ok(n);
        }
        if Instant::now() > deadline {
            if opts.require_healthy {
                bail!(
                    "kvroute saw {n} of {want} pods healthy after {:?}; Envoy log:\n{}",
                    opts.ready_timeout,
                    log_tail(envoy, 30)
                );
            }
            return Ok(n);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// kvroute's `kvroute.flow.*` counters in `envoy`, each summed over its labels but the drops'
/// reason (`flow.dropped_total{reason=queue_timeout}`), and how many pods had each seat cap for
/// the overload guard at the end (`pods_with_seats{seats=8}`: `kvroute.pod.seats` above 0); empty
/// when none (or the admin API did not answer).
pub async fn flow_counters(envoy: &Envoy) -> std::collections::BTreeMap<String, u64> {
    const PREFIX: &str = "wasmcustom.kvroute.";
    let mut out = std::collections::BTreeMap::new();
    for (name, value) in envoy.labelled_stats().await.unwrap_or_default() {
        let base = harness::strip_labels(&name);
        let Some(metric) = base.strip_prefix(PREFIX) else {
            continue;
        };
        if metric == "pod.seats" {
            if value > 0 {
                *out.entry(format!("pods_with_seats{{seats={value}}}"))
                    .or_default() += 1;
            }
            continue;
        }
        if !metric.starts_with("flow.") {
            continue;
        }
        let key = match harness::label_value(&name, "reason") {
            Some(reason) => format!("{metric}{{reason={reason}}}"),
            None => metric.to_owned(),
        };
        *out.entry(key).or_default() += value;
    }
    out
}

/// Fails early, with the fix, when Envoy is missing.
pub fn check_envoy_installed() -> Result<()> {
    let bin = harness::envoy_bin().context("Envoy not installed: run `make tools`")?;
    if !bin.exists() {
        bail!(
            "Envoy not installed ({} missing): run `make tools`",
            bin.display()
        );
    }
    Ok(())
}

/// The last `n` lines of Envoy's log.
pub fn log_tail(envoy: &Envoy, n: usize) -> String {
    let log = envoy.log();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Wall-clock budget of one metrics scrape.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// [`run`], except that requests started in the first `warmup_s` simulated seconds are left out of
/// the report and the pods' counters are read at `warmup_s` rather than before the run. With
/// `warmup_s` = 0 it is [`run`].
pub async fn run_after_warmup(
    target: &str,
    pods: &[String],
    spec: &WorkloadSpec,
    time_scale: f64,
    warmup_s: f64,
) -> Result<RunReport> {
    run_after_warmup_with(
        target,
        pods,
        spec,
        time_scale,
        warmup_s,
        &driver::DriveOptions::default(),
    )
    .await
}

/// [`run_after_warmup`] with a client-side router (see [`driver::DriveOptions`]).
pub async fn run_after_warmup_with(
    target: &str,
    pods: &[String],
    spec: &WorkloadSpec,
    time_scale: f64,
    warmup_s: f64,
    drive: &driver::DriveOptions,
) -> Result<RunReport> {
    anyhow::ensure!(
        warmup_s.is_finite() && warmup_s >= 0.0,
        "warm-up must be >= 0"
    );
    if warmup_s == 0.0
        && drive.router.is_none()
        && drive.other_gateways.is_empty()
        && drive.pod_reset.is_none()
    {
        return run(target, pods, spec, time_scale).await;
    }
    anyhow::ensure!(
        warmup_s < spec.duration_s,
        "warm-up ({warmup_s} s) must be shorter than the duration ({} s)",
        spec.duration_s
    );
    if let Some(at) = drive.pod_reset.map(|r| r.at_s) {
        anyhow::ensure!(
            at.is_finite() && at > 0.0 && at < spec.duration_s,
            "the cache reset ({at} s) must fall inside the run (0–{} s)",
            spec.duration_s
        );
    }
    spec.validate()?;
    let cut = warmup_s * time_scale;
    let client = reqwest::Client::builder().no_proxy().build()?;
    let scrape = {
        let (client, pods) = (client.clone(), pods.to_vec());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(cut)).await;
            metrics::scrape_all(&client, &pods, SCRAPE_TIMEOUT).await
        })
    };
    let reset = drive.pod_reset.map(|r| {
        let reset_pods = r.pods.unwrap_or(pods.len()).min(pods.len());
        let (client, pods) = (client.clone(), pods[..reset_pods].to_vec());
        let task = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(r.at_s * time_scale)).await;
            reset_caches(&client, &pods, r.restart).await
        });
        (task, r.at_s)
    });
    let out = driver::drive_with(target, spec, time_scale, drive).await?;
    let before = scrape.await.context("the warm-up scrape task failed")?;
    let after = metrics::scrape_all(&client, pods, SCRAPE_TIMEOUT).await;
    let cache_reset = match reset {
        Some((task, at)) => {
            let (done, errors) = task.await.context("the cache reset task failed")?;
            Some(CacheReset::of(
                &out.records,
                time_scale,
                warmup_s,
                at,
                done,
                errors,
            ))
        }
        None => None,
    };
    let records: Vec<driver::RequestRecord> = out
        .records
        .into_iter()
        .filter(|r| r.start_s >= cut)
        .map(|mut r| {
            r.start_s -= cut;
            r
        })
        .collect();
    let wall = (out.wall.as_secs_f64() - cut).max(0.0);
    let mut report = RunReport::build(
        spec,
        time_scale,
        wall,
        &records,
        metrics::deltas(pods, before, after),
    );
    report.cache_reset = cache_reset;
    Ok(report)
}

/// Empties every pod's prefix cache (`POST /sim/reset` with an empty body: the pod addressed;
/// `POST /sim/restart` where `restart`, a restart the pods' metrics show), all pods at once.
/// Returns the pods reset and, for the others, why not.
pub async fn reset_caches(
    client: &reqwest::Client,
    pods: &[String],
    restart: bool,
) -> (usize, Vec<String>) {
    let path = if restart { "sim/restart" } else { "sim/reset" };
    let calls = pods.iter().map(|pod| async move {
        let base = if pod.starts_with("http://") || pod.starts_with("https://") {
            pod.trim_end_matches('/').to_owned()
        } else {
            format!("http://{pod}")
        };
        let resp = client
            .post(format!("{base}/{path}"))
            .timeout(SCRAPE_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("{pod}: {e}"))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(format!("{pod}: {}", resp.status()))
        }
    });
    let results = futures::future::join_all(calls).await;
    let done = results.iter().filter(|r| r.is_ok()).count();
    (done, results.into_iter().filter_map(Result::err).collect())
}

/// Sends each of `bodies` to every pod directly (not through Envoy), all pods in parallel, and
/// waits for the answers: what a workload says every pod already holds
/// ([`WorkloadGen::prewarm_bodies`]).
pub async fn prewarm_pods(pods: &[String], api: Api, bodies: &[Value]) -> Result<()> {
    if bodies.is_empty() {
        return Ok(());
    }
    let client = reqwest::Client::builder().no_proxy().build()?;
    let calls = pods.iter().map(|pod| {
        let client = client.clone();
        async move {
            for body in bodies {
                let resp = client
                    .post(format!("http://{pod}{}", api.path()))
                    .json(body)
                    .timeout(Duration::from_secs(120))
                    .send()
                    .await
                    .with_context(|| format!("pre-warming {pod}"))?;
                anyhow::ensure!(
                    resp.status().is_success(),
                    "pre-warming {pod}: {}",
                    resp.status()
                );
                let _ = resp.bytes().await;
            }
            Ok::<(), anyhow::Error>(())
        }
    });
    for r in futures::future::join_all(calls).await {
        r?;
    }
    Ok(())
}

/// Runs `spec` once per policy, each on fresh pods and a fresh Envoy, and returns the labelled
/// reports in policy order; the first `warmup_s` simulated seconds are not measured (see
/// [`run_after_warmup`]). Before each run the workload's pre-warm requests go to every pod. Progress
/// goes to stderr.
pub async fn compare(
    policies: &[Policy],
    spec: &WorkloadSpec,
    opts: &StackOptions,
    warmup_s: f64,
) -> Result<Vec<(String, RunReport)>> {
    Ok(
        compare_with(policies, spec, opts, warmup_s, &CompareOptions::default())
            .await?
            .rows,
    )
}

/// What [`compare_with`] does beyond [`compare`].
#[derive(Clone, Debug, Default)]
pub struct CompareOptions {
    /// Empty the pods' caches during each run ([`driver::DriveOptions::pod_reset`]).
    pub pod_reset: Option<driver::PodReset>,
    /// A policy that fails (its router not installed, its stack not starting) is reported in
    /// [`Compared::failed`] and the others still run, rather than the whole comparison failing.
    pub keep_going: bool,
}

/// The runs of one comparison: the labelled reports, and the policies that failed (with
/// [`CompareOptions::keep_going`]) with why.
#[derive(Debug, Default)]
pub struct Compared {
    pub rows: Vec<(String, RunReport)>,
    pub failed: Vec<(String, String)>,
}

/// [`compare`] with a cache reset and/or going on past a failing policy.
pub async fn compare_with(
    policies: &[Policy],
    spec: &WorkloadSpec,
    opts: &StackOptions,
    warmup_s: f64,
    extra: &CompareOptions,
) -> Result<Compared> {
    let mut out = Compared::default();
    for (i, &policy) in policies.iter().enumerate() {
        let at = (i + 1, policies.len());
        match compare_one(policy, at, spec, opts, warmup_s, extra).await {
            Ok(row) => out.rows.push(row),
            Err(e) if extra.keep_going => {
                eprintln!(
                    "{} seed {} — {}: FAILED, going on: {e:#}",
                    spec.workload.name(),
                    spec.seed,
                    policy.label()
                );
                out.failed
                    .push((policy.label().to_owned(), format!("{e:#}")));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// One policy's run of [`compare_with`]: the labelled report.
async fn compare_one(
    policy: Policy,
    (i, of): (usize, usize),
    spec: &WorkloadSpec,
    opts: &StackOptions,
    warmup_s: f64,
    extra: &CompareOptions,
) -> Result<(String, RunReport)> {
    spec.validate()?;
    let prewarm = WorkloadGen::new(spec)?.prewarm_bodies();
    let n_pods = if opts.groups.is_empty() {
        opts.pods
    } else {
        opts.groups.iter().map(|g| g.pods).sum()
    };
    let t0 = Instant::now();
    let tag = format!(
        "[{}/{}] {} seed {} — {}",
        i,
        of,
        spec.workload.name(),
        spec.seed,
        policy.label()
    );
    match policy {
        Policy::Peer(p) => eprintln!(
            "{tag}: starting {n_pods} pods and {} (--policy {})…",
            p.router.name(),
            p.policy_flag()
        ),
        _ if opts.replicas > 1 => eprintln!(
            "{tag}: starting {n_pods} pods and {} Envoys ({} workers each)…",
            opts.replicas, opts.workers
        ),
        _ => eprintln!(
            "{tag}: starting {n_pods} pods and Envoy ({} workers)…",
            opts.workers
        ),
    }
    let stack = Front::start(policy, opts).await?;
    prewarm_pods(stack.pods(), spec.api, &prewarm).await?;
    eprintln!(
        "{tag}: ready in {:.1} s; sending for {} s simulated ({:.1} s wall) and draining…",
        t0.elapsed().as_secs_f64(),
        spec.duration_s,
        spec.duration_s * opts.time_scale
    );
    let objective = match policy {
        Policy::Oracle => Some(OracleObjective::OwnTtft),
        Policy::OracleTotal => Some(OracleObjective::TotalWait),
        _ => None,
    };
    let router = match objective {
        Some(o) => Some(ClientRouter::oracle(
            stack.pods().to_vec(),
            opts.time_scale,
            o,
        )),
        None if opts.shadow_probe && policy == Policy::Kvroute => {
            Some(ClientRouter::shadow(stack.pods().to_vec()))
        }
        None => None,
    };
    let drive = driver::DriveOptions {
        router: router.map(Arc::new),
        other_gateways: stack.other_urls(),
        pod_reset: extra.pod_reset,
    };
    let report = run_after_warmup_with(
        &stack.url(),
        stack.pods(),
        spec,
        opts.time_scale,
        warmup_s,
        &drive,
    )
    .await
    .with_context(|| format!("running {} with {}", spec.workload.name(), policy.label()))?;
    let mut report = report;
    if let Front::Envoy(s) = &stack {
        if policy.is_kvroute() {
            report.gateway_flow = flow_counters(&s.envoy).await;
        }
    }
    drop(stack);
    let client_router = match &drive.router {
        Some(r) => {
            let c: Vec<String> = r
                .counters()
                .snapshot()
                .into_iter()
                .filter(|(_, v)| *v > 0)
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            format!(" (client router: {})", c.join(", "))
        }
        None => String::new(),
    };
    eprintln!(
        "{tag}: {} requests measured, {} ok, {:.1} s wall in all{client_router}",
        report.requests,
        report.ok,
        t0.elapsed().as_secs_f64()
    );
    let label = match opts.replicas {
        0 | 1 => policy.label().to_owned(),
        n if policy.is_kvroute() && !opts.replica_sync => {
            format!("{}-unshared ×{n}", policy.label())
        }
        n => format!("{} ×{n}", policy.label()),
    };
    Ok((label, report))
}

/// What `kvbench compare` runs a workload with when no flag says otherwise: the load, the sending
/// window, the unmeasured start and the pods.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchDefaults {
    pub load: Load,
    /// Simulated seconds of sending.
    pub duration_s: f64,
    /// Simulated seconds sent but not measured.
    pub warmup_s: f64,
    /// The kvsim processes of the pool (every one gets the command line's `--sim-args` too).
    pub groups: Vec<PodGroup>,
    /// Merged (top-level keys) into kvroute's configuration for this workload: what a deployer
    /// would set for its pool (`overload`: the pods' seat cap, `overload_guard.max_running`).
    pub plugin_extra: Value,
    /// What turns off the signal this workload is about (`many-adapters`: adapter loads not
    /// priced), merged section by section into kvroute's configuration for
    /// [`Policy::KvrouteWithoutSignal`]; `Null` where the workload has none (the policy then runs
    /// only where named).
    pub signal_off: Value,
}

/// The `make bench` settings of the workload named `name` (see [`WorkloadKind::NAMES`]). Each run
/// takes about 300 simulated seconds (15 s of wall time at time scale 0.05) plus the drain:
///
/// * `multi-tenant`: 4 pods, 4 requests/s (48 tenants × 3,000 words: more than twice one pod's KV).
/// * `multi-turn`: 4 pods, 5/s. `agent`: 4 pods, 1/s.
/// * `shared-agent`: 3 pods, 24 clients in a closed loop; the 4,000-word prefix is pre-warmed on
///   every pod, so only the 30 s after the start (the first calls' queues) is left unmeasured.
/// * `long-unique`: 4 pods, 2.6 arrivals/s of which 8% are 8,000-word prompts: ~2.4 streams/s of
///   400–800 tokens, about 32 running at once.
/// * `multi-tenant-stall`: 4 pods with `--chunked-prefill-tokens 0` (each prefill runs whole in
///   one step and stalls every decode beside it: kvsim's default, written out), 4 requests/s over
///   12 tenants.
/// * `unequal-pool`: 3 default pods and 1 pod with every cost doubled ([`HALF_SPEED_SIM_ARGS`], a
///   second kvsim process in the same Envoy pool), 2 requests/s of unique 2,000–4,000-word prompts
///   (~70% of the pool's prefill capacity).
/// * `interference`: 4 pods at `make bench-pd`'s rate (not in `--workload all`).
pub fn bench_defaults(name: &str) -> Result<BenchDefaults> {
    let d = |load: Load, duration_s: f64, warmup_s: f64, groups: Vec<PodGroup>| BenchDefaults {
        load,
        duration_s,
        warmup_s,
        groups,
        plugin_extra: Value::Null,
        signal_off: Value::Null,
    };
    let four = || vec![PodGroup::new(4, &[])];
    Ok(match name {
        "multi-tenant" => d(Load::Open { rate: 4.0 }, 300.0, 60.0, four()),
        "multi-turn" => d(Load::Open { rate: 5.0 }, 300.0, 60.0, four()),
        "agent" => d(Load::Open { rate: 1.0 }, 300.0, 60.0, four()),
        "shared-agent" => d(
            Load::Closed { concurrency: 24 },
            300.0,
            30.0,
            vec![PodGroup::new(3, &[])],
        ),
        "long-unique" => d(Load::Open { rate: 2.6 }, 240.0, 30.0, four()),
        "multi-tenant-stall" => d(
            Load::Open { rate: 4.0 },
            300.0,
            60.0,
            vec![PodGroup::new(4, &["--chunked-prefill-tokens", "0"])],
        ),
        "unequal-pool" => d(
            Load::Open { rate: 2.0 },
            300.0,
            30.0,
            vec![
                PodGroup::new(3, &[]),
                PodGroup::new(1, &HALF_SPEED_SIM_ARGS),
            ],
        ),
        "overload" => BenchDefaults {
            plugin_extra: json!({"overload_guard": {"max_running": OVERLOAD_MAX_NUM_SEQS}}),
            ..d(
                Load::Open {
                    rate: OVERLOAD_BASE_RATE,
                },
                OVERLOAD_DURATION_S,
                OVERLOAD_WARMUP_S,
                vec![PodGroup::new(4, &OVERLOAD_SIM_ARGS)],
            )
        },
        "many-adapters" => {
            let params = crate::workload::ManyAdapterParams::default();
            let mut args: Vec<String> = vec!["--lora-modules".into()];
            args.extend(params.lora_modules());
            args.extend(["--max-loras", "2", "--lora-load-ms"].map(String::from));
            args.push(LORA_LOAD_SIM_MS.to_string());
            BenchDefaults {
                signal_off: json!({"adapters": {"price_loads": false}}),
                ..d(
                    Load::Open { rate: 4.0 },
                    300.0,
                    30.0,
                    vec![PodGroup {
                        pods: 4,
                        sim_args: args,
                    }],
                )
            }
        }
        "tiered-tenants" => BenchDefaults {
            signal_off: json!({"kv_tiers": []}),
            ..d(
                Load::Open { rate: 4.0 },
                300.0,
                60.0,
                vec![PodGroup::new(4, &TIERED_SIM_ARGS)],
            )
        },
        "interference" => d(
            Load::Open {
                rate: super::compare_pd::INTERFERENCE_RATE,
            },
            super::compare_pd::INTERFERENCE_DURATION,
            super::compare_pd::INTERFERENCE_WARMUP,
            four(),
        ),
        other => bail!(
            "unknown workload {other:?} ({})",
            WorkloadKind::NAMES.join(", ")
        ),
    })
}

/// `overload`'s base rate (requests per simulated second, every tenant together) outside its
/// surge: below the pool's capacity, so the queue drains after the surge (×3) has overfilled it.
pub const OVERLOAD_BASE_RATE: f64 = 3.0;
/// `overload`'s sending window, simulated seconds: the surge (40–100 s) and 60 s of drain.
pub const OVERLOAD_DURATION_S: f64 = 160.0;
/// `overload`'s unmeasured start (every tenant's first prefill).
pub const OVERLOAD_WARMUP_S: f64 = 10.0;
/// `overload`'s pods: 8 sequences at once each, so a pool of 4 saturates at a few requests a
/// second and a pod's queue forms in front of its engine rather than inside a 32-wide batch.
pub const OVERLOAD_SIM_ARGS: [&str; 2] = ["--max-num-seqs", "8"];
/// The seat cap of `overload`'s pods, which kvroute is told (`overload_guard.max_running`): engines
/// do not export it, and without it a queue held back by the cap looks like prefill work.
pub const OVERLOAD_MAX_NUM_SEQS: u64 = 8;

/// `tiered-tenants`' pods: a GPU of 1,000 blocks (16,000 tokens) and a host tier of 2,500 more
/// (40,000 tokens), at kvsim's default host link (400 Gb/s).
pub const TIERED_SIM_ARGS: [&str; 4] = ["--num-gpu-blocks", "1000", "--cpu-offload-blocks", "2500"];
/// `tiered-tenants`' host tier in tokens ([`TIERED_SIM_ARGS`]: 2,500 blocks of 16).
pub const TIERED_HOST_TOKENS: u64 = 40_000;
/// What kvroute is told a host-tier token costs to load (simulated µs): 128 KiB over kvsim's
/// 50 GB/s host link.
pub const TIERED_LOAD_US_PER_TOKEN: f64 = 2.6;

/// `many-adapters`' simulated adapter load (`--lora-load-ms`): kvsim's default, a rank-16 adapter
/// of a 7–8B model read from disk (see kvsim's `DEFAULT_LORA_LOAD_MS`).
pub const LORA_LOAD_SIM_MS: f64 = 100.0;

/// kvroute's settings that follow the time scale, for the workload `name` (merged into its
/// configuration): `many-adapters`' `adapters.load_ms` and `tiered-tenants`' `kv_tiers`, the pods'
/// loads in wall time, as a deployer sets them for their hardware.
pub fn time_scaled_extra(name: &str, time_scale: f64) -> Value {
    match name {
        "many-adapters" => {
            json!({"adapters": {"load_ms": LORA_LOAD_SIM_MS * time_scale}})
        }
        "tiered-tenants" => json!({"kv_tiers": [{
            "name": "host",
            "capacity_tokens": TIERED_HOST_TOKENS,
            "load_us_per_token": TIERED_LOAD_US_PER_TOKEN * time_scale,
        }]}),
        _ => Value::Null,
    }
}

/// `extra`'s sections merged into `into`'s: a section both have gets `extra`'s keys, the rest of
/// `into`'s kept (both JSON objects; anything else in `extra` is ignored).
pub fn merge_sections(into: &mut Value, extra: &Value) {
    if let (Value::Object(into), Value::Object(extra)) = (into, extra) {
        for (k, v) in extra {
            match (into.get_mut(k), v) {
                (Some(Value::Object(section)), Value::Object(keys)) => {
                    for (key, value) in keys {
                        section.insert(key.clone(), value.clone());
                    }
                }
                _ => {
                    into.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

/// `extra`'s top-level keys set in `into` (both JSON objects; anything else in `extra` is ignored).
pub fn merge_top_level(into: &mut Value, extra: &Value) {
    if let (Value::Object(into), Value::Object(extra)) = (into, extra) {
        for (k, v) in extra {
            into.insert(k.clone(), v.clone());
        }
    }
}

/// The pool of `groups` in words: `4 pods`, `3 pods + 1 pod (--prefill-us-per-token 800 …)`.
pub fn describe_groups(groups: &[PodGroup]) -> String {
    let parts: Vec<String> = groups
        .iter()
        .map(|g| {
            let pods = if g.pods == 1 { "pod" } else { "pods" };
            if g.sim_args.is_empty() {
                format!("{} {pods}", g.pods)
            } else {
                format!("{} {pods} ({})", g.pods, g.sim_args.join(" "))
            }
        })
        .collect();
    parts.join(" + ")
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => Some(a / b),
        _ => None,
    }
}

fn fmt_opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.filter(|x| x.is_finite())
        .map_or_else(|| "-".to_owned(), f)
}

/// A number without trailing zeros (at most three decimals).
fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn fmt_ratio(v: Option<f64>) -> String {
    fmt_opt(v, |x| format!("{x:.2}"))
}

fn fmt_pct(v: Option<f64>) -> String {
    fmt_opt(v, |x| format!("{:.1}%", x * 100.0))
}

/// kvroute against round-robin: p90 TTFT, cache-hit ratio, throughput and success, each as both
/// values and their ratio (kvroute / round-robin). Empty when either run is missing.
pub fn render_ratios(rows: &[(String, RunReport)]) -> String {
    let find = |p: Policy| rows.iter().find(|(l, _)| l == p.label()).map(|(_, r)| r);
    let (Some(kv), Some(rr)) = (find(Policy::Kvroute), find(Policy::RoundRobin)) else {
        return String::new();
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "kvroute vs round-robin ({}, {}; ratio = kvroute / round-robin):",
        kv.workload, kv.load
    );
    let ms = |v: Option<f64>| fmt_opt(v, |x| format!("{x:.0} ms"));
    let p90 = ratio(kv.ttft_ms.p90, rr.ttft_ms.p90);
    let faster = p90
        .filter(|&r| r > 0.0)
        .map(|r| format!(" ({:.1}× lower)", 1.0 / r))
        .filter(|_| p90.is_some_and(|r| r < 1.0))
        .unwrap_or_default();
    let lines = [
        (
            "p90 TTFT",
            format!("{} vs {}", ms(kv.ttft_ms.p90), ms(rr.ttft_ms.p90)),
            format!("{}{faster}", fmt_ratio(p90)),
        ),
        (
            "cache-hit ratio",
            format!(
                "{} vs {}",
                fmt_pct(kv.cache_hit_ratio),
                fmt_pct(rr.cache_hit_ratio)
            ),
            fmt_ratio(ratio(kv.cache_hit_ratio, rr.cache_hit_ratio)),
        ),
        (
            "throughput",
            format!(
                "{:.1} vs {:.1} output tok/s ({:.2} vs {:.2} req/s)",
                kv.output_tokens_per_s,
                rr.output_tokens_per_s,
                kv.requests_per_s,
                rr.requests_per_s
            ),
            fmt_ratio(ratio(
                Some(kv.output_tokens_per_s),
                Some(rr.output_tokens_per_s),
            )),
        ),
        (
            "success rate",
            format!(
                "{} vs {} ({}/{} vs {}/{})",
                fmt_pct(kv.success_rate),
                fmt_pct(rr.success_rate),
                kv.ok,
                kv.requests,
                rr.ok,
                rr.requests
            ),
            fmt_ratio(ratio(kv.success_rate, rr.success_rate)),
        ),
    ];
    let mut table = Table::headless().indent(2).left(3);
    for (name, values, r) in lines {
        table.row([name.to_owned(), values, format!("ratio {r}")]);
    }
    out.push_str(&table.text());
    out
}

/// One line saying what was run: the workload's shape, the load, the seed, the warm-up.
pub fn describe(spec: &WorkloadSpec, warmup_s: f64) -> String {
    let shape = match &spec.workload {
        WorkloadKind::MultiTenant(p)
        | WorkloadKind::MultiTenantStall(p)
        | WorkloadKind::TieredTenants(p) => format!(
            "{} tenants × {}-word system prompts, questions of {}–{} words, {}–{} output tokens{}",
            p.tenants,
            p.system_words,
            p.question_words.0,
            p.question_words.1,
            p.max_tokens.0,
            p.max_tokens.1,
            if p.zipf_s > 0.0 {
                format!(", Zipf {}", p.zipf_s)
            } else {
                String::new()
            }
        ),
        WorkloadKind::MultiTurn(p) => format!(
            "{} conversations × {} turns, {}-word system prompts, {}–{} output tokens",
            p.conversations, p.turns, p.system_words, p.max_tokens.0, p.max_tokens.1
        ),
        WorkloadKind::Agent(p) => format!(
            "{} sessions × {} steps, {}-word shared preamble + {}-word contexts, {}–{} output tokens",
            p.sessions,
            p.steps,
            p.preamble_words,
            p.context_words,
            p.max_tokens.0,
            p.max_tokens.1
        ),
        WorkloadKind::SharedAgent(p) => format!(
            "independent calls: a {}-word prefix every pod holds + a unique {}–{}-word context each, {}–{} output tokens",
            p.prefix_words, p.context_words.0, p.context_words.1, p.max_tokens.0, p.max_tokens.1
        ),
        WorkloadKind::ManyAdapters(p) => format!(
            "{} LoRA adapters (Zipf {}) × {}-word system prompts, questions of {}–{} words, {}–{} output tokens",
            p.adapters,
            p.zipf_s,
            p.system_words,
            p.question_words.0,
            p.question_words.1,
            p.max_tokens.0,
            p.max_tokens.1
        ),
        WorkloadKind::UnequalPool(p) => format!(
            "unique prompts of {}–{} words, {}–{} output tokens",
            p.prompt_words.0, p.prompt_words.1, p.max_tokens.0, p.max_tokens.1
        ),
        WorkloadKind::Overload(p) => format!(
            "{} tenants × {}-word system prompts, questions of {}–{} words, {}–{} output tokens; every tenant ×{} from {} to {} s, tenant {} ×{} more from {} to {} s; {:.0}% priority 1, the rest 0",
            p.tenants,
            p.system_words,
            p.question_words.0,
            p.question_words.1,
            p.max_tokens.0,
            p.max_tokens.1,
            trim(p.surge),
            trim(p.surge_start_s),
            trim(p.surge_end_s),
            p.burst_tenant,
            trim(p.burst),
            trim(p.burst_start_s),
            trim(p.burst_end_s),
            p.high_share * 100.0
        ),
        WorkloadKind::Interference(p) | WorkloadKind::LongUnique(p) => {
            let split = match spec.load {
                Load::Open { rate } => format!(
                    " (streams at {}/s, long prompts at {}/s)",
                    trim(rate * (1.0 - p.long_share)),
                    trim(rate * p.long_share)
                ),
                Load::Closed { .. } => String::new(),
            };
            format!(
                "streaming decodes of {}–{}-word prompts and {}–{} output tokens, {:.0}% of arrivals \
                 long uncached prompts of {}–{} words and {}–{} output tokens{split}",
                p.stream_prompt_words.0,
                p.stream_prompt_words.1,
                p.stream_max_tokens.0,
                p.stream_max_tokens.1,
                p.long_share * 100.0,
                p.long_prompt_words.0,
                p.long_prompt_words.1,
                p.long_max_tokens.0,
                p.long_max_tokens.1
            )
        }
    };
    let load = match spec.load {
        Load::Open { rate } => format!("open loop at {rate}/s"),
        Load::Closed { concurrency } => format!("closed loop, {concurrency} in flight"),
    };
    let warmup = if warmup_s > 0.0 {
        format!(", the first {warmup_s} s not measured")
    } else {
        String::new()
    };
    format!(
        "{}: {shape}; {load} for {} s (simulated){warmup}; seed {}",
        spec.workload.name(),
        spec.duration_s,
        spec.seed
    )
}

/// The full text of one comparison: what was run, the table, then the ratios.
pub fn render_text(rows: &[(String, RunReport)], warmup_s: f64) -> String {
    let mut text = rows
        .first()
        .map(|(_, r)| describe(&r.spec, warmup_s) + "\n")
        .unwrap_or_default();
    text.push_str(&render_table(rows));
    for (label, report) in rows {
        if let Some(shadow) = &report.shadow {
            text.push('\n');
            text.push_str(&shadow.describe(label));
            text.push('\n');
        }
    }
    for (label, report) in rows {
        if let Some(reset) = &report.cache_reset {
            text.push('\n');
            text.push_str(&reset.describe(label));
            text.push('\n');
        }
    }
    let overload = super::overload::render_run(rows);
    if !overload.is_empty() {
        text.push('\n');
        text.push_str(&overload);
    }
    let ratios = render_ratios(rows);
    if !ratios.is_empty() {
        text.push('\n');
        text.push_str(&ratios);
    }
    text
}

/// Writes `DIR/<workload>.json` (the reports, each with its `warmup_s`) and `DIR/<workload>.txt`
/// (the text of [`render_text`]).
pub fn write_outputs(
    dir: &Path,
    workload: &str,
    rows: &[(String, RunReport)],
    warmup_s: f64,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json_path = dir.join(format!("{workload}.json"));
    let mut reports = render_json(rows);
    if let Value::Array(items) = &mut reports {
        for item in items {
            if let Value::Object(map) = item {
                map.insert("warmup_s".to_owned(), json!(warmup_s));
            }
        }
    }
    let json = serde_json::to_string_pretty(&reports)?;
    std::fs::write(&json_path, json + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let txt_path = dir.join(format!("{workload}.txt"));
    std::fs::write(&txt_path, render_text(rows, warmup_s))
        .with_context(|| format!("writing {}", txt_path.display()))?;
    Ok(())
}
