//! Multi-pool in real namespaces: the chapter's Lab 2 (pool selection by namespace
//! and pod annotation, require-pool-match), Lab 3 (online migration from
//! cluster-pool with live sandboxes), dual-stack pools, one pool exhausted while
//! another has room, and the demand/block cycle of a burst of 100 sandboxes.

use std::path::Path;

use crate::harness::*;

const POOLS: &str = r#"
apiVersion: cilium.io/v2alpha1
kind: CiliumPodIPPool
metadata:
  name: default
spec:
  ipv4:
    cidrs: ["10.10.0.0/16"]
    maskSize: 27
---
apiVersion: cilium.io/v2alpha1
kind: CiliumPodIPPool
metadata:
  name: mars
spec:
  ipv4:
    cidrs: ["10.20.0.0/16"]
    maskSize: 27
"#;

const METADATA: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata:
    name: ns-a
    annotations:
      ipam.cilium.io/ip-pool: mars
- apiVersion: v1
  kind: Namespace
  metadata:
    name: ns-b
- apiVersion: v1
  kind: Namespace
  metadata:
    name: ns-c
    annotations:
      ipam.cilium.io/require-pool-match: "true"
- apiVersion: v1
  kind: Pod
  metadata: {name: p1, namespace: ns-a}
- apiVersion: v1
  kind: Pod
  metadata: {name: p2, namespace: ns-b}
- apiVersion: v1
  kind: Pod
  metadata:
    name: p3
    namespace: ns-b
    annotations:
      ipam.cilium.io/ip-pool: mars
- apiVersion: v1
  kind: Pod
  metadata: {name: p4, namespace: ns-c}
"#;

fn write(dir: &Path, name: &str, text: &str) -> String {
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::write(dir.join(name), text).expect("write manifest");
    dir.display().to_string()
}

fn add_as(node: &Node, sb: &Sandbox, ns: &str, pod: &str) -> PluginOutput {
    let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod}");
    node.plugin("ADD", Some(sb), &node.conf("1.1.0"), &[("CNI_ARGS", &args)])
}

fn add_unnamed(node: &Node, sb: &Sandbox) -> PluginOutput {
    node.plugin("ADD", Some(sb), &node.conf("1.1.0"), &[("CNI_ARGS", "")])
}

fn node_resource(node: &Node) -> serde_json::Value {
    serde_json::from_slice(
        &node
            .client()
            .call("GET", "/v1/node", &[], None)
            .expect("node")
            .body,
    )
    .expect("json")
}

