//! From the cluster's CiliumNodes to what this node's kernel must hold for the
//! other nodes' pods (pure: no kernel, no API server): the routes to their pod
//! CIDRs and multi-pool blocks, the tunnel's neighbour and FDB entries, the
//! masquerade rules, and a line per remote node for `podnet status`.
//!
//! Tunnel mode: each remote CIDR is routed `via <its router IP> dev podnet_vxlan
//! onlink`; the router IP's neighbour entry is the remote tunnel device's MAC, and
//! the FDB sends that MAC to the remote InternalIP of the underlay family
//! (`--underlay-protocol`). A node's tunnel MAC is derived from that InternalIP
//! ([`tunnel_mac`]), so no extra field has to be published; two nodes whose
//! derived MACs are the same get no tunnel path, and say why.
//! Native mode with auto-direct-node-routes: each remote CIDR `via <its
//! InternalIP>` (nodes on one L2 segment).
//!
//! A change of routing mode (a rolling update of the agents) leaves tunnel and
//! native nodes side by side for a while. A tunnel node tunnels to every node,
//! so a native node keeps its tunnel device and tunnels, in both directions,
//! to each node whose CiliumNode says `tunnel`
//! ([`ROUTING_MODE_ANNOTATION`]): every pair of nodes takes one path both
//! ends have. A node that says nothing (an agent from before the annotation)
//! is taken to route as this node does.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use ipnet::IpNet;
use sha2::{Digest, Sha256};

use super::settings::{CrossNodeConfig, RoutingMode};
use crate::datapath::{L2Entry, format_mac};
use crate::ipam::Family;
use crate::resources::{NodeResource, ROUTING_MODE_ANNOTATION};

/// What a CiliumNode says about a node, for routing to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    pub name: String,
    /// `spec.addresses` of type InternalIP.
    pub internal_ips: Vec<IpAddr>,
    /// `spec.addresses` of type CiliumInternalIP (the router addresses).
    pub router_ips: Vec<IpAddr>,
    /// The node's pod CIDRs and allocated blocks, each with its pool (`None` for
    /// `spec.ipam.podCIDRs`); a pod CIDR also listed as a block (a node migrated
    /// from cluster-pool) is there once, as the block.
    pub cidrs: Vec<(Option<String>, IpNet)>,
    /// How its agent says it routes ([`ROUTING_MODE_ANNOTATION`]; None: it
    /// does not say).
    pub routing: Option<RoutingMode>,
}

impl ClusterNode {
    /// The parts of a CiliumNode routing needs (addresses that do not parse are
    /// left out: the node is then shown without them in status).
    pub fn from_resource(node: &NodeResource) -> ClusterNode {
        let addresses = |kind: &str| {
            node.spec
                .addresses
                .iter()
                .filter(|a| a.kind == kind)
                .filter_map(|a| a.ip.parse().ok())
                .collect()
        };
        let blocks: Vec<(Option<String>, IpNet)> = node
            .spec
            .ipam
            .pools
            .allocated
            .iter()
            .flat_map(|b| b.cidrs.iter().map(|c| (Some(b.pool.clone()), c.trunc())))
            .collect();
        let mut cidrs: Vec<(Option<String>, IpNet)> = node
            .spec
            .ipam
            .pod_cidrs
            .iter()
            .map(|c| c.trunc())
            .filter(|c| !blocks.iter().any(|(_, b)| b == c))
            .map(|c| (None, c))
            .collect();
        cidrs.extend(blocks);
        ClusterNode {
            name: node.metadata.name.clone(),
            internal_ips: addresses("InternalIP"),
            router_ips: addresses("CiliumInternalIP"),
            cidrs,
            routing: node
                .metadata
                .annotations
                .get(ROUTING_MODE_ANNOTATION)
                .and_then(|m| RoutingMode::parse(m)),
        }
    }

    /// Whether this node's path to it goes through the tunnel: in tunnel mode
    /// always, in native mode when it says it tunnels.
    fn tunnelled_from(&self, config: &CrossNodeConfig) -> bool {
        config.routing == RoutingMode::Tunnel || self.routing == Some(RoutingMode::Tunnel)
    }

    /// The first InternalIP of the underlay family: the node's tunnel endpoint.
    fn underlay_ip(&self, underlay: Family) -> Option<IpAddr> {
        self.internal_ips
            .iter()
            .copied()
            .find(|ip| Family::of_addr(ip) == underlay)
    }

    fn internal_ip_like(&self, dst: &IpNet) -> Option<IpAddr> {
        self.internal_ips
            .iter()
            .copied()
            .find(|ip| ip.is_ipv4() == dst.addr().is_ipv4())
    }

    fn router_ip_like(&self, dst: &IpNet) -> Option<IpAddr> {
        self.router_ips
            .iter()
            .copied()
            .find(|ip| ip.is_ipv4() == dst.addr().is_ipv4())
    }
}

