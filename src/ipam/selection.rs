//! Multi-pool pool selection: which pool a pod's address of one family comes from
//! when the request names no pool. Pure logic over a [`MetadataSource`] (pods and
//! namespaces) and the known pools; follows Cilium 1.20
//! `pkg/ipam/metadata/manager.go` (`GetIPPoolForPod`) exactly, including its error
//! texts.
//!
//! Precedence for an owner `namespace/name`:
//! 1. owner not `ns/name` with both parts valid DNS-1123 subdomains: default pool;
//! 2. pod annotation `ipam.cilium.io/ipv4-pool` / `ipv6-pool`, then
//!    `ipam.cilium.io/ip-pool` (empty values ignored);
//! 3. the same keys on the pod's namespace;
//! 4. `CiliumPodIPPool` `podSelector` / `namespaceSelector` (exactly one pool must
//!    match; none falls through unless `ipam.cilium.io/require-pool-match: "true"`);
//! 5. the default pool.

use std::collections::BTreeMap;
use std::fmt;

use super::Family;
use super::pooldef::PoolDef;
use crate::resources::{InvalidObject, LabelSelector, Namespace, Pod};

/// Pod (and namespace) annotation naming the pool for both families.
pub const ANNOTATION_IP_POOL: &str = "ipam.cilium.io/ip-pool";
/// Pod (and namespace) annotation naming the IPv4 pool; beats [`ANNOTATION_IP_POOL`].
pub const ANNOTATION_IPV4_POOL: &str = "ipam.cilium.io/ipv4-pool";
/// Pod (and namespace) annotation naming the IPv6 pool; beats [`ANNOTATION_IP_POOL`].
pub const ANNOTATION_IPV6_POOL: &str = "ipam.cilium.io/ipv6-pool";
/// `"true"` on the pod or namespace: no selector match is an error, not the default pool.
pub const ANNOTATION_REQUIRE_POOL_MATCH: &str = "ipam.cilium.io/require-pool-match";
/// A key some upstream tutorial text uses by mistake; Cilium ignores it.
pub const ANNOTATION_MISSPELLED_POOL: &str = "ipam.cilium.io/ipam-pool";
/// Synthetic pod label holding the pod's namespace (for `podSelector`).
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Synthetic pod label holding the pod's name (for `podSelector`).
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// The label the API server puts on every namespace (added when an object lacks it).
pub const LABEL_NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";

/// What pool selection (and sticky addresses) need to know about a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodMeta {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The owner reference with `controller: true`, if any.
    pub controller: Option<PodController>,
}

/// A pod's controlling owner (`metadata.ownerReferences[]` with `controller: true`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodController {
    pub api_version: String,
    pub kind: String,
    pub name: String,
}

impl PodController {
    /// The controller of `refs` as (apiVersion, kind, name, controller) tuples.
    pub fn of<'a>(
        refs: impl IntoIterator<Item = (&'a str, &'a str, &'a str, Option<bool>)>,
    ) -> Option<PodController> {
        refs.into_iter()
            .find(|(.., controller)| *controller == Some(true))
            .map(|(api_version, kind, name, _)| PodController {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
                name: name.to_string(),
            })
    }
}

/// What pool selection needs to know about a namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceMeta {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// A pod needs a name; without `metadata.namespace` it is in `default`.
impl TryFrom<&Pod> for PodMeta {
    type Error = InvalidObject;

    fn try_from(pod: &Pod) -> Result<PodMeta, InvalidObject> {
        let meta = &pod.metadata;
        let invalid = |problem: &str| InvalidObject {
            object: meta.describe("Pod"),
            problem: problem.to_string(),
        };
        if meta.name.is_empty() {
            return Err(invalid("metadata.name is missing"));
        }
        let namespace = match meta.namespace.as_deref() {
            None => "default",
            Some("") => return Err(invalid("metadata.namespace must be a non-empty string")),
            Some(ns) => ns,
        };
        Ok(PodMeta {
            namespace: namespace.to_string(),
            name: meta.name.clone(),
            labels: meta.labels.clone(),
            annotations: meta.annotations.clone(),
            controller: PodController::of(meta.owner_references.iter().map(|r| {
                (
                    r.api_version.as_str(),
                    r.kind.as_str(),
                    r.name.as_str(),
                    r.controller,
                )
            })),
        })
    }
}

/// A namespace needs a name; it gets the [`LABEL_NAMESPACE_NAME`] label the API
/// server always sets, when missing.
impl TryFrom<&Namespace> for NamespaceMeta {
    type Error = InvalidObject;

