//! How daemon API failures become CNI errors: unreachable, silent, or gone in the
//! middle of the request (connection closed or reset) → 11 (try again later), a full
//! range or exhausted pool → 101, any other refusal → 100; the daemon's own text is kept.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        let closed = ClientError::Closed {
            socket: "/run/podnet/podnet.sock".into(),
            detail: "Connection reset by peer (os error 104)".into(),
        };
        let e = to_cni(closed, "reading the daemon's configuration");
        assert_eq!(e.code, CniError::TRY_AGAIN_LATER);
        assert!(
            e.msg.starts_with("reading the daemon's configuration: ")
                && e.msg.contains("closed the connection")
                && e.msg.contains("try again"),
            "{}",
            e.msg
        );
        let full = ClientError::Status {
            status: 502,
            message: "range is full: no free address".into(),
        };
        assert_eq!(to_cni(full, "x").code, CniError::ADDRESS_EXHAUSTED);
        let refused = ClientError::Status {
            status: 400,
            message: "invalid owner".into(),
        };
        let e = to_cni(refused, "x");
        assert_eq!((e.code, e.msg.as_str()), (100, "x: invalid owner"));
    }
}
