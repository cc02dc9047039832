//! Data-plane benchmark (issues #3, #11): the fixture mesh of `config/examples/mp` on one
//! machine, measured through the full path, through nginx and haproxy as single plaintext hops,
//! and direct pod-to-pod, in one run, printed as one table.
//!
//! Paths (the rows), all to the echo pods of the fixture:
//!
//! - **direct**: from `ext-http-0` (unmanaged, no capture, node-a) to a server pod's IP and
//!   port; inbound traffic to a pod is not intercepted, so the only difference to the mesh rows
//!   is the mesh. Two rows: to the node-a replica and to the node-b replica of each workload.
//! - **nginx** and **haproxy** ([`refs`]): started in `ext-http-0`'s namespace, listening on
//!   its loopback, forwarding to the node-b replicas with kept upstream connections; their
//!   ratios are to direct to the node-b replicas.
//! - **aether, same node**: from `mp-client` (managed, captured, node-a) to the node-a
//!   replicas: node-a's daemon is both ends of the hop. Ratios to direct to node-a.
//! - **aether, cross node**: from `mp-client` to the node-b replicas: node-a's daemon captures
//!   the dial, crosses the mTLS hop, node-b's daemon delivers. Ratios to direct to node-b.
//! - **aether, cross node, filters**: to `mp-multi-1`, whose MeshFilters add `x-svc` and an
//!   `ext_authz` check per request (HTTP/1.1 figures only).
//!
//! Figures (the columns), each checked to be answered by the pod dialled ([`load`]):
//!
//! - raw TCP: [`Settings::bulk_bytes`] written to the raw echo (`mp-mixed:9000`) and read back.
//! - req/s on [`Settings::connections`] keep-alive HTTP/1.1 connections for
//!   [`Settings::rate_time`]; req/s of sequential requests on one connection and their p50 and
//!   p99 (added over direct).
//! - h2c: GETs on [`Settings::streams`] concurrent streams of one HTTP/2 prior-knowledge
//!   connection to the HTTP echo; gRPC: unary calls of the echo's method (`mp-grpc:50051`) the
//!   same way.
//! - new connections per second: connect, one GET, close (with a reset, so no `TIME_WAIT`
//!   runs the client out of ports), [`Settings::new_conn_parallel`] at a time.
//! - idle memory: [`Settings::memory_connections`] HTTP/1.1 connections opened (each answered
//!   once) and held; the growth of the proxies' `VmRSS` per connection, then what came back
//!   after they closed. Measured once per row, on the fresh mesh before any load (the memory
//!   benchmark's method, `benches/memory.rs`).
//!
//! The rate figures are measured in [`Settings::rounds`] rounds; in each round every figure is
//! taken on every row back to back, the rows' order reversed every other round; the median
//! round is printed. Beside each: the **cost** of the proxy, the CPU time (`utime + stime`) of
//! both aether daemons (or of nginx's or haproxy's processes) per request, connection or MiB,
//! and their threads' context switches per unit. The client is one thread of this process; its
//! CPU share during each direct figure is printed, and a figure whose client used more than
//! [`CLIENT_LIMIT`] of a core is flagged as near the load generator's limit. Nothing is
//! asserted about speed.
//!
//! Run as root: `cargo bench --bench dataplane`. Without root it prints `SKIPPED: needs root`.
//! Knobs (environment):
//!
//! - `AETHER_BENCH_BINARY=<path>`: run the mesh on another build of `aether` (an older
//!   commit's, for a before-and-after) with this same harness.
//! - `AETHER_BENCH_ROUNDS` (3), `AETHER_BENCH_SECS` (3: each rate figure's time),
//!   `AETHER_BENCH_MEMORY_CONNECTIONS` (2000; 0 skips the memory figure),
//!   `AETHER_BENCH_SETTLE_SECS` (12: the wait after the connections open, and again after they
//!   close, before each memory reading; jemalloc's background thread returns freed pages over
//!   its 10 s decay).
//! - `AETHER_BENCH_REFS=0`: no nginx or haproxy rows (otherwise installed with `apt-get` when
//!   missing, or a `SKIPPED: <why>` line printed).
//! - `AETHER_BENCH_WRITE=1`: write the table into docs/performance.md, between
//!   `<!-- dataplane-table:begin -->` and `<!-- dataplane-table:end -->`.
#![allow(clippy::print_stdout, missing_docs)] // A benchmark harness reports on stdout.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use aether_lab::demo::{DemoOptions, Running};
use aether_lab::workload::probe::Connector;

