//! Routes: add / replace / delete by `RouteSpec`, and listing as `RouteInfo`
//! (destination, gateway, oif, scope, MTU metric, table, priority).

use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteMetric,
    RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::addr::family_of;
use super::error::{DatapathError, Result};
use super::socket::{NetlinkSocket, Request};

/// The main routing table (`RT_TABLE_MAIN`).
pub const TABLE_MAIN: u32 = 254;
/// The local routing table (`RT_TABLE_LOCAL`).
pub const TABLE_LOCAL: u32 = 255;
/// `RTPROT_BOOT`, what `ip route add` marks its routes with.
const RTPROT_BOOT: u8 = 3;
/// `RT_SCOPE_UNIVERSE`.
pub const SCOPE_UNIVERSE: u8 = 0;
/// `RT_SCOPE_LINK`.
pub const SCOPE_LINK: u8 = 253;
/// `RT_SCOPE_HOST`.
pub const SCOPE_HOST: u8 = 254;

/// IP address family selector for listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn of(ip: &IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    pub(crate) fn to_nl(self) -> AddressFamily {
        match self {
            IpFamily::V4 => AddressFamily::Inet,
            IpFamily::V6 => AddressFamily::Inet6,
        }
    }
}

/// A unicast route to install or delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    /// Output interface index (0 = unspecified).
    pub oif: u32,
    /// `scope link` (a directly connected route, no gateway).
    pub scope_link: bool,
    /// Route MTU metric (`mtu <n>`).
    pub mtu: Option<u32>,
    /// Routing table; `None` = main.
    pub table: Option<u32>,
    /// Metric / preference (`metric <n>`).
    pub priority: Option<u32>,
    /// `onlink`: the gateway is reachable on `oif` without a connected route.
    pub onlink: bool,
    /// `src <ip>`: the source address for locally generated traffic.
    pub prefsrc: Option<IpAddr>,
    /// `proto <n>` (None = 3, boot, the default of `ip route`); delete and
    /// list match it, so an owner can mark its routes.
    pub protocol: Option<u8>,
}

impl RouteSpec {
    /// A directly connected route to `dst` out of `oif` (`scope link`, main
    /// table), nothing else set: the shape of every pod and host route podnet adds.
    pub fn link(dst: IpNet, oif: u32) -> Self {
        RouteSpec {
            dst,
            gateway: None,
            oif,
            scope_link: true,
            mtu: None,
            table: None,
            priority: None,
            onlink: false,
            prefsrc: None,
            protocol: None,
        }
    }
}

/// A route as listed by the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInfo {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    /// Raw `rtm_scope` (see `SCOPE_*`).
    pub scope: u8,
    pub mtu: Option<u32>,
    pub table: u32,
    pub priority: Option<u32>,
    /// Raw `rtm_type` (1 = unicast, 2 = local, ...).
    pub kind: u8,
    /// Raw `rtm_protocol` (2 = kernel, 3 = boot, 4 = static, ...).
    pub protocol: u8,
    /// The preferred source address (`src`), when the route has one.
    pub prefsrc: Option<IpAddr>,
}

fn route_addr(ip: IpAddr) -> RouteAddress {
    match ip {
        IpAddr::V4(a) => RouteAddress::Inet(a),
        IpAddr::V6(a) => RouteAddress::Inet6(a),
    }
}

fn ip_of(addr: &RouteAddress) -> Option<IpAddr> {
    match addr {
        RouteAddress::Inet(a) => Some(IpAddr::V4(*a)),
        RouteAddress::Inet6(a) => Some(IpAddr::V6(*a)),
        _ => None,
    }
}

