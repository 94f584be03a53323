use std::sync::{Arc, Mutex};

use serde_json::json;

use super::*;
use crate::daemon::policy_loop::{FULL_CHECK_EVERY, check_depth};
use crate::nft::NftError;
use crate::policy::check::Difference;
use crate::policy::fixtures::{compile_placed, local, pod};
use crate::policy::{Enforcement, view};

/// What the fake table was asked to do.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    Install(State),
    Update(Diff),
    Check(Depth),
}

/// A table that records its calls and fails the ones it is told to; a check
/// finds what `kernel` says (an install makes it intact).
#[derive(Clone)]
struct Fake {
    calls: Arc<Mutex<Vec<Call>>>,
    fail_updates: Arc<Mutex<bool>>,
    fail_installs: Arc<Mutex<bool>>,
    kernel: Arc<Mutex<Found>>,
}

impl Default for Fake {
    fn default() -> Fake {
        Fake {
            calls: Arc::default(),
            fail_updates: Arc::default(),
            fail_installs: Arc::default(),
            kernel: Arc::new(Mutex::new(Found::Intact)),
        }
    }
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
            false => {
                *self.kernel.lock().unwrap() = Found::Intact;
                Ok(())
            }
        }
    }

    fn check(&mut self, _written: &State, depth: Depth) -> Result<Found, PolicyTableError> {
        self.calls.lock().unwrap().push(Call::Check(depth));
        Ok(self.kernel.lock().unwrap().clone())
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

#[test]
fn a_check_that_finds_the_table_changed_makes_the_next_write_install_it_whole() {
    let fake = Fake::default();
    let mut w = Writer::new(fake.clone());
    assert_eq!(
        w.check(Depth::Quick),
        None,
        "nothing written: nothing checked"
    );
    assert_eq!(fake.calls(), []);
    let c = compiled("10.0.0.10", true, json!(80));
    w.write(&c);
    fake.calls();
    let pass = w.pass(&c, Some(Depth::Quick));
    assert_eq!(pass.repaired, None);
    assert_eq!(
        pass.wrote,
        Wrote::Unchanged,
        "an intact table is not rewritten"
    );
    assert_eq!(fake.calls(), [Call::Check(Depth::Quick)]);
    let differs = Found::Differs(Difference {
        missing: Vec::new(),
        unexpected: Vec::new(),
    });
    for found in [Found::Missing, differs] {
        *fake.kernel.lock().unwrap() = found.clone();
        let pass = w.pass(&c, Some(Depth::Full));
        assert_eq!(pass.repaired, Some(found));
        assert_eq!(pass.wrote, Wrote::Installed);
        assert_eq!(
            fake.calls(),
            [Call::Check(Depth::Full), Call::Install(c.state.clone())]
        );
    }
}

#[test]
fn each_pass_checks_quickly_and_every_tenth_resync_in_full() {
    assert_eq!(check_depth(None, 0), Depth::Full, "the first resync");
    assert_eq!(check_depth(None, 1), Depth::Quick);
    assert_eq!(check_depth(Some(0), 1), Depth::Quick);
    assert_eq!(check_depth(Some(9), 10), Depth::Full);
    // A pass standing for resyncs 9 to 11 (they came while it waited).
    assert_eq!(check_depth(Some(8), 11), Depth::Full);
    assert_eq!(check_depth(Some(11), 12), Depth::Quick);
}

#[test]
fn a_deleted_table_is_installed_again_at_the_next_resync_not_before_and_an_intact_one_is_left() {
    let fake = Fake::default();
    let mut w = Writer::new(fake.clone());
    let c = compiled("10.0.0.10", true, json!(80));
    let pass = w.pass(&c, None);
    assert_eq!(pass.wrote, Wrote::Installed);
    assert_eq!(fake.calls(), [Call::Install(c.state.clone())]);

    // Deleted; a change of the cluster before the resync is written against
    // the last write, without reading the kernel.
    *fake.kernel.lock().unwrap() = Found::Missing;
    let pass = w.pass(&c, None);
    assert_eq!(pass.wrote, Wrote::Unchanged);
    assert_eq!(fake.calls(), [], "not checked before the resync");

    let pass = w.pass(&c, Some(check_depth(Some(0), 1)));
    assert_eq!(pass.repaired, Some(Found::Missing));
    assert_eq!(pass.wrote, Wrote::Installed);
    assert_eq!(
        fake.calls(),
        [Call::Check(Depth::Quick), Call::Install(c.state.clone())]
    );

    // Intact from then on: each resync checks, none writes; every
    // FULL_CHECK_EVERYth check reads the whole table.
    let mut depths = Vec::new();
    for resync in 2..=FULL_CHECK_EVERY {
        let pass = w.pass(&c, Some(check_depth(Some(resync - 1), resync)));
        assert_eq!((pass.repaired, pass.wrote), (None, Wrote::Unchanged));
        match fake.calls().as_slice() {
            [Call::Check(depth)] => depths.push(*depth),
            calls => panic!("resync {resync}: {calls:?}"),
        }
    }
    let quick = FULL_CHECK_EVERY as usize - 2;
    assert_eq!(depths[..quick], vec![Depth::Quick; quick]);
    assert_eq!(depths[quick], Depth::Full);
}

#[test]
fn a_table_deleted_in_the_kernel_is_back_after_the_next_checked_pass() {
    use crate::datapath::tests::{in_private_netns, root};
    use crate::policy::state::{FAMILY, TABLE};
    if !root("a_table_deleted_in_the_kernel_is_back_after_the_next_checked_pass") {
        return;
    }
    in_private_netns(|| {
        let mut w = Writer::new(Kernel { log: None });
        let c = compiled("10.0.0.10", true, json!(80));
        assert_eq!(w.write(&c), Wrote::Installed);
        let listed = || crate::nft::list_table(FAMILY, TABLE).unwrap();
        let before = listed().expect("installed");
        let unchecked = w.pass(&c, Some(Depth::Quick));
        assert_eq!(
            (unchecked.repaired, unchecked.wrote),
            (None, Wrote::Unchanged)
        );
        let out = std::process::Command::new("nft")
            .args(["delete", "table", FAMILY, TABLE])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(listed(), None);
        assert_eq!(
            w.write(&c),
            Wrote::Unchanged,
            "a write alone does not see it"
        );
        let pass = w.pass(&c, Some(Depth::Quick));
        assert_eq!(pass.repaired, Some(Found::Missing));
        assert_eq!(pass.wrote, Wrote::Installed);
        let after = listed().expect("installed again");
        let chains = |l: &serde_json::Value| -> Vec<String> {
            let chains = crate::nft::objects(l).filter(|(kind, _)| *kind == "chain");
            chains.map(|(_, c)| c["name"].to_string()).collect()
        };
        assert_eq!(chains(&after), chains(&before));
        assert_eq!(w.check(Depth::Full), None, "intact");
        table::remove().unwrap();
    });
}
