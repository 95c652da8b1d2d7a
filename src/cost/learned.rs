//! How fast each pod works: the first-token cost learned from this VM's own first bytes (one fit
//! per role, times each pod's speed) merged with the other VMs' from the fits board, and each
//! pod's inter-token latency.

use super::fit_board::PodFit;
use super::{Coefficients, CostConfig, CostFit, ErrorBand, MedianScale, PodSpeed};
use super::{RoleSpeedSums, RoleSpeeds};
use crate::common::Role;
use crate::pod::load::LoadTable;
use crate::work::FirstToken;
use hashbrown::HashMap;

/// What the learned costs are configured with: the prior and its weight (`prediction`), and the
/// split's overhead, which a prefill pod's first token also pays (`pd.split_overhead_ms`).
#[derive(Debug, Clone, Copy)]
pub struct CostSettings {
    pub learning: CostConfig,
    pub split_overhead_ms: f64,
}

/// This VM's learned costs of every listed pod, and the other VMs' from the fits board.
#[derive(Default)]
pub struct Costs {
    /// The listed pods and their roles, in the load table's order.
    listed: Vec<(String, Role)>,
    /// Each listed pod's role (a first byte finds its pod's role in O(1)).
    role_by_addr: HashMap<String, Role>,
    /// This VM's cost fit per role (aggregated, prefill, decode, both), learned from its own
    /// requests' first bytes on every pod of the role.
    role_fits: [Option<CostFit>; ROLES],
    /// Each pod's speed against its role's fit, from this VM's requests.
    speeds: HashMap<String, PodSpeed>,
    /// Per role, how its pods' speeds spread beyond their noise (see [`RoleSpeeds`]), and the
    /// sums it is read from: taken whole with each load table, moved by each first byte in O(1).
    role_speeds: [RoleSpeeds; ROLES],
    role_speed_sums: [RoleSpeedSums; ROLES],
    /// Every other VM's fits, from the fits board.
    others_fits: HashMap<String, Vec<PodFit>>,
    /// Running mean of each pod's inter-token latency, from the streams this VM timed.
    itl_ms: HashMap<String, f64>,
    /// Running mean of how long each pod's streams decoded (first chunk to last), from the
    /// streams this VM timed: how long a request holds one of its seats (`crate::pod::seats`).
    decode_ms: HashMap<String, f64>,
    /// Per role, the calibration of served predictions to the median.
    ttft_scale: [MedianScale; ROLES],
    /// Per role, how widely served predictions miss (see [`ErrorBand`]).
    ttft_error: [ErrorBand; ROLES],
}

/// Weight of the newest stream in a pod's running mean of inter-token latency.
const ITL_ALPHA: f64 = 0.1;

/// The configured prior of a pod of `role` (a prefill pod's first token also pays the split).
fn prior_for(settings: &CostSettings, role: Role) -> Coefficients {
    let mut prior = settings.learning.prior;
    if role == Role::Prefill {
        prior.overhead_ms += settings.split_overhead_ms;
    }
    prior
}

/// Roles with a fit of their own: aggregated, prefill, decode, both.
const ROLES: usize = 4;

/// A `both` pod (elastic P/D) has its own fit, learned from every first byte it gives: its own
/// whole requests and the splits it prefilled (whose first byte also pays the KV transfer, a small
/// share of a long prefill: kvsim's 20 µs against 400 µs per token). Its prior is the aggregated
/// one: most of what it serves is whole requests.
fn role_index(role: Role) -> usize {
    match role {
        Role::Aggregated => 0,
        Role::Prefill => 1,
        Role::Decode => 2,
        Role::Both => 3,
    }
}

/// The models of the timed pods of each role, merged (see [`Costs::cost_of`]).
pub struct PoolCosts {
    timed: [Option<Coefficients>; ROLES],
}

impl Costs {
    /// Takes the listed pods: forgets what was learned of pods no longer listed and re-reads each
    /// role's speed spread.
    pub fn list_pods(&mut self, table: &LoadTable) {
        let listed: hashbrown::HashSet<&str> = table.pods.iter().map(|p| p.addr.as_str()).collect();
        self.speeds.retain(|addr, _| listed.contains(addr.as_str()));
        self.itl_ms.retain(|addr, _| listed.contains(addr.as_str()));
        self.decode_ms
            .retain(|addr, _| listed.contains(addr.as_str()));
        self.listed = table
            .pods
            .iter()
            .map(|p| (p.addr.clone(), p.role))
            .collect();
        self.role_by_addr = self.listed.iter().cloned().collect();
        self.role_speed_sums = [Role::Aggregated, Role::Prefill, Role::Decode, Role::Both]
            .map(|role| self.role_speed_sums_of(role));
        self.role_speeds = self.role_speed_sums.map(|sums| sums.speeds());
    }

