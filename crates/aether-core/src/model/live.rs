//! The model kept by changes: a registry change compiles the components it touches again, and
//! the next model is the last one with their entries replaced.
//!
//! [`Live`] holds every object by its key, the component ([`split`](crate::model::split)) each
//! belongs to, which component each link (a name, an address, a reference) is in, and the
//! model. A change of one object dissolves the components it was in or now reaches through a
//! link; their objects are joined again among themselves, each new component is compiled alone
//! ([`compile()`]), and its entries replace the dissolved components' in the model's tables,
//! which are shared with the last model ([`table`](crate::model::table)) rather than copied.
//! Nothing else is read: a change costs its components, not the registry.
//!
//! The result is [`compile()`] of the whole: a property test (`model::proptests`) checks it
//! after every step of random change sequences.

use crate::prelude::*;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::model::attach::RouteStatus;
use crate::model::compile::{Entries, compile_entries};
use crate::model::snapshot::{
    EndpointSlice, FilterConfig, HttpRoute, L4Route, MeshFilter, Pod, ReferenceGrant, RefusedPod,
    RetainedPort, Row, Service, Snapshot,
};
use crate::model::split::{Link, http_route_links, l4_route_links, slice_links};
use crate::model::table::Table;
use crate::model::target::ServiceKey;
use crate::model::{Diagnostic, Model, NodeContext, PodFacts, compile};

/// The kinds of registry objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A registry row.
    Row,
    /// A pod refused before it became a row.
    RefusedPod,
    /// A pod.
    Pod,
    /// A Service.
    Service,
    /// An EndpointSlice.
    EndpointSlice,
    /// A namespace.
    Namespace,
    /// An HTTPRoute or GRPCRoute.
    HttpRoute,
    /// A TLSRoute.
    TlsRoute,
    /// A TCPRoute.
    TcpRoute,
    /// A UDPRoute.
    UdpRoute,
    /// A ReferenceGrant.
    ReferenceGrant,
    /// A MeshFilter.
    MeshFilter,
    /// A retained port (spec/model.md §10).
    Retained,
}

/// One registry object, as the snapshot holds it. Rows and pods are shared with the snapshot;
/// the other kinds are boxed, so that an object held costs a pointer beside its key whatever
/// its kind (a MeshFilter inline made every held object 240 bytes).
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    /// A registry row.
    Row(Arc<Row>),
    /// A pod refused before it became a row.
    RefusedPod(Box<RefusedPod>),
    /// A pod.
    Pod(Arc<Pod>),
    /// A Service.
    Service(Box<Service>),
    /// An EndpointSlice.
    EndpointSlice(Box<EndpointSlice>),
    /// A namespace.
    Namespace(Box<str>),
    /// An HTTPRoute or GRPCRoute.
    HttpRoute(Box<HttpRoute>),
    /// A TLSRoute.
    TlsRoute(Box<L4Route>),
    /// A TCPRoute.
    TcpRoute(Box<L4Route>),
    /// A UDPRoute.
    UdpRoute(Box<L4Route>),
    /// A ReferenceGrant.
    ReferenceGrant(Box<ReferenceGrant>),
    /// A MeshFilter.
    MeshFilter(Box<MeshFilter>),
    /// A retained port.
    Retained(Box<RetainedPort>),
}

impl Kind {
    /// Its bit in [`Applied::kinds`].
    pub fn bit(self) -> u16 {
        1 << self as u16
    }
}

