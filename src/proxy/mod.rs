//! The data plane: the capture listener, the proxy port, the mesh hop and UDP
//! (ARCHITECTURE.md "proxy"). It reads the published model and the workload identities; it never
//! reads the registry and never programs capture.
//!
//! Imports inside the data plane run one way (issue #7 §7): `outbound` → `http` (`serve` →
//! `deliver` → `mirror`, `upstream`) → `filters` → `mesh_call` → `balance` → `hop` → `socket`; `inbound`
//! (the hop's destination side) → `filters`, `http::upstream`, `http::limits`. `respond`, `sniff`, `upgrade`
//! and `app_pool` import none of them. Sockets of a pod come from its [`socket`] factory.

pub mod access;
pub mod app_pool;
pub mod balance;
pub mod copy;
pub mod filters;
pub mod hop;
pub mod http;
pub mod inbound;
pub mod log_gate;
pub mod mesh_call;
pub mod metrics;
pub mod outbound;
pub mod overload;
pub mod passthrough;
pub mod peek;
pub mod read_ahead;
pub mod respond;
pub mod rewind;
pub use aether_core::proxy::sniff;
pub mod socket;
pub mod udp;
pub mod upgrade;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use rustls::pki_types::CertificateDer;

use crate::resolve::decision::{Caller, CaptureMode};
use crate::state::ModelHandle;
use socket::SocketFactory;

/// The body type every proxied request and response is converted to.
pub type Body = http_body_util::combinators::BoxBody<Bytes, BoxError>;

/// A boxed error of a body or a connection.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub use crate::wire::{
    ALPN_H1, ALPN_HTTP, ALPN_L4, ALPN_TCP, ALPNS, CAPTURE_PORT, HOP_PORT, LEGACY_PORT, PROXY_PORT,
};

/// A peer the mesh hop proved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its namespace.
    pub namespace: String,
    /// Its ServiceAccount.
    pub service_account: String,
    /// Its SPIFFE ID.
    pub id: String,
}

impl Peer {
    /// The peer as the source of the metrics' series: its mesh service.
    pub fn source(&self) -> metrics::Source<'_> {
        metrics::Source {
            namespace: &self.namespace,
            service: &self.service_account,
        }
    }
}

