//! The node's default pool from `CiliumNodeConfig` objects: the checked form of
//! one ([`NodeConfigDef`], `TryFrom<&CiliumNodeConfig>`) and Cilium's resolution
//! over all of them ([`node_default_pool`], `pkg/option/resolver`).

use std::collections::BTreeMap;

use super::pooldef::check_selector;
use super::selection::selector_matches;
use crate::resources::{
    CiliumNodeConfig, InvalidObject, LabelSelector, NODE_CONFIG_KIND, NODE_CONFIG_V2,
    NODE_CONFIG_V2ALPHA1,
};

/// The `CiliumNodeConfig` `spec.defaults` key holding the node's default pool.
pub const KEY_DEFAULT_POOL: &str = "ipam-default-ip-pool";

/// A `CiliumNodeConfig`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfigDef {
    pub name: String,
    /// `cilium.io/v2` (else `v2alpha1`).
    pub v2: bool,
    pub node_selector: Option<LabelSelector>,
    pub defaults: BTreeMap<String, String>,
}

/// A config needs a name, `apiVersion` v2 or v2alpha1, a non-empty
/// `ipam-default-ip-pool` when it sets one, and a node selector with valid
/// operators. The object's namespace is not checked.
impl TryFrom<&CiliumNodeConfig> for NodeConfigDef {
    type Error = InvalidObject;

    fn try_from(config: &CiliumNodeConfig) -> Result<NodeConfigDef, InvalidObject> {
        let invalid = |problem: String| InvalidObject {
            object: config.metadata.describe(NODE_CONFIG_KIND),
            problem,
        };
        let v2 = match config.api_version.as_str() {
            NODE_CONFIG_V2 => true,
            NODE_CONFIG_V2ALPHA1 => false,
            other => {
                return Err(invalid(format!(
                    "unsupported apiVersion {other:?} (expected {NODE_CONFIG_V2})"
                )));
            }
        };
        if config.metadata.name.is_empty() {
            return Err(invalid("metadata.name is missing".into()));
        }
        let spec = &config.spec;
        if spec
            .defaults
            .get(KEY_DEFAULT_POOL)
            .is_some_and(String::is_empty)
        {
            return Err(invalid(format!(
                "spec.defaults.{KEY_DEFAULT_POOL} is empty"
            )));
        }
        if let Some(s) = &spec.node_selector {
            check_selector(s, "spec.nodeSelector").map_err(|e| invalid(e.to_string()))?;
        }
        Ok(NodeConfigDef {
            name: config.metadata.name.clone(),
            v2,
            node_selector: spec.node_selector.clone(),
            defaults: spec.defaults.clone(),
        })
    }
}

/// The node's default pool (`spec.defaults["ipam-default-ip-pool"]`), or `None`.
/// Cilium's resolution: configs with empty `defaults` or no `nodeSelector` do not
/// apply; matching ones apply in name order (later wins); if any `cilium.io/v2`
/// config applies, `v2alpha1` ones are not consulted.
pub fn node_default_pool(
    configs: &[NodeConfigDef],
    node_labels: &BTreeMap<String, String>,
) -> Option<String> {
    let mut matching: Vec<&NodeConfigDef> = configs
        .iter()
        .filter(|c| !c.defaults.is_empty())
        .filter(|c| {
            c.node_selector
                .as_ref()
                .is_some_and(|s| selector_matches(s, node_labels))
        })
        .collect();
    if matching.iter().any(|c| c.v2) {
        matching.retain(|c| c.v2);
    }
    matching.sort_by(|a, b| a.name.cmp(&b.name));
    matching
        .iter()
        .rev()
        .find_map(|c| c.defaults.get(KEY_DEFAULT_POOL).cloned())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources::decode;

    fn config(api_version: &str, name: &str, spec: serde_json::Value) -> CiliumNodeConfig {
        decode(&json!({
            "apiVersion": api_version,
            "kind": "CiliumNodeConfig",
            "metadata": {"name": name, "namespace": "kube-system"},
            "spec": spec
        }))
        .unwrap()
    }

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn resolution() {
        let defs: Vec<NodeConfigDef> = [
            config(
                "cilium.io/v2",
                "b",
                json!({"defaults": {KEY_DEFAULT_POOL: "b-pool"},
                "nodeSelector": {"matchLabels": {"zone": "dc1"}}}),
            ),
            config(
                "cilium.io/v2",
                "a",
                json!({"defaults": {KEY_DEFAULT_POOL: "a-pool"},
                "nodeSelector": {}}),
            ),
            config(
                "cilium.io/v2alpha1",
                "z",
                json!({"defaults": {KEY_DEFAULT_POOL: "old"},
                "nodeSelector": {"matchLabels": {"old": "yes"}}}),
            ),
            config(
                "cilium.io/v2",
                "c",
                json!({"defaults": {KEY_DEFAULT_POOL: "never"}}),
            ),
        ]
        .iter()
        .map(|c| NodeConfigDef::try_from(c).unwrap())
        .collect();
        assert_eq!(
            node_default_pool(&defs, &labels(&[("zone", "dc1")])),
            Some("b-pool".into())
        );
        assert_eq!(
            node_default_pool(&defs, &labels(&[])),
            Some("a-pool".into())
        );
        // A v2 config applies (a), so the v2alpha1 one is not consulted.
        assert_eq!(
            node_default_pool(&defs, &labels(&[("old", "yes")])),
            Some("a-pool".into())
        );
        assert_eq!(
            node_default_pool(&defs[2..], &labels(&[("old", "yes")])),
            Some("old".into())
        );
        assert_eq!(node_default_pool(&defs[3..], &labels(&[])), None);
    }

    #[test]
    fn errors_name_the_config_and_the_field() {
        let err = |c: CiliumNodeConfig| NodeConfigDef::try_from(&c).unwrap_err().to_string();
        assert_eq!(
            err(config(
                "cilium.io/v2",
                "e",
                json!({"defaults": {KEY_DEFAULT_POOL: ""}})
            )),
            "CiliumNodeConfig \"kube-system/e\": spec.defaults.ipam-default-ip-pool is empty"
        );
        assert_eq!(
            err(config(
                "cilium.io/v2",
                "s",
                json!({"nodeSelector": {"matchExpressions": [
                {"key": "gpu", "operator": "Gt", "values": ["1"]}]}})
            )),
            "CiliumNodeConfig \"kube-system/s\": spec.nodeSelector.matchExpressions[0].operator \
             \"Gt\" is not one of In, NotIn, Exists, DoesNotExist"
        );
        assert_eq!(
            err(config("v1", "v", json!({}))),
            "CiliumNodeConfig \"kube-system/v\": unsupported apiVersion \"v1\" (expected cilium.io/v2)"
        );
        assert_eq!(
            err(config("cilium.io/v2", "", json!({}))),
            "CiliumNodeConfig (unnamed): metadata.name is missing"
        );
    }
}
