//! The sink: writes the agent's fields of its CiliumNode (server-side apply
//! under [`FIELD_MANAGER`]), and through the status subresource the used
//! addresses, the [`FIT_CONDITION`] and the verdict on the pod CIDRs, each only
//! when the CiliumNode does not hold it already. Giving blocks back is in
//! `release`, the exhaustion taint on the Node in `taint`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use ipnet::IpNet;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};

use super::bodies::{AgentFields, fit_body, fit_condition, pod_cidrs_body, used_body};
use super::resource::NodesResource;
use super::seen::SharedSeen;
use super::{
    CHECK_FIELD_MANAGER, FIELD_MANAGER, FIT_CONDITION, KubernetesConfig, KubernetesMode,
    POD_CIDRS_FIELD_MANAGER,
};
use crate::k8s::connect::connect;
use crate::k8s::discovery::{CiliumKind, resolve};
use crate::k8s::objects::ApplyBody;
use crate::node::{
    AddressRoom, ConfigFit, FlushFuture, NodeError, NodeOutbox, NodeSink, UsedAddresses,
};
use crate::resources::PodCidrStatus;

/// Writes the agent's fields of the CiliumNode.
pub struct KubernetesSink {
    pub(super) config: KubernetesConfig,
    pub(super) fields: Arc<Mutex<AgentFields>>,
    pub(super) seen: SharedSeen,
    pub(super) nodes: NodesResource,
    /// Connected on the first flush, then reused.
    pub(super) client: Option<kube::Client>,
    /// An apply failed (the API server was down): send the fields again.
    pub(super) pending: bool,
    /// External modes: used addresses not written yet.
    pub(super) pending_used: Option<UsedAddresses>,
    /// The configuration check's verdict, not written yet.
    pub(super) pending_fit: Option<ConfigFit>,
    /// Multi-pool: blocks given back, not removed from the CiliumNode yet.
    pub(super) pending_released: BTreeSet<(String, IpNet)>,
    /// cluster-pool: the verdict on the node's CIDRs, not written yet.
    pub(super) pending_pod_cidrs: Option<BTreeMap<String, PodCidrStatus>>,
    /// Whether new pods can get an address, not yet said on the Node (`taint`).
    pub(super) pending_room: Option<AddressRoom>,
}

impl NodeSink for KubernetesSink {
    fn flush<'a>(&'a mut self, outbox: &'a NodeOutbox) -> FlushFuture<'a> {
        Box::pin(self.flush_async(outbox))
    }
}

impl KubernetesSink {
    /// Writes what the outbox holds, and what an earlier flush could not.
    async fn flush_async(&mut self, outbox: &NodeOutbox) -> Result<(), NodeError> {
        self.pending_released
            .extend(outbox.released_blocks.iter().cloned());
        if let Some(fit) = outbox.config_fit.clone() {
            self.pending_fit = Some(fit);
        }
        if let Some(room) = outbox.address_room.clone() {
            self.pending_room = Some(room);
        }
        if let (KubernetesMode::External { .. }, Some(used)) = (self.config.mode, &outbox.used) {
            self.pending_used = Some(used.clone());
        }
        if let Some(used) = self.pending_used.clone() {
            let held = self
                .seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .used
                .as_ref()
                == Some(&used);
            if !held {
                self.apply_used(&used).await?;
            }
            self.pending_used = None;
        }

        // The lower demand first, then the blocks it frees: the operator never
        // sees a block gone while the old demand still asks for it (it would
        // carve it right back).
        self.apply_fields(outbox).await?;
        if !self.pending_released.is_empty() {
            self.remove_released().await?;
        }
        if let Some(pod_cidrs) = outbox.pod_cidrs.clone() {
            self.pending_pod_cidrs = Some(pod_cidrs);
        }
        if let Some(pod_cidrs) = self.pending_pod_cidrs.clone() {
            self.apply_pod_cidrs(&pod_cidrs).await?;
            self.pending_pod_cidrs = None;
        }
        // Last: a condition that cannot be written (a CRD without the field is
        // no error: the API server prunes it) holds up none of the above.
        if let Some(fit) = self.pending_fit.clone() {
            self.apply_fit(&fit).await?;
            self.pending_fit = None;
        }
        // The Node, after every CiliumNode write: a Node it may not patch (an
        // agent-rbac.yaml from before the taint) holds up none of them.
        if let Some(room) = self.pending_room.clone() {
            self.apply_room(&room).await?;
            self.pending_room = None;
        }
        Ok(())
    }
}

