//! The leader's sticky-address loop (I/O around the rules of [`sticky`](super::sticky)),
//! a controller of the kit (`controller::run`) next to the multi-pool node
//! loop. It has no CiliumNode watch of its own: the node loop tells it what
//! it sees of the nodes ([`NodeSeen`]). After a change that may matter (a
//! CiliumPodIPPool changed; a CiliumNode that asks or is answered changed; any
//! CiliumNode changed or went away while an address is moving or a record
//! waits for its block to be given back; a StatefulSet was deleted or its
//! replicas, ordinals or PVC retention policy changed; a pool's retry is due:
//! [`Controller::wake_at`]), it lists every CiliumPodIPPool, CiliumNode and
//! StatefulSet afresh (a consistent read, never a cache that may lag behind
//! its own writes), decides, and writes in this order:
//!
//! 1. each pool's new `ipam.podnet.io/sticky-owners` record (with its
//!    `ipam.podnet.io/sticky-release-on-delete` notes), as a merge patch carrying
//!    the pool's resourceVersion, each pool on its own ([`decide_and_record`]):
//!    a pool whose write fails is held back (its new identities wait unanswered)
//!    and tried again after its own backoff, the other pools go on; a 409 reads
//!    everything again at once, up to [`CONFLICTS_IN_A_ROW`] times, then after
//!    the backoff;
//! 2. each node's `spec.ipam.pools.allocated` with the new /32 (/128) block,
//!    and then its `ipam.podnet.io/sticky-status` whose answer changed: handed
//!    to the one node loop as a [`Decision`], written by its writer in the
//!    node's one write (a forced server-side apply of `allocated` under the
//!    operator's field manager with the node's UID and the resourceVersion it
//!    was read at, then the status), after which the node loop says how it went
//!    ([`Settled`]; a node changed since it was read: everything is read again).
//!
//! A block is added to a node only when the list just read shows no node
//! listing it: as the operator is the only one that adds blocks, and it writes
//! one decision at a time (the next pass reads only once the node loop settled
//! the last one), a block is never on two nodes. StatefulSets that
//! cannot be listed (e.g. RBAC without `statefulsets`) release nothing; the
//! rest goes on, with a warning.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::channel::{mpsc, oneshot};
use futures::{SinkExt, StreamExt};
use ipnet::IpNet;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::time::Instant;

use super::sticky::{
    NodeView, Plan, PoolRecord, PoolView, STICKY_OWNERS, STICKY_RELEASE_ON_DELETE, STICKY_REQUESTS,
    STICKY_STATUS, decide,
};
use super::sticky_lifecycle::{StatefulSetView, StatefulSets};
use super::sticky_writes::{Decision, NodePart, NodeSeen, Settled};
use crate::controller::{self, Backoff, Controller, Timing, WatchItem, ending};
use crate::ipam::pooldef::PoolDef;
use crate::k8s::mirror::{WatchEnded, projected};
use crate::k8s::objects::{ListError, list_pages, list_valid, node_resource};
use crate::operator::FIELD_MANAGER;
use crate::operator::node_api::ApiNodes;
use crate::operator::node_loop::{CONFLICTS_IN_A_ROW, ignored};
use crate::operator::retry::WriteRetries;
use crate::resources::{CiliumPodIPPool, NodeResource, POD_IP_POOL_KIND};

/// How one pass did not go through (it is tried again after a backoff).
#[derive(Debug, thiserror::Error)]
enum PassError {
    #[error(transparent)]
    List(#[from] ListError),
    #[error("adding sticky blocks or answers to CiliumNodes {0:?} failed")]
    Nodes(Vec<String>),
    #[error("the node loop ended")]
    NodeLoopEnded,
    #[error("pools or nodes changed meanwhile {CONFLICTS_IN_A_ROW} times in a row")]
    Conflicts,
}

/// One pool's record write that failed (that pool is tried again after its backoff).
#[derive(Debug, thiserror::Error)]
#[error("writing annotation {STICKY_OWNERS} of CiliumPodIPPool {pool:?}: {source}")]
struct RecordError {
    pool: String,
    #[source]
    source: kube::Error,
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_conflict())
}

/// A pool as read: its view and the resourceVersion its record is written at.
#[derive(Debug, Clone)]
struct ReadPool {
    view: PoolView,
    resource_version: String,
}

