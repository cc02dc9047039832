//! Each Kubernetes object as changes of the kept model (issue #37): the key it goes by there and
//! what it puts or deletes, so that one watch event is converted and applied alone.
//!
//! Keys: `namespace/name` (a Namespace: its name); a GRPCRoute, which the model holds among the
//! HTTP routes, `grpc:namespace/name`, so that it never takes the place of an HTTPRoute of the
//! same name. A pod puts its pod, and its row or its refusal, all under its own key, and deletes
//! the ones it no longer gives. The objects are those `snapshot` makes of
//! the same stores; the node's test of the two is
//! `a_kept_model_fed_by_watch_events_is_the_compile_of_the_stores`.

use crate::prelude::*;

use std::sync::Arc;

use gateway_api::experimental::grpcroutes::GrpcRoute;
use gateway_api::experimental::httproutes::HttpRoute;
use gateway_api::experimental::referencegrants::ReferenceGrant;
use gateway_api::experimental::tcproutes::TcpRoute;
use gateway_api::experimental::tlsroutes::TlsRoute;
use gateway_api::experimental::udproutes::UdpRoute;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::super::pod::MeshPod;
use super::{
    ConvertError, MissingReadyCondition, Registration, convert_endpoint_slice, convert_grpc_route,
    convert_http_route, convert_mesh_filter, convert_namespace, convert_pod,
    convert_reference_grant, convert_service, convert_tcp_route, convert_tls_route,
    convert_udp_route, undecodable_mesh_filter, unreadable_grpc_route, unreadable_http_route,
    unreadable_mesh_filter, unreadable_tcp_route, unreadable_tls_route, unreadable_udp_route,
};
use crate::model::live::{Change, Kind, Object};
use crate::registry::kube::mesh_filter::MeshFilterResource;

/// The kinds the Kubernetes source watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Watched {
    /// Pods (cluster-wide, and this node's own view).
    Pod,
    /// Services.
    Service,
    /// EndpointSlices.
    EndpointSlice,
    /// Namespaces.
    Namespace,
    /// HTTPRoutes.
    HttpRoute,
    /// GRPCRoutes.
    GrpcRoute,
    /// TLSRoutes.
    TlsRoute,
    /// TCPRoutes.
    TcpRoute,
    /// UDPRoutes.
    UdpRoute,
    /// ReferenceGrants.
    ReferenceGrant,
    /// MeshFilters.
    MeshFilter,
}

impl Watched {
    /// The kind named `kind` (its Kubernetes kind; the node-local pod view is a `Pod`).
    pub fn of(kind: &str) -> Option<Self> {
        Some(match kind {
            "Pod" | "Pod (this node)" => Self::Pod,
            "Service" => Self::Service,
            "EndpointSlice" => Self::EndpointSlice,
            "Namespace" => Self::Namespace,
            "HTTPRoute" => Self::HttpRoute,
            "GRPCRoute" => Self::GrpcRoute,
            "TLSRoute" => Self::TlsRoute,
            "TCPRoute" => Self::TcpRoute,
            "UDPRoute" => Self::UdpRoute,
            "ReferenceGrant" => Self::ReferenceGrant,
            "MeshFilter" => Self::MeshFilter,
            _ => return None,
        })
    }
}

/// The key of the object `namespace`/`name` of `kind` in the kept model.
pub fn key(kind: Watched, namespace: &str, name: &str) -> String {
    match kind {
        Watched::Namespace => name.to_owned(),
        Watched::GrpcRoute => format!("grpc:{namespace}/{name}"),
        _ => format!("{namespace}/{name}"),
    }
}

/// What one object gives the kept model: its changes, and why it was left out or kept as
/// unreadable, when it was.
#[derive(Debug, Default)]
pub struct Keyed {
    /// Puts and deletions, in order.
    pub changes: Vec<Change>,
    /// The object did not convert.
    pub problem: Option<ConvertError>,
}

impl Keyed {
    fn put(&mut self, key: &Arc<str>, object: Object) {
        self.changes.push(Change::put(key.clone(), object));
    }

    fn delete(&mut self, kind: Kind, key: &Arc<str>) {
        self.changes.push(Change::delete(kind, key.clone()));
    }
}

/// One object of `kind` now (`None`: gone), under `key` ([`key`]). A pod that converts puts its
/// pod and its row or refusal; every other object puts itself; one that does not convert is
/// deleted (a route or MeshFilter is put as unreadable instead) and its problem given.
pub fn changes(kind: Watched, key: &str, object: Option<Any<'_>>) -> Keyed {
    let key: Arc<str> = key.into();
    let mut out = Keyed::default();
    match (kind, object) {
        (Watched::Pod, Some(Any::Pod(p))) => {
            match convert_pod(p, MissingReadyCondition::NotReady) {
                Ok(c) => {
                    out.put(&key, Object::Pod(Arc::new(c.pod)));
                    match c.registration {
                        Some(Registration::Row(row)) => {
                            out.put(&key, Object::Row(Arc::new(row)));
                            out.delete(Kind::RefusedPod, &key);
                        }
                        Some(Registration::Refused(r)) => {
                            out.delete(Kind::Row, &key);
                            out.put(&key, Object::RefusedPod(Box::new(r)));
                        }
                        None => {
                            out.delete(Kind::Row, &key);
                            out.delete(Kind::RefusedPod, &key);
                        }
                    }
                }
                Err(e) => {
                    out.problem = Some(e);
                    gone(Watched::Pod, &key, &mut out);
                }
            }
        }
        (_, Some(Any::Pod(_))) | (Watched::Pod, Some(_)) | (_, None) => gone(kind, &key, &mut out),
        (_, Some(object)) => {
            let (converted, problem) = other(object);
            out.problem = problem;
            match converted {
                Some(o) => out.put(&key, o),
                None => gone(kind, &key, &mut out),
            }
        }
    }
    out
}