impl KubernetesSink {
    /// The API client, connected on first use.
    pub(super) async fn client(&mut self) -> Result<kube::Client, NodeError> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let client = connect(self.config.kubeconfig.as_ref()).await?;
        self.client = Some(client.clone());
        Ok(client)
    }

    /// The CiliumNodes' API, at the resource the source resolved (or, when the
    /// start served from the journal, that this call resolves).
    pub(super) async fn nodes_api(
        &mut self,
    ) -> Result<(Api<DynamicObject>, ApiResource), NodeError> {
        let client = self.client().await?;
        let resource = self
            .nodes
            .or_resolve(|| resolve(&client, CiliumKind::Node))
            .await?;
        Ok((Api::all_with(client, &resource), resource))
    }

    /// Applies the agent's fields when one changed (or the last apply failed).
    async fn apply_fields(&mut self, outbox: &NodeOutbox) -> Result<(), NodeError> {
        {
            let mut f = self.fields.lock().unwrap_or_else(|p| p.into_inner());
            let mut changed = self.pending || f.reapply;
            f.reapply = false;
            if let Some(addresses) = &outbox.addresses {
                f.router_addresses = addresses.clone();
                changed = true;
            }
            if let Some(health) = &outbox.health {
                f.health = health.clone();
                changed = true;
            }
            if let Some(requested) = &outbox.requested_pools {
                f.requested = Some(requested.clone());
                changed = true;
            }
            if let Some(sticky) = &outbox.sticky_requests {
                f.sticky_requests = sticky.clone();
                changed = true;
            }
            if !changed {
                return Ok(());
            }
        }
        let name = self.config.node_name.clone();
        self.pending = true;
        let (api, resource) = self.nodes_api().await?;
        let body = self
            .fields
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .apply_body(&name, &resource.api_version);
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| NodeError::Api {
            op: format!("applying CiliumNode {name:?}"),
            source,
        })?;
        self.pending = false;
        Ok(())
    }

    /// crd/eni: `status.ipam.used` and `ipv6-used`, under [`FIELD_MANAGER`].
    async fn apply_used(&mut self, used: &UsedAddresses) -> Result<(), NodeError> {
        let body = |version: &str, name: &str| used_body(version, name, used);
        self.apply_status(FIELD_MANAGER, "the status", body).await
    }

    /// The configuration check's verdict as the [`FIT_CONDITION`] in
    /// `status.conditions`, under its own field manager; nothing when the
    /// CiliumNode already says it (a restarted agent with the same verdict writes
    /// nothing). The transition time stays while the status does.
    async fn apply_fit(&mut self, fit: &ConfigFit) -> Result<(), NodeError> {
        let old = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .fit
            .clone();
        let Some(condition) = fit_condition(fit, old.as_ref()) else {
            return Ok(());
        };
        let what = format!("the {FIT_CONDITION} condition");
        let body = |version: &str, name: &str| fit_body(version, name, condition);
        self.apply_status(CHECK_FIELD_MANAGER, &what, body).await
    }

    /// cluster-pool: `status.ipam.pod-cidrs` under [`POD_CIDRS_FIELD_MANAGER`]
    /// (the whole map: a CIDR left out is dropped), unless the CiliumNode
    /// already says it.
    async fn apply_pod_cidrs(
        &mut self,
        pod_cidrs: &BTreeMap<String, PodCidrStatus>,
    ) -> Result<(), NodeError> {
        let held = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pod_cidrs
            .as_ref()
            == Some(pod_cidrs);
        if held {
            return Ok(());
        }
        let body = |version: &str, name: &str| pod_cidrs_body(version, name, pod_cidrs);
        self.apply_status(POD_CIDRS_FIELD_MANAGER, "status.ipam.pod-cidrs", body)
            .await
    }

    /// Applies the body `body` builds (from the resource's apiVersion and the
    /// node's name) through the status subresource under `manager`; an error
    /// says it was applying `what`.
    async fn apply_status(
        &mut self,
        manager: &str,
        what: &str,
        body: impl FnOnce(&str, &str) -> ApplyBody,
    ) -> Result<(), NodeError> {
        let name = self.config.node_name.clone();
        let (api, resource) = self.nodes_api().await?;
        let body = body(&resource.api_version, &name);
        api.patch_status(&name, &PatchParams::apply(manager), &Patch::Apply(&body))
            .await
            .map_err(|source| NodeError::Api {
                op: format!("applying {what} of CiliumNode {name:?}"),
                source,
            })?;
        Ok(())
    }
}
