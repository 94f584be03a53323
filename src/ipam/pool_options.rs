//! Multi-pool options given as strings: the agent's `ipam-multi-pool-pre-allocation`
//! (Cilium `pkg/command/map_string.go` `ToStringMapStringE` +
//! `ParseMultiPoolPreAllocMap`) and the operator's `auto-create-cilium-pod-ip-pools`
//! (the same map grammar, each value a pool spec as in Cilium's `ParsePoolSpec`).
//!
//! Map grammar (Cilium's): the value is tried as a JSON object of strings first; a
//! JSON syntax error on a value starting with `{` or `[` is kept; otherwise the value
//! must be `k1=v1,k2=v2` where keys use word characters plus `-:;./@` and values may
//! also hold `,` (and inner spaces). A comma only starts a new pair when the segment
//! after it contains `=`.

use std::collections::BTreeMap;

use ipnet::IpNet;

use super::Family;
use super::pool_cidr::{PoolCidrError, parse_pool_cidr};
use super::pooldef::{PoolDef, PoolFamilySpec};
use super::selection::is_dns1123_subdomain;

/// Why a multi-pool option value was refused. Each variant carries the bad value
/// and, where there is one, the pool or the spec key it was given for; the texts
/// are Cilium's where Cilium has one (`'...' is not formatted as ...`,
/// `strconv.ParseInt: ...`, `json: cannot unmarshal ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolOptionError {
    /// The value is not in the `k1=v1,k2=v2` grammar.
    #[error("'{value}' is not formatted as key=value,key1=value1")]
    NotKeyValue { value: String },
    /// One pair of the value is not `key=value`.
    #[error("'{pair}' in '{value}' is not formatted as key=value,key1=value1")]
    PairNotKeyValue { pair: String, value: String },
    /// The value starts like JSON (`{` or `[`) but does not parse.
    #[error("invalid JSON: {reason}")]
    InvalidJson { reason: String },
    /// The JSON reader failed other than on syntax (its own words).
    #[error("{reason}")]
    Json { reason: String },
    /// The JSON map holds a value that is not a string.
    #[error("json: cannot unmarshal {kind} into Go value of type string")]
    JsonValueNotString { kind: &'static str },
    /// The JSON value is not a map.
    #[error("json: cannot unmarshal {kind} into Go value of type map[string]string")]
    JsonNotAMap { kind: &'static str },
    /// A pre-allocation value is not a base-10 number.
    #[error("invalid value for pool {pool:?}: strconv.ParseInt: parsing {value:?}: invalid syntax")]
    CountNotANumber { pool: String, value: String },
    /// A pre-allocation value does not fit an int32.
    #[error(
        "invalid value for pool {pool:?}: strconv.ParseInt: parsing {value:?}: value out of range"
    )]
    CountOutOfRange { pool: String, value: String },
    /// A pre-allocation value is below 0.
    #[error("invalid value for pool {pool:?}: {count} is negative (must be >= 0)")]
    CountNegative { pool: String, count: i64 },
    /// An auto-created pool's name cannot be an object name.
    #[error(
        "invalid pool name {name:?}: must be a DNS-1123 subdomain (lower-case letters, digits, \
         '-' and '.')"
    )]
    PoolName { name: String },
    /// A pool spec field without `:` between key and value.
    #[error("invalid number of key delimiters in pool spec {spec}")]
    SpecField { spec: String },
    /// A pool spec key podnet (and Cilium) does not know.
    #[error(
        "unknown key {key:?} in pool spec {spec} (expected ipv4-cidrs, ipv4-mask-size, \
         ipv6-cidrs, ipv6-mask-size, allow-first-ip or allow-last-ip)"
    )]
    UnknownKey { key: String, spec: String },
    /// A CIDR of `ipv4-cidrs` / `ipv6-cidrs` is refused.
    #[error("invalid value for key {key:?}: {source}")]
    Cidr {
        key: String,
        #[source]
        source: PoolCidrError,
    },
    /// A mask size that is not a number.
    #[error("invalid value for key {key:?}: {value:?} is not a number")]
    MaskNotANumber { key: String, value: String },
    /// A mask size outside `1..=bits`.
    #[error("invalid value for key {key:?}: {mask} is out of range (1..{bits})")]
    MaskOutOfRange { key: String, mask: u8, bits: u8 },
    /// `allow-first-ip` / `allow-last-ip` not a Go boolean.
    #[error("invalid value for key {key:?}: {value:?} is not a boolean")]
    NotABool { key: String, value: String },
    /// `<family>-cidrs` without `<family>-mask-size`.
    #[error("pool spec {spec}: {family}-cidrs given without {family}-mask-size")]
    CidrsWithoutMask { spec: String, family: &'static str },
    /// `<family>-mask-size` without `<family>-cidrs`.
    #[error("pool spec {spec}: {family}-mask-size given without {family}-cidrs")]
    MaskWithoutCidrs { spec: String, family: &'static str },
    /// A pool spec with no family.
    #[error("pool spec {spec} defines neither ipv4-cidrs nor ipv6-cidrs")]
    NoFamily { spec: String },
}

/// Pre-allocation of the default pool when the option is empty.
pub const DEFAULT_PRE_ALLOCATION: u64 = 8;

/// Parses `ipam-multi-pool-pre-allocation`. Empty (or an empty map) gives
/// `{default_pool: 8}`; other pools not listed pre-allocate 0 (the caller's rule).
/// Values are base-10 int32 and must not be negative.
pub fn parse_pre_allocation(
    value: &str,
    default_pool: &str,
) -> Result<BTreeMap<String, u64>, PoolOptionError> {
    let raw = parse_string_map(value)?;
    if raw.is_empty() {
        return Ok(BTreeMap::from([(
            default_pool.to_string(),
            DEFAULT_PRE_ALLOCATION,
        )]));
    }
    let mut out = BTreeMap::new();
    for (pool, v) in raw {
        let n = parse_int32(&pool, &v)?;
        let count = u64::try_from(n).map_err(|_| PoolOptionError::CountNegative {
            pool: pool.clone(),
            count: n,
        })?;
        out.insert(pool, count);
    }
    Ok(out)
}

/// Parses `auto-create-cilium-pod-ip-pools`: `<pool>=<spec>` entries in the map
/// grammar (whitespace is also accepted between entries, as the Helm chart renders
/// them), each `<spec>` being
/// `ipv4-cidrs:<cidr>[,<cidr>...];ipv4-mask-size:<n>[;ipv6-cidrs:...;ipv6-mask-size:<n>][;allow-first-ip:<bool>][;allow-last-ip:<bool>]`.
/// Returns the pools sorted by name.
pub fn parse_auto_create_pools(value: &str) -> Result<Vec<PoolDef>, PoolOptionError> {
    let raw = if value.trim().is_empty() {
        BTreeMap::new()
    } else if looks_like_json(value) {
        parse_string_map(value)?
    } else {
        split_pool_entries(value)?
    };
    let mut pools = Vec::with_capacity(raw.len());
    for (name, spec) in raw {
        if !is_dns1123_subdomain(&name) {
            return Err(PoolOptionError::PoolName { name });
        }
        let mut pool = parse_pool_spec(&spec)?;
        pool.name = name;
        pools.push(pool);
    }
    Ok(pools)
}

/// Parses one pool spec (`ipv4-cidrs:...;ipv4-mask-size:...`). Spaces are removed
/// first, empty fields skipped; the returned pool has no name.
pub fn parse_pool_spec(spec: &str) -> Result<PoolDef, PoolOptionError> {
    let compact: String = spec.chars().filter(|c| *c != ' ').collect();
    let mut cidrs: [Vec<IpNet>; 2] = [Vec::new(), Vec::new()];
    let mut masks: [Option<u8>; 2] = [None, None];
    let mut pool = PoolDef::default();
    for field in compact.split(';').filter(|f| !f.is_empty()) {
        let Some((key, value)) = field.split_once(':') else {
            return Err(PoolOptionError::SpecField { spec: spec.into() });
        };
        match key {
            "ipv4-cidrs" | "ipv6-cidrs" => {
                let family = if key == "ipv4-cidrs" {
                    Family::V4
                } else {
                    Family::V6
                };
                for c in value.split(',') {
                    let net =
                        parse_pool_cidr(c, family).map_err(|source| PoolOptionError::Cidr {
                            key: key.into(),
                            source,
                        })?;
                    cidrs[family as usize].push(net);
                }
            }
            "ipv4-mask-size" | "ipv6-mask-size" => {
                let family = if key == "ipv4-mask-size" {
                    Family::V4
                } else {
                    Family::V6
                };
                let n: u8 = value
                    .parse()
                    .ok()
                    .filter(|_| value.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| PoolOptionError::MaskNotANumber {
                        key: key.into(),
                        value: value.into(),
                    })?;
                if n < 1 || n > family.bits() {
                    return Err(PoolOptionError::MaskOutOfRange {
                        key: key.into(),
                        mask: n,
                        bits: family.bits(),
                    });
                }
                masks[family as usize] = Some(n);
            }
            "allow-first-ip" => pool.allow_first_ip = spec_bool(key, value)?,
            "allow-last-ip" => pool.allow_last_ip = spec_bool(key, value)?,
            other => {
                return Err(PoolOptionError::UnknownKey {
                    key: other.into(),
                    spec: spec.into(),
                });
            }
        }
    }
    for family in [Family::V4, Family::V6] {
        let i = family as usize;
        let fam = family.as_str();
        let spec_for = match (cidrs[i].is_empty(), masks[i]) {
            (true, None) => None,
            (false, Some(mask_size)) => Some(PoolFamilySpec {
                cidrs: std::mem::take(&mut cidrs[i]),
                mask_size,
                reserved_ranges: Vec::new(),
            }),
            (false, None) => {
                return Err(PoolOptionError::CidrsWithoutMask {
                    spec: spec.into(),
                    family: fam,
                });
            }
            (true, Some(_)) => {
                return Err(PoolOptionError::MaskWithoutCidrs {
                    spec: spec.into(),
                    family: fam,
                });
            }
        };
        match family {
            Family::V4 => pool.ipv4 = spec_for,
            Family::V6 => pool.ipv6 = spec_for,
        }
    }
    if pool.ipv4.is_none() && pool.ipv6.is_none() {
        return Err(PoolOptionError::NoFamily { spec: spec.into() });
    }
    Ok(pool)
}

/// `allow-first-ip` / `allow-last-ip`: a Go boolean.
fn spec_bool(key: &str, value: &str) -> Result<bool, PoolOptionError> {
    parse_go_bool(value).ok_or_else(|| PoolOptionError::NotABool {
        key: key.into(),
        value: value.into(),
    })
}

fn looks_like_json(s: &str) -> bool {
    matches!(s.trim_start().chars().next(), Some('{') | Some('['))
}

/// Cilium's `ToStringMapStringE` for a string value.
pub fn parse_string_map(s: &str) -> Result<BTreeMap<String, String>, PoolOptionError> {
    match serde_json::from_str::<serde_json::Value>(s) {
        Ok(v) => json_string_map(v),
        Err(e)
            if !matches!(
                e.classify(),
                serde_json::error::Category::Syntax | serde_json::error::Category::Eof
            ) =>
        {
            Err(PoolOptionError::Json {
                reason: e.to_string(),
            })
        }
        Err(e) => {
            if s.is_empty() {
                return Ok(BTreeMap::new());
            }
            if looks_like_json(s) {
                return Err(PoolOptionError::InvalidJson {
                    reason: e.to_string(),
                });
            }
            if !is_valid_key_value_pairs(s) {
                return Err(PoolOptionError::NotKeyValue { value: s.into() });
            }
            let mut out = BTreeMap::new();
            for kv in split_key_value(s) {
                let parts: Vec<&str> = kv.split('=').collect();
                if parts.len() != 2 {
                    return Err(PoolOptionError::PairNotKeyValue {
                        pair: kv.into(),
                        value: s.into(),
                    });
                }
                out.insert(parts[0].to_string(), parts[1].to_string());
            }
            Ok(out)
        }
    }
}

/// Go `json.Unmarshal` into `map[string]string`.
fn json_string_map(v: serde_json::Value) -> Result<BTreeMap<String, String>, PoolOptionError> {
    use serde_json::Value;
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    match v {
        Value::Null => Ok(BTreeMap::new()),
        Value::Object(m) => m
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k, s)),
                Value::Null => Ok((k, String::new())),
                other => Err(PoolOptionError::JsonValueNotString { kind: kind(&other) }),
            })
            .collect(),
        other => Err(PoolOptionError::JsonNotAMap { kind: kind(&other) }),
    }
}

