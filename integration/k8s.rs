//! A real Kubernetes control plane for integration tests: etcd and kube-apiserver
//! (the binaries `scripts/k8s-binaries` builds) in a private network namespace on a
//! bridge, and node namespaces on the same bridge for the daemons.
//!
//! Layout of one [`ControlPlane`] (all names unique to the instance):
//!
//! ```text
//!  fabric netns  pnk-f<pid>-<n>:  bridge br0, one veth end per member
//!  control plane pnk-c<pid>-<n>:  eth0 10.250.0.1/24; etcd on 127.0.0.1:2379,
//!                                 kube-apiserver on :6443 (every address of the
//!                                 namespace: 10.250.0.1 and 127.0.0.1)
//!  node netns    pnk-n<pid>-<n>:  eth0 10.250.0.11/24, .12, ... (add_node_ns)
//! ```
//!
//! Every instance has its own namespaces, so all of them use the same addresses
//! and ports without seeing each other; only namespace names are global, and they
//! carry the PID and a per-process counter. Tests that run in parallel each start
//! their own control plane (~4 s, ~300 MB): no shared instance, because a static
//! is never dropped (its processes would outlive the test binary) and because
//! tests that stop or restart the API server need their own.
//!
//! Processes are stopped by PID on drop (SIGTERM, then SIGKILL after 10 s), then
//! the namespaces and the temp dir (certificates, etcd data, logs, kubeconfigs,
//! kubectl's cache) are removed. etcd and kube-apiserver also get SIGKILL from the
//! kernel if the thread that started them exits (`PR_SET_PDEATHSIG`), so a test
//! binary killed by a timeout leaves no etcd or API server running (its
//! namespaces, `pnk-*`, and temp dir, `/tmp/podnet-k8s-pnk-*`, do stay). Start,
//! use and drop a `ControlPlane` in the same test thread.

use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::harness::*;

/// Prefix of every namespace a `ControlPlane` makes.
pub const NETNS_PREFIX: &str = "pnk-";
/// The API server's address on the fabric.
pub const API_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
pub const API_PORT: u16 = 6443;
/// The fabric's prefix length.
const FABRIC_PREFIX_LEN: u8 = 24;
/// The first node address is 10.250.0.11.
const FIRST_NODE_HOST: u8 = 11;
/// The CRDs `install_crds` applies (files in `deploy/crds/`).
pub const CRDS: [&str; 5] = [
    "ciliumnodes.cilium.io",
    "ciliumpodippools.cilium.io",
    "ciliumnodeconfigs.cilium.io",
    "ciliumloadbalancerippools.cilium.io",
    "ciliuml2announcementpolicies.cilium.io",
];
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Where `scripts/k8s-binaries` puts etcd, kube-apiserver and kubectl.
pub fn bin_dir() -> PathBuf {
    match std::env::var_os("PODNET_K8S_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("bin"),
        _ => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".cache/podnet-k8s/bin"),
    }
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What one kubectl run gave.
#[derive(Debug)]
pub struct KubectlOutput {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl KubectlOutput {
    /// stdout of a run that must have succeeded.
    pub fn expect_ok(self, what: &str) -> String {
        assert!(self.ok, "kubectl {what} failed: {}", self.stderr);
        self.stdout
    }

