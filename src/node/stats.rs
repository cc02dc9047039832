//! Counters of the daemon's control side (registry, CNI, mesh DNS), exported on `/metrics`
//! beside the data plane's [`crate::proxy::Stats`].

use std::time::Duration;

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::model::Model;
use crate::model::diag::DiagnosticKind;
use crate::model::live::Applied;
use crate::model::rows::RowProblem;
use crate::proxy::{Counter, Family, Gauge};

/// A metric with one label.
type ByOne<M> = Family<[(&'static str, &'static str); 1], M>;

/// How long model compiles take, in seconds, by kind (`full`, `incremental`): 10 µs to about
/// 21 s, doubling.
#[derive(Debug, Clone)]
pub struct CompileSeconds(pub HistogramsByOne);

/// Histograms with one label, each made with the same buckets.
pub type HistogramsByOne = prometheus_client::metrics::family::Family<
    [(&'static str, &'static str); 1],
    Histogram,
    fn() -> Histogram,
>;

impl Default for CompileSeconds {
    fn default() -> Self {
        Self(
            prometheus_client::metrics::family::Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_01, 2.0, 22))
            }),
        )
    }
}

/// The publisher's histograms (`node::publish`).
#[derive(Debug, Clone)]
pub struct PublishHistograms {
    /// From a change's notice to its model in place, in seconds: 100 µs to about 105 s,
    /// doubling.
    pub delay: Histogram,
    /// Registry objects changed per publish: 1 to 2^20, doubling; above 1, changes were
    /// coalesced.
    pub changes: Histogram,
}

impl Default for PublishHistograms {
    fn default() -> Self {
        Self {
            delay: Histogram::new(exponential_buckets(0.000_1, 2.0, 21)),
            changes: Histogram::new(exponential_buckets(1.0, 2.0, 21)),
        }
    }
}

