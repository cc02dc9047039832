//! HTTP on every entry path (addressing.md §2): the captured dial, the pod-IP dial, the
//! loopback proxy port and a captured dial to 18081. Every request is resolved on its own from
//! one model value (model.md §13), then answered, passed through or delivered over the hop.
//!
//! A delivered request also sends the copies its rule's `RequestMirror` filters ask for
//! (fire-and-forget, [`MIRROR_BODY_LIMIT`]); a request that switches protocols (`Upgrade`,
//! addressing.md I11) is carried on a dedicated HTTP/1.1 hop and spliced ([`super::upgrade`]).

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::header::HOST;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use hyper::body::{Body as _, Frame, Incoming};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::{debug, info, warn};

use super::filters::{authorize, modify_headers, mutate_request, set_path, strip_mesh_headers};
use super::hop::HopError;
use super::socket::Source;
use super::{
    ALPN_H1, Body, BoxError, Inputs, MIRROR_BODY_LIMIT, Peer, PodCtx, count, respond, sniff,
    upgrade,
};
use crate::model::filters::{
    FilterStep, MirrorStep, RedirectInput, RuleAnswer, mirror_fires, redirect, rewrite,
};
use crate::model::names::{AuthorityInput, HttpVersion};
use crate::model::snapshot::{FilterConfig, HeaderModifier};
use crate::resolve::answer::{HEADER_ERROR, MeshAnswer, Reason};
use crate::resolve::decision::{Delivery, HttpEntry, RequestDecision, RequestFacts};
use crate::resolve::resolve_request;

