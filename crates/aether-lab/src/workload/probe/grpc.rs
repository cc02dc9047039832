//! The probe's gRPC client: tonic's [`tonic::client::Grpc`] over an HTTP/2 connection the probe
//! made itself (issue #7 §2).
//!
//! tonic's own channel would dial by itself, outside the pod's network namespace and past the
//! probe's [`super::Connector`]. Instead the probe hands tonic a small tower service,
//! [`Connection`], built on hyper's HTTP/2 client connection over the probe's `TcpStream`.
//! That service also records what tonic does not keep: the HTTP status and headers as they
//! came, the trailers, and the body of an answer that is not gRPC (the mesh refuses with a
//! plain `421` or `503`, an `x-aether-error` header and a text body, which tonic would only
//! turn into an error status). Each call's record travels in the request's extensions
//! ([`Seen`]), so one connection can carry many concurrent calls.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Instant;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{StatusCode, Uri};
use http_body::{Body as HttpBody, Frame};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use serde::Serialize;
use tokio::net::TcpStream;
use tonic::body::Body as TonicBody;
use tonic::metadata::{AsciiMetadataKey, BinaryMetadataKey, MetadataValue};
use tonic_prost::ProstCodec;

use super::h2c::{handshake, read_body};
use super::{Outcome, Probe, ProbeError, header_list};
use crate::workload::grpc::{DEFAULT_METHOD, EchoReply, EchoRequest, code_name};
use aether::time;

/// One unary gRPC call ([`super::Send::Grpc`]), with an [`EchoRequest`] as its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcRequest {
    /// The method, `pkg.Service/Method` (a leading `/` is allowed). The echo answers any.
    pub method: String,
    /// The `:authority`; `None` sends the dial's [`super::Dial::authority`].
    pub authority: Option<String>,
    /// Request metadata, in order, names sent in lower case. A name ending in `-bin` takes
    /// its value as bytes (base64 on the wire). tonic drops the reserved names (`te`,
    /// `content-type`, `grpc-status`, `grpc-message`, `grpc-message-type`).
    pub headers: Vec<(String, String)>,
    /// [`EchoRequest::message`].
    pub message: String,
    /// Ask the echo for this status, `(code, message)`, through the request message
    /// ([`EchoRequest::status_code`]); `None` or code 0 asks for the reply.
    pub status: Option<(i32, String)>,
}

impl GrpcRequest {
    /// A call of `method` with no metadata, asking for the reply.
    pub fn new(method: impl Into<String>) -> Self {
        Self {
            method: method.into(),
            authority: None,
            headers: Vec::new(),
            message: String::new(),
            status: None,
        }
    }
}

impl Default for GrpcRequest {
    /// A call of [`DEFAULT_METHOD`].
    fn default() -> Self {
        Self::new(DEFAULT_METHOD)
    }
}

/// What a gRPC call answered, besides the HTTP status, headers and body in [`Outcome`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrpcAnswer {
    /// The status code a gRPC client sees: the answer's `grpc-status` (in its trailers, or in
    /// its headers for a trailers-only answer), or, for an answer without one (a plain HTTP
    /// answer such as a mesh refusal), the code tonic infers from the HTTP status.
    pub code: i32,
    /// The code's canonical name (`OK`, `NOT_FOUND`, ...).
    pub code_name: String,
    /// The status message (`grpc-message`, decoded), or tonic's text for an inferred status.
    pub message: String,
    /// Whether the answer itself carried `grpc-status` (false: the code was inferred).
    pub status_sent: bool,
    /// The response trailers, lower-case names, in order.
    pub trailers: Vec<(String, String)>,
    /// The echo's reply, when the call succeeded.
    pub reply: Option<EchoReply>,
}

// === The tower service tonic calls ===

/// An answer's head: its status, its headers, and when it arrived.
type Head = (u16, Vec<(String, String)>, Instant);

