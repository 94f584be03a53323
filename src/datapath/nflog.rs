//! NFLOG: the packets nftables' `log group N` hands to user space, read from a
//! NETLINK_NETFILTER socket bound to the group ([`NflogSocket`]). The messages
//! ([`parse_records`]) and the packets' IPv4/IPv6 and TCP/UDP/SCTP headers
//! ([`parse_packet`]) are read by pure functions: truncated or malformed input
//! is a typed error, never a panic. Only the first [`COPY_RANGE`] bytes of each
//! packet are copied: the headers, nothing of what the packet carries.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

/// How much of each packet the kernel copies: an IPv6 header and a transport
/// header fit.
pub const COPY_RANGE: u32 = 128;

/// The socket's receive buffer: a burst of a second's records at the node's
/// rate fits many times over.
const RECEIVE_BUFFER: libc::c_int = 1 << 20;

const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;
const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;
const NFULA_TIMESTAMP: u16 = 3;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;

/// What went wrong with the NFLOG socket.
#[derive(Debug, thiserror::Error)]
pub enum NflogError {
    #[error("NFLOG group {group}: {context}: {source}")]
    Socket {
        group: u16,
        context: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("NFLOG group {group}: the kernel refused the bind: {source}")]
    Refused {
        group: u16,
        #[source]
        source: io::Error,
    },
}

impl NflogError {
    /// Whether records were lost to a full receive buffer (ENOBUFS): the
    /// socket reads on.
    pub fn records_lost(&self) -> bool {
        match self {
            NflogError::Socket { source, .. } => source.raw_os_error() == Some(libc::ENOBUFS),
            NflogError::Refused { .. } => false,
        }
    }
}

/// An NFLOG message that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("netlink message truncated: {what} needs {need} bytes, {have} left")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("NFLOG packet without a {0} attribute")]
    Missing(&'static str),
    #[error("NFLOG prefix is not UTF-8 text")]
    PrefixNotText,
}

/// A packet's headers that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    #[error("packet truncated: the {what} header needs {need} bytes, {have} copied")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("packet is IP version {0}, neither 4 nor 6")]
    Version(u8),
    #[error("IPv4 header length {0} is below the 20-byte minimum")]
    HeaderLength(usize),
}

/// One logged packet, as the kernel sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub prefix: String,
    /// When the packet was logged (the kernel's stamp when it sends one).
    pub time: Option<SystemTime>,
    /// The first [`COPY_RANGE`] bytes of the packet, from its IP header.
    pub payload: Vec<u8>,
}

/// The transport protocol of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    Tcp,
    Udp,
    Sctp,
    Icmp,
    /// Another IP protocol number.
    Other(u8),
}

impl Transport {
    fn of(number: u8) -> Transport {
        match number {
            6 => Transport::Tcp,
            17 => Transport::Udp,
            132 => Transport::Sctp,
            1 | 58 => Transport::Icmp,
            n => Transport::Other(n),
        }
    }

    pub fn name(self) -> String {
        match self {
            Transport::Tcp => "TCP".into(),
            Transport::Udp => "UDP".into(),
            Transport::Sctp => "SCTP".into(),
            Transport::Icmp => "ICMP".into(),
            Transport::Other(n) => format!("IP protocol {n}"),
        }
    }

    /// Whether its header starts with the source and destination ports.
    fn has_ports(self) -> bool {
        matches!(self, Transport::Tcp | Transport::Udp | Transport::Sctp)
    }
}

/// The headers of a logged packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    pub source: IpAddr,
    pub destination: IpAddr,
    pub transport: Transport,
    /// The destination port (TCP, UDP, SCTP).
    pub port: Option<u16>,
}

fn need(what: &'static str, bytes: &[u8], n: usize) -> Result<(), PacketError> {
    match bytes.len() >= n {
        true => Ok(()),
        false => Err(PacketError::Truncated {
            what,
            need: n,
            have: bytes.len(),
        }),
    }
}

