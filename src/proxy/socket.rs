//! Sockets of one pod: opened inside its network namespace, carrying the daemon's mark
//! (spec/model.md §12.4).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};

use crate::marks::SOCKET_MARK;
use crate::netns::{Netns, NetnsError};

/// Opening a socket for a pod failed.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Entering the pod's namespace failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The socket call failed.
    #[error("{what} {addr}")]
    Io {
        /// What was attempted (`bind`, `connect`, ...).
        what: &'static str,
        /// The address involved.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The pod has no address of the destination's family.
    #[error("the pod has no {family} address to reach {dst}")]
    NoAddress {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// The destination.
        dst: SocketAddr,
    },
}

/// The source address of a connection the daemon opens for a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The pod's own IP of the destination's family.
    PodIp,
    /// A transparent bind to another address (the client pod's IP on a delivery to the
    /// application, spec/model.md §12.4).
    Transparent(IpAddr),
}

/// One pod's network: its namespace and addresses.
#[derive(Debug, Clone)]
pub struct PodNet {
    /// The pod's namespace.
    pub netns: Arc<Netns>,
    /// The daemon's own namespace, returned to after every socket call.
    pub home: Arc<Netns>,
    /// Its IPv4 address.
    pub ipv4: Option<Ipv4Addr>,
    /// Its IPv6 address.
    pub ipv6: Option<Ipv6Addr>,
}

fn io_err(what: &'static str, addr: SocketAddr) -> impl FnOnce(io::Error) -> SocketError {
    move |source| SocketError::Io { what, addr, source }
}

fn set_transparent(s: &SockRef<'_>, addr: SocketAddr) -> io::Result<()> {
    match addr {
        SocketAddr::V4(_) => s.set_ip_transparent_v4(true),
        SocketAddr::V6(_) => s.set_ip_transparent_v6(true),
    }
}

impl PodNet {
    /// The pod's IP of `dst`'s family.
    pub fn ip_for(&self, dst: SocketAddr) -> Result<IpAddr, SocketError> {
        match dst {
            SocketAddr::V4(_) => self.ipv4.map(IpAddr::V4).ok_or(SocketError::NoAddress {
                family: "IPv4",
                dst,
            }),
            SocketAddr::V6(_) => self.ipv6.map(IpAddr::V6).ok_or(SocketError::NoAddress {
                family: "IPv6",
                dst,
            }),
        }
    }

    /// A socket bound to `addr` inside the pod, with the mark, non-blocking (and listening, for
    /// TCP).
    fn bound(
        &self,
        kind: Type,
        addr: SocketAddr,
        transparent: bool,
    ) -> Result<Socket, SocketError> {
        let stream = kind == Type::STREAM;
        let socket = self.netns.run(&self.home, || -> io::Result<Socket> {
            let protocol = if stream { Protocol::TCP } else { Protocol::UDP };
            let s = Socket::new(Domain::for_address(addr), kind, Some(protocol))?;
            s.set_reuse_address(true)?;
            if addr.is_ipv6() {
                s.set_only_v6(true)?;
            }
            if transparent {
                set_transparent(&SockRef::from(&s), addr)?;
            }
            s.set_mark(SOCKET_MARK)?;
            s.set_nonblocking(true)?;
            s.bind(&addr.into())?;
            if stream {
                s.listen(1024)?;
            }
            Ok(s)
        })?;
        socket.map_err(io_err(if stream { "listen on" } else { "bind UDP" }, addr))
    }

    /// A TCP listener on `addr` in the pod (transparent for the capture port).
    pub fn tcp_listener(
        &self,
        addr: SocketAddr,
        transparent: bool,
    ) -> Result<TcpListener, SocketError> {
        let socket = self.bound(Type::STREAM, addr, transparent)?;
        TcpListener::from_std(socket.into()).map_err(io_err("register listener", addr))
    }

    /// A UDP socket bound to `addr` in the pod. `transparent` allows a non-local `addr` (the
    /// reply socket of addressing.md §10.2) and receiving TPROXYed datagrams.
    pub fn udp_socket(
        &self,
        addr: SocketAddr,
        transparent: bool,
    ) -> Result<UdpSocket, SocketError> {
        let socket = self.bound(Type::DGRAM, addr, transparent)?;
        UdpSocket::from_std(socket.into()).map_err(io_err("register UDP socket", addr))
    }

    /// Connect to `dst` from inside the pod, with the daemon's mark.
    pub async fn connect(&self, dst: SocketAddr, source: Source) -> Result<TcpStream, SocketError> {
        let local = match source {
            Source::PodIp => SocketAddr::new(self.ip_for(dst)?, 0),
            Source::Transparent(ip) => SocketAddr::new(ip, 0),
        };
        let socket = self.netns.run(&self.home, || -> io::Result<TcpSocket> {
            let s = Socket::new(Domain::for_address(dst), Type::STREAM, Some(Protocol::TCP))?;
            s.set_mark(SOCKET_MARK)?;
            s.set_tcp_nodelay(true)?;
            if matches!(source, Source::Transparent(_)) {
                set_transparent(&SockRef::from(&s), dst)?;
            }
            s.set_nonblocking(true)?;
            // Bind the address only; the port is chosen at connect time, per 4-tuple, so many
            // connections from one address to many destinations never run out of ports (a
            // bind to port 0 would reserve one from half the ephemeral range each).
            let _ = nix::sys::socket::setsockopt(
                &s,
                nix::sys::socket::sockopt::IpBindAddressNoPort,
                &true,
            );
            s.bind(&local.into())?;
            Ok(TcpSocket::from_std_stream(s.into()))
        })?;
        let socket = socket.map_err(io_err("bind", local))?;
        socket.connect(dst).await.map_err(io_err("connect to", dst))
    }
}