/// Serve HTTP on an accepted connection. The first request head is checked before hyper sees
/// it, so that bytes that are not HTTP (loopback), a head the parser rejects, or an oversized
/// head get the mesh's own answer with its reason (addressing.md §11.1).
pub async fn serve(inputs: Arc<Inputs>, pod: Arc<PodCtx>, mut stream: TcpStream, entry: HttpEntry) {
    if let Some(reason) = precheck(&inputs, &stream, entry).await {
        let rendered = MeshAnswer::bare(reason).render();
        let _ = stream
            .write_all(&rendered.to_http1(reason.status_text()))
            .await;
        let _ = stream.shutdown().await;
        count(&inputs.stats.answers);
        return;
    }
    let drain = inputs.drain.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let inputs = inputs.clone();
        let pod = pod.clone();
        async move {
            let req = req.map(|b| b.map_err(BoxError::from).boxed());
            Ok::<_, Infallible>(handle(&inputs, &pod, entry, req).await)
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(hyper_util::rt::TokioTimer::new());
    builder.http2().timer(hyper_util::rt::TokioTimer::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    let mut draining = drain.subscribe();
    // Until the daemon drains; then in-flight requests finish and idle connections close.
    let served = tokio::select! {
        out = conn.as_mut() => out,
        () = async { drop(draining.wait_for(|d| *d).await) } => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = served {
        debug!(error = %e, "http connection ended");
    }
}

/// The first request head: `None` lets hyper serve the connection.
async fn precheck(inputs: &Inputs, stream: &TcpStream, entry: HttpEntry) -> Option<Reason> {
    let limit = inputs.settings.max_header_bytes;
    let mut buf = vec![0u8; limit + 1];
    let deadline = crate::time::now() + inputs.settings.sniff_bound;
    loop {
        let n = match tokio::time::timeout_at(deadline.into(), stream.peek(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return None,
            Ok(Ok(n)) => n,
            // Silence: hyper applies its own header timeout.
            Err(_) => return None,
        };
        let bytes = &buf[..n];
        match sniff::sniff(bytes) {
            sniff::Verdict::Known(crate::resolve::decision::Sniffed::Http) => {}
            sniff::Verdict::Known(_) => {
                return matches!(entry, HttpEntry::Loopback).then_some(Reason::NotHttp);
            }
            sniff::Verdict::NeedMore => {
                if n > limit {
                    return Some(Reason::HeadersTooLarge);
                }
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                continue;
            }
        }
        if bytes.starts_with(sniff::H2_PREFACE) {
            return None;
        }
        let mut headers = [httparse::EMPTY_HEADER; 128];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(bytes) {
            Ok(httparse::Status::Complete(_)) => return None,
            Ok(httparse::Status::Partial) if n > limit => return Some(Reason::HeadersTooLarge),
            Ok(httparse::Status::Partial) => {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            Err(httparse::Error::TooManyHeaders) => return Some(Reason::HeadersTooLarge),
            Err(_) => return Some(Reason::BadRequest),
        }
    }
}

/// Owned facts of one request, so the request itself can move on.
struct Facts {
    version: HttpVersion,
    absolute: Option<String>,
    h2_authority: Option<String>,
    hosts: Vec<String>,
    method: String,
    path: Option<String>,
    headers: Vec<(String, String)>,
}

impl Facts {
    fn of(req: &Request<Body>) -> Self {
        let version = match req.version() {
            Version::HTTP_2 => HttpVersion::H2,
            Version::HTTP_10 => HttpVersion::Http10,
            _ => HttpVersion::Http11,
        };
        let authority = req.uri().authority().map(|a| a.as_str().to_owned());
        let (absolute, h2_authority) = match version {
            HttpVersion::H2 => (None, authority),
            _ if req.method() == Method::CONNECT => (None, None),
            _ => (authority, None),
        };
        let hosts = req
            .headers()
            .get_all(HOST)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        let path = (req.method() != Method::CONNECT).then(|| {
            req.uri()
                .path_and_query()
                .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned())
        });
        let headers = req
            .headers()
            .iter()
            .filter(|(k, _)| !crate::model::filters::is_mesh_header(k.as_str()))
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        Self {
            version,
            absolute,
            h2_authority,
            hosts,
            method: req.method().as_str().to_owned(),
            path,
            headers,
        }
    }

    /// The authority as received (for redirects and the hop's URI).
    fn authority(&self) -> Option<&str> {
        self.absolute
            .as_deref()
            .or(self.h2_authority.as_deref())
            .or(self.hosts.first().map(String::as_str))
    }
}

/// One request on any entry path. A request that asks to switch protocols takes the
/// client's side of the switch with it, so that a `101` from upstream splices the two. A mesh
/// answer to a gRPC request also carries `grpc-status` and `grpc-message`
/// ([`respond::for_grpc`]).
pub async fn handle(
    inputs: &Arc<Inputs>,
    pod: &Arc<PodCtx>,
    entry: HttpEntry,
    req: Request<Body>,
) -> Response<Body> {
    let grpc = respond::is_grpc(req.headers());
    let mut resp = answer_request(inputs, pod, entry, req).await;
    if grpc {
        respond::for_grpc(&mut resp);
    }
    resp
}

async fn answer_request(
    inputs: &Arc<Inputs>,
    pod: &Arc<PodCtx>,
    entry: HttpEntry,
    mut req: Request<Body>,
) -> Response<Body> {
    count(&inputs.stats.requests);
    let facts = Facts::of(&req);
    let client_upgrade = upgrade::is_upgrade(&req).then(|| hyper::upgrade::on(&mut req));
    strip_mesh_headers(req.headers_mut());
    let caller = pod.caller();
    let host_refs: Vec<&str> = facts.hosts.iter().map(String::as_str).collect();
    let mut hold_expired = false;
    let started = crate::time::now();
    loop {
        let generation = inputs.model.generation();
        let model = inputs.model.load();
        let request = RequestFacts {
            entry,
            authority: AuthorityInput {
                version: facts.version,
                absolute: facts.absolute.as_deref(),
                h2_authority: facts.h2_authority.as_deref(),
                hosts: &host_refs,
            },
            method: &facts.method,
            path_and_query: facts.path.as_deref(),
            headers: &facts.headers,
            hold_expired,
            entropy: fastrand::u64(..),
        };
        let decision = resolve_request(&model, caller, &request);
        let resp = match decision {
            RequestDecision::Hold(_, _) => {
                let left = inputs.settings.hold.saturating_sub(started.elapsed());
                if left.is_zero() || !inputs.model.newer_than(generation, left).await {
                    hold_expired = true;
                }
                continue;
            }
            RequestDecision::Answer(answer, why) => {
                count(&inputs.stats.answers);
                info!(target: "aether::access", pod = %pod.name, host = ?facts.authority(),
                    decision = "refuse", reason = answer.reason.code(), rule = why.rule);
                respond::answer(&answer)
            }
            RequestDecision::Redirect {
                status, location, ..
            } => respond::redirect(status, &location),
            RequestDecision::Passthrough(_) => {
                count(&inputs.stats.passthroughs);
                let dialled = match entry {
                    HttpEntry::Captured { dialled }
                    | HttpEntry::PodIp { dialled }
                    | HttpEntry::ProxyCaptured { dialled } => dialled,
                    HttpEntry::Loopback => {
                        return respond::reason(Reason::NotAMeshName);
                    }
                };
                let resp = passthrough(inputs, pod, dialled, req, client_upgrade).await;
                info!(target: "aether::access", pod = %pod.name, host = ?facts.authority(),
                    decision = "passthrough", dst.addr = %dialled, status = resp.status().as_u16(),
                    duration_us = started.elapsed().as_micros());
                resp
            }
            RequestDecision::Deliver(d) => {
                let svc = d.backend.service.clone();
                let port = d.backend.pod_port;
                let resp = deliver(inputs, pod, &facts, *d, req, client_upgrade).await;
                info!(target: "aether::access", pod = %pod.name, host = ?facts.authority(),
                    decision = "deliver", %svc, dst.port = port, status = resp.status().as_u16(),
                    reason = resp.headers().get(HEADER_ERROR).and_then(|v| v.to_str().ok()),
                    duration_us = started.elapsed().as_micros());
                resp
            }
        };
        return resp;
    }
}

/// Forward one request outside the mesh to the address the client dialled, from the client
/// pod's own address; the application's `x-aether-error` is removed (I12). An upgrade request
/// is spliced once the destination switches.
async fn passthrough(
    inputs: &Inputs,
    pod: &PodCtx,
    dialled: SocketAddr,
    req: Request<Body>,
    client_upgrade: Option<OnUpgrade>,
) -> Response<Body> {
    let Ok(source) = pod.net.ip_for(dialled) else {
        return respond::reason(Reason::UpstreamUnreachable);
    };
    let h2 = req.version() == Version::HTTP_2;
    let connect = || async {
        tokio::time::timeout(
            inputs.settings.connect_timeout,
            pod.net.connect(dialled, Source::PodIp),
        )
        .await
        .ok()
        .and_then(Result::ok)
    };
    forward(
        inputs,
        source,
        dialled,
        h2,
        origin_form(req),
        client_upgrade,
        connect,
    )
    .await
}

/// Send a request to `dst` — a passthrough destination, or the application on a delivery — and
/// answer with its response, the upstream's `x-aether-error` removed (I12). The request goes on
/// a kept connection per (`source`, `dst`) (`proxy::app_pool`); an upgrade request gets a
/// connection of its own, which becomes the client's after `101`.
async fn forward<F, Fut>(
    inputs: &Inputs,
    source: IpAddr,
    dst: SocketAddr,
    h2: bool,
    req: Request<Body>,
    client_upgrade: Option<OnUpgrade>,
    connect: F,
) -> Response<Body>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Option<TcpStream>>,
{
    let sent = match client_upgrade {
        Some(up) => match connect().await {
            Some(stream) => upgrade::forward(stream, req, up)
                .await
                .map_err(BoxError::from),
            None => Err("the destination refused the connection".into()),
        },
        None => inputs.apps.send(source, dst, h2, req, connect).await,
    };
    match sent {
        Ok(mut resp) => {
            count_switch(inputs, &resp);
            resp.headers_mut().remove(HEADER_ERROR);
            resp
        }
        Err(e) => {
            debug!(error = %crate::DisplayChain(&*e), %dst, "upstream request failed");
            respond::reason(Reason::UpstreamUnreachable)
        }
    }
}

/// Count a `101` that starts a splice.
fn count_switch(inputs: &Inputs, resp: &Response<Body>) {
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        count(&inputs.stats.upgrades);
    }
}

/// HTTP/1 sends origin form (absolute form is kept when the client used it); HTTP/2 needs a
/// scheme and authority, which stay as received.
fn origin_form(mut req: Request<Body>) -> Request<Body> {
    if req.version() == Version::HTTP_2 {
        return req;
    }
    if req.uri().scheme().is_some() {
        return req;
    }
    let pq = req
        .uri()
        .path_and_query()
        .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
    if let Ok(uri) = Uri::try_from(pq) {
        *req.uri_mut() = uri;
    }
    req
}

/// The response header modifiers collected while the request filters run.
#[derive(Default)]
struct ResponseSteps(Vec<HeaderModifier>);

impl ResponseSteps {
    fn apply(&self, resp: &mut Response<Body>) {
        for m in &self.0 {
            modify_headers(resp.headers_mut(), m);
        }
    }
}

/// The caller as an identity, for route-level authorization on the source node.
fn self_peer(inputs: &Inputs, pod: &PodCtx) -> Peer {
    Peer {
        namespace: pod.namespace.clone(),
        service_account: pod.service_account.clone(),
        id: format!(
            "spiffe://{}/ns/{}/sa/{}",
            inputs.settings.trust_domain, pod.namespace, pod.service_account
        ),
    }
}

/// The answer of a rule's `RequestRedirect` for this request (routes.md §4).
fn rule_redirect(
    r: &crate::model::snapshot::Redirect,
    facts: &Facts,
    req: &Request<Body>,
    front_port: u16,
    run: &crate::resolve::decision::RouteRun,
) -> Response<Body> {
    let answer = redirect(
        r,
        RedirectInput {
            scheme: "http",
            authority: facts.authority().unwrap_or(""),
            listener_port: front_port,
            path: req.uri().path(),
            query: req.uri().query(),
            matched_prefix: run.matched_prefix.as_deref(),
        },
    );
    respond::redirect(answer.status, &answer.location)
}

/// Deliver a request over the mesh hop with every filter that applies (routes.md §4, §5),
/// sending the mirrors that fire. An upgrade request crosses a dedicated HTTP/1.1 hop and is
/// spliced on `101`.
async fn deliver(
    inputs: &Arc<Inputs>,
    pod: &Arc<PodCtx>,
    facts: &Facts,
    d: Delivery,
    mut req: Request<Body>,
    client_upgrade: Option<OnUpgrade>,
) -> Response<Body> {
    // addressing.md §2: a delivered request carries the authority it was routed on as its
    // `Host` (an absolute-form target's, not a `Host` field that says otherwise), so routing,
    // filters and the application see the same authority.
    if let Some(a) = facts
        .authority()
        .and_then(|a| HeaderValue::from_str(a).ok())
    {
        req.headers_mut().insert(HOST, a);
    }
    let mut rule_response = ResponseSteps::default();
    let mut backend_response = ResponseSteps::default();
    if let Some(run) = &d.route {
        let plan = &run.plan;
        if matches!(plan.answer, RuleAnswer::Invalid(_) | RuleAnswer::NoBackends) {
            return respond::reason(Reason::InvalidBackend);
        }
        let backend = plan.backends.get(run.backend_index);
        let steps = plan
            .request
            .iter()
            .chain(backend.into_iter().flat_map(|b| b.request.iter()));
        for step in steps {
            match step {
                FilterStep::RequestHeaders(m) => modify_headers(req.headers_mut(), m),
                FilterStep::ResponseHeaders(m) => rule_response.0.push(m.clone()),
                FilterStep::Redirect(r) => {
                    let mut resp = rule_redirect(r, facts, &req, d.front_port, run);
                    rule_response.apply(&mut resp);
                    return resp;
                }
                FilterStep::Rewrite(rw) => {
                    let (authority, path) =
                        rewrite(rw, req.uri().path(), run.matched_prefix.as_deref());
                    let target = match req.uri().query() {
                        Some(q) => format!("{path}?{q}"),
                        None => path,
                    };
                    set_path(&mut req, &target);
                    if let Some(a) = authority
                        && let Ok(v) = HeaderValue::from_str(&a)
                    {
                        req.headers_mut().insert(HOST, v);
                    }
                }
                FilterStep::Extension(obj) => {
                    let Some((_, config)) = run
                        .route_level
                        .iter()
                        .find(|(n, _)| n.rsplit('/').next() == Some(obj.name.as_str()))
                    else {
                        return respond::reason(Reason::InvalidBackend);
                    };
                    match config {
                        FilterConfig::HeaderMutation(m) => {
                            mutate_request(&mut req, m);
                            rule_response.0.push(m.response.clone());
                        }
                        other => {
                            let peer = self_peer(inputs, pod);
                            let key = d.backend.service.clone();
                            if let Some(denied) =
                                authorize(inputs, pod, other, &key, &peer, &req).await
                            {
                                return denied;
                            }
                        }
                    }
                }
            }
        }
        if let Some(b) = backend {
            for step in &b.response {
                if let FilterStep::ResponseHeaders(m) = step {
                    backend_response.0.push(m.clone());
                }
            }
        }
        for step in &plan.response {
            if let FilterStep::ResponseHeaders(m) = step {
                rule_response.0.push(m.clone());
            }
        }
        if let RuleAnswer::Redirect(r) = &plan.answer {
            let mut resp = rule_redirect(r, facts, &req, d.front_port, run);
            backend_response.apply(&mut resp);
            rule_response.apply(&mut resp);
            return resp;
        }
    }
    // The copies see the request as the rule's filters left it (routes.md §4 item 4).
    let mirrors = fired_mirrors(&d);
    if !mirrors.is_empty() {
        req = send_mirrors(inputs, pod, &d, mirrors, req, client_upgrade.is_some()).await;
    }
    // routes.md §5.5: service-level header mutation runs on the source node.
    let mut service_response = ResponseSteps::default();
    for (_, filters) in &d.service_filters {
        for f in filters.iter() {
            if let FilterConfig::HeaderMutation(m) = &f.config {
                mutate_request(&mut req, m);
                service_response.0.push(m.response.clone());
            }
        }
    }
    let endpoints = &d.backend.endpoints;
    if endpoints.is_empty() {
        return respond::reason(Reason::NoEndpoints);
    }
    let endpoint = &endpoints[fastrand::usize(..endpoints.len())];
    let version = req.version();
    count(&inputs.stats.deliveries);
    let send = async {
        match client_upgrade {
            None => {
                super::hop::annotate(&mut req, &d.filter_services, version, d.backend.h2c);
                let req = hop_form(req);
                inputs
                    .pool
                    .send(inputs, pod, endpoint, d.backend.pod_port, req)
                    .await
                    .map(|r| r.map(|b| b.map_err(BoxError::from).boxed()))
                    .map_err(BoxError::from)
            }
            // HTTP/2 cannot switch protocols: the request gets an HTTP/1.1 hop of its own,
            // and the application is reached as HTTP/1.1 whatever `appProtocol` says.
            Some(up) => {
                super::hop::annotate(&mut req, &d.filter_services, Version::HTTP_11, false);
                let req = origin_form_any(req);
                let tls =
                    super::hop::connect(inputs, pod, endpoint, d.backend.pod_port, ALPN_H1).await?;
                let resp = upgrade::forward(tls, req, up).await?;
                count_switch(inputs, &resp);
                Ok(resp)
            }
        }
    };
    let result: Result<Response<Body>, BoxError> = match d.timeout_ms {
        Some(ms) => match tokio::time::timeout(std::time::Duration::from_millis(ms), send).await {
            Ok(r) => r,
            Err(_) => return respond::reason(Reason::UpstreamUnreachable),
        },
        None => send.await,
    };
    let mut resp = match result {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %crate::DisplayChain(&*e), endpoint = %endpoint.address,
                "mesh hop failed");
            return respond::reason(Reason::UpstreamUnreachable);
        }
    };
    backend_response.apply(&mut resp);
    rule_response.apply(&mut resp);
    service_response.apply(&mut resp);
    resp
}

/// The request as sent over the HTTP/2 hop: an absolute URI (`http://<authority><path>`) so
/// that HTTP/2 has its pseudo-headers. The authority is the `Host` [`deliver`] set, as a
/// rule's `URLRewrite` may have changed it.
fn hop_form(mut req: Request<Body>) -> Request<Body> {
    let pq = req
        .uri()
        .path_and_query()
        .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
    let host = req
        .headers()
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|a| http::uri::Authority::try_from(*a).is_ok())
        .unwrap_or("mesh.invalid")
        .to_owned();
    if let Ok(uri) = Uri::try_from(format!("http://{host}{pq}")) {
        *req.uri_mut() = uri;
    }
    *req.version_mut() = Version::HTTP_2;
    req
}

