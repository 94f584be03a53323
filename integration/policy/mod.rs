//! NetworkPolicy in a real kernel (src/policy): a "node" namespace with three
//! "pod" namespaces, each on a veth whose node side is named like a pod's host
//! link, with IPv4 and IPv6 addresses routed as podnet routes them, forwarding
//! on. The policy table is compiled from real policy objects, written with
//! `policy::table` inside the node namespace, and judged with real TCP and UDP:
//! an unselected pod stays open; default deny blocks others while the pod's
//! own connections get their replies (conntrack) and its node still reaches it;
//! a podSelector allow lets exactly the selected peer in on the listed and the
//! named port; egress to an ipBlock with except, to a named port of the
//! destination, and UDP, with the destination's ingress still judged; a label
//! change applied as a diff (one set element, the table not recreated) opens a
//! connection while an established one lives on; and every kind of update
//! leaves the table an install of the new state would write. With
//! `enable-policy always` every pod is isolated both ways, policy or not: only
//! what policies allow on both ends passes, and the node still reaches its pods.
//! 10,000 policies compile, install in one nft transaction and update in place.
//! A pod and itself: its own address unfiltered, itself through a Service
//! (kube-proxy's hairpin) judged by its policy (`self_traffic`). A pod and its
//! node: what it sends the node judged as egress (`own_node`).

use std::io::{Read, Write};
use std::net::SocketAddr;

use podnet::policy::state::Element;
use podnet::policy::{Enforcement, State};
use serde_json::json;

use crate::harness::*;

mod agent;
mod cluster_policy;
mod observe;
mod own_node;
mod self_traffic;
mod topology;
use topology::*;

/// The kinds of change `diff` holds.
fn diff_kinds(diff: &podnet::policy::Diff) -> Vec<&'static str> {
    let kinds = [
        ("sets added", diff.sets_added.is_empty()),
        ("sets removed", diff.sets_removed.is_empty()),
        ("elements added", diff.elements_added.is_empty()),
        ("elements removed", diff.elements_removed.is_empty()),
        ("chains added", diff.chains_added.is_empty()),
        ("chains replaced", diff.chains_replaced.is_empty()),
        ("chains removed", diff.chains_removed.is_empty()),
    ];
    kinds
        .iter()
        .filter(|(_, empty)| !empty)
        .map(|(k, _)| *k)
        .collect()
}

