//! Links: lookup/listing (`LinkInfo`), veth pair creation with the peer placed
//! directly in the pod netns under its final name, up/MTU changes, deletion.

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{DefaultNla, NLA_F_NESTED, NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo as NlLinkInfo,
    LinkMessage,
};

use super::error::{DatapathError, Result};
use super::names::{format_mac, validate_ifname};
use super::netns::NetNs;
use super::socket::{NetlinkSocket, Request};

/// The loopback device's ifindex, the same in every network namespace (the
/// kernel registers `lo` first, with the fixed `LOOPBACK_IFINDEX`).
pub const LOOPBACK_INDEX: u32 = 1;

/// `IFLA_AF_SPEC` (include/uapi/linux/if_link.h): per-family link settings.
const IFLA_AF_SPEC: u16 = 26;
/// `IFLA_INET_CONF` inside `IFLA_AF_SPEC`/`AF_INET`: the link's IPv4 sysctls.
const IFLA_INET_CONF: u16 = 1;
/// `IPV4_DEVCONF_RP_FILTER` (include/uapi/linux/ip.h).
const IPV4_DEVCONF_RP_FILTER: u16 = 8;

/// What we know about a link, as reported by RTM_GETLINK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    pub index: u32,
    pub name: String,
    /// Hardware address, when it is a 6-byte Ethernet address.
    pub mac: Option<[u8; 6]>,
    pub mtu: u32,
    /// `IFLA_INFO_KIND` (e.g. "veth"); `None` for links without one (lo).
    pub kind: Option<String>,
    /// Administratively up (IFF_UP).
    pub up: bool,
    /// IFLA_LINK: for a veth, the peer's ifindex (in the peer's netns).
    pub link: Option<u32>,
    pub txqlen: Option<u32>,
    /// IFLA_IFALIAS (podnet keeps its marker there, see `datapath::link_marker`).
    pub alias: Option<String>,
    /// A VXLAN device's UDP port and local address (`IFLA_VXLAN_LOCAL` or
    /// `IFLA_VXLAN_LOCAL6`).
    pub vxlan: Option<(u16, Option<IpAddr>)>,
}

/// Parameters of [`NetlinkSocket::create_veth_pair`].
#[derive(Debug, Clone, Copy)]
pub struct VethSpec<'a> {
    /// Name of the end that stays in this socket's netns (e.g. `lxc…`).
    pub host_name: &'a str,
    pub host_mac: Option<[u8; 6]>,
    /// Final name of the end created inside `peer_netns` (e.g. `eth0`).
    pub peer_name: &'a str,
    pub peer_mac: Option<[u8; 6]>,
    /// MTU applied to both ends (0 = kernel default).
    pub mtu: u32,
    pub peer_netns: &'a NetNs,
    /// Transmit queue length applied to both ends (None = kernel default).
    pub txqlen: Option<u32>,
}

