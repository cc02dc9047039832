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

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use bytes::{Bytes, BytesMut};
use http::header::HOST;
use http::{HeaderMap, HeaderValue, Method, Request, Response, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::debug;

use super::deliver::{Hopped, deliver};
use super::limits::{self, Proto, Watch, Watched, track, tracked};
use super::upstream::passthrough;
use crate::model::names::{AuthorityInput, HttpVersion};
use crate::proxy::filters::strip_client_request;
use crate::proxy::metrics::{self, Direction};
use crate::proxy::overload::{HEAD_READ_BYTES, Shed};
use crate::proxy::{Body, Inputs, PodCtx, access, count, respond, sniff, upgrade};
use crate::resolve::answer::{HEADER_ERROR, MeshAnswer, Reason};
use crate::resolve::decision::{HttpEntry, RequestDecision, RequestFacts, ServiceKey};
use crate::resolve::resolve_request;

/// Serve HTTP on an accepted connection. The first request head is read and checked before
/// hyper sees it, so that bytes that are not HTTP (loopback), a head the parser rejects, or an
/// oversized head get the mesh's own answer with its reason (addressing.md §11.1), and a head
/// that does not arrive whole within the header read timeout of the accept, however it is
/// dripped, closes the connection. Then every request is served with the head and idle
/// deadlines of [`limits`].
pub async fn serve(inputs: Arc<Inputs>, pod: Arc<PodCtx>, mut stream: TcpStream, entry: HttpEntry) {
    let accepted = tokio::time::Instant::now();
    let deadline = accepted + inputs.settings.header_read_timeout;
    // Until hyper has it, the first head is held here: a shed closes it as a partial head.
    let (pending, registered) = inputs.overload.pending();
    let first = precheck(&inputs, &mut stream, entry, deadline, &pending).await;
    drop((pending, registered));
    let (prefix, proto) = match first {
        First::Serve(prefix, proto) => (prefix, proto),
        First::Answer(reason) => {
            match reason {
                Reason::BadRequest => count(&inputs.stats.bad_requests),
                Reason::HeadersTooLarge => count(&inputs.stats.headers_too_large),
                _ => {}
            }
            let rendered = MeshAnswer::bare(reason)
                .render()
                .to_http1(reason.status_text());
            let _ = stream.write_all(&rendered).await;
            let _ = stream.shutdown().await;
            count(&inputs.stats.answers);
            inputs.metrics.refused(reason);
            let took = accepted.elapsed();
            inputs.metrics.unknown(pod.source()).record_request(
                Direction::Outbound,
                reason.status(),
                Some(reason),
                took,
            );
            if inputs.access.pick() {
                let line = access::Line {
                    source: access::Source::pod(&pod, &inputs.settings.trust_domain),
                    path: access::entry_path(entry),
                    decision: "refuse",
                    destination: access::Destination {
                        rule: "addressing.md §11.1",
                        ..access::Destination::default()
                    },
                };
                access::answered_at_head(
                    &line,
                    reason.status(),
                    reason.code(),
                    rendered.len() as u64,
                    took,
                );
            }
            return;
        }
        First::Close => return,
    };
    let watch = Watch::guarded(
        proto,
        &inputs.settings,
        Some(accepted),
        &inputs.overload,
        Arc::from(format!("{}/{}", pod.namespace, pod.name)),
    );
    let io = TokioIo::new(Watched::new(stream, prefix, watch.clone()));
    let settings = &inputs.settings;
    let service = {
        let inputs = inputs.clone();
        let watch = watch.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let inputs = inputs.clone();
            let pod = pod.clone();
            let in_flight = watch.begin(&inputs.stats);
            // Boxed: hyper's HTTP/1 server keeps room for one request's future for the
            // connection's whole life, so an unboxed one (kilobytes) would cost every idle
            // keep-alive connection that much (issue #8, finding 13).
            Box::pin(async move {
                let Some(in_flight) = in_flight else {
                    return Err(limits::refused_stream());
                };
                let req = req.map(|b| track(b, &in_flight));
                let mut resp = handle(&inputs, &pod, entry, req, &in_flight).await;
                // Draining: an HTTP/1 answer says the connection closes after it (hyper then
                // closes it), so that a client never sends its next request into the close.
                if proto == Proto::Http1
                    && *inputs.drain.borrow()
                    && resp.status() != http::StatusCode::SWITCHING_PROTOCOLS
                {
                    resp.headers_mut()
                        .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
                }
                Ok(resp.map(|b| tracked(b, &in_flight)))
            })
        })
    };
    let served = match proto {
        Proto::Http1 => {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                // The head deadline is `limits`': hyper's also runs while a kept connection
                // waits for its next request, which is the idle deadline's business.
                .header_read_timeout(None)
                .max_header_size(settings.max_header_bytes);
            if settings.max_headers != HYPER_MAX_HEADERS {
                builder.max_headers(settings.max_headers);
            }
            let conn = builder.serve_connection(io, service).with_upgrades();
            let conn = std::pin::pin!(conn);
            limits::serve(conn, |c| c.graceful_shutdown(), &watch, &inputs).await
        }
        Proto::Http2 => {
            let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_concurrent_streams(settings.http2_max_concurrent_streams)
                // Up to twice the limit reaches `handle`, which answers `431
                // headers-too-large` with its reason; h2 itself refuses what is larger.
                .max_header_list_size(settings.max_header_list_size.saturating_mul(2))
                .serve_connection(io, service);
            let conn = std::pin::pin!(conn);
            limits::serve(conn, |c| c.graceful_shutdown(), &watch, &inputs).await
        }
    };
    if let Err(e) = served {
        debug!(error = %e, "http connection ended");
    }
}

