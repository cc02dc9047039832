//! The fake API server's HTTP side: routing a request to the store, lists and chunked watches,
//! and the answers as the real server words them (`Status` objects for errors).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body::Frame;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::resources::{ApiPath, parse_path};
use super::select::Filter;
use super::store::{ApiError, Key, Part};
use super::{ApiServer, ReadVerb};
use super::{Body, BoxError};
use aether::accept::Acceptor;

/// Watch events queued for a slow client before the watch waits for it.
const WATCH_QUEUE: usize = 256;

/// Serves the API on `listener` until the task is aborted (see the module doc of
/// [`super`] for the limits).
pub async fn serve(server: Arc<ApiServer>, listener: tokio::net::TcpListener) {
    let mut acceptor = Acceptor::new(listener, "lab-apiserver", Counter::default());
    let permits = Arc::new(tokio::sync::Semaphore::new(
        server.settings().max_connections,
    ));
    loop {
        let (stream, _) = acceptor.accept().await;
        let mut signal = server.subscribe();
        if signal.borrow().stopped {
            // Stopped: the connection is closed unanswered, as a server that is down would.
            drop(stream);
            continue;
        }
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::debug!("lab API server: connection over the cap closed");
            drop(stream);
            continue;
        };
        let head_timeout = server.settings().head_timeout;
        let server = server.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let server = server.clone();
                async move { Ok::<_, Infallible>(handle(&server, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(head_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                // Stopping closes every connection, and with it every watch.
                _ = signal.wait_for(|s| s.stopped) => {}
            }
            drop(permit);
        });
    }
}

