//! The daemon's life: restart keeps allocations, the plugin copes with a stopped
//! daemon, the expiration timer frees unbound addresses, the start-up checks, a
//! second daemon on the same socket, kubernetes mode and `--config-dir`.

use std::process::Stdio;
use std::time::Duration;

use podnet::api::client::AllocateParams;

use crate::harness::*;

#[test]
fn restart_keeps_allocations_and_hands_none_out_twice() {
    if !root_or_skip("restart") {
        return;
    }
    let mut node = Node::dual_stack();
    let a = node.sandbox();
    let b = node.sandbox();
    let (ra, rb) = (node.add(&a), node.add(&b));
    let before = node.allocations();
    node.restart_daemon();
    let after = node.allocations();
    let strip = |m: &std::collections::BTreeMap<String, String>| -> Vec<(String, String)> {
        m.iter()
            .map(|(k, v)| (k.clone(), v.replace(" [restored]", "")))
            .collect()
    };
    assert_eq!(
        strip(&before),
        strip(&after),
        "allocations changed across a restart"
    );
    assert!(
        after
            .get(&ra.ipv4())
            .is_some_and(|o| o.ends_with("[restored]")),
        "{after:?}"
    );
    // The pods still talk, and a new sandbox gets a fresh address.
    assert!(a.ping(&rb.ipv4()) && b.ping(&ra.ipv6()));
    let c = node.sandbox();
    let rc = node.add(&c);
    assert!(rc.ok, "{rc:?}");
    assert!(!before.contains_key(&rc.ipv4()) && !before.contains_key(&rc.ipv6()));
    // DEL after the restart still frees the restored attachment.
    assert!(node.del(&a).ok);
    assert!(!node.allocations().contains_key(&ra.ipv4()));
}

#[test]
fn plugin_with_the_daemon_stopped() {
    if !root_or_skip("daemon_stopped") {
        return;
    }
    let mut node = Node::dual_stack();
    let a = node.sandbox();
    let r = node.add(&a);
    node.stop_daemon(false);
    // STATUS: 50 naming the socket.
    let st = node.plugin("STATUS", None, &node.conf("1.1.0"), &[]);
    assert_eq!(st.code(), 50, "{st:?}");
    assert!(
        st.msg().contains(&node.socket().display().to_string()),
        "{}",
        st.msg()
    );
    // ADD: 11 (try again later), nothing created.
    let b = node.sandbox();
    let add = node.add(&b);
    assert_eq!(add.code(), 11, "{add:?}");
    assert!(add.msg().contains("is the daemon running"), "{}", add.msg());
    assert!(b.ns.exec(&["ip", "link", "show", "eth0"]).status.code() != Some(0));
    // DEL: removes the links, queues the release and succeeds; the daemon replays
    // the queue when it starts.
    let del = node.del(&a);
    assert!(del.ok, "{del:?}");
    assert!(del.stderr.contains("queued"), "{}", del.stderr);
    assert!(node.host_links().is_empty());
    node.start_daemon();
    let st = node.client().healthz().expect("healthz");
    assert!(
        !st.ipam.allocations.contains_key(&r.ipv4()),
        "{:?}",
        st.ipam.allocations
    );
    assert!(
        st.ipam.cooling.contains_key(&r.ipv4()),
        "released address should cool down: {:?}",
        st.ipam.cooling
    );
    assert_eq!(st.ipam.restore.queued_deletes, 1);
}

