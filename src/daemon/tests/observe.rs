use std::time::{Duration, UNIX_EPOCH};

use serde_json::json;

use super::*;
use crate::datapath::nflog::Transport;
use crate::policy::Enforcement;
use crate::policy::fixtures::{ip, pod, policy};
use crate::policy::verdict::Outcome;

/// web (10.0.0.2, local) is selected for ingress by deny-a and deny-b, for
/// egress by egress-only; client (10.0.0.1) is a pod elsewhere.
fn names(enforcement: Enforcement) -> Names {
    let mut explanations = Explanations::new(enforcement);
    let ingress = json!({"podSelector": {}, "policyTypes": ["Ingress"]});
    let egress = json!({"podSelector": {}, "policyTypes": ["Egress"]});
    let (a, b) = (
        policy("default", "deny-a", ingress.clone()),
        policy("default", "deny-b", ingress),
    );
    let e = policy("default", "egress-only", egress);
    let web = pod("default", "web", &[], &["10.0.0.2"]);
    explanations.record(&web, &[&a, &b, &e], &[], true);
    let lonely = pod("default", "lonely", &[], &["10.0.0.3"]);
    explanations.record(&lonely, &[], &[], true);
    Names {
        pods: HashMap::from([
            (ip("10.0.0.1"), "default/client".to_string()),
            (ip("10.0.0.2"), "default/web".to_string()),
            (ip("10.0.0.3"), "default/lonely".to_string()),
        ]),
        explanations: Arc::new(explanations),
    }
}

fn packet(source: &str, destination: &str) -> Packet {
    Packet {
        source: ip(source),
        destination: ip(destination),
        transport: Transport::Tcp,
        port: Some(80),
    }
}

/// What a final drop's prefix says.
fn final_drop(outcome: Outcome, direction: Direction) -> Logged {
    Logged {
        outcome,
        direction,
        origin: None,
    }
}

const T: Duration = Duration::from_millis(1_796_623_200_500);

#[test]
fn a_denied_packet_names_both_pods_and_the_policies_that_isolate_the_local_one() {
    let names = names(Enforcement::Default);
    let line = describe(
        UNIX_EPOCH + T,
        &final_drop(Outcome::Denied, Direction::Ingress),
        &packet("10.0.0.1", "10.0.0.2"),
        &names,
    );
    assert_eq!(
        line,
        ObservedVerdict {
            time: "2026-12-07T06:00:00.5Z".into(),
            source: "default/client".into(),
            destination: "default/web".into(),
            protocol: "TCP".into(),
            port: Some(80),
            direction: "ingress".into(),
            verdict: "denied".into(),
            policy: "default deny of NetworkPolicies default/deny-a, default/deny-b".into(),
        }
    );
    // Egress: the local pod is the source; an address no pod has stays one.
    let line = describe(
        UNIX_EPOCH + T,
        &final_drop(Outcome::Audit, Direction::Egress),
        &packet("10.0.0.2", "192.0.2.9"),
        &names,
    );
    assert_eq!(
        (line.source.as_str(), line.destination.as_str()),
        ("default/web", "192.0.2.9")
    );
    assert_eq!(line.verdict, "audit");
    assert_eq!(
        line.policy,
        "default deny of NetworkPolicy default/egress-only"
    );
}

#[test]
fn a_pod_no_policy_selects_is_isolated_by_the_enforcement_or_not_known_yet() {
    let p = packet("10.0.0.1", "10.0.0.3");
    let d = |names: &Names| {
        describe(
            UNIX_EPOCH,
            &final_drop(Outcome::Denied, Direction::Ingress),
            &p,
            names,
        )
    };
    assert_eq!(
        d(&names(Enforcement::Always)).policy,
        "default deny of --enable-policy always"
    );
    assert_eq!(
        d(&Names::default()).policy,
        "default deny of a pod chain (its policies not known yet)"
    );
    assert_eq!(d(&Names::default()).destination, "10.0.0.3");
}

