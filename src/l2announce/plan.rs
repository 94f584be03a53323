//! Which node answers for each announced address, pure, and the same on every
//! agent: every agent plans from the same objects and the same liveness, so no
//! Lease is needed (MetalLB's way, not Cilium's Lease per Service).
//!
//! For each address of each Service some policy selects (its
//! `serviceSelector`, and `loadBalancerIPs` or `externalIPs` for that kind of
//! address), every node is a candidate, in the order of a hash of (node,
//! address): so the addresses spread over the nodes, and one node's death
//! moves only its own addresses. A candidate may answer when a policy that
//! selects the Service selects the node too, the node is live, and, for a
//! Service with `externalTrafficPolicy: Local`, the node has a ready endpoint
//! of it. The first candidate that may, answers; the others say why they do
//! not ([`Standing`]). An address several Services share (LB IPAM's sharing
//! key) is answered by a node that may answer for every one of them.
//!
//! The interfaces a node answers on are its policy's `interfaces`: of the
//! first policy by name that selects the Service and the node (two such
//! policies with different `interfaces` are a problem naming both).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use sha2::{Digest, Sha256};

use super::views::{AddressKind, NodeView, Pattern, PolicyView, Problem, ServiceView};

/// What the plan reads.
pub struct Inputs<'a> {
    pub policies: &'a [&'a PolicyView],
    pub services: &'a [&'a ServiceView],
    pub nodes: &'a [&'a NodeView],
    /// The nodes with a ready endpoint of each Service (`namespace/name`).
    pub ready: &'a BTreeMap<String, BTreeSet<String>>,
    /// The nodes heard from lately (this node included).
    pub live: &'a BTreeSet<String>,
}

/// Why a candidate does or does not answer for an address.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "standing", content = "because")]
pub enum Standing {
    /// It answers.
    Answers,
    /// It may, but an earlier candidate answers (it takes over if that one dies).
    Standby,
    /// No policy that selects the Service selects the node.
    NotSelected,
    /// Not heard from lately.
    NotLive,
    /// `externalTrafficPolicy: Local`, and no ready endpoint of this Service
    /// (named) runs on the node.
    NoReadyEndpoint(String),
}

/// One node's place in an address's order.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Candidate {
    pub node: String,
    #[serde(flatten)]
    pub standing: Standing,
    /// The interface patterns it answers on (none: every interface); empty
    /// unless a policy selects it.
    #[serde(
        serialize_with = "pattern_texts",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub interfaces: Vec<Pattern>,
    /// The policy that selects it (the first by name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

fn pattern_texts<S: serde::Serializer>(p: &[Pattern], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(p.iter().map(Pattern::text))
}

/// One announced address.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AddressPlan {
    pub address: IpAddr,
    pub kind: AddressKind,
    /// The Services it belongs to (`namespace/name`; more than one when shared).
    pub services: Vec<String>,
    /// Every node, in the address's order.
    pub candidates: Vec<Candidate>,
}

impl AddressPlan {
    /// The node that answers, if any.
    pub fn answerer(&self) -> Option<&Candidate> {
        self.candidates
            .iter()
            .find(|c| c.standing == Standing::Answers)
    }
}

/// The whole plan: every announced address, and what is wrong.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub addresses: BTreeMap<IpAddr, AddressPlan>,
    pub problems: Vec<Problem>,
}

impl Plan {
    /// What `node` answers for: each address with the patterns of its
    /// interfaces.
    pub fn answered_by<'a>(
        &'a self,
        node: &'a str,
    ) -> impl Iterator<Item = (&'a AddressPlan, &'a Candidate)> {
        self.addresses
            .values()
            .filter_map(move |a| a.answerer().filter(|c| c.node == node).map(|c| (a, c)))
    }
}

/// A node's rank for `subject` (an address): the first 8 bytes of SHA-256 of
/// `node/subject` (stable across versions and architectures, unlike std's
/// hasher), the name breaking ties.
pub fn rank(node: &str, subject: impl std::fmt::Display) -> (u64, String) {
    let digest = Sha256::digest(format!("{node}/{subject}").as_bytes());
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(head), node.to_string())
}

/// Which policies select `service` for addresses of `kind` (by name).
fn policies_for<'a>(
    policies: &[&'a PolicyView],
    service: &ServiceView,
    kind: AddressKind,
) -> Vec<&'a PolicyView> {
    let mut out: Vec<&PolicyView> = policies
        .iter()
        .copied()
        .filter(|p| match kind {
            AddressKind::LoadBalancer => p.load_balancer_ips,
            AddressKind::External => p.external_ips,
        })
        .filter(|p| p.services.matches(&service.labels))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// One Service's say on one node: the policy that selects both (None: none
/// does), or why the node may not answer though selected.
struct Say<'a> {
    policy: Option<&'a PolicyView>,
    blocked: Option<Standing>,
}

