//! HTTP-layer hardening (issue #8, "Hostile traffic and faults"): what a client sees when it
//! sends hop-by-hop headers, protocol switches the mesh does not carry, broken framing, heads
//! the parser rejects, slow or partial heads, or nothing at all on a kept connection.
//!
//! Raw sockets write the exact bytes; the echo's `/headers` answer shows what reached the
//! application. Where a deadline is the behaviour, the clock is tokio's paused clock, so the
//! assertions are about which deadline closed the connection, not about speed.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::client::{Answer, exchange, parse};
use aether::proxy::ProxySettings;

use crate::world::{MESH, World};

fn name(service: &str, port: u16) -> String {
    format!("{service}.mp.{MESH}:{port}")
}

/// Read one response off a kept connection (a head, and a `content-length` body if any);
/// `None` when the server closed before a whole response.
async fn response(stream: &mut TcpStream) -> Option<Answer> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            return None;
        }
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
                return Some(parse(&got));
            }
        }
    }
}

/// Read until the server closes the connection (end of stream or a reset); what it sent.
async fn until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// The header lines of an echo `/headers` body (after its identity line).
fn echoed_headers(a: &Answer) -> Vec<&str> {
    a.body.lines().skip(1).collect()
}

fn echoed(a: &Answer, name: &str) -> bool {
    let prefix = format!("{name}:");
    echoed_headers(a).iter().any(|l| l.starts_with(&prefix))
}

// ---- hop-by-hop headers and the mesh's own (findings 2, 7, 9, 12) -------------------------

#[tokio::test]
async fn a_connection_header_cannot_remove_the_hop_services_so_the_addressed_ext_authz_runs() {
    let w = World::start().await;
    let host = name("mp-guarded", 8080);
    let dial = w.capture_service("mp-guarded", 8080);
    // `/via-multi` is routed to mp-multi: the check of mp-guarded (the addressed Service) runs
    // on the destination only because the source names mp-guarded in the hop's headers.
    let raw = format!(
        "GET /via-multi HTTP/1.1\r\nhost: {host}\r\nconnection: x-aether-hop-services, \
         x-aether-hop-version, close\r\nx-authz-deny: 1\r\n\r\n"
    );
    let a = parse(&exchange(dial, raw.as_bytes()).await);
    assert_eq!(
        (a.status, a.reason(), a.body.as_str()),
        (403, Some("authz-denied"), "denied by mp-slow\n"),
        "the client's Connection header dropped mp-guarded's ext_authz: {a:?}"
    );
    // Allowed, the same request reaches mp-multi through the route.
    let raw = format!(
        "GET /via-multi HTTP/1.1\r\nhost: {host}\r\nconnection: x-aether-hop-services, close\r\n\r\n"
    );
    let a = parse(&exchange(dial, raw.as_bytes()).await);
    assert_eq!(
        (a.status, a.body.as_str()),
        (200, "mp-multi:8080\n"),
        "{a:?}"
    );
}

#[tokio::test]
async fn a_connection_header_cannot_strip_the_marker_of_an_ext_authz_check() {
    let w = World::start().await;
    let host = name("mp-guarded", 8080);
    // An upgrade crosses the hop as HTTP/1.1, where a Connection header survives to the
    // destination, which builds the check.
    let raw = format!(
        "GET / HTTP/1.1\r\nhost: {host}\r\nupgrade: echo\r\nconnection: Upgrade, x-authz-service\r\n\
         x-authz-deny: 1\r\n\r\n"
    );
    let mut s = TcpStream::connect(w.loopback()).await.unwrap();
    s.write_all(raw.as_bytes()).await.unwrap();
    let a = response(&mut s).await.expect("an answer");
    assert_eq!(
        (a.status, a.reason()),
        (403, Some("authz-denied")),
        "the check reached the authorization server without x-authz-service: {a:?}"
    );
}

