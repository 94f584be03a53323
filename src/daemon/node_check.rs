//! The daemon's families checked against the node it runs on: `enable-ipv4` and
//! `enable-ipv6` against the node's InternalIPs (its Node's `status.addresses`)
//! and the cluster's Service range (the ServiceCIDR objects). One pure rule,
//! [`judge`]:
//! - every enabled pod family needs an InternalIP of that family on the node:
//!   a node without IPv6 has no next hop for IPv6 pod CIDRs with native routing
//!   and no source to masquerade IPv6 pods to outside the cluster (a VXLAN tunnel
//!   over IPv4 would carry pod-to-pod IPv6, but not that). An error;
//! - the pods and the Services must share a family: with none in common no
//!   Service, the cluster DNS included, could reach a pod. An error;
//! - pods and Services that share a family but differ in another (dual-stack
//!   pods, an IPv4 Service range) are a warning: pods start and work, only the
//!   Services of the other family do not exist (or have no endpoints here).
//!   Kubernetes allows it (a dual-stack pod network may keep one Service family)
//!   and Cilium does not check it;
//! - in tunnel routing, the underlay (`underlay-protocol`) must be an enabled
//!   family, as Cilium requires, and the node needs an InternalIP of it: that
//!   address is its tunnel endpoint. An error each. Native routing has no
//!   underlay and is not judged on it;
//! - cluster-pool on the Kubernetes backend: each `cluster-pool-ipv4/6-mask-size`
//!   must fit its family's pool CIDRs, or no node CIDR can be carved from them.
//!   An error, judged on the options alone (the embedded backend, which carves
//!   the node's CIDRs itself, refuses it at start).
//!
//! A fact the daemon could not read is not judged: a Node that lists no InternalIP
//! (yet), a cluster without the ServiceCIDR API. The underlay's family against the
//! enabled ones and the mask sizes are no facts of the node and are always judged.
//!
//! While the verdict has an error the daemon hands out no address, so no pod gets
//! one family where two were asked and no node runs half configured; DEL, CHECK
//! and GC of the pods it has go on.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use super::config::{DaemonConfig, IpamMode};
use crate::ipam::Family;
use crate::ipam::clusterpool::{
    ClusterPoolConfig, ClusterPoolError, MaskMisfit, OPT_IPV4_CIDR, OPT_IPV6_CIDR,
};
use crate::node::{ConfigFit, NodeFacts, ServiceRange};

/// How much a mismatch matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The daemon hands out no address until it is fixed.
    Error,
    /// Pods start; something they could have is missing.
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// Addresses or CIDRs as a list for a message: `10.0.0.1, fd00::1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed(pub Vec<String>);

impl fmt::Display for Listed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(", "))
    }
}

/// The option that turns `family` on.
fn enable(family: Family) -> &'static str {
    match family {
        Family::V4 => "enable-ipv4",
        Family::V6 => "enable-ipv6",
    }
}

/// The daemon option that picks the tunnel's underlay family (Cilium's name).
const UNDERLAY_OPTION: &str = "underlay-protocol";

/// What else turning `family` off takes in `mode` (cluster-pool refuses a pool
/// CIDR of a disabled family), for the advice.
fn also_remove(mode: IpamMode, family: Family) -> String {
    match (mode, family) {
        (IpamMode::ClusterPool, Family::V4) => format!(" (and remove {OPT_IPV4_CIDR})"),
        (IpamMode::ClusterPool, Family::V6) => format!(" (and remove {OPT_IPV6_CIDR})"),
        _ => String::new(),
    }
}

