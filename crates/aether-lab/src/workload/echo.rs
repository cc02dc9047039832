//! `aether echo`: the echo workload of spec/legs.md §1.3.
//!
//! Every listener answers with its workload's name and its own port, so a client can tell
//! which port of which workload it reached:
//!
//! | kind | behaviour |
//! |---|---|
//! | HTTP (HTTP/1.x and h2c prior knowledge on one port) | `200`, body `<workload>:<port>\n`; headers `x-echo-host` (the authority as received: each `Host` field for HTTP/1, `:authority` for HTTP/2), `x-echo-pod`, `x-echo-peer`. `/status/<code>` answers that status with the same body; `/headers` adds one `<name>: <value>` line per request header; each `x-echo-set: <name>: <value>` request header adds that header to the response; `x-echo-json: 1` asks for a JSON body ([`EchoJson`]). |
//! | raw TCP | sends nothing first; on the first bytes writes `<workload>:<port>\n` and `pod <pod>\n`, then echoes everything, those first bytes included |
//! | server-first TCP | on accept writes `<workload>:<port> ready\n` and `pod <pod>\n`, then echoes |
//! | UDP | answers every datagram with `<workload>:<port>` (no newline) |
//! | authz | the counting external authorization server of legs N14 and N21, below |
//! | gRPC (h2c prior knowledge) | every method path `/<pkg.Service>/<Method>` answered with a unary [`EchoReply`](crate::workload::grpc::EchoReply): identity `<workload>:<port>`, pod, namespace, port, `:authority`, method path and every request metadata entry; a request can ask for a gRPC status instead (below) |
//!
//! Two more behaviours of the HTTP echo (and of the authz listener's echo answers) serve the
//! mesh's own tests:
//!
//! - **Upgrade.** An HTTP/1.1 request with `Upgrade: echo` (and `Connection: upgrade`) is
//!   answered `101 Switching Protocols` (`Upgrade: echo`); the switched connection then behaves
//!   like the raw TCP echo without the pod line: on the first bytes it writes
//!   `<workload>:<port>\n` once, followed by those bytes, then echoes everything. Any other
//!   `Upgrade` value is answered like a plain request (no switch).
//! - **Count.** `GET /echo-count` answers `<n>\n`: the number of requests this process has
//!   answered as the HTTP echo so far (on every listener; `/echo-count` itself, authorization
//!   checks, `/count` and a node's liveness probes, `User-Agent: aether-liveness`, are not
//!   counted). Leg MIR reads it on mp-authz to see a mirror's copy
//!   arrive.
//!
//! The HTTP echo validates nothing: a request without `Host`, with two `Host` fields, in
//! absolute form or in HTTP/1.0 is answered like any other, so that a mesh that fails to
//! refuse such a request is seen to deliver it.
//!
//! ## The gRPC echo (issue #7 §2)
//!
//! A gRPC listener speaks HTTP/2 only, with prior knowledge (h2c), and answers **every** path
//! as the unary call `aether.echo.v1.Echo/Echo` of [`crate::workload::grpc`] (whose docs hold
//! the wire schema), so GRPCRoute method matches can be tested with any service and method
//! names. The request message is decoded as an `EchoRequest` (a foreign message decodes too,
//! unless its fields 1-3 have other wire types). The answer:
//!
//! - normally `grpc-status: 0` with an `EchoReply`: identity `<workload>:<port>`, pod,
//!   namespace, port, `:authority`, method path, every request header (pseudo headers aside)
//!   one entry per value, the request's `message`, the peer IP;
//! - the status a request asks for, when it asks: `EchoRequest.status_code` (non-zero) with
//!   `status_message`, or the metadata `x-echo-grpc-status: <code>` with
//!   `x-echo-grpc-message: <text>` (the metadata wins);
//! - either way with the response metadata `x-echo-ident: <workload>:<port>`, `x-echo-pod`,
//!   `x-echo-host` (the authority) and `x-echo-peer`, so an error answer names its workload too.
//!
//! ## The authorization protocol (ours)
//!
//! The authz listener stands in for the mesh's external authorization service:
//!
//! 1. A **check** is any request that carries the header `x-authz-service` (the mesh
//!    sets it on every check it makes). Each check is counted.
//! 2. A check is allowed (`200`, body `<workload>:<port>\n`) unless the request carries
//!    `x-authz-deny`: `1` denies with `403`, a status `400`–`599` denies with that status; the
//!    body is `denied by <workload>\n`. A check carrying `x-authz-delay-ms: <n>` is answered
//!    after n milliseconds (at most 5 s): a slow authorization server.
//! 3. `GET /count` **without** `x-authz-service` answers the number of checks so far,
//!    `<n>\n`. It is not a check and is not counted.
//! 4. Any other request is answered as by the HTTP echo.
//!
//! ## Use
//!
//! Build [`EchoOptions`], [`Echo::bind`] it (every port is bound before anything is served, so
//! a port that cannot be bound is reported at once, by number), read the bound addresses with
//! [`Echo::bound`] (port 0 binds any free port, which tests use), then [`Echo::run`].

