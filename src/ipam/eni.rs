//! AWS ENI IPAM, the pure part (no I/O, no netlink): what the node may use from
//! the ENI inventory the operator side writes to `status.eni.enis`, which ENI an
//! address belongs to (for the ENI host routing of `cilium-facts.md` §3), and the
//! operator-side allocation math of the chapter's "Allocation algorithm".
//!
//! * [`validate_inventory`]: the inventory's addresses, prefixes, subnets and
//!   MACs parse and agree (checked when the node resource is read).
//! * [`eni_allocation`]: the inventory as `spec.ipam.pools.allocated` of pool
//!   `default` (§6.3): each `prefixes` / `ipv6-prefixes` entry is a CIDR, each
//!   `addresses` entry not covered by one of the ENI's prefixes a /32 (/128),
//!   `allowFirstIP` / `allowLastIP` true. ENIs with `number` below
//!   `spec.eni.first-interface-index` or carrying all of
//!   `spec.eni.exclude-interface-tags` are skipped (Cilium's
//!   `ENI.IsExcludedBySpec`); the ENI primary `ip` is used only with
//!   `spec.eni.use-primary-address: true`. Only listed `addresses` are used: a
//!   primary IP missing from `addresses` is not added.
//! * [`eni_for_ip`]: the ENI of a Pod address and what the IPAM response needs
//!   from it (`master-mac`, `interface-number`, `gateway`, `cidrs`). The rules
//!   and the table the plugin installs from it are `crate::datapath`'s
//!   (`eni_rules`, `eni_table`).
//! * [`deficit`], [`excess`], [`per_cycle_allocation`], [`surge_allocate`],
//!   [`prefixes_for`], [`effective_pre_allocate`], [`effective_max_allocate`]:
//!   the operator's watermark math (`operator/pkg/ipam/nodemanager/node.go`),
//!   which `podnet plan --pool-mode eni` shows for a node's numbers (podnet has
//!   no EC2 operator, so the daemon does not run it). The instance limits come
//!   from [`super::sizing::plan_eni`], not recomputed here.
//!
//! The node resource types ([`Eni`], [`EniSpec`]) are the `CiliumNode`'s, from
//! `crate::resources`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use super::Family;
use super::ip_number::{from_number, to_number};
use super::sizing::{DEFAULT_ENI_PRE_ALLOCATE, ENI_PREFIX_ADDRESSES, EniOptions, plan_eni};
use crate::resources::{AllocatedPool, Eni, EniSpec};

/// The pool ENI addresses go to.
pub const ENI_POOL: &str = "default";

// ------------------------------------------------------------------ inventory

/// Why an ENI inventory (`status.eni.enis`) cannot be used: the ENI, the field
/// (`ip`, `address`, `prefix`, `subnet.cidr`, ...) and the bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EniError {
    #[error("ENI {eni:?}: {field} {value:?} is not an IP address")]
    NotAnIp {
        eni: String,
        field: &'static str,
        value: String,
    },
    #[error("ENI {eni:?}: {field} {value:?} is not a CIDR")]
    NotACidr {
        eni: String,
        field: &'static str,
        value: String,
    },
    #[error("ENI {eni:?}: {field} {value:?} has host bits set (the prefix is {})", .prefix.trunc())]
    HostBits {
        eni: String,
        field: &'static str,
        value: String,
        prefix: IpNet,
    },
    #[error("ENI {eni:?}: prefix {value:?} is not IPv4 (IPv6 prefixes go to ipv6-prefixes)")]
    PrefixNotIpv4 { eni: String, value: String },
    #[error("ENI {eni:?}: ipv6-prefix {value:?} is not IPv6")]
    PrefixNotIpv6 { eni: String, value: String },
    #[error("ENI {key:?}: id {id:?} does not match its key in status.eni.enis")]
    IdNotKey { key: String, id: String },
    #[error("ENI {eni:?}: mac {mac:?} is not a MAC address")]
    NotAMac { eni: String, mac: String },
    #[error("ENI {eni:?} has IPv4 addresses but no IPv4 subnet.cidr")]
    NoSubnet { eni: String },
    /// An IPv4 address (`/32`) or prefix outside the ENI's `subnet.cidr`.
    #[error(
        "ENI {eni:?}: {} is outside its subnet {}{subnet}",
        host_or_prefix(.member),
        subnet_label(.subnet_id)
    )]
    OutsideSubnet {
        eni: String,
        member: IpNet,
        subnet_id: String,
        subnet: IpNet,
    },
    #[error("{} is on both ENI {first:?} ({first_cidr}) and ENI {second:?}", address_or_cidr(.member))]
    OnTwoEnis {
        member: IpNet,
        first: String,
        first_cidr: IpNet,
        second: String,
    },
    #[error("ENI {first:?} ({first_cidr}) and ENI {second:?} ({second_cidr}) overlap")]
    Overlap {
        first: String,
        first_cidr: IpNet,
        second: String,
        second_cidr: IpNet,
    },
}