/// The MAC of a node's tunnel device, from its InternalIP of the underlay family;
/// both forms are locally administered unicast addresses.
/// - IPv4: `0e:70` followed by the address's four bytes (one-to-one: distinct
///   addresses never share a MAC; the form podnet has always used, so an upgrade
///   re-creates no device).
/// - IPv6: `1e` followed by the first five bytes of the SHA-256 of the address's
///   sixteen bytes. Sixteen bytes do not fit in six, and the low bytes alone
///   would collide for nodes in different subnets with the same interface ID
///   (`fd00:1::5`, `fd00:2::5`), so every bit of the address goes into the hash;
///   40 bits make a collision unlikely (about 1 in 90,000 for 5,000 nodes) but
///   not impossible, so [`plan`] checks for one. The first byte tells the two
///   forms apart in `ip link` and `bridge fdb`.
pub fn tunnel_mac(internal_ip: IpAddr) -> [u8; 6] {
    match internal_ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            [0x0e, 0x70, o[0], o[1], o[2], o[3]]
        }
        IpAddr::V6(a) => {
            let h = Sha256::digest(a.octets());
            [0x1e, h[0], h[1], h[2], h[3], h[4]]
        }
    }
}

/// A route podnet installs to a remote node's CIDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PlannedRoute {
    pub dst: IpNet,
    pub gateway: IpAddr,
    /// Through the tunnel device (`onlink`), else through whatever reaches the
    /// gateway.
    pub tunnel: bool,
    /// The local router address, so that replies to node-originated traffic come
    /// back through the tunnel.
    pub prefsrc: Option<IpAddr>,
}

/// The local tunnel device, once this node's InternalIP of the underlay family
/// is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunnelEndpoint {
    pub local: IpAddr,
    pub mac: [u8; 6],
}

/// Source NAT for one family: pod traffic from `sources` to anything outside
/// `exempt` leaves with the node's address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MasqueradeFamily {
    pub sources: Vec<IpNet>,
    pub exempt: Vec<IpNet>,
}

/// One remote node as `podnet status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteNode {
    pub name: String,
    pub internal_ip: Option<IpAddr>,
    pub cidrs: Vec<IpNet>,
    pub path: RemotePath,
}

/// How this node reaches a remote node's pods, or why it cannot; its text (the
/// status's `path`) is written only when status is read, not on every batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemotePath {
    /// Tunnel mode before this node has an InternalIP of the underlay family.
    WaitingForLocal(Family),
    /// Through the tunnel to this underlay address; CIDRs of the families named
    /// in `no_router` are not routed (the node has no router address of theirs).
    Tunnel {
        remote: IpAddr,
        no_router: BTreeSet<&'static str>,
    },
    /// No InternalIP of the underlay family: no tunnel.
    NoUnderlayIp(Family),
    /// Its tunnel MAC, derived from `remote`, is also that of `others`.
    MacShared {
        mac: [u8; 6],
        remote: IpAddr,
        others: Vec<String>,
        underlay: Family,
    },
    /// auto-direct-node-routes: its CIDRs via these InternalIPs.
    Direct(Vec<IpAddr>),
    /// auto-direct-node-routes, but no InternalIP of this CIDR's family.
    NoDirectRoute(IpNet),
    /// Native routing without auto-direct-node-routes.
    Network,
}

impl std::fmt::Display for RemotePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemotePath::WaitingForLocal(underlay) => write!(
                f,
                "waiting for this node's {} InternalIP (the tunnel's local address: underlay-protocol is {}); give this node's Node one, or set underlay-protocol {}",
                underlay.label(),
                underlay.as_str(),
                underlay.other().as_str()
            ),
            RemotePath::Tunnel { remote, no_router } if no_router.is_empty() => {
                write!(f, "tunnel to {remote}")
            }
            RemotePath::Tunnel { remote, no_router } => write!(
                f,
                "tunnel to {remote}; no {} router address (CiliumInternalIP) yet: those CIDRs are not routed",
                no_router.iter().copied().collect::<Vec<_>>().join(" or ")
            ),
            RemotePath::NoUnderlayIp(underlay) => write!(
                f,
                "no {label} InternalIP: underlay-protocol is {value}, so there is no tunnel to it; give it an {label} InternalIP (its Node's status.addresses), or set underlay-protocol {other} on every node",
                label = underlay.label(),
                value = underlay.as_str(),
                other = underlay.other().as_str()
            ),
            RemotePath::MacShared {
                mac,
                remote,
                others,
                underlay,
            } => write!(
                f,
                "no tunnel: its tunnel MAC {} (derived from {remote}) is also that of {}; give one of them another {} InternalIP",
                format_mac(mac),
                others.join(", "),
                underlay.label()
            ),
            RemotePath::Direct(via) if via.is_empty() => f.write_str("no CIDRs yet"),
            RemotePath::Direct(via) => write!(
                f,
                "route via {}",
                via.iter()
                    .map(IpAddr::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            RemotePath::NoDirectRoute(dst) => write!(
                f,
                "no InternalIP of {dst}'s family: not routed (auto-direct-node-routes needs one)"
            ),
            RemotePath::Network => f.write_str("routed by the network"),
        }
    }
}

