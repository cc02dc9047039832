//! The daemon's life: start (the registry's source, the first model, the identities, the
//! proxies' inputs, the CNI and admin sockets, a predecessor's listeners), serve (one loop that
//! hears the registry, the CNI API, a successor and the stop signal), stop (drain).
//!
//! Wiring only: each step calls the part that does the work.

use std::collections::BTreeMap;
use std::future::Future;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::{Mutex, mpsc, watch};
use tracing::{debug, error, info, warn};

use super::pods::{CniPods, Pods, Shared};
use super::stats::NodeStats;
use super::{
    EtcdNode, Followers, Handing, KubeWrites, Loaded, NodeConfig, NodeError, Parts, RELEASE_BOUND,
    Read, STARTED_MARKER, Source, WriterSenders, admin, cni_gate, config, context, dns, drain,
    empty, follow, hand_over_done, handle_cni, handoff, listeners, load, mark_started, memory,
    publish, reconcile, rediscover, serve_admin_unix, serve_cni, serve_handoff, set_ready,
    snapshot_of, spawn_probes, spawn_writers, stop_accepting, telemetry, tls,
};
use crate::capture::cni::{CniCommand, CniRefusal, CniRequest};
use crate::dns::table::DnsTable;
use crate::identity::{Ca, Identities, IdentitySettings};
use crate::model::live::Live;
use crate::netns::Netns;
use crate::proxy::{Inputs, ProxySettings};
use crate::registry::file::LastGood;
use crate::registry::kube::watch::{KubeSource, WatchSettings};
use crate::state::ModelHandle;

/// Run the daemon until SIGTERM or SIGINT, then drain; its log filter cannot be changed.
pub async fn run(config: NodeConfig) -> Result<(), NodeError> {
    let logs = crate::log_filter::LogFilter::detached(&config.log_level);
    run_with_logs(config, logs).await
}

/// Run the daemon until SIGTERM or SIGINT, then drain; `logs` changes the process's log filter
/// (`aether debug log-level`).
pub async fn run_with_logs(
    config: NodeConfig,
    logs: crate::log_filter::LogFilter,
) -> Result<(), NodeError> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| NodeError::StateDir {
            path: "SIGTERM".into(),
            source,
        })?;
    let stop = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    run_until(config, logs, stop).await
}

