//! The ADD result (also `prevResult`): interfaces, IPs, routes and DNS, with
//! lenient parsing and rendering for each supported spec version.

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use std::net::IpAddr;

use super::version::version_at_least;

/// A CNI result, the 1.1.0 shape (a superset of 1.0.0 and 0.4.0).
///
/// Parsing is lenient: every list may be absent or `null`, unknown keys (e.g.
/// 0.4.0's `ips[].version`) are ignored. Addresses and route destinations must
/// carry a prefix length, as Go's `net.ParseCIDR` requires.
///
/// `Serialize` gives the full 1.1.0 form without `cniVersion` rewriting; use
/// [`CniResult::to_json`] to print a result for a given version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniResult {
    /// The spec version of the result (empty when the input had none).
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    /// All interfaces created, host-side ones included.
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub interfaces: Vec<Interface>,
    /// Assigned addresses.
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ips: Vec<IpConfig>,
    /// Routes installed in the container.
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub routes: Vec<Route>,
    /// DNS settings; omitted when absent or empty.
    #[serde(default, skip_serializing_if = "dns_is_empty")]
    pub dns: Option<Dns>,
}

/// An interface in a result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// Hardware address, `aa:bb:cc:dd:ee:ff`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// MTU (1.1.0+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// The netns path (`CNI_NETNS`) for container-side interfaces; absent for host ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// Socket path for vhost-user-like interfaces (1.1.0+).
    #[serde(
        rename = "socketPath",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub socket_path: Option<String>,
    /// PCI ID of a device interface (1.1.0+).
    #[serde(rename = "pciID", default, skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
}

/// An address in a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// The address with its prefix length; host bits are kept (`10.1.0.5/24`).
    pub address: IpNet,
    /// Default gateway for this subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces` (point it at the sandbox interface); IPAM
    /// plugins omit it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

/// A route in a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Destination, with prefix length.
    pub dst: IpNet,
    /// Next hop; absent means the interface's default gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// Route MTU (1.1.0+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Advertised MSS (1.1.0+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    /// Route priority / metric (1.1.0+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Routing table (1.1.0+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// Scope: 0 global, 253 link, 254 host (1.1.0+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u32>,
}

/// DNS settings in a result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// Name server addresses, in priority order.
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub nameservers: Vec<String>,
    /// Local domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search domains.
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub options: Vec<String>,
}

impl Dns {
    /// True when no field is set (such a `dns` is not printed).
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.as_deref().is_none_or(str::is_empty)
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

fn dns_is_empty(dns: &Option<Dns>) -> bool {
    dns.as_ref().is_none_or(Dns::is_empty)
}

fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// Interface keys that exist only from spec 1.1.0 on.
const INTERFACE_KEYS_1_1: &[&str] = &["mtu", "socketPath", "pciID"];
/// Route keys that exist only from spec 1.1.0 on.
const ROUTE_KEYS_1_1: &[&str] = &["mtu", "advmss", "priority", "table", "scope"];

impl CniResult {
    /// Parses a result leniently (see the type docs). `cniVersion` may be
    /// absent (left empty).
    ///
    /// Only JSON objects are accepted for the result and its entries (serde
    /// would otherwise also accept the array form of a struct).
    pub fn from_value(value: Value) -> Result<CniResult, serde_json::Error> {
        use serde::de::Error;
        let Some(obj) = value.as_object() else {
            return Err(serde_json::Error::custom("a result must be a JSON object"));
        };
        for key in ["interfaces", "ips", "routes"] {
            if let Some(Value::Array(items)) = obj.get(key)
                && items.iter().any(|i| !i.is_object())
            {
                return Err(serde_json::Error::custom(format!(
                    "every entry of {key} must be a JSON object"
                )));
            }
        }
        if obj
            .get("dns")
            .is_some_and(|d| !d.is_object() && !d.is_null())
        {
            return Err(serde_json::Error::custom("dns must be a JSON object"));
        }
        serde_json::from_value(value)
    }

