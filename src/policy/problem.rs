//! What is wrong with a NetworkPolicy, as a value: the policy, the field and why.
//! A problem never stops enforcement: the part it names allows nothing, the rest
//! of the policy (and every other policy) applies. The agent logs each problem
//! once and counts it.

/// Why a field of a policy allows nothing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, thiserror::Error)]
pub enum Why {
    #[error("{value:?} is not a CIDR: {reason}")]
    InvalidCidr { value: String, reason: String },
    #[error("unknown selector operator {0:?} (In, NotIn, Exists, DoesNotExist)")]
    UnknownOperator(String),
    #[error("operator {0} needs at least one value")]
    NoValues(String),
    #[error("operator {0} takes no values")]
    ValuesNotAllowed(String),
    #[error("unknown protocol {0:?} (TCP, UDP, SCTP)")]
    UnknownProtocol(String),
    #[error("port {0} is outside 1-65535")]
    PortOutOfRange(i64),
    #[error("endPort {end} is below port {port}")]
    EndPortBelowPort { port: u16, end: i64 },
    #[error("endPort needs a numbered port, not {0:?}")]
    EndPortWithoutNumber(String),
    #[error("no pod has a {protocol} port named {name:?}")]
    UnknownPortName { name: String, protocol: String },
    #[error("unknown policy type {0:?} (Ingress, Egress)")]
    UnknownPolicyType(String),
}

/// One problem of one policy.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, thiserror::Error)]
#[error("NetworkPolicy {namespace}/{name}, {field}: {why}")]
pub struct Problem {
    pub namespace: String,
    pub name: String,
    /// The field's path, e.g. `spec.ingress[0].from[1].ipBlock.cidr`.
    pub field: String,
    pub why: Why,
}
