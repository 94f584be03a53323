//! The request config a runtime pipes to the plugin on stdin (`NetConf`), its
//! validation per verb, and GC's valid-attachments list.

use super::command::Command;
use super::error::CniError;
use super::result::CniResult;
use super::validate::validate_network_name;
use super::version::{SUPPORTED_VERSIONS, is_supported, version_at_least};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::PathBuf;

/// Key under which runtimes pass GC's still-valid attachments.
pub const VALID_ATTACHMENTS_KEY: &str = "cni.dev/valid-attachments";
/// Legacy duplicate of [`VALID_ATTACHMENTS_KEY`] (libcni issue #1101); read
/// only when the main key is absent.
pub const LEGACY_ATTACHMENTS_KEY: &str = "cni.dev/attachments";

/// One attachment still in use, from `cni.dev/valid-attachments`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attachment {
    /// The container ID (`CNI_CONTAINERID` of its ADD).
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// The interface name (`CNI_IFNAME` of its ADD).
    pub ifname: String,
}

/// The per-plugin request config, as podnet reads it.
///
/// Unknown keys are ignored (`capabilities`, `runtimeConfig`, `args`,
/// `cniVersions`, `dns`, ...); read them from [`NetConf::raw`] if needed.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    /// `cniVersion`: the version to answer in; one of [`SUPPORTED_VERSIONS`].
    pub cni_version: String,
    /// `name`: the network name.
    pub name: String,
    /// `type`: the plugin binary's name.
    pub plugin_type: String,
    /// `socket-path` (podnet): the IPAM daemon's unix socket; empty = `None`.
    pub socket_path: Option<PathBuf>,
    /// `log-file` (podnet): where the plugin also writes its log; empty = `None`.
    pub log_file: Option<PathBuf>,
    /// `ipam`: the IPAM section, an object, kept as JSON.
    pub ipam: Option<Value>,
    /// `prevResult`, parsed leniently. Its `cniVersion`, when absent, is set
    /// to the config's.
    pub prev_result: Option<CniResult>,
    /// GC only: `cni.dev/valid-attachments` (or the legacy
    /// `cni.dev/attachments`). `None` when neither key is present (or both are
    /// `null`) — e.g. `cnitool gc` — and for every other verb; the caller
    /// decides what an absent list means.
    pub valid_attachments: Option<Vec<Attachment>>,
    /// The whole config object as received.
    pub raw: Value,
}

impl NetConf {
    /// Parses and validates stdin for `command`.
    ///
    /// Errors, in the order checked:
    /// - not JSON / not an object → code 6 (with serde's text).
    /// - `cniVersion` missing or empty → code 7 `cniVersion is missing`;
    ///   not a string → code 7.
    /// - `cniVersion` not in [`SUPPORTED_VERSIONS`] (exact match) → code 1.
    /// - below the verb's minimum (CHECK 0.4.0, STATUS/GC 1.1.0) → code 1
    ///   `config version 1.0.0 does not allow STATUS`.
    /// - `name` missing/empty/bad characters → code 7; `type` missing or
    ///   empty → code 7.
    /// - a known key with the wrong JSON type (`name`, `type`, `socket-path`,
    ///   `log-file`, `ipam` not an object) → code 7.
    /// - `prevResult` not parseable → code 6 naming `prevResult`.
    /// - GC: malformed valid-attachments → code 7.
    ///
    /// `null` counts as absent for every optional key. For VERSION use
    /// [`super::version_reply`] instead; this function applies the same
    /// rules as ADD to it.
    pub fn parse(stdin: &[u8], command: Command) -> Result<NetConf, CniError> {
        let raw: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::decode_failure(format!("network config on stdin is not valid JSON: {e}"))
        })?;
        let obj = raw
            .as_object()
            .ok_or_else(|| CniError::decode_failure("network config is not a JSON object"))?;

        let cni_version = opt_str(obj, "cniVersion")?
            .ok_or_else(|| CniError::invalid_network_config("cniVersion is missing"))?;
        check_version(&cni_version, command)?;

        let name = opt_str(obj, "name")?.unwrap_or_default();
        validate_network_name(&name)?;
        let plugin_type = opt_str(obj, "type")?
            .ok_or_else(|| CniError::invalid_network_config("missing plugin type"))?;

        let socket_path = opt_str(obj, "socket-path")?.map(PathBuf::from);
        let log_file = opt_str(obj, "log-file")?.map(PathBuf::from);
        let ipam = match obj.get("ipam") {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v.clone()),
            Some(_) => {
                return Err(CniError::invalid_network_config(
                    "ipam must be a JSON object",
                ));
            }
        };
        let prev_result = parse_prev_result(obj, &cni_version)?;
        let valid_attachments = match command {
            Command::Gc => parse_attachments(obj)?,
            _ => None,
        };

        Ok(NetConf {
            cni_version,
            name,
            plugin_type,
            socket_path,
            log_file,
            ipam,
            prev_result,
            valid_attachments,
            raw,
        })
    }
}

