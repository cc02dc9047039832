//! The publisher: the one writer of the published model (issue #37, item 2).
//!
//! A registry source only says that something changed (a notice on a channel of one, so that
//! notices never queue up). The publisher takes a notice, waits out the coalescing window
//! ([`pace`](super::pace): `publish_coalesce_ms` on the watched sources, `watch_debounce_ms` on
//! the directory), and has the source's [`Feed`] give the kept model ([`Live`]) what changed since
//! the last load: the components it touches are compiled again, the rest is shared. It publishes
//! that model whole through the [`ModelHandle`] (spec/model.md §13: no request sees two), and
//! only then makes what follows from it: the data plane's metric series, the mesh DNS table, the
//! Kubernetes writers' inputs. Nothing after the swap decides a request (docs/decisions.md, "The
//! model is published first").
//!
//! A notice that arrives while a load runs stays in the channel: the next publish takes it, so
//! no change is lost. A load that fails keeps the published model; the next notice tries again.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, error, info};

use super::pace::{Edge, Pace};
use super::{Loaded, NodeConfig, NodeError, Parts, Read, follow, retire};
use crate::dns::table::DnsTable;
use crate::model::Model;
use crate::model::live::{Applied, Kind, Live};
use crate::model::snapshot::RetainedPort;
use crate::node::stats::NodeStats;
use crate::proxy::metrics::DataPlane;
use crate::state::{MakeSource, ModelHandle, Source};

/// What a source gives the publisher: each load brings the kept model to the registry as it is
/// now, by what changed since the last one (or by everything, after a resync).
pub(crate) trait Feed: Send + Sync + 'static {
    /// Give `kept` what changed and hand back its model. `previous` is the published model and
    /// its retention state (spec/model.md §10).
    fn load(
        &self,
        config: &NodeConfig,
        kept: &parking_lot::Mutex<Live>,
        stats: &NodeStats,
        previous: Option<(&Model, &[RetainedPort])>,
    ) -> Result<Loaded, NodeError>;

    /// How notices are paced: at once after a quiet spell, then at most one load per window
    /// (a watched source), or always the window after the last notice (a directory a generator
    /// may still be writing).
    fn edge(&self) -> Edge;
}

impl Feed for super::Source {
    fn load(
        &self,
        config: &NodeConfig,
        kept: &parking_lot::Mutex<Live>,
        stats: &NodeStats,
        previous: Option<(&Model, &[RetainedPort])>,
    ) -> Result<Loaded, NodeError> {
        super::load(config, self, kept, stats, previous)
    }

    fn edge(&self) -> Edge {
        match self {
            Self::File(_) => Edge::Trailing,
            Self::Kube(..) | Self::Etcd(_) => Edge::Leading,
        }
    }
}

/// Where the Kubernetes writers' inputs go: the registrar's, the route statuses'.
pub(crate) type WriterChannels = (
    watch::Sender<Arc<crate::registrar::RegistrarInput>>,
    watch::Sender<Arc<crate::route_status::StatusInput>>,
);

/// Where a publish goes: the model, and what is made from it after it serves.
pub(crate) struct Outputs {
    /// The published model.
    pub(crate) handle: Arc<ModelHandle>,
    /// The data plane's metric series, one per service port of the model.
    pub(crate) metrics: Arc<DataPlane>,
    /// The mesh DNS table.
    pub(crate) dns: Arc<ArcSwap<DnsTable>>,
    /// The Kubernetes writers' inputs (the registrar's, the route statuses').
    pub(crate) writers: Option<WriterChannels>,
    /// What the writers have yet to look at.
    pub(crate) kube_writes: Arc<super::KubeWrites>,
}

/// What one publish did.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// A model was loaded and is in place, with what follows from it.
    Published(Publication),
    /// The source has not listed everything yet: nothing was published (fail closed).
    NotSynced,
    /// The load failed: the published model stays.
    Failed,
}

/// A model in place.
#[derive(Debug)]
pub(crate) struct Publication {
    /// The generation serving now.
    pub(crate) generation: u64,
    /// The model served like the one before it: kept under the same generation.
    pub(crate) unchanged: bool,
    /// What the kept model took.
    pub(crate) applied: Applied,
    /// The registry's fingerprint of what the model was compiled from, once everything that
    /// follows from it is in place; `None` when that failed (the previous ones stay).
    pub(crate) settled: Option<u64>,
    /// The etcd store revision of the model's rows.
    pub(crate) etcd_revision: Option<i64>,
    /// From the notice taken to the model in place.
    pub(crate) delay: Duration,
}

