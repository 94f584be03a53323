//! charts/podnet with the real helm binary (scripts/k8s-binaries builds it): the
//! defaults render deploy/ exactly (scripts/render-deploy --check); a Cilium 1.20
//! values file (fixtures/cilium-values.yaml) renders with podnet's ConfigMap keys,
//! the operator and the DaemonSet set from it, and lists the Cilium values podnet
//! ignores; and each kind of bad value (a wrong type, an IPAM mode podnet does not
//! run, a CIDR that does not parse, an unsafe value podnet does not implement)
//! fails `helm template` with a message naming the value. No cluster.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_yaml_ng::Value;

use crate::harness::*;
use crate::k8s::bin_dir;

/// The helm binary: `PODNET_HELM`, else scripts/k8s-binaries' bin/helm. None (the
/// test failed, or skipped under PODNET_ALLOW_SKIPS) when it is missing.
pub fn helm_or_skip(test: &str) -> Option<PathBuf> {
    let helm = match std::env::var_os("PODNET_HELM") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => bin_dir().join("helm"),
    };
    if helm.is_file() {
        return Some(helm);
    }
    skip(
        test,
        &format!(
            "no helm binary at {} (scripts/k8s-binaries builds it; or set PODNET_HELM)",
            helm.display()
        ),
    );
    None
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

/// `helm template podnet charts/podnet --namespace kube-system` with `args`.
fn template(helm: &Path, args: &[&str]) -> Output {
    Command::new(helm)
        .args(["template", "podnet"])
        .arg(repo_path("charts/podnet"))
        .args(["--namespace", "kube-system"])
        .args(args)
        .output()
        .expect("running helm template")
}

/// The rendered documents, by kind and name.
fn documents(rendered: &str) -> Vec<Value> {
    rendered
        .split("\n---\n")
        .filter_map(|doc| serde_yaml_ng::from_str::<Value>(doc).ok())
        .filter(|v| v.get("kind").is_some())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered chart"))
}

#[test]
fn the_charts_defaults_render_deploy() {
    let Some(helm) = helm_or_skip("the_charts_defaults_render_deploy") else {
        return;
    };
    let out = Command::new("bash")
        .arg(repo_path("scripts/render-deploy"))
        .arg("--check")
        .env("PODNET_HELM", &helm)
        .output()
        .expect("running scripts/render-deploy");
    assert!(
        out.status.success(),
        "deploy/ is not charts/podnet rendered with its defaults:\n{}",
        text(&out)
    );
    let lint = Command::new(&helm)
        .args(["lint", "--strict"])
        .arg(repo_path("charts/podnet"))
        .output()
        .expect("running helm lint");
    assert!(lint.status.success(), "helm lint: {}", text(&lint));
}

