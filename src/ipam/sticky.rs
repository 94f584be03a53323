//! Sticky addresses on the wire, as the agent and the operator both read them:
//! an address that belongs to a pod's identity (`<namespace>/<name>`, a
//! StatefulSet's `web-0`) and follows it from node to node.
//! - A StatefulSet's pod (its name `<statefulset>-<ordinal>`,
//!   [`statefulset_ordinal`]) opts in with [`POD_STICKY_POOL`] (set in its
//!   template) naming a sticky pool: a CiliumPodIPPool annotated
//!   [`STICKY_POOL`]` = "true"` whose blocks are single addresses.
//! - A node's agent asks in its CiliumNode annotation [`STICKY_REQUESTS`]
//!   (`{"<namespace>/<name>": "<pool>"}`, [`requests_annotation`]).
//! - The operator records the owner in the pool's [`STICKY_OWNERS`], puts the
//!   address's block in the node's `spec.ipam.pools.allocated` and answers in
//!   the node's [`STICKY_STATUS`] ([`Answer`], read back with [`parse_status`]).
//! - The record is released by the StatefulSet's PVC retention policy; the
//!   StatefulSets released on delete are noted in the pool's
//!   [`STICKY_RELEASE_ON_DELETE`].
//!
//! The operator's rules are `operator::multi_pool::sticky`; the agent's are
//! `daemon::state::sticky`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

pub use super::pooldef::ANNOTATION_STICKY as STICKY_POOL;
/// The Pod annotation (set in a StatefulSet's pod template) naming the sticky
/// pool the pod's address comes from.
pub const POD_STICKY_POOL: &str = "ipam.podnet.io/sticky-pool";
/// The CiliumPodIPPool annotation recording `{"<namespace>/<name>": "<address>"}`.
pub const STICKY_OWNERS: &str = "ipam.podnet.io/sticky-owners";
/// The CiliumPodIPPool annotation recording the StatefulSets (`{"<namespace>/<name>":
/// "<uid>"}`) whose `persistentVolumeClaimRetentionPolicy.whenDeleted` is
/// `Delete` and that have identities in the pool's [`STICKY_OWNERS`]: once such a
/// StatefulSet is gone, its identities are released (the operator cannot read
/// the policy of a StatefulSet that no longer exists, so it notes it before).
pub const STICKY_RELEASE_ON_DELETE: &str = "ipam.podnet.io/sticky-release-on-delete";
/// The CiliumNode annotation a node's agent asks with: `{"<namespace>/<name>": "<pool>"}`.
pub const STICKY_REQUESTS: &str = "ipam.podnet.io/sticky-requests";
/// The CiliumNode annotation the operator answers in (see [`Answer`]).
pub const STICKY_STATUS: &str = "ipam.podnet.io/sticky-status";

/// The StatefulSet name and ordinal of a pod name `<statefulset>-<ordinal>` (the
/// ordinal in decimal without leading zeros, as the StatefulSet controller
/// names its pods); None for any other name.
pub fn statefulset_ordinal(pod_name: &str) -> Option<(&str, u32)> {
    let (set, ordinal) = pod_name.rsplit_once('-')?;
    let n: u32 = ordinal.parse().ok()?;
    (!set.is_empty() && n.to_string() == ordinal).then_some((set, n))
}

/// The state of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// The address's block is in the node's `spec.ipam.pools.allocated`.
    Assigned,
    /// Another node still lists the block; it comes once that node gives it back.
    Moving,
    /// The request cannot be served; `message` says why.
    Refused,
}

/// The answer to one request, as the node's [`STICKY_STATUS`] has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub pool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<IpAddr>,
    pub state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Answer {
    /// A refusal of a request for `pool`, saying why.
    pub fn refused(pool: &str, message: String) -> Answer {
        Answer {
            pool: pool.to_string(),
            address: None,
            state: State::Refused,
            message: Some(message),
        }
    }
}

/// The answers of a CiliumNode's [`STICKY_STATUS`] (`annotations`), by identity:
/// none without the annotation; an annotation that cannot be read says why.
pub fn parse_status(
    annotations: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, Answer>, String> {
    let Some(raw) = annotations.get(STICKY_STATUS) else {
        return Ok(BTreeMap::new());
    };
    serde_json::from_str(raw).map_err(|e| {
        format!(
            "annotation {STICKY_STATUS} is not a JSON object of \"<namespace>/<name>\": \
             {{\"pool\", \"address\", \"state\", \"message\"}}: {e}"
        )
    })
}

/// The [`STICKY_REQUESTS`] value asking for `requests` (identity -> pool).
pub fn requests_annotation(requests: &BTreeMap<String, String>) -> String {
    serde_json::Value::from(
        requests
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str())))
            .collect::<serde_json::Map<_, _>>(),
    )
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotated(raw: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(STICKY_STATUS.to_string(), raw.to_string())])
    }

    #[test]
    fn the_status_reads_every_state_and_names_the_annotation_when_broken() {
        assert!(parse_status(&BTreeMap::new()).unwrap().is_empty());
        let answers = parse_status(&annotated(
            r#"{"db/web-0": {"pool": "web", "address": "10.20.0.1", "state": "assigned"},
                "db/web-1": {"pool": "web", "state": "moving", "message": "node n2 still lists 10.20.0.2/32"},
                "db/web-2": {"pool": "web", "state": "refused", "message": "pool has no free address"}}"#,
        ))
        .unwrap();
        assert_eq!(answers["db/web-0"].state, State::Assigned);
        assert_eq!(
            answers["db/web-0"].address,
            Some("10.20.0.1".parse().unwrap())
        );
        assert_eq!(answers["db/web-1"].state, State::Moving);
        assert_eq!(answers["db/web-2"].state, State::Refused);
        let e = parse_status(&annotated("[1]")).unwrap_err();
        assert!(
            e.starts_with("annotation ipam.podnet.io/sticky-status is not"),
            "{e}"
        );
        let e = parse_status(&annotated(r#"{"a/b": {"pool": "p", "state": "lost"}}"#)).unwrap_err();
        assert!(e.contains("unknown variant"), "{e}");
    }

    #[test]
    fn only_a_statefulset_pod_name_has_an_ordinal() {
        assert_eq!(statefulset_ordinal("web-0"), Some(("web", 0)));
        assert_eq!(statefulset_ordinal("my-db-12"), Some(("my-db", 12)));
        for name in [
            "web",
            "web-",
            "-3",
            "web-01",
            "web-+1",
            "web-x7k2p",
            "web-99999999999",
        ] {
            assert_eq!(statefulset_ordinal(name), None, "{name}");
        }
    }

    #[test]
    fn the_requests_are_one_json_object_in_identity_order() {
        let requests = BTreeMap::from([
            ("db/web-1".to_string(), "web".to_string()),
            ("db/web-0".to_string(), "web".to_string()),
        ]);
        assert_eq!(
            requests_annotation(&requests),
            r#"{"db/web-0":"web","db/web-1":"web"}"#
        );
        assert_eq!(requests_annotation(&BTreeMap::new()), "{}");
    }
}
