//! Faults injected into the journal and around it, on purpose: a journal lost,
//! emptied or wiped with the state dir; a damaged page and a corrupt node record;
//! a full disk under the state dir; an address that expires because its plugin
//! died; and DELs aimed at interfaces podnet did not make. The promise each test
//! holds: no running pod loses its network, nothing is handed out twice, and the
//! error says what to do.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::*;
use podnet::datapath::host_ifname;

/// Ways of losing the journal while the daemon is down.
const LOSSES: [&str; 3] = ["truncated", "removed", "state dir wiped"];

fn lose_journal(node: &Node, how: &str) {
    let journal = node.state_dir().join("journal.redb");
    match how {
        "truncated" => std::fs::write(&journal, b"").expect("truncate"),
        "removed" => std::fs::remove_file(&journal).expect("remove"),
        _ => std::fs::remove_dir_all(node.state_dir()).expect("wipe"),
    }
}

#[test]
fn a_lost_journal_never_deletes_running_pods() {
    if !root_or_skip("lost_journal") {
        return;
    }
    for how in LOSSES {
        let mut node = Node::dual_stack();
        let (a, b) = (node.sandbox(), node.sandbox());
        let (ra, rb) = (node.add(&a), node.add(&b));
        assert!(ra.ok && rb.ok, "{} {}", ra.stdout, rb.stdout);
        let router = node.ipv4_addressing();
        node.stop_daemon(true);
        lose_journal(&node, how);
        node.start_daemon();

        assert_eq!(node.host_links().len(), 2, "{how}: pod links were removed");
        assert!(a.ping(&rb.ipv4()), "{how}: pods lost connectivity");
        assert!(b.ping(&router.ip), "{how}: the router moved");
        let st = node.client().healthz().expect("healthz");
        let report = &st.ipam.restore;
        for ip in ra.ips().iter().chain(rb.ips().iter()) {
            assert!(
                report
                    .adopted_from_kernel
                    .iter()
                    .any(|s| s.starts_with(ip.as_str())),
                "{how}: {ip} not adopted: {report:?}"
            );
            assert!(
                st.ipam
                    .allocations
                    .get(ip)
                    .is_some_and(|o| o.contains("[from kernel]")),
                "{how}: {ip}: {:?}",
                st.ipam.allocations
            );
        }
        assert!(
            report.adopted_because.contains("missing or empty"),
            "{how}: {report:?}"
        );
        assert!(report.orphan_links_removed.is_empty(), "{how}: {report:?}");
        assert_eq!(node.ipv4_addressing().ip, router.ip, "{how}");
        // The adopted pods are whole: CHECK passes, new pods get other addresses,
        // and DEL releases them.
        let checked = node.check(&a, &ra);
        assert!(
            checked.ok,
            "{how}: CHECK of an adopted pod: {}",
            checked.stdout
        );
        let c = node.sandbox();
        let rc = node.add(&c);
        assert!(rc.ok, "{how}: {}", rc.stdout);
        for ip in rc.ips() {
            assert!(
                !ra.ips().contains(&ip) && !rb.ips().contains(&ip),
                "{how}: {ip} handed out twice"
            );
        }
        assert!(node.del(&a).ok);
        assert!(a.interface_gone(), "{how}");
        let allocations = node.allocations();
        assert!(
            ra.ips().iter().all(|ip| !allocations.contains_key(ip)),
            "{how}"
        );
        assert!(b.ping(&rc.ipv4()), "{how}");
    }
}

#[test]
fn a_damaged_journal_is_refused_without_a_panic_and_rebuilt() {
    if !root_or_skip("damaged_journal") {
        return;
    }
    let mut node = Node::dual_stack();
    let (a, b) = (node.sandbox(), node.sandbox());
    let (ra, rb) = (node.add(&a), node.add(&b));
    node.stop_daemon(false);
    let journal = node.state_dir().join("journal.redb");
    let mut bytes = std::fs::read(&journal).expect("journal");
    // Zero every page after the header: whatever redb keeps where, the tables are hit.
    for page in bytes.chunks_mut(4096).skip(1) {
        page.fill(0);
    }
    std::fs::write(&journal, &bytes).expect("damage");
    let out = node.daemon_command(&[]).output().expect("daemon");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a damaged journal was accepted: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("journal.redb") && err.contains("--rebuild-from-kernel"),
        "{err}"
    );
    assert_eq!(
        node.host_links().len(),
        2,
        "a refused start must not touch pods"
    );

    node.args.push("--rebuild-from-kernel".into());
    node.start_daemon();
    let allocations = node.allocations();
    for ip in ra.ips().iter().chain(rb.ips().iter()) {
        assert!(
            allocations
                .get(ip)
                .is_some_and(|o| o.contains("[from kernel]")),
            "{ip}"
        );
    }
    assert!(a.ping(&rb.ipv4()));
}

