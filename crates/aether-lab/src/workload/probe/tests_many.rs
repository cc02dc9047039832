//! Many requests ([`Probe::run_many`]) against the echoes on loopback, through a forwarder
//! that counts the connections it accepts: exactly N answers, and no more connections than
//! keep-alive allows.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::tests::{WL, echo};
use super::tests_grpc::{grpc_echo, grpc_probe, h2_refuser};
use super::*;
use crate::workload::echo::ListenerKind;

/// A TCP forwarder to `to` on 127.0.0.1; the counter is the connections it accepted.
async fn counting(to: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let (mut down, _) = l.accept().await.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut up = TcpStream::connect(to).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
            });
        }
    });
    (addr, accepted)
}

fn http_probe(addr: SocketAddr, version: HttpVersion) -> Probe {
    let mut r = HttpRequest::get("/");
    r.version = version;
    let mut p = Probe::new(Dial::Addr(addr), Send::Http(r));
    p.timeout = Duration::from_secs(5);
    p
}

/// Run `many`, keeping every outcome.
async fn run_many(p: &Probe, many: Many) -> (Summary, Vec<Outcome>) {
    let mut outcomes = Vec::new();
    let summary = p
        .run_many_each(&Connector::current(), &Resolver::default(), many, |_, o| {
            outcomes.push(o.clone());
        })
        .await
        .expect("run_many");
    (summary, outcomes)
}

fn kept(count: usize, concurrency: usize) -> Many {
    Many {
        count,
        concurrency,
        keep_alive: true,
    }
}

fn connections_seen(outcomes: &[Outcome]) -> usize {
    outcomes
        .iter()
        .filter_map(|o| o.local_addr)
        .collect::<BTreeSet<_>>()
        .len()
}

#[tokio::test]
async fn http11_keep_alive_answers_every_request_on_at_most_c_connections() {
    let echo_addr = echo(&[ListenerKind::Http]).await[0].addr;
    let (addr, accepted) = counting(echo_addr).await;
    let p = http_probe(addr, HttpVersion::Http11);
    let (summary, outcomes) = run_many(&p, kept(20, 4)).await;

    assert_eq!(outcomes.len(), 20);
    assert_eq!(
        (summary.requests, summary.answered, summary.failed),
        (20, 20, 0)
    );
    let ident = format!("{WL}:{}", echo_addr.port());
    assert_eq!(summary.by_ident.get(&ident), Some(&20), "{summary:?}");
    assert_eq!(summary.by_pod.get("mp-test-0"), Some(&20));
    assert_eq!(summary.by_status.get(&200), Some(&20));
    assert!(summary.by_reason.is_empty() && summary.by_error.is_empty());
    let opened = accepted.load(Ordering::SeqCst);
    assert!((1..=4).contains(&opened), "{opened} connections");
    assert_eq!(summary.connections, opened);
    assert!(connections_seen(&outcomes) <= 4);
    assert_eq!(outcomes.iter().filter(|o| !o.reused).count(), opened);
}

#[tokio::test]
async fn without_keep_alive_every_request_has_its_own_connection() {
    let echo_addr = echo(&[ListenerKind::Http]).await[0].addr;
    let (addr, accepted) = counting(echo_addr).await;
    let p = http_probe(addr, HttpVersion::Http11);
    let many = Many {
        count: 6,
        concurrency: 3,
        keep_alive: false,
    };
    let (summary, outcomes) = run_many(&p, many).await;
    assert_eq!(summary.answered, 6);
    assert_eq!(accepted.load(Ordering::SeqCst), 6);
    assert_eq!(summary.connections, 6);
    assert!(outcomes.iter().all(|o| !o.reused));
}

#[tokio::test]
async fn h2c_keep_alive_multiplexes_every_request_on_one_connection() {
    let echo_addr = echo(&[ListenerKind::Http]).await[0].addr;
    let (addr, accepted) = counting(echo_addr).await;
    let p = http_probe(addr, HttpVersion::H2c);
    let (summary, outcomes) = run_many(&p, kept(20, 4)).await;

    assert_eq!(
        (summary.requests, summary.answered),
        (20, 20),
        "{summary:?}"
    );
    let ident = format!("{WL}:{}", echo_addr.port());
    assert_eq!(summary.by_ident.get(&ident), Some(&20));
    assert_eq!(summary.by_status.get(&200), Some(&20));
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    assert_eq!(summary.connections, 1);
    assert_eq!(connections_seen(&outcomes), 1);
    assert!(
        outcomes
            .iter()
            .all(|o| o.version.as_deref() == Some("HTTP/2"))
    );
}

