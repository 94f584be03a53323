//! The ledger: the durable record of who holds which address. It owns the journal
//! and what memory holds of it: every allocation, every endpoint (with the ones
//! restore brought back), and the DELs whose links are being torn down.
//!
//! Invariants:
//! - memory changes only through `apply`, after the ops were committed to the
//!   journal (`commit`); `load` fills memory from what the journal holds at start;
//! - one record per address: a new allocation is refused an address the ledger
//!   already holds, whoever holds it (`claim`);
//! - an address of a DEL whose links are being torn down stays held (cooling
//!   without an end) until its teardown finishes.
//!
//! The ledger decides nothing about pools, timers or the node resource: `apply`
//! reports what it changed ([`Applied`]) and the state acts on it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use super::super::device_error::DeviceError;
use super::allocations::{Allocation, Allocations};
use super::{ApiError, ErrorKind, StaleLink, Timer, TimerKind};
use crate::datapath::host_ifname;
use crate::datapath::link_marker::{JournalMark, LinkMarker};
use crate::ipam::Family;
use crate::node::UsedAddresses;
use crate::resources::AllocationIp;
use crate::store::{
    AllocationRecord, AllocationState, EndpointRecord, Journal, JournalOp, Snapshot, StoreError,
    allocation_key,
};

/// Cooling "until" of an address held while its links are torn down.
pub const HOLD_UNTIL_TEARDOWN: u64 = u64::MAX;
/// The `selected_by` code of a sticky address (`state::sticky`): released
/// without the cooldown, since only its own identity may have it again.
pub(super) const STICKY_CODE: &str = "sticky-pool";
/// Journal meta key prefix of pending link teardowns.
pub const TEARDOWN_PREFIX: &str = "teardown/";
/// The first words of the error a client gets while the journal cannot commit.
pub const JOURNAL_UNAVAILABLE: &str = "cannot record the change durably";

/// Reads the podnet marker of a host link by name (none: no link, or no marker;
/// an error: the kernel could not be asked).
pub type HostLinkMarker<'a> = dyn Fn(&str) -> Result<Option<LinkMarker>, DeviceError> + 'a;

/// A DEL's host links the daemon deletes before it releases the addresses
/// (journaled as meta `teardown/…`: the field names are the journal's).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Teardown {
    pub key: String,
    pub links: Vec<TeardownLink>,
    pub ips: Vec<IpAddr>,
}

/// A host link a teardown deletes: its index, and the name it must still have
/// (an index a newer link reused is left alone).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TeardownLink {
    pub name: String,
    pub index: u32,
}

/// What applying committed ops changed outside the ledger's own maps.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Applied {
    /// The address left the ledger: its allocator bit is free.
    Freed(IpAddr),
    /// A live address was released (counted once, when it stops serving).
    Released(Family),
    /// A timer to arm (expiration of a pending address, end of a cooldown).
    Timer(Timer),
}

/// The journal and the allocations, endpoints and teardowns it records.
pub(super) struct Ledger {
    journal: Journal,
    allocations: Allocations,
    endpoints: BTreeMap<String, EndpointRecord>,
    restored_endpoints: BTreeSet<String>,
    /// DELs whose links are being torn down, by journal key.
    teardowns: BTreeMap<String, Teardown>,
    /// How long a released address cools before it can be handed out again.
    cooldown: Duration,
}

/// `rec` held: cooling with no end, until its teardown finishes.
pub(super) fn held(rec: &AllocationRecord) -> AllocationRecord {
    cooling(rec, HOLD_UNTIL_TEARDOWN)
}

/// `rec` released into the cooling state until `until_ms`: the attachment's
/// fields are cleared, owner and pool stay for `status` and `explain`.
fn cooling(rec: &AllocationRecord, until_ms: u64) -> AllocationRecord {
    AllocationRecord {
        state: AllocationState::Cooling,
        container_id: None,
        ifname: None,
        network: None,
        expiration_uuid: None,
        expires_at_ms: None,
        host_ifname: None,
        cooling_until_ms: Some(until_ms),
        ..rec.clone()
    }
}

impl Ledger {
    /// An empty ledger over `journal` (memory is filled by `load`).
    pub(super) fn new(journal: Journal, cooldown: Duration) -> Ledger {
        Ledger {
            journal,
            allocations: Allocations::default(),
            endpoints: BTreeMap::new(),
            restored_endpoints: BTreeSet::new(),
            teardowns: BTreeMap::new(),
            cooldown,
        }
    }

