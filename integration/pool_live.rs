//! The cluster pool changed on a live cluster (issue 45 item 2), on a real
//! kube-apiserver and etcd (integration/k8s.rs) with the real operator reading
//! its options from a `--config-dir` laid out as the kubelet mounts a ConfigMap
//! (files that are symlinks through `..data`, the whole set swapped by renaming
//! one symlink). No operator restart: a CIDR appended gives the waiting node its
//! range; a CIDR removed while a node is on it drains (an Event and an `operator
//! status` line name the node, the node keeps its range, no new one comes from
//! it); a new entry with its own mask size gives a new node a range of that size;
//! an entry over the draining CIDR is refused until its node is deleted, and is
//! then taken (the removal completed and the CIDR was forgotten). Across
//! restarts (issue 53): a refused mask-size edit stays refused, a ConfigMap that
//! does not parse costs no replica its start (both: the pool in force the Lease
//! records), and with no record a range of another size is held apart, so a new
//! node never gets a range inside a live one.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::k8s::ControlPlane;
use crate::k8s_backend::jsonpath;
use crate::operator::{
    Operator, install_operator, node_events as events, operator_error, operator_status, wait_for,
};

/// A directory as the kubelet keeps a mounted ConfigMap: `..<version>/` holds
/// the files, `..data` points at it, and each key is a symlink `..data/<key>`.
struct ConfigMapDir {
    dir: PathBuf,
    version: u32,
}

impl ConfigMapDir {
    fn new(dir: PathBuf, data: &[(&str, &str)]) -> ConfigMapDir {
        std::fs::create_dir_all(&dir).expect("config dir");
        let mut c = ConfigMapDir { dir, version: 0 };
        c.swap(data);
        for (key, _) in data {
            std::os::unix::fs::symlink(format!("..data/{key}"), c.dir.join(key))
                .expect("key symlink");
        }
        c
    }

    /// The kubelet's update: a new version directory, then `..data` renamed
    /// onto a symlink to it (atomic: a reader sees the old set or the new one).
    fn swap(&mut self, data: &[(&str, &str)]) {
        self.version += 1;
        let version = format!("..v{}", self.version);
        let dir = self.dir.join(&version);
        std::fs::create_dir(&dir).expect("version dir");
        for (key, value) in data {
            std::fs::write(dir.join(key), value).expect("config file");
        }
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&version, &tmp).expect("..data_tmp");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("rename ..data");
    }

    fn path(&self) -> &Path {
        &self.dir
    }
}

fn create_node(cp: &ControlPlane, name: &str) {
    let yaml = format!(
        "apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata:\n  name: {name}\nspec: {{}}\n"
    );
    cp.kubectl_stdin(&["create", "-f", "-"], &yaml)
        .expect_ok("create a CiliumNode");
}

fn pod_cidrs(cp: &ControlPlane, node: &str) -> String {
    jsonpath(cp, "ciliumnode", node, "{.spec.ipam.podCIDRs[*]}")
}

const POOL: &str = "cluster-pool-ipv4-cidr";
const MASK: &str = "cluster-pool-ipv4-mask-size";

