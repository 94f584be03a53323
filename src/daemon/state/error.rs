//! `ApiError`: what a request to the daemon failed with. It says what kind of
//! failure it is ([`ErrorKind`]), never how a transport spells it: the HTTP
//! status is chosen in one place, `daemon::routes`.

use super::node_config::NodeConfig;
use crate::ipam::failure_reason::FailureReason;

/// What kind of failure an [`ApiError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or asks for what this node does not offer.
    Invalid,
    /// What the request names does not exist.
    NotFound,
    /// The request collides with what is there (an address in use or cooling
    /// down, a pool edit that breaks what the node uses).
    Conflict,
    /// The node's IPAM cannot give what was asked (a full range, a pool with no
    /// blocks yet, no pool for the pod, a mode that hands out no addresses).
    NoAddress,
    /// The daemon cannot answer now and may later (the journal does not commit,
    /// the pod metadata is not synced yet).
    Unavailable,
    /// The request body did not arrive in time.
    BodyTimeout,
    /// The request body is larger than the daemon reads.
    BodyTooLarge,
    /// The daemon failed in a way no request causes.
    Internal,
}

/// An API failure: its kind, the message the client sees and, where the client
/// acts on it, why (sent in the `podnet-reason` header) and the configuration it
/// goes on with (the `podnet-config` header of a `delegated-plugin` refusal).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    pub reason: Option<FailureReason>,
    pub config: Option<Box<NodeConfig>>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ApiError {
        ApiError {
            kind,
            message: message.into(),
            reason: None,
            config: None,
        }
    }

    /// An error whose reason the client may act on.
    pub fn because(reason: FailureReason, kind: ErrorKind, message: impl Into<String>) -> ApiError {
        ApiError {
            reason: Some(reason),
            ..ApiError::new(kind, message)
        }
    }
}
