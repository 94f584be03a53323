//! A real Kubernetes cluster that a script of `scripts/` runs (`scripts/node`: one
//! node, `scripts/cluster`: a control plane and several nodes): kubectl as the
//! admin through the script, polling with a deadline, the pods and events to show
//! when a wait fails, and what podnet's agent says it allocated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{root_or_skip, skip};
use crate::k8s::bin_dir;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `*.oci.tar` images the nodes import: `make image`'s, or those of the dir
/// `PODNET_NODE_IMAGES` names.
pub fn images_dir() -> PathBuf {
    match std::env::var_os("PODNET_NODE_IMAGES") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => repo().join("target/image"),
    }
}

/// True when the test can run a script's nodes: root, the kubelet, the control
/// plane and `more` of scripts/k8s-binaries, containerd and runc, the images of
/// `make image`; otherwise reports `test` skipped (a failure unless skips are allowed: harness::skip).
pub fn node_parts_or_skip(test: &str, more: &[&str]) -> bool {
    if !root_or_skip(test) {
        return false;
    }
    let bin = bin_dir();
    let binaries = [
        "kubelet",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
    ];
    let missing = binaries
        .iter()
        .chain(more)
        .map(|b| (bin.join(b), "scripts/k8s-binaries builds it"))
        .chain(
            ["/usr/bin/containerd", "/usr/sbin/runc"]
                .map(|t| (PathBuf::from(t), "scripts/setup installs it")),
        )
        .chain(
            ["podnet", "pause", "busybox"]
                .map(|i| (images_dir().join(format!("{i}.oci.tar")), "make image")),
        )
        .find(|(path, _)| !path.exists());
    match missing {
        Some((path, fix)) => {
            skip(test, &format!("{} is missing ({fix})", path.display()));
            false
        }
        None => true,
    }
}

pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// A cluster run by a script: `command()` is the script with the environment that
/// names this cluster; everything else goes through its `kubectl` subcommand.
pub trait Scripted {
    /// How long a wait lasts before it fails.
    const WAIT: Duration;

    /// The script, with the environment naming this cluster's state.
    fn command(&self) -> Command;

    /// The cluster's state dir (its logs in `logs/`).
    fn dir(&self) -> &Path;

    /// The file in which the script names the state dir of the cluster running on
    /// this machine (one at a time).
    const MARKER: &'static str;

    /// The end of the logs that explain a failed wait (the kubelets').
    fn log_tail(&self) -> String;

    /// The script's `stop` (for `Drop`): the state dir is removed, or kept with
    /// its logs when the test failed. A cluster another run started (this test's
    /// start was refused) is left alone: `stop` would end whatever the marker names.
    fn tear_down(&self) {
        let running = std::fs::read_to_string(Self::MARKER).ok();
        match running.as_deref().map(str::trim) {
            Some(other) if Path::new(other) != self.dir() => {
                eprintln!("{other} (another run's) is running: not stopped");
            }
            _ => {
                let out = self.script(&["stop"]);
                if !out.status.success() {
                    eprintln!("stop failed:\n{}", text(&out));
                }
            }
        }
        if std::thread::panicking() {
            eprintln!("logs kept in {}", self.dir().join("logs").display());
        } else {
            let _ = std::fs::remove_dir_all(self.dir());
        }
    }

    fn script(&self, args: &[&str]) -> Output {
        self.command()
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running the cluster script {args:?}: {e}"))
    }

    /// The script with `args`; panics with its output if it fails.
    fn script_ok(&self, args: &[&str]) -> Output {
        let out = self.script(args);
        assert!(out.status.success(), "scripts/{:?}:\n{}", args, text(&out));
        out
    }