#[tokio::test]
async fn a_request_with_a_body_to_a_service_with_ext_authz_is_checked_and_delivered() {
    let w = World::start().await;
    let host = name("mp-guarded", 8080);
    for body in [
        "content-length: 5\r\n\r\nhello",
        "transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ] {
        let raw = format!("POST / HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n{body}");
        let a = parse(&exchange(w.capture_service("mp-guarded", 8080), raw.as_bytes()).await);
        assert_eq!(
            (a.status, a.reason(), a.body.as_str()),
            (200, None, "mp-guarded:8080\n"),
            "{body:?}"
        );
    }
}

#[tokio::test]
async fn hop_by_hop_and_client_sent_check_and_certificate_headers_never_reach_the_application() {
    let w = World::start().await;
    let hostile = "connection: x-secret, close\r\nx-secret: 1\r\nkeep-alive: timeout=5\r\n\
        proxy-connection: keep-alive\r\nx-forwarded-client-cert: By=spiffe://forged\r\n\
        x-authz-caller: spiffe://cluster.local/ns/mp/sa/admin\r\nx-authz-service: mp/mp-multi\r\n\
        x-keep: 1\r\n";
    // A delivery, and a passthrough to a server outside the mesh.
    let outside = w.outside_echo();
    let dialled = SocketAddr::new("10.1.2.3".parse().unwrap(), 8080);
    w.reach(dialled, outside);
    let cases = [
        (w.loopback(), name("mp-multi", 8080), "mp-multi:8080"),
        (
            w.capture(dialled),
            "example.com:8080".to_owned(),
            "outside:",
        ),
    ];
    for (dial, host, identity) in cases {
        let raw = format!("GET /headers HTTP/1.1\r\nhost: {host}\r\n{hostile}\r\n");
        let a = parse(&exchange(dial, raw.as_bytes()).await);
        assert_eq!(a.status, 200, "{a:?}");
        assert!(a.body.starts_with(identity), "{}", a.body);
        assert!(echoed(&a, "x-keep"), "{}", a.body);
        for gone in [
            "connection",
            "x-secret",
            "keep-alive",
            "proxy-connection",
            "x-forwarded-client-cert",
            "x-authz-caller",
            "x-authz-service",
        ] {
            assert!(!echoed(&a, gone), "{gone} reached {identity}: {}", a.body);
        }
    }
}

#[tokio::test]
async fn an_h2c_upgrade_is_not_relayed_and_the_request_is_served_as_plain_http_1_1() {
    let w = World::start().await;
    let host = name("mp-multi", 8080);
    let mut s = TcpStream::connect(w.loopback()).await.unwrap();
    let raw = format!(
        "GET /headers HTTP/1.1\r\nhost: {host}\r\nconnection: Upgrade, HTTP2-Settings\r\n\
         upgrade: h2c\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
    );
    s.write_all(raw.as_bytes()).await.unwrap();
    let a = response(&mut s).await.expect("an answer");
    assert_eq!(a.status, 200, "{a:?}");
    for gone in ["upgrade", "http2-settings", "connection"] {
        assert!(
            !echoed(&a, gone),
            "{gone} reached the application: {}",
            a.body
        );
    }
    // The connection is still HTTP/1.1: a second request on it is answered.
    let raw = format!("GET / HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n");
    s.write_all(raw.as_bytes()).await.unwrap();
    let a = parse(&until_closed(&mut s).await);
    assert_eq!((a.status, a.body.as_str()), (200, "mp-multi:8080\n"));
}

#[tokio::test]
async fn an_upgrade_the_mesh_carries_is_still_switched_and_spliced() {
    let w = World::start().await;
    let host = name("mp-multi", 8080);
    let mut s = TcpStream::connect(w.loopback()).await.unwrap();
    let raw = format!(
        "GET / HTTP/1.1\r\nhost: {host}\r\nconnection: keep-alive, Upgrade\r\nupgrade: echo\r\n\r\n"
    );
    s.write_all(raw.as_bytes()).await.unwrap();
    let a = response(&mut s).await.expect("an answer");
    assert_eq!(a.status, 101, "{a:?}");
    s.write_all(b"ping").await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    while !got.ends_with(b"ping") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, b"mp-multi:8080\nping");
}

