//! Traffic control: a TBF, the ingress qdisc and its redirect to an IFB device,
//! read back through the dumps and, where `tc` is installed, by `tc` itself.

use std::process::Command;

use super::{in_private_netns, root};
use crate::datapath::*;

/// A veth pair with both ends here (`a` up), and `a`'s index.
fn pair(a: &str, b: &str) -> (NetlinkSocket, u32) {
    let sock = NetlinkSocket::new().unwrap();
    let here = NetNs::current().unwrap();
    let spec = VethSpec {
        host_name: a,
        host_mac: None,
        peer_name: b,
        peer_mac: None,
        mtu: 1500,
        peer_netns: &here,
        txqlen: None,
    };
    let index = sock.create_veth_pair(&spec).unwrap().index;
    sock.set_link_up(index).unwrap();
    (sock, index)
}

/// `tc`'s own reading (`tc -j …`), when iproute2 is installed.
fn tc_json(args: &[&str]) -> Option<serde_json::Value> {
    let out = Command::new("tc").arg("-j").args(args).output().ok()?;
    assert!(out.status.success(), "tc {args:?}: {:?}", out);
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

#[test]
fn a_tbf_replaces_the_root_qdisc_and_reads_back() {
    if !root("a_tbf_replaces_the_root_qdisc_and_reads_back") {
        return;
    }
    in_private_netns(|| {
        let (sock, index) = pair("lxctbf0", "peertbf0");
        let p = TbfParams::new(125_000, 16_384);
        sock.perform(sock.tbf_request(index, &p)).unwrap();
        let q = sock.qdiscs(index).unwrap();
        let tbf = q.iter().find(|q| q.kind == "tbf").expect("a tbf");
        assert_eq!(tbf.handle, TBF_HANDLE);
        assert_eq!(
            tbf.tbf,
            Some(TbfReading {
                rate_bytes: 125_000,
                limit_bytes: 3_125 + 16_384
            })
        );
        // Replacing it changes it in place; a rate above u32 bytes/s goes in RATE64.
        let fast = TbfParams::new(5_000_000_000, 1_000_000);
        sock.perform(sock.tbf_request(index, &fast)).unwrap();
        let q = sock.qdiscs(index).unwrap();
        let tbfs: Vec<_> = q.iter().filter(|q| q.kind == "tbf").collect();
        assert_eq!(tbfs.len(), 1, "{q:?}");
        assert_eq!(tbfs[0].tbf.unwrap().rate_bytes, 5_000_000_000);
        if let Some(v) = tc_json(&["qdisc", "show", "dev", "lxctbf0"]) {
            let root = v
                .as_array()
                .unwrap()
                .iter()
                .find(|q| q["kind"] == "tbf")
                .unwrap();
            assert_eq!(root["handle"], "1:");
            assert_eq!(root["options"]["rate"], 5_000_000_000u64);
            // tc derives the bucket from its time: within 1 %.
            let burst = root["options"]["burst"].as_u64().unwrap();
            assert!(burst.abs_diff(1_000_000) < 10_000, "{root}");
        }
    });
}

#[test]
fn the_ingress_redirect_reaches_an_ifb() {
    if !root("the_ingress_redirect_reaches_an_ifb") {
        return;
    }
    in_private_netns(|| {
        let (sock, index) = pair("lxcred0", "peerred0");
        let ifb = sock.create_ifb("ifbred0", 9000).unwrap();
        assert_eq!(
            (ifb.kind.as_deref(), ifb.mtu, ifb.up),
            (Some("ifb"), 9000, false)
        );
        // A second creation finds the one there (a repeated ADD).
        assert_eq!(sock.create_ifb("ifbred0", 9000).unwrap().index, ifb.index);
        // A link of that name that is no IFB is not taken for one.
        let e = sock.create_ifb("peerred0", 1500).unwrap_err();
        assert!(e.is_exists(), "{e}");
        let outcomes = sock
            .batch(vec![
                sock.ingress_qdisc_request(index),
                sock.redirect_request(index, ifb.index),
            ])
            .unwrap();
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
        let q = sock.qdiscs(index).unwrap();
        assert!(q.iter().any(|q| q.kind == "ingress"), "{q:?}");
        assert_eq!(sock.ingress_redirects(index).unwrap(), vec![ifb.index]);
        // The other link has none.
        let peer = sock.link_index("peerred0").unwrap().unwrap();
        assert_eq!(sock.ingress_redirects(peer).unwrap(), Vec::<u32>::new());
        if let Some(v) = tc_json(&["filter", "show", "dev", "lxcred0", "ingress"]) {
            let text = v.to_string();
            assert!(text.contains("\"to_dev\":\"ifbred0\""), "{text}");
            assert!(text.contains("\"mirred_action\":\"redirect\""), "{text}");
        }
        // The ingress qdisc is there once.
        let again = sock.perform(sock.ingress_qdisc_request(index)).unwrap_err();
        assert!(again.is_exists(), "{again}");
        sock.delete_link(ifb.index).unwrap();
        assert!(sock.link_by_name("ifbred0").unwrap().is_none());
    });
}
