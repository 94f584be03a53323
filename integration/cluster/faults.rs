//! Faults on the cluster: an agent killed in the middle of a burst, a node
//! rebooted, the operator leader's node powered off while a node joins; one
//! cluster with `deploy/` as it is takes the three in turn.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use ipnet::Ipv4Net;
use serde_json::Value;

use super::*;

/// The three faults of this module in turn on one cluster with `deploy/` as it
/// is, each part removing its own pods: [`an_agent_killed_during_a_scale_up_loses_and_doubles_nothing`],
/// [`a_rebooted_node_comes_back_with_working_pods`], then
/// [`a_node_joining_after_the_operator_leaders_node_died_gets_its_cidr`] (last:
/// its node stays powered off).
#[test]
fn an_agent_killed_a_node_rebooted_and_the_operator_leaders_node_lost_break_nothing() {
    let test = "an_agent_killed_a_node_rebooted_and_the_operator_leaders_node_lost_break_nothing";
    let Some(cluster) = Cluster::start_with_podnet(test) else {
        return;
    };
    part(
        test,
        "an_agent_killed_during_a_scale_up_loses_and_doubles_nothing",
        || an_agent_killed_during_a_scale_up_loses_and_doubles_nothing(&cluster),
    );
    part(test, "a_rebooted_node_comes_back_with_working_pods", || {
        a_rebooted_node_comes_back_with_working_pods(&cluster)
    });
    part(
        test,
        "a_node_joining_after_the_operator_leaders_node_died_gets_its_cidr",
        || a_node_joining_after_the_operator_leaders_node_died_gets_its_cidr(&cluster),
    );
}