#[test]
fn ingress_policies_hold_in_the_kernel_and_a_label_change_is_one_element() {
    if !root_or_skip("policy_ingress") {
        return;
    }
    let t = Topology::new(3);
    let (web, client, other) = (0, 1, 2);
    let web_ports: Ports = &[("http", 8080)];
    let pods = t.views(&[
        (&[("app", "web")], web_ports),
        (&[("role", "client")], &[]),
        (&[("role", "other")], &[]),
    ]);
    let (w4, w6) = (t.pods[web].v4, t.pods[web].v6);

    // Default deny for web: nobody gets in, web's own connections get their
    // replies, its node still reaches it, the others stay open.
    let deny = policy(
        "deny",
        json!({"podSelector": {"matchLabels": {"app": "web"}}}),
    );
    t.install(&t.compile(std::slice::from_ref(&deny), &pods));
    for ip in [w4, w6] {
        assert!(
            !t.tcp(client, ip, 80, BLOCKED),
            "client -> web {ip} under default deny"
        );
        assert!(
            !t.tcp(other, ip, 80, BLOCKED),
            "other -> web {ip} under default deny"
        );
    }
    for ip in [t.pods[client].v4, t.pods[client].v6] {
        assert!(
            t.tcp(web, ip, 80, ALLOWED),
            "web's own connection to {ip} gets its reply"
        );
    }
    assert!(
        t.tcp(client, t.pods[other].v4, 80, ALLOWED),
        "an unselected pod stays open"
    );
    assert!(
        t.tcp_from(&t.node, SocketAddr::new(w4, 80), ALLOWED)
            .is_some(),
        "the node reaches its pod (kubelet probes)"
    );
    assert!(!t.udp(client, web, false, 53, BLOCKED));

    // Clients in on TCP 80 and the named port http (8080), nothing else.
    let allow = policy(
        "allow-clients",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                            "ports": [{"port": 80}, {"port": "http"}]}]}),
    );
    let policies = [deny, allow];
    let before = t.compile(&policies, &pods);
    t.install(&before);
    for ip in [w4, w6] {
        assert!(t.tcp(client, ip, 80, ALLOWED), "client -> web {ip}:80");
        assert!(t.tcp(client, ip, 8080, ALLOWED), "client -> web {ip}:http");
        assert!(
            !t.tcp(client, ip, 9000, BLOCKED),
            "client -> web {ip}:9000 is not listed"
        );
        assert!(!t.tcp(other, ip, 80, BLOCKED), "other is no client");
    }
    assert!(
        !t.udp(client, web, true, 80, BLOCKED),
        "UDP 80 is not TCP 80"
    );

    // An established connection, then other becomes a client: one set element
    // per family, applied as an update of the same table.
    let mut live = t
        .tcp_from(&t.pods[client].ns, SocketAddr::new(w4, 80), ALLOWED)
        .expect("client -> web");
    let handle = t.table_handle();
    let mut relabelled = pods.clone();
    relabelled[other]
        .labels
        .insert("role".into(), "client".into());
    let after = t.compile(&policies, &relabelled);
    let diff = before.diff(&after);
    let added: Vec<&Element> = diff.elements_added.values().flatten().collect();
    assert_eq!(
        added,
        [
            &Element::Address(t.pods[other].v4),
            &Element::Address(t.pods[other].v6)
        ]
    );
    assert_eq!(diff.elements_added.len(), 1, "{diff:?}");
    assert!(
        diff.elements_removed.is_empty()
            && diff.sets_added.is_empty()
            && diff.chains_replaced.is_empty()
    );
    t.update(&before, &after);
    assert_eq!(
        t.table_handle(),
        handle,
        "the table was updated, not recreated"
    );
    for ip in [w4, w6] {
        assert!(
            t.tcp(other, ip, 80, ALLOWED),
            "other is a client now: -> {ip}"
        );
    }
    live.set_read_timeout(Some(ALLOWED)).expect("timeout");
    live.write_all(b"still here")
        .expect("write on the established connection");
    let mut buf = [0u8; 10];
    live.read_exact(&mut buf)
        .expect("the established connection survives the update");
    assert_eq!(&buf, b"still here");

    // And back: other's addresses leave the set; its new connections are dropped.
    t.update(&after, &before);
    assert!(!t.tcp(other, w4, 80, BLOCKED), "other is no client again");
    drop(live);
}

