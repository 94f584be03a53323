//! Node IPAM in `podnet operator` (`--enable-node-ipam`) on a real kube-apiserver
//! and etcd (integration/k8s.rs), with the least-privilege ServiceAccount of
//! deploy/operator.yaml. The chapter's Lab 6 on Node objects made by hand: a
//! Service of class io.cilium/node lists every node's InternalIP (an ExternalIP
//! where the node has one); the exclusion label and a deleted node drop out;
//! `externalTrafficPolicy: Local` follows the ready endpoints of hand-made
//! EndpointSlices; `io.cilium.nodeipam/match-node-labels` restricts, and a bad
//! one is reported in the Service's condition; a type change releases.

use std::time::Duration;

use crate::k8s::ControlPlane;
use crate::operator::{Operator, install_operator, wait_for};

const LIMIT: Duration = Duration::from_secs(20);

/// A Node object with addresses (`type=address` pairs) and labels.
fn node(cp: &ControlPlane, name: &str, labels: &str, addresses: &[(&str, &str)]) {
    cp.apply(&format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels: {{{labels}}}\n"
    ));
    let list: Vec<String> = addresses
        .iter()
        .map(|(t, a)| format!(r#"{{"type":"{t}","address":"{a}"}}"#))
        .collect();
    cp.kubectl(&[
        "patch",
        "node",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(r#"{{"status":{{"addresses":[{}]}}}}"#, list.join(",")),
    ])
    .expect_ok("node addresses");
}

fn ingress(cp: &ControlPlane, svc: &str) -> String {
    cp.kubectl(&[
        "get",
        "svc",
        svc,
        "-o",
        "jsonpath={.status.loadBalancer.ingress[*].ip}",
    ])
    .expect_ok("get svc")
}

fn wait_ingress(cp: &ControlPlane, svc: &str, want: &str) {
    let mut last = String::new();
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&format!("{svc} ingress {want:?}"), LIMIT, || {
            last = ingress(cp, svc);
            last == want
        })
    }));
    assert!(
        ok.is_ok(),
        "{svc}: wanted ingress {want:?}, last seen {last:?}"
    );
}

fn node_service(name: &str, extra_spec: &str, annotations: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\n  annotations: {{{annotations}}}\n\
         spec:\n  type: LoadBalancer\n  loadBalancerClass: io.cilium/node\n  ports: [{{port: 80}}]\n{extra_spec}"
    )
}

#[test]
fn node_ipam_lab6_cluster_local_exclusion_and_node_removal() {
    const TEST: &str = "nodeipam_lab6";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    node(
        &cp,
        "nip-1",
        "",
        &[("InternalIP", "10.203.0.1"), ("Hostname", "nip-1")],
    );
    node(&cp, "nip-2", "zone: east", &[("InternalIP", "10.203.0.2")]);
    node(
        &cp,
        "nip-3",
        "",
        &[("InternalIP", "10.203.0.3"), ("ExternalIP", "10.204.0.3")],
    );
    let op = Operator::start(
        &cp,
        "nip-a",
        &sa,
        9982,
        &[
            "--cluster-pool-ipv4-cidr",
            "10.90.0.0/16",
            "--enable-node-ipam",
        ],
    );

    cp.apply(&node_service("edge", "", ""));
    wait_ingress(&cp, "edge", "10.203.0.1 10.203.0.2 10.204.0.3");
    // Lab 6: the exclusion label drops the node, removing it brings it back.
    cp.kubectl(&[
        "label",
        "node",
        "nip-1",
        "node.kubernetes.io/exclude-from-external-load-balancers=true",
    ])
    .expect_ok("label");
    wait_ingress(&cp, "edge", "10.203.0.2 10.204.0.3");
    cp.kubectl(&[
        "label",
        "node",
        "nip-1",
        "node.kubernetes.io/exclude-from-external-load-balancers-",
    ])
    .expect_ok("unlabel");
    wait_ingress(&cp, "edge", "10.203.0.1 10.203.0.2 10.204.0.3");
    // A node going away.
    cp.kubectl(&["delete", "node", "nip-2"])
        .expect_ok("delete node");
    wait_ingress(&cp, "edge", "10.203.0.1 10.204.0.3");
    node(&cp, "nip-2", "zone: east", &[("InternalIP", "10.203.0.2")]);
    wait_ingress(&cp, "edge", "10.203.0.1 10.203.0.2 10.204.0.3");

    // Local: the nodes of the ready endpoints.
    cp.apply(&node_service(
        "local",
        "  externalTrafficPolicy: Local\n",
        "",
    ));
    cp.apply(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: local-a\n  namespace: default\n\
         \x20 labels: {kubernetes.io/service-name: local}\naddressType: IPv4\nendpoints:\n\
         - addresses: [10.244.0.5]\n  nodeName: nip-2\n  conditions: {ready: true}\n\
         - addresses: [10.244.0.6]\n  nodeName: nip-3\n  conditions: {ready: false}\n\
         ports: [{port: 80, protocol: TCP}]\n",
    );
    wait_ingress(&cp, "local", "10.203.0.2");
    cp.kubectl(&[
        "patch",
        "endpointslice",
        "local-a",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/endpoints/1/conditions/ready","value":true}]"#,
    ])
    .expect_ok("endpoint ready");
    wait_ingress(&cp, "local", "10.203.0.2 10.204.0.3");

    // match-node-labels; a bad one is reported.
    cp.apply(&node_service(
        "east",
        "",
        "io.cilium.nodeipam/match-node-labels: zone=east",
    ));
    wait_ingress(&cp, "east", "10.203.0.2");
    cp.apply(&node_service(
        "bad",
        "",
        "io.cilium.nodeipam/match-node-labels: zone in (east)",
    ));
    wait_for("the bad annotation's condition", LIMIT, || {
        cp.kubectl(&[
            "get",
            "svc",
            "bad",
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="podnet.io/NodeIPAMRequestValid")].message}"#,
        ])
        .stdout
        .contains("\"zone in (east)\" is not a requirement")
    });
    assert_eq!(ingress(&cp, "bad"), "");

    // A LoadBalancer Service without the class is not Node IPAM's (default lbipam).
    cp.apply(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: other\n  namespace: default\n\
         spec:\n  type: LoadBalancer\n  ports: [{port: 80}]\n",
    );
    // Type change: the addresses go.
    cp.kubectl(&[
        "patch",
        "svc",
        "edge",
        "--type=merge",
        "-p",
        r#"{"spec":{"type":"ClusterIP","loadBalancerClass":null}}"#,
    ])
    .expect_ok("to ClusterIP");
    wait_ingress(&cp, "edge", "");
    assert_eq!(ingress(&cp, "other"), "");
    drop(op);
}
