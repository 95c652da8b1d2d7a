//! The routers users would pick instead of kvroute, run in front of the same simulated pods for
//! `make bench-peers`: SGLang's router (`sglang-router`), the Shepherd Model Gateway (`smg`) and
//! vLLM's router (`vllm-router`), each a Rust binary in a PyPI wheel that `make peers` installs,
//! pinned, into its own virtual environment under `.tools/peers/<name>/` (sglang-router and smg
//! both install a `smg` command, so they cannot share one).
//!
//! Each runs with its cache-aware policy (`cache_aware`: an approximate radix tree of the prompts it
//! sent to each worker, pinned to the best match above `cache_threshold` 0.3, shortest queue when the
//! in-flight counts differ by more than 64 and by 1.5×) and with its round-robin as the control that
//! shows what the router itself costs. Every other setting is the router's default, with two
//! exceptions a user would also make: the listener and metrics ports are free loopback ports, and
//! smg's load poll runs every second (its shortest; the default 10 s is 200 simulated seconds at
//! time scale 0.05). The router process is killed by PID when its [`PeerStack`] drops.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use harness::{self, free_port, Proc, Sim};

/// A router from PyPI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerRouter {
    /// `sglang-router` (sgl-project/sglang's sgl-router).
    SglangRouter,
    /// `smg`, the Shepherd Model Gateway (lightseekorg/smg).
    Smg,
    /// `vllm-router` (vllm-project/router).
    VllmRouter,
}

impl PeerRouter {
    pub const ALL: [PeerRouter; 3] = [
        PeerRouter::SglangRouter,
        PeerRouter::Smg,
        PeerRouter::VllmRouter,
    ];

    /// The PyPI name, which is also its `.tools/peers/` directory and its requirements file
    /// `tools/peers/<name>.txt`.
    pub fn name(self) -> &'static str {
        match self {
            PeerRouter::SglangRouter => "sglang-router",
            PeerRouter::Smg => "smg",
            PeerRouter::VllmRouter => "vllm-router",
        }
    }

    /// The console script, and the arguments before the common ones.
    fn command(self) -> (&'static str, &'static [&'static str]) {
        match self {
            PeerRouter::SglangRouter => ("sglang-router", &["launch"]),
            PeerRouter::Smg => ("smg", &["launch", "--load-monitor-interval", "1"]),
            PeerRouter::VllmRouter => ("vllm-router", &[]),
        }
    }

    /// The router's program: `$KVBENCH_PEERS_DIR/<name>/bin/<script>`, by default under
    /// `.tools/peers/`.
    pub fn bin(self) -> PathBuf {
        let dir = std::env::var_os("KVBENCH_PEERS_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| harness::repo_root().join(".tools/peers"));
        dir.join(self.name()).join("bin").join(self.command().0)
    }

    /// Fails, with the fix, when the router is not installed.
    pub fn check_installed(self) -> Result<PathBuf> {
        let bin = self.bin();
        if !bin.exists() {
            bail!(
                "{} not installed ({} missing): run `make peers`",
                self.name(),
                bin.display()
            );
        }
        Ok(bin)
    }
}

/// A peer router with one of its policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerPolicy {
    pub router: PeerRouter,
    /// `cache_aware`, else `round_robin`.
    pub cache_aware: bool,
}

impl PeerPolicy {
    pub const ALL: [PeerPolicy; 6] = [
        PeerPolicy::new(PeerRouter::SglangRouter, true),
        PeerPolicy::new(PeerRouter::SglangRouter, false),
        PeerPolicy::new(PeerRouter::Smg, true),
        PeerPolicy::new(PeerRouter::Smg, false),
        PeerPolicy::new(PeerRouter::VllmRouter, true),
        PeerPolicy::new(PeerRouter::VllmRouter, false),
    ];

    pub const fn new(router: PeerRouter, cache_aware: bool) -> Self {
        Self {
            router,
            cache_aware,
        }
    }

    /// The row label: the router's name for its cache-aware policy, `<name>-rr` for round-robin.
    pub fn label(self) -> &'static str {
        match (self.router, self.cache_aware) {
            (PeerRouter::SglangRouter, true) => "sglang-router",
            (PeerRouter::SglangRouter, false) => "sglang-router-rr",
            (PeerRouter::Smg, true) => "smg",
            (PeerRouter::Smg, false) => "smg-rr",
            (PeerRouter::VllmRouter, true) => "vllm-router",
            (PeerRouter::VllmRouter, false) => "vllm-router-rr",
        }
    }

    /// The policy whose [`label`](Self::label) is `label`.
    pub fn from_label(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.label() == label)
    }

    /// The router's `--policy`.
    pub fn policy_flag(self) -> &'static str {
        if self.cache_aware {
            "cache_aware"
        } else {
            "round_robin"
        }
    }

    /// The router's command-line arguments in front of `pods` (`ip:port`), listening on `port`
    /// and serving its own metrics on `metrics_port`, both on loopback.
    pub fn args(self, pods: &[String], port: u16, metrics_port: u16) -> Vec<String> {
        let (_, pre) = self.router.command();
        let mut args: Vec<String> = pre.iter().map(|s| (*s).to_owned()).collect();
        args.extend(
            [
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                &metrics_port.to_string(),
                "--policy",
                self.policy_flag(),
                "--log-level",
                if self.router == PeerRouter::VllmRouter {
                    "warning"
                } else {
                    "warn"
                },
                "--worker-urls",
            ]
            .map(str::to_owned),
        );
        args.extend(pods.iter().map(|p| format!("http://{p}")));
        args
    }
}

