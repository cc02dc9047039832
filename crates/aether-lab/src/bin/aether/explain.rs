//! `aether explain` (one connection or request answered as the daemon would, offline) and
//! `aether debug` (the daemon's admin socket).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::ValueEnum;

use aether::explain::{explain, render_table};
use aether_core::model::{NodeContext, compile, registrar};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Output {
    Table,
    Json,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ExplainArgs {
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
pub(crate) fn domain_arg(flag: &str) -> String {
    flag.trim_end_matches('.').to_ascii_lowercase()
}

/// The snapshot and model `aether explain` answers from: a registry directory compiled for
/// every node, or a config dump's compile inputs (with the generation it gave the daemon).
pub(crate) fn explain_inputs(
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

pub(crate) fn run_explain(args: &ExplainArgs) -> anyhow::Result<ExitCode> {
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
pub(crate) fn run_debug(args: &aether::debug::client::DebugArgs) -> anyhow::Result<ExitCode> {
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
