//! `aether demo` and the local e2e suite: a whole mesh on one machine. Every Pod of a manifest
//! directory becomes a network namespace on its node's bridge, every node a daemon process,
//! every pod runs its manifest's command; then the legs of spec/legs.md run through it.
//!
//! Stopping is one path whatever the phase: SIGINT, SIGTERM and SIGHUP are caught by [`Stop`]
//! (never left to their default, which would kill the demo and leave its namespaces and
//! processes behind); [`up_until`] checks it between its steps and while it waits, and takes
//! down what it made before returning [`DemoError::Interrupted`]; the caller takes a
//! [`Running`] mesh down with [`Running::down`]. A signal after the first is logged and
//! ignored, so that the cleanup it would interrupt always completes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::lab::plan::{APISERVER_IP, APISERVER_PORT, RELEASE_NAMESPACE};
use crate::lab::run::{Lab, UpOptions};
use crate::lab::{LabError, plan::LabOptions, plan_dir};
use crate::legs::{self, Env, LegResult, RegistryControl};
use aether::node::config::RegistrySource;

/// What the demo runs on.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The manifest directory (copied into the run directory, where the daemons watch it).
    pub registry: PathBuf,
    /// The route overlays (`config/examples/variants`).
    pub variants: PathBuf,
    /// Where the run keeps its state, logs and the copy of the registry.
    pub run_dir: PathBuf,
    /// The `aether` binary started for daemons and pods.
    pub binary: PathBuf,
    /// Prefix of the node namespaces.
    pub prefix: String,
    /// Prefix of the pods' namespaces.
    pub netns_prefix: String,
    /// Only these legs (all when empty).
    pub legs: Vec<String>,
    /// The mesh domain.
    pub mesh_domain: String,
    /// Extra arguments for every daemon (e.g. `--log-format json`).
    pub daemon_args: Vec<String>,
    /// Where the daemons read the registry: the manifest directory itself (`file`), the lab's
    /// API server loaded from it (`kube`, [`crate::lab::apiserver`]), or the lab's etcd for the
    /// rows and the directory for the rest (`etcd`, [`crate::lab::etcd::EtcdControl`]).
    pub registry_source: RegistrySource,
}

impl DemoOptions {
    /// The acceptance fixture of the checkout at `root` (`config/examples/mp` and its
    /// variants), in `run_dir`, with node namespaces `<prefix>-node-*` and pod namespaces
    /// `<prefix>-*`, every leg, the default mesh domain: what the benchmarks bring up.
    pub fn fixture(root: &Path, run_dir: PathBuf, binary: PathBuf, prefix: &str) -> Self {
        Self {
            registry: root.join("config/examples/mp"),
            variants: root.join("config/examples/variants"),
            run_dir,
            binary,
            prefix: prefix.to_owned(),
            netns_prefix: format!("{prefix}-"),
            legs: Vec::new(),
            mesh_domain: "aether.internal".into(),
            daemon_args: Vec::new(),
            registry_source: RegistrySource::File,
        }
    }
}

/// The demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The topology failed.
    #[error(transparent)]
    Lab(#[from] LabError),
    /// A file operation failed.
    #[error("{what} {path}")]
    Io {
        /// What was attempted.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The CA could not be created.
    #[error(transparent)]
    Identity(#[from] aether::identity::IdentityError),
    /// A daemon did not become ready.
    #[error("daemon of {node} not ready after {secs} s: {detail} (log: {log})")]
    NotReady {
        /// The node.
        node: String,
        /// The bound.
        secs: u64,
        /// The last answer.
        detail: String,
        /// Its log file.
        log: PathBuf,
    },
    /// A signal stopped the demo before the mesh was up; what was made has been removed.
    #[error("stopped by {0} while bringing the mesh up")]
    Interrupted(StopSignal),
    /// The lab's API server did not answer its control socket in time.
    #[error("the lab's API server did not answer within {secs} s: {detail} (log: {log})")]
    ApiServerNotReady {
        /// The bound.
        secs: u64,
        /// The last answer.
        detail: String,
        /// Its log file.
        log: PathBuf,
    },
    /// A pod's workload did not start listening.
    #[error("pod {pod} not listening on {port}: {detail}")]
    PodNotListening {
        /// The pod.
        pod: String,
        /// The port.
        port: u16,
        /// What happened.
        detail: String,
    },
}

/// A signal that stops the demo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM (`kill`, a supervisor, `timeout`).
    Terminate,
    /// SIGHUP (the terminal went away).
    Hangup,
}

impl StopSignal {
    /// The signal's number (the demo exits with 128 plus this when it interrupted the run).
    pub fn number(self) -> i32 {
        match self {
            Self::Interrupt => nix::sys::signal::Signal::SIGINT as i32,
            Self::Terminate => nix::sys::signal::Signal::SIGTERM as i32,
            Self::Hangup => nix::sys::signal::Signal::SIGHUP as i32,
        }
    }
}

impl std::fmt::Display for StopSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Interrupt => "SIGINT",
            Self::Terminate => "SIGTERM",
            Self::Hangup => "SIGHUP",
        })
    }
}