/// The control side's counters; one per daemon, shared by its tasks.
#[derive(Debug, Default)]
pub struct NodeStats {
    /// The registrar's counters ([`crate::registrar::RegistrarStats`]).
    pub registrar: std::sync::Arc<crate::registrar::RegistrarStats>,
    /// The route status writer's counters ([`crate::route_status::RouteStatusStats`]).
    pub route_status: std::sync::Arc<crate::route_status::RouteStatusStats>,
    /// Manifest files that did not read whole, counted at every load that found one so, by
    /// reason: `unreadable`, `not-utf8`, `syntax`, `too-large`, `too-deep`, `emptied`
    /// (`aether_registry_file_errors_total{reason}`).
    pub registry_file_errors: ByOne<Counter>,
    /// Manifest files served from their last good content now
    /// (`aether_registry_files_held`).
    pub registry_files_held: Gauge,
    /// CNI ADDs answered with an error: a namespace that does not exist or is not a pod's, or a
    /// pod that could not be served (`aether_cni_refused_total`).
    pub cni_refused: Counter,
    /// CNI ADDs answered "try again" (CNI error 11), which the runtime retries: the registry
    /// not read whole yet, the pod not in it within `cni_add_wait_ms`, or
    /// `cni_add_waiters_max` ADDs waiting already (`aether_cni_try_again_total`).
    pub cni_try_again: Counter,
    /// CNI ADDs waiting now for their pod to appear in the registry (`cni_add_wait_ms`,
    /// `aether_cni_adds_waiting`).
    pub cni_adds_waiting: Gauge,
    /// DNS-over-TCP connections closed at once because their pod's server had
    /// `dns_tcp_max_clients` open (`aether_dns_tcp_refused_total`).
    pub dns_tcp_refused: Counter,
    /// DNS-over-TCP connections closed because a query did not arrive whole within
    /// `dns_tcp_query_timeout_ms` (`aether_dns_tcp_timeouts_total`).
    pub dns_tcp_timeouts: Counter,
    /// Connections to the metrics listener closed at accept: `metrics_max_connections` were
    /// open (`aether_metrics_connections_over_limit_total`).
    pub metrics_over_limit: Counter,
    /// 1 once every watch of the Kubernetes source has listed, else 0 (`aether_registry_synced`;
    /// always 1 with the file registry).
    pub registry_synced: Gauge,
    /// Objects the Kubernetes source holds that did not deserialize, or did not convert, and
    /// are left out of the model (`aether_registry_objects_skipped`).
    pub registry_objects_skipped: Gauge,
    /// Publishes, by outcome: `published` (a new generation), `unchanged` (the model served
    /// like the published one: kept under its generation), `failed` (the load failed; the
    /// published model stays) (`aether_model_publishes_total{outcome}`).
    pub model_publishes: ByOne<Counter>,
    /// How long changes took to their model in place, and how many one publish took
    /// (`aether_model_publish_delay_seconds`, `aether_model_publish_changes`).
    pub model_publish: PublishHistograms,
    /// Models compiled from the registry, by kind: `full` (everything compiled: the first,
    /// a new setting) or `incremental` (the components a change touched)
    /// (`aether_model_compiles_total{kind}`).
    pub model_compiles: ByOne<Counter>,
    /// How long each took: from the snapshot read to the kept model brought to it, DNS table
    /// aside (`aether_model_compile_duration_seconds{kind}`).
    pub model_compile_seconds: CompileSeconds,
    /// Registry objects changed (added, replaced, deleted) since the last compile, summed
    /// (`aether_model_changes_total`).
    pub model_changes: Counter,
    /// Components compiled again, summed (`aether_model_components_compiled_total`).
    pub model_components_compiled: Counter,
    /// Mesh services in the published model (`aether_model_services`).
    pub model_services: Gauge,
    /// Registry rows (pods with mesh ports) in its snapshot (`aether_model_rows`).
    pub model_rows: Gauge,
    /// Rows not served, by `RowProblem` reason; a pod whose annotations do not parse counts as
    /// `annotation-unparseable` (`aether_model_rows_refused{reason}`).
    pub model_rows_refused: ByOne<Gauge>,
    /// What the compiler refused, dropped or flagged, by kind: class-vote disagreements,
    /// reserved ports declared, ... (`aether_model_diagnostics{kind}`).
    pub model_diagnostics: ByOne<Gauge>,
    /// Capture programmed into pods' namespaces, by outcome (`aether_capture_programs_total
    /// {outcome}`: `served`, `rules-changed`, `failed`, `removed`, `remove-failed`).
    pub capture_programs: ByOne<Counter>,
    /// Pods this node serves now (`aether_pods_served`).
    pub pods_served: Gauge,
    /// etcd source: keys refused on read, by reason, each refusal once
    /// (`aether_etcd_keys_refused_total{reason}`).
    pub etcd_keys_refused: ByOne<Counter>,
    /// etcd source: this node's rows not registered, by `RowProblem` reason
    /// (`aether_etcd_rows_not_registered_total{reason}`).
    pub etcd_rows_not_registered: ByOne<Counter>,
    /// etcd source: full listings of the prefix (`aether_etcd_listings_total`).
    pub etcd_listings: Counter,
    /// etcd source: watch streams started (`aether_etcd_watches_total`).
    pub etcd_watches: Counter,
    /// etcd source: leases granted to this node's registration (`aether_etcd_leases_total`).
    pub etcd_leases: Counter,
    /// etcd source: 1 while the watch is connected (`aether_etcd_connected`).
    pub etcd_connected: Gauge,
    /// etcd source: keys this node holds in the store (`aether_etcd_keys_registered`).
    pub etcd_keys_registered: Gauge,
}

/// Raises `counter` to `total` (a count kept elsewhere, read at a scrape's pace).
pub fn catch_up(counter: &Counter, total: u64) {
    let had = counter.get();
    if total > had {
        counter.inc_by(total - had);
    }
}

