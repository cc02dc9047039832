//! The data plane's labelled metrics (issue #10 §1): HTTP requests and their latency, TCP
//! relays, refusals, passthroughs, the mesh hop's handshakes and pool, authorization checks,
//! mesh DNS and UDP. docs/observability.md lists every series with its labels.
//!
//! No lock on the request path. prometheus-client's `Family::get_or_create` takes a lock on
//! every call, so the families here are not prometheus-client metrics: every series is a plain
//! atomic, found without a lock, and rendered at scrape time through the [`Collector`] trait.
//!
//! - Series that carry a destination service (namespace, name and port) hang off a [`Target`]
//!   in a [`Table`] built from the model whenever one is published ([`DataPlane::rebuild`]) and
//!   swapped whole (`ArcSwap`). A key the model does not hold counts under `unknown`, so the
//!   label set is bounded by the registry; a service that leaves the registry leaves the table
//!   at the next publish (its series vanish), one that stays keeps its series (and counts)
//!   across publishes.
//! - Each target holds one [`Series`] per source (the sending pod's mesh service: namespace and
//!   ServiceAccount), in a sorted list swapped whole when a new source first sends. A request or
//!   connection finds its series once (two hash lookups and a binary search by `&str`, no
//!   allocation) and keeps the `Arc`. Sources the model no longer holds are dropped at publish.
//! - Each (series, direction) allocates its cells on first use (`once_cell::race::OnceBox`:
//!   lock-free, a racing loser frees its copy), so a pair costs a few words until it carries
//!   traffic in that direction.
//! - Label sets that do not name a service (reason, cause, outcome) are fixed arrays.
//!
//! Layer 1: imports `model` (read only, to build the table), `resolve` (the reason table) and
//! prometheus-client's encoder.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use once_cell::race::OnceBox;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::dns::server::DnsStats;
use crate::model::Model;
use crate::resolve::answer::Reason;
use crate::resolve::decision::ServiceKey;

/// Upper bounds of every latency histogram, in seconds: 100 µs to 10 s (issue #10 §1), and the
/// `+Inf` bucket after them.
pub const BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// A latency histogram of plain atomics (one `fetch_add` per bucket, count and sum).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len() + 1],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Record one duration.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = BUCKETS.partition_point(|b| *b < secs);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// How many durations were recorded.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn encode(&self, mut e: prometheus_client::encoding::MetricEncoder<'_>) -> fmt::Result {
        let buckets: Vec<(f64, u64)> = BUCKETS
            .iter()
            .copied()
            .chain([f64::MAX])
            .zip(self.buckets.iter().map(|b| b.load(Ordering::Relaxed)))
            .collect();
        // Precision: the sum is kept in nanoseconds (585 years before it wraps).
        #[allow(clippy::cast_precision_loss)]
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        e.encode_histogram::<NoLabelSet>(sum, self.count(), &buckets, None)
    }
}

/// Which side of the mesh counted: `outbound` is the daemon of the client pod, `inbound` the
/// daemon that delivers to the destination pod (the hop's destination side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From a local client pod.
    Outbound,
    /// Arriving over the mesh hop, delivered to a local pod.
    Inbound,
}

impl Direction {
    const ALL: [Self; 2] = [Self::Outbound, Self::Inbound];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Outbound => "outbound",
            Self::Inbound => "inbound",
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Outbound => 0,
            Self::Inbound => 1,
        }
    }
}

/// Status code classes (`1xx` … `5xx`).
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
/// Reason slots: none, then [`Reason::ALL`] in order.
const REASON_SLOTS: usize = Reason::ALL.len() + 1;

/// The slot of a reason (0: none).
fn reason_slot(reason: Option<Reason>) -> usize {
    reason.map_or(0, |r| {
        Reason::ALL
            .iter()
            .position(|x| *x == r)
            .map_or(0, |i| i + 1)
    })
}

/// The label value of a reason slot: the `x-aether-error` value, empty for none.
fn reason_label(slot: usize) -> &'static str {
    slot.checked_sub(1)
        .and_then(|i| Reason::ALL.get(i))
        .map_or("", |r| r.code())
}

/// The reason an `x-aether-error` value names, when it is one of the closed table's.
pub fn reason_of(value: &[u8]) -> Option<Reason> {
    Reason::ALL
        .iter()
        .copied()
        .find(|r| r.code().as_bytes() == value)
}

