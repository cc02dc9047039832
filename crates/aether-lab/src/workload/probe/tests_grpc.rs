//! The probe's gRPC client against the gRPC echo, and against a plain HTTP/2 refusal, on
//! loopback (no root, no namespaces).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

use super::tests::{WL, echo};
use super::*;
use crate::workload::echo::ListenerKind;
use crate::workload::grpc::IDENT_HEADER;

pub(super) async fn grpc_echo() -> SocketAddr {
    echo(&[ListenerKind::Grpc]).await[0].addr
}

pub(super) fn grpc_probe(addr: SocketAddr, g: GrpcRequest) -> Probe {
    let mut p = Probe::new(Dial::Addr(addr), Send::Grpc(g));
    p.timeout = Duration::from_secs(5);
    p
}

async fn call(addr: SocketAddr, g: GrpcRequest) -> Outcome {
    grpc_probe(addr, g)
        .run(&Connector::current(), &Resolver::default())
        .await
        .expect("probe")
}

/// An h2c server answering every request as the mesh refuses: `421`, `x-aether-error:
/// port-mismatch` and a text body; not gRPC.
pub(super) async fn h2_refuser() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = service_fn(|_req| async {
                    let resp = http::Response::builder()
                        .status(421)
                        .header("x-aether-error", "port-mismatch")
                        .header("content-type", "text/plain; charset=utf-8")
                        .body(Full::new(Bytes::from_static(
                            b"port-mismatch\nservice: mp-multi.mp\nports: 8080/http 9090/http\n",
                        )))
                        .unwrap();
                    Ok::<_, Infallible>(resp)
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn grpc_echo_reports_identity_authority_method_and_every_metadata_value() {
    let addr = grpc_echo().await;
    let authority = "mp-multi.mp.aether.internal:8080";
    let mut g = GrpcRequest::new("mp.test.Lookup/Find");
    g.authority = Some(authority.to_owned());
    g.message = "hello".to_owned();
    g.headers = vec![
        ("x-one".to_owned(), "a".to_owned()),
        ("X-One".to_owned(), "b".to_owned()),
        ("x-two".to_owned(), "c".to_owned()),
    ];
    let o = call(addr, g).await;
    assert_eq!(o.status, Some(200), "{o:?}");
    assert_eq!(o.version.as_deref(), Some("HTTP/2"));
    let answer = o.grpc.as_ref().expect("a gRPC answer");
    assert_eq!((answer.code, answer.code_name.as_str()), (0, "OK"));
    assert!(answer.status_sent, "{answer:?}");
    let reply = answer.reply.as_ref().expect("a reply");
    let ident = format!("{WL}:{}", addr.port());
    assert_eq!(reply.ident, ident);
    assert_eq!(reply.pod, "mp-test-0");
    assert_eq!(reply.namespace, "mp");
    assert_eq!(reply.port, u32::from(addr.port()));
    assert_eq!(reply.authority, authority);
    assert_eq!(reply.method, "/mp.test.Lookup/Find");
    assert_eq!(reply.message, "hello");
    assert_eq!(reply.peer, "127.0.0.1");
    assert_eq!(reply.metadata_all("x-one"), ["a", "b"]);
    assert_eq!(reply.metadata_all("x-two"), ["c"]);
    // Everything but pseudo headers, the gRPC protocol's own headers included.
    assert_eq!(reply.metadata_all("te"), ["trailers"]);
    assert_eq!(reply.metadata_all("content-type"), ["application/grpc"]);
    assert!(reply.metadata.iter().all(|m| !m.name.starts_with(':')));
    assert_eq!(o.header("x-echo-host"), Some(authority));
    assert_eq!(o.header("x-echo-pod"), Some("mp-test-0"));
    assert_eq!(o.header(IDENT_HEADER), Some(ident.as_str()));
    assert_eq!(o.ident(), Some(ident));
    assert_eq!(o.pod().as_deref(), Some("mp-test-0"));
    assert_eq!(o.reason(), None);
}

#[tokio::test]
async fn grpc_default_authority_is_the_dialled_one_and_any_method_is_answered() {
    let addr = grpc_echo().await;
    for method in ["aether.echo.v1.Echo/Echo", "/other.pkg.Svc/Anything"] {
        let o = call(addr, GrpcRequest::new(method)).await;
        let reply = o.grpc.and_then(|g| g.reply).expect("a reply");
        assert_eq!(reply.authority, addr.to_string());
        assert_eq!(reply.method, format!("/{}", method.trim_start_matches('/')));
    }
}

#[tokio::test]
async fn grpc_echo_answers_the_status_asked_in_the_message_and_still_names_itself() {
    let addr = grpc_echo().await;
    let g = GrpcRequest {
        status: Some((5, "no such thing".to_owned())),
        ..GrpcRequest::default()
    };
    let o = call(addr, g).await;
    assert_eq!(o.status, Some(200), "{o:?}");
    let answer = o.grpc.as_ref().expect("a gRPC answer");
    assert_eq!((answer.code, answer.code_name.as_str()), (5, "NOT_FOUND"));
    assert_eq!(answer.message, "no such thing");
    assert!(answer.status_sent);
    assert_eq!(answer.reply, None);
    // A trailers-only answer: the status and the identity are in the headers.
    assert_eq!(o.header("grpc-status"), Some("5"));
    let ident = format!("{WL}:{}", addr.port());
    assert_eq!(o.header(IDENT_HEADER), Some(ident.as_str()));
    assert_eq!(o.ident(), Some(ident));
    assert_eq!(o.pod().as_deref(), Some("mp-test-0"));
}

#[tokio::test]
async fn grpc_echo_answers_the_status_asked_in_metadata() {
    let addr = grpc_echo().await;
    let g = GrpcRequest {
        headers: vec![
            ("x-echo-grpc-status".to_owned(), "7".to_owned()),
            ("x-echo-grpc-message".to_owned(), "not you".to_owned()),
        ],
        ..GrpcRequest::default()
    };
    let o = call(addr, g).await;
    let answer = o.grpc.expect("a gRPC answer");
    assert_eq!(answer.code_name, "PERMISSION_DENIED");
    assert_eq!(answer.message, "not you");
}

#[tokio::test]
async fn a_plain_http_refusal_reaches_the_grpc_probe_with_its_status_reason_and_body() {
    let addr = h2_refuser().await;
    let o = call(addr, GrpcRequest::default()).await;
    assert_eq!(o.status, Some(421), "{o:?}");
    assert_eq!(o.reason(), Some("port-mismatch"));
    assert_eq!(o.first_line(), "port-mismatch");
    assert!(o.body_text().contains("ports: 8080/http 9090/http"));
    let answer = o.grpc.as_ref().expect("tonic's view of the answer");
    assert!(!answer.status_sent, "{answer:?}");
    assert_ne!(answer.code, 0);
    assert_eq!(answer.reply, None);
    assert_eq!(o.ident(), None);
    assert_eq!(o.failure(), None);
}

#[tokio::test]
async fn a_refused_grpc_connect_is_an_outcome() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    let o = call(addr, GrpcRequest::default()).await;
    assert!(!o.connected);
    assert!(o.connect_error.is_some());
    assert_eq!(o.grpc, None);
    assert!(o.failure().is_some_and(|f| f.starts_with("connect: ")));
}

#[tokio::test]
async fn invalid_grpc_metadata_is_an_invalid_request() {
    let addr = grpc_echo().await;
    let g = GrpcRequest {
        headers: vec![("bad name".to_owned(), "x".to_owned())],
        ..GrpcRequest::default()
    };
    let err = grpc_probe(addr, g)
        .run(&Connector::current(), &Resolver::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ProbeError::InvalidRequest(_)), "{err}");
}
