//! The mesh hop's client side (spec/model.md §14): mTLS to `<pod IP>:18008` with SNI
//! `<port>.<svc>.<ns>.<mesh-domain>`; HTTP as pooled HTTP/2, raw TCP as a byte stream, one
//! request that switches protocols (`Upgrade`, addressing.md I11) on a connection of its own
//! with ALPN [`ALPN_H1`](super::ALPN_H1). The destination side, which terminates the hop, is
//! [`super::inbound`].
//!
//! May import: `socket`, the proxy's shared types, `resolve` types; never `http`, `filters`,
//! `mesh_call`, `balance` or `inbound` (they import this module). Invariant: a request that has
//! left is sent again only when the peer says it did not process it (`REFUSED_STREAM`, or a
//! GOAWAY below its stream), and only when it has no body (its head is kept for that): once on a
//! new connection to the same endpoint here, and once more to another endpoint by
//! [`super::balance`]. A request that never left (the connect failed) is given back for that.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use bytes::Bytes;
use dashmap::DashMap;
use http::header::HOST;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderName, HeaderValue, Method, Request, Response, Uri, Version};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tracing::debug;

use super::metrics::{DataPlane, Handshake, Side};
use super::read_ahead::ReadAhead;
use super::socket::{SocketError, Source};
use super::{ALPN_HTTP, Body, HOP_PORT, Inputs, PodCtx};
use crate::resolve::decision::{Endpoint, ServiceKey};

/// Hop request header: the Services whose service-level filters the destination runs
/// (routes.md §5.5 items 1 and 2), `ns/name` comma-separated. Removed before the application.
pub const HOP_SERVICES: &str = "x-aether-hop-services";
/// Hop request header: the HTTP version toward the application (`1.0`, `1.1`, `2`).
pub const HOP_VERSION: &str = "x-aether-hop-version";

/// A mesh hop failed.
#[derive(Debug, thiserror::Error)]
pub enum HopError {
    /// Opening the TCP connection failed.
    #[error("connect to {dst}")]
    Connect {
        /// The hop address.
        dst: SocketAddr,
        /// The cause.
        #[source]
        source: SocketError,
    },
    /// The connect took too long.
    #[error("connect to {dst} timed out")]
    ConnectTimeout {
        /// The hop address.
        dst: SocketAddr,
    },
    /// The server name is not a valid DNS name.
    #[error("invalid hop server name {0}")]
    ServerName(String),
    /// The TLS handshake failed.
    #[error("tls handshake with {dst}")]
    Handshake {
        /// The hop address.
        dst: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake took too long.
    #[error("tls handshake with {dst} timed out")]
    HandshakeTimeout {
        /// The hop address.
        dst: SocketAddr,
    },
    /// HTTP/2 over the hop failed.
    #[error("http/2 to {dst}")]
    Http {
        /// The hop address.
        dst: SocketAddr,
        /// The cause.
        #[source]
        source: hyper::Error,
    },
}

/// The SNI of a hop to `port` of `service`.
pub fn server_name(port: u16, service: &ServiceKey, mesh_domain: &str) -> String {
    format!(
        "{port}.{}.{}.{mesh_domain}",
        service.name, service.namespace
    )
}

/// Parse a hop SNI back into (port, service name, namespace), checking the mesh domain.
pub fn parse_server_name<'a>(sni: &'a str, mesh_domain: &str) -> Option<(u16, &'a str, &'a str)> {
    let rest = sni.strip_suffix(mesh_domain)?.strip_suffix('.')?;
    let mut parts = rest.splitn(3, '.');
    let port = parts.next()?.parse().ok()?;
    let svc = parts.next()?;
    let ns = parts.next()?;
    if ns.contains('.') || svc.is_empty() || ns.is_empty() {
        return None;
    }
    Some((port, svc, ns))
}

/// A hop's TLS, over a socket read in large reads ([`ReadAhead`]).
pub type TlsStream = tokio_rustls::client::TlsStream<ReadAhead<TcpStream>>;

