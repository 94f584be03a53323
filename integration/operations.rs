//! What an operator touches: `podnet status`, `podnet explain`, the metrics and the
//! plugin's log file, on real daemon state.

use std::process::Command;

use crate::harness::*;

fn podnet(node: &Node, args: &[&str]) -> (bool, String) {
    let out = Command::new(podnet_bin())
        .args(args)
        .arg("--socket")
        .arg(node.socket())
        .output()
        .expect("podnet");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// GET /metrics over TCP inside the node namespace.
fn scrape(node: &Node, port: u16) -> String {
    let script = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port}; printf 'GET /metrics HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' >&3; cat <&3"
    );
    let out = node.ns.exec(&["bash", "-c", &script]);
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn metric_value(text: &str, line_prefix: &str) -> Option<f64> {
    metric_values(text, line_prefix).first().copied()
}

#[test]
fn metrics_have_cilium_names_under_the_prefix_and_move() {
    if !root_or_skip("metrics") {
        return;
    }
    let node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.90.0.0/24",
        "--cluster-pool-ipv4-mask-size",
        "30",
        "--enable-health-checking=false",
        "--k8s-node-name",
        "metrics",
        "--prometheus-serve-addr",
        "127.0.0.1:9962",
    ]);
    let before = scrape(&node, 9962);
    assert!(
        before.contains("podnet_ipam_capacity{family=\"ipv4\",cidr=\"10.90.0.0/30\"} 2"),
        "{before}"
    );
    assert!(
        before.contains("podnet_ip_addresses{family=\"ipv4\"} 1"),
        "{before}"
    );
    assert!(
        before.contains("podnet_ipam_restore_outcomes{outcome=\"restored\"}"),
        "{before}"
    );
    assert!(before.contains("podnet_delete_queue_depth 0"), "{before}");
    // A /30 holds the router and one pod: the second ADD fails on a full range.
    let a = node.sandbox();
    let b = node.sandbox();
    assert!(node.add(&a).ok);
    assert_eq!(node.add(&b).code(), 101);
    let mut after = scrape(&node, 9962);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    // Both ADDs report without waiting for the answer; the successful one's report
    // carries link-wired.
    while !after.contains("verb=\"ADD\",phase=\"link-wired\"")
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
        after = scrape(&node, 9962);
    }
    assert_eq!(
        metric_value(
            &after,
            "podnet_ipam_events_total{action=\"allocate\",family=\"ipv4\"}"
        ),
        Some(1.0),
        "{after}"
    );
    assert!(
        after.contains("podnet_ip_addresses{family=\"ipv4\"} 2"),
        "{after}"
    );
    assert_eq!(
        metric_value(
            &after,
            "podnet_ipam_allocation_failures_total{reason=\"range-full\"}"
        ),
        Some(1.0),
        "{after}"
    );
    for phase in [
        "daemon-allocation",
        "ipam-round-trip",
        "netlink-host",
        "netlink-pod",
        "link-wired",
        "total",
    ] {
        let line =
            format!("podnet_cni_phase_duration_seconds_count{{verb=\"ADD\",phase=\"{phase}\"}}");
        assert!(
            metric_value(&after, &line).is_some_and(|n| n >= 1.0),
            "{phase} missing:\n{after}"
        );
    }
    assert!(after.contains(
        "podnet_cni_phase_duration_seconds_count{verb=\"daemon\",phase=\"journal-commit\"}"
    ));
    // DEL moves the release counter and the cooling gauge.
    assert!(node.del(&a).ok);
    // The DEL's timings came with its release: recorded before it returned.
    let del = scrape(&node, 9962);
    assert_eq!(
        metric_value(
            &del,
            "podnet_ipam_events_total{action=\"release\",family=\"ipv4\"}"
        ),
        Some(1.0),
        "{del}"
    );
    assert!(
        del.contains("podnet_ipam_cooling_addresses{family=\"ipv4\"} 1"),
        "{del}"
    );
    for phase in ["netlink-lookup", "daemon-release", "total"] {
        let line =
            format!("podnet_cni_phase_duration_seconds_count{{verb=\"DEL\",phase=\"{phase}\"}}");
        assert_eq!(metric_value(&del, &line), Some(1.0), "{phase}:\n{del}");
    }
}