/// The client side of an HTTP/2 connection: its sender (the connection closes when it is
/// dropped) and its task (it ends when the connection closes).
struct H2Client {
    _send: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    conn: tokio::task::JoinHandle<Result<(), hyper::Error>>,
}

/// An HTTP/2 (prior knowledge) request to `addr`: the response head and body, and the
/// connection, kept open.
async fn h2(
    addr: SocketAddr,
    req: http::Request<Full<Bytes>>,
) -> (http::response::Parts, Bytes, H2Client) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let resp = send.send_request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (parts, body, H2Client { _send: send, conn })
}

#[tokio::test]
async fn te_trailers_from_an_http2_client_still_reaches_the_application() {
    let w = World::start().await;
    let req = http::Request::builder()
        .uri(format!("http://{}/headers", name("mp-multi", 8080)))
        .header("te", "trailers")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (parts, body, _conn) = h2(w.loopback(), req).await;
    let body = String::from_utf8_lossy(&body);
    assert_eq!(parts.status, 200, "{body}");
    assert!(body.lines().any(|l| l == "te: trailers"), "{body}");
}

// ---- framing and heads the parser rejects (finding 12) ------------------------------------

#[tokio::test]
async fn a_head_with_both_content_length_and_transfer_encoding_is_refused_400_bad_request() {
    let w = World::start().await;
    let raw = format!(
        "POST / HTTP/1.1\r\nhost: {}\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\
         connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        name("mp-multi", 8080)
    );
    for dial in [w.loopback(), w.capture_service("mp-multi", 8080)] {
        let a = parse(&exchange(dial, raw.as_bytes()).await);
        assert_eq!((a.status, a.reason()), (400, Some("bad-request")), "{a:?}");
        assert_eq!(a.body, "bad-request\nservice: -\nports:\n");
    }
    assert_eq!(w.inputs.stats.bad_requests.get(), 2);
    assert_eq!(w.inputs.stats.deliveries.get(), 0);
}

#[tokio::test]
async fn a_malformed_chunked_body_is_the_clients_fault_400_bad_request_not_503() {
    let w = World::start().await;
    let raw = format!(
        "POST / HTTP/1.1\r\nhost: {}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n\
         zz\r\nhello\r\n0\r\n\r\n",
        name("mp-multi", 8080)
    );
    let a = parse(&exchange(w.loopback(), raw.as_bytes()).await);
    assert_eq!((a.status, a.reason()), (400, Some("bad-request")), "{a:?}");
    assert_eq!(w.inputs.stats.bad_requests.get(), 1);
}

#[tokio::test]
async fn a_body_cut_short_of_its_content_length_is_the_clients_fault_400_bad_request() {
    let w = World::start().await;
    let raw = format!(
        "POST / HTTP/1.1\r\nhost: {}\r\ncontent-length: 100\r\n\r\nhello",
        name("mp-multi", 8080)
    );
    let mut s = TcpStream::connect(w.loopback()).await.unwrap();
    s.write_all(raw.as_bytes()).await.unwrap();
    s.shutdown().await.unwrap();
    let got = until_closed(&mut s).await;
    assert!(!got.is_empty(), "closed without an answer");
    let a = parse(&got);
    assert_eq!((a.status, a.reason()), (400, Some("bad-request")), "{a:?}");
}

#[tokio::test]
async fn a_first_head_the_parser_would_reject_gets_the_mesh_answer_with_its_reason() {
    let w = World::start().await;
    let host = name("mp-multi", 8080);
    let many: String = (0..101).map(|i| format!("x-h{i}: v\r\n")).collect();
    let cases = [
        (
            format!("GET / HTTP/1.1\r\nhost: {host}\r\n{many}\r\n"),
            431,
            "headers-too-large",
        ),
        (
            format!("POST / HTTP/1.1\r\nhost: {host}\r\ncontent-length: abc\r\n\r\n"),
            400,
            "bad-request",
        ),
        (
            format!(
                "POST / HTTP/1.1\r\nhost: {host}\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab"
            ),
            400,
            "bad-request",
        ),
        (
            format!("POST / HTTP/1.1\r\nhost: {host}\r\ntransfer-encoding: gzip\r\n\r\n"),
            400,
            "bad-request",
        ),
    ];
    for (raw, status, reason) in cases {
        let a = parse(&exchange(w.loopback(), raw.as_bytes()).await);
        assert_eq!(
            (a.status, a.reason()),
            (status, Some(reason)),
            "{raw:?}: {a:?}"
        );
    }
    assert_eq!(w.inputs.stats.headers_too_large.get(), 1);
    assert_eq!(w.inputs.stats.bad_requests.get(), 3);
}

