//! The debug endpoints of the admin unix socket, which `aether debug` calls (issue #10 §3).
//! They are served on the unix socket only ([`super::admin::serve_unix`]): never on the
//! metrics listener, nor on the optional admin TCP address, since they change the log filter
//! and run `nft` in pods' namespaces. Each is bounded: a request body over
//! `debug_max_body_bytes` is answered `413` unread, a capture listing over
//! `debug_capture_timeout_ms` is killed and answered `504`.
//!
//! Every JSON answer names the node, the generation of the model it was read from, whether
//! the daemon is ready, and (`registry`) each kind of the Kubernetes source that is not synced:
//! a daemon that is not ready, or serves a kind's last store while the API server refuses it
//! (403), still answers what it holds.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use super::admin_state::Admin;
pub use super::admin_state::DebugInputs;
use crate::debug::view;
use crate::debug::{ExplainRequest, rfc3339};
use crate::proxy::{Body, respond};
use crate::state::Published;

/// The debug endpoints, by method and path, with what they answer (drives the router, the
/// docs check and the tests).
pub const DEBUG_ENDPOINTS: &[(&str, &str, &str)] = &[
    (
        "GET",
        "/debug/pods",
        "the pods this node serves: capture mode, listeners, identity; and its pods it could not serve, with why",
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
        "/debug/diagnostics",
        "what the compiler of the live model refused, dropped or flagged, each with its kind",
    ),
    (
        "GET",
        "/debug/certs",
        "the workload certificates: identity, serial, validity, rotation time",
    ),
    ("GET", "/debug/log-level", "the log filter in force"),
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
        "registry": registry_kinds(admin),
    });
    v[key] = value;
    v
}

/// Each kind of the Kubernetes source that is not synced: `{"kind", "state", "detail",
/// "error"}`, the state one of [`crate::registry::kube::watch::KindPhase`]'s names, the error
/// the API server's last answer (null: none); empty on the other sources.
fn registry_kinds(admin: &Admin) -> Value {
    let now = crate::time::wall_ms();
    admin
        .control
        .kinds
        .iter()
        .filter_map(|k| {
            let detail = k.report(now)?;
            let error = k.last_error.lock().clone();
            Some(json!({
                "kind": k.kind,
                "state": k.phase().as_str(),
                "detail": detail,
                "error": error,
            }))
        })
        .collect()
}

fn query(query: Option<&str>, key: &str) -> Option<String> {
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
            format!(
                "{} {path}: not an endpoint of the admin socket",
                parts.method
            ),
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
            "/debug/explain" => explain(admin, &body).await,
            _ => set_log_level(admin, &body),
        };
    }
    let mut published = admin.inputs.model.published();
    let q = parts.uri.query();
    match path {
        "/debug/pods" => {
            let mut v = envelope(admin, &published, "pods", pods(admin).await);
            v["not_served"] = Value::Array(admin.pods.lock().await.not_served());
            answer(StatusCode::OK, &v)
        }
        "/debug/services" => {
            let source = source_of(admin, &mut published).await;
            services(admin, &published, source, query(q, "name").as_deref())
        }
        "/debug/routes" => match source_of(admin, &mut published).await {
            Some(s) => answer(
                StatusCode::OK,
                &envelope(
                    admin,
                    &published,
                    "routes",
                    json!(view::routes(&s, &published.model)),
                ),
            ),
            None => no_source(admin),
        },
        "/debug/diagnostics" => answer(
            StatusCode::OK,
            &envelope(
                admin,
                &published,
                "diagnostics",
                Value::Array(
                    published
                        .model
                        .diagnostics
                        .iter()
                        .map(super::admin_state::diagnostic_json)
                        .collect(),
                ),
            ),
        ),
        "/debug/certs" => answer(
            StatusCode::OK,
            &envelope(admin, &published, "certs", certs(admin)),
        ),
        "/debug/log-level" => answer(
            StatusCode::OK,
            &json!({ "node": admin.node, "filter": admin.debug.logs.current() }),
        ),
        "/debug/capture" => capture(admin, query(q, "pod").as_deref()).await,
        _ => config_dump(admin, published).await,
    }
}

