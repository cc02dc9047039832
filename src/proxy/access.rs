//! The access log (issue #10 §2): one line per HTTP request, at the end of its response body,
//! and one per relayed byte stream, at its close, on the `aether::access` target (INFO), in the
//! daemon's log format (`log_format`: text or JSON). docs/observability.md lists the fields.
//!
//! Off, on, or one request or connection in N ([`Mode`]), set at start (the node setting
//! `access_log`) and at run time (`PUT /access-log` on the admin socket). The mode is one atomic
//! read per request; a request that is not logged builds nothing and formats nothing, and one
//! that is logged carries its line in a box that is formatted once, when it is written.
//!
//! Layer 1: no sockets. [`TcpConn`] is also the accounting guard of a relayed byte stream: it
//! counts the stream in the metrics when it is opened and when it is dropped, logged or not.

use std::fmt;
use std::num::NonZeroU64;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use super::metrics::{Direction, Series};
use crate::resolve::decision::{HttpEntry, ServiceKey};

/// How many requests and connections get a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// None.
    Off,
    /// Every one.
    On,
    /// One in N (the first, then every Nth).
    Sample(NonZeroU64),
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "off" => Ok(Self::Off),
            "on" => Ok(Self::On),
            other => other
                .strip_prefix("sample=")
                .and_then(|n| n.parse::<NonZeroU64>().ok())
                .map(|n| {
                    if n.get() == 1 {
                        Self::On
                    } else {
                        Self::Sample(n)
                    }
                })
                .ok_or_else(|| {
                    format!("access log mode {other:?} is not off, on or sample=N (N ≥ 1)")
                }),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::On => f.write_str("on"),
            Self::Sample(n) => write!(f, "sample={n}"),
        }
    }
}

/// The access log's switch; one per daemon, in [`super::Inputs`].
#[derive(Debug, Default)]
pub struct AccessLog {
    /// 0: off; 1: on; N: one in N.
    every: AtomicU64,
    seen: AtomicU64,
}

impl AccessLog {
    /// A switch set to `mode`.
    pub fn new(mode: Mode) -> Self {
        let log = Self::default();
        log.set(mode);
        log
    }

    /// Change the mode (takes effect for the next request or connection).
    pub fn set(&self, mode: Mode) {
        let every = match mode {
            Mode::Off => 0,
            Mode::On => 1,
            Mode::Sample(n) => n.get(),
        };
        self.every.store(every, Ordering::Relaxed);
    }

    /// The mode now.
    pub fn mode(&self) -> Mode {
        match self.every.load(Ordering::Relaxed) {
            0 => Mode::Off,
            1 => Mode::On,
            n => NonZeroU64::new(n).map_or(Mode::Off, Mode::Sample),
        }
    }

    /// Whether the request or connection starting now gets a line.
    pub fn pick(&self) -> bool {
        match self.every.load(Ordering::Relaxed) {
            0 => false,
            1 => true,
            n => self.seen.fetch_add(1, Ordering::Relaxed).is_multiple_of(n),
        }
    }
}

/// The path an HTTP request took into this daemon (the `path` field).
pub fn entry_path(entry: HttpEntry) -> &'static str {
    match entry {
        HttpEntry::Captured { .. } => "captured",
        HttpEntry::PodIp { .. } => "pod-ip",
        HttpEntry::Loopback => "proxy-port",
        HttpEntry::ProxyCaptured { .. } => "proxy-port-captured",
    }
}

/// `-` for what is not known, in a line.
struct Opt<T>(Option<T>);

impl<T: fmt::Display> fmt::Display for Opt<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("-"),
        }
    }
}

/// Who sent a request or opened a connection.
#[derive(Debug, Clone)]
pub enum Source {
    /// A local client pod (outbound): namespace, name, ServiceAccount.
    Pod {
        /// `namespace/name`.
        pod: String,
        /// Its SPIFFE ID.
        identity: String,
    },
    /// A peer over the mesh hop (inbound): the identity it proved and its address.
    Peer {
        /// The SPIFFE ID.
        identity: String,
        /// Its pod IP.
        addr: std::net::IpAddr,
    },
}

