//! Mesh answers as HTTP responses: the one place a [`MeshAnswer`] becomes a response.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;

use super::Body;
use crate::resolve::answer::{HEADER_ERROR, MeshAnswer, Reason, grpc_code};

/// Marks a response this daemon answered itself (a response extension, which never crosses the
/// wire): a mesh answer relayed from the hop's destination does not carry it, so each answer is
/// counted once, by the daemon that made it (`aether_refusals_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnsweredHere(pub Reason);

/// The reason of a mesh answer this daemon made, if `resp` is one.
pub fn answered_here<B>(resp: &Response<B>) -> Option<Reason> {
    resp.extensions().get::<AnsweredHere>().map(|a| a.0)
}

/// The response for a mesh answer.
pub fn answer(answer: &MeshAnswer) -> Response<Body> {
    let rendered = answer.render();
    let mut resp = Response::new(full(rendered.body));
    resp.extensions_mut().insert(AnsweredHere(answer.reason));
    *resp.status_mut() =
        StatusCode::from_u16(rendered.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in rendered.headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            resp.headers_mut()
                .append(HeaderName::from_static(name), value);
        }
    }
    resp
}

/// A bare mesh answer (no service line).
pub fn reason(reason: Reason) -> Response<Body> {
    answer(&MeshAnswer::bare(reason))
}

/// `authz-denied` for an `ext_authz` server's denial (addressing.md §11.1): the server's own
/// status when it is a 4xx (`403` otherwise) and its body when it gave one, with the reason
/// header of [`Reason::AuthzDenied`].
pub fn authz_denied(server_status: StatusCode, body: Bytes) -> Response<Body> {
    let mut resp = reason(Reason::AuthzDenied);
    if server_status.is_client_error() {
        *resp.status_mut() = server_status;
    }
    if !body.is_empty() {
        *resp.body_mut() = full(body);
    }
    resp
}

/// Whether a request is a gRPC call (`content-type: application/grpc`, `+proto` and the
/// like included).
pub fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.get(..16)
                .is_some_and(|p| p.eq_ignore_ascii_case("application/grpc"))
        })
}

/// A mesh answer (it carries `x-aether-error`) to a gRPC request: add `grpc-status`, the code
/// a gRPC client derives from the HTTP status anyway ([`grpc_code`]), and `grpc-message`, the
/// reason, so that a gRPC client's error names it. The HTTP status, the reason header and the
/// body stay what addressing.md §11 says (docs/decisions.md). Any other answer is left alone.
pub fn for_grpc(resp: &mut Response<Body>) {
    let Some(reason) = resp.headers().get(HEADER_ERROR).cloned() else {
        return;
    };
    let code = grpc_code(resp.status().as_u16());
    let h = resp.headers_mut();
    h.insert("grpc-status", HeaderValue::from(u16::from(code)));
    h.insert("grpc-message", reason);
}

/// A redirect a route rule configured: no reason header (addressing.md §11.1).
pub fn redirect(status: u16, location: &str) -> Response<Body> {
    let mut resp = Response::new(empty());
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::FOUND);
    // From bytes: a Host the client sent may carry obs-text, which a visible-ASCII check would
    // refuse; only control characters make the value unusable, and then it is said.
    match HeaderValue::from_bytes(location.as_bytes()) {
        Ok(v) => {
            resp.headers_mut().insert(http::header::LOCATION, v);
        }
        Err(_) => tracing::debug!(?location, "redirect without a Location: not a header value"),
    }
    resp
}

/// A body from bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body. Allocates nothing: the body is of size zero, and so is its box.
pub fn empty() -> Body {
    http_body_util::Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}
