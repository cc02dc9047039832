//! The load of each figure: one client thread (this process's current-thread runtime) drives
//! a connection or many, for a fixed time or a fixed amount, and returns what it counted with
//! the work the measured processes did meanwhile ([`Meter`]).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use http::{Request, StatusCode, header::HOST};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use aether::time::now;
use aether_lab::workload::grpc::{DEFAULT_METHOD, EchoReply, EchoRequest};
use aether_lab::workload::probe::Connector;

use crate::Settings;
use crate::procfs::{self, Work};

/// Where one kind of load goes: the address dialled, the authority sent, and the pod whose
/// echo must answer (its `x-echo-pod`, or the gRPC reply's pod).
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) addr: SocketAddr,
    pub(crate) authority: String,
    pub(crate) pod: String,
    /// The echo's answer names the workload and the port it listens on (not the dialled
    /// port, which differs behind nginx and haproxy).
    pub(crate) workload: String,
    pub(crate) pod_port: u16,
    /// A response header the answer must carry (`Some(true)`) or lack (`Some(false)`).
    pub(crate) header: Option<(&'static str, bool)>,
}

/// The processes whose work a figure is charged: both daemons for aether, the proxy for
/// nginx and haproxy, none for direct.
#[derive(Debug)]
pub(crate) struct Meter {
    pub(crate) pids: Vec<u32>,
}

impl Meter {
    fn read(&self) -> Result<Work> {
        self.pids.iter().try_fold(
            Work::default(),
            |sum, &pid| Ok(sum.plus(procfs::work(pid)?)),
        )
    }
}

/// One figure of one round.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sample {
    /// Requests (or connections) per second; MiB/s for raw TCP.
    pub(crate) rate: f64,
    /// Sequential requests only: the latency percentiles, µs.
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    /// This process's CPU time over the figure's wall time (1.0: one core).
    pub(crate) client_cpu: f64,
    /// What the metered processes did over the figure.
    pub(crate) work: Work,
    /// Requests, connections or MiB the work is divided by.
    pub(crate) units: f64,
}

/// This process's CPU time so far (user and system, every thread).
fn cpu_time() -> Duration {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF);
    usage.map_or(Duration::ZERO, |u| {
        let t = |tv: nix::sys::time::TimeVal| {
            Duration::new(
                u64::try_from(tv.tv_sec()).unwrap_or(0),
                u32::try_from(tv.tv_usec()).unwrap_or(0) * 1000,
            )
        };
        t(u.user_time()) + t(u.system_time())
    })
}

/// The clocks of one figure: wall time, this process's CPU and the metered processes' work.
struct Clocks {
    start: std::time::Instant,
    cpu: Duration,
    work: Work,
}

impl Clocks {
    fn start(meter: &Meter) -> Result<Self> {
        Ok(Self {
            work: meter.read()?,
            cpu: cpu_time(),
            start: now(),
        })
    }

    /// A sample of `units` done at `units_per_sec`-style rate `rate_units` over the time.
    fn stop(self, meter: &Meter, units: f64, rate_units: f64) -> Result<Sample> {
        let secs = self.start.elapsed().as_secs_f64();
        let cpu = (cpu_time() - self.cpu).as_secs_f64();
        Ok(Sample {
            rate: rate_units / secs,
            client_cpu: cpu / secs,
            work: meter.read()?.since(self.work),
            units,
            ..Sample::default()
        })
    }
}

/// Tasks that each repeat a step for the figure's time, counting the steps.
struct Timed {
    clocks: Clocks,
    until: std::time::Instant,
    tasks: tokio::task::JoinSet<Result<u64>>,
}

impl Timed {
    fn start(s: &Settings, m: &Meter) -> Result<Self> {
        let clocks = Clocks::start(m)?;
        Ok(Self {
            until: clocks.start + s.rate_time,
            clocks,
            tasks: tokio::task::JoinSet::new(),
        })
    }

    /// A task that runs `step` on `state` (which each step hands back) until the time is up.
    fn repeat<S, F, Fut>(&mut self, mut state: S, step: F)
    where
        S: Send + 'static,
        F: Fn(S) -> Fut + Send + 'static,
        Fut: Future<Output = Result<S>> + Send,
    {
        let until = self.until;
        self.tasks.spawn(async move {
            let mut n = 0u64;
            while now() < until {
                state = step(state).await?;
                n += 1;
            }
            Ok(n)
        });
    }