/// `address 10.0.1.5` for a /32, `prefix 10.0.2.0/28` otherwise.
fn host_or_prefix(n: &IpNet) -> String {
    if n.prefix_len() == 32 {
        format!("address {}", n.addr())
    } else {
        format!("prefix {n}")
    }
}

/// A single address as an address, a wider CIDR as a CIDR.
fn address_or_cidr(n: &IpNet) -> String {
    if n.prefix_len() == n.max_prefix_len() {
        n.addr().to_string()
    } else {
        n.to_string()
    }
}

/// `subnet-1 ` before the subnet CIDR, nothing when the ID is unknown.
fn subnet_label(id: &str) -> String {
    if id.is_empty() {
        String::new()
    } else {
        format!("{id} ")
    }
}

/// One CIDR of the ENI allocation and the ENI it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EniCidr {
    pub cidr: IpNet,
    pub eni_id: String,
}

/// Whether the node spec keeps this ENI away from Pods: `number` below
/// `first-interface-index`, or every `exclude-interface-tags` tag present with
/// the same value (an empty tag filter excludes nothing).
pub fn is_excluded(eni: &Eni, spec: &EniSpec) -> bool {
    if eni.number < spec.first_interface_index.unwrap_or(0) {
        return true;
    }
    !spec.exclude_interface_tags.is_empty()
        && spec
            .exclude_interface_tags
            .iter()
            .all(|(k, v)| eni.tags.get(k) == Some(v))
}

/// The ENI's ID: `id`, or the map key when `id` is empty.
fn eni_id<'a>(key: &'a str, eni: &'a Eni) -> &'a str {
    if eni.id.is_empty() { key } else { &eni.id }
}

fn parse_ip(eni: &str, field: &'static str, s: &str) -> Result<IpAddr, EniError> {
    s.trim().parse().map_err(|_| EniError::NotAnIp {
        eni: eni.into(),
        field,
        value: s.into(),
    })
}

fn parse_cidr(eni: &str, field: &'static str, s: &str) -> Result<IpNet, EniError> {
    s.trim().parse().map_err(|_| EniError::NotACidr {
        eni: eni.into(),
        field,
        value: s.into(),
    })
}

/// A prefix with no host bits set.
fn parse_prefix(eni: &str, field: &'static str, s: &str) -> Result<IpNet, EniError> {
    let n = parse_cidr(eni, field, s)?;
    if n.trunc() != n {
        return Err(EniError::HostBits {
            eni: eni.into(),
            field,
            value: s.into(),
            prefix: n,
        });
    }
    Ok(n)
}

/// The parsed addressing of one ENI.
struct Parsed {
    primary: Option<IpAddr>,
    subnet: Option<IpNet>,
    addresses: Vec<IpAddr>,
    /// IPv4 `prefixes` then `ipv6-prefixes`.
    prefixes: Vec<IpNet>,
}

fn parse_eni(id: &str, eni: &Eni) -> Result<Parsed, EniError> {
    let primary = match eni.ip.trim() {
        "" => None,
        s => Some(parse_ip(id, "ip", s)?),
    };
    let subnet = match eni.subnet.cidr.trim() {
        "" => None,
        s => Some(parse_cidr(id, "subnet.cidr", s)?),
    };
    let addresses = eni
        .addresses
        .iter()
        .map(|a| parse_ip(id, "address", a))
        .collect::<Result<Vec<_>, _>>()?;
    let mut prefixes = Vec::new();
    for p in &eni.prefixes {
        let n = parse_prefix(id, "prefix", p)?;
        if !matches!(n, IpNet::V4(_)) {
            return Err(EniError::PrefixNotIpv4 {
                eni: id.into(),
                value: p.clone(),
            });
        }
        prefixes.push(n);
    }
    for p in &eni.ipv6_prefixes {
        let n = parse_prefix(id, "ipv6-prefix", p)?;
        if !matches!(n, IpNet::V6(_)) {
            return Err(EniError::PrefixNotIpv6 {
                eni: id.into(),
                value: p.clone(),
            });
        }
        prefixes.push(n);
    }
    Ok(Parsed {
        primary,
        subnet,
        addresses,
        prefixes,
    })
}

fn same_family(a: &IpNet, ip: &IpAddr) -> bool {
    a.addr().is_ipv4() == ip.is_ipv4()
}

