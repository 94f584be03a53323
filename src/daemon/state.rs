//! The daemon's IPAM state: the host-scope allocators over the node's CIDRs, every
//! allocation and endpoint, and the journal that makes them durable. All methods are
//! synchronous; the server calls them on blocking threads under one mutex, and every
//! change is committed to the journal before the method returns.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

use crate::api::models::*;
use crate::ipam::Family;
use crate::ipam::hostscope::HostScopeAllocator;
use crate::node::NodeResource;
use crate::store::{
    AllocationRecord, AllocationState, EndpointRecord, Journal, JournalOp, Snapshot, now_ms,
};

/// The only pool of the host-scope modes.
pub const DEFAULT_POOL: &str = "default";
/// Journal key of the node resource.
pub const NODE_META_KEY: &str = "ciliumnode";

/// An API failure: HTTP status and the message the client sees.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

/// An expiration timer to arm: release `ip` at `deadline_ms` unless its endpoint was
/// created (the UUID still matches a pending allocation).
#[derive(Debug, Clone, PartialEq)]
pub struct Expiry {
    pub ip: IpAddr,
    pub pool: String,
    pub uuid: String,
    pub deadline_ms: u64,
}

/// Static facts the state needs.
#[derive(Debug, Clone)]
pub struct StateConfig {
    pub node_name: String,
    pub ipam_mode: String,
    pub expiration: Duration,
    pub mtu: u32,
    pub reserve_health: bool,
    pub reserve_ingress: bool,
}

/// A request for the next address(es).
#[derive(Debug, Clone, Default)]
pub struct AllocateRequest {
    pub family: Option<Family>,
    pub owner: String,
    pub pool: String,
    pub expiration: bool,
    pub container_id: Option<String>,
    pub ifname: Option<String>,
    pub network: Option<String>,
}

struct FamilyRange {
    family: Family,
    alloc: HostScopeAllocator,
    router: Option<IpAddr>,
}

/// What restore found, for the log and for status.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RestoreReport {
    pub restored: usize,
    pub expired: usize,
    pub dropped_out_of_range: Vec<String>,
}

/// The IPAM state of one node.
pub struct IpamState {
    cfg: StateConfig,
    ranges: Vec<FamilyRange>,
    allocations: BTreeMap<IpAddr, AllocationRecord>,
    endpoints: BTreeMap<String, EndpointRecord>,
    restored_endpoints: BTreeSet<String>,
    journal: Journal,
    node: NodeResource,
}

