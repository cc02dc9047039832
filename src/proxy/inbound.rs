//! The mesh hop's destination side (spec/model.md §14): `<pod IP>:18008` terminates mTLS,
//! checks the SNI against the pod's row (the port, with the hop's class from its ALPN) and the
//! peer against the trust bundle, runs the destination's filters ([`destination_filters`]:
//! service-level `rbac` and `ext_authz`, routes.md §5.5) and hands the request to the
//! application ([`super::http::to_app`]) or, for raw TCP, the bytes.
//!
//! One request that switches protocols (`Upgrade`, addressing.md I11) arrives on a connection
//! of its own with ALPN [`ALPN_H1`], is checked as the HTTP class, served as HTTP/1.1 with
//! upgrades through the same destination filters, and spliced with the application's
//! connection on `101` ([`super::upgrade`]).
//!
//! May import: `hop` (names and headers), `filters`, `http::upstream`, `http::limits`; nothing imports it but
//! the wiring. Invariants: an SNI the pod does not serve with the hop's class is refused by
//! closing the handshake; the hop's own `x-aether-` headers never reach the application.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use http::{Request, Response, Version};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::LazyConfigAcceptor;
use tracing::debug;

use super::access::{Line, TcpConn};
use super::app_pool::Unreached;
use super::hop::{HOP_SERVICES, HOP_VERSION, parse_server_name};
use super::http::limits::{self, InFlight, Proto, Watch, Watched, track, tracked};
use super::metrics::{Direction, Handshake, Side};
use super::read_ahead::ReadAhead;
use super::{
    ALPN_H1, ALPN_HTTP, ALPN_L4, ALPN_TCP, Body, BoxError, Inputs, Peer, PodCtx, count, sniff,
};
use crate::model::port::PortProtocol;
use crate::resolve::answer::HEADER_ERROR;
use crate::resolve::decision::ServiceKey;

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
    let errors = inputs.stats.accept_errors("hop");
    let mut acceptor = crate::accept::Acceptor::new(listener, "hop", errors);
    loop {
        let (tcp, peer_addr) = acceptor.accept().await;
        let Some(active) = super::Active::admit(&inputs, &pod) else {
            continue;
        };
        // Small TLS records must not wait for the peer's delayed ACK (Nagle).
        let _ = tcp.set_nodelay(true);
        let local = tcp.local_addr().ok();
        let inputs = inputs.clone();
        let pod = pod.clone();
        tokio::spawn(async move {
            if let Some(local) = local {
                let connection = Box::pin(inbound_connection(
                    inputs,
                    pod.clone(),
                    tcp,
                    peer_addr,
                    local,
                ));
                pod.until_retired(connection).await;
            }
            drop(active);
        });
    }
}

/// A hop whose handshake finished: what it asked for and who the peer is.
struct Accepted {
    tls: ServerTls,
    peer: Peer,
    /// The pod port the SNI named, with the class the pod declares it with.
    port: u16,
    class: PortProtocol,
    /// The ALPN asked for an L4 hop (model.md §12.5 item 1).
    l4: bool,
    /// The ALPN asked for an HTTP/1.1 hop ([`ALPN_H1`]).
    h1: bool,
}

