//! `podnet lint`: checks the daemon options, pools, pod metadata and conflists
//! before an install, one line per finding, exit 1 when there is any:
//! Cilium's start-up errors and the sizing warnings, pod ranges that overlap the
//! node's own addresses or routes (the 10.0.0.0/8 hazard), overlapping pools,
//! pool changes a running daemon would refuse (immutable fields, blocks in use),
//! ENI with tunnelling, a tunnel over an underlay of a disabled family
//! (`underlay-protocol`), the misspelled `ipam.cilium.io/ipam-pool` key,
//! conflists that do not reach the daemon, and CiliumCIDRGroups
//! (`--cidr-groups FILE`, [`super::cidr_groups`]).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;

use super::cidr_groups::lint_cidr_groups;
use super::lint_finding::{Finding, error, warning};
use crate::api::client::Client;
use crate::daemon::config::{DaemonConfig, IpamMode};
use crate::daemon::node_check;
use crate::daemon::options::DaemonOptions;
use crate::datapath::{IpFamily, NetlinkSocket, TABLE_MAIN};
use crate::ipam::Family;
use crate::ipam::pool_operator::PoolOperator;
use crate::ipam::pooldef::PoolDef;
use crate::ipam::sizing::{PlanOptions, plan_cluster_pool};
use crate::node::NodeResource;
use crate::node::manifests::ManifestDir;

/// Runs `podnet lint [--conflist FILE]... [daemon options]`.
pub fn run(args: &[String]) -> i32 {
    let mut conflists = Vec::new();
    let mut cidr_groups = Vec::new();
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--conflist=") {
            conflists.push(PathBuf::from(v));
        } else if a == "--conflist" {
            match it.next() {
                Some(v) => conflists.push(PathBuf::from(v)),
                None => {
                    eprintln!("podnet lint: --conflist needs a file");
                    return 2;
                }
            }
        } else if let Some(v) = a.strip_prefix("--cidr-groups=") {
            cidr_groups.push(PathBuf::from(v));
        } else if a == "--cidr-groups" {
            match it.next() {
                Some(v) => cidr_groups.push(PathBuf::from(v)),
                None => {
                    eprintln!("podnet lint: --cidr-groups needs a file");
                    return 2;
                }
            }
        } else if a == "--help" || a == "-h" {
            println!(
                "podnet lint [--conflist FILE]... [--cidr-groups FILE]... [the daemon's options, e.g. --config-dir DIR --pool-dir DIR]"
            );
            return 0;
        } else {
            rest.push(a.clone());
        }
    }
    let mut findings = lint(&rest, &conflists);
    findings.extend(lint_cidr_groups(&cidr_groups));
    for f in &findings {
        println!("{}: {}", f.severity, f.text);
    }
    if findings.is_empty() {
        println!("ok: no findings");
        0
    } else {
        1
    }
}

/// All findings for these daemon options and conflists.
pub fn lint(daemon_args: &[String], conflists: &[PathBuf]) -> Vec<Finding> {
    let mut out = Vec::new();
    let opts = match DaemonOptions::parse_with_config_dir(daemon_args) {
        Ok(o) => o,
        Err(e) => {
            return vec![error(format!(
                "daemon options: {}",
                e.to_string().lines().next().unwrap_or("")
            ))];
        }
    };
    let tunnel = lint_tunnel(&opts);
    let config = match DaemonConfig::resolve(&opts) {
        Ok(c) => Some(c),
        // The tunnel finding says the same in lint's words.
        Err(_) if !tunnel.is_empty() => None,
        Err(e) => {
            out.push(error(e.to_string()));
            None
        }
    };
    out.extend(tunnel);
    if let Some(c) = &config {
        out.extend(lint_underlay(c));
    }
    let pod_cidrs = match &config {
        Some(c) => match c.ipam {
            IpamMode::ClusterPool => lint_cluster_pool(c, &opts, &mut out),
            IpamMode::MultiPool => lint_multi_pool(c, &opts, &mut out),
            IpamMode::Kubernetes => lint_kubernetes(c, &mut out),
            // crd, azure, alibabacloud, eni and delegated-plugin: the addresses
            // come from elsewhere; their options were checked by the resolve.
            _ => Vec::new(),
        },
        None => Vec::new(),
    };
    out.extend(lint_node_overlap(&pod_cidrs));
    if let Some(dir) = &opts.metadata_dir {
        out.extend(lint_misspelled_key(dir));
    }
    if let Some(dir) = &opts.pool_dir {
        out.extend(lint_misspelled_key(dir));
    }
    for c in conflists {
        out.extend(lint_conflist(c, &opts.socket));
    }
    out
}

