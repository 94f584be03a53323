//! Pod bandwidth limits through the real plugin and daemon
//! (`--enable-bandwidth-manager`, `runtimeConfig.bandwidth`): ADD shapes both
//! directions on the host side, CHECK notices what went missing, DEL, GC and a
//! failed ADD leave no IFB device behind, a restart of the daemon keeps the
//! shaping, bad values fail with code 7 naming the field. The qdiscs are read
//! with `ip`/`tc` in the node namespace: an independent reader.

use serde_json::{Value, json};

use crate::harness::*;
use podnet::datapath::{host_ifname, ifb_ifname};

/// 10 Mbit/s to the pod, 1 Mbit/s from it, with containerd's burst.
pub(crate) fn limits() -> Value {
    json!({"ingressRate": 10_000_000, "ingressBurst": 4_294_967_295u64,
           "egressRate": 1_000_000, "egressBurst": 4_294_967_295u64})
}

pub(crate) fn conf(node: &Node, bw: Value) -> String {
    let mut c: Value = serde_json::from_str(&node.conf("1.1.0")).expect("conf");
    c["runtimeConfig"] = json!({"bandwidth": bw});
    c.to_string()
}

fn bw_node(enabled: bool) -> Node {
    let mut args: Vec<&str> = DUAL_STACK.to_vec();
    if enabled {
        args.push("--enable-bandwidth-manager");
    }
    Node::start(&args)
}

/// `tc -j <what> show dev <dev> [ingress]` in the node namespace.
pub(crate) fn tc(node: &Node, what: &str, dev: &str, extra: &[&str]) -> Value {
    let mut args = vec!["tc", "-j", what, "show", "dev", dev];
    args.extend_from_slice(extra);
    let out = node.ns.exec(&args);
    assert!(out.status.success(), "tc {args:?}: {out:?}");
    serde_json::from_slice(&out.stdout).expect("tc json")
}

/// The root TBF's rate (bytes/s) on `dev`, if it has one.
pub(crate) fn tbf_rate(node: &Node, dev: &str) -> Option<u64> {
    let q = tc(node, "qdisc", dev, &[]);
    q.as_array()?
        .iter()
        .find(|q| q["kind"] == "tbf" && q["root"] == true)
        .and_then(|q| q["options"]["rate"].as_u64())
}

pub(crate) fn link_exists(node: &Node, name: &str) -> bool {
    node.ns
        .exec(&["ip", "link", "show", "dev", name])
        .status
        .success()
}

pub(crate) fn have_tc(test: &str) -> bool {
    if std::process::Command::new("tc").arg("-V").output().is_ok() {
        return true;
    }
    skip(test, "needs tc (iproute2) as the independent reader");
    false
}