/// Run the daemon until `stop` completes, then drain. After handing its sockets to a successor
/// it stops accepting and still waits for `stop` before it drains and returns: under a
/// supervisor that restarts a process that exits (kubelet, for a DaemonSet's pod), an old
/// daemon that exited by itself would be started again and take the node back from its
/// successor.
pub(super) async fn run_until(
    config: NodeConfig,
    logs: crate::log_filter::LogFilter,
    stop: impl Future<Output = ()>,
) -> Result<(), NodeError> {
    tokio::pin!(stop);
    prepare(&config)?;
    let node_stats = Arc::new(NodeStats::default());
    // kube's client takes the process's default rustls provider; another provider in the
    // dependency graph would make it panic. Ignored when one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (changed_tx, changed_rx) = mpsc::channel::<()>(1);
    let kube_writes = Arc::new(KubeWrites::default());
    let started = start_source(&config, &changed_tx, &kube_writes, &node_stats).await?;
    let source = started.source.clone();
    // The model kept by changes: every load gives it what changed (issue #37).
    let kept_model = Arc::new(parking_lot::Mutex::new(Live::new(context(&config))));
    // Nothing serves yet: the first model and what follows it are made together.
    let (first, first_snapshot, followed) =
        first_model(&config, &source, &kept_model, &node_stats).await?;
    let retained = first.retained.clone();
    log_started_source(&config, &source, &first);
    let handle = Arc::new(ModelHandle::with_source(
        first.model,
        config.debug_keep_snapshot.then_some(first_snapshot),
    ));
    let fingerprint = Arc::new(AtomicU64::new(followed.fingerprint));
    let dns_table = Arc::new(ArcSwap::from_pointee(followed.dns.unwrap_or_default()));
    let identities = identities(&config)?;
    let inputs = proxy_inputs(&config, &handle, &identities)?;
    let shared = shared(&config, &inputs, &dns_table, &node_stats)?;
    let pods = Arc::new(Mutex::new(Pods::default()));
    if let Source::Etcd(_) = &*source {
        spawn_probes(&config, source.clone(), pods.clone(), node_stats.clone());
    }
    let (cni, cni_rx) = CniApi::start(&config, &inputs, &handle, &node_stats)?;
    spawn_overload_monitor(&config, &inputs)?;
    let handoff_path = config.state_dir.join("handoff.sock");
    let (predecessor, inherited_node) = take_predecessor(&config, &handoff_path, &pods).await;
    // The pods a CNI ADD told an earlier run of the daemon about, whose namespaces are still
    // there: served again without a new ADD (issue #9 §4, `cni_records`). Read after the
    // predecessor stopped accepting ADDs, so that none it recorded is missed.
    let cni_pods = Arc::new(Mutex::new(rediscover(&config.state_dir, &shared.home)));
    let (ready_tx, ready_rx) = watch::channel(false);
    // Whether the published model is the registry's: not before the Kubernetes source has
    // listed every kind (fail closed). Ready and CNI ADDs need it. A kind refused (403) after
    // its list does not unset it: its last store stays in force and the reloads go on with
    // every other kind's changes (issue #35; `/ready` says `degraded`).
    let registry_ok = matches!(*source, Source::File(_));
    // The one writer of the published model from here on.
    let publisher = publish::Publisher::new(
        source.clone(),
        config.clone(),
        kept_model,
        node_stats.clone(),
        publish::Outputs {
            handle: handle.clone(),
            metrics: shared.inputs.metrics.clone(),
            dns: dns_table,
            writers: started
                .writers
                .as_ref()
                .map(|(registrar, status, _)| (registrar.clone(), status.clone())),
            kube_writes: kube_writes.clone(),
        },
        retained,
    );
    // The first reconcile: every local pod (present = desired). Ready only once every local
    // pod is served; failed pods are retried.
    let all_served = reconcile(&config, &shared, &pods, &cni_pods)
        .await
        .is_empty()
        && registry_ok;
    set_ready(&ready_tx, all_served);
    let admin = Arc::new(admin::Admin {
        inputs: inputs.clone(),
        pods: pods.clone(),
        ready: ready_rx,
        node: config.node_name.clone(),
        fingerprint: fingerprint.clone(),
        node_stats: node_stats.clone(),
        kube_writes,
        etcd: match &*source {
            Source::Etcd(etcd) => Some(etcd.clone()),
            _ => None,
        },
        debug: super::debug::DebugInputs {
            identities: Some(identities.clone()),
            logs,
            max_body_bytes: config.debug_max_body_bytes,
            capture_timeout: Duration::from_millis(config.debug_capture_timeout_ms),
        },
        control: control_collector(&source, &identities),
        not_served: shared.not_served.clone(),
    });
    let admin_sock = config.state_dir.join("admin.sock");
    let admin_served = serve_admin_unix(&admin_sock, &admin)?;
    let node_listeners = listeners::SharedListeners::default();
    serve_node_listeners(&config, &admin, &node_listeners, inherited_node);
    spawn_rotation(identities);
    let (handing_tx, handing_rx) = mpsc::channel::<Handing>(1);
    let mut daemon = Daemon {
        config,
        shared,
        pods,
        cni_pods,
        node_stats,
        source,
        fingerprint,
        ready: ready_tx,
        registry_ok,
        publisher,
        cni,
        admin,
        admin_sock,
        admin_served,
        node_listeners,
        handoff_path,
        handing: handing_tx,
        predecessor,
        offering: None,
        handing_over: false,
        writers: started.writers,
        _file_watcher: started.file_watcher,
    };
    // Once every pod is served, the predecessor (if any) may stop accepting; then this daemon
    // offers its own sockets to a successor.
    if all_served {
        daemon.offer_handoff().await;
    }
    info!(node = %daemon.config.node_name, admin = %daemon.admin_sock.display(), ready = *daemon.ready.borrow(), "started; ready once the registry is read whole and every local pod is served (logged when it is)");
    let handed_off = daemon
        .serve(
            stop.as_mut(),
            Receivers {
                changed: changed_rx,
                changed_tx,
                cni: cni_rx,
                handing: handing_rx,
            },
        )
        .await;
    daemon.shut_down(handed_off, stop).await;
    Ok(())
}

/// Check the settings, forget an earlier run's start marker, make the state directory.
fn prepare(config: &NodeConfig) -> Result<(), NodeError> {
    config.validate()?;
    // A marker of an earlier run of this container (its pod directory outlives a restart)
    // must not pass the startup probe for this one (`mark_started`).
    if let Some(dir) = &config.pod_dir {
        let _ = std::fs::remove_file(dir.join(STARTED_MARKER));
    }
    std::fs::create_dir_all(&config.state_dir).map_err(|source| NodeError::StateDir {
        path: config.state_dir.clone(),
        source,
    })
}

