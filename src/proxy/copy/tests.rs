use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

use super::*;

/// A pair of streams joined by the relay: what a client writes to `client` reaches `server`.
fn relayed(
    capacity: usize,
    idle: Option<Duration>,
) -> (
    tokio::io::DuplexStream,
    tokio::io::DuplexStream,
    tokio::task::JoinHandle<io::Result<Ended>>,
) {
    let (client, mut near) = duplex(capacity);
    let (mut far, server) = duplex(capacity);
    let relay = tokio::spawn(async move { bidirectional(&mut near, &mut far, idle).await });
    (client, server, relay)
}

#[tokio::test]
async fn bytes_cross_both_ways_and_each_end_of_stream_is_passed_on() {
    let (mut client, mut server, relay) = relayed(64, None);
    client.write_all(b"hello").await.unwrap();
    let mut got = [0u8; 5];
    server.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"hello");
    server.write_all(b"back").await.unwrap();
    let mut got = [0u8; 4];
    client.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"back");

    // The client ends its side: the server sees the end, and can still answer.
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    server.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    server.write_all(b"last").await.unwrap();
    server.shutdown().await.unwrap();
    let mut tail = Vec::new();
    client.read_to_end(&mut tail).await.unwrap();
    assert_eq!(tail, b"last");
    assert_eq!(
        relay.await.unwrap().unwrap(),
        Ended::Closed {
            a_to_b: 5,
            b_to_a: 8
        }
    );
}

#[tokio::test]
async fn a_slow_writer_gets_every_byte_in_order() {
    // Pipes of 7 bytes: every write of the relay is partial, so the kept remainder is used.
    let (mut client, mut server, relay) = relayed(7, None);
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        client.write_all(&sent).await.unwrap();
        client.shutdown().await.unwrap();
        client
    });
    let mut got = Vec::new();
    server.read_to_end(&mut got).await.unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "bytes reordered or changed");
    drop(server);
    let _client = writer.await.unwrap();
    let ended = relay.await.unwrap().unwrap();
    assert_eq!(
        ended,
        Ended::Closed {
            a_to_b: data.len() as u64,
            b_to_a: 0
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_relay_with_no_byte_for_the_idle_timeout_ends() {
    let (_client, _server, relay) = relayed(64, Some(Duration::from_secs(60)));
    let started = Instant::now();
    assert_eq!(relay.await.unwrap().unwrap(), Ended::Idle);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(60) && waited <= Duration::from_secs(120),
        "ended after {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn bytes_keep_a_relay_open_past_the_idle_timeout() {
    let (mut client, mut server, relay) = relayed(64, Some(Duration::from_secs(60)));
    let started = Instant::now();
    // A byte every 50 s for 10 minutes: never a whole idle timeout without one.
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_secs(50)).await;
        client.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        server.read_exact(&mut b).await.unwrap();
        assert!(!relay.is_finished(), "closed after {:?}", started.elapsed());
    }
    // Then silence: it ends within two timeouts of the last byte.
    let last = Instant::now();
    assert_eq!(relay.await.unwrap().unwrap(), Ended::Idle);
    assert!(last.elapsed() <= Duration::from_secs(120));
}

#[tokio::test]
async fn a_failed_side_ends_the_relay_with_its_error() {
    let (client, mut near) = duplex(64);
    let (far, server) = duplex(64);
    drop(server);
    let mut far = far;
    let relay = tokio::spawn(async move { bidirectional(&mut near, &mut far, None).await });
    let mut client = client;
    client.write_all(b"into a closed peer").await.unwrap();
    let err = relay.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
}