fn blocks_of(node: &Node, pool: &str) -> Vec<String> {
    let n = node_resource(node);
    n["spec"]["ipam"]["pools"]["allocated"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["pool"] == pool)
        .flat_map(|a| a["cidrs"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c.as_str().map(str::to_string))
        .collect()
}

#[test]
fn lab2_pool_selection_by_namespace_pod_annotation_and_require_match() {
    if !root_or_skip("lab2") {
        return;
    }
    let scratch = std::env::temp_dir().join(format!("podnet-lab2-{}", unique("")));
    let pools = write(&scratch.join("pools"), "pools.yaml", POOLS);
    let meta = write(&scratch.join("meta"), "meta.yaml", METADATA);
    let node = Node::start(&[
        "--ipam",
        "multi-pool",
        "--pool-dir",
        &pools,
        "--metadata-dir",
        &meta,
        "--ipam-multi-pool-pre-allocation",
        "default=8,mars=4",
        "--k8s-node-name",
        "lab2",
    ]);
    let (s1, s2, s3, s4) = (
        node.sandbox(),
        node.sandbox(),
        node.sandbox(),
        node.sandbox(),
    );
    let r1 = add_as(&node, &s1, "ns-a", "p1");
    let r2 = add_as(&node, &s2, "ns-b", "p2");
    let r3 = add_as(&node, &s3, "ns-b", "p3");
    assert!(
        r1.ipv4().starts_with("10.20."),
        "namespace annotation → mars: {r1:?}"
    );
    assert!(
        r2.ipv4().starts_with("10.10."),
        "no annotation → default: {r2:?}"
    );
    assert!(
        r3.ipv4().starts_with("10.20."),
        "pod annotation wins: {r3:?}"
    );
    let r4 = add_as(&node, &s4, "ns-c", "p4");
    assert_eq!(r4.code(), 100, "{r4:?}");
    assert!(
        r4.msg().contains(
            "no matching CiliumPodIPPool found for pod ns-c/p4 (family=ipv4) and require-pool-match annotation is set on namespace"
        ),
        "{}",
        r4.msg()
    );
    // Pools carry pod traffic alike.
    assert!(s1.ping(&r2.ipv4()) && s2.ping(&r3.ipv4()));
    // The status map keys non-default pools as pool/ip; the node resource shows
    // the demand and the blocks.
    let allocs = node.allocations();
    assert!(
        allocs.contains_key(&format!("mars/{}", r1.ipv4())),
        "{allocs:?}"
    );
    assert!(allocs.contains_key(&r2.ipv4()), "{allocs:?}");
    let n = node_resource(&node);
    let requested = n["spec"]["ipam"]["pools"]["requested"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mars = requested
        .iter()
        .find(|r| r["pool"] == "mars")
        .expect("mars requested");
    assert_eq!(
        mars["needed"]["ipv4-addrs"], 8,
        "2 in use with pre-allocation 4 → neededIPCeil = 8: {n}"
    );
    assert_eq!(blocks_of(&node, "mars").len(), 1);
    let st = node.client().healthz().expect("healthz");
    assert!(
        st.ipam.status.contains("IPv4: 2 IPAM pool(s) available"),
        "{}",
        st.ipam.status
    );
    // explain names the precedence step.
    let ex = node.client().explain("ns-b/p3").expect("explain");
    assert!(
        ex.addresses[0]
            .rule
            .contains("the pod's ipam.cilium.io pool annotation"),
        "{ex:?}"
    );
    let _ = std::fs::remove_dir_all(scratch);
}

#[test]
fn lab3_cluster_pool_to_multi_pool_migration_keeps_live_sandboxes() {
    if !root_or_skip("lab3") {
        return;
    }
    let mut node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.30.0.0/16",
        "--cluster-pool-ipv4-mask-size",
        "24",
        "--k8s-node-name",
        "lab3",
    ]);
    let a = node.sandbox();
    let b = node.sandbox();
    let (ra, rb) = (node.add(&a), node.add(&b));
    let cidr = node.ipv4_addressing().alloc_range;
    node.stop_daemon(false);

    // Preconditions: the flag, and a default pool with the same mask.
    let multi = |mask: &str, migrate: bool| -> Vec<String> {
        let mut v = vec![
            "--ipam".to_string(),
            "multi-pool".into(),
            "--auto-create-cilium-pod-ip-pools".into(),
            format!("default=ipv4-cidrs:10.30.0.0/16;ipv4-mask-size:{mask}"),
            "--k8s-node-name".into(),
            "lab3".into(),
        ];
        if migrate {
            v.push("--enable-cluster-pool-to-multi-pool-migration".into());
        }
        v
    };
    for (args, want) in [
        (
            multi("24", false),
            "enable-cluster-pool-to-multi-pool-migration",
        ),
        (multi("26", true), "mask"),
    ] {
        node.args = args;
        let out = node.daemon_command(&[]).output().expect("daemon");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "a migration precondition was not checked"
        );
        assert!(err.contains(want), "expected {want:?} in: {err}");
    }

    // The migration itself, with a ping running across the restart.
    node.args = multi("24", true);
    let pinger = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &a.ns.name,
            "ping",
            "-c",
            "15",
            "-i",
            "0.2",
            "-W",
            "1",
            &rb.ipv4(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("ping");
    node.start_daemon();
    let out = pinger.wait_with_output().expect("ping output");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("15 received"),
        "pings were lost across the migration: {text}"
    );
    assert_eq!(
        blocks_of(&node, "default"),
        vec![cidr.clone()],
        "the node CIDR must appear under pools.allocated"
    );
    let allocs = node.allocations();
    for ip in [ra.ipv4(), rb.ipv4()] {
        assert!(
            allocs.get(&ip).is_some_and(|o| o.ends_with("[restored]")),
            "{ip}: {allocs:?}"
        );
    }
    let c = node.sandbox();
    let rc = node.add(&c);
    let net: ipnet::IpNet = cidr.parse().expect("cidr");
    assert!(
        net.contains(&rc.ipv4().parse::<std::net::IpAddr>().expect("ip")),
        "{rc:?}"
    );
    assert!(c.ping(&ra.ipv4()));
    assert!(node.del(&a).ok);
}

