//! The CNI network config the daemon writes once it can serve
//! (`--write-cni-conf-when-ready DIR`): `05-podnet.conflist`, mode 0600, written to
//! a temporary name and renamed, so a runtime never reads half a file and never
//! sees podnet before its daemon answers. With `--cni-exclusive`, other configs in
//! the directory are renamed `*.podnet_bak`, as Cilium does with `*.cilium_bak`.
//! With `--cni-uninstall`, the daemon removes its config when it stops.
//! With `--cni-bin-dir`, the reference `portmap` plugin found there is chained
//! after podnet (hostPorts), and the config offers only the CNI versions both speak.
//! With `--enable-bandwidth-manager`, podnet declares the `bandwidth` capability,
//! so the runtime passes each pod's bandwidth annotations as `runtimeConfig`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The file name podnet writes.
pub const CONF_NAME: &str = "05-podnet.conflist";

/// The CNI versions podnet's plugin speaks, oldest first. `cniVersion` is the
/// first, 1.0.0, the newest a libcni before 1.2 parses (containerd 1.6 refuses a
/// 1.1.0 result: `unsupported CNI result version "1.1.0"`); newer runtimes read
/// `cniVersions` and use the newest listed.
const PODNET_VERSIONS: [&str; 2] = ["1.0.0", "1.1.0"];

/// The reference plugin chained after podnet for hostPorts, when the node has it.
const PORTMAP: &str = "portmap";

/// A plugin found in the CNI bin dir that the config chains after podnet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainedPlugin {
    pub name: &'static str,
    /// What its `VERSION` command answered.
    pub supported_versions: Vec<String>,
}

/// The conflist for a daemon on `socket`, with the plugin logging to `log_file`,
/// and `chained` after podnet; podnet declares the `bandwidth` capability when
/// `bandwidth`. `cniVersions` lists the versions every plugin of the list speaks
/// (a runtime picks one for the whole list).
pub fn conflist(
    socket: &Path,
    log_file: &Path,
    chained: &[ChainedPlugin],
    bandwidth: bool,
) -> serde_json::Value {
    let versions: Vec<&str> = PODNET_VERSIONS
        .into_iter()
        .filter(|v| {
            chained
                .iter()
                .all(|c| c.supported_versions.iter().any(|s| s == v))
        })
        .collect();
    let mut podnet = serde_json::json!({
        "type": "podnet",
        "socket-path": socket,
        "log-file": log_file,
    });
    if bandwidth {
        podnet["capabilities"] = serde_json::json!({"bandwidth": true});
    }
    let mut plugins = vec![podnet];
    plugins.extend(
        chained
            .iter()
            .map(|c| serde_json::json!({"type": c.name, "capabilities": {"portMappings": true}})),
    );
    serde_json::json!({
        "cniVersion": PODNET_VERSIONS[0],
        "cniVersions": versions,
        "name": "podnet",
        "plugins": plugins,
    })
}

/// The plugins to chain from `bin_dir` (the host's CNI bin dir as the daemon sees
/// it): `portmap` when it is there and speaks CNI 1.0.0 (asked with its `VERSION`
/// command). Anything else is logged and leaves it out: the node then has no
/// hostPorts, which is what it had before.
pub fn chained_plugins(bin_dir: &Path) -> Vec<ChainedPlugin> {
    let path = bin_dir.join(PORTMAP);
    if !path.exists() {
        tracing::info!(dir = %bin_dir.display(), "no portmap plugin in the CNI bin dir: hostPorts are not served");
        return Vec::new();
    }
    match plugin_versions(&path, Duration::from_secs(5)) {
        Ok(versions) if versions.iter().any(|v| v == PODNET_VERSIONS[0]) => {
            tracing::info!(plugin = %path.display(), ?versions, "chaining portmap after podnet (hostPorts)");
            vec![ChainedPlugin {
                name: PORTMAP,
                supported_versions: versions,
            }]
        }
        Ok(versions) => {
            tracing::warn!(plugin = %path.display(), ?versions, "portmap does not speak CNI {}: not chained, hostPorts are not served; install portmap v1.0 or newer", PODNET_VERSIONS[0]);
            Vec::new()
        }
        Err(e) => {
            tracing::warn!(plugin = %path.display(), error = %e, "cannot ask portmap its CNI versions: not chained, hostPorts are not served");
            Vec::new()
        }
    }
}

/// Why a plugin's `VERSION` command gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot run it: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("it did not answer within {0:?}")]
    Timeout(Duration),
    #[error("it exited with {status}: {stderr}")]
    Failed {
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("its answer is not a CNI version result: {0}")]
    Answer(#[source] serde_json::Error),
}

