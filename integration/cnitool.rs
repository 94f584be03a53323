//! Conformance through a real CNI runtime library: the reference `cnitool` (libcni
//! v1.3.0) drives the podnet binary through a conflist, the way a container runtime
//! does: add, check, status, gc, del. `PODNET_CNI_CLIENT` names the client
//! (`make test` sets it to what scripts/setup built). When the Go module proxy was
//! unreachable, scripts/setup builds `cnidriver` (integration/cnidriver, Debian's
//! libcni 1.1.2) instead: then add/check/del run at spec 1.0.0 and status/gc are
//! skipped (libcni 1.1.2 has neither).
//!
//! What `cnitool gc` does (libcni v1.3.0 `GCNetworkList` with nil args): it first
//! issues a CNI DEL for every attachment of the network in libcni's result cache
//! (none is "valid", as no list is given), then sends GC to each plugin *without*
//! `cni.dev/valid-attachments`. So the cnitool-made attachment is released by that
//! DEL, while an attachment libcni does not know about must survive the plugin GC:
//! a missing list must release nothing.
//!
//! cnitool has no way to set libcni's cache dir (it always uses /var/lib/cni), so
//! the test removes the cache file of its own container ID when it ends; the
//! driver takes `CNI_CACHE_DIR` and uses a temp dir.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha512};

use crate::harness::*;

const NETWORK: &str = "podnet-cnitool";
/// libcni's default cache dir, which cnitool always uses.
const LIBCNI_CACHE: &str = "/var/lib/cni";

#[derive(Clone, Copy, PartialEq, Debug)]
enum ClientKind {
    /// cnitool v1.3.0 (libcni 1.3, spec up to 1.1.0).
    Cnitool,
    /// integration/cnidriver on Debian's libcni 1.1.2 (spec up to 1.0.0).
    Driver,
}

/// The client to use, or None when the test is to be skipped.
fn client_or_skip(test: &str) -> Option<(PathBuf, ClientKind)> {
    let why = match std::env::var_os("PODNET_CNI_CLIENT") {
        None => "PODNET_CNI_CLIENT is not set (make test sets it; run scripts/setup)".to_string(),
        Some(p) if !Path::new(&p).is_file() => {
            format!(
                "PODNET_CNI_CLIENT={} does not exist (run scripts/setup)",
                Path::new(&p).display()
            )
        }
        Some(p) => {
            let path = PathBuf::from(p);
            let kind = if path.file_name().is_some_and(|n| n == "cnidriver") {
                ClientKind::Driver
            } else {
                ClientKind::Cnitool
            };
            return Some((path, kind));
        }
    };
    skip(test, &why);
    None
}

/// The container ID cnitool (and the driver) derive from the netns path.
fn cnitool_container_id(netns: &str) -> String {
    let abs = Path::new(netns);
    let sum = Sha512::digest(abs.as_os_str().as_encoded_bytes());
    let hex: String = sum[..10].iter().map(|b| format!("{b:02x}")).collect();
    format!("cnitool-{hex}")
}

/// Temp dirs (conflist, CNI_PATH, driver cache) and libcni's cache file of this
/// test's container, removed on drop (also when an assertion fails).
struct Scratch {
    dir: PathBuf,
    cache_file: PathBuf,
    /// /var/lib/cni did not exist before: remove it again if it is left empty.
    made_cache_root: bool,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.cache_file);
        let _ = std::fs::remove_dir_all(&self.dir);
        if self.made_cache_root {
            // remove_dir only removes empty directories.
            let _ = std::fs::remove_dir(Path::new(LIBCNI_CACHE).join("results"));
            let _ = std::fs::remove_dir(LIBCNI_CACHE);
        }
    }
}

struct Client<'a> {
    node: &'a Node,
    bin: PathBuf,
    kind: ClientKind,
    netconfpath: PathBuf,
    cni_path: PathBuf,
    cache_dir: PathBuf,
}

