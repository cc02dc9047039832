//! The gRPC echo listener (module docs of [`super`], schema in [`crate::workload::grpc`]).
//!
//! tonic's server building blocks without its router or transport: hyper's HTTP/2 server
//! accepts each stream, and every request, whatever its path, goes through
//! [`tonic::server::Grpc::unary`] with one [`EchoCall`]. tonic's router would dispatch on the
//! path, which is exactly what this echo must not do.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

use super::{Bound, Ctx, lossy, received_authorities};
use crate::workload::grpc::{
    EchoReply, EchoRequest, IDENT_HEADER, MESSAGE_HEADER, MetadataEntry, STATUS_HEADER,
};

/// Serve one connection as h2c until the client closes it.
pub(super) async fn serve(
    ctx: Arc<Ctx>,
    b: Bound,
    stream: TcpStream,
    peer: SocketAddr,
) -> Result<(), hyper::Error> {
    let service = service_fn(move |req: Request<Incoming>| {
        let call = EchoCall::new(&ctx, b.port, peer, &req);
        async move {
            let mut grpc =
                tonic::server::Grpc::new(ProstCodec::<EchoReply, EchoRequest>::default());
            Ok::<_, Infallible>(grpc.unary(call, req).await)
        }
    });
    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), service)
        .await
}

/// One call: the reply as far as the request's head decides it, and the status asked for in
/// its metadata. tonic gives the service only the decoded message and the sanitized metadata,
/// so the path, the authority and the raw headers are read here, before tonic sees the request.
#[derive(Debug, Clone)]
struct EchoCall {
    reply: EchoReply,
    /// The status asked for by `x-echo-grpc-status` (and `x-echo-grpc-message`).
    asked: Option<(i32, String)>,
}

impl EchoCall {
    fn new<B>(ctx: &Ctx, port: u16, peer: SocketAddr, req: &Request<B>) -> Self {
        let metadata = req
            .headers()
            .iter()
            .map(|(k, v)| MetadataEntry {
                name: k.as_str().to_owned(),
                value: lossy(v),
            })
            .collect();
        let authority = received_authorities(req)
            .iter()
            .map(lossy)
            .collect::<Vec<_>>()
            .join(", ");
        let header = |name: &str| req.headers().get(name).map(lossy);
        let asked = header(STATUS_HEADER)
            .and_then(|c| c.trim().parse::<i32>().ok())
            .map(|code| (code, header(MESSAGE_HEADER).unwrap_or_default()));
        Self {
            reply: EchoReply {
                ident: format!("{}:{}", ctx.workload, port),
                pod: ctx.pod.clone(),
                namespace: ctx.namespace.clone(),
                port: u32::from(port),
                authority,
                method: req.uri().path().to_owned(),
                metadata,
                message: String::new(),
                peer: peer.ip().to_string(),
            },
            asked,
        }
    }

    /// `x-echo-ident`, `x-echo-pod`, `x-echo-host` and `x-echo-peer`, on replies and errors.
    fn metadata(&self) -> MetadataMap {
        let mut m = MetadataMap::new();
        let mut put = |name: &'static str, value: &str| {
            if let Ok(v) = MetadataValue::try_from(value) {
                m.insert(name, v);
            }
        };
        put(IDENT_HEADER, &self.reply.ident);
        put("x-echo-pod", &self.reply.pod);
        put("x-echo-peer", &self.reply.peer);
        if !self.reply.authority.is_empty() {
            put("x-echo-host", &self.reply.authority);
        }
        m
    }
}

impl tower_service::Service<tonic::Request<EchoRequest>> for EchoCall {
    type Response = tonic::Response<EchoReply>;
    type Error = Status;
    type Future = Ready<Result<Self::Response, Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::Request<EchoRequest>) -> Self::Future {
        let req = req.into_inner();
        let asked = self.asked.clone().or_else(|| {
            (req.status_code != 0).then(|| (req.status_code, req.status_message.clone()))
        });
        if let Some((code, message)) = asked
            && code != 0
        {
            return ready(Err(Status::with_metadata(
                Code::from_i32(code),
                message,
                self.metadata(),
            )));
        }
        let mut reply = self.reply.clone();
        reply.message = req.message;
        let mut resp = tonic::Response::new(reply);
        *resp.metadata_mut() = self.metadata();
        ready(Ok(resp))
    }
}
