//! Start-up: rebuild the state from the journal, then reconcile it with the kernel.
//! Who wins when the sources disagree (each decision is logged and counted in the
//! restore report that status shows; nothing is dropped silently):
//! - journal allocation outside the node's current ranges: kept (the pod still has
//!   the address) but never handed out again; DEL releases it;
//! - pending allocation whose expiration passed while the daemon was down: released
//!   at once (it never served a pod, so no cooldown; its host link, if any, is then
//!   an unaccounted link this journal made, and is removed below); one journaled
//!   with its endpoint (a one-round-trip ADD) is left to its timer, due at once,
//!   which binds it if its host link is marked wired and releases it otherwise;
//! - cooling address whose cooldown ended while the daemon was down: freed;
//! - bound allocation whose host link is gone: the pod's netns is gone (deleting a
//!   netns destroys the veth pair), so the address is released (into cooldown);
//! - host link (`lxc…`) no allocation accounts for: removed only when its marker
//!   (`datapath::link_marker`) shows it was made under this very journal at a commit the
//!   journal has (so the journal saw the attachment and released it). Otherwise the
//!   journal never knew the link (it is new, was lost or rebuilt, or is older than
//!   the link): the link's routed addresses are adopted, and a link with nothing to
//!   adopt is left alone. A journal's silence is never a reason to delete a pod.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ipnet::IpNet;

use super::super::config::IpamMode;
use super::super::metrics::Metrics;
use super::allocations::Allocations;
use super::ledger::Ledger;
use super::node_sync::NodeSync;
use super::{
    Allocation, ApiError, DEFAULT_POOL, HOLD_UNTIL_TEARDOWN, IpamState, StateConfig, Timer,
    TimerKind,
};
use crate::datapath::host_ifname;
use crate::datapath::link_marker::LinkMarker;
use crate::ipam::Family;
use crate::ipam::multipool::{PoolError, PoolSet};
use crate::ipam::pooldef::PoolDef;
use crate::node::{NodeOperator, NodeResource};
use crate::store::{
    AllocationRecord, AllocationState, EndpointRecord, Journal, JournalOp, Snapshot, StoreError,
    now_ms,
};

/// What restore and reconciliation decided, each address or link named with
/// its owner (podnet's status shows it, the restore gauges count it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Allocations the journal brought back.
    pub restored: usize,
    /// Pending allocations that expired while the daemon was down.
    pub expired: usize,
    /// Cooling addresses whose cooldown ended while the daemon was down.
    pub cooled_down: usize,
    /// DELs replayed from the on-disk queue.
    pub queued_deletes: usize,
    /// Allocations kept outside the node's current ranges.
    pub outside_ranges: Vec<String>,
    /// Bound allocations released: their host link was gone.
    pub released_link_gone: Vec<String>,
    /// Host links removed: no allocation accounted for them.
    pub orphan_links_removed: Vec<String>,
    /// Addresses adopted from host links the journal did not know.
    pub adopted_from_kernel: Vec<String>,
    /// Why the kernel's addresses were adopted (empty: none were).
    pub adopted_because: String,
    /// Host links left alone: not provably this journal's, nothing to adopt.
    pub unaccounted_links_kept: Vec<String>,
}

/// What the kernel shows of the node's pods: host-side links and the host routes
/// (/32, /128) through each.
#[derive(Debug, Clone, Default)]
pub struct KernelView {
    pub links: Vec<KernelLink>,
}

/// One host-side link, the addresses routed through it and its podnet marker.
#[derive(Debug, Clone, Default)]
pub struct KernelLink {
    pub name: String,
    pub routed: Vec<IpAddr>,
    pub marker: Option<LinkMarker>,
}

/// Where the journal the daemon started with came from: what it can vouch for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalOrigin {
    /// Read from the file the previous run wrote.
    Existing,
    /// The file was missing or empty: it knows nothing of what ran before.
    Created,
    /// The file was unreadable and moved aside (`--rebuild-from-kernel`).
    Rebuilt,
}

/// What restore does with a host link no allocation accounts for.
#[derive(Debug, Clone, PartialEq)]
enum LinkVerdict {
    /// The journal recorded the attachment and released it: the link is stale.
    Remove,
    /// The journal never knew the link: take over its addresses (why).
    Adopt(String),
}

