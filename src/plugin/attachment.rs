//! The attachment a verb works on: its container ID, interface name and netns
//! path from the environment, and its netns opened (ADD and CHECK).

use std::path::Path;

use crate::cni::{CniEnv, CniError};
use crate::datapath::NetNs;

/// The attachment's container ID, interface name and netns path (ADD and CHECK
/// require all three; the env parser has checked they are present).
pub fn ids(env: &CniEnv) -> Result<(&str, &str, &Path), CniError> {
    match (&env.container_id, &env.ifname, &env.netns) {
        (Some(c), Some(i), Some(n)) => Ok((c, i, n)),
        _ => Err(CniError::invalid_env(
            "CNI_CONTAINERID, CNI_IFNAME and CNI_NETNS are required",
        )),
    }
}

/// Opens the pod's netns; a missing one is code 3 (nothing was allocated yet).
pub fn open_netns(path: &Path) -> Result<NetNs, CniError> {
    NetNs::open(path).map_err(|e| {
        if e.is_not_found() {
            CniError::unknown_container(format!(
                "network namespace {} does not exist: the container is gone (nothing was allocated)",
                path.display()
            ))
        } else if e.errno() == Some(libc::EINVAL) {
            CniError::invalid_env(format!("CNI_NETNS={} is not a network namespace: {e}", path.display()))
        } else {
            CniError::io_failure(format!("opening network namespace {}: {e}", path.display()))
        }
    })
}
