//! DEL: idempotent teardown. The plugin finds the attachment's host link (and the
//! IFB device of its bandwidth limit, which outlives the pod's netns) and hands
//! them to the daemon with the release: the daemon journals both, answers at once,
//! deletes the pair in the background and releases the addresses only after the
//! link is gone (a restart finishes what a crash interrupted). Missing netns, link,
//! allocation or endpoint all count as already done. DEL never deletes anything
//! inside the pod's netns: only the host twin proves an interface is podnet's. If the daemon cannot be
//! reached, the release goes to the on-disk DEL queue the daemon replays at start,
//! and DEL succeeds; only a full or unwritable queue fails (11, try again later).

use crate::api::client::Client;
use crate::api::delete_queue::DeleteQueue;
use crate::api::models::{EndpointBatchDeleteRequest, LinkRef};
use crate::cni::{CniEnv, CniError, Command, NetConf};
use crate::datapath::{DatapathError, NetlinkSocket, host_ifname, ifb_ifname};

use super::daemon_errors::to_cni;
use super::datapath_errors::dp;
use super::delegate;
use super::report::Timings;
use super::shaping;

pub fn del(env: &CniEnv, conf: &NetConf, client: &Client, t: &mut Timings) -> Result<(), CniError> {
    let (Some(cid), Some(ifname)) = (&env.container_id, &env.ifname) else {
        return Err(CniError::invalid_env(
            "CNI_CONTAINERID and CNI_IFNAME are required",
        ));
    };
    // A delegated IPAM plugin releases its addresses first, before the netns (which
    // may be gone) is touched; its error is returned so the runtime retries.
    delegate::run_configured(Command::Del, env, conf)?;
    let host_sock =
        NetlinkSocket::new().map_err(dp("opening netlink in the runtime's namespace"))?;
    let host_name = host_ifname(cid, ifname);
    // The pair goes with its host side; the pod's netns is never touched: without
    // the host twin named for this (container ID, ifname), an interface in the netns
    // is not one podnet made for this attachment (a veth pair dies as a whole).
    // Its index by ioctl: nothing else of the link is needed.
    let host_index = host_sock
        .link_index(&host_name)
        .map_err(dp("looking up the host side"))?;
    let ifb_name = ifb_ifname(cid, ifname);
    let ifb_index = host_sock
        .link_index(&ifb_name)
        .map_err(dp("looking up the pod's IFB device"))?;
    t.mark("netlink-lookup");
    // The daemon deletes the pair (the kernel's teardown takes tens of ms) and only
    // then releases the addresses, so DEL does not wait for it. The timings so far
    // travel with the release: no report request after it.
    let req = EndpointBatchDeleteRequest {
        container_id: cid.clone(),
        container_interface_name: ifname.clone(),
        teardown_links: [(&host_name, host_index), (&ifb_name, ifb_index)]
            .into_iter()
            .filter_map(|(name, index)| {
                index.map(|index| LinkRef {
                    name: name.clone(),
                    index,
                })
            })
            .collect(),
        podnet_phases: t.so_far(),
    };
    let what = format!("releasing the addresses of {cid}/{ifname}");
    let released = client.delete_endpoints(&req);
    t.mark("daemon-release");
    match released {
        Ok(()) => {
            t.delivered();
            Ok(())
        }
        Err(e) if e.is_unavailable() => {
            // No daemon to hand the teardown to: delete the pair here, then queue
            // the release.
            if let Some(index) = host_index {
                host_sock
                    .delete_link(index)
                    .or_else(ignore_missing)
                    .map_err(dp("deleting the host side"))?;
            }
            if ifb_index.is_some() {
                shaping::remove_ifb(&host_sock, &ifb_name)?;
            }
            t.mark("netlink-host");
            let queued = EndpointBatchDeleteRequest {
                teardown_links: Vec::new(),
                podnet_phases: Default::default(),
                ..req
            };
            queue_release(client, &queued, &e.to_string()).map_err(|q| {
                CniError::try_again_later(format!(
                    "{what}: {e}; and the release could not be queued: {q}"
                ))
            })
        }
        Err(e) => Err(to_cni(e, &what)),
    }
}

fn ignore_missing(e: DatapathError) -> Result<(), DatapathError> {
    if e.is_not_found() { Ok(()) } else { Err(e) }
}

/// Queues the release for the daemon, under the queue's shared lock, after one
/// more try of the API (the daemon may have just finished starting).
fn queue_release(
    client: &Client,
    req: &EndpointBatchDeleteRequest,
    why: &str,
) -> Result<(), String> {
    let queue = DeleteQueue::open(client.socket()).map_err(|e| e.to_string())?;
    let _lock = queue.lock_shared().map_err(|e| e.to_string())?;
    match client.delete_endpoints(req) {
        Ok(()) => Ok(()),
        Err(e) if !e.is_unavailable() => Err(e.to_string()),
        Err(_) => {
            let path = queue.enqueue(req).map_err(|e| e.to_string())?;
            eprintln!(
                "podnet DEL: {why}; the release is queued in {} for the daemon",
                path.display()
            );
            Ok(())
        }
    }
}
