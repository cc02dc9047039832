//! The probe against the echo, on loopback (no root, no namespaces): what a client observes.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Message, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::mpsc;

use super::*;
use crate::workload::echo::{Bound, Echo, EchoOptions, ListenerKind};

pub(super) const WL: &str = "mp-test";

/// An echo on 127.0.0.1, one listener per kind asked, on free ports.
pub(super) async fn echo(kinds: &[ListenerKind]) -> Vec<Bound> {
    let mut opts = EchoOptions::new(WL);
    opts.pod = "mp-test-0".to_owned();
    opts.namespace = "mp".to_owned();
    opts.addrs = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
    for k in kinds {
        opts = opts.with(*k, 0);
    }
    let echo = Echo::bind(&opts).expect("bind the echo");
    let bound = echo.bound();
    tokio::spawn(echo.run());
    bound
}

async fn http_echo() -> SocketAddr {
    echo(&[ListenerKind::Http]).await[0].addr
}

async fn run(addr: SocketAddr, send: Send) -> Outcome {
    let mut p = Probe::new(Dial::Addr(addr), send);
    p.timeout = Duration::from_secs(2);
    p.until = ReadUntil::Idle(Duration::from_millis(300));
    p.run(&Connector::current(), &Resolver::default())
        .await
        .expect("probe")
}

fn req(path: &str, f: impl FnOnce(&mut HttpRequest)) -> Send {
    let mut r = HttpRequest::get(path);
    f(&mut r);
    Send::Http(r)
}

#[tokio::test]
async fn http11_echo_names_its_port_and_keeps_the_host_exactly() {
    let addr = http_echo().await;
    let host = "MP-Multi.MP.aether.internal:9090";
    let o = run(
        addr,
        req("/", |r| r.host = Host::Values(vec![host.to_owned()])),
    )
    .await;
    assert!(o.connected);
    assert_eq!(o.status, Some(200));
    assert_eq!(o.version.as_deref(), Some("HTTP/1.1"));
    assert_eq!(o.body_text(), format!("{WL}:{}\n", addr.port()));
    assert_eq!(o.header("x-echo-host"), Some(host));
    assert_eq!(o.header("x-echo-pod"), Some("mp-test-0"));
    assert_eq!(o.header("x-echo-peer"), Some("127.0.0.1"));
    assert_eq!(o.reason(), None);
    assert!(o.timings.first_byte.is_some() && o.timings.connect.is_some());
}

#[tokio::test]
async fn the_default_host_is_the_dialled_authority() {
    let addr = http_echo().await;
    let o = run(addr, req("/", |_| {})).await;
    assert_eq!(o.header("x-echo-host"), Some(addr.to_string().as_str()));
}

#[tokio::test]
async fn status_path_answers_that_status_with_the_echo_body() {
    let addr = http_echo().await;
    let o = run(addr, req("/status/421", |_| {})).await;
    assert_eq!(o.status, Some(421));
    assert_eq!(o.first_line(), format!("{WL}:{}", addr.port()));
    assert_eq!(o.reason(), None);
}

#[tokio::test]
async fn headers_path_lists_every_request_header_in_lower_case() {
    let addr = http_echo().await;
    let o = run(
        addr,
        req("/headers", |r| {
            r.headers
                .push(("X-Aether-Caller".to_owned(), "forged".to_owned()));
            r.headers.push(("X-Two".to_owned(), "b".to_owned()));
        }),
    )
    .await;
    assert_eq!(o.status, Some(200));
    let body = o.body_text();
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(lines[0], format!("{WL}:{}", addr.port()));
    assert!(lines.contains(&"x-aether-caller: forged"), "{body}");
    assert!(lines.contains(&"x-two: b"), "{body}");
    assert!(lines.contains(&format!("host: {addr}").as_str()), "{body}");
}

#[tokio::test]
async fn x_echo_set_adds_each_asked_header_to_the_response() {
    let addr = http_echo().await;
    let o = run(
        addr,
        req("/", |r| {
            r.headers.push((
                "x-echo-set".to_owned(),
                "x-aether-error: port-mismatch".to_owned(),
            ));
            r.headers
                .push(("x-echo-set".to_owned(), "X-Other: 1".to_owned()));
        }),
    )
    .await;
    assert_eq!(o.status, Some(200));
    assert_eq!(o.reason(), Some("port-mismatch"));
    assert_eq!(o.header("x-other"), Some("1"));
}

