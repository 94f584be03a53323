//! The operator's bookkeeping of node CIDRs (Cilium's `NodesPodCIDRManager`), with
//! no I/O: what each CiliumNode holds, what it still needs, and which writes bring
//! the API objects there. CIDRs come from [`NodeCidrCarver`] (Cilium's cidrset
//! rules and errors). Until the first full list has been seen, existing CIDRs are
//! only re-adopted and nothing is allocated, so a fresh allocation can never take a
//! CIDR that a node not read yet holds; a CIDR once held is never reassigned while
//! its node exists. A node that finds no room waits with the error and gets the
//! first CIDR a deleted node frees (first come, first served).
//!
//! Extra CIDRs ([`extra`](super::extra) states the rule): a node whose agent says
//! a family is depleted gets one more CIDR of it appended to its list, and an
//! extra CIDR its agent released is taken off. A CIDR taken off a node is freed
//! for others only once a write of the node's list without it went through
//! ([`NodeCidrs::written`]) or the node is gone: until then the carver holds it
//! (the node's `releasing`), however often the write fails and is retried, so a
//! CIDR is never on two CiliumNodes at once. After a restart the CiliumNode
//! still lists it: re-adopted, and released again. Verdicts are acted on at the
//! end of a list too (said before a restart). Nodes waiting for their first
//! CIDRs are served before any extra one. A node the pool has no room for
//! keeps what it has, with the reason in its status and an Event; it gets the
//! next CIDR that is freed. A spec that shows the list before the operator's last
//! change is a late event, not someone else's edit.
//!
//! The cluster pool may change while the operator runs ([`NodeCidrs::reconfigure`],
//! the carver's rule): a new pool CIDR gives waiting nodes room at once; one taken
//! out drains ([`drain`](super::drain) says who is on it, in an Event on each) and
//! is forgotten when its last node is gone; a pool refused (a new entry over a
//! draining one) is tried again when a node goes. At start, a node's range in no pool
//! CIDR is what a removal before the restart left: held, and said the same way.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use tokio::sync::watch;

use super::cidr_event::{CidrEvent, joined};
use super::drain;
use super::extra::{self, ExtraPlan, parse_status};
use super::reload::PoolRead;
use crate::ipam::clusterpool::{
    ClusterPoolConfig, ClusterPoolError, NodeCidrCarver, PoolChange, cidr_option,
};
use crate::ipam::{CidrSet, Family};
use crate::k8s::mirror::Keyed;
use crate::operator::node_loop::{ignored, older};
use crate::resources::{NodeResource, PodCidrState};

/// What the operator reads of one CiliumNode: all the node loop keeps of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// `spec.ipam.podCIDRs`.
    pub pod_cidrs: Vec<IpNet>,
    /// `status.ipam.operator-status.error`.
    pub error: String,
    /// Annotated `ipam.cilium.io/ignore: "true"`.
    pub ignored: bool,
    /// The agent's verdicts, `status.ipam.pod-cidrs`.
    pub cidr_status: BTreeMap<IpNet, PodCidrState>,
}

impl From<&NodeResource> for Observed {
    fn from(node: &NodeResource) -> Observed {
        Observed {
            name: node.metadata.name.clone(),
            uid: node.metadata.uid().to_string(),
            resource_version: node.metadata.resource_version.clone().unwrap_or_default(),
            pod_cidrs: node.spec.ipam.pod_cidrs.clone(),
            error: node.status.ipam.operator_status.error.clone(),
            ignored: ignored(&node.metadata.annotations),
            cidr_status: parse_status(&node.status.ipam.pod_cidrs),
        }
    }
}

impl Keyed for Observed {
    fn key(&self) -> String {
        self.name.clone()
    }
}

/// The writes one node needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The object's UID: the writes carry it, so a write never re-creates a node
    /// that was deleted meanwhile.
    pub uid: String,
    /// The newest resourceVersion seen of the node: the podCIDRs apply's
    /// precondition (none when empty).
    pub resource_version: String,
    /// Apply `spec.ipam.podCIDRs`.
    pub pod_cidrs: Option<Vec<IpNet>>,
    /// Apply `status.ipam.operator-status.error` ("" clears it).
    pub status_error: Option<String>,
    /// Events to post on the CiliumNode.
    pub events: Vec<CidrEvent>,
}

/// Event reason: a node got an extra CIDR.
pub const REASON_EXTRA_ALLOCATED: &str = "ExtraPodCIDRAllocated";
/// Event reason: an extra CIDR went back to the pool.
pub const REASON_EXTRA_RELEASED: &str = "ExtraPodCIDRReleased";
/// Event reason: a depleted node found no room in the pool.
pub const REASON_EXTRA_UNAVAILABLE: &str = "ExtraPodCIDRUnavailable";

/// Why a depleted node got no extra CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no extra {} CIDR for node {node}: {pool} has no free {sizes} left (the node's CIDRs are \
     depleted; it keeps serving from {serving})",
    family.label()
)]
pub struct ExtraUnavailable {
    pub node: String,
    pub family: Family,
    /// The pool option and its CIDRs (`cluster-pool-ipv4-cidr 10.0.0.0/16`).
    pub pool: String,
    /// The node range sizes of its CIDRs (`/24`, or `/24 or /26` when a pool
    /// CIDR has its own).
    pub sizes: String,
    pub serving: String,
}

#[derive(Debug, Clone, Default)]
struct Entry {
    uid: String,
    /// The newest resourceVersion seen.
    resource_version: String,
    /// Arrival order: who waited first gets room first.
    seq: u64,
    /// `spec.ipam.podCIDRs` as last seen.
    spec: Vec<IpNet>,
    /// `status.ipam.operator-status.error` as last seen.
    observed_error: String,
    /// What the carver holds for this node.
    held: Vec<IpNet>,
    /// Extra CIDRs taken off `held` whose removal from the API object is not
    /// confirmed yet: the carver holds them until a write without them went
    /// through (or the node is gone).
    releasing: Vec<IpNet>,
    /// The error the node's status should show (None: none).
    error: Option<String>,
    /// The API object shows `held` (or our apply of it succeeded).
    applied: bool,
    /// The last status error written.
    status_sent: Option<String>,
    ignored: bool,
    /// The agent's verdicts as last seen.
    cidr_status: BTreeMap<IpNet, PodCidrState>,
    /// `held` before the operator's last change of it: a spec showing it is a
    /// late event.
    previous: Vec<IpNet>,
    /// Why the node got no extra CIDR it asks for (None: it did, or asks none).
    extra_error: Option<String>,
    /// Depleted families at the cap of extra CIDRs.
    at_cap: Vec<Family>,
    /// Events not posted yet.
    events: Vec<CidrEvent>,
}

/// Node CIDRs of every CiliumNode the operator has seen.
pub struct NodeCidrs {
    carver: NodeCidrCarver,
    /// `cluster-pool-extra-cidrs-max`.
    extra_max: u32,
    nodes: BTreeMap<String, Entry>,
    /// The first full list has been seen: allocation may start.
    synced: bool,
    next_seq: u64,
    /// The last cluster pool read, refused, and why (None: it is in force). It
    /// is tried again when a node goes (what it overlapped may be gone).
    refused: Option<(ClusterPoolConfig, String)>,
    /// A cluster pool read before the first full list: taken once every node
    /// is re-adopted, so what they hold counts in the change.
    deferred: Option<ClusterPoolConfig>,
    /// Why the options last read do not parse (None: they do).
    malformed: Option<String>,
    /// Where the pool in force goes, as its record, each time it changes (the
    /// Lease's annotation: `reload`'s rule).
    record: Option<watch::Sender<Option<String>>>,
}

