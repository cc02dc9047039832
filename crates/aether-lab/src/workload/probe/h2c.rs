//! HTTP/2 with prior knowledge (h2c) through hyper's client connection, on a stream the probe
//! connected itself: one request per connection ([`Probe::run`]), or many requests multiplexed
//! on a kept connection ([`Probe::run_many`]).

use std::time::Instant;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::{Host, HttpRequest, Outcome, Probe, ProbeError, Target, header_list};
use aether::time;

/// Aborts the task driving an HTTP/2 connection when dropped: a connection lives no longer
/// than what uses it.
#[derive(Debug)]
pub(super) struct Driver(JoinHandle<()>);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The HTTP/2 handshake on `stream`; the connection is driven by a task until the [`Driver`]
/// is dropped.
pub(super) async fn handshake<B>(
    stream: TcpStream,
) -> Result<(SendRequest<B>, Driver), hyper::Error>
where
    B: http_body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await?;
    let driver = tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "probe: h2 connection ended");
        }
    });
    Ok((sender, Driver(driver)))
}

/// Read a body, keeping at most `limit` bytes; true when bytes were dropped.
pub(super) async fn read_body(
    mut body: Incoming,
    limit: usize,
) -> Result<(Vec<u8>, bool), hyper::Error> {
    let mut data = Vec::new();
    let mut truncated = false;
    while let Some(frame) = body.frame().await {
        if let Ok(chunk) = frame?.into_data() {
            let room = limit.saturating_sub(data.len());
            truncated |= chunk.len() > room;
            data.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if truncated {
                break;
            }
        }
    }
    Ok((data, truncated))
}

/// What an h2c exchange brought back.
pub(super) struct H2Answer {
    parts: http::response::Parts,
    body: Vec<u8>,
    truncated: bool,
    first_byte: std::time::Duration,
}

/// Send `request` on `sender` and read the whole answer (bounded by `limit`).
pub(super) async fn send(
    sender: &mut SendRequest<Full<Bytes>>,
    request: http::Request<Full<Bytes>>,
    limit: usize,
) -> Result<H2Answer, hyper::Error> {
    sender.ready().await?;
    let sent = time::now();
    let resp = sender.send_request(request).await?;
    let first_byte = time::now().saturating_duration_since(sent);
    let (parts, body) = resp.into_parts();
    let (body, truncated) = read_body(body, limit).await?;
    Ok(H2Answer {
        parts,
        body,
        truncated,
        first_byte,
    })
}

/// Put an exchange's result (or its timeout) into `out`.
pub(super) fn record(
    result: Result<Result<H2Answer, hyper::Error>, tokio::time::error::Elapsed>,
    out: &mut Outcome,
) {
    match result {
        Err(_) => out.timed_out = true,
        Ok(Err(e)) => {
            out.peer_closed = e.is_closed() || e.is_incomplete_message();
            out.error = Some(format!("h2c: {e}"));
        }
        Ok(Ok(a)) => {
            out.status = Some(a.parts.status.as_u16());
            out.version = Some("HTTP/2".to_owned());
            out.headers = header_list(&a.parts.headers);
            out.body = a.body;
            out.truncated = a.truncated;
            out.timings.first_byte = Some(a.first_byte);
        }
    }
}

impl Probe {
    /// The h2c request for `req`: `:authority` from the target, the `Host` values or the dial.
    pub(super) fn h2c_request(
        &self,
        req: &HttpRequest,
    ) -> Result<http::Request<Full<Bytes>>, ProbeError> {
        let authority = match (&req.target, &req.host) {
            (Target::Origin(_), Host::None) => None,
            (Target::Origin(_), Host::Values(v)) => v.first().cloned(),
            _ => Some(
                req.target_authority()
                    .unwrap_or_else(|| self.dial.authority()),
            ),
        };
        let uri = match (&req.target, authority) {
            (Target::Authority(a), _) => a.clone(),
            (Target::Absolute(u), _) => u.clone(),
            (Target::Origin(p), Some(a)) => format!("http://{a}{p}"),
            (Target::Origin(p), None) => p.clone(),
        };
        let bad = |e: &dyn std::fmt::Display| ProbeError::InvalidRequest(e.to_string());
        let uri: Uri = uri.parse().map_err(|e| bad(&e))?;
        let method = Method::from_bytes(req.method.as_bytes()).map_err(|e| bad(&e))?;
        let mut request = http::Request::builder()
            .method(method)
            .uri(uri)
            .body(Full::new(Bytes::from(req.body.clone())))
            .map_err(|e| bad(&e))?;
        let headers = request.headers_mut();
        if let Host::Values(values) = &req.host {
            for v in values {
                headers.append(
                    http::header::HOST,
                    HeaderValue::from_str(v).map_err(|e| bad(&e))?,
                );
            }
        }
        for (k, v) in &req.headers {
            let name =
                HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()).map_err(|e| bad(&e))?;
            headers.append(name, HeaderValue::from_str(v).map_err(|e| bad(&e))?);
        }
        Ok(request)
    }

    /// One h2c request on its own connection over `stream`.
    pub(super) async fn run_h2c(
        &self,
        req: &HttpRequest,
        stream: TcpStream,
        deadline: Instant,
        out: &mut Outcome,
    ) -> Result<(), ProbeError> {
        let request = self.h2c_request(req)?;
        let left = deadline.saturating_duration_since(time::now());
        let exchange = async {
            let (mut sender, _driver) = handshake(stream).await?;
            send(&mut sender, request, self.body_limit).await
        };
        record(tokio::time::timeout(left, exchange).await, out);
        Ok(())
    }
}