#[tokio::test]
async fn h2c_prior_knowledge_reaches_the_echo_with_its_authority() {
    let addr = http_echo().await;
    let o = run(
        addr,
        req("/", |r| {
            r.version = HttpVersion::H2c;
            r.host = Host::Values(vec!["mp-multi.mp.aether.internal:8080".to_owned()]);
        }),
    )
    .await;
    assert_eq!(o.version.as_deref(), Some("HTTP/2"), "{o:?}");
    assert_eq!(o.status, Some(200));
    assert_eq!(o.body_text(), format!("{WL}:{}\n", addr.port()));
    assert_eq!(
        o.header("x-echo-host"),
        Some("mp-multi.mp.aether.internal:8080")
    );
}

#[tokio::test]
async fn h2c_can_send_a_host_that_disagrees_with_its_authority() {
    let addr = http_echo().await;
    let o = run(
        addr,
        req("/", |r| {
            r.version = HttpVersion::H2c;
            r.target = Target::Absolute("http://mp-multi.mp.aether.internal:8080/headers".into());
            r.host = Host::Values(vec!["mp-eighty.mp.aether.internal:8080".to_owned()]);
        }),
    )
    .await;
    assert_eq!(o.status, Some(200), "{o:?}");
    assert_eq!(
        o.header("x-echo-host"),
        Some("mp-multi.mp.aether.internal:8080")
    );
    assert!(
        o.body_text()
            .lines()
            .any(|l| l == "host: mp-eighty.mp.aether.internal:8080"),
        "{}",
        o.body_text()
    );
}

#[tokio::test]
async fn http10_without_host_is_answered() {
    let addr = http_echo().await;
    let o = run(
        addr,
        req("/", |r| {
            r.version = HttpVersion::Http10;
            r.host = Host::None;
        }),
    )
    .await;
    assert_eq!(o.status, Some(200), "{o:?}");
    assert_eq!(o.body_text(), format!("{WL}:{}\n", addr.port()));
    assert_eq!(o.header("x-echo-host"), None);
}

#[tokio::test]
async fn http11_without_host_is_answered() {
    let addr = http_echo().await;
    let o = run(addr, req("/", |r| r.host = Host::None)).await;
    assert_eq!(o.status, Some(200), "{o:?}");
    assert_eq!(o.header("x-echo-host"), None);
}

#[tokio::test]
async fn two_host_fields_both_reach_the_echo() {
    let addr = http_echo().await;
    let h = "mp-multi.mp.aether.internal:8080".to_owned();
    let o = run(
        addr,
        req("/headers", |r| {
            r.host = Host::Values(vec![h.clone(), h.clone()])
        }),
    )
    .await;
    assert_eq!(o.status, Some(200), "{o:?}");
    let host_lines = o
        .body_text()
        .lines()
        .filter(|l| *l == format!("host: {h}"))
        .count();
    assert_eq!(host_lines, 2, "{}", o.body_text());
    assert_eq!(o.header_all("x-echo-host"), vec![h.as_str(), h.as_str()]);
}

#[tokio::test]
async fn absolute_form_and_userinfo_are_sent_as_written() {
    let addr = http_echo().await;
    let o = run(
        addr,
        req("/", |r| {
            r.target = Target::Absolute("http://mp-multi.mp.aether.internal:9090/x".into());
            r.host = Host::Values(vec!["user@mp-multi.mp.aether.internal:8080".into()]);
            r.headers.push(("x-echo-json".into(), "1".into()));
        }),
    )
    .await;
    assert_eq!(o.status, Some(200), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.body).expect("json body");
    assert_eq!(v["path"], "/x");
    assert_eq!(v["authority"], "user@mp-multi.mp.aether.internal:8080");
    assert_eq!(v["workload"], WL);
    assert_eq!(v["namespace"], "mp");
    assert_eq!(v["version"], "HTTP/1.1");
    assert_eq!(v["port"], addr.port());
}

#[tokio::test]
async fn raw_tcp_echo_identifies_itself_on_the_first_bytes_then_echoes() {
    let b = echo(&[ListenerKind::Tcp]).await[0];
    let mut p = Probe::new(Dial::Addr(b.addr), Send::Raw(unescape("ping\\n")));
    p.until = ReadUntil::Lines(3);
    let o = p
        .run(&Connector::current(), &Resolver::default())
        .await
        .unwrap();
    assert_eq!(
        o.body_text(),
        format!("{WL}:{}\npod mp-test-0\nping\n", b.port)
    );
    assert!(!o.timed_out);
}