#[test]
fn an_allowed_packet_names_the_policies_whose_rules_let_it_in_or_the_tier_rule() {
    let names = names(Enforcement::Default);
    let allowed = |direction, origin, packet: &Packet| {
        let logged = Logged {
            outcome: Outcome::Allowed,
            direction,
            origin,
        };
        describe(UNIX_EPOCH, &logged, packet, &names)
    };
    let to_web = packet("10.0.0.1", "10.0.0.2");
    let line = allowed(Direction::Ingress, None, &to_web);
    assert_eq!(line.verdict, "allowed");
    assert_eq!(
        line.policy,
        "one of NetworkPolicies default/deny-a, default/deny-b"
    );
    let from_web = packet("10.0.0.2", "10.0.0.1");
    assert_eq!(
        allowed(Direction::Egress, None, &from_web).policy,
        "NetworkPolicy default/egress-only"
    );
    assert_eq!(
        allowed(Direction::Ingress, None, &packet("10.0.0.1", "10.0.0.9")).policy,
        "a NetworkPolicy (its name not known yet)"
    );
    let rule = Origin {
        tier: Tier::Baseline,
        policy: "dns".into(),
        index: 1,
        name: Some("to-dns".into()),
    };
    assert_eq!(
        allowed(Direction::Egress, Some(rule), &from_web).policy,
        "ClusterNetworkPolicy dns (Baseline tier, egress rule 1 \"to-dns\")"
    );
}

#[test]
fn allowed_lines_pass_the_filter_only_when_asked_for() {
    let denied = describe(
        UNIX_EPOCH,
        &final_drop(Outcome::Denied, Direction::Ingress),
        &packet("10.0.0.1", "10.0.0.2"),
        &names(Enforcement::Default),
    );
    let allowed = ObservedVerdict {
        verdict: "allowed".into(),
        ..denied.clone()
    };
    let filter = |pairs: &[(&str, &str)]| Filter::from_query(&query(pairs)).unwrap();
    let admitted = |f: &Filter| [f.admits(&denied), f.admits(&allowed)];
    assert_eq!(admitted(&filter(&[])), [true, false]);
    assert_eq!(admitted(&filter(&[("allowed", "false")])), [true, false]);
    assert_eq!(admitted(&filter(&[("allowed", "true")])), [true, true]);
    assert_eq!(admitted(&filter(&[("verdict", "allowed")])), [false, true]);
    assert_eq!(
        admitted(&filter(&[("verdict", "denied"), ("allowed", "true")])),
        [true, false]
    );
}

fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_filter_admits_lines_by_namespace_pod_and_verdict() {
    let line = describe(
        UNIX_EPOCH,
        &final_drop(Outcome::Denied, Direction::Ingress),
        &packet("10.0.0.1", "10.0.0.2"),
        &names(Enforcement::Default),
    );
    let admits = |pairs: &[(&str, &str)]| Filter::from_query(&query(pairs)).unwrap().admits(&line);
    assert!(admits(&[]));
    assert!(admits(&[("namespace", "default")]));
    assert!(admits(&[("pod", "web")]));
    assert!(admits(&[("pod", "client"), ("namespace", "default")]));
    assert!(admits(&[("verdict", "denied")]));
    assert!(
        admits(&[("namespace", ""), ("pod", "")]),
        "empty is no filter"
    );
    assert!(!admits(&[("namespace", "kube-system")]));
    assert!(!admits(&[("pod", "other")]));
    assert!(!admits(&[("pod", "web"), ("namespace", "kube-system")]));
    assert!(!admits(&[("verdict", "audit")]));
    let external = ObservedVerdict {
        source: "192.0.2.9".into(),
        destination: "192.0.2.10".into(),
        ..line
    };
    let f = Filter::from_query(&query(&[("namespace", "default")])).unwrap();
    assert!(!f.admits(&external), "addresses are in no namespace");
}

#[test]
fn a_filter_that_cannot_match_is_refused_naming_its_field() {
    let refused =
        |pairs: &[(&str, &str)]| Filter::from_query(&query(pairs)).unwrap_err().to_string();
    assert_eq!(
        refused(&[("verdict", "accepted")]),
        "observe: verdict \"accepted\" is not one of denied, audit, allowed"
    );
    assert_eq!(
        refused(&[("allowed", "yes")]),
        "observe: allowed \"yes\" is not one of true, false"
    );
    assert_eq!(
        refused(&[("namespace", "Default")]),
        "observe: namespace \"Default\" is not a Kubernetes name"
    );
    assert_eq!(
        refused(&[("pod", "a/b")]),
        "observe: pod \"a/b\" is not a Kubernetes name"
    );
}

