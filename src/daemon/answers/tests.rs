//! The exact JSON of the daemon's answers built from a fixed state: status
//! (full and brief, host-scope and multi-pool), configuration, endpoints,
//! allocations and GC; and from the state's types alone where a state is hard
//! to bring about here (an ENI allocation, a failing journal). What changes from run to run (the journal's path and
//! mark, expiration UUIDs, the cooldown left) is replaced by a placeholder
//! before the comparison; every other byte is pinned.

use super::ipam::{gc_response, gc_scope, ipam_response};
use super::status::{daemon_configuration, endpoint_view, status_response};
use crate::api::models::{AttachmentRef, GcRequest, IpamResponse};
use crate::daemon::config::{DatapathMode, IpamMode};
use crate::daemon::state::tests::{
    Setup, del, del_with_links, endpoint_for, journal_in, plain, pod, pool_def, start,
};
use crate::daemon::state::{
    AddressBook, AddressHolder, Allocated, AllocatedAddress, AllocationCommit, DEFAULT_POOL,
    FamilyAddressing, Health, HealthLevel, Hold, NodeConfig, NodeStatus, RestoreReport,
};
use crate::datapath::link_marker::JournalMark;
use crate::ipam::Family;
use crate::ipam::eni::EniRouting;
use crate::test_dir::TestDir;

/// `json` with each of `dynamic` (value, placeholder) replaced, and each
/// `(<n> ms left)` as `(<ms> ms left)`.
fn pinned(json: String, dynamic: &[(&str, &str)]) -> String {
    let mut out = json;
    for (value, placeholder) in dynamic {
        if !value.is_empty() {
            out = out.replace(value, placeholder);
        }
    }
    let mut masked = String::new();
    let mut rest = out.as_str();
    while let Some(at) = rest.find(" ms left)") {
        let digits = rest[..at].trim_end_matches(|c: char| c.is_ascii_digit());
        masked.push_str(digits);
        masked.push_str("<ms>");
        masked.push_str(" ms left)");
        rest = &rest[at + " ms left)".len()..];
    }
    masked.push_str(rest);
    masked
}

/// Compares an answer with its pinned JSON.
#[track_caller]
fn same(actual: String, expected: &str) {
    assert_eq!(actual, expected);
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap()
}

/// The UUIDs of an allocation answer, as placeholders.
fn uuids(resp: &IpamResponse) -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    if let Some(el) = &resp.ipv4 {
        out.push((el.expiration_uuid.clone(), "<uuid4>"));
    }
    if let Some(el) = &resp.ipv6 {
        out.push((el.expiration_uuid.clone(), "<uuid6>"));
    }
    out
}

fn pin_answer(resp: &IpamResponse) -> String {
    let dynamic = uuids(resp);
    let mut dynamic: Vec<(&str, &str)> = dynamic.iter().map(|(v, p)| (v.as_str(), *p)).collect();
    dynamic.push((resp.journal_mark.as_str(), "<mark>"));
    pinned(json(resp), &dynamic)
}

