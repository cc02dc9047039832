//! `aether probe`: the client side of every e2e suite (spec/legs.md §1.4, §1.5).
//!
//! The local e2e suite calls this library in-process, from inside a pod's network namespace
//! (a [`Connector`] for that namespace); the CLI runs it from wherever it is started
//! (`ip netns exec <pod> aether probe ...`, `kubectl exec`).
//!
//! # Use
//!
//! 1. Pick a [`Connector`] ([`Connector::current`], or [`Connector::in_netns`] for a pod) and a
//!    [`Resolver`] ([`Resolver::cluster`] for a pod under the mesh, or
//!    [`Resolver::parse_resolv_conf`]).
//! 2. Describe one attempt as a [`Probe`]: where to connect ([`Dial`]), what to send
//!    ([`Send`]), the overall timeout, and for raw bytes when to stop reading ([`ReadUntil`]).
//! 3. [`Probe::run`] returns an [`Outcome`]: what a client observed, connect failures
//!    included. `Err` is kept for what broke before anything was attempted (a name that does
//!    not resolve, a namespace that cannot be entered).
//! 4. Or [`Probe::run_many`] makes many such requests ([`Many`]: how many, how many at once,
//!    on kept connections or not) and returns a [`Summary`]: answers counted by echo identity,
//!    pod, status, gRPC status and `x-aether-error` reason, and the failures by why.
//!
//! A gRPC call is one more [`Send`]: [`Send::Grpc`] with a [`GrpcRequest`]. tonic makes the
//! call, over an HTTP/2 connection the probe made through its [`Connector`] (so it runs in
//! the pod's namespace like every other request); the outcome has the HTTP status and headers
//! as they came (a mesh refusal is a plain `421` with `x-aether-error` and a text body, which
//! the outcome keeps) and, in [`Outcome::grpc`], the gRPC status and the echo's reply.
//!
//! The probe is an application: its sockets carry **no** socket mark, so the mesh captures them
//! like any other client's.

mod dns;
mod grpc;
mod h2c;
mod http1;
mod many;
mod outcome;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, Uri};
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream, UdpSocket};

pub use dns::{DnsError, Resolver};
pub use grpc::{GrpcAnswer, GrpcRequest};
pub use many::{Many, Summary};
pub use outcome::{Outcome, Timings};

use aether::netns::{Netns, NetnsError};
use aether::time;

