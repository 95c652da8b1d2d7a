//! What `make bench-pd` compares: a scenario is a workload with its warm-up and its rows (a
//! topology, and for a control row the kvroute settings it changes); the row lists and specs the
//! command line builds; and the engine settings, loads and durations of both scenarios, each with
//! the reason for its value.

use serde::Serialize;
use serde_json::{json, Value};

use super::topology::{PdMode, Topology};
use crate::routing::PdSplit;
use crate::workload::{Load, WorkloadKind, WorkloadSpec};

/// One row of a scenario: a topology, and for a control row, the kvroute settings it changes.
#[derive(Clone, Debug, Serialize)]
pub struct Setup {
    pub topology: Topology,
    /// A control row's name (`tie band 0.2`); `None` for kvroute as configured for every row.
    pub variant: Option<String>,
    /// kvroute configuration fields this row adds (objects merged field by field).
    pub plugin_extra: Value,
}

impl Setup {
    /// `topology` with the benchmark's kvroute settings.
    pub fn plain(topology: Topology) -> Self {
        Self {
            topology,
            variant: None,
            plugin_extra: Value::Null,
        }
    }

    /// The row label: the topology's, plus the variant's name.
    pub fn label(&self) -> String {
        match &self.variant {
            Some(v) => format!("{} ({v})", self.topology.label()),
            None => self.topology.label(),
        }
    }

    /// The baseline every P/D row is judged against: aggregated, no variant.
    pub fn is_baseline(&self) -> bool {
        self.topology.is_aggregated() && self.variant.is_none()
    }

    /// An aggregated row with other kvroute settings, reported as a second baseline.
    pub fn is_control(&self) -> bool {
        self.topology.is_aggregated() && self.variant.is_some()
    }
}

/// One scenario: a workload, its warm-up and the rows it compares.
#[derive(Clone, Debug, Serialize)]
pub struct Scenario {
    /// `interference` or `agent`; also the output files' stem (`pd-<name>`).
    pub name: String,
    pub spec: WorkloadSpec,
    pub warmup_s: f64,
    pub setups: Vec<Setup>,
}

/// `aggregated` pods against `prefill` + `decode` pods, once per P/D mode, and (`elastic`) as many
/// pods as the split has in one elastic pool, once per mode.
pub fn setups(
    aggregated: usize,
    prefill: usize,
    decode: usize,
    modes: &[PdMode],
    elastic: bool,
) -> Vec<Setup> {
    let mut out = vec![Setup::plain(Topology::Aggregated { pods: aggregated })];
    out.extend(modes.iter().map(|&mode| {
        Setup::plain(Topology::Disaggregated {
            prefill,
            decode,
            mode,
        })
    }));
    if elastic {
        out.extend(modes.iter().map(|&mode| {
            Setup::plain(Topology::Elastic {
                pods: prefill + decode,
                mode,
            })
        }));
    }
    out
}

/// The round-robin P/D baselines on `prefill` + `decode` pods: every request split, and only
/// prompts over [`PdSplit::SELECTIVE_THRESHOLD`] words.
pub fn round_robin_baselines(prefill: usize, decode: usize) -> Vec<Setup> {
    [
        PdSplit::Always,
        PdSplit::Selective {
            threshold_tokens: PdSplit::SELECTIVE_THRESHOLD,
        },
    ]
    .into_iter()
    .map(|split| {
        Setup::plain(Topology::RoundRobinPd {
            prefill,
            decode,
            split,
        })
    })
    .collect()
}

/// The agent scenario's control row: the aggregated pods with kvroute's tie band widened from 5% to
/// 20% of the best prediction (more requests decided by rendezvous among near-equal pods). It shows
/// how much the aggregated baseline depends on that one knob.
pub fn wide_tie_band_control(pods: usize) -> Setup {
    Setup {
        topology: Topology::Aggregated { pods },
        variant: Some("tie band 0.2".to_owned()),
        plugin_extra: json!({"prediction": {"tie_band": 0.2}}),
    }
}

/// A spec with the load given and everything else from `WorkloadSpec::new`.
pub fn scenario_spec(
    workload: WorkloadKind,
    load: Load,
    duration_s: f64,
    seed: u64,
) -> WorkloadSpec {
    let mut spec = WorkloadSpec::new(workload, load);
    spec.duration_s = duration_s;
    spec.seed = seed;
    spec
}

/// Engine settings of every pod of every topology in `make bench-pd`: chunked prefill on with a
/// 2,048-token budget per step (vLLM V1's default for its OpenAI server on GPUs under 70 GB and on
/// A100s; 8,192 on H100-class GPUs), so a long prefill runs as ~0.9 s chunks that the running decodes
/// of its pod ride along with; and 32,768 KV blocks of 16 tokens (524,288 tokens, eight times
/// kvsim's default; an 80 GB GPU's KV space for an 8B model), so that in every topology the agent
/// scenario's 24 sessions (~9,000 tokens each on average) fit both in the prefix caches and,
/// running, in the KV memory of the single decode pod of 2P+1D. With 8,192 blocks they did not: the decode pod
/// found 31% of its prompt tokens cached (83% with 32,768) and P/D completed 10–20% fewer requests
/// than aggregated (about as many with 32,768), a result about memory sizing, not disaggregation.
/// Everything else is kvsim's latency model as it is (40 ms + 0.4 ms per prefilled token per step,
/// 15 ms + 0.5 ms per decoding sequence per step, 20 µs per token of KV pulled by a decode pod,
/// `max_num_seqs` 32).
pub const DEFAULT_SIM_ARGS: &str = "--chunked-prefill-tokens 2048 --num-gpu-blocks 32768";
/// Interference: arrivals per simulated second (streams 2/s, long prompts 0.5/s with the default
/// 20% share of [`InterferenceParams`](crate::InterferenceParams)): about 36 streams running (9 per aggregated pod, 18 per decode pod), and long prompts
/// keeping the aggregated pods ~45% busy prefilling, so that more than 1% of the streams' tokens
/// come out of a step that also ran a prefill chunk.
pub const INTERFERENCE_RATE: f64 = 2.5;
/// Interference: simulated seconds of arrivals (~105 long prompts and ~420 streams measured).
pub const INTERFERENCE_DURATION: f64 = 240.0;
/// Interference: the first stream lifetimes, while the number of running streams ramps up.
pub const INTERFERENCE_WARMUP: f64 = 30.0;
/// Agent: sessions in progress at once (one per closed-loop client).
pub const AGENT_SESSIONS: usize = 24;
/// Agent: 24 requests in flight, where 3 aggregated pods are saturated (their throughput no longer
/// grows with more in flight).
pub const AGENT_LOAD: Load = Load::Closed { concurrency: 24 };
pub const AGENT_DURATION: f64 = 300.0;
/// Agent: the cold start (every session's first, uncached prompt) is not measured.
pub const AGENT_WARMUP: f64 = 60.0;
