//! Many requests at once (issue #7 §3): `count` requests, at most `concurrency` in flight,
//! on kept connections or one connection each, folded into a [`Summary`].
//!
//! With keep-alive:
//!
//! - **HTTP/1.1**: each worker keeps its own connection and sends its next request on it once
//!   the previous answer is read to its end (Content-Length or chunked framing, no
//!   `Connection: close`). A request that finds its kept connection closed before any byte of
//!   the answer is sent again once on a new connection, as clients do.
//! - **h2c and gRPC**: every worker shares one HTTP/2 connection, its requests multiplexed as
//!   streams. A connection found closed is replaced for the next request.
//! - HTTP/1.0, raw bytes, ClientHellos and UDP have no kept form: one connection (or socket)
//!   each, as without keep-alive.
//!
//! Every request is bounded by the probe's timeout (connect included when it makes one), so
//! a kept connection that stops answering costs each request at most that.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http2::SendRequest;
use serde::Serialize;
use tokio::net::TcpStream;
use tokio::sync::{Mutex, mpsc};
use tonic::body::Body as TonicBody;

use super::h2c::{self, Driver, handshake};
use super::{Connector, HttpVersion, Outcome, Probe, ProbeError, Resolver, Send};
use aether::time;

/// How [`Probe::run_many`] sends its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Many {
    /// How many requests in all.
    pub count: usize,
    /// At most this many in flight (at least 1).
    pub concurrency: usize,
    /// Keep connections for later requests (module docs), instead of one each.
    pub keep_alive: bool,
}

impl Many {
    /// `count` requests one after another, one connection each.
    pub fn new(count: usize) -> Self {
        Self {
            count,
            concurrency: 1,
            keep_alive: false,
        }
    }
}

/// What many requests observed, counted. Serializes to JSON (maps keyed by text).
///
/// Read it as: of `requests`, `answered` got an answer (an HTTP status, a UDP reply, or raw
/// bytes) and `failed` did not (`by_error` says why). `by_ident` and `by_pod` count answers by
/// the echo that gave them; a mesh refusal names no echo and is counted in `by_reason`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Requests made.
    pub requests: usize,
    /// Requests answered.
    pub answered: usize,
    /// Requests without an answer.
    pub failed: usize,
    /// TCP connections opened (the kept ones once).
    pub connections: usize,
    /// Answers by the echo's identity string `<workload>:<port>` ([`Outcome::ident`]).
    pub by_ident: BTreeMap<String, usize>,
    /// Answers by the echo's pod ([`Outcome::pod`]).
    pub by_pod: BTreeMap<String, usize>,
    /// Answers by HTTP status.
    pub by_status: BTreeMap<u16, usize>,
    /// gRPC answers by status name (`OK`, `NOT_FOUND`, ...).
    pub by_grpc_status: BTreeMap<String, usize>,
    /// Answers by the mesh's reason, `x-aether-error`.
    pub by_reason: BTreeMap<String, usize>,
    /// Requests without an answer, by why ([`Outcome::failure`]).
    pub by_error: BTreeMap<String, usize>,
}

impl Summary {
    /// Count one outcome.
    pub fn add(&mut self, o: &Outcome) {
        fn bump<K: Ord>(m: &mut BTreeMap<K, usize>, k: K) {
            *m.entry(k).or_default() += 1;
        }
        self.requests += 1;
        if let Some(s) = o.status {
            bump(&mut self.by_status, s);
        }
        if let Some(g) = &o.grpc {
            bump(&mut self.by_grpc_status, g.code_name.clone());
        }
        if let Some(r) = o.reason() {
            bump(&mut self.by_reason, r.to_owned());
        }
        if let Some(i) = o.ident() {
            bump(&mut self.by_ident, i);
        }
        if let Some(p) = o.pod() {
            bump(&mut self.by_pod, p);
        }
        match o.failure() {
            None => self.answered += 1,
            Some(why) => {
                self.failed += 1;
                bump(&mut self.by_error, why);
            }
        }
    }

    /// A few lines for a person.
    pub fn render(&self) -> String {
        fn line<K: std::fmt::Display>(out: &mut String, what: &str, m: &BTreeMap<K, usize>) {
            if m.is_empty() {
                return;
            }
            let items: Vec<String> = m.iter().map(|(k, n)| format!("{k}={n}")).collect();
            out.push_str(&format!("{what}: {}\n", items.join(" ")));
        }
        let mut out = format!(
            "requests={} answered={} failed={} connections={}\n",
            self.requests, self.answered, self.failed, self.connections
        );
        line(&mut out, "by ident", &self.by_ident);
        line(&mut out, "by pod", &self.by_pod);
        line(&mut out, "by status", &self.by_status);
        line(&mut out, "by grpc status", &self.by_grpc_status);
        line(&mut out, "by reason", &self.by_reason);
        line(&mut out, "errors", &self.by_error);
        out
    }
}

