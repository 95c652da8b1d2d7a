//! kvsim: a vLLM-compatible model-server simulator that stands in for GPUs in tests and benchmarks.
//!
//! Each pod is an HTTP server (OpenAI endpoints, Anthropic's `/v1/messages`, SGLang's `/generate`,
//! vLLM's `/inference/v1/generate`, `/metrics` with vLLM or SGLang names, `/health`,
//! `/v1/models`, `/sim/` controls) in front of a simulated engine: continuous batching behind
//! `max_num_seqs`, a prefix cache of chained block hashes with LRU eviction, a latency model for
//! prefill and decode (with their interference), P/D roles speaking vLLM's NixlConnector
//! `kv_transfer_params`, and the llm-d sidecar's `x-prefiller-host-port`. A time scale makes it all
//! run faster than real time. Cache hits are decided by each pod from its own cache, never by what a
//! router claims, so a benchmark's hit ratio is earned.
//!
//! Library use: [`spawn_pods`] starts pods in the current Tokio runtime; the `kvsim` binary is a thin
//! CLI over the same function.

mod anthropic;
mod cache;
mod config;
mod engine;
mod http;
mod metrics;
mod net;
mod pod;
mod probe;
pub mod profile;
mod request;
mod responses;
mod tokens;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::{
    parse_link_gbps, parse_lora_module, EngineKind, LinkLevels, LoraModule, Role, ServedAs,
    SimConfig, DEFAULT_CPU_OFFLOAD_GBPS, DEFAULT_LORA_LOAD_MS, ETH_100G_GBPS,
    FALLBACK_KV_BYTES_PER_TOKEN, NIXL_ABORT_TIMEOUT_S, NVLINK_GBPS,
};
pub use pod::{remote_decode_prefill, Faults, SimStats, DESTINATION_HEADER, PREFILLER_HEADER};
pub use profile::{Profile, PROFILES};
pub use tokens::{block_hashes, render_chat, tokenize, ChatMessage};

/// The prompt token ids a pod computes for a request body (`chat`: `/v1/chat/completions`, else
/// `/v1/completions`), or vLLM's 400 message: what tests compare a router's rendering with.
pub fn prompt_tokens(chat: bool, body: &[u8]) -> Result<Vec<u64>, String> {
    let endpoint = if chat {
        request::Endpoint::Chat
    } else {
        request::Endpoint::Completions
    };
    request::parse(endpoint, body)
        .map(|r| r.tokens)
        .map_err(|request::BadRequest(message)| message)
}

use engine::Engine;
use pod::{Pod, Registry};

/// A running pod. Dropping it (or calling [`PodHandle::shutdown`]) stops the pod.
pub struct PodHandle {
    pub addr: SocketAddr,
    pod: Arc<Pod>,
    shutdown_tx: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
    engine_task: JoinHandle<()>,
}

impl PodHandle {
    /// `http://ip:port`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Counters as served by `GET /sim/stats`.
    pub fn stats(&self) -> SimStats {
        self.pod.stats()
    }

    /// Replaces the pod's faults (works even while the pod refuses connections); returns once a
    /// `refuse` change has taken effect on the port.
    pub async fn set_faults(&self, faults: Faults) {
        self.pod.apply_faults(faults, None).await;
    }

    /// Clears faults and the prefix cache, like `POST /sim/reset`.
    pub async fn reset(&self) {
        self.pod.apply_faults(Faults::default(), None).await;
        self.pod.engine.reset_cache();
    }

    fn stop(&mut self) {
        // Cut idle keep-alive connections at their next request and end every in-flight request.
        self.pod.refuse.cut_connections();
        self.pod.engine.close();
        self.engine_task.abort();
        if let Some(tx) = self.shutdown_tx.take() {
            let _ = tx.send(());
        }
    }

    /// Stops accepting, ends in-flight requests and waits (briefly) for connections to close.
    pub async fn shutdown(mut self) {
        self.stop();
        if let Some(mut server) = self.server.take() {
            if tokio::time::timeout(Duration::from_secs(2), &mut server)
                .await
                .is_err()
            {
                server.abort();
            }
        }
    }
}

impl Drop for PodHandle {
    fn drop(&mut self) {
        self.stop();
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

/// Starts `n` pods with the same configuration on OS-chosen ports of `cfg.host`. Must be called
/// inside a Tokio runtime; the pods live as long as their handles.
pub async fn spawn_pods(cfg: SimConfig, n: usize) -> Result<Vec<PodHandle>> {
    cfg.validate()?;
    if cfg.pod_speed.len() > 1 && cfg.pod_speed.len() != n {
        anyhow::bail!(
            "{} pod speed factors for {n} pods (give one, or one per pod)",
            cfg.pod_speed.len()
        );
    }
    let registry = Registry::default();
    (0..n).map(|i| start_pod(&cfg, i, &registry)).collect()
}

/// Starts one pod (see [`spawn_pods`]).
pub async fn spawn_pod(cfg: SimConfig) -> Result<PodHandle> {
    cfg.validate()?;
    start_pod(&cfg, 0, &Registry::default())
}

fn start_pod(cfg: &SimConfig, index: usize, registry: &Registry) -> Result<PodHandle> {
    let listener = net::bind_reuse(SocketAddr::new(cfg.host, 0))
        .with_context(|| format!("binding a port on {}", cfg.host))?;
    let addr = listener.local_addr()?;
    let (listener, refuse) = net::RefusableListener::new(listener)?;
    let cfg = cfg.for_pod(index);
    let engine = Engine::new(cfg.clone());
    let pod = Pod::new(cfg, addr, index, engine.clone(), refuse, registry.clone())?;
    let engine_task = tokio::spawn(engine.run());
    let app = http::router(pod.clone());
    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = shutdown_rx.await;
        });
        if let Err(e) = serve.await {
            eprintln!("kvsim {addr}: server error: {e}");
        }
    });
    Ok(PodHandle {
        addr,
        pod,
        shutdown_tx: Some(shutdown_tx),
        server: Some(server),
        engine_task,
    })
}
