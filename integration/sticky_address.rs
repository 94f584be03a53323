//! Sticky addresses, the operator side, on a real kube-apiserver and etcd with
//! `podnet operator --ipam multi-pool` as the real binary: a CiliumNode that asks
//! for `default/web-0` from a sticky pool gets an address, recorded in the pool
//! before its /32 is put in the node's allocated list; another node asking while
//! the first still lists the block is told `moving` naming it, and gets the same
//! address once the first gives the block back (a sampler never sees the block on
//! both nodes); two nodes asking for a new identity at once: exactly one is
//! assigned; a malformed request is refused naming it while the others are served;
//! a node asking for the sticky pool in `spec.ipam.pools.requested` gets no block;
//! a record is released by its StatefulSet's PVC retention policy (scaled down,
//! deleted) once no node holds or asks for it.
//! The CiliumNodes are written by the test as the agents would; the last test
//! runs two real agents instead.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::crossnode::{ping, pool_pod, start_node};
use crate::k8s::ControlPlane;
use crate::k8s_backend::{add_as, create_pod};
use crate::operator::{Operator, install_operator, operator_error, wait_for};

const POOL: &str = "apiVersion: cilium.io/v2alpha1
kind: CiliumPodIPPool
metadata:
  name: web
  annotations:
    ipam.podnet.io/sticky: \"true\"
spec:
  ipv4:
    cidrs: [10.77.0.0/28]
    maskSize: 32
";

/// The node's `ipam.podnet.io/sticky-status` (empty while it has none).
fn status(cp: &ControlPlane, node: &str) -> BTreeMap<String, serde_json::Value> {
    let raw = cp
        .kubectl(&[
            "get",
            "ciliumnode",
            node,
            "-o",
            "jsonpath={.metadata.annotations.ipam\\.podnet\\.io/sticky-status}",
        ])
        .stdout;
    serde_json::from_str(&raw).unwrap_or_default()
}

/// The state of `identity` in the node's status ("" while not answered).
fn state(cp: &ControlPlane, node: &str, identity: &str) -> (String, String, String) {
    let s = status(cp, node);
    let field = |f: &str| {
        s.get(identity)
            .and_then(|a| a.get(f))
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    (field("state"), field("address"), field("message"))
}

/// Every CiliumNode's blocks, in one list (a consistent snapshot).
fn all_blocks(cp: &ControlPlane) -> BTreeMap<String, Vec<String>> {
    cp.kubectl(&[
        "get",
        "ciliumnodes",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}={.spec.ipam.pools.allocated[*].cidrs[*]}{\"\\n\"}{end}",
    ])
    .stdout
    .lines()
    .filter_map(|l| l.split_once('='))
    .map(|(n, b)| (n.to_string(), b.split_whitespace().map(String::from).collect()))
    .collect()
}

/// The pool's record.
fn owners(cp: &ControlPlane) -> BTreeMap<String, String> {
    pool_annotation(cp, "sticky-owners")
}

/// The pool's annotation `ipam.podnet.io/<key>`, a JSON object of strings.
fn pool_annotation(cp: &ControlPlane, key: &str) -> BTreeMap<String, String> {
    let path = format!("jsonpath={{.metadata.annotations.ipam\\.podnet\\.io/{key}}}");
    let raw = cp
        .kubectl(&["get", "ciliumpodippool", "web", "-o", &path])
        .stdout;
    serde_json::from_str(&raw).unwrap_or_default()
}

/// `node` gives its first pool entry, `block` alone, back (as its agent does).
fn give_back(cp: &ControlPlane, node: &str, block: &str) {
    cp.kubectl(&[
        "patch",
        "ciliumnode",
        node,
        "--type=json",
        "-p",
        &format!(
            r#"[{{"op":"test","path":"/spec/ipam/pools/allocated/0/cidrs","value":["{block}"]}},{{"op":"remove","path":"/spec/ipam/pools/allocated/0"}}]"#
        ),
    ])
    .expect_ok("give the block back");
}

/// The StatefulSet `web` of the identities: 1 replica, its PVCs (and so its
/// sticky records) deleted on scale-down and on delete.
const STATEFULSET: &str = "apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web, namespace: default}
spec:
  replicas: 1
  serviceName: web
  selector: {matchLabels: {app: web}}
  persistentVolumeClaimRetentionPolicy: {whenScaled: Delete, whenDeleted: Delete}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: busybox}]}
";

