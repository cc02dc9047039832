//! The Kubernetes source's watches (IO): one kube-rs reflector per kind, feeding stores. Each
//! watch records the keys it applied or deleted ([`KindState::pending`]); the node takes them
//! ([`KubeSource::take_changes`]) and converts those objects alone ([`KubeSource::changes_of`]),
//! or every object after a list ([`KubeSource::all_changes`]); [`KubeSource::objects`] copies
//! the stores out whole (the writers' inputs, and [`super::objects::snapshot`], the reference).
//!
//! Invariants:
//! - Fail closed at start: [`KubeSource::synced`] is false until every kind has had its first
//!   complete list; the daemon serves no pod before (issue #9 §1).
//! - One object that does not deserialize is kept out of the snapshot and counted
//!   (`DeserializeGuard`); it never stalls a watch.
//! - A watch that fails keeps its store as it was (the last model stays in force,
//!   spec/model.md §3.4) and is retried with backoff; a relist (after `410 Gone` or a broken
//!   watch) replaces the store whole when it completes, so no deleted object is left behind.
//! - A kind the API server does not serve (`404`: its CRD is not installed) counts as listed
//!   and empty, and is retried.
//! - A kind the daemon may not read (`403`) is reported ([`KindPhase`]) and retried, and never
//!   stalls the other kinds. Refused before its first complete list, it keeps the source
//!   unsynced (fail closed: a missing MeshFilter could drop an authorization). Refused after
//!   it, its store stays as it was, whole as of its last list plus the changes seen since, and
//!   the source stays synced: the node goes on serving and applying the other kinds (issue #35).
//!   The refusal ends as soon as the server answers a list or watch of the kind again (seen on
//!   the wire, `Answered`: the watcher says nothing when a watch opens), with no relist.
//! - This node's pods are watched twice: cluster-wide with every other pod, and by themselves
//!   (`spec.nodeName=<node>`). The node-local view is the authority for them, so a new pod of
//!   this node is captured as soon as its own small watch brings it, however far the
//!   cluster-wide watch lags or long it relists (docs/decisions.md).
//! - Every change records its key, then sends one tick on the `changed` channel (capacity 1:
//!   ticks coalesce); the daemon debounces and loads. The store holds the change before its key
//!   is recorded, and the key before the tick: a load that takes the keys and then reads the
//!   stores reads at least what they name; a change it missed brings its own tick. Every
//!   completed list (the first, a relist) marks a resync: what the new list dropped was never
//!   seen as a deletion.
//! - A store holds each object behind its own `Arc` ([`Stored`]): a reload shares the stored
//!   objects and never copies them (docs/kubernetes.md, "Scale"). Stored objects are never
//!   changed in place: an update replaces it. Pods are decoded as the mesh reads them
//!   ([`MeshPod`]), the rest of a pod never allocated.

use std::collections::HashSet;
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use futures_util::StreamExt;
use gateway_api::experimental::grpcroutes::GrpcRoute;
use gateway_api::experimental::httproutes::HttpRoute;
use gateway_api::experimental::referencegrants::ReferenceGrant;
use gateway_api::experimental::tcproutes::TcpRoute;
use gateway_api::experimental::tlsroutes::TlsRoute;
use gateway_api::experimental::udproutes::UdpRoute;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::watcher as watch_api;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::{Deserialize, DeserializeOwned, Deserializer};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::convert::keyed::{self, Any, Watched};
use super::mesh_filter::MeshFilterResource;
use super::objects::{Objects, Versioned, fingerprint_of, with_local_view};
use super::pod::{ApiPod, MeshPod};
use crate::model::live::Change;

pub mod kept;
use kept::{Keeper, Kept};
mod pace;
pub use pace::Backoff;
use pace::{Failure, Pacer};
pub mod versions;
use versions::{Served, Versions};

/// How one kind's watch stands.
#[derive(Debug, Default)]
pub struct KindState {
    /// The kind's name (`Pod`, `HTTPRoute`, …).
    pub kind: &'static str,
    /// Its first complete list has arrived (or the kind does not exist on this server): its
    /// store is whole as of a list. Never cleared: a later refusal or failed relist leaves the
    /// store as it was.
    pub synced: AtomicBool,
    /// The API server does not serve the kind (404): its CRD is not installed.
    pub absent: AtomicBool,
    /// The API server refused to let the daemon list or watch it (403), and has answered no
    /// list or watch of it since.
    pub forbidden: AtomicBool,
    /// When the refusal in course began, Unix time in milliseconds (0: none).
    pub forbidden_since_ms: AtomicU64,
    /// Refusals that ended: the server answered a list or watch of the kind again
    /// (`aether_registry_watch_recoveries_total`).
    pub recoveries: AtomicU64,
    /// Watch errors since start.
    pub errors: AtomicU64,
    /// Watches that ended at once with nothing delivered, each one a failure of the pace
    /// (`aether_registry_watch_short_total`).
    pub short_watches: AtomicU64,
    /// Streaming lists the server refused (422), after which the kind is read with paged
    /// lists.
    pub streaming_fallbacks: AtomicU64,
    /// Complete lists after the first (a `410 Gone`, a broken watch).
    pub relists: AtomicU64,
    /// Objects the watch applied or deleted, each counted once its key is pending (a load that
    /// reads this before it takes the keys takes at least these).
    pub events: AtomicU64,
    /// The last error, for `aether debug` (the root-only admin socket); `/ready`, served on the
    /// node's network, leaves it out.
    pub last_error: Mutex<Option<String>>,
    /// When the watch last brought a change or completed a list, Unix time in milliseconds
    /// (0: never); `aether_registry_watch_last_event_timestamp_seconds`.
    pub last_event_ms: AtomicU64,
    /// When its next list or watch may go ([`pace`]).
    pace: Pacer,
    /// The versions it can be read at, for a kind whose group serves several ([`versions`]).
    versions: Option<Versions>,
    /// The version discovery chose last, when not the compiled one.
    served_at: Mutex<Option<String>>,
    /// The server serves it only at versions this build cannot read: what `/ready` says
    /// (the kind is not synced while it lasts).
    pub version_problem: Mutex<Option<String>>,
    /// What its store changed since the node last took it ([`KubeSource::take_changes`]).
    pub pending: Mutex<Pending>,
}

