//! The options of the commands that run something locally: `demo`, `up` and `soak`.

use std::path::PathBuf;

use clap::Args;

#[derive(Args, Debug)]
pub(crate) struct SoakArgs {
    /// How long to run
    #[arg(long, default_value_t = 600)]
    pub(crate) seconds: u64,
    /// Requests per second (open loop, streamed)
    #[arg(long, default_value_t = 20.0)]
    pub(crate) rate: f64,
    /// Simulated pods
    #[arg(long, default_value_t = 4)]
    pub(crate) pods: usize,
    /// Seconds per schedule phase (each fault, each healthy spell)
    #[arg(long, default_value_t = 10)]
    pub(crate) phase_seconds: u64,
    /// Seconds per reported window
    #[arg(long, default_value_t = 10)]
    pub(crate) window_seconds: u64,
    #[arg(long, default_value_t = 0.05)]
    pub(crate) time_scale: f64,
    #[arg(long, default_value = "bench-out")]
    pub(crate) out: PathBuf,
}

#[derive(Args, Debug)]
pub(crate) struct DemoArgs {
    /// The simulator's time scale: 1 = real speed (about 3 s for a 7,500-token prefill)
    #[arg(long, default_value_t = 1.0)]
    pub(crate) time_scale: f64,
    /// Simulated pods
    #[arg(long, default_value_t = 4)]
    pub(crate) pods: usize,
    /// Extra kvsim arguments, space-separated
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub(crate) sim_args: String,
    /// Tokens generated per request
    #[arg(long, default_value_t = 24)]
    pub(crate) max_tokens: u32,
}

#[derive(Args, Debug)]
pub(crate) struct UpArgs {
    /// OpenAI-compatible servers to route to, ip:port,ip:port (default: start simulated pods)
    #[arg(long, value_delimiter = ',')]
    pub(crate) endpoints: Vec<String>,
    /// Port of the inference listener (on 127.0.0.1)
    #[arg(long, default_value_t = 8080)]
    pub(crate) port: u16,
    /// Port of Envoy's admin interface (default: chosen by the OS)
    #[arg(long, default_value_t = 0)]
    pub(crate) admin_port: u16,
    /// Simulated pods, without --endpoints
    #[arg(long, default_value_t = 4)]
    pub(crate) pods: usize,
    /// The simulator's time scale, without --endpoints (1 = real speed)
    #[arg(long, default_value_t = 1.0)]
    pub(crate) time_scale: f64,
    /// Extra kvsim arguments, space-separated, without --endpoints
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub(crate) sim_args: String,
    /// Prefill servers (vLLM with a KV connector), ip:port,…; needs --decode-endpoints
    #[arg(long, value_delimiter = ',')]
    pub(crate) prefill_endpoints: Vec<String>,
    /// Decode servers, ip:port,…: with them kvroute disaggregates long prompts
    #[arg(long, value_delimiter = ',')]
    pub(crate) decode_endpoints: Vec<String>,
    /// How a disaggregated request is carried out: sidecar (x-prefiller-host-port) or inline
    #[arg(long, default_value = "sidecar")]
    pub(crate) pd_mode: String,
    /// Set by `make up`: errors name its variables (PORT=, DECODE=, …) instead of these flags
    #[arg(long, hide = true)]
    pub(crate) via_make: bool,
    /// kvroute's configuration to run as it is (JSON, or the same fields in YAML), checked by
    /// the plugin's parser first; its pools' static endpoints are the pods
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<std::path::PathBuf>,
}
