//! `aether node`: the daemon's wiring (ARCHITECTURE.md "node"). The only module that starts
//! long-lived tasks and connects the parts: registry → model → proxies, capture, DNS, admin.

pub mod admin;
pub mod config;
pub mod dns;
pub mod pods;
pub mod tls;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::{Mutex, mpsc, watch};
use tracing::{debug, error, info, warn};

use crate::capture::cni::{self, CniCommand, CniRequest};
use crate::dns::table::DnsTable;
use crate::identity::{Ca, Identities, IdentitySettings};
use crate::model::names::Domains;
use crate::model::{Model, NodeContext, compile, registrar};
use crate::netns::Netns;
use crate::proxy::{Inputs, ProxySettings};
use crate::registry::file::load_dir;
use crate::state::ModelHandle;
pub use config::NodeConfig;
use pods::{CniPods, Pods, Shared};

/// The daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A setting is unusable.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The registry could not be read.
    #[error("read the registry {path}")]
    Registry {
        /// The directory.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: crate::registry::file::FileError,
    },
    /// The identity (CA) could not be loaded or created.
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
    /// The daemon's own namespace could not be opened.
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    /// A state-directory path could not be prepared.
    #[error("prepare {path}")]
    StateDir {
        /// The path.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A daemon socket could not be bound.
    #[error(transparent)]
    Cni(#[from] cni::CniError),
}

/// What one load of the registry produced.
struct Loaded {
    model: Model,
    /// The retention state the model was compiled with (spec/model.md §10).
    retained: Vec<crate::model::snapshot::RetainedPort>,
    dns: DnsTable,
    /// The registry's fingerprint, taken before it was read (see `registry::file::fingerprint`).
    fingerprint: u64,
}

fn context(config: &NodeConfig) -> NodeContext {
    NodeContext {
        domains: Domains {
            mesh: config.mesh_domain.clone(),
            cluster: config.cluster_domain.clone(),
        },
        trust_domain: config.trust_domain.clone(),
        node: Some(config.node_name.clone()),
        capture_redirect_all_default: config.capture_redirect_all_default,
        ignored_namespaces: config
            .ignored_namespaces
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>(),
        now_ms: crate::time::wall_ms(),
    }
}

/// Load and compile the registry. `previous` is the model being replaced and its retention
/// state: HTTP entries whose rows vanished with no evidence are retained (model.md §10).
fn load(
    config: &NodeConfig,
    previous: Option<(&Model, &[crate::model::snapshot::RetainedPort])>,
) -> Result<Loaded, NodeError> {
    // Taken first: if the directory changes while it is read, the fingerprint is the older one
    // and the change event brings another load.
    let fingerprint = crate::registry::file::fingerprint(&config.registry).map_err(|source| {
        NodeError::Registry {
            path: config.registry.clone(),
            source,
        }
    })?;
    let loaded = load_dir(&config.registry).map_err(|source| NodeError::Registry {
        path: config.registry.clone(),
        source,
    })?;
    for problem in &loaded.problems {
        warn!(%problem, "registry document skipped");
    }
    let ctx = context(config);
    let mut snapshot = loaded.snapshot;
    let report = registrar::complete_snapshot_except(
        &mut snapshot,
        config.service_cidr,
        &ctx.ignored_namespaces,
    );
    for (ns, name) in &report.collisions {
        info!(namespace = %ns, service = %name, "a user Service owns this mesh service's name");
    }
    if let Some((model, retained)) = previous {
        snapshot.retained =
            crate::model::retention::advance(&model.http_ports(), retained, &snapshot, ctx.now_ms);
    }
    let dns = DnsTable::build(&snapshot, &ctx.domains, config.dns_kubernetes_names);
    let model = compile(&snapshot, &ctx);
    let retained = snapshot.retained.clone();
    Ok(Loaded {
        model,
        retained,
        dns,
        fingerprint,
    })
}

/// Run the daemon until SIGTERM or SIGINT, then drain.
pub async fn run(config: NodeConfig) -> Result<(), NodeError> {
    config.validate()?;
    let state_dir = config.state_dir.clone();
    std::fs::create_dir_all(&state_dir).map_err(|source| NodeError::StateDir {
        path: state_dir.clone(),
        source,
    })?;
    let home = Arc::new(Netns::current()?);
    let first = load(&config, None)?;
    let mut retained = first.retained.clone();
    info!(node = %config.node_name, registry = %config.registry.display(),
        pods = first.model.pods().count(), "registry loaded");
    let handle = Arc::new(ModelHandle::new(first.model));
    let fingerprint = Arc::new(std::sync::atomic::AtomicU64::new(first.fingerprint));
    let dns_table = Arc::new(ArcSwap::from_pointee(first.dns));

    let ca = match (&config.ca_cert, &config.ca_key, &config.ca_dir) {
        (Some(cert), Some(key), _) => Ca::load(cert, key)?,
        (_, _, Some(dir)) => Ca::load_or_create(dir)?,
        _ => Ca::load_or_create(&state_dir.join("ca"))?,
    };
    let identities = Arc::new(
        Identities::new(
            Arc::new(ca),
            IdentitySettings {
                trust_domain: config.trust_domain.clone(),
                mesh_domain: config.mesh_domain.clone(),
                validity: Duration::from_secs(config.cert_lifetime_hours * 3600),
                ..IdentitySettings::default()
            },
        )
        .map_err(crate::identity::IdentityError::from)?,
    );
    let inputs = Arc::new(Inputs {
        model: handle.clone(),
        tls: Arc::new(tls::IdentityTls::new(identities.clone())),
        settings: ProxySettings {
            mesh_domain: config.mesh_domain.clone(),
            trust_domain: config.trust_domain.clone(),
            max_header_bytes: config.max_header_bytes,
            header_read_timeout: Duration::from_millis(config.header_read_timeout_ms),
            http_idle_timeout: Duration::from_secs(config.http_idle_timeout_secs),
            http2_max_concurrent_streams: config.http2_max_concurrent_streams,
            max_header_list_size: config.max_header_list_size,
            max_headers: config.max_headers,
            ..ProxySettings::default()
        },
        pool: crate::proxy::hop::Pool::default(),
        apps: crate::proxy::app_pool::AppPool::default(),
        drain: watch::Sender::new(false),
        stats: crate::proxy::Stats::default(),
    });
    let upstreams = if config.dns_upstreams.is_empty() {
        std::fs::read_to_string("/etc/resolv.conf")
            .map(|t| crate::dns::resolv::parse_resolv_conf(&t))
            .unwrap_or_default()
    } else {
        config.dns_upstreams.clone()
    };
    // A loopback upstream would be the pod's own mesh DNS: never forward there.
    let upstreams: Vec<_> = upstreams
        .into_iter()
        .filter(|a| !a.ip().is_loopback())
        .collect();
    let shared = Shared {
        inputs: inputs.clone(),
        home,
        dns: dns::DnsShared {
            table: dns_table.clone(),
            upstreams,
        },
    };

    let pods = Arc::new(Mutex::new(Pods::default()));
    let cni_pods = Arc::new(Mutex::new(CniPods::new()));
    let (ready_tx, ready_rx) = watch::channel(false);

    // The first reconcile: every local pod (present = desired). Ready only once every local
    // pod is served; failed pods are retried.
    let all_served = reconcile(&config, &shared, &pods, &cni_pods).await;
    let _ = ready_tx.send(all_served);
    let mut retry = tokio::time::interval(Duration::from_secs(2));
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    // Admin: /ready, /live, /metrics, /pods, /model.
    let admin = admin::Admin {
        inputs: inputs.clone(),
        pods: pods.clone(),
        ready: ready_rx,
        node: config.node_name.clone(),
        fingerprint: fingerprint.clone(),
    };
    let admin = Arc::new(admin);
    let admin_sock = state_dir.join("admin.sock");
    let _ = std::fs::remove_file(&admin_sock);
    let unix =
        tokio::net::UnixListener::bind(&admin_sock).map_err(|source| NodeError::StateDir {
            path: admin_sock.clone(),
            source,
        })?;
    tokio::spawn(admin::serve_unix(admin.clone(), unix));
    if let Some(addr) = config.admin_addr {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => {
                tokio::spawn(admin::serve_tcp(admin.clone(), l));
            }
            Err(e) => error!(error = %e, %addr, "admin listener"),
        }
    }

    // The CNI API.
    let cni_sock = state_dir.join("cni.sock");
    let cni_listener = cni::bind(&cni_sock)?;
    let (cni_tx, mut cni_rx) = mpsc::channel::<CniRequest>(64);
    tokio::spawn(cni::serve(cni_listener, cni_tx));

    // Registry changes.
    let (changed_tx, mut changed_rx) = mpsc::channel::<()>(1);
    let _watcher = watch_registry(&config.registry, changed_tx.clone());

    // Certificate rotation.
    let rotating = identities.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tick.tick().await;
            let n = rotating.rotate_due(crate::time::wall());
            if n > 0 {
                info!(rotated = n, "workload certificates re-issued");
            }
        }
    });

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| NodeError::StateDir {
            path: "SIGTERM".into(),
            source,
        })?;
    info!(node = %config.node_name, admin = %admin_sock.display(), "ready");
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            Some(()) = changed_rx.recv() => {
                // Debounce inside the branch, so no other branch can drop the change.
                tokio::time::sleep(Duration::from_millis(config.watch_debounce_ms)).await;
                while changed_rx.try_recv().is_ok() {}
                // Reading and compiling is blocking work: off the data plane's threads.
                let previous = handle.load();
                let (cfg, kept) = (config.clone(), retained.clone());
                let loaded = tokio::task::spawn_blocking(move || {
                    load(&cfg, Some((&previous, &kept)))
                })
                .await;
                let loaded = match loaded {
                    Ok(l) => l,
                    Err(e) => {
                        error!(error = %e, "registry reload task failed; keeping the previous model");
                        continue;
                    }
                };
                match loaded {
                    Ok(l) => {
                        retained = l.retained.clone();
                        debug!(retained = retained.len(), "recompiled");
                        let generation = handle.publish(l.model);
                        dns_table.store(Arc::new(l.dns));
                        info!(generation, "model published");
                        let ok = reconcile(&config, &shared, &pods, &cni_pods).await;
                        let _ = ready_tx.send(ok);
                        // Published and reconciled: what `/model` reports as loaded.
                        fingerprint.store(l.fingerprint, std::sync::atomic::Ordering::Release);
                    }
                    // A failed load keeps the previous model.
                    Err(e) => error!(error = %crate::DisplayChain(&e), "registry reload failed; keeping the previous model"),
                }
            }
            _ = retry.tick(), if !*ready_tx.borrow() || !retained.is_empty() => {
                if !retained.is_empty() {
                    // Retained entries expire by the clock: recompile so they go on time.
                    let _ = changed_tx.try_send(());
                }
                if !*ready_tx.borrow() {
                    let ok = reconcile(&config, &shared, &pods, &cni_pods).await;
                    let _ = ready_tx.send(ok);
                }
            }
            Some(req) = cni_rx.recv() => {
                let outcome = {
                    let mut known = cni_pods.lock().await;
                    match &req.command {
                        CniCommand::Add { namespace, pod, netns } => {
                            known.insert((namespace.clone(), pod.clone()), netns.clone());
                        }
                        CniCommand::Del { namespace, pod, .. } => {
                            known.remove(&(namespace.clone(), pod.clone()));
                        }
                    }
                    Ok(())
                };
                let ok = reconcile(&config, &shared, &pods, &cni_pods).await;
                let _ = ready_tx.send(ok);
                let _ = req.reply.send(outcome);
            }
        }
    }
    info!("shutting down: draining");
    drain(
        &inputs,
        &pods,
        Duration::from_secs(config.drain_timeout_secs),
    )
    .await;
    let _ = std::fs::remove_file(&admin_sock);
    let _ = std::fs::remove_file(&cni_sock);
    Ok(())
}