/// Open an mTLS hop from `pod` to `port` of `endpoint`.
pub async fn connect(
    inputs: &Inputs,
    pod: &PodCtx,
    endpoint: &Endpoint,
    port: u16,
    alpn: &[u8],
) -> Result<TlsStream, HopError> {
    let connected = open(inputs, pod, endpoint, port, alpn).await;
    let result = match &connected {
        Ok(_) => Handshake::Ok,
        Err(HopError::Connect { .. }) => Handshake::Connect,
        Err(HopError::ConnectTimeout { .. } | HopError::HandshakeTimeout { .. }) => {
            Handshake::Timeout
        }
        Err(HopError::ServerName(_)) => Handshake::Sni,
        Err(HopError::Handshake { source, .. }) => Handshake::of_tls_error(source),
        Err(HopError::Http { .. }) => Handshake::Tls,
    };
    inputs.metrics.handshake(Side::Client, result);
    connected
}

async fn open(
    inputs: &Inputs,
    pod: &PodCtx,
    endpoint: &Endpoint,
    port: u16,
    alpn: &[u8],
) -> Result<TlsStream, HopError> {
    let dst = SocketAddr::new(endpoint.address, HOP_PORT);
    let tcp = tokio::time::timeout(
        inputs.settings.connect_timeout,
        pod.net.connect(dst, Source::PodIp),
    )
    .await
    .map_err(|_| HopError::ConnectTimeout { dst })?
    .map_err(|source| HopError::Connect { dst, source })?;
    let sni = server_name(port, &endpoint.mesh_service, &inputs.settings.mesh_domain);
    let name = ServerName::try_from(sni.clone()).map_err(|_| HopError::ServerName(sni))?;
    let config = inputs
        .tls
        .client(&pod.namespace, &pod.service_account, alpn);
    tokio::time::timeout(
        inputs.settings.handshake_timeout,
        TlsConnector::from(config).connect(name, ReadAhead::new(tcp)),
    )
    .await
    .map_err(|_| HopError::HandshakeTimeout { dst })?
    .map_err(|source| HopError::Handshake { dst, source })
}

/// The request as sent over the HTTP/2 hop: an absolute URI (`http://<authority><path>`) so
/// that HTTP/2 has its pseudo-headers. The authority is the request's `Host`: on a delivery the one
/// the source side set, which a rule's `URLRewrite` may have changed.
///
/// Built from parts: the received path is shared, not copied, and the authority is one copy of
/// the `Host` value; nothing is formatted per request (issue #38).
pub fn hop_form(mut req: Request<Body>) -> Request<Body> {
    let pq = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let authority = req
        .headers()
        .get(HOST)
        .and_then(|v| Authority::try_from(v.as_bytes()).ok())
        .unwrap_or_else(|| Authority::from_static("mesh.invalid"));
    let uri = Uri::builder()
        .scheme(Scheme::HTTP)
        .authority(authority)
        .path_and_query(pq)
        .build();
    if let Ok(uri) = uri {
        *req.uri_mut() = uri;
    }
    *req.version_mut() = Version::HTTP_2;
    req
}

/// Pooled HTTP/2 hop connections, per (source pod IP, destination pod, port, destination mesh
/// service): what the connection's SNI named, so that a request is sent only on a connection
/// the destination accepted for that very service and port. (Keyed by the addresses alone, a
/// request for a service that claims another pod's address rode that pod's connection and was
/// delivered under its service's name: issue #35 item 5.)
#[derive(Debug, Default)]
pub struct Pool {
    conns: DashMap<(IpAddr, IpAddr, u16, ServiceKey), SendRequest<Body>>,
}

impl Pool {
    /// Send one request over a pooled hop connection, opening one when needed. A kept
    /// connection that turns out to be gone (the peer restarted, sent GOAWAY) before the request
    /// left is replaced once. A request without a body that the peer refused unprocessed (a
    /// daemon shedding under load, or draining for an upgrade, issue #36 items 4 and 7) is sent
    /// once more on a new connection; any other request that has left is never sent twice.
    ///
    /// The error gives the request back when it can go to another endpoint
    /// ([`SendError::unsent`]): when it never left (the connect failed), or when it has no body
    /// and was refused unprocessed again.
    pub async fn send(
        &self,
        inputs: &Inputs,
        pod: &PodCtx,
        endpoint: &Endpoint,
        port: u16,
        req: Request<Body>,
    ) -> Result<Response<hyper::body::Incoming>, SendError> {
        let again = http_body::Body::is_end_stream(req.body()).then(|| Head::of(&req));
        match (
            self.send_once(inputs, pod, endpoint, port, req).await,
            again,
        ) {
            (Err(first), Some(head)) if first.unsent.is_none() && first.error.unprocessed() => {
                debug!(error = %first.error, "hop request refused unprocessed: sent once more on a new connection");
                let mut second = self
                    .send_once(inputs, pod, endpoint, port, head.request())
                    .await;
                if let Err(e) = &mut second
                    && e.unsent.is_none()
                    && e.error.unprocessed()
                {
                    e.unsent = Some(head.request());
                }
                second
            }
            (first, _) => first,
        }
    }