/// What changed in one kind's store since the node last took it: recorded after the store
/// changed and before the tick is sent, so that a change is always in the store when the node
/// reads the key.
#[derive(Debug, Default)]
pub struct Pending {
    /// `(namespace, name)` of each object applied or deleted (the namespace empty when the kind
    /// is cluster-scoped).
    pub keys: HashSet<(String, String)>,
    /// A list completed (the first, or a relist after `410 Gone` or a broken watch): the store
    /// was replaced whole, and what it dropped was never seen as a deletion.
    pub resync: bool,
}

impl KindState {
    /// The state of a kind not listed yet.
    pub fn new(kind: &'static str) -> Self {
        Self::paced(kind, Backoff::default())
    }

    /// [`KindState::new`] with its requests paced by `backoff`.
    pub fn paced(kind: &'static str, backoff: Backoff) -> Self {
        Self {
            kind,
            pace: Pacer::new(backoff),
            versions: versions::of(kind),
            ..Self::default()
        }
    }

    /// Whether this kind has had its first complete list (what the source's sync needs).
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Whether the API server refuses to let the daemon read this kind now (403).
    pub fn is_forbidden(&self) -> bool {
        self.forbidden.load(Ordering::Acquire)
    }

    /// Where the kind stands.
    pub fn phase(&self) -> KindPhase {
        match (self.is_synced(), self.is_forbidden()) {
            (false, false) => KindPhase::Listing,
            (false, true) => KindPhase::ForbiddenUnlisted,
            (true, false) => KindPhase::Synced,
            (true, true) => KindPhase::ForbiddenStale,
        }
    }

    /// What `/ready` and `aether debug` say of the kind at `now_ms` (Unix milliseconds), or
    /// `None` when it is synced. Names the kind and its state only: `/ready` is served on the
    /// node's network, so the server's error text (which names the daemon's account) stays in
    /// the log and in `aether debug` ([`KindState::last_error`]).
    pub fn report(&self, now_ms: u64) -> Option<String> {
        let kind = self.kind;
        match self.phase() {
            KindPhase::Synced => None,
            KindPhase::Listing => Some(
                self.version_problem
                    .lock()
                    .clone()
                    .unwrap_or_else(|| format!("{kind}: not listed yet")),
            ),
            KindPhase::ForbiddenUnlisted => Some(format!(
                "{kind}: may not be read (403) and was never listed: no pod is served until it is"
            )),
            KindPhase::ForbiddenStale => {
                let since = self.forbidden_since_ms.load(Ordering::Relaxed);
                let secs = now_ms.saturating_sub(since) / 1000;
                Some(format!(
                    "{kind}: may not be read (403) for {secs} s: its last list and the changes seen before stay in force; its changes since are not seen"
                ))
            }
        }
    }

    /// The API server refused a list or watch of the kind (403).
    fn refused(&self, error: &str) {
        if self.forbidden.swap(true, Ordering::AcqRel) {
            return;
        }
        self.forbidden_since_ms
            .store(crate::time::wall_ms(), Ordering::Relaxed);
        if self.is_synced() {
            warn!(kind = self.kind, %error, "may not read this kind (check the ClusterRole): its last list and the changes seen before stay in force and the node goes on serving; its changes are not seen until it may be read again");
        } else {
            warn!(kind = self.kind, %error, "may not read this kind (check the ClusterRole): it was never listed, so the node stays not ready");
        }
    }

    /// The API server answered a list or watch of the kind, or its watch brought something: a
    /// refusal in course has ended.
    fn answered(&self) {
        if !self.forbidden.load(Ordering::Acquire) || !self.forbidden.swap(false, Ordering::AcqRel)
        {
            return;
        }
        self.forbidden_since_ms.store(0, Ordering::Relaxed);
        self.recoveries.fetch_add(1, Ordering::Relaxed);
        info!(
            kind = self.kind,
            "may read this kind again; its watch resumes"
        );
    }
}

