//! The VXLAN tunnel device and what points into it: creating the device (VNI, UDP
//! port, local address of either family, no learning), its FDB entries (`bridge fdb append <mac>
//! dev <vxlan> dst <ip>`: AF_BRIDGE neighbour messages with NDA_DST) and its
//! permanent neighbour entries (`ip neigh replace <ip> lladdr <mac> dev <vxlan>`).
//! The device carries no IPv6 link-local address: every neighbour on it is a
//! permanent entry podnet writes, so neither ND nor DAD has anything to do there.

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::link::{
    AfSpecInet6, AfSpecUnspec, In6AddrGenMode, InfoData, InfoKind, InfoVxlan, LinkAttribute,
    LinkInfo as NlLinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::addr::family_of;
use super::error::{DatapathError, Result};
use super::link::LinkInfo;
use super::names::{format_mac, validate_ifname};
use super::socket::{NetlinkSocket, Request};

/// What a VXLAN device is created with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanSpec {
    pub name: String,
    /// The VNI.
    pub id: u32,
    /// The UDP destination port (8472, Linux's and Cilium's).
    pub port: u16,
    /// The outer source address (this node's InternalIP of the underlay family:
    /// `IFLA_VXLAN_LOCAL` or `IFLA_VXLAN_LOCAL6`); every FDB destination of the
    /// device must be of the same family.
    pub local: IpAddr,
    pub mac: [u8; 6],
    pub mtu: u32,
}

/// Which table of a device an entry goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum L2Table {
    Fdb,
    Neighbour,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum L2Change {
    Add,
    Delete,
}

/// One entry of a device's forwarding or neighbour table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct L2Entry {
    pub ip: IpAddr,
    pub mac: [u8; 6],
}

fn neigh_addr(ip: IpAddr) -> NeighbourAddress {
    match ip {
        IpAddr::V4(a) => NeighbourAddress::Inet(a),
        IpAddr::V6(a) => NeighbourAddress::Inet6(a),
    }
}

fn entry_of(msg: NeighbourMessage) -> Option<L2Entry> {
    let (mut ip, mut mac) = (None, None);
    for attr in msg.attributes {
        match attr {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => ip = Some(a.into()),
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => ip = Some(a.into()),
            // AF_BRIDGE entries: the parser does not know NDA_DST's family.
            NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => {
                ip = match b.len() {
                    4 => <[u8; 4]>::try_from(b.as_slice()).ok().map(IpAddr::from),
                    16 => <[u8; 16]>::try_from(b.as_slice()).ok().map(IpAddr::from),
                    _ => None,
                }
            }
            NeighbourAttribute::LinkLayerAddress(l) => mac = <[u8; 6]>::try_from(l.as_slice()).ok(),
            _ => {}
        }
    }
    Some(L2Entry { ip: ip?, mac: mac? })
}

/// An FDB entry (`family` AF_BRIDGE, NTF_SELF) or a neighbour entry (the IP's
/// family) on link `index`.
fn l2_message(index: u32, entry: &L2Entry, table: L2Table) -> NeighbourMessage {
    let fdb = table == L2Table::Fdb;
    let mut msg = NeighbourMessage::default();
    msg.header.ifindex = index;
    msg.header.state = NeighbourState::Permanent;
    msg.header.family = if fdb {
        AddressFamily::Bridge
    } else {
        family_of(&entry.ip)
    };
    if fdb {
        msg.header.flags = NeighbourFlags::Own;
    }
    msg.attributes
        .push(NeighbourAttribute::Destination(neigh_addr(entry.ip)));
    msg.attributes
        .push(NeighbourAttribute::LinkLayerAddress(entry.mac.to_vec()));
    msg
}

