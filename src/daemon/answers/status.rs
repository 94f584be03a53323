//! `GET /v1/healthz`, `GET /v1/config` and `GET /v1/endpoint/{id}` as Cilium's
//! clients read them: the state's [`NodeStatus`] as a `StatusResponse` (the
//! per-address maps keyed by the address, or `pool/ip` outside the default
//! pool), its [`NodeConfig`] as a `DaemonConfiguration` and a
//! [`RegisteredEndpoint`] as an `EndpointView`.

use std::collections::BTreeMap;

use super::cidrs::pod_cidr_lines;
use super::config_check::config_check_status;
use super::restore::restore_status;
use crate::api::models::{
    AddressPair, BandwidthManager, DaemonConfiguration, DaemonConfigurationStatus, EndpointView,
    IpamStatus, NodeAddressing, NodeAddressingElement, RangeStatus, StatusElement, StatusResponse,
};
use crate::daemon::state::{
    AddressBook, FamilyAddressing, Health, HealthLevel, Hold, NodeConfig, NodeStatus,
    RegisteredEndpoint,
};
use crate::ipam::Family;

/// The status answer of `status` (the backend, cross-node, leak-check, policy
/// and queue parts are the caller's to add).
pub fn status_response(status: NodeStatus) -> StatusResponse {
    let mut ipam = IpamStatus {
        mode: status.ipam_mode.to_string(),
        node_name: status.node_name,
        restore: restore_status(&status.restore),
        datapath: status.datapath_mode.to_string(),
        journal: status.journal.display().to_string(),
        journal_error: status.journal_error.unwrap_or_default(),
        default_pool: if status.multi_pool {
            status.default_pool.clone()
        } else {
            String::new()
        },
        status: status.summary,
        ranges: status.ranges.iter().map(RangeStatus::from).collect(),
        pod_cidrs: pod_cidr_lines(&status.pod_cidrs),
        config_check: status
            .config_check
            .as_ref()
            .map(|(verdict, facts)| config_check_status(verdict, facts)),
        ..Default::default()
    };
    if let Some(book) = &status.addresses {
        add_addresses(&mut ipam, book, &status.default_pool);
    }
    StatusResponse {
        cilium: status_element(status.health),
        ipam,
        bandwidth_manager: status.bandwidth_manager.then_some(BandwidthManager {
            enabled: true,
            pods_shaped: None,
        }),
    }
}

/// Cilium's status of `health`.
fn status_element(health: Health) -> StatusElement {
    let state = match health.level {
        HealthLevel::Ok => "Ok",
        HealthLevel::Warning => "Warning",
        HealthLevel::Failure => "Failure",
    };
    StatusElement {
        state: state.into(),
        msg: health.message,
    }
}

/// Each family's address list, and who holds each address: cooling ones
/// (with the time left) under `cooling`, the others under `allocations`,
/// marked `[restored]` and `[expiring]` where they are.
fn add_addresses(ipam: &mut IpamStatus, book: &AddressBook, default_pool: &str) {
    for (family, ips) in &book.by_family {
        let list = Some(ips.iter().map(|ip| ip.to_string()).collect());
        match family {
            Family::V4 => ipam.ipv4 = list,
            Family::V6 => ipam.ipv6 = list,
        }
    }
    for holder in &book.holders {
        let key = if holder.pool == default_pool {
            holder.ip.to_string()
        } else {
            format!("{}/{}", holder.pool, holder.ip)
        };
        let owner = &holder.owner;
        let (map, value): (&mut BTreeMap<String, String>, String) = match holder.hold {
            Hold::Cooling { left_ms } => {
                (&mut ipam.cooling, format!("{owner} ({left_ms} ms left)"))
            }
            Hold::UntilTeardown => (
                &mut ipam.cooling,
                format!("{owner} (held until its links are gone)"),
            ),
            Hold::InUse { restored, expiring } => {
                let mut value = owner.clone();
                if restored {
                    value.push_str(" [restored]");
                }
                if expiring {
                    value.push_str(" [expiring]");
                }
                (&mut ipam.allocations, value)
            }
        };
        map.insert(key, value);
    }
}

/// The endpoint answer of `endpoint`.
pub fn endpoint_view(endpoint: RegisteredEndpoint) -> EndpointView {
    let ep = endpoint.record;
    let mut addressing = AddressPair::default();
    if let Some(ip) = ep.ipv4 {
        addressing.ipv4 = ip.to_string();
        addressing.ipv4_pool_name = ep.pool.clone();
    }
    if let Some(ip) = ep.ipv6 {
        addressing.ipv6 = ip.to_string();
        addressing.ipv6_pool_name = ep.pool;
    }
    EndpointView {
        container_id: ep.container_id,
        container_interface_name: ep.ifname,
        interface_name: ep.host_ifname,
        owner: ep.owner,
        addressing,
        restored: endpoint.restored,
    }
}

/// `GET /v1/config`: the configuration of `config`.
pub fn daemon_configuration(config: NodeConfig) -> DaemonConfiguration {
    DaemonConfiguration {
        status: configuration_status(config),
    }
}

/// The configuration's status part (also the `podnet-config` of an allocation
/// answer and header).
pub fn configuration_status(config: NodeConfig) -> DaemonConfigurationStatus {
    DaemonConfigurationStatus {
        addressing: node_addressing(&config.addressing),
        ipam_mode: config.ipam_mode.to_string(),
        device_mtu: config.mtu,
        route_mtu: config.mtu,
        datapath_mode: config.datapath_mode.to_string(),
        configured_datapath_mode: config.configured_datapath_mode.to_string(),
        node_name: config.node_name,
        bandwidth_manager: BandwidthManager {
            pods_shaped: None,
            enabled: config.bandwidth_manager,
        },
    }
}

/// Cilium's node addressing: each enabled family's router and alloc range.
pub fn node_addressing(families: &[FamilyAddressing]) -> NodeAddressing {
    let mut addressing = NodeAddressing::default();
    for family in families {
        let element = NodeAddressingElement {
            enabled: true,
            ip: family.router.map(|ip| ip.to_string()).unwrap_or_default(),
            alloc_range: family.alloc_range.clone().unwrap_or_default(),
        };
        match family.family {
            Family::V4 => addressing.ipv4 = Some(element),
            Family::V6 => addressing.ipv6 = Some(element),
        }
    }
    addressing
}