    /// Waits for every task: the steps per second, and the work per step.
    async fn finish(mut self, m: &Meter) -> Result<Sample> {
        let mut total = 0;
        while let Some(r) = self.tasks.join_next().await {
            total += r??;
        }
        let total = total as f64;
        self.clocks.stop(m, total, total)
    }
}

pub(crate) async fn connect(connector: &Connector, addr: SocketAddr) -> Result<TcpStream> {
    let stream = connector.tcp_socket(addr)?.connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// A keep-alive HTTP/1.1 connection driven by hand: the request's bytes are written as they
/// are, the response head is parsed in place (`httparse`) and its `Content-Length` body read,
/// so the client spends far less per request than a full client.
pub(crate) struct RawConn {
    stream: TcpStream,
    request: Bytes,
    buf: Vec<u8>,
    /// Bytes of `buf` read and not yet taken.
    filled: usize,
}

impl RawConn {
    pub(crate) async fn open(connector: &Connector, addr: SocketAddr, host: &str) -> Result<Self> {
        Ok(Self {
            stream: connect(connector, addr).await?,
            request: Bytes::from(format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n")),
            buf: vec![0; 16 << 10],
            filled: 0,
        })
    }

    /// One GET; its answer must be `200` with a `Content-Length` body.
    pub(crate) async fn get(&mut self) -> Result<()> {
        self.stream.write_all(&self.request).await?;
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut resp = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(head) = resp.parse(&self.buf[..self.filled])? {
                ensure!(resp.code == Some(200), "status {:?}", resp.code);
                let length: usize = resp
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                    .context("no content-length")?;
                let whole = head + length;
                ensure!(whole <= self.buf.len(), "answer of {whole} bytes");
                while self.filled < whole {
                    self.read_more().await?;
                }
                self.buf.copy_within(whole..self.filled, 0);
                self.filled -= whole;
                return Ok(());
            }
            self.read_more().await?;
        }
    }

    async fn read_more(&mut self) -> Result<()> {
        ensure!(self.filled < self.buf.len(), "head larger than the buffer");
        let n = self.stream.read(&mut self.buf[self.filled..]).await?;
        ensure!(n > 0, "closed mid-answer");
        self.filled += n;
        Ok(())
    }

    /// Closes with a reset (`SO_LINGER` 0): the new-connection figure opens thousands a
    /// second from one address to one port, which `TIME_WAIT` would run out of ports for.
    fn reset(self) -> Result<()> {
        let std = self.stream.into_std()?;
        socket2::SockRef::from(&std).set_linger(Some(Duration::ZERO))?;
        Ok(())
    }
}

/// The answer of an echo, checked: `200`, the body `<workload>:<port>\n`, the pod in
/// `x-echo-pod`, and the target's header present or absent.
fn check_answer(
    t: &Target,
    status: StatusCode,
    headers: &http::HeaderMap,
    body: &[u8],
) -> Result<()> {
    ensure!(status == StatusCode::OK, "status {status}");
    let want = format!("{}:{}\n", t.workload, t.pod_port);
    ensure!(body == want.as_bytes(), "body {body:?}, want {want:?}");
    ensure!(
        headers
            .get("x-echo-pod")
            .is_some_and(|v| v == t.pod.as_str()),
        "answered by {:?}, want {}",
        headers.get("x-echo-pod"),
        t.pod
    );
    if let Some((h, want)) = t.header {
        ensure!(
            headers.contains_key(h) == want,
            "header {h} present: {}, want {want}",
            !want
        );
    }
    Ok(())
}

/// One request through hyper's HTTP/1.1 client, checked ([`check_answer`]): who answered.
async fn check_http1(connector: &Connector, t: &Target) -> Result<()> {
    let stream = connect(connector, t.addr).await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = Request::get("/")
        .header(HOST, &t.authority)
        .body(Empty::<Bytes>::new())?;
    let resp = send.send_request(req).await?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await?.to_bytes();
    check_answer(t, parts.status, &parts.headers, &body)
}

/// Sequential GETs on one keep-alive connection: the rate, p50 and p99.
pub(crate) async fn sequential(
    connector: &Connector,
    t: &Target,
    s: &Settings,
    m: &Meter,
) -> Result<Sample> {
    check_http1(connector, t).await?;
    let mut conn = RawConn::open(connector, t.addr, &t.authority).await?;
    for _ in 0..s.warmup {
        conn.get().await?;
    }
    let mut lat = Vec::with_capacity(s.sequential);
    let clocks = Clocks::start(m)?;
    for _ in 0..s.sequential {
        let t0 = now();
        conn.get().await?;
        lat.push(t0.elapsed());
    }
    let n = s.sequential as f64;
    let mut sample = clocks.stop(m, n, n)?;
    lat.sort_unstable();
    let pct = |q: f64| lat[((lat.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
    sample.p50_us = pct(0.50);
    sample.p99_us = pct(0.99);
    Ok(sample)
}

/// GETs on `s.connections` keep-alive connections for `s.rate_time`.
pub(crate) async fn concurrent(
    connector: &Connector,
    t: &Target,
    s: &Settings,
    m: &Meter,
) -> Result<Sample> {
    check_http1(connector, t).await?;
    let mut conns = Vec::with_capacity(s.connections);
    for _ in 0..s.connections {
        conns.push(RawConn::open(connector, t.addr, &t.authority).await?);
    }
    let mut timed = Timed::start(s, m)?;
    for conn in conns {
        timed.repeat(conn, |mut conn| async move {
            conn.get().await?;
            Ok(conn)
        });
    }
    timed.finish(m).await
}

/// New connections for `s.rate_time`, `s.new_conn_parallel` at a time: each connects, sends
/// one GET, reads its answer and closes.
pub(crate) async fn new_connections(
    connector: &Connector,
    t: &Target,
    s: &Settings,
    m: &Meter,
) -> Result<Sample> {
    check_http1(connector, t).await?;
    let mut timed = Timed::start(s, m)?;
    for _ in 0..s.new_conn_parallel {
        let state = (connector.clone(), t.addr, t.authority.clone());
        timed.repeat(state, |(connector, addr, host)| async move {
            let mut conn = RawConn::open(&connector, addr, &host).await?;
            conn.get().await?;
            conn.reset()?;
            Ok((connector, addr, host))
        });
    }
    timed.finish(m).await
}

type H2Send<B> = hyper::client::conn::http2::SendRequest<B>;

async fn h2_conn<B>(connector: &Connector, addr: SocketAddr) -> Result<H2Send<B>>
where
    B: http_body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = connect(connector, addr).await?;
    let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(stream))
        .await?;
    tokio::spawn(conn);
    Ok(send)
}

/// Requests on `s.streams` concurrent streams of one HTTP/2 connection for `s.rate_time`;
/// `one` sends a request on its sender and checks the answer.
async fn on_streams<B, F, Fut>(send: H2Send<B>, s: &Settings, m: &Meter, one: F) -> Result<Sample>
where
    B: http_body::Body + Unpin + Send + 'static,
    F: Fn(H2Send<B>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<()>> + Send,
{
    let mut timed = Timed::start(s, m)?;
    for _ in 0..s.streams {
        let one = one.clone();
        timed.repeat(send.clone(), move |send| {
            let call = one(send.clone());
            async move {
                call.await?;
                Ok(send)
            }
        });
    }
    timed.finish(m).await
}

/// h2c with prior knowledge: GETs on concurrent streams of one connection.
pub(crate) async fn h2c(
    connector: &Connector,
    t: &Target,
    s: &Settings,
    m: &Meter,
) -> Result<Sample> {
    let mut send = h2_conn::<Empty<Bytes>>(connector, t.addr).await?;
    let uri = format!("http://{}/", t.authority);
    let req = Request::get(&uri).body(Empty::new())?;
    let resp = send.send_request(req).await?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await?.to_bytes();
    check_answer(t, parts.status, &parts.headers, &body)?;
    let one = move |mut send: H2Send<Empty<Bytes>>| {
        let req = Request::get(uri.as_str()).body(Empty::new());
        async move {
            let resp = send.send_request(req?).await?;
            ensure!(resp.status() == StatusCode::OK, "status {}", resp.status());
            resp.into_body().collect().await?;
            Ok(())
        }
    };
    on_streams(send, s, m, one).await
}

/// A gRPC message framed for the wire: no compression, its length, its bytes.
fn grpc_frame(message: &impl Message) -> Bytes {
    let body = message.encode_to_vec();
    let mut framed = Vec::with_capacity(5 + body.len());
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
    framed.extend_from_slice(&body);
    Bytes::from(framed)
}

/// One unary call's answer: `200`, `grpc-status: 0` in the trailers, and the reply.
async fn grpc_call(send: &mut H2Send<Full<Bytes>>, uri: &str, frame: &Bytes) -> Result<Bytes> {
    let req = Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(Full::new(frame.clone()))?;
    let resp = send.send_request(req).await?;
    ensure!(resp.status() == StatusCode::OK, "status {}", resp.status());
    let collected = resp.into_body().collect().await?;
    let status = collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .map(|v| v.as_bytes().to_vec());
    ensure!(
        status.as_deref() == Some(b"0"),
        "grpc-status {:?}",
        status.map(|s| String::from_utf8_lossy(&s).into_owned())
    );
    Ok(collected.to_bytes())
}

/// gRPC unary calls of the echo's method on concurrent streams of one HTTP/2 connection.
pub(crate) async fn grpc(
    connector: &Connector,
    t: &Target,
    s: &Settings,
    m: &Meter,
) -> Result<Sample> {
    let mut send = h2_conn::<Full<Bytes>>(connector, t.addr).await?;
    let uri = format!("http://{}/{DEFAULT_METHOD}", t.authority);
    let frame = grpc_frame(&EchoRequest {
        message: "bench".into(),
        status_code: 0,
        status_message: String::new(),
    });
    let first = grpc_call(&mut send, &uri, &frame).await?;
    ensure!(first.len() >= 5, "reply of {} bytes", first.len());
    let reply = EchoReply::decode(&first[5..]).context("decode the reply")?;
    ensure!(
        reply.pod == t.pod && reply.message == "bench",
        "reply from {:?} with {:?}, want {} with \"bench\"",
        reply.pod,
        reply.message,
        t.pod
    );
    let one = move |mut send: H2Send<Full<Bytes>>| {
        let (uri, frame) = (uri.clone(), frame.clone());
        async move { grpc_call(&mut send, &uri, &frame).await.map(drop) }
    };
    on_streams(send, s, m, one).await
}

/// Writes `s.bulk_bytes` to the raw echo and reads them back concurrently: MiB/s of payload.
pub(crate) async fn bulk(
    connector: &Connector,
    t: &Target,
    s: &Settings,
    m: &Meter,
) -> Result<Sample> {
    const CHUNK: usize = 64 << 10;
    let greeting = format!("{}:{}\npod {}\n", t.workload, t.pod_port, t.pod);
    let bytes = s.bulk_bytes;
    let want = greeting.len() + bytes;
    let (mut rd, mut wr) = connect(connector, t.addr).await?.into_split();
    let clocks = Clocks::start(m)?;
    let writer = tokio::spawn(async move {
        let chunk = vec![0x5a_u8; CHUNK];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(CHUNK);
            wr.write_all(&chunk[..n]).await?;
            left -= n;
        }
        anyhow::Ok(wr)
    });
    let mut buf = vec![0u8; CHUNK];
    let mut head = Vec::new();
    let mut got = 0;
    while got < want {
        let n = rd.read(&mut buf).await?;
        ensure!(n > 0, "closed after {got} of {want} bytes");
        if head.len() < greeting.len() {
            let take = n.min(greeting.len() - head.len());
            head.extend_from_slice(&buf[..take]);
        }
        got += n;
    }
    let mib = bytes as f64 / f64::from(1 << 20);
    let sample = clocks.stop(m, mib, mib)?;
    drop(writer.await??);
    ensure!(
        head == greeting.as_bytes(),
        "greeting {:?}",
        String::from_utf8_lossy(&head)
    );
    ensure!(got == want, "read {got} bytes, want {want}");
    Ok(sample)
}

/// Opens `n` keep-alive connections, each answered once, and holds them (the memory figure).
pub(crate) async fn hold(connector: &Connector, t: &Target, n: usize) -> Result<Vec<RawConn>> {
    const BATCH: usize = 100;
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        let batch = BATCH.min(n - held.len());
        let opened = futures_util::future::try_join_all((0..batch).map(|_| async {
            let mut c = RawConn::open(connector, t.addr, &t.authority).await?;
            c.get().await?;
            anyhow::Ok(c)
        }))
        .await?;
        held.extend(opened);
    }
    Ok(held)
}
