//! The mesh hop (spec/model.md §14): mTLS to `<pod IP>:18008` with SNI
//! `<port>.<svc>.<ns>.<mesh-domain>`; HTTP as pooled HTTP/2, raw TCP as a byte stream. The
//! destination side terminates it, checks the SNI against the pod's row and the peer against the
//! trust bundle, runs the destination's filters and hands the request to the application.
//!
//! One request that switches protocols (`Upgrade`, addressing.md I11) cannot ride HTTP/2: it
//! gets a connection of its own with ALPN [`ALPN_H1`], checked as the HTTP class, served as
//! HTTP/1.1 with upgrades, through the same destination filters ([`destination_filters`]),
//! and spliced with the application's connection on `101` ([`super::upgrade`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use dashmap::DashMap;
use http::{HeaderValue, Request, Response, Version};
use http_body_util::BodyExt;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};
use tracing::{debug, warn};

use super::socket::{SocketError, Source};
use super::{ALPN_H1, ALPN_HTTP, ALPN_TCP, Body, BoxError, HOP_PORT, Inputs, Peer, PodCtx, count};
use crate::model::port::PortProtocol;
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

type TlsStream = tokio_rustls::client::TlsStream<TcpStream>;

/// Open an mTLS hop from `pod` to `port` of `endpoint`.
pub async fn connect(
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
    TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|source| HopError::Handshake { dst, source })
}

/// Pooled HTTP/2 hop connections, per (source pod IP, destination pod, port).
#[derive(Debug, Default)]
pub struct Pool {
    conns: DashMap<(IpAddr, IpAddr, u16), SendRequest<Body>>,
}

impl Pool {
    /// Send one request over a pooled hop connection, opening one when needed. A kept
    /// connection that turns out to be gone (the peer restarted, sent GOAWAY) before the request
    /// left is replaced once; a request that has left is never sent twice.
    pub async fn send(
        &self,
        inputs: &Inputs,
        pod: &PodCtx,
        endpoint: &Endpoint,
        port: u16,
        req: Request<Body>,
    ) -> Result<Response<hyper::body::Incoming>, HopError> {
        let src = pod.net.ip_for(SocketAddr::new(endpoint.address, 0)).ok();
        let key = (src.unwrap_or(endpoint.address), endpoint.address, port);
        let dst = SocketAddr::new(endpoint.address, HOP_PORT);
        let kept = self
            .conns
            .get(&key)
            .map(|c| c.clone())
            .filter(|c| !c.is_closed());
        let req = match kept {
            Some(mut sender) => match sender.try_send_request(req).await {
                Ok(resp) => return Ok(resp),
                Err(mut e) => {
                    self.conns.remove(&key);
                    match e.take_message() {
                        Some(req) => req,
                        None => {
                            return Err(HopError::Http {
                                dst,
                                source: e.into_error(),
                            });
                        }
                    }
                }
            },
            None => req,
        };
        let tls = connect(inputs, pod, endpoint, port, ALPN_HTTP).await?;
        let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(hyper_util::rt::TokioTimer::new())
            .handshake(TokioIo::new(tls))
            .await
            .map_err(|source| HopError::Http { dst, source })?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                debug!(error = %e, %dst, "hop connection ended");
            }
        });
        self.conns.insert(key, sender.clone());
        sender.send_request(req).await.map_err(|source| {
            self.conns.remove(&key);
            HopError::Http { dst, source }
        })
    }
}

/// The class a hop's ALPN asks for.
fn hop_class(alpn: Option<&[u8]>) -> Option<PortProtocol> {
    match alpn {
        Some(a) if a == ALPN_HTTP || a == ALPN_H1 => Some(PortProtocol::Http),
        Some(a) if a == ALPN_TCP => Some(PortProtocol::Tcp),
        _ => None,
    }
}

/// Serve the inbound mesh hop of one pod on `<pod IP>:18008`.
pub async fn serve_inbound(inputs: Arc<Inputs>, pod: Arc<PodCtx>, listener: TcpListener) {
    loop {
        let (tcp, peer_addr) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, pod = %pod.name, "inbound accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        // Small TLS records must not wait for the peer's delayed ACK (Nagle).
        let _ = tcp.set_nodelay(true);
        let local = tcp.local_addr().ok();
        let inputs = inputs.clone();
        let pod = pod.clone();
        tokio::spawn(async move {
            if let Some(local) = local {
                let connection = inbound_connection(inputs, pod.clone(), tcp, peer_addr, local);
                pod.until_retired(connection).await;
            }
        });
    }
}

