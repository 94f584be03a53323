//! `podnet operator --ipam multi-pool` on a real kube-apiserver and etcd, as the
//! real binary with deploy/operator.yaml's ServiceAccount: it creates the pools of
//! `--auto-create-cilium-pod-ip-pools`, carves blocks for two real node daemons
//! (pods on each get addresses from their node's blocks, no block on two nodes),
//! a burst of ADDs on a fresh node waits in the daemon for its new blocks (none fails),
//! reports a pool's exhaustion in the node's operator-status, and takes back the
//! block a node gives back to give it to the other; a node asking for a pool that
//! does not exist gets Cilium's error until the pool is created; a pool edit that
//! breaks blocks in use is refused (the old definition keeps serving, the log, a
//! metric and `podnet operator status` say why); each writer keeps its fields; and
//! when the leader is SIGKILLed in the middle of a burst of new CiliumNodes the
//! follower re-adopts every node's blocks and never gives one block to two nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ipnet::IpNet;

use crate::harness::*;
use crate::k8s::ControlPlane;
use crate::k8s_backend::{
    add_as, create_node, create_pod, create_sandbox_pods, jsonpath, k8s_node,
};
use crate::operator::{
    Operator, install_operator, kill_mid_burst, lease_holder, managed_fields, operator_error,
    operator_status, per_node, wait_for,
};

/// The node's blocks (`spec.ipam.pools.allocated[*].cidrs`; none while it has
/// no CiliumNode).
fn blocks(cp: &ControlPlane, node: &str) -> Vec<IpNet> {
    cp.kubectl(&[
        "get",
        "ciliumnode",
        node,
        "-o",
        "jsonpath={.spec.ipam.pools.allocated[*].cidrs[*]}",
    ])
    .stdout
    .split_whitespace()
    .map(|c| c.parse().expect("a CIDR"))
    .collect()
}