/// The HTTP answer under one gRPC call, as it came off the connection; written by
/// [`Connection`] and [`SeenBody`], read once the call is over.
#[derive(Debug, Default)]
struct Seen {
    /// The status and headers, and when they arrived.
    head: OnceLock<Head>,
    /// The trailers.
    trailers: OnceLock<Vec<(String, String)>>,
    /// The body of an answer that is not gRPC, and whether it was truncated.
    plain_body: OnceLock<(Vec<u8>, bool)>,
}

/// A [`Seen`] in a request's extensions (which need `Clone`).
#[derive(Debug, Clone, Default)]
struct SeenSlot(Arc<Seen>);

/// A tower service over one HTTP/2 client connection, for [`tonic::client::Grpc`].
#[derive(Debug, Clone)]
struct Connection {
    sender: SendRequest<TonicBody>,
    body_limit: usize,
}

impl tower_service::Service<http::Request<TonicBody>> for Connection {
    type Response = http::Response<SeenBody>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, hyper::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.sender.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<TonicBody>) -> Self::Future {
        let seen = req
            .extensions()
            .get::<SeenSlot>()
            .cloned()
            .unwrap_or_default();
        let answer = self.sender.send_request(req);
        let limit = self.body_limit;
        Box::pin(async move {
            let resp = answer.await?;
            let (parts, body) = resp.into_parts();
            let _ = seen.0.head.set((
                parts.status.as_u16(),
                header_list(&parts.headers),
                time::now(),
            ));
            let grpc = parts.status == StatusCode::OK
                && parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
            let body = if grpc {
                SeenBody {
                    inner: Some(body),
                    seen,
                }
            } else {
                // Not gRPC: keep the text for the outcome and give tonic an empty body, so
                // that it infers the status from the HTTP status instead of failing to parse
                // the text as gRPC frames.
                let plain = read_body(body, limit).await?;
                let _ = seen.0.plain_body.set(plain);
                SeenBody { inner: None, seen }
            };
            Ok(http::Response::from_parts(parts, body))
        })
    }
}

/// A response body that records its trailers in [`Seen`] as they pass.
#[derive(Debug)]
struct SeenBody {
    /// `None`: an empty body (the answer was not gRPC and has been read already).
    inner: Option<Incoming>,
    seen: SeenSlot,
}

impl HttpBody for SeenBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = ready!(Pin::new(inner).poll_frame(cx));
        if let Some(Ok(f)) = &frame
            && let Some(t) = f.trailers_ref()
        {
            let _ = this.seen.0.trailers.set(header_list(t));
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(HttpBody::is_end_stream)
    }
}

// === Calls ===

/// A kept HTTP/2 connection for gRPC calls.
pub(super) type GrpcSender = SendRequest<TonicBody>;

/// The tonic request and its path for `g`.
fn build(g: &GrpcRequest) -> Result<(tonic::Request<EchoRequest>, PathAndQuery), ProbeError> {
    let bad = |e: &dyn std::fmt::Display| ProbeError::InvalidRequest(e.to_string());
    let path = if g.method.starts_with('/') {
        g.method.clone()
    } else {
        format!("/{}", g.method)
    };
    let path: PathAndQuery = path.parse().map_err(|e| bad(&e))?;
    let (code, text) = g.status.clone().unwrap_or_default();
    let mut request = tonic::Request::new(EchoRequest {
        message: g.message.clone(),
        status_code: code,
        status_message: text,
    });
    let md = request.metadata_mut();
    for (k, v) in &g.headers {
        let k = k.to_ascii_lowercase();
        if k.ends_with("-bin") {
            let key = BinaryMetadataKey::from_bytes(k.as_bytes()).map_err(|e| bad(&e))?;
            md.append_bin(key, MetadataValue::from_bytes(v.as_bytes()));
        } else {
            let key = AsciiMetadataKey::from_bytes(k.as_bytes()).map_err(|e| bad(&e))?;
            let value = v.parse().map_err(|e| bad(&e))?;
            md.append(key, value);
        }
    }
    Ok((request, path))
}

