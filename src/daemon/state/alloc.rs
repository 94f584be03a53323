//! Allocation and release: `POST/DELETE /v1/ipam`, endpoint creation and deletion
//! (which binds and releases addresses), and CNI GC. Each builds its journal ops,
//! commits them, then applies them to memory.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::super::config::IpamMode;
use super::ledger::{STICKY_CODE, held};
use super::requested::{Requested, requested_code};
use super::{
    AllocateRequest, ApiError, ErrorKind, HOLD_UNTIL_TEARDOWN, IpamState, NodeConfig,
    RegisteredEndpoint, TEARDOWN_PREFIX, Teardown, TeardownLink,
};
use crate::datapath::host_ifname;
use crate::datapath::link_marker::JournalMark;
use crate::ipam::Family;
use crate::ipam::eni::EniRouting;
use crate::ipam::failure_reason::FailureReason;
use crate::ipam::multipool::PoolError;
use crate::store::{AllocationRecord, AllocationState, EndpointRecord, JournalOp, now_ms};

/// Addresses taken, and the node's configuration their answer carries.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocated {
    /// In the order they were taken (IPv6 first).
    pub addresses: Vec<AllocatedAddress>,
    pub config: NodeConfig,
    /// `POST /v1/ipam` (not a reservation of a given address): the commit that
    /// recorded it; its answer carries the configuration too.
    pub commit: Option<AllocationCommit>,
}

/// One address taken.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatedAddress {
    pub ip: IpAddr,
    pub pool: String,
    /// While the ADD has not finished: the UUID that stops its expiration.
    pub expiration_uuid: Option<String>,
    /// Traffic from it leaves the node unmasqueraded (multi-pool).
    pub skip_masquerade: bool,
    /// eni: the routing of the address's ENI.
    pub eni: Option<EniRouting>,
}

/// The commit of an allocation for the plugin.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocationCommit {
    /// What the plugin marks the pod's host link with.
    pub journal_mark: JournalMark,
    /// The attachment's endpoint was journaled, pending, in the same commit
    /// (the request named the pod's netns).
    pub endpoint_pending: bool,
}

/// `PUT /v1/endpoint/{id}`: an attachment to register, with the addresses its
/// ADD got.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EndpointRegistration {
    pub container_id: String,
    /// The pod's interface (`eth0` when empty).
    pub ifname: String,
    /// The pod, where the plugin names it.
    pub pod_namespace: String,
    pub pod_name: String,
    /// Each family's address as sent (`ip` or `ip/prefix`, empty for none)
    /// and the expiration UUID it was allocated under (empty: not checked).
    pub ipv4: String,
    pub ipv4_expiration_uuid: String,
    pub ipv6: String,
    pub ipv6_expiration_uuid: String,
    /// The host side of the pod's link.
    pub host_ifname: String,
    /// The pod's netns (empty: not known).
    pub netns: String,
    /// A delegated IPAM plugin owns the addresses.
    pub external_ipam: bool,
}

/// `DELETE /v1/endpoint`: a container's attachments (or the one named) to
/// delete, with the host links the daemon removes before the addresses go.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EndpointRelease {
    pub container_id: String,
    /// The one attachment's interface; empty: every attachment.
    pub ifname: String,
    pub teardown_links: Vec<TeardownLink>,
}

/// `POST /v1/cni/report` of an ADD that wired a pending attachment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WiredAttachment {
    pub container_id: String,
    pub ifname: String,
    pub owner: String,
    /// The addresses' expiration UUIDs (none: nothing to bind).
    pub expiration_uuids: Vec<String>,
}

/// `POST /v1/cni/gc`: the network whose allocations are collected, and the
/// attachments (container ID, interface) that stay.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GcScope {
    pub network: String,
    pub valid_attachments: BTreeSet<(String, String)>,
}

