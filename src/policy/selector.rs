//! Label selectors as NetworkPolicy uses them (a policy's `podSelector`, a
//! peer's `podSelector` and `namespaceSelector`): `matchLabels` and
//! `matchExpressions` (In, NotIn, Exists, DoesNotExist), all of them ANDed. An
//! empty selector matches everything; an invalid one (the API server rejects
//! them, so only a broken client or an older server sends one) matches nothing.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::problem::Why;

/// Labels of a pod or a namespace.
pub type Labels = BTreeMap<String, String>;

/// A requirement's operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// One requirement: `key op values`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Requirement {
    pub key: String,
    pub op: Op,
    pub values: BTreeSet<String>,
}

impl Requirement {
    fn matches(&self, labels: &Labels) -> bool {
        let value = labels.get(&self.key);
        match self.op {
            Op::In => value.is_some_and(|v| self.values.contains(v)),
            Op::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Op::Exists => value.is_some(),
            Op::DoesNotExist => value.is_none(),
        }
    }
}

/// A parsed selector, in a canonical form: two selectors that say the same
/// (`matchLabels: {a: x}` and `a In (x)`) are equal.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Selector {
    /// Every requirement must hold (none: everything matches).
    All(BTreeSet<Requirement>),
    /// An invalid selector: matches nothing.
    Nothing,
}

/// Why a selector is invalid, and where (relative to the selector).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorError {
    pub field: String,
    pub why: Why,
}

impl Selector {
    /// The empty selector.
    pub fn everything() -> Selector {
        Selector::All(BTreeSet::new())
    }

    /// Parses a Kubernetes selector.
    pub fn parse(selector: &LabelSelector) -> Result<Selector, SelectorError> {
        let mut requirements = BTreeSet::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            requirements.insert(Requirement {
                key: key.clone(),
                op: Op::In,
                values: BTreeSet::from([value.clone()]),
            });
        }
        for (i, e) in selector.match_expressions.iter().flatten().enumerate() {
            let field = |f: &str| format!("matchExpressions[{i}].{f}");
            let values: BTreeSet<String> = e.values.iter().flatten().cloned().collect();
            let op = match e.operator.as_str() {
                "In" => Op::In,
                "NotIn" => Op::NotIn,
                "Exists" => Op::Exists,
                "DoesNotExist" => Op::DoesNotExist,
                other => {
                    return Err(SelectorError {
                        field: field("operator"),
                        why: Why::UnknownOperator(other.to_string()),
                    });
                }
            };
            let needs_values = matches!(op, Op::In | Op::NotIn);
            if needs_values == values.is_empty() {
                let why = match needs_values {
                    true => Why::NoValues(e.operator.clone()),
                    false => Why::ValuesNotAllowed(e.operator.clone()),
                };
                return Err(SelectorError {
                    field: field("values"),
                    why,
                });
            }
            requirements.insert(Requirement {
                key: e.key.clone(),
                op,
                values,
            });
        }
        Ok(Selector::All(requirements))
    }

    /// Parses `selector`, absent meaning empty; an invalid one becomes
    /// [`Selector::Nothing`] and its error is passed to `report`.
    pub fn parse_or_nothing(
        selector: Option<&LabelSelector>,
        report: impl FnOnce(SelectorError),
    ) -> Selector {
        match selector.map(Selector::parse) {
            None => Selector::everything(),
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                report(e);
                Selector::Nothing
            }
        }
    }

    /// True when `labels` satisfy the selector.
    pub fn matches(&self, labels: &Labels) -> bool {
        match self {
            Selector::All(rs) => rs.iter().all(|r| r.matches(labels)),
            Selector::Nothing => false,
        }
    }

    /// True for the empty selector.
    pub fn is_everything(&self) -> bool {
        matches!(self, Selector::All(rs) if rs.is_empty())
    }

    /// The canonical text, as `kubectl` writes selectors (`a=x,b in (y,z),!c`);
    /// the empty selector is `{}`, an invalid one `<nothing>`.
    pub fn text(&self) -> String {
        let rs = match self {
            Selector::Nothing => return "<nothing>".into(),
            Selector::All(rs) if rs.is_empty() => return "{}".into(),
            Selector::All(rs) => rs,
        };
        let one = |r: &Requirement| {
            let values = r.values.iter().cloned().collect::<Vec<_>>().join(",");
            match r.op {
                Op::In if r.values.len() == 1 => format!("{}={values}", r.key),
                Op::In => format!("{} in ({values})", r.key),
                Op::NotIn => format!("{} notin ({values})", r.key),
                Op::Exists => r.key.clone(),
                Op::DoesNotExist => format!("!{}", r.key),
            }
        };
        rs.iter().map(one).collect::<Vec<_>>().join(",")
    }
}

#[cfg(test)]
#[path = "tests/selector.rs"]
mod tests;
