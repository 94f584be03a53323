//! Least privilege on the node (docs/least-privilege.md): the daemon's capability
//! check at start (a daemon whose bounding set lacks a capability it needs fails
//! naming it) and what it needs (with CAP_NET_ADMIN alone it serves pods).

use std::fs::File;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::harness::*;

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
/// How long a daemon that must fail at start may take.
const START_FAILS_WITHIN: Duration = Duration::from_secs(20);

/// The highest capability number this kernel knows.
fn cap_last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .expect("reading cap_last_cap")
        .trim()
        .parse()
        .expect("cap_last_cap is a number")
}

/// `podnet daemon` (socket and state in `node`'s dir, then `args`) in `node`'s
/// network namespace, as root with the capabilities `drop` taken out of its
/// bounding set: the child enters the namespace (CAP_SYS_ADMIN, still held),
/// drops them (PR_CAPBSET_DROP), and root's execve then gives it the bounding
/// set as its effective set, as a container runtime does with
/// securityContext.capabilities.
fn daemon_without(node: &Node, drop: &[u32], args: &[&str]) -> Command {
    let drop = drop.to_vec();
    let mut cmd = Command::new(podnet_bin());
    cmd.arg("daemon")
        .arg("--socket")
        .arg(node.socket())
        .arg("--state-dir")
        .arg(node.state_dir())
        .args(args)
        .stdin(Stdio::null());
    // After the setns: prctl, async-signal-safe; `drop` was allocated before
    // the fork and is only read.
    exec_in_netns(&mut cmd, &node.ns, move || {
        for cap in &drop {
            // SAFETY: prctl with plain integers.
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, *cap as libc::c_ulong, 0, 0, 0) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    });
    cmd
}

/// Runs the daemon of `node` with `args` and the capabilities `drop` taken out,
/// which must fail at start (exit code 1, within START_FAILS_WITHIN, no socket
/// made); returns its stderr. A daemon still running then is killed by PID.
fn start_fails(node: &Node, drop: &[u32], args: &[&str]) -> String {
    let mut child = daemon_without(node, drop, args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning the daemon");
    let deadline = Instant::now() + START_FAILS_WITHIN;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the daemon") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
            panic!("the daemon still ran after {START_FAILS_WITHIN:?}: it must fail at start");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut pipe, &mut err);
    }
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(!node.socket().exists(), "the daemon made its socket first");
    err
}

/// A daemon without CAP_NET_ADMIN fails at once, naming the capability, what it is
/// for and where to add it, before it creates anything (no socket, no router
/// device); asked for netkit without CAP_SYS_ADMIN it names that one.
#[test]
fn daemon_without_a_needed_capability_fails_at_start_naming_it() {
    if !root_or_skip("daemon_without_a_needed_capability_fails_at_start_naming_it") {
        return;
    }
    let node = Node::new(&DUAL_STACK);
    let err = start_fails(&node, &[CAP_NET_ADMIN], &DUAL_STACK);
    assert!(
        err.contains(
            "podnet daemon: missing capability CAP_NET_ADMIN (needed to create the router device"
        ) && err.contains("add it to the container's securityContext.capabilities.add"),
        "{err}"
    );
    assert!(!err.contains("CAP_SYS_ADMIN"), "{err}");
    let link = node.ns.exec(&["ip", "link", "show", "podnet_host"]);
    assert!(!link.status.success(), "the daemon made its router device");

    let mut netkit = DUAL_STACK.to_vec();
    netkit.extend(["--datapath-mode", "netkit"]);
    let err = start_fails(&node, &[CAP_SYS_ADMIN], &netkit);
    assert!(
        err.contains("podnet daemon: missing capability CAP_SYS_ADMIN (needed to check at start, in a private network namespace, that the kernel has netkit"),
        "{err}"
    );
}

/// With CAP_NET_ADMIN as its only capability (deploy/podnet.yaml's agent), the
/// daemon starts, sets up its router device and forwarding, and serves a pod that
/// reaches another.
#[test]
fn daemon_with_only_net_admin_serves_pods() {
    if !root_or_skip("daemon_with_only_net_admin_serves_pods") {
        return;
    }
    let mut node = Node::new(&DUAL_STACK);
    let all_but_net_admin: Vec<u32> = (0..=cap_last_cap())
        .filter(|c| *c != CAP_NET_ADMIN)
        .collect();
    let log = File::create(node.dir.join("daemon.log")).expect("daemon log");
    let child = daemon_without(&node, &all_but_net_admin, &DUAL_STACK)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawning the daemon");
    let pid = child.id();
    node.daemon = Some(child);
    node.wait_ready();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("daemon status");
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).expect("CapEff hex"));
    assert_eq!(eff, Some(1 << CAP_NET_ADMIN), "{status}");
    let forward = node.ns.exec(&["cat", "/proc/sys/net/ipv4/ip_forward"]);
    assert_eq!(String::from_utf8_lossy(&forward.stdout).trim(), "1");
    let (a, b) = (node.sandbox(), node.sandbox());
    let (ra, rb) = (node.add(&a), node.add(&b));
    assert!(
        a.ping(&rb.ipv4()) && b.ping(&ra.ipv6()),
        "pods must reach each other"
    );
    node.del(&a);
    node.del(&b);
}
