//! ADD: allocate from the daemon (the answer carries its configuration; the
//! daemon journals the endpoint, pending, in the same commit), create the veth
//! pair with the pod end created directly in the pod netns, set up the host side
//! (and, in ENI-class modes, the pod's ENI routing), address and route the pod
//! side, and mark the host link wired. One request the plugin waits for; the
//! timing report that follows is not waited for (docs/crash-safety.md). In
//! delegated-plugin mode, and with a daemon that journals no pending endpoint,
//! the endpoint is registered after the wiring, waiting for the commit.
//! Any failure after the allocation deletes the link pair, removes the ENI rules
//! the attempt added and releases the addresses.
//!
//! An interface named `CNI_IFNAME` that already exists in the pod is replaced when
//! it is podnet's own (its host-side twin `lxc…` for this attachment exists: a
//! retried ADD after a crash), and refused otherwise (code 104): podnet never
//! deletes an interface another plugin made. That check runs before the
//! allocation (one ioctl, no netlink round trip); a host-side twin whose pod end
//! is gone is found by the pair's creation failing with EEXIST, removed, and the
//! creation retried once.

use std::net::IpAddr;
use std::path::Path;

use ipnet::IpNet;

use crate::api::client::{AllocateParams, Client, ClientError};
use crate::api::link_marker::{JournalMark, LinkMarker};
use crate::api::models::{
    AddressPair, DaemonConfigurationStatus, DatapathConfiguration, EndpointBatchDeleteRequest,
    EndpointChangeRequest, FailureReason, IpamAddressResponse, IpamResponse,
};
use crate::cni::{CniEnv, CniError, CniResult, Command, Interface, IpConfig, NetConf, Route};
use crate::datapath::{
    DatapathError, LOOPBACK_INDEX, NetNs, NetkitMode, NetkitSpec, NetlinkSocket, Request,
    RouteSpec, RuleSpec, VethSpec, eni_rules, eni_table, enter_netns, format_mac, host_ifname,
    random_mac, set_sysctl, write_sysctl,
};

use super::add_turn::AddTurn;
use super::daemon_errors::to_cni;
use super::delegate;
use super::report::Timings;

/// What an allocation failure says first (Cilium's wording); the daemon has
/// already recorded such failures itself.
pub const ALLOCATE_CONTEXT: &str = "unable to allocate IP via local podnet daemon";

/// One family's address and router, as the daemon handed them out.
struct FamilyPlan {
    ip: IpAddr,
    router: IpAddr,
    /// ENI-class modes: the ENI the address belongs to.
    eni: Option<EniPlan>,
}

/// The ENI routing of one address (from the IPAM response).
struct EniPlan {
    mac: [u8; 6],
    number: u32,
    gateway: IpAddr,
}

impl FamilyPlan {
    fn host_net(&self) -> IpNet {
        IpNet::from(self.ip)
    }
    fn router_net(&self) -> IpNet {
        IpNet::from(self.router)
    }
    fn default_net(&self) -> IpNet {
        match self.ip {
            IpAddr::V4(_) => "0.0.0.0/0".parse().unwrap_or(IpNet::from(self.ip)),
            IpAddr::V6(_) => "::/0".parse().unwrap_or(IpNet::from(self.ip)),
        }
    }
}

/// ADD: checks the attachment, allocates, configures the pod
/// (`Attempt::configure`) and answers the result; a failure after the allocation
/// is rolled back (`undo`). The daemon is asked once, for the allocation (whose
/// answer carries the daemon's configuration); in delegated-plugin mode a second
/// time, to register the endpoint.
pub fn add(
    env: &CniEnv,
    conf: &NetConf,
    client: &Client,
    t: &mut Timings,
) -> Result<String, CniError> {
    let (cid, ifname, netns_path) = attachment(env)?;
    if conf.prev_result.is_some() {
        return Err(CniError::invalid_network_config(
            "podnet creates the pod's interface and must be the first plugin in the chain, but it was given a prevResult",
        ));
    }
    let netns = open_netns(netns_path)?;
    let host_sock =
        NetlinkSocket::new().map_err(dp("opening netlink in the runtime's namespace"))?;
    let pod_sock = open_pod_socket(&netns, &host_sock)?;
    let host_name = host_ifname(cid, ifname);
    if pod_sock
        .link_index(ifname)
        .map_err(dp("looking up the pod interface"))?
        .is_some()
    {
        clear_previous_attempt(&host_sock, &pod_sock, &host_name, ifname, netns_path)?;
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
            netns: &netns,
            host_sock: &host_sock,
            pod_sock: &pod_sock,
            container_id: cid,
            ifname,
            netns_path,
            host_name: &host_name,
        }
        .configure(&mut added_rules, t)
    });
    match outcome {
        Ok(out) => Ok(out),
        Err(e) => {
            undo(client, &host_sock, &host_name, &added_rules, cid, ifname);
            if delegated && let Err(d) = delegate::run_configured(Command::Del, env, conf) {
                tracing::warn!(error = %d, "rollback: the delegated IPAM plugin's DEL failed");
            }
            Err(e)
        }
    }
}