/// Where one kind's watch stands: the four states `/ready`, `/metrics`
/// (`aether_registry_watch_synced`, `aether_registry_watch_forbidden`) and `aether debug` tell
/// apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KindPhase {
    /// Not listed whole yet (the first list, or its retries): the node serves no pod.
    Listing,
    /// Refused (403) before its first complete list: the node serves no pod (fail closed).
    ForbiddenUnlisted,
    /// Listed, and read (or not served by this API server: 404). A kind whose refusal ended is
    /// here again, with one more recovery counted.
    Synced,
    /// Refused (403) after its first complete list: its store stays as it was, the node serves
    /// and applies the other kinds; its own changes are not seen.
    ForbiddenStale,
}

impl KindPhase {
    /// The state's name in `aether debug` and the docs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Listing => "listing",
            Self::ForbiddenUnlisted => "forbidden-unlisted",
            Self::Synced => "synced",
            Self::ForbiddenStale => "forbidden-stale",
        }
    }
}

/// What the watches need to know of the daemon.
#[derive(Clone, Debug)]
pub struct WatchSettings {
    /// This node's name: its pods are watched a second time, by themselves
    /// (`fieldSelector=spec.nodeName=<node>`), and that view is the authority for them
    /// ([`super::objects::with_local_view`]). `None`: no node-local view (a tool that reads the
    /// cluster as a whole, such as the scale bench).
    pub node: Option<String>,
    /// Request bookmarks and use the server's streaming lists where it has them.
    pub streaming_lists: bool,
    /// Page size of a paged list (when lists are not streamed).
    pub page_size: u32,
    /// The pace of each kind's requests after failures ([`Backoff`]).
    pub backoff: Backoff,
}

impl Default for WatchSettings {
    fn default() -> Self {
        Self {
            node: None,
            streaming_lists: false,
            page_size: 500,
            backoff: Backoff::default(),
        }
    }
}

/// The name the node-local pod view goes by in `/ready`, `/model` and the logs.
pub const LOCAL_POD_KIND: &str = "Pod (this node)";

/// Every watch of the source, its stores and their states.
pub struct KubeSource {
    stores: Stores,
    kinds: Vec<Arc<KindState>>,
    tasks: Vec<JoinHandle<()>>,
}

struct Stores {
    pods: Kept<MeshPod>,
    /// This node's pods (`spec.nodeName=<node>`), when the settings name the node.
    local_pods: Option<(String, Kept<MeshPod>)>,
    services: Kept<Service>,
    endpoint_slices: Kept<EndpointSlice>,
    namespaces: Kept<Namespace>,
    http_routes: Kept<HttpRoute>,
    grpc_routes: Kept<GrpcRoute>,
    tls_routes: Kept<TlsRoute>,
    tcp_routes: Kept<TcpRoute>,
    udp_routes: Kept<UdpRoute>,
    reference_grants: Kept<ReferenceGrant>,
    mesh_filters: Kept<MeshFilterResource>,
}

/// What a store holds for one object: the object behind its own `Arc`, so that a reload shares
/// it with the store instead of copying it, or why it did not deserialize. It deserializes as
/// kube's `DeserializeGuard` does (one bad object is kept as an error with its metadata, never a
/// stalled watch), but keeps aside only the object's metadata for that error, where the guard
/// copies the whole object before typing it (a pod's event decodes in about three quarters of
/// the guard's time: docs/performance.md).
#[derive(Debug)]
pub struct Stored<K>(pub Result<Arc<K>, Arc<InvalidObject>>);

impl<K> Clone for Stored<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<'de, K> Deserialize<'de> for Stored<K>
where
    K: Deserialize<'de> + Resource,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        use serde_value::Value;
        let buffer = Value::deserialize(deserializer)?;
        let (map, metadata) = match &buffer {
            Value::Map(m) => (true, m.get(&Value::String("metadata".into())).cloned()),
            _ => (false, None),
        };
        match K::deserialize(buffer) {
            Ok(k) => Ok(Self(Ok(Arc::new(k)))),
            // As the guard: an object that is not even a map, or whose metadata does not read,
            // is an error of the whole answer.
            Err(error) if !map => Err(D::Error::custom(error)),
            Err(error) => {
                let metadata = match metadata {
                    Some(m) => ObjectMeta::deserialize(m).map_err(D::Error::custom)?,
                    None => ObjectMeta::default(),
                };
                Ok(Self(Err(Arc::new(InvalidObject {
                    error: error.to_string(),
                    metadata,
                }))))
            }
        }
    }
}

impl<K: Resource + Clone> Resource for Stored<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> std::borrow::Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        match &self.0 {
            Ok(k) => k.meta(),
            Err(e) => &e.metadata,
        }
    }
    /// Copies the object first if a reload still shares it (never the case before it is stored).
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match &mut self.0 {
            Ok(k) => Arc::make_mut(k).meta_mut(),
            Err(e) => &mut Arc::make_mut(e).metadata,
        }
    }
}

/// Objects held that did not deserialize: counted, never converted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Invalid {
    /// `(kind, namespace/name, error)` of each.
    pub objects: Vec<(&'static str, String, String)>,
}

