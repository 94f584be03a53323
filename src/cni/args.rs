//! `CNI_ARGS`: the `K=V;K2=V2` string Kubernetes runtimes use to pass the pod's
//! identity, parsed with libcni's `LoadArgs` rules; the pod's names and UID are
//! checked against Kubernetes' shapes and lengths before anything uses them.

use super::error::CniError;
use super::validate::{
    MAX_POD_NAME_BYTES, MAX_POD_NAMESPACE_BYTES, MAX_POD_UID_BYTES, excerpt, k8s_name_problem,
    printable_problem,
};

/// The keys of `CNI_ARGS` podnet understands. Empty values count as unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// `K8S_POD_NAMESPACE`.
    pub pod_namespace: Option<String>,
    /// `K8S_POD_NAME`.
    pub pod_name: Option<String>,
    /// `K8S_POD_UID`.
    pub pod_uid: Option<String>,
    /// `K8S_POD_INFRA_CONTAINER_ID` (the sandbox container; Cilium ignores it).
    pub pod_infra_container_id: Option<String>,
}

impl CniArgs {
    /// Parses a `CNI_ARGS` value.
    ///
    /// - Pairs are separated by `;`; empty segments (e.g. a trailing `;`) are
    ///   skipped. The empty string gives all-`None`.
    /// - Each pair is `KEY=VALUE` with a non-empty key and exactly one `=`;
    ///   otherwise → code 4, `CNI_ARGS: invalid pair "..."`.
    /// - Keys are case-sensitive. Known: `IgnoreUnknown`, `K8S_POD_NAMESPACE`,
    ///   `K8S_POD_NAME`, `K8S_POD_UID`, `K8S_POD_INFRA_CONTAINER_ID`. A repeated
    ///   key: the last one wins.
    /// - `IgnoreUnknown` takes `1`/`true`/`0`/`false` (case-insensitive, empty =
    ///   false); anything else → code 4.
    /// - Unknown keys → code 4,
    ///   `CNI_ARGS: unknown args ["X"] (set IgnoreUnknown=1 to ignore them)`,
    ///   unless `IgnoreUnknown` is true (wherever it appears in the string).
    /// - `K8S_POD_NAME` (at most 253 bytes) and `K8S_POD_NAMESPACE` (at most 63)
    ///   must be Kubernetes names, `K8S_POD_UID` printable and at most 128 bytes;
    ///   otherwise → code 4 naming the key and the rule.
    pub fn parse(s: &str) -> Result<CniArgs, CniError> {
        let mut args = CniArgs::default();
        let mut ignore_unknown = false;
        let mut unknown: Vec<&str> = Vec::new();
        for pair in s.split(';').filter(|p| !p.is_empty()) {
            let (key, value) = match pair.split_once('=') {
                Some((k, v)) if !k.is_empty() && !v.contains('=') => (k, v),
                _ => {
                    return Err(CniError::invalid_env(format!(
                        "CNI_ARGS: invalid pair {pair:?}"
                    )));
                }
            };
            let non_empty = || (!value.is_empty()).then(|| value.to_string());
            match key {
                "IgnoreUnknown" => ignore_unknown = parse_bool(pair, value)?,
                "K8S_POD_NAMESPACE" => {
                    check(key, value, k8s_name_problem(value, MAX_POD_NAMESPACE_BYTES))?;
                    args.pod_namespace = non_empty();
                }
                "K8S_POD_NAME" => {
                    check(key, value, k8s_name_problem(value, MAX_POD_NAME_BYTES))?;
                    args.pod_name = non_empty();
                }
                "K8S_POD_UID" => {
                    check(key, value, printable_problem(value, MAX_POD_UID_BYTES))?;
                    args.pod_uid = non_empty();
                }
                "K8S_POD_INFRA_CONTAINER_ID" => args.pod_infra_container_id = non_empty(),
                other => {
                    if !unknown.contains(&other) {
                        unknown.push(other);
                    }
                }
            }
        }
        if !unknown.is_empty() && !ignore_unknown {
            return Err(CniError::invalid_env(format!(
                "CNI_ARGS: unknown args {unknown:?} (set IgnoreUnknown=1 to ignore them)"
            )));
        }
        Ok(args)
    }

