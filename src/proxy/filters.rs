//! Running filters on live requests and responses: the data-plane side of the filter plans the
//! model compiles (routes.md §4, §5).
//!
//! May import: `mesh_call` (the `ext_authz` check), `respond`; never `http` or `hop`.
//! Invariant: authorization fails closed (no answer, a server error or a mesh answer on the
//! check's path is `authz-unavailable`).

use std::time::Duration;

use http::header::HeaderMap;
use http::{HeaderName, HeaderValue, Request, Response};
use http_body_util::BodyExt;

use super::{Body, Inputs, Peer, PodCtx, respond};
use crate::model::filters::apply_header_modifier;
use crate::model::snapshot::{
    ExtAuthz, FilterConfig, HeaderModifier, HeaderMutation, Principal, Rbac, RbacAction,
};
use crate::resolve::answer::{MESH_HEADER_PREFIX, Reason};
use crate::resolve::decision::ServiceKey;

/// Authorization check header: the Service whose filter asks (`ns/name`). Not an `x-aether-`
/// header: those are removed from every request the mesh delivers (I12), the check included.
/// A client's own copy is never passed into a check.
pub const AUTHZ_SERVICE: &str = "x-authz-service";
/// Authorization check header: the caller's SPIFFE ID.
pub const AUTHZ_CALLER: &str = "x-authz-caller";

/// Remove every `x-aether-` header (addressing.md I12).
pub fn strip_mesh_headers(headers: &mut HeaderMap) {
    // The common case, none, allocates nothing.
    if !headers
        .keys()
        .any(|n| n.as_str().starts_with(MESH_HEADER_PREFIX))
    {
        return;
    }
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|n| n.as_str().starts_with(MESH_HEADER_PREFIX))
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

/// Apply a Gateway API header modifier to a header map.
pub fn modify_headers(headers: &mut HeaderMap, modifier: &HeaderModifier) {
    if modifier.set.is_empty() && modifier.add.is_empty() && modifier.remove.is_empty() {
        return;
    }
    let mut pairs: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into(),
            )
        })
        .collect();
    apply_header_modifier(modifier, &mut pairs);
    headers.clear();
    for (k, v) in pairs {
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v)) {
            headers.append(k, v);
        }
    }
}

/// A service-level or route-level `header_mutation`, request side (headers and query).
pub fn mutate_request<B>(req: &mut Request<B>, m: &HeaderMutation) {
    modify_headers(req.headers_mut(), &m.request);
    if !m.query.is_empty() {
        let pq = req
            .uri()
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        let next = crate::model::filters::apply_query_mutations(&m.query, pq);
        set_path(req, &next);
    }
}

/// Replace a request's path and query, keeping scheme and authority.
pub fn set_path<B>(req: &mut Request<B>, path_and_query: &str) {
    let mut parts = req.uri().clone().into_parts();
    if let Ok(pq) = http::uri::PathAndQuery::try_from(path_and_query) {
        parts.path_and_query = Some(pq);
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
    }
}

fn principal_matches(p: &Principal, peer: &Peer) -> bool {
    p.namespace.as_deref().is_none_or(|ns| ns == peer.namespace)
        && p.service_account
            .as_deref()
            .is_none_or(|sa| sa == peer.service_account)
}

/// Whether an `rbac` filter lets `peer` through.
pub fn rbac_allows(rbac: &Rbac, peer: &Peer) -> bool {
    let hit = rbac.principals.iter().any(|p| principal_matches(p, peer));
    match rbac.action {
        RbacAction::Allow => hit,
        RbacAction::Deny => !hit,
    }
}

/// Run an authorization filter (`rbac`, `ext_authz`) for `service`; `Some` is the denial.
/// `header_mutation` is not an authorization filter and passes.
pub async fn authorize<B>(
    inputs: &Inputs,
    pod: &PodCtx,
    config: &FilterConfig,
    service: &ServiceKey,
    peer: &Peer,
    req: &Request<B>,
) -> Option<Response<Body>> {
    match config {
        FilterConfig::HeaderMutation(_) => None,
        FilterConfig::Rbac(rbac) => {
            (!rbac_allows(rbac, peer)).then(|| respond::reason(Reason::AuthzDenied))
        }
        FilterConfig::ExtAuthz(ext) => ext_authz(inputs, pod, ext, service, peer, req).await,
    }
}

