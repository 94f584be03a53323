//! Interface addresses: add (IPv4 with IFA_LOCAL + IFA_ADDRESS, IPv6 with
//! optional IFA_F_NODAD), list and delete.

use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressScope,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::error::Result;
use super::socket::{NetlinkSocket, Request};

pub(crate) fn family_of(ip: &IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

fn address_message(index: u32, net: &IpNet) -> AddressMessage {
    let mut msg = AddressMessage::default();
    msg.header.family = family_of(&net.addr());
    msg.header.prefix_len = net.prefix_len();
    msg.header.index = index;
    msg.header.scope = AddressScope::Universe;
    msg.attributes.push(AddressAttribute::Local(net.addr()));
    msg.attributes.push(AddressAttribute::Address(net.addr()));
    msg
}

impl NetlinkSocket {
    /// Add `net` (address + prefix length, normally /32 or /128) to link
    /// `index`. IPv4 gets IFA_LOCAL and IFA_ADDRESS (and a broadcast for
    /// prefixes shorter than /31); IPv6 gets IFA_F_NODAD when `nodad`.
    /// EEXIST when the address is already there.
    pub fn add_address(&self, index: u32, net: IpNet, nodad: bool) -> Result<()> {
        self.perform(self.add_address_request(index, net, nodad))
    }

    /// [`add_address`](Self::add_address), built for a [`batch`](Self::batch).
    pub fn add_address_request(&self, index: u32, net: IpNet, nodad: bool) -> Request<'_> {
        let mut msg = address_message(index, &net);
        match net {
            IpNet::V4(v4) => {
                if v4.prefix_len() < 31 {
                    msg.attributes
                        .push(AddressAttribute::Broadcast(v4.broadcast()));
                }
            }
            IpNet::V6(_) => {
                if nodad {
                    msg.header.flags = AddressHeaderFlags::Nodad;
                    msg.attributes
                        .push(AddressAttribute::Flags(AddressFlags::Nodad));
                }
            }
        }
        Request {
            msg: RouteNetlinkMessage::NewAddress(msg),
            flags: NLM_F_CREATE | NLM_F_EXCL,
            ctx: Box::new(move || {
                format!("adding address {net} to link #{index}{}", self.where_())
            }),
        }
    }

    /// Remove `net` from link `index` (EADDRNOTAVAIL when absent).
    pub fn delete_address(&self, index: u32, net: IpNet) -> Result<()> {
        let msg = address_message(index, &net);
        self.request(RouteNetlinkMessage::DelAddress(msg), 0, || {
            format!("deleting address {net} from link #{index}{}", self.where_())
        })
        .map(|_| ())
    }

    /// Every address (both families, including IPv6 link-local) on link `index`.
    pub fn list_addresses(&self, index: u32) -> Result<Vec<IpNet>> {
        let mut req = AddressMessage::default();
        req.header.index = index;
        let msgs = self.dump(RouteNetlinkMessage::GetAddress(req), || {
            format!("listing addresses of link #{index}{}", self.where_())
        })?;
        let mut out = Vec::new();
        for m in msgs {
            let RouteNetlinkMessage::NewAddress(a) = m else {
                continue;
            };
            if a.header.index != index {
                continue;
            }
            let mut local = None;
            let mut address = None;
            for attr in &a.attributes {
                match attr {
                    AddressAttribute::Local(ip) => local = Some(*ip),
                    AddressAttribute::Address(ip) => address = Some(*ip),
                    _ => {}
                }
            }
            // For IPv4 point-to-point, IFA_ADDRESS is the peer; IFA_LOCAL is ours.
            if let Some(ip) = local.or(address)
                && let Ok(net) = IpNet::new(ip, a.header.prefix_len)
            {
                out.push(net);
            }
        }
        Ok(out)
    }
}
