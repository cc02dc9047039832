//! Shedding before the OOM killer (issue #36 item 4): the memory level the node's monitor sets
//! (`node::memory`), the HTTP connections it may close, and the HTTP/2 streams each peer has
//! open across all its connections.
//!
//! - [`Level::Pressure`], memory at or over `overload_refuse_percent` of the limit: every new
//!   connection (captured, loopback, inbound hop) is closed at accept.
//! - [`Level::Critical`], at or over `overload_shed_percent`: a peer holding a tenth of its
//!   stream cap or more gets no new HTTP/2 stream (`REFUSED_STREAM`, which tells the client
//!   nothing was processed), and each check closes a quarter of the HTTP connections that have
//!   no request in flight: those holding the most bytes of an unfinished request head first,
//!   then the longest idle. Requests in flight, relayed byte streams and the few streams of
//!   ordinary peers go on.
//! - The level falls back to normal only once memory is [`HYSTERESIS_PERCENT`] under the refuse
//!   threshold, so that it does not flap at the line.
//!
//! Apart from memory, a peer (a local pod on the source side, a peer identity on the hop) may
//! have at most `max_streams_per_peer` HTTP/2 streams open at once over all its connections;
//! each connection is also bounded by `http2_max_concurrent_streams`.

use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use dashmap::DashMap;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// At the critical level a peer may open new HTTP/2 streams only while it holds fewer than
/// `max_streams_per_peer` divided by this: the peers holding the most are refused, the ordinary
/// traffic of the others (a few streams each, the mesh hop's included) goes on.
pub const CRITICAL_SHARE: usize = 10;

/// What a connection with no partial head is reckoned to hold when a shed adds up what it
/// frees: its task, its buffers, its sockets (an idle one measured 11 to 14 KiB, docs/node.md).
pub const CONNECTION_BYTES: usize = 16 * 1024;

/// How long a connection must have been idle before a shed may close it.
pub const MIN_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// How far under the refuse threshold memory must fall before new connections are accepted
/// again, in percent of the limit.
pub const HYSTERESIS_PERCENT: u64 = 5;

/// The daemon's memory level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Under the thresholds (or no limit is known).
    Normal,
    /// At or over the refuse threshold: new connections are closed at accept.
    Pressure,
    /// At or over the shed threshold: new HTTP/2 streams are refused and idle or partial
    /// connections closed.
    Critical,
}

impl Level {
    /// Its name in logs and on `/ready`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Pressure => "pressure",
            Self::Critical => "critical",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Normal,
            1 => Self::Pressure,
            _ => Self::Critical,
        }
    }
}

/// The thresholds, in percent of the memory limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// New connections are refused at or over this.
    pub refuse_percent: u64,
    /// New HTTP/2 streams are refused and idle or partial connections closed at or over this.
    pub shed_percent: u64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            refuse_percent: 90,
            shed_percent: 95,
        }
    }
}

/// The level at `used` bytes of `limit`, coming from `was`: pure.
pub fn next_level(used: u64, limit: u64, th: Thresholds, was: Level) -> Level {
    if limit == 0 {
        return Level::Normal;
    }
    // In u128: no overflow for any u64.
    let at = |p: u64| u128::from(used) * 100 >= u128::from(limit) * u128::from(p);
    if at(th.shed_percent) {
        Level::Critical
    } else if at(th.refuse_percent)
        || (was > Level::Normal && at(th.refuse_percent.saturating_sub(HYSTERESIS_PERCENT)))
    {
        Level::Pressure
    } else {
        Level::Normal
    }
}

/// What a connection tells the shedder about itself (`http::limits` keeps it).
pub trait Sheddable: Send + Sync {
    /// Requests (or streams) in flight on it now.
    fn in_flight(&self) -> usize;
    /// Bytes read of a request head that has not arrived whole.
    fn partial_bytes(&self) -> usize;
    /// Since when it has had no request in flight (for work not yet served: its accept).
    fn idle_since(&self) -> tokio::time::Instant;
    /// Close it now.
    fn shed(&self);
    /// Whether it was told to close already.
    fn is_shed(&self) -> bool;
}