/// Key characters: Go `[\w-:;./@]` (ASCII word characters plus `-:;./@`).
fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | ':' | ';' | '.' | '/' | '@')
}

/// Value characters: key characters plus `,`; a space may appear inside values.
fn is_value_char(c: char) -> bool {
    is_key_char(c) || c == ','
}

/// Cilium's `keyValueRegex` as a full match (what `isValidKeyValuePair` checks):
/// `(K+=(V[V ]*V)?V*,)*K+=(V[V ]*)?K+`. Keys cannot hold `=` or `,`, so each `=` ends a
/// key that starts after the last comma before it; the text in between is the
/// previous value, which must not start or end with a space (the last value must
/// also end with a key character and not be empty).
fn is_valid_key_value_pairs(s: &str) -> bool {
    if s.is_empty() {
        return true;
    }
    if !s.chars().all(|c| is_value_char(c) || c == ' ' || c == '=') {
        return false;
    }
    let segments: Vec<&str> = s.split('=').collect();
    if segments.len() < 2 {
        return false;
    }
    let key_ok = |k: &str| !k.is_empty() && k.chars().all(is_key_char);
    let no_edge_space = |v: &str| !v.starts_with(' ') && !v.ends_with(' ');
    if !key_ok(segments[0]) {
        return false;
    }
    for seg in &segments[1..segments.len() - 1] {
        let Some((value, key)) = seg.rsplit_once(',') else {
            return false;
        };
        if !key_ok(key) || !no_edge_space(value) {
            return false;
        }
    }
    let last = segments[segments.len() - 1];
    !last.is_empty() && !last.starts_with(' ') && last.chars().last().is_some_and(is_key_char)
}