/// The default bound on a response body or on the bytes a raw read keeps.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// Something broke before the attempt could be made.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Entering the pod's namespace failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// A client socket could not be created.
    #[error("create a {what} socket for {addr}")]
    Socket {
        /// `TCP` or `UDP`.
        what: &'static str,
        /// The destination.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The dial is not `<ip>:<port>`, `[<ipv6>]:<port>` or `<name>:<port>`.
    #[error("invalid dial {dial:?}: {why}")]
    InvalidDial {
        /// What was given.
        dial: String,
        /// What is wrong.
        why: &'static str,
    },
    /// The name did not resolve.
    #[error(transparent)]
    Dns(#[from] DnsError),
    /// The request cannot be expressed (an h2c header name or value that HTTP/2 refuses).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The TLS ClientHello could not be built.
    #[error("build a TLS ClientHello")]
    Tls(#[from] rustls::Error),
}

// === Connector ===

/// Creates client sockets, in the current network namespace or inside a pod's.
///
/// A socket keeps the namespace it was created in, so only creation happens inside
/// [`Netns::run`]; connecting and IO happen on the caller's task.
#[derive(Debug, Clone, Default)]
pub struct Connector {
    /// The pod's namespace and the home namespace to return to.
    netns: Option<(Arc<Netns>, Arc<Netns>)>,
}

impl Connector {
    /// Sockets in the caller's own namespace.
    pub fn current() -> Self {
        Self::default()
    }

    /// Sockets inside `netns`; `home` is the namespace the thread returns to.
    pub fn in_netns(netns: Arc<Netns>, home: Arc<Netns>) -> Self {
        Self {
            netns: Some((netns, home)),
        }
    }

    fn socket(&self, dst: SocketAddr, udp: bool) -> Result<Socket, ProbeError> {
        let (ty, proto, what) = if udp {
            (Type::DGRAM, Protocol::UDP, "UDP")
        } else {
            (Type::STREAM, Protocol::TCP, "TCP")
        };
        let make = || -> io::Result<Socket> {
            let s = Socket::new(Domain::for_address(dst), ty, Some(proto))?;
            s.set_nonblocking(true)?;
            if udp {
                let any: SocketAddr = match dst {
                    SocketAddr::V4(_) => (IpAddr::from([0u8; 4]), 0).into(),
                    SocketAddr::V6(_) => (IpAddr::from([0u16; 8]), 0).into(),
                };
                s.bind(&any.into())?;
            }
            Ok(s)
        };
        let made = match &self.netns {
            None => make(),
            Some((ns, home)) => ns.run(home, make)?,
        };
        made.map_err(|source| ProbeError::Socket {
            what,
            addr: dst,
            source,
        })
    }

    /// An unconnected TCP socket of `dst`'s family.
    pub fn tcp_socket(&self, dst: SocketAddr) -> Result<TcpSocket, ProbeError> {
        let s = self.socket(dst, false)?;
        Ok(TcpSocket::from_std_stream(s.into()))
    }

    /// A UDP socket bound to the unspecified address of `dst`'s family, any port.
    pub fn udp_socket(&self, dst: SocketAddr) -> Result<UdpSocket, ProbeError> {
        let s = self.socket(dst, true)?;
        UdpSocket::from_std(s.into()).map_err(|source| ProbeError::Socket {
            what: "UDP",
            addr: dst,
            source,
        })
    }
}

// === What to send ===

/// Where to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dial {
    /// An address.
    Addr(SocketAddr),
    /// A name, resolved by the [`Resolver`], and a port.
    Name {
        /// The name as written.
        name: String,
        /// The port.
        port: u16,
    },
}

impl Dial {
    /// Parse `<ip>:<port>`, `[<ipv6>]:<port>` or `<name>:<port>`.
    pub fn parse(s: &str) -> Result<Self, ProbeError> {
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(Self::Addr(a));
        }
        let invalid = |why| ProbeError::InvalidDial {
            dial: s.to_owned(),
            why,
        };
        let (name, port) = s.rsplit_once(':').ok_or_else(|| invalid("no port"))?;
        let port = port.parse::<u16>().map_err(|_| invalid("bad port"))?;
        if name.is_empty() || name.contains(':') || name.starts_with('[') {
            return Err(invalid("bad host"));
        }
        Ok(Self::Name {
            name: name.to_owned(),
            port,
        })
    }

    /// The authority a client would send for this dial: `<host>:<port>`, the port left out
    /// for 80 (as curl does for `http://<host>/`).
    pub fn authority(&self) -> String {
        let (host, port) = match self {
            Self::Addr(SocketAddr::V4(a)) => (a.ip().to_string(), a.port()),
            Self::Addr(SocketAddr::V6(a)) => (format!("[{}]", a.ip()), a.port()),
            Self::Name { name, port } => (name.clone(), *port),
        };
        if port == 80 {
            host
        } else {
            format!("{host}:{port}")
        }
    }
}

/// The HTTP version of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum HttpVersion {
    /// HTTP/1.0, written by hand.
    Http10,
    /// HTTP/1.1, written by hand.
    Http11,
    /// HTTP/2 with prior knowledge (h2c), through hyper's client.
    H2c,
}

/// The request-target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Origin form: a path and query (`/x?y`).
    Origin(String),
    /// Absolute form: `http://authority/path`, as an `http_proxy` client sends.
    Absolute(String),
    /// Authority form (`host:port`), for CONNECT.
    Authority(String),
}

/// The `Host` fields of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// One field: the absolute target's authority, the CONNECT target, or else the dial's
    /// [`Dial::authority`].
    Default,
    /// No `Host` field at all.
    None,
    /// Exactly these fields, in order (on h2c, literal `host` headers besides `:authority`).
    Values(Vec<String>),
}