/// Why work was shed: the label of `aether_shed_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shed {
    /// A new connection closed at accept under memory pressure.
    AcceptRefused,
    /// A new HTTP/2 stream refused at the critical level (its peer held a tenth of its cap).
    StreamRefused,
    /// A connection holding part of a request head, closed at the critical level.
    PartialHeadClosed,
    /// A connection with no request in flight, closed at the critical level.
    IdleClosed,
    /// A new HTTP/2 stream refused because its peer had `max_streams_per_peer` open.
    PeerStreams,
    /// A connection whose unfinished first head would have taken the node's partial heads
    /// past `max_pending_head_bytes`, closed at whatever level.
    HeadBudget,
}

impl Shed {
    /// Every reason, for the metric's help and tests.
    pub const ALL: [Self; 6] = [
        Self::AcceptRefused,
        Self::StreamRefused,
        Self::PartialHeadClosed,
        Self::IdleClosed,
        Self::PeerStreams,
        Self::HeadBudget,
    ];

    /// The label value.
    pub fn code(self) -> &'static str {
        match self {
            Self::AcceptRefused => "accept-refused",
            Self::StreamRefused => "stream-refused",
            Self::PartialHeadClosed => "partial-head-closed",
            Self::IdleClosed => "idle-closed",
            Self::PeerStreams => "peer-streams",
            Self::HeadBudget => "head-budget",
        }
    }
}

/// The shared state of the overload manager.
#[derive(Debug)]
pub struct Overload {
    level: AtomicU8,
    next_id: AtomicU64,
    conns: DashMap<u64, Weak<dyn Sheddable>>,
    peers: DashMap<Arc<str>, usize>,
    max_streams_per_peer: usize,
    /// Bytes of first-head buffers beyond their first read's, over every connection.
    head_bytes: AtomicUsize,
    /// `max_pending_head_bytes`.
    max_head_bytes: usize,
    /// `aether_shed_total{reason}`.
    pub shed: Family<[(&'static str, &'static str); 1], Counter>,
    /// The memory in use at the last check (`aether_memory_used_bytes`).
    pub used_bytes: Gauge<i64>,
    /// The limit it is measured against; 0: none known (`aether_memory_limit_bytes`).
    pub limit_bytes: Gauge<i64>,
}

impl std::fmt::Debug for dyn Sheddable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sheddable")
            .field("in_flight", &self.in_flight())
            .field("partial_bytes", &self.partial_bytes())
            .finish()
    }
}

impl Default for Overload {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_STREAMS_PER_PEER)
    }
}

/// The default of `max_streams_per_peer`: ten connections' worth of the default
/// `http2_max_concurrent_streams`.
pub const DEFAULT_MAX_STREAMS_PER_PEER: usize = 2000;

/// The default of `max_pending_head_bytes`: 64 MiB, a thousand heads at `max_header_bytes`.
pub const DEFAULT_MAX_PENDING_HEAD_BYTES: usize = 64 << 20;

/// What one read of a first head may take without the budget (`max_pending_head_bytes`): a
/// head that arrives whole in a read or two costs nothing against it, and the number of such
/// buffers is bounded by the connection limits.
pub const HEAD_READ_BYTES: usize = 16 * 1024;

impl Overload {
    /// At the normal level, each peer allowed `max_streams_per_peer` HTTP/2 streams at once.
    pub fn new(max_streams_per_peer: usize) -> Self {
        Self {
            level: AtomicU8::new(0),
            next_id: AtomicU64::new(0),
            conns: DashMap::new(),
            peers: DashMap::new(),
            max_streams_per_peer,
            head_bytes: AtomicUsize::new(0),
            max_head_bytes: DEFAULT_MAX_PENDING_HEAD_BYTES,
            shed: Family::default(),
            used_bytes: Gauge::default(),
            limit_bytes: Gauge::default(),
        }
    }

    /// With `max` bytes for the first-head buffers beyond their first read (`max_pending_head_bytes`).
    #[must_use]
    pub fn with_max_pending_head_bytes(mut self, max: usize) -> Self {
        self.max_head_bytes = max;
        self
    }

