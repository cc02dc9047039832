//! `aether node`: the daemon's wiring (ARCHITECTURE.md "node"). The only module that starts
//! long-lived tasks and connects the parts: registry → model → proxies, capture, DNS, admin.

pub mod admin;
pub mod admin_state;
mod cni_gate;
pub mod cni_records;
pub mod config;
pub mod debug;
pub mod dns;
pub mod etcd_feed;
pub mod handoff;
pub mod kube_feed;
pub mod listeners;
pub mod liveness;
pub mod memory;
mod pace;
pub mod pods;
mod publish;
mod retain;
mod retire;
mod run;
pub mod settings;
pub mod stats;
pub mod telemetry;
pub mod tls;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, mpsc, watch};
use tracing::{debug, error, info, warn};

use crate::capture::cni::{self, CniCommand, CniRefusal, CniRequest};
use crate::dns::table::DnsTable;
use crate::model::live::Live;
use crate::model::names::Domains;
use crate::model::{Model, NodeContext, compile, registrar};
use crate::netns::Netns;
use crate::proxy::Inputs;
use crate::registry::file::{LastGood, load_dir_keeping};
use crate::registry::kube::watch::KubeSource;
pub use config::NodeConfig;
use pods::{CniPods, Pods, Shared};
#[cfg(test)]
use run::run_until;
pub use run::{run, run_with_logs};
use stats::NodeStats;

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
    /// No Kubernetes client could be made (no in-cluster credentials, no usable `KUBECONFIG`).
    #[error("connect to the Kubernetes API server")]
    Kube(#[source] kube::Error),
    /// The Kubernetes source has not had a complete list of every kind yet: no model is made
    /// from part of the registry (issue #9 §1, fail closed).
    #[error(
        "the registry has not been listed whole yet (the Kubernetes source's kinds, or etcd's prefix)"
    )]
    NotSynced,
    /// The memory monitor's thread could not be started.
    #[error("start the memory monitor's thread")]
    Monitor(#[source] std::io::Error),
}

/// Where this daemon reads its registry.
enum Source {
    /// The manifest directory, with each file's last content that read whole.
    File(parking_lot::Mutex<LastGood>),
    /// The API server's watches, and what the node keeps of them between loads
    /// ([`kube_feed`]).
    Kube(Arc<KubeSource>, parking_lot::Mutex<kube_feed::KubeFeed>),
    /// etcd for the rows, the manifest directory for the rest.
    Etcd(Arc<EtcdNode>),
}

/// The etcd source of one node: the directory gives everything but the rows, and this node's
/// own pods, whose rows it registers with their delegated liveness; etcd gives every node's rows.
#[derive(Debug)]
pub struct EtcdNode {
    /// The manifest directory's last good files.
    last: parking_lot::Mutex<LastGood>,
    /// Every node's rows, listed and watched.
    source: Arc<crate::registry::etcd::EtcdSource>,
    /// This node's rows, written under its lease.
    registration: crate::registry::etcd::Registration,
    /// The probes' answers.
    liveness: Arc<liveness::Liveness>,
    /// This node's rows as the directory gives them (readiness aside), for the probes.
    local: parking_lot::Mutex<Vec<crate::model::snapshot::Row>>,
    /// The store revision of the rows of the published model.
    compiled: std::sync::atomic::AtomicI64,
    /// What the loads by changes keep ([`etcd_feed`]).
    feed: parking_lot::Mutex<etcd_feed::EtcdFeed>,
    /// The manifest directory changed since it was last read (set by its watch): the next load
    /// reads it whole.
    dir_changed: std::sync::atomic::AtomicBool,
    /// The readiness the store held at this run's first listing, while a local pod is still
    /// to be probed ([`EtcdNode::held_readiness`]).
    first_listed: parking_lot::Mutex<Option<Readiness>>,
}

impl EtcdNode {
    /// What `/model` says of the etcd source. `settled`: this node's rows, every local pod
    /// probed once, are all written, and the published model holds every change the watch has
    /// seen (the lab waits for every node to be settled at one revision).
    pub fn report(&self) -> serde_json::Value {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        let stats = self.source.stats();
        let seen = self.source.revision().unwrap_or(0);
        let compiled = self.compiled.load(Acquire);
        let probed = self.liveness.all_probed(&self.local.lock());
        let state = &self.registration.state;
        serde_json::json!({
            "connected": stats.connected.load(Acquire),
            "revision_seen": seen,
            "revision_compiled": compiled,
            "listings": stats.listings.load(Relaxed),
            "watches": stats.watches.load(Relaxed),
            "leases": stats.leases.load(Relaxed),
            "keys_registered": state.keys.load(Acquire),
            "refused": *stats.refused.lock(),
            "refused_on_write": *stats.refused_on_write.lock(),
            "settled": probed && state.settled() && compiled == seen,
        })
    }

    /// Copies the source's counts into the node's metrics (called at each reload and probe
    /// round: the counts are kept by the source's tasks).
    fn export(&self, metrics: &NodeStats) {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        let counts = self.source.stats();
        for (reason, n) in counts.refused.lock().iter() {
            stats::catch_up(
                &metrics
                    .etcd_keys_refused
                    .get_or_create(&[("reason", *reason)]),
                *n,
            );
        }
        for (reason, n) in counts.refused_on_write.lock().iter() {
            stats::catch_up(
                &metrics
                    .etcd_rows_not_registered
                    .get_or_create(&[("reason", *reason)]),
                *n,
            );
        }
        stats::catch_up(&metrics.etcd_listings, counts.listings.load(Relaxed));
        stats::catch_up(&metrics.etcd_watches, counts.watches.load(Relaxed));
        stats::catch_up(&metrics.etcd_leases, counts.leases.load(Relaxed));
        metrics
            .etcd_connected
            .set(i64::from(counts.connected.load(Acquire)));
        metrics
            .etcd_keys_registered
            .set(i64::try_from(self.registration.state.keys.load(Acquire)).unwrap_or(i64::MAX));
    }

