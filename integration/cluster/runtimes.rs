//! What the nodes' runtimes ask of podnet beyond ADD and DEL (docs/runtimes.md),
//! on the default cluster: containerd 2 on node-1, CRI-O on node-2, containerd 1.6
//! on node-3. With its node's ranges full, the agent taints its Node
//! `podnet.io/addresses-exhausted:NoSchedule` with the reason beside it, while
//! containerd 2, which sends STATUS on every CRI Status poll, keeps the node
//! Ready (a NotReady node's pods are evicted); the scheduler holds a pod for the
//! node back, and sends it once an address is free. CRI-O sends GC once at its
//! start: an attachment it does not know is released, its running pods keep
//! theirs.
//! Restarting either runtime under running pods leaks and duplicates nothing.

use std::time::Duration;

use podnet::api::client::{AllocateParams, Client};

use super::*;

/// The node whose runtime is `want` (`scripts/cluster runtime node-I`).
fn node_running(cluster: &Cluster, want: &str) -> Option<String> {
    node_names().into_iter().find(|node| {
        let out = cluster.script_ok(&["runtime", node]);
        String::from_utf8_lossy(&out.stdout).trim() == want
    })
}

/// The node's Ready condition: (status, message).
fn ready_condition(cluster: &Cluster, node: &str) -> (String, String) {
    let node = cluster.kubectl_json(&["get", "node", node]);
    node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .unwrap_or_default()
}

/// The taint and annotation podnet's agent puts on a Node while no new pod can
/// get an address there.
const EXHAUSTED: &str = "podnet.io/addresses-exhausted";

/// Whether the node has the [`EXHAUSTED`] taint, and the annotation's reason.
fn exhaustion_mark(cluster: &Cluster, node: &str) -> (bool, String) {
    let node = cluster.kubectl_json(&["get", "node", node]);
    let tainted = node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["key"] == EXHAUSTED && t["effect"] == "NoSchedule");
    let reason = node["metadata"]["annotations"][EXHAUSTED]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (tainted, reason)
}

/// The pod's PodScheduled condition message (the scheduler's why).
fn pod_scheduled_message(pod: &Value) -> String {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "PodScheduled")
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// A pod the scheduler places, on `node` only (its hostname label).
fn scheduled_to(name: &str, node: &str) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "Pod",
  "metadata": {{"name": "{name}", "namespace": "default", "labels": {{"app": "waiting"}}}},
  "spec": {{"nodeSelector": {{"kubernetes.io/hostname": "{node}"}}, "terminationGracePeriodSeconds": 1,
    "containers": [{{"name": "busybox", "image": "localhost/busybox:1.35",
      "imagePullPolicy": "Never", "command": ["/bin/busybox", "sleep", "86400"]}}]}}}}"#
    )
}

/// Every pod of `placed` still Running on its node with its address, and each
/// agent holding exactly those addresses.
fn assert_pods_kept(cluster: &Cluster, placed: &[(String, String, String)], after: &str) {
    let now = super::placed(cluster, "pinned");
    let mut before = placed.to_vec();
    before.sort();
    let mut now_sorted = now.clone();
    now_sorted.sort();
    assert_eq!(
        now_sorted, before,
        "the pods and their addresses after {after}"
    );
    cluster.assert_agents_hold(&now);
}

