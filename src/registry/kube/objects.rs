//! The objects the Kubernetes source holds, and the snapshot they make (pure).
//!
//! The watchers ([`super::watch`]) keep one store per kind; a reload copies the stores' current
//! objects into [`Objects`] and [`snapshot`] converts them with the same functions the file
//! registry uses ([`super::convert`]). Nothing here does IO.
//!
//! Invariants:
//! - The snapshot does not depend on the order the stores hand objects out: each kind is sorted
//!   by (namespace, name) first.
//! - An object that does not convert is left out and reported as an [`ObjectProblem`]; an object
//!   that did not even deserialize (kube's `DeserializeGuard`) is counted by the watcher and never
//!   reaches this module. One bad object never hides the others.
//! - Pods: a missing `Ready` condition means not Ready (spec/model.md §3.5: Ready is the
//!   condition being `True`), unlike the file registry, whose hand-written Pods may omit status.
//! - A conversion may take an unchanged pod object's conversion from the last snapshot
//!   ([`snapshot_reusing`]); the snapshot is the same as converting every object again. The
//!   node no longer converts whole snapshots on this source (it converts the changed objects,
//!   `convert::keyed`); `kube_scale`'s whole-reload figure still does, as the before.
//! - Generated Services are read back from the API like any other Service: the registrar writes
//!   them ([`crate::model::registrar`]), every node reads what was written (spec/model.md §8, "Lag").

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use gateway_api::experimental::grpcroutes::GrpcRoute;
use gateway_api::experimental::httproutes::HttpRoute;
use gateway_api::experimental::referencegrants::ReferenceGrant;
use gateway_api::experimental::tcproutes::TcpRoute;
use gateway_api::experimental::tlsroutes::TlsRoute;
use gateway_api::experimental::udproutes::UdpRoute;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::convert::{
    ConvertError, MissingReadyCondition, Registration, convert_endpoint_slice, convert_grpc_route,
    convert_http_route, convert_mesh_filter, convert_namespace, convert_pod,
    convert_reference_grant, convert_service, convert_tcp_route, convert_tls_route,
    convert_udp_route, undecodable_mesh_filter, unreadable_grpc_route, unreadable_http_route,
    unreadable_mesh_filter, unreadable_tcp_route, unreadable_tls_route, unreadable_udp_route,
};
use super::mesh_filter::MeshFilterResource;
use super::pod::MeshPod;
use crate::model::Snapshot;
use crate::model::snapshot::{Pod as SnapshotPod, RefusedPod, Row};

/// An object of a watched kind that did not decode: what its metadata says, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Undecodable {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `metadata.generation`, for the status written of it.
    pub generation: Option<i64>,
    /// Why it did not decode.
    pub why: String,
}

/// Every object of every watched kind, as the stores hold them.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    /// Pods, cluster-wide, as the mesh reads them ([`MeshPod`]); this node's from its own view
    /// ([`with_local_view`]).
    pub pods: Vec<Arc<MeshPod>>,
    /// Services.
    pub services: Vec<Arc<Service>>,
    /// EndpointSlices.
    pub endpoint_slices: Vec<Arc<EndpointSlice>>,
    /// Namespaces.
    pub namespaces: Vec<Arc<Namespace>>,
    /// HTTPRoutes.
    pub http_routes: Vec<Arc<HttpRoute>>,
    /// GRPCRoutes.
    pub grpc_routes: Vec<Arc<GrpcRoute>>,
    /// TLSRoutes.
    pub tls_routes: Vec<Arc<TlsRoute>>,
    /// TCPRoutes.
    pub tcp_routes: Vec<Arc<TcpRoute>>,
    /// UDPRoutes.
    pub udp_routes: Vec<Arc<UdpRoute>>,
    /// ReferenceGrants.
    pub reference_grants: Vec<Arc<ReferenceGrant>>,
    /// MeshFilters.
    pub mesh_filters: Vec<Arc<MeshFilterResource>>,
    /// MeshFilters that did not decode: kept as unreadable filters of their whole namespace
    /// (issue #35 item 1).
    pub undecodable_mesh_filters: Vec<Undecodable>,
}