#[test]
fn the_answers_of_a_host_scope_node_are_pinned() {
    let dir = TestDir::new("state");
    let mut s = start(&dir, &Setup::dual());
    let journal = journal_in(&dir).display().to_string();

    let c1 = s.allocate(&pod("c1"), false).unwrap();
    same(
        pin_answer(&ipam_response(c1.clone())),
        r#"{"address":{"ipv4":"10.0.0.2","ipv4-pool-name":"default","ipv6":"fd00::2","ipv6-pool-name":"default"},"ipv4":{"ip":"10.0.0.2","cidrs":null,"expiration-uuid":"<uuid4>","pool":"default"},"ipv6":{"ip":"fd00::2","cidrs":null,"expiration-uuid":"<uuid6>","pool":"default"},"host-addressing":{"ipv4":{"enabled":true,"ip":"10.0.0.1","alloc-range":"10.0.0.0/28"},"ipv6":{"enabled":true,"ip":"fd00::1","alloc-range":"fd00::/124"}},"journal-mark":"<mark>","podnet-config":{"addressing":{"ipv4":{"enabled":true,"ip":"10.0.0.1","alloc-range":"10.0.0.0/28"},"ipv6":{"enabled":true,"ip":"fd00::1","alloc-range":"fd00::/124"}},"ipam-mode":"cluster-pool","deviceMTU":1500,"routeMTU":1500,"datapathMode":"veth","configuredDatapathMode":"veth","node-name":"node-a"}}"#,
    );
    let created = s.create_endpoint(&endpoint_for("c1", &c1)).unwrap();
    same(
        json(&endpoint_view(created.clone())),
        r#"{"container-id":"c1","container-interface-name":"eth0","interface-name":"lxc18b8fe0ca3d6","owner":"ns/c1","addressing":{"ipv4":"10.0.0.2","ipv4-pool-name":"default","ipv6":"fd00::2","ipv6-pool-name":"default"},"restored":false}"#,
    );
    let found = s.endpoint("cni-attachment-id:c1:eth0").unwrap();
    assert_eq!(found, created);

    let c2 = s.allocate(&pod("c2"), false).unwrap();
    let given = s.allocate_ip("10.0.0.9", "ns/static", "").unwrap();
    same(
        json(&ipam_response(given)),
        r#"{"address":{"ipv4":"10.0.0.9","ipv4-pool-name":"default"},"ipv4":{"ip":"10.0.0.9","cidrs":null,"pool":"default"},"host-addressing":{"ipv4":{"enabled":true,"ip":"10.0.0.1","alloc-range":"10.0.0.0/28"},"ipv6":{"enabled":true,"ip":"fd00::1","alloc-range":"fd00::/124"}}}"#,
    );

    let c3 = s.allocate(&pod("c3"), false).unwrap();
    s.create_endpoint(&endpoint_for("c3", &c3)).unwrap();
    s.delete_endpoints(&del("c3")).unwrap();
    let c4 = s.allocate(&pod("c4"), false).unwrap();
    s.create_endpoint(&endpoint_for("c4", &c4)).unwrap();
    s.delete_endpoints(&del_with_links("c4")).unwrap();

    same(
        json(&daemon_configuration(s.config())),
        r#"{"status":{"addressing":{"ipv4":{"enabled":true,"ip":"10.0.0.1","alloc-range":"10.0.0.0/28"},"ipv6":{"enabled":true,"ip":"fd00::1","alloc-range":"fd00::/124"}},"ipam-mode":"cluster-pool","deviceMTU":1500,"routeMTU":1500,"datapathMode":"veth","configuredDatapathMode":"veth","node-name":"node-a"}}"#,
    );
    let c2_uuids = uuids(&ipam_response(c2));
    let dynamic: Vec<(&str, &str)> = c2_uuids
        .iter()
        .map(|(v, p)| (v.as_str(), *p))
        .chain([(journal.as_str(), "<journal>")])
        .collect();
    same(
        pinned(json(&status_response(s.status(false))), &dynamic),
        r#"{"cilium":{"state":"Ok"},"ipam":{"allocations":{"10.0.0.1":"router","10.0.0.2":"ns/c1","10.0.0.3":"ns/c2 [expiring]","10.0.0.9":"ns/static","fd00::1":"router","fd00::2":"ns/c1","fd00::3":"ns/c2 [expiring]"},"ipv4":["10.0.0.1","10.0.0.2","10.0.0.3","10.0.0.4","10.0.0.5","10.0.0.9"],"ipv6":["fd00::1","fd00::2","fd00::3","fd00::4","fd00::5"],"status":"IPv6: 5/14 allocated from fd00::/124, IPv4: 6/14 allocated from 10.0.0.0/28","ranges":[{"family":"ipv6","cidr":"fd00::/124","used":5,"usable":14,"cooling":2,"pool":"default","can-grow":false},{"family":"ipv4","cidr":"10.0.0.0/28","used":6,"usable":14,"cooling":2,"pool":"default","can-grow":false}],"mode":"cluster-pool","node-name":"node-a","cooling":{"10.0.0.4":"ns/c3 (<ms> ms left)","10.0.0.5":"ns/c4 (held until its links are gone)","fd00::4":"ns/c3 (<ms> ms left)","fd00::5":"ns/c4 (held until its links are gone)"},"restore":{"restored":0,"expired":0,"cooled-down":0,"queued-deletes":0,"outside-ranges":[],"released-link-gone":[],"orphan-links-removed":[],"adopted-from-kernel":[],"unaccounted-links-kept":[]},"datapath":"veth","journal":"<journal>","journal-bytes":0,"queue-depth":0,"queue-unreadable":0,"queue-unreadable-files":[]}}"#,
    );
    same(
        pinned(json(&status_response(s.status(true))), &dynamic),
        r#"{"cilium":{"state":"Ok"},"ipam":{"allocations":{},"status":"IPv6: 5/14 allocated from fd00::/124, IPv4: 6/14 allocated from 10.0.0.0/28","ranges":[{"family":"ipv6","cidr":"fd00::/124","used":5,"usable":14,"cooling":2,"pool":"default","can-grow":false},{"family":"ipv4","cidr":"10.0.0.0/28","used":6,"usable":14,"cooling":2,"pool":"default","can-grow":false}],"mode":"cluster-pool","node-name":"node-a","cooling":{},"restore":{"restored":0,"expired":0,"cooled-down":0,"queued-deletes":0,"outside-ranges":[],"released-link-gone":[],"orphan-links-removed":[],"adopted-from-kernel":[],"unaccounted-links-kept":[]},"datapath":"veth","journal":"<journal>","journal-bytes":0,"queue-depth":0,"queue-unreadable":0,"queue-unreadable-files":[]}}"#,
    );

    let gc = GcRequest {
        network: "podnet".into(),
        valid_attachments: vec![AttachmentRef {
            container_id: "c1".into(),
            ifname: "eth0".into(),
        }],
    };
    let collected = s.gc(&gc_scope(&gc)).unwrap();
    same(
        json(&gc_response(&collected)),
        r#"{"released":["10.0.0.3 (ns/c2)","fd00::3 (ns/c2)"]}"#,
    );
    assert_eq!(
        collected.stale_attachments,
        vec![("c2".to_string(), "eth0".to_string())]
    );
}

