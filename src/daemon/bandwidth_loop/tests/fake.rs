//! What a plan's steps make of a link, in memory: the loop tests' kernel.

use crate::daemon::bandwidth_loop::plan::{IfbSeen, Observed, Step};
use crate::datapath::TbfReading;

/// `seen` once `steps` are written.
pub fn written(seen: &Observed, steps: &[Step]) -> Observed {
    let mut o = seen.clone();
    let reading = |p: &crate::datapath::TbfParams| TbfReading {
        rate_bytes: p.rate_bytes,
        limit_bytes: p.limit_bytes,
    };
    for s in steps {
        match s {
            Step::SetToPod(p) => o.to_pod = Some(reading(p)),
            Step::ClearToPod => o.to_pod = None,
            Step::CreateIfb => {
                let ifb = o.ifb.get_or_insert_with(IfbSeen::default);
                ifb.ready = true;
            }
            Step::SetFromPod(p) => {
                if let Some(i) = o.ifb.as_mut() {
                    i.tbf = Some(reading(p));
                }
            }
            Step::AddIngressQdisc => o.ingress_qdisc = true,
            Step::AddRedirect => o.redirect = o.ingress_qdisc && o.ifb.is_some(),
            Step::ClearFromPod => {
                o.ingress_qdisc = false;
                o.redirect = false;
            }
            Step::DeleteIfb => {
                o.ifb = None;
                o.redirect = false;
            }
        }
    }
    o
}
