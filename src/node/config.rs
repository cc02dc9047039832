//! The daemon's settings: defaults, then a YAML file, then environment and flags. Each setting
//! is defined once, below, in `settings!` (`node::settings`): its key, flag, environment
//! variable, default, bounds and docs/node.md's row.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::settings::settings;

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

settings! {
    /// this node: its pods are those whose `spec.nodeName` is this
    plain node_name: String = String::new(),
        env "AETHER_NODE_NAME", shown "(required)";
    /// `file`: the manifest directory `registry`; `kube`: the Kubernetes API server (in-cluster
    /// credentials, or `KUBECONFIG`; docs/kubernetes.md); `etcd`: every node's endpoint rows from
    /// etcd, everything else (Services, routes, policies, this node's pods) from the directory
    /// `registry` (docs/etcd.md)
    plain registry_source: RegistrySource = RegistrySource::File,
        env "AETHER_REGISTRY_SOURCE";
    /// the manifest directory, watched for changes
    plain registry: PathBuf = PathBuf::from("config/examples/mp"),
        env "AETHER_REGISTRY";
    /// the namespace the daemon runs in (Kubernetes source): the registrar's Lease lives there
    plain release_namespace: String = "aether-system".into(),
        env "AETHER_RELEASE_NAMESPACE";
    /// holds `admin.sock`, `cni.sock`, `handoff.sock`, the CNI pod records `cni-pods/`
    /// (docs/cni.md) and, without a CA setting, `ca/`
    plain state_dir: PathBuf = PathBuf::from("/var/run/aether"),
        env "AETHER_STATE_DIR";
    /// a directory of this daemon's own that a successor does not share (the chart's `emptyDir`):
    /// `started` is written there once the daemon has taken the running daemon's sockets or found
    /// none, for the DaemonSet's startup probe (item 6 of the lifecycle below; docs/kubernetes.md,
    /// "Upgrade")
    optional pod_dir: PathBuf = None,
        env "AETHER_POD_DIR";
    /// the mesh CA's certificate (PEM), given with `ca_key`
    optional ca_cert: PathBuf = None,
        env "AETHER_CA_CERT";
    /// the mesh CA's private key (PEM), given with `ca_cert`
    optional ca_key: PathBuf = None,
        env "AETHER_CA_KEY";
    /// a CA directory (`ca.pem`, `ca-key.pem`), created once when missing
    optional ca_dir: PathBuf = None,
        env "AETHER_CA_DIR";
    /// prefix added to the `aether.io/netns` annotation (file mode)
    plain netns_prefix: String = String::new(),
        env "AETHER_NETNS_PREFIX";
    /// also serve the admin endpoints on this TCP address (daemon's namespace)
    optional admin_addr: SocketAddr = None,
        env "AETHER_ADMIN_ADDR";
    /// serve `/metrics`, `/ready` and `/live` (nothing else) on this TCP address: the per-node
    /// metrics endpoint and the DaemonSet's probes
    optional metrics_addr: SocketAddr = None,
        env "AETHER_METRICS_ADDR";
    /// mesh names are `<svc>.<ns>.<mesh_domain>`
    plain mesh_domain: String = "aether.internal".into(),
        env "AETHER_MESH_DOMAIN";
    /// the Kubernetes cluster domain: Service names are `<svc>.<ns>.svc.<cluster_domain>`
    plain cluster_domain: String = "cluster.local".into(),
        env "AETHER_CLUSTER_DOMAIN";
    /// SPIFFE trust domain of issued and accepted identities
    plain trust_domain: String = "cluster.local".into(),
        env "AETHER_TRUST_DOMAIN";
    /// capture mode of a pod without `capture.aether.io/redirect-all`
    plain capture_redirect_all_default: bool = true,
        env "AETHER_CAPTURE_REDIRECT_ALL_DEFAULT";
    /// their pods are never managed
    plain ignored_namespaces: Vec<String> = vec!["kube-system".into()],
        env "AETHER_IGNORED_NAMESPACES", list "comma-separated";
    /// ClusterIPs of generated Services (file registry), allocated deterministically
    plain service_cidr: ipnet::IpNet = "10.96.0.0/16".parse().expect("a valid CIDR literal"),
        env "AETHER_SERVICE_CIDR";
    /// where mesh DNS forwards names that are not the mesh's; loopback addresses are dropped
    /// (inside a pod they would be mesh DNS itself)
    plain dns_upstreams: Vec<SocketAddr> = Vec::new(),
        env "AETHER_DNS_UPSTREAMS", list "comma-separated `ip:port`",
        shown "the host's `/etc/resolv.conf`";
    /// mesh DNS also answers `<svc>.<ns>.svc.<cluster_domain>` and is authoritative for the cluster
    /// domain (file mode stands in for the cluster DNS)
    plain dns_kubernetes_names: bool = true,
        env "AETHER_DNS_KUBERNETES_NAMES";
    /// workload certificate lifetime; re-issued at half-life
    plain cert_lifetime_hours: u64 = 24,
        env "AETHER_CERT_LIFETIME_HOURS", unit "hours", at_least 1;
    /// how long shutdown waits for open connections
    plain drain_timeout_secs: u64 = 5,
        env "AETHER_DRAIN_TIMEOUT_SECS", unit "seconds";
    /// file source: a registry directory change waits this long before the directory is read, since
    /// a generator may still be writing
    plain watch_debounce_ms: u64 = 200,
        env "AETHER_WATCH_DEBOUNCE_MS", unit "milliseconds";
    /// Kubernetes and etcd sources: the publisher's coalescing window. A change after a quiet spell
    /// is published at once; publishes are then at most one per this, every change meanwhile taken
    /// by the next (docs/decisions.md, "One publisher")
    // A change waits at most this long to be served: longer is not coalescing, it is stale
    // endpoints.
    plain publish_coalesce_ms: u64 = 20,
        env "AETHER_PUBLISH_COALESCE_MS", unit "milliseconds", at_most 10000;
    /// how long a CNI ADD for a pod the registry does not hold yet waits for it, each such ADD on
    /// its own; then it is answered "try again" (CNI error 11). Keep it below the plugin's
    /// `timeoutSecs` (default 20 s, docs/cni.md)
    // `aether cni` waits at most 600 s for any answer (docs/cni.md, `timeoutSecs`).
    plain cni_add_wait_ms: u64 = 5000,
        env "AETHER_CNI_ADD_WAIT_MS", unit "milliseconds", at_most 600000;
    /// Kubernetes source: list with the API server's streaming lists (`sendInitialEvents`,
    /// Kubernetes 1.32+) instead of pages of 500 (docs/kubernetes.md, "Scale"); a server that
    /// refuses them (`422`) is read with pages, kind by kind
    plain kube_streaming_lists: bool = false,
        env "AETHER_KUBE_STREAMING_LISTS";
    /// etcd source: the members' client URLs, `http://host:port` (or `https://` with
    /// `etcd_ca_cert`); required with `registry_source: etcd`
    plain etcd_endpoints: Vec<String> = Vec::new(),
        env "AETHER_ETCD_ENDPOINTS", list "comma-separated";
    /// etcd source: the key prefix the rows live under (docs/etcd.md, "Keys"); one per mesh, the
    /// same in every mirrored region
    plain etcd_prefix: String = "/aether".into(),
        env "AETHER_ETCD_PREFIX";
    /// etcd source: the TTL of the lease this node's rows hang on; a node that dies leaves the
    /// registry within it
    plain etcd_lease_ttl_secs: u64 = 10,
        env "AETHER_ETCD_LEASE_TTL_SECS", unit "seconds", range 2..=3600;
    /// etcd source: the deadline of each connect, listing, write and lease renewal, and the spacing
    /// of the HTTP/2 pings that find a dead connection (a watch on one is then resumed from its
    /// revision)
    plain etcd_timeout_ms: u64 = 5000,
        env "AETHER_ETCD_TIMEOUT_MS", unit "milliseconds", at_least 1;
    /// etcd source: a user of etcd's own authentication, given with `etcd_password_file`
    optional etcd_user: String = None,
        env "AETHER_ETCD_USER";
    /// etcd source: a file whose first line is `etcd_user`'s password (a file, so the password is
    /// in neither the environment nor the process list)
    optional etcd_password_file: PathBuf = None,
        env "AETHER_ETCD_PASSWORD_FILE";
    /// etcd source: the CA (PEM) that signed the members' certificates; the endpoints are then
    /// `https://`
    optional etcd_ca_cert: PathBuf = None,
        env "AETHER_ETCD_CA_CERT";
    /// etcd source: a client certificate (PEM), given with `etcd_client_key`, for members started
    /// with `--client-cert-auth`
    optional etcd_client_cert: PathBuf = None,
        env "AETHER_ETCD_CLIENT_CERT";
    /// etcd source: that certificate's key (PEM)
    optional etcd_client_key: PathBuf = None,
        env "AETHER_ETCD_CLIENT_KEY";
    /// etcd source, delegated liveness: how often each local pod's liveness port is probed
    /// (docs/etcd.md, "Delegated liveness")
    plain probe_interval_ms: u64 = 2000,
        env "AETHER_PROBE_INTERVAL_MS", unit "milliseconds", at_least 1;
    /// how long one probe may take: the TCP connect, or the HTTP response's head
    plain probe_timeout_ms: u64 = 1000,
        env "AETHER_PROBE_TIMEOUT_MS", unit "milliseconds", at_least 1,
        note "at most `probe_interval_ms`";
    /// failed probes in a row that make a Ready pod not Ready (its rows are rewritten with `ready:
    /// false`); one success makes it Ready again
    plain probe_failure_threshold: u32 = 3,
        env "AETHER_PROBE_FAILURE_THRESHOLD", at_least 1;
    /// the memory the overload manager measures the daemon's use against (see "Memory" below); 0
    /// reads the limit of the daemon's memory cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`,
    /// the smallest on the way to the root), and with no limit nothing is shed
    plain overload_memory_limit_bytes: u64 = 0,
        env "AETHER_OVERLOAD_MEMORY_LIMIT_BYTES", note "the memory cgroup's";
    /// at this use, every new connection (captured, loopback proxy port, mesh hop) is closed at
    /// accept until use is 5 points under it
    plain overload_refuse_percent: u64 = 90,
        env "AETHER_OVERLOAD_REFUSE_PERCENT", unit "percent", range 1..=100,
        note "at most `overload_shed_percent`";
    /// at this use, a peer holding a tenth of `max_streams_per_peer` gets no new HTTP/2 stream
    /// (`REFUSED_STREAM`) and, at each check, a quarter of the HTTP connections with no request in
    /// flight are closed: the most bytes of an unfinished request head first, then the longest idle
    plain overload_shed_percent: u64 = 95,
        env "AETHER_OVERLOAD_SHED_PERCENT", unit "percent", range 1..=100;
    /// how often the overload manager reads the memory in use
    plain overload_interval_ms: u64 = 100,
        env "AETHER_OVERLOAD_INTERVAL_MS", unit "milliseconds", at_least 1;
    /// keep the registry snapshot each published model was compiled from beside it, for `aether
    /// debug services`, `routes`, `config-dump` and offline replay (docs/debug.md); on the file and
    /// etcd sources it costs about 1.5× the model's memory; the Kubernetes source keeps none and
    /// makes it from the kept model when asked (docs/debug.md). Off, those commands are answered
    /// `503` with the reason
    plain debug_keep_snapshot: bool = true,
        env "AETHER_DEBUG_KEEP_SNAPSHOT";
    /// threads that run the daemon (tokio workers). One runs a single-threaded runtime: on
    /// a 2-core node it cost about 20 % less CPU per request than two, with half the context
    /// switches (docs/performance.md). More raise the ceiling of a busy node (one thread proxies
    /// tens of thousands of requests a second) at that price per request
    plain worker_threads: usize = 1,
        env "AETHER_WORKER_THREADS", range 1..=64;
    /// `text` or `json` (one object per line), on stderr
    plain log_format: LogFormat = LogFormat::Text,
        env "AETHER_LOG_FORMAT";
    /// a tracing-subscriber filter, e.g. `info,aether::proxy=debug`
    plain log_level: String = "info".into(),
        env "AETHER_LOG";
    /// the access log at start: `off`, `on` (a line per HTTP request and per relayed byte stream)
    /// or `sample=N` (one in N); changed at run time with `PUT /access-log` on the admin socket or
    /// `aether debug access-log` (docs/observability.md). Off by default: at full rate it costs
    /// about 11 % of the request rate (docs/performance.md)
    plain access_log: String = "off".into(),
        env "AETHER_ACCESS_LOG";
    /// inbound mode of a pod without `inbound.aether.io/mode`: `permissive` or `strict`
    /// (docs/security.md, spec/model.md §12.5 item 3)
    plain inbound_mode_default: InboundMode = InboundMode::Permissive,
        env "AETHER_INBOUND_MODE_DEFAULT";
    /// an endpoint whose connect failed (refused, timed out, unreachable, the mesh hop's TLS
    /// handshake) is out of the endpoint choice this long, and twice as long for each ejection in a
    /// row; never the last endpoint of a backend in the choice; back at once on a successful
    /// connect (docs/decisions.md, "Endpoint choice"; `aether_endpoint_ejections_total`,
    /// `aether_endpoint_returns_total`)
    plain endpoint_ejection_ms: u64 = 5000,
        env "AETHER_ENDPOINT_EJECTION_MS", unit "milliseconds", at_least 1;
    /// the longest ejection, however many in a row: an endpoint that stays unreachable is tried
    /// again at least this often
    plain endpoint_ejection_max_ms: u64 = 30_000,
        env "AETHER_ENDPOINT_EJECTION_MAX_MS", unit "milliseconds",
        note "at least `endpoint_ejection_ms`";
    /// sources whose plaintext reaches pods' declared ports in both inbound modes, besides
    /// loopback, each pod's default gateway and its node's addresses (kubelet probes); an external
    /// load balancer's health checks, for example
    plain inbound_trusted_sources: Vec<ipnet::IpNet> = Vec::new(),
        env "AETHER_INBOUND_TRUSTED_SOURCES", list "comma-separated CIDRs";
    /// a new connection (captured, loopback proxy port, inbound hop) is closed at accept
    plain max_connections: usize = 100_000,
        env "AETHER_MAX_CONNECTIONS", at_least 1,
        limit { counter: "`aether_connections_over_limit_total`",
            why: "above the 50,000 idle connections one node must carry, below the fds a node \
            allows (each proxied connection holds 2 to 4)" };
    /// a new connection of that pod (its captured and loopback connections, and the inbound hops to
    /// it) is closed at accept
    plain max_connections_per_pod: usize = 20_000,
        env "AETHER_MAX_CONNECTIONS_PER_POD", at_least 1,
        limit { counter: "`aether_connections_over_limit_total`",
            why: "one pod, hostile or broken, cannot take the whole node's share" };
    /// a mesh hop whose TLS handshake has not finished is closed (either side)
    plain handshake_timeout_ms: u64 = 10_000,
        env "AETHER_HANDSHAKE_TIMEOUT_MS", unit "milliseconds", at_least 1,
        limit { counter: "`aether_hop_handshake_timeouts_total`",
            why: "a handshake between two nodes takes milliseconds; 10 s leaves room for a loaded \
            node and none for a peer that sends nothing" };
    /// a TCP connect to an endpoint's mesh hop (or to a passthrough destination) that has not
    /// completed fails: the endpoint is ejected (`endpoint_ejection_ms`) and a delivery tries one
    /// other endpoint of the backend; with none left, `503 upstream-unreachable` (HTTP) or the
    /// connection is closed (raw TCP)
    plain connect_timeout_ms: u64 = 1000,
        env "AETHER_CONNECT_TIMEOUT_MS", unit "milliseconds", at_least 1,
        limit { counter: "`aether_endpoint_retries_total{outcome=\"ok\"}` (another endpoint took \
            it), `aether_endpoint_retries_total{outcome=\"failed\"}` (it failed too)",
            why: "a live pod answers a SYN within milliseconds; one that has not answered in a \
            second is gone or black-holed (the kernel's first SYN retry comes at 1 s). Linkerd \
            uses the same bound. A longer bound held half of all new requests for its whole \
            length while one of two endpoints dropped SYNs" };
    /// an endpoint (address and pod port) beyond this many is chosen without its load or ejection
    /// being kept; entries with nothing in flight and no ejection are removed after 60 s idle
    plain endpoint_states_max: usize = 65_536,
        env "AETHER_ENDPOINT_STATES_MAX", unit "endpoints", at_least 1,
        limit { counter: "`aether_endpoint_states_over_limit_total`",
            why: "far above the endpoints one node's pods reach; each entry is a few dozen bytes" };
    /// an HTTP/1 request head not whole within this long of its first byte (the first head of a
    /// connection: of the accept), however it is dripped, closes the connection without an answer,
    /// on the capture and proxy ports and the mesh hop; a client that sends part of a head and
    /// closes is answered `400 bad-request` at once
    plain header_read_timeout_ms: u64 = 10_000,
        env "AETHER_HEADER_READ_TIMEOUT_MS", unit "milliseconds", at_least 1,
        limit { counter: "`aether_http_header_timeouts_total`",
            why: "a slow-head client would otherwise hold a connection and its task for ever; a \
            real client sends its head in one write" };
    /// an HTTP connection (HTTP/1.1 keep-alive or HTTP/2, client side and mesh hop) with no request
    /// in flight is closed, HTTP/2 with GOAWAY
    plain http_idle_timeout_secs: u64 = 300,
        env "AETHER_HTTP_IDLE_TIMEOUT_SECS", unit "seconds", at_least 1,
        limit { counter: "`aether_http_idle_closed_total`",
            why: "long enough that an application's connection pool (typically 60–90 s idle) \
            closes its connections first, so a request rarely races the daemon's close; short \
            enough that idle connections cannot pile up" };
    /// a relayed byte stream (raw TCP, an L4 hop, a passthrough, a spliced upgrade such as a
    /// WebSocket) that moved no byte either way is closed, between once and twice this long after
    /// its last byte
    plain tcp_idle_timeout_secs: u64 = 3600,
        env "AETHER_TCP_IDLE_TIMEOUT_SECS", unit "seconds", note "`0`: never",
        limit { counter: "`aether_tcp_idle_closed_total`",
            why: "Envoy's default for its TCP proxy: database and message-queue clients keep \
            quiet connections for minutes, and an hour still ends connections a vanished peer \
            left behind (an idle relay holds no buffer, only its sockets and task)" };
    /// a stream over it on one HTTP/2 connection is refused (`REFUSED_STREAM`)
    plain http2_max_concurrent_streams: u32 = 200,
        env "AETHER_HTTP2_MAX_CONCURRENT_STREAMS", at_least 1,
        limit { counter: "`aether_http2_stream_limit_total` (each time a connection reaches it)",
            why: "RFC 9113 asks for at least 100; bounds the requests one connection keeps in \
            flight" };
    /// a larger HTTP/2 request header list (names, values and 32 bytes per field) is answered `431
    /// headers-too-large`; one over twice it is refused by the HTTP/2 library itself (a `431`
    /// without reason, or the connection). The mesh hop accepts twice it, for the mesh's own
    /// headers on a request the source already checked
    plain max_header_list_size: u32 = 64 * 1024,
        env "AETHER_MAX_HEADER_LIST_SIZE", unit "bytes", at_least 1024,
        limit { counter: "`aether_http_headers_too_large_total`",
            why: "the same bound as HTTP/1's head" };
    /// a larger HTTP/1 request head (request line and fields) is answered `431 headers-too-large`
    /// (a later head on a kept connection gets hyper's own `431`, see docs/decisions.md)
    plain max_header_bytes: usize = 64 * 1024,
        env "AETHER_MAX_HEADER_BYTES", unit "bytes", at_least 1024,
        limit { counter: "`aether_http_headers_too_large_total`",
            why: "far above real heads (a few KiB), small enough that a connection's head buffer \
            stays bounded" };
    /// a head with more fields is answered `431 headers-too-large`
    plain max_headers: usize = 100,
        env "AETHER_MAX_HEADERS", at_least 1,
        limit { counter: "`aether_http_headers_too_large_total`",
            why: "hyper's own bound; another value costs an allocation per request" };
    /// a request whose body is larger (or of unknown length and slower than 1 s) is not copied to
    /// its `RequestMirror`s, and is delivered as usual
    plain mirror_max_body_bytes: usize = 1024 * 1024,
        env "AETHER_MIRROR_MAX_BODY_BYTES", unit "bytes", at_least 1,
        limit { counter: "`aether_mirror_skipped_total`",
            why: "a mirror copy buffers the body; 1 MiB covers API requests and keeps one \
            request's buffer bounded" };
    /// an authorization server's answer body past this is read and dropped: a denial is relayed
    /// without its body
    plain ext_authz_max_body_bytes: usize = 64 * 1024,
        env "AETHER_EXT_AUTHZ_MAX_BODY_BYTES", unit "bytes", at_least 1,
        limit { counter: "`aether_ext_authz_body_over_limit_total`",
            why: "a denial's body is a short message for the client; the server is configured, \
            not trusted with the daemon's memory" };
    /// a new HTTP/2 stream of a peer that has this many open over all its connections is refused
    /// (`REFUSED_STREAM`: not processed, the client may retry it); a peer is a local pod on the
    /// capture and proxy ports, an identity from its source address on the mesh hop
    plain max_streams_per_peer: usize = crate::proxy::overload::DEFAULT_MAX_STREAMS_PER_PEER,
        env "AETHER_MAX_STREAMS_PER_PEER", unit "streams", at_least 1,
        limit { counter: "`aether_shed_total{reason=\"peer-streams\"}`",
            why: "ten connections' worth of `http2_max_concurrent_streams`: \
            `max_connections_per_pod` alone let one peer with a valid certificate hold 30,000 \
            streams and their header lists" };
    /// the node's first request heads still being read may hold this much beyond one read's room
    /// (16 KiB each); a connection whose unfinished head would take more is closed before its
    /// buffer grows (a partial head is owed no answer)
    plain max_pending_head_bytes: usize = crate::proxy::overload::DEFAULT_MAX_PENDING_HEAD_BYTES,
        env "AETHER_MAX_PENDING_HEAD_BYTES", unit "bytes",
        note "64 MiB; at least twice `max_header_bytes`: a head's buffer grows by doubling",
        limit { counter: "`aether_shed_total{reason=\"head-budget\"}`",
            why: "the memory levels see a flood of slow heads only after it is allocated: four \
            thousand heads growing together doubled their buffers between two checks and the OOM \
            killer came first (leg OVERLOAD); bounded here, they cannot, while a head that \
            arrives in a read or two never touches it" };
    /// a datagram that would open a new UDP flow (client address, dialled address) on 18082 is
    /// dropped; open flows keep working
    plain udp_max_flows_per_pod: usize = 1024,
        env "AETHER_UDP_MAX_FLOWS_PER_POD", unit "flows", at_least 1,
        limit { counter: "`aether_udp_flows_refused_total` (`aether_udp_flows` is the number \
            open)",
            why: "each flow holds a socket and a task, so a pod sending from many source ports \
            could otherwise take every descriptor of the daemon" };
    /// a UDP flow with no datagram either way is closed on its own timer, releasing its socket and
    /// task
    plain udp_idle_secs: u64 = 60,
        env "AETHER_UDP_IDLE_SECS", unit "seconds", at_least 1,
        limit { counter: "`aether_udp_flows` falls",
            why: "UDP has no end of stream; a minute outlasts request-reply exchanges and \
            DNS-like retries" };
    /// a CNI ADD for a pod the registry does not hold yet, beyond this many waiting
    /// (`cni_add_wait_ms`), is answered "try again" (CNI error 11) at once; the runtime retries it
    plain cni_add_waiters_max: usize = 128,
        env "AETHER_CNI_ADD_WAITERS_MAX", unit "ADDs", at_least 1,
        limit { counter: "`aether_cni_try_again_total` (`aether_cni_adds_waiting` is the number \
            waiting)",
            why: "above a node's default pod limit (110), so a node starting all its pods at once \
            does not reach it; each waiting ADD holds a task and a socket, and the socket is \
            root's alone" };
    /// a new DNS-over-TCP connection to one pod's mesh DNS is closed at once
    plain dns_tcp_max_clients: usize = 64,
        env "AETHER_DNS_TCP_MAX_CLIENTS", unit "connections", at_least 1,
        limit { counter: "`aether_dns_tcp_refused_total`",
            why: "kept apart from UDP, so idle TCP clients cannot starve it; a resolver opens one \
            or two" };
    /// a DNS query over TCP not whole (length and message) within this long of its first byte
    /// closes the connection; a connection with no query for 10 s is closed quietly
    plain dns_tcp_query_timeout_ms: u64 = 5000,
        env "AETHER_DNS_TCP_QUERY_TIMEOUT_MS", unit "milliseconds", at_least 1,
        limit { counter: "`aether_dns_tcp_timeouts_total`",
            why: "a resolver's own timeout is about 5 s" };
    /// a new connection to the metrics listener (`metrics_addr`) is closed at accept; a request
    /// head not whole within 10 s closes its connection
    plain metrics_max_connections: usize = 64,
        env "AETHER_METRICS_MAX_CONNECTIONS", unit "connections", at_least 1,
        limit { counter: "`aether_metrics_connections_over_limit_total`",
            why: "the listener is on the node's network; a scraper and the kubelet's probes need \
            a handful" };
    /// a larger request body to a debug endpoint of the admin socket (an `aether debug explain`
    /// question, a log filter) is answered `413` unread
    plain debug_max_body_bytes: usize = 65536,
        env "AETHER_DEBUG_MAX_BODY_BYTES", unit "bytes", at_least 1,
        limit { counter: "—",
            why: "a question is a few hundred bytes; the socket is root's, and still no request \
            can make the daemon buffer more" };
    /// `aether debug capture` (`nft list table` in the pod's namespace) not done by then is killed
    /// and answered `504`
    plain debug_capture_timeout_ms: u64 = 5000,
        env "AETHER_DEBUG_CAPTURE_TIMEOUT_MS", unit "milliseconds", at_least 1,
        limit { counter: "—",
            why: "a listing takes milliseconds; a stuck `nft` must not hold a task and a process \
            for ever" };
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

impl NodeArgs {
    /// The settings: the defaults, the config file's over them when one is given, then the
    /// environment variables and flags given; checked.
    pub fn load(&self) -> Result<NodeConfig, ConfigError> {
        let mut config = match &self.config {
            Some(path) => NodeConfig::from_file(path)?,
            None => NodeConfig::default(),
        };
        self.apply(&mut config);
        config.validate()?;
        Ok(config)
    }
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
        super::settings::check_bounds(SETTINGS, self)
            .map_err(|(setting, message)| ConfigError::Invalid { setting, message })?;
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
    use super::super::settings::{LIMITS_HEADER, SETTINGS_HEADER, limits_table, settings_table};
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

    /// The table in `docs` that starts at `header`: its header and every row after it.
    fn table_in<'a>(docs: &'a str, header: &str) -> Option<&'a str> {
        let start = docs.find(header)?;
        let rest = &docs[start..];
        let mut end = 0;
        for line in rest.split_inclusive('\n') {
            if !line.starts_with('|') {
                break;
            }
            end += line.len();
        }
        Some(&rest[..end])
    }

    /// docs/node.md's two tables are the definitions rendered; `AETHER_BLESS=1` writes them.
    #[test]
    fn the_docs_tables_are_the_settings_definitions() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/node.md");
        let docs = std::fs::read_to_string(&path).expect("docs/node.md");
        let defaults = NodeConfig::default();
        let mut blessed = docs.clone();
        let mut differ = Vec::new();
        for (header, table) in [
            (SETTINGS_HEADER, settings_table(SETTINGS, &defaults)),
            (LIMITS_HEADER, limits_table(SETTINGS, &defaults)),
        ] {
            let found = table_in(&docs, header).expect("docs/node.md has the table");
            if found != table {
                differ.push(header.lines().next().unwrap_or_default().to_owned());
                blessed = blessed.replacen(found, &table, 1);
            }
        }
        if !differ.is_empty() && std::env::var_os("AETHER_BLESS").is_some() {
            std::fs::write(&path, blessed).expect("write docs/node.md");
            return;
        }
        assert!(
            differ.is_empty(),
            "docs/node.md's tables differ from the settings' definitions in src/node/config.rs \
             ({differ:?}); run with AETHER_BLESS=1 to write them"
        );
    }

    #[test]
    fn every_setting_is_a_file_key_a_flag_and_an_environment_variable() {
        use clap::{CommandFactory, Parser};
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            node: NodeArgs,
        }
        let command = Cli::command();
        let defaults = serde_json::to_value(NodeConfig::default()).expect("defaults");
        let keys = defaults.as_object().expect("an object");
        assert_eq!(keys.len(), SETTINGS.len());
        for s in SETTINGS {
            assert!(keys.contains_key(s.key), "{}: not a file key", s.key);
            assert_eq!(
                s.env,
                if s.key == "log_level" {
                    "AETHER_LOG".to_owned()
                } else {
                    format!("AETHER_{}", s.key.to_ascii_uppercase())
                },
                "{}: its environment variable",
                s.key
            );
            let flag = s.key.replace('_', "-");
            let arg = command
                .get_arguments()
                .find(|a| a.get_long() == Some(flag.as_str()))
                .unwrap_or_else(|| panic!("no flag --{flag}"));
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                Some(s.env),
                "--{flag}: its environment variable"
            );
        }
    }

    #[test]
    fn a_flag_overrides_the_file_and_a_list_is_comma_separated() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            node: NodeArgs,
        }
        let cli = Cli::try_parse_from([
            "aether",
            "--node-name",
            "node-b",
            "--ca-cert",
            "/ca.pem",
            "--inbound-trusted-sources",
            "10.0.0.0/8,192.168.0.0/16",
            "--max-connections",
            "7",
        ])
        .expect("the flags parse");
        let mut config: NodeConfig = crate::yaml::from_str(
            "node_name: node-a\nmax_connections: 5\nmesh_domain: m.example\n",
        )
        .expect("the file parses");
        cli.node.apply(&mut config);
        assert_eq!(config.node_name, "node-b");
        assert_eq!(config.max_connections, 7);
        assert_eq!(config.mesh_domain, "m.example");
        assert_eq!(
            config.ca_cert.as_deref(),
            Some(std::path::Path::new("/ca.pem"))
        );
        assert_eq!(config.inbound_trusted_sources.len(), 2);
        let bad = Cli::try_parse_from(["aether", "--max-connections", "many"]);
        assert!(bad.is_err(), "a number that does not parse is refused");
    }

    /// Settings the chart's `config` value does not offer besides those it sets itself: the
    /// etcd source's (the chart runs the Kubernetes source), the file registry's directory and
    /// namespace prefix, and a CA directory (the chart's CA is a Secret, given as `ca_cert`).
    const NOT_ON_THE_CHART: &[&str] = &[
        "ca_dir",
        "registry",
        "netns_prefix",
        "etcd_endpoints",
        "etcd_prefix",
        "etcd_lease_ttl_secs",
        "etcd_timeout_ms",
        "etcd_user",
        "etcd_password_file",
        "etcd_ca_cert",
        "etcd_client_cert",
        "etcd_client_key",
        "probe_interval_ms",
        "probe_timeout_ms",
        "probe_failure_threshold",
    ];

    /// The settings the chart sets itself: the aether container's flags and environment
    /// variables in the DaemonSet, and the keys the ConfigMap's template sets.
    fn set_by_the_chart(root: &std::path::Path) -> Vec<&'static str> {
        let daemonset =
            std::fs::read_to_string(root.join("charts/aether/templates/daemonset.yaml"))
                .expect("the DaemonSet template");
        let configmap =
            std::fs::read_to_string(root.join("charts/aether/templates/configmap.yaml"))
                .expect("the ConfigMap template");
        SETTINGS
            .iter()
            .filter(|s| {
                let flag = format!("- --{}", s.key.replace('_', "-"));
                let env = format!("- name: {}", s.env);
                let set = format!("set $config \"{}\"", s.key);
                daemonset
                    .lines()
                    .any(|l| l.trim() == flag || l.trim() == env)
                    || configmap.contains(&set)
            })
            .map(|s| s.key)
            .collect()
    }

    /// The chart schema's `config` object, as the definitions give it: every setting the chart
    /// neither sets nor leaves out, with its type, bounds, values and meaning.
    fn chart_config_schema(root: &std::path::Path, indent: &str) -> String {
        use clap::CommandFactory as _;
        #[derive(Debug, clap::Parser)]
        struct Cli {
            #[command(flatten)]
            node: NodeArgs,
        }
        let command = Cli::command();
        let defaults = NodeConfig::default();
        let owned = set_by_the_chart(root);
        let quote = |text: &str| serde_json::to_string(text).expect("a string");
        let mut props = Vec::new();
        for s in SETTINGS {
            if owned.contains(&s.key) || NOT_ON_THE_CHART.contains(&s.key) {
                continue;
            }
            let mut fields = Vec::new();
            match (s.value)(&defaults) {
                serde_json::Value::Number(_) => {
                    fields.push("\"type\": \"integer\"".to_owned());
                    fields.push(format!("\"minimum\": {}", s.bounds.0));
                    if s.bounds.1 != u64::MAX {
                        fields.push(format!("\"maximum\": {}", s.bounds.1));
                    }
                }
                serde_json::Value::Bool(_) => fields.push("\"type\": \"boolean\"".to_owned()),
                serde_json::Value::Array(_) => fields
                    .push("\"type\": \"array\", \"items\": { \"type\": \"string\" }".to_owned()),
                _ => {
                    fields.push("\"type\": \"string\"".to_owned());
                    let flag = s.key.replace('_', "-");
                    let arg = command
                        .get_arguments()
                        .find(|a| a.get_long() == Some(flag.as_str()))
                        .expect("every setting is a flag");
                    let values: Vec<String> = arg
                        .get_possible_values()
                        .iter()
                        .map(|v| quote(v.get_name()))
                        .collect();
                    if !values.is_empty() {
                        fields.push(format!("\"enum\": [{}]", values.join(", ")));
                    }
                }
            }
            fields.push(format!("\"description\": {}", quote(s.meaning.trim())));
            props.push(format!(
                "{indent}    {}: {{\n{indent}      {}\n{indent}    }}",
                quote(s.key),
                fields.join(&format!(",\n{indent}      "))
            ));
        }
        format!(
            "{{\n{indent}  \"type\": \"object\",\n{indent}  \"additionalProperties\": false,\n{indent}  \
             \"description\": \"Keys of the daemon's config file (docs/node.md) that the chart does not \
             set itself; written from the settings' definitions (src/node/config.rs)\",\n{indent}  \
             \"properties\": {{\n{}\n{indent}  }}\n{indent}}}",
            props.join(",\n")
        )
    }

    /// charts/aether/values.schema.json's `config` offers every setting the chart does not set
    /// itself, with the definitions' types and bounds; `AETHER_BLESS=1` writes it.
    #[test]
    fn the_chart_schema_offers_every_setting_the_chart_does_not_set() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let path = root.join("charts/aether/values.schema.json");
        let text = std::fs::read_to_string(&path).expect("the chart's schema");
        let key = "\n    \"config\": ";
        let start = text.find(key).expect("the schema has a config object") + key.len();
        let mut depth = 0;
        let mut end = start;
        for (i, c) in text[start..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = start + i + 1;
                break;
            }
        }
        let found = &text[start..end];
        let want = chart_config_schema(root, "    ");
        let parsed: serde_json::Value = serde_json::from_str(&want).expect("valid JSON");
        assert!(
            parsed["properties"]
                .as_object()
                .is_some_and(|p| !p.is_empty())
        );
        if found != want && std::env::var_os("AETHER_BLESS").is_some() {
            std::fs::write(&path, format!("{}{want}{}", &text[..start], &text[end..]))
                .expect("write the schema");
            return;
        }
        assert_eq!(
            found, want,
            "the chart schema's config differs from the settings' definitions; run with \
             AETHER_BLESS=1 to write it"
        );
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
