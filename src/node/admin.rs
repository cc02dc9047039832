//! The admin endpoints, on the unix socket `<state-dir>/admin.sock` and an optional TCP
//! address: `/live`, `/ready`, `/metrics` (Prometheus text), `/pods`, `/model`. The unix
//! socket alone also serves the debug endpoints of `aether debug`
//! ([`super::debug::DEBUG_ENDPOINTS`]). The metrics listener ([`serve_metrics`], on the node's
//! network in a cluster) serves only [`METRICS_ENDPOINTS`], with a head deadline and a
//! connection cap: anyone on the node's network can reach it.

use std::convert::Infallible;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

pub use super::admin_state::Admin;
use super::admin_state::diagnostic_json;
use crate::accept::Acceptor;
use crate::proxy::{Body, respond};

/// The endpoints, by path, with what they answer (drives the router and its test).
pub const ENDPOINTS: &[(&str, &str)] = &[
    ("/live", "200 while the process runs"),
    (
        "/ready",
        "200 once the first model is published and every local pod reconciled, else 503; the body names each Kubernetes kind not synced, and a kind refused (403) after its first list leaves it 200 with a `degraded:` line",
    ),
    ("/metrics", "Prometheus text exposition"),
    ("/pods", "the pods this node serves, JSON"),
    (
        "/model",
        "the published model's generation, registry fingerprint and size, JSON",
    ),
    (
        "/access-log",
        "the access log's mode (off, on, sample=N); PUT with one of them as the body sets it (the unix socket only)",
    ),
];

/// What the metrics listener serves: no pod, model or debug data.
pub const METRICS_ENDPOINTS: &[&str] = &["/live", "/ready", "/metrics"];

