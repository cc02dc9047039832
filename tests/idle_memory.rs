//! What an idle connection costs the data plane in heap (issue #8, finding 13), counted by a
//! counting global allocator over the in-process world of `tests/direct.rs`: many connections
//! are opened through the capture listener, used once, and held idle; the live heap they add,
//! per connection, must stay under a bound. Bytes, not time: the count is the same on any
//! machine. (Resident memory of whole daemons is measured by `benches/memory.rs`.)
//!
//! One test function runs every phase in turn, so that no other test of this binary allocates
//! while a phase counts.
#![allow(clippy::unwrap_used)] // Tests unwrap: a panic is the failure report (STYLE.md §6.4).

#[allow(dead_code)] // Each test binary uses part of the client.
#[path = "direct/client.rs"]
mod client;
#[path = "direct/world.rs"]
mod world;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use world::{MESH, OUTSIDE, World};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting<std::alloc::System> =
    counting_alloc::Counting(std::alloc::System);

/// Connections per phase.
const N: usize = 200;

/// The heap bound of one idle keep-alive HTTP/1.1 connection through the capture listener.
/// hyper's own buffers are 16 KiB of it (8 KiB read, 8 KiB write, kept for the connection's
/// life); before issue #8 the connection also kept its first head's 16 KiB read buffer and room
/// for a whole request's future (50.4 KiB in all in a debug build; 22.5 KiB after).
const HTTP_BOUND: isize = 28 * 1024;

/// The heap bound of one idle relayed byte stream (a captured passthrough): before issue #8 the
/// relay held two 8 KiB buffers for the connection's life (23.4 KiB in all in a debug build;
/// 4.3 KiB after, its sockets and tasks, the test's own included).
const RELAY_BOUND: isize = 8 * 1024;

async fn quiet() -> isize {
    // Connection tasks finish their last step after the client has its answer: read once the
    // live bytes hold still for 100 ms (on a slow machine that takes longer; bounded by 10 s).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut last = counting_alloc::live();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = counting_alloc::live();
        if now == last || tokio::time::Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

/// One keep-alive request, its answer read whole (the echo gives a `Content-Length`).
async fn one_request(addr: SocketAddr, host: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!("GET / HTTP/1.1\r\nhost: {host}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the answer was whole: {got:?}");
        got.extend_from_slice(&buf[..n]);
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .expect("a content-length");
            if got.len() >= end + 4 + length {
                assert!(
                    String::from_utf8_lossy(&got[end + 4..]).contains("mp-multi:8080"),
                    "{got:?}"
                );
                return stream;
            }
        }
    }
}

/// A byte echo outside the mesh, for the relay phase.
async fn byte_echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
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
    addr
}

/// Bytes through a relay, echoed.
async fn one_relay(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(b"\x00ping").await.unwrap();
    let mut got = [0u8; 5];
    stream.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"\x00ping");
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_holds_no_buffer_it_does_not_need() {
    let w = World::start().await;

    // HTTP/1.1 keep-alive through the capture listener, delivered over the pooled hop.
    let addr = w.capture_service("mp-multi", 8080);
    let host = format!("mp-multi.mp.{MESH}:8080");
    // Warm-up: the pooled hop, the kept application connection, certificates.
    for _ in 0..2 {
        drop(one_request(addr, &host).await);
    }
    let before = quiet().await;
    let mut held = Vec::new();
    for _ in 0..N {
        held.push(one_request(addr, &host).await);
    }
    let per_http = (quiet().await - before) / N as isize;
    drop(held);

    // Bytes passed through to a destination outside the mesh.
    let dialled = SocketAddr::new(IpAddr::V4(w.ip(OUTSIDE)), 7000);
    w.reach(dialled, byte_echo().await);
    let addr = w.capture(dialled);
    drop(one_relay(addr).await);
    let before = quiet().await;
    let mut held = Vec::new();
    for _ in 0..N {
        held.push(one_relay(addr).await);
    }
    let per_relay = (quiet().await - before) / N as isize;
    drop(held);

    eprintln!("heap per idle connection: HTTP {per_http} B, relayed bytes {per_relay} B");
    assert!(
        per_http <= HTTP_BOUND,
        "an idle HTTP connection holds {per_http} B of heap (bound {HTTP_BOUND})"
    );
    assert!(
        per_relay <= RELAY_BOUND,
        "an idle relayed stream holds {per_relay} B of heap (bound {RELAY_BOUND})"
    );
}
