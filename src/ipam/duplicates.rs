//! The cluster-wide duplicate check, pure (no I/O): Pods and CiliumNodes as the
//! API server lists them in, typed findings out. Three things must never happen:
//! - two Pods with the same IP ([`Finding::SameIp`]);
//! - a Pod IP outside every CIDR, block and single IP its node owns
//!   ([`Finding::OutsideNodeRanges`]);
//! - a CIDR, block or single IP on two CiliumNodes, equal or overlapping
//!   ([`Finding::RangeOnTwoNodes`]).
//!
//! Only Pods that hold their address count: host-network Pods (the node's
//! address), finished Pods (Succeeded, Failed: their sandbox is gone) and
//! terminating Pods (deletion requested: their sandbox may be gone and the
//! address already another pod's, while the Pod still lists it) are left out.
//! A node without a CiliumNode, or whose CiliumNode owns no range (the
//! delegated-plugin mode, a node whose agent has not started), cannot be
//! checked for [`Finding::OutsideNodeRanges`]: it is named in
//! [`CheckReport::unchecked_nodes`] instead.
//!
//! [`Confirmation`] is the operator's memory across checks: a finding is
//! reported once it is found by two checks in a row (a Pod whose status lags
//! its sandbox by a moment is not an alarm), and again after it went away and
//! came back.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;

use super::ip_number;
use super::leaks::PodName;

/// A Pod as the check needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub pod: PodName,
    pub uid: String,
    /// `spec.nodeName` (None: not scheduled).
    pub node: Option<String>,
    /// `status.podIPs`.
    pub ips: Vec<IpAddr>,
    pub host_network: bool,
    /// `status.phase` ("" when unset).
    pub phase: String,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
}

impl PodView {
    /// Whether the Pod holds its addresses: not host-network, not finished, not
    /// terminating.
    pub fn holds_addresses(&self) -> bool {
        !self.host_network
            && !self.terminating
            && !matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }
}

/// Where a node's range comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "field", rename_all = "kebab-case")]
pub enum RangeSource {
    /// `spec.ipam.podCIDRs`.
    PodCidr,
    /// `spec.ipam.pools.allocated[]`, a block of this pool.
    PoolBlock { pool: String },
    /// `spec.ipam.pool` / `ipv6-pool`: a single IP (crd-backed modes).
    PoolIp,
}

impl fmt::Display for RangeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RangeSource::PodCidr => write!(f, "podCIDR"),
            RangeSource::PoolBlock { pool } => write!(f, "block of pool {pool}"),
            RangeSource::PoolIp => write!(f, "pool IP"),
        }
    }
}

/// One CIDR, block or single IP a node owns.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct NodeRange {
    pub cidr: IpNet,
    pub source: RangeSource,
}

impl fmt::Display for NodeRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.cidr, self.source)
    }
}

/// A CiliumNode as the check needs it: its name and the ranges it owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRanges {
    pub name: String,
    pub ranges: Vec<NodeRange>,
}

/// A range and the node that owns it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct HeldRange {
    pub node: String,
    pub cidr: IpNet,
    pub source: RangeSource,
}

/// A Pod in a finding.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Its node ("" when not scheduled).
    pub node: String,
}

impl PodRef {
    fn of(p: &PodView) -> PodRef {
        PodRef {
            namespace: p.pod.namespace.clone(),
            name: p.pod.name.clone(),
            uid: p.uid.clone(),
            node: p.node.clone().unwrap_or_default(),
        }
    }
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if !self.node.is_empty() {
            write!(f, " on {}", self.node)?;
        }
        Ok(())
    }
}

/// Something that must never happen.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Finding {
    /// Two or more Pods hold the same IP.
    SameIp { ip: IpAddr, pods: Vec<PodRef> },
    /// A Pod's IP is in none of its node's ranges.
    OutsideNodeRanges {
        pod: PodRef,
        ip: IpAddr,
        node: String,
        ranges: Vec<NodeRange>,
    },
    /// Equal or overlapping ranges on two or more CiliumNodes.
    RangeOnTwoNodes { ranges: Vec<HeldRange> },
}

/// The kinds of finding, as metric labels and Event reasons name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FindingKind {
    SameIp,
    OutsideNodeRanges,
    RangeOnTwoNodes,
}