    /// True if the API server refused the request with 403.
    pub fn forbidden(&self) -> bool {
        !self.ok && self.stderr.contains("(Forbidden)")
    }
}

/// A node namespace attached to the fabric (loopback and eth0 up). Hand `ns` to
/// `Node::in_namespace` to run a daemon there; the namespace is deleted with
/// whoever owns `ns` last.
pub struct NodeNs {
    /// The name the test gave (use it as the Kubernetes node name).
    pub name: String,
    /// The node's address on the fabric.
    pub ip: Ipv4Addr,
    pub ns: Netns,
}

/// etcd + kube-apiserver in their own namespace; see the module doc.
pub struct ControlPlane {
    fabric: Netns,
    cp: Netns,
    dir: PathBuf,
    bin: PathBuf,
    etcd: Option<Child>,
    apiserver: Option<Child>,
    next_host: AtomicU8,
    /// From `start` to the API server's first `/readyz` 200 (certificates and
    /// namespaces included).
    pub startup: Duration,
}

impl ControlPlane {
    /// Starts a control plane and waits until the API server is ready. `None` (a
    /// reported skip: a failure unless skips are allowed) when not root or when a binary
    /// is missing.
    pub fn start(test: &str) -> Option<ControlPlane> {
        if !root_or_skip(test) {
            return None;
        }
        let bin = bin_dir();
        for b in ["etcd", "kube-apiserver", "kubectl"] {
            if !is_executable(&bin.join(b)) {
                skip(
                    test,
                    &format!(
                        "{} is missing (`bash scripts/k8s-binaries` builds it; scripts/setup runs that)",
                        bin.join(b).display()
                    ),
                );
                return None;
            }
        }
        if !Command::new("openssl")
            .arg("version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            skip(test, "openssl is missing (it makes the test certificates)");
            return None;
        }
        if !Command::new("nft")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            skip(
                test,
                "nft is missing (scripts/setup installs nftables): daemons on the Kubernetes backend masquerade by default",
            );
            return None;
        }
        let t0 = Instant::now();
        let fabric = Netns::new(&format!("{NETNS_PREFIX}f"));
        let cp = Netns::new(&format!("{NETNS_PREFIX}c"));
        let dir = std::env::temp_dir().join(format!("podnet-k8s-{}", fabric.name));
        std::fs::create_dir(&dir).expect("control plane temp dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let mut plane = ControlPlane {
            fabric,
            cp,
            dir,
            bin,
            etcd: None,
            apiserver: None,
            next_host: AtomicU8::new(FIRST_NODE_HOST),
            startup: Duration::ZERO,
        };
        plane.wire_fabric();
        plane.make_certificates();
        plane.write_admin_kubeconfig();
        plane.spawn_etcd();
        plane.spawn_apiserver();
        plane.wait_ready();
        plane.startup = t0.elapsed();
        Some(plane)
    }

    /// The temp dir (certificates, `etcd/`, `etcd.log`, `apiserver.log`, kubeconfigs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `https://10.250.0.1:6443`: reachable from the control-plane namespace and
    /// every node namespace, not from the host's.
    pub fn server(&self) -> String {
        format!("https://{API_IP}:{API_PORT}")
    }

    /// A kubeconfig for `system:masters` (bypasses RBAC), certificates by path.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The CA that signed the API server's certificate.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The control-plane namespace's name.
    pub fn netns(&self) -> &str {
        &self.cp.name
    }

    /// The fabric namespace's name.
    pub fn fabric_netns(&self) -> &str {
        &self.fabric.name
    }

    pub fn etcd_pid(&self) -> Option<i32> {
        self.etcd.as_ref().map(|c| c.id() as i32)
    }

    pub fn apiserver_pid(&self) -> Option<i32> {
        self.apiserver.as_ref().map(|c| c.id() as i32)
    }