    /// Renders the result for spec version `cni_version`, which becomes its
    /// `cniVersion`:
    /// - 1.1.0 (and anything newer or unparseable): every field.
    /// - below 1.1.0 (1.0.0): drops route `mtu`/`advmss`/`priority`/`table`/`scope`
    ///   and interface `mtu`/`socketPath`/`pciID`.
    /// - below 1.0.0 (0.4.0): additionally adds `"version":"4"|"6"` to each ip.
    ///
    /// Empty lists and an empty `dns` are omitted.
    pub fn to_json(&self, cni_version: &str) -> Value {
        let mut value =
            serde_json::to_value(self).unwrap_or_else(|_| Value::Object(Default::default()));
        let Some(obj) = value.as_object_mut() else {
            return value;
        };
        obj.insert("cniVersion".into(), Value::String(cni_version.to_string()));
        let parsed = version_at_least(cni_version, "0.0.0");
        if parsed && !version_at_least(cni_version, "1.1.0") {
            strip_keys(obj.get_mut("interfaces"), INTERFACE_KEYS_1_1);
            strip_keys(obj.get_mut("routes"), ROUTE_KEYS_1_1);
        }
        if parsed
            && !version_at_least(cni_version, "1.0.0")
            && let Some(Value::Array(ips)) = obj.get_mut("ips")
        {
            for (ip, cfg) in ips.iter_mut().zip(&self.ips) {
                if let Some(ip) = ip.as_object_mut() {
                    let family = if cfg.address.addr().is_ipv4() {
                        "4"
                    } else {
                        "6"
                    };
                    ip.insert("version".into(), Value::String(family.into()));
                }
            }
        }
        value
    }
}

fn strip_keys(list: Option<&mut Value>, keys: &[&str]) {
    if let Some(Value::Array(items)) = list {
        for item in items.iter_mut().filter_map(Value::as_object_mut) {
            for key in keys {
                item.remove(*key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The spec's example result (§1.5 of the reference), 1.1.0.
    fn spec_example() -> Value {
        json!({
            "cniVersion": "1.1.0",
            "interfaces": [
                {"name": "lxc1a2b", "mac": "aa:aa:aa:aa:aa:aa", "mtu": 1500},
                {"name": "eth0", "mac": "bb:bb:bb:bb:bb:bb", "mtu": 1500,
                 "sandbox": "/run/netns/x", "socketPath": "/opt/sock", "pciID": "0000:00:1f.6"}
            ],
            "ips": [{"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 1}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1",
                        "mtu": 1400, "advmss": 1360, "priority": 100, "table": 254, "scope": 0}],
            "dns": {"nameservers": ["10.96.0.10"], "domain": "cluster.local",
                    "search": ["svc.cluster.local"], "options": ["ndots:5"]}
        })
    }

    fn dual_stack() -> CniResult {
        CniResult {
            cni_version: "1.1.0".into(),
            interfaces: vec![
                Interface {
                    name: "lxc0".into(),
                    mac: Some("aa:aa:aa:aa:aa:aa".into()),
                    mtu: Some(1500),
                    ..Interface::default()
                },
                Interface {
                    name: "eth0".into(),
                    mac: Some("bb:bb:bb:bb:bb:bb".into()),
                    mtu: Some(1500),
                    sandbox: Some("/run/netns/x".into()),
                    socket_path: None,
                    pci_id: Some("0000:01:00.0".into()),
                },
            ],
            ips: vec![
                IpConfig {
                    address: "10.0.0.7/24".parse().unwrap(),
                    gateway: Some("10.0.0.1".parse().unwrap()),
                    interface: Some(1),
                },
                IpConfig {
                    address: "fd00::7/64".parse().unwrap(),
                    gateway: None,
                    interface: Some(1),
                },
            ],
            routes: vec![
                Route {
                    dst: "0.0.0.0/0".parse().unwrap(),
                    gw: Some("10.0.0.1".parse().unwrap()),
                    mtu: Some(1450),
                    advmss: None,
                    priority: Some(10),
                    table: None,
                    scope: Some(0),
                },
                Route {
                    dst: "::/0".parse().unwrap(),
                    gw: None,
                    mtu: None,
                    advmss: None,
                    priority: None,
                    table: None,
                    scope: None,
                },
            ],
            dns: Some(Dns::default()),
        }
    }

    #[test]
    fn spec_example_round_trips() {
        let r: CniResult = serde_json::from_value(spec_example()).unwrap();
        assert_eq!(r.ips[0].address.to_string(), "10.1.0.5/24");
        assert_eq!(r.ips[0].interface, Some(1));
        assert_eq!(r.interfaces[1].pci_id.as_deref(), Some("0000:00:1f.6"));
        assert_eq!(r.routes[0].scope, Some(0));
        assert_eq!(r.to_json("1.1.0"), spec_example());
        assert_eq!(serde_json::to_value(&r).unwrap(), spec_example());
    }

    #[test]
    fn golden_1_1_0() {
        assert_eq!(
            dual_stack().to_json("1.1.0"),
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [
                    {"name": "lxc0", "mac": "aa:aa:aa:aa:aa:aa", "mtu": 1500},
                    {"name": "eth0", "mac": "bb:bb:bb:bb:bb:bb", "mtu": 1500,
                     "sandbox": "/run/netns/x", "pciID": "0000:01:00.0"}
                ],
                "ips": [
                    {"address": "10.0.0.7/24", "gateway": "10.0.0.1", "interface": 1},
                    {"address": "fd00::7/64", "interface": 1}
                ],
                "routes": [
                    {"dst": "0.0.0.0/0", "gw": "10.0.0.1", "mtu": 1450, "priority": 10, "scope": 0},
                    {"dst": "::/0"}
                ]
            })
        );
    }

    #[test]
    fn golden_1_0_0() {
        assert_eq!(
            dual_stack().to_json("1.0.0"),
            json!({
                "cniVersion": "1.0.0",
                "interfaces": [
                    {"name": "lxc0", "mac": "aa:aa:aa:aa:aa:aa"},
                    {"name": "eth0", "mac": "bb:bb:bb:bb:bb:bb", "sandbox": "/run/netns/x"}
                ],
                "ips": [
                    {"address": "10.0.0.7/24", "gateway": "10.0.0.1", "interface": 1},
                    {"address": "fd00::7/64", "interface": 1}
                ],
                "routes": [
                    {"dst": "0.0.0.0/0", "gw": "10.0.0.1"},
                    {"dst": "::/0"}
                ]
            })
        );
    }

    #[test]
    fn golden_0_4_0() {
        assert_eq!(
            dual_stack().to_json("0.4.0"),
            json!({
                "cniVersion": "0.4.0",
                "interfaces": [
                    {"name": "lxc0", "mac": "aa:aa:aa:aa:aa:aa"},
                    {"name": "eth0", "mac": "bb:bb:bb:bb:bb:bb", "sandbox": "/run/netns/x"}
                ],
                "ips": [
                    {"version": "4", "address": "10.0.0.7/24", "gateway": "10.0.0.1", "interface": 1},
                    {"version": "6", "address": "fd00::7/64", "interface": 1}
                ],
                "routes": [
                    {"dst": "0.0.0.0/0", "gw": "10.0.0.1"},
                    {"dst": "::/0"}
                ]
            })
        );
    }

    #[test]
    fn rendered_0_4_0_parses_back() {
        let back: CniResult = serde_json::from_value(dual_stack().to_json("0.4.0")).unwrap();
        assert_eq!(back.ips, dual_stack().ips);
        assert_eq!(back.cni_version, "0.4.0");
    }

    #[test]
    fn empty_result_renders_minimal() {
        let r = CniResult::default();
        assert_eq!(r.to_json("1.1.0"), json!({"cniVersion": "1.1.0"}));
        assert_eq!(r.to_json("0.4.0"), json!({"cniVersion": "0.4.0"}));
    }

    #[test]
    fn dns_omitted_only_when_empty() {
        let mut r = CniResult {
            dns: Some(Dns {
                domain: Some(String::new()),
                ..Dns::default()
            }),
            ..CniResult::default()
        };
        assert_eq!(r.to_json("1.0.0"), json!({"cniVersion": "1.0.0"}));
        r.dns = Some(Dns {
            nameservers: vec!["10.96.0.10".into()],
            ..Dns::default()
        });
        assert_eq!(
            r.to_json("1.0.0"),
            json!({"cniVersion": "1.0.0", "dns": {"nameservers": ["10.96.0.10"]}})
        );
    }

    #[test]
    fn lenient_parse() {
        let r = CniResult::from_value(json!({})).unwrap();
        assert_eq!(r, CniResult::default());
        let r = CniResult::from_value(json!({
            "cniVersion": "0.4.0",
            "interfaces": null, "ips": null, "routes": null, "dns": null,
            "extra": {"anything": 1}
        }))
        .unwrap();
        assert_eq!(r.cni_version, "0.4.0");
        assert!(r.interfaces.is_empty() && r.ips.is_empty() && r.routes.is_empty());
        assert_eq!(r.dns, None);
        let r = CniResult::from_value(json!({"dns": {"nameservers": null}})).unwrap();
        assert!(r.dns.unwrap().is_empty());
    }

    #[test]
    fn address_keeps_host_bits() {
        let r = CniResult::from_value(json!({"ips": [{"address": "10.1.2.3/16"}],
                                            "routes": [{"dst": "10.9.9.9/8"}]}))
        .unwrap();
        assert_eq!(r.ips[0].address.addr().to_string(), "10.1.2.3");
        assert_eq!(r.ips[0].address.prefix_len(), 16);
        assert_eq!(r.to_json("1.1.0")["ips"][0]["address"], "10.1.2.3/16");
        assert_eq!(r.to_json("1.1.0")["routes"][0]["dst"], "10.9.9.9/8");
    }

    #[test]
    fn strict_fields_rejected() {
        for bad in [
            json!({"ips": [{"address": "10.1.2.3"}]}),
            json!({"ips": [{"address": "10.1.2.3/33"}]}),
            json!({"ips": [{"address": "10.1.2.3/24", "gateway": "nope"}]}),
            json!({"ips": [{"address": "10.1.2.3/24", "interface": -1}]}),
            json!({"ips": [{"address": "10.1.2.3/24", "interface": "0"}]}),
            json!({"ips": [{}]}),
            json!({"routes": [{"dst": "0.0.0.0"}]}),
            json!({"routes": [{"dst": "0.0.0.0/0", "gw": "x"}]}),
            json!({"routes": [{"dst": "0.0.0.0/0", "mtu": 1.5}]}),
            json!({"interfaces": [{"mac": "aa"}]}),
            json!({"interfaces": {}}),
            json!({"interfaces": [["eth0"]]}),
            json!({"ips": [["10.0.0.1/24"]]}),
            json!({"routes": [null]}),
            json!({"dns": []}),
            json!({"dns": "x"}),
            json!({"cniVersion": 1}),
            json!([]),
        ] {
            assert!(CniResult::from_value(bad.clone()).is_err(), "{bad}");
        }
    }
}
