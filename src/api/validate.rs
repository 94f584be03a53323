//! What the daemon API accepts as identifiers, checked at the boundary before
//! anything is stored, journaled or logged: container IDs and network names by
//! libcni's rule, interface names by Linux's, pod names as `CNI_ARGS` allows them
//! (the rules live in `cni::validate`, so the plugin and the daemon agree), and
//! owners, pool names and other names as printable, bounded text. A refusal names
//! the field and the rule (a [`Refusal`]); the routes answer it with 400.

use super::models::{CniReport, EndpointBatchDeleteRequest, EndpointChangeRequest, GcRequest};
use crate::cni::validate::{
    MAX_POD_NAME_BYTES, MAX_POD_NAMESPACE_BYTES, MAX_POD_UID_BYTES, excerpt, id_rule_text,
    ifname_problem, is_valid_id, k8s_name_problem, printable_problem,
};

/// Longest owner: a Kubernetes namespace (63) + `/` + pod name (253) is 317.
pub const MAX_OWNER_BYTES: usize = 512;
/// Longest pool name (a Kubernetes object name).
pub const MAX_POOL_BYTES: usize = 253;
/// Longest short name (a CNI verb, a phase, a failure reason, an endpoint state).
pub const MAX_SHORT_NAME_BYTES: usize = 64;
/// Longest netns path (`PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest `GET /v1/endpoint/{id}` and `explain` query (an attachment id with a
/// longest container ID and interface name).
pub const MAX_QUERY_BYTES: usize = 1100;

/// A value the API does not accept: the field and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// `value` is a quoted excerpt of what was sent.
    #[error("invalid {field} {value}: {rule}")]
    Field {
        field: String,
        value: String,
        rule: String,
    },
    #[error("wired-expiration-uuids: {given} given, at most 2 (one per family)")]
    TooManyWiredUuids { given: usize },
}

fn refuse(field: &str, value: &str, why: impl std::fmt::Display) -> Refusal {
    Refusal::Field {
        field: field.to_string(),
        value: excerpt(value),
        rule: why.to_string(),
    }
}

/// A container ID (required): libcni's rule.
pub fn container_id(field: &str, value: &str) -> Result<(), Refusal> {
    if is_valid_id(value) {
        Ok(())
    } else {
        Err(refuse(field, value, id_rule_text()))
    }
}

/// A CNI network name (required): libcni's rule, as for container IDs.
pub fn network(field: &str, value: &str) -> Result<(), Refusal> {
    container_id(field, value)
}

/// An interface name (required): Linux's rule.
pub fn ifname(field: &str, value: &str) -> Result<(), Refusal> {
    match ifname_problem(value) {
        Some(why) => Err(refuse(field, value, why)),
        None => Ok(()),
    }
}

/// Printable text of at most `max` bytes; empty is allowed.
pub fn printable(field: &str, value: &str, max: usize) -> Result<(), Refusal> {
    match printable_problem(value, max) {
        Some(why) => Err(refuse(field, value, why)),
        None => Ok(()),
    }
}

/// A pod's UID (`K8S_POD_UID`): printable, at most [`MAX_POD_UID_BYTES`].
pub fn pod_uid(field: &str, value: &str) -> Result<(), Refusal> {
    printable(field, value, MAX_POD_UID_BYTES)
}

/// An allocation's owner (`namespace/pod` or a container ID); empty is allowed.
pub fn owner(value: &str) -> Result<(), Refusal> {
    printable("owner", value, MAX_OWNER_BYTES)
}

/// A pool name; empty (the default pool) is allowed.
pub fn pool(field: &str, value: &str) -> Result<(), Refusal> {
    printable(field, value, MAX_POOL_BYTES)
}

/// Runs `check` on `value` unless it is empty (an optional field).
pub fn optional(
    value: &str,
    check: impl FnOnce(&str) -> Result<(), Refusal>,
) -> Result<(), Refusal> {
    if value.is_empty() {
        Ok(())
    } else {
        check(value)
    }
}

fn k8s_name(field: &str, value: &str, max: usize) -> Result<(), Refusal> {
    match k8s_name_problem(value, max) {
        Some(why) => Err(refuse(field, value, why)),
        None => Ok(()),
    }
}