    async fn send_once(
        &self,
        inputs: &Inputs,
        pod: &PodCtx,
        endpoint: &Endpoint,
        port: u16,
        req: Request<Body>,
    ) -> Result<Response<hyper::body::Incoming>, SendError> {
        let src = pod.net.ip_for(SocketAddr::new(endpoint.address, 0)).ok();
        let key = (
            src.unwrap_or(endpoint.address),
            endpoint.address,
            port,
            endpoint.mesh_service.clone(),
        );
        let dst = SocketAddr::new(endpoint.address, HOP_PORT);
        let kept = self
            .conns
            .get(&key)
            .map(|c| c.clone())
            .filter(|c| !c.is_closed());
        // A request in flight on the pool until its response head (`aether_hop_pool_streams`).
        let _stream = InFlight::new(&inputs.metrics.pool_streams);
        let req = match kept {
            Some(mut sender) => match sender.try_send_request(req).await {
                Ok(resp) => return Ok(resp),
                Err(mut e) => {
                    self.conns.remove(&key);
                    match e.take_message() {
                        Some(req) => req,
                        None => {
                            return Err(SendError::left(HopError::Http {
                                dst,
                                source: e.into_error(),
                            }));
                        }
                    }
                }
            },
            None => req,
        };
        // Until `send_request`, the request has not left: a failure gives it back.
        let tls = match connect(inputs, pod, endpoint, port, ALPN_HTTP).await {
            Ok(tls) => tls,
            Err(error) => return Err(SendError::never_left(error, req)),
        };
        let handshake = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(hyper_util::rt::TokioTimer::new())
            .handshake(TokioIo::new(tls))
            .await;
        let (mut sender, conn) = match handshake {
            Ok(h) => h,
            Err(source) => return Err(SendError::never_left(HopError::Http { dst, source }, req)),
        };
        let open = PoolConnection::new(inputs.metrics.clone());
        tokio::spawn(async move {
            // Counted in `aether_hop_pool_connections` while it runs.
            let _open = open;
            if let Err(e) = conn.await {
                debug!(error = %e, %dst, "hop connection ended");
            }
        });
        self.conns.insert(key.clone(), sender.clone());
        sender.send_request(req).await.map_err(|source| {
            self.conns.remove(&key);
            SendError::left(HopError::Http { dst, source })
        })
    }
}

/// A pooled hop send that failed ([`Pool::send`]).
#[derive(Debug)]
pub struct SendError {
    /// What failed.
    pub error: HopError,
    /// The request, when it can be sent to another endpoint: it never left (the connect or the
    /// HTTP/2 handshake failed), or it has no body and was refused unprocessed.
    pub unsent: Option<Request<Body>>,
}

impl SendError {
    fn never_left(error: HopError, req: Request<Body>) -> Self {
        Self {
            error,
            unsent: Some(req),
        }
    }

    fn left(error: HopError) -> Self {
        Self {
            error,
            unsent: None,
        }
    }
}

impl HopError {
    /// The connection to the endpoint failed: refused, timed out, unreachable, or the TLS
    /// handshake failed (the endpoint may leave the choice, [`super::balance`]).
    pub fn not_connected(&self) -> bool {
        matches!(
            self,
            Self::Connect { .. }
                | Self::ConnectTimeout { .. }
                | Self::Handshake { .. }
                | Self::HandshakeTimeout { .. }
        )
    }

