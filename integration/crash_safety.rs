//! Crash safety with faults injected on purpose: the daemon killed in the middle of
//! a burst, DELs while it is down, pods that vanish while it is down, orphan links,
//! a corrupt journal and queue, hostile clients. The invariant every test checks:
//! no address is held by two sandboxes, and none is leaked.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::harness::*;

/// Asserts that every sandbox holds exactly the addresses the daemon records for
/// it, and that no address appears twice.
fn assert_consistent(node: &Node, sbs: &[&Sandbox]) {
    let allocs = node.allocations();
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for sb in sbs {
        for ip in sb.kernel_addresses() {
            if let Some(other) = seen.insert(ip.clone(), sb.ns.name.clone()) {
                panic!("{ip} is held by {other} and {}", sb.ns.name);
            }
            let owner = allocs
                .get(&ip)
                .unwrap_or_else(|| panic!("{ip} of {} is not recorded", sb.ns.name));
            assert!(
                owner.contains(&sb.ns.name),
                "{ip} of {} is recorded for {owner}",
                sb.ns.name
            );
        }
    }
}

fn pod_allocations(node: &Node) -> usize {
    node.allocations()
        .values()
        .filter(|o| !matches!(o.as_str(), "router" | "health"))
        .count()
}

#[test]
fn daemon_killed_in_the_middle_of_a_burst_loses_and_duplicates_nothing() {
    if !root_or_skip("kill_mid_burst") {
        return;
    }
    let mut node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.80.0.0/16",
        "--cluster-pool-ipv4-mask-size",
        "23",
        "--k8s-node-name",
        "burst",
        "--ipam-release-cooldown",
        "0s",
    ]);
    let sbs: Vec<Sandbox> = (0..200).map(|_| node.sandbox()).collect();
    let refs: Vec<&Sandbox> = sbs.iter().collect();
    let pid = node.daemon_pid().expect("daemon pid");
    // 32 plugins at once; the daemon is killed (SIGKILL, by PID) once 60 finished.
    let done = AtomicUsize::new(0);
    let results = std::thread::scope(|s| {
        s.spawn(|| {
            while done.load(Ordering::SeqCst) < 60 {
                std::thread::sleep(Duration::from_millis(2));
            }
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        });
        let out = node.plugin_parallel_counting("ADD", &refs, 32, &done);
        done.store(usize::MAX / 2, Ordering::SeqCst);
        out
    });
    let failed: Vec<usize> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.ok)
        .map(|(i, _)| i)
        .collect();
    assert!(!failed.is_empty(), "the kill came too late to hit any ADD");
    for i in &failed {
        assert_eq!(
            results[*i].code(),
            11,
            "a failed ADD must say try again: {:?}",
            results[*i]
        );
    }
    node.stop_daemon(true);
    node.start_daemon();
    // The runtime's retry: DEL after a failed ADD, then ADD again.
    let retry: Vec<&Sandbox> = failed.iter().map(|i| &sbs[*i]).collect();
    for r in node.plugin_parallel("DEL", &retry, 8) {
        assert!(r.ok, "{r:?}");
    }
    for r in node.plugin_parallel("ADD", &retry, 8) {
        assert!(r.ok, "{r:?}");
    }
    assert_consistent(&node, &refs);
    assert_eq!(
        pod_allocations(&node),
        200,
        "every sandbox holds one address, nothing else is held"
    );
    for r in node.plugin_parallel("DEL", &refs, 16) {
        assert!(r.ok, "{r:?}");
    }
    assert_eq!(
        pod_allocations(&node),
        0,
        "addresses leaked: {:?}",
        node.allocations()
    );
    assert!(node.host_links_gone());
    eprintln!(
        "kill_mid_burst: {} of 200 ADDs hit the kill and were retried",
        failed.len()
    );
}

#[test]
fn sixty_four_parallel_adds_get_distinct_addresses() {
    if !root_or_skip("parallel_adds") {
        return;
    }
    let node = Node::dual_stack();
    let sbs: Vec<Sandbox> = (0..64).map(|_| node.sandbox()).collect();
    let refs: Vec<&Sandbox> = sbs.iter().collect();
    let results = node.plugin_parallel("ADD", &refs, 64);
    let mut all = BTreeSet::new();
    for r in &results {
        for ip in r.ips() {
            assert!(all.insert(ip.clone()), "{ip} handed out twice");
        }
    }
    assert_eq!(all.len(), 128);
    assert_consistent(&node, &refs);
    assert!(
        node.client().healthz().is_ok(),
        "the daemon must keep answering"
    );
}