/// A JSON answer.
pub(super) fn json_response(code: StatusCode, value: &Value) -> Response<Body> {
    let mut r = Response::new(super::full(value.to_string()));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn error_response(e: &ApiError) -> Response<Body> {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(code, &e.status())
}

async fn handle(server: &Arc<ApiServer>, req: Request<Incoming>) -> Response<Body> {
    match route(server, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

/// The query's parameters, decoded.
#[derive(Debug, Default)]
pub(super) struct Query(Vec<(String, String)>);

impl Query {
    pub(super) fn parse(query: Option<&str>) -> Self {
        Self(
            form_urlencoded::parse(query.unwrap_or("").as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, name: &str) -> bool {
        matches!(self.get(name), Some("true" | "1"))
    }
}

/// What one write was, for the write counts.
struct WriteOf<'a> {
    verb: &'static str,
    path: &'a ApiPath,
    manager: &'a str,
}

impl WriteOf<'_> {
    fn count(&self, server: &ApiServer) {
        let resource = if self.path.status {
            format!("{}/status", self.path.resource)
        } else {
            self.path.resource.to_string()
        };
        server.write(|s| s.count_write(self.verb, &resource, self.manager));
    }
}

async fn route(
    server: &Arc<ApiServer>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let path =
        parse_path(req.uri().path()).map_err(|e| ApiError::new(404, "NotFound", e.to_string()))?;
    let query = Query::parse(req.uri().query());
    let method = req.method().clone();
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_owned();
    let manager = query.get("fieldManager").unwrap_or("").to_owned();
    let part = if path.status {
        Part::Status
    } else {
        Part::Main
    };
    // Noted before the authorization: a watch let through just before its resource's watches
    // are ended is ended with them.
    let watches_ended = server.watches_ended(path.resource);
    if method == http::Method::GET && !path.status {
        let verb = match (&path.name, query.flag("watch")) {
            (Some(_), _) => ReadVerb::Get,
            (None, true) => ReadVerb::Watch,
            (None, false) => ReadVerb::List,
        };
        server.authorize(
            path.resource,
            verb,
            path.namespace.as_deref(),
            path.name.as_deref(),
        )?;
    }
    match (method.as_str(), path.name.is_some()) {
        ("GET", false) if query.flag("watch") => watch(server, &path, &query, watches_ended),
        ("GET", false) => list(server, &path, &query),
        ("GET", true) => {
            let key = key(&path, None)?;
            let o = server.read(|s| s.get(&key))?;
            Ok(object_response(StatusCode::OK, &path, &o))
        }
        ("POST", false) if !path.status => {
            let body = read_json(server, req).await?;
            let key = key(&path, Some(&body))?;
            let o = server.write(|s| s.create(&key, body))?;
            WriteOf {
                verb: "create",
                path: &path,
                manager: &manager,
            }
            .count(server);
            Ok(object_response(StatusCode::CREATED, &path, &o))
        }
        ("PUT", true) => {
            let body = read_json(server, req).await?;
            let key = key(&path, Some(&body))?;
            let replaced = server.write(|s| s.replace(&key, body, part));
            // A conflict is counted too: the writers' redundant writes show as `409`s.
            let verb = match &replaced {
                Ok(_) => Some("update"),
                Err(e) if e.code == 409 => Some("update-conflict"),
                Err(_) => None,
            };
            if let Some(verb) = verb {
                WriteOf {
                    verb,
                    path: &path,
                    manager: &manager,
                }
                .count(server);
            }
            let o = replaced?;
            Ok(object_response(StatusCode::OK, &path, &o))
        }
        ("PATCH", true) => {
            let (verb, o) = match content_type.as_str() {
                "application/merge-patch+json" => {
                    let patch = read_json(server, req).await?;
                    let key = key(&path, None)?;
                    ("patch", server.write(|s| s.merge(&key, &patch, part))?)
                }
                "application/apply-patch+yaml" => {
                    if manager.is_empty() {
                        return Err(ApiError::new(
                            400,
                            "BadRequest",
                            "fieldManager: Required value: is required for apply patch",
                        ));
                    }
                    let bytes = read_body(server, req).await?;
                    let applied: Value = aether::yaml::from_slice(&bytes).map_err(|e| {
                        ApiError::new(400, "BadRequest", format!("error decoding YAML: {e}"))
                    })?;
                    if applied["apiVersion"].as_str().is_none()
                        || applied["kind"].as_str().is_none()
                    {
                        return Err(ApiError::new(
                            400,
                            "BadRequest",
                            "apiVersion and kind are required for apply patch",
                        ));
                    }
                    let key = key(&path, Some(&applied))?;
                    ("apply", server.write(|s| s.apply(&key, &applied, part))?)
                }
                other => {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        format!(
                            "the lab's API server serves merge patch and apply patch, not {other:?}"
                        ),
                    ));
                }
            };
            WriteOf {
                verb,
                path: &path,
                manager: &manager,
            }
            .count(server);
            Ok(object_response(StatusCode::OK, &path, &o))
        }
        ("DELETE", true) if !path.status => {
            let key = key(&path, None)?;
            // The body, when there is one, is DeleteOptions: only its propagationPolicy is read.
            let body = read_body(server, req).await?;
            let foreground = !body.is_empty()
                && serde_json::from_slice::<Value>(&body)
                    .map_err(|e| {
                        ApiError::new(400, "BadRequest", format!("the body is not JSON: {e}"))
                    })?
                    .get("propagationPolicy")
                    .is_some_and(|p| p == "Foreground");
            let o = server.write(|s| s.delete(&key, foreground))?;
            WriteOf {
                verb: "delete",
                path: &path,
                manager: &manager,
            }
            .count(server);
            Ok(object_response(StatusCode::OK, &path, &o))
        }
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("{method} is not supported on {}", req_shape(&path)),
        )),
    }
}

fn req_shape(path: &ApiPath) -> String {
    match (&path.name, path.status) {
        (None, _) => format!("the {} collection", path.resource),
        (Some(n), false) => format!("{} {n}", path.resource),
        (Some(n), true) => format!("{} {n}/status", path.resource),
    }
}

/// The key a request addresses; the body (when given) must agree with the path.
fn key(path: &ApiPath, body: Option<&Value>) -> Result<Key, ApiError> {
    let bad = |m: String| ApiError::new(400, "BadRequest", m);
    let namespace = match (&path.namespace, path.resource.namespaced) {
        (Some(ns), true) => ns.clone(),
        (None, false) => String::new(),
        _ => {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!("{} must be addressed in a namespace", path.resource),
            ));
        }
    };
    let meta = body.map(|b| &b["metadata"]);
    if let Some(ns) = meta.and_then(|m| m["namespace"].as_str())
        && path.resource.namespaced
        && ns != namespace
    {
        return Err(bad(
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
        ));
    }
    if let Some(kind) = body.and_then(|b| b["kind"].as_str())
        && kind != path.resource.kind
    {
        return Err(bad(format!(
            "kind {kind} does not match the resource {}",
            path.resource
        )));
    }
    let body_name = meta
        .and_then(|m| m["name"].as_str())
        .filter(|n| !n.is_empty());
    let name = match (&path.name, body_name) {
        (Some(p), Some(b)) if p != b => {
            return Err(bad(
                "the name of the object does not match the name on the URL".into(),
            ));
        }
        (Some(p), _) => p.clone(),
        (None, Some(b)) => b.to_owned(),
        (None, None) => match meta.and_then(|m| m["generateName"].as_str()) {
            Some(prefix) if !prefix.is_empty() => {
                let suffix: String = (0..5).map(|_| fastrand::lowercase()).collect();
                format!("{prefix}{suffix}")
            }
            _ => {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
        },
    };
    Ok(Key {
        resource: path.resource,
        namespace,
        name,
    })
}