/// A string-valued key: absent, `null` and `""` → `None`; another type → code 7.
fn opt_str(obj: &Map<String, Value>, key: &str) -> Result<Option<String>, CniError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(CniError::invalid_network_config(format!(
            "{key} must be a string, got {other}"
        ))),
    }
}

fn check_version(v: &str, command: Command) -> Result<(), CniError> {
    if !is_supported(v) {
        return Err(CniError::incompatible_version(format!(
            "incompatible CNI versions: config is {v:?}, plugin supports {SUPPORTED_VERSIONS:?}"
        )));
    }
    if let Some(min) = command.min_version()
        && !version_at_least(v, min)
    {
        return Err(CniError::incompatible_version(format!(
            "config version {v} does not allow {command}"
        ))
        .with_details(format!("{command} needs cniVersion {min} or later")));
    }
    Ok(())
}

fn parse_prev_result(
    obj: &Map<String, Value>,
    cni_version: &str,
) -> Result<Option<CniResult>, CniError> {
    let value = match obj.get("prevResult") {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v.clone(),
    };
    let mut result = CniResult::from_value(value)
        .map_err(|e| CniError::decode_failure(format!("failed to parse prevResult: {e}")))?;
    if result.cni_version.is_empty() {
        result.cni_version = cni_version.to_string();
    }
    Ok(Some(result))
}