/// The addresses, in one round trip: the daemon hands them out with
/// `expiration: true` (they go back by themselves unless the endpoint is
/// registered in time) and its configuration in `podnet-config`. In
/// delegated-plugin mode the daemon refuses (reason `delegated-plugin`) with its
/// configuration, and the config's IPAM plugin hands them out; true then.
fn allocate(
    env: &CniEnv,
    conf: &NetConf,
    client: &Client,
    cid: &str,
    ifname: &str,
) -> Result<(IpamResponse, bool), CniError> {
    let answer = client.allocate(&AllocateParams {
        owner: &env.args.owner(cid),
        expiration: true,
        container_id: cid,
        ifname,
        network: &conf.name,
        netns: &env
            .netns
            .as_ref()
            .map(|n| n.display().to_string())
            .unwrap_or_default(),
        pod_uid: env.args.pod_uid.as_deref().unwrap_or_default(),
        ..Default::default()
    });
    match answer {
        Ok(resp) => Ok((resp, false)),
        Err(ClientError::Status {
            reason: Some(FailureReason::DelegatedPlugin),
            config,
            ..
        }) => {
            let daemon_cfg = daemon_config(client, config.map(|c| *c))?;
            Ok((delegated_allocation(env, conf, daemon_cfg)?, true))
        }
        Err(e) => Err(to_cni(e, ALLOCATE_CONTEXT)),
    }
}

/// The configuration the daemon sent with its answer; a daemon that sends none
/// (a podnet older than `podnet-config`) is asked for it with `GET /v1/config`.
fn daemon_config(
    client: &Client,
    sent: Option<DaemonConfigurationStatus>,
) -> Result<DaemonConfigurationStatus, CniError> {
    match sent {
        Some(cfg) => Ok(cfg),
        None => client
            .config()
            .map(|c| c.status)
            .map_err(|e| to_cni(e, "reading the daemon's configuration")),
    }
}

/// delegated-plugin mode: the config's IPAM plugin hands out the addresses; the
/// answer is shaped like the daemon's (Cilium keeps the prefix in `address`), with
/// the daemon's router addresses and its configuration.
fn delegated_allocation(
    env: &CniEnv,
    conf: &NetConf,
    daemon_cfg: DaemonConfigurationStatus,
) -> Result<IpamResponse, CniError> {
    if delegate::ipam_type(conf).is_none() {
        return Err(CniError::invalid_network_config(
            "the daemon runs ipam=delegated-plugin: the network config needs ipam.type naming the IPAM plugin (e.g. host-local)",
        ));
    }
    let result = delegate::run_configured(Command::Add, env, conf)?.ok_or_else(|| {
        CniError::invalid_network_config("the delegated IPAM plugin returned no result")
    })?;
    let (v4, v6) = delegate::ipam_addresses(&result);
    let mut resp = IpamResponse {
        host_addressing: daemon_cfg.addressing.clone(),
        podnet_config: Some(daemon_cfg),
        ..Default::default()
    };
    let address = |net: &IpNet, gw: Option<IpAddr>| IpamAddressResponse {
        ip: net.addr().to_string(),
        gateway: gw.map(|g| g.to_string()).unwrap_or_default(),
        interface_number: "0".into(),
        ..Default::default()
    };
    if let Some((_, net, gw)) = v4 {
        resp.address.ipv4 = net.to_string();
        resp.ipv4 = Some(address(&net, gw));
    }
    if let Some((_, net, gw)) = v6 {
        resp.address.ipv6 = net.to_string();
        resp.ipv6 = Some(address(&net, gw));
    }
    Ok(resp)
}

/// What the steps after the allocation work with.
struct Attempt<'a> {
    env: &'a CniEnv,
    conf: &'a NetConf,
    client: &'a Client,
    alloc: &'a IpamResponse,
    daemon_cfg: &'a DaemonConfigurationStatus,
    /// delegated-plugin mode: the addresses are the delegated IPAM plugin's.
    delegated: bool,
    netns: &'a NetNs,
    host_sock: &'a NetlinkSocket,
    pod_sock: &'a NetlinkSocket,
    container_id: &'a str,
    ifname: &'a str,
    netns_path: &'a Path,
    host_name: &'a str,
}

