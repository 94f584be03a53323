//! `NetConf::parse` (the stdin config of every verb) and `version_reply`.
//!
//! Input: the first byte picks the verb, the rest is stdin.

#![no_main]

use libfuzzer_sys::fuzz_target;
use podnet::cni::{CniError, Command, NetConf, is_supported, is_valid_id, version_reply};

const COMMANDS: [Command; 6] = [
    Command::Add,
    Command::Del,
    Command::Check,
    Command::Status,
    Command::Gc,
    Command::Version,
];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, stdin)) = data.split_first() else {
        return;
    };
    let command = COMMANDS[sel as usize % COMMANDS.len()];

    match NetConf::parse(stdin, command) {
        Ok(conf) => {
            assert!(is_supported(&conf.cni_version), "{conf:?}");
            assert!(is_valid_id(&conf.name), "{conf:?}");
            assert!(!conf.plugin_type.is_empty(), "{conf:?}");
            assert!(conf.raw.is_object());
            assert!(conf.ipam.as_ref().is_none_or(|v| v.is_object()));
            if let Some(prev) = &conf.prev_result {
                assert!(!prev.cni_version.is_empty(), "{conf:?}");
                // The plugin renders prevResult-derived results in the
                // config's version; that must not panic.
                let _ = prev.to_json(&conf.cni_version);
            }
            match (&conf.valid_attachments, command) {
                (Some(list), Command::Gc) => assert!(
                    list.iter()
                        .all(|a| !a.container_id.is_empty() && !a.ifname.is_empty())
                ),
                (Some(_), _) => panic!("valid_attachments set for {command}"),
                (None, _) => {}
            }
        }
        Err(e) => {
            assert!(
                [
                    CniError::INCOMPATIBLE_VERSION,
                    CniError::DECODE_FAILURE,
                    CniError::INVALID_NETWORK_CONFIG
                ]
                .contains(&e.code),
                "unexpected code {e:?}"
            );
            // What the plugin prints on stdout must be JSON.
            let out: serde_json::Value = serde_json::from_str(&e.to_json("1.1.0")).unwrap();
            assert_eq!(out["code"], e.code);
        }
    }

    if command == Command::Version {
        match version_reply(stdin) {
            Ok(reply) => {
                let v: serde_json::Value = serde_json::from_str(&reply).unwrap();
                assert!(v["cniVersion"].as_str().is_some_and(|s| !s.is_empty()));
                assert!(v["supportedVersions"].is_array());
            }
            Err(e) => assert_eq!(e.code, CniError::DECODE_FAILURE, "{e:?}"),
        }
    }
});