#[test]
fn dels_while_the_daemon_is_down_are_replayed_and_cooling_addresses_are_not_reused() {
    if !root_or_skip("queued_dels") {
        return;
    }
    let mut node = Node::dual_stack();
    let sbs: Vec<Sandbox> = (0..20).map(|_| node.sandbox()).collect();
    let refs: Vec<&Sandbox> = sbs.iter().collect();
    let freed: BTreeSet<String> = node
        .plugin_parallel("ADD", &refs, 8)
        .iter()
        .flat_map(|r| r.ips())
        .collect();
    node.stop_daemon(false);
    for r in node.plugin_parallel("DEL", &refs, 8) {
        assert!(r.ok, "DEL with the daemon down must succeed: {r:?}");
    }
    node.start_daemon();
    let st = node.client().healthz().expect("healthz");
    assert_eq!(st.ipam.restore.queued_deletes, 20);
    for ip in &freed {
        assert!(
            !st.ipam.allocations.contains_key(ip),
            "{ip} still allocated"
        );
        assert!(st.ipam.cooling.contains_key(ip), "{ip} not cooling");
    }
    let queue = node.socket().parent().expect("dir").join("delete-queue");
    let left: Vec<_> = std::fs::read_dir(&queue)
        .expect("queue")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".delete"))
        .collect();
    assert!(left.is_empty(), "queue not drained");
    // New pods get other addresses while those cool down (default 30 s).
    let fresh: Vec<Sandbox> = (0..20).map(|_| node.sandbox()).collect();
    let frefs: Vec<&Sandbox> = fresh.iter().collect();
    for r in node.plugin_parallel("ADD", &frefs, 8) {
        for ip in r.ips() {
            assert!(!freed.contains(&ip), "{ip} handed out while cooling");
        }
    }
    // The cooldown survives a restart too.
    node.stop_daemon(true);
    node.start_daemon();
    let st = node.client().healthz().expect("healthz");
    assert!(
        freed.iter().all(|ip| st.ipam.cooling.contains_key(ip)),
        "cooling lost across a restart"
    );
}

