//! Interface naming and MAC helpers: Cilium's host-side veth name rule,
//! interface-name validation and random locally-administered MACs.

use sha2::{Digest, Sha256};

use super::error::{DatapathError, Result};

/// Longest interface name the kernel accepts (IFNAMSIZ 16 minus the NUL).
pub const IFNAME_MAX_LEN: usize = 15;

/// The prefix of every host-side pod link's name.
pub const HOST_LINK_PREFIX: &str = "lxc";

/// The prefix of the IFB device that shapes a pod's egress (its bandwidth limit).
pub const IFB_LINK_PREFIX: &str = "ifb";

/// The alias podnet gives its IFB devices: what GC's sweep requires besides
/// the name.
pub const IFB_ALIAS: &str = "podnet-bandwidth";

/// Host-side interface name of an endpoint, exactly as Cilium derives it:
/// `lxc` + the first 12 hex characters of SHA-256(`<containerID>:<ifname>`).
/// Always 15 characters.
pub fn host_ifname(container_id: &str, ifname: &str) -> String {
    hashed_name(HOST_LINK_PREFIX, container_id, ifname)
}

/// The IFB device that shapes the traffic the pod of (`container_id`,
/// `ifname`) sends: `ifb` + the same 12 hex characters as its host link
/// ([`host_ifname`]), so DEL and GC find it from the attachment alone.
pub fn ifb_ifname(container_id: &str, ifname: &str) -> String {
    hashed_name(IFB_LINK_PREFIX, container_id, ifname)
}

/// The host link (`lxc…`) whose pod an IFB device named `ifb_name` shapes, when
/// the name is one [`ifb_ifname`] makes (`ifb` + 12 lowercase hex characters).
pub fn host_link_of_ifb(ifb_name: &str) -> Option<String> {
    let hash = ifb_name.strip_prefix(IFB_LINK_PREFIX)?;
    let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    (hash.len() == 12 && hash.chars().all(hex)).then(|| format!("{HOST_LINK_PREFIX}{hash}"))
}

/// The IFB device of the pod whose host link is `host_name` (`lxc…` → `ifb…`),
/// when the name is one [`host_ifname`] makes.
pub fn ifb_of_host_link(host_name: &str) -> Option<String> {
    let hash = host_name.strip_prefix(HOST_LINK_PREFIX)?;
    host_link_of_ifb(&format!("{IFB_LINK_PREFIX}{hash}"))
        .map(|_| format!("{IFB_LINK_PREFIX}{hash}"))
}

/// `prefix` + the first 12 hex characters of SHA-256(`<containerID>:<ifname>`).
fn hashed_name(prefix: &str, container_id: &str, ifname: &str) -> String {
    let digest = Sha256::digest(format!("{container_id}:{ifname}").as_bytes());
    let mut name = String::with_capacity(IFNAME_MAX_LEN);
    name.push_str(prefix);
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
