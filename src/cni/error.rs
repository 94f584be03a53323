//! The CNI error object: well-known and podnet-specific error codes, and the
//! JSON shape a plugin prints on stdout when it fails.

use serde::Serialize;
use std::fmt;

/// A CNI error: a numeric code, a short message and optional longer details.
///
/// Printed as `{"cniVersion":..,"code":..,"msg":..,"details":..}` on stdout
/// (see [`CniError::to_json`]); the process then exits with status 1, never
/// with the code itself (codes ≥ 256 would wrap).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    /// The CNI error code (0–99 well-known, 100+ plugin-specific).
    pub code: u32,
    /// Short, human-readable message.
    pub msg: String,
    /// Longer explanation; empty when there is none.
    pub details: String,
}

impl CniError {
    /// 1: the config's CNI version is not supported (or does not allow the verb).
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// 2: a field of the config is not supported; the message names key and value.
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// 3: the container is unknown or does not exist.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// 4: invalid or missing `CNI_*` environment variables; the message names them.
    pub const INVALID_ENV: u32 = 4;
    /// 5: I/O failure.
    pub const IO_FAILURE: u32 = 5;
    /// 6: failed to decode content (stdin JSON, `prevResult`, ...).
    pub const DECODE_FAILURE: u32 = 6;
    /// 7: the network configuration is invalid.
    pub const INVALID_NETWORK_CONFIG: u32 = 7;
    /// 11: transient failure; the runtime may retry later.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// 50: STATUS: the plugin is not available (cannot serve ADD).
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    /// 51: STATUS: not available, and existing containers may have limited connectivity.
    pub const LIMITED_CONNECTIVITY: u32 = 51;

    /// 100 (podnet): the IPAM daemon was reached but rejected the request.
    pub const DAEMON_REJECTED: u32 = 100;
    /// 101 (podnet): the address space (pool) is exhausted; no address is free.
    pub const ADDRESS_EXHAUSTED: u32 = 101;
    /// 102 (podnet): a datapath operation (netlink: link, address, route) failed.
    pub const DATAPATH_FAILURE: u32 = 102;
    /// 103 (podnet): CHECK found a difference between `prevResult` and reality.
    pub const CHECK_MISMATCH: u32 = 103;
    /// 104 (podnet): an interface with the requested name already exists in the
    /// container and was not created by podnet.
    pub const INTERFACE_EXISTS: u32 = 104;
    /// 106 (podnet): the daemon's configuration does not fit its node (an enabled
    /// family the node has no address of): no address until an option or the
    /// node changes. (105 is the delegated IPAM plugin's failure, `plugin::delegate`.)
    pub const NODE_CONFIG_MISMATCH: u32 = 106;
    /// 107 (podnet): the addresses the pod's `ipam.podnet.io/ip-addresses`
    /// annotation asks for cannot be given (the annotation is malformed, or the
    /// address is taken, outside this node's ranges or in no pool): nothing is
    /// allocated; the message says which and why.
    pub const REQUESTED_ADDRESS_REFUSED: u32 = 107;

    /// Builds an error with an arbitrary code and no details.
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// Replaces the details text.
    #[must_use]
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// Code 1, [`Self::INCOMPATIBLE_VERSION`].
    pub fn incompatible_version(msg: impl Into<String>) -> Self {
        Self::new(Self::INCOMPATIBLE_VERSION, msg)
    }
    /// Code 2, [`Self::UNSUPPORTED_FIELD`].
    pub fn unsupported_field(msg: impl Into<String>) -> Self {
        Self::new(Self::UNSUPPORTED_FIELD, msg)
    }
    /// Code 3, [`Self::UNKNOWN_CONTAINER`].
    pub fn unknown_container(msg: impl Into<String>) -> Self {
        Self::new(Self::UNKNOWN_CONTAINER, msg)
    }
    /// Code 4, [`Self::INVALID_ENV`].
    pub fn invalid_env(msg: impl Into<String>) -> Self {
        Self::new(Self::INVALID_ENV, msg)
    }
    /// Code 5, [`Self::IO_FAILURE`].
    pub fn io_failure(msg: impl Into<String>) -> Self {
        Self::new(Self::IO_FAILURE, msg)
    }
    /// Code 6, [`Self::DECODE_FAILURE`].
    pub fn decode_failure(msg: impl Into<String>) -> Self {
        Self::new(Self::DECODE_FAILURE, msg)
    }
    /// Code 7, [`Self::INVALID_NETWORK_CONFIG`].
    pub fn invalid_network_config(msg: impl Into<String>) -> Self {
        Self::new(Self::INVALID_NETWORK_CONFIG, msg)
    }
    /// Code 11, [`Self::TRY_AGAIN_LATER`].
    pub fn try_again_later(msg: impl Into<String>) -> Self {
        Self::new(Self::TRY_AGAIN_LATER, msg)
    }
    /// Code 50, [`Self::PLUGIN_NOT_AVAILABLE`].
    pub fn plugin_not_available(msg: impl Into<String>) -> Self {
        Self::new(Self::PLUGIN_NOT_AVAILABLE, msg)
    }
    /// Code 51, [`Self::LIMITED_CONNECTIVITY`].
    pub fn limited_connectivity(msg: impl Into<String>) -> Self {
        Self::new(Self::LIMITED_CONNECTIVITY, msg)
    }
    /// Code 100, [`Self::DAEMON_REJECTED`].
    pub fn daemon_rejected(msg: impl Into<String>) -> Self {
        Self::new(Self::DAEMON_REJECTED, msg)
    }
    /// Code 101, [`Self::ADDRESS_EXHAUSTED`].
    pub fn address_exhausted(msg: impl Into<String>) -> Self {
        Self::new(Self::ADDRESS_EXHAUSTED, msg)
    }
    /// Code 102, [`Self::DATAPATH_FAILURE`].
    pub fn datapath_failure(msg: impl Into<String>) -> Self {
        Self::new(Self::DATAPATH_FAILURE, msg)
    }
    /// Code 103, [`Self::CHECK_MISMATCH`].
    pub fn check_mismatch(msg: impl Into<String>) -> Self {
        Self::new(Self::CHECK_MISMATCH, msg)
    }
    /// Code 104, [`Self::INTERFACE_EXISTS`].
    pub fn interface_exists(msg: impl Into<String>) -> Self {
        Self::new(Self::INTERFACE_EXISTS, msg)
    }
    /// Code 106, [`Self::NODE_CONFIG_MISMATCH`].
    pub fn node_config_mismatch(msg: impl Into<String>) -> Self {
        Self::new(Self::NODE_CONFIG_MISMATCH, msg)
    }
    /// Code 107, [`Self::REQUESTED_ADDRESS_REFUSED`].
    pub fn requested_address_refused(msg: impl Into<String>) -> Self {
        Self::new(Self::REQUESTED_ADDRESS_REFUSED, msg)
    }