#[test]
fn the_pool_grows_drains_and_takes_new_mask_sizes_without_an_operator_restart() {
    const TEST: &str = "pool_live";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    let mut config = ConfigMapDir::new(
        cp.dir().join("operator-config"),
        &[(POOL, "10.94.0.0/24"), (MASK, "24")],
    );
    let dir = config.path().display().to_string();
    let mut op = Operator::start(&cp, "op-live", &sa, 9984, &["--config-dir", &dir]);
    create_node(&cp, "pl-1");
    wait_for("pl-1's range", Duration::from_secs(20), || {
        pod_cidrs(&cp, "pl-1") == "10.94.0.0/24"
    });
    create_node(&cp, "pl-2");
    wait_for("pl-2 to wait", Duration::from_secs(10), || {
        operator_error(&cp, "pl-2") == "allocator full"
    });

    // Appended: the waiting node gets its range from it.
    let t = Instant::now();
    config.swap(&[(POOL, "10.94.0.0/24 10.95.0.0/24"), (MASK, "24")]);
    wait_for(
        "pl-2's range from the new CIDR",
        Duration::from_secs(20),
        || pod_cidrs(&cp, "pl-2") == "10.95.0.0/24",
    );
    eprintln!(
        "{TEST}: appended CIDR to a waiting node's range: {:?}",
        t.elapsed()
    );
    wait_for("pl-2's error cleared", Duration::from_secs(10), || {
        operator_error(&cp, "pl-2").is_empty()
    });

    // Removed while pl-1 is on it, with a /26 CIDR added: pl-1 keeps its range,
    // an Event and the status name it, and a new node gets a /26.
    let t = Instant::now();
    let drained = [(POOL, "10.95.0.0/24,10.96.0.0/24@26"), (MASK, "24")];
    config.swap(&drained);
    wait_for("the draining Event", Duration::from_secs(20), || {
        events(&cp, "pl-1", "PodCIDRDraining").contains(
            "cluster-pool-ipv4-cidr no longer lists 10.94.0.0/24: it drains; node pl-1 keeps \
             10.94.0.0/24 until it is deleted",
        )
    });
    eprintln!(
        "{TEST}: removed CIDR to the draining Event: {:?}",
        t.elapsed()
    );
    assert!(
        events(&cp, "pl-1", "PodCIDRDraining").contains("(still on it: pl-1)"),
        "{}",
        events(&cp, "pl-1", "PodCIDRDraining")
    );
    assert_eq!(pod_cidrs(&cp, "pl-1"), "10.94.0.0/24");
    assert_eq!(operator_error(&cp, "pl-1"), "");
    let (code, out, err) = operator_status(&cp, &sa, &["--config-dir", &dir]);
    eprintln!("{TEST}: podnet operator status:\n{out}");
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "Draining:   pl-1 holds 10.94.0.0/24, in no pool CIDR of cluster-pool-ipv4-cidr: a \
             removed pool CIDR drains; no new node range comes from it, and its removal \
             completes when the node is deleted\n"
        ),
        "{out}"
    );
    assert!(
        out.contains("Pool IPv4:  10.95.0.0/24 in /24s: 1 total, 1 in use, 0 free\n")
            && out.contains("Pool IPv4:  10.96.0.0/24 in /26s: 4 total, 0 in use, 4 free\n"),
        "{out}"
    );
    create_node(&cp, "pl-3");
    wait_for("pl-3's /26", Duration::from_secs(20), || {
        pod_cidrs(&cp, "pl-3") == "10.96.0.0/26"
    });

    // The drained CIDR again with another mask size, first in the list (the
    // order pools are tried in): refused while pl-1 is on it (the pool in
    // force stays), taken once pl-1 is deleted.
    config.swap(&[
        (POOL, "10.94.0.0/24@28 10.95.0.0/24 10.96.0.0/24@26"),
        (MASK, "24"),
    ]);
    wait_for("the refusal", Duration::from_secs(20), || {
        op.metric("podnet_operator_pool_definitions_refused") == Some(1.0)
    });
    assert!(
        op.log().contains(
            "cluster-pool-ipv4-cidr entry 10.94.0.0/24@28 overlaps 10.94.0.0/24 (/24 node \
             ranges), which is draining"
        ),
        "{}",
        op.log()
    );
    let t = Instant::now();
    cp.kubectl(&["delete", "ciliumnode", "pl-1"])
        .expect_ok("delete pl-1");
    wait_for("the removal to complete", Duration::from_secs(20), || {
        op.log().contains("its removal is complete")
    });
    eprintln!(
        "{TEST}: last node deleted to the removal complete: {:?}",
        t.elapsed()
    );
    wait_for("the refused pool taken", Duration::from_secs(10), || {
        op.metric("podnet_operator_pool_definitions_refused") == Some(0.0)
    });
    create_node(&cp, "pl-4");
    wait_for(
        "pl-4's /28 of the CIDR added again",
        Duration::from_secs(20),
        || pod_cidrs(&cp, "pl-4") == "10.94.0.0/28",
    );
    let (code, out, err) = operator_status(&cp, &sa, &["--config-dir", &dir]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("Draining:"), "{out}");
    // One process, which read the CiliumNodes once: no restart, no relist.
    assert!(!op.exited(), "{}", op.log());
    assert_eq!(
        op.log()
            .matches("read every CiliumNode and re-adopted their CIDRs")
            .count(),
        1,
        "{}",
        op.log()
    );
    drop(op);
}

fn lease_record(cp: &ControlPlane) -> String {
    let out = cp
        .kubectl(&[
            "-n",
            "kube-system",
            "get",
            "lease",
            "podnet-operator-resource-lock",
            "-o",
            "jsonpath={.metadata.annotations.podnet\\.io/cluster-pool-in-force}",
        ])
        .stdout;
    out.trim().to_string()
}