/// One external authorization check (docs/mesh-filter.md): the request's method, path and
/// headers, plus the asking Service and the caller, to the authorization server through the
/// mesh. 2xx allows; a 4xx (or another non-2xx status that is not an error) denies, with
/// the server's status (`403` for a status that is not 4xx) and body; no answer (unreachable,
/// timeout), a 5xx or a mesh answer on the check's path denies with `authz-unavailable`
/// (fail closed).
async fn ext_authz<B>(
    inputs: &Inputs,
    pod: &PodCtx,
    ext: &ExtAuthz,
    service: &ServiceKey,
    peer: &Peer,
    req: &Request<B>,
) -> Option<Response<Body>> {
    let Some(server) = ext.server.as_deref() else {
        return Some(respond::reason(Reason::AuthzUnavailable));
    };
    let mut check = Request::builder()
        .method(req.method())
        .uri(req.uri().path_and_query().map_or("/", |p| p.as_str()));
    for (k, v) in req.headers() {
        if k != http::header::HOST
            && !k.as_str().starts_with(MESH_HEADER_PREFIX)
            && k.as_str() != AUTHZ_SERVICE
            && k.as_str() != AUTHZ_CALLER
        {
            check = check.header(k, v);
        }
    }
    let check = check
        .header(http::header::HOST, server)
        .header(
            AUTHZ_SERVICE,
            format!("{}/{}", service.namespace, service.name),
        )
        .header(AUTHZ_CALLER, peer.id.as_str())
        .body(respond::empty());
    let Ok(check) = check else {
        return Some(respond::reason(Reason::AuthzUnavailable));
    };
    let timeout = Duration::from_millis(ext.timeout_ms.max(1));
    let answer = tokio::time::timeout(
        timeout,
        super::mesh_call::mesh_call(inputs, pod, server, check),
    )
    .await
    .ok()
    .flatten();
    let Some(resp) = answer else {
        return Some(respond::reason(Reason::AuthzUnavailable));
    };
    let status = resp.status();
    // A mesh answer on the check's own path (no endpoint, unreachable) or a server error is
    // an unavailable server, not a denial: authorization fails closed (addressing.md §11.1).
    let unavailable = status.is_server_error()
        || resp
            .headers()
            .contains_key(crate::resolve::answer::HEADER_ERROR);
    // The body is read to its end either way: a dropped HTTP/2 response resets its stream,
    // and a hop connection that resets many gets closed by the h2 crate.
    let body = tokio::time::timeout(timeout, resp.into_body().collect())
        .await
        .ok()
        .and_then(Result::ok)
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    if status.is_success() {
        None
    } else if unavailable {
        Some(respond::reason(Reason::AuthzUnavailable))
    } else {
        Some(respond::authz_denied(status, body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(ns: &str, sa: &str) -> Peer {
        Peer {
            namespace: ns.into(),
            service_account: sa.into(),
            id: format!("spiffe://cluster.local/ns/{ns}/sa/{sa}"),
        }
    }

    #[test]
    fn rbac_allow_and_deny() {
        let allow = Rbac {
            action: RbacAction::Allow,
            principals: vec![Principal {
                namespace: Some("mp".into()),
                service_account: None,
            }],
        };
        assert!(rbac_allows(&allow, &peer("mp", "mp-client")));
        assert!(!rbac_allows(&allow, &peer("mp-other", "mp-client")));
        let deny = Rbac {
            action: RbacAction::Deny,
            principals: vec![Principal {
                namespace: None,
                service_account: Some("mp-client".into()),
            }],
        };
        assert!(!rbac_allows(&deny, &peer("mp", "mp-client")));
        assert!(rbac_allows(&deny, &peer("mp", "other")));
        let nobody = Rbac {
            action: RbacAction::Allow,
            principals: vec![],
        };
        assert!(!rbac_allows(&nobody, &peer("mp", "mp-client")));
    }

    #[test]
    fn mesh_headers_are_stripped_and_modifiers_apply() {
        let mut h = HeaderMap::new();
        h.insert("x-aether-error", HeaderValue::from_static("port-mismatch"));
        h.insert("x-aether-caller", HeaderValue::from_static("forged"));
        h.insert("x-keep", HeaderValue::from_static("1"));
        strip_mesh_headers(&mut h);
        assert_eq!(h.len(), 1);
        modify_headers(
            &mut h,
            &HeaderModifier {
                set: vec![("x-keep".into(), "2".into())],
                add: vec![("x-svc".into(), "1".into())],
                remove: vec![],
            },
        );
        assert_eq!(h.get("x-keep").unwrap(), "2");
        assert_eq!(h.get("x-svc").unwrap(), "1");
    }
}
