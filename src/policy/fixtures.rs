//! Test fixtures: views of pods, namespaces and policies written briefly.

use std::net::IpAddr;

use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::selector::Labels;
use super::view::{self, NamedPort, NamespaceView, PodView, PolicyView, Protocol};

pub fn labels(kv: &[(&str, &str)]) -> Labels {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("a test address")
}

/// A remote pod (no host link).
pub fn pod(namespace: &str, name: &str, kv: &[(&str, &str)], ips: &[&str]) -> PodView {
    PodView {
        namespace: namespace.into(),
        name: name.into(),
        labels: labels(kv),
        ips: ips.iter().map(|s| ip(s)).collect(),
        host_link: None,
        ports: Vec::new(),
    }
}

/// `pod` on this node, on `link`.
pub fn local(mut pod: PodView, link: &str) -> PodView {
    pod.host_link = Some(link.into());
    pod
}

/// `pod` with a named TCP port.
pub fn with_port(mut pod: PodView, name: &str, protocol: Protocol, number: u16) -> PodView {
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
