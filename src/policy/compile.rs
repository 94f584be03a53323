//! From the cluster's policies, pods and namespaces to this node's [`State`],
//! with Kubernetes' semantics: a pod no policy selects for a direction is open
//! in it; each policy that selects a pod adds its rules (a union); a direction
//! in `policyTypes` with no rules denies it all. A peer's `podSelector` alone
//! means pods of the policy's namespace, a `namespaceSelector` alone every pod of
//! the namespaces it matches, both the pods it matches there; an `ipBlock` is
//! judged on the packet's address, pod or not, but for a node's router address
//! (`CiliumInternalIP`), which an ingress `ipBlock` judges as that node's
//! InternalIP of its family: another node's host traffic carries the router
//! address in tunnel routing and the InternalIP in native routing, and the two
//! modes agree ([`ROUTER_SET`], and a set per block of the router addresses it
//! judges inside). A router address two nodes list stands for neither. A pod's
//! own address is no exception: a pod that reaches itself through a Service
//! (kube-proxy's hairpin) is judged as any other peer. A named port of an
//! ingress rule is the selected pod's own; of an egress rule, the destination pod's (an
//! address-port set). What allows nothing (a port name no pod has, an invalid
//! field) opens nothing and breaks nothing else. With [`Enforcement::Always`]
//! (Cilium's `enable-policy always`) every local pod is isolated in both
//! directions, selected or not: only what policies allow passes (and, as ever,
//! what a pod's own node sends it; what a pod sends its node is judged as egress).
//!
//! ClusterNetworkPolicies (`policy.networking.k8s.io`) add two tiers around
//! NetworkPolicy, per local pod and direction ([`Chain`]): the Admin tier's
//! rules of the policies whose subject the pod is, by priority (lower first;
//! equal priorities by name), each policy's rules in the order written, the
//! first match deciding (Accept allows, Deny drops, Pass goes on to the
//! NetworkPolicy tier); then NetworkPolicy as above (an isolated pod drops what
//! it does not allow); then the Baseline tier's rules in the same order (a
//! Pass there allows: the default is all that follows); then allow.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use sha2::{Digest, Sha256};

use super::enforcement::Enforcement;
use super::explain::Explanations;
use super::ports::{self, Ports};
use super::problem::{Kind, Problem, Why};
use super::selector::{Labels, Selector};
use super::sets::{SetCache, Source};
use super::state::{
    Chain, ChainKey, Direction, Element, NODE_SET, PeerMatch, PortMatch, ROUTER_SET, Rule, Set,
    SetKind, State, TierRule, Verdict,
};
use super::view::{
    Action, ClusterPolicyView, ClusterRuleView, NamespaceView, NodeView, PeerView, PodView,
    PolicyView, PortView, Protocol, RuleView, Tier,
};
use crate::datapath::IFNAME_MAX_LEN;

/// A pod of this node, with its host link.
#[derive(Debug, Clone, Copy)]
pub struct Local<'a> {
    pub pod: &'a PodView,
    pub link: &'a str,
}

/// Everything the node's policy state is made of: the views as the caller
/// keeps them (the agent's mirrors), borrowed.
#[derive(Debug, Clone, Copy)]
pub struct Cluster<'a> {
    pub enforcement: Enforcement,
    pub policies: &'a [&'a PolicyView],
    /// The ClusterNetworkPolicies (none when their enforcement is off).
    pub cluster_policies: &'a [&'a ClusterPolicyView],
    /// Every pod of the cluster, this node's among them.
    pub pods: &'a [&'a PodView],
    /// This node's pods (of `pods`), each with its host link.
    pub local: &'a [Local<'a>],
    pub namespaces: &'a [&'a NamespaceView],
    /// This node's own addresses: traffic from them to its pods is allowed.
    pub node_addresses: &'a [IpAddr],
    /// Every node of the cluster (its CiliumNode), for the router addresses an
    /// ingress `ipBlock` judges as their node's InternalIP.
    pub nodes: &'a [NodeView],
}

/// The node's state and what stood in the way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compiled {
    pub state: State,
    /// Every problem of every policy, sorted, each once.
    pub problems: Vec<Problem>,
    /// Local pods (`namespace/name`) policies select whose host link cannot be
    /// named in nftables (not podnet's): not enforced.
    pub unusable_links: Vec<String>,
    /// Which policies select each local pod and what they allow (explain).
    pub explanations: Explanations,
}

