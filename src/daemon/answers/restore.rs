//! What the daemon's start restored and reconciled, as status shows it
//! (`ipam.restore`).

use crate::api::models::RestoreStatus;
use crate::daemon::state::RestoreReport;

/// The restore report in the wire's shape.
pub fn restore_status(report: &RestoreReport) -> RestoreStatus {
    RestoreStatus {
        restored: report.restored,
        expired: report.expired,
        cooled_down: report.cooled_down,
        queued_deletes: report.queued_deletes,
        outside_ranges: report.outside_ranges.clone(),
        released_link_gone: report.released_link_gone.clone(),
        orphan_links_removed: report.orphan_links_removed.clone(),
        adopted_from_kernel: report.adopted_from_kernel.clone(),
        adopted_because: report.adopted_because.clone(),
        unaccounted_links_kept: report.unaccounted_links_kept.clone(),
    }
}