/// An object left out of the snapshot, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectProblem {
    /// What was wrong, naming the object and the field.
    pub error: ConvertError,
}

impl fmt::Display for ObjectProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

fn sort_key(meta: &ObjectMeta) -> (&str, &str) {
    (
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or(""),
    )
}

fn pod_key(pod: &MeshPod) -> (&str, &str) {
    let (namespace, name, _) = pod.version();
    (namespace, name)
}

fn sorted<K>(objects: &[Arc<K>], meta: impl Fn(&K) -> &ObjectMeta) -> Vec<&K> {
    let mut out: Vec<&K> = objects.iter().map(Arc::as_ref).collect();
    out.sort_by(|a, b| sort_key(meta(a)).cmp(&sort_key(meta(b))));
    out
}

/// Convert every object into one snapshot; the objects that do not convert are reported.
pub fn snapshot(objects: &Objects) -> (Snapshot, Vec<ObjectProblem>) {
    let (s, problems, _) = snapshot_reusing(objects, None);
    (s, problems)
}

/// Where each pod object of one conversion went in its snapshot, so that the next conversion
/// takes an unchanged pod from that snapshot instead of converting it again
/// ([`snapshot_reusing`]). The stores hold each object behind its own `Arc` and replace it
/// whole when it changes, so an object at the same address is the same object, unchanged: the
/// places hold every object they name, and no other object can take its address meanwhile.
#[derive(Debug, Default)]
pub struct PodPlaces {
    /// By the object's address: the object, its position in the conversion's (namespace, name)
    /// order, and what became of it.
    by_object: HashMap<usize, (Arc<MeshPod>, usize, Place)>,
    /// How many pods the conversion that made these places took from the previous snapshot.
    pub reused: usize,
}

/// What became of one pod object.
#[derive(Debug)]
enum Place {
    /// Converted: its index in the snapshot's pods, and its registration's.
    Converted {
        pod: usize,
        registration: Option<Registered>,
    },
    /// Did not convert, for this reason.
    Failed(ConvertError),
}

#[derive(Clone, Copy, Debug)]
enum Registered {
    Row(usize),
    Refused(usize),
}

