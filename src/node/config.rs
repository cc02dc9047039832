//! The daemon's settings: defaults, then a YAML file, then environment and flags (main.rs
//! merges them). Every setting is documented in docs/node.md with its default and unit.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::log_filter::LogFormat;

/// The inbound mode of a pod without `inbound.aether.io/mode` (model.md §12.5 item 3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum InboundMode {
    /// Plaintext from outside the mesh reaches the pod's declared ports unless a Service that
    /// guards the pod has a service-level `rbac` or `ext_authz`.
    #[default]
    Permissive,
    /// Plaintext from outside the mesh to the pod's declared ports is refused.
    Strict,
}

/// Where the daemon reads the registry from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum RegistrySource {
    /// A directory of manifests (`registry`), watched for changes: the embedded default.
    #[default]
    File,
    /// The Kubernetes API server (in-cluster credentials, or `KUBECONFIG`).
    Kube,
    /// etcd for the registry rows (every node's pods, docs/etcd.md), and the directory
    /// `registry` for everything else and for this node's pods, which it registers.
    Etcd,
}

/// Every setting of `aether node`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// This node's name: the daemon's pods are those whose `spec.nodeName` is this.
    pub node_name: String,
    /// Where the registry is read from: `file` (the directory `registry`), `kube` (the API
    /// server) or `etcd` (every node's rows from etcd, the rest from `registry`).
    pub registry_source: RegistrySource,
    /// The file registry: a directory of Kubernetes manifests, watched for changes.
    pub registry: PathBuf,
    /// The namespace the daemon runs in (Kubernetes source): its registrar Lease lives there.
    pub release_namespace: String,
    /// Where the daemon keeps its sockets (`admin.sock`, `cni.sock`) and, when no CA is
    /// given, the demo CA.
    pub state_dir: PathBuf,
    /// A directory of this daemon's own, which a successor does not share (the chart's
    /// `emptyDir`): the daemon writes `started` there once it has taken its predecessor's
    /// sockets or found none, for the DaemonSet's startup probe (docs/kubernetes.md,
    /// "Upgrade"). None by default: no marker. Key `pod_dir`, `AETHER_POD_DIR`.
    pub pod_dir: Option<PathBuf>,
    /// The CA certificate (PEM); with `ca_key`. Absent: a CA is created once in
    /// `<state_dir>/ca` (demo only).
    pub ca_cert: Option<PathBuf>,
    /// The CA private key (PEM).
    pub ca_key: Option<PathBuf>,
    /// A directory holding `ca.pem` and `ca-key.pem`, created when missing (shared by the
    /// daemons of a local topology). Used when `ca_cert` is not given.
    pub ca_dir: Option<PathBuf>,
    /// Prefix added to the `aether.io/netns` annotation to name a pod's network namespace
    /// (file mode; lets several local topologies share one machine).
    pub netns_prefix: String,
    /// The admin HTTP listener on TCP, in the daemon's own network namespace; the admin unix
    /// socket `<state_dir>/admin.sock` is always served.
    pub admin_addr: Option<SocketAddr>,
    /// A TCP listener that serves `/metrics`, `/ready` and `/live` only (the per-node metrics
    /// endpoint and the probes of the DaemonSet); `/pods` and `/model` stay on `admin_addr` and
    /// the admin socket, the debug endpoints of `aether debug` on the admin socket alone.
    pub metrics_addr: Option<SocketAddr>,
    /// The most connections open at once to the metrics listener; a new one over it is closed
    /// at accept and counted. Default 64.
    pub metrics_max_connections: usize,
    /// The mesh domain.
    pub mesh_domain: String,
    /// The cluster domain.
    pub cluster_domain: String,
    /// The SPIFFE trust domain.
    pub trust_domain: String,
    /// Capture mode of a pod without `capture.aether.io/redirect-all`.
    pub capture_redirect_all_default: bool,
    /// Namespaces whose pods are never managed.
    pub ignored_namespaces: Vec<String>,
    /// The file registry's service CIDR: ClusterIPs of generated Services are allocated from
    /// it deterministically.
    pub service_cidr: ipnet::IpNet,
    /// Upstream resolvers for names mesh DNS does not answer; empty: the host's
    /// `/etc/resolv.conf`.
    pub dns_upstreams: Vec<SocketAddr>,
    /// Answer the Kubernetes Service names in mesh DNS (file mode stands in for the cluster
    /// DNS).
    pub dns_kubernetes_names: bool,
    /// Workload certificate lifetime, in hours (re-issued at half-life).
    pub cert_lifetime_hours: u64,
    /// How long shutdown waits for open connections, in seconds.
    pub drain_timeout_secs: u64,
    /// How long a registry directory change waits before the directory is read, in
    /// milliseconds: a generator may still be writing (the file source; `node::pace`).
    pub watch_debounce_ms: u64,
    /// The publisher's coalescing window on the watched sources (Kubernetes, etcd), in
    /// milliseconds: a change after a quiet spell is published at once, and publishes are then
    /// at most one per this, every change meanwhile taken by the next (`node::publish`).
    /// Default 20, at most 10000. Key `publish_coalesce_ms`, `AETHER_PUBLISH_COALESCE_MS`.
    pub publish_coalesce_ms: u64,
    /// How long a CNI ADD for a pod no published model knows yet waits for one that does, in
    /// milliseconds, *for each such ADD*; then it is answered "try again" (CNI error 11).
    /// Default 5000, at most 600000 (the plugin's longest `timeoutSecs`). Key `cni_add_wait_ms`,
    /// `AETHER_CNI_ADD_WAIT_MS`.
    pub cni_add_wait_ms: u64,
    /// How many such ADDs may wait at once; one more is answered "try again" at once and
    /// counted (`aether_cni_try_again_total`). Default 128 (a node's pod limit is 110 by
    /// default), at least 1. Key `cni_add_waiters_max`, `AETHER_CNI_ADD_WAITERS_MAX`.
    pub cni_add_waiters_max: usize,
    /// Kubernetes source: list with the API server's streaming lists (`sendInitialEvents`,
    /// Kubernetes 1.32+ by default) instead of pages, so a relist is served from the watch cache
    /// in one stream. Default false: paged lists of 500, which every server answers. Key
    /// `kube_streaming_lists`, `AETHER_KUBE_STREAMING_LISTS`.
    pub kube_streaming_lists: bool,
    /// Keep the registry snapshot each published model was compiled from beside it, for
    /// `aether debug services|routes|config-dump` and `aether explain --config-dump` (about 1.5×
    /// the model's memory: 213 MiB at 100,000 pods, docs/performance.md). Default true; off,
    /// those endpoints answer `503` and say why. Key `debug_keep_snapshot`,
    /// `AETHER_DEBUG_KEEP_SNAPSHOT`.
    pub debug_keep_snapshot: bool,
    /// Threads that run the data plane and everything else async (tokio workers). `1` runs a
    /// single-threaded runtime: on this project's 2-core machine it cost 20 % less CPU per
    /// request than two workers, with half the context switches (docs/performance.md), and one
    /// core of proxying serves tens of thousands of requests a second. More workers raise the
    /// ceiling on a busy node at that price. Default 1, from 1 to 64. Key `worker_threads`,
    /// `AETHER_WORKER_THREADS`.
    pub worker_threads: usize,
    /// etcd source: the members' client URLs (`http://host:2379`, or `https://` with
    /// `etcd_ca_cert`). Required with `registry_source: etcd`. Key `etcd_endpoints`,
    /// `AETHER_ETCD_ENDPOINTS` (comma-separated).
    pub etcd_endpoints: Vec<String>,
    /// etcd source: the prefix of every key (docs/etcd.md); the same on every node and every
    /// mirrored region. Default `/aether`. Key `etcd_prefix`, `AETHER_ETCD_PREFIX`.
    pub etcd_prefix: String,
    /// etcd source: the time to live of this node's lease, in seconds; a dead node's rows
    /// leave the registry within it. Default 10, from 2 to 3600. Key `etcd_lease_ttl_secs`,
    /// `AETHER_ETCD_LEASE_TTL_SECS`.
    pub etcd_lease_ttl_secs: u64,
    /// etcd source: the deadline of every call to etcd, and of the keep-alive ping that
    /// watches a quiet watch stream, in milliseconds. Default 5000. Key `etcd_timeout_ms`,
    /// `AETHER_ETCD_TIMEOUT_MS`.
    pub etcd_timeout_ms: u64,
    /// etcd source: the user name of etcd's own authentication, with `etcd_password_file`.
    /// Key `etcd_user`, `AETHER_ETCD_USER`.
    pub etcd_user: Option<String>,
    /// etcd source: a file holding the password (its first line). Key `etcd_password_file`,
    /// `AETHER_ETCD_PASSWORD_FILE`.
    pub etcd_password_file: Option<PathBuf>,
    /// etcd source: the CA certificate (PEM) the members' certificates are checked against;
    /// given, the endpoints are `https://`. Key `etcd_ca_cert`, `AETHER_ETCD_CA_CERT`.
    pub etcd_ca_cert: Option<PathBuf>,
    /// etcd source: a client certificate (PEM), with `etcd_client_key`, for members that ask
    /// for one. Key `etcd_client_cert`, `AETHER_ETCD_CLIENT_CERT`.
    pub etcd_client_cert: Option<PathBuf>,
    /// etcd source: the client certificate's key (PEM). Key `etcd_client_key`,
    /// `AETHER_ETCD_CLIENT_KEY`.
    pub etcd_client_key: Option<PathBuf>,
    /// Delegated liveness (etcd source, spec/model.md §14): how often each local pod's liveness
    /// port is probed, in milliseconds. Default 2000. Key `probe_interval_ms`,
    /// `AETHER_PROBE_INTERVAL_MS`.
    pub probe_interval_ms: u64,
    /// Delegated liveness: how long one probe may take (connect, and for an HTTP port the
    /// response's head), in milliseconds. Default 1000, at most `probe_interval_ms`. Key
    /// `probe_timeout_ms`, `AETHER_PROBE_TIMEOUT_MS`.
    pub probe_timeout_ms: u64,
    /// Delegated liveness: failed probes in a row that make a Ready pod not Ready. Default 3.
    /// One success makes it Ready again. Key `probe_failure_threshold`,
    /// `AETHER_PROBE_FAILURE_THRESHOLD`.
    pub probe_failure_threshold: u32,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter (tracing-subscriber `EnvFilter` syntax).
    pub log_level: String,
    /// The access log at start: `off`, `on`, or `sample=N` (one request or connection in N),
    /// on the `aether::access` target; changed at run time with `PUT /access-log` on the admin
    /// socket. Default `off`: at full rate it costs about 11 % of the request rate
    /// (docs/performance.md), and the metrics count every request whatever the mode. Key
    /// `access_log`, `AETHER_ACCESS_LOG`.
    pub access_log: String,
    /// Connections open at once through the daemon (captured, loopback, inbound hop); above
    /// it a new connection is closed at accept and counted.
    pub max_connections: usize,
    /// Connections open at once for one pod; above it a new connection of that pod is closed
    /// at accept and counted.
    pub max_connections_per_pod: usize,
    /// The mesh hop's TLS handshake bound, either side, in milliseconds.
    pub handshake_timeout_ms: u64,
    /// A connect to an endpoint (the mesh hop's TCP connect) or a passthrough destination that
    /// takes longer fails, in milliseconds; a delivery then tries another endpoint. Default
    /// 1000. Key `connect_timeout_ms`, `AETHER_CONNECT_TIMEOUT_MS`.
    pub connect_timeout_ms: u64,
    /// How long an endpoint that failed to connect is out of the endpoint choice, the first
    /// time, in milliseconds; each ejection in a row lasts twice the one before, at most
    /// `endpoint_ejection_max_ms`. Default 5000. Key `endpoint_ejection_ms`,
    /// `AETHER_ENDPOINT_EJECTION_MS`.
    pub endpoint_ejection_ms: u64,
    /// The longest ejection of an endpoint, in milliseconds (at least `endpoint_ejection_ms`).
    /// Default 30000. Key `endpoint_ejection_max_ms`, `AETHER_ENDPOINT_EJECTION_MAX_MS`.
    pub endpoint_ejection_max_ms: u64,
    /// The most endpoints (address and pod port) whose load and ejection the node keeps; an
    /// endpoint beyond it is chosen without them, counted. Default 65536. Key
    /// `endpoint_states_max`, `AETHER_ENDPOINT_STATES_MAX`.
    pub endpoint_states_max: usize,
    /// The inbound mode of a pod without `inbound.aether.io/mode`.
    pub inbound_mode_default: InboundMode,
    /// Sources whose plaintext reaches a pod's declared ports in both inbound modes, besides
    /// loopback, the pod's default gateway and its node's addresses (kubelet probes).
    pub inbound_trusted_sources: Vec<ipnet::IpNet>,
    /// The most UDP flows (client address, dialled address) open at once for one pod on port
    /// 18082; a datagram that would open another is dropped and counted. Default 1024.
    pub udp_max_flows_per_pod: usize,
    /// A UDP flow with no datagram either way for this long is closed, in seconds. Default 60.
    pub udp_idle_secs: u64,
    /// The most DNS-over-TCP connections open at once to one pod's mesh DNS; a new one over it
    /// is closed at once and counted. Default 64.
    pub dns_tcp_max_clients: usize,
    /// A DNS query over TCP must arrive whole within this long of its first byte, or the
    /// connection is closed and counted; in milliseconds. Default 5000.
    pub dns_tcp_query_timeout_ms: u64,
    /// How long a client may take to send a whole HTTP/1 request head, from its first byte (the
    /// first head: from the accept), in milliseconds; a late head closes the connection.
    pub header_read_timeout_ms: u64,
    /// An HTTP connection with no request in flight is closed after this long, in seconds.
    pub http_idle_timeout_secs: u64,
    /// The most concurrent streams of one HTTP/2 connection.
    pub http2_max_concurrent_streams: u32,
    /// The largest HTTP/2 request header list, in bytes.
    pub max_header_list_size: u32,
    /// The largest HTTP/1 request head, in bytes.
    pub max_header_bytes: usize,
    /// The most header fields of an HTTP/1 request head.
    pub max_headers: usize,
    /// A relayed byte stream (raw TCP, L4, passthrough, spliced upgrade) that moves no byte
    /// either way for this long is closed, in seconds; 0: never. Default 3600.
    pub tcp_idle_timeout_secs: u64,
    /// The largest request body buffered for a `RequestMirror` copy, in bytes. Default 1 MiB.
    pub mirror_max_body_bytes: usize,
    /// The largest `ext_authz` answer body read, in bytes. Default 64 KiB.
    pub ext_authz_max_body_bytes: usize,
    /// The most HTTP/2 streams one peer (a local pod on the source side; an identity from its
    /// address on the mesh hop) may have open at once over all its connections; a stream over
    /// it is refused (`REFUSED_STREAM`). Default 2000.
    pub max_streams_per_peer: usize,
    /// The bytes first request heads still being read may hold beyond one read's room
    /// (16 KiB each), over every connection of the node; a head that would take more is closed
    /// (`aether_shed_total{reason="head-budget"}`). Default 64 MiB; at least twice
    /// `max_header_bytes`.
    pub max_pending_head_bytes: usize,
    /// The memory the overload manager measures against, in bytes; 0 (the default): the limit
    /// of the daemon's memory cgroup (v2 or v1), and no shedding where there is none.
    pub overload_memory_limit_bytes: u64,
    /// Memory use (in percent of the limit) at which new connections are closed at accept.
    /// Default 90.
    pub overload_refuse_percent: u64,
    /// Memory use (in percent of the limit) at which new HTTP/2 streams are refused and HTTP
    /// connections with no request in flight are closed, the largest partial heads first.
    /// Default 95.
    pub overload_shed_percent: u64,
    /// How often the overload manager reads the memory in use, in milliseconds. Default 100.
    pub overload_interval_ms: u64,
    /// The largest request body the admin socket's debug endpoints read (an `aether debug
    /// explain` question, a log filter), in bytes, *for each request*; a larger one is answered
    /// `413`. Default 65536. Key `debug_max_body_bytes`, `AETHER_DEBUG_MAX_BODY_BYTES`.
    pub debug_max_body_bytes: usize,
    /// How long `aether debug capture` waits for `nft list table` in a pod's namespace, in
    /// milliseconds; then the listing is killed and answered `504`. Default 5000. Key
    /// `debug_capture_timeout_ms`, `AETHER_DEBUG_CAPTURE_TIMEOUT_MS`.
    pub debug_capture_timeout_ms: u64,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            node_name: String::new(),
            registry_source: RegistrySource::File,
            registry: PathBuf::from("config/examples/mp"),
            release_namespace: "aether-system".into(),
            state_dir: PathBuf::from("/var/run/aether"),
            pod_dir: None,
            ca_cert: None,
            ca_key: None,
            ca_dir: None,
            admin_addr: None,
            metrics_addr: None,
            metrics_max_connections: 64,
            debug_max_body_bytes: 65536,
            debug_capture_timeout_ms: 5000,
            netns_prefix: String::new(),
            mesh_domain: "aether.internal".into(),
            cluster_domain: "cluster.local".into(),
            trust_domain: "cluster.local".into(),
            capture_redirect_all_default: true,
            ignored_namespaces: vec!["kube-system".into()],
            service_cidr: "10.96.0.0/16".parse().expect("a valid CIDR literal"),
            dns_upstreams: Vec::new(),
            dns_kubernetes_names: true,
            cert_lifetime_hours: 24,
            drain_timeout_secs: 5,
            watch_debounce_ms: 200,
            publish_coalesce_ms: 20,
            cni_add_wait_ms: 5000,
            cni_add_waiters_max: 128,
            kube_streaming_lists: false,
            debug_keep_snapshot: true,
            worker_threads: 1,
            etcd_endpoints: Vec::new(),
            etcd_prefix: "/aether".into(),
            etcd_lease_ttl_secs: 10,
            etcd_timeout_ms: 5000,
            etcd_user: None,
            etcd_password_file: None,
            etcd_ca_cert: None,
            etcd_client_cert: None,
            etcd_client_key: None,
            probe_interval_ms: 2000,
            probe_timeout_ms: 1000,
            probe_failure_threshold: 3,
            log_format: LogFormat::Text,
            log_level: "info".into(),
            access_log: "off".into(),
            max_connections: 100_000,
            max_connections_per_pod: 20_000,
            handshake_timeout_ms: 10_000,
            connect_timeout_ms: 1000,
            endpoint_ejection_ms: 5000,
            endpoint_ejection_max_ms: 30_000,
            endpoint_states_max: 65_536,
            inbound_mode_default: InboundMode::Permissive,
            inbound_trusted_sources: Vec::new(),
            udp_max_flows_per_pod: 1024,
            udp_idle_secs: 60,
            dns_tcp_max_clients: 64,
            dns_tcp_query_timeout_ms: 5000,
            header_read_timeout_ms: 10_000,
            http_idle_timeout_secs: 300,
            http2_max_concurrent_streams: 200,
            max_header_list_size: 64 * 1024,
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            tcp_idle_timeout_secs: 3600,
            mirror_max_body_bytes: 1024 * 1024,
            ext_authz_max_body_bytes: 64 * 1024,
            max_streams_per_peer: crate::proxy::overload::DEFAULT_MAX_STREAMS_PER_PEER,
            max_pending_head_bytes: crate::proxy::overload::DEFAULT_MAX_PENDING_HEAD_BYTES,
            overload_memory_limit_bytes: 0,
            overload_refuse_percent: 90,
            overload_shed_percent: 95,
            overload_interval_ms: 100,
        }
    }
}