/// hyper's own limit of header fields in an HTTP/1 head (kept on the stack; another value costs
/// an allocation per request).
const HYPER_MAX_HEADERS: usize = 100;

/// What the first request head of a connection gets.
enum First {
    /// hyper serves the connection: the bytes read so far and the protocol.
    Serve(Bytes, Proto),
    /// The mesh answers and closes.
    Answer(Reason),
    /// Closed without an answer: the client sent nothing and closed, or the head was late.
    Close,
}

/// Read the first request head, up to `deadline` (not extended by each byte that arrives):
/// bytes are read, not peeked, so the client's end of stream is seen at once.
async fn precheck(
    inputs: &Inputs,
    stream: &mut TcpStream,
    entry: HttpEntry,
    deadline: tokio::time::Instant,
    pending: &crate::proxy::overload::Pending,
) -> First {
    let limit = inputs.settings.max_header_bytes;
    let mut buf = BytesMut::new();
    // What the buffer holds beyond one read's room, against `max_pending_head_bytes`: a flood
    // of slow heads that grow together is refused before it is allocated, where the memory
    // levels would see it only after (issue #37's CI: OVERLOAD's drip doubled four thousand
    // buffers between two checks).
    let mut charged = HeadCharge {
        overload: &inputs.overload,
        bytes: 0,
    };
    loop {
        if !buf.is_empty()
            && let Some(first) = judge(&buf, entry, &inputs.settings)
        {
            return match first {
                Judged::Http(proto) => First::Serve(buf.freeze(), proto),
                Judged::Answer(reason) => First::Answer(reason),
            };
        }
        // At most one byte over the limit is read: enough to know the head is too large.
        let room = (limit + 1).saturating_sub(buf.len());
        let want = room.min(HEAD_READ_BYTES);
        if buf.capacity() - buf.len() < want {
            // At most what `BytesMut` grows to: the larger of what is asked and twice it.
            let grown = (buf.len() + want).max(buf.capacity() * 2);
            if !charged.to(grown) {
                inputs.overload.count(Shed::HeadBudget);
                debug!(entry = ?entry, bytes = buf.len(), "first request head past the node's budget of partial heads (max_pending_head_bytes): closed");
                return First::Close;
            }
        }
        buf.reserve(want);
        charged.settle(buf.capacity());
        let mut window = (&mut *stream).take(u64::try_from(room).unwrap_or(u64::MAX));
        let read = tokio::select! {
            read = tokio::time::timeout_at(deadline, window.read_buf(&mut buf)) => read,
            () = pending.shed() => {
                debug!(entry = ?entry, bytes = buf.len(), "first request head shed under memory pressure: closed");
                return First::Close;
            }
        };
        pending.read(buf.len());
        match read {
            Err(_) => {
                count(&inputs.stats.header_timeouts);
                debug!(entry = ?entry, "first request head not received in time: closed");
                return First::Close;
            }
            Ok(Ok(0)) if buf.is_empty() => return First::Close,
            // Half a head, then the end of the client's stream.
            Ok(Ok(0)) => return First::Answer(Reason::BadRequest),
            Ok(Err(_)) => return First::Close,
            Ok(Ok(_)) => {}
        }
    }
}

