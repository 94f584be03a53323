//! The `CNI_*` environment variables of one plugin invocation, read through a
//! caller-supplied lookup function and validated per verb.

use super::args::CniArgs;
use super::command::Command;
use super::error::CniError;
use super::validate::{validate_container_id, validate_ifname};
use std::path::PathBuf;

/// The parsed and validated `CNI_*` environment of one invocation.
///
/// `container_id`, `netns`, `ifname` and `args` are only read for the
/// per-attachment verbs (ADD, DEL, CHECK); for STATUS, GC and VERSION they are
/// `None` / default whatever the runtime sent (libcni sends empty or `dummy`
/// values there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniEnv {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID`: set for ADD, DEL and CHECK.
    pub container_id: Option<String>,
    /// `CNI_NETNS`: set for ADD and CHECK; optional for DEL.
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME`: set for ADD, DEL and CHECK.
    pub ifname: Option<String>,
    /// `CNI_ARGS`, parsed (default when unset, and for STATUS/GC/VERSION).
    pub args: CniArgs,
    /// `CNI_PATH` split on `:`, empty entries dropped (empty when unset).
    pub path: Vec<PathBuf>,
}

impl CniEnv {
    /// Reads and validates the environment through `lookup` (e.g.
    /// `|k| std::env::var(k).ok()`). An empty value is treated as unset.
    ///
    /// Errors:
    /// - `CNI_COMMAND` unset → code 4 `required env variables [CNI_COMMAND] missing`;
    ///   unknown → code 4 (see [`Command::parse`]).
    /// - Missing required variables → code 4, one message naming all of them,
    ///   `required env variables [CNI_CONTAINERID CNI_NETNS] missing`.
    ///   ADD/CHECK need `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`; DEL needs
    ///   `CNI_CONTAINERID` and `CNI_IFNAME`. An empty container ID is thus
    ///   reported as missing (code 4), not libcni's code 3.
    /// - GC needs `CNI_PATH` per the spec, but podnet delegates nothing, so GC
    ///   without `CNI_PATH` is accepted.
    /// - Malformed container ID or interface name → code 4 (which rule).
    /// - Malformed `CNI_ARGS` → code 4 (see [`CniArgs::parse`]).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<CniEnv, CniError> {
        let get = |key: &str| lookup(key).filter(|v| !v.is_empty());

        let command = match get("CNI_COMMAND") {
            Some(c) => Command::parse(&c)?,
            None => return Err(missing(&["CNI_COMMAND"])),
        };
        let path = get("CNI_PATH")
            .map(|p| {
                p.split(':')
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();

        if !command.is_per_attachment() {
            return Ok(CniEnv {
                command,
                container_id: None,
                netns: None,
                ifname: None,
                args: CniArgs::default(),
                path,
            });
        }

        let container_id = get("CNI_CONTAINERID");
        let netns = get("CNI_NETNS");
        let ifname = get("CNI_IFNAME");

        let mut absent = Vec::new();
        if container_id.is_none() {
            absent.push("CNI_CONTAINERID");
        }
        if netns.is_none() && command != Command::Del {
            absent.push("CNI_NETNS");
        }
        if ifname.is_none() {
            absent.push("CNI_IFNAME");
        }
        if !absent.is_empty() {
            return Err(missing(&absent));
        }
        if let Some(id) = &container_id {
            validate_container_id(id)?;
        }
        if let Some(name) = &ifname {
            validate_ifname(name)?;
        }
        let args = match get("CNI_ARGS") {
            Some(a) => CniArgs::parse(&a)?,
            None => CniArgs::default(),
        };

        Ok(CniEnv {
            command,
            container_id,
            netns: netns.map(PathBuf::from),
            ifname,
            args,
            path,
        })
    }
}

/// Code 4 naming every missing variable, in Go `skel`'s wording.
fn missing(vars: &[&str]) -> CniError {
    CniError::invalid_env(format!(
        "required env variables [{}] missing",
        vars.join(" ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<CniEnv, CniError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CniEnv::from_lookup(|k| map.get(k).cloned())
    }

    fn full(cmd: &str) -> Vec<(&str, &str)> {
        vec![
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", "abc123"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            (
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p",
            ),
            ("CNI_PATH", "/opt/cni/bin::/usr/lib/cni"),
        ]
    }

    fn with(
        mut base: Vec<(&'static str, &'static str)>,
        key: &str,
        val: &'static str,
    ) -> Vec<(&'static str, &'static str)> {
        for kv in base.iter_mut() {
            if kv.0 == key {
                kv.1 = val;
            }
        }
        base
    }

    #[test]
    fn add_full() {
        let e = env(&full("ADD")).unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.container_id.as_deref(), Some("abc123"));
        assert_eq!(e.netns, Some(PathBuf::from("/run/netns/x")));
        assert_eq!(e.ifname.as_deref(), Some("eth0"));
        assert_eq!(e.args.owner("abc123"), "ns/p");
        assert_eq!(
            e.path,
            vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
    }

    #[test]
    fn command_missing_or_empty_or_unknown() {
        let e = env(&[]).unwrap_err();
        assert_eq!(e.code, 4);
        assert_eq!(e.msg, "required env variables [CNI_COMMAND] missing");
        let e = env(&[("CNI_COMMAND", "")]).unwrap_err();
        assert_eq!(e.msg, "required env variables [CNI_COMMAND] missing");
        let e = env(&[("CNI_COMMAND", "FROB")]).unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.contains("CNI_COMMAND"));
    }

    #[test]
    fn add_and_check_need_all_three() {
        for cmd in ["ADD", "CHECK"] {
            let e = env(&[("CNI_COMMAND", cmd)]).unwrap_err();
            assert_eq!(e.code, 4);
            assert_eq!(
                e.msg,
                "required env variables [CNI_CONTAINERID CNI_NETNS CNI_IFNAME] missing"
            );
            // Empty strings are unset (libcni sends all six variables).
            let e = env(&with(full(cmd), "CNI_NETNS", "")).unwrap_err();
            assert_eq!(e.msg, "required env variables [CNI_NETNS] missing");
            let e = env(&with(full(cmd), "CNI_CONTAINERID", "")).unwrap_err();
            assert_eq!(
                (e.code, e.msg.as_str()),
                (4, "required env variables [CNI_CONTAINERID] missing")
            );
            let e = env(&with(full(cmd), "CNI_IFNAME", "")).unwrap_err();
            assert_eq!(e.msg, "required env variables [CNI_IFNAME] missing");
        }
    }

    #[test]
    fn del_netns_optional() {
        let e = env(&with(full("DEL"), "CNI_NETNS", "")).unwrap();
        assert_eq!(e.command, Command::Del);
        assert_eq!(e.netns, None);
        assert_eq!(e.container_id.as_deref(), Some("abc123"));
        let e = env(&[("CNI_COMMAND", "DEL")]).unwrap_err();
        assert_eq!(
            e.msg,
            "required env variables [CNI_CONTAINERID CNI_IFNAME] missing"
        );
        let e = env(&full("DEL")).unwrap();
        assert_eq!(e.netns, Some(PathBuf::from("/run/netns/x")));
    }

    #[test]
    fn status_gc_version_need_nothing_else() {
        for (cmd, want) in [
            ("STATUS", Command::Status),
            ("GC", Command::Gc),
            ("VERSION", Command::Version),
        ] {
            let e = env(&[("CNI_COMMAND", cmd)]).unwrap();
            assert_eq!(e.command, want);
            assert!(e.path.is_empty());
            // libcni's empty / dummy values are ignored, garbage args too.
            let e = env(&[
                ("CNI_COMMAND", cmd),
                ("CNI_CONTAINERID", ""),
                ("CNI_NETNS", "dummy"),
                ("CNI_IFNAME", "dummy"),
                ("CNI_ARGS", "garbage"),
                ("CNI_PATH", "dummy"),
            ])
            .unwrap();
            assert_eq!(e.container_id, None);
            assert_eq!(e.netns, None);
            assert_eq!(e.ifname, None);
            assert_eq!(e.args, CniArgs::default());
            assert_eq!(e.path, vec![PathBuf::from("dummy")]);
        }
    }

    #[test]
    fn bad_container_id() {
        let e = env(&with(full("ADD"), "CNI_CONTAINERID", "-bad")).unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.contains("CNI_CONTAINERID"), "{}", e.msg);
        assert!(e.details.contains("^[a-zA-Z0-9]"), "{}", e.details);
    }

    #[test]
    fn bad_ifname() {
        for name in ["this-is-too-long0", "a b", "..", "a:1", "x/y"] {
            let e = env(&with(full("DEL"), "CNI_IFNAME", name)).unwrap_err();
            assert_eq!(e.code, 4, "{name}");
            assert!(e.msg.contains("CNI_IFNAME"), "{}", e.msg);
        }
    }

    #[test]
    fn bad_args() {
        let e = env(&with(full("ADD"), "CNI_ARGS", "K8S_POD_NAME=p;X=1")).unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.starts_with("CNI_ARGS: unknown args"), "{}", e.msg);
        let e = env(&with(full("ADD"), "CNI_ARGS", "oops")).unwrap_err();
        assert_eq!(e.msg, r#"CNI_ARGS: invalid pair "oops""#);
        // Empty CNI_ARGS is unset.
        let e = env(&with(full("ADD"), "CNI_ARGS", "")).unwrap();
        assert_eq!(e.args, CniArgs::default());
        assert_eq!(e.args.owner("abc123"), "abc123");
    }

    #[test]
    fn gc_without_path_is_accepted() {
        let e = env(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "")]).unwrap();
        assert_eq!(e.command, Command::Gc);
        assert!(e.path.is_empty());
    }
}
