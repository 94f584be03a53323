//! The embedded operator: in the embedded backend the node resource lives in the
//! daemon's own journal, and this plays the cluster operator's part for this one
//! node. In cluster-pool mode it carves the node CIDRs out of the cluster pool
//! (re-adopting the ones the node already owns); in kubernetes mode it takes the
//! node's podCIDRs as given (the analog of `Node.spec.podCIDRs`); in multi-pool mode
//! it carves blocks of each pool on demand, and migrates a cluster-pool node when
//! asked to.

use ipnet::IpNet;

use super::{NodeError, NodeOperator, NodeResource};
use crate::ipam::Family;
use crate::ipam::clusterpool::{ClusterPoolConfig, NodeCidrCarver};
use crate::ipam::pool_operator::{PoolOperator, check_migration, migrated_allocation};
use crate::ipam::pooldef::PoolDef;

/// What decides the node's addresses.
#[derive(Debug, Clone)]
pub enum EmbeddedMode {
    /// Carve one CIDR per enabled family from the cluster pool.
    ClusterPool(ClusterPoolConfig),
    /// The node's podCIDRs are given (kubernetes mode).
    Kubernetes {
        pod_cidrs: Vec<IpNet>,
        enable_ipv4: bool,
        enable_ipv6: bool,
    },
    /// Another CNI IPAM plugin, run by the CNI plugin, owns the addresses: the node
    /// owns nothing here.
    Delegated,
    /// Blocks of named pools, carved on demand.
    MultiPool {
        pools: Vec<PoolDef>,
        default_pool: String,
        migrate_cluster_pool: bool,
    },
}

/// The embedded operator of one node.
pub struct EmbeddedOperator {
    node_name: String,
    mode: EmbeddedMode,
    operator: Option<PoolOperator>,
}

impl EmbeddedOperator {
    pub fn new(node_name: &str, mode: EmbeddedMode) -> EmbeddedOperator {
        EmbeddedOperator {
            node_name: node_name.to_string(),
            mode,
            operator: None,
        }
    }

    fn multi_pool_sync(
        &mut self,
        mut node: NodeResource,
        pools: &[PoolDef],
        default_pool: &str,
        migrate: bool,
    ) -> Result<NodeResource, NodeError> {
        let pod_cidrs = node.spec.ipam.pod_cidrs.clone();
        if !pod_cidrs.is_empty() && node.spec.ipam.pools.allocated.is_empty() {
            if !migrate {
                return Err(NodeError::MigrationNotEnabled {
                    node: self.node_name.clone(),
                    pod_cidrs: texts(&pod_cidrs),
                    default_pool: default_pool.to_string(),
                });
            }
            let def = pools
                .iter()
                .find(|p| p.name == default_pool)
                .ok_or_else(|| NodeError::MigrationWithoutDefaultPool(default_pool.to_string()))?;
            check_migration(def, &pod_cidrs).map_err(NodeError::Pools)?;
            node.spec
                .ipam
                .pools
                .allocated
                .push(migrated_allocation(def, &pod_cidrs));
            tracing::info!(node = %self.node_name, cidrs = ?texts(&pod_cidrs), pool = default_pool, "migrated the node's cluster-pool CIDRs into the default pool");
        }
        let mut operator = PoolOperator::new(pools).map_err(NodeError::Pools)?;
        operator
            .adopt(&node.spec.ipam.pools.allocated)
            .map_err(NodeError::Pools)?;
        self.operator = Some(operator);
        Ok(node)
    }
}

impl NodeOperator for EmbeddedOperator {
    fn sync(&mut self, current: Option<NodeResource>) -> Result<NodeResource, NodeError> {
        let mut node = match current {
            Some(n) if n.metadata.name == self.node_name => n,
            Some(n) => {
                return Err(NodeError::JournalOfAnotherNode {
                    found: n.metadata.name,
                    expected: self.node_name.clone(),
                });
            }
            None => NodeResource::new(&self.node_name),
        };
        let cidrs = match &self.mode {
            EmbeddedMode::ClusterPool(cfg) => {
                let mut carver = NodeCidrCarver::new(cfg)?;
                carver
                    .carve_for_node(&node.spec.ipam.pod_cidrs)
                    .map_err(|source| NodeError::Carve {
                        node: self.node_name.clone(),
                        source,
                    })?
            }
            EmbeddedMode::Kubernetes {
                pod_cidrs,
                enable_ipv4,
                enable_ipv6,
            } => kubernetes_cidrs(pod_cidrs, *enable_ipv4, *enable_ipv6)?,
            EmbeddedMode::Delegated => Vec::new(),
            EmbeddedMode::MultiPool {
                pools,
                default_pool,
                migrate_cluster_pool,
            } => {
                let (pools, default_pool, migrate) =
                    (pools.clone(), default_pool.clone(), *migrate_cluster_pool);
                return self.multi_pool_sync(node, &pools, &default_pool, migrate);
            }
        };
        node.spec.ipam.pod_cidrs = cidrs;
        node.status.ipam.operator_status.error.clear();
        Ok(node)
    }

