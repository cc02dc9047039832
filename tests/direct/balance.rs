//! The endpoint choice through the data plane (issue #38 part 3; docs/decisions.md, "Endpoint
//! choice"): mp-pair has two endpoints, `mp-pair-0` served and `mp-pair-1` dead, and every
//! client request must still get mp-pair-0's echo, over HTTP and raw TCP.
//!
//! Two ways to be dead:
//! - **refused**: nothing listens on mp-pair-1's hop port, so a connect is reset at once;
//! - **black hole**: mp-pair-1's hop port is a listener with a backlog of 0 whose one slot is
//!   taken by a connection never accepted. Linux drops a SYN to a listener whose accept queue
//!   is full (no reset), so a connect waits, exactly as for an address whose SYNs are dropped.
//!   This is reliable on loopback without root, where a non-routable address is not: it gets
//!   "network unreachable" at once on a host without a default route.
//!
//! No test time-boxes a window: requests are counted, and a slow one is allowed for each
//! ejection the counter shows (a 4× slower machine may see an ejection run out and a second
//! one begin).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use aether::proxy::ProxySettings;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::client::{Answer, parse};
use crate::world::{MESH, PAIR_0, PAIR_1, World};

/// Requests each test sends, one after the other.
const REQUESTS: usize = 30;

/// The connect timeout of the black-hole tests: long enough that a request slower than 0.8× it
/// can only be one that waited for the hole, also on a slow machine.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How mp-pair-1 is dead.
enum Dead {
    Refusing,
    /// Holds the listener and the connection that fills its queue.
    BlackHole(#[allow(dead_code)] (socket2::Socket, std::net::TcpStream)),
}

/// A world whose mp-pair-0 is served and whose mp-pair-1 refuses connections, or is a black
/// hole.
async fn pair_world(black_hole: bool) -> (World, Dead) {
    let w = World::with_settings(ProxySettings {
        connect_timeout: CONNECT_TIMEOUT,
        ..ProxySettings::default()
    })
    .await;
    w.serve_pair(PAIR_0, true);
    let dead = if black_hole {
        let addr = SocketAddr::new(IpAddr::V4(w.ip(PAIR_1)), aether::proxy::HOP_PORT);
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_reuse_address(true).unwrap();
        s.bind(&addr.into()).unwrap();
        s.listen(0).unwrap();
        let fill = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        // The queue is full: the next connect must wait (checked, so the test cannot pass
        // against a hole that answers).
        let probe =
            tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await;
        assert!(probe.is_err(), "the black hole answered a SYN: {probe:?}");
        Dead::BlackHole((s, fill))
    } else {
        Dead::Refusing
    };
    (w, dead)
}

/// One HTTP/1.1 request through a captured dial of mp-pair:8080 (a new connection each time,
/// so each is a new delivery); its answer and how long it took.
async fn http_once(capture: SocketAddr, post: bool) -> (Answer, Duration) {
    let host = format!("mp-pair.mp.{MESH}:8080");
    let raw = if post {
        format!(
            "POST /echo HTTP/1.1\r\nhost: {host}\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello"
        )
    } else {
        format!("GET / HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n")
    };
    let started = tokio::time::Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(30), async {
        let mut stream = TcpStream::connect(capture).await.unwrap();
        stream.write_all(raw.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        stream.read_to_end(&mut got).await.unwrap();
        got
    })
    .await
    .expect("answered within 30 s");
    (parse(&got), started.elapsed())
}

/// One raw-TCP connection through a captured dial of mp-pair:9000: what came back before the
/// echo of `ping`, and how long it took; `None` when the connection closed first.
async fn tcp_once(capture: SocketAddr) -> (Option<String>, Duration) {
    let started = tokio::time::Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(30), async {
        let mut stream = TcpStream::connect(capture).await.unwrap();
        stream.write_all(b"ping\n").await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        loop {
            let n = stream.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                return None;
            }
            got.extend_from_slice(&buf[..n]);
            if got.ends_with(b"ping\n") {
                return Some(String::from_utf8_lossy(&got).into_owned());
            }
        }
    })
    .await
    .expect("answered or closed within 30 s");
    (got, started.elapsed())
}

fn ejections(w: &World) -> u64 {
    w.inputs.balance.counters.ejections.get()
}

fn retries(w: &World, outcome: &'static str) -> u64 {
    w.inputs
        .balance
        .counters
        .retries
        .get_or_create(&[("outcome", outcome)])
        .get()
}