/// Whether, and by which signal, the demo was told to stop.
///
/// 1. [`Stop::on_signals`] installs the handlers (inside the runtime, before anything is made)
///    and spawns the task that records the first signal.
/// 2. The demo passes it to [`up_until`], and races its other phases against [`Stop::wait`].
/// 3. [`Stop::signal`] afterwards says whether a signal ended the run.
///
/// Once installed, the handlers stay for the life of the process (tokio never restores the
/// default action), so a second SIGINT, SIGTERM or SIGHUP cannot kill the demo halfway through
/// its cleanup: it is logged and ignored. Only SIGKILL can; then the next run's
/// [`Lab::cleanup_stale`] removes what the state file recorded.
#[derive(Clone, Debug)]
pub struct Stop {
    signal: watch::Receiver<Option<StopSignal>>,
    /// Set with the first signal; [`Lab::up`] polls it between its commands.
    flag: Arc<AtomicBool>,
}

impl Stop {
    /// Catches SIGINT, SIGTERM and SIGHUP from now on. Must be called inside a tokio runtime.
    pub fn on_signals() -> std::io::Result<Self> {
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let mut hup = signal(SignalKind::hangup())?;
        let (tx, rx) = watch::channel(None);
        let flag = Arc::new(AtomicBool::new(false));
        let set = flag.clone();
        tokio::spawn(async move {
            loop {
                let got = tokio::select! {
                    Some(()) = int.recv() => StopSignal::Interrupt,
                    Some(()) = term.recv() => StopSignal::Terminate,
                    Some(()) = hup.recv() => StopSignal::Hangup,
                    else => return,
                };
                if let Some(first) = *tx.borrow() {
                    tracing::warn!(
                        signal = %got,
                        first = %first,
                        "demo: already stopping; the signal is ignored so that the cleanup completes"
                    );
                    continue;
                }
                // The signal first, then the flag: whoever sees the flag finds the signal.
                tx.send_replace(Some(got));
                set.store(true, Ordering::SeqCst);
            }
        });
        Ok(Self { signal: rx, flag })
    }

