//! Installing the way a DaemonSet does: the atomic binary install, the CNI config
//! written only once the daemon serves (with `cni-exclusive`) and removed as it
//! stops (with `cni-uninstall`), and the `deploy/` manifest checked against what
//! the binary accepts.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::harness::*;

#[test]
fn install_copies_the_binary_atomically() {
    let dir = std::env::temp_dir().join(format!("podnet-install-{}", unique("")));
    let out = Command::new(podnet_bin())
        .args(["install", "--cni-bin-dir"])
        .arg(&dir)
        .output()
        .expect("install");
    assert!(out.status.success(), "{out:?}");
    let dest = dir.join("podnet");
    assert_eq!(
        std::fs::read(&dest).expect("dest"),
        std::fs::read(podnet_bin()).expect("src")
    );
    assert_eq!(
        std::fs::metadata(&dest).expect("meta").permissions().mode() & 0o777,
        0o755
    );
    let names: Vec<String> = std::fs::read_dir(&dir)
        .expect("dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(
        names,
        vec!["podnet".to_string()],
        "no temporary file may be left"
    );
    // The installed copy works as a plugin.
    let v = Command::new(&dest)
        .env("CNI_COMMAND", "VERSION")
        .output()
        .expect("version");
    assert!(String::from_utf8_lossy(&v.stdout).contains("supportedVersions"));
    std::fs::remove_dir_all(dir).expect("cleanup");
}

#[test]
fn the_cni_config_is_written_once_the_daemon_serves() {
    if !root_or_skip("write_cni_conf") {
        return;
    }
    let probe = Node::dual_stack();
    let confdir = probe.dir.join("net.d");
    std::fs::create_dir_all(&confdir).expect("mkdir");
    std::fs::write(confdir.join("10-other.conflist"), "{}").expect("write");
    let cd = confdir.display().to_string();
    let node = Node::start(&[
        "--k8s-node-name",
        "conf",
        "--write-cni-conf-when-ready",
        &cd,
        "--cni-exclusive",
    ]);
    let conf = confdir.join("05-podnet.conflist");
    assert_eq!(
        std::fs::metadata(&conf)
            .expect("conflist")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert!(confdir.join("10-other.conflist.podnet_bak").exists());
    assert!(!confdir.join("10-other.conflist").exists());
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&conf).expect("read")).expect("json");
    assert_eq!(v["plugins"][0]["type"], "podnet");
    assert_eq!(
        v["plugins"][0]["socket-path"],
        node.socket().display().to_string()
    );
    // The written plugin config works as it is, at the version a runtime without
    // `cniVersions` support (libcni < 1.2, containerd 1.6) uses.
    assert_eq!(v["cniVersion"], "1.0.0");
    let mut plugin_conf = v["plugins"][0].clone();
    plugin_conf["cniVersion"] = v["cniVersion"].clone();
    plugin_conf["name"] = v["name"].clone();
    let a = node.sandbox();
    let r = node.plugin("ADD", Some(&a), &plugin_conf.to_string(), &[]);
    assert!(r.ok, "{r:?}");
    drop(probe);
}

