//! The embedded backend: the node resource lives in the daemon's own journal, and an
//! embedded operator plays the cluster operator's part for this one node. In
//! cluster-pool mode it carves the node CIDRs out of the cluster pool (re-adopting
//! the ones the node already owns); in kubernetes mode it takes the node's podCIDRs
//! as given (the analog of `Node.spec.podCIDRs`).

use ipnet::IpNet;

use super::{NodeBackend, NodeResource};
use crate::ipam::clusterpool::{ClusterPoolConfig, NodeCidrCarver};

/// What decides the node's CIDRs.
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
}

/// The embedded backend for one node.
pub struct EmbeddedBackend {
    node_name: String,
    mode: EmbeddedMode,
}

impl EmbeddedBackend {
    pub fn new(node_name: &str, mode: EmbeddedMode) -> EmbeddedBackend {
        EmbeddedBackend {
            node_name: node_name.to_string(),
            mode,
        }
    }
}

impl NodeBackend for EmbeddedBackend {
    fn sync(&mut self, current: Option<NodeResource>) -> Result<NodeResource, String> {
        let mut node = match current {
            Some(n) if n.metadata.name == self.node_name => n,
            Some(n) => {
                return Err(format!(
                    "the journal belongs to node {:?}, not {:?}; use the node's own --state-dir or move the journal aside",
                    n.metadata.name, self.node_name
                ));
            }
            None => NodeResource::new(&self.node_name),
        };
        let cidrs = match &self.mode {
            EmbeddedMode::ClusterPool(cfg) => {
                let existing: Vec<IpNet> = node
                    .spec
                    .ipam
                    .pod_cidrs
                    .iter()
                    .filter_map(|c| c.parse().ok())
                    .collect();
                let mut carver = NodeCidrCarver::new(cfg).map_err(|e| e.to_string())?;
                match carver.carve_for_node(&existing) {
                    Ok(c) => c,
                    Err(e) => {
                        node.status.ipam.operator_status.error = e.to_string();
                        return Err(format!("node {}: {e}", self.node_name));
                    }
                }
            }
            EmbeddedMode::Kubernetes {
                pod_cidrs,
                enable_ipv4,
                enable_ipv6,
            } => kubernetes_cidrs(pod_cidrs, *enable_ipv4, *enable_ipv6)?,
        };
        node.spec.ipam.pod_cidrs = cidrs.iter().map(|c| c.to_string()).collect();
        node.status.ipam.operator_status.error.clear();
        Ok(node)
    }
}

/// Kubernetes mode: the first CIDR of each enabled family is the node's; a missing
/// one is the agent's "required PodCIDR not available" failure.
fn kubernetes_cidrs(pod_cidrs: &[IpNet], v4: bool, v6: bool) -> Result<Vec<IpNet>, String> {
    let mut out = Vec::new();
    for (enabled, is_v4, name) in [(v4, true, "IPv4"), (v6, false, "IPv6")] {
        let found = pod_cidrs
            .iter()
            .find(|c| matches!(c, IpNet::V4(_)) == is_v4);
        match (enabled, found) {
            (true, Some(c)) => out.push(c.trunc()),
            (true, None) => {
                return Err(format!(
                    "Required {name} PodCIDR not available: ipam=kubernetes needs the node's {name} pod CIDR (--pod-cidrs, or --{}-range)",
                    name.to_lowercase()
                ));
            }
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
        let mut b = EmbeddedBackend::new(
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
        assert_eq!(n.spec.ipam.pod_cidrs, vec!["10.1.2.0/24", "fd00:1::/120"]);
    }

    #[test]
    fn kubernetes_mode_needs_a_cidr_per_enabled_family() {
        let mut b = EmbeddedBackend::new(
            "n1",
            EmbeddedMode::Kubernetes {
                pod_cidrs: vec!["10.1.2.0/24".parse().unwrap()],
                enable_ipv4: true,
                enable_ipv6: true,
            },
        );
        let e = b.sync(None).unwrap_err();
        assert!(e.contains("Required IPv6 PodCIDR not available"), "{e}");
    }

    #[test]
    fn journal_of_another_node_is_refused() {
        let mut b = EmbeddedBackend::new(
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
                .contains("other")
        );
    }
}
