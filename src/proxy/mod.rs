//! The data plane: the capture listener, the proxy port, the mesh hop and UDP
//! (ARCHITECTURE.md "proxy"). It reads the published model and the workload identities; it never
//! reads the registry and never programs capture.
//!
//! Imports inside the data plane run one way (issue #7 §7): `outbound` → `http` (`serve` →
//! `deliver` → `mirror`, `upstream`) → `filters` → `mesh_call` → `hop` → `socket`; `inbound`
//! (the hop's destination side) → `filters`, `http::upstream`, `http::limits`. `respond`, `sniff`, `upgrade`
//! and `app_pool` import none of them. Sockets of a pod come from its [`socket`] factory.

pub mod app_pool;
pub mod filters;
pub mod hop;
pub mod http;
pub mod inbound;
pub mod mesh_call;
pub mod outbound;
pub mod respond;
pub mod sniff;
pub mod socket;
pub mod udp;
pub mod upgrade;

use std::sync::Arc;
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

/// ALPN of an HTTP mesh hop (HTTP/2).
pub const ALPN_HTTP: &[u8] = b"h2";
/// ALPN of a raw-TCP mesh hop (a byte stream).
pub const ALPN_TCP: &[u8] = b"aether-tcp/1";
/// ALPN of an HTTP/1.1 mesh hop that carries one request asking to switch protocols
/// (`Upgrade`, addressing.md I11): HTTP/2 cannot carry it, so it gets a connection of its own,
/// checked at the destination as the HTTP class.
pub const ALPN_H1: &[u8] = b"aether-h1/1";
/// Every ALPN the inbound hop serves, in preference order (the destination's TLS offers these).
pub const ALPNS: &[&[u8]] = &[ALPN_HTTP, ALPN_TCP, ALPN_H1];

/// The largest request body copied to a `RequestMirror`; a larger body is not mirrored
/// (logged and counted in `aether_mirror_skipped`).
pub const MIRROR_BODY_LIMIT: usize = 1024 * 1024;

/// The mesh hop port on every pod IP.
pub const HOP_PORT: u16 = 18008;
/// The capture port.
pub const CAPTURE_PORT: u16 = 18001;
/// The proxy port.
pub const PROXY_PORT: u16 = 18081;
/// The legacy raw-TCP and UDP port.
pub const LEGACY_PORT: u16 = 18082;

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
    /// Connecting to an endpoint or a passthrough destination.
    pub connect_timeout: Duration,
    /// The largest HTTP/1 request head accepted.
    pub max_header_bytes: usize,
    /// Idle UDP flows are forgotten after this long.
    pub udp_idle: Duration,
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
}

impl Default for ProxySettings {
    fn default() -> Self {
        Self {
            mesh_domain: "aether.internal".into(),
            trust_domain: "cluster.local".into(),
            sniff_bound: Duration::from_secs(1),
            hold: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            max_header_bytes: 64 * 1024,
            udp_idle: Duration::from_secs(60),
            header_read_timeout: Duration::from_secs(10),
            http_idle_timeout: Duration::from_secs(300),
            http2_max_concurrent_streams: 200,
            max_header_list_size: 64 * 1024,
            max_headers: 100,
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
    /// Kept connections to local applications.
    pub apps: app_pool::AppPool,
    /// Set to `true` when the daemon drains: HTTP connections close once idle (HTTP/2 with
    /// GOAWAY), in-flight requests finish.
    pub drain: tokio::sync::watch::Sender<bool>,
    /// Counters.
    pub stats: Stats,
}

/// Data-plane counters (exported by `admin` through prometheus-client).
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections accepted on capture listeners.
    pub captured: Counter,
    /// HTTP requests handled.
    pub requests: Counter,
    /// Mesh answers sent (4xx/5xx with a reason).
    pub answers: Counter,
    /// Deliveries over the mesh hop.
    pub deliveries: Counter,
    /// Passthroughs.
    pub passthroughs: Counter,
    /// Inbound hop connections refused (SNI, identity).
    pub hop_refused: Counter,
    /// Deliveries to the application that fell back to the pod's own IP (model.md §12.4).
    pub transparent_fallbacks: Counter,
    /// Mirror copies sent (`RequestMirror`).
    pub mirrors: Counter,
    /// Mirror copies that failed (not resolvable, unreachable, or the copy's request failed).
    pub mirror_failures: Counter,
    /// Mirror copies not sent because the body was larger than [`MIRROR_BODY_LIMIT`].
    pub mirror_skipped: Counter,
    /// Upgraded connections spliced (a `101 Switching Protocols` relayed).
    pub upgrades: Counter,
    /// Connections open now (capture, loopback, inbound hop).
    pub active: Gauge,
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
                "aether_http_requests",
                "HTTP requests handled",
                &self.requests,
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
                "aether_passthroughs",
                "Connections and requests passed through",
                &self.passthroughs,
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
        ];
        for (name, help, c) in counters {
            registry.register(name, help, c.clone());
        }
        registry.register(
            "aether_active_connections",
            "Connections open now",
            self.active.clone(),
        );
    }
}

/// A counter.
pub type Counter = prometheus_client::metrics::counter::Counter;
/// A gauge.
pub type Gauge = prometheus_client::metrics::gauge::Gauge;

/// Increment a counter.
pub fn count(c: &Counter) {
    c.inc();
}

/// Counts one open connection for as long as it lives.
#[derive(Debug)]
pub struct Active(Gauge);

impl Active {
    /// Start counting.
    pub fn new(stats: &Stats) -> Self {
        stats.active.inc();
        Self(stats.active.clone())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.dec();
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
        }
    }

    /// Run one of the pod's connections until it ends or the pod is retired: a pod that is no
    /// longer served (its CNI DEL, or gone from the registry) takes its connections with it,
    /// where a pod whose settings change keeps them.
    pub async fn until_retired(&self, connection: impl Future<Output = ()>) {
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

    /// The pod as a caller (connection facts only, I4).
    pub fn caller(&self) -> &Caller {
        &self.caller
    }
}