/// What CNI GC released.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Collected {
    /// Each address released, with its former owner.
    pub released: Vec<(IpAddr, String)>,
    /// The attachments (container ID, interface) whose host links the caller
    /// removes.
    pub stale_attachments: Vec<(String, String)>,
}

impl IpamState {
    /// `POST /v1/ipam`, one attempt: the next address of each requested family
    /// (IPv6 first, as Cilium does; if IPv4 then fails, the IPv6 address is given
    /// back; `allocate_and_journal`), timed, and a refusal recorded as a failure
    /// unless the caller will wait for the cluster operator's blocks (`may_wait`
    /// and [`IpamState::waits_for_blocks`]: its demand is noted as pending all the
    /// same; `Daemon::allocate_waiting_for_blocks` is that caller). The answer
    /// carries the daemon's configuration (`podnet-config`), so the plugin needs no
    /// `GET /v1/config`. In delegated-plugin mode nothing is allocated: the refusal
    /// (`NoAddress`, 502 as Cilium's no-op allocator) says `delegated-plugin` and
    /// carries the configuration the plugin then runs the delegated IPAM with.
    /// While the configuration does not fit the node, nothing is allocated
    /// (`fit`).
    pub fn allocate(
        &mut self,
        req: &AllocateRequest,
        may_wait: bool,
    ) -> Result<Allocated, ApiError> {
        // A configuration that does not fit the node refuses first: in
        // delegated-plugin mode too, where the plugin would allocate by itself.
        let refused = self.fit_refusal();
        if refused.is_none() && self.cfg.ipam_mode == IpamMode::DelegatedPlugin {
            return Err(ApiError {
                config: Some(Box::new(self.config())),
                ..ApiError::because(
                    FailureReason::DelegatedPlugin,
                    ErrorKind::NoAddress,
                    "ipam mode delegated-plugin: the daemon hands out no pod addresses; the CNI plugin runs the IPAM plugin named in the network config (ipam.type)",
                )
            });
        }
        let started = std::time::Instant::now();
        let result = match refused {
            Some(refused) => Err(refused),
            None => self.allocate_and_journal(req),
        };
        self.metrics
            .phase("ADD", "daemon-allocation", started.elapsed().as_secs_f64());
        if let Err(e) = &result
            && !(may_wait && self.waits_for_blocks(e))
        {
            let reason = e.reason.map_or("rejected", FailureReason::as_str);
            self.record_failure(
                "ADD",
                reason,
                &e.message,
                &req.owner,
                req.container_id.as_deref(),
                req.ifname.as_deref(),
            );
        }
        result
    }