fn say<'a>(
    inputs: &Inputs,
    policies: &[&'a PolicyView],
    service: &ServiceView,
    node: &NodeView,
    problems: &mut BTreeSet<Problem>,
) -> Say<'a> {
    let mut selecting = policies
        .iter()
        .copied()
        .filter(|p| p.nodes.matches(&node.labels));
    let Some(first) = selecting.next() else {
        return Say {
            policy: None,
            blocked: Some(Standing::NotSelected),
        };
    };
    for other in selecting.filter(|o| o.interfaces != first.interfaces) {
        problems.insert(Problem {
            object: format!("CiliumL2AnnouncementPolicy {}", other.name),
            field: "spec.interfaces".into(),
            why: format!(
                "it and {} both select Service {} with different interfaces on the nodes both select; {}'s are used there",
                first.name,
                service.key(),
                first.name
            ),
        });
    }
    let blocked = match service.local_traffic {
        true => {
            let ready = inputs
                .ready
                .get(&service.key())
                .is_some_and(|n| n.contains(&node.name));
            (!ready).then(|| Standing::NoReadyEndpoint(service.key()))
        }
        false => None,
    };
    Say {
        policy: Some(first),
        blocked,
    }
}

/// The plan from `inputs`.
pub fn plan(inputs: &Inputs) -> Plan {
    let mut problems: BTreeSet<Problem> = inputs
        .policies
        .iter()
        .flat_map(|p| p.problems.iter().cloned())
        .collect();
    // Every announced address, with its kind and Services.
    let mut owners: BTreeMap<IpAddr, (AddressKind, Vec<&ServiceView>)> = BTreeMap::new();
    for s in inputs.services {
        for kind in [AddressKind::LoadBalancer, AddressKind::External] {
            if policies_for(inputs.policies, s, kind).is_empty() {
                continue;
            }
            for a in s.addresses(kind) {
                owners.entry(*a).or_insert((kind, Vec::new())).1.push(s);
            }
        }
    }
    let mut addresses = BTreeMap::new();
    for (address, (kind, services)) in owners {
        let mut nodes: Vec<&NodeView> = inputs.nodes.to_vec();
        nodes.sort_by_cached_key(|n| rank(&n.name, address));
        let mut answered = false;
        let mut candidates = Vec::new();
        for node in nodes {
            let mut candidate = candidate_for(inputs, &services, kind, node, &mut problems);
            if candidate.standing == Standing::Standby && !answered {
                candidate.standing = Standing::Answers;
                answered = true;
            }
            candidates.push(candidate);
        }
        let eligible = |c: &Candidate| matches!(c.standing, Standing::Answers | Standing::NotLive);
        if services.len() > 1 && !candidates.iter().any(eligible) {
            let alone = |s: &&ServiceView| {
                let mut scratch = BTreeSet::new();
                inputs.nodes.iter().any(|n| {
                    let c = candidate_for(inputs, &[*s], kind, n, &mut scratch);
                    matches!(c.standing, Standing::Standby | Standing::NotLive)
                })
            };
            if services.iter().all(alone) {
                problems.insert(shared_problem(address, &services));
            }
        }
        let services = services.iter().map(|s| s.key()).collect();
        addresses.insert(
            address,
            AddressPlan {
                address,
                kind,
                services,
                candidates,
            },
        );
    }
    Plan {
        addresses,
        problems: problems.into_iter().collect(),
    }
}

/// `node`'s standing for an address of `services` (Standby when it may answer).
fn candidate_for(
    inputs: &Inputs,
    services: &[&ServiceView],
    kind: AddressKind,
    node: &NodeView,
    problems: &mut BTreeSet<Problem>,
) -> Candidate {
    let mut chosen: Option<&PolicyView> = None;
    let mut standing = Standing::Standby;
    for s in services {
        let policies = policies_for(inputs.policies, s, kind);
        let said = say(inputs, &policies, s, node, problems);
        if let (None, Some(p)) = (chosen, said.policy) {
            chosen = Some(p);
        }
        if let (Standing::Standby, Some(blocked)) = (&standing, said.blocked) {
            standing = blocked;
        }
    }
    if standing == Standing::Standby && !inputs.live.contains(&node.name) {
        standing = Standing::NotLive;
    }
    Candidate {
        node: node.name.clone(),
        interfaces: chosen.map(|p| p.interfaces.clone()).unwrap_or_default(),
        policy: chosen.map(|p| p.name.clone()),
        standing,
    }
}

fn shared_problem(address: IpAddr, services: &[&ServiceView]) -> Problem {
    let names: Vec<String> = services.iter().map(|s| s.key()).collect();
    Problem {
        object: format!("Service {}", names[0]),
        field: "status.loadBalancer.ingress".into(),
        why: format!(
            "address {address} is shared by Services {} and no live node may announce for all of them (policies or ready endpoints differ)",
            names.join(", ")
        ),
    }
}