/// Checks an ENI inventory (`status.eni.enis`): every `ip`, address, prefix and
/// CIDR parses (prefixes without host bits, `prefixes` IPv4, `ipv6-prefixes`
/// IPv6), `mac` is a MAC address, an `id` matches its map key, every IPv4
/// address and prefix lies inside the ENI's `subnet.cidr` (required once the
/// ENI has any), and no address or prefix is on two ENIs. IPv6 addresses and
/// prefixes are not checked against the subnet (the schema's subnet has one
/// CIDR, the IPv4 one).
pub fn validate_inventory(enis: &BTreeMap<String, Eni>) -> Result<(), EniError> {
    let mut seen: Vec<(IpNet, &str)> = Vec::new();
    for (key, eni) in enis {
        if !eni.id.is_empty() && eni.id != *key {
            return Err(EniError::IdNotKey {
                key: key.clone(),
                id: eni.id.clone(),
            });
        }
        let id = eni_id(key, eni);
        let p = parse_eni(id, eni)?;
        if !eni.mac.is_empty() && parse_mac(&eni.mac).is_none() {
            return Err(EniError::NotAMac {
                eni: id.into(),
                mac: eni.mac.clone(),
            });
        }
        if !eni.vpc.primary_cidr.is_empty() {
            parse_cidr(id, "vpc.primary-cidr", &eni.vpc.primary_cidr)?;
        }
        for c in &eni.vpc.cidrs {
            parse_cidr(id, "vpc.cidrs entry", c)?;
        }
        let v4: Vec<IpNet> = p
            .primary
            .iter()
            .chain(p.addresses.iter())
            .map(|a| IpNet::from(*a))
            .chain(p.prefixes.iter().copied())
            .filter(|n| matches!(n, IpNet::V4(_)))
            .collect();
        if !v4.is_empty() {
            let Some(subnet) = p.subnet.filter(|s| matches!(s, IpNet::V4(_))) else {
                return Err(EniError::NoSubnet { eni: id.into() });
            };
            if let Some(n) = v4.iter().find(|n| !subnet.contains(*n)) {
                return Err(EniError::OutsideSubnet {
                    eni: id.into(),
                    member: *n,
                    subnet_id: eni.subnet.id.clone(),
                    subnet,
                });
            }
        }
        // Duplicates across ENIs (the same ENI may list prefix members).
        let mine: Vec<IpNet> = p
            .addresses
            .iter()
            .map(|a| IpNet::from(*a))
            .chain(p.prefixes.iter().copied())
            .collect();
        for n in &mine {
            if let Some((other, oid)) = seen
                .iter()
                .find(|(o, oid)| *oid != id && (o.contains(n) || n.contains(o)))
            {
                return Err(EniError::OnTwoEnis {
                    member: *n,
                    first: oid.to_string(),
                    first_cidr: *other,
                    second: id.into(),
                });
            }
        }
        seen.extend(mine.into_iter().map(|n| (n, id)));
    }
    Ok(())
}

/// `aa:bb:cc:dd:ee:ff` (or `-` separated) → bytes.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        if p.len() != 2 {
            return None;
        }
        mac[i] = u8::from_str_radix(p, 16).ok()?;
    }
    Some(mac)
}

/// The ENI inventory as per-ENI CIDRs, IPv4 sorted then IPv6 sorted (the
/// order of `allocated`): see the module comment for what is kept.
pub fn eni_cidrs(enis: &BTreeMap<String, Eni>, spec: &EniSpec) -> Result<Vec<EniCidr>, EniError> {
    let use_primary = spec.use_primary_address.unwrap_or(false);
    let mut out: Vec<EniCidr> = Vec::new();
    for (key, eni) in enis {
        if is_excluded(eni, spec) {
            continue;
        }
        let id = eni_id(key, eni);
        let p = parse_eni(id, eni)?;
        for n in &p.prefixes {
            out.push(EniCidr {
                cidr: *n,
                eni_id: id.to_string(),
            });
        }
        for a in &p.addresses {
            if !use_primary && Some(*a) == p.primary {
                continue;
            }
            if p.prefixes.iter().any(|n| n.contains(a)) {
                continue;
            }
            out.push(EniCidr {
                cidr: IpNet::from(*a),
                eni_id: id.to_string(),
            });
        }
    }
    out.sort_by(|a, b| {
        (a.cidr.addr().is_ipv6(), a.cidr.addr(), a.cidr.prefix_len()).cmp(&(
            b.cidr.addr().is_ipv6(),
            b.cidr.addr(),
            b.cidr.prefix_len(),
        ))
    });
    out.dedup_by(|a, b| a.cidr == b.cidr && a.eni_id == b.eni_id);
    for w in out.windows(2) {
        if w[0].cidr.contains(&w[1].cidr) || w[1].cidr.contains(&w[0].cidr) {
            return Err(EniError::Overlap {
                first: w[0].eni_id.clone(),
                first_cidr: w[0].cidr,
                second: w[1].eni_id.clone(),
                second_cidr: w[1].cidr,
            });
        }
    }
    Ok(out)
}

/// The ENI inventory converted into `spec.ipam.pools.allocated` (§6.3): one
/// entry for pool `default` with `allowFirstIP` / `allowLastIP` true, or none
/// when the node has no usable address.
pub fn eni_allocation(
    enis: &BTreeMap<String, Eni>,
    spec: &EniSpec,
) -> Result<Vec<AllocatedPool>, EniError> {
    let cidrs = eni_cidrs(enis, spec)?;
    if cidrs.is_empty() {
        return Ok(Vec::new());
    }
    Ok(vec![AllocatedPool {
        pool: ENI_POOL.to_string(),
        allow_first_ip: true,
        allow_last_ip: true,
        cidrs: cidrs.into_iter().map(|c| c.cidr).collect(),
    }])
}

// -------------------------------------------------------------------- routing

