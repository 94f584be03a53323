//! The pod's link: a veth (or netkit) pair created in one request, the pod end
//! directly in the pod's netns under its final name; and, for a retried ADD, what a
//! previous attempt for this attachment left removed first.

use crate::cni::CniError;
use crate::datapath::{DatapathError, NetkitMode, NetkitSpec, VethSpec, random_mac};

use super::super::datapath_errors::dp;
use super::sides::Sides;

/// The pair `create_pair` made: both ends' indexes (each in its netns) and
/// MACs (none for netkit in L3 mode).
pub(super) struct LinkPair {
    pub host_index: u32,
    pub pod_index: u32,
    pub host_mac: Option<[u8; 6]>,
    pub pod_mac: Option<[u8; 6]>,
}

/// Creates the veth (or netkit) pair of datapath `mode` in one request, the pod
/// end directly in the pod netns under its final name. veth and netkit-l2 carry
/// Ethernet headers and get random MACs (set explicitly, so systemd's
/// MACAddressPolicy leaves them alone); netkit in L3 mode has none. When a name is
/// taken (EEXIST), a previous attempt's pair is removed (or another plugin's
/// interface refused) and the creation retried once.
pub(super) fn create_pair(sides: &Sides<'_>, mode: &str, mtu: u32) -> Result<LinkPair, CniError> {
    let (host_mac, pod_mac) = if mode == "netkit" {
        (None, None)
    } else {
        (
            Some(random_mac().map_err(dp("generating a MAC address"))?),
            Some(random_mac().map_err(dp("generating a MAC address"))?),
        )
    };
    let macs = (host_mac, pod_mac);
    let (host_index, pod_index) = match new_pair(sides, mode, macs, mtu) {
        Err(e) if e.is_exists() => {
            clear_previous_attempt(sides)?;
            new_pair(sides, mode, macs, mtu)
        }
        created => created,
    }
    .map_err(dp("unable to set up link on host side"))?;
    let pod_index = match pod_index {
        Some(index) => index,
        None => pod_index_by_name(sides)?,
    };
    Ok(LinkPair {
        host_index,
        pod_index,
        host_mac,
        pod_mac,
    })
}

/// One attempt at creating the pair (`create_pair`): the host end's index, and
/// the pod end's when known. A veth's ends are looked up by ioctl; a netkit
/// primary comes back from the kernel, whose IFLA_LINK is the pod end's index
/// in the pod netns (0 when the peer is gone; older kernels leave it out when
/// it equals the host end's own index, and then the pod end is looked up by
/// name).
fn new_pair(
    sides: &Sides<'_>,
    mode: &str,
    (host_mac, pod_mac): (Option<[u8; 6]>, Option<[u8; 6]>),
    mtu: u32,
) -> Result<(u32, Option<u32>), DatapathError> {
    let (host_name, peer_name) = (sides.host_name.as_str(), sides.ifname);
    match mode {
        "netkit" | "netkit-l2" => sides
            .host_sock
            .create_netkit_pair(&NetkitSpec {
                mode: if mode == "netkit" {
                    NetkitMode::L3
                } else {
                    NetkitMode::L2
                },
                host_name,
                host_mac,
                peer_name,
                peer_mac: pod_mac,
                mtu,
                peer_netns: &sides.netns,
                txqlen: Some(1000),
                headroom: 0,
                tailroom: 0,
            })
            .map(|host| (host.index, host.link.filter(|&i| i != 0))),
        _ => sides
            .host_sock
            .create_veth_pair_indexes(
                &VethSpec {
                    host_name,
                    host_mac,
                    peer_name,
                    peer_mac: pod_mac,
                    mtu,
                    peer_netns: &sides.netns,
                    txqlen: Some(1000),
                },
                &sides.pod_sock,
            )
            .map(|(host, pod)| (host, Some(pod))),
    }
}

/// The pod end's index found by its name, when the host end's IFLA_LINK did
/// not say.
fn pod_index_by_name(sides: &Sides<'_>) -> Result<u32, CniError> {
    sides
        .pod_sock
        .link_by_name(sides.ifname)
        .map_err(dp("finding the pod interface"))?
        .ok_or_else(|| {
            CniError::datapath_failure(format!(
                "{} did not appear in {}",
                sides.ifname,
                sides.netns_path.display()
            ))
        })
        .map(|pod| pod.index)
}

/// A retried ADD: remove what a previous attempt for this attachment left (its
/// host link, which takes the pod end along), or refuse an interface named
/// `ifname` in the pod that has no such twin. Both lookups are ioctls.
pub(super) fn clear_previous_attempt(sides: &Sides<'_>) -> Result<(), CniError> {
    let (host_name, ifname) = (sides.host_name.as_str(), sides.ifname);
    let ours = sides
        .host_sock
        .link_index(host_name)
        .map_err(dp("looking up the host side"))?
        .is_some();
    let in_pod = sides.pod_has_ifname()?;
    if in_pod && !ours {
        return Err(CniError::interface_exists(format!(
            "interface {ifname} already exists in {} and was not created by podnet for this container; refusing to replace it (pick another CNI_IFNAME or remove it)",
            sides.netns_path.display()
        )));
    }
    if ours {
        tracing::info!(
            host = host_name,
            "removing the interface pair of a previous ADD of this attachment"
        );
        sides
            .host_sock
            .delete_link_by_name(host_name)
            .map_err(dp("removing the previous host side"))?;
    }
    Ok(())
}
