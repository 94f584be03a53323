//! L2 announcements: which node answers ARP and NDP for each LoadBalancer
//! address. `liveness` decides which nodes are live from when each was last heard;
//! `heartbeat` sends and receives the UDP beats between agents that feed it.

pub mod heartbeat;
pub mod liveness;