#[test]
fn expiration_frees_an_address_whose_endpoint_never_came() {
    if !root_or_skip("expiration") {
        return;
    }
    let node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.50.0.0/16",
        "--ipam-expiration",
        "2s",
        "--k8s-node-name",
        "exp",
    ]);
    let client = node.client();
    let params = AllocateParams {
        owner: "default/crashed",
        expiration: true,
        container_id: "crashed",
        ifname: "eth0",
        network: "podnet-it",
        ..Default::default()
    };
    let lost = client.allocate(&params).expect("allocate").address.ipv4;
    // A normal ADD in the same window keeps its address: the endpoint stopped the timer.
    let node = node;
    let a = node.sandbox();
    let r = node.add(&a);
    assert!(
        node.allocations()
            .get(&lost)
            .is_some_and(|o| o.contains("[expiring]"))
    );
    std::thread::sleep(Duration::from_millis(3500));
    let allocs = node.allocations();
    assert!(
        !allocs.contains_key(&lost),
        "unbound address survived its expiration: {allocs:?}"
    );
    assert!(
        allocs.contains_key(&r.ipv4()),
        "bound address expired: {allocs:?}"
    );
    assert!(node.log().contains("Released IP after expiration"));
}

#[test]
fn expiration_survives_a_restart() {
    if !root_or_skip("expiration_restart") {
        return;
    }
    let mut node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.51.0.0/16",
        "--ipam-expiration",
        "2s",
        "--k8s-node-name",
        "exp2",
    ]);
    let params = AllocateParams {
        owner: "default/crashed",
        expiration: true,
        container_id: "crashed",
        ifname: "eth0",
        ..Default::default()
    };
    let lost = node
        .client()
        .allocate(&params)
        .expect("allocate")
        .address
        .ipv4;
    node.stop_daemon(true);
    std::thread::sleep(Duration::from_millis(500));
    node.start_daemon();
    assert!(
        node.allocations().contains_key(&lost),
        "pending allocation lost across a restart"
    );
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!node.allocations().contains_key(&lost));
}

#[test]
fn start_up_checks_refuse_bad_options_with_cilium_errors() {
    if !root_or_skip("startup_checks") {
        return;
    }
    let node = Node::dual_stack();
    let cases: &[(&[&str], &str)] = &[
        (
            &["--cluster-pool-ipv4-cidr", "10.0.0.0/33"],
            "cluster-pool-ipv4-cidr",
        ),
        (&["--cluster-pool-ipv4-cidr", "not-a-cidr"], "not-a-cidr"),
        (
            &["--cluster-pool-ipv4-cidr", ""],
            "cluster-pool-ipv4-cidr must be provided when using ClusterPool",
        ),
        (
            &[
                "--enable-ipv6=false",
                "--cluster-pool-ipv6-cidr",
                "fd00::/104",
            ],
            "cluster-pool-ipv6-cidr must not be set if IPv6 is disabled",
        ),
        (
            &["--cluster-pool-ipv4-mask-size", "33"],
            "SubNetMask is invalid",
        ),
        (
            &[
                "--cluster-pool-ipv6-cidr",
                "fd00::/96",
                "--cluster-pool-ipv6-mask-size",
                "120",
            ],
            "the node CIDR size is too big",
        ),
        (&["--ipam", "eni-typo"], "not supported"),
        (
            &["--ipam", "kubernetes", "--pod-cidrs", "10.1.0.0/24"],
            "Required IPv6 PodCIDR not available",
        ),
    ];
    for (args, want) in cases {
        let dir = node.dir.join(format!("bad-{}", unique("")));
        let out = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &node.ns.name,
                podnet_bin(),
                "daemon",
                "--enable-ipv6",
            ])
            .arg("--socket")
            .arg(dir.join("s.sock"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(*args)
            .stdin(Stdio::null())
            .output()
            .expect("run daemon");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "daemon accepted {args:?}");
        assert!(err.contains(want), "{args:?}: expected {want:?} in:\n{err}");
    }
}

#[test]
fn a_second_daemon_on_the_same_socket_is_refused() {
    if !root_or_skip("second_daemon") {
        return;
    }
    let node = Node::dual_stack();
    let out = node
        .daemon_command(&[])
        .stdin(Stdio::null())
        .output()
        .expect("second daemon");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("another podnet daemon is already serving"),
        "{err}"
    );
    // The first one still answers.
    assert!(node.client().healthz().is_ok());
}