fn lint_cluster_pool(
    config: &DaemonConfig,
    opts: &DaemonOptions,
    out: &mut Vec<Finding>,
) -> Vec<IpNet> {
    let Some(cfg) = &config.cluster_pool else {
        return Vec::new();
    };
    let reserved = 2 + u32::from(opts.enable_ingress_controller);
    let plan_opts = PlanOptions {
        reserved_per_node: reserved,
        ..PlanOptions::default()
    };
    // With the Kubernetes backend the resolve leaves a mask size that does not
    // fit its CIDR to the agent's node check: said here in the embedded
    // backend's start-up words, and that family not planned.
    let misfits = cfg.mask_misfits();
    for (family, cidrs, mask) in [
        (Family::V4, &cfg.ipv4_cidrs, cfg.ipv4_mask_size),
        (Family::V6, &cfg.ipv6_cidrs, cfg.ipv6_mask_size),
    ] {
        if cidrs.is_empty() {
            continue;
        }
        if let Some(misfit) = misfits.iter().find(|m| m.family == family) {
            out.push(error(misfit.to_string()));
            continue;
        }
        // Entries with their own mask size (`<cidr>@<mask>`) were checked by
        // the parser; the plan is of the family's mask size.
        let plain: Vec<IpNet> = cidrs
            .iter()
            .filter(|c| !cfg.node_masks.contains_key(c))
            .copied()
            .collect();
        if plain.is_empty() {
            continue;
        }
        match plan_cluster_pool(&plain, mask, &plan_opts) {
            Ok(plan) => out.extend(plan.warnings.into_iter().map(warning)),
            Err(e) => out.push(error(e.to_string())),
        }
    }
    cfg.ipv4_cidrs
        .iter()
        .chain(cfg.ipv6_cidrs.iter())
        .copied()
        .collect()
}

fn lint_kubernetes(config: &DaemonConfig, out: &mut Vec<Finding>) -> Vec<IpNet> {
    for (family, name) in [(Family::V4, "IPv4"), (Family::V6, "IPv6")] {
        if config.families.contains(&family)
            && !config.pod_cidrs.iter().any(|c| Family::of_net(c) == family)
        {
            out.push(error(format!(
                "Required {name} PodCIDR not available: give it with --pod-cidrs"
            )));
        }
    }
    config.pod_cidrs.clone()
}

fn lint_multi_pool(
    config: &DaemonConfig,
    opts: &DaemonOptions,
    out: &mut Vec<Finding>,
) -> Vec<IpNet> {
    let Some(mp) = &config.multi_pool else {
        return Vec::new();
    };
    let mut defs: Vec<PoolDef> = Vec::new();
    if let Some(dir) = &opts.pool_dir {
        match ManifestDir::load(dir) {
            Ok(m) => defs.extend(m.pools().iter().cloned()),
            Err(e) => out.push(error(format!("pool dir: {e}"))),
        }
    }
    for auto in &mp.auto_create {
        if !defs.iter().any(|d| d.name == auto.name) {
            defs.push(auto.clone());
        }
    }
    if !defs.iter().any(|d| d.name == mp.default_pool) {
        out.push(warning(format!(
            "the default pool {:?} does not exist: pods no annotation or selector places get no address",
            mp.default_pool
        )));
    }
    match PoolOperator::new(&defs) {
        Ok(mut op) => {
            if let Some(node) = running_node(&opts.socket)
                && let Err(e) = op.adopt(&node.spec.ipam.pools.allocated)
            {
                out.push(error(format!("against the running daemon's blocks: {e}")));
            }
        }
        Err(e) => out.push(error(e.to_string())),
    }
    defs.iter()
        .flat_map(|d| {
            d.ipv4
                .iter()
                .chain(d.ipv6.iter())
                .flat_map(|f| f.cidrs.clone())
        })
        .collect()
}

/// The node resource of a daemon already running on `socket`, if any.
fn running_node(socket: &Path) -> Option<NodeResource> {
    let client = Client::new(socket, Duration::from_secs(3));
    let resp = client.call("GET", "/v1/node", &[], None).ok()?;
    serde_json::from_slice(&resp.body).ok()
}

/// ENI routes pods natively through the VPC: Cilium refuses it with a tunnel.
fn lint_tunnel(opts: &DaemonOptions) -> Vec<Finding> {
    let Some(dir) = &opts.config_dir else {
        return Vec::new();
    };
    let read = |k: &str| {
        std::fs::read_to_string(dir.join(k))
            .ok()
            .map(|s| s.trim().to_string())
    };
    let tunnel = read("routing-mode").is_some_and(|m| m == "tunnel")
        || read("tunnel-protocol").is_some_and(|t| !t.is_empty() && t != "disabled")
        || read("tunnel").is_some_and(|t| !t.is_empty() && t != "disabled");
    let ipam = read("ipam").unwrap_or_default();
    if tunnel && matches!(ipam.as_str(), "eni" | "azure" | "alibabacloud") {
        vec![error(format!(
            "ipam {ipam} needs native routing: it cannot be combined with a tunnel (routing-mode/tunnel-protocol)"
        ))]
    } else {
        Vec::new()
    }
}

