//! `DatapathError`: the one error type of the datapath module. Every variant
//! names the operation and the object it failed on, and keeps the errno (if
//! any) available through [`DatapathError::errno`] so callers can map
//! EEXIST / ENOENT / ENODEV to CNI semantics.

use std::io;
use std::path::PathBuf;

/// Result alias used throughout the datapath module.
pub type Result<T, E = DatapathError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// The kernel rejected a netlink request (or the socket failed).
    /// `ext_ack` holds the kernel's extended-ack message when it sent one.
    #[error("{context}: {source}{}", ext_ack_suffix(.ext_ack))]
    Netlink {
        context: String,
        #[source]
        source: io::Error,
        ext_ack: Option<String>,
    },
    /// A network namespace path does not exist.
    #[error("network namespace {} not found", .path.display())]
    NetNsNotFound { path: PathBuf },
    /// A non-netlink system call (open, setns, read/write of /proc/sys) failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// A netlink reply could not be decoded.
    #[error("{context}: cannot decode netlink reply: {message}")]
    Decode { context: String, message: String },
    /// The caller passed an invalid argument (bad interface name, family mismatch, ...).
    #[error("{0}")]
    Invalid(String),
    /// A helper thread (the one that entered a namespace) panicked.
    #[error("{context}: helper thread panicked")]
    ThreadPanicked { context: String },
}

fn ext_ack_suffix(ext_ack: &Option<String>) -> String {
    match ext_ack {
        Some(msg) if !msg.is_empty() => format!(" (kernel: {msg})"),
        _ => String::new(),
    }
}

impl DatapathError {
    /// The errno behind this error, if there is one (positive, e.g. `libc::EEXIST`).
    pub fn errno(&self) -> Option<i32> {
        match self {
            DatapathError::Netlink { source, .. } | DatapathError::Io { source, .. } => {
                source.raw_os_error()
            }
            DatapathError::NetNsNotFound { .. } => Some(libc::ENOENT),
            DatapathError::Invalid(_) => Some(libc::EINVAL),
            DatapathError::Decode { .. } | DatapathError::ThreadPanicked { .. } => None,
        }
    }

    /// True when the error is EEXIST ("File exists").
    pub fn is_exists(&self) -> bool {
        self.errno() == Some(libc::EEXIST)
    }

    /// True when the error means "no such object" (ENOENT, ENODEV, ESRCH, EADDRNOTAVAIL),
    /// the errnos the kernel uses for a missing link, route, rule, address or netns.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.errno(),
            Some(libc::ENOENT | libc::ENODEV | libc::ESRCH | libc::EADDRNOTAVAIL)
        )
    }

    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        DatapathError::Io {
            context: context.into(),
            source,
        }
    }
}
