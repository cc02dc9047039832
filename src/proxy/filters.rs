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

use super::metrics::{AuthzKind, AuthzOutcome};
use super::{Body, Inputs, Peer, PodCtx, count, respond};
use crate::model::filters::apply_header_modifier;
use crate::model::snapshot::{ExtAuthz, FilterConfig, HeaderModifier, HeaderMutation, Rbac};
use crate::resolve::answer::{MESH_HEADER_PREFIX, Reason};
use crate::resolve::decision::ServiceKey;

pub use crate::wire::{AUTHZ_CALLER, AUTHZ_SERVICE, FORWARDED_CLIENT_CERT, MESH_ONLY};

/// The hop-by-hop fields that are not named in `Connection` (RFC 9110 §7.6.1, with the fields
/// older practice adds: `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`, `Trailer`,
/// and `HTTP2-Settings` of an `h2c` upgrade, RFC 7540 §3.2.1).
pub const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "trailer",
    "upgrade",
    "http2-settings",
];

/// What [`remove_hop_by_hop`] removed that a proxy may set again on its own terms.
#[derive(Debug, Default)]
pub struct HopByHop {
    /// The `Upgrade` field, when there was one.
    pub upgrade: Option<HeaderValue>,
    /// `upgrade` was among the `Connection` options.
    pub connection_upgrade: bool,
    /// `trailers` was among the `TE` codings (what gRPC needs on HTTP/2).
    pub te_trailers: bool,
}

fn tokens(v: &HeaderValue) -> impl Iterator<Item = &[u8]> {
    v.as_bytes()
        .split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Remove a message's hop-by-hop fields (RFC 9110 §7.6.1): `Connection`, every field it names
/// (but `Host`, which says where the request goes, never a connection option), and the fixed
/// list ([`HOP_BY_HOP`]). A proxy removes them before it forwards a message; the daemon does it
/// once, when it reads a client's request, before it adds anything of its own, so that no
/// client field can name (and so remove, on a later hop) a header the mesh sets.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) -> HopByHop {
    let mut named: Vec<HeaderName> = Vec::new();
    let mut kept = HopByHop::default();
    for v in headers.get_all(http::header::CONNECTION) {
        for t in tokens(v) {
            if t.eq_ignore_ascii_case(b"upgrade") {
                kept.connection_upgrade = true;
            }
            if let Ok(name) = HeaderName::from_bytes(t)
                && name != http::header::HOST
            {
                named.push(name);
            }
        }
    }
    kept.te_trailers = headers
        .get_all(http::header::TE)
        .iter()
        .flat_map(tokens)
        .any(|t| {
            let coding = t.split(|b| *b == b';').next().unwrap_or_default();
            coding.trim_ascii().eq_ignore_ascii_case(b"trailers")
        });
    kept.upgrade = headers.get(http::header::UPGRADE).cloned();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    kept
}

/// Make a request a client sent fit to enter the mesh, before anything reads it or adds to it:
/// remove its hop-by-hop fields ([`remove_hop_by_hop`]), its `x-aether-` headers (I12) and its
/// copies of the headers only the mesh writes ([`MESH_ONLY`]). `TE: trailers` is set again
/// when the client offered it (an HTTP/2 gRPC backend needs it). The client's protocol switch,
/// as received, is returned for the caller to carry or not (addressing.md I11).
pub fn strip_client_request(headers: &mut HeaderMap) -> HopByHop {
    let kept = remove_hop_by_hop(headers);
    strip_mesh_headers(headers);
    for name in MESH_ONLY {
        headers.remove(name);
    }
    if kept.te_trailers {
        headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    }
    kept
}

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

