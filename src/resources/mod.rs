//! Typed Kubernetes and Cilium resources, spelled as the API server (and `kubectl
//! get -o yaml|json`) spells them: `CiliumNode` ([`NodeResource`]),
//! [`CiliumPodIPPool`], [`CiliumNodeConfig`], [`CiliumLoadBalancerIPPool`], [`CiliumCIDRGroup`], and what podnet reads of [`Pod`],
//! [`Namespace`] and [`Node`]. The crate's leaf: it depends on nothing else in
//! podnet, and every backend (manifest files, a `CiliumNode` file, the journal, the
//! Kubernetes API) and `ipam` use the same types.
//!
//! Types, not rules: a CIDR field holds a CIDR and an address field an address, the
//! rest is as loose as the CRD schema. What makes an object usable (a name, a
//! `maskSize` in range, valid selector operators) is checked where it is converted
//! (`ipam::pooldef`, `ipam::node_config`, `ipam::selection`), so every backend
//! refuses the same objects with the same words. [`decode`] names the field a type
//! error is in. Fields podnet does not model are kept (`extra`), so an object
//! written back loses nothing.

/// The CRDs, as installed by `kubectl apply -f deploy/crds/` (and printed by
/// `podnet crds`): Cilium 1.20's group, names, versions and schemas.
pub const CRD_MANIFESTS: [&str; 5] = [
    include_str!("../../deploy/crds/ciliumnodes.yaml"),
    include_str!("../../deploy/crds/ciliumpodippools.yaml"),
    include_str!("../../deploy/crds/ciliumnodeconfigs.yaml"),
    include_str!("../../deploy/crds/ciliumloadbalancerippools.yaml"),
    include_str!("../../deploy/crds/ciliuml2announcementpolicies.yaml"),
];

/// sig-network's ClusterNetworkPolicy CRD (network-policy-api v0.3.0, the
/// experimental channel), as `kubectl apply -f deploy/crds/` installs it and
/// `podnet crds` prints it. The operator never registers it: the CRD is not
/// Cilium's, and another implementation's of the same group would be changed.
pub const CLUSTER_NETWORK_POLICY_CRD: &str =
    include_str!("../../deploy/crds/clusternetworkpolicies.yaml");

mod cidr_group;
mod cilium_node;
pub mod core_v1;
mod decode;
mod fields;
mod l2_policy;
mod lb_ip_pool;
mod meta;
mod node_config;
mod object;
mod pod_ip_pool;

pub use cidr_group::{
    CIDR_GROUP_KIND, CIDR_GROUP_V2, CIDR_GROUP_V2ALPHA1, CidrGroupSpec, CiliumCIDRGroup,
};
pub use cilium_node::{
    AllocatedPool, AllocationIp, AwsSubnet, AwsVpc, Eni, EniSpec, EniStatus, HealthAddresses,
    IpamPools, NodeAddress, NodeIpamSpec, NodeIpamStatus, NodeResource, NodeSpec, NodeStatus,
    OperatorStatus, PodCidrState, PodCidrStatus, PoolDemand, ROUTING_MODE_ANNOTATION,
    RequestedPool,
};
pub use core_v1::{Namespace, Node, Pod};
pub use decode::{InvalidObject, decode};
pub use l2_policy::{CiliumL2AnnouncementPolicy, L2_POLICY_KIND, L2_POLICY_V2ALPHA1, L2PolicySpec};
pub use lb_ip_pool::{
    CiliumLoadBalancerIPPool, LB_IP_POOL_KIND, LB_IP_POOL_V2, LB_IP_POOL_V2ALPHA1, LbIpPoolBlock,
    LbIpPoolSpec,
};
pub use meta::{LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference};
pub use node_config::{
    CiliumNodeConfig, NODE_CONFIG_KIND, NODE_CONFIG_V2, NODE_CONFIG_V2ALPHA1, NodeConfigSpec,
};
pub use pod_ip_pool::{
    CiliumPodIPPool, POD_IP_POOL_KIND, POD_IP_POOL_V2, POD_IP_POOL_V2ALPHA1, PodIPPoolSpec,
    PoolCidr, PoolFamily, ReservedRange,
};

#[cfg(test)]
mod crd_tests {
    use super::CRD_MANIFESTS;

    #[test]
    fn the_crds_are_ciliums_group_and_names() {
        let names: Vec<String> = CRD_MANIFESTS
            .iter()
            .map(|m| {
                let v: serde_json::Value = serde_yaml_ng::from_str(m).expect("a CRD");
                assert_eq!(v["kind"], "CustomResourceDefinition");
                assert_eq!(v["spec"]["group"], "cilium.io");
                v["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        assert_eq!(
            names,
            [
                "ciliumnodes.cilium.io",
                "ciliumpodippools.cilium.io",
                "ciliumnodeconfigs.cilium.io",
                "ciliumloadbalancerippools.cilium.io",
                "ciliuml2announcementpolicies.cilium.io"
            ]
        );
        // Every manifest ends with a newline, so `podnet crds` separates them.
        assert!(CRD_MANIFESTS.iter().all(|m| m.ends_with('\n')));
    }

    #[test]
    fn the_cluster_network_policy_crd_is_sig_networks_in_both_versions() {
        let crd = super::CLUSTER_NETWORK_POLICY_CRD;
        assert!(crd.ends_with('\n') && !crd.contains("\n---"));
        let v: serde_json::Value = serde_yaml_ng::from_str(crd).expect("a CRD");
        assert_eq!(
            v["metadata"]["name"],
            "clusternetworkpolicies.policy.networking.k8s.io"
        );
        let versions: Vec<&str> = v["spec"]["versions"]
            .as_array()
            .expect("versions")
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        assert!(versions.contains(&"v1beta1") && versions.contains(&"v1alpha2"));
    }
}