/// A node as read.
struct ReadNode {
    /// Annotated `ipam.cilium.io/ignore: "true"`.
    ignored: bool,
    view: NodeView,
    resource_version: String,
    /// Its `ipam.podnet.io/sticky-status` as the API server has it.
    status: Option<String>,
}

fn read_pool(pool: &CiliumPodIPPool) -> Result<ReadPool, String> {
    let def = PoolDef::try_from(pool).map_err(|e| e.to_string());
    let view = PoolView::new(&pool.metadata.name, def, &pool.metadata.annotations);
    if let (true, Err(why)) = (view.sticky, &view.release_on_delete) {
        tracing::warn!(pool = %view.name, "{why}; no StatefulSet of the pool is released on delete");
    }
    Ok(ReadPool {
        view,
        resource_version: pool.metadata.resource_version.clone().unwrap_or_default(),
    })
}

/// A node annotated `ipam.cilium.io/ignore: "true"` is left alone: its blocks
/// still count as held, its requests are not read and its status not written.
fn read_node(node: &NodeResource) -> ReadNode {
    let annotations = &node.metadata.annotations;
    let ignored = ignored(annotations);
    ReadNode {
        ignored,
        view: NodeView {
            name: node.metadata.name.clone(),
            requests: annotations
                .get(STICKY_REQUESTS)
                .filter(|_| !ignored)
                .cloned(),
            allocated: node.spec.ipam.pools.allocated.clone(),
        },
        resource_version: node.metadata.resource_version.clone().unwrap_or_default(),
        status: annotations.get(STICKY_STATUS).cloned(),
    }
}

/// Whether what the node loop saw of a node may change a sticky answer
/// (`watch_all`: an address is moving or a record waits for its block: any
/// change may do).
fn concerns_sticky(seen: NodeSeen, watch_all: bool) -> bool {
    match seen {
        NodeSeen::Upserted { sticky } => watch_all || sticky,
        NodeSeen::Deleted | NodeSeen::Relisted => true,
    }
}

/// Whether a CiliumPodIPPool watch item may change a sticky answer: a pool
/// changed or went away, or all were listed.
fn pool_changed(item: &Result<Event<DynamicObject>, watcher::Error>) -> bool {
    matches!(
        item,
        Ok(Event::Apply(_) | Event::Delete(_) | Event::InitDone)
    )
}

/// Whether a StatefulSet event may release a record: it was deleted, or its
/// replicas, ordinals or retention policy changed since `seen` (what the watch
/// showed last, kept up to date here).
fn set_changed(
    event: Event<StatefulSetView>,
    seen: &mut BTreeMap<String, StatefulSetView>,
) -> bool {
    match event {
        Event::Init => false,
        Event::InitApply(view) => {
            seen.insert(view.key.clone(), view);
            false
        }
        Event::InitDone => true,
        Event::Apply(view) => seen.insert(view.key.clone(), view.clone()) != Some(view),
        Event::Delete(view) => {
            seen.remove(&view.key);
            true
        }
    }
}

/// Writes one pool's record.
trait RecordWriter {
    /// A merge patch of `pool`'s record annotations carrying `resource_version`.
    async fn write(
        &self,
        pool: &str,
        resource_version: &str,
        record: &PoolRecord,
    ) -> Result<(), kube::Error>;
}

/// The merge patch writing `record` at `resource_version` (a note list that
/// became empty removes its annotation).
fn record_patch(resource_version: &str, record: &PoolRecord) -> serde_json::Value {
    // Maps of strings and addresses always serialize.
    let owners = serde_json::to_string(&record.owners).unwrap_or_default();
    let mut annotations = json!({ STICKY_OWNERS: owners });
    if let Some(notes) = &record.release_on_delete {
        annotations[STICKY_RELEASE_ON_DELETE] = match notes.is_empty() {
            true => serde_json::Value::Null,
            false => serde_json::to_string(notes).unwrap_or_default().into(),
        };
    }
    json!({"metadata": {"resourceVersion": resource_version, "annotations": annotations}})
}

/// The API server as [`RecordWriter`].
struct KubeRecords {
    api: Api<DynamicObject>,
    params: PatchParams,
}

