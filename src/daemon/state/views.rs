//! Read-only views of the state, in its own types (`daemon::answers` builds
//! the wire answers from them): the configuration (`GET /v1/config`), the
//! node's status (its health, each range's fill, who holds each address, the
//! restore's figures: `GET /v1/healthz`) and endpoints.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;

use super::super::config::{DatapathMode, IpamMode};
use super::super::metrics::{CapacityLabels, FamilyLabels, Metrics, OutcomeLabels};
use super::super::node_check::{Severity, Verdict};
use super::NodeCidr;
use super::leaks::pod_of_owner;
use super::{ApiError, ErrorKind, FamilyAddressing, IpamState, NodeConfig, RestoreReport};
use crate::ipam::Family;
use crate::ipam::leaks::PodName;
use crate::ipam::range_fill::RangeFill;
use crate::node::NodeFacts;
use crate::store::{AllocationState, EndpointRecord, now_ms};

/// The node's IPAM as its status reports it.
#[derive(Debug, Clone)]
pub struct NodeStatus {
    pub health: Health,
    pub ipam_mode: IpamMode,
    pub node_name: String,
    /// The pod device type in use.
    pub datapath_mode: DatapathMode,
    /// The journal's file.
    pub journal: PathBuf,
    /// Why the journal cannot commit, while it cannot.
    pub journal_error: Option<String>,
    /// The pool of a pod that names none (`default` outside multi-pool).
    pub default_pool: String,
    pub multi_pool: bool,
    /// One line: each family's fill (its pools in multi-pool).
    pub summary: String,
    /// One per pool and family.
    pub ranges: Vec<RangeFill>,
    /// cluster-pool: the verdict on each of the node's CIDRs.
    pub pod_cidrs: Vec<NodeCidr>,
    /// What the last start restored and reconciled.
    pub restore: RestoreReport,
    /// Whether the configuration fits the node (the verdict and the facts it
    /// was made on), once the node's facts are known.
    pub config_check: Option<(Verdict, NodeFacts)>,
    /// Each address and who holds it; `None` for a brief status.
    pub addresses: Option<AddressBook>,
    /// Whether the plugin shapes `runtimeConfig.bandwidth`.
    pub bandwidth_manager: bool,
}

/// How the node is: whether it hands out addresses, and why not or what to
/// look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub level: HealthLevel,
    /// Empty when all is well.
    pub message: String,
}

/// Cilium's status levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthLevel {
    Ok,
    Warning,
    Failure,
}

/// Each family's addresses, and who holds each address.
#[derive(Debug, Clone, Default)]
pub struct AddressBook {
    /// Each enabled family, with its allocated addresses (cooling ones too).
    pub by_family: Vec<(Family, Vec<IpAddr>)>,
    pub holders: Vec<AddressHolder>,
}

/// One allocated address, its pool, its owner and how it is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressHolder {
    pub ip: IpAddr,
    pub pool: String,
    pub owner: String,
    pub hold: Hold,
}

/// How an address is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// By its owner; `restored` from the journal at start, `expiring` while
    /// the ADD that took it has not finished.
    InUse { restored: bool, expiring: bool },
    /// Released, cooling down for `left_ms` more.
    Cooling { left_ms: u64 },
    /// Released, held until its attachment's host links are gone.
    UntilTeardown,
}

