//! What this node owns and where that comes from: the `NodeBackend`s that fill in
//! the node resource (shaped like Cilium's `CiliumNode`), and the files they read.
//!
//! * `EmbeddedBackend`: the node resource lives in the daemon's journal and an
//!   embedded operator decides (cluster-pool, kubernetes and multi-pool modes,
//!   and delegated-plugin, where it carves nothing).
//! * `external::ExternalBackend`: something else decides and writes a
//!   `CiliumNode` file (crd, azure, alibabacloud, eni); `cilium_node_file` reads
//!   it and writes the daemon's part of `status` back under the two-writer rule.
//! * `manifests`: directories of `CiliumPodIPPool`, `CiliumNodeConfig`, Pod and
//!   Namespace manifests (the daemon's pool and metadata directories, and
//!   `podnet lint`).
//!
//! The daemon picks the backend at start (and re-reads an external file when it
//! changes); its IPAM state holds only a `NodeBackend`, through which it brings the
//! resource up to date at start and, in multi-pool mode, has blocks carved for the
//! node's demand, gives blocks back and hands over changed pool definitions.

pub mod cilium_node_file;
mod embedded;
pub mod external;
pub mod manifests;
mod resource;

use ipnet::IpNet;

use crate::ipam::pooldef::PoolDef;

pub use embedded::{EmbeddedBackend, EmbeddedMode};
pub use resource::{
    AllocatedPool, IpamPools, NodeAddress, NodeIpamSpec, NodeResource, PoolDemand, RequestedPool,
};

/// Where the node resource comes from, and who plays the operator for it.
pub trait NodeBackend: Send {
    /// Brings the node resource up to date at start (cluster-pool: carve the node
    /// CIDRs; multi-pool: adopt the node's blocks, or migrate its cluster-pool CIDRs)
    /// and returns it. Called once, before any allocation.
    fn sync(&mut self, current: Option<NodeResource>) -> Result<NodeResource, String>;

    /// Multi-pool: carves blocks until `spec.ipam.pools.requested` is met, into
    /// `spec.ipam.pools.allocated`. Returns the errors for
    /// `status.ipam.operator-status.error` (empty: all met).
    fn satisfy(&mut self, node: &mut NodeResource) -> Vec<String>;

    /// Multi-pool: the node gave a block back.
    fn release_block(&mut self, pool: &str, cidr: &IpNet);

    /// Multi-pool: the pool definitions changed; refused (nothing changes) when a
    /// change breaks what the node uses.
    fn update_pools(&mut self, pools: &[PoolDef], node: &NodeResource) -> Result<(), String>;

    /// The pool definitions in force (empty outside multi-pool).
    fn pools(&self) -> Vec<PoolDef>;
}
