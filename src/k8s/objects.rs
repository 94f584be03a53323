//! One typed decode: an object as the API server sent it (a `DynamicObject` read
//! at the version discovery chose, or a k8s-openapi type) into podnet's typed
//! resource, with an error that names the object and the field
//! ([`InvalidObject`]); the CiliumNode watch as typed events; the body of a
//! server-side apply ([`ApplyBody`]) and of a status condition ([`condition_json`]).

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::Resource;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::resources::{InvalidObject, NodeResource, decode};

/// Now, to the second, as a condition's `lastTransitionTime`.
fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .unwrap_or_default()
        .to_string()
}

/// A condition as JSON, keeping `old`'s transition time when its status is the same.
pub fn condition_json(
    kind: &str,
    status: &str,
    reason: &str,
    message: &str,
    old: Option<&Value>,
) -> Value {
    let since = old
        .filter(|o| o["status"] == status)
        .and_then(|o| o["lastTransitionTime"].as_str().map(str::to_string))
        .unwrap_or_else(now);
    json!({"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": since})
}

/// The condition of type `kind` in `obj`'s `status.conditions`, if it has one.
pub fn condition_of<'a>(obj: &'a kube::api::DynamicObject, kind: &str) -> Option<&'a Value> {
    obj.data
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// How messages name an object of `kind`: `Kind "namespace/name"` or `Kind "name"`.
fn describe(meta: &kube::api::ObjectMeta, kind: &str) -> String {
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{kind} \"{ns}/{name}\""),
        _ => format!("{kind} \"{name}\""),
    }
}

/// `obj` (of `kind`, for messages) as podnet's typed `T`.
pub fn typed<T, O>(obj: &O, kind: &str) -> Result<T, InvalidObject>
where
    T: DeserializeOwned,
    O: Serialize + Resource,
{
    let invalid = |problem: String| InvalidObject {
        object: describe(obj.meta(), kind),
        problem,
    };
    let value = serde_json::to_value(obj).map_err(|e| invalid(e.to_string()))?;
    decode::<T>(&value).map_err(invalid)
}

/// A list the API server did not answer.
#[derive(Debug, thiserror::Error)]
#[error("listing {kind}s ({version}): {source}")]
pub struct ListError {
    pub kind: &'static str,
    /// The apiVersion listed.
    pub version: String,
    #[source]
    pub source: kube::Error,
}

/// Objects per list request: only one page of whole objects is held at a time,
/// each converted as it arrives.
pub const LIST_PAGE: u32 = 500;

/// Every object `params` selects, [`LIST_PAGE`] at a time (a consistent snapshot:
/// every page is served at the first page's resourceVersion), each turned into
/// what the caller keeps by `keep` (None: left out) as its page arrives. `kind`
/// and `version` name the list in the error.
pub async fn list_pages<K, V>(
    api: &Api<K>,
    params: ListParams,
    kind: &'static str,
    version: &str,
    mut keep: impl FnMut(&K) -> Option<V>,
) -> Result<Vec<V>, ListError>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut params = params.limit(LIST_PAGE);
    let mut kept = Vec::new();
    loop {
        let page = api.list(&params).await.map_err(|source| ListError {
            kind,
            version: version.to_string(),
            source,
        })?;
        kept.extend(page.items.iter().filter_map(&mut keep));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(kept),
        }
    }
}

/// Every object of `resource` (of `kind`) that reads as `T` and that `convert`
/// takes, listed page by page; any other is logged and left out (the others
/// apply).
pub async fn list_valid<T, U, E>(
    client: &kube::Client,
    resource: &ApiResource,
    kind: &'static str,
    convert: impl Fn(&T) -> Result<U, E>,
) -> Result<Vec<U>, ListError>
where
    T: DeserializeOwned,
    E: std::fmt::Display,
{
    let api = Api::<DynamicObject>::all_with(client.clone(), resource);
    list_pages(
        &api,
        ListParams::default(),
        kind,
        &resource.api_version,
        |obj| {
            let checked = typed::<T, _>(obj, kind)
                .map_err(|e| e.to_string())
                .and_then(|t| {
                    convert(&t).map_err(|e| format!("{}: {e}", describe(&obj.metadata, kind)))
                });
            checked
                .inspect_err(|e| tracing::error!(error = %e, "{kind} left out"))
                .ok()
        },
    )
    .await
}

/// The typed node resource of a CiliumNode object.
pub fn node_resource(obj: &DynamicObject) -> Result<NodeResource, InvalidObject> {
    typed(obj, "CiliumNode")
}

/// A CiliumNode watch event with its typed node resource. An object that does
/// not decode is logged and its event left out; a deletion is always kept (it
/// needs only the name).
pub fn node_event(event: Event<DynamicObject>) -> Option<Event<NodeResource>> {
    let read = |obj: &DynamicObject| {
        node_resource(obj)
            .inspect_err(|e| tracing::error!(error = %e, "CiliumNode not understood; left alone"))
            .ok()
    };
    Some(match event {
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
        Event::InitApply(obj) => Event::InitApply(read(&obj)?),
        Event::Apply(obj) => Event::Apply(read(&obj)?),
        Event::Delete(obj) => Event::Delete(node_resource(&obj).unwrap_or_else(|_| {
            NodeResource::new(obj.metadata.name.as_deref().unwrap_or_default())
        })),
    })
}