    /// Fills memory with what the journal holds at start: the allocations restore
    /// kept, and the snapshot's endpoints (all of them restored) and teardowns.
    pub(super) fn load(&mut self, allocations: Allocations, snapshot: Snapshot) {
        self.allocations = allocations;
        for (key, value) in snapshot.meta {
            if key.starts_with(TEARDOWN_PREFIX)
                && let Ok(td) = serde_json::from_value::<Teardown>(value)
            {
                self.teardowns.insert(key, td);
            }
        }
        self.endpoints = snapshot
            .endpoints
            .into_iter()
            .map(|e| (e.key(), e))
            .collect();
        self.restored_endpoints = self.endpoints.keys().cloned().collect();
    }

    pub(super) fn journal(&self) -> &Journal {
        &self.journal
    }

    pub(super) fn allocations(&self) -> &Allocations {
        &self.allocations
    }

    pub(super) fn endpoints(&self) -> &BTreeMap<String, EndpointRecord> {
        &self.endpoints
    }

    /// Whether the endpoint of (container ID, interface) was brought back by restore.
    pub(super) fn is_restored(&self, container_id: &str, ifname: &str) -> bool {
        self.restored_endpoints
            .contains(&EndpointRecord::key_of(container_id, ifname))
    }

    pub(super) fn teardowns(&self) -> impl Iterator<Item = &Teardown> {
        self.teardowns.values()
    }

    /// The journal's identity and last commit (what host links are marked with).
    pub(super) fn journal_mark(&self) -> JournalMark {
        JournalMark {
            journal_id: self.journal.id().to_string(),
            seq: self.journal.seq(),
        }
    }

    /// Commits `ops` to the journal (memory is changed by `apply` afterwards).
    pub(super) fn commit(&mut self, ops: &[JournalOp]) -> Result<(), StoreError> {
        self.journal.commit(ops)
    }

    /// What a client is told while the journal cannot commit.
    pub(super) fn unavailable(&self, detail: &str) -> String {
        let dir = self
            .journal
            .path()
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let hint = if self.journal.failure().is_some_and(|f| f.no_space) {
            format!("the filesystem of the state directory {dir} is full: free space there")
        } else {
            format!("check the state directory {dir} and the kernel log for I/O errors")
        };
        format!(
            "{JOURNAL_UNAVAILABLE}: {detail}; {hint} (the daemon reopens the journal by itself once it can write)"
        )
    }