// === Running ===

/// A kept HTTP/2 connection.
struct Kept<B> {
    sender: SendRequest<B>,
    local: Option<SocketAddr>,
    _driver: Driver,
}

/// The one HTTP/2 connection the workers share, opened by the first request that needs it.
struct H2Pool<B> {
    slot: Mutex<Option<Kept<B>>>,
}

/// What the workers share.
struct Shared {
    next: AtomicUsize,
    connections: AtomicUsize,
    h2c: H2Pool<Full<Bytes>>,
    grpc: H2Pool<TonicBody>,
}

impl Shared {
    /// The index of the next request to make, if any is left.
    fn take(&self, count: usize) -> Option<usize> {
        let i = self.next.fetch_add(1, Ordering::SeqCst);
        (i < count).then_some(i)
    }
}

/// How a worker makes its requests.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A new connection (or socket) each.
    Each,
    /// HTTP/1.1 on the worker's kept connection.
    Http1,
    /// h2c streams on the shared connection.
    H2c,
    /// gRPC calls on the shared connection.
    Grpc,
}

impl<B> H2Pool<B>
where
    B: http_body::Body + Unpin + std::marker::Send + 'static,
    B::Data: std::marker::Send,
    B::Error: Into<Box<dyn std::error::Error + std::marker::Send + Sync>>,
{
    fn new() -> Self {
        Self {
            slot: Mutex::new(None),
        }
    }

    /// The shared connection's sender, opened (and counted) if there is none or it closed.
    /// `None` when opening failed; `out` then says why.
    async fn sender(
        &self,
        probe: &Probe,
        connector: &Connector,
        shared_count: &AtomicUsize,
        start: Instant,
        out: &mut Outcome,
    ) -> Result<Option<SendRequest<B>>, ProbeError> {
        let mut slot = self.slot.lock().await;
        if let Some(k) = slot.as_ref().filter(|k| !k.sender.is_closed()) {
            out.connected = true;
            out.reused = true;
            out.local_addr = k.local;
            return Ok(Some(k.sender.clone()));
        }
        *slot = None;
        let Some(addr) = out.addr else {
            return Ok(None);
        };
        let Some(stream) = probe.connect(connector, addr, start, out).await? else {
            return Ok(None);
        };
        shared_count.fetch_add(1, Ordering::SeqCst);
        let left = (start + probe.timeout).saturating_duration_since(time::now());
        match tokio::time::timeout(left, handshake::<B>(stream)).await {
            Err(_) => {
                out.timed_out = true;
                Ok(None)
            }
            Ok(Err(e)) => {
                out.error = Some(format!("h2c: {e}"));
                Ok(None)
            }
            Ok(Ok((sender, driver))) => {
                *slot = Some(Kept {
                    sender: sender.clone(),
                    local: out.local_addr,
                    _driver: driver,
                });
                Ok(Some(sender))
            }
        }
    }
}

impl Probe {
    /// Make `many.count` requests of this probe's kind, at most `many.concurrency` at once,
    /// and count what came back. The dial is resolved once. `Err` only for what breaks before
    /// a request can be tried (a name that does not resolve, a socket that cannot be made);
    /// every request's own failure is counted in the [`Summary`].
    pub async fn run_many(
        &self,
        connector: &Connector,
        resolver: &Resolver,
        many: Many,
    ) -> Result<Summary, ProbeError> {
        self.run_many_each(connector, resolver, many, |_, _| {})
            .await
    }