    /// A stop no signal sets: for callers that leave signals at their default (the bench).
    pub fn never() -> Self {
        // The sender is dropped at once: `wait` then waits forever, `signal` stays `None`.
        let (_, rx) = watch::channel(None);
        Self {
            signal: rx,
            flag: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The first signal, if one came.
    pub fn signal(&self) -> Option<StopSignal> {
        *self.signal.borrow()
    }

    /// Waits for the first signal (returns at once if it came already).
    pub async fn wait(&self) -> StopSignal {
        let mut rx = self.signal.clone();
        loop {
            if let Some(s) = *rx.borrow_and_update() {
                return s;
            }
            if rx.changed().await.is_err() {
                // The sender is gone and never sent: no signal will come.
                std::future::pending::<()>().await;
            }
        }
    }

    /// `Err(Interrupted)` once a signal came.
    fn check(&self) -> Result<(), DemoError> {
        self.signal()
            .map_or(Ok(()), |s| Err(DemoError::Interrupted(s)))
    }

    /// Runs `fut` unless a signal comes first.
    async fn guard<T>(&self, fut: impl Future<Output = T>) -> Result<T, DemoError> {
        tokio::select! {
            s = self.wait() => Err(DemoError::Interrupted(s)),
            r = fut => Ok(r),
        }
    }
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DemoError {
    let path = path.to_path_buf();
    move |source| DemoError::Io { what, path, source }
}

/// A running mesh: the topology and where its daemons answer.
#[derive(Debug)]
pub struct Running {
    /// The topology (taken down by [`Running::down`], or when the last handle drops). Shared
    /// with the legs' daemon-restart hook.
    pub lab: Arc<tokio::sync::Mutex<Option<Lab>>>,
    /// The run directory.
    pub run_dir: PathBuf,
    /// The legs' environment.
    pub env: Env,
    /// The summary of nodes and pods.
    pub summary: String,
    /// Prefix of the pods' namespaces.
    pub netns_prefix: String,
    /// The `aether` binary the mesh runs, which the commands to try call by its path (it is
    /// not on `PATH` after `scripts/demo`).
    pub binary: PathBuf,
}

impl Running {
    /// Take everything down.
    pub async fn down(self) -> Result<(), DemoError> {
        let lab = self.lab.lock().await.take();
        if let Some(lab) = lab {
            tokio::task::spawn_blocking(move || lab.down())
                .await
                .map_err(|e| io("take down", &self.run_dir)(std::io::Error::other(e)))??;
        }
        Ok(())
    }
}

fn copy_dir(from: &Path, to: &Path) -> Result<(), DemoError> {
    std::fs::create_dir_all(to).map_err(io("create", to))?;
    for e in std::fs::read_dir(from).map_err(io("read", from))?.flatten() {
        let p = e.path();
        if p.is_file() && p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            let dest = to.join(e.file_name());
            std::fs::copy(&p, &dest).map_err(io("copy", &p))?;
        }
    }
    Ok(())
}

/// The ports a pod's echo command listens on (TCP), to wait for.
fn listening_ports(argv: &[String]) -> Vec<u16> {
    argv.windows(2)
        .filter(|w| {
            matches!(
                w[0].as_str(),
                "--http" | "--tcp" | "--server-first" | "--authz" | "--grpc"
            )
        })
        .filter_map(|w| w[1].parse().ok())
        .collect()
}

/// Build the topology, start the daemons and the pods, and wait until all answer; signals are
/// not watched (see [`up_until`]).
pub async fn up(opts: &DemoOptions) -> Result<Running, DemoError> {
    up_until(opts, &Stop::never()).await
}

/// Build the topology, start the daemons and the pods, and wait until all answer, unless `stop`
/// fires first.
///
/// When `stop` fires first (checked between the steps, and while waiting for the daemons and
/// the pods), or a step fails, everything made so far is taken down before the error
/// ([`DemoError::Interrupted`] for a signal) is returned. Should the take-down itself fail, its
/// error is returned instead (the original one is logged): what is left behind matters more.
pub async fn up_until(opts: &DemoOptions, stop: &Stop) -> Result<Running, DemoError> {
    let run_dir = opts.run_dir.clone();
    let grace = Duration::from_secs(3);
    let stale = run_dir.clone();
    tokio::task::spawn_blocking(move || Lab::cleanup_stale(&stale, grace))
        .await
        .map_err(|e| io("clean up", &run_dir)(std::io::Error::other(e)))??;
    stop.check()?;
    // A run directory used again (the e2e suites keep one each) starts with fresh logs; the
    // last run's stay beside them as `logs.previous`.
    let logs = run_dir.join("logs");
    if logs.exists() {
        let previous = run_dir.join("logs.previous");
        let _ = std::fs::remove_dir_all(&previous);
        std::fs::rename(&logs, &previous).map_err(io("keep the last run's logs", &logs))?;
    }
    let registry = run_dir.join("registry");
    let _ = std::fs::remove_dir_all(&registry);
    copy_dir(&opts.registry, &registry)?;
    // The CNI installers' conflists (K-ROLLOUT) start from the primary alone in every run.
    let _ = std::fs::remove_dir_all(run_dir.join("cni"));
    let lab_opts = LabOptions {
        prefix: opts.prefix.clone(),
        pod_netns_prefix: opts.netns_prefix.clone(),
        binary: opts.binary.clone(),
        ..LabOptions::default()
    };
    let cidr = crate::lab::DEFAULT_SERVICE_CIDR
        .parse()
        .expect("the default service CIDR is a valid literal");
    let planned = plan_dir(&registry, cidr, &lab_opts)?;
    let summary = planned.plan.render_summary();
    let ca_dir = run_dir.join("ca");
    aether::identity::Ca::load_or_create(&ca_dir)?;
    stop.check()?;
    let plan = planned.plan.clone();
    let mut up_opts = UpOptions::new(run_dir.clone());
    up_opts.interrupt = stop.flag.clone();
    // Not raced against `stop`: Lab::up polls the flag itself and removes what it made.
    let built = tokio::task::spawn_blocking(move || Lab::up(plan, up_opts))
        .await
        .map_err(|e| io("bring up", &run_dir)(std::io::Error::other(e)))?;
    let mut lab = match built {
        Ok(lab) => lab,
        Err(LabError::Interrupted) => {
            stop.check()?;
            return Err(LabError::Interrupted.into());
        }
        Err(e) => return Err(e.into()),
    };
    let started = start(&mut lab, opts, &planned, stop).await;
    let (sockets, argvs, etcd) = match started {
        Ok(s) => s,
        Err(e) => {
            let run_dir = run_dir.clone();
            let down = tokio::task::spawn_blocking(move || lab.down())
                .await
                .map_err(|j| io("take down", &run_dir)(std::io::Error::other(j)))
                .and_then(|r| r.map_err(DemoError::from));
            if let Err(down) = down {
                let cause = aether::DisplayChain(&e);
                tracing::error!(error = %cause, "demo: bringing the mesh up failed; then so did the cleanup");
                return Err(down);
            }
            return Err(e);
        }
    };
    let mut clients = std::collections::BTreeMap::new();
    for pod in &planned.plan.pods {
        if (pod.name.starts_with("mp-client")
            || [
                "ext-http-0",
                "mp-cni-0",
                "mp-multi-1",
                // The endpoint-choice legs stop its hop (src/legs/balance.rs).
                "mp-mixed-1",
                "mp-httponly-0",
                "mp-httponly-1",
                "mp-owned-0",
                "mp-grpc-0",
            ]
            .contains(&pod.name.as_str()))
            && let Some(ns) = lab.pod_netns(&pod.namespace, &pod.name)
        {
            clients.insert(pod.name.clone(), ns);
        }
    }
    // The nodes' own namespaces, as `node:<name>`: where kubelet's probes come from.
    for node in &planned.plan.nodes {
        let path = Path::new(aether::netns::NETNS_DIR).join(&node.netns);
        if let Ok(ns) = aether::netns::Netns::open(&path) {
            clients.insert(format!("node:{}", node.name), Arc::new(ns));
        }
    }
    let home = lab.home();
    let lab = Arc::new(tokio::sync::Mutex::new(Some(lab)));
    let upgrade = upgrade_hook(lab.clone(), argvs.clone());
    let installers = installers_hook(lab.clone(), &argvs, &run_dir);
    let restart = restart_hook(lab.clone(), argvs);
    let kill = kill_hook(lab.clone());
    let retire = retire_hook(lab.clone());
    let env = Env {
        home,
        clients,
        snapshot: planned.snapshot,
        mesh_domain: opts.mesh_domain.clone(),
        registry: Some(RegistryControl {
            dir: registry,
            variants: opts.variants.clone(),
            admin_sockets: sockets.into_iter().map(|(_, s)| s).collect(),
            apiserver: (opts.registry_source == RegistrySource::Kube)
                .then(|| run_dir.join(APISERVER_CONTROL)),
            etcd,
        }),
        ca_dir: Some(ca_dir),
        restart: Some(restart),
        upgrade: Some(upgrade),
        kill: Some(kill),
        retire: Some(retire),
        installers: Some(installers),
        missing: Default::default(),
    };
    Ok(Running {
        lab,
        run_dir: run_dir.clone(),
        env,
        summary,
        netns_prefix: opts.netns_prefix.clone(),
        binary: opts.binary.clone(),
    })
}

/// A node's admin socket, per node.
type Sockets = Vec<(String, PathBuf)>;
/// A node's daemon, per node (for restarts).
type Argvs = std::collections::BTreeMap<String, Daemon>;

/// How a node's daemon was started: what a restart or an upgrade starts again.
#[derive(Clone, Debug)]
struct Daemon {
    /// Its command line.
    argv: Vec<String>,
    /// What its environment adds to the demo's (the kubeconfig on the Kubernetes source).
    env: Vec<(String, String)>,
    /// Its admin socket.
    socket: PathBuf,
}

/// The lab API server's control socket under the run directory.
pub const APISERVER_CONTROL: &str = "apiserver.sock";

/// The run's kubeconfig: the lab's API server over plain HTTP, no credentials.
fn kubeconfig() -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: http://{APISERVER_IP}:{APISERVER_PORT}\n\
         users:\n- name: lab\n  user: {{}}\ncontexts:\n- name: lab\n  context:\n    cluster: lab\n    user: lab\n\
         current-context: lab\n"
    )
}