#[test]
fn a_cilium_values_file_sets_podnets_options() {
    let Some(helm) = helm_or_skip("a_cilium_values_file_sets_podnets_options") else {
        return;
    };
    let values = repo_path("integration/fixtures/cilium-values.yaml");
    let out = template(&helm, &["-f", &values.to_string_lossy()]);
    assert!(
        out.status.success(),
        "helm template -f {values:?}: {}",
        text(&out)
    );
    let rendered = String::from_utf8_lossy(&out.stdout).to_string();
    let docs = documents(&rendered);
    let data = &find(&docs, "ConfigMap", "podnet-config")["data"];
    let expected = [
        ("ipam", "cluster-pool"),
        ("enable-ipv4", "true"),
        ("enable-ipv6", "true"),
        ("cluster-pool-ipv4-cidr", "10.42.0.0/16 10.43.0.0/16"),
        ("cluster-pool-ipv4-mask-size", "25"),
        ("cluster-pool-ipv6-cidr", "fd00:42::/104"),
        ("cluster-pool-ipv6-mask-size", "120"),
        ("routing-mode", "native"),
        ("auto-direct-node-routes", "true"),
        ("ipv4-native-routing-cidr", "10.42.0.0/15"),
        ("ipv6-native-routing-cidr", "fd00:42::/104"),
        ("enable-ipv6-masquerade", "false"),
        ("enable-policy", "default"),
        ("enable-l2-announcements", "true"),
        ("enable-bandwidth-manager", "true"),
        ("enable-node-ipam", "true"),
        ("mtu", "1450"),
        ("log-level", "debug"),
        ("prometheus-serve-addr", "127.0.0.1:9962"),
        ("cni-exclusive", "true"),
        // Cilium's `auto`: the pods have IPv4.
        ("underlay-protocol", "ipv4"),
    ];
    for (key, want) in expected {
        assert_eq!(
            data[key].as_str(),
            Some(want),
            "ConfigMap key {key}: {data:?}"
        );
    }
    // On, the agent's default: nothing written.
    assert!(
        data.get("enable-ipv4-masquerade").is_none(),
        "ConfigMap has enable-ipv4-masquerade: {data:?}"
    );

    let operator = &find(&docs, "Deployment", "podnet-operator")["spec"];
    assert_eq!(operator["replicas"].as_u64(), Some(3), "{operator:?}");
    let op_pod = &operator["template"]["spec"];
    assert_eq!(
        op_pod["containers"][0]["resources"]["requests"]["cpu"].as_str(),
        Some("100m")
    );
    assert!(
        op_pod["nodeSelector"]
            .get("node-role.kubernetes.io/control-plane")
            .is_some()
    );
    let agent = &find(&docs, "DaemonSet", "podnet")["spec"]["template"]["spec"];
    assert_eq!(
        agent["nodeSelector"]["kubernetes.io/os"].as_str(),
        Some("linux")
    );
    assert_eq!(
        agent["containers"][0]["resources"]["requests"]["memory"].as_str(),
        Some("256Mi")
    );
    assert_eq!(
        agent["containers"][0]["image"].as_str(),
        Some("ghcr.io/podnet/podnet:0.1.0")
    );
}

/// The other types Cilium's chart takes for a value render as their usual form.
#[test]
fn ciliums_other_spellings_render() {
    let Some(helm) = helm_or_skip("ciliums_other_spellings_render") else {
        return;
    };
    // (the --set arguments, a ConfigMap key, its value: None = absent)
    let cases: [(&[&str], &str, Option<&str>); 6] = [
        (
            &["--set-string", "autoDirectNodeRoutes=true"],
            "auto-direct-node-routes",
            Some("true"),
        ),
        (
            &["--set-string", "autoDirectNodeRoutes=false"],
            "auto-direct-node-routes",
            None,
        ),
        (
            &[
                "--set-string",
                "ipam.operator.clusterPoolIPv4PodCIDRList=10.1.0.0/16 10.2.0.0/16",
            ],
            "cluster-pool-ipv4-cidr",
            Some("10.1.0.0/16 10.2.0.0/16"),
        ),
        (
            &[
                "--set",
                "ipv4.enabled=false,ipv6.enabled=true,underlayProtocol=auto",
            ],
            "underlay-protocol",
            Some("ipv6"),
        ),
        (
            &["--set", "enableIPv4Masquerade=false"],
            "enable-ipv4-masquerade",
            Some("false"),
        ),
        (
            &["--set", "enableLBIPAM=false"],
            "enable-lb-ipam",
            Some("false"),
        ),
    ];
    for (args, key, want) in cases {
        let out = template(&helm, args);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        let docs = documents(&String::from_utf8_lossy(&out.stdout));
        let data = &find(&docs, "ConfigMap", "podnet-config")["data"];
        assert_eq!(
            data.get(key).and_then(Value::as_str),
            want,
            "{args:?}: {data:?}"
        );
    }
}