/// `--cni-uninstall`: the config and podnet's masquerade and source check tables
/// go when the daemon stops on SIGTERM; without it, they stay (an agent restart keeps the
/// node usable and its pods' traffic masqueraded).
#[test]
fn cni_uninstall_removes_the_config_and_podnets_tables_when_the_daemon_stops() {
    if !root_or_skip("cni_uninstall") {
        return;
    }
    for uninstall in [true, false] {
        let probe = Node::dual_stack();
        let confdir = probe.dir.join("net.d");
        let cd = confdir.display().to_string();
        let mut args = vec![
            "--k8s-node-name",
            "conf",
            "--write-cni-conf-when-ready",
            &cd,
            "--enable-ipv4-masquerade",
        ];
        if uninstall {
            args.push("--cni-uninstall");
        }
        let mut node = Node::start(&args);
        let conf = confdir.join("05-podnet.conflist");
        assert!(conf.exists(), "written once the daemon serves");
        let table = |node: &Node| node.ns.exec(&["nft", "list", "table", "ip", "podnet"]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !table(&node).status.success() {
            assert!(
                std::time::Instant::now() < deadline,
                "no masquerade table; log:\n{}",
                node.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        node.stop_daemon(false);
        assert_eq!(
            conf.exists(),
            !uninstall,
            "after SIGTERM with cni-uninstall={uninstall}; log:\n{}",
            node.log()
        );
        assert_eq!(
            table(&node).status.success(),
            !uninstall,
            "the masquerade table after SIGTERM with cni-uninstall={uninstall}; log:\n{}",
            node.log()
        );
        assert_eq!(
            node.ns
                .exec(&["nft", "list", "table", "inet", "podnet_source"])
                .status
                .success(),
            !uninstall,
            "the source check table after SIGTERM with cni-uninstall={uninstall}; log:\n{}",
            node.log()
        );
        drop(probe);
    }
}

#[test]
fn the_daemonset_manifest_matches_what_the_binary_accepts() {
    let text =
        std::fs::read_to_string(repo_path("deploy/podnet.yaml")).expect("deploy/podnet.yaml");
    let docs: Vec<serde_json::Value> = text
        .split("\n---")
        .map(|d| serde_yaml_ng::from_str::<serde_json::Value>(d).expect("yaml document"))
        .collect();
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("ConfigMap");
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("DaemonSet");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true);
    let agent = &spec["containers"][0];
    // Least privilege (docs/least-privilege.md): CAP_NET_ADMIN and CAP_NET_RAW only, for the agent;
    // none for the init container; read-only roots, the runtime's seccomp profile.
    assert_eq!(
        spec["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    for (c, add) in [
        (agent, vec!["NET_ADMIN", "NET_RAW"]),
        (&spec["initContainers"][0], vec![]),
    ] {
        let sc = &c["securityContext"];
        assert!(sc["privileged"].is_null(), "{c}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{c}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{c}");
        assert_eq!(
            sc["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{c}"
        );
        assert_eq!(strings_of(&sc["capabilities"]["add"]), add, "{c}");
    }
    // Every mount the commands rely on is there.
    let mounts = |c: &serde_json::Value| -> Vec<String> {
        c["volumeMounts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|m| m["mountPath"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let host_paths: Vec<String> = spec["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str().map(str::to_string))
        .collect();
    for p in [
        "/opt/cni/bin",
        "/etc/cni/net.d",
        "/run/podnet",
        "/proc/sys/net",
    ] {
        assert!(host_paths.contains(&p.to_string()), "hostPath {p} missing");
    }
    let init = &spec["initContainers"][0];
    let init_cmd = strings_of(&init["command"]);
    assert_eq!(&init_cmd[1..3], ["install", "--cni-bin-dir"]);
    assert!(
        mounts(init).contains(&init_cmd[3]),
        "install target {} is not mounted",
        init_cmd[3]
    );
    // The agent's flags and every ConfigMap key parse as daemon options.
    let mut args = strings_of(&agent["args"]);
    let config_dir = args
        .iter()
        .find_map(|a| a.strip_prefix("--config-dir=").map(str::to_string))
        .expect("--config-dir");
    assert!(mounts(agent).contains(&config_dir));
    for flag in [
        "--socket=/run/podnet/",
        "--write-cni-conf-when-ready=/host/etc/cni/net.d",
        "--cni-bin-dir=/host/opt/cni/bin",
    ] {
        let a = args
            .iter()
            .find(|a| a.starts_with(flag))
            .unwrap_or_else(|| panic!("{flag} missing"));
        let path = a.split('=').nth(1).unwrap_or("");
        assert!(
            mounts(agent).iter().any(|m| path.starts_with(m.as_str())),
            "{path} not under a mount"
        );
    }
    // The sysctls go to the host's /proc/sys/net, mounted under --procfs.
    let procfs = args
        .iter()
        .find_map(|a| a.strip_prefix("--procfs="))
        .expect("--procfs");
    assert!(mounts(agent).contains(&format!("{procfs}/sys/net")));
    args.retain(|a| !a.starts_with("--config-dir"));
    // The operator's own options live in the same ConfigMap (each binary reads
    // the files it knows from its --config-dir).
    let operator_only = ["cluster-pool-extra-cidrs-max"];
    for (k, v) in cm["data"].as_object().expect("data") {
        if !operator_only.contains(&k.as_str()) {
            args.push(format!("--{k}={}", v.as_str().unwrap_or("")));
        }
    }
    let parsed = podnet::daemon::options::DaemonOptions::parse_with_config_dir(&args);
    assert!(parsed.is_ok(), "{:?}", parsed.err().map(|e| e.to_string()));
    let readiness = strings_of(&agent["readinessProbe"]["exec"]["command"]);
    assert_eq!(readiness[1], "status");
}

/// The strings of a YAML/JSON list (none if it is not one).
fn strings_of(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}
