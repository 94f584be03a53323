//! `NetlinkSocket`: a blocking NETLINK_ROUTE socket bound to the network
//! namespace of the thread that created it. Owns framing, sequence numbers,
//! request/ACK handling, multipart dumps and the mapping of kernel errors
//! (errno + extended ACK message) to [`DatapathError`].
//!
//! The per-object operations (links, addresses, routes, ...) live in their
//! own files as further `impl NetlinkSocket` blocks.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_CAPPED, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
    NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use super::error::{DatapathError, Result};

/// Receive buffer size. Dumps are sent by the kernel in chunks of up to
/// ~NLMSG_GOODSIZE (one page) or more for large link messages; 32 KiB is ample.
const RECV_BUF_SIZE: usize = 32 * 1024;

/// How often a dump is retried when the kernel flags it as interrupted
/// (NLM_F_DUMP_INTR: the object set changed while dumping).
const DUMP_RETRIES: usize = 5;

/// One request, built but not sent (see [`NetlinkSocket::batch`]): the message,
/// its flags besides REQUEST|ACK, and what it does (its error context, written
/// only when it fails).
pub struct Request<'a> {
    pub(crate) msg: RouteNetlinkMessage,
    pub(crate) flags: u16,
    pub(crate) ctx: Box<dyn Fn() -> String + 'a>,
}

/// A synchronous rtnetlink socket. Not `Sync`: use one per thread.
/// It stays bound to the netns it was created in, whatever thread uses it later.
#[derive(Debug)]
pub struct NetlinkSocket {
    sock: Socket,
    seq: Cell<u32>,
    /// The receive buffer, allocated once per socket (empty while a receive has it).
    recv_buf: RefCell<Vec<u8>>,
    /// Human-readable label of the namespace (for error messages), e.g. the
    /// netns path when created with [`NetlinkSocket::new_in`].
    ns_label: Option<String>,
}

impl NetlinkSocket {
    /// Open a socket in the calling thread's current network namespace.
    pub fn new() -> Result<Self> {
        let ctx = "opening NETLINK_ROUTE socket";
        let mut sock = Socket::new(NETLINK_ROUTE).map_err(|e| DatapathError::io(ctx, e))?;
        sock.bind(&SocketAddr::new(0, 0))
            .map_err(|e| DatapathError::io(ctx, e))?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(|e| DatapathError::io(ctx, e))?;
        sock.set_netlink_get_strict_chk(true)
            .map_err(|e| DatapathError::io(ctx, e))?;
        // Extended ACKs carry a human-readable reason; capped ACKs keep error
        // replies small (only the request header is echoed back). Both are
        // best-effort: old kernels lack them.
        let _ = sock.set_ext_ack(true);
        let _ = sock.set_cap_ack(true);
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(1);
        Ok(NetlinkSocket {
            sock,
            seq: Cell::new(seed),
            recv_buf: RefCell::new(Vec::new()),
            ns_label: None,
        })
    }

    pub(crate) fn set_ns_label(&mut self, label: String) {
        self.ns_label = Some(label);
    }

    /// The label of the namespace it was opened in with
    /// [`new_in`](NetlinkSocket::new_in), if any.
    pub(crate) fn ns_label(&self) -> Option<&str> {
        self.ns_label.as_deref()
    }

    /// Suffix for error contexts: `" in <netns>"` for sockets opened in another netns.
    pub(crate) fn where_(&self) -> String {
        match &self.ns_label {
            Some(l) => format!(" in {l}"),
            None => String::new(),
        }
    }

    /// The socket's descriptor, for the ioctls that answer for its netns.
    pub(super) fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn next_seq(&self) -> u32 {
        let s = self.seq.get().wrapping_add(1).max(1);
        self.seq.set(s);
        s
    }

    /// Send a request (NLM_F_REQUEST | NLM_F_ACK | `flags`) and collect every
    /// reply message until the ACK. A NACK becomes a [`DatapathError::Netlink`]
    /// whose context is produced by `ctx`.
    pub(crate) fn request(
        &self,
        msg: RouteNetlinkMessage,
        flags: u16,
        ctx: impl Fn() -> String,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        let seq = self.send(msg, NLM_F_REQUEST | NLM_F_ACK | flags, &ctx)?;
        self.receive(seq, &ctx).map(|(msgs, _)| msgs)
    }