    /// The allocation itself: each family's address from its pool, claimed in
    /// the ledger, journaled (with the pending endpoint) in one commit, then
    /// applied and answered; on any failure the addresses taken so far go back.
    fn allocate_and_journal(&mut self, req: &AllocateRequest) -> Result<Allocated, ApiError> {
        let now = now_ms();
        let mut ops = Vec::new();
        // A runtime that re-adds an attachment without DEL supersedes the old one.
        if let (Some(cid), Some(ifname)) = (&req.container_id, &req.ifname) {
            self.ledger
                .release_attachment(cid, Some(ifname), &mut ops, now);
        }
        let families: Vec<Family> = self
            .cfg
            .families
            .iter()
            .copied()
            .filter(|f| req.family.is_none_or(|want| want == *f))
            .collect();
        // The sticky pool the pod names, if any (`sticky`), and the addresses
        // its annotation asks for, if any (`requested`).
        let sticky = self.sticky_pool_of(&req.owner)?;
        let requested = self.requested_addresses(&req.owner)?;
        let mut taken: Vec<AllocationRecord> = Vec::new();
        // Addresses of `taken` that were the pod's own already: their bits are
        // not given back on failure.
        let mut kept: Vec<IpAddr> = Vec::new();
        for family in families {
            let wanted = requested.and_then(|r| r.of(family));
            let picked = match sticky.as_ref().filter(|p| p.family == family) {
                Some(pool) => self.take_sticky(pool, req, &mut ops).map(|(ip, how)| {
                    if let Requested::Kept = how {
                        kept.push(ip);
                    }
                    (pool.name.clone(), Some(STICKY_CODE.to_string()), ip)
                }),
                None => self
                    .choose_pool(&req.pool, &req.owner, family)
                    .and_then(|(pool, why)| {
                        self.refuse_sticky_pool(&pool, &req.owner)?;
                        let Some(ip) = wanted else {
                            let ip = self.take_next(&pool, family, &req.owner)?;
                            // The pools handed out an address the ledger holds (a kept
                            // address outside the ranges whose block came back): refused,
                            // and its bit stays taken, so the next ADD gets another one.
                            self.ledger.claim(ip)?;
                            return Ok((pool, why.map(str::to_string), ip));
                        };
                        if let Requested::Kept = self.take_requested(&pool, ip, req, &mut ops)? {
                            kept.push(ip);
                        }
                        Ok((pool, Some(requested_code(why)), ip))
                    }),
            };
            match picked {
                Ok((pool, why, ip)) => {
                    let mut rec = self.new_record(ip, family, req, now);
                    rec.pool = pool;
                    rec.selected_by = why;
                    taken.push(rec);
                }
                Err(e) => {
                    self.give_back(&taken, &kept);
                    return Err(e);
                }
            }
        }
        ops.extend(taken.iter().cloned().map(JournalOp::PutAllocation));
        let pending_endpoint = pending_endpoint(req, &taken, now);
        let endpoint_pending = pending_endpoint.is_some();
        ops.extend(pending_endpoint.map(JournalOp::PutEndpoint));
        if let Err(e) = self.commit(&ops) {
            self.give_back(&taken, &kept);
            return Err(e);
        }
        self.apply(ops, "attachment added again");
        let mut allocated = Allocated {
            addresses: Vec::new(),
            config: self.config(),
            commit: Some(AllocationCommit {
                journal_mark: self.journal_mark(),
                endpoint_pending,
            }),
        };
        for rec in &taken {
            self.metrics.event("allocate", rec.family.as_str());
            self.sync
                .clear_pending(&rec.pool, Family::of_addr(&rec.ip), &rec.owner);
            allocated.addresses.push(AllocatedAddress {
                eni: self.eni_details(rec.ip),
                ..self.allocated_address(rec)
            });
            tracing::info!(ip = %rec.ip, pool = ?rec.pool, owner = ?rec.owner, container = rec.container_id.as_deref().unwrap_or(""), "allocated");
        }
        self.sync_demand();
        Ok(allocated)
    }

    /// [`IpamState::allocate`] for a caller that never waits (the unit tests).
    #[cfg(test)]
    pub(super) fn allocate_next(&mut self, req: &AllocateRequest) -> Result<Allocated, ApiError> {
        self.allocate(req, false)
    }

    /// Whether `e` is a multi-pool pool without room (or not known yet) on a node
    /// whose blocks come from a cluster operator: the demand is written, and the
    /// blocks that meet it arrive with a later node resource. Not when the operator
    /// has reported that it cannot meet this node's demand (a pool exhausted or
    /// missing): then the refusal is final until the operator says otherwise.
    /// A sticky address not on this node yet (`sticky`) waits the same way.
    pub fn waits_for_blocks(&self, e: &ApiError) -> bool {
        if e.reason == Some(FailureReason::StickyWaiting) {
            return true;
        }
        self.is_multi_pool()
            && !self.sync.has_operator()
            && self.sync.operator_error().is_empty()
            && matches!(
                e.reason,
                Some(FailureReason::RangeFull | FailureReason::PoolNotAvailable)
            )
    }

