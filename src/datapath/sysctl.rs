//! Sysctls under `/proc/sys`. `/proc/sys/net/...` resolves against the CALLING
//! THREAD's netns: to set a pod's sysctl, call these from inside
//! [`in_netns`](super::netns::in_netns).

use std::fs;
use std::path::{Path, PathBuf};

use super::error::{DatapathError, Result};

/// Resolve `key` (`net/ipv4/conf/eth0/rp_filter`, optionally with a leading
/// `/proc/sys/`) to a path, refusing anything that could escape `/proc/sys`.
/// Slashes are required: dots are legal in interface names (`eth0.100`).
fn sysctl_path(key: &str) -> Result<PathBuf> {
    sysctl_path_in(Path::new("/proc"), key)
}

/// [`sysctl_path`] under the proc filesystem mounted at `procfs`.
fn sysctl_path_in(procfs: &Path, key: &str) -> Result<PathBuf> {
    let rel = key.strip_prefix("/proc/sys/").unwrap_or(key);
    let rel = rel.trim_start_matches('/');
    if rel.is_empty()
        || rel
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(DatapathError::Invalid(format!(
            "invalid sysctl path {key:?}"
        )));
    }
    Ok(procfs.join("sys").join(rel))
}

/// Read a sysctl (trailing newline removed).
pub fn read_sysctl(key: &str) -> Result<String> {
    let path = sysctl_path(key)?;
    let value = fs::read_to_string(&path)
        .map_err(|e| DatapathError::io(format!("reading sysctl {}", path.display()), e))?;
    Ok(value.trim_end_matches('\n').to_string())
}

/// Write a sysctl unless it already has `value` (compared with whitespace
/// normalised, so `"1024 4999"` matches `"1024\t4999"`). Returns whether it wrote.
pub fn write_sysctl(key: &str, value: &str) -> Result<bool> {
    write_sysctl_in(Path::new("/proc"), key, value)
}

/// [`write_sysctl`] under the proc filesystem mounted at `procfs` (a container's
/// own /proc/sys is read-only: the host's /proc/sys/net mounted elsewhere). The
/// entries under `sys/net` still resolve against the calling thread's netns.
pub fn write_sysctl_in(procfs: &Path, key: &str, value: &str) -> Result<bool> {
    let path = sysctl_path_in(procfs, key)?;
    let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Ok(current) = fs::read_to_string(&path)
        && norm(&current) == norm(value)
    {
        return Ok(false);
    }
    write_path(&path, value)?;
    Ok(true)
}

/// Write a sysctl without reading it first (one open and write): for a setting
/// of a link created a moment ago, where reading costs as much as writing.
pub fn set_sysctl(key: &str, value: &str) -> Result<()> {
    write_path(&sysctl_path(key)?, value)
}

fn write_path(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value.as_bytes()).map_err(|e| {
        DatapathError::io(format!("writing {value:?} to sysctl {}", path.display()), e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sysctl_resolves_under_the_given_procfs_and_never_outside_it() {
        let host = Path::new("/host/proc");
        let want = PathBuf::from("/host/proc/sys/net/ipv4/ip_forward");
        assert_eq!(sysctl_path_in(host, "net/ipv4/ip_forward").unwrap(), want);
        assert_eq!(
            sysctl_path_in(host, "/proc/sys/net/ipv4/ip_forward").unwrap(),
            want
        );
        assert!(sysctl_path_in(host, "net/../../etc/passwd").is_err());
        assert_eq!(
            sysctl_path("net/ipv6/conf/all/forwarding").unwrap(),
            PathBuf::from("/proc/sys/net/ipv6/conf/all/forwarding")
        );
    }
}
