//! Talking to a plain HTTP upstream outside the mesh hop: the dialled address of a passthrough
//! (from the client pod's own address), and the application a delivery that crossed the hop is
//! handed to (from the client pod's IP where the kernel allows, model.md §12.4). Requests go on
//! kept connections ([`crate::proxy::app_pool`]); a request that switches protocols gets a
//! connection of its own and is spliced on `101` ([`crate::proxy::upgrade`]).
//!
//! May import: `app_pool`, `upgrade`, `socket`, `respond`, `passthrough` (which opens a
//! passthrough's stream, over the hop to a mesh pod); never the filters or the rest of `http`. Invariant: an upstream's `x-aether-error` never reaches the client (I12);
//! every other status, header and body byte passes unchanged (I2).

use std::net::{IpAddr, SocketAddr};

use http::{Request, Response, StatusCode, Uri, Version};
use hyper::upgrade::OnUpgrade;
use tokio::net::TcpStream;
use tracing::debug;

use crate::proxy::app_pool::{Purpose, Unreached};
use crate::proxy::socket::{SocketError, Source};
use crate::proxy::{Body, BoxError, Inputs, PodCtx, count, passthrough, respond, upgrade};
use crate::resolve::answer::{HEADER_ERROR, Reason};

/// Forward one request outside the mesh to the address the client dialled, from the client
/// pod's own address; the application's `x-aether-error` is removed (I12). An upgrade request
/// is spliced once the destination switches.
pub(super) async fn passthrough(
    inputs: &Inputs,
    pod: &PodCtx,
    dialled: SocketAddr,
    req: Request<Body>,
    client_upgrade: Option<OnUpgrade>,
) -> Response<Body> {
    let Ok(source) = pod.net.ip_for(dialled) else {
        return respond::reason(Reason::UpstreamUnreachable);
    };
    let h2 = req.version() == Version::HTTP_2;
    // A mesh pod behind the dialled address is reached over the hop (model.md §12.5 item 1);
    // kept connections are per endpoint then.
    // The endpoint's load lasts until the response head (no second try here: issue #38 retries
    // the byte-level passthrough, whose client bytes are still unread).
    let (target, _load) = passthrough::pick(inputs, dialled);
    let purpose = if target.hop.is_some() {
        Purpose::PassthroughHop
    } else {
        Purpose::Passthrough
    };
    let connect = || passthrough::open(inputs, pod, &target);
    forward(
        inputs,
        pod,
        purpose,
        source,
        target.dst,
        h2,
        origin_form(req),
        client_upgrade,
        connect,
    )
    .await
}

/// Send a request to `dst` — a passthrough destination, or the application on a delivery — and
/// answer with its response, the upstream's `x-aether-error` removed (I12). The request goes on
/// a kept connection of `pod` per (`purpose`, `source`, `dst`) (`proxy::app_pool`); an upgrade
/// request gets a connection of its own, which becomes the client's after `101`.
#[allow(clippy::too_many_arguments)] // One request's facts, each once; no bundle repeats.
async fn forward<F, Fut, S>(
    inputs: &Inputs,
    pod: &PodCtx,
    purpose: Purpose,
    source: IpAddr,
    dst: SocketAddr,
    h2: bool,
    req: Request<Body>,
    client_upgrade: Option<OnUpgrade>,
    connect: F,
) -> Response<Body>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Option<S>>,
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let sent = match client_upgrade {
        Some(up) => match connect().await {
            Some(stream) => upgrade::forward(stream, req, up, inputs.settings.tcp_idle_timeout)
                .await
                .map_err(BoxError::from),
            None => Err(Unreached.into()),
        },
        None => pod.apps.send(purpose, source, dst, h2, req, connect).await,
    };
    match sent {
        Ok(mut resp) => {
            count_switch(inputs, &resp);
            resp.headers_mut().remove(HEADER_ERROR);
            resp
        }
        Err(e) => {
            debug!(error = %crate::DisplayChain(&*e), %dst, "upstream request failed");
            let mut resp = respond::reason(Reason::UpstreamUnreachable);
            if e.is::<Unreached>() {
                resp.extensions_mut().insert(Unreached);
            }
            resp
        }
    }
}

/// Count a `101` that starts a splice.
pub(super) fn count_switch(inputs: &Inputs, resp: &Response<Body>) {
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        count(&inputs.stats.upgrades);
    }
}

/// HTTP/1 sends origin form (absolute form is kept when the client used it); HTTP/2 needs a
/// scheme and authority, which stay as received.
fn origin_form(req: Request<Body>) -> Request<Body> {
    if req.version() == Version::HTTP_2 {
        return req;
    }
    if req.uri().scheme().is_some() {
        return req;
    }
    origin_form_any(req)
}

/// Connect to the application in the destination pod from a transparent socket bound to the
/// client pod's IP; where the kernel refuses, from the pod's own IP, counted (model.md §12.4).
pub async fn connect_app(
    inputs: &Inputs,
    pod: &PodCtx,
    app: SocketAddr,
    client_ip: IpAddr,
) -> Option<TcpStream> {
    let transparent = if client_ip == app.ip() || client_ip.is_ipv4() != app.is_ipv4() {
        Source::PodIp
    } else {
        Source::Transparent(client_ip)
    };
    match pod.net.connect(app, transparent).await {
        Ok(s) => Some(s),
        Err(SocketError::Io { what: "bind", .. }) => {
            count(&inputs.stats.transparent_fallbacks);
            pod.net.connect(app, Source::PodIp).await.ok()
        }
        Err(e) => {
            debug!(error = %e, %app, "application refused the delivery");
            None
        }
    }
}

/// Hand a request that arrived over the hop to the application, in the client's HTTP version;
/// the application's `x-aether-error` is removed (I12). With `client_upgrade` (the hop's side
/// of a switch) the request goes as HTTP/1.1 and a `101` splices the two connections.
pub async fn to_app(
    inputs: &Inputs,
    pod: &PodCtx,
    app: SocketAddr,
    client_ip: IpAddr,
    version: Version,
    mut req: Request<Body>,
    client_upgrade: Option<OnUpgrade>,
) -> Response<Body> {
    // An upgrade is HTTP/1.1; otherwise the client's version (or h2c when the hop asked).
    let h2 = version == Version::HTTP_2 && client_upgrade.is_none();
    *req.version_mut() = match (h2, &client_upgrade) {
        (true, _) => Version::HTTP_2,
        (false, Some(_)) => Version::HTTP_11,
        (false, None) => version,
    };
    let req = if h2 { req } else { origin_form_any(req) };
    let connect = || connect_app(inputs, pod, app, client_ip);
    forward(
        inputs,
        pod,
        Purpose::Delivery,
        client_ip,
        app,
        h2,
        req,
        client_upgrade,
        connect,
    )
    .await
}

/// Origin form for HTTP/1 toward the application, whatever form the hop carried. The path
/// shares the received bytes: nothing is copied per request (issue #38).
pub(super) fn origin_form_any(mut req: Request<Body>) -> Request<Body> {
    let pq = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    *req.uri_mut() = Uri::from(pq);
    req
}