/// The part of a first head's buffer beyond one read's room, taken from the node's budget
/// (`max_pending_head_bytes`) and given back when the head is read or the connection closed.
struct HeadCharge<'a> {
    overload: &'a crate::proxy::overload::Overload,
    bytes: usize,
}

impl HeadCharge<'_> {
    /// Charge a buffer of `capacity`: `false` (nothing changed) when the budget has no room.
    fn to(&mut self, capacity: usize) -> bool {
        self.charge(capacity, false)
    }

    /// Charge the buffer's capacity as allocated: the budget was checked against a bound of
    /// it, so this is at most that, and taken whatever the budget holds.
    fn settle(&mut self, capacity: usize) {
        self.charge(capacity, true);
    }

    /// The charge made that of `capacity` (beyond one read's room); `force`: whatever the
    /// budget holds.
    fn charge(&mut self, capacity: usize, force: bool) -> bool {
        let want = capacity.saturating_sub(HEAD_READ_BYTES);
        if want > self.bytes {
            let more = want - self.bytes;
            if force {
                self.overload.force_charge_head(more);
            } else if !self.overload.charge_head(more) {
                return false;
            }
        } else {
            self.overload.release_head(self.bytes - want);
        }
        self.bytes = want;
        true
    }
}

impl Drop for HeadCharge<'_> {
    fn drop(&mut self) {
        self.overload.release_head(self.bytes);
    }
}

/// What the bytes of a first head say, once they say anything ([`judge`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judged {
    /// hyper serves the connection, speaking this.
    Http(Proto),
    /// The mesh answers this and closes.
    Answer(Reason),
}

/// Judge the bytes of a connection's first head, as read so far: `None` while more are needed.
/// A pure function of the bytes, the entry path and the limits (fuzzed: `tests/fuzz.rs`,
/// `http_head`).
pub fn judge(
    bytes: &[u8],
    entry: HttpEntry,
    settings: &crate::proxy::ProxySettings,
) -> Option<Judged> {
    let limit = settings.max_header_bytes;
    match sniff::sniff(bytes) {
        sniff::Verdict::Known(crate::resolve::decision::Sniffed::Http) => {}
        sniff::Verdict::Known(_) => {
            return Some(Judged::Answer(match entry {
                HttpEntry::Loopback => Reason::NotHttp,
                _ => Reason::BadRequest,
            }));
        }
        sniff::Verdict::NeedMore => {
            return (bytes.len() > limit).then_some(Judged::Answer(Reason::HeadersTooLarge));
        }
    }
    if bytes.starts_with(sniff::H2_PREFACE) {
        return Some(Judged::Http(Proto::Http2));
    }
    let mut headers = vec![httparse::EMPTY_HEADER; settings.max_headers];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(bytes) {
        Ok(httparse::Status::Complete(len)) if len > limit => {
            Some(Judged::Answer(Reason::HeadersTooLarge))
        }
        Ok(httparse::Status::Complete(_)) => Some(match framing_fault(&req) {
            Some(fault) => {
                debug!(fault, "first request head refused");
                Judged::Answer(Reason::BadRequest)
            }
            None => Judged::Http(Proto::Http1),
        }),
        Ok(httparse::Status::Partial) if bytes.len() > limit => {
            Some(Judged::Answer(Reason::HeadersTooLarge))
        }
        Ok(httparse::Status::Partial) => None,
        Err(httparse::Error::TooManyHeaders) => Some(Judged::Answer(Reason::HeadersTooLarge)),
        Err(_) => Some(Judged::Answer(Reason::BadRequest)),
    }
}