use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, Version};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinSet;

mod grpc;

/// The request header that makes a request to the authz listener a check.
pub const AUTHZ_CHECK_HEADER: &str = aether_core::wire::AUTHZ_SERVICE;
/// The request header that makes the authz listener deny a check: `1` (with `403`) or the
/// status to deny with (`400`–`599`).
pub const AUTHZ_DENY_HEADER: &str = "x-authz-deny";
/// The request header that makes the authz listener wait this many milliseconds before it
/// answers a check (a slow authorization server).
pub const AUTHZ_DELAY_HEADER: &str = "x-authz-delay-ms";
/// The longest wait [`AUTHZ_DELAY_HEADER`] may ask for.
const AUTHZ_DELAY_MAX: Duration = Duration::from_secs(5);
/// The request header (`<name>: <value>`) that asks the HTTP echo to add a response header.
pub const ECHO_SET_HEADER: &str = "x-echo-set";
/// The request header (`1`) that asks the HTTP echo for a JSON body.
pub const ECHO_JSON_HEADER: &str = "x-echo-json";
/// The `Upgrade` value the HTTP echo switches to (module docs).
pub const ECHO_UPGRADE: &str = "echo";
/// The path that answers the process's count of echoed requests (module docs).
pub const ECHO_COUNT_PATH: &str = "/echo-count";

/// What a listener does with a connection or datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ListenerKind {
    /// HTTP/1.x and h2c prior knowledge.
    Http,
    /// Raw TCP: identify on the first bytes, then echo.
    Tcp,
    /// Server-first TCP: greet at once, then echo.
    ServerFirst,
    /// UDP: answer each datagram.
    Udp,
    /// The counting external authorization server.
    Authz,
    /// gRPC over h2c (prior knowledge): every method path answered with an
    /// [`EchoReply`](crate::workload::grpc::EchoReply).
    Grpc,
}

impl ListenerKind {
    fn name(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Tcp => "tcp",
            Self::ServerFirst => "server-first",
            Self::Udp => "udp",
            Self::Authz => "authz",
            Self::Grpc => "grpc",
        }
    }
}

/// One listener to open: its kind and port (0: any free port).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerSpec {
    /// What it does.
    pub kind: ListenerKind,
    /// The port; 0 binds a free one (tests).
    pub port: u16,
}

/// What `aether echo` serves.
#[derive(Clone, Debug)]
pub struct EchoOptions {
    /// The workload's name, the first half of every identity string (`--workload`).
    pub workload: String,
    /// The pod's name (`--pod`, env `POD_NAME`).
    pub pod: String,
    /// The pod's namespace (`--namespace`, env `POD_NAMESPACE`); only in JSON answers.
    pub namespace: String,
    /// The listeners.
    pub listeners: Vec<ListenerSpec>,
    /// The addresses every listener binds, in order. The first must bind; a failure on a
    /// later one (`[::]` on a host without IPv6) is logged and skipped. Default: `0.0.0.0`,
    /// then `[::]` (v6-only).
    pub addrs: Vec<IpAddr>,
}

impl EchoOptions {
    /// Options for `workload` with no listeners, binding `0.0.0.0` and `[::]`.
    pub fn new(workload: impl Into<String>) -> Self {
        Self {
            workload: workload.into(),
            pod: String::new(),
            namespace: String::new(),
            listeners: Vec::new(),
            addrs: vec![
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            ],
        }
    }

    /// Add a listener.
    pub fn with(mut self, kind: ListenerKind, port: u16) -> Self {
        self.listeners.push(ListenerSpec { kind, port });
        self
    }
}