    /// The next address of `pool`; in multi-pool a pool without room first asks
    /// the backend for more blocks (the demand counts this request as pending).
    fn take_next(&mut self, pool: &str, family: Family, owner: &str) -> Result<IpAddr, ApiError> {
        match self.pools.allocate_next(pool, family) {
            Ok(ip) => return Ok(ip),
            Err(e) if !self.is_multi_pool() => {
                let (used, usable) = (
                    self.pools.used(pool, family),
                    self.pools.usable(pool, family),
                );
                let cidr = self.pool_cidrs(pool, family).join(", ");
                let reason = match e {
                    PoolError::Exhausted { .. } => Some(FailureReason::RangeFull),
                    _ => None,
                };
                return Err(ApiError {
                    reason,
                    ..ApiError::new(
                        ErrorKind::NoAddress,
                        match e {
                            PoolError::Exhausted { .. }
                                if matches!(
                                    self.cfg.pooling,
                                    super::PoolingMode::External { .. }
                                ) =>
                            {
                                format!(
                                    "No IPs available: the node's custom resource holds {usable} {} addresses and {used} are in use (node {})",
                                    family.label(),
                                    self.cfg.node_name
                                )
                            }
                            PoolError::Exhausted { .. } => format!(
                                "range is full: no free address in {cidr} ({used} of {usable} allocated) (node {})",
                                self.cfg.node_name
                            ),
                            other => format!("{other} (node {})", self.cfg.node_name),
                        },
                    )
                });
            }
            Err(_) => {}
        }
        self.sync.note_pending(pool, family, owner, now_ms());
        self.sync_demand();
        self.pools.allocate_next(pool, family).map_err(|e| {
            let operator = self.sync.operator_error();
            let why = if operator.is_empty() {
                String::new()
            } else {
                format!("; operator: {operator}")
            };
            let reason = match e {
                PoolError::Exhausted { .. } => Some(FailureReason::RangeFull),
                PoolError::NotAvailable { .. } | PoolError::ReserveNotAvailable { .. } => {
                    Some(FailureReason::PoolNotAvailable)
                }
                _ => None,
            };
            ApiError {
                reason,
                ..ApiError::new(
                    ErrorKind::NoAddress,
                    format!("{e} (node {}){why}", self.cfg.node_name),
                )
            }
        })
    }

    /// The answer's part of one address taken: its pool, expiration UUID and
    /// masquerade (an allocation for the plugin adds its ENI's routing).
    fn allocated_address(&self, rec: &AllocationRecord) -> AllocatedAddress {
        AllocatedAddress {
            ip: rec.ip,
            pool: rec.pool.clone(),
            expiration_uuid: rec.expiration_uuid.clone(),
            skip_masquerade: self.skip_masquerade(&rec.pool),
            eni: None,
        }
    }

    /// Clears allocator bits taken for records that were never committed, but
    /// not those of `kept` addresses (held before this request).
    fn give_back(&mut self, taken: &[AllocationRecord], kept: &[IpAddr]) {
        for rec in taken.iter().filter(|r| !kept.contains(&r.ip)) {
            self.pools.release(rec.ip);
        }
    }

    fn new_record(
        &self,
        ip: IpAddr,
        family: Family,
        req: &AllocateRequest,
        now: u64,
    ) -> AllocationRecord {
        let (state, uuid, expires) = if req.expiration {
            (
                AllocationState::Pending,
                Some(uuid::Uuid::new_v4().to_string()),
                Some(now + self.cfg.expiration.as_millis() as u64),
            )
        } else {
            (AllocationState::Bound, None, None)
        };
        AllocationRecord {
            ip,
            family,
            pool: self.default_pool().to_string(),
            owner: req.owner.clone(),
            container_id: req.container_id.clone(),
            ifname: req.ifname.clone(),
            network: req.network.clone(),
            state,
            expiration_uuid: uuid,
            expires_at_ms: expires,
            allocated_at_ms: now,
            host_ifname: None,
            cooling_until_ms: None,
            selected_by: None,
            pod_uid: req.pod_uid.clone(),
        }
    }

