//! Node IPAM's loop in the leader: watches Nodes, Services and EndpointSlices
//! ([`Mirror`]s) and, after each change once all three are listed, gives every
//! Service it serves the addresses [`addresses::ingress`] picks, by server-side
//! apply of the status under the field manager `podnet-operator-node-ipam`. A
//! Service it no longer serves (type or class changed) loses exactly what it
//! wrote: which Services those are is read from the status' managed fields, so
//! it survives a restart. A bad `io.cilium.nodeipam/match-node-labels` is
//! reported in the condition `podnet.io/NodeIPAMRequestValid`. The loop is
//! the controller kit's ([`crate::controller::run`]): no debounce, no resync, a
//! failed pass planned again after the kit's backoff.

use std::collections::{BTreeMap, BTreeSet};

use futures::{Stream, StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use super::addresses::{self, MATCH_NODE_LABELS_ANNOTATION, NodeIpamNode, NodeIpamService};
use crate::controller::{self, Controller, Timing, WatchItem, ending};
use crate::k8s::mirror::{Mirror, WatchEnded, key_of};
use crate::k8s::objects::condition_json;
use crate::operator::lbipam::controller::{
    apply_service_status, condition, ingress_ips, ip_families,
};
use crate::operator::lbipam::services::{DefaultIpam, NODE_IPAM_CLASS};

pub const FIELD_MANAGER: &str = "podnet-operator-node-ipam";
pub const VALID_CONDITION: &str = "podnet.io/NodeIPAMRequestValid";
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

fn ipam_node(node: &Node) -> NodeIpamNode {
    NodeIpamNode {
        name: node.metadata.name.clone().unwrap_or_default(),
        labels: node.metadata.labels.clone().unwrap_or_default(),
        taints: node
            .spec
            .iter()
            .flat_map(|s| s.taints.iter().flatten())
            .map(|t| t.key.clone())
            .collect(),
        addresses: node
            .status
            .iter()
            .flat_map(|s| s.addresses.iter().flatten())
            .filter_map(|a| Some((a.type_.clone(), a.address.parse().ok()?)))
            .collect(),
    }
}

/// Whether Node IPAM serves `svc`.
fn serves(svc: &Service, default_ipam: DefaultIpam) -> bool {
    let Some(spec) = &svc.spec else { return false };
    spec.type_.as_deref() == Some("LoadBalancer")
        && match spec.load_balancer_class.as_deref() {
            Some(class) => class == NODE_IPAM_CLASS,
            None => default_ipam == DefaultIpam::Nodeipam,
        }
}

/// Whether this controller wrote `svc`'s status (its managed fields say so).
fn wrote(svc: &Service) -> bool {
    svc.metadata.managed_fields.iter().flatten().any(|m| {
        m.manager.as_deref() == Some(FIELD_MANAGER) && m.subresource.as_deref() == Some("status")
    })
}

fn request(svc: &Service) -> NodeIpamService {
    let spec = svc.spec.clone().unwrap_or_default();
    NodeIpamService {
        families: ip_families(&spec),
        local: spec.external_traffic_policy.as_deref() == Some("Local"),
        match_node_labels: svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MATCH_NODE_LABELS_ANNOTATION).cloned()),
    }
}

/// `namespace/service` -> the nodes of its ready endpoints (a missing `ready` is
/// ready, as in Kubernetes).
fn endpoint_nodes(slices: &Mirror<EndpointSlice>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in slices.objects() {
        let Some(service) = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
        else {
            continue;
        };
        let key = format!(
            "{}/{service}",
            s.metadata.namespace.clone().unwrap_or_default()
        );
        let nodes = out.entry(key).or_default();
        for e in s.endpoints.iter().flatten() {
            let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            if let (true, Some(node)) = (ready, &e.node_name) {
                nodes.insert(node.clone());
            }
        }
    }
    out
}

/// One item of one of the loop's watches (None: that watch ended).
enum Watched {
    Node(Box<WatchItem<Node>>),
    Service(Box<WatchItem<Service>>),
    Slice(Box<WatchItem<EndpointSlice>>),
}

/// One Service's status to apply.
struct StatusWrite {
    service: Service,
    status: Value,
}

struct NodeIpam {
    client: kube::Client,
    default_ipam: DefaultIpam,
    nodes: Mirror<Node>,
    services: Mirror<Service>,
    slices: Mirror<EndpointSlice>,
}

