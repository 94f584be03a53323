//! What the node is, for the daemon's configuration check: its Node's
//! InternalIPs (read at start, then followed with a watch of the Node) and the
//! cluster's Service range (the ServiceCIDRs). The same watch carries the Node's
//! label changes to the CiliumNode's copy of them.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node as KubeNode;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};

use super::bodies::AgentFields;
use crate::node::{NodeEvent, NodeFacts, ServiceRange};

/// The addresses of `listed` (a Node's InternalIPs as it lists them; one that is
/// not an address, which the API server does not let a Node have, is left out).
pub(super) fn internal_ips(listed: &[String]) -> Vec<IpAddr> {
    listed.iter().filter_map(|a| a.parse().ok()).collect()
}

/// The InternalIPs of a Node object.
fn node_internal_ips(node: &KubeNode) -> Vec<IpAddr> {
    let listed: Vec<String> = node
        .status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
        .collect();
    internal_ips(&listed)
}

/// The cluster's Service range: the CIDRs of every ServiceCIDR
/// (networking.k8s.io/v1, Kubernetes 1.33 and later) not being deleted. The
/// `kubernetes` Service cannot tell it: it has one ClusterIP, of the primary
/// family, on a dual-stack cluster too.
pub(super) async fn service_range(client: &kube::Client) -> ServiceRange {
    let api: Api<ServiceCIDR> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => ServiceRange::Known(
            list.items
                .iter()
                .filter(|s| s.metadata.deletion_timestamp.is_none())
                .flat_map(|s| s.spec.iter().flat_map(|spec| spec.cidrs.iter().flatten()))
                .filter_map(|c| c.parse::<IpNet>().ok())
                .collect(),
        ),
        Err(kube::Error::Api(e)) if e.code == 404 => ServiceRange::Unknown(
            "the API server serves no networking.k8s.io/v1 ServiceCIDR (Kubernetes before 1.33)"
                .into(),
        ),
        Err(kube::Error::Api(e)) if e.code == 403 => ServiceRange::Unknown(
            "the agent may not list servicecidrs (networking.k8s.io): grant it list (deploy/agent-rbac.yaml)"
                .into(),
        ),
        Err(e) => ServiceRange::Unknown(format!("listing the ServiceCIDRs failed: {e}")),
    }
}

/// Takes the Node's `labels` into the agent's fields, marked for the sink's next
/// apply when they differ from the copy the CiliumNode has.
fn note_labels(fields: &Mutex<AgentFields>, labels: BTreeMap<String, String>) {
    let mut f = fields.lock().unwrap_or_else(|p| p.into_inner());
    if f.labels != labels {
        tracing::info!("the Node's labels changed; the CiliumNode's copy follows");
        f.labels = labels;
        f.reapply = true;
    }
}

/// Follows this node's Node and tells the daemon when its InternalIPs differ
/// from `facts` (what the start read; None: it read nothing, and the Service
/// range is read with the first Node seen); marks the agent's `fields` for an
/// apply when the Node's labels differ from their copy.
pub(super) async fn watch_node_facts(
    client: kube::Client,
    name: String,
    mut facts: Option<NodeFacts>,
    fields: Arc<Mutex<AgentFields>>,
    events: tokio::sync::mpsc::Sender<NodeEvent>,
) {
    let api: Api<KubeNode> = Api::all(client.clone());
    let selector = format!("metadata.name={name}");
    let mut stream = watcher(api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(item) = stream.next().await {
        let node = match item {
            Ok(node) => node,
            Err(e) => {
                tracing::warn!(error = %e, "Node watch interrupted; it resumes");
                continue;
            }
        };
        note_labels(&fields, node.metadata.labels.clone().unwrap_or_default());
        let internal_ips = node_internal_ips(&node);
        let now = match facts.take() {
            Some(f) if f.internal_ips == internal_ips => {
                facts = Some(f);
                continue;
            }
            Some(f) => NodeFacts { internal_ips, ..f },
            None => NodeFacts {
                internal_ips,
                service_range: service_range(&client).await,
            },
        };
        facts = Some(now.clone());
        if events.send(NodeEvent::Facts(now)).await.is_err() {
            return;
        }
    }
}