    /// The owner string recorded with an IPAM allocation: `<namespace>/<pod>`
    /// when both Kubernetes names are known, otherwise the container ID
    /// (runtimes such as `ctr` or `cnitool` send no K8S args, so the owner then
    /// names the container; Cilium would record `"/"`).
    pub fn owner(&self, container_id: &str) -> String {
        match (&self.pod_namespace, &self.pod_name) {
            (Some(ns), Some(pod)) => format!("{ns}/{pod}"),
            _ => container_id.to_string(),
        }
    }
}

/// Code 4 for a non-empty `value` of `key` with a `problem`.
fn check(key: &str, value: &str, problem: Option<String>) -> Result<(), CniError> {
    match problem {
        Some(why) if !value.is_empty() => Err(CniError::invalid_env(format!(
            "CNI_ARGS: {key} {} is invalid: {why}",
            excerpt(value)
        ))),
        _ => Ok(()),
    }
}

/// libcni's `UnmarshallableBool`: `1`/`true` and `0`/`false`, any case; empty = false.
fn parse_bool(pair: &str, value: &str) -> Result<bool, CniError> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" => Ok(true),
        "0" | "false" | "" => Ok(false),
        _ => Err(
            CniError::invalid_env(format!("CNI_ARGS: invalid boolean in pair {pair:?}"))
                .with_details("IgnoreUnknown takes 1, true, 0 or false"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K8S: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;\
                       K8S_POD_INFRA_CONTAINER_ID=abc123;K8S_POD_UID=1234-5678";

    #[test]
    fn kubernetes_args() {
        let a = CniArgs::parse(K8S).unwrap();
        assert_eq!(a.pod_namespace.as_deref(), Some("default"));
        assert_eq!(a.pod_name.as_deref(), Some("web-0"));
        assert_eq!(a.pod_uid.as_deref(), Some("1234-5678"));
        assert_eq!(a.pod_infra_container_id.as_deref(), Some("abc123"));
        assert_eq!(a.owner("cid"), "default/web-0");
    }

    #[test]
    fn empty_and_empty_segments() {
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
        assert_eq!(CniArgs::parse(";;").unwrap(), CniArgs::default());
        let a = CniArgs::parse("K8S_POD_NAME=p;;K8S_POD_NAMESPACE=n;").unwrap();
        assert_eq!(a.owner("c"), "n/p");
    }

    #[test]
    fn empty_values_are_unset() {
        let a = CniArgs::parse("K8S_POD_NAMESPACE=;K8S_POD_NAME=p;K8S_POD_UID=").unwrap();
        assert_eq!(a.pod_namespace, None);
        assert_eq!(a.pod_uid, None);
        assert_eq!(a.owner("ctr-1"), "ctr-1");
    }

    #[test]
    fn last_value_wins() {
        let a = CniArgs::parse("K8S_POD_NAME=a;K8S_POD_NAME=b").unwrap();
        assert_eq!(a.pod_name.as_deref(), Some("b"));
    }

    #[test]
    fn owner_without_k8s_args() {
        assert_eq!(CniArgs::default().owner("cnitool-0123"), "cnitool-0123");
        let only_ns = CniArgs {
            pod_namespace: Some("ns".into()),
            ..CniArgs::default()
        };
        assert_eq!(only_ns.owner("c"), "c");
    }

    #[test]
    fn unknown_rejected_without_ignore() {
        let e = CniArgs::parse("K8S_POD_NAME=p;X=1;Y=2;X=3").unwrap_err();
        assert_eq!(e.code, CniError::INVALID_ENV);
        assert_eq!(
            e.msg,
            r#"CNI_ARGS: unknown args ["X", "Y"] (set IgnoreUnknown=1 to ignore them)"#
        );
        // Keys are case-sensitive.
        let e = CniArgs::parse("k8s_pod_name=p").unwrap_err();
        assert!(e.msg.contains(r#"["k8s_pod_name"]"#), "{}", e.msg);
        // IgnoreUnknown explicitly false.
        for v in ["0", "false", "FALSE", ""] {
            let e = CniArgs::parse(&format!("IgnoreUnknown={v};X=1")).unwrap_err();
            assert_eq!(e.code, CniError::INVALID_ENV);
        }
    }

    #[test]
    fn unknown_accepted_with_ignore() {
        for v in ["1", "true", "TRUE", "True"] {
            // IgnoreUnknown may come after the unknown key.
            let a = CniArgs::parse(&format!("X=1;K8S_POD_NAME=p;IgnoreUnknown={v}")).unwrap();
            assert_eq!(a.pod_name.as_deref(), Some("p"));
        }
    }

    #[test]
    fn invalid_pairs() {
        for (input, pair) in [
            ("K8S_POD_NAME", "K8S_POD_NAME"),
            ("a=b;novalue", "novalue"),
            ("=v", "=v"),
            ("K8S_POD_NAME=a=b", "K8S_POD_NAME=a=b"),
            ("IgnoreUnknown=1; ", " "),
        ] {
            let e = CniArgs::parse(input).unwrap_err();
            assert_eq!(e.code, CniError::INVALID_ENV, "{input}");
            assert_eq!(e.msg, format!("CNI_ARGS: invalid pair {pair:?}"), "{input}");
        }
    }

    #[test]
    fn invalid_ignore_unknown_value() {
        let e = CniArgs::parse("IgnoreUnknown=yes").unwrap_err();
        assert_eq!(e.code, CniError::INVALID_ENV);
        assert!(e.msg.contains("IgnoreUnknown=yes"), "{}", e.msg);
    }

    #[test]
    fn pod_identity_is_checked() {
        let long = "a".repeat(100_000);
        let e =
            CniArgs::parse(&format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={long}")).unwrap_err();
        assert_eq!(e.code, CniError::INVALID_ENV);
        assert!(
            e.msg.starts_with("CNI_ARGS: K8S_POD_NAME \"aaaa")
                && e.msg.contains("(100000 bytes)")
                && e.msg
                    .ends_with("it is 100000 bytes long; at most 253 are allowed"),
            "{}",
            e.msg
        );
        assert!(e.msg.len() < 200, "{}", e.msg);
        for (args, key) in [
            ("K8S_POD_NAME=web\n2024-01-01 INFO forged", "K8S_POD_NAME"),
            ("K8S_POD_NAME=a/b", "K8S_POD_NAME"),
            ("K8S_POD_NAME=-a", "K8S_POD_NAME"),
            ("K8S_POD_NAMESPACE=kube system", "K8S_POD_NAMESPACE"),
            ("K8S_POD_NAMESPACE=a\0", "K8S_POD_NAMESPACE"),
            ("K8S_POD_UID=12\n34", "K8S_POD_UID"),
        ] {
            let e = CniArgs::parse(args).unwrap_err();
            assert_eq!(e.code, CniError::INVALID_ENV, "{args:?}");
            assert!(e.msg.starts_with(&format!("CNI_ARGS: {key} ")), "{}", e.msg);
        }
        let e = CniArgs::parse(&format!("K8S_POD_NAMESPACE={}", "n".repeat(64))).unwrap_err();
        assert!(e.msg.contains("at most 63"), "{}", e.msg);
        let e = CniArgs::parse(&format!("K8S_POD_UID={}", "u".repeat(129))).unwrap_err();
        assert!(e.msg.contains("at most 128"), "{}", e.msg);
        let max = format!(
            "K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_UID={}",
            "n".repeat(63),
            "p".repeat(253),
            "u".repeat(128)
        );
        let a = CniArgs::parse(&max).unwrap();
        assert_eq!(a.owner("c").len(), 63 + 1 + 253);
    }
}
