//! IPv6 neighbour discovery frames (RFC 4861), pure code: the neighbour
//! solicitations the responder answers, its advertisements (solicited, and
//! unsolicited ones to all nodes), the solicited-node multicast group of an
//! address and the ICMPv6 checksum.

use std::net::Ipv6Addr;

use super::frame::{ETH_HEADER_LEN, be16, ethernet_header};

/// EtherType of IPv6.
pub const ETH_P_IPV6: u16 = 0x86dd;
/// All nodes on the link.
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

const IPV6_HEADER_LEN: usize = 40;
const NEXT_HEADER_ICMPV6: u8 = 58;
const HOP_LIMIT: u8 = 255;
const TYPE_SOLICITATION: u8 = 135;
const TYPE_ADVERTISEMENT: u8 = 136;
/// Type, code, checksum, reserved/flags, target.
const ND_HEADER_LEN: usize = 24;
const OPTION_SOURCE_LINK_ADDR: u8 = 1;
const OPTION_TARGET_LINK_ADDR: u8 = 2;
const FLAG_SOLICITED: u8 = 0x40;
const FLAG_OVERRIDE: u8 = 0x20;

/// The fields of a neighbour solicitation the responder needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Solicitation {
    /// The IPv6 source (`::` for duplicate address detection).
    pub source: Ipv6Addr,
    /// The Ethernet source of the frame.
    pub source_mac: [u8; 6],
    /// The source link-layer address option, when there is one.
    pub source_link_addr: Option<[u8; 6]>,
    pub target: Ipv6Addr,
}

/// The valid neighbour solicitation (RFC 4861 7.1.1: hop limit 255, code 0,
/// correct checksum, unicast target, well-formed options, no source link-layer
/// option from `::`) in Ethernet `frame`; `None` for anything else.
pub fn parse_solicitation(frame: &[u8]) -> Option<Solicitation> {
    let ip = frame.get(ETH_HEADER_LEN..)?;
    if be16(frame, 12)? != ETH_P_IPV6
        || ip.len() < IPV6_HEADER_LEN
        || ip[0] >> 4 != 6
        || ip[6] != NEXT_HEADER_ICMPV6
        || ip[7] != HOP_LIMIT
    {
        return None;
    }
    let icmp = ip.get(IPV6_HEADER_LEN..IPV6_HEADER_LEN + usize::from(be16(ip, 4)?))?;
    let source = ipv6(&ip[8..24])?;
    let destination = ipv6(&ip[24..40])?;
    if icmp.len() < ND_HEADER_LEN
        || icmp[0] != TYPE_SOLICITATION
        || icmp[1] != 0
        || checksum(source, destination, icmp) != 0
    {
        return None;
    }
    let target = ipv6(&icmp[8..24])?;
    if target.is_multicast() {
        return None;
    }
    let source_link_addr = source_link_addr(&icmp[ND_HEADER_LEN..])?;
    if source.is_unspecified() && (source_link_addr.is_some() || !is_solicited_node(destination)) {
        return None;
    }
    Some(Solicitation {
        source,
        source_mac: frame[6..12].try_into().ok()?,
        source_link_addr,
        target,
    })
}

/// The options' source link-layer address: `Some(None)` when there is none,
/// `None` when the options are malformed (a zero length, past the end).
fn source_link_addr(mut options: &[u8]) -> Option<Option<[u8; 6]>> {
    let mut found = None;
    while !options.is_empty() {
        let len = usize::from(*options.get(1)?) * 8;
        if len == 0 || len > options.len() {
            return None;
        }
        if options[0] == OPTION_SOURCE_LINK_ADDR && len == 8 {
            found = Some(options[2..8].try_into().ok()?);
        }
        options = &options[len..];
    }
    Some(found)
}

/// The advertisement answering `ns` for `mac`, sent from `source`: to the
/// solicitation's source with the Solicited and Override flags, or, when that
/// source is `::` (duplicate address detection), to all nodes with Override only.
pub fn advertisement(ns: &Solicitation, mac: [u8; 6], source: Ipv6Addr) -> Vec<u8> {
    if ns.source.is_unspecified() {
        return unsolicited_advertisement(ns.target, mac, source);
    }
    let dst_mac = ns.source_link_addr.unwrap_or(ns.source_mac);
    let na = Advertisement {
        dst_mac,
        mac,
        source,
        destination: ns.source,
        flags: FLAG_SOLICITED | FLAG_OVERRIDE,
        target: ns.target,
    };
    na.frame()
}

