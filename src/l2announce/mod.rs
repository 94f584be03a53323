//! L2 announcements: which node answers ARP and NDP for each LoadBalancer
//! address. `liveness` decides which nodes are live from when each was last heard.

pub mod liveness;
