//! What is wrong with a NetworkPolicy or a ClusterNetworkPolicy, as a value:
//! the policy, the field and why.
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
    #[error("no pod has a container port named {0:?}")]
    UnknownNamedPort(String),
    #[error("unknown policy type {0:?} (Ingress, Egress)")]
    UnknownPolicyType(String),
    #[error("unknown tier {0:?} (Admin, Baseline): the policy applies nothing")]
    UnknownTier(String),
    #[error("priority {0} is outside 0-1000: the policy applies nothing")]
    PriorityOutOfRange(i64),
    #[error("unknown action {0:?} (Accept, Deny, Pass): the rule denies all")]
    UnknownAction(String),
    #[error("sets {0}, not exactly one of {1}")]
    NotExactlyOne(String, &'static str),
    #[error("range start {start} is not below end {end}")]
    RangeStartNotBelowEnd { start: i64, end: i64 },
    #[error("does not decode: {0}")]
    Undecodable(String),
    #[error("{0} is not enforced by podnet")]
    NotSupported(&'static str),
}

/// The kind of the policy a problem is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    NetworkPolicy,
    ClusterNetworkPolicy,
}

/// One problem of one policy.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Problem {
    pub kind: Kind,
    /// Empty for a ClusterNetworkPolicy (cluster-scoped).
    pub namespace: String,
    pub name: String,
    /// The field's path, e.g. `spec.ingress[0].from[1].ipBlock.cidr`.
    pub field: String,
    pub why: Why,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (field, why) = (&self.field, &self.why);
        match self.kind {
            Kind::NetworkPolicy => write!(f, "NetworkPolicy {}/{}", self.namespace, self.name)?,
            Kind::ClusterNetworkPolicy => write!(f, "ClusterNetworkPolicy {}", self.name)?,
        }
        write!(f, ", {field}: {why}")
    }
}

impl std::error::Error for Problem {}
