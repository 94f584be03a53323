//! Test fixtures: views of pods, namespaces, policies and nodes written
//! briefly, a compile of pods given with where they run ([`Placed`],
//! [`compile_placed`], [`compile_with_nodes`]), and what a compiled chain lets
//! through, read as the kernel reads its rules ([`peer_allowed`], [`judge`]).

use std::net::IpAddr;
use std::ops::{Deref, DerefMut};

use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::compile::{Cluster, Compiled, Local, compile};
use super::enforcement::Enforcement;
use super::selector::Labels;
use super::state::{
    ChainKey, Direction, Element, PeerMatch, PortMatch, ROUTER_SET, Rule, State, TierRule, Verdict,
};
use super::view::{
    self, ClusterPolicyView, NamedPort, NamespaceView, NodeView, PodView, PolicyView, Protocol,
};

/// A test pod: its view, and its host link when it runs on this node.
#[derive(Debug, Clone)]
pub struct Placed {
    pub view: PodView,
    pub link: Option<String>,
}

impl Deref for Placed {
    type Target = PodView;
    fn deref(&self) -> &PodView {
        &self.view
    }
}

impl DerefMut for Placed {
    fn deref_mut(&mut self) -> &mut PodView {
        &mut self.view
    }
}

pub fn labels(kv: &[(&str, &str)]) -> Labels {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("a test address")
}

/// A remote pod (no host link).
pub fn pod(namespace: &str, name: &str, kv: &[(&str, &str)], ips: &[&str]) -> Placed {
    let view = PodView {
        namespace: namespace.into(),
        name: name.into(),
        uid: None,
        labels: labels(kv),
        ips: ips.iter().map(|s| ip(s)).collect(),
        ports: Vec::new(),
    };
    Placed { view, link: None }
}

/// `pod` on this node, on `link`.
pub fn local(mut pod: Placed, link: &str) -> Placed {
    pod.link = Some(link.into());
    pod
}

/// `pod` with a named port.
pub fn with_port(mut pod: Placed, name: &str, protocol: Protocol, number: u16) -> Placed {
    pod.ports.push(NamedPort {
        name: name.into(),
        protocol,
        number,
    });
    pod
}

pub fn namespace(name: &str, kv: &[(&str, &str)]) -> NamespaceView {
    NamespaceView {
        name: name.into(),
        labels: labels(kv),
    }
}

/// A NetworkPolicy from its JSON (`metadata` and `spec`).
pub fn np(v: serde_json::Value) -> NetworkPolicy {
    serde_json::from_value(v).expect("a NetworkPolicy")
}

/// The view of policy `namespace/name` with `spec`.
pub fn policy(namespace: &str, name: &str, spec: serde_json::Value) -> PolicyView {
    view::policy(&np(serde_json::json!({
        "metadata": {"namespace": namespace, "name": name},
        "spec": spec,
    })))
}

/// The view of ClusterNetworkPolicy `name` with `spec`.
pub fn cnp(name: &str, spec: serde_json::Value) -> ClusterPolicyView {
    view::cluster_policy(name, &spec)
}

/// A node with its InternalIPs and router addresses.
pub fn node(name: &str, internal_ips: &[&str], router_ips: &[&str]) -> NodeView {
    NodeView {
        name: name.into(),
        labels: Labels::new(),
        internal_ips: internal_ips.iter().map(|s| ip(s)).collect(),
        router_ips: router_ips.iter().map(|s| ip(s)).collect(),
    }
}

/// Compiles `pods` (those with a link local) with the rest of the cluster, of
/// no known node.
pub fn compile_placed(
    enforcement: Enforcement,
    policies: &[PolicyView],
    pods: &[Placed],
    namespaces: &[NamespaceView],
    node_addresses: &[IpAddr],
) -> Compiled {
    compile_with_nodes(enforcement, policies, pods, namespaces, node_addresses, &[])
}

/// [`compile_placed`] in a cluster of `nodes`.
pub fn compile_with_nodes(
    enforcement: Enforcement,
    policies: &[PolicyView],
    pods: &[Placed],
    namespaces: &[NamespaceView],
    node_addresses: &[IpAddr],
    nodes: &[NodeView],
) -> Compiled {
    compile_all(
        enforcement,
        policies,
        &[],
        pods,
        namespaces,
        node_addresses,
        nodes,
    )
}

