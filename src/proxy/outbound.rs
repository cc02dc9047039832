//! The capture listener (`0.0.0.0:18001`, transparent) and the loopback proxy port: accept,
//! recover the original destination, classify by the model, then raw TCP over the hop, HTTP,
//! TLS by server name, or passthrough (addressing.md §3).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

use super::access::{Destination, Line, Source, TcpConn};
use super::balance::{self, Outcome, Tried};
use super::hop::HopError;
use super::metrics::Direction;
use super::{ALPN_TCP, Inputs, PodCtx, count, hop, peek, sniff};
use crate::model::filters::pick_weighted;
use crate::resolve::decision::{
    AfterSniff, ConnDecision, HttpEntry, Sniffed, TcpBackend, TcpChoice,
};
use crate::resolve::{classify_connection, resolve_sniffed};

/// Accept captured connections of one pod.
pub async fn serve_capture(inputs: Arc<Inputs>, pod: Arc<PodCtx>, listener: TcpListener) {
    let errors = inputs.stats.accept_errors("capture");
    let mut acceptor = crate::accept::Acceptor::new(listener, "capture", errors);
    loop {
        let (stream, _) = acceptor.accept().await;
        count(&inputs.stats.captured);
        let Some(active) = super::Active::admit(&inputs, &pod) else {
            continue;
        };
        let inputs = inputs.clone();
        let pod = pod.clone();
        tokio::spawn(async move {
            pod.clone()
                .until_retired(Box::pin(captured(inputs, pod, stream)))
                .await;
            drop(active);
        });
    }
}

/// Accept on the loopback proxy port of one pod.
pub async fn serve_loopback(inputs: Arc<Inputs>, pod: Arc<PodCtx>, listener: TcpListener) {
    let errors = inputs.stats.accept_errors("loopback");
    let mut acceptor = crate::accept::Acceptor::new(listener, "loopback", errors);
    loop {
        let (stream, _) = acceptor.accept().await;
        let Some(active) = super::Active::admit(&inputs, &pod) else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let inputs = inputs.clone();
        let pod = pod.clone();
        tokio::spawn(async move {
            let _active = active;
            // Boxed: the task's own future stays small (issue #8, finding 13).
            let serve = Box::pin(super::http::serve(
                inputs.clone(),
                pod.clone(),
                stream,
                HttpEntry::Loopback,
            ));
            pod.until_retired(serve).await;
        });
    }
}

async fn captured(inputs: Arc<Inputs>, pod: Arc<PodCtx>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    // TPROXY keeps the original destination as the accepted socket's local address.
    let Ok(dialled) = pod.net.original_dst(&stream) else {
        return;
    };
    let model = inputs.model.load();
    let decision = classify_connection(&model, pod.caller(), dialled);
    drop(model);
    match decision {
        ConnDecision::Tcp(choice) => Box::pin(tcp(&inputs, &pod, stream, &choice)).await,
        ConnDecision::Passthrough(_) => {
            Box::pin(passthrough(&inputs, &pod, stream, dialled)).await;
        }
        ConnDecision::Close(why) => {
            if dialled.port() == crate::model::port::CAPTURE_PORT
                || dialled.port() == crate::model::port::MESH_HOP_PORT
            {
                count(&inputs.stats.reserved_dials);
            } else if inputs.model.load().contested(dialled.ip()) {
                count(&inputs.stats.contested_refused);
            }
            debug!(rule = why.rule, %dialled, "closed at accept");
        }
        ConnDecision::Sniff(plan) => {
            let sniffed = sniff_stream(&inputs, &stream).await;
            match resolve_sniffed(&plan, &sniffed) {
                // Boxed, each branch: the connection's task is as small as the branch it
                // takes (an HTTP server is kilobytes larger than a relay).
                AfterSniff::Http(entry) => {
                    Box::pin(super::http::serve(inputs, pod, stream, entry)).await;
                }
                AfterSniff::Tcp(choice) => Box::pin(tcp(&inputs, &pod, stream, &choice)).await,
                AfterSniff::Passthrough => {
                    Box::pin(passthrough(&inputs, &pod, stream, dialled)).await;
                }
                AfterSniff::Close => debug!(%dialled, "closed after sniffing"),
            }
        }
    }
}

