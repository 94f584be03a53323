//! The agent's leak check (`POST /v1/ipam/leak-check`, `--ipam-release-leaked-after`)
//! with the real daemon: against a real kube-apiserver (integration/k8s.rs) an
//! allocation whose Pod is deleted and whose sandbox is gone is reported (status,
//! explain, metrics, an Event on the Node) and released in a later check, one
//! whose host link exists is kept, and nothing is released while the API server
//! is down; on a backend without an API server the route says why it cannot run.

use std::time::{Duration, Instant};

use podnet::api::client::ClientError;
use serde_json::Value;

use crate::harness::*;
use crate::k8s::ControlPlane;
use crate::k8s_backend::{
    add_with_uid, create_node, create_sandbox_pods, eventually, jsonpath, k8s_node,
};

const ROUTE: &str = "/v1/ipam/leak-check";

/// `POST /v1/ipam/leak-check`: the check's status, or the HTTP status and message.
fn check_now(node: &Node) -> Result<Value, (u16, String)> {
    match node.client().call("POST", ROUTE, &[], None) {
        Ok(r) => Ok(serde_json::from_slice(&r.body).expect("a leak-check status")),
        Err(ClientError::Status {
            status, message, ..
        }) => Err((status, message)),
        Err(e) => panic!("{ROUTE}: {e}"),
    }
}

/// A check once the API server answers again (the client's first request
/// after a restart of the API server may still meet the old connection: 503).
fn check_once_listed(node: &Node) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match check_now(node) {
            Ok(status) => return status,
            Err((503, message)) if Instant::now() < deadline => {
                eprintln!("leak check not listed yet: {message}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("no check once the API server is back: {e:?}"),
        }
    }
}

/// The findings of a check: (ip, verdict).
fn verdicts(status: &Value) -> Vec<(String, String)> {
    status["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| {
            (
                f["ip"].as_str().unwrap_or_default().to_string(),
                f["verdict"]["verdict"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

#[test]
fn without_an_api_server_the_route_says_the_leak_check_needs_the_kubernetes_backend() {
    if !root_or_skip("leak_check_without_api_server") {
        return;
    }
    let mut node = Node::new(&[]);
    node.start_daemon();
    let (status, message) = check_now(&node).expect_err("no leak check on the embedded backend");
    assert_eq!(status, 409, "{message}");
    assert!(
        message.contains("the leak check needs the Kubernetes backend (this daemon's is embedded)"),
        "{message}"
    );
    let health = node.client().healthz().expect("healthz");
    assert_eq!(health.ipam.leak_check, None);
    assert!(!node.podnet(&["status"]).contains("Leak check"));
}

#[test]
fn a_gone_pods_leak_is_reported_then_released_and_nothing_while_the_api_server_is_down() {
    let Some(mut cp) = ControlPlane::start("k8s_leak_check") else {
        return;
    };
    cp.install_crds();
    let ns = cp.add_node_ns("leak-1");
    create_node(&cp, &ns, &["10.244.9.0/24"]);
    let node_name = ns.name.clone();
    let mut node = k8s_node(
        ns,
        &cp.kubeconfig(),
        &[
            "--ipam",
            "kubernetes",
            "--ipam-leak-check-interval",
            "0",
            "--ipam-leak-grace",
            "0s",
            "--ipam-release-leaked-after",
            "1ms",
        ],
    );
    node.start_daemon();

    // Three pods: one runs on; one is deleted and its sandbox goes (the leak);
    // one is deleted but its sandbox stays (the runtime still has it: kept).
    let (running, gone, linked) = (node.sandbox(), node.sandbox(), node.sandbox());
    let sandboxes = [running, gone, linked];
    create_sandbox_pods(&cp, &node_name, &sandboxes);
    let mut ips = Vec::new();
    for sb in &sandboxes {
        let r = add_with_uid(&cp, &node, sb);
        let uid = jsonpath(&cp, "pod", &sb.ns.name, "{.metadata.uid}");
        // The host link's marker carries the UID (a rebuild from the kernel keeps it).
        let host_link = podnet::datapath::host_ifname(&sb.container_id, &sb.ifname);
        let alias = node.link_alias(&host_link).unwrap_or_default();
        assert!(alias.ends_with(&format!(" u={uid}")), "{alias}");
        ips.push(r.ipv4());
    }
    let [running, mut gone, linked] = sandboxes;
    let (running_ip, gone_ip, linked_ip) = (&ips[0], &ips[1], &ips[2]);
    for pod in [&gone.ns.name, &linked.ns.name] {
        cp.kubectl(&["delete", "pod", pod, "--grace-period=0", "--force"])
            .expect_ok("delete the Pod");
    }
    gone.ns.delete();
    assert!(
        node.host_links_down_to(2),
        "the gone sandbox's host link stays"
    );

    // The first check finds the leak and the kept one, and releases nothing.
    let status = check_now(&node).expect("a check");
    assert_eq!(
        verdicts(&status),
        [
            (gone_ip.clone(), "leak".to_string()),
            (linked_ip.clone(), "host-link-present".to_string())
        ]
    );
    assert_eq!(status["pods"], 1, "{status}");
    assert_eq!(status["released"], 0, "{status}");
    let leak = &status["findings"][0];
    assert_eq!(leak["pod_gone"]["reason"], "no-pod", "{leak}");
    assert!(leak["release-at-ms"].as_u64().is_some(), "{leak}");
    let text = node.podnet(&["status"]);
    assert!(
        text.contains("State:      Warning (") && text.contains("1 leaked allocation ("),
        "{text}"
    );
    assert!(
        text.contains("Leak check: on demand only, grace 0s"),
        "{text}"
    );
    let explained = node.podnet(&["explain", gone_ip]);
    assert!(
        explained.contains("Leak check: ")
            && explained.contains("is gone: leaked; a leak in every check since"),
        "{explained}"
    );
    assert!(node.metrics().contains("podnet_ipam_leaks 1\n"));
    eventually("the IPAMLeak Event on the Node", || {
        cp.kubectl(&[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            &format!("reason=IPAMLeak,involvedObject.name={node_name}"),
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .expect_ok("events")
        .contains(gone_ip.as_str())
    });

    // While the API server is down: no report, nothing released.
    cp.stop_apiserver(true);
    let (code, message) = check_now(&node).expect_err("no list without the API server");
    assert_eq!(code, 503, "{message}");
    assert!(
        message.contains("nothing was observed and nothing released"),
        "{message}"
    );
    assert!(node.allocations().contains_key(gone_ip.as_str()));
    assert!(
        node.podnet(&["status"])
            .contains("not checking: listing the Pods of node")
    );

    // Back: the leak was one in every check since the first: released; the
    // allocation whose host link exists is never released this way.
    cp.start_apiserver();
    let status = check_once_listed(&node);
    assert_eq!(status["released"], 1, "{status}");
    assert_eq!(
        verdicts(&status),
        [(linked_ip.clone(), "host-link-present".to_string())]
    );
    let allocations = node.allocations();
    assert!(!allocations.contains_key(gone_ip.as_str()));
    assert!(allocations.contains_key(linked_ip.as_str()));
    assert!(allocations.contains_key(running_ip.as_str()));
    assert!(
        node.metrics()
            .contains("podnet_ipam_leaks_released_total 1\n")
    );
    assert!(
        node.log()
            .contains("leak check: released a leaked allocation")
    );
    assert!(linked.ns.exec(&["true"]).status.success());
    assert!(node.del(&running).ok);
}