#[test]
fn kubernetes_mode_uses_the_given_pod_cidrs() {
    if !root_or_skip("kubernetes_mode") {
        return;
    }
    let node = Node::start(&[
        "--ipam",
        "kubernetes",
        "--enable-ipv6",
        "--pod-cidrs",
        "10.60.3.0/24 fd00:60:3::/120",
        "--k8s-node-name",
        "k8s",
    ]);
    let a = node.sandbox();
    let r = node.add(&a);
    assert!(r.ipv4().starts_with("10.60.3."), "{r:?}");
    assert!(r.ipv6().starts_with("fd00:60:3::"), "{r:?}");
    let st = node.client().healthz().expect("healthz");
    assert_eq!(st.ipam.mode, "kubernetes");
    assert!(
        st.ipam
            .status
            .contains("IPv4: 3/254 allocated from 10.60.3.0/24"),
        "{}",
        st.ipam.status
    );
}

#[test]
fn options_come_from_a_config_dir() {
    if !root_or_skip("config_dir") {
        return;
    }
    let probe = Node::dual_stack();
    let cfgdir = probe.dir.join("config");
    std::fs::create_dir_all(&cfgdir).expect("mkdir");
    std::fs::write(cfgdir.join("cluster-pool-ipv4-cidr"), "10.70.0.0/16").expect("write");
    std::fs::write(cfgdir.join("cluster-pool-ipv4-mask-size"), "26").expect("write");
    std::fs::write(cfgdir.join("enable-ipv6"), "false").expect("write");
    std::fs::write(cfgdir.join("tunnel-protocol"), "vxlan").expect("write");
    let cfg = cfgdir.display().to_string();
    let node = Node::start(&["--config-dir", &cfg, "--k8s-node-name", "cfgdir"]);
    let a = node.sandbox();
    let r = node.add(&a);
    assert!(r.ipv4().starts_with("10.70.0."), "{r:?}");
    assert_eq!(r.ips().len(), 1);
    let range = node.ipv4_addressing().alloc_range;
    assert!(range.ends_with("/26"), "{range}");
}

#[test]
fn datapath_mode_netkit_is_checked_at_start_and_auto_falls_back() {
    if !root_or_skip("datapath_mode") {
        return;
    }
    let supported = podnet::datapath::probe_netkit().is_supported();
    let probe = Node::dual_stack();
    let out = probe
        .daemon_command(&["--datapath-mode", "netkit"])
        .stdin(Stdio::null())
        .output();
    drop(probe);
    let node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.52.0.0/16",
        "--datapath-mode",
        "auto",
        "--k8s-node-name",
        "dp",
    ]);
    let cfg = node.client().config().expect("config").status;
    assert_eq!(cfg.configured_datapath_mode, "auto");
    if supported {
        assert_eq!(cfg.datapath_mode, "netkit");
        let a = node.sandbox();
        let b = node.sandbox();
        let (ra, rb) = (node.add(&a), node.add(&b));
        assert!(
            a.ping(&rb.ipv4()) && b.ping(&ra.ipv4()),
            "netkit pods must reach each other"
        );
    } else {
        assert_eq!(cfg.datapath_mode, "veth");
        // Asking for netkit explicitly fails at daemon start, naming the kernel
        // requirement (the other daemon held the socket: its refusal is earlier).
        let out = out.expect("daemon");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("netkit needs Linux 6.8 or later with CONFIG_NETKIT")
                || err.contains("already serving"),
            "{err}"
        );
        let dir = node.dir.join("nk");
        let out = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &node.ns.name,
                podnet_bin(),
                "daemon",
                "--datapath-mode",
                "netkit",
                "--socket",
            ])
            .arg(dir.join("s.sock"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .output()
            .expect("daemon");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success()
                && err.contains("netkit needs Linux 6.8 or later with CONFIG_NETKIT"),
            "{err}"
        );
        // This kernel has no netkit: the refusal and the fallback above are what
        // ran; pods over netkit are checked only where the kernel has it.
    }
}
