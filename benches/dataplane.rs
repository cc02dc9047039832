//! Data-plane benchmark (issues #3, #11): the fixture mesh of `config/examples/mp` on one
//! machine, measured through the full path against direct pod-to-pod, in one run.
//!
//! - **mesh**: from `mp-client` (managed, captured, node-a) to a pod IP: the client's daemon
//!   captures the dial, crosses the mTLS hop, and the destination's daemon delivers to the pod.
//!   Cross-node: a pod on node-b (two daemons). Same-node: a pod on node-a (node-a's daemon is
//!   both ends of the hop).
//! - **direct**: from `ext-http-0` (unmanaged, no capture, node-a) to the same pod IP and port;
//!   inbound traffic to a pod is not intercepted, so the only difference is the mesh.
//!
//! Per target: HTTP/1.1 on one keep-alive connection, sequential requests (p50/p99 and the
//! request rate that gives; the mesh's added p50/p99 over direct), HTTP/1.1 requests per second
//! over a fixed time on [`RPS_CONNECTIONS`] keep-alive connections, and bulk TCP through the raw
//! echo. The client is one thread of this process, driving HTTP/1.1 by hand after a first
//! request through hyper that checks who answered ([`RawConn`]); its CPU share during the direct
//! many-connection figure is printed, so a client at its own limit is seen.
//! Each figure is measured in [`ROUNDS`] rounds, mesh and direct back to back with the order
//! alternating. Two tables are printed: the first round, and the median round (the TIME_WAIT
//! sockets in the server pod are printed per round: a daemon that opened a connection to the
//! application per request left them behind). Nothing is asserted about speed.
//!
//! Run as root: `cargo bench --bench dataplane`. Without root it prints `SKIPPED: needs root`.
//! `AETHER_BENCH_BINARY=<path>` runs the mesh on another build of `aether` (an older commit's,
//! for a before-and-after) with this same harness.
#![allow(clippy::print_stdout, missing_docs)] // A benchmark harness reports on stdout.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use http::{Request, StatusCode, header::HOST};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use aether::demo::{DemoOptions, Running};
use aether::netns::Netns;
use aether::time::now;
use aether::workload::probe::Connector;

const ROUNDS: usize = 3;
/// Sequential requests on one connection, per round (after [`WARMUP`]).
const LATENCY_REQUESTS: usize = 2000;
const WARMUP: usize = 100;
/// Concurrent keep-alive connections of the throughput figure (issue #11: 32).
const RPS_CONNECTIONS: usize = 32;
const RPS_DURATION: Duration = Duration::from_secs(4);
const BULK_BYTES: usize = 64 << 20;
/// A client thread busier than this share of a core is said to be near its limit.
const CLIENT_LIMIT: f64 = 0.8;
const CHUNK: usize = 64 << 10;

/// One way from a client pod to a server pod.
struct Path2 {
    name: &'static str,
    connector: Connector,
}

/// An HTTP target: the server pod, its IP and port, and the `Host` a mesh client sends.
struct HttpTarget {
    label: &'static str,
    pod: &'static str,
    addr: SocketAddr,
    host: String,
    /// A response header only the mesh adds (a MeshFilter), to prove which path answered.
    mesh_header: Option<&'static str>,
}

#[derive(Clone, Copy, Default)]
struct Figures {
    p50_us: f64,
    p99_us: f64,
    /// Sequential requests per second on one connection.
    rps1: f64,
    rps: f64,
    bulk_mib_s: f64,
    /// This process's CPU time over the many-connection figure's wall time (1.0: one core).
    client_cpu: f64,
}