fn set_table(msg: &mut RouteMessage, table: u32) {
    msg.header.table = u8::try_from(table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
    msg.attributes.push(RouteAttribute::Table(table));
}

/// Build the identifying part of a route message (dst, table, oif, gateway, priority).
fn base_message(spec: &RouteSpec) -> Result<RouteMessage> {
    let dst = spec.dst.trunc();
    if let Some(gw) = spec.gateway
        && IpFamily::of(&gw) != IpFamily::of(&dst.addr())
    {
        return Err(DatapathError::Invalid(format!(
            "route {dst}: gateway {gw} is of another address family"
        )));
    }
    let mut msg = RouteMessage::default();
    msg.header.address_family = family_of(&dst.addr());
    msg.header.destination_prefix_length = dst.prefix_len();
    set_table(&mut msg, spec.table.unwrap_or(TABLE_MAIN));
    if dst.prefix_len() > 0 {
        msg.attributes
            .push(RouteAttribute::Destination(route_addr(dst.addr())));
    }
    if let Some(gw) = spec.gateway {
        msg.attributes.push(RouteAttribute::Gateway(route_addr(gw)));
    }
    if spec.oif != 0 {
        msg.attributes.push(RouteAttribute::Oif(spec.oif));
    }
    if let Some(p) = spec.priority {
        msg.attributes.push(RouteAttribute::Priority(p));
    }
    if let Some(p) = spec.protocol {
        msg.header.protocol = RouteProtocol::from(p);
    }
    Ok(msg)
}

fn describe(spec: &RouteSpec) -> String {
    let mut s = format!("route {}", spec.dst);
    if let Some(gw) = spec.gateway {
        s.push_str(&format!(" via {gw}"));
    }
    if spec.oif != 0 {
        s.push_str(&format!(" dev #{}", spec.oif));
    }
    if let Some(t) = spec.table {
        s.push_str(&format!(" table {t}"));
    }
    s
}

impl RouteInfo {
    fn from_message(msg: RouteMessage) -> Option<Self> {
        let h = &msg.header;
        let mut info = RouteInfo {
            dst: IpNet::new(
                match h.address_family {
                    AddressFamily::Inet6 => IpAddr::from([0u16; 8]),
                    _ => IpAddr::from([0u8; 4]),
                },
                h.destination_prefix_length,
            )
            .ok()?,
            gateway: None,
            oif: None,
            scope: u8::from(h.scope),
            mtu: None,
            table: u32::from(h.table),
            priority: None,
            kind: u8::from(h.kind),
            protocol: u8::from(h.protocol),
            prefsrc: None,
        };
        let prefix = h.destination_prefix_length;
        for attr in msg.attributes {
            match attr {
                RouteAttribute::Destination(a) => {
                    if let Some(ip) = ip_of(&a) {
                        info.dst = IpNet::new(ip, prefix).ok()?;
                    }
                }
                RouteAttribute::Gateway(a) => info.gateway = ip_of(&a),
                RouteAttribute::PrefSource(a) => info.prefsrc = ip_of(&a),
                RouteAttribute::Oif(i) => info.oif = Some(i),
                RouteAttribute::Table(t) => info.table = t,
                RouteAttribute::Priority(p) => info.priority = Some(p),
                RouteAttribute::Metrics(ms) => {
                    for m in ms {
                        if let RouteMetric::Mtu(v) = m {
                            info.mtu = Some(v);
                        }
                    }
                }
                _ => {}
            }
        }
        Some(info)
    }
}

impl NetlinkSocket {
    fn new_route<'a>(
        &'a self,
        spec: &'a RouteSpec,
        flags: u16,
        verb: &'static str,
    ) -> Result<Request<'a>> {
        let mut msg = base_message(spec)?;
        msg.header.protocol = RouteProtocol::from(spec.protocol.unwrap_or(RTPROT_BOOT));
        if spec.onlink {
            msg.header.flags = RouteFlags::Onlink;
        }
        if let Some(src) = spec.prefsrc {
            msg.attributes
                .push(RouteAttribute::PrefSource(route_addr(src)));
        }
        msg.header.kind = RouteType::Unicast;
        msg.header.scope = if spec.scope_link {
            RouteScope::Link
        } else {
            RouteScope::Universe
        };
        if let Some(mtu) = spec.mtu {
            msg.attributes
                .push(RouteAttribute::Metrics(vec![RouteMetric::Mtu(mtu)]));
        }
        Ok(Request {
            msg: RouteNetlinkMessage::NewRoute(msg),
            flags,
            ctx: Box::new(move || format!("{verb} {}{}", describe(spec), self.where_())),
        })
    }

    /// Add a route (`ip route add`). EEXIST when an identical route exists.
    pub fn add_route(&self, spec: &RouteSpec) -> Result<()> {
        self.perform(self.add_route_request(spec)?)
    }

    /// [`add_route`](Self::add_route), built for a [`batch`](Self::batch); fails
    /// on a spec that cannot be sent (a gateway of another family).
    pub fn add_route_request<'a>(&'a self, spec: &'a RouteSpec) -> Result<Request<'a>> {
        self.new_route(spec, NLM_F_CREATE | NLM_F_EXCL, "adding")
    }

    /// Add or replace a route (`ip route replace`).
    pub fn replace_route(&self, spec: &RouteSpec) -> Result<()> {
        self.perform(self.replace_route_request(spec)?)
    }

    /// [`replace_route`](Self::replace_route), built for a [`batch`](Self::batch);
    /// fails on a spec that cannot be sent (a gateway of another family).
    pub fn replace_route_request<'a>(&'a self, spec: &'a RouteSpec) -> Result<Request<'a>> {
        self.new_route(spec, NLM_F_CREATE | NLM_F_REPLACE, "replacing")
    }

    /// Delete the route matching `spec`'s dst/table/gateway/oif/priority
    /// (`mtu` and `scope_link` are ignored). ESRCH when there is none.
    pub fn delete_route(&self, spec: &RouteSpec) -> Result<()> {
        self.perform(self.delete_route_request(spec)?)
    }

    /// [`delete_route`](Self::delete_route), built for a [`batch`](Self::batch).
    pub fn delete_route_request<'a>(&'a self, spec: &'a RouteSpec) -> Result<Request<'a>> {
        let mut msg = base_message(spec)?;
        msg.header.scope = RouteScope::NoWhere;
        Ok(Request {
            msg: RouteNetlinkMessage::DelRoute(msg),
            flags: 0,
            ctx: Box::new(move || format!("deleting {}{}", describe(spec), self.where_())),
        })
    }

    /// Routes of `family`, in `table` (or all tables when `None`).
    pub fn list_routes(&self, family: IpFamily, table: Option<u32>) -> Result<Vec<RouteInfo>> {
        let mut req = RouteMessage::default();
        req.header.address_family = family.to_nl();
        let msgs = self.dump(RouteNetlinkMessage::GetRoute(req), || {
            format!("listing routes{}", self.where_())
        })?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => RouteInfo::from_message(r),
                _ => None,
            })
            .filter(|r| table.is_none_or(|t| r.table == t))
            .collect())
    }
}
