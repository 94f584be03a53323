//! podnet installed, upgraded and removed with the real `helm` (v4, built by
//! scripts/k8s-binaries) instead of `kubectl apply -f deploy/`: the chart in
//! charts/podnet on the cluster, a routing mode changed by `helm upgrade` under
//! cross-node pings, and `helm uninstall` taking podnet off every node.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

use super::*;
use crate::helm_chart::helm_or_skip;

/// `helm ARGS` in the control plane's namespace as the cluster's admin.
fn helm(cluster: &Cluster, bin: &Path, args: &[&str]) -> Output {
    let kubeconfig = cluster.dir().join("pki/admin.kubeconfig");
    let mut all = vec![
        "exec",
        "cp",
        bin.to_str().expect("the helm path is UTF-8"),
        "--kubeconfig",
        kubeconfig.to_str().expect("the cluster's path is UTF-8"),
    ];
    all.extend_from_slice(args);
    cluster.script_ok(&all)
}

/// What podnet leaves on `node` that `helm uninstall` must take away: its CNI
/// config and its masquerade and source check tables (the policy table stays
/// by design: docs/helm.md).
fn podnet_on_node(cluster: &Cluster, node: &str) -> Vec<String> {
    let mut left = Vec::new();
    let conf = cluster.script(&["exec", node, "ls", "/etc/cni/net.d"]);
    let listing = String::from_utf8_lossy(&conf.stdout).to_string();
    left.extend(
        listing
            .lines()
            .filter(|f| f.contains("podnet"))
            .map(|f| format!("/etc/cni/net.d/{f}")),
    );
    let tables = cluster.script(&["exec", node, "nft", "list", "tables"]);
    let tables = String::from_utf8_lossy(&tables.stdout).to_string();
    for wanted in ["ip podnet", "ip6 podnet", "inet podnet_source"] {
        if tables
            .lines()
            .any(|l| l.trim() == format!("table {wanted}"))
        {
            left.push(format!("nft table {wanted}"));
        }
    }
    left
}

/// `helm upgrade --reuse-values --set rollOutCiliumPods=true` with `sets`, then
/// the agents' rollout awaited: each node's agent replaced. The new agents.
fn upgrade(cluster: &Cluster, bin: &Path, chart: &str, sets: &[&str]) -> BTreeMap<String, String> {
    let before = cluster.agents();
    let mut args = vec![
        "upgrade",
        "podnet",
        chart,
        "--namespace",
        "kube-system",
        "--reuse-values",
        "--set",
        "rollOutCiliumPods=true",
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    helm(cluster, bin, &args);
    cluster.kubectl(&[
        "rollout",
        "status",
        "-n",
        "kube-system",
        "ds/podnet",
        "--timeout=300s",
    ]);
    let after = cluster.agents();
    for (node, agent) in &before {
        assert_ne!(
            after.get(node),
            Some(agent),
            "{node}'s agent was not replaced by the upgrade with {sets:?}"
        );
    }
    after
}

/// `helm install` of charts/podnet with its defaults (as `deploy/` is: tunnel
/// mode), pods on every node. Each pod pings a pod on another node through two
/// upgrades (`--reuse-values --set rollOutCiliumPods=true`): turning the
/// bandwidth manager on (the agents roll one node at a time, every node's
/// conflist gains the `bandwidth` capability, no ping lost beyond one per agent
/// restarted; then annotated pods are shaped on every runtime:
/// cluster::bandwidth), then switching to native routing (`routingMode=native`,
/// `autoDirectNodeRoutes=true`, `ipv4NativeRoutingCIDR`): while nodes of both
/// modes coexist a native node still tunnels to the tunnel nodes, so again no
/// ping is lost beyond one per agent restarted, and every node ends without
/// its tunnel device (removed at the resync after the last node switched).
/// Through both, no pod changes address or restarts. Then `helm
/// uninstall`: every node's CNI config and masquerade and source check tables
/// gone, the CRDs kept.
#[test]
fn helm_installs_upgrades_to_native_routing_and_uninstalls() {
    let test = "helm_installs_upgrades_to_native_routing_and_uninstalls";
    let Some(bin) = helm_or_skip(test) else {
        return;
    };
    let Some(cluster) = Cluster::start(test) else {
        return;
    };
    let chart = repo().join("charts/podnet");
    let chart = chart.to_str().expect("the repo path is UTF-8");
    helm(
        &cluster,
        &bin,
        &["install", "podnet", chart, "--namespace", "kube-system"],
    );
    cluster.wait_nodes_ready();
    let before = spread_ready(&cluster);
    let has_link = |node: &str, link: &str| {
        let links = cluster.script_ok(&["exec", node, "ip", "-o", "link", "show"]);
        String::from_utf8_lossy(&links.stdout).contains(link)
    };
    for node in node_names() {
        assert!(
            has_link(&node, "podnet_vxlan"),
            "{node}: no tunnel device in tunnel mode"
        );
    }

    let pingers = start_pingers(&cluster, &before);
    upgrade(&cluster, &bin, chart, &["bandwidthManager.enabled=true"]);
    for node in node_names() {
        let conf = cluster.script_ok(&["exec", &node, "cat", "/etc/cni/net.d/05-podnet.conflist"]);
        assert!(
            String::from_utf8_lossy(&conf.stdout).contains("\"bandwidth\": true"),
            "{node}: the conflist lacks the bandwidth capability after the upgrade"
        );
    }
    assert_undisturbed(&cluster, &pingers, &before, "upgrade", NODES as u64);
    super::bandwidth::annotated_pods_are_shaped_on_every_runtime(&cluster);

    let pingers = start_pingers(&cluster, &before);
    let agents = upgrade(
        &cluster,
        &bin,
        chart,
        &[
            "routingMode=native",
            "autoDirectNodeRoutes=true",
            "ipv4NativeRoutingCIDR=10.244.0.0/16",
        ],
    );
    for node in node_names() {
        cluster.wait_for(
            &format!("{node} in native routing (its tunnel device gone)"),
            || (!has_link(&node, "podnet_vxlan")).then_some(()),
            || cluster.podnet_status(&agents[&node], &[]),
        );
    }
    assert_undisturbed(
        &cluster,
        &pingers,
        &before,
        "switch to native routing",
        NODES as u64,
    );
    assert_each_reaches_a_peer(&cluster, &before, "in native routing");
    cluster.kubectl(&["delete", "deployment", "spread", "--wait=true"]);

    helm(
        &cluster,
        &bin,
        &[
            "uninstall",
            "podnet",
            "--namespace",
            "kube-system",
            "--wait",
        ],
    );
    cluster.wait_for(
        "every podnet pod gone",
        || {
            let left = cluster
                .pods("kube-system", "app.kubernetes.io/name=podnet")
                .len()
                + cluster
                    .pods("kube-system", "app.kubernetes.io/name=podnet-operator")
                    .len();
            (left == 0).then_some(())
        },
        || cluster.describe("kube-system"),
    );
    for node in node_names() {
        let left = podnet_on_node(&cluster, &node);
        assert!(left.is_empty(), "{node} after helm uninstall: {left:?}");
    }
    let crds = cluster.kubectl(&["get", "crd", "-o", "name"]);
    assert!(
        crds.contains("ciliumnodes.cilium.io"),
        "helm uninstall removed the CRDs (they are kept): {crds}"
    );
}
