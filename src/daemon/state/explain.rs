//! Answers "why does this pod have this address, or none": the allocation records
//! that match a pod (`ns/name`), an address or a container ID, the rule and range
//! behind each, and the recent failures that match with the chapter's
//! troubleshooting hint. Failures are kept in a bounded ring, so explain can answer
//! after the fact. The plugin's reports (timings, failures) are recorded here too.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use super::requested::ADDRESS_CODE;
use super::{Allocation, IpamState, MAX_FAILURES};
use crate::datapath::host_ifname;
use crate::ipam::Family;
use crate::ipam::address_request::ANNOTATION_IP_ADDRESSES;
use crate::store::{AllocationState, now_ms};

/// A failure the daemon refused with or the plugin reported, remembered for
/// `explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub at_ms: u64,
    pub verb: String,
    pub owner: String,
    pub container_id: String,
    pub ifname: String,
    pub reason: String,
    pub message: String,
    /// What to do about it ([`hint_for`]).
    pub hint: &'static str,
}

/// What the plugin reported of one ADD or DEL (`POST /v1/cni/report`): its
/// phase timings and, for a failure, its reason and error.
#[derive(Debug, Clone, Copy)]
pub struct PluginReport<'a> {
    pub verb: &'a str,
    pub container_id: &'a str,
    pub ifname: &'a str,
    pub owner: &'a str,
    /// Phase name → seconds.
    pub phases: &'a BTreeMap<String, f64>,
    /// Short machine reason of a failure (empty: none given).
    pub reason: &'a str,
    /// The failure's message (empty: no failure).
    pub error: &'a str,
}

/// One allocation that matches a query, and why it is where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExplainedAddress {
    pub ip: IpAddr,
    pub pool: String,
    pub owner: String,
    pub state: AllocationState,
    pub container_id: String,
    pub ifname: String,
    pub network: String,
    /// The rule that chose the pool and the address, in words.
    pub rule: String,
    /// The node range the address comes from, in words.
    pub range: String,
    pub allocated_at_ms: u64,
    /// Pending: when it expires; cooling: when it is free again; else 0.
    pub until_ms: u64,
    /// Restored from the journal at start.
    pub restored: bool,
    /// The host-side link of its attachment (empty: none).
    pub host_link: String,
}

/// What the state knows of a query (an address, a container ID or an owner):
/// the matching allocations, the recent failures that match, newest first, and
/// the answer in one paragraph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    pub addresses: Vec<ExplainedAddress>,
    pub failures: Vec<Failure>,
    pub summary: String,
}

/// What to do about a failure of `reason` (the chapter's troubleshooting table).
pub fn hint_for(reason: &str) -> &'static str {
    match reason {
        "range-full" => {
            "the node's range is full: reduce pod density on this node or add nodes. In cluster-pool mode the operator gives a nearly full node another range, up to cluster-pool-extra-cidrs-max (podnet status lists the node's CIDRs); a node range keeps its size, but a pool CIDR appended as <cidr>@<mask> gives new ranges of that size (no operator restart). Released addresses also count until their cooldown ends (podnet status shows cooling)"
        }
        "rejected" => {
            "the daemon refused the request: check the pool name and the family against podnet status"
        }
        "pool-not-available" => {
            "the pool does not exist on this node (yet): create the CiliumPodIPPool (in the daemon's --pool-dir, or kubectl get cpip in a cluster) or fix the ipam.cilium.io/ip-pool annotation of the pod or its namespace"
        }
        "pool-selection" => {
            "no single pool could be chosen: with two matching pools tighten their podSelector/namespaceSelector; with require-pool-match add a matching pool or an ipam.cilium.io/ip-pool annotation; a missing Pod or Namespace means the metadata (--metadata-dir) lacks it"
        }
        "daemon-unavailable" => {
            "the daemon did not answer: check that podnet daemon runs on this node and that socket-path in the CNI config matches its --socket"
        }
        "datapath" => {
            "a kernel operation failed: the message names the link or route; check the node's namespace (ip link, ip route) and kernel logs"
        }
        "interface-exists" => {
            "the pod's netns already has an interface of that name that podnet did not create: another plugin or a leftover; remove it or pick another CNI_IFNAME"
        }
        "netns-missing" => {
            "the pod's network namespace was gone before podnet ran: the runtime will retry or tear the pod down"
        }
        "journal-unavailable" => {
            "the daemon cannot write its journal (the filesystem of its --state-dir is full or failing): free space or fix the disk there; the daemon reopens the journal by itself and then serves again (podnet status shows the journal error meanwhile)"
        }
        "node-config" => {
            "the configuration does not fit this node (the message names the option): change enable-ipv4/enable-ipv6 (in tunnel routing also underlay-protocol) in the ConfigMap and restart the agent, or give the node the missing address (kubelet --node-ip), which the agent sees by itself; podnet status (Config:) and the CiliumNode's podnet.io/ConfigFitsNode condition say the same"
        }
        "address-annotation" => {
            "fix the pod's ipam.podnet.io/ip-addresses annotation (one address per family: \"10.0.1.5\" or \"10.0.1.5,fd00::5\"), or remove it; the message names what is wrong. The annotation is read in the cluster-pool, kubernetes, multi-pool, crd and eni modes"
        }
        "address-taken" => {
            "another pod (named in the message) holds the address the annotation asks for: delete that pod or ask for another address; a released address cools down (ipam-release-cooldown) before another pod may have it. podnet explain <address> shows the holder"
        }
        "address-outside-node" => {
            "the address is outside the ranges (multi-pool: blocks of the pod's pool) this node holds, named in the message: schedule the pod to the node whose range holds it (nodeSelector/nodeName), or ask for an address inside this node's ranges (podnet status lists them)"
        }
        "address-not-in-pool" => {
            "the address is in no pool, or in another pool than the pod's (named in the message): ask for an address of the pod's pool, or select the other pool with ipam.cilium.io/ip-pool"
        }
        "sticky-waiting" => {
            "the pod's sticky address (ipam.podnet.io/sticky-pool) is not on this node yet: the agent asked the operator in the CiliumNode annotation ipam.podnet.io/sticky-requests and the answer (ipam.podnet.io/sticky-status) is pending, or names the node that still holds the address until its pod is gone there; the runtime retries the pod by itself. If it lasts, check that podnet operator runs (multi-pool) and the old node's agent (kubectl get ciliumnode <node> -o yaml)"
        }
        "sticky-refused" => {
            "the pod's sticky address cannot be served (the message says why): the annotation ipam.podnet.io/sticky-pool must name a CiliumPodIPPool annotated ipam.podnet.io/sticky: \"true\" with one family and maskSize 32 (IPv4) or 128 (IPv6), in multi-pool with podnet operator, on a StatefulSet's pod (its controller an apps StatefulSet, its name <statefulset>-<ordinal>); a full pool needs another CIDR: identities are released by their StatefulSet's persistentVolumeClaimRetentionPolicy (whenScaled/whenDeleted: Delete), and an admin frees a retained one by removing it from the pool's ipam.podnet.io/sticky-owners"
        }
        "invalid-config" => {
            "fix the CNI network config or the runtime's CNI variables named in the message"
        }
        _ => "see the message; podnet status and the daemon log have the node's side",
    }
}

