//! A pod that asks for its own addresses: the Pod annotation
//! `ipam.podnet.io/ip-addresses` (Cilium has no such annotation,
//! cilium/cilium#17026; Calico's is `cni.projectcalico.org/ipAddrs`). Pure rules
//! for reading it; whether the node can give the addresses is the daemon's.
//!
//! The value is at most one address per family, either comma-separated
//! (`10.0.1.5`, `10.0.1.5,fd00::5`, spaces around an entry allowed) or a JSON
//! list of strings as Calico writes it (`["10.0.1.5","fd00::5"]`). Each entry is
//! a plain unicast address: no prefix length, no zone, not unspecified,
//! loopback, multicast or the IPv4 broadcast address. A family the value does
//! not name gets the next free address as usual; an empty value is an error (a
//! half-written annotation should not silently mean "any address").

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::Family;

/// The Pod annotation naming the addresses a pod asks for.
pub const ANNOTATION_IP_ADDRESSES: &str = "ipam.podnet.io/ip-addresses";

/// What the annotation asks for: at most one address of each family.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestedAddresses {
    v4: Option<IpAddr>,
    v6: Option<IpAddr>,
}

/// Why the annotation cannot be read; every text names the annotation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressAnnotationError {
    #[error(
        "annotation {ANNOTATION_IP_ADDRESSES} is empty: give one address per family, e.g. \"10.0.1.5\" or \"10.0.1.5,fd00::5\""
    )]
    Empty,
    #[error(
        "annotation {ANNOTATION_IP_ADDRESSES} has an empty entry in {value:?}: separate the addresses with one comma"
    )]
    EmptyEntry { value: String },
    #[error(
        "annotation {ANNOTATION_IP_ADDRESSES} is not a JSON list of address strings ({problem}): write \"10.0.1.5,fd00::5\" or [\"10.0.1.5\",\"fd00::5\"]"
    )]
    Json { problem: String },
    #[error(
        "annotation {ANNOTATION_IP_ADDRESSES}: {entry:?} has a prefix length; give the address alone (\"{}\")",
        entry.split('/').next().unwrap_or_default()
    )]
    PrefixLength { entry: String },
    #[error("annotation {ANNOTATION_IP_ADDRESSES}: {entry:?} is not an IP address")]
    NotAnAddress { entry: String },
    #[error(
        "annotation {ANNOTATION_IP_ADDRESSES}: {ip} is not a unicast address a pod can hold (unspecified, loopback, multicast or broadcast)"
    )]
    NotUnicast { ip: IpAddr },
    #[error(
        "annotation {ANNOTATION_IP_ADDRESSES} names two {} addresses ({first} and {second}): a pod gets one address per family",
        family.label()
    )]
    TwoOfOneFamily {
        family: Family,
        first: IpAddr,
        second: IpAddr,
    },
    #[error(
        "annotation {ANNOTATION_IP_ADDRESSES} asks for the {} address {ip}, but {} is not enabled on this node",
        family.label(),
        family.label()
    )]
    FamilyNotEnabled { family: Family, ip: IpAddr },
}

impl RequestedAddresses {
    /// Reads the annotation's value.
    pub fn parse(value: &str) -> Result<RequestedAddresses, AddressAnnotationError> {
        let value = value.trim();
        if value.is_empty() {
            return Err(AddressAnnotationError::Empty);
        }
        let entries = if value.starts_with('[') {
            json_entries(value)?
        } else {
            comma_entries(value)?
        };
        let mut out = RequestedAddresses::default();
        for entry in entries {
            let ip = parse_entry(&entry)?;
            let family = Family::of_addr(&ip);
            let slot = match family {
                Family::V4 => &mut out.v4,
                Family::V6 => &mut out.v6,
            };
            if let Some(first) = *slot {
                return Err(AddressAnnotationError::TwoOfOneFamily {
                    family,
                    first,
                    second: ip,
                });
            }
            *slot = Some(ip);
        }
        if out.v4.is_none() && out.v6.is_none() {
            return Err(AddressAnnotationError::Empty);
        }
        Ok(out)
    }