/// Every CiliumNode `api` and `config` select, watched as typed events
/// (relists and API-server restarts survived with kube's default backoff).
/// Every object of kind `K` in the cluster, watched and retried with kube's
/// backoff.
pub fn watch_all<K>(
    client: &kube::Client,
) -> impl futures::Stream<Item = Result<Event<K>, watcher::Error>> + use<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + DeserializeOwned + Send + 'static,
{
    watch(Api::<K>::all(client.clone()), watcher::Config::default()).default_backoff()
}

pub fn watch_nodes(
    api: Api<DynamicObject>,
    config: watcher::Config,
) -> BoxStream<'static, Result<Event<NodeResource>, watcher::Error>> {
    watch(api, config)
        .default_backoff()
        .filter_map(|item| {
            std::future::ready(match item {
                Ok(event) => node_event(event).map(Ok),
                Err(e) => Some(Err(e)),
            })
        })
        .boxed()
}

/// The body of a server-side apply: the object's identity, the preconditions
/// the write carries (UID, resourceVersion), and the fields the manager owns.
/// Apply owns exactly the fields it sends: what the body leaves out, the
/// manager gives up.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct ApplyBody(serde_json::Value);

impl ApplyBody {
    /// An object of `kind` at `api_version`, named `name`.
    pub fn new(api_version: &str, kind: &str, name: &str) -> ApplyBody {
        ApplyBody(serde_json::json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {"name": name},
        }))
    }

    /// Only the object of this UID may be written (not one re-created meanwhile).
    pub fn uid(self, uid: &str) -> ApplyBody {
        self.meta("uid", uid.into())
    }

    /// Only the object as of this resourceVersion may be written.
    pub fn resource_version(self, rv: &str) -> ApplyBody {
        self.meta("resourceVersion", rv.into())
    }

    /// Owned by the object of `kind` (at `api_version`) named `name` of `uid`:
    /// deleting that object deletes this one.
    pub fn owned_by(self, api_version: &str, kind: &str, name: &str, uid: &str) -> ApplyBody {
        let owner = serde_json::json!([{
            "apiVersion": api_version,
            "kind": kind,
            "name": name,
            "uid": uid,
        }]);
        self.meta("ownerReferences", owner)
    }

    /// Sets `metadata.<field>`.
    pub fn meta(mut self, field: &str, value: serde_json::Value) -> ApplyBody {
        self.0["metadata"][field] = value;
        self
    }

    /// Sets the top-level `field` (`spec`, `status`) to `value`.
    pub fn with(mut self, field: &str, value: serde_json::Value) -> ApplyBody {
        self.0[field] = value;
        self
    }

    /// The body as JSON.
    pub fn value(&self) -> &serde_json::Value {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn an_apply_body_carries_identity_preconditions_and_the_owned_fields() {
        let body = ApplyBody::new("cilium.io/v2", "CiliumNode", "n1")
            .uid("u-1")
            .resource_version("7")
            .with("spec", json!({"ipam": {"podCIDRs": ["10.0.1.0/24"]}}));
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            json!({
                "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                "metadata": {"name": "n1", "uid": "u-1", "resourceVersion": "7"},
                "spec": {"ipam": {"podCIDRs": ["10.0.1.0/24"]}},
            })
        );
    }

    #[test]
    fn an_apply_body_names_its_owner() {
        let body = ApplyBody::new("v1", "ConfigMap", "c").owned_by("v1", "Node", "n1", "u-1");
        assert_eq!(
            body.value()["metadata"],
            json!({"name": "c", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u-1"}
            ]})
        );
    }

    #[test]
    fn a_node_decodes_once_with_its_uid_and_a_bad_one_names_the_field() {
        let obj = object(json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
            "metadata": {"name": "n1", "uid": "u-1"},
            "spec": {"ipam": {"podCIDRs": ["10.0.1.0/24"]}},
        }));
        let node = node_resource(&obj).unwrap();
        assert_eq!(node.metadata.uid(), "u-1");
        assert_eq!(node.spec.ipam.pod_cidrs.len(), 1);
        let bad = object(json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
            "metadata": {"name": "n2"},
            "spec": {"ipam": {"podCIDRs": ["10.0.1.0/33"]}},
        }));
        let e = node_resource(&bad).unwrap_err();
        assert_eq!(e.object, "CiliumNode \"n2\"");
        assert!(e.problem.starts_with("spec.ipam.podCIDRs[0]"), "{e}");
        assert!(node_event(Event::Apply(bad.clone())).is_none());
        match node_event(Event::Delete(bad)) {
            Some(Event::Delete(n)) => assert_eq!(n.metadata.name, "n2"),
            other => panic!("{other:?}"),
        }
    }
}
