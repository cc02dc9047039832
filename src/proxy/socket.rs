//! Sockets of one pod: the [`SocketFactory`] seam (STYLE.md §6.2) every proxy task opens its
//! pod's sockets through, and asks for a captured connection's original destination.
//!
//! - [`SocketFactory::Netns`] ([`PodNet`]) is the daemon's: sockets opened inside the pod's
//!   network namespace, carrying the daemon's mark, transparent where asked (spec/model.md
//!   §12.4); the original destination is the accepted socket's local address, as TPROXY keeps
//!   it.
//! - `SocketFactory::Loopback` (`LoopbackNet`, only under `cfg(test)` or the `testing`
//!   feature) is the in-process test world's: plain sockets on 127/8 addresses, no namespace,
//!   no mark, no transparent bind, so that the data plane runs without root (STYLE.md §9
//!   lesson 2). A harness says which dialled address each capture listener stands for.
//!
//! May import: `netns`, `marks`; nothing of the proxy. Invariant: the production variant is
//! the only one compiled into the daemon.

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

/// Where a pod's sockets come from, and what a captured connection dialled. Enum dispatch
/// (no trait object): the daemon has one variant, tests one more.
#[derive(Debug, Clone)]
pub enum SocketFactory {
    /// The pod's network namespace ([`PodNet`]): the daemon's only factory.
    Netns(PodNet),
    /// Plain loopback sockets for the in-process test world.
    #[cfg(any(test, feature = "testing"))]
    Loopback(LoopbackNet),
}

impl From<PodNet> for SocketFactory {
    fn from(net: PodNet) -> Self {
        Self::Netns(net)
    }
}

impl SocketFactory {
    /// The pod's IP of `dst`'s family.
    pub fn ip_for(&self, dst: SocketAddr) -> Result<IpAddr, SocketError> {
        match self {
            Self::Netns(n) => n.ip_for(dst),
            #[cfg(any(test, feature = "testing"))]
            Self::Loopback(l) => l.ip_for(dst),
        }
    }

    /// A TCP listener on `addr` for the pod (transparent for the capture port).
    pub fn tcp_listener(
        &self,
        addr: SocketAddr,
        transparent: bool,
    ) -> Result<TcpListener, SocketError> {
        match self {
            Self::Netns(n) => n.tcp_listener(addr, transparent),
            #[cfg(any(test, feature = "testing"))]
            Self::Loopback(l) => l.tcp_listener(addr),
        }
    }

    /// A UDP socket bound to `addr` for the pod ([`PodNet::udp_socket`]).
    pub fn udp_socket(
        &self,
        addr: SocketAddr,
        transparent: bool,
    ) -> Result<UdpSocket, SocketError> {
        match self {
            Self::Netns(n) => n.udp_socket(addr, transparent),
            #[cfg(any(test, feature = "testing"))]
            Self::Loopback(l) => l.udp_socket(addr),
        }
    }

    /// Connect to `dst` for the pod, from `source`.
    pub async fn connect(&self, dst: SocketAddr, source: Source) -> Result<TcpStream, SocketError> {
        match self {
            Self::Netns(n) => n.connect(dst, source).await,
            #[cfg(any(test, feature = "testing"))]
            Self::Loopback(l) => l.connect(dst, source).await,
        }
    }

    /// The address and port a captured connection dialled (addressing.md §3): with TPROXY,
    /// the accepted socket's own local address.
    pub fn original_dst(&self, accepted: &TcpStream) -> io::Result<SocketAddr> {
        let local = accepted.local_addr()?;
        match self {
            Self::Netns(_) => Ok(local),
            #[cfg(any(test, feature = "testing"))]
            Self::Loopback(l) => Ok(l.dialled(local)),
        }
    }
}

