//! A pod and itself (issue 53, item 4), in a real kernel: a connection to the
//! pod's own address never leaves its namespace and no policy filters it; one
//! through a Service that kube-proxy sends back to the pod (the hairpin: DNAT in
//! prerouting, masquerade in postrouting, as kube-proxy's iptables and nftables
//! modes write them) passes the forward hook with the pod's own address as its
//! source and is judged by the pod's ingress policy like any other peer.

use std::net::{IpAddr, SocketAddr};

use serde_json::json;

use super::topology::*;
use crate::harness::*;

/// The Service's virtual address, DNATed to the web pod's port 80.
const VIP: &str = "10.96.0.10";

/// kube-proxy's rules for a Service whose one endpoint is pod `web`, in the
/// node's namespace (gone with it).
fn kube_proxy(t: &Topology, web: IpAddr) {
    let commands = [
        "add table ip kubeproxy".to_string(),
        "add chain ip kubeproxy pre { type nat hook prerouting priority dstnat ; }".into(),
        format!("add rule ip kubeproxy pre ip daddr {VIP} tcp dport 80 dnat to {web}:80"),
        "add chain ip kubeproxy post { type nat hook postrouting priority srcnat ; }".into(),
        format!("add rule ip kubeproxy post ip saddr {web} ip daddr {web} masquerade"),
    ];
    for c in commands {
        let args: Vec<&str> = std::iter::once("nft").chain(c.split(' ')).collect();
        let out = t.node.exec(&args);
        assert!(out.status.success(), "nft {c}: {out:?}");
    }
}

#[test]
fn a_pod_reaches_its_own_address_unfiltered_and_itself_through_a_service_as_policy_says() {
    if !root_or_skip("policy_self_traffic") {
        return;
    }
    let t = Topology::new(2);
    let (web, client) = (0, 1);
    let pods = t.views(&[(&[("app", "web")], &[]), (&[("role", "client")], &[])]);
    let w4 = t.pods[web].v4;
    kube_proxy(&t, w4);
    let service = SocketAddr::new(VIP.parse().expect("VIP"), 80);
    assert!(
        t.tcp_from(&t.pods[web].ns, service, ALLOWED).is_some(),
        "the hairpin works without a policy"
    );

    let clients_only = policy(
        "clients-only",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}),
    );
    t.install(&t.compile(std::slice::from_ref(&clients_only), &pods));
    assert!(
        t.tcp(web, w4, 80, ALLOWED),
        "its own address: never filtered"
    );
    assert!(
        t.tcp_from(&t.pods[client].ns, service, ALLOWED).is_some(),
        "a client through the Service"
    );
    assert!(
        t.tcp_from(&t.pods[web].ns, service, BLOCKED).is_none(),
        "web through its own Service: a peer the policy does not name"
    );

    let and_itself = policy(
        "itself",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}),
    );
    t.install(&t.compile(&[clients_only, and_itself], &pods));
    assert!(
        t.tcp_from(&t.pods[web].ns, service, ALLOWED).is_some(),
        "web through its own Service, once a policy names it"
    );
}