/// A setting is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("read config file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with its location.
        message: String,
    },
    /// A value is invalid.
    #[error("setting {setting}: {message}")]
    Invalid {
        /// The setting.
        setting: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl NodeConfig {
    /// Read a YAML config file over the defaults.
    pub fn from_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        crate::yaml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// Check the values that have no safe default.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.node_name.is_empty() {
            return Err(ConfigError::Invalid {
                setting: "node_name",
                message: "required (flag --node-name or AETHER_NODE_NAME)".into(),
            });
        }
        if self.ca_cert.is_some() != self.ca_key.is_some() {
            return Err(ConfigError::Invalid {
                setting: "ca_cert",
                message: "ca_cert and ca_key are given together".into(),
            });
        }
        for (setting, value) in [
            ("mesh_domain", &self.mesh_domain),
            ("cluster_domain", &self.cluster_domain),
            ("trust_domain", &self.trust_domain),
        ] {
            if value.is_empty() || value.starts_with('.') || value.ends_with('.') {
                return Err(ConfigError::Invalid {
                    setting,
                    message: format!("{value:?} is not a domain"),
                });
            }
        }
        if let Err(message) = self.access_log.parse::<crate::proxy::access::Mode>() {
            return Err(ConfigError::Invalid {
                setting: "access_log",
                message,
            });
        }
        // One head at `max_header_bytes` must fit, or no large head is ever read: its buffer,
        // grown by doubling, holds up to twice the head.
        if self.max_pending_head_bytes < self.max_header_bytes.saturating_mul(2) {
            return Err(ConfigError::Invalid {
                setting: "max_pending_head_bytes",
                message: format!(
                    "{} is less than twice max_header_bytes ({}): one whole head's buffer must fit",
                    self.max_pending_head_bytes, self.max_header_bytes
                ),
            });
        }
        // A change waits at most this long to be served: longer is no coalescing, it is stale
        // endpoints.
        if self.publish_coalesce_ms > 10_000 {
            return Err(ConfigError::Invalid {
                setting: "publish_coalesce_ms",
                message: format!(
                    "{} ms would keep every registry change from serving that long (10000 ms at most)",
                    self.publish_coalesce_ms
                ),
            });
        }
        // `aether cni` waits at most 600 s for any answer (docs/cni.md, `timeoutSecs`).
        if self.cni_add_wait_ms > 600_000 {
            return Err(ConfigError::Invalid {
                setting: "cni_add_wait_ms",
                message: format!(
                    "{} ms is longer than the CNI plugin waits for an answer (600000 ms at most)",
                    self.cni_add_wait_ms
                ),
            });
        }
        for (setting, value) in [
            ("max_connections", self.max_connections as u64),
            (
                "max_connections_per_pod",
                self.max_connections_per_pod as u64,
            ),
            ("handshake_timeout_ms", self.handshake_timeout_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("endpoint_ejection_ms", self.endpoint_ejection_ms),
            (
                "endpoint_states_max",
                u64::try_from(self.endpoint_states_max).unwrap_or(u64::MAX),
            ),
            ("cni_add_waiters_max", self.cni_add_waiters_max as u64),
            ("udp_max_flows_per_pod", self.udp_max_flows_per_pod as u64),
            (
                "metrics_max_connections",
                self.metrics_max_connections as u64,
            ),
            (
                "debug_max_body_bytes",
                u64::try_from(self.debug_max_body_bytes).unwrap_or(u64::MAX),
            ),
            ("debug_capture_timeout_ms", self.debug_capture_timeout_ms),
            ("udp_idle_secs", self.udp_idle_secs),
            ("dns_tcp_max_clients", self.dns_tcp_max_clients as u64),
            ("dns_tcp_query_timeout_ms", self.dns_tcp_query_timeout_ms),
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("http_idle_timeout_secs", self.http_idle_timeout_secs),
            (
                "http2_max_concurrent_streams",
                u64::from(self.http2_max_concurrent_streams),
            ),
            (
                "max_headers",
                u64::try_from(self.max_headers).unwrap_or(u64::MAX),
            ),
            (
                "mirror_max_body_bytes",
                u64::try_from(self.mirror_max_body_bytes).unwrap_or(u64::MAX),
            ),
            (
                "ext_authz_max_body_bytes",
                u64::try_from(self.ext_authz_max_body_bytes).unwrap_or(u64::MAX),
            ),
            (
                "max_streams_per_peer",
                u64::try_from(self.max_streams_per_peer).unwrap_or(u64::MAX),
            ),
            ("overload_interval_ms", self.overload_interval_ms),
        ] {
            if value == 0 {
                return Err(ConfigError::Invalid {
                    setting,
                    message: "must be at least 1".into(),
                });
            }
        }
        for (setting, value) in [
            (
                "max_header_list_size",
                usize::try_from(self.max_header_list_size).unwrap_or(usize::MAX),
            ),
            ("max_header_bytes", self.max_header_bytes),
        ] {
            if value < 1024 {
                return Err(ConfigError::Invalid {
                    setting,
                    message: format!("{value} is under 1024 bytes: no real request fits"),
                });
            }
        }
        if !(1..=100).contains(&self.overload_shed_percent) {
            return Err(ConfigError::Invalid {
                setting: "overload_shed_percent",
                message: format!("{} is not from 1 to 100", self.overload_shed_percent),
            });
        }
        if !(1..=self.overload_shed_percent).contains(&self.overload_refuse_percent) {
            return Err(ConfigError::Invalid {
                setting: "overload_refuse_percent",
                message: format!(
                    "{} is not from 1 to overload_shed_percent ({})",
                    self.overload_refuse_percent, self.overload_shed_percent
                ),
            });
        }
        if self.endpoint_ejection_max_ms < self.endpoint_ejection_ms {
            return Err(ConfigError::Invalid {
                setting: "endpoint_ejection_max_ms",
                message: format!(
                    "{} ms is shorter than endpoint_ejection_ms ({} ms)",
                    self.endpoint_ejection_max_ms, self.endpoint_ejection_ms
                ),
            });
        }
        if !(1..=64).contains(&self.worker_threads) {
            return Err(ConfigError::Invalid {
                setting: "worker_threads",
                message: format!("{} is not from 1 to 64", self.worker_threads),
            });
        }
        if self.cert_lifetime_hours == 0 {
            return Err(ConfigError::Invalid {
                setting: "cert_lifetime_hours",
                message: "must be at least 1".into(),
            });
        }
        self.validate_etcd()
    }

    fn validate_etcd(&self) -> Result<(), ConfigError> {
        let invalid = |setting, message: String| Err(ConfigError::Invalid { setting, message });
        if self.registry_source == RegistrySource::Etcd && self.etcd_endpoints.is_empty() {
            return invalid(
                "etcd_endpoints",
                "required with registry_source etcd (flag --etcd-endpoints or AETHER_ETCD_ENDPOINTS)".into(),
            );
        }
        // The client speaks TLS to every endpoint or to none, and trusts only `etcd_ca_cert`
        // (the build carries no system roots): a scheme that disagrees could never connect.
        let tls = self.etcd_ca_cert.is_some();
        for e in &self.etcd_endpoints {
            let message = if !(e.starts_with("http://") || e.starts_with("https://")) {
                format!("{e:?} is not an http:// or https:// URL")
            } else if tls && e.starts_with("http://") {
                format!("{e:?} is plain http://, but etcd_ca_cert is given: use https://")
            } else if !tls && e.starts_with("https://") {
                format!(
                    "{e:?} is https://: give etcd_ca_cert, the CA that signed the members' certificates"
                )
            } else {
                continue;
            };
            return invalid("etcd_endpoints", message);
        }
        if self.etcd_client_cert.is_some() && !tls {
            return invalid(
                "etcd_client_cert",
                "a client certificate is sent over TLS only: give etcd_ca_cert and https:// endpoints".into(),
            );
        }
        if let Err(message) = crate::registry::etcd::keys::check_prefix(&self.etcd_prefix) {
            return invalid("etcd_prefix", message);
        }
        if !(2..=3600).contains(&self.etcd_lease_ttl_secs) {
            return invalid(
                "etcd_lease_ttl_secs",
                format!("{} is not from 2 to 3600", self.etcd_lease_ttl_secs),
            );
        }
        if self.etcd_timeout_ms >= self.etcd_lease_ttl_secs.saturating_mul(1000) {
            return invalid(
                "etcd_timeout_ms",
                format!(
                    "{} ms is not below the lease TTL ({} s): a renewal could wait past the lease's expiry",
                    self.etcd_timeout_ms, self.etcd_lease_ttl_secs
                ),
            );
        }
        if self.etcd_user.is_some() != self.etcd_password_file.is_some() {
            return invalid(
                "etcd_user",
                "etcd_user and etcd_password_file are given together".into(),
            );
        }
        if self.etcd_client_cert.is_some() != self.etcd_client_key.is_some() {
            return invalid(
                "etcd_client_cert",
                "etcd_client_cert and etcd_client_key are given together".into(),
            );
        }
        for (setting, value) in [
            ("etcd_timeout_ms", self.etcd_timeout_ms),
            ("probe_interval_ms", self.probe_interval_ms),
            ("probe_timeout_ms", self.probe_timeout_ms),
            (
                "probe_failure_threshold",
                u64::from(self.probe_failure_threshold),
            ),
        ] {
            if value == 0 {
                return invalid(setting, "must be at least 1".into());
            }
        }
        if self.probe_timeout_ms > self.probe_interval_ms {
            return invalid(
                "probe_timeout_ms",
                format!(
                    "{} ms is longer than probe_interval_ms ({} ms)",
                    self.probe_timeout_ms, self.probe_interval_ms
                ),
            );
        }
        Ok(())
    }

    /// The etcd source's settings; the password is read from its file.
    pub fn etcd_settings(&self) -> Result<crate::registry::etcd::EtcdSettings, ConfigError> {
        let auth = match (&self.etcd_user, &self.etcd_password_file) {
            (Some(user), Some(file)) => {
                let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
                    path: file.clone(),
                    source,
                })?;
                let password = text.lines().next().unwrap_or_default().to_owned();
                Some((user.clone(), password))
            }
            _ => None,
        };
        let tls = (self.etcd_ca_cert.is_some() || self.etcd_client_cert.is_some()).then(|| {
            crate::registry::etcd::EtcdTls {
                ca: self.etcd_ca_cert.clone(),
                cert: self.etcd_client_cert.clone(),
                key: self.etcd_client_key.clone(),
            }
        });
        Ok(crate::registry::etcd::EtcdSettings {
            endpoints: self.etcd_endpoints.clone(),
            prefix: self.etcd_prefix.clone(),
            lease_ttl: std::time::Duration::from_secs(self.etcd_lease_ttl_secs),
            timeout: std::time::Duration::from_millis(self.etcd_timeout_ms),
            auth,
            tls,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_overrides_defaults_and_unknown_keys_are_refused() {
        let dir = std::env::temp_dir().join(format!("aether-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.yaml");
        std::fs::write(&good, "node_name: node-a\nmesh_domain: mesh.example\n").unwrap();
        let c = NodeConfig::from_file(&good).unwrap();
        assert_eq!(c.node_name, "node-a");
        assert_eq!(c.mesh_domain, "mesh.example");
        assert_eq!(c.cluster_domain, "cluster.local");
        c.validate().unwrap();
        let bad = dir.join("bad.yaml");
        std::fs::write(&bad, "node_name: a\nmesh_domian: x\n").unwrap();
        let err = NodeConfig::from_file(&bad).unwrap_err().to_string();
        assert!(err.contains("mesh_domian"), "{err}");
        let mut c = NodeConfig::default();
        assert!(c.validate().unwrap_err().to_string().contains("node_name"));
        c.node_name = "n".into();
        c.mesh_domain = ".x".into();
        assert!(c.validate().is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_head_budget_that_cannot_hold_one_whole_head_and_a_long_coalescing_window_are_refused() {
        let ok = NodeConfig {
            node_name: "n".into(),
            ..NodeConfig::default()
        };
        ok.validate().unwrap();
        let small = NodeConfig {
            max_header_bytes: 64 * 1024,
            max_pending_head_bytes: 100 * 1024,
            ..ok.clone()
        };
        let err = small.validate().unwrap_err().to_string();
        assert!(err.contains("max_pending_head_bytes"), "{err}");
        NodeConfig {
            max_pending_head_bytes: 128 * 1024,
            ..small
        }
        .validate()
        .unwrap();
        let slow = NodeConfig {
            publish_coalesce_ms: 10_001,
            ..ok
        };
        let err = slow.validate().unwrap_err().to_string();
        assert!(err.contains("publish_coalesce_ms"), "{err}");
    }

    #[test]
    fn worker_threads_outside_1_to_64_are_refused_with_the_setting_named() {
        let mut c = NodeConfig {
            node_name: "n".into(),
            ..NodeConfig::default()
        };
        assert_eq!(c.worker_threads, 1);
        c.validate().unwrap();
        for bad in [0, 65] {
            c.worker_threads = bad;
            let err = c.validate().unwrap_err().to_string();
            assert!(
                err.contains("worker_threads") && err.contains("1 to 64"),
                "{err}"
            );
        }
        c.worker_threads = 64;
        c.validate().unwrap();
    }

    /// The settings whose rows belong to the Limits table of docs/node.md: what a client, a peer
    /// or a configured server can run into.
    const LIMITS: &[&str] = &[
        "max_connections",
        "max_connections_per_pod",
        "handshake_timeout_ms",
        "connect_timeout_ms",
        "endpoint_states_max",
        "header_read_timeout_ms",
        "http_idle_timeout_secs",
        "tcp_idle_timeout_secs",
        "http2_max_concurrent_streams",
        "max_header_list_size",
        "max_header_bytes",
        "max_headers",
        "mirror_max_body_bytes",
        "ext_authz_max_body_bytes",
        "max_streams_per_peer",
        "max_pending_head_bytes",
        "udp_max_flows_per_pod",
        "udp_idle_secs",
        "dns_tcp_max_clients",
        "dns_tcp_query_timeout_ms",
        "metrics_max_connections",
        "cni_add_waiters_max",
        "debug_max_body_bytes",
        "debug_capture_timeout_ms",
    ];

    #[test]
    fn every_setting_has_a_row_in_the_docs_and_every_limit_its_default_in_the_limits_table() {
        let docs = include_str!("../../docs/node.md");
        let (settings, limits) = docs
            .split_once("### Limits")
            .expect("docs/node.md has a Limits section");
        let limits = limits.split("\n## ").next().unwrap_or(limits);
        let defaults = serde_json::to_value(NodeConfig::default()).unwrap();
        let defaults = defaults.as_object().unwrap();
        for (key, value) in defaults {
            let key = key.as_str();
            let row = |text: &str| {
                text.lines()
                    .find(|l| l.starts_with(&format!("| `{key}`")))
                    .map(str::to_owned)
            };
            if LIMITS.contains(&key) {
                let row = row(limits).unwrap_or_else(|| panic!("{key}: no row in Limits"));
                let default = match value {
                    serde_json::Value::Number(n) => n.to_string(),
                    other => panic!("{key}: a limit is a number, not {other:?}"),
                };
                assert!(
                    row.contains(&format!("| `{default}`")),
                    "{key}: the Limits row does not give the default {default}: {row}"
                );
                assert!(
                    row.contains(&format!("AETHER_{}", key.to_ascii_uppercase())),
                    "{key}: the row names no environment variable"
                );
            } else {
                assert!(
                    row(settings).is_some(),
                    "{key}: no row in the settings table"
                );
            }
        }
        for key in LIMITS {
            assert!(defaults.contains_key(*key), "{key} is not a setting");
        }
    }

    #[test]
    fn http_limits_that_would_refuse_every_request_are_refused() {
        let ok = NodeConfig {
            node_name: "n".into(),
            ..NodeConfig::default()
        };
        ok.validate().unwrap();
        type Break = fn(&mut NodeConfig);
        let cases: [(&str, Break); 6] = [
            ("header_read_timeout_ms", |c| c.header_read_timeout_ms = 0),
            ("http_idle_timeout_secs", |c| c.http_idle_timeout_secs = 0),
            ("http2_max_concurrent_streams", |c| {
                c.http2_max_concurrent_streams = 0;
            }),
            ("max_headers", |c| c.max_headers = 0),
            ("max_header_list_size", |c| c.max_header_list_size = 100),
            ("max_header_bytes", |c| c.max_header_bytes = 100),
        ];
        for (setting, break_it) in cases {
            let mut c = ok.clone();
            break_it(&mut c);
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(setting), "{err}");
        }
    }

    #[test]
    fn etcd_settings_that_could_never_connect_or_keep_a_lease_are_refused() {
        let ok = NodeConfig {
            node_name: "n".into(),
            registry_source: RegistrySource::Etcd,
            etcd_endpoints: vec!["http://10.0.0.5:2379".into()],
            ..NodeConfig::default()
        };
        ok.validate().unwrap();
        let tls = NodeConfig {
            etcd_endpoints: vec!["https://10.0.0.5:2379".into()],
            etcd_ca_cert: Some("/etc/etcd/ca.pem".into()),
            etcd_client_cert: Some("/etc/etcd/client.pem".into()),
            etcd_client_key: Some("/etc/etcd/client-key.pem".into()),
            ..ok.clone()
        };
        tls.validate().unwrap();
        type Break = fn(&mut NodeConfig);
        let cases: [(&str, &str, Break); 8] = [
            ("etcd_endpoints", "required", |c| c.etcd_endpoints.clear()),
            ("etcd_endpoints", "not an http", |c| {
                c.etcd_endpoints = vec!["10.0.0.5:2379".into()];
            }),
            ("etcd_endpoints", "give etcd_ca_cert", |c| {
                c.etcd_endpoints = vec!["https://10.0.0.5:2379".into()];
            }),
            ("etcd_endpoints", "use https://", |c| {
                c.etcd_ca_cert = Some("/ca.pem".into());
            }),
            ("etcd_client_cert", "over TLS only", |c| {
                c.etcd_client_cert = Some("/c.pem".into());
                c.etcd_client_key = Some("/k.pem".into());
            }),
            ("etcd_timeout_ms", "lease TTL", |c| {
                c.etcd_timeout_ms = 10_000
            }),
            ("etcd_lease_ttl_secs", "from 2 to 3600", |c| {
                c.etcd_lease_ttl_secs = 1
            }),
            ("etcd_prefix", "", |c| c.etcd_prefix = "aether".into()),
        ];
        for (setting, says, break_it) in cases {
            let mut c = ok.clone();
            break_it(&mut c);
            let err = c.validate().unwrap_err().to_string();
            assert!(
                err.contains(setting) && err.contains(says),
                "{setting}: {err}"
            );
        }
    }
}
