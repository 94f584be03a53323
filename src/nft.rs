//! Running the `nft` tool for podnet's own nftables tables (masquerade, source
//! check): a script through `nft -f -`, which the kernel applies as one
//! transaction (all of it or nothing), and a table's listing as JSON. The tool is
//! used rather than nf_tables netlink: the rule sets are a few lines, and `nft
//! list table ...` shows exactly what was written.

use std::io::Write;
use std::process::{Command, Stdio};

/// What can go wrong running `nft`.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("the nft tool is not installed (apt-get install nftables, dnf install nftables)")]
    NotInstalled,
    #[error("cannot run nft: {0}")]
    Run(#[source] std::io::Error),
    #[error("nft refused the rules: {0}")]
    Refused(String),
    #[error("nft listed {what} in a form podnet does not read: {detail}")]
    Listing { what: String, detail: String },
}

impl NftError {
    fn spawn(e: std::io::Error) -> NftError {
        match e.kind() {
            std::io::ErrorKind::NotFound => NftError::NotInstalled,
            _ => NftError::Run(e),
        }
    }
}

/// Runs `nft -f -` with `script`.
pub fn apply(script: &str) -> Result<(), NftError> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(NftError::spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes()).map_err(NftError::Run)?;
    }
    let out = child.wait_with_output().map_err(NftError::Run)?;
    match out.status.success() {
        true => Ok(()),
        false => Err(NftError::Refused(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        )),
    }
}

/// The JSON listing of table `family name` (`nft -j list table`), None when the
/// table does not exist.
pub fn list_table(family: &str, name: &str) -> Result<Option<serde_json::Value>, NftError> {
    list(&["table", family, name])
}

/// The JSON listing of `nft -j list <what...>` (`chains inet`, `map inet t m`),
/// None when what it names does not exist.
pub fn list(what: &[&str]) -> Result<Option<serde_json::Value>, NftError> {
    let out = Command::new("nft")
        .args(["-j", "list"])
        .args(what)
        .stdin(Stdio::null())
        .output()
        .map_err(NftError::spawn)?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("No such file or directory") {
            return Ok(None);
        }
        return Err(NftError::Refused(stderr.trim().to_string()));
    }
    serde_json::from_slice(&out.stdout)
        .map(Some)
        .map_err(|e| NftError::Listing {
            what: what.join(" "),
            detail: e.to_string(),
        })
}

/// Fails when `nft` cannot be run (checked at start, so a missing tool stops the
/// daemon instead of leaving a feature silently off).
pub fn check_installed() -> Result<(), NftError> {
    let out = Command::new("nft")
        .arg("--version")
        .output()
        .map_err(NftError::spawn)?;
    match out.status.success() {
        true => Ok(()),
        false => Err(NftError::Refused(format!(
            "nft --version failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// The objects of a JSON listing (`{"nftables": [ {...}, ... ]}`), each as its
/// kind (`table`, `rule`, `set`, `counter`, ...) and body.
pub fn objects(listing: &serde_json::Value) -> impl Iterator<Item = (&str, &serde_json::Value)> {
    listing["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o.as_object())
        .flat_map(|o| o.iter().map(|(k, v)| (k.as_str(), v)))
}