/// Peek at the first bytes, at most the sniff bound (addressing.md §3.1). The bound is one
/// deadline from the accept: a client dripping bytes does not extend it. A client that closes
/// before the bytes decide anything ends the wait at once: its bytes are relayed as they are.
async fn sniff_stream(inputs: &Inputs, stream: &TcpStream) -> Sniffed {
    let mut buf = vec![0u8; 16 * 1024 + 5];
    // tokio's clock (std's in the daemon), so that a test with a paused clock sees the bound
    // exactly.
    let deadline = tokio::time::Instant::now() + inputs.settings.sniff_bound;
    let mut seen = 0;
    loop {
        let n = match peek::peek_more(stream, &mut buf, seen, deadline).await {
            peek::Peeked::Bytes(n) => n,
            peek::Peeked::Timeout => return Sniffed::Timeout,
            peek::Peeked::Closed | peek::Peeked::Failed => return Sniffed::Other,
        };
        match sniff::sniff(&buf[..n]) {
            sniff::Verdict::Known(s) => return s,
            sniff::Verdict::NeedMore if n == buf.len() => return Sniffed::Other,
            sniff::Verdict::NeedMore => seen = n,
        }
    }
}

/// Raw TCP to a choice (the default destination or a TCPRoute's weighted backends).
async fn tcp(inputs: &Inputs, pod: &PodCtx, mut stream: TcpStream, choice: &TcpChoice) {
    let weights: Vec<u32> = choice.backends.iter().map(|(w, _)| *w).collect();
    let Some(i) = pick_weighted(&weights, fastrand::u64(..)) else {
        return;
    };
    let target = match &choice.backends[i].1 {
        TcpBackend::Target(t) => t,
        TcpBackend::Invalid(why) => {
            debug!(rule = why.rule, "raw tcp to an invalid backend: closed");
            return;
        }
    };
    // The endpoint is chosen by `balance`; a hop that cannot be reached is tried once more on
    // another endpoint (issue #38): the client's bytes have not left yet, so nothing is sent
    // twice.
    let connect = Box::pin(balance::deliver_to(
        inputs,
        &target.endpoints,
        target.pod_port,
        (),
        |i, ()| async move {
            let endpoint = &target.endpoints[i];
            match hop::connect(inputs, pod, endpoint, target.pod_port, ALPN_TCP).await {
                Ok(tls) => Tried::<_, HopError, ()>::Done(tls),
                Err(e) => balance::hop_not_reached(e, ()),
            }
        },
    ));
    let (mut upstream, endpoint, _load) = match connect.await {
        Outcome::Reached { value, index, load } => (value, &target.endpoints[index], load),
        Outcome::NoEndpoint => {
            debug!(service = %target.service, "raw tcp with no endpoint: closed");
            return;
        }
        Outcome::Failed(e) => {
            warn!(error = %e, service = %target.service, "raw tcp hop failed");
            return;
        }
    };
    count(&inputs.stats.deliveries);
    let series = inputs
        .metrics
        .series(&target.service, target.port, pod.source());
    let mut conn = TcpConn::open(inputs, series, Direction::Outbound, || Line {
        source: Source::pod(pod, &inputs.settings.trust_domain),
        path: tcp_path(target.port),
        decision: "deliver",
        destination: Destination {
            service: Some(target.service.clone()),
            port: Some(target.port),
            pod: Some(
                endpoint
                    .pod
                    .as_deref()
                    .map_or_else(|| endpoint.address.to_string(), str::to_owned),
            ),
            route: None,
            rule: target.why.rule,
        },
    });
    let _ = super::relay(inputs, &mut stream, &mut upstream, &mut conn).await;
}

/// The path a captured byte stream took in (the access log's `path`).
fn tcp_path(port: u16) -> &'static str {
    if port == super::LEGACY_PORT {
        "legacy-18082"
    } else {
        "captured"
    }
}

/// Passthrough at the byte level: to the dialled address, from the pod's own address; to a
/// mesh pod over the hop instead ([`passthrough`], model.md §12.5 item 1).
async fn passthrough(inputs: &Inputs, pod: &PodCtx, mut stream: TcpStream, dialled: SocketAddr) {
    inputs
        .metrics
        .passthrough(super::metrics::PassProtocol::Tcp);
    let Some((mut upstream, target, _load)) =
        Box::pin(super::passthrough::connect(inputs, pod, dialled)).await
    else {
        return;
    };
    // A passthrough has no destination service unless it crosses the hop to a mesh pod.
    let series = match &target.hop {
        Some(service) => inputs
            .metrics
            .series(service, target.dst.port(), pod.source()),
        None => inputs.metrics.unknown(pod.source()),
    };
    let mut conn = TcpConn::open(inputs, series, Direction::Outbound, || Line {
        source: Source::pod(pod, &inputs.settings.trust_domain),
        path: tcp_path(dialled.port()),
        decision: if target.hop.is_some() {
            "l4-hop"
        } else {
            "passthrough"
        },
        destination: Destination {
            service: target.hop.clone(),
            port: Some(dialled.port()),
            pod: Some(target.dst.to_string()),
            route: None,
            rule: "addressing.md §7.2 passthrough",
        },
    });
    let _ = super::relay(inputs, &mut stream, &mut upstream, &mut conn).await;
}