    /// The cost model `addr` is predicted with: every VM's fit, weighted by samples. A pod nobody
    /// has timed yet predicts like the timed pods of its role on average (pods of one pool are
    /// usually alike, and a prior far from them would make an untimed pod look much faster or
    /// slower than it is until its first requests); with no timed pod at all, the configured prior
    /// (plus the split overhead for a prefill pod). One pod's: for every pod of a decision, take
    /// [`Self::pool_costs`] once and [`Self::cost_in`] per pod (linear in the pool, where this is
    /// linear per pod).
    pub fn cost_of(&self, settings: &CostSettings, addr: &str) -> Coefficients {
        let role = self.role_of(addr).unwrap_or(Role::Aggregated);
        self.cost_in(settings, addr, role, &self.pool_costs())
    }

    /// [`Self::cost_of`] with the pool's averages already taken.
    pub fn cost_in(
        &self,
        settings: &CostSettings,
        addr: &str,
        role: Role,
        pool: &PoolCosts,
    ) -> Coefficients {
        let (own, samples) = self.own_cost(addr, role);
        if samples > 0.0 {
            return own;
        }
        pool.timed
            .get(role_index(role))
            .copied()
            .flatten()
            .unwrap_or_else(|| prior_for(settings, role))
    }

    /// Per role, the sample-weighted mean of the timed pods' models (`None`: nobody timed).
    pub fn pool_costs(&self) -> PoolCosts {
        let mut by_role: [Vec<(Coefficients, f64)>; ROLES] = Default::default();
        for (addr, role) in &self.listed {
            let (cost, samples) = self.own_cost(addr, *role);
            if samples > 0.0 {
                if let Some(v) = by_role.get_mut(role_index(*role)) {
                    v.push((cost, samples));
                }
            }
        }
        PoolCosts {
            timed: by_role.map(|fits| {
                (!fits.is_empty()).then(|| super::merge(Coefficients::default(), fits))
            }),
        }
    }

    /// This VM's model of `addr`: its role's fit times the pod's speed, and the pod's samples.
    fn own_model(&self, addr: &str, role: Role) -> Option<(Coefficients, f64)> {
        let speed = self.speeds.get(addr)?;
        let fit = self.role_fits.get(role_index(role))?.as_ref()?;
        let factor = self
            .role_speeds
            .get(role_index(role))
            .map_or(speed.factor(), |r| r.factor(speed));
        Some((fit.coefficients().scaled(factor), speed.samples()))
    }

    /// `addr`'s role in the load table (`None`: not a listed pod).
    pub fn role_of(&self, addr: &str) -> Option<Role> {
        self.role_by_addr.get(addr).copied()
    }

    /// The speed sums of `role`'s listed pods (see [`RoleSpeedSums`]).
    pub(crate) fn role_speed_sums_of(&self, role: Role) -> RoleSpeedSums {
        let mut sums = RoleSpeedSums::default();
        for speed in self
            .listed
            .iter()
            .filter(|(_, r)| *r == role)
            .filter_map(|(addr, _)| self.speeds.get(addr))
        {
            sums.add(speed);
        }
        sums
    }

    /// `addr`'s model from every VM's samples, and how many samples that is.
    fn own_cost(&self, addr: &str, role: Role) -> (Coefficients, f64) {
        let own = self.own_model(addr, role);
        let others = self
            .others_fits
            .get(addr)
            .into_iter()
            .flatten()
            .map(|f| (f.cost, f.samples));
        let fits: Vec<(Coefficients, f64)> = own.into_iter().chain(others).collect();
        let samples = fits.iter().map(|(_, n)| n).sum();
        (super::merge(Coefficients::default(), fits), samples)
    }

    #[cfg(test)]
    pub fn speed_of(&self, addr: &str) -> Option<PodSpeed> {
        self.speeds.get(addr).copied()
    }

    #[cfg(test)]
    pub fn role_speeds_of(&self, role: Role) -> RoleSpeeds {
        self.role_speeds
            .get(role_index(role))
            .copied()
            .unwrap_or_default()
    }

    /// The median calibration of `role`'s predictions.
    pub fn ttft_scale_of(&self, role: Role) -> MedianScale {
        self.ttft_scale
            .get(role_index(role))
            .copied()
            .unwrap_or_default()
    }

    /// How widely `role`'s served predictions miss.
    pub fn error_band_of(&self, role: Role) -> ErrorBand {
        self.ttft_error
            .get(role_index(role))
            .copied()
            .unwrap_or_default()
    }

