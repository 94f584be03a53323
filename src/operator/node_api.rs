//! The node loop's writer on the API server: applies to CiliumNodes (spec, or
//! status through the status subresource; an annotation as a merge patch)
//! under the operator's field manager,
//! counted in the operator's metrics, with what the API server answers read back
//! as typed node resources, at the CiliumNode version API discovery finds.
//! Cluster-pool and multi-pool implement
//! [`NodeWriter`](super::node_loop::NodeWriter) on it with their own applies.

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

use super::metrics::OperatorMetrics;
use super::node_loop::{WriteError, Written};
use crate::k8s::discovery::{CiliumKind, resolve_waiting};
use crate::k8s::objects::{ApplyBody, node_resource};
use crate::resources::NodeResource;

/// Which part of a CiliumNode an apply writes, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// `spec`, a server-side apply.
    Spec,
    /// `status` through the status subresource, a server-side apply.
    Status,
    /// `metadata.annotations`, a merge patch (null removes an annotation).
    Annotations,
}

/// One apply of a node's write.
pub struct NodeApply<'a> {
    part: Part,
    fields: serde_json::Value,
    /// The resourceVersion the write is computed from (its precondition), if any.
    resource_version: Option<&'a str>,
    /// What the write counts as in the metrics.
    what: &'static str,
}

impl<'a> NodeApply<'a> {
    /// Sets `spec` to `fields`.
    pub fn spec(fields: serde_json::Value, what: &'static str) -> NodeApply<'a> {
        NodeApply {
            part: Part::Spec,
            fields,
            resource_version: None,
            what,
        }
    }

    /// Sets `status.ipam.operator-status.error` ("" clears it: what Cilium's
    /// omitempty field reads as no error; applying without the field would leave
    /// `operator-status: null`, which the CRD's schema refuses). Only the
    /// operator writes its status: the UID is its only precondition.
    pub fn operator_error(error: &str) -> NodeApply<'a> {
        NodeApply {
            part: Part::Status,
            fields: json!({"ipam": {"operator-status": {"error": error}}}),
            resource_version: None,
            what: "status",
        }
    }

    /// Sets annotation `key` to `value` (None removes it) with a merge patch,
    /// without a precondition.
    pub fn annotation(key: &str, value: Option<&str>, what: &'static str) -> NodeApply<'a> {
        NodeApply {
            part: Part::Annotations,
            fields: json!({"metadata": {"annotations": {key: value}}}),
            resource_version: None,
            what,
        }
    }

    /// Only as of resourceVersion `rv`.
    pub fn checked_at(mut self, rv: &'a str) -> NodeApply<'a> {
        self.resource_version = Some(rv);
        self
    }

    /// The body of this apply to CiliumNode `name` of `uid` at `api_version`.
    fn body(&self, api_version: &str, name: &str, uid: &str) -> ApplyBody {
        let mut body = ApplyBody::new(api_version, "CiliumNode", name).uid(uid);
        if let Some(rv) = self.resource_version {
            body = body.resource_version(rv);
        }
        let part = match self.part {
            Part::Status => "status",
            Part::Spec | Part::Annotations => "spec",
        };
        body.with(part, self.fields.clone())
    }
}

/// The CiliumNodes through the API server.
pub struct ApiNodes<'a> {
    api: Api<DynamicObject>,
    /// The CiliumNode apiVersion discovery chose (the one `api` uses).
    api_version: String,
    params: PatchParams,
    metrics: &'a OperatorMetrics,
}

/// The typed node of an answer; one that does not decode is logged and left out.
fn decoded(obj: &DynamicObject) -> Option<NodeResource> {
    node_resource(obj)
        .inspect_err(|e| tracing::error!(error = %e, "CiliumNode not understood; left alone"))
        .ok()
}

impl<'a> ApiNodes<'a> {
    /// The CiliumNodes at the version API discovery finds (waited for until
    /// the CRD serves one podnet understands), written with `params` (the field
    /// manager, whether applies are forced).
    pub async fn resolve(
        client: &kube::Client,
        params: PatchParams,
        metrics: &'a OperatorMetrics,
    ) -> ApiNodes<'a> {
        let resource = resolve_waiting(client, CiliumKind::Node, &|_| {}).await;
        ApiNodes {
            api: Api::all_with(client.clone(), &resource),
            api_version: resource.api_version,
            params,
            metrics,
        }
    }

    /// The CiliumNode apiVersion in use.
    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    /// The CiliumNodes' API, at the same version (for the watch).
    pub fn api(&self) -> Api<DynamicObject> {
        self.api.clone()
    }

    /// Applies `applies` to CiliumNode `name` of `uid` (never to a node
    /// re-created meanwhile), in order; the first that fails stops the rest.
    pub async fn apply_all(&self, name: &str, uid: &str, applies: Vec<NodeApply<'_>>) -> Written {
        let mut written = Written::default();
        for apply in applies {
            match self.apply(name, uid, apply).await {
                Ok(node) => written.objects.extend(node),
                Err(e) => return written.failed(e),
            }
        }
        written
    }

    async fn apply(
        &self,
        name: &str,
        uid: &str,
        apply: NodeApply<'_>,
    ) -> Result<Option<NodeResource>, WriteError> {
        let answer = match apply.part {
            Part::Annotations => {
                // A merge patch takes the field manager but cannot be forced.
                let params = PatchParams {
                    field_manager: self.params.field_manager.clone(),
                    ..Default::default()
                };
                let patch = Patch::Merge(&apply.fields);
                self.api.patch(name, &params, &patch).await
            }
            Part::Spec | Part::Status => {
                let body = apply.body(&self.api_version, name, uid);
                let patch = Patch::Apply(&body);
                match apply.part {
                    Part::Status => self.api.patch_status(name, &self.params, &patch).await,
                    Part::Spec | Part::Annotations => {
                        self.api.patch(name, &self.params, &patch).await
                    }
                }
            }
        };
        let obj = answer.map_err(|e| WriteError::of(name, e))?;
        self.metrics.wrote(apply.what);
        Ok(decoded(&obj))
    }

    /// CiliumNode `name` as the API server has it now (None: gone, or not
    /// understood).
    pub async fn get(&self, name: &str) -> Result<Option<NodeResource>, kube::Error> {
        Ok(self.api.get_opt(name).await?.as_ref().and_then(decoded))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_the_operator_applies_spec_and_status() {
        let spec = NodeApply::spec(json!({"ipam": {"podCIDRs": ["10.0.1.0/24"]}}), "cidrs")
            .checked_at("7");
        assert_eq!(
            serde_json::to_value(spec.body("cilium.io/v2", "n1", "u-1")).unwrap(),
            json!({
                "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                "metadata": {"name": "n1", "uid": "u-1", "resourceVersion": "7"},
                "spec": {"ipam": {"podCIDRs": ["10.0.1.0/24"]}},
            })
        );
        let status = NodeApply::operator_error("");
        assert_eq!(
            serde_json::to_value(status.body("cilium.io/v2", "n1", "u-1")).unwrap(),
            json!({
                "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                "metadata": {"name": "n1", "uid": "u-1"},
                "status": {"ipam": {"operator-status": {"error": ""}}},
            })
        );
    }
}