async fn read_body(server: &ApiServer, req: Request<Incoming>) -> Result<Bytes, ApiError> {
    let max = server.settings().max_body;
    match Limited::new(req.into_body(), max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!("the request body is over {max} bytes"),
            ))
        }
        Err(e) => Err(ApiError::new(
            400,
            "BadRequest",
            format!("reading the body: {e}"),
        )),
    }
}

async fn read_json(server: &ApiServer, req: Request<Incoming>) -> Result<Value, ApiError> {
    let bytes = read_body(server, req).await?;
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::new(400, "BadRequest", format!("the body is not JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::new(
            400,
            "BadRequest",
            "the body is not a JSON object",
        ));
    }
    Ok(v)
}

/// The object as the client asked for it: at the request's version.
fn at_version(path: &ApiPath, o: &Value) -> Value {
    let mut o = o.clone();
    o["apiVersion"] = path.resource.api_version(&path.version).into();
    o["kind"] = path.resource.kind.into();
    o
}

fn object_response(code: StatusCode, path: &ApiPath, o: &Value) -> Response<Body> {
    json_response(code, &at_version(path, o))
}

fn filter(path: &ApiPath, query: &Query) -> Result<Filter, ApiError> {
    Filter::new(path.resource, path.namespace.clone())
        .with_selectors(query.get("labelSelector"), query.get("fieldSelector"))
}

/// A list: every selected object at one resourceVersion, in pages when `limit` is given.
///
/// A `continue` token is `<rv>|<namespace>|<name>` of the page's last object: the next page
/// reads the objects after it as they are now, and carries the first page's resourceVersion
/// (a watch from it replays what changed meanwhile, which a reflector applies again harmlessly).
fn list(server: &ApiServer, path: &ApiPath, query: &Query) -> Result<Response<Body>, ApiError> {
    let filter = filter(path, query)?;
    let (items, now) = server.read(|s| (s.list(&filter), s.rv()));
    let bad_token = || ApiError::new(400, "BadRequest", "invalid continue token");
    let (rv, after) = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let mut parts = token.splitn(3, '|');
            let rv: u64 = parts
                .next()
                .and_then(|r| r.parse().ok())
                .ok_or_else(bad_token)?;
            let ns = parts.next().ok_or_else(bad_token)?.to_owned();
            let name = parts.next().ok_or_else(bad_token)?.to_owned();
            (rv, Some((ns, name)))
        }
        None => (now, None),
    };
    let id = |o: &Value| {
        (
            o["metadata"]["namespace"].as_str().unwrap_or("").to_owned(),
            o["metadata"]["name"].as_str().unwrap_or("").to_owned(),
        )
    };
    let mut rest: Vec<&Arc<Value>> = items
        .iter()
        .filter(|o| after.as_ref().is_none_or(|a| id(o) > *a))
        .collect();
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(limit) = limit
        && rest.len() > limit
    {
        rest.truncate(limit);
        if let Some(last) = rest.last() {
            let (ns, name) = id(last);
            metadata["continue"] = format!("{rv}|{ns}|{name}").into();
        }
    }
    let body = json!({
        "apiVersion": path.resource.api_version(&path.version),
        "kind": format!("{}List", path.resource.kind),
        "metadata": metadata,
        "items": rest.iter().map(|o| at_version(path, o)).collect::<Vec<_>>(),
    });
    Ok(json_response(StatusCode::OK, &body))
}

/// Where a watch starts.
#[derive(Clone, Copy, Debug)]
enum Start {
    /// From the current state: every selected object as `ADDED` first; with `end_bookmark`
    /// (`sendInitialEvents`) a `BOOKMARK` marks where those end.
    Now { end_bookmark: bool },
    /// After this resourceVersion.
    After(u64),
}

