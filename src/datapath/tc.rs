//! Traffic control on a link, as a pod's bandwidth limit needs it: a root TBF
//! (`tbf`), the ingress qdisc with a `u32` match-all filter whose `mirred`
//! action redirects to an IFB device, the IFB itself, and the dumps that read
//! them back (qdiscs, and the redirect filters' targets), and the deletes of a limit
//! removed.

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo as NlLinkInfo, LinkMessage};
use netlink_packet_route::tc::{
    TcAction, TcActionAttribute, TcActionMirrorOption, TcActionOption, TcActionType, TcAttribute,
    TcFilterU32Option, TcHandle, TcMessage, TcMirror, TcMirrorActionType, TcOption, TcU32Key,
    TcU32Selector, TcU32SelectorFlags,
};

use super::error::Result;
use super::link::LinkInfo;
use super::names::validate_ifname;
use super::socket::{NetlinkSocket, Request};
use super::tbf::{TbfParams, TbfReading, read_tbf};

/// The handle podnet gives a root TBF (`1:`).
pub const TBF_HANDLE: TcHandle = TcHandle { major: 1, minor: 0 };
/// `ETH_P_ALL` in network byte order, as a filter's protocol.
const ETH_P_ALL_BE: u16 = 0x0003u16.to_be();
/// The priority of the redirect filter.
const REDIRECT_PRIO: u16 = 1;

/// A qdisc of a link, as dumped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QdiscInfo {
    pub kind: String,
    pub handle: TcHandle,
    pub parent: TcHandle,
    /// A `tbf`'s rate and queue.
    pub tbf: Option<TbfReading>,
}

/// The RTM_NEWQDISC of a root TBF on `index` (replacing the root qdisc).
pub fn tbf_message(index: u32, p: &TbfParams) -> TcMessage {
    let mut msg = TcMessage::with_index(index as i32);
    msg.header.handle = TBF_HANDLE;
    msg.header.parent = TcHandle::ROOT;
    msg.attributes.push(TcAttribute::Kind("tbf".into()));
    msg.attributes.push(TcAttribute::Options(p.options()));
    msg
}

/// The RTM_NEWQDISC of the ingress qdisc (`ffff:`) on `index`.
pub fn ingress_message(index: u32) -> TcMessage {
    let mut msg = TcMessage::with_index(index as i32);
    msg.header.handle = TcHandle {
        major: 0xffff,
        minor: 0,
    };
    msg.header.parent = TcHandle::INGRESS;
    msg.attributes.push(TcAttribute::Kind("ingress".into()));
    msg
}

/// The RTM_NEWTFILTER of `tc filter add dev <index> parent ffff: protocol all
/// prio 1 u32 match u32 0 0 action mirred egress redirect dev <target>`.
pub fn redirect_message(index: u32, target: u32) -> TcMessage {
    let mut msg = TcMessage::with_index(index as i32);
    msg.header.parent = TcHandle {
        major: 0xffff,
        minor: 0,
    };
    msg.header.info = (u32::from(REDIRECT_PRIO) << 16) | u32::from(ETH_P_ALL_BE);
    let mut mirror = TcMirror::default();
    mirror.generic.action = TcActionType::Stolen;
    mirror.eaction = TcMirrorActionType::EgressRedir;
    mirror.ifindex = target;
    let mut action = TcAction::default();
    action.attributes = vec![
        TcActionAttribute::Kind("mirred".into()),
        TcActionAttribute::Options(vec![TcActionOption::Mirror(TcActionMirrorOption::Parms(
            mirror,
        ))]),
    ];
    let mut sel = TcU32Selector::default();
    sel.flags = TcU32SelectorFlags::Terminal;
    sel.nkeys = 1;
    sel.keys = vec![TcU32Key::default()];
    msg.attributes.push(TcAttribute::Kind("u32".into()));
    msg.attributes.push(TcAttribute::Options(vec![
        TcOption::U32(TcFilterU32Option::Action(vec![action])),
        TcOption::U32(TcFilterU32Option::Selector(sel)),
    ]));
    msg
}