    /// Learns from a first byte: the request's features at routing time and how long it took.
    pub fn learn(&mut self, settings: &CostSettings, first: &FirstToken, observed_ms: f64) {
        let role = self.role_of(&first.addr);
        if let Some(scale) = role.and_then(|r| self.ttft_scale.get_mut(role_index(r))) {
            scale.observe(first.predicted_ms, observed_ms);
        }
        if let Some(band) = role.and_then(|r| self.ttft_error.get_mut(role_index(r))) {
            band.observe(first.predicted_ms, observed_ms);
        }
        let role = role.unwrap_or(Role::Aggregated);
        let mut learning = settings.learning;
        learning.prior = prior_for(settings, role);
        let Some(slot) = self.role_fits.get_mut(role_index(role)) else {
            return;
        };
        let fit = slot.get_or_insert_with(|| CostFit::for_role(&learning));
        // The pod is compared with the role's fit as it stood before this sample.
        let role_ms = fit.coefficients().predict_ms(first.tokens, first.decoding);
        fit.observe_behind(
            &learning,
            first.uncached_tokens,
            first.tokens - first.uncached_tokens,
            first.decoding,
            observed_ms,
        );
        let speed = self.speeds.entry_ref(first.addr.as_str()).or_default();
        let listed = self.role_by_addr.contains_key(first.addr.as_str());
        let i = role_index(role);
        if let (true, Some(sums)) = (listed, self.role_speed_sums.get_mut(i)) {
            sums.remove(speed);
            speed.observe(role_ms, observed_ms);
            sums.add(speed);
            if let Some(slot) = self.role_speeds.get_mut(i) {
                *slot = sums.speeds();
            }
        } else {
            speed.observe(role_ms, observed_ms);
        }
    }

    /// `addr`'s inter-token latency: the mean of what this VM and the others timed.
    pub fn itl_of(&self, addr: &str) -> Option<f64> {
        let values: Vec<f64> = self
            .itl_ms
            .get(addr)
            .copied()
            .into_iter()
            .chain(
                self.others_fits
                    .get(addr)
                    .into_iter()
                    .flatten()
                    .filter_map(|f| f.itl_ms),
            )
            .collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    }

    /// How long `addr`'s streams decode (this VM's running mean; `None`: none timed).
    pub fn decode_of(&self, addr: &str) -> Option<f64> {
        self.decode_ms.get(addr).copied()
    }

    /// A stream on `addr` decoded for `span_ms`, its first chunk to its last.
    pub fn observe_decode(&mut self, addr: &str, span_ms: f64) {
        let known = self.role_by_addr.contains_key(addr);
        if !(span_ms.is_finite() && span_ms >= 0.0 && known) {
            return;
        }
        let mean = self.decode_ms.entry_ref(addr).or_insert(span_ms);
        *mean = *mean * (1.0 - ITL_ALPHA) + span_ms * ITL_ALPHA;
    }

    /// A stream on `addr` delivered its tokens `itl_ms` apart on average.
    pub fn observe_itl(&mut self, addr: &str, itl_ms: f64) {
        let known = self.role_by_addr.contains_key(addr);
        if !(itl_ms.is_finite() && itl_ms >= 0.0 && known) {
            return;
        }
        let mean = self.itl_ms.entry_ref(addr).or_insert(itl_ms);
        *mean = *mean * (1.0 - ITL_ALPHA) + itl_ms * ITL_ALPHA;
    }

    /// This VM's fits and inter-token latencies, for its row on the fits board.
    pub fn own_fits(&self) -> Vec<PodFit> {
        // One pass over the pool for the roles: a search per pod would be quadratic at 512 pods.
        let roles = &self.role_by_addr;
        let mut out: Vec<PodFit> = self
            .speeds
            .keys()
            .filter_map(|a| {
                let role = roles.get(a.as_str()).copied().unwrap_or(Role::Aggregated);
                let (cost, samples) = self.own_model(a, role)?;
                Some(PodFit {
                    addr: a.clone(),
                    cost,
                    samples,
                    itl_ms: self.itl_ms.get(a).copied(),
                })
            })
            .collect();
        let modelled: hashbrown::HashSet<String> = out.iter().map(|f| f.addr.clone()).collect();
        for (addr, itl) in &self.itl_ms {
            if !modelled.contains(addr) {
                out.push(PodFit {
                    addr: addr.clone(),
                    cost: Coefficients::default(),
                    samples: 0.0,
                    itl_ms: Some(*itl),
                });
            }
        }
        out.sort_by(|a, b| a.addr.cmp(&b.addr));
        out
    }

    /// Samples behind `addr`'s model, every VM's together (for the stats).
    pub fn fit_samples(&self, addr: &str) -> f64 {
        let own = self.speeds.get(addr).map_or(0.0, |s| s.samples());
        let others: f64 = self
            .others_fits
            .get(addr)
            .into_iter()
            .flatten()
            .map(|f| f.samples)
            .sum();
        own + others
    }

    pub fn set_others_fits(&mut self, others: HashMap<String, Vec<PodFit>>) {
        self.others_fits = others;
    }
}
