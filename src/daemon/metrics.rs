//! Prometheus metrics: Cilium's agent IPAM names under a configurable prefix
//! (`podnet_` by default, `cilium_` for dashboards built for Cilium), plus what no
//! anchor exposes: CNI latency per phase (as the daemon and the plugin saw it),
//! allocation failures by reason, restore outcomes, DEL-queue depth and entries set
//! aside as unreadable, cooling addresses, and the source check's drops (Cilium's
//! `drop_count_total` / `drop_bytes_total`, read from the kernel's counters at
//! each scrape). Served as text on
//! `--prometheus-serve-addr` (off by default).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::process::metrics_text;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CapacityLabels {
    pub family: String,
    pub cidr: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    pub action: String,
    pub family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabels {
    pub family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub verb: String,
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    pub reason: String,
    pub family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FoundLabels {
    pub found: String,
}

/// A policy verdict the kernel logged: `ingress`/`egress`, `denied`/`audit`,
/// and what decided it (`default deny of NetworkPolicy ns/name`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabels {
    pub direction: String,
    pub verdict: String,
    pub policy: String,
}

fn latency_histogram() -> Histogram {
    // 50 µs .. ~1.6 s
    Histogram::new(exponential_buckets(0.00005, 2.0, 16))
}

/// Every metric the daemon exports.
pub struct Metrics {
    registry: Registry,
    pub capacity: Family<CapacityLabels, Gauge>,
    pub events: Family<EventLabels, Counter>,
    pub addresses: Family<FamilyLabels, Gauge>,
    pub cooling: Family<FamilyLabels, Gauge>,
    pub phase_seconds: Family<PhaseLabels, Histogram, fn() -> Histogram>,
    pub failures: Family<ReasonLabels, Counter>,
    pub restore: Family<OutcomeLabels, Gauge>,
    pub queue_depth: Gauge,
    pub queue_bad_entries: Gauge,
    pub drops: Family<DropLabels, Counter>,
    pub drop_bytes: Family<DropLabels, Counter>,
    /// Allocations the last leak check found leaked (pod gone by UID, host link
    /// gone, past the grace period).
    pub leaks: Gauge,
    /// Leaked allocations the leak check released.
    pub leaks_released: Counter,
    /// NetworkPolicy and ClusterNetworkPolicy problems in the last compile.
    pub policy_problems: Gauge,
    /// Writes of the policy table, by result (installed, updated, failed).
    pub policy_updates: Family<ResultLabels, Counter>,
    /// How long each of those writes took (the `nft` run), by result.
    pub policy_write_seconds: Family<ResultLabels, Histogram, fn() -> Histogram>,
    /// Local pods with a policy chain in the table.
    pub policy_pods_enforced: Gauge,
    /// Policy tables installed again because a resync found the kernel's not
    /// as written, by what it found (missing, differs).
    pub policy_table_repairs: Family<FoundLabels, Counter>,
    /// Policy verdicts logged by the kernel and read, by direction, verdict
    /// and policy.
    pub policy_verdicts: Family<VerdictLabels, Counter>,
    /// Verdict log records the node-wide limits suppressed (the kernel's counter).
    pub policy_verdicts_suppressed: Counter,
    /// Verdict lines slow `podnet observe` clients lost.
    pub policy_observe_lines_lost: Counter,
    /// Verdict log records that could not be read (or were lost to a full
    /// receive buffer).
    pub policy_verdict_records_unreadable: Counter,
    /// L2 announcements: addresses this node answers for.
    pub l2_answered: Gauge,
    /// L2 announcements: addresses this node began to answer for.
    pub l2_takeovers: Counter,
    /// L2 announcements: nodes heard from lately (this one included).
    pub l2_nodes_live: Gauge,
    /// L2 announcements: problems (policies' fields, addresses not placed).
    pub l2_problems: Gauge,
    /// L2 announcements: ARP replies, neighbour advertisements and gratuitous
    /// announcements sent, by kind.
    pub l2_sent: Family<KindLabels, Counter>,
    /// L2 announcements: heartbeats by event (sent, received, refused, send-error).
    pub l2_heartbeats: Family<HeartbeatLabels, Counter>,
    /// Pod bandwidth: local pods with a limit set (the last pass).
    pub bandwidth_pods_shaped: Gauge,
    /// Pod bandwidth: annotation values refused (each posted as an Event).
    pub bandwidth_invalid_annotations: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeartbeatLabels {
    pub event: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

/// The L2 announcement figures of one scrape.
#[derive(Debug, Clone, Default)]
pub struct L2Figures {
    pub answered: u64,
    pub takeovers: u64,
    pub nodes_live: u64,
    pub problems: u64,
    /// (kind, count) of what the responder sent.
    pub sent: Vec<(&'static str, u64)>,
    /// (event, count) of the heartbeats.
    pub heartbeats: Vec<(&'static str, u64)>,
}

impl Metrics {
    /// All metrics, named `<prefix>_...`.
    pub fn new(prefix: &str) -> Metrics {
        let mut registry = Registry::with_prefix(prefix);
        let m = Metrics {
            registry: Registry::default(),
            capacity: Family::default(),
            events: Family::default(),
            addresses: Family::default(),
            cooling: Family::default(),
            phase_seconds: Family::new_with_constructor(latency_histogram),
            failures: Family::default(),
            restore: Family::default(),
            queue_depth: Gauge::default(),
            queue_bad_entries: Gauge::default(),
            drops: Family::default(),
            drop_bytes: Family::default(),
            leaks: Gauge::default(),
            leaks_released: Counter::default(),
            policy_problems: Gauge::default(),
            policy_updates: Family::default(),
            policy_write_seconds: Family::new_with_constructor(latency_histogram),
            policy_pods_enforced: Gauge::default(),
            policy_table_repairs: Family::default(),
            policy_verdicts: Family::default(),
            policy_verdicts_suppressed: Counter::default(),
            policy_observe_lines_lost: Counter::default(),
            policy_verdict_records_unreadable: Counter::default(),
            l2_answered: Gauge::default(),
            l2_takeovers: Counter::default(),
            l2_nodes_live: Gauge::default(),
            l2_problems: Gauge::default(),
            l2_sent: Family::default(),
            l2_heartbeats: Family::default(),
            bandwidth_pods_shaped: Gauge::default(),
            bandwidth_invalid_annotations: Counter::default(),
        };
        m.register_all(&mut registry);
        Metrics { registry, ..m }
    }

    /// Registers every metric of `self` in `registry`, with its help text.
    fn register_all(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "ipam_capacity",
            "Addresses the node's range can hold, per family and CIDR",
            m.capacity.clone(),
        );
        registry.register(
            "ipam_events",
            "IPAM allocations and releases",
            m.events.clone(),
        );
        registry.register(
            "ip_addresses",
            "Addresses in use (cooling included), per family",
            m.addresses.clone(),
        );
        registry.register(
            "ipam_cooling_addresses",
            "Released addresses still cooling down, per family",
            m.cooling.clone(),
        );
        registry.register(
            "cni_phase_duration_seconds",
            "Time spent per CNI verb and phase (daemon allocation and journal commit measured by the daemon; the netlink phases, endpoint registration and total as the plugin saw them)",
            m.phase_seconds.clone(),
        );
        registry.register(
            "ipam_allocation_failures",
            "Failed ADDs and allocations, by reason",
            m.failures.clone(),
        );
        registry.register(
            "ipam_restore_outcomes",
            "What the last start restored and reconciled, per outcome",
            m.restore.clone(),
        );
        registry.register(
            "delete_queue_depth",
            "DELs queued on disk for the daemon",
            m.queue_depth.clone(),
        );
        registry.register(
            "delete_queue_bad_entries",
            "DEL-queue entries the daemon could not read, set aside as *.bad until removed",
            m.queue_bad_entries.clone(),
        );
        registry.register(
            "drop_count",
            "Packets dropped, by reason (the source check: a pod sent with a source address it does not own) and family",
            m.drops.clone(),
        );
        registry.register(
            "drop_bytes",
            "Bytes dropped, by reason and family",
            m.drop_bytes.clone(),
        );
        registry.register(
            "ipam_leaks",
            "Allocations the last leak check found leaked: pod gone (by UID), host link gone, older than the grace period",
            m.leaks.clone(),
        );
        registry.register(
            "ipam_leaks_released",
            "Leaked allocations the leak check released (--ipam-release-leaked-after)",
            m.leaks_released.clone(),
        );
        m.register_policy(registry);
        m.register_verdicts(registry);
        m.register_l2(registry);
        registry.register(
            "bandwidth_pods_shaped",
            "Local pods whose bandwidth annotations are shaped (tbf qdiscs), as the last pass of the bandwidth loop found them",
            m.bandwidth_pods_shaped.clone(),
        );
        registry.register(
            "bandwidth_invalid_annotations",
            "Pod bandwidth annotation values refused (not a quantity, or outside 1k to 1P), each posted as a BandwidthInvalid Event",
            m.bandwidth_invalid_annotations.clone(),
        );
    }

    /// Counts an allocation or release.
    pub fn event(&self, action: &str, family: &str) {
        self.events
            .get_or_create(&EventLabels {
                action: action.into(),
                family: family.into(),
            })
            .inc();
    }

    /// Counts a failure.
    pub fn failure(&self, reason: &str) {
        self.failures
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }

    /// Records one phase duration in seconds.
    pub fn phase(&self, verb: &str, phase: &str, seconds: f64) {
        self.phase_seconds
            .get_or_create(&PhaseLabels {
                verb: verb.into(),
                phase: phase.into(),
            })
            .observe(seconds);
    }

    /// Takes the source check's drop counters as the kernel has them (they
    /// count from the table's creation, which a daemon restart keeps).
    pub fn source_check_drops(&self, drops: &[crate::daemon::source_check::Drops]) {
        use std::sync::atomic::Ordering;
        for d in drops {
            let labels = DropLabels {
                reason: d.reason.label().into(),
                family: d.family.as_str().into(),
            };
            self.drops
                .get_or_create(&labels)
                .inner()
                .store(d.packets, Ordering::Relaxed);
            self.drop_bytes
                .get_or_create(&labels)
                .inner()
                .store(d.bytes, Ordering::Relaxed);
        }
    }

    /// Registers the NetworkPolicy table's metrics in `registry`: its
    /// problems, writes and repairs.
    fn register_policy(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "policy_problems",
            "NetworkPolicy and ClusterNetworkPolicy fields that are invalid (allowing nothing, or failing closed) or name a port no pod has, in the last compile",
            m.policy_problems.clone(),
        );
        registry.register(
            "policy_updates",
            "Writes of the NetworkPolicy table, by result (installed, updated, failed)",
            m.policy_updates.clone(),
        );
        registry.register(
            "policy_write_duration_seconds",
            "How long each write of the NetworkPolicy table took (the nft run: while it commits, the kernel makes a link added or deleted on this node wait), by result",
            m.policy_write_seconds.clone(),
        );
        registry.register(
            "policy_pods_enforced",
            "Local pods some NetworkPolicy selects, with a chain in the policy table",
            m.policy_pods_enforced.clone(),
        );
        registry.register(
            "policy_table_repairs",
            "Policy tables installed again because a resync found the kernel's deleted (missing) or changed (differs) by someone else",
            m.policy_table_repairs.clone(),
        );
    }

    /// Registers the policy verdict metrics in `registry`.
    fn register_verdicts(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "policy_verdicts",
            "Policy verdicts the kernel logged (a pod chain's final drop or a tier's Deny, and each connection a policy rule allowed, under the node-wide limits) and the agent read, by direction, verdict (denied, audit, allowed) and policy",
            m.policy_verdicts.clone(),
        );
        registry.register(
            "policy_verdicts_suppressed",
            "Policy verdict log records the node-wide limits kept from the log (the packets were still judged), read from the kernel's counter at each scrape",
            m.policy_verdicts_suppressed.clone(),
        );
        registry.register(
            "policy_observe_lines_lost",
            "Policy verdict lines that podnet observe clients too slow to read them lost",
            m.policy_observe_lines_lost.clone(),
        );
        registry.register(
            "policy_verdict_records_unreadable",
            "Policy verdict log records that could not be read, or were lost to a full receive buffer",
            m.policy_verdict_records_unreadable.clone(),
        );
    }

    /// Registers the L2 announcement metrics in `registry`.
    fn register_l2(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "l2_announced_addresses",
            "L2 announcements: addresses this node answers ARP or NDP for",
            m.l2_answered.clone(),
        );
        registry.register(
            "l2_takeovers",
            "L2 announcements: addresses this node began to answer for (at start or from another node)",
            m.l2_takeovers.clone(),
        );
        registry.register(
            "l2_nodes_live",
            "L2 announcements: nodes whose heartbeats arrive (this one included)",
            m.l2_nodes_live.clone(),
        );
        registry.register(
            "l2_problems",
            "L2 announcements: problems (a policy's field, an address no interface of this node can announce)",
            m.l2_problems.clone(),
        );
        registry.register(
            "l2_sent",
            "L2 announcements: ARP replies, neighbour advertisements and gratuitous announcements sent, by kind",
            m.l2_sent.clone(),
        );
        registry.register(
            "l2_heartbeats",
            "L2 announcements: heartbeats, by event (sent, received, refused, send-error)",
            m.l2_heartbeats.clone(),
        );
    }