#[tokio::test]
async fn with_one_endpoint_refusing_every_http_request_gets_the_live_endpoints_echo() {
    let (w, _dead) = pair_world(false).await;
    let capture = w.capture_service("mp-pair", 8080);
    for i in 0..REQUESTS {
        // A body that never left is sent again too: every other request is a POST.
        let (a, _) = http_once(capture, i % 2 == 1).await;
        assert_eq!((a.status, a.reason()), (200, None), "request {i}: {a:?}");
        assert_eq!(a.body, "mp-pair:8080\n", "request {i}");
        assert_eq!(a.header("x-echo-pod"), Some("mp-pair-0"), "request {i}");
    }
    // The dead endpoint was tried, ejected, and its request went to the other.
    assert!(ejections(&w) >= 1, "no ejection counted");
    assert!(retries(&w, "ok") >= 1, "no second try counted");
    assert_eq!(retries(&w, "failed"), 0);
}

/// The dead pod's hop is served, but nothing listens on its application's port: its daemon
/// cannot connect and nothing was sent, so it refuses the stream unprocessed and the source
/// tries the other pod (a request with a body that has left cannot be sent again, so GETs).
#[tokio::test]
async fn with_one_endpoints_application_refusing_every_http_request_gets_the_live_echo() {
    let (w, _dead) = pair_world(false).await;
    w.serve_pair(PAIR_1, false);
    let capture = w.capture_service("mp-pair", 8080);
    for i in 0..REQUESTS {
        let (a, _) = http_once(capture, false).await;
        assert_eq!((a.status, a.reason()), (200, None), "request {i}: {a:?}");
        assert_eq!(a.header("x-echo-pod"), Some("mp-pair-0"), "request {i}");
    }
    assert!(ejections(&w) >= 1, "no ejection counted");
    assert!(retries(&w, "ok") >= 1, "no second try counted");
}

#[tokio::test]
async fn with_one_endpoint_refusing_every_raw_tcp_connection_reaches_the_live_endpoint() {
    let (w, _dead) = pair_world(false).await;
    let capture = w.capture_service("mp-pair", 9000);
    for i in 0..REQUESTS {
        let (got, _) = tcp_once(capture).await;
        assert_eq!(
            got.as_deref(),
            Some("mp-pair:9000\npod mp-pair-0\nping\n"),
            "connection {i}"
        );
    }
    assert!(ejections(&w) >= 1, "no ejection counted");
    assert!(retries(&w, "ok") >= 1, "no second try counted");
}

/// Of the requests that took `took`, at most one per ejection counted waited for the hole
/// (slower than 0.8× the connect timeout), and the hole was met at least once (each of the
/// first requests has even odds).
fn one_wait_per_ejection(w: &World, took: &[Duration]) {
    let bound = CONNECT_TIMEOUT.mul_f64(0.8);
    let slow = took.iter().filter(|t| **t > bound).count() as u64;
    let ejected = ejections(w);
    assert!(
        slow <= ejected,
        "{slow} requests waited for the hole, {ejected} ejections: {took:?}"
    );
    assert!(ejected >= 1, "the hole was never tried: {took:?}");
}

#[tokio::test]
async fn with_one_endpoint_black_holed_no_http_request_fails_and_one_waits_per_ejection() {
    let (w, _dead) = pair_world(true).await;
    let capture = w.capture_service("mp-pair", 8080);
    let mut took = Vec::new();
    for i in 0..REQUESTS {
        let (a, t) = http_once(capture, false).await;
        assert_eq!((a.status, a.reason()), (200, None), "request {i}: {a:?}");
        assert_eq!(a.body, "mp-pair:8080\n", "request {i}");
        took.push(t);
    }
    one_wait_per_ejection(&w, &took);
}

#[tokio::test]
async fn with_one_endpoint_black_holed_no_raw_tcp_connection_fails_and_one_waits_per_ejection() {
    let (w, _dead) = pair_world(true).await;
    let capture = w.capture_service("mp-pair", 9000);
    let mut took = Vec::new();
    for i in 0..REQUESTS {
        let (got, t) = tcp_once(capture).await;
        assert_eq!(
            got.as_deref(),
            Some("mp-pair:9000\npod mp-pair-0\nping\n"),
            "connection {i}"
        );
        took.push(t);
    }
    one_wait_per_ejection(&w, &took);
}