/// Everything the reconciler makes the kernel hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DatapathPlan {
    pub tunnel: Option<TunnelEndpoint>,
    pub routes: BTreeSet<PlannedRoute>,
    pub neighbours: BTreeSet<L2Entry>,
    pub fdb: BTreeSet<L2Entry>,
    pub masquerade_v4: Option<MasqueradeFamily>,
    pub masquerade_v6: Option<MasqueradeFamily>,
    pub remotes: Vec<RemoteNode>,
}

/// The plan for node `self_name` given every CiliumNode of the cluster; pods of
/// the pools in `skip_masquerade_pools` keep their source address.
pub fn plan(
    config: &CrossNodeConfig,
    self_name: &str,
    nodes: &[ClusterNode],
    skip_masquerade_pools: &BTreeSet<String>,
) -> DatapathPlan {
    let mut out = DatapathPlan::default();
    let me = nodes.iter().find(|n| n.name == self_name);
    let underlay = config.underlay;
    let tunnel = nodes
        .iter()
        .any(|n| n.name != self_name && n.tunnelled_from(config))
        || config.routing == RoutingMode::Tunnel;
    if tunnel {
        out.tunnel = me
            .and_then(|m| m.underlay_ip(underlay))
            .map(|local| TunnelEndpoint {
                local,
                mac: tunnel_mac(local),
            });
    }
    let owners = match tunnel {
        true => mac_owners(nodes, underlay),
        false => BTreeMap::new(),
    };
    for node in nodes.iter().filter(|n| n.name != self_name) {
        let tunnelled = node.tunnelled_from(config);
        let path = if tunnelled {
            match out.tunnel {
                Some(_) => add_tunnel_paths(&mut out, node, me, underlay, &owners),
                None => RemotePath::WaitingForLocal(underlay),
            }
        } else if config.auto_direct_node_routes {
            add_direct_routes(&mut out, node)
        } else {
            RemotePath::Network
        };
        let shown = match tunnelled {
            true => node.underlay_ip(underlay),
            false => None,
        };
        out.remotes.push(RemoteNode {
            name: node.name.clone(),
            internal_ip: shown.or_else(|| node.internal_ips.first().copied()),
            cidrs: node.cidrs.iter().map(|(_, c)| *c).collect(),
            path,
        });
    }
    let all_pod_cidrs: Vec<IpNet> = nodes
        .iter()
        .flat_map(|n| n.cidrs.iter().map(|(_, c)| *c))
        .collect();
    let own_sources: Vec<IpNet> = me
        .map(|n| {
            n.cidrs
                .iter()
                .filter(|(pool, _)| {
                    pool.as_ref()
                        .is_none_or(|p| !skip_masquerade_pools.contains(p))
                })
                .map(|(_, c)| *c)
                .collect()
        })
        .unwrap_or_default();
    let family = |v4: bool| {
        let of = |list: &[IpNet]| -> Vec<IpNet> {
            IpNet::aggregate(
                &list
                    .iter()
                    .copied()
                    .filter(|c| c.addr().is_ipv4() == v4)
                    .collect(),
            )
        };
        let mut exempt = all_pod_cidrs.clone();
        exempt.extend(config.native_routing_cidrs.iter().copied());
        let f = MasqueradeFamily {
            sources: of(&own_sources),
            exempt: of(&exempt),
        };
        (!f.sources.is_empty()).then_some(f)
    };
    if config.masquerade_v4 {
        out.masquerade_v4 = family(true);
    }
    if config.masquerade_v6 {
        out.masquerade_v6 = family(false);
    }
    out
}

/// The tunnel MACs derived for more than one node (this node included), each
/// with the names of those nodes: a collision. (Only these get a list: one for
/// every node, on every pass, cost an allocation per node.)
fn mac_owners(nodes: &[ClusterNode], underlay: Family) -> BTreeMap<[u8; 6], Vec<&str>> {
    let mut first: HashMap<[u8; 6], &str> = HashMap::with_capacity(nodes.len());
    let mut shared: BTreeMap<[u8; 6], Vec<&str>> = BTreeMap::new();
    for n in nodes {
        if let Some(ip) = n.underlay_ip(underlay) {
            match first.entry(tunnel_mac(ip)) {
                Entry::Vacant(e) => {
                    e.insert(&n.name);
                }
                Entry::Occupied(e) => shared
                    .entry(*e.key())
                    .or_insert_with(|| vec![*e.get()])
                    .push(&n.name),
            }
        }
    }
    shared
}

