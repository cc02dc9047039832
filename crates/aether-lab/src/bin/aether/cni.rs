//! `aether cni`: the CNI plugin the runtime runs, and its install and uninstall.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Subcommand;

use crate::node::init_logs;
use crate::term_or_interrupt;

#[derive(Debug, clap::Args)]
pub(crate) struct CniArgs {
    /// Without a subcommand: the plugin itself (CNI_COMMAND and the rest in the environment,
    /// the network configuration on stdin).
    #[command(subcommand)]
    command: Option<CniCommand>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum CniCommand {
    /// Copy this binary to `<bin-dir>/aether-cni` and chain it last in the node's primary
    /// conflist; with --watch keep it there, and at SIGTERM take it out only when the
    /// DaemonSet named by --daemonset is gone or being deleted (an uninstall).
    Install(CniInstallArgs),
    /// Take `aether-cni` out of the node's primary conflist (after an uninstall that left it:
    /// docs/kubernetes.md, "Uninstall"). On a node, `/opt/cni/bin/aether-cni uninstall`.
    Uninstall(CniUninstallArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct CniUninstallArgs {
    /// The node's CNI configuration directory (the host's /etc/cni/net.d).
    #[arg(long, env = "AETHER_CNI_CONF_DIR", default_value = "/etc/cni/net.d")]
    conf_dir: PathBuf,
}

#[derive(Debug, clap::Args)]
pub(crate) struct CniInstallArgs {
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

/// `aether cni`: the plugin (no subcommand), or its install or uninstall.
pub(crate) fn run(args: &CniArgs) -> anyhow::Result<ExitCode> {
    match &args.command {
        None => Ok(run_cni_plugin()),
        Some(CniCommand::Install(args)) => run_cni_install(args),
        Some(CniCommand::Uninstall(args)) => run_cni_uninstall(args),
    }
}

/// `aether cni`: the plugin. What it prints is the CNI protocol's; notes go to stderr, which
/// the runtime logs.
pub(crate) fn run_cni_plugin() -> ExitCode {
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

pub(crate) fn run_cni_install(args: &CniInstallArgs) -> anyhow::Result<ExitCode> {
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

pub(crate) fn run_cni_uninstall(args: &CniUninstallArgs) -> anyhow::Result<ExitCode> {
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