/// Apply a Gateway API header modifier to a header map, in place ([`apply_header_modifier`]).
/// The headers it does not touch keep their bytes, UTF-8 or not; the map is never rebuilt.
pub fn modify_headers(headers: &mut HeaderMap, modifier: &HeaderModifier) {
    apply_header_modifier(modifier, headers);
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

/// Whether an `rbac` filter lets `peer` through.
pub fn rbac_allows(rbac: &Rbac, peer: &Peer) -> bool {
    rbac.allows(&peer.namespace, &peer.service_account)
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
    let started = crate::time::now();
    let (kind, verdict) = match config {
        FilterConfig::HeaderMutation(_) => return None,
        FilterConfig::Rbac(rbac) => (
            AuthzKind::Rbac,
            (!rbac_allows(rbac, peer)).then(|| respond::reason(Reason::AuthzDenied)),
        ),
        FilterConfig::ExtAuthz(ext) => (
            AuthzKind::ExtAuthz,
            ext_authz(inputs, pod, ext, service, peer, req).await,
        ),
        // A MeshFilter the daemon cannot read could be an authorization it would skip: fail
        // closed, with the reason an authorization that cannot decide gives (issue #35 item 1).
        FilterConfig::Unreadable(_) => (
            AuthzKind::Unreadable,
            Some(respond::reason(Reason::AuthzUnavailable)),
        ),
    };
    let outcome = match verdict.as_ref().and_then(respond::answered_here) {
        None => AuthzOutcome::Allow,
        Some(Reason::AuthzUnavailable) => AuthzOutcome::Unavailable,
        Some(_) => AuthzOutcome::Deny,
    };
    inputs.metrics.authz(kind, outcome, started.elapsed());
    verdict
}

/// The check request of an `ext_authz` filter, built from scratch (docs/mesh-filter.md): the
/// method and path of `req`, its end-to-end headers (without its hop-by-hop fields, which name
/// connection options of another hop, without `Host`, `Content-Length` and `Expect`, which
/// describe its own body, and without the `x-aether-` headers and a copy of the check's own two),
/// then `Host: <server>` and the check's `x-authz-service` and `x-authz-caller`; no body.
fn check_request<B>(
    req: &Request<B>,
    server: &str,
    service: &ServiceKey,
    peer: &Peer,
) -> Option<Request<Body>> {
    let mut headers = req.headers().clone();
    remove_hop_by_hop(&mut headers);
    strip_mesh_headers(&mut headers);
    for name in [AUTHZ_SERVICE, AUTHZ_CALLER] {
        headers.remove(name);
    }
    for name in [
        http::header::HOST,
        http::header::CONTENT_LENGTH,
        http::header::EXPECT,
    ] {
        headers.remove(name);
    }
    headers.insert(http::header::HOST, HeaderValue::from_str(server).ok()?);
    let asking = format!("{}/{}", service.namespace, service.name);
    headers.insert(AUTHZ_SERVICE, HeaderValue::from_str(&asking).ok()?);
    headers.insert(AUTHZ_CALLER, HeaderValue::from_str(&peer.id).ok()?);
    let mut check = Request::builder()
        .method(req.method())
        .uri(req.uri().path_and_query().map_or("/", |p| p.as_str()))
        .body(respond::empty())
        .ok()?;
    *check.headers_mut() = headers;
    Some(check)
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
    let Some(check) = check_request(req, server, service, peer) else {
        return Some(respond::reason(Reason::AuthzUnavailable));
    };
    let timeout = Duration::from_millis(ext.timeout_ms.max(1));
    // A check the peer refused unprocessed (a daemon that drains or sheds) is sent once more
    // by the hop pool itself (`hop::Pool::send`): the check has no body.
    let call = async {
        super::mesh_call::mesh_send(inputs, pod, server, check)
            .await
            .ok()
    };
    let answer = tokio::time::timeout(timeout, call)
        .await
        .ok()
        .flatten()
        .map(|r| r.map(|b| b.map_err(super::BoxError::from).boxed()));
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
    // and a hop connection that resets many gets closed by the h2 crate. Kept up to the limit
    // only: the server is configured, not trusted with the daemon's memory.
    let (body, over) = tokio::time::timeout(
        timeout,
        read_bounded(resp.into_body(), inputs.settings.ext_authz_max_body_bytes),
    )
    .await
    .unwrap_or_default();
    if over {
        count(&inputs.stats.ext_authz_body_over_limit);
    }
    if status.is_success() {
        None
    } else if unavailable {
        Some(respond::reason(Reason::AuthzUnavailable))
    } else {
        Some(respond::authz_denied(status, body))
    }
}

/// Read `body` to its end, keeping its first `limit` bytes; whether it had more (dropped). A body
/// that fails keeps what came before.
async fn read_bounded<B>(mut body: B, limit: usize) -> (bytes::Bytes, bool)
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    let mut kept = bytes::BytesMut::new();
    let mut over = false;
    while let Some(Ok(frame)) = body.frame().await {
        if let Some(data) = frame.data_ref() {
            if kept.len() + data.len() <= limit {
                kept.extend_from_slice(data);
            } else {
                over = true;
            }
        }
    }
    (kept.freeze(), over)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::snapshot::{Principal, RbacAction};

    #[tokio::test]
    async fn an_answer_body_is_kept_up_to_the_limit_and_read_to_its_end() {
        let body = |n: usize| http_body_util::Full::new(bytes::Bytes::from(vec![b'x'; n]));
        assert_eq!(
            read_bounded(body(10), 16).await,
            (vec![b'x'; 10].into(), false)
        );
        let (kept, over) = read_bounded(body(17), 16).await;
        assert!(kept.is_empty() && over);
    }

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
    fn a_clients_hop_by_hop_fields_and_mesh_only_headers_are_removed_at_entry() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            (
                "connection",
                "x-aether-hop-services, Upgrade, x-secret, host",
            ),
            ("connection", "te"),
            ("x-secret", "1"),
            ("host", "a:80"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers;q=1, deflate"),
            ("upgrade", "websocket"),
            ("http2-settings", "AAMAAABkAARAAAAAAAIAAAAA"),
            ("trailer", "x-sum"),
            ("transfer-encoding", "chunked"),
            ("x-authz-caller", "spiffe://forged"),
            ("x-forwarded-client-cert", "forged"),
            ("x-aether-hop-services", "mp/x"),
            ("x-keep", "1"),
        ] {
            h.append(k, HeaderValue::from_static(v));
        }
        let kept = strip_client_request(&mut h);
        assert!(kept.connection_upgrade && kept.te_trailers);
        assert_eq!(kept.upgrade.unwrap(), "websocket");
        let mut names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        // `Host` is never a connection option; `TE: trailers` is set again by the mesh.
        assert_eq!(names, ["host", "te", "x-keep"]);
        assert_eq!(h.get("te").unwrap(), "trailers");
    }

    #[test]
    fn a_check_request_is_built_from_scratch_without_body_or_connection_fields() {
        let req = Request::post("/pay?x=1")
            .header("host", "shop:8080")
            .header("connection", "upgrade, x-authz-service")
            .header("upgrade", "websocket")
            .header("content-length", "5")
            .header("expect", "100-continue")
            .header("x-authz-service", "forged/forged")
            .header("x-aether-hop-services", "mp/x")
            .header("x-tenant", "a")
            .body(())
            .unwrap();
        let service = ServiceKey {
            namespace: "mp".into(),
            name: "shop".into(),
        };
        let check = check_request(&req, "authz:9191", &service, &peer("mp", "client")).unwrap();
        assert_eq!(check.method(), http::Method::POST);
        assert_eq!(check.uri(), "/pay?x=1");
        let h = check.headers();
        let mut names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["host", "x-authz-caller", "x-authz-service", "x-tenant"]
        );
        assert_eq!(h.get("host").unwrap(), "authz:9191");
        assert_eq!(h.get(AUTHZ_SERVICE).unwrap(), "mp/shop");
        assert_eq!(
            h.get(AUTHZ_CALLER).unwrap(),
            "spiffe://cluster.local/ns/mp/sa/client"
        );
    }

    #[test]
    fn a_header_modifier_keeps_the_bytes_of_the_headers_it_does_not_touch() {
        let latin1 = HeaderValue::from_bytes(b"caf\xe9").unwrap();
        let mut h = HeaderMap::new();
        h.insert("x-name", latin1.clone());
        h.append("x-multi", HeaderValue::from_bytes(b"\xff1").unwrap());
        h.append("x-multi", HeaderValue::from_static("2"));
        h.insert("x-drop", HeaderValue::from_static("1"));
        modify_headers(
            &mut h,
            &HeaderModifier {
                set: vec![("x-set".into(), "v".into())],
                add: vec![("x-multi".into(), "3".into())],
                remove: vec!["x-drop".into()],
            },
        );
        assert_eq!(h.get("x-name"), Some(&latin1), "{h:?}");
        let multi: Vec<&[u8]> = h
            .get_all("x-multi")
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        assert_eq!(multi, [&b"\xff1"[..], b"2", b"3"]);
        assert_eq!(h.get("x-set").unwrap(), "v");
        assert!(!h.contains_key("x-drop"));
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
