//! The Kubernetes access layer shared by the agent's backend (`node`) and the
//! operator: the connection ([`connect`]); which version of each Cilium kind to
//! use, found by asking the API server what it serves ([`discovery`]), so podnet
//! runs on Cilium 1.20's own CRDs as well as on its own (`deploy/crds/`), and
//! waits for a CRD that is missing; one typed decode of what the API server
//! sends, typed watches and lists, and the server-side-apply body ([`objects`]);
//! a watched kind's local copy, the one relist buffer ([`mirror`]); the pool
//! definitions and the one watch that says when to read them again
//! ([`pool_watch`], the agent's and the operator's); this node's
//! Pods and Events for the agent's leak check ([`node_pods`]); Pods and
//! CiliumNodes as the duplicate check sees them ([`address_views`]); how an
//! Event is built and posted, and what keeps Events about different values
//! apart ([`events`]); a `resource.Quantity` string's value ([`quantity`]).

pub mod address_views;
pub mod connect;
pub mod discovery;
pub mod events;
pub mod leak_events;
pub mod mirror;
pub mod node_pods;
pub mod objects;
pub mod pool_watch;
pub mod quantity;

pub use discovery::{CiliumKind, DiscoveryError, resolve, resolve_waiting};