/// Connect to the application in the destination pod from a transparent socket bound to the
/// client pod's IP; where the kernel refuses, from the pod's own IP, counted (model.md §12.4).
pub async fn connect_app(
    inputs: &Inputs,
    pod: &PodCtx,
    app: SocketAddr,
    client_ip: IpAddr,
) -> Option<TcpStream> {
    let transparent = if client_ip == app.ip() || client_ip.is_ipv4() != app.is_ipv4() {
        Source::PodIp
    } else {
        Source::Transparent(client_ip)
    };
    match pod.net.connect(app, transparent).await {
        Ok(s) => Some(s),
        Err(super::socket::SocketError::Io { what: "bind", .. }) => {
            count(&inputs.stats.transparent_fallbacks);
            pod.net.connect(app, Source::PodIp).await.ok()
        }
        Err(e) => {
            debug!(error = %e, %app, "application refused the delivery");
            None
        }
    }
}

/// Hand a request that arrived over the hop to the application, in the client's HTTP version;
/// the application's `x-aether-error` is removed (I12). With `client_upgrade` (the hop's side
/// of a switch) the request goes as HTTP/1.1 and a `101` splices the two connections.
pub async fn to_app(
    inputs: &Inputs,
    pod: &PodCtx,
    app: SocketAddr,
    client_ip: IpAddr,
    version: Version,
    mut req: Request<Body>,
    client_upgrade: Option<OnUpgrade>,
) -> Response<Body> {
    // An upgrade is HTTP/1.1; otherwise the client's version (or h2c when the hop asked).
    let h2 = version == Version::HTTP_2 && client_upgrade.is_none();
    *req.version_mut() = match (h2, &client_upgrade) {
        (true, _) => Version::HTTP_2,
        (false, Some(_)) => Version::HTTP_11,
        (false, None) => version,
    };
    let req = if h2 { req } else { origin_form_any(req) };
    let connect = || connect_app(inputs, pod, app, client_ip);
    forward(inputs, client_ip, app, h2, req, client_upgrade, connect).await
}

