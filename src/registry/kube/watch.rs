//! The Kubernetes source's watches (IO): one kube-rs reflector per kind, feeding stores that a
//! reload turns into one [`Objects`] and then one snapshot ([`super::objects::snapshot`]).
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
//!   and empty, and is retried; a kind the daemon may not read (`403`) is reported and keeps the
//!   source unsynced (fail closed: a missing MeshFilter could drop an authorization), while the
//!   other kinds go on.
//! - This node's pods are watched twice: cluster-wide with every other pod, and by themselves
//!   (`spec.nodeName=<node>`). The node-local view is the authority for them, so a new pod of
//!   this node is captured as soon as its own small watch brings it, however far the
//!   cluster-wide watch lags or long it relists (docs/decisions.md).
//! - Every change sends one tick on the `changed` channel (capacity 1: ticks coalesce); the
//!   daemon debounces and reloads.
//! - A store holds each object behind its own `Arc` ([`Stored`]): a reload shares the stored
//!   objects and never copies them (docs/kubernetes.md, "Scale"). Stored objects are never
//!   changed in place: a trim happens before an object is stored, and an update replaces it.

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
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_api};
use kube::{Api, Client, Resource};
use serde::de::{Deserialize, DeserializeOwned, Deserializer};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::mesh_filter::MeshFilterResource;
use super::objects::{Objects, trim_pod, with_local_view};

/// How one kind's watch stands.
#[derive(Debug, Default)]
pub struct KindState {
    /// The kind's name (`Pod`, `HTTPRoute`, …).
    pub kind: &'static str,
    /// Its first complete list has arrived (or the kind does not exist on this server).
    pub synced: AtomicBool,
    /// The API server does not serve the kind (404): its CRD is not installed.
    pub absent: AtomicBool,
    /// The API server refused to let the daemon read it (403).
    pub forbidden: AtomicBool,
    /// Watch errors since start.
    pub errors: AtomicU64,
    /// Complete lists after the first (a `410 Gone`, a broken watch).
    pub relists: AtomicU64,
    /// The last error, for `/ready` and the logs.
    pub last_error: Mutex<Option<String>>,
    /// When the watch last brought a change or completed a list, Unix time in milliseconds
    /// (0: never); `aether_registry_watch_last_event_timestamp_seconds`.
    pub last_event_ms: AtomicU64,
}

impl KindState {
    /// The state of a kind not listed yet.
    pub fn new(kind: &'static str) -> Self {
        Self {
            kind,
            ..Self::default()
        }
    }

    /// Whether this kind lets the source be synced.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire) && !self.forbidden.load(Ordering::Acquire)
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
}

impl Default for WatchSettings {
    fn default() -> Self {
        Self {
            node: None,
            streaming_lists: false,
            page_size: 500,
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
    pods: Store<Stored<Pod>>,
    /// This node's pods (`spec.nodeName=<node>`), when the settings name the node.
    local_pods: Option<(String, Store<Stored<Pod>>)>,
    services: Store<Stored<Service>>,
    endpoint_slices: Store<Stored<EndpointSlice>>,
    namespaces: Store<Stored<Namespace>>,
    http_routes: Store<Stored<HttpRoute>>,
    grpc_routes: Store<Stored<GrpcRoute>>,
    tls_routes: Store<Stored<TlsRoute>>,
    tcp_routes: Store<Stored<TcpRoute>>,
    udp_routes: Store<Stored<UdpRoute>>,
    reference_grants: Store<Stored<ReferenceGrant>>,
    mesh_filters: Store<Stored<MeshFilterResource>>,
}

/// What a store holds for one object: the object behind its own `Arc`, so that a reload shares
/// it with the store instead of copying it, or why it did not deserialize. It deserializes as
/// kube's [`DeserializeGuard`] does (one bad object is kept as an error, never a stalled watch).
#[derive(Clone, Debug)]
pub struct Stored<K>(pub Result<Arc<K>, Arc<InvalidObject>>);

impl<'de, K> Deserialize<'de> for Stored<K>
where
    K: Deserialize<'de> + Resource,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let guard = DeserializeGuard::<K>::deserialize(deserializer)?;
        Ok(Self(guard.0.map(Arc::new).map_err(Arc::new)))
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
    fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        match &self.0 {
            Ok(k) => k.meta(),
            Err(e) => &e.metadata,
        }
    }
    /// Copies the object first if a reload still shares it (never the case before it is stored).
    fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
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
            let state = Arc::new(KindState::new(kind));
            kinds.push(state.clone());
            (state, changed.clone())
        };
        macro_rules! watch_kind {
            ($ty:ty, $kind:literal, $trim:expr) => {{
                let (state, changed) = start($kind);
                let api: Api<Stored<$ty>> = Api::all(client.clone());
                let (store, task) = spawn_watch(api, config(settings), $trim, state, changed);
                tasks.push(task);
                store
            }};
        }
        let local_pods = settings.node.as_ref().map(|node| {
            let (state, changed) = start(LOCAL_POD_KIND);
            let api: Api<Stored<Pod>> = Api::all(client.clone());
            let on_node = config(settings).fields(&format!("spec.nodeName={node}"));
            let (store, task) = spawn_watch(api, on_node, trim_pod, state, changed);
            tasks.push(task);
            (node.clone(), store)
        });
        let stores = Stores {
            pods: watch_kind!(Pod, "Pod", trim_pod),
            local_pods,
            services: watch_kind!(Service, "Service", no_trim),
            endpoint_slices: watch_kind!(EndpointSlice, "EndpointSlice", no_trim),
            namespaces: watch_kind!(Namespace, "Namespace", no_trim),
            http_routes: watch_kind!(HttpRoute, "HTTPRoute", no_trim),
            grpc_routes: watch_kind!(GrpcRoute, "GRPCRoute", no_trim),
            tls_routes: watch_kind!(TlsRoute, "TLSRoute", no_trim),
            tcp_routes: watch_kind!(TcpRoute, "TCPRoute", no_trim),
            udp_routes: watch_kind!(UdpRoute, "UDPRoute", no_trim),
            reference_grants: watch_kind!(ReferenceGrant, "ReferenceGrant", no_trim),
            mesh_filters: watch_kind!(MeshFilterResource, "MeshFilter", no_trim),
        };
        Self {
            stores,
            kinds,
            tasks,
        }
    }

    /// Whether every kind has had its first complete list (and none is forbidden).
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
        let objects = Objects {
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
        };
        (objects, invalid)
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

