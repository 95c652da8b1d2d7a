//! What the simulated GPUs of one row are: aggregated pods (behind kvroute or behind Envoy's
//! round-robin), or prefill and decode pools (kvroute's P/D in sidecar or inline mode, or the
//! client-side round-robin P/D baseline), with the names the tables and files use for them.

use anyhow::{bail, Result};
use serde::Serialize;

use crate::routing::PdSplit;

/// How kvroute carries out a disaggregated request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PdMode {
    /// `x-prefiller-host-port` to the decode pod, whose (simulated) llm-d sidecar calls the prefiller.
    Sidecar,
    /// kvroute calls the prefill pod itself and forwards its `kv_transfer_params`.
    Inline,
}

impl PdMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PdMode::Sidecar => "sidecar",
            PdMode::Inline => "inline",
        }
    }

    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "sidecar" => Ok(PdMode::Sidecar),
            "inline" => Ok(PdMode::Inline),
            other => bail!("unknown P/D mode {other:?} (sidecar, inline)"),
        }
    }
}

/// What the simulated GPUs are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Topology {
    /// Every pod prefills and decodes.
    Aggregated { pods: usize },
    /// The same aggregated pods behind Envoy's own round-robin, no kvroute: standard Kubernetes
    /// balancing, the baseline published P/D gains are measured against.
    AggregatedRoundRobin { pods: usize },
    /// `prefill` prefill pods and `decode` decode pods.
    Disaggregated {
        prefill: usize,
        decode: usize,
        mode: PdMode,
    },
    /// Elastic P/D: `pods` pods that each prefill, decode, or both (`kvsim --role both`, a pool of
    /// role `both`), all in Envoy's cluster; kvroute chooses per request which pod prefills and
    /// which decodes.
    Elastic { pods: usize, mode: PdMode },
    /// The round-robin P/D baseline: the same pools behind a plain Envoy (`override_host`, no
    /// kvroute); the client round-robins the prefill pod and the decode pod and splits requests as
    /// `split` says (see [`routing`](crate::routing)).
    RoundRobinPd {
        prefill: usize,
        decode: usize,
        split: PdSplit,
    },
}

impl Topology {
    /// Simulated GPUs (pods).
    pub fn gpus(self) -> usize {
        match self {
            Topology::Aggregated { pods }
            | Topology::AggregatedRoundRobin { pods }
            | Topology::Elastic { pods, .. } => pods,
            Topology::Disaggregated {
                prefill, decode, ..
            }
            | Topology::RoundRobinPd {
                prefill, decode, ..
            } => prefill + decode,
        }
    }

    /// The row label: `aggregated 4`, `P/D sidecar 2P+2D`.
    pub fn label(self) -> String {
        match self {
            Topology::Aggregated { pods } => format!("aggregated {pods}"),
            Topology::AggregatedRoundRobin { pods } => format!("aggregated {pods} round-robin"),
            Topology::Disaggregated {
                prefill,
                decode,
                mode,
            } => format!("P/D {} {prefill}P+{decode}D", mode.as_str()),
            Topology::Elastic { pods, mode } => {
                format!("elastic P/D {} {pods}×both", mode.as_str())
            }
            Topology::RoundRobinPd {
                prefill,
                decode,
                split,
            } => format!("round-robin P/D {} {prefill}P+{decode}D", split.label()),
        }
    }

    pub fn is_aggregated(self) -> bool {
        matches!(self, Topology::Aggregated { .. })
    }

    /// kvroute's own P/D (sidecar or inline), fixed pools or elastic.
    pub fn is_kvroute_pd(self) -> bool {
        matches!(
            self,
            Topology::Disaggregated { .. } | Topology::Elastic { .. }
        )
    }

    /// kvroute's elastic P/D, and its mode.
    pub fn elastic_mode(self) -> Option<PdMode> {
        match self {
            Topology::Elastic { mode, .. } => Some(mode),
            _ => None,
        }
    }

    /// The client-side round-robin P/D baseline.
    pub fn is_round_robin_pd(self) -> bool {
        matches!(self, Topology::RoundRobinPd { .. })
    }

    /// Aggregated pods behind Envoy's round-robin.
    pub fn is_aggregated_round_robin(self) -> bool {
        matches!(self, Topology::AggregatedRoundRobin { .. })
    }
}
