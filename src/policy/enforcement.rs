//! Which local pods are isolated: the one setting both the compiler
//! ([`super::compile()`]) and its explanations ([`super::explain`]) read.

/// Which local pods are isolated (Cilium's `enable-policy`, but `never`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Enforcement {
    /// Those some policy selects, per direction (Kubernetes' semantics).
    #[default]
    Default,
    /// Every one, in both directions.
    Always,
}
