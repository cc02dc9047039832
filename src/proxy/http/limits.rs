//! The deadlines of every HTTP connection the daemon serves (the capture and loopback
//! [`serve`](super::serve()), and the inbound mesh hop): a request head must arrive whole within
//! [`header_read_timeout`](crate::proxy::ProxySettings::header_read_timeout) of its first byte,
//! and a connection with no request in flight is closed after
//! [`http_idle_timeout`](crate::proxy::ProxySettings::http_idle_timeout).
//!
//! hyper has no idle deadline, and its HTTP/1 header timer also runs while a kept connection
//! waits for its next request, so it would close every idle keep-alive connection at the head
//! deadline; it is switched off and this module keeps both deadlines instead:
//!
//! - [`Watched`] wraps the connection's byte stream. On HTTP/1, bytes read while no request is
//!   in flight begin a head (the first head's clock starts at the accept).
//! - [`Watch::begin`] is called when hyper hands a request over (its head is complete); the
//!   returned [`InFlight`] lives in the request's and the response's bodies ([`track`],
//!   [`tracked`]), so a request is in flight until both are done or dropped. HTTP/2 streams
//!   count the same way.
//! - [`serve`] runs a connection until it ends, the daemon drains, or a deadline passes: a late
//!   head closes the connection at once (counted in `aether_http_header_timeouts`); an idle
//!   connection is shut down gracefully, HTTP/2 with GOAWAY (`aether_http_idle_closed`).
//!
//! A head whose first bytes arrived with the previous request (pipelined) and that is never
//! completed is bounded by the idle deadline, not the head deadline.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tracing::debug;

use crate::proxy::overload::{Overload, PeerStream, Registered, Sheddable};
use crate::proxy::rewind::Rewind;
use crate::proxy::{Body, BoxError, Inputs, ProxySettings, Stats, count};

/// How a connection carries its requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// HTTP/1.x: one head after another.
    Http1,
    /// HTTP/2: streams; the bytes between them are frames, not heads.
    Http2,
}

/// Which deadline passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expired {
    /// A request head did not arrive whole in time.
    Head,
    /// No request was in flight for the idle timeout.
    Idle,
}

/// The connection's state, in atomics: it is read on every read of the byte stream, and changed
/// from the connection's task and from whatever task drops a request's body. Instants are
/// stored as nanoseconds since `base`, plus one (`0` is none).
#[derive(Debug)]
struct Shared {
    base: Instant,
    in_flight: AtomicUsize,
    idle_since: AtomicU64,
    head_started: AtomicU64,
    proto: Proto,
    head_timeout: Duration,
    idle_timeout: Duration,
    max_streams: usize,
    /// Bytes read of an HTTP/1 head not yet whole (what a shed closes first).
    partial: AtomicUsize,
    /// Told by the overload manager to close now.
    shed: tokio::sync::Notify,
    /// Whether it was told.
    told: AtomicBool,
    /// Its place in the overload manager's registry, and the peer its HTTP/2 streams count
    /// against; unset for a connection nothing sheds (tests).
    guard: std::sync::OnceLock<(Registered, Arc<str>)>,
}

impl Sheddable for Shared {
    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    fn partial_bytes(&self) -> usize {
        self.partial.load(Ordering::Relaxed)
    }

    fn idle_since(&self) -> Instant {
        self.instant(self.idle_since.load(Ordering::SeqCst))
            .unwrap_or(self.base)
    }

    fn shed(&self) {
        self.told.store(true, Ordering::Relaxed);
        self.shed.notify_one();
    }

    fn is_shed(&self) -> bool {
        self.told.load(Ordering::Relaxed)
    }
}

impl Shared {
    fn stamp(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX - 1) + 1
    }

    fn instant(&self, stamp: u64) -> Option<Instant> {
        stamp
            .checked_sub(1)
            .map(|n| self.base + Duration::from_nanos(n))
    }
}

/// The deadlines of one connection, shared by its byte stream, its requests and [`serve`].
#[derive(Clone, Debug)]
pub struct Watch(Arc<Shared>);

impl Watch {
    /// The watch of a connection speaking `proto`; `head_started` is when its first head's clock
    /// started (the accept), if it waits for one.
    pub fn new(proto: Proto, settings: &ProxySettings, head_started: Option<Instant>) -> Self {
        let base = head_started
            .unwrap_or_else(Instant::now)
            .min(Instant::now());
        let shared = Shared {
            base,
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_started: AtomicU64::new(0),
            proto,
            head_timeout: settings.header_read_timeout,
            idle_timeout: settings.http_idle_timeout,
            max_streams: usize::try_from(settings.http2_max_concurrent_streams)
                .unwrap_or(usize::MAX),
            partial: AtomicUsize::new(0),
            shed: tokio::sync::Notify::new(),
            told: AtomicBool::new(false),
            guard: std::sync::OnceLock::new(),
        };
        shared
            .idle_since
            .store(shared.stamp(Instant::now()), Ordering::SeqCst);
        if let Some(t) = head_started.filter(|_| proto == Proto::Http1) {
            shared.head_started.store(shared.stamp(t), Ordering::SeqCst);
        }
        Self(Arc::new(shared))
    }

