//! Cluster-pool: the leader gives every CiliumNode one CIDR per enabled family
//! of the cluster pool, and extra ones to a node whose agent says it is
//! depleted ([`extra`]). The cluster pool is read again while it runs
//! ([`reload`]): new pool CIDRs are used at once, removed ones drain ([`drain`]). [`NodeCidrs`] is the bookkeeping (no I/O); here is its
//! side of the node loop ([`node_loop`](super::node_loop): the watch, the
//! batching, the retries) and its writes, with the Events about extra CIDRs on
//! the CiliumNode.
//!
//! Writes are server-side applies under the field manager
//! [`FIELD_MANAGER`](super::FIELD_MANAGER) that carry only the operator's
//! fields: `spec.ipam.podCIDRs`, and `status.ipam.operator-status` through the
//! status subresource. The agent's fields (`spec.addresses`, the owner
//! reference, ...) are never sent, so they are never touched. Each write carries
//! the node's UID, so it cannot re-create a node that was deleted meanwhile (the
//! API server answers 409): a node gone or replaced is left to the watch, which
//! brings its deletion (and the new object).
//!
//! The podCIDRs apply also carries the newest resourceVersion seen of the node
//! (an optimistic-concurrency precondition), so it never lands on an object
//! that changed since the write was planned (the agent's verdicts, a late
//! duplicate of an earlier request after a timeout). Its 409 is left to the
//! watch too: what changed is newer than anything seen, so its event comes and
//! the node is planned again from it. Reading the node again at once would
//! take a replaced node's new object before the watch brings the old one's
//! deletion, which frees the CIDRs by name, under the new object's feet. A
//! CIDR a node's write takes off is freed only once that write went through
//! ([`NodeCidrs`]' rule).

mod cidr_event;
mod cidrs;
pub mod drain;
pub mod extra;
pub mod reload;

pub use cidrs::NodeCidrs;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::PatchParams;
use kube::runtime::events::Recorder;
use kube::runtime::watcher;
use serde_json::json;

use super::FIELD_MANAGER;
use super::metrics::OperatorMetrics;
use super::node_api::{ApiNodes, NodeApply};
use super::node_loop::{self, AfterRefusal, NodeHandler, NodeWriter, Refusal, Written};
use crate::ipam::clusterpool::ClusterPoolConfig;
use crate::k8s::events;
use crate::k8s::mirror::WatchEnded;
use crate::k8s::objects::watch_nodes;
use crate::resources::NodeResource;
use cidr_event::CidrEvent;
use cidrs::{Observed, Pending};
use reload::PoolRead;

impl NodeHandler for NodeCidrs {
    type Node = Observed;
    type Write = Pending;
    type Input = PoolRead;

    fn upsert(&mut self, node: Observed) -> Vec<String> {
        self.observe(node)
    }

    fn delete(&mut self, name: &str) -> Vec<String> {
        self.remove(name)
    }

    fn relisted(&mut self, listed: &BTreeSet<String>, first: bool) -> Vec<String> {
        let touched = self.list_done(listed);
        let (allocated, waiting) = self.counts();
        if first {
            tracing::info!(
                nodes = listed.len(),
                holding_cidrs = allocated,
                with_errors = waiting,
                "read every CiliumNode and re-adopted their CIDRs; allocating"
            );
        } else {
            tracing::info!(nodes = listed.len(), "CiliumNodes listed again");
        }
        touched
    }

    fn input(&mut self, read: PoolRead) -> Vec<String> {
        self.read(read)
    }

    fn plan(&mut self, name: &str) -> Option<Pending> {
        self.pending(name)
    }

    fn written(&mut self, name: &str, write: &Pending) -> Vec<String> {
        NodeCidrs::written(self, name, write)
    }

    fn refused(&mut self, name: &str, why: Refusal) -> AfterRefusal {
        tracing::info!(node = %name, refusal = ?why, "node gone or replaced before its CIDRs were written");
        AfterRefusal::LeaveToWatch
    }

    fn report(&self, metrics: &OperatorMetrics) {
        let (allocated, waiting) = self.counts();
        metrics.set_nodes(allocated, waiting);
        metrics.pools_refused.set(i64::from(self.pool_refused()));
    }
}

/// The CiliumNodes' writer: the applies, and the Events on them.
struct CidrWriter<'a> {
    nodes: ApiNodes<'a>,
    events: Recorder,
}

impl NodeWriter<Pending> for CidrWriter<'_> {
    /// Its podCIDRs, then its operator-status error, then its Events (an Event
    /// that cannot be posted is logged, and the write stands).
    async fn write(&self, name: &str, pending: &Pending) -> Written {
        let mut applies = Vec::new();
        if let Some(list) = &pending.pod_cidrs {
            let fields = json!({"ipam": {"podCIDRs": list}});
            let mut apply = NodeApply::spec(fields, "pod-cidrs");
            if !pending.resource_version.is_empty() {
                apply = apply.checked_at(&pending.resource_version);
            }
            applies.push(apply);
        }
        if let Some(error) = &pending.status_error {
            applies.push(NodeApply::operator_error(error));
        }
        let written = self.nodes.apply_all(name, &pending.uid, applies).await;
        if written.outcome.is_ok() {
            for event in &pending.events {
                self.post(name, &pending.uid, event).await;
            }
        }
        written
    }

    async fn read(&self, name: &str) -> Result<Option<NodeResource>, kube::Error> {
        self.nodes.get(name).await
    }
}