impl KubeSource {
    /// Start every watch. `changed` gets a tick after each change of any store.
    pub fn start(client: &Client, settings: &WatchSettings, changed: &mpsc::Sender<()>) -> Self {
        let mut kinds = Vec::new();
        let mut tasks = Vec::new();
        let mut start = |kind: &'static str| {
            let state = Arc::new(KindState::paced(kind, settings.backoff));
            kinds.push(state.clone());
            let client = Answered::client(client, &state);
            (state, changed.clone(), client)
        };
        macro_rules! watch_kind {
            ($ty:ty, $kind:literal) => {{
                let (state, changed, client) = start($kind);
                let api: Api<Stored<$ty>> = Api::all(client);
                let (store, task) = spawn_watch(api, config(settings), state, changed);
                tasks.push(task);
                store
            }};
        }
        let local_pods = settings.node.as_ref().map(|node| {
            let (state, changed, client) = start(LOCAL_POD_KIND);
            let api: Api<Stored<ApiPod>> = Api::all(client);
            let on_node = config(settings).fields(&format!("spec.nodeName={node}"));
            let (store, task) =
                spawn_watch_keeping(api, on_node, ApiPod::shared_into_pod, state, changed);
            tasks.push(task);
            (node.clone(), store)
        });
        let stores = Stores {
            pods: {
                let (state, changed, client) = start("Pod");
                let api: Api<Stored<ApiPod>> = Api::all(client);
                let (store, task) = spawn_watch_keeping(
                    api,
                    config(settings),
                    ApiPod::shared_into_pod,
                    state,
                    changed,
                );
                tasks.push(task);
                store
            },
            local_pods,
            services: watch_kind!(Service, "Service"),
            endpoint_slices: watch_kind!(EndpointSlice, "EndpointSlice"),
            namespaces: watch_kind!(Namespace, "Namespace"),
            http_routes: watch_kind!(HttpRoute, "HTTPRoute"),
            grpc_routes: watch_kind!(GrpcRoute, "GRPCRoute"),
            tls_routes: watch_kind!(TlsRoute, "TLSRoute"),
            tcp_routes: watch_kind!(TcpRoute, "TCPRoute"),
            udp_routes: watch_kind!(UdpRoute, "UDPRoute"),
            reference_grants: watch_kind!(ReferenceGrant, "ReferenceGrant"),
            mesh_filters: watch_kind!(MeshFilterResource, "MeshFilter"),
        };
        Self {
            stores,
            kinds,
            tasks,
        }
    }

    /// Whether every kind has had its first complete list: from then on the node serves. A
    /// kind refused after its list does not unsync the source (its store stays in force).
    pub fn synced(&self) -> bool {
        self.kinds.iter().all(|k| k.is_synced())
    }

    /// The state of each kind's watch.
    pub fn kinds(&self) -> &[Arc<KindState>] {
        &self.kinds
    }

    /// Everything the stores hold now, and the objects that did not deserialize.
    pub fn objects(&self) -> (Objects, Invalid) {
        let mut invalid = Invalid::default();
        let s = &self.stores;
        let mut pods = valid(&s.pods, "Pod", &mut invalid);
        if let Some((node, local)) = &s.local_pods {
            // An object that does not deserialize is counted once, by the cluster-wide watch.
            let local = valid(local, LOCAL_POD_KIND, &mut Invalid::default());
            pods = with_local_view(pods, local, node);
        }
        let mut objects = Objects {
            pods,
            services: valid(&s.services, "Service", &mut invalid),
            endpoint_slices: valid(&s.endpoint_slices, "EndpointSlice", &mut invalid),
            namespaces: valid(&s.namespaces, "Namespace", &mut invalid),
            http_routes: valid(&s.http_routes, "HTTPRoute", &mut invalid),
            grpc_routes: valid(&s.grpc_routes, "GRPCRoute", &mut invalid),
            tls_routes: valid(&s.tls_routes, "TLSRoute", &mut invalid),
            tcp_routes: valid(&s.tcp_routes, "TCPRoute", &mut invalid),
            udp_routes: valid(&s.udp_routes, "UDPRoute", &mut invalid),
            reference_grants: valid(&s.reference_grants, "ReferenceGrant", &mut invalid),
            mesh_filters: valid(&s.mesh_filters, "MeshFilter", &mut invalid),
            undecodable_mesh_filters: Vec::new(),
        };
        // A MeshFilter that did not decode could be an authorization: the snapshot keeps it as
        // unreadable (issue #35 item 1), besides reporting it as every bad object is.
        objects.undecodable_mesh_filters = s
            .mesh_filters
            .state()
            .iter()
            .filter_map(|stored| {
                let e = stored.0.as_ref().err()?;
                let namespace = e.metadata.namespace.clone().filter(|n| !n.is_empty())?;
                let name = e.metadata.name.clone().filter(|n| !n.is_empty())?;
                Some(super::objects::Undecodable {
                    namespace,
                    name,
                    generation: e.metadata.generation,
                    why: e.error.clone(),
                })
            })
            .collect();
        (objects, invalid)
    }
}

/// What changed in the stores since the node last took it ([`KubeSource::take_changes`]).
#[derive(Debug, Default)]
pub struct Taken {
    /// A kind listed again (or for the first time): everything is read again
    /// ([`KubeSource::all_changes`]).
    pub resync: bool,
    /// Each object applied or deleted: its kind, namespace and name.
    pub keys: Vec<(Watched, String, String)>,
}

