//! The cluster-wide duplicate check on a real kube-apiserver and etcd
//! (integration/k8s.rs): Pods with `spec.nodeName` set and their addresses
//! patched into `status.podIPs` (no kubelet runs), and CiliumNodes the operator
//! leaves alone (`ipam.cilium.io/ignore`), planted with two Pods of one IP, a
//! Pod IP outside its node's range and a node CIDR overlapping another node's,
//! one of them publishing its allocations (`status.ipam.used`, as in crd mode).
//! `podnet ipam check` as the admin names the three findings and a leak an
//! agent reported on its Node (an `IPAMLeak` Event) (exit 1, and 0 once they
//! are gone and the leak's `IPAMLeakReleased` is there); `podnet operator`, the real binary with the
//! least-privilege ServiceAccount of deploy/operator.yaml, reports them as
//! Events on the Pods and CiliumNodes, counts them in
//! `podnet_operator_ipam_findings` until they are gone, and `podnet operator
//! status` lists them.

use std::process::Command;
use std::time::Duration;

use crate::harness::*;
use crate::k8s::ControlPlane;
use crate::operator::{Operator, install_operator, operator_status, wait_for};

/// A CiliumNode with these podCIDRs, ignored by the operator's allocator.
fn plant_node(cp: &ControlPlane, name: &str, cidr: &str) {
    cp.kubectl_stdin(
        &["create", "-f", "-"],
        &format!(
            "apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata:\n  name: {name}\n\
             \x20 annotations: {{ipam.cilium.io/ignore: \"true\"}}\n\
             spec:\n  ipam:\n    podCIDRs: [{cidr}]\n"
        ),
    )
    .expect_ok("create a CiliumNode");
}

/// A running Pod `default/<name>` on `node` with `ip` (in status, as a kubelet
/// would write it).
fn plant_pod(cp: &ControlPlane, name: &str, node: &str, ip: &str, host_network: bool) {
    cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\n\
         spec: {{nodeName: {node}, hostNetwork: {host_network}, containers: [{{name: c, image: busybox}}]}}\n"
    ));
    cp.set_pod_ip(name, ip);
}

/// `podnet ipam check` as the admin: (exit code, stdout, stderr).
fn ipam_check(cp: &ControlPlane, args: &[&str]) -> (i32, String, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", cp.netns(), podnet_bin(), "ipam", "check"])
        .arg("--kubeconfig")
        .arg(cp.kubeconfig())
        .args(args)
        .output()
        .expect("running podnet ipam check");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Every Event podnet-operator published (events.k8s.io), in any namespace.
fn published(cp: &ControlPlane) -> Vec<serde_json::Value> {
    let json = cp
        .kubectl(&["get", "events.events.k8s.io", "-A", "-o", "json"])
        .expect_ok("list events");
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["reportingController"] == "podnet-operator")
        .cloned()
        .collect()
}

/// The notes of the operator's Events on the object named `name`.
fn operator_event_notes(cp: &ControlPlane, name: &str) -> Vec<String> {
    published(cp)
        .iter()
        .filter(|e| e["regarding"]["name"] == name)
        .map(|e| e["note"].as_str().unwrap_or("").to_string())
        .collect()
}

/// `(reason, regarding kind, regarding name)` of the operator's Events.
fn operator_events(cp: &ControlPlane) -> Vec<(String, String, String)> {
    let mut events: Vec<(String, String, String)> = published(cp)
        .iter()
        .map(|e| {
            let field = |f: &serde_json::Value| f.as_str().unwrap_or("").to_string();
            (
                field(&e["reason"]),
                field(&e["regarding"]["kind"]),
                field(&e["regarding"]["name"]),
            )
        })
        .collect();
    events.sort();
    events
}

/// A leak Event as an agent posts it on its Node (reason `IPAMLeak`, or
/// `IPAMLeakReleased` with the note after "released: "), at `time`.
fn plant_leak_event(
    cp: &ControlPlane,
    name: &str,
    node: &str,
    reason: &str,
    note: &str,
    time: &str,
) {
    cp.kubectl_stdin(
        &["create", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Event\nmetadata:\n  name: {name}\n  namespace: default\n\
             involvedObject: {{apiVersion: v1, kind: Node, name: {node}}}\n\
             reason: {reason}\nmessage: \"{note}\"\ntype: Warning\n\
             firstTimestamp: \"{time}\"\nlastTimestamp: \"{time}\"\n\
             source: {{component: podnet-agent}}\n"
        ),
    )
    .expect_ok("create the leak Event");
}

const LEAK_NOTE: &str = "10.93.0.9 (default/old, allocated 900s ago): no pod of that name on this node (compared by name: the allocation recorded no UID); host link lxcabc is gone: leaked";

const SAME_IP: &str =
    "DuplicatePodIP: 10.93.0.7 is the IP of 2 pods: default/web-1 on dup-a, default/web-2 on dup-a";
const OVERLAP: &str = "OverlappingNodeRanges: ranges on more than one CiliumNode overlap: 10.93.0.0/24 (podCIDR) on dup-a, 10.93.0.0/25 (podCIDR) on dup-b";
const OUTSIDE: &str = "PodIPOutsideNodeRanges: pod default/stray on dup-c has 10.99.0.1, outside every range of CiliumNode dup-c: 10.93.1.0/24 (podCIDR)";