    /// As [`Watch::new`], for a connection the overload manager may shed, whose HTTP/2 streams
    /// count against `peer`'s.
    pub fn guarded(
        proto: Proto,
        settings: &ProxySettings,
        head_started: Option<Instant>,
        overload: &Arc<Overload>,
        peer: Arc<str>,
    ) -> Self {
        let watch = Self::new(proto, settings, head_started);
        let weak: std::sync::Weak<dyn Sheddable> = Arc::downgrade(&watch.0) as _;
        let _ = watch.0.guard.set((overload.register(weak), peer));
        watch
    }

    /// Until the overload manager sheds this connection.
    async fn shed(&self) {
        self.0.shed.notified().await;
    }

    /// A request (its head complete, or an HTTP/2 stream) was handed over; it is in flight until
    /// the returned value and every clone of it are dropped ([`track`]). An HTTP/2 connection
    /// that reaches its stream limit is counted.
    ///
    /// `None`: an HTTP/2 stream the overload manager refuses (its peer has its streams open, or
    /// memory is critical); the caller resets it with `REFUSED_STREAM` ([`refused_stream`]).
    pub fn begin(&self, stats: &Stats) -> Option<Arc<InFlight>> {
        let w = &self.0;
        let stream = match (w.proto, w.guard.get()) {
            (Proto::Http2, Some((registered, peer))) => {
                Some(registered.overload().open_stream(peer)?)
            }
            _ => None,
        };
        w.head_started.store(0, Ordering::SeqCst);
        w.partial.store(0, Ordering::Relaxed);
        let now = w.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        if w.proto == Proto::Http2 && now >= w.max_streams {
            count(&stats.http2_stream_limit);
        }
        Some(Arc::new(InFlight {
            watch: self.clone(),
            _stream: stream,
            body_failed: AtomicBool::new(false),
        }))
    }

    /// `n` bytes arrived: on HTTP/1 with no request in flight they are part of a head, and the
    /// first begins its clock.
    fn read(&self, n: usize) {
        let w = &self.0;
        if w.proto != Proto::Http1 || w.in_flight.load(Ordering::SeqCst) > 0 {
            return;
        }
        w.partial.fetch_add(n, Ordering::Relaxed);
        if w.head_started.load(Ordering::SeqCst) != 0 {
            return;
        }
        let now = w.stamp(Instant::now());
        // No wake-up: the watcher's timer is never armed later than a head deadline that
        // could start meanwhile ([`Watch::expired`]).
        let _ = w
            .head_started
            .compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Whether an HTTP/1 request head is on its way: the connection's first (its clock runs
    /// from the accept), or one whose first bytes arrived, and no request in flight.
    fn head_pending(&self) -> bool {
        let w = &self.0;
        w.in_flight.load(Ordering::SeqCst) == 0 && w.head_started.load(Ordering::SeqCst) != 0
    }

    /// The next deadline, if one runs now.
    fn next(&self) -> Option<(Instant, Expired)> {
        let w = &self.0;
        if w.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        if let Some(t) = w.instant(w.head_started.load(Ordering::SeqCst)) {
            return Some((t + w.head_timeout, Expired::Head));
        }
        let idle_since = w
            .instant(w.idle_since.load(Ordering::SeqCst))
            .unwrap_or(w.base);
        Some((idle_since + w.idle_timeout, Expired::Idle))
    }

    /// Wait until a deadline passes.
    ///
    /// Nothing wakes the watcher when a request starts or ends or a head begins: that would
    /// cost every request an extra wake-up of its connection's task (it cost the bare data path
    /// a fifth of its latency, docs/performance.md). Instead its one timer is armed at the
    /// deadline running now, but never later than a deadline that could start before it fires:
    /// on HTTP/1 at most the head timeout ahead (a head may begin at any time without a word),
    /// on HTTP/2 at most the idle timeout ahead while requests are in flight (idleness begins
    /// only after them, so its deadline is later than that). When the timer fires the deadline
    /// is read again and the timer moved on if it has not passed. A connection's task so wakes
    /// once per head timeout at most, and deadlines hold to the tick.
    pub async fn expired(&self) -> Expired {
        let w = &self.0;
        let ahead = match w.proto {
            Proto::Http1 => w.head_timeout,
            Proto::Http2 => w.idle_timeout,
        };
        let sleep = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(sleep);
        loop {
            let now = Instant::now();
            let at = match self.next() {
                Some((at, what)) if now >= at => return what,
                Some((at, _)) => at.min(now + ahead),
                None => now + ahead,
            };
            sleep.as_mut().reset(at);
            sleep.as_mut().await;
        }
    }
}

/// One request in flight on a watched connection ([`Watch::begin`]), with its place among its
/// peer's HTTP/2 streams.
#[derive(Debug)]
pub struct InFlight {
    watch: Watch,
    /// Held for its drop: the stream leaves its peer's count with the request.
    _stream: Option<PeerStream>,
    /// Whether the request's body, as hyper read it from the client, failed ([`track`]).
    body_failed: AtomicBool,
}

impl InFlight {
    /// Whether the request's body failed as hyper read it: a malformed chunk, or a body cut
    /// short of its `Content-Length`, is the client's fault.
    pub fn body_failed(&self) -> bool {
        self.body_failed.load(Ordering::SeqCst)
    }
}

/// The error a service returns for a stream [`Watch::begin`] refused: hyper resets the stream
/// with `REFUSED_STREAM` (RFC 9113 §8.7: not processed, safe to retry).
pub fn refused_stream() -> h2::Error {
    h2::Error::from(h2::Reason::REFUSED_STREAM)
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let w = &self.watch.0;
        // Bytes read while a request was in flight belong to it (or were pipelined).
        w.head_started.store(0, Ordering::SeqCst);
        w.partial.store(0, Ordering::Relaxed);
        if w.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            // No wake-up: the idle deadline this starts is later than the watcher's timer.
            w.idle_since
                .store(w.stamp(Instant::now()), Ordering::SeqCst);
        }
    }
}

