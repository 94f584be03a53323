//! How kernel failures become CNI errors: code 102, with what was being done
//! (`daemon_errors` is the same for the daemon's API).

use crate::cni::CniError;
use crate::datapath::DatapathError;

/// Wraps a datapath error with what was being done (code 102).
pub fn dp(what: &'static str) -> impl Fn(DatapathError) -> CniError {
    move |e| CniError::datapath_failure(format!("{what}: {e}"))
}
