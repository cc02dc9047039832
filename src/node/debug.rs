//! The debug endpoints of the admin unix socket, which `aether debug` calls (issue #10 §3).
//! They are served on the unix socket only ([`super::admin::serve_unix`]): never on the
//! metrics listener, nor on the optional admin TCP address, since they change the log filter
//! and run `nft` in pods' namespaces. Each is bounded: a request body over
//! `debug_max_body_bytes` is answered `413` unread, a capture listing over
//! `debug_capture_timeout_ms` is killed and answered `504`.
//!
//! Every JSON answer names the node, the generation of the model it was read from and whether
//! the daemon is ready: a daemon that is not ready still answers what it holds.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use super::admin::Admin;
use crate::debug::view;
use crate::debug::{ExplainRequest, rfc3339};
use crate::identity::Identities;
use crate::log_filter::LogFilter;
use crate::proxy::{Body, respond};
use crate::state::Published;

/// The debug endpoints, by method and path, with what they answer (drives the router, the
/// docs check and the tests).
pub const DEBUG_ENDPOINTS: &[(&str, &str, &str)] = &[
    (
        "GET",
        "/debug/pods",
        "the pods this node serves: capture mode, listeners, identity",
    ),
    (
        "GET",
        "/debug/services",
        "the mesh services of the model (`?name=[<ns>/]<name>` for one): ports, classes, votes, rows, retained entries, routes",
    ),
    (
        "POST",
        "/debug/explain",
        "an `aether explain` question (JSON) answered by the live model",
    ),
    (
        "GET",
        "/debug/routes",
        "every route with its parents and computed status",
    ),
    (
        "GET",
        "/debug/certs",
        "the workload certificates: identity, serial, validity, rotation time",
    ),
    (
        "GET",
        "/debug/log-level",
        "the log filter in force",
    ),
    (
        "POST",
        "/debug/log-level",
        "set the log filter (the body, `LEVEL[,target=LEVEL]`)",
    ),
    (
        "GET",
        "/debug/capture",
        "`?pod=<ns>/<name>`: the nftables table installed in that pod's namespace",
    ),
    (
        "GET",
        "/config_dump",
        "all of the above in one document, with the model's compile inputs (`debug::view::CompileInputs`); no key",
    ),
];

/// What the debug endpoints need besides the data plane.
#[derive(Debug)]
pub struct DebugInputs {
    /// The workload certificates (`None`: none are issued here).
    pub identities: Option<Arc<Identities>>,
    /// The log filter.
    pub logs: LogFilter,
    /// The largest request body read, in bytes (`debug_max_body_bytes`).
    pub max_body_bytes: usize,
    /// The bound on a capture listing (`debug_capture_timeout_ms`).
    pub capture_timeout: Duration,
}

impl DebugInputs {
    /// No certificates, a detached log filter, the default bounds (tests).
    pub fn detached() -> Self {
        Self {
            identities: None,
            logs: LogFilter::detached("info"),
            max_body_bytes: 65536,
            capture_timeout: Duration::from_secs(5),
        }
    }
}

/// Whether `path` is one of the debug endpoints.
pub fn is_debug_path(path: &str) -> bool {
    DEBUG_ENDPOINTS.iter().any(|(_, p, _)| *p == path)
}

fn answer(code: StatusCode, value: &Value) -> Response<Body> {
    let mut r = Response::new(respond::full(value.to_string()));
    *r.status_mut() = code;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// An error answer: `{"error": text}` with the node's state, so the CLI can say both.
fn error(admin: &Admin, code: StatusCode, text: impl Into<String>) -> Response<Body> {
    answer(
        code,
        &json!({
            "node": admin.node,
            "ready": *admin.ready.borrow(),
            "error": text.into(),
        }),
    )
}

fn envelope(admin: &Admin, p: &Published, key: &str, value: Value) -> Value {
    let mut v = json!({
        "node": admin.node,
        "generation": p.generation,
        "ready": *admin.ready.borrow(),
    });
    v[key] = value;
    v
}

fn query<'a>(query: Option<&'a str>, key: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

/// Read a request body of at most `max` bytes; `None` when it is larger or breaks off.
async fn read_body<B>(body: B, max: usize) -> Option<Bytes>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    http_body_util::Limited::new(body, max)
        .collect()
        .await
        .ok()
        .map(http_body_util::Collected::to_bytes)
}

