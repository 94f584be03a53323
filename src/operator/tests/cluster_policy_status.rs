use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream;
use kube::runtime::watcher::Event;
use serde_json::json;

use super::*;

fn resource() -> ApiResource {
    ApiResource {
        group: "policy.networking.k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "policy.networking.k8s.io/v1beta1".into(),
        kind: "ClusterNetworkPolicy".into(),
        plural: "clusternetworkpolicies".into(),
    }
}

const GOOD_EGRESS: &str = "networks";
const BAD_EGRESS: &str = "domainNames";

/// Policy `name` at `generation` whose egress peer is `peer` (`networks`:
/// enforced; `domainNames`: a problem), with `condition` in its status.
fn policy(name: &str, generation: i64, peer: &str, condition: Option<Value>) -> PolicyStatus {
    let to = match peer {
        GOOD_EGRESS => json!([{"networks": ["10.0.0.0/8"]}]),
        _ => json!([{"domainNames": ["example.com"]}]),
    };
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
        "metadata": {"name": name, "generation": generation},
        "spec": {"tier": "Admin", "priority": 1, "subject": {"namespaces": {}},
                 "egress": [{"action": "Accept", "to": to}]},
        "status": {"conditions": condition.into_iter().collect::<Vec<_>>()},
    }))
    .expect("an object");
    status_of(&object)
}

/// What the in-memory writer was asked: conditions applied and Events posted.
#[derive(Default)]
struct Record {
    applied: Vec<(String, Value)>,
    posted: Vec<String>,
    /// The outcomes of the next applies (true: it fails); then they succeed.
    failures: VecDeque<bool>,
}

#[derive(Clone, Default)]
struct Memory(Arc<Mutex<Record>>);

impl Memory {
    fn take(&self) -> (Vec<(String, Value)>, Vec<String>) {
        let mut r = self.0.lock().expect("lock");
        (
            std::mem::take(&mut r.applied),
            std::mem::take(&mut r.posted),
        )
    }
}

impl Writes for Memory {
    async fn apply_condition(
        &self,
        _: &ApiResource,
        name: &str,
        condition: Value,
    ) -> Result<(), kube::Error> {
        let mut r = self.0.lock().expect("lock");
        if r.failures.pop_front() == Some(true) {
            let refused =
                kube::core::Status::failure("the API server is down", "ServiceUnavailable")
                    .with_code(503);
            return Err(kube::Error::Api(Box::new(refused)));
        }
        r.applied.push((name.to_string(), condition));
        Ok(())
    }

    async fn post_event(&self, _: &ApiResource, problem: &Problem) {
        let mut r = self.0.lock().expect("lock");
        r.posted.push(format!(
            "{} {}: {}",
            problem.name, problem.field, problem.why
        ));
    }
}

const DOMAIN_PROBLEM: &str =
    "bad spec.egress[0].to[0].domainNames: domainNames is not enforced by podnet";

/// A loop fed `listed` as its first list, with the kind served.
fn listed(memory: &Memory, listed: Vec<PolicyStatus>) -> StatusLoop<Memory> {
    let mut l = StatusLoop::new(memory.clone());
    l.feed(Input::Served(resource())).expect("fed");
    let mut items = vec![Event::Init];
    items.extend(listed.into_iter().map(Event::InitApply));
    items.push(Event::InitDone);
    for e in items {
        l.feed(Input::Policy(Box::new(Some(Ok(e))))).expect("fed");
    }
    assert!(l.ready());
    l
}

async fn pass(l: &mut StatusLoop<Memory>) -> Result<(), kube::Error> {
    let plan = l.plan().await.expect("a plan");
    l.apply(plan).await
}

fn changed(l: &mut StatusLoop<Memory>, p: PolicyStatus) {
    l.feed(Input::Policy(Box::new(Some(Ok(Event::Apply(p))))))
        .expect("fed");
}

#[test]
fn the_condition_says_each_problem_or_that_every_rule_is_enforced() {
    assert_eq!(
        wanted(&[]),
        (
            "True",
            "Enforced",
            "podnet enforces every rule as written".into()
        )
    );
    let bad = policy("bad", 1, BAD_EGRESS, None);
    assert_eq!(
        wanted(&bad.problems),
        (
            "False",
            "Problems",
            "1 problem: spec.egress[0].to[0].domainNames: domainNames is not enforced by podnet; a rule with a problem fails closed (podnet status, Events)".into()
        )
    );
}

