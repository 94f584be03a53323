//! The agents' heartbeats over the underlay: every `beat.every` this agent sends
//! one small UDP datagram to every address of every other node, and hears theirs.
//! A beat counts only when it parses, names a known peer, and comes from one of
//! that peer's IPs (the source port is not checked); anything else is refused.
//! From the beats heard, `liveness` decides which nodes are live, and `run`
//! publishes that set each time it changes. A peer that cannot be reached is
//! counted and logged once per failure streak, never fatal.

mod datagram;
mod sockets;

use super::liveness::{Beat, LiveSet, Liveness};
use sockets::Sockets;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

/// Node name -> where its heartbeats go (its InternalIPs, with the heartbeat port).
pub type Peers = BTreeMap<String, Vec<SocketAddr>>;

/// How often a refused datagram may be logged (at debug): a flood logs one line
/// per this interval, with the count.
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum HeartbeatError {
    #[error(
        "binding the L2 announcement heartbeat port {port} (UDP) failed for both families: 0.0.0.0: {v4}; [::]: {v6}"
    )]
    Bind {
        port: u16,
        v4: io::Error,
        v6: io::Error,
    },
    #[error(
        "the node name {0:?} is longer than the 255 bytes an L2 announcement heartbeat carries"
    )]
    NodeNameTooLong(String),
    #[error("receiving L2 announcement heartbeats on {on}: {source}")]
    Receive { on: SocketAddr, source: io::Error },
}

/// What the heartbeat did, for metrics and `podnet status`.
#[derive(Debug, Default)]
pub struct HeartbeatCounters {
    /// Beats sent (one per peer address per beat).
    pub sent: AtomicU64,
    /// Beats received and counted.
    pub received: AtomicU64,
    /// Datagrams refused: not a beat, an unknown or own node name, or a source IP
    /// that is not the named node's.
    pub refused: AtomicU64,
    /// Sends that failed (unreachable peer, no socket of the address's family).
    pub send_errors: AtomicU64,
    /// When each peer was last heard, as of the last beat sent.
    last_heard: Mutex<BTreeMap<String, Instant>>,
}