/// An endpoint the state holds, and whether it was restored at start.
#[derive(Debug, Clone, PartialEq)]
pub struct RegisteredEndpoint {
    pub record: EndpointRecord,
    pub restored: bool,
}

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
    pub fn live_addresses(&self) -> BTreeSet<IpAddr> {
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

    /// `GET /v1/config`: the daemon's configuration, with each enabled
    /// family's router address and alloc range.
    pub fn config(&self) -> NodeConfig {
        NodeConfig {
            addressing: self
                .cfg
                .families
                .iter()
                .map(|family| FamilyAddressing {
                    family: *family,
                    router: self.routers.get(family).copied(),
                    alloc_range: self.node_addressing_cidr(*family),
                })
                .collect(),
            ipam_mode: self.cfg.ipam_mode,
            mtu: self.cfg.mtu,
            datapath_mode: self.cfg.datapath_mode,
            configured_datapath_mode: self.cfg.configured_datapath_mode,
            node_name: self.cfg.node_name.clone(),
            bandwidth_manager: self.cfg.bandwidth_manager,
        }
    }

    /// The endpoint `ep` as the state knows it.
    pub(super) fn registered(&self, ep: &EndpointRecord) -> RegisteredEndpoint {
        RegisteredEndpoint {
            restored: self.ledger.is_restored(&ep.container_id, &ep.ifname),
            record: ep.clone(),
        }
    }

    /// `GET /v1/endpoint/{id}` for `cni-attachment-id:<cid>:<ifname>` or
    /// `container-id:<cid>`.
    pub fn endpoint(&self, id: &str) -> Result<RegisteredEndpoint, ApiError> {
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
            .map(|e| self.registered(e))
            .ok_or_else(|| ApiError::new(ErrorKind::NotFound, format!("endpoint {id} not found")))
    }

    /// `GET /v1/healthz`: the node's health, each range's fill and, unless
    /// `brief`, each family's addresses and who holds them. Cooling addresses
    /// count as used.
    pub fn status(&self, brief: bool) -> NodeStatus {
        let ranges = self.range_fills();
        let lines: Vec<String> = self
            .cfg
            .families
            .iter()
            .filter_map(|family| self.family_summary(*family))
            .collect();
        let now = now_ms();
        let config_check = self
            .config_check()
            .map(|(verdict, facts)| (verdict.clone(), facts.clone()));
        let health = self.health(now, &ranges, config_check.as_ref().map(|c| &c.0));
        NodeStatus {
            health,
            ipam_mode: self.cfg.ipam_mode,
            node_name: self.cfg.node_name.clone(),
            datapath_mode: self.cfg.datapath_mode,
            journal: self.ledger.journal().path().to_path_buf(),
            journal_error: self.ledger.journal().failure().map(|f| f.message.clone()),
            default_pool: self.default_pool().to_string(),
            multi_pool: self.is_multi_pool(),
            summary: lines.join(", "),
            ranges,
            pod_cidrs: self.node_cidrs(),
            restore: self.restore_report.clone(),
            config_check,
            addresses: (!brief).then(|| self.address_book(now)),
            bandwidth_manager: self.cfg.bandwidth_manager,
        }
    }

    /// Each enabled family's ranges, one per pool: what status reports and the
    /// exhaustion rule reads (`pools`).
    pub(super) fn range_fills(&self) -> Vec<RangeFill> {
        let operator_error = self.sync.operator_error();
        let mut ranges = Vec::new();
        for &family in &self.cfg.families {
            for pool in self.pool_names(family) {
                let cooling = self
                    .ledger
                    .allocations()
                    .iter()
                    .filter(|r| Family::of_addr(&r.ip) == family)
                    .filter(|r| r.pool() == pool && r.state() == AllocationState::Cooling)
                    .count();
                ranges.push(RangeFill {
                    family,
                    cidr: self.pool_cidrs(&pool, family).join(" "),
                    used: self.pools.used(&pool, family),
                    usable: self.pools.usable(&pool, family),
                    cooling: cooling as u64,
                    can_grow: self.is_multi_pool()
                        && !operator_error.contains(&format!("\"{pool}\"")),
                    pool,
                });
            }
        }
        ranges
    }

    /// The pools that hold `family`.
    fn pool_names(&self, family: Family) -> Vec<String> {
        self.pools
            .names()
            .into_iter()
            .filter(|p| self.pools.has(p, family))
            .collect()
    }

    /// `family`'s part of the one-line status, if it has one.
    fn family_summary(&self, family: Family) -> Option<String> {
        if self.is_multi_pool() {
            return Some(format!(
                "{}: {} IPAM pool(s) available",
                family.label(),
                self.pool_names(family).len()
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

    /// Each enabled family's addresses, and who holds each address: cooling
    /// addresses with the time left, the others marked where they are restored
    /// or expiring.
    fn address_book(&self, now: u64) -> AddressBook {
        let by_family = self
            .cfg
            .families
            .iter()
            .map(|family| {
                let ips = self
                    .ledger
                    .allocations()
                    .iter()
                    .filter(|rec| Family::of_addr(&rec.ip) == *family)
                    .map(|rec| rec.ip)
                    .collect();
                (*family, ips)
            })
            .collect();
        let holders = self
            .ledger
            .allocations()
            .iter()
            .map(|rec| {
                let hold = if rec.state() == AllocationState::Cooling {
                    match rec.cooling_until_ms().unwrap_or(now) {
                        super::HOLD_UNTIL_TEARDOWN => Hold::UntilTeardown,
                        until => Hold::Cooling {
                            left_ms: until.saturating_sub(now),
                        },
                    }
                } else {
                    Hold::InUse {
                        restored: match (rec.container_id(), rec.ifname()) {
                            (Some(c), Some(i)) => self.ledger.is_restored(c, i),
                            _ => false,
                        },
                        expiring: rec.state() == AllocationState::Pending,
                    }
                };
                AddressHolder {
                    ip: rec.ip,
                    pool: rec.pool().to_string(),
                    owner: rec.owner().to_string(),
                    hold,
                }
            })
            .collect();
        AddressBook { by_family, holders }
    }

    /// The node's health: `Failure` while the journal fails, `Warning` naming
    /// each full range, else `Ok`; then the configuration check (with the whole
    /// text of each finding): an error makes it a `Failure` (no address is
    /// handed out), a warning an `Ok` a `Warning`; the message names each by
    /// option and reason.
    fn health(&self, now: u64, ranges: &[RangeFill], verdict: Option<&Verdict>) -> Health {
        let mut health = self.range_health(now, ranges);
        let Some(verdict) = verdict else {
            return health;
        };
        let named = |severity: Severity| {
            verdict
                .mismatches
                .iter()
                .filter(|m| m.severity() == severity)
                .map(|m| format!("{}: {}", m.option(), m.reason()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (errors, warnings) = (named(Severity::Error), named(Severity::Warning));
        let mut lines = Vec::new();
        if !errors.is_empty() {
            health.level = HealthLevel::Failure;
            lines.push(format!(
                "the configuration does not fit this node, no pod gets an address ({errors})"
            ));
        }
        if !warnings.is_empty() {
            if health.level == HealthLevel::Ok {
                health.level = HealthLevel::Warning;
            }
            lines.push(format!("configuration warning ({warnings})"));
        }
        for line in lines {
            health.message = match health.message.is_empty() {
                true => line,
                false => format!("{}; {line}", health.message),
            };
        }
        health
    }

    /// The health of the journal and the ranges: `Failure` while the journal
    /// fails, `Warning` naming each full range, else `Ok`.
    fn range_health(&self, now: u64, ranges: &[RangeFill]) -> Health {
        if let Some(f) = self.ledger.journal().failure() {
            return Health {
                level: HealthLevel::Failure,
                message: self.ledger.unavailable(&format!(
                    "{} (for {} s)",
                    f.message,
                    now.saturating_sub(f.since_ms) / 1000
                )),
            };
        }
        let exhausted: Vec<&RangeFill> = ranges.iter().filter(|r| r.is_exhausted()).collect();
        Health {
            level: if exhausted.is_empty() {
                HealthLevel::Ok
            } else {
                HealthLevel::Warning
            },
            message: exhausted
                .iter()
                .map(|r| {
                    format!(
                        "{} range {} of node {} is full ({}/{} in use, {} cooling)",
                        r.family.as_str(),
                        r.cidr,
                        self.cfg.node_name,
                        r.used,
                        r.usable,
                        r.cooling
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        }
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
