//! The policy loop's ClusterNetworkPolicies (`--enable-cluster-network-policy`):
//! which version the API server serves ([`ClusterKind`], by API discovery, the
//! newest podnet understands: v1beta1, else v1alpha2), the watch of that
//! version once served ([`inputs`]: a CRD installed after the agent started is
//! waited for, as the pool CRDs are, and the loop enforces NetworkPolicy
//! meanwhile), the status line, and an Event on the object for each problem
//! that depends on the pods ([`Problems`]; the operator posts the others). A CRD removed after it was served leaves the last
//! ClusterNetworkPolicies enforced (the watch retries) until it is back.

use std::collections::BTreeSet;

use futures::StreamExt;
use futures::stream::{self, BoxStream};
use kube::api::DynamicObject;

use super::{Input, Watched};
use crate::controller::ending;
use crate::k8s::discovery::{self, CiliumKind};
use crate::k8s::events::ProblemEvents;
use crate::k8s::mirror::{Keyed, projected};
use crate::policy::view::cluster_policy;
use crate::policy::{ClusterPolicyView, Problem, Why};

const KIND: CiliumKind = CiliumKind::ClusterNetworkPolicy;

/// What the loop knows of the ClusterNetworkPolicy kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ClusterKind {
    /// `--enable-cluster-network-policy` is off.
    #[default]
    Off,
    /// Not asked yet: nothing is written until the answer.
    Unresolved,
    /// No version podnet understands is served (the CRD is not installed):
    /// NetworkPolicy is enforced alone meanwhile.
    NotInstalled,
    /// Served at this version, and watched.
    Served(String),
}

/// A ClusterNetworkPolicy is cluster-scoped: its name.
impl Keyed for ClusterPolicyView {
    fn key(&self) -> String {
        self.name.clone()
    }
}

/// The view of a ClusterNetworkPolicy read as a dynamic object.
fn view_of(object: DynamicObject) -> ClusterPolicyView {
    let name = object.metadata.name.unwrap_or_default();
    cluster_policy(&name, &object.data["spec"])
}

/// The kind's inputs: what discovery finds (at once, and again until served),
/// then the watch of the version served.
pub fn inputs(client: kube::Client) -> BoxStream<'static, Input> {
    let first = stream::once(async move {
        let resolved = match discovery::resolve(&client, KIND).await {
            Ok(resource) => Some(resource),
            Err(e) => {
                tracing::warn!(
                    "ClusterNetworkPolicy: {e}; NetworkPolicy is enforced alone until it is"
                );
                None
            }
        };
        (client, resolved)
    });
    first
        .flat_map(|(client, resolved)| {
            let not_installed = resolved.is_none().then_some(Input::ClusterKind(ClusterKind::NotInstalled));
            let watch = stream::once(async move {
                let resource = match resolved {
                    Some(resource) => resource,
                    None => discovery::resolve_waiting(&client, KIND, &|_| {}).await,
                };
                tracing::info!(version = %resource.api_version, "ClusterNetworkPolicy enforcement on");
                let served = Input::ClusterKind(ClusterKind::Served(resource.version.clone()));
                let events = projected(discovery::watch_all(&client, &resource), view_of);
                let events = ending(events).map(|e| Input::ClusterPolicy(Box::new(e)));
                stream::once(async { served }).chain(events)
            })
            .flatten();
            stream::iter(not_installed).chain(watch)
        })
        .boxed()
}

/// The status line of the kind (None: off).
pub fn status_line(watched: &Watched) -> Option<String> {
    let crd = KIND.crd();
    match &watched.cluster_kind {
        ClusterKind::Off => None,
        ClusterKind::Unresolved => Some(format!("asking the API server for {crd}")),
        ClusterKind::NotInstalled => Some(format!(
            "CRD {crd} not installed (waiting for it; NetworkPolicy enforced alone)"
        )),
        ClusterKind::Served(version) => Some(format!(
            "{} ClusterNetworkPolicies ({}/{version})",
            watched.cluster_policies.objects().count(),
            KIND.group()
        )),
    }
}

/// The Events of the problems that depend on the pods (a named port no pod
/// has): each posted once while it lasts, and once for the cluster (every
/// agent sees it; the first to post it posts it for all, [`ProblemEvents`]). The problems of the object itself
/// are the operator's to post, once for the cluster, with the policy's status
/// (`operator::cluster_policy_status`).
pub struct Problems {
    events: ProblemEvents,
    posted: BTreeSet<Problem>,
}

impl Problems {
    /// Posting as `podnet-agent` of `node`.
    pub fn new(client: kube::Client, node: &str) -> Problems {
        Problems {
            events: ProblemEvents::new(client, "podnet-agent", node),
            posted: BTreeSet::new(),
        }
    }

    /// Posts a Warning on its object for each of `problems` of the pods not posted before
    /// (the kind read at `version`; the writer logs them). Best effort: a failed
    /// post is logged at debug and not retried.
    pub async fn post(&mut self, version: &str, problems: &[Problem]) {
        self.posted.retain(|p| problems.contains(p));
        let of_pods = problems
            .iter()
            .filter(|p| matches!(p.why, Why::UnknownNamedPort(_)));
        for problem in of_pods {
            if !self.posted.insert(problem.clone()) {
                continue;
            }
            let api_version = format!("{}/{version}", KIND.group());
            let why = problem.why.to_string();
            let kind = (api_version.as_str(), KIND.kind());
            let (name, field) = (&problem.name, &problem.field);
            self.events.post(kind, name, field, &why).await;
        }
    }
}