    /// `POST /v1/ipam/{ip}`: reserve one given address (no expiration). The pool
    /// defaults to the default pool (Cilium requires it).
    pub fn allocate_ip(
        &mut self,
        ip: &str,
        owner: &str,
        pool: &str,
    ) -> Result<Allocated, ApiError> {
        let addr: IpAddr = ip
            .parse()
            .map_err(|_| ApiError::new(ErrorKind::Invalid, format!("Invalid IP address: {ip}")))?;
        let family = Family::of_addr(&addr);
        if !self.cfg.families.contains(&family) {
            return Err(ApiError::new(
                ErrorKind::Invalid,
                format!("{} allocation disabled", family.label()),
            ));
        }
        if let Some(refused) = self.fit_refusal() {
            return Err(refused);
        }
        let (pool, _) = self.choose_pool(pool, owner, family)?;
        let pool = if pool.is_empty() {
            self.default_pool().to_string()
        } else {
            pool
        };
        self.refuse_sticky_pool(&pool, owner)?;
        if let Some(rec) = self
            .ledger
            .allocations()
            .get(&addr)
            .filter(|r| r.state() == AllocationState::Cooling)
        {
            let left = rec.cooling_until_ms().unwrap_or(0).saturating_sub(now_ms()) / 1000;
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("IP {addr} was released recently and cools down for {left} s more"),
            ));
        }
        self.pools.allocate(&pool, addr).map_err(|e| {
            let detail = match (&e, self.is_multi_pool(), self.node_addressing_cidr(family)) {
                (PoolError::NotInRange { .. }, false, Some(cidr)) => {
                    format!(
                        "provided IP is not in the valid range. The range of valid IPs is {cidr}"
                    )
                }
                _ => e.to_string(),
            };
            ApiError::new(ErrorKind::Conflict, detail)
        })?;
        self.ledger.claim(addr)?;
        let req = AllocateRequest {
            owner: owner.into(),
            pool: pool.clone(),
            ..Default::default()
        };
        let mut rec = self.new_record(addr, family, &req, now_ms());
        rec.pool = pool;
        let allocated = Allocated {
            addresses: vec![self.allocated_address(&rec)],
            config: self.config(),
            commit: None,
        };
        let family = rec.family;
        let ops = vec![JournalOp::PutAllocation(rec)];
        if let Err(e) = self.commit(&ops) {
            self.pools.release(addr);
            return Err(e);
        }
        self.metrics.event("allocate", family.as_str());
        self.apply(ops, "reserved through the API");
        self.sync_demand();
        Ok(allocated)
    }

    /// `DELETE /v1/ipam/{ip}`: release one address. Refused while an endpoint uses it
    /// or when it is one of the daemon's own; releasing a free address is a no-op.
    pub fn release_ip(&mut self, ip: &str, pool: &str) -> Result<(), ApiError> {
        let addr: IpAddr = ip
            .parse()
            .map_err(|_| ApiError::new(ErrorKind::Invalid, format!("Invalid IP address {ip}")))?;
        if !pool.is_empty() && !self.is_multi_pool() {
            self.choose_pool(pool, "", Family::of_addr(&addr))?;
        }
        if let Some(ep) = self
            .ledger
            .endpoints()
            .values()
            .find(|e| e.ipv4 == Some(addr) || e.ipv6 == Some(addr))
        {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("IP is in use by endpoint {}", ep.key()),
            ));
        }
        let Some(rec) = self.ledger.allocations().get(&addr) else {
            return Ok(());
        };
        match rec.state() {
            AllocationState::Infra => Err(ApiError::new(
                ErrorKind::Conflict,
                format!(
                    "IP {addr} is the node's {} address and cannot be released",
                    rec.owner()
                ),
            )),
            AllocationState::Cooling => Ok(()),
            _ => {
                let op = self.ledger.release_op(&rec.record(), now_ms());
                self.commit_apply(vec![op], "released through the API")
            }
        }
    }

    /// `PUT /v1/endpoint/{id}`: registers the endpoint, binds its addresses and stops
    /// their expiration timers.
    pub fn create_endpoint(
        &mut self,
        req: &EndpointRegistration,
    ) -> Result<RegisteredEndpoint, ApiError> {
        if req.container_id.is_empty() {
            return Err(ApiError::new(ErrorKind::Invalid, "invalid container id"));
        }
        let ifname = if req.ifname.is_empty() {
            "eth0"
        } else {
            &req.ifname
        };
        let key = EndpointRecord::key_of(&req.container_id, ifname);
        if self.ledger.endpoints().contains_key(&key) {
            return Err(ApiError::new(
                ErrorKind::Invalid,
                format!(
                    "endpoint for CNI attachment ID {}:{ifname} already exists",
                    req.container_id
                ),
            ));
        }
        let mut ops = Vec::new();
        let mut ep_pool = self.default_pool().to_string();
        let mut ips = (None, None);
        for (label, ip, uuid) in [
            ("ipv4", &req.ipv4, &req.ipv4_expiration_uuid),
            ("ipv6", &req.ipv6, &req.ipv6_expiration_uuid),
        ] {
            if ip.is_empty() {
                continue;
            }
            let (addr, bound) = self.endpoint_address(req, ifname, label, ip, uuid)?;
            if let Some(bound) = bound {
                ep_pool = bound.pool.clone();
                ops.push(JournalOp::PutAllocation(bound));
            }
            if addr.is_ipv4() {
                ips.0 = Some(addr);
            } else {
                ips.1 = Some(addr);
            }
        }
        let ep = endpoint_record(req, ifname, ips, ep_pool);
        ops.push(JournalOp::PutEndpoint(ep.clone()));
        self.commit_apply(ops, "endpoint created")?;
        tracing::info!(endpoint = ?key, owner = ?ep.owner, "endpoint created");
        Ok(self.registered(&ep))
    }

    /// One address (`label`, `ip`, its expiration `uuid`) of an endpoint being
    /// created: the address, and, unless a delegated IPAM plugin owns it, its
    /// allocation bound to the endpoint (an infra address stays as it is). The
    /// address must be allocated, not cooling down, not another container's, and
    /// still pending under `uuid` where one is given.
    fn endpoint_address(
        &self,
        req: &EndpointRegistration,
        ifname: &str,
        label: &str,
        ip: &str,
        uuid: &str,
    ) -> Result<(IpAddr, Option<AllocationRecord>), ApiError> {
        let addr: IpAddr = ip.split('/').next().unwrap_or("").parse().map_err(|_| {
            ApiError::new(
                ErrorKind::Invalid,
                format!("invalid {label} address {ip:?}"),
            )
        })?;
        if req.external_ipam {
            // A delegated IPAM plugin owns the address: only remember it.
            return Ok((addr, None));
        }
        let rec = self
            .ledger
            .allocations()
            .get(&addr)
            .filter(|r| r.state() != AllocationState::Cooling)
            .ok_or_else(|| {
                ApiError::new(
                    ErrorKind::Invalid,
                    format!("IP {label}:{addr} is not allocated"),
                )
            })?;
        if rec.container_id().is_some_and(|c| c != req.container_id) {
            return Err(ApiError::new(
                ErrorKind::Invalid,
                format!("IP {label}:{addr} is already in use"),
            ));
        }
        if rec.state() == AllocationState::Pending
            && !uuid.is_empty()
            && rec.expiration_uuid() != Some(uuid)
        {
            return Err(ApiError::new(
                ErrorKind::Internal,
                "UUID mismatch, not stopping expiration timer",
            ));
        }
        let mut bound = rec.record();
        if bound.state != AllocationState::Infra {
            bound.state = AllocationState::Bound;
            bound.expiration_uuid = None;
            bound.expires_at_ms = None;
            bound.container_id = Some(req.container_id.clone());
            bound.ifname = Some(ifname.to_string());
        }
        Ok((addr, Some(bound)))
    }

    /// `POST /v1/cni/report` of an ADD that wired a pending attachment: binds its
    /// addresses (stops their expiration) if they are all still pending under the
    /// UUIDs the report names. A report for an attachment deleted, re-added or
    /// expired since is refused (`Conflict`) and binds nothing. Reports without UUIDs
    /// pass.
    pub fn bind_wired(&mut self, report: &WiredAttachment) -> Result<(), ApiError> {
        let uuids = &report.expiration_uuids;
        if uuids.is_empty() {
            return Ok(());
        }
        let (cid, ifname) = (&report.container_id, &report.ifname);
        let ops = self.ledger.bind_ops(cid, ifname, Some(uuids));
        if ops.len() != uuids.len() {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!(
                    "attachment {cid}:{ifname} holds no pending addresses with the expiration UUIDs {uuids:?} (it was deleted, added again or expired since): report refused, nothing bound"
                ),
            ));
        }
        self.commit_apply(ops, "ADD wired")?;
        tracing::info!(container = %cid, ifname = %ifname, owner = %report.owner, "endpoint wired: addresses bound");
        Ok(())
    }

    /// `DELETE /v1/endpoint`: deletes the container's endpoints (or the one
    /// attachment) and releases their addresses, and any address still pending for
    /// them. `NotFound` when nothing was known. With `teardown-links`, the addresses are
    /// held (cooling without an end) until the caller has deleted the links and
    /// called `finish_teardown` with the returned key; a restart finishes it too.
    pub fn delete_endpoints(
        &mut self,
        req: &EndpointRelease,
    ) -> Result<Option<Teardown>, ApiError> {
        if req.container_id.is_empty() {
            return Err(ApiError::new(ErrorKind::Invalid, "invalid container id"));
        }
        let ifname = (!req.ifname.is_empty()).then_some(req.ifname.as_str());
        let mut ops = Vec::new();
        let ips = self
            .ledger
            .release_attachment(&req.container_id, ifname, &mut ops, now_ms());
        if req.teardown_links.is_empty() {
            if ops.is_empty() {
                return Err(ApiError::new(ErrorKind::NotFound, "endpoints not found"));
            }
            self.commit_apply(ops, "endpoint deleted")?;
            return Ok(None);
        }
        for op in ops.iter_mut() {
            if let JournalOp::PutAllocation(rec) = op
                && rec.state == AllocationState::Cooling
            {
                rec.cooling_until_ms = Some(HOLD_UNTIL_TEARDOWN);
            } else if let JournalOp::DeleteAllocation { ip, .. } = op
                && let Some(rec) = self.ledger.allocations().get(ip)
            {
                *op = JournalOp::PutAllocation(held(&rec.record()));
            }
        }
        let teardown = Teardown {
            key: format!("{TEARDOWN_PREFIX}{}:{}", req.container_id, req.ifname),
            links: req.teardown_links.clone(),
            ips,
        };
        let value = serde_json::to_value(&teardown)
            .map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
        ops.push(JournalOp::PutMeta {
            key: teardown.key.clone(),
            value,
        });
        self.commit_apply(ops, "endpoint deleted (links being torn down)")?;
        Ok(Some(teardown))
    }

    /// The links of a DEL are gone: the held addresses cool down (or are free).
    pub fn finish_teardown(&mut self, key: &str) -> Result<(), ApiError> {
        match self.ledger.finish_teardown_ops(key, now_ms()) {
            Some(ops) => self.commit_apply(ops, "links torn down"),
            None => Ok(()),
        }
    }

    /// DELs whose links were not confirmed gone (restart after a crash).
    pub fn pending_teardowns(&self) -> Vec<Teardown> {
        self.ledger.teardowns().cloned().collect()
    }

    /// `POST /v1/cni/gc`: releases every allocation of `network` whose attachment is
    /// not in the valid set. Returns what was released and the attachments whose
    /// host links the caller removes.
    pub fn gc(&mut self, req: &GcScope) -> Result<Collected, ApiError> {
        let valid = &req.valid_attachments;
        let mut stale: BTreeSet<(String, String)> = BTreeSet::new();
        for rec in self.ledger.allocations().iter() {
            if !matches!(
                rec.state(),
                AllocationState::Bound | AllocationState::Pending
            ) || rec.network() != Some(req.network.as_str())
            {
                continue;
            }
            if let (Some(cid), Some(ifname)) = (rec.container_id(), rec.ifname()) {
                let attachment = (cid.to_string(), ifname.to_string());
                if !valid.contains(&attachment) {
                    stale.insert(attachment);
                }
            }
        }
        let now = now_ms();
        let mut ops = Vec::new();
        for (cid, ifname) in &stale {
            self.ledger
                .release_attachment(cid, Some(ifname), &mut ops, now);
        }
        let released = ops
            .iter()
            .filter_map(|op| match op {
                JournalOp::DeleteAllocation { ip, .. } => Some(*ip),
                JournalOp::PutAllocation(r) => Some(r.ip),
                _ => None,
            })
            .map(|ip| {
                let owner = self
                    .ledger
                    .allocations()
                    .get(&ip)
                    .map(|r| r.owner().to_string())
                    .unwrap_or_default();
                (ip, owner)
            })
            .collect();
        self.commit_apply(ops, "garbage collected")?;
        Ok(Collected {
            released,
            stale_attachments: stale.into_iter().collect(),
        })
    }
}