#[test]
fn add_shapes_both_directions_check_notices_del_removes() {
    let test = "bandwidth_add_check_del";
    if !root_or_skip(test) || !have_tc(test) {
        return;
    }
    let mut node = bw_node(true);
    let sb = node.sandbox();
    let (host, ifb) = (
        host_ifname(&sb.container_id, "eth0"),
        ifb_ifname(&sb.container_id, "eth0"),
    );
    let add = node.plugin("ADD", Some(&sb), &conf(&node, limits()), &[]);
    assert!(add.ok, "{add:?}");
    // To the pod: the host link's root TBF; from it: the redirect to the IFB's TBF.
    assert_eq!(tbf_rate(&node, &host), Some(1_250_000));
    assert_eq!(tbf_rate(&node, &ifb), Some(125_000));
    let filters = tc(&node, "filter", &host, &["ingress"]).to_string();
    assert!(
        filters.contains(&format!("\"to_dev\":\"{ifb}\"")),
        "{filters}"
    );
    assert_eq!(node.link_alias(&ifb).as_deref(), Some("podnet-bandwidth"));
    let status = node.podnet(&["status"]);
    assert!(
        status.contains("Bandwidth:  pods' bandwidth annotations are shaped"),
        "{status}"
    );
    assert!(
        sb.ping(&node.ipv4_addressing().ip),
        "the shaped pod still reaches its router"
    );

    let check = |node: &Node| {
        let mut c: Value = serde_json::from_str(&conf(node, limits())).unwrap();
        c["prevResult"] = add.json();
        node.plugin("CHECK", Some(&sb), &c.to_string(), &[])
    };
    assert!(check(&node).ok, "{:?}", check(&node));
    // CHECK with another rate than the one set: 103, naming both.
    let mut other: Value = serde_json::from_str(&conf(
        &node,
        json!({"ingressRate": 20_000_000, "ingressBurst": 100_000}),
    ))
    .unwrap();
    other["prevResult"] = add.json();
    let r = node.plugin("CHECK", Some(&sb), &other.to_string(), &[]);
    assert_eq!(r.code(), 103, "{r:?}");
    assert!(
        r.msg().contains("10000000 bits/s") && r.msg().contains("20000000 bits/s"),
        "{r:?}"
    );

    // A restart of the daemon leaves the shaping alone.
    node.restart_daemon();
    assert_eq!(tbf_rate(&node, &ifb), Some(125_000));
    assert!(check(&node).ok, "{:?}", check(&node));

    // The IFB removed behind podnet's back: CHECK says so.
    node.ns.exec(&["ip", "link", "del", &ifb]);
    let r = check(&node);
    assert_eq!(r.code(), 103, "{r:?}");
    assert!(
        r.msg().contains(&ifb) && r.msg().contains("missing"),
        "{r:?}"
    );

    // A repeated ADD sets it up again on a fresh pair; DEL removes both links.
    let again = node.plugin("ADD", Some(&sb), &conf(&node, limits()), &[]);
    assert!(again.ok, "{again:?}");
    assert_eq!(tbf_rate(&node, &ifb), Some(125_000));
    let del = node.plugin("DEL", Some(&sb), &conf(&node, limits()), &[]);
    assert!(del.ok, "{del:?}");
    assert!(node.host_links_gone());
    assert!(wait_until(|| !link_exists(&node, &ifb)), "DEL left {ifb}");
}

