//! The cluster's nodes as routing sees them ([`ClusterNode`]), kept from one
//! batch of the watch to the next: a node the watch did not change is the very
//! same shared resource, so it keeps the `ClusterNode` built from it and a batch
//! builds only the changed nodes' (at 5,000 nodes, building all of them again
//! was a batch's largest cost after the kernel dumps).

use std::collections::HashMap;
use std::sync::Arc;

use super::plan::ClusterNode;
use crate::resources::NodeResource;

/// The last list of nodes and what routing took from each, in its order.
#[derive(Default)]
pub struct RoutingNodes {
    /// Held, so that no other node's resource can take the address of one that
    /// is cached while it is.
    resources: Vec<Arc<NodeResource>>,
    nodes: Vec<ClusterNode>,
}

impl RoutingNodes {
    /// Takes the watch's new list: an unchanged resource (the same `Arc`) keeps
    /// its `ClusterNode`, any other is built from its resource.
    pub fn update(&mut self, list: &[Arc<NodeResource>]) {
        let position: HashMap<*const NodeResource, usize> = self
            .resources
            .iter()
            .enumerate()
            .map(|(i, r)| (Arc::as_ptr(r), i))
            .collect();
        let mut kept: Vec<Option<ClusterNode>> = std::mem::take(&mut self.nodes)
            .into_iter()
            .map(Some)
            .collect();
        self.nodes = list
            .iter()
            .map(|r| {
                position
                    .get(&Arc::as_ptr(r))
                    .and_then(|&i| kept[i].take())
                    .unwrap_or_else(|| ClusterNode::from_resource(r))
            })
            .collect();
        self.resources = list.to_vec();
    }

    /// The nodes of the last list, in its order.
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cidr: &str) -> Arc<NodeResource> {
        let mut n = NodeResource::new(name);
        n.spec.ipam.pod_cidrs = vec![cidr.parse().unwrap()];
        Arc::new(n)
    }

    fn cidrs(routing: &RoutingNodes) -> Vec<(String, String)> {
        routing
            .nodes()
            .iter()
            .map(|n| (n.name.clone(), n.cidrs[0].1.to_string()))
            .collect()
    }

    #[test]
    fn an_unchanged_node_keeps_what_was_built_and_a_changed_one_is_built_again() {
        let (a, b) = (node("a", "10.0.1.0/24"), node("b", "10.0.2.0/24"));
        let mut routing = RoutingNodes::default();
        routing.update(&[a.clone(), b.clone()]);
        assert_eq!(
            cidrs(&routing),
            [
                ("a".into(), "10.0.1.0/24".into()),
                ("b".into(), "10.0.2.0/24".into())
            ]
        );
        // Kept means not built again: a ClusterNode changed behind the cache's
        // back stays as it is while its resource is the same Arc.
        routing.nodes[1].name = "b, as built".into();
        let a2 = node("a", "10.0.9.0/24");
        let c = node("c", "10.0.3.0/24");
        routing.update(&[a2, b.clone(), c]);
        assert_eq!(
            cidrs(&routing),
            [
                ("a".into(), "10.0.9.0/24".into()),
                ("b, as built".into(), "10.0.2.0/24".into()),
                ("c".into(), "10.0.3.0/24".into())
            ]
        );
        // A relist brings new resources for every node: each is built again.
        routing.update(&[node("b", "10.0.2.0/24")]);
        assert_eq!(cidrs(&routing), [("b".into(), "10.0.2.0/24".into())]);
        routing.update(&[]);
        assert!(routing.nodes().is_empty());
    }
}