/// Reads the IP and transport headers at the start of `bytes`. IPv6 extension
/// headers are not walked: a packet that has one reports its next header's
/// protocol number, without a port.
pub fn parse_packet(bytes: &[u8]) -> Result<Packet, PacketError> {
    let first = *bytes.first().ok_or(PacketError::Truncated {
        what: "IP",
        need: 1,
        have: 0,
    })?;
    let (source, destination, protocol, transport_at) = match first >> 4 {
        4 => {
            need("IPv4", bytes, 20)?;
            let header = usize::from(first & 0x0f) * 4;
            if header < 20 {
                return Err(PacketError::HeaderLength(header));
            }
            let addr = |at: usize| {
                IpAddr::V4(Ipv4Addr::new(
                    bytes[at],
                    bytes[at + 1],
                    bytes[at + 2],
                    bytes[at + 3],
                ))
            };
            (addr(12), addr(16), bytes[9], header)
        }
        6 => {
            need("IPv6", bytes, 40)?;
            let addr = |at: usize| {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&bytes[at..at + 16]);
                IpAddr::V6(Ipv6Addr::from(octets))
            };
            (addr(8), addr(24), bytes[6], 40)
        }
        v => return Err(PacketError::Version(v)),
    };
    let transport = Transport::of(protocol);
    let port = match transport.has_ports() {
        true => {
            need(transport_name(transport), bytes, transport_at + 4)?;
            Some(u16::from_be_bytes([
                bytes[transport_at + 2],
                bytes[transport_at + 3],
            ]))
        }
        false => None,
    };
    Ok(Packet {
        source,
        destination,
        transport,
        port,
    })
}

fn transport_name(t: Transport) -> &'static str {
    match t {
        Transport::Tcp => "TCP",
        Transport::Udp => "UDP",
        _ => "SCTP",
    }
}

