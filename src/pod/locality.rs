//! Where a pod is (Envoy's endpoint locality) and the closest level two pods share: what prices a
//! split's KV transfer (`crate::pd::topology`).

use serde::{Deserialize, Serialize};

/// A pod's place, as Envoy's `config.core.v3.Locality` names it. Empty fields are unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct Locality {
    pub region: String,
    pub zone: String,
    pub sub_zone: String,
}

impl Locality {
    pub fn is_known(&self) -> bool {
        !(self.region.is_empty() && self.zone.is_empty() && self.sub_zone.is_empty())
    }
}

/// The closest level two pods share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    SubZone,
    Zone,
    Region,
    Remote,
}

impl Link {
    /// A zone is only the same zone within the same region (zone names repeat across regions);
    /// a sub-zone only within the same zone.
    pub fn between(a: Option<&Locality>, b: Option<&Locality>) -> Link {
        let (Some(a), Some(b)) = (a, b) else {
            return Link::Remote;
        };
        let same = |x: &str, y: &str| !x.is_empty() && x == y;
        let region = a.region == b.region && (same(&a.region, &b.region) || a.region.is_empty());
        let zone = region && same(&a.zone, &b.zone);
        match () {
            () if zone && same(&a.sub_zone, &b.sub_zone) => Link::SubZone,
            () if zone => Link::Zone,
            () if same(&a.region, &b.region) => Link::Region,
            () => Link::Remote,
        }
    }
}

/// A locality from its three names (tests).
#[cfg(test)]
pub fn at(region: &str, zone: &str, sub_zone: &str) -> Locality {
    Locality {
        region: region.into(),
        zone: zone.into(),
        sub_zone: sub_zone.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_is_the_closest_level_both_share() {
        let a = at("eu", "eu-1a", "rack1");
        let cases = [
            (at("eu", "eu-1a", "rack1"), Link::SubZone),
            (at("eu", "eu-1a", "rack2"), Link::Zone),
            (at("eu", "eu-1a", ""), Link::Zone),
            (at("eu", "eu-1b", "rack1"), Link::Region),
            // The same zone name in another region is another zone.
            (at("us", "eu-1a", "rack1"), Link::Remote),
        ];
        for (b, want) in cases {
            assert_eq!(Link::between(Some(&a), Some(&b)), want, "{b:?}");
        }
        // Regions left out on both sides: zones still compare.
        assert_eq!(
            Link::between(Some(&at("", "z1", "")), Some(&at("", "z1", ""))),
            Link::Zone
        );
        assert_eq!(
            Link::between(Some(&at("", "z1", "")), Some(&at("", "z2", ""))),
            Link::Remote
        );
        assert_eq!(Link::between(Some(&a), None), Link::Remote);
    }
}