fn ask(cp: &ControlPlane, node: &str, requests: &str) {
    let body = serde_json::json!({"metadata": {"annotations": {
        "ipam.podnet.io/sticky-requests": requests}}});
    cp.kubectl(&[
        "patch",
        "ciliumnode",
        node,
        "--type=merge",
        "-p",
        &body.to_string(),
    ])
    .expect_ok("ask for sticky addresses");
}

#[test]
fn a_sticky_address_is_recorded_moves_between_nodes_and_is_never_on_two() {
    const TEST: &str = "operator_sticky_address";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    cp.apply(POOL);
    for name in ["sa", "sb", "sc"] {
        cp.kubectl_stdin(
            &["create", "-f", "-"],
            &format!("apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata:\n  name: {name}\nspec: {{}}\n"),
        )
        .expect_ok("create a CiliumNode");
    }
    let mut op = Operator::start(&cp, "op-s", &sa, 9992, &["--ipam=multi-pool"]);

    // A asks for web-0: assigned, recorded, the block in A's list.
    ask(&cp, "sa", r#"{"default/web-0": "web"}"#);
    wait_for("web-0 assigned on sa", Duration::from_secs(20), || {
        state(&cp, "sa", "default/web-0").0 == "assigned"
    });
    let (_, address, _) = state(&cp, "sa", "default/web-0");
    assert_eq!(address, "10.77.0.0", "the lowest free address");
    assert_eq!(owners(&cp).get("default/web-0"), Some(&address));
    let block = format!("{address}/32");
    assert_eq!(all_blocks(&cp)["sa"], [block.as_str()]);

    // B asks while A still lists it: moving, naming A.
    ask(&cp, "sb", r#"{"default/web-0": "web"}"#);
    wait_for("web-0 moving on sb", Duration::from_secs(20), || {
        state(&cp, "sb", "default/web-0").0 == "moving"
    });
    let (_, moving_address, message) = state(&cp, "sb", "default/web-0");
    assert_eq!(moving_address, address);
    assert!(message.contains("node \"sa\""), "{message}");
    assert!(all_blocks(&cp)["sb"].is_empty());

    // A gives it back (its agent's release, the pod left A); a sampler watches
    // both nodes' lists throughout.
    let stop = AtomicBool::new(false);
    let (moved_in, samples) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut samples = 0;
            while !stop.load(Ordering::Relaxed) {
                let holders: Vec<String> = all_blocks(&cp)
                    .into_iter()
                    .filter(|(_, b)| b.contains(&block))
                    .map(|(n, _)| n)
                    .collect();
                assert!(holders.len() <= 1, "{block} on {holders:?}");
                samples += 1;
            }
            samples
        });
        ask(&cp, "sa", "{}");
        let gave_back = Instant::now();
        cp.kubectl(&[
            "patch",
            "ciliumnode",
            "sa",
            "--type=json",
            "-p",
            &format!(
                r#"[{{"op":"test","path":"/spec/ipam/pools/allocated/0/cidrs/0","value":"{block}"}},{{"op":"remove","path":"/spec/ipam/pools/allocated/0"}}]"#
            ),
        ])
        .expect_ok("give the block back");
        wait_for("web-0 assigned on sb", Duration::from_secs(20), || {
            state(&cp, "sb", "default/web-0").0 == "assigned"
        });
        let moved_in = gave_back.elapsed();
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        let samples = sampler.join().expect("the block was never on two nodes");
        (moved_in, samples)
    });
    assert_eq!(
        state(&cp, "sb", "default/web-0").1,
        address,
        "the same address"
    );
    assert_eq!(all_blocks(&cp)["sb"], [block.as_str()]);
    assert!(status(&cp, "sa").is_empty(), "sa no longer asks");
    eprintln!(
        "{TEST}: web-0's {address} moved from sa to sb {moved_in:?} after sa gave it back \
         ({samples} samples, never on two nodes)"
    );

    // Two nodes asking for a new identity at once: exactly one is assigned.
    let both = r#"{"default/web-1": "web"}"#;
    std::thread::scope(|s| {
        s.spawn(|| ask(&cp, "sa", both));
        s.spawn(|| ask(&cp, "sc", both));
    });
    wait_for("web-1 answered on both", Duration::from_secs(20), || {
        let (a, c) = (
            state(&cp, "sa", "default/web-1").0,
            state(&cp, "sc", "default/web-1").0,
        );
        !a.is_empty() && !c.is_empty() && (a == "assigned") != (c == "assigned")
    });
    let (a, c) = (
        state(&cp, "sa", "default/web-1"),
        state(&cp, "sc", "default/web-1"),
    );
    let (winner, loser) = if a.0 == "assigned" {
        (("sa", a), c)
    } else {
        (("sc", c), a)
    };
    assert_eq!(loser.0, "moving");
    assert!(
        loser.2.contains(&format!("node \"{}\"", winner.0)),
        "{}",
        loser.2
    );
    assert_eq!(winner.1.1, "10.77.0.1");
    let listing: Vec<String> = all_blocks(&cp)
        .into_iter()
        .filter(|(_, b)| b.contains(&"10.77.0.1/32".to_string()))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(listing, [winner.0]);

    // A malformed request is refused naming it; the well-formed one is served.
    ask(
        &cp,
        "sb",
        r#"{"default/web-0": "web", "web-2": "web", "default/web-3": "nope"}"#,
    );
    wait_for(
        "sb's malformed requests answered",
        Duration::from_secs(20),
        || {
            state(&cp, "sb", "web-2").0 == "refused"
                && state(&cp, "sb", "default/web-3").0 == "refused"
        },
    );
    assert!(state(&cp, "sb", "web-2").2.contains("key \"web-2\""));
    assert!(
        state(&cp, "sb", "default/web-3")
            .2
            .contains("pool \"nope\"")
    );
    assert_eq!(state(&cp, "sb", "default/web-0").0, "assigned");
    ask(&cp, "sc", "{not json");
    wait_for("sc's annotation refused", Duration::from_secs(20), || {
        state(&cp, "sc", "ipam.podnet.io/sticky-requests").0 == "refused"
    });
    assert_eq!(
        owners(&cp).len(),
        2,
        "web-0 and web-1 only: {:?}",
        owners(&cp)
    );

    // The block carving does not hand out a sticky pool's addresses.
    cp.kubectl(&[
        "patch",
        "ciliumnode",
        "sc",
        "--type=merge",
        "-p",
        r#"{"spec":{"ipam":{"pools":{"requested":[{"pool":"web","needed":{"ipv4-addrs":1}}]}}}}"#,
    ])
    .expect_ok("request the sticky pool as an ordinary pool");
    wait_for(
        "sc's operator-status error",
        Duration::from_secs(20),
        || operator_error(&cp, "sc").contains("pool is sticky"),
    );
    assert_eq!(all_blocks(&cp)["sc"].len(), usize::from(winner.0 == "sc"));

    // The records live as the StatefulSet's PVCs: whenDeleted is noted while it
    // exists; web-1 (ordinal 1 of 1 replica, whenScaled: Delete) is released
    // once no node holds or asks for it; web-0 once the StatefulSet is deleted
    // and its block is given back.
    cp.apply(STATEFULSET);
    wait_for(
        "web noted release-on-delete",
        Duration::from_secs(20),
        || pool_annotation(&cp, "sticky-release-on-delete").contains_key("default/web"),
    );
    assert!(
        owners(&cp).contains_key("default/web-1"),
        "still on {}",
        winner.0
    );
    for node in ["sa", "sc"] {
        ask(&cp, node, "{}");
    }
    give_back(&cp, winner.0, "10.77.0.1/32");
    wait_for("web-1 released", Duration::from_secs(20), || {
        !owners(&cp).contains_key("default/web-1")
    });
    cp.kubectl(&["delete", "statefulset", "web"])
        .expect_ok("delete the StatefulSet");
    std::thread::sleep(Duration::from_secs(1));
    assert!(owners(&cp).contains_key("default/web-0"), "still on sb");
    ask(&cp, "sb", "{}");
    give_back(&cp, "sb", &block);
    wait_for("web-0 released", Duration::from_secs(20), || {
        owners(&cp).is_empty()
    });
    assert!(pool_annotation(&cp, "sticky-release-on-delete").is_empty());
    let log = op.log();
    assert!(!log.contains(" WARN ") && !log.contains(" ERROR "), "{log}");
    op.stop();
}

