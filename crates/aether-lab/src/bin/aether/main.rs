//! The `aether` binary: argv and environment in, subcommands out. `anyhow` lives here only.

mod cni;
mod demo;
mod explain;
mod node;
mod workload;

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use cni::CniArgs;
use demo::{DemoArgs, LabApiserverArgs};
use explain::ExplainArgs;
use workload::{EchoArgs, ProbeArgs};

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

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
        Command::Cni(args) => cni::run(args),
        Command::Explain(args) => explain::run_explain(args),
        Command::Debug(args) => explain::run_debug(args),
        Command::Echo(args) => workload::run_echo(args),
        Command::Probe(args) => workload::run_probe(args),
        Command::Node(args) => node::run_node(args),
        Command::Demo(args) => demo::run_demo(args),
        Command::LabApiserver(args) => demo::run_lab_apiserver(args),
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
