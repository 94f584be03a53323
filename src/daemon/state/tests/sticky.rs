//! Sticky addresses as the state serves them (`state::sticky`): the ADD asks
//! and waits, takes the address the operator assigned once its block is here,
//! the release skips the cooldown and gives the block back at once, and every
//! way of asking wrongly is refused naming the field.

use super::*;
use crate::ipam::selection::PodController;
use crate::ipam::sticky::{POD_STICKY_POOL, STICKY_STATUS};

const WEB: &str = "web";

/// `default`, `blue` and the sticky pool `web` (10.30.0.0/28, single addresses).
fn pools_with_web() -> Vec<PoolDef> {
    let mut web = pool_def(WEB, "10.30.0.0/28", 32);
    web.sticky = true;
    let mut pools = default_and_blue();
    pools.push(web);
    pools
}

/// [`pods_in_ns`] with the pods named `web-<ordinal>` controlled by the
/// StatefulSet `web`, and `rover-5d8f9-x7k2p` by the ReplicaSet `rover-5d8f9`.
fn web_statefulset(list: &[(&str, &[(&str, &str)])]) -> Box<FakeMetadata> {
    let mut metadata = pods_in_ns(list);
    for pod in metadata.pods.values_mut() {
        let (kind, name) = match pod.name.rsplit_once('-') {
            Some((WEB, _)) => ("StatefulSet", WEB),
            Some(("rover-5d8f9", _)) => ("ReplicaSet", "rover-5d8f9"),
            _ => continue,
        };
        pod.controller = Some(PodController {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: name.into(),
        });
    }
    metadata
}

/// A multi-pool node with a cluster operator, a 30 s cooldown and `web-0`,
/// `web-1` asking for sticky addresses of `web`.
fn node_with_statefulset(dir: &TestDir) -> IpamState {
    let setup = Setup::multi_pool(pools_with_web(), &[]).cooldown(Duration::from_secs(30));
    let mut s = start_with_cluster_operator(dir, &setup, node_with_blocks(&[]));
    s.set_metadata(web_statefulset(&[
        ("web-0", &[(POD_STICKY_POOL, WEB)]),
        ("web-1", &[(POD_STICKY_POOL, WEB)]),
    ]));
    s
}

/// The node resource with `web` blocks and the operator's `answers` (JSON).
fn answered(blocks: &[&str], answers: &str) -> NodeResource {
    let extra: Vec<(&str, &str)> = blocks.iter().map(|b| (WEB, *b)).collect();
    let mut node = node_with_blocks(&extra);
    node.metadata
        .annotations
        .insert(STICKY_STATUS.to_string(), answers.to_string());
    node
}

/// [`node_with_statefulset`] with web-0 holding 10.30.0.3, which the operator
/// assigned to it.
fn web0_placed(dir: &TestDir) -> IpamState {
    let mut s = node_with_statefulset(dir);
    let assigned = r#"{"ns/web-0": {"pool": "web", "address": "10.30.0.3", "state": "assigned"}}"#;
    s.allocate(&pod("web-0"), true).unwrap_err();
    s.set_external_node(answered(&["10.30.0.3/32"], assigned));
    s.allocate(&pod("web-0"), true).unwrap();
    s
}

fn asks(s: &mut IpamState) -> Option<BTreeMap<String, String>> {
    s.take_outbox().and_then(|o| o.sticky_requests)
}

