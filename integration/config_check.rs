//! The agent's configuration checked against its node on a real API server
//! (`daemon::node_check`): dual stack on a Node that lists no IPv6 InternalIP, and
//! IPv6-only pods (`enable-ipv4=false`) on a Node with IPv4 InternalIPs only. Each
//! is named in the agent's log, in its CiliumNode's `podnet.io/ConfigFitsNode`
//! condition and in `podnet status`; ADD fails with CNI code 106 and allocates
//! nothing, STATUS answers 50, the CNI config is not written, and the pods the
//! node has keep CHECK, GC and DEL. The test API server's Service range is IPv4
//! only (10.96.0.0/16): a dual-stack node that lists both addresses fits, with a
//! warning about the Services.

use std::path::PathBuf;

use serde_json::json;

use crate::harness::*;
use crate::k8s::ControlPlane;
use crate::k8s_backend::{
    create_node, eventually, jsonpath, k8s_node, node_ipv6, set_internal_ips,
};

/// A field of the node's `podnet.io/ConfigFitsNode` condition.
fn condition(cp: &ControlPlane, node: &str, field: &str) -> String {
    jsonpath(
        cp,
        "ciliumnode",
        node,
        &format!(r#"{{.status.conditions[?(@.type=="podnet.io/ConfigFitsNode")].{field}}}"#),
    )
}

/// Whether the daemon holds an address for `sb`.
fn holds_any(node: &Node, sb: &Sandbox) -> bool {
    node.allocations()
        .values()
        .any(|owner| owner.contains(&sb.ns.name))
}

/// A node of `cp` whose Node has the pod CIDRs `cidrs` and lists its IPv4
/// address alone, with its daemon (`args`, writing its CNI config into the
/// returned directory) started; and the node's two addresses.
fn start_on_ipv4_node(
    cp: &ControlPlane,
    name: &str,
    cidrs: &[&str],
    args: &[&str],
) -> (Node, PathBuf, [String; 2]) {
    let ns = cp.add_node_ns(name);
    create_node(cp, &ns, cidrs);
    let ips = [ns.ip.to_string(), node_ipv6(&ns)];
    set_internal_ips(cp, name, &[&ips[0]]);
    let mut node = k8s_node(ns, &cp.kubeconfig(), args);
    let net_d = node.dir.join("net.d");
    node.args.extend([
        "--write-cni-conf-when-ready".to_string(),
        net_d.display().to_string(),
    ]);
    node.start_daemon();
    (node, net_d.join("05-podnet.conflist"), ips)
}

#[test]
fn dual_stack_on_a_node_without_ipv6_hands_out_nothing_until_the_node_lists_one() {
    let Some(cp) = ControlPlane::start("config_check_dual") else {
        return;
    };
    cp.install_crds();
    let (node, conf, [v4, v6]) = start_on_ipv4_node(
        &cp,
        "cc-1",
        &["10.244.7.0/24", "fd00:7::/120"],
        &["--ipam", "kubernetes", "--enable-ipv6"],
    );
    let named = "enable-ipv6 is true (dual stack), but node cc-1 has no IPv6 InternalIP";
    // The log, the CiliumNode and podnet status name the option.
    eventually("the error in the agent's log", || {
        node.log().contains(named)
    });
    eventually("the condition", || {
        condition(&cp, "cc-1", "status") == "False"
    });
    assert_eq!(condition(&cp, "cc-1", "reason"), "NodeWithoutIPv6");
    let message = condition(&cp, "cc-1", "message");
    assert!(
        message.starts_with("error (enable-ipv6): ")
            && message.contains(&format!("list only {v4})"))
            && message.contains("kubelet --node-ip=<IPv4>,<IPv6>"),
        "{message}"
    );
    let status = node.podnet(&["status"]);
    assert!(
        status.contains("State:      Failure")
            && status.contains("Config:     DOES NOT FIT this node")
            && status.contains(&format!("  error (enable-ipv6): {named}")),
        "{status}"
    );
    // ADD: CNI code 106, the message naming the option, nothing allocated.
    let sb = node.sandbox();
    let r = node.add(&sb);
    assert_eq!(r.code(), 106, "{}", r.stdout);
    assert!(r.msg().contains(named), "{}", r.msg());
    assert!(!holds_any(&node, &sb) && node.host_links().is_empty());
    let st = node.plugin("STATUS", None, &node.conf("1.1.0"), &[]);
    assert_eq!(st.code(), 50, "{}", st.stdout);
    assert!(st.msg().contains(named), "{}", st.msg());
    assert!(!conf.exists(), "the CNI config was written");

    // The Node lists an IPv6 address: both families, and the CNI config.
    set_internal_ips(&cp, "cc-1", &[&v4, &v6]);
    eventually("the condition to turn True", || {
        condition(&cp, "cc-1", "status") == "True"
    });
    // The API server's Service range is IPv4 only: a warning, pods start.
    assert_eq!(condition(&cp, "cc-1", "reason"), "FitsWithWarnings");
    assert!(
        condition(&cp, "cc-1", "message").starts_with(
            "warning (enable-ipv6): enable-ipv6 is true, but the cluster's Service range has no IPv6 CIDR (ServiceCIDRs: 10.96.0.0/16)"
        ),
        "{}",
        condition(&cp, "cc-1", "message")
    );
    let r = node.add(&sb);
    assert!(r.ok, "{}", r.stdout);
    assert!(r.ipv4().starts_with("10.244.7.") && r.ipv6().starts_with("fd00:7::"));
    eventually("the CNI config", || conf.exists());
    let status = node.podnet(&["status"]);
    assert!(
        status.contains("State:      Warning")
            && status.contains("Config:     fits this node, with warnings")
            && status.contains("Service range 10.96.0.0/16")
            && status.contains("  warning (enable-ipv6): "),
        "{status}"
    );

    // It loses it again: no new pod; the pod it has keeps CHECK, GC and DEL.
    set_internal_ips(&cp, "cc-1", &[&v4]);
    eventually("the condition to turn False", || {
        condition(&cp, "cc-1", "status") == "False"
    });
    let other = node.sandbox();
    assert_eq!(node.add(&other).code(), 106);
    assert!(!holds_any(&node, &other));
    let c = node.check(&sb, &r);
    assert!(c.ok, "{}", c.stdout);
    let mut gc: serde_json::Value = serde_json::from_str(&node.conf("1.1.0")).expect("conf");
    gc["cni.dev/valid-attachments"] = json!([{"containerID": sb.container_id, "ifname": "eth0"}]);
    let g = node.plugin("GC", None, &gc.to_string(), &[]);
    assert!(g.ok && holds_any(&node, &sb), "{g:?}");
    let d = node.del(&sb);
    assert!(d.ok, "{}", d.stdout);
    assert!(!holds_any(&node, &sb) && node.host_links().is_empty());
    // The config stays: the node's running pods are not the runtime's to drop.
    assert!(conf.exists());
}

#[test]
fn ipv6_only_pods_on_an_ipv4_only_node_are_refused_naming_enable_ipv4() {
    let Some(cp) = ControlPlane::start("config_check_v6_only") else {
        return;
    };
    cp.install_crds();
    let (node, conf, [v4, _]) = start_on_ipv4_node(
        &cp,
        "cc-2",
        &["fd00:8::/120"],
        &[
            "--ipam",
            "kubernetes",
            "--enable-ipv4=false",
            "--enable-ipv6",
            "--routing-mode",
            "native",
        ],
    );
    let named = format!(
        "enable-ipv4 is false, so pods get IPv6 addresses only, but node cc-2 has only IPv4 InternalIPs ({v4})"
    );
    eventually("the error in the agent's log", || {
        node.log().contains(&named)
    });
    eventually("the condition", || {
        condition(&cp, "cc-2", "status") == "False"
    });
    assert_eq!(condition(&cp, "cc-2", "reason"), "IPv6PodsOnIPv4Node");
    // The Service range (IPv4) has no family in common with the pods either.
    let message = condition(&cp, "cc-2", "message");
    assert!(
        message.starts_with(&format!("error (enable-ipv4): {named}"))
            && message.contains("Set enable-ipv4: \"true\" and enable-ipv6: \"false\"")
            && message.contains("; error (enable-ipv4): pods get IPv6 addresses only (enable-ipv4: false), but the cluster's Service range is IPv4 only (ServiceCIDRs: 10.96.0.0/16)"),
        "{message}"
    );
    let status = node.podnet(&["status"]);
    assert!(
        status.contains("Config:     DOES NOT FIT this node")
            && status.contains(&format!("  error (enable-ipv4): {named}")),
        "{status}"
    );
    let sb = node.sandbox();
    let r = node.add(&sb);
    assert_eq!(r.code(), 106, "{}", r.stdout);
    assert!(r.msg().contains(&named), "{}", r.msg());
    assert!(!holds_any(&node, &sb) && node.host_links().is_empty());
    assert!(!conf.exists());
}
