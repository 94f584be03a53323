//! The external backend: in crd, azure, alibabacloud and eni modes something other
//! than podnet decides what the node owns and writes it into a `CiliumNode`
//! manifest file (`--node-resource`). The source reads the spec (and the ENI
//! inventory in `status.eni`), waits at start until the node owns enough addresses
//! and polls the file for changes; the sink writes only the daemon's part of
//! `status` back (see `cilium_node_file` for the two-writer rule). In eni mode the
//! inventory is converted into blocks of pool `default` (Cilium 1.20's
//! ENI-on-multi-pool model). podnet never carves anything here: no operator.

use std::path::PathBuf;
use std::time::Duration;

use super::WatchFuture;
use super::cilium_node_file::CiliumNodeFile;
use super::{
    FlushFuture, NodeError, NodeEvent, NodeOutbox, NodeResource, NodeSink, NodeSource, NodeView,
};
use crate::ipam::eni::eni_allocation;

/// How often the file is checked for changes.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// This node's resource from the file an external IPAM writes.
pub struct ExternalSource {
    pub health: std::sync::Arc<super::BackendHealth>,
    pub node_name: String,
    pub path: PathBuf,
    pub eni: bool,
    /// Addresses the node must own before the daemon serves (one per family, two
    /// with health checking).
    pub needed: u64,
}

impl ExternalSource {
    /// Reads the file; its node must be this node. In eni mode the inventory is
    /// converted into pool blocks.
    fn read(&self) -> Result<NodeResource, NodeError> {
        let (_, resource) = CiliumNodeFile::load(&self.path)?;
        if resource.metadata.name != self.node_name {
            return Err(NodeError::NotThisNode {
                path: self.path.clone(),
                found: resource.metadata.name,
                expected: self.node_name.clone(),
            });
        }
        let mut node = resource;
        if self.eni {
            node.spec.ipam.pools.allocated =
                eni_allocation(&node.status.eni.enis, &node.spec.eni).map_err(NodeError::Eni)?;
        }
        Ok(node)
    }
}

/// The addresses a node resource offers (single IPs and blocks).
pub(super) fn offered(node: &NodeResource) -> u64 {
    node.spec.ipam.pool.len() as u64
        + node.spec.ipam.ipv6_pool.len() as u64
        + node
            .spec
            .ipam
            .pools
            .allocated
            .iter()
            .flat_map(|a| a.cidrs.iter())
            .map(|n| 1u64 << (n.max_prefix_len() - n.prefix_len()).min(63))
            .sum::<u64>()
}

impl NodeSource for ExternalSource {
    /// Reads the file until it offers enough addresses (Cilium waits the same way
    /// before it serves).
    fn initial(&mut self) -> Result<NodeView, NodeError> {
        let mut logged = false;
        loop {
            let node = self.read()?;
            let have = offered(&node);
            if have >= self.needed {
                self.health.set("node-resource", true);
                tracing::info!(node = %self.node_name, file = %self.path.display(), "node resource read from file");
                return Ok(NodeView {
                    node: Some(node),
                    ..NodeView::default()
                });
            }
            if !logged {
                tracing::info!(
                    have,
                    needed = self.needed,
                    "Waiting for initial IP to become available in '{}' custom resource",
                    self.node_name
                );
                logged = true;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    fn watch(self: Box<Self>, events: tokio::sync::mpsc::Sender<NodeEvent>) -> WatchFuture {
        Box::pin(async move {
            let stamp = || CiliumNodeFile::current_fingerprint(&self.path).ok();
            let mut seen = stamp();
            loop {
                tokio::time::sleep(WATCH_INTERVAL).await;
                let now = stamp();
                if now == seen {
                    continue;
                }
                seen = now;
                match self.read() {
                    Ok(node) => {
                        if events.send(NodeEvent::Node(Box::new(node))).await.is_err() {
                            return;
                        }
                        tracing::info!(file = %self.path.display(), "node resource reloaded");
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "node resource not reloaded; keeping the previous one")
                    }
                }
            }
        })
    }
}

/// Writes the used addresses into the file's `status.ipam` (the external IPAM owns
/// everything else in it).
pub struct ExternalSink {
    pub path: PathBuf,
}

impl NodeSink for ExternalSink {
    /// The file is read and written on a blocking thread.
    fn flush<'a>(&'a mut self, outbox: &'a NodeOutbox) -> FlushFuture<'a> {
        let path = self.path.clone();
        let used = outbox.used.clone();
        Box::pin(async move {
            let Some(used) = used else {
                return Ok(());
            };
            let status = serde_json::json!({"ipam": {"used": used.ipv4, "ipv6-used": used.ipv6}});
            let write = move || {
                CiliumNodeFile::load(&path)
                    .and_then(|(f, _)| f.write_status(&status))
                    .map(|()| path)
            };
            let path = tokio::task::spawn_blocking(write)
                .await
                .map_err(|source| NodeError::Join {
                    op: "writing status.ipam.used".into(),
                    source,
                })??;
            tracing::debug!(file = %path.display(), "wrote status.ipam.used");
            Ok(())
        })
    }
}
