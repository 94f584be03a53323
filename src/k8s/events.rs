//! How podnet builds the Events it posts (events.k8s.io/v1, through kube-rs's
//! `Recorder`): the recorder of one reporting controller and instance
//! ([`recorder`]), and an Event of a type, reason and note whose action names
//! what it is about ([`event`], so Events about different values stay apart).
//!
//! What makes two Events one series: kube-rs's `Recorder` (kube-runtime 5.0,
//! `events.rs`, `EventKey`) folds every Event with the same type, `action`,
//! `reason`, reporting controller and instance, `regarding` object and
//! `related` object, posted within its cache's TTL, into one series: it patches
//! the first Event's series count and keeps the first Event's note. The note is
//! not in the key, so two Events of one reason on one object about different
//! values (two CIDRs, two leaked addresses) became one, naming the first value
//! only. Every Event podnet posts about a value puts that value in its action
//! ([`action_about`]): the action is in the key, and neither `kubectl get
//! events` nor `kubectl describe` shows it, so what they list (reason, object,
//! note) reads as before, one line per value. Repeats about the same value
//! still fold into a series. A policy's problems, which every node (and the
//! operator) may see, are not posted through a `Recorder` but named by what
//! they say, once for the cluster ([`ProblemEvents`]).

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use sha2::{Digest, Sha256};

/// A recorder posting as `controller` (`podnet-agent`, `podnet-operator`), from
/// `instance` (the node, or the operator replica).
pub fn recorder(client: kube::Client, controller: &str, instance: &str) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: controller.into(),
            instance: Some(instance.into()),
        },
    )
}

/// An Event: Warning or Normal, its `reason`, its `note`, and the action
/// `<verb> <about>` ([`action_about`]); no related object.
pub fn event(warning: bool, reason: &str, note: &str, verb: &str, about: &str) -> Event {
    Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(note.into()),
        action: action_about(verb, about),
        secondary: None,
    }
}

/// Where policy problems go: one Warning `PolicyProblem` Event per problem for
/// the whole cluster, whichever agent or operator replica sees it first.
/// kube-rs's `Recorder` names each Event by the time it is posted, so every
/// node that saw a problem posted its own; here the name is made of what the
/// Event says ([`problem_event_name`]): the first create makes it, and every
/// other poster's create finds it there (409 AlreadyExists) and posts nothing.
/// It lasts the API server's `--event-ttl` (1 hour by default); a poster posts
/// each problem once while it lasts in its own view.
pub struct ProblemEvents {
    client: kube::Client,
    /// `podnet-agent` or `podnet-operator`.
    controller: String,
    /// The node, or the operator replica.
    instance: String,
}

impl ProblemEvents {
    pub fn new(client: kube::Client, controller: &str, instance: &str) -> ProblemEvents {
        ProblemEvents {
            client,
            controller: controller.into(),
            instance: instance.into(),
        }
    }

    /// Posts the problem of cluster-scoped object `name` (of `api_version`
    /// and `kind`) unless it is posted: its note `<field>: <why>`, its action
    /// `Enforce <field>`. Best effort: a failed post is logged at debug.
    pub async fn post(
        &self,
        (api_version, kind): (&str, &str),
        name: &str,
        field: &str,
        why: &str,
    ) {
        let note = format!("{field}: {why}");
        let group = api_version.split('/').next().unwrap_or(api_version);
        let event = K8sEvent {
            metadata: ObjectMeta {
                name: Some(problem_event_name(group, kind, name, &note)),
                // Cluster-scoped objects' Events live in `default`, as kube-rs's.
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(Timestamp::now())),
            type_: Some("Warning".into()),
            reason: Some("PolicyProblem".into()),
            note: Some(note),
            action: Some(action_about("Enforce", field)),
            regarding: Some(ObjectReference {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
                name: Some(name.into()),
                ..ObjectReference::default()
            }),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..K8sEvent::default()
        };
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), "default");
        match events.create(&PostParams::default(), &event).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_already_exists() => {
                tracing::debug!(
                    kind,
                    name,
                    field,
                    "the policy problem's Event was posted already"
                );
            }
            Err(e) => {
                tracing::debug!(error = %e, kind, name, "a policy problem's Event was not posted")
            }
        }
    }
}

