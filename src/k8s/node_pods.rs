//! What the agent's leak check asks of the API server: this node's Pods (one
//! list with the field selector `spec.nodeName=<node>`; a Pod's UID, namespace
//! and name are all the check uses, and host-network Pods, which have no podnet
//! address, are left out) and the Kubernetes Events it reports leaks with, on the
//! Node object (events.k8s.io/v1, reporting controller `podnet-agent`). The agent
//! also posts Events on a Pod of the node: why the addresses its annotation asks
//! for were refused (`daemon::address_events`).

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::events::Recorder;
use tokio::sync::OnceCell;

use super::connect::{ConnectError, connect};
use super::events::{self, recorder};
use crate::ipam::leaks::{NodePod, PodName};

/// The reporting controller of the agent's Events.
pub const REPORTING_CONTROLLER: &str = "podnet-agent";

/// Why this node's Pods, or an Event, did not reach or come from the API server.
#[derive(Debug, thiserror::Error)]
pub enum NodePodsError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("listing the Pods of node {node} (fieldSelector spec.nodeName={node}): {source}")]
    List {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("posting the Event {reason} on {object}: {source}")]
    Event {
        /// `Node n1`, `Pod ns/name`.
        object: String,
        reason: String,
        #[source]
        source: kube::Error,
    },
}

/// One Event the agent posts: on this node's Node object, or on a Pod of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    pub warning: bool,
    /// PascalCase, e.g. `IPAMLeak`.
    pub reason: &'static str,
    /// What was done, e.g. `Found`, `Released`.
    pub action: &'static str,
    /// What it is about (an address, a refusal's reason): the posted action is
    /// `<action> <about>`, so Events of one reason on one object about
    /// different things are not folded into one series (`k8s::events`).
    pub about: String,
    pub note: String,
}

/// The API server, for this node's Pods and Events; connects on first use (the
/// daemon serves before the API server answers, and a failed connect is tried
/// again on the next call).
pub struct NodePodsApi {
    kubeconfig: Option<PathBuf>,
    node_name: String,
    client: OnceCell<kube::Client>,
    recorder: OnceCell<Recorder>,
}

impl NodePodsApi {
    pub fn new(kubeconfig: Option<PathBuf>, node_name: String) -> NodePodsApi {
        NodePodsApi {
            kubeconfig,
            node_name,
            client: OnceCell::new(),
            recorder: OnceCell::new(),
        }
    }

    async fn client(&self) -> Result<&kube::Client, NodePodsError> {
        Ok(self
            .client
            .get_or_try_init(|| connect(self.kubeconfig.as_ref()))
            .await?)
    }

    /// The Pods the API server lists on this node, without host-network ones.
    pub async fn list(&self) -> Result<Vec<NodePod>, NodePodsError> {
        let pods: Api<Pod> = Api::all(self.client().await?.clone());
        let params = ListParams::default().fields(&format!("spec.nodeName={}", self.node_name));
        let list = pods
            .list(&params)
            .await
            .map_err(|source| NodePodsError::List {
                node: self.node_name.clone(),
                source,
            })?;
        Ok(list.items.iter().filter_map(node_pod).collect())
    }

    /// Posts `event` on this node's Node object.
    pub async fn post(&self, event: &NodeEvent) -> Result<(), NodePodsError> {
        let node = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.node_name.clone()),
            ..ObjectReference::default()
        };
        self.publish(event, &node, format!("Node {}", self.node_name))
            .await
    }

    /// Posts `event` on the Pod `pod` (its UID, when known, so `kubectl describe
    /// pod` lists it).
    pub async fn post_on_pod(
        &self,
        pod: &PodName,
        uid: Option<&str>,
        event: &NodeEvent,
    ) -> Result<(), NodePodsError> {
        let target = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(pod.namespace.clone()),
            name: Some(pod.name.clone()),
            uid: uid.map(str::to_string),
            ..ObjectReference::default()
        };
        self.publish(
            event,
            &target,
            format!("Pod {}/{}", pod.namespace, pod.name),
        )
        .await
    }

    async fn publish(
        &self,
        event: &NodeEvent,
        target: &ObjectReference,
        object: String,
    ) -> Result<(), NodePodsError> {
        let client = self.client().await?.clone();
        let recorder = self
            .recorder
            .get_or_init(|| async { recorder(client, REPORTING_CONTROLLER, &self.node_name) })
            .await;
        let ev = events::event(
            event.warning,
            event.reason,
            &event.note,
            event.action,
            &event.about,
        );
        recorder
            .publish(&ev, target)
            .await
            .map_err(|source| NodePodsError::Event {
                object,
                reason: event.reason.into(),
                source,
            })
    }
}

/// A listed Pod as the leak check sees it; None for a host-network Pod (it has
/// no podnet address) or one without its UID, namespace or name.
fn node_pod(pod: &Pod) -> Option<NodePod> {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    if host_network {
        return None;
    }
    let meta = &pod.metadata;
    Some(NodePod {
        pod: PodName {
            namespace: meta.namespace.clone()?,
            name: meta.name.clone()?,
        },
        uid: meta.uid.clone()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use kube::api::ObjectMeta;

    fn pod(uid: Option<&str>, host_network: Option<bool>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some("default".into()),
                name: Some("web-0".into()),
                uid: uid.map(str::to_string),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                host_network,
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn a_listed_pod_is_its_uid_and_names_and_host_network_pods_are_left_out() {
        let expected = NodePod {
            pod: PodName {
                namespace: "default".into(),
                name: "web-0".into(),
            },
            uid: "u-1".into(),
        };
        assert_eq!(node_pod(&pod(Some("u-1"), None)), Some(expected.clone()));
        assert_eq!(node_pod(&pod(Some("u-1"), Some(false))), Some(expected));
        assert_eq!(node_pod(&pod(Some("u-1"), Some(true))), None);
        assert_eq!(node_pod(&pod(None, None)), None);
    }
}
