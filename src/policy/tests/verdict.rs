use super::*;

#[test]
fn each_prefix_reads_back_as_its_outcome_and_direction() {
    for outcome in [Outcome::Denied, Outcome::Audit] {
        for direction in [Direction::Ingress, Direction::Egress] {
            let p = prefix(outcome, direction);
            assert!(p.len() < 64, "nft's prefix limit: {p}");
            assert_eq!(parse_prefix(&p), Ok((outcome, direction)));
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
        "podnet allowed ingress",
        "podnet denied sideways",
        "podnet denied ingress extra",
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
            "counter verdict_log_suppressed { }",
        ]
    );
}
