//! Proxy neighbour entries (`ip -6 neigh add proxy <ip> dev <if>`): proxy NDP
//! for IPv6 (and proxy ARP entries for IPv4), add / delete / list.

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};

use super::addr::family_of;
use super::error::Result;
use super::route::IpFamily;
use super::socket::{NetlinkSocket, Request};

fn proxy_message(index: u32, ip: IpAddr) -> NeighbourMessage {
    let mut msg = NeighbourMessage::default();
    msg.header.family = family_of(&ip);
    msg.header.ifindex = index;
    msg.header.flags = NeighbourFlags::Proxy;
    msg.header.state = NeighbourState::Permanent;
    let dst = match ip {
        IpAddr::V4(a) => NeighbourAddress::Inet(a),
        IpAddr::V6(a) => NeighbourAddress::Inet6(a),
    };
    msg.attributes.push(NeighbourAttribute::Destination(dst));
    msg
}

impl NetlinkSocket {
    /// Add a proxy neighbour entry for `ip` on link `index` (RTM_NEWNEIGH with
    /// NTF_PROXY). Idempotent: the kernel ignores NLM_F_EXCL for proxy
    /// entries, so re-adding an existing entry succeeds.
    pub fn add_proxy_neighbour(&self, index: u32, ip: IpAddr) -> Result<()> {
        self.perform(self.add_proxy_neighbour_request(index, ip))
    }

    /// [`add_proxy_neighbour`](Self::add_proxy_neighbour), built for a
    /// [`batch`](Self::batch).
    pub fn add_proxy_neighbour_request(&self, index: u32, ip: IpAddr) -> Request<'_> {
        Request {
            msg: RouteNetlinkMessage::NewNeighbour(proxy_message(index, ip)),
            flags: NLM_F_CREATE | NLM_F_EXCL,
            ctx: Box::new(move || {
                format!(
                    "adding proxy neighbour {ip} on link #{index}{}",
                    self.where_()
                )
            }),
        }
    }

    /// Delete the proxy neighbour entry for `ip` on link `index` (ENOENT when absent).
    pub fn delete_proxy_neighbour(&self, index: u32, ip: IpAddr) -> Result<()> {
        let mut msg = proxy_message(index, ip);
        msg.header.state = NeighbourState::None;
        self.request(RouteNetlinkMessage::DelNeighbour(msg), 0, || {
            format!(
                "deleting proxy neighbour {ip} on link #{index}{}",
                self.where_()
            )
        })
        .map(|_| ())
    }

    /// IPv6 proxy NDP entries on link `index`.
    pub fn list_proxy_neighbours(&self, index: u32) -> Result<Vec<IpAddr>> {
        self.list_proxy_entries(IpFamily::V6, index)
    }

    /// Proxy entries of `family` on link `index` (0 = every link).
    pub fn list_proxy_entries(&self, family: IpFamily, index: u32) -> Result<Vec<IpAddr>> {
        let mut req = NeighbourMessage::default();
        req.header.family = family.to_nl();
        req.header.flags = NeighbourFlags::Proxy;
        let msgs = self.dump(RouteNetlinkMessage::GetNeighbour(req), || {
            format!("listing proxy neighbours of link #{index}{}", self.where_())
        })?;
        let mut out = Vec::new();
        for m in msgs {
            let RouteNetlinkMessage::NewNeighbour(n) = m else {
                continue;
            };
            if !n.header.flags.contains(NeighbourFlags::Proxy)
                || (index != 0 && n.header.ifindex != index)
            {
                continue;
            }
            for attr in n.attributes {
                match attr {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => {
                        out.push(IpAddr::V4(a))
                    }
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                        out.push(IpAddr::V6(a))
                    }
                    _ => {}
                }
            }
        }
        Ok(out)
    }
}