impl RecordWriter for KubeRecords {
    async fn write(
        &self,
        pool: &str,
        resource_version: &str,
        record: &PoolRecord,
    ) -> Result<(), kube::Error> {
        let body = record_patch(resource_version, record);
        self.api
            .patch(pool, &self.params, &Patch::Merge(&body))
            .await
            .map(|_| ())
    }
}

/// Decides, then writes each pool's record on its own. A pool waiting for its
/// retry is held back; a pool whose write fails is held back and waits its own
/// backoff (in `retries`), and the plan is decided again without its new
/// identities, so the other pools' blocks and answers go on. Returns the plan
/// whose blocks and answers are to be written, and whether a record changed
/// since it was read (409: read again at once).
async fn decide_and_record(
    writer: &impl RecordWriter,
    pools: &mut [ReadPool],
    nodes: &[NodeView],
    sets: Option<&StatefulSets>,
    retries: &mut WriteRetries,
) -> (Plan, bool) {
    let now = Instant::now();
    retries.keep(|name| pools.iter().any(|p| p.view.name == name));
    for pool in pools.iter_mut() {
        pool.view.held_back = retries.waits(&pool.view.name, now);
    }
    let views = |pools: &[ReadPool]| pools.iter().map(|p| p.view.clone()).collect::<Vec<_>>();
    let plan = decide(&views(pools), nodes, sets);
    let (mut failed, mut conflict) = (false, false);
    for pool in pools.iter_mut() {
        let name = pool.view.name.clone();
        let Some(record) = plan.records.get(&name) else {
            if !pool.view.held_back {
                // Nothing (more) to write.
                retries.succeeded(&name);
            }
            continue;
        };
        match writer.write(&name, &pool.resource_version, record).await {
            Ok(()) => {
                retries.succeeded(&name);
                let released = plan.released.get(&name).map(BTreeMap::len).unwrap_or(0);
                tracing::info!(pool = %name, owners = record.owners.len(), released, "sticky-address record written");
                for (identity, why) in plan.released.get(&name).into_iter().flatten() {
                    tracing::info!(pool = %name, %identity, "sticky address released: {why}");
                }
                pool.view.owners = Ok(record.owners.clone());
                if let Some(notes) = &record.release_on_delete {
                    pool.view.release_on_delete = Ok(notes.clone());
                }
            }
            Err(source) => {
                failed = true;
                pool.view.held_back = true;
                let e = RecordError { pool: name, source };
                if is_conflict(&e.source) {
                    conflict = true;
                    tracing::debug!(error = %e, "sticky addresses: pool changed meanwhile; reading again");
                } else {
                    let wait = retries.failed(&e.pool);
                    tracing::warn!(error = %e, retry_in = ?wait, "sticky addresses: the pool waits; the other pools go on");
                }
            }
        }
    }
    if !failed {
        return (plan, conflict);
    }
    (decide(&views(pools), nodes, sets), conflict)
}

/// Every StatefulSet, or None (with a warning) when they cannot be listed.
async fn list_statefulsets(client: &kube::Client) -> Option<StatefulSets> {
    let api: Api<StatefulSet> = Api::all(client.clone());
    let listed = list_pages(&api, ListParams::default(), "StatefulSet", "apps/v1", |s| {
        Some(StatefulSetView::from(s))
    })
    .await;
    match listed {
        Ok(sets) => Some(StatefulSets::new(sets)),
        Err(e) => {
            tracing::warn!(error = %e, "sticky addresses: no record is released this pass");
            None
        }
    }
}

/// What a pass did.
struct Passed {
    /// An address is moving or a record waits for its block: every node
    /// change is looked at.
    watch_all: bool,
    /// A pool's record or a node changed since it was read: read again at once.
    conflict: bool,
}