/// One HTTP request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    /// The version.
    pub version: HttpVersion,
    /// The method, sent as written.
    pub method: String,
    /// The request-target.
    pub target: Target,
    /// The `Host` fields.
    pub host: Host,
    /// Further headers, in order, sent as written.
    pub headers: Vec<(String, String)>,
    /// The body (a Content-Length is added for a non-empty body unless one is given).
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// `GET <path>` in HTTP/1.1 with the default `Host`.
    pub fn get(path: impl Into<String>) -> Self {
        Self {
            version: HttpVersion::Http11,
            method: "GET".to_owned(),
            target: Target::Origin(path.into()),
            host: Host::Default,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// The authority the target itself names (absolute form, CONNECT).
    fn target_authority(&self) -> Option<String> {
        match &self.target {
            Target::Origin(_) => None,
            Target::Authority(a) => Some(a.clone()),
            Target::Absolute(url) => url
                .parse::<Uri>()
                .ok()
                .and_then(|u| u.authority().map(|a| a.as_str().to_owned())),
        }
    }

    /// The authority this request names as a mesh reads it (addressing.md §2): the absolute
    /// or CONNECT target's, else on h2c its `:authority`, else its one `Host` field (`None`
    /// with no field or several). `dial_authority` is the dial's [`Dial::authority`].
    pub fn authority(&self, dial_authority: &str) -> Option<String> {
        if let Some(a) = self.target_authority() {
            return Some(a);
        }
        match (&self.host, self.version) {
            (Host::Default, _) => Some(dial_authority.to_owned()),
            (Host::Values(v), HttpVersion::H2c) => v.first().cloned(),
            (Host::Values(v), _) if v.len() == 1 => v.first().cloned(),
            (Host::Values(_) | Host::None, _) => None,
        }
    }

    /// The `Host` field values to send.
    fn host_values(&self, default_authority: &str) -> Vec<String> {
        match &self.host {
            Host::None => Vec::new(),
            Host::Values(v) => v.clone(),
            Host::Default => vec![
                self.target_authority()
                    .unwrap_or_else(|| default_authority.to_owned()),
            ],
        }
    }
}

/// What the client sends once connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Send {
    /// An HTTP request; the answer is parsed.
    Http(HttpRequest),
    /// These bytes; then read what comes back.
    Raw(Vec<u8>),
    /// Nothing: wait for the server to speak first.
    Nothing,
    /// A real TLS ClientHello for `sni` (rustls); then read what comes back.
    TlsClientHello {
        /// The server name.
        sni: String,
    },
    /// One UDP datagram; the reply and its source are recorded.
    Udp(Vec<u8>),
    /// One unary gRPC call over h2c (tonic); the answer is in [`Outcome::grpc`].
    Grpc(GrpcRequest),
}

/// When a raw read (after [`Send::Raw`], [`Send::Nothing`] or [`Send::TlsClientHello`])
/// stops. Every read also stops when the peer closes, at the overall timeout, and at the body
/// limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadUntil {
    /// Only at close, timeout or the limit.
    Close,
    /// After this many bytes.
    Bytes(usize),
    /// After this many newline characters.
    Lines(usize),
    /// Once this text has arrived.
    Text(String),
    /// When nothing arrives for this long (also before the first byte).
    Idle(Duration),
}

/// One attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Where to connect.
    pub dial: Dial,
    /// What to send.
    pub send: Send,
    /// The bound on the whole attempt, connect included (the legs use 3 s).
    pub timeout: Duration,
    /// When a raw read stops.
    pub until: ReadUntil,
    /// The most body bytes kept.
    pub body_limit: usize,
}

impl Probe {
    /// An attempt with a 3 s timeout, reading raw answers until close, 64 KiB kept.
    pub fn new(dial: Dial, send: Send) -> Self {
        Self {
            dial,
            send,
            timeout: Duration::from_secs(3),
            until: ReadUntil::Close,
            body_limit: DEFAULT_BODY_LIMIT,
        }
    }
}

// === Running an attempt ===

/// Reads a TCP stream under the overall deadline, keeping the first-byte time.
struct Reader<'a> {
    stream: &'a mut TcpStream,
    buf: Vec<u8>,
    deadline: Instant,
    /// When sending ended: first-byte times count from here.
    sent: Instant,
    limit: usize,
    /// Set once the stream ended (close, reset, timeout, error).
    done: bool,
}