/// Same CIDRs, in any order.
fn same(a: &[IpNet], b: &[IpNet]) -> bool {
    let a: BTreeSet<IpNet> = a.iter().map(IpNet::trunc).collect();
    let b: BTreeSet<IpNet> = b.iter().map(IpNet::trunc).collect();
    a == b
}

impl NodeCidrs {
    pub fn new(carver: NodeCidrCarver, extra_max: u32) -> NodeCidrs {
        NodeCidrs {
            carver,
            extra_max,
            nodes: BTreeMap::new(),
            synced: false,
            next_seq: 0,
            refused: None,
            deferred: None,
            malformed: None,
            record: None,
        }
    }

    /// Says `in_force`, the pool led with, to `record`, and each pool taken
    /// after it.
    pub fn recording(
        mut self,
        in_force: &ClusterPoolConfig,
        record: watch::Sender<Option<String>>,
    ) -> NodeCidrs {
        record.send_replace(Some(in_force.to_record()));
        self.record = Some(record);
        self
    }

    /// A reading of the cluster pool options ([`PoolRead`]): a pool to take or
    /// refuse, or options that do not parse (refused; the pool in force
    /// stays). Returns the nodes that may need writes.
    pub fn read(&mut self, read: PoolRead) -> Vec<String> {
        match read {
            PoolRead::Parsed(pool) => self.reconfigure(&pool),
            PoolRead::Malformed(why) => {
                self.malformed = Some(why);
                Vec::new()
            }
        }
    }

    /// A CiliumNode as listed or watched. Returns the nodes that may need writes.
    pub fn observe(&mut self, node: Observed) -> Vec<String> {
        let name = node.name.clone();
        if !self.nodes.contains_key(&name) {
            let mut entry = Entry {
                uid: node.uid,
                resource_version: node.resource_version,
                seq: self.next_seq,
                spec: node.pod_cidrs,
                observed_error: node.error,
                ignored: node.ignored,
                cidr_status: node.cidr_status,
                ..Entry::default()
            };
            self.next_seq += 1;
            if !entry.spec.is_empty() {
                let adopted = match self.synced {
                    true => self.carver.adopt_node(&entry.spec),
                    false => self.carver.adopt_after_restart(&entry.spec),
                };
                match adopted {
                    Ok(held) => {
                        entry.applied = same(&held, &entry.spec);
                        entry.held = held;
                    }
                    Err(e) if !entry.ignored => {
                        tracing::warn!(node = %name, error = %e, "cannot re-adopt the node's CIDRs");
                        entry.error = Some(e.to_string());
                    }
                    Err(_) => {}
                }
            }
            self.nodes.insert(name.clone(), entry);
            if self.synced {
                self.say_held_apart(&name);
            }
        } else if let Some(entry) = self.nodes.get_mut(&name) {
            entry.uid = node.uid;
            if !older(&node.resource_version, &entry.resource_version) {
                entry.resource_version = node.resource_version;
            }
            entry.spec = node.pod_cidrs;
            entry.observed_error = node.error;
            entry.ignored = node.ignored;
            entry.cidr_status = node.cidr_status;
            if !entry.held.is_empty() && self.carver.covers_every_family(&entry.held) {
                if same(&entry.spec, &entry.held) {
                    entry.applied = true;
                    entry.error = None;
                } else if !entry.spec.is_empty() && !same(&entry.spec, &entry.previous) {
                    // Someone else rewrote the CIDRs this node holds: Cilium's
                    // conflict, reported; the held CIDRs stay with the node.
                    entry.applied = false;
                    entry.error = Some(
                        ClusterPoolError::Conflict {
                            node_cidrs: joined(&entry.held),
                            cidr: entry.spec[0],
                            reason: "is not what the operator allocated to this node".into(),
                        }
                        .to_string(),
                    );
                }
            }
        }
        if self.synced && self.needs_cidrs(&name) {
            self.assign(&name);
        } else if self.synced {
            self.extend(&name);
        }
        vec![name]
    }

    /// The first (or a new) full list is complete: nodes it did not list are gone,
    /// and allocation starts, in arrival order (first CIDRs, then extra ones).
    /// Returns the nodes that may need writes.
    pub fn list_done(&mut self, listed: &BTreeSet<String>) -> Vec<String> {
        let gone: Vec<String> = self
            .nodes
            .keys()
            .filter(|n| !listed.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            self.forget(&name);
        }
        if !self.synced {
            let names: Vec<String> = self.nodes.keys().cloned().collect();
            for name in &names {
                self.say_held_apart(name);
            }
        }
        self.synced = true;
        if let Some(pool) = self.deferred.take() {
            self.reconfigure(&pool);
        }
        self.assign_waiting();
        // Then what the agents' verdicts call for: a release or a depletion
        // said before the list (before a restart) is acted on now, not at the
        // node's next change.
        let mut arrived: Vec<(u64, String)> =
            self.nodes.iter().map(|(n, e)| (e.seq, n.clone())).collect();
        arrived.sort();
        for (_, name) in &arrived {
            self.extend(name);
        }
        arrived.into_iter().map(|(_, name)| name).collect()
    }

    /// A CiliumNode was deleted: its CIDRs go back to the pool, and waiting nodes
    /// get them. Returns the nodes that may need writes.
    pub fn remove(&mut self, name: &str) -> Vec<String> {
        self.forget(name);
        if self.synced {
            self.assign_waiting()
        } else {
            Vec::new()
        }
    }

    /// The cluster pool read again: see the module's rule. A refused change is
    /// logged (once) and leaves the pool as it was. Returns the nodes that may
    /// need writes.
    pub fn reconfigure(&mut self, config: &ClusterPoolConfig) -> Vec<String> {
        if !self.synced {
            self.deferred = Some(config.clone());
            return Vec::new();
        }
        let change = match self.carver.reconfigure(config) {
            Ok(change) => change,
            Err(e) => {
                let why = e.to_string();
                if self
                    .refused
                    .as_ref()
                    .is_none_or(|(_, before)| *before != why)
                {
                    tracing::error!(error = %why, "the cluster pool options changed and were refused; the previous pool stays in force (tried again when a node goes)");
                }
                self.refused = Some((config.clone(), why));
                return Vec::new();
            }
        };
        self.refused = None;
        self.malformed = None;
        if let Some(record) = &self.record {
            let in_force = Some(config.to_record());
            record.send_if_modified(|r| {
                let changed = *r != in_force;
                *r = in_force;
                changed
            });
        }
        if change.is_empty() {
            return Vec::new();
        }
        log_change(&change);
        let mut touched = self.say_draining(&change.draining);
        if self.synced {
            touched.extend(self.assign_waiting());
        }
        touched
    }

    /// Whether the last cluster pool read was refused.
    pub fn pool_refused(&self) -> bool {
        self.refused.is_some() || self.malformed.is_some()
    }

    /// An Event on each node still on a pool CIDR of `draining`. Returns them.
    fn say_draining(&mut self, draining: &[IpNet]) -> Vec<String> {
        let mut touched = Vec::new();
        for pool in draining {
            let held = self
                .nodes
                .iter()
                .map(|(n, e)| (n.as_str(), e.held.as_slice()));
            let users = drain::users(pool, held);
            let names: Vec<String> = users.iter().map(|(n, _)| n.clone()).collect();
            tracing::warn!(pool = %pool, nodes = %names.join(", "), "a pool CIDR was removed while nodes hold ranges of it: it drains");
            let option = cidr_option(Family::of_net(pool));
            for (name, ranges) in users {
                if let Some(e) = self.nodes.get_mut(&name) {
                    let event = drain::draining_event(option, pool, &name, &ranges, &names);
                    e.events.push(event);
                    touched.push(name);
                }
            }
        }
        touched
    }