/// Compiles the node's state, every set made from every pod.
pub fn compile(cluster: Cluster) -> Compiled {
    compile_with(cluster, &mut SetCache::default())
}

/// Compiles the node's state, the pods' sets taken from `cache` (which must be
/// up to date with `cluster`: [`SetCache::refresh`]) and kept there.
pub fn compile_with(cluster: Cluster, cache: &mut SetCache) -> Compiled {
    let mut b = Builder {
        cluster,
        cache,
        namespace_labels: cluster
            .namespaces
            .iter()
            .map(|n| (n.name.as_str(), &n.labels))
            .collect(),
        routers: routers(cluster.nodes),
        sets: BTreeMap::new(),
    };
    let node = cluster
        .node_addresses
        .iter()
        .map(|ip| Element::Address(*ip));
    b.sets
        .insert(NODE_SET.into(), Set::new(SetKind::Addresses, node));
    let mut chains = BTreeMap::new();
    let mut unusable_links = Vec::new();
    let mut explanations = Explanations::new(cluster.enforcement);
    let always = cluster.enforcement == Enforcement::Always;
    for &Local { pod, link } in cluster.local {
        let selecting: Vec<&PolicyView> = cluster
            .policies
            .iter()
            .filter(|p| p.namespace == pod.namespace && p.pod_selector.matches(&pod.labels))
            .copied()
            .collect();
        let subject_of = b.subject_of(pod);
        if selecting.is_empty() && subject_of.is_empty() && !always {
            continue;
        }
        let usable = nft_safe_link(link);
        explanations.record(pod, &selecting, &subject_of, usable);
        if !usable {
            unusable_links.push(format!("{}/{}", pod.namespace, pod.name));
            continue;
        }
        for direction in [Direction::Ingress, Direction::Egress] {
            if let Some(chain) = b.tiers(direction, pod, &selecting, &subject_of) {
                let key = ChainKey {
                    direction,
                    link: link.to_string(),
                };
                chains.insert(key, chain);
            }
        }
    }
    let mut problems: BTreeSet<Problem> = cluster
        .policies
        .iter()
        .flat_map(|p| p.problems.iter().cloned())
        .collect();
    let cluster_problems = cluster.cluster_policies.iter().flat_map(|p| &p.problems);
    problems.extend(cluster_problems.cloned());
    let port_names = port_names(cluster.pods);
    problems.extend(unknown_port_names(cluster.policies, &port_names));
    problems.extend(unknown_named_ports(cluster.cluster_policies, &port_names));
    b.cache.end_compile();
    Compiled {
        state: State {
            sets: b.sets,
            chains,
        },
        problems: problems.into_iter().collect(),
        unusable_links,
        explanations,
    }
}

fn rules_of(p: &PolicyView, direction: Direction) -> Option<&Vec<RuleView>> {
    match direction {
        Direction::Ingress => p.ingress.as_ref(),
        Direction::Egress => p.egress.as_ref(),
    }
}