#[tokio::test]
async fn each_problem_is_posted_once_and_a_condition_already_shown_is_not_written_again() {
    let memory = Memory::default();
    let mut l = listed(
        &memory,
        vec![
            policy("good", 1, GOOD_EGRESS, None),
            policy("bad", 1, BAD_EGRESS, None),
        ],
    );
    pass(&mut l).await.expect("written");
    let (applied, posted) = memory.take();
    let conditions: Vec<(&str, &Value, &Value, &Value)> = applied
        .iter()
        .map(|(n, c)| {
            (
                n.as_str(),
                &c["type"],
                &c["status"],
                &c["observedGeneration"],
            )
        })
        .collect();
    assert_eq!(
        conditions,
        [
            (
                "bad",
                &json!(ENFORCED_CONDITION),
                &json!("False"),
                &json!(1)
            ),
            (
                "good",
                &json!(ENFORCED_CONDITION),
                &json!("True"),
                &json!(1)
            ),
        ]
    );
    assert_eq!(posted, [DOMAIN_PROBLEM]);

    // The watch brings the objects back with the conditions written: nothing to do.
    let shown = applied.iter().map(|(n, c)| (n.clone(), c.clone()));
    for (name, condition) in shown {
        let peer = if name == "bad" {
            BAD_EGRESS
        } else {
            GOOD_EGRESS
        };
        changed(&mut l, policy(&name, 1, peer, Some(condition)));
    }
    pass(&mut l).await.expect("nothing");
    assert_eq!(memory.take(), (vec![], vec![]));

    // A new leader reads the same objects: the problem was posted before.
    let shown_bad = l.policies.get("bad").cloned().expect("bad");
    let shown_good = l.policies.get("good").cloned().expect("good");
    let mut next = listed(&memory, vec![shown_bad.clone(), shown_good]);
    pass(&mut next).await.expect("nothing");
    assert_eq!(memory.take(), (vec![], vec![]));

    // An edit that keeps the problem: the generation is written, no Event again.
    let condition = shown_bad.condition.clone();
    changed(&mut next, policy("bad", 2, BAD_EGRESS, condition));
    pass(&mut next).await.expect("written");
    let (applied, posted) = memory.take();
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].1["observedGeneration"], 2);
    assert_eq!(
        applied[0].1["lastTransitionTime"],
        shown_bad.condition.expect("shown")["lastTransitionTime"],
        "still False: the transition time stays"
    );
    assert!(posted.is_empty(), "{posted:?}");

    // Fixed, then broken again: the problem is posted again.
    changed(
        &mut next,
        policy("bad", 3, GOOD_EGRESS, Some(applied[0].1.clone())),
    );
    pass(&mut next).await.expect("written");
    let (applied, posted) = memory.take();
    assert_eq!(applied[0].1["status"], "True");
    assert!(posted.is_empty());
    changed(
        &mut next,
        policy("bad", 4, BAD_EGRESS, Some(applied[0].1.clone())),
    );
    pass(&mut next).await.expect("written");
    assert_eq!(memory.take().1, [DOMAIN_PROBLEM]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_write_posts_nothing_and_the_loop_writes_and_posts_once_after_its_backoff() {
    let memory = Memory::default();
    memory.0.lock().expect("lock").failures = [true].into();
    let mut l = StatusLoop::new(memory.clone());
    let items = [
        Input::Served(resource()),
        Input::Policy(Box::new(Some(Ok(Event::Init)))),
        Input::Policy(Box::new(Some(Ok(Event::InitApply(policy(
            "bad", 1, BAD_EGRESS, None,
        )))))),
        Input::Policy(Box::new(Some(Ok(Event::InitDone)))),
    ];
    // The watch ends a minute later (the loop ends with it).
    let end = stream::once(async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Input::Policy(Box::new(None))
    });
    let events = stream::iter(items).chain(end).boxed();
    let ended = controller::run(&mut l, events, Timing::AT_ONCE).await;
    assert!(
        ended.to_string().contains("ClusterNetworkPolicy"),
        "{ended}"
    );
    let (applied, posted) = memory.take();
    assert_eq!(
        applied.len(),
        1,
        "the failed apply, then one that succeeded"
    );
    assert_eq!(posted, [DOMAIN_PROBLEM], "posted once, after the write");
}
