//! Names, MACs, netns handling, sysctls and error plumbing.

use sha2::{Digest, Sha256};

use super::{in_private_netns, new_netns, root};
use crate::datapath::*;

#[test]
fn host_ifname_golden() {
    // echo -n "abc:eth0" | sha256sum → b133159de544...
    assert_eq!(host_ifname("abc", "eth0"), "lxcb133159de544");
    let cid = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    assert_eq!(host_ifname(cid, "eth0"), "lxcbf46857248e3");
    // Same rule, computed independently.
    let hex: String = Sha256::digest(format!("{cid}:net1"))
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let name = host_ifname(cid, "net1");
    assert_eq!(name, format!("lxc{}", &hex[..12]));
    assert_eq!(name.len(), IFNAME_MAX_LEN);
    validate_ifname(&name).unwrap();
}

#[test]
fn ifb_ifname_shares_the_host_links_hash() {
    assert_eq!(ifb_ifname("abc", "eth0"), "ifbb133159de544");
    let cid = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    assert_eq!(ifb_ifname(cid, "eth0"), "ifbbf46857248e3");
    assert_eq!(ifb_ifname(cid, "eth0").len(), IFNAME_MAX_LEN);
    assert_ne!(ifb_ifname(cid, "eth0"), ifb_ifname(cid, "net1"));
    assert_eq!(
        host_link_of_ifb(&ifb_ifname(cid, "eth0")),
        Some(host_ifname(cid, "eth0"))
    );
    assert_eq!(
        ifb_of_host_link(&host_ifname(cid, "eth0")),
        Some(ifb_ifname(cid, "eth0"))
    );
    for not_ours in ["lxc0", "lxcbf46857248e3x", "ifbbf46857248e3", "podnet_host"] {
        assert_eq!(ifb_of_host_link(not_ours), None, "{not_ours}");
    }
    for not_ours in [
        "ifb0",
        "ifbbf46857248e",
        "ifbbf46857248e3x",
        "ifbBF46857248E3",
        "lxcbf46857248e3",
        "ifbbf46857248g3",
    ] {
        assert_eq!(host_link_of_ifb(not_ours), None, "{not_ours}");
    }
}

#[test]
fn ifname_validation() {
    validate_ifname("eth0").unwrap();
    validate_ifname("eth0.100").unwrap();
    for bad in ["", "0123456789abcdef", "a/b", "a b", ".", "..", "a:b"] {
        let e = validate_ifname(bad).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EINVAL), "{bad:?}");
    }
}

#[test]
fn random_mac_is_local_unicast() {
    let a = random_mac().unwrap();
    let b = random_mac().unwrap();
    assert_ne!(a, b);
    for m in [a, b] {
        assert_eq!(m[0] & 0x01, 0, "unicast");
        assert_eq!(m[0] & 0x02, 0x02, "locally administered");
    }
    assert_eq!(
        format_mac(&[0x02, 0, 0xab, 1, 2, 0xff]),
        "02:00:ab:01:02:ff"
    );
}

#[test]
fn netns_open_errors() {
    let e = NetNs::open("/run/netns/podnet-test-does-not-exist").unwrap_err();
    assert!(matches!(e, DatapathError::NetNsNotFound { .. }), "{e}");
    assert_eq!(e.errno(), Some(libc::ENOENT));
    assert!(e.is_not_found());
    let e = NetNs::open("/proc/version").unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINVAL), "{e}");
    let cur = NetNs::current().unwrap();
    assert_eq!(cur.label(), THREAD_SELF_NETNS);
}

#[test]
fn in_netns_keeps_caller_namespace() {
    if !root("in_netns_keeps_caller_namespace") {
        return;
    }
    in_private_netns(|| {
        let before = NetNs::current().unwrap().id().unwrap();
        let pod = new_netns("pod-a");
        let pod_id = pod.id().unwrap();
        assert_ne!(before, pod_id);
        let inside = in_netns(&pod, || NetNs::current()?.id()).unwrap();
        assert_eq!(inside, pod_id);
        assert_eq!(NetNs::current().unwrap().id().unwrap(), before);
        // Errors from the closure come back unchanged.
        let e = in_netns(&pod, || -> Result<()> {
            Err(DatapathError::Invalid("boom".into()))
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "boom");
        // A panic in the closure becomes an error, not a crash.
        let e = in_netns(&pod, || -> Result<()> { panic!("inside") }).unwrap_err();
        assert!(matches!(e, DatapathError::ThreadPanicked { .. }), "{e}");
    });
}

#[test]
fn sysctl_follows_calling_thread_netns() {
    if !root("sysctl_follows_calling_thread_netns") {
        return;
    }
    let machine_fwd = read_sysctl("net/ipv4/ip_forward").unwrap();
    let before = machine_fwd.clone();
    in_private_netns(move || {
        let want = if machine_fwd == "1" { "0" } else { "1" };
        assert!(write_sysctl("net/ipv4/ip_forward", want).unwrap());
        assert!(!write_sysctl("/proc/sys/net/ipv4/ip_forward", want).unwrap());
        assert_eq!(read_sysctl("net/ipv4/ip_forward").unwrap(), want);
        // The plain write, here and back.
        set_sysctl("net/ipv4/ip_forward", &machine_fwd).unwrap();
        assert_eq!(read_sysctl("net/ipv4/ip_forward").unwrap(), machine_fwd);
        set_sysctl("net/ipv4/ip_forward", want).unwrap();
        assert_eq!(read_sysctl("net/ipv4/ip_forward").unwrap(), want);

        let pod = new_netns("pod-sysctl");
        let dad = "net/ipv6/conf/default/accept_dad";
        let host_dad = read_sysctl(dad).unwrap();
        let written = in_netns(&pod, || {
            let w = write_sysctl(dad, "0")?;
            Ok((w, read_sysctl(dad)?))
        })
        .unwrap();
        assert_eq!(written.1, "0");
        assert_eq!(read_sysctl(dad).unwrap(), host_dad, "host netns unaffected");
    });
    assert_eq!(read_sysctl("net/ipv4/ip_forward").unwrap(), before);
}

#[test]
fn sysctl_rejects_escapes() {
    for bad in ["", "net/../../etc/passwd", "net//ipv4", "/proc/sys/"] {
        let e = read_sysctl(bad).unwrap_err();
        assert!(matches!(e, DatapathError::Invalid(_)), "{bad:?}: {e}");
        let e = set_sysctl(bad, "1").unwrap_err();
        assert!(matches!(e, DatapathError::Invalid(_)), "{bad:?}: {e}");
    }
    let e = set_sysctl("net/ipv4/podnet_no_such_sysctl", "1").unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert!(
        e.to_string()
            .starts_with("writing \"1\" to sysctl /proc/sys/net/ipv4/podnet_no_such_sysctl: "),
        "{e}"
    );
    let e = read_sysctl("net/ipv4/podnet_no_such_sysctl").unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOENT));
    assert!(
        e.to_string()
            .starts_with("reading sysctl /proc/sys/net/ipv4/podnet_no_such_sysctl: ")
    );
}