    /// Brings a failed journal back: reopens it (at most once a second), checks it
    /// against memory (what clients were told) and writes whatever differs, with
    /// `node` (the node resource's op) last. None when the journal was not failed;
    /// else whether it works now.
    pub(super) fn recover(&mut self, node: Option<JournalOp>) -> Option<bool> {
        self.journal.failure()?;
        let fixes = match self.journal.reopen()? {
            Ok(snapshot) => self.journal_fixes(&self.journal, snapshot, node),
            Err(e) => Err(e),
        };
        let fixes = match fixes {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "journal still unavailable");
                return Some(false);
            }
        };
        let n = fixes.len();
        match self.journal.commit(&fixes) {
            Ok(()) => {
                tracing::warn!(
                    rewritten = n,
                    journal = %self.journal.path().display(),
                    "journal reopened after a failure and checked against the state in memory"
                );
                Some(true)
            }
            Err(e) => {
                tracing::warn!(error = %e, "journal reopened, but it still cannot commit");
                Some(false)
            }
        }
    }

    /// The ops that make `journal` (its allocations, and the rest in `snapshot`)
    /// hold exactly what memory holds, with `node` (the node resource) last.
    pub(super) fn journal_fixes(
        &self,
        journal: &Journal,
        snapshot: Snapshot,
        node: Option<JournalOp>,
    ) -> Result<Vec<JournalOp>, StoreError> {
        let mut ops = Vec::new();
        let mut seen = BTreeSet::new();
        journal.for_each_allocation(|rec| {
            match self.allocations.get(&rec.ip) {
                Some(mem) if mem.pool() == rec.pool => {
                    let mem = mem.record();
                    if mem != rec {
                        ops.push(JournalOp::PutAllocation(mem));
                    }
                }
                _ => ops.push(JournalOp::DeleteAllocation {
                    pool: rec.pool.clone(),
                    ip: rec.ip,
                }),
            }
            seen.insert(rec.key());
            Ok(())
        })?;
        ops.extend(
            self.allocations
                .iter()
                .filter(|r| !seen.contains(&allocation_key(r.pool(), &r.ip)))
                .map(|r| JournalOp::PutAllocation(r.record())),
        );
        let mut seen = BTreeSet::new();
        for ep in snapshot.endpoints {
            match self.endpoints.get(&ep.key()) {
                Some(mem) if *mem == ep => {}
                Some(mem) => ops.push(JournalOp::PutEndpoint(mem.clone())),
                None => ops.push(JournalOp::DeleteEndpoint {
                    container_id: ep.container_id.clone(),
                    ifname: ep.ifname.clone(),
                }),
            }
            seen.insert(ep.key());
        }
        ops.extend(
            self.endpoints
                .iter()
                .filter(|(k, _)| !seen.contains(*k))
                .map(|(_, e)| JournalOp::PutEndpoint(e.clone())),
        );
        for (key, _) in &snapshot.meta {
            if key.starts_with(TEARDOWN_PREFIX) && !self.teardowns.contains_key(key) {
                ops.push(JournalOp::DeleteMeta { key: key.clone() });
            }
        }
        for (key, td) in &self.teardowns {
            if let Ok(value) = serde_json::to_value(td) {
                ops.push(JournalOp::PutMeta {
                    key: key.clone(),
                    value,
                });
            }
        }
        ops.extend(node);
        Ok(ops)
    }

    /// Refuses a new allocation of an address the ledger already holds (for
    /// another pod, the node, or cooling down): one record per address.
    pub(super) fn claim(&self, ip: IpAddr) -> Result<(), ApiError> {
        match self.allocations.get(&ip) {
            None => Ok(()),
            Some(held) => Err(ApiError::new(
                ErrorKind::Conflict,
                format!(
                    "IP {ip} is already recorded for {:?} ({:?}, pool {})",
                    held.owner(),
                    held.state(),
                    held.pool()
                ),
            )),
        }
    }

    /// The journal op that releases `rec`: straight back to the pool without a
    /// cooldown (or for a sticky address), else into the cooling state.
    pub(super) fn release_op(&self, rec: &AllocationRecord, now: u64) -> JournalOp {
        if self.cooldown.is_zero() || rec.selected_by.as_deref() == Some(STICKY_CODE) {
            JournalOp::DeleteAllocation {
                pool: rec.pool.clone(),
                ip: rec.ip,
            }
        } else {
            JournalOp::PutAllocation(cooling(rec, now + self.cooldown.as_millis() as u64))
        }
    }

    /// Applies committed ops to memory and reports to `changed` what the rest of
    /// the state acts on (allocator bits, release counts, timers).
    pub(super) fn apply(
        &mut self,
        ops: Vec<JournalOp>,
        why: &str,
        mut changed: impl FnMut(Applied),
    ) {
        for op in ops {
            match op {
                JournalOp::DeleteAllocation { ip, .. } => {
                    if let Some(rec) = self.allocations.remove(&ip)
                        && rec.state != AllocationState::Cooling
                    {
                        tracing::info!(ip = %ip, owner = ?rec.owner, reason = why, "released");
                        changed(Applied::Released(rec.family));
                    }
                    changed(Applied::Freed(ip));
                }
                JournalOp::PutAllocation(rec) => {
                    // A held address that starts its cooldown was already counted.
                    let was_cooling = self
                        .allocations
                        .get(&rec.ip)
                        .is_some_and(|r| r.state() == AllocationState::Cooling);
                    match (
                        &rec.state,
                        rec.cooling_until_ms,
                        &rec.expiration_uuid,
                        rec.expires_at_ms,
                    ) {
                        (AllocationState::Cooling, Some(HOLD_UNTIL_TEARDOWN), _, _) => {
                            tracing::info!(ip = %rec.ip, owner = ?rec.owner, reason = why, "released (held until its links are gone)");
                            changed(Applied::Released(rec.family));
                        }
                        (AllocationState::Cooling, Some(until), _, _) => {
                            if !was_cooling {
                                tracing::info!(ip = %rec.ip, owner = ?rec.owner, reason = why, "released (cooling down)");
                                changed(Applied::Released(rec.family));
                            }
                            changed(Applied::Timer(Timer {
                                ip: rec.ip,
                                deadline_ms: until,
                                kind: TimerKind::Cooldown,
                            }));
                        }
                        (AllocationState::Pending, _, Some(uuid), Some(deadline)) => {
                            changed(Applied::Timer(Timer {
                                ip: rec.ip,
                                deadline_ms: deadline,
                                kind: TimerKind::Expire { uuid: uuid.clone() },
                            }));
                        }
                        _ => {}
                    }
                    self.allocations.insert(rec);
                }
                JournalOp::PutEndpoint(ep) => {
                    self.endpoints.insert(ep.key(), ep);
                }
                JournalOp::DeleteEndpoint {
                    container_id,
                    ifname,
                } => {
                    let key = EndpointRecord::key_of(&container_id, &ifname);
                    self.endpoints.remove(&key);
                    self.restored_endpoints.remove(&key);
                }
                JournalOp::PutMeta { key, value } => {
                    if key.starts_with(TEARDOWN_PREFIX)
                        && let Ok(td) = serde_json::from_value::<Teardown>(value)
                    {
                        self.teardowns.insert(key, td);
                    }
                }
                JournalOp::DeleteMeta { key } => {
                    self.teardowns.remove(&key);
                }
            }
        }
    }

    /// Adds the journal ops that release every allocation and endpoint of an
    /// attachment (`ifname` None: every interface of the container), including
    /// addresses adopted from the kernel under the attachment's host link name.
    pub(super) fn release_attachment(
        &self,
        container_id: &str,
        ifname: Option<&str>,
        ops: &mut Vec<JournalOp>,
        now: u64,
    ) -> Vec<IpAddr> {
        let mut ips: BTreeSet<IpAddr> = BTreeSet::new();
        // One interface: its records through the index by host link (every ADD and
        // DEL; a walk over all allocations grew with the pods on the node). The whole
        // container (no interface named): every record.
        let link = ifname.map(|i| host_ifname(container_id, i));
        let candidates: Box<dyn Iterator<Item = Allocation<'_>>> = match &link {
            Some(l) => Box::new(self.allocations.of_link(l)),
            None => Box::new(self.allocations.iter()),
        };
        for rec in candidates {
            let adopted = rec.state() != AllocationState::Cooling
                && link.is_some()
                && rec.host_ifname() == link.as_deref();
            if rec.is_for(container_id, ifname) || adopted {
                ips.insert(rec.ip);
            }
        }
        let endpoints: Vec<&EndpointRecord> = match ifname {
            Some(i) => self
                .endpoints
                .get(&EndpointRecord::key_of(container_id, i))
                .into_iter()
                .collect(),
            None => self
                .endpoints
                .range(EndpointRecord::key_of(container_id, "")..)
                .take_while(|(k, _)| k.starts_with(&EndpointRecord::key_of(container_id, "")))
                .map(|(_, e)| e)
                .collect(),
        };
        for ep in endpoints
            .into_iter()
            .filter(|e| e.container_id == container_id && ifname.is_none_or(|i| e.ifname == i))
        {
            ops.push(JournalOp::DeleteEndpoint {
                container_id: ep.container_id.clone(),
                ifname: ep.ifname.clone(),
            });
            ips.extend([ep.ipv4, ep.ipv6].into_iter().flatten().filter(|ip| {
                self.allocations.get(ip).is_some_and(|r| {
                    matches!(r.state(), AllocationState::Bound | AllocationState::Pending)
                })
            }));
        }
        for ip in &ips {
            if let Some(rec) = self.allocations.get(ip) {
                ops.push(self.release_op(&rec.record(), now));
            }
        }
        ips.into_iter().collect()
    }

    /// The ops that bind the attachment's pending addresses (all of them, or
    /// those with one of `uuids`).
    pub(super) fn bind_ops(
        &self,
        cid: &str,
        ifname: &str,
        uuids: Option<&[String]>,
    ) -> Vec<JournalOp> {
        self.allocations
            .of_link(&host_ifname(cid, ifname))
            .filter(|r| r.state() == AllocationState::Pending && r.is_for(cid, Some(ifname)))
            .filter(|r| {
                uuids.is_none_or(|u| {
                    r.expiration_uuid()
                        .is_some_and(|id| u.iter().any(|x| x == id))
                })
            })
            .map(|r| {
                JournalOp::PutAllocation(AllocationRecord {
                    state: AllocationState::Bound,
                    expiration_uuid: None,
                    expires_at_ms: None,
                    ..r.record()
                })
            })
            .collect()
    }

    /// The ops that finish the teardown `key`: its held addresses cool down (or
    /// are free), and the teardown is forgotten. None when there is no such
    /// teardown.
    pub(super) fn finish_teardown_ops(&self, key: &str, now: u64) -> Option<Vec<JournalOp>> {
        let td = self.teardowns.get(key)?;
        let mut ops: Vec<JournalOp> = td
            .ips
            .iter()
            .filter_map(|ip| self.allocations.get(ip))
            .filter(|r| {
                r.state() == AllocationState::Cooling
                    && r.cooling_until_ms() == Some(HOLD_UNTIL_TEARDOWN)
            })
            .map(|r| {
                self.release_op(
                    &AllocationRecord {
                        state: AllocationState::Bound,
                        ..r.record()
                    },
                    now,
                )
            })
            .collect();
        ops.push(JournalOp::DeleteMeta {
            key: key.to_string(),
        });
        Some(ops)
    }

    /// The journal ops of an expiring address, and the host link to remove once
    /// they are committed. An address with a pending endpoint is its whole
    /// attachment: bound if the host link says the ADD finished (`host_link`
    /// reads a link's marker), else released with the endpoint and the link.
    /// None when the link could not be read (the caller tries again later).
    pub(super) fn expiry_ops(
        &self,
        rec: &AllocationRecord,
        host_link: &HostLinkMarker<'_>,
        now: u64,
    ) -> Option<(Vec<JournalOp>, Option<StaleLink>)> {
        let Some(ep) = self.pending_endpoint_of(rec) else {
            tracing::warn!(ip = %rec.ip, owner = ?rec.owner, "Released IP after expiration");
            // Decided before the release (the attachment's other addresses are
            // still live then).
            return Some((
                vec![self.release_op(rec, now)],
                self.expired_attachment_link(rec),
            ));
        };
        let marker = match host_link(&ep.host_ifname) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(ip = %rec.ip, error = %e, "cannot tell whether the expiring attachment was wired: keeping the address and asking again in a second");
                return None;
            }
        };
        if marker.is_some_and(|m| self.wired_for(&m, ep)) {
            tracing::info!(ip = %rec.ip, owner = ?rec.owner, link = %ep.host_ifname, "pending address expired, but its host link is marked wired (the ADD finished): bound");
            return Some((self.bind_ops(&ep.container_id, &ep.ifname, None), None));
        }
        tracing::warn!(ip = %rec.ip, owner = ?rec.owner, link = %ep.host_ifname, "Released IP after expiration (its host link is not marked wired: the ADD never finished)");
        let mut ops = Vec::new();
        self.release_attachment(&ep.container_id, Some(&ep.ifname), &mut ops, now);
        let stale = StaleLink {
            name: ep.host_ifname.clone(),
            made_by: self.journal_mark(),
        };
        Some((ops, Some(stale)))
    }

    /// The host link of an expired allocation's attachment, unless something else
    /// of that attachment still lives (another address, or its endpoint).
    fn expired_attachment_link(&self, rec: &AllocationRecord) -> Option<StaleLink> {
        let (cid, ifname) = (rec.container_id.as_deref()?, rec.ifname.as_deref()?);
        let others = self
            .allocations
            .iter()
            .any(|r| r.ip != rec.ip && r.is_for(cid, Some(ifname)));
        if others
            || self
                .endpoints
                .contains_key(&EndpointRecord::key_of(cid, ifname))
        {
            return None;
        }
        Some(StaleLink {
            name: host_ifname(cid, ifname),
            made_by: self.journal_mark(),
        })
    }

    /// The endpoint journaled with a pending allocation (`pending_endpoint`): the
    /// attachment's endpoint while it lists `rec` and every address it lists is
    /// still pending (a registered endpoint bound its addresses).
    fn pending_endpoint_of(&self, rec: &AllocationRecord) -> Option<&EndpointRecord> {
        let (cid, ifname) = (rec.container_id.as_deref()?, rec.ifname.as_deref()?);
        let ep = self.endpoints.get(&EndpointRecord::key_of(cid, ifname))?;
        let listed = [ep.ipv4, ep.ipv6];
        let all_pending = listed.iter().flatten().all(|ip| {
            self.allocations
                .get(ip)
                .is_some_and(|r| r.state() == AllocationState::Pending)
        });
        (!ep.external_ipam && listed.contains(&Some(rec.ip)) && all_pending).then_some(ep)
    }

    /// Whether a host link's marker shows the ADD of `ep` finished: made under
    /// this journal, for this attachment, and marked wired by the plugin's last
    /// netlink change.
    fn wired_for(&self, marker: &LinkMarker, ep: &EndpointRecord) -> bool {
        marker.wired
            && marker.journal.journal_id == self.journal.id()
            && marker
                .container_id
                .as_deref()
                .is_none_or(|c| c == ep.container_id)
            && marker.ifname.as_deref().is_none_or(|i| i == ep.ifname)
    }

    /// The addresses pods and the node hold (not cooling), as the node resource's
    /// `status.ipam.used` lists them.
    pub(super) fn used_addresses(&self) -> UsedAddresses {
        let mut used = UsedAddresses::default();
        for rec in self
            .allocations
            .iter()
            .filter(|r| r.state() != AllocationState::Cooling)
        {
            let entry = AllocationIp {
                owner: rec.owner().to_string(),
                resource: rec.container_id().unwrap_or_default().to_string(),
            };
            match rec.family() {
                Family::V4 => used.ipv4.insert(rec.ip.to_string(), entry),
                Family::V6 => used.ipv6.insert(rec.ip.to_string(), entry),
            };
        }
        used
    }
}