/// The one writer of the published model.
pub(crate) struct Publisher<F> {
    feed: Arc<F>,
    config: NodeConfig,
    /// The model kept by changes ([`Live`]).
    kept: Arc<parking_lot::Mutex<Live>>,
    stats: Arc<NodeStats>,
    out: Outputs,
    pace: Pace,
    /// The retention state of the published model (spec/model.md §10).
    retained: Vec<RetainedPort>,
}

impl<F: Feed> Publisher<F> {
    /// A publisher of `feed`'s changes into `out`, whose first model was compiled into `kept`
    /// with `retained`.
    pub(crate) fn new(
        feed: Arc<F>,
        config: NodeConfig,
        kept: Arc<parking_lot::Mutex<Live>>,
        stats: Arc<NodeStats>,
        out: Outputs,
        retained: Vec<RetainedPort>,
    ) -> Self {
        let window = match feed.edge() {
            Edge::Leading => config.publish_coalesce_ms,
            Edge::Trailing => config.watch_debounce_ms,
        };
        Self {
            pace: Pace::new(feed.edge(), Duration::from_millis(window)),
            feed,
            config,
            kept,
            stats,
            out,
            retained,
        }
    }

    /// Whether the published model retains a port, which expires by the clock: a load is due
    /// now and then even when nothing changes.
    pub(crate) fn retaining(&self) -> bool {
        !self.retained.is_empty()
    }

