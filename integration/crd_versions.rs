//! podnet on the CRDs cilium-operator v1.20.2 registers (fixtures in
//! integration/fixtures/cilium-1.20.2-crds: `ciliumpodippools` served at v2alpha1
//! only) and on podnet's own (deploy/crds: pools at v2 and v2alpha1): the
//! multi-pool operator and a real node daemon find each kind's version by API
//! discovery, list the pools (one auto-created at the served version), carve and
//! take blocks, select a pool by a Pod annotation and take a freed block back.
//! A daemon and an operator started before the pool CRD exists wait for it and
//! say so (log, `podnet status` with exit 1), then serve once it is installed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::harness::*;
use crate::k8s::{CRDS, ControlPlane};
use crate::k8s_backend::{add_as, create_pod, jsonpath};
use crate::operator::{Operator, install_operator_rbac, wait_for};
use crate::operator_pools::{ONE_BLOCK_NO_COOLDOWN, spawn_multi_pool_node};

/// The fixture directory of Cilium 1.20.2's CRDs.
fn cilium_1_20_2() -> PathBuf {
    repo_path("integration/fixtures/cilium-1.20.2-crds")
}

/// The CRDs cilium-operator v1.20.2 registers.
const CILIUM_1_20_2_CRDS: [&str; 5] = [
    "ciliumnodes.cilium.io",
    "ciliumpodippools.cilium.io",
    "ciliumnodeconfigs.cilium.io",
    "ciliumloadbalancerippools.cilium.io",
    "ciliumcidrgroups.cilium.io",
];

/// A field of an object, empty while the object does not exist.
fn field(cp: &ControlPlane, kind: &str, name: &str, path: &str) -> String {
    cp.kubectl(&["get", kind, name, "-o", &format!("jsonpath={path}")])
        .stdout
}

