//! The heartbeat's two UDP sockets: `0.0.0.0:port` and `[::]:port`, the IPv6 one
//! IPv6-only so both can bind. One family failing to bind (no IPv6 on the node)
//! leaves the other; both failing is an error.

use super::HeartbeatError;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrIn6, sockopt};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::AsRawFd;
use tokio::net::UdpSocket;

pub struct Sockets {
    pub v4: Option<UdpSocket>,
    pub v6: Option<UdpSocket>,
}

impl Sockets {
    pub async fn bind(port: u16) -> Result<Self, HeartbeatError> {
        let v4 = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)).await;
        let v6 = bind_v6_only(port);
        match (v4, v6) {
            (Err(v4), Err(v6)) => Err(HeartbeatError::Bind { port, v4, v6 }),
            (v4, v6) => {
                if let Err(e) = &v4 {
                    tracing::warn!(port, error = %e, "L2 announcement heartbeats: cannot bind 0.0.0.0; IPv4 peers will not be heard");
                }
                if let Err(e) = &v6 {
                    tracing::info!(port, error = %e, "L2 announcement heartbeats: cannot bind [::]; IPv6 peers will not be heard");
                }
                Ok(Sockets {
                    v4: v4.ok(),
                    v6: v6.ok(),
                })
            }
        }
    }

    /// The socket that sends to `to`, when its family is bound.
    pub fn towards(&self, to: &SocketAddr) -> Option<&UdpSocket> {
        match to {
            SocketAddr::V4(_) => self.v4.as_ref(),
            SocketAddr::V6(_) => self.v6.as_ref(),
        }
    }
}

fn bind_v6_only(port: u16) -> io::Result<UdpSocket> {
    let fd = socket::socket(
        AddressFamily::Inet6,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    socket::setsockopt(&fd, sockopt::Ipv6V6Only, &true)?;
    let any = SockaddrIn6::from(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, port, 0, 0));
    socket::bind(fd.as_raw_fd(), &any)?;
    UdpSocket::from_std(std::net::UdpSocket::from(fd))
}

/// The next datagram on `socket` into `buf`; never ready when the family is not bound.
pub async fn recv_from(
    socket: Option<&UdpSocket>,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr)> {
    match socket {
        Some(socket) => socket.recv_from(buf).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn ipv6_here() -> bool {
        std::net::UdpSocket::bind("[::1]:0").is_ok()
    }

    /// `N` distinct UDP ports free on 0.0.0.0 when this returns.
    pub(in crate::l2announce::heartbeat) fn free_ports<const N: usize>() -> [u16; N] {
        let held: [std::net::UdpSocket; N] =
            std::array::from_fn(|_| std::net::UdpSocket::bind("0.0.0.0:0").unwrap());
        held.map(|socket| socket.local_addr().unwrap().port())
    }

    #[tokio::test]
    async fn both_families_bind_the_same_port_and_a_second_bind_fails_naming_it() {
        if !ipv6_here() {
            return crate::test_skip::skip("heartbeat bind", "no IPv6 on this host");
        }
        let [port] = free_ports();
        let sockets = Sockets::bind(port).await.unwrap();
        // IPv6-only, so [::]:port does not collide with 0.0.0.0:port.
        let v4 = sockets.v4.as_ref().unwrap().local_addr().unwrap();
        let v6 = sockets.v6.as_ref().unwrap().local_addr().unwrap();
        assert_eq!((v4.port(), v6.port()), (port, port));
        let Err(e) = Sockets::bind(port).await else {
            panic!("both families are taken: binding must fail");
        };
        let message = e.to_string();
        assert!(message.contains(&format!("port {port}")), "{message}");
    }

    #[tokio::test]
    async fn one_family_taken_leaves_the_other() {
        if !ipv6_here() {
            return crate::test_skip::skip("heartbeat bind", "no IPv6 on this host");
        }
        let taken_v4 = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        let port = taken_v4.local_addr().unwrap().port();
        let sockets = Sockets::bind(port).await.unwrap();
        assert!(sockets.v4.is_none());
        assert_eq!(sockets.v6.unwrap().local_addr().unwrap().port(), port);
    }
}