/// The registry's source as started, with what keeps it going.
struct StartedSource {
    source: Arc<Source>,
    /// The directory's watcher (file and etcd sources), alive as long as the daemon.
    file_watcher: Option<notify::RecommendedWatcher>,
    /// The Kubernetes writers' inputs and the registrar's task.
    writers: Option<WriterSenders>,
}

/// Start reading the registry from the configured source; `changed` hears of every change.
async fn start_source(
    config: &NodeConfig,
    changed: &mpsc::Sender<()>,
    kube_writes: &Arc<KubeWrites>,
    node_stats: &Arc<NodeStats>,
) -> Result<StartedSource, NodeError> {
    let mut file_watcher = None;
    let mut writers = None;
    let source = match config.registry_source {
        config::RegistrySource::File => {
            file_watcher = crate::registry::file::watch_dir(&config.registry, changed.clone());
            Source::File(parking_lot::Mutex::new(LastGood::default()))
        }
        config::RegistrySource::Etcd => {
            // The directory's notices mark it changed, so that the next load reads it whole
            // (etcd's own notices bring only the rows that changed).
            let (dir_tx, dir_rx) = mpsc::channel::<()>(1);
            file_watcher = crate::registry::file::watch_dir(&config.registry, dir_tx);
            Source::Etcd(start_etcd(config, changed, dir_rx)?)
        }
        config::RegistrySource::Kube => {
            let client = crate::registry::kube::client::client(&config.node_name)
                .await
                .map_err(NodeError::Kube)?;
            writers = Some(spawn_writers(config, &client, kube_writes, node_stats));
            let settings = WatchSettings {
                node: Some(config.node_name.clone()),
                streaming_lists: config.kube_streaming_lists,
                ..WatchSettings::default()
            };
            Source::Kube(
                Arc::new(KubeSource::start(&client, &settings, changed)),
                parking_lot::Mutex::default(),
            )
        }
    };
    Ok(StartedSource {
        source: Arc::new(source),
        file_watcher,
        writers,
    })
}

/// The etcd source: its watch, this node's registration, and the directory's notices, which
/// mark the directory changed (`dir_changed`) before they ask for a load.
fn start_etcd(
    config: &NodeConfig,
    changed: &mpsc::Sender<()>,
    mut dir_changes: mpsc::Receiver<()>,
) -> Result<Arc<EtcdNode>, NodeError> {
    let settings = config.etcd_settings()?;
    let source = crate::registry::etcd::EtcdSource::start(settings.clone(), changed.clone());
    let registration = crate::registry::etcd::Registration::start(
        settings,
        config.state_dir.join("etcd-lease"),
        source.clone(),
    );
    let node = Arc::new(EtcdNode {
        last: parking_lot::Mutex::new(LastGood::default()),
        source,
        registration,
        liveness: Arc::default(),
        local: parking_lot::Mutex::default(),
        compiled: std::sync::atomic::AtomicI64::new(0),
        feed: parking_lot::Mutex::default(),
        dir_changed: std::sync::atomic::AtomicBool::new(true),
        first_listed: parking_lot::Mutex::default(),
    });
    let (marked, changed) = (Arc::downgrade(&node), changed.clone());
    tokio::spawn(async move {
        while dir_changes.recv().await.is_some() {
            let Some(node) = marked.upgrade() else { return };
            node.dir_changed.store(true, Ordering::Release);
            let _ = changed.try_send(());
        }
    });
    Ok(node)
}

/// The first model, the snapshot it was compiled from and what follows it: the directory's on
/// the file source (read off the runtime's threads); on the watched sources an empty one, since
/// nothing is served until every watch (or etcd's prefix) has listed and the first tick brings
/// the model.
async fn first_model(
    config: &NodeConfig,
    source: &Arc<Source>,
    kept: &Arc<parking_lot::Mutex<Live>>,
    node_stats: &Arc<NodeStats>,
) -> Result<(Loaded, crate::model::Snapshot, Followers), NodeError> {
    let made = |mut l: Loaded, cfg: &NodeConfig, kept: &parking_lot::Mutex<Live>| {
        let read = std::mem::replace(&mut l.read, Read::File { fingerprint: 0 });
        let snapshot = snapshot_of(l.snapshot.take(), kept);
        let followed = follow(cfg, &snapshot, &l.model, read, Parts::ALL);
        (l, snapshot, followed)
    };
    match &**source {
        Source::File(_) => {
            let (cfg, src, stats) = (config.clone(), source.clone(), node_stats.clone());
            let kept = kept.clone();
            tokio::task::spawn_blocking(move || {
                let loaded = load(&cfg, &src, &kept, &stats, None)?;
                Ok::<_, NodeError>(made(loaded, &cfg, &kept))
            })
            .await
            .map_err(|e| NodeError::StateDir {
                path: config.registry.clone(),
                source: std::io::Error::other(e),
            })?
        }
        Source::Kube(..) | Source::Etcd(_) => Ok(made(empty(config), config, kept)),
    }
}

