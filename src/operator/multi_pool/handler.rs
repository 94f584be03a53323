//! Multi-pool's side of the one CiliumNode loop: the block carving
//! ([`PoolBlocks`]) and the sticky addresses' node writes ([`StickyWrites`])
//! as one [`NodeHandler`], so that each CiliumNode has one writer and each node
//! one write: its `spec.ipam.pools.allocated` (carved blocks and sticky blocks
//! together, at the resourceVersion they were planned from), its operator-status
//! error, then its `ipam.podnet.io/sticky-status`. What it sees of the nodes
//! it tells the sticky loop ([`NodeSeen`]), which has no node watch of its own.

use std::collections::BTreeSet;

use futures::channel::mpsc::UnboundedSender;
use serde_json::json;

use super::blocks::{NodeWrite, ObservedNode, PoolBlocks};
use super::sticky::STICKY_STATUS;
use super::sticky_writes::{Decision, NodeSeen, StickyWrites, Take, with_blocks};
use crate::ipam::pooldef::PoolDef;
use crate::operator::metrics::OperatorMetrics;
use crate::operator::node_api::{ApiNodes, NodeApply};
use crate::operator::node_loop::{AfterRefusal, NodeHandler, NodeWriter, Refusal, Written};
use crate::resources::NodeResource;

/// What else than CiliumNodes the multi-pool handler follows.
#[derive(Debug)]
pub enum Input {
    /// The CiliumPodIPPools, read again after a change.
    Pools(Vec<PoolDef>),
    /// The sticky loop's decision (its records already written).
    Sticky(Decision),
}

/// What one node's CiliumNode must be changed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiPoolWrite {
    /// Its blocks (carved and sticky) and operator-status error.
    pub blocks: NodeWrite,
    /// Whether `blocks.allocated` adds sticky blocks.
    pub sticky_blocks: bool,
    /// Its new `ipam.podnet.io/sticky-status` (None inside: removed).
    pub sticky_status: Option<Option<String>>,
}

/// The multi-pool allocator of the node loop.
#[derive(Debug, Default)]
pub struct MultiPool {
    blocks: PoolBlocks,
    sticky: StickyWrites,
    /// Where what the node loop sees of the nodes goes: the sticky loop.
    sticky_hears: Option<UnboundedSender<NodeSeen>>,
}

impl MultiPool {
    /// Starts from the blocks' bookkeeping as it is, with no sticky decision,
    /// telling the sticky loop what it sees of the nodes on `sticky_hears`.
    pub fn new(blocks: PoolBlocks, sticky_hears: UnboundedSender<NodeSeen>) -> MultiPool {
        MultiPool {
            blocks,
            sticky: StickyWrites::default(),
            sticky_hears: Some(sticky_hears),
        }
    }

    /// Tells the sticky loop (once it has ended, nobody listens: the operator
    /// ends with it).
    fn tell_sticky(&self, seen: NodeSeen) {
        if let Some(hears) = &self.sticky_hears {
            let _ = hears.unbounded_send(seen);
        }
    }
}

impl NodeHandler for MultiPool {
    type Node = ObservedNode;
    type Write = MultiPoolWrite;
    type Input = Input;

    /// Logs what is wrong with its blocks. Nodes waiting for room may get the
    /// blocks it gave back.
    fn upsert(&mut self, node: ObservedNode) -> Vec<String> {
        self.tell_sticky(NodeSeen::Upserted {
            sticky: node.sticky,
        });
        let name = node.name.clone();
        for problem in self.blocks.observe(node) {
            tracing::error!(node = %name, "{problem}");
        }
        let mut dirty = self.blocks.waiting();
        dirty.push(name);
        dirty
    }

    fn delete(&mut self, name: &str) -> Vec<String> {
        self.tell_sticky(NodeSeen::Deleted);
        self.blocks.remove(name);
        self.sticky.forget(name);
        self.blocks.waiting()
    }

