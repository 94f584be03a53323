use super::*;

/// An IPv4 header (20 bytes, no options) from 10.0.0.1 to 10.0.0.2 of `protocol`.
fn ipv4(protocol: u8) -> Vec<u8> {
    let mut b = vec![0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, protocol, 0, 0];
    b.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
    b
}

/// An IPv6 header from fd00::1 to fd00::2, next header `protocol`.
fn ipv6(protocol: u8) -> Vec<u8> {
    let mut b = vec![0x60, 0, 0, 0, 0, 20, protocol, 64];
    let mut a = [0u8; 16];
    a[0] = 0xfd;
    a[15] = 1;
    b.extend_from_slice(&a);
    a[15] = 2;
    b.extend_from_slice(&a);
    b
}

/// Source port 40000, destination port 80, then the rest of a TCP header.
fn ports() -> Vec<u8> {
    let mut b = 40000u16.to_be_bytes().to_vec();
    b.extend_from_slice(&80u16.to_be_bytes());
    b.extend_from_slice(&[0; 16]);
    b
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn ipv4_tcp_and_udp_give_addresses_and_the_destination_port() {
    for (number, transport) in [
        (6, Transport::Tcp),
        (17, Transport::Udp),
        (132, Transport::Sctp),
    ] {
        let packet = [ipv4(number), ports()].concat();
        assert_eq!(
            parse_packet(&packet),
            Ok(Packet {
                source: ip("10.0.0.1"),
                destination: ip("10.0.0.2"),
                transport,
                port: Some(80),
            })
        );
    }
}

#[test]
fn ipv4_options_move_the_transport_header() {
    let mut packet = ipv4(6);
    packet[0] = 0x46;
    packet.extend_from_slice(&[1, 1, 1, 0]);
    packet.extend(ports());
    assert_eq!(parse_packet(&packet).unwrap().port, Some(80));
}

#[test]
fn ipv6_tcp_gives_addresses_and_the_port() {
    let packet = [ipv6(6), ports()].concat();
    let p = parse_packet(&packet).unwrap();
    assert_eq!((p.source, p.destination), (ip("fd00::1"), ip("fd00::2")));
    assert_eq!((p.transport, p.port), (Transport::Tcp, Some(80)));
}

#[test]
fn icmp_and_other_protocols_have_no_port() {
    let p = parse_packet(&[ipv4(1), vec![8, 0, 0, 0]].concat()).unwrap();
    assert_eq!((p.transport, p.port), (Transport::Icmp, None));
    let p = parse_packet(&ipv6(58)).unwrap();
    assert_eq!(p.transport, Transport::Icmp);
    let p = parse_packet(&ipv4(47)).unwrap();
    assert_eq!((p.transport, p.port), (Transport::Other(47), None));
    assert_eq!(Transport::Other(47).name(), "IP protocol 47");
}

#[test]
fn truncated_and_malformed_packets_are_errors() {
    assert_eq!(
        parse_packet(&[]),
        Err(PacketError::Truncated {
            what: "IP",
            need: 1,
            have: 0
        })
    );
    assert_eq!(
        parse_packet(&ipv4(6)[..19]),
        Err(PacketError::Truncated {
            what: "IPv4",
            need: 20,
            have: 19
        })
    );
    assert_eq!(
        parse_packet(&ipv6(6)[..39]),
        Err(PacketError::Truncated {
            what: "IPv6",
            need: 40,
            have: 39
        })
    );
    assert_eq!(
        parse_packet(&[ipv4(6), vec![0, 1, 0]].concat()),
        Err(PacketError::Truncated {
            what: "TCP",
            need: 24,
            have: 23
        })
    );
    assert_eq!(
        parse_packet(&[ipv4(17), vec![0, 1, 0]].concat()),
        Err(PacketError::Truncated {
            what: "UDP",
            need: 24,
            have: 23
        })
    );
    let mut short = ipv4(6);
    short[0] = 0x44;
    assert_eq!(parse_packet(&short), Err(PacketError::HeaderLength(16)));
    let mut long = ipv4(6);
    long[0] = 0x4f;
    assert!(matches!(
        parse_packet(&long),
        Err(PacketError::Truncated { need: 64, .. })
    ));
    assert_eq!(parse_packet(&[0x50; 40]), Err(PacketError::Version(5)));
}

#[test]
fn every_prefix_of_a_packet_parses_or_errs_without_panicking() {
    for (packet, headers) in [
        ([ipv4(6), ports()].concat(), 24),
        ([ipv6(17), ports()].concat(), 44),
    ] {
        for n in 0..packet.len() {
            assert_eq!(
                parse_packet(&packet[..n]).is_ok(),
                n >= headers,
                "{n} bytes"
            );
        }
    }
}

fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
    let mut a = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
    a.extend_from_slice(&kind.to_ne_bytes());
    a.extend_from_slice(value);
    a.resize(align(a.len()), 0);
    a
}

fn message(kind: u16, body: &[u8]) -> Vec<u8> {
    let mut m = ((16 + body.len()) as u32).to_ne_bytes().to_vec();
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&[0; 10]);
    m.extend_from_slice(body);
    m
}

const PACKET: u16 = 4 << 8;

fn packet_message(prefix: &str, payload: &[u8], stamp: Option<(u64, u64)>) -> Vec<u8> {
    let mut body = vec![2, 0, 0, 7];
    body.extend(attribute(1, &[0x08, 0, 3, 0]));
    body.extend(attribute(10, &[prefix.as_bytes(), &[0]].concat()));
    if let Some((sec, usec)) = stamp {
        let t = [sec.to_be_bytes(), usec.to_be_bytes()].concat();
        body.extend(attribute(3, &t));
    }
    body.extend(attribute(9, payload));
    message(PACKET, &body)
}