impl Reader<'_> {
    /// Read more into `buf`, waiting at most `wait` (and never past the deadline). False when
    /// nothing more will come; `out` then says why.
    async fn fill_within(&mut self, out: &mut Outcome, wait: Option<Duration>) -> bool {
        if self.done {
            return false;
        }
        if self.buf.len() >= self.limit.saturating_add(64 * 1024) {
            out.truncated = true;
            return false;
        }
        let left = self.deadline.saturating_duration_since(time::now());
        let (wait, idle) = match wait {
            Some(w) if w < left => (w, true),
            _ => (left, false),
        };
        let mut chunk = [0u8; 16384];
        match tokio::time::timeout(wait, self.stream.read(&mut chunk)).await {
            Err(_) => {
                if !idle {
                    out.timed_out = true;
                    self.done = true;
                }
                false
            }
            Ok(Ok(0)) => {
                out.peer_closed = true;
                self.done = true;
                false
            }
            Ok(Ok(n)) => {
                if out.timings.first_byte.is_none() {
                    out.timings.first_byte = Some(time::now().saturating_duration_since(self.sent));
                }
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            Ok(Err(e)) => {
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
                ) {
                    out.reset = true;
                } else {
                    out.error = Some(format!("read: {e}"));
                }
                self.done = true;
                false
            }
        }
    }

    async fn fill(&mut self, out: &mut Outcome) -> bool {
        self.fill_within(out, None).await
    }

    /// Move `n` buffered bytes to the body, keeping at most the limit.
    fn take_body(&mut self, n: usize, out: &mut Outcome) {
        let n = n.min(self.buf.len());
        let room = self.limit.saturating_sub(out.body.len());
        if n > room {
            out.truncated = true;
        }
        out.body.extend_from_slice(&self.buf[..n.min(room)]);
        self.buf.drain(..n);
    }

    /// Read raw bytes into the body until `until` says stop.
    async fn read_raw(&mut self, until: &ReadUntil, out: &mut Outcome) {
        let idle = match until {
            ReadUntil::Idle(d) => Some(*d),
            _ => None,
        };
        loop {
            let more = self.fill_within(out, idle).await;
            let n = self.buf.len();
            self.take_body(n, out);
            if !more || out.truncated {
                return;
            }
            let b = &out.body;
            let enough = match until {
                ReadUntil::Close | ReadUntil::Idle(_) => false,
                ReadUntil::Bytes(n) => b.len() >= *n,
                ReadUntil::Lines(n) => b.iter().filter(|c| **c == b'\n').count() >= *n,
                ReadUntil::Text(t) => b.windows(t.len().max(1)).any(|w| w == t.as_bytes()),
            };
            if enough {
                return;
            }
        }
    }
}

impl Probe {
    /// Make the attempt: resolve the dial, connect through `connector`, send, and read.
    pub async fn run(
        &self,
        connector: &Connector,
        resolver: &Resolver,
    ) -> Result<Outcome, ProbeError> {
        let addr = self.resolve(connector, resolver).await?;
        self.run_at(connector, addr).await
    }

    /// The address the dial names: itself, or the first address the resolver gives.
    pub async fn resolve(
        &self,
        connector: &Connector,
        resolver: &Resolver,
    ) -> Result<SocketAddr, ProbeError> {
        Ok(match &self.dial {
            Dial::Addr(a) => *a,
            Dial::Name { name, port } => {
                let ips = resolver.resolve(connector, name).await?;
                let ip = ips.first().copied().ok_or_else(|| DnsError::NotFound {
                    name: name.clone(),
                    tried: name.clone(),
                })?;
                SocketAddr::new(ip, *port)
            }
        })
    }

    /// One attempt on a new connection to `addr` (already resolved).
    async fn run_at(&self, connector: &Connector, addr: SocketAddr) -> Result<Outcome, ProbeError> {
        let start = time::now();
        let deadline = start + self.timeout;
        let mut out = Outcome {
            addr: Some(addr),
            ..Outcome::default()
        };
        if let Send::Udp(data) = &self.send {
            self.run_udp(connector, addr, data, deadline, &mut out)
                .await?;
        } else if let Some(stream) = self.connect(connector, addr, start, &mut out).await? {
            self.run_tcp(stream, deadline, &mut out).await?;
        }
        out.timings.total = Some(time::now().saturating_duration_since(start));
        Ok(out)
    }

    /// Connect to `addr` within the timeout. `out` records the connect time, the connection's
    /// source address, or why it failed (then `None`).
    async fn connect(
        &self,
        connector: &Connector,
        addr: SocketAddr,
        start: Instant,
        out: &mut Outcome,
    ) -> Result<Option<TcpStream>, ProbeError> {
        let socket = connector.tcp_socket(addr)?;
        let left = (start + self.timeout).saturating_duration_since(time::now());
        let connected = tokio::time::timeout(left, socket.connect(addr)).await;
        out.timings.connect = Some(time::now().saturating_duration_since(start));
        match connected {
            Err(_) => {
                out.timed_out = true;
                out.connect_error = Some("connect timed out".to_owned());
                Ok(None)
            }
            Ok(Err(e)) => {
                out.connect_error = Some(e.to_string());
                Ok(None)
            }
            Ok(Ok(stream)) => {
                out.connected = true;
                out.local_addr = stream.local_addr().ok();
                let _ = stream.set_nodelay(true);
                Ok(Some(stream))
            }
        }
    }

    async fn run_tcp(
        &self,
        mut stream: TcpStream,
        deadline: Instant,
        out: &mut Outcome,
    ) -> Result<(), ProbeError> {
        match &self.send {
            Send::Http(req) if req.version == HttpVersion::H2c => {
                self.run_h2c(req, stream, deadline, out).await
            }
            Send::Grpc(g) => self.run_grpc(g, stream, deadline, out).await,
            _ => self.exchange(&mut stream, deadline, out).await.map(|_| ()),
        }
    }

