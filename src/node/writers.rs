//! The Kubernetes source's writers: the registrar (spec/model.md §8, under the Lease) and the
//! route-status writer (spec/routes.md §6), with what they share with `/ready`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::NodeConfig;
use super::stats::NodeStats;

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
pub(super) struct WriterInputs {
    pub(super) registrar: crate::registrar::RegistrarInput,
    pub(super) status: crate::route_status::StatusInput,
}

/// The senders of the Kubernetes writers' inputs, and the registrar's task (which ends, giving
/// its Lease up, once its sender is dropped).
pub(super) type WriterSenders = (
    watch::Sender<Arc<crate::registrar::RegistrarInput>>,
    watch::Sender<Arc<crate::route_status::StatusInput>>,
    tokio::task::JoinHandle<()>,
);

/// How long a stopping daemon gives its registrar to release the Lease.
pub(super) const RELEASE_BOUND: Duration = Duration::from_secs(2);

/// Start the registrar (spec/model.md §8, under the Lease) and the route-status writer
/// (spec/routes.md §6); they act on the inputs sent with each published model.
pub(super) fn spawn_writers(
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
