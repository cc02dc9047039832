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
//! **Scale** (issue #11's goal of at most 40 MB of daemon RSS with 2,000 services and 100 local
//! pods): `AETHER_MEMORY_SCALE=<services>,<pods>` measures that instead of the paths. The
//! fixture is brought up twice, side by side: as it is, and with a generated namespace `scale`
//! added: `<pods>` pods on node-a (each its own workload, an `aether echo` on 8080, so its own
//! generated Service) and user Services up to `<services>`, each selecting one of those pods.
//! Both daemons' resident sets are read after the settle time, with no connection held.
//!
//! **Idle** (issue #11's goal of 50,000 idle connections through one daemon without failure):
//! `AETHER_MEMORY_IDLE=<n>` opens `n` captured HTTP connections from `mp-client`, each used
//! once, round-robin over three destinations (one client address has about 28,000 ports per
//! destination), with node-a's `max_connections_per_pod` raised above `n`; while they are held,
//! one more connection must still be served; then they close. Both daemons' RSS and
//! descriptors are read before, while held, and after.
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

use aether_lab::demo::{DemoOptions, Running};
use aether_lab::workload::probe::Connector;

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
    // The client holds every connection of a path at once, and the daemons inherit the limit
    // (root may raise the hard limit up to `fs.nr_open`; the idle run needs more than 50,000).
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .context("getrlimit")?;
    let nofile = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(hard, |nr_open| hard.max(nr_open.min(1 << 18)));
    let limit = match nix::sys::resource::setrlimit(
        nix::sys::resource::Resource::RLIMIT_NOFILE,
        nofile,
        nofile,
    ) {
        Ok(()) => nofile,
        // Without CAP_SYS_RESOURCE (some containers) the hard limit is as far as it goes.
        Err(nix::errno::Errno::EPERM) if nofile > hard => {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard)
                .context("setrlimit")?;
            println!(
                "RLIMIT_NOFILE stays at its hard limit {hard}: raising it needs CAP_SYS_RESOURCE"
            );
            hard
        }
        Err(e) => return Err(e).context("setrlimit"),
    };
    let n = env_number("AETHER_MEMORY_CONNECTIONS", CONNECTIONS as u64)? as usize;
    let settle = Duration::from_secs(env_number("AETHER_MEMORY_SETTLE_SECS", SETTLE_SECS)?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the runtime")?;
    rt.block_on(async {
        let opts = DemoOptions::fixture(
            Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")),
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
        if let Ok(scale) = std::env::var("AETHER_MEMORY_SCALE") {
            return scale::run(&opts, &scale, settle).await;
        }
        if std::env::var_os("AETHER_MEMORY_IDLE").is_some() {
            let n = env_number("AETHER_MEMORY_IDLE", 0)? as usize;
            // node-a's daemon holds one descriptor per client connection, and this process one.
            ensure!(
                (n as u64) + 1000 <= limit,
                "AETHER_MEMORY_IDLE={n}: the descriptor limit here is {limit}, so at most {}",
                limit.saturating_sub(1000)
            );
            return idle(opts, n, settle).await;
        }
        let mut rows = Vec::new();
        for i in 0..PATHS.len() {
            let running = aether_lab::demo::up(&opts)
                .await
                .context("bring the mesh up")?;
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

/// The daemons of node-a and node-b.
async fn daemon_pids(running: &Running) -> Result<[u32; 2]> {
    let guard = running.lab.lock().await;
    let lab = guard.as_ref().context("the lab is up")?;
    Ok([
        lab.daemon_pid("node-a").context("no daemon on node-a")?,
        lab.daemon_pid("node-b").context("no daemon on node-b")?,
    ])
}

/// Connections from `mp-client`'s namespace.
fn client_connector(running: &Running) -> Result<Connector> {
    let env = &running.env;
    let client = env.clients.get("mp-client").context("no mp-client")?;
    Ok(Connector::in_netns(Arc::clone(client), env.home.clone()))
}

/// On a fresh mesh (so no earlier flood's freed memory hides this one's cost): a warm-up of
/// [`BATCH`] connections opened and closed, then `n` held, then closed.
async fn measure(running: &Running, i: usize, n: usize, settle: Duration) -> Result<Row> {
    let pids = daemon_pids(running).await?;
    let connector = client_connector(running)?;
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

/// `n` idle captured HTTP connections through node-a at once, and one more served meanwhile.
async fn idle(mut opts: DemoOptions, n: usize, settle: Duration) -> Result<()> {
    ensure!(n > 0, "AETHER_MEMORY_IDLE: at least one connection");
    opts.daemon_args.extend([
        "--max-connections-per-pod".to_owned(),
        (n + BATCH).to_string(),
        "--max-connections".to_owned(),
        (n + 10 * BATCH).to_string(),
    ]);
    let running = aether_lab::demo::up(&opts)
        .await
        .context("bring the mesh up")?;
    let measured = idle_on(&running, n, settle).await;
    running.down().await.context("take the mesh down")?;
    measured
}

async fn idle_on(running: &Running, n: usize, settle: Duration) -> Result<()> {
    let env = &running.env;
    let pids = daemon_pids(running).await?;
    let connector = client_connector(running)?;
    let ip = |pod: &str| env.pod_ip("mp", pod).map_err(anyhow::Error::msg);
    let targets = [
        Target::Http {
            addr: SocketAddr::new(ip("mp-httponly-1")?, 8080),
            host: format!("{}:8080", env.mesh("mp-httponly")),
        },
        Target::Http {
            addr: SocketAddr::new(ip("mp-eighty-1")?, 8080),
            host: format!("{}:8080", env.mesh("mp-eighty")),
        },
        Target::Http {
            addr: SocketAddr::new(ip("mp-eighty-1")?, 9090),
            host: format!("{}:9090", env.mesh("mp-eighty")),
        },
    ];
    for t in &targets {
        drop(open_many(&connector, t, BATCH).await?);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let baseline = read_both(pids)?;
    let started = aether::time::now();
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        let i = held.len() / BATCH % targets.len();
        let batch = BATCH.min(n - held.len());
        let opened = open_many(&connector, &targets[i], batch)
            .await
            .with_context(|| format!("with {} open, open {batch} more", held.len()))?;
        held.extend(opened);
    }
    let opened_in = started.elapsed();
    tokio::time::sleep(settle).await;
    let during = read_both(pids)?;
    // One more, while every one of them is held: still served.
    drop(
        targets[0]
            .open(&connector)
            .await
            .with_context(|| format!("one more connection with {n} held"))?,
    );
    drop(held);
    tokio::time::sleep(settle).await;
    let after = read_both(pids)?;
    println!(
        "{n} idle captured HTTP connections from mp-client, opened in {:.1} s; one more served while they were held",
        opened_in.as_secs_f64()
    );
    println!("  baseline {}", show(&baseline));
    println!("  held     {}", show(&during));
    println!("  closed   {}  ({}s later)", show(&after), settle.as_secs());
    let per = |i: usize| (during[i].rss_kib as f64 - baseline[i].rss_kib as f64) / n as f64;
    println!(
        "KiB per idle connection: node-a {:.1}, node-b {:.1}; RSS after close / baseline: node-a {:.2}, node-b {:.2}",
        per(0),
        per(1),
        after[0].rss_kib as f64 / baseline[0].rss_kib as f64,
        after[1].rss_kib as f64 / baseline[1].rss_kib as f64
    );
    Ok(())
}

/// The daemons' memory with a registry the size of issue #11's goal, beside the fixture alone.
mod scale {
    use std::fmt::Write as _;
    use std::path::Path;
    use std::time::Duration;

    use anyhow::{Context, Result, bail, ensure};

    use super::{Both, read_both, show};
    use aether_lab::demo::DemoOptions;

    /// The first pod's last octet in 10.244.1.0/24 (node-a's pods; the fixture's are below).
    const FIRST_HOST: usize = 120;
    /// The user Services' ClusterIPs start at 10.96.200.0 (the file registry allocates the
    /// generated ones from the bottom of 10.96.0.0/16).
    const FIRST_CLUSTER_IP: usize = 200 << 8;

    pub(super) async fn run(opts: &DemoOptions, spec: &str, settle: Duration) -> Result<()> {
        let (services, pods) = parse(spec)?;
        let src = opts
            .run_dir
            .with_file_name("aether-bench-memory-scale-registry");
        write_registry(&opts.registry, &src, services, pods)?;
        let scaled = DemoOptions {
            registry: src.clone(),
            ..opts.clone()
        };
        let fixture = measure(opts, "the fixture alone", settle).await?;
        let big = measure(&scaled, "the fixture and the scale namespace", settle).await?;
        println!();
        println!("| registry | RSS node-a (the {pods} pods' node) | node-b |");
        println!("|---|---|---|");
        println!(
            "| the fixture alone | {} KiB | {} KiB |",
            fixture[0].rss_kib, fixture[1].rss_kib
        );
        println!(
            "| + {services} services, {pods} pods on node-a | {} KiB | {} KiB |",
            big[0].rss_kib, big[1].rss_kib
        );
        println!(
            "| difference | {:+} KiB | {:+} KiB |",
            big[0].rss_kib as i64 - fixture[0].rss_kib as i64,
            big[1].rss_kib as i64 - fixture[1].rss_kib as i64
        );
        println!(
            "(read {}s after every pod answered; registry in {})",
            settle.as_secs(),
            src.display()
        );
        Ok(())
    }

    fn parse(spec: &str) -> Result<(usize, usize)> {
        let (s, p) = spec
            .split_once(',')
            .with_context(|| format!("AETHER_MEMORY_SCALE={spec:?}: expected <services>,<pods>"))?;
        let services: usize = s.trim().parse().context("AETHER_MEMORY_SCALE services")?;
        let pods: usize = p.trim().parse().context("AETHER_MEMORY_SCALE pods")?;
        ensure!(
            (1..=255 - FIRST_HOST).contains(&pods),
            "AETHER_MEMORY_SCALE: 1 to {} pods (node-a's /24 holds the rest)",
            255 - FIRST_HOST
        );
        ensure!(
            services >= pods && services - pods <= (56 << 8),
            "AETHER_MEMORY_SCALE: at least one service per pod, at most {} more",
            56 << 8
        );
        Ok((services, pods))
    }

    async fn measure(opts: &DemoOptions, what: &str, settle: Duration) -> Result<Both> {
        let running = aether_lab::demo::up(opts)
            .await
            .with_context(|| format!("bring up {what}"))?;
        let read = async {
            let pids = super::daemon_pids(&running).await?;
            tokio::time::sleep(settle).await;
            read_both(pids)
        }
        .await;
        running.down().await.context("take the mesh down")?;
        let both = read?;
        println!("{what}: {}", show(&both));
        Ok(both)
    }

    /// `fixture`'s manifests and `90-scale.yaml` in `dir`.
    fn write_registry(fixture: &Path, dir: &Path, services: usize, pods: usize) -> Result<()> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        for entry in std::fs::read_dir(fixture).with_context(|| format!("{}", fixture.display()))? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                bail!(
                    "{}: the fixture has no subdirectories",
                    entry.path().display()
                );
            }
            std::fs::copy(entry.path(), dir.join(entry.file_name()))?;
        }
        let path = dir.join("90-scale.yaml");
        std::fs::write(&path, manifests(services, pods))
            .with_context(|| format!("write {}", path.display()))
    }

    fn manifests(services: usize, pods: usize) -> String {
        let mut y = String::from(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: scale\n---\n\
             apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: scale\n  namespace: scale\n",
        );
        for i in 0..pods {
            let ip = format!("10.244.1.{}", FIRST_HOST + i);
            let _ = write!(
                y,
                "---
apiVersion: v1
kind: Pod
metadata:
  name: scale-{i}
  namespace: scale
  labels:
    app: scale-{i}
  annotations:
    endpoint.aether.io/port: \"8080\"
    endpoint.aether.io/protocol: \"http\"
    aether.io/netns: \"scale-{i}\"
spec:
  serviceAccountName: scale
  nodeName: node-a
  containers:
  - name: app
    image: aether:dev
    command: [\"aether\", \"echo\", \"--workload\", \"scale-{i}\", \"--http\", \"8080\"]
    env:
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    ports:
    - name: http-8080
      containerPort: 8080
      protocol: TCP
status:
  phase: Running
  podIP: {ip}
  podIPs:
  - ip: {ip}
  conditions:
  - type: Ready
    status: \"True\"
"
            );
        }
        for j in 0..services - pods {
            let n = FIRST_CLUSTER_IP + j;
            let ip = format!("10.96.{}.{}", n >> 8, n & 0xff);
            let _ = write!(
                y,
                "---
apiVersion: v1
kind: Service
metadata:
  name: scale-user-{j}
  namespace: scale
spec:
  type: ClusterIP
  clusterIP: {ip}
  clusterIPs:
  - {ip}
  selector:
    app: scale-{pod}
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
",
                pod = j % pods
            );
        }
        y
    }
}
