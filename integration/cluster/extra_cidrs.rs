//! A full node gets a second range on the real cluster, in both routing modes:
//! with `/27` node CIDRs (30 addresses, router and health among them), pods
//! pinned to node-1 fill it past `cluster-pool-depletion-threshold` (10%); the
//! agent says `depleted`, podnet's operator appends a second CIDR, the agent
//! hands out addresses from it, and those pods reach and are reached from the
//! other nodes (the routes, the tunnel and masquerade cover both CIDRs). And a
//! pool grown live: a full node in an empty pool waits, then a CIDR appended to the
//! ConfigMap with its own mask size serves it, with no pod restarted.

use ipnet::IpNet;

use super::*;

/// `replicas` busybox pods labelled `app: <name>`, all on `node`.
fn pinned_deployment(name: &str, node: &str, replicas: usize) -> String {
    let mut d: Value =
        serde_json::from_str(&spread_deployment(name, replicas)).expect("a Deployment");
    let spec = &mut d["spec"]["template"]["spec"];
    spec["nodeName"] = node.into();
    if let Some(s) = spec.as_object_mut() {
        s.remove("topologySpreadConstraints");
    }
    d.to_string()
}

/// `pod` (at `ip`, on node-1) pings and is pinged from a probe pod on each other
/// node, and pings the world.
fn reaches_and_is_reached(cluster: &Cluster, pod: &str, ip: &str) {
    for node in ["node-2", "node-3"] {
        let probe = format!("probe-{node}");
        cluster.apply(&busybox_on(&probe, node));
        let probe_ip = cluster.wait_for(
            &format!("{probe} running"),
            || {
                let pods = cluster.pods("default", "app=pinned");
                let p = pods
                    .iter()
                    .find(|p| p["metadata"]["name"] == probe.as_str())?;
                let probe_ip = p["status"]["podIP"].as_str()?.to_string();
                cluster.exec(&probe, &["/bin/busybox", "true"]).ok()?;
                Some(probe_ip)
            },
            || cluster.describe("default"),
        );
        cluster.ping("default", &probe, ip);
        cluster.ping("default", pod, &probe_ip);
    }
    cluster.ping("default", pod, WORLD_IP);
}

#[test]
fn a_full_node_gets_a_second_range_reachable_from_the_other_nodes() {
    for routing in ["tunnel", "native"] {
        let test = format!("a_full_node_gets_a_second_range_{routing}");
        let Some(cluster) = Cluster::start(&test) else {
            return;
        };
        let manifests = podnet_manifests_with(routing, "ipv4", &["cluster-pool-ipv4-mask-size=27"]);
        cluster.apply(&manifests);
        cluster.wait_nodes_ready();
        let full = "node-1";
        let first = node_pod_cidrs(&cluster, full);
        assert_eq!(first.len(), 1, "{first:?}");
        // 30 usable: router, health and 28 pods fill it; 30 pods need a second.
        let t0 = Instant::now();
        cluster.apply(&pinned_deployment("fill", full, 30));
        let cidrs: Vec<IpNet> = cluster.wait_for(
            "node-1's second CIDR",
            || {
                let c = node_pod_cidrs(&cluster, full);
                (c.len() == 2).then_some(c)
            },
            || cluster.describe("default"),
        );
        eprintln!(
            "{test}: 30 pods created to node-1's second CIDR {}: {:.1} s",
            cidrs[1],
            t0.elapsed().as_secs_f64()
        );
        assert_eq!(cidrs[0], first[0], "the first CIDR stays first");
        let in_second = cluster.wait_for(
            "a running pod in the second CIDR",
            || {
                placed(&cluster, "fill")
                    .into_iter()
                    .filter(|(_, _, ip)| {
                        ip.parse::<std::net::IpAddr>()
                            .is_ok_and(|ip| cidrs[1].contains(&ip))
                    })
                    .find(|(name, _, _)| cluster.exec(name, &["/bin/busybox", "true"]).is_ok())
            },
            || cluster.describe("default"),
        );
        eprintln!(
            "{test}: 30 pods created to {} running at {}: {:.1} s",
            in_second.0,
            in_second.2,
            t0.elapsed().as_secs_f64()
        );
        // The world too, masqueraded like the first CIDR's pods.
        reaches_and_is_reached(&cluster, &in_second.0, &in_second.2);
        drop(cluster);
    }
}