#[test]
fn egress_to_an_ip_block_a_named_port_and_udp() {
    if !root_or_skip("policy_egress") {
        return;
    }
    let t = Topology::new(3);
    let (web, b, c) = (0, 1, 2);
    let pods = t.views(&[
        (&[("app", "web")], &[]),
        (&[("role", "dns")], &[]),
        (&[("role", "metrics")], &[("metrics", 9100)]),
    ]);
    // web may reach 10.77.0.0/24 but c (10.77.0.3) on TCP 80, any pod's
    // `metrics` port, and the dns pod on UDP 53; nothing else.
    let egress = policy(
        "egress",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"],
        "egress": [
            {"to": [{"ipBlock": {"cidr": "10.77.0.0/24", "except": ["10.77.0.3/32"]}}], "ports": [{"port": 80}]},
            {"ports": [{"port": "metrics"}]},
            {"to": [{"podSelector": {"matchLabels": {"role": "dns"}}}], "ports": [{"protocol": "UDP", "port": 53}]},
        ]}),
    );
    t.install(&t.compile(std::slice::from_ref(&egress), &pods));
    assert!(t.tcp(web, t.pods[b].v4, 80, ALLOWED), "inside the block");
    assert!(!t.tcp(web, t.pods[c].v4, 80, BLOCKED), "the except");
    assert!(
        !t.tcp(web, t.pods[b].v6, 80, BLOCKED),
        "the block is IPv4 only"
    );
    assert!(
        !t.tcp(web, t.pods[b].v4, 9000, BLOCKED),
        "a port the block does not list"
    );
    for ip in [t.pods[c].v4, t.pods[c].v6] {
        assert!(t.tcp(web, ip, 9100, ALLOWED), "c's metrics port at {ip}");
    }
    assert!(
        !t.tcp(web, t.pods[b].v4, 9100, BLOCKED),
        "b has no port named metrics"
    );
    assert!(
        t.udp(web, b, false, 53, ALLOWED) && t.udp(web, b, true, 53, ALLOWED),
        "UDP 53 to dns"
    );
    assert!(!t.udp(web, c, false, 53, BLOCKED), "c is not the dns pod");
    // Ingress of web is not selected: open.
    assert!(
        t.tcp(b, t.pods[web].v4, 9000, ALLOWED),
        "web's ingress stays open"
    );
    // Egress allowed is not enough: the destination's ingress is judged too.
    let deny_dns = policy(
        "deny-dns",
        json!({"podSelector": {"matchLabels": {"role": "dns"}}}),
    );
    t.install(&t.compile(&[egress.clone(), deny_dns.clone()], &pods));
    assert!(
        !t.tcp(web, t.pods[b].v4, 80, BLOCKED),
        "web may send, b takes nothing"
    );
    let from_web = policy(
        "from-web",
        json!({"podSelector": {"matchLabels": {"role": "dns"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}),
    );
    t.install(&t.compile(&[egress, deny_dns, from_web], &pods));
    assert!(t.tcp(web, t.pods[b].v4, 80, ALLOWED), "both sides allow it");
    // An empty table filters nothing again, and no table neither.
    t.install(&State::default());
    assert!(
        t.tcp(web, t.pods[c].v4, 80, ALLOWED),
        "no policy, no filter"
    );
    t.remove();
    t.remove();
}

#[test]
fn every_update_leaves_the_table_a_fresh_install_would_write() {
    if !root_or_skip("policy_updates") {
        return;
    }
    let t = Topology::new(3);
    let mut pods = t.views(&[
        (&[("app", "web")], &[("http", 8080)]),
        (&[("role", "client")], &[]),
        (&[("role", "metrics")], &[("metrics", 9100)]),
    ]);
    let deny = policy(
        "deny",
        json!({"podSelector": {"matchLabels": {"app": "web"}}}),
    );
    let allow = policy(
        "allow",
        json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}], "ports": [{"port": "http"}, {"port": 80, "endPort": 90}]}]}),
    );
    let egress = policy(
        "egress",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"],
               "egress": [{"ports": [{"port": "metrics"}]},
                          {"to": [{"podSelector": {"matchLabels": {"role": "client"}}}], "ports": [{"port": "metrics"}, {"protocol": "UDP"}]},
                          {"to": [{"ipBlock": {"cidr": "fd77::/64", "except": ["fd77::3/128"]}}]}]}),
    );
    let mut states = vec![
        State::default(),
        t.compile(&[deny.clone(), allow.clone()], &pods),
        t.compile(&[deny.clone(), allow.clone(), egress.clone()], &pods),
    ];
    pods[2].labels.insert("role".into(), "client".into());
    pods[2].ports[0].number = 9200;
    states.push(t.compile(&[deny.clone(), allow, egress.clone()], &pods));
    states.push(t.compile(&[deny, egress], &pods));
    states.push(State::default());
    t.install(&states[0]);
    let mut kinds = std::collections::BTreeSet::new();
    for (i, pair) in states.windows(2).enumerate() {
        let (handle, before) = (t.table_handle(), t.normalized());
        let diff = pair[0].diff(&pair[1]);
        kinds.extend(diff_kinds(&diff));
        t.update(&pair[0], &pair[1]);
        let updated = t.normalized();
        assert_ne!(before, updated, "step {i} changes the table");
        assert_eq!(
            t.table_handle(),
            handle,
            "step {i}: the table was recreated"
        );
        // The same state installed afresh (the next step starts from it).
        t.install(&pair[1]);
        assert_eq!(
            updated,
            t.normalized(),
            "step {i}: the update differs from an install"
        );
    }
    assert_eq!(
        kinds.len(),
        7,
        "every kind of change was applied: {kinds:?}"
    );
    // Traffic still judged after all that: an empty table filters nothing.
    assert!(t.tcp(1, t.pods[0].v4, 9000, ALLOWED));
}