/// One way the configuration does not fit the node: what is wrong, which option,
/// and what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// Both families on, and the node has no address of one of them.
    #[error(
        "{} is true (dual stack), but node {node} has no {} InternalIP (its Node's status.addresses list only {ips}): its {} pods would get addresses the node cannot carry for them (no next hop to other nodes with native routing, no source address to masquerade to outside the cluster). Give the node an {} address and list it (kubelet --node-ip=<IPv4>,<IPv6>), or set {}: \"false\"{also}",
        enable(*.missing), .missing.label(), .missing.label(), .missing.label(), enable(*.missing)
    )]
    DualStackOnSingleStackNode {
        missing: Family,
        node: String,
        ips: Listed,
        /// What else turning the family off takes in this mode.
        also: String,
    },
    /// One family on, and the node has addresses of the other family only.
    #[error(
        "{} is false, so pods get {} addresses only, but node {node} has only {} InternalIPs ({ips}): a pod network of one family needs nodes with addresses of that family. Set {}: \"true\" and {}: \"false\"{also} to run {} pods on this {} network, or give the node an {} address and list it (kubelet --node-ip) to keep {} pods",
        enable(.family.other()), .family.label(), .family.other().label(),
        enable(.family.other()), enable(*.family), .family.other().label(),
        .family.other().label(), .family.label(), .family.label()
    )]
    OtherFamilyNode {
        /// The one family the pods get.
        family: Family,
        node: String,
        ips: Listed,
        also: String,
    },
    /// The pods' families and the Services' have none in common.
    #[error(
        "pods get {} addresses only ({}: false), but the cluster's Service range is {} only (ServiceCIDRs: {services}): no Service, not even the cluster DNS, could reach a pod of this node. Set {}: \"true\", or give the cluster a {} Service range (kube-apiserver --service-cluster-ip-range, or a ServiceCIDR object)",
        .pods.label(), enable(.pods.other()), .pods.other().label(),
        enable(.pods.other()), .pods.label()
    )]
    NoServiceFamily { pods: Family, services: Listed },
    /// Pods of a family no Service has.
    #[error(
        "{} is true, but the cluster's Service range has no {} CIDR (ServiceCIDRs: {services}): pods get {} addresses, yet no Service gets an {} ClusterIP, so {} reaches pods only directly; pods start and use {} Services. For {} Services add an {} range (kube-apiserver --service-cluster-ip-range=<IPv4>,<IPv6>, or a ServiceCIDR object); for {} pods without them set {}: \"false\"{also}",
        enable(*.family), .family.label(), .family.label(), .family.label(), .family.label(),
        .family.other().label(), .family.label(), .family.label(), .family.other().label(),
        enable(*.family)
    )]
    PodFamilyWithoutServices {
        family: Family,
        services: Listed,
        also: String,
    },
    /// Services of a family the pods do not get.
    #[error(
        "{} is false, but the cluster's Service range has {} CIDRs (ServiceCIDRs: {services}): the {} ClusterIPs of dual-stack and {} Services get no endpoints among this node's pods. Set {}: \"true\" (with an {} pool) to serve them",
        enable(*.family), .family.label(), .family.label(), .family.label(),
        enable(*.family), .family.label()
    )]
    ServicesWithoutPodFamily { family: Family, services: Listed },
    /// Tunnel routing over an underlay of a disabled family. Cilium refuses it at
    /// start (cilium/cilium#43057: an explicitly chosen underlay protocol whose
    /// family is disabled stops the agent); podnet follows, so a ConfigMap that
    /// podnet takes also starts Cilium's agent.
    #[error(
        "{UNDERLAY_OPTION} is {} (the family of the tunnel's outer packets{}), but {} is false: an {}-only pod network tunnels over {}, and Cilium refuses an underlay of a disabled family. Set {UNDERLAY_OPTION}: {} in the podnet ConfigMap (the nodes' {} InternalIPs are then the tunnel endpoints), or set {}: \"true\"",
        .underlay.as_str(), unset_default(*.underlay), enable(*.underlay),
        .underlay.other().label(), .underlay.other().label(), .underlay.other().as_str(),
        .underlay.other().label(), enable(*.underlay)
    )]
    UnderlayFamilyDisabled { underlay: Family },
    /// Tunnel routing, and the node has no InternalIP of the underlay family: it
    /// has no tunnel endpoint.
    #[error(
        "{UNDERLAY_OPTION} is {}, but node {node} has only {} InternalIPs ({ips}): a node's tunnel endpoint is its InternalIP of the underlay family, so this node has none and its pods reach no pod on another node. Set {UNDERLAY_OPTION}: {} in the podnet ConfigMap (on every node), or give the node an {} address and list it (kubelet --node-ip)",
        .underlay.as_str(), .underlay.other().label(), .underlay.other().as_str(),
        .underlay.label()
    )]
    UnderlayWithoutNodeAddress {
        underlay: Family,
        node: String,
        ips: Listed,
    },
    /// cluster-pool on the Kubernetes backend: a node mask size that does not fit
    /// a pool CIDR of its family. The operator carves the node CIDRs (and refuses
    /// it at its start); the embedded backend, which carves them itself, refuses
    /// it at the agent's.
    #[error(
        "{0}. No {family} pod CIDR can be carved out of {cidrs} at this size: the operator refuses it and carves from the pool in force (this node serves from the CIDRs it has); set {option} to a size from /{shortest} to /{longest} in the podnet ConfigMap (the operator reads it too)",
        family = .0.family.label(), cidrs = .0.cidr_option(), option = .0.option(),
        shortest = .0.fitting().0, longest = .0.fitting().1
    )]
    MaskSizeMisfit(MaskMisfit),
    /// cluster-pool on the Kubernetes backend: a pool option of the operator's
    /// does not parse or fails its checks (a ConfigMap edit). The operator
    /// refuses it and runs on the pool in force; the node serves from what it
    /// has, with the entries that parse.
    #[error(
        "{error}: the operator refuses the cluster pool options and carves from the pool in force (this node serves from the CIDRs it has); fix {option} in the podnet ConfigMap"
    )]
    ClusterPoolRefused {
        option: &'static str,
        error: ClusterPoolError,
    },
}

/// `, ipv4 unless set` for the default underlay, for a message that may be
/// about a ConfigMap that never names the option.
fn unset_default(underlay: Family) -> &'static str {
    match underlay {
        Family::V4 => ", ipv4 unless set",
        Family::V6 => "",
    }
}

impl Mismatch {
    pub fn severity(&self) -> Severity {
        match self {
            Mismatch::DualStackOnSingleStackNode { .. }
            | Mismatch::OtherFamilyNode { .. }
            | Mismatch::NoServiceFamily { .. }
            | Mismatch::UnderlayFamilyDisabled { .. }
            | Mismatch::UnderlayWithoutNodeAddress { .. } => Severity::Error,
            Mismatch::PodFamilyWithoutServices { .. }
            | Mismatch::ServicesWithoutPodFamily { .. }
            | Mismatch::MaskSizeMisfit(_)
            | Mismatch::ClusterPoolRefused { .. } => Severity::Warning,
        }
    }