    fn relisted(&mut self, listed: &BTreeSet<String>, first: bool) -> Vec<String> {
        self.tell_sticky(NodeSeen::Relisted);
        for gone in self
            .blocks
            .node_names()
            .into_iter()
            .filter(|n| !listed.contains(n))
        {
            self.blocks.remove(&gone);
            self.sticky.forget(&gone);
        }
        if first {
            tracing::info!(
                nodes = listed.len(),
                "read every CiliumNode and re-adopted their blocks; allocating"
            );
        }
        self.blocks.node_names()
    }

    fn input(&mut self, input: Input) -> Vec<String> {
        match input {
            Input::Pools(pools) => {
                set_pools(&mut self.blocks, &pools);
                self.blocks.node_names()
            }
            Input::Sticky(decision) => self.sticky.decided(decision),
        }
    }

    fn plan(&mut self, name: &str) -> Option<MultiPoolWrite> {
        let planned = self.blocks.plan(name);
        let Some((unchanged, allocated)) = self.blocks.known(name) else {
            // Not seen yet (its part waits) or gone (its deletion drops it).
            return None;
        };
        let (added, sticky_status) = match self.sticky.take(name, Some(&unchanged.resource_version))
        {
            Take::Nothing => (Vec::new(), None),
            Take::Write { added, status } => (added, status),
        };
        let sticky_blocks = !added.is_empty();
        let allocated = sticky_blocks.then(|| with_blocks(allocated, &added));
        let mut blocks = planned.unwrap_or(unchanged);
        if allocated.is_some() {
            blocks.allocated = allocated;
        }
        let nothing = blocks.allocated.is_none() && blocks.error.is_none();
        if nothing && sticky_status.is_none() {
            return None;
        }
        Some(MultiPoolWrite {
            blocks,
            sticky_blocks,
            sticky_status,
        })
    }

    fn written(&mut self, name: &str, _write: &MultiPoolWrite) -> Vec<String> {
        self.sticky.written(name);
        Vec::new()
    }

    fn refused(&mut self, name: &str, why: Refusal) -> AfterRefusal {
        self.sticky.refused(name, why);
        match why {
            Refusal::Gone => {
                tracing::info!(node = %name, "node gone before its blocks were written");
                self.blocks.remove(name);
                AfterRefusal::LeaveToWatch
            }
            Refusal::Conflict => AfterRefusal::ReadAgain,
        }
    }

    fn failed(&mut self, name: &str) {
        self.sticky.failed(name);
    }

    fn report(&self, metrics: &OperatorMetrics) {
        let blocks = &self.blocks;
        metrics.pools_refused.set(i64::from(blocks.pools_refused()));
        metrics.set_pool_blocks(&blocks.pool_space());
        let waiting = blocks.waiting().len();
        metrics.set_nodes(blocks.node_names().len() - waiting, waiting);
    }
}

impl NodeWriter<MultiPoolWrite> for ApiNodes<'_> {
    /// The blocks (as of the resourceVersion they were planned from), the
    /// error, the sticky status; then the error.
    async fn write(&self, name: &str, write: &MultiPoolWrite) -> Written {
        let blocks = &write.blocks;
        let mut applies = Vec::new();
        if let Some(allocated) = &blocks.allocated {
            let fields = json!({"ipam": {"pools": {"allocated": allocated}}});
            let what = match write.sticky_blocks {
                true => "sticky-allocated",
                false => "pools-allocated",
            };
            applies.push(NodeApply::spec(fields, what).checked_at(&blocks.resource_version));
        }
        if let Some(error) = &blocks.error {
            applies.push(NodeApply::operator_error(error));
        }
        if let Some(status) = &write.sticky_status {
            applies.push(NodeApply::annotation(
                STICKY_STATUS,
                status.as_deref(),
                "sticky-status",
            ));
        }
        self.apply_all(name, &blocks.uid, applies).await
    }

    async fn read(&self, name: &str) -> Result<Option<NodeResource>, kube::Error> {
        self.get(name).await
    }
}

