//! A request the mesh makes itself from a pod (an `ext_authz` check, a `RequestMirror` copy):
//! resolved as if the pod had sent it to its loopback proxy port, and delivered over the mesh
//! hop to one endpoint. No route filter, mirror or service-level header mutation runs on it on
//! the source side; the destination runs its own filters as on any hop request.
//!
//! May import: `balance` (the endpoint choice), `hop` (the client side), `resolve`; never `filters` or `http`, which import this
//! module (issue #7 §7: the filters → http → filters circle is gone).

use http::header::HOST;
use http::{HeaderValue, Request, Response, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::balance::{self, Loaded, Outcome};
use super::hop::{HopError, hop_form};
use super::{Body, BoxError, Inputs, PodCtx};
use crate::model::names::{AuthorityInput, HttpVersion};
use crate::resolve::decision::{HttpEntry, RequestDecision, RequestFacts};
use crate::resolve::resolve_request;

/// Why a request the mesh makes itself ([`mesh_call`], a mirror copy) was not answered.
#[derive(Debug, thiserror::Error)]
pub enum MeshCallError {
    /// The name does not resolve to a delivery from this pod.
    #[error("{0} is not delivered from this pod")]
    NotDelivered(String),
    /// The Service has no endpoint.
    #[error("{0} has no endpoints")]
    NoEndpoints(String),
    /// The hop failed.
    #[error(transparent)]
    Hop(#[from] HopError),
}

/// A request the mesh itself makes from a pod (an `ext_authz` check): resolved as if the pod
/// had sent it to its loopback proxy port, delivered over the hop. `None` when it cannot be
/// delivered.
pub async fn mesh_call(
    inputs: &Inputs,
    pod: &PodCtx,
    authority: &str,
    req: Request<Body>,
) -> Option<Response<Body>> {
    mesh_send(inputs, pod, authority, req)
        .await
        .ok()
        .map(|r| r.map(|b| b.map_err(BoxError::from).boxed()))
}

/// [`mesh_call`], saying why it failed. The endpoint is chosen by [`balance`], with one more
/// try on another when the first cannot be reached; its load lasts until the body ends.
pub async fn mesh_send(
    inputs: &Inputs,
    pod: &PodCtx,
    authority: &str,
    mut req: Request<Body>,
) -> Result<Response<Loaded<Incoming>>, MeshCallError> {
    let model = inputs.model.load();
    let hosts = [authority];
    // The call is routed on its authority, method and path, never on its headers.
    let no_headers = http::HeaderMap::new();
    let facts = RequestFacts {
        entry: HttpEntry::Loopback,
        authority: AuthorityInput {
            version: HttpVersion::Http11,
            absolute: None,
            h2_authority: None,
            hosts: &hosts,
        },
        method: req.method().as_str(),
        path_and_query: req
            .uri()
            .path_and_query()
            .map(http::uri::PathAndQuery::as_str),
        headers: &no_headers,
        hold_expired: true,
        entropy: fastrand::u64(..),
        explain: false,
    };
    let RequestDecision::Deliver(d) = resolve_request(&model, pod.caller(), &facts) else {
        return Err(MeshCallError::NotDelivered(authority.to_owned()));
    };
    super::hop::annotate(
        &mut req,
        &d.filter_services,
        Version::HTTP_11,
        d.backend.h2c,
    );
    if let Ok(v) = HeaderValue::from_str(authority) {
        req.headers_mut().insert(HOST, v);
    }
    let req = hop_form(req);
    match balance::send(inputs, pod, &d.backend.endpoints, d.backend.pod_port, req).await {
        Outcome::Reached { value, .. } => Ok(value),
        Outcome::Failed(e) => Err(MeshCallError::Hop(e)),
        Outcome::NoEndpoint => Err(MeshCallError::NoEndpoints(authority.to_owned())),
    }
}