#[test]
fn the_status_of_a_full_multi_pool_node_is_pinned() {
    let dir = TestDir::new("state");
    let pools = vec![
        pool_def(DEFAULT_POOL, "10.10.0.0/30", 30),
        pool_def("blue", "10.20.0.0/24", 29),
    ];
    let mut s = start(
        &dir,
        &Setup::multi_pool(pools, &[(DEFAULT_POOL, 1), ("blue", 1)]),
    );
    let journal = journal_in(&dir).display().to_string();
    for i in 0..2 {
        let _ = s.allocate(&plain(&format!("ns/d{i}"), ""), false);
    }
    s.allocate(&plain("ns/b0", "blue"), false).unwrap();
    let dynamic = [(journal.as_str(), "<journal>")];
    same(
        pinned(json(&status_response(s.status(false))), &dynamic),
        r#"{"cilium":{"state":"Warning","msg":"ipv4 range 10.10.0.0/30 of node node-a is full (2/2 in use, 0 cooling)"},"ipam":{"allocations":{"10.10.0.1":"router","10.10.0.2":"ns/d0","blue/10.20.0.1":"ns/b0"},"ipv4":["10.10.0.1","10.10.0.2","10.20.0.1"],"status":"IPv4: 2 IPAM pool(s) available","ranges":[{"family":"ipv4","cidr":"10.20.0.0/29","used":1,"usable":6,"cooling":0,"pool":"blue","can-grow":true},{"family":"ipv4","cidr":"10.10.0.0/30","used":2,"usable":2,"cooling":0,"pool":"default","can-grow":false}],"mode":"multi-pool","node-name":"node-a","default-pool":"default","cooling":{},"restore":{"restored":0,"expired":0,"cooled-down":0,"queued-deletes":0,"outside-ranges":[],"released-link-gone":[],"orphan-links-removed":[],"adopted-from-kernel":[],"unaccounted-links-kept":[]},"datapath":"veth","journal":"<journal>","journal-bytes":0,"queue-depth":0,"queue-unreadable":0,"queue-unreadable-files":[]}}"#,
    );
}

/// An IPv4 eni node's configuration, without a router address yet.
fn config() -> NodeConfig {
    NodeConfig {
        addressing: vec![FamilyAddressing {
            family: Family::V4,
            router: None,
            alloc_range: Some("10.0.0.0/28".into()),
        }],
        ipam_mode: IpamMode::Eni,
        mtu: 9001,
        datapath_mode: DatapathMode::Veth,
        configured_datapath_mode: DatapathMode::Auto,
        node_name: "node-a".into(),
        bandwidth_manager: true,
    }
}

