//! A pod and its own node, in a real kernel: what the node sends a pod passes
//! whatever the policy (kubelet probes); what a pod sends its node (a server of
//! the node's, at one of its addresses) is judged by the pod's egress policy
//! like any other destination, on the input hook; IPv6 neighbour discovery to
//! the node passes whatever the policy, or the pod would reach nothing.

use std::net::{IpAddr, SocketAddr};

use serde_json::json;

use super::topology::*;
use crate::harness::*;

/// The node's server's port.
const NODE_PORT: u16 = 7000;

#[test]
fn a_pods_egress_policy_judges_what_it_sends_its_own_node() {
    if !root_or_skip("policy_own_node") {
        return;
    }
    let t = Topology::new(2);
    let (web, client) = (0, 1);
    let _server = Echo::start(&t.node, NODE_PORT);
    let pods = t.views(&[(&[("app", "web")], &[]), (&[("role", "client")], &[])]);
    let node: [IpAddr; 2] = [ROUTER4, NODE6].map(|a| a.parse().expect("node address"));
    for ip in node {
        assert!(t.tcp(web, ip, NODE_PORT, ALLOWED), "no policy: web -> {ip}");
    }

    let only_client = policy(
        "only-client",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "policyTypes": ["Ingress", "Egress"],
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}],
               "egress": [{"to": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}),
    );
    t.install(&t.compile(std::slice::from_ref(&only_client), &pods));
    for ip in node {
        assert!(
            !t.tcp(web, ip, NODE_PORT, BLOCKED),
            "web -> its node at {ip}: no rule allows it"
        );
        assert!(
            t.tcp(client, ip, NODE_PORT, ALLOWED),
            "client -> its node at {ip}: no policy selects client"
        );
    }
    assert!(
        t.tcp_from(&t.node, SocketAddr::new(t.pods[web].v4, 80), ALLOWED)
            .is_some(),
        "the node reaches web (kubelet probes)"
    );
    // web and the node forget each other's link-layer address: reaching
    // client over IPv6 takes a neighbour solicitation to the node first.
    run(&t.pods[web].ns, "ip -6 neigh flush all");
    run(
        &t.node,
        &format!("ip -6 neigh flush dev {}", t.pods[web].link),
    );
    assert!(
        t.tcp(web, t.pods[client].v6, 80, ALLOWED),
        "web -> client over IPv6: neighbour discovery with the node passes"
    );

    let to_node = policy(
        "to-node",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"],
               "egress": [{"to": [{"ipBlock": {"cidr": format!("{ROUTER4}/32")}}],
                           "ports": [{"port": NODE_PORT}]}]}),
    );
    t.install(&t.compile(&[only_client, to_node], &pods));
    assert!(
        t.tcp(web, node[0], NODE_PORT, ALLOWED),
        "an ipBlock of the node's IPv4 address allows it"
    );
    assert!(
        !t.tcp(web, node[1], NODE_PORT, BLOCKED),
        "and not its IPv6 address"
    );
    t.remove();
    assert!(
        t.tcp(web, node[1], NODE_PORT, ALLOWED),
        "no table: nothing judged"
    );
}
