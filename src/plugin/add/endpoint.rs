//! How the daemon learns that the pod is wired: the marker in the host link's
//! alias (tied to the journal commit that handed out the addresses; `wired` once
//! the ADD is done, when the daemon journaled the endpoint as pending), or the
//! endpoint registered (delegated-plugin mode, or a daemon that journals no
//! pending endpoint).

use crate::api::models::{
    AddressPair, DatapathConfiguration, EndpointChangeRequest, IpamAddressResponse,
};
use crate::cni::CniError;
use crate::datapath::link_marker::{JournalMark, LinkMarker};

use super::super::daemon_errors::to_cni;
use super::super::report::Timings;
use super::attempt::Attempt;

impl Attempt<'_> {
    /// The marker that ties the host link to the journal commit that handed out
    /// its addresses, so a restart can tell a stale link from one the journal
    /// lost, and (`wired`) says the ADD finished wiring the pod; none when the
    /// daemon sent no journal mark.
    pub(super) fn link_marker(&self, wired: bool) -> Option<LinkMarker> {
        let journal = JournalMark::parse(&self.alloc.journal_mark)?;
        Some(LinkMarker {
            journal,
            wired,
            container_id: Some(self.container_id.to_string()),
            ifname: Some(self.sides.ifname.to_string()),
            owner: Some(self.env.args.owner(self.container_id)),
            pod_uid: self.env.args.pod_uid.clone(),
        })
    }

    /// The expiration UUIDs of the addresses the daemon handed out (none in
    /// delegated-plugin mode).
    pub(super) fn expiration_uuids(&self) -> Vec<String> {
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
    pub(super) fn register_endpoint(
        &self,
        host_index: u32,
        t: &mut Timings,
    ) -> Result<(), CniError> {
        let (alloc, args, sides) = (self.alloc, &self.env.args, self.sides);
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
                container_interface_name: sides.ifname.to_string(),
                k8s_pod_name: args.pod_name.clone().unwrap_or_default(),
                k8s_namespace: args.pod_namespace.clone().unwrap_or_default(),
                k8s_uid: args.pod_uid.clone().unwrap_or_default(),
                state: "waiting-for-identity".into(),
                addressing,
                interface_name: sides.host_name.clone(),
                interface_index: host_index,
                container_netns_path: sides.netns_path.display().to_string(),
                sync_build_endpoint: true,
                datapath_configuration: DatapathConfiguration {
                    external_ipam: self.delegated,
                },
                podnet_phases: t.so_far(),
            })
            .map(|_| t.delivered())
            .map_err(|e| to_cni(e, "unable to create endpoint"))
    }
}