    fn satisfy(&mut self, node: &mut NodeResource) -> Vec<String> {
        let Some(op) = self.operator.as_mut() else {
            return Vec::new();
        };
        let requested = node.spec.ipam.pools.requested.clone();
        let errors = op.satisfy(
            &self.node_name,
            &requested,
            &mut node.spec.ipam.pools.allocated,
        );
        node.status.ipam.operator_status.error = errors.join("; ");
        errors
    }

    fn release_block(&mut self, pool: &str, cidr: &IpNet) {
        if let Some(op) = self.operator.as_mut() {
            op.release(pool, cidr);
        }
    }

    fn update_pools(&mut self, pools: &[PoolDef], node: &NodeResource) -> Result<(), NodeError> {
        let Some(op) = self.operator.as_mut() else {
            return Ok(());
        };
        op.update_pools(pools, &node.spec.ipam.pools.allocated)
            .map_err(NodeError::Pools)?;
        if let EmbeddedMode::MultiPool { pools: current, .. } = &mut self.mode {
            *current = pools.to_vec();
        }
        Ok(())
    }
}

/// CIDRs as text, so messages quote them as the node resource spells them
/// (`["10.0.1.0/24"]`).
fn texts(cidrs: &[IpNet]) -> Vec<String> {
    cidrs.iter().map(IpNet::to_string).collect()
}

/// Kubernetes mode: the first CIDR of each enabled family is the node's; a missing
/// one is the agent's "required PodCIDR not available" failure.
fn kubernetes_cidrs(pod_cidrs: &[IpNet], v4: bool, v6: bool) -> Result<Vec<IpNet>, NodeError> {
    let mut out = Vec::new();
    for (enabled, family) in [(v4, Family::V4), (v6, Family::V6)] {
        let found = pod_cidrs.iter().find(|c| Family::of_net(c) == family);
        match (enabled, found) {
            (true, Some(c)) => out.push(c.trunc()),
            (true, None) => return Err(NodeError::PodCidrNotGiven(family)),
            (false, _) => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_mode_takes_given_cidrs() {
        let mut b = EmbeddedOperator::new(
            "n1",
            EmbeddedMode::Kubernetes {
                pod_cidrs: vec![
                    "10.1.2.0/24".parse().unwrap(),
                    "fd00:1::/120".parse().unwrap(),
                ],
                enable_ipv4: true,
                enable_ipv6: true,
            },
        );
        let n = b.sync(None).unwrap();
        assert_eq!(
            n.spec.ipam.pod_cidrs,
            vec![
                "10.1.2.0/24".parse::<IpNet>().unwrap(),
                "fd00:1::/120".parse().unwrap()
            ]
        );
    }

    #[test]
    fn kubernetes_mode_needs_a_cidr_per_enabled_family() {
        let mut b = EmbeddedOperator::new(
            "n1",
            EmbeddedMode::Kubernetes {
                pod_cidrs: vec!["10.1.2.0/24".parse().unwrap()],
                enable_ipv4: true,
                enable_ipv6: true,
            },
        );
        let e = b.sync(None).unwrap_err().to_string();
        assert!(e.contains("Required IPv6 PodCIDR not available"), "{e}");
    }

    #[test]
    fn journal_of_another_node_is_refused() {
        let mut b = EmbeddedOperator::new(
            "n1",
            EmbeddedMode::Kubernetes {
                pod_cidrs: vec![],
                enable_ipv4: false,
                enable_ipv6: false,
            },
        );
        assert!(
            b.sync(Some(NodeResource::new("other")))
                .unwrap_err()
                .to_string()
                .contains("other")
        );
    }

    #[test]
    fn a_cluster_pool_node_is_not_silently_switched_to_multi_pool() {
        let mut node = NodeResource::new("n1");
        node.spec.ipam.pod_cidrs = vec!["10.0.1.0/24".parse().unwrap()];
        let mut b = EmbeddedOperator::new(
            "n1",
            EmbeddedMode::MultiPool {
                pools: vec![],
                default_pool: "default".into(),
                migrate_cluster_pool: false,
            },
        );
        let e = b.sync(Some(node)).unwrap_err().to_string();
        assert!(
            e.contains("enable-cluster-pool-to-multi-pool-migration"),
            "{e}"
        );
        assert!(e.contains(r#"spec.ipam.podCIDRs = ["10.0.1.0/24"]"#), "{e}");
    }
}
