//! The server on 127.0.0.1 sockets, with a fake upstream run by the test.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use hickory_proto::rr::Name;
use tokio::sync::mpsc;

use hickory_proto::op::Query;

use super::*;
use crate::model::names::Domains;
use crate::model::{Snapshot, registrar};

const WAIT: Duration = Duration::from_secs(5);
/// The address the fake upstream answers every A query with.
const UPSTREAM_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 7);
/// The TTL the fake upstream writes, to recognise its reply.
const UPSTREAM_TTL: u32 = 4242;

fn snapshot() -> Snapshot {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/mp");
    let mut snapshot = crate::registry::file::load_dir(&dir).unwrap().snapshot;
    registrar::complete_snapshot(&mut snapshot, "10.96.0.0/16".parse().unwrap());
    snapshot
}

fn cluster_ip(s: &Snapshot, ns: &str, name: &str) -> IpAddr {
    s.services
        .iter()
        .find(|x| x.namespace == ns && x.name == name)
        .unwrap()
        .cluster_ips[0]
}

fn host_socket() -> ForwardSocketFactory {
    Arc::new(|upstream: SocketAddr| {
        let any: SocketAddr = if upstream.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
        let socket = std::net::UdpSocket::bind(any)?;
        socket.set_nonblocking(true)?;
        UdpSocket::from_std(socket)
    })
}

/// A UDP resolver that answers every query with one A record and reports what it received.
async fn fake_upstream() -> (SocketAddr, mpsc::UnboundedReceiver<Vec<u8>>) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65535];
        loop {
            let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
                return;
            };
            let _ = tx.send(buf[..n].to_vec());
            let query = Message::from_vec(&buf[..n]).unwrap();
            let mut reply = Message::response(query.metadata.id, OpCode::Query);
            reply.metadata.recursion_available = true;
            reply.add_queries(query.queries.clone());
            reply.add_answer(Record::from_rdata(
                query.queries[0].name().clone(),
                UPSTREAM_TTL,
                RData::A(A(UPSTREAM_IP)),
            ));
            socket
                .send_to(&reply.to_vec().unwrap(), peer)
                .await
                .unwrap();
        }
    });
    (addr, rx)
}

struct Running {
    udp: SocketAddr,
    tcp: SocketAddr,
    stats: Arc<DnsStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start(snapshot: &Snapshot, upstreams: Vec<SocketAddr>, timeout: Duration) -> Running {
    start_with(snapshot, upstreams, timeout, TcpLimits::default()).await
}

async fn start_with(
    snapshot: &Snapshot,
    upstreams: Vec<SocketAddr>,
    timeout: Duration,
    limits: TcpLimits,
) -> Running {
    let domains = Domains {
        mesh: "aether.internal".to_owned(),
        cluster: "cluster.local".to_owned(),
    };
    let table = Arc::new(ArcSwap::from_pointee(DnsTable::build(
        snapshot, &domains, true,
    )));
    let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (udp_addr, tcp_addr) = (udp.local_addr().unwrap(), tcp.local_addr().unwrap());
    let server = DnsServer::new(table, upstreams, host_socket())
        .with_forward_timeout(timeout)
        .with_tcp_limits(limits);
    let stats = server.stats();
    let task = tokio::spawn(server.run(udp, tcp));
    Running {
        udp: udp_addr,
        tcp: tcp_addr,
        stats,
        task,
    }
}

fn query(name: &str, qtype: RecordType) -> Message {
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    m
}

async fn udp_exchange(server: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
    let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    client.send_to(bytes, server).await.unwrap();
    let mut buf = vec![0u8; 65535];
    match tokio::time::timeout(Duration::from_millis(500), client.recv_from(&mut buf)).await {
        Ok(Ok((n, _))) => Some(buf[..n].to_vec()),
        _ => None,
    }
}

async fn ask(server: SocketAddr, q: &Message) -> Message {
    let reply = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(reply) = udp_exchange(server, &q.to_vec().unwrap()).await {
                return reply;
            }
        }
    })
    .await
    .expect("a reply");
    let reply = Message::from_vec(&reply).unwrap();
    assert_eq!(reply.metadata.id, q.metadata.id);
    assert_eq!(reply.metadata.message_type, MessageType::Response);
    reply
}

