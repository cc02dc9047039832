//! Hostile peers against the in-process data plane (issue #8; the world of `tests/direct.rs`):
//! connections that dial the daemon's own ports, clients that stall or vanish, and floods past
//! the connection limits. Each test asserts what the peer sees (a closed connection, an answer)
//! and that the daemon let go of the connection (its open-connection gauge).
#![allow(clippy::unwrap_used)] // Tests unwrap: a panic is the failure report (STYLE.md §6.4).

#[allow(dead_code)] // Each test binary uses part of the client.
#[path = "direct/client.rs"]
mod client;
#[path = "direct/world.rs"]
mod world;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use aether::proxy::ProxySettings;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use client::get;
use world::{MESH, MULTI, World};

/// Read until the peer closes; `None` when it has not closed within `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    match tokio::time::timeout(within, stream.read_to_end(&mut got)).await {
        Ok(_) => Some(got),
        Err(_) => None,
    }
}

/// Wait (bounded, 10 s: generous on a slow machine) until the daemon holds no connection.
async fn settles(w: &World) -> i64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        if w.inputs.stats.active.get() == 0 {
            return 0;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    w.inputs.stats.active.get()
}

/// Wait (bounded, 10 s) until the client pod holds `n` open connections.
async fn client_holds(w: &World, n: usize) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while w.client.open_connections() != n && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    w.client.open_connections()
}

#[tokio::test]
async fn a_connection_to_a_pods_capture_port_is_closed_and_never_dialled_again() {
    // Finding 1: a direct connection to <pod IP>:18001 reached the capture listener, was
    // "passed through" to its own address, and the daemon dialled itself in a loop.
    let w = World::start().await;
    let own = SocketAddr::new(IpAddr::V4(w.ip(world::CLIENT)), 18001);
    let other_hop = SocketAddr::new(IpAddr::V4(w.ip(MULTI)), 18008);
    for dialled in [own, other_hop] {
        let at = w.capture(dialled);
        // Where a passthrough to that address would really go: the same capture listener.
        w.reach(dialled, at);
        let mut s = TcpStream::connect(at).await.unwrap();
        let _ = s.write_all(b"hello\r\n").await;
        let got = closed_within(&mut s, Duration::from_secs(2)).await;
        assert_eq!(
            got.as_deref(),
            Some(&b""[..]),
            "{dialled}: closed without a byte"
        );
    }
    assert_eq!(w.inputs.stats.reserved_dials.get(), 2);
    assert_eq!(w.inputs.metrics.passthroughs(), 0);
    // Two connections accepted, nothing dialled back to the listener.
    assert_eq!(w.inputs.stats.captured.get(), 2);
    assert_eq!(settles(&w).await, 0);
}

#[tokio::test]
async fn a_client_that_closes_before_its_bytes_decide_is_released_at_once() {
    // Finding 4: peeked bytes hid the client's end of stream; the connection was held (and
    // polled every millisecond) until the sniff bound, a dripped prefix never.
    let w = World::with_settings(ProxySettings {
        sniff_bound: Duration::from_secs(30),
        ..ProxySettings::default()
    })
    .await;
    let at = w.capture(SocketAddr::new(IpAddr::V4(w.ip(world::OUTSIDE)), 7000));
    let mut s = TcpStream::connect(at).await.unwrap();
    s.write_all(b"GET /abc").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.shutdown().await.unwrap();
    let got = closed_within(&mut s, Duration::from_secs(3)).await;
    assert!(got.is_some(), "released long before the 30 s sniff bound");
    assert_eq!(settles(&w).await, 0);
}