impl CidrWriter<'_> {
    async fn post(&self, name: &str, uid: &str, event: &CidrEvent) {
        let regarding = ObjectReference {
            api_version: Some("cilium.io/v2".into()),
            kind: Some("CiliumNode".into()),
            name: Some(name.into()),
            uid: Some(uid.into()).filter(|u: &String| !u.is_empty()),
            ..Default::default()
        };
        let posted = event.to_event();
        if let Err(e) = self.events.publish(&posted, &regarding).await {
            tracing::warn!(error = %e, node = %name, reason = event.reason, "publishing the Event failed");
        }
    }
}

/// Runs until the watch ends (it does not while the API server can be retried).
/// `args` is the operator's command line, `pool` the cluster pool it started
/// with: the pool is read again from them ([`reload`]).
pub async fn run(
    client: kube::Client,
    mut cidrs: NodeCidrs,
    (args, pool): (Vec<String>, ClusterPoolConfig),
    identity: &str,
    metrics: &OperatorMetrics,
) -> WatchEnded {
    let nodes = ApiNodes::resolve(&client, PatchParams::apply(FIELD_MANAGER), metrics).await;
    let api = nodes.api();
    let writer = CidrWriter {
        nodes,
        events: events::recorder(client.clone(), FIELD_MANAGER, identity),
    };
    let nodes = watch_nodes(api, watcher::Config::default());
    let pools = reload::pool_changes(args, pool);
    node_loop::run(&mut cidrs, &writer, nodes, pools, metrics).await
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::{BTreeMap, VecDeque};
    use std::time::Duration;

    use futures::{StreamExt, stream};
    use ipnet::IpNet;
    use kube::runtime::watcher::Event;

    use super::*;
    use crate::controller::Backoff;
    use crate::ipam::Family;
    use crate::ipam::clusterpool::{NodeCidrCarver, parse_pool_list};
    use crate::operator::node_loop::WriteError;
    use crate::resources::{PodCidrState, PodCidrStatus};

    /// The API server in memory: the CiliumNodes, the failures to answer next
    /// per node, and every podCIDRs write tried (node, resourceVersion).
    #[derive(Default)]
    struct Memory {
        nodes: RefCell<BTreeMap<String, NodeResource>>,
        failures: RefCell<BTreeMap<String, VecDeque<WriteError>>>,
        tried: RefCell<Vec<(String, String)>>,
        /// A CIDR on two nodes at once, when it ever was.
        twice: RefCell<Option<IpNet>>,
    }

    impl Memory {
        fn put(&self, node: NodeResource) {
            let name = node.metadata.name.clone();
            self.nodes.borrow_mut().insert(name, node);
        }

        /// The next write of `name` fails (the API server is down).
        fn fail_once(&self, name: &str) {
            let down = WriteError::Failed {
                node: name.into(),
                source: kube::Error::Service("the API server is down".into()),
            };
            let mut failures = self.failures.borrow_mut();
            failures.insert(name.into(), VecDeque::from([down]));
        }

        fn cidrs(&self, name: &str) -> Vec<IpNet> {
            self.nodes.borrow()[name].spec.ipam.pod_cidrs.clone()
        }

        fn check_twice(&self) {
            let mut seen = BTreeSet::new();
            for node in self.nodes.borrow().values() {
                for c in &node.spec.ipam.pod_cidrs {
                    if !seen.insert(*c) {
                        *self.twice.borrow_mut() = Some(*c);
                    }
                }
            }
        }
    }

    /// A write bumps the resourceVersion; the podCIDRs apply is refused
    /// (409) when it carries another one.
    impl NodeWriter<Pending> for Memory {
        async fn write(&self, name: &str, write: &Pending) -> Written {
            tokio::task::yield_now().await;
            if write.pod_cidrs.is_some() {
                let rv = write.resource_version.clone();
                self.tried.borrow_mut().push((name.to_string(), rv));
            }
            let failure = self
                .failures
                .borrow_mut()
                .get_mut(name)
                .and_then(VecDeque::pop_front);
            if let Some(e) = failure {
                return Written::default().failed(e);
            }
            let mut nodes = self.nodes.borrow_mut();
            let Some(node) = nodes.get_mut(name) else {
                return Written::default().failed(WriteError::Refused(Refusal::Gone));
            };
            let rv: u64 = node
                .metadata
                .resource_version
                .as_deref()
                .map_or(0, |v| v.parse().unwrap());
            if let Some(list) = &write.pod_cidrs {
                if write.resource_version != rv.to_string() {
                    return Written::default().failed(WriteError::Refused(Refusal::Conflict));
                }
                node.spec.ipam.pod_cidrs = list.clone();
            }
            if let Some(error) = &write.status_error {
                node.status.ipam.operator_status.error = error.clone();
            }
            node.metadata.resource_version = Some((rv + 1).to_string());
            let answer = node.clone();
            drop(nodes);
            self.check_twice();
            Written {
                objects: vec![answer],
                outcome: Ok(()),
            }
        }

        async fn read(&self, name: &str) -> Result<Option<NodeResource>, kube::Error> {
            Ok(self.nodes.borrow().get(name).cloned())
        }
    }

    fn cilium_node(
        name: &str,
        rv: u64,
        cidrs: &[&str],
        status: &[(&str, PodCidrState)],
    ) -> NodeResource {
        let mut n = NodeResource::new(name);
        n.metadata.resource_version = Some(rv.to_string());
        n.spec.ipam.pod_cidrs = cidrs.iter().map(|c| c.parse().unwrap()).collect();
        n.status.ipam.pod_cidrs = status
            .iter()
            .map(|(c, s)| (c.to_string(), PodCidrStatus { status: *s }))
            .collect();
        n
    }

    fn cidrs_of(pool: &str) -> NodeCidrs {
        let mut config = ClusterPoolConfig::default();
        let entries = parse_pool_list("cluster-pool-ipv4-cidr", pool).unwrap();
        config.set_pool(Family::V4, &entries);
        NodeCidrs::new(NodeCidrCarver::new(&config).unwrap(), 2)
    }

    /// The loop over `events` (then a watch that stays open) for `time`, on
    /// paused time.
    async fn run_for(
        cidrs: &mut NodeCidrs,
        memory: &Memory,
        events: Vec<Result<Event<NodeResource>, watcher::Error>>,
        later: Option<NodeResource>,
        time: Duration,
    ) {
        let later = stream::iter(later).then(|node| async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(Event::Apply(node))
        });
        let nodes = stream::iter(events).chain(later).chain(stream::pending());
        let metrics = OperatorMetrics::new();
        let running = node_loop::run(cidrs, memory, nodes.boxed(), stream::pending(), &metrics);
        let _ = tokio::time::timeout(time, running).await;
    }

    fn listed(nodes: &[NodeResource]) -> Vec<Result<Event<NodeResource>, watcher::Error>> {
        let mut events = vec![Ok(Event::Init)];
        events.extend(nodes.iter().map(|n| Ok(Event::InitApply(n.clone()))));
        events.push(Ok(Event::InitDone));
        events
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    /// Issue 53.4: a waits with a released extra CIDR whose removal fails
    /// once; b waits for room. b gets it once a's retried write went through,
    /// never while a's CiliumNode may list it.
    #[tokio::test(start_paused = true)]
    async fn a_released_cidr_is_never_on_two_cilium_nodes() {
        use PodCidrState::{InUse, Released};
        let both = ["10.0.0.0/24", "10.0.1.0/24"];
        let a = cilium_node("a", 1, &both, &[(both[0], InUse), (both[1], Released)]);
        let b = cilium_node("b", 1, &[], &[]);
        let memory = Memory::default();
        memory.put(a.clone());
        memory.put(b.clone());
        memory.fail_once("a");
        let mut cidrs = cidrs_of("10.0.0.0/23");
        run_for(
            &mut cidrs,
            &memory,
            listed(&[a.clone(), b.clone()]),
            None,
            Backoff::API.first / 2,
        )
        .await;
        assert_eq!(memory.cidrs("a"), nets(&both), "its write failed");
        assert_eq!(memory.cidrs("b"), [], "b still waits");
        assert_eq!(*memory.twice.borrow(), None);

        let mut cidrs = cidrs_of("10.0.0.0/23");
        memory.put(a.clone());
        memory.put(b.clone());
        memory.fail_once("a");
        run_for(
            &mut cidrs,
            &memory,
            listed(&[a, b]),
            None,
            Backoff::API.first * 4,
        )
        .await;
        assert_eq!(memory.cidrs("a"), nets(&both[..1]));
        assert_eq!(
            memory.cidrs("b"),
            nets(&both[1..]),
            "given in the retry's pass"
        );
        assert_eq!(*memory.twice.borrow(), None);
    }

    /// The podCIDRs apply carries the resourceVersion it was planned from: the
    /// agent changed the node since, so it is refused, and the watch brings
    /// the newer object, planned and written again.
    #[tokio::test(start_paused = true)]
    async fn a_podcidrs_write_planned_from_an_older_object_is_refused_and_planned_again() {
        let seen = cilium_node("c", 4, &[], &[]);
        let now = cilium_node("c", 5, &[], &[]);
        let memory = Memory::default();
        memory.put(now.clone());
        let mut cidrs = cidrs_of("10.0.0.0/23");
        run_for(
            &mut cidrs,
            &memory,
            listed(&[seen]),
            Some(now),
            Duration::from_secs(5),
        )
        .await;
        let tried = memory.tried.borrow().clone();
        assert_eq!(
            tried,
            [
                ("c".to_string(), "4".to_string()),
                ("c".to_string(), "5".to_string())
            ]
        );
        assert_eq!(memory.cidrs("c"), nets(&["10.0.0.0/24"]));
    }
}