/// Tunnel routes, neighbours and the FDB entry for one remote node (none when it
/// has no InternalIP of the underlay family, or its tunnel MAC is another node's).
fn add_tunnel_paths(
    out: &mut DatapathPlan,
    node: &ClusterNode,
    me: Option<&ClusterNode>,
    underlay: Family,
    owners: &BTreeMap<[u8; 6], Vec<&str>>,
) -> RemotePath {
    let Some(remote) = node.underlay_ip(underlay) else {
        return RemotePath::NoUnderlayIp(underlay);
    };
    let mac = tunnel_mac(remote);
    let others: Vec<String> = owners
        .get(&mac)
        .into_iter()
        .flatten()
        .filter(|n| **n != node.name)
        .map(|n| n.to_string())
        .collect();
    if !others.is_empty() {
        return RemotePath::MacShared {
            mac,
            remote,
            others,
            underlay,
        };
    }
    let mut missing = BTreeSet::new();
    for (_, dst) in &node.cidrs {
        let Some(gateway) = node.router_ip_like(dst) else {
            missing.insert(if dst.addr().is_ipv4() { "IPv4" } else { "IPv6" });
            continue;
        };
        out.routes.insert(PlannedRoute {
            dst: *dst,
            gateway,
            tunnel: true,
            prefsrc: me.and_then(|m| m.router_ip_like(dst)),
        });
        out.neighbours.insert(L2Entry { ip: gateway, mac });
    }
    out.fdb.insert(L2Entry { ip: remote, mac });
    RemotePath::Tunnel {
        remote,
        no_router: missing,
    }
}