    /// The annotation among a pod's annotations: None when the pod has none.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
    ) -> Result<Option<RequestedAddresses>, AddressAnnotationError> {
        annotations
            .get(ANNOTATION_IP_ADDRESSES)
            .map(|v| RequestedAddresses::parse(v))
            .transpose()
    }

    /// Refuses an address of a family the node does not hand out.
    pub fn check_families(&self, enabled: &[Family]) -> Result<(), AddressAnnotationError> {
        for (family, ip) in [(Family::V4, self.v4), (Family::V6, self.v6)] {
            if let Some(ip) = ip
                && !enabled.contains(&family)
            {
                return Err(AddressAnnotationError::FamilyNotEnabled { family, ip });
            }
        }
        Ok(())
    }

    /// The address asked for in `family`, if any.
    pub fn of(&self, family: Family) -> Option<IpAddr> {
        match family {
            Family::V4 => self.v4,
            Family::V6 => self.v6,
        }
    }
}

fn comma_entries(value: &str) -> Result<Vec<String>, AddressAnnotationError> {
    value
        .split(',')
        .map(|e| {
            let e = e.trim();
            if e.is_empty() {
                Err(AddressAnnotationError::EmptyEntry {
                    value: value.to_string(),
                })
            } else {
                Ok(e.to_string())
            }
        })
        .collect()
}

fn json_entries(value: &str) -> Result<Vec<String>, AddressAnnotationError> {
    serde_json::from_str::<Vec<String>>(value).map_err(|e| AddressAnnotationError::Json {
        problem: e.to_string(),
    })
}

