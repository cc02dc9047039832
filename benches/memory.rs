//! Memory benchmark (issue #8, finding 13): what an idle proxied connection costs a daemon, and
//! whether a daemon's memory comes back after a flood of connections has closed.
//!
//! The fixture mesh of `config/examples/mp`, brought up as in the data-plane benchmark. From
//! `mp-client` (managed, node-a), [`CONNECTIONS`] connections are opened on one path, each used
//! once (a request and its answer, or one byte echoed) and then held idle; the resident set
//! (`VmRSS`) and open descriptors of both daemons are read from `/proc` before, while the
//! connections are held, and after they are closed. Paths:
//!
//! - **18081**: the pod's loopback listener, `127.0.0.1:18081` with the service in `Host`
//!   (mp-httponly:8080, on node-b): node-a holds the client's connection; the request crosses the
//!   pooled hop.
//! - **captured HTTP**: the pod IP `mp-httponly-1:8080` dialled directly, captured on node-a.
//! - **captured TCP**: the raw echo `mp-mixed-1:9000`: node-a holds the client's connection and a
//!   TLS stream to node-b, node-b that stream and a connection to the echo.
//!
//! The baseline is read after a warm-up that uses each path, so one-time allocations (kept hop
//! and application connections, certificates) are in it. Nothing is asserted; figures are printed.
//! `AETHER_MEMORY_CONNECTIONS` changes the count, `AETHER_MEMORY_SETTLE_SECS` how long to wait
//! after the connections are opened, and again after they are closed, before each reading
//! (default 25 s: jemalloc's background thread returns freed pages over its 10 s decay).
//!
//! Run as root: `cargo bench --bench memory`. Without root it prints `SKIPPED: needs root`.
#![allow(clippy::print_stdout, missing_docs)] // A benchmark harness reports on stdout.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use futures_util::future::try_join_all;
use http::{Request, StatusCode, header::HOST};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use aether::demo::{DemoOptions, Running};
use aether::workload::probe::Connector;

#[path = "shared/procfs.rs"]
mod procfs;
use procfs::{Memory, memory};

const CONNECTIONS: usize = 2000;
/// Connections opened at once while a path is filled.
const BATCH: usize = 100;
const SETTLE_SECS: u64 = 25;

/// Both daemons, node-a then node-b.
type Both = [Memory; 2];

fn main() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIPPED: needs root");
        return Ok(());
    }
    // The client holds every connection of a path at once, and the daemons inherit the limit.
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .context("getrlimit")?;
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard)
        .context("setrlimit")?;
    let n = env_number("AETHER_MEMORY_CONNECTIONS", CONNECTIONS as u64)? as usize;
    let settle = Duration::from_secs(env_number("AETHER_MEMORY_SETTLE_SECS", SETTLE_SECS)?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the runtime")?;
    rt.block_on(async {
        let opts = DemoOptions::fixture(
            Path::new(env!("CARGO_MANIFEST_DIR")),
            PathBuf::from("/tmp/aether-bench-memory"),
            std::env::var_os("AETHER_BENCH_BINARY").map_or_else(
                || PathBuf::from(env!("CARGO_BIN_EXE_aether")),
                PathBuf::from,
            ),
            "aem",
        );
        println!(
            "binary {}; the fixture mesh in {}, brought up once per path",
            opts.binary.display(),
            opts.run_dir.display()
        );
        let mut rows = Vec::new();
        for i in 0..PATHS.len() {
            let running = aether::demo::up(&opts).await.context("bring the mesh up")?;
            let measured = measure(&running, i, n, settle).await;
            running.down().await.context("take the mesh down")?;
            rows.push(measured?);
        }
        report(&rows, n, settle);
        Ok(())
    })
}

fn env_number(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => v.parse().with_context(|| format!("{name}={v:?}")),
        Err(_) => Ok(default),
    }
}

/// A way to open and use one connection from `mp-client`.
#[derive(Clone)]
enum Target {
    Http { addr: SocketAddr, host: String },
    Echo { addr: SocketAddr },
}

