//! The kernel shaper in a private netns: what ADD sets is read back as
//! needing nothing (the loop never fights ADD), a limit set, changed and
//! removed (its IFB deleted), an invalid value leaving it, and a link whose
//! ADD has not finished left alone.

use crate::cni::bandwidth::BandwidthLimits;
use crate::daemon::bandwidth_loop::annotations::{EGRESS, INGRESS, Wanted, wanted};
use crate::daemon::bandwidth_loop::kernel::{Kernel, Shaper};
use crate::daemon::bandwidth_loop::plan::{Observed, plan};
use crate::datapath::link_marker::{JournalMark, LinkMarker};
use crate::datapath::tests::{in_private_netns, root};
use crate::datapath::{NetNs, NetlinkSocket, VethSpec};
use crate::plugin::shaping;

const HOST: &str = "lxc0123456789ab";
const IFB: &str = "ifb0123456789ab";

/// A veth pair whose host end is `HOST`; returns its index.
fn pair(sock: &NetlinkSocket) -> u32 {
    let here = NetNs::current().unwrap();
    let spec = VethSpec {
        host_name: HOST,
        host_mac: None,
        peer_name: "podbw0",
        peer_mac: None,
        mtu: 1500,
        peer_netns: &here,
        txqlen: None,
    };
    sock.create_veth_pair(&spec).unwrap().index
}

fn limits(ingress: &Wanted, egress: &Wanted) -> BandwidthLimits {
    let shape = |w: &Wanted| match w {
        Wanted::Limit(s) => Some(*s),
        _ => None,
    };
    BandwidthLimits {
        ingress: shape(ingress),
        egress: shape(egress),
    }
}

/// Plans `ingress`/`egress` against the link and writes it; returns the steps.
fn converge(k: &mut Kernel, ingress: &Wanted, egress: &Wanted) -> usize {
    let seen = k.observe(HOST).unwrap().expect("the link is there, wired");
    let steps = plan(ingress, egress, &seen);
    k.write(HOST, &steps).unwrap();
    let after = k.observe(HOST).unwrap().unwrap();
    assert_eq!(plan(ingress, egress, &after), vec![], "{after:?}");
    steps.len()
}

#[test]
fn set_change_and_remove_on_the_kernel() {
    if !root("set_change_and_remove_on_the_kernel") {
        return;
    }
    in_private_netns(|| {
        let mut k = Kernel(NetlinkSocket::new().unwrap());
        assert_eq!(k.observe(HOST).unwrap(), None);
        let host = pair(&k.0);
        assert_eq!(k.observe(HOST).unwrap(), Some(Observed::default()));

        // What ADD sets from containerd's runtimeConfig for "10M"/"1M" is
        // what the loop wants for the same annotations: nothing to write.
        let (i10, e1) = (wanted(INGRESS, Some("10M")), wanted(EGRESS, Some("1M")));
        shaping::apply(&k.0, host, IFB, &limits(&i10, &e1), 1500).unwrap();
        let seen = k.observe(HOST).unwrap().unwrap();
        assert_eq!(plan(&i10, &e1, &seen), vec![], "{seen:?}");

        // CRI-O's burst (u32::MAX × 8 − 1 bits) at the same rates: left alone too.
        let crio = |w: &Wanted| match w {
            Wanted::Limit(s) => Some(crate::cni::bandwidth::Shape {
                burst_bits: u64::from(u32::MAX) * 8 - 1,
                ..*s
            }),
            _ => None,
        };
        let crio_limits = BandwidthLimits {
            ingress: crio(&i10),
            egress: crio(&e1),
        };
        assert_eq!(converge(&mut k, &Wanted::Unlimited, &Wanted::Unlimited), 3);
        shaping::apply(&k.0, host, IFB, &crio_limits, 1500).unwrap();
        let seen = k.observe(HOST).unwrap().unwrap();
        // None asked either: the same default bucket and queue as containerd's.
        let default = crate::datapath::TbfParams::new(1_250_000, 131_072);
        assert_eq!(
            seen.to_pod.map(|t| t.limit_bytes),
            Some(default.limit_bytes)
        );
        assert_eq!(plan(&i10, &e1, &seen), vec![], "{seen:?}");

        // Changed: both TBFs replaced, ADD's CHECK agrees.
        let (i20, e5) = (wanted(INGRESS, Some("20M")), wanted(EGRESS, Some("500k")));
        assert_eq!(converge(&mut k, &i20, &e5), 2);
        shaping::check(&k.0, host, HOST, IFB, &limits(&i20, &e5)).unwrap();
        assert!(shaping::check(&k.0, host, HOST, IFB, &limits(&i10, &e1)).is_err());

        // An invalid egress keeps it; ingress removed alone.
        let bad = wanted(EGRESS, Some("0"));
        assert!(matches!(bad, Wanted::Invalid(_)));
        assert_eq!(converge(&mut k, &Wanted::Unlimited, &bad), 1);
        let seen = k.observe(HOST).unwrap().unwrap();
        assert_eq!(seen.to_pod, None);
        shaping::check(&k.0, host, HOST, IFB, &limits(&Wanted::Unlimited, &e5)).unwrap();

        // Egress removed: the ingress qdisc, its redirect and the IFB go.
        assert_eq!(converge(&mut k, &Wanted::Unlimited, &Wanted::Unlimited), 2);
        assert_eq!(k.observe(HOST).unwrap(), Some(Observed::default()));
        assert!(k.0.link_by_name(IFB).unwrap().is_none());
        let qdiscs = k.0.qdiscs(host).unwrap();
        assert!(
            qdiscs
                .iter()
                .all(|q| q.kind != "tbf" && q.kind != "ingress"),
            "{qdiscs:?}"
        );

        // Set from nothing by the loop alone: what CHECK asks for ADD's.
        assert_eq!(converge(&mut k, &i10, &e1), 5);
        shaping::check(&k.0, host, HOST, IFB, &limits(&i10, &e1)).unwrap();
        let ifb = k.0.link_by_name(IFB).unwrap().unwrap();
        assert_eq!((ifb.mtu, ifb.up), (1500, true));
        assert_eq!(converge(&mut k, &i10, &e1), 0);
        // Removing twice finds nothing to remove the second time.
        assert_eq!(converge(&mut k, &Wanted::Unlimited, &Wanted::Unlimited), 3);
        assert_eq!(converge(&mut k, &Wanted::Unlimited, &Wanted::Unlimited), 0);
    });
}

#[test]
fn a_link_whose_add_has_not_finished_is_left_to_it() {
    if !root("a_link_whose_add_has_not_finished_is_left_to_it") {
        return;
    }
    in_private_netns(|| {
        let mut k = Kernel(NetlinkSocket::new().unwrap());
        let host = pair(&k.0);
        let mut marker = LinkMarker {
            journal: JournalMark {
                journal_id: "ab".into(),
                seq: 1,
            },
            wired: false,
            container_id: None,
            ifname: None,
            owner: None,
            pod_uid: None,
        };
        k.0.set_link_alias(host, &marker.encode()).unwrap();
        assert_eq!(k.observe(HOST).unwrap(), None);
        marker.wired = true;
        k.0.set_link_alias(host, &marker.encode()).unwrap();
        assert_eq!(k.observe(HOST).unwrap(), Some(Observed::default()));
    });
}