async fn inbound_connection(
    inputs: Arc<Inputs>,
    pod: Arc<PodCtx>,
    tcp: TcpStream,
    peer_addr: SocketAddr,
    local: SocketAddr,
) {
    // The handshake and each branch are boxed: the connection's task keeps only the branch it
    // runs, so an idle raw stream does not hold room for a handshake or an HTTP server (issue
    // #8, finding 13).
    let Some(hop) = Box::pin(accept(&inputs, &pod, tcp, peer_addr, local)).await else {
        return;
    };
    let client_ip = peer_addr.ip();
    let app = SocketAddr::new(local.ip(), hop.port);
    // The destination of everything on this connection: the pod's own mesh service and the
    // port the SNI named, looked up once.
    let own = ServiceKey {
        namespace: pod.namespace.as_str().into(),
        name: pod.service_account.as_str().into(),
    };
    let to = Delivery {
        app,
        client_ip,
        pod_ip: local.ip(),
        series: inputs.metrics.series(&own, hop.port, hop.peer.source()),
        service: own,
    };
    if hop.l4 {
        return Box::pin(l4_delivery(inputs, pod, hop.tls, hop.peer, to, hop.class)).await;
    }
    match hop.class {
        PortProtocol::Tcp => {
            // model.md §12.5 item 2: authorization at connection level, before a byte
            // reaches the application, as for the bytes of an L4 hop.
            Box::pin(l4_bytes(&inputs, &pod, hop.tls, &hop.peer, to)).await;
        }
        _ => {
            Box::pin(serve_hop_http(inputs, pod, hop.tls, hop.h1, hop.peer, to)).await;
        }
    }
}

/// The hop's TLS handshake, with the SNI checked against the pod's row before the handshake
/// goes on, and the peer's certificate and its source address after; `None` (counted)
/// refuses the hop.
async fn accept(
    inputs: &Inputs,
    pod: &PodCtx,
    tcp: TcpStream,
    peer_addr: SocketAddr,
    local: SocketAddr,
) -> Option<Accepted> {
    // One deadline for the whole handshake: a peer that sends nothing, or drips its
    // ClientHello, is closed when it passes (model.md §12.5 item 4: the hop accepts only TLS).
    let deadline = tokio::time::Instant::now() + inputs.settings.handshake_timeout;
    let acceptor =
        LazyConfigAcceptor::new(rustls::server::Acceptor::default(), ReadAhead::new(tcp));
    let start = handshake_step(inputs, deadline, acceptor).await?;
    let hello = start.client_hello();
    let sni = hello.server_name().map(str::to_owned);
    let alpn: Option<Vec<u8>> = hello.alpn().and_then(|mut a| a.next().map(<[u8]>::to_vec));
    let model = inputs.model.load();
    let class = hop_class(alpn.as_deref());
    let l4 = alpn.as_deref() == Some(ALPN_L4);
    let checked = sni.as_deref().and_then(|sni| {
        let (port, svc, ns) = parse_server_name(sni, &inputs.settings.mesh_domain)?;
        // The row of this very pod (its identity, at its address): where rows of several
        // services claim the address, only the one of the pod that holds it.
        let declared = model.hop_ports(local.ip(), &pod.namespace, &pod.service_account)?;
        let declared = declared.get(&port).copied()?;
        // An L4 hop carries bytes to any TCP port the pod declares (model.md §12.5 item 1).
        let fits = if l4 {
            matches!(declared, PortProtocol::Http | PortProtocol::Tcp)
        } else {
            class == Some(declared)
        };
        let ok = pod.service_account == svc && pod.namespace == ns && fits;
        ok.then_some((port, declared))
    });
    drop(model);
    let Some((port, class)) = checked else {
        // model.md §14: an SNI whose port the pod does not declare with the hop's class is
        // refused by closing the handshake.
        debug!(?sni, pod = %pod.name, "inbound hop refused: SNI not served here");
        count(&inputs.stats.hop_refused);
        inputs.metrics.handshake(Side::Server, Handshake::Sni);
        return None;
    };
    let Some(config) = inputs.tls.server(&pod.namespace, &pod.service_account) else {
        count(&inputs.stats.hop_refused);
        inputs.metrics.handshake(Side::Server, Handshake::Identity);
        return None;
    };
    let tls = handshake_step(inputs, deadline, start.into_stream(config)).await?;
    let Some(peer) = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| inputs.tls.peer(chain))
    else {
        count(&inputs.stats.hop_refused);
        inputs.metrics.handshake(Side::Server, Handshake::Identity);
        return None;
    };
    // model.md §14, source binding: the certificate speaks for its identity only from the
    // address of a served pod of that identity. Checked after the handshake (the identity is
    // known only then), before a byte is read or delivered.
    if let Err(why) = bound_source(inputs, peer_addr.ip(), &peer).await {
        count(&inputs.stats.hop_refused);
        inputs
            .stats
            .hop_unbound
            .get_or_create(&[("reason", why.code())])
            .inc();
        inputs.metrics.handshake(Side::Server, Handshake::Identity);
        debug!(source = %peer_addr.ip(), peer = %peer.id, pod = %pod.name, %why, "inbound hop refused: source binding");
        if let Some(left_out) = inputs.stats.hop_unbound_log.pass() {
            tracing::warn!(
                source = %peer_addr.ip(),
                peer = %peer.id,
                pod = %pod.name,
                reason = why.code(),
                %why,
                left_out,
                "inbound hop refused: its source address does not prove its certificate's identity (source binding)"
            );
        }
        return None;
    }
    inputs.metrics.handshake(Side::Server, Handshake::Ok);
    Some(Accepted {
        tls,
        peer,
        port,
        class,
        l4,
        h1: alpn.as_deref() == Some(ALPN_H1),
    })
}