/// The pair `create_pair` made: both ends' indexes (each in its netns) and
/// MACs (none for netkit in L3 mode).
struct LinkPair {
    host_index: u32,
    pod_index: u32,
    host_mac: Option<[u8; 6]>,
    pod_mac: Option<[u8; 6]>,
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
        let plans = plan_families(self.alloc)?;
        if self
            .daemon_cfg
            .addressing
            .ipv6
            .as_ref()
            .is_some_and(|a| a.enabled)
        {
            set_pod_ipv6_defaults(self.netns, self.host_sock)?;
        }
        // IPv4 only: the netlink work, with the host side's disable_ipv6 write,
        // waits its turn (add_turn); the turn ends once the link is marked wired.
        let ipv4_only = !plans.iter().any(|p| p.ip.is_ipv6());
        let turn = ipv4_only.then(|| AddTurn::take(self.client.socket()));
        let pair = self.create_pair()?;
        self.set_up_host_side(pair.host_index, &plans, ipv4_only)?;
        for p in &plans {
            install_eni_routing(self.host_sock, p, added_rules)?;
        }
        t.mark("netlink-host");
        self.set_up_pod_side(pair.pod_index, &plans)?;
        t.mark("netlink-pod");
        match self
            .link_marker(true)
            .filter(|_| self.alloc.endpoint_pending)
        {
            Some(wired) => {
                self.host_sock
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

    /// Creates the veth (or netkit) pair in one request, the pod end directly in
    /// the pod netns under its final name. veth and netkit-l2 carry Ethernet
    /// headers and get random MACs (set explicitly, so systemd's MACAddressPolicy
    /// leaves them alone); netkit in L3 mode has none. When a name is taken
    /// (EEXIST), a previous attempt's pair is removed (or another plugin's
    /// interface refused) and the creation retried once.
    fn create_pair(&self) -> Result<LinkPair, CniError> {
        let mode = self.daemon_cfg.datapath_mode.as_str();
        let (host_mac, pod_mac) = if mode == "netkit" {
            (None, None)
        } else {
            (
                Some(random_mac().map_err(dp("generating a MAC address"))?),
                Some(random_mac().map_err(dp("generating a MAC address"))?),
            )
        };
        let (host_index, pod_index) = match self.new_pair(mode, host_mac, pod_mac) {
            Err(e) if e.is_exists() => {
                clear_previous_attempt(
                    self.host_sock,
                    self.pod_sock,
                    self.host_name,
                    self.ifname,
                    self.netns_path,
                )?;
                self.new_pair(mode, host_mac, pod_mac)
            }
            created => created,
        }
        .map_err(dp("unable to set up link on host side"))?;
        let pod_index = match pod_index {
            Some(index) => index,
            None => self.pod_index_by_name()?,
        };
        Ok(LinkPair {
            host_index,
            pod_index,
            host_mac,
            pod_mac,
        })
    }

    /// One attempt at creating the pair (`create_pair`): the host end's index, and
    /// the pod end's when known. A veth's ends are looked up by ioctl; a netkit
    /// primary comes back from the kernel, whose IFLA_LINK is the pod end's index
    /// in the pod netns (0 when the peer is gone; older kernels leave it out when
    /// it equals the host end's own index, and then the pod end is looked up by
    /// name).
    fn new_pair(
        &self,
        mode: &str,
        host_mac: Option<[u8; 6]>,
        pod_mac: Option<[u8; 6]>,
    ) -> Result<(u32, Option<u32>), DatapathError> {
        let (host_name, peer_name, mtu) = (self.host_name, self.ifname, self.daemon_cfg.device_mtu);
        match mode {
            "netkit" | "netkit-l2" => self
                .host_sock
                .create_netkit_pair(&NetkitSpec {
                    mode: if mode == "netkit" {
                        NetkitMode::L3
                    } else {
                        NetkitMode::L2
                    },
                    host_name,
                    host_mac,
                    peer_name,
                    peer_mac: pod_mac,
                    mtu,
                    peer_netns: self.netns,
                    txqlen: Some(1000),
                    headroom: 0,
                    tailroom: 0,
                })
                .map(|host| (host.index, host.link.filter(|&i| i != 0))),
            _ => self
                .host_sock
                .create_veth_pair_indexes(
                    &VethSpec {
                        host_name,
                        host_mac,
                        peer_name,
                        peer_mac: pod_mac,
                        mtu,
                        peer_netns: self.netns,
                        txqlen: Some(1000),
                    },
                    self.pod_sock,
                )
                .map(|(host, pod)| (host, Some(pod))),
        }
    }

    /// The pod end's index found by its name, when the host end's IFLA_LINK did
    /// not say.
    fn pod_index_by_name(&self) -> Result<u32, CniError> {
        self.pod_sock
            .link_by_name(self.ifname)
            .map_err(dp("finding the pod interface"))?
            .ok_or_else(|| {
                CniError::datapath_failure(format!(
                    "{} did not appear in {}",
                    self.ifname,
                    self.netns_path.display()
                ))
            })
            .map(|pod| pod.index)
    }

    /// Host side: its IPv6 sysctls (or only `disable_ipv6` when `ipv4_only`), then
    /// in one datagram no `rp_filter` (the daemon's nftables source check verifies
    /// the pod's source addresses, both families; set by netlink, not through
    /// /proc), up (with podnet's marker in its alias, set in the same request), a
    /// /32 (/128) route to the pod, and an NDP proxy entry so the pod can resolve
    /// the IPv6 router address.
    fn set_up_host_side(
        &self,
        host_index: u32,
        plans: &[FamilyPlan],
        ipv4_only: bool,
    ) -> Result<(), CniError> {
        let (host_sock, host_name) = (self.host_sock, self.host_name);
        if !ipv4_only {
            // No DAD on the host side: while its link-local address is tentative the
            // kernel sends no neighbour solicitation to the pod at all.
            set_sysctl(&format!("net/ipv6/conf/{host_name}/accept_dad"), "0")
                .map_err(dp("host accept_dad"))?;
            // Answer the pod's router solicitations at once (the default proxy
            // delay is up to 0.8 s per resolution).
            set_sysctl(&format!("net/ipv6/neigh/{host_name}/proxy_delay"), "0")
                .map_err(dp("host proxy_delay"))?;
        } else {
            disable_host_ipv6(host_name)?;
        }
        let marker = self.link_marker(false).map(|m| m.encode());
        let routes: Vec<RouteSpec> = plans
            .iter()
            .map(|p| RouteSpec::link(p.host_net(), host_index))
            .collect();
        let up = match &marker {
            Some(alias) => host_sock.link_up_with_alias_request(host_index, alias),
            None => host_sock.link_up_request(host_index),
        };
        let mut steps = vec![
            Step::new(host_sock.rp_filter_request(host_index, 0), "host rp_filter"),
            Step::new(up, "bringing up the host side"),
        ];
        for (p, route) in plans.iter().zip(&routes) {
            let req = host_sock
                .replace_route_request(route)
                .map_err(dp("adding the host route to the pod"))?;
            steps.push(Step::new(req, "adding the host route to the pod"));
            if p.ip.is_ipv6() {
                steps.push(Step::new(
                    host_sock.add_proxy_neighbour_request(host_index, p.router),
                    "adding the IPv6 router proxy entry",
                ));
            }
        }
        in_order(host_sock, steps, "configuring the host side")
    }

    /// The marker that ties the host link to the journal commit that handed out
    /// its addresses, so a restart can tell a stale link from one the journal
    /// lost, and (`wired`) says the ADD finished wiring the pod; none when the
    /// daemon sent no journal mark.
    fn link_marker(&self, wired: bool) -> Option<LinkMarker> {
        let journal = JournalMark::parse(&self.alloc.journal_mark)?;
        Some(LinkMarker {
            journal,
            wired,
            container_id: Some(self.container_id.to_string()),
            ifname: Some(self.ifname.to_string()),
            owner: Some(self.env.args.owner(self.container_id)),
            pod_uid: self.env.args.pod_uid.clone(),
        })
    }

    /// Pod side: `lo` and the interface up (its IPv6 sysctls came from the
    /// namespace's defaults set before it was created), then per family the /32
    /// (/128), a link route to the router and a default route via it. All in one
    /// datagram, answered in order; the first failure is the error, with what it
    /// was doing.
    fn set_up_pod_side(&self, pod_index: u32, plans: &[FamilyPlan]) -> Result<(), CniError> {
        let sock = self.pod_sock;
        let routes: Vec<[RouteSpec; 2]> = plans
            .iter()
            .map(|p| pod_routes(p, pod_index, self.route_mtu()))
            .collect();
        let mut steps = vec![
            Step::new(
                sock.link_up_request(LOOPBACK_INDEX),
                "bringing up lo in the pod",
            ),
            Step::new(
                sock.link_up_request(pod_index),
                "bringing up the pod interface",
            ),
        ];
        for (p, routes) in plans.iter().zip(&routes) {
            steps.push(Step::new(
                sock.add_address_request(pod_index, p.host_net(), p.ip.is_ipv6()),
                "adding the pod address",
            ));
            for r in routes {
                let req = sock
                    .add_route_request(r)
                    .map_err(dp("adding a pod route"))?;
                steps.push(Step {
                    exists_ok: true,
                    ..Step::new(req, "adding a pod route")
                });
            }
        }
        in_order(sock, steps, "configuring the pod's interface")
    }

    /// The MTU of the pod's default route, when the daemon sets one.
    fn route_mtu(&self) -> Option<u32> {
        let mtu = self.daemon_cfg.route_mtu;
        (mtu > 0).then_some(mtu)
    }

    /// The expiration UUIDs of the addresses the daemon handed out (none in
    /// delegated-plugin mode).
    fn expiration_uuids(&self) -> Vec<String> {
        [&self.alloc.ipv4, &self.alloc.ipv6]
            .into_iter()
            .flatten()
            .map(|a| a.expiration_uuid.clone())
            .filter(|u| !u.is_empty())
            .collect()
    }

    /// Registers the endpoint with the daemon (delegated-plugin mode, or a daemon
    /// that journals no pending endpoint), which binds the addresses and stops
    /// their expiration timers, with the timings so far (the daemon records them
    /// once the endpoint is committed, so no report request follows). The plugin
    /// waits for the commit: only a journaled endpoint keeps the addresses past
    /// their expiration (docs/crash-safety.md).
    fn register_endpoint(&self, host_index: u32, t: &mut Timings) -> Result<(), CniError> {
        let (alloc, args) = (self.alloc, &self.env.args);
        let expiration_uuid = |detail: &Option<IpamAddressResponse>| {
            detail
                .as_ref()
                .map(|a| a.expiration_uuid.clone())
                .unwrap_or_default()
        };
        let addressing = AddressPair {
            ipv4: alloc.address.ipv4.clone(),
            ipv4_pool_name: alloc.address.ipv4_pool_name.clone(),
            ipv4_expiration_uuid: expiration_uuid(&alloc.ipv4),
            ipv6: alloc.address.ipv6.clone(),
            ipv6_pool_name: alloc.address.ipv6_pool_name.clone(),
            ipv6_expiration_uuid: expiration_uuid(&alloc.ipv6),
        };
        self.client
            .create_endpoint(&EndpointChangeRequest {
                container_id: self.container_id.to_string(),
                container_interface_name: self.ifname.to_string(),
                k8s_pod_name: args.pod_name.clone().unwrap_or_default(),
                k8s_namespace: args.pod_namespace.clone().unwrap_or_default(),
                k8s_uid: args.pod_uid.clone().unwrap_or_default(),
                state: "waiting-for-identity".into(),
                addressing,
                interface_name: self.host_name.to_string(),
                interface_index: host_index,
                container_netns_path: self.netns_path.display().to_string(),
                sync_build_endpoint: true,
                datapath_configuration: DatapathConfiguration {
                    external_ipam: self.delegated,
                },
                podnet_phases: t.so_far(),
            })
            .map(|_| t.delivered())
            .map_err(|e| to_cni(e, "unable to create endpoint"))
    }

    /// The CNI result: the host interface first, the pod interface second, the
    /// addresses on the pod interface with their routes, in the config's version.
    fn result(&self, pair: &LinkPair, plans: &[FamilyPlan]) -> Result<String, CniError> {
        let (conf, mtu) = (self.conf, self.daemon_cfg.device_mtu);
        let route_mtu = self.route_mtu();
        let ips = plans
            .iter()
            .map(|p| IpConfig {
                address: p.host_net(),
                gateway: Some(p.router),
                interface: Some(1),
            })
            .collect();
        let routes = plans
            .iter()
            .flat_map(|p| {
                [
                    result_route(p.router_net(), None, None),
                    result_route(p.default_net(), Some(p.router), route_mtu),
                ]
            })
            .collect();
        let result = CniResult {
            cni_version: conf.cni_version.clone(),
            interfaces: vec![
                Interface {
                    name: self.host_name.to_string(),
                    mac: pair.host_mac.as_ref().map(format_mac),
                    mtu: Some(mtu),
                    ..Default::default()
                },
                Interface {
                    name: self.ifname.to_string(),
                    mac: pair.pod_mac.as_ref().map(format_mac),
                    mtu: Some(mtu),
                    sandbox: Some(self.netns_path.display().to_string()),
                    ..Default::default()
                },
            ],
            ips,
            routes,
            dns: None,
        };
        serde_json::to_string(&result.to_json(&conf.cni_version))
            .map_err(|e| CniError::io_failure(format!("encoding the result: {e}")))
    }
}

/// One request of `in_order`: what its error says, and whether EEXIST is fine.
struct Step<'a> {
    req: Request<'a>,
    what: &'static str,
    exists_ok: bool,
}

impl<'a> Step<'a> {
    fn new(req: Request<'a>, what: &'static str) -> Self {
        Step {
            req,
            what,
            exists_ok: false,
        }
    }
}

/// Sends `steps` in one datagram (`NetlinkSocket::batch`); the first failure in
/// their order is the error, with its step's `what`, as if they had been sent one
/// by one. `all` names the datagram, for a send that fails.
fn in_order(sock: &NetlinkSocket, steps: Vec<Step<'_>>, all: &'static str) -> Result<(), CniError> {
    let (reqs, meanings): (Vec<_>, Vec<_>) = steps
        .into_iter()
        .map(|s| (s.req, (s.what, s.exists_ok)))
        .unzip();
    let outcomes = sock.batch(reqs).map_err(dp(all))?;
    for (outcome, (what, exists_ok)) in outcomes.into_iter().zip(meanings) {
        match outcome {
            Err(e) if !(exists_ok && e.is_exists()) => return Err(dp(what)(e)),
            _ => {}
        }
    }
    Ok(())
}

/// The pod's routes of one family: a link route to the router, and the default
/// route via it (with the daemon's route MTU).
fn pod_routes(p: &FamilyPlan, pod_index: u32, route_mtu: Option<u32>) -> [RouteSpec; 2] {
    [
        RouteSpec::link(p.router_net(), pod_index),
        RouteSpec {
            dst: p.default_net(),
            gateway: Some(p.router),
            oif: pod_index,
            scope_link: false,
            mtu: route_mtu,
            table: None,
            priority: None,
            onlink: false,
            prefsrc: None,
            protocol: None,
        },
    ]
}

fn result_route(dst: IpNet, gw: Option<IpAddr>, mtu: Option<u32>) -> Route {
    Route {
        dst,
        gw,
        mtu,
        advmss: None,
        priority: None,
        table: None,
        scope: None,
    }
}

/// The addresses the daemon gave, IPv6 first (Cilium's order). A family counts only
/// when it has an address and the daemon reports its router.
fn plan_families(alloc: &IpamResponse) -> Result<Vec<FamilyPlan>, CniError> {
    let mut plans = Vec::new();
    for (ip, node, detail) in [
        (
            &alloc.address.ipv6,
            &alloc.host_addressing.ipv6,
            &alloc.ipv6,
        ),
        (
            &alloc.address.ipv4,
            &alloc.host_addressing.ipv4,
            &alloc.ipv4,
        ),
    ] {
        let Some(node) = node.as_ref().filter(|n| n.enabled && !ip.is_empty()) else {
            continue;
        };
        let ip: IpAddr = ip.split('/').next().unwrap_or("").parse().map_err(|_| {
            CniError::daemon_rejected(format!("invalid IPAM response: address {ip:?}"))
        })?;
        let router: IpAddr = node.ip.parse().map_err(|_| {
            CniError::daemon_rejected(format!(
                "invalid IPAM response: router address {:?}",
                node.ip
            ))
        })?;
        let eni = detail
            .as_ref()
            .filter(|d| !d.master_mac.is_empty())
            .map(eni_plan)
            .transpose()?
            .flatten();
        plans.push(FamilyPlan { ip, router, eni });
    }
    if plans.is_empty() {
        return Err(CniError::daemon_rejected(
            "IPAM did provide neither IPv4 nor IPv6 address",
        ));
    }
    Ok(plans)
}

/// The ENI routing the daemon asks for: MAC, interface number and gateway (no
/// gateway, e.g. IPv6 without a subnet, means no ENI routing, as in Cilium).
fn eni_plan(d: &IpamAddressResponse) -> Result<Option<EniPlan>, CniError> {
    let bad = |what: &str| CniError::daemon_rejected(format!("invalid IPAM response: {what}"));
    let Ok(gateway) = d.gateway.parse::<IpAddr>() else {
        return Ok(None);
    };
    let mut mac = [0u8; 6];
    let parts: Vec<&str> = d.master_mac.split(':').collect();
    if parts.len() != 6 {
        return Err(bad(&format!("master-mac {:?}", d.master_mac)));
    }
    for (b, p) in mac.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16)
            .map_err(|_| bad(&format!("master-mac {:?}", d.master_mac)))?;
    }
    let number = d
        .interface_number
        .parse::<u32>()
        .map_err(|_| bad(&format!("interface-number {:?}", d.interface_number)))?;
    Ok(Some(EniPlan {
        mac,
        number,
        gateway,
    }))
}