/// The test world's pod network: plain sockets on 127/8 (Linux routes the whole block to
/// loopback, so any 127.x.y.z can be bound without root). The pod's "IP" is a loopback
/// address the model also gives it, so that the mesh hop and the application are reached
/// where the model says.
///
/// 1. Bind each capture listener on a loopback address of its own and say which dialled
///    address it stands for ([`LoopbackNet::stand_for`]); an accepted connection's original
///    destination is then that address (or the listener's own address when none was said).
/// 2. Where a dialled address must be reachable (a passthrough's destination), say where a
///    connection to it really goes ([`LoopbackNet::reach`]); other addresses are dialled as
///    they are.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone)]
pub struct LoopbackNet {
    ip: Ipv4Addr,
    stands_for: Arc<dashmap::DashMap<SocketAddr, SocketAddr>>,
    reaches: Arc<dashmap::DashMap<SocketAddr, SocketAddr>>,
}

#[cfg(any(test, feature = "testing"))]
impl LoopbackNet {
    /// A pod whose IP is `ip` (a 127/8 address).
    pub fn new(ip: Ipv4Addr) -> Self {
        Self {
            ip,
            stands_for: Arc::default(),
            reaches: Arc::default(),
        }
    }

    /// The pod's IP.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// A connection accepted on `listener` dialled `dialled`.
    pub fn stand_for(&self, listener: SocketAddr, dialled: SocketAddr) {
        self.stands_for.insert(listener, dialled);
    }

    /// A connection to `dialled` really goes to `to`.
    pub fn reach(&self, dialled: SocketAddr, to: SocketAddr) {
        self.reaches.insert(dialled, to);
    }

    fn dialled(&self, local: SocketAddr) -> SocketAddr {
        self.stands_for.get(&local).map_or(local, |d| *d)
    }

    fn ip_for(&self, dst: SocketAddr) -> Result<IpAddr, SocketError> {
        match dst {
            SocketAddr::V4(_) => Ok(IpAddr::V4(self.ip)),
            SocketAddr::V6(_) => Err(SocketError::NoAddress {
                family: "IPv6",
                dst,
            }),
        }
    }

    fn tcp_listener(&self, addr: SocketAddr) -> Result<TcpListener, SocketError> {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .and_then(|s| {
                s.set_reuse_address(true)?;
                s.set_nonblocking(true)?;
                s.bind(&addr.into())?;
                s.listen(1024)?;
                Ok(s)
            })
            .map_err(io_err("listen on", addr))?;
        TcpListener::from_std(s.into()).map_err(io_err("register listener", addr))
    }

    /// A UDP socket bound to `addr`, or where [`LoopbackNet::reach`] says `addr` really goes:
    /// the reply socket of a UDP flow binds the dialled address, which in the test world is
    /// the listener's own.
    fn udp_socket(&self, addr: SocketAddr) -> Result<UdpSocket, SocketError> {
        let addr = self.reaches.get(&addr).map_or(addr, |r| *r);
        let s = std::net::UdpSocket::bind(addr)
            .and_then(|s| {
                s.set_nonblocking(true)?;
                Ok(s)
            })
            .map_err(io_err("bind UDP", addr))?;
        UdpSocket::from_std(s).map_err(io_err("register UDP socket", addr))
    }

    /// A transparent source is bound plainly: every 127/8 address is local, so the
    /// application still sees the client pod's IP.
    async fn connect(&self, dst: SocketAddr, source: Source) -> Result<TcpStream, SocketError> {
        let local = match source {
            Source::PodIp => SocketAddr::new(self.ip_for(dst)?, 0),
            Source::Transparent(ip) => SocketAddr::new(ip, 0),
        };
        let to = self.reaches.get(&dst).map_or(dst, |r| *r);
        let socket = match to {
            SocketAddr::V4(_) => TcpSocket::new_v4(),
            SocketAddr::V6(_) => TcpSocket::new_v6(),
        }
        .map_err(io_err("bind", local))?;
        let _ = socket.set_nodelay(true);
        socket.bind(local).map_err(io_err("bind", local))?;
        socket.connect(to).await.map_err(io_err("connect to", dst))
    }
}