/// Source binding (model.md §14) on the model of now. A source this node holds no row of may be
/// a pod too new for its model (its own node serves it already): it is waited for as a name the
/// node does not know yet is, one discovery hold at most (addressing.md §8), then refused. A
/// source of another identity, or one that rows of several services claim, is refused at once.
async fn bound_source(
    inputs: &Inputs,
    source: IpAddr,
    peer: &Peer,
) -> Result<(), crate::model::Unbound> {
    let deadline = tokio::time::Instant::now() + inputs.settings.hold;
    loop {
        let seen = inputs.model.generation();
        match inputs
            .model
            .load()
            .source_binding(source, &peer.namespace, &peer.service_account)
        {
            Err(crate::model::Unbound::NotAPod) => {}
            done => return done,
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() || !inputs.model.newer_than(seen, left).await {
            return Err(crate::model::Unbound::NotAPod);
        }
    }
}

/// The deadlines of an inbound connection's HTTP, from now, in the overload manager's registry;
/// its HTTP/2 streams count against the identity the hop proved, from the address source
/// binding checked ([`Overload::open_stream`]).
///
/// [`Overload::open_stream`]: super::overload::Overload::open_stream
fn hop_watch(inputs: &Inputs, proto: Proto, peer: &Peer, to: &Delivery) -> Watch {
    Watch::guarded(
        proto,
        &inputs.settings,
        Some(tokio::time::Instant::now()),
        &inputs.overload,
        Arc::from(format!("{} {}", peer.id, to.client_ip)),
    )
}

/// Serve the HTTP of one inbound hop connection (HTTP/2, or HTTP/1.1 for an [`ALPN_H1`] hop)
/// with the head and idle deadlines of every HTTP server of the daemon ([`limits`]).
async fn serve_hop_http<T>(
    inputs: Arc<Inputs>,
    pod: Arc<PodCtx>,
    tls: T,
    h1: bool,
    peer: Peer,
    to: Delivery,
) where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let proto = if h1 { Proto::Http1 } else { Proto::Http2 };
    let watch = hop_watch(&inputs, proto, &peer, &to);
    let io = TokioIo::new(Watched::new(tls, bytes::Bytes::new(), watch.clone()));
    let pod_name = pod.name.clone();
    let peer = Arc::new(peer);
    let to = Arc::new(to);
    let service = {
        let inputs = inputs.clone();
        let watch = watch.clone();
        hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
            let inputs = inputs.clone();
            let pod = pod.clone();
            let peer = peer.clone();
            let to = to.clone();
            let in_flight = watch.begin(&inputs.stats);
            // Boxed, as on the source side (`http::serve`): an idle connection keeps no room
            // for a request's future.
            Box::pin(async move {
                let Some(in_flight) = in_flight else {
                    return Err(limits::refused_stream());
                };
                let resp = inbound_request(&inputs, &pod, &peer, &to, req, &in_flight).await;
                // The application refused the connection and nothing was sent to it: the
                // stream is refused unprocessed, so that the source tries another endpoint
                // (issue #38), and answers `503 upstream-unreachable` itself when it cannot.
                // HTTP/2 only: an HTTP/1.1 hop carries an upgrade, answered as it is.
                if !h1 && resp.extensions().get::<Unreached>().is_some() {
                    return Err(limits::refused_stream());
                }
                Ok(resp.map(|b| tracked(b, &in_flight)))
            })
        })
    };
    let settings = &inputs.settings;
    let served = if h1 {
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(None)
            .serve_connection(io, service)
            .with_upgrades();
        let conn = std::pin::pin!(conn);
        limits::serve(conn, |c| c.graceful_shutdown(), &watch, &inputs).await
    } else {
        // The source daemon checked the client's head against `max_header_list_size`; the hop
        // carries it with the mesh's own headers, so it accepts up to twice that.
        let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(hyper_util::rt::TokioTimer::new())
            .max_concurrent_streams(settings.http2_max_concurrent_streams)
            .max_header_list_size(settings.max_header_list_size.saturating_mul(2))
            .serve_connection(io, service);
        let conn = std::pin::pin!(conn);
        // On drain: GOAWAY, the streams in flight finish, then the connection closes.
        limits::serve(conn, |c| c.graceful_shutdown(), &watch, &inputs).await
    };
    if let Err(e) = served {
        debug!(error = %e, pod = %pod_name, "inbound hop connection ended");
    }
}

