//! The embedded backend's source: Kubernetes-style manifests in directories the
//! daemon watches (`--pool-dir`: CiliumPodIPPool and CiliumNodeConfig; `--metadata-dir`:
//! Pod and Namespace), plus the pools `--auto-create-cilium-pod-ip-pools` creates when
//! the directory lacks them. The directories are polled once a second; a directory
//! that does not parse keeps the previous state (and the log says why).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::manifests::ManifestDir;
use super::{NodeError, NodeEvent, NodeSource, NodeView, WatchFuture, send_pools};
use crate::ipam::pooldef::PoolDef;

/// How often the directories are checked for changes.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Pools, the node's default pool and pod metadata from manifest directories.
pub struct ManifestSource {
    pub health: std::sync::Arc<super::BackendHealth>,
    pub pool_dir: Option<PathBuf>,
    pub metadata_dir: Option<PathBuf>,
    /// Pools created when the pool directory lacks them.
    pub auto_create: Vec<PoolDef>,
    /// This node's labels, for CiliumNodeConfig node selectors.
    pub node_labels: BTreeMap<String, String>,
}

impl ManifestSource {
    /// The pools of the pool directory plus the auto-created ones it lacks, and the
    /// default pool a CiliumNodeConfig there sets for this node.
    fn pools(&self) -> Result<(Vec<PoolDef>, Option<String>), NodeError> {
        let dir = self
            .pool_dir
            .as_deref()
            .map(ManifestDir::load)
            .transpose()?;
        let mut defs: Vec<PoolDef> = dir.as_ref().map(|d| d.pools().to_vec()).unwrap_or_default();
        for auto in &self.auto_create {
            if !defs.iter().any(|d| d.name == auto.name) {
                defs.push(auto.clone());
            }
        }
        let default_pool = dir.and_then(|d| d.node_default_pool(&self.node_labels));
        Ok((defs, default_pool))
    }
}

fn stamp(dir: Option<&Path>) -> Option<super::manifests::Fingerprint> {
    dir.and_then(|d| ManifestDir::fingerprint(d).ok())
}

impl NodeSource for ManifestSource {
    fn initial(&mut self) -> Result<NodeView, NodeError> {
        let (pools, default_pool) = self.pools()?;
        let metadata = match self.metadata_dir.as_deref() {
            Some(dir) => Some(Box::new(ManifestDir::load(dir)?)
                as Box<dyn crate::ipam::selection::MetadataSource + Send>),
            None => None,
        };
        for (watch, dir) in [
            ("pool-dir", &self.pool_dir),
            ("metadata-dir", &self.metadata_dir),
        ] {
            if dir.is_some() {
                self.health.set(watch, true);
            }
        }
        Ok(NodeView {
            node: None,
            pools,
            default_pool,
            metadata,
            facts: None,
        })
    }

    fn watch(self: Box<Self>, events: tokio::sync::mpsc::Sender<NodeEvent>) -> WatchFuture {
        Box::pin(async move {
            let mut pools_seen = stamp(self.pool_dir.as_deref());
            let mut meta_seen = stamp(self.metadata_dir.as_deref());
            loop {
                tokio::time::sleep(WATCH_INTERVAL).await;
                let pools_now = stamp(self.pool_dir.as_deref());
                if pools_now != pools_seen {
                    pools_seen = pools_now;
                    match self.pools() {
                        Ok((defs, default_pool)) => {
                            if !send_pools(&events, defs, default_pool).await {
                                return;
                            }
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "pool definitions not reloaded; keeping the previous ones")
                        }
                    }
                }
                let meta_now = stamp(self.metadata_dir.as_deref());
                if meta_now != meta_seen {
                    meta_seen = meta_now;
                    let Some(dir) = self.metadata_dir.as_deref() else {
                        continue;
                    };
                    match ManifestDir::load(dir) {
                        Ok(m) => {
                            if events.send(NodeEvent::Metadata(Box::new(m))).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "metadata not reloaded; keeping the previous one")
                        }
                    }
                }
            }
        })
    }
}