/// The redirect target of a dumped `u32` filter with a `mirred` egress redirect.
fn redirect_target(msg: &TcMessage) -> Option<u32> {
    let opts = msg.attributes.iter().find_map(|a| match a {
        TcAttribute::Options(o) => Some(o),
        _ => None,
    })?;
    opts.iter().find_map(|o| match o {
        TcOption::U32(TcFilterU32Option::Action(actions)) => actions.iter().find_map(|act| {
            act.attributes.iter().find_map(|a| match a {
                TcActionAttribute::Options(ao) => ao.iter().find_map(|x| match x {
                    TcActionOption::Mirror(TcActionMirrorOption::Parms(m))
                        if m.eaction == TcMirrorActionType::EgressRedir =>
                    {
                        Some(m.ifindex)
                    }
                    _ => None,
                }),
                _ => None,
            })
        }),
        _ => None,
    })
}

fn qdisc_info(msg: TcMessage) -> QdiscInfo {
    let mut kind = String::new();
    let mut options = Vec::new();
    for a in msg.attributes {
        match a {
            TcAttribute::Kind(k) => kind = k,
            TcAttribute::Options(o) => options = o,
            _ => {}
        }
    }
    QdiscInfo {
        tbf: (kind == "tbf").then(|| read_tbf(&options)).flatten(),
        kind,
        handle: msg.header.handle,
        parent: msg.header.parent,
    }
}

