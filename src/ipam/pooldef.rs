//! What a pool is, whatever it came from (a `CiliumPodIPPool`, the
//! `auto-create-cilium-pod-ip-pools` option, or the cluster-pool migration): its
//! CIDRs and block size per family, first/last-address rules, masquerade opt-out and
//! selectors. A `CiliumPodIPPool` becomes a pool only through the one check here
//! (`TryFrom<&CiliumPodIPPool>`), whichever backend read it.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::Family;
use super::pool_cidr::{PoolCidrError, check_pool_cidr};
use crate::resources::{
    CiliumPodIPPool, InvalidObject, LabelSelector, LabelSelectorRequirement, POD_IP_POOL_KIND,
    POD_IP_POOL_V2, POD_IP_POOL_V2ALPHA1, PoolFamily, ReservedRange,
};

/// The pool annotation that opts a pool's pods out of masquerading.
pub const ANNOTATION_SKIP_MASQUERADE: &str = "ipam.cilium.io/skip-masquerade";
/// The CiliumPodIPPool annotation that makes a pool sticky (`"true"`): its
/// addresses belong to pod identities (`operator::multi_pool::sticky`), and
/// no block of it is carved for `spec.ipam.pools.requested`.
pub const ANNOTATION_STICKY: &str = "ipam.podnet.io/sticky";

/// `cilium.io/v2` caps `cidrs` at this many items.
const V2_MAX_CIDRS: usize = 32;

/// A field of a pool (or of a selector) that Cilium would refuse: each variant
/// names the field by its path (`spec.ipv4.pool[0].reservedRanges[1].start`) and
/// carries the bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolFieldError {
    #[error("{field} is missing")]
    Missing { field: String },
    #[error("{field} must have at least 1 item")]
    NoCidrs { field: String },
    #[error("{field} has {count} items; {POD_IP_POOL_V2} allows at most {V2_MAX_CIDRS}")]
    TooManyCidrs { field: String, count: usize },
    #[error("{field}: {source}")]
    Cidr {
        field: String,
        #[source]
        source: PoolCidrError,
    },
    #[error("{field} {mask} is out of range (1..{bits})")]
    MaskOutOfRange { field: String, mask: i64, bits: u8 },
    #[error("{field} is a {POD_IP_POOL_V2} field; this object is {POD_IP_POOL_V2ALPHA1}")]
    V2Only { field: String },
    #[error("{field} {cidr} is not one of {cidrs_field}")]
    CidrNotListed {
        field: String,
        cidr: IpNet,
        cidrs_field: String,
    },
    #[error("{field} {ip} is not an {} address", .family.label())]
    RangeFamily {
        field: String,
        ip: IpAddr,
        family: Family,
    },
    #[error("{field} {ip} is outside pool CIDR {cidr}")]
    RangeOutside {
        field: String,
        ip: IpAddr,
        cidr: IpNet,
    },
    #[error("{field}: start {start} is after end {end}")]
    RangeReversed {
        field: String,
        start: IpAddr,
        end: IpAddr,
    },
    #[error("{field}: operator {operator} needs at least one value")]
    OperatorNeedsValues { field: String, operator: String },
    #[error("{field}: operator {operator} takes no values")]
    OperatorTakesNoValues { field: String, operator: String },
    #[error("{field}.operator {operator:?} is not one of In, NotIn, Exists, DoesNotExist")]
    UnknownOperator { field: String, operator: String },
}

/// One family of a pool: `spec.ipv4` / `spec.ipv6`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolFamilySpec {
    pub cidrs: Vec<IpNet>,
    /// Size of the per-node blocks carved from `cidrs`.
    pub mask_size: u8,
    /// v2 `pool[].reservedRanges`: inclusive ranges no new block may overlap.
    #[serde(default)]
    pub reserved_ranges: Vec<(IpAddr, IpAddr)>,
}

