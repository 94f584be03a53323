//! A NetworkPolicy's view ([`policy`]): its selectors, CIDRs and ports parsed,
//! its policy types defaulted exactly as the API server does (Ingress always;
//! Egress when listed, or when `policyTypes` is empty and egress rules exist),
//! and what is invalid turned into parts that allow nothing, each with its
//! [`Problem`].

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::problem::{Kind, Problem, Why};
use super::selector::Selector;
use super::view::{Namespaces, PeerView, PolicyView, PortSpec, PortView, Protocol, RuleView};

/// Collects the problems of one policy.
struct Problems<'a> {
    policy: &'a NetworkPolicy,
    found: Vec<Problem>,
}

impl Problems<'_> {
    fn add(&mut self, field: String, why: Why) {
        self.found.push(Problem {
            kind: Kind::NetworkPolicy,
            namespace: self.policy.metadata.namespace.clone().unwrap_or_default(),
            name: self.policy.metadata.name.clone().unwrap_or_default(),
            field,
            why,
        });
    }

    /// `selector` at `field` parsed; an invalid one matches nothing.
    fn selector(
        &mut self,
        field: &str,
        selector: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    ) -> Selector {
        Selector::parse_or_nothing(selector, |e| {
            self.add(format!("{field}.{}", e.field), e.why)
        })
    }
}

/// The view of `np`.
pub fn policy(np: &NetworkPolicy) -> PolicyView {
    let namespace = np.metadata.namespace.clone().unwrap_or_default();
    let mut problems = Problems {
        policy: np,
        found: Vec::new(),
    };
    let spec = np.spec.clone().unwrap_or_default();
    let pod_selector = problems.selector("spec.podSelector", spec.pod_selector.as_ref());
    let (mut ingress, mut egress) = (true, false);
    match spec.policy_types.as_deref() {
        None | Some([]) => egress = spec.egress.as_ref().is_some_and(|e| !e.is_empty()),
        Some(types) => {
            ingress = false;
            for (i, t) in types.iter().enumerate() {
                match t.as_str() {
                    "Ingress" => ingress = true,
                    "Egress" => egress = true,
                    other => problems.add(
                        format!("spec.policyTypes[{i}]"),
                        Why::UnknownPolicyType(other.to_string()),
                    ),
                }
            }
        }
    }
    let ingress_rules = spec.ingress.iter().flatten().map(|r| (&r.from, &r.ports));
    let ingress = ingress.then(|| {
        rules(
            &mut problems,
            &namespace,
            "spec.ingress",
            "from",
            ingress_rules,
        )
    });
    let egress_rules = spec.egress.iter().flatten().map(|r| (&r.to, &r.ports));
    let egress =
        egress.then(|| rules(&mut problems, &namespace, "spec.egress", "to", egress_rules));
    PolicyView {
        name: np.metadata.name.clone().unwrap_or_default(),
        namespace,
        pod_selector,
        ingress,
        egress,
        problems: problems.found,
    }
}

type Peers = Option<Vec<NetworkPolicyPeer>>;
type Ports = Option<Vec<NetworkPolicyPort>>;

/// The rules of one direction, `field` their list (`spec.ingress`), each with
/// its peers under `peers_field` (`from`, `to`).
fn rules<'a>(
    problems: &mut Problems,
    namespace: &str,
    field: &str,
    peers_field: &str,
    list: impl Iterator<Item = (&'a Peers, &'a Ports)>,
) -> Vec<RuleView> {
    let rule = |(i, (peers, ports)): (usize, (&Peers, &Ports)), problems: &mut Problems| {
        let peers = peers.iter().flatten().enumerate().map(|(j, p)| {
            let field = format!("{field}[{i}].{peers_field}[{j}]");
            peer(problems, namespace, &field, p)
        });
        let peers = peers.collect();
        let ports = ports
            .iter()
            .flatten()
            .enumerate()
            .map(|(k, p)| port(problems, &format!("{field}[{i}].ports[{k}]"), p));
        RuleView {
            peers,
            ports: ports.collect(),
        }
    };
    list.enumerate().map(|r| rule(r, problems)).collect()
}

fn peer(problems: &mut Problems, namespace: &str, field: &str, p: &NetworkPolicyPeer) -> PeerView {
    if let Some(block) = &p.ip_block {
        return ip_block(problems, &format!("{field}.ipBlock"), block);
    }
    let pods = problems.selector(&format!("{field}.podSelector"), p.pod_selector.as_ref());
    let namespaces = match &p.namespace_selector {
        None if p.pod_selector.is_none() => return PeerView::Nothing,
        None => Namespaces::Own(namespace.to_string()),
        Some(s) => {
            Namespaces::Matching(problems.selector(&format!("{field}.namespaceSelector"), Some(s)))
        }
    };
    PeerView::Pods { namespaces, pods }
}

fn ip_block(problems: &mut Problems, field: &str, block: &IPBlock) -> PeerView {
    let mut parse = |field: String, value: &str| match value.parse::<IpNet>() {
        Ok(net) => Some(net.trunc()),
        Err(e) => {
            let why = Why::InvalidCidr {
                value: value.to_string(),
                reason: e.to_string(),
            };
            problems.add(field, why);
            None
        }
    };
    let net = parse(format!("{field}.cidr"), &block.cidr);
    let except: Option<Vec<IpNet>> = block
        .except
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, e)| parse(format!("{field}.except[{i}]"), e))
        .collect();
    match (net, except) {
        (Some(net), Some(except)) => PeerView::Block { net, except },
        // An except that cannot be read cannot be left out safely: the peer
        // would allow more than the policy says.
        _ => PeerView::Nothing,
    }
}

fn port(problems: &mut Problems, field: &str, p: &NetworkPolicyPort) -> PortView {
    let protocol = p.protocol.as_deref().unwrap_or("TCP");
    let Some(protocol) = Protocol::parse(protocol) else {
        problems.add(
            format!("{field}.protocol"),
            Why::UnknownProtocol(protocol.to_string()),
        );
        return PortView::Nothing;
    };
    let number = |problems: &mut Problems, f: &str, n: i32| match u16::try_from(n) {
        Ok(n) if n > 0 => Some(n),
        _ => {
            problems.add(format!("{field}.{f}"), Why::PortOutOfRange(n.into()));
            None
        }
    };
    let spec = match (&p.port, p.end_port) {
        (None, None) => Some(PortSpec::Any),
        (Some(IntOrString::String(name)), None) => Some(PortSpec::Named(name.clone())),
        (Some(IntOrString::Int(n)), None) => {
            number(problems, "port", *n).map(|n| PortSpec::Range(n, n))
        }
        (Some(IntOrString::Int(n)), Some(end)) => {
            let first = number(problems, "port", *n);
            let last = number(problems, "endPort", end);
            match (first, last) {
                (Some(first), Some(last)) if last >= first => Some(PortSpec::Range(first, last)),
                (Some(first), Some(_)) => {
                    let why = Why::EndPortBelowPort {
                        port: first,
                        end: end.into(),
                    };
                    problems.add(format!("{field}.endPort"), why);
                    None
                }
                _ => None,
            }
        }
        (port, Some(_)) => {
            let what = match port {
                Some(IntOrString::String(name)) => name.clone(),
                _ => "no port".to_string(),
            };
            problems.add(format!("{field}.endPort"), Why::EndPortWithoutNumber(what));
            None
        }
    };
    match spec {
        Some(spec) => PortView::Port { protocol, spec },
        None => PortView::Nothing,
    }
}

#[cfg(test)]
#[path = "tests/view_policy.rs"]
mod tests;
