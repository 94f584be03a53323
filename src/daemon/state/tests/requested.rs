//! The addresses a pod's `ipam.podnet.io/ip-addresses` annotation asks for, as the
//! state gives or refuses them (`state::requested`): in cluster-pool and
//! multi-pool, through the journal and a restart, against every holder.

use super::*;
use crate::ipam::address_request::ANNOTATION_IP_ADDRESSES;

/// Metadata of pods in namespace `ns`, each with the annotation's value given.
fn asking(pods: &[(&str, &str)]) -> Box<FakeMetadata> {
    let annotations: Vec<Vec<(&str, &str)>> = pods
        .iter()
        .map(|(_, value)| match *value {
            "" => Vec::new(),
            v => vec![(ANNOTATION_IP_ADDRESSES, v)],
        })
        .collect();
    let list: Vec<(&str, &[(&str, &str)])> = pods
        .iter()
        .zip(&annotations)
        .map(|((name, _), a)| (*name, a.as_slice()))
        .collect();
    pods_in_ns(&list)
}

/// A dual-stack cluster-pool node (10.0.0.0/28, fd00::/124) with `pods`.
fn dual_with(dir: &TestDir, pods: &[(&str, &str)]) -> IpamState {
    let mut s = start(dir, &Setup::dual());
    s.set_metadata(asking(pods));
    s
}

fn refused(s: &mut IpamState, cid: &str) -> ApiError {
    let before = records(s);
    let used = |s: &IpamState| {
        [Family::V4, Family::V6].map(|f| {
            s.pools
                .names()
                .iter()
                .map(|p| s.pools.used(p, f))
                .sum::<u64>()
        })
    };
    let used_before = used(s);
    let e = s.allocate_next(&pod(cid)).unwrap_err();
    assert_eq!(records(s), before, "a refusal leaves nothing allocated");
    assert_eq!(used(s), used_before, "nor any allocator bit taken");
    let last = s.failures.back().expect("the refusal is recorded");
    assert_eq!(Some(last.reason.as_str()), e.reason.map(|r| r.as_str()));
    assert_eq!(last.owner, format!("ns/{cid}"));
    e
}

#[test]
fn a_pod_gets_the_addresses_it_asks_for_and_explain_says_why() {
    let dir = TestDir::new("state");
    let mut s = dual_with(&dir, &[("a", "10.0.0.9,fd00::9"), ("b", "10.0.0.10")]);
    let a = s.allocate_next(&pod("a")).unwrap();
    assert_eq!((v4(&a), v6(&a)), (addr("10.0.0.9"), addr("fd00::9")));
    assert_eq!(
        record(&s, addr("10.0.0.9")).selected_by.as_deref(),
        Some("ip-addresses")
    );
    // One family named: the other is the next free address, as usual.
    let b = s.allocate_next(&pod("b")).unwrap();
    assert_eq!(v4(&b), addr("10.0.0.10"));
    assert!(in_block(v6(&b), "fd00::/124") && v6(&b) != addr("fd00::9"));
    assert_eq!(record(&s, v6(&b)).selected_by, None);
    let explained = s.explain("10.0.0.9");
    let rule = &explained.addresses[0].rule;
    assert!(rule.contains(ANNOTATION_IP_ADDRESSES), "{rule}");
    assert!(
        !s.explain(&v6(&b).to_string()).addresses[0]
            .rule
            .contains(ANNOTATION_IP_ADDRESSES)
    );
}

#[test]
fn an_address_another_pod_holds_is_refused_naming_the_pod_and_its_container() {
    let dir = TestDir::new("state");
    let mut s = dual_with(&dir, &[("a", "10.0.0.9"), ("b", "10.0.0.9")]);
    s.allocate_next(&pod("a")).unwrap();
    let e = refused(&mut s, "b");
    assert_eq!(
        (e.kind, e.reason),
        (ErrorKind::Conflict, Some(FailureReason::AddressTaken))
    );
    for part in [
        "pod ns/b",
        "10.0.0.9",
        "taken by pod ns/a",
        "container a",
        "interface eth0",
        NODE,
    ] {
        assert!(e.message.contains(part), "{part:?} in {}", e.message);
    }
}

#[test]
fn the_node_s_own_addresses_and_the_range_s_edges_are_refused() {
    let dir = TestDir::new("state");
    let mut s = start(&dir, &Setup::dual());
    let router = *s.router_ips().iter().find(|ip| ip.is_ipv4()).unwrap();
    s.set_metadata(asking(&[
        ("r", &router.to_string()),
        ("first", "10.0.0.0"),
        ("last", "10.0.0.15"),
    ]));
    let e = refused(&mut s, "r");
    assert_eq!(e.reason, Some(FailureReason::AddressTaken));
    assert!(e.message.contains("own router address"), "{}", e.message);
    for cid in ["first", "last"] {
        let e = refused(&mut s, cid);
        assert_eq!(e.reason, Some(FailureReason::AddressOutsideNode));
        assert!(
            e.message
                .contains("range 10.0.0.0/28 but not one it hands out"),
            "{}",
            e.message
        );
    }
}