/// So the watchers can list and watch it (here, not in `mesh_filter`, which is pure data) (`aether.io/v1alpha1`, `meshfilters`, namespaced).
impl Resource for MeshFilterResource {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        super::mesh_filter::MESH_FILTER_KIND.into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        super::mesh_filter::MESH_FILTER_GROUP.into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1alpha1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "meshfilters".into()
    }
    fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &mut self.metadata
    }
}

fn no_trim<K>(_: &mut K) {}

fn config(settings: &WatchSettings) -> watcher::Config {
    let c = watcher::Config::default();
    if settings.streaming_lists {
        c.streaming_lists()
    } else {
        c.page_size(settings.page_size)
    }
}

/// The objects of a store that deserialized, shared with the store; the others are listed in
/// `invalid`.
fn valid<K>(store: &Store<Stored<K>>, kind: &'static str, invalid: &mut Invalid) -> Vec<Arc<K>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
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

/// Start one kind's reflector: list, then watch, trimming each object before it is stored.
fn spawn_watch<K>(
    api: Api<Stored<K>>,
    config: watcher::Config,
    trim: fn(&mut K),
    state: Arc<KindState>,
    changed: mpsc::Sender<()>,
) -> (Store<Stored<K>>, JoinHandle<()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let task = tokio::spawn(async move {
        let stream = watch_api(api, config)
            .modify(move |stored: &mut Stored<K>| {
                // Just deserialized, so not shared: `make_mut` does not copy.
                if let Ok(k) = &mut stored.0 {
                    trim(Arc::make_mut(k));
                }
            })
            .default_backoff()
            .reflect(writer);
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if matches!(
                item,
                Ok(Event::InitDone | Event::Apply(_) | Event::Delete(_))
            ) {
                state
                    .last_event_ms
                    .store(crate::time::wall_ms(), Ordering::Relaxed);
            }
            match item {
                Ok(Event::InitDone) => {
                    if state.synced.swap(true, Ordering::AcqRel) {
                        state.relists.fetch_add(1, Ordering::Relaxed);
                    } else {
                        info!(kind = state.kind, "listed");
                    }
                    state.absent.store(false, Ordering::Release);
                    state.forbidden.store(false, Ordering::Release);
                    let _ = changed.try_send(());
                }
                Ok(Event::Apply(_) | Event::Delete(_)) => {
                    let _ = changed.try_send(());
                }
                Ok(Event::Init | Event::InitApply(_)) => {}
                Err(e) => on_error(&state, &e, &changed),
            }
        }
    });
    (reader, task)
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
            if !state.forbidden.swap(true, Ordering::AcqRel) {
                warn!(kind = state.kind, error = %text, "may not read this kind: the node stays not ready (check the ClusterRole)");
            }
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