/// What is wrong with a complete HTTP/1 head that hyper would refuse, or serve on a framing that
/// the client may not have meant (RFC 9112 §6.3: a request with both `Content-Length` and
/// `Transfer-Encoding` is a smuggling attempt or a broken client); `None` when nothing is.
fn framing_fault(req: &httparse::Request<'_, '_>) -> Option<&'static str> {
    let field = |name: &'static str| {
        req.headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    if req.path.is_none_or(|p| http::Uri::try_from(p).is_err()) {
        return Some("request-target");
    }
    let mut lengths = field("content-length").peekable();
    let has_length = lengths.peek().is_some();
    let mut length = None;
    for value in lengths {
        let valid = !value.is_empty() && value.len() <= 19 && value.iter().all(u8::is_ascii_digit);
        if !valid || length.is_some_and(|l| l != value) {
            return Some("content-length");
        }
        length = Some(value);
    }
    let codings: Vec<&[u8]> = field("transfer-encoding")
        .flat_map(|v| v.split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty())
        .collect();
    if let Some(last) = codings.last() {
        if has_length {
            return Some("content-length with transfer-encoding");
        }
        if req.version == Some(0) {
            return Some("transfer-encoding in HTTP/1.0");
        }
        if !last.eq_ignore_ascii_case(b"chunked") {
            return Some("transfer-encoding not ending in chunked");
        }
    } else if field("transfer-encoding").next().is_some() {
        return Some("empty transfer-encoding");
    }
    None
}

/// The size of an HTTP/2 request's header list as RFC 9113 §6.5.2 counts it (each field's name
/// and value, plus 32), pseudo-header fields included.
fn header_list_size<B>(req: &Request<B>) -> usize {
    const FIELD: usize = 32;
    let uri = req.uri();
    let pseudo = [
        (":method", req.method().as_str().len()),
        (":scheme", uri.scheme_str().map_or(0, str::len)),
        (
            ":authority",
            uri.authority().map_or(0, |a| a.as_str().len()),
        ),
        (
            ":path",
            uri.path_and_query().map_or(0, |p| p.as_str().len()),
        ),
    ];
    let pseudo: usize = pseudo.iter().map(|(n, v)| n.len() + v + FIELD).sum();
    pseudo
        + req
            .headers()
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len() + FIELD)
            .sum::<usize>()
}

/// The facts of one request the resolver reads, borrowed from the request: its header map, its
/// method, path and authorities are read in place, never copied (issue #38).
struct Facts<'r> {
    version: HttpVersion,
    /// The absolute-form target's authority (HTTP/1.x, not `CONNECT`).
    absolute: Option<&'r http::uri::Authority>,
    /// HTTP/2's `:authority`.
    h2_authority: Option<&'r http::uri::Authority>,
    /// The first `Host` field, when there is one.
    first_host: Option<&'r HeaderValue>,
    method: &'r str,
    path: Option<&'r str>,
    headers: &'r HeaderMap,
}

impl<'r> Facts<'r> {
    fn of(req: &'r Request<Body>) -> Self {
        let version = match req.version() {
            Version::HTTP_2 => HttpVersion::H2,
            Version::HTTP_10 => HttpVersion::Http10,
            _ => HttpVersion::Http11,
        };
        let authority = req.uri().authority();
        let (absolute, h2_authority) = match version {
            HttpVersion::H2 => (None, authority),
            _ if req.method() == Method::CONNECT => (None, None),
            _ => (authority, None),
        };
        let path = (req.method() != Method::CONNECT).then(|| {
            req.uri()
                .path_and_query()
                .map_or("/", http::uri::PathAndQuery::as_str)
        });
        Self {
            version,
            absolute,
            h2_authority,
            first_host: req.headers().get(HOST),
            method: req.method().as_str(),
            path,
            headers: req.headers(),
        }
    }