    /// Registers this node's rows with the readiness their probes give. A pod this run has not
    /// probed yet keeps the readiness its row holds in the store (the last probe is an earlier
    /// run's: a restarted or upgraded daemon does not make its pods flap), and is not Ready
    /// when the store has no row of it.
    fn register(&self) {
        let local = self.local.lock().clone();
        // Not listed yet: nothing is known of the earlier answers, so nothing is written.
        let Some(held) = self.held_readiness(&local) else {
            return;
        };
        let rows = local
            .into_iter()
            .map(|mut r| {
                r.ready = self.liveness.answer(&r).unwrap_or_else(|| held.ready(&r));
                r
            })
            .collect();
        self.registration.set(rows);
    }

    /// The store's readiness of the rows of `local` not probed yet in this run (empty when
    /// every one has been), or `None` before the first listing. A row the store no longer
    /// holds keeps the readiness it had at this run's first listing: an upgraded daemon revokes
    /// its predecessor's lease, which deletes the rows the predecessor wrote last, and its
    /// pods must not turn not Ready for that before they are probed (seen as `403
    /// authz-unavailable` from an authorization server so unregistered, leg UPGRADE).
    fn held_readiness(&self, local: &[crate::model::snapshot::Row]) -> Option<HeldReadiness> {
        if self.liveness.all_probed(local) {
            return Some(HeldReadiness::default());
        }
        let rows = self.source.rows()?;
        let now: BTreeMap<_, _> = rows
            .iter()
            .map(|r| ((r.namespace.clone(), r.service.clone(), r.address), r.ready))
            .collect();
        Some(HeldReadiness::of(&mut self.first_listed.lock(), now))
    }
}

/// Rows' readiness, by (namespace, service, address).
type Readiness = BTreeMap<(String, String, std::net::IpAddr), bool>;

/// Rows' readiness as the store holds it.
#[derive(Debug, Default)]
struct HeldReadiness(Readiness);

impl HeldReadiness {
    /// The readiness the store holds `now`, and for a row it no longer holds, the one it held
    /// at the first listing (kept in `first`, taken from `now` at the first call).
    fn of(first: &mut Option<Readiness>, now: Readiness) -> Self {
        let mut held = first.get_or_insert_with(|| now.clone()).clone();
        held.extend(now);
        Self(held)
    }

    /// `row`'s readiness in the store; not Ready when the store has no row of it.
    fn ready(&self, row: &crate::model::snapshot::Row) -> bool {
        self.0
            .get(&(row.namespace.clone(), row.service.clone(), row.address))
            .copied()
            .unwrap_or(false)
    }
}

/// The state of the Kubernetes writers, for `/model`.
#[derive(Debug, Default)]
pub struct KubeWrites {
    /// The registrar's.
    pub registrar: Arc<crate::registrar::RegistrarState>,
    /// A route status write is still to be made for the published model.
    pub status_pending: Arc<std::sync::atomic::AtomicBool>,
}

impl KubeWrites {
    /// Whether a write for the published model is still to be made.
    pub fn pending(&self) -> bool {
        use std::sync::atomic::Ordering::Acquire;
        self.registrar.pending.load(Acquire) || self.status_pending.load(Acquire)
    }

    /// Whether this daemon holds the registrar Lease.
    pub fn leader(&self) -> bool {
        self.registrar
            .leader
            .load(std::sync::atomic::Ordering::Acquire)
    }
}

/// What the Kubernetes writers work from, made with a model.
struct WriterInputs {
    registrar: crate::registrar::RegistrarInput,
    status: crate::route_status::StatusInput,
}

/// What one load of the registry produced: the model, and what the rest is made from once the
/// model serves ([`follow`]).
struct Loaded {
    model: Model,
    /// What the kept model took.
    applied: crate::model::live::Applied,
    /// The version of the kept model's objects the model was compiled from (`Live::version`).
    version: u64,
    /// The retention state the model was compiled with (spec/model.md §10).
    retained: Vec<crate::model::snapshot::RetainedPort>,
    /// The snapshot the model was compiled from, published with it (`aether debug explain`);
    /// `None` on the Kubernetes source, which makes it from the kept model after the publish.
    snapshot: Option<crate::model::Snapshot>,
    /// What was read, for what [`follow`] makes of it.
    read: Read,
    /// The etcd store revision of the snapshot's rows.
    etcd_revision: Option<i64>,
    /// What the Kubernetes writers read besides the model's route statuses (the stores'
    /// Services, routes and filters; the registrar's desired Services, made from the rows) may
    /// have changed: `false` only for a load of pods that left the desired Services as they were.
    writers_read_changed: bool,
}

/// The registry as read, beyond the snapshot.
enum Read {
    /// The file registry's fingerprint, taken before it was read (see
    /// `registry::file::fingerprint`).
    File { fingerprint: u64 },
    /// The Kubernetes source, whose objects, read from the stores after the publish, make the
    /// writers' inputs, and the fingerprint of what the model was compiled from (kept by
    /// changes, [`kube_feed`]).
    Kube(Arc<KubeSource>, u64),
}