/// Starts the lab's API server in the underlay namespace, loaded from the run's registry copy
/// (watched), with the planned snapshot's ClusterIPs, writes `<run>/kubeconfig` and waits until
/// the server answers; the environment every daemon then gets.
async fn start_apiserver(
    lab: &mut Lab,
    opts: &DemoOptions,
    planned: &crate::lab::PlannedDir,
    stop: &Stop,
) -> Result<Vec<(String, String)>, DemoError> {
    let run_dir = &opts.run_dir;
    let ips: std::collections::BTreeMap<String, String> = planned
        .snapshot
        .services
        .iter()
        .filter_map(|s| {
            let ip = s.cluster_ips.first()?;
            Some((format!("{}/{}", s.namespace, s.name), ip.to_string()))
        })
        .collect();
    let ips_file = run_dir.join("cluster-ips.json");
    let text = serde_json::to_string_pretty(&ips).unwrap_or_default();
    std::fs::write(&ips_file, text).map_err(io("write", &ips_file))?;
    let config = run_dir.join("kubeconfig");
    std::fs::write(&config, kubeconfig()).map_err(io("write", &config))?;
    let control = run_dir.join(APISERVER_CONTROL);
    let argv: Vec<String> = vec![
        "aether".into(),
        "lab-apiserver".into(),
        "--listen".into(),
        format!("{APISERVER_IP}:{APISERVER_PORT}"),
        "--dir".into(),
        run_dir.join("registry").display().to_string(),
        "--watch-dir".into(),
        "--control".into(),
        control.display().to_string(),
        "--cluster-ips".into(),
        ips_file.display().to_string(),
    ];
    let _ = std::fs::remove_file(&control);
    lab.start_apiserver(&argv)?;
    let bound = Duration::from_secs(30);
    stop.guard(wait_answer(&control, "/lab/fingerprint", bound))
        .await?
        .map_err(|detail| DemoError::ApiServerNotReady {
            secs: bound.as_secs(),
            detail,
            log: run_dir.join("logs").join("apiserver.log"),
        })?;
    Ok(vec![
        ("KUBECONFIG".to_owned(), config.display().to_string()),
        (
            "AETHER_RELEASE_NAMESPACE".to_owned(),
            RELEASE_NAMESPACE.to_owned(),
        ),
    ])
}

