//! The test harness: a `Node` (private netns + temp dir + the real daemon), its
//! `Sandbox`es (pod netns), and `plugin()` to run the real plugin binary in the
//! node namespace with CNI variables. Everything is removed on drop.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The podnet binary under test: cargo's build of this crate, or the binary
/// `PODNET_TEST_BIN` names (`make test-release` runs the suite against the static
/// release build that gets installed).
pub fn podnet_bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| match std::env::var("PODNET_TEST_BIN") {
        Ok(path) if !path.is_empty() => path,
        _ => env!("CARGO_BIN_EXE_podnet").to_string(),
    })
}

/// The rule for a test that cannot run here (src/test_skip.rs, shared with the
/// unit tests): it fails, naming what is missing, unless `PODNET_ALLOW_SKIPS=1`,
/// which records the skip for `make test`'s closing list instead.
#[path = "../src/test_skip.rs"]
mod test_skip;
pub use test_skip::skip;

/// True when running as root (the tests need it); reports a skip otherwise.
pub fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    skip(test, "needs root (network namespaces)");
    false
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A unique short name for a namespace of this test process.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

/// A named network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
    deleted: bool,
}

impl Netns {
    pub fn new(prefix: &str) -> Netns {
        let name = unique(prefix);
        let out = run(Command::new("ip").args(["netns", "add", &name]));
        assert!(
            out.status.success(),
            "ip netns add {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Netns {
            name,
            deleted: false,
        }
    }

    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// Runs a command inside the namespace.
    pub fn exec(&self, args: &[&str]) -> Output {
        run(Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args))
    }

    /// Deletes the namespace now (a test that simulates a vanished pod).
    pub fn delete(&mut self) {
        if !self.deleted {
            let _ = run(Command::new("ip").args(["netns", "del", &self.name]));
            self.deleted = true;
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.delete();
    }
}

/// A sandbox (pod) namespace with its attachment identity.
pub struct Sandbox {
    pub ns: Netns,
    pub container_id: String,
    pub ifname: String,
}

impl Sandbox {
    /// The `CNI_ARGS` a runtime gives the plugin for this sandbox's pod
    /// (`default/<netns name>`).
    pub fn cni_args(&self) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={}",
            self.ns.name
        )
    }

    /// True once the sandbox's interface is gone (waits up to 5 s).
    pub fn interface_gone(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !self
                .ns
                .exec(&["ip", "link", "show", &self.ifname])
                .status
                .success()
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The global addresses on the sandbox's interface, as the kernel has them.
    pub fn kernel_addresses(&self) -> Vec<String> {
        let out = self.ns.exec(&[
            "ip",
            "-o",
            "addr",
            "show",
            "dev",
            &self.ifname,
            "scope",
            "global",
        ]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(3))
            .map(|a| a.split('/').next().unwrap_or("").to_string())
            .collect()
    }

    /// `ping -c1` from the sandbox; true if answered.
    pub fn ping(&self, ip: &str) -> bool {
        let fam = if ip.contains(':') { "-6" } else { "-4" };
        self.ns
            .exec(&["ping", fam, "-c1", "-W2", ip])
            .status
            .success()
    }
}

