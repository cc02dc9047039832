//! The fake API server's control API, on a unix socket, for the lab and its tests:
//!
//! | request | what it does |
//! |---|---|
//! | `POST /lab/reload` | rereads the manifest directory now; answers `{"fingerprint": "<n>"}` |
//! | `GET /lab/fingerprint` | `{"fingerprint": "<n>"}`: what every daemon reports once it holds exactly the server's objects |
//! | `POST /lab/expire` | every open watch gets `410 Gone` and the history is dropped: the next watch relists |
//! | `POST /lab/stop` | closes every connection (every watch) and refuses new ones |
//! | `POST /lab/start` | serves again |
//! | `POST /lab/forbid?resource=<group or core>/<plural>[&verbs=get,list,watch]` | those reads of the resource (all three by default) are answered `403 Forbidden` from now on; open watches go on, as on the real server |
//! | `POST /lab/allow?resource=<group or core>/<plural>` | lifts `forbid` |
//! | `POST /lab/end-watches?resource=<group or core>/<plural>` | the resource's open watches end, as the server's watch timeout ends them; the clients watch again |
//! | `GET /lab/objects/<group or core>/<plural>[?namespace=ns]` | the stored objects, a JSON array |
//! | `GET /lab/writes` | `[{"verb", "resource", "field_manager", "count"}]`: the API writes so far (a `PUT` answered `409` as verb `update-conflict`) |
//!
//! [`CONTROL_ENDPOINTS`] is this table, and drives the router's test.

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use serde_json::{Value, json};

use super::Body;
use super::http::{Query, json_response};
use super::resources::{ResourceType, by_plural};
use super::{ApiServer, ReadVerb};
use aether::accept::Acceptor;

/// The control API's requests (method, path or path prefix).
pub const CONTROL_ENDPOINTS: &[(&str, &str)] = &[
    ("POST", "/lab/reload"),
    ("GET", "/lab/fingerprint"),
    ("POST", "/lab/expire"),
    ("POST", "/lab/stop"),
    ("POST", "/lab/start"),
    ("POST", "/lab/forbid"),
    ("POST", "/lab/allow"),
    ("POST", "/lab/end-watches"),
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

/// The resource `<group or core>/<plural>` names.
fn named_resource(name: Option<&str>) -> Result<ResourceType, String> {
    let name = name.ok_or("no resource=<group or core>/<plural>")?;
    let Some((group, plural)) = name.split_once('/') else {
        return Err(format!("not a resource: {name}"));
    };
    let group = if group == "core" { "" } else { group };
    by_plural(group, plural).ok_or_else(|| format!("not served: {name}"))
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
                    aether::DisplayChain(&e).to_string(),
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
        ("POST", "/lab/forbid" | "/lab/allow" | "/lab/end-watches") => {
            let query = Query::parse(req.uri().query());
            let resource = match named_resource(query.get("resource")) {
                Ok(r) => r,
                Err(e) => return fail(StatusCode::BAD_REQUEST, e),
            };
            match path {
                "/lab/forbid" => {
                    let verbs = match query.get("verbs") {
                        None => ReadVerb::ALL.to_vec(),
                        Some(list) => match list.split(',').map(ReadVerb::parse).collect() {
                            Some(v) => v,
                            None => {
                                return fail(
                                    StatusCode::BAD_REQUEST,
                                    format!(
                                        "verbs {list:?}: expected get, list or watch, comma-separated"
                                    ),
                                );
                            }
                        },
                    };
                    server.forbid(resource, &verbs);
                }
                "/lab/allow" => server.allow(resource),
                _ => server.end_watches(resource),
            }
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
            let resource = match named_resource(Some(&p["/lab/objects/".len()..])) {
                Ok(r) => r,
                Err(e) => return fail(StatusCode::NOT_FOUND, e),
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