#[test]
fn an_eni_allocation_carries_its_routing_in_its_family_element() {
    let allocated = Allocated {
        addresses: vec![AllocatedAddress {
            ip: "10.0.0.5".parse().unwrap(),
            pool: DEFAULT_POOL.into(),
            expiration_uuid: Some("u4".into()),
            skip_masquerade: true,
            eni: Some(EniRouting {
                eni_id: "eni-1".into(),
                mac: "0a:00:00:00:00:01".into(),
                interface_number: 2,
                gateway: Some("10.0.0.1".parse().unwrap()),
                vpc_cidrs: vec!["10.0.0.0/16".parse().unwrap()],
                subnet_cidr: None,
            }),
        }],
        config: config(),
        commit: Some(AllocationCommit {
            journal_mark: JournalMark {
                journal_id: "j".into(),
                seq: 7,
            },
            endpoint_pending: true,
        }),
    };
    same(
        json(&ipam_response(allocated)),
        r#"{"address":{"ipv4":"10.0.0.5","ipv4-pool-name":"default"},"ipv4":{"ip":"10.0.0.5","gateway":"10.0.0.1","cidrs":["10.0.0.0/16"],"master-mac":"0a:00:00:00:00:01","expiration-uuid":"u4","interface-number":"2","skip-masquerade":true,"pool":"default"},"host-addressing":{"ipv4":{"enabled":true,"alloc-range":"10.0.0.0/28"}},"journal-mark":"j.7","podnet-config":{"addressing":{"ipv4":{"enabled":true,"alloc-range":"10.0.0.0/28"}},"ipam-mode":"eni","deviceMTU":9001,"routeMTU":9001,"datapathMode":"veth","configuredDatapathMode":"auto","node-name":"node-a","bandwidth-manager":{"enabled":true}},"podnet-endpoint-pending":true}"#,
    );
}

#[test]
fn a_failing_journal_and_restored_addresses_show_in_the_status() {
    let holder = |ip: &str, pool: &str, hold| AddressHolder {
        ip: ip.parse().unwrap(),
        pool: pool.into(),
        owner: "ns/p".into(),
        hold,
    };
    let status = NodeStatus {
        health: Health {
            level: HealthLevel::Failure,
            message: "journal unavailable".into(),
        },
        ipam_mode: IpamMode::ClusterPool,
        node_name: "node-a".into(),
        datapath_mode: DatapathMode::Veth,
        journal: "/var/lib/podnet/journal.redb".into(),
        journal_error: Some("No space left on device".into()),
        default_pool: DEFAULT_POOL.into(),
        multi_pool: false,
        summary: String::new(),
        ranges: Vec::new(),
        pod_cidrs: Vec::new(),
        restore: RestoreReport::default(),
        config_check: None,
        addresses: Some(AddressBook {
            by_family: vec![(Family::V4, vec!["10.0.0.2".parse().unwrap()])],
            holders: vec![
                holder(
                    "10.0.0.2",
                    DEFAULT_POOL,
                    Hold::InUse {
                        restored: true,
                        expiring: true,
                    },
                ),
                holder(
                    "10.0.0.3",
                    "blue",
                    Hold::InUse {
                        restored: true,
                        expiring: false,
                    },
                ),
            ],
        }),
        bandwidth_manager: false,
    };
    same(
        json(&status_response(status)),
        r#"{"cilium":{"state":"Failure","msg":"journal unavailable"},"ipam":{"allocations":{"10.0.0.2":"ns/p [restored] [expiring]","blue/10.0.0.3":"ns/p [restored]"},"ipv4":["10.0.0.2"],"status":"","ranges":[],"mode":"cluster-pool","node-name":"node-a","cooling":{},"restore":{"restored":0,"expired":0,"cooled-down":0,"queued-deletes":0,"outside-ranges":[],"released-link-gone":[],"orphan-links-removed":[],"adopted-from-kernel":[],"unaccounted-links-kept":[]},"datapath":"veth","journal":"/var/lib/podnet/journal.redb","journal-bytes":0,"journal-error":"No space left on device","queue-depth":0,"queue-unreadable":0,"queue-unreadable-files":[]}}"#,
    );
}