fn main() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIPPED: needs root");
        return Ok(());
    }
    // One client thread: the daemons and the echo servers share the machine's cores with it.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the runtime")?;
    rt.block_on(async {
        let mut opts = DemoOptions::fixture(
            Path::new(env!("CARGO_MANIFEST_DIR")),
            PathBuf::from("/tmp/aether-bench"),
            std::env::var_os("AETHER_BENCH_BINARY").map_or_else(
                || PathBuf::from(env!("CARGO_BIN_EXE_aether")),
                PathBuf::from,
            ),
            "aeb",
        );
        opts.daemon_args = trust_the_direct_client(&opts)?;
        println!("bringing the fixture mesh up in {}", opts.run_dir.display());
        // `Running` takes the topology down when dropped: on error and on panic too.
        let running = aether::demo::up(&opts).await.context("bring the mesh up")?;
        let measured = measure(&running).await;
        running.down().await.context("take the mesh down")?;
        measured
    })
}

/// The direct client (`ext-http-0`, outside the mesh) is refused at mp-multi-1 since plaintext
/// to a pod a service-level authorization guards is (model.md §12.5 item 3): its address is made
/// a trusted source of the daemons, so the baseline exists. A daemon built before that rule
/// has no such setting, and needs none.
fn trust_the_direct_client(opts: &DemoOptions) -> Result<Vec<String>> {
    let help = std::process::Command::new(&opts.binary)
        .args(["node", "--help"])
        .output()
        .context("run the daemon binary")?;
    if !String::from_utf8_lossy(&help.stdout).contains("--inbound-trusted-sources") {
        return Ok(Vec::new());
    }
    let load = aether::registry::file::load_dir(&opts.registry).context("read the fixture")?;
    let ip = load
        .snapshot
        .pods
        .iter()
        .find(|p| p.name == "ext-http-0")
        .and_then(|p| p.ips.first().copied())
        .context("no ext-http-0 in the fixture")?;
    let prefix = if ip.is_ipv4() { 32 } else { 128 };
    Ok(vec![
        "--inbound-trusted-sources".into(),
        format!("{ip}/{prefix}"),
    ])
}