/// `PUT /v1/endpoint/{id}`: the attachment, the pod's names and the host link.
pub fn endpoint_change(req: &EndpointChangeRequest) -> Result<(), Refusal> {
    container_id("container-id", &req.container_id)?;
    optional(&req.container_interface_name, |v| {
        ifname("container-interface-name", v)
    })?;
    optional(&req.k8s_pod_name, |v| {
        k8s_name("k8s-pod-name", v, MAX_POD_NAME_BYTES)
    })?;
    optional(&req.k8s_namespace, |v| {
        k8s_name("k8s-namespace", v, MAX_POD_NAMESPACE_BYTES)
    })?;
    pod_uid("k8s-uid", &req.k8s_uid)?;
    optional(&req.interface_name, |v| ifname("interface-name", v))?;
    printable(
        "container-netns-path",
        &req.container_netns_path,
        MAX_PATH_BYTES,
    )?;
    printable("state", &req.state, MAX_SHORT_NAME_BYTES)?;
    pool("addressing.ipv4-pool-name", &req.addressing.ipv4_pool_name)?;
    pool("addressing.ipv6-pool-name", &req.addressing.ipv6_pool_name)?;
    req.podnet_phases
        .keys()
        .try_for_each(|p| printable("podnet-phases", p, MAX_SHORT_NAME_BYTES))
}

/// `DELETE /v1/endpoint`: the attachment and the host links to delete.
pub fn endpoint_delete(req: &EndpointBatchDeleteRequest) -> Result<(), Refusal> {
    container_id("container-id", &req.container_id)?;
    optional(&req.container_interface_name, |v| {
        ifname("container-interface-name", v)
    })?;
    req.teardown_links
        .iter()
        .try_for_each(|l| ifname("teardown-links[].name", &l.name))?;
    req.podnet_phases
        .keys()
        .try_for_each(|p| printable("podnet-phases", p, MAX_SHORT_NAME_BYTES))
}

/// `POST /v1/cni/report`: names that become metric labels and explain records.
/// The error text is the plugin's own message and is kept as it is.
pub fn report(r: &CniReport) -> Result<(), Refusal> {
    printable("verb", &r.verb, MAX_SHORT_NAME_BYTES)?;
    printable("reason", &r.reason, MAX_SHORT_NAME_BYTES)?;
    optional(&r.container_id, |v| container_id("container-id", v))?;
    optional(&r.ifname, |v| ifname("ifname", v))?;
    owner(&r.owner)?;
    if r.wired_expiration_uuids.len() > 2 {
        return Err(Refusal::TooManyWiredUuids {
            given: r.wired_expiration_uuids.len(),
        });
    }
    r.wired_expiration_uuids
        .iter()
        .try_for_each(|u| printable("wired-expiration-uuids", u, MAX_SHORT_NAME_BYTES))?;
    r.phases
        .keys()
        .try_for_each(|p| printable("phase", p, MAX_SHORT_NAME_BYTES))
}

