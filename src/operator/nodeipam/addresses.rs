//! Node IPAM's choice, pure: which nodes a Service of `loadBalancerClass:
//! io.cilium/node` is published on, and which of their addresses. Every node for
//! `externalTrafficPolicy: Cluster`, the nodes with ready endpoints for `Local`;
//! never a node labelled `node.kubernetes.io/exclude-from-external-load-balancers`
//! or tainted `ToBeDeletedByClusterAutoscaler`; only nodes matching the
//! Service's `io.cilium.nodeipam/match-node-labels`. Per node and per family of
//! `spec.ipFamilies`: its ExternalIP, else its InternalIP.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::ipam::Family;

pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
pub const MATCH_NODE_LABELS_ANNOTATION: &str = "io.cilium.nodeipam/match-node-labels";

/// What Node IPAM reads of a Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeIpamNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<String>,
    /// `(type, address)` of `status.addresses` that parse as addresses.
    pub addresses: Vec<(String, IpAddr)>,
}

impl NodeIpamNode {
    fn excluded(&self) -> bool {
        self.labels.contains_key(EXCLUDE_LABEL)
            || self.taints.iter().any(|t| t == TO_BE_DELETED_TAINT)
    }

    /// Its ExternalIP of `family`, else its InternalIP of `family`.
    fn address(&self, family: Family) -> Option<IpAddr> {
        let of = |kind: &str| {
            self.addresses
                .iter()
                .find(|(t, ip)| t == kind && Family::of_addr(ip) == family)
                .map(|(_, ip)| *ip)
        };
        of("ExternalIP").or_else(|| of("InternalIP"))
    }
}

/// One requirement of `match-node-labels`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
}

/// A part of the `match-node-labels` annotation that is not a requirement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{MATCH_NODE_LABELS_ANNOTATION}: {0:?} is not a requirement; write key=value, key!=value, key or !key, separated by commas"
)]
pub struct NotARequirement(String);

/// Parses `match-node-labels`: comma-separated `key=value`, `key==value`,
/// `key!=value`, `key` or `!key` (the equality subset of Kubernetes' selector
/// syntax).
fn parse_match(text: &str) -> Result<Vec<Requirement>, NotARequirement> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || NotARequirement(part.to_string());
        let valid = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        };
        let req = if let Some((k, v)) = part.split_once("!=") {
            Requirement::NotEquals(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            Requirement::Equals(k.trim().into(), v.trim().into())
        } else if let Some(k) = part.strip_prefix('!') {
            Requirement::Absent(k.trim().into())
        } else {
            Requirement::Exists(part.into())
        };
        let (key, value) = match &req {
            Requirement::Equals(k, v) | Requirement::NotEquals(k, v) => (k, Some(v)),
            Requirement::Exists(k) | Requirement::Absent(k) => (k, None),
        };
        if !valid(key) || value.is_some_and(|v| !v.is_empty() && !valid(v)) {
            return Err(bad());
        }
        out.push(req);
    }
    Ok(out)
}

fn matches(reqs: &[Requirement], labels: &BTreeMap<String, String>) -> bool {
    reqs.iter().all(|r| match r {
        Requirement::Equals(k, v) => labels.get(k) == Some(v),
        Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
        Requirement::Exists(k) => labels.contains_key(k),
        Requirement::Absent(k) => !labels.contains_key(k),
    })
}

/// What Node IPAM reads of a Service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeIpamService {
    pub families: Vec<Family>,
    /// `externalTrafficPolicy: Local`.
    pub local: bool,
    pub match_node_labels: Option<String>,
}

