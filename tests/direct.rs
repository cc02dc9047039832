//! The data plane in-process (STYLE.md §6.6 "whole daemon in-process", §9 lesson 2; ztunnel's
//! `tests/direct.rs`): the daemon's proxy tasks over a model compiled from a small registry,
//! pods on 127/8 addresses of their own with the test [`SocketFactory`] (no root, no network
//! namespace), the real mTLS hop with identities from a fresh CA, and `aether echo`
//! applications. Each test asserts what a client sees, as spec/addressing.md states it: the
//! status, the `x-aether-error` reason and body, or the echo's identity `<workload>:<port>`
//! and the authority it received (`x-echo-host`).
//!
//! Worlds are independent (each has its own address block), so the tests run in parallel.
//! Where timing is the behaviour (the sniff bound), the clock is tokio's paused clock.
//!
//! [`SocketFactory`]: aether::proxy::socket::SocketFactory
#![allow(clippy::unwrap_used)] // Tests unwrap: a panic is the failure report (STYLE.md §6.4).

#[path = "direct/balance.rs"]
mod balance;
#[path = "direct/client.rs"]
mod client;
#[path = "direct/http.rs"]
mod http_hardening;
#[path = "direct/overload.rs"]
mod overload;
#[path = "direct/world.rs"]
mod world;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use client::{Answer, exchange, get, parse};
use world::{CLIENT, LOCKED, MESH, OUTSIDE, SLOW, World};

fn name(service: &str, port: Option<u16>) -> String {
    match port {
        Some(p) => format!("{service}.mp.{MESH}:{p}"),
        None => format!("{service}.mp.{MESH}"),
    }
}

#[tokio::test]
async fn captured_http_is_delivered_over_the_mtls_hop_to_the_echo_with_the_authority_sent() {
    let w = World::start().await;
    let host = name("mp-multi", Some(8080));
    let a = get(w.capture_service("mp-multi", 8080), "/", &host, &[]).await;
    assert_eq!((a.status, a.reason()), (200, None), "{a:?}");
    assert_eq!(a.body, "mp-multi:8080\n");
    assert_eq!(a.header("x-echo-host"), Some(host.as_str()));
    // It crossed the hop and reached the application from the client pod's IP (model.md §12.4).
    assert_eq!(w.inputs.stats.deliveries.get(), 1);
    assert_eq!(
        a.header("x-echo-peer"),
        Some(w.ip(CLIENT).to_string().as_str())
    );

    // A port-less Host stands for the dialled port (addressing.md §5, C1).
    let host = name("mp-multi", None);
    let a = get(w.capture_service("mp-multi", 9090), "/", &host, &[]).await;
    assert_eq!((a.status, a.body.as_str()), (200, "mp-multi:9090\n"));
    assert_eq!(a.header("x-echo-host"), Some(host.as_str()));
}

/// issue #35 item 6: h2c through a user Service no route names crosses the hop as bytes to a pod
/// this same daemon serves, which serves it as HTTP and hands it to the application. The
/// passthrough's kept connection (an L4 hop from the client) and the delivery's (into the
/// application, for that client) have the same two addresses: when they shared a pool entry,
/// the delivery took the hop connection and the request went round the hop for ever.
#[tokio::test]
async fn h2c_through_an_unrouted_service_to_a_pod_of_the_same_daemon_is_answered() {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let w = World::start().await;
    let front = SocketAddr::new(w.cluster_ip("multi-front"), 80);
    for i in 0..3 {
        let tcp = TcpStream::connect(w.capture(front)).await.unwrap();
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .unwrap();
        tokio::spawn(conn);
        let req = http::Request::get(format!("http://{front}/"))
            .body(Empty::<bytes::Bytes>::new())
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(20), send.send_request(req))
            .await
            .unwrap_or_else(|_| panic!("request {i}: no answer in 20 s"))
            .unwrap();
        assert_eq!(resp.status(), 200, "request {i}");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"mp-multi:8080\n", "request {i}");
    }
    assert_eq!(w.inputs.stats.l4_hops.get(), 3);
}