/// The TLS side of the mesh hop, provided by `identity` (wired in `node`).
pub trait HopTls: Send + Sync + std::fmt::Debug + 'static {
    /// The client configuration of a source workload, offering `alpn`.
    fn client(
        &self,
        namespace: &str,
        service_account: &str,
        alpn: &[u8],
    ) -> Arc<rustls::ClientConfig>;
    /// The server configuration of a destination workload (offering [`ALPNS`]; the inbound
    /// hop adds any of them it lacks); `None` when
    /// it cannot be built (the hop is then refused).
    fn server(&self, namespace: &str, service_account: &str) -> Option<Arc<rustls::ServerConfig>>;
    /// The identity a peer's certificate chain proves, in our trust domain; `None` refuses it.
    fn peer(&self, chain: &[CertificateDer<'_>]) -> Option<Peer>;
}

/// Settings of the data plane.
#[derive(Clone, Debug)]
pub struct ProxySettings {
    /// The mesh domain (SNI of the hop).
    pub mesh_domain: String,
    /// The SPIFFE trust domain (the caller's identity in route-level authorization checks).
    pub trust_domain: String,
    /// The bound on waiting for a client's first bytes (1 s, spec/README "Fixed numbers").
    pub sniff_bound: Duration,
    /// The discovery hold (2 s).
    pub hold: Duration,
    /// Connecting to an endpoint (the mesh hop's TCP connect) or a passthrough destination: a
    /// connect that takes longer fails, and a delivery tries another endpoint
    /// ([`balance`]). Node setting `connect_timeout_ms`, default 1 s: a hop crosses the
    /// cluster's network, where a live pod answers a SYN in milliseconds.
    pub connect_timeout: Duration,
    /// Endpoint choice: ejection of endpoints that fail to connect, and the cap on the
    /// endpoints tracked ([`balance::Limits`]; node settings `endpoint_ejection_ms`,
    /// `endpoint_ejection_max_ms`, `endpoint_states_max`).
    pub balance: balance::Limits,
    /// The largest HTTP/1 request head accepted.
    pub max_header_bytes: usize,
    /// A UDP flow (client address, dialled address) with no datagram either way for this long
    /// is closed: its socket and task are released (node setting `udp_idle_secs`, default 60 s).
    pub udp_idle: Duration,
    /// Connections open at once through this daemon (captured, loopback and inbound hop
    /// together); a connection above it is closed at accept and counted.
    pub max_connections: usize,
    /// Connections open at once for one pod (its captured and loopback connections, and the
    /// inbound hops to it); a connection above it is closed at accept and counted.
    pub max_connections_per_pod: usize,
    /// The TLS handshake of the mesh hop, either side: a peer that does not finish it in this
    /// long is closed (and counted).
    pub handshake_timeout: Duration,
    /// The most UDP flows open at once for one pod; a datagram that would open another is
    /// dropped and counted in `aether_udp_flows_refused_total`, while the open flows keep
    /// working (node setting `udp_max_flows_per_pod`, default 1024).
    pub udp_max_flows_per_pod: usize,
    /// How long a client may take to send a whole HTTP/1 request head, from its first byte (the
    /// first head of a connection: from the accept). A late head closes the connection.
    pub header_read_timeout: Duration,
    /// An HTTP connection (HTTP/1 keep-alive or HTTP/2) with no request in flight is closed
    /// after this long; HTTP/2 with GOAWAY.
    pub http_idle_timeout: Duration,
    /// The most streams a peer may have open at once on one HTTP/2 connection
    /// (`SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub http2_max_concurrent_streams: u32,
    /// The largest HTTP/2 request header list accepted (RFC 9113 §6.5.2: names, values and 32
    /// bytes per field).
    pub max_header_list_size: u32,
    /// The most header fields an HTTP/1 request head may have.
    pub max_headers: usize,
    /// A relayed byte stream (raw TCP, an L4 hop, a passthrough, a spliced upgrade) that moves
    /// no byte either way for this long is closed ([`copy::bidirectional`]); `None`: never.
    pub tcp_idle_timeout: Option<Duration>,
    /// The largest request body buffered to copy to a `RequestMirror`; a larger one is not
    /// mirrored (logged and counted in `aether_mirror_skipped`), the request itself goes on.
    pub mirror_max_body_bytes: usize,
    /// The largest body of an `ext_authz` server's answer that is read: a denial's body is
    /// relayed to the client, and what is over this is not read (the denial goes without a
    /// body; counted in `aether_ext_authz_body_over_limit`).
    pub ext_authz_max_body_bytes: usize,
    /// The most HTTP/2 streams one peer may have open at once over all its connections
    /// ([`overload::Overload::open_stream`]; node setting `max_streams_per_peer`).
    pub max_streams_per_peer: usize,
}

impl Default for ProxySettings {
    fn default() -> Self {
        Self {
            mesh_domain: "aether.internal".into(),
            trust_domain: "cluster.local".into(),
            sniff_bound: Duration::from_secs(1),
            hold: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
            balance: balance::Limits::default(),
            max_header_bytes: 64 * 1024,
            udp_idle: Duration::from_secs(60),
            max_connections: 100_000,
            max_connections_per_pod: 20_000,
            handshake_timeout: Duration::from_secs(10),
            udp_max_flows_per_pod: 1024,
            header_read_timeout: Duration::from_secs(10),
            http_idle_timeout: Duration::from_secs(300),
            http2_max_concurrent_streams: 200,
            max_header_list_size: 64 * 1024,
            max_headers: 100,
            tcp_idle_timeout: Some(Duration::from_secs(3600)),
            mirror_max_body_bytes: 1024 * 1024,
            ext_authz_max_body_bytes: 64 * 1024,
            max_streams_per_peer: overload::DEFAULT_MAX_STREAMS_PER_PEER,
        }
    }
}

/// What every connection task shares.
#[derive(Debug)]
pub struct Inputs {
    /// The published model.
    pub model: Arc<ModelHandle>,
    /// The mesh hop's TLS.
    pub tls: Arc<dyn HopTls>,
    /// Settings.
    pub settings: ProxySettings,
    /// Pooled HTTP/2 hop connections.
    pub pool: hop::Pool,
    /// The endpoint choice: load and ejection per endpoint ([`balance`]).
    pub balance: balance::Balancer,
    /// Set to `true` when the daemon drains: HTTP connections close once idle (HTTP/2 with
    /// GOAWAY), in-flight requests finish.
    pub drain: tokio::sync::watch::Sender<bool>,
    /// Counters.
    pub stats: Stats,
    /// The labelled data-plane metrics (lock-free; [`metrics`]).
    pub metrics: Arc<metrics::DataPlane>,
    /// The access log's switch ([`access`]).
    pub access: access::AccessLog,
    /// The overload manager's level, its registry of HTTP connections and each peer's HTTP/2
    /// streams ([`overload`]).
    pub overload: Arc<overload::Overload>,
}

/// Data-plane counters (exported by `admin` through prometheus-client).
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections accepted on capture listeners.
    pub captured: Counter,
    /// Mesh answers sent (4xx/5xx with a reason).
    pub answers: Counter,
    /// Deliveries over the mesh hop.
    pub deliveries: Counter,
    /// Inbound hop connections refused (SNI, identity).
    pub hop_refused: Counter,
    /// Deliveries to the application that fell back to the pod's own IP (model.md §12.4).
    pub transparent_fallbacks: Counter,
    /// Mirror copies sent (`RequestMirror`).
    pub mirrors: Counter,
    /// Mirror copies that failed (not resolvable, unreachable, or the copy's request failed).
    pub mirror_failures: Counter,
    /// Mirror copies not sent because the body was larger than
    /// [`ProxySettings::mirror_max_body_bytes`] (or too slow to arrive).
    pub mirror_skipped: Counter,
    /// Upgraded connections spliced (a `101 Switching Protocols` relayed).
    pub upgrades: Counter,
    /// Connections open now (capture, loopback, inbound hop).
    pub active: Gauge,
    /// Connections closed at accept because a connection limit was reached
    /// ([`ProxySettings::max_connections`], [`ProxySettings::max_connections_per_pod`]).
    pub over_limit: Counter,
    /// Mesh hop TLS handshakes that did not finish within [`ProxySettings::handshake_timeout`].
    pub handshake_timeouts: Counter,
    /// Passthroughs (connections, and HTTP requests one by one) whose destination is a mesh
    /// pod, carried over the mesh hop (model.md §12.5 item 1).
    pub l4_hops: Counter,
    /// Raw-TCP and L4 connections over the hop refused at the destination by a service-level
    /// authorization (model.md §12.5 item 2).
    pub l4_denied: Counter,
    /// Captured connections closed because they dialled a reserved port of the daemon
    /// (a direct connection to the capture listener, model.md §12.5 item 4).
    pub reserved_dials: Counter,
    /// Failed accepts, by listener (`admin`, `cni`, `dns`, `capture`, ...): each is waited out
    /// with a backoff ([`crate::accept`]).
    pub accept_errors: Family<[(&'static str, &'static str); 1], Counter>,
    /// UDP flows open now, over every pod.
    pub udp_flows: Gauge,
    /// Datagrams dropped because their pod had `udp_max_flows_per_pod` flows open.
    pub udp_flows_refused: Counter,
    /// HTTP connections closed because a request head did not arrive whole within
    /// [`ProxySettings::header_read_timeout`].
    pub header_timeouts: Counter,
    /// HTTP connections closed after [`ProxySettings::http_idle_timeout`] with no request.
    pub idle_closed: Counter,
    /// Times an HTTP/2 connection reached [`ProxySettings::http2_max_concurrent_streams`].
    pub http2_stream_limit: Counter,
    /// `400 bad-request` answers: a head the parser rejects, conflicting framing, or a body the
    /// client broke.
    pub bad_requests: Counter,
    /// `431 headers-too-large` answers: a head over [`ProxySettings::max_header_bytes`] or
    /// [`ProxySettings::max_headers`], a header list over
    /// [`ProxySettings::max_header_list_size`].
    pub headers_too_large: Counter,
    /// Relayed byte streams closed after [`ProxySettings::tcp_idle_timeout`] without a byte.
    pub tcp_idle_closed: Counter,
    /// `ext_authz` answers whose body was over [`ProxySettings::ext_authz_max_body_bytes`].
    pub ext_authz_body_over_limit: Counter,
    /// Connections to a pod address that rows of more than one service claim, refused: a
    /// pod-IP dial closed at accept, a passthrough not opened (docs/decisions.md, "An address
    /// two rows claim").
    pub contested_refused: Counter,
    /// Inbound hops closed after the handshake because their source address does not prove
    /// their certificate's identity (model.md §14, source binding), by reason
    /// ([`crate::model::Unbound::code`]).
    pub hop_unbound: Family<[(&'static str, &'static str); 1], Counter>,
    /// The warning of a hop refused by source binding, at most once a second.
    pub hop_unbound_log: log_gate::LogGate,
    /// The warning of a delivery whose mesh hop failed, at most once a second.
    pub hop_failed_log: log_gate::LogGate,
}