/// Answer one debug request (the path is one of [`DEBUG_ENDPOINTS`]).
pub async fn handle<B>(admin: &Admin, req: Request<B>) -> Response<Body>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    let known = DEBUG_ENDPOINTS
        .iter()
        .any(|(m, p, _)| *p == path && *m == parts.method.as_str());
    if !known {
        return error(
            admin,
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} {path}: not an endpoint of the admin socket", parts.method),
        );
    }
    if parts.method == Method::POST {
        let declared = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let max = admin.debug.max_body_bytes;
        let over = || {
            error(
                admin,
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is over {max} bytes (debug_max_body_bytes)"),
            )
        };
        if declared.is_some_and(|n| n > max) {
            return over();
        }
        let Some(body) = read_body(body, max).await else {
            return over();
        };
        return match path {
            "/debug/explain" => explain(admin, &body),
            _ => set_log_level(admin, &body),
        };
    }
    let published = admin.inputs.model.published();
    let q = parts.uri.query();
    match path {
        "/debug/pods" => answer(
            StatusCode::OK,
            &envelope(admin, &published, "pods", pods(admin).await),
        ),
        "/debug/services" => services(admin, &published, query(q, "name").as_deref()),
        "/debug/routes" => match &published.source {
            Some(s) => answer(
                StatusCode::OK,
                &envelope(
                    admin,
                    &published,
                    "routes",
                    json!(view::routes(s, &published.model)),
                ),
            ),
            None => no_source(admin),
        },
        "/debug/certs" => answer(
            StatusCode::OK,
            &envelope(admin, &published, "certs", certs(admin)),
        ),
        "/debug/log-level" => answer(
            StatusCode::OK,
            &json!({ "node": admin.node, "filter": admin.debug.logs.current() }),
        ),
        "/debug/capture" => capture(admin, query(q, "pod").as_deref()).await,
        _ => config_dump(admin, &published).await,
    }
}

fn no_source(admin: &Admin) -> Response<Body> {
    error(
        admin,
        StatusCode::SERVICE_UNAVAILABLE,
        "the daemon keeps no snapshot beside its model",
    )
}

/// The served pods, each with its SPIFFE identity.
async fn pods(admin: &Admin) -> Value {
    let mut list = admin.pods.lock().await.list();
    for pod in &mut list {
        let identity = match (&admin.debug.identities, pod["service_account"].as_str()) {
            (Some(ids), Some(sa)) => ids
                .spiffe_id(pod["namespace"].as_str().unwrap_or_default(), sa)
                .map(|id| id.to_string())
                .ok(),
            _ => None,
        };
        pod["identity"] = json!(identity);
    }
    Value::Array(list)
}

fn services(admin: &Admin, published: &Published, name: Option<&str>) -> Response<Body> {
    let Some(source) = &published.source else {
        return no_source(admin);
    };
    let list = view::services(source, &published.model, name);
    match name {
        Some(n) if list.is_empty() => error(
            admin,
            StatusCode::NOT_FOUND,
            format!(
                "no mesh service {n:?} in the model (generation {})",
                published.generation
            ),
        ),
        _ => answer(
            StatusCode::OK,
            &envelope(admin, published, "services", json!(list)),
        ),
    }
}

fn certs(admin: &Admin) -> Value {
    let Some(ids) = &admin.debug.identities else {
        return json!([]);
    };
    Value::Array(
        ids.issued()
            .iter()
            .map(|c| {
                json!({
                    "identity": c.id.to_string(),
                    "serial": c.serial(),
                    "not_before": rfc3339(c.not_before),
                    "not_after": rfc3339(c.not_after),
                    "rotates_at": rfc3339(c.rotate_at()),
                })
            })
            .collect(),
    )
}

