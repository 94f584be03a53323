//! The CNI verbs (`CNI_COMMAND`) and their version requirements.

use super::error::CniError;
use std::fmt;

/// A CNI verb, as given in `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Attach a container to the network.
    Add,
    /// Undo ADD, best effort and idempotent.
    Del,
    /// Verify an attachment against its cached ADD result (spec ≥ 0.4.0).
    Check,
    /// Report readiness to serve ADD (spec ≥ 1.1.0).
    Status,
    /// Release resources of attachments no longer valid (spec ≥ 1.1.0).
    Gc,
    /// Report the supported spec versions.
    Version,
}

impl Command {
    /// Parses a `CNI_COMMAND` value. Matching is case-sensitive (`ADD`, not
    /// `add`), as in Go's `skel`. Unknown → code 4 naming `CNI_COMMAND`.
    pub fn parse(s: &str) -> Result<Command, CniError> {
        match s {
            "ADD" => Ok(Command::Add),
            "DEL" => Ok(Command::Del),
            "CHECK" => Ok(Command::Check),
            "STATUS" => Ok(Command::Status),
            "GC" => Ok(Command::Gc),
            "VERSION" => Ok(Command::Version),
            other => Err(
                CniError::invalid_env(format!("unknown CNI_COMMAND: {other:?}"))
                    .with_details("expected one of ADD, DEL, CHECK, STATUS, GC, VERSION"),
            ),
        }
    }

    /// The `CNI_COMMAND` spelling of the verb.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }

    /// The lowest config `cniVersion` that allows this verb, if any:
    /// CHECK needs 0.4.0, STATUS and GC need 1.1.0.
    pub fn min_version(self) -> Option<&'static str> {
        match self {
            Command::Check => Some("0.4.0"),
            Command::Status | Command::Gc => Some("1.1.0"),
            Command::Add | Command::Del | Command::Version => None,
        }
    }

    /// Whether the verb acts on one attachment (container ID + interface):
    /// true for ADD, DEL and CHECK.
    pub fn is_per_attachment(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Command; 6] = [
        Command::Add,
        Command::Del,
        Command::Check,
        Command::Status,
        Command::Gc,
        Command::Version,
    ];

    #[test]
    fn round_trip() {
        for c in ALL {
            assert_eq!(Command::parse(c.as_str()).unwrap(), c);
            assert_eq!(c.to_string(), c.as_str());
        }
    }

    #[test]
    fn unknown_is_code_4() {
        for s in ["", "add", "Add", "DELETE", " ADD", "ADD "] {
            let e = Command::parse(s).unwrap_err();
            assert_eq!(e.code, CniError::INVALID_ENV);
            assert!(e.msg.contains("CNI_COMMAND"), "{}", e.msg);
        }
    }

    #[test]
    fn requirements() {
        assert_eq!(Command::Check.min_version(), Some("0.4.0"));
        assert_eq!(Command::Status.min_version(), Some("1.1.0"));
        assert_eq!(Command::Gc.min_version(), Some("1.1.0"));
        assert_eq!(Command::Add.min_version(), None);
        assert_eq!(Command::Del.min_version(), None);
        assert_eq!(Command::Version.min_version(), None);
        let per: Vec<_> = ALL.into_iter().filter(|c| c.is_per_attachment()).collect();
        assert_eq!(per, [Command::Add, Command::Del, Command::Check]);
    }
}
