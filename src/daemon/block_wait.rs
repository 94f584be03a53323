//! Multi-pool with a cluster operator: an ADD that finds its pool without room
//! waits, within a bound, for the blocks its demand asks for, instead of failing
//! while they are in flight (the demand goes to the CiliumNode, the operator carves
//! blocks into it, the watch brings them back). A waiting allocation has the
//! demand written within a second rather than at the next update interval; every
//! node event the daemon applies wakes the waiting allocations, which then try
//! again.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Daemon;
use super::state::{AllocateRequest, Allocated, ApiError};

/// How long an allocation waits for blocks: below the plugin's 30 s limit on a
/// daemon call, so a pool that stays without room fails with the daemon's reason
/// rather than with the plugin's timeout.
pub const BLOCK_WAIT: Duration = Duration::from_secs(20);

impl Daemon {
    /// `POST /v1/ipam`: the next address(es), waiting up to [`BLOCK_WAIT`] for the
    /// cluster operator's blocks when the pool has no room.
    ///
    /// A refusal of the addresses the pod's annotation asks for is posted on the
    /// Pod (`address_events`).
    pub async fn allocate_waiting_for_blocks(
        self: &Arc<Self>,
        req: AllocateRequest,
    ) -> Result<Allocated, ApiError> {
        let result = self.allocate_waiting(&req).await;
        if let Err(e) = &result {
            self.report_refused_address(&req, e);
        }
        result
    }

    async fn allocate_waiting(
        self: &Arc<Self>,
        req: &AllocateRequest,
    ) -> Result<Allocated, ApiError> {
        let deadline = Instant::now() + BLOCK_WAIT;
        let mut node_events = self.node_events.subscribe();
        loop {
            node_events.borrow_and_update();
            let may_wait = Instant::now() < deadline;
            let (result, waits) = self.with_state_in_place(|s| {
                let r = s.allocate(req, may_wait);
                let waits = r.as_ref().err().is_some_and(|e| s.waits_for_blocks(e));
                Ok((r, waits))
            })?;
            match result {
                Err(e) if waits && may_wait => {
                    tracing::debug!(owner = %req.owner, error = %e.message, "allocation waits for blocks");
                    self.demand_waiting.notify_one();
                    // A node event, or the deadline: either way one more attempt,
                    // the last one recorded as a failure if it fails.
                    let _ = tokio::time::timeout_at(deadline, node_events.changed()).await;
                }
                Err(e) if waits => {
                    return Err(ApiError {
                        message: format!(
                            "{} (waited {}s for blocks from the operator: check the operator's log and the CiliumNode's status.ipam.operator-status)",
                            e.message,
                            BLOCK_WAIT.as_secs()
                        ),
                        ..e
                    });
                }
                other => return other,
            }
        }
    }
}
