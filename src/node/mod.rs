//! `aether node`: the daemon's wiring (ARCHITECTURE.md "node"). The only module that starts
//! long-lived tasks and connects the parts: registry → model → proxies, capture, DNS, admin.

pub mod admin;
pub mod admin_state;
mod cni_api;
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
mod source;
pub mod stats;
pub mod telemetry;
pub mod tls;
mod upgrade;
mod writers;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, watch};
use tracing::{error, info, warn};

use crate::capture::cni::{self};
use crate::proxy::Inputs;
use cni_api::*;
pub use config::NodeConfig;
use pods::{CniPods, Pods, Shared};
#[cfg(test)]
use run::run_until;
pub use run::{run, run_with_logs};
pub use source::EtcdNode;
use source::*;
use stats::NodeStats;
pub use upgrade::STARTED_MARKER;
use upgrade::*;
pub use writers::KubeWrites;
use writers::*;

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