/// Say where the registry is read from, and what the first model holds.
fn log_started_source(config: &NodeConfig, source: &Source, first: &Loaded) {
    match source {
        Source::File(_) => info!(node = %config.node_name, registry = %config.registry.display(),
            pods = first.model.pods().count(), "registry loaded"),
        Source::Kube(..) => info!(node = %config.node_name,
            "watching the Kubernetes API server; no pod is served before every kind has listed"),
        Source::Etcd(_) => info!(node = %config.node_name, endpoints = ?config.etcd_endpoints,
            "watching etcd; no pod is served before its prefix has listed"),
    }
}

/// The mesh CA (given, or a directory's, created once) and the workload identities it issues.
fn identities(config: &NodeConfig) -> Result<Arc<Identities>, NodeError> {
    let ca = match (&config.ca_cert, &config.ca_key, &config.ca_dir) {
        (Some(cert), Some(key), _) => Ca::load(cert, key)?,
        (_, _, Some(dir)) => Ca::load_or_create(dir)?,
        _ => Ca::load_or_create(&config.state_dir.join("ca"))?,
    };
    let identities = Identities::new(
        Arc::new(ca),
        IdentitySettings {
            trust_domain: config.trust_domain.clone(),
            mesh_domain: config.mesh_domain.clone(),
            validity: Duration::from_secs(config.cert_lifetime_hours * 3600),
            ..IdentitySettings::default()
        },
    )
    .map_err(crate::identity::IdentityError::from)?;
    Ok(Arc::new(identities))
}

/// The data plane's settings, from the node's.
fn proxy_settings(config: &NodeConfig) -> ProxySettings {
    ProxySettings {
        mesh_domain: config.mesh_domain.clone(),
        trust_domain: config.trust_domain.clone(),
        max_connections: config.max_connections,
        max_connections_per_pod: config.max_connections_per_pod,
        handshake_timeout: Duration::from_millis(config.handshake_timeout_ms),
        connect_timeout: Duration::from_millis(config.connect_timeout_ms),
        balance: crate::proxy::balance::Limits {
            ejection: Duration::from_millis(config.endpoint_ejection_ms),
            ejection_max: Duration::from_millis(config.endpoint_ejection_max_ms),
            max_states: config.endpoint_states_max,
        },
        udp_idle: Duration::from_secs(config.udp_idle_secs),
        udp_max_flows_per_pod: config.udp_max_flows_per_pod,
        max_header_bytes: config.max_header_bytes,
        header_read_timeout: Duration::from_millis(config.header_read_timeout_ms),
        http_idle_timeout: Duration::from_secs(config.http_idle_timeout_secs),
        http2_max_concurrent_streams: config.http2_max_concurrent_streams,
        max_header_list_size: config.max_header_list_size,
        max_headers: config.max_headers,
        tcp_idle_timeout: (config.tcp_idle_timeout_secs > 0)
            .then(|| Duration::from_secs(config.tcp_idle_timeout_secs)),
        mirror_max_body_bytes: config.mirror_max_body_bytes,
        ext_authz_max_body_bytes: config.ext_authz_max_body_bytes,
        max_streams_per_peer: config.max_streams_per_peer,
        ..ProxySettings::default()
    }
}

