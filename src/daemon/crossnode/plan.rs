//! From the cluster's CiliumNodes to what this node's kernel must hold for the
//! other nodes' pods (pure: no kernel, no API server): the routes to their pod
//! CIDRs and multi-pool blocks, the tunnel's neighbour and FDB entries, the
//! masquerade rules, and a line per remote node for `podnet status`.
//!
//! Tunnel mode: each remote CIDR is routed `via <its router IP> dev podnet_vxlan
//! onlink`; the router IP's neighbour entry is the remote tunnel device's MAC, and
//! the FDB sends that MAC to the remote InternalIP. A node's tunnel MAC is derived
//! from its InternalIP ([`tunnel_mac`]), so no extra field has to be published.
//! Native mode with auto-direct-node-routes: each remote CIDR `via <its
//! InternalIP>` (nodes on one L2 segment).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use super::CrossNodeConfig;
use crate::daemon::config::RoutingMode;
use crate::datapath::L2Entry;
use crate::resources::NodeResource;

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
        }
    }

    fn internal_ipv4(&self) -> Option<Ipv4Addr> {
        self.internal_ips.iter().find_map(|ip| match ip {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        })
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

/// The MAC of a node's tunnel device: `0e:70` (locally administered, unicast)
/// followed by its IPv4 InternalIP.
pub fn tunnel_mac(internal_ip: Ipv4Addr) -> [u8; 6] {
    let o = internal_ip.octets();
    [0x0e, 0x70, o[0], o[1], o[2], o[3]]
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

/// The local tunnel device, once this node's InternalIP is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunnelEndpoint {
    pub local: Ipv4Addr,
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
    /// `tunnel to <ip>`, `route via <ip>`, `routed by the network`, or why
    /// nothing could be installed.
    pub path: String,
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
    if config.routing == RoutingMode::Tunnel {
        out.tunnel = me
            .and_then(ClusterNode::internal_ipv4)
            .map(|local| TunnelEndpoint {
                local,
                mac: tunnel_mac(local),
            });
    }
    for node in nodes.iter().filter(|n| n.name != self_name) {
        let path = match config.routing {
            RoutingMode::Tunnel => match out.tunnel {
                Some(_) => add_tunnel_paths(&mut out, node, me),
                None => "waiting for this node's InternalIP (the tunnel's local address)".into(),
            },
            RoutingMode::Native if config.auto_direct_node_routes => {
                add_direct_routes(&mut out, node)
            }
            RoutingMode::Native => "routed by the network".into(),
        };
        out.remotes.push(RemoteNode {
            name: node.name.clone(),
            internal_ip: node.internal_ips.first().copied(),
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

/// Tunnel routes, neighbours and the FDB entry for one remote node.
fn add_tunnel_paths(
    out: &mut DatapathPlan,
    node: &ClusterNode,
    me: Option<&ClusterNode>,
) -> String {
    let Some(remote) = node.internal_ipv4() else {
        return "no IPv4 InternalIP: no tunnel".into();
    };
    let mac = tunnel_mac(remote);
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
    out.fdb.insert(L2Entry {
        ip: IpAddr::V4(remote),
        mac,
    });
    match missing.is_empty() {
        true => format!("tunnel to {remote}"),
        false => format!(
            "tunnel to {remote}; no {} router address (CiliumInternalIP) yet: those CIDRs are not routed",
            missing.into_iter().collect::<Vec<_>>().join(" or ")
        ),
    }
}

/// auto-direct-node-routes: each CIDR via the node's InternalIP of its family.
fn add_direct_routes(out: &mut DatapathPlan, node: &ClusterNode) -> String {
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
            None => {
                return format!(
                    "no InternalIP of {dst}'s family: not routed (auto-direct-node-routes needs one)"
                );
            }
        }
    }
    match via.iter().map(IpAddr::to_string).collect::<Vec<_>>() {
        v if v.is_empty() => "no CIDRs yet".into(),
        v => format!("route via {}", v.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(routing: RoutingMode) -> CrossNodeConfig {
        CrossNodeConfig {
            routing,
            tunnel_protocol: super::super::TunnelProtocol::Vxlan,
            tunnel_port: 8472,
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
        assert_eq!(p.remotes[0].path, "tunnel to 192.168.0.2");
    }

    #[test]
    fn tunnel_waits_for_this_nodes_internal_ip() {
        let mut nodes = cluster();
        nodes[0].internal_ips.clear();
        let p = plan(&config(RoutingMode::Tunnel), "a", &nodes, &BTreeSet::new());
        assert!(p.tunnel.is_none() && p.routes.is_empty() && p.fdb.is_empty());
        assert!(
            p.remotes[0]
                .path
                .contains("waiting for this node's InternalIP")
        );
    }

    #[test]
    fn a_remote_without_router_address_gets_its_fdb_entry_but_no_route() {
        let mut nodes = cluster();
        nodes[1].router_ips.clear();
        let p = plan(&config(RoutingMode::Tunnel), "a", &nodes, &BTreeSet::new());
        assert!(!p.routes.iter().any(|r| r.dst == net("10.1.1.0/24")));
        assert!(
            p.remotes[0].path.contains("no IPv4 router address"),
            "{}",
            p.remotes[0].path
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
        let routes: Vec<(IpNet, IpAddr, bool)> = p
            .routes
            .iter()
            .map(|r| (r.dst, r.gateway, r.tunnel))
            .collect();
        assert_eq!(
            routes,
            vec![
                (net("10.1.0.0/24"), "192.168.0.1".parse().unwrap(), false),
                (net("10.1.2.0/24"), "192.168.0.3".parse().unwrap(), false),
                (net("10.9.0.0/27"), "192.168.0.3".parse().unwrap(), false),
            ]
        );
        assert_eq!(p.remotes[1].path, "route via 192.168.0.3");
    }

    #[test]
    fn native_without_direct_routes_installs_nothing() {
        let mut c = config(RoutingMode::Native);
        c.auto_direct_node_routes = false;
        let p = plan(&c, "a", &cluster(), &BTreeSet::new());
        assert!(p.routes.is_empty());
        assert_eq!(p.remotes[0].path, "routed by the network");
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
}