/// A pool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolDef {
    pub name: String,
    pub ipv4: Option<PoolFamilySpec>,
    pub ipv6: Option<PoolFamilySpec>,
    /// Hand out the first address of each block (ignored for /31, /32, /127, /128).
    pub allow_first_ip: bool,
    /// Hand out the last address of each block (ignored for /31, /32, /127, /128).
    pub allow_last_ip: bool,
    /// The `ipam.cilium.io/skip-masquerade: "true"` annotation.
    pub skip_masquerade: bool,
    /// The [`ANNOTATION_STICKY`]` = "true"` annotation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sticky: bool,
    pub pod_selector: Option<LabelSelector>,
    pub namespace_selector: Option<LabelSelector>,
}

impl PoolDef {
    /// The spec of one family, if the pool has it.
    pub fn family(&self, family: Family) -> Option<&PoolFamilySpec> {
        match family {
            Family::V4 => self.ipv4.as_ref(),
            Family::V6 => self.ipv6.as_ref(),
        }
    }
}

/// Cilium's rules for a `CiliumPodIPPool` (its CRD schema and what the operator
/// refuses): `apiVersion` v2alpha1 or v2, a name, a `spec`; per family at least
/// one CIDR of that family without host bits (v2: at most 32), a `maskSize` in
/// 1..=32 (1..=128), and v2's `pool[]` naming one of those CIDRs, with reserved
/// ranges of addresses inside it; selectors with valid operators. A pool with no
/// family is valid (it serves neither). The error names the pool and the field.
impl TryFrom<&CiliumPodIPPool> for PoolDef {
    type Error = InvalidObject;

    fn try_from(pool: &CiliumPodIPPool) -> Result<PoolDef, InvalidObject> {
        let invalid = |problem: String| InvalidObject {
            object: pool.metadata.describe(POD_IP_POOL_KIND),
            problem,
        };
        let v2 = match pool.api_version.as_str() {
            POD_IP_POOL_V2ALPHA1 => false,
            POD_IP_POOL_V2 => true,
            other => {
                return Err(invalid(format!(
                    "unsupported apiVersion {other:?} (expected {POD_IP_POOL_V2ALPHA1} or {POD_IP_POOL_V2})"
                )));
            }
        };
        if pool.metadata.name.is_empty() {
            return Err(invalid("metadata.name is missing".into()));
        }
        let Some(spec) = &pool.spec else {
            return Err(invalid("spec is missing".into()));
        };
        let family = |f: Family, s: &Option<PoolFamily>| {
            s.as_ref()
                .map(|s| family_spec(s, f, v2))
                .transpose()
                .map_err(|e| invalid(e.to_string()))
        };
        let selector = |key: &str, s: &Option<LabelSelector>| {
            if let Some(s) = s {
                check_selector(s, &format!("spec.{key}")).map_err(|e| invalid(e.to_string()))?;
            }
            Ok(s.clone())
        };
        Ok(PoolDef {
            name: pool.metadata.name.clone(),
            ipv4: family(Family::V4, &spec.ipv4)?,
            ipv6: family(Family::V6, &spec.ipv6)?,
            allow_first_ip: spec.allow_first_ip.unwrap_or(false),
            allow_last_ip: spec.allow_last_ip.unwrap_or(false),
            skip_masquerade: pool
                .metadata
                .annotations
                .get(ANNOTATION_SKIP_MASQUERADE)
                .map(String::as_str)
                == Some("true"),
            sticky: pool
                .metadata
                .annotations
                .get(ANNOTATION_STICKY)
                .map(String::as_str)
                == Some("true"),
            pod_selector: selector("podSelector", &spec.pod_selector)?,
            namespace_selector: selector("namespaceSelector", &spec.namespace_selector)?,
        })
    }
}