#[test]
fn a_sticky_pod_asks_waits_and_gets_the_address_the_operator_assigned() {
    let dir = TestDir::new("state");
    let mut s = node_with_statefulset(&dir);
    s.take_outbox();
    let e = s.allocate(&pod("web-0"), true).unwrap_err();
    assert_eq!(e.reason, Some(FailureReason::StickyWaiting));
    assert_eq!(e.kind, ErrorKind::Unavailable, "CNI 11 after the wait");
    assert!(s.waits_for_blocks(&e), "{}", e.message);
    assert!(
        e.message.contains(
            "asked the operator (CiliumNode node-a annotation ipam.podnet.io/sticky-requests)"
        ),
        "{}",
        e.message
    );
    assert!(s.failures.is_empty(), "a wait is not a failure");
    assert_eq!(
        asks(&mut s),
        Some(BTreeMap::from([("ns/web-0".into(), WEB.into())]))
    );
    assert_eq!(
        requested(&s, WEB),
        None,
        "a sticky pool is never asked for by count"
    );

    // Still on the node web-0 left: it waits, saying where the address is.
    s.set_external_node(answered(
        &[],
        r#"{"ns/web-0": {"pool": "web", "state": "moving", "message": "node node-b still lists 10.30.0.3/32"}}"#,
    ));
    let e = s.allocate(&pod("web-0"), true).unwrap_err();
    assert_eq!(e.reason, Some(FailureReason::StickyWaiting));
    assert!(
        e.message.contains("node node-b still lists 10.30.0.3/32"),
        "{}",
        e.message
    );

    // Assigned, but the block not here yet (the answer came first): waits.
    let assigned = r#"{"ns/web-0": {"pool": "web", "address": "10.30.0.3", "state": "assigned"}}"#;
    s.set_external_node(answered(&[], assigned));
    let e = s.allocate(&pod("web-0"), true).unwrap_err();
    assert!(
        e.message
            .contains("its block is not among node node-a's yet"),
        "{}",
        e.message
    );

    // The block arrives: web-0 gets exactly its address.
    s.set_external_node(answered(&["10.30.0.3/32"], assigned));
    let got = s.allocate(&pod("web-0"), true).unwrap();
    assert_eq!(v4(&got), addr("10.30.0.3"));
    assert_eq!(address(&got, true).unwrap().pool, WEB);
    assert_eq!(
        record(&s, addr("10.30.0.3")).selected_by.as_deref(),
        Some("sticky-pool")
    );
    // The attachment added again keeps it.
    let again = s.allocate(&pod("web-0"), true).unwrap();
    assert_eq!(v4(&again), addr("10.30.0.3"));
    assert_eq!(
        asks(&mut s),
        None,
        "the request stays while the address is in use: nothing new to write"
    );
}

#[test]
fn a_released_sticky_address_skips_the_cooldown_and_its_block_goes_back_at_once() {
    let dir = TestDir::new("state");
    let mut s = web0_placed(&dir);
    s.take_outbox();
    s.take_timers();

    s.take_flush_soon();
    s.release_ip("10.30.0.3", "").unwrap();
    assert_eq!(state_of(&s, addr("10.30.0.3")), None, "no cooldown");
    assert!(s.take_flush_soon(), "the next node waits: written soon");
    assert!(cooldown_timers(&s.take_timers()).is_empty());
    let out = s.take_outbox().expect("the request and the block go");
    assert_eq!(out.sticky_requests, Some(BTreeMap::new()));
    assert_eq!(
        out.released_blocks,
        vec![(WEB.to_string(), "10.30.0.3/32".parse::<IpNet>().unwrap())]
    );
    assert!(blocks(&s, WEB).is_empty());
}

#[test]
fn a_block_nobody_here_asks_for_goes_back_and_a_waiting_pod_that_left_stops_asking() {
    let dir = TestDir::new("state");
    let mut s = node_with_statefulset(&dir);
    s.allocate(&pod("web-0"), true).unwrap_err();
    s.allocate(&pod("web-1"), true).unwrap_err();
    // The operator assigned web-0's address here, and a block of web-1 that
    // this node no longer asks for is listed too.
    let answers = r#"{"ns/web-0": {"pool": "web", "address": "10.30.0.3", "state": "assigned"},
                      "ns/web-1": {"pool": "web", "address": "10.30.0.4", "state": "assigned"}}"#;
    s.set_external_node(answered(&["10.30.0.3/32", "10.30.0.4/32"], answers));
    s.sync_demand();
    assert_eq!(
        blocks(&s, WEB).len(),
        2,
        "both still asked for: kept while their ADDs wait"
    );
    // web-1 was deleted before its ADD got the address (gone from this node):
    // the next outbox, with nothing else happening on the node, stops asking
    // for it and gives its block back.
    s.set_metadata(web_statefulset(&[("web-0", &[(POD_STICKY_POOL, WEB)])]));
    s.take_flush_soon();
    let out = s.take_outbox().unwrap();
    assert_eq!(
        out.sticky_requests,
        Some(BTreeMap::from([("ns/web-0".into(), WEB.into())]))
    );
    assert_eq!(
        out.released_blocks,
        vec![(WEB.to_string(), "10.30.0.4/32".parse::<IpNet>().unwrap())]
    );
    assert!(s.take_flush_soon());
    assert_eq!(blocks(&s, WEB), vec!["10.30.0.3/32"]);
}