/// The pool holds exactly the three nodes' `/27`s, so node-1, filled, finds no
/// extra CIDR (an `ExtraPodCIDRUnavailable` Event naming the node) and keeps
/// serving the 28 pods it has. Then `10.245.0.0/24@28` is appended to
/// `cluster-pool-ipv4-cidr` in the ConfigMap, nothing restarted: the operator's
/// leader reads its `--config-dir` (the mounted ConfigMap) again, node-1 gets a
/// `/28` of the new CIDR, outside `ipv4-native-routing-cidr` (10.244.0.0/16), and
/// its waiting pods (two, more if other pods run there) start there, reaching and reached from the other nodes (native
/// routing: the routes and the masquerade exemption follow every node's CIDRs,
/// not that option) and the world. `podnet ipam check` stays clean.
#[test]
fn a_pool_grown_live_serves_a_full_node_from_a_cidr_with_its_own_mask() {
    let test = "a_pool_grown_live";
    let Some(cluster) = Cluster::start(test) else {
        return;
    };
    let first_pool = "10.244.0.0/26 10.244.0.64/27";
    let pool_option = format!("cluster-pool-ipv4-cidr={first_pool}");
    let manifests = podnet_manifests_with(
        "native",
        "ipv4",
        &[&pool_option, "cluster-pool-ipv4-mask-size=27"],
    );
    cluster.apply(&manifests);
    cluster.wait_nodes_ready();
    let full = "node-1";
    cluster.apply(&pinned_deployment("fill", full, 30));
    let refusal = cluster.wait_for(
        "an ExtraPodCIDRUnavailable Event for node-1",
        || {
            let events = cluster.kubectl_json(&[
                "get",
                "events",
                "-A",
                "--field-selector",
                "reason=ExtraPodCIDRUnavailable",
            ]);
            events["items"]
                .as_array()?
                .iter()
                .filter_map(|e| e["message"].as_str())
                .find(|m| m.contains(full))
                .map(str::to_string)
        },
        || cluster.describe("default"),
    );
    eprintln!("{test}: the empty pool, as the Event says it: {refusal}");
    assert!(
        refusal.contains("10.244.0.64/27"),
        "the Event names the pool: {refusal}"
    );
    let first = node_pod_cidrs(&cluster, full);
    assert_eq!(first.len(), 1, "{first:?}");
    // The node keeps serving what it has: its 28 pod addresses are in use, by
    // fill pods and whatever else runs there (CoreDNS may).
    let in_first = || {
        let pods = cluster.kubectl_json(&[
            "get",
            "pods",
            "-A",
            "--field-selector",
            &format!("spec.nodeName={full}"),
        ]);
        pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["spec"]["hostNetwork"].as_bool() != Some(true))
            .filter_map(|p| {
                p["status"]["podIP"]
                    .as_str()?
                    .parse::<std::net::IpAddr>()
                    .ok()
            })
            .filter(|ip| first[0].contains(ip))
            .count()
    };
    cluster.wait_for(
        "node-1's 28 pod addresses in use",
        || (in_first() == 28).then_some(()),
        || cluster.describe("default"),
    );
    let waiting = 30 - placed(&cluster, "fill").len();
    eprintln!("{test}: {waiting} fill pods wait for an address");

    let grown = format!("{first_pool} 10.245.0.0/24@28");
    let patch = format!(r#"{{"data":{{"cluster-pool-ipv4-cidr":"{grown}"}}}}"#);
    let t0 = Instant::now();
    cluster.kubectl(&[
        "patch",
        "configmap",
        "-n",
        "kube-system",
        "podnet-config",
        "--type",
        "merge",
        "-p",
        &patch,
    ]);
    let cidrs = cluster.wait_for(
        "node-1's second CIDR, from the appended pool CIDR",
        || {
            let c = node_pod_cidrs(&cluster, full);
            (c.len() == 2).then_some(c)
        },
        || cluster.describe("default"),
    );
    eprintln!(
        "{test}: ConfigMap edited to node-1's second CIDR {}: {:.1} s (the kubelet's ConfigMap refresh, then the leader's 5 s reading)",
        cidrs[1],
        t0.elapsed().as_secs_f64()
    );
    let second: IpNet = "10.245.0.0/28".parse().expect("a CIDR");
    assert_eq!(cidrs[1], second, "the new CIDR's first /28: {cidrs:?}");
    let in_second = cluster.wait_for(
        "the waiting fill pods running in the new CIDR",
        || {
            let placed = placed(&cluster, "fill");
            let new: Vec<_> = placed
                .into_iter()
                .filter(|(_, _, ip)| {
                    ip.parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| second.contains(&ip))
                })
                .collect();
            (new.len() == waiting && cluster.exec(&new[0].0, &["/bin/busybox", "true"]).is_ok())
                .then(|| new[0].clone())
        },
        || cluster.describe("default"),
    );
    eprintln!(
        "{test}: ConfigMap edited to {} running at {}: {:.1} s",
        in_second.0,
        in_second.2,
        t0.elapsed().as_secs_f64()
    );
    reaches_and_is_reached(&cluster, &in_second.0, &in_second.2);
    let (out, report) = cluster.ipam_check();
    assert!(out.status.success(), "ipam check:\n{report}");
    drop(cluster);
}
