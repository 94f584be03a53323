//! The agent's configuration checked against its node on a real API server
//! (`daemon::node_check`): dual stack on a Node that lists no IPv6 InternalIP,
//! IPv6-only pods (`enable-ipv4=false`) on a Node with IPv4 InternalIPs only, an
//! IPv4 tunnel underlay (`underlay-protocol`) with IPv4 disabled, and an IPv6
//! underlay on a Node without an IPv6 InternalIP. Each is named in the agent's
//! log, in its CiliumNode's `podnet.io/ConfigFitsNode` condition and in `podnet
//! status`; ADD fails with CNI code 106 and allocates nothing, STATUS answers 50,
//! the CNI config is not written, and the pods the node has keep CHECK, GC and
//! DEL. The operator's cluster-pool options that it refuses (a
//! `cluster-pool-ipv6-mask-size` that does not fit `cluster-pool-ipv6-cidr`, an
//! entry that does not parse) are warnings: the node serves. The
//! test API server's Service range is IPv4 only (10.96.0.0/16): a dual-stack node
//! that lists both addresses fits, with a warning about the Services.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::harness::*;
use crate::k8s::ControlPlane;
use crate::k8s_backend::{
    add_service_cidr, create_node, eventually, jsonpath, k8s_node, node_ipv6, operator_assigns,
    set_internal_ips,
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

/// Asserts that the daemon of `node` (Node `name` of `cp`) does not fit, with the
/// error `named` under `option`: in its log, in its CiliumNode's condition
/// (`False`, the message listing it), in `podnet status` (`Failure`), as ADD's CNI
/// code 106 with nothing allocated and as STATUS's code 50; the CNI config `conf`
/// is not written. The condition's message, and the sandbox ADD was refused for.
fn assert_refused(
    cp: &ControlPlane,
    node: &Node,
    name: &str,
    conf: &Path,
    option: &str,
    named: &str,
) -> (String, Sandbox) {
    eventually("the error in the agent's log", || {
        node.log().contains(named)
    });
    eventually("the condition", || condition(cp, name, "status") == "False");
    let message = condition(cp, name, "message");
    assert!(
        message.contains(&format!("error ({option}): {named}")),
        "{message}"
    );
    let status = node.podnet(&["status"]);
    assert!(
        status.contains("State:      Failure")
            && status.contains("Config:     DOES NOT FIT this node")
            && status.contains(&format!("  error ({option}): {named}")),
        "{status}"
    );
    let sb = node.sandbox();
    let r = node.add(&sb);
    assert_eq!(r.code(), 106, "{}", r.stdout);
    assert!(r.msg().contains(named), "{}", r.msg());
    assert!(!holds_any(node, &sb) && node.host_links().is_empty());
    let st = node.plugin("STATUS", None, &node.conf("1.1.0"), &[]);
    assert_eq!(st.code(), 50, "{}", st.stdout);
    assert!(st.msg().contains(named), "{}", st.msg());
    assert!(!conf.exists(), "the CNI config was written");
    (message, sb)
}

/// After a fix, waits until the daemon of `node` (Node `name` of `cp`) fits, with
/// a warning about the Services (the test API server's range is IPv4 only, the
/// tests' pods IPv6 or dual stack), then asserts that ADD of `sb` succeeds and
/// the CNI config `conf` is written; the ADD's result.
fn fits_with_warnings(
    cp: &ControlPlane,
    node: &Node,
    name: &str,
    conf: &Path,
    sb: &Sandbox,
) -> PluginOutput {
    eventually("the condition to turn True", || {
        condition(cp, name, "status") == "True"
    });
    assert_eq!(condition(cp, name, "reason"), "FitsWithWarnings");
    let r = node.add(sb);
    assert!(r.ok, "{}", r.stdout);
    eventually("the CNI config", || conf.exists());
    r
}

/// A node of `cp` whose Node has the pod CIDRs `cidrs` and lists its IPv4
/// address alone, with its daemon (`args`, writing its CNI config into the
/// returned path) started; and the node's two addresses.
fn start_on_ipv4_node(
    cp: &ControlPlane,
    name: &str,
    cidrs: &[&str],
    args: &[&str],
) -> (Node, PathBuf, [String; 2]) {
    let (mut node, conf, ips) = prepare_listing(cp, name, cidrs, args, |ips| vec![ips[0].clone()]);
    node.start_daemon();
    (node, conf, ips)
}

/// A node of `cp` whose Node has the pod CIDRs `cidrs` and lists the InternalIPs
/// `listed` picks of its two addresses (IPv4, IPv6; the IPv6 one is on the
/// node's device too), with its daemon (`args`, writing its CNI config into the
/// returned path) not started yet; and the node's two addresses.
fn prepare_listing(
    cp: &ControlPlane,
    name: &str,
    cidrs: &[&str],
    args: &[&str],
    listed: impl Fn(&[String; 2]) -> Vec<String>,
) -> (Node, PathBuf, [String; 2]) {
    let ns = cp.add_node_ns(name);
    create_node(cp, &ns, cidrs);
    let ips = [ns.ip.to_string(), node_ipv6(&ns)];
    let v6 = format!("{}/64", ips[1]);
    let out = ns
        .ns
        .exec(&["ip", "addr", "add", &v6, "dev", "eth0", "nodad"]);
    assert!(out.status.success(), "the node's IPv6 address: {out:?}");
    let listed = listed(&ips);
    set_internal_ips(
        cp,
        name,
        &listed.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let mut node = k8s_node(ns, &cp.kubeconfig(), args);
    let net_d = node.dir.join("net.d");
    node.args.extend([
        "--write-cni-conf-when-ready".to_string(),
        net_d.display().to_string(),
    ]);
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
    // The log, the CiliumNode and podnet status name the option; ADD gets 106.
    let (message, sb) = assert_refused(&cp, &node, "cc-1", &conf, "enable-ipv6", named);
    assert_eq!(condition(&cp, "cc-1", "reason"), "NodeWithoutIPv6");
    assert!(
        message.starts_with("error (enable-ipv6): ")
            && message.contains(&format!("list only {v4})"))
            && message.contains("kubelet --node-ip=<IPv4>,<IPv6>"),
        "{message}"
    );

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
    let (message, _) = assert_refused(&cp, &node, "cc-2", &conf, "enable-ipv4", &named);
    assert_eq!(condition(&cp, "cc-2", "reason"), "IPv6PodsOnIPv4Node");
    // The Service range (IPv4) has no family in common with the pods either.
    assert!(
        message.starts_with(&format!("error (enable-ipv4): {named}"))
            && message.contains("Set enable-ipv4: \"true\" and enable-ipv6: \"false\"")
            && message.contains("; error (enable-ipv4): pods get IPv6 addresses only (enable-ipv4: false), but the cluster's Service range is IPv4 only (ServiceCIDRs: 10.96.0.0/16)"),
        "{message}"
    );
}

#[test]
fn an_ipv4_underlay_with_ipv4_disabled_is_refused_naming_underlay_protocol() {
    let Some(cp) = ControlPlane::start("config_check_underlay_off") else {
        return;
    };
    cp.install_crds();
    // IPv6 Services beside the API server's IPv4 range, so the IPv6-only pods
    // have a Service family: the underlay is the one error.
    add_service_cidr(&cp, "ipv6", "fd00:96::/112");
    // Tunnel routing (the Kubernetes backend's default) over the default IPv4
    // underlay, on a node that lists both addresses.
    let (mut node, conf, _) = prepare_listing(
        &cp,
        "cc-3",
        &["fd00:9::/120"],
        &[
            "--ipam",
            "kubernetes",
            "--enable-ipv4=false",
            "--enable-ipv6",
        ],
        |ips| ips.to_vec(),
    );
    node.start_daemon();
    let named = "underlay-protocol is ipv4 (the family of the tunnel's outer packets, ipv4 \
                 unless set), but enable-ipv4 is false: an IPv6-only pod network tunnels over \
                 IPv6, and Cilium refuses an underlay of a disabled family. Set \
                 underlay-protocol: ipv6 in the podnet ConfigMap";
    // ADD: CNI code 106 naming underlay-protocol, nothing allocated; STATUS 50.
    let (message, sb) = assert_refused(&cp, &node, "cc-3", &conf, "underlay-protocol", named);
    assert_eq!(
        condition(&cp, "cc-3", "reason"),
        "IPv4UnderlayWithIPv4Disabled"
    );
    // The one error; the IPv4 Services without IPv4 pods are a warning.
    assert!(
        message.starts_with(&format!("error (underlay-protocol): {named}"))
            && message.contains("; warning (enable-ipv4): "),
        "{message}"
    );

    // The fix the message names: an IPv6 underlay. The node fits, pods start.
    node.stop_daemon(false);
    node.args
        .extend(["--underlay-protocol".to_string(), "ipv6".to_string()]);
    node.start_daemon();
    let r = fits_with_warnings(&cp, &node, "cc-3", &conf, &sb);
    assert!(r.ipv6().starts_with("fd00:9::"), "{}", r.stdout);
}

#[test]
fn an_ipv6_underlay_on_a_node_without_ipv6_is_refused_naming_underlay_protocol() {
    let Some(cp) = ControlPlane::start("config_check_underlay_ip") else {
        return;
    };
    cp.install_crds();
    let (node, conf, [v4, v6]) = start_on_ipv4_node(
        &cp,
        "cc-4",
        &["10.244.9.0/24", "fd00:a::/120"],
        &[
            "--ipam",
            "kubernetes",
            "--enable-ipv6",
            "--underlay-protocol",
            "ipv6",
        ],
    );
    let named = format!(
        "underlay-protocol is ipv6, but node cc-4 has only IPv4 InternalIPs ({v4}): a node's \
         tunnel endpoint is its InternalIP of the underlay family"
    );
    let (message, sb) = assert_refused(&cp, &node, "cc-4", &conf, "underlay-protocol", &named);
    // The missing IPv6 address is an error of its own, and the first.
    assert_eq!(condition(&cp, "cc-4", "reason"), "NodeWithoutIPv6");
    assert!(
        message.starts_with("error (enable-ipv6): ")
            && message.contains("Set underlay-protocol: ipv4 in the podnet ConfigMap"),
        "{message}"
    );

    // The Node lists its IPv6 address: a tunnel endpoint, and both families.
    set_internal_ips(&cp, "cc-4", &[&v4, &v6]);
    eventually("the condition to turn True", || {
        condition(&cp, "cc-4", "status") == "True"
    });
    let r = node.add(&sb);
    assert!(r.ok, "{}", r.stdout);
    assert!(r.ipv4().starts_with("10.244.9.") && r.ipv6().starts_with("fd00:a::"));
    eventually("the CNI config", || conf.exists());
}

#[test]
fn operator_pool_options_that_it_refuses_are_warnings_and_the_node_serves() {
    let Some(cp) = ControlPlane::start("config_check_mask_size") else {
        return;
    };
    cp.install_crds();
    // Dual-stack cluster-pool, the IPv6 mask one bit past what fd00:c::/104 takes
    // and an IPv4 entry that does not parse (issue 53: ConfigMap edits the
    // operator refuses while it runs on the pool in force). The node lists both
    // addresses; the agent starts and serves from the CIDRs the operator gives.
    let (mut node, conf, _) = prepare_listing(
        &cp,
        "cc-5",
        &[],
        &[
            "--ipam",
            "cluster-pool",
            "--enable-ipv6",
            "--cluster-pool-ipv4-cidr",
            "10.246.0.0/16 10.250.0.0/16@x",
            "--cluster-pool-ipv6-cidr",
            "fd00:c::/104",
            "--cluster-pool-ipv6-mask-size",
            "121",
        ],
        |ips| ips.to_vec(),
    );
    node.spawn_daemon();
    eventually("the daemon to wait for the operator", || {
        node.log()
            .contains("waiting for the operator to write this node's CIDRs")
    });
    operator_assigns(&cp, "cc-5", &["10.246.5.0/24", "fd00:c::500/120"]);
    node.wait_ready();
    let mask = "unable to initialize IPv6 allocator: cluster-pool-ipv6-cidr fd00:c::/104 with \
                cluster-pool-ipv6-mask-size 121: New CIDR set failed; the node CIDR size is \
                too big; cluster-pool-ipv6-mask-size must be /104 to /120 for fd00:c::/104";
    let entry = "invalid cluster-pool-ipv4-cidr entry \"10.250.0.0/16@x\": the node mask size \
                 after @ must be a number";
    let sb = node.sandbox();
    let r = fits_with_warnings(&cp, &node, "cc-5", &conf, &sb);
    assert!(
        r.ipv4().starts_with("10.246.5.") && r.ipv6().starts_with("fd00:c::5"),
        "{}",
        r.stdout
    );
    let message = condition(&cp, "cc-5", "message");
    assert!(
        message.contains(&format!("warning (cluster-pool-ipv6-mask-size): {mask}"))
            && message.contains("set cluster-pool-ipv6-mask-size to a size from /104 to /120")
            && message.contains(&format!("warning (cluster-pool-ipv4-cidr): {entry}"))
            && message.contains("; warning (enable-ipv6): "),
        "{message}"
    );
    let status = node.podnet(&["status"]);
    assert!(
        status.contains(&format!("  warning (cluster-pool-ipv6-mask-size): {mask}"))
            && status.contains(&format!("  warning (cluster-pool-ipv4-cidr): {entry}")),
        "{status}"
    );
    assert!(node.log().contains(entry));
}
