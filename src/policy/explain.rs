//! What the node's policies mean for each local pod, for `podnet explain`: per
//! direction, the ClusterNetworkPolicies of the Admin tier whose subject it is
//! (in the order they decide), the NetworkPolicies that select it, and those of
//! the Baseline tier, each with what its rules do (peers as selectors, ipBlocks
//! and networks, ports) as short text. [`compile`] records it with the state it
//! makes, so explain reads it instead of compiling again.
//!
//! [`compile`]: super::compile()

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::enforcement::Enforcement;
use super::state::Direction;
use super::view::{
    Action, ClusterPolicyView, ClusterRuleView, Namespaces, PeerView, PodView, PolicyView,
    PortSpec, PortView, RuleView, Tier,
};

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
    /// Whether what no policy allows is dropped (NetworkPolicy's isolation).
    pub isolated: bool,
    /// The Admin tier's ClusterNetworkPolicies with rules for this direction
    /// whose subject the pod is, in the order they decide.
    pub admin: Vec<ClusterPolicyRules>,
    /// The policies that select the pod for this direction.
    pub policies: Vec<PolicyAllows>,
    /// The Baseline tier's, as `admin`.
    pub baseline: Vec<ClusterPolicyRules>,
    /// One sentence: the tiers in order, open or isolated and by what.
    pub summary: String,
}

/// A ClusterNetworkPolicy whose subject a pod is, and its rules of a direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPolicyRules {
    pub policy: String,
    pub priority: u16,
    /// Each rule as text, in the order written (the first that matches
    /// decides): `rule 0 (name): Deny from pods app=db of every namespace on TCP 5432`.
    pub rules: Vec<String>,
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
    /// The rules of each ClusterNetworkPolicy whose subject a local pod is,
    /// by name.
    cluster_rules: BTreeMap<String, ClusterRules>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Selected {
    ips: Vec<IpAddr>,
    /// False when its host link cannot be named in nftables: not enforced.
    enforced: bool,
    ingress: Vec<String>,
    egress: Vec<String>,
    /// The ClusterNetworkPolicies whose subject it is, in the order they decide.
    subject_of: Vec<String>,
}

/// A ClusterNetworkPolicy's place and its rules as text per direction.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ClusterRules {
    tier: Tier,
    priority: u16,
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

    /// Records local `pod`, the policies that select it and the
    /// ClusterNetworkPolicies whose subject it is (in the order they decide).
    pub fn record(
        &mut self,
        pod: &PodView,
        selecting: &[&PolicyView],
        subject_of: &[&ClusterPolicyView],
        enforced: bool,
    ) {
        let mut selected = Selected {
            ips: pod.ips.clone(),
            enforced,
            ingress: Vec::new(),
            egress: Vec::new(),
            subject_of: Vec::new(),
        };
        for p in subject_of {
            let Some((tier, priority)) = p.place else {
                continue;
            };
            self.cluster_rules
                .entry(p.name.clone())
                .or_insert_with(|| ClusterRules {
                    tier,
                    priority,
                    ingress: cluster_texts(Direction::Ingress, &p.ingress),
                    egress: cluster_texts(Direction::Egress, &p.egress),
                });
            selected.subject_of.push(p.name.clone());
        }
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
                    "isolated by enable-policy always: no NetworkPolicy selects it for {}, so nothing is allowed{}",
                    d.as_str(),
                    node_clause(d),
                ),
                (false, _) => format!(
                    "isolated: only what {} allow{}{}",
                    keys.join(", "),
                    if keys.len() == 1 { "s" } else { "" },
                    node_clause(d),
                ),
            };
            let admin = self.tier_of(&s.subject_of, Tier::Admin, d);
            let baseline = self.tier_of(&s.subject_of, Tier::Baseline, d);
            DirectionPolicy {
                isolated,
                summary: tiers_summary(&admin, summary, &baseline, isolated),
                admin,
                policies,
                baseline,
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
            admin: Vec::new(),
            policies: Vec::new(),
            baseline: Vec::new(),
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

    /// The policies of `tier` among `subject_of` with rules for `d`, in order.
    fn tier_of(&self, subject_of: &[String], tier: Tier, d: Direction) -> Vec<ClusterPolicyRules> {
        let placed = subject_of
            .iter()
            .filter_map(|name| Some((name, self.cluster_rules.get(name)?)));
        let of_tier = placed.filter(|(_, r)| r.tier == tier);
        of_tier
            .filter_map(|(name, r)| {
                let rules = match d {
                    Direction::Ingress => &r.ingress,
                    Direction::Egress => &r.egress,
                };
                (!rules.is_empty()).then(|| ClusterPolicyRules {
                    policy: name.clone(),
                    priority: r.priority,
                    rules: rules.clone(),
                })
            })
            .collect()
    }
}