/// Binding or serving failed.
#[derive(Debug, thiserror::Error)]
pub enum EchoError {
    /// No listener was asked for.
    #[error(
        "no listener: give at least one of --http, --tcp, --server-first, --udp, --authz, --grpc"
    )]
    NoListeners,
    /// A port could not be bound.
    #[error("cannot bind {kind} port {port} on {addr}")]
    Bind {
        /// The listener's kind.
        kind: &'static str,
        /// The port asked for.
        port: u16,
        /// The address tried.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A listener failed for good.
    #[error("{kind} listener on {addr} failed")]
    Serve {
        /// The listener's kind.
        kind: &'static str,
        /// Its address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// A bound socket: its kind, the port it answers as, and its local address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    /// What it does.
    pub kind: ListenerKind,
    /// The port in its identity string (the bound port when 0 was asked).
    pub port: u16,
    /// Its local address.
    pub addr: SocketAddr,
}

enum Sock {
    Tcp(TcpListener),
    Udp(UdpSocket),
}

/// The echo workload, bound and ready to [`run`](Self::run).
pub struct Echo {
    ctx: Arc<Ctx>,
    socks: Vec<(Bound, Sock)>,
}

impl std::fmt::Debug for Echo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Echo")
            .field("workload", &self.ctx.workload)
            .field("bound", &self.bound())
            .finish()
    }
}

/// What every handler reads.
#[derive(Debug)]
struct Ctx {
    workload: String,
    pod: String,
    namespace: String,
    checks: AtomicU64,
    echoes: AtomicU64,
}

fn bind_one(kind: ListenerKind, addr: SocketAddr) -> io::Result<Sock> {
    let ty = if kind == ListenerKind::Udp {
        Type::DGRAM
    } else {
        Type::STREAM
    };
    let proto = if kind == ListenerKind::Udp {
        Protocol::UDP
    } else {
        Protocol::TCP
    };
    let s = Socket::new(Domain::for_address(addr), ty, Some(proto))?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    if kind == ListenerKind::Udp {
        Ok(Sock::Udp(UdpSocket::from_std(s.into())?))
    } else {
        s.listen(1024)?;
        Ok(Sock::Tcp(TcpListener::from_std(s.into())?))
    }
}

fn local_addr(sock: &Sock) -> io::Result<SocketAddr> {
    match sock {
        Sock::Tcp(l) => l.local_addr(),
        Sock::Udp(u) => u.local_addr(),
    }
}

impl Echo {
    /// Bind every listener on every address. Must be called inside a tokio runtime.
    pub fn bind(opts: &EchoOptions) -> Result<Self, EchoError> {
        if opts.listeners.is_empty() {
            return Err(EchoError::NoListeners);
        }
        let ctx = Arc::new(Ctx {
            workload: opts.workload.clone(),
            pod: opts.pod.clone(),
            namespace: opts.namespace.clone(),
            checks: AtomicU64::new(0),
            echoes: AtomicU64::new(0),
        });
        let mut socks = Vec::new();
        for spec in &opts.listeners {
            let mut port = spec.port;
            for (i, ip) in opts.addrs.iter().enumerate() {
                let addr = SocketAddr::new(*ip, port);
                let bound = bind_one(spec.kind, addr).and_then(|s| Ok((local_addr(&s)?, s)));
                match bound {
                    Ok((local, sock)) => {
                        // Port 0: every later address binds the port the first one got.
                        port = local.port();
                        let b = Bound {
                            kind: spec.kind,
                            port,
                            addr: local,
                        };
                        socks.push((b, sock));
                    }
                    Err(source) if i == 0 => {
                        return Err(EchoError::Bind {
                            kind: spec.kind.name(),
                            port: spec.port,
                            addr,
                            source,
                        });
                    }
                    Err(e) => {
                        tracing::warn!(%addr, kind = spec.kind.name(), error = %e,
                            "echo: skipping an address that cannot be bound");
                    }
                }
            }
        }
        Ok(Self { ctx, socks })
    }

    /// The bound sockets, in the order of the options.
    pub fn bound(&self) -> Vec<Bound> {
        self.socks.iter().map(|(b, _)| *b).collect()
    }

    /// Serve until a listener fails for good (never, normally).
    pub async fn run(self) -> Result<(), EchoError> {
        let mut set = JoinSet::new();
        for (b, sock) in self.socks {
            let ctx = Arc::clone(&self.ctx);
            match sock {
                Sock::Tcp(l) => {
                    set.spawn(accept_loop(ctx, b, l));
                }
                Sock::Udp(u) => {
                    set.spawn(udp_loop(ctx, b, u));
                }
            }
        }
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(e) => tracing::error!(error = %e, "echo: a listener task ended"),
            }
        }
        Ok(())
    }
}

