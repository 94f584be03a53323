//! The ClusterNetworkPolicies' status, in the leader (`enable-cluster-network-policy`,
//! the agents' option): each policy gets the condition [`ENFORCED_CONDITION`]
//! (True when podnet enforces every rule as written; False with each problem,
//! field and why, when a rule fails closed or the policy applies nothing), by
//! server-side apply of its status under [`FIELD_MANAGER`] (the conditions are
//! a map by type: other implementations' stay), with the generation it judged.
//! Each problem is posted once for the cluster as a Warning Event on the
//! policy (reason `PolicyProblem`), not once per node; a problem whose
//! condition the policy already shows at its generation was posted before (by
//! this leader or the one before it) and is not posted again. The problems are
//! the agents' own reading of the object ([`cluster_policy`]); a named port
//! no pod has depends on the pods, and the agents report it (the first to post
//! its Event posts it for all: an Event is named by what it says,
//! [`ProblemEvents`]). The kind is
//! found by API discovery and waited for, as the agents do; the loop is the
//! controller kit's, a pass at once after each change.

use std::collections::BTreeSet;

use futures::stream::{self, BoxStream};
use futures::{Future, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use crate::controller::{self, Controller, Timing, WatchItem, ending};
use crate::k8s::discovery::{self, CiliumKind};
use crate::k8s::events::ProblemEvents;
use crate::k8s::mirror::{Keyed, Mirror, WatchEnded, projected};
use crate::k8s::objects::{ApplyBody, condition_json, condition_of};
use crate::policy::Problem;
use crate::policy::view::cluster_policy;

/// The field manager of the status applies.
pub const FIELD_MANAGER: &str = "podnet-operator-cluster-network-policy";
/// The condition podnet writes.
pub const ENFORCED_CONDITION: &str = "podnet.io/Enforced";
const KIND: CiliumKind = CiliumKind::ClusterNetworkPolicy;

/// What the loop keeps of one ClusterNetworkPolicy.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyStatus {
    pub name: String,
    /// `metadata.generation`: the spec the problems are of.
    pub generation: i64,
    pub problems: Vec<Problem>,
    /// [`ENFORCED_CONDITION`] as the object has it.
    pub condition: Option<Value>,
}

impl Keyed for PolicyStatus {
    fn key(&self) -> String {
        self.name.clone()
    }
}

/// What the loop keeps of `object`.
pub fn status_of(object: &DynamicObject) -> PolicyStatus {
    let name = object.metadata.name.clone().unwrap_or_default();
    let problems = cluster_policy(&name, &object.data["spec"]).problems;
    let condition = condition_of(object, ENFORCED_CONDITION);
    PolicyStatus {
        name,
        generation: object.metadata.generation.unwrap_or_default(),
        problems,
        condition: condition.cloned(),
    }
}

/// The condition's status, reason and message for `problems`.
pub fn wanted(problems: &[Problem]) -> (&'static str, &'static str, String) {
    if problems.is_empty() {
        return (
            "True",
            "Enforced",
            "podnet enforces every rule as written".into(),
        );
    }
    let each: Vec<String> = problems
        .iter()
        .map(|p| format!("{}: {}", p.field, p.why))
        .collect();
    let message = format!(
        "{} problem{}: {}; a rule with a problem fails closed (podnet status, Events)",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" },
        each.join("; ")
    );
    ("False", "Problems", message)
}

/// Whether `policy` shows the condition its problems want, judged at its generation.
fn up_to_date(policy: &PolicyStatus) -> bool {
    let (status, reason, message) = wanted(&policy.problems);
    policy.condition.as_ref().is_some_and(|c| {
        c["status"] == status
            && c["reason"] == reason
            && c["message"] == message.as_str()
            && c["observedGeneration"] == policy.generation
    })
}

/// One policy's write: its condition, and the Events of its problems not
/// posted before.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusWrite {
    pub name: String,
    pub condition: Value,
    pub events: Vec<Problem>,
}

/// Where the loop writes: the status applies and the Events.
pub trait Writes {
    /// Applies `condition` to the status of policy `name` (gone: fine).
    fn apply_condition(
        &self,
        resource: &ApiResource,
        name: &str,
        condition: Value,
    ) -> impl Future<Output = Result<(), kube::Error>>;
    /// Posts `problem` as a Warning Event on its policy (best effort).
    fn post_event(&self, resource: &ApiResource, problem: &Problem) -> impl Future<Output = ()>;
}

/// The API server's end of [`Writes`].
pub struct ApiWrites {
    client: kube::Client,
    events: ProblemEvents,
}