/// Why the state could not be restored from the journal, or reconciled with the
/// kernel, or its router addresses reserved. Each says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The journal could not be read.
    #[error(transparent)]
    Journal(#[from] StoreError),
    /// The journal holds one address twice.
    #[error(
        "journal {}: {ip} is recorded twice (pool {pool}, owner {owner}); restart with --rebuild-from-kernel to rebuild the journal",
        .path.display()
    )]
    RecordedTwice {
        path: PathBuf,
        ip: IpAddr,
        pool: String,
        owner: String,
    },
    /// The node resource could not be encoded for the journal.
    #[error("cannot encode the node resource for the journal: {0}")]
    EncodeNode(#[source] serde_json::Error),
    /// Delegated-plugin mode needs the router address given.
    #[error(
        "delegated-plugin mode takes no addresses from IPAM: give the {} router address with --local-router-ipv{}",
        .family.label(),
        if *.family == Family::V4 { 4 } else { 6 }
    )]
    RouterAddressMissing { family: Family },
    /// The default pool has no address left for a router (health, ingress) address.
    #[error(
        "unable to allocate {owner} {}: {source}, see https://cilium.link/ipam-range-full",
        .family.label()
    )]
    InfraAddress {
        owner: String,
        family: Family,
        #[source]
        source: PoolError,
    },
    /// The journal did not commit what was decided.
    #[error(transparent)]
    Commit(ApiError),
}

/// What reconciliation wants done to the kernel.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReconcileReport {
    /// Host links to delete (no allocation accounts for them).
    pub links_to_delete: Vec<String>,
}

