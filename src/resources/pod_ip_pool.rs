//! `CiliumPodIPPool`: `cilium.io/v2alpha1` (Cilium 1.20's served and storage
//! version) and `cilium.io/v2`, which adds `spec.<family>.pool[]` with
//! `reservedRanges`. One type for both: which fields a version may use, and
//! every other rule, is checked when it becomes a pool (`ipam::pooldef`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::LabelSelector;
use super::fields::{cidrs, nullable, opt_cidr, opt_ip};
use super::object::object;

/// The `apiVersion` Cilium 1.20 serves.
pub const POD_IP_POOL_V2ALPHA1: &str = "cilium.io/v2alpha1";
/// The `apiVersion` with per-CIDR reserved ranges.
pub const POD_IP_POOL_V2: &str = "cilium.io/v2";
/// The `kind`.
pub const POD_IP_POOL_KIND: &str = "CiliumPodIPPool";

object! {
    /// A `CiliumPodIPPool` (cluster-scoped).
    pub struct CiliumPodIPPool {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub spec: Option<PodIPPoolSpec>,
    }
}

/// `spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodIPPoolSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<PoolFamily>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<PoolFamily>,
    #[serde(
        rename = "allowFirstIP",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_first_ip: Option<bool>,
    #[serde(
        rename = "allowLastIP",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_last_ip: Option<bool>,
    #[serde(
        rename = "podSelector",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub pod_selector: Option<LabelSelector>,
    #[serde(
        rename = "namespaceSelector",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `spec.ipv4` / `spec.ipv6`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolFamily {
    #[serde(
        default,
        deserialize_with = "cidrs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub cidrs: Vec<IpNet>,
    /// Go `int` in Cilium; the range is checked by the conversion.
    #[serde(rename = "maskSize", default, skip_serializing_if = "Option::is_none")]
    pub mask_size: Option<i64>,
    /// `cilium.io/v2` only: per-CIDR settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<Vec<PoolCidr>>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `spec.<family>.pool[]` (v2).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolCidr {
    #[serde(
        default,
        deserialize_with = "opt_cidr",
        skip_serializing_if = "Option::is_none"
    )]
    pub cidr: Option<IpNet>,
    #[serde(
        rename = "reservedRanges",
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub reserved_ranges: Vec<ReservedRange>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `reservedRanges[]`: an inclusive address range.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReservedRange {
    #[serde(
        default,
        deserialize_with = "opt_ip",
        skip_serializing_if = "Option::is_none"
    )]
    pub start: Option<IpAddr>,
    #[serde(
        default,
        deserialize_with = "opt_ip",
        skip_serializing_if = "Option::is_none"
    )]
    pub end: Option<IpAddr>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources::decode;

    #[test]
    fn v2alpha1_pool() {
        let v = json!({
            "apiVersion": "cilium.io/v2alpha1",
            "kind": "CiliumPodIPPool",
            "metadata": {"name": "mars", "annotations": {"ipam.cilium.io/skip-masquerade": "true"}},
            "spec": {
                "ipv4": {"cidrs": ["10.20.0.0/16", "10.21.0.0/16"], "maskSize": 27},
                "ipv6": {"cidrs": ["fd00:20::/104"], "maskSize": 120},
                "allowFirstIP": true,
                "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["rover"]}]},
                "namespaceSelector": {"matchLabels": {"tenant": "mars"}}
            },
            "status": {"conditions": []}
        });
        let p: CiliumPodIPPool = decode(&v).unwrap();
        let spec = p.spec.as_ref().unwrap();
        let v4 = spec.ipv4.as_ref().unwrap();
        assert_eq!(v4.cidrs.len(), 2);
        assert_eq!(v4.mask_size, Some(27));
        assert!(v4.pool.is_none());
        assert_eq!(spec.allow_first_ip, Some(true));
        assert_eq!(spec.allow_last_ip, None);
        assert_eq!(
            spec.pod_selector.as_ref().unwrap().match_expressions[0].values,
            ["rover"]
        );
        // status (not modelled) survives a round trip.
        assert_eq!(serde_json::to_value(&p).unwrap()["status"], v["status"]);
    }

    #[test]
    fn v2_pool_with_reserved_ranges() {
        let v = json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumPodIPPool",
            "metadata": {"name": "default"},
            "spec": {"ipv4": {
                "cidrs": ["10.10.0.0/16"],
                "maskSize": 24,
                "pool": [{"cidr": "10.10.0.0/16", "reservedRanges": [{"start": "10.10.0.0", "end": "10.10.0.255"}]}]
            }}
        });
        let p: CiliumPodIPPool = decode(&v).unwrap();
        let entry = &p.spec.unwrap().ipv4.unwrap().pool.unwrap()[0];
        assert_eq!(entry.cidr, Some("10.10.0.0/16".parse().unwrap()));
        assert_eq!(
            (entry.reserved_ranges[0].start, entry.reserved_ranges[0].end),
            (
                Some("10.10.0.0".parse().unwrap()),
                Some("10.10.0.255".parse().unwrap())
            )
        );
    }

    #[test]
    fn nulls_read_as_absent() {
        let p: CiliumPodIPPool = decode(&json!({
            "apiVersion": "cilium.io/v2alpha1",
            "kind": "CiliumPodIPPool",
            "metadata": {"name": "x", "labels": null, "annotations": null},
            "spec": {"ipv4": {"cidrs": null, "maskSize": null, "pool": null}, "ipv6": null,
                     "podSelector": {"matchLabels": null, "matchExpressions": null}}
        }))
        .unwrap();
        let spec = p.spec.unwrap();
        assert_eq!(spec.ipv4, Some(PoolFamily::default()));
        assert!(spec.ipv6.is_none());
        assert_eq!(spec.pod_selector, Some(LabelSelector::default()));
    }

    #[test]
    fn type_errors_name_the_field() {
        let err = |spec: serde_json::Value| {
            decode::<CiliumPodIPPool>(
                &json!({"apiVersion": "cilium.io/v2", "metadata": {"name": "p"}, "spec": spec}),
            )
            .unwrap_err()
        };
        assert_eq!(
            err(json!({"ipv4": {"cidrs": ["10.0.0.0/8", "10.0.0.0/33"]}})),
            "spec.ipv4.cidrs[1]: \"10.0.0.0/33\" is not a CIDR (expected <address>/<prefix length>, \
             e.g. 10.0.0.0/16 or fd00::/104)"
        );
        assert_eq!(
            err(json!({"ipv4": {"cidrs": "10.0.0.0/8"}})),
            "spec.ipv4.cidrs must be a list, not a string"
        );
        assert_eq!(
            err(json!({"ipv4": {"cidrs": [8]}})),
            "spec.ipv4.cidrs[0] must be a CIDR, not a number"
        );
        assert_eq!(
            err(json!({"ipv6": {"maskSize": "120"}})),
            "spec.ipv6.maskSize must be a number, not a string"
        );
        assert_eq!(
            err(json!({"ipv6": {"maskSize": 120.5}})),
            "spec.ipv6.maskSize must be a whole number, not 120.5"
        );
        assert_eq!(
            err(json!({"allowLastIP": "yes"})),
            "spec.allowLastIP must be true or false, not a string"
        );
        assert_eq!(err(json!([])), "spec must be a map, not a list");
        assert_eq!(
            err(
                json!({"ipv4": {"pool": [{"cidr": "10.0.0.0/8", "reservedRanges": [{"start": "ten"}]}]}})
            ),
            "spec.ipv4.pool[0].reservedRanges[0].start: \"ten\" is not an IP address"
        );
        assert_eq!(
            err(json!({"podSelector": {"matchExpressions": [{"operator": "In"}]}})),
            "spec.podSelector.matchExpressions[0].key is missing"
        );
        assert_eq!(
            err(json!({"namespaceSelector": {"matchLabels": {"tier": 1}}})),
            "spec.namespaceSelector.matchLabels.tier must be a string, not a number (quote it)"
        );
    }
}