/// `spec.ipv4` / `spec.ipv6` of a pool.
fn family_spec(f: &PoolFamily, family: Family, v2: bool) -> Result<PoolFamilySpec, PoolFieldError> {
    let path = format!("spec.{}", family.as_str());
    let cidr_field = |field: String| move |source| PoolFieldError::Cidr { field, source };
    if f.cidrs.is_empty() {
        return Err(PoolFieldError::NoCidrs {
            field: format!("{path}.cidrs"),
        });
    }
    if v2 && f.cidrs.len() > V2_MAX_CIDRS {
        return Err(PoolFieldError::TooManyCidrs {
            field: format!("{path}.cidrs"),
            count: f.cidrs.len(),
        });
    }
    for (i, c) in f.cidrs.iter().enumerate() {
        check_pool_cidr(c, family).map_err(cidr_field(format!("{path}.cidrs[{i}]")))?;
    }
    let bits = family.bits();
    let field = format!("{path}.maskSize");
    let mask_size = match f.mask_size {
        None => return Err(PoolFieldError::Missing { field }),
        Some(mask) => u8::try_from(mask)
            .ok()
            .filter(|m| (1..=bits).contains(m))
            .ok_or(PoolFieldError::MaskOutOfRange { field, mask, bits })?,
    };
    let mut reserved_ranges = Vec::new();
    if let Some(entries) = &f.pool {
        if !v2 {
            return Err(PoolFieldError::V2Only {
                field: format!("{path}.pool"),
            });
        }
        for (i, e) in entries.iter().enumerate() {
            let field = format!("{path}.pool[{i}].cidr");
            let Some(cidr) = e.cidr else {
                return Err(PoolFieldError::Missing { field });
            };
            check_pool_cidr(&cidr, family).map_err(cidr_field(field.clone()))?;
            if !f.cidrs.contains(&cidr) {
                return Err(PoolFieldError::CidrNotListed {
                    field,
                    cidr,
                    cidrs_field: format!("{path}.cidrs"),
                });
            }
            for (j, r) in e.reserved_ranges.iter().enumerate() {
                let rp = format!("{path}.pool[{i}].reservedRanges[{j}]");
                reserved_ranges.push(reserved_range(&rp, r, family, cidr)?);
            }
        }
    }
    Ok(PoolFamilySpec {
        cidrs: f.cidrs.clone(),
        mask_size,
        reserved_ranges,
    })
}

/// One `reservedRanges` entry (`rp` is its path) of pool CIDR `cidr`: both ends
/// given, of `family`, inside `cidr`, and in order.
fn reserved_range(
    rp: &str,
    r: &ReservedRange,
    family: Family,
    cidr: IpNet,
) -> Result<(IpAddr, IpAddr), PoolFieldError> {
    let addr = |k: &str, ip: Option<IpAddr>| {
        let field = format!("{rp}.{k}");
        let Some(ip) = ip else {
            return Err(PoolFieldError::Missing { field });
        };
        if Family::of_addr(&ip) != family {
            return Err(PoolFieldError::RangeFamily { field, ip, family });
        }
        if !cidr.contains(&ip) {
            return Err(PoolFieldError::RangeOutside { field, ip, cidr });
        }
        Ok(ip)
    };
    let (start, end) = (addr("start", r.start)?, addr("end", r.end)?);
    if start > end {
        return Err(PoolFieldError::RangeReversed {
            field: rp.into(),
            start,
            end,
        });
    }
    Ok((start, end))
}

