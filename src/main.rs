//! The `aether` binary: argv and environment in, subcommands out. `anyhow` lives here only.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};

use aether::explain::{Bytes, Question, explain, render_table};
use aether::model::{NodeContext, compile, registrar};

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
    /// The calling pod, `<namespace>/<pod>`.
    #[arg(long)]
    from: String,
    /// What the client dials: `<name-or-ip>:<port>` (`127.0.0.1:18081` is the loopback proxy).
    #[arg(long)]
    dial: String,
    /// A `Host` field to send (repeat for several; default: the dialled name and port, the
    /// port left out for 80). An empty value sends no Host field.
    #[arg(long)]
    host: Vec<String>,
    /// Send the request in absolute form (`GET http://<authority>/path`), as an http_proxy does.
    #[arg(long)]
    absolute: Option<String>,
    /// The request path (and query).
    #[arg(long, default_value = "/")]
    path: String,
    /// The request method.
    #[arg(long, default_value = "GET")]
    method: String,
    /// A request header, `name:value` (repeatable).
    #[arg(long = "header")]
    headers: Vec<String>,
    /// What the client sends first: http, http1.0, h2c, tls:<sni>, raw, none; or udp (one datagram).
    #[arg(long, default_value = "http")]
    bytes: Bytes,
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
    /// Entropy for the weighted choice of a route backend (vary it to see each share).
    #[arg(long, default_value_t = 0)]
    entropy: u64,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    output: Output,
}

fn run_explain(args: &ExplainArgs) -> anyhow::Result<ExitCode> {
    let load = aether::registry::file::load_dir(&args.registry)
        .with_context(|| format!("reading the registry {}", args.registry.display()))?;
    for p in &load.problems {
        #[allow(clippy::print_stderr)] // The CLI reports skipped manifests to its user.
        {
            eprintln!("warning: {p}");
        }
    }
    let mut snapshot = load.snapshot;
    let mut ctx = NodeContext::default();
    ctx.domains.mesh = args.mesh_domain.trim_end_matches('.').to_ascii_lowercase();
    ctx.domains.cluster = args
        .cluster_domain
        .trim_end_matches('.')
        .to_ascii_lowercase();
    ctx.ignored_namespaces = args.ignored_namespaces.iter().cloned().collect();
    registrar::complete_snapshot_except(&mut snapshot, args.service_cidr, &ctx.ignored_namespaces);
    let model = compile(&snapshot, &ctx);

    let mut headers = Vec::new();
    for h in &args.headers {
        let Some((k, v)) = h.split_once(':') else {
            bail!("--header {h:?}: expected name:value");
        };
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    // The mesh removes every x-aether- header a client sends before anything reads it (I12).
    headers.retain(|(k, _)| !k.starts_with(aether::resolve::answer::MESH_HEADER_PREFIX));
    let hosts = if args.host.is_empty() {
        None
    } else {
        Some(
            args.host
                .iter()
                .filter(|h| !h.is_empty())
                .cloned()
                .collect(),
        )
    };
    let q = Question {
        from: args.from.clone(),
        dial: args.dial.clone(),
        hosts,
        absolute: args.absolute.clone(),
        method: args.method.clone(),
        path: args.path.clone(),
        headers,
        bytes: args.bytes.clone(),
        entropy: args.entropy,
    };
    let e = explain(&snapshot, &model, &q)?;
    let text = match args.output {
        Output::Table => render_table(&e),
        Output::Json => serde_json::to_string_pretty(&e)? + "\n",
    };
    #[allow(clippy::print_stdout)] // The command's output.
    {
        print!("{text}");
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Explain(args) => run_explain(args),
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