/// What the ENI host routing needs for one Pod address (`buildENIAllocationResult`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EniRouting {
    pub eni_id: String,
    /// The IPAM response's `master-mac`.
    pub mac: String,
    /// The IPAM response's `interface-number` (sent as a string); table 10 + it.
    pub interface_number: u32,
    /// The IPAM response's `gateway`: the ENI subnet's network address + 1.
    /// `None` when the subnet CIDR is unknown or of the other family (an IPv6
    /// Pod address; the schema's subnet carries only the IPv4 CIDR): the
    /// plugin then sets no routing up (§3.1, "empty gateway").
    pub gateway: Option<IpAddr>,
    /// The IPAM response's `cidrs` (ENI part): VPC `primary-cidr` then VPC
    /// `cidrs`, of the Pod address's family, duplicates dropped. The daemon
    /// appends `--ipv4-native-routing-cidr` and ip-masq-agent CIDRs itself.
    pub vpc_cidrs: Vec<IpNet>,
    pub subnet_cidr: Option<IpNet>,
}

/// The first host of a CIDR: network + 1 (`None` for /32, /128).
pub fn first_host(net: &IpNet) -> Option<IpAddr> {
    let net = net.trunc();
    if net.prefix_len() >= net.max_prefix_len() {
        return None;
    }
    Some(from_number(
        Family::of_net(&net),
        to_number(net.network()) + 1,
    ))
}

/// The ENI an address belongs to (one of its prefixes or IPv6 prefixes
/// contains it, or it is one of its addresses or its primary IP), with the
/// routing data. Entries that do not parse are ignored (see
/// [`validate_inventory`]). Exclusions are not applied: an excluded ENI's
/// addresses are never allocated in the first place.
pub fn eni_for_ip(enis: &BTreeMap<String, Eni>, ip: IpAddr) -> Option<EniRouting> {
    let owns = |eni: &Eni| {
        let prefix_hit = eni
            .prefixes
            .iter()
            .chain(eni.ipv6_prefixes.iter())
            .filter_map(|p| p.trim().parse::<IpNet>().ok())
            .any(|n| n.contains(&ip));
        prefix_hit
            || eni
                .addresses
                .iter()
                .chain(std::iter::once(&eni.ip))
                .filter_map(|a| a.trim().parse::<IpAddr>().ok())
                .any(|a| a == ip)
    };
    let (key, eni) = enis.iter().find(|(_, e)| owns(e))?;
    let subnet_cidr = eni.subnet.cidr.trim().parse::<IpNet>().ok();
    let gateway = subnet_cidr
        .filter(|s| same_family(s, &ip))
        .and_then(|s| first_host(&s));
    let mut vpc_cidrs: Vec<IpNet> = Vec::new();
    for c in std::iter::once(&eni.vpc.primary_cidr).chain(eni.vpc.cidrs.iter()) {
        if let Ok(n) = c.trim().parse::<IpNet>()
            && same_family(&n, &ip)
            && !vpc_cidrs.contains(&n)
        {
            vpc_cidrs.push(n);
        }
    }
    Some(EniRouting {
        eni_id: eni_id(key, eni).to_string(),
        mac: eni.mac.clone(),
        interface_number: eni.number,
        gateway,
        vpc_cidrs,
        subnet_cidr,
    })
}

// --------------------------------------------------------- allocation algorithm

/// `deficit (needed)` (`calculateNeededIPs`):
///
/// ```text
/// needed = preAllocate - (available - used)
/// if minAllocate > 0: needed = max(needed, minAllocate - available)
/// if maxAllocate > 0 and available + needed > maxAllocate: needed = maxAllocate - available
/// floor 0
/// ```
///
/// `pre_allocate` is the effective value ([`effective_pre_allocate`]: a 0 in
/// the spec means 8); `max_allocate` 0 = no limit. The chapter's "clamped to
/// maxAllocate" means the node never holds more than `maxAllocate` in total.
pub fn deficit(
    available: u64,
    used: u64,
    pre_allocate: u64,
    min_allocate: u64,
    max_allocate: u64,
) -> u64 {
    let (available, used) = (i128::from(available), i128::from(used));
    let mut needed = i128::from(pre_allocate) - (available - used);
    if min_allocate > 0 {
        needed = needed.max(i128::from(min_allocate) - available);
    }
    if max_allocate > 0 && available + needed > i128::from(max_allocate) {
        needed = i128::from(max_allocate) - available;
    }
    u64::try_from(needed.max(0)).unwrap_or(u64::MAX)
}

/// `excess` (`calculateExcessIPs`; acted on only with
/// `--aws-release-excess-ips`):
///
/// ```text
/// while used <= minAllocate + maxAboveWatermark:
///     available <= minAllocate + maxAboveWatermark       -> 0
///     used + preAllocate <= minAllocate + maxAboveWatermark
///                                                        -> available - minAllocate - maxAboveWatermark
/// otherwise  max(available - used - preAllocate - maxAboveWatermark, 0)
/// ```
///
/// i.e. while few addresses are used, `available` is kept at
/// `minAllocate + maxAboveWatermark`.
pub fn excess(
    available: u64,
    used: u64,
    pre_allocate: u64,
    min_allocate: u64,
    max_above_watermark: u64,
) -> u64 {
    let floor = min_allocate.saturating_add(max_above_watermark);
    if used <= floor {
        if available <= floor {
            return 0;
        }
        if used.saturating_add(pre_allocate) <= floor {
            return available - floor;
        }
    }
    available
        .saturating_sub(used)
        .saturating_sub(pre_allocate)
        .saturating_sub(max_above_watermark)
}