async fn measure(running: &Running) -> Result<()> {
    let env = &running.env;
    let guard = running.lab.lock().await;
    let lab = guard.as_ref().context("the lab is up")?;
    let client = env.clients.get("mp-client").context("no mp-client")?;
    let ext = lab
        .pod_netns("mp-ext", "ext-http-0")
        .context("no ext-http-0")?;
    let paths = [
        Path2 {
            name: "mesh",
            connector: Connector::in_netns(Arc::clone(client), env.home.clone()),
        },
        Path2 {
            name: "direct",
            connector: Connector::in_netns(ext, env.home.clone()),
        },
    ];
    let ip = |pod: &str| env.pod_ip("mp", pod).map_err(anyhow::Error::msg);
    let targets = [
        HttpTarget {
            label: "mp-httponly-1:8080 (no filters, cross-node)",
            pod: "mp-httponly-1",
            addr: SocketAddr::new(ip("mp-httponly-1")?, 8080),
            host: format!("{}:8080", env.mesh("mp-httponly")),
            mesh_header: None,
        },
        HttpTarget {
            label: "mp-httponly-0:8080 (no filters, same-node)",
            pod: "mp-httponly-0",
            addr: SocketAddr::new(ip("mp-httponly-0")?, 8080),
            host: format!("{}:8080", env.mesh("mp-httponly")),
            mesh_header: None,
        },
        HttpTarget {
            label: "mp-multi-1:8080 (x-svc + ext_authz filters, cross-node)",
            pod: "mp-multi-1",
            addr: SocketAddr::new(ip("mp-multi-1")?, 8080),
            host: format!("{}:8080", env.mesh("mp-multi")),
            mesh_header: Some("x-svc"),
        },
    ];
    let bulk_pods = ["mp-mixed-1", "mp-mixed-0"];

    let mut rows: Vec<(String, [Vec<Figures>; 2])> = Vec::new();
    for t in &targets {
        let mut per_path: [Vec<Figures>; 2] = Default::default();
        for round in 0..ROUNDS {
            for i in order(round) {
                let f = http_round(&paths[i], t)
                    .await
                    .with_context(|| format!("{} via {}", t.label, paths[i].name))?;
                let tw = time_wait(lab, t.pod, &env.home);
                println!(
                    "  {:<56} {:<6} round {round}: p50 {:>7.1} µs  p99 {:>7.1} µs  \
                     {:>7.0} req/s (1 conn)  {:>8.0} req/s ({RPS_CONNECTIONS} conns, client CPU \
                     {:.2})  (TIME_WAIT in {}: {tw})",
                    t.label, paths[i].name, f.p50_us, f.p99_us, f.rps1, f.rps, f.client_cpu, t.pod
                );
                per_path[i].push(f);
            }
        }
        rows.push((t.label.to_owned(), per_path));
    }
    let mut bulk_rows: Vec<(String, [Vec<Figures>; 2])> = Vec::new();
    for bulk_pod in bulk_pods {
        let bulk_addr = SocketAddr::new(ip(bulk_pod)?, 9000);
        let mut bulk: [Vec<Figures>; 2] = Default::default();
        for round in 0..ROUNDS {
            for i in order(round) {
                let mib_s = bulk_round(&paths[i].connector, bulk_addr, bulk_pod)
                    .await
                    .with_context(|| format!("bulk via {}", paths[i].name))?;
                println!(
                    "  bulk {bulk_pod}:9000 {:<6} round {round}: {mib_s:>8.1} MiB/s",
                    paths[i].name
                );
                bulk[i].push(Figures {
                    bulk_mib_s: mib_s,
                    ..Figures::default()
                });
            }
        }
        let place = if bulk_pod.ends_with("-0") {
            "same-node"
        } else {
            "cross-node"
        };
        bulk_rows.push((format!("{bulk_pod}:9000 (raw echo, {place})"), bulk));
    }
    report(&rows, &bulk_rows);
    Ok(())
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

/// TCP sockets in TIME_WAIT inside a pod's namespace (`/proc/thread-self/net/tcp`, state 06):
/// the mesh opens one connection to the application per request, from the pod's side.
fn time_wait(lab: &aether::lab::run::Lab, pod: &str, home: &Netns) -> String {
    let Some(ns) = lab.pod_netns("mp", pod) else {
        return "?".into();
    };
    let read = || std::fs::read_to_string("/proc/thread-self/net/tcp");
    match ns.run(home, read) {
        Ok(Ok(t)) => t
            .lines()
            .filter(|l| l.split_whitespace().nth(3) == Some("06"))
            .count()
            .to_string(),
        _ => "?".into(),
    }
}

/// Mesh first on even rounds, direct first on odd ones.
fn order(round: usize) -> [usize; 2] {
    if round.is_multiple_of(2) {
        [0, 1]
    } else {
        [1, 0]
    }
}

async fn connect(connector: &Connector, addr: SocketAddr) -> Result<TcpStream> {
    let stream = connector.tcp_socket(addr)?.connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

async fn http_conn(connector: &Connector, addr: SocketAddr) -> Result<SendRequest<Empty<Bytes>>> {
    let stream = connect(connector, addr).await?;
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(send)
}

/// A keep-alive HTTP/1.1 connection driven by hand: the request's bytes are written as they
/// are, the response head is parsed in place (`httparse`) and its `Content-Length` body read,
/// so the client spends far less per request than a full client and stays below the direct
/// path's rate (its CPU share is printed beside the figures).
struct RawConn {
    stream: TcpStream,
    request: Bytes,
    buf: Vec<u8>,
    /// Bytes of `buf` read and not yet taken.
    filled: usize,
}

impl RawConn {
    async fn open(connector: &Connector, addr: SocketAddr, host: &str) -> Result<Self> {
        Ok(Self {
            stream: connect(connector, addr).await?,
            request: Bytes::from(format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n")),
            buf: vec![0; 16 << 10],
            filled: 0,
        })
    }

    /// One GET; its answer must be `200` with a `Content-Length` body.
    async fn get(&mut self) -> Result<()> {
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
}

/// One GET on a keep-alive connection; returns the response head's headers and the body.
async fn get(send: &mut SendRequest<Empty<Bytes>>, host: &str) -> Result<(http::HeaderMap, Bytes)> {
    send.ready().await?;
    let req = Request::get("/").header(HOST, host).body(Empty::new())?;
    let resp = send.send_request(req).await?;
    ensure!(resp.status() == StatusCode::OK, "status {}", resp.status());
    let headers = resp.headers().clone();
    Ok((headers, resp.into_body().collect().await?.to_bytes()))
}

async fn http_round(path: &Path2, t: &HttpTarget) -> Result<Figures> {
    // Latency: one connection, sequential requests.
    let mut send = http_conn(&path.connector, t.addr).await?;
    let (headers, body) = get(&mut send, &t.host).await?;
    let want = format!(
        "{}:{}\n",
        t.pod.rsplit_once('-').map_or(t.pod, |p| p.0),
        t.addr.port()
    );
    ensure!(body == want.as_bytes(), "body {body:?}, want {want:?}");
    ensure!(
        headers.get("x-echo-pod").is_some_and(|v| v == t.pod),
        "answered by {:?}, want {}",
        headers.get("x-echo-pod"),
        t.pod
    );
    if let Some(h) = t.mesh_header {
        let mesh = path.name == "mesh";
        ensure!(
            headers.contains_key(h) == mesh,
            "header {h} present: {}, want {mesh}",
            !mesh
        );
    }
    drop(send);
    let mut conn = RawConn::open(&path.connector, t.addr, &t.host).await?;
    for _ in 0..WARMUP {
        conn.get().await?;
    }
    let mut lat = Vec::with_capacity(LATENCY_REQUESTS);
    let sequential = now();
    for _ in 0..LATENCY_REQUESTS {
        let t0 = now();
        conn.get().await?;
        lat.push(t0.elapsed());
    }
    let rps1 = LATENCY_REQUESTS as f64 / sequential.elapsed().as_secs_f64();
    drop(conn);
    lat.sort_unstable();
    let pct = |q: f64| lat[((lat.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;

    // Throughput: a few keep-alive connections for a fixed time.
    let mut tasks = tokio::task::JoinSet::new();
    let cpu_before = cpu_time();
    let start = now();
    for _ in 0..RPS_CONNECTIONS {
        let mut conn = RawConn::open(&path.connector, t.addr, &t.host).await?;
        tasks.spawn(async move {
            let mut n = 0u64;
            while start.elapsed() < RPS_DURATION {
                conn.get().await?;
                n += 1;
            }
            anyhow::Ok(n)
        });
    }
    let mut total = 0;
    while let Some(r) = tasks.join_next().await {
        total += r??;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = (cpu_time() - cpu_before).as_secs_f64();
    Ok(Figures {
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        rps1,
        rps: total as f64 / secs,
        bulk_mib_s: 0.0,
        client_cpu: cpu / secs,
    })
}

/// Send [`BULK_BYTES`] through the raw echo and read them back; MiB/s of the round trip's payload.
async fn bulk_round(connector: &Connector, addr: SocketAddr, pod: &str) -> Result<f64> {
    let greeting = format!("mp-mixed:{}\npod {pod}\n", addr.port());
    let want = greeting.len() + BULK_BYTES;
    let (mut rd, mut wr) = connect(connector, addr).await?.into_split();
    let start = now();
    let writer = tokio::spawn(async move {
        let chunk = vec![0x5a_u8; CHUNK];
        for _ in 0..BULK_BYTES / CHUNK {
            wr.write_all(&chunk).await?;
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
    let secs = start.elapsed().as_secs_f64();
    let wr = writer.await??;
    drop(wr);
    ensure!(
        head == greeting.as_bytes(),
        "greeting {:?}",
        String::from_utf8_lossy(&head)
    );
    ensure!(got == want, "read {got} bytes, want {want}");
    Ok(BULK_BYTES as f64 / (1 << 20) as f64 / secs)
}

fn median(v: &[Figures], f: &dyn Fn(&Figures) -> f64) -> f64 {
    let mut xs: Vec<f64> = v.iter().map(f).collect();
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn report(rows: &[(String, [Vec<Figures>; 2])], bulk: &[(String, [Vec<Figures>; 2])]) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!();
    println!(
        "machine: {cores} cores, {cpu}, kernel {}; load average at the end: {}",
        kernel.trim(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "{ROUNDS} rounds; 1 conn: {LATENCY_REQUESTS} sequential requests on one keep-alive \
         connection; {RPS_CONNECTIONS} conns: keep-alive connections for {} s; bulk: {} MiB",
        RPS_DURATION.as_secs(),
        BULK_BYTES >> 20
    );
    let first = |v: &[Figures], f: &dyn Fn(&Figures) -> f64| v.first().map_or(0.0, f);
    let med = |v: &[Figures], f: &dyn Fn(&Figures) -> f64| median(v, f);
    table("first round", rows, bulk, &first);
    table(&format!("median of {ROUNDS} rounds"), rows, bulk, &med);
}

type Pick<'a> = dyn Fn(&[Figures], &dyn Fn(&Figures) -> f64) -> f64 + 'a;

fn table(
    title: &str,
    rows: &[(String, [Vec<Figures>; 2])],
    bulk: &[(String, [Vec<Figures>; 2])],
    pick: &Pick<'_>,
) {
    println!();
    println!("{title}:");
    println!();
    println!(
        "| target | req/s, {RPS_CONNECTIONS} conns: mesh / direct | ratio | req/s, 1 conn: mesh / \
         direct | ratio | p50, 1 conn: mesh / direct | added | p99: mesh / direct | added | \
         client CPU, direct {RPS_CONNECTIONS} conns |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (label, [mesh, direct]) in rows {
        let f = |v: &[Figures], g: &dyn Fn(&Figures) -> f64| pick(v, g);
        let (rm, rd) = (f(mesh, &|x| x.rps), f(direct, &|x| x.rps));
        let (sm, sd) = (f(mesh, &|x| x.rps1), f(direct, &|x| x.rps1));
        let (pm, pd) = (f(mesh, &|x| x.p50_us), f(direct, &|x| x.p50_us));
        let (qm, qd) = (f(mesh, &|x| x.p99_us), f(direct, &|x| x.p99_us));
        println!(
            "| {label} | {rm:.0} / {rd:.0} | {:.2} | {sm:.0} / {sd:.0} | {:.2} | {pm:.1} / {pd:.1} µs \
             | +{:.1} µs | {qm:.1} / {qd:.1} µs | +{:.1} µs | {:.2} |",
            rm / rd,
            sm / sd,
            pm - pd,
            qm - qd,
            f(direct, &|x| x.client_cpu)
        );
    }
    let busiest = rows
        .iter()
        .map(|(_, [_, direct])| pick(direct, &|x| x.client_cpu))
        .fold(0.0, f64::max);
    if busiest > CLIENT_LIMIT {
        println!(
            "\nThe client used {busiest:.2} of a core on a direct {RPS_CONNECTIONS}-connection \
             figure: it is near its own limit there, so those direct figures (and the ratios to \
             them) are lower bounds for the direct path."
        );
    }
    println!();
    println!("| raw TCP stream | mesh | direct | ratio |");
    println!("|---|---|---|---|");
    for (label, [mesh, direct]) in bulk {
        let mib = |v: &[Figures]| pick(v, &|f| f.bulk_mib_s);
        println!(
            "| {label} | {:.1} MiB/s | {:.1} MiB/s | {:.2} |",
            mib(mesh),
            mib(direct),
            mib(mesh) / mib(direct)
        );
    }
}