impl NodeStats {
    /// Count one compile (of `rows` rows) into `model`, which took `took`, and set the model's
    /// gauges to it. Off the data plane: compiles run on a blocking thread.
    pub fn record_compile(&self, rows: usize, model: &Model, applied: &Applied, took: Duration) {
        let n = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        let kind = [("kind", applied.kind())];
        self.model_compiles.get_or_create(&kind).inc();
        self.model_compile_seconds
            .0
            .get_or_create(&kind)
            .observe(took.as_secs_f64());
        self.model_changes
            .inc_by(u64::try_from(applied.changes).unwrap_or(u64::MAX));
        self.model_components_compiled
            .inc_by(u64::try_from(applied.compiled).unwrap_or(u64::MAX));
        self.model_services.set(n(model.mesh_service_count()));
        self.model_rows.set(n(rows));
        // As the compiler judged them: a row refused carries its reason; a pod whose
        // annotations do not parse made no row and is `annotation-unparseable`.
        for reason in RowProblem::ALL {
            let refused = model
                .diagnostics
                .iter()
                .filter(|d| match d.kind {
                    DiagnosticKind::RowRefused => d.detail == reason.as_str(),
                    DiagnosticKind::PodRefused => reason == RowProblem::AnnotationUnparseable,
                    _ => false,
                })
                .count();
            self.model_rows_refused
                .get_or_create(&[("reason", reason.as_str())])
                .set(n(refused));
        }
        for kind in DiagnosticKind::ALL {
            let count = model.diagnostics.iter().filter(|d| d.kind == kind).count();
            self.model_diagnostics
                .get_or_create(&[("kind", kind.as_str())])
                .set(n(count));
        }
    }

    /// Count one publish that took `changes` registry objects, `delay` after its notice.
    pub fn record_publish(&self, unchanged: bool, changes: usize, delay: Duration) {
        self.model_publish_outcome(if unchanged { "unchanged" } else { "published" });
        self.model_publish.delay.observe(delay.as_secs_f64());
        #[allow(clippy::cast_precision_loss)] // a count far below 2^52
        self.model_publish.changes.observe(changes as f64);
    }

    /// Count one publish by its outcome.
    pub fn model_publish_outcome(&self, outcome: &'static str) {
        self.model_publishes
            .get_or_create(&[("outcome", outcome)])
            .inc();
    }

    /// Count one capture programming of a pod's namespace.
    pub fn capture_programmed(&self, outcome: &'static str) {
        self.capture_programs
            .get_or_create(&[("outcome", outcome)])
            .inc();
    }

    /// Register every metric, in the order `/metrics` lists them.
    pub fn register(&self, registry: &mut Registry) {
        self.register_registry_files(registry);
        self.register_edge_refusals(registry);
        self.register_sources(registry);
        self.registrar.register(registry);
        self.route_status.register(registry);
        self.register_model_updates(registry);
        self.register_model_contents(registry);
        self.register_pods(registry);
    }

    /// Manifest files that did not read whole, and those served from their last good content.
    fn register_registry_files(&self, registry: &mut Registry) {
        registry.register(
            "aether_registry_file_errors",
            "Manifest files that did not read whole (being written, not UTF-8, invalid YAML, over the size or depth bound), per load, by reason",
            self.registry_file_errors.clone(),
        );
        registry.register(
            "aether_registry_files_held",
            "Manifest files served from their last content that read whole",
            self.registry_files_held.clone(),
        );
    }

    /// What the node's edges turned away or keep waiting: CNI ADDs, mesh DNS over TCP, the metrics
    /// listener.
    fn register_edge_refusals(&self, registry: &mut Registry) {
        registry.register(
            "aether_cni_refused",
            "CNI ADDs answered with an error (no such namespace, not a pod's, pod not served)",
            self.cni_refused.clone(),
        );
        registry.register(
            "aether_cni_try_again",
            "CNI ADDs answered try again (registry not read whole, pod not in it in time, too many ADDs waiting)",
            self.cni_try_again.clone(),
        );
        registry.register(
            "aether_cni_adds_waiting",
            "CNI ADDs waiting for their pod to appear in the registry",
            self.cni_adds_waiting.clone(),
        );
        registry.register(
            "aether_dns_tcp_refused",
            "Mesh DNS TCP connections closed at once: the pod's server had dns_tcp_max_clients open",
            self.dns_tcp_refused.clone(),
        );
        registry.register(
            "aether_dns_tcp_timeouts",
            "Mesh DNS TCP connections closed: a query did not arrive whole in time",
            self.dns_tcp_timeouts.clone(),
        );
        registry.register(
            "aether_metrics_connections_over_limit",
            "Connections to the metrics listener closed at accept: metrics_max_connections were open",
            self.metrics_over_limit.clone(),
        );
    }

