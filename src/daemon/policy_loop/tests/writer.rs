use std::sync::{Arc, Mutex};

use serde_json::json;

use super::*;
use crate::nft::NftError;
use crate::policy::fixtures::{compile_placed, local, pod};
use crate::policy::{Enforcement, view};

/// What the fake table was asked to do.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    Install(State),
    Update(Diff),
}

/// A table that records its calls and fails the ones it is told to.
#[derive(Clone, Default)]
struct Fake {
    calls: Arc<Mutex<Vec<Call>>>,
    fail_updates: Arc<Mutex<bool>>,
    fail_installs: Arc<Mutex<bool>>,
}

impl Fake {
    fn calls(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }

    fn failure() -> PolicyTableError {
        PolicyTableError::Nft(NftError::NotInstalled)
    }
}

impl Table for Fake {
    fn install(&mut self, state: &State) -> Result<(), PolicyTableError> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Install(state.clone()));
        match *self.fail_installs.lock().unwrap() {
            true => Err(Fake::failure()),
            false => Ok(()),
        }
    }

    fn update(&mut self, diff: &Diff) -> Result<(), PolicyTableError> {
        self.calls.lock().unwrap().push(Call::Update(diff.clone()));
        match *self.fail_updates.lock().unwrap() {
            true => Err(Fake::failure()),
            false => Ok(()),
        }
    }
}

/// The node's state with local `web` at `ip`, under a deny-all-ingress policy when
/// `deny`; `port` is the port of its rule (a name no pod has is a problem).
fn compiled(ip: &str, deny: bool, port: serde_json::Value) -> Compiled {
    let np = serde_json::from_value(json!({
        "metadata": {"namespace": "a", "name": "p"},
        "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": port}]}]},
    }))
    .unwrap();
    let policies: Vec<_> = deny.then(|| view::policy(&np)).into_iter().collect();
    let web = local(pod("a", "web", &[("app", "web")], &[ip]), "lxcweb");
    compile_placed(
        Enforcement::Default,
        &policies,
        &[web],
        &[],
        &["192.168.0.1".parse().unwrap()],
    )
}

#[test]
fn the_first_write_installs_and_a_change_updates_only_the_difference() {
    let fake = Fake::default();
    let mut w = Writer::new(fake.clone());
    assert!(w.pending());
    let first = compiled("10.0.0.10", true, json!(80));
    assert_eq!(w.write(&first), Wrote::Installed);
    assert_eq!(fake.calls(), [Call::Install(first.state.clone())]);
    assert!(!w.pending());
    assert_eq!(w.write(&first), Wrote::Unchanged);
    assert_eq!(fake.calls(), []);
    let second = compiled("10.0.0.10", false, json!(80));
    assert_eq!(w.write(&second), Wrote::Updated);
    assert_eq!(
        fake.calls(),
        [Call::Update(first.state.diff(&second.state))]
    );
    assert_eq!(w.written(), Some(&second.state));
}

#[test]
fn a_failed_update_installs_the_whole_state_and_a_failed_install_is_tried_again() {
    let fake = Fake::default();
    let mut w = Writer::new(fake.clone());
    let first = compiled("10.0.0.10", true, json!(80));
    w.write(&first);
    fake.calls();
    *fake.fail_updates.lock().unwrap() = true;
    let second = compiled("10.0.0.10", false, json!(80));
    assert_eq!(w.write(&second), Wrote::Installed);
    assert_eq!(
        fake.calls(),
        [
            Call::Update(first.state.diff(&second.state)),
            Call::Install(second.state.clone())
        ]
    );
    *fake.fail_installs.lock().unwrap() = true;
    let third = compiled("10.0.0.10", true, json!(443));
    assert_eq!(w.write(&third), Wrote::Failed);
    assert!(w.pending(), "the table is no longer known");
    assert_eq!(w.write(&third), Wrote::Failed, "tried again");
    assert!(w.failing.is_some(), "the same error is not logged again");
    fake.calls();
    *fake.fail_installs.lock().unwrap() = false;
    *fake.fail_updates.lock().unwrap() = false;
    assert_eq!(w.write(&third), Wrote::Installed, "whole, not a diff");
    assert_eq!(fake.calls(), [Call::Install(third.state.clone())]);
    assert_eq!(w.failing, None);
}

#[test]
fn a_problem_is_logged_once_while_it_lasts_and_again_when_it_returns() {
    let mut w = Writer::new(Fake::default());
    let bad = compiled("10.0.0.10", true, json!("no-such-port"));
    assert_eq!(bad.problems.len(), 1, "{:?}", bad.problems);
    assert_eq!(w.log_new(&bad), 1);
    assert_eq!(w.log_new(&bad), 0, "not on every recompile");
    w.write(&compiled("10.0.0.11", true, json!("no-such-port")));
    assert_eq!(w.log_new(&bad), 0);
    let good = compiled("10.0.0.10", true, json!(80));
    assert_eq!(w.log_new(&good), 0);
    assert_eq!(w.log_new(&bad), 1);
}