impl IpamState {
    /// Builds the state for what the node owns (the node resource's CIDRs or
    /// blocks), restores the journal's allocations and endpoints and lets the
    /// backend meet the pools' demand. The router (health, ingress) addresses are
    /// reserved later, after the kernel's links were reconciled (adopted pod
    /// addresses must not be taken for them).
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        cfg: StateConfig,
        journal: Journal,
        node: NodeResource,
        operator: Option<Box<dyn NodeOperator>>,
        pool_defs: Vec<PoolDef>,
        snapshot: Snapshot,
        metrics: Arc<Metrics>,
    ) -> Result<IpamState, RestoreError> {
        let cooldown = cfg.cooldown;
        let mut state = IpamState {
            cfg,
            pools: PoolSet::new(),
            routers: BTreeMap::new(),
            metadata: None,
            ledger: Ledger::new(journal, cooldown),
            sync: NodeSync::new(node, operator, pool_defs),
            effects: super::Effects::default(),
            restore_report: RestoreReport::default(),
            metrics,
            failures: VecDeque::new(),
            fit: super::fit::Fit::default(),
            room_sent: None,
        };
        state.apply_node_blocks();
        let mut report = RestoreReport::default();
        let mut ops = Vec::new();
        let now = now_ms();
        // Records stream from the journal one at a time into compact slots. Each
        // block's cursor goes after its newest allocation (on equal times the
        // later record in key order, as a stable sort by age would leave it).
        // An expired address journaled with its endpoint waits for its timer (due at
        // once), which binds it if the host link says the ADD finished.
        let endpoints: BTreeSet<String> = snapshot.endpoints.iter().map(|e| e.key()).collect();
        let has_endpoint = |rec: &AllocationRecord| match (&rec.container_id, &rec.ifname) {
            (Some(cid), Some(ifname)) => endpoints.contains(&EndpointRecord::key_of(cid, ifname)),
            _ => false,
        };
        let mut loader = Allocations::loader();
        let mut newest: BTreeMap<IpNet, (u64, IpAddr)> = BTreeMap::new();
        let journal = state.ledger.journal();
        let pools = &mut state.pools;
        let effects = &mut state.effects;
        journal.for_each_allocation(|rec| -> Result<(), RestoreError> {
            if let Some(lapse) = lapsed_while_down(&rec, now, || has_endpoint(&rec)) {
                match lapse {
                    Lapse::Expired => {
                        tracing::warn!(ip = %rec.ip, owner = ?rec.owner, "Released IP after expiration (expired while the daemon was down)");
                        report.expired += 1;
                    }
                    Lapse::CooledDown => report.cooled_down += 1,
                }
                ops.push(JournalOp::DeleteAllocation {
                    pool: rec.pool,
                    ip: rec.ip,
                });
                return Ok(());
            }
            take_in_pools(pools, &rec, &mut newest, &mut report, journal.path())?;
            if let Some(timer) = timer_of(&rec) {
                effects.arm(timer);
            }
            if rec.state != AllocationState::Cooling {
                report.restored += 1;
            }
            loader.push(rec);
            Ok(())
        })?;
        for (_, ip) in newest.into_values() {
            state.pools.set_cursor_after(ip);
        }
        state.ledger.load(loader.finish(), snapshot);
        state.sync_demand();
        ops.push(state.sync.journal_op().map_err(RestoreError::EncodeNode)?);
        state.ledger.commit(&ops)?;
        state.restore_report = report;
        Ok(state)
    }

    /// Reserves the router (and health, ingress) address of each family: the
    /// journal's, else (router) the router device's, else a new one.
    pub fn reserve_infra_addresses(&mut self, router_hints: &[IpAddr]) -> Result<(), RestoreError> {
        let mut ops = Vec::new();
        let mut infra = vec!["router"];
        if self.cfg.reserve_health {
            infra.push("health");
        }
        if self.cfg.reserve_ingress {
            infra.push("ingress");
        }
        let delegated = self.cfg.ipam_mode == IpamMode::DelegatedPlugin;
        for family in self.cfg.families.clone() {
            if let Some(ip) = self.cfg.fixed_routers.get(&family).copied() {
                self.routers.insert(family, ip);
                self.sync.set_router(ip);
            } else if delegated {
                return Err(RestoreError::RouterAddressMissing { family });
            }
            if delegated {
                continue;
            }
            for owner in &infra {
                if *owner == "router" && self.routers.contains_key(&family) {
                    continue;
                }
                let ip = self.reserve_infra(family, owner, router_hints, &mut ops)?;
                match (*owner, family) {
                    ("router", _) => {
                        self.routers.insert(family, ip);
                        self.sync.set_router(ip);
                    }
                    ("health", _) => self.sync.set_health(family, ip),
                    _ => {}
                }
            }
        }
        ops.push(self.sync.journal_op().map_err(RestoreError::EncodeNode)?);
        self.commit(&ops).map_err(RestoreError::Commit)?;
        self.apply(ops, "router addresses reserved");
        Ok(())
    }

    /// Takes the previous router (health, ingress) address of a family from the
    /// journal, else (router only) the address the router device still carries, else
    /// a new one from the default pool.
    fn reserve_infra(
        &mut self,
        family: Family,
        owner: &str,
        router_hints: &[IpAddr],
        ops: &mut Vec<JournalOp>,
    ) -> Result<IpAddr, RestoreError> {
        if let Some(rec) = self.ledger.allocations().iter().find(|r| {
            r.state() == AllocationState::Infra
                && r.owner() == owner
                && Family::of_addr(&r.ip) == family
        }) {
            return Ok(rec.ip);
        }
        let pool = self.default_pool().to_string();
        let hinted = router_hints
            .iter()
            .filter(|ip| owner == "router" && Family::of_addr(ip) == family)
            .find(|ip| self.pools.locate(**ip).is_some_and(|(p, _)| p == pool))
            .copied();
        let taken = match hinted {
            Some(ip) => self.pools.allocate(&pool, ip).map(|_| ip),
            None => Err(PoolError::NotInRange {
                ip: IpAddr::from([0, 0, 0, 0]),
            }),
        };
        let ip = match taken {
            Ok(ip) => ip,
            Err(_) => self.pools.allocate_next(&pool, family).map_err(|source| {
                RestoreError::InfraAddress {
                    owner: owner.to_string(),
                    family,
                    source,
                }
            })?,
        };
        let mut rec = infra_record(ip, owner);
        rec.pool = pool;
        ops.push(JournalOp::PutAllocation(rec));
        Ok(ip)
    }

    /// The host link an allocation's attachment should have, if it has one.
    fn expected_link(rec: &Allocation) -> Option<String> {
        match (rec.host_ifname(), rec.container_id(), rec.ifname()) {
            (Some(h), _, _) => Some(h.to_string()),
            (None, Some(cid), Some(ifname)) => Some(host_ifname(cid, ifname)),
            _ => None,
        }
    }

    /// Reconciles the restored state with the kernel's host links (see the module
    /// comment for who wins).
    pub fn reconcile_with_kernel(
        &mut self,
        kernel: &KernelView,
        origin: JournalOrigin,
    ) -> Result<ReconcileReport, RestoreError> {
        let present: BTreeSet<&str> = kernel.links.iter().map(|l| l.name.as_str()).collect();
        let now = now_ms();
        let mut ops = Vec::new();
        let mut expected = BTreeSet::new();
        let mut gone = Vec::new();
        for rec in self.ledger.allocations().iter() {
            let Some(link) = Self::expected_link(&rec) else {
                continue;
            };
            match rec.state() {
                AllocationState::Bound if !present.contains(link.as_str()) => {
                    gone.push((rec.record(), link));
                }
                AllocationState::Bound | AllocationState::Pending => {
                    expected.insert(link);
                }
                _ => {}
            }
        }
        // Links of DELs being torn down are finished by the teardown itself.
        for td in self.ledger.teardowns() {
            expected.extend(td.links.iter().map(|l| l.name.clone()));
        }
        for ep in self.ledger.endpoints().values() {
            if present.contains(ep.host_ifname.as_str()) {
                expected.insert(ep.host_ifname.clone());
            } else if ep.external_ipam {
                tracing::warn!(endpoint = %ep.key(), link = %ep.host_ifname, "host link is gone: forgetting the endpoint (its addresses belong to the delegated IPAM plugin)");
                self.restore_report
                    .released_link_gone
                    .push(format!("{} (external IPAM)", ep.owner));
                ops.push(JournalOp::DeleteEndpoint {
                    container_id: ep.container_id.clone(),
                    ifname: ep.ifname.clone(),
                });
            }
        }
        for (rec, link) in gone {
            tracing::warn!(ip = %rec.ip, owner = ?rec.owner, link = %link, "host link is gone (the pod's netns was deleted while the daemon was down): releasing");
            self.restore_report
                .released_link_gone
                .push(format!("{} ({})", rec.ip, rec.owner));
            ops.push(self.ledger.release_op(&rec, now));
            if let (Some(cid), Some(ifname)) = (&rec.container_id, &rec.ifname) {
                let key = EndpointRecord::key_of(cid, ifname);
                if self.ledger.endpoints().contains_key(&key) && !ops.iter().any(|o| matches!(o, JournalOp::DeleteEndpoint { container_id, ifname: i } if container_id == cid && i == ifname)) {
                    ops.push(JournalOp::DeleteEndpoint { container_id: cid.clone(), ifname: ifname.clone() });
                }
            }
        }
        let mut report = ReconcileReport::default();
        for link in &kernel.links {
            if expected.contains(&link.name) {
                continue;
            }
            match self.judge_link(link, origin) {
                LinkVerdict::Remove => {
                    tracing::warn!(link = %link.name, routed = ?link.routed, "host link without an allocation, made under this journal, which released it: removing it");
                    self.restore_report
                        .orphan_links_removed
                        .push(link.name.clone());
                    report.links_to_delete.push(link.name.clone());
                }
                LinkVerdict::Adopt(why) => match self.adopt_link(link, &mut ops) {
                    Some(adopted) => {
                        tracing::warn!(link = %link.name, addresses = ?adopted, because = %why, "adopted a pod's addresses from the kernel");
                        self.restore_report.adopted_from_kernel.extend(adopted);
                        if self.restore_report.adopted_because.is_empty() {
                            self.restore_report.adopted_because = why;
                        }
                    }
                    None => {
                        tracing::warn!(link = %link.name, routed = ?link.routed, because = %why, "host link without an allocation and without an address to adopt: leaving it alone");
                        self.restore_report
                            .unaccounted_links_kept
                            .push(link.name.clone());
                    }
                },
            }
        }
        self.commit(&ops).map_err(RestoreError::Commit)?;
        self.apply(ops, "reconciled with the kernel");
        Ok(report)
    }

    /// Decides what to do with a host link no allocation accounts for.
    fn judge_link(&self, link: &KernelLink, origin: JournalOrigin) -> LinkVerdict {
        let journal = self.ledger.journal();
        let path = journal.path().display();
        match origin {
            JournalOrigin::Created => {
                return LinkVerdict::Adopt(format!(
                    "the journal {path} was missing or empty at start, so it cannot account for running pods"
                ));
            }
            JournalOrigin::Rebuilt => {
                return LinkVerdict::Adopt(format!(
                    "the journal was unreadable and moved aside; {path} is rebuilt from the kernel"
                ));
            }
            JournalOrigin::Existing => {}
        }
        let Some(marker) = &link.marker else {
            return LinkVerdict::Adopt(
                "the link carries no podnet marker, so the journal cannot vouch that it released it".into(),
            );
        };
        let mark = &marker.journal;
        if mark.journal_id != journal.id() {
            return LinkVerdict::Adopt(format!(
                "the link was made under journal {}, not this one ({})",
                mark.journal_id,
                journal.id()
            ));
        }
        if mark.seq > journal.seq_at_open() {
            return LinkVerdict::Adopt(format!(
                "the link is newer than the journal (made at commit {}, the journal ends at {}): the journal lost commits",
                mark.seq,
                journal.seq_at_open()
            ));
        }
        LinkVerdict::Remove
    }

    /// Takes over the addresses routed through a link, with the attachment its
    /// marker names (then DEL, CHECK and GC work for it as for any pod). Returns
    /// None when none of them can be taken.
    fn adopt_link(&mut self, link: &KernelLink, ops: &mut Vec<JournalOp>) -> Option<Vec<String>> {
        let marker = link.marker.as_ref();
        let attachment = marker.and_then(|m| m.container_id.clone().zip(m.ifname.clone()));
        let owner = match marker
            .and_then(|m| m.owner.clone())
            .or_else(|| attachment.as_ref().map(|a| a.0.clone()))
        {
            Some(o) => format!("{o} [from kernel]"),
            None => format!("{} [from kernel]", link.name),
        };
        let mut adopted = Vec::new();
        let mut endpoint_ips = (None, None);
        let mut endpoint_pool = None;
        for ip in &link.routed {
            let Some(pool) = self.pools.locate(*ip).map(|(p, _)| p.to_string()) else {
                continue;
            };
            if self.pools.allocate(&pool, *ip).is_err() {
                continue;
            }
            let rec = AllocationRecord {
                ip: *ip,
                family: Family::of_addr(ip),
                pool: pool.clone(),
                owner: owner.clone(),
                container_id: attachment.as_ref().map(|a| a.0.clone()),
                ifname: attachment.as_ref().map(|a| a.1.clone()),
                network: None,
                state: AllocationState::Bound,
                expiration_uuid: None,
                expires_at_ms: None,
                allocated_at_ms: now_ms(),
                host_ifname: Some(link.name.clone()),
                cooling_until_ms: None,
                selected_by: None,
                pod_uid: marker.and_then(|m| m.pod_uid.clone()),
            };
            adopted.push(format!("{ip} ({})", link.name));
            if ip.is_ipv4() {
                endpoint_ips.0 = Some(*ip);
            } else {
                endpoint_ips.1 = Some(*ip);
            }
            endpoint_pool.get_or_insert(pool);
            ops.push(JournalOp::PutAllocation(rec));
        }
        if let (Some((container_id, ifname)), Some(pool)) = (attachment, endpoint_pool) {
            let ep = EndpointRecord {
                container_id,
                ifname,
                host_ifname: link.name.clone(),
                owner: owner.trim_end_matches(" [from kernel]").to_string(),
                ipv4: endpoint_ips.0,
                ipv6: endpoint_ips.1,
                pool,
                netns: None,
                created_at_ms: now_ms(),
                external_ipam: false,
            };
            if !self.ledger.endpoints().contains_key(&ep.key()) {
                ops.push(JournalOp::PutEndpoint(ep));
            }
        }
        (!adopted.is_empty()).then_some(adopted)
    }

    /// Records how many queued DELs were replayed at start.
    pub fn note_queued_deletes(&mut self, n: usize) {
        self.restore_report.queued_deletes += n;
    }

    /// What restore and reconciliation decided.
    pub fn restore_report(&self) -> &RestoreReport {
        &self.restore_report
    }
}

