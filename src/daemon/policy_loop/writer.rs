//! The policy loop's writer: each compile's state goes to the kernel as the
//! difference from the state last written (`policy::table::update`), the first
//! one, and any after a failed write, whole (`policy::table::install`: one
//! transaction that replaces whatever table is there, a previous agent's
//! included). Each problem of the policies, and each local pod whose link cannot
//! be enforced on, is logged once while it lasts, and so is an install that
//! keeps failing with the same error.
//!
//! The writer compares with its own last write, so a table changed under it (an
//! `nft flush ruleset`, a host firewall's restart, `nft delete table inet
//! podnet_policy`) would stand until a change of the cluster. So a pass may
//! first [`Writer::check`] the kernel's table against the state last written
//! (`policy::check`): when no part of it is there, or a part it reads differs,
//! the writer forgets its last write, logs what it found once, and the pass
//! installs the whole state. What is read, and how often, is the loop's choice
//! (`daemon::policy_loop::check_depth`, at the controller kit's resyncs). The
//! kernel is behind [`Table`], so the writer is tested without one.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::policy::check::{Depth, Found};
use crate::policy::table::{self, PolicyTableError};
use crate::policy::verdict::DropLog;
use crate::policy::{Compiled, Diff, Problem, State};

/// Where the state is written: the kernel ([`Kernel`]), or a test's fake.
pub trait Table {
    fn install(&mut self, state: &State) -> Result<(), PolicyTableError>;
    fn update(&mut self, diff: &Diff) -> Result<(), PolicyTableError>;
    /// Compares the table with `written`, reading what `depth` reads.
    fn check(&mut self, written: &State, depth: Depth) -> Result<Found, PolicyTableError>;
}

/// podnet's policy table in the kernel (`table inet podnet_policy`), its
/// final drops logged with `log` (None: silent).
pub struct Kernel {
    pub log: Option<DropLog>,
}

impl Table for Kernel {
    fn install(&mut self, state: &State) -> Result<(), PolicyTableError> {
        table::install(state, self.log.as_ref())
    }

    fn update(&mut self, diff: &Diff) -> Result<(), PolicyTableError> {
        table::update(diff, self.log.as_ref())
    }

    fn check(&mut self, written: &State, depth: Depth) -> Result<Found, PolicyTableError> {
        table::check(written, self.log.as_ref(), depth)
    }
}

/// What one write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wrote {
    /// The whole state (the first write, or after a failure).
    Installed,
    /// The difference from the last state.
    Updated,
    /// Nothing changed.
    Unchanged,
    /// The table could not be written; the next write installs the whole state.
    Failed,
}

impl Wrote {
    /// The metric's label; None for a write that wrote nothing.
    pub fn result(self) -> Option<&'static str> {
        match self {
            Wrote::Installed => Some("installed"),
            Wrote::Updated => Some("updated"),
            Wrote::Unchanged => None,
            Wrote::Failed => Some("failed"),
        }
    }
}

/// What one pass did: what its check found, when that made it install, and
/// the write, with how long the write took.
#[derive(Debug, Clone)]
pub struct Pass {
    pub repaired: Option<Found>,
    pub wrote: Wrote,
    pub took: Duration,
}

/// The state last written, and what has been logged.
pub struct Writer<T> {
    table: T,
    /// None until a state is written, and after a failed write.
    written: Option<State>,
    problems: BTreeSet<Problem>,
    unusable_links: BTreeSet<String>,
    /// The error of the failing install, logged once while it repeats.
    failing: Option<String>,
    /// The error of the failing check, logged once while it repeats.
    check_failing: Option<String>,
}

impl<T: Table> Writer<T> {
    pub fn new(table: T) -> Writer<T> {
        Writer {
            table,
            written: None,
            problems: BTreeSet::new(),
            unusable_links: BTreeSet::new(),
            failing: None,
            check_failing: None,
        }
    }