/// The node's blocks of `pool` (none while it has no CiliumNode).
fn blocks_of(cp: &ControlPlane, node: &str, pool: &str) -> Vec<String> {
    let path = format!("{{.spec.ipam.pools.allocated[?(@.pool==\"{pool}\")].cidrs[*]}}");
    field(cp, "ciliumnode", node, &path)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// ADD as pod `default/<pod>`, retried while the node waits for a block or its
/// Pod cache; the pod's IPv4 address.
fn add_pod(node: &Node, sb: &Sandbox, pod: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = add_as(node, sb, "default", pod);
        if r.ok {
            return r.ipv4();
        }
        assert!(Instant::now() < deadline, "{pod}: {}", r.stdout);
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `podnet status` on the node: exit code and stdout + stderr.
fn status(node: &Node) -> (Option<i32>, String) {
    let out = node.ns.exec(&[
        podnet_bin(),
        "status",
        "--socket",
        node.socket().to_str().expect("socket"),
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// The multi-pool operator (no CRD registration: the test installs them).
fn start_operator(cp: &ControlPlane, port: u16) -> Operator {
    let sa = install_operator_rbac(cp);
    Operator::start(
        cp,
        "op-v",
        &sa,
        port,
        &[
            "--ipam=multi-pool",
            "--skip-crd-creation",
            "--auto-create-cilium-pod-ip-pools=default=ipv4-cidrs:10.71.0.0/24;ipv4-mask-size:28",
        ],
    )
}

/// The whole multi-pool round on whatever CRDs `cp` has: `pool_version` is the
/// apiVersion the pools must be stored and read at.
fn multi_pool_round(test: &str, cp: &ControlPlane, port: u16, pool_version: &str) {
    let op = start_operator(cp, port);
    // A second pool, written at v2alpha1 (served by both CRD sets).
    cp.apply(
        "apiVersion: cilium.io/v2alpha1\nkind: CiliumPodIPPool\nmetadata: {name: mars}\n\
         spec:\n  ipv4: {cidrs: [10.72.0.0/24], maskSize: 28}\n",
    );
    wait_for("the auto-created pool", Duration::from_secs(15), || {
        field(cp, "ciliumpodippool", "default", "{.spec.ipv4.cidrs}").contains("10.71.0.0/24")
    });
    assert_eq!(
        jsonpath(cp, "ciliumpodippool", "default", "{.apiVersion}"),
        pool_version
    );
    let (mut node, name) = spawn_multi_pool_node(cp, "cv-1", ONE_BLOCK_NO_COOLDOWN);
    wait_for(
        "a block of the default pool",
        Duration::from_secs(20),
        || blocks_of(cp, &name, "default").len() == 1,
    );
    node.wait_ready();

    // Pool selection by annotation: mars's block comes on demand.
    let (plain, annotated) = (node.sandbox(), node.sandbox());
    create_pod(cp, "default", "plain", &name, "");
    create_pod(
        cp,
        "default",
        "annotated",
        &name,
        "ipam.cilium.io/ip-pool: mars",
    );
    let ip = add_pod(&node, &plain, "plain");
    assert!(ip.starts_with("10.71.0."), "{ip}");
    let ip = add_pod(&node, &annotated, "annotated");
    assert!(ip.starts_with("10.72.0."), "{ip}");
    let mars = blocks_of(cp, &name, "mars");
    assert_eq!(mars.len(), 1, "{mars:?}");
    assert!(
        op.log().contains("pool definitions in force") && op.log().contains("\"mars\""),
        "{}",
        op.log()
    );

    // Release: the mars pod goes, its block goes back to the operator.
    let r = node.del(&annotated);
    assert!(r.ok, "{}", r.stdout);
    wait_for("mars's block given back", Duration::from_secs(20), || {
        blocks_of(cp, &name, "mars").is_empty()
    });
    assert!(node.log().contains("gave blocks back to the operator"));
    let r = node.del(&plain);
    assert!(r.ok, "{}", r.stdout);

    let (code, text) = status(&node);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("pools synced"), "{text}");
    // Nothing asked for a version the CRD does not serve (the API server's 404).
    for log in [node.log(), op.log()] {
        assert!(!log.contains("page not found"), "{test}: {log}");
    }
    drop(node);
    drop(op);
}

#[test]
fn multi_pool_on_cilium_1_20_2_crds() {
    const TEST: &str = "crd_versions_cilium";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    cp.install_crd_files(&cilium_1_20_2(), &CILIUM_1_20_2_CRDS);
    multi_pool_round(TEST, &cp, 9961, "cilium.io/v2alpha1");
}

#[test]
fn multi_pool_on_podnets_crds() {
    const TEST: &str = "crd_versions_podnet";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    cp.install_crd_files(&repo_path("deploy/crds"), &CRDS);
    multi_pool_round(TEST, &cp, 9962, "cilium.io/v2");
}

#[test]
fn a_pool_crd_installed_after_the_start_is_waited_for() {
    const TEST: &str = "crd_versions_late";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let fixtures = cilium_1_20_2();
    for crd in ["ciliumnodes", "ciliumnodeconfigs"] {
        cp.install_crd_files(
            &fixtures.join(format!("{crd}.yaml")),
            &[&format!("{crd}.cilium.io")],
        );
    }
    let op = start_operator(&cp, 9963);
    let (mut node, name) = spawn_multi_pool_node(&cp, "cv-2", ONE_BLOCK_NO_COOLDOWN);
    let awaited = "CRD ciliumpodippools.cilium.io at v2 or v2alpha1 (not installed)";
    wait_for(
        "the daemon to say what it waits for",
        Duration::from_secs(20),
        || {
            let (code, text) = status(&node);
            code == Some(1)
                && text.contains(&format!(
                    "the daemon is starting and does not serve yet: waiting for {awaited}"
                ))
        },
    );
    assert!(
        node.log().contains(&format!("waiting for {awaited}")),
        "{}",
        node.log()
    );
    wait_for("the operator to wait too", Duration::from_secs(10), || {
        op.log().contains(&format!("waiting for {awaited}"))
    });

    cp.install_crd_files(
        &fixtures.join("ciliumpodippools.yaml"),
        &["ciliumpodippools.cilium.io"],
    );
    let t = Instant::now();
    node.wait_ready();
    eprintln!(
        "{TEST}: pool CRD installed to the daemon serving: {:?}",
        t.elapsed()
    );
    assert_eq!(blocks_of(&cp, &name, "default").len(), 1);
    let sb = node.sandbox();
    create_pod(&cp, "default", "late", &name, "");
    let ip = add_pod(&node, &sb, "late");
    assert!(ip.starts_with("10.71.0."), "{ip}");
    let (code, text) = status(&node);
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("waiting for"), "{text}");
    let r = node.del(&sb);
    assert!(r.ok, "{}", r.stdout);
    drop(node);
    drop(op);
}