fn parse_attachments(obj: &Map<String, Value>) -> Result<Option<Vec<Attachment>>, CniError> {
    let present = |key: &'static str| obj.get(key).filter(|v| !v.is_null()).map(|v| (key, v));
    let Some((key, value)) =
        present(VALID_ATTACHMENTS_KEY).or_else(|| present(LEGACY_ATTACHMENTS_KEY))
    else {
        return Ok(None);
    };
    if let Value::Array(items) = value
        && items.iter().any(|i| !i.is_object())
    {
        return Err(CniError::invalid_network_config(format!(
            "invalid {key}: every entry must be a JSON object"
        )));
    }
    let list: Vec<Attachment> = serde_json::from_value(value.clone())
        .map_err(|e| CniError::invalid_network_config(format!("invalid {key}: {e}")))?;
    if let Some(bad) = list
        .iter()
        .find(|a| a.container_id.is_empty() || a.ifname.is_empty())
    {
        return Err(CniError::invalid_network_config(format!(
            "invalid {key}: empty containerID or ifname in {bad:?}"
        )));
    }
    Ok(Some(list))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value, cmd: Command) -> Result<NetConf, CniError> {
        NetConf::parse(v.to_string().as_bytes(), cmd)
    }

    fn base(version: &str) -> Value {
        json!({"cniVersion": version, "name": "podnet", "type": "podnet"})
    }

    fn with(mut v: Value, key: &str, val: Value) -> Value {
        v.as_object_mut().unwrap().insert(key.into(), val);
        v
    }

    fn code(v: Value, cmd: Command) -> u32 {
        parse(v, cmd).unwrap_err().code
    }

    #[test]
    fn minimal() {
        for v in SUPPORTED_VERSIONS {
            let c = parse(base(v), Command::Add).unwrap();
            assert_eq!(c.cni_version, *v);
            assert_eq!(c.name, "podnet");
            assert_eq!(c.plugin_type, "podnet");
            assert_eq!(c.socket_path, None);
            assert_eq!(c.log_file, None);
            assert_eq!(c.ipam, None);
            assert_eq!(c.prev_result, None);
            assert_eq!(c.valid_attachments, None);
            assert_eq!(c.raw, base(v));
        }
    }

    #[test]
    fn full_config_and_unknown_keys() {
        let v = json!({
            "cniVersion": "1.1.0", "cniVersions": ["1.0.0", "1.1.0"],
            "name": "k8s-pod-network", "type": "podnet",
            "socket-path": "/run/podnet/podnet.sock", "log-file": "/var/log/podnet-cni.log",
            "ipam": {"type": "", "pool": "default"},
            "capabilities": {"portMappings": true}, "runtimeConfig": {"portMappings": []},
            "args": {"cni": {"ips": ["10.0.0.1"]}}, "dns": {"nameservers": []},
            "cni.dev/whatever": 1, "mtu": 1450
        });
        let c = parse(v.clone(), Command::Add).unwrap();
        assert_eq!(
            c.socket_path,
            Some(PathBuf::from("/run/podnet/podnet.sock"))
        );
        assert_eq!(c.log_file, Some(PathBuf::from("/var/log/podnet-cni.log")));
        assert_eq!(c.ipam, Some(json!({"type": "", "pool": "default"})));
        assert_eq!(c.raw, v);
    }

    #[test]
    fn empty_or_null_optional_keys() {
        let v = with(base("1.0.0"), "socket-path", json!(""));
        let v = with(v, "log-file", Value::Null);
        let v = with(v, "ipam", Value::Null);
        let v = with(v, "prevResult", Value::Null);
        let c = parse(v, Command::Add).unwrap();
        assert_eq!(
            (c.socket_path, c.log_file, c.ipam, c.prev_result),
            (None, None, None, None)
        );
    }

    #[test]
    fn decode_failures() {
        for input in [
            &b""[..],
            b"not json",
            b"{\"cniVersion\":",
            b"[]",
            b"\"x\"",
            b"null",
        ] {
            let e = NetConf::parse(input, Command::Add).unwrap_err();
            assert_eq!(e.code, CniError::DECODE_FAILURE, "{input:?}");
        }
        let e = NetConf::parse(b"{oops}", Command::Add).unwrap_err();
        assert!(e.msg.contains("line 1"), "serde text expected: {}", e.msg);
    }

    #[test]
    fn version_missing() {
        for v in [
            json!({"name": "n", "type": "t"}),
            json!({"cniVersion": "", "name": "n", "type": "t"}),
            json!({"cniVersion": null, "name": "n", "type": "t"}),
        ] {
            let e = parse(v, Command::Add).unwrap_err();
            assert_eq!((e.code, e.msg.as_str()), (7, "cniVersion is missing"));
        }
        assert_eq!(
            code(with(base("1.0.0"), "cniVersion", json!(1)), Command::Add),
            7
        );
    }

    #[test]
    fn version_unsupported() {
        for v in ["0.3.1", "0.1.0", "1.0", "2.0.0", "1.1.0 "] {
            let e = parse(base(v), Command::Add).unwrap_err();
            assert_eq!(e.code, CniError::INCOMPATIBLE_VERSION, "{v}");
            assert!(e.msg.contains(&format!("{v:?}")), "{}", e.msg);
            assert!(
                e.msg.contains(r#"["0.4.0", "1.0.0", "1.1.0"]"#),
                "{}",
                e.msg
            );
        }
    }

    #[test]
    fn verb_version_requirements() {
        for cmd in [Command::Status, Command::Gc] {
            parse(base("1.1.0"), cmd).unwrap();
            for v in ["1.0.0", "0.4.0"] {
                let e = parse(base(v), cmd).unwrap_err();
                assert_eq!(e.code, CniError::INCOMPATIBLE_VERSION);
                assert_eq!(e.msg, format!("config version {v} does not allow {cmd}"));
            }
        }
        for v in SUPPORTED_VERSIONS {
            parse(base(v), Command::Check).unwrap();
            parse(base(v), Command::Del).unwrap();
        }
    }

    #[test]
    fn name_and_type() {
        let no_name = json!({"cniVersion": "1.0.0", "type": "t"});
        let e = parse(no_name, Command::Add).unwrap_err();
        assert_eq!((e.code, e.msg.as_str()), (7, "missing network name"));
        assert_eq!(
            code(with(base("1.0.0"), "name", json!("")), Command::Add),
            7
        );
        assert_eq!(
            code(with(base("1.0.0"), "name", json!("bad name")), Command::Add),
            7
        );
        assert_eq!(
            code(with(base("1.0.0"), "name", json!("-x")), Command::Add),
            7
        );
        assert_eq!(code(with(base("1.0.0"), "name", json!(5)), Command::Add), 7);
        let no_type = json!({"cniVersion": "1.0.0", "name": "n"});
        let e = parse(no_type, Command::Add).unwrap_err();
        assert_eq!((e.code, e.msg.as_str()), (7, "missing plugin type"));
        assert_eq!(
            code(with(base("1.0.0"), "type", json!("")), Command::Add),
            7
        );
        assert_eq!(
            code(with(base("1.0.0"), "type", json!(["x"])), Command::Add),
            7
        );
    }

    #[test]
    fn wrong_types_of_own_keys() {
        assert_eq!(
            code(with(base("1.0.0"), "socket-path", json!(1)), Command::Add),
            7
        );
        assert_eq!(
            code(with(base("1.0.0"), "log-file", json!(true)), Command::Add),
            7
        );
        assert_eq!(
            code(
                with(base("1.0.0"), "ipam", json!("host-local")),
                Command::Add
            ),
            7
        );
    }

    #[test]
    fn prev_result_lenient() {
        let c = parse(
            with(base("1.0.0"), "prevResult", json!({"cniVersion": "1.0.0"})),
            Command::Del,
        )
        .unwrap();
        assert_eq!(
            c.prev_result,
            Some(CniResult {
                cni_version: "1.0.0".into(),
                ..Default::default()
            })
        );

        let only_ips = json!({"ips": [{"address": "10.0.0.5/24", "interface": 0}]});
        let c = parse(with(base("1.1.0"), "prevResult", only_ips), Command::Check).unwrap();
        let prev = c.prev_result.unwrap();
        assert_eq!(prev.cni_version, "1.1.0"); // filled from the config
        assert_eq!(prev.ips.len(), 1);
        assert_eq!(prev.ips[0].address.to_string(), "10.0.0.5/24");
        assert!(prev.interfaces.is_empty() && prev.routes.is_empty() && prev.dns.is_none());

        // A 0.4.0 result with per-ip "version" keys.
        let old = json!({"cniVersion": "0.4.0",
            "interfaces": [{"name": "eth0", "sandbox": "/proc/1/ns/net"}],
            "ips": [{"version": "4", "address": "10.0.0.5/24", "gateway": "10.0.0.1", "interface": 0}],
            "dns": {}});
        let c = parse(with(base("0.4.0"), "prevResult", old), Command::Check).unwrap();
        assert_eq!(
            c.prev_result.unwrap().ips[0].gateway,
            Some("10.0.0.1".parse().unwrap())
        );
    }

    #[test]
    fn prev_result_rejected() {
        for bad in [
            json!({"ips": [{"address": "10.0.0.5"}]}),
            json!({"routes": [{"dst": "nope"}]}),
            json!("x"),
            json!([]),
        ] {
            let e =
                parse(with(base("1.0.0"), "prevResult", bad.clone()), Command::Del).unwrap_err();
            assert_eq!(e.code, CniError::DECODE_FAILURE, "{bad}");
            assert!(e.msg.contains("prevResult"), "{}", e.msg);
        }
    }

    fn att(c: &str, i: &str) -> Attachment {
        Attachment {
            container_id: c.into(),
            ifname: i.into(),
        }
    }

    #[test]
    fn valid_attachments_main_key() {
        let list = json!([{"containerID": "c1", "ifname": "eth0"}, {"containerID": "c2", "ifname": "net1", "extra": 1}]);
        let c = parse(
            with(base("1.1.0"), VALID_ATTACHMENTS_KEY, list),
            Command::Gc,
        )
        .unwrap();
        assert_eq!(
            c.valid_attachments,
            Some(vec![att("c1", "eth0"), att("c2", "net1")])
        );
        let c = parse(
            with(base("1.1.0"), VALID_ATTACHMENTS_KEY, json!([])),
            Command::Gc,
        )
        .unwrap();
        assert_eq!(c.valid_attachments, Some(vec![]));
    }

    #[test]
    fn valid_attachments_legacy_key() {
        let list = json!([{"containerID": "c9", "ifname": "eth0"}]);
        let c = parse(
            with(base("1.1.0"), LEGACY_ATTACHMENTS_KEY, list.clone()),
            Command::Gc,
        )
        .unwrap();
        assert_eq!(c.valid_attachments, Some(vec![att("c9", "eth0")]));
        // The main key wins when both are present, even if empty.
        let v = with(
            with(base("1.1.0"), LEGACY_ATTACHMENTS_KEY, list.clone()),
            VALID_ATTACHMENTS_KEY,
            json!([]),
        );
        assert_eq!(
            parse(v, Command::Gc).unwrap().valid_attachments,
            Some(vec![])
        );
        // A null main key falls back to the legacy one.
        let v = with(
            with(base("1.1.0"), LEGACY_ATTACHMENTS_KEY, list),
            VALID_ATTACHMENTS_KEY,
            Value::Null,
        );
        assert_eq!(
            parse(v, Command::Gc).unwrap().valid_attachments,
            Some(vec![att("c9", "eth0")])
        );
    }

    #[test]
    fn valid_attachments_absent() {
        assert_eq!(
            parse(base("1.1.0"), Command::Gc).unwrap().valid_attachments,
            None
        );
        let v = with(base("1.1.0"), VALID_ATTACHMENTS_KEY, Value::Null);
        assert_eq!(parse(v, Command::Gc).unwrap().valid_attachments, None);
        // Not read for other verbs, even when malformed.
        let v = with(base("1.1.0"), VALID_ATTACHMENTS_KEY, json!("junk"));
        assert_eq!(parse(v, Command::Add).unwrap().valid_attachments, None);
    }

    #[test]
    fn valid_attachments_malformed() {
        for (key, bad) in [
            (VALID_ATTACHMENTS_KEY, json!("c1")),
            (
                VALID_ATTACHMENTS_KEY,
                json!({"containerID": "c1", "ifname": "eth0"}),
            ),
            (VALID_ATTACHMENTS_KEY, json!([{"containerID": "c1"}])),
            (VALID_ATTACHMENTS_KEY, json!([{"ifname": "eth0"}])),
            (
                VALID_ATTACHMENTS_KEY,
                json!([{"containerID": 1, "ifname": "eth0"}]),
            ),
            (
                VALID_ATTACHMENTS_KEY,
                json!([{"containerID": "", "ifname": "eth0"}]),
            ),
            (
                VALID_ATTACHMENTS_KEY,
                json!([{"containerID": "c1", "ifname": ""}]),
            ),
            (LEGACY_ATTACHMENTS_KEY, json!([null])),
            (VALID_ATTACHMENTS_KEY, json!([["c1", "eth0"]])),
        ] {
            let e = parse(with(base("1.1.0"), key, bad.clone()), Command::Gc).unwrap_err();
            assert_eq!(e.code, CniError::INVALID_NETWORK_CONFIG, "{bad}");
            assert!(e.msg.contains(key), "{}", e.msg);
        }
    }
}
