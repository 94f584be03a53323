use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use super::*;
use crate::policy::fixtures::ip;
use crate::policy::render;
use crate::policy::state::FAMILY;
use crate::policy::state::{
    Chain, ChainKey, Direction, Element, PeerMatch, PortMatch, Rule, Set, SetKind, State,
};
use crate::policy::table;
use crate::policy::verdict::DropLog;

/// Local pod `lxcweb`, isolated for ingress, taking TCP 80 from the two
/// clients' addresses.
fn state() -> State {
    let clients = [ip("10.0.0.2"), ip("fd00::2"), ip("10.0.0.3")];
    State {
        sets: BTreeMap::from([(
            "clients".to_string(),
            Set::new(
                SetKind::Addresses,
                clients.into_iter().map(Element::Address),
            ),
        )]),
        chains: BTreeMap::from([(
            ChainKey {
                direction: Direction::Ingress,
                link: "lxcweb".into(),
            },
            Chain::isolated(vec![Rule {
                peer: PeerMatch::Set("clients".into()),
                port: PortMatch::Ranges(crate::policy::view::Protocol::Tcp, vec![(80, 80)]),
            }]),
        )]),
    }
}

#[test]
fn a_listing_of_the_written_parts_is_intact_and_of_nothing_is_missing() {
    let s = state();
    let written = render::parts(&s, None);
    let rules = written.iter().find_map(|p| match p {
        Part::Rules { chain, count } if chain == "ingress_lxcweb" => Some(*count),
        _ => None,
    });
    assert_eq!(rules, Some(3), "one rule per family, and the drop");
    let sets: BTreeSet<String> = written.iter().map(Part::to_string).collect();
    assert!(sets.contains("2 elements in set clients_v4"), "{sets:?}");
    assert!(sets.contains("ingress_pods: lxcweb -> ingress_lxcweb"));
    assert_eq!(
        compare(&written, &written, Depth::Full),
        Found::Intact,
        "equal parts"
    );
    let other_table = json!({"nftables": [
        {"chain": {"family": "inet", "table": "firewalld", "name": "forward", "hook": "forward"}},
    ]});
    let found = found([&other_table]);
    assert!(found.is_empty(), "{found:?}");
    assert_eq!(compare(&written, &found, Depth::Quick), Found::Missing);
}

#[test]
fn a_quick_check_reads_the_forward_chains_rules_and_no_set_elements() {
    let written = render::parts(&state(), None);
    let mut found = written.clone();
    found.retain(|p| !matches!(p, Part::Elements { .. }));
    found.insert(Part::Elements {
        set: "clients_v4".into(),
        count: 0,
    });
    assert_eq!(compare(&written, &found, Depth::Quick), Found::Intact);
    assert!(matches!(
        compare(&written, &found, Depth::Full),
        Found::Differs(_)
    ));
    let flushed = Part::Rules {
        chain: FORWARD_CHAIN.into(),
        count: 3,
    };
    assert!(found.remove(&flushed));
    found.insert(Part::Rules {
        chain: FORWARD_CHAIN.into(),
        count: 0,
    });
    let Found::Differs(d) = compare(&written, &found, Depth::Quick) else {
        panic!("the forward chain flushed is a difference")
    };
    assert_eq!(d.missing, [flushed]);
    assert_eq!(
        d.to_string(),
        "1 parts written are not there (first: 3 rules in chain forward), 1 there were not written (first: 0 rules in chain forward)"
    );
}

/// Runs `script` through `nft -f -` (in the test's namespace).
fn nft(script: &str) {
    crate::nft::apply(script).unwrap_or_else(|e| panic!("{script}: {e}"));
}

fn checked(s: &State) -> [Found; 2] {
    [Depth::Quick, Depth::Full].map(|depth| table::check(s, None, depth).unwrap())
}

/// The verdict log of the tests (as the agent's defaults).
const LOG: DropLog = DropLog {
    group: 5730,
    per_second: 100,
    audit: false,
};