/// HTTP series of one (service port, direction).
#[derive(Debug, Default)]
pub struct HttpCells {
    /// By code class and reason slot.
    requests: Box<[AtomicU64]>,
    /// The whole request: from its head to the response head.
    duration: Histogram,
    /// The mesh hop alone (source side): from sending the request on the hop to its response
    /// head.
    hop: Histogram,
}

impl HttpCells {
    fn new() -> Self {
        Self {
            requests: (0..CLASSES.len() * REASON_SLOTS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            duration: Histogram::default(),
            hop: Histogram::default(),
        }
    }
}

/// TCP series of one (service port, direction).
#[derive(Debug, Default)]
pub struct TcpCells {
    opened: AtomicU64,
    closed: AtomicU64,
    /// Bytes from the client toward the destination.
    sent: AtomicU64,
    /// Bytes from the destination back to the client.
    received: AtomicU64,
    duration: Histogram,
}

/// The source of a request or stream, as its labels: the mesh service of the pod that sent it
/// (its namespace and ServiceAccount, model.md §1), which is also its proven identity on the
/// hop. Bounded by the registry: [`DataPlane::rebuild`] drops the sources the model no longer
/// holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source<'a> {
    /// The source pod's namespace.
    pub namespace: &'a str,
    /// Its mesh service (ServiceAccount).
    pub service: &'a str,
}

/// Every series of one (destination, source) pair.
#[derive(Debug)]
pub struct Series {
    source: ServiceKey,
    http: [OnceBox<HttpCells>; 2],
    tcp: [OnceBox<TcpCells>; 2],
}

impl Series {
    fn new(source: ServiceKey) -> Self {
        Self {
            source,
            http: [OnceBox::new(), OnceBox::new()],
            tcp: [OnceBox::new(), OnceBox::new()],
        }
    }

    fn http(&self, direction: Direction) -> &HttpCells {
        self.http[direction.index()].get_or_init(|| Box::new(HttpCells::new()))
    }

    fn tcp(&self, direction: Direction) -> &TcpCells {
        self.tcp[direction.index()].get_or_init(Box::default)
    }

    /// Count one HTTP request that got `status` (with the mesh's `reason`, if it carries one)
    /// after `took`.
    pub fn record_request(
        &self,
        direction: Direction,
        status: u16,
        reason: Option<Reason>,
        took: Duration,
    ) {
        let cells = self.http(direction);
        let class = usize::from(status / 100).clamp(1, CLASSES.len()) - 1;
        cells.requests[class * REASON_SLOTS + reason_slot(reason)].fetch_add(1, Ordering::Relaxed);
        cells.duration.observe(took);
    }

    /// Record the mesh hop's own time of one request (source side).
    pub fn record_hop(&self, took: Duration) {
        self.http(Direction::Outbound).hop.observe(took);
    }

    /// Count a relayed byte stream opened.
    pub fn tcp_opened(&self, direction: Direction) {
        self.tcp(direction).opened.fetch_add(1, Ordering::Relaxed);
    }

    /// Count a relayed byte stream closed, with its bytes each way and its duration.
    pub fn tcp_closed(&self, direction: Direction, sent: u64, received: u64, took: Duration) {
        let cells = self.tcp(direction);
        cells.closed.fetch_add(1, Ordering::Relaxed);
        cells.sent.fetch_add(sent, Ordering::Relaxed);
        cells.received.fetch_add(received, Ordering::Relaxed);
        cells.duration.observe(took);
    }

    fn key(&self) -> (&str, &str) {
        (&self.source.namespace, &self.source.name)
    }
}

/// The series of each source of one target, sorted by source.
type Sources = Arc<Vec<Arc<Series>>>;

/// One destination (service and port, or `unknown`) and the series of each source seen
/// sending to it, sorted by source.
#[derive(Debug)]
pub struct Target {
    namespace: Arc<str>,
    service: Arc<str>,
    port: Option<u16>,
    /// Copied on write when a new source first sends (rare: once per pair while the model holds
    /// both), read without a lock otherwise.
    sources: ArcSwap<Vec<Arc<Series>>>,
}

