//! `--auto-create-cilium-pod-ip-pools` (Cilium's operator option): the pools the
//! multi-pool operator creates at start when they do not exist (it never updates
//! one). Cilium's grammar: `<pool>=ipv4-cidrs:<cidr>[,<cidr>...];ipv4-mask-size:<n>`
//! with optional `ipv6-cidrs`, `ipv6-mask-size`, `allow-first-ip`, `allow-last-ip`
//! keys; pools are separated by commas (a comma-separated piece without `=`
//! continues the previous pool's CIDR list) or given by repeating the option.

use ipnet::IpNet;
use serde_json::json;

use crate::ipam::pooldef::{PoolDef, PoolFamilySpec};

pub const OPT_AUTO_CREATE: &str = "auto-create-cilium-pod-ip-pools";

/// Splits the option's values into `(pool, spec)` pairs.
fn pool_entries(values: &[String]) -> Result<Vec<(String, String)>, String> {
    let mut entries: Vec<(String, String)> = Vec::new();
    for piece in values.iter().flat_map(|v| v.split(',')) {
        let piece = piece.trim();
        if piece.is_empty() {
            continue;
        }
        match piece.split_once('=') {
            Some((name, spec)) => entries.push((name.trim().to_string(), spec.to_string())),
            None => match entries.last_mut() {
                Some((_, spec)) => {
                    spec.push(',');
                    spec.push_str(piece);
                }
                None => {
                    return Err(format!(
                        "{OPT_AUTO_CREATE}: {piece:?} is not <pool>=ipv4-cidrs:<cidrs>;ipv4-mask-size:<n>"
                    ));
                }
            },
        }
    }
    Ok(entries)
}