fn differs(found: &Found) -> bool {
    matches!(found, Found::Differs(_))
}

#[test]
fn the_kernels_table_is_checked_for_deletion_flushes_and_removed_elements() {
    use crate::datapath::tests::{in_private_netns, root};
    let name = "the_kernels_table_is_checked_for_deletion_flushes_and_removed_elements";
    if !root(name) {
        return;
    }
    in_private_netns(|| {
        let s = state();
        let t = format!("{FAMILY} {TABLE}");
        assert_eq!(checked(&s), [Found::Missing, Found::Missing], "none yet");
        table::install(&s, None).unwrap();
        assert_eq!(checked(&s), [Found::Intact, Found::Intact]);
        nft(&format!("delete table {t}\n"));
        assert_eq!(checked(&s), [Found::Missing, Found::Missing]);
        table::install(&s, None).unwrap();
        nft(&format!("flush table {t}\n"));
        assert!(checked(&s).iter().all(differs), "every chain emptied");
        table::install(&s, None).unwrap();
        nft(&format!("flush map {t} ingress_pods\n"));
        assert!(checked(&s).iter().all(differs), "no pod enforced");
        table::install(&s, None).unwrap();
        nft(&format!("flush chain {t} input\n"));
        assert!(
            checked(&s).iter().all(differs),
            "nothing to the node judged"
        );
        table::install(&s, None).unwrap();
        nft(&format!("delete chain {t} input\n"));
        assert!(checked(&s).iter().all(differs), "no input hook");
        table::install(&s, None).unwrap();
        nft(&format!("flush chain {t} ingress_lxcweb\n"));
        let [quick, full] = checked(&s);
        assert_eq!(
            quick,
            Found::Intact,
            "a pod's rules wait for the full check"
        );
        assert!(differs(&full), "{full:?}");
        table::install(&s, None).unwrap();
        nft(&format!("delete element {t} clients_v6 {{ fd00::2 }}\n"));
        let [quick, full] = checked(&s);
        assert_eq!(quick, Found::Intact);
        assert!(differs(&full), "{full:?}");
        table::install(&State::default(), None).unwrap();
        assert_eq!(checked(&State::default()), [Found::Intact, Found::Intact]);
        table::remove().unwrap();
    });
}

/// web's ingress in the two ClusterNetworkPolicy tiers: an Admin Deny of
/// `denied`, Pass of `passed` (when `pass`), Allow of `allowed`, then
/// NetworkPolicy's allow of `clients`, then a Baseline Deny of everyone. Each names its policy, the
/// Admin tier's too long for a log prefix (logged, it is cut).
fn tiered(pass: bool) -> State {
    use crate::policy::state::{Origin, TierRule, Verdict};
    use crate::policy::view::Tier;
    let mut s = state();
    let origin = |tier, policy: String| {
        Some(Origin {
            tier,
            policy,
            index: 0,
            name: Some("deny".into()),
        })
    };
    let rule = |peer: &str, verdict| TierRule {
        rule: Rule {
            peer: PeerMatch::Set(peer.into()),
            port: PortMatch::Any,
        },
        verdict,
        origin: origin(Tier::Admin, "a".repeat(253)),
    };
    for name in ["denied", "passed", "allowed"] {
        let set = Set::new(SetKind::Addresses, [Element::Address(ip("10.0.9.9"))]);
        s.sets.insert(name.into(), set);
    }
    for chain in s.chains.values_mut() {
        chain.admin.push(rule("denied", Verdict::Deny));
        if pass {
            chain.admin.push(rule("passed", Verdict::Pass));
        }
        chain.admin.push(rule("allowed", Verdict::Allow));
        chain.baseline.push(TierRule {
            rule: Rule {
                peer: PeerMatch::Any,
                port: PortMatch::Any,
            },
            verdict: Verdict::Deny,
            origin: origin(Tier::Baseline, "baseline-deny".into()),
        });
    }
    s
}