/// ENI-class modes: the pod's rules and its ENI's table (Cilium §3.3): `to <pod>
/// lookup main` (priority 20), `from <pod> lookup 10+n` (111), and in table 10+n a
/// link route to the gateway and a default route via it, through the ENI device
/// found by its MAC; nothing for a family without ENI routing. Each rule it adds
/// goes into `added_rules` at once, so a rollback removes exactly those (a rule
/// that already existed is not this ADD's); the table's routes are shared by the
/// ENI's pods and stay, as on DEL.
fn install_eni_routing(
    host_sock: &NetlinkSocket,
    p: &FamilyPlan,
    added_rules: &mut Vec<RuleSpec>,
) -> Result<(), CniError> {
    let Some(eni) = &p.eni else {
        return Ok(());
    };
    let device = eni_device(host_sock, eni)?;
    let table = eni_table(eni.number);
    for r in [
        RouteSpec {
            dst: IpNet::from(eni.gateway),
            gateway: None,
            oif: device,
            scope_link: true,
            mtu: None,
            table: Some(table),
            priority: None,
            onlink: false,
            prefsrc: None,
            protocol: None,
        },
        RouteSpec {
            dst: p.default_net(),
            gateway: Some(eni.gateway),
            oif: device,
            scope_link: false,
            mtu: None,
            table: Some(table),
            priority: None,
            onlink: false,
            prefsrc: None,
            protocol: None,
        },
    ] {
        host_sock
            .replace_route(&r)
            .map_err(dp("adding the ENI table route"))?;
    }
    for rule in eni_rules(p.ip, eni.number) {
        match host_sock.add_rule(&rule) {
            Ok(()) => added_rules.push(rule),
            Err(e) if e.is_exists() => {}
            Err(e) => return Err(dp("adding the ENI rule")(e)),
        }
    }
    Ok(())
}

