//! What announcing reads of Services and EndpointSlices.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

use super::names;
use crate::l2announce::views::{ServiceView, SliceView, ready_nodes};

fn service(spec: serde_json::Value, ingress: &[&str]) -> ServiceView {
    let ingress: Vec<_> = ingress.iter().map(|ip| json!({"ip": ip})).collect();
    let s: Service = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": "svc", "labels": {"app": "x"}},
        "spec": spec,
        "status": {"loadBalancer": {"ingress": ingress}}
    }))
    .unwrap();
    ServiceView::from_k8s(s)
}

#[test]
fn a_load_balancer_service_of_no_class_or_the_l2_class_is_announced_another_class_is_not() {
    let v = service(json!({"type": "LoadBalancer"}), &["10.0.0.1", "fd00::1"]);
    assert_eq!(v.key(), "ns/svc");
    assert_eq!(v.load_balancer.len(), 2);
    let l2 = service(
        json!({"type": "LoadBalancer", "loadBalancerClass": "io.cilium/l2-announcer"}),
        &["10.0.0.1"],
    );
    assert_eq!(l2.load_balancer.len(), 1);
    let other = service(
        json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/bgp"}),
        &["10.0.0.1"],
    );
    assert!(other.load_balancer.is_empty());
    let cluster_ip = service(
        json!({"type": "ClusterIP", "externalIPs": ["10.0.0.9", "nonsense"]}),
        &["10.0.0.1"],
    );
    assert!(cluster_ip.load_balancer.is_empty());
    assert_eq!(
        cluster_ip.external,
        ["10.0.0.9".parse::<std::net::IpAddr>().unwrap()]
    );
    assert!(!cluster_ip.local_traffic);
    let local = service(
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local"}),
        &[],
    );
    assert!(local.local_traffic && local.load_balancer.is_empty());
}

#[test]
fn an_endpoint_slice_gives_the_nodes_of_its_ready_endpoints_unset_reading_as_ready() {
    let slice = |name: &str, endpoints: serde_json::Value| {
        let s: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": name, "labels": {"kubernetes.io/service-name": "svc"}},
            "addressType": "IPv4",
            "endpoints": endpoints
        }))
        .unwrap();
        SliceView::from_k8s(s)
    };
    let a = slice(
        "svc-a",
        json!([
            {"addresses": ["10.244.1.5"], "nodeName": "node-1"},
            {"addresses": ["10.244.2.5"], "nodeName": "node-2", "conditions": {"ready": false}},
            {"addresses": ["10.244.9.9"]}
        ]),
    );
    let b = slice(
        "svc-b",
        json!([{"addresses": ["10.244.3.5"], "nodeName": "node-3", "conditions": {"ready": true}}]),
    );
    assert_eq!(a.service.as_deref(), Some("ns/svc"));
    assert_eq!(a.ready_nodes, names(&["node-1"]));
    let by_service = ready_nodes([&a, &b].into_iter());
    assert_eq!(by_service["ns/svc"], names(&["node-1", "node-3"]));
}