/// How a journaled allocation ran out while the daemon was down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lapse {
    /// Pending, its expiration passed and no endpoint was journaled with it.
    Expired,
    /// Cooling, and its cooldown ended.
    CooledDown,
}

/// Whether `rec` ran out by `now` (then restore releases it at once);
/// `has_endpoint` is asked only of an expired pending one.
fn lapsed_while_down(
    rec: &AllocationRecord,
    now: u64,
    has_endpoint: impl Fn() -> bool,
) -> Option<Lapse> {
    match rec.state {
        AllocationState::Pending
            if rec.expires_at_ms.is_some_and(|t| t <= now) && !has_endpoint() =>
        {
            Some(Lapse::Expired)
        }
        AllocationState::Cooling if rec.cooling_until_ms.is_none_or(|t| t <= now) => {
            Some(Lapse::CooledDown)
        }
        _ => None,
    }
}

/// Marks `rec`'s address taken in its pool and keeps each block's newest
/// allocation (its cursor goes after it). An address outside the node's ranges
/// is kept and reported; one recorded twice fails the restore.
fn take_in_pools(
    pools: &mut PoolSet,
    rec: &AllocationRecord,
    newest: &mut BTreeMap<IpNet, (u64, IpAddr)>,
    report: &mut RestoreReport,
    journal: &Path,
) -> Result<(), RestoreError> {
    match pools.allocate(&rec.pool, rec.ip) {
        Ok(()) => {
            if let Some((_, block)) = pools.locate(rec.ip) {
                let entry = newest.entry(block).or_insert((rec.allocated_at_ms, rec.ip));
                if rec.allocated_at_ms >= entry.0 {
                    *entry = (rec.allocated_at_ms, rec.ip);
                }
            }
        }
        Err(PoolError::AlreadyAllocated { .. }) => {
            return Err(RestoreError::RecordedTwice {
                path: journal.to_path_buf(),
                ip: rec.ip,
                pool: rec.pool.clone(),
                owner: rec.owner.clone(),
            });
        }
        Err(_) => {
            tracing::warn!(ip = %rec.ip, pool = ?rec.pool, owner = ?rec.owner, "journal allocation is outside the node's ranges: kept until its pod is deleted, never handed out again");
            report
                .outside_ranges
                .push(format!("{} ({})", rec.ip, rec.owner));
        }
    }
    Ok(())
}

