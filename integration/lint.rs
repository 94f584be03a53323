//! `podnet lint` on real inputs: a clean configuration passes; overlapping pools,
//! a pod range over the node's own network, a pool change the running daemon
//! would refuse, the misspelled annotation, ENI with a tunnel and a conflist that
//! misses the daemon are each reported, and so is a CiliumCIDRGroup with a bad CIDR.

use std::path::Path;
use std::process::Command;

use crate::harness::*;

fn lint_in(ns: &Netns, args: &[&str]) -> (bool, String) {
    let mut full = vec![podnet_bin(), "lint"];
    full.extend_from_slice(args);
    let out = ns.exec(&full);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::write(dir.join(name), text).expect("write");
    dir.display().to_string()
}

#[test]
fn lint_reports_each_kind_of_finding() {
    if !root_or_skip("lint") {
        return;
    }
    // A node namespace with an address in 10.0.5.0/24, like a VPC node.
    let ns = Netns::new("pnt-lint");
    ns.exec(&[
        "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1",
    ]);
    ns.exec(&["ip", "addr", "add", "10.0.5.10/24", "dev", "eth0"]);
    ns.exec(&["ip", "link", "set", "eth0", "up"]);
    let scratch = std::env::temp_dir().join(format!("podnet-lint-{}", unique("")));

    let (ok, text) = lint_in(&ns, &["--cluster-pool-ipv4-cidr", "10.244.0.0/16"]);
    assert!(ok, "a clean configuration must pass: {text}");
    assert!(text.contains("ok: no findings"));

    let (ok, text) = lint_in(&ns, &["--cluster-pool-ipv4-cidr", "10.0.0.0/8"]);
    assert!(!ok);
    assert!(
        text.contains(
            "error: pod CIDR 10.0.0.0/8 overlaps this node's address 10.0.5.10/24 on eth0"
        ),
        "{text}"
    );
    assert!(text.contains("warning: pool CIDR 10.0.0.0/8"), "{text}");

    let (ok, text) = lint_in(
        &ns,
        &[
            "--cluster-pool-ipv4-cidr",
            "10.244.0.0/16",
            "--cluster-pool-ipv4-mask-size",
            "31",
        ],
    );
    assert!(!ok && text.contains("/31"), "{text}");

    let pools = write(
        &scratch.join("pools"),
        "p.yaml",
        "apiVersion: cilium.io/v2alpha1\nkind: CiliumPodIPPool\nmetadata: {name: default}\nspec:\n  ipv4: {cidrs: [\"10.10.0.0/16\"], maskSize: 27}\n---\napiVersion: cilium.io/v2alpha1\nkind: CiliumPodIPPool\nmetadata: {name: mars}\nspec:\n  ipv4: {cidrs: [\"10.10.128.0/17\"], maskSize: 27}\n",
    );
    let meta = write(
        &scratch.join("meta"),
        "ns.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  annotations:\n    ipam.cilium.io/ipam-pool: mars\n",
    );
    let (ok, text) = lint_in(
        &ns,
        &[
            "--ipam",
            "multi-pool",
            "--pool-dir",
            &pools,
            "--metadata-dir",
            &meta,
        ],
    );
    assert!(!ok);
    assert!(text.contains("overlaps pool"), "{text}");
    assert!(
        text.contains("ipam.cilium.io/ipam-pool, which does nothing"),
        "{text}"
    );

    let cfg = write(&scratch.join("cfg"), "ipam", "eni");
    write(&scratch.join("cfg"), "routing-mode", "tunnel");
    let (ok, text) = lint_in(&ns, &["--config-dir", &cfg]);
    assert!(
        !ok && text.contains("cannot be combined with a tunnel"),
        "{text}"
    );

    let conf = write(
        &scratch.join("net.d"),
        "10.conflist",
        r#"{"cniVersion":"1.1.0","name":"x","plugins":[{"type":"podnet","socket-path":"/elsewhere.sock"}]}"#,
    );
    let conflist = format!("{conf}/10.conflist");
    let (ok, text) = lint_in(
        &ns,
        &[
            "--cluster-pool-ipv4-cidr",
            "10.244.0.0/16",
            "--conflist",
            &conflist,
        ],
    );
    assert!(
        !ok && text.contains("is not the daemon's --socket"),
        "{text}"
    );
    // CiliumCIDRGroups: the chapter's group passes, a bad CIDR is an error.
    let groups = write(
        &scratch.join("groups"),
        "groups.yaml",
        "apiVersion: cilium.io/v2\nkind: CiliumCIDRGroup\nmetadata: {name: corp-ranges}\n\
         spec:\n  externalCIDRs: [10.30.0.0/16, 192.168.100.0/24]\n",
    );
    let groups_file = format!("{groups}/groups.yaml");
    let clean = ["--cluster-pool-ipv4-cidr", "10.244.0.0/16"];
    let (ok, text) = lint_in(
        &ns,
        &[&clean[..], &["--cidr-groups", &groups_file]].concat(),
    );
    assert!(ok, "{text}");
    write(
        &scratch.join("groups"),
        "groups.yaml",
        "apiVersion: cilium.io/v2\nkind: CiliumCIDRGroup\nmetadata: {name: corp-ranges}\n\
         spec:\n  externalCIDRs: [10.30.0.0/16, 10.300.0.0/16]\n",
    );
    let (ok, text) = lint_in(
        &ns,
        &[&clean[..], &[&format!("--cidr-groups={groups_file}")]].concat(),
    );
    assert!(!ok);
    assert!(
        text.contains(
            r#"CiliumCIDRGroup "corp-ranges": spec.externalCIDRs[1]: "10.300.0.0/16" is not a CIDR"#
        ),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(scratch);
}

#[test]
fn lint_catches_a_pool_change_the_running_daemon_would_refuse() {
    if !root_or_skip("lint_running") {
        return;
    }
    let scratch = std::env::temp_dir().join(format!("podnet-lint2-{}", unique("")));
    let pool = |mask: u8| {
        format!(
            "apiVersion: cilium.io/v2alpha1\nkind: CiliumPodIPPool\nmetadata: {{name: default}}\nspec:\n  ipv4: {{cidrs: [\"10.11.0.0/16\"], maskSize: {mask}}}\n"
        )
    };
    let live = write(&scratch.join("live"), "p.yaml", &pool(27));
    let edited = write(&scratch.join("edited"), "p.yaml", &pool(26));
    let node = Node::start(&[
        "--ipam",
        "multi-pool",
        "--pool-dir",
        &live,
        "--k8s-node-name",
        "lint",
    ]);
    let a = node.sandbox();
    assert!(node.add(&a).ok);
    let socket = node.socket().display().to_string();
    let out = Command::new(podnet_bin())
        .args([
            "lint",
            "--ipam",
            "multi-pool",
            "--pool-dir",
            &edited,
            "--socket",
            &socket,
        ])
        .output()
        .expect("lint");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        text.contains("against the running daemon's blocks") && text.contains("maskSize is 26"),
        "{text}"
    );

    let _ = std::fs::remove_dir_all(scratch);
}
