//! The `aether` binary: argv and environment in, subcommands out. `anyhow` lives here only.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};

use aether::explain::{explain, render_table};
use aether_core::model::{NodeContext, compile, registrar};

/// aether: a node-local service mesh in which a service is addressed by its real ports.
#[derive(Debug, Parser)]
#[command(name = "aether", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Answer one connection or request exactly as the daemon would, and say what decided it.
    Explain(ExplainArgs),
    /// Ask the daemon of this node (its admin socket): pods, services, explain, routes,
    /// certificates, metrics, capture rules, the log filter, a config dump (docs/debug.md).
    Debug(aether::debug::client::DebugArgs),
    /// The echo workload: every listener answers with its workload name and its own port.
    Echo(EchoArgs),
    /// The e2e client: HTTP/1.x, h2c, gRPC, raw TCP, TLS or UDP from where it runs, one request
    /// or many (concurrent, on kept connections), and what came back.
    Probe(ProbeArgs),
    /// The node daemon: capture, the data plane and the mesh hop for this node's pods.
    Node(Box<aether::node::config::NodeArgs>),
    /// The CNI plugin (run by the container runtime, chained after the primary CNI; the same
    /// binary run as `aether-cni` is this), or `aether cni install` (docs/cni.md).
    Cni(CniArgs),
    /// A whole mesh on this machine (root): pods as network namespaces, two daemons, the
    /// legs of spec/legs.md run through it; then it stays up until Ctrl-C,
    /// SIGTERM or SIGHUP, and cleans up (on those signals in every phase).
    Demo(DemoArgs),
    /// The local lab's stand-in for a Kubernetes API server (a test fixture, not for
    /// production): serves a manifest directory over plain HTTP to daemons on the Kubernetes
    /// source (docs/demo.md, "On the Kubernetes source").
    LabApiserver(LabApiserverArgs),
}

#[derive(Debug, clap::Args)]
struct CniArgs {
    /// Without a subcommand: the plugin itself (CNI_COMMAND and the rest in the environment,
    /// the network configuration on stdin).
    #[command(subcommand)]
    command: Option<CniCommand>,
}

#[derive(Debug, Subcommand)]
enum CniCommand {
    /// Copy this binary to `<bin-dir>/aether-cni` and chain it last in the node's primary
    /// conflist; with --watch keep it there, and at SIGTERM take it out only when the
    /// DaemonSet named by --daemonset is gone or being deleted (an uninstall).
    Install(CniInstallArgs),
    /// Take `aether-cni` out of the node's primary conflist (after an uninstall that left it:
    /// docs/kubernetes.md, "Uninstall"). On a node, `/opt/cni/bin/aether-cni uninstall`.
    Uninstall(CniUninstallArgs),
}

#[derive(Debug, clap::Args)]
struct CniUninstallArgs {
    /// The node's CNI configuration directory (the host's /etc/cni/net.d).
    #[arg(long, env = "AETHER_CNI_CONF_DIR", default_value = "/etc/cni/net.d")]
    conf_dir: PathBuf,
}