    /// The last `lines` lines of `etcd.log` or `apiserver.log`.
    pub fn log_tail(&self, which: &str, lines: usize) -> String {
        let text =
            std::fs::read_to_string(self.dir.join(format!("{which}.log"))).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// kubectl as the admin, run in the control-plane namespace.
    pub fn kubectl(&self, args: &[&str]) -> KubectlOutput {
        self.kubectl_as(&self.cp, &self.kubeconfig(), args, None)
    }

    /// kubectl as the admin with `stdin` (e.g. `apply -f -`).
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> KubectlOutput {
        self.kubectl_as(&self.cp, &self.kubeconfig(), args, Some(stdin))
    }

    /// kubectl run inside `ns` (a node namespace: the request crosses the bridge)
    /// with `kubeconfig` (e.g. one from `token_kubeconfig`). The discovery cache is
    /// in the temp dir and HOME is the temp dir: nothing touches `~/.kube`.
    pub fn kubectl_as(
        &self,
        ns: &Netns,
        kubeconfig: &Path,
        args: &[&str],
        stdin: Option<&str>,
    ) -> KubectlOutput {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.name])
            .arg(self.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.join("kube-cache"))
            .args(args);
        self.clean_env(&mut cmd);
        run_with_timeout(cmd, stdin, KUBECTL_TIMEOUT)
            .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"))
    }

    /// `kubectl apply -f -` as the admin; panics on failure.
    pub fn apply(&self, yaml: &str) -> String {
        self.kubectl_stdin(&["apply", "-f", "-"], yaml)
            .expect_ok("apply")
    }

    /// Applies `deploy/crds/` and waits until every CRD is Established and its
    /// resource is listable.
    pub fn install_crds(&self) {
        self.install_crd_files(&repo_path("deploy/crds"), &CRDS);
    }

    /// Applies the CRD file or directory `path` and waits until each CRD of
    /// `crds` (their names) is Established and its resource is listable.
    pub fn install_crd_files(&self, path: &Path, crds: &[&str]) {
        self.kubectl(&["apply", "-f", &path.to_string_lossy()])
            .expect_ok("apply the CRDs");
        let mut wait = vec!["wait", "--for=condition=Established", "--timeout=30s"];
        let names: Vec<String> = crds.iter().map(|c| format!("crd/{c}")).collect();
        wait.extend(names.iter().map(String::as_str));
        self.kubectl(&wait).expect_ok("wait for the CRDs");
        // Established means served; make sure discovery (kubectl's cache) has them.
        let plurals: Vec<&str> = crds
            .iter()
            .map(|c| c.split('.').next().unwrap_or(c))
            .collect();
        let list = plurals.join(",");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = self.kubectl(&["get", &list, "-A", "-o", "name"]);
            if out.ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "CRDs not listable: {}",
                out.stderr
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A kubeconfig (written to the temp dir) that authenticates as the existing
    /// ServiceAccount `namespace/serviceaccount` with a token from the
    /// TokenRequest API (`kubectl create token`, valid 1 h): a least-privilege
    /// client whose rights are whatever RBAC grants that account.
    pub fn token_kubeconfig(&self, namespace: &str, serviceaccount: &str) -> PathBuf {
        self.token_kubeconfig_bound(namespace, serviceaccount, None)
    }

    /// Pod `default/<pod>` Running with `ip`, in its status as a kubelet
    /// writes it once the sandbox is up (no kubelet runs here).
    pub fn set_pod_ip(&self, pod: &str, ip: &str) {
        self.kubectl(&[
            "patch",
            "pod",
            pod,
            "-n",
            "default",
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(
                r#"{{"status":{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}]}}}}"#
            ),
        ])
        .expect_ok("patch the Pod's status");
    }

    /// The Events on Pod `default/<pod>`: `reason|message|involvedObject.uid` each.
    pub fn pod_events(&self, pod: &str) -> String {
        self.kubectl(&[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            &format!("involvedObject.kind=Pod,involvedObject.name={pod}"),
            "-o",
            "jsonpath={range .items[*]}{.reason}|{.message}|{.involvedObject.uid}{\"\\n\"}{end}",
        ])
        .expect_ok("get events")
    }

    /// deploy/agent-rbac.yaml applied, and the kubeconfig of the token the
    /// kubelet would mount in the agent's pod on `node` (a Pod object,
    /// `podnet-agent-<node>`, bound to it: the admission policy takes the node's
    /// name from the token).
    pub fn agent_kubeconfig_on(&self, node: &str) -> PathBuf {
        self.kubectl(&[
            "apply",
            "-f",
            &repo_path("deploy/agent-rbac.yaml").to_string_lossy(),
        ])
        .expect_ok("apply deploy/agent-rbac.yaml");
        let pod = format!("podnet-agent-{node}");
        self.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: kube-system}}\n\
             spec:\n  nodeName: {node}\n  serviceAccountName: podnet-agent\n\
             \x20 containers: [{{name: agent, image: ghcr.io/podnet/podnet:0.1.0}}]\n"
        ));
        self.pod_token_kubeconfig("kube-system", "podnet-agent", &pod)
    }

    /// Like [`token_kubeconfig`](Self::token_kubeconfig), with the token bound to
    /// the Pod `namespace/pod` (`--bound-object-kind Pod`), as the one the kubelet
    /// mounts: valid while the pod exists, and naming the pod's node
    /// (`authentication.kubernetes.io/node-name` in the user's extra).
    pub fn pod_token_kubeconfig(
        &self,
        namespace: &str,
        serviceaccount: &str,
        pod: &str,
    ) -> PathBuf {
        self.token_kubeconfig_bound(namespace, serviceaccount, Some(pod))
    }

    fn token_kubeconfig_bound(
        &self,
        namespace: &str,
        serviceaccount: &str,
        pod: Option<&str>,
    ) -> PathBuf {
        let mut args = vec![
            "create",
            "token",
            serviceaccount,
            "-n",
            namespace,
            "--duration=1h",
        ];
        if let Some(pod) = pod {
            args.extend(["--bound-object-kind", "Pod", "--bound-object-name", pod]);
        }
        let token = self.kubectl(&args).expect_ok("create token");
        let bound = pod.map(|p| format!("-pod-{p}")).unwrap_or_default();
        let path = self
            .dir
            .join(format!("sa-{namespace}-{serviceaccount}{bound}.kubeconfig"));
        let user = serde_json::json!({"token": token.trim()});
        self.write_kubeconfig(&path, &format!("{namespace}-{serviceaccount}"), user);
        path
    }

    /// A new namespace on the fabric with the next free address (10.250.0.11, .12,
    /// ...), loopback up. `name` is the test's name for the node (the namespace's
    /// own name is unique to this process).
    pub fn add_node_ns(&self, name: &str) -> NodeNs {
        let host = self.next_host.fetch_add(1, Ordering::SeqCst);
        assert!(host < 255, "the fabric's /24 is full");
        let ns = Netns::new(&format!("{NETNS_PREFIX}n"));
        let ip = Ipv4Addr::new(10, 250, 0, host);
        let port = format!("n{host}");
        self.attach(&ns, &port, ip);
        NodeNs {
            name: name.to_string(),
            ip,
            ns,
        }
    }

    /// Stops the API server (SIGTERM, or SIGKILL if `kill`); etcd keeps running.
    pub fn stop_apiserver(&mut self, kill: bool) {
        if let Some(child) = self.apiserver.as_mut() {
            stop_child(child, kill);
        }
        self.apiserver = None;
    }

    /// Starts the API server again (same flags, same etcd data) and waits until
    /// it is ready; returns how long that took.
    pub fn start_apiserver(&mut self) -> Duration {
        assert!(self.apiserver.is_none(), "the API server is running");
        let t0 = Instant::now();
        self.spawn_apiserver();
        self.wait_ready();
        t0.elapsed()
    }

    // --- set-up -------------------------------------------------------------

    fn ip(&self, args: &[&str]) {
        let out = Command::new("ip")
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Bridge in the fabric, control-plane namespace on it.
    fn wire_fabric(&self) {
        let f = self.fabric.name.as_str();
        self.ip(&["-n", f, "link", "set", "lo", "up"]);
        self.ip(&["-n", f, "link", "add", "br0", "type", "bridge"]);
        self.ip(&["-n", f, "link", "set", "br0", "up"]);
        self.attach(&self.cp, "cp", API_IP);
    }

    /// A veth from the fabric bridge (`port`) to `eth0` in `ns`, with `ip`. Both
    /// ends are made inside the namespaces: nothing appears in the host's.
    fn attach(&self, ns: &Netns, port: &str, ip: Ipv4Addr) {
        let f = self.fabric.name.as_str();
        let n = ns.name.as_str();
        let addr = format!("{ip}/{FABRIC_PREFIX_LEN}");
        self.ip(&[
            "-n", f, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", n,
        ]);
        self.ip(&["-n", f, "link", "set", port, "master", "br0", "up"]);
        self.ip(&["-n", n, "link", "set", "lo", "up"]);
        self.ip(&["-n", n, "addr", "add", &addr, "dev", "eth0"]);
        self.ip(&["-n", n, "link", "set", "eth0", "up"]);
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .current_dir(&self.dir)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("openssl {args:?}: {e}"));
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// EC P-256 (fast to make; the API server signs tokens with ES256): a CA, the
    /// API server's serving certificate (IP SANs: the fabric address, loopback,
    /// the `kubernetes` service address), an admin client certificate in
    /// `system:masters`, and the service-account key pair.
    fn make_certificates(&self) {
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "1",
            "-subj",
            "/CN=podnet-test-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        self.openssl(&ca);
        let leaf = |name: &str, subject: &str, ext: &str| {
            std::fs::write(self.dir.join(format!("{name}.ext")), ext).expect("ext file");
            let (key, csr, crt, extf) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            let mut req = vec!["req", "-new"];
            req.extend(ec);
            req.extend(["-keyout", &key, "-out", &csr, "-subj", subject]);
            self.openssl(&req);
            self.openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "1",
                "-extfile",
                &extf,
            ]);
        };
        leaf(
            "apiserver",
            "/CN=kube-apiserver",
            &format!(
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
                 extendedKeyUsage=serverAuth\n\
                 subjectAltName=IP:{API_IP},IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,\
                 DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
            ),
        );
        leaf(
            "admin",
            "/O=system:masters/CN=podnet-admin",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=clientAuth\n",
        );
        self.openssl(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            "sa.key",
        ]);
        self.openssl(&["pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
    }

    /// A kubeconfig for this cluster with `user` (a kubeconfig `user` object).
    /// JSON, which is YAML too; file references are absolute paths.
    fn write_kubeconfig(&self, path: &Path, user_name: &str, user: serde_json::Value) {
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "podnet", "cluster": {
                "server": self.server(),
                "certificate-authority": self.ca_cert(),
            }}],
            "users": [{"name": user_name, "user": user}],
            "contexts": [{"name": "podnet", "context": {"cluster": "podnet", "user": user_name}}],
            "current-context": "podnet",
        });
        let text = serde_json::to_string_pretty(&config).expect("kubeconfig JSON");
        std::fs::write(path, text).expect("writing a kubeconfig");
    }

    fn write_admin_kubeconfig(&self) {
        let user = serde_json::json!({
            "client-certificate": self.dir.join("admin.crt"),
            "client-key": self.dir.join("admin.key"),
        });
        self.write_kubeconfig(&self.kubeconfig(), "admin", user);
    }

    /// No inherited environment: etcd reads every `ETCD_*` variable as a flag,
    /// and kubectl would use `~/.kube`. HOME is the temp dir.
    fn clean_env(&self, cmd: &mut Command) {
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", &self.dir);
    }

    /// `ip netns exec <cp> <binary> args`, output to `<log>.log`. `ip netns exec`
    /// execs the binary, so the child's PID is the binary's.
    fn spawn_in_cp(&self, binary: &str, args: &[String], log: &str) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{log}.log")))
            .expect("log file");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.cp.name])
            .arg(self.bin.join(binary))
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log);
        self.clean_env(&mut cmd);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.spawn()
            .unwrap_or_else(|e| panic!("spawning {binary}: {e}"))
    }

    /// etcd on the namespace's loopback; plain HTTP; `--unsafe-no-fsync`: test data.
    fn spawn_etcd(&mut self) {
        let data = self.dir.join("etcd");
        let args: Vec<String> = [
            "--name=podnet",
            &format!("--data-dir={}", data.display()),
            "--listen-client-urls=http://127.0.0.1:2379",
            "--advertise-client-urls=http://127.0.0.1:2379",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=podnet=http://127.0.0.1:2380",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        self.etcd = Some(self.spawn_in_cp("etcd", &args, "etcd"));
    }

    /// kube-apiserver on every address of the namespace. It waits for etcd
    /// itself, so both start at once.
    fn spawn_apiserver(&mut self) {
        let d = &self.dir;
        let p = |f: &str| d.join(f).display().to_string();
        let args: Vec<String> = vec![
            "--etcd-servers=http://127.0.0.1:2379".into(),
            "--bind-address=0.0.0.0".into(),
            format!("--advertise-address={API_IP}"),
            format!("--secure-port={API_PORT}"),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--authorization-mode=Node,RBAC".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            "--endpoint-reconciler-type=none".into(),
        ];
        self.apiserver = Some(self.spawn_in_cp("kube-apiserver", &args, "apiserver"));
    }

    /// Polls `/readyz` (through kubectl, as the admin) until it answers `ok`.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let mut exited = None;
            for (name, child) in [("etcd", &mut self.etcd), ("apiserver", &mut self.apiserver)] {
                if let Some(c) = child.as_mut()
                    && let Ok(Some(status)) = c.try_wait()
                {
                    *child = None;
                    exited = Some((name, status));
                }
            }
            if let Some((name, status)) = exited {
                panic!(
                    "{name} exited ({status}) before the API server was ready; log:\n{}",
                    self.log_tail(name, 40)
                );
            }
            let out = self.kubectl(&["get", "--raw=/readyz", "--request-timeout=2s"]);
            if out.ok && out.stdout.trim() == "ok" {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "the API server was not ready within {READY_TIMEOUT:?} ({}); log:\n{}",
                    out.stderr.trim(),
                    self.log_tail("apiserver", 40)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "control plane {}: apiserver.log tail:\n{}\netcd.log tail:\n{}",
                self.cp.name,
                self.log_tail("apiserver", 30),
                self.log_tail("etcd", 10)
            );
        }
        // The API server first: it would log etcd errors until stopped.
        if let Some(mut c) = self.apiserver.take() {
            stop_child(&mut c, false);
        }
        if let Some(mut c) = self.etcd.take() {
            stop_child(&mut c, false);
        }
        self.cp.delete();
        self.fabric.delete();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// SIGTERM (unless `kill_now`), up to `STOP_GRACE` for it to exit, then SIGKILL;