#[test]
fn dual_stack_pools_and_one_pool_exhausted_while_another_has_room() {
    if !root_or_skip("multipool_dual_exhausted") {
        return;
    }
    let scratch = std::env::temp_dir().join(format!("podnet-mp-{}", unique("")));
    let pools = write(
        &scratch.join("pools"),
        "pools.yaml",
        r#"
apiVersion: cilium.io/v2alpha1
kind: CiliumPodIPPool
metadata: {name: default}
spec:
  ipv4: {cidrs: ["10.50.0.0/16"], maskSize: 26}
  ipv6: {cidrs: ["fd00:50::/112"], maskSize: 120}
---
apiVersion: cilium.io/v2alpha1
kind: CiliumPodIPPool
metadata: {name: tiny}
spec:
  ipv4: {cidrs: ["10.60.0.0/29"], maskSize: 29}
  ipv6: {cidrs: ["fd00:60::/120"], maskSize: 120}
"#,
    );
    let mut ns_yaml =
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: small\n  annotations:\n    ipam.cilium.io/ip-pool: tiny\n".to_string();
    for i in 0..7 {
        ns_yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: s{i}\n  namespace: small\n"
        ));
    }
    let meta = write(&scratch.join("meta"), "ns.yaml", &ns_yaml);
    let node = Node::start(&[
        "--ipam",
        "multi-pool",
        "--enable-ipv6",
        "--pool-dir",
        &pools,
        "--metadata-dir",
        &meta,
        "--ipam-multi-pool-pre-allocation",
        "default=8,tiny=1",
        "--ipam-release-cooldown",
        "0s",
        "--k8s-node-name",
        "dual",
    ]);
    // Dual-stack from the default pool (no pod names: the owner is the container,
    // which pool selection sends to the default pool).
    let d = node.sandbox();
    let rd = add_unnamed(&node, &d);
    assert!(
        rd.ipv4().starts_with("10.50.") && rd.ipv6().starts_with("fd00:50::"),
        "{rd:?}"
    );
    // tiny holds one /29 (6 usable IPv4): the 7th pod of namespace "small" fails.
    let sbs: Vec<Sandbox> = (0..7).map(|_| node.sandbox()).collect();
    let mut results = Vec::new();
    for (i, sb) in sbs.iter().enumerate() {
        results.push(add_as(&node, sb, "small", &format!("s{i}")));
    }
    for r in &results[..6] {
        assert!(
            r.ok && r.ipv4().starts_with("10.60.0.") && r.ipv6().starts_with("fd00:60::"),
            "{r:?}"
        );
    }
    let last = &results[6];
    assert_eq!(last.code(), 101, "{last:?}");
    assert!(
        last.msg().contains("all CIDR ranges are exhausted"),
        "{}",
        last.msg()
    );
    assert!(
        last.msg()
            .contains("failed to allocate ipv4 address for node \"dual\" from pool \"tiny\""),
        "{}",
        last.msg()
    );
    // The default pool still has room: the node is not exhausted (issue 53: one
    // exhausted pool neither taints the node nor fails STATUS, which a runtime
    // turns into a NotReady node), and podnet status names the full pool.
    let e = node.sandbox();
    assert!(add_unnamed(&node, &e).ok);
    let st = node.plugin("STATUS", None, &node.conf("1.1.0"), &[]);
    assert!(st.ok, "{st:?}");
    let status = node.podnet(&["status"]);
    assert!(status.contains("10.60.0.0/29"), "{status}");
    let _ = std::fs::remove_dir_all(scratch);
}

#[test]
fn a_burst_of_100_sandboxes_grows_and_shrinks_the_blocks() {
    if !root_or_skip("multipool_burst") {
        return;
    }
    let node = Node::start(&[
        "--ipam",
        "multi-pool",
        "--auto-create-cilium-pod-ip-pools",
        "default=ipv4-cidrs:10.70.0.0/16;ipv4-mask-size:27",
        "--ipam-release-cooldown",
        "0s",
        "--k8s-node-name",
        "burst",
    ]);
    let idle = blocks_of(&node, "default");
    let sbs: Vec<Sandbox> = (0..100).map(|_| node.sandbox()).collect();
    let refs: Vec<&Sandbox> = sbs.iter().collect();
    for r in node.plugin_parallel("ADD", &refs, 16) {
        assert!(r.ok, "{r:?}");
    }
    let n = node_resource(&node);
    let needed = n["spec"]["ipam"]["pools"]["requested"][0]["needed"]["ipv4-addrs"]
        .as_u64()
        .unwrap_or(0);
    let busy = blocks_of(&node, "default");
    // 100 pods + router + health = 102 in use; neededIPCeil(102, 8) = 112; /27
    // blocks hold 30 usable each.
    assert_eq!(needed, 112, "{n}");
    assert!(
        busy.len() >= 4 && busy.len() > idle.len(),
        "idle {idle:?} busy {busy:?}"
    );
    for r in node.plugin_parallel("DEL", &refs, 16) {
        assert!(r.ok, "{r:?}");
    }
    // The links go in the background; the addresses are released after them.
    assert!(node.host_links_gone());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while (blocks_of(&node, "default").len() > 1 || node.allocations().len() > 2)
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let after = blocks_of(&node, "default");
    let n = node_resource(&node);
    assert_eq!(
        n["spec"]["ipam"]["pools"]["requested"][0]["needed"]["ipv4-addrs"], 16,
        "{n}"
    );
    assert_eq!(
        after.len(),
        1,
        "free blocks above demand must be given back: {after:?}"
    );
    eprintln!(
        "multipool burst: idle blocks {idle:?}; after 100 ADDs needed={needed} blocks={} {busy:?}; after DEL blocks {after:?}",
        busy.len()
    );
}