impl Stats {
    /// Register every counter.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        let counters = [
            (
                "aether_captured_connections",
                "Connections accepted on capture listeners",
                &self.captured,
            ),
            (
                "aether_mesh_answers",
                "Mesh answers (4xx/5xx with x-aether-error)",
                &self.answers,
            ),
            (
                "aether_deliveries",
                "Deliveries over the mesh hop",
                &self.deliveries,
            ),
            (
                "aether_hop_refused",
                "Inbound mesh hops refused (SNI, identity, handshake)",
                &self.hop_refused,
            ),
            (
                "aether_transparent_fallbacks",
                "Deliveries to the application from the pod's own IP",
                &self.transparent_fallbacks,
            ),
            ("aether_mirrors", "RequestMirror copies sent", &self.mirrors),
            (
                "aether_mirror_failures",
                "RequestMirror copies that failed",
                &self.mirror_failures,
            ),
            (
                "aether_mirror_skipped",
                "RequestMirror copies not sent: the body was over the limit",
                &self.mirror_skipped,
            ),
            (
                "aether_connections_over_limit",
                "Connections closed at accept: a connection limit was reached",
                &self.over_limit,
            ),
            (
                "aether_hop_handshake_timeouts",
                "Mesh hop TLS handshakes that did not finish in time",
                &self.handshake_timeouts,
            ),
            (
                "aether_l4_hops",
                "Passthroughs (connections and HTTP requests) to a mesh pod carried over the mesh hop",
                &self.l4_hops,
            ),
            (
                "aether_l4_denied",
                "Raw-TCP and L4 connections over the hop refused by service-level authorization",
                &self.l4_denied,
            ),
            (
                "aether_reserved_port_dials",
                "Captured connections closed: they dialled a reserved port of the daemon",
                &self.reserved_dials,
            ),
            (
                "aether_upgrades",
                "Upgraded connections spliced after 101 Switching Protocols",
                &self.upgrades,
            ),
            (
                "aether_http_header_timeouts",
                "HTTP connections closed: a request head not received within header_read_timeout",
                &self.header_timeouts,
            ),
            (
                "aether_http_idle_closed",
                "HTTP connections closed after http_idle_timeout with no request in flight",
                &self.idle_closed,
            ),
            (
                "aether_http2_stream_limit",
                "Times an HTTP/2 connection reached http2_max_concurrent_streams",
                &self.http2_stream_limit,
            ),
            (
                "aether_http_bad_requests",
                "400 bad-request answers: a rejected head, conflicting framing, a broken body",
                &self.bad_requests,
            ),
            (
                "aether_http_headers_too_large",
                "431 headers-too-large answers: max_header_bytes, max_headers, max_header_list_size",
                &self.headers_too_large,
            ),
            (
                "aether_tcp_idle_closed",
                "Relayed byte streams closed after tcp_idle_timeout with no byte either way",
                &self.tcp_idle_closed,
            ),
            (
                "aether_ext_authz_body_over_limit",
                "ext_authz answers whose body was over ext_authz_max_body_bytes (not read)",
                &self.ext_authz_body_over_limit,
            ),
            (
                "aether_contested_address_refused",
                "Connections to a pod address claimed by rows of more than one service, refused",
                &self.contested_refused,
            ),
        ];
        for (name, help, c) in counters {
            registry.register(name, help, c.clone());
        }
        registry.register(
            "aether_active_connections",
            "Connections open now",
            self.active.clone(),
        );
        registry.register(
            "aether_udp_flows",
            "UDP flows open now",
            self.udp_flows.clone(),
        );
        registry.register(
            "aether_udp_flows_refused",
            "UDP datagrams dropped: their pod had udp_max_flows_per_pod flows open",
            self.udp_flows_refused.clone(),
        );
        // Every reason has its series from the start, so that a rate is defined before the
        // first refusal.
        for code in crate::model::Unbound::CODES {
            let _ = self.hop_unbound.get_or_create(&[("reason", code)]);
        }
        registry.register(
            "aether_hop_source_refused",
            "Inbound mesh hops closed after the handshake: the source address does not prove the certificate's identity (source binding), by reason",
            self.hop_unbound.clone(),
        );
        registry.register(
            "aether_accept_errors",
            "Failed accepts, by listener; each is retried after a backoff",
            self.accept_errors.clone(),
        );
    }

    /// The accept-error counter of one listener (a fixed name: `admin`, `cni`, `dns`, ...).
    pub fn accept_errors(&self, listener: &'static str) -> Counter {
        self.accept_errors
            .get_or_create(&[("listener", listener)])
            .clone()
    }
}