#[test]
fn an_address_outside_the_node_s_ranges_is_refused_naming_them() {
    let dir = TestDir::new("state");
    let mut s = dual_with(&dir, &[("v4", "10.9.0.1"), ("v6", "fd01::1")]);
    let e = refused(&mut s, "v4");
    assert_eq!(
        (e.kind, e.reason),
        (
            ErrorKind::NoAddress,
            Some(FailureReason::AddressOutsideNode)
        )
    );
    assert!(
        e.message
            .contains("10.9.0.1 (ipam.podnet.io/ip-addresses) is outside node node-a's IPv4 ranges (10.0.0.0/28)"),
        "{}",
        e.message
    );
    let e = refused(&mut s, "v6");
    assert!(
        e.message.contains("IPv6 ranges (fd00::/124)"),
        "{}",
        e.message
    );
}

#[test]
fn a_malformed_annotation_or_a_family_the_node_lacks_is_refused_before_anything_is_taken() {
    let dir = TestDir::new("state");
    let mut s = start(&dir, &Setup::cluster_pool(Some("10.0.0.0/28"), None));
    s.set_metadata(asking(&[
        ("junk", "web-0"),
        ("two", "10.0.0.9,10.0.0.10"),
        ("empty", " "),
        ("v6", "fd00::9"),
    ]));
    for (cid, says) in [
        ("junk", "\"web-0\" is not an IP address"),
        ("two", "names two IPv4 addresses"),
        ("empty", "is empty"),
        ("v6", "IPv6 is not enabled"),
    ] {
        let e = refused(&mut s, cid);
        assert_eq!(
            (e.kind, e.reason),
            (ErrorKind::Invalid, Some(FailureReason::AddressAnnotation)),
            "{cid}"
        );
        assert!(
            e.message.contains(says) && e.message.contains(&format!("pod ns/{cid}")),
            "{cid}: {}",
            e.message
        );
    }
    assert_eq!(
        s.failures.back().map(|f| f.hint.contains("ip-addresses")),
        Some(true)
    );
}

#[test]
fn a_pod_without_the_annotation_or_unknown_to_the_metadata_gets_the_next_address() {
    let dir = TestDir::new("state");
    let mut s = dual_with(&dir, &[("plain", "")]);
    assert!(s.allocate_next(&pod("plain")).is_ok());
    assert!(s.allocate_next(&pod("unknown")).is_ok());
    assert!(s.allocate_next(&plain("not-a-pod-name", "")).is_ok());
}

#[test]
fn an_attachment_added_again_keeps_its_requested_address() {
    let dir = TestDir::new("state");
    let mut s = dual_with(&dir, &[("a", "10.0.0.9,fd00::9")]);
    s.allocate_next(&pod("a")).unwrap();
    let again = s.allocate_next(&pod("a")).unwrap();
    assert_eq!(
        (v4(&again), v6(&again)),
        (addr("10.0.0.9"), addr("fd00::9"))
    );
    let rec = record(&s, addr("10.0.0.9"));
    assert_eq!(
        (rec.state, rec.container_id.as_deref()),
        (AllocationState::Pending, Some("a"))
    );
    assert_eq!(
        rec.expiration_uuid,
        address(&again, true).and_then(|a| a.expiration_uuid.clone())
    );
}

#[test]
fn a_released_address_cools_down_for_other_pods_but_the_same_pod_gets_it_back() {
    let dir = TestDir::new("state");
    let mut s = dual_with(&dir, &[("a", "10.0.0.9"), ("other", "10.0.0.9")]);
    let first = s.allocate_next(&pod("a")).unwrap();
    s.create_endpoint(&endpoint_for("a", &first)).unwrap();
    s.delete_endpoints(&del("a")).unwrap();
    assert_eq!(
        state_of(&s, addr("10.0.0.9")),
        Some(AllocationState::Cooling)
    );
    let e = refused(&mut s, "other");
    assert_eq!(e.reason, Some(FailureReason::AddressTaken));
    assert!(
        e.message
            .contains("was released by ns/a and cools down for 30 s more"),
        "{}",
        e.message
    );
    // The pod again (a new sandbox, same name).
    let again = AllocateRequest {
        container_id: Some("a2".into()),
        ..pod("a")
    };
    let resp = s.allocate_next(&again).unwrap();
    assert_eq!(v4(&resp), addr("10.0.0.9"));
    let rec = record(&s, addr("10.0.0.9"));
    assert_eq!(
        (rec.state, rec.container_id.as_deref()),
        (AllocationState::Pending, Some("a2"))
    );
    // Its old cooldown ends without freeing the address.
    for t in cooldown_timers(&s.take_timers()) {
        s.fire(
            &Timer {
                deadline_ms: 0,
                ..t
            },
            &no_links,
        );
    }
    assert_eq!(
        state_of(&s, addr("10.0.0.9")),
        Some(AllocationState::Pending)
    );
}