/// `surgeAllocate = pendingPods - needed` when more Pods are pending than the
/// deficit covers, else 0.
pub fn surge_allocate(pending_pods: u64, needed: u64) -> u64 {
    pending_pods.saturating_sub(needed)
}

/// Per-cycle allocation on the chosen ENI:
/// `min(AvailableOnSubnet, min(AvailableOnENI, needed + maxAboveWatermark +
/// surgeAllocate))`, with `surgeAllocate` from [`surge_allocate`]. With prefix
/// delegation the count is then turned into prefixes by [`prefixes_for`].
pub fn per_cycle_allocation(
    available_on_subnet: u64,
    available_on_eni: u64,
    needed: u64,
    max_above_watermark: u64,
    pending_pods: u64,
) -> u64 {
    let want = needed
        .saturating_add(max_above_watermark)
        .saturating_add(surge_allocate(pending_pods, needed));
    available_on_subnet.min(available_on_eni.min(want))
}

/// Prefix delegation: the `AssignENIPrefixes` count for `ips` addresses,
/// `ceil(ips / 16)`.
pub fn prefixes_for(ips: u64) -> u64 {
    ips.div_ceil(ENI_PREFIX_ADDRESSES)
}

/// The pre-allocate in force: `spec.ipam.pre-allocate` when set; when 0, the
/// default 8 lowered on small instances to `min(8, (adapters - firstIndex) x
/// (ipsPerENI - 1))` (`plan_eni`'s `effective_pre_allocate`; 0 when
/// first-interface-index leaves no adapter). With unknown instance limits (no
/// adapters or no IPs per ENI): 8. An explicit value is not lowered (upstream
/// only lowers the default).
pub fn effective_pre_allocate(spec_pre_allocate: u64, instance: &EniOptions) -> u64 {
    if spec_pre_allocate != 0 {
        return spec_pre_allocate;
    }
    let opts = EniOptions {
        pre_allocate: 0,
        ..*instance
    };
    match plan_eni(&opts) {
        Ok(plan) => u64::from(plan.effective_pre_allocate),
        Err(_) if opts.adapters > 0 && opts.first_interface_index >= opts.adapters => 0,
        Err(_) => u64::from(DEFAULT_ENI_PRE_ALLOCATE),
    }
}

/// The instance limit, the default max-allocate ([`plan_eni`]):
/// `(adapters - firstInterfaceIndex) x (ipv4PerENI - 1)`, x 16 with prefix
/// delegation, + 1 per ENI with use-primary-address (the chapter's rule; the
/// operator code leaves the primary out). 0 (= no limit in [`deficit`]) when
/// the limits are unknown or leave no adapter, as upstream.
pub fn instance_max_allocate(instance: &EniOptions) -> u64 {
    plan_eni(instance).map_or(0, |p| p.max_allocate)
}

