//! Addresses that follow a StatefulSet pod, on the real cluster in multi-pool
//! (`ipam.podnet.io/sticky-pool`), in both routing modes: a 3-replica
//! StatefulSet whose template names the sticky pool `web` (10.245.0.0/28,
//! single-address blocks); each pod in turn is deleted with its node cordoned,
//! comes back on another node with the same address and is reachable from a
//! probe on every node. A 1-replica StatefulSet without the annotation is moved
//! the same way for comparison (it comes back with another address). A sampler
//! checks that no two running pods ever show one address, and `podnet ipam
//! check` stays clean.

use std::net::IpAddr;

use super::*;

const STICKY_CIDR: &str = "10.245.0.0/28";

/// The sticky pool `web`: one address a block.
fn sticky_pool() -> String {
    format!(
        r#"{{"apiVersion": "cilium.io/v2alpha1", "kind": "CiliumPodIPPool",
  "metadata": {{"name": "web", "annotations": {{"ipam.podnet.io/sticky": "true"}}}},
  "spec": {{"ipv4": {{"cidrs": ["{STICKY_CIDR}"], "maskSize": 32}}}}}}"#
    )
}

/// A StatefulSet of `replicas` busybox pods labelled `app: <name>`, spread over
/// the nodes when it can be (preferred anti-affinity), its template annotated
/// with the sticky pool when `sticky`.
fn statefulset(name: &str, replicas: usize, sticky: bool) -> String {
    let annotations = if sticky {
        r#""annotations": {"ipam.podnet.io/sticky-pool": "web"},"#
    } else {
        ""
    };
    format!(
        r#"{{"apiVersion": "apps/v1", "kind": "StatefulSet",
  "metadata": {{"name": "{name}", "namespace": "default"}},
  "spec": {{"replicas": {replicas}, "serviceName": "{name}", "podManagementPolicy": "Parallel",
    "selector": {{"matchLabels": {{"app": "{name}"}}}},
    "template": {{"metadata": {{{annotations} "labels": {{"app": "{name}"}}}},
      "spec": {{"terminationGracePeriodSeconds": 1,
        "affinity": {{"podAntiAffinity": {{"preferredDuringSchedulingIgnoredDuringExecution": [
          {{"weight": 100, "podAffinityTerm": {{"topologyKey": "kubernetes.io/hostname",
            "labelSelector": {{"matchLabels": {{"app": "{name}"}}}}}}}}]}}}},
        "containers": [{{"name": "busybox", "image": "localhost/busybox:1.35",
          "imagePullPolicy": "Never",
          "command": ["/bin/busybox", "sleep", "86400"]}}]}}}}}}}}"#
    )
}

/// Every running pod's address, failing on one shown by two pods.
fn assert_no_address_twice(cluster: &Cluster) {
    let pods = cluster.kubectl_json(&["get", "pods", "-A"]);
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for p in pods["items"].as_array().into_iter().flatten() {
        if p["spec"]["hostNetwork"].as_bool() == Some(true)
            || p["status"]["phase"].as_str() != Some("Running")
        {
            continue;
        }
        let (Some(ip), Some(name)) = (
            p["status"]["podIP"].as_str(),
            p["metadata"]["name"].as_str(),
        ) else {
            continue;
        };
        if let Some(other) = seen.insert(ip.to_string(), name.to_string()) {
            panic!("pods {other} and {name} both show {ip}");
        }
    }
}

/// A probe pod on each node, running; their names.
fn probes(cluster: &Cluster) -> Vec<String> {
    let names: Vec<String> = node_names().iter().map(|n| format!("probe-{n}")).collect();
    for (probe, node) in names.iter().zip(node_names()) {
        cluster.apply(&busybox_on(probe, &node));
    }
    for probe in &names {
        cluster.wait_for(
            &format!("{probe} running"),
            || cluster.exec(probe, &["/bin/busybox", "true"]).ok(),
            || cluster.describe("default"),
        );
    }
    names
}

/// Whether every probe pings `ip` now.
fn reached_by_all(cluster: &Cluster, probes: &[String], ip: &str) -> bool {
    probes.iter().all(|p| {
        cluster
            .exec(p, &["/bin/busybox", "ping", "-c", "1", "-W", "1", ip])
            .is_ok()
    })
}

