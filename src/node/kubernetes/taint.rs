//! The agent's word on its own Node when new pods cannot get an address here:
//! the taint [`EXHAUSTED`] (`NoSchedule`: the scheduler sends no more pods, the
//! running ones stay) and the annotation of the same name with why
//! (`ipam::exhaustion`). Both go when an address is free again. In multi-pool,
//! pools exhausted while another has room are said in the annotation alone
//! (`ipam::exhaustion::exhausted_pools`: a taint would keep every pod out). (A failed CNI
//! STATUS would say it too, but the kubelet turns that into `Ready=False`, the
//! node lifecycle controller into `not-ready:NoExecute`, and every pod on the
//! node is evicted 300 s later.) The Node is read, then merge-patched with the
//! resourceVersion read as precondition (a merge patch replaces the whole taint
//! list); on 409 it is read again. deploy/agent-rbac.yaml lets an agent change
//! only these two on its own Node.

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::FIELD_MANAGER;
use super::sink::KubernetesSink;
use crate::node::{AddressRoom, NodeError};

/// The taint's key and the annotation's.
pub const EXHAUSTED: &str = "podnet.io/addresses-exhausted";

/// Reads of the Node before the write gives up for this flush (each 409 is
/// another writer's change: the kubelet's, the node lifecycle controller's).
const ATTEMPTS: usize = 5;

/// The merge patch that makes `node` say `room`, or None when it says it
/// already: the taint list with [`EXHAUSTED`] added or removed (every other
/// taint kept, in order), the annotation set or removed, the resourceVersion
/// as precondition.
pub(super) fn room_patch(node: &Node, room: &AddressRoom) -> Option<Value> {
    let taints: &[Taint] = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    let tainted = taints.iter().any(|t| t.key == EXHAUSTED);
    let noted = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXHAUSTED));
    let (want_taint, want_note) = match room {
        AddressRoom::Available => (false, None),
        AddressRoom::Exhausted(why) => (true, Some(why)),
        AddressRoom::PoolsExhausted(why) => (false, Some(why)),
    };
    if tainted == want_taint && noted == want_note {
        return None;
    }
    let mut kept: Vec<Value> = taints
        .iter()
        .filter(|t| t.key != EXHAUSTED)
        .map(|t| json!(t))
        .collect();
    if want_taint {
        kept.push(json!({"key": EXHAUSTED, "effect": "NoSchedule"}));
    }
    Some(json!({
        "metadata": {
            "resourceVersion": node.metadata.resource_version,
            "annotations": {EXHAUSTED: want_note},
        },
        "spec": {"taints": kept},
    }))
}

impl KubernetesSink {
    /// Makes the agent's Node say `room` (see the module's comment).
    pub(super) async fn apply_room(&mut self, room: &AddressRoom) -> Result<(), NodeError> {
        let name = self.config.node_name.clone();
        let api: Api<Node> = Api::all(self.client().await?);
        let op = || format!("marking Node {name:?} {}", describe(room));
        let api_error = |source| NodeError::Api { op: op(), source };
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        for _ in 0..ATTEMPTS {
            let node = api.get(&name).await.map_err(api_error)?;
            let Some(body) = room_patch(&node, room) else {
                return Ok(());
            };
            match api.patch(&name, &params, &Patch::Merge(&body)).await {
                Ok(_) => {
                    match room {
                        AddressRoom::Exhausted(why) => {
                            tracing::warn!(taint = EXHAUSTED, reason = %why, "tainted the node: no address for a new pod")
                        }
                        AddressRoom::PoolsExhausted(why) => {
                            tracing::warn!(annotation = EXHAUSTED, reason = %why, "a pool is exhausted, another has room: said on the node, not tainted")
                        }
                        AddressRoom::Available => {
                            tracing::info!(taint = EXHAUSTED, "untainted the node: addresses free")
                        }
                    }
                    return Ok(());
                }
                Err(kube::Error::Api(e)) if e.is_conflict() => continue,
                Err(e) => return Err(api_error(e)),
            }
        }
        Err(NodeError::Changing {
            op: op(),
            attempts: ATTEMPTS,
        })
    }
}

fn describe(room: &AddressRoom) -> &'static str {
    match room {
        AddressRoom::Available => "with addresses free",
        AddressRoom::Exhausted(_) => "exhausted",
        AddressRoom::PoolsExhausted(_) => "with a pool exhausted",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(taints: Value, annotations: Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "resourceVersion": "42", "annotations": annotations},
            "spec": {"taints": taints},
        }))
        .expect("a Node")
    }

    fn full() -> AddressRoom {
        AddressRoom::Exhausted("ipv4 range 10.0.1.0/24 of node n1 is exhausted".into())
    }

    #[test]
    fn an_exhausted_node_gets_the_taint_after_the_others_and_the_reason() {
        let other = json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]);
        let patch = room_patch(&node(other, json!({"a": "b"})), &full()).expect("a patch");
        assert_eq!(
            patch,
            json!({
                "metadata": {
                    "resourceVersion": "42",
                    "annotations": {EXHAUSTED: "ipv4 range 10.0.1.0/24 of node n1 is exhausted"},
                },
                "spec": {"taints": [
                    {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
                    {"key": EXHAUSTED, "effect": "NoSchedule"},
                ]},
            })
        );
    }

    #[test]
    fn a_node_with_room_again_loses_the_taint_and_the_reason_and_keeps_the_rest() {
        let taints = json!([
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
            {"key": EXHAUSTED, "effect": "NoSchedule"},
        ]);
        let n = node(taints, json!({EXHAUSTED: "old reason", "a": "b"}));
        let patch = room_patch(&n, &AddressRoom::Available).expect("a patch");
        assert_eq!(patch["metadata"]["annotations"], json!({EXHAUSTED: null}));
        assert_eq!(
            patch["spec"]["taints"],
            json!([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}])
        );
    }

    #[test]
    fn an_exhausted_pool_beside_one_with_room_is_said_without_the_taint() {
        let tainted = node(
            json!([{"key": EXHAUSTED, "effect": "NoSchedule"}]),
            json!({EXHAUSTED: "old reason"}),
        );
        let why = "pool a is exhausted";
        let patch =
            room_patch(&tainted, &AddressRoom::PoolsExhausted(why.into())).expect("a patch");
        assert_eq!(patch["metadata"]["annotations"], json!({EXHAUSTED: why}));
        assert_eq!(patch["spec"]["taints"], json!([]));
    }

    #[test]
    fn a_node_that_says_it_already_is_not_written() {
        let tainted = node(
            json!([{"key": EXHAUSTED, "effect": "NoSchedule"}]),
            json!({EXHAUSTED: "ipv4 range 10.0.1.0/24 of node n1 is exhausted"}),
        );
        assert_eq!(room_patch(&tainted, &full()), None);
        assert_eq!(
            room_patch(&node(json!(null), json!(null)), &AddressRoom::Available),
            None
        );
    }

    #[test]
    fn a_new_reason_or_a_lost_annotation_is_written_again() {
        let tainted = node(
            json!([{"key": EXHAUSTED, "effect": "NoSchedule"}]),
            json!(null),
        );
        let patch = room_patch(&tainted, &full()).expect("the reason is missing");
        assert_eq!(patch["spec"]["taints"].as_array().map(Vec::len), Some(1));
        let stale = node(
            json!([{"key": EXHAUSTED, "effect": "NoSchedule"}]),
            json!({EXHAUSTED: "an older range"}),
        );
        assert!(room_patch(&stale, &full()).is_some());
    }
}
