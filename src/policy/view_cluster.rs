//! A ClusterNetworkPolicy's view ([`cluster_policy`], `policy.networking.k8s.io`
//! v1beta1 or v1alpha2 of network-policy-api v0.3.0, whose two versions have
//! the same fields; the experimental channel's named ports and node peers
//! included): its tier and priority, subject, and rules in the order written,
//! selectors, CIDRs and ports parsed. What is invalid is a [`Problem`] and
//! fails closed, as the API's types say of a peer they cannot read: a rule with
//! a problem matches nothing when it accepts, and denies everything (every
//! peer, every port) when it denies or passes or its action is unknown; a
//! policy whose tier or priority is invalid, or whose spec does not decode,
//! applies nothing; a subject that is invalid selects no pod. `domainNames`
//! peers are not enforced: a rule that has one is a problem.

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Deserialize;

use super::problem::{Kind, Problem, Why};
use super::selector::{Labels, Selector};
use super::view::{Namespaces, PeerView, PortSpec, PortView, Protocol};

/// The highest priority the API allows (0 is the highest precedence).
pub const MAX_PRIORITY: u16 = 1000;

/// A ClusterNetworkPolicy's tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Before NetworkPolicy.
    Admin,
    /// After NetworkPolicy.
    Baseline,
}

/// A rule's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    Accept,
    Deny,
    Pass,
}

/// The pods a policy applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// Every pod of the namespaces the selector matches.
    Namespaces(Selector),
    /// The pods `pods` matches in the namespaces `namespaces` matches.
    Pods {
        namespaces: Selector,
        pods: Selector,
    },
    /// An invalid subject: no pod.
    Nothing,
}

impl Subject {
    /// Whether a pod with `labels` in a namespace with `namespace_labels` is
    /// a subject.
    pub fn matches(&self, namespace_labels: &Labels, labels: &Labels) -> bool {
        match self {
            Subject::Namespaces(n) => n.matches(namespace_labels),
            Subject::Pods { namespaces, pods } => {
                namespaces.matches(namespace_labels) && pods.matches(labels)
            }
            Subject::Nothing => false,
        }
    }
}

/// One rule, as enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRuleView {
    pub action: Action,
    /// None: every peer (a rule that failed closed).
    pub peers: Option<Vec<PeerView>>,
    /// Empty: every port and protocol.
    pub ports: Vec<PortView>,
    /// Its index in the policy's `ingress` or `egress` list.
    pub index: usize,
    /// Its `name`, when set (not empty).
    pub name: Option<String>,
}

/// A ClusterNetworkPolicy as the enforcer needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPolicyView {
    pub name: String,
    /// Its tier and priority; None when either is invalid (it applies nothing).
    pub place: Option<(Tier, u16)>,
    pub subject: Subject,
    /// In the order written (the first takes precedence).
    pub ingress: Vec<ClusterRuleView>,
    pub egress: Vec<ClusterRuleView>,
    /// Each `destinationNamedPort` of a rule it enforces, with its field (the
    /// compile reports a name no pod's container port has).
    pub named_ports: Vec<NamedPortUse>,
    pub problems: Vec<Problem>,
}

