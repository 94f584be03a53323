//! What ADD asks the daemon, seen from the socket. A proxy between the plugin and
//! the daemon records every request (ADD waits for one: the allocation, whose
//! answer carries the configuration and which journals the endpoint pending; the
//! timing report that binds the addresses follows without a wait), and can
//! SIGKILL the plugin at a chosen request, or hold a request back: an allocation
//! whose pod is never wired still expires, and takes the attachment's host link
//! with it. Also: a Cilium-shaped client (no podnet fields) against podnet, and
//! delegated-plugin mode's refusal with the configuration (its ADD still
//! registers the endpoint and waits).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use podnet::api::client::{AllocateParams, ClientError};
use podnet::api::http::parse_response;
use podnet::api::models::FailureReason;
use serde_json::{Value, json};

use crate::harness::*;

/// Where the proxy kills the plugin (SIGKILL, by the PID the socket names), or
/// which request it holds back.
#[derive(Clone, Copy)]
pub(crate) enum Kill {
    Never,
    /// Once the daemon has answered this request, before the plugin gets it.
    AfterAnswerTo(&'static str),
    /// This request is kept (`Proxy::held`), never forwarded: for the plugin's
    /// report, which it does not wait for, as if the daemon never got it.
    Hold(&'static str),
}

/// A unix-socket proxy in front of a daemon: forwards each request (one per
/// connection, as the plugin's client sends them) and records its request line.
pub(crate) struct Proxy {
    path: PathBuf,
    requests: Arc<Mutex<Vec<String>>>,
    held: Arc<Mutex<Vec<Vec<u8>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    pub(crate) fn start(dir: &Path, daemon: PathBuf, kill: Kill) -> Proxy {
        let path = dir.join("proxy.sock");
        let listener = UnixListener::bind(&path).expect("proxy socket");
        listener.set_nonblocking(true).expect("nonblocking");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let held = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen, kept, stopped) = (requests.clone(), held.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => forward(conn, &daemon, kill, &seen, &kept),
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Proxy {
            path,
            requests,
            held,
            stop,
            thread: Some(thread),
        }
    }

    /// The request lines so far (`POST /v1/ipam?...`), without the HTTP version.
    pub(crate) fn requests(&self) -> Vec<String> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// The requests held back so far (`Kill::Hold`), as the plugin sent them.
    pub(crate) fn held(&self) -> Vec<Vec<u8>> {
        self.held.lock().map(|h| h.clone()).unwrap_or_default()
    }

    /// The requests so far as `METHOD /path` (no query, no endpoint id).
    pub(crate) fn calls(&self) -> Vec<String> {
        self.requests()
            .iter()
            .map(|r| {
                let r = r.split('?').next().unwrap_or("");
                match r.strip_prefix("PUT /v1/endpoint/") {
                    Some(_) => "PUT /v1/endpoint/{id}".to_string(),
                    None => r.to_string(),
                }
            })
            .collect()
    }

    /// A network config whose `socket-path` is the proxy.
    pub(crate) fn conf(&self) -> String {
        json!({
            "cniVersion": "1.1.0",
            "name": "podnet-it",
            "type": "podnet",
            "socket-path": self.path,
        })
        .to_string()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves one connection of the plugin.
fn forward(
    mut conn: UnixStream,
    daemon: &Path,
    kill: Kill,
    seen: &Mutex<Vec<String>>,
    held: &Mutex<Vec<Vec<u8>>>,
) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let Some(request) = read_request(&mut conn) else {
        return;
    };
    let line = String::from_utf8_lossy(&request)
        .lines()
        .next()
        .unwrap_or("")
        .trim_end_matches(" HTTP/1.1")
        .to_string();
    if let Ok(mut s) = seen.lock() {
        s.push(line.clone());
    }
    let pid = peer_pid(&conn);
    if let Kill::Hold(prefix) = kill
        && line.starts_with(prefix)
    {
        if let Ok(mut h) = held.lock() {
            h.push(request);
        }
        return;
    }
    let Ok(mut up) = UnixStream::connect(daemon) else {
        return;
    };
    let mut answer = Vec::new();
    if up.write_all(&request).is_err() || up.read_to_end(&mut answer).is_err() {
        return;
    }
    if let Kill::AfterAnswerTo(prefix) = kill
        && line.starts_with(prefix)
    {
        kill_plugin(pid);
        return;
    }
    let _ = conn.write_all(&answer);
}

/// Reads one request: the head, then as many body bytes as it announces.
fn read_request(conn: &mut UnixStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return Some(buf);
            }
        }
        let n = conn.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The PID of the process at the other end of a unix socket.
fn peer_pid(conn: &UnixStream) -> i32 {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a `ucred` of `len` bytes; both outlive the call.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "SO_PEERCRED");
    cred.pid
}

fn kill_plugin(pid: i32) {
    assert!(pid > 0, "no peer PID");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// `sum` and `count` of the daemon's histogram of one ADD phase.
pub(crate) fn add_phase(node: &Node, phase: &str) -> Option<(f64, u64)> {
    let resp = node
        .client()
        .call("GET", "/metrics", &[], None)
        .expect("metrics");
    let text = String::from_utf8_lossy(&resp.body).to_string();
    let value = |kind: &str| {
        let key = format!("cni_phase_duration_seconds_{kind}{{verb=\"ADD\",phase=\"{phase}\"}}");
        text.lines()
            .find(|l| l.contains(&key))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    Some((value("sum")?, value("count")? as u64))
}

/// Waits (up to `secs`) until `cond` holds.
pub(crate) fn eventually(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

#[test]
fn add_waits_for_one_request_and_its_report_binds_the_addresses() {
    if !root_or_skip("add_round_trips") {
        return;
    }
    let node = Node::dual_stack();
    let proxy = Proxy::start(&node.dir, node.socket(), Kill::Never);
    let a = node.sandbox();
    let r = node.plugin("ADD", Some(&a), &proxy.conf(), &[]);
    assert!(r.ok, "{r:?}");
    // The endpoint was journaled with the allocation: there before any report.
    assert!(node.client().endpoint(&a.container_id, "eth0").is_ok());
    assert!(
        eventually(5, || proxy.calls().len() == 2),
        "{:?}",
        proxy.calls()
    );
    assert_eq!(
        proxy.calls(),
        ["POST /v1/ipam", "POST /v1/cni/report"],
        "no GET /v1/config, no endpoint registration"
    );
    // The allocation named the pod's netns (the daemon journals the endpoint).
    assert!(
        proxy.requests()[0].contains("netns="),
        "{:?}",
        proxy.requests()
    );
    // The IPv6 defaults were set after the allocation, before eth0 was made: the
    // pod's IPv6 address is usable at once (no DAD), both routers answer.
    let router4 = node.ipv4_addressing().ip;
    let cfg = node.client().config().expect("config").status;
    let router6 = cfg.addressing.ipv6.expect("ipv6").ip;
    assert!(a.ping(&router4) && a.ping(&router6));
    let dad =
        a.ns.exec(&["cat", "/proc/sys/net/ipv6/conf/eth0/accept_dad"]);
    assert_eq!(String::from_utf8_lossy(&dad.stdout).trim(), "0");
    // The host link says the ADD finished; the report bound both addresses.
    let host = podnet::datapath::host_ifname(&a.container_id, "eth0");
    let alias = node.link_alias(&host).expect("marker");
    assert!(
        podnet::datapath::link_marker::LinkMarker::parse(&alias).is_some_and(|m| m.wired),
        "{alias}"
    );
    assert!(
        eventually(5, || {
            let allocs = node.allocations();
            [r.ipv4(), r.ipv6()]
                .iter()
                .all(|ip| allocs.get(ip).is_some_and(|o| !o.contains("[expiring]")))
        }),
        "{:?}",
        node.allocations()
    );
    // The plugin's phases came with the report.
    assert_eq!(add_phase(&node, "netlink-pod").map(|p| p.1), Some(1));
    let (wired, n) = add_phase(&node, "link-wired").expect("link-wired");
    assert_eq!(n, 1);
    let (total, _) = add_phase(&node, "total").expect("total");
    assert!(total > wired && wired > 0.0);
    assert_eq!(add_phase(&node, "endpoint-registration"), None);
    assert_eq!(add_phase(&node, "daemon-config"), None);
    // A failed ADD reports too (without waiting for the answer).
    let b = node.sandbox();
    let foreign = b.ns.exec(&[
        "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "fpeer0",
    ]);
    assert!(foreign.status.success());
    let refused = node.plugin("ADD", Some(&b), &proxy.conf(), &[]);
    assert_eq!(refused.code(), 104);
    // Refused before any allocation, then reported.
    assert!(
        eventually(5, || proxy.calls().len() == 3),
        "{:?}",
        proxy.calls()
    );
    assert_eq!(proxy.calls()[2..], ["POST /v1/cni/report"]);
    assert!(node.plugin("DEL", Some(&a), &proxy.conf(), &[]).ok);
}

#[test]
fn a_plugin_killed_right_after_the_allocation_has_its_address_expire() {
    if !root_or_skip("killed_after_allocation") {
        return;
    }
    let node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.52.0.0/16",
        // Longer than an ADD on a busy machine: one that takes longer has its
        // addresses expire before the link is marked wired.
        "--ipam-expiration",
        "5s",
        "--k8s-node-name",
        "rt-node",
    ]);
    let proxy = Proxy::start(
        &node.dir,
        node.socket(),
        Kill::AfterAnswerTo("POST /v1/ipam"),
    );
    let a = node.sandbox();
    let killed = node.plugin("ADD", Some(&a), &proxy.conf(), &[]);
    assert!(!killed.ok && killed.stdout.is_empty(), "{killed:?}");
    let owner = format!("default/{}", a.ns.name);
    let pending: Vec<String> = node
        .allocations()
        .into_iter()
        .filter(|(_, o)| o.starts_with(&owner) && o.contains("[expiring]"))
        .map(|(ip, _)| ip)
        .collect();
    assert_eq!(pending.len(), 1, "{:?}", node.allocations());
    assert!(
        node.host_links().is_empty(),
        "killed before wiring anything"
    );
    assert!(
        eventually(10, || !node.allocations().contains_key(&pending[0])),
        "the address outlived its expiration"
    );
    assert!(node.log().contains("Released IP after expiration"));
    // The runtime's retry gets an address as usual.
    let retried = node.add(&a);
    assert!(retried.ok, "{retried:?}");
}

#[test]
fn a_wired_add_whose_report_never_arrives_is_bound_at_expiry() {
    if !root_or_skip("report_lost") {
        return;
    }
    let node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.53.0.0/16",
        // Longer than an ADD on a busy machine: one that takes longer has its
        // addresses expire before the link is marked wired.
        "--ipam-expiration",
        "5s",
        "--k8s-node-name",
        "rt-node",
    ]);
    let proxy = Proxy::start(&node.dir, node.socket(), Kill::Hold("POST /v1/cni/report"));
    let a = node.sandbox();
    let r = node.plugin("ADD", Some(&a), &proxy.conf(), &[]);
    assert!(r.ok, "{r:?}");
    assert!(eventually(5, || proxy.held().len() == 1));
    let host = podnet::datapath::host_ifname(&a.container_id, "eth0");
    let ip = r.ipv4();
    // The expiry finds the host link marked wired: it binds the address instead
    // of releasing it.
    assert!(
        eventually(10, || node
            .allocations()
            .get(&ip)
            .is_some_and(|o| !o.contains("[expiring]"))),
        "{:?}",
        node.allocations()
    );
    assert!(node.log().contains("marked wired"), "{}", node.log());
    assert_eq!(node.host_links(), std::slice::from_ref(&host));
    assert!(a.ping(&node.ipv4_addressing().ip));
    assert!(node.del(&a).ok);
    assert!(!node.allocations().contains_key(&ip));
    assert!(node.host_links_gone());
}