#[test]
fn an_allowed_chain_flushed_behind_the_agents_back_is_found() {
    use crate::datapath::tests::{in_private_netns, root};
    let name = "an_allowed_chain_flushed_behind_the_agents_back_is_found";
    if !root(name) {
        return;
    }
    in_private_netns(|| {
        let (s, log) = (state(), Some(&LOG));
        let t = format!("{FAMILY} {TABLE}");
        table::install(&s, log).unwrap();
        let full = || table::check(&s, log, Depth::Full).unwrap();
        assert_eq!(full(), Found::Intact);
        nft(&format!("flush chain {t} allowed_ingress\n"));
        assert!(differs(&full()), "{:?}", full());
        table::install(&s, log).unwrap();
        assert_eq!(full(), Found::Intact);
        table::remove().unwrap();
    });
}

#[test]
fn the_kernel_takes_the_tiers_and_their_pass_chains_and_updates_between_them() {
    use crate::datapath::tests::{in_private_netns, root};
    let name = "the_kernel_takes_the_tiers_and_their_pass_chains_and_updates_between_them";
    if !root(name) {
        return;
    }
    in_private_netns(|| {
        let (with, without) = (tiered(true), tiered(false));
        table::install(&with, None).unwrap();
        assert_eq!(checked(&with), [Found::Intact, Found::Intact]);
        table::update(&with.diff(&without), None).unwrap();
        assert_eq!(checked(&without), [Found::Intact, Found::Intact]);
        table::update(&without.diff(&with), None).unwrap();
        assert_eq!(checked(&with), [Found::Intact, Found::Intact]);
        table::update(&with.diff(&state()), None).unwrap();
        assert_eq!(checked(&state()), [Found::Intact, Found::Intact]);
        table::update(&state().diff(&with), None).unwrap();
        table::update(&with.diff(&State::default()), None).unwrap();
        assert_eq!(checked(&State::default()), [Found::Intact, Found::Intact]);
        table::remove().unwrap();
    });
}

#[test]
fn the_kernel_takes_logged_final_drops_and_tier_denies_and_counts_what_the_limit_suppressed() {
    use crate::datapath::tests::{in_private_netns, root};
    let name =
        "the_kernel_takes_logged_final_drops_and_tier_denies_and_counts_what_the_limit_suppressed";
    if !root(name) {
        return;
    }
    in_private_netns(|| {
        for audit in [false, true] {
            let log = DropLog { audit, ..LOG };
            let (s, log) = (state(), Some(&log));
            assert_eq!(table::suppressed().unwrap(), None, "no table yet");
            table::install(&s, log).unwrap();
            let both = [Depth::Quick, Depth::Full];
            let found = both.map(|depth| table::check(&s, log, depth).unwrap());
            assert_eq!(found, [Found::Intact, Found::Intact]);
            assert_eq!(table::suppressed().unwrap(), Some(0));
            let next = tiered(true);
            table::update(&s.diff(&next), log).unwrap();
            let found = both.map(|depth| table::check(&next, log, depth).unwrap());
            assert_eq!(found, [Found::Intact, Found::Intact]);
            // The kernel keeps the Admin Deny's whole prefix, its long name cut.
            let listed = std::process::Command::new("nft")
                .args(["list", "table", "inet", "podnet_policy"])
                .output()
                .unwrap();
            let listed = String::from_utf8_lossy(&listed.stdout);
            let outcome = if audit { "audit" } else { "denied" };
            let cut = format!(
                "log prefix \"podnet {outcome} ingress admin 0 {}~\"",
                "a".repeat(127 - format!("podnet {outcome} ingress admin 0 ").len() - 1)
            );
            assert!(listed.contains(&cut), "{cut} in {listed}");
            // The Admin Allow is logged under its own limit, and a
            // NetworkPolicy allow through the allowed chain.
            let allow =
                "limit name \"verdict_log_allowed\" log prefix \"podnet allowed ingress admin 0 ";
            assert!(listed.contains(allow), "{allow} in {listed}");
            assert!(listed.contains("goto allowed_ingress"), "{listed}");
            table::remove().unwrap();
        }
    });
}