    fn try_from(ns: &Namespace) -> Result<NamespaceMeta, InvalidObject> {
        let meta = &ns.metadata;
        if meta.name.is_empty() {
            return Err(InvalidObject {
                object: meta.describe("Namespace"),
                problem: "metadata.name is missing".into(),
            });
        }
        let mut labels = meta.labels.clone();
        labels
            .entry(LABEL_NAMESPACE_NAME.to_string())
            .or_insert_with(|| meta.name.clone());
        Ok(NamespaceMeta {
            name: meta.name.clone(),
            labels,
            annotations: meta.annotations.clone(),
        })
    }
}

/// Where pods and namespaces are looked up (manifests in embedded mode, the
/// Kubernetes API otherwise).
pub trait MetadataSource {
    fn pod(&self, namespace: &str, name: &str) -> Option<PodMeta>;
    fn namespace(&self, name: &str) -> Option<NamespaceMeta>;
    /// False while the source has not seen its initial state (a watch that has
    /// not listed yet): a missing Pod then means "not yet", not "does not exist".
    fn synced(&self) -> bool;
}

/// Which precedence step chose the pool (for `podnet explain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// A pool annotation on the pod.
    PodAnnotation,
    /// A pool annotation on the pod's namespace.
    NamespaceAnnotation,
    /// Exactly one `CiliumPodIPPool` selector matched.
    Selector,
    /// Nothing else applied (also: the owner is not a `namespace/name` pod).
    Default,
}

impl Step {
    /// Short stable name: `pod-annotation`, `namespace-annotation`, `selector`, `default`.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::PodAnnotation => "pod-annotation",
            Step::NamespaceAnnotation => "namespace-annotation",
            Step::Selector => "selector",
            Step::Default => "default",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where `ipam.cilium.io/require-pool-match` was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequireMatchOn {
    Pod,
    Namespace,
}

impl fmt::Display for RequireMatchOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RequireMatchOn::Pod => "pod",
            RequireMatchOn::Namespace => "namespace",
        })
    }
}

/// Why no pool could be chosen. The texts are Cilium's; the IPAM layer wraps them as
/// `unable to determine IPAM pool for owner "<owner>": <err>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectionError {
    #[error("pod and namespace metadata is not synced yet; try again")]
    NotSynced,
    #[error("resource Pod \"{namespace}/{name}\" not found")]
    PodNotFound { namespace: String, name: String },
    #[error("resource Namespace \"{namespace}\" not found")]
    NamespaceNotFound { namespace: String },
    #[error(
        "no matching CiliumPodIPPool found for pod {owner} (family={}) and \
         require-pool-match annotation is set on {on}",
        family.as_str()
    )]
    NoMatchRequired {
        owner: String,
        family: Family,
        on: RequireMatchOn,
    },
    #[error(
        "multiple CiliumPodIPPools match pod {owner} (family={}): [{}]",
        family.as_str(),
        pools.join(" ")
    )]
    MultipleMatches {
        owner: String,
        family: Family,
        pools: Vec<String>,
    },
}

/// The chosen pool, the step that chose it, and warnings for the caller to log
/// (the misspelled `ipam.cilium.io/ipam-pool` key, which has no effect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectionOutcome {
    pub pool: String,
    pub step: Step,
    pub warnings: Vec<String>,
}

/// Kubernetes label-selector semantics: every `matchLabels` entry and every
/// expression must hold. `In` / `NotIn` need at least one value and `Exists` /
/// `DoesNotExist` none (otherwise the selector is invalid, as in
/// `LabelSelectorAsSelector`, and matches nothing); `NotIn` holds when the key is
/// absent; an unknown operator matches nothing; an empty selector matches everything.
pub fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = sel
        .match_labels
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v));
    labels_ok
        && sel.match_expressions.iter().all(|req| {
            let value = labels.get(&req.key);
            match req.operator.as_str() {
                "In" => !req.values.is_empty() && value.is_some_and(|v| req.values.contains(v)),
                "NotIn" => !req.values.is_empty() && value.is_none_or(|v| !req.values.contains(v)),
                "Exists" => req.values.is_empty() && value.is_some(),
                "DoesNotExist" => req.values.is_empty() && value.is_none(),
                _ => false,
            }
        })
}

/// Whether `s` is a DNS-1123 subdomain (Kubernetes `IsDNS1123Subdomain`): at most
/// 253 characters, dot-separated labels of `[a-z0-9-]` starting and ending with
/// `[a-z0-9]`.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            !b.is_empty()
                && alnum(&b[0])
                && alnum(&b[b.len() - 1])
                && b.iter().all(|c| alnum(c) || *c == b'-')
        })
}