impl LinkInfo {
    fn from_message(msg: LinkMessage) -> Self {
        let mut info = LinkInfo {
            index: msg.header.index,
            name: String::new(),
            mac: None,
            mtu: 0,
            kind: None,
            up: msg.header.flags.contains(LinkFlags::Up),
            link: None,
            txqlen: None,
            alias: None,
            vxlan: None,
        };
        for attr in msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => info.name = n,
                LinkAttribute::Address(a) => info.mac = <[u8; 6]>::try_from(a.as_slice()).ok(),
                LinkAttribute::Mtu(m) => info.mtu = m,
                LinkAttribute::Link(l) => info.link = Some(l),
                LinkAttribute::TxQueueLen(q) => info.txqlen = Some(q),
                LinkAttribute::IfAlias(a) => info.alias = Some(a),
                LinkAttribute::LinkInfo(infos) => {
                    for i in infos {
                        match i {
                            NlLinkInfo::Kind(k) => info.kind = Some(k.to_string()),
                            NlLinkInfo::Data(InfoData::Vxlan(data)) => {
                                let (mut port, mut local) = (0, None);
                                for d in data {
                                    match d {
                                        InfoVxlan::Port(p) => port = p,
                                        InfoVxlan::Local(a) => local = Some(a.into()),
                                        InfoVxlan::Local6(a) => local = Some(a.into()),
                                        _ => {}
                                    }
                                }
                                info.vxlan = Some((port, local));
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        info
    }
}

/// The two halves of one RTM_NEWLINK creating a pair (veth or netkit): `host`
/// carries the link info the caller adds; `peer` is named, placed in
/// `peer_netns`, and both get the MTU, queue length and MAC asked for.
pub(super) fn pair_link_messages(
    host_name: &str,
    host_mac: Option<[u8; 6]>,
    peer_name: &str,
    peer_mac: Option<[u8; 6]>,
    peer_netns: &NetNs,
    mtu: u32,
    txqlen: Option<u32>,
) -> (LinkMessage, LinkMessage) {
    let mut peer = LinkMessage::default();
    peer.attributes
        .push(LinkAttribute::IfName(peer_name.to_string()));
    peer.attributes
        .push(LinkAttribute::NetNsFd(peer_netns.as_raw_fd()));
    let mut host = LinkMessage::default();
    host.attributes
        .push(LinkAttribute::IfName(host_name.to_string()));
    for (msg, mac) in [(&mut peer, peer_mac), (&mut host, host_mac)] {
        if mtu > 0 {
            msg.attributes.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(q) = txqlen {
            msg.attributes.push(LinkAttribute::TxQueueLen(q));
        }
        if let Some(mac) = mac {
            msg.attributes.push(LinkAttribute::Address(mac.to_vec()));
        }
    }
    (host, peer)
}

/// One netlink attribute (header, `value`, padding to 4 bytes), as bytes to nest
/// in another.
fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
    let len = 4 + value.len();
    let mut out = Vec::with_capacity((len + 3) & !3);
    // An attribute inside a link message is far below 64 KiB.
    out.extend_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize((len + 3) & !3, 0);
    out
}

/// The RTM_NEWLINK body that creates the veth pair of `spec` (names checked).
fn veth_message(spec: &VethSpec<'_>) -> Result<LinkMessage> {
    validate_ifname(spec.host_name)?;
    validate_ifname(spec.peer_name)?;
    let (mut host, peer) = pair_link_messages(
        spec.host_name,
        spec.host_mac,
        spec.peer_name,
        spec.peer_mac,
        spec.peer_netns,
        spec.mtu,
        spec.txqlen,
    );
    host.attributes.push(LinkAttribute::LinkInfo(vec![
        NlLinkInfo::Kind(InfoKind::Veth),
        NlLinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))),
    ]));
    Ok(host)
}

fn first_link(msgs: Vec<RouteNetlinkMessage>) -> Option<LinkInfo> {
    msgs.into_iter().find_map(|m| match m {
        RouteNetlinkMessage::NewLink(l) => Some(LinkInfo::from_message(l)),
        _ => None,
    })
}

fn is_missing_link(e: &DatapathError) -> bool {
    matches!(e.errno(), Some(libc::ENODEV | libc::ENOENT))
}

impl NetlinkSocket {
    /// Look a link up by name; `None` when it does not exist.
    pub fn link_by_name(&self, name: &str) -> Result<Option<LinkInfo>> {
        validate_ifname(name)?;
        let req = self.link_by_name_request(name);
        match self.request(req.msg, req.flags, req.ctx) {
            Ok(msgs) => Ok(first_link(msgs)),
            Err(e) if is_missing_link(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The RTM_GETLINK of [`link_by_name`](Self::link_by_name) (`name` checked by the caller).
    fn link_by_name_request<'a>(&'a self, name: &'a str) -> Request<'a> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        Request {
            msg: RouteNetlinkMessage::GetLink(msg),
            flags: 0,
            ctx: Box::new(move || format!("looking up link {name}{}", self.where_())),
        }
    }

    /// Sends the RTM_NEWLINK `host` that creates a pair (veth or netkit) and, in
    /// the same datagram, the lookup of its host end by name, which the kernel
    /// handles after the creation: the host end as created, in one round trip.
    /// `ctx` names the creation.
    pub(super) fn create_pair(
        &self,
        host: LinkMessage,
        host_name: &str,
        ctx: impl Fn() -> String,
    ) -> Result<LinkInfo> {
        let create = Request {
            msg: RouteNetlinkMessage::NewLink(host),
            flags: NLM_F_CREATE | NLM_F_EXCL,
            ctx: Box::new(&ctx),
        };
        let mut outcomes = self
            .batch_replies(vec![create, self.link_by_name_request(host_name)])?
            .into_iter();
        // The creation's outcome first: after a failed one the lookup finds the
        // link that was already there.
        if let Some(Err(e)) = outcomes.next() {
            return Err(e);
        }
        match outcomes.next() {
            Some(Ok(msgs)) => first_link(msgs),
            Some(Err(e)) if !is_missing_link(&e) => return Err(e),
            _ => None,
        }
        .ok_or_else(|| DatapathError::Netlink {
            context: format!("{}: created link vanished", ctx()),
            source: io::Error::from_raw_os_error(libc::ENODEV),
            ext_ack: None,
        })
    }

    /// The ifindex of link `name`, `None` when there is none: one SIOCGIFINDEX
    /// ioctl on the socket (it answers for the socket's netns), no netlink
    /// round trip, for a check that needs nothing but whether the name is taken.
    pub fn link_index(&self, name: &str) -> Result<Option<u32>> {
        validate_ifname(name)?;
        let mut req = libc::ifreq {
            ifr_name: [0; libc::IFNAMSIZ],
            ifr_ifru: libc::__c_anonymous_ifr_ifru { ifru_ifindex: 0 },
        };
        // validate_ifname: at most IFNAMSIZ - 1 bytes, so the name stays NUL-terminated.
        for (dst, b) in req.ifr_name.iter_mut().zip(name.bytes()) {
            *dst = b as libc::c_char;
        }
        // SAFETY: `req` is an initialised ifreq that outlives the call; SIOCGIFINDEX
        // reads its NUL-terminated name and writes only its ifindex.
        let rc = unsafe { libc::ioctl(self.raw_fd(), libc::SIOCGIFINDEX as _, &mut req) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENODEV) {
                return Ok(None);
            }
            return Err(DatapathError::io(
                format!("looking up the index of link {name}{}", self.where_()),
                e,
            ));
        }
        // SAFETY: a successful SIOCGIFINDEX has written `ifru_ifindex`.
        let index = unsafe { req.ifr_ifru.ifru_ifindex };
        u32::try_from(index).map(Some).map_err(|_| {
            DatapathError::Invalid(format!(
                "link {name}{} has the invalid ifindex {index}",
                self.where_()
            ))
        })
    }

    /// Look a link up by ifindex; `None` when it does not exist.
    pub fn link_by_index(&self, index: u32) -> Result<Option<LinkInfo>> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        match self.request(RouteNetlinkMessage::GetLink(msg), 0, || {
            format!("looking up link #{index}{}", self.where_())
        }) {
            Ok(msgs) => Ok(first_link(msgs)),
            Err(e) if is_missing_link(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// All links of this socket's netns.
    pub fn list_links(&self) -> Result<Vec<LinkInfo>> {
        let msgs = self.dump(RouteNetlinkMessage::GetLink(LinkMessage::default()), || {
            format!("listing links{}", self.where_())
        })?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(LinkInfo::from_message(l)),
                _ => None,
            })
            .collect())
    }

