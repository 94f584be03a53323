//! What a pool is, whatever it came from (a `CiliumPodIPPool` manifest, the
//! `auto-create-cilium-pod-ip-pools` option, or the cluster-pool migration): its
//! CIDRs and block size per family, first/last-address rules, masquerade opt-out and
//! selectors. Plain data; parsing and validation live with their sources.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// One family of a pool: `spec.ipv4` / `spec.ipv6`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolFamilySpec {
    pub cidrs: Vec<IpNet>,
    /// Size of the per-node blocks carved from `cidrs`.
    pub mask_size: u8,
    /// v2 `pool[].reservedRanges`: inclusive ranges no new block may overlap.
    #[serde(default)]
    pub reserved_ranges: Vec<(IpAddr, IpAddr)>,
}

/// A label selector (`matchLabels` and `matchExpressions`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelSelector {
    #[serde(rename = "matchLabels", default)]
    pub match_labels: BTreeMap<String, String>,
    #[serde(rename = "matchExpressions", default)]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry: operator `In`, `NotIn`, `Exists`, `DoesNotExist`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: String,
    #[serde(default)]
    pub values: Vec<String>,
}

/// A pool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolDef {
    pub name: String,
    pub ipv4: Option<PoolFamilySpec>,
    pub ipv6: Option<PoolFamilySpec>,
    /// Hand out the first address of each block (ignored for /31, /32, /127, /128).
    pub allow_first_ip: bool,
    /// Hand out the last address of each block (ignored for /31, /32, /127, /128).
    pub allow_last_ip: bool,
    /// The `ipam.cilium.io/skip-masquerade: "true"` annotation.
    pub skip_masquerade: bool,
    pub pod_selector: Option<LabelSelector>,
    pub namespace_selector: Option<LabelSelector>,
}

impl PoolDef {
    /// The spec of one family, if the pool has it.
    pub fn family(&self, family: super::Family) -> Option<&PoolFamilySpec> {
        match family {
            super::Family::V4 => self.ipv4.as_ref(),
            super::Family::V6 => self.ipv6.as_ref(),
        }
    }
}
