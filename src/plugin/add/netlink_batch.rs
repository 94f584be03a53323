//! Netlink requests sent in one datagram and answered in order: the host side's
//! and the pod side's set-up each take one round trip, and their first failure
//! reads as if the requests had been sent one by one.

use crate::cni::CniError;
use crate::datapath::{NetlinkSocket, Request};

use super::super::datapath_errors::dp;

/// One request of `in_order`: what its error says, and whether EEXIST is fine.
pub(super) struct Step<'a> {
    pub req: Request<'a>,
    pub what: &'static str,
    pub exists_ok: bool,
}

impl<'a> Step<'a> {
    pub fn new(req: Request<'a>, what: &'static str) -> Self {
        Step {
            req,
            what,
            exists_ok: false,
        }
    }
}

/// Sends `steps` in one datagram (`NetlinkSocket::batch`); the first failure in
/// their order is the error, with its step's `what`, as if they had been sent one
/// by one. `all` names the datagram, for a send that fails.
pub(super) fn in_order(
    sock: &NetlinkSocket,
    steps: Vec<Step<'_>>,
    all: &'static str,
) -> Result<(), CniError> {
    let (reqs, meanings): (Vec<_>, Vec<_>) = steps
        .into_iter()
        .map(|s| (s.req, (s.what, s.exists_ok)))
        .unzip();
    let outcomes = sock.batch(reqs).map_err(dp(all))?;
    for (outcome, (what, exists_ok)) in outcomes.into_iter().zip(meanings) {
        match outcome {
            Err(e) if !(exists_ok && e.is_exists()) => return Err(dp(what)(e)),
            _ => {}
        }
    }
    Ok(())
}
