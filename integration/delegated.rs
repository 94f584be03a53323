//! delegated-plugin mode against the real `host-local` from Debian's
//! containernetworking-plugins: addresses from its range, its state files created
//! and removed, its failures surfaced with its own code, nothing left behind.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::harness::*;

const HOST_LOCAL_DIR: &str = "/usr/lib/cni";

fn conf(node: &Node, ipam_type: &str, data_dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "deleg",
        "type": "podnet",
        "socket-path": node.socket(),
        "ipam": {"type": ipam_type, "ranges": [[{"subnet": "10.98.0.0/24"}]], "dataDir": data_dir},
    })
    .to_string()
}

fn state_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir.join("deleg"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.starts_with("10.98."))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn delegated_plugin_mode_with_host_local() {
    if !root_or_skip("delegated") {
        return;
    }
    if !Path::new(HOST_LOCAL_DIR).join("host-local").exists() {
        skip(
            "delegated_plugin_mode_with_host_local",
            &format!(
                "{HOST_LOCAL_DIR}/host-local is missing (scripts/setup installs containernetworking-plugins)"
            ),
        );
        return;
    }
    let node = Node::start(&["--ipam", "delegated-plugin", "--k8s-node-name", "deleg"]);
    let data = node.dir.join("host-local");
    let path = [("CNI_PATH", HOST_LOCAL_DIR)];
    let c = conf(&node, "host-local", &data);
    let (a, b) = (node.sandbox(), node.sandbox());
    let ra = node.plugin("ADD", Some(&a), &c, &path);
    let rb = node.plugin("ADD", Some(&b), &c, &path);
    assert!(
        ra.ipv4().starts_with("10.98.0.") && rb.ipv4().starts_with("10.98.0."),
        "{ra:?} {rb:?}"
    );
    assert_eq!(state_files(&data).len(), 2, "host-local's state files");
    let router = node.ipv4_addressing().ip;
    assert_eq!(router, "169.254.0.1");
    assert!(a.ping(&rb.ipv4()) && b.ping(&ra.ipv4()) && a.ping(&router));
    // The daemon holds no address of the delegate's, but knows the endpoints.
    let st = node.client().healthz().expect("healthz");
    assert!(!st.ipam.allocations.contains_key(&ra.ipv4()));
    assert!(node.client().endpoint(&a.container_id, "eth0").is_ok());
    // CHECK passes through to the delegate too.
    let mut with_prev: serde_json::Value = serde_json::from_str(&c).expect("conf");
    with_prev["prevResult"] = ra.json();
    assert!(
        node.plugin("CHECK", Some(&a), &with_prev.to_string(), &path)
            .ok
    );
    // DEL releases through the delegate, twice is fine.
    assert!(node.plugin("DEL", Some(&a), &c, &path).ok);
    assert!(node.plugin("DEL", Some(&a), &c, &path).ok);
    assert_eq!(state_files(&data).len(), 1);
    assert!(node.plugin("DEL", Some(&b), &c, &path).ok);
    assert!(state_files(&data).is_empty());
    assert!(node.host_links_gone());
}

#[test]
fn delegate_failures_are_surfaced_and_leave_nothing_behind() {
    if !root_or_skip("delegated_failures") {
        return;
    }
    let node = Node::start(&["--ipam", "delegated-plugin", "--k8s-node-name", "deleg2"]);
    let bin = node.dir.join("cni-bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let script = |name: &str, body: &str| {
        let p = bin.join(name);
        std::fs::write(&p, format!("#!/bin/sh\ncat >/dev/null\n{body}\n")).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    };
    script(
        "busy-ipam",
        r#"echo '{"cniVersion":"1.0.0","code":11,"msg":"no lease available"}'; exit 1"#,
    );
    script("garbage-ipam", "echo 'this is not json'");
    script("crashing-ipam", "kill -SEGV $$");
    let path = bin.display().to_string();
    let env = [("CNI_PATH", path.as_str())];
    let a = node.sandbox();
    let data = node.dir.join("unused");
    let r = node.plugin("ADD", Some(&a), &conf(&node, "busy-ipam", &data), &env);
    assert_eq!(r.code(), 11, "{r:?}");
    assert!(
        r.msg()
            .contains("delegated IPAM plugin busy-ipam: no lease available"),
        "{}",
        r.msg()
    );
    let r = node.plugin("ADD", Some(&a), &conf(&node, "garbage-ipam", &data), &env);
    assert_eq!(r.code(), 6, "{r:?}");
    assert!(r.msg().contains("this is not json"), "{}", r.msg());
    let r = node.plugin("ADD", Some(&a), &conf(&node, "crashing-ipam", &data), &env);
    assert_eq!(r.code(), 105, "{r:?}");
    assert!(r.msg().contains("signal"), "{}", r.msg());
    let r = node.plugin("ADD", Some(&a), &conf(&node, "nosuch-ipam", &data), &env);
    assert_eq!(r.code(), 7, "{r:?}");
    assert!(
        r.msg().contains("failed to find plugin \"nosuch-ipam\""),
        "{}",
        r.msg()
    );
    assert!(node.host_links().is_empty(), "a failed ADD left a link");
    assert!(a.ns.exec(&["ip", "link", "show", "eth0"]).status.code() != Some(0));
}