impl Client<'_> {
    /// Runs `<client> <verb> podnet-cnitool <netns>` in the node namespace.
    fn run(&self, verb: &str, sb: &Sandbox) -> PluginOutput {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.node.ns.name])
            .arg(&self.bin)
            .args([verb, NETWORK, &sb.ns.path()]);
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("NETCONFPATH", &self.netconfpath)
            .env("CNI_PATH", &self.cni_path)
            .env("CNI_IFNAME", &sb.ifname)
            .env("CNI_ARGS", sb.cni_args());
        if self.kind == ClientKind::Driver {
            cmd.env("CNI_CACHE_DIR", &self.cache_dir);
        }
        let out = plugin_run(cmd, "");
        eprintln!(
            "cnitool {verb}: ok={} stdout={} stderr={}",
            out.ok,
            out.stdout,
            out.stderr.trim()
        );
        out
    }

    fn must(&self, verb: &str, sb: &Sandbox) -> PluginOutput {
        let out = self.run(verb, sb);
        assert!(
            out.ok,
            "{verb} failed: {out:?}\ndaemon log:\n{}",
            self.node.log()
        );
        out
    }
}

/// Asserts an ADD result (as the client printed it) is a dual-stack attachment of
/// `sb` from the node's ranges; returns its (IPv4, IPv6).
fn check_add_result(
    node: &Node,
    sb: &Sandbox,
    out: &PluginOutput,
    version: &str,
) -> (String, String) {
    let res = out.json();
    assert_eq!(res["cniVersion"], version, "{res}");
    let cfg = node.client().config().expect("config").status;
    let v4range: ipnet::IpNet = cfg
        .addressing
        .ipv4
        .expect("ipv4 addressing")
        .alloc_range
        .parse()
        .expect("v4 range");
    let v6range: ipnet::IpNet = cfg
        .addressing
        .ipv6
        .expect("ipv6 addressing")
        .alloc_range
        .parse()
        .expect("v6 range");
    let (v4, v6) = (out.ipv4(), out.ipv6());
    assert!(
        v4range.contains(&v4.parse::<std::net::IpAddr>().expect("v4")),
        "{v4} not in {v4range}"
    );
    assert!(
        v6range.contains(&v6.parse::<std::net::IpAddr>().expect("v6")),
        "{v6} not in {v6range}"
    );
    let idx = res["ips"][0]["interface"]
        .as_u64()
        .expect("ips[0].interface") as usize;
    let iface = &res["interfaces"][idx];
    assert_eq!(iface["name"], sb.ifname.as_str(), "{res}");
    assert_eq!(iface["sandbox"], sb.ns.path(), "{res}");
    (v4, v6)
}

/// The host-side link named in an ADD result.
fn host_link(res: &Value) -> String {
    res["interfaces"]
        .as_array()
        .expect("interfaces")
        .iter()
        .find(|i| i.get("sandbox").is_none())
        .and_then(|i| i["name"].as_str())
        .expect("host interface in result")
        .to_string()
}

