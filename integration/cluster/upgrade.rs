//! Upgrades on the cluster: podnet's DaemonSet and operator rolled to another
//! image while pods on every node ping pods on the other nodes.

use std::collections::BTreeMap;
use std::time::Instant;

use super::*;

/// The image `deploy/` names.
const IMAGE: &str = "ghcr.io/podnet/podnet:0.1.0";
/// The rolling update's image: the same build under a second tag, on every node.
const NEXT_IMAGE: &str = "ghcr.io/podnet/podnet:0.1.0-next";

/// The containers' images of the pods `selector` picks in kube-system, by pod.
fn images(cluster: &Cluster, selector: &str) -> BTreeMap<String, Vec<String>> {
    cluster
        .pods("kube-system", selector)
        .iter()
        .filter_map(|p| {
            let spec = &p["spec"];
            let images = ["initContainers", "containers"]
                .iter()
                .flat_map(|k| spec[*k].as_array().cloned().unwrap_or_default())
                .filter_map(|c| c["image"].as_str().map(str::to_string))
                .collect();
            Some((p["metadata"]["name"].as_str()?.to_string(), images))
        })
        .collect()
}

/// `kubectl set image` of every container (the init container too) of podnet's
/// DaemonSet and operator Deployment to [`NEXT_IMAGE`] while each spread pod pings
/// a pod on another node every 0.2 s: the rollouts complete one node at a time,
/// the operator's Lease passes to a replica of the new image, no pod changes
/// address or restarts, no node's CIDR changes, each pinger loses at most one ping
/// per agent restarted, and each node's new agent holds exactly its pods'
/// addresses. Run by cluster::deploy_runs_pods_rolls_podnet_and_serves_each_runtime
/// on its cluster, after the pods of its first part are gone.
pub(super) fn a_rolling_update_of_podnet_changes_no_address_and_loses_no_ping(cluster: &Cluster) {
    let before = spread_ready(cluster);
    let cidrs_before: BTreeMap<String, Vec<Ipv4Net>> = node_names()
        .into_iter()
        .map(|n| (n.clone(), node_cidrs(cluster, &n)))
        .collect();

    let pingers = start_pingers(cluster, &before);

    // Every node's runtime (containerd: ctr images tag; CRI-O: skopeo copy).
    cluster.script_ok(&["tag", IMAGE, NEXT_IMAGE]);
    let old_leader = cluster.wait_for(
        "a leader holding the operator's Lease",
        || lease_holder(cluster),
        || cluster.describe("kube-system"),
    );

    let t0 = Instant::now();
    let all_containers = format!("*={NEXT_IMAGE}");
    for (kind, name) in [("ds", "podnet"), ("deployment", "podnet-operator")] {
        let what = format!("{kind}/{name}");
        cluster.kubectl(&["set", "image", "-n", "kube-system", &what, &all_containers]);
    }
    for what in ["ds/podnet", "deployment/podnet-operator"] {
        cluster.kubectl(&[
            "rollout",
            "status",
            "-n",
            "kube-system",
            what,
            "--timeout=300s",
        ]);
    }
    eprintln!(
        "podnet and its operator rolled to {NEXT_IMAGE} in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    for selector in [
        "app.kubernetes.io/name=podnet",
        "app.kubernetes.io/name=podnet-operator",
    ] {
        for (pod, images) in images(cluster, selector) {
            assert!(
                images.iter().all(|i| i == NEXT_IMAGE),
                "{pod} still runs {images:?} after the rollout"
            );
        }
    }
    let new_operators = images(cluster, "app.kubernetes.io/name=podnet-operator");
    let new_leader = cluster.wait_for(
        "a replica of the new image holding the Lease",
        || lease_holder(cluster).filter(|h| new_operators.contains_key(h)),
        || cluster.describe("kube-system"),
    );
    eprintln!("the Lease passed from {old_leader} to {new_leader}");

    // At most one ping lost per agent restarted.
    assert_undisturbed(cluster, &pingers, &before, "update", NODES as u64);
    let after = placed(cluster, "spread");
    for (node, cidrs) in &cidrs_before {
        assert_eq!(
            &node_cidrs(cluster, node),
            cidrs,
            "{node}'s pod CIDRs after the update"
        );
    }
    let agents = cluster.assert_agents_hold(&after);
    cluster.kubectl(&["delete", "deployment", "spread", "--wait=true"]);
    cluster.assert_freed("app=spread", &agents);
}