/// A body that keeps its request in flight until it is done or dropped ([`track`],
/// [`tracked`]); a request's body also tells it when it fails ([`InFlight::body_failed`]).
#[derive(Debug)]
pub struct Tracked<B> {
    inner: B,
    in_flight: Arc<InFlight>,
    /// Whether this is the request's body (its failure is recorded).
    request: bool,
}

impl<B: HttpBody + Unpin> HttpBody for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if self.request && matches!(polled, Poll::Ready(Some(Err(_)))) {
            self.in_flight.body_failed.store(true, Ordering::SeqCst);
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

/// A request's body as hyper hands it over, keeping `in_flight` alive until it is dropped and
/// telling it when the body fails: one box for the body, its guard and that flag (issue #38: a
/// box for the body, one for the guard, and a flag of its own with one more cost a request three
/// allocations).
pub fn track(body: hyper::body::Incoming, in_flight: &Arc<InFlight>) -> Body {
    Tracked {
        inner: body.map_err(BoxError::from),
        in_flight: in_flight.clone(),
        request: true,
    }
    .boxed()
}

/// `body` (a response's, as hyper sends it), keeping `in_flight` alive until it is dropped; not
/// boxed again: hyper's server takes any body type.
pub fn tracked<B>(body: B, in_flight: &Arc<InFlight>) -> Tracked<B> {
    Tracked {
        inner: body,
        in_flight: in_flight.clone(),
        request: false,
    }
}

/// A connection's byte stream: first the bytes already read (`prefix`), then `io`'s; every read
/// tells the [`Watch`].
#[derive(Debug)]
pub struct Watched<T> {
    io: Rewind<T>,
    watch: Watch,
}

impl<T> Watched<T> {
    /// Watch `io`, whose first bytes `prefix` were already read from it.
    pub fn new(io: T, prefix: Bytes, watch: Watch) -> Self {
        // What the sniffer read of a first head is part of it.
        if watch.0.proto == Proto::Http1 && watch.0.in_flight.load(Ordering::SeqCst) == 0 {
            watch.0.partial.fetch_add(prefix.len(), Ordering::Relaxed);
        }
        Self {
            io: Rewind::new(prefix, io),
            watch,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // The prefix was read (and watched) before: replaying it is no new read.
        if self.io.replaying() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.watch.read(buf.filled().len() - before);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// How long a shed connection with no head on its way may take to send what it has written.
const SHED_FLUSH: Duration = Duration::from_secs(1);

/// How often a draining connection looks whether the head it waits for has arrived.
const HEAD_POLL: Duration = Duration::from_millis(5);

/// Run a hyper server connection until it ends. When the daemon drains, or the connection has
/// been idle for the idle timeout, it is shut down gracefully (`graceful`: in-flight requests
/// finish, HTTP/2 sends GOAWAY), bounded by the head timeout once idle; a head that is late is
/// dropped with its connection at once.
///
/// A drain waits for an HTTP/1 head on its way (within its head deadline) before it shuts the
/// connection down: that request is served, with `connection: close`. A connection accepted
/// just before the drain has its client's request in the socket, unread; hyper's graceful
/// shutdown of a connection with no request in flight closes it at once, and the client saw a
/// new connection closed with no answer (issue #36 item 7: one request in eleven UPGRADE runs,
/// 4.6 ms after its connect).
pub async fn serve<C>(
    mut conn: Pin<&mut C>,
    graceful: fn(Pin<&mut C>),
    watch: &Watch,
    inputs: &Inputs,
) -> hyper::Result<()>
where
    C: Future<Output = hyper::Result<()>>,
{
    let mut draining = inputs.drain.subscribe();
    tokio::select! {
        out = conn.as_mut() => out,
        () = watch.shed() => {
            debug!("connection shed under memory pressure: closed");
            // A partial head is owed nothing. Otherwise the last answer may still be in the
            // connection's buffers: shut it down gracefully, briefly.
            if watch.head_pending() {
                return Ok(());
            }
            graceful(conn.as_mut());
            tokio::time::timeout(SHED_FLUSH, conn).await.unwrap_or(Ok(()))
        }
        () = async { drop(draining.wait_for(|d| *d).await) } => {
            // Polled only while a drain waits for a head: nothing wakes a connection when its
            // request begins (see `Watch::expired`).
            let head = async {
                while watch.head_pending() {
                    tokio::time::sleep(HEAD_POLL).await;
                }
            };
            tokio::select! {
                out = conn.as_mut() => return out,
                () = watch.shed() => return Ok(()),
                () = head => {}
                what = watch.expired() => if what == Expired::Head {
                    count(&inputs.stats.header_timeouts);
                    debug!("request head not received within the header read timeout: closed");
                    return Ok(());
                }
            }
            graceful(conn.as_mut());
            conn.await
        }
        what = watch.expired() => match what {
            Expired::Head => {
                count(&inputs.stats.header_timeouts);
                debug!("request head not received within the header read timeout: closed");
                Ok(())
            }
            Expired::Idle => {
                count(&inputs.stats.idle_closed);
                graceful(conn.as_mut());
                tokio::time::timeout(watch.0.head_timeout, conn)
                    .await
                    .unwrap_or(Ok(()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ProxySettings {
        ProxySettings {
            header_read_timeout: Duration::from_secs(10),
            http_idle_timeout: Duration::from_secs(300),
            ..ProxySettings::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_runs_from_its_first_byte_and_idleness_from_the_last_request() {
        let stats = Stats::default();
        let start = Instant::now();
        let watch = Watch::new(Proto::Http1, &settings(), None);
        // Nothing read, nothing in flight: the idle deadline.
        assert_eq!(
            watch.next(),
            Some((start + Duration::from_secs(300), Expired::Idle))
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        watch.read(1);
        assert_eq!(
            watch.next(),
            Some((start + Duration::from_secs(11), Expired::Head))
        );
        // Later bytes of the same head do not move its deadline.
        tokio::time::sleep(Duration::from_secs(5)).await;
        watch.read(1);
        assert_eq!(watch.next().unwrap().0, start + Duration::from_secs(11));
        let request = watch.begin(&stats).unwrap();
        let body = request.clone();
        assert_eq!(watch.next(), None);
        // Bytes while a request is in flight begin no head.
        watch.read(1);
        drop(request);
        assert_eq!(watch.next(), None, "its body still runs");
        tokio::time::sleep(Duration::from_secs(2)).await;
        drop(body);
        assert_eq!(
            watch.next(),
            Some((start + Duration::from_secs(308), Expired::Idle))
        );
        assert_eq!(watch.expired().await, Expired::Idle);
        assert_eq!(Instant::now(), start + Duration::from_secs(308));
    }

    #[tokio::test(start_paused = true)]
    async fn http2_frames_begin_no_head_and_the_stream_limit_is_counted() {
        let stats = Stats::default();
        let settings = ProxySettings {
            http2_max_concurrent_streams: 2,
            ..settings()
        };
        let watch = Watch::new(Proto::Http2, &settings, Some(Instant::now()));
        watch.read(1);
        assert_eq!(watch.next().unwrap().1, Expired::Idle);
        let a = watch.begin(&stats).unwrap();
        assert_eq!(stats.http2_stream_limit.get(), 0);
        let b = watch.begin(&stats).unwrap();
        assert_eq!(stats.http2_stream_limit.get(), 1);
        drop((a, b));
        assert_eq!(watch.next().unwrap().1, Expired::Idle);
    }
}