/// A tunnel over an underlay of a disabled family: the agent's configuration check
/// refuses it on every node (`daemon::node_check`), so lint says it before.
fn lint_underlay(config: &DaemonConfig) -> Option<Finding> {
    let underlay = config.cross_node.tunnel_underlay()?;
    node_check::disabled_underlay(&config.families, underlay).map(|m| error(m.to_string()))
}

/// Pod ranges that overlap an address or route of this node break its network.
fn lint_node_overlap(pod_cidrs: &[IpNet]) -> Vec<Finding> {
    let Ok(sock) = NetlinkSocket::new() else {
        return Vec::new();
    };
    let mut own: Vec<(IpNet, String)> = Vec::new();
    for link in sock.list_links().unwrap_or_default() {
        if link.name == "lo" || link.name.starts_with("lxc") || link.name.starts_with("podnet_") {
            continue;
        }
        for a in sock.list_addresses(link.index).unwrap_or_default() {
            if !is_link_local(&a.addr()) {
                own.push((a, format!("address {a} on {}", link.name)));
            }
        }
    }
    for fam in [IpFamily::V4, IpFamily::V6] {
        for r in sock.list_routes(fam, Some(TABLE_MAIN)).unwrap_or_default() {
            let host_route = r.dst.prefix_len() == r.dst.max_prefix_len();
            if r.dst.prefix_len() > 0 && !host_route && !is_link_local(&r.dst.addr()) {
                own.push((r.dst, format!("route {}", r.dst)));
            }
        }
    }
    let mut out = Vec::new();
    for pod in pod_cidrs {
        for (net, what) in &own {
            if pod.contains(&net.network()) || net.contains(&pod.network()) {
                out.push(error(format!(
                    "pod CIDR {pod} overlaps this node's {what}: pods would take the node's own addresses and the node loses connectivity (the 10.0.0.0/8 hazard); set the pod ranges explicitly"
                )));
                break;
            }
        }
    }
    out
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// `ipam.cilium.io/ipam-pool` appears in upstream tutorial text but does nothing.
fn lint_misspelled_key(dir: &Path) -> Vec<Finding> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    let mut paths: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    paths.sort();
    for p in paths {
        if let Ok(text) = std::fs::read_to_string(&p)
            && text.contains("ipam.cilium.io/ipam-pool")
        {
            out.push(warning(format!(
                "{} uses the annotation ipam.cilium.io/ipam-pool, which does nothing: the key is ipam.cilium.io/ip-pool",
                p.display()
            )));
        }
    }
    out
}

