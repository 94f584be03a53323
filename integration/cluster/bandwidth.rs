//! Pod bandwidth limits on the cluster: the `kubernetes.io/ingress-bandwidth` and
//! `kubernetes.io/egress-bandwidth` annotations reach podnet through each real
//! runtime (containerd 2, CRI-O, containerd 1.6: the conflist's `bandwidth`
//! capability) and become TBF qdiscs on the host side (docs/bandwidth.md). Run
//! by cluster::helm once its upgrade has turned the bandwidth manager on (one
//! cluster for both).

use serde_json::Value;

use super::*;

/// 10 Mbit/s to each pod and 20 Mbit/s from it, in the TBFs' bytes/s.
const INGRESS_BYTES: u64 = 1_250_000;
const EGRESS_BYTES: u64 = 2_500_000;

/// `replicas` busybox pods spread over the nodes, each limited by annotations.
fn limited_deployment(replicas: usize) -> String {
    let plain: Value = serde_json::from_str(&spread_deployment("limited", replicas))
        .expect("the spread deployment is JSON");
    let mut d = plain;
    d["spec"]["template"]["metadata"]["annotations"] = serde_json::json!({
        "kubernetes.io/ingress-bandwidth": "10M",
        "kubernetes.io/egress-bandwidth": "20M",
    });
    d.to_string()
}

/// The root TBFs on `node`: (device, rate in bytes/s).
fn tbfs(cluster: &Cluster, node: &str) -> Vec<(String, u64)> {
    let out = cluster.script_ok(&["exec", node, "tc", "-j", "qdisc", "show"]);
    let qdiscs: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    qdiscs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|q| q["kind"] == "tbf" && q["root"] == true)
        .filter_map(|q| {
            Some((
                q["dev"].as_str()?.to_string(),
                q["options"]["rate"].as_u64()?,
            ))
        })
        .collect()
}

/// The IFB devices on `node`.
fn ifbs(cluster: &Cluster, node: &str) -> Vec<String> {
    let out = cluster.script_ok(&["exec", node, "ip", "-o", "link", "show", "type", "ifb"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| Some(l.split(": ").nth(1)?.split('@').next()?.to_string()))
        .collect()
}

/// On a cluster whose agents run with `enable-bandwidth-manager: "true"`
/// (cluster::helm turns it on with `helm upgrade`): a pod on each node (each
/// runtime) with both annotations gets, from its ADD (the agent's loop changes
/// nothing), the TBF of 10 Mbit/s on its host link and the TBF of 20 Mbit/s on
/// its IFB device, and still reaches the pods on the other nodes. The
/// annotation changed on a running pod changes its TBF; a bad value gets a
/// `BandwidthInvalid` Event on the Pod naming it and keeps the shaping;
/// deleting the pods leaves no TBF and no IFB device on any node.
pub(super) fn annotated_pods_are_shaped_on_every_runtime(cluster: &Cluster) {
    cluster.apply(&limited_deployment(NODES));
    let placed = cluster.wait_for(
        "every limited pod Ready",
        || {
            let pods = cluster.pods("default", "app=limited");
            let all = pods.len() == NODES && pods.iter().all(ready);
            all.then(|| placed(cluster, "limited"))
        },
        || cluster.describe("default"),
    );
    for node in node_names() {
        let found = tbfs(cluster, &node);
        let host: Vec<_> = found
            .iter()
            .filter(|(dev, rate)| dev.starts_with("lxc") && *rate == INGRESS_BYTES)
            .collect();
        let ifb: Vec<_> = found
            .iter()
            .filter(|(dev, rate)| dev.starts_with("ifb") && *rate == EGRESS_BYTES)
            .collect();
        assert!(
            host.len() == 1 && ifb.len() == 1,
            "{node}: want one TBF of {INGRESS_BYTES} B/s on a host link and one of \
             {EGRESS_BYTES} B/s on an IFB device, found {found:?}"
        );
    }
    assert_each_reaches_a_peer(cluster, &placed, "with its limit");

    // ADD shaped every pod, through each runtime: the loop found nothing to do.
    for (node, agent) in cluster.agents() {
        let log = cluster.kubectl(&["logs", "-n", "kube-system", &agent, "-c", "agent"]);
        assert!(
            !log.contains("shaping changed to match the annotations"),
            "{node}: the agent's loop shaped a pod its ADD should have:\n{log}"
        );
    }

    // A running pod's annotation changed: its TBF follows (the agent's loop).
    let (changed, changed_node, _) = &placed[0];
    cluster.kubectl(&[
        "annotate",
        "pod",
        changed,
        "kubernetes.io/ingress-bandwidth=5M",
        "--overwrite",
    ]);
    cluster.wait_for(
        &format!("{changed}'s host link at 5 Mbit/s"),
        || {
            tbfs(cluster, changed_node)
                .iter()
                .any(|(dev, rate)| dev.starts_with("lxc") && *rate == INGRESS_BYTES / 2)
                .then_some(())
        },
        || format!("{:?}", tbfs(cluster, changed_node)),
    );
    // A bad value: an Event on the Pod naming it, the shaping kept.
    let (bad, bad_node, _) = &placed[1];
    cluster.kubectl(&[
        "annotate",
        "pod",
        bad,
        "kubernetes.io/egress-bandwidth=0",
        "--overwrite",
    ]);
    wait_for_event(
        cluster,
        "BandwidthInvalid",
        bad,
        "kubernetes.io/egress-bandwidth",
    );
    let kept = tbfs(cluster, bad_node);
    assert!(
        kept.iter()
            .any(|(dev, rate)| dev.starts_with("ifb") && *rate == EGRESS_BYTES),
        "{bad}'s IFB TBF after a bad value: {kept:?}"
    );

    cluster.kubectl(&["delete", "deployment", "limited", "--wait=true"]);
    for node in node_names() {
        cluster.wait_for(
            &format!("{node} without the pods' TBFs and IFB devices"),
            || (tbfs(cluster, &node).is_empty() && ifbs(cluster, &node).is_empty()).then_some(()),
            || format!("{:?} {:?}", tbfs(cluster, &node), ifbs(cluster, &node)),
        );
    }
}