/// The nodes' part of `plan` (`read`: the nodes as listed): the blocks each
/// node gets, at the resourceVersion it was read at, and each answer that
/// changed (an ignored node is not answered).
fn node_parts(plan: &Plan, read: &[ReadNode]) -> BTreeMap<String, NodePart> {
    let mut parts = BTreeMap::new();
    for node in read {
        let name = &node.view.name;
        let listed: Vec<(&str, &IpNet)> = node
            .view
            .allocated
            .iter()
            .flat_map(|a| a.cidrs.iter().map(move |c| (a.pool.as_str(), c)))
            .collect();
        let added: Vec<(String, IpNet)> = plan
            .assign
            .get(name)
            .into_iter()
            .flatten()
            .flat_map(|a| a.cidrs.iter().map(move |c| (a.pool.clone(), *c)))
            .filter(|(pool, c)| !listed.contains(&(pool.as_str(), c)))
            .collect();
        let status = plan
            .status
            .get(name)
            .filter(|_| !node.ignored)
            // Maps of strings always serialize.
            .map(|a| (!a.is_empty()).then(|| serde_json::to_string(a).unwrap_or_default()))
            .filter(|new| *new != node.status);
        if added.is_empty() && status.is_none() {
            continue;
        }
        let part = NodePart {
            resource_version: node.resource_version.clone(),
            added,
            status,
        };
        parts.insert(name.clone(), part);
    }
    parts
}

/// Hands the nodes' part of a decision to the node loop and waits until it is
/// written (or refused, or failed).
async fn write_nodes(
    decisions: &mut mpsc::Sender<Decision>,
    nodes: BTreeMap<String, NodePart>,
) -> Result<Settled, PassError> {
    let (settled, outcome) = oneshot::channel();
    let decision = Decision { nodes, settled };
    decisions
        .send(decision)
        .await
        .map_err(|_| PassError::NodeLoopEnded)?;
    outcome.await.map_err(|_| PassError::NodeLoopEnded)
}

/// One pass: reads everything, decides, writes the records, then has the node
/// loop write the nodes.
async fn pass(
    client: &kube::Client,
    pool_resource: &ApiResource,
    nodes: &ApiNodes<'_>,
    retries: &mut WriteRetries,
    decisions: &mut mpsc::Sender<Decision>,
) -> Result<Passed, PassError> {
    let mut pools = list_valid(client, pool_resource, POD_IP_POOL_KIND, read_pool).await?;
    let read = list_pages(
        &nodes.api(),
        ListParams::default(),
        "CiliumNode",
        nodes.api_version(),
        |obj| node_resource(obj).ok().map(|n| read_node(&n)),
    )
    .await?;
    let sets = match pools.iter().any(|p| p.view.sticky) {
        true => list_statefulsets(client).await,
        false => None,
    };
    let node_views: Vec<NodeView> = read.iter().map(|n| n.view.clone()).collect();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    };
    let writer = KubeRecords {
        api: Api::all_with(client.clone(), pool_resource),
        params,
    };
    let (plan, conflict) =
        decide_and_record(&writer, &mut pools, &node_views, sets.as_ref(), retries).await;
    let settled = write_nodes(decisions, node_parts(&plan, &read)).await?;
    if !settled.failed.is_empty() {
        return Err(PassError::Nodes(settled.failed));
    }
    Ok(Passed {
        watch_all: plan.moving || plan.releasing,
        conflict: conflict || settled.conflict,
    })
}

/// What the sticky loop takes in: what the node loop saw of the nodes, and its
/// own watches of the pools and the StatefulSets (None: it ended).
enum StickyInput {
    Node(Option<NodeSeen>),
    /// Whether a pool changed ([`pool_changed`]).
    Pool(Option<bool>),
    Set(WatchItem<StatefulSetView>),
}

/// The plan of a pass: read everything afresh, decide, write. It is decided
/// in the apply from that read, not from what the watches showed: a cache
/// may lag behind the operator's own writes, and a block must never go to
/// two nodes.
struct ReadAfresh;

/// The sticky loop as a controller of the kit.
struct StickyAddresses<'a> {
    client: kube::Client,
    pool_resource: ApiResource,
    nodes: &'a ApiNodes<'a>,
    decisions: mpsc::Sender<Decision>,
    /// The StatefulSets as their watch showed them last.
    seen_sets: BTreeMap<String, StatefulSetView>,
    /// An address is moving or a record waits for its block: every node
    /// change is looked at.
    watch_all: bool,
    /// Pools whose record write failed, each with its own backoff.
    pool_retries: WriteRetries,
}

/// A change starts a pass a tenth of a second later: what arrives together (a
/// relist of every node) is one pass. A failed pass is tried again after the
/// operator's backoff; a pool's failed record write after its own.
const TIMING: Timing = Timing {
    debounce: Duration::from_millis(100),
    min_interval: Duration::ZERO,
    resync: None,
    backoff: Backoff::API,
    changes_wait_for_backoff: false,
};

