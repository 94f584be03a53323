//! What the node's policies mean for each local pod, for `podnet explain`: the
//! policies that select it for ingress and for egress, and what each allows
//! (peers as selectors and ipBlocks, ports) as short text. [`compile`] records
//! it with the state it makes, so explain reads it instead of compiling again.
//!
//! [`compile`]: super::compile()

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::enforcement::Enforcement;
use super::state::Direction;
use super::view::{Namespaces, PeerView, PodView, PolicyView, PortSpec, PortView, RuleView};

/// What the policies mean for one local pod (the REST API answers it as
/// `api::models::PodPolicy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPolicy {
    /// `namespace/name`.
    pub pod: String,
    pub ingress: DirectionPolicy,
    pub egress: DirectionPolicy,
    /// False when policies select it but its host link is not podnet's.
    pub enforced: bool,
}

/// One direction of a pod's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectionPolicy {
    /// Whether what no policy allows is dropped.
    pub isolated: bool,
    /// The policies that select the pod for this direction.
    pub policies: Vec<PolicyAllows>,
    /// One sentence: open, or isolated and by what.
    pub summary: String,
}

/// A policy that selects a pod, and what its rules allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyAllows {
    /// `namespace/name`.
    pub policy: String,
    /// Each rule as text (`from pods role=client of default on TCP 80`);
    /// `nothing` when the policy has no rule for the direction.
    pub allows: Vec<String>,
}

/// The policies that select each local pod, and what they allow.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Explanations {
    pub enforcement: Enforcement,
    /// The recorded local pods by `namespace/name`: those some policy selects
    /// (every local pod with `always`).
    pods: BTreeMap<String, Selected>,
    /// What each policy that selects a local pod allows, by `namespace/name`.
    allows: BTreeMap<String, Allows>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Selected {
    ips: Vec<IpAddr>,
    /// False when its host link cannot be named in nftables: not enforced.
    enforced: bool,
    ingress: Vec<String>,
    egress: Vec<String>,
}

/// A policy's rules as text per direction (None: the direction is not one of
/// its policyTypes).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Allows {
    ingress: Option<Vec<String>>,
    egress: Option<Vec<String>>,
}

impl Explanations {
    pub fn new(enforcement: Enforcement) -> Explanations {
        Explanations {
            enforcement,
            ..Explanations::default()
        }
    }

    /// Records local `pod` and the policies that select it.
    pub fn record(&mut self, pod: &PodView, selecting: &[&PolicyView], enforced: bool) {
        let mut selected = Selected {
            ips: pod.ips.clone(),
            enforced,
            ingress: Vec::new(),
            egress: Vec::new(),
        };
        for p in selecting {
            let key = format!("{}/{}", p.namespace, p.name);
            let allows = self.allows.entry(key.clone()).or_insert_with(|| Allows {
                ingress: p.ingress.as_deref().map(|r| texts(Direction::Ingress, r)),
                egress: p.egress.as_deref().map(|r| texts(Direction::Egress, r)),
            });
            if allows.ingress.is_some() {
                selected.ingress.push(key.clone());
            }
            if allows.egress.is_some() {
                selected.egress.push(key);
            }
        }
        self.pods
            .insert(format!("{}/{}", pod.namespace, pod.name), selected);
    }

    /// The recorded local pod with address `ip` (`namespace/name`), and the
    /// policies that select it for `direction` (`namespace/name` each).
    pub fn selecting(&self, ip: IpAddr, direction: Direction) -> Option<(&str, &[String])> {
        let (name, s) = self.pods.iter().find(|(_, s)| s.ips.contains(&ip))?;
        let keys = match direction {
            Direction::Ingress => &s.ingress,
            Direction::Egress => &s.egress,
        };
        Some((name.as_str(), keys.as_slice()))
    }

    /// What the policies mean for the local pod `pod` (`namespace/name`) or the
    /// one with one of `ips`; None when no recorded pod matches.
    pub fn pod(&self, pod: &str, ips: &[IpAddr]) -> Option<PodPolicy> {
        let (name, s) = self
            .pods
            .iter()
            .find(|(name, s)| *name == pod || s.ips.iter().any(|ip| ips.contains(ip)))?;
        let direction = |d: Direction, keys: &[String]| {
            let policies: Vec<PolicyAllows> = keys
                .iter()
                .map(|k| PolicyAllows {
                    policy: k.clone(),
                    allows: self.allows_of(k, d),
                })
                .collect();
            let isolated = !policies.is_empty() || self.enforcement == Enforcement::Always;
            let summary = match (policies.is_empty(), isolated) {
                (true, false) => format!("open: no NetworkPolicy selects it for {}", d.as_str()),
                (true, true) => format!(
                    "isolated by enable-policy always: no NetworkPolicy selects it for {}, so nothing is allowed{NODE_CLAUSE}",
                    d.as_str(),
                ),
                (false, _) => format!(
                    "isolated: only what {} allow{}{NODE_CLAUSE}",
                    keys.join(", "),
                    if keys.len() == 1 { "s" } else { "" },
                ),
            };
            DirectionPolicy {
                isolated,
                policies,
                summary,
            }
        };
        Some(PodPolicy {
            pod: name.clone(),
            ingress: direction(Direction::Ingress, &s.ingress),
            egress: direction(Direction::Egress, &s.egress),
            enforced: s.enforced,
        })
    }

