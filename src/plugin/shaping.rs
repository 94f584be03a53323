//! A pod's bandwidth limit (`runtimeConfig.bandwidth`, with the daemon's
//! `--enable-bandwidth-manager`), set at ADD and compared at CHECK, all on the
//! host side, where a pod with CAP_NET_ADMIN cannot reach it
//! (docs/bandwidth.md):
//!
//! - traffic to the pod (`ingress*`): a root TBF on the host link `lxc…`, which
//!   sends what the pod receives;
//! - traffic from the pod (`egress*`): the ingress qdisc on the host link with a
//!   match-all `u32` filter redirecting everything to the attachment's IFB device
//!   (`ifb…`, the host link's hash), whose root TBF shapes it.
//!
//! The IFB goes with the pod: DEL hands it to the daemon with the host link,
//! GC and the rollback of a failed ADD delete it.

use crate::cni::CniError;
use crate::cni::bandwidth::{BandwidthLimits, Shape};
use crate::datapath::{IFB_ALIAS, NetlinkSocket, TBF_HANDLE, TbfParams};

use super::datapath_errors::dp;

/// The Ethernet header a TBF counts with each packet.
const ETH_HLEN: u32 = 14;
/// The MTU of a link whose MTU the daemon leaves to the kernel.
const DEFAULT_MTU: u32 = 1500;

/// The TBF of one direction's limit.
fn tbf(s: &Shape) -> TbfParams {
    TbfParams::new(s.rate_bytes(), s.burst_bytes())
}

/// The largest packet a TBF on a link of `mtu` sees (0: the kernel's default).
pub fn packet_bytes(mtu: u32) -> u32 {
    (if mtu == 0 { DEFAULT_MTU } else { mtu }).saturating_add(ETH_HLEN)
}

/// Shapes the pod's traffic on its host link `host_index`: the TBF for traffic
/// to the pod, and for traffic from it the IFB `ifb_name` (created with `mtu`,
/// up, marked) with its TBF, then the ingress qdisc and the redirect. Each
/// bucket must hold one packet of `mtu` (code 7). A failure leaves the IFB to
/// the caller's rollback.
pub fn apply(
    sock: &NetlinkSocket,
    host_index: u32,
    ifb_name: &str,
    limits: &BandwidthLimits,
    mtu: u32,
) -> Result<(), CniError> {
    limits.check_bursts_hold(packet_bytes(mtu))?;
    if let Some(s) = &limits.ingress {
        sock.perform(sock.tbf_request(host_index, &tbf(s)))
            .map_err(dp("shaping the traffic to the pod"))?;
    }
    if let Some(s) = &limits.egress {
        let ifb = sock
            .create_ifb(ifb_name, mtu)
            .map_err(dp("creating the pod's IFB device"))?;
        let steps = [
            sock.link_up_with_alias_request(ifb.index, IFB_ALIAS),
            sock.tbf_request(ifb.index, &tbf(s)),
            sock.ingress_qdisc_request(host_index),
            sock.redirect_request(host_index, ifb.index),
        ];
        for outcome in sock
            .batch(steps.into())
            .map_err(dp("shaping the traffic from the pod"))?
        {
            outcome.map_err(dp("shaping the traffic from the pod"))?;
        }
    }
    Ok(())
}