impl NetlinkSocket {
    /// Creates the VXLAN device (down; no multicast group, no learning: every
    /// destination comes from an FDB entry podnet writes; no IPv6 link-local
    /// address, see [`disable_ipv6_addr_gen`](Self::disable_ipv6_addr_gen)).
    pub fn create_vxlan(&self, spec: &VxlanSpec) -> Result<LinkInfo> {
        validate_ifname(&spec.name)?;
        let ctx = || {
            format!(
                "creating VXLAN device {} (id {}, port {}, local {}){}",
                spec.name,
                spec.id,
                spec.port,
                spec.local,
                self.where_()
            )
        };
        let mut msg = LinkMessage::default();
        msg.attributes
            .push(LinkAttribute::IfName(spec.name.clone()));
        msg.attributes.push(LinkAttribute::Mtu(spec.mtu));
        msg.attributes
            .push(LinkAttribute::Address(spec.mac.to_vec()));
        let local = match spec.local {
            IpAddr::V4(a) => InfoVxlan::Local(a),
            IpAddr::V6(a) => InfoVxlan::Local6(a),
        };
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            NlLinkInfo::Kind(InfoKind::Vxlan),
            NlLinkInfo::Data(InfoData::Vxlan(vec![
                InfoVxlan::Id(spec.id),
                InfoVxlan::Port(spec.port),
                local,
                InfoVxlan::Learning(false),
            ])),
        ]));
        self.request(
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            ctx,
        )?;
        let link = self
            .link_by_name(&spec.name)?
            .ok_or_else(|| DatapathError::Netlink {
                context: format!("{}: created link vanished", ctx()),
                source: std::io::Error::from_raw_os_error(libc::ENODEV),
                ext_ack: None,
            })?;
        self.disable_ipv6_addr_gen(link.index)?;
        Ok(link)
    }

    /// Sets a link's IPv6 address generation mode to `none` (`ip link set
    /// <link> addrgenmode none`), so bringing it up adds no link-local address.
    /// Without it the kernel adds `fe80::…` and, once DAD ends a second or more
    /// later, its `local` route: a change on a device that no restart of podnet
    /// touched. The link must be down; the kernel refuses the mode at creation.
    /// A kernel without IPv6 on the link (`EAFNOSUPPORT`) has nothing to disable.
    pub fn disable_ipv6_addr_gen(&self, index: u32) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes
            .push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet6(
                vec![AfSpecInet6::AddrGenMode(In6AddrGenMode::None)],
            )]));
        let ctx = || {
            format!(
                "setting IPv6 address generation of link #{index} to none{}",
                self.where_()
            )
        };
        match self.request(RouteNetlinkMessage::SetLink(msg), 0, ctx) {
            Err(DatapathError::Netlink { source, .. })
                if source.raw_os_error() == Some(libc::EAFNOSUPPORT) =>
            {
                Ok(())
            }
            other => other.map(|_| ()),
        }
    }

    /// Adds an FDB entry: frames to `entry.mac` go to the remote `entry.ip`.
    /// Idempotent (NLM_F_APPEND keeps one entry per MAC and destination).
    pub fn append_fdb(&self, index: u32, entry: &L2Entry) -> Result<()> {
        self.perform(self.append_fdb_request(index, entry))
    }

    /// [`append_fdb`](Self::append_fdb), built for a [`batch`](Self::batch).
    pub fn append_fdb_request(&self, index: u32, entry: &L2Entry) -> Request<'_> {
        self.l2_request(index, entry, L2Table::Fdb, L2Change::Add)
    }

    /// Deletes one FDB entry (ENOENT when absent).
    pub fn delete_fdb(&self, index: u32, entry: &L2Entry) -> Result<()> {
        self.perform(self.delete_fdb_request(index, entry))
    }

    /// [`delete_fdb`](Self::delete_fdb), built for a [`batch`](Self::batch).
    pub fn delete_fdb_request(&self, index: u32, entry: &L2Entry) -> Request<'_> {
        self.l2_request(index, entry, L2Table::Fdb, L2Change::Delete)
    }

    /// The FDB entries of link `index` that have a remote destination.
    pub fn list_fdb(&self, index: u32) -> Result<Vec<L2Entry>> {
        self.list_l2(index, AddressFamily::Bridge)
    }

    /// Adds or replaces a permanent neighbour entry on link `index`.
    pub fn replace_neighbour(&self, index: u32, entry: &L2Entry) -> Result<()> {
        self.perform(self.replace_neighbour_request(index, entry))
    }

    /// [`replace_neighbour`](Self::replace_neighbour), built for a [`batch`](Self::batch).
    pub fn replace_neighbour_request(&self, index: u32, entry: &L2Entry) -> Request<'_> {
        self.l2_request(index, entry, L2Table::Neighbour, L2Change::Add)
    }

    /// Deletes a neighbour entry (ENOENT when absent), built for a
    /// [`batch`](Self::batch).
    pub fn delete_neighbour_request(&self, index: u32, entry: &L2Entry) -> Request<'_> {
        self.l2_request(index, entry, L2Table::Neighbour, L2Change::Delete)
    }

    fn l2_request(
        &self,
        index: u32,
        entry: &L2Entry,
        table: L2Table,
        change: L2Change,
    ) -> Request<'_> {
        let msg = l2_message(index, entry, table);
        let (msg, flags, verb) = match (change, table) {
            (L2Change::Add, L2Table::Fdb) => (
                RouteNetlinkMessage::NewNeighbour(msg),
                NLM_F_CREATE | NLM_F_APPEND,
                "adding",
            ),
            (L2Change::Add, L2Table::Neighbour) => (
                RouteNetlinkMessage::NewNeighbour(msg),
                NLM_F_CREATE | NLM_F_REPLACE,
                "setting",
            ),
            (L2Change::Delete, _) => (RouteNetlinkMessage::DelNeighbour(msg), 0, "deleting"),
        };
        let what = match table {
            L2Table::Fdb => format!("FDB entry {} dst {}", format_mac(&entry.mac), entry.ip),
            L2Table::Neighbour => {
                format!("neighbour {} lladdr {}", entry.ip, format_mac(&entry.mac))
            }
        };
        Request {
            msg,
            flags,
            ctx: Box::new(move || format!("{verb} {what} on link #{index}{}", self.where_())),
        }
    }

    /// The permanent neighbour entries (both families) of link `index`.
    pub fn list_neighbours(&self, index: u32) -> Result<Vec<L2Entry>> {
        let mut out = self.list_l2(index, AddressFamily::Inet)?;
        out.extend(self.list_l2(index, AddressFamily::Inet6)?);
        Ok(out)
    }

    fn list_l2(&self, index: u32, family: AddressFamily) -> Result<Vec<L2Entry>> {
        let mut req = NeighbourMessage::default();
        req.header.family = family;
        // A strict neighbour dump refuses an ifindex in the header (the entries
        // are filtered below); the FDB dump takes it as a device filter.
        if family == AddressFamily::Bridge {
            req.header.ifindex = index;
        }
        let msgs = self.dump(RouteNetlinkMessage::GetNeighbour(req), || {
            format!("listing neighbours of link #{index}{}", self.where_())
        })?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewNeighbour(n)
                    if n.header.ifindex == index
                        && n.header.state == NeighbourState::Permanent
                        && !n.header.flags.contains(NeighbourFlags::Proxy) =>
                {
                    entry_of(n)
                }
                _ => None,
            })
            .collect())
    }
}
