//! `CiliumCIDRGroup`: a named list of CIDRs (`spec.externalCIDRs`) that network
//! policies reference; nothing allocates from it. `cilium.io/v2` (and the
//! deprecated `v2alpha1`), cluster-scoped. Types only: what `podnet lint` says
//! about a group is in `cli::cidr_groups`.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::fields::cidr_list;
use super::object::object;

pub const CIDR_GROUP_KIND: &str = "CiliumCIDRGroup";
pub const CIDR_GROUP_V2: &str = "cilium.io/v2";
pub const CIDR_GROUP_V2ALPHA1: &str = "cilium.io/v2alpha1";

object! {
    /// A `CiliumCIDRGroup`.
    pub struct CiliumCIDRGroup {
        pub spec: CidrGroupSpec,
    }
}

/// `spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CidrGroupSpec {
    #[serde(rename = "externalCIDRs", deserialize_with = "cidr_list")]
    pub external_cidrs: Vec<IpNet>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::decode;

    #[test]
    fn the_chapters_group_and_field_errors() {
        let v = serde_json::json!({"apiVersion": "cilium.io/v2", "kind": "CiliumCIDRGroup",
            "metadata": {"name": "corp-ranges", "labels": {"tier": "internal"}},
            "spec": {"externalCIDRs": ["10.30.0.0/16", "192.168.100.0/24"]}});
        let g: CiliumCIDRGroup = decode(&v).unwrap();
        assert_eq!(g.metadata.name, "corp-ranges");
        assert_eq!(g.spec.external_cidrs.len(), 2);
        let v = serde_json::json!({"spec": {"externalCIDRs": ["10.30.0.0/16", "10.0.0.0/33"]}});
        let e = decode::<CiliumCIDRGroup>(&v).unwrap_err();
        assert!(e.contains("spec.externalCIDRs[1]"), "{e}");
        assert!(e.contains("\"10.0.0.0/33\" is not a CIDR"), "{e}");
        let e = decode::<CiliumCIDRGroup>(&serde_json::json!({"spec": {}})).unwrap_err();
        assert_eq!(e, "spec.externalCIDRs is missing");
        let e = decode::<CiliumCIDRGroup>(&serde_json::json!({})).unwrap_err();
        assert_eq!(e, "spec is missing");
    }
}