#[test]
fn restarts_after_a_refused_or_malformed_edit_never_hand_out_a_range_twice() {
    const TEST: &str = "pool_restart";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    let mut config = ConfigMapDir::new(
        cp.dir().join("operator-config"),
        &[(POOL, "10.97.0.0/21"), (MASK, "24")],
    );
    let dir = config.path().display().to_string();
    let args = ["--config-dir", dir.as_str()];
    let mut op = Operator::start(&cp, "op-r1", &sa, 9985, &args);
    for (node, cidr) in [("pr-1", "10.97.0.0/24"), ("pr-2", "10.97.1.0/24")] {
        create_node(&cp, node);
        wait_for(node, Duration::from_secs(20), || {
            pod_cidrs(&cp, node) == cidr
        });
    }
    wait_for(
        "the pool in force on the Lease",
        Duration::from_secs(20),
        || lease_record(&cp).contains("\"cluster-pool-ipv4-cidr\":\"10.97.0.0/21\""),
    );

    // The mask size changed: refused while the leader runs, and after a rollout.
    config.swap(&[(POOL, "10.97.0.0/21"), (MASK, "26")]);
    wait_for("the refusal", Duration::from_secs(20), || {
        op.metric("podnet_operator_pool_definitions_refused") == Some(1.0)
    });
    op.stop();
    let mut op = Operator::start(&cp, "op-r2", &sa, 9985, &args);
    create_node(&cp, "pr-3");
    wait_for(
        "pr-3's /24 of the pool in force",
        Duration::from_secs(30),
        || pod_cidrs(&cp, "pr-3") == "10.97.2.0/24",
    );
    wait_for(
        "the refusal after the restart",
        Duration::from_secs(20),
        || op.metric("podnet_operator_pool_definitions_refused") == Some(1.0),
    );
    assert!(
        op.log().contains("leading with the cluster pool in force"),
        "{}",
        op.log()
    );

    // A typo: the running leader refuses it, counted; a restarted replica starts,
    // leads with the pool in force and serves a new node.
    config.swap(&[(POOL, "10.97.0.0/21 10.250.0.0/16@x"), (MASK, "24")]);
    wait_for(
        "the malformed entry refused",
        Duration::from_secs(20),
        || {
            op.log().contains("10.250.0.0/16@x")
                && op.metric("podnet_operator_pool_definitions_refused") == Some(1.0)
        },
    );
    op.stop();
    let mut op = Operator::start(&cp, "op-r3", &sa, 9985, &args);
    create_node(&cp, "pr-4");
    wait_for(
        "pr-4's /24 of the pool in force",
        Duration::from_secs(30),
        || pod_cidrs(&cp, "pr-4") == "10.97.3.0/24",
    );
    assert!(!op.exited(), "{}", op.log());
    wait_for("the typo counted", Duration::from_secs(20), || {
        op.metric("podnet_operator_pool_definitions_refused") == Some(1.0)
    });
    let (code, out, err) = operator_status(&cp, &sa, &args);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("In force:   {\"cluster-pool-ipv4-cidr\":\"10.97.0.0/21\"")
            && out.contains(
                "Options:    refused: invalid cluster-pool-ipv4-cidr entry \"10.250.0.0/16@x\""
            )
            && out.contains("Pool IPv4:  10.97.0.0/21 in /24s: 8 total, 4 in use, 4 free\n"),
        "{out}"
    );

    // No record (an operator before this one wrote none) and a mask size that
    // changed meanwhile: the /24s are held apart, the new node's /26 is outside
    // every one of them.
    op.stop();
    cp.kubectl(&[
        "-n",
        "kube-system",
        "annotate",
        "lease",
        "podnet-operator-resource-lock",
        "podnet.io/cluster-pool-in-force-",
    ])
    .expect_ok("remove the record");
    config.swap(&[(POOL, "10.97.0.0/21"), (MASK, "26")]);
    let mut op = Operator::start(&cp, "op-r4", &sa, 9985, &args);
    create_node(&cp, "pr-5");
    wait_for("pr-5's /26", Duration::from_secs(30), || {
        pod_cidrs(&cp, "pr-5") == "10.97.4.0/26"
    });
    wait_for("the held-apart Event", Duration::from_secs(20), || {
        events(&cp, "pr-2", "PodCIDRDraining").contains(
            "node pr-2 holds 10.97.1.0/24, inside pool CIDR 10.97.0.0/21 whose node ranges \
             are /26",
        )
    });
    for (node, cidr) in [
        ("pr-1", "10.97.0.0/24"),
        ("pr-2", "10.97.1.0/24"),
        ("pr-3", "10.97.2.0/24"),
        ("pr-4", "10.97.3.0/24"),
    ] {
        assert_eq!(pod_cidrs(&cp, node), cidr);
        assert_eq!(operator_error(&cp, node), "", "{node}");
    }
    assert!(!op.exited(), "{}", op.log());
    drop(op);
}