impl Object {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Self::Row(_) => Kind::Row,
            Self::RefusedPod(_) => Kind::RefusedPod,
            Self::Pod(_) => Kind::Pod,
            Self::Service(_) => Kind::Service,
            Self::EndpointSlice(_) => Kind::EndpointSlice,
            Self::Namespace(_) => Kind::Namespace,
            Self::HttpRoute(_) => Kind::HttpRoute,
            Self::TlsRoute(_) => Kind::TlsRoute,
            Self::TcpRoute(_) => Kind::TcpRoute,
            Self::UdpRoute(_) => Kind::UdpRoute,
            Self::ReferenceGrant(_) => Kind::ReferenceGrant,
            Self::MeshFilter(_) => Kind::MeshFilter,
            Self::Retained(_) => Kind::Retained,
        }
    }

    /// Puts it in its list of `s`.
    fn push_into(&self, s: &mut Snapshot) {
        match self {
            Self::Row(x) => s.rows.push(x.clone()),
            Self::RefusedPod(x) => s.refused_pods.push((**x).clone()),
            Self::Pod(x) => s.pods.push(x.clone()),
            Self::Service(x) => s.services.push((**x).clone()),
            Self::EndpointSlice(x) => s.endpoint_slices.push((**x).clone()),
            Self::Namespace(x) => s.namespaces.push(x.to_string()),
            Self::HttpRoute(x) => s.http_routes.push((**x).clone()),
            Self::TlsRoute(x) => s.tls_routes.push((**x).clone()),
            Self::TcpRoute(x) => s.tcp_routes.push((**x).clone()),
            Self::UdpRoute(x) => s.udp_routes.push((**x).clone()),
            Self::ReferenceGrant(x) => s.reference_grants.push((**x).clone()),
            Self::MeshFilter(x) => s.mesh_filters.push((**x).clone()),
            Self::Retained(x) => s.retained.push((**x).clone()),
        }
    }

    /// The namespace of a MeshFilter whose targets could not be read: it targets every Service
    /// and mesh service of its namespace.
    fn whole_namespace(&self) -> Option<&str> {
        match self {
            Self::MeshFilter(f) if matches!(&f.config, FilterConfig::Unreadable(u) if u.whole_namespace) => {
                Some(&f.namespace)
            }
            _ => None,
        }
    }

    /// The namespace of a Service or a row: what a whole-namespace filter joins.
    fn service_namespace(&self) -> Option<&str> {
        match self {
            Self::Service(v) => Some(&v.namespace),
            Self::Row(r) => Some(&r.namespace),
            _ => None,
        }
    }

    /// What the compiler joins this object on (as `split::partition`); a Service or row in a
    /// namespace with a whole-namespace filter also joins that filter (`whole`).
    fn links(&self, whole: impl Fn(&str) -> bool) -> Vec<Link<'_>> {
        let hub = |ns| Link::Other("", "WholeNamespace", ns, "");
        match self {
            Self::Row(r) => {
                let mut l = vec![
                    Link::Service(&r.namespace, &r.service),
                    Link::Address(r.address),
                ];
                if whole(&r.namespace) {
                    l.push(hub(&r.namespace));
                }
                l
            }
            Self::RefusedPod(p) => vec![Link::Pod(&p.namespace, &p.name)],
            Self::Pod(p) => std::iter::once(Link::Pod(&p.namespace, &p.name))
                .chain(p.ips.iter().map(|&ip| Link::Address(ip)))
                .collect(),
            Self::Service(v) => {
                let mut l: Vec<Link<'_>> = std::iter::once(Link::Service(&v.namespace, &v.name))
                    .chain(v.cluster_ips.iter().map(|&ip| Link::Address(ip)))
                    .collect();
                if whole(&v.namespace) {
                    l.push(hub(&v.namespace));
                }
                l
            }
            Self::EndpointSlice(e) => slice_links(e).collect(),
            Self::HttpRoute(r) => http_route_links(r),
            Self::TlsRoute(r) => l4_route_links(1, r),
            Self::TcpRoute(r) => l4_route_links(2, r),
            Self::UdpRoute(r) => l4_route_links(3, r),
            Self::MeshFilter(f) => {
                let mut l: Vec<Link<'_>> = std::iter::once(Link::Filter(&f.namespace, &f.name))
                    .chain(f.target_refs.iter().map(|t| Link::Service(&f.namespace, t)))
                    .collect();
                if self.whole_namespace().is_some() {
                    l.push(hub(&f.namespace));
                }
                l
            }
            Self::Retained(r) => vec![Link::Service(&r.namespace, &r.service)],
            // Not read by the compiler: in no component.
            Self::Namespace(_) | Self::ReferenceGrant(_) => Vec::new(),
        }
    }
}

/// An object's identity: its kind and the key its source gives it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// The kind.
    pub kind: Kind,
    /// The source's key, unique within the kind (`namespace/name` for most).
    pub name: Arc<str>,
}

/// One change: an object put (added or replaced) under its key, or the key's object deleted.
#[derive(Clone, Debug)]
pub struct Change {
    /// Whose.
    pub key: ObjectKey,
    /// The new object; `None` deletes.
    pub object: Option<Object>,
}

impl Change {
    /// `object` put under `name`.
    pub fn put(name: impl Into<Arc<str>>, object: Object) -> Self {
        Self {
            key: ObjectKey {
                kind: object.kind(),
                name: name.into(),
            },
            object: Some(object),
        }
    }

    /// The object of `kind` under `name` deleted.
    pub fn delete(kind: Kind, name: impl Into<Arc<str>>) -> Self {
        Self {
            key: ObjectKey {
                kind,
                name: name.into(),
            },
            object: None,
        }
    }
}