impl HeartbeatCounters {
    /// How long ago each peer was last heard (peers never heard are absent), as
    /// of the last beat sent: up to one beat interval behind.
    pub fn last_heard_ago(&self, now: Instant) -> BTreeMap<String, Duration> {
        let heard = self
            .last_heard
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        heard
            .iter()
            .map(|(node, at)| (node.clone(), now.saturating_duration_since(*at)))
            .collect()
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Sends and hears heartbeats on `port` until `peers`' sender is dropped, and
/// publishes on `live` the live set each time it changes (first at start: this
/// node alone, not settled). Fails when neither family binds, or a receive fails.
pub async fn run(
    own: String,
    beat: Beat,
    port: u16,
    mut peers: watch::Receiver<Peers>,
    live: watch::Sender<LiveSet>,
    counters: Arc<HeartbeatCounters>,
) -> Result<(), HeartbeatError> {
    let datagram =
        datagram::encode(&own).ok_or_else(|| HeartbeatError::NodeNameTooLong(own.clone()))?;
    let sockets = Sockets::bind(port).await?;
    let initial = peers.borrow_and_update().clone();
    let mut heartbeat = Heartbeat::new(own, beat, initial, datagram, counters);
    let mut published = heartbeat.liveness.live(Instant::now());
    live.send_replace(published.clone());
    let mut beats = tokio::time::interval(beat.every);
    beats.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut buf_v4 = [0u8; datagram::MAX_LEN + 1];
    let mut buf_v6 = [0u8; datagram::MAX_LEN + 1];
    loop {
        let wake = heartbeat.liveness.next_change(Instant::now());
        let may_change = tokio::select! {
            _ = beats.tick() => {
                heartbeat.send_beats(&sockets).await;
                false
            }
            got = sockets::recv_from(sockets.v4.as_ref(), &mut buf_v4) => {
                let (len, from) = got.map_err(|source| HeartbeatError::Receive { on: (Ipv4Addr::UNSPECIFIED, port).into(), source })?;
                heartbeat.received(from, &buf_v4[..len])
            }
            got = sockets::recv_from(sockets.v6.as_ref(), &mut buf_v6) => {
                let (len, from) = got.map_err(|source| HeartbeatError::Receive { on: (Ipv6Addr::UNSPECIFIED, port).into(), source })?;
                heartbeat.received(from, &buf_v6[..len])
            }
            changed = peers.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                heartbeat.set_peers(peers.borrow_and_update().clone());
                true
            }
            _ = sleep_until(wake) => false,
        };
        // Whichever branch ran, the instant `wake` may have passed meanwhile (a
        // send took long, or another branch was ready at the same time): then
        // next_change no longer returns it, so this is its only chance.
        let due = wake.is_some_and(|at| Instant::now() >= at);
        if may_change || due {
            let now_live = heartbeat.liveness.live(Instant::now());
            if now_live != published {
                live.send_replace(now_live.clone());
                published = now_live;
            }
        }
    }
}

/// Sleeps until `wake`; forever when None.
async fn sleep_until(wake: Option<Instant>) {
    match wake {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The running heartbeat's state: the peers, who was heard when, and which peers
/// are failing to be sent to.
struct Heartbeat {
    own: String,
    peers: Peers,
    liveness: Liveness,
    datagram: Vec<u8>,
    counters: Arc<HeartbeatCounters>,
    failing: BTreeSet<String>,
    refused_log: RefusedLog,
}

impl Heartbeat {
    fn new(
        own: String,
        beat: Beat,
        peers: Peers,
        datagram: Vec<u8>,
        counters: Arc<HeartbeatCounters>,
    ) -> Self {
        let liveness = Liveness::new(&own, beat, Instant::now());
        Heartbeat {
            own,
            peers,
            liveness,
            datagram,
            counters,
            failing: BTreeSet::new(),
            refused_log: RefusedLog::default(),
        }
    }

    /// One beat to every address of every peer but this node.
    async fn send_beats(&mut self, sockets: &Sockets) {
        for (node, addrs) in self.peers.iter().filter(|(node, _)| **node != self.own) {
            let mut failure = None;
            for addr in addrs {
                let sent = match sockets.towards(addr) {
                    Some(socket) => socket.send_to(&self.datagram, addr).await.map(drop),
                    None => Err(io::Error::other("this address family is not bound")),
                };
                match sent {
                    Ok(()) => HeartbeatCounters::count(&self.counters.sent),
                    Err(e) => {
                        HeartbeatCounters::count(&self.counters.send_errors);
                        failure = Some((*addr, e));
                    }
                }
            }
            match failure {
                Some((addr, e)) if self.failing.insert(node.clone()) => {
                    tracing::warn!(node = %node, %addr, error = %e, "cannot send L2 announcement heartbeats to this node; it may take this node for dead (logged once until sending works again)");
                }
                None if self.failing.remove(node) => {
                    tracing::info!(node = %node, "sending L2 announcement heartbeats to this node again");
                }
                _ => {}
            }
        }
        let mut heard = self
            .counters
            .last_heard
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        heard.clone_from(self.liveness.last_heard());
    }

    /// Counts or refuses one datagram; returns whether it revived a node.
    fn received(&mut self, from: SocketAddr, datagram: &[u8]) -> bool {
        let now = Instant::now();
        match datagram::parse(datagram).filter(|node| self.is_peer_at(node, from.ip())) {
            Some(node) => {
                HeartbeatCounters::count(&self.counters.received);
                self.liveness.heard(node, now)
            }
            None => {
                HeartbeatCounters::count(&self.counters.refused);
                self.refused_log.note(from, now);
                false
            }
        }
    }

    fn is_peer_at(&self, node: &str, ip: IpAddr) -> bool {
        node != self.own
            && self
                .peers
                .get(node)
                .is_some_and(|addrs| addrs.iter().any(|addr| addr.ip() == ip))
    }

    fn set_peers(&mut self, peers: Peers) {
        let names: BTreeSet<String> = peers.keys().cloned().collect();
        self.liveness.forget_except(&names);
        self.failing.retain(|node| names.contains(node));
        self.peers = peers;
    }
}

/// Logs refused datagrams at debug, at most once per `REFUSED_LOG_EVERY`.
#[derive(Default)]
struct RefusedLog {
    last: Option<Instant>,
    unlogged: u64,
}

impl RefusedLog {
    fn note(&mut self, from: SocketAddr, now: Instant) {
        self.unlogged += 1;
        if self.last.is_some_and(|last| now < last + REFUSED_LOG_EVERY) {
            return;
        }
        tracing::debug!(%from, refused = self.unlogged, "refused L2 announcement heartbeat datagrams: not a beat, or not from the node it names (this one's source shown; logged at most every 10 s)");
        self.last = Some(now);
        self.unlogged = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sockets::tests::free_ports;
    use tokio::task::JoinHandle;

    /// Generous: these machines are busy. Nothing here asserts a tight timing.
    const PATIENCE: Duration = Duration::from_secs(30);

    const FAST: Beat = Beat {
        every: Duration::from_millis(50),
        missed: 3,
    };

    fn loopback(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn nodes(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    struct Agent {
        task: JoinHandle<Result<(), HeartbeatError>>,
        live: watch::Receiver<LiveSet>,
        counters: Arc<HeartbeatCounters>,
    }

    /// Starts `run` for `own` on `port`, and waits until it has bound and published.
    async fn start(own: &str, port: u16, peers: &watch::Receiver<Peers>) -> Agent {
        let unpublished = LiveSet {
            live: BTreeSet::new(),
            settled: false,
        };
        let (live_tx, mut live) = watch::channel(unpublished);
        let counters = Arc::new(HeartbeatCounters::default());
        let task = tokio::spawn(run(
            own.to_string(),
            FAST,
            port,
            peers.clone(),
            live_tx,
            counters.clone(),
        ));
        live_until(&mut live, "published", |set| set.live.contains(own)).await;
        Agent {
            task,
            live,
            counters,
        }
    }

    async fn live_until(
        live: &mut watch::Receiver<LiveSet>,
        what: &str,
        done: impl FnMut(&LiveSet) -> bool,
    ) -> LiveSet {
        let waited = tokio::time::timeout(PATIENCE, live.wait_for(done)).await;
        let set = waited.unwrap_or_else(|_| panic!("{what}: not within {PATIENCE:?}"));
        set.expect("the heartbeat task is running").clone()
    }

    async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
        let waited = tokio::time::timeout(PATIENCE, async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        waited
            .await
            .unwrap_or_else(|_| panic!("{what}: not within {PATIENCE:?}"));
    }

    fn read(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Aborts `task` and waits until it is gone (its sockets closed).
    async fn stop(task: JoinHandle<Result<(), HeartbeatError>>) {
        task.abort();
        let _ = task.await;
    }

    #[tokio::test]
    async fn two_agents_see_each_other_and_a_stopped_one_is_dead_within_bounds() {
        let [port_a, port_b] = free_ports();
        let peers = Peers::from([
            ("a".to_string(), vec![loopback(port_a)]),
            ("b".to_string(), vec![loopback(port_b)]),
        ]);
        let (_peers_tx, peers_rx) = watch::channel(peers);
        let mut a = start("a", port_a, &peers_rx).await;
        let mut b = start("b", port_b, &peers_rx).await;
        let both = nodes(&["a", "b"]);
        let set = live_until(&mut a.live, "a hears b", |s| s.settled && s.live == both).await;
        assert_eq!(set.live, both);
        live_until(&mut b.live, "b hears a", |s| s.settled && s.live == both).await;
        assert!(read(&a.counters.sent) > 0 && read(&a.counters.received) > 0);
        assert_eq!(read(&a.counters.refused), 0);
        assert_eq!(read(&a.counters.send_errors), 0);
        let ago = a.counters.last_heard_ago(Instant::now());
        assert_eq!(ago.keys().cloned().collect::<BTreeSet<_>>(), nodes(&["b"]));

        stop(b.task).await;
        let since = Instant::now();
        live_until(&mut a.live, "a takes b for dead", |s| {
            s.live == nodes(&["a"])
        })
        .await;
        // 3 missed beats of 50 ms: 150 ms after b's last beat, whatever the load adds.
        eprintln!("b dead for a after {:?}", since.elapsed());
        assert!(a.live.borrow().settled);
        stop(a.task).await;
    }

    #[tokio::test]
    async fn a_beat_counts_only_from_the_named_peers_ip() {
        let [port_a, port_b] = free_ports();
        let peers = Peers::from([("b".to_string(), vec![loopback(port_b)])]);
        let (_peers_tx, peers_rx) = watch::channel(peers);
        let mut a = start("a", port_a, &peers_rx).await;
        let to_a = loopback(port_a);
        let from_b_ip = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let from_elsewhere = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
        let beat = |node: &str| datagram::encode(node).unwrap();
        let refused = |n: u64| {
            let counters = a.counters.clone();
            move || read(&counters.refused) == n
        };

        from_b_ip.send_to(b"garbage", to_a).unwrap();
        eventually("garbage refused", refused(1)).await;
        from_elsewhere.send_to(&beat("b"), to_a).unwrap();
        eventually("b's name from another IP refused", refused(2)).await;
        from_b_ip.send_to(&beat("c"), to_a).unwrap();
        eventually("an unknown node refused", refused(3)).await;
        from_b_ip.send_to(&beat("a"), to_a).unwrap();
        eventually("a's own name refused", refused(4)).await;
        assert_eq!(read(&a.counters.received), 0);
        assert_eq!(a.live.borrow().live, nodes(&["a"]));

        // From b's IP, any source port: counted, and b is live.
        from_b_ip.send_to(&beat("b"), to_a).unwrap();
        live_until(&mut a.live, "b live", |s| s.live.contains("b")).await;
        assert_eq!(read(&a.counters.received), 1);
        assert_eq!(read(&a.counters.refused), 4);
        stop(a.task).await;
    }

    #[tokio::test]
    async fn a_peer_removed_from_the_cluster_leaves_the_live_set_and_a_dropped_watch_ends_the_task()
    {
        let [port_a, port_b] = free_ports();
        let peers = Peers::from([
            ("a".to_string(), vec![loopback(port_a)]),
            ("b".to_string(), vec![loopback(port_b)]),
        ]);
        let (peers_tx, peers_rx) = watch::channel(peers.clone());
        let mut a = start("a", port_a, &peers_rx).await;
        let b = start("b", port_b, &peers_rx).await;
        live_until(&mut a.live, "a hears b", |s| s.live.contains("b")).await;

        // b is still beating, but deleted from a's view of the cluster.
        let mut without_b = peers;
        without_b.remove("b");
        peers_tx.send_replace(without_b);
        live_until(&mut a.live, "b gone", |s| !s.live.contains("b")).await;
        eventually("b refused now", || read(&a.counters.refused) > 0).await;
        assert!(!a.live.borrow().live.contains("b"));

        drop(peers_tx);
        let ended = tokio::time::timeout(PATIENCE, a.task).await;
        assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
        let ended = tokio::time::timeout(PATIENCE, b.task).await;
        assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn in_paused_time_a_silent_peer_dies_exactly_three_beats_after_its_last() {
        // Heard at start, b's expiry falls on a beat of a's own: the two are
        // ready at once, and the expiry must be published whichever runs first.
        let [port_a, port_b] = free_ports();
        let peers = Peers::from([("b".to_string(), vec![loopback(port_b)])]);
        let (_peers_tx, peers_rx) = watch::channel(peers);
        let started = Instant::now();
        let mut a = start("a", port_a, &peers_rx).await;
        let from_b_ip = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let beat = datagram::encode("b").unwrap();
        from_b_ip.send_to(&beat, loopback(port_a)).unwrap();
        live_until(&mut a.live, "b live", |s| s.live.contains("b")).await;
        let heard = Instant::now();
        let set = live_until(&mut a.live, "b dead", |s| !s.live.contains("b")).await;
        let silent = Instant::now() - heard;
        // Timers round up to the millisecond.
        assert!(silent >= FAST.dead_after(), "{silent:?}");
        assert!(
            silent <= FAST.dead_after() + Duration::from_millis(1),
            "{silent:?}"
        );
        assert!(!set.settled, "the start grace is one beat longer");
        live_until(&mut a.live, "settled", |s| s.settled).await;
        let grace = Instant::now() - started;
        assert!(grace >= FAST.start_grace(), "{grace:?}");
        assert!(
            grace <= FAST.start_grace() + Duration::from_millis(1),
            "{grace:?}"
        );
        stop(a.task).await;
    }

    #[tokio::test]
    async fn a_peer_that_cannot_be_sent_to_is_counted_not_fatal() {
        // The limited broadcast without SO_BROADCAST: every send fails (EACCES).
        let [port_a, port_b] = free_ports();
        let peers = Peers::from([(
            "b".to_string(),
            vec![loopback(port_b), "255.255.255.255:9".parse().unwrap()],
        )]);
        let (_peers_tx, peers_rx) = watch::channel(peers);
        let a = start("a", port_a, &peers_rx).await;
        eventually("send errors counted", || read(&a.counters.send_errors) >= 3).await;
        assert!(
            read(&a.counters.sent) >= 3,
            "the IPv4 address still gets its beats"
        );
        assert!(!a.task.is_finished());
        stop(a.task).await;
    }
}
