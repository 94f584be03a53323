//! The cross-node datapath's settings: `--routing-mode`, `--tunnel-protocol` and
//! the [`CrossNodeConfig`] the options resolve to. A leaf: the daemon's config
//! parses the options into these (and says what is wrong with them), the rest of
//! the cross-node datapath reads them.

use ipnet::IpNet;

use crate::ipam::Family;

/// `--routing-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutingMode {
    Native,
    Tunnel,
}

impl RoutingMode {
    /// The option's value, as the CiliumNode annotation
    /// `resources::cilium_node::ROUTING_MODE_ANNOTATION` also says it.
    pub fn as_str(self) -> &'static str {
        match self {
            RoutingMode::Native => "native",
            RoutingMode::Tunnel => "tunnel",
        }
    }

    /// The mode a value names (None: neither).
    pub fn parse(value: &str) -> Option<RoutingMode> {
        match value {
            "native" => Some(RoutingMode::Native),
            "tunnel" => Some(RoutingMode::Tunnel),
            _ => None,
        }
    }
}

/// `--tunnel-protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelProtocol {
    Vxlan,
    Geneve,
}

/// The cross-node datapath's settings, resolved from the options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrossNodeConfig {
    pub routing: RoutingMode,
    pub tunnel_protocol: TunnelProtocol,
    /// `--tunnel-port` (VXLAN's UDP port).
    pub tunnel_port: u16,
    /// `--underlay-protocol`: the family of the tunnel's outer packets.
    pub underlay: Family,
    /// `--auto-direct-node-routes` (native mode).
    pub auto_direct_node_routes: bool,
    /// `--ipv4-native-routing-cidr`, `--ipv6-native-routing-cidr`: destinations
    /// reached without masquerade.
    pub native_routing_cidrs: Vec<IpNet>,
    pub masquerade_v4: bool,
    pub masquerade_v6: bool,
}

impl CrossNodeConfig {
    /// Whether anything is to be done at all.
    pub fn is_active(&self) -> bool {
        self.routing == RoutingMode::Tunnel
            || self.auto_direct_node_routes
            || self.masquerade_v4
            || self.masquerade_v6
    }

    /// The underlay's family in tunnel routing; None in native routing.
    pub fn tunnel_underlay(&self) -> Option<Family> {
        (self.routing == RoutingMode::Tunnel).then_some(self.underlay)
    }
}