/// CHECK: the qdiscs and the redirect `apply` set for `limits` are there with
/// their rates; the first difference is code 103.
pub fn check(
    sock: &NetlinkSocket,
    host_index: u32,
    host_name: &str,
    ifb_name: &str,
    limits: &BandwidthLimits,
) -> Result<(), CniError> {
    if let Some(s) = &limits.ingress {
        check_tbf(sock, host_index, host_name, &tbf(s), "ingressRate")?;
    }
    let Some(s) = &limits.egress else {
        return Ok(());
    };
    let ifb = sock
        .link_by_name(ifb_name)
        .map_err(dp("looking up the pod's IFB device"))?
        .ok_or_else(|| {
            CniError::check_mismatch(format!(
                "the IFB device {ifb_name} that shapes the pod's egress is missing"
            ))
        })?;
    let qdiscs = sock
        .qdiscs(host_index)
        .map_err(dp("listing the host side's qdiscs"))?;
    if !qdiscs.iter().any(|q| q.kind == "ingress") {
        return Err(CniError::check_mismatch(format!(
            "the ingress qdisc on {host_name} that redirects the pod's egress to {ifb_name} is missing"
        )));
    }
    let targets = sock
        .ingress_redirects(host_index)
        .map_err(dp("listing the host side's ingress filters"))?;
    if !targets.contains(&ifb.index) {
        return Err(CniError::check_mismatch(format!(
            "the filter on {host_name} that redirects the pod's egress to {ifb_name} is missing"
        )));
    }
    check_tbf(sock, ifb.index, ifb_name, &tbf(s), "egressRate")
}

/// The root qdisc of link `index` is podnet's TBF of `want`'s rate and queue.
fn check_tbf(
    sock: &NetlinkSocket,
    index: u32,
    name: &str,
    want: &TbfParams,
    field: &str,
) -> Result<(), CniError> {
    let qdiscs = sock
        .qdiscs(index)
        .map_err(dp("listing the qdiscs of a shaped link"))?;
    let root = qdiscs
        .iter()
        .find(|q| q.handle == TBF_HANDLE && q.kind == "tbf");
    let Some(reading) = root.and_then(|q| q.tbf) else {
        let kinds: Vec<&str> = qdiscs.iter().map(|q| q.kind.as_str()).collect();
        return Err(CniError::check_mismatch(format!(
            "the tbf qdisc of {field} ({} bits/s) on {name} is missing (its qdiscs: {kinds:?})",
            want.rate_bytes * 8
        )));
    };
    if reading.rate_bytes != want.rate_bytes || reading.limit_bytes != want.limit_bytes {
        return Err(CniError::check_mismatch(format!(
            "the tbf qdisc on {name} shapes {} bits/s with a {}-byte queue, but {field} asks for {} bits/s with a {}-byte queue",
            reading.rate_bytes * 8,
            reading.limit_bytes,
            want.rate_bytes * 8,
            want.limit_bytes
        )));
    }
    Ok(())
}