    /// What the policies mean for a local pod that is not recorded: open with
    /// `default`; not yet in the table with `always` (it is taken in by the next
    /// write).
    pub fn unrecorded(&self, pod: &str) -> PodPolicy {
        let direction = |d: Direction| DirectionPolicy {
            isolated: false,
            policies: Vec::new(),
            summary: match self.enforcement {
                Enforcement::Default => {
                    format!("open: no NetworkPolicy selects it for {}", d.as_str())
                }
                Enforcement::Always => format!(
                    "open for now: not in the table last written (the next write isolates its {})",
                    d.as_str()
                ),
            },
        };
        PodPolicy {
            pod: pod.into(),
            ingress: direction(Direction::Ingress),
            egress: direction(Direction::Egress),
            enforced: true,
        }
    }

    fn allows_of(&self, policy: &str, d: Direction) -> Vec<String> {
        let allows = self.allows.get(policy);
        let texts = match d {
            Direction::Ingress => allows.and_then(|a| a.ingress.as_ref()),
            Direction::Egress => allows.and_then(|a| a.egress.as_ref()),
        };
        texts.cloned().unwrap_or_default()
    }
}

/// What passes besides the policies: traffic between a pod and its own node
/// is not forwarded, so never filtered.
const NODE_CLAUSE: &str = "; traffic with its own node passes";

/// Each rule of `policy` for `d` as one line; no rule is "nothing".
fn texts(d: Direction, rules: &[RuleView]) -> Vec<String> {
    if rules.is_empty() {
        return vec!["nothing".into()];
    }
    rules.iter().map(|r| rule_text(d, r)).collect()
}

/// `from <peers> on <ports>` (ingress) or `to <peers> on <ports>` (egress).
fn rule_text(d: Direction, rule: &RuleView) -> String {
    let peers = match rule.peers.is_empty() {
        true => "anywhere".to_string(),
        false => {
            let peers: Vec<String> = rule.peers.iter().map(peer_text).collect();
            peers.join(", ")
        }
    };
    let ports = match rule.ports.is_empty() {
        true => "any port".to_string(),
        false => rule
            .ports
            .iter()
            .map(port_text)
            .collect::<Vec<_>>()
            .join(", "),
    };
    let way = match d {
        Direction::Ingress => "from",
        Direction::Egress => "to",
    };
    format!("{way} {peers} on {ports}")
}

fn peer_text(peer: &PeerView) -> String {
    match peer {
        PeerView::Nothing => "nobody (an invalid peer)".into(),
        PeerView::Nodes(s) => format!("nodes {}", s.text()),
        PeerView::Block { net, except } if except.is_empty() => format!("ipBlock {net}"),
        PeerView::Block { net, except } => {
            let except: Vec<String> = except.iter().map(|e| e.to_string()).collect();
            format!("ipBlock {net} except {}", except.join(" "))
        }
        PeerView::Pods { namespaces, pods } => {
            let pods = match pods.is_everything() {
                true => "every pod".to_string(),
                false => format!("pods {}", pods.text()),
            };
            match namespaces {
                Namespaces::Own(ns) => format!("{pods} of {ns}"),
                Namespaces::Matching(s) if s.is_everything() => {
                    format!("{pods} of every namespace")
                }
                Namespaces::Matching(s) => format!("{pods} of namespaces {}", s.text()),
            }
        }
    }
}

fn port_text(port: &PortView) -> String {
    match port {
        PortView::Nothing => "no port (an invalid one)".into(),
        PortView::Port { protocol, spec } => {
            let protocol = protocol.api_name();
            match spec {
                PortSpec::Any => format!("{protocol} any port"),
                PortSpec::Range(a, b) if a == b => format!("{protocol} {a}"),
                PortSpec::Range(a, b) => format!("{protocol} {a}-{b}"),
                PortSpec::Named(n) => format!("{protocol} port named {n}"),
            }
        }
    }
}

#[cfg(test)]
#[path = "tests/explain.rs"]
mod tests;
