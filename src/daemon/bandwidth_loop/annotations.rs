//! A Pod's `kubernetes.io/ingress-bandwidth` and `kubernetes.io/egress-bandwidth`
//! annotations read as the runtime reads them for ADD, so the loop sets what
//! ADD set and never fights it: kubelet's `ExtractPodBandwidthResources`
//! (a `resource.Quantity`, its value rounded up, from 1k to 1P bits/s, else
//! refused), with containerd's burst of `u32::MAX` bits (`RUNTIME_BURST_BITS`;
//! CRI-O passes `u32::MAX × 8 − 1`, which `plan` leaves alone: it compares
//! rates). Pure.

use std::fmt;

use crate::cni::bandwidth::{MAX_RATE_BITS, MIN_RATE_BITS, Shape};
use crate::k8s::quantity::{self, QuantityError, Value};

/// The annotation of the traffic to the pod.
pub const INGRESS: &str = "kubernetes.io/ingress-bandwidth";
/// The annotation of the traffic from the pod.
pub const EGRESS: &str = "kubernetes.io/egress-bandwidth";
/// The burst containerd passes with every rate, in bits (`math.MaxUint32`).
pub const RUNTIME_BURST_BITS: u64 = u32::MAX as u64;

/// What one annotation asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// No annotation: no limit.
    Unlimited,
    Limit(Shape),
    /// A value kubelet would refuse: the direction's shaping is left as it is.
    Invalid(Invalid),
}

/// A refused annotation value and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Invalid {
    pub annotation: &'static str,
    pub value: String,
    pub why: Why,
}

/// Why a value is refused.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Why {
    Unreadable(QuantityError),
    Negative,
    /// Its value rounded up (0 included) is below 1k.
    Below(u128),
    /// Its value is above 1P.
    Above,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, v) = (self.annotation, &self.value);
        match &self.why {
            Why::Unreadable(e) => write!(f, "{a}: {v:?} {e}")?,
            Why::Negative => write!(f, "{a}: {v:?} is negative")?,
            Why::Below(n) => write!(f, "{a}: {v:?} is {n} bits/s, below 1k")?,
            Why::Above => write!(f, "{a}: {v:?} is above 1P bits/s")?,
        }
        write!(
            f,
            "; accepted: a quantity from 1k ({MIN_RATE_BITS} bits/s) to 1P ({MAX_RATE_BITS} bits/s), such as 10M or 1G; the pod's current shaping of this direction is kept"
        )
    }
}

/// What the annotation `annotation` with `value` (None: not there) asks for.
pub fn wanted(annotation: &'static str, value: Option<&str>) -> Wanted {
    let Some(v) = value else {
        return Wanted::Unlimited;
    };
    let invalid = |why| {
        Wanted::Invalid(Invalid {
            annotation,
            value: v.to_string(),
            why,
        })
    };
    let rate = match quantity::value(v) {
        Err(e) => return invalid(Why::Unreadable(e)),
        Ok(Value::Negative) => return invalid(Why::Negative),
        Ok(Value::Huge) => return invalid(Why::Above),
        Ok(Value::Whole(n)) => n,
    };
    if rate < u128::from(MIN_RATE_BITS) {
        return invalid(Why::Below(rate));
    }
    match u64::try_from(rate) {
        Ok(r) if r <= MAX_RATE_BITS => Wanted::Limit(Shape {
            rate_bits: r,
            burst_bits: RUNTIME_BURST_BITS,
        }),
        _ => invalid(Why::Above),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(rate_bits: u64) -> Wanted {
        Wanted::Limit(Shape {
            rate_bits,
            burst_bits: RUNTIME_BURST_BITS,
        })
    }

    fn why(value: &str) -> Why {
        match wanted(EGRESS, Some(value)) {
            Wanted::Invalid(i) => i.why,
            other => panic!("{value}: {other:?}"),
        }
    }

    #[test]
    fn what_kubelet_accepts_is_the_rate_adds_burst() {
        assert_eq!(wanted(INGRESS, None), Wanted::Unlimited);
        assert_eq!(wanted(INGRESS, Some("10M")), limit(10_000_000));
        assert_eq!(wanted(INGRESS, Some("1Gi")), limit(1 << 30));
        assert_eq!(wanted(INGRESS, Some("500k")), limit(500_000));
        assert_eq!(wanted(INGRESS, Some("1k")), limit(1000));
        assert_eq!(wanted(INGRESS, Some("1P")), limit(MAX_RATE_BITS));
        assert_eq!(wanted(INGRESS, Some("999.5")), limit(1000));
        assert_eq!(wanted(INGRESS, Some("1e6")), limit(1_000_000));
        assert_eq!(wanted(INGRESS, Some("1000000m")), limit(1000));
    }

    #[test]
    fn what_kubelet_refuses_and_why() {
        assert_eq!(why("0"), Why::Below(0));
        assert_eq!(why("999"), Why::Below(999));
        assert_eq!(why("0.9k"), Why::Below(900));
        assert_eq!(why("999000m"), Why::Below(999));
        assert_eq!(wanted(EGRESS, Some("999001m")), limit(1000));
        assert_eq!(why("-10M"), Why::Negative);
        assert_eq!(why("1000000000000001"), Why::Above);
        assert_eq!(why("1.0000000000000001P"), Why::Above);
        assert_eq!(why("1Pi"), Why::Above);
        assert_eq!(why("1E"), Why::Above);
        assert_eq!(why("1e100"), Why::Above);
        assert_eq!(why("ten"), Why::Unreadable(QuantityError::NotAQuantity));
        assert_eq!(why(""), Why::Unreadable(QuantityError::NotAQuantity));
        assert_eq!(why("10Mbit"), Why::Unreadable(QuantityError::NotAQuantity));
        assert_eq!(
            why("123456789012345678901"),
            Why::Unreadable(QuantityError::TooManyDigits)
        );
    }

    #[test]
    fn the_note_names_the_annotation_the_value_and_the_range() {
        let Wanted::Invalid(i) = wanted(EGRESS, Some("0")) else {
            panic!("0 is refused");
        };
        let note = i.to_string();
        assert!(
            note.starts_with("kubernetes.io/egress-bandwidth: \"0\" is 0 bits/s, below 1k"),
            "{note}"
        );
        assert!(
            note.contains("from 1k (1000 bits/s) to 1P (1000000000000000 bits/s)"),
            "{note}"
        );
        for v in ["ten", "-1", "2P"] {
            let Wanted::Invalid(i) = wanted(INGRESS, Some(v)) else {
                panic!("{v} is refused");
            };
            let note = i.to_string();
            assert!(
                note.starts_with(&format!("kubernetes.io/ingress-bandwidth: {v:?}")),
                "{note}"
            );
            assert!(note.contains("current shaping"), "{note}");
        }
    }
}