    /// The registry sources: whether their watches listed, what they left out, and the etcd source.
    fn register_sources(&self, registry: &mut Registry) {
        registry.register(
            "aether_registry_synced",
            "1 once every registry watch has had its first complete list",
            self.registry_synced.clone(),
        );
        registry.register(
            "aether_registry_objects_skipped",
            "Registry objects left out of the model: they did not deserialize or convert",
            self.registry_objects_skipped.clone(),
        );
        registry.register(
            "aether_etcd_keys_refused",
            "etcd source: registry keys refused on read, by reason, each refusal once",
            self.etcd_keys_refused.clone(),
        );
        registry.register(
            "aether_etcd_rows_not_registered",
            "etcd source: this node's rows not registered (spec/model.md 3.3), by reason",
            self.etcd_rows_not_registered.clone(),
        );
        registry.register(
            "aether_etcd_listings",
            "etcd source: full listings of the registry prefix (the first, then one per compaction past the watch)",
            self.etcd_listings.clone(),
        );
        registry.register(
            "aether_etcd_watches",
            "etcd source: watch streams started (the first, then one per lost connection)",
            self.etcd_watches.clone(),
        );
        registry.register(
            "aether_etcd_leases",
            "etcd source: leases granted to this node's registration",
            self.etcd_leases.clone(),
        );
        registry.register(
            "aether_etcd_connected",
            "etcd source: 1 while the registry watch is connected",
            self.etcd_connected.clone(),
        );
        registry.register(
            "aether_etcd_keys_registered",
            "etcd source: keys this node holds in the store",
            self.etcd_keys_registered.clone(),
        );
    }

    /// How the model is brought up to date: its publishes and its compiles.
    fn register_model_updates(&self, registry: &mut Registry) {
        registry.register(
            "aether_model_publishes",
            "Model publishes, by outcome (published, unchanged, failed)",
            self.model_publishes.clone(),
        );
        registry.register_with_unit(
            "aether_model_publish_delay",
            "From a registry change's notice to its model in place (coalescing included)",
            Unit::Seconds,
            self.model_publish.delay.clone(),
        );
        registry.register(
            "aether_model_publish_changes",
            "Registry objects changed per publish (above 1: coalesced)",
            self.model_publish.changes.clone(),
        );
        registry.register(
            "aether_model_compiles",
            "Models compiled from the registry, by kind (full, incremental)",
            self.model_compiles.clone(),
        );
        registry.register_with_unit(
            "aether_model_compile_duration",
            "How long a model compile took, by kind",
            Unit::Seconds,
            self.model_compile_seconds.0.clone(),
        );
        registry.register(
            "aether_model_changes",
            "Registry objects changed, as the compiles took them",
            self.model_changes.clone(),
        );
        registry.register(
            "aether_model_components_compiled",
            "Components of the registry compiled again",
            self.model_components_compiled.clone(),
        );
    }

    /// What the published model holds, and what its compile refused or flagged.
    fn register_model_contents(&self, registry: &mut Registry) {
        registry.register(
            "aether_model_services",
            "Mesh services in the published model",
            self.model_services.clone(),
        );
        registry.register(
            "aether_model_rows",
            "Registry rows (pods with mesh ports) the published model was compiled from",
            self.model_rows.clone(),
        );
        registry.register(
            "aether_model_rows_refused",
            "Rows not served, by RowProblem reason",
            self.model_rows_refused.clone(),
        );
        registry.register(
            "aether_model_diagnostics",
            "What the compiler refused, dropped or flagged, by kind (class-disagreement, reserved-port, ...)",
            self.model_diagnostics.clone(),
        );
    }

    /// The pods this node serves and the capture programmed into them.
    fn register_pods(&self, registry: &mut Registry) {
        registry.register(
            "aether_capture_programs",
            "Capture programmed into pods' namespaces, by outcome",
            self.capture_programs.clone(),
        );
        registry.register(
            "aether_pods_served",
            "Pods this node serves",
            self.pods_served.clone(),
        );
    }
}
