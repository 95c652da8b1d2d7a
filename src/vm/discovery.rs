//! Pool membership from Envoy's admin API (`GET /clusters?format=json`): the members of a named
//! cluster, as `ip:port`, leaving out hosts Envoy itself considers unhealthy. This is how a plugin on
//! upstream Envoy follows EDS/DNS membership (Istio's `outbound|8000||svc` clusters) without
//! Kubernetes API access. Each member comes with the locality Envoy holds for it (`region`,
//! `zone`, `sub_zone`; Istio fills it from the nodes' labels), which prices a split's KV transfer
//! (`crate::pd::topology`).

use crate::pod::locality::Locality;
use serde_json::Value;

pub fn cluster_members(admin_json: &[u8], cluster: &str) -> Option<Vec<String>> {
    members_with_localities(admin_json, cluster)
        .map(|members| members.into_iter().map(|(addr, _)| addr).collect())
}

/// The members of `cluster`, each with its locality (empty where Envoy has none).
pub fn members_with_localities(
    admin_json: &[u8],
    cluster: &str,
) -> Option<Vec<(String, Locality)>> {
    let doc: Value = serde_json::from_slice(admin_json).ok()?;
    let statuses = doc.get("cluster_statuses")?.as_array()?;
    let status = statuses
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(cluster))?;
    let hosts = match status.get("host_statuses") {
        Some(Value::Array(h)) => h.as_slice(),
        _ => &[],
    };
    let mut members: Vec<(String, Locality)> = hosts
        .iter()
        .filter(|h| {
            let health = h.get("health_status");
            let eds = health
                .and_then(|s| s.get("eds_health_status"))
                .and_then(Value::as_str)
                .unwrap_or("HEALTHY");
            let failed_check = health
                .and_then(|s| s.get("failed_active_health_check"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            matches!(eds, "HEALTHY" | "UNKNOWN" | "DEGRADED") && !failed_check
        })
        .filter_map(|h| {
            let sa = h.get("address")?.get("socket_address")?;
            let ip = sa.get("address")?.as_str()?;
            let port = sa.get("port_value")?.as_u64()?;
            let member = if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            };
            // Only what a configured endpoint could be: a member is written into the destination
            // header (a comma list) and the work board (space-separated), and polled.
            let locality = h
                .get("locality")
                .and_then(|l| serde_json::from_value::<Locality>(l.clone()).ok())
                .unwrap_or_default();
            crate::common::is_host_port(&member).then_some((member, locality))
        })
        .collect();
    members.sort_by(|a, b| a.0.cmp(&b.0));
    members.dedup_by(|a, b| a.0 == b.0);
    Some(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_members_of_the_named_cluster() {
        let doc = br#"{"cluster_statuses":[
          {"name":"other","host_statuses":[{"address":{"socket_address":{"address":"9.9.9.9","port_value":1}}}]},
          {"name":"outbound|8000||vllm.ns.svc.cluster.local","host_statuses":[
            {"address":{"socket_address":{"address":"10.0.0.2","port_value":8000}},"health_status":{"eds_health_status":"HEALTHY"}},
            {"address":{"socket_address":{"address":"10.0.0.1","port_value":8000}},"health_status":{"eds_health_status":"HEALTHY"}},
            {"address":{"socket_address":{"address":"10.0.0.3","port_value":8000}},"health_status":{"eds_health_status":"UNHEALTHY"}},
            {"address":{"socket_address":{"address":"10.0.0.4","port_value":8000}},"health_status":{"failed_active_health_check":true}},
            {"address":{"socket_address":{"address":"::1","port_value":8000}}}
          ]}]}"#;
        assert_eq!(
            cluster_members(doc, "outbound|8000||vllm.ns.svc.cluster.local"),
            Some(vec![
                "10.0.0.1:8000".to_string(),
                "10.0.0.2:8000".to_string(),
                "[::1]:8000".to_string()
            ])
        );
        assert_eq!(cluster_members(doc, "missing"), None);
        // The locality as Envoy 1.40's admin API writes it.
        let located = br#"{"cluster_statuses":[{"name":"pool","host_statuses":[
            {"address":{"socket_address":{"address":"10.0.0.1","port_value":8000}},"weight":1,
             "locality":{"region":"r1","zone":"za","sub_zone":"rack1"}},
            {"address":{"socket_address":{"address":"10.0.0.2","port_value":8000}},"weight":1,
             "locality":{"region":"r1","zone":"zb"}},
            {"address":{"socket_address":{"address":"10.0.0.3","port_value":8000}}}]}]}"#;
        let found = members_with_localities(located, "pool").unwrap();
        let zones: Vec<(&str, &str, &str)> = found
            .iter()
            .map(|(a, l)| (a.as_str(), l.zone.as_str(), l.sub_zone.as_str()))
            .collect();
        assert_eq!(
            zones,
            [
                ("10.0.0.1:8000", "za", "rack1"),
                ("10.0.0.2:8000", "zb", ""),
                ("10.0.0.3:8000", "", "")
            ]
        );
        // Found by fuzzing: members no pod can be (port 0 or beyond 65535, an address with a
        // comma or a space that would split the destination header or a work-board row).
        let odd = br#"{"cluster_statuses":[{"name":"c","host_statuses":[
            {"address":{"socket_address":{"address":"::1","port_value":0}}},
            {"address":{"socket_address":{"address":"10.0.0.1","port_value":70000}}},
            {"address":{"socket_address":{"address":"10.0.0.1,10.6.6.6","port_value":80}}},
            {"address":{"socket_address":{"address":"10.0.0.1 9 x=1/2/3","port_value":80}}},
            {"address":{"socket_address":{"address":"10.0.0.5","port_value":80}}}]}]}"#;
        assert_eq!(
            cluster_members(odd, "c"),
            Some(vec!["10.0.0.5:80".to_string()])
        );
        assert_eq!(cluster_members(b"not json", "x"), None);
    }
}