impl IpamState {
    /// Builds the state for the node's CIDRs (one per enabled family), restores the
    /// journal's allocations and endpoints, and reserves the router (and health,
    /// ingress) addresses. Returns the timers to arm.
    pub fn restore(
        cfg: StateConfig,
        journal: Journal,
        mut node: NodeResource,
        cidrs: &[IpNet],
        snapshot: Snapshot,
    ) -> Result<(IpamState, Vec<Expiry>, RestoreReport), String> {
        let mut ranges = Vec::new();
        for cidr in cidrs {
            let alloc =
                HostScopeAllocator::new(*cidr).map_err(|e| format!("node CIDR {cidr}: {e}"))?;
            ranges.push(FamilyRange {
                family: family_of(&cidr.addr()),
                alloc,
                router: None,
            });
        }
        let mut report = RestoreReport::default();
        let mut ops = Vec::new();
        let mut timers = Vec::new();
        let mut allocations = BTreeMap::new();
        let now = now_ms();
        let mut by_age: Vec<AllocationRecord> = snapshot.allocations;
        by_age.sort_by_key(|r| r.allocated_at_ms);
        for rec in by_age {
            let Some(range) = ranges.iter_mut().find(|r| r.alloc.contains(rec.ip)) else {
                tracing::warn!(ip = %rec.ip, owner = %rec.owner, "journal allocation is outside the node's ranges; dropping it");
                report
                    .dropped_out_of_range
                    .push(format!("{} ({})", rec.ip, rec.owner));
                ops.push(JournalOp::DeleteAllocation {
                    pool: rec.pool.clone(),
                    ip: rec.ip,
                });
                continue;
            };
            if rec.state == AllocationState::Pending && rec.expires_at_ms.is_some_and(|t| t <= now)
            {
                tracing::warn!(ip = %rec.ip, owner = %rec.owner, "Released IP after expiration (expired while the daemon was down)");
                report.expired += 1;
                ops.push(JournalOp::DeleteAllocation {
                    pool: rec.pool.clone(),
                    ip: rec.ip,
                });
                continue;
            }
            if let Err(e) = range.alloc.allocate(rec.ip) {
                return Err(format!(
                    "journal {}: cannot restore {} ({}): {e}",
                    journal.path().display(),
                    rec.ip,
                    rec.owner
                ));
            }
            range.alloc.set_cursor_after(rec.ip);
            if let (AllocationState::Pending, Some(uuid), Some(deadline_ms)) =
                (rec.state, rec.expiration_uuid.clone(), rec.expires_at_ms)
            {
                timers.push(Expiry {
                    ip: rec.ip,
                    pool: rec.pool.clone(),
                    uuid,
                    deadline_ms,
                });
            }
            report.restored += 1;
            allocations.insert(rec.ip, rec);
        }
        let endpoints: BTreeMap<String, EndpointRecord> = snapshot
            .endpoints
            .into_iter()
            .map(|e| (e.key(), e))
            .collect();
        let restored_endpoints = endpoints.keys().cloned().collect();
        let mut state = IpamState {
            cfg,
            ranges,
            allocations,
            endpoints,
            restored_endpoints,
            journal,
            node: NodeResource::default(),
        };
        // Infrastructure addresses: restore the previous ones, else take new ones.
        let mut infra = vec!["router"];
        if state.cfg.reserve_health {
            infra.push("health");
        }
        if state.cfg.reserve_ingress {
            infra.push("ingress");
        }
        for idx in 0..state.ranges.len() {
            for owner in &infra {
                let ip = state.reserve_infra(idx, owner, &mut ops)?;
                if *owner == "router" {
                    state.ranges[idx].router = Some(ip);
                    node.set_address("CiliumInternalIP", ip);
                }
            }
        }
        state.node = node;
        ops.push(JournalOp::PutMeta {
            key: NODE_META_KEY.into(),
            value: state.node_json(),
        });
        state.journal.commit(&ops).map_err(|e| e.to_string())?;
        Ok((state, timers, report))
    }

    fn reserve_infra(
        &mut self,
        idx: usize,
        owner: &str,
        ops: &mut Vec<JournalOp>,
    ) -> Result<IpAddr, String> {
        let family = self.ranges[idx].family;
        if let Some(rec) = self.allocations.values().find(|r| {
            r.state == AllocationState::Infra && r.owner == owner && family_of(&r.ip) == family
        }) {
            return Ok(rec.ip);
        }
        let range = &mut self.ranges[idx];
        let ip = range.alloc.allocate_next().map_err(|e| {
            format!(
                "unable to allocate {owner} {}: {e}, see https://cilium.link/ipam-range-full",
                family_label(family)
            )
        })?;
        let rec = AllocationRecord {
            ip,
            family: family.as_str().into(),
            pool: DEFAULT_POOL.into(),
            owner: owner.into(),
            container_id: None,
            ifname: None,
            network: None,
            state: AllocationState::Infra,
            expiration_uuid: None,
            expires_at_ms: None,
            allocated_at_ms: now_ms(),
        };
        ops.push(JournalOp::PutAllocation(rec.clone()));
        self.allocations.insert(ip, rec);
        Ok(ip)
    }

