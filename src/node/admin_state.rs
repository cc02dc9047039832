//! What the admin and debug endpoints read ([`Admin`]): one value the daemon builds at start and
//! both listeners share. Its own module, so the admin listener ([`super::admin`]) and the debug
//! endpoints ([`mod@super::debug`]) each read it without reading each other.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, watch};

use super::pods::Pods;
use crate::identity::Identities;
use crate::log_filter::LogFilter;
use crate::proxy::Inputs;

/// What the admin endpoints read.
#[derive(Debug)]
pub struct Admin {
    /// The data plane (model and counters).
    pub inputs: Arc<Inputs>,
    /// The served pods.
    pub pods: Arc<Mutex<Pods>>,
    /// Readiness.
    pub ready: watch::Receiver<bool>,
    /// This node.
    pub node: String,
    /// The fingerprint of the registry state the published model was compiled from.
    pub fingerprint: Arc<std::sync::atomic::AtomicU64>,
    /// The control side's counters (registry, CNI, mesh DNS).
    pub node_stats: Arc<super::stats::NodeStats>,
    /// Whether the Kubernetes writers (the registrar, if this node leads, and the route-status
    /// writer) have writes to make for the published model; always false on the file registry.
    pub kube_writes: Arc<super::KubeWrites>,
    /// The etcd source, on it (`/model` says how far it is).
    pub etcd: Option<Arc<super::EtcdNode>>,
    /// What the debug endpoints read besides the above.
    pub debug: DebugInputs,
    /// What `/metrics` reads at each scrape (watches, process, runtime).
    pub control: Arc<super::telemetry::ControlCollector>,
    /// The local pods not served, as last logged: `/ready` names them while it waits.
    pub not_served: Arc<parking_lot::Mutex<super::NotServedLog>>,
}

/// What the debug endpoints need besides the data plane.
#[derive(Debug)]
pub struct DebugInputs {
    /// The workload certificates (`None`: none are issued here).
    pub identities: Option<Arc<Identities>>,
    /// The log filter.
    pub logs: LogFilter,
    /// The largest request body read, in bytes (`debug_max_body_bytes`).
    pub max_body_bytes: usize,
    /// The bound on a capture listing (`debug_capture_timeout_ms`).
    pub capture_timeout: Duration,
}

impl DebugInputs {
    /// No certificates, a detached log filter, the default bounds (tests).
    pub fn detached() -> Self {
        Self {
            identities: None,
            logs: LogFilter::detached("info"),
            max_body_bytes: 65536,
            capture_timeout: Duration::from_secs(5),
        }
    }
}

/// A diagnostic as `/model` and `aether debug diagnostics` show it: the kind's stable name,
/// the subject, the detail.
pub(crate) fn diagnostic_json(d: &crate::model::Diagnostic) -> serde_json::Value {
    serde_json::json!({
        "kind": d.kind.as_str(),
        "subject": d.subject,
        "detail": d.detail,
    })
}