/// Origin form for HTTP/1 toward the application, whatever form the hop carried.
fn origin_form_any(mut req: Request<Body>) -> Request<Body> {
    let pq = req
        .uri()
        .path_and_query()
        .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
    if let Ok(uri) = Uri::try_from(pq) {
        *req.uri_mut() = uri;
    }
    req
}

/// Why a request the mesh makes itself ([`mesh_call`], a mirror copy) was not answered.
#[derive(Debug, thiserror::Error)]
enum MeshCallError {
    /// The name does not resolve to a delivery from this pod.
    #[error("{0} is not delivered from this pod")]
    NotDelivered(String),
    /// The Service has no endpoint.
    #[error("{0} has no endpoints")]
    NoEndpoints(String),
    /// The hop failed.
    #[error(transparent)]
    Hop(#[from] HopError),
}

/// A request the mesh itself makes from a pod (an `ext_authz` check): resolved as if the pod
/// had sent it to its loopback proxy port, delivered over the hop. `None` when it cannot be
/// delivered.
pub async fn mesh_call(
    inputs: &Inputs,
    pod: &PodCtx,
    authority: &str,
    req: Request<Body>,
) -> Option<Response<Body>> {
    mesh_send(inputs, pod, authority, req)
        .await
        .ok()
        .map(|r| r.map(|b| b.map_err(BoxError::from).boxed()))
}

/// [`mesh_call`], saying why it failed.
async fn mesh_send(
    inputs: &Inputs,
    pod: &PodCtx,
    authority: &str,
    mut req: Request<Body>,
) -> Result<Response<Incoming>, MeshCallError> {
    let model = inputs.model.load();
    let hosts = [authority];
    let facts = RequestFacts {
        entry: HttpEntry::Loopback,
        authority: AuthorityInput {
            version: HttpVersion::Http11,
            absolute: None,
            h2_authority: None,
            hosts: &hosts,
        },
        method: req.method().as_str(),
        path_and_query: req
            .uri()
            .path_and_query()
            .map(http::uri::PathAndQuery::as_str),
        headers: &[],
        hold_expired: true,
        entropy: fastrand::u64(..),
    };
    let RequestDecision::Deliver(d) = resolve_request(&model, pod.caller(), &facts) else {
        return Err(MeshCallError::NotDelivered(authority.to_owned()));
    };
    let endpoints = &d.backend.endpoints;
    if endpoints.is_empty() {
        return Err(MeshCallError::NoEndpoints(authority.to_owned()));
    }
    let endpoint = &endpoints[fastrand::usize(..endpoints.len())];
    super::hop::annotate(
        &mut req,
        &d.filter_services,
        Version::HTTP_11,
        d.backend.h2c,
    );
    if let Ok(v) = HeaderValue::from_str(authority) {
        req.headers_mut().insert(HOST, v);
    }
    let req = hop_form(req);
    Ok(inputs
        .pool
        .send(inputs, pod, endpoint, d.backend.pod_port, req)
        .await?)
}

/// How long a mirror copy may take, answer included; it never delays the client.
const MIRROR_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long the body of a request of unknown length is awaited for its copies before the
/// copies are given up (a streaming request must not wait on its own mirror).
const MIRROR_BODY_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The rule's and the chosen backend's mirrors that fire for this request ([`mirror_fires`],
/// each on its own entropy).
fn fired_mirrors(d: &Delivery) -> Vec<MirrorStep> {
    let Some(run) = &d.route else {
        return Vec::new();
    };
    let backend = run.plan.backends.get(run.backend_index);
    run.plan
        .mirrors
        .iter()
        .chain(backend.into_iter().flat_map(|b| b.mirrors.iter()))
        .filter(|m| mirror_fires(m.0.percent, fastrand::u64(..)))
        .cloned()
        .collect()
}

/// Send a copy of `req` to each mirror, fire-and-forget, and give back the request to deliver
/// (its body replayed when it was read for the copies). A copy is not sent, logged and counted,
/// when the request switches protocols or its body is over [`MIRROR_BODY_LIMIT`] (or of
/// unknown length and slower than [`MIRROR_BODY_WAIT`]).
async fn send_mirrors(
    inputs: &Arc<Inputs>,
    pod: &Arc<PodCtx>,
    d: &Delivery,
    mirrors: Vec<MirrorStep>,
    req: Request<Body>,
    upgrade: bool,
) -> Request<Body> {
    let skip = |why: &str| {
        for m in &mirrors {
            info!(pod = %pod.name, mirror = %m, why, "request not mirrored");
            count(&inputs.stats.mirror_skipped);
        }
    };
    if upgrade {
        skip("the request switches protocols");
        return req;
    }
    let (parts, body) = req.into_parts();
    let (body, copy) = buffer_body(body, MIRROR_BODY_LIMIT, MIRROR_BODY_WAIT).await;
    let Some(copy) = copy else {
        skip("the body is over the mirror limit or did not arrive in time");
        return Request::from_parts(parts, body);
    };
    let namespace = d
        .rule
        .as_ref()
        .map_or(pod.namespace.as_str(), |r| &*r.namespace)
        .to_owned();
    for m in mirrors {
        let Some(authority) = mirror_authority(&m, &namespace, &inputs.settings.mesh_domain) else {
            warn!(pod = %pod.name, mirror = %m, "mirror is not a Service with a port");
            count(&inputs.stats.mirror_failures);
            continue;
        };
        let mut builder = Request::builder()
            .method(parts.method.clone())
            .uri(parts.uri.clone())
            .version(Version::HTTP_11);
        for (k, v) in &parts.headers {
            if !is_hop_by_hop(k) {
                builder = builder.header(k, v);
            }
        }
        let Ok(copy) = builder.body(respond::full(copy.clone())) else {
            count(&inputs.stats.mirror_failures);
            continue;
        };
        count(&inputs.stats.mirrors);
        let inputs = inputs.clone();
        let pod = pod.clone();
        tokio::spawn(async move {
            let sent = tokio::time::timeout(MIRROR_TIMEOUT, async {
                let resp = mesh_send(&inputs, &pod, &authority, copy).await?;
                let status = resp.status();
                // The answer is read and discarded, so the copy completes at the mirror.
                let _ = resp.into_body().collect().await;
                Ok::<_, MeshCallError>(status)
            })
            .await;
            match sent {
                Ok(Ok(status)) => debug!(%authority, %status, "mirror answered"),
                Ok(Err(e)) => {
                    warn!(pod = %pod.name, %authority, error = %crate::DisplayChain(&e),
                        "mirror failed");
                    count(&inputs.stats.mirror_failures);
                }
                Err(_) => {
                    warn!(pod = %pod.name, %authority, "mirror timed out");
                    count(&inputs.stats.mirror_failures);
                }
            }
        });
    }
    Request::from_parts(parts, body)
}

/// The mesh name and port a mirror is sent to (`<svc>.<ns>.<mesh-domain>:<port>`); `None`
/// unless it names a core Service with a port.
fn mirror_authority(m: &MirrorStep, namespace: &str, mesh_domain: &str) -> Option<String> {
    let target = &m.0.backend;
    if !target.group.is_empty() || target.kind != "Service" {
        return None;
    }
    let port = m.0.port?;
    let ns = target.namespace.as_deref().unwrap_or(namespace);
    Some(format!("{}.{ns}.{mesh_domain}:{port}", target.name))
}

/// Connection-specific fields, which a copy sent over HTTP/2 does not carry.
fn is_hop_by_hop(name: &http::HeaderName) -> bool {
    use http::header::{CONNECTION, TE, TRANSFER_ENCODING, UPGRADE};
    name == CONNECTION
        || name == TE
        || name == TRANSFER_ENCODING
        || name == UPGRADE
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// Read `body` for a copy, up to `limit` bytes and, when its length is not known in advance,
/// for at most `wait`. Returns the body to send on (the frames read, replayed, then the rest)
/// and the copy's bytes, `None` when the body is over the limit, late, or broken.
async fn buffer_body(
    mut body: Body,
    limit: usize,
    wait: std::time::Duration,
) -> (Body, Option<Bytes>) {
    if body.is_end_stream() {
        return (body, Some(Bytes::new()));
    }
    let hint = body.size_hint();
    let limit64 = u64::try_from(limit).unwrap_or(u64::MAX);
    if hint.lower() > limit64 {
        return (body, None);
    }
    let known = hint.upper().is_some();
    // tokio's clock, so that a test with a paused clock sees the bound exactly.
    let deadline = tokio::time::Instant::now() + wait;
    let mut frames: Vec<Frame<Bytes>> = Vec::new();
    let mut data = BytesMut::new();
    loop {
        let next = if known {
            Ok(body.frame().await)
        } else {
            tokio::time::timeout_at(deadline, body.frame()).await
        };
        match next {
            Ok(None) => return (replay(frames, None, None), Some(data.freeze())),
            Ok(Some(Ok(frame))) => {
                if let Some(chunk) = frame.data_ref() {
                    data.extend_from_slice(chunk);
                }
                frames.push(frame);
                if data.len() > limit {
                    return (replay(frames, None, Some(body)), None);
                }
            }
            // The client's body broke: the delivery sees the same error.
            Ok(Some(Err(e))) => return (replay(frames, Some(e), None), None),
            Err(_) => return (replay(frames, None, Some(body)), None),
        }
    }
}

/// A body of the `frames` already read, then `error` or the `rest`.
fn replay(frames: Vec<Frame<Bytes>>, error: Option<BoxError>, rest: Option<Body>) -> Body {
    use futures_util::StreamExt;
    let read = futures_util::stream::iter(
        frames
            .into_iter()
            .map(Ok::<_, BoxError>)
            .chain(error.map(Err)),
    );
    match rest {
        Some(rest) => BodyExt::boxed(StreamBody::new(read.chain(BodyStream::new(rest)))),
        None => BodyExt::boxed(StreamBody::new(read)),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::model::snapshot::{Mirror, ObjectRef};

    fn chunks(parts: &[&'static [u8]]) -> (Body, tokio::sync::mpsc::Sender<&'static [u8]>) {
        let (tx, rx) = tokio::sync::mpsc::channel::<&'static [u8]>(16);
        for p in parts {
            tx.try_send(p).unwrap();
        }
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            let chunk = rx.recv().await?;
            Some((
                Ok::<_, BoxError>(Frame::data(Bytes::from_static(chunk))),
                rx,
            ))
        });
        (BodyExt::boxed(StreamBody::new(stream)), tx)
    }

    async fn all(body: Body) -> Bytes {
        body.collect().await.expect("the body").to_bytes()
    }

    #[tokio::test]
    async fn a_body_under_the_limit_is_copied_and_still_delivered_whole() {
        let body = respond::full("name=value&x=1");
        let (body, copy) = buffer_body(body, 64, Duration::from_secs(1)).await;
        assert_eq!(copy.as_deref(), Some(&b"name=value&x=1"[..]));
        assert_eq!(all(body).await, "name=value&x=1");
        let (body, copy) = buffer_body(respond::empty(), 64, Duration::from_secs(1)).await;
        assert_eq!(copy.as_deref(), Some(&b""[..]));
        assert_eq!(all(body).await, "");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_not_copied_and_is_delivered_whole() {
        // Known length over the limit: not even read.
        let (body, copy) = buffer_body(respond::full("0123456789"), 4, Duration::ZERO).await;
        assert!(copy.is_none());
        assert_eq!(all(body).await, "0123456789");
        // Unknown length: read until over, then replayed ahead of the rest.
        let (body, tx) = chunks(&[b"abc", b"def", b"ghi"]);
        drop(tx);
        let (body, copy) = buffer_body(body, 4, Duration::from_secs(1)).await;
        assert!(copy.is_none());
        assert_eq!(all(body).await, "abcdefghi");
    }

    #[tokio::test(start_paused = true)]
    async fn a_streaming_body_is_not_waited_for_beyond_the_bound() {
        let (body, tx) = chunks(&[b"first "]);
        let started = tokio::time::Instant::now();
        let (body, copy) = buffer_body(body, 1024, Duration::from_millis(50)).await;
        assert!(copy.is_none(), "the copy is given up");
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(50),
            "given up at the bound"
        );
        tx.send(b"second").await.unwrap();
        drop(tx);
        assert_eq!(all(body).await, "first second");
    }

    fn mirror(group: &str, kind: &str, ns: Option<&str>, port: Option<u16>) -> MirrorStep {
        MirrorStep(Mirror {
            backend: ObjectRef {
                group: group.into(),
                kind: kind.into(),
                namespace: ns.map(Into::into),
                name: "mp-authz".into(),
            },
            port,
            percent: 100,
        })
    }

    #[test]
    fn a_mirror_is_sent_to_the_mesh_name_of_its_service() {
        let d = "aether.internal";
        assert_eq!(
            mirror_authority(&mirror("", "Service", None, Some(9191)), "mp", d).as_deref(),
            Some("mp-authz.mp.aether.internal:9191")
        );
        assert_eq!(
            mirror_authority(&mirror("", "Service", Some("audit"), Some(80)), "mp", d).as_deref(),
            Some("mp-authz.audit.aether.internal:80")
        );
        assert_eq!(
            mirror_authority(&mirror("", "Service", None, None), "mp", d),
            None
        );
        assert_eq!(
            mirror_authority(&mirror("example.com", "Backend", None, Some(80)), "mp", d),
            None
        );
    }
}
