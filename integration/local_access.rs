//! Who on the node can reach the daemon and read its state: the socket, its lock,
//! the journal, the DEL queue and the CNI log are root's alone (also when they
//! were left looser before), and a client that is not root gets 403 with the
//! reason even after the socket's mode is loosened by hand (the daemon checks
//! SO_PEERCRED), while root goes on being served.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use crate::harness::*;

/// uid and gid of `nobody`.
const NOBODY: u32 = 65534;

fn mode_and_owner(path: &Path) -> (u32, u32) {
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.mode() & 0o7777, m.uid())
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

fn conf_with_log(node: &Node, log: &Path) -> String {
    let mut conf: serde_json::Value = serde_json::from_str(&node.conf("1.1.0")).expect("conf");
    conf["log-file"] = serde_json::json!(log);
    conf.to_string()
}

#[test]
fn the_socket_journal_queue_and_cni_log_are_root_only() {
    if !root_or_skip("local_access_modes") {
        return;
    }
    let mut node = Node::new(&DUAL_STACK);
    // Left looser by an earlier run or by hand: made root's alone.
    let queue = node.dir.join("run").join("delete-queue");
    std::fs::create_dir_all(&queue).expect("queue dir");
    chmod(&node.dir.join("run"), 0o700);
    chmod(&queue, 0o755);
    let log = node.dir.join("podnet-cni.log");
    std::fs::write(&log, "").expect("log");
    chmod(&log, 0o644);
    node.start_daemon();
    let journal = node.state_dir().join("journal.redb");
    chmod(&journal, 0o644);
    node.restart_daemon();

    let conf = conf_with_log(&node, &log);
    let a = node.sandbox();
    let r = node.plugin("ADD", Some(&a), &conf, &[]);
    assert!(r.ok, "{r:?}");
    let lock = node.dir.join("run").join("podnet.sock.lock");
    for (path, mode) in [
        (node.dir.join("run"), 0o700),
        (node.socket(), 0o600),
        (lock, 0o600),
        (node.state_dir(), 0o700),
        (journal.clone(), 0o600),
        (queue.clone(), 0o700),
        (queue.join("lockfile"), 0o600),
        (log.clone(), 0o600),
    ] {
        assert_eq!(mode_and_owner(&path), (mode, 0), "{}", path.display());
    }
    // A DEL while the daemon is down is queued, root's alone too.
    node.stop_daemon(false);
    let d = node.plugin("DEL", Some(&a), &conf, &[]);
    assert!(d.ok, "{d:?}");
    let entries: Vec<_> = std::fs::read_dir(&queue)
        .expect("queue")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "delete"))
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(mode_and_owner(&entries[0]), (0o600, 0));
    node.start_daemon();
}

#[test]
fn a_client_that_is_not_root_gets_403_even_through_a_loosened_socket() {
    if !root_or_skip("local_access_peer") {
        return;
    }
    let node = Node::dual_stack();
    // Loosened by hand: anyone may now connect.
    chmod(&node.dir, 0o755);
    chmod(&node.dir.join("run"), 0o755);
    chmod(&node.socket(), 0o666);
    let as_nobody = |cmd: &mut Command| {
        // The copy of the binary below may still be open for writing in a child
        // another test thread forked and has not exec'd yet: exec then fails with
        // ETXTBSY until that child execs.
        let mut tries = 0;
        let out = loop {
            match cmd.uid(NOBODY).gid(NOBODY).output() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                out => break out.expect("run as nobody"),
            }
        };
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (_, out, err) = as_nobody(
        Command::new("curl")
            .args(["-sS", "-w", "\n%{http_code}", "--unix-socket"])
            .arg(node.socket())
            .arg("http://localhost/v1/healthz"),
    );
    assert!(out.ends_with("\n403"), "{out}{err}");
    assert!(
        out.contains("serves root only") && out.contains(&format!("uid {NOBODY}")),
        "{out}"
    );
    // The test binary's own folder may be closed to others (a checkout under a
    // 0700 directory): nobody runs a copy next to the socket.
    let bin = node.dir.join("podnet-as-nobody");
    std::fs::copy(podnet_bin(), &bin).expect("copy the podnet binary");
    chmod(&bin, 0o755);
    let (ok, _, err) = as_nobody(
        Command::new(&bin)
            .args(["status", "--socket"])
            .arg(node.socket()),
    );
    assert!(!ok, "podnet status as nobody succeeded");
    assert!(
        err.contains("podnet's API serves root only, and this client is uid 65534"),
        "{err}"
    );
    assert!(
        node.log()
            .contains("refused an API client that is not root"),
        "{}",
        node.log()
    );
    // Root is still served.
    assert!(node.client().healthz().is_ok());
}
