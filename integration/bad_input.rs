//! Bad input to the plugin and the API: each gets a clear error with the right CNI
//! code or HTTP status, and leaves no allocation, link or route behind.

use crate::harness::*;

fn assert_nothing_left(node: &Node, allocs_before: usize) {
    assert_eq!(
        node.allocations().len(),
        allocs_before,
        "an allocation was left behind"
    );
    assert!(
        node.host_links().is_empty(),
        "a host link was left behind: {:?}",
        node.host_links()
    );
}

#[test]
fn bad_plugin_input_gets_the_right_cni_code() {
    if !root_or_skip("bad_plugin_input") {
        return;
    }
    let node = Node::dual_stack();
    let a = node.sandbox();
    let base = node.allocations().len();
    let cases: Vec<(&str, String, u64, &str)> = vec![
        ("malformed JSON", "{not json".into(), 6, "JSON"),
        (
            "missing cniVersion",
            r#"{"name":"n","type":"podnet"}"#.into(),
            7,
            "cniVersion",
        ),
        (
            "unsupported version",
            r#"{"cniVersion":"9.9.9","name":"n","type":"podnet"}"#.into(),
            1,
            "9.9.9",
        ),
        (
            "missing name",
            r#"{"cniVersion":"1.1.0","type":"podnet"}"#.into(),
            7,
            "name",
        ),
    ];
    for (what, conf, code, needle) in cases {
        let r = node.plugin("ADD", Some(&a), &conf, &[]);
        assert_eq!(r.code(), code, "{what}: {r:?}");
        assert!(
            r.msg().contains(needle) || r.json()["details"].as_str().unwrap_or("").contains(needle),
            "{what}: {r:?}"
        );
        assert!(
            r.stdout.starts_with('{'),
            "{what}: error JSON must go to stdout"
        );
    }
    // Missing CNI variables: code 4 naming them.
    let r = node.plugin("ADD", None, &node.conf("1.1.0"), &[]);
    assert_eq!(r.code(), 4);
    assert!(
        r.msg().contains("CNI_CONTAINERID") && r.msg().contains("CNI_NETNS"),
        "{}",
        r.msg()
    );
    // Unknown CNI_ARGS without IgnoreUnknown: code 4.
    let r = node.plugin(
        "ADD",
        Some(&a),
        &node.conf("1.1.0"),
        &[("CNI_ARGS", "FOO=bar")],
    );
    assert_eq!(r.code(), 4, "{r:?}");
    // A netns that does not exist: code 3, nothing allocated.
    let r = node.plugin(
        "ADD",
        Some(&a),
        &node.conf("1.1.0"),
        &[("CNI_NETNS", "/run/netns/does-not-exist-podnet")],
    );
    assert_eq!(r.code(), 3, "{r:?}");
    assert!(r.msg().contains("does-not-exist-podnet"));
    // A socket-path with no daemon: 11 on ADD, 50 on STATUS.
    let conf = serde_json::json!({"cniVersion":"1.1.0","name":"n","type":"podnet","socket-path":"/run/podnet-nothing-here.sock"}).to_string();
    let r = node.plugin("ADD", Some(&a), &conf, &[]);
    assert_eq!(r.code(), 11, "{r:?}");
    assert!(r.msg().contains("/run/podnet-nothing-here.sock"));
    assert_eq!(node.plugin("STATUS", None, &conf, &[]).code(), 50);
    // An unknown command.
    assert_eq!(
        node.plugin("FROB", Some(&a), &node.conf("1.1.0"), &[])
            .code(),
        4
    );
    assert_nothing_left(&node, base);
    assert!(a.ns.exec(&["ip", "link", "show", "eth0"]).status.code() != Some(0));
}

#[test]
fn bad_api_requests_get_precise_statuses() {
    if !root_or_skip("bad_api") {
        return;
    }
    let node = Node::dual_stack();
    let c = node.client();
    let base = node.allocations().len();
    let status_of =
        |r: Result<podnet::api::http::RawResponse, podnet::api::client::ClientError>| match r {
            Ok(resp) => resp.status,
            Err(e) => e.status().unwrap_or(0),
        };
    for (method, path, want) in [
        ("POST", "/v1/ipam?family=ipv5", 400),
        ("POST", "/v1/ipam?family=IPV4", 400),
        ("POST", "/v1/ipam/not-an-ip", 400),
        ("DELETE", "/v1/ipam/10.1.2.300", 400),
        ("POST", "/v1/ipam?pool=mars", 400),
        ("POST", "/v1/ipam/192.0.2.1", 409),
    ] {
        assert_eq!(
            status_of(c.call(method, path, &[], None)),
            want,
            "{method} {path}"
        );
    }
    assert_eq!(
        status_of(c.call(
            "PUT",
            "/v1/endpoint/cilium-local:0",
            &[],
            Some(b"{garbage".to_vec())
        )),
        400
    );
    assert_eq!(
        status_of(c.call(
            "DELETE",
            "/v1/endpoint",
            &[],
            Some(br#"{"container-id":""}"#.to_vec())
        )),
        400
    );
    assert_eq!(status_of(c.call("GET", "/v1/nothing", &[], None)), 404);
    assert_eq!(
        status_of(c.call(
            "PUT",
            "/v1/endpoint/x",
            &[],
            Some(vec![b' '; 2 * 1024 * 1024])
        )),
        413
    );
    // The router address cannot be released through the API.
    let router = node.ipv4_addressing().ip;
    assert_eq!(
        status_of(c.call("DELETE", &format!("/v1/ipam/{router}"), &[], None)),
        409
    );
    assert_eq!(node.allocations().len(), base);
    // A specific address can be taken and given back; taking it twice is a conflict.
    let range: ipnet::IpNet = node.ipv4_addressing().alloc_range.parse().expect("range");
    let ip = range.hosts().nth(100).expect("host").to_string();
    assert_eq!(
        status_of(c.call("POST", &format!("/v1/ipam/{ip}?owner=manual"), &[], None)),
        200
    );
    assert_eq!(
        status_of(c.call("POST", &format!("/v1/ipam/{ip}?owner=manual"), &[], None)),
        409
    );
    assert_eq!(
        node.allocations().get(&ip).map(String::as_str),
        Some("manual")
    );
    assert_eq!(
        status_of(c.call("DELETE", &format!("/v1/ipam/{ip}"), &[], None)),
        200
    );
    assert_eq!(node.allocations().len(), base);
}