/// One request arriving over the hop: the destination's filters, then the application. A
/// request that switches protocols (only on an [`ALPN_H1`] hop) takes the hop's side of the
/// switch with it, and is spliced with the application's on `101`.
async fn inbound_request(
    inputs: &Inputs,
    pod: &PodCtx,
    peer: &Peer,
    to: &Delivery,
    mut req: Request<hyper::body::Incoming>,
    in_flight: &Arc<InFlight>,
) -> Response<Body> {
    let started = crate::time::now();
    let logged = inputs.access.pick();
    let request_bytes = logged.then(|| Arc::new(AtomicU64::new(0)));
    let (resp, decision) = match destination_filters(inputs, pod, peer, &to.service, &mut req).await
    {
        Ok(version) => {
            let client_upgrade =
                super::upgrade::is_upgrade(&req).then(|| hyper::upgrade::on(&mut req));
            let req = req.map(|body| {
                let body = track(body, in_flight);
                super::access::count_request(body, request_bytes.as_ref())
            });
            let resp = super::http::to_app(
                inputs,
                pod,
                to.app,
                to.client_ip,
                version,
                req,
                client_upgrade,
            )
            .await;
            (resp, "deliver")
        }
        Err(denied) => (denied, "deny"),
    };
    inbound_done(
        inputs,
        pod,
        peer,
        to,
        resp,
        decision,
        started,
        request_bytes,
    )
}

/// The access line of a request or stream that arrived over the hop.
fn inbound_line(
    peer: &Peer,
    to: &Delivery,
    pod: &PodCtx,
    decision: &'static str,
    rule: &'static str,
) -> Line {
    Line {
        source: super::access::Source::Peer {
            identity: peer.id.clone(),
            addr: to.client_ip,
        },
        path: "hop-inbound",
        decision,
        destination: super::access::Destination {
            service: Some(to.service.clone()),
            port: Some(to.app.port()),
            pod: Some(pod.name.clone()),
            route: None,
            rule,
        },
    }
}