    /// The peer said it did not process the request: `REFUSED_STREAM`, or a GOAWAY below its
    /// stream.
    pub fn unprocessed(&self) -> bool {
        matches!(self, Self::Http { source, .. } if unprocessed(source))
    }
}

/// The head of a request without a body, kept to send it again ([`Pool::send`]).
///
/// Its fields are a list, not a `HeaderMap`: a map's copy costs two allocations (its index and
/// its entries), the list one, and the map is built again only on the rare path that sends the
/// request once more (issue #38). Names and values share their bytes with the request's.
struct Head {
    method: Method,
    uri: Uri,
    version: Version,
    fields: Vec<(HeaderName, HeaderValue)>,
}

impl Head {
    fn of(req: &Request<Body>) -> Self {
        Self {
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            fields: req
                .headers()
                .iter()
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect(),
        }
    }

    /// The request again, its fields in the order they were (a name's values after its first,
    /// as the map iterates them), with no body.
    fn request(&self) -> Request<Body> {
        let mut req = Request::new(super::respond::empty());
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.version_mut() = self.version;
        let headers = req.headers_mut();
        headers.reserve(self.fields.len());
        for (n, v) in &self.fields {
            headers.append(n.clone(), v.clone());
        }
        req
    }
}

/// Whether the peer said it did not process the request: the stream was refused
/// (`REFUSED_STREAM`), or the connection went away (GOAWAY) below its stream. RFC 9113 §8.7:
/// such a request may be retried.
fn unprocessed(e: &hyper::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(h2) = c.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::REFUSED_STREAM)
                || (h2.is_go_away() && h2.is_remote());
        }
        cause = c.source();
    }
    false
}

/// One unit of a pool gauge, given back when dropped.
struct InFlight<'a>(&'a AtomicI64);

impl<'a> InFlight<'a> {
    fn new(gauge: &'a AtomicI64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Self(gauge)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One pooled connection, counted while its task runs.
struct PoolConnection(Arc<DataPlane>);

impl PoolConnection {
    fn new(metrics: Arc<DataPlane>) -> Self {
        metrics.pool_connections.fetch_add(1, Ordering::Relaxed);
        Self(metrics)
    }
}

impl Drop for PoolConnection {
    fn drop(&mut self) {
        self.0.pool_connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Mark a hop request with what the destination needs.
pub fn annotate(req: &mut Request<Body>, services: &[ServiceKey], version: Version, h2c: bool) {
    // `<ns>/<name>` joined by `,`, written into one string of the right size, which the header
    // value then owns without a copy: one allocation per request (issue #38).
    let size = services
        .iter()
        .map(|s| s.namespace.len() + s.name.len() + 2)
        .sum::<usize>();
    let mut list = String::with_capacity(size);
    for s in services {
        if !list.is_empty() {
            list.push(',');
        }
        list.push_str(&s.namespace);
        list.push('/');
        list.push_str(&s.name);
    }
    // Names from `from_static` share their static bytes; a `&str` key would be copied into each
    // request's map (and copied again by every clone of it, such as the retry copy `Head::of`).
    if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(list)) {
        req.headers_mut()
            .insert(HeaderName::from_static(HOP_SERVICES), v);
    }
    let v = if h2c || version == Version::HTTP_2 {
        "2"
    } else if version == Version::HTTP_10 {
        "1.0"
    } else {
        "1.1"
    };
    req.headers_mut().insert(
        HeaderName::from_static(HOP_VERSION),
        HeaderValue::from_static(v),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_round_trip() {
        let key = ServiceKey {
            namespace: "mp".into(),
            name: "mp-multi".into(),
        };
        let sni = server_name(9090, &key, "aether.internal");
        assert_eq!(sni, "9090.mp-multi.mp.aether.internal");
        assert_eq!(
            parse_server_name(&sni, "aether.internal"),
            Some((9090, "mp-multi", "mp"))
        );
        assert_eq!(
            parse_server_name("x.mp-multi.mp.aether.internal", "aether.internal"),
            None
        );
        assert_eq!(
            parse_server_name("9090.a.b.c.aether.internal", "aether.internal"),
            None
        );
        assert_eq!(
            parse_server_name("9090.mp-multi.mp.other", "aether.internal"),
            None
        );
    }
}