/// A conflist must parse, speak a supported version and reach the daemon.
fn lint_conflist(path: &Path, socket: &Path) -> Vec<Finding> {
    let shown = path.display();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return vec![error(format!("{shown}: {e}"))],
    };
    let v: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return vec![error(format!("{shown} is not valid JSON: {e}"))],
    };
    let mut out = Vec::new();
    let versions: Vec<String> = v["cniVersions"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_else(|| {
            v["cniVersion"]
                .as_str()
                .map(|s| vec![s.to_string()])
                .unwrap_or_default()
        });
    if !versions.iter().any(|s| crate::cni::is_supported(s)) {
        out.push(error(format!(
            "{shown}: no cniVersion podnet speaks (it speaks {:?})",
            crate::cni::SUPPORTED_VERSIONS
        )));
    }
    let plugins = v["plugins"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| vec![v.clone()]);
    match plugins.iter().find(|p| p["type"] == "podnet") {
        None => out.push(error(format!("{shown}: no plugin of type podnet"))),
        Some(p) => {
            let sock = p["socket-path"]
                .as_str()
                .unwrap_or(crate::api::DEFAULT_SOCKET);
            if Path::new(sock) != socket {
                out.push(error(format!(
                    "{shown}: socket-path {sock} is not the daemon's --socket {}: the plugin would not reach it",
                    socket.display()
                )));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error findings of `podnet lint` with the daemon options `args`.
    fn errors(args: &[&str]) -> Vec<String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        lint(&args, &[])
            .into_iter()
            .filter(|f| f.severity == "error")
            .map(|f| f.text)
            .collect()
    }

    #[test]
    fn a_pool_cidr_with_its_own_mask_size_is_checked_by_it() {
        let about = |value: &str| -> Vec<String> {
            errors(&["--cluster-pool-ipv4-cidr", value])
                .into_iter()
                .filter(|e| e.contains("10.1.0.0/26"))
                .collect()
        };
        assert_eq!(about("10.0.0.0/16 10.1.0.0/26@26"), Vec::<String>::new());
        assert_eq!(
            about("10.0.0.0/16 10.1.0.0/26@20"),
            [
                "invalid cluster-pool-ipv4-cidr entry \"10.1.0.0/26@20\": node mask size /20 must \
              be /26 to /32 for 10.1.0.0/26"
            ]
        );
    }

    #[test]
    fn a_mask_size_that_does_not_fit_its_pool_cidr_is_an_error_naming_the_option_and_both_values() {
        let v6 = |mask: &'static str| {
            [
                "--enable-ipv6",
                "--cluster-pool-ipv6-cidr",
                "fd00::/104",
                "--cluster-pool-ipv6-mask-size",
                mask,
            ]
        };
        let v4 = |mask: &'static str| {
            [
                "--cluster-pool-ipv4-cidr",
                "10.0.0.0/16",
                "--cluster-pool-ipv4-mask-size",
                mask,
            ]
        };
        let cases: [(&[&str], &str); 6] = [
            (
                &v6("96"),
                "unable to initialize IPv6 allocator: cluster-pool-ipv6-cidr fd00::/104 with \
                 cluster-pool-ipv6-mask-size 96: node mask size /96 is shorter than the prefix \
                 length of cluster CIDR fd00::/104; it must be /104 or longer",
            ),
            (
                &v6("129"),
                "unable to initialize IPv6 allocator: cluster-pool-ipv6-cidr fd00::/104 with \
                 cluster-pool-ipv6-mask-size 129: SubNetMask is invalid, should be lower or \
                 equal to 32 for IPv4 and to 128 for IPv6; cluster-pool-ipv6-mask-size must be \
                 /104 to /120 for fd00::/104",
            ),
            (
                &v6("121"),
                "unable to initialize IPv6 allocator: cluster-pool-ipv6-cidr fd00::/104 with \
                 cluster-pool-ipv6-mask-size 121: New CIDR set failed; the node CIDR size is too \
                 big; cluster-pool-ipv6-mask-size must be /104 to /120 for fd00::/104",
            ),
            (
                &v4("8"),
                "unable to initialize IPv4 allocator: cluster-pool-ipv4-cidr 10.0.0.0/16 with \
                 cluster-pool-ipv4-mask-size 8: node mask size /8 is shorter than the prefix \
                 length of cluster CIDR 10.0.0.0/16; it must be /16 or longer",
            ),
            (
                &v4("15"),
                "unable to initialize IPv4 allocator: cluster-pool-ipv4-cidr 10.0.0.0/16 with \
                 cluster-pool-ipv4-mask-size 15: node mask size /15 is shorter than the prefix \
                 length of cluster CIDR 10.0.0.0/16; it must be /16 or longer",
            ),
            (
                &v4("33"),
                "unable to initialize IPv4 allocator: cluster-pool-ipv4-cidr 10.0.0.0/16 with \
                 cluster-pool-ipv4-mask-size 33: SubNetMask is invalid, should be lower or \
                 equal to 32 for IPv4 and to 128 for IPv6; cluster-pool-ipv4-mask-size must be \
                 /16 to /32 for 10.0.0.0/16",
            ),
        ];
        // The embedded backend refuses to start; on the Kubernetes backend the
        // agent starts and its node check says it: lint says it alike (where the
        // resolve succeeds, lint goes on to the pool's overlap with this
        // machine's addresses, which is not this test's).
        let kubernetes = ["--k8s-kubeconfig-path", "/nonexistent/kubeconfig"];
        for (args, want) in cases {
            assert_eq!(errors(args), [want], "{args:?}");
            let on_kubernetes: Vec<String> = errors(&[&kubernetes[..], args].concat())
                .into_iter()
                .filter(|e| e.contains("mask-size"))
                .collect();
            assert_eq!(on_kubernetes, [want], "Kubernetes backend, {args:?}");
        }
    }

    #[test]
    fn a_tunnel_over_a_disabled_family_is_an_error_naming_underlay_protocol() {
        let v6_only = [
            "--k8s-kubeconfig-path",
            "/nonexistent/kubeconfig",
            "--enable-ipv4=false",
            "--enable-ipv6",
            "--cluster-pool-ipv6-cidr",
            "fd00:77::/104",
            "--cluster-pool-ipv6-mask-size",
            "120",
        ];
        let underlay = |args: &[&str]| -> Vec<String> {
            errors(args)
                .into_iter()
                .filter(|e| e.contains("underlay-protocol"))
                .collect()
        };
        let found = underlay(&v6_only);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with(
                "underlay-protocol is ipv4 (the family of the tunnel's outer packets, ipv4 \
                 unless set), but enable-ipv4 is false"
            ),
            "{}",
            found[0]
        );
        assert!(underlay(&[&v6_only[..], &["--underlay-protocol", "ipv6"]].concat()).is_empty());
        assert!(underlay(&[&v6_only[..], &["--routing-mode", "native"]].concat()).is_empty());
    }
}