fn addresses(m: &Message) -> Vec<IpAddr> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_mesh_name_gets_its_cluster_ip_and_no_aaaa() {
    let s = snapshot();
    let server = start(&s, Vec::new(), FORWARD_TIMEOUT).await;

    let a = ask(
        server.udp,
        &query("mp-multi.mp.aether.internal.", RecordType::A),
    )
    .await;
    assert_eq!(a.metadata.response_code, ResponseCode::NoError);
    assert!(a.metadata.authoritative);
    assert_eq!(addresses(&a), [cluster_ip(&s, "mp", "mp-multi")]);
    assert_eq!(a.answers[0].ttl, RECORD_TTL);

    let aaaa = ask(
        server.udp,
        &query("mp-multi.mp.aether.internal.", RecordType::AAAA),
    )
    .await;
    assert_eq!(aaaa.metadata.response_code, ResponseCode::NoError);
    assert!(aaaa.answers.is_empty(), "{aaaa:?}");
    assert_eq!(server.stats.counts().answered, 2);
}

#[tokio::test]
async fn the_answer_keeps_the_spelling_of_the_question() {
    let s = snapshot();
    let server = start(&s, Vec::new(), FORWARD_TIMEOUT).await;
    let q = query("MP-Multi.mp.Aether.Internal.", RecordType::A);
    let a = ask(server.udp, &q).await;
    assert_eq!(a.queries, q.queries);
    assert_eq!(a.answers[0].name.to_ascii(), "MP-Multi.mp.Aether.Internal.");
}

#[tokio::test]
async fn a_kubernetes_name_gets_its_cluster_ip_in_file_mode() {
    let s = snapshot();
    let server = start(&s, Vec::new(), FORWARD_TIMEOUT).await;
    let a = ask(
        server.udp,
        &query("mp-owned.mp.svc.cluster.local.", RecordType::A),
    )
    .await;
    assert_eq!(addresses(&a), ["10.96.100.10".parse::<IpAddr>().unwrap()]);
}

#[tokio::test]
async fn an_unknown_name_is_forwarded_unchanged_and_the_reply_relayed() {
    let s = snapshot();
    let (upstream, mut received) = fake_upstream().await;
    let server = start(&s, vec![upstream], FORWARD_TIMEOUT).await;

    let q = query("www.example.com.", RecordType::A);
    let sent = q.to_vec().unwrap();
    let a = ask(server.udp, &q).await;
    assert_eq!(addresses(&a), [IpAddr::V4(UPSTREAM_IP)]);
    assert_eq!(a.answers[0].ttl, UPSTREAM_TTL, "the upstream's own record");
    assert_eq!(received.recv().await.unwrap(), sent, "forwarded unchanged");
    // A name under the mesh domain that the table does not hold is answered NXDOMAIN here,
    // never forwarded.
    let b = ask(
        server.udp,
        &query("nope.mp.aether.internal.", RecordType::A),
    )
    .await;
    assert_eq!(b.metadata.response_code, ResponseCode::NXDomain);
    assert!(addresses(&b).is_empty());
    assert_eq!(server.stats.counts().forwarded, 1);
}

