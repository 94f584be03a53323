//! `Worker`: one interface's answering thread (a blocking std thread, never a
//! tokio one) and the state it shares with [`Responder`](super::Responder): the
//! addresses answered, the announcements still to send, the counters and the
//! failure that ended it. The thread sleeps in poll(2) on its two packet
//! sockets and a wake eventfd, with no timeout unless an announcement is due
//! or the link is down, so an idle interface costs no CPU.

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::ResponderError;
use super::frame::{arp_request_filter, neighbour_solicitation_filter};
use super::raw::PacketSocket;
use super::{arp, ndp};
use crate::datapath::NetlinkSocket;

/// How many times a newly answered address is announced, and how far apart.
const ANNOUNCEMENTS: u8 = 3;
const ANNOUNCE_INTERVAL: Duration = Duration::from_millis(500);
/// How often the thread looks at a link that is down (up again? deleted?), and
/// how long it trusts the link-local address it read.
const LINK_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Receive buffer: ARP requests and neighbour solicitations are far smaller.
const FRAME_BUF: usize = 2048;
/// Frames read from one socket per wake-up.
const DRAIN_BATCH: usize = 64;

/// What an interface has answered since it was first served.
#[derive(Debug, Default)]
pub struct Counters {
    pub arp_replies: AtomicU64,
    pub neighbour_advertisements: AtomicU64,
    pub gratuitous: AtomicU64,
}

/// The addresses answered and the announcements not yet sent.
#[derive(Default)]
struct Answered {
    v4: BTreeSet<Ipv4Addr>,
    v6: BTreeSet<Ipv6Addr>,
    announcements: Vec<Announcement>,
}

struct Announcement {
    ip: IpAddr,
    left: u8,
    due: Instant,
}

impl Answered {
    fn announce(&mut self, ip: IpAddr, now: Instant) {
        self.announcements.retain(|a| a.ip != ip);
        self.announcements.push(Announcement {
            ip,
            left: ANNOUNCEMENTS,
            due: now,
        });
    }

    fn all(&self) -> BTreeSet<IpAddr> {
        let v4 = self.v4.iter().map(|a| IpAddr::V4(*a));
        v4.chain(self.v6.iter().map(|a| IpAddr::V6(*a))).collect()
    }
}

/// State shared by the worker's owner and its thread.
struct Shared {
    interface: String,
    ifindex: u32,
    mac: [u8; 6],
    arp: PacketSocket,
    ndp: PacketSocket,
    /// An eventfd: written to wake the thread (new announcements, stop).
    wake: OwnedFd,
    answered: Mutex<Answered>,
    counters: Arc<Counters>,
    failure: Mutex<Option<ResponderError>>,
    stop: AtomicBool,
}

impl Shared {
    fn answered(&self) -> MutexGuard<'_, Answered> {
        self.answered.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a valid buffer to our eventfd. It cannot
        // fail short of a counter overflow, which the thread's reads prevent.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }
}

/// One served interface: its sockets and thread. Dropping it stops the thread
/// and closes the sockets (and with them the multicast memberships).
pub struct Worker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Opens the sockets of link `ifindex` (named `interface`, MAC `mac`) and
    /// starts its thread, answering nothing yet. `netlink` (in the link's
    /// netns) goes to the thread.
    pub fn start(
        interface: &str,
        ifindex: u32,
        mac: [u8; 6],
        counters: Arc<Counters>,
        netlink: NetlinkSocket,
    ) -> Result<Worker, ResponderError> {
        let arp = PacketSocket::open(interface, ifindex, arp::ETH_P_ARP, &arp_request_filter())?;
        let ndp = PacketSocket::open(
            interface,
            ifindex,
            ndp::ETH_P_IPV6,
            &neighbour_solicitation_filter(),
        )?;
        // SAFETY: plain eventfd(2); the descriptor is owned right away.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wake < 0 {
            let e = io::Error::last_os_error();
            return Err(ResponderError::socket(interface, "creating an eventfd", e));
        }
        let shared = Arc::new(Shared {
            interface: interface.to_string(),
            ifindex,
            mac,
            arp,
            ndp,
            // SAFETY: `wake` is a new descriptor nobody else owns.
            wake: unsafe { OwnedFd::from_raw_fd(wake) },
            answered: Mutex::default(),
            counters,
            failure: Mutex::default(),
            stop: AtomicBool::new(false),
        });
        let thread = std::thread::Builder::new()
            .name(format!("l2-{interface}"))
            .spawn({
                let shared = shared.clone();
                move || Thread::new(shared, netlink).run()
            })
            .map_err(|e| ResponderError::socket(interface, "starting its thread", e))?;
        Ok(Worker {
            shared,
            thread: Some(thread),
        })
    }

    pub fn ifindex(&self) -> u32 {
        self.shared.ifindex
    }

    pub fn mac(&self) -> [u8; 6] {
        self.shared.mac
    }

    /// False once the thread ended (see [`failure`](Self::failure)).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Why the thread ended, if it did.
    pub fn failure(&self) -> Option<ResponderError> {
        let failure = self.shared.failure.lock();
        failure.unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Answers exactly `wanted` from now on: dropped addresses are no longer
    /// answered when this returns; new ones are announced at once (and twice
    /// more). Joins and leaves the solicited-node groups of IPv6 addresses.
    pub fn set_addresses(&self, wanted: &BTreeSet<IpAddr>) -> Result<(), ResponderError> {
        let now = Instant::now();
        let mut answered = self.shared.answered();
        let current = answered.all();
        for ip in current.difference(wanted) {
            match ip {
                IpAddr::V4(a) => answered.v4.remove(a),
                IpAddr::V6(a) => {
                    self.shared.ndp.leave(group_mac(*a))?;
                    answered.v6.remove(a)
                }
            };
            answered.announcements.retain(|a| a.ip != *ip);
        }
        for ip in wanted.difference(&current) {
            match ip {
                IpAddr::V4(a) => answered.v4.insert(*a),
                IpAddr::V6(a) => {
                    self.shared.ndp.join(group_mac(*a))?;
                    answered.v6.insert(*a)
                }
            };
            answered.announce(*ip, now);
        }
        drop(answered);
        self.shared.wake();
        Ok(())
    }

    /// The addresses answered now.
    pub fn addresses(&self) -> BTreeSet<IpAddr> {
        self.shared.answered().all()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!(interface = %self.shared.interface, "the L2 responder thread panicked");
        }
    }
}