    /// Create a veth pair in ONE RTM_NEWLINK: the host end in this socket's
    /// netns, the peer directly inside `spec.peer_netns` under its final name,
    /// both with `spec.mtu`. Neither end is brought up. Fails with EEXIST when
    /// the host name (or the peer name in the pod netns) is taken. Returns the
    /// host end (its `link` is the peer's ifindex).
    pub fn create_veth_pair(&self, spec: &VethSpec<'_>) -> Result<LinkInfo> {
        let host = veth_message(spec)?;
        // `spec.peer_netns` (and so the fd inside the request) is borrowed for
        // the whole call, so the fd stays valid until the kernel has read it.
        self.create_pair(host, spec.host_name, || self.veth_context(spec))
    }

    /// [`create_veth_pair`](Self::create_veth_pair), answering only with the
    /// ifindexes of the host end and of the peer (`peer_sock` is a socket in
    /// `spec.peer_netns`): two `SIOCGIFINDEX` ioctls instead of a RTM_GETLINK
    /// whose 1.5 KiB answer is parsed.
    pub fn create_veth_pair_indexes(
        &self,
        spec: &VethSpec<'_>,
        peer_sock: &NetlinkSocket,
    ) -> Result<(u32, u32)> {
        let host = veth_message(spec)?;
        self.perform(Request {
            msg: RouteNetlinkMessage::NewLink(host),
            flags: NLM_F_CREATE | NLM_F_EXCL,
            ctx: Box::new(|| self.veth_context(spec)),
        })?;
        let vanished = |what: &str| DatapathError::Netlink {
            context: format!("{}: the created {what} vanished", self.veth_context(spec)),
            source: io::Error::from_raw_os_error(libc::ENODEV),
            ext_ack: None,
        };
        let host = self
            .link_index(spec.host_name)?
            .ok_or_else(|| vanished("link"))?;
        let peer = peer_sock
            .link_index(spec.peer_name)?
            .ok_or_else(|| vanished("peer"))?;
        Ok((host, peer))
    }

