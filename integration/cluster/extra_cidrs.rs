//! A full node gets a second range on the real cluster, in both routing modes:
//! with `/27` node CIDRs (30 addresses, router and health among them), pods
//! pinned to node-1 fill it past `cluster-pool-depletion-threshold` (10%); the
//! agent says `depleted`, podnet's operator appends a second CIDR, the agent
//! hands out addresses from it, and those pods reach and are reached from the
//! other nodes (the routes, the tunnel and masquerade cover both CIDRs).

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
        // Reached from, and reaching, a pod on every other node.
        for node in ["node-2", "node-3"] {
            let probe = format!("probe-{node}");
            cluster.apply(&busybox_on(&probe, node));
            let ip = cluster.wait_for(
                &format!("{probe} running"),
                || {
                    let pods = cluster.pods("default", "app=pinned");
                    let pod = pods
                        .iter()
                        .find(|p| p["metadata"]["name"] == probe.as_str())?;
                    let ip = pod["status"]["podIP"].as_str()?.to_string();
                    cluster.exec(&probe, &["/bin/busybox", "true"]).ok()?;
                    Some(ip)
                },
                || cluster.describe("default"),
            );
            cluster.ping("default", &probe, &in_second.2);
            cluster.ping("default", &in_second.0, &ip);
        }
        // And the world, masqueraded like the first CIDR's pods.
        cluster.ping("default", &in_second.0, WORLD_IP);
        drop(cluster);
    }
}