/// `http://<authority>`, the origin tonic puts in front of the method path.
fn origin(authority: &str) -> Result<Uri, ProbeError> {
    Uri::builder()
        .scheme("http")
        .authority(authority)
        .path_and_query("/")
        .build()
        .map_err(|e| ProbeError::InvalidRequest(format!("authority {authority:?}: {e}")))
}

impl Probe {
    /// The `:authority` of `g`'s calls.
    fn grpc_authority(&self, g: &GrpcRequest) -> String {
        g.authority.clone().unwrap_or_else(|| self.dial.authority())
    }

    /// One call on its own connection over `stream`.
    pub(super) async fn run_grpc(
        &self,
        g: &GrpcRequest,
        stream: TcpStream,
        deadline: Instant,
        out: &mut Outcome,
    ) -> Result<(), ProbeError> {
        let left = deadline.saturating_duration_since(time::now());
        match tokio::time::timeout(left, handshake::<TonicBody>(stream)).await {
            Err(_) => out.timed_out = true,
            Ok(Err(e)) => {
                out.peer_closed = e.is_closed() || e.is_incomplete_message();
                out.error = Some(format!("h2c: {e}"));
            }
            Ok(Ok((sender, _driver))) => self.grpc_call(g, sender, deadline, out).await?,
        }
        Ok(())
    }

    /// One call on `sender` (a kept or a new connection), bounded by `deadline`.
    pub(super) async fn grpc_call(
        &self,
        g: &GrpcRequest,
        sender: GrpcSender,
        deadline: Instant,
        out: &mut Outcome,
    ) -> Result<(), ProbeError> {
        let (mut request, path) = build(g)?;
        let seen = SeenSlot::default();
        request.extensions_mut().insert(seen.clone());
        let connection = Connection {
            sender,
            body_limit: self.body_limit,
        };
        let mut client =
            tonic::client::Grpc::with_origin(connection, origin(&self.grpc_authority(g))?);
        let sent = time::now();
        let call = async {
            client
                .ready()
                .await
                .map_err(|e| tonic::Status::from_error(e.into()))?;
            client
                .unary(
                    request,
                    path,
                    ProstCodec::<EchoRequest, EchoReply>::default(),
                )
                .await
        };
        let left = deadline.saturating_duration_since(sent);
        let result = tokio::time::timeout(left, call).await;

        let Some((status, headers, at)) = seen.0.head.get() else {
            match result {
                Err(_) => out.timed_out = true,
                Ok(Err(s)) => out.error = Some(format!("grpc: {}", s.message())),
                Ok(Ok(_)) => out.error = Some("grpc: an answer without a head".to_owned()),
            }
            return Ok(());
        };
        out.status = Some(*status);
        out.version = Some("HTTP/2".to_owned());
        out.headers.clone_from(headers);
        out.timings.first_byte = Some(at.saturating_duration_since(sent));
        if let Some((body, truncated)) = seen.0.plain_body.get() {
            out.body.clone_from(body);
            out.truncated = *truncated;
        }
        let trailers = seen.0.trailers.get().cloned().unwrap_or_default();
        let status_sent = headers
            .iter()
            .chain(&trailers)
            .any(|(k, _)| k == "grpc-status");
        let (code, message, reply) = match result {
            Err(_) => {
                // The head came, the rest did not.
                out.timed_out = true;
                return Ok(());
            }
            Ok(Ok(resp)) => (0, String::new(), Some(resp.into_inner())),
            Ok(Err(s)) => (i32::from(s.code()), s.message().to_owned(), None),
        };
        out.grpc = Some(GrpcAnswer {
            code,
            code_name: code_name(code),
            message,
            status_sent,
            trailers,
            reply,
        });
        Ok(())
    }
}