    fn node_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.node).unwrap_or(serde_json::Value::Null)
    }

    /// The node resource as it stands.
    pub fn node(&self) -> &NodeResource {
        &self.node
    }

    /// The router address of each enabled family.
    pub fn router_ips(&self) -> Vec<IpAddr> {
        self.ranges.iter().filter_map(|r| r.router).collect()
    }

    fn range_mut(&mut self, family: Family) -> Option<&mut FamilyRange> {
        self.ranges.iter_mut().find(|r| r.family == family)
    }

    fn commit(&self, ops: &[JournalOp]) -> Result<(), ApiError> {
        self.journal.commit(ops).map_err(|e| {
            tracing::error!(error = %e, "journal commit failed");
            ApiError::new(500, format!("cannot record the change durably: {e}"))
        })
    }

    fn check_pool(&self, pool: &str) -> Result<(), ApiError> {
        if pool.is_empty() || pool == DEFAULT_POOL {
            Ok(())
        } else {
            Err(ApiError::new(
                400,
                format!(
                    "pool {pool:?} does not exist: ipam mode {} has only the {DEFAULT_POOL:?} pool",
                    self.cfg.ipam_mode
                ),
            ))
        }
    }

    /// `POST /v1/ipam`: the next address of each requested family (IPv6 first, as
    /// Cilium does; if IPv4 then fails, the IPv6 address is given back).
    pub fn allocate_next(
        &mut self,
        req: &AllocateRequest,
    ) -> Result<(IpamResponse, Vec<Expiry>), ApiError> {
        self.check_pool(&req.pool)?;
        let mut ops = Vec::new();
        // A runtime that re-adds an attachment without DEL supersedes the old one.
        if let (Some(cid), Some(ifname)) = (&req.container_id, &req.ifname) {
            self.release_attachment(cid, Some(ifname), &mut ops, "attachment added again")?;
        }
        let families: Vec<Family> = [Family::V6, Family::V4]
            .into_iter()
            .filter(|f| req.family.is_none_or(|want| want == *f))
            .filter(|f| self.ranges.iter().any(|r| r.family == *f))
            .collect();
        let mut taken: Vec<AllocationRecord> = Vec::new();
        for family in families {
            let node = self.cfg.node_name.clone();
            let range = self
                .range_mut(family)
                .ok_or_else(|| ApiError::new(500, "family vanished"))?;
            match range.alloc.allocate_next() {
                Ok(ip) => taken.push(self.new_record(ip, family, req)),
                Err(e) => {
                    for rec in &taken {
                        if let Some(r) = self.range_mut(family_of(&rec.ip)) {
                            r.alloc.release(rec.ip);
                        }
                    }
                    return Err(ApiError::new(502, format!("{e} (node {node})")));
                }
            }
        }
        let mut timers = Vec::new();
        for rec in &taken {
            ops.push(JournalOp::PutAllocation(rec.clone()));
        }
        if let Err(e) = self.commit(&ops) {
            for rec in &taken {
                if let Some(r) = self.range_mut(family_of(&rec.ip)) {
                    r.alloc.release(rec.ip);
                }
            }
            return Err(e);
        }
        self.apply_releases(&ops);
        let mut resp = IpamResponse {
            host_addressing: self.node_addressing(),
            ..Default::default()
        };
        for rec in taken {
            if let (Some(uuid), Some(deadline_ms)) = (&rec.expiration_uuid, rec.expires_at_ms) {
                timers.push(Expiry {
                    ip: rec.ip,
                    pool: rec.pool.clone(),
                    uuid: uuid.clone(),
                    deadline_ms,
                });
            }
            fill_response(&mut resp, &rec);
            tracing::info!(ip = %rec.ip, owner = %rec.owner, container = rec.container_id.as_deref().unwrap_or(""), "allocated");
            self.allocations.insert(rec.ip, rec);
        }
        Ok((resp, timers))
    }

    fn new_record(&self, ip: IpAddr, family: Family, req: &AllocateRequest) -> AllocationRecord {
        let now = now_ms();
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
            family: family.as_str().into(),
            pool: DEFAULT_POOL.into(),
            owner: req.owner.clone(),
            container_id: req.container_id.clone(),
            ifname: req.ifname.clone(),
            network: req.network.clone(),
            state,
            expiration_uuid: uuid,
            expires_at_ms: expires,
            allocated_at_ms: now,
        }
    }

    /// `POST /v1/ipam/{ip}`: reserve one given address (no expiration).
    pub fn allocate_ip(
        &mut self,
        ip: &str,
        owner: &str,
        pool: &str,
    ) -> Result<IpamResponse, ApiError> {
        let addr: IpAddr = ip
            .parse()
            .map_err(|_| ApiError::new(400, format!("Invalid IP address: {ip}")))?;
        self.check_pool(pool)?;
        let family = family_of(&addr);
        let range = self.range_mut(family).ok_or_else(|| {
            ApiError::new(400, format!("{} allocation disabled", family_label(family)))
        })?;
        range
            .alloc
            .allocate(addr)
            .map_err(|e| ApiError::new(409, e.to_string()))?;
        let rec = self.new_record(
            addr,
            family,
            &AllocateRequest {
                owner: owner.into(),
                pool: pool.into(),
                ..Default::default()
            },
        );
        if let Err(e) = self.commit(&[JournalOp::PutAllocation(rec.clone())]) {
            if let Some(r) = self.range_mut(family) {
                r.alloc.release(addr);
            }
            return Err(e);
        }
        let mut resp = IpamResponse {
            host_addressing: self.node_addressing(),
            ..Default::default()
        };
        fill_response(&mut resp, &rec);
        self.allocations.insert(addr, rec);
        Ok(resp)
    }

    /// `DELETE /v1/ipam/{ip}`: release one address. Refused while an endpoint uses it
    /// or when it is one of the daemon's own; releasing a free address is a no-op.
    pub fn release_ip(&mut self, ip: &str, pool: &str) -> Result<(), ApiError> {
        let addr: IpAddr = ip
            .parse()
            .map_err(|_| ApiError::new(400, format!("Invalid IP address {ip}")))?;
        self.check_pool(pool)?;
        if let Some(ep) = self
            .endpoints
            .values()
            .find(|e| e.ipv4 == Some(addr) || e.ipv6 == Some(addr))
        {
            return Err(ApiError::new(
                409,
                format!("IP is in use by endpoint {}", ep.key()),
            ));
        }
        let Some(rec) = self.allocations.get(&addr) else {
            return Ok(());
        };
        if rec.state == AllocationState::Infra {
            return Err(ApiError::new(
                409,
                format!(
                    "IP {addr} is the node's {} address and cannot be released",
                    rec.owner
                ),
            ));
        }
        self.commit(&[JournalOp::DeleteAllocation {
            pool: rec.pool.clone(),
            ip: addr,
        }])?;
        self.forget(addr, "released");
        Ok(())
    }

    fn forget(&mut self, ip: IpAddr, why: &str) {
        if let Some(rec) = self.allocations.remove(&ip) {
            tracing::info!(ip = %ip, owner = %rec.owner, reason = why, "released");
        }
        if let Some(r) = self.range_mut(family_of(&ip)) {
            r.alloc.release(ip);
        }
    }

    /// Adds the journal ops that release every allocation and endpoint of an
    /// attachment (`ifname` None: every interface of the container).
    fn release_attachment(
        &self,
        container_id: &str,
        ifname: Option<&str>,
        ops: &mut Vec<JournalOp>,
        why: &str,
    ) -> Result<(), ApiError> {
        for rec in self
            .allocations
            .values()
            .filter(|r| r.is_for(container_id, ifname))
        {
            tracing::info!(ip = %rec.ip, owner = %rec.owner, reason = why, "releasing");
            ops.push(JournalOp::DeleteAllocation {
                pool: rec.pool.clone(),
                ip: rec.ip,
            });
        }
        for ep in self
            .endpoints
            .values()
            .filter(|e| e.container_id == container_id && ifname.is_none_or(|i| e.ifname == i))
        {
            ops.push(JournalOp::DeleteEndpoint {
                container_id: ep.container_id.clone(),
                ifname: ep.ifname.clone(),
            });
            for ip in [ep.ipv4, ep.ipv6].into_iter().flatten() {
                if let Some(rec) = self.allocations.get(&ip)
                    && !rec.is_for(container_id, ifname)
                {
                    ops.push(JournalOp::DeleteAllocation {
                        pool: rec.pool.clone(),
                        ip,
                    });
                }
            }
        }
        Ok(())
    }

    /// Applies committed release ops to memory.
    fn apply_releases(&mut self, ops: &[JournalOp]) {
        for op in ops {
            match op {
                JournalOp::DeleteAllocation { ip, .. } => self.forget(*ip, "attachment released"),
                JournalOp::DeleteEndpoint {
                    container_id,
                    ifname,
                } => {
                    let key = EndpointRecord::key_of(container_id, ifname);
                    self.endpoints.remove(&key);
                    self.restored_endpoints.remove(&key);
                }
                _ => {}
            }
        }
    }

    /// `PUT /v1/endpoint/{id}`: registers the endpoint, binds its addresses and stops
    /// their expiration timers.
    pub fn create_endpoint(
        &mut self,
        req: &EndpointChangeRequest,
    ) -> Result<EndpointView, ApiError> {
        if req.container_id.is_empty() {
            return Err(ApiError::new(400, "invalid container id"));
        }
        let ifname = if req.container_interface_name.is_empty() {
            "eth0"
        } else {
            &req.container_interface_name
        };
        let key = EndpointRecord::key_of(&req.container_id, ifname);
        if self.endpoints.contains_key(&key) {
            return Err(ApiError::new(
                400,
                format!(
                    "endpoint for CNI attachment ID {}:{ifname} already exists",
                    req.container_id
                ),
            ));
        }
        let mut ops = Vec::new();
        let mut ips = (None, None);
        for (label, ip, uuid) in [
            (
                "ipv4",
                &req.addressing.ipv4,
                &req.addressing.ipv4_expiration_uuid,
            ),
            (
                "ipv6",
                &req.addressing.ipv6,
                &req.addressing.ipv6_expiration_uuid,
            ),
        ] {
            if ip.is_empty() {
                continue;
            }
            let addr: IpAddr = ip
                .split('/')
                .next()
                .unwrap_or("")
                .parse()
                .map_err(|_| ApiError::new(400, format!("invalid {label} address {ip:?}")))?;
            let rec = self
                .allocations
                .get(&addr)
                .ok_or_else(|| ApiError::new(400, format!("IP {label}:{addr} is not allocated")))?;
            if rec
                .container_id
                .as_deref()
                .is_some_and(|c| c != req.container_id)
            {
                return Err(ApiError::new(
                    400,
                    format!("IP {label}:{addr} is already in use"),
                ));
            }
            if rec.state == AllocationState::Pending
                && !uuid.is_empty()
                && rec.expiration_uuid.as_deref() != Some(uuid)
            {
                return Err(ApiError::new(
                    500,
                    "UUID mismatch, not stopping expiration timer",
                ));
            }
            let mut bound = rec.clone();
            if bound.state != AllocationState::Infra {
                bound.state = AllocationState::Bound;
                bound.expiration_uuid = None;
                bound.expires_at_ms = None;
                bound.container_id = Some(req.container_id.clone());
                bound.ifname = Some(ifname.to_string());
            }
            ops.push(JournalOp::PutAllocation(bound));
            if addr.is_ipv4() {
                ips.0 = Some(addr);
            } else {
                ips.1 = Some(addr);
            }
        }
        let owner = if !req.k8s_namespace.is_empty() && !req.k8s_pod_name.is_empty() {
            format!("{}/{}", req.k8s_namespace, req.k8s_pod_name)
        } else {
            req.container_id.clone()
        };
        let ep = EndpointRecord {
            container_id: req.container_id.clone(),
            ifname: ifname.to_string(),
            host_ifname: req.interface_name.clone(),
            owner,
            ipv4: ips.0,
            ipv6: ips.1,
            pool: DEFAULT_POOL.into(),
            netns: (!req.container_netns_path.is_empty()).then(|| req.container_netns_path.clone()),
            created_at_ms: now_ms(),
        };
        ops.push(JournalOp::PutEndpoint(ep.clone()));
        self.commit(&ops)?;
        for op in ops {
            if let JournalOp::PutAllocation(rec) = op {
                self.allocations.insert(rec.ip, rec);
            }
        }
        let view = self.view(&ep);
        tracing::info!(endpoint = %key, owner = %ep.owner, "endpoint created");
        self.endpoints.insert(key, ep);
        Ok(view)
    }

    fn view(&self, ep: &EndpointRecord) -> EndpointView {
        let mut addressing = AddressPair::default();
        if let Some(ip) = ep.ipv4 {
            addressing.ipv4 = ip.to_string();
            addressing.ipv4_pool_name = ep.pool.clone();
        }
        if let Some(ip) = ep.ipv6 {
            addressing.ipv6 = ip.to_string();
            addressing.ipv6_pool_name = ep.pool.clone();
        }
        EndpointView {
            container_id: ep.container_id.clone(),
            container_interface_name: ep.ifname.clone(),
            interface_name: ep.host_ifname.clone(),
            owner: ep.owner.clone(),
            addressing,
            restored: self.restored_endpoints.contains(&ep.key()),
        }
    }

    /// `GET /v1/endpoint/{id}` for `cni-attachment-id:<cid>:<ifname>` or
    /// `container-id:<cid>`.
    pub fn endpoint(&self, id: &str) -> Result<EndpointView, ApiError> {
        let found = if let Some(rest) = id.strip_prefix("cni-attachment-id:") {
            match rest.rsplit_once(':') {
                Some((cid, ifname)) => self.endpoints.get(&EndpointRecord::key_of(cid, ifname)),
                None => self.endpoints.values().find(|e| e.container_id == rest),
            }
        } else if let Some(cid) = id.strip_prefix("container-id:") {
            self.endpoints.values().find(|e| e.container_id == cid)
        } else {
            return Err(ApiError::new(
                400,
                format!(
                    "unsupported endpoint id {id:?} (use cni-attachment-id:<containerID>:<ifname>)"
                ),
            ));
        };
        found
            .map(|e| self.view(e))
            .ok_or_else(|| ApiError::new(404, format!("endpoint {id} not found")))
    }

    /// `DELETE /v1/endpoint`: deletes the container's endpoints (or the one attachment)
    /// and releases their addresses, and any address still pending for them.
    pub fn delete_endpoints(
        &mut self,
        req: &EndpointBatchDeleteRequest,
    ) -> Result<usize, ApiError> {
        if req.container_id.is_empty() {
            return Err(ApiError::new(400, "invalid container id"));
        }
        let ifname = (!req.container_interface_name.is_empty())
            .then_some(req.container_interface_name.as_str());
        let mut ops = Vec::new();
        self.release_attachment(&req.container_id, ifname, &mut ops, "endpoint deleted")?;
        if ops.is_empty() {
            return Err(ApiError::new(404, "endpoints not found"));
        }
        self.commit(&ops)?;
        self.apply_releases(&ops);
        Ok(ops.len())
    }

    /// `POST /v1/cni/gc`: releases every allocation of `network` whose attachment is
    /// not in the valid set. Returns what was released and the host-side link names
    /// of the released attachments (the caller removes any that still exist).
    pub fn gc(&mut self, req: &GcRequest) -> Result<(GcResponse, Vec<(String, String)>), ApiError> {
        let valid: BTreeSet<(String, String)> = req
            .valid_attachments
            .iter()
            .map(|a| (a.container_id.clone(), a.ifname.clone()))
            .collect();
        let mut stale: BTreeSet<(String, String)> = BTreeSet::new();
        for rec in self.allocations.values() {
            if rec.state == AllocationState::Infra
                || rec.network.as_deref() != Some(req.network.as_str())
            {
                continue;
            }
            if let (Some(cid), Some(ifname)) = (&rec.container_id, &rec.ifname)
                && !valid.contains(&(cid.clone(), ifname.clone()))
            {
                stale.insert((cid.clone(), ifname.clone()));
            }
        }
        let mut ops = Vec::new();
        let mut released = Vec::new();
        for (cid, ifname) in &stale {
            let before = ops.len();
            self.release_attachment(cid, Some(ifname), &mut ops, "garbage collected")?;
            for op in &ops[before..] {
                if let JournalOp::DeleteAllocation { ip, .. } = op {
                    let owner = self
                        .allocations
                        .get(ip)
                        .map(|r| r.owner.clone())
                        .unwrap_or_default();
                    released.push(format!("{ip} ({owner})"));
                }
            }
        }
        if !ops.is_empty() {
            self.commit(&ops)?;
            self.apply_releases(&ops);
        }
        Ok((GcResponse { released }, stale.into_iter().collect()))
    }

    /// Fires an expiration timer: releases the address if it is still pending with
    /// the same UUID. Returns true if it released something.
    pub fn expire(&mut self, ip: IpAddr, uuid: &str) -> bool {
        let Some(rec) = self.allocations.get(&ip) else {
            return false;
        };
        if rec.state != AllocationState::Pending || rec.expiration_uuid.as_deref() != Some(uuid) {
            return false;
        }
        let owner = rec.owner.clone();
        if let Err(e) = self.commit(&[JournalOp::DeleteAllocation {
            pool: rec.pool.clone(),
            ip,
        }]) {
            tracing::error!(ip = %ip, error = %e.message, "could not journal an expiration; keeping the address");
            return false;
        }
        tracing::warn!(ip = %ip, owner = %owner, "Released IP after expiration");
        self.forget(ip, "expired");
        true
    }

    fn node_addressing(&self) -> NodeAddressing {
        let mut na = NodeAddressing::default();
        for r in &self.ranges {
            let el = NodeAddressingElement {
                enabled: true,
                ip: r.router.map(|ip| ip.to_string()).unwrap_or_default(),
                alloc_range: r.alloc.cidr().to_string(),
            };
            match r.family {
                Family::V4 => na.ipv4 = Some(el),
                Family::V6 => na.ipv6 = Some(el),
            }
        }
        na
    }

    /// `GET /v1/config`.
    pub fn config(&self) -> DaemonConfiguration {
        DaemonConfiguration {
            status: DaemonConfigurationStatus {
                addressing: self.node_addressing(),
                ipam_mode: self.cfg.ipam_mode.clone(),
                device_mtu: self.cfg.mtu,
                route_mtu: self.cfg.mtu,
                datapath_mode: "veth".into(),
                configured_datapath_mode: "veth".into(),
                node_name: self.cfg.node_name.clone(),
            },
        }
    }

    /// `GET /v1/healthz`: Cilium's status shape with podnet's per-range figures.
    pub fn status(&self) -> StatusResponse {
        let mut ipam = IpamStatus {
            mode: self.cfg.ipam_mode.clone(),
            node_name: self.cfg.node_name.clone(),
            ..Default::default()
        };
        let mut lines = Vec::new();
        for r in &self.ranges {
            let used = self
                .allocations
                .keys()
                .filter(|ip| family_of(ip) == r.family)
                .count() as u64;
            let list: Vec<String> = self
                .allocations
                .keys()
                .filter(|ip| family_of(ip) == r.family)
                .map(|ip| ip.to_string())
                .collect();
            match r.family {
                Family::V4 => ipam.ipv4 = Some(list),
                Family::V6 => ipam.ipv6 = Some(list),
            }
            lines.push(format!(
                "{}: {used}/{} allocated from {}",
                family_label(r.family),
                r.alloc.capacity(),
                r.alloc.cidr()
            ));
            ipam.ranges.push(RangeStatus {
                family: r.family.as_str().into(),
                cidr: r.alloc.cidr().to_string(),
                used,
                usable: r.alloc.usable(),
            });
        }
        ipam.status = lines.join(", ");
        for (ip, rec) in &self.allocations {
            let restored = match (&rec.container_id, &rec.ifname) {
                (Some(c), Some(i)) => self
                    .restored_endpoints
                    .contains(&EndpointRecord::key_of(c, i)),
                _ => false,
            };
            let mut owner = rec.owner.clone();
            if restored {
                owner.push_str(" [restored]");
            }
            if rec.state == AllocationState::Pending {
                owner.push_str(" [expiring]");
            }
            ipam.allocations.insert(ip.to_string(), owner);
        }
        let exhausted: Vec<&RangeStatus> =
            ipam.ranges.iter().filter(|r| r.is_exhausted()).collect();
        let cilium = if exhausted.is_empty() {
            StatusElement {
                state: "Ok".into(),
                msg: String::new(),
            }
        } else {
            StatusElement {
                state: "Warning".into(),
                msg: exhausted
                    .iter()
                    .map(|r| {
                        format!(
                            "{} range {} of node {} is full ({}/{} in use)",
                            r.family, r.cidr, self.cfg.node_name, r.used, r.usable
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            }
        };
        StatusResponse { cilium, ipam }
    }
}

fn fill_response(resp: &mut IpamResponse, rec: &AllocationRecord) {
    let el = IpamAddressResponse {
        ip: rec.ip.to_string(),
        expiration_uuid: rec.expiration_uuid.clone().unwrap_or_default(),
        pool: rec.pool.clone(),
        ..Default::default()
    };
    if rec.ip.is_ipv4() {
        resp.address.ipv4 = rec.ip.to_string();
        resp.address.ipv4_pool_name = rec.pool.clone();
        resp.ipv4 = Some(el);
    } else {
        resp.address.ipv6 = rec.ip.to_string();
        resp.address.ipv6_pool_name = rec.pool.clone();
        resp.ipv6 = Some(el);
    }
}

/// The family of an address.
pub fn family_of(ip: &IpAddr) -> Family {
    if ip.is_ipv4() { Family::V4 } else { Family::V6 }
}

fn family_label(f: Family) -> &'static str {
    match f {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
}