/// What follows a published model, made after it serves: nothing here decides a request, so
/// none of it stands between a registry event and the new model (docs/decisions.md, "The model
/// is published first").
struct Followers {
    /// The mesh DNS table of the same snapshot, swapped in after the model: a name new to the
    /// registry resolves only once the model serves it. `None`: the one in place stands.
    dns: Option<DnsTable>,
    /// The Kubernetes source's writer inputs.
    writers: Option<WriterInputs>,
    /// The registry's fingerprint: stored once everything above is in place.
    fingerprint: u64,
}

/// Which of what follows a model is made again: the rest stands, since what it reads did not
/// change.
#[derive(Clone, Copy, Debug)]
struct Parts {
    /// The DNS table (it reads the Services).
    dns: bool,
    /// The Kubernetes writers' inputs (they read the stores' Services, routes and filters, the
    /// rows' services and ports, the model's route statuses).
    writers: bool,
    /// The data plane's metric series (the model's service ports and sources).
    series: bool,
}

impl Parts {
    const ALL: Self = Self {
        dns: true,
        writers: true,
        series: true,
    };
}

/// The DNS table, the writers' inputs (those of `parts`) and the fingerprint of what `model`
/// was compiled from.
fn follow(
    config: &NodeConfig,
    snapshot: &crate::model::Snapshot,
    model: &Model,
    read: Read,
    parts: Parts,
) -> Followers {
    let ctx = context(config);
    let dns = parts
        .dns
        .then(|| DnsTable::build(snapshot, &ctx.domains, config.dns_kubernetes_names));
    let (writers, fingerprint) = match read {
        Read::File { fingerprint } => (None, fingerprint),
        Read::Kube(_, fingerprint) if !parts.writers => (None, fingerprint),
        Read::Kube(kube, fingerprint) => {
            // Read after the publish: they may be newer than the model (the writers look again
            // at the next load); the fingerprint is the model's own.
            let (objects, _) = kube.objects();
            let (desired, _) =
                registrar::generated_services_except(snapshot, &ctx.ignored_namespaces);
            let writers = WriterInputs {
                registrar: crate::registrar::RegistrarInput {
                    desired,
                    existing: objects.services.clone(),
                    filters: crate::registrar::filter_status::wanted(&objects, snapshot),
                },
                status: crate::route_status::StatusInput {
                    statuses: model.route_statuses().cloned().collect(),
                    held: crate::route_status::held_routes(&objects),
                },
            };
            (Some(writers), fingerprint)
        }
    };
    Followers {
        dns,
        writers,
        fingerprint,
    }
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
        inbound_strict_default: config.inbound_mode_default == config::InboundMode::Strict,
    }
}

/// Load and compile the registry. `previous` is the model being replaced and its retention
/// state: HTTP entries whose rows vanished with no evidence are retained (model.md §10).
/// A file registry's `last` holds each manifest file's last content that read whole: a file
/// read half written, or damaged, is replaced by it, so that its pods stay in the mesh (issue
/// #8, finding 8). The Kubernetes source gives no model until every watch has listed; after
/// that, one refused (403) gives its last store (`KubeSource::synced`).
fn load(
    config: &NodeConfig,
    source: &Source,
    kept: &parking_lot::Mutex<Live>,
    stats: &NodeStats,
    previous: Option<(&Model, &[crate::model::snapshot::RetainedPort])>,
) -> Result<Loaded, NodeError> {
    let ctx = context(config);
    // The etcd source's directory Services as read, and its fingerprint: what its feed keeps.
    let mut etcd_read = None;
    let (mut snapshot, read, etcd_revision) = match source {
        Source::File(last) => {
            let (snapshot, fingerprint) = read_dir(config, &mut last.lock(), stats)?;
            (snapshot, Read::File { fingerprint }, None)
        }
        Source::Kube(kube, feed) => return load_kube(&ctx, kube, feed, kept, stats, previous),
        Source::Etcd(etcd) => {
            use std::sync::atomic::Ordering::AcqRel;
            // The directory is read whole at the first load and after it changed; etcd's rows
            // come by changes, or whole after a listing (issue #37).
            let dir = if etcd.dir_changed.swap(false, AcqRel) || !etcd.feed.lock().filled() {
                let read = read_dir(config, &mut etcd.last.lock(), stats);
                if read.is_err() {
                    etcd.dir_changed
                        .store(true, std::sync::atomic::Ordering::Release);
                }
                let read = read?;
                // This node's pods, as the directory gives them, are what it registers.
                *etcd.local.lock() = read
                    .0
                    .rows
                    .iter()
                    .filter(|r| r.node.as_deref() == Some(config.node_name.as_str()))
                    .map(|r| (**r).clone())
                    .collect();
                Some(read)
            } else {
                None
            };
            // Every node's rows are etcd's: none is served before the first listing.
            let Some((taken, revision)) = etcd.source.take_changes(dir.is_some()) else {
                stats.registry_synced.set(0);
                return Err(NodeError::NotSynced);
            };
            etcd.register();
            etcd.export(stats);
            let (mut snapshot, fingerprint) = match dir {
                None if !taken.whole => {
                    return Ok(load_etcd_changes(
                        &ctx, config, etcd, taken, revision, kept, stats, previous,
                    ));
                }
                Some(read) => read,
                // Listed again with the directory unchanged: read it too, as at the start. The
                // listing's rows are taken: should the directory not read, the next load reads
                // both whole again (`take_changes(true)`), or a row the listing dropped would
                // stay.
                None => read_dir(config, &mut etcd.last.lock(), stats).inspect_err(|_| {
                    etcd.dir_changed
                        .store(true, std::sync::atomic::Ordering::Release);
                })?,
            };
            snapshot.rows = taken.rows.into_iter().filter_map(|(_, row)| row).collect();
            etcd_read = Some((snapshot.services.clone(), fingerprint));
            (snapshot, Read::File { fingerprint }, Some(revision))
        }
    };
    // No API server: the registrar's Services are made here (spec/model.md §8), and they are
    // part of what is compiled. On Kubernetes the elected registrar writes them and every node
    // reads them back ([`follow`] makes the registrar's input).
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
    // The kept model takes what changed since the last load (issue #37): the components it
    // touches are compiled again, the rest is shared with the published model.
    let started = crate::time::now();
    let mut kept = kept.lock();
    let applied = kept.update_to(&snapshot, &ctx);
    let model = kept.model().clone();
    let version = kept.version();
    drop(kept);
    stats.record_compile(snapshot.rows.len(), &model, &applied, started.elapsed());
    if let (Source::Etcd(etcd), Some((services, fingerprint))) = (source, etcd_read) {
        etcd.feed.lock().fill(&services, &snapshot, fingerprint);
    }
    let retained = snapshot.retained.clone();
    Ok(Loaded {
        model,
        applied,
        version,
        retained,
        snapshot: Some(snapshot),
        read,
        etcd_revision,
        writers_read_changed: true,
    })
}