/// [`compile_with_nodes`] with ClusterNetworkPolicies.
pub fn compile_all(
    enforcement: Enforcement,
    policies: &[PolicyView],
    cluster_policies: &[ClusterPolicyView],
    pods: &[Placed],
    namespaces: &[NamespaceView],
    node_addresses: &[IpAddr],
    nodes: &[NodeView],
) -> Compiled {
    let local: Vec<Local> = pods
        .iter()
        .filter_map(|p| {
            Some(Local {
                pod: &p.view,
                link: p.link.as_deref()?,
            })
        })
        .collect();
    compile(Cluster {
        enforcement,
        policies: &policies.iter().collect::<Vec<_>>(),
        cluster_policies: &cluster_policies.iter().collect::<Vec<_>>(),
        pods: &pods.iter().map(|p| &p.view).collect::<Vec<_>>(),
        local: &local,
        namespaces: &namespaces.iter().collect::<Vec<_>>(),
        node_addresses,
        nodes,
    })
}

/// Whether `link`'s chain of `direction` in `state` lets a packet from (ingress)
/// or to (egress) `peer` through on some port of NetworkPolicy's tier, as the
/// kernel reads the rules `render` writes of it; true when the pod has no such
/// chain or NetworkPolicy does not isolate it.
pub fn peer_allowed(state: &State, direction: Direction, link: &str, peer: IpAddr) -> bool {
    let Some(chain) = state.chains.get(&chain_key(direction, link)) else {
        return true;
    };
    let Some(rules) = &chain.policy else {
        return true;
    };
    rules
        .iter()
        .any(|rule| peer_matches(state, &rule.peer, peer))
}

fn chain_key(direction: Direction, link: &str) -> ChainKey {
    ChainKey {
        direction,
        link: link.into(),
    }
}

/// Whether `peer` is an address `m` matches.
fn peer_matches(state: &State, m: &PeerMatch, peer: IpAddr) -> bool {
    let in_set = |name: &str| {
        let set = state.sets.get(name);
        set.is_some_and(|s| s.elements.contains(&Element::Address(peer)))
    };
    match m {
        PeerMatch::Any => true,
        PeerMatch::Set(name) => in_set(name),
        PeerMatch::Block {
            net,
            except,
            routers,
        } => {
            let in_block = net.contains(&peer) && !except.iter().any(|e| e.contains(&peer));
            match routers {
                None => in_block,
                Some(judged) => (in_block && !in_set(ROUTER_SET)) || in_set(judged),
            }
        }
    }
}

/// Whether a rule matches a packet from (ingress) or to (egress) `peer` on
/// `port` (its protocol and destination port).
fn rule_matches(state: &State, rule: &Rule, peer: IpAddr, port: (Protocol, u16)) -> bool {
    let (protocol, number) = port;
    let port_matches = match &rule.port {
        PortMatch::Any => true,
        PortMatch::Protocol(p) => *p == protocol,
        PortMatch::Ranges(p, ranges) => {
            *p == protocol && ranges.iter().any(|(a, b)| (*a..=*b).contains(&number))
        }
        PortMatch::Named(p, set) => {
            let pair = Element::AddressPort(peer, number);
            *p == protocol
                && state
                    .sets
                    .get(set)
                    .is_some_and(|s| s.elements.contains(&pair))
        }
    };
    port_matches && peer_matches(state, &rule.peer, peer)
}

/// Whether `link`'s chain of `direction` lets a packet from (ingress) or to
/// (egress) `peer` on `port` through, tier by tier as the rendered chains
/// judge it (true when the pod has no chain).
pub fn judge(
    state: &State,
    direction: Direction,
    link: &str,
    peer: IpAddr,
    port: (Protocol, u16),
) -> bool {
    let Some(chain) = state.chains.get(&chain_key(direction, link)) else {
        return true;
    };
    let first = |rules: &[TierRule]| {
        let matching = rules
            .iter()
            .find(|r| rule_matches(state, &r.rule, peer, port));
        matching.map(|r| r.verdict)
    };
    match first(&chain.admin) {
        Some(Verdict::Allow) => return true,
        Some(Verdict::Deny) => return false,
        Some(Verdict::Pass) | None => {}
    }
    if let Some(rules) = &chain.policy {
        return rules.iter().any(|r| rule_matches(state, r, peer, port));
    }
    !matches!(first(&chain.baseline), Some(Verdict::Deny))
}