#[tokio::test]
async fn an_http2_header_list_over_the_limit_is_answered_431_headers_too_large() {
    let w = World::start().await;
    let req = http::Request::builder()
        .uri(format!("http://{}/", name("mp-multi", 8080)))
        .header("x-big", "a".repeat(80 * 1024))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (parts, body, _conn) = h2(w.loopback(), req).await;
    assert_eq!(parts.status, 431, "{body:?}");
    assert_eq!(
        parts.headers.get("x-aether-error").map(|v| v.as_bytes()),
        Some(&b"headers-too-large"[..])
    );
    assert_eq!(w.inputs.stats.headers_too_large.get(), 1);
}

// ---- deadlines (finding 4) ---------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_dripped_first_head_is_cut_at_the_header_read_timeout_not_reset_by_each_byte() {
    let w = World::start().await;
    let deadline = Duration::from_secs(10);
    let s = TcpStream::connect(w.loopback()).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let head = format!(
        "GET / HTTP/1.1\r\nhost: {}\r\nx-pad: {}\r\n\r\n",
        name("mp-multi", 8080),
        "a".repeat(200)
    );
    let started = Instant::now();
    tokio::spawn(async move {
        for b in head.bytes() {
            if wr.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(600), rd.read_to_end(&mut got)).await;
    let took = started.elapsed();
    assert!(
        took >= deadline && took < deadline + Duration::from_millis(300),
        "closed after {took:?}"
    );
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    assert_eq!(w.inputs.stats.header_timeouts.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_sends_half_a_head_then_closes_is_answered_and_released_at_once() {
    let w = World::start().await;
    let mut s = TcpStream::connect(w.loopback()).await.unwrap();
    let started = Instant::now();
    s.write_all(b"GET / HTTP/1.1\r\nhost: mp-mu").await.unwrap();
    s.shutdown().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(60), until_closed(&mut s))
        .await
        .expect("the connection is released");
    let took = started.elapsed();
    assert!(took < Duration::from_millis(100), "released after {took:?}");
    let a = parse(&got);
    assert_eq!((a.status, a.reason()), (400, Some("bad-request")), "{a:?}");
}

#[tokio::test(start_paused = true)]
async fn an_idle_keep_alive_connection_is_closed_at_the_idle_timeout() {
    let w = World::start().await;
    let idle = Duration::from_secs(300);
    let mut s = TcpStream::connect(w.loopback()).await.unwrap();
    let raw = format!("GET / HTTP/1.1\r\nhost: {}\r\n\r\n", name("mp-multi", 8080));
    s.write_all(raw.as_bytes()).await.unwrap();
    let a = response(&mut s).await.expect("an answer");
    assert_eq!(a.status, 200);
    let started = Instant::now();
    let rest = until_closed(&mut s).await;
    let took = started.elapsed();
    assert!(
        took >= idle && took < idle + Duration::from_secs(1),
        "closed after {took:?}"
    );
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    assert!(w.inputs.stats.idle_closed.get() >= 1);
    assert_eq!(w.inputs.stats.header_timeouts.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_slow_later_head_on_a_kept_connection_is_cut_at_the_header_read_timeout() {
    let w = World::start().await;
    let deadline = Duration::from_secs(10);
    let host = name("mp-multi", 8080);
    let mut s = TcpStream::connect(w.loopback()).await.unwrap();
    s.write_all(format!("GET / HTTP/1.1\r\nhost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(response(&mut s).await.expect("an answer").status, 200);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = Instant::now();
    s.write_all(b"GET / HTTP/1.1\r\nhost: ").await.unwrap();
    let rest = until_closed(&mut s).await;
    let took = started.elapsed();
    assert!(
        took >= deadline && took < deadline + Duration::from_secs(1),
        "closed {took:?} after the head began"
    );
    assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
    assert_eq!(w.inputs.stats.header_timeouts.get(), 1);
    assert_eq!(w.inputs.stats.idle_closed.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_idle_http2_connection_is_closed_at_the_idle_timeout() {
    let w = World::start().await;
    let idle = Duration::from_secs(300);
    let req = http::Request::builder()
        .uri(format!("http://{}/", name("mp-multi", 8080)))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (parts, body, conn) = h2(w.loopback(), req).await;
    assert_eq!(
        (parts.status.as_u16(), &body[..]),
        (200, &b"mp-multi:8080\n"[..])
    );
    let started = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(3600), conn.conn).await;
    let took = started.elapsed();
    assert!(ended.is_ok(), "still open after {took:?}");
    assert!(
        took >= idle && took < idle + Duration::from_secs(1),
        "closed after {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_mesh_hop_connection_is_closed_by_the_destination_at_the_idle_timeout() {
    let w = World::start().await;
    let a = crate::client::get(w.loopback(), "/", &name("mp-multi", 8080), &[]).await;
    assert_eq!(a.status, 200);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The loopback connection is closed; the pooled hop connection stays open, idle.
    assert_eq!(w.inputs.stats.active.get(), 1, "the hop connection");
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert_eq!(
        w.inputs.stats.active.get(),
        0,
        "the idle hop connection is closed"
    );
    assert_eq!(w.inputs.stats.idle_closed.get(), 1);
    // The next request opens a new one.
    let a = crate::client::get(w.loopback(), "/", &name("mp-multi", 8080), &[]).await;
    assert_eq!((a.status, a.body.as_str()), (200, "mp-multi:8080\n"));
}

#[tokio::test]
async fn an_http2_client_at_the_stream_limit_waits_for_a_stream_and_the_limit_is_counted() {
    let w = World::with_settings(ProxySettings {
        http2_max_concurrent_streams: 2,
        ..ProxySettings::default()
    })
    .await;
    let send = crate::client::h2_sender(w.loopback()).await;
    let req = |delay: &str| {
        http::Request::builder()
            .uri(format!("http://{}/", name("mp-guarded", 8080)))
            .header("x-authz-delay-ms", delay)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    // One request first, so that the client has the server's SETTINGS (a stream over the limit
    // sent before them is refused, RFC 9113 §5.1.2).
    let mut first = send.clone();
    assert_eq!(first.send_request(req("0")).await.unwrap().status(), 200);
    // Each request's authorization check is answered after 200 ms, so they overlap.
    let requests: Vec<_> = (0..3)
        .map(|_| {
            let mut send = send.clone();
            let req = req("200");
            tokio::spawn(async move {
                let resp = send.send_request(req).await.unwrap();
                let status = resp.status().as_u16();
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                (status, body)
            })
        })
        .collect();
    for r in requests {
        let (status, body) = r.await.unwrap();
        assert_eq!((status, &body[..]), (200, &b"mp-guarded:8080\n"[..]));
    }
    assert!(w.inputs.stats.http2_stream_limit.get() >= 1);
}

// ---- the hop's port (finding 6b, not a defect: docs/decisions.md) -------------------------

#[tokio::test]
async fn a_pod_ip_dial_is_served_on_the_dialled_port_whatever_port_the_authority_names() {
    let w = World::start().await;
    // addressing.md §5.1 Q3 and leg N21 (ii): the hop carries the authority `:9090` to the
    // pod's port 8080, whose SNI it names; the destination serves 8080, never refuses.
    let pod = SocketAddr::new(std::net::IpAddr::V4(w.ip(crate::world::MULTI)), 8080);
    let host = name("mp-multi", 9090);
    let a = crate::client::get(w.capture(pod), "/", &host, &[]).await;
    assert_eq!(
        (a.status, a.reason(), a.body.as_str()),
        (200, None, "mp-multi:8080\n")
    );
    assert_eq!(a.header("x-echo-host"), Some(host.as_str()));
}
