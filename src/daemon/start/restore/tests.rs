//! Unit tests of the restore phases: the daemon's phases in a row on a real
//! journal in a temporary directory, the node backend and the kernel as fakes.

use std::cell::RefCell;
use std::net::IpAddr;

use super::*;
use crate::daemon::config::DatapathMode;
use crate::daemon::config::resolved_options as resolved;
use crate::daemon::device_error::failed;
use crate::daemon::start::journal::{JournalFiles, open_journal};
use crate::daemon::start::node::tests::{FakeSource, started};
use crate::daemon::start::node::{connected, node_resource};
use crate::daemon::start::tests::assert_fails_in;
use crate::daemon::state::KernelLink;
use crate::daemon::state::tests::{del_with_links, endpoint_for, ips, pod};
use crate::datapath::link_marker::{JournalMark, LinkMarker};
use crate::datapath::{DatapathError, host_ifname};
use crate::node::NodeView;
use crate::test_dir::TestDir;

/// The state as the start restores it from the journal in `dir`, for a daemon
/// started with `args` (the backend says nothing of its own), and the journal's
/// origin.
fn restored(dir: &TestDir, args: &[&str]) -> (IpamState, JournalOrigin) {
    let (opts, checked) = started(args);
    let journal = open_journal(&JournalFiles, &dir.join("journal.redb"), false).unwrap();
    let source = FakeSource {
        initial: Some(Ok(NodeView::default())),
    };
    let mut backend = connected(&checked, Box::new(source), None).unwrap();
    let origin = journal.origin;
    let node = node_resource(&checked, &mut backend, origin, journal.node.as_ref(), &[]).unwrap();
    let mtus = mtus(&checked.config, 1500, || None);
    let state = restore_state(&checked, &opts, mtus, journal, node, &mut backend).unwrap();
    (state, origin)
}

/// The state after the whole restore, on a kernel with no pod links.
fn ready(dir: &TestDir, args: &[&str]) -> IpamState {
    let (mut state, origin) = restored(dir, args);
    reconcile_with_kernel(&FakeKernel::default(), &mut state, origin, &[]).unwrap();
    state
}

/// A kernel with the links `links`, whose checked deletes fail when told; records
/// what was deleted and which addresses' rules were called stale.
#[derive(Default)]
struct FakeKernel {
    links: Vec<KernelLink>,
    unreadable: bool,
    refuse_teardown: bool,
    deleted: RefCell<Vec<String>>,
    torn_down: RefCell<Vec<String>>,
    stale_of: Vec<IpAddr>,
    stale: RefCell<Vec<IpAddr>>,
}

fn eperm(action: &str) -> DeviceError {
    failed(action)(DatapathError::io(
        "netlink",
        std::io::Error::from_raw_os_error(libc::EPERM),
    ))
}

impl Kernel for FakeKernel {
    fn view(&self) -> Result<KernelView, DeviceError> {
        match self.unreadable {
            true => Err(eperm("listing the host links")),
            false => Ok(KernelView {
                links: self.links.clone(),
            }),
        }
    }

    fn delete_links(&self, names: &[String]) {
        self.deleted.borrow_mut().extend(names.iter().cloned());
    }

    fn delete_links_checked(&self, links: &[TeardownLink]) -> Result<(), DeviceError> {
        if self.refuse_teardown {
            return Err(eperm("deleting the teardown's links"));
        }
        let names = links.iter().map(|l| l.name.clone());
        self.torn_down.borrow_mut().extend(names);
        Ok(())
    }