/// auto-direct-node-routes: each CIDR via the node's InternalIP of its family.
fn add_direct_routes(out: &mut DatapathPlan, node: &ClusterNode) -> RemotePath {
    let mut via = BTreeSet::new();
    for (_, dst) in &node.cidrs {
        match node.internal_ip_like(dst) {
            Some(gateway) => {
                out.routes.insert(PlannedRoute {
                    dst: *dst,
                    gateway,
                    tunnel: false,
                    prefsrc: None,
                });
                via.insert(gateway);
            }
            None => return RemotePath::NoDirectRoute(*dst),
        }
    }
    RemotePath::Direct(via.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(routing: RoutingMode) -> CrossNodeConfig {
        CrossNodeConfig {
            routing,
            tunnel_protocol: super::super::TunnelProtocol::Vxlan,
            tunnel_port: 8472,
            underlay: Family::V4,
            auto_direct_node_routes: routing == RoutingMode::Native,
            native_routing_cidrs: Vec::new(),
            masquerade_v4: true,
            masquerade_v6: false,
        }
    }

    fn node(name: &str, internal: &str, router: &str, cidrs: &[(&str, &str)]) -> ClusterNode {
        ClusterNode {
            name: name.into(),
            internal_ips: vec![internal.parse().unwrap()],
            router_ips: vec![router.parse().unwrap()],
            cidrs: cidrs
                .iter()
                .map(|(pool, c)| {
                    (
                        (!pool.is_empty()).then(|| pool.to_string()),
                        c.parse().unwrap(),
                    )
                })
                .collect(),
            routing: None,
        }
    }

    fn cluster() -> Vec<ClusterNode> {
        vec![
            node("a", "192.168.0.1", "10.1.0.1", &[("", "10.1.0.0/24")]),
            node("b", "192.168.0.2", "10.1.1.1", &[("", "10.1.1.0/24")]),
            node(
                "c",
                "192.168.0.3",
                "10.1.2.1",
                &[("default", "10.1.2.0/24"), ("mars", "10.9.0.0/27")],
            ),
        ]
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn tunnel_routes_every_remote_cidr_via_its_router_on_the_tunnel() {
        let p = plan(
            &config(RoutingMode::Tunnel),
            "a",
            &cluster(),
            &BTreeSet::new(),
        );
        assert_eq!(
            p.tunnel,
            Some(TunnelEndpoint {
                local: "192.168.0.1".parse().unwrap(),
                mac: [0x0e, 0x70, 192, 168, 0, 1]
            })
        );
        let routes: Vec<(IpNet, IpAddr)> = p.routes.iter().map(|r| (r.dst, r.gateway)).collect();
        assert_eq!(
            routes,
            vec![
                (net("10.1.1.0/24"), "10.1.1.1".parse().unwrap()),
                (net("10.1.2.0/24"), "10.1.2.1".parse().unwrap()),
                (net("10.9.0.0/27"), "10.1.2.1".parse().unwrap()),
            ]
        );
        assert!(
            p.routes
                .iter()
                .all(|r| r.tunnel && r.prefsrc == Some("10.1.0.1".parse().unwrap()))
        );
        assert_eq!(p.fdb.len(), 2);
        assert!(p.fdb.contains(&L2Entry {
            ip: "192.168.0.3".parse().unwrap(),
            mac: [0x0e, 0x70, 192, 168, 0, 3]
        }));
        assert_eq!(
            p.neighbours.len(),
            2,
            "one per remote router: {:?}",
            p.neighbours
        );
        assert_eq!(p.remotes.len(), 2);
        assert_eq!(p.remotes[0].path.to_string(), "tunnel to 192.168.0.2");
    }

    #[test]
    fn tunnel_waits_for_this_nodes_internal_ip() {
        let mut nodes = cluster();
        nodes[0].internal_ips.clear();
        let p = plan(&config(RoutingMode::Tunnel), "a", &nodes, &BTreeSet::new());
        assert!(p.tunnel.is_none() && p.routes.is_empty() && p.fdb.is_empty());
        assert_eq!(
            p.remotes[0].path.to_string(),
            "waiting for this node's IPv4 InternalIP (the tunnel's local address: underlay-protocol is ipv4); give this node's Node one, or set underlay-protocol ipv6"
        );
    }

    fn v6_config() -> CrossNodeConfig {
        CrossNodeConfig {
            underlay: Family::V6,
            ..config(RoutingMode::Tunnel)
        }
    }

    /// Nodes with an IPv4 and an IPv6 InternalIP (IPv4 first) and IPv6 pods.
    fn dual_stack_cluster() -> Vec<ClusterNode> {
        (1..=3)
            .map(|i| ClusterNode {
                name: format!("n{i}"),
                internal_ips: vec![
                    format!("192.168.0.{i}").parse().unwrap(),
                    format!("fd00:250::{i}").parse().unwrap(),
                ],
                router_ips: vec![format!("fd00:61:{i}::1").parse().unwrap()],
                cidrs: vec![(None, net(&format!("fd00:61:{i}::/120")))],
                routing: None,
            })
            .collect()
    }

    #[test]
    fn an_ipv6_underlay_tunnels_from_and_to_the_ipv6_internal_ips() {
        let p = plan(&v6_config(), "n1", &dual_stack_cluster(), &BTreeSet::new());
        let local: IpAddr = "fd00:250::1".parse().unwrap();
        assert_eq!(
            p.tunnel,
            Some(TunnelEndpoint {
                local,
                mac: tunnel_mac(local)
            })
        );
        let fdb: Vec<IpAddr> = p.fdb.iter().map(|e| e.ip).collect();
        assert_eq!(
            fdb,
            ["fd00:250::2", "fd00:250::3"].map(|a| a.parse::<IpAddr>().unwrap())
        );
        for e in &p.fdb {
            assert_eq!(e.mac, tunnel_mac(e.ip));
            assert!(
                p.neighbours.iter().any(|n| n.mac == e.mac),
                "a router's neighbour entry is its node's tunnel MAC"
            );
        }
        assert_eq!(p.routes.len(), 2);
        assert_eq!(p.remotes[0].path.to_string(), "tunnel to fd00:250::2");
        assert_eq!(
            p.remotes[0].internal_ip,
            Some("fd00:250::2".parse().unwrap()),
            "status shows the InternalIP the tunnel uses, not the first one"
        );
    }

    #[test]
    fn the_ipv4_tunnel_mac_is_0e_70_and_the_address() {
        assert_eq!(
            tunnel_mac("10.250.0.12".parse().unwrap()),
            [0x0e, 0x70, 10, 250, 0, 12]
        );
    }

    #[test]
    fn the_ipv6_tunnel_mac_is_1e_and_five_bytes_of_the_addresses_sha256() {
        // sha256(fd00:250::12's 16 bytes) starts c2 27 d4 e6 3c: pinned, so the
        // MAC a node derives never changes with a podnet version.
        assert_eq!(
            tunnel_mac("fd00:250::12".parse().unwrap()),
            [0x1e, 0xc2, 0x27, 0xd4, 0xe6, 0x3c]
        );
        let mac = tunnel_mac("fd00:1::5".parse().unwrap());
        assert_eq!(mac[0] & 0x03, 0x02, "locally administered, unicast");
        assert_ne!(
            mac,
            tunnel_mac("fd00:2::5".parse().unwrap()),
            "same interface ID in another subnet, another MAC"
        );
    }

    #[test]
    fn a_remote_without_an_internal_ip_of_the_underlay_family_is_not_tunnelled_and_told_why() {
        let mut nodes = dual_stack_cluster();
        nodes[1].internal_ips.retain(IpAddr::is_ipv4);
        let p = plan(&v6_config(), "n1", &nodes, &BTreeSet::new());
        assert_eq!(
            p.remotes[0].path.to_string(),
            "no IPv6 InternalIP: underlay-protocol is ipv6, so there is no tunnel to it; give it an IPv6 InternalIP (its Node's status.addresses), or set underlay-protocol ipv4 on every node"
        );
        assert!(!p.routes.iter().any(|r| r.dst == net("fd00:61:2::/120")));
        assert_eq!(p.fdb.len(), 1, "the third node is still tunnelled");
        let mut nodes = dual_stack_cluster();
        nodes[1].internal_ips.retain(IpAddr::is_ipv6);
        let p = plan(&config(RoutingMode::Tunnel), "n1", &nodes, &BTreeSet::new());
        assert!(
            p.remotes[0].path.to_string().starts_with(
                "no IPv4 InternalIP: underlay-protocol is ipv4, so there is no tunnel to it"
            ) && p.remotes[0]
                .path
                .to_string()
                .ends_with("or set underlay-protocol ipv6 on every node"),
            "{}",
            p.remotes[0].path.to_string()
        );
    }

    #[test]
    fn this_node_without_an_ipv6_internal_ip_waits_and_names_underlay_protocol() {
        let mut nodes = dual_stack_cluster();
        nodes[0].internal_ips.retain(IpAddr::is_ipv4);
        let p = plan(&v6_config(), "n1", &nodes, &BTreeSet::new());
        assert!(p.tunnel.is_none() && p.routes.is_empty() && p.fdb.is_empty());
        assert_eq!(
            p.remotes[0].path.to_string(),
            "waiting for this node's IPv6 InternalIP (the tunnel's local address: underlay-protocol is ipv6); give this node's Node one, or set underlay-protocol ipv4"
        );
    }

    #[test]
    fn two_remotes_with_one_tunnel_mac_get_no_tunnel_and_say_with_whom() {
        // A 40-bit hash collision cannot be found for a test; two nodes
        // publishing the same InternalIP collide the same way.
        let mut nodes = dual_stack_cluster();
        nodes[2].internal_ips = nodes[1].internal_ips.clone();
        let p = plan(&v6_config(), "n1", &nodes, &BTreeSet::new());
        let mac = format_mac(&tunnel_mac("fd00:250::2".parse().unwrap()));
        assert_eq!(
            p.remotes[0].path.to_string(),
            format!(
                "no tunnel: its tunnel MAC {mac} (derived from fd00:250::2) is also that of n3; give one of them another IPv6 InternalIP"
            )
        );
        assert!(p.remotes[1].path.to_string().contains("is also that of n2"));
        assert!(p.fdb.is_empty() && p.routes.is_empty() && p.neighbours.is_empty());
        assert!(p.tunnel.is_some(), "this node's own device is unaffected");
        // A remote with this node's MAC: the remote is left out, the others stay.
        let mut nodes = dual_stack_cluster();
        nodes[1].internal_ips = nodes[0].internal_ips.clone();
        let p = plan(&v6_config(), "n1", &nodes, &BTreeSet::new());
        assert!(
            p.remotes[0].path.to_string().contains("is also that of n1"),
            "{:?}",
            p.remotes[0]
        );
        assert_eq!(p.remotes[1].path.to_string(), "tunnel to fd00:250::3");
    }

    #[test]
    fn native_routing_ignores_the_underlay_protocol() {
        let c = CrossNodeConfig {
            underlay: Family::V6,
            ..config(RoutingMode::Native)
        };
        let p = plan(&c, "b", &cluster(), &BTreeSet::new());
        assert_eq!(
            p,
            plan(
                &config(RoutingMode::Native),
                "b",
                &cluster(),
                &BTreeSet::new()
            )
        );
    }

    #[test]
    fn a_remote_without_router_address_gets_its_fdb_entry_but_no_route() {
        let mut nodes = cluster();
        nodes[1].router_ips.clear();
        let p = plan(&config(RoutingMode::Tunnel), "a", &nodes, &BTreeSet::new());
        assert!(!p.routes.iter().any(|r| r.dst == net("10.1.1.0/24")));
        assert!(
            p.remotes[0]
                .path
                .to_string()
                .contains("no IPv4 router address"),
            "{}",
            p.remotes[0].path.to_string()
        );
    }

    #[test]
    fn native_with_direct_routes_goes_via_internal_ips() {
        let p = plan(
            &config(RoutingMode::Native),
            "b",
            &cluster(),
            &BTreeSet::new(),
        );
        assert!(p.tunnel.is_none() && p.fdb.is_empty() && p.neighbours.is_empty());
        assert_eq!(
            routes_of(&p),
            vec![
                (net("10.1.0.0/24"), "192.168.0.1".parse().unwrap(), false),
                (net("10.1.2.0/24"), "192.168.0.3".parse().unwrap(), false),
                (net("10.9.0.0/27"), "192.168.0.3".parse().unwrap(), false),
            ]
        );
        assert_eq!(p.remotes[1].path.to_string(), "route via 192.168.0.3");
    }

    /// Each planned route: destination, gateway, whether through the tunnel.
    fn routes_of(p: &DatapathPlan) -> Vec<(IpNet, IpAddr, bool)> {
        p.routes
            .iter()
            .map(|r| (r.dst, r.gateway, r.tunnel))
            .collect()
    }

    /// `cluster()` with each node saying the mode of `modes` (a, b, c).
    fn saying(modes: [Option<RoutingMode>; 3]) -> Vec<ClusterNode> {
        let mut nodes = cluster();
        for (n, m) in nodes.iter_mut().zip(modes) {
            n.routing = m;
        }
        nodes
    }

    #[test]
    fn a_native_node_tunnels_both_ways_to_the_nodes_that_still_tunnel() {
        use RoutingMode::{Native, Tunnel};
        let nodes = saying([Some(Tunnel), Some(Native), Some(Native)]);
        let p = plan(&config(Native), "b", &nodes, &BTreeSet::new());
        let local: IpAddr = "192.168.0.2".parse().unwrap();
        assert_eq!(
            p.tunnel,
            Some(TunnelEndpoint {
                local,
                mac: tunnel_mac(local)
            }),
            "the device a's packets arrive on"
        );
        assert_eq!(
            routes_of(&p),
            vec![
                (net("10.1.0.0/24"), "10.1.0.1".parse().unwrap(), true),
                (net("10.1.2.0/24"), "192.168.0.3".parse().unwrap(), false),
                (net("10.9.0.0/27"), "192.168.0.3".parse().unwrap(), false),
            ]
        );
        let a: IpAddr = "192.168.0.1".parse().unwrap();
        let fdb: Vec<IpAddr> = p.fdb.iter().map(|e| e.ip).collect();
        assert_eq!(fdb, vec![a]);
        assert_eq!(p.remotes[0].path.to_string(), "tunnel to 192.168.0.1");
        assert_eq!(p.remotes[1].path.to_string(), "route via 192.168.0.3");

        // Without auto-direct-node-routes the native peer is the network's.
        let mut c = config(Native);
        c.auto_direct_node_routes = false;
        let p = plan(&c, "b", &nodes, &BTreeSet::new());
        assert!(p.tunnel.is_some());
        assert_eq!(p.routes.len(), 1);
        assert_eq!(p.remotes[1].path.to_string(), "routed by the network");
    }

    #[test]
    fn once_no_node_tunnels_a_native_node_has_no_tunnel() {
        use RoutingMode::{Native, Tunnel};
        // This node's own old annotation does not count, nor does silence.
        for modes in [
            [Some(Native), Some(Tunnel), Some(Native)],
            [None, Some(Native), None],
        ] {
            let p = plan(&config(Native), "b", &saying(modes), &BTreeSet::new());
            assert!(
                p.tunnel.is_none() && p.fdb.is_empty() && p.neighbours.is_empty(),
                "{modes:?}"
            );
            assert!(p.routes.iter().all(|r| !r.tunnel), "{modes:?}");
        }
    }

    #[test]
    fn a_tunnel_node_tunnels_to_native_nodes_too() {
        use RoutingMode::{Native, Tunnel};
        let nodes = saying([Some(Tunnel), Some(Native), Some(Native)]);
        let tunnel = plan(&config(Tunnel), "a", &nodes, &BTreeSet::new());
        assert_eq!(
            tunnel,
            plan(&config(Tunnel), "a", &cluster(), &BTreeSet::new())
        );
    }

    #[test]
    fn the_routing_mode_comes_from_the_cilium_nodes_annotation() {
        let mut r = NodeResource::new("a");
        assert_eq!(ClusterNode::from_resource(&r).routing, None);
        for (value, mode) in [
            ("tunnel", Some(RoutingMode::Tunnel)),
            ("native", Some(RoutingMode::Native)),
            ("geneve", None),
        ] {
            r.metadata
                .annotations
                .insert(ROUTING_MODE_ANNOTATION.into(), value.into());
            assert_eq!(ClusterNode::from_resource(&r).routing, mode, "{value}");
        }
    }

    #[test]
    fn native_without_direct_routes_installs_nothing() {
        let mut c = config(RoutingMode::Native);
        c.auto_direct_node_routes = false;
        let p = plan(&c, "a", &cluster(), &BTreeSet::new());
        assert!(p.routes.is_empty());
        assert_eq!(p.remotes[0].path.to_string(), "routed by the network");
    }

    #[test]
    fn masquerade_sources_are_own_cidrs_exempt_are_all_pod_and_native_cidrs() {
        let mut c = config(RoutingMode::Tunnel);
        c.native_routing_cidrs = vec![net("10.0.0.0/8")];
        let p = plan(&c, "c", &cluster(), &BTreeSet::from(["mars".to_string()]));
        let m = p.masquerade_v4.expect("IPv4 masquerade");
        assert_eq!(m.sources, vec![net("10.1.2.0/24")], "mars skips masquerade");
        assert_eq!(
            m.exempt,
            vec![net("10.0.0.0/8")],
            "overlapping CIDRs merged"
        );
        assert!(p.masquerade_v6.is_none());
        let p = plan(
            &config(RoutingMode::Tunnel),
            "c",
            &cluster(),
            &BTreeSet::new(),
        );
        let m = p.masquerade_v4.expect("IPv4 masquerade");
        assert_eq!(m.sources, vec![net("10.1.2.0/24"), net("10.9.0.0/27")]);
        assert_eq!(
            m.exempt,
            vec![net("10.1.0.0/23"), net("10.1.2.0/24"), net("10.9.0.0/27")]
        );
    }

    #[test]
    fn masquerade_off_or_without_own_cidrs_is_none() {
        let mut c = config(RoutingMode::Tunnel);
        c.masquerade_v4 = false;
        assert!(
            plan(&c, "a", &cluster(), &BTreeSet::new())
                .masquerade_v4
                .is_none()
        );
        let p = plan(
            &config(RoutingMode::Tunnel),
            "unknown",
            &cluster(),
            &BTreeSet::new(),
        );
        assert!(p.masquerade_v4.is_none());
        assert_eq!(p.remotes.len(), 3);
    }

    #[test]
    fn from_resource_reads_addresses_cidrs_and_blocks() {
        let r: NodeResource = serde_json::from_value(serde_json::json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
            "metadata": {"name": "n1"},
            "spec": {
                "addresses": [
                    {"type": "InternalIP", "ip": "192.168.0.9"},
                    {"type": "CiliumInternalIP", "ip": "10.1.9.1"},
                    {"type": "InternalIP", "ip": "not an ip"}
                ],
                "ipam": {
                    "podCIDRs": ["10.1.9.0/24"],
                    "pools": {"allocated": [{"pool": "mars", "cidrs": ["10.9.0.32/27"]}]}
                }
            }
        }))
        .unwrap();
        let n = ClusterNode::from_resource(&r);
        assert_eq!(
            n.internal_ips,
            vec!["192.168.0.9".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(n.router_ips, vec!["10.1.9.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            n.cidrs,
            vec![
                (None, net("10.1.9.0/24")),
                (Some("mars".into()), net("10.9.0.32/27"))
            ]
        );
    }

    #[test]
    fn a_migrated_pod_cidr_is_one_cidr_and_one_route() {
        let mut res = NodeResource::new("b");
        res.spec.addresses = vec![
            crate::resources::NodeAddress {
                kind: "InternalIP".into(),
                ip: "192.168.0.2".into(),
            },
            crate::resources::NodeAddress {
                kind: "CiliumInternalIP".into(),
                ip: "10.1.1.1".into(),
            },
        ];
        res.spec.ipam.pod_cidrs = vec![net("10.1.1.0/24")];
        res.spec.ipam.pools.allocated = vec![crate::resources::AllocatedPool {
            pool: "default".into(),
            cidrs: vec![net("10.1.1.0/24"), net("10.2.0.0/27")],
            ..Default::default()
        }];
        let b = ClusterNode::from_resource(&res);
        assert_eq!(
            b.cidrs,
            [
                (Some("default".to_string()), net("10.1.1.0/24")),
                (Some("default".to_string()), net("10.2.0.0/27"))
            ]
        );
        // A node still in cluster-pool and the migrated one: same routes either way.
        let a = node("a", "192.168.0.1", "10.1.0.1", &[("", "10.1.0.0/24")]);
        let p = plan(&config(RoutingMode::Tunnel), "a", &[a, b], &BTreeSet::new());
        let dsts: Vec<String> = p.routes.iter().map(|r| r.dst.to_string()).collect();
        assert_eq!(dsts, ["10.1.1.0/24", "10.2.0.0/27"]);
        assert_eq!(p.remotes[0].cidrs.len(), 2);
    }

    #[test]
    fn an_extra_cluster_pool_cidr_is_routed_tunnelled_and_masqueraded_like_the_first() {
        let two = |name: &str, internal: &str, router: &str, cidrs: &[&str]| {
            let mut res = NodeResource::new(name);
            res.set_address("InternalIP", internal.parse().unwrap());
            res.set_address("CiliumInternalIP", router.parse().unwrap());
            res.spec.ipam.pod_cidrs = cidrs.iter().map(|c| net(c)).collect();
            ClusterNode::from_resource(&res)
        };
        let nodes = [
            two("a", "192.168.0.1", "10.1.0.1", &["10.1.0.0/24"]),
            two(
                "b",
                "192.168.0.2",
                "10.1.1.1",
                &["10.1.1.0/24", "10.1.7.0/24"],
            ),
        ];
        for mode in [RoutingMode::Tunnel, RoutingMode::Native] {
            let p = plan(&config(mode), "a", &nodes, &BTreeSet::new());
            let dsts: Vec<String> = p.routes.iter().map(|r| r.dst.to_string()).collect();
            assert_eq!(dsts, ["10.1.1.0/24", "10.1.7.0/24"], "{mode:?}");
            assert_eq!(p.remotes[0].cidrs, [net("10.1.1.0/24"), net("10.1.7.0/24")]);
            let m = p.masquerade_v4.expect("IPv4 masquerade");
            assert!(m.exempt.contains(&net("10.1.7.0/24")), "{m:?}");
        }
        // On the node holding it: both are its own sources.
        let p = plan(&config(RoutingMode::Tunnel), "b", &nodes, &BTreeSet::new());
        let m = p.masquerade_v4.expect("IPv4 masquerade");
        assert_eq!(m.sources, [net("10.1.1.0/24"), net("10.1.7.0/24")]);
    }
}
