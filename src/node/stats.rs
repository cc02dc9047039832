//! Counters of the daemon's control side (registry, CNI, mesh DNS), exported on `/metrics`
//! beside the data plane's [`crate::proxy::Stats`].

use crate::proxy::{Counter, Gauge};

/// The control side's counters; one per daemon, shared by its tasks.
#[derive(Debug, Default)]
pub struct NodeStats {
    /// Manifest files that did not read whole, counted at every load that found one so
    /// (`aether_registry_file_errors_total`).
    pub registry_file_errors: Counter,
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
    /// 1 while this daemon holds the registrar Lease, else 0 (`aether_registrar_leader`).
    pub registrar_leader: Gauge,
    /// Generated Services applied or deleted by this daemon as the registrar
    /// (`aether_registrar_writes_total`).
    pub registrar_writes: Counter,
    /// Registrar writes the API server refused or failed; each is retried
    /// (`aether_registrar_write_errors_total`).
    pub registrar_write_errors: Counter,
    /// Route status writes made (`aether_route_status_writes_total`).
    pub route_status_writes: Counter,
    /// Route status writes that failed, a `409` conflict included; each is retried
    /// (`aether_route_status_write_errors_total`).
    pub route_status_write_errors: Counter,
    /// Route status writes held back because another writer keeps overwriting aether's entry
    /// (spec/routes.md §6.5) (`aether_route_status_backoffs_total`).
    pub route_status_backoffs: Counter,
}

impl NodeStats {
    /// Register every metric.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "aether_registry_file_errors",
            "Manifest files that did not read whole (being written, not UTF-8, invalid YAML), per load",
            self.registry_file_errors.clone(),
        );
        registry.register(
            "aether_registry_files_held",
            "Manifest files served from their last content that read whole",
            self.registry_files_held.clone(),
        );
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
            "aether_registrar_leader",
            "1 while this daemon holds the registrar Lease and writes the generated Services",
            self.registrar_leader.clone(),
        );
        registry.register(
            "aether_registrar_writes",
            "Generated Services applied or deleted by this daemon as the registrar",
            self.registrar_writes.clone(),
        );
        registry.register(
            "aether_registrar_write_errors",
            "Registrar writes the API server refused or failed (retried)",
            self.registrar_write_errors.clone(),
        );
        registry.register(
            "aether_route_status_writes",
            "Route status writes this daemon made",
            self.route_status_writes.clone(),
        );
        registry.register(
            "aether_route_status_write_errors",
            "Route status writes that failed, conflicts included (retried)",
            self.route_status_write_errors.clone(),
        );
        registry.register(
            "aether_route_status_backoffs",
            "Route status rewrites held back: another writer keeps overwriting aether's entry",
            self.route_status_backoffs.clone(),
        );
    }
}