    /// The authority as received (for redirects and the hop's URI), kept apart from the
    /// request so that the request can move on: a share of its bytes, not a copy.
    fn received(&self) -> Option<Received> {
        self.absolute
            .or(self.h2_authority)
            .map(|a| Received::Uri(a.clone()))
            .or_else(|| self.first_host.map(|h| Received::Host(h.clone())))
    }
}

/// The authority a request was received with ([`Facts::received`]).
enum Received {
    /// The request target's (absolute form) or HTTP/2's `:authority`.
    Uri(http::uri::Authority),
    /// The first `Host` field.
    Host(HeaderValue),
}

impl Received {
    /// As text; a `Host` byte that is not UTF-8 reads as U+FFFD, as the resolver read it.
    fn text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Self::Uri(a) => a.as_str().into(),
            Self::Host(h) => String::from_utf8_lossy(h.as_bytes()),
        }
    }
}

/// What [`answer_request`] decided about one request: for its metrics and its access line.
struct Outcome {
    /// `deliver`, `refuse`, `redirect`, `passthrough`.
    decision: &'static str,
    /// The destination service and port (a delivery's).
    service: Option<(ServiceKey, u16)>,
    /// The rule of the spec that decided.
    rule: &'static str,
    /// The route rule that decided (`HTTPRoute ns/name rule N`), built only for a logged
    /// request.
    route: Option<String>,
    /// The mesh hop that answered (a delivery's, when an endpoint did).
    hop: Option<Hopped>,
}

impl Outcome {
    fn answered(rule: &'static str) -> Self {
        Self {
            decision: "refuse",
            service: None,
            rule,
            route: None,
            hop: None,
        }
    }
}

