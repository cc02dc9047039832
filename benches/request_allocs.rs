//! Heap allocations per routed HTTP request (issue #38, part 4), counted by a counting global
//! allocator over the in-process data plane of `tests/direct.rs` (no root, no namespaces).
//!
//! Rows, each one keep-alive HTTP/1.1 connection of sequential `GET`s with four header fields:
//!
//! - **direct**: the client to the echo on `mp-multi-0`'s address, no mesh: what the client and
//!   the echo allocate by themselves.
//! - **mesh**: the client's dial to `mp-multi:8080` captured, resolved, carried over the pooled
//!   mTLS hop to the destination's inbound side, delivered to the echo (no filters apply): the
//!   cross-node shape, with both daemons' parts in this one process.
//! - **data plane**: mesh less direct, what the mesh adds per request.
//!
//! A request's figures are the allocator's counts from writing its head to reading its whole
//! answer; work a task finishes after the answer is read falls into the next request's window,
//! which sequential requests keep even. Printed: the median over [`REQUESTS`] requests after
//! [`WARMUP`], of the allocations (each `alloc` and `realloc`) and of the bytes they asked for.
//! Counts, not times: the figures are the same on any machine, for a given build.
//!
//! Run: `cargo bench --features testing --bench request_allocs`
//! (`AETHER_ALLOC_REQUESTS=<n>` measures another number of requests).
#![allow(clippy::print_stdout, clippy::unwrap_used, missing_docs)] // A benchmark harness reports on stdout.

#[path = "../tests/direct/world.rs"]
mod world;

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;

use std::net::{IpAddr, SocketAddr};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use world::{MESH, MULTI, World};

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting<std::alloc::System> =
    counting_alloc::Counting(std::alloc::System);

/// Requests measured per row (median taken), unless `AETHER_ALLOC_REQUESTS` says otherwise.
const REQUESTS: usize = 3000;
/// Requests sent on the connection before measuring: the pooled hop, the kept application
/// connection and the certificates are made by then.
const WARMUP: usize = 200;

/// One keep-alive connection and its request, written once so that the client allocates nothing
/// per request.
struct Client {
    stream: TcpStream,
    head: Vec<u8>,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: SocketAddr, host: &str) -> Self {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let head = format!(
            "GET /bench?q=1 HTTP/1.1\r\nhost: {host}\r\nuser-agent: request-allocs/1\r\n\
             accept: */*\r\nx-request-id: 0123456789abcdef\r\n\r\n"
        )
        .into_bytes();
        Self {
            stream,
            head,
            buf: vec![0; 64 * 1024],
        }
    }

    /// One request; its answer read whole (the echo gives a `Content-Length`) and checked to
    /// come from `mp-multi` on 8080.
    async fn one(&mut self) {
        self.stream.write_all(&self.head).await.unwrap();
        let mut len = 0;
        loop {
            let n = self.stream.read(&mut self.buf[len..]).await.unwrap();
            assert!(n > 0, "closed before the answer was whole");
            len += n;
            let got = &self.buf[..len];
            let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            assert!(got.starts_with(b"HTTP/1.1 200"), "not a 200");
            let length = content_length(&got[..end]).expect("a content-length");
            if len >= end + 4 + length {
                assert_eq!(len, end + 4 + length, "one answer per request");
                let body = &got[end + 4..];
                assert!(
                    body.windows(13).any(|w| w == b"mp-multi:8080"),
                    "not answered by mp-multi:8080"
                );
                return;
            }
        }
    }
}

fn content_length(head: &[u8]) -> Option<usize> {
    head.split(|b| *b == b'\n').find_map(|line| {
        let line = std::str::from_utf8(line).ok()?.trim();
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// Allocations and bytes per request: the median of each over `n` requests.
async fn measure(client: &mut Client, n: usize) -> (u64, u64) {
    for _ in 0..WARMUP {
        client.one().await;
    }
    let mut allocations = Vec::with_capacity(n);
    let mut bytes = Vec::with_capacity(n);
    for _ in 0..n {
        let (a0, b0) = counting_alloc::made();
        client.one().await;
        let (a1, b1) = counting_alloc::made();
        allocations.push(a1 - a0);
        bytes.push(b1 - b0);
    }
    (median(&mut allocations), median(&mut bytes))
}

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn main() {
    let n = std::env::var("AETHER_ALLOC_REQUESTS")
        .ok()
        .map_or(REQUESTS, |v| {
            v.parse().expect("AETHER_ALLOC_REQUESTS: a number")
        });
    // The daemon's shape: a multi-thread runtime (two workers, as on the 2-core machines).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let w = World::start().await;
        let direct = SocketAddr::new(IpAddr::V4(w.ip(MULTI)), 8080);
        let host = format!("mp-multi.mp.{MESH}:8080");
        let mut client = Client::connect(direct, &host).await;
        let (direct_allocs, direct_bytes) = measure(&mut client, n).await;
        let mut client = Client::connect(w.capture_service("mp-multi", 8080), &host).await;
        let (mesh_allocs, mesh_bytes) = measure(&mut client, n).await;
        println!("allocations per routed HTTP/1.1 request, median of {n} (after {WARMUP}):");
        println!("| path | allocations | bytes |");
        println!("|---|---|---|");
        println!("| direct (client and echo) | {direct_allocs} | {direct_bytes} |");
        println!("| mesh, captured, mTLS hop, inbound, echo | {mesh_allocs} | {mesh_bytes} |");
        println!(
            "| data plane (mesh less direct) | {} | {} |",
            mesh_allocs.saturating_sub(direct_allocs),
            mesh_bytes.saturating_sub(direct_bytes)
        );
    });
}