impl Controller for StickyAddresses<'_> {
    type Input = StickyInput;
    type Plan = ReadAfresh;
    type Error = PassError;
    const WHAT: &'static str = "a sticky-address pass";

    fn feed(&mut self, input: StickyInput) -> Result<bool, WatchEnded> {
        let ended = |kind: &str| WatchEnded { kind: kind.into() };
        Ok(match input {
            StickyInput::Node(None) => return Err(ended("CiliumNode")),
            StickyInput::Node(Some(seen)) => concerns_sticky(seen, self.watch_all),
            StickyInput::Pool(None) => return Err(ended(POD_IP_POOL_KIND)),
            StickyInput::Pool(Some(changed)) => changed,
            StickyInput::Set(None) => return Err(ended("StatefulSet")),
            StickyInput::Set(Some(event)) => {
                event.is_ok_and(|e| set_changed(e, &mut self.seen_sets))
            }
        })
    }

    /// Each pass reads everything afresh: it needs no watch listed.
    fn ready(&self) -> bool {
        true
    }

    async fn plan(&mut self) -> Option<ReadAfresh> {
        Some(ReadAfresh)
    }

    /// A pass; one that finds a pool or a node changed since it was read
    /// reads again at once, up to [`CONFLICTS_IN_A_ROW`] times in a row.
    async fn apply(&mut self, _: ReadAfresh) -> Result<(), PassError> {
        for _ in 0..CONFLICTS_IN_A_ROW {
            let passed = pass(
                &self.client,
                &self.pool_resource,
                self.nodes,
                &mut self.pool_retries,
                &mut self.decisions,
            )
            .await?;
            self.watch_all = passed.watch_all;
            if !passed.conflict {
                return Ok(());
            }
            tracing::debug!("sticky addresses: changed meanwhile; reading again");
        }
        Err(PassError::Conflicts)
    }

    /// A pool whose record write failed is tried again when its backoff ends.
    fn wake_at(&self) -> Option<Instant> {
        self.pool_retries.next_due()
    }
}