fn parse_entry(entry: &str) -> Result<IpAddr, AddressAnnotationError> {
    let entry = entry.trim();
    if entry.is_empty() {
        return Err(AddressAnnotationError::Empty);
    }
    if entry.contains('/') {
        return Err(AddressAnnotationError::PrefixLength {
            entry: entry.to_string(),
        });
    }
    let ip: IpAddr = entry
        .parse()
        .map_err(|_| AddressAnnotationError::NotAnAddress {
            entry: entry.to_string(),
        })?;
    let broadcast = matches!(ip, IpAddr::V4(a) if a.is_broadcast());
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || broadcast {
        return Err(AddressAnnotationError::NotUnicast { ip });
    }
    Ok(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(value: &str) -> (Option<String>, Option<String>) {
        let r = RequestedAddresses::parse(value).unwrap_or_else(|e| panic!("{value:?}: {e}"));
        let s = |ip: Option<IpAddr>| ip.map(|ip| ip.to_string());
        (s(r.of(Family::V4)), s(r.of(Family::V6)))
    }

    fn err(value: &str) -> AddressAnnotationError {
        match RequestedAddresses::parse(value) {
            Ok(r) => panic!("{value:?} was accepted as {r:?}"),
            Err(e) => {
                assert!(
                    e.to_string().contains(ANNOTATION_IP_ADDRESSES),
                    "the error names the annotation: {e}"
                );
                e
            }
        }
    }

    #[test]
    fn one_address_of_either_family_or_one_of_each_in_either_order() {
        let v4 = Some("10.0.1.5".to_string());
        let v6 = Some("fd00::5".to_string());
        assert_eq!(ok("10.0.1.5"), (v4.clone(), None));
        assert_eq!(ok("fd00::5"), (None, v6.clone()));
        assert_eq!(ok("10.0.1.5,fd00::5"), (v4.clone(), v6.clone()));
        assert_eq!(ok("fd00::5,10.0.1.5"), (v4.clone(), v6.clone()));
        assert_eq!(ok(" 10.0.1.5 , fd00::5 "), (v4.clone(), v6.clone()));
    }

    #[test]
    fn a_json_list_as_calico_writes_it_is_read_too() {
        let both = (Some("10.0.1.5".to_string()), Some("fd00::5".to_string()));
        assert_eq!(ok(r#"["10.0.1.5","fd00::5"]"#), both);
        assert_eq!(ok(r#"[ "fd00::5" ]"#), (None, Some("fd00::5".into())));
    }

    #[test]
    fn an_empty_value_or_list_is_refused() {
        for v in ["", "   ", "[]"] {
            assert_eq!(err(v), AddressAnnotationError::Empty, "{v:?}");
        }
    }

    #[test]
    fn an_empty_entry_is_refused() {
        for v in ["10.0.1.5,", ",10.0.1.5", "10.0.1.5,,fd00::5", ","] {
            assert!(
                matches!(err(v), AddressAnnotationError::EmptyEntry { .. }),
                "{v:?}"
            );
        }
        assert_eq!(err(r#"[""]"#), AddressAnnotationError::Empty);
    }

    #[test]
    fn malformed_json_is_refused_with_the_parser_s_words() {
        for v in [
            r#"["10.0.1.5""#,
            "[10.0.1.5]",
            r#"[1]"#,
            r#"[["10.0.1.5"]]"#,
            r#"["10.0.1.5"] x"#,
        ] {
            assert!(
                matches!(err(v), AddressAnnotationError::Json { .. }),
                "{v:?}"
            );
        }
    }

    #[test]
    fn what_is_not_an_address_is_refused_and_named() {
        for v in [
            "10.0.1",
            "10.0.1.256",
            "web-0",
            "10.0.1.5;fd00::5",
            "10.0.1.5 fd00::5",
            "fe80::1%eth0",
            "0x0a000105",
            r#"{"ipv4":"10.0.1.5"}"#,
            r#"["10.0.1.5","nope"]"#,
        ] {
            assert!(
                matches!(err(v), AddressAnnotationError::NotAnAddress { .. }),
                "{v:?}: {:?}",
                RequestedAddresses::parse(v)
            );
        }
        assert!(err("10.0.1.5, web-0").to_string().contains("\"web-0\""));
    }

    #[test]
    fn a_prefix_length_is_refused_with_the_address_to_write_instead() {
        let e = err("10.0.1.5/32");
        assert!(matches!(e, AddressAnnotationError::PrefixLength { .. }));
        assert!(e.to_string().contains("(\"10.0.1.5\")"), "{e}");
        assert!(matches!(
            err("10.0.1.5,fd00::5/128"),
            AddressAnnotationError::PrefixLength { .. }
        ));
    }

    #[test]
    fn addresses_no_pod_can_hold_are_refused() {
        for v in [
            "0.0.0.0",
            "::",
            "127.0.0.1",
            "::1",
            "224.0.0.1",
            "ff02::1",
            "255.255.255.255",
        ] {
            assert!(
                matches!(err(v), AddressAnnotationError::NotUnicast { .. }),
                "{v:?}"
            );
        }
    }

    #[test]
    fn two_addresses_of_one_family_are_refused_naming_both() {
        for (v, family) in [
            ("10.0.1.5,10.0.1.6", Family::V4),
            ("fd00::5,fd00::6", Family::V6),
            ("10.0.1.5,fd00::5,10.0.1.6", Family::V4),
            ("10.0.1.5,10.0.1.5", Family::V4),
            (r#"["fd00::5","10.0.1.5","fd00::6"]"#, Family::V6),
        ] {
            match err(v) {
                AddressAnnotationError::TwoOfOneFamily {
                    family: f,
                    first,
                    second,
                } => {
                    assert_eq!(f, family, "{v:?}");
                    assert!(v.contains(&first.to_string()) && v.contains(&second.to_string()));
                }
                other => panic!("{v:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn an_address_of_a_family_the_node_does_not_hand_out_is_refused() {
        let both = RequestedAddresses::parse("10.0.1.5,fd00::5").unwrap();
        assert!(both.check_families(&[Family::V6, Family::V4]).is_ok());
        assert_eq!(
            both.check_families(&[Family::V4]),
            Err(AddressAnnotationError::FamilyNotEnabled {
                family: Family::V6,
                ip: "fd00::5".parse().unwrap()
            })
        );
        let e = both.check_families(&[Family::V6]).unwrap_err();
        assert!(e.to_string().contains("IPv4 is not enabled"), "{e}");
        let v4 = RequestedAddresses::parse("10.0.1.5").unwrap();
        assert!(v4.check_families(&[Family::V4]).is_ok());
    }

    #[test]
    fn a_pod_without_the_annotation_asks_for_nothing() {
        let mut annotations = BTreeMap::new();
        annotations.insert("ipam.cilium.io/ip-pool".to_string(), "mars".to_string());
        assert_eq!(RequestedAddresses::from_annotations(&annotations), Ok(None));
        annotations.insert(ANNOTATION_IP_ADDRESSES.to_string(), "10.0.1.5".to_string());
        let r = RequestedAddresses::from_annotations(&annotations)
            .unwrap()
            .unwrap();
        assert_eq!(r.of(Family::V4), Some("10.0.1.5".parse().unwrap()));
        annotations.insert(ANNOTATION_IP_ADDRESSES.to_string(), "x".to_string());
        assert!(RequestedAddresses::from_annotations(&annotations).is_err());
    }
}