fn truncated(what: &'static str, need: usize, have: usize) -> MessageError {
    MessageError::Truncated { what, need, have }
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([bytes[at], bytes[at + 1]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// The NFLOG packet records of one datagram (other messages, an ack for one,
/// are skipped), each or its error.
pub fn parse_records(datagram: &[u8]) -> Vec<Result<Record, MessageError>> {
    let mut records = Vec::new();
    let mut rest = datagram;
    while !rest.is_empty() {
        if rest.len() < NLMSG_HDRLEN {
            records.push(Err(truncated("a netlink header", NLMSG_HDRLEN, rest.len())));
            break;
        }
        let len = u32_at(rest, 0) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            records.push(Err(truncated(
                "a netlink message",
                len.max(NLMSG_HDRLEN),
                rest.len(),
            )));
            break;
        }
        if u16_at(rest, 4) == (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET {
            records.push(parse_record(&rest[NLMSG_HDRLEN..len]));
        }
        rest = &rest[align(len).min(rest.len())..];
    }
    records
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// One packet message's body: the nfgenmsg, then its attributes.
fn parse_record(body: &[u8]) -> Result<Record, MessageError> {
    if body.len() < NFGENMSG_LEN {
        return Err(truncated("the nfgenmsg", NFGENMSG_LEN, body.len()));
    }
    let (mut prefix, mut time, mut payload) = (None, None, None);
    let mut rest = &body[NFGENMSG_LEN..];
    while rest.len() >= 4 {
        let len = usize::from(u16_at(rest, 0));
        if len < 4 || len > rest.len() {
            return Err(truncated("an attribute", len.max(4), rest.len()));
        }
        let value = &rest[4..len];
        match u16_at(rest, 2) & 0x3fff {
            NFULA_PREFIX => prefix = Some(prefix_text(value)?),
            NFULA_PAYLOAD => payload = Some(value.to_vec()),
            NFULA_TIMESTAMP => time = timestamp(value),
            _ => {}
        }
        rest = &rest[align(len).min(rest.len())..];
    }
    Ok(Record {
        prefix: prefix.ok_or(MessageError::Missing("prefix"))?,
        time,
        payload: payload.ok_or(MessageError::Missing("payload"))?,
    })
}

fn prefix_text(value: &[u8]) -> Result<String, MessageError> {
    let text = value.split(|b| *b == 0).next().unwrap_or_default();
    String::from_utf8(text.to_vec()).map_err(|_| MessageError::PrefixNotText)
}

/// `struct nfulnl_msg_packet_timestamp`: seconds and microseconds, big-endian.
fn timestamp(value: &[u8]) -> Option<SystemTime> {
    let sec = u64::from_be_bytes(value.get(0..8)?.try_into().ok()?);
    let usec = u64::from_be_bytes(value.get(8..16)?.try_into().ok()?);
    UNIX_EPOCH.checked_add(Duration::from_secs(sec) + Duration::from_micros(usec))
}

/// A config message for `group`: its attributes after the nfgenmsg.
fn config_message(group: u16, attributes: &[(u16, &[u8])]) -> Vec<u8> {
    let mut m = vec![0u8; NLMSG_HDRLEN];
    m.extend_from_slice(&[libc::AF_UNSPEC as u8, 0]);
    m.extend_from_slice(&group.to_be_bytes());
    for (kind, value) in attributes {
        let len = 4 + value.len();
        m.extend_from_slice(&(len as u16).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(value);
        m.resize(align(m.len()), 0);
    }
    let len = m.len() as u32;
    m[0..4].copy_from_slice(&len.to_ne_bytes());
    let kind = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG;
    m[4..6].copy_from_slice(&kind.to_ne_bytes());
    m[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    m
}

/// The bind of `group` with the packets copied up to [`COPY_RANGE`] bytes.
pub fn bind_message(group: u16) -> Vec<u8> {
    let mut mode = COPY_RANGE.to_be_bytes().to_vec();
    mode.extend_from_slice(&[NFULNL_COPY_PACKET, 0]);
    config_message(
        group,
        &[
            (NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]),
            (NFULA_CFG_MODE, &mode),
        ],
    )
}

/// The errno of a netlink error message in `datagram` (0: an ack).
fn ack_errno(datagram: &[u8]) -> Option<i32> {
    let body = datagram.get(NLMSG_HDRLEN..NLMSG_HDRLEN + 4)?;
    (u16_at(datagram, 4) == NLMSG_ERROR).then(|| -(u32_at(body, 0) as i32))
}

/// A NETLINK_NETFILTER socket bound to one NFLOG group of this network
/// namespace. Blocking: read it on its own thread.
pub struct NflogSocket {
    socket: Socket,
    group: u16,
}

impl NflogSocket {
    /// Binds `group` (only one socket of the namespace may hold a group).
    pub fn bind(group: u16) -> Result<NflogSocket, NflogError> {
        let io = |context| {
            move |source| NflogError::Socket {
                group,
                context,
                source,
            }
        };
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(io("socket"))?;
        socket.bind_auto().map_err(io("bind"))?;
        socket
            .set_rx_buf_sz(RECEIVE_BUFFER)
            .map_err(io("set the receive buffer"))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(io("connect"))?;
        socket.send(&bind_message(group), 0).map_err(io("send"))?;
        let mut buf = Vec::with_capacity(4096);
        socket.recv(&mut buf, 0).map_err(io("receive the ack"))?;
        match ack_errno(&buf) {
            Some(0) | None => Ok(NflogSocket { socket, group }),
            Some(errno) => Err(NflogError::Refused {
                group,
                source: io::Error::from_raw_os_error(errno),
            }),
        }
    }

    /// Waits for the next datagram and reads its records. A receive buffer
    /// that overflowed (ENOBUFS: records lost) is an error the caller counts
    /// and reads on after.
    pub fn receive(
        &self,
        buf: &mut Vec<u8>,
    ) -> Result<Vec<Result<Record, MessageError>>, NflogError> {
        buf.clear();
        self.socket
            .recv(buf, 0)
            .map_err(|source| NflogError::Socket {
                group: self.group,
                context: "receive",
                source,
            })?;
        Ok(parse_records(buf))
    }
}

#[cfg(test)]
#[path = "tests/nflog.rs"]
mod tests;
