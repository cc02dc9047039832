//! The fake API server's control API, on a unix socket, for the lab and its tests:
//!
//! | request | what it does |
//! |---|---|
//! | `POST /lab/reload` | rereads the manifest directory now; answers `{"fingerprint": "<n>"}` |
//! | `GET /lab/fingerprint` | `{"fingerprint": "<n>"}`: what every daemon reports once it holds exactly the server's objects |
//! | `POST /lab/expire` | every open watch gets `410 Gone` and the history is dropped: the next watch relists |
//! | `POST /lab/stop` | closes every connection (every watch) and refuses new ones |
//! | `POST /lab/start` | serves again |
//! | `GET /lab/objects/<group or core>/<plural>[?namespace=ns]` | the stored objects, a JSON array |
//! | `GET /lab/writes` | `[{"verb", "resource", "field_manager", "count"}]`: the API writes so far |
//!
//! [`CONTROL_ENDPOINTS`] is this table, and drives the router's test.

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use serde_json::{Value, json};

use super::ApiServer;
use super::http::{Query, json_response};
use super::resources::by_plural;
use crate::accept::Acceptor;
use crate::proxy::Body;

/// The control API's requests (method, path or path prefix).
pub const CONTROL_ENDPOINTS: &[(&str, &str)] = &[
    ("POST", "/lab/reload"),
    ("GET", "/lab/fingerprint"),
    ("POST", "/lab/expire"),
    ("POST", "/lab/stop"),
    ("POST", "/lab/start"),
    ("GET", "/lab/objects/"),
    ("GET", "/lab/writes"),
];

/// Serves the control API on `listener` until the task is aborted.
pub async fn serve(server: Arc<ApiServer>, listener: tokio::net::UnixListener) {
    let mut acceptor = Acceptor::new(listener, "lab-apiserver-control", Counter::default());
    loop {
        let (stream, _) = acceptor.accept().await;
        let server = server.clone();
        let head_timeout = server.settings().head_timeout;
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let server = server.clone();
                async move { Ok::<_, Infallible>(handle(&server, &req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(head_timeout)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn fingerprint(f: u64) -> Value {
    json!({"fingerprint": f.to_string()})
}

/// Answers one control request.
pub async fn handle<B>(server: &Arc<ApiServer>, req: &Request<B>) -> Response<Body> {
    let ok = |v: &Value| json_response(StatusCode::OK, v);
    let fail = |code: StatusCode, e: String| json_response(code, &json!({"error": e}));
    let path = req.uri().path();
    match (req.method().as_str(), path) {
        ("POST", "/lab/reload") => {
            let s = server.clone();
            match tokio::task::spawn_blocking(move || s.reload()).await {
                Ok(Ok(f)) => ok(&fingerprint(f)),
                Ok(Err(e)) => fail(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    crate::DisplayChain(&e).to_string(),
                ),
                Err(e) => fail(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            }
        }
        ("GET", "/lab/fingerprint") => ok(&fingerprint(server.fingerprint())),
        ("POST", "/lab/expire") => {
            server.expire();
            ok(&json!({}))
        }
        ("POST", "/lab/stop") => {
            server.stop();
            ok(&json!({}))
        }
        ("POST", "/lab/start") => {
            server.start();
            ok(&json!({}))
        }
        ("GET", "/lab/writes") => {
            let rows: Vec<Value> = server.read(|s| {
                s.writes()
                    .iter()
                    .map(|((verb, resource, manager), count)| {
                        json!({"verb": verb, "resource": resource, "field_manager": manager, "count": count})
                    })
                    .collect()
            });
            ok(&Value::Array(rows))
        }
        ("GET", p) if p.starts_with("/lab/objects/") => {
            let rest = &p["/lab/objects/".len()..];
            let Some((group, plural)) = rest.split_once('/') else {
                return fail(StatusCode::NOT_FOUND, format!("not a resource: {rest}"));
            };
            let group = if group == "core" { "" } else { group };
            let Some(resource) = by_plural(group, plural) else {
                return fail(StatusCode::NOT_FOUND, format!("not served: {rest}"));
            };
            let query = Query::parse(req.uri().query());
            let namespace = query.get("namespace");
            let objects: Vec<Value> = server.read(|s| {
                s.objects_of(resource)
                    .filter(|(k, _)| namespace.is_none_or(|ns| ns == k.namespace))
                    .map(|(_, v)| v.clone())
                    .collect()
            });
            ok(&Value::Array(objects))
        }
        _ => fail(StatusCode::NOT_FOUND, format!("no control request {path}")),
    }
}
