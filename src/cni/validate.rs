//! Syntax checks shared by the environment and config parsers: container ID,
//! network name and interface name, with Go `skel`/libcni rules.

use super::error::CniError;

/// Whether `s` matches `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` (container IDs and
/// network names).
pub fn is_valid_id(s: &str) -> bool {
    let mut bytes = s.bytes();
    match bytes.next() {
        Some(b) if b.is_ascii_alphanumeric() => {}
        _ => return false,
    }
    bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Validates `CNI_CONTAINERID`. Empty → code 3 (libcni's "missing
/// containerID"); bad characters → code 4 naming the rule.
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    if id.is_empty() {
        return Err(CniError::unknown_container("missing containerID"));
    }
    if !is_valid_id(id) {
        return Err(CniError::invalid_env(format!(
            "CNI_CONTAINERID {id:?} has invalid characters"
        ))
        .with_details("it must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$"));
    }
    Ok(())
}

/// Validates `CNI_IFNAME` (Linux rules, as Go's `ValidateInterfaceName`):
/// non-empty, at most 15 bytes, not `.` or `..`, no `/`, `:` or whitespace.
/// Any violation → code 4 saying which rule.
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    let fail = |why: &str| {
        Err(CniError::invalid_env(format!(
            "CNI_IFNAME {name:?} is invalid: {why}"
        )))
    };
    if name.is_empty() {
        return fail("interface name is empty");
    }
    if name.len() > 15 {
        return fail("interface name is longer than 15 bytes");
    }
    if name == "." || name == ".." {
        return fail("interface name is . or ..");
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return fail("interface name contains / or : or whitespace");
    }
    Ok(())
}

/// Validates the config's `name`: missing/empty or bad characters → code 7.
pub fn validate_network_name(name: &str) -> Result<(), CniError> {
    if name.is_empty() {
        return Err(CniError::invalid_network_config("missing network name"));
    }
    if !is_valid_id(name) {
        return Err(CniError::invalid_network_config(format!(
            "invalid characters found in network name {name:?}"
        ))
        .with_details("it must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        for ok in ["a", "0", "abc-DEF_1.2", "cnitool-0123456789abcdef", "9.-_"] {
            assert!(is_valid_id(ok), "{ok}");
            validate_container_id(ok).unwrap();
            validate_network_name(ok).unwrap();
        }
        for bad in ["-a", "_a", ".a", "a b", "a/b", "a:b", "é", "a\n", " a"] {
            assert!(!is_valid_id(bad), "{bad}");
            assert_eq!(validate_container_id(bad).unwrap_err().code, 4, "{bad}");
            assert_eq!(validate_network_name(bad).unwrap_err().code, 7, "{bad}");
        }
        assert_eq!(validate_container_id("").unwrap_err().code, 3);
        let e = validate_network_name("").unwrap_err();
        assert_eq!((e.code, e.msg.as_str()), (7, "missing network name"));
    }

    #[test]
    fn ifnames() {
        for ok in ["eth0", "a", "123456789012345", "lxc.1-2_x", "é"] {
            validate_ifname(ok).unwrap();
        }
        for (bad, why) in [
            ("", "empty"),
            ("1234567890123456", "longer than 15 bytes"),
            ("ééééééééé", "longer than 15 bytes"), // 18 bytes, 9 chars
            (".", ". or .."),
            ("..", ". or .."),
            ("a/b", "whitespace"),
            ("a:b", "whitespace"),
            ("a b", "whitespace"),
            ("a\tb", "whitespace"),
            ("eth0\n", "whitespace"),
        ] {
            let e = validate_ifname(bad).unwrap_err();
            assert_eq!(e.code, CniError::INVALID_ENV, "{bad:?}");
            assert!(e.msg.contains("CNI_IFNAME"), "{}", e.msg);
            assert!(e.msg.contains(why), "{bad:?}: {}", e.msg);
        }
    }
}