/// [`load`] on the etcd source when only rows changed ([`etcd_feed`]): the rows, the Services
/// the registrar makes of them and the retained ports of their services go to the kept model;
/// no snapshot is made on the way to the publish.
#[allow(clippy::too_many_arguments)]
fn load_etcd_changes(
    ctx: &NodeContext,
    config: &NodeConfig,
    etcd: &EtcdNode,
    taken: crate::registry::etcd::TableChanges,
    revision: i64,
    kept: &parking_lot::Mutex<Live>,
    stats: &NodeStats,
    previous: Option<(&Model, &[crate::model::snapshot::RetainedPort])>,
) -> Loaded {
    let started = crate::time::now();
    let mut feed = etcd.feed.lock();
    let fed = feed.changes(taken.rows, ctx, config.service_cidr, previous);
    let mut kept = kept.lock();
    let settings = kept.set_context(ctx.clone());
    let applied = settings.and(kept.apply(fed.changes));
    let model = kept.model().clone();
    let rows = kept.count(crate::model::live::Kind::Row);
    let version = kept.version();
    drop(kept);
    stats.record_compile(rows, &model, &applied, started.elapsed());
    Loaded {
        model,
        applied,
        version,
        retained: fed.retained,
        snapshot: None,
        read: Read::File {
            fingerprint: feed.fingerprint(),
        },
        etcd_revision: Some(revision),
        writers_read_changed: true,
    }
}

/// [`load`] on the Kubernetes source, which gives what changed ([`kube_feed`]): no snapshot on
/// the way to the publish. Nothing is served until every watch has listed; after that, a kind
/// refused (403) gives its last store (`KubeSource::synced`).
fn load_kube(
    ctx: &NodeContext,
    kube: &Arc<KubeSource>,
    feed: &parking_lot::Mutex<kube_feed::KubeFeed>,
    kept: &parking_lot::Mutex<Live>,
    stats: &NodeStats,
    previous: Option<(&Model, &[crate::model::snapshot::RetainedPort])>,
) -> Result<Loaded, NodeError> {
    let synced = kube.synced();
    stats.registry_synced.set(i64::from(synced));
    if !synced {
        return Err(NodeError::NotSynced);
    }
    let started = crate::time::now();
    let mut kept = kept.lock();
    let fed = feed.lock().load(kube, &mut kept, ctx, previous);
    let model = kept.model().clone();
    let rows = kept.count(crate::model::live::Kind::Row);
    let version = kept.version();
    drop(kept);
    debug!(
        whole = fed.whole,
        changes = fed.applied.changes,
        "kube source loaded"
    );
    stats
        .registry_objects_skipped
        .set(i64::try_from(fed.skipped).unwrap_or(i64::MAX));
    stats.record_compile(rows, &model, &fed.applied, started.elapsed());
    Ok(Loaded {
        model,
        applied: fed.applied,
        version,
        retained: fed.retained,
        snapshot: None,
        read: Read::Kube(kube.clone(), fed.fingerprint),
        etcd_revision: None,
        writers_read_changed: !fed.only_pods || fed.desired_changed,
    })
}

/// Read the manifest directory: its snapshot and fingerprint.
fn read_dir(
    config: &NodeConfig,
    last: &mut LastGood,
    stats: &NodeStats,
) -> Result<(crate::model::Snapshot, u64), NodeError> {
    // Taken first: if the directory changes while it is read, the fingerprint is the older one
    // and the change event brings another load.
    let fingerprint = crate::registry::file::fingerprint(&config.registry).map_err(|source| {
        NodeError::Registry {
            path: config.registry.clone(),
            source,
        }
    })?;
    let loaded =
        load_dir_keeping(&config.registry, last).map_err(|source| NodeError::Registry {
            path: config.registry.clone(),
            source,
        })?;
    // Each problem is logged when it appears, not at every reload; the faults are counted at
    // every load that finds them (the metric's contract).
    let mut reported = BTreeSet::new();
    for problem in &loaded.problems {
        let line = problem.to_string();
        if !last.reported.contains(&line) {
            warn!(%problem, "registry document skipped (logged again only if it changes)");
        }
        reported.insert(line);
    }
    for fault in &loaded.faults {
        stats
            .registry_file_errors
            .get_or_create(&[("reason", fault.issue.reason())])
            .inc();
        let line = fault.to_string();
        if !last.reported.contains(&line) {
            warn!(%fault, "registry file not whole (logged again only if it changes)");
        }
        reported.insert(line);
    }
    log_changes(&mut last.reported, reported);
    let held = loaded.faults.iter().filter(|f| f.kept_last_good).count();
    stats
        .registry_files_held
        .set(i64::try_from(held).unwrap_or(i64::MAX));
    stats.registry_synced.set(1);
    Ok((loaded.snapshot, fingerprint))
}

