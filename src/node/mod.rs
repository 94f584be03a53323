//! The node resource (shaped like Cilium's `CiliumNode`) and the backends that say
//! what this node owns. Nothing outside this module knows which backend runs: the
//! daemon asks a `NodeBackend` for the node's pod CIDRs and stores what it reports.

mod embedded;
mod resource;

pub use embedded::{EmbeddedBackend, EmbeddedMode};
pub use resource::{NodeAddress, NodeIpamSpec, NodeResource};

/// Where the node resource comes from.
pub trait NodeBackend {
    /// Brings the node resource up to date (the operator's part: carve the node's
    /// CIDRs) and returns it. Called once at start, before any allocation.
    fn sync(&mut self, current: Option<NodeResource>) -> Result<NodeResource, String>;
}
