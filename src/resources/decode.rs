//! Reading a resource out of a parsed document with errors that name the field
//! ([`decode`]), and the error every conversion of a resource reports
//! ([`InvalidObject`]).

use std::fmt;

use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_path_to_error::{Path, Segment};

/// An object podnet cannot use: which object, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidObject {
    /// `CiliumPodIPPool "mars"` (see [`super::ObjectMeta::describe`]).
    pub object: String,
    /// `spec.ipv4.cidrs[1]: 10.1.2.3/16 has host bits set; did you mean 10.1.0.0/16?`
    pub problem: String,
}

impl fmt::Display for InvalidObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.problem)
    }
}

impl std::error::Error for InvalidObject {}

/// Deserializes `value` into `T`. The error names the field and says what is
/// wrong in the words the rest of podnet uses: `spec.ipv4.maskSize must be a
/// number, not a string`, `metadata.labels.tier must be a string, not a number
/// (quote it)`, `spec.ipv4.cidrs[1]: "10.0.0.0/33" is not a CIDR (...)`,
/// `spec.pools.requested[0].pool is missing`.
pub fn decode<T: DeserializeOwned>(value: &Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let message = e.inner().to_string();
        describe_error(value, e.path(), &message)
    })
}

fn describe_error(root: &Value, path: &Path, message: &str) -> String {
    let at = path.to_string();
    let field = if path.iter().len() == 0 {
        "the object".to_string()
    } else {
        at.clone()
    };
    if let Some(missing) = message
        .strip_prefix("missing field `")
        .and_then(|m| m.strip_suffix('`'))
    {
        return if path.iter().len() == 0 {
            format!("{missing} is missing")
        } else {
            format!("{at}.{missing} is missing")
        };
    }
    // A struct also reads from a list (by position): a list of the wrong length is
    // the same mistake as any other non-map.
    let mismatch = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid length "))
        .and_then(|m| m.rsplit_once(", expected "));
    if let (Some((_, expected)), Some(actual)) = (mismatch, value_at(root, path)) {
        return type_mismatch(&field, expected, actual);
    }
    if path.iter().len() == 0 {
        message.to_string()
    } else {
        format!("{at}: {message}")
    }
}

/// `<field> must be <what serde expected>, not <what the document has>`.
fn type_mismatch(field: &str, expected: &str, actual: &Value) -> String {
    let integer = matches!(
        expected,
        "u8" | "u16" | "u32" | "u64" | "i8" | "i16" | "i32" | "i64"
    );
    if integer && actual.is_number() {
        return format!("{field} must be a whole number, not {actual}");
    }
    let wanted = match expected {
        _ if integer => "a number",
        "a boolean" => "true or false",
        "a sequence" => "a list",
        s if s.starts_with("struct ") => "a map",
        other => other,
    };
    let quote = if wanted == "a string" && (actual.is_number() || actual.is_boolean()) {
        " (quote it)"
    } else {
        ""
    };
    format!("{field} must be {wanted}, not {}{quote}", type_name(actual))
}

/// The value `path` points at, if it can be followed.
fn value_at<'a>(root: &'a Value, path: &Path) -> Option<&'a Value> {
    path.iter().try_fold(root, |v, seg| match seg {
        Segment::Seq { index } => v.get(*index),
        Segment::Map { key } => v.get(key.as_str()),
        Segment::Enum { .. } | Segment::Unknown => None,
    })
}

/// `a string`, `a number`, ... (how messages name what the document has).
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Thing {
        name: String,
        #[serde(default)]
        size: u32,
        #[serde(default)]
        tags: BTreeMap<String, String>,
        #[serde(default)]
        parts: Vec<Part>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Part {
        on: bool,
    }

    #[test]
    fn errors_name_the_field() {
        let err = |v: Value| decode::<Thing>(&v).unwrap_err();
        assert_eq!(err(json!({})), "name is missing");
        assert_eq!(err(json!([])), "the object must be a map, not a list");
        assert_eq!(
            err(json!({"name": "a", "parts": [{"on": true}, {}]})),
            "parts[1].on is missing"
        );
        assert_eq!(
            err(json!({"name": "a", "parts": [{"on": "yes"}]})),
            "parts[0].on must be true or false, not a string"
        );
        assert_eq!(
            err(json!({"name": "a", "tags": {"v": 1.5}})),
            "tags.v must be a string, not a number (quote it)"
        );
        assert_eq!(
            err(json!({"name": "a", "tags": {"v": null}})),
            "tags.v must be a string, not null"
        );
        assert_eq!(
            err(json!({"name": "a", "size": -1})),
            "size: invalid value: integer `-1`, expected u32"
        );
        assert_eq!(
            InvalidObject {
                object: "CiliumPodIPPool \"mars\"".into(),
                problem: "spec is missing".into()
            }
            .to_string(),
            "CiliumPodIPPool \"mars\": spec is missing"
        );
    }
}
