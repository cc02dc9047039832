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
//! tested over in-memory streams. Imports: `copy` (the relay), `access` (the accounting guard
//! of the switched bytes).
//!
//! A `101` carries a [`Switched`] in its extensions: whoever counts the request (it knows the
//! destination's series and the access line) gives it the stream's [`TcpConn`], which the
//! splice fills with the bytes moved each way and drops at its end, so that a switched
//! connection is counted and logged as the byte stream it became.

use http::header::{CONNECTION, UPGRADE};
use http::{HeaderValue, Request, Response, StatusCode, Version};
use http_body_util::BodyExt;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tracing::debug;

use std::sync::Arc;

use super::access::TcpConn;
use super::copy::{Ended, Moved};
use super::{Body, BoxError};

/// The accounting slot of a switched connection, in the extensions of its `101`.
#[derive(Clone, Debug, Default)]
pub struct Switched(Arc<parking_lot::Mutex<Option<TcpConn>>>);

impl Switched {
    /// Count the switched bytes into `conn` (counted opened now, closed when the splice
    /// ends). Before the `101` reaches the client, so before a byte is spliced.
    pub fn account(&self, conn: TcpConn) {
        *self.0.lock() = Some(conn);
    }

    /// The splice ended, having moved `moved`: close the stream's accounting.
    fn close(&self, moved: Moved) {
        if let Some(mut conn) = self.0.lock().take() {
            conn.sent = moved.a_to_b;
            conn.received = moved.b_to_a;
        }
    }
}

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

/// The protocols of a client's `Upgrade` field that the mesh carries (addressing.md I11), as the
/// field to send on; `None` when none is left. Every protocol is carried but HTTP itself
/// (`h2c`, `h2`, `HTTP/<version>`): after such a switch the client's bytes would be requests
/// the mesh must route one by one (I5), not a stream to relay, so the request is served as the
/// plain HTTP/1.1 request it also is (docs/decisions.md).
pub fn relayed_protocols(upgrade: &HeaderValue) -> Option<HeaderValue> {
    let kept: Vec<&[u8]> = upgrade
        .as_bytes()
        .split(|b| *b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|p| !p.is_empty() && !is_http(p))
        .collect();
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(&kept.join(&b", "[..])).ok()
}

/// Whether an `Upgrade` protocol is HTTP (`h2c`, `h2`, `HTTP/2.0`, ...).
fn is_http(protocol: &[u8]) -> bool {
    let name = protocol.split(|b| *b == b'/').next().unwrap_or_default();
    [&b"h2c"[..], b"h2", b"http"]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h))
}

/// Set the fields of a protocol switch the mesh carries on a request whose hop-by-hop fields
/// were removed (`filters::strip_client_request`): `Upgrade` with the carried protocols and
/// `Connection: upgrade`. Whether the request switches: an HTTP/1.1 request whose client asked
/// (`upgrade` among its `Connection` options) for a protocol the mesh carries.
pub fn carry<B>(req: &mut Request<B>, upgrade: Option<&HeaderValue>, asked: bool) -> bool {
    let Some(protocols) = upgrade
        .filter(|_| asked && req.version() == Version::HTTP_11)
        .and_then(relayed_protocols)
    else {
        return false;
    };
    req.headers_mut().insert(UPGRADE, protocols);
    req.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("upgrade"));
    true
}

/// Send the upgrade request `req` on a fresh HTTP/1.1 connection over `io` and return the
/// answer. When it is `101 Switching Protocols`, a task splices `client` (the caller's side of
/// the switch, from [`hyper::upgrade::on`] on the incoming request) with the upstream's
/// upgraded connection once the caller has sent the `101` on, until both close or no byte moves
/// for `idle`; any other answer is returned as it is and `client` is dropped. The `101` carries
/// the splice's [`Switched`].
pub async fn forward<IO>(
    io: IO,
    req: Request<Body>,
    client: OnUpgrade,
    idle: Option<std::time::Duration>,
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
        let switched = Switched::default();
        resp.extensions_mut().insert(switched.clone());
        tokio::spawn(async move {
            let mut moved = Moved::default();
            match splice(client, upstream, idle, &mut moved).await {
                Ok(Ended::Closed { a_to_b, b_to_a }) => {
                    debug!(up = a_to_b, down = b_to_a, "switched connection closed");
                }
                Ok(Ended::Idle) => debug!("switched connection closed: idle"),
                Err(e) => debug!(error = %crate::DisplayChain(&e), "switched connection failed"),
            }
            switched.close(moved);
        });
    }
    Ok(resp.map(|b| b.map_err(BoxError::from).boxed()))
}

/// Wait for both sides to switch, then relay bytes both ways until both close or no byte moves
/// for `idle` ([`super::copy`]); the bytes moved each way (client to upstream first) go to
/// `moved`, however it ends.
pub async fn splice(
    client: OnUpgrade,
    upstream: OnUpgrade,
    idle: Option<std::time::Duration>,
    moved: &mut Moved,
) -> Result<Ended, UpgradeError> {
    let (client, upstream) = tokio::try_join!(client, upstream).map_err(UpgradeError::Switch)?;
    let mut client = TokioIo::new(client);
    let mut upstream = TokioIo::new(upstream);
    super::copy::bidirectional_counted(&mut client, &mut upstream, idle, moved)
        .await
        .map_err(UpgradeError::Relay)
}

#[cfg(test)]
mod tests;