/// A hand-made hop to mp-multi-0 from `source` (a 127/8 address of the world) as `sa`, then one
/// HTTP/2 request: the status, or `None` when the hop closed after the handshake.
async fn hop_from(w: &World, source: std::net::Ipv4Addr, sa: &str) -> Option<u16> {
    use http_body_util::Empty;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(IpAddr::V4(source), 0)).unwrap();
    let tcp = socket
        .connect(SocketAddr::new(IpAddr::V4(w.ip(world::MULTI)), 18008))
        .await
        .unwrap();
    let config =
        aether::identity::client_config(&w.identities, "mp", sa, &[aether::proxy::ALPN_HTTP])
            .unwrap();
    let sni = rustls::pki_types::ServerName::try_from(format!("8080.mp-multi.mp.{MESH}")).unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(sni, tcp)
        .await
        .expect("the handshake completes: the certificate is the mesh's own");
    let answered = async {
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        let req = http::Request::get(format!("http://{}/", name("mp-multi", Some(8080))))
            .body(Empty::<bytes::Bytes>::new())
            .unwrap();
        send.send_request(req).await
    };
    tokio::time::timeout(Duration::from_secs(20), answered)
        .await
        .expect("answered or closed in 20 s")
        .ok()
        .map(|r| r.status().as_u16())
}

/// issue #35 item 3, model.md §14 source binding: the mesh's own certificate for an identity is
/// served only from the address of a served pod of that identity. From mp-client's address as
/// mp-locked (another served service), and from an address no row holds, the hop closes after
/// the handshake, before its HTTP is read; each refusal is counted by reason.
#[tokio::test]
async fn a_hop_is_served_only_from_an_address_of_its_certificates_identity() {
    let w = World::start().await;
    let refused = |reason: &'static str| {
        w.inputs
            .stats
            .hop_unbound
            .get_or_create(&[("reason", reason)])
            .get()
    };
    assert_eq!(hop_from(&w, w.ip(CLIENT), "mp-client").await, Some(200));
    assert_eq!(hop_from(&w, w.ip(CLIENT), "mp-locked").await, None);
    assert_eq!(refused("source-identity-mismatch"), 1);
    // An address no row holds is waited on for one discovery hold, then refused.
    assert_eq!(hop_from(&w, w.ip(77), "mp-client").await, None);
    assert_eq!(refused("source-not-a-pod"), 1);
    assert_eq!(refused("source-contested"), 0);
}

