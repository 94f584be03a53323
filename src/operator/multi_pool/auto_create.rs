//! `--auto-create-cilium-pod-ip-pools` (Cilium's operator option): the pools the
//! multi-pool operator creates at start when they do not exist (it never updates
//! one). Cilium's grammar (`<pool>=ipv4-cidrs:<cidr>[,<cidr>...];ipv4-mask-size:<n>`,
//! more pools comma-separated or in repeated options) is read by
//! `ipam::pool_options`, which the embedded operator uses too.

use serde_json::json;

use crate::ipam::pool_operator::{PoolOperator, PoolsRefused};
use crate::ipam::pool_options::{PoolOptionError, parse_auto_create_pools};
use crate::ipam::pooldef::{PoolDef, PoolFamilySpec};
use crate::k8s::objects::ApplyBody;
use crate::resources::POD_IP_POOL_KIND;

pub const OPT_AUTO_CREATE: &str = "auto-create-cilium-pod-ip-pools";

/// Why `--auto-create-cilium-pod-ip-pools` was refused.
#[derive(Debug, thiserror::Error)]
pub enum AutoCreateError {
    /// A value is not in Cilium's grammar (the pool grammar's own message).
    #[error("{OPT_AUTO_CREATE}: {0}")]
    Grammar(#[source] PoolOptionError),
    #[error("{OPT_AUTO_CREATE}: pool {0:?} is given twice")]
    GivenTwice(String),
    /// The pools do not make a valid set (overlaps, bad mask sizes, ...).
    #[error("{OPT_AUTO_CREATE}: {0}")]
    Refused(#[source] PoolsRefused),
}

/// The pools the option's values describe (each value in Cilium's grammar, read by
/// the agent's parser); pools that overlap are refused as the operator would.
pub fn parse(values: &[String]) -> Result<Vec<PoolDef>, AutoCreateError> {
    let mut pools = Vec::new();
    for value in values {
        for pool in parse_auto_create_pools(value).map_err(AutoCreateError::Grammar)? {
            if pools.iter().any(|p: &PoolDef| p.name == pool.name) {
                return Err(AutoCreateError::GivenTwice(pool.name));
            }
            pools.push(pool);
        }
    }
    PoolOperator::new(&pools).map_err(AutoCreateError::Refused)?;
    Ok(pools)
}

/// The CiliumPodIPPool for one pool, at `api_version` (the version the CRD
/// serves: Cilium 1.20's operator creates v2alpha1; the fields written here are
/// the same in v2).
pub fn pool_object(def: &PoolDef, api_version: &str) -> serde_json::Value {
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
    ApplyBody::new(api_version, POD_IP_POOL_KIND, &def.name)
        .with("spec", spec.into())
        .value()
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{CiliumPodIPPool, decode};

    fn p(s: &str) -> Result<Vec<PoolDef>, AutoCreateError> {
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
        // Written at the version the CRD serves; read back, the same pool.
        for version in ["cilium.io/v2alpha1", "cilium.io/v2"] {
            let obj = pool_object(&pools[0], version);
            assert_eq!(obj["spec"]["ipv4"]["cidrs"][1], "10.11.0.0/16");
            assert_eq!(obj["spec"]["ipv4"]["maskSize"], 24);
            assert_eq!(obj["apiVersion"], version);
            assert_eq!(
                obj.to_string(),
                format!(
                    r#"{{"apiVersion":"{version}","kind":"CiliumPodIPPool","metadata":{{"name":"{}"}},"spec":{}}}"#,
                    pools[0].name, obj["spec"]
                )
            );
            let read: CiliumPodIPPool = decode(&obj).unwrap();
            assert_eq!(PoolDef::try_from(&read).unwrap(), pools[0]);
        }
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
    fn mistakes_name_the_option() {
        for (bad, says) in [
            ("a=ipv4-cidrs:10.0.0.0/8", "ipv4-mask-size"),
            ("a=ipv4-cidrs:10.0.0.0/16;ipv4-mask-size:8", "maskSize 8"),
            (
                "a=ipv4-cidrs:10.0.0.0/16;ipv4-mask-size:24,b=ipv4-cidrs:10.0.0.0/17;ipv4-mask-size:24",
                "overlaps",
            ),
        ] {
            let e = p(bad).unwrap_err().to_string();
            assert!(e.starts_with(OPT_AUTO_CREATE), "{bad}: {e}");
            assert!(e.contains(says), "{bad}: {e}");
        }
        let twice = parse(&[
            "a=ipv4-cidrs:10.1.0.0/16;ipv4-mask-size:24".into(),
            "a=ipv4-cidrs:10.2.0.0/16;ipv4-mask-size:24".into(),
        ])
        .unwrap_err()
        .to_string();
        assert!(twice.contains("given twice"), "{twice}");
    }
}