#[test]
fn the_notes_list_the_cilium_values_podnet_ignores() {
    let Some(helm) = helm_or_skip("the_notes_list_the_cilium_values_podnet_ignores") else {
        return;
    };
    let values = repo_path("integration/fixtures/cilium-values.yaml");
    // A client-side dry run renders NOTES.txt without a cluster.
    let out = Command::new(&helm)
        .args(["install", "podnet"])
        .arg(repo_path("charts/podnet"))
        .args(["--namespace", "kube-system", "--dry-run=client", "-f"])
        .arg(&values)
        .output()
        .expect("running helm install --dry-run=client");
    assert!(
        out.status.success(),
        "helm install --dry-run=client: {}",
        text(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let notes = stdout
        .split_once("NOTES:")
        .map(|(_, n)| n)
        .unwrap_or_else(|| panic!("no NOTES in:\n{stdout}"));
    for set in [
        "hubble.enabled=true",
        "hubble.relay.enabled=true",
        "bpf.masquerade=true",
        "prometheus.serviceMonitor.enabled=true",
        "k8sServiceHost=api.lab-east.example",
    ] {
        assert!(notes.contains(set), "NOTES should list {set}:\n{notes}");
    }
    // Off, or podnet's own setting: not listed.
    for unset in [
        "bandwidthManager.enabled",
        "hubble.ui.enabled",
        "bpf.datapathMode",
        "kubeProxyReplacement",
    ] {
        assert!(!notes.contains(unset), "NOTES lists {unset}:\n{notes}");
    }
}

#[test]
fn each_kind_of_bad_value_fails_naming_it() {
    let Some(helm) = helm_or_skip("each_kind_of_bad_value_fails_naming_it") else {
        return;
    };
    // (the --set argument, what the message must contain)
    let cases = [
        ("ipv6.enabled=maybe", "/ipv6/enabled"),
        ("operator.replicas=two", "/operator/replicas"),
        ("tunnelPort=70000", "/tunnelPort"),
        ("ipam.mode=eni", "/ipam/mode"),
        ("policyEnforcementMode=always", "/policyEnforcementMode"),
        ("tunnelProtocol=geneve", "/tunnelProtocol"),
        (
            "ipam.operator.clusterPoolIPv4PodCIDRList={10.0.0.0/33}",
            "/ipam/operator/clusterPoolIPv4PodCIDRList/0",
        ),
        (
            "ipam.operator.clusterPoolIPv6PodCIDRList={fd00:::/104}",
            "/ipam/operator/clusterPoolIPv6PodCIDRList/0",
        ),
        ("ipv4NativeRoutingCIDR=10.0.0/8", "/ipv4NativeRoutingCIDR"),
        (
            "podnet.clusterPoolCIDRReleaseDelay=soon",
            "/podnet/clusterPoolCIDRReleaseDelay",
        ),
        ("podnet.typo=1", "typo"),
        (
            "encryption.enabled=true",
            "encryption.enabled=true is refused",
        ),
        (
            "kubeProxyReplacement=true",
            "kubeProxyReplacement=true is refused",
        ),
        (
            "hostFirewall.enabled=true",
            "hostFirewall.enabled=true is refused",
        ),
        (
            "cni.chainingMode=aws-cni",
            "cni.chainingMode=aws-cni is refused",
        ),
        (
            "image.repository=quay.io/cilium/cilium",
            "image.repository=quay.io/cilium/cilium",
        ),
    ];
    for (set, names) in cases {
        let out = template(&helm, &["--set", set]);
        let said = text(&out);
        assert!(!out.status.success(), "--set {set} rendered:\n{said}");
        assert!(
            said.contains(names),
            "--set {set}: the error does not name {names}:\n{said}"
        );
    }
    // The same values off render.
    for set in [
        "encryption.enabled=false",
        "kubeProxyReplacement=false",
        "cni.chainingMode=none",
        "cni.chainingMode=portmap",
    ] {
        let out = template(&helm, &["--set", set]);
        assert!(out.status.success(), "--set {set}: {}", text(&out));
    }
}