/// Starts the daemons, waits for their `/ready`, starts the pods and waits until they listen;
/// each wait gives way to `stop`.
async fn start(
    lab: &mut Lab,
    opts: &DemoOptions,
    planned: &crate::lab::PlannedDir,
    stop: &Stop,
) -> Result<(Sockets, Argvs, Option<Arc<crate::lab::etcd::EtcdControl>>), DemoError> {
    let run_dir = &opts.run_dir;
    let registry = run_dir.join("registry");
    let ca_dir = run_dir.join("ca");
    let mut sockets = Vec::new();
    let mut argvs = std::collections::BTreeMap::new();
    let mut etcd = None;
    let env = match opts.registry_source {
        RegistrySource::File => Vec::new(),
        RegistrySource::Kube => start_apiserver(lab, opts, planned, stop).await?,
        RegistrySource::Etcd => {
            // Three members, so that a fault leg can take the leader away.
            let control = lab.start_etcd(ETCD_MEMBERS)?;
            let endpoints = control.endpoints().join(",");
            etcd = Some(Arc::new(control));
            vec![
                ("AETHER_ETCD_ENDPOINTS".to_owned(), endpoints),
                (
                    "AETHER_ETCD_LEASE_TTL_SECS".to_owned(),
                    crate::lab::etcd::LAB_LEASE_TTL_SECS.to_string(),
                ),
            ]
        }
    };
    let nodes: Vec<String> = planned.plan.nodes.iter().map(|n| n.name.clone()).collect();
    for node in &nodes {
        stop.check()?;
        let state = run_dir.join(format!("node-{node}"));
        let mut argv: Vec<String> = ["aether", "node", "--node-name", node]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        match opts.registry_source {
            RegistrySource::File => {
                argv.extend(["--registry".to_owned(), registry.display().to_string()]);
            }
            RegistrySource::Kube => {
                argv.extend(["--registry-source".to_owned(), "kube".to_owned()]);
            }
            // The rows from etcd, the rest (and this node's pods) from the directory.
            RegistrySource::Etcd => {
                argv.extend([
                    "--registry-source".to_owned(),
                    "etcd".to_owned(),
                    "--registry".to_owned(),
                    registry.display().to_string(),
                ]);
            }
        }
        argv.extend([
            // The per-node metrics endpoint and probe port, in the node's namespace, as the
            // chart's daemon serves it on the node's network (an upgrade hands it over).
            "--metrics-addr".to_owned(),
            format!("0.0.0.0:{LAB_METRICS_PORT}"),
            // The start marker (the chart's is per pod; here the daemons of a node share one,
            // which a successor rewrites once it has taken the sockets: K-ROLLOUT waits for it).
            "--pod-dir".to_owned(),
            run_dir
                .join(format!("node-{node}-pod"))
                .display()
                .to_string(),
            "--state-dir".to_owned(),
            state.display().to_string(),
            "--ca-dir".to_owned(),
            ca_dir.display().to_string(),
            "--mesh-domain".to_owned(),
            opts.mesh_domain.clone(),
            "--netns-prefix".to_owned(),
            opts.netns_prefix.clone(),
        ]);
        argv.extend(opts.daemon_args.iter().cloned());
        lab.start_daemon(node, &argv, &env)?;
        sockets.push((node.clone(), state.join("admin.sock")));
        argvs.insert(
            node.clone(),
            Daemon {
                argv,
                env: env.clone(),
                socket: state.join("admin.sock"),
            },
        );
    }
    for (node, sock) in &sockets {
        stop.guard(wait_ready(sock, Duration::from_secs(30)))
            .await?
            .map_err(|detail| DemoError::NotReady {
                node: node.clone(),
                secs: 30,
                detail,
                log: run_dir.join("logs").join(format!("node-{node}.log")),
            })?;
    }
    stop.check()?;
    lab.start_pods()?;
    for pod in &planned.plan.pods {
        for port in listening_ports(&pod.argv) {
            stop.guard(lab.wait_tcp(&pod.namespace, &pod.name, port, Duration::from_secs(10)))
                .await?
                .map_err(|e| DemoError::PodNotListening {
                    pod: pod.name.clone(),
                    port,
                    detail: aether::DisplayChain(&e).to_string(),
                })?;
        }
    }
    Ok((sockets, argvs, etcd))
}

