//! ARP frames (RFC 826, Ethernet + IPv4 only), pure code: the requests the
//! responder answers, its replies, and gratuitous ARP (RFC 5227 announcements).

use std::net::Ipv4Addr;

use super::frame::{ETH_HEADER_LEN, be16, ethernet_header};

/// EtherType of ARP.
pub const ETH_P_ARP: u16 = 0x0806;
/// The broadcast MAC.
pub const BROADCAST_MAC: [u8; 6] = [0xff; 6];

/// Length of an Ethernet/IPv4 ARP payload.
const ARP_LEN: usize = 28;
const HTYPE_ETHERNET: u16 = 1;
const PTYPE_IPV4: u16 = 0x0800;
const OP_REQUEST: u16 = 1;
const OP_REPLY: u16 = 2;

/// The fields of an ARP request the responder needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRequest {
    pub sender_mac: [u8; 6],
    pub sender_ip: Ipv4Addr,
    pub target_ip: Ipv4Addr,
}

impl ArpRequest {
    /// True for a gratuitous ARP (sender IP = target IP): an announcement by
    /// someone else, not a question.
    pub fn is_gratuitous(&self) -> bool {
        self.sender_ip == self.target_ip
    }
}

/// The ARP request (Ethernet/IPv4, op 1) in Ethernet `frame`; `None` for anything
/// else (short, another EtherType, hardware or protocol, a reply).
pub fn parse_request(frame: &[u8]) -> Option<ArpRequest> {
    if frame.len() < ETH_HEADER_LEN + ARP_LEN || be16(frame, 12) != Some(ETH_P_ARP) {
        return None;
    }
    let arp = &frame[ETH_HEADER_LEN..];
    if be16(arp, 0) != Some(HTYPE_ETHERNET)
        || be16(arp, 2) != Some(PTYPE_IPV4)
        || arp[4] != 6
        || arp[5] != 4
        || be16(arp, 6) != Some(OP_REQUEST)
    {
        return None;
    }
    Some(ArpRequest {
        sender_mac: arp[8..14].try_into().ok()?,
        sender_ip: ipv4(&arp[14..18])?,
        target_ip: ipv4(&arp[24..28])?,
    })
}

/// The reply to `request` from `mac`: `request.target_ip` is at `mac`, sent
/// unicast to the requester.
pub fn reply(request: &ArpRequest, mac: [u8; 6]) -> Vec<u8> {
    arp_frame(
        request.sender_mac,
        mac,
        OP_REPLY,
        (request.target_ip, request.sender_mac, request.sender_ip),
    )
}

/// A gratuitous ARP request from `mac` announcing `ip` to the broadcast domain
/// (sender IP = target IP = `ip`, target MAC zero as RFC 5227 says).
pub fn gratuitous(ip: Ipv4Addr, mac: [u8; 6]) -> Vec<u8> {
    arp_frame(BROADCAST_MAC, mac, OP_REQUEST, (ip, [0; 6], ip))
}

/// An Ethernet/IPv4 ARP frame from `mac` to `dst`; `(sender IP, target MAC,
/// target IP)`.
fn arp_frame(
    dst: [u8; 6],
    mac: [u8; 6],
    op: u16,
    fields: (Ipv4Addr, [u8; 6], Ipv4Addr),
) -> Vec<u8> {
    let (sender_ip, target_mac, target_ip) = fields;
    let mut out = ethernet_header(dst, mac, ETH_P_ARP);
    out.extend_from_slice(&HTYPE_ETHERNET.to_be_bytes());
    out.extend_from_slice(&PTYPE_IPV4.to_be_bytes());
    out.extend_from_slice(&[6, 4]);
    out.extend_from_slice(&op.to_be_bytes());
    out.extend_from_slice(&mac);
    out.extend_from_slice(&sender_ip.octets());
    out.extend_from_slice(&target_mac);
    out.extend_from_slice(&target_ip.octets());
    out
}

fn ipv4(b: &[u8]) -> Option<Ipv4Addr> {
    <[u8; 4]>::try_from(b).ok().map(Ipv4Addr::from)
}

#[cfg(test)]
mod tests {
    use super::super::frame::hex;
    use super::*;

    /// An ARP request for 10.9.0.100 sent by Linux 6.x from 12:41:22:c4:e7:4c
    /// (10.9.0.2), captured in the netns test.
    const KERNEL_REQUEST: &str = "ffffffffffff124122c4e74c08060001080006040001124122c4e74c\
                                  0a0900020000000000000a090064";
    const REQUESTER: [u8; 6] = [0x12, 0x41, 0x22, 0xc4, 0xe7, 0x4c];
    const OURS: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];

    fn request() -> ArpRequest {
        ArpRequest {
            sender_mac: REQUESTER,
            sender_ip: Ipv4Addr::new(10, 9, 0, 2),
            target_ip: Ipv4Addr::new(10, 9, 0, 100),
        }
    }

    #[test]
    fn parses_a_kernel_request() {
        let frame = hex(KERNEL_REQUEST);
        assert_eq!(parse_request(&frame), Some(request()));
        assert!(!request().is_gratuitous());
        // Ethernet padding after the payload is fine.
        let mut padded = frame.clone();
        padded.resize(60, 0);
        assert_eq!(parse_request(&padded), Some(request()));
    }

    #[test]
    fn ignores_short_malformed_and_foreign_frames() {
        let frame = hex(KERNEL_REQUEST);
        for len in [0, 13, 14, 41] {
            assert_eq!(parse_request(&frame[..len]), None, "{len} bytes");
        }
        // (offset, value): EtherType IPv4, hardware type, protocol IPv6,
        // hardware length, protocol length, a reply, an unknown opcode.
        for (at, value) in [
            (12, 0x08),
            (13, 0x00),
            (15, 6),
            (16, 0x86),
            (18, 8),
            (19, 16),
            (21, 2),
            (21, 3),
        ] {
            let mut bad = frame.clone();
            if at == 12 {
                bad[13] = 0; // 0x0800
            }
            bad[at] = value;
            assert_eq!(parse_request(&bad), None, "byte {at} = {value:#x}");
        }
    }

    #[test]
    fn builds_the_reply() {
        let reply = reply(&request(), OURS);
        // To the requester, from us: 10.9.0.100 is at OURS.
        let expected = hex(
            "124122c4e74c020000000001080600010800060400020200000000010a090064124122c4e74c0a090002",
        );
        assert_eq!(reply, expected);
        assert_eq!(parse_request(&reply), None, "a reply is not a request");
    }

    #[test]
    fn builds_a_gratuitous_request() {
        let garp = gratuitous(Ipv4Addr::new(10, 9, 0, 100), OURS);
        let expected = hex(
            "ffffffffffff020000000001080600010800060400010200000000010a0900640000000000000a090064",
        );
        assert_eq!(garp, expected);
        let parsed = parse_request(&garp).unwrap();
        assert!(parsed.is_gratuitous());
        assert_eq!(parsed.sender_mac, OURS);
    }
}