#[test]
fn a_cilium_shaped_client_allocates_and_binds_without_podnet_fields() {
    if !root_or_skip("cilium_client") {
        return;
    }
    let node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.54.0.0/16",
        "--ipam-expiration",
        "2s",
        "--k8s-node-name",
        "rt-node",
    ]);
    let c = node.client();
    // Cilium's CNI: POST /v1/ipam with owner and family only, expiration header.
    let resp = c
        .call(
            "POST",
            "/v1/ipam?family=ipv4&owner=default%2Fcilium-pod",
            &[("expiration", "true")],
            None,
        )
        .expect("POST /v1/ipam");
    assert_eq!(resp.status, 201);
    let v: Value = serde_json::from_slice(&resp.body).expect("IPAMResponse");
    let ip = v["address"]["ipv4"]
        .as_str()
        .expect("address.ipv4")
        .to_string();
    let uuid = v["ipv4"]["expiration-uuid"]
        .as_str()
        .expect("expiration-uuid");
    assert_eq!(v["ipv4"]["ip"], ip.as_str());
    assert!(v["ipv4"]["cidrs"].is_null());
    assert_eq!(v["host-addressing"]["ipv4"]["enabled"], true);
    assert!(v["host-addressing"]["ipv4"]["ip"].is_string());
    // podnet's additions are extra fields a Cilium client ignores.
    assert_eq!(v["podnet-config"]["ipam-mode"], "cluster-pool");
    // Cilium's endpoint request, no podnet fields.
    let body = json!({
        "container-id": "cilium-c1",
        "container-interface-name": "eth0",
        "k8s-pod-name": "cilium-pod",
        "k8s-namespace": "default",
        "state": "waiting-for-identity",
        "addressing": {"ipv4": ip, "ipv4-expiration-uuid": uuid},
        "interface-name": "lxccilium1",
        "sync-build-endpoint": true,
        "datapath-configuration": {},
    });
    let put = c
        .call(
            "PUT",
            "/v1/endpoint/cilium-local%3A1",
            &[],
            Some(serde_json::to_vec(&body).expect("body")),
        )
        .expect("PUT /v1/endpoint");
    assert_eq!(put.status, 201);
    // The endpoint stopped the timer: the address outlives the expiration.
    std::thread::sleep(Duration::from_millis(3000));
    let allocs = node.allocations();
    assert!(
        allocs
            .get(&ip)
            .is_some_and(|o| o.contains("default/cilium-pod") && !o.contains("[expiring]")),
        "{allocs:?}"
    );
    // No timings came with it, so none were recorded.
    assert_eq!(add_phase(&node, "endpoint-registration"), None);
    // Cilium's DEL: DELETE /v1/endpoint with the container ID.
    let del = c
        .call(
            "DELETE",
            "/v1/endpoint",
            &[],
            Some(br#"{"container-id":"cilium-c1"}"#.to_vec()),
        )
        .expect("DELETE /v1/endpoint");
    assert_eq!(del.status, 200);
    assert!(c.endpoint("cilium-c1", "eth0").is_err());
    assert!(!node.allocations().contains_key(&ip));
}

