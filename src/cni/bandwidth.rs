//! `runtimeConfig.bandwidth`, the CNI `bandwidth` capability: what a runtime
//! passes for a Pod's `kubernetes.io/ingress-bandwidth` and
//! `kubernetes.io/egress-bandwidth` annotations (`ingressRate`/`egressRate` in
//! bits/s, `ingressBurst`/`egressBurst` in bits; the annotations have no
//! burst, and containerd sends `u32::MAX` bits with every rate, CRI-O
//! `u32::MAX × 8 − 1`: either means none was asked, and the bucket is podnet's
//! default). Parsed and checked here, pure: a bad value is code 7 naming the
//! field and the value.

use serde_json::Value;

use super::error::CniError;

/// The slowest rate accepted: 1 kbit/s (kubelet's lower bound for the annotations).
pub const MIN_RATE_BITS: u64 = 1_000;
/// The fastest rate accepted: 1 Pbit/s (kubelet's upper bound for the annotations).
pub const MAX_RATE_BITS: u64 = 1_000_000_000_000_000;
/// The largest bucket: `u32::MAX` bytes (the kernel's TBF bucket is a `u32`).
pub const MAX_BURST_BITS: u64 = u32::MAX as u64 * 8;
/// The bursts containerd (`u32::MAX` bits) and CRI-O (`u32::MAX × 8 − 1`) send
/// with every rate, the annotations having none: taken as "no burst asked".
/// Honoured, they would be buckets of 512 MiB and 4 GiB: a pod limited to
/// 10 Mbit/s would send that at full speed after each idle spell.
pub const RUNTIME_UNSET_BURSTS_BITS: [u64; 2] = [u32::MAX as u64, u32::MAX as u64 * 8 - 1];
/// The default bucket's time at the rate (the queue's, as the reference plugin's).
const DEFAULT_BUCKET_MILLIS: u64 = 25;
/// The default bucket's floor: 128 KiB holds one packet of any MTU.
const DEFAULT_BUCKET_MIN_BYTES: u32 = 128 * 1024;
/// Where the request's fields live, for error messages.
const FIELD: &str = "runtimeConfig.bandwidth";

/// One direction's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub rate_bits: u64,
    pub burst_bits: u64,
}

/// The pod's limits: traffic to the pod (`ingress`) and from it (`egress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BandwidthLimits {
    pub ingress: Option<Shape>,
    pub egress: Option<Shape>,
}

impl Shape {
    /// The rate in bytes/s (at least 125: the rate is at least 1 kbit/s).
    pub fn rate_bytes(&self) -> u64 {
        self.rate_bits / 8
    }

    /// The bucket in bytes: the asked burst (it fits: at most
    /// [`MAX_BURST_BITS`]), or, for a runtime's [`RUNTIME_UNSET_BURSTS_BITS`],
    /// 25 ms at the rate and at least 128 KiB.
    pub fn burst_bytes(&self) -> u32 {
        if RUNTIME_UNSET_BURSTS_BITS.contains(&self.burst_bits) {
            let at_rate = self.rate_bytes().saturating_mul(DEFAULT_BUCKET_MILLIS) / 1000;
            return u32::try_from(at_rate)
                .unwrap_or(u32::MAX)
                .max(DEFAULT_BUCKET_MIN_BYTES);
        }
        u32::try_from(self.burst_bits / 8).unwrap_or(u32::MAX)
    }
}

impl BandwidthLimits {
    /// Each bucket must hold one packet of `packet_bytes` (the link's MTU and
    /// its Ethernet header), or the TBF would never send one: code 7 naming
    /// the field.
    pub fn check_bursts_hold(&self, packet_bytes: u32) -> Result<(), CniError> {
        for (shape, name) in [(self.ingress, "ingressBurst"), (self.egress, "egressBurst")] {
            if let Some(s) = shape
                && s.burst_bytes() < packet_bytes
            {
                return Err(CniError::invalid_network_config(format!(
                    "{FIELD}.{name}: {} bits ({} bytes) cannot hold one packet of {packet_bytes} bytes (the pod's MTU and the Ethernet header); give at least {} bits",
                    s.burst_bits,
                    s.burst_bytes(),
                    u64::from(packet_bytes) * 8
                )));
            }
        }
        Ok(())
    }
}