/// One object as the kept model takes it: its changes, and the problem it has, if any.
#[derive(Debug)]
pub struct ObjectChanges {
    /// Its kind.
    pub kind: Watched,
    /// Its key ([`keyed::key`]).
    pub key: String,
    /// What it puts and deletes.
    pub changes: Vec<Change>,
    /// Why it was left out (or kept as unreadable): the line logged of it. `None`: it converted,
    /// or it is gone.
    pub problem: Option<String>,
    /// Its part of the stores' fingerprint ([`super::objects::fingerprint_of`]); `None` when it
    /// is gone or did not deserialize (the fingerprint counts neither).
    pub fingerprint: Option<u64>,
}

impl KubeSource {
    /// What changed since the last call, taken: each kind's keys, or a resync when some kind
    /// listed again. Take it before reading the stores: a change made meanwhile is read with
    /// this one and given again with the next.
    pub fn take_changes(&self) -> Taken {
        let mut taken = Taken::default();
        for state in &self.kinds {
            let pending = std::mem::take(&mut *state.pending.lock());
            taken.resync |= pending.resync;
            let Some(kind) = Watched::of(state.kind) else {
                continue;
            };
            taken.keys.extend(
                pending
                    .keys
                    .into_iter()
                    .map(|(namespace, name)| (kind, namespace, name)),
            );
        }
        taken
    }

    /// The objects under `keys` as the stores hold them now, converted one by one: O(keys).
    pub fn changes_of(&self, keys: &[(Watched, String, String)]) -> Vec<ObjectChanges> {
        let mut seen = HashSet::with_capacity(keys.len());
        keys.iter()
            .filter(|k| seen.insert(*k))
            .map(|(kind, namespace, name)| self.object_changes(*kind, namespace, name))
            .collect()
    }

    /// Every object the stores hold, converted: what a resync gives the kept model.
    pub fn all_changes(&self) -> Vec<ObjectChanges> {
        let s = &self.stores;
        let mut keys: Vec<(Watched, String, String)> = Vec::new();
        macro_rules! each {
            ($store:expr, $kind:ident) => {
                keys.extend(
                    $store
                        .keys()
                        .into_iter()
                        .map(|(namespace, name)| (Watched::$kind, namespace, name)),
                );
            };
        }
        each!(s.pods, Pod);
        if let Some((_, local)) = &s.local_pods {
            each!(local, Pod);
        }
        each!(s.services, Service);
        each!(s.endpoint_slices, EndpointSlice);
        each!(s.namespaces, Namespace);
        each!(s.http_routes, HttpRoute);
        each!(s.grpc_routes, GrpcRoute);
        each!(s.tls_routes, TlsRoute);
        each!(s.tcp_routes, TcpRoute);
        each!(s.udp_routes, UdpRoute);
        each!(s.reference_grants, ReferenceGrant);
        each!(s.mesh_filters, MeshFilter);
        self.changes_of(&keys)
    }

    /// The pod `namespace/name` as this node serves it: this node's own view for its pods, the
    /// cluster-wide store for every other ([`with_local_view`]).
    fn pod_now(&self, namespace: &str, name: &str) -> Option<Stored<MeshPod>> {
        let Some((node, local)) = &self.stores.local_pods else {
            return self.stores.pods.get(namespace, name);
        };
        let on = |p: &Stored<MeshPod>| {
            p.0.as_ref()
                .is_ok_and(|p| p.node_name() == Some(node.as_str()))
        };
        if let Some(p) = local.get(namespace, name).filter(|p| on(p)) {
            return Some(p);
        }
        self.stores.pods.get(namespace, name).filter(|p| !on(p))
    }

    /// One object's changes, read from its store now.
    fn object_changes(&self, kind: Watched, namespace: &str, name: &str) -> ObjectChanges {
        let key = keyed::key(kind, namespace, name);
        let s = &self.stores;
        // The store's object converted, or its problem when it did not deserialize.
        macro_rules! read {
            ($stored:expr, $kind_name:expr, $any:ident) => {{
                match $stored {
                    None => (keyed::changes(kind, &key, None), None),
                    Some(stored) => match &stored.0 {
                        Ok(o) => {
                            let (namespace, name, version) = (**o).version();
                            let print = fingerprint_of(($kind_name, namespace, name, version));
                            (keyed::changes(kind, &key, Some(Any::$any(o))), Some(print))
                        }
                        Err(e) => {
                            let out = if kind == Watched::MeshFilter
                                && !namespace.is_empty()
                                && !name.is_empty()
                            {
                                // It could be an authorization: kept as unreadable over its
                                // namespace (issue #35 item 1).
                                keyed::undecodable_filter(&key, namespace, name, &e.error)
                            } else {
                                let mut out = keyed::Keyed::default();
                                keyed::gone(kind, &key.as_str().into(), &mut out);
                                out
                            };
                            return ObjectChanges {
                                kind,
                                problem: Some(format!(
                                    "{} {namespace}/{name} does not deserialize: {}",
                                    $kind_name, e.error
                                )),
                                key,
                                changes: out.changes,
                                fingerprint: None,
                            };
                        }
                    },
                }
            }};
        }
        let (keyed, fingerprint) = match kind {
            Watched::Pod => read!(self.pod_now(namespace, name), "Pod", Pod),
            Watched::Service => read!(s.services.get(namespace, name), "Service", Service),
            Watched::EndpointSlice => read!(
                s.endpoint_slices.get(namespace, name),
                "EndpointSlice",
                EndpointSlice
            ),
            Watched::Namespace => read!(s.namespaces.get("", name), "Namespace", Namespace),
            Watched::HttpRoute => read!(s.http_routes.get(namespace, name), "HTTPRoute", HttpRoute),
            Watched::GrpcRoute => read!(s.grpc_routes.get(namespace, name), "GRPCRoute", GrpcRoute),
            Watched::TlsRoute => {
                read!(s.tls_routes.get(namespace, name), "TLSRoute", TlsRoute)
            }
            Watched::TcpRoute => {
                read!(s.tcp_routes.get(namespace, name), "TCPRoute", TcpRoute)
            }
            Watched::UdpRoute => {
                read!(s.udp_routes.get(namespace, name), "UDPRoute", UdpRoute)
            }
            Watched::ReferenceGrant => read!(
                s.reference_grants.get(namespace, name),
                "ReferenceGrant",
                ReferenceGrant
            ),
            Watched::MeshFilter => {
                read!(
                    s.mesh_filters.get(namespace, name),
                    "MeshFilter",
                    MeshFilter
                )
            }
        };
        ObjectChanges {
            kind,
            key,
            changes: keyed.changes,
            problem: keyed.problem.map(|e| e.to_string()),
            fingerprint,
        }
    }
}