#[tokio::test]
async fn without_an_upstream_a_foreign_name_gets_servfail() {
    let s = snapshot();
    let server = start(&s, Vec::new(), FORWARD_TIMEOUT).await;
    let a = ask(server.udp, &query("www.example.com.", RecordType::A)).await;
    assert_eq!(a.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(a.queries.len(), 1);
}

#[tokio::test]
async fn a_silent_upstream_gets_servfail_after_the_timeout() {
    let s = snapshot();
    let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let server = start(
        &s,
        vec![silent.local_addr().unwrap()],
        Duration::from_millis(200),
    )
    .await;
    let a = ask(server.udp, &query("www.example.com.", RecordType::A)).await;
    assert_eq!(a.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(server.stats.counts().servfail, 1);
    drop(silent);
}

#[tokio::test]
async fn garbage_gets_formerr_when_it_has_a_header_and_is_dropped_otherwise() {
    let s = snapshot();
    let server = start(&s, Vec::new(), FORWARD_TIMEOUT).await;

    assert_eq!(udp_exchange(server.udp, &[0xab]).await, None);
    assert_eq!(udp_exchange(server.udp, &[0xab, 0xcd, 0x01]).await, None);

    // A header claiming one question, followed by nothing.
    let header = [0xab, 0xcd, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0xff];
    let reply = udp_exchange(server.udp, &header).await.expect("a formerr");
    let reply = Message::from_vec(&reply).unwrap();
    assert_eq!(reply.metadata.id, 0xabcd);
    assert_eq!(reply.metadata.response_code, ResponseCode::FormErr);

    // A response is never answered (no reflection loops).
    let mut response = query("mp-multi.mp.aether.internal.", RecordType::A);
    response.metadata.message_type = MessageType::Response;
    assert_eq!(
        udp_exchange(server.udp, &response.to_vec().unwrap()).await,
        None
    );

    // Two questions in one query.
    let mut two = query("mp-multi.mp.aether.internal.", RecordType::A);
    two.add_query(Query::query(
        Name::from_ascii("mp-nine.mp.aether.internal.").unwrap(),
        RecordType::A,
    ));
    let reply = ask(server.udp, &two).await;
    assert_eq!(reply.metadata.response_code, ResponseCode::FormErr);

    // Still serving.
    let a = ask(
        server.udp,
        &query("mp-multi.mp.aether.internal.", RecordType::A),
    )
    .await;
    assert_eq!(addresses(&a), [cluster_ip(&s, "mp", "mp-multi")]);
    let counts = server.stats.counts();
    assert_eq!((counts.formerr, counts.dropped), (2, 3));
}

#[tokio::test]
async fn queries_over_tcp_are_answered_in_order_on_one_connection() {
    let s = snapshot();
    let server = start(&s, Vec::new(), FORWARD_TIMEOUT).await;
    let mut stream = TcpStream::connect(server.tcp).await.unwrap();
    for (name, want) in [
        (
            "mp-multi.mp.aether.internal.",
            cluster_ip(&s, "mp", "mp-multi"),
        ),
        (
            "mp-nine.mp.aether.internal.",
            cluster_ip(&s, "mp", "mp-nine"),
        ),
    ] {
        let q = query(name, RecordType::A).to_vec().unwrap();
        let len = u16::try_from(q.len()).unwrap().to_be_bytes();
        stream.write_all(&len).await.unwrap();
        stream.write_all(&q).await.unwrap();
        let mut len = [0u8; 2];
        tokio::time::timeout(WAIT, stream.read_exact(&mut len))
            .await
            .unwrap()
            .unwrap();
        let mut reply = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut reply).await.unwrap();
        assert_eq!(addresses(&Message::from_vec(&reply).unwrap()), [want]);
    }
}

/// One query over a TCP stream: the answer's addresses, or what went wrong.
async fn tcp_exchange(stream: &mut TcpStream, name: &str) -> Result<Vec<IpAddr>, String> {
    let q = query(name, RecordType::A).to_vec().unwrap();
    let len = u16::try_from(q.len()).unwrap().to_be_bytes();
    stream
        .write_all(&len)
        .await
        .map_err(|e| format!("write: {e}"))?;
    stream
        .write_all(&q)
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut len = [0u8; 2];
    tokio::time::timeout(WAIT, stream.read_exact(&mut len))
        .await
        .map_err(|_| "no answer in time".to_owned())?
        .map_err(|e| format!("read: {e}"))?;
    let mut reply = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream
        .read_exact(&mut reply)
        .await
        .map_err(|e| format!("read: {e}"))?;
    Ok(addresses(&Message::from_vec(&reply).unwrap()))
}

#[test]
fn the_tcp_accept_loop_waits_between_failed_accepts_and_serves_again() {
    use crate::test_util::fds;
    use socket2::{Domain, Socket, Type};
    if !fds::in_child(concat!(
        module_path!(),
        "::the_tcp_accept_loop_waits_between_failed_accepts_and_serves_again"
    )) {
        return;
    }
    // The clock is paused: it moves only when every task waits. An accept loop that retries at
    // once never waits, so the test's own sleep below would never end; this watchdog (real
    // time) then fails the test.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(20));
        #[allow(clippy::print_stderr)] // The only way out of a runtime that never idles.
        {
            eprintln!(
                "the mesh DNS TCP accept loop never let the runtime idle: it spins on accept errors"
            );
        }
        std::process::exit(3);
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let s = snapshot();
        let server = start(&s, Vec::new(), FORWARD_TIMEOUT).await;
        // The client's socket exists before the descriptors run out; its connection then
        // waits in the backlog, which the server cannot take it from.
        let client = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        let exhausted = fds::exhaust();
        client.connect(&server.tcp.into()).unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(exhausted);
        client.set_nonblocking(true).unwrap();
        let mut stream = TcpStream::from_std(client.into()).unwrap();
        assert_eq!(
            tcp_exchange(&mut stream, "mp-multi.mp.aether.internal.").await,
            Ok(vec![cluster_ip(&s, "mp", "mp-multi")]),
            "mesh DNS over TCP answers again once descriptors are free"
        );
    });
}

