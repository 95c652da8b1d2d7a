//! Where pods are, and what moving a prompt's KV between two of them costs.
//!
//! **Algorithm.** A split sends the prompt's KV from the prefill pod to the decode pod: the tokens
//! the decode pod lacks (its uncached tokens) times the model's KV bytes per token, over the link
//! between the two. The link is the closest level the two pods share — the same sub-zone (a rack,
//! a node pool), the same zone, the same region, or none ("remote") — each with a configured
//! bandwidth. Every prefill candidate's predicted first token gets its transfer time added, and the
//! candidates are ranked again, so of two prefill pods equally loaded the nearer one wins, and a
//! far one wins only when it is sooner by more than the extra transfer.
//!
//! **Where localities come from.** Envoy's own endpoint locality (`region`, `zone`, `sub_zone`),
//! read with the members of a pool given by `cluster` from the admin API's `/clusters` (Istio fills
//! it from the nodes' `topology.kubernetes.io/region`/`zone` and `topology.istio.io/subzone`
//! labels), or `pd.topology.localities` for pods listed by address; the configuration wins. A pod
//! whose locality is unknown is priced as remote: nothing says it is near.
//!
//! **Why a term on top of the learned cost.** A prefill pod's cost model is fitted from its split
//! requests' first bytes, which include the transfers it made, averaged over the decode pods it
//! served; that average cannot tell a near decode pod from a far one. The link term adds what the
//! fit cannot see; where every pair is equally near it shifts every candidate alike and changes no
//! ranking. Off (`kv_bytes_per_token` 0, the default) the plan is exactly as without it.

pub use crate::pod::locality::{Link, Locality};
use crate::scheduler::Decision;
use serde::Deserialize;
use std::collections::BTreeMap;

/// Bandwidth of each level, Gb/s.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct LinkGbps {
    pub sub_zone: f64,
    pub zone: f64,
    pub region: f64,
    pub remote: f64,
}

impl Default for LinkGbps {
    /// Orders of magnitude, not measurements of any network: a rack's RDMA fabric (one 400 Gb/s
    /// NIC per GPU node, as NVIDIA's ConnectX-7 gives), a zone's spine, a region's inter-zone
    /// links, the open internet. Set them to your own.
    fn default() -> Self {
        LinkGbps {
            sub_zone: 400.0,
            zone: 100.0,
            region: 25.0,
            remote: 5.0,
        }
    }
}

impl LinkGbps {
    fn of(&self, link: Link) -> f64 {
        match link {
            Link::SubZone => self.sub_zone,
            Link::Zone => self.zone,
            Link::Region => self.region,
            Link::Remote => self.remote,
        }
    }
}

/// `pd.topology`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct TopologyConfig {
    /// The model's KV-cache bytes per token (layers × KV heads × head size × 2 for K and V × bytes
    /// per value: 131072 for Llama-3.1-8B in 16 bits, 32 × 8 × 128 × 2 × 2); 0 turns the link
    /// pricing off.
    pub kv_bytes_per_token: u64,
    pub link_gbps: LinkGbps,
    /// Pods' localities by address (`ip:port`), over what Envoy reports for them.
    pub localities: BTreeMap<String, Locality>,
}

impl TopologyConfig {
    pub fn validate(&self) -> Result<(), crate::common::ConfigError> {
        let g = &self.link_gbps;
        for (name, v) in [
            ("sub_zone", g.sub_zone),
            ("zone", g.zone),
            ("region", g.region),
            ("remote", g.remote),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(crate::common::ConfigError::at(
                    format!("pd.topology.link_gbps.{name}"),
                    "must be a positive number of Gb/s",
                ));
            }
        }
        for addr in self.localities.keys() {
            if !crate::common::is_host_port(addr) {
                return Err(crate::common::ConfigError::at(
                    "pd.topology.localities",
                    format!("{addr:?} is not ip:port"),
                ));
            }
        }
        Ok(())
    }

    pub fn enabled(&self) -> bool {
        self.kv_bytes_per_token > 0
    }

    /// Milliseconds to move `tokens` tokens of KV over `link`.
    pub fn transfer_ms(&self, tokens: f64, link: Link) -> f64 {
        let bits = tokens.max(0.0) * self.kv_bytes_per_token as f64 * 8.0;
        bits / (self.link_gbps.of(link) * 1e9) * 1e3
    }

    /// A pod's locality: the configured one, else what Envoy reported.
    pub fn locality_of<'a>(
        &'a self,
        addr: &str,
        reported: Option<&'a Locality>,
    ) -> Option<&'a Locality> {
        self.localities
            .get(addr)
            .or(reported)
            .filter(|l| l.is_known())
    }
}

/// Adds to each prefill candidate's predicted first token the time to move `tokens` tokens of KV
/// to the decode pod, and ranks the candidates again where their links differ (unguarded first,
/// then by cost; where every link is the same the picker's order stands), keeping the first
/// `keep`. `locality` gives a pod's reported locality by address.
pub fn price_transfers<'a>(
    config: &TopologyConfig,
    ranking: Decision,
    decode_addr: &str,
    tokens: f64,
    locality: impl Fn(&str) -> Option<&'a Locality>,
    keep: usize,
) -> Decision {
    let Decision::Route { mut ranked, reason } = ranking else {
        return ranking;
    };
    if !config.enabled() {
        return Decision::Route { ranked, reason };
    }
    let decode = config.locality_of(decode_addr, locality(decode_addr));
    let links: Vec<Link> = ranked
        .iter()
        .map(|c| Link::between(config.locality_of(&c.addr, locality(&c.addr)), decode))
        .collect();
    for (choice, link) in ranked.iter_mut().zip(&links) {
        choice.prediction.ttft_ms += config.transfer_ms(tokens, *link);
    }
    if links.iter().any(|l| Some(l) != links.first()) {
        ranked.sort_by(|a, b| {
            a.guarded.cmp(&b.guarded).then_with(|| {
                a.prediction
                    .pool_cost_ms()
                    .total_cmp(&b.prediction.pool_cost_ms())
            })
        });
    }
    ranked.truncate(keep);
    Decision::Route { ranked, reason }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::locality::at;

    #[test]
    fn transfer_time_is_bytes_over_the_links_bandwidth() {
        let t = TopologyConfig {
            kv_bytes_per_token: 131_072,
            ..TopologyConfig::default()
        };
        // 8,000 tokens × 128 KiB = 1.05 GB = 8.39 Gb: 21 ms at 400 Gb/s, 1.68 s at 5 Gb/s.
        assert!((t.transfer_ms(8000.0, Link::SubZone) - 20.97).abs() < 0.01);
        assert!((t.transfer_ms(8000.0, Link::Remote) - 1677.7).abs() < 0.1);
        assert_eq!(
            TopologyConfig::default().transfer_ms(8000.0, Link::Remote),
            0.0
        );
    }

    #[test]
    fn configured_localities_win_and_empty_ones_are_unknown() {
        let mut t = TopologyConfig::default();
        t.localities
            .insert("10.0.0.1:8000".into(), at("eu", "eu-1b", ""));
        let reported = at("eu", "eu-1a", "");
        assert_eq!(
            t.locality_of("10.0.0.1:8000", Some(&reported)),
            Some(&at("eu", "eu-1b", ""))
        );
        assert_eq!(
            t.locality_of("10.0.0.2:8000", Some(&reported)),
            Some(&reported)
        );
        assert_eq!(
            t.locality_of("10.0.0.2:8000", Some(&Locality::default())),
            None
        );
        assert!(t.validate().is_ok());
        t.link_gbps.zone = 0.0;
        assert!(t.validate().is_err());
    }
}