/// ADD for pod `default/<pod>` (its Pod object created first), retried while
/// the node waits for a block; the pod's IPv4 address.
fn add_pod(
    cp: &ControlPlane,
    (name, node): (&str, &Node),
    sb: &Sandbox,
    pod: &str,
) -> std::net::IpAddr {
    create_pod(cp, "default", pod, name, "");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = add_as(node, sb, "default", pod);
        if r.ok {
            return r.ipv4().parse().expect("an address");
        }
        assert!(Instant::now() < deadline, "{name} {pod}: {}", r.stdout);
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The fields one manager owns (`fieldsV1` as text; empty if it owns none).
fn owned(cp: &ControlPlane, node: &str, manager: &str, subresource: &str) -> String {
    managed_fields(cp, node)
        .get(&(manager.to_string(), subresource.to_string()))
        .cloned()
        .unwrap_or_default()
}

#[test]
fn multi_pool_blocks_for_two_real_daemons_are_distinct_exhausted_released_and_reused() {
    const TEST: &str = "operator_multi_pool";
    let t0 = Instant::now();
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    // 10.61.0.0/27 in /29s: four blocks of six addresses.
    let op = Operator::start(
        &cp,
        "op-m",
        &sa,
        9975,
        &[
            "--ipam=multi-pool",
            "--auto-create-cilium-pod-ip-pools=default=ipv4-cidrs:10.61.0.0/27;ipv4-mask-size:29",
        ],
    );
    wait_for("the auto-created pool", Duration::from_secs(15), || {
        cp.kubectl(&[
            "get",
            "ciliumpodippool",
            "default",
            "-o",
            "jsonpath={.spec.ipv4}",
        ])
        .stdout
        .contains("10.61.0.0/27")
    });
    let (a, b) = ("mpa".to_string(), "mpb".to_string());
    let mut nodes = Vec::new();
    for name in [&a, &b] {
        nodes.push(spawn_multi_pool_node(&cp, name, ONE_BLOCK_NO_COOLDOWN).0);
    }
    // The daemons wait for their first block (their demand is written first).
    wait_for("a block for each node", Duration::from_secs(20), || {
        blocks(&cp, &a).len() == 1 && blocks(&cp, &b).len() == 1
    });
    for node in &mut nodes {
        node.wait_ready();
        assert!(
            node.log()
                .contains("waiting for the operator to allocate blocks of pools [\"default\"]"),
            "{}",
            node.log()
        );
    }

    // Four pods on A: with its router and health addresses they fill its block,
    // the demand (one more) brings a second.
    let mut a_pods = Vec::new();
    for i in 0..4 {
        let sb = nodes[0].sandbox();
        let ip = add_pod(&cp, (&a, &nodes[0]), &sb, &format!("a-{i}"));
        a_pods.push((sb, ip));
    }
    wait_for("A's second block", Duration::from_secs(15), || {
        blocks(&cp, &a).len() == 2
    });
    let a_blocks = blocks(&cp, &a);
    for (_, ip) in &a_pods {
        assert!(
            a_blocks.iter().any(|blk| blk.contains(ip)),
            "{ip} not in {a_blocks:?}"
        );
    }
    // B takes the last block, then asks for more than the pool has.
    let mut b_pods = Vec::new();
    for i in 0..10 {
        let sb = nodes[1].sandbox();
        let ip = add_pod(&cp, (&b, &nodes[1]), &sb, &format!("b-{i}"));
        b_pods.push((sb, ip));
    }
    let b_blocks = blocks(&cp, &b);
    assert_eq!(b_blocks.len(), 2, "{b_blocks:?}");
    for (_, ip) in &b_pods {
        assert!(
            b_blocks.iter().any(|blk| blk.contains(ip)),
            "{ip} not in {b_blocks:?}"
        );
    }
    let all: BTreeSet<IpNet> = a_blocks.iter().chain(&b_blocks).copied().collect();
    assert_eq!(
        all.len(),
        4,
        "a block on two nodes: {a_blocks:?} {b_blocks:?}"
    );
    let full = format!(
        "failed to allocate ipv4 address for node \"{b}\" from pool \"default\": CIDR allocation \
         failed; there are no remaining CIDRs left to allocate in the accepted range"
    );
    wait_for("B's exhaustion error", Duration::from_secs(15), || {
        operator_error(&cp, &b) == full
    });
    assert_eq!(operator_error(&cp, &a), "");
    wait_for("the pool metrics", Duration::from_secs(5), || {
        op.metric("podnet_operator_pool_blocks{pool=\"default\",state=\"free\"}") == Some(0.0)
    });
    assert_eq!(
        op.metric("podnet_operator_pool_blocks{pool=\"default\",state=\"allocated\"}"),
        Some(4.0)
    );

    // A's pods go: A gives its empty block back, the operator frees it, B gets it
    // and its error is cleared.
    for (sb, _) in &a_pods {
        let r = nodes[0].del(sb);
        assert!(r.ok, "{}", r.stdout);
    }
    let t = Instant::now();
    wait_for("A's block to move to B", Duration::from_secs(20), || {
        blocks(&cp, &a).len() == 1 && blocks(&cp, &b).len() == 3
    });
    eprintln!(
        "{TEST}: A's last DEL to its free block carved for B: {:?}",
        t.elapsed()
    );
    let moved: Vec<IpNet> = blocks(&cp, &b)
        .into_iter()
        .filter(|blk| !b_blocks.contains(blk))
        .collect();
    assert!(
        a_blocks.contains(&moved[0]),
        "{moved:?} was not A's {a_blocks:?}"
    );
    assert!(!blocks(&cp, &a).contains(&moved[0]));
    wait_for("B's error cleared", Duration::from_secs(10), || {
        operator_error(&cp, &b).is_empty()
    });
    let sb = nodes[1].sandbox();
    let ip = add_pod(&cp, (&b, &nodes[1]), &sb, "b-10");
    assert!(blocks(&cp, &b).iter().any(|blk| blk.contains(&ip)), "{ip}");
    // Given back once: the lower demand reached the operator before the removal,
    // so it did not carve the block right back for A.
    let log = nodes[0].log();
    assert_eq!(
        log.matches("gave blocks back to the operator").count(),
        1,
        "{log}"
    );
    assert_eq!(
        log.matches("released a free block above demand").count(),
        1,
        "{log}"
    );

    // Each writer keeps its fields: the agent's demand and the operator's blocks.
    let agent = owned(&cp, &b, "podnet-agent", "");
    let operator = owned(&cp, &b, "podnet-operator", "");
    assert!(
        agent.contains("f:requested") && !agent.contains("f:allocated"),
        "{agent}"
    );
    assert!(
        operator.contains("f:allocated") && !operator.contains("f:requested"),
        "{operator}"
    );
    assert!(owned(&cp, &b, "podnet-operator", "status").contains("operator-status"));
    for node in [&a, &b] {
        let requested = jsonpath(&cp, "ciliumnode", node, "{.spec.ipam.pools.requested}");
        assert!(requested.contains("\"default\""), "{node}: {requested}");
    }
    assert!(op.log().contains("re-adopted their blocks"));
    drop(op);
    drop(nodes);
    eprintln!("{TEST}: whole test {:?}", t0.elapsed());
}

/// A CiliumNode without a daemon whose agent asks for `pools` (`pool=addresses`),
/// applied as the agent's field manager.
fn request(cp: &ControlPlane, node: &str, pools: &[(&str, u64)]) {
    let list = pools
        .iter()
        .map(|(p, n)| format!("{{pool: {p}, needed: {{ipv4-addrs: {n}}}}}"))
        .collect::<Vec<_>>()
        .join(", ");
    cp.kubectl_stdin(
        &["apply", "--server-side", "--field-manager", "podnet-agent", "-f", "-"],
        &format!(
            "apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata: {{name: {node}}}\nspec:\n  ipam:\n    pools:\n      requested: [{list}]\n"
        ),
    )
    .expect_ok("the agent's demand");
}

/// A burst of ADDs on a fresh node (32 at a time, one attempt each) needs several
/// blocks more than its pre-allocation: every ADD waits in the daemon for the
/// blocks its demand brings through the API server instead of failing. The node's
/// update rate is an hour, so the demand reaches the operator only because a
/// waiting allocation has it written at once.
#[test]
fn a_burst_on_a_fresh_multi_pool_node_waits_for_blocks_and_no_add_fails() {
    const TEST: &str = "operator_multi_pool_burst";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    // 10.67.0.0/24 in /28s: sixteen blocks of fourteen addresses.
    let _op = Operator::start(
        &cp,
        "op-b",
        &sa,
        9979,
        &[
            "--ipam=multi-pool",
            "--auto-create-cilium-pod-ip-pools=default=ipv4-cidrs:10.67.0.0/24;ipv4-mask-size:28",
        ],
    );
    let (mut node, name) = spawn_multi_pool_node(
        &cp,
        "burst",
        &[
            "--ipam-multi-pool-pre-allocation",
            "default=8",
            "--ipam-cilium-node-update-rate",
            "1h",
        ],
    );
    node.wait_ready();
    let first_blocks = blocks(&cp, &name).len();
    let pods: Vec<Sandbox> = (0..64).map(|_| node.sandbox()).collect();
    create_sandbox_pods(&cp, &name, &pods);

    let refs: Vec<&Sandbox> = pods.iter().collect();
    let results = node.plugin_parallel("ADD", &refs, 32);
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| !r.ok)
        .map(|r| r.stdout.as_str())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 64 ADDs failed, first: {}",
        failed.len(),
        failed[0]
    );
    let ips: BTreeSet<std::net::IpAddr> = results
        .iter()
        .map(|r| r.ipv4().parse().expect("an address"))
        .collect();
    assert_eq!(ips.len(), 64, "an address given twice");
    let now = blocks(&cp, &name);
    // 64 pods plus the router and health addresses need at least five blocks.
    assert!(
        now.len() >= 5 && now.len() > first_blocks,
        "blocks at start {first_blocks}, after the burst {now:?}"
    );
    for ip in &ips {
        assert!(now.iter().any(|b| b.contains(ip)), "{ip} not in {now:?}");
    }
    for r in node.plugin_parallel("DEL", &refs, 32) {
        assert!(r.ok, "{}", r.stdout);
    }
}