impl FindingKind {
    pub const ALL: [FindingKind; 3] = [
        FindingKind::SameIp,
        FindingKind::OutsideNodeRanges,
        FindingKind::RangeOnTwoNodes,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            FindingKind::SameIp => "same-ip",
            FindingKind::OutsideNodeRanges => "outside-node-ranges",
            FindingKind::RangeOnTwoNodes => "range-on-two-nodes",
        }
    }

    /// The reason of the Kubernetes Events that report it.
    pub fn event_reason(self) -> &'static str {
        match self {
            FindingKind::SameIp => "DuplicatePodIP",
            FindingKind::OutsideNodeRanges => "PodIPOutsideNodeRanges",
            FindingKind::RangeOnTwoNodes => "OverlappingNodeRanges",
        }
    }
}

impl Finding {
    pub fn kind(&self) -> FindingKind {
        match self {
            Finding::SameIp { .. } => FindingKind::SameIp,
            Finding::OutsideNodeRanges { .. } => FindingKind::OutsideNodeRanges,
            Finding::RangeOnTwoNodes { .. } => FindingKind::RangeOnTwoNodes,
        }
    }

    /// The nodes it concerns.
    pub fn nodes(&self) -> BTreeSet<&str> {
        match self {
            Finding::SameIp { pods, .. } => pods
                .iter()
                .map(|p| p.node.as_str())
                .filter(|n| !n.is_empty())
                .collect(),
            Finding::OutsideNodeRanges { node, .. } => [node.as_str()].into(),
            Finding::RangeOnTwoNodes { ranges } => ranges.iter().map(|r| r.node.as_str()).collect(),
        }
    }
}

/// `items` joined with ", ", or "none".
pub fn joined<T: fmt::Display>(items: &[T]) -> String {
    match items {
        [] => "none".into(),
        _ => items
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::SameIp { ip, pods } => {
                write!(f, "{ip} is the IP of {} pods: {}", pods.len(), joined(pods))
            }
            Finding::OutsideNodeRanges {
                pod,
                ip,
                node,
                ranges,
            } => write!(
                f,
                "pod {pod} has {ip}, outside every range of CiliumNode {node}: {}",
                joined(ranges)
            ),
            Finding::RangeOnTwoNodes { ranges } => {
                let held: Vec<String> = ranges
                    .iter()
                    .map(|r| format!("{} ({}) on {}", r.cidr, r.source, r.node))
                    .collect();
                write!(
                    f,
                    "ranges on more than one CiliumNode overlap: {}",
                    held.join(", ")
                )
            }
        }
    }
}

/// One line per finding, `  <its Event reason>: <the finding>`.
pub fn finding_lines(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(|f| format!("  {}: {f}\n", f.kind().event_reason()))
        .collect()
}

/// What one check found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckReport {
    pub findings: Vec<Finding>,
    /// Nodes with Pods that hold addresses but no CiliumNode, or a CiliumNode
    /// without ranges: their Pods' IPs were not checked against ranges.
    pub unchecked_nodes: Vec<String>,
}

impl CheckReport {
    /// How many findings of each kind (every kind, zero included).
    pub fn counts(&self) -> BTreeMap<FindingKind, usize> {
        let mut counts: BTreeMap<FindingKind, usize> =
            FindingKind::ALL.iter().map(|k| (*k, 0)).collect();
        for f in &self.findings {
            *counts.entry(f.kind()).or_default() += 1;
        }
        counts
    }
}

/// Runs the three checks over everything listed.
pub fn check(pods: &[PodView], nodes: &[NodeRanges]) -> CheckReport {
    let holding: Vec<&PodView> = pods.iter().filter(|p| p.holds_addresses()).collect();
    let mut findings = same_ip(&holding);
    let (outside, unchecked_nodes) = outside_node_ranges(&holding, nodes);
    findings.extend(outside);
    findings.extend(range_on_two_nodes(nodes));
    CheckReport {
        findings,
        unchecked_nodes,
    }
}

fn same_ip(pods: &[&PodView]) -> Vec<Finding> {
    let mut by_ip: BTreeMap<IpAddr, BTreeSet<PodRef>> = BTreeMap::new();
    for p in pods {
        for ip in &p.ips {
            by_ip.entry(*ip).or_default().insert(PodRef::of(p));
        }
    }
    by_ip
        .into_iter()
        .filter(|(_, pods)| pods.len() > 1)
        .map(|(ip, pods)| Finding::SameIp {
            ip,
            pods: pods.into_iter().collect(),
        })
        .collect()
}