    /// What creating the pair of `spec` is called in its error.
    fn veth_context(&self, spec: &VethSpec<'_>) -> String {
        format!(
            "creating veth {} (peer {} in {}){}",
            spec.host_name,
            spec.peer_name,
            spec.peer_netns.label(),
            self.where_()
        )
    }

    fn set_link(&self, msg: LinkMessage, what: impl Fn() -> String) -> Result<()> {
        self.request(RouteNetlinkMessage::SetLink(msg), 0, what)
            .map(|_| ())
    }

    /// Bring a link administratively up.
    pub fn set_link_up(&self, index: u32) -> Result<()> {
        self.perform(self.link_up_request(index))
    }

    /// [`set_link_up`](Self::set_link_up), built for a [`batch`](Self::batch).
    pub fn link_up_request(&self, index: u32) -> Request<'_> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        Request {
            msg: RouteNetlinkMessage::SetLink(msg),
            flags: 0,
            ctx: Box::new(move || format!("setting link #{index} up{}", self.where_())),
        }
    }

    /// Brings a link up and sets its alias in the same request (the kernel
    /// ignores an alias in the request that creates a link), built for a
    /// [`batch`](Self::batch).
    pub fn link_up_with_alias_request<'a>(&'a self, index: u32, alias: &'a str) -> Request<'a> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        msg.attributes
            .push(LinkAttribute::IfAlias(alias.to_string()));
        Request {
            msg: RouteNetlinkMessage::SetLink(msg),
            flags: 0,
            ctx: Box::new(move || {
                format!(
                    "setting link #{index} up with alias {alias:?}{}",
                    self.where_()
                )
            }),
        }
    }

    /// Sets a link's IPv4 `rp_filter` (`net/ipv4/conf/<link>/rp_filter`) in one
    /// RTM_SETLINK, built for a [`batch`](Self::batch): the kernel sets the
    /// per-link IPv4 sysctls named in `IFLA_AF_SPEC`/`AF_INET`/`IFLA_INET_CONF`
    /// (nested `u32`s keyed by `IPV4_DEVCONF_*`) as a write to /proc/sys does,
    /// without the path walk of opening the file.
    pub fn rp_filter_request(&self, index: u32, value: u32) -> Request<'_> {
        let conf = nla(IPV4_DEVCONF_RP_FILTER, &value.to_ne_bytes());
        let inet = nla(IFLA_INET_CONF | NLA_F_NESTED, &conf);
        let af = nla(libc::AF_INET as u16 | NLA_F_NESTED, &inet);
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::Other(DefaultNla::new(
            IFLA_AF_SPEC | NLA_F_NESTED,
            af,
        )));
        Request {
            msg: RouteNetlinkMessage::SetLink(msg),
            flags: 0,
            ctx: Box::new(move || {
                format!(
                    "setting rp_filter {value} on link #{index}{}",
                    self.where_()
                )
            }),
        }
    }

    /// Set a link's alias (one request, nothing else changes).
    pub fn set_link_alias(&self, index: u32, alias: &str) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes
            .push(LinkAttribute::IfAlias(alias.to_string()));
        self.set_link(msg, || {
            format!(
                "setting the alias of link #{index} to {alias:?}{}",
                self.where_()
            )
        })
    }

    /// Bring a link administratively down.
    pub fn set_link_down(&self, index: u32) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.change_mask = LinkFlags::Up;
        self.set_link(msg, || {
            format!("setting link #{index} down{}", self.where_())
        })
    }

    /// Change a link's MTU.
    pub fn set_link_mtu(&self, index: u32, mtu: u32) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::Mtu(mtu));
        self.set_link(msg, || {
            format!("setting MTU {mtu} on link #{index}{}", self.where_())
        })
    }

    /// Change a link's MAC address.
    pub fn set_link_mac(&self, index: u32, mac: [u8; 6]) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::Address(mac.to_vec()));
        self.set_link(msg, || {
            format!(
                "setting MAC {} on link #{index}{}",
                format_mac(&mac),
                self.where_()
            )
        })
    }

    /// Delete a link by ifindex (ENODEV if it does not exist). Deleting one
    /// end of a veth removes both.
    pub fn delete_link(&self, index: u32) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.request(RouteNetlinkMessage::DelLink(msg), 0, || {
            format!("deleting link #{index}{}", self.where_())
        })
        .map(|_| ())
    }

    /// Delete a link by name. `Ok(false)` when it did not exist.
    pub fn delete_link_by_name(&self, name: &str) -> Result<bool> {
        validate_ifname(name)?;
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.request(RouteNetlinkMessage::DelLink(msg), 0, || {
            format!("deleting link {name}{}", self.where_())
        }) {
            Ok(_) => Ok(true),
            Err(e) if is_missing_link(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether the kernel knows links of `kind` (e.g. `geneve`): creating one
    /// named `podnet_probe` fails with EOPNOTSUPP ("Unknown device type") when it
    /// does not; one that was created is deleted again.
    pub fn has_link_kind(&self, kind: &str) -> Result<bool> {
        const PROBE: &str = "podnet_probe";
        let mut msg = LinkMessage::default();
        msg.attributes
            .push(LinkAttribute::IfName(PROBE.to_string()));
        msg.attributes
            .push(LinkAttribute::LinkInfo(vec![NlLinkInfo::Kind(
                InfoKind::Other(kind.to_string()),
            )]));
        match self.request(
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            || format!("probing for {kind} links{}", self.where_()),
        ) {
            Ok(_) => {
                self.delete_link_by_name(PROBE)?;
                Ok(true)
            }
            Err(e) if e.errno() == Some(libc::EOPNOTSUPP) => Ok(false),
            // The driver exists and refused the bare request (missing attributes).
            Err(e) if e.errno().is_some() => Ok(true),
            Err(e) => Err(e),
        }
    }
}