/// Puts `pools` in force unless they break blocks in use.
pub fn set_pools(blocks: &mut PoolBlocks, pools: &[PoolDef]) {
    let names: Vec<&str> = pools.iter().map(|d| d.name.as_str()).collect();
    match blocks.set_pools(pools) {
        Ok(()) => tracing::info!(pools = ?names, "pool definitions in force"),
        Err(why) => tracing::error!(
            pools = ?names,
            "pool definitions refused, the previous ones stay in force: {why}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::AllocatedPool;
    use futures::channel::oneshot;
    use std::collections::BTreeMap;

    use super::super::sticky_writes::{NodePart, Settled};

    fn observed(name: &str, rv: &str) -> ObservedNode {
        ObservedNode {
            name: name.into(),
            uid: format!("uid-{name}"),
            resource_version: rv.into(),
            allocated: vec![AllocatedPool {
                pool: "default".into(),
                cidrs: vec!["10.0.0.0/26".parse().unwrap()],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// Hands `handler` a decision adding block 10.77.0.1/32 to node a at
    /// `rv`, with `status`; returns the decision's nodes and where it settles.
    fn decide(
        handler: &mut MultiPool,
        rv: &str,
        status: Option<Option<String>>,
    ) -> (Vec<String>, oneshot::Receiver<Settled>) {
        let (settled, rx) = oneshot::channel();
        let part = NodePart {
            resource_version: rv.into(),
            added: vec![("web".into(), "10.77.0.1/32".parse().unwrap())],
            status,
        };
        let nodes = BTreeMap::from([("a".to_string(), part)]);
        (
            handler.input(Input::Sticky(Decision { nodes, settled })),
            rx,
        )
    }

    #[test]
    fn a_sticky_block_and_status_join_the_nodes_one_write_at_the_decided_version() {
        let mut handler = MultiPool::default();
        handler.upsert(observed("a", "5"));
        let (dirty, mut rx) = decide(&mut handler, "6", Some(Some("{}".into())));
        assert_eq!(dirty, ["a"]);
        assert_eq!(handler.plan("a"), None, "a is seen at 5: it waits for 6");
        handler.upsert(observed("a", "6"));
        let write = handler.plan("a").unwrap();
        assert_eq!(write.blocks.resource_version, "6");
        assert!(write.sticky_blocks);
        let allocated = write.blocks.allocated.clone().unwrap();
        let pools: Vec<&str> = allocated.iter().map(|a| a.pool.as_str()).collect();
        assert_eq!(pools, ["default", "web"]);
        assert_eq!(write.sticky_status, Some(Some("{}".to_string())));
        assert_eq!(rx.try_recv().unwrap(), None);
        handler.written("a", &write);
        assert_eq!(rx.try_recv().unwrap(), Some(Default::default()));
    }

    #[test]
    fn the_sticky_loop_hears_every_node_change_and_which_are_sticky() {
        let (hears, mut heard) = futures::channel::mpsc::unbounded();
        let mut handler = MultiPool::new(PoolBlocks::default(), hears);
        handler.upsert(observed("a", "5"));
        let mut asking = observed("b", "6");
        asking.sticky = true;
        handler.upsert(asking);
        handler.delete("a");
        handler.relisted(&BTreeSet::from(["b".to_string()]), false);
        let told: Vec<NodeSeen> = std::iter::from_fn(|| heard.try_recv().ok()).collect();
        assert_eq!(
            told,
            [
                NodeSeen::Upserted { sticky: false },
                NodeSeen::Upserted { sticky: true },
                NodeSeen::Deleted,
                NodeSeen::Relisted,
            ]
        );
    }

    #[test]
    fn a_conflict_drops_the_sticky_part_and_the_carving_reads_again() {
        let mut handler = MultiPool::default();
        handler.upsert(observed("a", "5"));
        let (_, mut rx) = decide(&mut handler, "5", None);
        assert!(handler.plan("a").is_some());
        let after = handler.refused("a", Refusal::Conflict);
        assert_eq!(after, AfterRefusal::ReadAgain);
        assert!(rx.try_recv().unwrap().unwrap().conflict);
        assert_eq!(handler.plan("a"), None, "the part is gone");
    }
}
