use super::*;

fn addr(s: &str) -> Element {
    Element::Address(s.parse().expect("address"))
}

fn set(elements: &[&str]) -> Set {
    Set::new(SetKind::Addresses, elements.iter().map(|s| addr(s)))
}

fn key(link: &str) -> ChainKey {
    ChainKey {
        direction: Direction::Ingress,
        link: link.into(),
    }
}

fn state(sets: &[(&str, Set)], chains: &[(&str, Vec<Rule>)]) -> State {
    State {
        sets: sets
            .iter()
            .map(|(n, s)| (n.to_string(), s.clone()))
            .collect(),
        chains: chains
            .iter()
            .map(|(l, r)| (key(l), Chain::isolated(r.clone())))
            .collect(),
    }
}

fn allow(peer: &str) -> Rule {
    Rule {
        peer: PeerMatch::Set(peer.into()),
        port: PortMatch::Any,
    }
}

#[test]
fn the_diff_names_only_what_changed() {
    let before = state(
        &[
            ("a", set(&["10.0.0.1", "10.0.0.2"])),
            ("gone", set(&["10.0.0.9"])),
            ("same", set(&["fd00::1"])),
        ],
        &[
            ("lxc1", vec![allow("a")]),
            ("lxc2", vec![allow("gone")]),
            ("lxc3", vec![]),
        ],
    );
    let after = state(
        &[
            ("a", set(&["10.0.0.2", "10.0.0.3"])),
            ("new", set(&[])),
            ("same", set(&["fd00::1"])),
        ],
        &[
            ("lxc1", vec![allow("a")]),
            ("lxc2", vec![allow("new")]),
            ("lxc4", vec![]),
        ],
    );
    let d = before.diff(&after);
    assert_eq!(
        d.elements_added,
        [("a".to_string(), [addr("10.0.0.3")].into())].into()
    );
    assert_eq!(
        d.elements_removed,
        [("a".to_string(), [addr("10.0.0.1")].into())].into()
    );
    assert_eq!(d.sets_added, [("new".to_string(), set(&[]))].into());
    assert_eq!(d.sets_removed, ["gone".to_string()].into());
    assert_eq!(
        d.chains_added,
        [(key("lxc4"), Chain::isolated(vec![]))].into()
    );
    assert_eq!(
        d.chains_replaced,
        [(key("lxc2"), Chain::isolated(vec![allow("new")]))].into()
    );
    assert_eq!(d.chains_removed, [key("lxc3")].into());
    assert!(!d.is_empty());
    assert!(before.diff(&before).is_empty());
}

#[test]
fn from_nothing_everything_is_added() {
    let s = state(&[("a", set(&["10.0.0.1"]))], &[("lxc1", vec![allow("a")])]);
    let d = State::default().diff(&s);
    assert_eq!(
        d,
        Diff {
            sets_added: s.sets.clone(),
            chains_added: s.chains.clone(),
            ..Diff::default()
        }
    );
    let back = s.diff(&State::default());
    assert_eq!(
        back,
        Diff {
            sets_removed: ["a".into()].into(),
            chains_removed: [key("lxc1")].into(),
            ..Diff::default()
        }
    );
}