impl NetlinkSocket {
    /// Puts a root TBF of `p` on link `index`, replacing its root qdisc, built
    /// for a [`batch`](Self::batch).
    pub fn tbf_request(&self, index: u32, p: &TbfParams) -> Request<'_> {
        let (rate, burst) = (p.rate_bytes, p.burst_bytes);
        Request {
            msg: RouteNetlinkMessage::NewQueueDiscipline(tbf_message(index, p)),
            flags: NLM_F_CREATE | NLM_F_REPLACE,
            ctx: Box::new(move || {
                format!(
                    "adding a tbf qdisc ({rate} bytes/s, burst {burst} bytes) to link #{index}{}",
                    self.where_()
                )
            }),
        }
    }

    /// Adds the ingress qdisc to link `index`, built for a [`batch`](Self::batch).
    pub fn ingress_qdisc_request(&self, index: u32) -> Request<'_> {
        Request {
            msg: RouteNetlinkMessage::NewQueueDiscipline(ingress_message(index)),
            flags: NLM_F_CREATE | NLM_F_EXCL,
            ctx: Box::new(move || {
                format!("adding the ingress qdisc to link #{index}{}", self.where_())
            }),
        }
    }

    /// Redirects everything link `index` receives to link `target`'s egress,
    /// built for a [`batch`](Self::batch) (after the ingress qdisc).
    pub fn redirect_request(&self, index: u32, target: u32) -> Request<'_> {
        Request {
            msg: RouteNetlinkMessage::NewTrafficFilter(redirect_message(index, target)),
            flags: NLM_F_CREATE | NLM_F_EXCL,
            ctx: Box::new(move || {
                format!(
                    "redirecting link #{index}'s ingress to link #{target}{}",
                    self.where_()
                )
            }),
        }
    }

    /// Deletes link `index`'s root qdisc (`ingress`: its ingress qdisc, and
    /// the filters under it), built for a [`batch`](Self::batch): a limit the
    /// pod's annotation no longer asks for.
    pub fn delete_qdisc_request(&self, index: u32, ingress: bool) -> Request<'_> {
        let mut msg = TcMessage::with_index(index as i32);
        msg.header.parent = if ingress {
            TcHandle::INGRESS
        } else {
            TcHandle::ROOT
        };
        let which = if ingress { "ingress" } else { "root" };
        Request {
            msg: RouteNetlinkMessage::DelQueueDiscipline(msg),
            flags: 0,
            ctx: Box::new(move || {
                format!(
                    "deleting the {which} qdisc of link #{index}{}",
                    self.where_()
                )
            }),
        }
    }

    /// The qdiscs of link `index`.
    pub fn qdiscs(&self, index: u32) -> Result<Vec<QdiscInfo>> {
        let msg = TcMessage::with_index(index as i32);
        let msgs = self.dump(RouteNetlinkMessage::GetQueueDiscipline(msg), || {
            format!("listing the qdiscs of link #{index}{}", self.where_())
        })?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewQueueDiscipline(q) if q.header.index == index as i32 => {
                    Some(qdisc_info(q))
                }
                _ => None,
            })
            .collect())
    }

    /// The links that link `index`'s ingress filters redirect to.
    pub fn ingress_redirects(&self, index: u32) -> Result<Vec<u32>> {
        let mut msg = TcMessage::with_index(index as i32);
        msg.header.parent = TcHandle {
            major: 0xffff,
            minor: 0,
        };
        let msgs = self.dump(RouteNetlinkMessage::GetTrafficFilter(msg), || {
            format!(
                "listing the ingress filters of link #{index}{}",
                self.where_()
            )
        })?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewTrafficFilter(f) if f.header.index == index as i32 => {
                    redirect_target(f)
                }
                _ => None,
            })
            .collect())
    }

    /// Creates the IFB device `name` with `mtu` (or, when one of that name is
    /// there already, the one there, if it is an IFB: a repeated ADD), down.
    pub fn create_ifb(&self, name: &str, mtu: u32) -> Result<LinkInfo> {
        validate_ifname(name)?;
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        if mtu > 0 {
            msg.attributes.push(LinkAttribute::Mtu(mtu));
        }
        msg.attributes
            .push(LinkAttribute::LinkInfo(vec![NlLinkInfo::Kind(
                InfoKind::Ifb,
            )]));
        let found = self.create_pair(msg, name, || {
            format!("creating the IFB device {name}{}", self.where_())
        });
        match found {
            Err(e) if e.is_exists() => match self.link_by_name(name)? {
                Some(l) if l.kind.as_deref() == Some("ifb") => Ok(l),
                _ => Err(e),
            },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::Emitable;

    fn body(msg: &TcMessage) -> Vec<u8> {
        let mut buf = vec![0u8; msg.buffer_len()];
        msg.emit(&mut buf);
        buf
    }

    /// `tc filter add dev v0 parent ffff: protocol all prio 1 u32 match u32 0 0
    /// action mirred egress redirect dev ifbt` (ifbt #4; iproute2 6.x, strace):
    /// the tcmsg and its attributes.
    const TC_REDIRECT: [u8; 124] = [
        0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, // AF_UNSPEC, ifindex 2
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, // handle 0, parent ffff:
        0x00, 0x03, 0x01, 0x00, // info: prio 1, protocol all
        0x08, 0x00, 0x01, 0x00, 0x75, 0x33, 0x32, 0x00, // TCA_KIND "u32"
        0x60, 0x00, 0x02, 0x00, // TCA_OPTIONS
        0x38, 0x00, 0x07, 0x00, // TCA_U32_ACT
        0x34, 0x00, 0x01, 0x00, // action 1
        0x0b, 0x00, 0x01, 0x00, 0x6d, 0x69, 0x72, 0x72, 0x65, 0x64, 0x00, 0x00, // "mirred"
        0x24, 0x00, 0x02, 0x80, // TCA_ACT_OPTIONS (nested)
        0x20, 0x00, 0x02, 0x00, // TCA_MIRRED_PARMS
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // index, capab
        0x04, 0x00, 0x00, 0x00, // TC_ACT_STOLEN
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // refcnt, bindcnt
        0x01, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, // egress redirect, ifindex 4
        0x24, 0x00, 0x05, 0x00, // TCA_U32_SEL
        0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, // terminal, 1 key
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // key: mask 0, val 0
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // off 0, offmask 0
    ];

    #[test]
    fn the_redirect_filter_is_the_one_tc_sends() {
        assert_eq!(body(&redirect_message(2, 4)), TC_REDIRECT);
    }

    #[test]
    fn the_ingress_qdisc_is_the_one_tc_sends() {
        // tc qdisc add dev v0 handle ffff: ingress
        let expected: [u8; 32] = [
            0, 0, 0, 0, 2, 0, 0, 0, 0x00, 0x00, 0xff, 0xff, 0xf1, 0xff, 0xff, 0xff, 0, 0, 0, 0,
            0x0c, 0x00, 0x01, 0x00, b'i', b'n', b'g', b'r', b'e', b's', b's', 0,
        ];
        assert_eq!(body(&ingress_message(2)), expected);
    }

    #[test]
    fn the_tbf_goes_to_the_root_as_1_0() {
        let b = body(&tbf_message(7, &TbfParams::new(125_000, 16_384)));
        assert_eq!(&b[4..8], &7i32.to_ne_bytes());
        assert_eq!(&b[8..16], &[0x00, 0x00, 0x01, 0x00, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(&b[20..28], &[0x08, 0x00, 0x01, 0x00, b't', b'b', b'f', 0]);
    }

    #[test]
    fn a_dumped_redirect_names_its_target() {
        let msg = redirect_message(2, 9);
        assert_eq!(redirect_target(&msg), Some(9));
        let mut other = redirect_message(2, 9);
        other.attributes.truncate(1);
        assert_eq!(redirect_target(&other), None);
    }
}