#[test]
fn a_corrupt_node_record_has_a_way_out() {
    if !root_or_skip("corrupt_node_record") {
        return;
    }
    let mut node = Node::dual_stack();
    let a = node.sandbox();
    let ra = node.add(&a);
    node.stop_daemon(false);
    {
        let (mut journal, _) =
            podnet::store::Journal::open(&node.state_dir().join("journal.redb")).expect("journal");
        journal
            .commit(&[podnet::store::JournalOp::PutMeta {
                key: "ciliumnode".into(),
                value: serde_json::json!({"spec": "not a node"}),
            }])
            .expect("write the bad record");
    }
    let out = node.daemon_command(&[]).output().expect("daemon");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("node resource record is corrupt") && err.contains("--rebuild-from-kernel"),
        "{err}"
    );
    node.args.push("--rebuild-from-kernel".into());
    node.start_daemon();
    assert!(
        node.allocations()
            .get(&ra.ipv4())
            .is_some_and(|o| o.contains("[from kernel]"))
    );
    assert!(a.ping(&node.ipv4_addressing().ip));
}

/// A small tmpfs mounted on a directory, unmounted on drop.
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    fn mount(dir: &Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(dir).expect("mount point");
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "podnet-it",
            ])
            .arg(dir)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk {
            dir: dir.to_path_buf(),
        }
    }

    /// Fills the filesystem with one file; returns its path.
    fn fill(&self) -> PathBuf {
        let path = self.dir.join("filler");
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=64k"])
            .arg(format!("of={}", path.display()))
            .output();
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).output();
    }
}