impl Debug for KubeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSource")
            .field("kinds", &self.kinds)
            .finish_non_exhaustive()
    }
}

impl Drop for KubeSource {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn config(settings: &WatchSettings) -> watcher::Config {
    let c = watcher::Config::default();
    if settings.streaming_lists {
        c.streaming_lists().page_size(settings.page_size)
    } else {
        c.page_size(settings.page_size)
    }
}

/// One kind's watcher. With streaming lists, a server that refuses them (`422`: its WatchList
/// feature is off, as on every release before 1.32 unless enabled) makes the kind fall back to
/// paged lists, once, logged and counted: until now it was asked again forever (issue #36
/// item 3).
fn kind_watcher<K>(
    api: Api<Stored<K>>,
    config: watcher::Config,
    state: Arc<KindState>,
) -> impl futures_util::Stream<Item = watcher::Result<Event<Stored<K>>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let streaming = config.initial_list_strategy == watcher::InitialListStrategy::StreamingList;
    let first = watch_api(api.clone(), config.clone()).boxed();
    futures_util::stream::unfold((first, streaming), move |(mut stream, mut streaming)| {
        let (api, config, state) = (api.clone(), config.clone(), state.clone());
        async move {
            loop {
                let item = stream.next().await?;
                if streaming && matches!(&item, Err(e) if status_code(e) == Some(422)) {
                    let error = item
                        .as_ref()
                        .err()
                        .map(|e| crate::DisplayChain(e).to_string())
                        .unwrap_or_default();
                    warn!(kind = state.kind, %error, "the API server refuses streaming lists (422); this kind is read with paged lists");
                    state.streaming_fallbacks.fetch_add(1, Ordering::Relaxed);
                    let paged = watcher::Config {
                        initial_list_strategy: watcher::InitialListStrategy::ListWatch,
                        ..config.clone()
                    };
                    stream = watch_api(api.clone(), paged).boxed();
                    streaming = false;
                    continue;
                }
                return Some((item, (stream, streaming)));
            }
        }
    })
}

/// The objects of a store that deserialized, shared with the store; the others are listed in
/// `invalid`.
fn valid<K>(store: &Kept<K>, kind: &'static str, invalid: &mut Invalid) -> Vec<Arc<K>> {
    let mut out = Vec::new();
    for stored in store.state() {
        match &stored.0 {
            Ok(k) => out.push(Arc::clone(k)),
            Err(e) => {
                let name = format!(
                    "{}/{}",
                    e.metadata.namespace.as_deref().unwrap_or(""),
                    e.metadata.name.as_deref().unwrap_or("")
                );
                invalid.objects.push((kind, name, e.error.clone()));
            }
        }
    }
    out
}

/// Start one kind's reflector: list, then watch.
fn spawn_watch<K>(
    api: Api<Stored<K>>,
    config: watcher::Config,
    state: Arc<KindState>,
    changed: mpsc::Sender<()>,
) -> (Kept<K>, JoinHandle<()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    spawn_watch_keeping(api, config, std::convert::identity, state, changed)
}

