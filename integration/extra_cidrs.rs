//! Extra cluster-pool CIDRs on a real kube-apiserver and etcd (integration/k8s.rs),
//! with the real agent and the real operator: a node filled past
//! `cluster-pool-depletion-threshold` says `depleted` in `status.ipam.pod-cidrs`,
//! the operator appends a CIDR and the agent hands out addresses from it; with
//! the pool empty the node gets an Event and a status line naming the pool and
//! the node, and keeps serving what it has; drained, the extra CIDR is released
//! by the agent and taken off the node by the operator, the first one never.

use std::time::{Duration, Instant};

use crate::harness::*;
use crate::k8s::ControlPlane;
use crate::k8s_backend::{create_node, jsonpath, k8s_node};
use crate::operator::{
    Operator, install_operator, node_events as events, operator_error, operator_status, wait_for,
};

const FIRST: &str = "10.93.0.0/28";
const EXTRA: &str = "10.93.0.16/28";

fn pod_cidrs(cp: &ControlPlane, node: &str) -> String {
    jsonpath(cp, "ciliumnode", node, "{.spec.ipam.podCIDRs}")
}

fn cidr_status(cp: &ControlPlane, node: &str) -> String {
    jsonpath(cp, "ciliumnode", node, "{.status.ipam.pod-cidrs}")
}

/// A pod added on `node`, kept in `pods`; its IPv4 address.
fn add(node: &Node, pods: &mut Vec<(Sandbox, String)>) -> String {
    let sb = node.sandbox();
    let r = node.add(&sb);
    assert!(r.ok, "ADD: {}", r.stdout);
    let ip = r.ipv4();
    pods.push((sb, ip.clone()));
    ip
}

fn in_cidr(ip: &str, cidr: &str) -> bool {
    let ip: std::net::IpAddr = ip.parse().expect("an address");
    cidr.parse::<ipnet::IpNet>().expect("a CIDR").contains(&ip)
}

#[test]
fn a_full_node_gets_another_cidr_serves_from_it_and_gives_it_back_drained() {
    const TEST: &str = "extra_cidrs";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    let ns = cp.add_node_ns("xc-1");
    let name = ns.name.clone();
    create_node(&cp, &ns, &[]);
    // 25%: a /28 (14 usable) is depleted at 11 held (router, health, 9 pods);
    // two at 22. The extra goes back once 7 of the first stay free without it.
    let mut node = k8s_node(
        ns,
        &cp.kubeconfig(),
        &[
            "--ipam",
            "cluster-pool",
            "--cluster-pool-depletion-threshold",
            "25",
            "--cluster-pool-cidr-release-delay",
            "2s",
            "--ipam-release-cooldown",
            "0s",
        ],
    );
    node.spawn_daemon();
    // 10.93.0.0/27 in /28s: the node's first CIDR and one extra, no more.
    let op = Operator::start(
        &cp,
        "op-x",
        &sa,
        9975,
        &[
            "--cluster-pool-ipv4-cidr",
            "10.93.0.0/27",
            "--cluster-pool-ipv4-mask-size",
            "28",
        ],
    );
    node.wait_ready();
    assert_eq!(pod_cidrs(&cp, &name), format!("[\"{FIRST}\"]"));

    let mut pods = Vec::new();
    for _ in 0..10 {
        add(&node, &mut pods);
    }
    let t = Instant::now();
    wait_for(
        "the depleted node's extra CIDR",
        Duration::from_secs(20),
        || pod_cidrs(&cp, &name) == format!("[\"{FIRST}\",\"{EXTRA}\"]"),
    );
    eprintln!("{TEST}: depleted to extra CIDR in spec: {:?}", t.elapsed());
    wait_for("the agent to judge it", Duration::from_secs(10), || {
        cidr_status(&cp, &name).contains(EXTRA)
    });
    // The agent serves from it once the first is full (router and health
    // addresses are in the first too).
    let more: Vec<String> = (0..4).map(|_| add(&node, &mut pods)).collect();
    let first_extra = more.iter().position(|ip| in_cidr(ip, EXTRA));
    assert!(
        first_extra.is_some_and(|i| more[..i].iter().all(|ip| in_cidr(ip, FIRST))),
        "{more:?}"
    );
    eprintln!(
        "{TEST}: depleted to first pod in the extra CIDR: {:?}",
        t.elapsed()
    );
    let status = node.podnet(&["status"]);
    assert!(
        status.contains(&format!("{EXTRA} in-use")) && status.contains("never given back"),
        "{status}"
    );
    assert!(
        !events(&cp, &name, "ExtraPodCIDRAllocated").is_empty(),
        "no ExtraPodCIDRAllocated Event"
    );

    // Both depleted, the pool is empty: an Event and a status line naming the
    // pool and the node; the node keeps serving.
    for _ in 0..7 {
        add(&node, &mut pods);
    }
    let why = format!(
        "no extra IPv4 CIDR for node {name}: cluster-pool-ipv4-cidr 10.93.0.0/27 has no free /28 left"
    );
    wait_for(
        "the pool-empty status line",
        Duration::from_secs(20),
        || operator_error(&cp, &name).starts_with(&why),
    );
    wait_for("the pool-empty Event", Duration::from_secs(10), || {
        events(&cp, &name, "ExtraPodCIDRUnavailable").contains(&why)
    });
    let ip = add(&node, &mut pods);
    assert!(in_cidr(&ip, FIRST) || in_cidr(&ip, EXTRA), "{ip}");
    let (code, out, err) = operator_status(&cp, &sa, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("{FIRST} (depleted), {EXTRA} (extra, depleted)")),
        "{out}"
    );
    assert!(out.contains(&why), "{out}");

    // Drained: every pod of the extra CIDR and all but 5 of the first go
    // (router, health and 5 pods hold 7 of its 14).
    let mut kept = 0;
    for (sb, ip) in &pods {
        if in_cidr(ip, FIRST) && kept < 5 {
            kept += 1;
            continue;
        }
        let r = node.del(sb);
        assert!(r.ok, "DEL: {}", r.stdout);
    }
    let t = Instant::now();
    wait_for("the extra CIDR taken back", Duration::from_secs(30), || {
        pod_cidrs(&cp, &name) == format!("[\"{FIRST}\"]")
    });
    eprintln!(
        "{TEST}: drained to extra CIDR taken back: {:?}",
        t.elapsed()
    );
    wait_for("the agent to forget it", Duration::from_secs(10), || {
        !cidr_status(&cp, &name).contains(EXTRA)
    });
    wait_for("the status line cleared", Duration::from_secs(10), || {
        operator_error(&cp, &name).is_empty()
    });
    assert!(!events(&cp, &name, "ExtraPodCIDRReleased").is_empty());
    // The first CIDR stays, and the node serves from it.
    let ip = add(&node, &mut Vec::new());
    assert!(in_cidr(&ip, FIRST), "{ip}");
    drop(op);
}
