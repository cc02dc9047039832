//! The e2e workloads: `aether echo` and `aether probe`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::ValueEnum;

use aether_core::model::registrar;

use crate::explain::domain_arg;

#[derive(Debug, clap::Args)]
pub(crate) struct EchoArgs {
    /// The workload's name, answered by every listener as `<workload>:<port>`.
    #[arg(long)]
    workload: String,
    /// An HTTP/1.x and h2c echo port (repeatable).
    #[arg(long)]
    http: Vec<u16>,
    /// A raw TCP echo port (repeatable).
    #[arg(long)]
    tcp: Vec<u16>,
    /// A server-first TCP port (repeatable).
    #[arg(long)]
    server_first: Vec<u16>,
    /// A UDP echo port (repeatable).
    #[arg(long)]
    udp: Vec<u16>,
    /// A counting external authorization port (repeatable).
    #[arg(long)]
    authz: Vec<u16>,
    /// A gRPC echo port, h2c with prior knowledge (repeatable): every method path
    /// `/<pkg.Service>/<Method>` answers an `aether.echo.v1.EchoReply` (docs/grpc.md).
    #[arg(long)]
    grpc: Vec<u16>,
    /// The pod's name.
    #[arg(long, env = "POD_NAME", default_value = "")]
    pod: String,
    /// The pod's namespace.
    #[arg(long, env = "POD_NAMESPACE", default_value = "")]
    namespace: String,
}

