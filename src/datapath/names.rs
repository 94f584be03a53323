//! Interface naming and MAC helpers: Cilium's host-side veth name rule,
//! interface-name validation and random locally-administered MACs.

use sha2::{Digest, Sha256};

use super::error::{DatapathError, Result};

/// Longest interface name the kernel accepts (IFNAMSIZ 16 minus the NUL).
pub const IFNAME_MAX_LEN: usize = 15;

/// The prefix of every host-side pod link's name.
pub const HOST_LINK_PREFIX: &str = "lxc";

/// Host-side interface name of an endpoint, exactly as Cilium derives it:
/// `lxc` + the first 12 hex characters of SHA-256(`<containerID>:<ifname>`).
/// Always 15 characters.
pub fn host_ifname(container_id: &str, ifname: &str) -> String {
    let digest = Sha256::digest(format!("{container_id}:{ifname}").as_bytes());
    let mut name = String::with_capacity(IFNAME_MAX_LEN);
    name.push_str(HOST_LINK_PREFIX);
    for byte in digest.iter().take(6) {
        name.push_str(&format!("{byte:02x}"));
    }
    name
}

/// Check that `name` is a valid Linux interface name (1..=15 bytes, no `/`,
/// `:` or whitespace, not `.`/`..`).
pub fn validate_ifname(name: &str) -> Result<()> {
    let bad = name.is_empty()
        || name.len() > IFNAME_MAX_LEN
        || name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c == '\0');
    if bad {
        return Err(DatapathError::Invalid(format!(
            "invalid interface name {name:?} (1-{IFNAME_MAX_LEN} bytes, no '/', ':' or whitespace)"
        )));
    }
    Ok(())
}

/// A random unicast, locally-administered MAC address (as Cilium sets on both
/// veth ends so systemd's MACAddressPolicy leaves them alone).
pub fn random_mac() -> Result<[u8; 6]> {
    let mut mac = [0u8; 6];
    getrandom::fill(&mut mac).map_err(|e| {
        DatapathError::io(
            "generating random MAC address",
            std::io::Error::other(e.to_string()),
        )
    })?;
    mac[0] = (mac[0] & 0xfe) | 0x02;
    Ok(mac)
}

/// Format a MAC as `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
