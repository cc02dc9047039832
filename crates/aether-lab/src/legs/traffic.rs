//! Traffic the legs share: one request on a new connection through node-a's daemon, a load of
//! them until told to stop, and a raw stream echoed line by line. Its own module so the legs
//! that load the mesh (hostile, overload, etcd) read it without reading each other.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Check, Env, echo, name, probe};
use crate::workload::probe::{Connector, HttpRequest, Send};

/// The captured client of the load and the raw stream.
const CLIENT: &str = "mp-client";

/// One request of the UPGRADE load: a new connection each, captured (mp-client) or on the
/// loopback proxy port (mp-client-nocapture), both served by node-a's daemon.
pub(super) async fn one_request(env: &Env, captured: bool) -> Check {
    let host = format!("{}:8080", env.mesh("mp-multi"));
    let (pod, p) = if captured {
        (
            CLIENT,
            probe(
                name(&env.mesh("mp-multi"), 8080),
                Send::Http(HttpRequest::get("/")),
            ),
        )
    } else {
        (
            "mp-client-nocapture",
            probe(
                super::loopback(),
                Send::Http(HttpRequest {
                    host: crate::workload::probe::Host::Values(vec![host]),
                    ..HttpRequest::get("/")
                }),
            ),
        )
    };
    let o = env.probe(pod, &p).await?;
    echo(&o, "mp-multi", 8080)
}

/// How long a load goes on after its `stop` to reach its minimum of answered requests: a bound
/// for a machine that cannot answer at all, never reached otherwise.
const LOAD_MINIMUM_BOUND: Duration = Duration::from_secs(120);

/// Requests on new connections through node-a's daemon, captured and loopback in turn
/// ([`one_request`]), `pause` apart, until `stop` is set and `least` have been answered (a
/// slow machine answers fewer in the same window: the window grows instead of the leg failing
/// on a count, issue #36 item 7): how many succeeded, and why each other one failed. Once one
/// has failed the load ends at `stop`.
pub(super) async fn load_until(
    env: &Env,
    stop: &std::sync::atomic::AtomicBool,
    pause: Duration,
    least: u32,
) -> (u32, Vec<String>) {
    let (mut ok, mut failed) = (0u32, Vec::new());
    let mut i = 0u32;
    let mut stopped = None;
    loop {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            let since = *stopped.get_or_insert_with(aether::time::now);
            if ok >= least || !failed.is_empty() || since.elapsed() > LOAD_MINIMUM_BOUND {
                break;
            }
        }
        match one_request(env, i.is_multiple_of(2)).await {
            Ok(_) => ok += 1,
            Err(e) => failed.push(e),
        }
        i += 1;
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    (ok, failed)
}

/// A raw stream from mp-client to mp-mixed:9000 (through node-a's daemon), echoed once.
pub(super) async fn raw_stream(env: &Env) -> Result<TcpStream, String> {
    let mixed = SocketAddr::new(env.cluster_ip("mp", "mp-mixed")?, 9000);
    let netns = env.client_netns(CLIENT)?;
    let socket = Connector::in_netns(netns.clone(), env.home.clone())
        .tcp_socket(mixed)
        .map_err(|e| e.to_string())?;
    let mut raw = tokio::time::timeout(Duration::from_secs(3), socket.connect(mixed))
        .await
        .map_err(|_| "raw stream: connect hung".to_owned())?
        .map_err(|e| format!("raw stream: {e}"))?;
    raw.write_all(b"before\n")
        .await
        .map_err(|e| e.to_string())?;
    read_echo(&mut raw, "before").await?;
    Ok(raw)
}

/// Read until a line holding `want` arrives (within 3 s).
pub(super) async fn read_echo(s: &mut TcpStream, want: &str) -> Result<(), String> {
    read_echo_within(s, want, Duration::from_secs(3)).await
}

/// Read until a line holding `want` arrives, within `bound`.
pub(super) async fn read_echo_within(
    s: &mut TcpStream,
    want: &str,
    bound: Duration,
) -> Result<(), String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + bound;
    while !String::from_utf8_lossy(&got).contains(want) {
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .map_err(|_| format!("no echo of {want:?} within {bound:?}"))?
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err(format!("closed before the echo of {want:?}"));
        }
        got.extend_from_slice(&buf[..n]);
    }
    Ok(())
}
