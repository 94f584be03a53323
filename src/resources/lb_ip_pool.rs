//! `CiliumLoadBalancerIPPool`: the pools of LB IPAM, `cilium.io/v2` (Cilium 1.20's
//! storage version) and the deprecated `cilium.io/v2alpha1`, one schema for both.
//! Types only: which blocks and values are usable is checked where a pool is built
//! (`operator::lbipam::pools`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::LabelSelector;
use super::fields::{nullable, opt_cidr, opt_ip};
use super::object::object;

/// The `apiVersion` Cilium 1.20 stores.
pub const LB_IP_POOL_V2: &str = "cilium.io/v2";
/// The deprecated `apiVersion`, still served.
pub const LB_IP_POOL_V2ALPHA1: &str = "cilium.io/v2alpha1";
/// The `kind`.
pub const LB_IP_POOL_KIND: &str = "CiliumLoadBalancerIPPool";

object! {
    /// A `CiliumLoadBalancerIPPool` (cluster-scoped).
    pub struct CiliumLoadBalancerIPPool {
        #[serde(default, deserialize_with = "nullable")]
        pub spec: LbIpPoolSpec,
    }
}

/// `spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LbIpPoolSpec {
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub blocks: Vec<LbIpPoolBlock>,
    /// `"Yes"` (the default) or `"No"`.
    #[serde(
        rename = "allowFirstLastIPs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_first_last_ips: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub disabled: bool,
    #[serde(
        rename = "serviceSelector",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub service_selector: Option<LabelSelector>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `spec.blocks[]`: a `cidr`, or a `start` (and optional `stop`) range.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LbIpPoolBlock {
    #[serde(
        default,
        deserialize_with = "opt_cidr",
        skip_serializing_if = "Option::is_none"
    )]
    pub cidr: Option<IpNet>,
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
    pub stop: Option<IpAddr>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::decode;

    #[test]
    fn the_chapters_pool() {
        let yaml = "apiVersion: cilium.io/v2\nkind: CiliumLoadBalancerIPPool\n\
                    metadata: {name: blue-pool}\nspec:\n  blocks:\n  - cidr: 10.0.10.0/24\n\
                    \x20 - start: 10.0.20.100\n    stop: 10.0.20.200\n\
                    \x20 serviceSelector:\n    matchLabels: {color: blue}\n\
                    \x20 allowFirstLastIPs: \"No\"\n";
        let v: serde_json::Value = serde_yaml_ng::from_str(yaml).unwrap();
        let p: CiliumLoadBalancerIPPool = decode(&v).unwrap();
        assert_eq!(p.metadata.name, "blue-pool");
        assert_eq!(p.spec.blocks.len(), 2);
        assert_eq!(p.spec.blocks[0].cidr.unwrap().to_string(), "10.0.10.0/24");
        assert_eq!(p.spec.blocks[1].start.unwrap().to_string(), "10.0.20.100");
        assert_eq!(p.spec.blocks[1].stop.unwrap().to_string(), "10.0.20.200");
        assert_eq!(p.spec.allow_first_last_ips.as_deref(), Some("No"));
        assert!(!p.spec.disabled);
        let sel = p.spec.service_selector.unwrap();
        assert_eq!(sel.match_labels["color"], "blue");
    }

    #[test]
    fn bad_addresses_name_the_field() {
        let v = serde_json::json!({"spec": {"blocks": [{"start": "10.0.0.300"}]}});
        let e = decode::<CiliumLoadBalancerIPPool>(&v).unwrap_err();
        assert!(e.contains("spec.blocks[0].start"), "{e}");
        assert!(e.contains("\"10.0.0.300\" is not an IP address"), "{e}");
        let v = serde_json::json!({"spec": {"disabled": "yes"}});
        let e = decode::<CiliumLoadBalancerIPPool>(&v).unwrap_err();
        assert!(e.contains("spec.disabled"), "{e}");
    }
}