fn explain(admin: &Admin, body: &[u8]) -> Response<Body> {
    let request: ExplainRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                admin,
                StatusCode::BAD_REQUEST,
                format!("the question is not an explain request: {e}"),
            );
        }
    };
    let question = match request.question() {
        Ok(q) => q,
        Err(e) => return error(admin, StatusCode::BAD_REQUEST, e),
    };
    let published = admin.inputs.model.published();
    let Some(source) = &published.source else {
        return no_source(admin);
    };
    match crate::explain::explain(source, &published.model, &question) {
        Ok(e) => answer(
            StatusCode::OK,
            &envelope(admin, &published, "explanation", json!(e)),
        ),
        Err(e @ crate::explain::InvalidQuestion::UnknownPod(_)) => {
            error(admin, StatusCode::NOT_FOUND, e.to_string())
        }
        Err(e) => error(admin, StatusCode::BAD_REQUEST, e.to_string()),
    }
}

fn set_log_level(admin: &Admin, body: &[u8]) -> Response<Body> {
    let text = String::from_utf8_lossy(body);
    match admin.debug.logs.set(text.trim()) {
        Ok(previous) => {
            tracing::info!(filter = %text.trim(), %previous, "log filter changed");
            answer(
                StatusCode::OK,
                &json!({ "node": admin.node, "filter": text.trim(), "previous": previous }),
            )
        }
        Err(e) => error(admin, StatusCode::BAD_REQUEST, e.to_string()),
    }
}

async fn capture(admin: &Admin, pod: Option<&str>) -> Response<Body> {
    let Some((ns, name)) = pod.and_then(|p| p.split_once('/')) else {
        return error(
            admin,
            StatusCode::BAD_REQUEST,
            "name the pod as ?pod=<namespace>/<name>",
        );
    };
    let netns = admin.pods.lock().await.netns_of(ns, name);
    let Some(netns) = netns else {
        return error(
            admin,
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{name} is not served by this node (see `aether debug pods`)"),
        );
    };
    let bound = admin.debug.capture_timeout;
    match tokio::time::timeout(bound, crate::capture::nft::list(&netns)).await {
        Err(_) => error(
            admin,
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "`nft list table` in {} took over {bound:?} (debug_capture_timeout_ms); it was stopped",
                netns.display()
            ),
        ),
        Ok(Err(e)) => error(
            admin,
            StatusCode::INTERNAL_SERVER_ERROR,
            crate::DisplayChain(&e).to_string(),
        ),
        Ok(Ok(table)) => answer(
            StatusCode::OK,
            &json!({
                "node": admin.node,
                "ready": *admin.ready.borrow(),
                "pod": format!("{ns}/{name}"),
                "netns": netns.display().to_string(),
                "table": table,
            }),
        ),
    }
}

/// Everything in one document, for bug reports: no CA key, no private key (certificates are
/// shown by their public parts). Its `compile` key is what `aether explain --config-dump`
/// compiles again.
async fn config_dump(admin: &Admin, published: &Published) -> Response<Body> {
    let Some(source) = &published.source else {
        return no_source(admin);
    };
    let model = &published.model;
    let mut dump = envelope(admin, published, "pods", pods(admin).await);
    dump["aether_config_dump"] = json!(1);
    dump["registry_fingerprint"] = json!(
        admin
            .fingerprint
            .load(std::sync::atomic::Ordering::Acquire)
            .to_string()
    );
    dump["log_filter"] = json!(admin.debug.logs.current());
    dump["services"] = json!(view::services(source, model, None));
    dump["routes"] = json!(view::routes(source, model));
    dump["certs"] = certs(admin);
    dump["diagnostics"] = json!(
        model
            .diagnostics
            .iter()
            .map(|d| json!({ "kind": d.kind.as_str(), "subject": d.subject, "detail": d.detail }))
            .collect::<Vec<_>>()
    );
    // The shape of [`CompileInputs`], serialized from borrows: no copy of the snapshot.
    dump["compile"] = json!({
        "generation": published.generation,
        "context": &model.context,
        "snapshot": &**source,
    });
    answer(StatusCode::OK, &dump)
}