    /// Write the HTTP/1.x request (or the raw bytes, or nothing) on `stream` and read the
    /// answer into `out`. True when nothing was read beyond the answer (the connection is at a
    /// response boundary, so an HTTP/1.1 connection may carry another request).
    async fn exchange(
        &self,
        stream: &mut TcpStream,
        deadline: Instant,
        out: &mut Outcome,
    ) -> Result<bool, ProbeError> {
        let default_authority = self.dial.authority();
        let bytes = match &self.send {
            Send::Http(req) => http1::render(req, &default_authority),
            Send::Raw(b) => b.clone(),
            Send::Nothing | Send::Udp(_) | Send::Grpc(_) => Vec::new(),
            Send::TlsClientHello { sni } => client_hello(sni)?,
        };
        if !bytes.is_empty() {
            let left = deadline.saturating_duration_since(time::now());
            match tokio::time::timeout(left, stream.write_all(&bytes)).await {
                Err(_) => {
                    out.timed_out = true;
                    return Ok(false);
                }
                Ok(Err(e)) => {
                    if e.kind() == io::ErrorKind::ConnectionReset {
                        out.reset = true;
                    }
                    out.error = Some(format!("write: {e}"));
                    return Ok(false);
                }
                Ok(Ok(())) => {}
            }
        }
        let mut rd = Reader {
            stream,
            buf: Vec::new(),
            deadline,
            sent: time::now(),
            limit: self.body_limit,
            done: false,
        };
        match &self.send {
            Send::Http(req) => http1::read_response(&mut rd, &req.method, out).await,
            _ => rd.read_raw(&self.until, out).await,
        }
        Ok(rd.buf.is_empty())
    }

    async fn run_udp(
        &self,
        connector: &Connector,
        addr: SocketAddr,
        data: &[u8],
        deadline: Instant,
        out: &mut Outcome,
    ) -> Result<(), ProbeError> {
        let sock = connector.udp_socket(addr)?;
        if let Err(e) = sock.send_to(data, addr).await {
            out.error = Some(format!("send: {e}"));
            return Ok(());
        }
        let sent = time::now();
        let mut buf = vec![0u8; 65536];
        let left = deadline.saturating_duration_since(sent);
        match tokio::time::timeout(left, sock.recv_from(&mut buf)).await {
            Err(_) => out.timed_out = true,
            Ok(Err(e)) => out.error = Some(format!("receive: {e}")),
            Ok(Ok((n, from))) => {
                out.timings.first_byte = Some(time::now().saturating_duration_since(sent));
                out.truncated = n > self.body_limit;
                out.body = buf[..n.min(self.body_limit)].to_vec();
                out.udp_from = Some(from);
            }
        }
        Ok(())
    }
}

/// The bytes of a real TLS ClientHello for `sni`, as rustls writes it.
pub fn client_hello(sni: &str) -> Result<Vec<u8>, ProbeError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from(sni.to_owned())
        .map_err(|e| ProbeError::InvalidRequest(format!("server name {sni:?}: {e}")))?;
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name)?;
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out)
            .map_err(|e| ProbeError::InvalidRequest(format!("write the ClientHello: {e}")))?;
    }
    Ok(out)
}

/// Headers as `(name, value)` pairs in order, one per value, invalid UTF-8 replaced.
fn header_list(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(k, v)| {
            let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
            (k.as_str().to_owned(), v)
        })
        .collect()
}

/// Turn `\r`, `\n`, `\t`, `\0`, `\\` and `\xHH` escapes into bytes (the CLI's `--raw`).
pub fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            let (byte, used) = match b[i + 1] {
                b'r' => (Some(b'\r'), 2),
                b'n' => (Some(b'\n'), 2),
                b't' => (Some(b'\t'), 2),
                b'0' => (Some(0), 2),
                b'\\' => (Some(b'\\'), 2),
                b'x' if i + 3 < b.len() => {
                    let hex = std::str::from_utf8(&b[i + 2..i + 4]).ok();
                    match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                        Some(v) => (Some(v), 4),
                        None => (None, 1),
                    }
                }
                _ => (None, 1),
            };
            match byte {
                Some(v) => out.push(v),
                None => out.push(b'\\'),
            }
            i += used;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Wait for SIGTERM or SIGINT (`aether probe --idle`, the client pods' command).
pub async fn idle() -> io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_grpc;
#[cfg(test)]
mod tests_many;