#[cfg(test)]
mod tests {
    use super::super::restore::infra_record;
    use super::super::tests::journal_in;
    use super::*;
    use crate::test_dir::TestDir;

    const POOL: &str = "default";

    fn ledger(dir: &TestDir, cooldown_s: u64) -> Ledger {
        let (journal, _) = Journal::open(&journal_in(dir)).unwrap();
        Ledger::new(journal, Duration::from_secs(cooldown_s))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn rec(addr: &str, owner: &str, state: AllocationState) -> AllocationRecord {
        AllocationRecord {
            state,
            container_id: Some(format!("c-{owner}")),
            ifname: Some("eth0".into()),
            ..infra_record(ip(addr), owner)
        }
    }

    /// The endpoint of ns/a's attachment (container `c-ns/a`, `eth0`).
    fn endpoint(ipv4: Option<IpAddr>, ipv6: Option<IpAddr>) -> EndpointRecord {
        EndpointRecord {
            container_id: "c-ns/a".into(),
            ifname: "eth0".into(),
            host_ifname: host_ifname("c-ns/a", "eth0"),
            owner: "ns/a".into(),
            ipv4,
            ipv6,
            pool: POOL.into(),
            netns: None,
            created_at_ms: 0,
            external_ipam: false,
        }
    }

    fn get(l: &Ledger, addr: &str) -> AllocationRecord {
        l.allocations().get(&ip(addr)).unwrap().record()
    }

    /// Commits and applies `ops`; what the ledger reported.
    fn run(l: &mut Ledger, ops: Vec<JournalOp>) -> Vec<Applied> {
        l.commit(&ops).unwrap();
        let mut changed = Vec::new();
        l.apply(ops, "test", |c| changed.push(c));
        changed
    }

    fn delete(addr: &str) -> JournalOp {
        JournalOp::DeleteAllocation {
            pool: POOL.into(),
            ip: ip(addr),
        }
    }

    #[test]
    fn an_address_it_holds_is_refused_to_a_new_allocation_until_it_is_free() {
        let dir = TestDir::new("ledger");
        let mut l = ledger(&dir, 30);
        run(
            &mut l,
            vec![JournalOp::PutAllocation(rec(
                "10.0.0.2",
                "ns/a",
                AllocationState::Bound,
            ))],
        );
        let e = l.claim(ip("10.0.0.2")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Conflict);
        assert!(e.message.contains("ns/a"), "{}", e.message);
        assert!(l.claim(ip("10.0.0.3")).is_ok());
        let op = l.release_op(&get(&l, "10.0.0.2"), 1000);
        run(&mut l, vec![op]);
        assert!(l.claim(ip("10.0.0.2")).is_err(), "cooling is still held");
        run(&mut l, vec![delete("10.0.0.2")]);
        assert!(l.claim(ip("10.0.0.2")).is_ok());
    }

    #[test]
    fn a_release_cools_for_the_cooldown_or_frees_at_once_without_one() {
        let dir = TestDir::new("ledger");
        let bound = rec("10.0.0.2", "ns/a", AllocationState::Bound);
        let l = ledger(&dir, 30);
        let JournalOp::PutAllocation(cooled) = l.release_op(&bound, 1000) else {
            panic!("with a cooldown the address cools");
        };
        assert_eq!(cooled.state, AllocationState::Cooling);
        assert_eq!(cooled.cooling_until_ms, Some(31_000));
        assert_eq!((cooled.container_id, cooled.ifname), (None, None));
        assert_eq!(cooled.owner, "ns/a", "the owner stays for status");
        drop(l);
        let l = ledger(&dir, 0);
        assert_eq!(l.release_op(&bound, 1000), delete("10.0.0.2"));
    }

    #[test]
    fn apply_reports_each_release_once_and_the_timers_to_arm() {
        let dir = TestDir::new("ledger");
        let mut l = ledger(&dir, 30);
        let pending = AllocationRecord {
            expiration_uuid: Some("u1".into()),
            expires_at_ms: Some(500),
            ..rec("10.0.0.2", "ns/a", AllocationState::Pending)
        };
        let a = pending.ip;
        assert_eq!(
            run(&mut l, vec![JournalOp::PutAllocation(pending.clone())]),
            [Applied::Timer(Timer {
                ip: a,
                deadline_ms: 500,
                kind: TimerKind::Expire { uuid: "u1".into() },
            })]
        );
        let op = l.release_op(&pending, 1000);
        let cooldown = Applied::Timer(Timer {
            ip: a,
            deadline_ms: 31_000,
            kind: TimerKind::Cooldown,
        });
        assert_eq!(
            run(&mut l, vec![op.clone()]),
            [Applied::Released(Family::V4), cooldown.clone()]
        );
        assert_eq!(run(&mut l, vec![op]), [cooldown], "counted once");
        assert_eq!(run(&mut l, vec![delete("10.0.0.2")]), [Applied::Freed(a)]);
        let bound = rec("10.0.0.3", "ns/b", AllocationState::Bound);
        assert!(run(&mut l, vec![JournalOp::PutAllocation(bound.clone())]).is_empty());
        assert_eq!(
            run(&mut l, vec![JournalOp::PutAllocation(held(&bound))]),
            [Applied::Released(Family::V4)],
            "held: released, no timer"
        );
        let bound = rec("10.0.0.4", "ns/c", AllocationState::Bound);
        run(&mut l, vec![JournalOp::PutAllocation(bound)]);
        assert_eq!(
            run(&mut l, vec![delete("10.0.0.4")]),
            [
                Applied::Released(Family::V4),
                Applied::Freed(ip("10.0.0.4"))
            ]
        );
    }

    #[test]
    fn a_teardown_holds_its_addresses_until_it_finishes() {
        let dir = TestDir::new("ledger");
        let mut l = ledger(&dir, 0);
        let a = rec("10.0.0.2", "ns/a", AllocationState::Bound);
        let cooling = cooling(&rec("10.0.0.3", "ns/a", AllocationState::Bound), 9000);
        let td = Teardown {
            key: format!("{TEARDOWN_PREFIX}c-ns/a:eth0"),
            links: Vec::new(),
            ips: vec![a.ip, cooling.ip],
        };
        run(
            &mut l,
            vec![
                JournalOp::PutAllocation(held(&a)),
                JournalOp::PutAllocation(cooling),
                JournalOp::PutMeta {
                    key: td.key.clone(),
                    value: serde_json::to_value(&td).unwrap(),
                },
            ],
        );
        assert_eq!(l.teardowns().collect::<Vec<_>>(), [&td]);
        assert_eq!(
            get(&l, "10.0.0.2").cooling_until_ms,
            Some(HOLD_UNTIL_TEARDOWN)
        );
        // Only the held address is released: the other cools down by its timer.
        let ops = l.finish_teardown_ops(&td.key, 100).unwrap();
        assert_eq!(
            ops,
            [
                delete("10.0.0.2"),
                JournalOp::DeleteMeta {
                    key: td.key.clone()
                }
            ]
        );
        assert_eq!(run(&mut l, ops), [Applied::Freed(a.ip)]);
        assert_eq!(l.teardowns().count(), 0);
        assert_eq!(l.finish_teardown_ops(&td.key, 100), None);
    }

    /// A teardown as the journal holds it (meta `teardown/…`), written by
    /// earlier daemons: a restart reads it back, and a new one is written alike.
    const JOURNALED_TEARDOWN: &str = r#"{"key":"teardown/c-ns/a:eth0","links":[{"name":"lxc1a2b3c4d5e6","index":7}],"ips":["10.0.0.2"]}"#;

    #[test]
    fn a_journaled_teardown_restores_and_is_written_in_the_same_shape() {
        let dir = TestDir::new("ledger");
        let mut l = ledger(&dir, 0);
        let key = "teardown/c-ns/a:eth0".to_string();
        run(
            &mut l,
            vec![JournalOp::PutMeta {
                key: key.clone(),
                value: serde_json::from_str(JOURNALED_TEARDOWN).unwrap(),
            }],
        );
        drop(l);
        let (journal, snapshot) = Journal::open(&journal_in(&dir)).unwrap();
        let mut l = Ledger::new(journal, Duration::ZERO);
        l.load(Allocations::loader().finish(), snapshot);
        let td = l
            .teardowns()
            .next()
            .expect("the teardown is restored")
            .clone();
        assert_eq!(td.key, key);
        assert_eq!(td.ips, [ip("10.0.0.2")]);
        assert_eq!(
            td.links,
            [TeardownLink {
                name: "lxc1a2b3c4d5e6".into(),
                index: 7
            }]
        );
        assert_eq!(serde_json::to_string(&td).unwrap(), JOURNALED_TEARDOWN);
    }

    #[test]
    fn an_attachment_is_released_with_its_endpoint() {
        let dir = TestDir::new("ledger");
        let mut l = ledger(&dir, 0);
        let (a, b) = (
            rec("10.0.0.2", "ns/a", AllocationState::Bound),
            rec("fd00::2", "ns/a", AllocationState::Pending),
        );
        let other = rec("10.0.0.3", "ns/b", AllocationState::Bound);
        let ep = endpoint(Some(a.ip), Some(b.ip));
        run(
            &mut l,
            vec![
                JournalOp::PutAllocation(a),
                JournalOp::PutAllocation(b),
                JournalOp::PutAllocation(other),
                JournalOp::PutEndpoint(ep),
            ],
        );
        let mut ops = Vec::new();
        let ips = l.release_attachment("c-ns/a", Some("eth0"), &mut ops, 0);
        assert_eq!(ips, [ip("10.0.0.2"), ip("fd00::2")]);
        run(&mut l, ops);
        assert!(l.endpoints().is_empty());
        let left: Vec<IpAddr> = l.allocations().iter().map(|r| r.ip).collect();
        assert_eq!(left, [ip("10.0.0.3")]);
    }

    #[test]
    fn what_it_applied_is_what_the_journal_loads_back() {
        let dir = TestDir::new("ledger");
        let mut l = ledger(&dir, 30);
        let a = rec("10.0.0.2", "ns/a", AllocationState::Bound);
        let ep = endpoint(Some(a.ip), None);
        let td = Teardown {
            key: format!("{TEARDOWN_PREFIX}gone:eth0"),
            links: Vec::new(),
            ips: Vec::new(),
        };
        let cooled = l.release_op(&rec("10.0.0.3", "ns/b", AllocationState::Bound), 0);
        run(
            &mut l,
            vec![
                JournalOp::PutAllocation(a),
                JournalOp::PutEndpoint(ep),
                cooled,
                JournalOp::PutMeta {
                    key: td.key.clone(),
                    value: serde_json::to_value(&td).unwrap(),
                },
            ],
        );
        let records = |l: &Ledger| -> Vec<AllocationRecord> {
            l.allocations().iter().map(|r| r.record()).collect()
        };
        let held = (records(&l), l.endpoints().clone(), vec![td]);
        assert!(!l.is_restored("c-ns/a", "eth0"), "made in this run");
        drop(l);

        let (journal, snapshot) = Journal::open(&journal_in(&dir)).unwrap();
        let mut loader = Allocations::loader();
        journal
            .for_each_allocation::<StoreError>(|r| {
                loader.push(r);
                Ok(())
            })
            .unwrap();
        let mut l = Ledger::new(journal, Duration::from_secs(30));
        l.load(loader.finish(), snapshot);
        let loaded = (
            records(&l),
            l.endpoints().clone(),
            l.teardowns().cloned().collect(),
        );
        assert_eq!(loaded, held);
        assert!(l.is_restored("c-ns/a", "eth0"));
        run(
            &mut l,
            vec![JournalOp::DeleteEndpoint {
                container_id: "c-ns/a".into(),
                ifname: "eth0".into(),
            }],
        );
        assert!(!l.is_restored("c-ns/a", "eth0"));
    }
}