/// Runs until a watch ends (they do not while the API server can be retried)
/// or the node loop does (`node_seen` closes).
pub async fn run(
    client: kube::Client,
    pool_resource: ApiResource,
    nodes: &ApiNodes<'_>,
    node_seen: mpsc::UnboundedReceiver<NodeSeen>,
    decisions: mpsc::Sender<Decision>,
) -> WatchEnded {
    let pool_api: Api<DynamicObject> = Api::all_with(client.clone(), &pool_resource);
    let pools = watcher::watcher(pool_api, watcher::Config::default()).default_backoff();
    let set_api: Api<StatefulSet> = Api::all(client.clone());
    let sets = watcher::watcher(set_api, watcher::Config::default()).default_backoff();
    let inputs = futures::stream::select_all([
        ending(node_seen).map(StickyInput::Node).boxed(),
        ending(pools.map(|item| pool_changed(&item)))
            .map(StickyInput::Pool)
            .boxed(),
        ending(projected(sets, |set| StatefulSetView::from(&set)))
            .map(StickyInput::Set)
            .boxed(),
    ]);
    let mut sticky = StickyAddresses {
        client,
        pool_resource,
        nodes,
        decisions,
        seen_sets: BTreeMap::new(),
        watch_all: false,
        pool_retries: WriteRetries::default(),
    };
    controller::run(&mut sticky, inputs, TIMING).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(annotations: &[(&str, &str)]) -> NodeResource {
        let mut n = NodeResource::new("n1");
        for (k, v) in annotations {
            n.metadata.annotations.insert(k.to_string(), v.to_string());
        }
        n
    }

    /// Writes records, failing with `fail[pool]` (an HTTP code) where given.
    #[derive(Default)]
    struct FakeRecords {
        fail: std::cell::RefCell<BTreeMap<String, u16>>,
        written: std::cell::RefCell<Vec<(String, PoolRecord)>>,
    }

    impl RecordWriter for FakeRecords {
        async fn write(&self, pool: &str, _: &str, record: &PoolRecord) -> Result<(), kube::Error> {
            if let Some(code) = self.fail.borrow().get(pool) {
                let reason = if *code == 409 {
                    "Conflict"
                } else {
                    "InternalError"
                };
                return Err(kube::Error::Api(
                    kube::core::Status::failure("refused", reason)
                        .with_code(*code)
                        .boxed(),
                ));
            }
            self.written
                .borrow_mut()
                .push((pool.to_string(), record.clone()));
            Ok(())
        }
    }

    fn sticky_pool(name: &str, cidr: &str) -> ReadPool {
        let mut pool = CiliumPodIPPool {
            api_version: "cilium.io/v2alpha1".into(),
            ..Default::default()
        };
        pool.metadata.name = name.into();
        pool.metadata
            .annotations
            .insert(super::super::sticky::STICKY_POOL.into(), "true".into());
        pool.spec = Some(
            serde_json::from_value(json!({"ipv4": {"cidrs": [cidr], "maskSize": 32}})).unwrap(),
        );
        read_pool(&pool).unwrap()
    }

    fn asking(requests: &str) -> Vec<NodeView> {
        vec![NodeView {
            name: "n1".into(),
            requests: Some(requests.into()),
            allocated: Vec::new(),
        }]
    }

    fn assigned(plan: &Plan, identity: &str) -> bool {
        plan.status["n1"]
            .get(identity)
            .is_some_and(|a| a.state == super::super::sticky::State::Assigned)
    }

    #[tokio::test(start_paused = true)]
    async fn one_pools_failed_record_write_holds_back_only_that_pool_until_its_backoff() {
        // Issue 53.4: one failed write stopped the pass for every pool.
        let mut pools = vec![
            sticky_pool("a", "10.1.0.0/28"),
            sticky_pool("b", "10.2.0.0/28"),
        ];
        let nodes = asking(r#"{"db/a-0": "a", "db/b-0": "b"}"#);
        let writer = FakeRecords::default();
        writer.fail.borrow_mut().insert("a".into(), 500);
        let mut retries = WriteRetries::default();
        let (plan, conflict) =
            decide_and_record(&writer, &mut pools, &nodes, None, &mut retries).await;
        assert!(!conflict);
        let written: Vec<String> = writer
            .written
            .borrow()
            .iter()
            .map(|(p, _)| p.clone())
            .collect();
        assert_eq!(written, ["b"], "{:?}", plan.status);
        assert!(assigned(&plan, "db/b-0"), "b goes on: {:?}", plan.status);
        assert!(
            !plan.status["n1"].contains_key("db/a-0"),
            "a's new identity waits unanswered"
        );
        let blocks: Vec<&str> = plan.assign["n1"].iter().map(|p| p.pool.as_str()).collect();
        assert_eq!(blocks, ["b"], "no block of a before its record");
        let first = retries.next_due().unwrap();

        // Before a's backoff ends, a is not written again; b has nothing to write.
        writer.fail.borrow_mut().clear();
        writer.written.borrow_mut().clear();
        let mut pools = vec![sticky_pool("a", "10.1.0.0/28"), pools[1].clone()];
        let (plan, _) = decide_and_record(&writer, &mut pools, &nodes, None, &mut retries).await;
        assert!(writer.written.borrow().is_empty());
        assert!(!plan.status["n1"].contains_key("db/a-0"));
        assert!(assigned(&plan, "db/b-0"));

        // Once due, a is written and served.
        tokio::time::advance(first - Instant::now()).await;
        let (plan, _) = decide_and_record(&writer, &mut pools, &nodes, None, &mut retries).await;
        assert_eq!(writer.written.borrow()[0].0, "a");
        assert!(assigned(&plan, "db/a-0") && assigned(&plan, "db/b-0"));
        assert_eq!(retries.next_due(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_conflict_reads_again_at_once_without_a_backoff_and_a_gone_pool_is_forgotten() {
        let mut pools = vec![sticky_pool("a", "10.1.0.0/28")];
        let nodes = asking(r#"{"db/a-0": "a"}"#);
        let writer = FakeRecords::default();
        writer.fail.borrow_mut().insert("a".into(), 409);
        let mut retries = WriteRetries::default();
        let (plan, conflict) =
            decide_and_record(&writer, &mut pools, &nodes, None, &mut retries).await;
        assert!(conflict && plan.assign.is_empty());
        assert_eq!(retries.next_due(), None);
        writer.fail.borrow_mut().insert("a".into(), 500);
        decide_and_record(&writer, &mut pools, &nodes, None, &mut retries).await;
        assert!(retries.next_due().is_some());
        decide_and_record(&writer, &mut [], &nodes, None, &mut retries).await;
        assert_eq!(retries.next_due(), None, "a gone pool waits for nothing");
    }

    #[test]
    fn the_record_patch_carries_the_resource_version_and_removes_empty_notes() {
        let record = PoolRecord {
            owners: BTreeMap::from([("db/web-0".to_string(), "10.1.0.1".parse().unwrap())]),
            release_on_delete: Some(BTreeMap::new()),
        };
        assert_eq!(
            record_patch("7", &record),
            json!({"metadata": {"resourceVersion": "7", "annotations": {
                STICKY_OWNERS: r#"{"db/web-0":"10.1.0.1"}"#, STICKY_RELEASE_ON_DELETE: null}}})
        );
        let noted = PoolRecord {
            release_on_delete: Some(BTreeMap::from([("db/web".to_string(), "u".to_string())])),
            ..record.clone()
        };
        assert_eq!(
            record_patch("7", &noted)["metadata"]["annotations"][STICKY_RELEASE_ON_DELETE],
            r#"{"db/web":"u"}"#
        );
        let untouched = PoolRecord {
            release_on_delete: None,
            ..record
        };
        assert!(
            record_patch("7", &untouched)["metadata"]["annotations"]
                .get(STICKY_RELEASE_ON_DELETE)
                .is_none()
        );
    }

    /// `event` as the loop's StatefulSet watch hands it on.
    fn view(event: Event<StatefulSet>) -> Event<StatefulSetView> {
        let one = futures::stream::iter([Ok(event)]);
        let mut viewed = Box::pin(projected(one, |set| StatefulSetView::from(&set)));
        futures::executor::block_on(viewed.next()).unwrap().unwrap()
    }

    #[test]
    fn only_statefulset_deletions_and_lifecycle_changes_start_a_pass() {
        let set = |replicas: i32| -> StatefulSet {
            serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "db", "uid": "u"},
                "spec": {"selector": {}, "serviceName": "web", "template": {}, "replicas": replicas},
                "status": {"replicas": 0}}))
            .unwrap()
        };
        let mut seen = BTreeMap::new();
        assert!(!set_changed(view(Event::InitApply(set(2))), &mut seen));
        assert!(set_changed(Event::InitDone, &mut seen));
        let mut status_only = set(2);
        status_only.status = None;
        assert!(!set_changed(view(Event::Apply(status_only)), &mut seen));
        assert!(set_changed(view(Event::Apply(set(1))), &mut seen));
        assert!(set_changed(view(Event::Delete(set(1))), &mut seen));
        assert!(seen.is_empty());
    }

    #[test]
    fn only_node_changes_that_may_change_an_answer_start_a_pass() {
        let plain = NodeSeen::Upserted { sticky: false };
        let sticky = NodeSeen::Upserted { sticky: true };
        assert!(!concerns_sticky(plain, false));
        assert!(
            concerns_sticky(plain, true),
            "a block may have been given back"
        );
        assert!(concerns_sticky(sticky, false));
        assert!(concerns_sticky(NodeSeen::Deleted, false));
        assert!(concerns_sticky(NodeSeen::Relisted, false));
    }

    #[test]
    fn an_ignored_node_is_not_answered_but_its_blocks_count() {
        let asks = r#"{"db/web-0": "web"}"#;
        let read = read_node(&node(&[(STICKY_REQUESTS, asks)]));
        assert_eq!(read.view.requests.as_deref(), Some(asks));
        assert!(!read.ignored);
        let mut ignored = node(&[(STICKY_REQUESTS, asks), ("ipam.cilium.io/ignore", "true")]);
        ignored.spec.ipam.pools.allocated = vec![crate::resources::AllocatedPool {
            pool: "web".into(),
            cidrs: vec!["10.77.0.1/32".parse().unwrap()],
            ..Default::default()
        }];
        let read = read_node(&ignored);
        assert!(read.ignored);
        assert_eq!(read.view.requests, None, "its requests are not read");
        assert_eq!(
            read.view.allocated.len(),
            1,
            "its block still counts as held"
        );
    }
}
