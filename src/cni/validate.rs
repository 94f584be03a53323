//! Syntax checks shared by the environment, `CNI_ARGS` and config parsers (and by
//! the daemon's API boundary, `api::validate`): container ID, network name and
//! interface name with Go `skel`/libcni rules, and the Kubernetes names of
//! `CNI_ARGS`, each with a length bound.

use super::error::CniError;

/// libcni's rule for container IDs and network names.
pub const ID_RULE: &str = "^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$";
/// Longest container ID or network name accepted (libcni sets none; runtimes use
/// 64 hex characters).
pub const MAX_ID_BYTES: usize = 1024;
/// `K8S_POD_NAME`: a DNS subdomain.
pub const MAX_POD_NAME_BYTES: usize = 253;
/// `K8S_POD_NAMESPACE`: a DNS label.
pub const MAX_POD_NAMESPACE_BYTES: usize = 63;
/// `K8S_POD_UID`: a UUID in practice.
pub const MAX_POD_UID_BYTES: usize = 128;

/// Whether `s` matches `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` (container IDs and
/// network names) and is at most [`MAX_ID_BYTES`] long.
pub fn is_valid_id(s: &str) -> bool {
    let mut bytes = s.bytes();
    match bytes.next() {
        Some(b) if b.is_ascii_alphanumeric() => {}
        _ => return false,
    }
    s.len() <= MAX_ID_BYTES
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// What the ID rule says, for error messages.
pub fn id_rule_text() -> String {
    format!("it must match {ID_RULE} and be at most {MAX_ID_BYTES} bytes")
}

/// A value for an error message: quoted and escaped, cut after 64 characters.
pub fn excerpt(s: &str) -> String {
    const SHOWN: usize = 64;
    match s.char_indices().nth(SHOWN) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &s[..cut], s.len()),
    }
}

/// Why `name` is not a valid interface name (Linux rules, as Go's
/// `ValidateInterfaceName`: non-empty, at most 15 bytes, not `.` or `..`, no `/`,
/// `:` or whitespace), or `None` when it is one.
pub fn ifname_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("interface name is empty")
    } else if name.len() > 15 {
        Some("interface name is longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("interface name is . or ..")
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        Some("interface name contains / or : or whitespace")
    } else {
        None
    }
}

/// Why `value` is not a Kubernetes object name of at most `max` bytes (letters,
/// digits, `-`, `.` and `_`, starting and ending with a letter or digit), or
/// `None` when it is one. Lenient about case and `_`, which real names lack.
pub fn k8s_name_problem(value: &str, max: usize) -> Option<String> {
    if value.len() > max {
        return Some(format!(
            "it is {} bytes long; at most {max} are allowed",
            value.len()
        ));
    }
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !value.chars().all(ok_char) || !edge(value.chars().next()) || !edge(value.chars().last()) {
        return Some(format!(
            "it must be a Kubernetes name: letters, digits, '-', '.' or '_', starting and ending with a letter or digit, at most {max} bytes"
        ));
    }
    None
}

/// Why `value` is not printable text of at most `max` bytes (no control
/// characters, so it cannot break a log line), or `None` when it is.
pub fn printable_problem(value: &str, max: usize) -> Option<String> {
    if value.len() > max {
        Some(format!(
            "it is {} bytes long; at most {max} are allowed",
            value.len()
        ))
    } else if value.chars().any(char::is_control) {
        Some(format!(
            "it must be printable text of at most {max} bytes (no control characters such as newline or NUL)"
        ))
    } else {
        None
    }
}

/// Validates `CNI_CONTAINERID`. Empty → code 3 (libcni's "missing
/// containerID"); bad characters or too long → code 4 naming the rule.
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    if id.is_empty() {
        return Err(CniError::unknown_container("missing containerID"));
    }
    if id.len() > MAX_ID_BYTES {
        return Err(CniError::invalid_env(format!(
            "CNI_CONTAINERID {} is longer than {MAX_ID_BYTES} bytes",
            excerpt(id)
        ))
        .with_details(id_rule_text()));
    }
    if !is_valid_id(id) {
        return Err(CniError::invalid_env(format!(
            "CNI_CONTAINERID {} has invalid characters",
            excerpt(id)
        ))
        .with_details(id_rule_text()));
    }
    Ok(())
}

/// Validates `CNI_IFNAME` (see [`ifname_problem`]). Any violation → code 4
/// saying which rule.
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    match ifname_problem(name) {
        Some(why) => Err(CniError::invalid_env(format!(
            "CNI_IFNAME {} is invalid: {why}",
            excerpt(name)
        ))),
        None => Ok(()),
    }
}

/// Validates the config's `name`: missing/empty, bad characters or too long → code 7.
pub fn validate_network_name(name: &str) -> Result<(), CniError> {
    if name.is_empty() {
        return Err(CniError::invalid_network_config("missing network name"));
    }
    if !is_valid_id(name) {
        return Err(CniError::invalid_network_config(format!(
            "invalid characters found in network name {}",
            excerpt(name)
        ))
        .with_details(id_rule_text()));
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
        let long = "a".repeat(MAX_ID_BYTES + 1);
        assert!(is_valid_id(&long[1..]));
        assert!(!is_valid_id(&long));
        let e = validate_container_id(&long).unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.contains("longer than 1024 bytes"), "{}", e.msg);
        assert!(
            e.msg.len() < 200,
            "the message quotes an excerpt: {}",
            e.msg
        );
        assert!(e.details.contains(ID_RULE), "{}", e.details);
        assert_eq!(validate_network_name(&long).unwrap_err().code, 7);
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

    #[test]
    fn kubernetes_names() {
        for ok in [
            "a",
            "web-0",
            "kube-system",
            "a.b.c",
            "Web_0",
            &"a".repeat(253),
        ] {
            assert_eq!(k8s_name_problem(ok, MAX_POD_NAME_BYTES), None, "{ok}");
        }
        for bad in ["-a", "a-", ".a", "a b", "a/b", "a\nb", "a\0b", "é", ""] {
            let why = k8s_name_problem(bad, MAX_POD_NAME_BYTES).expect(bad);
            assert!(why.contains("Kubernetes name"), "{bad:?}: {why}");
        }
        let why = k8s_name_problem(&"a".repeat(64), MAX_POD_NAMESPACE_BYTES).expect("long");
        assert_eq!(why, "it is 64 bytes long; at most 63 are allowed");
    }

    #[test]
    fn printable_text() {
        for ok in ["", "default/web-0", "ns/pod name with spaces", "é✓"] {
            assert_eq!(printable_problem(ok, 512), None, "{ok}");
        }
        for bad in [
            "a\nb",
            "a\0b",
            "a\rb",
            "\u{1b}[31m",
            "a\u{7f}",
            "a\u{85}b",
            "\t",
        ] {
            let why = printable_problem(bad, 512).expect(bad);
            assert!(why.contains("control characters"), "{bad:?}: {why}");
        }
        assert!(
            printable_problem(&"x".repeat(513), 512).is_some_and(|w| w.contains("513 bytes long"))
        );
    }

    #[test]
    fn excerpts_are_quoted_and_short() {
        assert_eq!(excerpt("a\nb"), "\"a\\nb\"");
        let long = excerpt(&"é".repeat(100));
        assert!(long.ends_with("... (200 bytes)"), "{long}");
        assert_eq!(long.matches('é').count(), 64);
    }
}