/// Splits `namespace/name` when both parts are DNS-1123 subdomains (Cilium
/// `splitK8sPodName`: cut at the first `/`).
pub fn split_pod_owner(owner: &str) -> Option<(&str, &str)> {
    let (ns, name) = owner.split_once('/')?;
    (is_dns1123_subdomain(ns) && is_dns1123_subdomain(name)).then_some((ns, name))
}

fn pool_by_annotations(annotations: &BTreeMap<String, String>, family: Family) -> Option<&str> {
    let family_key = match family {
        Family::V4 => ANNOTATION_IPV4_POOL,
        Family::V6 => ANNOTATION_IPV6_POOL,
    };
    [family_key, ANNOTATION_IP_POOL]
        .into_iter()
        .filter_map(|k| annotations.get(k))
        .find(|v| !v.is_empty())
        .map(String::as_str)
}

fn misspelled_warning(
    what: &str,
    id: &str,
    annotations: &BTreeMap<String, String>,
    warnings: &mut Vec<String>,
) {
    if let Some(v) = annotations.get(ANNOTATION_MISSPELLED_POOL) {
        warnings.push(format!(
            "{what} {id} has annotation {ANNOTATION_MISSPELLED_POOL}={v:?}, which is ignored; \
             the key is {ANNOTATION_IP_POOL}"
        ));
    }
}

fn requires_match(annotations: &BTreeMap<String, String>) -> bool {
    annotations
        .get(ANNOTATION_REQUIRE_POOL_MATCH)
        .map(String::as_str)
        == Some("true")
}