pub(crate) fn run_echo(args: &EchoArgs) -> anyhow::Result<ExitCode> {
    use aether_lab::workload::echo::{Echo, EchoOptions, ListenerKind};
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
    let mut opts = EchoOptions::new(&args.workload);
    opts.pod.clone_from(&args.pod);
    opts.namespace.clone_from(&args.namespace);
    for (kind, ports) in [
        (ListenerKind::Http, &args.http),
        (ListenerKind::Tcp, &args.tcp),
        (ListenerKind::ServerFirst, &args.server_first),
        (ListenerKind::Udp, &args.udp),
        (ListenerKind::Authz, &args.authz),
        (ListenerKind::Grpc, &args.grpc),
    ] {
        for port in ports {
            opts = opts.with(kind, *port);
        }
    }
    let rt = tokio::runtime::Runtime::new().context("start the runtime")?;
    rt.block_on(async {
        let echo = Echo::bind(&opts)?;
        for b in echo.bound() {
            tracing::info!(kind = ?b.kind, addr = %b.addr, "echo: listening");
        }
        // SIGTERM ends the echo cleanly: as a container's PID 1 it would otherwise be ignored.
        tokio::select! {
            r = echo.run() => r?,
            r = aether_lab::workload::probe::idle() => r.context("wait for a signal")?,
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum ProbeOutput {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("send").args(
    ["http1", "http10", "h2c", "raw", "wait", "tls", "udp", "grpc"]
)))]
pub(crate) struct ProbeArgs {
    /// Sleep until SIGTERM or SIGINT, then exit 0 (the client pods' command).
    #[arg(long, conflicts_with = "dial")]
    idle: bool,
    /// What to connect to: `<name-or-ip>:<port>` (a name goes through /etc/resolv.conf).
    #[arg(long, required_unless_present_any = ["idle", "legs"])]
    dial: Option<String>,
    /// Run the leg catalogue from here instead: the legs whose client is `--pod`, against the
    /// manifests of `--registry` (ClusterIPs, pod IPs); legs of other clients, and legs that
    /// change the registry, are skipped.
    #[arg(long, conflicts_with_all = ["dial", "idle"])]
    legs: bool,
    /// With --legs: the pod this runs in (default: $POD_NAME).
    #[arg(long, env = "POD_NAME", requires = "legs")]
    pod: Option<String>,
    /// With --legs: the manifest directory.
    #[arg(long, default_value = "config/examples/mp", requires = "legs")]
    registry: PathBuf,
    /// With --legs: only these legs (repeatable).
    #[arg(long = "leg", requires = "legs")]
    leg: Vec<String>,
    /// With --legs: the mesh domain the daemons serve (their `mesh_domain`, the chart's
    /// `mesh.domain`): the legs name services `<svc>.<ns>.<mesh-domain>`. Not tied to --legs,
    /// so that `AETHER_MESH_DOMAIN` in a pod's environment breaks no other probe.
    #[arg(long, default_value = "aether.internal", env = "AETHER_MESH_DOMAIN")]
    mesh_domain: String,
    /// Send HTTP/1.1 (the default).
    #[arg(long)]
    http1: bool,
    /// Send HTTP/1.0.
    #[arg(long)]
    http10: bool,
    /// Send HTTP/2 with prior knowledge (h2c).
    #[arg(long)]
    h2c: bool,
    /// Send these bytes (`\r`, `\n`, `\t`, `\xHH` escapes) and print what comes back.
    #[arg(long)]
    raw: Option<String>,
    /// Send nothing: wait for the server to speak first.
    #[arg(long)]
    wait: bool,
    /// Send a TLS ClientHello with this server name.
    #[arg(long)]
    tls: Option<String>,
    /// Send one UDP datagram with this text (escapes as for --raw).
    #[arg(long)]
    udp: Option<String>,
    /// Make a unary gRPC call over h2c (tonic) with an `aether.echo.v1.EchoRequest`: --method
    /// names it (`pkg.Service/Method`), each --header is request metadata, the first --host is
    /// the `:authority`. Prints the HTTP status, `x-aether-error`, `grpc-status`, `grpc-message`
    /// and the echo's reply (docs/grpc.md).
    #[arg(long)]
    grpc: bool,
    /// With --grpc: ask the echo to answer this gRPC status code (0-16) instead of a reply.
    #[arg(long, requires = "grpc")]
    grpc_status: Option<i32>,
    /// With --grpc-status: the status message to ask for.
    #[arg(long, requires = "grpc_status")]
    grpc_message: Option<String>,
    /// A `Host` field (repeatable; default: the dialled authority, port left out for 80). With
    /// --grpc, the first one is the `:authority`.
    #[arg(long, conflicts_with = "no_host")]
    host: Vec<String>,
    /// Send no `Host` field.
    #[arg(long)]
    no_host: bool,
    /// The request path (for CONNECT, an authority; default: the dialled one).
    #[arg(long, default_value = "/")]
    path: String,
    /// The request method (default GET); with --grpc, the gRPC method `pkg.Service/Method`
    /// (default `aether.echo.v1.Echo/Echo`; the echo answers any).
    #[arg(long)]
    method: Option<String>,
    /// Send the request in absolute form, `http://<authority>/<path>` (overrides --path).
    #[arg(long)]
    absolute: Option<String>,
    /// A request header, `name:value` (repeatable).
    #[arg(long = "header")]
    headers: Vec<String>,
    /// How many requests. With more than one, a summary follows the answers: answers by
    /// echo identity and pod, by status, gRPC status and `x-aether-error`, and the errors.
    #[arg(long, default_value_t = 1)]
    count: usize,
    /// At most this many requests in flight.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Keep connections: HTTP/1.1 keeps one per concurrent request and reuses it; h2c and
    /// --grpc multiplex every request on one HTTP/2 connection. Without it, one connection
    /// per request.
    #[arg(long)]
    keep_alive: bool,
    /// The bound on each attempt, in seconds.
    #[arg(long, default_value_t = 3.0)]
    timeout: f64,
    /// For --raw, --wait and --tls: stop reading after this many lines (default: after 500 ms
    /// without a byte).
    #[arg(long)]
    lines: Option<usize>,
    /// Output format: one line per answer, or one JSON Outcome per line (and with --count > 1,
    /// the summary last, as `{"summary": {...}}`).
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    output: ProbeOutput,
}

pub(crate) fn probe_from_args(
    args: &ProbeArgs,
    dial: &str,
) -> anyhow::Result<aether_lab::workload::probe::Probe> {
    use aether_lab::workload::probe::{
        Dial, GrpcRequest, Host, HttpRequest, HttpVersion, Probe, ReadUntil, Send, Target, unescape,
    };
    let dial = Dial::parse(dial)?;
    let mut headers = Vec::new();
    for h in &args.headers {
        let Some((k, v)) = h.split_once(':') else {
            bail!("--header {h:?}: expected name:value");
        };
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    let method = args.method.clone();
    let send = if args.grpc {
        let mut g = GrpcRequest::default();
        if let Some(m) = method {
            g.method = m;
        }
        g.authority = args.host.first().cloned();
        g.headers = headers;
        g.status = args
            .grpc_status
            .map(|c| (c, args.grpc_message.clone().unwrap_or_default()));
        Send::Grpc(g)
    } else if let Some(raw) = &args.raw {
        Send::Raw(unescape(raw))
    } else if args.wait {
        Send::Nothing
    } else if let Some(sni) = &args.tls {
        Send::TlsClientHello { sni: sni.clone() }
    } else if let Some(text) = &args.udp {
        Send::Udp(unescape(text))
    } else {
        let method = method.unwrap_or_else(|| "GET".to_owned());
        let target = if let Some(url) = &args.absolute {
            Target::Absolute(url.clone())
        } else if method.eq_ignore_ascii_case("CONNECT") {
            Target::Authority(if args.path.starts_with('/') {
                dial.authority()
            } else {
                args.path.clone()
            })
        } else {
            Target::Origin(args.path.clone())
        };
        Send::Http(HttpRequest {
            version: if args.http10 {
                HttpVersion::Http10
            } else if args.h2c {
                HttpVersion::H2c
            } else {
                HttpVersion::Http11
            },
            method,
            target,
            host: if args.no_host {
                Host::None
            } else if args.host.is_empty() {
                Host::Default
            } else {
                Host::Values(args.host.clone())
            },
            headers,
            body: Vec::new(),
        })
    };
    let mut probe = Probe::new(dial, send);
    probe.timeout = std::time::Duration::try_from_secs_f64(args.timeout)
        .with_context(|| format!("--timeout {}", args.timeout))?;
    probe.until = match args.lines {
        Some(n) => ReadUntil::Lines(n),
        None => ReadUntil::Idle(std::time::Duration::from_millis(500)),
    };
    Ok(probe)
}

/// `aether probe --legs`: the catalogue from inside one client pod (the kind suite's way in).
#[allow(clippy::print_stdout)] // The command's output.
pub(crate) async fn run_probe_legs(args: &ProbeArgs) -> anyhow::Result<ExitCode> {
    let pod = args
        .pod
        .clone()
        .context("--legs needs --pod or $POD_NAME: the client pod it runs in")?;
    let mut snapshot = aether::registry::file::load_dir(&args.registry)
        .with_context(|| format!("read {}", args.registry.display()))?
        .snapshot;
    registrar::complete_snapshot(&mut snapshot, "10.96.0.0/16".parse()?);
    let here = std::sync::Arc::new(aether::netns::Netns::current()?);
    let env = aether_lab::legs::Env {
        home: here.clone(),
        clients: [(pod, here)].into_iter().collect(),
        snapshot,
        mesh_domain: domain_arg(&args.mesh_domain),
        registry: None,
        ca_dir: None,
        restart: None,
        upgrade: None,
        kill: None,
        retire: None,
        installers: None,
        missing: Default::default(),
    };
    let only = (!args.leg.is_empty()).then_some(args.leg.as_slice());
    let results = aether_lab::legs::run(&env, only).await;
    print!("{}", aether_lab::legs::table(&results));
    Ok(if results.iter().all(|r| r.ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

pub(crate) fn run_probe(args: &ProbeArgs) -> anyhow::Result<ExitCode> {
    use aether_lab::workload::probe::{Connector, Many, Resolver, idle};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the runtime")?;
    if args.legs {
        return rt.block_on(run_probe_legs(args));
    }
    let Some(dial) = &args.dial else {
        rt.block_on(idle()).context("wait for a signal")?;
        return Ok(ExitCode::SUCCESS);
    };
    let probe = probe_from_args(args, dial)?;
    let resolver = std::fs::read_to_string("/etc/resolv.conf")
        .map(|t| Resolver::parse_resolv_conf(&t))
        .unwrap_or_default();
    let connector = Connector::current();
    let many = Many {
        count: args.count,
        concurrency: args.concurrency,
        keep_alive: args.keep_alive,
    };
    let mut all_answered = true;
    let mut print_error = None;
    let summary = rt.block_on(
        probe.run_many_each(&connector, &resolver, many, |i, outcome| {
            all_answered &= outcome.connected || outcome.udp_from.is_some();
            let line = match args.output {
                ProbeOutput::Text => format!("{i}: {}", outcome.summary()),
                ProbeOutput::Json => match serde_json::to_string(outcome) {
                    Ok(line) => line,
                    Err(e) => {
                        print_error.get_or_insert(e);
                        return;
                    }
                },
            };
            #[allow(clippy::print_stdout)] // The command's output.
            {
                println!("{line}");
            }
        }),
    )?;
    if let Some(e) = print_error {
        return Err(e.into());
    }
    if args.count > 1 {
        let text = match args.output {
            ProbeOutput::Text => summary.render(),
            ProbeOutput::Json => {
                serde_json::to_string(&serde_json::json!({ "summary": summary }))? + "\n"
            }
        };
        #[allow(clippy::print_stdout)] // The command's output.
        {
            print!("{text}");
        }
    }
    Ok(if all_answered {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