/// A counter.
pub type Counter = prometheus_client::metrics::counter::Counter;
/// A family of metrics by label set.
pub type Family<L, M> = prometheus_client::metrics::family::Family<L, M>;
/// A gauge.
pub type Gauge = prometheus_client::metrics::gauge::Gauge;

/// Increment a counter.
pub fn count(c: &Counter) {
    c.inc();
}

/// Relay a byte stream both ways (raw TCP, an L4 hop, a passthrough, a spliced upgrade) until
/// both sides close, or until it moves no byte for [`ProxySettings::tcp_idle_timeout`]
/// (counted in `aether_tcp_idle_closed`). An idle relay holds no buffer ([`copy`]). The bytes
/// moved each way, however it ends, go to `conn` (`a` is the client's side).
pub async fn relay<A, B>(
    inputs: &Inputs,
    a: &mut A,
    b: &mut B,
    conn: &mut access::TcpConn,
) -> std::io::Result<copy::Ended>
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + ?Sized,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + ?Sized,
{
    let mut moved = copy::Moved::default();
    let ended =
        copy::bidirectional_counted(a, b, inputs.settings.tcp_idle_timeout, &mut moved).await;
    conn.sent = moved.a_to_b;
    conn.received = moved.b_to_a;
    if let Ok(copy::Ended::Idle) = ended {
        count(&inputs.stats.tcp_idle_closed);
    }
    ended
}