    /// An Event on a node holding ranges apart ([`NodeCidrCarver`]'s rule):
    /// in no pool CIDR (said at start), or of another size than the pool CIDR
    /// they lie in.
    fn say_held_apart(&mut self, name: &str) {
        let Self { carver, nodes, .. } = self;
        let Some(e) = nodes.get_mut(name) else {
            return;
        };
        let apart = e.held.iter().filter(|c| carver.outside().contains(c));
        let (inside, outside): (Vec<IpNet>, Vec<IpNet>) =
            apart.partition(|c| carver.pool_of(c).is_some());
        for range in inside {
            if let Some(set) = carver.pool_of(&range) {
                let (pool, mask) = (set.cluster(), set.node_mask());
                tracing::warn!(node = %name, cidr = %range, pool = %pool, node_mask = mask, "the node holds a range of another size than its pool CIDR's: held apart, no range inside it is handed out");
                let event = drain::held_other_size_event(name, &range, &pool, mask);
                e.events.push(event);
            }
        }
        let Some(first) = outside.first() else {
            return;
        };
        let option = cidr_option(Family::of_net(first));
        tracing::warn!(node = %name, cidrs = %joined(&outside), "the node holds ranges in no pool CIDR (a removed one drains)");
        e.events
            .push(drain::held_outside_event(option, name, &outside));
    }

    /// Forgets the draining pool CIDRs nobody is on any more.
    fn finish_drains(&mut self) {
        for pool in self.carver.finish_drains() {
            tracing::info!(pool = %pool, "no node holds a range of the removed pool CIDR any more: its removal is complete");
        }
    }

    /// The writes `name` needs, if any.
    pub fn pending(&self, name: &str) -> Option<Pending> {
        let e = self.nodes.get(name)?;
        if e.ignored {
            return None;
        }
        let pod_cidrs = ((!e.applied || !e.releasing.is_empty())
            && e.error.is_none()
            && !e.held.is_empty()
            && self.carver.covers_every_family(&e.held))
        .then(|| e.held.clone());
        let wanted = e
            .error
            .clone()
            .or_else(|| e.extra_error.clone())
            .unwrap_or_default();
        let status_error = (wanted != e.observed_error
            && e.status_sent.as_deref() != Some(wanted.as_str()))
        .then_some(wanted);
        if pod_cidrs.is_none() && status_error.is_none() && e.events.is_empty() {
            return None;
        }
        Some(Pending {
            uid: e.uid.clone(),
            resource_version: e.resource_version.clone(),
            pod_cidrs,
            status_error,
            events: e.events.clone(),
        })
    }

    /// `write` went through: its status error is the node's, its Events
    /// posted, and the CIDRs it took off the node are free (waiting nodes get
    /// them). Returns the nodes that may need writes.
    pub fn written(&mut self, name: &str, write: &Pending) -> Vec<String> {
        let Some(e) = self.nodes.get_mut(name) else {
            return Vec::new();
        };
        if let Some(error) = &write.status_error {
            e.status_sent = Some(error.clone());
        }
        e.events.retain(|ev| !write.events.contains(ev));
        let Some(listed) = &write.pod_cidrs else {
            return Vec::new();
        };
        let (freed, still): (Vec<IpNet>, Vec<IpNet>) = std::mem::take(&mut e.releasing)
            .into_iter()
            .partition(|c| !listed.contains(c));
        e.releasing = still;
        if freed.is_empty() {
            return Vec::new();
        }
        tracing::info!(node = %name, cidrs = %joined(&freed), "the node's CiliumNode no longer lists its released CIDRs: they are free again");
        let mut touched = self.free(&freed);
        if self.synced {
            touched.extend(self.assign_waiting());
        }
        touched
    }

    /// The depleted families of `name` at the cap of extra CIDRs.
    pub fn at_cap(&self, name: &str) -> &[Family] {
        self.nodes.get(name).map_or(&[], |e| e.at_cap.as_slice())
    }

    /// (nodes holding a CIDR of every enabled family, nodes waiting with an error).
    pub fn counts(&self) -> (usize, usize) {
        let active = self.nodes.values().filter(|e| !e.ignored);
        let (mut allocated, mut waiting) = (0, 0);
        for e in active {
            if e.error.is_some() {
                waiting += 1;
            } else if self.carver.covers_every_family(&e.held) {
                allocated += 1;
            }
        }
        (allocated, waiting)
    }

    /// The CIDRs the carver holds for `name`.
    #[cfg(test)]
    pub fn held(&self, name: &str) -> Option<&[IpNet]> {
        self.nodes.get(name).map(|e| e.held.as_slice())
    }

    fn needs_cidrs(&self, name: &str) -> bool {
        self.nodes
            .get(name)
            .is_some_and(|e| !e.ignored && !self.carver.covers_every_family(&e.held))
    }

    fn forget(&mut self, name: &str) {
        if let Some(e) = self.nodes.remove(name) {
            let cidrs: Vec<IpNet> = e.held.into_iter().chain(e.releasing).collect();
            if !cidrs.is_empty() {
                tracing::info!(node = %name, cidrs = %joined(&cidrs), "node gone: its CIDRs are free again");
                self.free(&cidrs);
            }
        }
    }

    /// Gives `cidrs` back to the pool: a draining pool CIDR nobody is on any
    /// more is forgotten, and a refused pool is tried again (what it
    /// overlapped may be gone). Returns the nodes that may need writes.
    fn free(&mut self, cidrs: &[IpNet]) -> Vec<String> {
        self.carver.release_node(cidrs);
        self.finish_drains();
        match self.refused.clone() {
            Some((pool, _)) => self.reconfigure(&pool),
            None => Vec::new(),
        }
    }

    /// Tries every node that still needs CIDRs, first come first served; then
    /// the nodes that wait for an extra CIDR.
    fn assign_waiting(&mut self) -> Vec<String> {
        let mut waiting: Vec<(u64, String)> = self
            .nodes
            .iter()
            .filter(|(n, _)| self.needs_cidrs(n))
            .map(|(n, e)| (e.seq, n.clone()))
            .collect();
        waiting.sort();
        let mut touched: Vec<String> = waiting
            .into_iter()
            .map(|(_, name)| {
                self.assign(&name);
                name
            })
            .collect();
        let mut growing: Vec<(u64, String)> = self
            .nodes
            .iter()
            .filter(|(_, e)| e.extra_error.is_some())
            .map(|(n, e)| (e.seq, n.clone()))
            .collect();
        growing.sort();
        for (_, name) in growing {
            self.extend(&name);
            touched.push(name);
        }
        touched
    }

    /// Extra CIDRs: what the agent's verdicts on `name` call for (nothing until
    /// its spec shows what it holds, or while it waits for its first CIDRs).
    /// Nothing is freed here: a released CIDR is free once the node's write
    /// without it went through ([`NodeCidrs::written`]).
    fn extend(&mut self, name: &str) {
        let Some(e) = self.nodes.get(name) else {
            return;
        };
        if e.ignored || e.error.is_some() || !e.applied || e.held.is_empty() {
            return;
        }
        let plan = extra::plan(&e.held, &e.cidr_status, self.extra_max);
        self.apply_extra(name, plan);
    }

