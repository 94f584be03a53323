//! What the L2 announcement plan reads of the cluster's objects, made once as
//! each watch event arrives: a `CiliumL2AnnouncementPolicy` checked (its
//! selectors parsed, its interface patterns compiled), a Service's addresses
//! and labels, a Node's labels, and an EndpointSlice's nodes with a ready
//! endpoint. A policy with an invalid field selects nothing and carries the
//! problem naming the field: the same rule on every agent, so every agent
//! still plans alike.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use regex::Regex;

use crate::policy::selector::{Labels, Selector};
use crate::resources::CiliumL2AnnouncementPolicy;

/// The `loadBalancerClass` a Service may name to be announced (or none).
pub const L2_CLASS: &str = "io.cilium/l2-announcer";
/// The label an EndpointSlice names its Service with.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What is wrong with one field of one object: the object stays in force as
/// the problem says (a policy: it selects nothing).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, thiserror::Error)]
#[error("{object}, {field}: {why}")]
pub struct Problem {
    /// `CiliumL2AnnouncementPolicy lan`, `Service default/web`.
    pub object: String,
    /// The field's path, e.g. `spec.interfaces[1]`.
    pub field: String,
    pub why: String,
}

/// An interface pattern of a policy, compiled (matched as Cilium does: Go's
/// `regexp.MatchString`, unanchored).
#[derive(Debug, Clone)]
pub struct Pattern(Regex);

impl Pattern {
    pub fn text(&self) -> &str {
        self.0.as_str()
    }

    pub fn matches(&self, interface: &str) -> bool {
        self.0.is_match(interface)
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Pattern) -> bool {
        self.text() == other.text()
    }
}

/// A `CiliumL2AnnouncementPolicy`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyView {
    pub name: String,
    pub services: Selector,
    pub nodes: Selector,
    /// None: every interface.
    pub interfaces: Vec<Pattern>,
    pub load_balancer_ips: bool,
    pub external_ips: bool,
    /// Invalid fields (the policy then selects nothing), and a policy that
    /// announces nothing (neither kind of address).
    pub problems: Vec<Problem>,
}

impl PolicyView {
    /// A policy that does not decode: it selects nothing.
    pub fn undecodable(name: &str, why: String) -> PolicyView {
        PolicyView {
            name: name.into(),
            services: Selector::Nothing,
            nodes: Selector::Nothing,
            interfaces: Vec::new(),
            load_balancer_ips: false,
            external_ips: false,
            problems: vec![Problem {
                object: format!("CiliumL2AnnouncementPolicy {name}"),
                field: "spec".into(),
                why,
            }],
        }
    }

    pub fn from_resource(p: &CiliumL2AnnouncementPolicy) -> PolicyView {
        let name = p.metadata.name.clone();
        let object = format!("CiliumL2AnnouncementPolicy {name}");
        let mut problems = Vec::new();
        let mut problem = |field: String, why: String| {
            problems.push(Problem {
                object: object.clone(),
                field,
                why,
            })
        };
        let mut selector = |field: &str, s: Option<&_>| {
            Selector::parse_or_nothing(s, |e| {
                problem(format!("spec.{field}.{}", e.field), e.why.to_string())
            })
        };
        let services = selector("serviceSelector", p.spec.service_selector.as_ref());
        let nodes = selector("nodeSelector", p.spec.node_selector.as_ref());
        let mut interfaces = Vec::new();
        let mut interfaces_valid = true;
        for (i, text) in p.spec.interfaces.iter().enumerate() {
            match Regex::new(text) {
                Ok(re) => interfaces.push(Pattern(re)),
                Err(e) => {
                    interfaces_valid = false;
                    let why = format!("{text:?} is not a regular expression: {}", one_line(&e));
                    problem(format!("spec.interfaces[{i}]"), why);
                }
            }
        }
        let (lb, ext) = (p.spec.load_balancer_ips, p.spec.external_ips);
        if !lb && !ext {
            let why =
                "neither loadBalancerIPs nor externalIPs is true: the policy announces nothing";
            problem("spec".into(), why.into());
        }
        let invalid =
            !interfaces_valid || services == Selector::Nothing || nodes == Selector::Nothing;
        PolicyView {
            name,
            services: if invalid { Selector::Nothing } else { services },
            nodes: if invalid { Selector::Nothing } else { nodes },
            interfaces,
            load_balancer_ips: lb,
            external_ips: ext,
            problems,
        }
    }
}

