//! What the policy loop's resync compares of the table in the kernel with the
//! state last written: the table's [`Part`]s, as a state renders them
//! (`render::parts`) and as nft lists them ([`found`]), without handles and
//! without the order of set elements (the table holds no counters). A
//! [`Depth`] says which parts one check reads: the cheap one reads no pod
//! chain's rules and no set's elements, which are most of a large table's
//! listing (`table::check` runs the listings).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::state::{FORWARD_CHAIN, INPUT_CHAIN, TABLE};
use crate::nft;

/// One thing of the table the check compares.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    /// A chain, with a base chain's type, hook and policy.
    Chain { name: String, hook: Option<String> },
    /// How many rules a chain holds.
    Rules { chain: String, count: usize },
    /// A verdict map.
    Map { name: String },
    /// An element of a verdict map: a host link and the chain it jumps to.
    Jump {
        map: String,
        link: String,
        chain: String,
    },
    /// How many elements a set (of one family) holds.
    Elements { set: String, count: usize },
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Part::Chain { name, hook: None } => write!(f, "chain {name}"),
            Part::Chain {
                name,
                hook: Some(hook),
            } => write!(f, "chain {name} ({hook})"),
            Part::Rules { chain, count } => write!(f, "{count} rules in chain {chain}"),
            Part::Map { name } => write!(f, "map {name}"),
            Part::Jump { map, link, chain } => write!(f, "{map}: {link} -> {chain}"),
            Part::Elements { set, count } => write!(f, "{count} elements in set {set}"),
        }
    }
}

/// How much of the table one check reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// The chains (without rules), both verdict maps and the two base chains'
    /// rules: five small listings, whatever the table's size.
    Quick,
    /// The whole table: every chain's rule count and every set's element count
    /// too (one listing of all of it).
    Full,
}

impl Depth {
    /// Whether a check of this depth reads `part`.
    pub fn covers(self, part: &Part) -> bool {
        match (self, part) {
            (Depth::Full, _) => true,
            (Depth::Quick, Part::Rules { chain, .. }) => {
                chain == FORWARD_CHAIN || chain == INPUT_CHAIN
            }
            (Depth::Quick, Part::Elements { .. }) => false,
            (Depth::Quick, _) => true,
        }
    }
}

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Every part it read is as written.
    Intact,
    /// No part of the table is there: deleted (`nft flush ruleset`, `nft
    /// delete table`), or emptied of every chain, map and set.
    Missing,
    /// The table is there, and some of what it read is not as written.
    Differs(Difference),
}

impl Found {
    /// The metric's label; None when intact.
    pub fn label(&self) -> Option<&'static str> {
        match self {
            Found::Intact => None,
            Found::Missing => Some("missing"),
            Found::Differs(_) => Some("differs"),
        }
    }
}

/// The parts written and not found, and the parts found and not written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    pub missing: Vec<Part>,
    pub unexpected: Vec<Part>,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first = |parts: &[Part]| match parts.first() {
            Some(p) => format!(" (first: {p})"),
            None => String::new(),
        };
        write!(
            f,
            "{} parts written are not there{}, {} there were not written{}",
            self.missing.len(),
            first(&self.missing),
            self.unexpected.len(),
            first(&self.unexpected)
        )
    }
}

/// Compares the parts `depth` reads of `written` (the state's parts) and of
/// `found` (the listings' parts).
pub fn compare(written: &BTreeSet<Part>, found: &BTreeSet<Part>, depth: Depth) -> Found {
    if found.is_empty() {
        return Found::Missing;
    }
    let read = |parts: &BTreeSet<Part>| -> BTreeSet<Part> {
        parts.iter().filter(|p| depth.covers(p)).cloned().collect()
    };
    let (written, found) = (read(written), read(found));
    let missing: Vec<Part> = written.difference(&found).cloned().collect();
    let unexpected: Vec<Part> = found.difference(&written).cloned().collect();
    match missing.is_empty() && unexpected.is_empty() {
        true => Found::Intact,
        false => Found::Differs(Difference {
            missing,
            unexpected,
        }),
    }
}

/// The parts of podnet's policy table in nft's JSON `listings` (of any of
/// `list table`, `list chains`, `list chain`, `list map`): objects of other
/// tables are skipped; each chain listed counts the rules listed with it.
pub fn found<'a>(listings: impl IntoIterator<Item = &'a serde_json::Value>) -> BTreeSet<Part> {
    let mut parts = BTreeSet::new();
    let mut rules: BTreeMap<String, usize> = BTreeMap::new();
    for listing in listings {
        let ours = nft::objects(listing).filter(|(_, o)| o["table"].as_str() == Some(TABLE));
        for (kind, object) in ours {
            let name = object["name"].as_str().unwrap_or_default().to_string();
            match kind {
                "chain" => {
                    rules.entry(name.clone()).or_default();
                    parts.insert(Part::Chain {
                        name,
                        hook: hook(object),
                    });
                }
                "rule" => {
                    let chain = object["chain"].as_str().unwrap_or_default();
                    *rules.entry(chain.to_string()).or_default() += 1;
                }
                "map" => {
                    parts.extend(jumps(&name, object));
                    parts.insert(Part::Map { name });
                }
                "set" => {
                    let count = object["elem"].as_array().map_or(0, Vec::len);
                    parts.insert(Part::Elements { set: name, count });
                }
                _ => {}
            }
        }
    }
    let counts = rules
        .into_iter()
        .map(|(chain, count)| Part::Rules { chain, count });
    parts.extend(counts);
    parts
}

/// How a base chain's type, hook and policy read in its [`Part::Chain`].
pub fn base_chain(kind: &str, hook: &str, policy: &str) -> String {
    format!("{kind} hook {hook} policy {policy}")
}

/// A listed chain's type, hook and policy; None for a regular chain.
fn hook(chain: &serde_json::Value) -> Option<String> {
    let text = |key: &str| chain[key].as_str().unwrap_or("?");
    chain["hook"]
        .is_string()
        .then(|| base_chain(text("type"), text("hook"), text("policy")))
}

/// A verdict map's elements (`["lxc1", {"jump": {"target": "ingress_lxc1"}}]`);
/// one of another form is a jump nowhere, which no state has.
fn jumps(map: &str, object: &serde_json::Value) -> Vec<Part> {
    let elements = object["elem"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let jump = |e: &serde_json::Value| Part::Jump {
        map: map.to_string(),
        link: match e[0].as_str() {
            Some(link) => link.to_string(),
            None => e.to_string(),
        },
        chain: e[1]["jump"]["target"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    };
    elements.iter().map(jump).collect()
}

#[cfg(test)]
#[path = "tests/check.rs"]
mod tests;