    /// Renders the error object as compact JSON, keys in the order
    /// `cniVersion`, `code`, `msg`, `details`.
    ///
    /// `details` is omitted when empty. `cniVersion` is omitted when
    /// `cni_version` is empty (as Go's `types.Error` does), which is what a
    /// plugin should pass when the failure happened before the config's
    /// version was known.
    pub fn to_json(&self, cni_version: &str) -> String {
        #[derive(Serialize)]
        struct Wire<'a> {
            #[serde(rename = "cniVersion", skip_serializing_if = "str::is_empty")]
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            details: &'a str,
        }
        let wire = Wire {
            cni_version,
            code: self.code,
            msg: &self.msg,
            details: &self.details,
        };
        // Serializing plain strings and an integer cannot fail.
        serde_json::to_string(&wire)
            .unwrap_or_else(|_| format!(r#"{{"code":{},"msg":"internal error"}}"#, self.code))
    }
}

impl fmt::Display for CniError {
    /// `msg` alone, or `msg: details` when details are present.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.details.is_empty() {
            f.write_str(&self.msg)
        } else {
            write!(f, "{}: {}", self.msg, self.details)
        }
    }
}

impl std::error::Error for CniError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_set_codes() {
        let cases: &[(CniError, u32)] = &[
            (CniError::incompatible_version("x"), 1),
            (CniError::unsupported_field("x"), 2),
            (CniError::unknown_container("x"), 3),
            (CniError::invalid_env("x"), 4),
            (CniError::io_failure("x"), 5),
            (CniError::decode_failure("x"), 6),
            (CniError::invalid_network_config("x"), 7),
            (CniError::try_again_later("x"), 11),
            (CniError::plugin_not_available("x"), 50),
            (CniError::limited_connectivity("x"), 51),
            (CniError::daemon_rejected("x"), 100),
            (CniError::address_exhausted("x"), 101),
            (CniError::datapath_failure("x"), 102),
            (CniError::check_mismatch("x"), 103),
            (CniError::interface_exists("x"), 104),
        ];
        for (err, code) in cases {
            assert_eq!(err.code, *code);
            assert_eq!(err.msg, "x");
            assert!(err.details.is_empty());
        }
    }

    #[test]
    fn json_with_details() {
        let e = CniError::try_again_later("daemon down").with_details("connect: refused \"x\"");
        assert_eq!(
            e.to_json("1.1.0"),
            r#"{"cniVersion":"1.1.0","code":11,"msg":"daemon down","details":"connect: refused \"x\""}"#
        );
    }

    #[test]
    fn json_without_details_or_version() {
        let e = CniError::invalid_env("required env variables [CNI_COMMAND] missing");
        assert_eq!(
            e.to_json("1.0.0"),
            r#"{"cniVersion":"1.0.0","code":4,"msg":"required env variables [CNI_COMMAND] missing"}"#
        );
        assert_eq!(
            e.to_json(""),
            r#"{"code":4,"msg":"required env variables [CNI_COMMAND] missing"}"#
        );
    }

    #[test]
    fn display_and_error_trait() {
        let e = CniError::io_failure("read stdin");
        assert_eq!(e.to_string(), "read stdin");
        let e = e.with_details("broken pipe");
        assert_eq!(e.to_string(), "read stdin: broken pipe");
        let boxed: Box<dyn std::error::Error> = Box::new(e);
        assert_eq!(boxed.to_string(), "read stdin: broken pipe");
    }
}