    /// Carves what `plan` grows, then takes what it releases off the node: the
    /// carver keeps holding those until the node's write without them went
    /// through, so none goes to another node (or comes straight back) before.
    fn apply_extra(&mut self, name: &str, plan: ExtraPlan) {
        let Self { carver, nodes, .. } = self;
        let Some(e) = nodes.get_mut(name) else {
            return;
        };
        let before = e.held.clone();
        let given_back: Vec<IpNet> = e
            .cidr_status
            .iter()
            .filter(|(_, s)| **s == PodCidrState::Released)
            .map(|(c, _)| *c)
            .collect();
        let mut unavailable = None;
        for family in plan.grow {
            let depleted = joined(&family_of(&e.held, family));
            match carver.carve_one(family, &given_back) {
                Ok(cidr) => {
                    tracing::info!(node = %name, cidr = %cidr, depleted = %depleted, "gave the node an extra CIDR");
                    e.events.push(CidrEvent {
                        warning: false,
                        reason: REASON_EXTRA_ALLOCATED,
                        about: cidr.to_string(),
                        note: format!(
                            "extra {} CIDR {cidr} for node {name}: its CIDRs {depleted} are depleted",
                            family.label()
                        ),
                    });
                    e.held.push(cidr);
                }
                Err(_) => {
                    let why = unavailable_error(carver, name, family, &depleted).to_string();
                    if e.extra_error.as_deref() != Some(why.as_str()) {
                        tracing::warn!(node = %name, "{why}");
                        e.events.push(CidrEvent {
                            warning: true,
                            reason: REASON_EXTRA_UNAVAILABLE,
                            about: family.label().into(),
                            note: why.clone(),
                        });
                    }
                    unavailable = Some(why);
                }
            }
        }
        e.extra_error = unavailable;
        for cidr in plan.release {
            tracing::info!(node = %name, cidr = %cidr, "the agent released an extra CIDR: it goes back to the pool once the node's CiliumNode no longer lists it");
            e.events.push(CidrEvent {
                warning: false,
                reason: REASON_EXTRA_RELEASED,
                about: cidr.to_string(),
                note: format!(
                    "extra CIDR {cidr} of node {name} went back to the pool (no pod in it)"
                ),
            });
            e.held.retain(|c| *c != cidr);
            e.releasing.push(cidr);
        }
        e.at_cap = plan.at_cap;
        if e.held != before {
            e.previous = before;
            e.applied = false;
        }
    }

    /// Gives `name` a CIDR of every enabled family, keeping what it has (or what
    /// its spec says when it holds nothing yet); on failure the error waits in
    /// the node's status and what it held stays held.
    fn assign(&mut self, name: &str) {
        let Some(e) = self.nodes.get_mut(name) else {
            return;
        };
        let wanted = if e.held.is_empty() {
            e.spec.clone()
        } else {
            e.held.clone()
        };
        self.carver.release_node(&e.held);
        match self.carver.carve_for_node(&wanted) {
            Ok(held) => {
                tracing::info!(node = %name, cidrs = %joined(&held), "allocated node CIDRs");
                e.applied = same(&held, &e.spec);
                e.held = held;
                e.error = None;
            }
            Err(err) => {
                // What it held was free a moment ago: re-adopting it cannot fail.
                e.held = self.carver.adopt_node(&e.held).unwrap_or_default();
                if e.error.as_deref() != Some(err.to_string().as_str()) {
                    tracing::warn!(node = %name, error = %err, "cannot allocate node CIDRs; the node waits");
                }
                e.error = Some(err.to_string());
            }
        }
    }
}

/// The log line of a cluster pool change.
fn log_change(change: &PoolChange) {
    let added: Vec<String> = change.added.iter().map(ToString::to_string).collect();
    tracing::info!(
        added = %added.join(", "),
        resumed = %joined(&change.resumed),
        draining = %joined(&change.draining),
        removed = %joined(&change.removed),
        "the cluster pool changed"
    );
}

/// The CIDRs of `family` in `cidrs`.
fn family_of(cidrs: &[IpNet], family: Family) -> Vec<IpNet> {
    cidrs
        .iter()
        .copied()
        .filter(|c| Family::of_net(c) == family)
        .collect()
}

/// The node range sizes of `sets`, in order: `/24`, `/24 or /26`.
fn range_sizes(sets: &[CidrSet]) -> String {
    let mut sizes: Vec<String> = Vec::new();
    for s in sets {
        let size = format!("/{}", s.node_mask());
        if !sizes.contains(&size) {
            sizes.push(size);
        }
    }
    sizes.join(" or ")
}