/// Waits up to 5 s for `f`.
fn wait_until(f: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

#[test]
fn del_after_the_netns_is_gone_and_gc_remove_the_ifb() {
    let test = "bandwidth_del_gc";
    if !root_or_skip(test) || !have_tc(test) {
        return;
    }
    let node = bw_node(true);
    // DEL after the pod's netns went: the veth went with it, the IFB did not.
    let mut a = node.sandbox();
    let add = node.plugin("ADD", Some(&a), &conf(&node, limits()), &[]);
    assert!(add.ok, "{add:?}");
    let ifb_a = ifb_ifname(&a.container_id, "eth0");
    a.ns.delete();
    assert!(node.host_links_gone());
    assert!(
        link_exists(&node, &ifb_a),
        "an IFB outlives the pod's netns"
    );
    let del = node.plugin("DEL", Some(&a), &conf(&node, limits()), &[]);
    assert!(del.ok, "{del:?}");
    assert!(
        wait_until(|| !link_exists(&node, &ifb_a)),
        "DEL left {ifb_a}"
    );

    // GC: a collected attachment's IFB goes with its host link, and so does a
    // podnet IFB whose host link is gone; an IFB without podnet's alias stays.
    let b = node.sandbox();
    assert!(node.plugin("ADD", Some(&b), &conf(&node, limits()), &[]).ok);
    let ifb_b = ifb_ifname(&b.container_id, "eth0");
    let live = node.sandbox();
    assert!(
        node.plugin("ADD", Some(&live), &conf(&node, limits()), &[])
            .ok
    );
    let ifb_live = ifb_ifname(&live.container_id, "eth0");
    let orphan = "ifb0123456789ab";
    let foreign = "ifbaaaaaaaaaaaa";
    node.ns.exec(&["ip", "link", "add", orphan, "type", "ifb"]);
    node.ns
        .exec(&["ip", "link", "set", orphan, "alias", "podnet-bandwidth"]);
    node.ns.exec(&["ip", "link", "add", foreign, "type", "ifb"]);
    assert_eq!(node.link_alias(orphan).as_deref(), Some("podnet-bandwidth"));
    assert!(link_exists(&node, foreign));
    let mut gc: Value = serde_json::from_str(&node.conf("1.1.0")).unwrap();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": live.container_id, "ifname": "eth0"}]);
    let g = node.plugin("GC", None, &gc.to_string(), &[]);
    assert!(g.ok, "{g:?}");
    assert!(!link_exists(&node, &ifb_b), "GC left {ifb_b}");
    assert!(!link_exists(&node, orphan), "GC left the orphan {orphan}");
    assert!(
        link_exists(&node, foreign),
        "GC removed an IFB that is not podnet's"
    );
    assert!(link_exists(&node, &ifb_live), "GC removed a live pod's IFB");
    assert_eq!(tbf_rate(&node, &ifb_live), Some(125_000));
}

#[test]
fn an_add_the_kernel_fails_midway_leaves_nothing_of_its_own() {
    let test = "bandwidth_add_fails_midway";
    if !root_or_skip(test) || !have_tc(test) {
        return;
    }
    let node = bw_node(true);
    let sb = node.sandbox();
    let base = node.allocations().len();
    // A link that is no IFB holds the pod's IFB name: the IFB cannot be made
    // after the allocation, the pair and the TBF to the pod.
    let ifb = ifb_ifname(&sb.container_id, "eth0");
    let made = node.ns.exec(&["ip", "link", "add", &ifb, "type", "bridge"]);
    assert!(made.status.success(), "{made:?}");
    let r = node.plugin("ADD", Some(&sb), &conf(&node, limits()), &[]);
    assert_eq!(r.code(), 102, "{r:?}");
    assert!(r.msg().contains("creating the pod's IFB device"), "{r:?}");
    assert_eq!(node.allocations().len(), base, "an allocation was left");
    assert!(node.host_links_gone(), "a host link was left");
    assert!(sb.interface_gone(), "the pod's interface was left");
    assert!(
        link_exists(&node, &ifb),
        "the rollback removed a link that is not podnet's IFB"
    );
}

#[test]
fn bad_values_fail_the_add_with_code_7_and_leave_nothing() {
    let test = "bandwidth_bad_values";
    if !root_or_skip(test) || !have_tc(test) {
        return;
    }
    let node = bw_node(true);
    let sb = node.sandbox();
    let base = node.allocations().len();
    let cases = [
        (
            json!({"ingressRate": 0, "ingressBurst": 100_000}),
            "ingressRate: 0",
        ),
        (
            json!({"egressRate": -1, "egressBurst": 100_000}),
            "egressRate: -1",
        ),
        (
            json!({"egressRate": 1_000_000, "egressBurst": 34_359_738_361u64}),
            "egressBurst: 34359738361",
        ),
        (
            json!({"ingressRate": 2_000_000_000_000_000u64, "ingressBurst": 100_000}),
            "ingressRate: 2000000000000000",
        ),
        (json!({"egressRate": 1_000_000}), "egressBurst is missing"),
        // Checked after the allocation, against the pod's MTU (1500 + 14 bytes).
        (
            json!({"egressRate": 1_000_000, "egressBurst": 8000}),
            "egressBurst: 8000 bits",
        ),
    ];
    for (bw, says) in cases {
        let r = node.plugin("ADD", Some(&sb), &conf(&node, bw.clone()), &[]);
        assert_eq!(r.code(), 7, "{bw}: {r:?}");
        assert!(r.msg().contains(says), "{bw}: {r:?}");
        assert_eq!(
            node.allocations().len(),
            base,
            "{bw}: an allocation was left"
        );
        assert!(node.host_links_gone(), "{bw}: a host link was left");
        assert!(
            !link_exists(&node, &ifb_ifname(&sb.container_id, "eth0")),
            "{bw}"
        );
    }
}

#[test]
fn without_the_bandwidth_manager_nothing_is_shaped() {
    let test = "bandwidth_disabled";
    if !root_or_skip(test) || !have_tc(test) {
        return;
    }
    let node = bw_node(false);
    let sb = node.sandbox();
    let add = node.plugin("ADD", Some(&sb), &conf(&node, limits()), &[]);
    assert!(add.ok, "{add:?}");
    assert!(add.stderr.contains("--enable-bandwidth-manager"), "{add:?}");
    assert!(!node.podnet(&["status"]).contains("Bandwidth:"));
    assert_eq!(
        tbf_rate(&node, &host_ifname(&sb.container_id, "eth0")),
        None
    );
    assert!(!link_exists(&node, &ifb_ifname(&sb.container_id, "eth0")));
}

/// The container ID cnitool (and the driver) derive from the netns path.
fn libcni_container_id(netns: &str) -> String {
    use sha2::{Digest, Sha512};
    let sum = Sha512::digest(netns.as_bytes());
    let hex: String = sum[..10].iter().map(|b| format!("{b:02x}")).collect();
    format!("cnitool-{hex}")
}

/// libcni's cache file of the test's attachment (cnitool always caches in
/// /var/lib/cni), removed on drop, with /var/lib/cni when the test made it and
/// left it empty.
struct CacheFile {
    file: std::path::PathBuf,
    made_root: bool,
}

impl Drop for CacheFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
        if self.made_root {
            // remove_dir removes only empty directories.
            let _ = std::fs::remove_dir("/var/lib/cni/results");
            let _ = std::fs::remove_dir("/var/lib/cni");
        }
    }
}