    /// Checks the kernel's table to `depth` against the state last written (none
    /// written: nothing to check, the next write installs). Returns what it
    /// found when the table is not as written: the writer then forgets its last
    /// write, so the next [`Writer::write`] installs the whole state. A check
    /// that cannot read the table is logged (once while it repeats) and changes
    /// nothing.
    pub fn check(&mut self, depth: Depth) -> Option<Found> {
        let written = self.written.as_ref()?;
        let found = match self.table.check(written, depth) {
            Ok(found) => found,
            Err(e) => {
                let error = e.to_string();
                if self.check_failing.as_ref() != Some(&error) {
                    tracing::warn!(%error, "NetworkPolicy: the table in the kernel cannot be read to check it; it is checked again at the next resync");
                }
                self.check_failing = Some(error);
                return None;
            }
        };
        self.check_failing = None;
        match &found {
            Found::Intact => return None,
            Found::Missing => {
                tracing::warn!(
                    "NetworkPolicy: the policy table is missing from the kernel (deleted by someone else); installing it again"
                )
            }
            Found::Differs(difference) => {
                tracing::warn!(%difference, "NetworkPolicy: the policy table in the kernel is not as written (changed by someone else); installing it again")
            }
        }
        self.written = None;
        Some(found)
    }

    /// One pass of the loop: the `check` of the kernel's table it asks for, if
    /// any, then the write of `compiled`.
    pub fn pass(&mut self, compiled: &Compiled, check: Option<Depth>) -> Pass {
        let repaired = check.and_then(|depth| self.check(depth));
        let started = Instant::now();
        let wrote = self.write(compiled);
        Pass {
            repaired,
            wrote,
            took: started.elapsed(),
        }
    }

    /// Writes `compiled`'s state; logs its new problems.
    pub fn write(&mut self, compiled: &Compiled) -> Wrote {
        self.log_new(compiled);
        let state = &compiled.state;
        let wrote = match &self.written {
            Some(old) => {
                let diff = old.diff(state);
                if diff.is_empty() {
                    return Wrote::Unchanged;
                }
                match self.table.update(&diff) {
                    Ok(()) => Wrote::Updated,
                    Err(e) => {
                        tracing::warn!(error = %e, "NetworkPolicy: the table update failed; installing the whole state");
                        self.install(state)
                    }
                }
            }
            None => self.install(state),
        };
        self.written = (wrote != Wrote::Failed).then(|| state.clone());
        wrote
    }

    fn install(&mut self, state: &State) -> Wrote {
        match self.table.install(state) {
            Ok(()) => {
                if self.failing.take().is_some() {
                    tracing::info!("NetworkPolicy: the table is written again");
                }
                Wrote::Installed
            }
            Err(e) => {
                let error = e.to_string();
                if self.failing.as_ref() != Some(&error) {
                    tracing::error!(%error, "NetworkPolicy: the table cannot be written; the table in the kernel stays as it was, and it is tried again");
                }
                self.failing = Some(error);
                Wrote::Failed
            }
        }
    }

    /// Whether the last write failed or none was made (the loop tries again).
    pub fn pending(&self) -> bool {
        self.written.is_none()
    }

    /// The state in the kernel, as far as the writer knows.
    pub fn written(&self) -> Option<&State> {
        self.written.as_ref()
    }

    /// Logs each problem and unusable link not logged while it lasted; returns
    /// how many were new.
    fn log_new(&mut self, compiled: &Compiled) -> usize {
        let problems: BTreeSet<Problem> = compiled.problems.iter().cloned().collect();
        let links: BTreeSet<String> = compiled.unusable_links.iter().cloned().collect();
        let mut new = 0;
        for p in problems.difference(&self.problems) {
            tracing::warn!(policy = %format!("{}/{}", p.namespace, p.name), field = %p.field, "{p}; that part allows nothing");
            new += 1;
        }
        for pod in links.difference(&self.unusable_links) {
            tracing::warn!(%pod, "NetworkPolicy selects this pod, but its host link is not podnet's: not enforced");
            new += 1;
        }
        self.problems = problems;
        self.unusable_links = links;
        new
    }
}

#[cfg(test)]
#[path = "tests/writer.rs"]
mod tests;