/// One request on any entry path. A request that asks to switch protocols takes the
/// client's side of the switch with it, so that a `101` from upstream splices the two. A mesh
/// answer to a gRPC request also carries `grpc-status` and `grpc-message`
/// ([`respond::for_grpc`]). Counted in the metrics (direction `outbound`) once its response head
/// is known, and given an access line at the end of its response body when the log picks it.
/// `in_flight` is the request's ([`limits::track`]): it tells whether the client's body failed.
pub async fn handle(
    inputs: &Arc<Inputs>,
    pod: &Arc<PodCtx>,
    entry: HttpEntry,
    req: Request<Body>,
    in_flight: &limits::InFlight,
) -> Response<Body> {
    let started = crate::time::now();
    let logged = inputs.access.pick();
    let request_bytes = logged.then(|| Arc::new(AtomicU64::new(0)));
    let grpc = respond::is_grpc(req.headers());
    let limit = usize::try_from(inputs.settings.max_header_list_size).unwrap_or(usize::MAX);
    let (mut resp, outcome) = if req.version() == Version::HTTP_2 && header_list_size(&req) > limit
    {
        count(&inputs.stats.answers);
        count(&inputs.stats.headers_too_large);
        (
            respond::reason(Reason::HeadersTooLarge),
            Outcome::answered("addressing.md §11.1 headers-too-large"),
        )
    } else {
        let req = req.map(|body| access::count_request(body, request_bytes.as_ref()));
        let (resp, outcome) = answer_request(inputs, pod, entry, req, logged).await;
        // The client's own body broke the delivery: its fault, not the upstream's
        // (addressing.md §11.1 `bad-request`), when the answer has not started.
        let unreachable = resp
            .headers()
            .get(HEADER_ERROR)
            .is_some_and(|r| r == Reason::UpstreamUnreachable.code());
        if unreachable && in_flight.body_failed() {
            count(&inputs.stats.bad_requests);
            // The mesh's answer, not the hop's.
            let outcome = Outcome {
                hop: None,
                ..outcome
            };
            (respond::reason(Reason::BadRequest), outcome)
        } else {
            (resp, outcome)
        }
    };
    if grpc {
        respond::for_grpc(&mut resp);
    }
    let head = started.elapsed();
    let series = match &outcome.service {
        Some((key, port)) => inputs.metrics.series(key, *port, pod.source()),
        None => inputs.metrics.unknown(pod.source()),
    };
    let reason = resp
        .headers()
        .get(HEADER_ERROR)
        .and_then(|v| metrics::reason_of(v.as_bytes()));
    series.record_request(Direction::Outbound, resp.status().as_u16(), reason, head);
    if let Some(here) = respond::answered_here(&resp) {
        inputs.metrics.refused(here);
    }
    let hop = outcome.hop;
    if let Some(h) = &hop {
        series.record_hop(h.took);
    }
    let line = request_bytes.is_some().then(|| access::Line {
        source: access::Source::pod(pod, &inputs.settings.trust_domain),
        path: access::entry_path(entry),
        decision: outcome.decision,
        destination: access::Destination {
            service: outcome.service.as_ref().map(|(k, _)| k.clone()),
            port: outcome.service.as_ref().map(|(_, p)| *p),
            pod: hop.as_ref().map(Hopped::pod),
            route: outcome.route,
            rule: outcome.rule,
        },
    });
    if let Some(switched) = resp.extensions().get::<upgrade::Switched>() {
        let stream = line.clone().map(|l| {
            Box::new(access::Line {
                decision: "switched",
                ..l
            })
        });
        switched.account(access::TcpConn::with_line(
            series,
            Direction::Outbound,
            stream,
        ));
    }
    match request_bytes.zip(line) {
        Some((request_bytes, line)) => {
            let line = access::HttpLine {
                direction: Direction::Outbound,
                line,
                http: access::HttpFacts {
                    status: resp.status().as_u16(),
                    reason: reason.map(Reason::code),
                    head,
                    hop: hop.map(|h| h.took),
                },
                started,
                request_bytes,
            };
            resp.map(|b| access::Logged::new(b, Box::new(line)).boxed())
        }
        None => resp,
    }
}