async fn accept_loop(ctx: Arc<Ctx>, b: Bound, l: TcpListener) -> Result<(), EchoError> {
    loop {
        let (stream, peer) = match l.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Transient (EMFILE, ECONNABORTED): log and go on, after a short pause so that
                // a full file table does not spin.
                tracing::warn!(addr = %b.addr, error = %e, "echo: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let ctx = Arc::clone(&ctx);
        tokio::spawn(async move {
            let r = match b.kind {
                ListenerKind::Http | ListenerKind::Authz => serve_http(ctx, b, stream, peer).await,
                ListenerKind::Grpc => grpc::serve(ctx, b, stream, peer).await.map_err(Into::into),
                ListenerKind::Tcp => serve_tcp(&ctx, b.port, stream, false)
                    .await
                    .map_err(Into::into),
                ListenerKind::ServerFirst => serve_tcp(&ctx, b.port, stream, true)
                    .await
                    .map_err(Into::into),
                ListenerKind::Udp => Ok(()),
            };
            if let Err(e) = r {
                tracing::debug!(%peer, addr = %b.addr, error = %e, "echo: connection ended");
            }
        });
    }
}

async fn udp_loop(ctx: Arc<Ctx>, b: Bound, u: UdpSocket) -> Result<(), EchoError> {
    let reply = format!("{}:{}", ctx.workload, b.port);
    let mut buf = vec![0u8; 65536];
    loop {
        match u.recv_from(&mut buf).await {
            Ok((_, from)) => {
                if let Err(e) = u.send_to(reply.as_bytes(), from).await {
                    tracing::debug!(%from, error = %e, "echo: UDP reply failed");
                }
            }
            // An ICMP error from an earlier reply surfaces here on some kernels: not fatal.
            Err(e) => tracing::debug!(addr = %b.addr, error = %e, "echo: UDP receive failed"),
        }
    }
}

async fn serve_tcp(
    ctx: &Ctx,
    port: u16,
    mut stream: TcpStream,
    server_first: bool,
) -> io::Result<()> {
    if server_first {
        let greeting = format!("{}:{} ready\npod {}\n", ctx.workload, port, ctx.pod);
        stream.write_all(greeting.as_bytes()).await?;
        echo_bytes(stream, None).await
    } else {
        let prefix = format!("{}:{}\npod {}\n", ctx.workload, port, ctx.pod);
        echo_bytes(stream, Some(prefix)).await
    }
}

/// Echo every byte; with `prefix`, the first bytes are preceded by it.
async fn echo_bytes<S>(mut stream: S, prefix: Option<String>) -> io::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16384];
    if let Some(prefix) = prefix {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        let mut first = prefix.into_bytes();
        first.extend_from_slice(&buf[..n]);
        stream.write_all(&first).await?;
    }
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return stream.shutdown().await;
        }
        stream.write_all(&buf[..n]).await?;
    }
}

async fn serve_http(
    ctx: Arc<Ctx>,
    b: Bound,
    stream: TcpStream,
    peer: SocketAddr,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let _ = stream.set_nodelay(true);
    let service = service_fn(move |mut req: Request<Incoming>| {
        let resp = if asks_echo_upgrade(&req) {
            let on = hyper::upgrade::on(&mut req);
            let prefix = format!("{}:{}\n", ctx.workload, b.port);
            tokio::spawn(async move {
                let switched = match on.await {
                    Ok(io) => echo_bytes(TokioIo::new(io), Some(prefix)).await,
                    Err(e) => Err(io::Error::other(e)),
                };
                if let Err(e) = switched {
                    tracing::debug!(%peer, error = %e, "echo: switched connection ended");
                }
            });
            switching()
        } else if b.kind == ListenerKind::Authz {
            answer_authz(&ctx, b.port, peer.ip(), &req)
        } else {
            answer_http(&ctx, b.port, peer.ip(), &req)
        };
        let delay = (b.kind == ListenerKind::Authz)
            .then(|| authz_delay(&req))
            .flatten();
        async move {
            if let Some(d) = delay {
                tokio::time::sleep(d).await;
            }
            Ok::<_, Infallible>(resp)
        }
    });
    auto::Builder::new(TokioExecutor::new())
        .serve_connection_with_upgrades(TokioIo::new(stream), service)
        .await
}