    /// kubectl as the admin; panics with its output if it fails.
    fn kubectl(&self, args: &[&str]) -> String {
        let mut all = vec!["kubectl"];
        all.extend_from_slice(args);
        let out = self.script(&all);
        assert!(out.status.success(), "kubectl {args:?}:\n{}", text(&out));
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    fn kubectl_json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let out = self.kubectl(&all);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}: {out}"))
    }

    /// `kubectl apply -f -` of `manifest`.
    fn apply(&self, manifest: &str) {
        use std::io::Write;
        let mut child = self
            .command()
            .args(["kubectl", "apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running kubectl apply through the cluster script");
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(manifest.as_bytes())
                .expect("writing to kubectl");
        }
        let out = child.wait_with_output().expect("kubectl apply");
        assert!(out.status.success(), "kubectl apply:\n{}", text(&out));
    }

    /// Polls `f` until it gives `Some`; panics after `WAIT` naming `what` and the
    /// last state `state()` describes.
    fn wait_for<T>(
        &self,
        what: &str,
        mut f: impl FnMut() -> Option<T>,
        state: impl Fn() -> String,
    ) -> T {
        let deadline = Instant::now() + Self::WAIT;
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {:?}; {}",
                Self::WAIT,
                state()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn pods(&self, namespace: &str, selector: &str) -> Vec<Value> {
        self.kubectl_json(&["get", "pods", "-n", namespace, "-l", selector])["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// What kubectl shows of the pods and their recent events, and the logs'
    /// ends, for failures.
    fn describe(&self, namespace: &str) -> String {
        let mut all = vec!["kubectl", "get", "pods", "-o", "wide", "-n", namespace];
        let pods = text(&self.script(&all));
        all = vec!["kubectl", "get", "events", "-n", namespace];
        let events = text(&self.script(&all));
        format!("pods:\n{pods}\nevents:\n{events}\n{}", self.log_tail())
    }

    /// `from` (a busybox pod of `namespace`) pings `to` once; panics if it fails.
    fn ping(&self, namespace: &str, from: &str, to: &str) {
        let mut args = vec!["kubectl", "exec", "-n", namespace, from, "--"];
        args.extend(["/bin/busybox", "ping", "-c", "1", "-W", "2", to]);
        let out = self.script(&args);
        assert!(
            out.status.success(),
            "{from} cannot ping {to}:\n{}",
            text(&out)
        );
    }

    /// `podnet <verb> --socket ... <args>` in the agent's container of `agent` (a
    /// pod of kube-system, or `ds/podnet`), through `kubectl exec`.
    fn podnet_in_agent(&self, agent: &str, verb: &str, args: &[&str]) -> Output {
        self.podnet_in_agent_command(agent, verb, args)
            .output()
            .unwrap_or_else(|e| panic!("kubectl exec podnet {verb} in {agent}: {e}"))
    }

    /// The command [`Self::podnet_in_agent`] runs, to spawn (a stream).
    fn podnet_in_agent_command(&self, agent: &str, verb: &str, args: &[&str]) -> Command {
        let mut command = self.command();
        command
            .args(["kubectl", "exec", "-n", "kube-system", agent, "-c", "agent"])
            .args(["--", "/usr/local/bin/podnet", verb])
            .args(["--socket", "/run/podnet/podnet.sock"])
            .args(args);
        command
    }

    /// `podnet status` with `args` in the agent's container of `agent` (a pod of
    /// kube-system, or `ds/podnet`); panics if it fails.
    fn podnet_status(&self, agent: &str, args: &[&str]) -> String {
        let out = self.podnet_in_agent(agent, "status", args);
        assert!(
            out.status.success(),
            "podnet status {args:?} in {agent}:\n{}",
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// `podnet status --all-addresses` in the agent's container of `agent` (a pod
    /// of kube-system, or `ds/podnet`): address → owner (without markers such as
    /// `[restored]`; cooling addresses are left out).
    fn allocated(&self, agent: &str) -> BTreeMap<String, String> {
        let out = self.podnet_status(agent, &["--all-addresses"]);
        out.lines()
            .skip_while(|l| !l.starts_with("Allocated addresses:"))
            .skip(1)
            .filter_map(|l| {
                let (ip, owner) = l.trim().split_once(' ')?;
                let owner = owner.strip_prefix('(')?.strip_suffix(')')?;
                let owner = owner.split(" [").next().unwrap_or(owner);
                Some((ip.to_string(), owner.to_string()))
            })
            .collect()
    }
}

/// A log's last `n` lines, newest first (nothing if it cannot be read).
pub fn log_end(path: &Path, n: usize) -> String {
    std::fs::read_to_string(path)
        .map(|t| t.lines().rev().take(n).collect::<Vec<_>>().join("\n"))
        .unwrap_or_default()
}