/// The index of the host link that is the ENI (found by its MAC; podnet's own
/// links are never it).
fn eni_device(host_sock: &NetlinkSocket, eni: &EniPlan) -> Result<u32, CniError> {
    let links = host_sock.list_links().map_err(dp("listing host links"))?;
    links
        .iter()
        .find(|l| {
            l.mac == Some(eni.mac) && !l.name.starts_with("lxc") && !l.name.starts_with("podnet_")
        })
        .map(|l| l.index)
        .ok_or_else(|| {
            CniError::datapath_failure(format!(
                "the ENI with MAC {} (interface number {}) is on no host link: the ENI inventory and the node disagree",
                format_mac(&eni.mac),
                eni.number
            ))
        })
}

/// An IPv4-only pod gets no IPv6 on its host link either, set before the link
/// goes up (within the plugin's turn, `add_turn`). Otherwise every host link gets
/// a link-local address, an fe80::/64 and an ff00::/8 route and MLD traffic, and
/// that kernel work grows with the pods on the node: IPv6 route lookups walk the
/// fe80::/64 routes of every link and each link deletion walks the whole IPv6
/// table (BENCHMARKS.md "Flat cost"). A kernel without IPv6 has no such sysctl:
/// nothing to disable.
fn disable_host_ipv6(host_name: &str) -> Result<(), CniError> {
    match set_sysctl(&format!("net/ipv6/conf/{host_name}/disable_ipv6"), "1") {
        Err(e) if !e.is_not_found() => Err(dp("disabling IPv6 on the host side")(e)),
        _ => Ok(()),
    }
}

