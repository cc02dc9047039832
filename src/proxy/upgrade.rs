//! Requests that switch protocols (addressing.md I11): an HTTP/1.1 request with
//! `Connection: upgrade` and `Upgrade: <protocol>` (WebSocket, for example) is routed like any
//! request, and once the upstream answers `101 Switching Protocols` the two byte streams are
//! relayed unchanged until either side closes.
//!
//! HTTP/2 cannot carry such a request, so every leg that carries one speaks HTTP/1.1 on a
//! connection of its own: the mesh hop with ALPN [`ALPN_H1`](super::ALPN_H1) (source to
//! destination), the connection to the application, and a passthrough's connection. Each leg
//! uses [`forward`]: the request goes out on a fresh HTTP/1.1 connection and, on a `101`, the
//! upstream's upgraded connection is spliced with the caller's ([`splice`]).
//!
//! The functions here own no socket: they take any byte stream, so that the splice can be
//! tested over in-memory streams.

use http::header::{CONNECTION, UPGRADE};
use http::{Request, Response, StatusCode, Version};
use http_body_util::BodyExt;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tracing::debug;

use super::{Body, BoxError};

/// Relaying a switched connection failed.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// The HTTP/1.1 handshake on the upstream connection failed.
    #[error("http/1.1 handshake")]
    Handshake(#[source] hyper::Error),
    /// Sending the request or reading its answer failed.
    #[error("http/1.1 request")]
    Request(#[source] hyper::Error),
    /// One side's connection never switched (it closed, or was not an upgrade).
    #[error("connection did not switch protocols")]
    Switch(#[source] hyper::Error),
    /// Relaying the bytes failed.
    #[error("relaying the switched connection")]
    Relay(#[source] std::io::Error),
}

/// Whether `req` asks to switch protocols: HTTP/1.1, an `Upgrade` field, and `upgrade` among
/// the `Connection` tokens.
pub fn is_upgrade<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_11
        && req.headers().contains_key(UPGRADE)
        && req.headers().get_all(CONNECTION).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
        })
}

/// Send the upgrade request `req` on a fresh HTTP/1.1 connection over `io` and return the
/// answer. When it is `101 Switching Protocols`, a task splices `client` (the caller's side of
/// the switch, from [`hyper::upgrade::on`] on the incoming request) with the upstream's
/// upgraded connection once the caller has sent the `101` on; any other answer is returned as
/// it is and `client` is dropped.
pub async fn forward<IO>(
    io: IO,
    req: Request<Body>,
    client: OnUpgrade,
) -> Result<Response<Body>, UpgradeError>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(io))
        .await
        .map_err(UpgradeError::Handshake)?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            debug!(error = %e, "upgrade connection ended");
        }
    });
    let mut resp = sender
        .send_request(req)
        .await
        .map_err(UpgradeError::Request)?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let upstream = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            match splice(client, upstream).await {
                Ok((up, down)) => debug!(up, down, "switched connection closed"),
                Err(e) => debug!(error = %crate::DisplayChain(&e), "switched connection failed"),
            }
        });
    }
    Ok(resp.map(|b| b.map_err(BoxError::from).boxed()))
}

/// Wait for both sides to switch, then relay bytes both ways until either closes; the bytes
/// sent each way (client to upstream, upstream to client).
pub async fn splice(client: OnUpgrade, upstream: OnUpgrade) -> Result<(u64, u64), UpgradeError> {
    let (client, upstream) = tokio::try_join!(client, upstream).map_err(UpgradeError::Switch)?;
    let mut client = TokioIo::new(client);
    let mut upstream = TokioIo::new(upstream);
    tokio::io::copy_bidirectional(&mut client, &mut upstream)
        .await
        .map_err(UpgradeError::Relay)
}

#[cfg(test)]
mod tests;
