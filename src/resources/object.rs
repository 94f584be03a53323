//! The envelope every top-level object podnet reads shares, declared once:
//! [`object`] writes a resource type with `apiVersion`, `kind` and `metadata`
//! first (`null` read as absent), then the type's own fields, then `extra`
//! (every field not modelled, kept so an object written back loses nothing).
//! `CiliumNode` (`cilium_node`) is not declared with it: its envelope fields are
//! required, not read as empty when absent or `null`.

/// Declares a top-level resource type: the envelope around the fields given.
/// Field order on the wire is `apiVersion`, `kind`, `metadata`, the fields in
/// the order written, then what `extra` holds.
macro_rules! object {
    (
        $(#[$attr:meta])*
        pub struct $name:ident {
            $(
                $(#[$field_attr:meta])*
                pub $field:ident: $ty:ty,
            )*
        }
    ) => {
        $(#[$attr])*
        #[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
        pub struct $name {
            #[serde(
                rename = "apiVersion",
                default,
                deserialize_with = "crate::resources::fields::nullable"
            )]
            pub api_version: String,
            #[serde(default, deserialize_with = "crate::resources::fields::nullable")]
            pub kind: String,
            #[serde(default, deserialize_with = "crate::resources::fields::nullable")]
            pub metadata: crate::resources::meta::ObjectMeta,
            $(
                $(#[$field_attr])*
                pub $field: $ty,
            )*
            /// Every field not modelled (`status`, ...), kept for a round trip.
            #[serde(flatten)]
            pub extra: std::collections::BTreeMap<String, serde_json::Value>,
        }
    };
}

pub(super) use object;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::resources::core_v1::{Namespace, Node};
    use crate::resources::decode::decode;
    use crate::resources::lb_ip_pool::CiliumLoadBalancerIPPool;

    #[test]
    fn the_envelope_is_written_first_and_the_rest_last_byte_for_byte() {
        let v = json!({
            "status": {"conditions": []},
            "spec": {"blocks": [{"cidr": "10.0.10.0/24"}]},
            "metadata": {"name": "blue"},
            "kind": "CiliumLoadBalancerIPPool",
            "apiVersion": "cilium.io/v2"
        });
        let pool: CiliumLoadBalancerIPPool = decode(&v).unwrap();
        assert_eq!(
            serde_json::to_string(&pool).unwrap(),
            r#"{"apiVersion":"cilium.io/v2","kind":"CiliumLoadBalancerIPPool","metadata":{"name":"blue"},"spec":{"blocks":[{"cidr":"10.0.10.0/24"}],"disabled":false},"status":{"conditions":[]}}"#
        );
        let node: Node = decode(&json!({"kind": "Node", "metadata": {"name": "n1"}})).unwrap();
        assert_eq!(
            serde_json::to_string(&node).unwrap(),
            r#"{"apiVersion":"","kind":"Node","metadata":{"name":"n1"},"spec":{},"status":{}}"#
        );
    }

    #[test]
    fn a_null_envelope_field_reads_as_absent() {
        let ns: Namespace = decode(&json!({
            "apiVersion": null, "kind": null, "metadata": null, "spec": {"finalizers": ["kubernetes"]}
        }))
        .unwrap();
        assert_eq!(
            ns,
            Namespace {
                extra: [("spec".to_string(), json!({"finalizers": ["kubernetes"]}))].into(),
                ..Namespace::default()
            }
        );
        assert_eq!(
            decode::<Namespace>(&json!({"kind": 1})).unwrap_err(),
            "kind must be a string, not a number (quote it)"
        );
    }
}