impl Source {
    /// A local pod as the source.
    pub fn pod(pod: &super::PodCtx, trust_domain: &str) -> Self {
        Self::Pod {
            pod: format!("{}/{}", pod.namespace, pod.name),
            identity: format!(
                "spiffe://{trust_domain}/ns/{}/sa/{}",
                pod.namespace, pod.service_account
            ),
        }
    }

    fn fields(&self) -> (String, &str) {
        match self {
            Self::Pod { pod, identity } => (pod.clone(), identity),
            Self::Peer { identity, addr } => (addr.to_string(), identity),
        }
    }
}

/// Where a request or connection went, as far as it is known.
#[derive(Debug, Clone, Default)]
pub struct Destination {
    /// The destination service.
    pub service: Option<ServiceKey>,
    /// Its port.
    pub port: Option<u16>,
    /// The destination pod (name when the model knows it, else its IP).
    pub pod: Option<String>,
    /// The route and rule that decided (`HTTPRoute ns/name rule N`), when one did.
    pub route: Option<String>,
    /// The rule of the spec that decided (addressing.md §…).
    pub rule: &'static str,
}

/// What every line says: who, how it came in, what was decided, where it went.
#[derive(Debug, Clone)]
pub struct Line {
    /// Who sent the request or opened the stream.
    pub source: Source,
    /// The path it took in: `captured`, `pod-ip`, `proxy-port`, `proxy-port-captured`,
    /// `legacy-18082`, `hop-inbound`.
    pub path: &'static str,
    /// `deliver`, `refuse`, `redirect`, `passthrough`, `deny`, `l4-hop`, and `switched` for
    /// the byte stream a request became on `101 Switching Protocols`.
    pub decision: &'static str,
    /// Where it went.
    pub destination: Destination,
}

/// What only an HTTP request's line says.
#[derive(Debug, Clone, Copy)]
pub struct HttpFacts {
    /// The response status.
    pub status: u16,
    /// The mesh reason, when the response carries one.
    pub reason: Option<&'static str>,
    /// From the head to the response head.
    pub head: Duration,
    /// The mesh hop alone (outbound deliveries).
    pub hop: Option<Duration>,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Write one line: the bytes each way, the duration, and for HTTP its own facts.
fn write(
    direction: Direction,
    line: &Line,
    (sent, recv): (u64, u64),
    took: Duration,
    http: Option<HttpFacts>,
) {
    let (src, identity) = line.source.fields();
    let d = &line.destination;
    tracing::info!(
        target: "aether::access",
        protocol = if http.is_some() { "http" } else { "tcp" },
        direction = direction.as_str(),
        src = %src,
        src.identity = %identity,
        path = line.path,
        dst.service = %Opt(d.service.as_ref()),
        dst.port = %Opt(d.port),
        dst.pod = %Opt(d.pod.as_deref()),
        route = %Opt(d.route.as_deref()),
        rule = d.rule,
        decision = line.decision,
        status = http.map(|h| h.status),
        reason = http.map(|h| h.reason.unwrap_or("-")),
        bytes.sent = sent,
        bytes.recv = recv,
        duration_us = micros(took),
        head_us = http.map(|h| micros(h.head)),
        hop_us = http.and_then(|h| h.hop).map(micros),
        "access"
    );
}

/// The line of a first request head the mesh answered itself before parsing it as a request
/// (`400 bad-request`, `431 headers-too-large`, addressing.md §11.1): nothing was read of a
/// body, `answered` bytes went back.
pub fn answered_at_head(
    line: &Line,
    status: u16,
    reason: &'static str,
    answered: u64,
    took: Duration,
) {
    write(
        Direction::Outbound,
        line,
        (0, answered),
        took,
        Some(HttpFacts {
            status,
            reason: Some(reason),
            head: took,
            hop: None,
        }),
    );
}

/// One HTTP request's line, built only when the request is logged.
#[derive(Debug)]
pub struct HttpLine {
    /// Outbound or inbound.
    pub direction: Direction,
    /// Who, how, what, where.
    pub line: Line,
    /// Status, reason and times.
    pub http: HttpFacts,
    /// When the request head arrived.
    pub started: Instant,
    /// Request body bytes read so far (shared with the request body's [`Counted`]).
    pub request_bytes: Arc<AtomicU64>,
}

/// A response body that counts its bytes and writes its request's line when it is dropped
/// (its end, or the client going away).
#[derive(Debug)]
pub struct Logged<B> {
    inner: Counted<B>,
    line: Box<HttpLine>,
}

impl<B> Logged<B> {
    /// Wrap a response body.
    pub fn new(inner: B, line: Box<HttpLine>) -> Self {
        Self {
            inner: Counted::new(inner, Arc::default()),
            line,
        }
    }
}

impl<B> Drop for Logged<B> {
    fn drop(&mut self) {
        let l = &self.line;
        let bytes = (
            l.request_bytes.load(Ordering::Relaxed),
            self.inner.bytes.load(Ordering::Relaxed),
        );
        write(
            l.direction,
            &l.line,
            bytes,
            l.started.elapsed(),
            Some(l.http),
        );
    }
}

impl<B: HttpBody<Data = Bytes> + Unpin> HttpBody for Logged<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body, counted into `bytes` when its request is logged, else passed on as it is
/// (no second box on the path that logs nothing).
pub fn count_request(body: super::Body, bytes: Option<&Arc<AtomicU64>>) -> super::Body {
    use http_body_util::BodyExt as _;
    match bytes {
        Some(n) => Counted::new(body, n.clone()).boxed(),
        None => body,
    }
}

/// A body that counts its data bytes into a shared counter (a logged request's).
pub struct Counted<B> {
    inner: B,
    bytes: Arc<AtomicU64>,
}

impl<B> fmt::Debug for Counted<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counted").finish_non_exhaustive()
    }
}