/// The timer a restored allocation needs: a pending one's expiration, a cooling
/// one's cooldown (none for an address held until its teardown ends).
fn timer_of(rec: &AllocationRecord) -> Option<Timer> {
    match (
        &rec.state,
        &rec.expiration_uuid,
        rec.expires_at_ms,
        rec.cooling_until_ms,
    ) {
        (AllocationState::Pending, Some(uuid), Some(deadline_ms), _) => Some(Timer {
            ip: rec.ip,
            deadline_ms,
            kind: TimerKind::Expire { uuid: uuid.clone() },
        }),
        (AllocationState::Cooling, _, _, Some(until)) if until != HOLD_UNTIL_TEARDOWN => {
            Some(Timer {
                ip: rec.ip,
                deadline_ms: until,
                kind: TimerKind::Cooldown,
            })
        }
        _ => None,
    }
}

pub(super) fn infra_record(ip: IpAddr, owner: &str) -> AllocationRecord {
    AllocationRecord {
        ip,
        family: Family::of_addr(&ip),
        pool: DEFAULT_POOL.into(),
        owner: owner.into(),
        container_id: None,
        ifname: None,
        network: None,
        state: AllocationState::Infra,
        expiration_uuid: None,
        expires_at_ms: None,
        allocated_at_ms: now_ms(),
        host_ifname: None,
        cooling_until_ms: None,
        selected_by: None,
        pod_uid: None,
    }
}