/// What the server does next on `stream`: `"closed"`, `"open"` (nothing within 1 s) or an
/// error.
async fn next_event(stream: &mut TcpStream) -> String {
    let mut byte = [0u8; 1];
    match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut byte)).await {
        Ok(Ok(0)) => "closed".to_owned(),
        Ok(Ok(_)) => "data".to_owned(),
        Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset => "closed".to_owned(),
        Ok(Err(e)) => format!("error: {e}"),
        Err(_) => "open".to_owned(),
    }
}

#[tokio::test]
async fn over_its_tcp_client_cap_the_server_closes_new_connections_and_serves_the_open_ones() {
    let s = snapshot();
    let refused = Counter::default();
    let server = start_with(
        &s,
        Vec::new(),
        FORWARD_TIMEOUT,
        TcpLimits {
            max_clients: 2,
            refused: refused.clone(),
            ..TcpLimits::default()
        },
    )
    .await;
    let mut first = TcpStream::connect(server.tcp).await.unwrap();
    let mut second = TcpStream::connect(server.tcp).await.unwrap();
    // Both are served (so both hold their place) before the third comes.
    for stream in [&mut first, &mut second] {
        assert_eq!(
            tcp_exchange(stream, "mp-multi.mp.aether.internal.").await,
            Ok(vec![cluster_ip(&s, "mp", "mp-multi")])
        );
    }
    let mut third = TcpStream::connect(server.tcp).await.unwrap();
    assert_eq!(
        next_event(&mut third).await,
        "closed",
        "a connection over dns_tcp_max_clients (2) was not closed"
    );
    assert_eq!(refused.get(), 1);
    assert_eq!(
        tcp_exchange(&mut first, "mp-nine.mp.aether.internal.").await,
        Ok(vec![cluster_ip(&s, "mp", "mp-nine")])
    );
    // A place freed is a place for the next client.
    drop(second);
    let mut fourth = TcpStream::connect(server.tcp).await.unwrap();
    assert_eq!(
        tcp_exchange(&mut fourth, "mp-multi.mp.aether.internal.").await,
        Ok(vec![cluster_ip(&s, "mp", "mp-multi")])
    );
}

#[tokio::test]
async fn a_tcp_query_that_does_not_arrive_whole_in_time_closes_the_connection() {
    let s = snapshot();
    let timeouts = Counter::default();
    let server = start_with(
        &s,
        Vec::new(),
        FORWARD_TIMEOUT,
        TcpLimits {
            query_timeout: Duration::from_millis(200),
            timeouts: timeouts.clone(),
            ..TcpLimits::default()
        },
    )
    .await;
    let mut stream = TcpStream::connect(server.tcp).await.unwrap();
    // The length says 40 bytes; 3 come, then nothing.
    stream.write_all(&[0, 40, 1, 2, 3]).await.unwrap();
    let deadline = crate::time::now() + WAIT;
    let event = loop {
        let e = next_event(&mut stream).await;
        if e != "open" || crate::time::now() > deadline {
            break e;
        }
    };
    assert_eq!(
        event, "closed",
        "a query cut short kept its connection past dns_tcp_query_timeout (200 ms)"
    );
    assert_eq!(timeouts.get(), 1);
}

#[tokio::test]
async fn a_swapped_table_is_used_by_the_next_query() {
    let s = snapshot();
    let domains = Domains {
        mesh: "aether.internal".to_owned(),
        cluster: "cluster.local".to_owned(),
    };
    let table = Arc::new(ArcSwap::from_pointee(DnsTable::default()));
    let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = udp.local_addr().unwrap();
    let server = DnsServer::new(Arc::clone(&table), Vec::new(), host_socket());
    let task = tokio::spawn(server.run(udp, tcp));

    let q = query("mp-multi.mp.aether.internal.", RecordType::A);
    assert_eq!(
        ask(addr, &q).await.metadata.response_code,
        ResponseCode::ServFail
    );
    table.store(Arc::new(DnsTable::build(&s, &domains, false)));
    assert_eq!(
        addresses(&ask(addr, &q).await),
        [cluster_ip(&s, "mp", "mp-multi")]
    );
    task.abort();
}

#[test]
fn handle_never_panics_on_truncations_of_a_valid_query() {
    let table = DnsTable::default();
    let mut q = query("mp-multi.mp.aether.internal.", RecordType::A);
    q.set_edns(Edns::new());
    let bytes = q.to_vec().unwrap();
    for end in 0..=bytes.len() {
        let _ = handle(&table, &bytes[..end]);
        let mut flipped = bytes.clone();
        if end < flipped.len() {
            flipped[end] ^= 0xff;
        }
        let _ = handle(&table, &flipped);
    }
}