#[test]
fn a_datagram_of_packet_messages_gives_each_record() {
    let payload = [ipv4(6), ports()].concat();
    let datagram = [
        packet_message(
            "podnet denied ingress",
            &payload,
            Some((1_700_000_000, 250_000)),
        ),
        message(2, &[0; 20]),
        packet_message("podnet audit egress", &payload[..21], None),
    ]
    .concat();
    let records = parse_records(&datagram);
    assert_eq!(records.len(), 2);
    let first = records[0].clone().unwrap();
    assert_eq!(first.prefix, "podnet denied ingress");
    assert_eq!(first.payload, payload);
    assert_eq!(
        first.time,
        Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_250))
    );
    let second = records[1].clone().unwrap();
    assert_eq!(
        (second.prefix.as_str(), second.time),
        ("podnet audit egress", None)
    );
    assert_eq!(second.payload.len(), 21);
}

#[test]
fn malformed_messages_are_errors() {
    assert_eq!(
        parse_records(&[0; 8]),
        vec![Err(MessageError::Truncated {
            what: "a netlink header",
            need: 16,
            have: 8
        })]
    );
    let mut long = message(PACKET, &[2, 0, 0, 7]);
    long[0] = 200;
    assert_eq!(
        parse_records(&long),
        vec![Err(MessageError::Truncated {
            what: "a netlink message",
            need: 200,
            have: 20
        })]
    );
    assert_eq!(
        parse_records(&message(PACKET, &[2, 0])),
        vec![Err(MessageError::Truncated {
            what: "the nfgenmsg",
            need: 4,
            have: 2
        })]
    );
    let bad_attr = message(PACKET, &[2, 0, 0, 7, 40, 0, 10, 0]);
    assert_eq!(
        parse_records(&bad_attr),
        vec![Err(MessageError::Truncated {
            what: "an attribute",
            need: 40,
            have: 4
        })]
    );
    let no_prefix = message(PACKET, &[vec![2, 0, 0, 7], attribute(9, &[0x45])].concat());
    assert_eq!(
        parse_records(&no_prefix),
        vec![Err(MessageError::Missing("prefix"))]
    );
    let no_payload = message(PACKET, &[vec![2, 0, 0, 7], attribute(10, b"p\0")].concat());
    assert_eq!(
        parse_records(&no_payload),
        vec![Err(MessageError::Missing("payload"))]
    );
    let not_text = message(
        PACKET,
        &[vec![2, 0, 0, 7], attribute(10, &[0xff, 0])].concat(),
    );
    assert_eq!(
        parse_records(&not_text),
        vec![Err(MessageError::PrefixNotText)]
    );
}

#[test]
fn every_prefix_of_a_datagram_parses_or_errs_without_panicking() {
    let datagram = packet_message(
        "podnet denied ingress",
        &[ipv4(6), ports()].concat(),
        Some((1, 2)),
    );
    for n in 0..datagram.len() {
        let _ = parse_records(&datagram[..n]);
    }
}

#[test]
fn the_bind_message_binds_the_group_and_copies_the_headers() {
    let m = bind_message(7);
    let mut want = (40u32).to_ne_bytes().to_vec();
    want.extend_from_slice(&((4u16 << 8) | 1).to_ne_bytes());
    want.extend_from_slice(&5u16.to_ne_bytes());
    want.extend_from_slice(&[0; 8]);
    want.extend_from_slice(&[0, 0, 0, 7]);
    want.extend(attribute(1, &[1]));
    want.extend(attribute(2, &[0, 0, 0, 128, 2, 0]));
    assert_eq!(m, want);
    assert_eq!(ack_errno(&message(2, &(-1i32).to_ne_bytes())), Some(1));
    assert_eq!(ack_errno(&message(2, &0i32.to_ne_bytes())), Some(0));
    assert_eq!(ack_errno(&m), None);
}

#[test]
fn a_bound_group_receives_what_nft_logs_to_it() {
    use crate::datapath::tests::{in_private_netns, root};
    use std::os::fd::AsRawFd;
    if !root("a_bound_group_receives_what_nft_logs_to_it") {
        return;
    }
    in_private_netns(|| {
        let socket = NflogSocket::bind(5731).unwrap();
        let timeout = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: a valid fd and a timeval of the size given.
        let set = unsafe {
            libc::setsockopt(
                socket.socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0);
        crate::nft::apply(
            "table inet nflog_test {\n\tchain out {\n\t\ttype filter hook output priority 0;\n\t\tudp dport 9 log prefix \"podnet denied egress\" group 5731\n\t}\n}\n",
        )
        .unwrap();
        let lo = std::process::Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status();
        assert!(lo.unwrap().success());
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        udp.send_to(b"x", "127.0.0.1:9").unwrap();
        let mut buf = Vec::with_capacity(65536);
        let records = socket.receive(&mut buf).unwrap();
        let record = records[0].clone().unwrap();
        assert_eq!(record.prefix, "podnet denied egress");
        let p = parse_packet(&record.payload).unwrap();
        assert_eq!(
            (p.source, p.destination),
            (ip("127.0.0.1"), ip("127.0.0.1"))
        );
        assert_eq!((p.transport, p.port), (Transport::Udp, Some(9)));
        // The group is this socket's: a second bind is refused.
        assert!(matches!(
            NflogSocket::bind(5731),
            Err(NflogError::Refused { .. })
        ));
    });
}