/// The summary of a direction: the Admin tier's policies first, then
/// NetworkPolicy's `policy` sentence, then the Baseline tier's, which decide
/// only where NetworkPolicy does not isolate. `policy` alone when no
/// ClusterNetworkPolicy has a say.
fn tiers_summary(
    admin: &[ClusterPolicyRules],
    policy: String,
    baseline: &[ClusterPolicyRules],
    isolated: bool,
) -> String {
    let names = |tier: &[ClusterPolicyRules]| {
        let names: Vec<&str> = tier.iter().map(|p| p.policy.as_str()).collect();
        names.join(", ")
    };
    let mut summary = String::new();
    if !admin.is_empty() {
        summary = format!("first the Admin tier ({}); then ", names(admin));
    }
    summary.push_str(&policy);
    match (baseline.is_empty(), isolated) {
        (true, _) => {}
        (false, true) => summary.push_str(&format!(
            "; the Baseline tier ({}) is not reached: NetworkPolicy isolates the pod",
            names(baseline)
        )),
        (false, false) => summary.push_str(&format!(
            "; then the Baseline tier ({}); what no tier decides passes",
            names(baseline)
        )),
    }
    summary
}

/// What an isolated direction says of the pod's own node: what the node sends
/// the pod always passes; what the pod sends its node is judged like the rest.
fn node_clause(d: Direction) -> &'static str {
    match d {
        Direction::Ingress => "; traffic from its own node passes",
        Direction::Egress => "; traffic to its own node too",
    }
}

/// Each rule of `policy` for `d` as one line; no rule is "nothing".
fn texts(d: Direction, rules: &[RuleView]) -> Vec<String> {
    if rules.is_empty() {
        return vec!["nothing".into()];
    }
    rules.iter().map(|r| rule_text(d, r)).collect()
}

/// `from <peers> on <ports>` (ingress) or `to <peers> on <ports>` (egress).
fn rule_text(d: Direction, rule: &RuleView) -> String {
    let ports: Vec<String> = rule.ports.iter().map(port_text).collect();
    rule_body(d, &rule.peers, "anywhere", ports)
}

/// `<from|to> <peers> on <ports>`; `no_peer` says what no peer means.
fn rule_body(d: Direction, peers: &[PeerView], no_peer: &str, ports: Vec<String>) -> String {
    let peers = match peers.is_empty() {
        true => no_peer.to_string(),
        false => {
            let peers: Vec<String> = peers.iter().map(peer_text).collect();
            peers.join(", ")
        }
    };
    let ports = match ports.is_empty() {
        true => "any port".to_string(),
        false => ports.join(", "),
    };
    let way = match d {
        Direction::Ingress => "from",
        Direction::Egress => "to",
    };
    format!("{way} {peers} on {ports}")
}

/// Each ClusterNetworkPolicy rule of a direction as one line.
fn cluster_texts(d: Direction, rules: &[ClusterRuleView]) -> Vec<String> {
    rules.iter().map(|r| cluster_rule_text(d, r)).collect()
}

/// `rule <index> (<name>): <Action> <from|to> <peers> on <ports>`; a rule that
/// failed closed says so. Its peers list nobody when empty (the API's peers
/// match what they select, none selects nothing); a named port, which names no
/// protocol, is said once.
fn cluster_rule_text(d: Direction, rule: &ClusterRuleView) -> String {
    let label = match &rule.name {
        Some(name) => format!("rule {} ({name})", rule.index),
        None => format!("rule {}", rule.index),
    };
    let action = match rule.action {
        Action::Accept => "Accept",
        Action::Deny => "Deny",
        Action::Pass => "Pass",
    };
    let Some(peers) = &rule.peers else {
        let body = rule_body(d, &[], "anywhere", Vec::new());
        return format!(
            "{label}: {action} {body} (the rule has a problem: podnet status names it)"
        );
    };
    let mut ports: Vec<String> = Vec::new();
    for port in &rule.ports {
        let text = match port {
            PortView::Port {
                spec: PortSpec::Named(name),
                ..
            } => format!("port named {name}"),
            other => port_text(other),
        };
        if !ports.contains(&text) {
            ports.push(text);
        }
    }
    format!("{label}: {action} {}", rule_body(d, peers, "nobody", ports))
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