/// [`spawn_watch`], the store keeping `keep` of each object.
fn spawn_watch_keeping<W, K>(
    api: Api<Stored<W>>,
    config: watcher::Config,
    keep: fn(Arc<W>) -> Arc<K>,
    state: Arc<KindState>,
    changed: mpsc::Sender<()>,
) -> (Kept<K>, JoinHandle<()>)
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    W::DynamicType: Default + Eq + std::hash::Hash + Clone,
    K: Send + Sync + 'static,
{
    let (reader, mut writer) = Keeper::keeping(keep);
    let task = tokio::spawn(async move {
        // No stream back-off: each request waits its kind's pace ([`pace`]), which a stream
        // back-off cannot keep (it resets on the `Init` before every list).
        let stream = kind_watcher(api, config, state.clone());
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            let event = match item {
                Ok(event) => event,
                Err(e) => {
                    on_error(&state, &e, &changed);
                    continue;
                }
            };
            if matches!(event, Event::InitDone | Event::Apply(_) | Event::Delete(_)) {
                state
                    .last_event_ms
                    .store(crate::time::wall_ms(), Ordering::Relaxed);
            }
            let named = match &event {
                Event::Apply(o) | Event::Delete(o) => Some(kept::key_of(o)),
                _ => None,
            };
            let done = matches!(event, Event::InitDone);
            let answer = !matches!(event, Event::Init);
            // The store holds the change before its key is recorded below.
            writer.apply(event);
            if done {
                {
                    let mut pending = state.pending.lock();
                    pending.resync = true;
                    pending.keys.clear();
                }
                if state.synced.swap(true, Ordering::AcqRel) {
                    state.relists.fetch_add(1, Ordering::Relaxed);
                } else {
                    info!(kind = state.kind, "listed");
                }
                state.absent.store(false, Ordering::Release);
            }
            let tick = done || named.is_some();
            if let Some((namespace, name)) = named {
                state
                    .pending
                    .lock()
                    .keys
                    .insert((namespace.into(), name.into()));
                state.events.fetch_add(1, Ordering::Release);
            }
            // `Init` is sent before a list is asked for: no answer yet.
            if answer {
                state.answered();
            }
            if tick {
                let _ = changed.try_send(());
            }
        }
    });
    (reader, task)
}

/// One kind's client: each request goes through the daemon's client, and a success answer to
/// it (a list page, or a watch that opened) ends a refusal of the kind in course
/// ([`KindState::answered`]). The watcher yields nothing when a watch opens, so without this a
/// lifted `403` on a kind with no change to deliver would be reported forever. Only the kind's
/// own lists and watches go through it.
#[derive(Clone)]
struct Answered {
    client: Client,
    state: Arc<KindState>,
}

impl Answered {
    /// A client of `client` for the kind of `state`.
    fn client(client: &Client, state: &Arc<KindState>) -> Client {
        let answered = Self {
            client: client.clone(),
            state: state.clone(),
        };
        Client::new(answered, client.default_namespace())
    }
}

impl tower_service::Service<http::Request<kube::client::Body>> for Answered {
    type Response = http::Response<WatchBody>;
    type Error = kube::Error;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        // The daemon's client waits for its own readiness in `send`.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let (client, state) = (self.client.clone(), self.state.clone());
        Box::pin(async move {
            if let Some(due) = state.pace.due() {
                tokio::time::sleep_until(due).await;
            }
            let mut request = request;
            if let Some(uri) = consistent_initial_events(request.uri()) {
                *request.uri_mut() = uri;
            }
            if let Some(versions) = state.versions {
                let uri = request.uri().clone();
                if let Some(refusal) = choose_version(&client, &state, &versions, &uri).await {
                    return Ok(refusal);
                }
                let at = state.served_at.lock().clone();
                if let Some(uri) = at.and_then(|v| versions.rewrite(request.uri(), &v)) {
                    *request.uri_mut() = uri;
                }
            }
            let watch = request
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
            let response = client.send(request).await?;
            if !response.status().is_success() {
                return Ok(response.map(WatchBody::plain));
            }
            state.answered();
            Ok(if watch {
                response.map(|body| WatchBody::watch(body, state))
            } else {
                response.map(WatchBody::plain)
            })
        })
    }
}

/// A response body of a kind's client: a watch's tells the kind's pace whether it lived and
/// delivered, or ended at once with nothing ([`pace`]).
struct WatchBody {
    inner: kube::client::Body,
    /// The kind of a watch; `None` for any other answer.
    watch: Option<Arc<KindState>>,
    opened: tokio::time::Instant,
    delivered: bool,
}

impl WatchBody {
    fn plain(inner: kube::client::Body) -> Self {
        Self {
            inner,
            watch: None,
            opened: tokio::time::Instant::now(),
            delivered: false,
        }
    }

    fn watch(inner: kube::client::Body, state: Arc<KindState>) -> Self {
        Self {
            watch: Some(state),
            ..Self::plain(inner)
        }
    }
}