/// Count one request that arrived over the hop, and give it its access line when picked.
#[allow(clippy::too_many_arguments)] // The request's own facts, each once; no bundle repeats.
fn inbound_done(
    inputs: &Inputs,
    pod: &PodCtx,
    peer: &Peer,
    to: &Delivery,
    resp: Response<Body>,
    decision: &'static str,
    started: std::time::Instant,
    request_bytes: Option<Arc<AtomicU64>>,
) -> Response<Body> {
    let head = started.elapsed();
    let reason = resp
        .headers()
        .get(HEADER_ERROR)
        .and_then(|v| super::metrics::reason_of(v.as_bytes()));
    to.series
        .record_request(Direction::Inbound, resp.status().as_u16(), reason, head);
    if let Some(here) = super::respond::answered_here(&resp) {
        inputs.metrics.refused(here);
    }
    const RULE: &str = "model.md §14 inbound hop";
    if let Some(switched) = resp.extensions().get::<super::upgrade::Switched>() {
        let stream = request_bytes
            .is_some()
            .then(|| Box::new(inbound_line(peer, to, pod, "switched", RULE)));
        switched.account(TcpConn::with_line(
            to.series.clone(),
            Direction::Inbound,
            stream,
        ));
    }
    let Some(request_bytes) = request_bytes else {
        return resp;
    };
    let line = super::access::HttpLine {
        direction: Direction::Inbound,
        line: inbound_line(peer, to, pod, decision, RULE),
        http: super::access::HttpFacts {
            status: resp.status().as_u16(),
            reason: reason.map(crate::resolve::answer::Reason::code),
            head,
            hop: None,
        },
        started,
        request_bytes,
    };
    resp.map(|b| super::access::Logged::new(b, Box::new(line)).boxed())
}