/// Reconcile the local pods with the current model; whether every one is served.
async fn reconcile(
    config: &NodeConfig,
    shared: &Shared,
    pods: &Arc<Mutex<Pods>>,
    cni_pods: &Arc<Mutex<CniPods>>,
) -> bool {
    let model = shared.inputs.model.load();
    let known = cni_pods.lock().await.clone();
    let want = pods::desired(&model, &config.node_name, &config.netns_prefix, &known);
    let failed = pods.lock().await.reconcile(shared, want).await;
    let all = failed.is_empty();
    for ((ns, pod), e) in failed {
        error!(namespace = %ns, pod = %pod, error = %crate::DisplayChain(&e), "pod not served; retrying");
    }
    all
}

/// Stop accepting, then wait (bounded) for connections to finish.
async fn drain(inputs: &Inputs, pods: &Arc<Mutex<Pods>>, bound: Duration) {
    // Dropping the served pods stops their accept loops; capture stays programmed, so a pod
    // is not silently taken out of the mesh while the daemon restarts.
    let mut p = pods.lock().await;
    *p = Pods::default();
    drop(p);
    // HTTP connections finish what is in flight and close; idle ones close now.
    inputs.drain.send_replace(true);
    let deadline = crate::time::now() + bound;
    while inputs.stats.active.get() > 0 && crate::time::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = inputs.stats.active.get();
    if left > 0 {
        warn!(connections = left, "drain bound reached; closing");
    }
}

/// Watch the registry directory; every change sends a tick.
fn watch_registry(dir: &Path, tx: mpsc::Sender<()>) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher;
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // The daemon's own reads of the directory are access events: only changes count, or
        // every load would trigger the next.
        if event.is_ok_and(|e| !matches!(e.kind, notify::EventKind::Access(_))) {
            let _ = tx.try_send(());
        }
    })
    .map_err(|e| error!(error = %e, "registry watcher"))
    .ok()?;
    watcher
        .watch(dir, notify::RecursiveMode::Recursive)
        .map_err(|e| error!(error = %e, dir = %dir.display(), "registry watcher"))
        .ok()?;
    Some(watcher)
}