/// An unsolicited advertisement of `target` at `mac` to all nodes, from
/// `source`, with the Override flag (RFC 4861 7.2.6).
pub fn unsolicited_advertisement(target: Ipv6Addr, mac: [u8; 6], source: Ipv6Addr) -> Vec<u8> {
    let na = Advertisement {
        dst_mac: multicast_mac(ALL_NODES),
        mac,
        source,
        destination: ALL_NODES,
        flags: FLAG_OVERRIDE,
        target,
    };
    na.frame()
}

struct Advertisement {
    dst_mac: [u8; 6],
    mac: [u8; 6],
    source: Ipv6Addr,
    destination: Ipv6Addr,
    flags: u8,
    target: Ipv6Addr,
}

impl Advertisement {
    /// The Ethernet frame: IPv6 header, the advertisement with its target
    /// link-layer address option, checksummed.
    fn frame(&self) -> Vec<u8> {
        let mut icmp = vec![TYPE_ADVERTISEMENT, 0, 0, 0, self.flags, 0, 0, 0];
        icmp.extend_from_slice(&self.target.octets());
        icmp.extend_from_slice(&[OPTION_TARGET_LINK_ADDR, 1]);
        icmp.extend_from_slice(&self.mac);
        let sum = checksum(self.source, self.destination, &icmp);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());

        let mut out = ethernet_header(self.dst_mac, self.mac, ETH_P_IPV6);
        out.extend_from_slice(&[0x60, 0, 0, 0]);
        // 32 bytes: the advertisement and its one option.
        out.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
        out.extend_from_slice(&[NEXT_HEADER_ICMPV6, HOP_LIMIT]);
        out.extend_from_slice(&self.source.octets());
        out.extend_from_slice(&self.destination.octets());
        out.extend_from_slice(&icmp);
        out
    }
}

/// The ICMPv6 checksum of `message` between `source` and `destination`
/// (RFC 4443 2.3, with the RFC 8200 pseudo-header): 0 for a message whose
/// checksum field is right, the field's value for one whose field is zero.
pub fn checksum(source: Ipv6Addr, destination: Ipv6Addr, message: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut add = |bytes: &[u8]| {
        for pair in bytes.chunks(2) {
            let hi = u64::from(pair[0]) << 8;
            sum += hi | pair.get(1).map_or(0, |lo| u64::from(*lo));
        }
    };
    add(&source.octets());
    add(&destination.octets());
    add(&(message.len() as u32).to_be_bytes());
    add(&[0, 0, 0, NEXT_HEADER_ICMPV6]);
    add(message);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The solicited-node multicast group of `addr` (ff02::1:ffXX:XXXX).
pub fn solicited_node(addr: Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    let low = u32::from_be_bytes([0xff, o[13], o[14], o[15]]);
    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, (low >> 16) as u16, low as u16)
}

fn is_solicited_node(addr: Ipv6Addr) -> bool {
    solicited_node(addr) == addr
}

