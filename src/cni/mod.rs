//! The CNI protocol (spec 1.1.0, with 1.0.0 and 0.4.0 rendering): verbs,
//! `CNI_*` environment, `CNI_ARGS`, the stdin request config, results, errors
//! and version negotiation; the `bandwidth` capability's `runtimeConfig`.
//!
//! Pure: nothing here reads the process environment, stdin or files. The
//! caller passes an env lookup closure and the stdin bytes, and prints what it
//! gets back (results and error JSON go to stdout, exit status 1 on error).

mod args;
pub mod bandwidth;
mod command;
mod config;
mod env;
mod error;
mod result;
pub mod validate;
mod version;

pub use args::CniArgs;
pub use command::Command;
pub use config::{Attachment, LEGACY_ATTACHMENTS_KEY, NetConf, VALID_ATTACHMENTS_KEY};
pub use env::CniEnv;
pub use error::CniError;
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
pub use validate::{is_valid_id, validate_container_id, validate_ifname, validate_network_name};
pub use version::{
    LATEST_VERSION, SUPPORTED_VERSIONS, is_supported, version_at_least, version_reply,
};
