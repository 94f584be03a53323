//! Read-only views of the state: `GET /v1/config`, `GET /v1/healthz` (Cilium's
//! status shape plus podnet's per-range, cooling and restore figures) and endpoints.

use super::super::answers;
use super::super::metrics::{CapacityLabels, FamilyLabels, Metrics, OutcomeLabels};
use super::leaks::pod_of_owner;
use super::{ApiError, ErrorKind, IpamState};
use crate::api::models::*;
use crate::ipam::Family;
use crate::ipam::leaks::PodName;
use crate::store::{AllocationState, EndpointRecord, now_ms};

impl IpamState {
    /// Sets the gauges that mirror the state (capacity, use, cooling, restore).
    pub fn refresh_gauges(&self, m: &Metrics) {
        for b in self.pools.blocks() {
            let cap = i64::try_from(b.capacity).unwrap_or(i64::MAX);
            m.capacity
                .get_or_create(&CapacityLabels {
                    family: b.family.as_str().into(),
                    cidr: b.cidr.to_string(),
                })
                .set(cap);
        }
        for family in &self.cfg.families {
            let in_family = || {
                self.ledger
                    .allocations()
                    .iter()
                    .filter(|rec| Family::of_addr(&rec.ip) == *family)
            };
            let labels = FamilyLabels {
                family: family.as_str().into(),
            };
            m.addresses
                .get_or_create(&labels)
                .set(in_family().count() as i64);
            let cooling = in_family()
                .filter(|rec| rec.state() == AllocationState::Cooling)
                .count() as i64;
            m.cooling.get_or_create(&labels).set(cooling);
        }
        let rr = &self.restore_report;
        for (outcome, n) in [
            ("restored", rr.restored),
            ("expired", rr.expired),
            ("cooled-down", rr.cooled_down),
            ("queued-deletes", rr.queued_deletes),
            ("outside-ranges", rr.outside_ranges.len()),
            ("released-link-gone", rr.released_link_gone.len()),
            ("orphan-links-removed", rr.orphan_links_removed.len()),
            ("adopted-from-kernel", rr.adopted_from_kernel.len()),
            ("unaccounted-links-kept", rr.unaccounted_links_kept.len()),
        ] {
            m.restore
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.into(),
                })
                .set(n as i64);
        }
    }

    /// Addresses a pod or the node holds (not cooling).
    pub fn live_addresses(&self) -> std::collections::BTreeSet<std::net::IpAddr> {
        self.ledger
            .allocations()
            .iter()
            .filter(|r| r.state() != AllocationState::Cooling)
            .map(|r| r.ip)
            .collect()
    }

    /// The daemon's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The node's alloc range of a family: the node CIDR (host-scope) or the
    /// first block of the default pool (multi-pool).
    pub(super) fn node_addressing_cidr(&self, family: Family) -> Option<String> {
        self.pool_cidrs(self.default_pool(), family)
            .into_iter()
            .next()
    }

    /// Every CIDR `pool` holds in `family`, in the order they came.
    pub(super) fn pool_cidrs(&self, pool: &str, family: Family) -> Vec<String> {
        self.pools
            .blocks()
            .into_iter()
            .filter(|b| b.pool == pool && b.family == family)
            .map(|b| b.cidr.to_string())
            .collect()
    }

    pub(super) fn node_addressing(&self) -> NodeAddressing {
        let mut na = NodeAddressing::default();
        for family in &self.cfg.families {
            let el = NodeAddressingElement {
                enabled: true,
                ip: self
                    .routers
                    .get(family)
                    .map(|ip| ip.to_string())
                    .unwrap_or_default(),
                alloc_range: self.node_addressing_cidr(*family).unwrap_or_default(),
            };
            match family {
                Family::V4 => na.ipv4 = Some(el),
                Family::V6 => na.ipv6 = Some(el),
            }
        }
        na
    }

    /// The allocation map key: the address, or `pool/ip` outside the default pool.
    fn status_key(&self, ip: std::net::IpAddr, pool: &str) -> String {
        if pool == self.default_pool() {
            ip.to_string()
        } else {
            format!("{pool}/{ip}")
        }
    }

    /// `GET /v1/config`.
    pub fn config(&self) -> DaemonConfiguration {
        DaemonConfiguration {
            status: DaemonConfigurationStatus {
                addressing: self.node_addressing(),
                ipam_mode: self.cfg.ipam_mode.to_string(),
                device_mtu: self.cfg.mtu,
                route_mtu: self.cfg.mtu,
                datapath_mode: self.cfg.datapath_mode.to_string(),
                configured_datapath_mode: self.cfg.configured_datapath_mode.to_string(),
                node_name: self.cfg.node_name.clone(),
            },
        }
    }

    pub(super) fn view(&self, ep: &EndpointRecord) -> EndpointView {
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
            restored: self.ledger.is_restored(&ep.container_id, &ep.ifname),
        }
    }

    /// `GET /v1/endpoint/{id}` for `cni-attachment-id:<cid>:<ifname>` or
    /// `container-id:<cid>`.
    pub fn endpoint(&self, id: &str) -> Result<EndpointView, ApiError> {
        let found = if let Some(rest) = id.strip_prefix("cni-attachment-id:") {
            match rest.rsplit_once(':') {
                Some((cid, ifname)) => self
                    .ledger
                    .endpoints()
                    .get(&EndpointRecord::key_of(cid, ifname)),
                None => self
                    .ledger
                    .endpoints()
                    .values()
                    .find(|e| e.container_id == rest),
            }
        } else if let Some(cid) = id.strip_prefix("container-id:") {
            self.ledger
                .endpoints()
                .values()
                .find(|e| e.container_id == cid)
        } else {
            return Err(ApiError::new(
                ErrorKind::Invalid,
                format!(
                    "unsupported endpoint id {id:?} (use cni-attachment-id:<containerID>:<ifname>)"
                ),
            ));
        };
        found
            .map(|e| self.view(e))
            .ok_or_else(|| ApiError::new(ErrorKind::NotFound, format!("endpoint {id} not found")))
    }

    /// `status_brief(false)`, for the unit tests.
    #[cfg(test)]
    pub(super) fn status(&self) -> StatusResponse {
        self.status_brief(false)
    }

    /// `GET /v1/healthz`: Cilium's status shape with podnet's per-range figures,
    /// without the per-address maps and lists when `brief`. Cooling addresses
    /// count as used; they are listed under `cooling`, not `allocations` (nobody
    /// owns them).
    pub fn status_brief(&self, brief: bool) -> StatusResponse {
        let mut ipam = IpamStatus {
            mode: self.cfg.ipam_mode.to_string(),
            node_name: self.cfg.node_name.clone(),
            restore: answers::restore::restore_status(&self.restore_report),
            datapath: self.cfg.datapath_mode.to_string(),
            journal: self.ledger.journal().path().display().to_string(),
            default_pool: if self.is_multi_pool() {
                self.default_pool().to_string()
            } else {
                String::new()
            },
            ..Default::default()
        };
        let now = now_ms();
        let operator_error = self.sync.operator_error().to_string();
        let lines: Vec<String> = self
            .cfg
            .families
            .iter()
            .filter_map(|family| self.family_status(*family, brief, &operator_error, &mut ipam))
            .collect();
        ipam.status = lines.join(", ");
        ipam.pod_cidrs = answers::cidrs::pod_cidr_lines(&self.node_cidrs());
        if !brief {
            self.add_address_owners(now, &mut ipam);
        }
        let cilium = self.overall_status(now, &mut ipam);
        let mut status = StatusResponse { cilium, ipam };
        self.add_config_check(&mut status);
        status
    }

    /// Fills `family`'s ranges (one per pool) into `ipam`, and its address list
    /// unless `brief`; returns the family's part of the one-line status, if it
    /// has one.
    fn family_status(
        &self,
        family: Family,
        brief: bool,
        operator_error: &str,
        ipam: &mut IpamStatus,
    ) -> Option<String> {
        let in_family = || {
            self.ledger
                .allocations()
                .iter()
                .filter(move |rec| Family::of_addr(&rec.ip) == family)
        };
        if !brief {
            let list: Vec<String> = in_family().map(|rec| rec.ip.to_string()).collect();
            match family {
                Family::V4 => ipam.ipv4 = Some(list),
                Family::V6 => ipam.ipv6 = Some(list),
            }
        }
        let pools: Vec<String> = self
            .pools
            .names()
            .into_iter()
            .filter(|p| self.pools.has(p, family))
            .collect();
        for pool in &pools {
            let blocks = self.pool_cidrs(pool, family);
            let cooling = in_family()
                .filter(|r| r.pool() == pool && r.state() == AllocationState::Cooling)
                .count();
            ipam.ranges.push(RangeStatus {
                family: family.as_str().into(),
                cidr: blocks.join(" "),
                used: self.pools.used(pool, family),
                usable: self.pools.usable(pool, family),
                cooling: cooling as u64,
                pool: pool.clone(),
                can_grow: self.is_multi_pool() && !operator_error.contains(&format!("\"{pool}\"")),
            });
        }
        if self.is_multi_pool() {
            return Some(format!(
                "{}: {} IPAM pool(s) available",
                family.label(),
                pools.len()
            ));
        }
        let blocks: Vec<_> = self
            .pools
            .blocks()
            .into_iter()
            .filter(|b| b.family == family)
            .collect();
        if blocks.is_empty() {
            return None;
        }
        let cidrs: Vec<String> = blocks.iter().map(|b| b.cidr.to_string()).collect();
        Some(format!(
            "{}: {}/{} allocated from {}",
            family.label(),
            blocks.iter().map(|b| b.used).sum::<u64>(),
            blocks.iter().map(|b| b.capacity).sum::<u64>(),
            cidrs.join(", ")
        ))
    }

    /// Fills who holds each address into `ipam`: cooling addresses (with the
    /// time left) under `cooling`, the others under `allocations`, marked
    /// `[restored]` and `[expiring]` where they are.
    fn add_address_owners(&self, now: u64, ipam: &mut IpamStatus) {
        for rec in self.ledger.allocations().iter() {
            if rec.state() == AllocationState::Cooling {
                let until = rec.cooling_until_ms().unwrap_or(now);
                ipam.cooling.insert(
                    self.status_key(rec.ip, rec.pool()),
                    if until == super::HOLD_UNTIL_TEARDOWN {
                        format!("{} (held until its links are gone)", rec.owner())
                    } else {
                        format!("{} ({} ms left)", rec.owner(), until.saturating_sub(now))
                    },
                );
                continue;
            }
            let restored = match (rec.container_id(), rec.ifname()) {
                (Some(c), Some(i)) => self.ledger.is_restored(c, i),
                _ => false,
            };
            let mut owner = rec.owner().to_string();
            if restored {
                owner.push_str(" [restored]");
            }
            if rec.state() == AllocationState::Pending {
                owner.push_str(" [expiring]");
            }
            ipam.allocations
                .insert(self.status_key(rec.ip, rec.pool()), owner);
        }
    }

    /// The overall state: `Failure` while the journal fails (its error also goes
    /// into `ipam`), `Warning` naming each full range, else `Ok`.
    fn overall_status(&self, now: u64, ipam: &mut IpamStatus) -> StatusElement {
        if let Some(f) = self.ledger.journal().failure() {
            ipam.journal_error = f.message.clone();
            return StatusElement {
                state: "Failure".into(),
                msg: self.ledger.unavailable(&format!(
                    "{} (for {} s)",
                    f.message,
                    now.saturating_sub(f.since_ms) / 1000
                )),
            };
        }
        let exhausted: Vec<&RangeStatus> =
            ipam.ranges.iter().filter(|r| r.is_exhausted()).collect();
        if exhausted.is_empty() {
            return StatusElement {
                state: "Ok".into(),
                msg: String::new(),
            };
        }
        StatusElement {
            state: "Warning".into(),
            msg: exhausted
                .iter()
                .map(|r| {
                    format!(
                        "{} range {} of node {} is full ({}/{} in use, {} cooling)",
                        r.family, r.cidr, self.cfg.node_name, r.used, r.usable, r.cooling
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        }
    }

    /// Adds the configuration check (`ipam.config-check`, with the whole text of
    /// each finding): an error makes the state a `Failure` (no address is handed
    /// out), a warning an `Ok` state a `Warning`; the message names each by option
    /// and reason.
    fn add_config_check(&self, status: &mut StatusResponse) {
        let Some((verdict, facts)) = self.config_check() else {
            return;
        };
        let check = answers::config_check::config_check_status(verdict, facts);
        let named = |severity: &str| {
            check
                .findings
                .iter()
                .filter(|f| f.severity == severity)
                .map(|f| format!("{}: {}", f.option, f.reason))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (errors, warnings) = (named("error"), named("warning"));
        let cilium = &mut status.cilium;
        let mut lines = Vec::new();
        if !errors.is_empty() {
            cilium.state = "Failure".into();
            lines.push(format!(
                "the configuration does not fit this node, no pod gets an address ({errors})"
            ));
        }
        if !warnings.is_empty() {
            if cilium.state == "Ok" {
                cilium.state = "Warning".into();
            }
            lines.push(format!("configuration warning ({warnings})"));
        }
        for line in lines {
            cilium.msg = match cilium.msg.is_empty() {
                true => line,
                false => format!("{}; {line}", cilium.msg),
            };
        }
        status.ipam.config_check = Some(check);
    }
}

impl IpamState {
    /// The pods a delegated IPAM plugin addressed (`delegated-plugin`: the
    /// plugin registers them as `external-ipam` endpoints, and the ledger holds
    /// no allocation of theirs), each with its host link. The policy loop takes
    /// their addresses from the Pods' `status.podIPs`, as every pod's.
    pub fn delegated_pods(&self) -> Vec<(PodName, String)> {
        self.ledger
            .endpoints()
            .values()
            .filter(|ep| ep.external_ipam && !ep.host_ifname.is_empty())
            .filter_map(|ep| Some((pod_of_owner(&ep.owner)?, ep.host_ifname.clone())))
            .collect()
    }
}