/// Cilium's `splitKeyValue`: split on `,` only where the segment up to the next
/// comma contains `=`.
fn split_key_value(s: &str) -> Vec<&str> {
    let commas: Vec<usize> = s.match_indices(',').map(|(i, _)| i).collect();
    let equals = s.matches('=').count();
    if commas.is_empty() || equals == 1 {
        return vec![s];
    }
    if commas.len() == 1 {
        return vec![&s[..commas[0]], &s[commas[0] + 1..]];
    }
    let mut out = Vec::new();
    let mut start = 0;
    for (i, &c) in commas.iter().enumerate() {
        let end = commas.get(i + 1).copied().unwrap_or(s.len());
        if s[c..end].contains('=') {
            out.push(&s[start..c]);
            start = c + 1;
        }
    }
    out.push(&s[start..]);
    out
}

/// The map grammar for `auto-create-cilium-pod-ip-pools`, also accepting whitespace
/// (and whitespace around commas) between entries: each `=` ends a key, which starts
/// after the last separator (`,` or whitespace) before it; the previous value is the
/// text in between, without trailing separators.
fn split_pool_entries(s: &str) -> Result<BTreeMap<String, String>, PoolOptionError> {
    let bad = || PoolOptionError::NotKeyValue { value: s.into() };
    let s_trim = s.trim();
    let is_sep = |c: char| c == ',' || c.is_whitespace();
    let eqs: Vec<usize> = s_trim.match_indices('=').map(|(i, _)| i).collect();
    if eqs.is_empty() {
        return Err(bad());
    }
    // Key start for each '='.
    let mut keys = Vec::with_capacity(eqs.len());
    for (n, &eq) in eqs.iter().enumerate() {
        let before = &s_trim[..eq];
        let key_start = before
            .rfind(|c: char| !is_key_char(c))
            .map(|i| i + 1)
            .unwrap_or(0);
        let key = &before[key_start..];
        let preceded_ok = key_start == 0 || before[..key_start].chars().last().is_some_and(is_sep);
        let prev_value_start = if n == 0 { 0 } else { eqs[n - 1] + 1 };
        if key.is_empty()
            || !preceded_ok
            || (n == 0 && key_start != 0)
            || key_start < prev_value_start
        {
            return Err(bad());
        }
        keys.push((key_start, key));
    }
    let mut out = BTreeMap::new();
    for (n, &(_, key)) in keys.iter().enumerate() {
        let value_start = eqs[n] + 1;
        let value_end = keys.get(n + 1).map(|&(ks, _)| ks).unwrap_or(s_trim.len());
        let value = s_trim[value_start..value_end]
            .trim_end_matches(is_sep)
            .trim();
        if value.is_empty() {
            return Err(PoolOptionError::PairNotKeyValue {
                pair: format!("{key}={value}"),
                value: s.into(),
            });
        }
        out.insert(key.to_string(), value.to_string());
    }
    Ok(out)
}

