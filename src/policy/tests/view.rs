use k8s_openapi::api::core::v1::{Namespace, Pod};
use serde_json::json;

use super::*;
use crate::policy::fixtures::{ip, labels};

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).expect("a pod")
}

#[test]
fn a_pods_view_has_its_addresses_labels_and_named_ports() {
    let p = pod(json!({
        "metadata": {"namespace": "a", "name": "web", "uid": "u-1", "labels": {"app": "web"},
                     "managedFields": [{"manager": "kubectl", "operation": "Update"}],
                     "annotations": {"big": "not kept"}},
        "spec": {"containers": [
            {"name": "c1", "ports": [
                {"name": "http", "containerPort": 8080},
                {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                {"containerPort": 9999},
            ]},
            {"name": "c2", "ports": [{"name": "sctp", "containerPort": 7, "protocol": "SCTP"}]},
        ]},
        "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]},
    }));
    let v = PodView::from_k8s(p);
    assert_eq!((v.namespace.as_str(), v.name.as_str()), ("a", "web"));
    assert_eq!(v.uid.as_deref(), Some("u-1"));
    assert_eq!(v.labels, labels(&[("app", "web")]));
    assert_eq!(v.ips, [ip("10.0.0.1"), ip("fd00::1")]);
    let ports: Vec<(&str, Protocol, u16)> = v
        .ports
        .iter()
        .map(|p| (p.name.as_str(), p.protocol, p.number))
        .collect();
    assert_eq!(
        ports,
        [
            ("http", Protocol::Tcp, 8080),
            ("dns", Protocol::Udp, 53),
            ("sctp", Protocol::Sctp, 7)
        ]
    );
}

#[test]
fn named_ports_come_from_containers_and_native_sidecars_only() {
    let p = pod(json!({
        "metadata": {"namespace": "a", "name": "web"},
        "spec": {
            "containers": [{"name": "app", "ports": [{"name": "http", "containerPort": 8080}]}],
            "initContainers": [
                {"name": "proxy", "restartPolicy": "Always",
                 "ports": [{"name": "metrics", "containerPort": 9090}]},
                {"name": "setup", "ports": [{"name": "setup", "containerPort": 7070}]},
            ],
        },
    }));
    let ports: Vec<(String, u16)> = PodView::from_k8s(p)
        .ports
        .into_iter()
        .map(|p| (p.name, p.number))
        .collect();
    assert_eq!(
        ports,
        [("http".to_string(), 8080), ("metrics".to_string(), 9090)]
    );
}

#[test]
fn only_addresses_that_are_the_pods_own_count() {
    // Only podIP (an older kubelet).
    let v = PodView::from_k8s(pod(
        json!({"metadata": {"name": "x"}, "status": {"podIP": "10.0.0.2"}}),
    ));
    assert_eq!(v.ips, [ip("10.0.0.2")]);
    // A host-network pod's address is its node's; a finished pod's may be reused.
    let host = pod(
        json!({"spec": {"hostNetwork": true, "containers": []}, "status": {"podIP": "192.168.0.1"}}),
    );
    assert!(PodView::from_k8s(host).ips.is_empty());
    for phase in ["Succeeded", "Failed"] {
        let done = pod(json!({"status": {"phase": phase, "podIPs": [{"ip": "10.0.0.3"}]}}));
        assert!(PodView::from_k8s(done).ips.is_empty(), "{phase}");
    }
    // Unreadable addresses are left out; no status is no address.
    let odd = pod(json!({"status": {"podIPs": [{"ip": "not-an-ip"}, {"ip": "10.0.0.4"}]}}));
    assert_eq!(PodView::from_k8s(odd).ips, [ip("10.0.0.4")]);
    assert!(PodView::from_k8s(Pod::default()).ips.is_empty());
}

#[test]
fn a_namespaces_view_is_its_name_and_labels() {
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "a", "labels": {"t": "x"}}}))
            .expect("ns");
    assert_eq!(
        NamespaceView::from_k8s(ns),
        NamespaceView {
            name: "a".into(),
            labels: labels(&[("t", "x")])
        }
    );
    assert_eq!(Protocol::parse("TCP").map(Protocol::api_name), Some("TCP"));
    assert_eq!(Protocol::parse("icmp"), None);
}
