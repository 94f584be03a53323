//! CNI spec versions: the versions podnet speaks, version comparison, and the
//! reply to the VERSION verb.

use super::error::CniError;
use serde::Serialize;

/// The CNI spec versions podnet accepts in a config and can render results for.
/// A config version must match one of these exactly (as Go's `skel` does).
pub const SUPPORTED_VERSIONS: &[&str] = &["0.4.0", "1.0.0", "1.1.0"];

/// The newest spec version podnet implements; used when VERSION gets no input.
pub const LATEST_VERSION: &str = "1.1.0";

/// Whether `v` is one of [`SUPPORTED_VERSIONS`] (exact string match).
pub fn is_supported(v: &str) -> bool {
    SUPPORTED_VERSIONS.contains(&v)
}

/// Parses `major[.minor[.patch]]` into a triple; missing parts are 0.
fn parse_triple(v: &str) -> Option<(u64, u64, u64)> {
    let mut parts = v.split('.');
    let mut next = |required: bool| -> Option<u64> {
        match parts.next() {
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p.parse().ok(),
            Some(_) => None,
            None if required => None,
            None => Some(0),
        }
    };
    let triple = (next(true)?, next(false)?, next(false)?);
    if parts.next().is_some() {
        return None;
    }
    Some(triple)
}

/// `v >= min`, comparing `major.minor.patch` numerically (missing parts count
/// as 0, so `"1.1"` equals `"1.1.0"`). Returns `false` when either side is not
/// a version of that shape (empty, non-numeric, more than three parts).
pub fn version_at_least(v: &str, min: &str) -> bool {
    match (parse_triple(v), parse_triple(min)) {
        (Some(a), Some(b)) => a >= b,
        _ => false,
    }
}

/// Answers the VERSION verb.
///
/// `stdin` is `{"cniVersion":"x"}`; the reply is
/// `{"cniVersion":"x","supportedVersions":[...]}` with the caller's version
/// echoed back unchanged (even one podnet does not support). Empty or
/// whitespace-only stdin, or a missing/empty `cniVersion`, answers with
/// [`LATEST_VERSION`]. Input that is not a JSON object, or a non-string
/// `cniVersion`, is a decode failure (code 6).
pub fn version_reply(stdin: &[u8]) -> Result<String, CniError> {
    let requested = requested_version(stdin)?;
    #[derive(Serialize)]
    struct Reply<'a> {
        #[serde(rename = "cniVersion")]
        cni_version: &'a str,
        #[serde(rename = "supportedVersions")]
        supported_versions: &'a [&'a str],
    }
    serde_json::to_string(&Reply {
        cni_version: &requested,
        supported_versions: SUPPORTED_VERSIONS,
    })
    .map_err(|e| CniError::decode_failure(format!("failed to encode VERSION reply: {e}")))
}

fn requested_version(stdin: &[u8]) -> Result<String, CniError> {
    if stdin.iter().all(u8::is_ascii_whitespace) {
        return Ok(LATEST_VERSION.to_string());
    }
    let value: serde_json::Value = serde_json::from_slice(stdin)
        .map_err(|e| CniError::decode_failure(format!("error decoding VERSION input: {e}")))?;
    let obj = value
        .as_object()
        .ok_or_else(|| CniError::decode_failure("VERSION input is not a JSON object"))?;
    match obj.get("cniVersion") {
        None | Some(serde_json::Value::Null) => Ok(LATEST_VERSION.to_string()),
        Some(serde_json::Value::String(s)) if s.is_empty() => Ok(LATEST_VERSION.to_string()),
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(CniError::decode_failure(
            "VERSION input: cniVersion must be a string",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_list() {
        assert_eq!(SUPPORTED_VERSIONS, &["0.4.0", "1.0.0", "1.1.0"]);
        assert!(is_supported("1.0.0"));
        assert!(!is_supported("1.0"));
        assert!(!is_supported("0.3.1"));
        assert!(SUPPORTED_VERSIONS.contains(&LATEST_VERSION));
    }

    #[test]
    fn at_least() {
        assert!(version_at_least("1.1.0", "1.1.0"));
        assert!(version_at_least("1.1.0", "1.0.0"));
        assert!(version_at_least("1.0.0", "0.4.0"));
        assert!(version_at_least("0.10.0", "0.4.0"));
        assert!(version_at_least("2.0.0", "1.1.0"));
        assert!(version_at_least("1.1", "1.1.0"));
        assert!(version_at_least("1", "0.4.0"));
        assert!(!version_at_least("1.0.0", "1.1.0"));
        assert!(!version_at_least("0.3.1", "0.4.0"));
        assert!(!version_at_least("0.4.0", "0.4.1"));
        assert!(!version_at_least("", "0.0.0"));
        assert!(!version_at_least("1.x.0", "0.0.0"));
        assert!(!version_at_least("1.0.0.0", "0.0.0"));
        assert!(!version_at_least("1..0", "0.0.0"));
        assert!(!version_at_least("-1.0.0", "0.0.0"));
        assert!(!version_at_least("1.0.0", "bogus"));
    }

    #[test]
    fn reply_echoes_version() {
        assert_eq!(
            version_reply(br#"{"cniVersion":"1.0.0"}"#).unwrap(),
            r#"{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}"#
        );
        // An unsupported version is echoed too; the runtime decides.
        assert_eq!(
            version_reply(br#"{"cniVersion":"0.3.1","name":"x"}"#).unwrap(),
            r#"{"cniVersion":"0.3.1","supportedVersions":["0.4.0","1.0.0","1.1.0"]}"#
        );
    }

    #[test]
    fn reply_defaults_to_latest() {
        let want = r#"{"cniVersion":"1.1.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}"#;
        for input in [
            &b""[..],
            b"  \n",
            b"{}",
            br#"{"cniVersion":""}"#,
            br#"{"cniVersion":null}"#,
        ] {
            assert_eq!(version_reply(input).unwrap(), want, "input {input:?}");
        }
    }

    #[test]
    fn reply_errors() {
        for input in [
            &b"not json"[..],
            b"[]",
            b"\"1.0.0\"",
            br#"{"cniVersion":1}"#,
        ] {
            let e = version_reply(input).unwrap_err();
            assert_eq!(e.code, CniError::DECODE_FAILURE, "input {input:?}");
        }
    }
}