/// A link name nftables takes in a chain name and a quoted set element.
fn nft_safe_link(link: &str) -> bool {
    (1..=IFNAME_MAX_LEN).contains(&link.len())
        && link
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Every node's router address, each with the address an ingress `ipBlock`
/// judges in its place: its node's first InternalIP of its family (the one
/// routes to the node go via), None when the node has none or when two nodes
/// list the router address.
fn routers(nodes: &[NodeView]) -> BTreeMap<IpAddr, Option<IpAddr>> {
    let mut judged = BTreeMap::new();
    for node in nodes {
        let own: BTreeSet<&IpAddr> = node.router_ips.iter().collect();
        for router in own {
            let family = |ip: &&IpAddr| ip.is_ipv4() == router.is_ipv4();
            let internal = node.internal_ips.iter().find(family).copied();
            judged
                .entry(*router)
                .and_modify(|judged_as| *judged_as = None)
                .or_insert(internal);
        }
    }
    judged
}

struct Builder<'a, 'c> {
    cluster: Cluster<'a>,
    cache: &'c mut SetCache,
    namespace_labels: BTreeMap<&'a str, &'a Labels>,
    /// [`routers`] of the cluster's nodes.
    routers: BTreeMap<IpAddr, Option<IpAddr>>,
    sets: BTreeMap<String, Set>,
}

impl<'a> Builder<'a, '_> {
    /// The ClusterNetworkPolicies whose subject `pod` is, in order of
    /// precedence: by tier, then priority (lower first), then name (the API
    /// leaves equal priorities to the implementation).
    fn subject_of(&self, pod: &PodView) -> Vec<&'a ClusterPolicyView> {
        let namespace_labels = self.labels_of(&pod.namespace);
        let mut placed: Vec<(Tier, u16, &'a ClusterPolicyView)> = self
            .cluster
            .cluster_policies
            .iter()
            .filter(|p| p.subject.matches(namespace_labels, &pod.labels))
            .filter_map(|p| p.place.map(|(tier, priority)| (tier, priority, *p)))
            .collect();
        placed.sort_by(|a, b| (a.0, a.1, &a.2.name).cmp(&(b.0, b.1, &b.2.name)));
        placed.into_iter().map(|(.., p)| p).collect()
    }

    /// `pod`'s judgement of `direction`: the Admin tier of `subject_of`, the
    /// NetworkPolicy tier of `selecting` ([`Self::chain`]), the Baseline tier;
    /// None when no tier has a say (the pod is open). Ingress from the node's
    /// own addresses is allowed before any tier.
    fn tiers(
        &mut self,
        direction: Direction,
        pod: &PodView,
        selecting: &[&PolicyView],
        subject_of: &[&ClusterPolicyView],
    ) -> Option<Chain> {
        let mut admin = self.tier(direction, pod, subject_of, Tier::Admin);
        let policy = self.chain(direction, pod, selecting);
        let baseline = self.tier(direction, pod, subject_of, Tier::Baseline);
        if admin.is_empty() && baseline.is_empty() {
            return policy.map(Chain::isolated);
        }
        if direction == Direction::Ingress {
            let node = Rule {
                peer: PeerMatch::Set(NODE_SET.into()),
                port: PortMatch::Any,
            };
            let node = TierRule {
                rule: node,
                verdict: Verdict::Allow,
                origin: None,
            };
            admin.insert(0, node);
        }
        Some(Chain {
            admin,
            policy,
            baseline,
        })
    }

    /// The rules of `tier` of `policies` (in order) for `pod`'s `direction`;
    /// a Baseline `Pass` allows (the default is all that follows it).
    fn tier(
        &mut self,
        direction: Direction,
        pod: &PodView,
        policies: &[&ClusterPolicyView],
        tier: Tier,
    ) -> Vec<TierRule> {
        let of_tier = policies
            .iter()
            .filter(|p| p.place.is_some_and(|(t, _)| t == tier));
        let rules: Vec<(&ClusterPolicyView, &ClusterRuleView)> = of_tier
            .flat_map(|p| {
                let list = match direction {
                    Direction::Ingress => &p.ingress,
                    Direction::Egress => &p.egress,
                };
                list.iter().map(move |r| (*p, r))
            })
            .collect();
        let mut out = Vec::new();
        for (p, r) in rules {
            let verdict = match (r.action, tier) {
                (Action::Accept, _) | (Action::Pass, Tier::Baseline) => Verdict::Allow,
                (Action::Deny, _) => Verdict::Deny,
                (Action::Pass, Tier::Admin) => Verdict::Pass,
            };
            let peers = match &r.peers {
                None => vec![PeerMatch::Any],
                Some(peers) => peers.iter().flat_map(|p| self.peer(direction, p)).collect(),
            };
            let origin = super::state::Origin {
                tier,
                policy: p.name.clone(),
                index: r.index,
                name: r.name.clone(),
            };
            let matches = self.matches(direction, pod, peers, &r.ports);
            out.extend(matches.into_iter().map(|rule| TierRule {
                rule,
                verdict,
                origin: Some(origin.clone()),
            }));
        }
        out
    }

    /// The rules of `pod`'s chain of `direction`: the union of the rules of
    /// every policy in `selecting` that has the direction (ingress: and its
    /// node's addresses first), or None when none has it (the pod is open;
    /// with `Always`, it is isolated all the same).
    fn chain(
        &mut self,
        direction: Direction,
        pod: &PodView,
        selecting: &[&PolicyView],
    ) -> Option<Vec<Rule>> {
        let lists: Vec<&Vec<RuleView>> = selecting
            .iter()
            .filter_map(|p| rules_of(p, direction))
            .collect();
        if lists.is_empty() && self.cluster.enforcement == Enforcement::Default {
            return None;
        }
        let rules: BTreeSet<Rule> = lists
            .into_iter()
            .flatten()
            .flat_map(|r| self.rule(direction, pod, r))
            .collect();
        let node = Rule {
            peer: PeerMatch::Set(NODE_SET.into()),
            port: PortMatch::Any,
        };
        let node = (direction == Direction::Ingress).then_some(node);
        Some(node.into_iter().chain(rules).collect())
    }

    /// The allow rules of `rule` for `target`'s chain of `direction`.
    fn rule(&mut self, direction: Direction, target: &PodView, rule: &RuleView) -> Vec<Rule> {
        let peers: Vec<PeerMatch> = match rule.peers.is_empty() {
            true => vec![PeerMatch::Any],
            false => rule
                .peers
                .iter()
                .flat_map(|p| self.peer(direction, p))
                .collect(),
        };
        self.matches(direction, target, peers, &rule.ports)
    }

    /// The rules matching any of `peers` on any of `ports` (empty: any port)
    /// for `target`'s chain of `direction`.
    fn matches(
        &mut self,
        direction: Direction,
        target: &PodView,
        peers: Vec<PeerMatch>,
        ports: &[PortView],
    ) -> Vec<Rule> {
        let port_matches = match ports.is_empty() {
            true => vec![PortMatch::Any],
            false => {
                let resolved = Ports::resolve(ports, |protocol, name| match direction {
                    Direction::Ingress => ports::own(target, protocol, name),
                    Direction::Egress => ports::Named::Set(self.named_port_set(protocol, name)),
                });
                resolved.matches()
            }
        };
        let pairs = peers
            .iter()
            .flat_map(|peer| port_matches.iter().map(move |port| (peer, port)));
        pairs
            .map(|(peer, port)| Rule {
                peer: peer.clone(),
                port: port.clone(),
            })
            .collect()
    }

    /// What `peer` allows in `direction`'s rules (nothing, or one match).
    fn peer(&mut self, direction: Direction, peer: &PeerView) -> Vec<PeerMatch> {
        match peer {
            PeerView::Nothing => Vec::new(),
            PeerView::Nodes(selector) => vec![PeerMatch::Set(self.nodes_set(selector))],
            PeerView::Block { net, except } => {
                // Excepts outside the block change nothing; one that covers it
                // leaves nothing.
                if except.iter().any(|e| e.contains(net)) {
                    return Vec::new();
                }
                let inside: Vec<_> = except
                    .iter()
                    .filter(|e| net.contains(*e))
                    .copied()
                    .collect();
                let except = ipnet::IpNet::aggregate(&inside);
                let routers = match direction {
                    Direction::Ingress => Some(self.block_routers(net, &except)),
                    Direction::Egress => None,
                };
                vec![PeerMatch::Block {
                    net: *net,
                    except,
                    routers,
                }]
            }
            PeerView::Pods { namespaces, pods } => {
                let name = set_name("peer", &(namespaces, pods));
                if !self.sets.contains_key(&name) {
                    let source = Source::Peer { namespaces, pods };
                    let set = self.kept_set(&name, source);
                    self.sets.insert(name.clone(), set);
                }
                vec![PeerMatch::Set(name)]
            }
        }
    }

    /// The set of the router addresses whose node's InternalIP is in `net`
    /// and in none of `except` (and [`ROUTER_SET`], every router address,
    /// which the block's own match leaves out).
    fn block_routers(&mut self, net: &ipnet::IpNet, except: &[ipnet::IpNet]) -> String {
        let every = self.routers.keys().map(|ip| Element::Address(*ip));
        let every = Set::new(SetKind::Addresses, every);
        self.sets.entry(ROUTER_SET.into()).or_insert(every);
        let name = set_name("block", &(net, except));
        if !self.sets.contains_key(&name) {
            let inside = |ip: &IpAddr| net.contains(ip) && !except.iter().any(|e| e.contains(ip));
            let judged_inside = self
                .routers
                .iter()
                .filter(|(_, judged_as)| judged_as.as_ref().is_some_and(inside));
            let elements = judged_inside.map(|(router, _)| Element::Address(*router));
            let set = Set::new(SetKind::Addresses, elements);
            self.sets.insert(name.clone(), set);
        }
        name
    }

    /// The set of the InternalIPs of the nodes `selector` matches.
    fn nodes_set(&mut self, selector: &Selector) -> String {
        let name = set_name("nodes", selector);
        if !self.sets.contains_key(&name) {
            let nodes = self.cluster.nodes.iter();
            let matching = nodes.filter(|n| selector.matches(&n.labels));
            let elements = matching.flat_map(|n| &n.internal_ips);
            let set = Set::new(SetKind::Addresses, elements.map(|ip| Element::Address(*ip)));
            self.sets.insert(name.clone(), set);
        }
        name
    }

    fn labels_of(&self, namespace: &str) -> &'a Labels {
        labels_in(&self.namespace_labels, namespace)
    }

    /// The set `name` of `source`, from the cache (made from every pod once).
    fn kept_set(&mut self, name: &str, source: Source) -> Set {
        let namespace_labels = &self.namespace_labels;
        let labels_of = |ns: &str| labels_in(namespace_labels, ns);
        self.cache.get(name, source, self.cluster.pods, labels_of)
    }

    /// The set of every pod's address and number for the named port.
    fn named_port_set(&mut self, protocol: Protocol, name: &str) -> String {
        let set_name = set_name("port", &(protocol, name));
        if !self.sets.contains_key(&set_name) {
            let set = self.kept_set(&set_name, Source::Port { protocol, name });
            self.sets.insert(set_name.clone(), set);
        }
        set_name
    }
}

