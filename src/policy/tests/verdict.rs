use super::*;
use crate::policy::state::Origin;

#[test]
fn each_prefix_reads_back_as_its_outcome_and_direction() {
    for outcome in [Outcome::Denied, Outcome::Audit, Outcome::Allowed] {
        for direction in [Direction::Ingress, Direction::Egress] {
            let p = prefix(outcome, direction);
            assert!(p.len() <= PREFIX_MAX, "nft's prefix limit: {p}");
            let logged = Logged {
                outcome,
                direction,
                origin: None,
            };
            assert_eq!(parse_prefix(&p), Ok(logged));
        }
    }
    assert_eq!(
        prefix(Outcome::Denied, Direction::Ingress),
        "podnet denied ingress"
    );
}

#[test]
fn a_prefix_podnet_did_not_write_is_foreign() {
    for text in [
        "",
        "podnet",
        "podnet denied",
        "podnet allow ingress",
        "podnet allowed",
        "podnet denied sideways",
        "podnet denied ingress extra",
        "podnet denied ingress admin",
        "podnet denied ingress admin 0",
        "podnet denied ingress admin x deny",
        "podnet denied ingress admin +0 deny",
        "podnet denied ingress tier 0 deny",
        "podnet denied ingress admin 0 deny rule extra",
        "podnet denied ingress admin 0  rule",
        "podnet denied ingress admin 0 deny ",
        "other denied ingress",
        "podnet  denied ingress",
    ] {
        assert_eq!(
            parse_prefix(text),
            Err(ForeignPrefix(text.into())),
            "{text:?}"
        );
    }
    let e = parse_prefix("x").unwrap_err().to_string();
    assert!(e.contains("\"x\" is not podnet's"), "{e}");
}

#[test]
fn the_final_rules_log_under_the_limit_and_count_the_rest() {
    let log = DropLog {
        group: 5730,
        per_second: 100,
        audit: false,
    };
    assert_eq!(final_rules(Direction::Ingress, None, "accept"), ["drop"]);
    assert_eq!(
        final_rules(Direction::Ingress, Some(&log), "accept"),
        [
            "limit name \"verdict_log\" log prefix \"podnet denied ingress\" group 5730 drop",
            "counter name \"verdict_log_suppressed\" drop",
        ]
    );
    let audit = DropLog { audit: true, ..log };
    assert_eq!(
        final_rules(Direction::Egress, Some(&audit), "return"),
        [
            "limit name \"verdict_log\" log prefix \"podnet audit egress\" group 5730 return",
            "counter name \"verdict_log_suppressed\" return",
        ]
    );
    assert_eq!(
        objects(&log),
        [
            "limit verdict_log { rate 100/second burst 100 packets }",
            "limit verdict_log_allowed { rate 100/second burst 100 packets }",
            "counter verdict_log_suppressed { }",
        ]
    );
}

#[test]
fn allowed_packets_log_under_their_own_limit_and_audit_mode_changes_nothing() {
    let log = DropLog {
        group: 5730,
        per_second: 100,
        audit: false,
    };
    let audit = DropLog { audit: true, ..log };
    for log in [log, audit] {
        assert_eq!(allowed_chain(Direction::Ingress), "allowed_ingress");
        assert_eq!(
            allowed_chain_rules(Direction::Ingress, &log, "accept"),
            [
                "limit name \"verdict_log_allowed\" log prefix \"podnet allowed ingress\" group 5730 accept",
                "counter name \"verdict_log_suppressed\" accept",
            ]
        );
        let rule = origin(Tier::Baseline, "dns", 1, Some("to-dns"));
        assert_eq!(
            allow_rules(Direction::Egress, &rule, &log, "return"),
            [
                "limit name \"verdict_log_allowed\" log prefix \"podnet allowed egress baseline 1 dns to-dns\" group 5730 return",
                "counter name \"verdict_log_suppressed\" return",
            ]
        );
    }
    let p = tier_prefix(
        Outcome::Allowed,
        Direction::Egress,
        &origin(Tier::Admin, "dns", 3, None),
    );
    assert_eq!(
        parse_prefix(&p),
        Ok(Logged {
            outcome: Outcome::Allowed,
            direction: Direction::Egress,
            origin: Some(origin(Tier::Admin, "dns", 3, None)),
        })
    );
}

