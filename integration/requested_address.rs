//! A pod that asks for its addresses (`ipam.podnet.io/ip-addresses`), with the
//! real daemon and plugin in real namespaces: the embedded backend reads the Pods
//! from `--metadata-dir`. The address is given when free and inside the node's
//! ranges; otherwise the ADD fails with code 107 and says why (the holder's pod
//! and container, the node's ranges, the annotation's fault), leaving nothing
//! behind. Of many ADDs asking for one address at once exactly one wins, and a
//! daemon killed with SIGKILL still holds the address after its restart. On a
//! real API server (the Kubernetes backend) a refusal is also an Event on the Pod.

use std::path::{Path, PathBuf};

use crate::harness::*;
use crate::k8s::ControlPlane;
use crate::k8s_backend::{add_as_pod, create_node, create_pod, eventually, jsonpath, k8s_node};

const ANNOTATION: &str = "ipam.podnet.io/ip-addresses";

/// The node's ranges are exactly the pool's (one /24 and one /120).
const ARGS: [&str; 11] = [
    "--enable-ipv6",
    "--cluster-pool-ipv4-cidr",
    "10.31.0.0/24",
    "--cluster-pool-ipv4-mask-size",
    "24",
    "--cluster-pool-ipv6-cidr",
    "fd00:31::/120",
    "--cluster-pool-ipv6-mask-size",
    "120",
    "--k8s-node-name",
    "keep-node",
];

/// Writes the Pods `default/<sandbox name>` with their annotation values (an
/// empty value: no annotation) as the daemon's metadata directory.
fn write_pods(dir: &Path, pods: &[(&Sandbox, &str)]) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let mut items =
        vec!["- {apiVersion: v1, kind: Namespace, metadata: {name: default}}".to_string()];
    for (sb, value) in pods {
        let annotations = if value.is_empty() {
            String::new()
        } else {
            format!(", annotations: {{{ANNOTATION}: '{value}'}}")
        };
        items.push(format!(
            "- {{apiVersion: v1, kind: Pod, metadata: {{name: {}, namespace: default{annotations}}}}}",
            sb.ns.name
        ));
    }
    std::fs::write(
        dir.join("pods.yaml"),
        format!("apiVersion: v1\nkind: List\nitems:\n{}\n", items.join("\n")),
    )
    .expect("write pods");
}

/// A node (daemon not started) whose metadata directory is a new scratch
/// directory, returned with it.
fn node_with_metadata(prefix: &str) -> (Node, PathBuf) {
    let scratch = std::env::temp_dir().join(format!("{prefix}-{}", unique("")));
    let mut args: Vec<&str> = ARGS.to_vec();
    let dir = scratch.to_str().expect("utf-8 path");
    args.extend(["--metadata-dir", dir]);
    (Node::new(&args), scratch)
}

fn assert_refused(node: &Node, sb: &Sandbox, says: &[&str]) {
    let before = node.allocations();
    let r = node.add(sb);
    assert!(!r.ok, "{} was given an address: {}", sb.ns.name, r.stdout);
    assert_eq!(r.code(), 107, "{}", r.stdout);
    for part in says {
        assert!(r.msg().contains(part), "{part:?} in {}", r.msg());
    }
    assert!(sb.interface_gone(), "no interface is left in the sandbox");
    assert_eq!(node.allocations(), before, "nothing is allocated");
}