#[test]
fn restore_reconciles_with_the_kernel() {
    if !root_or_skip("reconcile") {
        return;
    }
    let mut node = Node::dual_stack();
    let mut gone = node.sandbox();
    let kept = node.sandbox();
    let (rg, rk) = (node.add(&gone), node.add(&kept));
    let journal_id = node.journal_id_of(&podnet::datapath::host_ifname(&kept.container_id, "eth0"));
    let range: ipnet::Ipv4Net = node.ipv4_addressing().alloc_range.parse().expect("range");
    let late_ip = std::net::Ipv4Addr::from(u32::from(range.network()) + 200).to_string();
    node.stop_daemon(true);
    // While the daemon is down: a pod's netns disappears (its veth with it), and
    // lxc links appear that no allocation accounts for: one this journal made and
    // released (its marker says so), one without a marker (not provably podnet's),
    // and one made at a commit the journal does not have (the journal lost it).
    gone.ns.delete();
    assert!(
        node.host_links_down_to(1),
        "the deleted netns did not take its veth with it"
    );
    let stray = |name: &str, peer: &str, alias: Option<String>| {
        let out = node.ns.exec(&[
            "ip", "link", "add", name, "type", "veth", "peer", "name", peer,
        ]);
        assert!(out.status.success());
        if let Some(a) = alias {
            assert!(
                node.ns
                    .exec(&["ip", "link", "set", name, "alias", &a])
                    .status
                    .success()
            );
        }
    };
    stray(
        "lxcdeadbeef0001",
        "strayp1",
        Some(format!("podnet j={journal_id}.1 c=gone-cid i=eth0")),
    );
    stray("lxcdeadbeef0002", "strayp2", None);
    stray(
        "lxcdeadbeef0003",
        "strayp3",
        Some(format!(
            "podnet j={journal_id}.99999999 c=late-cid i=eth0 o=default/late"
        )),
    );
    assert!(
        node.ns
            .exec(&["ip", "link", "set", "lxcdeadbeef0003", "up"])
            .status
            .success()
    );
    let out = node.ns.exec(&[
        "ip",
        "route",
        "add",
        &format!("{late_ip}/32"),
        "dev",
        "lxcdeadbeef0003",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    node.start_daemon();
    let st = node.client().healthz().expect("healthz");
    let report = &st.ipam.restore;
    assert!(
        report
            .released_link_gone
            .iter()
            .any(|s| s.starts_with(&rg.ipv4())),
        "{report:?}"
    );
    assert!(!st.ipam.allocations.contains_key(&rg.ipv4()));
    assert!(
        st.ipam
            .allocations
            .get(&rk.ipv4())
            .is_some_and(|o| o.ends_with("[restored]"))
    );
    assert_eq!(
        report.orphan_links_removed,
        vec!["lxcdeadbeef0001".to_string()]
    );
    assert_eq!(
        report.unaccounted_links_kept,
        vec!["lxcdeadbeef0002".to_string()]
    );
    assert!(
        report
            .adopted_from_kernel
            .iter()
            .any(|a| a.starts_with(&late_ip)),
        "{report:?}"
    );
    assert!(
        report.adopted_because.contains("newer than the journal"),
        "{report:?}"
    );
    assert_eq!(
        st.ipam.allocations.get(&late_ip).map(String::as_str),
        Some("default/late [from kernel]")
    );
    let mut links = node.host_links();
    links.sort();
    assert_eq!(links.len(), 3, "{links:?}");
    assert!(!links.contains(&"lxcdeadbeef0001".to_string()));
    assert!(kept.ping(&node.ipv4_addressing().ip));
    // The adopted attachment is a pod like any other: its DEL releases it.
    let late = Sandbox {
        ns: Netns::new("pnt-late"),
        container_id: "late-cid".into(),
        ifname: "eth0".into(),
    };
    assert!(node.del(&late).ok);
    assert!(!node.allocations().contains_key(&late_ip));
}

#[test]
fn a_corrupt_journal_is_refused_then_rebuilt_from_the_kernel() {
    if !root_or_skip("corrupt_journal") {
        return;
    }
    let mut node = Node::dual_stack();
    let a = node.sandbox();
    let b = node.sandbox();
    let (ra, rb) = (node.add(&a), node.add(&b));
    let router = node.ipv4_addressing();
    node.stop_daemon(true);
    let journal = node.state_dir().join("journal.redb");
    std::fs::write(&journal, vec![0xA5u8; 8192]).expect("corrupt the journal");
    let out = node.daemon_command(&[]).output().expect("daemon");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a corrupt journal was accepted");
    assert!(
        err.contains("journal.redb") && err.contains("--rebuild-from-kernel"),
        "{err}"
    );
    // The documented way out.
    node.args.push("--rebuild-from-kernel".into());
    node.start_daemon();
    let st = node.client().healthz().expect("healthz");
    let cfg = node.ipv4_addressing();
    assert_eq!(
        cfg.ip, router.ip,
        "the router address must survive a rebuild"
    );
    assert_eq!(cfg.alloc_range, router.alloc_range);
    for ip in ra.ips().iter().chain(rb.ips().iter()) {
        assert!(
            st.ipam
                .allocations
                .get(ip)
                .is_some_and(|o| o.contains("[from kernel]")),
            "{ip}: {:?}",
            st.ipam.allocations
        );
    }
    assert!(a.ping(&rb.ipv4()));
    let aside = std::fs::read_dir(node.state_dir())
        .expect("state")
        .flatten()
        .any(|e| e.file_name().to_string_lossy().contains("corrupt"));
    assert!(aside, "the damaged journal must be kept aside");
    // New pods do not collide with adopted addresses; DEL frees adopted ones.
    let c = node.sandbox();
    let rc = node.add(&c);
    assert!(!ra.ips().contains(&rc.ipv4()) && !rb.ips().contains(&rc.ipv4()));
    assert!(node.del(&a).ok);
    let st = node.client().healthz().expect("healthz");
    assert!(
        ra.ips()
            .iter()
            .all(|ip| !st.ipam.allocations.contains_key(ip)),
        "{:?}",
        st.ipam.allocations
    );
}

#[test]
fn a_corrupt_queue_entry_is_set_aside_not_guessed() {
    if !root_or_skip("corrupt_queue") {
        return;
    }
    let mut node = Node::dual_stack();
    node.stop_daemon(false);
    let queue = node.socket().parent().expect("dir").join("delete-queue");
    std::fs::create_dir_all(&queue).expect("queue dir");
    std::fs::write(queue.join("00000000.delete"), b"{\"container-id\": tru").expect("write");
    node.start_daemon();
    assert!(queue.join("00000000.bad").exists());
    assert!(node.log().contains("is corrupt"));
}

#[test]
fn hostile_clients_do_not_block_others() {
    if !root_or_skip("hostile_clients") {
        return;
    }
    let node = Node::dual_stack();
    // Ten clients that send half a request and stall.
    let stalled: Vec<UnixStream> = (0..10)
        .map(|_| {
            let mut s = UnixStream::connect(node.socket()).expect("connect");
            s.write_all(b"POST /v1/ipam HTTP/1.1\r\nHost: x\r\n")
                .expect("write");
            s
        })
        .collect();
    let t = Instant::now();
    assert!(node.client().healthz().is_ok());
    let a = node.sandbox();
    let r = node.add(&a);
    assert!(r.ok, "{r:?}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "stalled clients blocked the daemon"
    );
    drop(stalled);
    // Releasing an address a running endpoint owns is refused.
    let status = node
        .client()
        .call("DELETE", &format!("/v1/ipam/{}", r.ipv4()), &[], None)
        .err()
        .and_then(|e| e.status());
    assert_eq!(status, Some(409));
    assert!(node.allocations().contains_key(&r.ipv4()));
}

#[test]
fn a_state_dir_others_can_write_is_refused() {
    if !root_or_skip("state_dir_perms") {
        return;
    }
    let node = Node::dual_stack();
    let dir = node.dir.join("open-state");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("chmod");
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &node.ns.name,
            podnet_bin(),
            "daemon",
            "--socket",
        ])
        .arg(node.dir.join("other").join("s.sock"))
        .arg("--state-dir")
        .arg(&dir)
        .output()
        .expect("daemon");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("writable by group or others"), "{err}");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(node.socket())
            .expect("socket")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "socket mode");
}

