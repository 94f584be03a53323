//! Test fixtures: views of pods, namespaces, policies and nodes written
//! briefly, a compile of pods given with where they run ([`Placed`],
//! [`compile_placed`], [`compile_with_nodes`]), and what a compiled chain lets
//! through, read as the kernel reads its rules ([`peer_allowed`]).

use std::net::IpAddr;
use std::ops::{Deref, DerefMut};

use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::compile::{Cluster, Compiled, Local, compile};
use super::enforcement::Enforcement;
use super::selector::Labels;
use super::state::{ChainKey, Direction, Element, PeerMatch, ROUTER_SET, State};
use super::view::{self, NamedPort, NamespaceView, NodeView, PodView, PolicyView, Protocol};

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

/// A node with its InternalIPs and router addresses.
pub fn node(name: &str, internal_ips: &[&str], router_ips: &[&str]) -> NodeView {
    NodeView {
        name: name.into(),
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
        pods: &pods.iter().map(|p| &p.view).collect::<Vec<_>>(),
        local: &local,
        namespaces: &namespaces.iter().collect::<Vec<_>>(),
        node_addresses,
        nodes,
    })
}

/// Whether `link`'s chain of `direction` in `state` lets a packet from (ingress)
/// or to (egress) `peer` through on some port, as the kernel reads the rules
/// `render` writes of it; true when the pod has no such chain (open).
pub fn peer_allowed(state: &State, direction: Direction, link: &str, peer: IpAddr) -> bool {
    let key = ChainKey {
        direction,
        link: link.into(),
    };
    let Some(rules) = state.chains.get(&key) else {
        return true;
    };
    let in_set = |name: &str| {
        let set = state.sets.get(name);
        set.is_some_and(|s| s.elements.contains(&Element::Address(peer)))
    };
    rules.iter().any(|rule| match &rule.peer {
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
    })
}