impl<B> Counted<B> {
    /// Wrap a body.
    pub fn new(inner: B, bytes: Arc<AtomicU64>) -> Self {
        Self { inner, bytes }
    }
}

impl<B: HttpBody<Data = Bytes> + Unpin> HttpBody for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            self.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The accounting guard of one relayed byte stream (raw TCP, an L4 hop, a passthrough): counts
/// it opened at [`TcpConn::open`], and closed (bytes, duration) when dropped, and writes its
/// access line then if it was picked.
#[derive(Debug)]
pub struct TcpConn {
    series: Arc<Series>,
    direction: Direction,
    started: Instant,
    /// Bytes from the client toward the destination.
    pub sent: u64,
    /// Bytes from the destination back to the client.
    pub received: u64,
    line: Option<Box<Line>>,
}

impl TcpConn {
    /// Count a stream opened toward `series`; `line` is built only if the access log picks it.
    pub fn open(
        inputs: &super::Inputs,
        series: Arc<Series>,
        direction: Direction,
        line: impl FnOnce() -> Line,
    ) -> Self {
        Self::with_line(
            series,
            direction,
            inputs.access.pick().then(|| Box::new(line())),
        )
    }

    /// Count a stream opened toward `series`, logged at its end when `line` is given (the
    /// byte stream of a switched request, logged when the request was).
    pub fn with_line(series: Arc<Series>, direction: Direction, line: Option<Box<Line>>) -> Self {
        series.tcp_opened(direction);
        Self {
            series,
            direction,
            started: crate::time::now(),
            sent: 0,
            received: 0,
            line,
        }
    }
}