#[test]
fn through_libcni_the_written_conflist_carries_the_limits_to_the_plugin() {
    let test = "bandwidth_through_libcni";
    if !root_or_skip(test) || !have_tc(test) {
        return;
    }
    let client = match std::env::var_os("PODNET_CNI_CLIENT") {
        Some(p) if std::path::Path::new(&p).is_file() => std::path::PathBuf::from(p),
        _ => {
            skip(
                test,
                "PODNET_CNI_CLIENT does not name cnitool (make test sets it; run scripts/setup)",
            );
            return;
        }
    };
    let mut args: Vec<&str> = DUAL_STACK.to_vec();
    args.push("--enable-bandwidth-manager");
    let mut node = Node::new(&args);
    let (net_d, bin) = (node.dir.join("net.d"), node.dir.join("bin"));
    node.args.push("--write-cni-conf-when-ready".into());
    node.args.push(net_d.display().to_string());
    node.start_daemon();
    let conflist = net_d.join("05-podnet.conflist");
    assert!(
        wait_until(|| conflist.exists()),
        "the daemon wrote no CNI config"
    );
    let written: Value = serde_json::from_slice(&std::fs::read(&conflist).unwrap()).unwrap();
    assert_eq!(
        written["plugins"][0]["capabilities"],
        json!({"bandwidth": true})
    );
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(podnet_bin(), bin.join("podnet")).unwrap();

    let sb = node.sandbox();
    let cid = libcni_container_id(&sb.ns.path());
    let _cache = CacheFile {
        file: format!("/var/lib/cni/results/podnet-{cid}-eth0").into(),
        made_root: !std::path::Path::new("/var/lib/cni").exists(),
    };
    let run = |verb: &str| {
        let mut cmd = std::process::Command::new("ip");
        cmd.args(["netns", "exec", &node.ns.name])
            .arg(&client)
            .args([verb, "podnet", &sb.ns.path()])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("NETCONFPATH", &net_d)
            .env("CNI_PATH", &bin)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_CACHE_DIR", node.dir.join("cache"))
            .env("CAP_ARGS", json!({"bandwidth": limits()}).to_string());
        let out = plugin_run(cmd, "");
        assert!(out.ok, "{verb}: {out:?}\n{}", node.log());
        out
    };
    run("add");
    let (host, ifb) = (host_ifname(&cid, "eth0"), ifb_ifname(&cid, "eth0"));
    assert_eq!(tbf_rate(&node, &host), Some(1_250_000));
    assert_eq!(tbf_rate(&node, &ifb), Some(125_000));
    run("check");
    run("del");
    assert!(node.host_links_gone());
    assert!(wait_until(|| !link_exists(&node, &ifb)), "DEL left {ifb}");
}