    /// [`run_many`](Self::run_many), calling `each` with every request's index and outcome as
    /// it completes (in completion order).
    pub async fn run_many_each<F>(
        &self,
        connector: &Connector,
        resolver: &Resolver,
        many: Many,
        mut each: F,
    ) -> Result<Summary, ProbeError>
    where
        F: FnMut(usize, &Outcome) + std::marker::Send,
    {
        let addr = self.resolve(connector, resolver).await?;
        let mode = match &self.send {
            _ if !many.keep_alive => Mode::Each,
            Send::Http(r) if r.version == HttpVersion::Http11 => Mode::Http1,
            Send::Http(r) if r.version == HttpVersion::H2c => Mode::H2c,
            Send::Grpc(_) => Mode::Grpc,
            Send::Http(_) | Send::Raw(_) | Send::Nothing | Send::TlsClientHello { .. } => {
                Mode::Each
            }
            Send::Udp(_) => Mode::Each,
        };
        let shared = Shared {
            next: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            h2c: H2Pool::new(),
            grpc: H2Pool::new(),
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let workers = many.concurrency.clamp(1, many.count.max(1));
        let workers = futures_util::future::join_all(
            (0..workers)
                .map(|_| self.worker(connector, addr, many.count, mode, &shared, tx.clone())),
        );
        drop(tx);
        let collect = async {
            let mut summary = Summary::default();
            while let Some((i, o)) = rx.recv().await {
                each(i, &o);
                summary.add(&o);
            }
            summary
        };
        let (results, mut summary) = tokio::join!(workers, collect);
        results.into_iter().collect::<Result<Vec<()>, _>>()?;
        summary.connections = shared.connections.load(Ordering::SeqCst);
        Ok(summary)
    }

    async fn worker(
        &self,
        connector: &Connector,
        addr: SocketAddr,
        count: usize,
        mode: Mode,
        shared: &Shared,
        tx: mpsc::UnboundedSender<(usize, Outcome)>,
    ) -> Result<(), ProbeError> {
        let mut kept: Option<TcpStream> = None;
        while let Some(i) = shared.take(count) {
            let out = match mode {
                Mode::Each => {
                    let o = self.run_at(connector, addr).await?;
                    if o.connected {
                        shared.connections.fetch_add(1, Ordering::SeqCst);
                    }
                    o
                }
                Mode::Http1 => {
                    self.http1_kept(connector, addr, &mut kept, &shared.connections)
                        .await?
                }
                Mode::H2c | Mode::Grpc => self.h2_shared(connector, addr, mode, shared).await?,
            };
            // The receiver lives until every worker is done.
            let _ = tx.send((i, out));
        }
        Ok(())
    }

    /// One HTTP/1.1 request on the worker's kept connection, or on a new one.
    async fn http1_kept(
        &self,
        connector: &Connector,
        addr: SocketAddr,
        kept: &mut Option<TcpStream>,
        connections: &AtomicUsize,
    ) -> Result<Outcome, ProbeError> {
        loop {
            let start = time::now();
            let deadline = start + self.timeout;
            let mut out = Outcome {
                addr: Some(addr),
                ..Outcome::default()
            };
            let mut stream = match kept.take() {
                Some(s) => {
                    out.connected = true;
                    out.reused = true;
                    out.local_addr = s.local_addr().ok();
                    s
                }
                None => match self.connect(connector, addr, start, &mut out).await? {
                    Some(s) => {
                        connections.fetch_add(1, Ordering::SeqCst);
                        s
                    }
                    None => {
                        out.timings.total = Some(time::now().saturating_duration_since(start));
                        return Ok(out);
                    }
                },
            };
            let clean = self.exchange(&mut stream, deadline, &mut out).await?;
            // A kept connection the server had closed: nothing of an answer came. Once more
            // on a new connection (the loop's next turn finds `kept` empty).
            let stale = out.reused
                && out.status.is_none()
                && out.body.is_empty()
                && !out.timed_out
                && (out.peer_closed || out.reset || out.error.is_some());
            if stale {
                continue;
            }
            if clean && reusable(&out) {
                *kept = Some(stream);
            }
            out.timings.total = Some(time::now().saturating_duration_since(start));
            return Ok(out);
        }
    }

    /// One h2c request or gRPC call on the shared HTTP/2 connection.
    async fn h2_shared(
        &self,
        connector: &Connector,
        addr: SocketAddr,
        mode: Mode,
        shared: &Shared,
    ) -> Result<Outcome, ProbeError> {
        let start = time::now();
        let deadline = start + self.timeout;
        let mut out = Outcome {
            addr: Some(addr),
            ..Outcome::default()
        };
        let count = &shared.connections;
        match &self.send {
            Send::Grpc(g) if mode == Mode::Grpc => {
                let sender = shared.grpc.sender(self, connector, count, start, &mut out);
                if let Some(sender) = sender.await? {
                    self.grpc_call(g, sender, deadline, &mut out).await?;
                }
            }
            Send::Http(req) => {
                let request = self.h2c_request(req)?;
                let sender = shared.h2c.sender(self, connector, count, start, &mut out);
                if let Some(mut sender) = sender.await? {
                    let left = deadline.saturating_duration_since(time::now());
                    let sent = h2c::send(&mut sender, request, self.body_limit);
                    h2c::record(tokio::time::timeout(left, sent).await, &mut out);
                }
            }
            _ => return self.run_at(connector, addr).await,
        }
        out.timings.total = Some(time::now().saturating_duration_since(start));
        Ok(out)
    }
}

/// Whether an HTTP/1.1 answer leaves its connection fit for another request.
fn reusable(out: &Outcome) -> bool {
    let close = out
        .header_all("connection")
        .iter()
        .any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")));
    out.status.is_some_and(|s| s != 101)
        && out.version.as_deref() == Some("HTTP/1.1")
        && !close
        && !out.peer_closed
        && !out.reset
        && !out.timed_out
        && !out.truncated
        && out.error.is_none()
}