/// An HTTP/1.1 request with `Upgrade: echo` and `Connection: upgrade`.
fn asks_echo_upgrade<B>(req: &Request<B>) -> bool {
    let upgrade = req
        .headers()
        .get(http::header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(ECHO_UPGRADE.as_bytes()));
    let connection = req
        .headers()
        .get_all(http::header::CONNECTION)
        .iter()
        .any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
        });
    req.version() == Version::HTTP_11 && upgrade && connection
}

/// `101 Switching Protocols` to `echo`.
fn switching() -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    resp.headers_mut().insert(
        http::header::CONNECTION,
        HeaderValue::from_static("upgrade"),
    );
    resp.headers_mut().insert(
        http::header::UPGRADE,
        HeaderValue::from_static(ECHO_UPGRADE),
    );
    resp
}

fn text_response(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// The authority as received: `:authority` for HTTP/2 (or its `host` fields when it has
/// none), each `Host` field for HTTP/1.
fn received_authorities<B>(req: &Request<B>) -> Vec<HeaderValue> {
    if req.version() == Version::HTTP_2
        && let Some(a) = req.uri().authority()
        && let Ok(v) = HeaderValue::from_str(a.as_str())
    {
        return vec![v];
    }
    req.headers().get_all(HOST).iter().cloned().collect()
}

fn version_name(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2",
        Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

/// The JSON body of an HTTP echo asked for with `x-echo-json: 1`.
#[derive(Debug, Serialize)]
pub struct EchoJson {
    /// The workload's name.
    pub workload: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The listener's port.
    pub port: u16,
    /// The request method.
    pub method: String,
    /// The request path (and query).
    pub path: String,
    /// The authority as received (several `Host` fields joined by `, `); absent without one.
    pub authority: Option<String>,
    /// Every request header, lower-case names, in the order received.
    pub headers: Vec<(String, String)>,
    /// The source IP of the connection.
    pub peer: String,
    /// `HTTP/1.0`, `HTTP/1.1` or `HTTP/2`.
    pub version: String,
}

fn lossy(v: &HeaderValue) -> String {
    String::from_utf8_lossy(v.as_bytes()).into_owned()
}

fn answer_http<B>(ctx: &Ctx, port: u16, peer: IpAddr, req: &Request<B>) -> Response<Full<Bytes>> {
    let ident = format!("{}:{}", ctx.workload, port);
    let path = req.uri().path();
    if req.method() == http::Method::GET && path == ECHO_COUNT_PATH {
        return text_response(
            StatusCode::OK,
            format!("{}\n", ctx.echoes.load(Ordering::SeqCst)),
        );
    }
    // A node's liveness probe is answered, not counted: it is the mesh's, not traffic.
    let probe = req
        .headers()
        .get(http::header::USER_AGENT)
        .is_some_and(|v| v.as_bytes() == aether_core::marks::LIVENESS_USER_AGENT.as_bytes());
    if !probe {
        ctx.echoes.fetch_add(1, Ordering::SeqCst);
    }
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), lossy(v)))
        .collect();
    let authorities = received_authorities(req);
    let json = req
        .headers()
        .get(ECHO_JSON_HEADER)
        .is_some_and(|v| v.as_bytes() == b"1");

    let status = path
        .strip_prefix("/status/")
        .and_then(|c| c.parse::<u16>().ok())
        .filter(|c| (200..=599).contains(c))
        .and_then(|c| StatusCode::from_u16(c).ok())
        .unwrap_or(StatusCode::OK);
    let mut resp = if json {
        let body = EchoJson {
            workload: ctx.workload.clone(),
            pod: ctx.pod.clone(),
            namespace: ctx.namespace.clone(),
            port,
            method: req.method().as_str().to_owned(),
            path: req
                .uri()
                .path_and_query()
                .map_or_else(|| path.to_owned(), |p| p.as_str().to_owned()),
            authority: (!authorities.is_empty())
                .then(|| authorities.iter().map(lossy).collect::<Vec<_>>().join(", ")),
            headers,
            peer: peer.to_string(),
            version: version_name(req.version()).to_owned(),
        };
        let text = serde_json::to_string(&body).unwrap_or_default() + "\n";
        let mut r = text_response(status, text);
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r
    } else if path == "/headers" {
        let mut body = format!("{ident}\n");
        for (k, v) in &headers {
            body.push_str(&format!("{k}: {v}\n"));
        }
        text_response(StatusCode::OK, body)
    } else {
        text_response(status, format!("{ident}\n"))
    };

    let h = resp.headers_mut();
    for a in authorities {
        h.append("x-echo-host", a);
    }
    if let Ok(v) = HeaderValue::from_str(&ctx.pod) {
        h.insert("x-echo-pod", v);
    }
    if let Ok(v) = HeaderValue::from_str(&peer.to_string()) {
        h.insert("x-echo-peer", v);
    }
    for set in req.headers().get_all(ECHO_SET_HEADER) {
        let Some((name, value)) = set.to_str().ok().and_then(|s| s.split_once(':')) else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes()),
            HeaderValue::from_str(value.trim()),
        ) else {
            continue;
        };
        h.append(name, value);
    }
    resp
}