    /// Take `bytes` more of the partial heads' budget: `false` (nothing taken) when that would
    /// go past `max_pending_head_bytes`.
    pub fn charge_head(&self, bytes: usize) -> bool {
        self.head_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes)
                    .filter(|&n| n <= self.max_head_bytes)
            })
            .is_ok()
    }

    /// Take `bytes` of the partial heads' budget whatever it holds (an allocation made).
    pub fn force_charge_head(&self, bytes: usize) {
        self.head_bytes.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Give `bytes` of the partial heads' budget back.
    pub fn release_head(&self, bytes: usize) {
        let _ = self
            .head_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            });
    }

    /// Bytes of the partial heads' budget taken now.
    pub fn pending_head_bytes(&self) -> usize {
        self.head_bytes.load(Ordering::Acquire)
    }

    /// Register its metrics.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        for why in Shed::ALL {
            // Every reason from the start, so that a rate over it is defined before the first.
            let _ = self.shed.get_or_create(&[("reason", why.code())]);
        }
        registry.register(
            "aether_shed",
            "Work shed by the overload manager, by reason: accept-refused and stream-refused (memory pressure), partial-head-closed and idle-closed (memory critical), peer-streams (max_streams_per_peer), head-budget (max_pending_head_bytes)",
            self.shed.clone(),
        );
        registry.register_with_unit(
            "aether_memory_used",
            "The daemon's memory in use at the overload manager's last check (its cgroup's charge less inactive file cache), in bytes",
            prometheus_client::registry::Unit::Bytes,
            self.used_bytes.clone(),
        );
        registry.register_with_unit(
            "aether_memory_limit",
            "The memory limit the overload manager measures against, in bytes; 0: none known, nothing is shed by memory",
            prometheus_client::registry::Unit::Bytes,
            self.limit_bytes.clone(),
        );
        let level = <Gauge>::default();
        level.set(self.level() as i64);
        registry.register(
            "aether_overload_level",
            "The overload manager's level: 0 normal, 1 pressure (new connections refused), 2 critical (new HTTP/2 streams refused, idle and partial connections closed)",
            level,
        );
    }

    /// The level now.
    pub fn level(&self) -> Level {
        Level::from_u8(self.level.load(Ordering::Relaxed))
    }

    /// Set by the monitor.
    pub fn set_level(&self, level: Level) {
        self.level.store(level as u8, Ordering::Relaxed);
    }

    /// Count one piece of work shed.
    pub fn count(&self, why: Shed) {
        self.shed.get_or_create(&[("reason", why.code())]).inc();
    }

    /// Whether a new connection is refused now (counted when it is).
    pub fn refuses_connections(&self) -> bool {
        let refuse = self.level() >= Level::Pressure;
        if refuse {
            self.count(Shed::AcceptRefused);
        }
        refuse
    }

    /// Register a connection that may be shed; it leaves the registry when its [`Registered`]
    /// is dropped.
    pub fn register(self: &Arc<Self>, conn: Weak<dyn Sheddable>) -> Registered {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.conns.insert(id, conn);
        Registered {
            overload: self.clone(),
            id,
        }
    }

    /// Connections registered now.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Open one HTTP/2 stream of `peer`: `None` (counted) when the peer has
    /// `max_streams_per_peer` open, or at the critical level a tenth of it
    /// ([`CRITICAL_SHARE`]); the stream is open until the [`PeerStream`] drops.
    pub fn open_stream(self: &Arc<Self>, peer: &Arc<str>) -> Option<PeerStream> {
        let critical = self.level() == Level::Critical;
        let cap = if critical {
            (self.max_streams_per_peer / CRITICAL_SHARE).max(1)
        } else {
            self.max_streams_per_peer
        };
        let mut open = self.peers.entry(peer.clone()).or_insert(0);
        if *open >= cap {
            drop(open);
            self.count(if critical && cap < self.max_streams_per_peer {
                Shed::StreamRefused
            } else {
                Shed::PeerStreams
            });
            return None;
        }
        *open += 1;
        drop(open);
        Some(PeerStream {
            overload: self.clone(),
            peer: peer.clone(),
        })
    }

    /// HTTP/2 streams open now, over every peer.
    pub fn streams_open(&self) -> usize {
        self.peers.iter().map(|e| *e.value()).sum()
    }

    /// The bytes of unfinished request heads each registered connection holds now (those with
    /// none left out), largest first: what a shed would close first.
    pub fn partial_heads(&self) -> Vec<usize> {
        let mut heads: Vec<usize> = self
            .conns
            .iter()
            .filter_map(|e| e.value().upgrade())
            .filter(|c| c.in_flight() == 0)
            .map(|c| c.partial_bytes())
            .filter(|&b| b > 0)
            .collect();
        heads.sort_unstable_by(|a, b| b.cmp(a));
        heads
    }

    /// Streams `peer` has open now.
    pub fn peer_streams(&self, peer: &str) -> usize {
        self.peers.get(peer).map_or(0, |n| *n)
    }

    /// Close connections with no request in flight, the most bytes of an unfinished head
    /// first, idle ones (the longest idle first) only when no partial head is left: a quarter
    /// of them (at least one), and more until what
    /// they hold (at least [`CONNECTION_BYTES`] each) covers `excess` bytes. What was closed,
    /// as (partial, idle). A connection idle for less than [`MIN_IDLE`] is left alone: it was
    /// just opened for a request on its way, or has just answered one; one already told to
    /// close is not counted twice.
    pub fn shed_some(&self, excess: u64) -> (usize, usize) {
        let now = tokio::time::Instant::now();
        let mut candidates: Vec<(usize, tokio::time::Instant, Arc<dyn Sheddable>)> = self
            .conns
            .iter()
            .filter_map(|e| e.value().upgrade())
            .filter(|c| c.in_flight() == 0 && !c.is_shed())
            .map(|c| (c.partial_bytes(), c.idle_since(), c))
            .filter(|(partial, since, _)| {
                *partial > 0 || now.saturating_duration_since(*since) >= MIN_IDLE
            })
            .collect();
        // Idle connections only once no partial head is left: a client's kept connection
        // between two requests is not the flood.
        if candidates.iter().any(|(partial, _, _)| *partial > 0) {
            candidates.retain(|(partial, _, _)| *partial > 0);
        }
        let n = candidates.len().div_ceil(4);
        let order = pick_order(
            &candidates
                .iter()
                .map(|(p, i, _)| (*p, *i))
                .collect::<Vec<_>>(),
        );
        let (mut partial, mut idle, mut freed) = (0, 0, 0u64);
        for (k, i) in order.into_iter().enumerate() {
            if k >= n && freed >= excess {
                break;
            }
            let (bytes, _, conn) = &candidates[i];
            freed += u64::try_from((*bytes).max(CONNECTION_BYTES)).unwrap_or(u64::MAX);
            conn.shed();
            if *bytes > 0 {
                partial += 1;
                self.count(Shed::PartialHeadClosed);
            } else {
                idle += 1;
                self.count(Shed::IdleClosed);
            }
        }
        candidates.clear();
        (partial, idle)
    }
}