/// What the destination runs on every request that arrives over the hop, whatever the hop's
/// HTTP version (model.md §14, routes.md §5.5): reads and removes the hop's headers, then runs
/// the service-level `rbac` and `ext_authz` of the Services the source named plus the pod's
/// own mesh service (`own`), on the identity the hop proved. The HTTP version toward the
/// application, or the denial to answer. The common case, the source named the pod's own
/// service, allocates nothing (issue #38).
pub async fn destination_filters<B>(
    inputs: &Inputs,
    pod: &PodCtx,
    peer: &Peer,
    own: &ServiceKey,
    req: &mut Request<B>,
) -> Result<Version, Response<Body>> {
    let model = inputs.model.load();
    // Taken out of the request (the hop's headers go before anything else reads it).
    let named = req.headers_mut().remove(HOP_SERVICES);
    let version = match req.headers().get(HOP_VERSION).and_then(|v| v.to_str().ok()) {
        Some("2") => Version::HTTP_2,
        Some("1.0") => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    req.headers_mut().remove(HOP_VERSION);
    super::filters::strip_mesh_headers(req.headers_mut());
    // routes.md §5.5: the named Services plus the pod's own mesh service; rbac and ext_authz
    // run here, on the identity the hop proved.
    let named = named
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .into_iter()
        .flat_map(|v| v.split(','))
        .filter_map(|s| s.split_once('/'))
        .map(|(namespace, name)| {
            if *own.namespace == *namespace && *own.name == *name {
                own.clone()
            } else {
                ServiceKey {
                    namespace: namespace.into(),
                    name: name.into(),
                }
            }
        });
    let mut own_named = false;
    for key in named.chain(std::iter::once(own.clone())) {
        // The pod's own service runs once: where the source named it, or last.
        if key == *own {
            if own_named {
                continue;
            }
            own_named = true;
        }
        for filter in model.filters_of(&key) {
            if let Some(denied) =
                super::filters::authorize(inputs, pod, &filter.config, &key, peer, req).await
            {
                return Err(denied);
            }
        }
    }
    Ok(version)
}

/// One step of the hop's TLS handshake within its `deadline`; a failure or a late step is
/// counted as a refused hop (and a timeout) and gives `None`: the connection is dropped.
async fn handshake_step<T>(
    inputs: &Inputs,
    deadline: tokio::time::Instant,
    step: impl Future<Output = std::io::Result<T>>,
) -> Option<T> {
    match tokio::time::timeout_at(deadline, step).await {
        Ok(Ok(done)) => Some(done),
        Ok(Err(e)) => {
            count(&inputs.stats.hop_refused);
            inputs
                .metrics
                .handshake(Side::Server, Handshake::of_tls_error(&e));
            None
        }
        Err(_) => {
            count(&inputs.stats.handshake_timeouts);
            count(&inputs.stats.hop_refused);
            inputs.metrics.handshake(Side::Server, Handshake::Timeout);
            None
        }
    }
}

/// Where an L4 delivery goes: the application's address, the client pod's IP (the source
/// the application sees), and the destination pod's own IP (which Services guard it).
#[derive(Clone, Debug)]
struct Delivery {
    app: SocketAddr,
    client_ip: IpAddr,
    pod_ip: IpAddr,
    /// The pod's own mesh service.
    service: ServiceKey,
    /// Its metric series for the port the hop named.
    series: Arc<super::metrics::Series>,
}

type ServerTls = tokio_rustls::server::TlsStream<ReadAhead<TcpStream>>;

/// An L4 hop (model.md §12.5 items 1 and 2): the bytes of a connection the source would have
/// passed through. A raw-TCP port gets them after the connection-level authorization; an HTTP
/// port serves them as HTTP with the filters of the Services that guard the pod on every
/// request, and bytes that are not HTTP go through as bytes only where no `ext_authz` applies.
async fn l4_delivery(
    inputs: Arc<Inputs>,
    pod: Arc<PodCtx>,
    mut tls: ServerTls,
    peer: Peer,
    to: Delivery,
    declared: PortProtocol,
) {
    count(&inputs.stats.deliveries);
    if declared == PortProtocol::Http {
        // The first bytes decide, within the sniff bound (addressing.md §3.1).
        let deadline = tokio::time::Instant::now() + inputs.settings.sniff_bound;
        let mut prefix = Vec::new();
        let mut chunk = [0u8; 4096];
        let mut http = false;
        while prefix.len() < 16 * 1024 {
            match tokio::time::timeout_at(deadline, tls.read(&mut chunk)).await {
                Err(_) | Ok(Ok(0)) => break,
                Ok(Err(_)) => return,
                Ok(Ok(n)) => prefix.extend_from_slice(&chunk[..n]),
            }
            match sniff::sniff(&prefix) {
                sniff::Verdict::Known(s) => {
                    http = s == crate::resolve::decision::Sniffed::Http;
                    break;
                }
                sniff::Verdict::NeedMore => {}
            }
        }
        let prefix = bytes::Bytes::from(prefix);
        if http {
            return l4_http(inputs, pod, tls, prefix, peer, to).await;
        }
        let stream = super::rewind::Rewind::new(prefix, tls);
        return l4_bytes(&inputs, &pod, stream, &peer, to).await;
    }
    l4_bytes(&inputs, &pod, tls, &peer, to).await;
}

/// Bytes to the application after the connection-level authorization (a raw-TCP hop, or the
/// bytes of an L4 hop).
async fn l4_bytes<S>(inputs: &Inputs, pod: &PodCtx, mut stream: S, peer: &Peer, to: Delivery)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let verdict =
        inputs
            .model
            .load()
            .connection_verdict(to.pod_ip, &peer.namespace, &peer.service_account);
    if let Err(why) = verdict {
        count(&inputs.stats.l4_denied);
        debug!(pod = %pod.name, peer = %peer.id, %why, "byte stream over the hop refused");
        return;
    }
    let Some(mut upstream) = super::http::connect_app(inputs, pod, to.app, to.client_ip).await
    else {
        return;
    };
    let mut conn = TcpConn::open(inputs, to.series.clone(), Direction::Inbound, || {
        inbound_line(peer, &to, pod, "deliver", "model.md §12.5 item 2")
    });
    let _ = super::relay(inputs, &mut stream, &mut upstream, &mut conn).await;
}