fn origin(tier: Tier, policy: &str, index: usize, name: Option<&str>) -> Origin {
    Origin {
        tier,
        policy: policy.into(),
        index,
        name: name.map(str::to_string),
    }
}

#[test]
fn a_tier_prefix_names_the_rule_and_reads_back() {
    let deny = origin(Tier::Admin, "admin-deny-blue", 0, Some("deny-blue"));
    let p = tier_prefix(Outcome::Denied, Direction::Ingress, &deny);
    assert_eq!(p, "podnet denied ingress admin 0 admin-deny-blue deny-blue");
    let read = parse_prefix(&p).unwrap();
    assert_eq!(
        read,
        Logged {
            outcome: Outcome::Denied,
            direction: Direction::Ingress,
            origin: Some(deny),
        }
    );
    let unnamed = origin(Tier::Baseline, "baseline", 12, None);
    let p = tier_prefix(Outcome::Audit, Direction::Egress, &unnamed);
    assert_eq!(p, "podnet audit egress baseline 12 baseline");
    assert_eq!(parse_prefix(&p).unwrap().origin, Some(unnamed));
}

#[test]
fn a_tier_prefix_is_ascii_words_and_cut_to_the_kernels_limit() {
    // A rule name with spaces, quotes and more than ASCII: one safe word.
    let odd = origin(Tier::Admin, "p", 1, Some("deny \"blue\" ünï"));
    let p = tier_prefix(Outcome::Denied, Direction::Ingress, &odd);
    assert_eq!(p, "podnet denied ingress admin 1 p deny__blue___n_");
    // Too long: the rule name is cut first, then left out, then the policy's cut.
    let head = "podnet denied egress admin 3 ";
    let long_rule = origin(Tier::Admin, "policy", 3, Some(&"r".repeat(100)));
    let p = tier_prefix(Outcome::Denied, Direction::Egress, &long_rule);
    assert_eq!(p.len(), PREFIX_MAX, "{p}");
    assert!(p.starts_with(&format!("{head}policy rrr")), "{p}");
    assert!(p.ends_with("r~"), "{p}");
    let read = parse_prefix(&p).unwrap().origin.unwrap();
    assert_eq!(read.policy, "policy");
    assert_eq!(
        read.name.map(|n| n.len()),
        Some(PREFIX_MAX - head.len() - 7)
    );
    let long_policy = origin(Tier::Admin, &"p".repeat(253), 3, Some("rule"));
    let p = tier_prefix(Outcome::Denied, Direction::Egress, &long_policy);
    assert_eq!(p.len(), PREFIX_MAX, "{p}");
    assert!(p.ends_with("pp~"), "{p}");
    let read = parse_prefix(&p).unwrap().origin.unwrap();
    assert_eq!(
        (read.policy.len(), read.name),
        (PREFIX_MAX - head.len(), None)
    );
    // Room for a space and one byte of the name: a cut name of just `~` is left out.
    let fits = "p".repeat(PREFIX_MAX - head.len() - 2);
    let p = tier_prefix(
        Outcome::Denied,
        Direction::Egress,
        &origin(Tier::Admin, &fits, 3, Some("rule")),
    );
    assert_eq!(parse_prefix(&p).unwrap().origin.unwrap().name, None, "{p}");
}

#[test]
fn a_tier_deny_logs_like_the_final_drop_and_audit_lets_it_through() {
    let log = DropLog {
        group: 5730,
        per_second: 100,
        audit: false,
    };
    let deny = origin(Tier::Admin, "admin-deny-blue", 0, Some("deny-blue"));
    assert_eq!(
        deny_rules(Direction::Ingress, &deny, &log, "accept"),
        [
            "limit name \"verdict_log\" log prefix \"podnet denied ingress admin 0 admin-deny-blue deny-blue\" group 5730 drop",
            "counter name \"verdict_log_suppressed\" drop",
        ]
    );
    let audit = DropLog { audit: true, ..log };
    assert_eq!(
        deny_rules(Direction::Egress, &deny, &audit, "return"),
        [
            "limit name \"verdict_log\" log prefix \"podnet audit egress admin 0 admin-deny-blue deny-blue\" group 5730 return",
            "counter name \"verdict_log_suppressed\" return",
        ]
    );
}