/// A label selector Kubernetes accepts: `In` / `NotIn` with values, `Exists` /
/// `DoesNotExist` without; any other operator is refused (Cilium could not use the
/// object). `path` names the selector in the error.
pub fn check_selector(sel: &LabelSelector, path: &str) -> Result<(), PoolFieldError> {
    for (
        i,
        LabelSelectorRequirement {
            operator, values, ..
        },
    ) in sel.match_expressions.iter().enumerate()
    {
        let field = format!("{path}.matchExpressions[{i}]");
        let operator = operator.clone();
        match operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(PoolFieldError::OperatorNeedsValues { field, operator });
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(PoolFieldError::OperatorTakesNoValues { field, operator });
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            _ => return Err(PoolFieldError::UnknownOperator { field, operator }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources::decode;

    fn pool(api_version: &str, spec: serde_json::Value) -> CiliumPodIPPool {
        decode(&json!({
            "apiVersion": api_version,
            "kind": "CiliumPodIPPool",
            "metadata": {"name": "mars", "annotations": {"ipam.cilium.io/skip-masquerade": "true"}},
            "spec": spec
        }))
        .unwrap()
    }

    fn err(api_version: &str, spec: serde_json::Value) -> String {
        PoolDef::try_from(&pool(api_version, spec))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn v2alpha1_and_v2_pools() {
        let spec = json!({
            "ipv4": {"cidrs": ["10.20.0.0/16"], "maskSize": 27},
            "ipv6": {"cidrs": ["fd00:20::/104"], "maskSize": 120},
            "allowLastIP": true,
            "namespaceSelector": {"matchLabels": {"tenant": "mars"}}
        });
        let def = PoolDef::try_from(&pool("cilium.io/v2alpha1", spec.clone())).unwrap();
        assert_eq!(def.name, "mars");
        assert!(def.skip_masquerade && def.allow_last_ip && !def.allow_first_ip);
        assert_eq!(def.ipv4.as_ref().unwrap().mask_size, 27);
        assert_eq!(
            def.ipv6.as_ref().unwrap().cidrs,
            vec!["fd00:20::/104".parse::<IpNet>().unwrap()]
        );
        assert_eq!(
            def.namespace_selector.as_ref().unwrap().match_labels["tenant"],
            "mars"
        );
        assert_eq!(PoolDef::try_from(&pool("cilium.io/v2", spec)).unwrap(), def);

        let v2 = PoolDef::try_from(&pool(
            "cilium.io/v2",
            json!({"ipv4": {"cidrs": ["10.20.0.0/16"], "maskSize": 24, "pool": [
                {"cidr": "10.20.0.0/16", "reservedRanges": [{"start": "10.20.0.0", "end": "10.20.3.255"}]}
            ]}}),
        ))
        .unwrap();
        assert_eq!(
            v2.ipv4.unwrap().reserved_ranges,
            vec![("10.20.0.0".parse().unwrap(), "10.20.3.255".parse().unwrap())]
        );
    }

    #[test]
    fn each_error_names_the_pool_and_the_field() {
        let v1 = "cilium.io/v2alpha1";
        let v2 = "cilium.io/v2";
        let cases = [
            (
                v1,
                json!({"ipv4": {"cidrs": ["10.0.0.0/8", "10.1.2.3/16"], "maskSize": 24}}),
                "spec.ipv4.cidrs[1]: 10.1.2.3/16 has host bits set; did you mean 10.1.0.0/16?",
            ),
            (
                v1,
                json!({"ipv6": {"cidrs": ["10.0.0.0/8"], "maskSize": 120}}),
                "spec.ipv6.cidrs[0]: 10.0.0.0/8 is not an IPv6 CIDR",
            ),
            (
                v1,
                json!({"ipv4": {"cidrs": [], "maskSize": 24}}),
                "spec.ipv4.cidrs must have at least 1 item",
            ),
            (
                v1,
                json!({"ipv4": {"cidrs": ["10.0.0.0/8"]}}),
                "spec.ipv4.maskSize is missing",
            ),
            (
                v1,
                json!({"ipv4": {"cidrs": ["10.0.0.0/8"], "maskSize": 300}}),
                "spec.ipv4.maskSize 300 is out of range (1..32)",
            ),
            (
                v1,
                json!({"ipv6": {"cidrs": ["fd00::/104"], "maskSize": -1}}),
                "spec.ipv6.maskSize -1 is out of range (1..128)",
            ),
            (
                v1,
                json!({"ipv4": {"cidrs": ["10.0.0.0/8"], "maskSize": 24, "pool": []}}),
                "spec.ipv4.pool is a cilium.io/v2 field; this object is cilium.io/v2alpha1",
            ),
            (
                v2,
                json!({"ipv4": {"cidrs": ["10.0.0.0/8"], "maskSize": 24, "pool": [{}]}}),
                "spec.ipv4.pool[0].cidr is missing",
            ),
            (
                v2,
                json!({"ipv4": {"cidrs": ["10.0.0.0/8"], "maskSize": 24, "pool": [{"cidr": "10.1.0.0/16"}]}}),
                "spec.ipv4.pool[0].cidr 10.1.0.0/16 is not one of spec.ipv4.cidrs",
            ),
            (
                v2,
                json!({"ipv4": {"cidrs": ["10.0.0.0/8"], "maskSize": 24, "pool": [
                {"cidr": "10.0.0.0/8", "reservedRanges": [{"start": "10.0.0.1"}]}]}}),
                "spec.ipv4.pool[0].reservedRanges[0].end is missing",
            ),
            (
                v2,
                json!({"ipv4": {"cidrs": ["10.0.0.0/8"], "maskSize": 24, "pool": [
                {"cidr": "10.0.0.0/8", "reservedRanges": [{"start": "fd00::1", "end": "10.0.0.1"}]}]}}),
                "spec.ipv4.pool[0].reservedRanges[0].start fd00::1 is not an IPv4 address",
            ),
            (
                v2,
                json!({"ipv4": {"cidrs": ["10.0.0.0/8"], "maskSize": 24, "pool": [
                {"cidr": "10.0.0.0/8", "reservedRanges": [{"start": "11.0.0.1", "end": "11.0.0.2"}]}]}}),
                "spec.ipv4.pool[0].reservedRanges[0].start 11.0.0.1 is outside pool CIDR 10.0.0.0/8",
            ),
            (
                v2,
                json!({"ipv4": {"cidrs": ["10.0.0.0/8"], "maskSize": 24, "pool": [
                {"cidr": "10.0.0.0/8", "reservedRanges": [{"start": "10.0.0.9", "end": "10.0.0.1"}]}]}}),
                "spec.ipv4.pool[0].reservedRanges[0]: start 10.0.0.9 is after end 10.0.0.1",
            ),
            (
                v1,
                json!({"podSelector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}}),
                "spec.podSelector.matchExpressions[0].operator \"Gt\" is not one of In, NotIn, Exists, DoesNotExist",
            ),
            (
                v1,
                json!({"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}),
                "spec.podSelector.matchExpressions[0]: operator In needs at least one value",
            ),
            (
                v1,
                json!({"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}}),
                "spec.namespaceSelector.matchExpressions[0]: operator Exists takes no values",
            ),
        ];
        for (version, spec, problem) in cases {
            assert_eq!(
                err(version, spec),
                format!("CiliumPodIPPool \"mars\": {problem}")
            );
        }
        let many: Vec<String> = (0..33).map(|i| format!("10.{i}.0.0/16")).collect();
        assert_eq!(
            err(v2, json!({"ipv4": {"cidrs": many, "maskSize": 24}})),
            "CiliumPodIPPool \"mars\": spec.ipv4.cidrs has 33 items; cilium.io/v2 allows at most 32"
        );
    }

    #[test]
    fn object_errors() {
        let mut p = pool("cilium.io/v2alpha1", json!({}));
        p.spec = None;
        assert_eq!(
            PoolDef::try_from(&p).unwrap_err().to_string(),
            "CiliumPodIPPool \"mars\": spec is missing"
        );
        p.metadata.name.clear();
        assert_eq!(
            PoolDef::try_from(&p).unwrap_err().to_string(),
            "CiliumPodIPPool (unnamed): metadata.name is missing"
        );
        p.api_version = "cilium.io/v1".into();
        assert_eq!(
            PoolDef::try_from(&p).unwrap_err().problem,
            "unsupported apiVersion \"cilium.io/v1\" (expected cilium.io/v2alpha1 or cilium.io/v2)"
        );
    }
}