#[derive(Debug, clap::Args)]
struct CniInstallArgs {
    /// The node's CNI plugin directory (the host's /opt/cni/bin).
    #[arg(long, env = "AETHER_CNI_BIN_DIR", default_value = "/opt/cni/bin")]
    bin_dir: PathBuf,
    /// The node's CNI configuration directory (the host's /etc/cni/net.d).
    #[arg(long, env = "AETHER_CNI_CONF_DIR", default_value = "/etc/cni/net.d")]
    conf_dir: PathBuf,
    /// Keep watching the configuration directory: re-insert the plugin when the primary CNI
    /// rewrites its file. On SIGTERM or SIGINT the entry is taken out only when the DaemonSet
    /// of --daemonset is gone or being deleted; otherwise (a rollout, no answer, no
    /// --daemonset) it stays, so that pods created meanwhile wait for a daemon.
    #[arg(long)]
    watch: bool,
    /// The DaemonSet whose pods run this installer (in --release-namespace), asked for at stop.
    #[arg(long, env = "AETHER_CNI_DAEMONSET", requires = "release_namespace")]
    daemonset: Option<String>,
    /// The DaemonSet's namespace (the chart's release namespace).
    #[arg(long, env = "AETHER_RELEASE_NAMESPACE")]
    release_namespace: Option<String>,
    /// The node this runs on, named in the User-Agent of its requests to the API server.
    #[arg(long, env = "AETHER_NODE_NAME")]
    node_name: Option<String>,
    /// The plugin's own keys, as a JSON object (`socket`, `ignoredNamespaces`, `timeoutSecs`);
    /// `type` is always `aether-cni`.
    #[arg(long, env = "AETHER_CNI_PLUGIN_CONFIG", default_value = "{}")]
    plugin_config: String,
    /// Log filter.
    #[arg(long, env = "AETHER_LOG", default_value = "info")]
    log_level: String,
}

/// `aether cni`: the plugin. What it prints is the CNI protocol's; notes go to stderr, which
/// the runtime logs.
fn run_cni_plugin() -> ExitCode {
    use std::io::Write as _;
    let out = aether::cni::plugin::run();
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(out.stdout.as_bytes());
    let _ = stdout.flush();
    if let Some(note) = &out.note {
        let _ = writeln!(std::io::stderr(), "{note}");
    }
    ExitCode::from(out.exit)
}

/// A future that resolves on SIGTERM or Ctrl-C (install it inside the runtime).
fn term_or_interrupt() -> anyhow::Result<impl Future<Output = ()>> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("install the SIGTERM handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    })
}