#[tokio::test]
async fn grpc_keep_alive_multiplexes_every_call_on_one_connection() {
    let echo_addr = grpc_echo().await;
    let (addr, accepted) = counting(echo_addr).await;
    let p = grpc_probe(addr, GrpcRequest::default());
    let (summary, outcomes) = run_many(&p, kept(12, 4)).await;

    assert_eq!(
        (summary.requests, summary.answered),
        (12, 12),
        "{summary:?}"
    );
    let ident = format!("{WL}:{}", echo_addr.port());
    assert_eq!(summary.by_ident.get(&ident), Some(&12));
    assert_eq!(summary.by_pod.get("mp-test-0"), Some(&12));
    assert_eq!(summary.by_grpc_status.get("OK"), Some(&12));
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    assert_eq!(connections_seen(&outcomes), 1);
}

#[tokio::test]
async fn refusals_are_counted_by_status_and_reason_and_name_no_echo() {
    let addr = h2_refuser().await;
    let p = grpc_probe(addr, GrpcRequest::default());
    let (summary, _) = run_many(&p, kept(5, 2)).await;
    assert_eq!(summary.answered, 5);
    assert_eq!(summary.by_status.get(&421), Some(&5));
    assert_eq!(summary.by_reason.get("port-mismatch"), Some(&5));
    assert!(summary.by_ident.is_empty(), "{summary:?}");
    assert!(summary.by_grpc_status.values().sum::<usize>() == 5);

    let json = serde_json::to_value(&summary).unwrap();
    assert_eq!(json["by_status"]["421"], 5);
    assert_eq!(json["by_reason"]["port-mismatch"], 5);
}

#[tokio::test]
async fn connect_failures_are_counted_as_errors() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let p = http_probe(addr, HttpVersion::Http11);
    let (summary, _) = run_many(&p, kept(3, 2)).await;
    assert_eq!((summary.answered, summary.failed), (0, 3));
    assert_eq!(summary.by_error.values().sum::<usize>(), 3);
    assert!(summary.by_error.keys().all(|k| k.starts_with("connect: ")));
    assert_eq!(summary.connections, 0);
}

/// A server that answers one request per connection (framed by Content-Length, without
/// `Connection: close`) and then closes it.
async fn one_per_connection() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 1024];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nonce:8080\n")
                    .await;
            });
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn a_kept_connection_the_server_closed_is_replaced_without_a_failed_request() {
    let (addr, accepted) = one_per_connection().await;
    let p = http_probe(addr, HttpVersion::Http11);
    let (summary, outcomes) = run_many(&p, kept(4, 1)).await;
    assert_eq!((summary.answered, summary.failed), (4, 0), "{outcomes:?}");
    assert_eq!(summary.by_ident.get("once:8080"), Some(&4));
    assert_eq!(accepted.load(Ordering::SeqCst), 4);
}

#[test]
fn identities_are_read_from_the_answers_of_every_echo_kind() {
    let with_body = |body: &str| Outcome {
        status: Some(200),
        body: body.as_bytes().to_vec(),
        ..Outcome::default()
    };
    assert_eq!(
        with_body("mp-multi:9090\n").ident().as_deref(),
        Some("mp-multi:9090")
    );
    let raw = Outcome {
        body: b"mp-serverfirst:3306 ready\npod mp-serverfirst-1\n".to_vec(),
        ..Outcome::default()
    };
    assert_eq!(raw.ident().as_deref(), Some("mp-serverfirst:3306"));
    assert_eq!(raw.pod().as_deref(), Some("mp-serverfirst-1"));
    let json = with_body(r#"{"workload":"mp-nine","pod":"mp-nine-0","port":9000}"#);
    assert_eq!(json.ident().as_deref(), Some("mp-nine:9000"));
    assert_eq!(json.pod().as_deref(), Some("mp-nine-0"));
    let refusal = with_body("port-mismatch\nservice: mp-multi.mp\nports: 8080/http\n");
    assert_eq!(refusal.ident(), None);
    assert_eq!(refusal.pod(), None);
}