#[test]
fn delegated_plugin_mode_refuses_the_allocation_with_its_configuration() {
    if !root_or_skip("delegated_refusal") {
        return;
    }
    let node = Node::start(&["--ipam", "delegated-plugin", "--k8s-node-name", "deleg-rt"]);
    // podnet's client: the refusal names the reason and carries the configuration.
    let params = AllocateParams {
        owner: "default/p",
        expiration: true,
        container_id: "c1",
        ifname: "eth0",
        ..Default::default()
    };
    match node.client().allocate(&params) {
        Err(ClientError::Status {
            status: 502,
            reason: Some(FailureReason::DelegatedPlugin),
            config: Some(cfg),
            ..
        }) => {
            assert_eq!(cfg.ipam_mode, "delegated-plugin");
            let router = cfg.addressing.ipv4.expect("ipv4 addressing").ip;
            assert_eq!(router, "169.254.0.1");
        }
        other => panic!("want the delegated-plugin refusal, got {other:?}"),
    }
    // On the wire: Cilium's error body (a JSON string), podnet's two headers.
    let mut s = UnixStream::connect(node.socket()).expect("connect");
    s.write_all(b"POST /v1/ipam?owner=x HTTP/1.1\r\nHost: l\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
        .expect("write");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let resp = parse_response(&raw).expect("HTTP");
    assert_eq!(resp.status, 502);
    let message: String = serde_json::from_slice(&resp.body).expect("a JSON string");
    assert!(message.contains("delegated-plugin"), "{message}");
    assert_eq!(resp.podnet_reason.as_deref(), Some("delegated-plugin"));
    let cfg: Value =
        serde_json::from_str(resp.podnet_config.as_deref().expect("podnet-config")).expect("json");
    assert_eq!(cfg["ipam-mode"], "delegated-plugin");
    // Nothing was allocated or recorded as a failure.
    assert!(node.allocations().is_empty());
    let explain = node.client().explain("c1").expect("explain");
    assert!(explain.failures.is_empty(), "{explain:?}");

    // A whole ADD: the refused allocation, the delegate, the endpoint.
    let host_local = Path::new("/usr/lib/cni/host-local");
    if !host_local.exists() {
        skip(
            "delegated_refusal (ADD part)",
            "/usr/lib/cni/host-local is missing (scripts/setup installs containernetworking-plugins)",
        );
        return;
    }
    let proxy = Proxy::start(&node.dir, node.socket(), Kill::Never);
    let mut conf: Value = serde_json::from_str(&proxy.conf()).expect("conf");
    // Debian's host-local speaks up to 1.0.0.
    conf["cniVersion"] = json!("1.0.0");
    conf["ipam"] = json!({
        "type": "host-local",
        "ranges": [[{"subnet": "10.97.0.0/24"}]],
        "dataDir": node.dir.join("host-local"),
    });
    let conf = conf.to_string();
    let path = [("CNI_PATH", "/usr/lib/cni")];
    let a = node.sandbox();
    let r = node.plugin("ADD", Some(&a), &conf, &path);
    assert!(r.ok && r.ipv4().starts_with("10.97.0."), "{r:?}");
    // Delegated: the daemon journals nothing with the refusal, so the endpoint is
    // registered (and waited for) after the wiring.
    assert_eq!(proxy.calls(), ["POST /v1/ipam", "PUT /v1/endpoint/{id}"]);
    assert!(a.ping("169.254.0.1"));
    assert!(node.plugin("DEL", Some(&a), &conf, &path).ok);
}