    /// Send a dump request (NLM_F_REQUEST | NLM_F_DUMP) and collect the
    /// multipart reply until NLMSG_DONE. Retries when the dump was interrupted.
    pub(crate) fn dump(
        &self,
        msg: RouteNetlinkMessage,
        ctx: impl Fn() -> String,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let seq = self.send(msg.clone(), NLM_F_REQUEST | NLM_F_DUMP, &ctx)?;
            let (msgs, interrupted) = self.receive(seq, &ctx)?;
            if !interrupted || attempt >= DUMP_RETRIES {
                return Ok(msgs);
            }
        }
    }

    /// Sends `reqs` in one datagram and reads their answers in order: the kernel
    /// handles the messages of a datagram one after the other and acknowledges
    /// each, also after one failed. One outcome per request, in order, each error
    /// with that request's context; `Err` only when the datagram was not sent.
    pub fn batch(&self, reqs: Vec<Request<'_>>) -> Result<Vec<Result<()>>> {
        Ok(self
            .batch_replies(reqs)?
            .into_iter()
            .map(|r| r.map(|_| ()))
            .collect())
    }

    /// [`batch`](Self::batch), with each request's reply messages.
    pub(crate) fn batch_replies(
        &self,
        reqs: Vec<Request<'_>>,
    ) -> Result<Vec<Result<Vec<RouteNetlinkMessage>>>> {
        let mut buf = Vec::new();
        let mut sent = Vec::with_capacity(reqs.len());
        for req in reqs {
            let seq = self.serialize(req.msg, NLM_F_REQUEST | NLM_F_ACK | req.flags, &mut buf);
            sent.push((seq, req.ctx));
        }
        self.send_buf(&buf, &|| {
            format!(
                "sending {} requests in one datagram{}",
                sent.len(),
                self.where_()
            )
        })?;
        Ok(sent
            .into_iter()
            .map(|(seq, ctx)| self.receive(seq, &ctx).map(|(msgs, _)| msgs))
            .collect())
    }

    /// Sends one request and waits for its answer (the single-request [`batch`](Self::batch)).
    pub(crate) fn perform(&self, req: Request<'_>) -> Result<()> {
        self.request(req.msg, req.flags, req.ctx).map(|_| ())
    }

    fn send(&self, msg: RouteNetlinkMessage, flags: u16, ctx: &impl Fn() -> String) -> Result<u32> {
        let mut buf = Vec::new();
        let seq = self.serialize(msg, flags, &mut buf);
        self.send_buf(&buf, ctx)?;
        Ok(seq)
    }

    /// Appends `msg` with the next sequence number to `buf` (netlink messages are
    /// 4-byte aligned, so one follows another as serialized); returns the number.
    fn serialize(&self, msg: RouteNetlinkMessage, flags: u16, buf: &mut Vec<u8>) -> u32 {
        let seq = self.next_seq();
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        packet.finalize();
        let start = buf.len();
        buf.resize(start + ((packet.buffer_len() + 3) & !3), 0);
        packet.serialize(&mut buf[start..]);
        seq
    }

    fn send_buf(&self, buf: &[u8], ctx: &impl Fn() -> String) -> Result<()> {
        let sent = self
            .sock
            .send(buf, 0)
            .map_err(|e| netlink_err(ctx(), e, None))?;
        if sent != buf.len() {
            return Err(netlink_err(
                ctx(),
                io::Error::new(io::ErrorKind::WriteZero, "short netlink send"),
                None,
            ));
        }
        Ok(())
    }

    /// Read replies for `seq` until ACK/NACK/DONE. Returns the collected
    /// messages and whether any carried NLM_F_DUMP_INTR.
    fn receive(
        &self,
        seq: u32,
        ctx: &impl Fn() -> String,
    ) -> Result<(Vec<RouteNetlinkMessage>, bool)> {
        let mut buf = self.recv_buf.take();
        buf.reserve(RECV_BUF_SIZE);
        let received = self.receive_into(&mut buf, seq, ctx);
        self.recv_buf.replace(buf);
        received
    }

    fn receive_into(
        &self,
        buf: &mut Vec<u8>,
        seq: u32,
        ctx: &impl Fn() -> String,
    ) -> Result<(Vec<RouteNetlinkMessage>, bool)> {
        let mut out = Vec::new();
        let mut interrupted = false;
        loop {
            buf.clear();
            let n = loop {
                match self.sock.recv(buf, 0) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(netlink_err(ctx(), e, None)),
                }
            };
            if n > buf.len() {
                return Err(DatapathError::Decode {
                    context: ctx(),
                    message: format!("datagram of {n} bytes truncated to {}", buf.len()),
                });
            }
            let mut offset = 0;
            while offset < buf.len() {
                let rest = &buf[offset..];
                let packet =
                    NetlinkMessage::<RouteNetlinkMessage>::deserialize(rest).map_err(|e| {
                        DatapathError::Decode {
                            context: ctx(),
                            message: e.to_string(),
                        }
                    })?;
                let len = packet.header.length as usize;
                if len == 0 {
                    break;
                }
                offset += (len + 3) & !3;
                if packet.header.sequence_number != seq {
                    // A late reply to an earlier (e.g. failed) request: ignore.
                    continue;
                }
                if packet.header.flags & NLM_F_DUMP_INTR != 0 {
                    interrupted = true;
                }
                let hflags = packet.header.flags;
                match packet.payload {
                    // Single replies (GET by name) are followed by the ACK we
                    // asked for; dump parts are followed by NLMSG_DONE.
                    NetlinkPayload::InnerMessage(m) => out.push(m),
                    NetlinkPayload::Error(err) => {
                        if err.code.is_none() {
                            return Ok((out, interrupted));
                        }
                        let ext = ext_ack_message(hflags, &err.header);
                        return Err(netlink_err(ctx(), err.to_io(), ext));
                    }
                    NetlinkPayload::Done(done) => {
                        if done.code != 0 {
                            return Err(netlink_err(
                                ctx(),
                                io::Error::from_raw_os_error(done.code.abs()),
                                None,
                            ));
                        }
                        return Ok((out, interrupted));
                    }
                    NetlinkPayload::Overrun(_) => {
                        return Err(netlink_err(
                            ctx(),
                            io::Error::from_raw_os_error(libc::ENOBUFS),
                            None,
                        ));
                    }
                    _ => {}
                }
            }
        }
    }
}