#[test]
fn cnitool_conformance() {
    const TEST: &str = "cnitool_conformance";
    if !root_or_skip(TEST) {
        return;
    }
    let Some((bin, kind)) = client_or_skip(TEST) else {
        return;
    };
    let version = match kind {
        ClientKind::Cnitool => "1.1.0",
        ClientKind::Driver => "1.0.0",
    };

    let node = Node::dual_stack();
    let sb = node.sandbox();
    let other = node.sandbox();

    let dir = std::env::temp_dir().join(format!("podnet-cnitool-{}", sb.ns.name));
    let scratch = Scratch {
        cache_file: Path::new(LIBCNI_CACHE).join("results").join(format!(
            "{NETWORK}-{}-{}",
            cnitool_container_id(&sb.ns.path()),
            sb.ifname
        )),
        made_cache_root: kind == ClientKind::Cnitool && !Path::new(LIBCNI_CACHE).exists(),
        dir,
    };
    let client = Client {
        node: &node,
        bin,
        kind,
        netconfpath: scratch.dir.join("net.d"),
        cni_path: scratch.dir.join("bin"),
        cache_dir: scratch.dir.join("cache"),
    };
    std::fs::create_dir_all(&client.netconfpath).expect("net.d");
    std::fs::create_dir_all(&client.cni_path).expect("bin dir");
    std::os::unix::fs::symlink(podnet_bin(), client.cni_path.join("podnet")).expect("symlink");
    let versions: Vec<&str> = if version == "1.1.0" {
        vec!["1.0.0", "1.1.0"]
    } else {
        vec!["1.0.0"]
    };
    let conflist = serde_json::json!({
        "cniVersion": version,
        "cniVersions": versions,
        "name": NETWORK,
        "plugins": [{"type": "podnet", "socket-path": node.socket()}],
    });
    std::fs::write(
        client.netconfpath.join("10-podnet-cnitool.conflist"),
        serde_json::to_string_pretty(&conflist).expect("conflist"),
    )
    .expect("writing the conflist");

    // ADD through libcni: result printed at the list's version, cached by libcni.
    let added = client.must("add", &sb);
    let (mut v4, mut v6) = check_add_result(&node, &sb, &added, version);
    let allocs = node.allocations();
    assert!(
        allocs.contains_key(&v4) && allocs.contains_key(&v6),
        "{v4}/{v6} not allocated: {allocs:?}"
    );
    let link = host_link(&added.json());
    assert_eq!(node.host_links(), vec![link.clone()]);

    // CHECK: libcni hands the cached result to the plugin as prevResult.
    client.must("check", &sb);

    if kind == ClientKind::Cnitool {
        // STATUS: the plugin reports the daemon ready.
        client.must("status", &sb);

        // An attachment libcni has not cached (made by the plugin directly).
        let direct = node.add(&other);
        assert!(direct.ok, "direct ADD: {direct:?}");
        let (o4, o6) = (direct.ipv4(), direct.ipv6());
        let other_link = host_link(&direct.json());

        // GC with no valid-attachments: libcni DELs the cached attachment, and the
        // plugin's GC (no list) releases nothing else.
        client.must("gc", &sb);
        let allocs = node.allocations();
        assert!(
            !allocs.contains_key(&v4) && !allocs.contains_key(&v6),
            "the cached attachment survived cnitool gc: {allocs:?}"
        );
        assert!(
            allocs.contains_key(&o4) && allocs.contains_key(&o6),
            "plugin GC without cni.dev/valid-attachments released {o4}/{o6}: {allocs:?}\ndaemon log:\n{}",
            node.log()
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while node.host_links() != vec![other_link.clone()] && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(node.host_links(), vec![other_link]);
        assert!(
            !scratch.cache_file.exists(),
            "libcni kept {} after gc",
            scratch.cache_file.display()
        );

        let del = node.del(&other);
        assert!(del.ok, "direct DEL: {del:?}");
        assert!(
            node.host_links_gone(),
            "links left: {:?}",
            node.host_links()
        );

        // Attach again for the DEL below.
        let again = client.must("add", &sb);
        (v4, v6) = check_add_result(&node, &sb, &again, version);
        client.must("check", &sb);
    } else {
        skip(
            &format!("{TEST} (status and gc)"),
            "the fallback client (Debian's libcni 1.1.2) speaks CNI 1.0.0, which has neither",
        );
    }

    // DEL through libcni: everything is released and the cache entry goes.
    let before = node.allocations();
    assert!(
        before.contains_key(&v4) && before.contains_key(&v6),
        "{v4}/{v6} not allocated before del: {before:?}"
    );
    client.must("del", &sb);
    let after = node.allocations();
    for ip in [&v4, &v6] {
        assert!(
            !after.contains_key(ip),
            "{ip} still allocated after del: {after:?}"
        );
    }
    assert!(
        node.host_links_gone(),
        "links left after del: {:?}",
        node.host_links()
    );
    if kind == ClientKind::Cnitool {
        assert!(
            !scratch.cache_file.exists(),
            "libcni kept {} after del",
            scratch.cache_file.display()
        );
    }

    // DEL again is fine (idempotent).
    client.must("del", &sb);
}