/// Runs `plugin` with `CNI_COMMAND=VERSION` and returns its `supportedVersions`.
fn plugin_versions(plugin: &Path, limit: Duration) -> Result<Vec<String>, ProbeError> {
    let mut child = Command::new(plugin)
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(ProbeError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        // A plugin that exits without reading its stdin is judged by its answer.
        let _ = stdin.write_all(br#"{"cniVersion":"1.0.0"}"#);
    }
    let started = Instant::now();
    while child.try_wait().map_err(ProbeError::Spawn)?.is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ProbeError::Timeout(limit));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().map_err(ProbeError::Spawn)?;
    if !out.status.success() {
        return Err(ProbeError::Failed {
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    #[derive(serde::Deserialize)]
    struct VersionResult {
        #[serde(rename = "supportedVersions")]
        supported_versions: Vec<String>,
    }
    let answer: VersionResult = serde_json::from_slice(&out.stdout).map_err(ProbeError::Answer)?;
    Ok(answer.supported_versions)
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

/// Writes the conflist, with `chained` after podnet (and the `bandwidth`
/// capability when `bandwidth`), into `dir`; with `exclusive`, moves other
/// configs aside.
pub fn write(
    dir: &Path,
    socket: &Path,
    log_file: &Path,
    exclusive: bool,
    chained: &[ChainedPlugin],
    bandwidth: bool,
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
    let body = serde_json::to_vec_pretty(&conflist(socket, log_file, chained, bandwidth))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::{TestDir, shell_script as plugin};

    fn portmap(versions: &[&str]) -> ChainedPlugin {
        ChainedPlugin {
            name: PORTMAP,
            supported_versions: versions.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn alone_podnet_offers_both_versions() {
        let c = conflist(
            Path::new("/run/p.sock"),
            Path::new("/run/p.log"),
            &[],
            false,
        );
        assert_eq!(c["cniVersion"], "1.0.0");
        assert_eq!(c["plugins"][0].get("capabilities"), None);
        assert_eq!(c["cniVersions"], serde_json::json!(["1.0.0", "1.1.0"]));
        assert_eq!(c["plugins"].as_array().unwrap().len(), 1);
        assert_eq!(c["plugins"][0]["type"], "podnet");
        assert_eq!(c["plugins"][0]["socket-path"], "/run/p.sock");
    }

    #[test]
    fn a_chained_portmap_limits_the_versions_to_those_both_speak() {
        let old = conflist(
            Path::new("/s"),
            Path::new("/l"),
            &[portmap(&["0.4.0", "1.0.0"])],
            false,
        );
        assert_eq!(old["cniVersions"], serde_json::json!(["1.0.0"]));
        assert_eq!(
            old["plugins"][1],
            serde_json::json!({"type": "portmap", "capabilities": {"portMappings": true}})
        );
        let new = conflist(
            Path::new("/s"),
            Path::new("/l"),
            &[portmap(&["1.0.0", "1.1.0"])],
            false,
        );
        assert_eq!(new["cniVersions"], serde_json::json!(["1.0.0", "1.1.0"]));
    }

    #[test]
    fn the_bandwidth_manager_declares_the_bandwidth_capability() {
        let c = conflist(
            Path::new("/s"),
            Path::new("/l"),
            &[portmap(&["1.0.0"])],
            true,
        );
        assert_eq!(
            c["plugins"][0]["capabilities"],
            serde_json::json!({"bandwidth": true})
        );
        assert_eq!(
            c["plugins"][1]["capabilities"],
            serde_json::json!({"portMappings": true})
        );
    }

    #[test]
    fn portmap_is_chained_only_when_present_and_speaking_1_0_0() {
        let d = TestDir::new("cniconf-chain");
        assert!(chained_plugins(&d).is_empty(), "no portmap in the dir");
        plugin(
            &d,
            "portmap",
            r#"cat >/dev/null; echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}'"#,
        );
        assert_eq!(chained_plugins(&d), vec![portmap(&["0.4.0", "1.0.0"])]);
        plugin(
            &d,
            "portmap",
            r#"echo '{"cniVersion":"0.4.0","supportedVersions":["0.3.1","0.4.0"]}'"#,
        );
        assert!(
            chained_plugins(&d).is_empty(),
            "a portmap older than CNI 1.0.0"
        );
        plugin(&d, "portmap", "echo broken >&2; exit 3");
        assert!(chained_plugins(&d).is_empty(), "a portmap that fails");
    }

    #[test]
    fn a_probe_says_why_it_got_no_answer() {
        let d = TestDir::new("cniconf-probe");
        let failing = plugin(&d, "failing", "echo 'no such command' >&2; exit 3");
        let e = plugin_versions(&failing, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, ProbeError::Failed { .. }), "{e}");
        assert!(e.to_string().contains("no such command"), "{e}");
        let garbled = plugin(&d, "garbled", "echo not-json");
        let e = plugin_versions(&garbled, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, ProbeError::Answer(_)), "{e}");
        let hanging = plugin(&d, "hanging", "exec sleep 30");
        let e = plugin_versions(&hanging, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, ProbeError::Timeout(_)), "{e}");
        let e = plugin_versions(&d.join("absent"), Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, ProbeError::Spawn(_)), "{e}");
    }
}
