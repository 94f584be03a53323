//! The agent's bandwidth loop against a real kube-apiserver with the real
//! daemon (running with the agent's own service account token, so
//! deploy/agent-rbac.yaml is what it may do): ADD shapes a pod from its
//! `runtimeConfig.bandwidth` as containerd passes it; changing the Pod's
//! annotations changes its TBFs; a bad value is a `BandwidthInvalid` Event on
//! the Pod and keeps the shaping; removing the annotations removes it (and
//! the IFB). The qdiscs are read with `tc` in the node namespace.

use crate::bandwidth::{conf, have_tc, limits, link_exists, tbf_rate};
use crate::harness::Node;
use crate::k8s::ControlPlane;
use crate::k8s_backend::{create_node, jsonpath, k8s_node};
use podnet::datapath::{host_ifname, ifb_ifname};

const INGRESS: &str = "kubernetes.io/ingress-bandwidth";
const EGRESS: &str = "kubernetes.io/egress-bandwidth";

/// Sets (or, with `None`, removes) the Pod's two annotations.
fn annotate(cp: &ControlPlane, pod: &str, ingress: Option<&str>, egress: Option<&str>) {
    let arg = |key: &str, v: Option<&str>| match v {
        Some(v) => format!("{key}={v}"),
        None => format!("{key}-"),
    };
    cp.kubectl(&[
        "annotate",
        "--overwrite",
        "-n",
        "default",
        "pod",
        pod,
        &arg(INGRESS, ingress),
        &arg(EGRESS, egress),
    ])
    .expect_ok("annotate");
}

/// Waits up to `secs` for `f`; else fails naming `what`, with the node's
/// qdiscs and the end of its daemon's log (what a failure on a busy CI
/// machine needs to be understood).
fn eventually(node: &Node, what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !f() {
        if std::time::Instant::now() >= deadline {
            let qdiscs = node.ns.exec(&["tc", "qdisc", "show"]);
            let log = node.log();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            panic!(
                "timed out after {secs} s waiting for {what}; qdiscs:\n{}\nthe daemon's log, last lines:\n{}",
                String::from_utf8_lossy(&qdiscs.stdout),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn the_agent_follows_a_pods_bandwidth_annotations() {
    let test = "k8s_bandwidth_annotations";
    if !have_tc(test) {
        return;
    }
    let Some(cp) = ControlPlane::start(test) else {
        return;
    };
    cp.install_crds();
    let ns = cp.add_node_ns("kbw-1");
    create_node(&cp, &ns, &["10.244.11.0/24"]);
    let name = ns.name.clone();
    // The token the kubelet would mount in the agent's pod on this node.
    let agent = cp.agent_kubeconfig_on(&name);
    cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: default\n  annotations: {{{INGRESS}: 10M, {EGRESS}: 1M}}\n\
         spec:\n  nodeName: {name}\n  containers: [{{name: c, image: busybox}}]\n"
    ));
    let mut node = k8s_node(
        ns,
        &agent,
        &["--ipam", "kubernetes", "--enable-bandwidth-manager"],
    );
    node.start_daemon();

    // ADD as containerd runs it for the Pod: its annotations as runtimeConfig.
    let sb = node.sandbox();
    let (host, ifb) = (
        host_ifname(&sb.container_id, "eth0"),
        ifb_ifname(&sb.container_id, "eth0"),
    );
    let uid = jsonpath(&cp, "pod", "web", "{.metadata.uid}");
    let args =
        format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_UID={uid}");
    let add = node.plugin(
        "ADD",
        Some(&sb),
        &conf(&node, limits()),
        &[("CNI_ARGS", &args)],
    );
    assert!(add.ok, "{add:?}");
    assert_eq!(tbf_rate(&node, &host), Some(1_250_000));
    assert_eq!(tbf_rate(&node, &ifb), Some(125_000));
    // What kubelet does once the sandbox is up: the Pod's IPs (no kubelet here).
    let ip = add.ipv4();
    cp.set_pod_ip("web", &ip);
    let shaped = |n: u32| {
        let m = node.metrics();
        m.contains(&format!("podnet_bandwidth_pods_shaped {n}"))
    };
    eventually(&node, "the loop to count the pod shaped", 30, || shaped(1));
    let status = node.podnet(&["status"]);
    assert!(
        status.contains("shaped (tbf qdiscs, docs/bandwidth.md); 1 local pod(s) shaped"),
        "{status}"
    );

    // Removed behind the agent's back: the loop's next pass (its 30 s resync
    // at the latest) reads the kernel and puts it back.
    let del = node.ns.exec(&["tc", "qdisc", "del", "dev", &host, "root"]);
    assert!(del.status.success(), "tc qdisc del: {del:?}");
    eventually(&node, "the TBF removed by hand to be back", 75, || {
        tbf_rate(&node, &host) == Some(1_250_000)
    });

    // Changed: both TBFs follow.
    annotate(&cp, "web", Some("20M"), Some("500k"));
    eventually(&node, "the changed TBFs", 30, || {
        tbf_rate(&node, &host) == Some(2_500_000) && tbf_rate(&node, &ifb) == Some(62_500)
    });

    // A bad egress value: an Event naming it, the egress shaping kept, the
    // ingress one still following.
    annotate(&cp, "web", Some("30M"), Some("0"));
    eventually(&node, "the BandwidthInvalid Event", 30, || {
        cp.pod_events("web").lines().any(|l| {
            l.starts_with("BandwidthInvalid|")
                && l.contains(&format!("{EGRESS}: \"0\""))
                && l.contains("from 1k")
        })
    });
    eventually(&node, "the ingress TBF at 30M", 30, || {
        tbf_rate(&node, &host) == Some(3_750_000)
    });
    assert_eq!(tbf_rate(&node, &ifb), Some(62_500));
    let m = node.metrics();
    assert!(
        m.contains("podnet_bandwidth_invalid_annotations_total 1"),
        "{m}"
    );

    // Removed: nothing shaped, the IFB gone.
    annotate(&cp, "web", None, None);
    eventually(&node, "the shaping removed", 30, || {
        tbf_rate(&node, &host).is_none() && !link_exists(&node, &ifb)
    });
    eventually(&node, "the loop to count no pod shaped", 30, || shaped(0));
    let status = node.podnet(&["status"]);
    assert!(status.contains("; 0 local pod(s) shaped"), "{status}");
    let events = cp.pod_events("web");
    assert_eq!(
        events
            .lines()
            .filter(|l| l.starts_with("BandwidthInvalid|"))
            .count(),
        1,
        "one Event for the one bad value:\n{events}"
    );
    let del = node.plugin(
        "DEL",
        Some(&sb),
        &conf(&node, limits()),
        &[("CNI_ARGS", &args)],
    );
    assert!(del.ok, "{del:?}");
}