fn verdicts() -> Verdicts {
    Verdicts::new(Family::default(), Counter::default(), Counter::default())
}

fn record(prefix: &str) -> nflog::Record {
    // IPv4 TCP 10.0.0.1 -> 10.0.0.2, port 80.
    let mut payload = vec![
        0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ];
    payload.extend_from_slice(&[0x9c, 0x40, 0, 80]);
    nflog::Record {
        prefix: prefix.into(),
        time: None,
        payload,
    }
}

#[tokio::test]
async fn each_record_is_counted_and_reaches_every_observer_that_admits_it() {
    let v = verdicts();
    v.set_names(names(Enforcement::Default));
    let all = lines(&v, Filter::default());
    let audits = lines(
        &v,
        Filter {
            verdict: Some("audit".into()),
            ..Filter::default()
        },
    );
    v.take(&record("podnet denied ingress"));
    v.take(&record("podnet audit ingress"));
    v.take(&record("someone else's"));
    v.take(&nflog::Record {
        payload: vec![0x45],
        ..record("podnet denied ingress")
    });
    drop(v.lines.clone());
    let text = |frame: Result<Frame<Bytes>, Infallible>| {
        let data = frame.unwrap().into_data().unwrap();
        serde_json::from_slice::<ObservedVerdict>(&data).unwrap()
    };
    let mut all = Box::pin(all);
    assert_eq!(text(all.next().await.unwrap()).verdict, "denied");
    assert_eq!(text(all.next().await.unwrap()).verdict, "audit");
    let mut audits = Box::pin(audits);
    assert_eq!(text(audits.next().await.unwrap()).verdict, "audit");
    assert_eq!(v.unreadable.get(), 2);
    let labels = VerdictLabels {
        direction: "ingress".into(),
        verdict: "denied".into(),
        policy: "default deny of NetworkPolicies default/deny-a, default/deny-b".into(),
    };
    assert_eq!(v.counts.get_or_create(&labels).get(), 1);
}

#[tokio::test]
async fn a_slow_observer_loses_the_oldest_lines_counted_and_never_holds_the_reader() {
    let v = verdicts();
    let mut slow = Box::pin(lines(&v, Filter::default()));
    for _ in 0..BUFFERED + 10 {
        v.take(&record("podnet denied ingress"));
    }
    assert!(slow.next().await.is_some());
    assert_eq!(v.lost.get(), 10);
}

#[test]
fn a_tier_deny_names_the_cluster_network_policy_its_tier_and_rule() {
    let names = names(Enforcement::Default);
    let logged =
        verdict::parse_prefix("podnet denied ingress admin 0 admin-deny-blue deny-blue").unwrap();
    let line = describe(UNIX_EPOCH, &logged, &packet("10.0.0.1", "10.0.0.2"), &names);
    assert_eq!(
        line.policy,
        "ClusterNetworkPolicy admin-deny-blue (Admin tier, ingress rule 0 \"deny-blue\")"
    );
    assert_eq!(line.verdict, "denied");
    let logged = verdict::parse_prefix("podnet audit egress baseline 3 baseline-deny").unwrap();
    let line = describe(UNIX_EPOCH, &logged, &packet("10.0.0.2", "10.0.0.1"), &names);
    assert_eq!(
        line.policy,
        "ClusterNetworkPolicy baseline-deny (Baseline tier, egress rule 3)"
    );
    assert_eq!(line.verdict, "audit");
}

#[test]
fn the_suppressed_total_never_goes_back_when_the_kernel_counter_starts_again() {
    let mut count = SuppressedCount::default();
    assert_eq!(count.take(0), 0);
    assert_eq!(count.take(40), 40);
    assert_eq!(count.take(40), 40, "nothing new");
    assert_eq!(count.take(55), 55);
    // The table was installed again: its counter restarted, then counted 5.
    assert_eq!(count.take(5), 60);
    assert_eq!(count.take(7), 62);
    assert_eq!(count.take(u64::MAX), u64::MAX, "saturates, never wraps");
    assert_eq!(count.take(1), u64::MAX);
}