impl Target {
    fn new(namespace: Arc<str>, service: Arc<str>, port: Option<u16>) -> Self {
        Self {
            namespace,
            service,
            port,
            sources: ArcSwap::from_pointee(Vec::new()),
        }
    }

    /// The series of `source` sending here; made on its first request or stream. A binary
    /// search by `&str`: no allocation unless the pair is new.
    pub fn from(&self, source: Source<'_>) -> Arc<Series> {
        let want = (source.namespace, source.service);
        let find = |v: &[Arc<Series>]| v.binary_search_by(|s| s.key().cmp(&want));
        {
            let now = self.sources.load();
            if let Ok(i) = find(&now) {
                return now[i].clone();
            }
        }
        let fresh = Arc::new(Series::new(ServiceKey {
            namespace: source.namespace.into(),
            name: source.service.into(),
        }));
        let mut out = fresh.clone();
        self.sources.rcu(|v| match find(v) {
            Ok(i) => {
                out = v[i].clone();
                v.clone()
            }
            Err(i) => {
                out = fresh.clone();
                let mut more = Vec::clone(v);
                more.insert(i, fresh.clone());
                Arc::new(more)
            }
        });
        out
    }

    fn labels(&self, direction: Option<Direction>, source: &Series) -> Labels {
        let mut l = Vec::with_capacity(6);
        if let Some(d) = direction {
            l.push(("direction", d.as_str().to_owned()));
        }
        l.push(("namespace", self.namespace.to_string()));
        l.push(("service", self.service.to_string()));
        l.push((
            "port",
            self.port
                .map_or_else(|| "unknown".to_owned(), |p| p.to_string()),
        ));
        l.push(("source_namespace", source.source.namespace.to_string()));
        l.push(("source_service", source.source.name.to_string()));
        l
    }

    /// Keep only the sources `keep` holds.
    fn retain(&self, keep: &std::collections::HashSet<(&str, &str)>) {
        let now = self.sources.load();
        if now.iter().all(|s| keep.contains(&s.key())) {
            return;
        }
        let kept: Vec<Arc<Series>> = now
            .iter()
            .filter(|s| keep.contains(&s.key()))
            .cloned()
            .collect();
        self.sources.store(Arc::new(kept));
    }
}

/// The targets of every service port the published model holds, by service and port.
#[derive(Debug)]
pub struct Table {
    by_service: HashMap<ServiceKey, Vec<(u16, Arc<Target>)>>,
    unknown: Arc<Target>,
}

impl Default for Table {
    fn default() -> Self {
        Self {
            by_service: HashMap::new(),
            unknown: Arc::new(Target::new("unknown".into(), "unknown".into(), None)),
        }
    }
}

impl Table {
    /// The target of `port` of `service`, or `unknown` when the model does not hold it.
    pub fn get(&self, service: &ServiceKey, port: u16) -> &Arc<Target> {
        self.by_service
            .get(service)
            .and_then(|ports| ports.iter().find(|(p, _)| *p == port))
            .map_or(&self.unknown, |(_, s)| s)
    }

    fn all(&self) -> impl Iterator<Item = &Arc<Target>> {
        let mut v: Vec<&Arc<Target>> = self
            .by_service
            .values()
            .flat_map(|ports| ports.iter().map(|(_, s)| s))
            .collect();
        v.sort_by(|a, b| {
            (&a.namespace, &a.service, a.port).cmp(&(&b.namespace, &b.service, b.port))
        });
        v.into_iter().chain([&self.unknown])
    }
}

/// Outcome of a mesh hop's TLS handshake, either side (the `result` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handshake {
    /// Finished, and the peer proved a mesh identity.
    Ok,
    /// Server side: the SNI names no port the pod serves with the hop's class; client side:
    /// the SNI is not a valid name.
    Sni,
    /// The peer's certificate chains to the CA but proves no identity of the trust domain (or
    /// this side had no certificate to offer).
    Identity,
    /// The peer's certificate does not verify against the trust bundle.
    Ca,
    /// Not finished within `handshake_timeout_ms`, or (client side) the TCP connect timed out.
    Timeout,
    /// Client side: the TCP connect failed.
    Connect,
    /// Any other TLS failure (the peer closed, a protocol error).
    Tls,
}