#[test]
fn a_full_disk_is_reported_and_recovered_from() {
    if !root_or_skip("full_disk") {
        return;
    }
    let mut node = Node::new(&[&DUAL_STACK[..], &["--ipam-release-cooldown", "0s"]].concat());
    let disk = SmallDisk::mount(&node.state_dir(), "2m");
    node.start_daemon();
    let a = node.sandbox();
    let ra = node.add(&a);
    assert!(ra.ok, "{}", ra.stdout);
    let filler = disk.fill();

    // ADDs fail with "try again later" and say why; nothing is half made. (A
    // commit that fits in the journal file's free pages still succeeds: with one
    // commit per ADD a few may, so up to 12 are tried.)
    let pending: Vec<Sandbox> = (0..12).map(|_| node.sandbox()).collect();
    let (failed_at, failed) = pending
        .iter()
        .map(|sb| node.add(sb))
        .enumerate()
        .find(|(_, r)| !r.ok)
        .expect("an ADD on a full disk must fail");
    assert_eq!(failed.code(), 11, "{}", failed.stdout);
    assert!(failed.msg().contains("is full"), "{}", failed.msg());
    let st = node.client().healthz().expect("healthz");
    assert_eq!(st.cilium.state, "Failure", "{:?}", st.cilium);
    assert!(
        st.ipam.journal_error.contains("No space left"),
        "{}",
        st.ipam.journal_error
    );
    let status = node.plugin("STATUS", None, &node.conf("1.1.0"), &[]);
    assert_eq!(status.code(), 50, "{}", status.stdout);
    let explain = Command::new("ip")
        .args([
            "netns",
            "exec",
            &node.ns.name,
            podnet_bin(),
            "explain",
            "--socket",
        ])
        .arg(node.socket())
        .arg(format!("default/{}", pending[failed_at].ns.name))
        .output()
        .expect("explain");
    let explained = String::from_utf8_lossy(&explain.stdout);
    assert!(explained.contains("journal-unavailable"), "{explained}");
    assert!(explained.contains("--state-dir"), "{explained}");

    // DEL still succeeds: the release goes to the on-disk queue.
    let del = node.del(&a);
    assert!(del.ok, "{}", del.stdout);
    assert!(a.interface_gone());

    // Space comes back: the daemon reopens the journal, replays the queued DEL and
    // serves again, without a restart.
    std::fs::remove_file(&filler).expect("free space");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = node.client().healthz().expect("healthz");
        if st.cilium.state != "Failure" && !st.ipam.allocations.contains_key(&ra.ipv4()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no recovery: {:?} {:?}",
            st.cilium,
            st.ipam.allocations
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let queue = node.socket().parent().expect("dir").join("delete-queue");
    let left = std::fs::read_dir(&queue)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".delete"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(left, 0, "the queued DEL was not replayed");
    let results: Vec<PluginOutput> = pending.iter().map(|sb| node.add(sb)).collect();
    let mut seen = std::collections::BTreeSet::new();
    for r in &results {
        assert!(r.ok, "{}", r.stdout);
        for ip in r.ips() {
            assert!(seen.insert(ip.clone()), "{ip} handed out twice");
        }
    }
    assert!(node.log().contains("journal reopened after a failure"));
    // What the daemon answered is what the journal holds: a restart agrees.
    let before = node.allocations();
    node.restart_daemon();
    assert_eq!(
        node.allocations().keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    node.stop_daemon(false);
    drop(disk);
}

#[test]
fn an_expired_address_takes_its_host_link_with_it() {
    if !root_or_skip("expired_link") {
        return;
    }
    let node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.21.0.0/16",
        "--k8s-node-name",
        "it-node",
        "--ipam-expiration",
        "2s",
    ]);
    let client = node.client();
    // Two plugins that died after the allocation and after creating their host
    // link, before registering the endpoint; the second link was replaced by a
    // newer ADD (its marker names a later commit), so it is not the expired one's.
    let mut links = Vec::new();
    for (cid, newer) in [("died-1", false), ("died-2", true)] {
        let resp = client
            .allocate(&podnet::api::client::AllocateParams {
                owner: cid,
                expiration: true,
                container_id: cid,
                ifname: "eth0",
                network: "podnet-it",
                ..Default::default()
            })
            .expect("allocate");
        let mut mark =
            podnet::datapath::link_marker::JournalMark::parse(&resp.journal_mark).expect("mark");
        if newer {
            mark.seq += 1000;
        }
        let name = host_ifname(cid, "eth0");
        let peer = format!("p{}", &name[3..]);
        assert!(
            node.ns
                .exec(&[
                    "ip", "link", "add", &name, "type", "veth", "peer", "name", &peer
                ])
                .status
                .success()
        );
        let alias = format!("podnet j={} c={cid} i=eth0", mark.encode());
        assert!(
            node.ns
                .exec(&["ip", "link", "set", &name, "alias", &alias])
                .status
                .success()
        );
        links.push((name, resp.address.ipv4.clone()));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while node.host_links().contains(&links[0].0) {
        assert!(
            Instant::now() < deadline,
            "the expired attachment's link stayed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(node.log().contains("Released IP after expiration"));
    assert!(!node.allocations().contains_key(&links[0].1));
    // The newer link is left alone.
    std::thread::sleep(Duration::from_millis(500));
    assert!(node.host_links().contains(&links[1].0));
}

#[test]
fn del_never_deletes_an_interface_podnet_did_not_make() {
    if !root_or_skip("del_foreign") {
        return;
    }
    let node = Node::dual_stack();
    // Another plugin's eth0: ADD refuses it, and the runtime's clean-up DEL leaves it.
    let foreign = node.sandbox();
    let out = foreign.ns.exec(&[
        "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "fpeer0",
    ]);
    assert!(out.status.success());
    let add = node.add(&foreign);
    assert_eq!(add.code(), 104, "{}", add.stdout);
    assert!(node.del(&foreign).ok);
    assert!(
        foreign
            .ns
            .exec(&["ip", "link", "show", "eth0"])
            .status
            .success(),
        "DEL deleted another plugin's eth0"
    );

    // A DEL with another container ID aimed at a live pod's netns.
    let victim = node.sandbox();
    let rv = node.add(&victim);
    assert!(rv.ok, "{}", rv.stdout);
    let intruder = Sandbox {
        ns: Netns::new("pnt-intr"),
        container_id: "intruder-cid".into(),
        ifname: "eth0".into(),
    };
    let mut del = Command::new("ip");
    del.args(["netns", "exec", &node.ns.name, podnet_bin()])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CNI_COMMAND", "DEL")
        .env("CNI_CONTAINERID", &intruder.container_id)
        .env("CNI_NETNS", victim.ns.path())
        .env("CNI_IFNAME", "eth0");
    let out = plugin_run(del, &node.conf("1.1.0"));
    assert!(out.ok, "{}", out.stdout);
    assert!(
        victim
            .ns
            .exec(&["ip", "link", "show", "eth0"])
            .status
            .success(),
        "the victim lost eth0"
    );
    let check = node.check(&victim, &rv);
    assert!(check.ok, "{}", check.stdout);
    assert!(victim.ping(&node.ipv4_addressing().ip));
    assert!(node.allocations().contains_key(&rv.ipv4()));
}