#[test]
fn every_wrong_way_of_asking_is_refused_naming_the_field() {
    let dir = TestDir::new("state");
    let mut s = node_with_statefulset(&dir);
    s.set_metadata(web_statefulset(&[
        ("by-pool", &[(ANNOTATION_IP_POOL, WEB)]),
        ("missing", &[(POD_STICKY_POOL, "nope")]),
        ("ordinary", &[(POD_STICKY_POOL, "blue")]),
        (
            "both",
            &[
                (POD_STICKY_POOL, WEB),
                ("ipam.podnet.io/ip-addresses", "10.30.0.5"),
            ],
        ),
        ("web-2", &[(POD_STICKY_POOL, WEB)]),
        ("web-02", &[(POD_STICKY_POOL, WEB)]),
        ("rover-5d8f9-x7k2p", &[(POD_STICKY_POOL, WEB)]),
        ("lonely", &[(POD_STICKY_POOL, WEB)]),
    ]));
    let refused = |s: &mut IpamState, cid: &str| {
        let e = s.allocate(&pod(cid), true).unwrap_err();
        assert_eq!(
            e.reason,
            Some(FailureReason::StickyRefused),
            "{}",
            e.message
        );
        assert!(
            e.reason.is_some_and(FailureReason::is_requested_address),
            "CNI 107 and an Event"
        );
        assert!(!s.waits_for_blocks(&e));
        e.message
    };
    let m = refused(&mut s, "by-pool");
    assert!(m.contains("pool web is sticky: its addresses go only to pods whose annotation ipam.podnet.io/sticky-pool names it"), "{m}");
    let m = refused(&mut s, "missing");
    assert!(
        m.contains(
            "annotation ipam.podnet.io/sticky-pool=\"nope\": no CiliumPodIPPool of that name"
        ),
        "{m}"
    );
    let m = refused(&mut s, "ordinary");
    assert!(
        m.contains("pool blue is not sticky: annotate it ipam.podnet.io/sticky: \"true\""),
        "{m}"
    );
    let m = refused(&mut s, "both");
    assert!(
        m.contains("the pod also has ipam.podnet.io/ip-addresses"),
        "{m}"
    );
    // Only a StatefulSet's pods (issue 53.4: any pod name held an address for ever).
    let m = refused(&mut s, "rover-5d8f9-x7k2p");
    assert!(
        m.contains("annotation ipam.podnet.io/sticky-pool=\"web\": only a StatefulSet's pods have sticky addresses, and this pod's controller is ReplicaSet rover-5d8f9"),
        "{m}"
    );
    let m = refused(&mut s, "lonely");
    assert!(m.contains("this pod has no controller"), "{m}");
    let m = refused(&mut s, "web-02");
    assert!(
        m.contains("the pod's name is not <statefulset>-<ordinal> of its StatefulSet web"),
        "{m}"
    );
    assert!(
        asks(&mut s).is_none_or(|r| r.is_empty()),
        "none of them is asked for"
    );
    // The operator's refusal, in its words.
    s.set_external_node(answered(
        &[],
        r#"{"ns/web-2": {"pool": "web", "state": "refused", "message": "pool \"web\" has no free address"}}"#,
    ));
    let m = refused(&mut s, "web-2");
    assert!(
        m.contains(
            "the operator refused its sticky address of pool web: pool \"web\" has no free address"
        ),
        "{m}"
    );
    // The API's allocation of one address refuses the sticky pool too.
    let e = s.allocate_ip("10.30.0.7", "ns/by-pool", WEB).unwrap_err();
    assert_eq!(e.reason, Some(FailureReason::StickyRefused));
    assert!(records(&s).keys().all(|ip| !in_block(*ip, "10.30.0.0/28")));

    // With the embedded operator (no cluster operator) nothing can be sticky.
    let dir = TestDir::new("state");
    let mut s = start(
        &dir,
        &Setup::multi_pool(pools_with_web(), &[(DEFAULT_POOL, 8)]),
    );
    s.set_metadata(web_statefulset(&[("web-0", &[(POD_STICKY_POOL, WEB)])]));
    let m = refused(&mut s, "web-0");
    assert!(
        m.contains("sticky addresses need ipam mode multi-pool with podnet operator"),
        "{m}"
    );
}

#[test]
fn a_restarted_agent_keeps_asking_for_the_sticky_addresses_it_holds() {
    let dir = TestDir::new("state");
    let s = web0_placed(&dir);
    let node = s.node().clone();
    drop(s);
    let setup = Setup::multi_pool(pools_with_web(), &[]);
    let mut s = start_with_cluster_operator(&dir, &setup, node);
    assert_eq!(
        record(&s, addr("10.30.0.3")).selected_by.as_deref(),
        Some("sticky-pool")
    );
    let out = s.take_outbox().unwrap();
    assert_eq!(
        out.sticky_requests,
        Some(BTreeMap::from([("ns/web-0".into(), WEB.into())]))
    );
    assert!(out.released_blocks.is_empty(), "the block in use stays");
}