/// Go `strconv.ParseInt(s, 10, 32)` of `pool`'s value, with Go's error texts.
fn parse_int32(pool: &str, s: &str) -> Result<i64, PoolOptionError> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PoolOptionError::CountNotANumber {
            pool: pool.into(),
            value: s.into(),
        });
    }
    match s.parse::<i64>() {
        Ok(n) if i32::try_from(n).is_ok() => Ok(n),
        _ => Err(PoolOptionError::CountOutOfRange {
            pool: pool.into(),
            value: s.into(),
        }),
    }
}

/// Go `strconv.ParseBool`.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pre(v: &str) -> Result<Vec<(String, u64)>, String> {
        parse_pre_allocation(v, "default")
            .map(|m| m.into_iter().collect())
            .map_err(|e| e.to_string())
    }

    fn kv(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn pre_allocation_empty_is_default_8() {
        assert_eq!(pre("").unwrap(), kv(&[("default", 8)]));
        assert_eq!(pre("{}").unwrap(), kv(&[("default", 8)]));
        assert_eq!(
            parse_pre_allocation("", "dc1").unwrap(),
            BTreeMap::from([("dc1".into(), 8)])
        );
    }

    #[test]
    fn pre_allocation_key_value() {
        assert_eq!(
            pre("default=8,mars=4").unwrap(),
            kv(&[("default", 8), ("mars", 4)])
        );
        assert_eq!(pre("mars=0").unwrap(), kv(&[("mars", 0)]));
        assert_eq!(
            pre("a.b/c@d:e;f_g-h=16").unwrap(),
            kv(&[("a.b/c@d:e;f_g-h", 16)])
        );
        assert_eq!(pre("a=1,a=2").unwrap(), kv(&[("a", 2)]));
    }

    #[test]
    fn pre_allocation_json() {
        assert_eq!(
            pre(r#"{"default":"8","mars":"4"}"#).unwrap(),
            kv(&[("default", 8), ("mars", 4)])
        );
        assert_eq!(pre(r#"  { "mars" : "2" }  "#).unwrap(), kv(&[("mars", 2)]));
        assert_eq!(
            pre(r#"{"default":8}"#).unwrap_err(),
            "json: cannot unmarshal number into Go value of type string"
        );
        assert_eq!(
            pre("[1]").unwrap_err(),
            "json: cannot unmarshal array into Go value of type map[string]string"
        );
        assert_eq!(
            pre("8").unwrap_err(),
            "json: cannot unmarshal number into Go value of type map[string]string"
        );
        // Starts with '{' or '[': the JSON error is kept.
        assert!(pre("{default=8}").unwrap_err().starts_with("invalid JSON:"));
        assert!(pre("[default=8").unwrap_err().starts_with("invalid JSON:"));
    }

    #[test]
    fn pre_allocation_errors() {
        // '+' is outside the grammar's character set.
        assert_eq!(
            pre("default=+3").unwrap_err(),
            "'default=+3' is not formatted as key=value,key1=value1"
        );
        assert_eq!(
            pre("default").unwrap_err(),
            "'default' is not formatted as key=value,key1=value1"
        );
        assert_eq!(
            pre("default=8 mars=4").unwrap_err(),
            "'default=8 mars=4' is not formatted as key=value,key1=value1"
        );
        assert_eq!(
            pre("default=8, mars=4").unwrap_err(),
            "'default=8, mars=4' is not formatted as key=value,key1=value1"
        );
        assert_eq!(
            pre("=8").unwrap_err(),
            "'=8' is not formatted as key=value,key1=value1"
        );
        assert_eq!(
            pre("a=").unwrap_err(),
            "'a=' is not formatted as key=value,key1=value1"
        );
        assert_eq!(
            pre("a=b=c").unwrap_err(),
            "'a=b=c' is not formatted as key=value,key1=value1"
        );
        assert_eq!(
            pre(" ").unwrap_err(),
            "' ' is not formatted as key=value,key1=value1"
        );
        assert_eq!(
            pre("default=x").unwrap_err(),
            r#"invalid value for pool "default": strconv.ParseInt: parsing "x": invalid syntax"#
        );
        assert_eq!(
            pre("default=8,mars=4,4").unwrap_err(),
            r#"invalid value for pool "mars": strconv.ParseInt: parsing "4,4": invalid syntax"#
        );
        assert_eq!(
            pre("default=2147483648").unwrap_err(),
            r#"invalid value for pool "default": strconv.ParseInt: parsing "2147483648": value out of range"#
        );
        assert_eq!(
            pre("default=2147483647").unwrap(),
            kv(&[("default", 2147483647)])
        );
        assert_eq!(
            pre("default=-1").unwrap_err(),
            r#"invalid value for pool "default": -1 is negative (must be >= 0)"#
        );
        assert_eq!(
            pre(r#"{"default":""}"#).unwrap_err(),
            r#"invalid value for pool "default": strconv.ParseInt: parsing "": invalid syntax"#
        );
    }

    #[test]
    fn key_value_grammar_matches_cilium() {
        // Cilium's own examples.
        assert!(is_valid_key_value_pairs(
            "c6a.2xlarge=4,15,15,m4.xlarge=2,4,8"
        ));
        assert_eq!(
            split_key_value("c6a.2xlarge=4,15,15,m4.xlarge=2,4,8"),
            ["c6a.2xlarge=4,15,15", "m4.xlarge=2,4,8"]
        );
        assert_eq!(
            split_key_value("key=option1:value1,option2:value2"),
            ["key=option1:value1,option2:value2"]
        );
        assert_eq!(split_key_value("k1=v1,k2=v2"), ["k1=v1", "k2=v2"]);
        assert!(is_valid_key_value_pairs("k1=v 1,k2=v 2"));
        assert!(is_valid_key_value_pairs("k1=,k2=v"));
        assert!(is_valid_key_value_pairs("k1=1,,k2=v"));
        assert!(!is_valid_key_value_pairs("k1=v ,k2=v"));
        assert!(!is_valid_key_value_pairs("k1= v,k2=v"));
        assert!(!is_valid_key_value_pairs("k1=v,"));
        assert!(is_valid_key_value_pairs("k1=v,k2")); // one pair, value "v,k2"
        assert!(!is_valid_key_value_pairs("k 1=v"));
        assert!(!is_valid_key_value_pairs("k1=v!"));
        let m = parse_string_map("k1=1,,k2=v").unwrap();
        assert_eq!(m["k1"], "1,");
        assert_eq!(m["k2"], "v");
    }

    // ---- auto-create pools ----

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn auto_create_two_pools_with_lookahead_commas() {
        let pools = parse_auto_create_pools(
            "default=ipv4-cidrs:10.10.0.0/16,10.11.0.0/16;ipv4-mask-size:27,\
             mars=ipv4-cidrs:10.20.0.0/16;ipv4-mask-size:27",
        )
        .unwrap();
        assert_eq!(pools.len(), 2);
        assert_eq!(pools[0].name, "default");
        let v4 = pools[0].ipv4.as_ref().unwrap();
        assert_eq!(v4.cidrs, vec![net("10.10.0.0/16"), net("10.11.0.0/16")]);
        assert_eq!(v4.mask_size, 27);
        assert!(pools[0].ipv6.is_none());
        assert_eq!(pools[1].name, "mars");
        assert_eq!(
            pools[1].ipv4.as_ref().unwrap().cidrs,
            vec![net("10.20.0.0/16")]
        );
        assert!(!pools[1].allow_first_ip && !pools[1].allow_last_ip);
        assert!(pools[1].pod_selector.is_none() && pools[1].namespace_selector.is_none());
    }

    #[test]
    fn auto_create_whitespace_between_pools_and_inside_specs() {
        let want = parse_auto_create_pools(
            "default=ipv4-cidrs:10.10.0.0/16;ipv4-mask-size:27,mars=ipv4-cidrs:10.20.0.0/16;ipv4-mask-size:27",
        )
        .unwrap();
        for v in [
            "default=ipv4-cidrs:10.10.0.0/16;ipv4-mask-size:27 mars=ipv4-cidrs:10.20.0.0/16;ipv4-mask-size:27",
            "  default=ipv4-cidrs:10.10.0.0/16;ipv4-mask-size:27\n\tmars=ipv4-cidrs:10.20.0.0/16;ipv4-mask-size:27\n",
            "default=ipv4-cidrs:10.10.0.0/16;ipv4-mask-size:27, mars=ipv4-cidrs:10.20.0.0/16;ipv4-mask-size:27",
            "default=ipv4-cidrs: 10.10.0.0/16; ipv4-mask-size: 27; mars=ipv4-cidrs:10.20.0.0/16;ipv4-mask-size:27;",
        ] {
            assert_eq!(parse_auto_create_pools(v).unwrap(), want, "{v}");
        }
    }

    #[test]
    fn auto_create_dual_stack_and_flags() {
        let pools = parse_auto_create_pools(
            "dual=ipv4-cidrs:10.0.0.0/8;ipv4-mask-size:24;ipv6-cidrs:fd00::/104,fd01::/104;\
             ipv6-mask-size:120;allow-first-ip:true;allow-last-ip:T",
        )
        .unwrap();
        let p = &pools[0];
        assert_eq!(
            p.ipv6.as_ref().unwrap().cidrs,
            vec![net("fd00::/104"), net("fd01::/104")]
        );
        assert_eq!(p.ipv6.as_ref().unwrap().mask_size, 120);
        assert!(p.allow_first_ip && p.allow_last_ip);
        let v6only =
            parse_auto_create_pools("v6=ipv6-cidrs:fd00::/104;ipv6-mask-size:112").unwrap();
        assert!(v6only[0].ipv4.is_none());
    }

    #[test]
    fn auto_create_json() {
        let pools = parse_auto_create_pools(
            r#"{"default":"ipv4-cidrs:10.10.0.0/16;ipv4-mask-size:27","mars":"ipv4-cidrs:10.20.0.0/16,10.21.0.0/16;ipv4-mask-size:26"}"#,
        )
        .unwrap();
        assert_eq!(
            pools.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["default", "mars"]
        );
        assert_eq!(pools[1].ipv4.as_ref().unwrap().cidrs.len(), 2);
        assert_eq!(pools[1].ipv4.as_ref().unwrap().mask_size, 26);
        assert!(
            parse_auto_create_pools("{")
                .unwrap_err()
                .to_string()
                .starts_with("invalid JSON:")
        );
        assert!(parse_auto_create_pools("").unwrap().is_empty());
        assert!(parse_auto_create_pools(" \n").unwrap().is_empty());
    }

    #[test]
    fn auto_create_errors() {
        let e = |v: &str| parse_auto_create_pools(v).unwrap_err().to_string();
        assert_eq!(
            e("default"),
            "'default' is not formatted as key=value,key1=value1"
        );
        assert_eq!(
            e("=ipv4-cidrs:10.0.0.0/8"),
            "'=ipv4-cidrs:10.0.0.0/8' is not formatted as key=value,key1=value1"
        );
        assert_eq!(
            e("default=,mars=ipv4-cidrs:10.0.0.0/8;ipv4-mask-size:24"),
            "'default=' in 'default=,mars=ipv4-cidrs:10.0.0.0/8;ipv4-mask-size:24' is not \
             formatted as key=value,key1=value1"
        );
        assert_eq!(
            e("default=ipv4-cidrs:10.0.0.0/8;ipv4-mask-size"),
            "invalid number of key delimiters in pool spec ipv4-cidrs:10.0.0.0/8;ipv4-mask-size"
        );
        assert!(
            e("default=ipv4-cidr:10.0.0.0/8")
                .starts_with(r#"unknown key "ipv4-cidr" in pool spec ipv4-cidr:10.0.0.0/8"#)
        );
        assert_eq!(
            e("default=ipv4-cidrs:10.0.0/8;ipv4-mask-size:24"),
            r#"invalid value for key "ipv4-cidrs": "10.0.0/8" is not a CIDR (expected <address>/<prefix length>, e.g. 10.0.0.0/16)"#
        );
        assert_eq!(
            e("default=ipv4-cidrs:fd00::/104;ipv4-mask-size:24"),
            r#"invalid value for key "ipv4-cidrs": fd00::/104 is not an IPv4 CIDR"#
        );
        assert_eq!(
            e("default=ipv6-cidrs:10.0.0.0/8;ipv6-mask-size:24"),
            r#"invalid value for key "ipv6-cidrs": 10.0.0.0/8 is not an IPv6 CIDR"#
        );
        assert_eq!(
            e("default=ipv4-cidrs:10.0.0.1/8;ipv4-mask-size:24"),
            r#"invalid value for key "ipv4-cidrs": 10.0.0.1/8 has host bits set; did you mean 10.0.0.0/8?"#
        );
        assert_eq!(
            e("default=ipv4-cidrs:10.0.0.0/8"),
            "pool spec ipv4-cidrs:10.0.0.0/8: ipv4-cidrs given without ipv4-mask-size"
        );
        assert_eq!(
            e("default=ipv4-cidrs:10.0.0.0/8;ipv4-mask-size:24;ipv6-mask-size:120"),
            "pool spec ipv4-cidrs:10.0.0.0/8;ipv4-mask-size:24;ipv6-mask-size:120: ipv6-mask-size given without ipv6-cidrs"
        );
        assert_eq!(
            e("default=ipv4-cidrs:10.0.0.0/8;ipv4-mask-size:33"),
            r#"invalid value for key "ipv4-mask-size": 33 is out of range (1..32)"#
        );
        assert_eq!(
            e("default=ipv4-cidrs:10.0.0.0/8;ipv4-mask-size:0"),
            r#"invalid value for key "ipv4-mask-size": 0 is out of range (1..32)"#
        );
        assert_eq!(
            e("default=ipv6-cidrs:fd00::/104;ipv6-mask-size:129"),
            r#"invalid value for key "ipv6-mask-size": 129 is out of range (1..128)"#
        );
        assert_eq!(
            e("default=ipv4-cidrs:10.0.0.0/8;ipv4-mask-size:x"),
            r#"invalid value for key "ipv4-mask-size": "x" is not a number"#
        );
        assert_eq!(
            e("default=ipv4-cidrs:10.0.0.0/8;ipv4-mask-size:24;allow-first-ip:yes"),
            r#"invalid value for key "allow-first-ip": "yes" is not a boolean"#
        );
        assert_eq!(
            e("default=allow-first-ip:true"),
            "pool spec allow-first-ip:true defines neither ipv4-cidrs nor ipv6-cidrs"
        );
        assert!(
            e("Default=ipv4-cidrs:10.0.0.0/8;ipv4-mask-size:24")
                .starts_with(r#"invalid pool name "Default""#)
        );
    }
}