fn parse_family(
    pool: &str,
    family: &str,
    cidrs: Option<&str>,
    mask: Option<&str>,
) -> Result<Option<PoolFamilySpec>, String> {
    let (cidrs, mask) = match (cidrs, mask) {
        (None, None) => return Ok(None),
        (Some(c), Some(m)) => (c, m),
        (Some(_), None) => {
            return Err(format!(
                "{OPT_AUTO_CREATE}: pool {pool:?} has {family}-cidrs but no {family}-mask-size"
            ));
        }
        (None, Some(_)) => {
            return Err(format!(
                "{OPT_AUTO_CREATE}: pool {pool:?} has {family}-mask-size but no {family}-cidrs"
            ));
        }
    };
    let cidrs = cidrs
        .split(',')
        .map(|c| {
            c.trim()
                .parse::<IpNet>()
                .map_err(|e| format!("{OPT_AUTO_CREATE}: pool {pool:?} {family}-cidrs {c:?}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let is_v4 = family == "ipv4";
    if let Some(c) = cidrs.iter().find(|c| matches!(c, IpNet::V4(_)) != is_v4) {
        return Err(format!(
            "{OPT_AUTO_CREATE}: pool {pool:?} {family}-cidrs {c} is not an {family} CIDR"
        ));
    }
    let mask_size = mask.trim().parse::<u8>().map_err(|_| {
        format!("{OPT_AUTO_CREATE}: pool {pool:?} {family}-mask-size {mask:?} is not a number")
    })?;
    Ok(Some(PoolFamilySpec {
        cidrs,
        mask_size,
        reserved_ranges: Vec::new(),
    }))
}

fn parse_bool(pool: &str, key: &str, v: &str) -> Result<bool, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("{OPT_AUTO_CREATE}: pool {pool:?} {key} {v:?} is not true or false"))
}

/// The pools the option describes; every mistake is an error naming the pool
/// and the key.
pub fn parse(values: &[String]) -> Result<Vec<PoolDef>, String> {
    let mut pools: Vec<PoolDef> = Vec::new();
    for (name, spec) in pool_entries(values)? {
        if name.is_empty() {
            return Err(format!(
                "{OPT_AUTO_CREATE}: a pool without a name in {spec:?}"
            ));
        }
        if pools.iter().any(|p| p.name == name) {
            return Err(format!("{OPT_AUTO_CREATE}: pool {name:?} is given twice"));
        }
        let mut def = PoolDef {
            name: name.clone(),
            ..Default::default()
        };
        let (mut v4c, mut v4m, mut v6c, mut v6m) = (None, None, None, None);
        for kv in spec.split(';').filter(|s| !s.trim().is_empty()) {
            let Some((key, value)) = kv.split_once(':') else {
                return Err(format!(
                    "{OPT_AUTO_CREATE}: pool {name:?}: {kv:?} is not key:value"
                ));
            };
            match key.trim() {
                "ipv4-cidrs" => v4c = Some(value),
                "ipv4-mask-size" => v4m = Some(value),
                "ipv6-cidrs" => v6c = Some(value),
                "ipv6-mask-size" => v6m = Some(value),
                "allow-first-ip" => def.allow_first_ip = parse_bool(&name, key, value)?,
                "allow-last-ip" => def.allow_last_ip = parse_bool(&name, key, value)?,
                other => {
                    return Err(format!(
                        "{OPT_AUTO_CREATE}: pool {name:?}: unknown key {other:?} (ipv4-cidrs, \
                         ipv4-mask-size, ipv6-cidrs, ipv6-mask-size, allow-first-ip, allow-last-ip)"
                    ));
                }
            }
        }
        def.ipv4 = parse_family(&name, "ipv4", v4c, v4m)?;
        def.ipv6 = parse_family(&name, "ipv6", v6c, v6m)?;
        if def.ipv4.is_none() && def.ipv6.is_none() {
            return Err(format!(
                "{OPT_AUTO_CREATE}: pool {name:?} has neither ipv4-cidrs nor ipv6-cidrs"
            ));
        }
        pools.push(def);
    }
    // The same checks the operator applies to pools it reads.
    crate::ipam::pool_operator::PoolOperator::new(&pools)
        .map_err(|e| format!("{OPT_AUTO_CREATE}: {e}"))?;
    Ok(pools)
}

/// The CiliumPodIPPool (cilium.io/v2alpha1, as Cilium 1.20's operator creates
/// it) for one pool.
pub fn pool_object(def: &PoolDef) -> serde_json::Value {
    let family = |f: &Option<PoolFamilySpec>| {
        f.as_ref()
            .map(|s| json!({"cidrs": s.cidrs, "maskSize": s.mask_size}))
    };
    let mut spec = serde_json::Map::new();
    if let Some(v4) = family(&def.ipv4) {
        spec.insert("ipv4".into(), v4);
    }
    if let Some(v6) = family(&def.ipv6) {
        spec.insert("ipv6".into(), v6);
    }
    if def.allow_first_ip {
        spec.insert("allowFirstIP".into(), json!(true));
    }
    if def.allow_last_ip {
        spec.insert("allowLastIP".into(), json!(true));
    }
    json!({
        "apiVersion": "cilium.io/v2alpha1",
        "kind": "CiliumPodIPPool",
        "metadata": {"name": def.name},
        "spec": spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Vec<PoolDef>, String> {
        parse(&[s.to_string()])
    }

    #[test]
    fn ciliums_grammar() {
        let pools = p(
            "default=ipv4-cidrs:10.10.0.0/16,10.11.0.0/16;ipv4-mask-size:24,\
                       other=ipv6-cidrs:fd00::/104;ipv6-mask-size:120;allow-first-ip:true",
        )
        .unwrap();
        assert_eq!(pools.len(), 2);
        let v4 = pools[0].ipv4.as_ref().unwrap();
        assert_eq!(pools[0].name, "default");
        assert_eq!(v4.cidrs.len(), 2);
        assert_eq!(v4.mask_size, 24);
        assert!(pools[0].ipv6.is_none());
        assert_eq!(pools[1].ipv6.as_ref().unwrap().mask_size, 120);
        assert!(pools[1].allow_first_ip);
        let obj = pool_object(&pools[0]);
        assert_eq!(obj["spec"]["ipv4"]["cidrs"][1], "10.11.0.0/16");
        assert_eq!(obj["spec"]["ipv4"]["maskSize"], 24);
        assert_eq!(obj["apiVersion"], "cilium.io/v2alpha1");
        // Repeating the option.
        let two = parse(&[
            "a=ipv4-cidrs:10.1.0.0/16;ipv4-mask-size:24".into(),
            "b=ipv4-cidrs:10.2.0.0/16;ipv4-mask-size:24".into(),
        ])
        .unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(parse(&[]).unwrap(), Vec::new());
    }

    #[test]
    fn every_mistake_names_the_pool_and_the_key() {
        for (bad, says) in [
            ("10.0.0.0/8", "is not <pool>="),
            (
                "a=ipv4-cidrs:10.0.0.0/8",
                "pool \"a\" has ipv4-cidrs but no ipv4-mask-size",
            ),
            (
                "a=ipv4-mask-size:24",
                "has ipv4-mask-size but no ipv4-cidrs",
            ),
            (
                "a=ipv4-cidrs:10.0.0.0/33;ipv4-mask-size:24",
                "pool \"a\" ipv4-cidrs",
            ),
            (
                "a=ipv4-cidrs:fd00::/64;ipv4-mask-size:24",
                "is not an ipv4 CIDR",
            ),
            (
                "a=ipv4-cidrs:10.0.0.0/8;ipv4-mask-size:x",
                "ipv4-mask-size \"x\" is not a number",
            ),
            (
                "a=ipv4-cidrs:10.0.0.0/8;ipv4-mask-size:24;colour:red",
                "unknown key \"colour\"",
            ),
            (
                "a=ipv4-cidrs:10.0.0.0/8;ipv4-mask-size:24;allow-last-ip:yes",
                "allow-last-ip",
            ),
            ("a=", "neither ipv4-cidrs nor ipv6-cidrs"),
            ("a=ipv4-cidrs:10.0.0.0/16;ipv4-mask-size:8", "maskSize 8"),
            (
                "a=ipv4-cidrs:10.0.0.0/16;ipv4-mask-size:24,a=ipv4-cidrs:10.1.0.0/16;ipv4-mask-size:24",
                "given twice",
            ),
            (
                "a=ipv4-cidrs:10.0.0.0/16;ipv4-mask-size:24,b=ipv4-cidrs:10.0.0.0/17;ipv4-mask-size:24",
                "overlaps",
            ),
        ] {
            let e = p(bad).unwrap_err();
            assert!(e.starts_with(OPT_AUTO_CREATE), "{bad}: {e}");
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
