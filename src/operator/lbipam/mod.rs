//! LB IPAM (Cilium's `operator/pkg/lbipam`): addresses from
//! `CiliumLoadBalancerIPPool`s for `type: LoadBalancer` Services, written to
//! `status.loadBalancer.ingress` with the condition
//! `cilium.io/IPAMRequestSatisfied`; pools get `cilium.io/PoolConflict` and their
//! counts. [`pools`] and [`services`] are pure; [`controller`] watches the API
//! server and writes. Dormant until the first pool exists.

pub mod controller;
pub mod metrics;
pub mod pools;
pub mod services;