#[test]
fn duplicates_are_found_by_ipam_check_and_reported_by_the_operator() {
    const TEST: &str = "ipam_duplicates";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    plant_node(&cp, "dup-a", "10.93.0.0/24");
    plant_node(&cp, "dup-b", "10.93.0.0/25");
    plant_node(&cp, "dup-c", "10.93.1.0/24");
    plant_pod(&cp, "web-1", "dup-a", "10.93.0.7", false);
    plant_pod(&cp, "web-2", "dup-a", "10.93.0.7", false);
    plant_pod(&cp, "fine", "dup-c", "10.93.1.5", false);
    plant_pod(&cp, "stray", "dup-c", "10.99.0.1", false);
    // Host-network pods share the node's address: never a finding.
    plant_pod(&cp, "host-1", "dup-c", "192.0.2.10", true);
    plant_pod(&cp, "host-2", "dup-c", "192.0.2.10", true);

    // dup-c publishes its allocations as a crd-mode agent does: one of them
    // for a pod that is gone.
    cp.kubectl(&[
        "patch",
        "ciliumnode",
        "dup-c",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"ipam":{"used":{"10.93.1.5":{"owner":"default/fine","resource":"c-fine"},"10.93.1.6":{"owner":"default/gone","resource":"c-gone"}}}}}"#,
    ])
    .expect_ok("patch the CiliumNode's status");

    // dup-a's agent reported a leak and has not released it.
    plant_leak_event(
        &cp,
        "leak-1",
        "dup-a",
        "IPAMLeak",
        LEAK_NOTE,
        "2026-01-01T00:00:00Z",
    );

    let (code, out, err) = ipam_check(&cp, &[]);
    eprintln!("{TEST}: podnet ipam check:\n{out}{err}");
    assert_eq!(code, 1, "{err}");
    let findings: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("Findings: "))
        .collect();
    assert_eq!(
        findings,
        [
            "Findings: 3",
            &format!("  {SAME_IP}"),
            &format!("  {OUTSIDE}"),
            &format!("  {OVERLAP}"),
            "Leaks reported by the agents, not released: 1",
        ],
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "  LEAK (reported by the agent at 2026-01-01T00:00:00Z): {LEAK_NOTE}\nNode dup-b\n"
        )),
        "{out}"
    );
    assert!(
        out.contains("Node dup-c\n  ranges:      10.93.1.0/24 (podCIDR)\n"),
        "{out}"
    );
    assert!(out.contains("    default/stray 10.99.0.1\n"), "{out}");
    assert!(
        out.contains(
            "  allocations: 2 in status.ipam.used\n\
             \x20   pod gone: 10.93.1.6 (default/gone, container c-gone): no pod of that name on this node"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "    pod IPs not among them (the agent publishes at its update rate): 10.99.0.1\n"
        ),
        "{out}"
    );
    assert!(!out.contains("host-1"), "{out}");
    let (code, out, err) = ipam_check(&cp, &["-o", "json"]);
    assert_eq!(code, 1, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let kinds: Vec<&str> = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["kind"].as_str())
        .collect();
    assert_eq!(
        kinds,
        ["same-ip", "outside-node-ranges", "range-on-two-nodes"]
    );

    // The operator, checking every second: each finding confirmed by a second
    // check, then reported.
    let op = Operator::start(
        &cp,
        "op-d",
        &sa,
        9981,
        &[
            "--cluster-pool-ipv4-cidr",
            "10.90.0.0/16",
            "--ipam-duplicate-check-interval",
            "1s",
        ],
    );
    let findings =
        |kind: &str| op.metric(&format!("podnet_operator_ipam_findings{{kind=\"{kind}\"}}"));
    wait_for("the operator's findings", Duration::from_secs(20), || {
        ["same-ip", "outside-node-ranges", "range-on-two-nodes"]
            .iter()
            .all(|k| findings(k) == Some(1.0))
    });
    let want = [
        ("DuplicatePodIP", "Pod", "web-1"),
        ("DuplicatePodIP", "Pod", "web-2"),
        ("OverlappingNodeRanges", "CiliumNode", "dup-a"),
        ("OverlappingNodeRanges", "CiliumNode", "dup-b"),
        ("PodIPOutsideNodeRanges", "CiliumNode", "dup-c"),
        ("PodIPOutsideNodeRanges", "Pod", "stray"),
    ]
    .map(|(r, k, n)| (r.to_string(), k.to_string(), n.to_string()));
    wait_for("the operator's Events", Duration::from_secs(10), || {
        operator_events(&cp) == want
    });
    let notes = operator_event_notes(&cp, "web-1");
    assert_eq!(notes, [SAME_IP.split_once(": ").expect("reason").1]);
    // `podnet operator status` lists them (as the operator's ServiceAccount).
    let (code, out, err) = operator_status(&cp, &sa, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.ends_with(&format!(
            "Findings:   3\n  {SAME_IP}\n  {OUTSIDE}\n  {OVERLAP}\n"
        )),
        "{out}"
    );

    // Gone: the gauge follows, the check is clean, no Event is added.
    cp.kubectl(&[
        "delete",
        "pod",
        "web-2",
        "stray",
        "--grace-period=0",
        "--force",
    ])
    .expect_ok("delete the pods");
    cp.kubectl(&["delete", "ciliumnode", "dup-b"])
        .expect_ok("delete the CiliumNode");
    wait_for("no finding left", Duration::from_secs(10), || {
        ["same-ip", "outside-node-ranges", "range-on-two-nodes"]
            .iter()
            .all(|k| findings(k) == Some(0.0))
    });
    assert_eq!(operator_events(&cp), want);
    assert!(
        op.metric("podnet_operator_ipam_checks_total{result=\"ok\"}")
            .is_some_and(|n| n >= 3.0)
    );
    // The agent released it a minute later.
    plant_leak_event(
        &cp,
        "leak-1-released",
        "dup-a",
        "IPAMLeakReleased",
        &format!("released: {LEAK_NOTE}"),
        "2026-01-01T00:01:00Z",
    );
    let (code, out, err) = ipam_check(&cp, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.ends_with("Findings: none\nLeaks reported by the agents, not released: none\n"),
        "{out}"
    );
    drop(op);
}