/// The order in which candidates `(partial bytes, idle since)` are shed: pure. Partial heads
/// first, the largest first; then idle connections, the oldest first.
pub fn pick_order<T: Ord + Copy>(candidates: &[(usize, T)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by(|&a, &b| {
        let (pa, ia) = candidates[a];
        let (pb, ib) = candidates[b];
        pb.cmp(&pa).then(ia.cmp(&ib))
    });
    order
}

/// A connection not served yet (its first request head is being read): sheddable as a partial
/// head of the bytes read so far ([`Overload::pending`]).
#[derive(Debug)]
pub struct Pending {
    bytes: AtomicUsize,
    since: tokio::time::Instant,
    shed: tokio::sync::Notify,
    told: std::sync::atomic::AtomicBool,
}

impl Pending {
    /// `n` bytes of its head have been read.
    pub fn read(&self, n: usize) {
        self.bytes.store(n, Ordering::Relaxed);
    }

    /// Until it is shed.
    pub async fn shed(&self) {
        self.shed.notified().await;
    }
}

impl Sheddable for Pending {
    fn in_flight(&self) -> usize {
        0
    }

    fn partial_bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    fn idle_since(&self) -> tokio::time::Instant {
        self.since
    }

    fn shed(&self) {
        self.told.store(true, Ordering::Relaxed);
        self.shed.notify_one();
    }

    fn is_shed(&self) -> bool {
        self.told.load(Ordering::Relaxed)
    }
}

impl Overload {
    /// A connection accepted now whose first head is being read, registered until both
    /// returned values drop.
    pub fn pending(self: &Arc<Self>) -> (Arc<Pending>, Registered) {
        let pending = Arc::new(Pending {
            bytes: AtomicUsize::new(0),
            since: tokio::time::Instant::now(),
            shed: tokio::sync::Notify::new(),
            told: std::sync::atomic::AtomicBool::new(false),
        });
        let weak: Weak<dyn Sheddable> = Arc::downgrade(&pending) as _;
        let registered = self.register(weak);
        (pending, registered)
    }
}

/// A connection in the shedder's registry.
#[derive(Debug)]
pub struct Registered {
    overload: Arc<Overload>,
    id: u64,
}

impl Registered {
    /// The manager it is registered with.
    pub fn overload(&self) -> &Arc<Overload> {
        &self.overload
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.overload.conns.remove(&self.id);
    }
}

/// One open HTTP/2 stream of a peer ([`Overload::open_stream`]).
#[derive(Debug)]
pub struct PeerStream {
    overload: Arc<Overload>,
    peer: Arc<str>,
}

impl Drop for PeerStream {
    fn drop(&mut self) {
        // The entry goes with its last stream: a peer that left costs nothing.
        self.overload.peers.remove_if_mut(&self.peer, |_, open| {
            *open = open.saturating_sub(1);
            *open == 0
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    const MIB: u64 = 1 << 20;

    #[test]
    fn levels_enter_at_their_thresholds_and_leave_pressure_below_a_margin() {
        let th = Thresholds::default();
        let limit = 100 * MIB;
        let at = |percent: u64, was| next_level(limit * percent / 100, limit, th, was);
        assert_eq!(at(50, Level::Normal), Level::Normal);
        assert_eq!(at(89, Level::Normal), Level::Normal);
        assert_eq!(at(90, Level::Normal), Level::Pressure);
        assert_eq!(at(95, Level::Normal), Level::Critical);
        assert_eq!(at(120, Level::Normal), Level::Critical);
        // Coming down: critical leaves at once, pressure only 5 points under its line.
        assert_eq!(at(94, Level::Critical), Level::Pressure);
        assert_eq!(at(86, Level::Pressure), Level::Pressure);
        assert_eq!(at(86, Level::Critical), Level::Pressure);
        assert_eq!(at(84, Level::Pressure), Level::Normal);
        // No limit known: never shed.
        assert_eq!(next_level(u64::MAX, 0, th, Level::Critical), Level::Normal);
        assert_eq!(
            next_level(u64::MAX, u64::MAX, th, Level::Normal),
            Level::Critical
        );
    }

    #[test]
    fn partial_heads_go_first_the_largest_first_then_the_oldest_idle() {
        let order = pick_order(&[(0, 50), (100, 90), (0, 10), (4000, 80), (100, 20)]);
        assert_eq!(order, vec![3, 4, 1, 2, 0]);
    }

    #[derive(Default)]
    struct Conn {
        in_flight: usize,
        partial: usize,
        idle_since: u64,
        shed: AtomicBool,
        base: Option<tokio::time::Instant>,
    }

    impl Sheddable for Conn {
        fn in_flight(&self) -> usize {
            self.in_flight
        }
        fn partial_bytes(&self) -> usize {
            self.partial
        }
        fn idle_since(&self) -> tokio::time::Instant {
            self.base.unwrap() + std::time::Duration::from_secs(self.idle_since)
        }
        fn shed(&self) {
            self.shed.store(true, Ordering::SeqCst);
        }
        fn is_shed(&self) -> bool {
            self.shed.load(Ordering::SeqCst)
        }
    }

    fn shed_count(o: &Overload, why: Shed) -> u64 {
        o.shed.get_or_create(&[("reason", why.code())]).get()
    }

    #[test]
    fn a_quarter_of_the_connections_with_nothing_in_flight_is_shed_and_counted() {
        let o = Arc::new(Overload::default());
        // Idle for 100 s and less, as the node's clock says.
        let base = tokio::time::Instant::now()
            .checked_sub(std::time::Duration::from_secs(200))
            .unwrap();
        let mut conns: Vec<Arc<Conn>> = (0..8)
            .map(|i| {
                Arc::new(Conn {
                    partial: if i < 3 { 1000 * (i + 1) } else { 0 },
                    idle_since: 100 - i as u64,
                    base: Some(base),
                    ..Conn::default()
                })
            })
            .collect();
        conns.push(Arc::new(Conn {
            in_flight: 1,
            partial: 1 << 20,
            base: Some(base),
            ..Conn::default()
        }));
        let regs: Vec<Registered> = conns
            .iter()
            .map(|c| {
                let c: Arc<dyn Sheddable> = c.clone();
                o.register(Arc::downgrade(&c))
            })
            .collect();
        assert_eq!(o.connections(), 9);
        // The one with a request in flight is no candidate, idle ones are none while partial
        // heads are left: a quarter of the three heads, the largest.
        assert_eq!(o.shed_some(0), (1, 0));
        let shed: Vec<usize> = (0..9)
            .filter(|&i| conns[i].shed.load(Ordering::SeqCst))
            .collect();
        assert_eq!(shed, vec![2]);
        assert_eq!(shed_count(&o, Shed::PartialHeadClosed), 1);
        // Not twice; more than a quarter when what must go is more (both heads left, reckoned
        // at 16 KiB each, do not cover 40,000 bytes: all of them, and no idle one yet).
        assert_eq!(o.shed_some(40_000), (2, 0));
        // Then more than a quarter (here 3 of 5) when what must go is more: three idle ones,
        // reckoned at 16 KiB each, cover 40,000 bytes; the longest idle first.
        assert_eq!(o.shed_some(40_000), (0, 3));
        let idle_shed: Vec<usize> = (3..8)
            .filter(|&i| conns[i].shed.load(Ordering::SeqCst))
            .collect();
        assert_eq!(idle_shed, vec![5, 6, 7], "the longest idle first");
        drop(regs);
        assert_eq!(o.connections(), 0);
        conns.clear();
    }

    #[test]
    fn a_peer_holds_at_most_its_streams_across_connections_and_critical_refuses_new_ones() {
        let o = Arc::new(Overload::new(3));
        let a: Arc<str> = Arc::from("mp/mp-client");
        let b: Arc<str> = Arc::from("mp/other");
        let open: Vec<PeerStream> = (0..3).map(|_| o.open_stream(&a).unwrap()).collect();
        assert!(
            o.open_stream(&a).is_none(),
            "the fourth stream of a is refused"
        );
        assert_eq!(shed_count(&o, Shed::PeerStreams), 1);
        let other = o
            .open_stream(&b)
            .expect("another peer is not held back by a");
        drop(open);
        assert_eq!(o.peer_streams(&a), 0);
        assert!(
            o.peers.get(&a).is_none(),
            "a peer with no stream leaves no entry"
        );
        // At the critical level a peer holds a tenth of its cap (here: 1).
        o.set_level(Level::Critical);
        let one = o.open_stream(&a).expect("a first stream still opens");
        assert!(o.open_stream(&a).is_none());
        assert_eq!(shed_count(&o, Shed::StreamRefused), 1);
        drop(one);
        o.set_level(Level::Pressure);
        assert!(o.refuses_connections());
        assert_eq!(shed_count(&o, Shed::AcceptRefused), 1);
        drop(other);
    }
}