    /// The option to change first.
    pub fn option(&self) -> &'static str {
        match self {
            Mismatch::DualStackOnSingleStackNode { missing: f, .. }
            | Mismatch::PodFamilyWithoutServices { family: f, .. }
            | Mismatch::ServicesWithoutPodFamily { family: f, .. } => enable(*f),
            Mismatch::OtherFamilyNode { family: f, .. }
            | Mismatch::NoServiceFamily { pods: f, .. } => enable(f.other()),
            Mismatch::UnderlayFamilyDisabled { .. }
            | Mismatch::UnderlayWithoutNodeAddress { .. } => UNDERLAY_OPTION,
            Mismatch::MaskSizeMisfit(m) => m.option(),
            Mismatch::ClusterPoolRefused { option, .. } => option,
        }
    }

    /// One CamelCase word, as a Kubernetes condition's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Mismatch::DualStackOnSingleStackNode {
                missing: Family::V6,
                ..
            } => "NodeWithoutIPv6",
            Mismatch::DualStackOnSingleStackNode {
                missing: Family::V4,
                ..
            } => "NodeWithoutIPv4",
            Mismatch::OtherFamilyNode {
                family: Family::V6, ..
            } => "IPv6PodsOnIPv4Node",
            Mismatch::OtherFamilyNode {
                family: Family::V4, ..
            } => "IPv4PodsOnIPv6Node",
            Mismatch::NoServiceFamily { .. } => "NoServiceFamilyInCommon",
            Mismatch::PodFamilyWithoutServices { .. } => "PodFamilyWithoutServices",
            Mismatch::ServicesWithoutPodFamily { .. } => "ServicesWithoutPodFamily",
            Mismatch::UnderlayFamilyDisabled {
                underlay: Family::V4,
            } => "IPv4UnderlayWithIPv4Disabled",
            Mismatch::UnderlayFamilyDisabled {
                underlay: Family::V6,
            } => "IPv6UnderlayWithIPv6Disabled",
            Mismatch::UnderlayWithoutNodeAddress {
                underlay: Family::V4,
                ..
            } => "NodeWithoutIPv4Underlay",
            Mismatch::UnderlayWithoutNodeAddress {
                underlay: Family::V6,
                ..
            } => "NodeWithoutIPv6Underlay",
            Mismatch::MaskSizeMisfit(MaskMisfit {
                family: Family::V4, ..
            }) => "IPv4MaskSizeDoesNotFitCIDR",
            Mismatch::MaskSizeMisfit(MaskMisfit {
                family: Family::V6, ..
            }) => "IPv6MaskSizeDoesNotFitCIDR",
            Mismatch::ClusterPoolRefused { .. } => "ClusterPoolOptionRefused",
        }
    }
}

/// What the daemon's configuration comes to on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Errors first, then warnings.
    pub mismatches: Vec<Mismatch>,
}

impl Verdict {
    /// No error: the node hands out addresses.
    pub fn fits(&self) -> bool {
        self.errors().next().is_none()
    }

    pub fn errors(&self) -> impl Iterator<Item = &Mismatch> {
        self.mismatches
            .iter()
            .filter(|m| m.severity() == Severity::Error)
    }

    /// The text an allocation is refused with, while there is an error.
    pub fn refusal(&self) -> Option<String> {
        let errors: Vec<String> = self.errors().map(Mismatch::to_string).collect();
        (!errors.is_empty()).then(|| {
            format!(
                "this node's podnet configuration does not fit the node, so it hands out no address until it is fixed: {}",
                errors.join("; ")
            )
        })
    }

    /// The verdict as the node resource's condition.
    pub fn condition(&self) -> ConfigFit {
        let fits = self.fits();
        let reason = match self.mismatches.first() {
            None => "Fits",
            Some(_) if fits => "FitsWithWarnings",
            Some(m) => m.reason(),
        };
        let message = match self.mismatches.is_empty() {
            true => "enable-ipv4, enable-ipv6 and, in tunnel routing, underlay-protocol fit the node's addresses and the cluster's Service range".to_string(),
            false => self
                .mismatches
                .iter()
                .map(|m| format!("{} ({}): {m}", m.severity().as_str(), m.option()))
                .collect::<Vec<_>>()
                .join("; "),
        };
        ConfigFit {
            fits,
            reason: reason.into(),
            message,
        }
    }

    /// Says the verdict in the log: each error and warning on its own line.
    pub fn log(&self, node: &str) {
        if self.mismatches.is_empty() {
            tracing::info!(
                node,
                "the configuration fits this node's addresses and the cluster's Service range"
            );
        }
        for m in &self.mismatches {
            match m.severity() {
                Severity::Error => {
                    tracing::error!(
                        node,
                        option = m.option(),
                        reason = m.reason(),
                        "the configuration does not fit this node, no pod gets an address until it does: {m}"
                    )
                }
                Severity::Warning => {
                    tracing::warn!(node, option = m.option(), reason = m.reason(), "{m}")
                }
            }
        }
    }
}

/// The findings of the cluster pool options (the Kubernetes backend:
/// `cluster_pool`'s rule): mask sizes that do not fit, a refused option.
pub fn pool_findings(config: &DaemonConfig) -> Vec<Mismatch> {
    let misfits = config
        .cluster_pool
        .iter()
        .flat_map(ClusterPoolConfig::mask_misfits);
    let mut findings: Vec<Mismatch> = misfits.map(Mismatch::MaskSizeMisfit).collect();
    if let Some((option, error)) = &config.cluster_pool_refused {
        findings.push(Mismatch::ClusterPoolRefused {
            option,
            error: error.clone(),
        });
    }
    findings
}