/// `POST /v1/cni/gc`: the network whose allocations are collected. The valid
/// attachments are only compared, never stored.
pub fn gc(req: &GcRequest) -> Result<(), Refusal> {
    network("network", &req.network)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::models::LinkRef;

    fn endpoint() -> EndpointChangeRequest {
        EndpointChangeRequest {
            container_id: "0123abc".into(),
            container_interface_name: "eth0".into(),
            k8s_pod_name: "web-0".into(),
            k8s_namespace: "default".into(),
            k8s_uid: "6b1c2a9e-1111-2222-3333-444455556666".into(),
            interface_name: "lxc0123456789ab".into(),
            container_netns_path: "/var/run/netns/cni-1234".into(),
            ..Default::default()
        }
    }

    #[test]
    fn query_values() {
        assert_eq!(owner(""), Ok(()));
        assert_eq!(owner("kube-system/coredns-1"), Ok(()));
        assert_eq!(owner(&"o".repeat(MAX_OWNER_BYTES)), Ok(()));
        let e = owner("x\n2024-01-01T00:00:00Z  INFO forged")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("invalid owner \"x\\n2024") && e.contains("no control characters"),
            "{e}"
        );
        assert!(
            owner("a\0b")
                .unwrap_err()
                .to_string()
                .starts_with("invalid owner \"a\\0b\"")
        );
        assert!(
            owner(&"o".repeat(MAX_OWNER_BYTES + 1))
                .unwrap_err()
                .to_string()
                .contains("at most 512")
        );
        assert_eq!(pool("pool", "mars"), Ok(()));
        assert!(pool("pool", "ma\rs").is_err());
        let e = container_id("container-id", "../../x")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "invalid container-id \"../../x\": it must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$ and be at most 1024 bytes"
        );
        assert!(container_id("container-id", "").is_err());
        assert!(network("network", "podnet-it").is_ok());
        assert!(network("network", "a b").is_err());
        assert!(
            ifname("ifname", "../x")
                .unwrap_err()
                .to_string()
                .ends_with("interface name contains / or : or whitespace")
        );
        assert_eq!(optional("", |v| ifname("ifname", v)), Ok(()));
        assert!(optional(".", |v| ifname("ifname", v)).is_err());
    }

    #[test]
    fn endpoint_requests() {
        assert_eq!(endpoint_change(&endpoint()), Ok(()));
        let minimal = EndpointChangeRequest {
            container_id: "c".into(),
            ..Default::default()
        };
        assert_eq!(endpoint_change(&minimal), Ok(()));
        let timed = EndpointChangeRequest {
            podnet_phases: [("netlink-pod".to_string(), 0.001)].into(),
            ..endpoint()
        };
        assert_eq!(endpoint_change(&timed), Ok(()));
        let cases: Vec<(&str, EndpointChangeRequest)> = vec![
            (
                "container-id",
                EndpointChangeRequest {
                    container_id: "../../x".into(),
                    ..endpoint()
                },
            ),
            ("container-id", EndpointChangeRequest::default()),
            (
                "container-interface-name",
                EndpointChangeRequest {
                    container_interface_name: "eth0\n".into(),
                    ..endpoint()
                },
            ),
            (
                "k8s-pod-name",
                EndpointChangeRequest {
                    k8s_pod_name: "web\nforged".into(),
                    ..endpoint()
                },
            ),
            (
                "k8s-namespace",
                EndpointChangeRequest {
                    k8s_namespace: "n".repeat(64),
                    ..endpoint()
                },
            ),
            (
                "k8s-uid",
                EndpointChangeRequest {
                    k8s_uid: "u\0".into(),
                    ..endpoint()
                },
            ),
            (
                "interface-name",
                EndpointChangeRequest {
                    interface_name: "lxc/../x".into(),
                    ..endpoint()
                },
            ),
            (
                "container-netns-path",
                EndpointChangeRequest {
                    container_netns_path: "/run/netns/a\nb".into(),
                    ..endpoint()
                },
            ),
            (
                "podnet-phases",
                EndpointChangeRequest {
                    podnet_phases: [("net\nlink".to_string(), 0.001)].into(),
                    ..endpoint()
                },
            ),
        ];
        for (field, req) in cases {
            let e = endpoint_change(&req).unwrap_err().to_string();
            assert!(e.starts_with(&format!("invalid {field} ")), "{field}: {e}");
        }
    }

    #[test]
    fn delete_report_and_gc_requests() {
        let mut del = EndpointBatchDeleteRequest {
            container_id: "c1".into(),
            container_interface_name: "eth0".into(),
            teardown_links: vec![LinkRef {
                name: "lxc1".into(),
                index: 7,
            }],
            podnet_phases: [("netlink-lookup".to_string(), 0.001)].into(),
        };
        assert_eq!(endpoint_delete(&del), Ok(()));
        del.podnet_phases.insert("net\nlink".into(), 0.001);
        assert!(
            endpoint_delete(&del)
                .unwrap_err()
                .to_string()
                .starts_with("invalid podnet-phases")
        );
        del.podnet_phases.clear();
        del.teardown_links[0].name = "lxc\n1".into();
        assert!(
            endpoint_delete(&del)
                .unwrap_err()
                .to_string()
                .starts_with("invalid teardown-links[].name")
        );
        del.container_id = "../../x".into();
        assert!(
            endpoint_delete(&del)
                .unwrap_err()
                .to_string()
                .starts_with("invalid container-id")
        );

        let mut r = CniReport {
            verb: "ADD".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
            owner: "default/web-0".into(),
            error: "a message\nover two lines".into(),
            ..Default::default()
        };
        r.phases.insert("total".into(), 0.01);
        assert_eq!(report(&r), Ok(()));
        assert_eq!(report(&CniReport::default()), Ok(()));
        r.phases.insert("to\ntal".into(), 0.01);
        assert!(
            report(&r)
                .unwrap_err()
                .to_string()
                .starts_with("invalid phase")
        );
        r.phases.clear();
        r.owner = "x\0".into();
        assert!(
            report(&r)
                .unwrap_err()
                .to_string()
                .starts_with("invalid owner")
        );

        let mut g = GcRequest {
            network: "podnet-it".into(),
            valid_attachments: Vec::new(),
        };
        assert_eq!(gc(&g), Ok(()));
        g.network = String::new();
        assert!(
            gc(&g)
                .unwrap_err()
                .to_string()
                .starts_with("invalid network \"\"")
        );
    }
}