fn netlink_err(context: String, source: io::Error, ext_ack: Option<String>) -> DatapathError {
    DatapathError::Netlink {
        context,
        source,
        ext_ack,
    }
}

/// Extract NLMSGERR_ATTR_MSG from an NLMSG_ERROR payload (after the errno),
/// which is: the echoed request (only its 16-byte header when NLM_F_CAPPED),
/// then TLVs when NLM_F_ACK_TLVS is set.
fn ext_ack_message(flags: u16, payload: &[u8]) -> Option<String> {
    const NLMSGERR_ATTR_MSG: u16 = 1;
    if flags & NLM_F_ACK_TLVS == 0 || payload.len() < 16 {
        return None;
    }
    let echoed = if flags & NLM_F_CAPPED != 0 {
        16
    } else {
        let len = u32::from_ne_bytes([payload[0], payload[1], payload[2], payload[3]]) as usize;
        (len + 3) & !3
    };
    let mut tlvs = payload.get(echoed..)?;
    while tlvs.len() >= 4 {
        let nla_len = u16::from_ne_bytes([tlvs[0], tlvs[1]]) as usize;
        let nla_type = u16::from_ne_bytes([tlvs[2], tlvs[3]]) & 0x3fff;
        if nla_len < 4 || nla_len > tlvs.len() {
            break;
        }
        if nla_type == NLMSGERR_ATTR_MSG {
            let value = &tlvs[4..nla_len];
            let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
            return Some(String::from_utf8_lossy(&value[..end]).into_owned());
        }
        tlvs = tlvs.get(((nla_len + 3) & !3)..).unwrap_or(&[]);
    }
    None
}