/// The registry problems a load `reported` (each logged by the caller only when `last` lacks
/// it) become the ones `last` holds; how many of the earlier ones are gone is logged once.
fn log_changes(last: &mut BTreeSet<String>, reported: BTreeSet<String>) {
    let gone = last.difference(&reported).count();
    if gone > 0 {
        info!(resolved = gone, "registry problems logged before are gone");
    }
    *last = reported;
}

/// The model of a node whose registry has not been read yet: no pods, nothing served.
fn empty(config: &NodeConfig) -> Loaded {
    let ctx = context(config);
    let snapshot = crate::model::Snapshot::default();
    Loaded {
        model: compile(&snapshot, &ctx),
        applied: crate::model::live::Applied::default(),
        version: 0,
        retained: Vec::new(),
        snapshot: Some(snapshot),
        read: Read::File { fingerprint: 0 },
        etcd_revision: None,
        writers_read_changed: true,
    }
}

/// The snapshot `model` was compiled from: the one loaded with it, or (the Kubernetes source)
/// made from the kept model, which holds what the model was compiled from until the next load.
fn snapshot_of(
    loaded: Option<crate::model::Snapshot>,
    kept: &parking_lot::Mutex<Live>,
) -> crate::model::Snapshot {
    loaded.unwrap_or_else(|| kept.lock().snapshot())
}

/// Bind `<state_dir>/cni.sock` (replacing whatever is there) and serve the CNI API on it, into
/// `requests`; the serving task and the file bound.
fn serve_cni(
    path: &Path,
    requests: &mpsc::Sender<CniRequest>,
    inputs: &Inputs,
) -> Result<(tokio::task::AbortHandle, listeners::OwnedPath), NodeError> {
    let listener = cni::bind(path)?;
    let owned = listeners::OwnedPath::bound(path);
    let task = tokio::spawn(cni::serve(
        listener,
        requests.clone(),
        inputs.stats.accept_errors("cni"),
    ));
    Ok((task.abort_handle(), owned))
}

/// Bind `<state_dir>/admin.sock` (replacing whatever is there) and serve the admin endpoints on
/// it; the serving task and the file bound.
fn serve_admin_unix(
    path: &Path,
    admin: &Arc<admin::Admin>,
) -> Result<(tokio::task::AbortHandle, listeners::OwnedPath), NodeError> {
    let _ = std::fs::remove_file(path);
    let unix = tokio::net::UnixListener::bind(path).map_err(|source| NodeError::StateDir {
        path: path.to_path_buf(),
        source,
    })?;
    let owned = listeners::OwnedPath::bound(path);
    let task = tokio::spawn(admin::serve_unix(admin.clone(), unix));
    Ok((task.abort_handle(), owned))
}

/// Delegated liveness on the etcd source (spec/model.md §14): this node's pods are probed every
/// `probe_interval_ms`, and their rows registered again when a readiness changes.
fn spawn_probes(
    config: &NodeConfig,
    source: Arc<Source>,
    pods: Arc<Mutex<Pods>>,
    metrics: Arc<NodeStats>,
) {
    let settings = liveness::ProbeSettings {
        interval: Duration::from_millis(config.probe_interval_ms),
        timeout: Duration::from_millis(config.probe_timeout_ms),
        failure_threshold: config.probe_failure_threshold,
    };
    tokio::spawn(async move {
        let Source::Etcd(etcd) = &*source else { return };
        let mut tick = tokio::time::interval(settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let local = etcd.local.lock().clone();
            // The store's readiness of the pods not probed yet, where their probes start.
            let held = etcd.held_readiness(&local).unwrap_or_default();
            let targets = {
                let pods = pods.lock().await;
                local
                    .iter()
                    .filter_map(|r| {
                        let name = r.pod.clone()?;
                        Some(liveness::Target {
                            held: held.ready(r),
                            net: pods.net_of(&r.namespace, &name),
                            pod: (r.namespace.clone(), name),
                            addr: std::net::SocketAddr::new(r.address, u16::try_from(r.port).ok()?),
                            probe: liveness::probe_for(r),
                        })
                    })
                    .collect()
            };
            if etcd.liveness.round(targets, &settings).await {
                etcd.register();
            }
            etcd.export(&metrics);
        }
    });
}

/// The senders of the Kubernetes writers' inputs, and the registrar's task (which ends, giving
/// its Lease up, once its sender is dropped).
type WriterSenders = (
    watch::Sender<Arc<crate::registrar::RegistrarInput>>,
    watch::Sender<Arc<crate::route_status::StatusInput>>,
    tokio::task::JoinHandle<()>,
);

/// How long a stopping daemon gives its registrar to release the Lease.
const RELEASE_BOUND: Duration = Duration::from_secs(2);

