//! The L2 responder: answers ARP requests (IPv4) and neighbour solicitations
//! (IPv6) for addresses the node does not own (LoadBalancer Service addresses)
//! on chosen interfaces, with the interface's MAC, and announces each address
//! it takes over (gratuitous ARP, unsolicited neighbour advertisement) so
//! routers and clients move to this node at once. As MetalLB's speaker does,
//! it answers from userspace over AF_PACKET sockets, so the node stops
//! answering when the agent dies (a kernel proxy-ARP entry would outlive it).
//!
//! * [`Responder`] — the answered set, one [`worker::Worker`] (thread and
//!   sockets) per interface; [`Responder::set`] makes it exactly what is asked.
//! * `arp`, `ndp`, `frame` — the frames, parsed and built (pure code).
//! * `raw` — the AF_PACKET socket.
//!
//! Needs CAP_NET_RAW. Serves the interfaces of the netns of the thread that
//! calls [`Responder::set`].

mod arp;
mod error;
mod frame;
mod ndp;
mod raw;
mod worker;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

pub use error::ResponderError;

use worker::{Counters, Worker};

use super::NetlinkSocket;

/// The addresses to answer for, by interface name.
pub type Wanted = BTreeMap<String, BTreeSet<IpAddr>>;

/// Answers ARP and NDP for the addresses it is given; one per agent. Dropping
/// it stops its threads and closes its sockets.
#[derive(Default)]
pub struct Responder {
    interfaces: Mutex<BTreeMap<String, Served>>,
}

/// One interface asked for.
#[derive(Default)]
struct Served {
    /// Kept across restarts of its worker (counters only grow).
    counters: Arc<Counters>,
    worker: Option<Worker>,
    /// Why the last [`Responder::set`] could not serve it.
    failure: Option<ResponderError>,
}

/// What the responder answers now, by interface (every interface asked for).
#[derive(Debug, Clone, Default)]
pub struct ResponderReport {
    pub interfaces: BTreeMap<String, InterfaceReport>,
}

#[derive(Debug, Clone, Default)]
pub struct InterfaceReport {
    /// Answered now (none while the interface has an error).
    pub addresses: BTreeSet<IpAddr>,
    pub arp_replies: u64,
    pub neighbour_advertisements: u64,
    /// Gratuitous ARPs and unsolicited neighbour advertisements.
    pub gratuitous: u64,
    /// Why it is not served: set could not start it, or its socket failed since
    /// (the link was deleted, ...). The next [`Responder::set`] tries again.
    pub error: Option<ResponderError>,
}

impl Responder {
    pub fn new() -> Responder {
        Responder::default()
    }

    /// Makes the answered set exactly `wanted` (addresses dropped stop being
    /// answered when it returns). Each newly answered address is announced at
    /// once and twice more 0.5 s apart. An interface whose link changed (new
    /// ifindex or MAC) or whose worker failed is started anew. Returns one
    /// error per interface that cannot be served; the others keep working.
    /// Blocks briefly (netlink requests, joining the threads it stops): call it
    /// from a std thread or `spawn_blocking`, in the netns of the interfaces.
    pub fn set(&self, wanted: &Wanted) -> Vec<ResponderError> {
        let mut interfaces = self.interfaces.lock().unwrap_or_else(|e| e.into_inner());
        interfaces.retain(|name, _| wanted.get(name).is_some_and(|a| !a.is_empty()));
        let mut errors = Vec::new();
        for (name, addresses) in wanted.iter().filter(|(_, a)| !a.is_empty()) {
            let served = interfaces.entry(name.clone()).or_default();
            served.failure = serve(name, addresses, served).err();
            if let Some(e) = &served.failure {
                served.worker = None;
                errors.push(e.clone());
            }
        }
        errors
    }

    /// What it answers now and its counters.
    pub fn report(&self) -> ResponderReport {
        let interfaces = self.interfaces.lock().unwrap_or_else(|e| e.into_inner());
        let interfaces = interfaces.iter().map(|(name, served)| {
            let running = served.worker.as_ref().filter(|w| w.is_running());
            let error = (served.failure.clone())
                .or_else(|| served.worker.as_ref().and_then(Worker::failure));
            let c = &served.counters;
            let report = InterfaceReport {
                addresses: running.map(Worker::addresses).unwrap_or_default(),
                arp_replies: c.arp_replies.load(Ordering::Relaxed),
                neighbour_advertisements: c.neighbour_advertisements.load(Ordering::Relaxed),
                gratuitous: c.gratuitous.load(Ordering::Relaxed),
                error,
            };
            (name.clone(), report)
        });
        ResponderReport {
            interfaces: interfaces.collect(),
        }
    }
}

/// Serves `addresses` on interface `name`: (re)starts its worker unless one is
/// running on the same link and MAC, then hands it the addresses.
fn serve(
    name: &str,
    addresses: &BTreeSet<IpAddr>,
    served: &mut Served,
) -> Result<(), ResponderError> {
    let netlink_error = |e| ResponderError::Netlink {
        interface: name.to_string(),
        source: Arc::new(e),
    };
    let netlink = NetlinkSocket::new().map_err(netlink_error)?;
    let link = netlink.link_by_name(name).map_err(netlink_error)?;
    let link = link.ok_or_else(|| ResponderError::NoSuchInterface {
        interface: name.to_string(),
    })?;
    let mac = link
        .mac
        .filter(|m| *m != [0; 6])
        .ok_or_else(|| ResponderError::NotEthernet {
            interface: name.to_string(),
        })?;
    let reusable = served
        .worker
        .as_ref()
        .is_some_and(|w| w.is_running() && w.ifindex() == link.index && w.mac() == mac);
    if !reusable {
        served.worker = None;
        let counters = served.counters.clone();
        served.worker = Some(Worker::start(name, link.index, mac, counters, netlink)?);
    }
    match &served.worker {
        Some(worker) => worker.set_addresses(addresses),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    /// One responder per agent, shared by its tasks.
    #[test]
    fn responder_is_send_and_sync() {
        fn shareable<T: Send + Sync>() {}
        shareable::<super::Responder>();
        shareable::<super::ResponderReport>();
    }
}
