//! `PacketSocket`: an AF_PACKET/SOCK_RAW socket bound to one interface and one
//! EtherType, with a classic BPF filter attached before it is bound (so it
//! never queues a packet the filter refuses), multicast MAC membership, and
//! non-blocking whole-frame send and receive.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::error::ResponderError;
use super::frame::BpfInstruction;

/// A packet the socket received: its length and `sll_pkttype`
/// (`libc::PACKET_OUTGOING` for the node's own).
pub struct Received {
    pub len: usize,
    pub pkttype: u8,
}

#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: i32,
    interface: String,
}

impl PacketSocket {
    /// A socket receiving the `ethertype` frames of link `ifindex` (named
    /// `interface`) that `filter` passes.
    pub fn open(
        interface: &str,
        ifindex: u32,
        ethertype: u16,
        filter: &[BpfInstruction],
    ) -> Result<Self, ResponderError> {
        let err = |operation, e| ResponderError::socket(interface, operation, e);
        let ifindex = i32::try_from(ifindex).map_err(|_| {
            err(
                "binding a packet socket",
                io::Error::from_raw_os_error(libc::ENODEV),
            )
        })?;
        // Protocol 0: it receives nothing until bound below, filter in place.
        // SAFETY: plain socket(2); the descriptor is owned right away.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if raw < 0 {
            return Err(err("opening a packet socket", io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let sock = PacketSocket {
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
            ifindex,
            interface: interface.to_string(),
        };
        let program = libc::sock_fprog {
            len: u16::try_from(filter.len()).unwrap_or(u16::MAX),
            filter: filter.as_ptr().cast_mut(),
        };
        sock.setsockopt(libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &program)
            .map_err(|e| err("attaching the packet filter", e))?;
        let mut addr = sock.link_address();
        addr.sll_protocol = ethertype.to_be();
        // SAFETY: `addr` is a valid sockaddr_ll of the size passed.
        let rc = unsafe {
            libc::bind(
                sock.fd.as_raw_fd(),
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(err("binding a packet socket", io::Error::last_os_error()));
        }
        Ok(sock)
    }

    /// Receive the frames sent to multicast MAC `mac` (a real NIC filters the
    /// groups nobody joined). The kernel counts joins: one `leave` per `join`.
    pub fn join(&self, mac: [u8; 6]) -> Result<(), ResponderError> {
        self.membership(libc::PACKET_ADD_MEMBERSHIP, mac)
            .map_err(|e| ResponderError::socket(&self.interface, "joining a multicast MAC", e))
    }

    /// Undo one [`join`](Self::join) of `mac`.
    pub fn leave(&self, mac: [u8; 6]) -> Result<(), ResponderError> {
        self.membership(libc::PACKET_DROP_MEMBERSHIP, mac)
            .map_err(|e| ResponderError::socket(&self.interface, "leaving a multicast MAC", e))
    }

    fn membership(&self, option: libc::c_int, mac: [u8; 6]) -> io::Result<()> {
        let mut mreq = libc::packet_mreq {
            mr_ifindex: self.ifindex,
            mr_type: libc::PACKET_MR_MULTICAST as libc::c_ushort,
            mr_alen: 6,
            mr_address: [0; 8],
        };
        mreq.mr_address[..6].copy_from_slice(&mac);
        self.setsockopt(libc::SOL_PACKET, option, &mreq)
    }

    /// Send one whole Ethernet frame out of the interface.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: `frame` is valid for its length; the socket is bound, so no
        // address is needed.
        let rc = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next queued frame into `buf` (cut to its size); `None` when none is
    /// queued. A pending socket error (ENETDOWN: the link went down or away)
    /// comes back as the error.
    pub fn receive(&self, buf: &mut [u8]) -> io::Result<Option<Received>> {
        let mut from = self.link_address();
        let mut from_len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: `buf` and `from` are valid for the sizes passed.
        let rc = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&raw mut from).cast(),
                &mut from_len,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(Received {
            len: usize::try_from(rc).unwrap_or(0).min(buf.len()),
            pkttype: from.sll_pkttype,
        }))
    }

    fn link_address(&self) -> libc::sockaddr_ll {
        // SAFETY: sockaddr_ll is plain data; all zeroes is a valid value.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as libc::c_ushort;
        addr.sll_ifindex = self.ifindex;
        addr
    }

    fn setsockopt<T>(&self, level: libc::c_int, option: libc::c_int, value: &T) -> io::Result<()> {
        // SAFETY: `value` is a valid T of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                option,
                (value as *const T).cast(),
                size_of::<T>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl AsRawFd for PacketSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