/// Chooses the pool for `owner`'s address of `family` (Cilium `GetIPPoolForPod`).
/// `default_pool` is `ipam-default-ip-pool`, possibly overridden for this node by a
/// `CiliumNodeConfig`. Annotation values are returned as written (whether the pool
/// exists is the allocator's concern, as in Cilium).
pub fn select_pool(
    owner: &str,
    family: Family,
    pools: &[PoolDef],
    meta: &dyn MetadataSource,
    default_pool: &str,
) -> Result<SelectionOutcome, SelectionError> {
    let mut warnings = Vec::new();
    let done = |pool: &str, step: Step, warnings: Vec<String>| {
        Ok(SelectionOutcome {
            pool: pool.to_string(),
            step,
            warnings,
        })
    };
    let Some((ns, name)) = split_pod_owner(owner) else {
        return done(default_pool, Step::Default, warnings);
    };

    let Some(pod) = meta.pod(ns, name) else {
        if !meta.synced() {
            return Err(SelectionError::NotSynced);
        }
        return Err(SelectionError::PodNotFound {
            namespace: ns.to_string(),
            name: name.to_string(),
        });
    };
    misspelled_warning("pod", owner, &pod.annotations, &mut warnings);
    if let Some(pool) = pool_by_annotations(&pod.annotations, family) {
        return done(pool, Step::PodAnnotation, warnings);
    }

    let Some(namespace) = meta.namespace(ns) else {
        return Err(SelectionError::NamespaceNotFound {
            namespace: ns.to_string(),
        });
    };
    misspelled_warning("namespace", ns, &namespace.annotations, &mut warnings);
    if let Some(pool) = pool_by_annotations(&namespace.annotations, family) {
        return done(pool, Step::NamespaceAnnotation, warnings);
    }

    let mut pod_labels = pod.labels.clone();
    pod_labels.insert(LABEL_POD_NAMESPACE.to_string(), ns.to_string());
    pod_labels.insert(LABEL_POD_NAME.to_string(), name.to_string());
    let mut matches: Vec<&str> = pools
        .iter()
        .filter(|p| p.family(family).is_some())
        .filter(|p| p.pod_selector.is_some() || p.namespace_selector.is_some())
        .filter(|p| {
            p.pod_selector
                .as_ref()
                .is_none_or(|s| selector_matches(s, &pod_labels))
                && p.namespace_selector
                    .as_ref()
                    .is_none_or(|s| selector_matches(s, &namespace.labels))
        })
        .map(|p| p.name.as_str())
        .collect();
    matches.sort_unstable();
    matches.dedup();

    match matches.as_slice() {
        [] => {
            let on = if requires_match(&pod.annotations) {
                Some(RequireMatchOn::Pod)
            } else if requires_match(&namespace.annotations) {
                Some(RequireMatchOn::Namespace)
            } else {
                None
            };
            match on {
                Some(on) => Err(SelectionError::NoMatchRequired {
                    owner: owner.to_string(),
                    family,
                    on,
                }),
                None => done(default_pool, Step::Default, warnings),
            }
        }
        [one] => done(one, Step::Selector, warnings),
        many => Err(SelectionError::MultipleMatches {
            owner: owner.to_string(),
            family,
            pools: many.iter().map(|s| s.to_string()).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::pooldef::PoolFamilySpec;
    use crate::resources::LabelSelectorRequirement;

    #[derive(Default)]
    struct Meta {
        pods: Vec<PodMeta>,
        namespaces: Vec<NamespaceMeta>,
        /// A watch that has not listed yet.
        not_synced: bool,
    }

    impl MetadataSource for Meta {
        fn pod(&self, ns: &str, name: &str) -> Option<PodMeta> {
            self.pods
                .iter()
                .find(|p| p.namespace == ns && p.name == name)
                .cloned()
        }
        fn namespace(&self, name: &str) -> Option<NamespaceMeta> {
            self.namespaces.iter().find(|n| n.name == name).cloned()
        }
        fn synced(&self) -> bool {
            !self.not_synced
        }
    }

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn pod(ns: &str, name: &str, labels: &[(&str, &str)], ann: &[(&str, &str)]) -> PodMeta {
        PodMeta {
            namespace: ns.into(),
            name: name.into(),
            labels: map(labels),
            annotations: map(ann),
            controller: None,
        }
    }

    fn ns(name: &str, labels: &[(&str, &str)], ann: &[(&str, &str)]) -> NamespaceMeta {
        NamespaceMeta {
            name: name.into(),
            labels: map(labels),
            annotations: map(ann),
        }
    }

    fn fam(cidr: &str, mask: u8) -> Option<PoolFamilySpec> {
        Some(PoolFamilySpec {
            cidrs: vec![cidr.parse().unwrap()],
            mask_size: mask,
            reserved_ranges: vec![],
        })
    }

    fn sel(labels: &[(&str, &str)]) -> Option<LabelSelector> {
        Some(LabelSelector {
            match_labels: map(labels),
            match_expressions: vec![],
        })
    }

    fn pool(name: &str, pod_sel: Option<LabelSelector>, ns_sel: Option<LabelSelector>) -> PoolDef {
        PoolDef {
            name: name.into(),
            ipv4: fam("10.0.0.0/16", 24),
            ipv6: fam("fd00::/104", 120),
            pod_selector: pod_sel,
            namespace_selector: ns_sel,
            ..Default::default()
        }
    }

    fn meta_with(p: PodMeta, n: NamespaceMeta) -> Meta {
        Meta {
            pods: vec![p],
            namespaces: vec![n],
            not_synced: false,
        }
    }

    fn sel_ok(owner: &str, f: Family, pools: &[PoolDef], m: &Meta) -> (String, Step) {
        let o = select_pool(owner, f, pools, m, "default").unwrap();
        (o.pool, o.step)
    }

    fn sel_err(owner: &str, f: Family, pools: &[PoolDef], m: &Meta) -> String {
        select_pool(owner, f, pools, m, "default")
            .unwrap_err()
            .to_string()
    }

    fn r(p: &str, s: Step) -> (String, Step) {
        (p.to_string(), s)
    }

    // ---- selector semantics ----

    fn req(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: values.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn exprs(reqs: Vec<LabelSelectorRequirement>) -> LabelSelector {
        LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: reqs,
        }
    }

    #[test]
    fn empty_selector_matches_everything() {
        assert!(selector_matches(&LabelSelector::default(), &map(&[])));
        assert!(selector_matches(
            &LabelSelector::default(),
            &map(&[("a", "b")])
        ));
    }

    #[test]
    fn match_labels_all_must_match() {
        let s = sel(&[("a", "1"), ("b", "2")]).unwrap();
        assert!(selector_matches(
            &s,
            &map(&[("a", "1"), ("b", "2"), ("c", "3")])
        ));
        assert!(!selector_matches(&s, &map(&[("a", "1")])));
        assert!(!selector_matches(&s, &map(&[("a", "1"), ("b", "3")])));
    }

    #[test]
    fn expression_operators() {
        let l = map(&[("env", "prod"), ("tier", "web")]);
        assert!(selector_matches(
            &exprs(vec![req("env", "In", &["prod", "dev"])]),
            &l
        ));
        assert!(!selector_matches(
            &exprs(vec![req("env", "In", &["dev"])]),
            &l
        ));
        assert!(!selector_matches(
            &exprs(vec![req("zone", "In", &["a"])]),
            &l
        ));
        assert!(selector_matches(
            &exprs(vec![req("env", "NotIn", &["dev"])]),
            &l
        ));
        assert!(!selector_matches(
            &exprs(vec![req("env", "NotIn", &["prod"])]),
            &l
        ));
        assert!(selector_matches(
            &exprs(vec![req("zone", "NotIn", &["a"])]),
            &l
        ));
        assert!(selector_matches(
            &exprs(vec![req("env", "Exists", &[])]),
            &l
        ));
        assert!(!selector_matches(
            &exprs(vec![req("zone", "Exists", &[])]),
            &l
        ));
        assert!(selector_matches(
            &exprs(vec![req("zone", "DoesNotExist", &[])]),
            &l
        ));
        assert!(!selector_matches(
            &exprs(vec![req("env", "DoesNotExist", &[])]),
            &l
        ));
        // Unknown operator and invalid forms match nothing.
        assert!(!selector_matches(
            &exprs(vec![req("env", "Gt", &["1"])]),
            &l
        ));
        assert!(!selector_matches(
            &exprs(vec![req("env", "in", &["prod"])]),
            &l
        ));
        assert!(!selector_matches(
            &exprs(vec![req("zone", "NotIn", &[])]),
            &l
        ));
        assert!(!selector_matches(
            &exprs(vec![req("env", "Exists", &["prod"])]),
            &l
        ));
        // All expressions AND matchLabels.
        let mut s = exprs(vec![
            req("env", "In", &["prod"]),
            req("tier", "Exists", &[]),
        ]);
        assert!(selector_matches(&s, &l));
        s.match_labels = map(&[("tier", "db")]);
        assert!(!selector_matches(&s, &l));
    }

    #[test]
    fn dns1123() {
        for ok in [
            "a",
            "default",
            "kube-system",
            "a.b-c.d",
            "0abc",
            &"a".repeat(253),
        ] {
            assert!(is_dns1123_subdomain(ok), "{ok}");
        }
        for bad in [
            "",
            "A",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a.",
            "a_b",
            "a b",
            &"a".repeat(254),
        ] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
    }

    // ---- precedence ----

    #[test]
    fn owner_not_a_pod_gives_default_without_lookups() {
        let m = Meta::default(); // nothing exists: any lookup would fail
        for owner in [
            "", "/", "noslash", "ns/", "/name", "NS/name", "ns/Name", "ns/a_b", "a/b/c",
        ] {
            let o = select_pool(owner, Family::V4, &[], &m, "node-default").unwrap();
            assert_eq!(
                (o.pool.as_str(), o.step),
                ("node-default", Step::Default),
                "{owner}"
            );
        }
    }

    #[test]
    fn a_source_that_has_not_synced_says_try_again_not_missing() {
        let m = Meta {
            not_synced: true,
            ..Meta::default()
        };
        let e = select_pool("ns1/p", Family::V4, &[], &m, "default").unwrap_err();
        assert!(matches!(e, SelectionError::NotSynced), "{e}");
    }

    #[test]
    fn missing_pod_and_namespace() {
        let m = Meta::default();
        assert_eq!(
            sel_err("ns1/p", Family::V4, &[], &m),
            r#"resource Pod "ns1/p" not found"#
        );
        let m = Meta {
            pods: vec![pod("ns1", "p", &[], &[])],
            namespaces: vec![],
            not_synced: false,
        };
        assert_eq!(
            sel_err("ns1/p", Family::V6, &[], &m),
            r#"resource Namespace "ns1" not found"#
        );
    }

    #[test]
    fn pod_annotation_found_before_namespace_lookup() {
        // A pod annotation wins even when the namespace is missing.
        let m = Meta {
            pods: vec![pod("ns1", "p", &[], &[(ANNOTATION_IP_POOL, "mars")])],
            namespaces: vec![],
            not_synced: false,
        };
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &[], &m),
            r("mars", Step::PodAnnotation)
        );
    }

    #[test]
    fn family_annotation_beats_ip_pool() {
        let p = pod(
            "ns1",
            "p",
            &[],
            &[
                (ANNOTATION_IP_POOL, "both"),
                (ANNOTATION_IPV4_POOL, "v4only"),
                (ANNOTATION_IPV6_POOL, "v6only"),
            ],
        );
        let m = meta_with(p, ns("ns1", &[], &[]));
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &[], &m),
            r("v4only", Step::PodAnnotation)
        );
        assert_eq!(
            sel_ok("ns1/p", Family::V6, &[], &m),
            r("v6only", Step::PodAnnotation)
        );

        // Only the v4 key: v6 falls back to ip-pool.
        let p = pod(
            "ns1",
            "p",
            &[],
            &[(ANNOTATION_IP_POOL, "both"), (ANNOTATION_IPV4_POOL, "v4")],
        );
        let m = meta_with(p, ns("ns1", &[], &[]));
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &[], &m),
            r("v4", Step::PodAnnotation)
        );
        assert_eq!(
            sel_ok("ns1/p", Family::V6, &[], &m),
            r("both", Step::PodAnnotation)
        );

        // Only the v6 key: v4 falls through to the default.
        let p = pod("ns1", "p", &[], &[(ANNOTATION_IPV6_POOL, "v6")]);
        let m = meta_with(p, ns("ns1", &[], &[]));
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &[], &m),
            r("default", Step::Default)
        );
        assert_eq!(
            sel_ok("ns1/p", Family::V6, &[], &m),
            r("v6", Step::PodAnnotation)
        );
    }

    #[test]
    fn empty_annotation_values_are_ignored() {
        let p = pod(
            "ns1",
            "p",
            &[],
            &[(ANNOTATION_IPV4_POOL, ""), (ANNOTATION_IP_POOL, "pp")],
        );
        let m = meta_with(p, ns("ns1", &[], &[(ANNOTATION_IP_POOL, "nsp")]));
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &[], &m),
            r("pp", Step::PodAnnotation)
        );

        let p = pod(
            "ns1",
            "p",
            &[],
            &[(ANNOTATION_IPV4_POOL, ""), (ANNOTATION_IP_POOL, "")],
        );
        let m = meta_with(
            p,
            ns(
                "ns1",
                &[],
                &[(ANNOTATION_IPV4_POOL, ""), (ANNOTATION_IP_POOL, "nsp")],
            ),
        );
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &[], &m),
            r("nsp", Step::NamespaceAnnotation)
        );

        let p = pod("ns1", "p", &[], &[(ANNOTATION_IP_POOL, "")]);
        let m = meta_with(p, ns("ns1", &[], &[(ANNOTATION_IP_POOL, "")]));
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &[], &m),
            r("default", Step::Default)
        );
    }

    #[test]
    fn pod_annotation_beats_namespace_annotation_and_selectors() {
        let pools = [pool("sel", sel(&[("app", "x")]), None)];
        let p = pod(
            "ns1",
            "p",
            &[("app", "x")],
            &[(ANNOTATION_IP_POOL, "podpool")],
        );
        let m = meta_with(p, ns("ns1", &[], &[(ANNOTATION_IP_POOL, "nspool")]));
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &pools, &m),
            r("podpool", Step::PodAnnotation)
        );
    }

    #[test]
    fn namespace_annotations() {
        let pools = [pool("sel", sel(&[("app", "x")]), None)];
        let p = pod("ns1", "p", &[("app", "x")], &[]);
        let n = ns(
            "ns1",
            &[],
            &[(ANNOTATION_IP_POOL, "both"), (ANNOTATION_IPV6_POOL, "v6ns")],
        );
        let m = meta_with(p, n);
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &pools, &m),
            r("both", Step::NamespaceAnnotation)
        );
        assert_eq!(
            sel_ok("ns1/p", Family::V6, &pools, &m),
            r("v6ns", Step::NamespaceAnnotation)
        );
    }

    #[test]
    fn pod_selector_only() {
        let pools = [
            pool("web", sel(&[("app", "web")]), None),
            pool("db", sel(&[("app", "db")]), None),
        ];
        let m = meta_with(pod("ns1", "p", &[("app", "web")], &[]), ns("ns1", &[], &[]));
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &pools, &m),
            r("web", Step::Selector)
        );
        let m = meta_with(
            pod("ns1", "p", &[("app", "other")], &[]),
            ns("ns1", &[], &[]),
        );
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &pools, &m),
            r("default", Step::Default)
        );
    }

    #[test]
    fn namespace_selector_only() {
        let pools = [pool("mars", None, sel(&[("tenant", "mars")]))];
        let m = meta_with(
            pod("ns1", "p", &[], &[]),
            ns("ns1", &[("tenant", "mars")], &[]),
        );
        assert_eq!(
            sel_ok("ns1/p", Family::V6, &pools, &m),
            r("mars", Step::Selector)
        );
        // The namespace selector is matched against the namespace's labels, not the pod's.
        let m = meta_with(
            pod("ns1", "p", &[("tenant", "mars")], &[]),
            ns("ns1", &[], &[]),
        );
        assert_eq!(
            sel_ok("ns1/p", Family::V6, &pools, &m),
            r("default", Step::Default)
        );
    }

    #[test]
    fn both_selectors_must_match() {
        let pools = [pool(
            "both",
            sel(&[("app", "web")]),
            sel(&[("tenant", "mars")]),
        )];
        let cases = [
            (&[("app", "web")][..], &[("tenant", "mars")][..], "both"),
            (&[("app", "db")][..], &[("tenant", "mars")][..], "default"),
            (&[("app", "web")][..], &[("tenant", "venus")][..], "default"),
        ];
        for (pl, nl, want) in cases {
            let m = meta_with(pod("ns1", "p", pl, &[]), ns("ns1", nl, &[]));
            assert_eq!(sel_ok("ns1/p", Family::V4, &pools, &m).0, want);
        }
    }

    #[test]
    fn synthetic_pod_labels() {
        let pools = [
            pool("by-ns", sel(&[(LABEL_POD_NAMESPACE, "tenant-mars")]), None),
            pool("by-name", sel(&[(LABEL_POD_NAME, "special")]), None),
        ];
        let m = meta_with(
            pod("tenant-mars", "p", &[], &[]),
            ns("tenant-mars", &[], &[]),
        );
        assert_eq!(
            sel_ok("tenant-mars/p", Family::V4, &pools, &m),
            r("by-ns", Step::Selector)
        );
        let m = meta_with(pod("other", "special", &[], &[]), ns("other", &[], &[]));
        assert_eq!(
            sel_ok("other/special", Family::V4, &pools, &m),
            r("by-name", Step::Selector)
        );
        // A real label of the same key cannot spoof the synthetic one.
        let m = meta_with(
            pod("other", "p", &[(LABEL_POD_NAMESPACE, "tenant-mars")], &[]),
            ns("other", &[], &[]),
        );
        assert_eq!(
            sel_ok("other/p", Family::V4, &pools, &m),
            r("default", Step::Default)
        );
    }

    #[test]
    fn multiple_matches_are_an_error_with_sorted_names() {
        let pools = [
            pool("zeta", sel(&[("app", "web")]), None),
            pool("alpha", None, sel(&[("tenant", "mars")])),
            pool("mid", sel(&[]), None), // empty selector: matches every pod
        ];
        let m = meta_with(
            pod("ns1", "p", &[("app", "web")], &[]),
            ns("ns1", &[("tenant", "mars")], &[]),
        );
        assert_eq!(
            sel_err("ns1/p", Family::V6, &pools, &m),
            "multiple CiliumPodIPPools match pod ns1/p (family=ipv6): [alpha mid zeta]"
        );
    }

    #[test]
    fn pools_lacking_the_family_are_ignored() {
        let mut v4only = pool("v4only", sel(&[("app", "web")]), None);
        v4only.ipv6 = None;
        let mut v6only = pool("v6only", sel(&[("app", "web")]), None);
        v6only.ipv4 = None;
        let pools = [v4only, v6only];
        let m = meta_with(pod("ns1", "p", &[("app", "web")], &[]), ns("ns1", &[], &[]));
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &pools, &m),
            r("v4only", Step::Selector)
        );
        assert_eq!(
            sel_ok("ns1/p", Family::V6, &pools, &m),
            r("v6only", Step::Selector)
        );
    }

    #[test]
    fn pools_without_selectors_are_ignored() {
        let pools = [pool("plain", None, None), pool("other", None, None)];
        let m = meta_with(pod("ns1", "p", &[], &[]), ns("ns1", &[], &[]));
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &pools, &m),
            r("default", Step::Default)
        );
        // ... even with require-pool-match set, they never count as a match.
        let m = meta_with(
            pod("ns1", "p", &[], &[(ANNOTATION_REQUIRE_POOL_MATCH, "true")]),
            ns("ns1", &[], &[]),
        );
        assert!(sel_err("ns1/p", Family::V4, &pools, &m).starts_with("no matching"));
    }

    #[test]
    fn require_pool_match_on_pod_and_namespace() {
        let pools = [pool("web", sel(&[("app", "web")]), None)];
        let req = [(ANNOTATION_REQUIRE_POOL_MATCH, "true")];
        let m = meta_with(pod("ns1", "p", &[], &req), ns("ns1", &[], &req));
        assert_eq!(
            sel_err("ns1/p", Family::V4, &pools, &m),
            "no matching CiliumPodIPPool found for pod ns1/p (family=ipv4) and \
             require-pool-match annotation is set on pod"
        );
        let m = meta_with(pod("ns1", "p", &[], &[]), ns("ns1", &[], &req));
        assert_eq!(
            sel_err("ns1/p", Family::V6, &pools, &m),
            "no matching CiliumPodIPPool found for pod ns1/p (family=ipv6) and \
             require-pool-match annotation is set on namespace"
        );
        // Only the exact value "true" counts.
        let m = meta_with(
            pod("ns1", "p", &[], &[(ANNOTATION_REQUIRE_POOL_MATCH, "True")]),
            ns("ns1", &[], &[(ANNOTATION_REQUIRE_POOL_MATCH, "yes")]),
        );
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &pools, &m),
            r("default", Step::Default)
        );
        // A match satisfies the requirement.
        let m = meta_with(
            pod("ns1", "p", &[("app", "web")], &req),
            ns("ns1", &[], &req),
        );
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &pools, &m),
            r("web", Step::Selector)
        );
        // An annotation beats the requirement (it is only consulted at the selector step).
        let m = meta_with(
            pod("ns1", "p", &[], &[req[0], (ANNOTATION_IP_POOL, "x")]),
            ns("ns1", &[], &[]),
        );
        assert_eq!(
            sel_ok("ns1/p", Family::V4, &pools, &m),
            r("x", Step::PodAnnotation)
        );
    }

    #[test]
    fn default_pool_is_the_callers() {
        let m = meta_with(pod("ns1", "p", &[], &[]), ns("ns1", &[], &[]));
        let o = select_pool("ns1/p", Family::V4, &[], &m, "dc1-pool").unwrap();
        assert_eq!((o.pool.as_str(), o.step), ("dc1-pool", Step::Default));
    }

    #[test]
    fn misspelled_key_has_no_effect_but_warns() {
        let bad = [(ANNOTATION_MISSPELLED_POOL, "mars")];
        let m = meta_with(pod("ns1", "p", &[], &bad), ns("ns1", &[], &bad));
        let o = select_pool("ns1/p", Family::V4, &[], &m, "default").unwrap();
        assert_eq!((o.pool.as_str(), o.step), ("default", Step::Default));
        assert_eq!(o.warnings.len(), 2);
        assert!(
            o.warnings[0].starts_with("pod ns1/p has annotation ipam.cilium.io/ipam-pool=\"mars\"")
        );
        assert!(o.warnings[1].starts_with("namespace ns1 has annotation ipam.cilium.io/ipam-pool"));
        assert!(o.warnings[0].contains(ANNOTATION_IP_POOL));
        // No warning without it.
        let m = meta_with(pod("ns1", "p", &[], &[]), ns("ns1", &[], &[]));
        assert!(
            select_pool("ns1/p", Family::V4, &[], &m, "default")
                .unwrap()
                .warnings
                .is_empty()
        );
    }

    #[test]
    fn step_names() {
        assert_eq!(Step::PodAnnotation.to_string(), "pod-annotation");
        assert_eq!(Step::NamespaceAnnotation.as_str(), "namespace-annotation");
        assert_eq!(Step::Selector.as_str(), "selector");
        assert_eq!(Step::Default.as_str(), "default");
    }

    #[test]
    fn pod_and_namespace_objects() {
        let obj: Pod = crate::resources::decode(&serde_json::json!({
            "kind": "Pod",
            "metadata": {"name": "web", "labels": {"app": "web"}, "annotations": {ANNOTATION_IP_POOL: "blue"}}
        }))
        .unwrap();
        let meta = PodMeta::try_from(&obj).unwrap();
        assert_eq!(
            meta,
            pod(
                "default",
                "web",
                &[("app", "web")],
                &[(ANNOTATION_IP_POOL, "blue")]
            )
        );
        let owned: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-0", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "1"},
                {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "2", "controller": true}]}
        }))
        .unwrap();
        assert_eq!(
            PodMeta::try_from(&owned).unwrap().controller,
            Some(PodController {
                api_version: "apps/v1".into(),
                kind: "StatefulSet".into(),
                name: "web".into()
            })
        );
        assert_eq!(meta.controller, None);
        let mut unnamed = obj.clone();
        unnamed.metadata.name.clear();
        assert_eq!(
            PodMeta::try_from(&unnamed).unwrap_err().to_string(),
            "Pod (unnamed): metadata.name is missing"
        );
        let mut empty_ns = obj;
        empty_ns.metadata.namespace = Some(String::new());
        assert_eq!(
            PodMeta::try_from(&empty_ns).unwrap_err().to_string(),
            "Pod \"web\": metadata.namespace must be a non-empty string"
        );

        let mut ns = Namespace::default();
        ns.metadata.name = "shop".into();
        ns.metadata.labels = map(&[("tier", "gold")]);
        assert_eq!(
            NamespaceMeta::try_from(&ns).unwrap().labels,
            map(&[(LABEL_NAMESPACE_NAME, "shop"), ("tier", "gold")])
        );
        ns.metadata.name.clear();
        assert_eq!(
            NamespaceMeta::try_from(&ns).unwrap_err().problem,
            "metadata.name is missing"
        );
    }
}