#[test]
fn the_metrics_prefix_can_be_ciliums() {
    if !root_or_skip("metrics_prefix") {
        return;
    }
    let node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.91.0.0/16",
        "--metrics-prefix",
        "cilium",
        "--k8s-node-name",
        "cil",
    ]);
    let text = String::from_utf8_lossy(
        &node
            .client()
            .call("GET", "/metrics", &[], None)
            .expect("metrics")
            .body,
    )
    .to_string();
    assert!(
        text.contains("cilium_ipam_capacity{family=\"ipv4\",cidr=\"10.91.0.0/24\"} 254"),
        "{text}"
    );
    assert!(!text.contains("podnet_"));
}

#[test]
fn status_and_explain_answer_for_a_full_range_and_a_missing_pod() {
    if !root_or_skip("status_explain") {
        return;
    }
    let node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.92.0.0/24",
        "--cluster-pool-ipv4-mask-size",
        "30",
        "--enable-health-checking=false",
        "--k8s-node-name",
        "explain",
    ]);
    let a = node.sandbox();
    let b = node.sandbox();
    let ra = node.add(&a);
    assert_eq!(node.add(&b).code(), 101);

    let (ok, text) = podnet(&node, &["status", "--all-addresses"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("IPAM:       IPv4: 2/2 allocated from 10.92.0.0/30"),
        "{text}"
    );
    assert!(text.contains("is full"), "{text}");
    assert!(
        text.contains("(router)")
            && text.contains(&format!("{} (default/{})", ra.ipv4(), a.ns.name)),
        "{text}"
    );
    let (ok, json) = podnet(&node, &["status", "-o", "json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&json).expect("status json");
    assert_eq!(v["node"]["spec"]["ipam"]["podCIDRs"][0], "10.92.0.0/30");

    // The pod that got an address: owner, range, rule.
    let (ok, text) = podnet(&node, &["explain", &format!("default/{}", a.ns.name)]);
    assert!(ok, "{text}");
    assert!(
        text.contains(&ra.ipv4())
            && text.contains("10.92.0.0/30")
            && text.contains("ipam mode cluster-pool"),
        "{text}"
    );
    // The pod that did not: the failure and what to do.
    let (ok, text) = podnet(&node, &["explain", &format!("default/{}", b.ns.name)]);
    assert!(ok, "{text}");
    assert!(
        text.contains("range is full")
            && text.contains("Hint:")
            && text.contains("reduce pod density"),
        "{text}"
    );
    // By address and by container ID.
    assert!(podnet(&node, &["explain", &ra.ipv4()]).0);
    assert!(podnet(&node, &["explain", &a.container_id]).0);
    // Something unknown.
    let (ok, text) = podnet(&node, &["explain", "default/nobody"]);
    assert!(!ok);
    assert!(text.contains("nothing matches"), "{text}");
}

#[test]
fn the_plugin_logs_each_add_and_del_to_its_log_file() {
    if !root_or_skip("log_file") {
        return;
    }
    let node = Node::dual_stack();
    let a = node.sandbox();
    let log = node.dir.join("cni.log");
    let conf = serde_json::json!({
        "cniVersion": "1.1.0", "name": "podnet-it", "type": "podnet",
        "socket-path": node.socket(), "log-file": log,
    })
    .to_string();
    let r = node.plugin("ADD", Some(&a), &conf, &[]);
    assert!(r.ok, "{r:?}");
    assert!(node.plugin("DEL", Some(&a), &conf, &[]).ok);
    let text = std::fs::read_to_string(&log).expect("log file");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].contains(" ADD ")
            && lines[0].contains(&a.container_id)
            && lines[0].contains(&r.ipv4()),
        "{text}"
    );
    assert!(
        lines[0].contains(&format!("pod=default/{}", a.ns.name))
            && lines[0].contains("duration_ms=")
            && lines[0].contains("phases_ms=ipam-round-trip:")
            && lines[0].contains(",netlink-host:"),
        "{text}"
    );
    assert!(
        lines[1].contains(" DEL ") && lines[1].contains("ok"),
        "{text}"
    );
}