#[test]
fn a_requested_address_is_journaled_and_still_held_after_a_restart() {
    let dir = TestDir::new("state");
    let setup = Setup::dual();
    let mut s = dual_with(&dir, &[("a", "10.0.0.9"), ("b", "10.0.0.9")]);
    let a = s.allocate_next(&pod("a")).unwrap();
    s.create_endpoint(&endpoint_for("a", &a)).unwrap();
    let before = records(&s);
    drop(s);
    let mut s = ready(restore(&dir, &setup).0);
    s.set_metadata(asking(&[("a", "10.0.0.9"), ("b", "10.0.0.9")]));
    assert_eq!(records(&s), before);
    assert_eq!(
        record(&s, addr("10.0.0.9")).selected_by.as_deref(),
        Some("ip-addresses")
    );
    let e = refused(&mut s, "b");
    assert!(e.message.contains("taken by pod ns/a"), "{}", e.message);
    // The allocator knows it too: the next free addresses never include it.
    for i in 0..8 {
        let r = s.allocate_next(&pod(&format!("n{i}"))).unwrap();
        assert_ne!(v4(&r), addr("10.0.0.9"));
    }
}

fn multi_with(dir: &TestDir, pods: &[(&str, &str)]) -> IpamState {
    let setup = Setup::multi_pool(default_and_blue(), &[(DEFAULT_POOL, 8), ("blue", 4)]);
    let mut s = start(dir, &setup);
    s.set_metadata(asking(pods));
    s
}

#[test]
fn multi_pool_gives_an_address_of_a_block_the_node_holds_of_the_pod_s_pool() {
    let dir = TestDir::new("state");
    let mut s = multi_with(&dir, &[("a", "")]);
    let default_block = blocks(&s, DEFAULT_POOL)[0].clone();
    let block: IpNet = default_block.parse().unwrap();
    let wanted = block.hosts().nth(6).unwrap();
    s.set_metadata(asking(&[("a", &wanted.to_string())]));
    let resp = s.allocate_next(&pod("a")).unwrap();
    assert_eq!(v4(&resp), wanted);
    assert_eq!(
        record(&s, wanted).selected_by.as_deref(),
        Some("default+ip-addresses")
    );
    let rule = &s.explain(&wanted.to_string()).addresses[0].rule;
    assert!(
        rule.contains("precedence step 4") && rule.contains(ANNOTATION_IP_ADDRESSES),
        "{rule}"
    );
}

#[test]
fn multi_pool_refuses_an_address_outside_the_node_s_blocks_in_another_pool_or_in_none() {
    let dir = TestDir::new("state");
    let mut s = multi_with(&dir, &[]);
    let blue_block = blocks(&s, "blue")[0].clone();
    let in_blue: IpNet = blue_block.parse().unwrap();
    let in_blue = in_blue.hosts().nth(1).unwrap();
    s.set_metadata(asking(&[
        ("far", "10.10.200.5"),
        ("blue", &in_blue.to_string()),
        ("blue-elsewhere", "10.20.0.250"),
        ("nowhere", "10.99.0.1"),
    ]));
    let e = refused(&mut s, "far");
    assert_eq!(e.reason, Some(FailureReason::AddressOutsideNode));
    assert!(
        e.message.contains(
            "is in pool default (10.10.0.0/16) but in none of the blocks node node-a holds of it ("
        ),
        "{}",
        e.message
    );
    let e = refused(&mut s, "blue");
    assert_eq!(e.reason, Some(FailureReason::AddressNotInPool));
    assert!(
        e.message.contains(&format!(
            "is in pool blue (block {blue_block} on node node-a), not in the pod's pool default"
        )),
        "{}",
        e.message
    );
    let e = refused(&mut s, "blue-elsewhere");
    assert_eq!(e.reason, Some(FailureReason::AddressNotInPool));
    assert!(
        e.message
            .contains("is in pool blue (10.20.0.0/24), not in the pod's pool default"),
        "{}",
        e.message
    );
    let e = refused(&mut s, "nowhere");
    assert_eq!(e.reason, Some(FailureReason::AddressNotInPool));
    assert!(
        e.message
            .contains("is not in any IPv4 pool (default 10.10.0.0/16; blue 10.20.0.0/24)"),
        "{}",
        e.message
    );
}
