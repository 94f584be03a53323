//! The backends that say what this node owns, through its node resource (the
//! `CiliumNode` of `crate::resources`, re-exported here as the backends' currency).
//! Nothing outside this module knows which backend runs: the daemon asks a
//! `NodeBackend` for the node's CIDRs (host-scope modes) or blocks (multi-pool),
//! hands it the node's demand, and gives blocks back through it.

pub mod cilium_node_file;
mod embedded;
pub mod external;
pub mod manifests;

use ipnet::IpNet;

use crate::ipam::pooldef::PoolDef;

pub use crate::resources::NodeResource;
pub use embedded::{EmbeddedBackend, EmbeddedMode};

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
