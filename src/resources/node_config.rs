//! `CiliumNodeConfig` (`cilium.io/v2`, and the older `cilium.io/v2alpha1`):
//! agent options for the nodes its `spec.nodeSelector` matches, of which podnet
//! reads `spec.defaults["ipam-default-ip-pool"]`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::LabelSelector;
use super::fields::nullable;
use super::object::object;

/// The current `apiVersion`.
pub const NODE_CONFIG_V2: &str = "cilium.io/v2";
/// The older `apiVersion`, consulted only when no v2 config applies.
pub const NODE_CONFIG_V2ALPHA1: &str = "cilium.io/v2alpha1";
/// The `kind`.
pub const NODE_CONFIG_KIND: &str = "CiliumNodeConfig";

object! {
    /// A `CiliumNodeConfig` (namespaced).
    pub struct CiliumNodeConfig {
        #[serde(default, deserialize_with = "nullable")]
        pub spec: NodeConfigSpec,
    }
}

/// `spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeConfigSpec {
    /// Option name → value (all strings, as in the `cilium-config` ConfigMap).
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub defaults: BTreeMap<String, String>,
    /// Without one the config applies to no node.
    #[serde(
        rename = "nodeSelector",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub node_selector: Option<LabelSelector>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::decode;

    #[test]
    fn reads_defaults_and_selector() {
        let c: CiliumNodeConfig = decode(&serde_json::json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNodeConfig",
            "metadata": {"name": "dc1", "namespace": "kube-system", "generation": 1},
            "spec": {
                "defaults": {"ipam-default-ip-pool": "dc1-pool"},
                "nodeSelector": {"matchLabels": {"topology.kubernetes.io/zone": "dc1"}}
            }
        }))
        .unwrap();
        assert_eq!(c.metadata.namespace.as_deref(), Some("kube-system"));
        assert_eq!(c.spec.defaults["ipam-default-ip-pool"], "dc1-pool");
        assert_eq!(
            c.spec.node_selector.unwrap().match_labels["topology.kubernetes.io/zone"],
            "dc1"
        );
        assert_eq!(c.metadata.extra["generation"], 1);
        let e = decode::<CiliumNodeConfig>(&serde_json::json!({"spec": {"defaults": {"x": true}}}))
            .unwrap_err();
        assert_eq!(
            e,
            "spec.defaults.x must be a string, not a boolean (quote it)"
        );
    }
}
