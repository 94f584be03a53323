//! What one pod's shaping should become: its annotations' [`Wanted`] limits
//! against what its host link has ([`Observed`]), planned as the [`Step`]s
//! that make the difference (none when they agree). Each direction on its
//! own: a limit is set or changed, an absent annotation removes what is
//! there, an invalid one leaves it as it is. The TBF is `plugin::shaping`'s,
//! so the loop sets exactly what ADD set. Pure.

use crate::cni::bandwidth::Shape;
use crate::datapath::{TbfParams, TbfReading};

use super::annotations::Wanted;

/// What a pod's host link has, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// The host link's root TBF (podnet's handle `1:`): traffic to the pod.
    pub to_pod: Option<TbfReading>,
    /// The host link has the ingress qdisc.
    pub ingress_qdisc: bool,
    /// A filter of that qdisc redirects to the pod's IFB.
    pub redirect: bool,
    /// The pod's IFB device, when there is one.
    pub ifb: Option<IfbSeen>,
}

/// The pod's IFB device, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IfbSeen {
    /// Up, with podnet's alias.
    pub ready: bool,
    /// Its root TBF: traffic from the pod.
    pub tbf: Option<TbfReading>,
}

/// One change to a pod's shaping, in the order a plan lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Put (or replace) the host link's root TBF.
    SetToPod(TbfParams),
    /// Delete the host link's root TBF.
    ClearToPod,
    /// Create the IFB (if missing), up, with podnet's alias.
    CreateIfb,
    /// Put (or replace) the IFB's root TBF.
    SetFromPod(TbfParams),
    AddIngressQdisc,
    AddRedirect,
    /// Delete the host link's ingress qdisc (its redirect goes with it).
    ClearFromPod,
    DeleteIfb,
}

/// The TBF of one direction's limit, as `plugin::shaping` builds it.
pub fn tbf(s: &Shape) -> TbfParams {
    TbfParams::new(s.rate_bytes(), s.burst_bytes())
}

/// Whether a reading shapes at `want`'s rate. The rate only: the annotation
/// names no burst, and the runtimes pass different ones (containerd
/// `u32::MAX` bits, CRI-O `u32::MAX × 8 − 1`), so a TBF of the asked rate
/// that ADD set with either is left alone; a new rate gets containerd's.
fn same(reading: Option<TbfReading>, want: &TbfParams) -> bool {
    reading.is_some_and(|r| r.rate_bytes == want.rate_bytes)
}

/// The steps that make `seen` what `ingress` (to the pod) and `egress` (from
/// it) ask for.
pub fn plan(ingress: &Wanted, egress: &Wanted, seen: &Observed) -> Vec<Step> {
    let mut steps = Vec::new();
    match ingress {
        Wanted::Limit(s) if !same(seen.to_pod, &tbf(s)) => steps.push(Step::SetToPod(tbf(s))),
        Wanted::Unlimited if seen.to_pod.is_some() => steps.push(Step::ClearToPod),
        _ => {}
    }
    match egress {
        Wanted::Limit(s) => {
            let want = tbf(s);
            let ifb = seen.ifb.as_ref();
            if !ifb.is_some_and(|i| i.ready) {
                steps.push(Step::CreateIfb);
            }
            if !same(ifb.and_then(|i| i.tbf), &want) {
                steps.push(Step::SetFromPod(want));
            }
            if !seen.ingress_qdisc {
                steps.push(Step::AddIngressQdisc);
            }
            if !seen.redirect {
                steps.push(Step::AddRedirect);
            }
        }
        Wanted::Unlimited => {
            if seen.ingress_qdisc {
                steps.push(Step::ClearFromPod);
            }
            if seen.ifb.is_some() {
                steps.push(Step::DeleteIfb);
            }
        }
        Wanted::Invalid(_) => {}
    }
    steps
}

/// Whether the pod is shaped once `steps` are written over `seen`.
pub fn shaped_after(seen: &Observed, steps: &[Step]) -> bool {
    let to_pod = match steps
        .iter()
        .find(|s| matches!(s, Step::SetToPod(_) | Step::ClearToPod))
    {
        Some(Step::SetToPod(_)) => true,
        Some(_) => false,
        None => seen.to_pod.is_some(),
    };
    let from_pod = match steps
        .iter()
        .find(|s| matches!(s, Step::SetFromPod(_) | Step::DeleteIfb))
    {
        Some(Step::SetFromPod(_)) => true,
        Some(_) => false,
        None => seen.ifb.as_ref().is_some_and(|i| i.tbf.is_some()),
    };
    to_pod || from_pod
}

#[cfg(test)]
#[path = "tests/plan.rs"]
mod tests;