/// The Ethernet multicast MAC of IPv6 multicast group `group` (33:33 and its
/// last four bytes, RFC 2464 7).
pub fn multicast_mac(group: Ipv6Addr) -> [u8; 6] {
    let o = group.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

fn ipv6(b: &[u8]) -> Option<Ipv6Addr> {
    <[u8; 16]>::try_from(b).ok().map(Ipv6Addr::from)
}

#[cfg(test)]
mod tests {
    use super::super::frame::hex;
    use super::*;

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    /// A neighbour solicitation for fd00:9::100 sent by Linux 6.x from
    /// fd00:9::2 (12:41:22:c4:e7:4c, with a source link-layer address option),
    /// captured in the netns test. Its checksum (0x6137) is the kernel's.
    const KERNEL_NS: &str = "3333ff000100124122c4e74c86dd6000000000203afffd0000090000000000000000\
                             00000002ff0200000000000000000001ff0001008700613700000000fd00000900\
                             00000000000000000001000101124122c4e74c";
    /// Duplicate address detection by Linux for fe80::433:46ff:fedd:b1a1: from
    /// `::`, with a nonce option (type 14), captured likewise.
    const KERNEL_DAD: &str = "3333ffddb1a1063346ddb1a186dd6000000000203aff00000000000000000000\
                              000000000000ff0200000000000000000001ffddb1a1870080a700000000fe80\
                              000000000000043346fffeddb1a10e0103d1327608ff";
    const REQUESTER: [u8; 6] = [0x12, 0x41, 0x22, 0xc4, 0xe7, 0x4c];
    const OURS: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];

    fn kernel_ns() -> Solicitation {
        Solicitation {
            source: v6("fd00:9::2"),
            source_mac: REQUESTER,
            source_link_addr: Some(REQUESTER),
            target: v6("fd00:9::100"),
        }
    }

    #[test]
    fn parses_kernel_solicitations() {
        assert_eq!(parse_solicitation(&hex(KERNEL_NS)), Some(kernel_ns()));
        let dad = parse_solicitation(&hex(KERNEL_DAD)).unwrap();
        assert_eq!(dad.source, Ipv6Addr::UNSPECIFIED);
        assert_eq!(dad.source_link_addr, None);
        assert_eq!(dad.target, v6("fe80::433:46ff:fedd:b1a1"));
        assert_eq!(dad.source_mac, [0x06, 0x33, 0x46, 0xdd, 0xb1, 0xa1]);
    }

    #[test]
    fn checksum_matches_the_kernels() {
        let frame = hex(KERNEL_NS);
        let mut icmp = frame[54..].to_vec();
        assert_eq!(checksum(v6("fd00:9::2"), v6("ff02::1:ff00:100"), &icmp), 0);
        icmp[2..4].fill(0);
        assert_eq!(
            checksum(v6("fd00:9::2"), v6("ff02::1:ff00:100"), &icmp),
            0x6137
        );
        // An odd length is padded with a zero byte at the end: 0xff00, plus the
        // pseudo-header's length (1) and next header (58).
        let odd = checksum(Ipv6Addr::UNSPECIFIED, Ipv6Addr::UNSPECIFIED, &[0xff]);
        assert_eq!(odd, !(0xff00 + 1 + 58));
    }

    #[test]
    fn ignores_short_malformed_and_foreign_frames() {
        let frame = hex(KERNEL_NS);
        for len in [0, 13, 20, 54, 77, 85] {
            assert_eq!(parse_solicitation(&frame[..len]), None, "{len} bytes");
        }
        // (offset, value): EtherType, IP version, next header, hop limit
        // (routed), ICMPv6 type (advertisement), code, checksum, target
        // multicast and option length 0 (both caught by the checksum here;
        // see options_and_dad_rules).
        for (at, value) in [
            (12, 0x08),
            (14, 0x40),
            (20, 17),
            (21, 64),
            (54, 136),
            (55, 1),
            (56, 0),
            (62, 0xff),
            (79, 0),
        ] {
            let mut bad = frame.clone();
            bad[at] = value;
            assert_eq!(parse_solicitation(&bad), None, "byte {at} = {value:#x}");
        }
        // A payload length past the frame's end.
        let mut bad = frame.clone();
        bad[19] = 0x28;
        assert_eq!(parse_solicitation(&bad), None);
    }

    /// The frame of `ns` with its checksum computed again.
    fn ns_frame(
        source: Ipv6Addr,
        destination: Ipv6Addr,
        target: Ipv6Addr,
        options: &[u8],
    ) -> Vec<u8> {
        let mut icmp = vec![TYPE_SOLICITATION, 0, 0, 0, 0, 0, 0, 0];
        icmp.extend_from_slice(&target.octets());
        icmp.extend_from_slice(options);
        let sum = checksum(source, destination, &icmp);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
        let mut out = ethernet_header(multicast_mac(destination), REQUESTER, ETH_P_IPV6);
        out.extend_from_slice(&[0x60, 0, 0, 0]);
        out.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
        out.extend_from_slice(&[NEXT_HEADER_ICMPV6, HOP_LIMIT]);
        out.extend_from_slice(&source.octets());
        out.extend_from_slice(&destination.octets());
        out.extend_from_slice(&icmp);
        out
    }

    #[test]
    fn options_and_dad_rules() {
        let (src, group, target) = (v6("fd00:9::2"), v6("ff02::1:ff00:100"), v6("fd00:9::100"));
        // No options: the Ethernet source is where the answer goes.
        let ns = parse_solicitation(&ns_frame(src, group, target, &[])).unwrap();
        assert_eq!(ns.source_link_addr, None);
        // An unknown option before the source link-layer address is skipped.
        let options = hex("0e0103d1327608ff0101aabbccddeeff");
        let ns = parse_solicitation(&ns_frame(src, group, target, &options)).unwrap();
        assert_eq!(
            ns.source_link_addr,
            Some([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff])
        );
        // A multicast target; an option of length 0 (with right checksums).
        assert_eq!(parse_solicitation(&ns_frame(src, group, group, &[])), None);
        let zero_length = hex("0100aabbccddeeff");
        assert_eq!(
            parse_solicitation(&ns_frame(src, group, target, &zero_length)),
            None
        );
        // An option running past the end.
        assert_eq!(
            parse_solicitation(&ns_frame(src, group, target, &hex("0102aabbccddeeff"))),
            None
        );
        // DAD: to the solicited-node group, and without a source link-layer option.
        let any = Ipv6Addr::UNSPECIFIED;
        assert!(parse_solicitation(&ns_frame(any, group, target, &[])).is_some());
        assert_eq!(
            parse_solicitation(&ns_frame(any, target, target, &[])),
            None
        );
        assert_eq!(
            parse_solicitation(&ns_frame(any, group, target, &hex("0101aabbccddeeff"))),
            None
        );
    }

    #[test]
    fn answers_a_solicitation() {
        let source = v6("fe80::1");
        let na = advertisement(&kernel_ns(), OURS, source);
        // Checksum 0x1a0b, computed independently (a Python one-liner over the
        // pseudo-header and message).
        let expected = hex("124122c4e74c02000000000186dd6000000000203aff\
             fe800000000000000000000000000001fd000009000000000000000000000002\
             88001a0b60000000fd000009000000000000000000000100\
             0201020000000001");
        assert_eq!(na, expected);
        assert_eq!(checksum(source, v6("fd00:9::2"), &na[54..]), 0);
        // Without a source link-layer option, to the frame's source MAC.
        let ns = Solicitation {
            source_link_addr: None,
            source_mac: [0x02, 0, 0, 0, 0, 0x99],
            ..kernel_ns()
        };
        assert_eq!(advertisement(&ns, OURS, source)[..6], ns.source_mac);
    }

    #[test]
    fn answers_dad_and_announces_to_all_nodes() {
        let target = v6("fd00:9::100");
        let dad = Solicitation {
            source: Ipv6Addr::UNSPECIFIED,
            source_link_addr: None,
            ..kernel_ns()
        };
        let na = advertisement(&dad, OURS, target);
        assert_eq!(na, unsolicited_advertisement(target, OURS, target));
        assert_eq!(na[..6], [0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(na[38..54], ALL_NODES.octets());
        assert_eq!(na[58], FLAG_OVERRIDE, "Override without Solicited");
        assert_eq!(checksum(target, ALL_NODES, &na[54..]), 0);
    }

    #[test]
    fn solicited_node_groups() {
        assert_eq!(solicited_node(v6("fd00:9::100")), v6("ff02::1:ff00:100"));
        assert_eq!(
            solicited_node(v6("2001:db8::abcd:ef12:3456")),
            v6("ff02::1:ff12:3456")
        );
        assert_eq!(
            multicast_mac(v6("ff02::1:ff12:3456")),
            [0x33, 0x33, 0xff, 0x12, 0x34, 0x56]
        );
        assert!(is_solicited_node(v6("ff02::1:ff00:100")));
        assert!(!is_solicited_node(ALL_NODES));
    }
}