    /// Sets the L2 announcement metrics from one scrape's figures.
    pub fn l2(&self, f: &L2Figures) {
        use std::sync::atomic::Ordering;
        self.l2_answered.set(f.answered as i64);
        self.l2_takeovers
            .inner()
            .store(f.takeovers, Ordering::Relaxed);
        self.l2_nodes_live.set(f.nodes_live as i64);
        self.l2_problems.set(f.problems as i64);
        for (kind, n) in &f.sent {
            let labels = KindLabels {
                kind: kind.to_string(),
            };
            self.l2_sent
                .get_or_create(&labels)
                .inner()
                .store(*n, Ordering::Relaxed);
        }
        for (event, n) in &f.heartbeats {
            let labels = HeartbeatLabels {
                event: event.to_string(),
            };
            self.l2_heartbeats
                .get_or_create(&labels)
                .inner()
                .store(*n, Ordering::Relaxed);
        }
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        metrics_text::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_prefix_and_labels() {
        let m = Metrics::new("cilium");
        m.event("allocate", "ipv4");
        m.capacity
            .get_or_create(&CapacityLabels {
                family: "ipv4".into(),
                cidr: "10.0.1.0/24".into(),
            })
            .set(254);
        m.phase("ADD", "total", 0.004);
        m.failure("range-full");
        m.queue_bad_entries.set(2);
        m.policy_table_repairs
            .get_or_create(&FoundLabels {
                found: "missing".into(),
            })
            .inc();
        m.source_check_drops(&[crate::daemon::source_check::Drops {
            reason: crate::daemon::source_check::Reason::OtherPod,
            family: crate::ipam::Family::V6,
            packets: 3,
            bytes: 300,
        }]);
        let text = m.encode();
        assert!(
            text.contains("cilium_ipam_events_total{action=\"allocate\",family=\"ipv4\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("cilium_ipam_capacity{family=\"ipv4\",cidr=\"10.0.1.0/24\"} 254"),
            "{text}"
        );
        assert!(
            text.contains("cilium_cni_phase_duration_seconds_bucket{le="),
            "{text}"
        );
        assert!(
            text.contains("cilium_ipam_allocation_failures_total{reason=\"range-full\"} 1"),
            "{text}"
        );
        assert!(text.contains("cilium_delete_queue_bad_entries 2"), "{text}");
        assert!(
            text.contains("cilium_policy_table_repairs_total{found=\"missing\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "cilium_drop_count_total{reason=\"spoofed-other-pod-address\",family=\"ipv6\"} 3"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "cilium_drop_bytes_total{reason=\"spoofed-other-pod-address\",family=\"ipv6\"} 300"
            ),
            "{text}"
        );
    }
}
