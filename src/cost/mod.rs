//! What a pod's first token costs, learned from what the gateway observes.
//!
//! The model: time to first token = `speed × (overhead + per_token × (prefill tokens queued ahead +
//! this prompt's uncached tokens) + per_decoding × (sequences decoding there))`. The three
//! coefficients are learned online per role (aggregated, prefill, decode) from every streamed
//! response on any pod of the role: the gateway knows what it put on the pod (the uncached tokens
//! of the requests ahead, from the work board, and this prompt's own), and it sees the first
//! response byte arrive. Pods need not be alike: each learns its `speed` against the role's fit
//! ([`PodSpeed`], which says why one factor per pod rather than a fit per pod), so a pool mixing
//! GPU generations is ranked by what each pod actually does.
//!
//! The fit is a weighted ridge regression with directional forgetting: decayed sums of the
//! features' outer products (a 3×3 matrix and a 3-vector, 12 numbers per fit whatever the
//! traffic), solved on every sample, regularised toward a configured prior worth `prior_samples`
//! samples at a typical request, so a role with no history predicts by the prior and one with
//! history by its observations. A sample counts by how much of its prefill the gateway knows
//! exactly (its own uncached tokens against the queue the board estimates ahead of it), and fades
//! old information only along its own features (`1/ROLE_FORGET_SAMPLES` per new sample), so a
//! run of hits does not unlearn what recomputes showed of the cost per token; a pod's speed fades
//! with `1/FORGET_SAMPLES`, so a pod that slows down (thermal throttling, a noisy neighbour) is
//! re-learned within tens of requests. Robust to outliers: once a fit has `ROBUST_AFTER` samples,
//! an observation is clamped to within `OUTLIER_FACTOR` of the current prediction before it is
//! added (a winsorised update), so one request that waited on a pod-side hiccup moves the fit by a
//! bounded amount.
//!
//! Time is in milliseconds of wall clock. Nothing here knows the engine: vLLM with a prefill
//! stalling decodes, chunked prefill, SGLang or a simulator at 20× speed all fit the same three
//! numbers; what they do not capture (a step's decode-batch cost that grows with context, slot
//! limits) is absorbed by the overhead or guarded against elsewhere (see `crate::scheduler`).
//!
//! * `fit.rs` — the role fit ([`CostFit`]: three [`Coefficients`], ridge regression with
//!   forgetting) and the merge of several VMs' fits;
//! * `speed.rs` — each pod's speed against its role's fit ([`PodSpeed`]) and their spread
//!   ([`RoleSpeeds`]);
//! * `calibration.rs` — the median calibration of served predictions ([`MedianScale`]) and how
//!   widely they miss ([`ErrorBand`]);
//! * `fit_board.rs` — the fits board VMs share (key `kvroute.fits`);
//! * `itl.rs` — a stream's inter-token latency timed from its chunks ([`ItlTimer`]);
//! * `learned.rs` — this VM's learned costs ([`Costs`]): what it predicts each pod with, merged
//!   with the other VMs' from the board. Its hooks: a request's first byte (`learn`), a stream's
//!   end (`observe_itl`), pods listed (`list_pods`), the VM's tick (`own_fits`, `set_others_fits`).

mod calibration;
mod fit;
pub mod fit_board;
mod itl;
mod learned;
mod speed;

pub use calibration::{ErrorBand, MedianScale, ERROR_QUANTILE};
pub use fit::{merge, Coefficients, CostConfig, CostFit};
pub use itl::ItlTimer;
pub use learned::{CostSettings, Costs, PoolCosts};
pub use speed::{PodSpeed, RoleSpeedSums, RoleSpeeds};

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests;