/// How long a check asks the authz listener to wait before it answers
/// ([`AUTHZ_DELAY_HEADER`], in milliseconds, at most [`AUTHZ_DELAY_MAX`]).
fn authz_delay<B>(req: &Request<B>) -> Option<Duration> {
    if !req.headers().contains_key(AUTHZ_CHECK_HEADER) {
        return None;
    }
    let ms = req
        .headers()
        .get(AUTHZ_DELAY_HEADER)?
        .to_str()
        .ok()?
        .parse::<u64>()
        .ok()?;
    Some(Duration::from_millis(ms).min(AUTHZ_DELAY_MAX))
}

fn answer_authz<B>(ctx: &Ctx, port: u16, peer: IpAddr, req: &Request<B>) -> Response<Full<Bytes>> {
    if req.headers().contains_key(AUTHZ_CHECK_HEADER) {
        ctx.checks.fetch_add(1, Ordering::SeqCst);
        let deny = req
            .headers()
            .get(AUTHZ_DENY_HEADER)
            .and_then(|v| match v.as_bytes() {
                b"1" => Some(StatusCode::FORBIDDEN),
                code => std::str::from_utf8(code)
                    .ok()
                    .and_then(|c| c.parse::<u16>().ok())
                    .filter(|c| (400..600).contains(c))
                    .and_then(|c| StatusCode::from_u16(c).ok()),
            });
        return match deny {
            Some(status) => text_response(status, format!("denied by {}\n", ctx.workload)),
            None => text_response(StatusCode::OK, format!("{}:{}\n", ctx.workload, port)),
        };
    }
    if req.method() == http::Method::GET && req.uri().path() == "/count" {
        return text_response(
            StatusCode::OK,
            format!("{}\n", ctx.checks.load(Ordering::SeqCst)),
        );
    }
    answer_http(ctx, port, peer, req)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One HTTP/1.1 request on a fresh connection; the whole answer.
    async fn get(addr: SocketAddr, path: &str, extra: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    fn body(answer: &str) -> &str {
        answer.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }

    #[tokio::test]
    async fn echo_count_counts_echoed_requests_but_not_checks_or_itself() {
        let mut opts = EchoOptions::new("mp-authz").with(ListenerKind::Authz, 0);
        opts.addrs = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
        let echo = Echo::bind(&opts).unwrap();
        let addr = echo.bound()[0].addr;
        tokio::spawn(echo.run());
        assert_eq!(body(&get(addr, ECHO_COUNT_PATH, "").await), "0\n");
        let check = format!("{AUTHZ_CHECK_HEADER}: mp/mp-multi\r\n");
        assert!(get(addr, "/", &check).await.starts_with("HTTP/1.1 200"));
        assert_eq!(body(&get(addr, "/count", "").await), "1\n");
        assert_eq!(body(&get(addr, ECHO_COUNT_PATH, "").await), "0\n");
        let port = addr.port();
        assert_eq!(
            body(&get(addr, "/mirrored", "").await),
            format!("mp-authz:{port}\n")
        );
        assert_eq!(body(&get(addr, ECHO_COUNT_PATH, "").await), "1\n");
        let probe = format!(
            "user-agent: {}\r\n",
            aether_core::marks::LIVENESS_USER_AGENT
        );
        assert!(get(addr, "/", &probe).await.starts_with("HTTP/1.1 200"));
        assert_eq!(body(&get(addr, ECHO_COUNT_PATH, "").await), "1\n");
    }
}
