use super::*;
use crate::policy::view::Protocol::{Sctp, Tcp, Udp};

fn port(protocol: Protocol, spec: PortSpec) -> PortView {
    PortView::Port { protocol, spec }
}

fn no_names(_: Protocol, name: &str) -> Named {
    panic!("no named port expected, got {name}")
}

#[test]
fn ranges_are_merged_per_protocol() {
    let list = [
        port(Tcp, PortSpec::Range(8000, 8080)),
        port(Tcp, PortSpec::Range(80, 80)),
        port(Tcp, PortSpec::Range(8081, 8090)),
        port(Tcp, PortSpec::Range(8050, 8060)),
        port(Udp, PortSpec::Range(65535, 65535)),
        port(Udp, PortSpec::Range(65534, 65535)),
    ];
    assert_eq!(
        Ports::resolve(&list, no_names).matches(),
        [
            PortMatch::Ranges(Tcp, vec![(80, 80), (8000, 8090)]),
            PortMatch::Ranges(Udp, vec![(65534, 65535)])
        ]
    );
}

#[test]
fn a_whole_protocol_covers_its_ranges_and_names() {
    let list = [
        port(Sctp, PortSpec::Range(1, 2)),
        port(Sctp, PortSpec::Any),
        port(Sctp, PortSpec::Named("x".into())),
        port(Tcp, PortSpec::Named("x".into())),
    ];
    let got = Ports::resolve(&list, |p, _| Named::Set(format!("set_{}", p.nft_name()))).matches();
    assert_eq!(
        got,
        [
            PortMatch::Protocol(Sctp),
            PortMatch::Named(Tcp, "set_tcp".into())
        ]
    );
}

#[test]
fn nothing_resolved_is_no_match_at_all() {
    let list = [PortView::Nothing, port(Tcp, PortSpec::Named("gone".into()))];
    assert_eq!(
        Ports::resolve(&list, |_, _| Named::Numbers(vec![])).matches(),
        []
    );
}

#[test]
fn own_numbers_match_name_and_protocol() {
    let mut pod = PodView::default();
    pod.ports.push(crate::policy::view::NamedPort {
        name: "dns".into(),
        protocol: Udp,
        number: 53,
    });
    assert_eq!(own(&pod, Udp, "dns"), Named::Numbers(vec![53]));
    assert_eq!(own(&pod, Tcp, "dns"), Named::Numbers(vec![]));
    assert_eq!(own(&pod, Udp, "http"), Named::Numbers(vec![]));
    let list = [
        port(Udp, PortSpec::Named("dns".into())),
        port(Tcp, PortSpec::Range(1, 1)),
    ];
    assert_eq!(names(&list).collect::<Vec<_>>(), [(0, Udp, "dns")]);
}