#[tokio::test]
async fn raw_tcp_echo_sends_nothing_first() {
    let b = echo(&[ListenerKind::Tcp]).await[0];
    let mut p = Probe::new(Dial::Addr(b.addr), Send::Nothing);
    p.until = ReadUntil::Idle(Duration::from_millis(200));
    let o = p
        .run(&Connector::current(), &Resolver::default())
        .await
        .unwrap();
    assert!(o.connected);
    assert!(o.body.is_empty(), "{o:?}");
    assert_eq!(o.timings.first_byte, None);
}

#[tokio::test]
async fn server_first_greeting_arrives_without_sending() {
    let b = echo(&[ListenerKind::ServerFirst]).await[0];
    let mut p = Probe::new(Dial::Addr(b.addr), Send::Nothing);
    p.until = ReadUntil::Text("pod mp-test-0\n".into());
    let o = p
        .run(&Connector::current(), &Resolver::default())
        .await
        .unwrap();
    assert_eq!(
        o.body_text(),
        format!("{WL}:{} ready\npod mp-test-0\n", b.port)
    );
    assert!(o.timings.first_byte.is_some());
    assert!(!o.timed_out);
}

#[tokio::test]
async fn a_tls_client_hello_is_sent_as_tls_bytes() {
    let b = echo(&[ListenerKind::Tcp]).await[0];
    let mut p = Probe::new(
        Dial::Addr(b.addr),
        Send::TlsClientHello {
            sni: "mp-multi.mp.aether.internal".into(),
        },
    );
    p.until = ReadUntil::Idle(Duration::from_millis(300));
    let o = p
        .run(&Connector::current(), &Resolver::default())
        .await
        .unwrap();
    let prefix = format!("{WL}:{}\npod mp-test-0\n", b.port);
    assert!(o.body.starts_with(prefix.as_bytes()), "{o:?}");
    let echoed = &o.body[prefix.len()..];
    // A TLS handshake record (22), TLS 1.x, carrying the server name.
    assert_eq!(echoed[0], 0x16);
    assert_eq!(echoed[1], 0x03);
    assert!(
        echoed
            .windows(27)
            .any(|w| w == b"mp-multi.mp.aether.internal")
    );
}

#[tokio::test]
async fn udp_reply_and_its_source_are_recorded() {
    let b = echo(&[ListenerKind::Udp]).await[0];
    let o = run(b.addr, Send::Udp(b"hi".to_vec())).await;
    assert_eq!(o.body_text(), format!("{WL}:{}", b.port));
    assert_eq!(o.udp_from, Some(b.addr));
    assert!(!o.connected);
}

#[tokio::test]
async fn authz_counts_checks_and_denies_on_request() {
    let addr = echo(&[ListenerKind::Authz]).await[0].addr;
    let count = || run(addr, req("/count", |_| {}));
    assert_eq!(count().await.body_text(), "0\n");
    let check = |deny: bool| {
        run(
            addr,
            req("/check", move |r| {
                r.headers
                    .push(("x-authz-service".into(), "mp-multi.mp".into()));
                if deny {
                    r.headers.push(("x-authz-deny".into(), "1".into()));
                }
            }),
        )
    };
    let allowed = check(false).await;
    assert_eq!(allowed.status, Some(200));
    let denied = check(true).await;
    assert_eq!(denied.status, Some(403));
    assert_eq!(denied.body_text(), format!("denied by {WL}\n"));
    assert_eq!(count().await.body_text(), "2\n");
    // Anything else is an HTTP echo, not counted.
    let other = run(addr, req("/", |_| {})).await;
    assert_eq!(other.body_text(), format!("{WL}:{}\n", addr.port()));
    assert_eq!(count().await.body_text(), "2\n");
}

#[tokio::test]
async fn a_refused_connect_is_an_outcome() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let o = run(addr, req("/", |_| {})).await;
    assert!(!o.connected);
    assert!(o.connect_error.is_some());
    assert_eq!(o.status, None);
}

#[tokio::test]
async fn an_echo_port_that_cannot_be_bound_is_named() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut opts = EchoOptions::new(WL).with(ListenerKind::Http, port);
    opts.addrs = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
    let err = Echo::bind(&opts).unwrap_err();
    assert!(err.to_string().contains(&port.to_string()), "{err}");
}