/// Judges `families` (the enabled ones) in IPAM `mode`, with the tunnel's
/// underlay family `tunnel_underlay` (None: native routing, no underlay) and the
/// findings of the cluster-pool options `pool_findings` (mask sizes that do not
/// fit their CIDRs, options the operator refuses), on node
/// `node` with `facts`: the mismatches, errors first.
pub fn judge(
    families: &[Family],
    mode: IpamMode,
    tunnel_underlay: Option<Family>,
    pool_findings: &[Mismatch],
    node: &str,
    facts: &NodeFacts,
) -> Verdict {
    let mut mismatches: Vec<Mismatch> = pool_findings.to_vec();
    mismatches.extend(address_mismatches(
        families,
        mode,
        node,
        &facts.internal_ips,
    ));
    if let Some(underlay) = tunnel_underlay {
        mismatches.extend(underlay_mismatch(
            families,
            underlay,
            node,
            &facts.internal_ips,
        ));
    }
    if let ServiceRange::Known(cidrs) = &facts.service_range {
        mismatches.extend(service_mismatches(families, mode, cidrs));
    }
    mismatches.sort_by_key(Mismatch::severity);
    Verdict { mismatches }
}

/// The families of `families` present, as a set.
fn family_set(families: impl IntoIterator<Item = Family>) -> BTreeSet<Family> {
    families.into_iter().collect()
}

/// Every enabled family needs an InternalIP of its own.
fn address_mismatches(
    families: &[Family],
    mode: IpamMode,
    node: &str,
    internal_ips: &[IpAddr],
) -> Vec<Mismatch> {
    if internal_ips.is_empty() {
        return Vec::new();
    }
    let have = family_set(internal_ips.iter().map(Family::of_addr));
    let ips = Listed(internal_ips.iter().map(IpAddr::to_string).collect());
    let dual = families.len() > 1;
    families
        .iter()
        .filter(|f| !have.contains(f))
        .map(|&f| match dual {
            true => Mismatch::DualStackOnSingleStackNode {
                missing: f,
                node: node.to_string(),
                ips: ips.clone(),
                also: also_remove(mode, f),
            },
            false => Mismatch::OtherFamilyNode {
                family: f,
                node: node.to_string(),
                ips: ips.clone(),
                also: also_remove(mode, f),
            },
        })
        .collect()
}

/// The underlay of a tunnel whose family is disabled (`families` being the
/// enabled ones; with none enabled there is nothing to tunnel): judged without any
/// fact of the node, so `podnet lint` says it too.
pub fn disabled_underlay(families: &[Family], underlay: Family) -> Option<Mismatch> {
    (!families.is_empty() && !families.contains(&underlay))
        .then_some(Mismatch::UnderlayFamilyDisabled { underlay })
}

/// The tunnel's underlay: of an enabled family, and with an InternalIP of that
/// family on the node (a node that lists none is not judged on it).
fn underlay_mismatch(
    families: &[Family],
    underlay: Family,
    node: &str,
    internal_ips: &[IpAddr],
) -> Option<Mismatch> {
    if let Some(disabled) = disabled_underlay(families, underlay) {
        return Some(disabled);
    }
    let endpoint_missing = !internal_ips.is_empty()
        && !internal_ips
            .iter()
            .any(|ip| Family::of_addr(ip) == underlay);
    endpoint_missing.then(|| Mismatch::UnderlayWithoutNodeAddress {
        underlay,
        node: node.to_string(),
        ips: Listed(internal_ips.iter().map(IpAddr::to_string).collect()),
    })
}

