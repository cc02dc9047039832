//! Shedding under load (issue #36 item 4): what a client sees when the daemon's memory is at
//! the pressure or the critical level, and when one peer opens more HTTP/2 streams than
//! `max_streams_per_peer` over its connections. The level is set here as the node's memory
//! monitor sets it (`node::memory`, tested on cgroup files); the OVERLOAD leg floods a daemon in
//! a real memory cgroup.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use aether::proxy::ProxySettings;
use aether::proxy::overload::{Level, Shed};

use crate::client::{h2_sender, parse};
use crate::world::{MESH, SLOW, World};

const FIVE: Duration = Duration::from_secs(5);

fn request(service: &str, extra: &str) -> String {
    format!("GET / HTTP/1.1\r\nhost: {service}.mp.{MESH}:8080\r\n{extra}\r\n")
}

fn shed(w: &World, why: Shed) -> u64 {
    w.inputs
        .overload
        .shed
        .get_or_create(&[("reason", why.code())])
        .get()
}

/// Whether the daemon closed `stream` without a byte of answer (end of stream or reset).
async fn closed_unanswered(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    match tokio::time::timeout(FIVE, stream.read(&mut buf)).await {
        Ok(Ok(0) | Err(_)) => true,
        Ok(Ok(_)) | Err(_) => false,
    }
}

/// One whole response off a kept connection.
async fn answer(stream: &mut TcpStream) -> crate::client::Answer {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(FIVE, async {
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before a whole response");
            got.extend_from_slice(&buf[..n]);
            if let Some(head) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let a = parse(&got);
                let len: usize = a.header("content-length").map_or(0, |v| v.parse().unwrap());
                if got.len() >= head + 4 + len {
                    return a;
                }
            }
        }
    })
    .await
    .expect("answered within 5 s")
}

#[tokio::test]
async fn under_memory_pressure_a_new_connection_is_closed_at_accept_and_an_open_one_is_served() {
    let w = World::start().await;
    let mut kept = TcpStream::connect(w.loopback()).await.unwrap();
    kept.write_all(request("mp-multi", "").as_bytes())
        .await
        .unwrap();
    assert_eq!(answer(&mut kept).await.body, "mp-multi:8080\n");

    w.inputs.overload.set_level(Level::Pressure);
    let mut fresh = TcpStream::connect(w.loopback()).await.unwrap();
    let _ = fresh.write_all(request("mp-multi", "").as_bytes()).await;
    assert!(
        closed_unanswered(&mut fresh).await,
        "a new connection is closed at accept"
    );
    assert_eq!(shed(&w, Shed::AcceptRefused), 1);
    // The open connection goes on.
    kept.write_all(request("mp-multi", "").as_bytes())
        .await
        .unwrap();
    assert_eq!(answer(&mut kept).await.body, "mp-multi:8080\n");

    w.inputs.overload.set_level(Level::Normal);
    let a = crate::client::get(w.loopback(), "/", &format!("mp-multi.mp.{MESH}:8080"), &[]).await;
    assert_eq!((a.status, a.body.as_str()), (200, "mp-multi:8080\n"));
}