/// What keeps one connection open: the HTTP sender and its connection task, or the stream.
enum Held {
    Http {
        _send: SendRequest<Empty<Bytes>>,
        task: JoinHandle<()>,
    },
    Tcp(#[allow(dead_code, reason = "held for its drop")] TcpStream),
}

impl Target {
    async fn open(&self, connector: &Connector) -> Result<Held> {
        match self {
            Self::Http { addr, host } => {
                let stream = connect(connector, *addr).await?;
                let (mut send, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                let task = tokio::spawn(async move {
                    let _ = conn.await;
                });
                let req = Request::get("/").header(HOST, host).body(Empty::new())?;
                let resp = send.send_request(req).await?;
                ensure!(resp.status() == StatusCode::OK, "status {}", resp.status());
                resp.into_body().collect().await?;
                Ok(Held::Http { _send: send, task })
            }
            Self::Echo { addr } => {
                // The echo greets first (`mp-mixed:9000\npod <pod>\n`), then echoes.
                let mut stream = connect(connector, *addr).await?;
                stream.write_all(b"x").await?;
                let mut got = Vec::new();
                let mut b = [0u8; 64];
                while got.iter().filter(|&&c| c == b'\n').count() < 2 || got.last() != Some(&b'x') {
                    let n = stream.read(&mut b).await?;
                    ensure!(n > 0, "echo closed after {got:?}");
                    got.extend_from_slice(&b[..n]);
                }
                ensure!(
                    got.starts_with(b"mp-mixed:9000\npod "),
                    "echo answered {got:?}"
                );
                Ok(Held::Tcp(stream))
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Self::Http { task, .. } = self {
            task.abort();
        }
    }
}

async fn connect(connector: &Connector, addr: SocketAddr) -> Result<TcpStream> {
    let stream = connector.tcp_socket(addr)?.connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

async fn open_many(connector: &Connector, target: &Target, n: usize) -> Result<Vec<Held>> {
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        let batch = BATCH.min(n - held.len());
        let opened = try_join_all((0..batch).map(|_| target.open(connector))).await?;
        held.extend(opened);
    }
    Ok(held)
}

fn read_both(pids: [u32; 2]) -> Result<Both> {
    Ok([memory(pids[0])?, memory(pids[1])?])
}

fn show(b: &Both) -> String {
    format!(
        "node-a {:>7} KiB {:>5} fds | node-b {:>7} KiB {:>5} fds",
        b[0].rss_kib, b[0].fds, b[1].rss_kib, b[1].fds
    )
}

/// The paths, by name; [`path`] builds each from the running mesh.
const PATHS: [&str; 3] = [
    "18081 (loopback listener)",
    "captured HTTP (pod IP :8080)",
    "captured TCP (raw echo :9000)",
];

fn path(running: &Running, i: usize) -> Result<Target> {
    let env = &running.env;
    let ip = |pod: &str| env.pod_ip("mp", pod).map_err(anyhow::Error::msg);
    let host = format!("{}:8080", env.mesh("mp-httponly"));
    Ok(match i {
        0 => Target::Http {
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 18081),
            host,
        },
        1 => Target::Http {
            addr: SocketAddr::new(ip("mp-httponly-1")?, 8080),
            host,
        },
        _ => Target::Echo {
            addr: SocketAddr::new(ip("mp-mixed-1")?, 9000),
        },
    })
}

/// One path's readings: after the warm-up, with the connections held, after they closed.
struct Row {
    baseline: Both,
    held: Both,
    after: Both,
}

/// On a fresh mesh (so no earlier flood's freed memory hides this one's cost): a warm-up of
/// [`BATCH`] connections opened and closed, then `n` held, then closed.
async fn measure(running: &Running, i: usize, n: usize, settle: Duration) -> Result<Row> {
    let env = &running.env;
    let guard = running.lab.lock().await;
    let lab = guard.as_ref().context("the lab is up")?;
    let pids = [
        lab.daemon_pid("node-a").context("no daemon on node-a")?,
        lab.daemon_pid("node-b").context("no daemon on node-b")?,
    ];
    let client = env.clients.get("mp-client").context("no mp-client")?;
    let connector = Connector::in_netns(Arc::clone(client), env.home.clone());
    let target = path(running, i)?;

    drop(open_many(&connector, &target, BATCH).await?);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let baseline = read_both(pids)?;
    let held = open_many(&connector, &target, n)
        .await
        .with_context(|| format!("open {n} on {}", PATHS[i]))?;
    // As long as after the close: memory the opening freed (sniff and first-head buffers) is
    // returned by then, so the reading is what the idle connections themselves hold.
    tokio::time::sleep(settle).await;
    let during = read_both(pids)?;
    drop(held);
    tokio::time::sleep(settle).await;
    let after = read_both(pids)?;
    println!("{}: {n} idle connections", PATHS[i]);
    println!("  baseline {}", show(&baseline));
    println!("  held     {}", show(&during));
    println!("  closed   {}  ({}s later)", show(&after), settle.as_secs());
    Ok(Row {
        baseline,
        held: during,
        after,
    })
}

fn report(rows: &[Row], n: usize, settle: Duration) {
    println!();
    println!(
        "| path | KiB per idle connection, node-a | node-b | RSS after close / baseline, node-a | node-b |"
    );
    println!("|---|---|---|---|---|");
    for (name, r) in PATHS.iter().zip(rows) {
        let per = |i: usize| (r.held[i].rss_kib as f64 - r.baseline[i].rss_kib as f64) / n as f64;
        let back = |i: usize| r.after[i].rss_kib as f64 / r.baseline[i].rss_kib as f64;
        println!(
            "| {name} | {:.1} | {:.1} | {:.2} | {:.2} |",
            per(0),
            per(1),
            back(0),
            back(1)
        );
    }
    println!(
        "({n} connections per path; RSS read {}s after they closed)",
        settle.as_secs()
    );
}