    fn prune_pod_rules(&self, stale: &dyn Fn(IpAddr) -> bool) {
        let mut called = self.stale.borrow_mut();
        called.extend(self.stale_of.iter().copied().filter(|ip| stale(*ip)));
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A pod `cid`'s addresses, wired (its endpoint created) with the host link its
/// name gives.
fn wired_pod(state: &mut IpamState, cid: &str) -> Vec<IpAddr> {
    let resp = state.allocate(&pod(cid), false).unwrap();
    state.create_endpoint(&endpoint_for(cid, &resp)).unwrap();
    ips(&resp)
}

fn mtus_of(args: &[&str], default_route: Option<u32>) -> Mtus {
    let (opts, config) = resolved(args);
    mtus(&config, opts.mtu, || default_route)
}

#[test]
fn the_pod_mtu_leaves_room_for_the_underlays_outer_header() {
    let base = ["--mtu", "1500", "--k8s-kubeconfig-path", "/nonexistent"];
    for (extra, pod) in [
        (&["--underlay-protocol", "ipv4"][..], 1450),
        (&["--underlay-protocol", "ipv6"], 1430),
        (&["--routing-mode", "native"], 1500),
    ] {
        let m = mtus_of(&[&base[..], extra].concat(), None);
        assert_eq!((m.pod, m.device), (pod, 1500), "{extra:?}");
    }
}

#[test]
fn the_device_mtu_is_the_flags_else_the_default_routes_else_1500() {
    let native = ["--routing-mode", "native"];
    let flag = mtus_of(&[&native[..], &["--mtu", "1400"]].concat(), Some(9000));
    assert_eq!(
        flag,
        Mtus {
            pod: 1400,
            device: 1400
        }
    );
    let route = mtus_of(&native, Some(9000));
    assert_eq!(
        route,
        Mtus {
            pod: 9000,
            device: 9000
        }
    );
    let neither = mtus_of(&native, None);
    assert_eq!(
        neither,
        Mtus {
            pod: 1500,
            device: 1500
        }
    );
}

#[test]
fn the_pooling_mode_follows_the_ipam_mode() {
    let pooling = |args: &[&str], default_pool| {
        let (_, config) = resolved(args);
        pooling_mode(&config, default_pool)
    };
    assert!(matches!(pooling(&[], None), PoolingMode::HostScope));
    let kubernetes = pooling(
        &["--ipam", "kubernetes", "--pod-cidrs", "10.1.0.0/24"],
        None,
    );
    assert!(
        matches!(kubernetes, PoolingMode::HostScope),
        "{kubernetes:?}"
    );
    let kube = ["--k8s-kubeconfig-path", "/nonexistent"];
    let crd = pooling(&[&kube[..], &["--ipam", "crd"]].concat(), None);
    assert!(
        matches!(crd, PoolingMode::External { eni: false }),
        "{crd:?}"
    );
    let eni = pooling(&[&kube[..], &["--ipam", "eni"]].concat(), None);
    assert!(
        matches!(eni, PoolingMode::External { eni: true }),
        "{eni:?}"
    );
    for (backends, want) in [(Some("blue"), "blue"), (None, "default")] {
        let multi = pooling(&["--ipam", "multi-pool"], backends);
        assert!(
            matches!(&multi, PoolingMode::MultiPool(m)
                if m.default_pool == want && m.configured_default_pool == "default"),
            "{multi:?}"
        );
    }
}

#[test]
fn the_state_is_restored_with_the_checked_options_and_the_pods_mtu() {
    let (opts, mut checked) = started(&[
        "--enable-health-checking=false",
        "--datapath-mode",
        "auto",
        "--ipam",
        "multi-pool",
    ]);
    checked.datapath_mode = DatapathMode::Netkit;
    let cfg = state_config(
        &checked,
        &opts,
        Mtus {
            pod: 1450,
            device: 1500,
        },
        Some("blue"),
    );
    assert_eq!(cfg.node_name, "n1");
    assert_eq!(cfg.mtu, 1450);
    assert!(!cfg.reserve_health);
    assert_eq!(
        (cfg.datapath_mode, cfg.configured_datapath_mode),
        (DatapathMode::Netkit, DatapathMode::Auto)
    );
    assert!(
        matches!(&cfg.pooling, PoolingMode::MultiPool(m) if m.default_pool == "blue"),
        "{:?}",
        cfg.pooling
    );
}

#[test]
fn the_restored_state_is_this_nodes_on_the_node_resource_given() {
    let dir = TestDir::new("start-restore");
    let (state, origin) = restored(&dir, &["--cluster-pool-ipv4-cidr", "10.0.0.0/8"]);
    assert_eq!(origin, JournalOrigin::Created);
    assert_eq!(state.node().metadata.name, "n1");
    assert_eq!(
        state.node().spec.ipam.pod_cidrs,
        vec!["10.0.0.0/24".parse::<ipnet::IpNet>().unwrap()]
    );
}

#[test]
fn an_empty_delete_queue_replays_nothing_and_holds_the_queue_lock() {
    let dir = TestDir::new("start-restore");
    let (mut state, _) = restored(&dir, &[]);
    let replayed = replay_delete_queue(&mut state, &dir.join("podnet.sock")).unwrap();
    assert_eq!(state.restore_report().queued_deletes, 0);
    assert!(replayed.queue.entries().unwrap().is_empty());
}

/// A DEL of `<cid>:eth0` with its host link, as the plugin queues it.
fn queued_del(cid: &str) -> crate::api::models::EndpointBatchDeleteRequest {
    crate::api::models::EndpointBatchDeleteRequest {
        container_id: cid.into(),
        container_interface_name: "eth0".into(),
        teardown_links: vec![crate::api::models::LinkRef {
            name: host_ifname(cid, "eth0"),
            index: 42,
        }],
        ..Default::default()
    }
}

#[test]
fn queued_deletes_are_replayed_counted_and_removed() {
    let dir = TestDir::new("start-restore");
    let socket = dir.join("podnet.sock");
    let (mut state, _) = restored(&dir, &[]);
    let addresses = wired_pod(&mut state, "c1");
    drop(state);
    let queue = DeleteQueue::open(&socket).unwrap();
    for cid in ["c1", "unknown"] {
        queue.enqueue(&queued_del(cid)).unwrap();
    }
    let (mut state, _) = restored(&dir, &[]);
    let replayed = replay_delete_queue(&mut state, &socket).unwrap();
    assert_eq!(state.restore_report().queued_deletes, 2);
    assert!(replayed.queue.entries().unwrap().is_empty());
    let live = state.live_addresses();
    assert!(addresses.iter().all(|a| !live.contains(a)), "{live:?}");
}

#[test]
fn a_delete_queue_that_cannot_be_opened_fails_the_start_naming_it() {
    let dir = TestDir::new("start-restore");
    let (mut state, _) = restored(&dir, &[]);
    let not_a_dir = dir.join("file");
    std::fs::write(&not_a_dir, b"").unwrap();
    let err = replay_delete_queue(&mut state, &not_a_dir.join("podnet.sock"))
        .err()
        .unwrap();
    assert!(matches!(err, StartError::DeleteQueue(_)), "{err:?}");
    assert_fails_in(
        &err,
        "DEL queue replay",
        &[&not_a_dir.display().to_string()],
    );
}

#[test]
fn the_reconcile_reserves_the_router_and_prunes_only_the_rules_of_addresses_not_in_use() {
    let dir = TestDir::new("start-restore");
    let (mut state, origin) = restored(&dir, &["--cluster-pool-ipv4-cidr", "10.0.0.0/8"]);
    let kernel = FakeKernel {
        stale_of: vec![ip("10.0.0.1"), ip("10.0.0.9")],
        ..FakeKernel::default()
    };
    reconcile_with_kernel(&kernel, &mut state, origin, &[ip("10.0.0.1")]).unwrap();
    assert_eq!(state.router_ips(), [ip("10.0.0.1")]);
    assert_eq!(*kernel.stale.borrow(), [ip("10.0.0.9")]);
    assert!(kernel.deleted.borrow().is_empty());
}

#[test]
fn a_host_link_this_journal_made_and_released_is_deleted() {
    let dir = TestDir::new("start-restore");
    let mark = ready(&dir, &[]).journal_mark();
    let (mut state, origin) = restored(&dir, &[]);
    assert_eq!(origin, JournalOrigin::Existing);
    let kernel = FakeKernel {
        links: vec![KernelLink {
            name: "podnet-orphan".into(),
            routed: vec![ip("10.0.0.99")],
            marker: Some(LinkMarker {
                journal: JournalMark {
                    journal_id: mark.journal_id,
                    seq: mark.seq,
                },
                wired: true,
                container_id: Some("gone".into()),
                ifname: Some("eth0".into()),
                owner: Some("ns/gone".into()),
                pod_uid: None,
            }),
        }],
        ..FakeKernel::default()
    };
    reconcile_with_kernel(&kernel, &mut state, origin, &[]).unwrap();
    assert_eq!(*kernel.deleted.borrow(), ["podnet-orphan"]);
}

#[test]
fn an_unreadable_kernel_fails_the_start_saying_what_was_read() {
    let dir = TestDir::new("start-restore");
    let (mut state, origin) = restored(&dir, &[]);
    let kernel = FakeKernel {
        unreadable: true,
        ..FakeKernel::default()
    };
    let err = reconcile_with_kernel(&kernel, &mut state, origin, &[])
        .err()
        .unwrap();
    assert!(matches!(err, StartError::KernelView(_)), "{err:?}");
    assert_fails_in(&err, "kernel view", &["listing the host links"]);
}

#[test]
fn a_router_address_the_node_cannot_take_fails_the_start_naming_the_flag() {
    let dir = TestDir::new("start-restore");
    let args = ["--ipam", "delegated-plugin", "--enable-ipv6"];
    let (mut state, origin) = restored(&dir, &args);
    let err = reconcile_with_kernel(&FakeKernel::default(), &mut state, origin, &[])
        .err()
        .unwrap();
    assert!(matches!(err, StartError::KernelReconcile(_)), "{err:?}");
    assert_fails_in(&err, "kernel reconcile", &["--local-router-ipv6"]);
}

/// A state whose last run left pod `c1`'s teardown unfinished.
fn with_teardown(dir: &TestDir) -> IpamState {
    let mut state = ready(dir, &[]);
    wired_pod(&mut state, "c1");
    let td = state.delete_endpoints(&del_with_links("c1")).unwrap();
    assert!(td.is_some());
    drop(state);
    restored(dir, &[]).0
}

#[test]
fn the_teardowns_the_last_run_left_are_finished() {
    let dir = TestDir::new("start-restore");
    let mut state = with_teardown(&dir);
    let kernel = FakeKernel::default();
    reconcile_with_kernel(&kernel, &mut state, JournalOrigin::Existing, &[]).unwrap();
    assert_eq!(*kernel.torn_down.borrow(), [host_ifname("c1", "eth0")]);
    assert!(state.pending_teardowns().is_empty());
}

#[test]
fn a_teardown_whose_links_cannot_be_deleted_fails_the_start_and_stays_pending() {
    let dir = TestDir::new("start-restore");
    let mut state = with_teardown(&dir);
    let kernel = FakeKernel {
        refuse_teardown: true,
        ..FakeKernel::default()
    };
    let err = reconcile_with_kernel(&kernel, &mut state, JournalOrigin::Existing, &[])
        .err()
        .unwrap();
    assert!(matches!(err, StartError::Teardown(_)), "{err:?}");
    assert_fails_in(&err, "teardown", &["deleting the teardown's links"]);
    assert_eq!(state.pending_teardowns().len(), 1);
}