/// Start the registrar (spec/model.md §8, under the Lease) and the route-status writer
/// (spec/routes.md §6); they act on the inputs sent with each published model.
fn spawn_writers(
    config: &NodeConfig,
    client: &kube::Client,
    writes: &KubeWrites,
    stats: &Arc<NodeStats>,
) -> WriterSenders {
    use tracing::Instrument;
    let (reg_tx, reg_rx) = watch::channel(Arc::default());
    let (st_tx, st_rx) = watch::channel(Arc::default());
    let settings = crate::registrar::RegistrarSettings {
        namespace: config.release_namespace.clone(),
        lease_name: crate::registrar::LEASE_NAME.to_owned(),
        // Unique per process: two daemons of one node (an upgrade) are two claimants.
        identity: format!("{}-{:08x}", config.node_name, fastrand::u32(..)),
        timing: crate::registrar::lease::LeaseTiming::default(),
    };
    let registrar = tokio::spawn(
        crate::registrar::run(
            client.clone(),
            settings,
            reg_rx,
            writes.registrar.clone(),
            stats.registrar.clone(),
        )
        .instrument(tracing::info_span!("registrar")),
    );
    let lease = writes.registrar.clone();
    tokio::spawn(
        crate::route_status::run(
            client.clone(),
            st_rx,
            writes.status_pending.clone(),
            move || lease.follows.load(std::sync::atomic::Ordering::Acquire),
            stats.route_status.clone(),
        )
        .instrument(tracing::info_span!("route_status")),
    );
    (reg_tx, st_tx, registrar)
}

/// The recorded CNI pods of `state_dir` that are still there; stale records are removed.
fn rediscover(state_dir: &Path, home: &Netns) -> CniPods {
    let (kept, dropped) = cni_records::Records::new(state_dir).reload(home);
    for (path, why) in &dropped {
        info!(record = %path.display(), reason = %crate::DisplayChain(why), "stale CNI record dropped");
    }
    if !kept.is_empty() || !dropped.is_empty() {
        info!(
            pods = kept.len(),
            stale = dropped.len(),
            "CNI pods of an earlier run found again"
        );
    }
    kept.into_iter()
        .map(|r| {
            (
                (r.namespace, r.pod),
                pods::CniPod {
                    netns: r.netns,
                    ips: r.ips,
                },
            )
        })
        .collect()
}

/// Where the daemon says it has started (`pod_dir`): written once it has taken its
/// predecessor's sockets or found none, so that a predecessor answers `/ready` 503 from then on.
/// The chart's startup probe waits for it, so that no readiness probe of the new pod runs
/// while the old daemon could still answer it as if it were the new one (issue #35 item 4).
pub const STARTED_MARKER: &str = "started";

fn mark_started(config: &NodeConfig) {
    let Some(dir) = &config.pod_dir else { return };
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(dir.join(STARTED_MARKER), b"started\n"));
    if let Err(e) = written {
        error!(dir = %dir.display(), error = %e, "the start marker cannot be written: the startup probe will fail");
    }
}

/// A successor daemon's hand-off, as the task serving `handoff.sock` tells the daemon's loop.
#[derive(Debug)]
enum Handing {
    /// A successor asks for the sockets: stop accepting ADDs and reconciling, and send them.
    Taking(tokio::sync::oneshot::Sender<Vec<(handoff::ListenerId, std::os::fd::OwnedFd)>>),
    /// It did not take over: serve on.
    Failed,
    /// It serves every pod: stop accepting.
    Done,
}

/// Every pod is served on the predecessor's sockets: tell it, so that it stops accepting and
/// drains; sockets no pod took are closed.
async fn hand_over_done(predecessor: &mut Option<handoff::Taken>, pods: &Arc<Mutex<Pods>>) {
    let Some(taken) = predecessor.take() else {
        return;
    };
    let unused = pods.lock().await.drop_unused_inherited();
    match tokio::task::spawn_blocking(move || taken.ready()).await {
        Ok(Ok(())) => info!(
            unused,
            "the previous daemon hands over: it drains and exits"
        ),
        Ok(Err(e)) => warn!(error = %crate::DisplayChain(&e), "telling the previous daemon failed"),
        Err(e) => warn!(error = %e, "telling the previous daemon failed"),
    }
}

/// Offer this daemon's listening sockets on `path` to a successor: each connection asks the
/// daemon's loop for them ([`Handing::Taking`]), then passes them; the loop hears how it ended.
/// The file bound, or `None` (logged) when it could not be.
fn serve_handoff(path: &Path, handing: mpsc::Sender<Handing>) -> Option<listeners::OwnedPath> {
    let _ = std::fs::remove_file(path);
    let listener = match tokio::net::UnixListener::bind(path) {
        Ok(l) => l,
        Err(e) => {
            error!(error = %e, path = %path.display(), "handoff socket: upgrades will drop connections");
            return None;
        }
    };
    let owned = listeners::OwnedPath::bound(path);
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    warn!(error = %e, "handoff accept failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let Ok(stream) = stream.into_std().and_then(|s| {
                s.set_nonblocking(false)?;
                Ok(s)
            }) else {
                continue;
            };
            let (reply, offered) = tokio::sync::oneshot::channel();
            if handing.send(Handing::Taking(reply)).await.is_err() {
                return;
            }
            let Ok(listeners) = offered.await else {
                return;
            };
            let n = listeners.len();
            let outcome = match tokio::task::spawn_blocking(move || {
                handoff::give(&stream, listeners)
            })
            .await
            {
                Ok(Ok(())) => {
                    info!(sockets = n, "handed the listening sockets to a successor");
                    Handing::Done
                }
                Ok(Err(e)) => {
                    warn!(error = %crate::DisplayChain(&e), "handoff to a successor failed; still serving");
                    Handing::Failed
                }
                Err(e) => {
                    warn!(error = %e, "handoff task failed; still serving");
                    Handing::Failed
                }
            };
            let done = matches!(outcome, Handing::Done);
            if handing.send(outcome).await.is_err() || done {
                return;
            }
        }
    });
    Some(owned)
}