/// [`snapshot`], taking each pod object that `previous` placed from `previous`'s snapshot (the
/// one those places were made with) instead of converting it: pod conversion is most of a
/// reload's conversion, and most pods did not change since the last. The result equals
/// [`snapshot`] of the same objects. Returns the places of this conversion, for the next.
pub fn snapshot_reusing(
    objects: &Objects,
    previous: Option<(&PodPlaces, &Snapshot)>,
) -> (Snapshot, Vec<ObjectProblem>, PodPlaces) {
    let mut s = Snapshot::default();
    // At their final size (a pod makes at most one row; the rows' spare room, the unmanaged
    // pods', is given back below): growing moved every pod converted so far, a tenth of the
    // conversion (callgrind, docs/performance.md).
    s.pods.reserve_exact(objects.pods.len());
    s.rows.reserve_exact(objects.pods.len());
    s.services.reserve_exact(objects.services.len());
    s.endpoint_slices
        .reserve_exact(objects.endpoint_slices.len());
    let mut problems = Vec::new();
    let mut places = PodPlaces {
        by_object: HashMap::with_capacity(objects.pods.len()),
        reused: 0,
    };
    for (rank, pod) in pod_order(&objects.pods, previous.map(|(p, _)| p))
        .into_iter()
        .enumerate()
    {
        let address = Arc::as_ptr(pod) as usize;
        let converted = match previous.and_then(|(p, snap)| earlier(p, snap, address)) {
            Some(c) => {
                places.reused += 1;
                c
            }
            None => convert_pod(pod, MissingReadyCondition::NotReady).map(|c| Placed {
                pod: Arc::new(c.pod),
                registration: c.registration.map(|r| match r {
                    Registration::Row(row) => Held::Row(Arc::new(row)),
                    Registration::Refused(refused) => Held::Refused(refused),
                }),
            }),
        };
        let place = match converted {
            Ok(c) => {
                let registration = match c.registration {
                    Some(Held::Row(row)) => {
                        s.rows.push(row);
                        Some(Registered::Row(s.rows.len() - 1))
                    }
                    Some(Held::Refused(refused)) => {
                        s.refused_pods.push(refused);
                        Some(Registered::Refused(s.refused_pods.len() - 1))
                    }
                    None => None,
                };
                s.pods.push(c.pod);
                Place::Converted {
                    pod: s.pods.len() - 1,
                    registration,
                }
            }
            Err(error) => {
                problems.push(ObjectProblem {
                    error: error.clone(),
                });
                Place::Failed(error)
            }
        };
        places.by_object.insert(address, (pod.clone(), rank, place));
    }
    let mut keep = |r: Result<(), ConvertError>| {
        if let Err(error) = r {
            problems.push(ObjectProblem { error });
        }
    };
    for o in sorted(&objects.services, |o| &o.metadata) {
        keep(convert_service(o).map(|v| s.services.push(v)));
    }
    for o in sorted(&objects.endpoint_slices, |o| &o.metadata) {
        keep(convert_endpoint_slice(o).map(|v| s.endpoint_slices.push(v)));
    }
    for o in sorted(&objects.namespaces, |o| &o.metadata) {
        keep(convert_namespace(o).map(|v| s.namespaces.push(v)));
    }
    for o in sorted(&objects.reference_grants, |o| &o.metadata) {
        keep(convert_reference_grant(o).map(|v| s.reference_grants.push(v)));
    }
    // GRPCRoutes share the HTTPRoute list (routes.md §1), after the HTTPRoutes, as the file
    // registry reads a directory whose routes come in file order.
    // A route the converter refuses is kept with its parents, as one that routes nowhere (issue
    // #35 item 1: never dropped for the default delivery), and reported as before.
    macro_rules! routes {
        ($list:ident, $convert:ident, $unreadable:ident, $into:ident) => {
            for o in sorted(&objects.$list, |o| &o.metadata) {
                match $convert(o) {
                    Ok(v) => s.$into.push(v),
                    Err(error) => {
                        s.$into.extend($unreadable(o, &error));
                        problems.push(ObjectProblem { error });
                    }
                }
            }
        };
    }
    routes!(
        http_routes,
        convert_http_route,
        unreadable_http_route,
        http_routes
    );
    routes!(
        grpc_routes,
        convert_grpc_route,
        unreadable_grpc_route,
        http_routes
    );
    routes!(
        tls_routes,
        convert_tls_route,
        unreadable_tls_route,
        tls_routes
    );
    routes!(
        tcp_routes,
        convert_tcp_route,
        unreadable_tcp_route,
        tcp_routes
    );
    routes!(
        udp_routes,
        convert_udp_route,
        unreadable_udp_route,
        udp_routes
    );
    for o in sorted(&objects.mesh_filters, |o| &o.metadata) {
        match convert_mesh_filter(o) {
            Ok(v) => s.mesh_filters.push(v),
            Err(error) => {
                // Kept as unreadable: the Services it names refuse (issue #35 item 1).
                s.mesh_filters.extend(unreadable_mesh_filter(o, &error));
                problems.push(ObjectProblem { error });
            }
        }
    }
    for u in &objects.undecodable_mesh_filters {
        s.mesh_filters
            .push(undecodable_mesh_filter(&u.namespace, &u.name, &u.why));
    }
    s.rows.shrink_to_fit();
    (s, problems, places)
}

