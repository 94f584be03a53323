//! Typed Kubernetes and Cilium resources, spelled as the API server (and `kubectl
//! get -o yaml|json`) spells them: `CiliumNode` ([`NodeResource`]),
//! [`CiliumPodIPPool`], [`CiliumNodeConfig`], and what podnet reads of [`Pod`],
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

mod cilium_node;
pub mod core_v1;
mod decode;
mod fields;
mod meta;
mod node_config;
mod pod_ip_pool;

pub use cilium_node::{
    AllocatedPool, AllocationIp, AwsSubnet, AwsVpc, Eni, EniSpec, EniStatus, IpamPools,
    NodeAddress, NodeIpamSpec, NodeIpamStatus, NodeResource, NodeSpec, NodeStatus, OperatorStatus,
    PoolDemand, RequestedPool,
};
pub use core_v1::{Namespace, Node, Pod};
pub use decode::{InvalidObject, decode};
pub use meta::{LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference};
pub use node_config::{
    CiliumNodeConfig, NODE_CONFIG_KIND, NODE_CONFIG_V2, NODE_CONFIG_V2ALPHA1, NodeConfigSpec,
};
pub use pod_ip_pool::{
    CiliumPodIPPool, POD_IP_POOL_KIND, POD_IP_POOL_V2, POD_IP_POOL_V2ALPHA1, PodIPPoolSpec,
    PoolCidr, PoolFamily, ReservedRange,
};