#[test]
fn del_teardown_runs_in_the_background_and_a_crash_cannot_leave_it_half_done() {
    if !root_or_skip("async_teardown") {
        return;
    }
    let mut node = Node::dual_stack();
    let sbs: Vec<Sandbox> = (0..12).map(|_| node.sandbox()).collect();
    let refs: Vec<&Sandbox> = sbs.iter().collect();
    let ips: BTreeSet<String> = node
        .plugin_parallel("ADD", &refs, 8)
        .iter()
        .flat_map(|r| r.ips())
        .collect();
    for r in node.plugin_parallel("DEL", &refs, 8) {
        assert!(r.ok, "{r:?}");
    }
    // Kill the daemon right away: some teardowns may still be in flight.
    node.stop_daemon(true);
    node.start_daemon();
    assert!(node.host_links_gone(), "a host link survived the teardown");
    let routes = String::from_utf8_lossy(&node.ns.exec(&["ip", "route", "show"]).stdout)
        .to_string()
        + &String::from_utf8_lossy(&node.ns.exec(&["ip", "-6", "route", "show"]).stdout);
    let proxies =
        String::from_utf8_lossy(&node.ns.exec(&["ip", "-6", "neigh", "show", "proxy"]).stdout)
            .to_string();
    let st = node.client().healthz().expect("healthz");
    for ip in &ips {
        assert!(
            !routes.contains(&format!("{ip} ")),
            "route to {ip} survived:\n{routes}"
        );
        assert!(
            !st.ipam.allocations.contains_key(ip),
            "{ip} still allocated"
        );
        assert!(
            st.ipam.cooling.contains_key(ip),
            "{ip} should be cooling after its teardown"
        );
        assert!(
            st.ipam.cooling.get(ip).is_some_and(|c| !c.contains("held")),
            "{ip} still held: {:?}",
            st.ipam.cooling
        );
    }
    assert!(
        !proxies.contains("lxc"),
        "proxy entries survived:\n{proxies}"
    );
    for sb in &sbs {
        assert!(sb.interface_gone(), "{} kept its interface", sb.ns.name);
    }
}
