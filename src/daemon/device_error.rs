//! The error of a kernel operation on the daemon's own devices ([`super::devices`]):
//! what was being done, and what the datapath said. Its own module so that the
//! state can name it (the host link check it is given fails with it) without
//! importing the devices, which read the kernel into the state's views.

use crate::datapath::DatapathError;

/// A kernel operation on the daemon's devices that failed: what was being done,
/// and what the datapath said.
#[derive(Debug, thiserror::Error)]
#[error("{action}: {source}")]
pub struct DeviceError {
    action: String,
    #[source]
    source: DatapathError,
}

/// Wraps a datapath error with what was being done.
pub(crate) fn failed(action: impl Into<String>) -> impl FnOnce(DatapathError) -> DeviceError {
    let action = action.into();
    move |source| DeviceError { action, source }
}