/// The endpoint of an allocation that names its attachment and the pod's netns
/// and expires: journaled with the addresses, pending as they are. It is bound
/// when the plugin's report or the host link's wired marker shows the ADD
/// finished, and released with them when it expires unwired.
fn pending_endpoint(
    req: &AllocateRequest,
    taken: &[AllocationRecord],
    now: u64,
) -> Option<EndpointRecord> {
    let (Some(cid), Some(ifname), Some(netns)) = (&req.container_id, &req.ifname, &req.netns)
    else {
        return None;
    };
    if !req.expiration {
        return None;
    }
    let pool = taken.first()?.pool.clone();
    let ip_of = |v4: bool| taken.iter().map(|r| r.ip).find(|ip| ip.is_ipv4() == v4);
    Some(EndpointRecord {
        container_id: cid.clone(),
        ifname: ifname.clone(),
        host_ifname: host_ifname(cid, ifname),
        owner: if req.owner.is_empty() {
            cid.clone()
        } else {
            req.owner.clone()
        },
        ipv4: ip_of(true),
        ipv6: ip_of(false),
        pool,
        netns: Some(netns.clone()),
        created_at_ms: now,
        external_ipam: false,
    })
}

/// The endpoint record of `req` on `ifname`, holding `ips` (IPv4, IPv6) from
/// `pool`: owned by the pod (`namespace/name`) where the request names one, else
/// by the container.
fn endpoint_record(
    req: &EndpointRegistration,
    ifname: &str,
    ips: (Option<IpAddr>, Option<IpAddr>),
    pool: String,
) -> EndpointRecord {
    let owner = if !req.pod_namespace.is_empty() && !req.pod_name.is_empty() {
        format!("{}/{}", req.pod_namespace, req.pod_name)
    } else {
        req.container_id.clone()
    };
    EndpointRecord {
        container_id: req.container_id.clone(),
        ifname: ifname.to_string(),
        host_ifname: req.host_ifname.clone(),
        owner,
        ipv4: ips.0,
        ipv6: ips.1,
        pool,
        netns: (!req.netns.is_empty()).then(|| req.netns.clone()),
        created_at_ms: now_ms(),
        external_ipam: req.external_ipam,
    }
}