#[tokio::test]
async fn at_the_critical_level_a_partial_head_goes_before_idle_connections_and_work_in_flight_finishes()
 {
    let w = World::start().await;
    // Idle: answered, then nothing.
    let mut idle = TcpStream::connect(w.loopback()).await.unwrap();
    idle.write_all(request("mp-multi", "").as_bytes())
        .await
        .unwrap();
    assert_eq!(answer(&mut idle).await.body, "mp-multi:8080\n");
    // A request in flight: its authorization check is answered 1.5 s after it arrives.
    let mut busy = TcpStream::connect(w.loopback()).await.unwrap();
    busy.write_all(request("mp-guarded", "x-authz-delay-ms: 1500\r\n").as_bytes())
        .await
        .unwrap();
    // Its check has reached the authorization server (at the critical level a new stream, the
    // check's too, would be refused).
    let authz = SocketAddr::new(IpAddr::V4(w.ip(SLOW)), 9191);
    tokio::time::timeout(FIVE, async {
        while crate::client::get(authz, "/count", "direct", &[])
            .await
            .body
            != "1\n"
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the check reaches the authorization server");
    // A 20 KB head on its way, with no end.
    let head = request("mp-multi", &format!("x-pad: {}\r\n", "a".repeat(20_000)));
    let mut partial = TcpStream::connect(w.loopback()).await.unwrap();
    partial
        .write_all(&head.as_bytes()[..head.len() - 2])
        .await
        .unwrap();
    tokio::time::timeout(FIVE, async {
        while w.inputs.overload.partial_heads().first() < Some(&20_000) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the daemon holds the partial head");

    w.inputs.overload.set_level(Level::Critical);
    // The candidates are the idle connections (this one, and the hop's behind it) and the
    // partial head: a quarter of them, rounded up, begins with the head.
    let (partials, _) = w.inputs.overload.shed_some(0);
    assert_eq!(partials, 1);
    assert!(
        closed_unanswered(&mut partial).await,
        "the partial head goes first"
    );
    assert_eq!(shed(&w, Shed::PartialHeadClosed), 1);
    // Then idle connections (idle for a second at least), the oldest first: the client's goes
    // within a few rounds.
    let mut rounds = 0;
    loop {
        let (partials, _) = w.inputs.overload.shed_some(0);
        assert_eq!(partials, 0);
        rounds += 1;
        let mut buf = [0u8; 16];
        let gone = tokio::time::timeout(Duration::from_millis(200), idle.read(&mut buf)).await;
        if let Ok(read) = gone {
            assert!(matches!(read, Ok(0) | Err(_)), "closed without a byte");
            break;
        }
        assert!(
            rounds < 25,
            "the idle connection is shed within 25 rounds (5 s)"
        );
    }
    assert!(shed(&w, Shed::IdleClosed) >= 1);
    // The request in flight finishes.
    let a = answer(&mut busy).await;
    assert_eq!((a.status, a.body.as_str()), (200, "mp-guarded:8080\n"));
    w.inputs.overload.set_level(Level::Normal);
}

fn refused_stream(e: &hyper::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(h2) = c.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        cause = c.source();
    }
    false
}

#[tokio::test]
async fn a_peer_holds_at_most_its_streams_over_all_its_connections_and_critical_refuses_new_ones() {
    let w = World::with_settings(ProxySettings {
        max_streams_per_peer: 2,
        ..ProxySettings::default()
    })
    .await;
    let req = |delay: &str| {
        http::Request::builder()
            .uri(format!("http://mp-guarded.mp.{MESH}:8080/"))
            .header("x-authz-delay-ms", delay)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let (mut a, mut b) = (h2_sender(w.loopback()).await, h2_sender(w.loopback()).await);
    // One request each first: the server's SETTINGS are in.
    for s in [&mut a, &mut b] {
        assert_eq!(s.send_request(req("0")).await.unwrap().status(), 200);
    }
    // One stream held on each connection.
    let held: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let resp = s.send_request(req("1500")).await.unwrap();
                let status = resp.status().as_u16();
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                (status, body)
            })
        })
        .collect();
    tokio::time::timeout(FIVE, async {
        while w.inputs.overload.streams_open() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("both streams are open");
    // A third, on either connection, is refused unprocessed.
    let third = a.send_request(req("0")).await.unwrap_err();
    assert!(refused_stream(&third), "REFUSED_STREAM, not {third:?}");
    assert_eq!(shed(&w, Shed::PeerStreams), 1);
    for h in held {
        let (status, body) = h.await.unwrap();
        assert_eq!((status, &body[..]), (200, &b"mp-guarded:8080\n"[..]));
    }
    // Their streams closed, the peer has room again.
    tokio::time::timeout(FIVE, async {
        while w.inputs.overload.streams_open() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the streams leave the count");
    assert_eq!(b.send_request(req("0")).await.unwrap().status(), 200);
    // At the critical level a peer holds a tenth of its cap (here: one stream) and no more.
    w.inputs.overload.set_level(Level::Critical);
    let mut first = b.clone();
    let held = tokio::spawn(async move { first.send_request(req("1500")).await.unwrap().status() });
    tokio::time::timeout(FIVE, async {
        while w.inputs.overload.streams_open() < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the stream is open");
    let refused = b.send_request(req("0")).await.unwrap_err();
    assert!(refused_stream(&refused), "REFUSED_STREAM, not {refused:?}");
    assert_eq!(shed(&w, Shed::StreamRefused), 1);
    assert_eq!(held.await.unwrap(), 200);
    w.inputs.overload.set_level(Level::Normal);
    assert_eq!(b.send_request(req("0")).await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_head_that_would_take_the_partial_heads_past_their_budget_is_closed_before_it_grows() {
    let w = World::start().await;
    let overload = &w.inputs.overload;
    // Other heads hold all but 8 KiB of the node's budget (`max_pending_head_bytes`).
    let held = aether::proxy::overload::DEFAULT_MAX_PENDING_HEAD_BYTES - 8 * 1024;
    overload.force_charge_head(held);
    // A head that arrives in one read needs none of it: served.
    let mut small = TcpStream::connect(w.loopback()).await.unwrap();
    small
        .write_all(request("mp-multi", "").as_bytes())
        .await
        .unwrap();
    assert_eq!(answer(&mut small).await.body, "mp-multi:8080\n");
    // A 40 KB head needs more than one read's room: closed unanswered, counted.
    let head = request("mp-multi", &format!("x-pad: {}\r\n", "a".repeat(40_000)));
    let mut large = TcpStream::connect(w.loopback()).await.unwrap();
    let _ = large.write_all(head.as_bytes()).await;
    assert!(
        closed_unanswered(&mut large).await,
        "the head past the budget is closed"
    );
    assert_eq!(shed(&w, Shed::HeadBudget), 1);
    assert_eq!(
        overload.pending_head_bytes(),
        held,
        "the closed head gave back what it took"
    );
    // With the budget free again, the same head is served, and gives back what it took.
    overload.release_head(held);
    let mut large = TcpStream::connect(w.loopback()).await.unwrap();
    large.write_all(head.as_bytes()).await.unwrap();
    assert_eq!(answer(&mut large).await.body, "mp-multi:8080\n");
    assert_eq!(overload.pending_head_bytes(), 0);
    assert_eq!(shed(&w, Shed::HeadBudget), 1);
}