/// `max-allocate` in force: `spec.ipam.max-allocate` when set (even above the
/// instance limit; upstream only warns), else the instance limit (0 when it is
/// unknown: no limit).
pub fn effective_max_allocate(spec_max_allocate: u64, instance: &EniOptions) -> u64 {
    if spec_max_allocate > 0 {
        return spec_max_allocate;
    }
    instance_max_allocate(instance)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{AwsSubnet, AwsVpc};

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn nets(v: &[&str]) -> Vec<IpNet> {
        v.iter().map(|x| x.parse().unwrap()).collect()
    }

    fn eni(id: &str, number: u32, subnet: &str, ip: &str) -> Eni {
        Eni {
            id: id.into(),
            ip: ip.into(),
            mac: format!("0a:00:00:00:00:{number:02x}"),
            number,
            subnet: AwsSubnet {
                id: format!("subnet-{number}"),
                cidr: subnet.into(),
            },
            vpc: AwsVpc {
                id: "vpc-1".into(),
                primary_cidr: "10.0.0.0/16".into(),
                cidrs: s(&["10.0.0.0/16", "100.64.0.0/16"]),
            },
            ..Eni::default()
        }
    }

    fn inventory() -> BTreeMap<String, Eni> {
        let mut e0 = eni("eni-0", 0, "10.0.0.0/24", "10.0.0.10");
        e0.addresses = s(&["10.0.0.10", "10.0.0.11"]);
        let mut e1 = eni("eni-1", 1, "10.0.1.0/24", "10.0.1.10");
        e1.addresses = s(&["10.0.1.10", "10.0.1.20", "10.0.1.21"]);
        let mut e2 = eni("eni-2", 2, "10.0.2.0/24", "10.0.2.5");
        // Prefix members listed as addresses too (as parseENI flattens them).
        e2.addresses = s(&["10.0.2.5", "10.0.2.16", "10.0.2.17", "10.0.2.40"]);
        e2.prefixes = s(&["10.0.2.16/28"]);
        e2.ipv6_prefixes = s(&["2600:1f00:0:1:a::/80"]);
        [e0, e1, e2]
            .into_iter()
            .map(|e| (e.id.clone(), e))
            .collect()
    }

    #[test]
    fn allocation_follows_section_6_3() {
        let inv = inventory();
        validate_inventory(&inv).unwrap();
        let spec = EniSpec::default();
        let pools = eni_allocation(&inv, &spec).unwrap();
        assert_eq!(pools.len(), 1);
        assert_eq!(pools[0].pool, "default");
        assert!(pools[0].allow_first_ip && pools[0].allow_last_ip);
        assert_eq!(
            pools[0].cidrs,
            nets(&[
                "10.0.0.11/32",
                "10.0.1.20/32",
                "10.0.1.21/32",
                "10.0.2.16/28",
                "10.0.2.40/32",
                "2600:1f00:0:1:a::/80",
            ])
        );
        let owners = eni_cidrs(&inv, &spec).unwrap();
        assert_eq!(owners[0].eni_id, "eni-0");
        assert_eq!(owners[3].eni_id, "eni-2");

        // first-interface-index 1 drops eth0; use-primary-address adds primaries.
        let spec = EniSpec {
            first_interface_index: Some(1),
            use_primary_address: Some(true),
            ..EniSpec::default()
        };
        let pools = eni_allocation(&inv, &spec).unwrap();
        assert_eq!(
            pools[0].cidrs,
            nets(&[
                "10.0.1.10/32",
                "10.0.1.20/32",
                "10.0.1.21/32",
                "10.0.2.5/32",
                "10.0.2.16/28",
                "10.0.2.40/32",
                "2600:1f00:0:1:a::/80",
            ])
        );

        // exclude-interface-tags: all tags must match.
        let mut inv2 = inv.clone();
        inv2.get_mut("eni-1")
            .unwrap()
            .tags
            .extend([("no-cilium".to_string(), "true".to_string())]);
        let mut spec = EniSpec::default();
        spec.exclude_interface_tags
            .insert("no-cilium".into(), "true".into());
        let c = eni_allocation(&inv2, &spec).unwrap();
        assert!(
            !c[0]
                .cidrs
                .iter()
                .any(|c| c.to_string().starts_with("10.0.1."))
        );
        spec.exclude_interface_tags
            .insert("other".into(), "x".into());
        let c = eni_allocation(&inv2, &spec).unwrap();
        assert!(
            c[0].cidrs
                .iter()
                .any(|c| c.to_string().starts_with("10.0.1."))
        );

        // Nothing usable: no pool entry.
        let spec = EniSpec {
            first_interface_index: Some(5),
            ..EniSpec::default()
        };
        assert!(eni_allocation(&inv, &spec).unwrap().is_empty());
        assert!(
            eni_allocation(&BTreeMap::new(), &EniSpec::default())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn ipv6_addresses_become_128() {
        let mut e = eni("eni-6", 1, "10.0.1.0/24", "10.0.1.10");
        e.addresses = s(&["2600:1f00::5", "10.0.1.11"]);
        let inv: BTreeMap<_, _> = [("eni-6".to_string(), e)].into();
        let p = eni_allocation(&inv, &EniSpec::default()).unwrap();
        assert_eq!(p[0].cidrs, nets(&["10.0.1.11/32", "2600:1f00::5/128"]));
    }

    #[test]
    fn routing_for_an_address() {
        let inv = inventory();
        let r = eni_for_ip(&inv, "10.0.2.20".parse().unwrap()).unwrap();
        assert_eq!(r.eni_id, "eni-2");
        assert_eq!(r.interface_number, 2);
        assert_eq!(r.mac, "0a:00:00:00:00:02");
        assert_eq!(r.gateway, Some("10.0.2.1".parse().unwrap()));
        assert_eq!(r.subnet_cidr, Some("10.0.2.0/24".parse().unwrap()));
        assert_eq!(
            r.vpc_cidrs,
            vec![
                "10.0.0.0/16".parse::<IpNet>().unwrap(),
                "100.64.0.0/16".parse().unwrap()
            ]
        );
        assert_eq!(
            eni_for_ip(&inv, "10.0.1.21".parse().unwrap())
                .unwrap()
                .eni_id,
            "eni-1"
        );
        // Primary IP (router IP with use-primary-address).
        assert_eq!(
            eni_for_ip(&inv, "10.0.1.10".parse().unwrap())
                .unwrap()
                .eni_id,
            "eni-1"
        );
        // IPv6 from the /80: no IPv4 gateway, no IPv4 VPC CIDRs.
        let r6 = eni_for_ip(&inv, "2600:1f00:0:1:a::9".parse().unwrap()).unwrap();
        assert_eq!(r6.eni_id, "eni-2");
        assert_eq!(r6.gateway, None);
        assert!(r6.vpc_cidrs.is_empty());
        assert!(eni_for_ip(&inv, "10.0.9.9".parse().unwrap()).is_none());
        assert_eq!(
            first_host(&"10.0.2.77/24".parse().unwrap()),
            Some("10.0.2.1".parse().unwrap())
        );
        assert_eq!(first_host(&"10.0.2.7/32".parse().unwrap()), None);
    }

    #[test]
    fn inventory_errors() {
        let base = inventory();
        let bad = |f: &dyn Fn(&mut BTreeMap<String, Eni>)| {
            let mut inv = base.clone();
            f(&mut inv);
            validate_inventory(&inv).unwrap_err().to_string()
        };
        let e = bad(&|i| {
            i.get_mut("eni-1")
                .unwrap()
                .addresses
                .push("10.0.1.x".into())
        });
        assert_eq!(
            e,
            "ENI \"eni-1\": address \"10.0.1.x\" is not an IP address"
        );
        let e = bad(&|i| {
            i.get_mut("eni-1")
                .unwrap()
                .addresses
                .push("10.0.7.1".into())
        });
        assert_eq!(
            e,
            "ENI \"eni-1\": address 10.0.7.1 is outside its subnet subnet-1 10.0.1.0/24"
        );
        let e = bad(&|i| {
            i.get_mut("eni-2")
                .unwrap()
                .prefixes
                .push("10.0.2.33/28".into())
        });
        assert!(e.contains("has host bits set"), "{e}");
        let e = bad(&|i| {
            i.get_mut("eni-2")
                .unwrap()
                .prefixes
                .push("10.0.3.0/28".into())
        });
        assert!(
            e.contains("prefix 10.0.3.0/28 is outside its subnet"),
            "{e}"
        );
        let e = bad(&|i| {
            i.get_mut("eni-2")
                .unwrap()
                .ipv6_prefixes
                .push("10.0.2.0/28".into())
        });
        assert!(e.contains("is not IPv6"), "{e}");
        let e = bad(&|i| i.get_mut("eni-1").unwrap().mac = "zz".into());
        assert!(e.contains("is not a MAC address"), "{e}");
        let e = bad(&|i| i.get_mut("eni-1").unwrap().subnet.cidr.clear());
        assert_eq!(
            e,
            "ENI \"eni-1\" has IPv4 addresses but no IPv4 subnet.cidr"
        );
        let e = bad(&|i| i.get_mut("eni-1").unwrap().id = "eni-9".into());
        assert!(e.contains("does not match its key"), "{e}");
        let e = bad(&|i| {
            let e1 = i.get_mut("eni-1").unwrap();
            e1.subnet.cidr = "10.0.0.0/16".into();
            e1.addresses.push("10.0.2.17".into());
        });
        assert!(e.contains("is on both ENI"), "{e}");
        // And eni_allocation refuses what does not parse.
        let mut inv = base.clone();
        inv.get_mut("eni-1").unwrap().prefixes.push("nope".into());
        assert!(eni_allocation(&inv, &EniSpec::default()).is_err());
    }

    #[test]
    fn each_inventory_error_names_the_eni_the_field_and_the_value() {
        let base = inventory();
        let bad = |f: &dyn Fn(&mut Eni)| {
            let mut inv = base.clone();
            if let Some(e) = inv.get_mut("eni-2") {
                f(e);
            }
            validate_inventory(&inv).unwrap_err().to_string()
        };
        assert_eq!(
            bad(&|e| e.subnet.cidr = "10.0.2.0".into()),
            "ENI \"eni-2\": subnet.cidr \"10.0.2.0\" is not a CIDR"
        );
        assert_eq!(
            bad(&|e| e.vpc.cidrs.push("nope".into())),
            "ENI \"eni-2\": vpc.cidrs entry \"nope\" is not a CIDR"
        );
        assert_eq!(
            bad(&|e| e.ip = "10.0.2.x".into()),
            "ENI \"eni-2\": ip \"10.0.2.x\" is not an IP address"
        );
        assert_eq!(
            bad(&|e| e.prefixes.push("10.0.2.33/28".into())),
            "ENI \"eni-2\": prefix \"10.0.2.33/28\" has host bits set (the prefix is 10.0.2.32/28)"
        );
        assert_eq!(
            bad(&|e| e.prefixes.push("fd00::/80".into())),
            "ENI \"eni-2\": prefix \"fd00::/80\" is not IPv4 (IPv6 prefixes go to ipv6-prefixes)"
        );
        assert_eq!(
            bad(&|e| e.ipv6_prefixes.push("10.0.2.64/28".into())),
            "ENI \"eni-2\": ipv6-prefix \"10.0.2.64/28\" is not IPv6"
        );
        assert_eq!(
            bad(&|e| e.mac = "zz".into()),
            "ENI \"eni-2\": mac \"zz\" is not a MAC address"
        );
        assert_eq!(
            bad(&|e| e.id = "eni-9".into()),
            "ENI \"eni-2\": id \"eni-9\" does not match its key in status.eni.enis"
        );
        assert_eq!(
            bad(&|e| {
                e.subnet.id.clear();
                e.subnet.cidr = "10.0.9.0/24".into();
            }),
            "ENI \"eni-2\": address 10.0.2.5 is outside its subnet 10.0.9.0/24"
        );
    }

    #[test]
    fn an_address_on_two_enis_is_refused_by_both_checks() {
        let mut inv = inventory();
        if let Some(e1) = inv.get_mut("eni-1") {
            e1.subnet.cidr = "10.0.0.0/16".into();
            e1.addresses.push("10.0.2.17".into());
        }
        assert_eq!(
            validate_inventory(&inv).unwrap_err().to_string(),
            "10.0.2.17 is on both ENI \"eni-1\" (10.0.2.17/32) and ENI \"eni-2\""
        );
        assert_eq!(
            eni_allocation(&inv, &EniSpec::default())
                .unwrap_err()
                .to_string(),
            "ENI \"eni-2\" (10.0.2.16/28) and ENI \"eni-1\" (10.0.2.17/32) overlap"
        );
    }

    #[test]
    fn deficit_worked_example() {
        // preAllocate=8, minAllocate=16, 10 available, 4 used:
        // max(8 + 4 - 10, 16 - 10) = 6.
        assert_eq!(deficit(10, 4, 8, 16, 0), 6);
        // Without min-allocate: 8 + 4 - 10 = 2.
        assert_eq!(deficit(10, 4, 8, 0, 0), 2);
        // Enough spare: floor 0.
        assert_eq!(deficit(30, 4, 8, 16, 0), 0);
        // max-allocate caps the total: 10 + 6 > 12 -> 2.
        assert_eq!(deficit(10, 4, 8, 16, 12), 2);
        // Already above max-allocate: 0, never negative.
        assert_eq!(deficit(20, 19, 8, 0, 12), 0);
        // Empty node.
        assert_eq!(deficit(0, 0, 8, 0, 0), 8);
        assert_eq!(deficit(0, 0, 8, 16, 0), 16);
    }

    #[test]
    fn excess_cases() {
        // Plain: 30 - 10 - 8 - 2 = 10.
        assert_eq!(excess(30, 10, 8, 0, 2), 10);
        assert_eq!(excess(15, 10, 8, 0, 0), 0);
        // Few used: keep available at minAllocate + maxAboveWatermark.
        assert_eq!(excess(16, 0, 8, 16, 0), 0);
        assert_eq!(excess(20, 2, 8, 16, 0), 4);
        // used <= 16 but used + pre > 16: the plain formula (20 - 10 - 8).
        assert_eq!(excess(20, 10, 8, 16, 0), 2);
        // Deficit and excess agree: after releasing the excess, no deficit.
        let (avail, used) = (40u64, 12u64);
        let ex = excess(avail, used, 8, 16, 4);
        assert_eq!(deficit(avail - ex, used, 8, 16, 0), 0);
    }

    #[test]
    fn per_cycle() {
        // needed 6 + watermark 2, no surge: 8, ENI has 5 free: 5.
        assert_eq!(per_cycle_allocation(100, 5, 6, 2, 0), 5);
        assert_eq!(per_cycle_allocation(100, 50, 6, 2, 0), 8);
        // 10 pending Pods > 6 needed: surge 4 -> 12.
        assert_eq!(surge_allocate(10, 6), 4);
        assert_eq!(surge_allocate(3, 6), 0);
        assert_eq!(per_cycle_allocation(100, 50, 6, 2, 10), 12);
        // The subnet runs out first.
        assert_eq!(per_cycle_allocation(3, 50, 6, 2, 10), 3);
        assert_eq!(prefixes_for(0), 0);
        assert_eq!(prefixes_for(1), 1);
        assert_eq!(prefixes_for(16), 1);
        assert_eq!(prefixes_for(17), 2);
    }

    #[test]
    fn instance_limits_reuse_plan_eni() {
        let m5 = EniOptions {
            adapters: 3,
            ipv4_per_eni: 10,
            ..EniOptions::default()
        };
        assert_eq!(instance_max_allocate(&m5), 27);
        assert_eq!(
            instance_max_allocate(&EniOptions {
                prefix_delegation: true,
                ..m5
            }),
            432
        );
        assert_eq!(
            instance_max_allocate(&EniOptions {
                first_interface_index: 1,
                ..m5
            }),
            18
        );
        assert_eq!(
            instance_max_allocate(&EniOptions {
                first_interface_index: 3,
                ..m5
            }),
            0
        );
        let unknown = EniOptions::default();
        assert_eq!(effective_max_allocate(50, &m5), 50);
        assert_eq!(effective_max_allocate(0, &m5), 27);
        assert_eq!(effective_max_allocate(0, &unknown), 0);

        // Pre-allocate: 0 -> 8, lowered on small instances; explicit kept.
        assert_eq!(effective_pre_allocate(0, &unknown), 8);
        assert_eq!(effective_pre_allocate(0, &m5), 8);
        let small = EniOptions {
            adapters: 2,
            ipv4_per_eni: 4,
            first_interface_index: 1,
            ..EniOptions::default()
        };
        assert_eq!(effective_pre_allocate(0, &small), 3);
        assert_eq!(effective_pre_allocate(12, &small), 12);
        assert_eq!(
            effective_pre_allocate(
                0,
                &EniOptions {
                    first_interface_index: 2,
                    ..small
                }
            ),
            0
        );
    }
}