/// The multicast MAC of the solicited-node group of `addr`.
fn group_mac(addr: Ipv6Addr) -> [u8; 6] {
    ndp::multicast_mac(ndp::solicited_node(addr))
}

/// The thread's own state.
struct Thread {
    shared: Arc<Shared>,
    netlink: NetlinkSocket,
    buf: Vec<u8>,
    /// The link-local address last read (source of advertisements) and when.
    link_local: Option<(Option<Ipv6Addr>, Instant)>,
    /// When the link was seen down; then it is looked at every second.
    link_down: Option<Instant>,
}

/// What a socket error means for the thread.
enum Next {
    Continue,
    Stop(ResponderError),
}

impl Thread {
    fn new(shared: Arc<Shared>, netlink: NetlinkSocket) -> Self {
        Thread {
            shared,
            netlink,
            buf: vec![0; FRAME_BUF],
            link_local: None,
            link_down: None,
        }
    }

    fn run(mut self) {
        while !self.shared.stop.load(Ordering::Acquire) {
            if let Next::Stop(e) = self.step() {
                tracing::warn!("L2 responder stopped: {e}");
                *self
                    .shared
                    .failure
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(e);
                return;
            }
        }
    }

    /// One wait in poll(2) and what follows it.
    fn step(&mut self) -> Next {
        let shared = &self.shared;
        let mut fds = [
            shared.wake.as_raw_fd(),
            shared.arp.as_raw_fd(),
            shared.ndp.as_raw_fd(),
        ]
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        let timeout = self.timeout_ms();
        // SAFETY: `fds` is a valid array of its length.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Next::Continue;
            }
            return Next::Stop(ResponderError::socket(&self.shared.interface, "poll", e));
        }
        if fds[0].revents != 0 {
            let mut count = [0u8; 8];
            // SAFETY: reads 8 bytes into a valid buffer from our eventfd.
            unsafe { libc::read(self.shared.wake.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        }
        if fds[1].revents != 0
            && let Next::Stop(e) = self.drain(Family::Arp)
        {
            return Next::Stop(e);
        }
        if fds[2].revents != 0
            && let Next::Stop(e) = self.drain(Family::Ndp)
        {
            return Next::Stop(e);
        }
        if let Some(since) = self.link_down
            && since.elapsed() >= LINK_CHECK_INTERVAL
        {
            return self.check_link();
        }
        self.send_due_announcements();
        Next::Continue
    }

    /// Milliseconds until the next due announcement or link check; -1 (no
    /// timeout) when there is neither.
    fn timeout_ms(&self) -> libc::c_int {
        let answered = self.shared.answered();
        let due = answered.announcements.iter().map(|a| a.due);
        let check = self.link_down.map(|since| since + LINK_CHECK_INTERVAL);
        match due.chain(check).min() {
            None => -1,
            Some(at) => {
                let wait = at.saturating_duration_since(Instant::now());
                // Rounded up, so the thread does not wake just before `at`.
                libc::c_int::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(libc::c_int::MAX)
            }
        }
    }
}

/// Which of the two sockets.
#[derive(Clone, Copy)]
enum Family {
    Arp,
    Ndp,
}

