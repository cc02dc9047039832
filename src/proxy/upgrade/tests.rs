//! A switched connection through both halves of the mesh, on loopback and in-memory streams (no
//! root, no namespaces): a client speaks to a source-side HTTP/1.1 server, whose service crosses
//! an mTLS hop with ALPN `aether-h1/1` (an in-memory pipe) to a destination that accepts it as
//! the inbound hop does and forwards to the echo workload on 127.0.0.1. What the client sees is
//! asserted: the `101`, the echo's identity line once, and its bytes coming back.

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::TcpStream;
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};

use super::*;
use crate::identity::{Ca, Identities, IdentitySettings, client_config, server_config};
use crate::proxy::metrics::{DataPlane, DataPlaneCollector, Direction, Source};
use crate::proxy::{ALPN_H1, respond};
use aether_lab::workload::echo::{Echo, EchoOptions, ListenerKind};

const WL: &str = "mp-multi";

fn identities() -> Arc<Identities> {
    let ca = Arc::new(Ca::generate(crate::time::wall()).unwrap());
    Arc::new(Identities::new(ca, IdentitySettings::default()).unwrap())
}

/// The echo workload on 127.0.0.1, HTTP on a free port.
fn app() -> SocketAddr {
    let mut opts = EchoOptions::new(WL).with(ListenerKind::Http, 0);
    opts.pod = "mp-multi-0".into();
    opts.addrs = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
    let echo = Echo::bind(&opts).expect("bind the echo");
    let addr = echo.bound()[0].addr;
    tokio::spawn(echo.run());
    addr
}

/// The destination half: TLS accepted like the inbound hop (its server config offers every hop
/// ALPN), HTTP/1.1 with upgrades, every request forwarded to the application on a connection of
/// its own.
async fn destination(ids: Arc<Identities>, io: DuplexStream, app: SocketAddr) {
    let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io)
        .await
        .expect("a client hello");
    let config = server_config(&ids, "mp", WL, crate::proxy::ALPNS).unwrap();
    let tls = start.into_stream(config).await.expect("the hop handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(ALPN_H1));
    let service = service_fn(move |mut req: Request<Incoming>| async move {
        let up = is_upgrade(&req).then(|| hyper::upgrade::on(&mut req));
        let req = req.map(|b| b.map_err(BoxError::from).boxed());
        let stream = TcpStream::connect(app).await.expect("connect to the app");
        let resp = match up {
            Some(up) => forward(stream, req, up, None).await,
            None => panic!("only upgrade requests cross this hop"),
        };
        Ok::<_, Infallible>(resp.unwrap_or_else(|e| {
            let mut r = Response::new(respond::full(format!("{e}")));
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            r
        }))
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tls), service)
        .with_upgrades()
        .await;
}