/// Deletes the attachment's IFB device, if there is one (rollback, and DEL
/// without a daemon). Only a device of kind `ifb` is deleted.
pub fn remove_ifb(sock: &NetlinkSocket, ifb_name: &str) -> Result<(), CniError> {
    match sock
        .link_by_name(ifb_name)
        .map_err(dp("looking up the pod's IFB device"))?
    {
        Some(l) if l.kind.as_deref() == Some("ifb") => match sock.delete_link(l.index) {
            Err(e) if !e.is_not_found() => Err(dp("deleting the pod's IFB device")(e)),
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::tests::{in_private_netns, root};
    use crate::datapath::{NetNs, VethSpec};
    use netlink_packet_route::RouteNetlinkMessage;
    use netlink_packet_route::tc::{TcHandle, TcMessage};

    /// Deletes the qdisc of link `index` under `parent` (the test's hand, not
    /// podnet's: the product never deletes a qdisc, the link takes it along).
    fn delete_qdisc(sock: &NetlinkSocket, index: u32, parent: TcHandle) {
        let mut msg = TcMessage::with_index(index as i32);
        msg.header.parent = parent;
        sock.request(RouteNetlinkMessage::DelQueueDiscipline(msg), 0, || {
            "deleting a qdisc".into()
        })
        .unwrap();
    }

    fn shape(rate_bits: u64, burst_bits: u64) -> Option<Shape> {
        Some(Shape {
            rate_bits,
            burst_bits,
        })
    }

    #[test]
    fn apply_then_check_and_each_missing_part_is_a_mismatch() {
        if !root("apply_then_check_and_each_missing_part_is_a_mismatch") {
            return;
        }
        in_private_netns(|| {
            let sock = NetlinkSocket::new().unwrap();
            let here = NetNs::current().unwrap();
            let spec = VethSpec {
                host_name: "lxcshape0",
                host_mac: None,
                peer_name: "podshape0",
                peer_mac: None,
                mtu: 1500,
                peer_netns: &here,
                txqlen: None,
            };
            let host = sock.create_veth_pair(&spec).unwrap().index;
            let (name, ifb) = ("lxcshape0", "ifbshape0");
            let limits = BandwidthLimits {
                ingress: shape(10_000_000, u64::from(u32::MAX)),
                egress: shape(1_000_000, 800_000),
            };
            // A bucket below one packet of the MTU: code 7, nothing set.
            let tiny = BandwidthLimits {
                egress: shape(1_000_000, 8_000),
                ..limits
            };
            let e = apply(&sock, host, ifb, &tiny, 1500).unwrap_err();
            assert_eq!(e.code, CniError::INVALID_NETWORK_CONFIG, "{e:?}");
            assert!(sock.link_by_name(ifb).unwrap().is_none());
            assert!(sock.qdiscs(host).unwrap().iter().all(|q| q.kind != "tbf"));

            apply(&sock, host, ifb, &limits, 1500).unwrap();
            check(&sock, host, name, ifb, &limits).unwrap();
            let ifb_link = sock.link_by_name(ifb).unwrap().unwrap();
            assert_eq!(ifb_link.alias.as_deref(), Some(IFB_ALIAS));
            assert!(ifb_link.up);

            // Another rate than the one set.
            let other = BandwidthLimits {
                ingress: shape(20_000_000, u64::from(u32::MAX)),
                egress: None,
            };
            let e = check(&sock, host, name, ifb, &other).unwrap_err();
            assert_eq!(e.code, CniError::CHECK_MISMATCH);
            assert!(e.msg.contains("shapes 10000000 bits/s"), "{}", e.msg);
            assert!(e.msg.contains("asks for 20000000 bits/s"), "{}", e.msg);

            // The IFB's TBF removed.
            let ifb_index = ifb_link.index;
            delete_qdisc(&sock, ifb_index, TcHandle::ROOT);
            let e = check(&sock, host, name, ifb, &limits).unwrap_err();
            assert!(e.msg.contains("tbf qdisc of egressRate"), "{}", e.msg);
            assert!(e.msg.contains(ifb), "{}", e.msg);
            // The ingress qdisc (and its filter with it) removed.
            delete_qdisc(&sock, host, TcHandle::INGRESS);
            let e = check(&sock, host, name, ifb, &limits).unwrap_err();
            assert!(e.msg.contains("ingress qdisc on lxcshape0"), "{}", e.msg);
            // The host link's TBF removed.
            delete_qdisc(&sock, host, TcHandle::ROOT);
            let e = check(&sock, host, name, ifb, &limits).unwrap_err();
            assert!(e.msg.contains("tbf qdisc of ingressRate"), "{}", e.msg);
            // The IFB removed, twice: the second finds none.
            remove_ifb(&sock, ifb).unwrap();
            assert!(sock.link_by_name(ifb).unwrap().is_none());
            remove_ifb(&sock, ifb).unwrap();
            let egress_only = BandwidthLimits {
                ingress: None,
                ..limits
            };
            let e = check(&sock, host, name, ifb, &egress_only).unwrap_err();
            assert!(e.msg.contains("IFB device ifbshape0"), "{}", e.msg);
            // remove_ifb leaves a link of that name that is no IFB alone.
            remove_ifb(&sock, name).unwrap();
            assert!(sock.link_by_name(name).unwrap().is_some());
        });
    }

    #[test]
    fn the_packet_is_the_mtu_and_an_ethernet_header() {
        assert_eq!(packet_bytes(0), 1514);
        assert_eq!(packet_bytes(1450), 1464);
        assert_eq!(packet_bytes(9000), 9014);
        assert_eq!(packet_bytes(u32::MAX), u32::MAX);
    }
}