async fn answer_request(
    inputs: &Arc<Inputs>,
    pod: &Arc<PodCtx>,
    entry: HttpEntry,
    mut req: Request<Body>,
    logged: bool,
) -> (Response<Body>, Outcome) {
    // Before anything reads the request or adds to it: its hop-by-hop fields, `x-aether-`
    // headers (I12) and copies of the mesh's own headers go; a protocol switch the mesh carries
    // (I11) is set again on the mesh's terms.
    let switch = strip_client_request(req.headers_mut());
    let switches = upgrade::carry(&mut req, switch.upgrade.as_ref(), switch.connection_upgrade);
    let client_upgrade = switches.then(|| hyper::upgrade::on(&mut req));
    let facts = Facts::of(&req);
    let caller = pod.caller();
    // Every `Host` field as text. The common case, one field of UTF-8, borrows it; otherwise
    // each is read lossily, a byte that is not UTF-8 as U+FFFD (issue #38 keeps that reading).
    let only = {
        let mut fields = facts.headers.get_all(HOST).iter();
        match (fields.next(), fields.next()) {
            (Some(h), None) => std::str::from_utf8(h.as_bytes()).ok().map(|t| [t]),
            _ => None,
        }
    };
    let lossy: Vec<String> = match only {
        Some(_) => Vec::new(),
        None => facts
            .headers
            .get_all(HOST)
            .iter()
            .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
            .collect(),
    };
    let lossy_refs: Vec<&str> = lossy.iter().map(String::as_str).collect();
    let hosts: &[&str] = match &only {
        Some(one) => one,
        None => &lossy_refs,
    };
    let mut hold_expired = false;
    let started = crate::time::now();
    loop {
        let generation = inputs.model.generation();
        let model = inputs.model.load();
        let request = RequestFacts {
            entry,
            authority: AuthorityInput {
                version: facts.version,
                absolute: facts.absolute.map(http::uri::Authority::as_str),
                h2_authority: facts.h2_authority.map(http::uri::Authority::as_str),
                hosts,
            },
            method: facts.method,
            path_and_query: facts.path,
            headers: facts.headers,
            hold_expired,
            entropy: fastrand::u64(..),
            // The data plane reads only `Why::rule` (the access line, debug events).
            explain: false,
        };
        let decision = resolve_request(&model, caller, &request);
        return match decision {
            RequestDecision::Hold(_, _) => {
                let left = inputs.settings.hold.saturating_sub(started.elapsed());
                if left.is_zero() || !inputs.model.newer_than(generation, left).await {
                    hold_expired = true;
                }
                continue;
            }
            RequestDecision::Answer(answer, why) => {
                count(&inputs.stats.answers);
                debug!(host = ?facts.received().as_ref().map(Received::text), reason = answer.reason.code(), rule = why.rule,
                    "request answered by the mesh");
                (respond::answer(&answer), Outcome::answered(why.rule))
            }
            RequestDecision::Redirect {
                status,
                location,
                why,
            } => (
                respond::redirect(status, &location),
                Outcome {
                    decision: "redirect",
                    service: None,
                    rule: why.rule,
                    route: None,
                    hop: None,
                },
            ),
            RequestDecision::Passthrough(why) => {
                let dialled = match entry {
                    HttpEntry::Captured { dialled }
                    | HttpEntry::PodIp { dialled }
                    | HttpEntry::ProxyCaptured { dialled } => dialled,
                    HttpEntry::Loopback => {
                        return (
                            respond::reason(Reason::NotAMeshName),
                            Outcome::answered(why.rule),
                        );
                    }
                };
                inputs.metrics.passthrough(metrics::PassProtocol::Http);
                let resp = passthrough(inputs, pod, dialled, req, client_upgrade).await;
                (
                    resp,
                    Outcome {
                        decision: "passthrough",
                        service: None,
                        rule: why.rule,
                        route: None,
                        hop: None,
                    },
                )
            }
            RequestDecision::Deliver(d) => {
                let mut outcome = Outcome {
                    decision: "deliver",
                    service: Some((
                        d.backend.service.clone(),
                        d.backend.port.unwrap_or(d.backend.pod_port),
                    )),
                    rule: d.why.rule,
                    route: logged
                        .then(|| {
                            d.rule.as_ref().map(|r| {
                                format!("{} {}/{} rule {}", r.kind, r.namespace, r.route, r.index)
                            })
                        })
                        .flatten(),
                    hop: None,
                };
                let received = facts.received();
                let authority = received.as_ref().map(Received::text);
                let (resp, hop) =
                    deliver(inputs, pod, authority.as_deref(), *d, req, client_upgrade).await;
                outcome.hop = hop;
                (resp, outcome)
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(head: &str) -> Option<&'static str> {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut req = httparse::Request::new(&mut headers);
        assert!(matches!(
            req.parse(head.as_bytes()),
            Ok(httparse::Status::Complete(_))
        ));
        framing_fault(&req)
    }

    #[test]
    fn conflicting_or_invalid_framing_is_a_fault_and_plain_framing_is_not() {
        let ok = [
            "GET / HTTP/1.1\r\nhost: a\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: gzip, Chunked\r\n\r\n",
            "OPTIONS * HTTP/1.1\r\nhost: a\r\n\r\n",
            "CONNECT a:443 HTTP/1.1\r\nhost: a:443\r\n\r\n",
        ];
        for head in ok {
            assert_eq!(fault(head), None, "{head:?}");
        }
        let bad = [
            "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5, 5\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ncontent-length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
            "POST / HTTP/1.0\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: \r\n\r\n",
        ];
        for head in bad {
            assert!(fault(head).is_some(), "{head:?}");
        }
    }
}