/// A netlink socket inside the pod's netns. It is opened before the allocation,
/// so an interface of another plugin is refused (104) before any address is taken.
fn open_pod_socket(netns: &NetNs, host_sock: &NetlinkSocket) -> Result<NetlinkSocket, CniError> {
    in_pod(
        netns,
        host_sock,
        "opening netlink in the pod's namespace",
        NetlinkSocket::new,
    )
}

/// The pod's IPv6 defaults, once the daemon's answer says IPv6 is on: IPv6 on,
/// and no DAD for interfaces created from now on (so `eth0`, created next,
/// answers at once).
fn set_pod_ipv6_defaults(netns: &NetNs, host_sock: &NetlinkSocket) -> Result<(), CniError> {
    in_pod(netns, host_sock, "setting the pod's IPv6 defaults", || {
        write_sysctl("net/ipv6/conf/all/disable_ipv6", "0")?;
        write_sysctl("net/ipv6/conf/default/accept_dad", "0").map(|_| ())
    })
}

/// Runs `f` with this (the plugin's only) thread in the pod's netns, and comes
/// back to the netns of `host_sock` (the runtime's, where the thread is); `what`
/// names `f`'s work in its error.
fn in_pod<T>(
    netns: &NetNs,
    host_sock: &NetlinkSocket,
    what: &'static str,
    f: impl FnOnce() -> Result<T, DatapathError>,
) -> Result<T, CniError> {
    // From the socket, else (a kernel before 4.9) from /proc.
    let home = host_sock
        .netns()
        .or_else(|_| NetNs::current())
        .map_err(dp("opening the runtime's network namespace"))?;
    let guard = enter_netns(netns, home).map_err(dp("entering the pod's network namespace"))?;
    let done = f();
    guard
        .leave()
        .map_err(dp("leaving the pod's network namespace"))?;
    done.map_err(dp(what))
}