/// How long a metrics client may take to send its request head.
const METRICS_HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn json(value: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(respond::full(value.to_string()));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn status(code: StatusCode, text: &'static str) -> Response<Body> {
    let mut r = Response::new(respond::full(text));
    *r.status_mut() = code;
    r
}

async fn handle(admin: &Admin, path: &str) -> Response<Body> {
    match path {
        "/live" => status(StatusCode::OK, "live\n"),
        "/ready" => ready(admin),
        "/metrics" => {
            let mut registry = prometheus_client::registry::Registry::default();
            admin.inputs.stats.register(&mut registry);
            admin.inputs.balance.counters.register(&mut registry);
            registry.register_collector(Box::new(crate::proxy::metrics::DataPlaneCollector(
                admin.inputs.metrics.clone(),
            )));
            admin.node_stats.register(&mut registry);
            admin.inputs.overload.register_metrics(&mut registry);
            registry.register_collector(Box::new(admin.control.clone()));
            let generation = prometheus_client::metrics::gauge::Gauge::<i64>::default();
            generation.set(i64::try_from(admin.inputs.model.generation()).unwrap_or(i64::MAX));
            registry.register(
                "aether_model_generation",
                "The published model's generation",
                generation,
            );
            let mut text = String::new();
            if prometheus_client::encoding::text::encode(&mut text, &registry).is_err() {
                return status(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n");
            }
            Response::new(respond::full(text))
        }
        "/pods" => json(&serde_json::Value::Array(admin.pods.lock().await.list())),
        "/model" => {
            let model = admin.inputs.model.load();
            json(&serde_json::json!({
                "node": admin.node,
                "generation": admin.inputs.model.generation(),
                "registry_fingerprint": admin.fingerprint.load(std::sync::atomic::Ordering::Acquire).to_string(),
                "kube_writes_pending": admin.kube_writes.pending(),
                "registrar_leader": admin.kube_writes.leader(),
                "registrar_lease_problem": admin.kube_writes.registrar.lease_problem.lock().as_ref().map(|p| &p.error),
                "etcd": admin.etcd.as_ref().map(|e| e.report()),
                "names": model.name_count(),
                "pods": model.pods().count(),
                // What the compiler refused, dropped or flagged (an `ext_authz` over raw-TCP
                // ports, an unknown inbound mode, ...), each with its stable kind.
                "diagnostics": model
                    .diagnostics
                    .iter()
                    .map(diagnostic_json)
                    .collect::<Vec<_>>(),
            }))
        }
        "/access-log" => Response::new(respond::full(format!("{}\n", admin.inputs.access.mode()))),
        _ => status(StatusCode::NOT_FOUND, "unknown admin path\n"),
    }
}

/// `/ready`: 200 once the node serves, else 503 (the probes read the status alone). The body
/// names each kind of the Kubernetes source that is not synced. A kind the API server refuses
/// (403) after its first list leaves the node ready, with a `degraded:` line: the node does
/// serve, its last store of that kind in force and every other kind applied (issue #35), and a
/// 503 would tell the DaemonSet's rollout and the operator's probes otherwise while protecting
/// no request (no traffic is routed by this pod's readiness).
fn ready(admin: &Admin) -> Response<Body> {
    let now = crate::time::wall_ms();
    // A registrar that cannot take its Lease (a missing release namespace) leaves the node
    // serving: it is named, as a degraded kind is (issue #36 item 3).
    let lease = admin
        .kube_writes
        .registrar
        .lease_problem
        .lock()
        .as_ref()
        .map(crate::registrar::LeaseProblem::report);
    let kinds = admin
        .control
        .kinds
        .iter()
        .filter_map(|k| k.report(now))
        .chain(lease);
    let (code, mut text, prefix) = if *admin.ready.borrow() {
        (StatusCode::OK, "ready\n".to_owned(), "degraded: ")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready\n".to_owned(),
            "",
        )
    };
    for kind in kinds {
        text.push_str(prefix);
        text.push_str(&kind);
        text.push('\n');
    }
    // While it waits for pods, it names them (at most ten; their reasons are in the log).
    if code != StatusCode::OK {
        let not_served = admin.not_served.lock().pods();
        for (ns, pod) in not_served.iter().take(READY_PODS_NAMED) {
            text.push_str(&format!("pod {ns}/{pod}: not served yet\n"));
        }
        if not_served.len() > READY_PODS_NAMED {
            text.push_str(&format!(
                "and {} more pods not served yet\n",
                not_served.len() - READY_PODS_NAMED
            ));
        }
    }
    let mut r = Response::new(respond::full(text));
    *r.status_mut() = code;
    r
}

/// How many pods not served `/ready` names.
const READY_PODS_NAMED: usize = 10;

/// The largest body `PUT /access-log` reads.
const ACCESS_LOG_BODY_MAX: usize = 64;

/// `PUT /access-log`: set the access log's mode from the body (`off`, `on`, `sample=N`); `400`
/// with the reason for anything else.
async fn put_access_log(admin: &Admin, body: Incoming) -> Response<Body> {
    use http_body_util::BodyExt;
    let limited = http_body_util::Limited::new(body, ACCESS_LOG_BODY_MAX);
    let Ok(bytes) = limited
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
    else {
        return status(
            StatusCode::BAD_REQUEST,
            "the body is not off, on or sample=N\n",
        );
    };
    let text = String::from_utf8_lossy(&bytes);
    match text.parse::<crate::proxy::access::Mode>() {
        Ok(mode) => {
            admin.inputs.access.set(mode);
            tracing::info!(%mode, "access log mode set");
            Response::new(respond::full(format!("{mode}\n")))
        }
        Err(e) => {
            let mut r = Response::new(respond::full(format!("{e}\n")));
            *r.status_mut() = StatusCode::BAD_REQUEST;
            r
        }
    }
}

/// Serve one admin connection; `unix`: the admin unix socket, where the debug endpoints and the
/// ones that change the daemon (`PUT /access-log`) are served.
async fn serve_conn<I>(admin: Arc<Admin>, io: I, unix: bool)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let admin = admin.clone();
        async move {
            let put = req.method() == http::Method::PUT;
            let path = req.uri().path().to_owned();
            let resp = if put && unix && path == "/access-log" {
                put_access_log(&admin, req.into_body()).await
            } else if unix && super::debug::is_debug_path(&path) {
                super::debug::handle(&admin, req).await
            } else if put {
                status(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "PUT is served for /access-log on the admin unix socket only\n",
                )
            } else {
                handle(&admin, &path).await
            };
            Ok::<_, Infallible>(resp)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), service)
        .await;
}

/// Serve the admin unix socket until the task is aborted; accept errors (out of descriptors)
/// are waited out and counted as `aether_accept_errors{listener="admin"}`.
pub async fn serve_unix(admin: Arc<Admin>, listener: tokio::net::UnixListener) {
    let errors = admin.inputs.stats.accept_errors("admin");
    let mut acceptor = Acceptor::new(listener, "admin", errors);
    loop {
        let (s, _) = acceptor.accept().await;
        tokio::spawn(serve_conn(admin.clone(), s, true));
    }
}