fn run_cni_install(args: &CniInstallArgs) -> anyhow::Result<ExitCode> {
    use aether::cni::{conflist, install, owner};
    init_logs(aether::node::config::LogFormat::Text, &args.log_level);
    let plugin: serde_json::Value =
        serde_json::from_str(&args.plugin_config).context("--plugin-config is not JSON")?;
    let Some(plugin) = plugin.as_object() else {
        bail!("--plugin-config must be a JSON object");
    };
    let entry = conflist::entry(plugin);
    let exe = std::env::current_exe().context("find this binary")?;
    if install::install_binary(&exe, &args.bin_dir)? {
        tracing::info!(dir = %args.bin_dir.display(), "plugin binary installed");
    }
    if !args.watch {
        match install::apply(&args.conf_dir, &entry)? {
            install::Applied::Written(path) => {
                tracing::info!(file = %path.display(), "aether-cni inserted")
            }
            install::Applied::Unchanged(path) => {
                tracing::info!(file = %path.display(), "aether-cni already chained")
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    std::fs::create_dir_all(&args.conf_dir)
        .with_context(|| format!("create {}", args.conf_dir.display()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the runtime")?;
    runtime.block_on(async {
        let stop = term_or_interrupt()?;
        let daemonset = args.daemonset.as_ref().map(|name| owner::DaemonSetRef {
            name: name.clone(),
            namespace: args.release_namespace.clone().unwrap_or_default(),
        });
        // The client is made at start, so that a configuration that cannot work is logged
        // while the installer runs, not only at its stop.
        // kube's client takes the process's default rustls provider (as in the daemon).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = match &daemonset {
            None => Err("no --daemonset".to_owned()),
            Some(ds) => match aether::registry::kube::client::client(
                args.node_name.as_deref().unwrap_or("unknown-node"),
            )
            .await
            {
                Ok(c) => Ok(c),
                Err(e) => {
                    let why = aether::DisplayChain(&e).to_string();
                    tracing::warn!(daemonset = %ds, error = %why, "no client of the API server: at stop the entry will stay in the CNI configuration");
                    Err(why)
                }
            },
        };
        let at_stop = owner::at_stop(client, daemonset.as_ref());
        install::watch(&args.conf_dir, &entry, stop, at_stop).await?;
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

fn run_cni_uninstall(args: &CniUninstallArgs) -> anyhow::Result<ExitCode> {
    use aether::cni::install;
    init_logs(aether::node::config::LogFormat::Text, "info");
    match install::uninstall(&args.conf_dir)? {
        install::Applied::Written(path) => {
            tracing::info!(file = %path.display(), "aether-cni removed")
        }
        install::Applied::Unchanged(path) => {
            tracing::info!(file = %path.display(), "aether-cni was not chained")
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// The manifest directory.
    #[arg(long, default_value = "config/examples/mp")]
    registry: PathBuf,
    /// The route overlays.
    #[arg(long, default_value = "config/examples/variants")]
    variants: PathBuf,
    /// Where the run keeps state and logs.
    #[arg(long, default_value = "/tmp/aether-demo")]
    run_dir: PathBuf,
    /// Prefix of the node namespaces.
    #[arg(long, default_value = "aen")]
    prefix: String,
    /// Prefix of the pods' network namespaces (empty: the pod names themselves).
    #[arg(long, default_value = "")]
    netns_prefix: String,
    /// Run only these legs (repeatable, e.g. --leg A1 --leg N23).
    #[arg(long = "leg")]
    legs: Vec<String>,
    /// Run the legs this many times in a row on the same mesh (e.g. --leg UPGRADE --repeat 30);
    /// every run is a row of the table.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Run the legs, print the table and exit (non-zero when a leg failed) instead of staying up.
    #[arg(long)]
    check: bool,
    /// Build the mesh and keep it up without running the legs (they are written for the
    /// fixture; another manifest directory has other workloads).
    #[arg(long, conflicts_with_all = ["check", "legs"])]
    no_legs: bool,
    /// Write the leg results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where the daemons read the registry: the manifest directory (`file`), the lab's API
    /// server loaded from it (`kube`: the daemons on the Kubernetes source; issue #9 calls it
    /// `--registry kube`), or a three-member etcd the demo starts, for the rows (`etcd`; issue
    /// #12 calls it `--registry etcd`).
    #[arg(long, value_enum, default_value = "file")]
    registry_source: aether::node::config::RegistrySource,
}

#[derive(Debug, clap::Args)]
struct LabApiserverArgs {
    /// The address to serve the API on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: std::net::SocketAddr,
    /// The manifest directory loaded at start.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Apply every change of the directory, as `kubectl apply` would.
    #[arg(long, requires = "dir")]
    watch_dir: bool,
    /// The control API's unix socket (reload, expire, stop, start, objects, writes).
    #[arg(long)]
    control: Option<PathBuf>,
    /// A JSON file `{"namespace/name": "address"}`: the ClusterIPs Services get at create.
    #[arg(long)]
    cluster_ips: Option<PathBuf>,
    /// The range other Services get their ClusterIPs from.
    #[arg(long, default_value = aether_lab::lab::DEFAULT_SERVICE_CIDR)]
    service_cidr: ipnet::IpNet,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Debug, clap::Args)]
struct ExplainArgs {
    /// A directory of Kubernetes manifests (the file registry).
    #[arg(long, default_value = "config/examples/mp")]
    registry: PathBuf,
    /// Answer from an `aether debug config-dump` document instead of a registry: the model
    /// the daemon served, compiled again from the dump's snapshot and context.
    #[arg(long, conflicts_with_all = ["registry", "mesh_domain", "cluster_domain", "ignored_namespaces", "service_cidr"])]
    config_dump: Option<PathBuf>,
    /// The question.
    #[command(flatten)]
    question: aether::debug::client::ExplainFlags,
    /// Mesh domain.
    #[arg(long, default_value = "aether.internal", env = "AETHER_MESH_DOMAIN")]
    mesh_domain: String,
    /// Cluster domain.
    #[arg(long, default_value = "cluster.local", env = "AETHER_CLUSTER_DOMAIN")]
    cluster_domain: String,
    /// A namespace whose pods the mesh leaves alone (repeatable): unmanaged and unregistered.
    #[arg(long = "ignore-namespace")]
    ignored_namespaces: Vec<String>,
    /// The range ClusterIPs are allocated from where the manifests give none.
    #[arg(long, default_value = "10.96.0.0/16", env = "AETHER_SERVICE_CIDR")]
    service_cidr: ipnet::IpNet,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: Output,
}

/// A domain as a flag gives it, as names are compared: without a trailing dot, lower case.
fn domain_arg(flag: &str) -> String {
    flag.trim_end_matches('.').to_ascii_lowercase()
}

/// The snapshot and model `aether explain` answers from: a registry directory compiled for
/// every node, or a config dump's compile inputs (with the generation it gave the daemon).
fn explain_inputs(
    args: &ExplainArgs,
) -> anyhow::Result<(
    aether_core::model::Snapshot,
    aether_core::model::Model,
    Option<u64>,
)> {
    if let Some(path) = &args.config_dump {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        let dump: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        let inputs = aether::debug::view::compile_inputs(&dump)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let model = compile(&inputs.snapshot, &inputs.context);
        return Ok((inputs.snapshot, model, Some(inputs.generation)));
    }
    let load = aether::registry::file::load_dir(&args.registry)
        .with_context(|| format!("reading the registry {}", args.registry.display()))?;
    for p in &load.problems {
        #[allow(clippy::print_stderr)] // The CLI reports skipped manifests to its user.
        {
            eprintln!("warning: {p}");
        }
    }
    for f in &load.faults {
        #[allow(clippy::print_stderr)] // The CLI reports skipped files to its user.
        {
            eprintln!("warning: {f}");
        }
    }
    let mut snapshot = load.snapshot;
    let mut ctx = NodeContext::default();
    ctx.domains.mesh = domain_arg(&args.mesh_domain);
    ctx.domains.cluster = domain_arg(&args.cluster_domain);
    ctx.ignored_namespaces = args.ignored_namespaces.iter().cloned().collect();
    registrar::complete_snapshot_except(&mut snapshot, args.service_cidr, &ctx.ignored_namespaces);
    let model = compile(&snapshot, &ctx);
    Ok((snapshot, model, None))
}

fn run_explain(args: &ExplainArgs) -> anyhow::Result<ExitCode> {
    let q = args
        .question
        .request()
        .question()
        .map_err(|e| anyhow::anyhow!(e))?;
    let (snapshot, model, generation) = explain_inputs(args)?;
    let e = explain(&snapshot, &model, &q)?;
    let text = match (args.output, generation) {
        (Output::Table, Some(g)) => format!(
            "generation {g} (from the config dump)\n{}",
            render_table(&e)
        ),
        (Output::Table, None) => render_table(&e),
        (Output::Json, _) => serde_json::to_string_pretty(&e)? + "\n",
    };
    #[allow(clippy::print_stdout)] // The command's output.
    {
        print!("{text}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `aether debug`: one request to the local daemon's admin socket, its answer printed.
fn run_debug(args: &aether::debug::client::DebugArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the runtime")?;
    let printed = runtime.block_on(aether::debug::client::run(args))?;
    #[allow(clippy::print_stderr)] // Notes for the operator, apart from the output.
    for note in &printed.notes {
        eprintln!("{note}");
    }
    #[allow(clippy::print_stdout)] // The command's output.
    {
        print!("{}", printed.out);
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, clap::Args)]
struct EchoArgs {
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

fn run_echo(args: &EchoArgs) -> anyhow::Result<ExitCode> {
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
enum ProbeOutput {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("send").args(
    ["http1", "http10", "h2c", "raw", "wait", "tls", "udp", "grpc"]
)))]
struct ProbeArgs {
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

fn probe_from_args(
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
async fn run_probe_legs(args: &ProbeArgs) -> anyhow::Result<ExitCode> {
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

fn run_probe(args: &ProbeArgs) -> anyhow::Result<ExitCode> {
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

/// Install the log subscriber; the handle changes its filter at run time (`aether debug
/// log-level`).
fn init_logs(
    format: aether::node::config::LogFormat,
    level: &str,
) -> aether::log_filter::LogFilter {
    aether::log_filter::init(format, level)
}

fn run_node(args: &aether::node::config::NodeArgs) -> anyhow::Result<ExitCode> {
    let config = args.load()?;
    let logs = init_logs(config.log_format, &config.log_level);
    release_freed_memory_in_background();
    let runtime = node_runtime(config.worker_threads).context("start the runtime")?;
    runtime.block_on(aether::node::run_with_logs(config, logs))?;
    Ok(ExitCode::SUCCESS)
}

/// The daemon's runtime: one thread runs everything with `workers == 1` (no work stealing, so
/// no worker is woken to look for work another already holds: docs/performance.md), else a
/// work-stealing pool of `workers`.
fn node_runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
    }
}

#[allow(clippy::print_stdout)] // The demo's output is its purpose.
fn run_demo(args: &DemoArgs) -> anyhow::Result<ExitCode> {
    init_logs(aether::node::config::LogFormat::Text, "warn");
    if !nix::unistd::Uid::effective().is_root() {
        bail!("the demo builds network namespaces and nftables rules: run it as root");
    }
    let opts = aether_lab::demo::DemoOptions {
        registry: args.registry.clone(),
        variants: args.variants.clone(),
        run_dir: args.run_dir.clone(),
        binary: std::env::current_exe().context("find the aether binary")?,
        prefix: args.prefix.clone(),
        netns_prefix: args.netns_prefix.clone(),
        legs: args.legs.clone(),
        mesh_domain: "aether.internal".into(),
        daemon_args: Vec::new(),
        registry_source: args.registry_source,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the runtime")?;
    runtime.block_on(async {
        // Before anything is made: from here on SIGINT, SIGTERM and SIGHUP end in the cleanup.
        let stop = aether_lab::demo::Stop::on_signals().context("install the signal handlers")?;
        println!(
            "aether demo: building the topology from {}",
            opts.registry.display()
        );
        let running = match aether_lab::demo::up_until(&opts, &stop).await {
            Ok(running) => running,
            Err(aether_lab::demo::DemoError::Interrupted(signal)) => {
                say(format_args!(
                    "Stopped by {signal} while building; removed everything the demo made under {}.",
                    opts.run_dir.display()
                ));
                return anyhow::Ok(signal_exit(signal));
            }
            Err(e) => return Err(e.into()),
        };
        println!("{}", running.summary);
        let results = if args.no_legs {
            println!(
                "\nThe mesh is up (no legs run). It stays up until Ctrl-C or SIGTERM.\n{}",
                aether_lab::demo::try_these(&running)
            );
            stop.wait().await;
            None
        } else {
            println!("Running the legs of spec/legs.md through real sockets...");
            tokio::select! {
                r = async {
                    // The legs start from the registry as the daemons hold it: on etcd each
                    // daemon writes its pods' rows once it has probed them, after the pods
                    // listen, and the other node must have seen them.
                    running.env.settle().await?;
                    let mut all = Vec::new();
                    for _ in 0..args.repeat {
                        all.extend(aether_lab::demo::run_legs(&running, &opts.legs).await);
                    }
                    Ok::<_, String>(all)
                } => Some(r),
                _ = stop.wait() => None,
            }
        };
        let mut code = ExitCode::SUCCESS;
        match &results {
            Some(Err(e)) => {
                say(format_args!("The daemons did not settle before the legs: {e}"));
                code = ExitCode::from(1);
            }
            Some(Ok(results)) => {
                print!("{}", aether_lab::legs::table(results));
                if let Some(path) = &args.json {
                    std::fs::write(path, serde_json::to_string_pretty(results)?)
                        .with_context(|| format!("write {}", path.display()))?;
                }
                if results.iter().any(|r| !r.ok) {
                    code = ExitCode::from(1);
                }
                if !args.check {
                    println!(
                        "\nThe mesh stays up until Ctrl-C or SIGTERM.\n{}",
                        aether_lab::demo::try_these(&running)
                    );
                    stop.wait().await;
                }
            }
            // Staying up is what --no-legs asked for: a signal is its normal end.
            None if args.no_legs => {}
            // The legs were cut short: the run did not finish.
            None => {
                if let Some(signal) = stop.signal() {
                    say(format_args!("Stopped by {signal} while running the legs."));
                    code = signal_exit(signal);
                }
            }
        }
        say(format_args!("Cleaning up..."));
        let run_dir = opts.run_dir.clone();
        running.down().await?;
        say(format_args!(
            "Removed everything the demo made under {}.",
            run_dir.display()
        ));
        anyhow::Ok(code)
    })
}

fn run_lab_apiserver(args: &LabApiserverArgs) -> anyhow::Result<ExitCode> {
    init_logs(aether::node::config::LogFormat::Text, "info");
    let mut settings = aether_lab::lab::apiserver::Settings {
        service_cidr: args.service_cidr,
        ..Default::default()
    };
    if let Some(path) = &args.cluster_ips {
        settings.cluster_ips = aether_lab::lab::apiserver::read_cluster_ips(path)?;
    }
    let opts = aether_lab::lab::apiserver::RunOptions {
        listen: args.listen,
        dir: args.dir.clone(),
        watch_dir: args.watch_dir,
        control: args.control.clone(),
        settings,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the runtime")?;
    runtime.block_on(async {
        let stop = term_or_interrupt()?;
        aether_lab::lab::apiserver::run(opts, stop).await?;
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

/// The shell's convention for a run a signal ended: 128 plus the signal's number.
fn signal_exit(signal: aether_lab::demo::StopSignal) -> ExitCode {
    ExitCode::from(u8::try_from(128 + signal.number()).unwrap_or(u8::MAX))
}

/// A line on stdout that cannot fail: after SIGHUP the terminal may be gone, and `println!`
/// would panic halfway through the cleanup.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout(), "{line}");
}

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// With jemalloc (the default build), start its background thread, which returns freed memory to
/// the system on a timer (jemalloc's decay, 10 s): without it, memory freed after a flood of
/// connections goes back only when later allocations happen to trigger the purge, and an idle
/// daemon keeps its peak (docs/performance.md, "Memory").
fn release_freed_memory_in_background() {
    #[cfg(feature = "jemalloc")]
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!(error = %e, "jemalloc's background thread did not start: freed memory returns to the system only as later allocations purge it");
    }
}

fn main() -> ExitCode {
    // The runtime runs `/opt/cni/bin/<type>`, with no arguments: run as `aether-cni`, this
    // binary is `aether cni`.
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let invoked_as = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .map(str::to_owned);
    if invoked_as.as_deref() == Some(aether::cni::conflist::PLUGIN_TYPE) {
        argv.insert(1, "cni".into());
    }
    let cli = Cli::parse_from(argv);
    let result = match &cli.command {
        Command::Cni(CniArgs { command: None }) => return run_cni_plugin(),
        Command::Cni(CniArgs {
            command: Some(CniCommand::Install(args)),
        }) => run_cni_install(args),
        Command::Cni(CniArgs {
            command: Some(CniCommand::Uninstall(args)),
        }) => run_cni_uninstall(args),
        Command::Explain(args) => run_explain(args),
        Command::Debug(args) => run_debug(args),
        Command::Echo(args) => run_echo(args),
        Command::Probe(args) => run_probe(args),
        Command::Node(args) => run_node(args),
        Command::Demo(args) => run_demo(args),
        Command::LabApiserver(args) => run_lab_apiserver(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            #[allow(clippy::print_stderr)] // The one place errors reach the user.
            {
                eprintln!("aether: {e:#}");
            }
            ExitCode::from(2)
        }
    }
}