/// One CNI request while a successor takes over (`handoff`): an ADD is answered "try again"
/// (the runtime retries it, and the retry reaches the successor, which holds `cni.sock` now); a
/// DEL only forgets the pod, so that the sockets handed over stay as they are; a CHECK as ever.
async fn cni_while_handing_over(
    req: CniRequest,
    config: &NodeConfig,
    shared: &Shared,
    pods: &Arc<Mutex<Pods>>,
    cni_pods: &Arc<Mutex<CniPods>>,
    stats: &NodeStats,
) {
    let outcome = match &req.command {
        CniCommand::Add { .. } => {
            stats.cni_try_again.inc();
            let reason = "a successor daemon is taking over this node";
            warn!(reason, "CNI ADD refused");
            Err(CniRefusal::TryAgain(reason.to_owned()))
        }
        CniCommand::Del { namespace, pod, .. } => {
            cni_pods
                .lock()
                .await
                .remove(&(namespace.clone(), pod.clone()));
            if let Err(e) = cni_records::Records::new(&config.state_dir).remove(namespace, pod) {
                warn!(namespace = %namespace, pod = %pod, error = %e, "removing the CNI record");
            }
            Ok(())
        }
        CniCommand::Check { .. } => {
            let (outcome, _) =
                handle_cni(&req.command, config, shared, pods, cni_pods, stats).await;
            outcome.map_err(CniRefusal::Refused)
        }
    };
    let _ = req.reply.send(outcome);
}

/// Handle one CNI request (issue #8, finding 11; issue #9 §4). An ADD's namespace must exist
/// and be a pod's ([`Netns::open_pod`]) and hold the addresses the ADD names; it is recorded
/// ([`cni_records`]) and the reply waits for the reconcile: an error with the reason when the
/// pod is then not served (the ADD and its record are then forgotten, as the runtime will retry
/// or tear down). A DEL forgets the pod and its record. A CHECK is answered ok when the pod is
/// served, or when its ADD is known and the registry does not ask for the pod to be served here
/// (an unmanaged pod). Returns the reply and, when it reconciled, whether every local pod is
/// served.
async fn handle_cni(
    command: &CniCommand,
    config: &NodeConfig,
    shared: &Shared,
    pods: &Arc<Mutex<Pods>>,
    cni_pods: &Arc<Mutex<CniPods>>,
    stats: &NodeStats,
) -> (Result<(), String>, Option<bool>) {
    let records = cni_records::Records::new(&config.state_dir);
    match command {
        CniCommand::Add {
            namespace,
            pod,
            netns,
            ips,
        } => {
            let refuse = |reason: String| {
                stats.cni_refused.inc();
                warn!(namespace = %namespace, pod = %pod, %reason, "CNI ADD refused");
                reason
            };
            let ns = match Netns::open_pod(netns, &shared.home) {
                Ok(ns) => ns,
                Err(e) => {
                    let reason = refuse(crate::DisplayChain(&e).to_string());
                    return (Err(reason), None);
                }
            };
            match ns.missing_addresses(&shared.home, ips) {
                Ok(missing) if missing.is_empty() => {}
                Ok(missing) => {
                    let reason = refuse(format!(
                        "{} does not hold {missing:?}, which the ADD names",
                        netns.display()
                    ));
                    return (Err(reason), None);
                }
                Err(e) => {
                    let reason = refuse(crate::DisplayChain(&e).to_string());
                    return (Err(reason), None);
                }
            }
            let record = cni_records::CniRecord {
                namespace: namespace.clone(),
                pod: pod.clone(),
                netns: netns.clone(),
                ips: ips.clone(),
                netns_id: ns.id(),
            };
            // Recorded before it is served: a pod served without a record would be lost by a
            // restart, its capture programmed and nothing listening behind it.
            let earlier = records.read(namespace, pod);
            if let Err(e) = records.save(&record) {
                let reason = refuse(format!(
                    "record the pod in {}: {e}",
                    records.dir().display()
                ));
                return (Err(reason), None);
            }
            let key = (namespace.clone(), pod.clone());
            let before = cni_pods.lock().await.insert(
                key.clone(),
                pods::CniPod {
                    netns: netns.clone(),
                    ips: ips.clone(),
                },
            );
            let failed = reconcile(config, shared, pods, cni_pods).await;
            match failed.get(&key) {
                Some(reason) => {
                    let mut known = cni_pods.lock().await;
                    match before {
                        Some(earlier) => known.insert(key, earlier),
                        None => known.remove(&key),
                    };
                    drop(known);
                    let restored = match &earlier {
                        Some(r) => records.save(r),
                        None => records.remove(namespace, pod),
                    };
                    if let Err(e) = restored {
                        warn!(namespace = %namespace, pod = %pod, error = %e, "restoring the CNI record");
                    }
                    let reason = refuse(format!("pod {namespace}/{pod} is not served: {reason}"));
                    (Err(reason), Some(false))
                }
                None => (Ok(()), Some(failed.is_empty())),
            }
        }
        CniCommand::Del { namespace, pod, .. } => {
            cni_pods
                .lock()
                .await
                .remove(&(namespace.clone(), pod.clone()));
            if let Err(e) = records.remove(namespace, pod) {
                warn!(namespace = %namespace, pod = %pod, error = %e, "removing the CNI record");
            }
            let failed = reconcile(config, shared, pods, cni_pods).await;
            (Ok(()), Some(failed.is_empty()))
        }
        CniCommand::Check { namespace, pod, .. } => {
            let key = (namespace.clone(), pod.clone());
            if pods.lock().await.is_served(&key) {
                return (Ok(()), None);
            }
            let known = cni_pods.lock().await.clone();
            let wanted = pods::desired(
                &shared.inputs.model.load(),
                &config.node_name,
                &config.netns_prefix,
                &known,
                &config.inbound_trusted_sources,
            )
            .contains_key(&key);
            let outcome = match (wanted, known.contains_key(&key)) {
                (true, _) => Err(format!("pod {namespace}/{pod} is not served")),
                (false, true) => Ok(()),
                (false, false) => Err(format!("no CNI ADD is known for pod {namespace}/{pod}")),
            };
            (outcome, None)
        }
    }
}

