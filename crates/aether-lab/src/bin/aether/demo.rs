//! `aether demo` (a whole mesh on this machine) and `aether lab-apiserver` (the lab's stand-in
//! API server).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::node::init_logs;
use crate::term_or_interrupt;

#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
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
pub(crate) struct LabApiserverArgs {
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

#[allow(clippy::print_stdout)] // The demo's output is its purpose.
pub(crate) fn run_demo(args: &DemoArgs) -> anyhow::Result<ExitCode> {
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

pub(crate) fn run_lab_apiserver(args: &LabApiserverArgs) -> anyhow::Result<ExitCode> {
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
pub(crate) fn signal_exit(signal: aether_lab::demo::StopSignal) -> ExitCode {
    ExitCode::from(u8::try_from(128 + signal.number()).unwrap_or(u8::MAX))
}

/// A line on stdout that cannot fail: after SIGHUP the terminal may be gone, and `println!`
/// would panic halfway through the cleanup.
pub(crate) fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout(), "{line}");
}