impl IpamState {
    /// Remembers a failure (bounded) and counts it.
    pub(super) fn record_failure(
        &mut self,
        verb: &str,
        reason: &str,
        message: &str,
        owner: &str,
        container_id: Option<&str>,
        ifname: Option<&str>,
    ) {
        self.metrics.failure(reason);
        if self.failures.len() >= MAX_FAILURES {
            self.failures.pop_front();
        }
        self.failures.push_back(Failure {
            at_ms: now_ms(),
            verb: verb.into(),
            owner: owner.into(),
            container_id: container_id.unwrap_or_default().into(),
            ifname: ifname.unwrap_or_default().into(),
            reason: reason.into(),
            message: message.into(),
            hint: hint_for(reason),
        });
    }

    /// `POST /v1/cni/report`: the plugin's timings, and its failure if any.
    /// Allocation failures were already recorded by the daemon itself.
    pub fn cni_report(&mut self, report: PluginReport) {
        for (phase, secs) in report.phases {
            self.metrics.phase(report.verb, phase, *secs);
        }
        if !report.error.is_empty() && report.reason != "allocation" {
            let reason = if report.reason.is_empty() {
                "other"
            } else {
                report.reason
            };
            self.record_failure(
                report.verb,
                reason,
                report.error,
                report.owner,
                Some(report.container_id),
                Some(report.ifname),
            );
        }
    }

    /// Timings that came with a request instead of a report (`podnet-phases`: an
    /// ADD's endpoint registration, a DEL's release): the plugin's phases up to
    /// that request, and `handled_phase`, how long the daemon took with the
    /// request (journal commit included), which also goes into `total`. Nothing
    /// for a client that sends no timings (Cilium's).
    pub fn plugin_timings(
        &mut self,
        verb: &str,
        phases: &BTreeMap<String, f64>,
        handled_phase: &str,
        handled: Duration,
    ) {
        if phases.is_empty() {
            return;
        }
        let handled = handled.as_secs_f64();
        for (phase, secs) in phases {
            let secs = if phase == "total" {
                secs + handled
            } else {
                *secs
            };
            self.metrics.phase(verb, phase, secs);
        }
        self.metrics.phase(verb, handled_phase, handled);
    }

    /// `GET /v1/explain?q=`: matches an address, a container ID or an owner.
    pub fn explain(&self, query: &str) -> Explanation {
        let ip: Option<IpAddr> = query.parse().ok();
        let matches = |rec: &Allocation| {
            Some(rec.ip) == ip
                || rec.container_id() == Some(query)
                || rec.owner() == query
                || rec.owner().strip_suffix(" [from kernel]") == Some(query)
        };
        let addresses: Vec<ExplainedAddress> = self
            .ledger
            .allocations()
            .iter()
            .filter(|r| matches(r))
            .map(|r| self.explain_record(&r))
            .collect();
        let failures: Vec<Failure> = self
            .failures
            .iter()
            .rev()
            .filter(|f| {
                f.owner == query
                    || f.container_id == query
                    || ip.is_some_and(|ip| f.message.contains(&ip.to_string()))
            })
            .take(10)
            .cloned()
            .collect();
        let summary = summarize(query, &addresses, &failures);
        Explanation {
            addresses,
            failures,
            summary,
        }
    }

