//! Node IPAM (Cilium's `enable-node-ipam`): Services of `loadBalancerClass:
//! io.cilium/node` (or without a class when `--default-lb-service-ipam nodeipam`)
//! get node addresses in `status.loadBalancer.ingress`. [`addresses`] picks them
//! (pure); [`controller`] watches Nodes, Services and EndpointSlices and writes.

pub mod addresses;
pub mod controller;