/// The snapshot the published model was compiled from, made off the runtime's threads when it
/// is made on demand (the Kubernetes source: from the kept model, in about the time of a walk of
/// the registry).
/// Made while a load changes the kept model, there is none: `published` is then read again,
/// until the publish that follows the load is in place (within [`SOURCE_BOUND`]).
async fn source_of(
    admin: &Admin,
    published: &mut Arc<Published>,
) -> Option<Arc<crate::model::Snapshot>> {
    let deadline = tokio::time::Instant::now() + SOURCE_BOUND;
    loop {
        let asked = published.clone();
        let made = tokio::task::spawn_blocking(move || asked.source())
            .await
            .ok()
            .flatten();
        if made.is_some() || !published.made_on_demand() || tokio::time::Instant::now() >= deadline
        {
            return made;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        *published = admin.inputs.model.published();
    }
}

/// How long a debug view waits for the model that follows a load under way.
const SOURCE_BOUND: Duration = Duration::from_secs(5);

fn no_source(admin: &Admin) -> Response<Body> {
    error(
        admin,
        StatusCode::SERVICE_UNAVAILABLE,
        "no registry snapshot beside the published model: the setting debug_keep_snapshot is off, or (Kubernetes source, where it is made when asked) the registry has changed since this model was published and the next model is on its way: ask again; services, routes and config-dump need it",
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

fn services(
    admin: &Admin,
    published: &Published,
    source: Option<Arc<crate::model::Snapshot>>,
    name: Option<&str>,
) -> Response<Body> {
    let Some(source) = source else {
        return no_source(admin);
    };
    let list = view::services(&source, &published.model, name);
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
        ids.certificates()
            .iter()
            .map(|(_, c)| {
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

async fn explain(admin: &Admin, body: &[u8]) -> Response<Body> {
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
    let mut published = admin.inputs.model.published();
    let Some(source) = source_of(admin, &mut published).await else {
        return no_source(admin);
    };
    match crate::explain::explain(&source, &published.model, &question) {
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
async fn config_dump(admin: &Admin, mut published: Arc<Published>) -> Response<Body> {
    let Some(source) = source_of(admin, &mut published).await else {
        return no_source(admin);
    };
    let model = &published.model;
    let mut dump = envelope(admin, &published, "pods", pods(admin).await);
    dump["aether_config_dump"] = json!(1);
    dump["registry_fingerprint"] = json!(
        admin
            .fingerprint
            .load(std::sync::atomic::Ordering::Acquire)
            .to_string()
    );
    dump["log_filter"] = json!(admin.debug.logs.current());
    dump["services"] = json!(view::services(&source, model, None));
    dump["routes"] = json!(view::routes(&source, model));
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
        "snapshot": &*source,
    });
    answer(StatusCode::OK, &dump)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{Ca, Identities, IdentitySettings};
    use crate::model::{Model, NodeContext, Snapshot, compile};
    use crate::node::admin::tests::{admin_with, get};
    use crate::state::ModelHandle;

    fn fixture() -> (Snapshot, Model) {
        let snapshot = crate::test_util::mp_fixture();
        let ctx = NodeContext {
            now_ms: 1_796_000_000_000,
            ..NodeContext::default()
        };
        let model = compile(&snapshot, &ctx);
        (snapshot, model)
    }

    /// A ready admin over the fixture's model and snapshot, with one certificate issued.
    fn admin(ready: bool) -> (Admin, Snapshot, Model) {
        let (snapshot, model) = fixture();
        let now = crate::time::wall();
        let ids = Identities::new(
            Arc::new(Ca::generate(now).unwrap()),
            IdentitySettings::default(),
        )
        .unwrap();
        ids.certificate("mp", "mp-client", now).unwrap();
        let handle = ModelHandle::with_source(model.clone(), Some(snapshot.clone()));
        let debug = DebugInputs {
            identities: Some(Arc::new(ids)),
            max_body_bytes: 1024,
            ..DebugInputs::detached()
        };
        (admin_with(ready, handle, debug), snapshot, model)
    }

    async fn ask(admin: &Admin, method: &str, uri: &str, body: &str) -> (StatusCode, Value) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .body(http_body_util::Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let r = handle(admin, req).await;
        let status = r.status();
        let body = r.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).unwrap())
    }

    /// A question from mp-client; `host`: one Host field (default: the dialled authority).
    fn question(dial: &str, host: Option<&str>) -> String {
        json!({
            "from": "mp/mp-client",
            "dial": dial,
            "host": host.into_iter().collect::<Vec<_>>(),
        })
        .to_string()
    }

    #[tokio::test]
    async fn explain_answers_from_the_published_model_exactly_as_offline_explain() {
        let (admin, snapshot, model) = admin(true);
        let body = question(
            "mp-multi.mp.aether.internal:8080",
            Some("mp-multi.mp.aether.internal:9090"),
        );
        let (status, v) = ask(&admin, "POST", "/debug/explain", &body).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["generation"], 1);
        assert_eq!(v["ready"], true);
        assert_eq!(v["explanation"]["request"]["status"], 421);
        assert_eq!(v["explanation"]["request"]["reason"], "port-mismatch");
        let request: ExplainRequest = serde_json::from_str(&body).unwrap();
        let offline =
            crate::explain::explain(&snapshot, &model, &request.question().unwrap()).unwrap();
        assert_eq!(v["explanation"], json!(offline));
        // A delivery names its pod port and pods.
        let body = question("mp-multi.mp.aether.internal:9090", None);
        let (_, v) = ask(&admin, "POST", "/debug/explain", &body).await;
        let step = &v["explanation"]["request"];
        assert_eq!(step["outcome"], "deliver", "{v}");
        assert_eq!(step["pod_port"], 9090);
        assert!(
            step["pods"].as_array().is_some_and(|p| !p.is_empty()),
            "{v}"
        );
    }

    #[tokio::test]
    async fn bad_questions_unknown_objects_and_oversized_bodies_get_clear_errors() {
        let (admin, ..) = admin(true);
        let cases = [
            (
                "POST",
                "/debug/explain",
                json!({"from": "mp/nobody", "dial": "mp-multi.mp.aether.internal:8080"})
                    .to_string(),
                StatusCode::NOT_FOUND,
                "no such pod",
            ),
            (
                "POST",
                "/debug/explain",
                "{not json".to_owned(),
                StatusCode::BAD_REQUEST,
                "not an explain request",
            ),
            (
                "POST",
                "/debug/explain",
                json!({"from": "mp/mp-client", "dial": "mp-multi"}).to_string(),
                StatusCode::BAD_REQUEST,
                "--dial",
            ),
            (
                "POST",
                "/debug/explain",
                json!({"from": "mp/mp-client", "dial": "x:1", "bytes": "smtp"}).to_string(),
                StatusCode::BAD_REQUEST,
                "--bytes",
            ),
            (
                "POST",
                "/debug/explain",
                "x".repeat(1025),
                StatusCode::PAYLOAD_TOO_LARGE,
                "debug_max_body_bytes",
            ),
            (
                "GET",
                "/debug/services?name=mp/nothing",
                String::new(),
                StatusCode::NOT_FOUND,
                "no mesh service",
            ),
            (
                "GET",
                "/debug/capture?pod=mp/mp-multi-0",
                String::new(),
                StatusCode::NOT_FOUND,
                "not served by this node",
            ),
            (
                "GET",
                "/debug/capture",
                String::new(),
                StatusCode::BAD_REQUEST,
                "?pod=<namespace>/<name>",
            ),
            (
                "POST",
                "/debug/log-level",
                "aether=shouty".to_owned(),
                StatusCode::BAD_REQUEST,
                "not valid",
            ),
            (
                "DELETE",
                "/debug/pods",
                String::new(),
                StatusCode::METHOD_NOT_ALLOWED,
                "not an endpoint",
            ),
        ];
        for (method, uri, body, want, text) in cases {
            let (status, v) = ask(&admin, method, uri, &body).await;
            assert_eq!(status, want, "{method} {uri}: {v}");
            let error = v["error"].as_str().unwrap_or_default();
            assert!(error.contains(text), "{method} {uri}: {error:?}");
            assert_eq!(v["node"], "node-a");
        }
        assert_eq!(admin.debug.logs.current(), "info");
    }

    #[tokio::test]
    async fn without_the_snapshot_the_views_that_need_it_say_so_and_the_others_answer() {
        let (snapshot, model) = fixture();
        drop(snapshot);
        let admin = admin_with(
            true,
            ModelHandle::with_source(model, None),
            DebugInputs::detached(),
        );
        for path in ["/debug/services", "/debug/routes", "/config_dump"] {
            let (status, v) = ask(&admin, "GET", path, "").await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {v}");
            assert!(
                v["error"]
                    .as_str()
                    .unwrap()
                    .contains("debug_keep_snapshot is off"),
                "{path}: {v}"
            );
        }
        let (status, v) = ask(&admin, "GET", "/debug/pods", "").await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }

    #[tokio::test]
    async fn every_view_answers_with_its_generation_and_a_not_ready_daemon_says_so() {
        let (admin, ..) = admin(false);
        for (method, path, _) in DEBUG_ENDPOINTS {
            let (uri, body) = match *path {
                "/debug/capture" => continue,
                "/debug/explain" => (*path, question("mp-httponly.mp.aether.internal:8080", None)),
                "/debug/log-level" if *method == "POST" => (*path, "debug".to_owned()),
                _ => (*path, String::new()),
            };
            let (status, v) = ask(&admin, method, uri, &body).await;
            assert_eq!(status, StatusCode::OK, "{method} {path}: {v}");
            if *path != "/debug/log-level" {
                assert_eq!(v["ready"], false, "{path}: {v}");
                assert_eq!(v["generation"], 1, "{path}: {v}");
            }
        }
        assert_eq!(admin.debug.logs.current(), "debug");
        let (_, v) = ask(&admin, "GET", "/debug/services?name=mp%2Fmp-multi", "").await;
        let svc = &v["services"][0];
        assert_eq!(svc["name"], "mp-multi");
        assert_eq!(v["services"].as_array().unwrap().len(), 1);
        assert!(
            svc["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["port"] == 8080 && p["class"] == "http"),
            "{svc}"
        );
        let (_, v) = ask(&admin, "GET", "/debug/certs", "").await;
        let cert = &v["certs"][0];
        assert_eq!(
            cert["identity"],
            "spiffe://cluster.local/ns/mp/sa/mp-client"
        );
        assert!(cert["serial"].as_str().is_some_and(|s| s.contains(':')));
        assert!(cert["not_after"].as_str().unwrap() > cert["rotates_at"].as_str().unwrap());
        let (_, v) = ask(&admin, "GET", "/debug/routes", "").await;
        assert!(
            v["routes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["kind"] == "UDPRoute" && r["name"] == "mp-udp"),
            "{v}"
        );
    }

    /// A kind refused (403) after its first list: a ready daemon's answers carry it under
    /// `registry`, with the server's error (the admin socket is root's; `/ready` leaves it out).
    #[tokio::test]
    async fn a_kind_refused_after_its_list_is_in_every_answer_with_its_state_and_error() {
        use crate::registry::kube::watch::KindState;
        use std::sync::atomic::Ordering;
        let (mut admin, ..) = admin(true);
        let routes = KindState::new("HTTPRoute");
        routes.synced.store(true, Ordering::Release);
        routes.forbidden.store(true, Ordering::Release);
        *routes.last_error.lock() = Some("403 Forbidden".into());
        let pods = KindState::new("Pod");
        pods.synced.store(true, Ordering::Release);
        admin.control = Arc::new(crate::node::telemetry::ControlCollector {
            kinds: vec![Arc::new(pods), Arc::new(routes)],
            ..Default::default()
        });
        let (_, v) = ask(&admin, "GET", "/debug/pods", "").await;
        assert_eq!(v["ready"], true);
        let kinds = v["registry"].as_array().unwrap();
        assert_eq!(kinds.len(), 1, "{v}");
        assert_eq!(kinds[0]["kind"], "HTTPRoute");
        assert_eq!(kinds[0]["state"], "forbidden-stale");
        assert_eq!(kinds[0]["error"], "403 Forbidden");
    }

    #[test]
    fn docs_debug_md_lists_every_endpoint_with_its_methods() {
        let docs = include_str!("../../docs/debug.md");
        for (method, path, _) in DEBUG_ENDPOINTS {
            let row = docs
                .lines()
                .find(|l| l.starts_with(&format!("| `{path}")))
                .unwrap_or_else(|| panic!("docs/debug.md has no row for {path}"));
            assert!(row.contains(method), "{path}: {row} does not name {method}");
        }
    }

    #[tokio::test]
    async fn a_config_dump_holds_no_key_and_compiles_to_the_served_model() {
        let (admin, _, model) = admin(true);
        let (status, v) = ask(&admin, "GET", "/config_dump", "").await;
        assert_eq!(status, StatusCode::OK);
        let text = v.to_string();
        assert!(!text.contains("PRIVATE KEY"), "a key in the dump");
        assert!(
            !text.contains("BEGIN CERTIFICATE"),
            "a certificate body in the dump"
        );
        for key in [
            "pods",
            "services",
            "routes",
            "certs",
            "diagnostics",
            "log_filter",
        ] {
            assert!(v.get(key).is_some(), "no {key}");
        }
        let inputs = view::compile_inputs(&v).unwrap();
        assert_eq!(inputs.generation, 1);
        assert_eq!(compile(&inputs.snapshot, &inputs.context), model);
    }

    #[tokio::test]
    async fn the_debug_endpoints_are_on_the_unix_socket_only() {
        let (admin, ..) = admin(true);
        let admin = Arc::new(admin);
        let dir = std::env::temp_dir().join(format!("aether-debug-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("admin.sock");
        let _ = std::fs::remove_file(&sock);
        let unix = tokio::net::UnixListener::bind(&sock).unwrap();
        tokio::spawn(super::super::admin::serve_unix(admin.clone(), unix));
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp_addr = tcp.local_addr().unwrap();
        tokio::spawn(super::super::admin::serve_tcp(admin.clone(), tcp));
        let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let metrics_addr = metrics.local_addr().unwrap();
        tokio::spawn(super::super::admin::serve_metrics(
            admin.clone(),
            metrics,
            8,
        ));
        let gets = DEBUG_ENDPOINTS
            .iter()
            .filter(|(m, p, _)| *m == "GET" && *p != "/debug/capture");
        for (_, path, _) in gets {
            let unix = get(tokio::net::UnixStream::connect(&sock).await.unwrap(), path).await;
            assert!(unix.starts_with("HTTP/1.1 200"), "unix {path}: {unix}");
            let tcp = get(
                tokio::net::TcpStream::connect(tcp_addr).await.unwrap(),
                path,
            )
            .await;
            assert!(tcp.starts_with("HTTP/1.1 404"), "admin TCP {path}: {tcp}");
            let m = get(
                tokio::net::TcpStream::connect(metrics_addr).await.unwrap(),
                path,
            )
            .await;
            assert!(m.starts_with("HTTP/1.1 404"), "metrics {path}: {m}");
        }
        // The client reads the same socket.
        let args = crate::debug::client::DebugArgs {
            state_dir: dir.clone(),
            output: crate::debug::client::Output::Json,
            command: crate::debug::client::DebugCommand::Services {
                name: Some("mp-nine".into()),
            },
        };
        let printed = crate::debug::client::run(&args).await.unwrap();
        let v: Value = serde_json::from_str(&printed.out).unwrap();
        assert_eq!(v["services"][0]["name"], "mp-nine");
        assert!(printed.notes.is_empty());
        let args = crate::debug::client::DebugArgs {
            command: crate::debug::client::DebugCommand::Services {
                name: Some("mp/none".into()),
            },
            ..args
        };
        let err = crate::debug::client::run(&args).await.unwrap_err();
        assert!(err.to_string().contains("404: no mesh service"), "{err}");
        // `aether debug access-log`: set, then read back; a bad mode changes nothing.
        let access = |mode: Option<&str>| crate::debug::client::DebugArgs {
            state_dir: dir.clone(),
            output: crate::debug::client::Output::Json,
            command: crate::debug::client::DebugCommand::AccessLog {
                mode: mode.map(str::to_owned),
            },
        };
        let set = crate::debug::client::run(&access(Some("sample=10")))
            .await
            .unwrap();
        let v: Value = serde_json::from_str(&set.out).unwrap();
        assert_eq!(v["access_log"], "sample=10");
        let err = crate::debug::client::run(&access(Some("loud")))
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("\"loud\" is not off, on or sample=N"),
            "{err}"
        );
        let read = crate::debug::client::run(&access(None)).await.unwrap();
        let v: Value = serde_json::from_str(&read.out).unwrap();
        assert_eq!(v["access_log"], "sample=10");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
