//! multi-pool: giving free blocks back. The agent removes them from the
//! operator's `spec.ipam.pools.allocated` (as Cilium's agent does) with a merge
//! patch that carries the resourceVersion it was computed from, read again and
//! retried when the node changed meanwhile (`operator::multi_pool` describes the
//! whole protocol).

use std::collections::BTreeSet;

use ipnet::IpNet;
use kube::api::{DynamicObject, Patch, PatchParams};

use super::FIELD_MANAGER;
use super::bodies::release_body;
use super::sink::KubernetesSink;
use crate::node::NodeError;

/// Attempts at removing given-back blocks before the next flush tries again.
const RELEASE_ATTEMPTS: usize = 5;

/// `spec.ipam.pools.allocated` of a CiliumNode object (raw JSON entries) without
/// the `released` blocks; None when it lists none of them.
fn allocated_without(
    obj: &DynamicObject,
    released: &BTreeSet<(String, IpNet)>,
) -> Option<Vec<serde_json::Value>> {
    let entries = obj.data["spec"]["ipam"]["pools"]["allocated"].as_array()?;
    let mut removed = false;
    let mut kept = Vec::with_capacity(entries.len());
    for entry in entries {
        let pool = entry["pool"].as_str().unwrap_or_default().to_string();
        let Some(cidrs) = entry["cidrs"].as_array() else {
            kept.push(entry.clone());
            continue;
        };
        let left: Vec<serde_json::Value> = cidrs
            .iter()
            .filter(|c| {
                let gone = c
                    .as_str()
                    .and_then(|c| c.parse::<IpNet>().ok())
                    .is_some_and(|c| released.contains(&(pool.clone(), c.trunc())));
                removed |= gone;
                !gone
            })
            .cloned()
            .collect();
        if left.len() == cidrs.len() {
            kept.push(entry.clone());
        } else if !left.is_empty() {
            let mut e = entry.clone();
            e["cidrs"] = serde_json::Value::Array(left);
            kept.push(e);
        }
    }
    removed.then_some(kept)
}

impl KubernetesSink {
    /// Removes the given-back blocks from `spec.ipam.pools.allocated`: reads the
    /// CiliumNode, then merge-patches the list without them, with the
    /// resourceVersion read as precondition; on 409 (the operator or anyone
    /// changed the node) reads it again.
    pub(super) async fn remove_released(&mut self) -> Result<(), NodeError> {
        let name = self.config.node_name.clone();
        let released = self.pending_released.clone();
        let (api, _) = self.nodes_api().await?;
        let op = || format!("giving blocks back in CiliumNode {name:?}");
        let api_error = |source| NodeError::Api { op: op(), source };
        let mut done = false;
        for _ in 0..RELEASE_ATTEMPTS {
            let Some(obj) = api.get_opt(&name).await.map_err(api_error)? else {
                done = true;
                break;
            };
            let Some(allocated) = allocated_without(&obj, &released) else {
                done = true;
                break;
            };
            let body = release_body(obj.metadata.resource_version.as_deref(), &allocated);
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            match api.patch(&name, &params, &Patch::Merge(&body)).await {
                Ok(_) => {
                    tracing::info!(blocks = ?released, "gave blocks back to the operator");
                    done = true;
                    break;
                }
                Err(kube::Error::Api(e)) if e.is_conflict() => continue,
                Err(e) => return Err(api_error(e)),
            }
        }
        if !done {
            return Err(NodeError::Changing {
                op: op(),
                attempts: RELEASE_ATTEMPTS,
            });
        }
        self.pending_released.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn given_back_blocks_leave_the_allocated_list() {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
            "metadata": {"name": "n1", "resourceVersion": "7"},
            "spec": {"ipam": {"pools": {"allocated": [
                {"pool": "default", "cidrs": ["10.10.0.0/26", "10.10.0.64/26"], "allowFirstIP": true},
                {"pool": "mars", "cidrs": ["10.20.0.0/26"]},
            ]}}},
        }))
        .unwrap();
        let b = |p: &str, c: &str| (p.to_string(), c.parse::<IpNet>().unwrap());
        let left =
            allocated_without(&obj, &BTreeSet::from([b("default", "10.10.0.64/26")])).unwrap();
        assert_eq!(
            json!(left),
            json!([
                {"pool": "default", "cidrs": ["10.10.0.0/26"], "allowFirstIP": true},
                {"pool": "mars", "cidrs": ["10.20.0.0/26"]},
            ])
        );
        let left = allocated_without(&obj, &BTreeSet::from([b("mars", "10.20.0.0/26")])).unwrap();
        assert_eq!(left.len(), 1, "an emptied entry goes");
        // Not listed (or listed under another pool): nothing to write.
        assert_eq!(
            allocated_without(&obj, &BTreeSet::from([b("mars", "10.10.0.0/26")])),
            None
        );
    }
}