/// A retried ADD: remove what a previous attempt for this attachment left (its
/// host link, which takes the pod end along), or refuse an interface named
/// `ifname` in the pod that has no such twin. Both lookups are ioctls.
fn clear_previous_attempt(
    host_sock: &NetlinkSocket,
    pod_sock: &NetlinkSocket,
    host_name: &str,
    ifname: &str,
    netns_path: &Path,
) -> Result<(), CniError> {
    let ours = host_sock
        .link_index(host_name)
        .map_err(dp("looking up the host side"))?
        .is_some();
    let in_pod = pod_sock
        .link_index(ifname)
        .map_err(dp("looking up the pod interface"))?
        .is_some();
    if in_pod && !ours {
        return Err(CniError::interface_exists(format!(
            "interface {ifname} already exists in {} and was not created by podnet for this container; refusing to replace it (pick another CNI_IFNAME or remove it)",
            netns_path.display()
        )));
    }
    if ours {
        tracing::info!(
            host = host_name,
            "removing the interface pair of a previous ADD of this attachment"
        );
        host_sock
            .delete_link_by_name(host_name)
            .map_err(dp("removing the previous host side"))?;
    }
    Ok(())
}

/// Rolls an ADD back: the link pair goes with its host side, the ENI rules this
/// attempt added are removed, and the addresses are released through the daemon.
/// Failures are logged; the expiration timer is the last resort for an address
/// that could not be released, and the daemon's next start removes rules of
/// addresses no pod holds.
fn undo(
    client: &Client,
    host_sock: &NetlinkSocket,
    host_name: &str,
    added_rules: &[RuleSpec],
    cid: &str,
    ifname: &str,
) {
    if let Err(e) = host_sock.delete_link_by_name(host_name) {
        tracing::warn!(error = %e, "rollback: could not delete {host_name}");
    }
    for rule in added_rules {
        match host_sock.delete_rule(rule) {
            Err(e) if !e.is_not_found() => {
                tracing::warn!(error = %e, "rollback: could not remove an ENI rule");
            }
            _ => {}
        }
    }
    let req = EndpointBatchDeleteRequest {
        container_id: cid.into(),
        container_interface_name: ifname.into(),
        ..Default::default()
    };
    if let Err(e) = client.delete_endpoints(&req) {
        tracing::warn!(error = %e, "rollback: could not release the addresses; they expire on their own");
    }
}