#[tokio::test]
async fn a_host_port_other_than_the_dialled_port_is_refused_421_port_mismatch() {
    let w = World::start().await;
    let a = get(
        w.capture_service("mp-multi", 8080),
        "/",
        &name("mp-multi", Some(9090)),
        &[],
    )
    .await;
    assert_eq!((a.status, a.reason()), (421, Some("port-mismatch")));
    assert_eq!(a.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(
        a.body,
        format!("port-mismatch\nservice: mp-multi.mp.{MESH}\nports: 8080/http 9090/http\n")
    );
    assert_eq!(w.inputs.stats.deliveries.get(), 0);
}

#[tokio::test]
async fn the_loopback_proxy_port_answers_a_name_outside_the_mesh_404_not_a_mesh_name() {
    let w = World::start().await;
    for host in ["example.com", "example.com:8080", "mp-multi.other:8080"] {
        let a = get(w.loopback(), "/", host, &[]).await;
        assert_eq!(
            (a.status, a.reason()),
            (404, Some("not-a-mesh-name")),
            "{host}"
        );
        assert_eq!(a.body, "not-a-mesh-name\nservice: -\nports:\n", "{host}");
    }
}

#[tokio::test]
async fn the_loopback_proxy_port_answers_bytes_that_are_not_http_400_not_http_then_closes() {
    let w = World::start().await;
    let a = parse(&exchange(w.loopback(), b"hello mesh\r\n\r\n").await);
    assert_eq!((a.status, a.reason()), (400, Some("not-http")));
    assert_eq!(a.body, "not-http\nservice: -\nports:\n");
}

#[tokio::test]
async fn an_absolute_form_request_is_delivered_with_host_set_to_its_target_authority() {
    let w = World::start().await;
    let target = name("mp-multi", Some(9090));
    let raw = format!(
        "GET http://{target}/headers HTTP/1.1\r\nhost: elsewhere.example:8080\r\nconnection: close\r\n\r\n"
    );
    let a = parse(&exchange(w.loopback(), raw.as_bytes()).await);
    assert_eq!((a.status, a.reason()), (200, None), "{a:?}");
    // Routed on the request-target, and the application sees that authority as its only Host
    // (addressing.md §2, §6.2).
    assert_eq!(a.header("x-echo-host"), Some(target.as_str()));
    assert!(a.body.starts_with("mp-multi:9090\n"), "{}", a.body);
    assert!(a.body.contains(&format!("host: {target}\n")), "{}", a.body);
    assert!(!a.body.contains("elsewhere.example"), "{}", a.body);
}

#[tokio::test]
async fn a_service_level_rbac_denial_is_answered_by_the_destination_403_authz_denied() {
    let w = World::start().await;
    let host = name("mp-locked", Some(8080));
    let proxied = get(w.loopback(), "/", &host, &[]).await;
    let captured = get(w.capture_service("mp-locked", 8080), "/", &host, &[]).await;
    for a in [proxied, captured] {
        assert_eq!((a.status, a.reason()), (403, Some("authz-denied")), "{a:?}");
        assert_eq!(a.body, "authz-denied\nservice: -\nports:\n");
        assert_eq!(
            a.header("x-echo-host"),
            None,
            "not the application's answer"
        );
    }
    // Both crossed the hop (the check runs on the destination, routes.md §5.5) and neither
    // reached the application.
    assert_eq!(w.inputs.stats.deliveries.get(), 2);
    let app = SocketAddr::new(IpAddr::V4(w.ip(LOCKED)), 8080);
    let count = get(app, "/echo-count", "direct", &[]).await;
    assert_eq!(count.body, "0\n");
}

#[tokio::test]
async fn mesh_headers_never_reach_the_application_and_its_x_aether_error_is_removed() {
    let w = World::start().await;
    let a = get(
        w.loopback(),
        "/headers",
        &name("mp-multi", Some(8080)),
        &[
            "x-aether-error: forged-by-client",
            "x-aether-hop-services: mp/mp-locked",
            "x-keep: 1",
            "x-echo-set: x-aether-error: forged-by-app",
            "x-echo-set: x-app: 1",
        ],
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    // N24 (I12): no `x-aether-` header a client sent reaches the application; others do.
    assert!(a.body.starts_with("mp-multi:8080\n"), "{}", a.body);
    assert!(a.body.contains("x-keep: 1\n"), "{}", a.body);
    assert!(
        !a.body.lines().any(|l| l.starts_with("x-aether-")),
        "{}",
        a.body
    );
    // N25 (I12): the application's `x-aether-error` is removed; its other headers pass.
    assert_eq!(a.reason(), None, "{a:?}");
    assert_eq!(a.header("x-app"), Some("1"));
}

#[tokio::test(start_paused = true)]
async fn a_silent_client_on_a_captured_http_port_is_passed_through_at_the_sniff_bound() {
    let w = World::start().await;
    // The dialled address (mp-multi's ClusterIP, an HTTP port) is reachable at `outside`.
    let outside = TcpListener::bind((w.ip(OUTSIDE), 0)).await.unwrap();
    let dialled = SocketAddr::new(w.cluster_ip("mp-multi"), 8080);
    w.reach(dialled, outside.local_addr().unwrap());
    let dial = w.capture(dialled);
    let started = tokio::time::Instant::now();
    let _client = TcpStream::connect(dial).await.unwrap();
    let (_passed, from) = outside.accept().await.unwrap();
    // addressing.md §3: silence until the sniff bound (at most 1 s) is passed through, from
    // the client pod's own address, when the bound expires and not before.
    assert_eq!(started.elapsed(), w.inputs.settings.sniff_bound);
    assert_eq!(from.ip(), IpAddr::V4(w.ip(CLIENT)));
    assert_eq!(w.inputs.metrics.passthroughs(), 1);
}

#[tokio::test]
async fn requests_are_counted_by_destination_code_class_and_reason_on_each_side() {
    use aether_lab::legs::{parse_exposition, sum_samples};
    let w = World::start().await;
    let host = name("mp-multi", Some(8080));
    for _ in 0..2 {
        let a = get(w.capture_service("mp-multi", 8080), "/", &host, &[]).await;
        assert_eq!((a.status, a.reason()), (200, None), "{a:?}");
    }
    let wrong = name("mp-multi", Some(9090));
    let a = get(w.capture_service("mp-multi", 8080), "/", &wrong, &[]).await;
    assert_eq!(a.reason(), Some("port-mismatch"), "{a:?}");

    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(aether::proxy::metrics::DataPlaneCollector(
        w.inputs.metrics.clone(),
    )));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let s = parse_exposition(&text).unwrap();
    let dst = |direction| {
        [
            ("direction", direction),
            ("namespace", "mp"),
            ("service", "mp-multi"),
            ("port", "8080"),
        ]
    };
    // One daemon here is both the source and the destination: each side counts once.
    for direction in ["outbound", "inbound"] {
        let mut ok = dst(direction).to_vec();
        ok.extend([("code", "2xx"), ("reason", "")]);
        assert_eq!(
            sum_samples(&s, "aether_http_requests_total", &ok),
            2.0,
            "{text}"
        );
        assert_eq!(
            sum_samples(
                &s,
                "aether_http_request_duration_seconds_count",
                &dst(direction)
            ),
            2.0,
            "{text}"
        );
    }
    assert_eq!(
        sum_samples(
            &s,
            "aether_hop_request_duration_seconds_count",
            &dst("outbound")[1..]
        ),
        2.0,
        "{text}"
    );
    // Refused before a service was chosen: the destination is `unknown`, the reason is kept.
    let refused = [
        ("direction", "outbound"),
        ("service", "unknown"),
        ("code", "4xx"),
        ("reason", "port-mismatch"),
    ];
    assert_eq!(
        sum_samples(&s, "aether_http_requests_total", &refused),
        1.0,
        "{text}"
    );
    assert_eq!(
        sum_samples(&s, "aether_refusals_total", &[("reason", "port-mismatch")]),
        1.0
    );
    assert_eq!(sum_samples(&s, "aether_refusals_total", &[]), 1.0, "{text}");
    assert_eq!(
        sum_samples(&s, "aether_hop_handshakes_total", &[("result", "ok")]),
        2.0 * sum_samples(
            &s,
            "aether_hop_handshakes_total",
            &[("side", "client"), ("result", "ok")]
        ),
        "every handshake the client side finished, the server side finished: {text}"
    );
}

/// Read one response off a kept connection (headers and a `content-length` body).
async fn read_one(stream: &mut TcpStream) -> Answer {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before a whole response");
        got.extend_from_slice(&buf[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        if let Ok(httparse::Status::Complete(head)) = resp.parse(&got) {
            let len: usize = resp
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .map_or(0, |h| {
                    std::str::from_utf8(h.value).unwrap().parse().unwrap()
                });
            if got.len() >= head + len {
                return parse(&got);
            }
        }
    }
}

/// Issue #36 item 7: a connection the daemon accepted just before it drains (an upgrade's
/// hand-off) has its client's request on its way; it is answered, then closed, never closed
/// with no answer.
#[tokio::test]
async fn on_drain_a_connection_accepted_before_its_request_arrives_is_answered() {
    let w = World::start().await;
    let five = Duration::from_secs(5);
    let before = w.inputs.stats.active.get();
    let mut fresh = TcpStream::connect(w.loopback()).await.unwrap();
    tokio::time::timeout(five, async {
        while w.inputs.stats.active.get() <= before {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the daemon accepts the connection");
    w.drain();
    // The drain has reached the connection's task before its request is written.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let req = format!(
        "GET / HTTP/1.1\r\nhost: {}\r\n\r\n",
        name("mp-multi", Some(8080))
    );
    fresh.write_all(req.as_bytes()).await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(five, fresh.read_to_end(&mut rest))
        .await
        .expect("the connection closes after its answer")
        .unwrap();
    assert!(!rest.is_empty(), "closed with no answer");
    let a = parse(&rest);
    assert_eq!((a.status, a.body.as_str()), (200, "mp-multi:8080\n"));
    assert_eq!(a.header("connection"), Some("close"));
}

#[tokio::test]
async fn on_drain_a_request_in_flight_finishes_and_an_idle_connection_is_closed() {
    let w = World::start().await;
    let five = Duration::from_secs(5);
    // A keep-alive connection with one request answered, then idle.
    let mut idle = TcpStream::connect(w.loopback()).await.unwrap();
    let req = format!(
        "GET / HTTP/1.1\r\nhost: {}\r\n\r\n",
        name("mp-multi", Some(8080))
    );
    idle.write_all(req.as_bytes()).await.unwrap();
    assert_eq!(read_one(&mut idle).await.body, "mp-multi:8080\n");
    // A request in flight: its service-level authorization check is answered 300 ms after it
    // arrives (the check carries the request's `x-authz-delay-ms`).
    let mut busy = TcpStream::connect(w.loopback()).await.unwrap();
    let req = format!(
        "GET / HTTP/1.1\r\nhost: {}\r\nx-authz-delay-ms: 300\r\n\r\n",
        name("mp-guarded", Some(8080))
    );
    busy.write_all(req.as_bytes()).await.unwrap();
    let app = SocketAddr::new(IpAddr::V4(w.ip(SLOW)), 9191);
    tokio::time::timeout(five, async {
        while get(app, "/count", "direct", &[]).await.body != "1\n" {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the request reaches the application");

    w.drain();

    let mut rest = Vec::new();
    tokio::time::timeout(five, busy.read_to_end(&mut rest))
        .await
        .expect("the connection in flight closes after its answer")
        .unwrap();
    let a = parse(&rest);
    assert_eq!((a.status, a.body.as_str()), (200, "mp-guarded:8080\n"));
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(five, idle.read(&mut buf))
        .await
        .expect("the idle connection is closed")
        .unwrap();
    assert_eq!(n, 0, "closed without another byte");
}