    /// Publish what changed, a notice having been taken from `changed`: wait out the coalescing
    /// window (every notice meanwhile is taken by this publish), load, publish, follow.
    pub(crate) async fn publish(&mut self, changed: &mut mpsc::Receiver<()>) -> Outcome {
        let noticed = Instant::now();
        // Waited here, inside the caller's branch, so that no other branch can drop the notice.
        tokio::time::sleep(self.pace.wait(noticed)).await;
        while changed.try_recv().is_ok() {}
        self.pace.started(Instant::now());
        // Reading and compiling is blocking work: off the data plane's threads.
        let previous = self.out.handle.load();
        let (feed, config, kept, stats) = (
            self.feed.clone(),
            self.config.clone(),
            self.kept.clone(),
            self.stats.clone(),
        );
        let retained = self.retained.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            feed.load(&config, &kept, &stats, Some((&previous, &retained)))
                .map(|l| {
                    // Compared here, off the runtime's thread: 0.15 to 0.29 of the compile
                    // (docs/performance.md).
                    let unchanged = l.model.serves_like(&previous);
                    let statuses = previous.route_statuses().eq(l.model.route_statuses());
                    (l, unchanged, statuses)
                })
        })
        .await;
        let loaded = match loaded {
            Ok(Ok(l)) => l,
            Ok(Err(NodeError::NotSynced)) => {
                debug!("registry not synced");
                return Outcome::NotSynced;
            }
            Ok(Err(e)) => {
                error!(error = %crate::DisplayChain(&e), "registry reload failed; keeping the previous model");
                self.stats.model_publish_outcome("failed");
                return Outcome::Failed;
            }
            Err(e) => {
                error!(error = %e, "registry reload task failed; keeping the previous model");
                self.stats.model_publish_outcome("failed");
                return Outcome::Failed;
            }
        };
        let (l, unchanged, same_statuses) = loaded;
        // What follows the model is made again where what it reads changed: the DNS table
        // from the Services; the writers' inputs (the Kubernetes source's) unless the load took
        // pods alone that left the registrar's desired Services as they were, and the route
        // statuses stand.
        let a = &l.applied;
        let parts = Parts {
            dns: a.touched(Kind::Service),
            writers: matches!(l.read, Read::Kube(..))
                && (a.full || l.writers_read_changed || !same_statuses),
            // The series are kept per service port and per source (a mesh service, a pod's
            // ServiceAccount): made again when one of those came or went (the kept model
            // counts them by component).
            series: !unchanged && (a.full || a.series_changed),
        };
        self.retained.clone_from(&l.retained);
        debug!(retained = self.retained.len(), "recompiled");
        let snapshot = l.snapshot.map(Arc::new);
        let generation = self.swap(l.model, snapshot.clone(), l.version, unchanged);
        let delay = noticed.elapsed();
        self.stats
            .record_publish(unchanged, l.applied.changes, delay);
        let settled = self.follow(l.read, snapshot, parts).await;
        Outcome::Published(Publication {
            generation,
            unchanged,
            applied: l.applied,
            settled,
            etcd_revision: l.etcd_revision,
            delay,
        })
    }

    /// The model first: it is what serves. A model that serves like the published one is not
    /// published again (no new generation, no series rebuilt): it is swapped in under the same
    /// generation, beside the snapshot it was compiled from.
    fn swap(
        &self,
        model: Model,
        snapshot: Option<Arc<crate::model::Snapshot>>,
        version: u64,
        unchanged: bool,
    ) -> u64 {
        let handle = &self.out.handle;
        // Beside the model for `aether debug`: the snapshot the load read, or (the Kubernetes
        // source, which reads none) one made from the kept model when asked, while it is still
        // at this version.
        let kept = match snapshot {
            _ if !self.config.debug_keep_snapshot => Source::None,
            Some(s) => Source::Kept(s),
            None => Source::Made(Arc::new(KeptSource(self.kept.clone())), version),
        };
        let replaced = if unchanged {
            debug!(
                generation = handle.generation(),
                "recompiled: the model serves as the published one; not published again"
            );
            handle.refresh(model, kept)
        } else {
            let (generation, replaced) = handle.replace_shared(model, kept);
            info!(generation, "model published");
            replaced
        };
        // What this replaces is freed off the runtime's thread (node::retire).
        retire::model(replaced);
        handle.generation()
    }

    /// What follows the published model, off the request path and off the runtime's threads:
    /// the metric series of the services it holds, the DNS table, the writers' inputs and the
    /// registry's fingerprint. Awaited, so that two rebuilds never race over the series table.
    /// `snapshot`: what the model was compiled from, when the load read one whole; unless kept
    /// for `aether debug`, it is freed there too.
    async fn follow(
        &self,
        read: Read,
        snapshot: Option<Arc<crate::model::Snapshot>>,
        parts: Parts,
    ) -> Option<u64> {
        let (metrics, published, config, live) = (
            self.out.metrics.clone(),
            self.out.handle.published(),
            self.config.clone(),
            self.kept.clone(),
        );
        let followed = tokio::task::spawn_blocking(move || {
            let model = &published.model;
            if parts.series {
                metrics.rebuild(model);
            }
            // The kinds the followers read, from the kept model (still at the published
            // version: no load runs until this is done), when one of them is made again.
            let snapshot = match snapshot {
                Some(s) => s,
                None if parts.dns || parts.writers => {
                    Arc::new(
                        live.lock()
                            .snapshot_of(&[Kind::Service, Kind::Row, Kind::MeshFilter]),
                    )
                }
                None => Arc::default(),
            };
            follow(&config, &snapshot, model, read, parts)
        })
        .await;
        let followed = match followed {
            Ok(f) => f,
            Err(e) => {
                error!(error = %e, "metric series, DNS table or writer inputs failed; the previous ones stay");
                return None;
            }
        };
        if let (Some(w), Some((registrar, status))) = (followed.writers, &self.out.writers) {
            use std::sync::atomic::Ordering::Release;
            // Marked pending before the fingerprint is stored: a reader of `/model` never sees
            // this registry state as settled before the writers looked at it.
            let writes = &self.out.kube_writes;
            writes.status_pending.store(true, Release);
            if writes.leader() {
                writes.registrar.pending.store(true, Release);
            }
            let _ = registrar.send(Arc::new(w.registrar));
            let _ = status.send(Arc::new(w.status));
        }
        if let Some(dns) = followed.dns {
            retire::drop_off_runtime(self.out.dns.swap(Arc::new(dns)));
        }
        Some(followed.fingerprint)
    }
}

/// The snapshot of a publish, made from the kept model when `aether debug` asks for it, if the
/// kept model is still at that publish's version (a debug view waits for a load under way).
#[derive(Debug)]
struct KeptSource(Arc<parking_lot::Mutex<Live>>);

impl MakeSource for KeptSource {
    fn make(&self, version: u64) -> Option<crate::model::Snapshot> {
        let kept = self.0.lock();
        (kept.version() == version).then(|| kept.snapshot())
    }
}