impl http_body::Body for WatchBody {
    type Data = bytes::Bytes;
    type Error = kube::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        let this = &mut *self;
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        let Some(state) = &this.watch else {
            return polled;
        };
        match &polled {
            Poll::Ready(Some(Ok(frame)))
                if !this.delivered && frame.data_ref().is_some_and(|d| !d.is_empty()) =>
            {
                this.delivered = true;
                state.pace.delivered();
            }
            // Ended cleanly. An error ends it too, and is the watcher's to report.
            Poll::Ready(None) if !this.delivered => {
                let now = tokio::time::Instant::now();
                if now.duration_since(this.opened) < state.pace.backoff().short_watch {
                    let wait = state.pace.failed(Failure::ShortWatch, now);
                    state.short_watches.fetch_add(1, Ordering::Relaxed);
                    debug!(
                        kind = state.kind,
                        ?wait,
                        "the watch ended at once with nothing in it; the next waits"
                    );
                } else {
                    state.pace.delivered();
                }
                this.watch = None;
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Before a list (or a streaming list's first watch) of a kind whose group serves several
/// versions, ask discovery where it is served ([`versions`]) and remember the choice. A kind
/// served only at versions this build cannot read gets a refusal (`406`) instead of a request,
/// so it is not synced and says why; a discovery that fails keeps the last choice.
async fn choose_version(
    client: &Client,
    state: &KindState,
    versions: &Versions,
    uri: &http::Uri,
) -> Option<http::Response<WatchBody>> {
    let query = uri.query().unwrap_or("");
    let resumed_watch = query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1")
        && !query.split('&').any(|p| p == "sendInitialEvents=true");
    if resumed_watch {
        return None;
    }
    let get = |path: String| http::Request::get(path).body(Vec::new());
    let group = match get(format!("/apis/{}", versions.group)) {
        Ok(req) => client.request::<versions::ApiGroup>(req).await,
        Err(_) => return None,
    };
    let served = match group {
        Ok(group) => {
            let mut served = Vec::new();
            for version in versions.candidates(&group) {
                let Ok(req) = get(format!("/apis/{}/{version}", versions.group)) else {
                    continue;
                };
                match client.request::<versions::ResourceList>(req).await {
                    Ok(list) if versions.listed_in(&list) => served.push(version),
                    Ok(_) => {}
                    // Not known whole: keep the last choice.
                    Err(_) => return None,
                }
            }
            versions.choose(&served)
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Served::Nowhere,
        Err(_) => return None,
    };
    match served {
        Served::At(version) => {
            let other = (version != versions.compiled).then_some(version);
            let mut at = state.served_at.lock();
            if *at != other {
                info!(
                    kind = state.kind,
                    version = other.as_deref().unwrap_or(versions.compiled),
                    "the API server serves this kind at this version; it is read there"
                );
                *at = other;
            }
            *state.version_problem.lock() = None;
            None
        }
        Served::Nowhere => {
            *state.served_at.lock() = None;
            *state.version_problem.lock() = None;
            None
        }
        Served::Unreadable(listed) => {
            let problem = versions.problem(state.kind, &listed);
            let mut held = state.version_problem.lock();
            if held.as_deref() != Some(problem.as_str()) {
                warn!(kind = state.kind, served = ?listed, "{problem}");
                *held = Some(problem.clone());
            }
            let status = serde_json::json!({
                "apiVersion": "v1", "kind": "Status", "status": "Failure",
                "reason": "NotAcceptable", "code": 406, "message": problem,
            });
            let body = kube::client::Body::from(status.to_string().into_bytes());
            http::Response::builder()
                .status(406)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(WatchBody::plain(body))
                .ok()
        }
    }
}

/// A streaming list's watch made a consistent read, as client-go makes it: kube-runtime asks
/// for its initial events at `resourceVersion=0` (any version, the server's cache, which may be
/// behind what this node saw elsewhere); `resourceVersion=` with `NotOlderThan` is the most
/// recent. `None`: not a streaming list's first watch (a resumed watch keeps its version).
fn consistent_initial_events(uri: &http::Uri) -> Option<http::Uri> {
    let query = uri.query()?;
    let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let initial = pairs
        .iter()
        .any(|(k, v)| k == "sendInitialEvents" && v == "true");
    let at_zero = pairs
        .iter()
        .any(|(k, v)| k == "resourceVersion" && v == "0");
    if !initial || !at_zero {
        return None;
    }
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (k, v) in &pairs {
        let v = if k == "resourceVersion" {
            ""
        } else {
            v.as_str()
        };
        out.append_pair(k, v);
    }
    let path_and_query = format!("{}?{}", uri.path(), out.finish());
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().ok()?);
    http::Uri::from_parts(parts).ok()
}

/// The HTTP status of a watch error, when the API server answered with one.
fn status_code(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s.code),
        watcher::Error::WatchError(s) => Some(s.code),
        _ => None,
    }
}

fn on_error(state: &KindState, e: &watcher::Error, changed: &mpsc::Sender<()>) {
    let n = state.errors.fetch_add(1, Ordering::Relaxed);
    let text = crate::DisplayChain(e).to_string();
    *state.last_error.lock() = Some(text.clone());
    let now = tokio::time::Instant::now();
    match status_code(e) {
        // Not served: asked for again at the slow period.
        Some(404) => state.pace.absent(now),
        // The watcher relists at once, as client-go does.
        Some(410) => {}
        Some(_) => {
            state.pace.failed(Failure::Refused, now);
        }
        None => {
            state.pace.failed(Failure::Unreachable, now);
        }
    }
    match status_code(e) {
        Some(404) if !state.synced.load(Ordering::Acquire) => {
            // No such resource on this server (its CRD is not installed): nothing to hold.
            if !state.absent.swap(true, Ordering::AcqRel) {
                warn!(kind = state.kind, error = %text, "the API server does not serve this kind; treated as empty until it does");
            }
            state.synced.store(true, Ordering::Release);
            let _ = changed.try_send(());
        }
        Some(403) => {
            state.refused(&text);
            let _ = changed.try_send(());
        }
        // 410 Gone and broken watches: the watcher relists by itself. Logged sparingly.
        _ if n < 3 || n.is_power_of_two() => {
            warn!(kind = state.kind, errors = n + 1, error = %text, "watch error; retrying, the last model stays");
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