/// Serve the metrics listener until the task is aborted: [`METRICS_ENDPOINTS`] only, at most
/// `max_connections` at once (a connection over it is closed at accept and counted as
/// `aether_connections_over_limit{listener="metrics"}`), each head within 10 s.
pub async fn serve_metrics(
    admin: Arc<Admin>,
    listener: tokio::net::TcpListener,
    max_connections: usize,
) {
    let errors = admin.inputs.stats.accept_errors("metrics");
    let mut acceptor = Acceptor::new(listener, "metrics", errors);
    let permits = Arc::new(tokio::sync::Semaphore::new(max_connections));
    loop {
        let (s, _) = acceptor.accept().await;
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            admin.node_stats.metrics_over_limit.inc();
            drop(s);
            continue;
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let admin = admin.clone();
                async move {
                    let path = req.uri().path();
                    Ok::<_, Infallible>(if METRICS_ENDPOINTS.contains(&path) {
                        handle(&admin, path).await
                    } else {
                        status(
                            StatusCode::NOT_FOUND,
                            "not served on the metrics listener\n",
                        )
                    })
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(METRICS_HEAD_TIMEOUT)
                .serve_connection(TokioIo::new(s), service)
                .await;
            drop(permit);
        });
    }
}

/// Serve the admin TCP listener until the task is aborted, as [`serve_unix`] but without the
/// debug endpoints: they change the log filter and run `nft`, which is for the socket's owner.
pub async fn serve_tcp(admin: Arc<Admin>, listener: tokio::net::TcpListener) {
    let errors = admin.inputs.stats.accept_errors("admin");
    let mut acceptor = Acceptor::new(listener, "admin", errors);
    loop {
        let (s, _) = acceptor.accept().await;
        tokio::spawn(serve_conn(admin.clone(), s, false));
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::model::{NodeContext, Snapshot, compile};
    use crate::node::pods::Pods;
    use crate::proxy::Inputs;
    use crate::proxy::{HopTls, Peer, ProxySettings, Stats, hop::Pool};
    use crate::state::ModelHandle;
    use tokio::sync::{Mutex, watch};

    #[derive(Debug)]
    struct NoTls;

    impl HopTls for NoTls {
        fn client(&self, _: &str, _: &str, _: &[u8]) -> Arc<rustls::ClientConfig> {
            unreachable!("the admin endpoints open no hop")
        }
        fn server(&self, _: &str, _: &str) -> Option<Arc<rustls::ServerConfig>> {
            None
        }
        fn peer(&self, _: &[rustls::pki_types::CertificateDer<'_>]) -> Option<Peer> {
            None
        }
    }

    fn admin(ready: bool) -> Admin {
        let model = compile(&Snapshot::default(), &NodeContext::default());
        admin_with(
            ready,
            ModelHandle::new(model),
            super::super::debug::DebugInputs::detached(),
        )
    }

    /// An admin over `model`, with no pods served.
    pub(in crate::node) fn admin_with(
        ready: bool,
        model: ModelHandle,
        debug: super::super::debug::DebugInputs,
    ) -> Admin {
        // The receiver keeps the last value after the sender is gone.
        let (_, rx) = watch::channel(ready);
        Admin {
            inputs: Arc::new(Inputs {
                model: Arc::new(model),
                tls: Arc::new(NoTls),
                settings: ProxySettings::default(),
                pool: Pool::default(),
                balance: Default::default(),
                drain: watch::Sender::new(false),
                stats: Stats::default(),
                metrics: Arc::default(),
                access: crate::proxy::access::AccessLog::default(),
                overload: Arc::default(),
            }),
            pods: Arc::new(Mutex::new(Pods::default())),
            ready: rx,
            node: "node-a".into(),
            fingerprint: Arc::default(),
            node_stats: Arc::default(),
            kube_writes: Arc::default(),
            etcd: None,
            debug,
            control: Arc::default(),
            not_served: Arc::default(),
        }
    }

    #[tokio::test]
    async fn every_listed_endpoint_answers_and_nothing_else_does() {
        let admin = admin(true);
        for (path, _) in ENDPOINTS {
            let r = handle(&admin, path).await;
            assert_eq!(r.status(), StatusCode::OK, "{path}");
        }
        assert_eq!(
            handle(&admin, "/nope").await.status(),
            StatusCode::NOT_FOUND
        );
        let body = http_body_util::BodyExt::collect(handle(&admin, "/metrics").await.into_body())
            .await
            .unwrap()
            .to_bytes();
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("aether_mesh_answers_total"), "{text}");
        assert!(text.contains("aether_model_generation 1"), "{text}");
        assert!(text.contains("aether_registry_files_held 0"), "{text}");
        // Every counter a limit's definition names (docs/node.md's Limits table) is exported
        // under that name.
        let mut named = 0;
        for setting in crate::node::config::SETTINGS {
            let Some(limit) = &setting.limit else {
                continue;
            };
            for name in limit
                .counter
                .split('`')
                .filter(|w| w.starts_with("aether_"))
            {
                named += 1;
                assert!(
                    text.lines().any(|l| l.starts_with(&format!("{name} "))),
                    "the limit {} names {name}, which /metrics does not export",
                    setting.key
                );
            }
        }
        assert!(named >= 16, "the Limits table names {named} counters");
    }

    #[tokio::test]
    async fn the_metrics_listener_serves_metrics_and_probes_only_and_caps_its_connections() {
        let admin = Arc::new(admin(true));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_metrics(admin.clone(), listener, 2));
        let connect = || tokio::net::TcpStream::connect(addr);
        for path in METRICS_ENDPOINTS {
            let answer = get(connect().await.unwrap(), path).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        }
        for path in ["/pods", "/model"] {
            let answer = get(connect().await.unwrap(), path).await;
            assert!(answer.starts_with("HTTP/1.1 404"), "{path}: {answer}");
        }
        // Two idle connections hold the cap: a third is closed without an answer, and counted.
        let _a = connect().await.unwrap();
        let _b = connect().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let answer = get(connect().await.unwrap(), "/metrics").await;
        assert!(
            !answer.contains("200"),
            "a third connection was served: {answer}"
        );
        assert_eq!(admin.node_stats.metrics_over_limit.get(), 1);
    }

    /// One GET over a connected socket; the response's text, or what went wrong.
    pub(in crate::node) async fn get<S: AsyncRead + AsyncWrite + Unpin>(
        mut s: S,
        path: &str,
    ) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let request = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
        if let Err(e) = s.write_all(request.as_bytes()).await {
            return format!("write: {e}");
        }
        let mut out = Vec::new();
        match tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut out)).await
        {
            Ok(Ok(_)) => String::from_utf8_lossy(&out).into_owned(),
            Ok(Err(e)) => format!("read: {e}"),
            Err(_) => "no answer within 5 s".to_owned(),
        }
    }

    #[test]
    fn both_admin_listeners_answer_again_after_the_process_ran_out_of_descriptors() {
        use crate::test_util::fds;
        use socket2::{Domain, SockAddr, Socket, Type};
        if !fds::in_child(concat!(
            module_path!(),
            "::both_admin_listeners_answer_again_after_the_process_ran_out_of_descriptors"
        )) {
            return;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let path = std::env::temp_dir().join(format!("aether-admin-{}.sock", std::process::id()));
            let _ = std::fs::remove_file(&path);
            let admin = Arc::new(admin(true));
            let unix = tokio::net::UnixListener::bind(&path).unwrap();
            let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let tcp_addr = tcp.local_addr().unwrap();
            let counter = admin.inputs.stats.accept_errors("admin");
            tokio::spawn(serve_unix(admin.clone(), unix));
            tokio::spawn(serve_tcp(admin.clone(), tcp));
            // The clients' sockets exist before the descriptors run out; their connections then
            // wait in the listeners' backlogs, which the servers cannot take them from.
            let unix_client = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
            let tcp_client = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
            let exhausted = fds::exhaust();
            unix_client.connect(&SockAddr::unix(&path).unwrap()).unwrap();
            tcp_client.connect(&tcp_addr.into()).unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            drop(exhausted);
            for s in [&unix_client, &tcp_client] {
                s.set_nonblocking(true).unwrap();
            }
            let unix_stream = tokio::net::UnixStream::from_std(std::os::unix::net::UnixStream::from(
                std::os::fd::OwnedFd::from(unix_client),
            ))
            .unwrap();
            let tcp_stream = tokio::net::TcpStream::from_std(tcp_client.into()).unwrap();
            let unix_answer = get(unix_stream, "/live").await;
            let tcp_answer = get(tcp_stream, "/live").await;
            assert!(
                unix_answer.starts_with("HTTP/1.1 200"),
                "the admin unix socket no longer answers once descriptors are free again: {unix_answer}"
            );
            assert!(
                tcp_answer.starts_with("HTTP/1.1 200"),
                "the admin TCP listener no longer answers once descriptors are free again: {tcp_answer}"
            );
            // Each listener failed at least once, and each failure was counted.
            assert!(counter.get() >= 2, "accept errors counted: {}", counter.get());
            let _ = std::fs::remove_file(&path);
        });
    }

    /// One request over an in-memory connection served as the unix socket (`writable`) or a
    /// TCP listener serves it.
    async fn over(admin: &Arc<Admin>, writable: bool, request: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(4096);
        tokio::spawn(serve_conn(admin.clone(), server, writable));
        client.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    fn put(body: &str) -> String {
        format!(
            "PUT /access-log HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn the_access_log_mode_is_set_on_the_unix_socket_only_and_a_bad_mode_changes_nothing() {
        let admin = Arc::new(admin(true));
        assert_eq!(admin.inputs.access.mode(), crate::proxy::access::Mode::Off);
        let answer = over(&admin, true, &put("sample=10")).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("sample=10\n"), "{answer}");
        assert_eq!(admin.inputs.access.mode().to_string(), "sample=10");
        // The TCP admin listener does not change the daemon.
        let answer = over(&admin, false, &put("on")).await;
        assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
        assert_eq!(admin.inputs.access.mode().to_string(), "sample=10");
        // A mode that is not one is refused with the reason.
        let answer = over(&admin, true, &put("sample=0")).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(answer.contains("off, on or sample=N"), "{answer}");
        assert_eq!(admin.inputs.access.mode().to_string(), "sample=10");
        let get = "GET /access-log HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        let answer = over(&admin, false, get).await;
        assert!(answer.ends_with("\r\n\r\nsample=10\n"), "{answer}");
    }

    #[tokio::test]
    async fn not_ready_is_503() {
        assert_eq!(
            handle(&admin(false), "/ready").await.status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    async fn ready_answer(admin: &Admin) -> (StatusCode, String) {
        use http_body_util::BodyExt;
        let r = handle(admin, "/ready").await;
        let status = r.status();
        let body = r.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Issue #36 item 6: `/ready` names what it waits for, pods included (at most ten).
    #[tokio::test]
    async fn ready_names_the_pods_it_waits_for() {
        let admin = admin(false);
        let failed: std::collections::BTreeMap<(String, String), String> = (0..12)
            .map(|i| {
                (
                    ("mp".to_owned(), format!("p-{i:02}")),
                    "no netns".to_owned(),
                )
            })
            .collect();
        admin.not_served.lock().record(&failed, crate::time::now());
        let (status, body) = ready_answer(&admin).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let lines: Vec<&str> = body.lines().collect();
        assert_eq!(lines[0], "not ready");
        assert_eq!(lines[1], "pod mp/p-00: not served yet");
        assert_eq!(lines[10], "pod mp/p-09: not served yet");
        assert_eq!(lines[11], "and 2 more pods not served yet");
        // Ready: nothing named.
        let ready = admin_with_pods_ready(&admin);
        let (status, body) = ready_answer(&ready).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ready\n"));
    }

    fn admin_with_pods_ready(waiting: &Admin) -> Admin {
        let mut ready = admin(true);
        ready.not_served = waiting.not_served.clone();
        ready
    }

    /// The four states of a kind, as `/ready` tells them: listing and refused before its list
    /// keep the node at 503 and are named; refused after its list leaves it 200, degraded.
    #[tokio::test]
    async fn ready_names_each_kind_not_synced_and_a_kind_refused_after_its_list_is_degraded() {
        use crate::registry::kube::watch::KindState;
        use std::sync::atomic::Ordering;
        let kind = |name, synced: bool, forbidden: bool| {
            let k = KindState::new(name);
            k.synced.store(synced, Ordering::Release);
            k.forbidden.store(forbidden, Ordering::Release);
            k.forbidden_since_ms
                .store(crate::time::wall_ms() - 61_000, Ordering::Relaxed);
            Arc::new(k)
        };
        let mut unsynced = admin(false);
        unsynced.control = Arc::new(super::super::telemetry::ControlCollector {
            kinds: vec![
                kind("Pod", true, false),
                kind("Service", false, false),
                kind("MeshFilter", false, true),
            ],
            ..Default::default()
        });
        let (status, body) = ready_answer(&unsynced).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body,
            "not ready\nService: not listed yet\nMeshFilter: may not be read (403) and was never listed: no pod is served until it is\n"
        );

        let mut degraded = admin(true);
        degraded.control = Arc::new(super::super::telemetry::ControlCollector {
            kinds: vec![kind("Pod", true, false), kind("HTTPRoute", true, true)],
            ..Default::default()
        });
        let (status, body) = ready_answer(&degraded).await;
        assert_eq!(status, StatusCode::OK);
        let lines: Vec<&str> = body.lines().collect();
        assert_eq!(lines.len(), 2, "{body}");
        assert_eq!(lines[0], "ready");
        assert!(
            lines[1].starts_with("degraded: HTTPRoute: may not be read (403) for 6")
                && lines[1].ends_with("its changes since are not seen"),
            "{body}"
        );

        let (status, body) = ready_answer(&admin(true)).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ready\n"));
    }
}