/// A MeshFilter that did not decode: kept as unreadable over its whole namespace (issue #35
/// item 1), under `key`.
pub fn undecodable_filter(key: &str, namespace: &str, name: &str, why: &str) -> Keyed {
    let key: Arc<str> = key.into();
    let mut out = Keyed::default();
    out.put(
        &key,
        Object::MeshFilter(Box::new(undecodable_mesh_filter(namespace, name, why))),
    );
    out
}

/// The deletions of what an object of `kind` under `key` could have put.
pub fn gone(kind: Watched, key: &Arc<str>, out: &mut Keyed) {
    let kinds: &[Kind] = match kind {
        Watched::Pod => &[Kind::Pod, Kind::Row, Kind::RefusedPod],
        Watched::Service => &[Kind::Service],
        Watched::EndpointSlice => &[Kind::EndpointSlice],
        Watched::Namespace => &[Kind::Namespace],
        Watched::HttpRoute | Watched::GrpcRoute => &[Kind::HttpRoute],
        Watched::TlsRoute => &[Kind::TlsRoute],
        Watched::TcpRoute => &[Kind::TcpRoute],
        Watched::UdpRoute => &[Kind::UdpRoute],
        Watched::ReferenceGrant => &[Kind::ReferenceGrant],
        Watched::MeshFilter => &[Kind::MeshFilter],
    };
    for &k in kinds {
        out.delete(k, key);
    }
}

/// One object of any watched kind, borrowed.
#[derive(Clone, Copy, Debug)]
pub enum Any<'a> {
    /// A pod.
    Pod(&'a MeshPod),
    /// A Service.
    Service(&'a Service),
    /// An EndpointSlice.
    EndpointSlice(&'a EndpointSlice),
    /// A Namespace.
    Namespace(&'a Namespace),
    /// An HTTPRoute.
    HttpRoute(&'a HttpRoute),
    /// A GRPCRoute.
    GrpcRoute(&'a GrpcRoute),
    /// A TLSRoute.
    TlsRoute(&'a TlsRoute),
    /// A TCPRoute.
    TcpRoute(&'a TcpRoute),
    /// A UDPRoute.
    UdpRoute(&'a UdpRoute),
    /// A ReferenceGrant.
    ReferenceGrant(&'a ReferenceGrant),
    /// A MeshFilter.
    MeshFilter(&'a MeshFilterResource),
}

/// Any object but a pod, converted: what it puts (`None`: nothing), and its problem.
fn other(object: Any<'_>) -> (Option<Object>, Option<ConvertError>) {
    fn plain<T>(
        r: Result<T, ConvertError>,
        into: impl FnOnce(T) -> Object,
    ) -> (Option<Object>, Option<ConvertError>) {
        match r {
            Ok(v) => (Some(into(v)), None),
            Err(e) => (None, Some(e)),
        }
    }
    // A route or MeshFilter that does not convert is kept as one that routes nowhere or
    // refuses (issue #35 item 1).
    macro_rules! kept {
        ($o:expr, $convert:ident, $unreadable:ident, $variant:ident) => {
            match $convert($o) {
                Ok(v) => (Some(Object::$variant(Box::new(v))), None),
                Err(e) => (
                    $unreadable($o, &e).map(|v| Object::$variant(Box::new(v))),
                    Some(e),
                ),
            }
        };
    }
    match object {
        Any::Pod(_) => (None, None),
        Any::Service(o) => plain(convert_service(o), |v| Object::Service(Box::new(v))),
        Any::EndpointSlice(o) => plain(convert_endpoint_slice(o), |v| {
            Object::EndpointSlice(Box::new(v))
        }),
        Any::Namespace(o) => plain(convert_namespace(o), |v| Object::Namespace(v.into())),
        Any::ReferenceGrant(o) => plain(convert_reference_grant(o), |v| {
            Object::ReferenceGrant(Box::new(v))
        }),
        Any::HttpRoute(o) => kept!(o, convert_http_route, unreadable_http_route, HttpRoute),
        Any::GrpcRoute(o) => kept!(o, convert_grpc_route, unreadable_grpc_route, HttpRoute),
        Any::TlsRoute(o) => kept!(o, convert_tls_route, unreadable_tls_route, TlsRoute),
        Any::TcpRoute(o) => kept!(o, convert_tcp_route, unreadable_tcp_route, TcpRoute),
        Any::UdpRoute(o) => kept!(o, convert_udp_route, unreadable_udp_route, UdpRoute),
        Any::MeshFilter(o) => kept!(o, convert_mesh_filter, unreadable_mesh_filter, MeshFilter),
    }
}