/// What every proxy of the node reads: the model, the identities' TLS, the settings, the hop
/// pool, the balancer, the drain signal, the counters, the access log and the overload state.
fn proxy_inputs(
    config: &NodeConfig,
    handle: &Arc<ModelHandle>,
    identities: &Arc<Identities>,
) -> Result<Arc<Inputs>, NodeError> {
    let access = config
        .access_log
        .parse()
        .map_err(|message| config::ConfigError::Invalid {
            setting: "access_log",
            message,
        })?;
    let metrics = Arc::new(crate::proxy::metrics::DataPlane::default());
    metrics.rebuild(&handle.load());
    Ok(Arc::new(Inputs {
        model: handle.clone(),
        tls: Arc::new(tls::IdentityTls::new(identities.clone())),
        settings: proxy_settings(config),
        pool: crate::proxy::hop::Pool::default(),
        balance: Default::default(),
        drain: watch::Sender::new(false),
        stats: crate::proxy::Stats::default(),
        metrics,
        access: crate::proxy::access::AccessLog::new(access),
        overload: Arc::new(
            crate::proxy::overload::Overload::new(config.max_streams_per_peer)
                .with_max_pending_head_bytes(config.max_pending_head_bytes),
        ),
    }))
}

/// What serving a pod needs besides the proxies' inputs: the node's counters, the daemon's own
/// namespace, and mesh DNS (its table, its upstreams, its TCP limits).
fn shared(
    config: &NodeConfig,
    inputs: &Arc<Inputs>,
    dns_table: &Arc<ArcSwap<DnsTable>>,
    node_stats: &Arc<NodeStats>,
) -> Result<Shared, NodeError> {
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
    Ok(Shared {
        inputs: inputs.clone(),
        stats: node_stats.clone(),
        not_served: Arc::default(),
        home: Arc::new(Netns::current()?),
        dns: dns::DnsShared {
            table: dns_table.clone(),
            upstreams,
            accept_errors: inputs.stats.accept_errors("dns"),
            tcp: crate::dns::TcpLimits {
                max_clients: config.dns_tcp_max_clients,
                query_timeout: Duration::from_millis(config.dns_tcp_query_timeout_ms),
                refused: node_stats.dns_tcp_refused.clone(),
                timeouts: node_stats.dns_tcp_timeouts.clone(),
            },
            stats: inputs.metrics.dns.clone(),
        },
    })
}

/// The CNI API on `<state_dir>/cni.sock`.
struct CniApi {
    sock: PathBuf,
    /// Where the socket's task sends each request: the ADD gate.
    requests: mpsc::Sender<CniRequest>,
    /// The serving task and the file bound.
    served: (tokio::task::AbortHandle, listeners::OwnedPath),
}

impl CniApi {
    /// Bind the CNI API before the running daemon (an upgrade) is asked for its sockets: from
    /// here on every ADD comes to this daemon, which answers "try again" until it serves. An
    /// ADD for a pod the model does not hold yet waits for it on its own task before it
    /// reaches the daemon's loop (`cni_gate`): the receiver returned.
    fn start(
        config: &NodeConfig,
        inputs: &Arc<Inputs>,
        handle: &Arc<ModelHandle>,
        node_stats: &Arc<NodeStats>,
    ) -> Result<(Self, mpsc::Receiver<CniRequest>), NodeError> {
        let sock = config.state_dir.join("cni.sock");
        let (socket_tx, socket_rx) = mpsc::channel::<CniRequest>(64);
        let (cni_tx, cni_rx) = mpsc::channel::<CniRequest>(64);
        let served = serve_cni(&sock, &socket_tx, inputs)?;
        let gate = cni_gate::AddGate {
            model: handle.clone(),
            bound: Duration::from_millis(config.cni_add_wait_ms),
            waiters_max: config.cni_add_waiters_max,
            stats: node_stats.clone(),
        };
        tokio::spawn(gate.run(socket_rx, cni_tx));
        let api = Self {
            sock,
            requests: socket_tx,
            served,
        };
        Ok((api, cni_rx))
    }

    /// Bind the socket again if a successor took its path (it bound its own there).
    fn take_back(&mut self, inputs: &Inputs) {
        if self.served.1.is_ours() {
            return;
        }
        self.served.0.abort();
        match serve_cni(&self.sock, &self.requests, inputs) {
            Ok(s) => self.served = s,
            Err(e) => {
                error!(error = %crate::DisplayChain(&e), "the CNI socket cannot be bound again: pods on this node cannot start")
            }
        }
    }
}

/// The overload manager: sheds by memory before the OOM killer would (issue #36 item 4).
fn spawn_overload_monitor(config: &NodeConfig, inputs: &Inputs) -> Result<(), NodeError> {
    memory::spawn_monitor(
        inputs.overload.clone(),
        config.overload_memory_limit_bytes,
        crate::proxy::overload::Thresholds {
            refuse_percent: config.overload_refuse_percent,
            shed_percent: config.overload_shed_percent,
        },
        Duration::from_millis(config.overload_interval_ms),
    )
    .map_err(NodeError::Monitor)
}