async fn inbound_connection(
    inputs: Arc<Inputs>,
    pod: Arc<PodCtx>,
    tcp: TcpStream,
    peer_addr: SocketAddr,
    local: SocketAddr,
) {
    let _active = super::Active::new(&inputs.stats);
    let acceptor = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp);
    let Ok(start) = acceptor.await else {
        count(&inputs.stats.hop_refused);
        return;
    };
    let hello = start.client_hello();
    let sni = hello.server_name().map(str::to_owned);
    let alpn: Option<Vec<u8>> = hello.alpn().and_then(|mut a| a.next().map(<[u8]>::to_vec));
    let model = inputs.model.load();
    let class = hop_class(alpn.as_deref());
    let checked = sni.as_deref().and_then(|sni| {
        let (port, svc, ns) = parse_server_name(sni, &inputs.settings.mesh_domain)?;
        let (own, declared) = model.pod_ports(local.ip())?;
        let ok = &*own.name == svc
            && &*own.namespace == ns
            && class.is_some()
            && declared.get(&port).copied() == class;
        ok.then_some(port)
    });
    let (Some(port), Some(class)) = (checked, class) else {
        // model.md §14: an SNI whose port the pod does not declare with the hop's class is
        // refused by closing the handshake.
        debug!(?sni, pod = %pod.name, "inbound hop refused: SNI not served here");
        count(&inputs.stats.hop_refused);
        return;
    };
    let Some(config) = inputs.tls.server(&pod.namespace, &pod.service_account) else {
        count(&inputs.stats.hop_refused);
        return;
    };
    let Ok(tls) = start.into_stream(config).await else {
        count(&inputs.stats.hop_refused);
        return;
    };
    let Some(peer) = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| inputs.tls.peer(chain))
    else {
        count(&inputs.stats.hop_refused);
        return;
    };
    let client_ip = peer_addr.ip();
    let app = SocketAddr::new(local.ip(), port);
    let pod_name = pod.name.clone();
    match class {
        PortProtocol::Tcp => {
            let Some(mut upstream) = super::http::connect_app(&inputs, &pod, app, client_ip).await
            else {
                return;
            };
            let mut tls = tls;
            let _ = tokio::io::copy_bidirectional(&mut tls, &mut upstream).await;
        }
        _ => {
            let h1 = alpn.as_deref() == Some(ALPN_H1);
            let peer = Arc::new(peer);
            let drain = inputs.drain.clone();
            let service = hyper::service::service_fn(move |req| {
                let inputs = inputs.clone();
                let pod = pod.clone();
                let peer = peer.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(
                        inbound_request(&inputs, &pod, &peer, app, client_ip, req).await,
                    )
                }
            });
            let served = if h1 {
                hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .with_upgrades()
                    .await
            } else {
                let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .timer(hyper_util::rt::TokioTimer::new())
                    .serve_connection(TokioIo::new(tls), service);
                let mut conn = std::pin::pin!(conn);
                let mut draining = drain.subscribe();
                // On drain: GOAWAY, the streams in flight finish, then the connection closes.
                tokio::select! {
                    out = conn.as_mut() => out,
                    () = async { drop(draining.wait_for(|d| *d).await) } => {
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                }
            };
            if let Err(e) = served {
                debug!(error = %e, pod = %pod_name, "inbound hop connection ended");
            }
        }
    }
}

/// One request arriving over the hop: the destination's filters, then the application. A
/// request that switches protocols (only on an [`ALPN_H1`] hop) takes the hop's side of the
/// switch with it, and is spliced with the application's on `101`.
async fn inbound_request(
    inputs: &Inputs,
    pod: &PodCtx,
    peer: &Peer,
    app: SocketAddr,
    client_ip: IpAddr,
    mut req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let version = match destination_filters(inputs, pod, peer, &mut req).await {
        Ok(v) => v,
        Err(denied) => return denied,
    };
    let client_upgrade = super::upgrade::is_upgrade(&req).then(|| hyper::upgrade::on(&mut req));
    let req = req.map(|body| body.map_err(BoxError::from).boxed());
    super::http::to_app(inputs, pod, app, client_ip, version, req, client_upgrade).await
}

/// What the destination runs on every request that arrives over the hop, whatever the hop's
/// HTTP version (model.md §14, routes.md §5.5): reads and removes the hop's headers, then runs
/// the service-level `rbac` and `ext_authz` of the Services the source named plus the pod's
/// own mesh service, on the identity the hop proved. The HTTP version toward the application,
/// or the denial to answer.
pub async fn destination_filters<B>(
    inputs: &Inputs,
    pod: &PodCtx,
    peer: &Peer,
    req: &mut Request<B>,
) -> Result<Version, Response<Body>> {
    let model = inputs.model.load();
    let named: Vec<ServiceKey> = req
        .headers()
        .get(HOP_SERVICES)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(',')
                .filter_map(|s| s.split_once('/'))
                .map(|(ns, name)| ServiceKey {
                    namespace: ns.into(),
                    name: name.into(),
                })
                .collect()
        })
        .unwrap_or_default();
    let version = match req.headers().get(HOP_VERSION).and_then(|v| v.to_str().ok()) {
        Some("2") => Version::HTTP_2,
        Some("1.0") => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    super::filters::strip_mesh_headers(req.headers_mut());
    // routes.md §5.5: the named Services plus the pod's own mesh service; rbac and ext_authz
    // run here, on the identity the hop proved.
    let own = ServiceKey {
        namespace: pod.namespace.as_str().into(),
        name: pod.service_account.as_str().into(),
    };
    let mut services = named;
    if !services.contains(&own) {
        services.push(own);
    }
    for key in &services {
        for filter in model.filters_of(key) {
            if let Some(denied) =
                super::filters::authorize(inputs, pod, &filter.config, key, peer, req).await
            {
                return Err(denied);
            }
        }
    }
    Ok(version)
}

/// Mark a hop request with what the destination needs.
pub fn annotate(req: &mut Request<Body>, services: &[ServiceKey], version: Version, h2c: bool) {
    let list = services
        .iter()
        .map(|s| format!("{}/{}", s.namespace, s.name))
        .collect::<Vec<_>>()
        .join(",");
    if let Ok(v) = HeaderValue::from_str(&list) {
        req.headers_mut().insert(HOP_SERVICES, v);
    }
    let v = if h2c || version == Version::HTTP_2 {
        "2"
    } else if version == Version::HTTP_10 {
        "1.0"
    } else {
        "1.1"
    };
    req.headers_mut()
        .insert(HOP_VERSION, HeaderValue::from_static(v));
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
