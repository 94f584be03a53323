//! `CniArgs::parse` and `CniEnv::from_lookup`.
//!
//! Input: NUL-separated values of CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS,
//! CNI_IFNAME, CNI_ARGS, CNI_PATH (missing fields are unset). `CniArgs::parse`
//! also gets the whole input as one string.

#![no_main]

use libfuzzer_sys::fuzz_target;
use podnet::cni::{CniArgs, CniEnv, CniError, is_valid_id};

const KEYS: [&str; 6] = [
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
];

fn check_args(s: &str) {
    match CniArgs::parse(s) {
        Ok(a) => {
            for (key, v) in [
                ("K8S_POD_NAMESPACE", &a.pod_namespace),
                ("K8S_POD_NAME", &a.pod_name),
                ("K8S_POD_UID", &a.pod_uid),
                ("K8S_POD_INFRA_CONTAINER_ID", &a.pod_infra_container_id),
            ] {
                if let Some(v) = v {
                    assert!(!v.is_empty() && !v.contains(';') && !v.contains('='));
                    assert!(
                        s.contains(&format!("{key}={v}")),
                        "{key}={v:?} not in {s:?}"
                    );
                }
            }
            let _ = a.owner("cid");
        }
        Err(e) => assert_eq!(e.code, CniError::INVALID_ENV, "{e:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    check_args(s);

    let fields: Vec<&str> = s.split('\0').collect();
    let lookup = |k: &str| {
        KEYS.iter()
            .position(|x| *x == k)
            .and_then(|i| fields.get(i))
            .map(|v| v.to_string())
    };
    match CniEnv::from_lookup(lookup) {
        Ok(env) => {
            if env.command.is_per_attachment() {
                let cid = env.container_id.as_deref().expect("container id");
                assert!(is_valid_id(cid), "{env:?}");
                let ifname = env.ifname.as_deref().expect("ifname");
                assert!(!ifname.is_empty() && ifname.len() <= 15, "{env:?}");
            } else {
                assert!(env.container_id.is_none() && env.ifname.is_none());
            }
            assert!(env.path.iter().all(|p| !p.as_os_str().is_empty()));
        }
        Err(e) => assert!(
            [CniError::INVALID_ENV, CniError::UNKNOWN_CONTAINER].contains(&e.code),
            "{e:?}"
        ),
    }
});