/// The limits in `raw` (the whole config on stdin): `None` when there is no
/// `runtimeConfig.bandwidth` or it names no direction. A direction is limited
/// when its rate or burst is there; then both must be, within bounds.
pub fn parse(raw: &Value) -> Result<Option<BandwidthLimits>, CniError> {
    let bw = match raw.get("runtimeConfig").and_then(|r| r.get("bandwidth")) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(CniError::invalid_network_config(format!(
                "{FIELD} must be an object, got {other}"
            )));
        }
    };
    let field = |name: &str| field(bw, name);
    let limits = BandwidthLimits {
        ingress: direction(field("ingressRate"), field("ingressBurst"), "ingress")?,
        egress: direction(field("egressRate"), field("egressBurst"), "egress")?,
    };
    Ok((limits.ingress.is_some() || limits.egress.is_some()).then_some(limits))
}

/// The field `name` of `m` as Go's encoding/json finds it, which the runtimes
/// and the reference plugins use: the exact name, else one equal to it but for
/// case. containerd sends `IngressRate`, `IngressBurst`... (go-cni's struct has
/// no JSON tags), CRI-O `ingressRate`.
fn field<'a>(m: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a Value> {
    m.get(name).or_else(|| {
        m.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

fn direction(
    rate: Option<&Value>,
    burst: Option<&Value>,
    dir: &str,
) -> Result<Option<Shape>, CniError> {
    let rate = bits(rate, &format!("{dir}Rate"))?;
    let burst = bits(burst, &format!("{dir}Burst"))?;
    let (rate, burst) = match (rate, burst) {
        (None, None) => return Ok(None),
        (Some(r), Some(b)) => (r, b),
        (Some(_), None) => return Err(missing(&format!("{dir}Burst"), &format!("{dir}Rate"))),
        (None, Some(_)) => return Err(missing(&format!("{dir}Rate"), &format!("{dir}Burst"))),
    };
    if !(MIN_RATE_BITS..=MAX_RATE_BITS).contains(&rate) {
        return Err(CniError::invalid_network_config(format!(
            "{FIELD}.{dir}Rate: {rate} bits/s is outside {MIN_RATE_BITS} (1 kbit/s) to {MAX_RATE_BITS} (1 Pbit/s)"
        )));
    }
    if burst == 0 || burst > MAX_BURST_BITS {
        return Err(CniError::invalid_network_config(format!(
            "{FIELD}.{dir}Burst: {burst} bits is outside 1 to {MAX_BURST_BITS} (the kernel's bucket is at most 4 GiB)"
        )));
    }
    Ok(Some(Shape {
        rate_bits: rate,
        burst_bits: burst,
    }))
}

fn missing(absent: &str, present: &str) -> CniError {
    CniError::invalid_network_config(format!(
        "{FIELD}.{absent} is missing: it is required with {FIELD}.{present}"
    ))
}

/// A field in bits: absent or `null` is `None`; a whole number that is not
/// negative, else code 7 naming the field and the value.
fn bits(v: Option<&Value>, name: &str) -> Result<Option<u64>, CniError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| {
            CniError::invalid_network_config(format!(
                "{FIELD}.{name}: {n} is not a whole number of bits that is 0 or more"
            ))
        }),
        Some(other) => Err(CniError::invalid_network_config(format!(
            "{FIELD}.{name}: {other} is not a number"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(bw: Value) -> Value {
        json!({"cniVersion": "1.0.0", "name": "n", "type": "podnet", "runtimeConfig": {"bandwidth": bw}})
    }

    fn err(bw: Value) -> CniError {
        let e = parse(&conf(bw.clone())).expect_err(&bw.to_string());
        assert_eq!(e.code, CniError::INVALID_NETWORK_CONFIG, "{bw}");
        e
    }

    const CONTAINERD_BURST: u64 = u32::MAX as u64;

    #[test]
    fn the_conventions_names_parse() {
        let l = parse(&conf(json!({
            "ingressRate": 10_000_000, "ingressBurst": CONTAINERD_BURST,
            "egressRate": 1_000_000, "egressBurst": CONTAINERD_BURST
        })))
        .unwrap()
        .unwrap();
        let s = |rate_bits| Shape {
            rate_bits,
            burst_bits: CONTAINERD_BURST,
        };
        assert_eq!(l.ingress, Some(s(10_000_000)));
        assert_eq!(l.egress, Some(s(1_000_000)));
        assert_eq!(l.ingress.unwrap().rate_bytes(), 1_250_000);
        // No burst asked: the default bucket, never the runtime's 512 MiB.
        assert_eq!(l.ingress.unwrap().burst_bytes(), 131_072);
    }

    #[test]
    fn the_default_bucket_is_25_ms_at_the_rate_and_at_least_128_kib() {
        let bucket = |rate_bits| {
            Shape {
                rate_bits,
                burst_bits: CONTAINERD_BURST,
            }
            .burst_bytes()
        };
        assert_eq!(bucket(MIN_RATE_BITS), 131_072);
        assert_eq!(bucket(10_000_000), 131_072);
        assert_eq!(bucket(100_000_000), 312_500);
        assert_eq!(bucket(1_000_000_000), 3_125_000);
        assert_eq!(bucket(MAX_RATE_BITS), u32::MAX);
        // CRI-O's burst is none asked too.
        let crio = Shape {
            rate_bits: 10_000_000,
            burst_bits: u32::MAX as u64 * 8 - 1,
        };
        assert_eq!(crio.burst_bytes(), 131_072);
        // Any other burst is honoured as asked, one bit below containerd's too.
        let asked = Shape {
            rate_bits: 10_000_000,
            burst_bits: CONTAINERD_BURST - 1,
        };
        assert_eq!(asked.burst_bytes(), 536_870_911);
    }

    #[test]
    fn containerds_capitalised_fields_parse() {
        // What containerd 1.6 and 2 pass (go-cni's BandWidth has no JSON tags).
        let l = parse(&conf(json!({
            "IngressRate": 10_000_000, "IngressBurst": CONTAINERD_BURST,
            "EgressRate": 20_000_000, "EgressBurst": CONTAINERD_BURST
        })))
        .unwrap()
        .unwrap();
        assert_eq!(l.ingress.map(|s| s.rate_bits), Some(10_000_000));
        assert_eq!(l.egress.map(|s| s.rate_bits), Some(20_000_000));
        // The exact name wins over another case, as in Go.
        let l = parse(&conf(
            json!({"ingressRate": 2000, "INGRESSRATE": 3000, "ingressBurst": 12_112}),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(l.ingress.map(|s| s.rate_bits), Some(2000));
        // Bad values under another case are named as the field is.
        let e = err(json!({"IngressRate": "fast", "IngressBurst": 1}));
        assert!(e.msg.contains("ingressRate"), "{e:?}");
    }

    #[test]
    fn one_direction_alone() {
        let l = parse(&conf(json!({"egressRate": 1000, "egressBurst": 12_112})))
            .unwrap()
            .unwrap();
        assert_eq!(
            (l.ingress, l.egress.map(|e| e.rate_bits)),
            (None, Some(1000))
        );
    }

    #[test]
    fn nothing_asked_is_no_limit() {
        let none = |v: Value| assert_eq!(parse(&v).unwrap(), None, "{v}");
        none(json!({"cniVersion": "1.0.0"}));
        none(json!({"runtimeConfig": {}}));
        none(json!({"runtimeConfig": {"portMappings": []}}));
        none(json!({"runtimeConfig": {"bandwidth": null}}));
        none(conf(json!({})));
        none(conf(json!({"ingressRate": null, "egressBurst": null})));
    }

    #[test]
    fn the_bounds_are_inclusive() {
        for rate in [MIN_RATE_BITS, MAX_RATE_BITS] {
            for burst in [1, MAX_BURST_BITS] {
                let l = parse(&conf(json!({"ingressRate": rate, "ingressBurst": burst})))
                    .unwrap()
                    .unwrap();
                assert_eq!(l.ingress.unwrap().burst_bits, burst);
            }
        }
        assert_eq!(
            Shape {
                rate_bits: 1000,
                burst_bits: MAX_BURST_BITS
            }
            .burst_bytes(),
            u32::MAX
        );
    }

    #[test]
    fn bad_values_name_the_field_and_the_value() {
        let cases = [
            (
                json!({"ingressRate": 0, "ingressBurst": 1000}),
                "ingressRate: 0 bits/s",
            ),
            (
                json!({"egressRate": 999, "egressBurst": 1000}),
                "egressRate: 999 bits/s",
            ),
            (
                json!({"ingressRate": MAX_RATE_BITS + 1, "ingressBurst": 1000}),
                "ingressRate: 1000000000000001 bits/s",
            ),
            (
                json!({"egressRate": -5, "egressBurst": 1000}),
                "egressRate: -5 is not",
            ),
            (
                json!({"egressRate": 1.5e6, "egressBurst": 1000}),
                "egressRate: 1500000.0 is not",
            ),
            (
                json!({"ingressRate": "10M", "ingressBurst": 1000}),
                "ingressRate: \"10M\" is not a number",
            ),
            (
                json!({"ingressRate": 1000, "ingressBurst": 0}),
                "ingressBurst: 0 bits",
            ),
            (
                json!({"egressRate": 1000, "egressBurst": MAX_BURST_BITS + 1}),
                "egressBurst: 34359738361 bits",
            ),
            (
                json!({"egressRate": 1000, "egressBurst": -1}),
                "egressBurst: -1 is not",
            ),
            (json!({"ingressRate": 1000}), "ingressBurst is missing"),
            (json!({"egressBurst": 1000}), "egressRate is missing"),
            (
                json!({"egressRate": 1000, "egressBurst": true}),
                "egressBurst: true is not a number",
            ),
            (json!([1]), "bandwidth must be an object"),
            (json!(5), "bandwidth must be an object"),
        ];
        for (bw, says) in cases {
            let e = err(bw.clone());
            assert!(e.msg.contains(says), "{bw}: {}", e.msg);
            assert!(e.msg.starts_with("runtimeConfig.bandwidth"), "{}", e.msg);
        }
    }

    #[test]
    fn a_bucket_must_hold_one_packet() {
        let l = |burst_bits| BandwidthLimits {
            ingress: None,
            egress: Some(Shape {
                rate_bits: 1000,
                burst_bits,
            }),
        };
        l(1514 * 8).check_bursts_hold(1514).unwrap();
        let e = l(1514 * 8 - 1).check_bursts_hold(1514).unwrap_err();
        assert_eq!(e.code, CniError::INVALID_NETWORK_CONFIG);
        assert!(
            e.msg.contains("egressBurst: 12111 bits (1513 bytes)"),
            "{}",
            e.msg
        );
        assert!(e.msg.contains("at least 12112 bits"), "{}", e.msg);
        let both = BandwidthLimits {
            ingress: Some(Shape {
                rate_bits: 1000,
                burst_bits: 8,
            }),
            ..l(1514 * 8)
        };
        assert!(
            both.check_bursts_hold(1514)
                .unwrap_err()
                .msg
                .contains("ingressBurst")
        );
        BandwidthLimits::default()
            .check_bursts_hold(u32::MAX)
            .unwrap();
    }
}