/// One object of a snapshot, borrowed: compared with a held object, and copied only when it
/// differs.
#[derive(Clone, Copy)]
enum Borrowed<'s> {
    Row(&'s Arc<Row>),
    RefusedPod(&'s RefusedPod),
    Pod(&'s Arc<Pod>),
    Service(&'s Service),
    EndpointSlice(&'s EndpointSlice),
    Namespace(&'s String),
    HttpRoute(&'s HttpRoute),
    TlsRoute(&'s L4Route),
    TcpRoute(&'s L4Route),
    UdpRoute(&'s L4Route),
    ReferenceGrant(&'s ReferenceGrant),
    MeshFilter(&'s MeshFilter),
    Retained(&'s RetainedPort),
}

/// Calls `$each!(Variant, x)` for the borrowed object `$b`.
macro_rules! borrowed {
    ($b:expr, $each:ident) => {
        match $b {
            Borrowed::Row(x) => $each!(Row, x),
            Borrowed::RefusedPod(x) => $each!(RefusedPod, x),
            Borrowed::Pod(x) => $each!(Pod, x),
            Borrowed::Service(x) => $each!(Service, x),
            Borrowed::EndpointSlice(x) => $each!(EndpointSlice, x),
            Borrowed::Namespace(x) => $each!(Namespace, x),
            Borrowed::HttpRoute(x) => $each!(HttpRoute, x),
            Borrowed::TlsRoute(x) => $each!(TlsRoute, x),
            Borrowed::TcpRoute(x) => $each!(TcpRoute, x),
            Borrowed::UdpRoute(x) => $each!(UdpRoute, x),
            Borrowed::ReferenceGrant(x) => $each!(ReferenceGrant, x),
            Borrowed::MeshFilter(x) => $each!(MeshFilter, x),
            Borrowed::Retained(x) => $each!(Retained, x),
        }
    };
}

impl Borrowed<'_> {
    fn owned(self) -> Object {
        // A shared row or pod is shared again; any other object is copied into its box.
        macro_rules! own {
            ($v:ident, $x:expr) => {
                Object::$v((*$x).clone().into())
            };
        }
        borrowed!(self, own)
    }

    /// Whether `held` is this object (a shared row or pod by its pointer first).
    fn is(self, held: &Object) -> bool {
        match (self, held) {
            (Self::Row(x), Object::Row(y)) => x == y,
            (Self::Pod(x), Object::Pod(y)) => x == y,
            (Self::RefusedPod(x), Object::RefusedPod(y)) => *x == **y,
            (Self::Service(x), Object::Service(y)) => *x == **y,
            (Self::EndpointSlice(x), Object::EndpointSlice(y)) => *x == **y,
            (Self::Namespace(x), Object::Namespace(y)) => x.as_str() == &**y,
            (Self::HttpRoute(x), Object::HttpRoute(y)) => *x == **y,
            (Self::TlsRoute(x), Object::TlsRoute(y))
            | (Self::TcpRoute(x), Object::TcpRoute(y))
            | (Self::UdpRoute(x), Object::UdpRoute(y)) => *x == **y,
            (Self::ReferenceGrant(x), Object::ReferenceGrant(y)) => *x == **y,
            (Self::MeshFilter(x), Object::MeshFilter(y)) => *x == **y,
            (Self::Retained(x), Object::Retained(y)) => *x == **y,
            _ => false,
        }
    }
}

/// Every object of `s` under a key of its own: `namespace/name` (a row: `namespace/service@
/// address`; a retained port: `namespace/service:port`), with `#2`, `#3`, ... after a key
/// that repeats (a source can hold two objects of one name; the compiler reads both).
/// `seen` gathers the keys given (the caller's, so that it can tell what `s` no longer has).
fn each_keyed<'s>(
    s: &'s Snapshot,
    seen: &mut HashSet<ObjectKey>,
    mut each: impl FnMut(&ObjectKey, Borrowed<'s>),
) {
    let mut put = |kind: Kind, name: String, object: Borrowed<'s>| {
        let mut key = ObjectKey {
            kind,
            name: name.as_str().into(),
        };
        // The n-th object of one key is `key#n`.
        let mut n = 1;
        while seen.contains(&key) {
            n += 1;
            key.name = format!("{name}#{n}").into();
        }
        each(&key, object);
        seen.insert(key);
    };
    for r in &s.rows {
        let name = format!("{}/{}@{}", r.namespace, r.service, r.address);
        put(Kind::Row, name, Borrowed::Row(r));
    }
    for p in &s.refused_pods {
        let name = format!("{}/{}", p.namespace, p.name);
        put(Kind::RefusedPod, name, Borrowed::RefusedPod(p));
    }
    for p in &s.pods {
        put(
            Kind::Pod,
            format!("{}/{}", p.namespace, p.name),
            Borrowed::Pod(p),
        );
    }
    for v in &s.services {
        let name = format!("{}/{}", v.namespace, v.name);
        put(Kind::Service, name, Borrowed::Service(v));
    }
    for e in &s.endpoint_slices {
        let name = format!("{}/{}", e.namespace, e.name);
        put(Kind::EndpointSlice, name, Borrowed::EndpointSlice(e));
    }
    for n in &s.namespaces {
        put(Kind::Namespace, n.clone(), Borrowed::Namespace(n));
    }
    for r in &s.http_routes {
        let name = format!("{}/{}", r.namespace, r.name);
        put(Kind::HttpRoute, name, Borrowed::HttpRoute(r));
    }
    for r in &s.tls_routes {
        let name = format!("{}/{}", r.namespace, r.name);
        put(Kind::TlsRoute, name, Borrowed::TlsRoute(r));
    }
    for r in &s.tcp_routes {
        let name = format!("{}/{}", r.namespace, r.name);
        put(Kind::TcpRoute, name, Borrowed::TcpRoute(r));
    }
    for r in &s.udp_routes {
        let name = format!("{}/{}", r.namespace, r.name);
        put(Kind::UdpRoute, name, Borrowed::UdpRoute(r));
    }
    for g in &s.reference_grants {
        let name = format!("{}/{}", g.namespace, g.name);
        put(Kind::ReferenceGrant, name, Borrowed::ReferenceGrant(g));
    }
    for f in &s.mesh_filters {
        let name = format!("{}/{}", f.namespace, f.name);
        put(Kind::MeshFilter, name, Borrowed::MeshFilter(f));
    }
    for r in &s.retained {
        let name = format!("{}/{}:{}", r.namespace, r.service, r.port);
        put(Kind::Retained, name, Borrowed::Retained(r));
    }
}

/// Every object of `s` put under its key (`each_keyed`): what [`Live::resync`] takes.
pub fn keyed(s: &Snapshot) -> Vec<Change> {
    let mut out = Vec::new();
    each_keyed(s, &mut HashSet::new(), |key, b| {
        out.push(Change {
            key: key.clone(),
            object: Some(b.owned()),
        });
    });
    out
}

/// A component's id; [`NONE`] is "not placed yet".
type PartId = u64;
const NONE: PartId = 0;

/// An object's number: its place in [`Live::slots`], given when its key comes and free again
/// when it goes. What the kept model's own bookkeeping holds an object by, so that a key's
/// string is hashed once per change rather than at every step of placing it.
type Slot = usize;

/// Hashes the numbers this file makes itself: link hashes (SipHash outputs under a key drawn
/// at random, [`Live::hasher`]), slots and component ids (counters). Registry input chooses none
/// of them, so one multiply spreads them where std's keyed hasher would hash each again
/// (written here: the pure layer's allow-list has no hasher crate, and this is one line).
#[derive(Default)]
struct Numbers(u64);

impl Hasher for Numbers {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: the high bits (hashbrown's tag) and the low bits (its bucket)
        // both move with every bit of `n`'s low half, and counters stay distinct mod 2^k.
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Maps and sets keyed by numbers of this file.
type ByNumber = BuildHasherDefault<Numbers>;

/// An object and the component it is in (its key is in [`Live::index`]).
struct Held {
    object: Object,
    part: PartId,
}

/// What a component put in the model, to take out again when it is dissolved.
#[derive(Default)]
struct Gave {
    names: Vec<(Box<str>, Box<str>)>,
    cluster_ips: Vec<IpAddr>,
    pod_ips: Vec<IpAddr>,
    pods: Vec<Arc<PodFacts>>,
    l4: Vec<SocketAddr>,
    service_filters: Vec<ServiceKey>,
    classes: Vec<ServiceKey>,
    statuses: Vec<RouteStatus>,
    diagnostics: Vec<Diagnostic>,
    /// The service ports and the sources it gives the model (`Model::service_ports`,
    /// `Model::sources`): what the data plane's metric series are kept by.
    series: Vec<SeriesKey>,
}

/// One key of the data plane's metric series: a service port, or a source.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum SeriesKey {
    Port(ServiceKey, u16),
    Source(Arc<str>, Arc<str>),
}

/// The series keys of `e`, as `Model::service_ports` and `Model::sources` read them.
fn series_of(e: &Entries) -> Vec<SeriesKey> {
    let mut out = Vec::new();
    for (_, names) in &e.names {
        for entry in names.values() {
            out.extend(
                entry
                    .ports
                    .keys()
                    .map(|&p| SeriesKey::Port(entry.key.clone(), p)),
            );
        }
    }
    for (key, ports) in &e.classes {
        out.extend(ports.keys().map(|&p| SeriesKey::Port(key.clone(), p)));
        out.push(SeriesKey::Source(key.namespace.clone(), key.name.clone()));
    }
    // A source once per component, however many of its pods run as it.
    let mut sources: Vec<(&str, &str)> = e
        .pods
        .iter()
        .map(|p| (p.namespace.as_str(), p.service_account.as_str()))
        .collect();
    sources.sort_unstable();
    sources.dedup();
    out.extend(
        sources
            .into_iter()
            .map(|(ns, sa)| SeriesKey::Source(ns.into(), sa.into())),
    );
    out.sort_unstable();
    out.dedup();
    out.shrink_to_fit();
    out
}

impl Gave {
    /// What `e` puts in a model.
    fn of(e: &Entries) -> Self {
        Self {
            series: series_of(e),
            names: e
                .names
                .iter()
                .flat_map(|(ns, names)| names.keys().map(|n| (ns.clone(), n.clone())))
                .collect(),
            cluster_ips: e.cluster_ips.keys().copied().collect(),
            pod_ips: e.pod_ips.keys().copied().collect(),
            pods: e.pods.clone(),
            l4: e.l4.keys().copied().collect(),
            service_filters: e.service_filters.keys().cloned().collect(),
            classes: e.classes.keys().cloned().collect(),
            statuses: e.statuses.clone(),
            diagnostics: e.diagnostics.clone(),
        }
    }
}

/// One component: its objects, the links it holds, and what its model gave.
struct Part {
    members: Vec<Slot>,
    links: Vec<u64>,
    gave: Gave,
    /// It holds a retained port, which expires by the clock: compiled again when it moves.
    clocked: bool,
}

/// What one [`Live::apply`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Changes read.
    pub changes: usize,
    /// Components dissolved (their entries taken out of the model).
    pub dissolved: usize,
    /// Components compiled (their entries put in).
    pub compiled: usize,
    /// Objects in the components compiled.
    pub objects: usize,
    /// Everything was compiled again (a resync, a new setting).
    pub full: bool,
    /// The kinds whose objects changed, a bit each (`1 << kind`): what follows the model
    /// (the DNS table, the writers' inputs) is made again only when what it reads changed.
    pub kinds: u16,
    /// A service port or a source came or went (`Model::service_ports`, `Model::sources`):
    /// the data plane's metric series, kept by them, are to be made again.
    pub series_changed: bool,
}

impl Applied {
    /// Both, as one.
    pub fn and(self, other: Self) -> Self {
        Self {
            changes: self.changes + other.changes,
            dissolved: self.dissolved + other.dissolved,
            compiled: self.compiled + other.compiled,
            objects: self.objects + other.objects,
            full: self.full || other.full,
            kinds: self.kinds | other.kinds,
            series_changed: self.series_changed || other.series_changed,
        }
    }

    /// Whether objects of `kind` may have changed (everything may after a full compile).
    pub fn touched(&self, kind: Kind) -> bool {
        self.full || self.kinds & kind.bit() != 0
    }

    /// `full` or `incremental`, as the node's metrics label it.
    pub fn kind(&self) -> &'static str {
        if self.full { "full" } else { "incremental" }
    }
}

/// The registry's objects by key, their components, and the model of them all.
pub struct Live {
    ctx: NodeContext,
    /// The slot of every object the compiler reads, by key.
    index: HashMap<ObjectKey, Slot>,
    /// The objects the compiler reads, by slot; `None` is a free slot (listed in `free`).
    slots: Vec<Option<Held>>,
    free: Vec<Slot>,
    /// Namespaces and ReferenceGrants: kept for the snapshot, in no component.
    unplaced: HashMap<ObjectKey, Object>,
    parts: HashMap<PartId, Part, ByNumber>,
    /// The component each link is in, by the link's hash (a collision joins two components:
    /// larger, still right).
    links: HashMap<u64, PartId, ByNumber>,
    /// The key of the links' hashes.
    hasher: RandomState,
    /// How many whole-namespace filters each namespace has.
    whole: HashMap<Box<str>, u32>,
    /// The Services and rows of each namespace: what a whole-namespace filter joins.
    in_namespace: HashMap<Box<str>, HashSet<Slot, ByNumber>>,
    /// How many components gave each diagnostic: the model lists it once.
    diagnostics: HashMap<Diagnostic, u32>,
    /// How many objects of each kind it holds (by `Kind as usize`).
    counts: [usize; KINDS],
    /// How many components gave each series key.
    series: HashMap<SeriesKey, u32>,
    /// The series keys that came or went during the change under way, with whether each was
    /// held before it.
    flips: HashMap<SeriesKey, bool>,
    model: Model,
    next: PartId,
    /// One more at every change taken: the objects held are those of a version.
    version: u64,
}

/// How many kinds there are.
const KINDS: usize = Kind::Retained as usize + 1;

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("objects", &self.index.len())
            .field("parts", &self.parts.len())
            .finish_non_exhaustive()
    }
}

impl Live {
    /// Nothing yet, compiled with `ctx`.
    pub fn new(ctx: NodeContext) -> Self {
        Self {
            model: compile(&Snapshot::default(), &ctx),
            ctx,
            index: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            unplaced: HashMap::new(),
            parts: HashMap::default(),
            links: HashMap::default(),
            hasher: RandomState::new(),
            whole: HashMap::new(),
            in_namespace: HashMap::new(),
            diagnostics: HashMap::new(),
            counts: [0; KINDS],
            series: HashMap::new(),
            flips: HashMap::new(),
            next: NONE,
            version: 0,
        }
    }

    /// The version of the objects held: one more at every [`Self::apply`] (a resync and a new
    /// setting included). A snapshot made at one version is what the model of that version was
    /// compiled from.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// How many objects of `kind` it holds.
    pub fn count(&self, kind: Kind) -> usize {
        self.counts[kind as usize]
    }

    /// The model of every object: a clone shares its tables (one pointer each).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// How many objects it holds (namespaces and ReferenceGrants included).
    pub fn len(&self) -> usize {
        self.index.len() + self.unplaced.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The object under `key`.
    pub fn get(&self, key: &ObjectKey) -> Option<&Object> {
        match self.index.get(key) {
            Some(&slot) => self.held(slot).map(|h| &h.object),
            None => self.unplaced.get(key),
        }
    }

    /// The object in `slot`, if one is.
    fn held(&self, slot: Slot) -> Option<&Held> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    fn held_mut(&mut self, slot: Slot) -> Option<&mut Held> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    /// Every object held, with its key: the compiler's then the unplaced.
    fn every(&self) -> impl Iterator<Item = (&ObjectKey, &Object)> {
        let placed = (self.index.iter()).filter_map(|(k, &s)| Some((k, &self.held(s)?.object)));
        placed.chain(self.unplaced.iter())
    }

    /// Every object as one snapshot, by kind then key (for `aether debug` and the reference
    /// compile; O(objects)).
    pub fn snapshot(&self) -> Snapshot {
        let mut all: Vec<(&ObjectKey, &Object)> = self.every().collect();
        all.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut s = Snapshot::default();
        for (_, o) in all {
            o.push_into(&mut s);
        }
        s
    }

    /// The objects of `kinds` as one snapshot, in no order: for what reads a few kinds of the
    /// registry (the DNS table, the writers' inputs), at a walk of the keys and a copy of those
    /// objects alone (rows and pods are shared).
    pub fn snapshot_of(&self, kinds: &[Kind]) -> Snapshot {
        let mut s = Snapshot::default();
        for (key, object) in self.every() {
            if kinds.contains(&key.kind) {
                object.push_into(&mut s);
            }
        }
        s
    }

    /// Everything replaced by `objects` (a relist, a reconnect, a directory read again).
    pub fn resync(&mut self, objects: impl IntoIterator<Item = Change>) -> Applied {
        let version = self.version;
        *self = Self::new(self.ctx.clone());
        self.version = version;
        Applied {
            full: true,
            ..self.apply(objects)
        }
    }

    /// The changes that make the objects held those of `s` (keyed as [`keyed`] keys them): an
    /// object put for each that differs or is new, a deletion for each `s` no longer has.
    /// O(objects of `s`), for a source that gives whole snapshots; a copy is made only of what
    /// changed.
    pub fn changes_to(&self, s: &Snapshot) -> Vec<Change> {
        let mut seen = HashSet::with_capacity(self.len());
        let mut out = Vec::new();
        // Keys of `s` that are held: when every held key is among them, nothing was deleted
        // and the held keys need not be walked.
        let mut held = 0;
        each_keyed(s, &mut seen, |key, b| {
            let same = match self.get(key) {
                Some(h) => {
                    held += 1;
                    b.is(h)
                }
                None => false,
            };
            if !same {
                out.push(Change {
                    key: key.clone(),
                    object: Some(b.owned()),
                });
            }
        });
        self.deletions(&seen, held, &mut out);
        out
    }

    /// The changes that make the objects held exactly `all` (one object a key): a put for each
    /// that is new or differs from the one held, a deletion for each key held that `all` lacks.
    /// For a source's resync (a relist): O(objects), and what did not change is not compiled
    /// again. A deletion in `all` is read as "not there".
    pub fn changes_against(&self, all: Vec<Change>) -> Vec<Change> {
        let mut seen = HashSet::with_capacity(all.len());
        let mut out = Vec::new();
        let mut held = 0;
        for c in all {
            let Some(object) = &c.object else { continue };
            if !seen.insert(c.key.clone()) {
                // A key twice: the later wins, as in `apply`.
                out.push(c);
                continue;
            }
            let same = match self.get(&c.key) {
                Some(h) => {
                    held += 1;
                    h == object
                }
                None => false,
            };
            if !same {
                out.push(c);
            }
        }
        self.deletions(&seen, held, &mut out);
        out
    }

    /// A deletion into `out` for each key held that is not in `seen`, of which `held` are held
    /// (when every held key is among them, none is walked).
    fn deletions(&self, seen: &HashSet<ObjectKey>, held: usize, out: &mut Vec<Change>) {
        if held >= self.len() {
            return;
        }
        for key in self.index.keys().chain(self.unplaced.keys()) {
            if !seen.contains(key) {
                out.push(Change {
                    key: key.clone(),
                    object: None,
                });
            }
        }
    }

    /// The objects held made those of `s`, compiled with `ctx`: the settings first (the clock
    /// alone recompiles the components with retained ports), then what differs.
    pub fn update_to(&mut self, s: &Snapshot, ctx: &NodeContext) -> Applied {
        let first = self.is_empty();
        let settings = self.set_context(ctx.clone());
        let changes = self.changes_to(s);
        let applied = settings.and(self.apply(changes));
        Applied {
            full: applied.full || first,
            ..applied
        }
    }

    /// New settings. When only the clock moved, the components holding retained ports are
    /// compiled again (they expire by it); any other setting compiles everything.
    pub fn set_context(&mut self, ctx: NodeContext) -> Applied {
        let clockless = |c: &NodeContext| NodeContext {
            now_ms: 0,
            ..c.clone()
        };
        if clockless(&ctx) != clockless(&self.ctx) {
            let mut slots = std::mem::take(&mut self.slots);
            let objects: Vec<Change> = std::mem::take(&mut self.index)
                .into_iter()
                .filter_map(|(key, s)| {
                    let h = slots.get_mut(s)?.take()?;
                    Some(Change {
                        key,
                        object: Some(h.object),
                    })
                })
                .chain(self.unplaced.drain().map(|(key, o)| Change {
                    key,
                    object: Some(o),
                }))
                .collect();
            self.ctx = ctx;
            return self.resync(objects);
        }
        if ctx.now_ms == self.ctx.now_ms {
            return Applied::default();
        }
        self.ctx = ctx;
        self.model.context = self.ctx.clone();
        let clocked: Vec<PartId> = self
            .parts
            .iter()
            .filter(|(_, p)| p.clocked)
            .map(|(&id, _)| id)
            .collect();
        let mut applied = Applied::default();
        let mut queue = Vec::new();
        for id in clocked {
            self.dissolve(id, &mut queue, &mut applied);
        }
        self.place(queue, &mut applied);
        applied
    }

    /// Applies `changes` in order (a later change of one key wins) and compiles the components
    /// they touch.
    pub fn apply(&mut self, changes: impl IntoIterator<Item = Change>) -> Applied {
        self.version += 1;
        let changes = changes.into_iter();
        // A first fill knows its size: the maps are cut once for it rather than grown.
        if self.index.is_empty() {
            let n = changes.size_hint().0;
            self.index.reserve(n);
            self.slots.reserve(n);
        }
        let mut applied = Applied::default();
        let mut queue: Vec<Slot> = Vec::new();
        // Namespaces whose whole-namespace filters came or went: their Services and rows link
        // differently.
        let mut relink: BTreeSet<Box<str>> = BTreeSet::new();
        for Change { key, object } in changes {
            applied.changes += 1;
            if matches!(key.kind, Kind::Namespace | Kind::ReferenceGrant) {
                applied.kinds |= key.kind.bit();
                let count = &mut self.counts[key.kind as usize];
                let had = match object {
                    Some(o) => {
                        *count += 1;
                        self.unplaced.insert(key, o)
                    }
                    None => self.unplaced.remove(&key),
                };
                if had.is_some() {
                    *count -= 1;
                }
                continue;
            }
            let slot = self.index.get(&key).copied();
            // The same object again (an event that changed nothing the compiler reads): its
            // component stands.
            if let (Some(new), Some(held)) = (&object, slot.and_then(|s| self.held(s)))
                && *new == held.object
            {
                continue;
            }
            applied.kinds |= key.kind.bit();
            // Out with the old object: the slot is kept for a replacement, freed on a deletion.
            if let Some(slot) = slot {
                if object.is_none() {
                    self.index.remove(&key);
                    self.free.push(slot);
                }
                if let Some(old) = self.slots.get_mut(slot).and_then(Option::take) {
                    self.forget(slot, &old.object, &mut relink);
                    if old.part != NONE {
                        self.dissolve(old.part, &mut queue, &mut applied);
                    }
                }
            }
            if let Some(object) = object {
                self.counts[key.kind as usize] += 1;
                if let Some(ns) = object.whole_namespace() {
                    let n = self.whole.entry(ns.into()).or_insert(0);
                    *n += 1;
                    if *n == 1 {
                        relink.insert(ns.into());
                    }
                }
                let slot_was = slot;
                let slot = match slot {
                    Some(slot) => slot,
                    None => self.free.pop().unwrap_or_else(|| {
                        self.slots.push(None);
                        self.slots.len() - 1
                    }),
                };
                if let Some(ns) = object.service_namespace() {
                    self.in_namespace.entry(ns.into()).or_default().insert(slot);
                }
                if let Some(h) = self.slots.get_mut(slot) {
                    if slot_was.is_none() {
                        self.index.insert(key, slot);
                    }
                    *h = Some(Held { object, part: NONE });
                    queue.push(slot);
                }
            }
        }
        for ns in relink {
            let parts: Vec<PartId> = self
                .in_namespace
                .get(&ns)
                .into_iter()
                .flatten()
                .filter_map(|&s| self.held(s).map(|h| h.part))
                .collect();
            for p in parts {
                self.dissolve(p, &mut queue, &mut applied);
            }
        }
        self.place(queue, &mut applied);
        applied
    }

    /// What `old`, the object that was in `slot`, counted for: its kind's count, its
    /// whole-namespace filter, its place among its namespace's Services and rows.
    fn forget(&mut self, slot: Slot, old: &Object, relink: &mut BTreeSet<Box<str>>) {
        self.counts[old.kind() as usize] -= 1;
        if let Some(ns) = old.whole_namespace()
            && let Some(n) = self.whole.get_mut(ns)
        {
            *n -= 1;
            if *n == 0 {
                self.whole.remove(ns);
                relink.insert(ns.into());
            }
        }
        if let Some(ns) = old.service_namespace()
            && let Some(slots) = self.in_namespace.get_mut(ns)
        {
            slots.remove(&slot);
            if slots.is_empty() {
                self.in_namespace.remove(ns);
            }
        }
    }

    /// Takes component `id` out: its links, its entries in the model; its objects go to
    /// `queue`, to be placed again.
    fn dissolve(&mut self, id: PartId, queue: &mut Vec<Slot>, applied: &mut Applied) {
        let Some(part) = self.parts.remove(&id) else {
            return;
        };
        applied.dissolved += 1;
        for h in &part.links {
            self.links.remove(h);
        }
        self.take_out(part.gave);
        for m in part.members {
            if let Some(held) = self.held_mut(m)
                && held.part == id
            {
                held.part = NONE;
                queue.push(m);
            }
        }
    }

    fn link_hashes(&self, o: &Object) -> Vec<u64> {
        o.links(|ns| self.whole.contains_key(ns))
            .iter()
            .map(|l| self.hasher.hash_one(l))
            .collect()
    }

    /// Places the objects of `queue` (and of every component one of them links to) in new
    /// components, compiles each, and puts their entries in the model.
    fn place(&mut self, mut queue: Vec<Slot>, applied: &mut Applied) {
        // Every object to place, with its links: until no link reaches a component left.
        let mut seen: HashSet<Slot, ByNumber> = HashSet::default();
        seen.reserve(queue.len());
        let mut objects: Vec<(Slot, Vec<u64>)> = Vec::with_capacity(queue.len());
        let mut links = 0;
        while let Some(slot) = queue.pop() {
            let Some(held) = self.held(slot) else {
                continue;
            };
            if !seen.insert(slot) {
                continue;
            }
            let hashes = self.link_hashes(&held.object);
            for h in &hashes {
                if let Some(&p) = self.links.get(h) {
                    self.dissolve(p, &mut queue, applied);
                }
            }
            links += hashes.len();
            objects.push((slot, hashes));
        }
        drop(seen);
        if objects.is_empty() {
            applied.series_changed |= self.series_flipped();
            return;
        }
        // Union-find over their links.
        let mut ids: HashMap<u64, usize, ByNumber> = HashMap::default();
        ids.reserve(links);
        let mut parent: Vec<usize> = Vec::with_capacity(links);
        fn root(parent: &mut [usize], mut x: usize) -> usize {
            while parent[x] != x {
                parent[x] = parent[parent[x]];
                x = parent[x];
            }
            x
        }
        let mut first_of: Vec<usize> = Vec::with_capacity(objects.len());
        for (_, hashes) in &objects {
            let mut first = None;
            for h in hashes {
                let next = parent.len();
                let id = *ids.entry(*h).or_insert(next);
                if id == next {
                    parent.push(id);
                }
                match first {
                    None => first = Some(id),
                    Some(f) => {
                        let (a, b) = (root(&mut parent, f), root(&mut parent, id));
                        if a != b {
                            parent[b] = a;
                        }
                    }
                }
            }
            // Every object but a namespace has a link of its own; one without any stands
            // alone.
            first_of.push(first.unwrap_or_else(|| {
                parent.push(parent.len());
                parent.len() - 1
            }));
        }
        let distinct = ids.len();
        drop(ids);
        let mut groups: HashMap<usize, Vec<usize>, ByNumber> = HashMap::default();
        for (i, &f) in first_of.iter().enumerate() {
            groups.entry(root(&mut parent, f)).or_default().push(i);
        }
        // With no component left (the first fill, a resync, a new setting), the model is made
        // whole from every component's entries at once: its tables cut once for their size, the
        // sorted lists sorted once, instead of an insert per entry.
        let bulk = self.parts.is_empty();
        if bulk {
            self.parts.reserve(groups.len());
            self.links.reserve(distinct);
        }
        let mut all: Vec<Entries> = Vec::new();
        for members in groups.into_values() {
            self.next += 1;
            let id = self.next;
            let mut s = Snapshot::default();
            let mut links = Vec::new();
            let mut slots = Vec::with_capacity(members.len());
            let mut clocked = false;
            for i in members {
                let (slot, hashes) = &objects[i];
                if let Some(held) = self.held_mut(*slot) {
                    held.part = id;
                    held.object.push_into(&mut s);
                    clocked |= held.object.kind() == Kind::Retained;
                }
                links.extend_from_slice(hashes);
                slots.push(*slot);
            }
            links.sort_unstable();
            links.dedup();
            for &h in &links {
                self.links.insert(h, id);
            }
            applied.compiled += 1;
            applied.objects += slots.len();
            let entries = compile_entries(&s, &self.ctx);
            let gave = if bulk {
                let gave = Gave::of(&entries);
                for d in &entries.diagnostics {
                    *self.diagnostics.entry(d.clone()).or_insert(0) += 1;
                }
                all.push(entries);
                gave
            } else {
                self.put_in(entries)
            };
            self.parts.insert(
                id,
                Part {
                    members: slots,
                    links,
                    gave,
                    clocked,
                },
            );
        }
        if bulk {
            self.model = Model::from_many(&self.ctx, all);
            self.count_all_series(applied);
        }
        applied.series_changed |= self.series_flipped();
    }

    /// Counts every component's series keys at once, after a bulk fill. When nothing was held
    /// before (a first fill), whether any came is the whole answer and no key is noted as it
    /// comes.
    fn count_all_series(&mut self, applied: &mut Applied) {
        if self.series.is_empty() && self.flips.is_empty() {
            for k in self.parts.values().flat_map(|p| &p.gave.series) {
                *self.series.entry(k.clone()).or_insert(0) += 1;
            }
            applied.series_changed |= !self.series.is_empty();
            return;
        }
        let keys: Vec<SeriesKey> = self
            .parts
            .values()
            .flat_map(|p| p.gave.series.iter().cloned())
            .collect();
        self.count_series(&keys, true);
    }

    /// Puts the entries of one component's compile in the model; what it put.
    fn put_in(&mut self, part: Entries) -> Gave {
        let mut gave = Gave {
            series: series_of(&part),
            ..Gave::default()
        };
        self.count_series(&gave.series, true);
        let m = &mut self.model;
        for (ns, names) in part.names {
            if !m.names.contains_key(&ns) {
                m.names.insert(ns.clone(), Table::default());
            }
            if let Some(into) = m.names.get_mut(&ns) {
                for (n, e) in names {
                    gave.names.push((ns.clone(), n.clone()));
                    into.insert(n, e);
                }
            }
        }
        for (k, v) in part.cluster_ips {
            m.cluster_ips.insert(k, v);
            gave.cluster_ips.push(k);
        }
        for (k, v) in part.pod_ips {
            m.pod_ips.insert(k, v);
            gave.pod_ips.push(k);
        }
        for p in part.pods {
            gave.pods.push(p.clone());
            m.pods.insert(p);
        }
        for (k, v) in part.l4 {
            m.l4.insert(k, v);
            gave.l4.push(k);
        }
        for (k, v) in part.service_filters {
            gave.service_filters.push(k.clone());
            m.service_filters.insert(k, v);
        }
        for (k, v) in part.classes {
            gave.classes.push(k.clone());
            m.classes.insert(k, Arc::new(v));
        }
        // A part's statuses and diagnostics may repeat (`compile` lists each once): the model
        // holds one, and what the part gave is taken out as often as it was put in.
        for s in part.statuses {
            gave.statuses.push(s.clone());
            m.statuses.insert(s);
        }
        for d in part.diagnostics {
            let n = self.diagnostics.entry(d.clone()).or_insert(0);
            *n += 1;
            if *n == 1 {
                m.diagnostics.insert(d.clone());
            }
            gave.diagnostics.push(d);
        }
        gave
    }

    /// Counts the series keys a component gave in (or out); notes each that came or went.
    fn count_series(&mut self, keys: &[SeriesKey], add: bool) {
        for k in keys {
            if add {
                let n = self.series.entry(k.clone()).or_insert(0);
                *n += 1;
                if *n == 1 {
                    self.flips.entry(k.clone()).or_insert(false);
                }
            } else if let Some(n) = self.series.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    self.series.remove(k);
                    self.flips.entry(k.clone()).or_insert(true);
                }
            }
        }
    }

    /// Whether a series key the change came upon is held now and was not before, or the
    /// reverse (a component dissolved and compiled again gives back what it took).
    fn series_flipped(&mut self) -> bool {
        let flips = std::mem::take(&mut self.flips);
        flips
            .into_iter()
            .any(|(k, was)| self.series.contains_key(&k) != was)
    }

    /// Takes what one component gave out of the model.
    fn take_out(&mut self, gave: Gave) {
        self.count_series(&gave.series, false);
        let m = &mut self.model;
        for (ns, n) in &gave.names {
            let emptied = m.names.get_mut(ns).is_some_and(|t| {
                t.remove(n);
                t.is_empty()
            });
            if emptied {
                m.names.remove(ns);
            }
        }
        for k in &gave.cluster_ips {
            m.cluster_ips.remove(k);
        }
        for k in &gave.pod_ips {
            m.pod_ips.remove(k);
        }
        for p in &gave.pods {
            m.pods.remove(p);
        }
        for k in &gave.l4 {
            m.l4.remove(k);
        }
        for k in &gave.service_filters {
            m.service_filters.remove(k);
        }
        for k in &gave.classes {
            m.classes.remove(k);
        }
        for s in &gave.statuses {
            m.statuses.remove(s);
        }
        for d in gave.diagnostics {
            if let Some(n) = self.diagnostics.get_mut(&d) {
                *n -= 1;
                if *n == 0 {
                    self.diagnostics.remove(&d);
                    m.diagnostics.remove(&d);
                }
            }
        }
    }
}
