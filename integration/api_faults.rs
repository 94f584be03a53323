//! Faults at the API boundary, injected on purpose: a daemon that goes away in the
//! middle of a request (a fake one on the socket that closes, resets or cuts its
//! answer short), a client that stalls its request body, identifiers that would
//! forge log lines or climb out of a directory, oversized pod names, an error
//! answer without a body, and DEL-queue entries the daemon cannot read.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use podnet::api::client::ClientError;
use podnet::api::http::encode_component;

use crate::harness::*;

/// What the fake daemon does with each request.
#[derive(Clone, Copy, Debug)]
enum Misbehaviour {
    /// Reads the request and closes without a word.
    CloseSilently,
    /// Reads the request and sends half a response head.
    HalfHead,
    /// Closes without reading the request: the kernel resets the connection.
    Reset,
    /// Answers 500 with an empty body.
    EmptyError,
}

/// A "daemon" on the socket path that misbehaves on every connection; stopped
/// (thread joined, socket file removed) on drop.
struct FakeDaemon {
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    served: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeDaemon {
    fn start(socket: &Path, how: Misbehaviour) -> FakeDaemon {
        std::fs::create_dir_all(socket.parent().expect("socket dir")).expect("socket dir");
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).expect("bind the fake daemon");
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicUsize::new(0));
        let (s, n) = (stop.clone(), served.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        misbehave(stream, how);
                        n.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => panic!("fake daemon accept: {e}"),
                }
            }
        });
        FakeDaemon {
            socket: socket.to_path_buf(),
            stop,
            served,
            thread: Some(thread),
        }
    }

    fn served(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }
}