/// A server that writes `response` after reading a request head, then closes.
async fn canned(response: &'static [u8]) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                return;
            }
            got.extend_from_slice(&buf[..n]);
        }
        // In pieces, so the parser meets partial heads and chunks.
        for piece in response.chunks(7) {
            s.write_all(piece).await.unwrap();
            s.flush().await.unwrap();
        }
    });
    addr
}

#[tokio::test]
async fn chunked_responses_are_decoded_and_interim_answers_skipped() {
    let addr = canned(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nX-Aether-Error: not-a-mesh-name\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n",
    )
    .await;
    let o = run(addr, req("/", |_| {})).await;
    assert_eq!(o.status, Some(404));
    assert_eq!(o.reason(), Some("not-a-mesh-name"));
    assert_eq!(o.body_text(), "hello, world");
    assert_eq!(o.error, None);
}

#[tokio::test]
async fn a_response_without_length_is_read_to_the_close() {
    let addr = canned(b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nall of it\nuntil close").await;
    let o = run(addr, req("/", |r| r.version = HttpVersion::Http10)).await;
    assert_eq!(o.status, Some(200));
    assert_eq!(o.version.as_deref(), Some("HTTP/1.0"));
    assert_eq!(o.body_text(), "all of it\nuntil close");
    assert!(o.peer_closed);
}

#[tokio::test]
async fn a_body_over_the_limit_is_truncated() {
    let addr = canned(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789").await;
    let mut p = Probe::new(Dial::Addr(addr), req("/", |_| {}));
    p.body_limit = 4;
    let o = p
        .run(&Connector::current(), &Resolver::default())
        .await
        .unwrap();
    assert_eq!(o.body_text(), "0123");
    assert!(o.truncated);
}

#[test]
fn requests_are_written_exactly_as_asked() {
    let r = HttpRequest {
        version: HttpVersion::Http11,
        method: "CONNECT".into(),
        target: Target::Authority("mp-multi.mp.aether.internal:8080".into()),
        host: Host::Default,
        headers: vec![("X-A".into(), "1".into())],
        body: b"xy".to_vec(),
    };
    assert_eq!(
        http1::render(&r, "ignored:1"),
        b"CONNECT mp-multi.mp.aether.internal:8080 HTTP/1.1\r\nHost: mp-multi.mp.aether.internal:8080\r\nX-A: 1\r\nContent-Length: 2\r\n\r\nxy"
    );
}

#[test]
fn dials_parse_and_give_their_authority() {
    let d = Dial::parse("mp-multi.mp:80").unwrap();
    assert_eq!(d.authority(), "mp-multi.mp");
    assert_eq!(
        Dial::parse("[::1]:18081").unwrap().authority(),
        "[::1]:18081"
    );
    assert_eq!(
        Dial::parse("10.0.0.1:8080").unwrap().authority(),
        "10.0.0.1:8080"
    );
    assert!(Dial::parse("mp-multi").is_err());
    assert!(Dial::parse("mp-multi:x").is_err());
}

#[test]
fn raw_text_escapes_become_bytes() {
    assert_eq!(unescape("hello\\r\\n\\r\\n"), b"hello\r\n\r\n");
    assert_eq!(unescape("a\\x41\\\\b\\q"), b"aA\\b\\q");
}

/// A DNS server that answers `known` with `ip`, SERVFAIL for `<x>-fails.cluster.local`, and
/// NXDOMAIN otherwise, and reports each name it is asked.
async fn fake_dns(
    known: &'static str,
    ip: Ipv4Addr,
) -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let (n, from) = sock.recv_from(&mut buf).await.unwrap();
            let q = Message::from_vec(&buf[..n]).unwrap();
            let query = q.queries[0].clone();
            let name = query.name().to_ascii();
            let _ = tx.send(name.clone());
            let mut resp = Message::response(q.metadata.id, OpCode::Query);
            resp.add_query(query.clone());
            if name == known {
                resp.add_answer(Record::from_rdata(
                    query.name().clone(),
                    60,
                    RData::A(A(ip)),
                ));
            } else if name.contains("-fails.")
                && name.ends_with(".cluster.local.")
                && !name.contains(".svc.")
            {
                // A zone this server cannot answer for.
                resp.metadata.response_code = ResponseCode::ServFail;
            } else {
                resp.metadata.response_code = ResponseCode::NXDomain;
            }
            sock.send_to(&resp.to_vec().unwrap(), from).await.unwrap();
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn a_short_name_resolves_through_the_search_list() {
    let http = http_echo().await;
    let (ns, mut asked) = fake_dns("mp-test.mp.svc.cluster.local.", Ipv4Addr::LOCALHOST).await;
    let resolver = Resolver {
        nameservers: vec![ns],
        ..Resolver::cluster("mp")
    };
    let p = Probe::new(
        Dial::parse(&format!("mp-test:{}", http.port())).unwrap(),
        req("/", |_| {}),
    );
    let o = p.run(&Connector::current(), &resolver).await.unwrap();
    assert_eq!(o.status, Some(200));
    assert_eq!(o.addr, Some(http));
    assert_eq!(
        o.header("x-echo-host"),
        Some(format!("mp-test:{}", http.port()).as_str())
    );
    assert_eq!(asked.recv().await.unwrap(), "mp-test.mp.svc.cluster.local.");

    // A name nobody knows: every candidate is tried, in order, then the probe says so.
    let err = resolver
        .resolve(&Connector::current(), "nosuch")
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProbeError::Dns(DnsError::NotFound { .. })),
        "{err}"
    );
    let mut names = Vec::new();
    while let Ok(n) = asked.try_recv() {
        names.push(n);
    }
    assert_eq!(
        names,
        vec![
            "nosuch.mp.svc.cluster.local.",
            "nosuch.svc.cluster.local.",
            "nosuch.cluster.local.",
            "nosuch."
        ]
    );
}

