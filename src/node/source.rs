//! Where the daemon reads its registry ([`Source`]: the manifest directory, the Kubernetes
//! API server, etcd), each load of it ([`load`]) and what follows a published model ([`follow`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tracing::{debug, info, warn};

use super::stats::NodeStats;
use super::writers::WriterInputs;
use super::{NodeConfig, NodeError};
use super::{config, etcd_feed, kube_feed, liveness, stats};
use crate::dns::table::DnsTable;
use crate::model::live::Live;
use crate::model::names::Domains;
use crate::model::{Model, NodeContext, compile, registrar};
use crate::registry::file::{LastGood, load_dir_keeping};
use crate::registry::kube::watch::KubeSource;

/// Where this daemon reads its registry.
pub(super) enum Source {
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
    pub(super) last: parking_lot::Mutex<LastGood>,
    /// Every node's rows, listed and watched.
    pub(super) source: Arc<crate::registry::etcd::EtcdSource>,
    /// This node's rows, written under its lease.
    pub(super) registration: crate::registry::etcd::Registration,
    /// The probes' answers.
    pub(super) liveness: Arc<liveness::Liveness>,
    /// This node's rows as the directory gives them (readiness aside), for the probes.
    pub(super) local: parking_lot::Mutex<Vec<crate::model::snapshot::Row>>,
    /// The store revision of the rows of the published model.
    pub(super) compiled: std::sync::atomic::AtomicI64,
    /// What the loads by changes keep ([`etcd_feed`]).
    pub(super) feed: parking_lot::Mutex<etcd_feed::EtcdFeed>,
    /// The manifest directory changed since it was last read (set by its watch): the next load
    /// reads it whole.
    pub(super) dir_changed: std::sync::atomic::AtomicBool,
    /// The readiness the store held at this run's first listing, while a local pod is still
    /// to be probed ([`EtcdNode::held_readiness`]).
    pub(super) first_listed: parking_lot::Mutex<Option<Readiness>>,
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
    pub(super) fn export(&self, metrics: &NodeStats) {
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
    pub(super) fn register(&self) {
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
    pub(super) fn held_readiness(
        &self,
        local: &[crate::model::snapshot::Row],
    ) -> Option<HeldReadiness> {
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
pub(super) type Readiness = BTreeMap<(String, String, std::net::IpAddr), bool>;

/// Rows' readiness as the store holds it.
#[derive(Debug, Default)]
pub(super) struct HeldReadiness(Readiness);

impl HeldReadiness {
    /// The readiness the store holds `now`, and for a row it no longer holds, the one it held
    /// at the first listing (kept in `first`, taken from `now` at the first call).
    pub(super) fn of(first: &mut Option<Readiness>, now: Readiness) -> Self {
        let mut held = first.get_or_insert_with(|| now.clone()).clone();
        held.extend(now);
        Self(held)
    }

    /// `row`'s readiness in the store; not Ready when the store has no row of it.
    pub(super) fn ready(&self, row: &crate::model::snapshot::Row) -> bool {
        self.0
            .get(&(row.namespace.clone(), row.service.clone(), row.address))
            .copied()
            .unwrap_or(false)
    }
}

/// What one load of the registry produced: the model, and what the rest is made from once the
/// model serves ([`follow`]).
pub(super) struct Loaded {
    pub(super) model: Model,
    /// What the kept model took.
    pub(super) applied: crate::model::live::Applied,
    /// The version of the kept model's objects the model was compiled from (`Live::version`).
    pub(super) version: u64,
    /// The retention state the model was compiled with (spec/model.md §10).
    pub(super) retained: Vec<crate::model::snapshot::RetainedPort>,
    /// The snapshot the model was compiled from, published with it (`aether debug explain`);
    /// `None` on the Kubernetes source, which makes it from the kept model after the publish.
    pub(super) snapshot: Option<crate::model::Snapshot>,
    /// What was read, for what [`follow`] makes of it.
    pub(super) read: Read,
    /// The etcd store revision of the snapshot's rows.
    pub(super) etcd_revision: Option<i64>,
    /// What the Kubernetes writers read besides the model's route statuses (the stores'
    /// Services, routes and filters; the registrar's desired Services, made from the rows) may
    /// have changed: `false` only for a load of pods that left the desired Services as they were.
    pub(super) writers_read_changed: bool,
}

/// The registry as read, beyond the snapshot.
pub(super) enum Read {
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
pub(super) struct Followers {
    /// The mesh DNS table of the same snapshot, swapped in after the model: a name new to the
    /// registry resolves only once the model serves it. `None`: the one in place stands.
    pub(super) dns: Option<DnsTable>,
    /// The Kubernetes source's writer inputs.
    pub(super) writers: Option<WriterInputs>,
    /// The registry's fingerprint: stored once everything above is in place.
    pub(super) fingerprint: u64,
}

/// Which of what follows a model is made again: the rest stands, since what it reads did not
/// change.
#[derive(Clone, Copy, Debug)]
pub(super) struct Parts {
    /// The DNS table (it reads the Services).
    pub(super) dns: bool,
    /// The Kubernetes writers' inputs (they read the stores' Services, routes and filters, the
    /// rows' services and ports, the model's route statuses).
    pub(super) writers: bool,
    /// The data plane's metric series (the model's service ports and sources).
    pub(super) series: bool,
}

impl Parts {
    pub(super) const ALL: Self = Self {
        dns: true,
        writers: true,
        series: true,
    };
}

/// The DNS table, the writers' inputs (those of `parts`) and the fingerprint of what `model`
/// was compiled from.
pub(super) fn follow(
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

pub(super) fn context(config: &NodeConfig) -> NodeContext {
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
pub(super) fn load(
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
pub(super) fn load_etcd_changes(
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
pub(super) fn load_kube(
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
pub(super) fn read_dir(
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
pub(super) fn log_changes(last: &mut BTreeSet<String>, reported: BTreeSet<String>) {
    let gone = last.difference(&reported).count();
    if gone > 0 {
        info!(resolved = gone, "registry problems logged before are gone");
    }
    *last = reported;
}

/// The model of a node whose registry has not been read yet: no pods, nothing served.
pub(super) fn empty(config: &NodeConfig) -> Loaded {
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
pub(super) fn snapshot_of(
    loaded: Option<crate::model::Snapshot>,
    kept: &parking_lot::Mutex<Live>,
) -> crate::model::Snapshot {
    loaded.unwrap_or_else(|| kept.lock().snapshot())
}