/// The source half: the client's HTTP/1.1 server with upgrades; its one request crosses the
/// hop (`hop`) with ALPN `aether-h1/1`. A switch is counted in `metrics` as the request
/// handler counts it (unknown destination, source `mp/mp-client`).
async fn source(
    ids: Arc<Identities>,
    client: DuplexStream,
    hop: DuplexStream,
    metrics: Arc<DataPlane>,
) {
    let hop = Arc::new(tokio::sync::Mutex::new(Some(hop)));
    let service = service_fn(move |mut req: Request<Incoming>| {
        let ids = ids.clone();
        let hop = hop.clone();
        let metrics = metrics.clone();
        async move {
            let hop = hop.lock().await.take().expect("one request per connection");
            assert!(is_upgrade(&req), "the client asks to switch");
            let up = hyper::upgrade::on(&mut req);
            let req = req.map(|b| b.map_err(BoxError::from).boxed());
            let config = client_config(&ids, "mp", "mp-client", &[ALPN_H1]).unwrap();
            let name = ids.server_name(8080, WL, "mp").unwrap();
            let tls = TlsConnector::from(config)
                .connect(name, hop)
                .await
                .expect("the hop handshake");
            let resp = forward(tls, req, up, None).await.expect("the hop answers");
            if let Some(switched) = resp.extensions().get::<Switched>() {
                let series = metrics.unknown(Source {
                    namespace: "mp",
                    service: "mp-client",
                });
                switched.account(TcpConn::with_line(series, Direction::Outbound, None));
            }
            Ok::<_, Infallible>(resp)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(client), service)
        .with_upgrades()
        .await;
}

/// Client, source, hop and destination, wired; the client's end, and the source's metrics.
fn mesh(app: SocketAddr) -> (DuplexStream, Arc<DataPlane>) {
    let ids = identities();
    let metrics = Arc::new(DataPlane::default());
    let (client, client_srv) = tokio::io::duplex(64 * 1024);
    let (hop_src, hop_dst) = tokio::io::duplex(64 * 1024);
    tokio::spawn(destination(ids.clone(), hop_dst, app));
    tokio::spawn(source(ids, client_srv, hop_src, metrics.clone()));
    (client, metrics)
}

/// The source's relayed-stream series, as `/metrics` renders them.
fn tcp_samples(metrics: &Arc<DataPlane>) -> Vec<String> {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(DataPlaneCollector(metrics.clone())));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text.lines()
        .filter(|l| l.starts_with("aether_tcp_") && !l.contains("_duration_"))
        .map(str::to_owned)
        .collect()
}

/// Read until `want` has arrived (or fail after 5 s); everything read.
async fn read_until(io: &mut DuplexStream, got: &mut Vec<u8>, want: &str) -> String {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(Duration::from_secs(5), async {
        while !String::from_utf8_lossy(got).contains(want) {
            let n = io.read(&mut buf).await.expect("read");
            assert!(
                n > 0,
                "closed before {want:?}: {:?}",
                String::from_utf8_lossy(got)
            );
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {want:?} in {:?}", String::from_utf8_lossy(got)));
    String::from_utf8_lossy(got).into_owned()
}

fn head(upgrade: &str) -> String {
    format!(
        "GET /chat HTTP/1.1\r\nHost: mp-multi.mp.aether.internal:8080\r\n\
         Connection: keep-alive, Upgrade\r\nUpgrade: {upgrade}\r\n\r\n"
    )
}

#[tokio::test]
async fn a_switched_connection_is_relayed_both_ways_through_the_hop() {
    let app = app();
    let (mut client, metrics) = mesh(app);
    client.write_all(head("echo").as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let answer = read_until(&mut client, &mut got, "\r\n\r\n").await;
    assert!(
        answer.starts_with("HTTP/1.1 101 "),
        "want 101, got {answer:?}"
    );
    assert!(answer.to_ascii_lowercase().contains("upgrade: echo"));
    let (_, after) = answer.split_once("\r\n\r\n").unwrap();
    assert_eq!(after, "", "nothing before the client speaks");

    got.clear();
    client.write_all(b"hello over the mesh").await.unwrap();
    let ident = format!("{WL}:{}\n", app.port());
    let text = read_until(&mut client, &mut got, "hello over the mesh").await;
    assert_eq!(text, format!("{ident}hello over the mesh"));

    got.clear();
    client.write_all(b"\x00binary\xffagain").await.unwrap();
    let mut buf = vec![0u8; 13];
    tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut buf))
        .await
        .expect("the echo answers")
        .unwrap();
    assert_eq!(
        buf, b"\x00binary\xffagain",
        "raw bytes, no identity line again"
    );

    // The client closes its side: the relay ends and closes ours.
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut rest))
        .await
        .expect("the relay closes");
    assert_eq!(n.unwrap(), 0);

    // The switched connection is counted as the byte stream it became, its bytes each way.
    let labels = "{direction=\"outbound\",namespace=\"unknown\",service=\"unknown\",port=\"unknown\",source_namespace=\"mp\",source_service=\"mp-client\"}";
    let sent = "hello over the mesh".len() + 13;
    let received = ident.len() + sent;
    let want = vec![
        format!("aether_tcp_connections_opened_total{labels} 1"),
        format!("aether_tcp_connections_closed_total{labels} 1"),
        format!("aether_tcp_sent_bytes_total{labels} {sent}"),
        format!("aether_tcp_received_bytes_total{labels} {received}"),
    ];
    let deadline = crate::time::now() + Duration::from_secs(5);
    while tcp_samples(&metrics) != want && crate::time::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(tcp_samples(&metrics), want);
}

#[tokio::test]
async fn an_upgrade_the_application_declines_is_answered_normally() {
    let app = app();
    let (mut client, metrics) = mesh(app);
    client
        .write_all(head("websocket-not-spoken").as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let ident = format!("{WL}:{}\n", app.port());
    let answer = read_until(&mut client, &mut got, &ident).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "got {answer:?}");
    assert!(tcp_samples(&metrics).is_empty(), "nothing switched");
}

#[test]
fn only_http11_requests_with_the_upgrade_token_switch() {
    let req = |version: Version, connection: Option<&str>, upgrade: Option<&str>| {
        let mut b = Request::builder().version(version).uri("/");
        if let Some(c) = connection {
            b = b.header(CONNECTION, c);
        }
        if let Some(u) = upgrade {
            b = b.header(UPGRADE, u);
        }
        b.body(()).unwrap()
    };
    let v11 = Version::HTTP_11;
    assert!(is_upgrade(&req(v11, Some("Upgrade"), Some("websocket"))));
    assert!(is_upgrade(&req(
        v11,
        Some("keep-alive, UPGRADE"),
        Some("echo")
    )));
    assert!(!is_upgrade(&req(v11, None, Some("websocket"))));
    assert!(!is_upgrade(&req(v11, Some("upgrade"), None)));
    assert!(!is_upgrade(&req(
        v11,
        Some("keep-alive"),
        Some("websocket")
    )));
    assert!(!is_upgrade(&req(
        Version::HTTP_10,
        Some("upgrade"),
        Some("websocket")
    )));
    assert!(!is_upgrade(&req(
        Version::HTTP_2,
        Some("upgrade"),
        Some("websocket")
    )));
}

#[test]
fn every_protocol_but_http_itself_is_carried() {
    let carried = |v: &'static str| relayed_protocols(&HeaderValue::from_static(v));
    assert_eq!(carried("websocket").unwrap(), "websocket");
    assert_eq!(carried("echo").unwrap(), "echo");
    assert_eq!(carried("h2c"), None);
    assert_eq!(carried("H2C, HTTP/2.0, h2"), None);
    assert_eq!(carried("h2c, websocket").unwrap(), "websocket");
    let mut req = Request::get("/").header(UPGRADE, "h2c").body(()).unwrap();
    assert!(!carry(
        &mut req,
        Some(&HeaderValue::from_static("h2c")),
        true
    ));
    assert!(!carry(
        &mut req,
        Some(&HeaderValue::from_static("echo")),
        false
    ));
    assert!(carry(
        &mut req,
        Some(&HeaderValue::from_static("echo")),
        true
    ));
    assert_eq!(req.headers()[CONNECTION], "upgrade");
    assert_eq!(req.headers()[UPGRADE], "echo");
}