fn outside_node_ranges(pods: &[&PodView], nodes: &[NodeRanges]) -> (Vec<Finding>, Vec<String>) {
    let by_name: BTreeMap<&str, &NodeRanges> = nodes
        .iter()
        .filter(|n| !n.ranges.is_empty())
        .map(|n| (n.name.as_str(), n))
        .collect();
    let mut findings = Vec::new();
    let mut unchecked = BTreeSet::new();
    for p in pods {
        let Some(node) = p.node.as_deref() else {
            continue;
        };
        if p.ips.is_empty() {
            continue;
        }
        let Some(view) = by_name.get(node) else {
            unchecked.insert(node.to_string());
            continue;
        };
        for ip in &p.ips {
            if !view.ranges.iter().any(|r| r.cidr.contains(ip)) {
                let mut ranges = view.ranges.clone();
                ranges.sort();
                ranges.dedup();
                findings.push(Finding::OutsideNodeRanges {
                    pod: PodRef::of(p),
                    ip: *ip,
                    node: node.to_string(),
                    ranges,
                });
            }
        }
    }
    findings.sort();
    (findings, unchecked.into_iter().collect())
}

/// The first and last address of a CIDR as numbers (IPv4 and IPv6 apart).
fn span(cidr: &IpNet) -> (bool, u128, u128) {
    let (first, last) = ip_number::span(cidr);
    (matches!(cidr, IpNet::V6(_)), first, last)
}

fn range_on_two_nodes(nodes: &[NodeRanges]) -> Vec<Finding> {
    let mut held: Vec<HeldRange> = nodes
        .iter()
        .flat_map(|n| {
            n.ranges.iter().map(|r| HeldRange {
                node: n.name.clone(),
                cidr: r.cidr.trunc(),
                source: r.source.clone(),
            })
        })
        .collect();
    // In address order, a range before the ranges it contains.
    held.sort_by_key(|h| {
        let (v6, first, last) = span(&h.cidr);
        (
            v6,
            first,
            std::cmp::Reverse(last),
            h.node.clone(),
            h.source.clone(),
        )
    });
    held.dedup();
    // Sweep in address order: a group is a run of ranges each starting before
    // the group's end; a group on two nodes or more is a finding.
    let mut findings = Vec::new();
    let mut group: Vec<HeldRange> = Vec::new();
    let mut end: Option<(bool, u128)> = None;
    let flush = |group: &mut Vec<HeldRange>, findings: &mut Vec<Finding>| {
        let owners: BTreeSet<&str> = group.iter().map(|h| h.node.as_str()).collect();
        if owners.len() > 1 {
            findings.push(Finding::RangeOnTwoNodes {
                ranges: std::mem::take(group),
            });
        }
        group.clear();
    };
    for h in held {
        let (v6, first, last) = span(&h.cidr);
        match end {
            Some((family, e)) if family == v6 && first <= e => {
                end = Some((family, e.max(last)));
            }
            _ => {
                flush(&mut group, &mut findings);
                end = Some((v6, last));
            }
        }
        group.push(h);
    }
    flush(&mut group, &mut findings);
    findings
}

/// The operator's memory across checks: which findings to report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Confirmation {
    /// Found by the last check, not yet by two in a row.
    suspected: BTreeSet<Finding>,
    /// Found by two checks in a row and reported.
    confirmed: BTreeSet<Finding>,
}

/// What to do after a check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Confirmed {
    /// Found by this check and the one before, not reported yet: report them.
    pub new: Vec<Finding>,
    /// Every finding found by two checks in a row (the metric counts these).
    pub current: Vec<Finding>,
    /// Found by this check only: check again soon.
    pub suspected: usize,
}