/// A problem Event's name: the object's name (cut to leave room, as a DNS
/// subdomain ends: on a letter or digit) and 16 hex digits of a SHA-256 of
/// the object's group, kind and name and the note. The same problem of the
/// same object is the same name on every node; another problem, another name.
fn problem_event_name(group: &str, kind: &str, name: &str, note: &str) -> String {
    let digest = Sha256::digest([group, kind, name, note].join("\0").as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let mut prefix: String = name.chars().take(200).collect();
    while prefix.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        prefix.pop();
    }
    match prefix.is_empty() {
        true => format!("policy.{hex}"),
        false => format!("{prefix}.{hex}"),
    }
}

/// The most the API server takes in an Event's action (events.k8s.io/v1).
const ACTION_MAX: usize = 128;

/// The action of an Event that `verb`s `subject`: `Verb subject`, cut to
/// [`ACTION_MAX`] bytes on a character boundary (a subject that long still
/// differs from others in its first hundred bytes in practice: CIDRs and
/// addresses are short).
fn action_about(verb: &str, subject: &str) -> String {
    let mut action = if subject.is_empty() {
        verb.to_string()
    } else {
        format!("{verb} {subject}")
    };
    if action.len() > ACTION_MAX {
        let mut end = ACTION_MAX;
        while !action.is_char_boundary(end) {
            end -= 1;
        }
        action.truncate(end);
    }
    action
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_action_names_the_subject_so_different_subjects_are_different_series() {
        let a = action_about("AllocatePodCIDR", "10.0.1.0/24");
        let b = action_about("AllocatePodCIDR", "10.0.2.0/24");
        assert_eq!(a, "AllocatePodCIDR 10.0.1.0/24");
        assert_ne!(a, b);
        assert_eq!(action_about("Found", ""), "Found");
    }

    #[test]
    fn a_problem_event_is_named_by_what_it_says_the_same_on_every_node() {
        let group = "policy.networking.k8s.io";
        let kind = "ClusterNetworkPolicy";
        let name = |policy: &str, note: &str| problem_event_name(group, kind, policy, note);
        let a = name("named-web", "spec.ingress[0]: no port");
        assert_eq!(a, name("named-web", "spec.ingress[0]: no port"));
        assert!(a.starts_with("named-web."), "{a}");
        assert_eq!(a.len(), "named-web.".len() + 16);
        assert_ne!(a, name("named-web", "spec.ingress[1]: no port"));
        assert_ne!(a, name("named-web2", "spec.ingress[0]: no port"));
        assert_ne!(
            a,
            problem_event_name(
                group,
                "AdminNetworkPolicy",
                "named-web",
                "spec.ingress[0]: no port"
            )
        );
        // A long name is cut to leave room, ending as a DNS subdomain does.
        let long = format!("{}-{}", "a".repeat(199), "b".repeat(53));
        let cut = name(&long, "x");
        assert!(cut.len() <= 253, "{}", cut.len());
        assert!(cut.starts_with(&format!("{}.", "a".repeat(199))), "{cut}");
        assert!(name("---", "x").starts_with("policy."));
    }

    #[test]
    fn a_long_action_is_cut_to_what_the_api_server_takes() {
        let long = "é".repeat(100);
        let action = action_about("Found", &long);
        assert!(action.len() <= ACTION_MAX, "{}", action.len());
        assert!(action.starts_with("Found é"));
    }

    #[test]
    fn an_event_has_its_type_reason_note_and_the_action_about_its_subject() {
        let e = event(true, "IPAMLeak", "10.0.1.5 leaked", "Found", "10.0.1.5");
        assert_eq!(e.type_, EventType::Warning);
        assert_eq!(e.reason, "IPAMLeak");
        assert_eq!(e.note.as_deref(), Some("10.0.1.5 leaked"));
        assert_eq!(e.action, "Found 10.0.1.5");
        assert!(e.secondary.is_none());
        let e = event(false, "Released", "", "Released", "");
        assert_eq!(e.type_, EventType::Normal);
        assert_eq!(e.note.as_deref(), Some(""));
        assert_eq!(e.action, "Released");
    }
}