impl Drop for TcpConn {
    fn drop(&mut self) {
        let took = self.started.elapsed();
        self.series
            .tcp_closed(self.direction, self.sent, self.received, took);
        if let Some(line) = &self.line {
            write(self.direction, line, (self.sent, self.received), took, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// What a `tracing` subscriber on this thread writes while `f` runs, as text.
    fn captured(f: impl FnOnce()) -> String {
        let buf = Arc::new(parking_lot::Mutex::new(Vec::<u8>::new()));
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8_lossy(&buf.lock()).into_owned()
    }

    struct Sink(Arc<parking_lot::Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_logged_response_writes_one_line_with_its_bytes_once_its_body_is_dropped() {
        let mut read_before_drop = String::new();
        let text = captured(|| {
            let line = HttpLine {
                direction: Direction::Outbound,
                line: Line {
                    source: Source::Pod {
                        pod: "mp/mp-client".into(),
                        identity: "spiffe://cluster.local/ns/mp/sa/mp-client".into(),
                    },
                    path: "captured",
                    decision: "deliver",
                    destination: Destination {
                        service: Some(ServiceKey {
                            namespace: "mp".into(),
                            name: "mp-multi".into(),
                        }),
                        port: Some(8080),
                        pod: Some("mp-multi-1".into()),
                        route: None,
                        rule: "addressing.md §5 C2",
                    },
                },
                http: HttpFacts {
                    status: 200,
                    reason: None,
                    head: Duration::from_micros(300),
                    hop: Some(Duration::from_micros(200)),
                },
                started: crate::time::now(),
                request_bytes: Arc::new(AtomicU64::new(3)),
            };
            let mut logged = Logged::new(super::super::respond::full("hello"), Box::new(line));
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(async { while logged.frame().await.is_some() {} });
            read_before_drop = format!("{}", logged.inner.bytes.load(Ordering::Relaxed));
            drop(logged);
        });
        assert_eq!(read_before_drop, "5");
        assert_eq!(text.lines().count(), 1, "{text}");
        for field in [
            "aether::access",
            "protocol=\"http\"",
            "direction=\"outbound\"",
            "src=mp/mp-client",
            "dst.service=mp/mp-multi",
            "dst.port=8080",
            "dst.pod=mp-multi-1",
            "route=-",
            "status=200",
            "reason=\"-\"",
            "bytes.sent=3",
            "bytes.recv=5",
            "head_us=300",
            "hop_us=200",
        ] {
            assert!(text.contains(field), "{field} missing: {text}");
        }
    }

    #[test]
    fn a_head_the_mesh_answered_before_parsing_gets_its_line_with_status_and_reason() {
        let text = captured(|| {
            let line = Line {
                source: Source::Pod {
                    pod: "mp/mp-client".into(),
                    identity: "spiffe://cluster.local/ns/mp/sa/mp-client".into(),
                },
                path: "captured",
                decision: "refuse",
                destination: Destination {
                    rule: "addressing.md §11.1",
                    ..Destination::default()
                },
            };
            answered_at_head(
                &line,
                431,
                "headers-too-large",
                120,
                Duration::from_micros(40),
            );
        });
        assert_eq!(text.lines().count(), 1, "{text}");
        for field in [
            "protocol=\"http\"",
            "src=mp/mp-client",
            "dst.service=-",
            "decision=\"refuse\"",
            "status=431",
            "reason=\"headers-too-large\"",
            "bytes.sent=0",
            "bytes.recv=120",
            "head_us=40",
        ] {
            assert!(text.contains(field), "{field} missing: {text}");
        }
    }

    #[test]
    fn modes_parse_print_and_sample_one_in_n() {
        for text in ["off", "on", "sample=10"] {
            let mode: Mode = text.parse().unwrap();
            assert_eq!(mode.to_string(), text);
        }
        assert_eq!("sample=1".parse::<Mode>().unwrap(), Mode::On);
        for bad in ["", "sample=0", "sample=x", "yes"] {
            let err = bad.parse::<Mode>().unwrap_err();
            assert!(err.contains("off, on or sample=N"), "{bad}: {err}");
        }
        let log = AccessLog::new("sample=4".parse().unwrap());
        let picked = (0..100).filter(|_| log.pick()).count();
        assert_eq!(picked, 25);
        log.set(Mode::Off);
        assert!((0..10).all(|_| !log.pick()));
        assert_eq!(log.mode(), Mode::Off);
        log.set(Mode::On);
        assert!((0..10).all(|_| log.pick()));
    }
}