/// The pods not served, as last logged (issue #36 item 6: 10,000 pods the daemon could not
/// serve wrote 20,000 ERROR lines every 2 s). A pod is logged when it fails first or for
/// another reason, and once more when it is served; a retry that fails the same way is only
/// counted, and the count is logged at most once a minute.
#[derive(Debug, Default)]
pub struct NotServedLog {
    reasons: BTreeMap<(String, String), String>,
    repeats: u64,
    summed_at: Option<std::time::Instant>,
}

/// How often the retries that failed as before are summed up in the log.
const NOT_SERVED_SUMMARY: Duration = Duration::from_secs(60);

/// What one reconcile's outcome adds to the log ([`NotServedLog::record`]).
#[derive(Debug, Default, PartialEq, Eq)]
struct NotServedLines {
    /// Pods that failed first, or for another reason than before.
    failed: Vec<((String, String), String)>,
    /// Pods that failed before and do not now.
    recovered: Vec<(String, String)>,
    /// `(pods not served, retries that failed as before)`, once a minute at most.
    summary: Option<(usize, u64)>,
}

impl NotServedLog {
    /// The pods not served at the last reconcile.
    pub fn pods(&self) -> Vec<(String, String)> {
        self.reasons.keys().cloned().collect()
    }

    fn record(
        &mut self,
        failed: &BTreeMap<(String, String), String>,
        now: std::time::Instant,
    ) -> NotServedLines {
        let mut lines = NotServedLines::default();
        for (key, reason) in failed {
            if self.reasons.get(key) == Some(reason) {
                self.repeats += 1;
            } else {
                lines.failed.push((key.clone(), reason.clone()));
            }
        }
        lines.recovered = self
            .reasons
            .keys()
            .filter(|k| !failed.contains_key(*k))
            .cloned()
            .collect();
        self.reasons.clone_from(failed);
        let due = self
            .summed_at
            .is_none_or(|at| now.duration_since(at) >= NOT_SERVED_SUMMARY);
        if self.repeats > 0 && due {
            lines.summary = Some((failed.len(), self.repeats));
            self.repeats = 0;
            self.summed_at = Some(now);
        }
        lines
    }

    /// [`NotServedLog::record`], written to the log.
    fn log(&mut self, failed: &BTreeMap<(String, String), String>) {
        let lines = self.record(failed, crate::time::now());
        for ((ns, pod), reason) in &lines.failed {
            error!(namespace = %ns, pod = %pod, error = %reason, "pod not served; retrying every 2 s (logged again when the reason changes)");
        }
        for (ns, pod) in &lines.recovered {
            info!(namespace = %ns, pod = %pod, "pod served after retries, or no longer wanted");
        }
        if let Some((pods, retries)) = lines.summary {
            warn!(
                pods,
                retries, "pods still not served, each as logged before; retrying"
            );
        }
    }
}

/// Set the node's readiness, logged when it changes (issue #36 item 6: "ready" was logged at
/// start, before anything had been listed).
fn set_ready(ready: &watch::Sender<bool>, now: bool) {
    let was = ready.send_replace(now);
    match (was, now) {
        (false, true) => info!("ready: the registry is read whole and every local pod is served"),
        (true, false) => warn!("not ready: /ready names what it waits for"),
        _ => {}
    }
}

/// Reconcile the local pods with the current model; the pods not served, with the reason
/// (logged through [`NotServedLog`]; every local pod is served when it is empty).
async fn reconcile(
    config: &NodeConfig,
    shared: &Shared,
    pods: &Arc<Mutex<Pods>>,
    cni_pods: &Arc<Mutex<CniPods>>,
) -> BTreeMap<(String, String), String> {
    let model = shared.inputs.model.load();
    let known = cni_pods.lock().await.clone();
    let want = pods::desired(
        &model,
        &config.node_name,
        &config.netns_prefix,
        &known,
        &config.inbound_trusted_sources,
    );
    let failed = pods.lock().await.reconcile(shared, want).await;
    let failed = failed
        .into_iter()
        .map(|(key, e)| (key, crate::DisplayChain(&e).to_string()))
        .collect();
    shared.not_served.lock().log(&failed);
    failed
}

/// Stop accepting on the pods' listeners; HTTP connections finish what is in flight and close.
async fn stop_accepting(inputs: &Inputs, pods: &Arc<Mutex<Pods>>) {
    // Dropping the served pods stops their accept loops; capture stays programmed, so a pod
    // is not silently taken out of the mesh while the daemon restarts.
    let mut p = pods.lock().await;
    *p = Pods::default();
    drop(p);
    // HTTP connections finish what is in flight and close; idle ones close now.
    inputs.drain.send_replace(true);
}

/// Wait (bounded) for the connections to finish.
async fn drain(inputs: &Inputs, bound: Duration) {
    let deadline = crate::time::now() + bound;
    while inputs.stats.active.get() > 0 && crate::time::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = inputs.stats.active.get();
    if left > 0 {
        warn!(connections = left, "drain bound reached; closing");
    }
}

#[cfg(test)]
mod etcd_feed_tests;
#[cfg(test)]
mod kube_feed_tests;
#[cfg(test)]
mod publish_tests;
#[cfg(test)]
mod registry_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod upgrade_tests;
