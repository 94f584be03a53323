//! The chapter's Lab 3 across two nodes on a real kube-apiserver
//! (integration/k8s.rs): `podnet operator` in cluster-pool gives two node daemons
//! (Kubernetes backend, tunnel mode) their pod CIDRs and the real plugin makes pods
//! on both; the operator restarts in multi-pool with
//! `--enable-cluster-pool-to-multi-pool-migration`. With a default pool that does
//! not cover the CIDRs the migration is refused in each node's operator-status and
//! nothing changes; once the pool covers them (same mask) each CiliumNode lists its
//! pod CIDR under `spec.ipam.pools.allocated`. Then the agents restart one after
//! the other in multi-pool mode while a pod on one node pings a pod on the other
//! every 50 ms: no reply is missed, no route, neighbour or FDB entry on the
//! tunnel changes, every pod keeps its address (restored), new pods get
//! default-pool addresses and reach the others, and no block is held by two nodes.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::crossnode::{cross_node, fdb, ping, pod, podnet_routes, pool_pod, show, wait_for};
use crate::harness::*;
use crate::k8s::ControlPlane;
use crate::k8s_backend::{create_node, jsonpath, k8s_node};
use crate::operator::{Operator, install_operator, operator_error, per_node};
use crate::operator_pools::pool_yaml;

/// A `ping -i 0.05` from inside a namespace, run by PID.
struct Pinger {
    child: Option<Child>,
}

impl Pinger {
    fn start(from: &Netns, to: &str) -> Pinger {
        let child = Command::new("ip")
            .args([
                "netns", "exec", &from.name, "ping", "-O", "-n", "-i", "0.05", to,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ping");
        Pinger { child: Some(child) }
    }

    /// SIGINT by PID; `(transmitted, received, summary)`; the summary line is
    /// followed by ping's lines about missed replies and errors, if any.
    fn finish(&mut self) -> (u64, u64, String) {
        let child = self.child.take().expect("running");
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGINT);
        let out = child.wait_with_output().expect("ping output");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let mut summary = text
            .lines()
            .find(|l| l.contains("packets transmitted"))
            .unwrap_or_default()
            .to_string();
        let words: Vec<String> = summary.split_whitespace().map(str::to_string).collect();
        let number_before = |word: &str| -> u64 {
            words
                .iter()
                .position(|w| w.trim_end_matches(',') == word)
                .and_then(|i| words.get(i.checked_sub(1)?)?.parse().ok())
                .unwrap_or(0)
        };
        for missed in text
            .lines()
            .filter(|l| l.contains("no answer yet") || l.contains("From "))
        {
            summary.push('\n');
            summary.push_str(missed);
        }
        (number_before("packets"), number_before("received"), summary)
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
            let _ = c.wait();
        }
    }
}

/// A netlink monitor in a node's namespace, run by PID: `ip monitor route
/// neigh` or `bridge monitor fdb`; what it saw change on the tunnel device.
struct Monitor {
    child: Option<Child>,
    out: std::path::PathBuf,
}

impl Monitor {
    fn start(node: &Node, tool: &str, what: &[&str]) -> Monitor {
        let out = node.dir.join(format!("{tool}-monitor.txt"));
        let file = std::fs::File::create(&out).expect("monitor output");
        let child = Command::new(tool)
            .args(["-n", &node.ns.name, "monitor"])
            .args(what)
            .stdout(file)
            .stderr(Stdio::null())
            .spawn()
            .expect("monitor");
        Monitor {
            child: Some(child),
            out,
        }
    }

    /// Routes and neighbours, and FDB entries, of `node`.
    fn both(node: &Node) -> [Monitor; 2] {
        [
            Monitor::start(node, "ip", &["route", "neigh"]),
            Monitor::start(node, "bridge", &["fdb"]),
        ]
    }

    /// Stops it (SIGKILL by PID); the changes on the tunnel device it saw.
    fn tunnel_changes(&mut self) -> Vec<String> {
        if let Some(mut c) = self.child.take() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
            let _ = c.wait();
        }
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("podnet_vxlan"))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.tunnel_changes();
    }
}

