//! `CiliumL2AnnouncementPolicy` (`cilium.io/v2alpha1`, the only version Cilium
//! 1.20 serves): which nodes answer ARP and NDP for which Services' addresses,
//! on which interfaces. Types only: selectors and interface patterns are
//! checked where a policy is read (`l2announce::views`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::fields::nullable;
use super::object::object;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// The `apiVersion`.
pub const L2_POLICY_V2ALPHA1: &str = "cilium.io/v2alpha1";
/// The `kind`.
pub const L2_POLICY_KIND: &str = "CiliumL2AnnouncementPolicy";

object! {
    /// A `CiliumL2AnnouncementPolicy` (cluster-scoped).
    pub struct CiliumL2AnnouncementPolicy {
        #[serde(default, deserialize_with = "nullable")]
        pub spec: L2PolicySpec,
    }
}

/// `spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct L2PolicySpec {
    /// None: every Service.
    #[serde(
        rename = "serviceSelector",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub service_selector: Option<LabelSelector>,
    /// None: every node.
    #[serde(
        rename = "nodeSelector",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub node_selector: Option<LabelSelector>,
    /// Regular expressions of interface names; none: every interface.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub interfaces: Vec<String>,
    /// Whether `spec.externalIPs` are announced.
    #[serde(rename = "externalIPs", default, deserialize_with = "nullable")]
    pub external_ips: bool,
    /// Whether the LoadBalancer ingress addresses are announced.
    #[serde(rename = "loadBalancerIPs", default, deserialize_with = "nullable")]
    pub load_balancer_ips: bool,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_policy_reads_as_cilium_writes_it_and_null_reads_as_absent() {
        let p: CiliumL2AnnouncementPolicy = serde_json::from_value(json!({
            "apiVersion": L2_POLICY_V2ALPHA1, "kind": L2_POLICY_KIND,
            "metadata": {"name": "lan"},
            "spec": {"serviceSelector": {"matchLabels": {"app": "web"}},
                     "nodeSelector": null, "interfaces": ["^eth[0-9]+"],
                     "loadBalancerIPs": true, "externalIPs": null}
        }))
        .unwrap();
        assert_eq!(p.metadata.name, "lan");
        assert!(p.spec.service_selector.is_some() && p.spec.node_selector.is_none());
        assert_eq!(p.spec.interfaces, ["^eth[0-9]+"]);
        assert!(p.spec.load_balancer_ips && !p.spec.external_ips);
        let empty: CiliumL2AnnouncementPolicy =
            serde_json::from_value(json!({"metadata": {"name": "x"}, "spec": null})).unwrap();
        assert_eq!(empty.spec, L2PolicySpec::default());
    }
}
