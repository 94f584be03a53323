//! ADD: allocate from the daemon (the answer carries its configuration; the
//! daemon journals the endpoint, pending, in the same commit), create the veth
//! pair with the pod end created directly in the pod netns, set up the host side
//! (and, in ENI-class modes, the pod's ENI routing), address and route the pod
//! side, and mark the host link wired. One request the plugin waits for; the
//! timing report that follows is not waited for (docs/crash-safety.md). In
//! delegated-plugin mode, and with a daemon that journals no pending endpoint,
//! the endpoint is registered after the wiring, waiting for the commit.
//! With `runtimeConfig.bandwidth` (checked before the allocation) and a daemon
//! that enables the bandwidth manager, the host side is shaped right after the
//! pair is made (`super::shaping`).
//! Any failure after the allocation deletes the link pair (and the pod's IFB
//! device), removes the ENI rules the attempt added and releases the addresses.
//!
//! An interface named `CNI_IFNAME` that already exists in the pod is replaced when
//! it is podnet's own (its host-side twin `lxc…` for this attachment exists: a
//! retried ADD after a crash), and refused otherwise (code 104): podnet never
//! deletes an interface another plugin made. That check runs before the
//! allocation (one ioctl, no netlink round trip); a host-side twin whose pod end
//! is gone is found by the pair's creation failing with EEXIST, removed, and the
//! creation retried once.
//!
//! This file reads as the lifecycle (`add`, then `Attempt::configure`); each step
//! has a file: `sides` (the two netns and their sockets), `allocation` (the
//! request to the daemon, or the delegated IPAM plugin), `plan` (its answer per
//! family), `link_pair`, `host_side`, `eni_routing`, `pod_side` (the datapath,
//! `netlink_batch` their one-datagram requests), `endpoint` (how the daemon learns
//! the pod is wired), `result` (the CNI result) and `rollback`.

mod allocation;
mod attempt;
mod endpoint;
mod eni_routing;
mod host_side;
mod link_pair;
mod netlink_batch;
mod plan;
mod pod_side;
mod result;
mod rollback;
mod sides;

use crate::api::client::Client;
use crate::cni::{CniEnv, CniError, Command, NetConf, bandwidth};
use crate::datapath::{RuleSpec, ifb_ifname};

use super::add_turn::AddTurn;
use super::attachment;
use super::datapath_errors::dp;
use super::delegate;
use super::report::Timings;
use super::shaping;
use allocation::{allocate, daemon_config};
use attempt::Attempt;
use plan::plan_families;
use sides::Sides;

/// ADD: checks the attachment, allocates, configures the pod
/// (`Attempt::configure`) and answers the result; a failure after the allocation
/// is rolled back (`rollback::undo`). The daemon is asked once, for the
/// allocation (whose answer carries the daemon's configuration); in
/// delegated-plugin mode a second time, to register the endpoint.
pub fn add(
    env: &CniEnv,
    conf: &NetConf,
    client: &Client,
    t: &mut Timings,
) -> Result<String, CniError> {
    let (cid, ifname, netns_path) = attachment::ids(env)?;
    if conf.prev_result.is_some() {
        return Err(CniError::invalid_network_config(
            "podnet creates the pod's interface and must be the first plugin in the chain, but it was given a prevResult",
        ));
    }
    let limits = bandwidth::parse(&conf.raw)?;
    let sides = Sides::open(netns_path, cid, ifname)?;
    if sides.pod_has_ifname()? {
        link_pair::clear_previous_attempt(&sides)?;
    }
    t.mark("netlink-setup");

    let (mut alloc, delegated) = allocate(env, conf, client, cid, ifname)?;
    t.mark("ipam-round-trip");

    let mut added_rules = Vec::new();
    let outcome = daemon_config(client, alloc.podnet_config.take()).and_then(|daemon_cfg| {
        Attempt {
            env,
            conf,
            client,
            alloc: &alloc,
            daemon_cfg: &daemon_cfg,
            delegated,
            sides: &sides,
            container_id: cid,
            limits,
        }
        .configure(&mut added_rules, t)
    });
    match outcome {
        Ok(out) => Ok(out),
        Err(e) => {
            rollback::undo(client, &sides, &added_rules, cid);
            if delegated && let Err(d) = delegate::run_configured(Command::Del, env, conf) {
                tracing::warn!(error = %d, "rollback: the delegated IPAM plugin's DEL failed");
            }
            Err(e)
        }
    }
}

impl Attempt<'_> {
    /// Everything after the allocation, in the order of the pod's lifecycle. An
    /// error here is rolled back by the caller, which also removes the ENI rules
    /// listed in `added_rules` (the ones this attempt added).
    fn configure(
        &self,
        added_rules: &mut Vec<RuleSpec>,
        t: &mut Timings,
    ) -> Result<String, CniError> {
        let (sides, daemon_cfg) = (self.sides, self.daemon_cfg);
        let plans = plan_families(self.alloc)?;
        if daemon_cfg
            .addressing
            .ipv6
            .as_ref()
            .is_some_and(|a| a.enabled)
        {
            sides.set_pod_ipv6_defaults()?;
        }
        // IPv4 only: the netlink work, with the host side's disable_ipv6 write,
        // waits its turn (add_turn); the turn ends once the link is marked wired.
        let ipv4_only = !plans.iter().any(|p| p.ip.is_ipv6());
        let turn = ipv4_only.then(|| AddTurn::take(self.client.socket()));
        let pair = link_pair::create_pair(sides, &daemon_cfg.datapath_mode, daemon_cfg.device_mtu)?;
        self.shape(pair.host_index)?;
        let marker = self.link_marker(false).map(|m| m.encode());
        host_side::set_up(sides, pair.host_index, &plans, ipv4_only, marker)?;
        for p in &plans {
            eni_routing::install(&sides.host_sock, p, added_rules)?;
        }
        t.mark("netlink-host");
        pod_side::set_up(sides, pair.pod_index, &plans, self.route_mtu())?;
        t.mark("netlink-pod");
        match self
            .link_marker(true)
            .filter(|_| self.alloc.endpoint_pending)
        {
            Some(wired) => {
                sides
                    .host_sock
                    .set_link_alias(pair.host_index, &wired.encode())
                    .map_err(dp("marking the host side wired"))?;
                drop(turn);
                t.mark("link-wired");
                t.wired(self.expiration_uuids());
            }
            None => {
                drop(turn);
                self.register_endpoint(pair.host_index, t)?
            }
        }
        self.result(&pair, &plans)
    }

    /// The pod's bandwidth limit on its host link, when it asks for one and the
    /// daemon enables the bandwidth manager; asked for without it, the limit is
    /// not set and stderr says so (Cilium ignores the annotations then too).
    fn shape(&self, host_index: u32) -> Result<(), CniError> {
        let Some(limits) = &self.limits else {
            return Ok(());
        };
        if !self.daemon_cfg.bandwidth_manager.enabled {
            eprintln!(
                "podnet ADD: runtimeConfig.bandwidth is not applied: the daemon runs without --enable-bandwidth-manager"
            );
            return Ok(());
        }
        let sides = self.sides;
        let ifb = ifb_ifname(self.container_id, sides.ifname);
        shaping::apply(
            &sides.host_sock,
            host_index,
            &ifb,
            limits,
            self.daemon_cfg.device_mtu,
        )
    }
}
