//! The plan, exhaustively: every combination of what each direction asks for
//! and what the link has converges in one plan, and a second plan is empty.

use super::*;
use crate::daemon::bandwidth_loop::annotations::{Invalid, RUNTIME_BURST_BITS, Why};
use crate::daemon::bandwidth_loop::tests::fake::written;

fn limit(rate_bits: u64) -> Wanted {
    Wanted::Limit(Shape {
        rate_bits,
        burst_bits: RUNTIME_BURST_BITS,
    })
}

fn invalid() -> Wanted {
    Wanted::Invalid(Invalid {
        annotation: "kubernetes.io/ingress-bandwidth",
        value: "0".into(),
        why: Why::Below(0),
    })
}

fn reading(rate_bits: u64) -> Option<TbfReading> {
    let p = tbf(&Shape {
        rate_bits,
        burst_bits: RUNTIME_BURST_BITS,
    });
    Some(TbfReading {
        rate_bytes: p.rate_bytes,
        limit_bytes: p.limit_bytes,
    })
}

fn wanteds() -> Vec<Wanted> {
    vec![
        Wanted::Unlimited,
        limit(1_000_000),
        limit(2_000_000),
        invalid(),
    ]
}

fn seens() -> Vec<Observed> {
    let tbfs = [None, reading(1_000_000), reading(2_000_000)];
    let mut ifbs = vec![None];
    for ready in [false, true] {
        for t in tbfs {
            ifbs.push(Some(IfbSeen { ready, tbf: t }));
        }
    }
    let mut out = Vec::new();
    for to_pod in tbfs {
        for ingress_qdisc in [false, true] {
            for redirect in [false, true] {
                for ifb in &ifbs {
                    out.push(Observed {
                        to_pod,
                        ingress_qdisc,
                        redirect: redirect && ingress_qdisc && ifb.is_some(),
                        ifb: ifb.clone(),
                    });
                }
            }
        }
    }
    out
}

/// What a direction's part of `seen` must be after the plan.
fn to_pod_ok(w: &Wanted, before: &Observed, after: &Observed) -> bool {
    match w {
        Wanted::Unlimited => after.to_pod.is_none(),
        Wanted::Limit(s) => same(after.to_pod, &tbf(s)),
        Wanted::Invalid(_) => after.to_pod == before.to_pod,
    }
}

fn from_pod_ok(w: &Wanted, before: &Observed, after: &Observed) -> bool {
    match w {
        Wanted::Unlimited => !after.ingress_qdisc && !after.redirect && after.ifb.is_none(),
        Wanted::Limit(s) => {
            let ifb = after.ifb.as_ref();
            after.ingress_qdisc
                && after.redirect
                && ifb.is_some_and(|i| i.ready && same(i.tbf, &tbf(s)))
        }
        Wanted::Invalid(_) => {
            (after.ingress_qdisc, after.redirect, &after.ifb)
                == (before.ingress_qdisc, before.redirect, &before.ifb)
        }
    }
}

#[test]
fn every_combination_converges_in_one_plan() {
    let mut cases = 0;
    for ingress in wanteds() {
        for egress in wanteds() {
            for seen in seens() {
                let steps = plan(&ingress, &egress, &seen);
                let after = written(&seen, &steps);
                let case = format!("{ingress:?} {egress:?} {seen:?}: {steps:?}");
                assert!(to_pod_ok(&ingress, &seen, &after), "{case}");
                assert!(from_pod_ok(&egress, &seen, &after), "{case}");
                assert_eq!(plan(&ingress, &egress, &after), vec![], "{case}");
                assert_eq!(
                    shaped_after(&seen, &steps),
                    after.to_pod.is_some() || after.ifb.as_ref().is_some_and(|i| i.tbf.is_some()),
                    "{case}"
                );
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 4 * 4 * 3 * 2 * 2 * 7);
}

#[test]
fn what_agrees_is_left_alone() {
    let seen = Observed {
        to_pod: reading(1_000_000),
        ingress_qdisc: true,
        redirect: true,
        ifb: Some(IfbSeen {
            ready: true,
            tbf: reading(2_000_000),
        }),
    };
    assert_eq!(plan(&limit(1_000_000), &limit(2_000_000), &seen), vec![]);
    assert_eq!(plan(&invalid(), &invalid(), &seen), vec![]);
    assert_eq!(
        plan(&Wanted::Unlimited, &Wanted::Unlimited, &Observed::default()),
        vec![]
    );
}

#[test]
fn another_runtimes_burst_at_the_asked_rate_is_left_alone() {
    let crio = |rate_bits| {
        reading(rate_bits).map(|r| TbfReading {
            limit_bytes: u32::MAX,
            ..r
        })
    };
    let seen = Observed {
        to_pod: crio(1_000_000),
        ingress_qdisc: true,
        redirect: true,
        ifb: Some(IfbSeen {
            ready: true,
            tbf: crio(2_000_000),
        }),
    };
    assert_eq!(plan(&limit(1_000_000), &limit(2_000_000), &seen), vec![]);
    let steps = plan(&limit(3_000_000), &limit(2_000_000), &seen);
    assert_eq!(steps.len(), 1, "{steps:?}");
}

#[test]
fn the_steps_and_their_order() {
    let p = |r| {
        tbf(&Shape {
            rate_bits: r,
            burst_bits: RUNTIME_BURST_BITS,
        })
    };
    // A new egress limit: the IFB first, the redirect last.
    assert_eq!(
        plan(&Wanted::Unlimited, &limit(1_000_000), &Observed::default()),
        vec![
            Step::CreateIfb,
            Step::SetFromPod(p(1_000_000)),
            Step::AddIngressQdisc,
            Step::AddRedirect
        ]
    );
    // A changed rate replaces only the TBF.
    let shaped = Observed {
        to_pod: reading(1_000_000),
        ingress_qdisc: true,
        redirect: true,
        ifb: Some(IfbSeen {
            ready: true,
            tbf: reading(1_000_000),
        }),
    };
    assert_eq!(
        plan(&limit(3_000_000), &limit(3_000_000), &shaped),
        vec![Step::SetToPod(p(3_000_000)), Step::SetFromPod(p(3_000_000))]
    );
    // Removed: the redirect's qdisc before its IFB.
    assert_eq!(
        plan(&Wanted::Unlimited, &Wanted::Unlimited, &shaped),
        vec![Step::ClearToPod, Step::ClearFromPod, Step::DeleteIfb]
    );
    // The TBF ADD sets for containerd's burst (none asked): 1 Mbit/s is
    // 125,000 bytes/s, the default bucket of 128 KiB, a queue of 25 ms on top.
    assert_eq!(p(1_000_000), TbfParams::new(125_000, 131_072));
}