/// An L4 hop's bytes on an HTTP port, served as HTTP: each request runs the service-level
/// filters of the Services that guard the pod, on the identity the hop proved. The source
/// parsed nothing, so this daemon is the first to read the client's requests: they enter the
/// mesh here as on a captured dial (hop-by-hop fields, `x-aether-` headers and the mesh's own
/// headers removed; only the upgrades the mesh carries switched), and the head and idle
/// deadlines of every HTTP server apply ([`limits`]).
async fn l4_http<S>(
    inputs: Arc<Inputs>,
    pod: Arc<PodCtx>,
    stream: S,
    prefix: bytes::Bytes,
    peer: Peer,
    to: Delivery,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let proto = if prefix.starts_with(sniff::H2_PREFACE) {
        Proto::Http2
    } else {
        Proto::Http1
    };
    let watch = hop_watch(&inputs, proto, &peer, &to);
    let io = TokioIo::new(Watched::new(stream, prefix, watch.clone()));
    let peer = Arc::new(peer);
    let to = Arc::new(to);
    let service = {
        let inputs = inputs.clone();
        let watch = watch.clone();
        hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
            let inputs = inputs.clone();
            let pod = pod.clone();
            let peer = peer.clone();
            let to = to.clone();
            let in_flight = watch.begin(&inputs.stats);
            Box::pin(async move {
                let Some(in_flight) = in_flight else {
                    return Err(limits::refused_stream());
                };
                let started = crate::time::now();
                let logged = inputs.access.pick();
                let request_bytes = logged.then(|| Arc::new(AtomicU64::new(0)));
                let switch = super::filters::strip_client_request(req.headers_mut());
                let switches = super::upgrade::carry(
                    &mut req,
                    switch.upgrade.as_ref(),
                    switch.connection_upgrade,
                );
                let model = inputs.model.load();
                for key in model.guarded_by(to.pod_ip) {
                    for filter in model.filters_of(key) {
                        if let Some(denied) = super::filters::authorize(
                            &inputs,
                            &pod,
                            &filter.config,
                            key,
                            &peer,
                            &req,
                        )
                        .await
                        {
                            let denied = inbound_done(
                                &inputs,
                                &pod,
                                &peer,
                                &to,
                                denied,
                                "deny",
                                started,
                                request_bytes,
                            );
                            return Ok::<_, h2::Error>(denied.map(|b| tracked(b, &in_flight)));
                        }
                    }
                }
                drop(model);
                let version = req.version();
                let client_upgrade = switches.then(|| hyper::upgrade::on(&mut req));
                let req = req.map(|body| {
                    super::access::count_request(
                        body.map_err(BoxError::from).boxed(),
                        request_bytes.as_ref(),
                    )
                });
                let resp = super::http::to_app(
                    &inputs,
                    &pod,
                    to.app,
                    to.client_ip,
                    version,
                    req,
                    client_upgrade,
                )
                .await;
                let resp = inbound_done(
                    &inputs,
                    &pod,
                    &peer,
                    &to,
                    resp,
                    "deliver",
                    started,
                    request_bytes,
                );
                Ok(resp.map(|b| tracked(b, &in_flight)))
            })
        })
    };
    let served = match proto {
        Proto::Http1 => {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(None)
                .serve_connection(io, service)
                .with_upgrades();
            let conn = std::pin::pin!(conn);
            limits::serve(conn, |c| c.graceful_shutdown(), &watch, &inputs).await
        }
        Proto::Http2 => {
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(hyper_util::rt::TokioTimer::new())
                .max_concurrent_streams(inputs.settings.http2_max_concurrent_streams)
                .max_header_list_size(inputs.settings.max_header_list_size)
                .serve_connection(io, service);
            let conn = std::pin::pin!(conn);
            limits::serve(conn, |c| c.graceful_shutdown(), &watch, &inputs).await
        }
    };
    if let Err(e) = served {
        debug!(error = %e, "l4 hop as HTTP ended");
    }
}