/// The labels of `namespace` in `labels` (none when it is not there).
pub fn labels_in<'a>(labels: &BTreeMap<&str, &'a Labels>, namespace: &str) -> &'a Labels {
    static NONE: Labels = Labels::new();
    labels.get(namespace).copied().unwrap_or(&NONE)
}

/// A set's name: `prefix_` and 12 hex digits of a hash of what it stands for, so
/// the same selector (or port name) always gives the same set.
fn set_name(prefix: &str, key: &impl std::fmt::Debug) -> String {
    let digest = Sha256::digest(format!("{key:?}").as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("{prefix}_{hex}")
}

/// Every container port name of `pods`, with its protocol (one walk of the
/// pods for both kinds of policy's checks).
fn port_names<'a>(pods: &[&'a PodView]) -> BTreeSet<(Protocol, &'a str)> {
    pods.iter()
        .flat_map(|p| &p.ports)
        .map(|np| (np.protocol, np.name.as_str()))
        .collect()
}

/// A problem for every named port of a rule that no pod of the cluster has
/// (`known`: [`port_names`]).
fn unknown_port_names(
    policies: &[&PolicyView],
    known: &BTreeSet<(Protocol, &str)>,
) -> Vec<Problem> {
    let mut found = Vec::new();
    for p in policies {
        for direction in [Direction::Ingress, Direction::Egress] {
            for (i, rule) in rules_of(p, direction).into_iter().flatten().enumerate() {
                for (k, protocol, name) in ports::names(&rule.ports) {
                    if !known.contains(&(protocol, name)) {
                        found.push(Problem {
                            kind: Kind::NetworkPolicy,
                            namespace: p.namespace.clone(),
                            name: p.name.clone(),
                            field: format!("spec.{}[{i}].ports[{k}].port", direction.as_str()),
                            why: Why::UnknownPortName {
                                name: name.to_string(),
                                protocol: protocol.api_name().into(),
                            },
                        });
                    }
                }
            }
        }
    }
    found
}

/// A problem for each `destinationNamedPort` of `policies` that no container
/// port has, of any protocol (`known`: [`port_names`]; a rule of it matches
/// nothing then).
fn unknown_named_ports(
    policies: &[&ClusterPolicyView],
    known: &BTreeSet<(Protocol, &str)>,
) -> Vec<Problem> {
    let has = |name: &str| {
        [Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
            .iter()
            .any(|protocol| known.contains(&(*protocol, name)))
    };
    let uses = policies
        .iter()
        .flat_map(|p| p.named_ports.iter().map(move |u| (*p, u)));
    uses.filter(|(_, u)| !has(&u.name))
        .map(|(p, u)| Problem {
            kind: Kind::ClusterNetworkPolicy,
            namespace: String::new(),
            name: p.name.clone(),
            field: u.field.clone(),
            why: Why::UnknownNamedPort(u.name.clone()),
        })
        .collect()
}

#[cfg(test)]
#[path = "tests/compile.rs"]
mod tests;

#[cfg(test)]
#[path = "tests/compile_cluster.rs"]
mod cluster_tests;