/// One admitted connection, counted against the daemon's and its pod's limits for as long as
/// it lives ([`ProxySettings::max_connections`], [`ProxySettings::max_connections_per_pod`]).
#[derive(Debug)]
pub struct Active {
    daemon: Gauge,
    pod: Arc<PodCtx>,
}

impl Active {
    /// Admit one more connection of `pod`, or `None` (counted) when a limit is reached: the
    /// caller closes the connection and keeps serving the ones already open.
    pub fn admit(inputs: &Inputs, pod: &Arc<PodCtx>) -> Option<Self> {
        let settings = &inputs.settings;
        // Under memory pressure nothing new is taken on (counted by the overload manager).
        if inputs.overload.refuses_connections() {
            tracing::debug!(pod = %pod.name, "memory pressure: closed at accept");
            return None;
        }
        let mine = pod.open.fetch_add(1, Ordering::AcqRel);
        let all = inputs.stats.active.inc();
        let over_pod = mine >= settings.max_connections_per_pod;
        let over_daemon = usize::try_from(all).unwrap_or(usize::MAX) >= settings.max_connections;
        let active = Self {
            daemon: inputs.stats.active.clone(),
            pod: pod.clone(),
        };
        if over_pod || over_daemon {
            drop(active);
            count(&inputs.stats.over_limit);
            // Counted, not logged per connection: a flood must not become a log flood.
            tracing::debug!(pod = %pod.name, over_pod, over_daemon, "connection limit reached: closed at accept");
            return None;
        }
        Some(active)
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.daemon.dec();
        self.pod.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One local pod, as the data plane sees it.
#[derive(Debug)]
pub struct PodCtx {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// ServiceAccount (its mesh service and identity).
    pub service_account: String,
    /// Where its sockets come from (its network namespace in the daemon).
    pub net: SocketFactory,
    /// Its capture mode.
    pub capture: CaptureMode,
    /// The pod as a caller.
    caller: Caller,
    /// Set once the pod is no longer served ([`PodCtx::retire`]).
    retired: tokio::sync::watch::Sender<bool>,
    /// Its connections open now ([`Active`]).
    open: AtomicUsize,
    /// Kept connections opened in its network namespace: to its application (deliveries) and
    /// to its passthroughs' destinations. They go with the pod.
    pub apps: app_pool::AppPool,
}

impl PodCtx {
    /// A pod of the data plane; its caller facts are built once, not per connection.
    pub fn new(
        namespace: String,
        name: String,
        service_account: String,
        net: SocketFactory,
        capture: CaptureMode,
    ) -> Self {
        let caller = Caller {
            namespace: Some(namespace.clone()),
            pod: Some(name.clone()),
            service_account: Some(service_account.clone()),
            capture,
        };
        Self {
            namespace,
            name,
            service_account,
            net,
            capture,
            caller,
            retired: tokio::sync::watch::Sender::new(false),
            open: AtomicUsize::new(0),
            apps: app_pool::AppPool::default(),
        }
    }

    /// Run one of the pod's connections until it ends or the pod is retired: a pod that is no
    /// longer served (its CNI DEL, or gone from the registry) takes its connections with it,
    /// where a pod whose settings change keeps them.
    ///
    /// The connection comes boxed: an `async fn` keeps its argument's slot beside the copy it
    /// awaits, so a connection's future passed by value sat twice in its task (about 1 KiB more
    /// for every idle captured connection; docs/performance.md, "Many idle connections").
    pub async fn until_retired(
        &self,
        connection: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    ) {
        let mut retired = self.retired.subscribe();
        tokio::select! {
            () = connection => {}
            _ = retired.wait_for(|r| *r) => {}
        }
    }

    /// The pod is no longer served: end every connection run by [`PodCtx::until_retired`].
    pub fn retire(&self) {
        self.retired.send_replace(true);
    }

    /// Its connections open now (captured, loopback, and inbound hops to it).
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// The pod as a caller (connection facts only, I4).
    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// The pod as the source of the metrics' series: its mesh service.
    pub fn source(&self) -> metrics::Source<'_> {
        metrics::Source {
            namespace: &self.namespace,
            service: &self.service_account,
        }
    }
}