/// A daemon already running here (an upgrade): take its listening sockets, so that no
/// connection is refused while the two change places (issue #8 §4, `handoff`). It hands over
/// from here on: not ready, no ADD accepted, no pod reconciled (issue #35 item 4). The pods'
/// sockets go to `pods`; the node-wide ones (metrics, admin) are returned by kind.
async fn take_predecessor(
    config: &NodeConfig,
    path: &Path,
    pods: &Arc<Mutex<Pods>>,
) -> (Option<handoff::Taken>, BTreeMap<&'static str, OwnedFd>) {
    let mut inherited_node = BTreeMap::new();
    let path = path.to_path_buf();
    let taken = match tokio::task::spawn_blocking(move || handoff::take(&path)).await {
        Ok(Ok(Some(mut taken))) => {
            let mut inherited = std::mem::take(&mut taken.inherited);
            info!(
                sockets = inherited.len(),
                "took the listening sockets of the running daemon"
            );
            for (kind, addr) in [
                ("metrics", config.metrics_addr),
                ("admin", config.admin_addr),
            ] {
                if let Some(addr) = addr
                    && let Some(fd) = inherited.take(&handoff::ListenerId::node(kind, addr))
                {
                    inherited_node.insert(kind, fd);
                }
            }
            pods.lock().await.inherit(inherited);
            mark_started(config);
            Some(taken)
        }
        Ok(Ok(None)) => {
            mark_started(config);
            None
        }
        // No marker: the startup probe fails and the container is started again, which asks
        // again; meanwhile the running daemon answers the probes as before.
        Ok(Err(e)) => {
            warn!(error = %crate::DisplayChain(&e), "no handoff from the running daemon; binding anew");
            None
        }
        Err(e) => {
            warn!(error = %e, "handoff task failed; binding anew");
            None
        }
    };
    (taken, inherited_node)
}

/// The node-wide TCP listeners (admin, metrics): a predecessor's when it handed them over, else
/// bound (and retried while a predecessor still holds the port; `listeners`).
fn serve_node_listeners(
    config: &NodeConfig,
    admin: &Arc<admin::Admin>,
    listeners: &listeners::SharedListeners,
    mut inherited: BTreeMap<&'static str, OwnedFd>,
) {
    if let Some(addr) = config.admin_addr {
        let admin = admin.clone();
        let fd = inherited.remove("admin");
        listeners::spawn(listeners, "admin", addr, fd, move |l| {
            admin::serve_tcp(admin, l)
        });
    }
    if let Some(addr) = config.metrics_addr {
        let (admin, max) = (admin.clone(), config.metrics_max_connections);
        let fd = inherited.remove("metrics");
        listeners::spawn(listeners, "metrics", addr, fd, move |l| {
            admin::serve_metrics(admin, l, max)
        });
    }
}

/// What `/metrics` reads at each scrape besides the counters: the Kubernetes source's watches,
/// the runtime, the certificates.
fn control_collector(
    source: &Source,
    identities: &Arc<Identities>,
) -> Arc<telemetry::ControlCollector> {
    Arc::new(telemetry::ControlCollector {
        kinds: match source {
            Source::Kube(kube, ..) => kube.kinds().to_vec(),
            Source::File(_) | Source::Etcd(_) => Vec::new(),
        },
        runtime: Some(tokio::runtime::Handle::current()),
        identities: Some(identities.clone()),
    })
}

/// Re-issue the workload certificates due, every minute.
fn spawn_rotation(identities: Arc<Identities>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tick.tick().await;
            let n = identities.rotate_due(crate::time::wall());
            if n > 0 {
                info!(rotated = n, "workload certificates re-issued");
            }
        }
    });
}

/// What the daemon's loop hears.
struct Receivers {
    /// A registry change.
    changed: mpsc::Receiver<()>,
    /// Asks for a load (retained entries expire by the clock).
    changed_tx: mpsc::Sender<()>,
    /// A CNI request, past the ADD gate.
    cni: mpsc::Receiver<CniRequest>,
    /// A successor's hand-off.
    handing: mpsc::Receiver<Handing>,
}