#[tokio::test]
async fn a_server_failure_on_one_candidate_does_not_end_the_search() {
    // `one-fails.cluster.local.` gets SERVFAIL; the last candidate, the name as written, answers.
    let (ns, _asked) = fake_dns("one-fails.", Ipv4Addr::new(10, 1, 2, 3)).await;
    let resolver = Resolver {
        nameservers: vec![ns],
        ..Resolver::cluster("mp")
    };
    let ips = resolver
        .resolve(&Connector::current(), "one-fails")
        .await
        .unwrap();
    assert_eq!(ips, vec![IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3))]);
    // When nothing answers, the failure is what is reported.
    let err = resolver
        .resolve(&Connector::current(), "two-fails")
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProbeError::Dns(DnsError::ServerFailed { .. })),
        "{err}"
    );
}

/// A named network namespace with `lo` up, deleted on drop.
struct TempNetns(String);

impl TempNetns {
    fn create() -> Result<Self, String> {
        let name = format!("wlprobe-{}", std::process::id());
        let ip = |args: &[&str]| -> Result<(), String> {
            let st = std::process::Command::new("ip")
                .args(args)
                .status()
                .map_err(|e| format!("run ip: {e}"))?;
            st.success()
                .then_some(())
                .ok_or_else(|| format!("ip {args:?} failed"))
        };
        ip(&["netns", "add", &name])?;
        let ns = Self(name);
        ip(&["-n", &ns.0, "link", "set", "lo", "up"])?;
        Ok(ns)
    }
}

impl Drop for TempNetns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

#[tokio::test]
async fn a_connector_in_a_netns_connects_from_inside_it() {
    let ns = match TempNetns::create() {
        Ok(ns) => ns,
        Err(why) => {
            aether::test_util::needs_root::skip(
                "workload::probe::tests::a_connector_in_a_netns_connects_from_inside_it",
                &format!("needs root and iproute2: {why}"),
            );
            return;
        }
    };
    let home = Arc::new(Netns::current().unwrap());
    let pod = Arc::new(Netns::named(&ns.0).unwrap());
    // A listener on the pod's own loopback, which the caller's namespace cannot reach.
    let listener = pod
        .run(&home, || std::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap()
        .unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let listener = TcpListener::from_std(listener).unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.write_all(b"inside\n").await.unwrap();
    });

    let mut p = Probe::new(Dial::Addr(addr), Send::Nothing);
    p.until = ReadUntil::Lines(1);
    let inside = Connector::in_netns(Arc::clone(&pod), Arc::clone(&home));
    let o = p.run(&inside, &Resolver::default()).await.unwrap();
    assert_eq!(o.body_text(), "inside\n", "{o:?}");
    let o = p
        .run(&Connector::current(), &Resolver::default())
        .await
        .unwrap();
    assert!(!o.connected, "{o:?}");
}
