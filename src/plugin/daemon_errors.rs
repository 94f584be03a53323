//! How daemon API failures become CNI errors: unreachable → 11 (try again later),
//! a full range or exhausted pool → 101, any other refusal → 100; the daemon's own text is kept.

use crate::api::client::ClientError;
use crate::cni::CniError;

/// Maps a failed daemon call made while doing `what`.
pub fn to_cni(e: ClientError, what: &str) -> CniError {
    let text = format!("{what}: {e}");
    match &e {
        _ if e.is_unavailable() => CniError::try_again_later(text),
        ClientError::Status { message, .. }
            if message.starts_with("range is full")
                || message.starts_with("all CIDR ranges are exhausted")
                || message.starts_with("No IPs available") =>
        {
            CniError::address_exhausted(text)
        }
        _ => CniError::daemon_rejected(text),
    }
}