/// A watch; `watches_ended` is [`ApiServer::watches_ended`] of its resource when the request
/// arrived: it ends once that moves.
fn watch(
    server: &Arc<ApiServer>,
    path: &ApiPath,
    query: &Query,
    watches_ended: u64,
) -> Result<Response<Body>, ApiError> {
    let filter = filter(path, query)?;
    let send_initial = query.flag("sendInitialEvents");
    let start = match query
        .get("resourceVersion")
        .filter(|r| !r.is_empty() && *r != "0")
    {
        _ if send_initial => Start::Now { end_bookmark: true },
        None => Start::Now {
            end_bookmark: false,
        },
        Some(rv) => Start::After(rv.parse().map_err(|_| {
            ApiError::new(400, "BadRequest", format!("invalid resourceVersion {rv:?}"))
        })?),
    };
    let cap = server.settings().watch_timeout_cap;
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(cap, |t| std::time::Duration::from_secs(t).min(cap));
    let (tx, rx) = mpsc::channel(WATCH_QUEUE);
    let stream = Stream {
        server: server.clone(),
        filter,
        path: path.clone(),
        bookmarks: query.flag("allowWatchBookmarks"),
        watches_ended,
        tx,
    };
    tokio::spawn(stream.run(start, timeout));
    let mut r = Response::new(Events(rx).boxed());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

/// A watch's response body: the lines its task sends, until the task ends.
struct Events(mpsc::Receiver<Bytes>);

impl http_body::Body for Events {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// One watch: its filter, and where its lines go.
struct Stream {
    server: Arc<ApiServer>,
    filter: Filter,
    path: ApiPath,
    bookmarks: bool,
    /// [`ApiServer::watches_ended`] of the resource when the watch was asked for.
    watches_ended: u64,
    tx: mpsc::Sender<Bytes>,
}

impl Stream {
    async fn send(&self, kind: &str, object: Value) -> bool {
        let line = format!("{}\n", json!({"type": kind, "object": object}));
        self.tx.send(Bytes::from(line)).await.is_ok()
    }

    async fn bookmark(&self, rv: u64, initial_end: bool) -> bool {
        let mut object = json!({
            "apiVersion": self.path.resource.api_version(&self.path.version),
            "kind": self.path.resource.kind,
            "metadata": {"resourceVersion": rv.to_string()},
        });
        if initial_end {
            object["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        self.send("BOOKMARK", object).await
    }

    async fn gone(&self, rv: u64) {
        let e = ApiError::new(410, "Expired", format!("too old resource version: {rv}"));
        self.send("ERROR", e.status()).await;
    }

    async fn run(self, start: Start, timeout: std::time::Duration) {
        let mut signal = self.server.subscribe();
        let expired_at_start = signal.borrow_and_update().expired;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rv = match start {
            Start::Now { end_bookmark } => {
                let (objects, now) = self.server.read(|s| (s.list(&self.filter), s.rv()));
                for o in objects {
                    if !self.send("ADDED", at_version(&self.path, &o)).await {
                        return;
                    }
                }
                if end_bookmark && !self.bookmark(now, true).await {
                    return;
                }
                now
            }
            Start::After(rv) => rv,
        };
        let every = self.server.settings().bookmark_every;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            let Some((events, now)) = self
                .server
                .read(|s| s.events_since(rv).map(|e| (e, s.rv())))
            else {
                self.gone(rv).await;
                return;
            };
            for e in &events {
                if let Some((kind, object)) = e.seen_through(&self.filter)
                    && !self
                        .send(kind.as_str(), at_version(&self.path, object))
                        .await
                {
                    return;
                }
            }
            rv = rv.max(now);
            tokio::select! {
                changed = signal.changed() => {
                    let s = *signal.borrow_and_update();
                    if changed.is_err() || s.stopped {
                        return;
                    }
                    if s.expired != expired_at_start {
                        self.gone(rv).await;
                        return;
                    }
                    if self.server.watches_ended(self.path.resource) != self.watches_ended {
                        // As its timeout ends a watch: the response just ends.
                        return;
                    }
                }
                () = tokio::time::sleep_until(deadline) => return,
                _ = tick.tick(), if self.bookmarks => {
                    if !self.bookmark(rv, false).await {
                        return;
                    }
                }
                () = self.tx.closed() => return,
            }
        }
    }
}