/// always reaps.
fn stop_child(child: &mut Child, kill_now: bool) {
    let pid = Pid::from_raw(child.id() as i32);
    if !kill_now && matches!(child.try_wait(), Ok(None)) {
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    if matches!(child.try_wait(), Ok(None)) {
        let _ = kill(pid, Signal::SIGKILL);
    }
    let _ = child.wait();
}

/// Runs `cmd` with `stdin`, killing it (by PID) after `timeout`.
fn run_with_timeout(
    mut cmd: Command,
    stdin: Option<&str>,
    timeout: Duration,
) -> Result<KubectlOutput, String> {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use std::io::Write;
        pipe.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    }
    // Read both pipes on threads so a large output cannot block the child.
    let mut out_pipe = child.stdout.take().expect("stdout");
    let mut err_pipe = child.stderr.take().expect("stderr");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out_pipe, &mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err_pipe, &mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
            return Err(format!("did not finish within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok(KubectlOutput {
        ok: status.success(),
        stdout: out_t.join().unwrap_or_default(),
        stderr: err_t.join().unwrap_or_default(),
    })
}

/// True if `pid` is a running process named `comm`: not gone, not a zombie (a
/// killed child of an exited parent stays one until PID 1 reaps it), not a
/// reused PID.
fn alive_as(pid: i32, comm: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "<pid> (<comm>) <state> ...": comm may hold spaces and parentheses.
    let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
        return false;
    };
    let state = stat[close + 1..].split_whitespace().next().unwrap_or("");
    &stat[open + 1..close] == comm && state != "Z" && state != "X"
}