/// The Service's ingress addresses (sorted, no duplicates). `endpoint_nodes`:
/// the nodes of its ready endpoints (used for `Local` only).
pub fn ingress(
    svc: &NodeIpamService,
    nodes: &[NodeIpamNode],
    endpoint_nodes: &BTreeSet<String>,
) -> Result<Vec<IpAddr>, NotARequirement> {
    let reqs = match &svc.match_node_labels {
        Some(text) => parse_match(text)?,
        None => Vec::new(),
    };
    let families = if svc.families.is_empty() {
        vec![Family::V4]
    } else {
        svc.families.clone()
    };
    let ips: BTreeSet<IpAddr> = nodes
        .iter()
        .filter(|n| !n.excluded() && matches(&reqs, &n.labels))
        .filter(|n| !svc.local || endpoint_nodes.contains(&n.name))
        .flat_map(|n| families.iter().filter_map(|f| n.address(*f)))
        .collect();
    Ok(ips.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, addrs: &[(&str, &str)]) -> NodeIpamNode {
        NodeIpamNode {
            name: name.into(),
            addresses: addrs
                .iter()
                .filter_map(|(t, a)| Some((t.to_string(), a.parse().ok()?)))
                .collect(),
            ..Default::default()
        }
    }

    fn strings(v: Vec<IpAddr>) -> Vec<String> {
        v.into_iter().map(|i| i.to_string()).collect()
    }

    fn cluster() -> Vec<NodeIpamNode> {
        let mut b = node(
            "b",
            &[("InternalIP", "10.0.0.2"), ("InternalIP", "fd00::2")],
        );
        b.labels.insert("zone".into(), "east".into());
        vec![
            node(
                "a",
                &[
                    ("InternalIP", "10.0.0.1"),
                    ("ExternalIP", "192.0.2.1"),
                    ("Hostname", "a"),
                ],
            ),
            b,
            node("c", &[("InternalIP", "10.0.0.3")]),
        ]
    }

    #[test]
    fn cluster_policy_external_before_internal_by_family() {
        let v4 = NodeIpamService::default();
        let none = BTreeSet::new();
        assert_eq!(
            strings(ingress(&v4, &cluster(), &none).unwrap()),
            ["10.0.0.2", "10.0.0.3", "192.0.2.1"]
        );
        let dual = NodeIpamService {
            families: vec![Family::V6, Family::V4],
            ..Default::default()
        };
        assert_eq!(
            strings(ingress(&dual, &cluster(), &none).unwrap()),
            ["10.0.0.2", "10.0.0.3", "192.0.2.1", "fd00::2"]
        );
        let v6 = NodeIpamService {
            families: vec![Family::V6],
            ..Default::default()
        };
        assert_eq!(
            strings(ingress(&v6, &cluster(), &none).unwrap()),
            ["fd00::2"]
        );
    }

    #[test]
    fn excluded_nodes_and_local_policy() {
        let mut nodes = cluster();
        nodes[0].labels.insert(EXCLUDE_LABEL.into(), "".into());
        nodes[2].taints.push(TO_BE_DELETED_TAINT.into());
        let none = BTreeSet::new();
        assert_eq!(
            strings(ingress(&NodeIpamService::default(), &nodes, &none).unwrap()),
            ["10.0.0.2"]
        );
        let local = NodeIpamService {
            local: true,
            ..Default::default()
        };
        let on_a_and_c: BTreeSet<String> = ["a".to_string(), "c".to_string()].into();
        assert!(ingress(&local, &nodes, &on_a_and_c).unwrap().is_empty());
        assert_eq!(
            strings(ingress(&local, &cluster(), &on_a_and_c).unwrap()),
            ["10.0.0.3", "192.0.2.1"]
        );
    }

    #[test]
    fn match_node_labels() {
        let with = |text: &str| NodeIpamService {
            match_node_labels: Some(text.into()),
            ..Default::default()
        };
        let none = BTreeSet::new();
        let run = |t: &str| strings(ingress(&with(t), &cluster(), &none).unwrap());
        assert_eq!(run("zone=east"), ["10.0.0.2"]);
        assert_eq!(run("zone==east"), ["10.0.0.2"]);
        assert_eq!(run("zone"), ["10.0.0.2"]);
        assert_eq!(run("zone!=east"), ["10.0.0.3", "192.0.2.1"]);
        assert_eq!(run("!zone, "), ["10.0.0.3", "192.0.2.1"]);
        assert!(run("zone=west").is_empty());
        let e = ingress(&with("zone in (east)"), &cluster(), &none)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"zone in (east)\" is not a requirement"), "{e}");
        assert!(ingress(&with("=x"), &cluster(), &none).is_err());
    }
}