impl Thread {
    /// Reads and answers the frames queued on one socket, [`DRAIN_BATCH`] at
    /// the most (poll comes back at once for the rest), so that a flood of
    /// questions does not hold up announcements or a stop.
    fn drain(&mut self, family: Family) -> Next {
        for _ in 0..DRAIN_BATCH {
            let socket = match family {
                Family::Arp => &self.shared.arp,
                Family::Ndp => &self.shared.ndp,
            };
            match socket.receive(&mut self.buf) {
                Ok(None) => return Next::Continue,
                Ok(Some(r)) if r.pkttype == libc::PACKET_OUTGOING => {}
                Ok(Some(r)) => match family {
                    Family::Arp => self.answer_arp(r.len),
                    Family::Ndp => self.answer_ndp(r.len),
                },
                Err(e) if e.raw_os_error() == Some(libc::ENETDOWN) => return self.check_link(),
                Err(e) => {
                    let operation = "receiving from a packet socket";
                    return Next::Stop(ResponderError::socket(
                        &self.shared.interface,
                        operation,
                        e,
                    ));
                }
            }
        }
        Next::Continue
    }

    fn answer_arp(&mut self, len: usize) {
        let Some(request) = arp::parse_request(&self.buf[..len]) else {
            return;
        };
        if request.is_gratuitous() || !self.shared.answered().v4.contains(&request.target_ip) {
            return;
        }
        let reply = arp::reply(&request, self.shared.mac);
        if self.send(&self.shared.arp, &reply) {
            self.shared
                .counters
                .arp_replies
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    fn answer_ndp(&mut self, len: usize) {
        let Some(ns) = ndp::parse_solicitation(&self.buf[..len]) else {
            return;
        };
        if !self.shared.answered().v6.contains(&ns.target) {
            return;
        }
        let source = self.advertisement_source(ns.target);
        let na = ndp::advertisement(&ns, self.shared.mac, source);
        if self.send(&self.shared.ndp, &na) {
            let counter = &self.shared.counters.neighbour_advertisements;
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Sends the announcements that are due (gratuitous ARP, unsolicited NA).
    fn send_due_announcements(&mut self) {
        let now = Instant::now();
        let due: Vec<IpAddr> = {
            let mut answered = self.shared.answered();
            let mut due = Vec::new();
            for a in answered.announcements.iter_mut().filter(|a| a.due <= now) {
                due.push(a.ip);
                a.left -= 1;
                a.due = now + ANNOUNCE_INTERVAL;
            }
            answered.announcements.retain(|a| a.left > 0);
            due
        };
        for ip in due {
            let sent = match ip {
                IpAddr::V4(a) => {
                    let garp = arp::gratuitous(a, self.shared.mac);
                    self.send(&self.shared.arp, &garp)
                }
                IpAddr::V6(a) => {
                    let source = self.advertisement_source(a);
                    let na = ndp::unsolicited_advertisement(a, self.shared.mac, source);
                    self.send(&self.shared.ndp, &na)
                }
            };
            if sent {
                self.shared
                    .counters
                    .gratuitous
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Sends `frame`; a failure (the link is down, a full queue) is logged: the
    /// asker will ask again, and a link coming back up is announced to anew.
    fn send(&self, socket: &PacketSocket, frame: &[u8]) -> bool {
        match socket.send(frame) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(interface = %self.shared.interface, "L2 responder: sending: {e}");
                false
            }
        }
    }

    /// The source of advertisements: the interface's link-local address if it
    /// has one (read again at most every second), else `target` itself.
    fn advertisement_source(&mut self, target: Ipv6Addr) -> Ipv6Addr {
        let fresh = |(_, at): &(Option<Ipv6Addr>, Instant)| at.elapsed() < LINK_CHECK_INTERVAL;
        if !self.link_local.as_ref().is_some_and(fresh) {
            let read = match self.netlink.list_addresses(self.shared.ifindex) {
                Ok(addrs) => addrs.into_iter().find_map(|net| match net.addr() {
                    IpAddr::V6(a) if a.is_unicast_link_local() => Some(a),
                    _ => None,
                }),
                Err(e) => {
                    tracing::debug!("L2 responder: reading the link-local address: {e}");
                    None
                }
            };
            self.link_local = Some((read, Instant::now()));
        }
        self.link_local.and_then(|(a, _)| a).unwrap_or(target)
    }

    /// After ENETDOWN or while the link is down: stop if the link was deleted;
    /// look again in a second while it is down; announce everything again once
    /// it is back up (the socket itself resumes when the link comes up).
    fn check_link(&mut self) -> Next {
        match self.netlink.link_by_index(self.shared.ifindex) {
            Ok(None) => Next::Stop(ResponderError::LinkGone {
                interface: self.shared.interface.clone(),
            }),
            Ok(Some(link)) if !link.up => {
                self.link_down = Some(Instant::now());
                Next::Continue
            }
            Ok(Some(_)) => {
                if self.link_down.take().is_some() {
                    let now = Instant::now();
                    let mut answered = self.shared.answered();
                    for ip in answered.all() {
                        answered.announce(ip, now);
                    }
                }
                Next::Continue
            }
            Err(e) => Next::Stop(ResponderError::Netlink {
                interface: self.shared.interface.clone(),
                source: Arc::new(e),
            }),
        }
    }
}