impl Drop for FakeDaemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn misbehave(mut stream: UnixStream, how: Misbehaviour) {
    stream
        .set_nonblocking(false)
        .and_then(|_| stream.set_read_timeout(Some(Duration::from_secs(5))))
        .expect("blocking stream");
    match how {
        Misbehaviour::Reset => {
            // Wait until the request is there, then close with it unread.
            let _ = nix::sys::socket::recv(
                std::os::fd::AsRawFd::as_raw_fd(&stream),
                &mut [0u8; 1],
                nix::sys::socket::MsgFlags::MSG_PEEK,
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Misbehaviour::CloseSilently => read_head(&mut stream),
        Misbehaviour::HalfHead => {
            read_head(&mut stream);
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: appl");
        }
        Misbehaviour::EmptyError => {
            read_head(&mut stream);
            let _ = stream.write_all(
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    }
}

/// Reads until the end of the request head (the plugin's requests to the config
/// and allocation routes have no body).
fn read_head(stream: &mut UnixStream) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[test]
fn a_daemon_that_goes_away_mid_request_means_try_again() {
    if !root_or_skip("daemon_gone_mid_request") {
        return;
    }
    // The node's namespace and directory, with a fake daemon on its socket.
    let node = Node::new(&[]);
    let sb = node.sandbox();
    for how in [
        Misbehaviour::CloseSilently,
        Misbehaviour::HalfHead,
        Misbehaviour::Reset,
    ] {
        let fake = FakeDaemon::start(&node.socket(), how);
        let r = node.add(&sb);
        assert!(
            fake.served() >= 1,
            "{how:?}: the plugin never reached the fake"
        );
        assert_eq!(r.code(), 11, "{how:?}: {r:?}");
        let msg = r.msg();
        assert!(
            msg.contains("closed the connection") && msg.contains("try again"),
            "{how:?}: {msg}"
        );
        assert!(
            sb.ns.exec(&["ip", "link", "show", "eth0"]).status.code() != Some(0),
            "{how:?}: ADD left an interface behind"
        );
    }
    // DEL treats it as a daemon that is down: the release is queued, DEL succeeds.
    let fake = FakeDaemon::start(&node.socket(), Misbehaviour::Reset);
    let r = node.del(&sb);
    assert!(r.ok, "{r:?}");
    assert!(r.stderr.contains("queued"), "{}", r.stderr);
    drop(fake);
    let queued = std::fs::read_dir(node.dir.join("run").join("delete-queue"))
        .expect("queue dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".delete"))
        .count();
    assert_eq!(queued, 1);
    // An error answer without a body: code 100 with the HTTP status, never empty.
    let fake = FakeDaemon::start(&node.socket(), Misbehaviour::EmptyError);
    let r = node.add(&sb);
    assert_eq!(r.code(), 100, "{r:?}");
    assert!(
        r.msg().ends_with(
            "podnet daemon answered HTTP 500 Internal Server Error without an error message"
        ),
        "{}",
        r.msg()
    );
    drop(fake);
}

#[test]
fn a_stalled_request_body_is_dropped_after_the_body_timeout() {
    if !root_or_skip("stalled_body") {
        return;
    }
    let node = Node::dual_stack();
    let mut s = UnixStream::connect(node.socket()).expect("connect");
    s.write_all(
        b"PUT /v1/endpoint/cilium-local:0 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"contain",
    )
    .expect("write head and 10 bytes");
    let t = Instant::now();
    // Others are served meanwhile.
    assert!(node.client().healthz().is_ok());
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("read timeout");
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .expect("the daemon closes the connection");
    let waited = t.elapsed();
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.starts_with("HTTP/1.1 408 "),
        "want 408 then close, got {text:?}"
    );
    assert!(
        text.contains("request body did not arrive within 10 s"),
        "{text}"
    );
    assert!(
        waited >= Duration::from_secs(9) && waited < Duration::from_secs(14),
        "closed after {waited:?}"
    );
    assert!(node.client().healthz().is_ok());
}

#[test]
fn identifiers_that_forge_log_lines_or_paths_are_refused() {
    if !root_or_skip("bad_identifiers") {
        return;
    }
    // Debug logging, so the refusals themselves are logged.
    let node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.31.0.0/16",
        "--k8s-node-name",
        "idents",
        "--log-level",
        "debug",
    ]);
    let c = node.client();
    let before = node.allocations();
    let forged = "x\n2030-01-01T00:00:00.000000Z  INFO allocated ip=10.31.0.99 owner=FORGED";
    let enc = encode_component;
    let range: ipnet::IpNet = node.ipv4_addressing().alloc_range.parse().expect("range");
    let ip = range.hosts().nth(50).expect("host").to_string();
    let endpoint = |fields: serde_json::Value| {
        let mut body = serde_json::json!({
            "container-id": "c0ffee",
            "container-interface-name": "eth0",
            "k8s-pod-name": "web-0",
            "k8s-namespace": "default",
            "addressing": {"ipv4": "10.31.0.98"},
        });
        for (k, v) in fields.as_object().expect("object") {
            body[k] = v.clone();
        }
        body.to_string().into_bytes()
    };
    let cases: Vec<(&str, String, Option<Vec<u8>>, &str)> = vec![
        (
            "POST",
            format!("/v1/ipam?owner={}", enc(forged)),
            None,
            "invalid owner",
        ),
        ("POST", "/v1/ipam?owner=a%00b".into(), None, "invalid owner"),
        (
            "POST",
            format!("/v1/ipam?owner={}", "o".repeat(600)),
            None,
            "at most 512",
        ),
        (
            "POST",
            "/v1/ipam?owner=ok&container-id=..%2F..%2Fx".into(),
            None,
            "invalid container-id \"../../x\"",
        ),
        (
            "POST",
            "/v1/ipam?owner=ok&ifname=a%2Fb".into(),
            None,
            "invalid ifname",
        ),
        (
            "POST",
            "/v1/ipam?owner=ok&network=a%0Ab".into(),
            None,
            "invalid network",
        ),
        (
            "POST",
            "/v1/ipam?owner=ok&pool=de%0Afault".into(),
            None,
            "invalid pool",
        ),
        (
            "POST",
            format!("/v1/ipam/{ip}?owner={}", enc(forged)),
            None,
            "invalid owner",
        ),
        (
            "PUT",
            "/v1/endpoint/cilium-local:0".into(),
            Some(endpoint(serde_json::json!({"container-id": "../../x"}))),
            "invalid container-id \"../../x\"",
        ),
        (
            "PUT",
            "/v1/endpoint/cilium-local:0".into(),
            Some(endpoint(serde_json::json!({"k8s-pod-name": forged}))),
            "invalid k8s-pod-name",
        ),
        (
            "PUT",
            "/v1/endpoint/cilium-local:0".into(),
            Some(endpoint(serde_json::json!({"interface-name": "../lxc"}))),
            "invalid interface-name",
        ),
        (
            "DELETE",
            "/v1/endpoint".into(),
            Some(br#"{"container-id":"../../x"}"#.to_vec()),
            "invalid container-id",
        ),
        (
            "POST",
            "/v1/cni/report".into(),
            Some(
                serde_json::json!({"verb": "ADD", "container-id": "c0ffee", "owner": forged})
                    .to_string()
                    .into_bytes(),
            ),
            "invalid owner",
        ),
        (
            "POST",
            "/v1/cni/gc".into(),
            Some(br#"{"network":"a\nb","valid-attachments":[]}"#.to_vec()),
            "invalid network",
        ),
        (
            "GET",
            format!("/v1/explain?q={}", enc(forged)),
            None,
            "invalid q",
        ),
    ];
    for (method, path, body, want) in cases {
        match c.call(method, &path, &[], body) {
            Err(ClientError::Status {
                status, message, ..
            }) => {
                assert_eq!(status, 400, "{method} {path}: {message}");
                assert!(message.contains(want), "{method} {path}: {message}");
            }
            other => panic!("{method} {path}: want 400, got {other:?}"),
        }
    }
    assert_eq!(node.allocations(), before, "a refused request allocated");
    let log = node.log();
    assert!(
        log.contains("request refused") && log.contains("\\n2030-01-01"),
        "the refusals are logged, escaped:\n{log}"
    );
    for line in log.lines() {
        assert!(
            !line.starts_with("2030-01-01"),
            "a forged log line:\n{line}"
        );
    }

    // The plugin refuses such an attachment before it asks the daemon: code 4.
    let mut sb = node.sandbox();
    for (cid, want) in [
        ("../../x".to_string(), "has invalid characters"),
        ("c".repeat(2000), "longer than 1024 bytes"),
    ] {
        let r = node.plugin(
            "ADD",
            Some(&sb),
            &node.conf("1.1.0"),
            &[("CNI_CONTAINERID", &cid)],
        );
        assert_eq!(r.code(), 4, "{r:?}");
        assert!(r.msg().contains(want), "{}", r.msg());
    }
    sb.ifname = "a/b".into();
    let r = node.add(&sb);
    assert_eq!(r.code(), 4, "{r:?}");
    assert!(r.msg().contains("CNI_IFNAME"), "{}", r.msg());
    assert_eq!(node.allocations(), before);
    // Ordinary names still pass.
    sb.ifname = "eth0".into();
    let r = node.add(&sb);
    assert!(r.ok, "{r:?}");
    assert!(node.del(&sb).ok);
}

#[test]
fn oversized_pod_names_are_refused_and_empty_error_answers_say_the_status() {
    if !root_or_skip("oversized_pod_names") {
        return;
    }
    let node = Node::dual_stack();
    let sb = node.sandbox();
    let before = node.allocations();
    let huge = format!(
        "K8S_POD_NAMESPACE=default;K8S_POD_NAME={}",
        "a".repeat(100_000)
    );
    let long_ns = format!("K8S_POD_NAMESPACE={};K8S_POD_NAME=web-0", "n".repeat(64));
    for (args, key, limit) in [
        (huge.as_str(), "K8S_POD_NAME", "at most 253"),
        (long_ns.as_str(), "K8S_POD_NAMESPACE", "at most 63"),
        (
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web\n0",
            "K8S_POD_NAME",
            "Kubernetes name",
        ),
    ] {
        let r = node.plugin("ADD", Some(&sb), &node.conf("1.1.0"), &[("CNI_ARGS", args)]);
        assert_eq!(r.code(), 4, "{key}: {r:?}");
        let msg = r.msg();
        assert!(
            msg.starts_with(&format!("CNI_ARGS: {key} ")) && msg.contains(limit),
            "{msg}"
        );
        assert!(msg.len() < 400, "the message quotes an excerpt: {msg}");
    }
    assert_eq!(node.allocations(), before);
    assert!(sb.ns.exec(&["ip", "link", "show", "eth0"]).status.code() != Some(0));
    // A request the daemon's HTTP layer refuses without a body (a URI over 64 KiB
    // gets 414): the client's error names the status.
    let long_query = format!("/v1/explain?q={}", "q".repeat(70_000));
    match node.client().call("GET", &long_query, &[], None) {
        Err(e @ ClientError::Status { status: 414, .. }) => assert_eq!(
            e.to_string(),
            "podnet daemon answered HTTP 414 URI Too Long without an error message"
        ),
        other => panic!("want 414, got {other:?}"),
    }
}

#[test]
fn unreadable_queue_entries_show_in_status_and_metrics_until_removed() {
    if !root_or_skip("unreadable_queue_entries") {
        return;
    }
    let mut node = Node::dual_stack();
    node.stop_daemon(false);
    let queue = node.dir.join("run").join("delete-queue");
    std::fs::create_dir_all(&queue).expect("queue dir");
    std::fs::write(queue.join("0000000000000001.delete"), b"\x00garbage").expect("write");
    std::fs::write(
        queue.join("0000000000000002.delete"),
        br#"{"container-id":"../../x"}"#,
    )
    .expect("write");
    node.start_daemon();
    let bad: Vec<String> = ["0000000000000001.bad", "0000000000000002.bad"]
        .iter()
        .map(|n| queue.join(n).display().to_string())
        .collect();
    let text = node.podnet(&["status"]);
    assert!(
        text.contains(&format!(
            "DEL queue:  0 waiting, 2 unreadable (moved aside: {}, {}; remove them after checking)",
            bad[0], bad[1]
        )),
        "{text}"
    );
    assert!(
        text.contains("State:      Warning (2 unreadable DEL-queue entries set aside"),
        "{text}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&node.podnet(&["status", "-o", "json"])).expect("json");
    assert_eq!(v["status"]["ipam"]["queue-unreadable"], 2);
    assert_eq!(
        v["status"]["ipam"]["queue-unreadable-files"],
        serde_json::json!(bad)
    );
    let metrics = |node: &Node| {
        let r = node
            .client()
            .call("GET", "/metrics", &[], None)
            .expect("metrics");
        String::from_utf8_lossy(&r.body).to_string()
    };
    assert!(
        metrics(&node).contains("\npodnet_delete_queue_bad_entries 2\n"),
        "{}",
        metrics(&node)
    );
    // A warning, not a failure: CNI STATUS still says ready.
    let st = node.plugin("STATUS", None, &node.conf("1.1.0"), &[]);
    assert!(st.ok, "{st:?}");
    // Once removed, the warning goes (no restart needed).
    for b in &bad {
        std::fs::remove_file(b).expect("remove");
    }
    let text = node.podnet(&["status"]);
    assert!(text.contains("DEL queue:  0 waiting\n"), "{text}");
    assert!(text.contains("State:      Ok\n"), "{text}");
    assert!(metrics(&node).contains("\npodnet_delete_queue_bad_entries 0\n"));
}