/// A regex error on one line (its display draws the pattern over lines).
fn one_line(e: &regex::Error) -> String {
    match e {
        regex::Error::Syntax(s) => s.lines().last().unwrap_or_default().trim().to_string(),
        other => other.to_string(),
    }
}

/// Which of a Service's addresses an address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AddressKind {
    /// `status.loadBalancer.ingress[].ip` of a LoadBalancer Service.
    LoadBalancer,
    /// `spec.externalIPs[]`.
    External,
}

/// A Service, as announcing sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceView {
    pub namespace: String,
    pub name: String,
    /// For the Events that name the node answering (not planned from).
    pub uid: Option<String>,
    pub labels: Labels,
    /// Its LoadBalancer addresses, when it is a LoadBalancer Service of no
    /// class or of [`L2_CLASS`] (another class is someone else's to announce).
    pub load_balancer: Vec<IpAddr>,
    pub external: Vec<IpAddr>,
    /// `externalTrafficPolicy: Local`: only a node with a ready endpoint of it
    /// may announce.
    pub local_traffic: bool,
}

impl ServiceView {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn from_k8s(s: Service) -> ServiceView {
        let spec = s.spec.unwrap_or_default();
        let is_lb = spec.type_.as_deref() == Some("LoadBalancer");
        let class_ok = spec
            .load_balancer_class
            .as_deref()
            .is_none_or(|c| c == L2_CLASS);
        let ips = |v: Vec<String>| v.iter().filter_map(|a| a.parse().ok()).collect::<Vec<_>>();
        let ingress = s
            .status
            .and_then(|st| st.load_balancer)
            .and_then(|lb| lb.ingress);
        let load_balancer = match (is_lb && class_ok, ingress) {
            (true, Some(ingress)) => ips(ingress.into_iter().filter_map(|i| i.ip).collect()),
            _ => Vec::new(),
        };
        ServiceView {
            namespace: s.metadata.namespace.unwrap_or_default(),
            name: s.metadata.name.unwrap_or_default(),
            uid: s.metadata.uid,
            labels: s.metadata.labels.unwrap_or_default(),
            load_balancer,
            external: ips(spec.external_ips.unwrap_or_default()),
            local_traffic: spec.external_traffic_policy.as_deref() == Some("Local"),
        }
    }

    /// Its addresses of `kind`.
    pub fn addresses(&self, kind: AddressKind) -> &[IpAddr] {
        match kind {
            AddressKind::LoadBalancer => &self.load_balancer,
            AddressKind::External => &self.external,
        }
    }
}

/// A Node's name and labels (the policies' `nodeSelector` reads them), and
/// its InternalIPs (where its heartbeats go; not planned from).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub labels: Labels,
    pub internal_ips: Vec<IpAddr>,
}

impl NodeView {
    pub fn from_k8s(n: Node) -> NodeView {
        let addresses = n.status.and_then(|s| s.addresses).unwrap_or_default();
        NodeView {
            name: n.metadata.name.unwrap_or_default(),
            labels: n.metadata.labels.unwrap_or_default(),
            internal_ips: addresses
                .iter()
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse().ok())
                .collect(),
        }
    }
}

/// An EndpointSlice: its Service (`namespace/name`) and the nodes with a
/// ready endpoint in it (`conditions.ready` unset reads as ready, as the API
/// says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceView {
    pub namespace: String,
    pub name: String,
    pub service: Option<String>,
    pub ready_nodes: BTreeSet<String>,
}

impl SliceView {
    pub fn from_k8s(s: EndpointSlice) -> SliceView {
        let namespace = s.metadata.namespace.unwrap_or_default();
        let labels = s.metadata.labels.unwrap_or_default();
        let service = labels
            .get(SERVICE_NAME_LABEL)
            .map(|svc| format!("{namespace}/{svc}"));
        let ready = |e: &k8s_openapi::api::discovery::v1::Endpoint| {
            e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true)
        };
        let ready_nodes = s
            .endpoints
            .iter()
            .flatten()
            .filter(|e| ready(e))
            .filter_map(|e| e.node_name.clone())
            .collect();
        SliceView {
            name: s.metadata.name.unwrap_or_default(),
            namespace,
            service,
            ready_nodes,
        }
    }
}

/// The nodes with a ready endpoint of each Service (`namespace/name`), from
/// every EndpointSlice.
pub fn ready_nodes<'a>(
    slices: impl Iterator<Item = &'a SliceView>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_service: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in slices {
        if let Some(service) = &s.service {
            by_service
                .entry(service.clone())
                .or_default()
                .extend(s.ready_nodes.iter().cloned());
        }
    }
    by_service
}