#[test]
fn a_pod_gets_the_addresses_it_asks_for_and_every_refusal_says_why_with_code_107() {
    if !root_or_skip("requested_address") {
        return;
    }
    let (mut node, scratch) = node_with_metadata("podnet-keep");
    let (a, b, far, junk, two, plain) = (
        node.sandbox(),
        node.sandbox(),
        node.sandbox(),
        node.sandbox(),
        node.sandbox(),
        node.sandbox(),
    );
    write_pods(
        &scratch,
        &[
            (&a, "10.31.0.50,fd00:31::50"),
            (&b, "10.31.0.50"),
            (&far, "10.99.0.1"),
            (&junk, "web-0"),
            (&two, "10.31.0.60,10.31.0.61"),
            (&plain, ""),
        ],
    );
    node.start_daemon();

    let r = node.add(&a);
    assert!(r.ok, "{}", r.stdout);
    assert_eq!(
        (r.ipv4(), r.ipv6()),
        ("10.31.0.50".into(), "fd00:31::50".into())
    );
    let kernel = a.kernel_addresses();
    assert!(kernel.contains(&"10.31.0.50".to_string()), "{kernel:?}");
    let p = node.add(&plain);
    assert!(p.ok && p.ipv4().starts_with("10.31.0.") && p.ipv4() != "10.31.0.50");
    assert!(
        plain.ping("10.31.0.50"),
        "the pod is reachable at its address"
    );

    let holder = format!(
        "taken by pod default/{} (container {}",
        a.ns.name, a.container_id
    );
    assert_refused(&node, &b, &["10.31.0.50", &holder, "keep-node"]);
    assert_refused(
        &node,
        &far,
        &[
            "10.99.0.1",
            "outside node keep-node's IPv4 ranges (10.31.0.0/24)",
        ],
    );
    assert_refused(
        &node,
        &junk,
        &[ANNOTATION, "\"web-0\" is not an IP address"],
    );
    assert_refused(&node, &two, &["names two IPv4 addresses"]);

    let ex = node.client().explain("10.31.0.50").expect("explain");
    assert!(ex.addresses[0].rule.contains(ANNOTATION), "{ex:?}");
    let ex = node
        .client()
        .explain(&format!("default/{}", b.ns.name))
        .expect("explain");
    assert!(
        ex.failures.iter().any(|f| f.reason == "address-taken"),
        "{ex:?}"
    );

    // A crash: the journal has the address, the restarted daemon holds it.
    node.stop_daemon(true);
    node.start_daemon();
    let owner = node.allocations().get("10.31.0.50").cloned();
    assert_eq!(
        owner,
        Some(format!("default/{} [restored]", a.ns.name)),
        "{:?}",
        node.allocations()
    );
    assert_refused(&node, &b, &[&holder]);

    // Released, it cools down for other pods.
    assert!(node.del(&a).ok);
    // (Its host link may still be going: then the message says so instead.)
    let released = format!("was released by default/{}", a.ns.name);
    assert_refused(&node, &b, &[&released]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !node.add(&b).msg().contains("cools down for") {
        assert!(std::time::Instant::now() < deadline, "the teardown ends");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_refused(&node, &b, &[&released, "cools down for"]);
    let _ = std::fs::remove_dir_all(scratch);
}

#[test]
fn of_eight_pods_asking_for_one_address_at_once_exactly_one_wins() {
    if !root_or_skip("requested_address_race") {
        return;
    }
    let (mut node, scratch) = node_with_metadata("podnet-keep-race");
    let sbs: Vec<Sandbox> = (0..8).map(|_| node.sandbox()).collect();
    let pods: Vec<(&Sandbox, &str)> = sbs.iter().map(|sb| (sb, "10.31.0.77")).collect();
    write_pods(&scratch, &pods);
    node.start_daemon();
    let refs: Vec<&Sandbox> = sbs.iter().collect();
    let results = node.plugin_parallel("ADD", &refs, 8);
    let winners: Vec<usize> = (0..results.len()).filter(|i| results[*i].ok).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let winner = &sbs[winners[0]];
    assert_eq!(results[winners[0]].ipv4(), "10.31.0.77");
    for (i, r) in results.iter().enumerate() {
        if i == winners[0] {
            continue;
        }
        assert_eq!(r.code(), 107, "{}", r.stdout);
        assert!(
            r.msg().contains(&format!(
                "taken by pod default/{} (container {}",
                winner.ns.name, winner.container_id
            )),
            "{}",
            r.msg()
        );
        assert!(sbs[i].interface_gone());
    }
    let held: Vec<String> = node
        .allocations()
        .into_iter()
        .filter(|(ip, _)| ip == "10.31.0.77")
        .map(|(_, owner)| owner)
        .collect();
    assert_eq!(held, [format!("default/{}", winner.ns.name)]);
    let _ = std::fs::remove_dir_all(scratch);
}

#[test]
fn on_a_real_api_server_a_refused_address_is_an_event_on_the_pod() {
    let Some(cp) = ControlPlane::start("k8s_requested_address") else {
        return;
    };
    cp.install_crds();
    let ns = cp.add_node_ns("ka-1");
    create_node(&cp, &ns, &["10.244.7.0/24"]);
    let name = ns.name.clone();
    create_pod(
        &cp,
        "default",
        "web-0",
        &name,
        &format!("{ANNOTATION}: 10.244.7.40"),
    );
    create_pod(
        &cp,
        "default",
        "web-1",
        &name,
        &format!("{ANNOTATION}: 10.244.7.40"),
    );
    create_pod(
        &cp,
        "default",
        "far",
        &name,
        &format!("{ANNOTATION}: 10.9.9.9"),
    );
    let mut node = k8s_node(ns, &cp.kubeconfig(), &["--ipam", "kubernetes"]);
    node.start_daemon();
    // The annotation is read from the agent's Pod watch: wait until it listed.
    eventually("the pod watch synced", || {
        let st = node.client().healthz().expect("healthz");
        st.ipam
            .backend
            .is_some_and(|b| b.watches.get("pods") == Some(&true))
    });
    let (sb0, sb1, sbf) = (node.sandbox(), node.sandbox(), node.sandbox());
    let r = add_as_pod(&cp, &node, &sb0, "web-0");
    assert!(r.ok, "{}", r.stdout);
    assert_eq!(r.ipv4(), "10.244.7.40");

    let r = add_as_pod(&cp, &node, &sb1, "web-1");
    assert_eq!(r.code(), 107, "{}", r.stdout);
    let holder = format!("taken by pod default/web-0 (container {}", sb0.container_id);
    assert!(r.msg().contains(&holder), "{}", r.msg());
    let uid = jsonpath(&cp, "pod", "web-1", "{.metadata.uid}");
    eventually("the Event on web-1", || {
        cp.pod_events("web-1").lines().any(|l| {
            l.starts_with("RequestedAddressRefused|") && l.contains(&holder) && l.ends_with(&uid)
        })
    });

    let r = add_as_pod(&cp, &node, &sbf, "far");
    assert_eq!(r.code(), 107, "{}", r.stdout);
    eventually("the Event on far", || {
        cp.pod_events("far").contains("outside node")
            && cp.pod_events("far").contains("IPv4 ranges (10.244.7.0/24)")
    });
    assert!(
        cp.pod_events("web-0").is_empty(),
        "no Event on the pod that got its address"
    );
}