impl Confirmation {
    /// Takes one check's findings.
    pub fn observe(&mut self, findings: &[Finding]) -> Confirmed {
        let found: BTreeSet<Finding> = findings.iter().cloned().collect();
        let mut new = Vec::new();
        let mut confirmed = BTreeSet::new();
        let mut suspected = BTreeSet::new();
        for f in found {
            if self.confirmed.contains(&f) {
                confirmed.insert(f);
            } else if self.suspected.contains(&f) {
                new.push(f.clone());
                confirmed.insert(f);
            } else {
                suspected.insert(f);
            }
        }
        self.confirmed = confirmed;
        self.suspected = suspected;
        Confirmed {
            new,
            current: self.confirmed.iter().cloned().collect(),
            suspected: self.suspected.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: Option<&str>, ips: &[&str]) -> PodView {
        PodView {
            pod: PodName {
                namespace: "default".into(),
                name: name.into(),
            },
            uid: format!("uid-{name}"),
            node: node.map(str::to_string),
            ips: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            host_network: false,
            phase: "Running".into(),
            terminating: false,
        }
    }

    fn node(name: &str, cidrs: &[&str]) -> NodeRanges {
        NodeRanges {
            name: name.into(),
            ranges: cidrs
                .iter()
                .map(|c| NodeRange {
                    cidr: c.parse().unwrap(),
                    source: RangeSource::PodCidr,
                })
                .collect(),
        }
    }

    fn kinds(r: &CheckReport) -> Vec<FindingKind> {
        r.findings.iter().map(Finding::kind).collect()
    }

    #[test]
    fn a_clean_cluster_has_no_findings() {
        let nodes = [
            node("a", &["10.0.0.0/24", "fd00::/120"]),
            node("b", &["10.0.1.0/24", "fd00::100/120"]),
        ];
        let pods = [
            pod("p1", Some("a"), &["10.0.0.5", "fd00::5"]),
            pod("p2", Some("b"), &["10.0.1.5", "fd00::105"]),
            pod("pending", None, &[]),
            pod("scheduled", Some("b"), &[]),
        ];
        let r = check(&pods, &nodes);
        assert_eq!(r, CheckReport::default());
        assert_eq!(r.counts().values().copied().collect::<Vec<_>>(), [0, 0, 0]);
    }

    #[test]
    fn two_pods_with_the_same_ip_in_either_family() {
        let nodes = [
            node("a", &["10.0.0.0/24", "fd00::/120"]),
            node("b", &["10.0.1.0/24", "fd00::100/120"]),
        ];
        let pods = [
            pod("p1", Some("a"), &["10.0.0.5", "fd00::5"]),
            pod("p2", Some("a"), &["10.0.0.5", "fd00::6"]),
            pod("p3", Some("b"), &["10.0.1.7", "fd00::107"]),
            pod("p4", Some("b"), &["10.0.1.8", "fd00::107"]),
        ];
        let r = check(&pods, &nodes);
        assert_eq!(kinds(&r), [FindingKind::SameIp, FindingKind::SameIp]);
        let Finding::SameIp { ip, pods: holders } = &r.findings[0] else {
            panic!("{r:?}")
        };
        assert_eq!(ip.to_string(), "10.0.0.5");
        assert_eq!(
            holders.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["p1", "p2"]
        );
        assert_eq!(
            r.findings[0].to_string(),
            "10.0.0.5 is the IP of 2 pods: default/p1 on a, default/p2 on a"
        );
        assert_eq!(
            r.findings[1].to_string(),
            "fd00::107 is the IP of 2 pods: default/p3 on b, default/p4 on b"
        );
        assert_eq!(r.findings[0].nodes(), ["a"].into());
        assert_eq!(r.counts()[&FindingKind::SameIp], 2);
    }

    #[test]
    fn the_same_ip_across_nodes_is_also_outside_one_of_them() {
        let nodes = [node("a", &["10.0.0.0/24"]), node("b", &["10.0.1.0/24"])];
        let pods = [
            pod("p1", Some("a"), &["10.0.0.5"]),
            pod("p2", Some("b"), &["10.0.0.5"]),
        ];
        let r = check(&pods, &nodes);
        assert_eq!(
            kinds(&r),
            [FindingKind::SameIp, FindingKind::OutsideNodeRanges]
        );
        assert_eq!(r.findings[0].nodes(), ["a", "b"].into());
        assert_eq!(
            r.findings[1].to_string(),
            "pod default/p2 on b has 10.0.0.5, outside every range of CiliumNode b: 10.0.1.0/24 (podCIDR)"
        );
    }

    #[test]
    fn pods_that_hold_no_address_are_left_out() {
        let nodes = [node("a", &["10.0.0.0/24"])];
        let mut host = pod("host", Some("a"), &["192.0.2.1"]);
        host.host_network = true;
        let mut host2 = pod("host2", Some("a"), &["192.0.2.1"]);
        host2.host_network = true;
        let mut done = pod("done", Some("a"), &["10.0.0.5"]);
        done.phase = "Succeeded".into();
        let mut failed = pod("failed", Some("a"), &["10.0.0.5"]);
        failed.phase = "Failed".into();
        let mut going = pod("going", Some("a"), &["10.0.0.5"]);
        going.terminating = true;
        let pending = {
            let mut p = pod("pending", Some("a"), &["10.0.0.6"]);
            p.phase = "Pending".into();
            p
        };
        let pods = [
            host,
            host2,
            done,
            failed,
            going,
            pending,
            pod("runs", Some("a"), &["10.0.0.5"]),
        ];
        assert_eq!(check(&pods, &nodes), CheckReport::default());
        // A Pending pod with an address holds it.
        let mut pending2 = pod("pending2", Some("a"), &["10.0.0.6"]);
        pending2.phase = "Pending".into();
        let r = check(&[pods[5].clone(), pending2], &nodes);
        assert_eq!(kinds(&r), [FindingKind::SameIp]);
    }

    #[test]
    fn a_pod_ip_outside_its_nodes_ranges() {
        let mut multi = node("m", &["10.2.0.0/24"]);
        multi.ranges.push(NodeRange {
            cidr: "10.9.0.0/28".parse().unwrap(),
            source: RangeSource::PoolBlock {
                pool: "blue".into(),
            },
        });
        multi.ranges.push(NodeRange {
            cidr: "fd09::/124".parse().unwrap(),
            source: RangeSource::PoolBlock {
                pool: "blue".into(),
            },
        });
        let crd = NodeRanges {
            name: "c".into(),
            ranges: vec![NodeRange {
                cidr: "10.5.0.9/32".parse().unwrap(),
                source: RangeSource::PoolIp,
            }],
        };
        let nodes = [multi, crd];
        let pods = [
            pod("in-block", Some("m"), &["10.9.0.3", "fd09::3"]),
            pod("in-cidr", Some("m"), &["10.2.0.3"]),
            pod("v6-out", Some("m"), &["10.9.0.4", "fd09::10"]),
            pod("pool-ip", Some("c"), &["10.5.0.9"]),
            pod("not-pool-ip", Some("c"), &["10.5.0.10"]),
        ];
        let r = check(&pods, &nodes);
        assert_eq!(
            kinds(&r),
            [
                FindingKind::OutsideNodeRanges,
                FindingKind::OutsideNodeRanges
            ]
        );
        let texts: Vec<String> = r.findings.iter().map(ToString::to_string).collect();
        assert_eq!(
            texts,
            [
                "pod default/not-pool-ip on c has 10.5.0.10, outside every range of CiliumNode c: 10.5.0.9/32 (pool IP)",
                "pod default/v6-out on m has fd09::10, outside every range of CiliumNode m: 10.2.0.0/24 (podCIDR), 10.9.0.0/28 (block of pool blue), fd09::/124 (block of pool blue)",
            ]
        );
        assert!(r.unchecked_nodes.is_empty());
    }

    #[test]
    fn nodes_without_a_cilium_node_or_ranges_are_unchecked_not_findings() {
        let nodes = [node("empty", &[]), node("a", &["10.0.0.0/24"])];
        let pods = [
            pod("p1", Some("nocn"), &["10.7.0.1"]),
            pod("p2", Some("empty"), &["10.7.0.2"]),
            pod("p3", Some("a"), &["10.0.0.2"]),
        ];
        let r = check(&pods, &nodes);
        assert!(r.findings.is_empty(), "{r:?}");
        assert_eq!(r.unchecked_nodes, ["empty", "nocn"]);
        // A duplicate among them is still found.
        let r = check(
            &[
                pod("p1", Some("nocn"), &["10.7.0.1"]),
                pod("p2", Some("empty"), &["10.7.0.1"]),
            ],
            &nodes,
        );
        assert_eq!(kinds(&r), [FindingKind::SameIp]);
    }

    #[test]
    fn equal_and_overlapping_ranges_on_two_nodes() {
        let nodes = [
            node("a", &["10.0.0.0/24", "fd00::/120"]),
            node("b", &["10.0.0.0/24"]),
            node("d2", &["10.1.0.0/24"]),
            node("c", &["10.1.0.0/16"]),
            node("d", &["10.1.5.0/24", "fd00::80/121"]),
            node("e", &["10.2.0.0/24", "fd00::100/120"]),
        ];
        let r = check(&[], &nodes);
        let texts: Vec<String> = r.findings.iter().map(ToString::to_string).collect();
        assert_eq!(
            texts,
            [
                "ranges on more than one CiliumNode overlap: 10.0.0.0/24 (podCIDR) on a, 10.0.0.0/24 (podCIDR) on b",
                "ranges on more than one CiliumNode overlap: 10.1.0.0/16 (podCIDR) on c, 10.1.0.0/24 (podCIDR) on d2, 10.1.5.0/24 (podCIDR) on d",
                "ranges on more than one CiliumNode overlap: fd00::/120 (podCIDR) on a, fd00::80/121 (podCIDR) on d",
            ]
        );
        assert_eq!(r.findings[1].nodes(), ["c", "d", "d2"].into());
        assert_eq!(r.counts()[&FindingKind::RangeOnTwoNodes], 3);
    }

    #[test]
    fn overlaps_within_one_node_and_across_families_are_not_findings() {
        // A node migrated from cluster-pool: its podCIDR is also its block.
        let mut migrated = node("m", &["10.3.0.0/24"]);
        migrated.ranges.push(NodeRange {
            cidr: "10.3.0.0/24".parse().unwrap(),
            source: RangeSource::PoolBlock {
                pool: "default".into(),
            },
        });
        // ::a00:0/120 is not 10.0.0.0/24.
        let nodes = [
            migrated,
            node("a", &["10.0.0.0/24"]),
            node("b", &["::a00:0/120"]),
            node("c", &["10.0.1.0/24"]),
        ];
        assert_eq!(check(&[], &nodes), CheckReport::default());
    }

    #[test]
    fn a_chain_of_overlaps_is_one_finding_and_single_ips_count() {
        let ip = |node: &str, ip: &str| NodeRanges {
            name: node.into(),
            ranges: vec![NodeRange {
                cidr: ip.parse().unwrap(),
                source: RangeSource::PoolIp,
            }],
        };
        let nodes = [
            node("a", &["10.0.0.0/23"]),
            node("b", &["10.0.0.0/24"]),
            node("c", &["10.0.1.0/24"]),
            ip("x", "10.8.0.1/32"),
            ip("y", "10.8.0.1/32"),
            ip("z", "10.8.0.2/32"),
        ];
        let r = check(&[], &nodes);
        assert_eq!(r.findings.len(), 2, "{r:?}");
        assert_eq!(r.findings[0].nodes(), ["a", "b", "c"].into());
        assert_eq!(r.findings[1].nodes(), ["x", "y"].into());
    }

    #[test]
    fn findings_are_reported_once_confirmed_by_two_checks_in_a_row() {
        let nodes = [node("a", &["10.0.0.0/24"])];
        let dup = check(
            &[
                pod("p1", Some("a"), &["10.0.0.5"]),
                pod("p2", Some("a"), &["10.0.0.5"]),
            ],
            &nodes,
        )
        .findings;
        let mut c = Confirmation::default();
        let first = c.observe(&dup);
        assert_eq!(
            (first.new.len(), first.current.len(), first.suspected),
            (0, 0, 1)
        );
        let second = c.observe(&dup);
        assert_eq!(second.new, dup);
        assert_eq!((second.current.len(), second.suspected), (1, 0));
        let third = c.observe(&dup);
        assert!(third.new.is_empty());
        assert_eq!(third.current, dup);
        // Gone, then back: a suspect again, reported again when confirmed.
        assert_eq!(c.observe(&[]), Confirmed::default());
        assert_eq!(c.observe(&dup).suspected, 1);
        assert_eq!(c.observe(&dup).new, dup);
        // A transient (one check only) is never reported.
        let mut c = Confirmation::default();
        c.observe(&dup);
        assert_eq!(c.observe(&[]), Confirmed::default());
    }
}