/// Written as its [`label`](PeerPolicy::label).
impl serde::Serialize for PeerPolicy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.label())
    }
}

/// A peer router process in front of pods, and the simulator processes if the pods are simulated.
/// Dropping it kills the router, then the simulators.
pub struct PeerStack {
    pub router: Proc,
    pub policy: PeerPolicy,
    /// `127.0.0.1:port` of the router's listener.
    pub listener: String,
    /// `ip:port` of each pod.
    pub pods: Vec<String>,
    log_path: PathBuf,
    pub sims: Vec<Sim>,
}

/// How long a router gets to register every pod.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

impl PeerStack {
    /// Starts the router with `policy` in front of `pods` (served by `sims`) and waits until it lists
    /// every pod healthy on `GET /workers`.
    pub async fn start(policy: PeerPolicy, pods: Vec<String>, sims: Vec<Sim>) -> Result<PeerStack> {
        let bin = policy.router.check_installed()?;
        let (port, metrics_port) = (free_port()?, free_port()?);
        let dir = harness::scratch_dir(policy.router.name())?;
        let log_path = dir.join("router.log");
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let child = Command::new(&bin)
            .args(policy.args(&pods, port, metrics_port))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut stack = PeerStack {
            router: Proc::new(child, policy.label()),
            policy,
            listener: format!("127.0.0.1:{port}"),
            pods,
            log_path,
            sims,
        };
        stack.wait_ready().await?;
        Ok(stack)
    }

    /// Base URL of the router's listener.
    pub fn url(&self) -> String {
        format!("http://{}", self.listener)
    }

    /// The router's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if !self.router.is_running() {
                bail!(
                    "{} exited during start-up; log:\n{}",
                    self.policy.label(),
                    self.log_tail(40)
                );
            }
            let last = match client.get(format!("{}/workers", self.url())).send().await {
                Ok(resp) => match resp.json::<Value>().await {
                    Ok(v) => {
                        let healthy = healthy_workers(&v);
                        if healthy == self.pods.len() {
                            return Ok(());
                        }
                        format!("{healthy} of {} workers healthy", self.pods.len())
                    }
                    Err(e) => format!("/workers did not answer JSON: {e}"),
                },
                Err(e) => format!("/workers failed: {e}"),
            };
            if Instant::now() > deadline {
                return Err(anyhow!(
                    "{} not ready within {READY_TIMEOUT:?} ({last}); log:\n{}",
                    self.policy.label(),
                    self.log_tail(40)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Workers a router's `GET /workers` lists as healthy (all three answer
/// `{"workers": [{"url": .., "is_healthy": true, ..}], ..}`).
pub fn healthy_workers(v: &Value) -> usize {
    v.get("workers").and_then(Value::as_array).map_or(0, |ws| {
        ws.iter()
            .filter(|w| w.get("is_healthy").and_then(Value::as_bool) == Some(true))
            .count()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels_are_unique_and_name_the_policy() {
        let labels: Vec<&str> = PeerPolicy::ALL.iter().map(|p| p.label()).collect();
        let mut sorted = labels.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), labels.len());
        assert_eq!(PeerPolicy::from_label("kvroute"), None);
        for p in PeerPolicy::ALL {
            assert_eq!(PeerPolicy::from_label(p.label()), Some(p));
            assert!(p.label().starts_with(p.router.name()));
            assert_eq!(p.label().ends_with("-rr"), !p.cache_aware);
        }
    }

    #[test]
    fn arguments_bind_loopback_and_list_every_pod() {
        let pods = vec!["127.0.0.1:1".to_owned(), "127.0.0.1:2".to_owned()];
        let smg = PeerPolicy::new(PeerRouter::Smg, true).args(&pods, 10, 11);
        assert_eq!(&smg[..3], ["launch", "--load-monitor-interval", "1"]);
        let joined = smg.join(" ");
        assert!(joined.contains("--host 127.0.0.1 --port 10"), "{joined}");
        assert!(joined.contains("--prometheus-host 127.0.0.1 --prometheus-port 11"));
        assert!(joined.contains("--policy cache_aware"));
        assert!(joined.ends_with("--worker-urls http://127.0.0.1:1 http://127.0.0.1:2"));
        let vllm = PeerPolicy::new(PeerRouter::VllmRouter, false).args(&pods, 10, 11);
        assert_eq!(vllm[0], "--host", "vllm-router has no subcommand");
        assert!(vllm
            .join(" ")
            .contains("--policy round_robin --log-level warning"));
    }

    #[test]
    fn healthy_workers_counts_only_healthy_ones() {
        let v = json!({"workers": [
            {"url": "http://a", "is_healthy": true},
            {"url": "http://b", "is_healthy": false},
            {"url": "http://c"},
        ], "total": 3});
        assert_eq!(healthy_workers(&v), 1);
        assert_eq!(healthy_workers(&json!({"urls": []})), 0);
    }
}