#[tokio::test]
async fn a_pod_over_its_connection_limit_gets_new_connections_closed_and_keeps_the_old() {
    let w = World::with_settings(ProxySettings {
        max_connections_per_pod: 2,
        ..ProxySettings::default()
    })
    .await;
    let host = format!("mp-multi.mp.{MESH}:8080");
    let mut kept = Vec::new();
    for _ in 0..2 {
        kept.push(TcpStream::connect(w.loopback()).await.unwrap());
    }
    // Both admitted before the third is dialled.
    assert_eq!(client_holds(&w, 2).await, 2);
    let mut third = TcpStream::connect(w.loopback()).await.unwrap();
    let got = closed_within(&mut third, Duration::from_secs(2)).await;
    assert!(
        got.is_some_and(|b| b.is_empty()),
        "the third is closed at accept"
    );
    assert_eq!(w.inputs.stats.over_limit.get(), 1);
    // The two admitted connections are served.
    for s in &mut kept {
        let req = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let got = closed_within(s, Duration::from_secs(5)).await.unwrap();
        let a = client::parse(&got);
        assert_eq!((a.status, a.body.as_str()), (200, "mp-multi:8080\n"));
    }
    drop(kept);
    // Below the limit again (the pooled hop to mp-multi is mp-multi's, not the client's): a
    // new connection is served.
    assert_eq!(client_holds(&w, 0).await, 0);
    let a = get(w.loopback(), "/", &host, &[]).await;
    assert_eq!(a.status, 200);
}

#[tokio::test]
async fn a_hop_peer_that_never_finishes_its_handshake_is_closed_at_the_bound() {
    // Finding 6: silent connections to 18008 were held forever.
    let w = World::with_settings(ProxySettings {
        handshake_timeout: Duration::from_millis(300),
        ..ProxySettings::default()
    })
    .await;
    let hop = SocketAddr::new(IpAddr::V4(w.ip(MULTI)), 18008);
    let mut silent = TcpStream::connect(hop).await.unwrap();
    let mut dripping = TcpStream::connect(hop).await.unwrap();
    // A TLS record header, then nothing more.
    dripping
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00])
        .await
        .unwrap();
    for s in [&mut silent, &mut dripping] {
        let got = closed_within(s, Duration::from_secs(3)).await;
        assert!(got.is_some(), "closed at the handshake bound");
    }
    assert_eq!(w.inputs.stats.handshake_timeouts.get(), 2);
    // Bytes that are not TLS are refused at once.
    let mut plain = TcpStream::connect(hop).await.unwrap();
    plain.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    assert!(
        closed_within(&mut plain, Duration::from_secs(1))
            .await
            .is_some()
    );
    assert_eq!(settles(&w).await, 0);
}

#[tokio::test]
async fn a_relayed_byte_stream_with_no_byte_for_the_tcp_idle_timeout_is_closed() {
    // Raw TCP, L4 and passthrough relays had no deadline at all: a peer could hold one open
    // (its sockets, its task) for ever by sending nothing.
    let w = World::with_settings(ProxySettings {
        tcp_idle_timeout: Some(Duration::from_millis(300)),
        ..ProxySettings::default()
    })
    .await;
    let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dest = echo.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let mut b = [0u8; 64];
                while let Ok(n) = s.read(&mut b).await {
                    if n == 0 || s.write_all(&b[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let dialled = SocketAddr::new(IpAddr::V4(w.ip(world::OUTSIDE)), 7000);
    w.reach(dialled, dest);
    let mut s = TcpStream::connect(w.capture(dialled)).await.unwrap();
    // Bytes every 100 ms for a second keep it open.
    for _ in 0..10 {
        s.write_all(b"\x00x").await.unwrap();
        let mut got = [0u8; 2];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"\x00x");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(w.inputs.stats.tcp_idle_closed.get(), 0);
    // Then silence: closed within twice the timeout, and counted.
    let got = closed_within(&mut s, Duration::from_secs(2)).await;
    assert_eq!(got.as_deref(), Some(&b""[..]), "closed without a byte");
    assert_eq!(w.inputs.stats.tcp_idle_closed.get(), 1);
    assert_eq!(settles(&w).await, 0);
}
