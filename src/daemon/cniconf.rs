//! The CNI network config the daemon writes once it can serve
//! (`--write-cni-conf-when-ready DIR`): `05-podnet.conflist`, mode 0600, written to
//! a temporary name and renamed, so a runtime never reads half a file and never
//! sees podnet before its daemon answers. With `--cni-exclusive`, other configs in
//! the directory are renamed `*.podnet_bak`, as Cilium does with `*.cilium_bak`.
//! With `--cni-uninstall`, the daemon removes its config when it stops.

use std::path::{Path, PathBuf};

/// The file name podnet writes.
pub const CONF_NAME: &str = "05-podnet.conflist";

/// The conflist for a daemon on `socket`, with the plugin logging to `log_file`.
/// `cniVersion` is 1.0.0, the newest a libcni before 1.2 parses (containerd 1.6
/// refuses a 1.1.0 result: `unsupported CNI result version "1.1.0"`); newer
/// runtimes read `cniVersions` and use 1.1.0.
pub fn conflist(socket: &Path, log_file: &Path) -> serde_json::Value {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "cniVersions": ["1.0.0", "1.1.0"],
        "name": "podnet",
        "plugins": [{
            "type": "podnet",
            "socket-path": socket,
            "log-file": log_file,
        }]
    })
}

/// A CNI config file the daemon could not write or remove: what it was doing,
/// and the file system's error.
#[derive(Debug, thiserror::Error)]
#[error("{action}: {source}")]
pub struct CniConfError {
    action: String,
    #[source]
    source: std::io::Error,
}

/// Wraps a file system error with what was being done.
fn failed(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> CniConfError {
    let action = action.into();
    move |source| CniConfError { action, source }
}

/// Writes the conflist into `dir`; with `exclusive`, moves other configs aside.
pub fn write(
    dir: &Path,
    socket: &Path,
    log_file: &Path,
    exclusive: bool,
) -> Result<PathBuf, CniConfError> {
    std::fs::create_dir_all(dir).map_err(failed(format!("cannot create {}", dir.display())))?;
    if exclusive {
        let entries =
            std::fs::read_dir(dir).map_err(failed(format!("cannot read {}", dir.display())))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let is_conf = [".conf", ".conflist", ".json"]
                .iter()
                .any(|s| name.ends_with(s));
            if is_conf && name != CONF_NAME {
                let aside = dir.join(format!("{name}.podnet_bak"));
                std::fs::rename(entry.path(), &aside)
                    .map_err(failed(format!("cannot move {name} aside")))?;
                tracing::info!(config = %name, "moved another CNI config aside (cni-exclusive)");
            }
        }
    }
    let body = serde_json::to_vec_pretty(&conflist(socket, log_file))
        .map_err(|e| failed("cannot encode the CNI config")(e.into()))?;
    let dest = dir.join(CONF_NAME);
    let tmp = dir.join(format!(".{CONF_NAME}.tmp"));
    crate::atomic_file::replace(&dest, &tmp, &body, 0o600)
        .map_err(failed(format!("cannot write {}", dest.display())))?;
    Ok(dest)
}

/// Removes the config `write` wrote (already gone is fine).
pub fn remove(path: &Path) -> Result<(), CniConfError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(failed(format!("cannot remove {}", path.display()))(e)),
    }
}