/// The attachment's container ID, interface name and netns path (ADD and CHECK
/// require all three; the env parser has checked they are present).
pub fn attachment(env: &CniEnv) -> Result<(&str, &str, &Path), CniError> {
    match (&env.container_id, &env.ifname, &env.netns) {
        (Some(c), Some(i), Some(n)) => Ok((c, i, n)),
        _ => Err(CniError::invalid_env(
            "CNI_CONTAINERID, CNI_IFNAME and CNI_NETNS are required",
        )),
    }
}

/// Opens the pod's netns; a missing one is code 3 (nothing was allocated yet).
pub fn open_netns(path: &Path) -> Result<NetNs, CniError> {
    NetNs::open(path).map_err(|e| {
        if e.is_not_found() {
            CniError::unknown_container(format!(
                "network namespace {} does not exist: the container is gone (nothing was allocated)",
                path.display()
            ))
        } else if e.errno() == Some(libc::EINVAL) {
            CniError::invalid_env(format!("CNI_NETNS={} is not a network namespace: {e}", path.display()))
        } else {
            CniError::io_failure(format!("opening network namespace {}: {e}", path.display()))
        }
    })
}

/// Wraps a datapath error with what was being done (code 102).
pub fn dp(what: &'static str) -> impl Fn(DatapathError) -> CniError {
    move |e| CniError::datapath_failure(format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;
    use std::time::Duration;

    #[test]
    fn the_configuration_comes_with_the_answer_else_from_get_config() {
        let dir = TestDir::new("addcfg");
        let sock = dir.join("d.sock");
        let client = Client::new(&sock, Duration::from_secs(5));
        // Sent along with the answer: no request (nothing even listens yet).
        let sent = DaemonConfigurationStatus {
            ipam_mode: "kubernetes".into(),
            ..Default::default()
        };
        assert_eq!(daemon_config(&client, Some(sent.clone())).unwrap(), sent);
        // Not sent (a daemon older than podnet-config): GET /v1/config.
        let listener = UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let n = conn.read(&mut buf).unwrap();
            let body = r#"{"status":{"ipam-mode":"cluster-pool","deviceMTU":1400}}"#;
            write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            String::from_utf8_lossy(&buf[..n]).to_string()
        });
        let cfg = daemon_config(&client, None).unwrap();
        assert_eq!(
            (cfg.ipam_mode.as_str(), cfg.device_mtu),
            ("cluster-pool", 1400)
        );
        assert!(server.join().unwrap().starts_with("GET /v1/config "));
    }
}