#[path = "dataplane/load.rs"]
mod load;
#[path = "shared/procfs.rs"]
mod procfs;
#[path = "dataplane/refs.rs"]
mod refs;
#[path = "dataplane/table.rs"]
mod table;

use load::{Meter, Sample, Target};

/// A client thread busier than this share of a core is said to be near its limit.
pub(crate) const CLIENT_LIMIT: f64 = 0.8;

/// How much load, how long, and what else the run does (the knobs of the module doc).
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) rounds: usize,
    /// Sequential requests on one connection before the measured ones.
    pub(crate) warmup: usize,
    /// Sequential requests on one connection, per round.
    pub(crate) sequential: usize,
    /// Concurrent keep-alive connections (issue #11: 32).
    pub(crate) connections: usize,
    /// Concurrent streams on one HTTP/2 connection.
    pub(crate) streams: usize,
    pub(crate) rate_time: Duration,
    pub(crate) new_conn_parallel: usize,
    pub(crate) bulk_bytes: usize,
    pub(crate) memory_connections: usize,
    pub(crate) settle: Duration,
    pub(crate) refs: bool,
    pub(crate) write: bool,
}

impl Settings {
    fn from_env() -> Result<Self> {
        Ok(Self {
            rounds: env_number("AETHER_BENCH_ROUNDS", 3)?.max(1) as usize,
            warmup: 100,
            sequential: 2000,
            connections: 32,
            streams: 32,
            rate_time: Duration::from_secs(env_number("AETHER_BENCH_SECS", 3)?.max(1)),
            new_conn_parallel: 8,
            bulk_bytes: 64 << 20,
            memory_connections: env_number("AETHER_BENCH_MEMORY_CONNECTIONS", 2000)? as usize,
            settle: Duration::from_secs(env_number("AETHER_BENCH_SETTLE_SECS", 12)?),
            refs: std::env::var("AETHER_BENCH_REFS").map_or(true, |v| v != "0"),
            write: std::env::var("AETHER_BENCH_WRITE").is_ok_and(|v| v == "1"),
        })
    }
}

fn env_number(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => v.parse().with_context(|| format!("{name}={v:?}")),
        Err(_) => Ok(default),
    }
}

/// The figures, in the table's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Tcp,
    Conns,
    Sequential,
    H2c,
    Grpc,
    NewConn,
}

impl Kind {
    pub(crate) const ALL: [Self; 6] = [
        Self::Tcp,
        Self::Conns,
        Self::Sequential,
        Self::H2c,
        Self::Grpc,
        Self::NewConn,
    ];

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// What the figure's cost is divided by.
    pub(crate) fn unit(self) -> &'static str {
        match self {
            Self::Tcp => "MiB",
            Self::NewConn => "conn",
            _ => "req",
        }
    }

    async fn run(
        self,
        connector: &Connector,
        t: &Target,
        s: &Settings,
        m: &Meter,
    ) -> Result<Sample> {
        match self {
            Self::Tcp => load::bulk(connector, t, s, m).await,
            Self::Conns => load::concurrent(connector, t, s, m).await,
            Self::Sequential => load::sequential(connector, t, s, m).await,
            Self::H2c => load::h2c(connector, t, s, m).await,
            Self::Grpc => load::grpc(connector, t, s, m).await,
            Self::NewConn => load::new_connections(connector, t, s, m).await,
        }
    }
}