/// The checks of this module's comment on a cluster with `deploy/` as it is, run
/// by cluster::deploy_runs_pods_rolls_podnet_and_serves_each_runtime as its last
/// part (`test` names it): the node whose ranges it fills keeps the ranges the
/// operator appended, which the parts before it would see.
pub(super) fn runtimes_status_reaches_readiness_gc_releases_and_restarts_lose_nothing(
    cluster: &Cluster,
    test: &str,
) {
    let (Some(containerd2), Some(crio)) = (
        node_running(cluster, "containerd2"),
        node_running(cluster, "crio"),
    ) else {
        eprintln!("{test}: skipped: PODNET_CLUSTER_RUNTIMES has no containerd2 or no crio node");
        return;
    };

    let nodes = node_names();
    for (i, node) in nodes.iter().enumerate() {
        cluster.apply(&busybox_on(&format!("pinned-{i}"), node));
    }
    let placed = cluster.wait_for(
        "a Running pod with an address on every node",
        || {
            let placed = placed(cluster, "pinned");
            let running = cluster
                .pods("default", "app=pinned")
                .iter()
                .all(|p| p["status"]["phase"] == "Running");
            (placed.len() == nodes.len() && running).then_some(placed)
        },
        || cluster.describe("default"),
    );
    cluster.assert_agents_hold(&placed);

    // STATUS under containerd 2: fill the node's ranges through the agent's
    // API. A full range makes the operator append another, up to
    // `cluster-pool-extra-cidrs-max` (2 by default): the node is exhausted
    // only when its third range is full.
    const RANGES_AT_CAP: usize = 3;
    let client = Client::new(cluster.agent_socket(&containerd2), Duration::from_secs(30));
    // An address freed shortly before (a pod of an earlier part on this cluster)
    // cools down for `ipam-release-cooldown` (30 s), counted as used: the fill
    // would pass over it, and once cooled it would give the node room again.
    let cooling = || {
        let ranges = client.healthz_brief().ok()?.ipam.ranges;
        Some(ranges.iter().map(|r| r.cooling).sum::<u64>())
    };
    cluster.wait_for(
        &format!("no address cooling on {containerd2}"),
        || (cooling()? == 0).then_some(()),
        || format!("cooling: {:?}", cooling()),
    );
    let mut taken = Vec::new();
    let refusal = loop {
        let owner = format!("test/fill-{}", taken.len());
        let params = AllocateParams {
            family: "ipv4",
            owner: &owner,
            ..AllocateParams::default()
        };
        match client.allocate(&params) {
            Ok(r) => taken.push(r.address.ipv4),
            Err(e) => {
                // Full when the refusal names every range the operator gave:
                // one it has just appended may not have reached the agent yet.
                let ranges = node_pod_cidrs(cluster, &containerd2);
                let refused = e.to_string();
                let all_full = ranges.iter().all(|r| refused.contains(&r.to_string()));
                if ranges.len() >= RANGES_AT_CAP && all_full {
                    break e;
                }
                eprintln!("{containerd2}: ranges {ranges:?}, refused ({e}); waiting for another");
                let next = cluster.wait_for(
                    &format!("{containerd2}'s agent serving an address from another range"),
                    || client.allocate(&params).ok(),
                    || format!("{:?}", node_pod_cidrs(cluster, &containerd2)),
                );
                taken.push(next.address.ipv4);
            }
        }
        assert!(taken.len() < 4096, "{containerd2}: the ranges never filled");
    };
    eprintln!(
        "{containerd2}: {RANGES_AT_CAP} ranges full after {} more addresses ({refusal})",
        taken.len()
    );
    // The node may have been tainted already while it waited for a range: the
    // reason to wait for names all three.
    let cidrs: Vec<String> = node_pod_cidrs(cluster, &containerd2)
        .iter()
        .map(|c| c.to_string())
        .collect();
    let reason = cluster.wait_for(
        &format!("{containerd2} tainted {EXHAUSTED} with a reason naming {cidrs:?}"),
        || {
            let (tainted, reason) = exhaustion_mark(cluster, &containerd2);
            (tainted
                && reason.contains("is exhausted")
                && cidrs.iter().all(|c| reason.contains(c.as_str())))
            .then_some(reason)
        },
        || format!("{:?}", exhaustion_mark(cluster, &containerd2)),
    );
    eprintln!("{containerd2}: tainted {EXHAUSTED}: {reason}");
    // containerd 2 asks STATUS every 5 s: the node stays Ready through several
    // asks (a NotReady node's pods would be evicted 300 s later), and a pod the
    // scheduler would send there waits for the taint.
    cluster.apply(&scheduled_to("waiting-for-room", &containerd2));
    std::thread::sleep(Duration::from_secs(20));
    let (status, message) = ready_condition(cluster, &containerd2);
    assert_eq!(
        status, "True",
        "{containerd2} stays Ready when exhausted: {message}"
    );
    // (The scheduler of Kubernetes 1.37 counts the tainted node without naming
    // the taint: "1 node(s) had untolerated taint(s)"; node-1's only taint is
    // podnet's, checked above.)
    let waiting = cluster.wait_for(
        "the pod for the full node unschedulable for a taint",
        || {
            let pod = cluster.kubectl_json(&["get", "pod", "waiting-for-room"]);
            let message = pod_scheduled_message(&pod);
            message.contains("untolerated taint").then_some(message)
        },
        || cluster.describe("default"),
    );
    eprintln!("waiting-for-room: {waiting}");
    let node = cluster.kubectl_json(&["get", "node", &containerd2]);
    let keys: Vec<&str> = node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["key"].as_str())
        .collect();
    assert_eq!(keys, [EXHAUSTED], "{containerd2}'s taints");
    let (status, _) = ready_condition(cluster, &crio);
    assert_eq!(status, "True", "{crio} (CRI-O) is not affected");
    let freed = taken.pop().expect("at least one address taken");
    client.release_ip(&freed, "").expect("release one address");
    let ran_on = cluster.wait_for(
        &format!("the waiting pod running on {containerd2} once an address is free"),
        || {
            let pod = cluster.kubectl_json(&["get", "pod", "waiting-for-room"]);
            (pod["status"]["phase"] == "Running").then(|| {
                pod["spec"]["nodeName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
        },
        || format!("{:?}", exhaustion_mark(cluster, &containerd2)),
    );
    assert_eq!(ran_on, containerd2);
    cluster.kubectl(&["delete", "pod", "waiting-for-room", "--wait=true"]);
    for ip in &taken {
        client.release_ip(ip, "").expect("release a fill address");
    }

    // GC under CRI-O: an attachment CRI-O never made, then a CRI-O restart.
    let crio_agent = Client::new(cluster.agent_socket(&crio), Duration::from_secs(30));
    let stray = crio_agent
        .allocate(&AllocateParams {
            family: "ipv4",
            owner: "test/stray",
            container_id: "podnet-test-stray-attachment",
            ifname: "eth0",
            network: "podnet",
            ..AllocateParams::default()
        })
        .expect("the stray attachment's address")
        .address
        .ipv4;
    cluster.script_ok(&["restart-runtime", &crio]);
    cluster.wait_for(
        &format!("{crio}: CRI-O's GC at start released {stray}"),
        || (!cluster.node_allocations(&crio).contains_key(&stray)).then_some(()),
        || format!("{:?}", cluster.node_allocations(&crio)),
    );
    assert_pods_kept(cluster, &placed, "CRI-O's restart and GC");

    // containerd 2 restarted under its running pod.
    cluster.script_ok(&["restart-runtime", &containerd2]);
    cluster.wait_for(
        &format!("{containerd2} Ready after its runtime's restart"),
        || (ready_condition(cluster, &containerd2).0 == "True").then_some(()),
        || format!("{:?}", ready_condition(cluster, &containerd2)),
    );
    assert_pods_kept(cluster, &placed, "containerd 2's restart");
    for (from, _, _) in &placed {
        for (_, _, to) in &placed {
            cluster.ping("default", from, to);
        }
    }

    let agents = cluster.agents();
    cluster.kubectl(&["delete", "pods", "-l", "app=pinned", "--wait=false"]);
    cluster.assert_freed("app=pinned", &agents);
}