/// Moves pod `name` of `app` off its node (cordoned meanwhile): deletes it and
/// waits until the StatefulSet's new pod runs on another node and every probe
/// reaches it. Returns the old and new (node, address) and the time from the
/// delete to reachable.
fn moved(
    cluster: &Cluster,
    probes: &[String],
    app: &str,
    name: &str,
) -> ((String, String), (String, String), f64) {
    let before = placed(cluster, app);
    let (_, node, ip) = before
        .iter()
        .find(|(n, _, _)| n == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} is not placed: {before:?}"));
    cluster.kubectl(&["cordon", &node]);
    let t0 = Instant::now();
    cluster.kubectl(&["delete", "pod", name, "--wait=false"]);
    let after = cluster.wait_for(
        &format!("{name} back on another node than {node}, reachable from every node"),
        || {
            assert_no_address_twice(cluster);
            let (_, new_node, new_ip) = placed(cluster, app)
                .into_iter()
                .find(|(n, other, _)| n == name && *other != node)?;
            reached_by_all(cluster, probes, &new_ip).then_some((new_node, new_ip))
        },
        || cluster.describe("default"),
    );
    let elapsed = t0.elapsed().as_secs_f64();
    cluster.kubectl(&["uncordon", &node]);
    ((node, ip), after, elapsed)
}

#[test]
fn a_statefulset_pod_keeps_its_address_on_another_node() {
    for routing in ["tunnel", "native"] {
        let test = format!("a_statefulset_pod_keeps_its_address_{routing}");
        let Some(cluster) = Cluster::start(&test) else {
            return;
        };
        let manifests = podnet_manifests_with(
            routing,
            "ipv4",
            &[
                "ipam=multi-pool",
                "auto-create-cilium-pod-ip-pools=default=ipv4-cidrs:10.244.0.0/16;ipv4-mask-size:24",
                "-cluster-pool-ipv4-cidr",
                "-cluster-pool-ipv4-mask-size",
                "-cluster-pool-depletion-threshold",
                "-cluster-pool-cidr-release-delay",
                "-cluster-pool-extra-cidrs-max",
            ],
        );
        cluster.apply(&manifests);
        cluster.wait_nodes_ready();
        cluster.apply(&sticky_pool());
        let probes = probes(&cluster);
        cluster.apply(&statefulset("web", 3, true));
        cluster.apply(&statefulset("plain", 1, false));
        let sticky: IpNet = STICKY_CIDR.parse().expect("a CIDR");
        let first = cluster.wait_for(
            "web-0..2 and plain-0 running, web's in the sticky pool",
            || {
                let web = placed(&cluster, "web");
                let ok = web.len() == 3
                    && web.iter().all(|(_, _, ip)| {
                        ip.parse::<IpAddr>().is_ok_and(|ip| sticky.contains(&ip))
                    })
                    && placed(&cluster, "plain").len() == 1;
                ok.then_some(web)
            },
            || cluster.describe("default"),
        );
        eprintln!("{test}: placed {first:?}");
        for (_, _, ip) in &first {
            cluster.wait_for(
                &format!("{ip} reachable from every node"),
                || reached_by_all(&cluster, &probes, ip).then_some(()),
                || cluster.describe("default"),
            );
        }
        let mut sticky_times = Vec::new();
        for i in 0..3 {
            let name = format!("web-{i}");
            let ((from, ip), (to, new_ip), secs) = moved(&cluster, &probes, "web", &name);
            eprintln!(
                "{test}: {name} {from} {ip} -> {to} {new_ip}: delete to reachable {secs:.1} s"
            );
            assert_eq!(new_ip, ip, "{name} keeps its address");
            sticky_times.push(secs);
        }
        let ((from, ip), (to, new_ip), plain_secs) = moved(&cluster, &probes, "plain", "plain-0");
        eprintln!(
            "{test}: plain-0 (no sticky address) {from} {ip} -> {to} {new_ip}: delete to reachable {plain_secs:.1} s"
        );
        eprintln!(
            "{test}: delete to reachable, sticky {:?} s against {plain_secs:.1} s without",
            sticky_times
                .iter()
                .map(|s| format!("{s:.1}"))
                .collect::<Vec<_>>()
        );
        // Each sticky block is listed by exactly the node its pod runs on.
        let nodes = cluster.kubectl_json(&["get", "ciliumnodes"]);
        for (name, node, ip) in placed(&cluster, "web") {
            let holders: Vec<&str> = nodes["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|n| {
                    n["spec"]["ipam"]["pools"]["allocated"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|a| a["pool"] == "web")
                        .flat_map(|a| a["cidrs"].as_array().into_iter().flatten())
                        .any(|c| c.as_str() == Some(&format!("{ip}/32")))
                })
                .filter_map(|n| n["metadata"]["name"].as_str())
                .collect();
            assert_eq!(holders, [node.as_str()], "{name}'s block {ip}/32");
        }
        let (out, report) = cluster.ipam_check();
        assert!(out.status.success(), "ipam check:\n{report}");
        drop(cluster);
    }
}
