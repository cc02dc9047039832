//! One HTTP connection and each request on it: the first request head is checked before hyper
//! sees it, then every request is resolved on its own against the model value loaded for it
//! (model.md §13, I5) and answered, passed through ([`super::upstream`]) or delivered
//! ([`super::deliver`]).
//!
//! May import: `super::deliver`, `super::upstream`, `respond`, `sniff`, `upgrade`, `filters`
//! (header stripping only), `resolve`. Invariants: every `x-aether-` header a client sent, its
//! hop-by-hop fields and its copies of the mesh's own headers are removed before anything reads
//! the request or adds to it (I12), so no field a client sends can name a header the mesh sets;
//! only the protocol switches the mesh carries are spliced (I11); a request held for the model
//! is resolved again, never answered from the older value.

use std::convert::Infallible;
use std::sync::Arc;

use http::header::HOST;
use http::{Method, Request, Response, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::{debug, info};

use super::deliver::deliver;
use super::upstream::passthrough;
use crate::model::names::{AuthorityInput, HttpVersion};
use crate::proxy::filters::strip_client_request;
use crate::proxy::{Body, BoxError, Inputs, PodCtx, count, respond, sniff, upgrade};
use crate::resolve::answer::{HEADER_ERROR, MeshAnswer, Reason};
use crate::resolve::decision::{HttpEntry, RequestDecision, RequestFacts};
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
    // tokio's clock (std's in the daemon), so that a test with a paused clock sees the bound.
    let deadline = tokio::time::Instant::now() + inputs.settings.sniff_bound;
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
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
    // Before anything reads the request or adds to it: its hop-by-hop fields, `x-aether-`
    // headers (I12) and copies of the mesh's own headers go; a protocol switch the mesh carries
    // (I11) is set again on the mesh's terms.
    let switch = strip_client_request(req.headers_mut());
    let switches = upgrade::carry(&mut req, switch.upgrade.as_ref(), switch.connection_upgrade);
    let client_upgrade = switches.then(|| hyper::upgrade::on(&mut req));
    let facts = Facts::of(&req);
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
                let resp = deliver(inputs, pod, facts.authority(), *d, req, client_upgrade).await;
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