/// The error of a node of `family` whose pool has no room left.
fn unavailable_error(
    carver: &NodeCidrCarver,
    node: &str,
    family: Family,
    serving: &str,
) -> ExtraUnavailable {
    let sets = carver.sets(family);
    let pools: Vec<IpNet> = sets.iter().map(|s| s.cluster()).collect();
    ExtraUnavailable {
        node: node.to_string(),
        family,
        pool: format!(
            "{} {}",
            crate::ipam::clusterpool::cidr_option(family),
            joined(&pools)
        ),
        sizes: range_sizes(sets),
        serving: serving.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::clusterpool::ClusterPoolConfig;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn cidrs(v4: &[&str], v6: &[&str]) -> NodeCidrs {
        let cfg = ClusterPoolConfig {
            enable_ipv4: !v4.is_empty(),
            enable_ipv6: !v6.is_empty(),
            ipv4_cidrs: nets(v4),
            ipv4_mask_size: 24,
            ipv6_cidrs: nets(v6),
            ipv6_mask_size: 120,
            node_masks: Default::default(),
        };
        NodeCidrs::new(NodeCidrCarver::new(&cfg).unwrap(), 2)
    }

    fn node(name: &str, pod_cidrs: &[&str]) -> Observed {
        Observed {
            name: name.into(),
            uid: format!("uid-{name}"),
            pod_cidrs: nets(pod_cidrs),
            ..Observed::default()
        }
    }

    fn cidrs_write(p: &Option<Pending>) -> Option<Vec<IpNet>> {
        p.as_ref().and_then(|p| p.pod_cidrs.clone())
    }

    #[test]
    fn nothing_is_allocated_before_the_first_list_is_complete() {
        let mut c = cidrs(&["10.0.0.0/22"], &[]);
        c.observe(node("new", &[]));
        assert_eq!(c.pending("new"), None);
        // Listed after the new node, holding the first CIDR round-robin would give.
        c.observe(node("old", &["10.0.0.0/24"]));
        c.list_done(&["new".into(), "old".into()].into());
        assert_eq!(c.pending("old"), None, "re-adopted, nothing to write");
        let p = c.pending("new");
        assert_eq!(cidrs_write(&p), Some(nets(&["10.0.1.0/24"])));
        assert_eq!(p.unwrap().uid, "uid-new");
    }

    #[test]
    fn one_write_per_node_and_stale_events_change_nothing() {
        let mut c = cidrs(&["10.0.0.0/22"], &[]);
        c.list_done(&BTreeSet::new());
        c.observe(node("a", &[]));
        assert_eq!(cidrs_write(&c.pending("a")), Some(nets(&["10.0.0.0/24"])));
        // The apply's answer shows the CIDRs: done.
        c.observe(node("a", &["10.0.0.0/24"]));
        assert_eq!(c.pending("a"), None);
        // An event older than the apply (the agent's own write) asks for nothing.
        c.observe(node("a", &[]));
        assert_eq!(c.pending("a"), None);
        assert_eq!(c.held("a"), Some(nets(&["10.0.0.0/24"]).as_slice()));
    }

    #[test]
    fn exhaustion_waits_with_the_error_and_recovers_when_a_node_goes() {
        let mut c = cidrs(&["10.90.0.0/23"], &[]);
        c.list_done(&BTreeSet::new());
        for n in ["a", "b", "c", "d"] {
            c.observe(node(n, &[]));
        }
        assert_eq!(cidrs_write(&c.pending("a")), Some(nets(&["10.90.0.0/24"])));
        assert_eq!(cidrs_write(&c.pending("b")), Some(nets(&["10.90.1.0/24"])));
        let p = c.pending("c").unwrap();
        assert_eq!(p.pod_cidrs, None);
        assert_eq!(p.status_error.as_deref(), Some("allocator full"));
        c.written("c", &p);
        c.observe(Observed {
            error: "allocator full".into(),
            ..node("c", &[])
        });
        assert_eq!(c.pending("c"), None, "the error is written once");
        assert_eq!(c.counts(), (2, 2));
        // a goes: c waited first and gets its CIDR; the error is cleared.
        let touched = c.remove("a");
        assert!(touched.contains(&"c".to_string()));
        let p = c.pending("c").unwrap();
        assert_eq!(p.pod_cidrs, Some(nets(&["10.90.0.0/24"])));
        assert_eq!(p.status_error.as_deref(), Some(""));
        assert_eq!(
            c.pending("d").and_then(|p| p.status_error).as_deref(),
            Some("allocator full")
        );
    }

    #[test]
    fn an_existing_cidr_is_never_given_twice() {
        let mut c = cidrs(&["10.0.0.0/16"], &[]);
        c.observe(node("a", &["10.0.5.0/24"]));
        c.observe(node("b", &["10.0.5.0/24"]));
        c.list_done(&["a".into(), "b".into()].into());
        assert_eq!(c.pending("a"), None);
        let p = c.pending("b").unwrap();
        assert_eq!(p.pod_cidrs, None);
        assert_eq!(
            p.status_error.as_deref(),
            Some(
                "node has CIDRs allocated (10.0.5.0/24) that conflict with requested CIDRs: \
                 10.0.5.0/24 is already allocated"
            )
        );
        c.written("b", &p);
        let error = p.status_error.unwrap_or_default();
        c.observe(Observed {
            error,
            ..node("b", &["10.0.5.0/24"])
        });
        assert_eq!(c.pending("b"), None);
        // a goes: b's CIDR is free and b keeps it (nothing to write but the error).
        c.remove("a");
        let p = c.pending("b").unwrap();
        assert_eq!(p.pod_cidrs, None);
        assert_eq!(p.status_error.as_deref(), Some(""));
        assert_eq!(c.held("b"), Some(nets(&["10.0.5.0/24"]).as_slice()));
    }

    #[test]
    fn a_second_family_is_added_after_the_list() {
        let mut c = cidrs(&["10.0.0.0/16"], &["fd00::/104"]);
        c.observe(node("a", &["10.0.7.0/24"]));
        c.observe(node("b", &["fd00::/120"]));
        assert_eq!(
            c.pending("a"),
            None,
            "nothing allocated before the list is done"
        );
        c.list_done(&["a".into(), "b".into()].into());
        // b's IPv6 CIDR was re-adopted before a got a fresh one.
        assert_eq!(
            cidrs_write(&c.pending("a")),
            Some(nets(&["10.0.7.0/24", "fd00::100/120"]))
        );
        assert_eq!(
            cidrs_write(&c.pending("b")),
            Some(nets(&["10.0.0.0/24", "fd00::/120"]))
        );
    }

    #[test]
    fn a_relist_forgets_nodes_that_are_gone() {
        let mut c = cidrs(&["10.90.0.0/24"], &[]);
        c.observe(node("a", &["10.90.0.0/24"]));
        c.list_done(&["a".into()].into());
        c.observe(node("b", &[]));
        assert_eq!(
            c.pending("b").and_then(|p| p.status_error).as_deref(),
            Some("allocator full")
        );
        // The watch lost a's deletion; the relist does not list it.
        c.observe(node("b", &[]));
        c.list_done(&["b".into()].into());
        assert_eq!(cidrs_write(&c.pending("b")), Some(nets(&["10.90.0.0/24"])));
        assert_eq!(c.held("a"), None);
    }

    #[test]
    fn someone_elses_cidrs_are_reported_not_fought() {
        let mut c = cidrs(&["10.0.0.0/16"], &[]);
        c.list_done(&BTreeSet::new());
        c.observe(node("a", &["10.0.0.0/24"]));
        c.observe(node("a", &["10.0.9.0/24"]));
        let p = c.pending("a").unwrap();
        assert_eq!(p.pod_cidrs, None);
        assert!(
            p.status_error
                .as_deref()
                .is_some_and(|e| e.contains("that conflict with requested CIDRs")),
            "{p:?}"
        );
        assert_eq!(c.held("a"), Some(nets(&["10.0.0.0/24"]).as_slice()));
    }

    #[test]
    fn ignored_nodes_are_left_alone_but_their_cidrs_stay_taken() {
        let mut c = cidrs(&["10.90.0.0/23"], &[]);
        c.observe(Observed {
            ignored: true,
            ..node("x", &["10.90.0.0/24"])
        });
        c.observe(Observed {
            ignored: true,
            ..node("y", &[])
        });
        c.list_done(&["x".into(), "y".into()].into());
        assert_eq!(c.pending("x"), None);
        assert_eq!(c.pending("y"), None);
        c.observe(node("z", &[]));
        assert_eq!(cidrs_write(&c.pending("z")), Some(nets(&["10.90.1.0/24"])));
    }

    /// `node` with the agent's verdicts.
    fn judged(name: &str, pod_cidrs: &[&str], verdicts: &[(&str, PodCidrState)]) -> Observed {
        Observed {
            cidr_status: verdicts
                .iter()
                .map(|(c, s)| (c.parse().unwrap(), *s))
                .collect(),
            ..node(name, pod_cidrs)
        }
    }

    use PodCidrState::{Depleted, InUse, Released};

    #[test]
    fn a_depleted_node_gets_one_extra_cidr_per_depletion() {
        let mut c = cidrs(&["10.0.0.0/22"], &[]);
        c.observe(node("a", &["10.0.0.0/24"]));
        c.list_done(&["a".into()].into());
        c.observe(judged("a", &["10.0.0.0/24"], &[("10.0.0.0/24", Depleted)]));
        let p = c.pending("a").unwrap();
        assert_eq!(p.pod_cidrs, Some(nets(&["10.0.0.0/24", "10.0.1.0/24"])));
        assert_eq!(p.events[0].reason, REASON_EXTRA_ALLOCATED);
        assert!(!p.events[0].warning);
        c.written("a", &p);
        // Late events (the old list, the old verdict) ask for nothing more and
        // are no conflict.
        c.observe(judged("a", &["10.0.0.0/24"], &[("10.0.0.0/24", Depleted)]));
        c.observe(judged("a", &["10.0.0.0/24"], &[("10.0.0.0/24", Depleted)]));
        assert_eq!(
            cidrs_write(&c.pending("a")),
            Some(nets(&["10.0.0.0/24", "10.0.1.0/24"]))
        );
        // The write lands; the agent has not judged the new CIDR yet: nothing.
        let both = ["10.0.0.0/24", "10.0.1.0/24"];
        c.observe(judged("a", &both, &[("10.0.0.0/24", Depleted)]));
        assert_eq!(c.pending("a"), None);
        c.observe(judged(
            "a",
            &both,
            &[("10.0.0.0/24", InUse), ("10.0.1.0/24", InUse)],
        ));
        assert_eq!(c.pending("a"), None);
        assert_eq!(c.held("a"), Some(nets(&both).as_slice()));
    }

    #[test]
    fn the_extra_cidrs_stop_at_the_cap() {
        let mut c = cidrs(&["10.0.0.0/20"], &[]);
        c.observe(node("a", &["10.0.0.0/24", "10.0.1.0/24", "10.0.2.0/24"]));
        c.list_done(&["a".into()].into());
        let all = ["10.0.0.0/24", "10.0.1.0/24", "10.0.2.0/24"];
        let depleted: Vec<(&str, PodCidrState)> = all.iter().map(|c| (*c, Depleted)).collect();
        c.observe(judged("a", &all, &depleted));
        assert_eq!(c.pending("a"), None, "two extra CIDRs already");
        assert_eq!(c.at_cap("a"), [Family::V4]);
    }

    #[test]
    fn an_empty_pool_leaves_the_node_serving_with_an_event_and_a_status_line() {
        let mut c = cidrs(&["10.90.0.0/23"], &[]);
        c.observe(node("a", &["10.90.0.0/24"]));
        c.observe(node("b", &["10.90.1.0/24"]));
        c.list_done(&["a".into(), "b".into()].into());
        c.observe(judged(
            "a",
            &["10.90.0.0/24"],
            &[("10.90.0.0/24", Depleted)],
        ));
        let p = c.pending("a").unwrap();
        assert_eq!(p.pod_cidrs, None, "the node keeps what it has");
        let why = "no extra IPv4 CIDR for node a: cluster-pool-ipv4-cidr 10.90.0.0/23 has no \
                   free /24 left (the node's CIDRs are depleted; it keeps serving from \
                   10.90.0.0/24)";
        assert_eq!(p.status_error.as_deref(), Some(why));
        assert_eq!(p.events.len(), 1);
        assert!(p.events[0].warning);
        assert_eq!(p.events[0].reason, REASON_EXTRA_UNAVAILABLE);
        assert_eq!(p.events[0].note, why);
        c.written("a", &p);
        // Told once: the same verdict again writes nothing.
        c.observe(Observed {
            error: why.into(),
            ..judged("a", &["10.90.0.0/24"], &[("10.90.0.0/24", Depleted)])
        });
        assert_eq!(c.pending("a"), None);
        assert_eq!(c.held("a"), Some(nets(&["10.90.0.0/24"]).as_slice()));
        // b goes: a gets its CIDR, and the line is cleared.
        let touched = c.remove("b");
        assert!(touched.contains(&"a".to_string()));
        let p = c.pending("a").unwrap();
        assert_eq!(p.pod_cidrs, Some(nets(&["10.90.0.0/24", "10.90.1.0/24"])));
        assert_eq!(p.status_error.as_deref(), Some(""));
    }

    #[test]
    fn the_pool_empty_line_names_every_range_size() {
        let mut c = live("10.90.0.0/24 10.91.0.0/26@26");
        c.observe(node("a", &["10.90.0.0/24"]));
        c.observe(node("b", &["10.91.0.0/26"]));
        c.list_done(&["a".into(), "b".into()].into());
        c.observe(judged(
            "a",
            &["10.90.0.0/24"],
            &[("10.90.0.0/24", Depleted)],
        ));
        assert_eq!(
            c.pending("a").and_then(|p| p.status_error).as_deref(),
            Some(
                "no extra IPv4 CIDR for node a: cluster-pool-ipv4-cidr 10.90.0.0/24, \
                 10.91.0.0/26 has no free /24 or /26 left (the node's CIDRs are depleted; it \
                 keeps serving from 10.90.0.0/24)"
            )
        );
    }

    #[test]
    fn a_node_waiting_for_its_first_cidr_comes_before_an_extra_one() {
        let mut c = cidrs(&["10.90.0.0/23"], &[]);
        c.observe(node("a", &["10.90.0.0/24"]));
        c.observe(node("b", &["10.90.1.0/24"]));
        c.list_done(&["a".into(), "b".into()].into());
        c.observe(judged(
            "a",
            &["10.90.0.0/24"],
            &[("10.90.0.0/24", Depleted)],
        ));
        c.observe(node("new", &[]));
        c.remove("b");
        assert_eq!(
            cidrs_write(&c.pending("new")),
            Some(nets(&["10.90.1.0/24"]))
        );
        assert_eq!(cidrs_write(&c.pending("a")), None);
    }

    #[test]
    fn a_released_extra_cidr_goes_back_and_the_first_never_does() {
        let mut c = cidrs(&["10.0.0.0/22"], &[]);
        let both = ["10.0.0.0/24", "10.0.1.0/24"];
        c.observe(node("a", &both));
        c.list_done(&["a".into()].into());
        c.observe(judged(
            "a",
            &both,
            &[("10.0.0.0/24", Released), ("10.0.1.0/24", InUse)],
        ));
        assert_eq!(c.pending("a"), None, "not the first");
        c.observe(judged(
            "a",
            &both,
            &[("10.0.0.0/24", InUse), ("10.0.1.0/24", Released)],
        ));
        let p = c.pending("a").unwrap();
        assert_eq!(p.pod_cidrs, Some(nets(&["10.0.0.0/24"])));
        assert_eq!(p.events[0].reason, REASON_EXTRA_RELEASED);
        c.written("a", &p);
        // A late event still listing it is no conflict.
        c.observe(judged(
            "a",
            &both,
            &[("10.0.0.0/24", InUse), ("10.0.1.0/24", Released)],
        ));
        assert_eq!(c.pending("a").and_then(|p| p.status_error), None);
        c.observe(judged("a", &["10.0.0.0/24"], &[("10.0.0.0/24", InUse)]));
        assert_eq!(c.pending("a"), None);
        // The freed CIDR is another node's now.
        c.observe(node("b", &[]));
        assert_eq!(cidrs_write(&c.pending("b")), Some(nets(&["10.0.1.0/24"])));
    }

    /// A holds both /24s of the pool, B waits; A's agent releases its extra one.
    fn released_while_b_waits() -> (NodeCidrs, Pending) {
        let mut c = cidrs(&["10.0.0.0/23"], &[]);
        let both = ["10.0.0.0/24", "10.0.1.0/24"];
        c.observe(node("a", &both));
        c.list_done(&["a".into()].into());
        c.observe(node("b", &[]));
        let p = c.pending("b").unwrap();
        assert_eq!(p.status_error.as_deref(), Some("allocator full"));
        c.written("b", &p);
        c.observe(judged(
            "a",
            &both,
            &[("10.0.0.0/24", InUse), ("10.0.1.0/24", Released)],
        ));
        let p = c.pending("a").unwrap();
        assert_eq!(p.pod_cidrs, Some(nets(&["10.0.0.0/24"])));
        (c, p)
    }

    #[test]
    fn a_released_cidr_is_not_given_to_another_node_before_the_write_without_it_is_confirmed() {
        let (mut c, p) = released_while_b_waits();
        // A's write is not confirmed (in flight, failed, to be retried): B's
        // write must not list the CIDR A's CiliumNode may still list.
        assert_eq!(
            cidrs_write(&c.pending("b")),
            None,
            "10.0.1.0/24 would be on a and b at once"
        );
        assert_eq!(
            c.pending("a"),
            Some(p.clone()),
            "a's write is retried as it was"
        );
        // Confirmed: the CIDR is free, and B gets it.
        c.observe(judged(
            "a",
            &["10.0.0.0/24"],
            &[("10.0.0.0/24", InUse), ("10.0.1.0/24", Released)],
        ));
        let touched = c.written("a", &p);
        assert!(touched.contains(&"b".to_string()), "{touched:?}");
        assert_eq!(cidrs_write(&c.pending("b")), Some(nets(&["10.0.1.0/24"])));
        assert_eq!(c.pending("a"), None);
    }

    #[test]
    fn a_released_cidr_is_free_once_its_node_is_gone() {
        let (mut c, _) = released_while_b_waits();
        let touched = c.remove("a");
        assert!(touched.contains(&"b".to_string()), "{touched:?}");
        assert_eq!(cidrs_write(&c.pending("b")), Some(nets(&["10.0.0.0/24"])));
    }

    #[test]
    fn a_released_cidr_stays_held_until_a_write_listing_the_rest_went_through() {
        let (mut c, p) = released_while_b_waits();
        // The podCIDRs apply went through and its answer was seen, but the
        // status apply after it failed: no write is confirmed yet. The next
        // write still carries the list, whatever the node showed meanwhile.
        c.observe(judged(
            "a",
            &["10.0.0.0/24"],
            &[("10.0.0.0/24", InUse), ("10.0.1.0/24", Released)],
        ));
        let again = c.pending("a").unwrap();
        assert_eq!(again.pod_cidrs, p.pod_cidrs);
        assert_eq!(cidrs_write(&c.pending("b")), None);
        // A write that does not carry the list frees nothing.
        let status_only = Pending {
            pod_cidrs: None,
            ..again.clone()
        };
        assert!(c.written("a", &status_only).is_empty());
        assert_eq!(cidrs_write(&c.pending("b")), None);
        c.written("a", &again);
        assert_eq!(c.pending("a"), None);
        assert_eq!(cidrs_write(&c.pending("b")), Some(nets(&["10.0.1.0/24"])));
    }

    #[test]
    fn the_podcidrs_write_carries_the_newest_resource_version_seen() {
        let mut c = cidrs(&["10.0.0.0/22"], &[]);
        c.list_done(&BTreeSet::new());
        let seen = |rv: &str| Observed {
            resource_version: rv.into(),
            ..node("a", &[])
        };
        c.observe(seen("7"));
        assert_eq!(
            c.pending("a").map(|p| p.resource_version).as_deref(),
            Some("7")
        );
        // A late event (older) does not take the precondition back.
        c.observe(seen("9"));
        c.observe(seen("8"));
        assert_eq!(
            c.pending("a").map(|p| p.resource_version).as_deref(),
            Some("9")
        );
    }

    #[test]
    fn verdicts_said_before_the_list_are_acted_on_at_its_end() {
        let mut c = cidrs(&["10.0.0.0/22"], &[]);
        let both = ["10.0.0.0/24", "10.0.1.0/24"];
        c.observe(judged(
            "a",
            &both,
            &[("10.0.0.0/24", InUse), ("10.0.1.0/24", Released)],
        ));
        c.observe(judged("b", &["10.0.2.0/24"], &[("10.0.2.0/24", Depleted)]));
        let touched = c.list_done(&["a".into(), "b".into()].into());
        assert_eq!(touched, ["a", "b"]);
        assert_eq!(cidrs_write(&c.pending("a")), Some(nets(&both[..1])));
        // The released CIDR is still a's until that write went through.
        assert_eq!(
            cidrs_write(&c.pending("b")),
            Some(nets(&["10.0.2.0/24", "10.0.3.0/24"]))
        );
    }

    #[test]
    fn a_cidr_the_agent_still_calls_released_is_not_given_back_to_it() {
        let mut c = cidrs(&["10.0.0.0/23"], &[]);
        let both = ["10.0.0.0/24", "10.0.1.0/24"];
        c.observe(node("a", &both));
        c.list_done(&["a".into()].into());
        // Released while the rest is depleted: it goes, and the only other CIDR
        // would be itself: none is given.
        c.observe(judged(
            "a",
            &both,
            &[("10.0.0.0/24", Depleted), ("10.0.1.0/24", Released)],
        ));
        let p = c.pending("a").unwrap();
        assert_eq!(p.pod_cidrs, Some(nets(&["10.0.0.0/24"])));
        assert!(
            p.status_error
                .is_some_and(|e| e.starts_with("no extra IPv4 CIDR for node a"))
        );
    }

    /// An IPv4 pool from an option value (/24 unless an entry says otherwise).
    fn pool(value: &str) -> ClusterPoolConfig {
        let mut c = ClusterPoolConfig::default();
        let entries =
            crate::ipam::clusterpool::parse_pool_list("cluster-pool-ipv4-cidr", value).unwrap();
        c.set_pool(Family::V4, &entries);
        c
    }

    fn live(value: &str) -> NodeCidrs {
        NodeCidrs::new(NodeCidrCarver::new(&pool(value)).unwrap(), 2)
    }

    #[test]
    fn an_appended_cidr_serves_the_waiting_node_at_once() {
        let mut c = live("10.90.0.0/24");
        c.observe(node("a", &["10.90.0.0/24"]));
        c.list_done(&["a".into()].into());
        c.observe(node("b", &[]));
        let p = c.pending("b").unwrap();
        assert_eq!(p.status_error.as_deref(), Some("allocator full"));
        c.written("b", &p);
        c.observe(Observed {
            error: "allocator full".into(),
            ..node("b", &[])
        });
        let touched = c.reconfigure(&pool("10.90.0.0/24 10.91.0.0/24"));
        assert!(touched.contains(&"b".to_string()), "{touched:?}");
        let p = c.pending("b").unwrap();
        assert_eq!(p.pod_cidrs, Some(nets(&["10.91.0.0/24"])));
        assert_eq!(p.status_error.as_deref(), Some(""));
        assert_eq!(c.pending("a"), None, "a keeps its range untouched");
    }

    #[test]
    fn an_appended_cidr_with_its_own_mask_gives_new_nodes_that_size() {
        let mut c = live("10.90.0.0/24");
        c.observe(node("a", &["10.90.0.0/24"]));
        c.list_done(&["a".into()].into());
        c.reconfigure(&pool("10.90.0.0/24 10.91.0.0/24@26"));
        c.observe(node("b", &[]));
        assert_eq!(cidrs_write(&c.pending("b")), Some(nets(&["10.91.0.0/26"])));
        // After a restart the same options re-adopt both sizes.
        let mut again = live("10.90.0.0/24 10.91.0.0/24@26");
        again.observe(node("a", &["10.90.0.0/24"]));
        again.observe(node("b", &["10.91.0.0/26"]));
        again.list_done(&["a".into(), "b".into()].into());
        assert_eq!((again.pending("a"), again.pending("b")), (None, None));
        again.observe(node("c", &[]));
        assert_eq!(
            cidrs_write(&again.pending("c")),
            Some(nets(&["10.91.0.64/26"]))
        );
    }

    #[test]
    fn a_removed_cidr_drains_with_an_event_naming_its_nodes_and_completes_when_they_go() {
        let mut c = live("10.90.0.0/23 10.91.0.0/24");
        c.observe(node("a", &["10.90.0.0/24"]));
        c.observe(node("b", &["10.90.1.0/24"]));
        c.list_done(&["a".into(), "b".into()].into());
        let mut touched = c.reconfigure(&pool("10.91.0.0/24"));
        touched.sort();
        assert_eq!(touched, ["a", "b"]);
        for n in ["a", "b"] {
            let p = c.pending(n).unwrap();
            assert_eq!(p.pod_cidrs, None, "nothing in use is taken away");
            assert_eq!(p.status_error, None, "a drain is no error");
            assert_eq!(p.events.len(), 1);
            assert_eq!(p.events[0].reason, drain::REASON_DRAINING);
            assert!(
                p.events[0].note.contains("(still on it: a, b)"),
                "{:?}",
                p.events
            );
            c.written(n, &p);
            assert_eq!(c.pending(n), None, "said once");
        }
        // a goes; its range is not handed out again: the new node gets the new CIDR.
        c.remove("a");
        c.observe(node("new", &[]));
        assert_eq!(
            cidrs_write(&c.pending("new")),
            Some(nets(&["10.91.0.0/24"]))
        );
        assert_eq!(c.carver.draining().len(), 1, "b is still on it");
        c.remove("b");
        assert!(c.carver.draining().is_empty(), "the removal is complete");
        // Forgotten: it can come back with another mask size.
        c.reconfigure(&pool("10.91.0.0/24 10.90.0.0/23@25"));
        assert!(!c.pool_refused());
        c.observe(node("c", &[]));
        assert_eq!(cidrs_write(&c.pending("c")), Some(nets(&["10.90.0.0/25"])));
    }

    #[test]
    fn after_a_restart_with_another_mask_size_no_range_inside_a_held_one_is_given() {
        // Issue 53: /24 ranges handed out, the mask size changed to 26 (refused
        // while the leader ran), the operator restarted, a new node came.
        let mut c = live("10.244.0.0/22@26");
        c.observe(node("node-1", &["10.244.1.0/24"]));
        c.observe(node("node-2", &["10.244.0.0/24"]));
        c.list_done(&["node-1".into(), "node-2".into()].into());
        for n in ["node-1", "node-2"] {
            let p = c.pending(n).unwrap();
            assert_eq!((p.pod_cidrs.clone(), p.status_error.clone()), (None, None));
            assert_eq!(
                p.events[0].note,
                format!(
                    "node {n} holds {}, inside pool CIDR 10.244.0.0/22 whose node ranges \
                     are /26: the node keeps it until it is deleted, and no range inside it \
                     goes to another node",
                    c.held(n).unwrap()[0]
                )
            );
        }
        c.observe(node("node-3", &[]));
        assert_eq!(
            cidrs_write(&c.pending("node-3")),
            Some(nets(&["10.244.2.0/26"]))
        );
        // node-2 goes: its /24 is free again, in /26 ranges.
        c.remove("node-2");
        c.observe(node("node-4", &[]));
        c.observe(node("node-5", &[]));
        let given: Vec<IpNet> = ["node-4", "node-5"]
            .iter()
            .filter_map(|n| cidrs_write(&c.pending(n)))
            .flatten()
            .collect();
        assert_eq!(given, nets(&["10.244.2.64/26", "10.244.2.128/26"]));
    }

    #[test]
    fn a_pool_read_before_the_first_list_is_judged_on_what_the_nodes_hold() {
        // The reload came before the list: taken at once, the /24 pool CIDR
        // would be forgotten (no range of it held yet) and its /26 ranges
        // handed out over a's.
        let mut c = live("10.90.0.0/24");
        c.reconfigure(&pool("10.90.0.0/24@26"));
        c.observe(node("a", &["10.90.0.0/24"]));
        c.list_done(&["a".into()].into());
        assert!(c.pool_refused(), "the mask change is refused as it is live");
        c.observe(node("b", &[]));
        assert!(cidrs_write(&c.pending("b")).is_none());
        assert!(
            c.pending("b")
                .and_then(|p| p.status_error)
                .is_some_and(|e| e == "allocator full")
        );
    }

    #[test]
    fn options_that_do_not_parse_are_refused_until_a_pool_is_read_and_taken_ones_recorded() {
        let (tx, rx) = watch::channel(None);
        let in_force = pool("10.90.0.0/24");
        let mut c = live("10.90.0.0/24").recording(&in_force, tx);
        assert_eq!(rx.borrow().clone(), Some(in_force.to_record()));
        c.observe(node("a", &["10.90.0.0/24"]));
        c.list_done(&["a".into()].into());
        c.read(PoolRead::Malformed("invalid entry".into()));
        assert!(c.pool_refused());
        // A refused pool is not recorded; a taken one is, and ends the refusal.
        c.read(PoolRead::Parsed(pool("10.90.0.0/24@26")));
        assert!(c.pool_refused());
        assert_eq!(rx.borrow().clone(), Some(in_force.to_record()));
        c.read(PoolRead::Parsed(pool("10.90.0.0/24 10.91.0.0/24")));
        assert!(!c.pool_refused());
        assert_eq!(
            rx.borrow().clone(),
            Some(pool("10.90.0.0/24 10.91.0.0/24").to_record())
        );
    }

    #[test]
    fn a_refused_pool_leaves_the_one_in_force() {
        let mut c = live("10.90.0.0/24");
        c.observe(node("a", &["10.90.0.0/24"]));
        c.list_done(&["a".into()].into());
        assert!(
            c.reconfigure(&pool("10.91.0.0/24"))
                .contains(&"a".to_string())
        );
        // The drained CIDR with another mask size while a is on it.
        assert!(
            c.reconfigure(&pool("10.91.0.0/24 10.90.0.0/24@26"))
                .is_empty()
        );
        assert!(c.pool_refused());
        c.observe(node("b", &[]));
        assert_eq!(cidrs_write(&c.pending("b")), Some(nets(&["10.91.0.0/24"])));
        c.reconfigure(&pool("10.91.0.0/24"));
        assert!(!c.pool_refused(), "a pool that is taken ends the refusal");
    }

    #[test]
    fn a_pool_refused_for_a_draining_cidr_is_taken_once_its_last_node_goes() {
        let mut c = live("10.90.0.0/24 10.91.0.0/24");
        c.observe(node("a", &["10.90.0.0/24"]));
        c.list_done(&["a".into()].into());
        c.reconfigure(&pool("10.91.0.0/24"));
        c.reconfigure(&pool("10.91.0.0/24 10.90.0.0/24@26"));
        assert!(c.pool_refused());
        c.remove("a");
        assert!(!c.pool_refused());
        c.observe(node("b", &[]));
        c.observe(node("c", &[]));
        assert_eq!(cidrs_write(&c.pending("b")), Some(nets(&["10.91.0.0/24"])));
        assert_eq!(cidrs_write(&c.pending("c")), Some(nets(&["10.90.0.0/26"])));
    }

    #[test]
    fn after_a_restart_a_range_in_no_pool_cidr_is_kept_and_said() {
        let mut c = live("10.91.0.0/24");
        c.observe(node("a", &["10.90.0.0/24"]));
        c.list_done(&["a".into()].into());
        let p = c.pending("a").unwrap();
        assert_eq!((p.pod_cidrs.clone(), p.status_error.clone()), (None, None));
        assert_eq!(p.events[0].reason, drain::REASON_DRAINING);
        assert!(
            p.events[0]
                .note
                .starts_with("node a holds 10.90.0.0/24, in no pool CIDR")
        );
        assert_eq!(c.held("a"), Some(nets(&["10.90.0.0/24"]).as_slice()));
        // A node that comes later with a range outside the pool is a conflict.
        c.observe(node("b", &["10.92.0.0/24"]));
        assert!(
            c.pending("b")
                .and_then(|p| p.status_error)
                .is_some_and(|e| e.contains("is not in any pool"))
        );
    }
}
