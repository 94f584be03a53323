//! The journal's format version, with the real daemon: a journal written in
//! format 1 by an earlier podnet (`fixtures/journal-v1`, kept as it was written)
//! is restored with every allocation, and a journal in a newer format is refused
//! with the version found, the version understood and the way out, leaving the
//! file and the node as they were.

use std::path::Path;

use crate::harness::*;

/// The fixture's host links: name, marker, IPv4 and IPv6 address.
const FIXTURE_LINKS: [(&str, &str, &str, &str); 3] = [
    (
        "lxc0d117f4f5ada",
        "podnet j=ceb0347f780b7639.5 w=1 c=cid-pnt-sb29261-1 i=eth0 o=default/pnt-sb29261-1",
        "10.20.0.3",
        "fd00:20::3",
    ),
    (
        "lxc561f9b820fbb",
        "podnet j=ceb0347f780b7639.7 w=1 c=cid-pnt-sb29261-2 i=eth0 o=default/pnt-sb29261-2",
        "10.20.0.4",
        "fd00:20::4",
    ),
    (
        "lxce9981d3ec3a0",
        "podnet j=ceb0347f780b7639.9 w=1 c=cid-pnt-sb29261-3 i=eth0 o=default/pnt-sb29261-3",
        "10.20.0.5",
        "fd00:20::5",
    ),
];

/// Every allocation the fixture holds (address → owner, as status lists it after
/// a restore).
fn fixture_allocations() -> std::collections::BTreeMap<String, String> {
    let mut all: std::collections::BTreeMap<String, String> = [
        ("10.20.0.1", "router"),
        ("10.20.0.2", "health"),
        ("fd00:20::1", "router"),
        ("fd00:20::2", "health"),
    ]
    .into_iter()
    .map(|(ip, owner)| (ip.to_string(), owner.to_string()))
    .collect();
    for (_, marker, v4, v6) in FIXTURE_LINKS {
        let owner = format!(
            "{} [restored]",
            marker.rsplit("o=").next().expect("an owner")
        );
        all.insert(v4.into(), owner.clone());
        all.insert(v6.into(), owner);
    }
    all
}

/// A dual-stack node (daemon not started) whose state dir holds a copy of the
/// format-1 fixture, with the fixture's pods' host links (veths carrying their
/// markers and routes) in its namespace.
fn node_with_the_v1_fixture() -> Node {
    let node = Node::new(&DUAL_STACK);
    std::fs::create_dir_all(node.state_dir()).expect("state dir");
    let journal = node.state_dir().join("journal.redb");
    std::fs::copy(
        repo_path("integration/fixtures/journal-v1/journal.redb"),
        &journal,
    )
    .expect("copying the fixture");
    for (i, (name, marker, v4, v6)) in FIXTURE_LINKS.into_iter().enumerate() {
        let peer = format!("fixture{i}");
        for cmd in [
            vec![
                "ip", "link", "add", name, "type", "veth", "peer", "name", &peer,
            ],
            vec!["ip", "link", "set", name, "alias", marker],
            vec!["ip", "link", "set", &peer, "up"],
            vec!["ip", "link", "set", name, "up"],
            vec!["ip", "route", "add", &format!("{v4}/32"), "dev", name],
            vec![
                "ip",
                "-6",
                "route",
                "add",
                &format!("{v6}/128"),
                "dev",
                name,
            ],
        ] {
            let out = node.ns.exec(&cmd);
            assert!(
                out.status.success(),
                "{cmd:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    node
}

/// Marks `journal` as written in format `version`, as a newer podnet would.
fn stamp_format(journal: &Path, version: u64) {
    let meta: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("meta");
    let db = redb::Database::create(journal).expect("opening the journal");
    let txn = redb::Database::begin_write(&db).expect("write transaction");
    txn.open_table(meta)
        .expect("meta table")
        .insert("format-version", version.to_string().as_bytes())
        .expect("writing the version");
    txn.commit().expect("commit");
}

#[test]
fn a_journal_in_format_1_is_restored_with_every_allocation() {
    if !root_or_skip("journal_format_1") {
        return;
    }
    let mut node = node_with_the_v1_fixture();
    node.start_daemon();
    assert_eq!(node.allocations(), fixture_allocations(), "{}", node.log());
    let status = node.client().healthz().expect("healthz");
    let restore = &status.ipam.restore;
    assert!(
        restore.released_link_gone.is_empty()
            && restore.orphan_links_removed.is_empty()
            && restore.adopted_from_kernel.is_empty(),
        "{restore:?}"
    );
    assert_eq!(node.host_links().len(), FIXTURE_LINKS.len());
    // Restored, not just listed: a new pod gets the next free address.
    let sb = node.sandbox();
    let added = node.add(&sb);
    assert!(added.ok, "{}", added.stdout);
    assert_eq!(added.ipv4(), "10.20.0.6");
    // The fixture's addresses survive a second restart, now in the current format.
    node.restart_daemon();
    let mut after = node.allocations();
    for ip in added.ips() {
        assert!(after.remove(&ip).is_some(), "{ip}: {after:?}");
    }
    assert_eq!(after, fixture_allocations());
}

#[test]
fn a_journal_in_a_newer_format_is_refused_and_left_as_it_was() {
    if !root_or_skip("journal_newer_format") {
        return;
    }
    // Which formats a binary reads, for the operator choosing one to run.
    let version = std::process::Command::new(podnet_bin())
        .arg("version")
        .output()
        .expect("podnet version");
    let printed = String::from_utf8_lossy(&version.stdout);
    assert!(
        printed.contains("on-disk formats: journal 1, DEL queue 1"),
        "{printed}"
    );
    for extra in [&[][..], &["--rebuild-from-kernel"][..]] {
        let node = node_with_the_v1_fixture();
        let journal = node.state_dir().join("journal.redb");
        stamp_format(&journal, 2);
        let before = std::fs::read(&journal).expect("journal");
        let out = node.daemon_command(extra).output().expect("daemon");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {err}");
        for part in [
            journal.display().to_string().as_str(),
            "format version 2",
            "format versions up to 1",
            "Nothing was changed",
            "Run a podnet that reads format 2",
            "move the file aside",
        ] {
            assert!(err.contains(part), "{extra:?}: {part:?} missing: {err}");
        }
        assert_eq!(
            std::fs::read(&journal).expect("journal"),
            before,
            "{extra:?}: the journal changed"
        );
        let files: Vec<String> = std::fs::read_dir(node.state_dir())
            .expect("state dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        assert_eq!(files, ["journal.redb"], "{extra:?}");
        assert_eq!(node.host_links().len(), FIXTURE_LINKS.len(), "{extra:?}");
        let router = node.ns.exec(&["ip", "link", "show", "podnet_host"]);
        assert!(
            !router.status.success(),
            "{extra:?}: the router device was made"
        );
        assert!(!node.socket().exists(), "{extra:?}");
    }
}