impl Handshake {
    const ALL: [Self; 7] = [
        Self::Ok,
        Self::Sni,
        Self::Identity,
        Self::Ca,
        Self::Timeout,
        Self::Connect,
        Self::Tls,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Sni => "sni",
            Self::Identity => "identity",
            Self::Ca => "ca",
            Self::Timeout => "timeout",
            Self::Connect => "connect",
            Self::Tls => "tls",
        }
    }

    /// The cause of a failed TLS handshake, from its error.
    pub fn of_tls_error(e: &std::io::Error) -> Self {
        let tls = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        match tls {
            Some(
                rustls::Error::InvalidCertificate(_)
                | rustls::Error::NoCertificatesPresented
                | rustls::Error::AlertReceived(
                    rustls::AlertDescription::BadCertificate
                    | rustls::AlertDescription::UnknownCA
                    | rustls::AlertDescription::CertificateRequired
                    | rustls::AlertDescription::CertificateUnknown,
                ),
            ) => Self::Ca,
            _ => Self::Tls,
        }
    }
}

/// Which side of the hop a handshake was counted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The source daemon (connecting).
    Client,
    /// The destination daemon (accepting).
    Server,
}

/// An authorization filter's kind (the `kind` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthzKind {
    /// `rbac`.
    Rbac,
    /// `ext_authz`.
    ExtAuthz,
    /// A MeshFilter the daemon could not read: always `unavailable` (issue #35 item 1).
    Unreadable,
}

/// An authorization check's outcome (the `outcome` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthzOutcome {
    /// Let through.
    Allow,
    /// Denied (`authz-denied`).
    Deny,
    /// The `ext_authz` server could not answer: denied, fail closed (`authz-unavailable`).
    Unavailable,
}

const AUTHZ_KINDS: [&str; 3] = ["rbac", "ext_authz", "unreadable"];
const AUTHZ_OUTCOMES: [&str; 3] = ["allow", "deny", "unavailable"];

/// A passthrough's protocol (the `protocol` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassProtocol {
    /// One HTTP request passed through.
    Http,
    /// A connection's bytes passed through.
    Tcp,
}

/// The data plane's metrics; one per daemon, in [`super::Inputs`].
#[derive(Debug)]
pub struct DataPlane {
    table: ArcSwap<Table>,
    refusals: [AtomicU64; Reason::ALL.len()],
    passthroughs: [AtomicU64; 2],
    handshakes: [[AtomicU64; Handshake::ALL.len()]; 2],
    /// Pooled HTTP/2 hop connections open now.
    pub pool_connections: AtomicI64,
    /// Requests in flight on pooled hop connections now.
    pub pool_streams: AtomicI64,
    authz: [[AtomicU64; 3]; AUTHZ_KINDS.len()],
    authz_duration: [Histogram; AUTHZ_KINDS.len()],
    udp: [AtomicU64; 2],
    /// Mesh DNS: every pod's server counts here.
    pub dns: Arc<DnsStats>,
}

impl Default for DataPlane {
    fn default() -> Self {
        Self {
            table: ArcSwap::from_pointee(Table::default()),
            refusals: Default::default(),
            passthroughs: Default::default(),
            handshakes: Default::default(),
            pool_connections: AtomicI64::new(0),
            pool_streams: AtomicI64::new(0),
            authz: Default::default(),
            authz_duration: Default::default(),
            udp: Default::default(),
            dns: Arc::default(),
        }
    }
}

impl DataPlane {
    /// Rebuild the service table for a newly published model, off the request path: every
    /// service port the model holds (its names' front ports and its mesh services' ports) keeps
    /// its target if it had one; the others are dropped. Each kept target keeps the sources the
    /// model still holds (a mesh service, or the ServiceAccount of a pod it knows). O(service
    /// ports + pods).
    pub fn rebuild(&self, model: &Model) {
        let old = self.table.load_full();
        let mut by_service: HashMap<ServiceKey, Vec<(u16, Arc<Target>)>> = HashMap::new();
        for (key, port) in model.service_ports() {
            let target = old
                .by_service
                .get(&key)
                .and_then(|ports| ports.iter().find(|(p, _)| *p == port))
                .map_or_else(
                    || {
                        Arc::new(Target::new(
                            key.namespace.clone(),
                            key.name.clone(),
                            Some(port),
                        ))
                    },
                    |(_, s)| s.clone(),
                );
            by_service.entry(key).or_default().push((port, target));
        }
        let table = Table {
            by_service,
            unknown: old.unknown.clone(),
        };
        let sources = model.sources();
        for target in table.all() {
            target.retain(&sources);
        }
        self.table.store(Arc::new(table));
    }