/// The serving daemon: what its loop acts on.
struct Daemon {
    config: NodeConfig,
    shared: Shared,
    pods: Arc<Mutex<Pods>>,
    cni_pods: Arc<Mutex<CniPods>>,
    node_stats: Arc<NodeStats>,
    source: Arc<Source>,
    /// What `/model` reports as loaded: set once published and reconciled.
    fingerprint: Arc<AtomicU64>,
    ready: watch::Sender<bool>,
    /// Whether the published model is the registry's (see `run_until`).
    registry_ok: bool,
    publisher: publish::Publisher<Source>,
    cni: CniApi,
    admin: Arc<admin::Admin>,
    admin_sock: PathBuf,
    admin_served: (tokio::task::AbortHandle, listeners::OwnedPath),
    node_listeners: listeners::SharedListeners,
    handoff_path: PathBuf,
    handing: mpsc::Sender<Handing>,
    /// The running daemon this one took the sockets of, until it is told to stop accepting.
    predecessor: Option<handoff::Taken>,
    /// This daemon's own `handoff.sock`, once it offers.
    offering: Option<listeners::OwnedPath>,
    /// A successor has taken the sockets and does not serve yet (`handoff`).
    handing_over: bool,
    writers: Option<WriterSenders>,
    _file_watcher: Option<notify::RecommendedWatcher>,
}