/// The agent pod of one node is force-deleted (SIGKILL, its API object gone at
/// once) while a 60-pod Deployment scales up across the three nodes: every pod
/// turns Ready, no address is held twice in the cluster, each node's agent holds
/// exactly the addresses of the pods on its node, and once the Deployment is
/// deleted no address is left allocated on any node.
fn an_agent_killed_during_a_scale_up_loses_and_doubles_nothing(cluster: &Cluster) {
    const BURST: usize = 60;
    let victim_node = "node-2";
    let victim = cluster
        .agents()
        .remove(victim_node)
        .expect("an agent on node-2");

    let t0 = Instant::now();
    cluster.apply(&spread_deployment("burst", BURST));
    // Once the first pods have started on the victim's node, its agent goes.
    cluster.wait_for(
        &format!("a burst pod scheduled on {victim_node}"),
        || {
            placed(cluster, "burst")
                .iter()
                .any(|(_, n, _)| n == victim_node)
                .then_some(())
        },
        || cluster.describe("default"),
    );
    cluster.kubectl(&[
        "delete",
        "pod",
        "-n",
        "kube-system",
        &victim,
        "--force",
        "--grace-period=0",
    ]);
    eprintln!(
        "force-deleted {victim} ({victim_node}) {:.1} s into the burst",
        t0.elapsed().as_secs_f64()
    );
    let pods = cluster.wait_for(
        &format!("all {BURST} burst pods Ready"),
        || {
            let pods = cluster.pods("default", "app=burst");
            (pods.len() == BURST && pods.iter().all(ready)).then_some(pods)
        },
        || cluster.describe("default"),
    );
    eprintln!(
        "{BURST} pods Ready {:.1} s after the Deployment",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(pods.len(), BURST);

    // No address twice, and each node's agent holds exactly its pods' addresses.
    let placed = placed(cluster, "burst");
    let mut seen = BTreeMap::new();
    for (pod, _, ip) in &placed {
        if let Some(other) = seen.insert(ip.clone(), pod.clone()) {
            panic!("{ip} is held by both {other} and {pod}");
        }
    }
    let agents = cluster.assert_agents_hold(&placed);

    cluster.kubectl(&["delete", "deployment", "burst", "--wait=true"]);
    cluster.assert_freed("app=burst", &agents);
}

/// A node "reboots" (`scripts/cluster reboot`: every process killed at once, its
/// network namespace, mounts and /run gone, /var/lib kept, then booted): it turns
/// Ready again, its kubelet recreates its pods with addresses of its CIDR that
/// pods on the other nodes reach, nothing of the old sandboxes is left in its
/// kernel (one host link per running pod), and its agent holds exactly the
/// addresses of the pods running on it. Deleting the pods then frees their
/// addresses on every node.
fn a_rebooted_node_comes_back_with_working_pods(cluster: &Cluster) {
    cluster.apply(&spread_deployment("spread", REPLICAS));
    let all_ready = || {
        let pods = cluster.pods("default", "app=spread");
        (pods.len() == REPLICAS && pods.iter().all(ready)).then_some(())
    };
    cluster.wait_for("every spread pod Ready", all_ready, || {
        cluster.describe("default")
    });
    let node = "node-2";
    // pod -> (address, container) of the pods on the node.
    let before: BTreeMap<String, (String, String)> = cluster
        .pods("default", "app=spread")
        .iter()
        .filter(|p| p["spec"]["nodeName"] == node)
        .filter_map(|p| {
            let name = p["metadata"]["name"].as_str()?.to_string();
            let ip = p["status"]["podIP"].as_str()?.to_string();
            Some((name, (ip, container_id(p))))
        })
        .collect();
    assert!(!before.is_empty(), "no spread pod on {node}");

    let t0 = Instant::now();
    cluster.script_ok(&["reboot", node]);
    // The kubelet recreates the pods' sandboxes and containers: each pod of the
    // node is Ready again in a container other than its old one.
    let restarted = || {
        let pods = cluster.pods("default", "app=spread");
        let again = pods
            .iter()
            .filter(|p| p["spec"]["nodeName"] == node)
            .all(|p| {
                let name = p["metadata"]["name"].as_str().unwrap_or_default();
                let old = before.get(name).map(|(_, c)| c.as_str());
                ready(p) && old.is_some_and(|old| old != container_id(p))
            });
        (pods.len() == REPLICAS && pods.iter().all(ready) && again).then_some(())
    };
    cluster.wait_for(
        &format!("{node}'s pods Ready again after its reboot"),
        restarted,
        || cluster.describe("default"),
    );
    eprintln!(
        "{node} rebooted, its pods Ready again in {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    let cidrs = node_cidrs(cluster, node);
    let after = placed(cluster, "spread");
    let (from, _, _) = after
        .iter()
        .find(|(_, n, _)| n != node)
        .expect("a pod on another node");
    for (pod, _, ip) in after.iter().filter(|(_, n, _)| n == node) {
        let addr: std::net::Ipv4Addr = ip.parse().unwrap_or_else(|e| panic!("{pod}: {ip}: {e}"));
        assert!(
            cidrs.iter().any(|c| c.contains(&addr)),
            "{pod} has {ip}, not of {node}'s {cidrs:?}"
        );
        eprintln!(
            "{from} pings {pod} ({ip}, was {:?})",
            before.get(pod).map(|(ip, _)| ip)
        );
        cluster.ping("default", from, ip);
    }

    // The node's kernel and agent against what runs on it: every pod of the
    // node with a pod address (not host-network) has one host link and one
    // allocation, and nothing else has either.
    let running: BTreeSet<String> = cluster.kubectl_json(&[
        "get",
        "pods",
        "-A",
        "--field-selector",
        &format!("spec.nodeName={node},status.phase=Running"),
    ])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["spec"]["hostNetwork"] != true)
        .filter_map(|p| p["status"]["podIP"].as_str().map(str::to_string))
        .collect();
    let agent = cluster.wait_for(
        &format!("the agent on {node} Ready"),
        || {
            let agent = cluster.agents().remove(node)?;
            let pod = cluster.kubectl_json(&["get", "pod", "-n", "kube-system", &agent]);
            ready(&pod).then_some(agent)
        },
        || cluster.describe("kube-system"),
    );
    // (The node's own addresses, its router's and health endpoint's, are owned by
    // no pod: "router", "health".)
    let held: BTreeSet<String> = cluster
        .allocated(&agent)
        .into_iter()
        .filter(|(_, owner)| owner.contains('/'))
        .map(|(ip, _)| ip)
        .collect();
    assert_eq!(
        held, running,
        "{node}: the agent's allocations against its running pods"
    );
    let links = cluster.script(&["exec", node, "ip", "-o", "link", "show", "type", "veth"]);
    assert!(
        links.status.success(),
        "ip link on {node}: {}",
        text(&links)
    );
    let host_links = text(&links).lines().filter(|l| l.contains(": lxc")).count();
    assert_eq!(
        host_links,
        running.len(),
        "{node}: host links against running pods {running:?}:\n{}",
        text(&links)
    );

    let agents = cluster.agents();
    cluster.kubectl(&["delete", "deployment", "spread", "--wait=true"]);
    cluster.assert_freed("app=spread", &agents);
}

/// The operator leader's node loses its power: the other replica takes the Lease
/// over once the leader's record has not changed for the lease duration (15 s),
/// and a node that joins afterwards gets a pod CIDR of its own from the new
/// leader, turns Ready with podnet, and its pod and a pod on a node still up
/// reach each other.
fn a_node_joining_after_the_operator_leaders_node_died_gets_its_cidr(cluster: &Cluster) {
    let (leader_node, follower) = cluster.wait_for(
        "the operator's two replicas Ready, one of them holding the Lease",
        || {
            let pods = cluster.pods("kube-system", "app.kubernetes.io/name=podnet-operator");
            if pods.len() != 2 || !pods.iter().all(ready) {
                return None;
            }
            let holder = lease_holder(cluster)?;
            let name = |p: &&Value| p["metadata"]["name"].as_str() == Some(holder.as_str());
            let leader = pods.iter().find(name)?;
            let follower = pods.iter().find(|p| !name(p))?;
            Some((
                leader["spec"]["nodeName"].as_str()?.to_string(),
                follower["metadata"]["name"].as_str()?.to_string(),
            ))
        },
        || cluster.describe("kube-system"),
    );
    let up = node_names()
        .into_iter()
        .find(|n| *n != leader_node)
        .expect("a node other than the leader's");

    let t0 = Instant::now();
    cluster.script_ok(&["poweroff", &leader_node]);
    cluster.wait_for(
        &format!("{follower} holding the Lease after {leader_node}'s power cut"),
        || (lease_holder(cluster)? == follower).then_some(()),
        || cluster.describe("kube-system"),
    );
    eprintln!(
        "{follower} took the Lease over {:.1} s after {leader_node}'s power cut",
        t0.elapsed().as_secs_f64()
    );

    let out = cluster.script_ok(&["add-node"]);
    let joined = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(joined, format!("node-{}", NODES + 1));
    let t1 = Instant::now();
    let cidrs = cluster.wait_for(
        &format!("{joined}'s pod CIDR from the new leader"),
        || {
            let out = cluster.script(&["kubectl", "get", "ciliumnode", &joined, "-o", "json"]);
            let node: Value = serde_json::from_slice(&out.stdout).ok()?;
            let cidrs: Vec<Ipv4Net> = node["spec"]["ipam"]["podCIDRs"]
                .as_array()?
                .iter()
                .filter_map(|c| c.as_str()?.parse().ok())
                .collect();
            (!cidrs.is_empty()).then_some(cidrs)
        },
        || cluster.describe("kube-system"),
    );
    eprintln!(
        "{joined} has {cidrs:?} {:.1} s after it joined",
        t1.elapsed().as_secs_f64()
    );
    for other in node_names() {
        for theirs in node_cidrs(cluster, &other) {
            assert!(
                cidrs
                    .iter()
                    .all(|c| !c.contains(&theirs.network()) && !theirs.contains(&c.network())),
                "{joined}'s {cidrs:?} overlaps {other}'s {theirs}"
            );
        }
    }

    cluster.apply(&busybox_on("joined", &joined));
    cluster.apply(&busybox_on("up", &up));
    let ips = cluster.wait_for(
        &format!("the pods on {joined} and {up} Ready"),
        || {
            let pods = placed(cluster, "pinned");
            let all = cluster.pods("default", "app=pinned");
            (pods.len() == 2 && all.iter().all(ready)).then_some(pods)
        },
        || cluster.describe("default"),
    );
    let ip_of = |pod: &str| {
        ips.iter()
            .find(|(name, _, _)| name == pod)
            .map(|(_, _, ip)| ip.clone())
            .unwrap_or_else(|| panic!("no address for {pod}: {ips:?}"))
    };
    let joined_ip: std::net::Ipv4Addr = ip_of("joined")
        .parse()
        .unwrap_or_else(|e| panic!("joined's address: {e}"));
    assert!(
        cidrs.iter().any(|c| c.contains(&joined_ip)),
        "the pod on {joined} has {joined_ip}, not of {cidrs:?}"
    );
    cluster.ping("default", "joined", &ip_of("up"));
    cluster.ping("default", "up", &joined_ip.to_string());
}