impl Writes for ApiWrites {
    async fn apply_condition(
        &self,
        resource: &ApiResource,
        name: &str,
        condition: Value,
    ) -> Result<(), kube::Error> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), resource);
        let body = ApplyBody::new(&resource.api_version, &resource.kind, name)
            .with("status", json!({"conditions": [condition]}));
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match api.patch_status(name, &params, &Patch::Apply(&body)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn post_event(&self, resource: &ApiResource, problem: &Problem) {
        let kind = (resource.api_version.as_str(), resource.kind.as_str());
        let why = problem.why.to_string();
        let (name, field) = (&problem.name, &problem.field);
        self.events.post(kind, name, field, &why).await;
    }
}

/// One input of the loop.
pub enum Input {
    /// The version the API server serves, found.
    Served(ApiResource),
    Policy(Box<WatchItem<PolicyStatus>>),
}

/// The loop's state.
pub struct StatusLoop<W> {
    writes: W,
    resource: Option<ApiResource>,
    policies: Mirror<PolicyStatus>,
    /// The problems posted as Events, while they last.
    posted: BTreeSet<Problem>,
}

impl<W: Writes> StatusLoop<W> {
    pub fn new(writes: W) -> StatusLoop<W> {
        StatusLoop {
            writes,
            resource: None,
            policies: Mirror::default(),
            posted: BTreeSet::new(),
        }
    }

    /// The writes the policies need; the problems of those already up to
    /// date count as posted.
    fn statuses(&mut self) -> Vec<StatusWrite> {
        let present: BTreeSet<&Problem> =
            self.policies.objects().flat_map(|p| &p.problems).collect();
        self.posted.retain(|p| present.contains(p));
        let mut writes = Vec::new();
        for policy in self.policies.objects() {
            if up_to_date(policy) {
                self.posted.extend(policy.problems.iter().cloned());
                continue;
            }
            let (status, reason, message) = wanted(&policy.problems);
            let mut condition = condition_json(
                ENFORCED_CONDITION,
                status,
                reason,
                &message,
                policy.condition.as_ref(),
            );
            condition["observedGeneration"] = json!(policy.generation);
            let events = policy.problems.iter();
            let events = events.filter(|p| !self.posted.contains(*p)).cloned();
            writes.push(StatusWrite {
                name: policy.name.clone(),
                condition,
                events: events.collect(),
            });
        }
        writes
    }
}

impl<W: Writes> Controller for StatusLoop<W> {
    type Input = Input;
    type Plan = Vec<StatusWrite>;
    type Error = kube::Error;
    const WHAT: &'static str = "a ClusterNetworkPolicy status write";

    fn feed(&mut self, input: Input) -> Result<bool, WatchEnded> {
        match input {
            Input::Served(resource) => {
                self.resource = Some(resource);
                Ok(true)
            }
            Input::Policy(item) => self.policies.feed(*item, "ClusterNetworkPolicy"),
        }
    }

    fn ready(&self) -> bool {
        self.resource.is_some() && self.policies.listed()
    }

    async fn plan(&mut self) -> Option<Vec<StatusWrite>> {
        Some(self.statuses())
    }

    async fn apply(&mut self, plan: Vec<StatusWrite>) -> Result<(), kube::Error> {
        let Some(resource) = self.resource.clone() else {
            return Ok(());
        };
        let mut first_error = None;
        for write in plan {
            if let Err(e) = self
                .writes
                .apply_condition(&resource, &write.name, write.condition)
                .await
            {
                first_error.get_or_insert(e);
                continue;
            }
            for problem in write.events {
                self.writes.post_event(&resource, &problem).await;
                self.posted.insert(problem);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// The kind found (waited for while no version podnet reads is served), then
/// its watch.
fn inputs(client: kube::Client) -> BoxStream<'static, Input> {
    stream::once(async move {
        let resource = discovery::resolve_waiting(&client, KIND, &|_| {}).await;
        tracing::info!(version = %resource.api_version, "ClusterNetworkPolicy status on");
        let policies = projected(discovery::watch_all(&client, &resource), |o| status_of(&o));
        let policies = ending(policies).map(|e| Input::Policy(Box::new(e)));
        stream::once(async { Input::Served(resource) }).chain(policies)
    })
    .flatten()
    .boxed()
}

/// Runs until the watch ends; returns why. `identity` is the replica's.
pub async fn run(client: kube::Client, identity: &str) -> WatchEnded {
    let writes = ApiWrites {
        events: ProblemEvents::new(client.clone(), "podnet-operator", identity),
        client: client.clone(),
    };
    let mut status = StatusLoop::new(writes);
    controller::run(&mut status, inputs(client), Timing::AT_ONCE).await
}

#[cfg(test)]
#[path = "tests/cluster_policy_status.rs"]
mod tests;