    /// The series of `source` sending to `port` of `service` (`unknown` when the published
    /// model does not hold it). Keep the `Arc` for the request or connection.
    pub fn series(&self, service: &ServiceKey, port: u16, source: Source<'_>) -> Arc<Series> {
        self.table.load().get(service, port).from(source)
    }

    /// The series of `source`'s requests and connections with no destination service.
    pub fn unknown(&self, source: Source<'_>) -> Arc<Series> {
        self.table.load().unknown.from(source)
    }

    /// Count one mesh answer this daemon sent.
    pub fn refused(&self, reason: Reason) {
        if let Some(slot) = reason_slot(Some(reason)).checked_sub(1) {
            self.refusals[slot].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Count one passthrough.
    pub fn passthrough(&self, protocol: PassProtocol) {
        let i = match protocol {
            PassProtocol::Http => 0,
            PassProtocol::Tcp => 1,
        };
        self.passthroughs[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Passthroughs so far, both protocols.
    pub fn passthroughs(&self) -> u64 {
        self.passthroughs.iter().map(load).sum()
    }

    /// Count one mesh hop handshake.
    pub fn handshake(&self, side: Side, result: Handshake) {
        let s = match side {
            Side::Client => 0,
            Side::Server => 1,
        };
        if let Some(i) = Handshake::ALL.iter().position(|h| *h == result) {
            self.handshakes[s][i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Count one authorization check and its time.
    pub fn authz(&self, kind: AuthzKind, outcome: AuthzOutcome, took: Duration) {
        let k = match kind {
            AuthzKind::Rbac => 0,
            AuthzKind::ExtAuthz => 1,
            AuthzKind::Unreadable => 2,
        };
        let o = match outcome {
            AuthzOutcome::Allow => 0,
            AuthzOutcome::Deny => 1,
            AuthzOutcome::Unavailable => 2,
        };
        self.authz[k][o].fetch_add(1, Ordering::Relaxed);
        self.authz_duration[k].observe(took);
    }

    /// Count one UDP datagram: `request` from the client toward the destination, else a reply.
    pub fn udp_datagram(&self, request: bool) {
        self.udp[usize::from(!request)].fetch_add(1, Ordering::Relaxed);
    }
}

/// Renders a [`DataPlane`] at scrape time.
#[derive(Debug, Clone)]
pub struct DataPlaneCollector(pub Arc<DataPlane>);

/// The labels of one row of a family, as rendered.
type Labels = Vec<(&'static str, String)>;

fn counter(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Labels, u64)],
) -> fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn histograms(
    e: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Labels, &Histogram)],
) -> fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, h) in rows {
        h.encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn with(mut labels: Labels, more: &[(&'static str, &str)]) -> Labels {
    labels.extend(more.iter().map(|(k, v)| (*k, (*v).to_owned())));
    labels
}

impl Collector for DataPlaneCollector {
    /// The families in the order of docs/observability.md: the per-destination ones (HTTP, then
    /// TCP), then the daemon's mesh answers, the hop, authorization, DNS and UDP.
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> fmt::Result {
        let dp = &self.0;
        let table = dp.table.load_full();
        // Every (target, source) pair, its sources' list held for the whole scrape.
        let pairs: Vec<(&Arc<Target>, Sources)> =
            table.all().map(|t| (t, t.sources.load_full())).collect();
        let rows = DestinationRows::gather(&pairs);
        rows.encode_http(&mut e)?;
        rows.encode_tcp(&mut e)?;
        dp.encode_answers(&mut e)?;
        dp.encode_hop(&mut e)?;
        dp.encode_authz(&mut e)?;
        dp.encode_dns_and_udp(&mut e)
    }
}

/// The rows of the families that carry a destination service, gathered from every (target,
/// source) pair of one scrape: one row per pair and direction that carried traffic.
#[derive(Default)]
struct DestinationRows<'a> {
    requests: Vec<(Labels, u64)>,
    durations: Vec<(Labels, &'a Histogram)>,
    hops: Vec<(Labels, &'a Histogram)>,
    opened: Vec<(Labels, u64)>,
    closed: Vec<(Labels, u64)>,
    sent: Vec<(Labels, u64)>,
    received: Vec<(Labels, u64)>,
    tcp_durations: Vec<(Labels, &'a Histogram)>,
}

impl<'a> DestinationRows<'a> {
    fn gather(pairs: &'a [(&Arc<Target>, Sources)]) -> Self {
        let mut rows = Self::default();
        for (target, sources) in pairs {
            for (series, d) in sources.iter().flat_map(|s| Direction::ALL.map(|d| (s, d))) {
                if let Some(c) = series.http[d.index()].get() {
                    rows.add_http(target, series, d, c);
                }
                if let Some(c) = series.tcp[d.index()].get() {
                    let l = target.labels(Some(d), series);
                    rows.opened.push((l.clone(), load(&c.opened)));
                    rows.closed.push((l.clone(), load(&c.closed)));
                    rows.sent.push((l.clone(), load(&c.sent)));
                    rows.received.push((l.clone(), load(&c.received)));
                    rows.tcp_durations.push((l, &c.duration));
                }
            }
        }
        rows
    }

    /// The HTTP rows of `series` sending to `target` in direction `d`: a request row per status
    /// class and reason that counted any, the duration, and the hop's time when it has one.
    fn add_http(&mut self, target: &Target, series: &Series, d: Direction, c: &'a HttpCells) {
        let l = target.labels(Some(d), series);
        for (i, n) in c.requests.iter().enumerate() {
            let n = load(n);
            if n == 0 {
                continue;
            }
            let (class, slot) = (i / REASON_SLOTS, i % REASON_SLOTS);
            let labels = with(
                l.clone(),
                &[("code", CLASSES[class]), ("reason", reason_label(slot))],
            );
            self.requests.push((labels, n));
        }
        self.durations.push((l, &c.duration));
        if d == Direction::Outbound && c.hop.count() > 0 {
            self.hops.push((target.labels(None, series), &c.hop));
        }
    }

    fn encode_http(&self, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
        counter(
            e,
            "aether_http_requests",
            "HTTP requests, by direction, destination service and port, source service, status class and mesh reason",
            &self.requests,
        )?;
        histograms(
            e,
            "aether_http_request_duration_seconds",
            "HTTP requests from the request head to the response head",
            &self.durations,
        )?;
        histograms(
            e,
            "aether_hop_request_duration_seconds",
            "HTTP requests on the mesh hop alone (source side): sent on the hop to its response head",
            &self.hops,
        )
    }

    fn encode_tcp(&self, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
        counter(
            e,
            "aether_tcp_connections_opened",
            "Relayed byte streams opened (raw TCP, L4 hops, passthroughs), by destination",
            &self.opened,
        )?;
        counter(
            e,
            "aether_tcp_connections_closed",
            "Relayed byte streams closed, by destination",
            &self.closed,
        )?;
        counter(
            e,
            "aether_tcp_sent_bytes",
            "Bytes relayed from the client toward the destination",
            &self.sent,
        )?;
        counter(
            e,
            "aether_tcp_received_bytes",
            "Bytes relayed from the destination back to the client",
            &self.received,
        )?;
        histograms(
            e,
            "aether_tcp_connection_duration_seconds",
            "Relayed byte streams, from the relay's start to its end",
            &self.tcp_durations,
        )
    }
}

// === The families without a destination, rendered by DataPlaneCollector ===

impl DataPlane {
    /// Refusals by reason and passthroughs by protocol.
    fn encode_answers(&self, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let refusals: Vec<_> = Reason::ALL
            .iter()
            .zip(&self.refusals)
            .map(|(r, n)| (vec![("reason", r.code().to_owned())], load(n)))
            .collect();
        counter(
            e,
            "aether_refusals",
            "Mesh answers this daemon sent (x-aether-error), by reason",
            &refusals,
        )?;
        let pass: Vec<_> = ["http", "tcp"]
            .iter()
            .zip(&self.passthroughs)
            .map(|(p, n)| (vec![("protocol", (*p).to_owned())], load(n)))
            .collect();
        counter(
            e,
            "aether_passthroughs",
            "Connections (tcp) and HTTP requests (http) passed through to their dialled destination",
            &pass,
        )
    }

    /// The mesh hop's handshakes by side and result, and its pool's gauges.
    fn encode_hop(&self, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let mut shakes = Vec::new();
        for (side, row) in ["client", "server"].iter().zip(&self.handshakes) {
            for (h, n) in Handshake::ALL.iter().zip(row) {
                shakes.push((
                    vec![
                        ("side", (*side).to_owned()),
                        ("result", h.as_str().to_owned()),
                    ],
                    load(n),
                ));
            }
        }
        counter(
            e,
            "aether_hop_handshakes",
            "Mesh hop TLS handshakes, by side and result (ok, or the cause of the failure)",
            &shakes,
        )?;
        for (name, help, g) in [
            (
                "aether_hop_pool_connections",
                "Pooled HTTP/2 mesh hop connections open now",
                &self.pool_connections,
            ),
            (
                "aether_hop_pool_streams",
                "Requests in flight on pooled mesh hop connections now",
                &self.pool_streams,
            ),
        ] {
            let m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(g.load(Ordering::Relaxed)).encode(m)?;
        }
        Ok(())
    }

    /// Authorization checks by kind and outcome, and their durations by kind.
    fn encode_authz(&self, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let mut checks = Vec::new();
        for (kind, row) in AUTHZ_KINDS.iter().zip(&self.authz) {
            for (outcome, n) in AUTHZ_OUTCOMES.iter().zip(row) {
                checks.push((
                    vec![
                        ("kind", (*kind).to_owned()),
                        ("outcome", (*outcome).to_owned()),
                    ],
                    load(n),
                ));
            }
        }
        counter(
            e,
            "aether_authz_checks",
            "Authorization checks (rbac, ext_authz), by outcome",
            &checks,
        )?;
        let authz_durations: Vec<_> = AUTHZ_KINDS
            .iter()
            .zip(&self.authz_duration)
            .map(|(k, h)| (vec![("kind", (*k).to_owned())], h))
            .collect();
        histograms(
            e,
            "aether_authz_check_duration_seconds",
            "Authorization checks, from the start of the check to its verdict",
            &authz_durations,
        )
    }

    /// Mesh DNS queries by answer kind, and UDP datagrams by way.
    fn encode_dns_and_udp(&self, e: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let c = self.dns.counts();
        let dns: Vec<_> = [
            ("answered", c.answered),
            ("forwarded", c.forwarded),
            ("servfail", c.servfail),
            ("formerr", c.formerr),
            ("dropped", c.dropped),
        ]
        .iter()
        .map(|(k, n)| (vec![("answer", (*k).to_owned())], *n))
        .collect();
        counter(
            e,
            "aether_dns_queries",
            "Mesh DNS queries, by answer kind",
            &dns,
        )?;
        let udp: Vec<_> = ["request", "reply"]
            .iter()
            .zip(&self.udp)
            .map(|(w, n)| (vec![("way", (*w).to_owned())], load(n)))
            .collect();
        counter(
            e,
            "aether_udp_datagrams",
            "UDP datagrams relayed: request (client to destination) and reply",
            &udp,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(dp: &Arc<DataPlane>) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(DataPlaneCollector(dp.clone())));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    fn key(ns: &str, name: &str) -> ServiceKey {
        ServiceKey {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_duration_lands_in_the_first_bucket_at_or_above_it() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(100));
        h.observe(Duration::from_micros(101));
        h.observe(Duration::from_secs(11));
        let b: Vec<u64> = h.buckets.iter().map(load).collect();
        assert_eq!(b[0], 1, "100 µs is in le=0.0001");
        assert_eq!(b[1], 1, "101 µs is in le=0.00025");
        assert_eq!(b[BUCKETS.len()], 1, "11 s is only in +Inf");
        assert_eq!(h.count(), 3);
    }

    const CLIENT: Source<'static> = Source {
        namespace: "mp",
        service: "mp-client",
    };

    #[test]
    fn requests_render_with_their_labels_and_unknown_services_stay_unknown() {
        let dp = Arc::new(DataPlane::default());
        let snapshot = crate::model::Snapshot::default();
        dp.rebuild(&crate::model::compile(
            &snapshot,
            &crate::model::NodeContext::default(),
        ));
        let s = dp.series(&key("mp", "nothing-here"), 8080, CLIENT);
        s.record_request(
            Direction::Outbound,
            421,
            Some(Reason::PortMismatch),
            Duration::from_millis(1),
        );
        s.record_request(Direction::Inbound, 200, None, Duration::from_millis(1));
        let text = render(&dp);
        let src = "source_namespace=\"mp\",source_service=\"mp-client\"";
        assert!(
            text.contains(&format!(
                "aether_http_requests_total{{direction=\"outbound\",namespace=\"unknown\",service=\"unknown\",port=\"unknown\",{src},code=\"4xx\",reason=\"port-mismatch\"}} 1"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "aether_http_requests_total{{direction=\"inbound\",namespace=\"unknown\",service=\"unknown\",port=\"unknown\",{src},code=\"2xx\",reason=\"\"}} 1"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!("aether_http_request_duration_seconds_bucket{{le=\"0.001\",direction=\"outbound\",namespace=\"unknown\",service=\"unknown\",port=\"unknown\",{src}}} 1")),
            "{text}"
        );
    }

    #[test]
    fn each_source_has_its_own_series_found_again_without_a_new_one() {
        let dp = Arc::new(DataPlane::default());
        let a = dp.unknown(CLIENT);
        let b = dp.unknown(Source {
            namespace: "mp",
            service: "mp-other",
        });
        let c = dp.unknown(Source {
            namespace: "ab",
            service: "mp-client",
        });
        assert!(!Arc::ptr_eq(&a, &b) && !Arc::ptr_eq(&a, &c));
        assert!(Arc::ptr_eq(&a, &dp.unknown(CLIENT)));
        a.record_request(Direction::Outbound, 200, None, Duration::from_millis(1));
        b.record_request(Direction::Outbound, 200, None, Duration::from_millis(1));
        b.record_request(Direction::Outbound, 200, None, Duration::from_millis(1));
        let text = render(&dp);
        assert!(
            text.contains(
                "source_namespace=\"mp\",source_service=\"mp-client\",code=\"2xx\",reason=\"\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "source_namespace=\"mp\",source_service=\"mp-other\",code=\"2xx\",reason=\"\"} 2"
            ),
            "{text}"
        );
        // A source of no request renders no request sample.
        assert!(!text.contains("aether_http_requests_total{direction=\"outbound\",namespace=\"unknown\",service=\"unknown\",port=\"unknown\",source_namespace=\"ab\""), "{text}");
    }

    #[test]
    fn a_service_keeps_its_series_across_publishes_and_loses_them_when_removed() {
        let dp = DataPlane::default();
        let mut table = Table::default();
        let target = Arc::new(Target::new("mp".into(), "a".into(), Some(80)));
        let series = target.from(CLIENT);
        table.by_service.insert(key("mp", "a"), vec![(80, target)]);
        dp.table.store(Arc::new(table));
        assert!(Arc::ptr_eq(
            &dp.series(&key("mp", "a"), 80, CLIENT),
            &series
        ));
        assert!(Arc::ptr_eq(
            &dp.series(&key("mp", "a"), 81, CLIENT),
            &dp.unknown(CLIENT)
        ));
        // A model without the service: its series are gone, and so is every source the model
        // does not hold; `unknown` stays.
        let unknown = dp.unknown(CLIENT);
        dp.rebuild(&crate::model::compile(
            &crate::model::Snapshot::default(),
            &crate::model::NodeContext::default(),
        ));
        assert!(dp.table.load().unknown.sources.load().is_empty());
        let again = dp.series(&key("mp", "a"), 80, CLIENT);
        assert!(!Arc::ptr_eq(&again, &series) && !Arc::ptr_eq(&again, &unknown));
        assert!(Arc::ptr_eq(&again, &dp.unknown(CLIENT)));
    }

    #[test]
    fn every_reason_code_maps_back_to_its_reason() {
        for r in Reason::ALL {
            assert_eq!(reason_of(r.code().as_bytes()), Some(r));
            assert_eq!(reason_label(reason_slot(Some(r))), r.code());
        }
        assert_eq!(reason_of(b"nonsense"), None);
        assert_eq!(reason_label(reason_slot(None)), "");
    }
}