/// What one plugin run gave.
#[derive(Debug)]
pub struct PluginOutput {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl PluginOutput {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("plugin stdout is not JSON ({e}): {self:?}"))
    }

    /// The CNI error code of a failed run.
    pub fn code(&self) -> u64 {
        assert!(!self.ok, "expected failure, got success: {self:?}");
        self.json()["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("no code in {self:?}"))
    }

    pub fn msg(&self) -> String {
        self.json()["msg"].as_str().unwrap_or("").to_string()
    }

    /// The addresses of a successful ADD result, without prefix.
    pub fn ips(&self) -> Vec<String> {
        assert!(self.ok, "ADD failed: {self:?}");
        self.json()["ips"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|ip| ip["address"].as_str())
                    .map(|s| s.split('/').next().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn ipv4(&self) -> String {
        self.ips()
            .into_iter()
            .find(|i| !i.contains(':'))
            .expect("no IPv4 in result")
    }

    pub fn ipv6(&self) -> String {
        self.ips()
            .into_iter()
            .find(|i| i.contains(':'))
            .expect("no IPv6 in result")
    }
}

/// The daemon options of the usual dual-stack node.
pub const DUAL_STACK: [&str; 7] = [
    "--enable-ipv6",
    "--cluster-pool-ipv4-cidr",
    "10.20.0.0/16",
    "--cluster-pool-ipv6-cidr",
    "fd00:20::/104",
    "--k8s-node-name",
    "it-node",
];

/// A node: its namespace, a temp dir with the socket and state, and the daemon.
pub struct Node {
    pub ns: Netns,
    pub dir: PathBuf,
    pub daemon: Option<Child>,
    pub args: Vec<String>,
    /// The podnet binary the daemon runs (None: [`podnet_bin`]), for a
    /// benchmark that runs another build beside it.
    pub bin: Option<String>,
}

impl Node {
    /// The daemon's metrics text (`GET /metrics` on its socket).
    pub fn metrics(&self) -> String {
        let r = self
            .client()
            .call("GET", "/metrics", &[], None)
            .expect("metrics");
        String::from_utf8_lossy(&r.body).to_string()
    }

    /// `podnet <args> --socket <this node's>`; its stdout (panics if it fails).
    pub fn podnet(&self, args: &[&str]) -> String {
        let out = std::process::Command::new(podnet_bin())
            .args(args)
            .arg("--socket")
            .arg(self.socket())
            .output()
            .expect("podnet");
        assert!(out.status.success(), "podnet {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// A node whose daemon runs with `args` (besides socket and state dir).
    pub fn start(args: &[&str]) -> Node {
        let mut node = Node::new(args);
        node.start_daemon();
        node
    }

    /// A node whose daemon is not started yet.
    pub fn new(args: &[&str]) -> Node {
        let ns = Netns::new("pnt-node");
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        Node::in_namespace(ns, args)
    }

    /// A node (daemon not started) in `ns`, a namespace made elsewhere, e.g. one
    /// attached to a control plane's fabric (`k8s::ControlPlane::add_node_ns`).
    /// The node owns `ns` from now on and deletes it on drop.
    pub fn in_namespace(ns: Netns, args: &[&str]) -> Node {
        let dir = std::env::temp_dir().join(format!("podnet-it-{}", ns.name));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Node {
            ns,
            dir,
            daemon: None,
            args: args.iter().map(|s| s.to_string()).collect(),
            bin: None,
        }
    }

    /// The usual dual-stack node.
    pub fn dual_stack() -> Node {
        Node::start(&DUAL_STACK)
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("run").join("podnet.sock")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// The daemon command line (socket and state dir first, then the node's args).
    pub fn daemon_command(&self, extra: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        let bin = self.bin.as_deref().unwrap_or(podnet_bin());
        cmd.args(["netns", "exec", &self.ns.name, bin, "daemon"])
            .arg("--socket")
            .arg(self.socket())
            .arg("--state-dir")
            .arg(self.state_dir())
            .args(&self.args)
            .args(extra);
        cmd
    }

    /// Starts the daemon and waits until it answers.
    pub fn start_daemon(&mut self) {
        self.spawn_daemon();
        self.wait_ready();
    }

    /// Starts the daemon without waiting for it.
    pub fn spawn_daemon(&mut self) {
        assert!(self.daemon.is_none(), "daemon already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("daemon.log"))
            .expect("daemon log");
        let child = self
            .daemon_command(&[])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawning the daemon");
        self.daemon = Some(child);
    }

    /// Waits until the daemon answers (20 s at most).
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = self.client();
        while Instant::now() < deadline {
            if client.healthz().is_ok() {
                return;
            }
            if let Some(child) = self.daemon.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "daemon exited ({status}) before it was ready; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("daemon did not become ready; log:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// Stops the daemon: SIGTERM (clean) or SIGKILL, by its PID.
    pub fn stop_daemon(&mut self, kill: bool) {
        if let Some(mut child) = self.daemon.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let sig = if kill {
                nix::sys::signal::Signal::SIGKILL
            } else {
                nix::sys::signal::Signal::SIGTERM
            };
            let _ = nix::sys::signal::kill(pid, sig);
            let _ = child.wait();
        }
    }

    /// The daemon's PID, if it runs.
    pub fn daemon_pid(&self) -> Option<i32> {
        self.daemon.as_ref().map(|c| c.id() as i32)
    }

    /// Runs `command` for every sandbox with `workers` plugin processes at once.
    pub fn plugin_parallel(
        &self,
        command: &str,
        sbs: &[&Sandbox],
        workers: usize,
    ) -> Vec<PluginOutput> {
        self.plugin_parallel_counting(
            command,
            sbs,
            workers,
            &std::sync::atomic::AtomicUsize::new(0),
        )
    }

    /// `plugin_parallel`, counting finished runs in `done` as they complete.
    pub fn plugin_parallel_counting(
        &self,
        command: &str,
        sbs: &[&Sandbox],
        workers: usize,
        done: &std::sync::atomic::AtomicUsize,
    ) -> Vec<PluginOutput> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<std::sync::Mutex<Option<PluginOutput>>> =
            sbs.iter().map(|_| std::sync::Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= sbs.len() {
                            break;
                        }
                        let out = self.plugin(command, Some(sbs[i]), &self.conf("1.1.0"), &[]);
                        if let Ok(mut slot) = results[i].lock() {
                            *slot = Some(out);
                        }
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        results
            .into_iter()
            .map(|m| m.into_inner().ok().flatten().expect("every sandbox ran"))
            .collect()
    }

    /// Restarts the daemon (clean stop, same options).
    pub fn restart_daemon(&mut self) {
        self.stop_daemon(false);
        self.start_daemon();
    }

    pub fn client(&self) -> podnet::api::client::Client {
        podnet::api::client::Client::new(self.socket(), Duration::from_secs(10))
    }

    /// The daemon's IPv4 addressing (router address, allocation range) from
    /// `GET /v1/config`.
    pub fn ipv4_addressing(&self) -> podnet::api::models::NodeAddressingElement {
        self.client()
            .config()
            .expect("GET /v1/config")
            .status
            .addressing
            .ipv4
            .expect("the daemon has IPv4 addressing")
    }

    /// The daemon's IPv6 addressing, as `ipv4_addressing`.
    pub fn ipv6_addressing(&self) -> podnet::api::models::NodeAddressingElement {
        self.client()
            .config()
            .expect("GET /v1/config")
            .status
            .addressing
            .ipv6
            .expect("the daemon has IPv6 addressing")
    }

    /// A new sandbox namespace with a unique container ID and `eth0`.
    pub fn sandbox(&self) -> Sandbox {
        let ns = Netns::new("pnt-sb");
        Sandbox {
            container_id: format!("cid-{}", ns.name),
            ns,
            ifname: "eth0".into(),
        }
    }

    /// The network config the tests use.
    pub fn conf(&self, version: &str) -> String {
        serde_json::json!({
            "cniVersion": version,
            "name": "podnet-it",
            "type": "podnet",
            "socket-path": self.socket(),
        })
        .to_string()
    }

    /// Runs the plugin in the node namespace.
    pub fn plugin(
        &self,
        command: &str,
        sb: Option<&Sandbox>,
        stdin: &str,
        extra_env: &[(&str, &str)],
    ) -> PluginOutput {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns.name, podnet_bin()]);
        plugin_env(&mut cmd, command, sb, extra_env);
        plugin_run(cmd, stdin)
    }

    /// Runs the plugin as a container runtime does: forked into the node
    /// namespace (setns before the exec) and nothing more; `ip netns exec`
    /// (which [`Node::plugin`] runs) also makes a mount namespace and mounts a
    /// sysfs, which no runtime does, for every run. For the benches' timing.
    pub fn plugin_as_runtime(&self, command: &str, sb: &Sandbox, stdin: &str) -> PluginOutput {
        let mut cmd = Command::new(podnet_bin());
        plugin_env(&mut cmd, command, Some(sb), &[]);
        exec_in_netns(&mut cmd, &self.ns, || Ok(()));
        plugin_run(cmd, stdin)
    }

    pub fn add(&self, sb: &Sandbox) -> PluginOutput {
        self.plugin("ADD", Some(sb), &self.conf("1.1.0"), &[])
    }

    pub fn del(&self, sb: &Sandbox) -> PluginOutput {
        self.plugin("DEL", Some(sb), &self.conf("1.1.0"), &[])
    }

    /// CHECK with the ADD result as prevResult.
    pub fn check(&self, sb: &Sandbox, add_result: &PluginOutput) -> PluginOutput {
        let mut conf: Value = serde_json::from_str(&self.conf("1.1.0")).expect("conf");
        conf["prevResult"] = add_result.json();
        self.plugin("CHECK", Some(sb), &conf.to_string(), &[])
    }

    /// The daemon's allocation map (ip → owner).
    pub fn allocations(&self) -> std::collections::BTreeMap<String, String> {
        self.client().healthz().expect("healthz").ipam.allocations
    }

    /// True once no host-side link is left (DEL hands the link teardown to the
    /// daemon, which finishes it in the background): waits up to 5 s.
    pub fn host_links_gone(&self) -> bool {
        self.host_links_down_to(0)
    }

    /// True once at most `n` host-side links are left: waits up to 5 s. Also for a
    /// deleted pod netns, which the kernel frees (and its veth with it) after
    /// `ip netns del` has returned.
    pub fn host_links_down_to(&self, n: usize) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if self.host_links().len() <= n {
                return true;
            }
            if Instant::now() > deadline {
                eprintln!("host links left: {:?}", self.host_links());
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The alias of a link in the node namespace (podnet's marker on host links).
    pub fn link_alias(&self, name: &str) -> Option<String> {
        let out = self.ns.exec(&["ip", "-j", "link", "show", "dev", name]);
        let links: Value = serde_json::from_slice(&out.stdout).ok()?;
        links[0]["ifalias"].as_str().map(str::to_string)
    }

    /// The id of the daemon's journal, read from a host link's marker.
    pub fn journal_id_of(&self, link: &str) -> String {
        let alias = self.link_alias(link).expect("the host link has a marker");
        let marker =
            podnet::datapath::link_marker::LinkMarker::parse(&alias).expect("a podnet marker");
        marker.journal.journal_id
    }

    /// Host-side links (lxc…) present in the node namespace.
    pub fn host_links(&self) -> Vec<String> {
        let out = self.ns.exec(&["ip", "-o", "link", "show"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or("").to_string())
            .filter(|n| n.starts_with("lxc"))
            .collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop_daemon(true);
        self.ns.delete();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Makes `cmd`'s child enter `ns` between fork and exec (as a runtime starts a
/// plugin: no `ip netns exec`), then run `then`, which may make only
/// async-signal-safe calls.
pub fn exec_in_netns(
    cmd: &mut Command,
    ns: &Netns,
    then: impl Fn() -> std::io::Result<()> + Send + Sync + 'static,
) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let netns = std::fs::File::open(ns.path()).expect("opening the netns");
    let fd = netns.as_raw_fd();
    // SAFETY: between fork and exec only setns and `then`, async-signal-safe
    // by its contract; the file stays open in the closure.
    unsafe {
        cmd.pre_exec(move || {
            let _keep_open = &netns;
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            then()
        });
    }
}

/// The values of the metric lines of `text` that start with `prefix`.
pub fn metric_values(text: &str, prefix: &str) -> Vec<f64> {
    let lines = text.lines().filter(|l| l.starts_with(prefix));
    lines
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect()
}

/// The plugin's environment on `cmd`: only PATH, `CNI_COMMAND`, the
/// sandbox's variables and `extra_env`.
fn plugin_env(cmd: &mut Command, command: &str, sb: Option<&Sandbox>, extra_env: &[(&str, &str)]) {
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CNI_COMMAND", command);
    if let Some(sb) = sb {
        cmd.env("CNI_CONTAINERID", &sb.container_id)
            .env("CNI_NETNS", sb.ns.path())
            .env("CNI_IFNAME", &sb.ifname)
            .env("CNI_ARGS", sb.cni_args());
    }
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
}

/// Runs a prepared plugin command with `stdin`, with a hang guard.
pub fn plugin_run(mut cmd: Command, stdin: &str) -> PluginOutput {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawning the plugin");
    if let Some(mut i) = child.stdin.take() {
        let _ = i.write_all(stdin.as_bytes());
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("plugin did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().expect("plugin output");
    PluginOutput {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

/// Path of a file in the repository.
pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}