/// `pods` in (namespace, name) order, stably. The pods `previous` placed are unchanged objects
/// with unchanged names, so they keep the order they had there (sorted by their positions, whole
/// numbers); only the others are sorted by name and put in among them. Sorting every pod by
/// name read two strings of two pods, spread over the heap, about log n times a pod. (A store
/// keys its objects by namespace and name, so no two pods here share both.)
fn pod_order<'o>(pods: &'o [Arc<MeshPod>], previous: Option<&PodPlaces>) -> Vec<&'o Arc<MeshPod>> {
    let by_name = |a: &&Arc<MeshPod>, b: &&Arc<MeshPod>| pod_key(a).cmp(&pod_key(b));
    let Some(places) = previous else {
        let mut all: Vec<&Arc<MeshPod>> = pods.iter().collect();
        all.sort_by(by_name);
        return all;
    };
    let mut known: Vec<(usize, &Arc<MeshPod>)> = Vec::with_capacity(pods.len());
    let mut new: Vec<&Arc<MeshPod>> = Vec::new();
    for pod in pods {
        match places.by_object.get(&(Arc::as_ptr(pod) as usize)) {
            Some(&(_, rank, _)) => known.push((rank, pod)),
            None => new.push(pod),
        }
    }
    known.sort_unstable_by_key(|&(rank, _)| rank);
    new.sort_by(by_name);
    let mut out = Vec::with_capacity(pods.len());
    let mut from = 0;
    for pod in new {
        let key = pod_key(pod);
        let at = from + known[from..].partition_point(|(_, k)| pod_key(k) <= key);
        out.extend(known[from..at].iter().map(|&(_, k)| k));
        out.push(pod);
        from = at;
    }
    out.extend(known[from..].iter().map(|&(_, k)| k));
    out
}

/// A pod's conversion as the snapshot holds it: the pod and its row shared, so that an
/// unchanged pod is the same allocations in the next snapshot (cloning them was about three
/// quarters of a reusing conversion, docs/performance.md).
struct Placed {
    pod: Arc<SnapshotPod>,
    registration: Option<Held>,
}

/// A [`Registration`] as the snapshot holds it.
enum Held {
    Row(Arc<Row>),
    Refused(RefusedPod),
}

/// The conversion of the pod object at `address` as `snapshot` holds it, when `places` placed
/// it there (`None` sends the pod to be converted: an object not seen before, or a place the
/// snapshot does not have).
fn earlier(
    places: &PodPlaces,
    snapshot: &Snapshot,
    address: usize,
) -> Option<Result<Placed, ConvertError>> {
    let (_, _, place) = places.by_object.get(&address)?;
    Some(match place {
        Place::Failed(e) => Err(e.clone()),
        Place::Converted { pod, registration } => {
            let registration = match registration {
                Some(Registered::Row(i)) => Some(Held::Row(Arc::clone(snapshot.rows.get(*i)?))),
                Some(Registered::Refused(i)) => {
                    Some(Held::Refused(snapshot.refused_pods.get(*i)?.clone()))
                }
                None => None,
            };
            Ok(Placed {
                pod: Arc::clone(snapshot.pods.get(*pod)?),
                registration,
            })
        }
    })
}

/// The kinds the Kubernetes source watches, by the names [`fingerprint`] gives them (their
/// Kubernetes kinds).
pub const WATCHED_KINDS: [&str; 11] = [
    "Pod",
    "Service",
    "EndpointSlice",
    "Namespace",
    "HTTPRoute",
    "GRPCRoute",
    "TLSRoute",
    "TCPRoute",
    "UDPRoute",
    "ReferenceGrant",
    "MeshFilter",
];

/// What an object's fingerprint reads of it: its namespace (empty for a cluster-scoped object),
/// name and resourceVersion.
pub trait Versioned {
    /// `(namespace, name, resourceVersion)`.
    fn version(&self) -> (&str, &str, &str);
}

impl<K: kube::Resource> Versioned for K {
    fn version(&self) -> (&str, &str, &str) {
        let meta = self.meta();
        (
            meta.namespace.as_deref().unwrap_or(""),
            meta.name.as_deref().unwrap_or(""),
            meta.resource_version.as_deref().unwrap_or(""),
        )
    }
}