/// Every (node, block) of every CiliumNode's `spec.ipam.pools.allocated`.
fn allocated(cp: &ControlPlane) -> Vec<(String, String)> {
    per_node(cp, "{.spec.ipam.pools.allocated[*].cidrs[*]}")
        .into_iter()
        .flat_map(|(node, blocks)| blocks.into_iter().map(move |b| (node.clone(), b)))
        .collect()
}

/// What the kernel of a node holds for the other node (routes, FDB).
fn datapath(node: &Node) -> String {
    format!("{}{}", podnet_routes(node), fdb(node))
}

#[test]
fn lab3_two_nodes_migrate_from_cluster_pool_to_multi_pool_without_losing_a_ping() {
    const TEST: &str = "lab3_two_nodes";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    cp.install_crds();
    let sa = install_operator(&cp);
    let mut op = Operator::start(
        &cp,
        "op-cp",
        &sa,
        9986,
        &[
            "--cluster-pool-ipv4-cidr",
            "10.70.0.0/16",
            "--cluster-pool-ipv4-mask-size",
            "24",
        ],
    );
    let names = ["mig-a", "mig-b"];
    let mut nodes: Vec<Node> = names
        .iter()
        .map(|name| {
            let ns = cp.add_node_ns(name);
            create_node(&cp, &ns, &[]);
            let mut node = k8s_node(
                ns,
                &cp.kubeconfig(),
                &["--ipam", "cluster-pool", "--routing-mode", "tunnel"],
            );
            node.start_daemon();
            node
        })
        .collect();
    let (a1, a1_ip) = pod(&nodes[0]);
    let (_a2, a2_ip) = pod(&nodes[0]);
    let (b1, b1_ip) = pod(&nodes[1]);
    wait_for("pod to pod across nodes", Duration::from_secs(10), || {
        ping(&a1.ns, &[], &b1_ip)
    });
    // 1. The pod CIDRs, as Lab 3 records them.
    let pod_cidrs = per_node(&cp, "{.spec.ipam.podCIDRs[*]}");
    for name in names {
        assert_eq!(pod_cidrs[name].len(), 1, "{pod_cidrs:?}");
    }

    // 2. The operator restarts in multi-pool with the migration, first with a
    // default pool that does not cover the CIDRs: refused, nothing changes.
    op.stop();
    cp.apply(&pool_yaml("default", "10.99.0.0/16", 24));
    let mut op = Operator::start(
        &cp,
        "op-mp",
        &sa,
        9987,
        &[
            "--ipam=multi-pool",
            "--enable-cluster-pool-to-multi-pool-migration",
        ],
    );
    wait_for(
        "the refused migration in both nodes' operator-status",
        Duration::from_secs(20),
        || {
            names.iter().all(|n| {
                operator_error(&cp, n).starts_with("migration to multi-pool IPAM failed: ")
            })
        },
    );
    for name in names {
        let e = operator_error(&cp, name);
        assert!(
            e.contains(&format!(
                "node pod CIDR {} is not covered by default pool \"default\"",
                pod_cidrs[name][0]
            )),
            "{e}"
        );
    }
    assert!(allocated(&cp).is_empty(), "{:?}", allocated(&cp));
    assert_eq!(per_node(&cp, "{.spec.ipam.podCIDRs[*]}"), pod_cidrs);
    assert!(ping(&b1.ns, &[], &a2_ip), "pods keep working");

    // 3. The default pool made to cover them (same mask): each node lists its pod
    // CIDR under pools.allocated, and the errors are cleared.
    cp.apply(&pool_yaml("default", "10.70.0.0/16", 24));
    wait_for(
        "each pod CIDR under spec.ipam.pools.allocated",
        Duration::from_secs(20),
        || {
            let got = allocated(&cp);
            names
                .iter()
                .all(|n| got.contains(&(n.to_string(), pod_cidrs[*n][0].clone())))
        },
    );
    wait_for("the errors cleared", Duration::from_secs(10), || {
        names.iter().all(|n| operator_error(&cp, n).is_empty())
    });
    for name in names {
        assert_eq!(
            jsonpath(
                &cp,
                "ciliumnode",
                name,
                "{.spec.ipam.pools.allocated[0].pool}"
            ),
            "default"
        );
    }

    // 4. The agents restart one after the other in multi-pool mode, on the same
    // state dirs, while a pod on A pings a pod on B every 50 ms.
    wait_for("both nodes' first pass", Duration::from_secs(10), || {
        nodes.iter().all(|n| cross_node(n).synced)
    });
    let before: Vec<String> = nodes.iter().map(datapath).collect();
    // The tunnel carries no IPv6 address of its own: with a link-local one, the
    // kernel's DAD would add its `local` route a second or more after the
    // bring-up, on a busy machine in the middle of the restarts below.
    for node in &nodes {
        let v6 = show(
            &node.ns,
            &["ip", "-6", "addr", "show", "dev", "podnet_vxlan"],
        );
        assert!(v6.trim().is_empty(), "the tunnel has IPv6 addresses:\n{v6}");
    }
    let mut monitors: Vec<[Monitor; 2]> = nodes.iter().map(Monitor::both).collect();
    let mut pinger = Pinger::start(&a1.ns, &b1_ip);
    std::thread::sleep(Duration::from_millis(500));
    for node in nodes.iter_mut() {
        node.stop_daemon(false);
        for arg in node.args.iter_mut().filter(|a| *a == "cluster-pool") {
            *arg = "multi-pool".into();
        }
        node.start_daemon();
        wait_for(
            "the restarted daemon's first cross-node pass",
            Duration::from_secs(10),
            || cross_node(node).synced,
        );
    }
    std::thread::sleep(Duration::from_millis(500));
    let (sent, received, summary) = pinger.finish();
    eprintln!("{TEST}: across both restarts: {summary}");
    // The datapath is the kernel's: an agent restart must lose nothing. The
    // bound allows only the one request that may be in flight when SIGINT stops
    // ping (it is counted as sent, its reply never read); no ICMP error at all.
    assert!(
        sent >= 10 && received + 1 >= sent && !summary.contains("errors"),
        "pings were lost across the agents' restarts: {summary}\nA:\n{}\nB:\n{}",
        nodes[0].log(),
        nodes[1].log()
    );
    let after: Vec<String> = nodes.iter().map(datapath).collect();
    assert_eq!(after, before, "the restarts changed routes or FDB entries");
    for (node, m) in names.iter().zip(monitors.iter_mut()) {
        let changes: Vec<String> = m.iter_mut().flat_map(Monitor::tunnel_changes).collect();
        assert!(
            changes.is_empty(),
            "{node}: routes, neighbours or FDB entries on the tunnel changed during the restarts:\n{}",
            changes.join("\n")
        );
    }

    // Every pod kept its address and shows as restored.
    for (node, ips) in [(&nodes[0], vec![&a1_ip, &a2_ip]), (&nodes[1], vec![&b1_ip])] {
        let allocs = node.allocations();
        for ip in ips {
            assert!(
                allocs.get(ip).is_some_and(|o| o.ends_with("[restored]")),
                "{ip}: {allocs:?}"
            );
        }
    }
    // New pods (their Pod objects first: multi-pool selects the pool from them)
    // come from the default pool and reach the others.
    let pool: ipnet::IpNet = "10.70.0.0/16".parse().expect("cidr");
    let (na, na_ip) = pool_pod(&cp, &nodes[0], names[0], "new-a", "default");
    let (nb, nb_ip) = pool_pod(&cp, &nodes[1], names[1], "new-b", "default");
    for ip in [&na_ip, &nb_ip] {
        assert!(
            pool.contains(&ip.parse::<std::net::IpAddr>().expect("ip")),
            "{ip}"
        );
    }
    assert!(ping(&na.ns, &[], &b1_ip), "{na_ip} -> {b1_ip}");
    assert!(ping(&nb.ns, &[], &a2_ip), "{nb_ip} -> {a2_ip}");
    assert!(ping(&nb.ns, &[], &na_ip), "{nb_ip} -> {na_ip}");
    // No block is held by two nodes.
    let all = allocated(&cp);
    let distinct: BTreeSet<&String> = all.iter().map(|(_, b)| b).collect();
    assert_eq!(distinct.len(), all.len(), "a block on two nodes: {all:?}");
    op.stop();
}