/// Two real agents (multi-pool, tunnel routing) with the real operator: a pod
/// naming the sticky pool gets its address on st-1 and is reached from st-2;
/// recreated on st-2 while st-1 still holds the address, its ADD waits (the
/// answer `moving`) until st-1's DEL gives the block back, then gets the same
/// address, reached from st-1. A pod selecting the sticky pool by
/// `ipam.cilium.io/ip-pool`, and a pod that is not a StatefulSet's naming it,
/// are refused with code 107.
#[test]
fn agents_move_a_sticky_address_with_its_pod_and_routes_follow() {
    const TEST: &str = "agents_sticky_address";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    cp.apply(POOL);
    cp.apply(
        "apiVersion: cilium.io/v2alpha1\nkind: CiliumPodIPPool\nmetadata: {name: default}\n\
         spec:\n  ipv4: {cidrs: [10.80.0.0/16], maskSize: 27}\n",
    );
    let mut op = Operator::start(&cp, "op-s", &sa, 9993, &["--ipam=multi-pool"]);
    let args = ["--ipam", "multi-pool", "--routing-mode", "tunnel"];
    let (n1, _) = start_node(&cp, "st-1", &[], &[], &args);
    let (n2, _) = start_node(&cp, "st-2", &[], &[], &args);
    let (pinger2, _) = pool_pod(&cp, &n2, "st-2", "pinger-2", "default");
    let (pinger1, _) = pool_pod(&cp, &n1, "st-1", "pinger-1", "default");

    let sticky = "ipam.podnet.io/sticky-pool: web";
    let web0 = |node: &str| {
        cp.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-0\n  namespace: default\n  \
             annotations: {{{sticky}}}\n  ownerReferences: [{{apiVersion: apps/v1, kind: StatefulSet, \
             name: web, uid: 5ca1ab1e-0000-4000-8000-000000000001, controller: true}}]\n\
             spec:\n  nodeName: {node}\n  containers: [{{name: c, image: busybox}}]\n"
        ))
    };
    web0("st-1");
    let on_n1 = n1.sandbox();
    let r = add_as(&n1, &on_n1, "default", "web-0");
    assert!(r.ok, "web-0 on st-1: {}", r.stdout);
    let address = r.ipv4();
    assert!(address.starts_with("10.77.0."), "{address}");
    wait_for(
        "st-2 reaches web-0 on st-1",
        Duration::from_secs(20),
        || ping(&pinger2.ns, &[], &address),
    );

    // Reaching the sticky pool another way is refused.
    create_pod(
        &cp,
        "default",
        "intruder",
        "st-1",
        "ipam.cilium.io/ip-pool: web",
    );
    let r = add_as(&n1, &n1.sandbox(), "default", "intruder");
    assert_eq!(r.code(), 107, "{}", r.stdout);
    assert!(r.msg().contains("pool web is sticky"), "{}", r.msg());
    // So is a pod that is not a StatefulSet's.
    create_pod(&cp, "default", "rover", "st-1", sticky);
    let r = add_as(&n1, &n1.sandbox(), "default", "rover");
    assert_eq!(r.code(), 107, "{}", r.stdout);
    assert!(
        r.msg()
            .contains("only a StatefulSet's pods have sticky addresses"),
        "{}",
        r.msg()
    );

    // web-0 rescheduled to st-2 while st-1 still holds its address.
    cp.kubectl(&["delete", "pod", "web-0", "--grace-period=0", "--force"])
        .expect_ok("delete web-0");
    web0("st-2");
    let on_n2 = n2.sandbox();
    let (r, del_to_add, del_to_reachable) = std::thread::scope(|s| {
        let add = s.spawn(|| add_as(&n2, &on_n2, "default", "web-0"));
        wait_for("st-2 told moving", Duration::from_secs(20), || {
            state(&cp, "st-2", "default/web-0").0 == "moving"
        });
        let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0";
        let deleted = n1.plugin(
            "DEL",
            Some(&on_n1),
            &n1.conf("1.1.0"),
            &[("CNI_ARGS", args)],
        );
        assert!(deleted.ok, "DEL on st-1: {}", deleted.stdout);
        let t0 = Instant::now();
        let r = add.join().expect("the ADD on st-2");
        let del_to_add = t0.elapsed();
        wait_for(
            "st-1 reaches web-0 on st-2",
            Duration::from_secs(20),
            || ping(&pinger1.ns, &[], &address),
        );
        (r, del_to_add, t0.elapsed())
    });
    assert!(r.ok, "web-0 on st-2: {}", r.stdout);
    assert_eq!(r.ipv4(), address, "web-0 keeps its address");
    assert_eq!(
        all_blocks(&cp)["st-1"]
            .iter()
            .filter(|b| b.starts_with("10.77."))
            .count(),
        0
    );
    assert!(all_blocks(&cp)["st-2"].contains(&format!("{address}/32")));
    eprintln!(
        "{TEST}: web-0's {address} from st-1 to st-2: the ADD answered {del_to_add:?} and st-1 reached it {del_to_reachable:?} after st-1's DEL"
    );
    op.stop();
}