/// The pods' families against the Services'.
fn service_mismatches(families: &[Family], mode: IpamMode, cidrs: &[IpNet]) -> Vec<Mismatch> {
    let services = family_set(cidrs.iter().map(Family::of_net));
    let pods = family_set(families.iter().copied());
    if services.is_empty() || pods.is_empty() {
        return Vec::new();
    }
    let listed = Listed(cidrs.iter().map(IpNet::to_string).collect());
    if services.is_disjoint(&pods) {
        return pods
            .iter()
            .map(|&f| Mismatch::NoServiceFamily {
                pods: f,
                services: listed.clone(),
            })
            .collect();
    }
    let without_services =
        pods.difference(&services)
            .map(|&f| Mismatch::PodFamilyWithoutServices {
                family: f,
                services: listed.clone(),
                also: also_remove(mode, f),
            });
    let without_pods = services
        .difference(&pods)
        .map(|&f| Mismatch::ServicesWithoutPodFamily {
            family: f,
            services: listed.clone(),
        });
    without_services.chain(without_pods).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::cidrset::CidrSetError;

    const V4_ONLY: &[Family] = &[Family::V4];
    const V6_ONLY: &[Family] = &[Family::V6];
    const DUAL: &[Family] = &[Family::V6, Family::V4];
    /// Native routing: no underlay to judge.
    const NATIVE: Option<Family> = None;
    const IPV4_UNDERLAY: Option<Family> = Some(Family::V4);
    const IPV6_UNDERLAY: Option<Family> = Some(Family::V6);
    /// Every mask size fits its pool CIDR.
    const NO_MISFIT: &[Mismatch] = &[];

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn facts(addresses: &[&str], services: Option<&[&str]>) -> NodeFacts {
        NodeFacts {
            internal_ips: ips(addresses),
            service_range: match services {
                Some(s) => ServiceRange::Known(s.iter().map(|c| c.parse().unwrap()).collect()),
                None => ServiceRange::Unknown("not served".into()),
            },
        }
    }

    fn reasons(v: &Verdict) -> Vec<&'static str> {
        v.mismatches.iter().map(Mismatch::reason).collect()
    }

    const V4_SERVICES: Option<&[&str]> = Some(&["10.96.0.0/16"]);
    const V6_SERVICES: Option<&[&str]> = Some(&["fd00:96::/112"]);
    const DUAL_SERVICES: Option<&[&str]> = Some(&["10.96.0.0/16", "fd00:96::/112"]);

    #[test]
    fn families_that_match_the_node_and_the_services_fit_without_a_word() {
        for (families, underlay, node, services) in [
            (V4_ONLY, NATIVE, &["10.0.0.1"][..], V4_SERVICES),
            (V4_ONLY, IPV4_UNDERLAY, &["10.0.0.1"][..], V4_SERVICES),
            (V6_ONLY, NATIVE, &["fd00::1"][..], V6_SERVICES),
            (V6_ONLY, IPV6_UNDERLAY, &["fd00::1"][..], V6_SERVICES),
            (
                DUAL,
                IPV4_UNDERLAY,
                &["10.0.0.1", "fd00::1"][..],
                DUAL_SERVICES,
            ),
            (
                DUAL,
                IPV6_UNDERLAY,
                &["10.0.0.1", "fd00::1"][..],
                DUAL_SERVICES,
            ),
            // A node with more families than the pods use is fine.
            (
                V4_ONLY,
                IPV4_UNDERLAY,
                &["10.0.0.1", "fd00::1"][..],
                V4_SERVICES,
            ),
        ] {
            let v = judge(
                families,
                IpamMode::ClusterPool,
                underlay,
                NO_MISFIT,
                "n1",
                &facts(node, services),
            );
            assert_eq!(
                v,
                Verdict::default(),
                "{families:?} over {underlay:?} on {node:?}"
            );
            assert!(v.fits() && v.refusal().is_none());
            assert_eq!(v.condition().reason, "Fits");
        }
    }

    #[test]
    fn dual_stack_on_a_node_without_ipv6_is_an_error_naming_enable_ipv6() {
        let v = judge(
            DUAL,
            IpamMode::ClusterPool,
            NATIVE,
            NO_MISFIT,
            "n1",
            &facts(&["10.0.0.1"], None),
        );
        assert!(!v.fits());
        assert_eq!(reasons(&v), ["NodeWithoutIPv6"]);
        assert_eq!(v.mismatches[0].option(), "enable-ipv6");
        assert_eq!(
            v.mismatches[0].to_string(),
            "enable-ipv6 is true (dual stack), but node n1 has no IPv6 InternalIP (its Node's \
             status.addresses list only 10.0.0.1): its IPv6 pods would get addresses the node \
             cannot carry for them (no next hop to other nodes with native routing, no source \
             address to masquerade to outside the cluster). Give the node an IPv6 address and \
             list it (kubelet \
             --node-ip=<IPv4>,<IPv6>), or set enable-ipv6: \"false\" (and remove \
             cluster-pool-ipv6-cidr)"
        );
        let refusal = v.refusal().unwrap();
        assert!(refusal.contains("hands out no address") && refusal.contains("enable-ipv6"));
    }

    #[test]
    fn dual_stack_on_a_node_without_ipv4_is_an_error_naming_enable_ipv4() {
        let v = judge(
            DUAL,
            IpamMode::Kubernetes,
            NATIVE,
            NO_MISFIT,
            "n1",
            &facts(&["fd00::1"], None),
        );
        assert_eq!(reasons(&v), ["NodeWithoutIPv4"]);
        assert_eq!(v.mismatches[0].option(), "enable-ipv4");
        // Only cluster-pool refuses a pool CIDR of a disabled family.
        assert!(
            v.mismatches[0]
                .to_string()
                .ends_with("or set enable-ipv4: \"false\""),
            "{}",
            v.mismatches[0]
        );
    }

    #[test]
    fn ipv6_only_pods_on_an_ipv4_only_node_name_enable_ipv4_and_the_fix() {
        let v = judge(
            V6_ONLY,
            IpamMode::ClusterPool,
            NATIVE,
            NO_MISFIT,
            "n1",
            &facts(&["10.0.0.1", "10.0.0.2"], None),
        );
        assert_eq!(reasons(&v), ["IPv6PodsOnIPv4Node"]);
        assert_eq!(v.mismatches[0].option(), "enable-ipv4");
        assert_eq!(
            v.mismatches[0].to_string(),
            "enable-ipv4 is false, so pods get IPv6 addresses only, but node n1 has only IPv4 \
             InternalIPs (10.0.0.1, 10.0.0.2): a pod network of one family needs nodes with \
             addresses of that family. Set enable-ipv4: \"true\" and enable-ipv6: \"false\" (and \
             remove cluster-pool-ipv6-cidr) to run IPv4 pods on this IPv4 network, or give the \
             node an IPv6 address and list it (kubelet --node-ip) to keep IPv6 pods"
        );
    }

    #[test]
    fn ipv4_only_pods_on_an_ipv6_only_node_name_enable_ipv6() {
        let v = judge(
            V4_ONLY,
            IpamMode::MultiPool,
            NATIVE,
            NO_MISFIT,
            "n1",
            &facts(&["fd00::1"], None),
        );
        assert_eq!(reasons(&v), ["IPv4PodsOnIPv6Node"]);
        assert_eq!(v.mismatches[0].option(), "enable-ipv6");
        assert!(v.mismatches[0].to_string().starts_with(
            "enable-ipv6 is false, so pods get IPv4 addresses only, but node n1 has only IPv6 InternalIPs (fd00::1)"
        ));
    }

    #[test]
    fn a_node_that_lists_no_internal_ip_is_not_judged() {
        for families in [V4_ONLY, V6_ONLY, DUAL] {
            let v = judge(
                families,
                IpamMode::ClusterPool,
                NATIVE,
                NO_MISFIT,
                "n1",
                &facts(&[], None),
            );
            assert!(v.mismatches.is_empty(), "{families:?}");
        }
    }

    #[test]
    fn an_unknown_service_range_is_not_judged() {
        let v = judge(
            V6_ONLY,
            IpamMode::ClusterPool,
            NATIVE,
            NO_MISFIT,
            "n1",
            &facts(&["fd00::1"], None),
        );
        assert!(v.mismatches.is_empty());
        let v = judge(
            V6_ONLY,
            IpamMode::ClusterPool,
            NATIVE,
            NO_MISFIT,
            "n1",
            &facts(&[], Some(&[])),
        );
        assert!(
            v.mismatches.is_empty(),
            "no ServiceCIDR at all: nothing to say"
        );
    }

    #[test]
    fn dual_stack_pods_with_one_service_family_are_a_warning_that_lets_pods_start() {
        let v = judge(
            DUAL,
            IpamMode::ClusterPool,
            NATIVE,
            NO_MISFIT,
            "n1",
            &facts(&["10.0.0.1", "fd00::1"], V4_SERVICES),
        );
        assert_eq!(reasons(&v), ["PodFamilyWithoutServices"]);
        assert!(v.fits() && v.refusal().is_none());
        assert_eq!(v.mismatches[0].severity(), Severity::Warning);
        assert_eq!(v.mismatches[0].option(), "enable-ipv6");
        let text = v.mismatches[0].to_string();
        assert!(
            text.starts_with("enable-ipv6 is true, but the cluster's Service range has no IPv6 CIDR (ServiceCIDRs: 10.96.0.0/16)")
                && text.contains("pods start and use IPv4 Services"),
            "{text}"
        );
        let c = v.condition();
        assert!(c.fits);
        assert_eq!(c.reason, "FitsWithWarnings");
        assert!(
            c.message.starts_with("warning (enable-ipv6): "),
            "{}",
            c.message
        );
    }

    #[test]
    fn single_family_pods_with_dual_stack_services_are_a_warning() {
        let v = judge(
            V4_ONLY,
            IpamMode::Kubernetes,
            NATIVE,
            NO_MISFIT,
            "n1",
            &facts(&["10.0.0.1"], DUAL_SERVICES),
        );
        assert_eq!(reasons(&v), ["ServicesWithoutPodFamily"]);
        assert!(v.fits());
        assert_eq!(v.mismatches[0].option(), "enable-ipv6");
    }

    #[test]
    fn pods_and_services_without_a_family_in_common_are_an_error() {
        let v = judge(
            V6_ONLY,
            IpamMode::ClusterPool,
            NATIVE,
            NO_MISFIT,
            "n1",
            &facts(&["fd00::1"], V4_SERVICES),
        );
        assert_eq!(reasons(&v), ["NoServiceFamilyInCommon"]);
        assert!(!v.fits());
        assert_eq!(v.mismatches[0].option(), "enable-ipv4");
        assert!(
            v.mismatches[0]
                .to_string()
                .contains("no Service, not even the cluster DNS, could reach a pod"),
            "{}",
            v.mismatches[0]
        );
    }

    #[test]
    fn errors_come_before_warnings_and_the_condition_names_the_first_error() {
        // IPv6-only pods on an IPv4 node with dual-stack Services: the node is the
        // error; the missing IPv4 pods for IPv4 Services a warning.
        let v = judge(
            V6_ONLY,
            IpamMode::ClusterPool,
            NATIVE,
            NO_MISFIT,
            "n1",
            &facts(&["10.0.0.1"], DUAL_SERVICES),
        );
        assert_eq!(
            reasons(&v),
            ["IPv6PodsOnIPv4Node", "ServicesWithoutPodFamily"]
        );
        let c = v.condition();
        assert!(!c.fits);
        assert_eq!(c.reason, "IPv6PodsOnIPv4Node");
        assert!(
            c.message.starts_with("error (enable-ipv4): enable-ipv4 is false")
                && c.message.contains("; warning (enable-ipv4): enable-ipv4 is false, but the cluster's Service range has IPv4 CIDRs"),
            "{}",
            c.message
        );
        // The refusal carries the errors only.
        assert!(!v.refusal().unwrap().contains("warning"));
    }

    #[test]
    fn an_ipv4_underlay_with_ipv4_disabled_is_an_error_naming_underlay_protocol_on_any_node() {
        // The node has IPv4 too: Cilium refuses the configuration all the same.
        let v = judge(
            V6_ONLY,
            IpamMode::ClusterPool,
            IPV4_UNDERLAY,
            NO_MISFIT,
            "n1",
            &facts(&["10.0.0.1", "fd00::1"], V6_SERVICES),
        );
        assert_eq!(reasons(&v), ["IPv4UnderlayWithIPv4Disabled"]);
        assert!(!v.fits());
        assert_eq!(v.mismatches[0].option(), "underlay-protocol");
        assert_eq!(
            v.mismatches[0].to_string(),
            "underlay-protocol is ipv4 (the family of the tunnel's outer packets, ipv4 unless \
             set), but enable-ipv4 is false: an IPv6-only pod network tunnels over IPv6, and \
             Cilium refuses an underlay of a disabled family. Set underlay-protocol: ipv6 in the \
             podnet ConfigMap (the nodes' IPv6 InternalIPs are then the tunnel endpoints), or \
             set enable-ipv4: \"true\""
        );
        let c = v.condition();
        assert_eq!(
            (c.fits, c.reason.as_str()),
            (false, "IPv4UnderlayWithIPv4Disabled")
        );
        assert!(
            c.message
                .starts_with("error (underlay-protocol): underlay-protocol is ipv4"),
            "{}",
            c.message
        );
        assert!(v.refusal().unwrap().contains("underlay-protocol is ipv4"));
    }

    #[test]
    fn a_disabled_underlay_family_is_judged_before_the_node_lists_an_address() {
        // No fact of the node is needed: the options alone contradict each other.
        let v = judge(
            V6_ONLY,
            IpamMode::Kubernetes,
            IPV4_UNDERLAY,
            NO_MISFIT,
            "n1",
            &facts(&[], None),
        );
        assert_eq!(reasons(&v), ["IPv4UnderlayWithIPv4Disabled"]);
        assert_eq!(
            disabled_underlay(V6_ONLY, Family::V4),
            Some(Mismatch::UnderlayFamilyDisabled {
                underlay: Family::V4
            })
        );
        assert_eq!(disabled_underlay(DUAL, Family::V4), None);
        assert_eq!(
            disabled_underlay(&[], Family::V4),
            None,
            "nothing to tunnel"
        );
    }

    #[test]
    fn an_ipv6_underlay_with_ipv6_disabled_is_the_twin_error() {
        let v = judge(
            V4_ONLY,
            IpamMode::ClusterPool,
            IPV6_UNDERLAY,
            NO_MISFIT,
            "n1",
            &facts(&["10.0.0.1", "fd00::1"], V4_SERVICES),
        );
        assert_eq!(reasons(&v), ["IPv6UnderlayWithIPv6Disabled"]);
        assert_eq!(v.mismatches[0].option(), "underlay-protocol");
        let text = v.mismatches[0].to_string();
        assert!(
            text.starts_with(
                "underlay-protocol is ipv6 (the family of the tunnel's outer packets), but \
                 enable-ipv6 is false: an IPv4-only pod network tunnels over IPv4"
            ) && text.contains("Set underlay-protocol: ipv4 in the podnet ConfigMap")
                && text.ends_with("or set enable-ipv6: \"true\""),
            "{text}"
        );
    }

    #[test]
    fn a_tunnel_node_without_an_internal_ip_of_the_underlay_family_is_an_error_naming_underlay_protocol()
     {
        // Dual-stack pods over an IPv4 underlay on an IPv6-only node: the missing
        // IPv4 is the address error, and it leaves the node without a tunnel
        // endpoint, which the underlay error says with its own fix.
        let v = judge(
            DUAL,
            IpamMode::ClusterPool,
            IPV4_UNDERLAY,
            NO_MISFIT,
            "n1",
            &facts(&["fd00::1", "fd00::2"], DUAL_SERVICES),
        );
        assert_eq!(reasons(&v), ["NodeWithoutIPv4", "NodeWithoutIPv4Underlay"]);
        assert_eq!(v.mismatches[1].option(), "underlay-protocol");
        assert_eq!(
            v.mismatches[1].to_string(),
            "underlay-protocol is ipv4, but node n1 has only IPv6 InternalIPs (fd00::1, \
             fd00::2): a node's tunnel endpoint is its InternalIP of the underlay family, so \
             this node has none and its pods reach no pod on another node. Set \
             underlay-protocol: ipv6 in the podnet ConfigMap (on every node), or give the node \
             an IPv4 address and list it (kubelet --node-ip)"
        );
        let v = judge(
            DUAL,
            IpamMode::ClusterPool,
            IPV6_UNDERLAY,
            NO_MISFIT,
            "n1",
            &facts(&["10.0.0.1"], DUAL_SERVICES),
        );
        assert_eq!(reasons(&v), ["NodeWithoutIPv6", "NodeWithoutIPv6Underlay"]);
        assert!(
            v.mismatches[1].to_string().starts_with(
                "underlay-protocol is ipv6, but node n1 has only IPv4 InternalIPs (10.0.0.1)"
            ),
            "{}",
            v.mismatches[1]
        );
        // A node that lists no InternalIP yet is not judged on its endpoint.
        let v = judge(
            DUAL,
            IpamMode::ClusterPool,
            IPV6_UNDERLAY,
            NO_MISFIT,
            "n1",
            &facts(&[], None),
        );
        assert!(v.mismatches.is_empty(), "{v:?}");
    }

    #[test]
    fn native_routing_has_no_underlay_to_judge() {
        // The same options and node that fail over a tunnel: native routing
        // leaves the underlay out (the IPv6 pods' own rules still apply).
        let v = judge(
            V6_ONLY,
            IpamMode::ClusterPool,
            NATIVE,
            NO_MISFIT,
            "n1",
            &facts(&["10.0.0.1", "fd00::1"], V6_SERVICES),
        );
        assert_eq!(v, Verdict::default());
        let v = judge(
            DUAL,
            IpamMode::ClusterPool,
            NATIVE,
            NO_MISFIT,
            "n1",
            &facts(&["fd00::1"], DUAL_SERVICES),
        );
        assert_eq!(reasons(&v), ["NodeWithoutIPv4"]);
    }

    /// `cluster-pool-ipv6-mask-size` 121 over `cluster-pool-ipv6-cidr` fd00::/104.
    fn v6_mask_misfit() -> Mismatch {
        Mismatch::MaskSizeMisfit(MaskMisfit {
            family: Family::V6,
            cidr: "fd00::/104".parse().unwrap(),
            mask: 121,
            error: CidrSetError::SubNetTooBig,
        })
    }

    #[test]
    fn a_mask_size_that_does_not_fit_its_pool_cidr_is_a_warning_naming_the_mask_size_option() {
        // Judged on the options alone, before the node lists an address. The
        // operator refuses the mask and carves from the pool in force, so the
        // node serves from what it has (issue 53: an operator-only option must
        // not cost a node its CNI).
        let v = judge(
            DUAL,
            IpamMode::ClusterPool,
            IPV4_UNDERLAY,
            &[v6_mask_misfit()],
            "n1",
            &facts(&["10.0.0.1", "fd00::1"], None),
        );
        assert_eq!(reasons(&v), ["IPv6MaskSizeDoesNotFitCIDR"]);
        assert!(v.fits());
        let m = &v.mismatches[0];
        assert_eq!(
            (m.severity(), m.option()),
            (Severity::Warning, "cluster-pool-ipv6-mask-size")
        );
        assert_eq!(
            m.to_string(),
            "unable to initialize IPv6 allocator: cluster-pool-ipv6-cidr fd00::/104 with \
             cluster-pool-ipv6-mask-size 121: New CIDR set failed; the node CIDR size is too \
             big; cluster-pool-ipv6-mask-size must be /104 to /120 for fd00::/104. No IPv6 \
             pod CIDR can be carved out of cluster-pool-ipv6-cidr at this size: the operator \
             refuses it and carves from the pool in force (this node serves from the CIDRs it \
             has); set cluster-pool-ipv6-mask-size to a size from /104 to /120 in the podnet \
             ConfigMap (the operator reads it too)"
        );
        let c = v.condition();
        assert_eq!((c.fits, c.reason.as_str()), (true, "FitsWithWarnings"));
        assert!(
            c.message.starts_with(
                "warning (cluster-pool-ipv6-mask-size): unable to initialize IPv6 allocator"
            ),
            "{}",
            c.message
        );
        assert!(v.refusal().is_none());
    }

    #[test]
    fn a_cluster_pool_option_the_operator_refuses_is_a_warning_naming_it() {
        let refused = Mismatch::ClusterPoolRefused {
            option: OPT_IPV4_CIDR,
            error: ClusterPoolError::InvalidNodeMask {
                option: OPT_IPV4_CIDR.into(),
                entry: "10.250.0.0/16@x".into(),
            },
        };
        let f = facts(&["10.0.0.1"], None);
        let v = judge(
            &[Family::V4],
            IpamMode::ClusterPool,
            NATIVE,
            &[refused],
            "n1",
            &f,
        );
        assert!(v.fits());
        assert_eq!(reasons(&v), ["ClusterPoolOptionRefused"]);
        assert_eq!(
            v.mismatches[0].to_string(),
            "invalid cluster-pool-ipv4-cidr entry \"10.250.0.0/16@x\": the node mask size after @ \
             must be a number (e.g. 10.1.0.0/16@26): the operator refuses the cluster pool \
             options and carves from the pool in force (this node serves from the CIDRs it \
             has); fix cluster-pool-ipv4-cidr in the podnet ConfigMap"
        );
        assert_eq!(v.mismatches[0].option(), "cluster-pool-ipv4-cidr");
    }

    #[test]
    fn a_mask_misfit_comes_after_the_errors_and_first_among_the_warnings() {
        // Dual-stack pods on an IPv4-only node with an IPv4 Service range: the
        // missing IPv6 address, then the misfit mask, then the Services' warning.
        let v = judge(
            DUAL,
            IpamMode::ClusterPool,
            NATIVE,
            &[v6_mask_misfit()],
            "n1",
            &facts(&["10.0.0.1"], V4_SERVICES),
        );
        assert_eq!(
            reasons(&v),
            [
                "NodeWithoutIPv6",
                "IPv6MaskSizeDoesNotFitCIDR",
                "PodFamilyWithoutServices"
            ]
        );
        assert_eq!(v.condition().reason, "NodeWithoutIPv6");
    }
}