    fn explain_record(&self, rec: &Allocation) -> ExplainedAddress {
        let family = Family::of_addr(&rec.ip);
        let range = self
            .pools
            .locate(rec.ip)
            .map(|(pool, cidr)| format!("{cidr} (block of pool {pool})"))
            .unwrap_or_else(|| {
                "outside the node's current ranges (kept until its pod is deleted)".into()
            });
        let until = match rec.state() {
            AllocationState::Pending => rec.expires_at_ms().unwrap_or(0),
            AllocationState::Bound | AllocationState::Infra => 0,
            AllocationState::Cooling => rec.cooling_until_ms().unwrap_or(0),
        };
        let restored = match (rec.container_id(), rec.ifname()) {
            (Some(c), Some(i)) => self.ledger.is_restored(c, i),
            _ => false,
        };
        let host_link = match (rec.host_ifname(), rec.container_id(), rec.ifname()) {
            (Some(h), _, _) => h.to_string(),
            (None, Some(c), Some(i)) => host_ifname(c, i),
            _ => String::new(),
        };
        ExplainedAddress {
            ip: rec.ip,
            pool: rec.pool().to_string(),
            owner: rec.owner().to_string(),
            state: rec.state(),
            container_id: rec.container_id().unwrap_or_default().to_string(),
            ifname: rec.ifname().unwrap_or_default().to_string(),
            network: rec.network().unwrap_or_default().to_string(),
            rule: self.rule(rec, family),
            range,
            allocated_at_ms: rec.allocated_at_ms(),
            until_ms: until,
            restored,
            host_link,
        }
    }
}

impl IpamState {
    /// Why `rec` has its pool and address: the pool-selection step, the node's
    /// own address, or the mode's rule; and whether the pod's annotation named the
    /// address.
    fn rule(&self, rec: &Allocation<'_>, family: Family) -> String {
        let (pool_code, asked) = split_code(rec.selected_by());
        let rule = match (pool_code, rec.state()) {
            (Some(code), _) => format!(
                "pool {} chosen by: {}",
                rec.pool(),
                super::pools::selection_text(code)
            ),
            (None, AllocationState::Infra) => format!(
                "the node's own {} address, from pool {}",
                rec.owner(),
                rec.pool()
            ),
            (None, _) => format!(
                "ipam mode {}: {} address of node {} from pool {}",
                self.cfg.ipam_mode,
                family.label(),
                self.cfg.node_name,
                rec.pool()
            ),
        };
        if asked {
            format!(
                "{rule}; the address is the one the pod's {ANNOTATION_IP_ADDRESSES} annotation asks for"
            )
        } else {
            rule
        }
    }
}

/// A `selected_by` code as the pool's part and whether the annotation named the
/// address (`requested_code`).
fn split_code(code: Option<&str>) -> (Option<&str>, bool) {
    match code {
        Some(ADDRESS_CODE) => (None, true),
        Some(c) => match c
            .strip_suffix(ADDRESS_CODE)
            .and_then(|p| p.strip_suffix('+'))
        {
            Some(pool_code) => (Some(pool_code), true),
            None => (Some(c), false),
        },
        None => (None, false),
    }
}

fn summarize(query: &str, addresses: &[ExplainedAddress], failures: &[Failure]) -> String {
    let now = now_ms();
    let mut parts = Vec::new();
    for a in addresses {
        let what = match a.state {
            AllocationState::Pending => format!(
                "{} is handed out to {} but its endpoint is not created yet; it is released in {} s unless ADD completes",
                a.ip,
                a.owner,
                a.until_ms.saturating_sub(now) / 1000
            ),
            AllocationState::Cooling => format!(
                "{} was released from {} and is not handed out again for {} s",
                a.ip,
                a.owner,
                a.until_ms.saturating_sub(now) / 1000
            ),
            AllocationState::Infra => format!("{} is the node's {} address", a.ip, a.owner),
            AllocationState::Bound => format!(
                "{} belongs to {} (container {}, {}), from {}{}",
                a.ip,
                a.owner,
                a.container_id,
                a.ifname,
                a.range,
                if a.restored {
                    ", restored after a daemon restart"
                } else {
                    ""
                }
            ),
        };
        parts.push(what);
    }
    if let Some(f) = failures.first() {
        parts.push(format!(
            "last failure: {} ({}). Hint: {}",
            f.message, f.reason, f.hint
        ));
    }
    if parts.is_empty() {
        format!(
            "nothing matches {query:?}: no address, container or pod of that name is known to this node's daemon, and no recent failure names it"
        )
    } else {
        parts.join(". ")
    }
}