pub fn pool_yaml(name: &str, cidr: &str, mask: u8) -> String {
    format!(
        "apiVersion: cilium.io/v2alpha1\nkind: CiliumPodIPPool\nmetadata: {{name: {name}}}\n\
         spec:\n  ipv4: {{cidrs: [{cidr}], maskSize: {mask}}}\n"
    )
}

#[test]
fn multi_pool_reports_a_missing_pool_and_refuses_an_edit_that_breaks_blocks() {
    const TEST: &str = "operator_pool_edits";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    cp.apply(&pool_yaml("default", "10.62.0.0/24", 28));
    request(&cp, "ghost-1", &[("mars", 10)]);
    // An auto-created pool that exists already is left as it is.
    let op = Operator::start(
        &cp,
        "op-e",
        &sa,
        9976,
        &[
            "--ipam=multi-pool",
            "--auto-create-cilium-pod-ip-pools=default=ipv4-cidrs:10.99.0.0/16;ipv4-mask-size:24",
        ],
    );
    let missing = "failed to allocate ipv4 address for node \"ghost-1\" from pool \"mars\": \
                   cannot allocate from non-existing pool: mars";
    wait_for("the missing pool's error", Duration::from_secs(15), || {
        operator_error(&cp, "ghost-1") == missing
    });
    assert!(blocks(&cp, "ghost-1").is_empty());
    assert!(
        op.log()
            .contains("the CiliumPodIPPool exists; left as it is")
    );
    let default = jsonpath(&cp, "ciliumpodippool", "default", "{.spec.ipv4}");
    assert!(
        default.contains("10.62.0.0/24") && !default.contains("10.99"),
        "{default}"
    );

    // The pool appears: the node gets a block and its error goes.
    cp.apply(&pool_yaml("mars", "10.63.0.0/24", 28));
    wait_for("a mars block", Duration::from_secs(10), || {
        blocks(&cp, "ghost-1") == ["10.63.0.0/28".parse::<IpNet>().expect("cidr")]
    });
    wait_for("the error cleared", Duration::from_secs(10), || {
        operator_error(&cp, "ghost-1").is_empty()
    });

    // mars is replaced with /27 blocks (maskSize itself is immutable in the CRD):
    // refused while ghost-1 holds a /28, and the old definition keeps serving.
    cp.kubectl(&["delete", "ciliumpodippool", "mars"])
        .expect_ok("delete mars");
    cp.apply(&pool_yaml("mars", "10.63.0.0/24", 27));
    // The delete alone may be seen first, and refused too (ghost-1 holds mars'
    // blocks): wait for the refusal of the new definition itself.
    let why = "cannot change IPv4 mask size in existing pool \"mars\" from 28 to 27: maskSize is \
               immutable once the pool has blocks (node \"ghost-1\" holds 10.63.0.0/28)";
    wait_for("the refusal", Duration::from_secs(10), || {
        op.log().contains(why)
    });
    wait_for("the refusal's gauge", Duration::from_secs(10), || {
        op.metric("podnet_operator_pool_definitions_refused") == Some(1.0)
    });
    request(&cp, "ghost-1", &[("mars", 20)]);
    wait_for(
        "a second /28 from the old definition",
        Duration::from_secs(10),
        || blocks(&cp, "ghost-1").len() == 2,
    );
    assert!(blocks(&cp, "ghost-1").iter().all(|b| b.prefix_len() == 28));
    let (code, out, err) = operator_status(&cp, &sa, &[]);
    eprintln!("{TEST}: podnet operator status:\n{out}");
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "  ghost-1: podCIDRs none; pool mars: 10.63.0.0/28, 10.63.0.16/28; router none"
        ),
        "{out}"
    );
    // Counted through the definition the API server has now, which does not
    // accept the node's /28s: they are listed, the refused edit's reason.
    assert!(
        out.contains("Pool default:  IPv4 10.62.0.0/24 in /28s: 0 blocks in use, 16 free"),
        "{out}"
    );
    assert!(
        out.contains("Pool mars:  IPv4 10.63.0.0/24 in /27s: 0 blocks in use, 8 free"),
        "{out}"
    );
    assert!(
        out.contains(
            "  node \"ghost-1\": unable to reuse from pool mars: cidr 10.63.0.0/28 is a /28 but the \
             pool's ipv4 maskSize is 27"
        ),
        "{out}"
    );

    // The old definition back: accepted, the refusal ends.
    cp.kubectl(&["delete", "ciliumpodippool", "mars"])
        .expect_ok("delete mars");
    cp.apply(&pool_yaml("mars", "10.63.0.0/24", 28));
    wait_for("the refusal to end", Duration::from_secs(10), || {
        op.metric("podnet_operator_pool_definitions_refused") == Some(0.0)
    });

    // The agent's demand and the operator's blocks live side by side.
    let agent = owned(&cp, "ghost-1", "podnet-agent", "");
    assert!(
        agent.contains("f:requested") && !agent.contains("f:allocated"),
        "{agent}"
    );
    let operator = owned(&cp, "ghost-1", "podnet-operator", "");
    assert!(
        operator.contains("f:allocated") && !operator.contains("f:requested"),
        "{operator}"
    );
    // A node deleted gives its blocks back.
    cp.kubectl(&["delete", "ciliumnode", "ghost-1"])
        .expect_ok("delete the node");
    wait_for("the blocks freed", Duration::from_secs(10), || {
        op.metric("podnet_operator_pool_blocks{pool=\"mars\",state=\"allocated\"}") == Some(0.0)
    });
}

