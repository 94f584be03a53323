//! What `podnet lint` reports: one finding a line, an `error` or a `warning`.
//! Every check of lint (its own, and [`super::cidr_groups`]) makes them here.

/// A finding: `error` breaks the install, `warning` deserves a look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub severity: &'static str,
    pub text: String,
}

pub(crate) fn error(text: impl Into<String>) -> Finding {
    Finding {
        severity: "error",
        text: text.into(),
    }
}

pub(crate) fn warning(text: impl Into<String>) -> Finding {
    Finding {
        severity: "warning",
        text: text.into(),
    }
}