fn netns_names() -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The harness end to end: a control plane on a fabric, the CRDs, a CiliumNode
/// made from a node namespace over the bridge, status through its subresource,
/// a ServiceAccount that may only `get` CiliumNodes, an API server restart with
/// the data kept, a daemon in the node namespace, and nothing left afterwards.
#[test]
fn k8s_control_plane_harness() {
    const TEST: &str = "k8s_control_plane_harness";
    let t0 = Instant::now();
    let Some(mut cp) = ControlPlane::start(TEST) else {
        return;
    };
    eprintln!("{TEST}: control plane ready in {:?}", cp.startup);
    let (etcd_pid, api_pid) = (cp.etcd_pid().unwrap(), cp.apiserver_pid().unwrap());
    assert!(alive_as(etcd_pid, "etcd") && alive_as(api_pid, "kube-apiserver"));

    let t = Instant::now();
    cp.install_crds();
    eprintln!("{TEST}: CRDs established in {:?}", t.elapsed());
    for crd in CRDS {
        let names = cp
            .kubectl(&["get", "crd", crd, "-o", "jsonpath={.spec.names.shortNames}"])
            .expect_ok("get crd");
        match crd {
            "ciliumnodes.cilium.io" => assert_eq!(names, r#"["cn","ciliumn"]"#),
            "ciliumpodippools.cilium.io" => assert_eq!(names, r#"["cpip"]"#),
            "ciliumloadbalancerippools.cilium.io" => {
                assert_eq!(names, r#"["ippools","ippool","lbippool","lbippools"]"#)
            }
            "ciliuml2announcementpolicies.cilium.io" => {
                assert_eq!(names, r#"["l2announcement"]"#)
            }
            _ => assert_eq!(names, ""),
        }
    }

    // A node namespace on the bridge; the admin kubeconfig works from there.
    let node = cp.add_node_ns("k8s-node-a");
    let admin = cp.kubeconfig();
    let from_node = |kc: &Path, args: &[&str]| cp.kubectl_as(&node.ns, kc, args, None);
    let ciliumnode = format!(
        "apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata:\n  name: {name}\n\
         spec:\n  addresses:\n  - {{type: InternalIP, ip: {ip}}}\n  ipam:\n    podCIDRs: [10.20.1.0/24]\n\
         status:\n  ipam:\n    used: {{10.20.1.5: {{owner: ignored}}}}\n",
        name = node.name,
        ip = node.ip
    );
    cp.kubectl_as(&node.ns, &admin, &["apply", "-f", "-"], Some(&ciliumnode))
        .expect_ok("apply CiliumNode from the node namespace");
    let listed = from_node(
        &admin,
        &[
            "get",
            "ciliumnodes",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
    )
    .expect_ok("get ciliumnodes from the node namespace");
    assert_eq!(listed, node.name);
    let internal_ip = from_node(
        &admin,
        &[
            "get",
            "cn",
            &node.name,
            "-o",
            "jsonpath={.spec.addresses[0].ip}",
        ],
    )
    .expect_ok("get cn");
    assert_eq!(internal_ip, node.ip.to_string());
    // status is a subresource: ignored on the object, written through /status.
    let status = |cp: &ControlPlane| {
        cp.kubectl(&[
            "get",
            "cn",
            &node.name,
            "-o",
            "jsonpath={.status.ipam.used}",
        ])
        .expect_ok("get status")
    };
    assert_eq!(status(&cp), "", "status written with the object");
    cp.kubectl(&[
        "patch",
        "cn",
        &node.name,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"ipam":{"used":{"10.20.1.5":{"owner":"default/pod-a"}}}}}"#,
    ])
    .expect_ok("patch status");
    assert_eq!(status(&cp), r#"{"10.20.1.5":{"owner":"default/pod-a"}}"#);

    // A ServiceAccount that may get CiliumNodes and nothing else.
    cp.apply(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: podnet-test}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: reader, namespace: podnet-test}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n\
         metadata: {name: podnet-test-ciliumnode-get}\n\
         rules:\n- {apiGroups: [cilium.io], resources: [ciliumnodes], verbs: [get]}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n\
         metadata: {name: podnet-test-ciliumnode-get}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: podnet-test-ciliumnode-get}\n\
         subjects:\n- {kind: ServiceAccount, name: reader, namespace: podnet-test}\n",
    );
    let reader = cp.token_kubeconfig("podnet-test", "reader");
    let whoami = from_node(
        &reader,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    )
    .expect_ok("auth whoami");
    assert_eq!(whoami, "system:serviceaccount:podnet-test:reader");
    let got = from_node(&reader, &["get", "ciliumnode", &node.name, "-o", "name"])
        .expect_ok("get as the reader");
    assert_eq!(got.trim(), format!("ciliumnode.cilium.io/{}", node.name));
    let delete = from_node(&reader, &["delete", "ciliumnode", &node.name]);
    assert!(delete.forbidden(), "delete as the reader: {delete:?}");
    let list = from_node(&reader, &["get", "ciliumnodes"]);
    assert!(list.forbidden(), "list as the reader: {list:?}");

    // The API server killed and started again: etcd kept the objects.
    cp.stop_apiserver(true);
    assert!(!alive_as(api_pid, "kube-apiserver"));
    let restart = cp.start_apiserver();
    eprintln!("{TEST}: API server restarted in {restart:?}");
    let api_pid2 = cp.apiserver_pid().unwrap();
    let again = cp
        .kubectl_as(
            &node.ns,
            &reader,
            &["get", "ciliumnode", &node.name, "-o", "name"],
            None,
        )
        .expect_ok("get after the restart");
    assert_eq!(again.trim(), format!("ciliumnode.cilium.io/{}", node.name));

    // The node namespace hosts a daemon (the usual Node harness) and still
    // reaches the API server.
    let node_name = node.name.clone();
    let mut daemon = Node::in_namespace(node.ns, &DUAL_STACK);
    daemon.start_daemon();
    assert!(daemon.client().healthz().is_ok());
    let seen = cp
        .kubectl_as(
            &daemon.ns,
            &reader,
            &["get", "cn", &node_name, "-o", "name"],
            None,
        )
        .expect_ok("get from the daemon's namespace");
    assert_eq!(seen.trim(), format!("ciliumnode.cilium.io/{node_name}"));
    let daemon_pid = daemon.daemon_pid().unwrap();

    // Everything goes away.
    let names = [
        cp.netns().to_string(),
        cp.fabric_netns().to_string(),
        daemon.ns.name.clone(),
    ];
    let dir = cp.dir().to_path_buf();
    let t = Instant::now();
    drop(daemon);
    drop(cp);
    eprintln!("{TEST}: teardown took {:?}", t.elapsed());
    let left: Vec<String> = netns_names()
        .into_iter()
        .filter(|n| names.contains(n))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
    for (pid, comm) in [
        (daemon_pid, "podnet"),
        (etcd_pid, "etcd"),
        (api_pid, "kube-apiserver"),
        (api_pid2, "kube-apiserver"),
    ] {
        assert!(!alive_as(pid, comm), "{comm} (PID {pid}) still runs");
    }
    assert!(!dir.exists(), "temp dir left: {}", dir.display());
    eprintln!("{TEST}: whole test {:?}", t0.elapsed());
}
