//! `ResponderError`: why the responder cannot serve an interface, naming the
//! interface and the operation. Cloneable (the errno, not the `io::Error`), so
//! a worker's failure can be both kept for `report()` and logged.

use std::sync::Arc;

use nix::errno::Errno;

use crate::datapath::DatapathError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ResponderError {
    #[error("interface {interface}: no such interface")]
    NoSuchInterface { interface: String },
    #[error("interface {interface}: not an Ethernet interface (no 6-byte MAC address)")]
    NotEthernet { interface: String },
    #[error("interface {interface}: {operation}: {source} (answering ARP/NDP needs CAP_NET_RAW)")]
    NeedsCapNetRaw {
        interface: String,
        operation: &'static str,
        source: Errno,
    },
    #[error("interface {interface}: {operation}: {source}")]
    Socket {
        interface: String,
        operation: &'static str,
        source: Errno,
    },
    #[error("interface {interface}: {source}")]
    Netlink {
        interface: String,
        source: Arc<DatapathError>,
    },
    #[error("interface {interface}: the link was deleted while answered for")]
    LinkGone { interface: String },
}

impl ResponderError {
    /// The interface it is about.
    pub fn interface(&self) -> &str {
        match self {
            ResponderError::NoSuchInterface { interface }
            | ResponderError::NotEthernet { interface }
            | ResponderError::NeedsCapNetRaw { interface, .. }
            | ResponderError::Socket { interface, .. }
            | ResponderError::Netlink { interface, .. }
            | ResponderError::LinkGone { interface } => interface,
        }
    }

    /// The error of system call `operation` on `interface`'s socket (errno from
    /// `io`): EPERM and EACCES say that CAP_NET_RAW is missing.
    pub(super) fn socket(interface: &str, operation: &'static str, io: std::io::Error) -> Self {
        let interface = interface.to_string();
        let source = Errno::from_raw(io.raw_os_error().unwrap_or(libc::EIO));
        match source {
            Errno::EPERM | Errno::EACCES => ResponderError::NeedsCapNetRaw {
                interface,
                operation,
                source,
            },
            _ => ResponderError::Socket {
                interface,
                operation,
                source,
            },
        }
    }
}