/// One object's part of a fingerprint: its kind (one of [`WATCHED_KINDS`]), namespace (empty
/// for a cluster-scoped object), name and resourceVersion.
pub type FingerprintKey<'a> = (&'a str, &'a str, &'a str, &'a str);

/// A fingerprint of the objects held: each object's kind, namespace, name and resourceVersion.
/// The same store contents give the same value in every process (what `/model` reports as
/// loaded, so a test can wait until a change it made to the API server is served).
pub fn fingerprint(objects: &Objects) -> u64 {
    fn key<'a>(kind: &'a str, o: &'a impl Versioned) -> FingerprintKey<'a> {
        let (namespace, name, version) = o.version();
        (kind, namespace, name, version)
    }
    let o = objects;
    let [
        pod,
        service,
        slice,
        namespace,
        http,
        grpc,
        tls,
        tcp,
        udp,
        grant,
        filter,
    ] = WATCHED_KINDS;
    // A pod is kept as the mesh reads it (`MeshPod`, plain data of aether-core), not as a
    // Kubernetes resource: its own `version` reads what it keeps of the metadata.
    let keys = (o.pods.iter().map(|x| {
        let (namespace, name, version) = x.version();
        (pod, namespace, name, version)
    }))
    .chain(o.services.iter().map(|x| key(service, x.as_ref())))
    .chain(o.endpoint_slices.iter().map(|x| key(slice, x.as_ref())))
    .chain(o.namespaces.iter().map(|x| key(namespace, x.as_ref())))
    .chain(o.http_routes.iter().map(|x| key(http, x.as_ref())))
    .chain(o.grpc_routes.iter().map(|x| key(grpc, x.as_ref())))
    .chain(o.tls_routes.iter().map(|x| key(tls, x.as_ref())))
    .chain(o.tcp_routes.iter().map(|x| key(tcp, x.as_ref())))
    .chain(o.udp_routes.iter().map(|x| key(udp, x.as_ref())))
    .chain(o.reference_grants.iter().map(|x| key(grant, x.as_ref())))
    .chain(o.mesh_filters.iter().map(|x| key(filter, x.as_ref())));
    fingerprint_keys(keys)
}

/// The fingerprint of a set of objects given by their keys, in any order: what [`fingerprint`]
/// computes over the stores, and the lab's fake API server over the objects it holds (so that a
/// test can wait until every daemon holds exactly what the server holds). The sum of each key's
/// [`fingerprint_of`], so that the node keeps it by changes (one object out, one in).
pub fn fingerprint_keys<'a>(keys: impl IntoIterator<Item = FingerprintKey<'a>>) -> u64 {
    keys.into_iter()
        .map(fingerprint_of)
        .fold(0, u64::wrapping_add)
}

/// One object's part of a fingerprint ([`fingerprint_keys`]).
pub fn fingerprint_of(key: FingerprintKey<'_>) -> u64 {
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same in every process, unlike `RandomState`.
    #[allow(deprecated)] // SipHasher: the one std hasher whose keys are fixed.
    let mut h = std::hash::SipHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// The pods of one snapshot: this node's pods from the node-local view (the watch with
/// `spec.nodeName=<node>`), every other pod from the cluster-wide store. For its own pods the
/// node-local view is the authority: a copy the cluster-wide store still holds (the other watch
/// may lag, or be relisting) is left out, and a pod the node-local view does not hold is not
/// this node's to serve yet. A pod that is in neither view's share is in no snapshot.
///
/// The node-local view's pods are checked again here, so a server that ignored the field
/// selector would still give each pod once.
pub fn with_local_view(
    cluster: Vec<Arc<MeshPod>>,
    local: Vec<Arc<MeshPod>>,
    node: &str,
) -> Vec<Arc<MeshPod>> {
    let on = |p: &MeshPod| p.node_name() == Some(node);
    let mut pods: Vec<Arc<MeshPod>> = cluster.into_iter().filter(|p| !on(p)).collect();
    pods.extend(local.into_iter().filter(|p| on(p)));
    pods
}

#[cfg(test)]
mod tests;
