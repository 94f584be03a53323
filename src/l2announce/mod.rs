//! L2 announcements: LoadBalancer and external addresses of Services made
//! reachable on the nodes' own network, one node answering ARP and NDP for
//! each address at a time (docs/l2-announcements.md). `views` reads the
//! cluster's objects, `plan` decides which node answers for each address
//! (the same on every agent), `liveness` decides which nodes are live from
//! when each was last heard, and `heartbeat` sends and receives the UDP beats
//! between agents that feed it.

pub mod heartbeat;
pub mod liveness;
pub mod plan;
pub mod views;

#[cfg(test)]
mod tests;