/// A `destinationNamedPort` and where it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedPortUse {
    /// `spec.ingress[0].protocols[1].destinationNamedPort`.
    pub field: String,
    pub name: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Spec {
    tier: Option<String>,
    priority: Option<i64>,
    subject: SubjectSpec,
    ingress: Vec<RuleSpec>,
    egress: Vec<RuleSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct SubjectSpec {
    namespaces: Option<LabelSelector>,
    pods: Option<NamespacedPod>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct NamespacedPod {
    namespace_selector: Option<LabelSelector>,
    pod_selector: Option<LabelSelector>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RuleSpec {
    name: Option<String>,
    action: String,
    /// `from` (ingress) or `to` (egress).
    #[serde(alias = "to")]
    from: Vec<PeerSpec>,
    protocols: Vec<ProtocolSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct PeerSpec {
    namespaces: Option<LabelSelector>,
    pods: Option<NamespacedPod>,
    nodes: Option<LabelSelector>,
    networks: Option<Vec<String>>,
    domain_names: Option<Vec<String>>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ProtocolSpec {
    tcp: Option<PortHolder>,
    udp: Option<PortHolder>,
    sctp: Option<PortHolder>,
    destination_named_port: Option<String>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct PortHolder {
    destination_port: Option<PortSpecJson>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PortSpecJson {
    number: Option<i64>,
    range: Option<RangeJson>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RangeJson {
    start: i64,
    end: i64,
}

/// Collects the problems of one policy.
struct Problems {
    name: String,
    found: Vec<Problem>,
}

impl Problems {
    fn add(&mut self, field: String, why: Why) {
        self.found.push(Problem {
            kind: Kind::ClusterNetworkPolicy,
            namespace: String::new(),
            name: self.name.clone(),
            field,
            why,
        });
    }

    /// `selector` at `field`, absent meaning empty; None when invalid.
    fn selector(&mut self, field: &str, selector: Option<&LabelSelector>) -> Option<Selector> {
        let mut ok = true;
        let s = Selector::parse_or_nothing(selector, |e| {
            ok = false;
            self.add(format!("{field}.{}", e.field), e.why)
        });
        ok.then_some(s)
    }
}

/// The view of the ClusterNetworkPolicy `name` whose `spec` is given (as the
/// API server sent it).
pub fn cluster_policy(name: &str, spec: &serde_json::Value) -> ClusterPolicyView {
    let mut problems = Problems {
        name: name.to_string(),
        found: Vec::new(),
    };
    let nothing = |problems: Problems| ClusterPolicyView {
        name: name.to_string(),
        place: None,
        subject: Subject::Nothing,
        ingress: Vec::new(),
        egress: Vec::new(),
        named_ports: Vec::new(),
        problems: problems.found,
    };
    let spec: Spec = match Spec::deserialize(spec) {
        Ok(spec) => spec,
        Err(e) => {
            problems.add("spec".into(), Why::Undecodable(e.to_string()));
            return nothing(problems);
        }
    };
    let place = place(&mut problems, &spec);
    let subject = subject(&mut problems, &spec.subject);
    let mut named_ports = Vec::new();
    let (ingress, egress) = (&spec.ingress, &spec.egress);
    let ingress = rules(
        &mut problems,
        &mut named_ports,
        "spec.ingress",
        "from",
        false,
        ingress,
    );
    let egress = rules(
        &mut problems,
        &mut named_ports,
        "spec.egress",
        "to",
        true,
        egress,
    );
    if place.is_none() {
        return nothing(problems);
    }
    ClusterPolicyView {
        name: name.to_string(),
        place,
        subject,
        ingress,
        egress,
        named_ports,
        problems: problems.found,
    }
}

fn place(problems: &mut Problems, spec: &Spec) -> Option<(Tier, u16)> {
    let tier = match spec.tier.as_deref() {
        Some("Admin") => Some(Tier::Admin),
        Some("Baseline") => Some(Tier::Baseline),
        other => {
            let why = Why::UnknownTier(other.unwrap_or_default().to_string());
            problems.add("spec.tier".into(), why);
            None
        }
    };
    let priority = match spec.priority {
        Some(p) if (0..=i64::from(MAX_PRIORITY)).contains(&p) => u16::try_from(p).ok(),
        other => {
            let why = Why::PriorityOutOfRange(other.unwrap_or(-1));
            problems.add("spec.priority".into(), why);
            None
        }
    };
    Some((tier?, priority?))
}

/// The names of the fields of an object of the API set in `fields`.
fn set_fields(
    fields: &[(&'static str, bool)],
    other: &BTreeMap<String, serde_json::Value>,
) -> Vec<String> {
    let known = fields
        .iter()
        .filter(|(_, set)| *set)
        .map(|(n, _)| n.to_string());
    known.chain(other.keys().cloned()).collect()
}

fn subject(problems: &mut Problems, s: &SubjectSpec) -> Subject {
    let set = set_fields(
        &[
            ("namespaces", s.namespaces.is_some()),
            ("pods", s.pods.is_some()),
        ],
        &s.other,
    );
    match (&s.namespaces, &s.pods) {
        (Some(n), None) if set.len() == 1 => problems
            .selector("spec.subject.namespaces", Some(n))
            .map_or(Subject::Nothing, Subject::Namespaces),
        (None, Some(p)) if set.len() == 1 => match namespaced(problems, "spec.subject.pods", p) {
            Some((namespaces, pods)) => Subject::Pods { namespaces, pods },
            None => Subject::Nothing,
        },
        _ => {
            let why = Why::NotExactlyOne(describe(&set), "namespaces, pods");
            problems.add("spec.subject".into(), why);
            Subject::Nothing
        }
    }
}

fn describe(set: &[String]) -> String {
    match set.is_empty() {
        true => "no field".into(),
        false => set.join(", "),
    }
}

fn namespaced(
    problems: &mut Problems,
    field: &str,
    p: &NamespacedPod,
) -> Option<(Selector, Selector)> {
    let namespaces = problems.selector(
        &format!("{field}.namespaceSelector"),
        p.namespace_selector.as_ref(),
    );
    let pods = problems.selector(&format!("{field}.podSelector"), p.pod_selector.as_ref());
    Some((namespaces?, pods?))
}

/// The rules of one direction, each failed closed when it has a problem; the
/// named ports of those without one are added to `named_ports`.
fn rules(
    problems: &mut Problems,
    named_ports: &mut Vec<NamedPortUse>,
    field: &str,
    peers_field: &str,
    egress: bool,
    list: &[RuleSpec],
) -> Vec<ClusterRuleView> {
    let mut out = Vec::new();
    for (i, r) in list.iter().enumerate() {
        let field = format!("{field}[{i}]");
        let before = problems.found.len();
        let action = match r.action.as_str() {
            "Accept" => Some(Action::Accept),
            "Deny" => Some(Action::Deny),
            "Pass" => Some(Action::Pass),
            other => {
                problems.add(format!("{field}.action"), Why::UnknownAction(other.into()));
                None
            }
        };
        let mut peers = Vec::new();
        for (j, p) in r.from.iter().enumerate() {
            let field = format!("{field}.{peers_field}[{j}]");
            peers.extend(peer(problems, &field, egress, p));
        }
        let mut ports = Vec::new();
        for (k, p) in r.protocols.iter().enumerate() {
            ports.extend(protocol(problems, &format!("{field}.protocols[{k}]"), p));
        }
        let name = r.name.clone().filter(|n| !n.is_empty());
        match (action, problems.found.len() == before) {
            (Some(action), true) => {
                let named = r.protocols.iter().enumerate().filter_map(|(k, p)| {
                    Some(NamedPortUse {
                        field: format!("{field}.protocols[{k}].destinationNamedPort"),
                        name: p.destination_named_port.clone()?,
                    })
                });
                named_ports.extend(named);
                out.push(ClusterRuleView {
                    action,
                    peers: Some(peers),
                    ports,
                    index: i,
                    name,
                });
            }
            (Some(Action::Accept), false) => {}
            _ => out.push(ClusterRuleView {
                action: Action::Deny,
                peers: None,
                ports: Vec::new(),
                index: i,
                name,
            }),
        }
    }
    out
}

/// One peer's views (a `networks` peer one per CIDR); problems are added.
fn peer(problems: &mut Problems, field: &str, egress: bool, p: &PeerSpec) -> Vec<PeerView> {
    let egress_only = p.nodes.is_some() || p.networks.is_some() || p.domain_names.is_some();
    let fields = [
        ("namespaces", p.namespaces.is_some()),
        ("pods", p.pods.is_some()),
        ("nodes", p.nodes.is_some()),
        ("networks", p.networks.is_some()),
        ("domainNames", p.domain_names.is_some()),
    ];
    let set = set_fields(&fields, &p.other);
    let one_of = match egress {
        true => "namespaces, pods, nodes, networks, domainNames",
        false => "namespaces, pods",
    };
    if set.len() != 1 || (egress_only && !egress) || !p.other.is_empty() {
        problems.add(field.into(), Why::NotExactlyOne(describe(&set), one_of));
        return Vec::new();
    }
    let every_pod = Selector::everything();
    match (&p.namespaces, &p.pods, &p.nodes, &p.networks) {
        (Some(n), ..) => problems
            .selector(&format!("{field}.namespaces"), Some(n))
            .map(|n| PeerView::Pods {
                namespaces: Namespaces::Matching(n),
                pods: every_pod,
            })
            .into_iter()
            .collect(),
        (_, Some(pods), ..) => namespaced(problems, &format!("{field}.pods"), pods)
            .map(|(n, pods)| PeerView::Pods {
                namespaces: Namespaces::Matching(n),
                pods,
            })
            .into_iter()
            .collect(),
        (.., Some(nodes), _) => problems
            .selector(&format!("{field}.nodes"), Some(nodes))
            .map(PeerView::Nodes)
            .into_iter()
            .collect(),
        (.., Some(networks)) => networks
            .iter()
            .enumerate()
            .filter_map(|(k, cidr)| network(problems, &format!("{field}.networks[{k}]"), cidr))
            .collect(),
        _ => {
            problems.add(
                format!("{field}.domainNames"),
                Why::NotSupported("domainNames"),
            );
            Vec::new()
        }
    }
}

fn network(problems: &mut Problems, field: &str, cidr: &str) -> Option<PeerView> {
    match cidr.parse::<IpNet>() {
        Ok(net) => Some(PeerView::Block {
            net: net.trunc(),
            except: Vec::new(),
        }),
        Err(e) => {
            let why = Why::InvalidCidr {
                value: cidr.to_string(),
                reason: e.to_string(),
            };
            problems.add(field.into(), why);
            None
        }
    }
}

/// One entry of `protocols`; problems are added.
fn protocol(problems: &mut Problems, field: &str, p: &ProtocolSpec) -> Vec<PortView> {
    let set = set_fields(
        &[
            ("tcp", p.tcp.is_some()),
            ("udp", p.udp.is_some()),
            ("sctp", p.sctp.is_some()),
            ("destinationNamedPort", p.destination_named_port.is_some()),
        ],
        &p.other,
    );
    if set.len() != 1 || !p.other.is_empty() {
        let why = Why::NotExactlyOne(describe(&set), "tcp, udp, sctp, destinationNamedPort");
        problems.add(field.into(), why);
        return Vec::new();
    }
    let numbered = [
        ("tcp", Protocol::Tcp, &p.tcp),
        ("udp", Protocol::Udp, &p.udp),
        ("sctp", Protocol::Sctp, &p.sctp),
    ];
    for (name, protocol, holder) in numbered {
        if let Some(holder) = holder {
            let field = format!("{field}.{name}.destinationPort");
            return destination_port(problems, &field, protocol, holder.destination_port.as_ref())
                .into_iter()
                .collect();
        }
    }
    // A named port names no protocol: the container port of that name, whichever.
    let name = p.destination_named_port.clone().unwrap_or_default();
    [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
        .into_iter()
        .map(|protocol| PortView::Port {
            protocol,
            spec: PortSpec::Named(name.clone()),
        })
        .collect()
}

fn destination_port(
    problems: &mut Problems,
    field: &str,
    protocol: Protocol,
    port: Option<&PortSpecJson>,
) -> Option<PortView> {
    let number = |problems: &mut Problems, f: String, n: i64| match u16::try_from(n) {
        Ok(n) if n > 0 => Some(n),
        _ => {
            problems.add(f, Why::PortOutOfRange(n));
            None
        }
    };
    let spec = match port {
        Some(PortSpecJson {
            number: Some(n),
            range: None,
        }) => {
            let n = number(problems, format!("{field}.number"), *n)?;
            PortSpec::Range(n, n)
        }
        Some(PortSpecJson {
            number: None,
            range: Some(r),
        }) => {
            let start = number(problems, format!("{field}.range.start"), r.start);
            let end = number(problems, format!("{field}.range.end"), r.end);
            let (start, end) = (start?, end?);
            if start >= end {
                let why = Why::RangeStartNotBelowEnd {
                    start: start.into(),
                    end: end.into(),
                };
                problems.add(format!("{field}.range"), why);
                return None;
            }
            PortSpec::Range(start, end)
        }
        other => {
            let set = match other {
                None => "no field".to_string(),
                Some(_) => "number, range".to_string(),
            };
            problems.add(field.into(), Why::NotExactlyOne(set, "number, range"));
            return None;
        }
    };
    Some(PortView::Port { protocol, spec })
}

#[cfg(test)]
#[path = "tests/view_cluster.rs"]
mod tests;