/// The watches of Nodes, Services and EndpointSlices, merged.
fn watches(client: kube::Client) -> impl Stream<Item = Watched> + Unpin {
    let config = watcher::Config::default;
    let nodes = watcher(Api::<Node>::all(client.clone()), config()).default_backoff();
    let services = watcher(Api::<Service>::all(client.clone()), config()).default_backoff();
    let slices = watcher(Api::<EndpointSlice>::all(client), config()).default_backoff();
    stream::select(
        ending(nodes).map(|e| Watched::Node(Box::new(e))),
        stream::select(
            ending(services).map(|e| Watched::Service(Box::new(e))),
            ending(slices).map(|e| Watched::Slice(Box::new(e))),
        ),
    )
    .boxed()
}

/// Runs until a watch ends; returns why.
pub async fn run(client: kube::Client, default_ipam: DefaultIpam) -> WatchEnded {
    let mut c = NodeIpam {
        client: client.clone(),
        default_ipam,
        nodes: Mirror::default(),
        services: Mirror::default(),
        slices: Mirror::default(),
    };
    let events = watches(client);
    tracing::info!("Node IPAM started");
    controller::run(&mut c, events, Timing::AT_ONCE).await
}

impl Controller for NodeIpam {
    type Input = Watched;
    type Plan = Vec<StatusWrite>;
    type Error = kube::Error;
    const WHAT: &'static str = "a Node IPAM write";

    fn feed(&mut self, input: Watched) -> Result<bool, WatchEnded> {
        match input {
            Watched::Node(e) => self.nodes.feed(*e, "Node"),
            Watched::Service(e) => self.services.feed(*e, "Service"),
            Watched::Slice(e) => self.slices.feed(*e, "EndpointSlice"),
        }
    }

    fn ready(&self) -> bool {
        self.nodes.listed() && self.services.listed() && self.slices.listed()
    }

    async fn plan(&mut self) -> Option<Vec<StatusWrite>> {
        Some(self.statuses())
    }

    async fn apply(&mut self, plan: Vec<StatusWrite>) -> Result<(), kube::Error> {
        let mut first_error = None;
        for w in plan {
            if let Err(e) = self.write(&w.service, w.status).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl NodeIpam {
    /// The status each Service whose status differs from what it should be
    /// must be given.
    fn statuses(&self) -> Vec<StatusWrite> {
        let nodes: Vec<NodeIpamNode> = self.nodes.objects().map(ipam_node).collect();
        let endpoints = endpoint_nodes(&self.slices);
        let none = BTreeSet::new();
        let mut writes = Vec::new();
        for svc in self.services.objects() {
            let status = if serves(svc, self.default_ipam) {
                let key = key_of(svc);
                // An invalid annotation is reported in the Service's condition.
                let wanted =
                    addresses::ingress(&request(svc), &nodes, endpoints.get(&key).unwrap_or(&none))
                        .map_err(|e| e.to_string());
                let mut have = ingress_ips(svc);
                have.sort();
                let invalid = condition(svc, VALID_CONDITION);
                match wanted {
                    Ok(ips)
                        if ips == have && invalid.is_none() && (wrote(svc) || ips.is_empty()) =>
                    {
                        continue;
                    }
                    Ok(ips) if ips.is_empty() => json!({}),
                    Ok(ips) => {
                        let ingress: Vec<Value> =
                            ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect();
                        json!({"loadBalancer": {"ingress": ingress}})
                    }
                    Err(problem) if invalid.is_some_and(|c| c.message == problem) => continue,
                    Err(problem) => {
                        tracing::warn!(service = %key, "{problem}");
                        let old = invalid.and_then(|c| serde_json::to_value(c).ok());
                        json!({"conditions": [condition_json(VALID_CONDITION, "False", "invalid_annotation", &problem, old.as_ref())]})
                    }
                }
            } else if wrote(svc) {
                json!({})
            } else {
                continue;
            };
            writes.push(StatusWrite {
                service: svc.clone(),
                status,
            });
        }
        writes
    }

    async fn write(&self, svc: &Service, status: Value) -> Result<(), kube::Error> {
        tracing::info!(service = %key_of(svc), status = %status, "Node IPAM: Service status");
        apply_service_status(self.client.clone(), FIELD_MANAGER, svc, status).await
    }
}