impl Daemon {
    /// Serve until `stop` or a successor serves every pod; whether one did.
    async fn serve(
        &mut self,
        mut stop: std::pin::Pin<&mut impl Future<Output = ()>>,
        mut rx: Receivers,
    ) -> bool {
        let mut retry = tokio::time::interval(Duration::from_secs(2));
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut stop => return false,
                Some(h) = rx.handing.recv() => {
                    if self.on_handing(h).await {
                        return true;
                    }
                }
                Some(()) = rx.changed.recv() => {
                    let outcome = self.publisher.publish(&mut rx.changed).await;
                    self.on_published(outcome).await;
                }
                _ = retry.tick(), if !*self.ready.borrow() || self.publisher.retaining() => {
                    self.on_retry(&rx.changed_tx).await;
                }
                Some(req) = rx.cni.recv() => self.on_cni(req).await,
            }
        }
    }

    /// Every local pod reconciled with the current model; whether every one is served.
    async fn reconcile(&self) -> bool {
        reconcile(&self.config, &self.shared, &self.pods, &self.cni_pods)
            .await
            .is_empty()
    }

    /// Tell the predecessor (if any) that every pod is served, and offer this daemon's sockets.
    async fn offer_handoff(&mut self) {
        hand_over_done(&mut self.predecessor, &self.pods).await;
        self.offering = serve_handoff(&self.handoff_path, self.handing.clone());
    }

    /// A successor's hand-off; whether it now serves every pod (this daemon stops accepting).
    async fn on_handing(&mut self, handing: Handing) -> bool {
        match handing {
            Handing::Taking(reply) => {
                self.handing_over = true;
                set_ready(&self.ready, false);
                let mut offered = self.pods.lock().await.handoff_listeners();
                offered.extend(self.node_listeners.lock().offer());
                info!(
                    sockets = offered.len(),
                    "a successor daemon takes the listening sockets: not ready, CNI ADDs answered try-again, no pod reconciled until it serves"
                );
                let _ = reply.send(offered);
                false
            }
            Handing::Failed => {
                // Ready again once the retry has reconciled. The successor bound its own CNI
                // and admin sockets in the state directory: they are taken back.
                self.handing_over = false;
                warn!("the successor daemon did not take over; serving on");
                self.cni.take_back(&self.shared.inputs);
                if !self.admin_served.1.is_ours() {
                    self.admin_served.0.abort();
                    match serve_admin_unix(&self.admin_sock, &self.admin) {
                        Ok(s) => self.admin_served = s,
                        Err(e) => {
                            error!(error = %crate::DisplayChain(&e), "the admin socket cannot be bound again")
                        }
                    }
                }
                false
            }
            Handing::Done => {
                info!(
                    "a successor daemon serves every pod: stop accepting, and drain once stopped"
                );
                true
            }
        }
    }

    /// What a registry change's publish came to.
    async fn on_published(&mut self, outcome: publish::Outcome) {
        match outcome {
            publish::Outcome::Published(published) => {
                debug!(
                    generation = published.generation,
                    unchanged = published.unchanged,
                    changes = published.applied.changes,
                    full = published.applied.full,
                    delay_ms = published.delay.as_secs_f64() * 1e3,
                    "published"
                );
                self.registry_ok = true;
                // While a successor takes over, the pods stay as they were handed.
                if !self.handing_over {
                    let ok = self.reconcile().await;
                    set_ready(&self.ready, ok);
                }
                // Published and reconciled: what `/model` reports as loaded.
                if let Some(settled) = published.settled {
                    self.fingerprint.store(settled, Ordering::Release);
                }
                if let (Source::Etcd(etcd), Some(revision)) =
                    (&*self.source, published.etcd_revision)
                {
                    etcd.compiled.store(revision, Ordering::Release);
                }
                if *self.ready.borrow() && self.offering.is_none() {
                    self.offer_handoff().await;
                }
            }
            // Not every watch has listed (a kind refused before its first list among them):
            // the model stays as it is and the node is not ready (fail closed).
            publish::Outcome::NotSynced => {
                self.registry_ok = false;
                set_ready(&self.ready, false);
            }
            // A failed load keeps the previous model (logged by the publisher).
            publish::Outcome::Failed => {}
        }
    }

    /// Every 2 s while not ready (or while entries are retained): reconcile again.
    async fn on_retry(&mut self, changed: &mpsc::Sender<()>) {
        if self.publisher.retaining() {
            // Retained entries expire by the clock: recompile so they go on time.
            let _ = changed.try_send(());
        }
        if !*self.ready.borrow() && !self.handing_over {
            let ok = self.reconcile().await && self.registry_ok;
            set_ready(&self.ready, ok);
            if ok && self.offering.is_none() {
                self.offer_handoff().await;
            }
        }
    }

    /// One CNI request past the ADD gate.
    async fn on_cni(&mut self, req: CniRequest) {
        let (config, shared, pods, cni_pods) =
            (&self.config, &self.shared, &self.pods, &self.cni_pods);
        if self.handing_over {
            super::cni_while_handing_over(req, config, shared, pods, cni_pods, &self.node_stats)
                .await;
            return;
        }
        // Before the registry is read whole no pod can be served: an ADD is answered "try
        // again", so the runtime retries it and no managed pod starts uncaptured (issue #9 §4).
        if !self.registry_ok && matches!(req.command, CniCommand::Add { .. }) {
            self.node_stats.cni_try_again.inc();
            let reason = "the node's registry has not been read whole yet (a kind of the Kubernetes source is not listed yet, or may not be read: /ready says which)";
            warn!(reason, "CNI ADD refused");
            let _ = req.reply.send(Err(CniRefusal::TryAgain(reason.to_owned())));
            return;
        }
        let (outcome, ok) = handle_cni(
            &req.command,
            config,
            shared,
            pods,
            cni_pods,
            &self.node_stats,
        )
        .await;
        if let Some(ok) = ok {
            set_ready(&self.ready, ok && self.registry_ok);
        }
        let _ = req.reply.send(outcome.map_err(CniRefusal::Refused));
    }

    /// Stop accepting, drain, release the Lease and the sockets that are still this daemon's.
    /// After a hand-off the successor serves on the same sockets: this daemon's connections run
    /// on until `stop` (its pod deleted once the new one is Ready), then to the drain bound.
    async fn shut_down(
        mut self,
        handed_off: bool,
        stop: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) {
        // The registrar gives its Lease up (if it holds it) while the connections drain, so the
        // next leader need not wait the lease out. The publisher holds the writers' senders
        // too: dropped first, so that they close.
        drop(self.publisher);
        let registrar = self.writers.take().map(|(reg, st, task)| {
            drop((reg, st));
            tokio::time::timeout(RELEASE_BOUND, task)
        });
        let inputs = self.shared.inputs.clone();
        stop_accepting(&inputs, &self.pods).await;
        if handed_off {
            self.node_listeners.lock().stop();
            info!("handed over: not accepting; waiting for SIGTERM to drain and exit");
            stop.await;
        }
        info!("shutting down: draining");
        drain(&inputs, Duration::from_secs(self.config.drain_timeout_secs)).await;
        if let Some(released) = registrar
            && released.await.is_err()
        {
            warn!("the registrar did not give its Lease up in time; it lapses by itself");
        }
        // Nothing of this daemon accepts any more (a successor may share these sockets).
        self.node_listeners.lock().stop();
        self.admin_served.0.abort();
        self.cni.served.0.abort();
        // Only the state directory's sockets that are still this daemon's: after a handoff they
        // are the successor's, and a daemon that never served leaves its predecessor's.
        if !handed_off {
            self.admin_served.1.remove_if_ours();
            self.cni.served.1.remove_if_ours();
            if let Some(path) = &self.offering {
                path.remove_if_ours();
            }
        }
    }
}
