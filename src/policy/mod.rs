//! NetworkPolicy, enforced on this node in nftables. Pure from the API objects to
//! the kernel's text: [`view`] reads Pods, Namespaces, NetworkPolicies and
//! ClusterNetworkPolicies (with
//! [`selector`] and each policy's [`problem`]s), [`compile`] makes this node's
//! [`state`] (named address sets per peer selector, a chain per policy-selected
//! local pod and direction; [`sets`] keeps the pods' sets between compiles,
//! brought up to date pod by pod) and [`state::State::diff`] what changed, [`render`]
//! writes the table or the update as an `nft` script, and [`table`] applies it
//! and, with [`check`], compares the kernel's table with a state;
//! [`explain`] keeps, with the state, which policies select each local pod;
//! [`verdict`] says how the final drops are logged for `podnet observe`.
//! Only `table` touches the kernel.

pub mod check;
pub mod compile;
pub mod enforcement;
pub mod explain;
mod ports;
pub mod problem;
pub mod render;
pub mod selector;
pub mod sets;
pub mod state;
pub mod table;
pub mod verdict;
pub mod view;
mod view_cluster;
mod view_policy;

#[cfg(test)]
pub(crate) mod fixtures;

pub use compile::{Cluster, Compiled, Local, compile, compile_with};
pub use enforcement::Enforcement;
pub use explain::Explanations;
pub use problem::{Problem, Why};
pub use state::{Diff, State};
pub use view::{ClusterPolicyView, NamespaceView, NodeView, PodView, PolicyView};