/// name -> blocks of every CiliumNode.
fn all_blocks(cp: &ControlPlane) -> BTreeMap<String, Vec<String>> {
    per_node(cp, "{.spec.ipam.pools.allocated[*].cidrs[*]}")
}

#[test]
fn multi_pool_follower_takes_over_mid_burst_and_never_gives_a_block_twice() {
    const TEST: &str = "operator_multi_pool_failover";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    cp.apply(&pool_yaml("default", "10.64.0.0/20", 28));
    let mut ops = vec![
        Operator::start(&cp, "op-a", &sa, 9977, &["--ipam=multi-pool"]),
        Operator::start(&cp, "op-b", &sa, 9978, &["--ipam=multi-pool"]),
    ];
    wait_for("a leader", Duration::from_secs(10), || {
        ["op-a", "op-b"].contains(&lease_holder(&cp).as_str())
    });
    let leader = ops
        .iter()
        .position(|o| o.identity == lease_holder(&cp))
        .expect("leader");
    // 30 CiliumNodes asking for 20 addresses each (two /28s), in batches of 5.
    const NODES: usize = 30;
    let manifests: Vec<String> = (0..NODES / 5)
        .map(|batch| {
            (0..5)
                .map(|i| {
                    format!(
                        "apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata:\n  name: mp-burst-{:02}\n\
                         spec:\n  ipam:\n    pools:\n      requested: [{{pool: default, needed: {{ipv4-addrs: 20}}}}]\n",
                        batch * 5 + i
                    )
                })
                .collect::<Vec<_>>()
                .join("---\n")
        })
        .collect();
    let (killed, _) = kill_mid_burst(&cp, &manifests, &mut ops[leader], || {
        all_blocks(&cp).values().filter(|b| !b.is_empty()).count()
    });

    wait_for("every node's two blocks", Duration::from_secs(40), || {
        let all = all_blocks(&cp);
        all.len() == NODES && all.values().all(|b| b.len() == 2)
    });
    eprintln!(
        "{TEST}: every node served {:?} after the kill",
        killed.elapsed()
    );
    let mut seen = BTreeSet::new();
    for (name, blocks) in all_blocks(&cp) {
        for b in blocks {
            assert!(b.starts_with("10.64.") && b.ends_with("/28"), "{name}: {b}");
            assert!(seen.insert(b.clone()), "{b} given twice");
        }
    }
    let follower = &ops[1 - leader];
    assert_eq!(lease_holder(&cp), follower.identity);
    assert!(follower.log().contains("re-adopted their blocks"));
    drop(ops);
}

/// Daemon options for a multi-pool node that asks for one block at a time and
/// frees addresses at once.
pub const ONE_BLOCK_NO_COOLDOWN: &[&str] = &[
    "--ipam-multi-pool-pre-allocation",
    "default=1",
    "--ipam-release-cooldown",
    "0s",
];

/// A node (its Node object) and its multi-pool daemon with `tuning` after
/// `--ipam multi-pool`, started without waiting for it; the daemon and the
/// node's name.
pub fn spawn_multi_pool_node(cp: &ControlPlane, name: &str, tuning: &[&str]) -> (Node, String) {
    let ns = cp.add_node_ns(name);
    create_node(cp, &ns, &[]);
    let name = ns.name.clone();
    let mut args = vec!["--ipam", "multi-pool"];
    args.extend_from_slice(tuning);
    let mut node = k8s_node(ns, &cp.kubeconfig(), &args);
    node.spawn_daemon();
    (node, name)
}