#[test]
fn always_isolates_every_pod_until_policies_allow_both_ends() {
    if !root_or_skip("policy_always") {
        return;
    }
    let t = Topology::new(3);
    let (web, client, other) = (0, 1, 2);
    let pods = t.views(&[
        (&[("app", "web")], &[]),
        (&[("role", "client")], &[]),
        (&[("role", "other")], &[]),
    ]);
    let (w4, w6) = (t.pods[web].v4, t.pods[web].v6);
    t.install(&t.compile_as(Enforcement::Always, &[], &pods));
    for ip in [w4, w6] {
        assert!(
            !t.tcp(client, ip, 80, BLOCKED),
            "client -> web {ip}: no policy, isolated"
        );
    }
    assert!(
        !t.tcp(web, t.pods[other].v4, 80, BLOCKED),
        "web -> other: egress isolated too"
    );
    assert!(
        t.tcp_from(&t.node, SocketAddr::new(w4, 80), ALLOWED)
            .is_some(),
        "the node reaches its pod"
    );

    // web takes clients on 80: not enough while the client's egress is shut.
    let ingress = policy(
        "web-in",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                            "ports": [{"port": 80}]}]}),
    );
    t.install(&t.compile_as(Enforcement::Always, std::slice::from_ref(&ingress), &pods));
    assert!(
        !t.tcp(client, w4, 80, BLOCKED),
        "the client may not send yet"
    );
    let egress = policy(
        "client-out",
        json!({"podSelector": {"matchLabels": {"role": "client"}}, "policyTypes": ["Egress"],
               "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}),
    );
    t.install(&t.compile_as(Enforcement::Always, &[ingress, egress], &pods));
    for ip in [w4, w6] {
        assert!(
            t.tcp(client, ip, 80, ALLOWED),
            "both ends allow client -> web {ip}:80"
        );
        assert!(!t.tcp(client, ip, 9000, BLOCKED), "but not port 9000");
    }
    assert!(!t.tcp(other, w4, 80, BLOCKED), "other is no client");
    t.remove();
}

#[test]
fn ten_thousand_policies_compile_install_and_hold() {
    if !root_or_skip("policy_10k") {
        return;
    }
    let t = Topology::new(3);
    let (web, client, other) = (0, 1, 2);
    let pods = t.views(&[
        (&[("app", "web")], &[]),
        (&[("role", "r7")], &[]),
        (&[("role", "none")], &[]),
    ]);
    // 10,000 policies on web, 100 distinct peer selectors, each its own port
    // (port 80 from r7 is policy 7's).
    let policies: Vec<_> = (0..10_000u32)
        .map(|i| {
            let port = if i == 7 { 80 } else { 10_000 + i };
            policy(
                &format!("p{i}"),
                json!({"podSelector": {"matchLabels": {"app": "web"}},
                       "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": format!("r{}", i % 100)}}}],
                                    "ports": [{"port": port}]}]}),
            )
        })
        .collect();
    let started = std::time::Instant::now();
    let state = t.compile(&policies, &pods);
    let compiled = started.elapsed();
    let script = podnet::policy::render::install(&state, None);
    let rendered = started.elapsed() - compiled;
    let before = std::time::Instant::now();
    t.install(&state);
    let installed = before.elapsed();
    eprintln!(
        "10,000 policies: compile {compiled:?}, render {rendered:?} ({} bytes, {} sets, {} rules), nft install {installed:?}",
        script.len(),
        state.sets.len(),
        state
            .chains
            .values()
            .map(|c| c.policy.as_ref().map_or(0, Vec::len))
            .sum::<usize>()
    );
    assert!(t.tcp(client, t.pods[web].v4, 80, ALLOWED), "r7 -> web:80");
    assert!(
        !t.tcp(client, t.pods[web].v4, 9000, BLOCKED),
        "no policy lists 9000"
    );
    assert!(
        !t.tcp(other, t.pods[web].v4, 80, BLOCKED),
        "other matches no peer"
    );
    // One policy fewer is an update of the same table.
    let handle = t.table_handle();
    let fewer = t.compile(&policies[1..], &pods);
    let before = std::time::Instant::now();
    t.update(&state, &fewer);
    eprintln!(
        "10,000 policies: one deleted, nft update {:?}",
        before.elapsed()
    );
    assert_eq!(t.table_handle(), handle, "updated, not recreated");
    assert!(
        t.tcp(client, t.pods[web].v6, 80, ALLOWED),
        "still r7 -> web:80"
    );
    t.remove();
}