/// Idle memory of one row: KiB per held connection, and the share of it back after the close.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Idle {
    pub(crate) kib_per_conn: f64,
    /// (held - after close) / (held - baseline).
    pub(crate) returned: f64,
}

/// One path of the table.
#[derive(Debug)]
pub(crate) struct Row {
    pub(crate) name: String,
    connector: Connector,
    meter: Meter,
    /// The target of each [`Kind`] (`None`: not measured on this row).
    targets: [Option<Target>; 6],
    /// The direct row its ratios are to (`None`: it is one).
    pub(crate) base: Option<usize>,
    /// Whether its idle memory is measured (a proxy's row, but mp-multi's: the same daemons as
    /// the cross-node row).
    measure_idle: bool,
    pub(crate) samples: [Vec<Sample>; 6],
    pub(crate) idle: Option<Idle>,
    /// Why a figure is missing, printed under the table.
    pub(crate) notes: Vec<String>,
}

fn main() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIPPED: needs root");
        return Ok(());
    }
    let settings = Settings::from_env()?;
    // The client holds the memory figure's connections at once; the daemons inherit the limit.
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .context("getrlimit")?;
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard)
        .context("setrlimit")?;
    let load_before = table::load_average();
    // One client thread: the daemons and the echo servers share the machine's cores with it.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the runtime")?;
    rt.block_on(async {
        let mut opts = DemoOptions::fixture(
            Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")),
            PathBuf::from("/tmp/aether-bench"),
            std::env::var_os("AETHER_BENCH_BINARY").map_or_else(
                || PathBuf::from(env!("CARGO_BIN_EXE_aether")),
                PathBuf::from,
            ),
            "aeb",
        );
        opts.daemon_args = trust_the_direct_client(&opts)?;
        println!(
            "binary {}; bringing the fixture mesh up in {}",
            opts.binary.display(),
            opts.run_dir.display()
        );
        // `Running` takes the topology down when dropped: on error and on panic too.
        let running = aether_lab::demo::up(&opts)
            .await
            .context("bring the mesh up")?;
        let measured = measure(&running, &opts, &settings).await;
        running.down().await.context("take the mesh down")?;
        let (rows, skipped) = measured?;
        let run = table::Run {
            binary: opts.binary.clone(),
            load_before,
            load_after: table::load_average(),
        };
        let text = table::render(&rows, &skipped, &settings, &run);
        println!("\n{text}");
        if settings.write {
            let docs = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
                .join("docs/performance.md");
            table::write_docs(&docs, &text)?;
            println!("written to {}", docs.display());
        }
        Ok(())
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

/// The echo ports of the fixture: HTTP (and h2c), gRPC, the raw echo.
const HTTP_PORT: u16 = 8080;
const GRPC_PORT: u16 = 50051;
const TCP_PORT: u16 = 9000;

/// Builds the rows, measures idle memory on the fresh mesh, then the rounds.
/// The rows measured, and what was skipped and why.
async fn measure(
    running: &Running,
    opts: &DemoOptions,
    s: &Settings,
) -> Result<(Vec<Row>, Vec<String>)> {
    let env = &running.env;
    let guard = running.lab.lock().await;
    let lab = guard.as_ref().context("the lab is up")?;
    let daemons = vec![
        lab.daemon_pid("node-a").context("no daemon on node-a")?,
        lab.daemon_pid("node-b").context("no daemon on node-b")?,
    ];
    let client = env.clients.get("mp-client").context("no mp-client")?;
    let ext = lab
        .pod_netns("mp-ext", "ext-http-0")
        .context("no ext-http-0")?;
    let mesh = Connector::in_netns(Arc::clone(client), env.home.clone());
    let direct = Connector::in_netns(ext, env.home.clone());
    let ip = |pod: &str| env.pod_ip("mp", pod).map_err(anyhow::Error::msg);
    // The targets of each kind on replica `r` (0: node-a, 1: node-b) of the workloads.
    let on = |r: usize| -> Result<[Option<Target>; 6]> {
        let target = |wl: &str, port: u16| -> Result<Target> {
            let pod = format!("{wl}-{r}");
            Ok(Target {
                addr: SocketAddr::new(ip(&pod)?, port),
                authority: format!("{}:{port}", env.mesh(wl)),
                pod,
                workload: wl.to_owned(),
                pod_port: port,
                header: None,
            })
        };
        let http = target("mp-httponly", HTTP_PORT)?;
        Ok([
            Some(target("mp-mixed", TCP_PORT)?),
            Some(http.clone()),
            Some(http.clone()),
            Some(http.clone()),
            Some(target("mp-grpc", GRPC_PORT)?),
            Some(http),
        ])
    };
    let row =
        |name: &str, connector: &Connector, pids: Vec<u32>, targets, base: Option<usize>| Row {
            name: name.to_owned(),
            connector: connector.clone(),
            meter: Meter { pids },
            targets,
            measure_idle: base.is_some(),
            base,
            samples: Default::default(),
            idle: None,
            notes: Vec::new(),
        };
    let mut rows = vec![
        row(
            "direct, to the node-a pod",
            &direct,
            Vec::new(),
            on(0)?,
            None,
        ),
        row(
            "direct, to the node-b pod",
            &direct,
            Vec::new(),
            on(1)?,
            None,
        ),
    ];

    // The references, in front of the node-b replicas.
    let mut proxies = Vec::new();
    let mut skipped = Vec::new();
    if s.refs {
        let netns = format!("{}ext-http-0", opts.netns_prefix);
        let up = refs::Upstreams {
            http: SocketAddr::new(ip("mp-httponly-1")?, HTTP_PORT),
            grpc: SocketAddr::new(ip("mp-grpc-1")?, GRPC_PORT),
            tcp: SocketAddr::new(ip("mp-mixed-1")?, TCP_PORT),
        };
        let started = [
            (
                "nginx",
                refs::Ports {
                    http: 18480,
                    h2c: 18481,
                    grpc: 18482,
                    tcp: Some(18483),
                },
            ),
            (
                "haproxy",
                refs::Ports {
                    http: 18490,
                    h2c: 18491,
                    grpc: 18492,
                    tcp: Some(18493),
                },
            ),
        ];
        for (name, ports) in started {
            let proxy = if name == "nginx" {
                refs::nginx(&opts.run_dir, &netns, ports, up)
            } else {
                refs::haproxy(&opts.run_dir, &netns, ports, up)
            };
            match proxy {
                Ok(p) => proxies.push(p),
                Err(why) => {
                    println!("SKIPPED: {name}: {why}");
                    skipped.push(format!("SKIPPED: {name}: {why}"));
                }
            }
        }
    } else {
        println!("SKIPPED: nginx and haproxy: AETHER_BENCH_REFS=0");
        skipped.push("SKIPPED: nginx and haproxy: AETHER_BENCH_REFS=0".into());
    }
    for p in &proxies {
        let mut targets = on(1)?;
        let local = |port: u16| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
        let listen = [
            p.ports.tcp,
            Some(p.ports.http),
            Some(p.ports.http),
            Some(p.ports.h2c),
            Some(p.ports.grpc),
            Some(p.ports.http),
        ];
        for (t, port) in targets.iter_mut().zip(listen) {
            match port {
                Some(port) => {
                    if let Some(t) = t {
                        t.addr = local(port);
                    }
                }
                None => *t = None,
            }
        }
        let mut r = row(
            &format!("{}, one plaintext hop (to the node-b pod)", p.name),
            &direct,
            p.pids(),
            targets,
            Some(1),
        );
        if p.ports.tcp.is_none() {
            r.notes
                .push(format!("{}: no raw TCP relay installed", p.name));
        }
        rows.push(r);
    }
    rows.push(row(
        "aether, same node",
        &mesh,
        daemons.clone(),
        on(0)?,
        Some(0),
    ));
    rows.push(row(
        "aether, cross node",
        &mesh,
        daemons.clone(),
        on(1)?,
        Some(1),
    ));
    // mp-multi: HTTP/1.1 only, its `x-svc` header proving the mesh answered.
    let mut multi_targets = [None, None, None, None, None, None];
    if let Some(mut t) = on(1)?[Kind::Conns.index()].clone() {
        t.pod = "mp-multi-1".into();
        t.workload = "mp-multi".into();
        t.addr = SocketAddr::new(ip("mp-multi-1")?, HTTP_PORT);
        t.authority = format!("{}:{HTTP_PORT}", env.mesh("mp-multi"));
        t.header = Some(("x-svc", true));
        multi_targets[Kind::Conns.index()] = Some(t.clone());
        multi_targets[Kind::Sequential.index()] = Some(t);
    }
    let mut multi = row(
        "aether, cross node, mp-multi (x-svc + ext_authz filters)",
        &mesh,
        daemons,
        multi_targets,
        Some(1),
    );
    multi.measure_idle = false;
    rows.push(multi);

    if s.memory_connections > 0 {
        // Cross node first: its reading on node-a is not helped by a flood freed before it.
        let order: Vec<usize> = (0..rows.len())
            .filter(|&i| rows[i].measure_idle)
            .rev()
            .collect();
        for i in order {
            let r = &rows[i];
            let t = r.targets[Kind::Conns.index()]
                .clone()
                .context("no HTTP target")?;
            let idle = idle_memory(&r.connector, &t, &r.meter.pids, s)
                .await
                .with_context(|| format!("idle memory of {}", r.name))?;
            println!(
                "  idle {:<58} {:>6.1} KiB per connection, {:>4.0} % returned after close",
                r.name,
                idle.kib_per_conn,
                idle.returned * 100.0
            );
            rows[i].idle = Some(idle);
        }
    }

    for round in 0..s.rounds {
        for kind in Kind::ALL {
            let mut order: Vec<usize> = (0..rows.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let r = &rows[i];
                let Some(t) = &r.targets[kind.index()] else {
                    continue;
                };
                let sample = kind
                    .run(&r.connector, t, s, &r.meter)
                    .await
                    .with_context(|| format!("{kind:?} via {} to {}", r.name, t.addr))?;
                println!(
                    "  round {round} {:<10} {:<58} {}",
                    format!("{kind:?}"),
                    r.name,
                    table::line(kind, &sample)
                );
                rows[i].samples[kind.index()].push(sample);
            }
        }
    }
    drop(proxies);
    Ok((rows, skipped))
}

/// Holds `s.memory_connections` connections to `t` and reads the `pids`' resident sets: after
/// a warm-up, while held, and after the close (each after `s.settle`).
async fn idle_memory(
    connector: &Connector,
    t: &Target,
    pids: &[u32],
    s: &Settings,
) -> Result<Idle> {
    let rss = || -> Result<u64> {
        pids.iter()
            .try_fold(0, |sum, &pid| Ok(sum + procfs::memory(pid)?.rss_kib))
    };
    drop(load::hold(connector, t, 100).await?);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let baseline = rss()?;
    let n = s.memory_connections;
    let held = load::hold(connector, t, n).await?;
    tokio::time::sleep(s.settle).await;
    let during = rss()?;
    drop(held);
    tokio::time::sleep(s.settle).await;
    let after = rss()?;
    let grown = during as f64 - baseline as f64;
    Ok(Idle {
        kib_per_conn: grown / n as f64,
        returned: if grown > 0.0 {
            (during as f64 - after as f64) / grown
        } else {
            1.0
        },
    })
}