/// The members of the lab's etcd.
const ETCD_MEMBERS: usize = 3;

/// Poll a daemon's `/ready` until it answers 200, at most `bound`; the last answer otherwise.
async fn wait_ready(sock: &Path, bound: Duration) -> Result<(), String> {
    wait_answer(sock, "/ready", bound).await
}

/// Poll `GET path` on a unix socket until it answers 200, at most `bound`; the last answer
/// otherwise.
async fn wait_answer(sock: &Path, path: &str, bound: Duration) -> Result<(), String> {
    let deadline = aether::time::now() + bound;
    loop {
        match legs::admin_get(sock, path).await {
            Ok(_) => return Ok(()),
            Err(detail) if aether::time::now() > deadline => return Err(detail),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The legs' way to restart a node's daemon: stop it, start it again with the same arguments,
/// wait for its `/ready`.
fn restart_hook(lab: Arc<tokio::sync::Mutex<Option<Lab>>>, argvs: Argvs) -> legs::RestartHook {
    let argvs = Arc::new(argvs);
    legs::RestartHook(Arc::new(move |node: String| {
        let lab = lab.clone();
        let argvs = argvs.clone();
        Box::pin(async move {
            let daemon = argvs
                .get(&node)
                .cloned()
                .ok_or_else(|| format!("no daemon of node {node}"))?;
            let sock = daemon.socket.clone();
            let mut guard = lab.lock_owned().await;
            let restarted = tokio::task::spawn_blocking(move || {
                let lab = guard.as_mut().ok_or("the lab is down")?;
                lab.restart_daemon(&node, &daemon.argv, &daemon.env)
                    .map_err(|e| aether::DisplayChain(&e).to_string())
            })
            .await
            .map_err(|e| e.to_string())?;
            restarted?;
            wait_ready(&sock, Duration::from_secs(30)).await
        })
    }))
}

/// Where each node's daemon serves `/metrics`, `/ready` and `/live`, in the node's namespace
/// (the chart's `ports.metrics`).
pub const LAB_METRICS_PORT: u16 = 15020;

/// The UPGRADE and K-ROLLOUT legs' hook: SIGTERM every daemon of a node but the newest.
fn retire_hook(lab: Arc<tokio::sync::Mutex<Option<Lab>>>) -> legs::RestartHook {
    legs::RestartHook(Arc::new(move |node: String| {
        let lab = lab.clone();
        Box::pin(async move {
            let mut guard = lab.lock().await;
            let lab = guard.as_mut().ok_or("the lab is down")?;
            match lab.retire_daemons(&node) {
                0 => Err(format!("node {node} runs one daemon: none to retire")),
                _ => Ok(()),
            }
        })
    }))
}

/// The K-ROLLOUT leg's CNI installers: `aether cni install --watch --daemonset aether` in a
/// node's namespace (where the lab's API server is reachable), with the daemon's environment
/// (its kubeconfig and release namespace), on `<run>/cni/<node>/net.d` (a primary conflist is
/// written there the first time) and `<run>/cni/<node>/bin`, the plugin told the node's
/// `cni.sock`.
fn installers_hook(
    lab: Arc<tokio::sync::Mutex<Option<Lab>>>,
    argvs: &Argvs,
    run_dir: &Path,
) -> legs::Installers {
    let daemons = Arc::new(argvs.clone());
    let run_dir = run_dir.to_path_buf();
    let starting = lab.clone();
    let start = Arc::new(
        move |node: String| -> legs::InstallerFuture<legs::Installer> {
            let (lab, daemons, run_dir) = (starting.clone(), daemons.clone(), run_dir.clone());
            Box::pin(async move {
                let daemon = daemons
                    .get(&node)
                    .cloned()
                    .ok_or_else(|| format!("no daemon of node {node}"))?;
                let dir = run_dir.join("cni").join(&node);
                let (conf_dir, bin_dir) = (dir.join("net.d"), dir.join("bin"));
                for d in [&conf_dir, &bin_dir] {
                    std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
                }
                let primary = conf_dir.join("10-lab.conflist");
                if !primary.exists() {
                    std::fs::write(&primary, LAB_PRIMARY_CONFLIST)
                        .map_err(|e| format!("{}: {e}", primary.display()))?;
                }
                let plugin = serde_json::json!({
                    "socket": daemon.socket.with_file_name("cni.sock"),
                });
                let argv: Vec<String> = vec![
                    "aether".into(),
                    "cni".into(),
                    "install".into(),
                    "--bin-dir".into(),
                    bin_dir.display().to_string(),
                    "--conf-dir".into(),
                    conf_dir.display().to_string(),
                    "--watch".into(),
                    "--daemonset".into(),
                    "aether".into(),
                    "--plugin-config".into(),
                    plugin.to_string(),
                ];
                let mut guard = lab.lock().await;
                let lab = guard.as_mut().ok_or("the lab is down")?;
                let pid = lab
                    .start_node_process(&node, &format!("cni {node}"), &argv, &daemon.env)
                    .map_err(|e| aether::DisplayChain(&e).to_string())?;
                Ok(legs::Installer {
                    pid,
                    conf_dir,
                    bin_dir,
                })
            })
        },
    );
    let stop = Arc::new(move |pid: u32| -> legs::InstallerFuture<String> {
        let lab = lab.clone();
        Box::pin(async move {
            let mut guard = lab.lock_owned().await;
            tokio::task::spawn_blocking(move || {
                let lab = guard.as_mut().ok_or("the lab is down")?;
                lab.stop_process(pid, Duration::from_secs(15))
                    .map(|status| status.to_string())
                    .ok_or_else(|| format!("no process {pid} of the lab"))
            })
            .await
            .map_err(|e| e.to_string())?
        })
    });
    legs::Installers { start, stop }
}

/// The primary CNI configuration of a lab node's conflist: only read, never run (the lab's
/// pods have their interfaces already); the K-ROLLOUT leg runs the `aether-cni` entry the
/// installer chains after it.
const LAB_PRIMARY_CONFLIST: &str =
    r#"{"cniVersion":"1.0.0","name":"lab","plugins":[{"type":"bridge","bridge":"cni0"}]}"#;

/// The EKILL leg's hook: SIGKILL a node's daemon and leave it dead.
fn kill_hook(lab: Arc<tokio::sync::Mutex<Option<Lab>>>) -> legs::RestartHook {
    legs::RestartHook(Arc::new(move |node: String| {
        let lab = lab.clone();
        Box::pin(async move {
            let mut guard = lab.lock_owned().await;
            tokio::task::spawn_blocking(move || {
                let lab = guard.as_mut().ok_or("the lab is down")?;
                lab.kill_daemon(&node);
                Ok(())
            })
            .await
            .map_err(|e| e.to_string())?
        })
    }))
}

/// The UPGRADE leg's hook: start a node's daemon beside the running one and wait until the new
/// one has taken the listening sockets and serves (it replaces `handoff.sock` then).
fn upgrade_hook(lab: Arc<tokio::sync::Mutex<Option<Lab>>>, argvs: Argvs) -> legs::RestartHook {
    use std::os::unix::fs::MetadataExt;
    let argvs = Arc::new(argvs);
    legs::RestartHook(Arc::new(move |node: String| {
        let lab = lab.clone();
        let argvs = argvs.clone();
        Box::pin(async move {
            let daemon = argvs
                .get(&node)
                .cloned()
                .ok_or_else(|| format!("no daemon of node {node}"))?;
            let sock = daemon.socket.clone();
            let handoff = sock.with_file_name("handoff.sock");
            // The new daemon binds its own handoff socket once it serves: a new file (its inode
            // number may be reused, its change time is not).
            let inode = |p: &Path| {
                std::fs::metadata(p)
                    .map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
                    .ok()
            };
            let before = inode(&handoff).ok_or("the running daemon offers no handoff socket")?;
            let mut guard = lab.lock_owned().await;
            let started = tokio::task::spawn_blocking(move || {
                let lab = guard.as_mut().ok_or("the lab is down")?;
                lab.upgrade_daemon(&node, &daemon.argv, &daemon.env)
                    .map_err(|e| aether::DisplayChain(&e).to_string())
            })
            .await
            .map_err(|e| e.to_string())?;
            started?;
            let deadline = aether::time::now() + Duration::from_secs(30);
            while inode(&handoff).is_none_or(|i| i == before) {
                if aether::time::now() > deadline {
                    return Err("the new daemon did not take over within 30 s".into());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            wait_ready(&sock, Duration::from_secs(30)).await
        })
    }))
}

/// Run the legs on a running mesh.
pub async fn run_legs(running: &Running, only: &[String]) -> Vec<LegResult> {
    let filter = (!only.is_empty()).then_some(only);
    legs::run(&running.env, filter).await
}

/// Commands to try by hand while the demo runs.
pub fn try_these(running: &Running) -> String {
    let mesh = &running.env.mesh_domain;
    let multi = running
        .env
        .cluster_ip("mp", "mp-multi")
        .map(|ip| ip.to_string())
        .unwrap_or_default();
    let p = &running.netns_prefix;
    let bin = running.binary.display();
    format!(
        "Try (as root, in another terminal):\n\
         \x20 ip netns exec {p}mp-client {bin} probe --dial mp-multi.mp.{mesh}:9090\n\
         \x20 ip netns exec {p}mp-client {bin} probe --dial mp-multi.mp.{mesh}:8080 --host mp-multi.mp.{mesh}:9090\n\
         \x20 ip netns exec {p}mp-client-nocapture {bin} probe --dial 127.0.0.1:18081 --host mp-eighty.mp.{mesh}\n\
         \x20 ip netns exec {p}mp-client {bin} probe --dial {multi}:7777\n\
         \x20 ip netns exec {p}mp-client {bin} probe --dial mp-serverfirst.mp.{mesh}:3306 --wait --lines 2\n\
         (with curl installed: ip netns exec {p}mp-client curl -si http://mp-multi.mp.{mesh}:9090/)\n\
         {}\
         Logs: {}/logs\n",
        debug_these(running),
        running.run_dir.display()
    )
}

/// How to call `aether debug` on each node's daemon (docs/debug.md).
fn debug_these(running: &Running) -> String {
    let mesh = &running.env.mesh_domain;
    let sockets = running
        .env
        .registry
        .as_ref()
        .map(|r| r.admin_sockets.as_slice())
        .unwrap_or_default();
    let mut s = String::from("Ask a node's daemon (docs/debug.md), as root:\n");
    for socket in sockets {
        let Some(dir) = socket.parent() else {
            continue;
        };
        let node = dir
            .file_name()
            .map(|n| {
                let n = n.to_string_lossy();
                n.strip_prefix("node-").unwrap_or(&n).to_owned()
            })
            .unwrap_or_default();
        let d = dir.display();
        let bin = running.binary.display();
        s.push_str(&format!(
            "  node {node}:\n\
             \x20   {bin} debug pods --state-dir {d}\n\
             \x20   {bin} debug services mp-multi --state-dir {d}\n\
             \x20   {bin} debug explain --state-dir {d} --from mp/mp-client --dial mp-multi.mp.{mesh}:8080 --host mp-multi.mp.{mesh}:9090\n\
             \x20   {bin} debug config-dump --state-dir {d} > dump.json && {bin} explain --config-dump dump.json --from mp/mp-client --dial mp-multi.mp.{mesh}:8080\n"
        ));
    }
    s
}
