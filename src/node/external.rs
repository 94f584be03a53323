//! The external backend: in crd, azure, alibabacloud and eni modes something other
//! than podnet decides what the node owns and writes it into a `CiliumNode`
//! manifest file (`--node-resource`); the daemon reads the spec (and the ENI
//! inventory in `status.eni`) and writes only its own part of `status` back (see
//! `cilium_node_file` for the two-writer rule). In eni mode the inventory is
//! converted into blocks of pool `default` (Cilium 1.20's ENI-on-multi-pool model);
//! podnet never carves anything here.

use ipnet::IpNet;

use super::cilium_node_file::CiliumNodeFile;
use super::{NodeBackend, NodeResource};
use crate::ipam::eni::eni_allocation;
use crate::ipam::pooldef::PoolDef;

/// The node resource from a file an external tool writes.
pub struct ExternalBackend {
    node_name: String,
    eni: bool,
    file: CiliumNodeFile,
    resource: NodeResource,
}

impl ExternalBackend {
    /// Loads the file; its node must be this node.
    pub fn load(
        node_name: &str,
        path: &std::path::Path,
        eni: bool,
    ) -> Result<ExternalBackend, String> {
        let (file, resource) = CiliumNodeFile::load(path)?;
        if resource.metadata.name != node_name {
            return Err(format!(
                "{} describes node {:?}, not this node {node_name:?}",
                path.display(),
                resource.metadata.name
            ));
        }
        Ok(ExternalBackend {
            node_name: node_name.to_string(),
            eni,
            file,
            resource,
        })
    }

    /// The node resource as the file has it, with the ENI inventory converted into
    /// pool blocks in eni mode.
    pub fn resolved(resource: &NodeResource, eni: bool) -> Result<NodeResource, String> {
        let mut node = resource.clone();
        if eni {
            node.spec.ipam.pools.allocated = eni_allocation(&node.status.eni.enis, &node.spec.eni)?;
        }
        Ok(node)
    }

    /// The node resource as read.
    pub fn resource(&self) -> &NodeResource {
        &self.resource
    }
}

impl NodeBackend for ExternalBackend {
    fn sync(&mut self, _current: Option<NodeResource>) -> Result<NodeResource, String> {
        let node = Self::resolved(&self.resource, self.eni)?;
        tracing::info!(node = %self.node_name, file = %self.file.path().display(), "node resource read from file");
        Ok(node)
    }

    fn satisfy(&mut self, _node: &mut NodeResource) -> Vec<String> {
        Vec::new()
    }

    fn release_block(&mut self, _pool: &str, _cidr: &IpNet) {}

    fn update_pools(&mut self, _pools: &[PoolDef], _node: &NodeResource) -> Result<(), String> {
        Ok(())
    }

    fn pools(&self) -> Vec<PoolDef> {
        Vec::new()
    }
}
