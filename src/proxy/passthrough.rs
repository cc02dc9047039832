//! Where a passthrough goes (addressing.md C8, §7.2; model.md §12.5 item 1): to the dialled
//! address as the client asked, unless the destination is a mesh pod, whose bytes then cross
//! the mesh hop instead of the network in plaintext. Used by the byte-level passthrough of a
//! captured connection and by each HTTP request passed through.
//!
//! May import: `balance`, `hop`, `socket`, the proxy's shared types; never `http` or the filters.
//! Invariant: a destination the model says is a mesh pod is never reached in plaintext.

use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncWrite};
use tracing::debug;

use super::balance::{self, Load, Outcome, Tried};
use super::socket::Source;
use super::{ALPN_L4, Inputs, PodCtx, count, hop};
use crate::model::target::L4Endpoint;
use crate::resolve::decision::{Endpoint, ServiceKey};

/// A byte stream to a passthrough's destination: a plain TCP connection or an L4 mesh hop.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// A boxed [`Io`].
pub type BoxIo = Box<dyn Io>;

/// Where one passthrough goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The address connected to: the dialled one, or the endpoint picked behind it.
    pub dst: SocketAddr,
    /// The endpoint's mesh service when it is a mesh pod: the bytes cross the hop to it.
    pub hop: Option<ServiceKey>,
    /// Nothing may go there: the dialled address is a pod's that rows of more than one
    /// service claim (docs/decisions.md, "An address two rows claim").
    pub refused: bool,
}

/// Pick where a passthrough of a connection that dialled `dialled` goes: among the Ready
/// endpoints behind it ([`balance`]: two at random, the less loaded; issue #38) when one of them
/// is a mesh pod ([`crate::model::Model::passthrough_over_hop`]), else `dialled` itself. The
/// [`Load`] counts the endpoint's work until dropped.
pub fn pick(inputs: &Inputs, dialled: SocketAddr) -> (Target, Load) {
    let Some(endpoints) = inputs.model.load().passthrough_over_hop(dialled) else {
        return (direct(dialled), Load::none());
    };
    let key = |i: usize| SocketAddr::new(endpoints[i].address, endpoints[i].port);
    match balance::choose_among(inputs, endpoints.len(), key) {
        Some(c) => (target_of(inputs, &endpoints[c.index]), c.load),
        // The model lists no endpoint only for a contested pod address.
        None => (contested(dialled), Load::none()),
    }
}

/// A dialled address that rows of more than one service claim: nothing may go there.
fn contested(dialled: SocketAddr) -> Target {
    Target {
        dst: dialled,
        hop: None,
        refused: true,
    }
}

/// The passthrough to the dialled address itself.
fn direct(dialled: SocketAddr) -> Target {
    Target {
        dst: dialled,
        hop: None,
        refused: false,
    }
}

/// Where a passthrough to endpoint `e` goes (a mesh pod's is counted as an L4 hop).
fn target_of(inputs: &Inputs, e: &L4Endpoint) -> Target {
    if e.mesh.is_some() {
        count(&inputs.stats.l4_hops);
    }
    Target {
        dst: SocketAddr::new(e.address, e.port),
        hop: e.mesh.clone(),
        refused: false,
    }
}

/// Pick and open a byte-level passthrough of a connection that dialled `dialled` (as [`pick`]
/// and [`open`]); an endpoint behind it that cannot be connected to is ejected and another
/// tried once (the client's bytes have not been read yet). The stream, where it goes, and the
/// endpoint's load while the stream lasts.
pub async fn connect(
    inputs: &Inputs,
    pod: &PodCtx,
    dialled: SocketAddr,
) -> Option<(BoxIo, Target, Load)> {
    let Some(endpoints) = inputs.model.load().passthrough_over_hop(dialled) else {
        let target = direct(dialled);
        let io = open(inputs, pod, &target).await?;
        return Some((io, target, Load::none()));
    };
    if endpoints.is_empty() {
        // Refused and counted by `try_open`.
        let _ = try_open(inputs, pod, &contested(dialled)).await;
        return None;
    }
    let endpoints = &endpoints[..];
    let key = |i: usize| SocketAddr::new(endpoints[i].address, endpoints[i].port);
    let opened = balance::deliver_among(inputs, endpoints.len(), key, (), |i, ()| async move {
        let target = target_of(inputs, &endpoints[i]);
        match try_open(inputs, pod, &target).await {
            Ok(io) => Tried::Done((io, target)),
            Err(Unopened::NotConnected) => Tried::NotConnected((), Some(())),
            Err(Unopened::Refused) => Tried::Failed(()),
        }
    })
    .await;
    match opened {
        Outcome::Reached {
            value: (io, target),
            load,
            ..
        } => Some((io, target, load)),
        Outcome::Failed(()) | Outcome::NoEndpoint => None,
    }
}

/// Why [`try_open`] opened nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unopened {
    /// The connection (or the hop's TLS handshake) failed: another endpoint may do.
    NotConnected,
    /// Nothing may go there (a contested address), or the hop's server name is invalid.
    Refused,
}

/// Open the stream to `target` for `pod`: an L4 mesh hop (ALPN `aether-l4/1`) to a mesh pod,
/// otherwise a TCP connection from the pod's own address.
pub async fn open(inputs: &Inputs, pod: &PodCtx, target: &Target) -> Option<BoxIo> {
    try_open(inputs, pod, target).await.ok()
}

async fn try_open(inputs: &Inputs, pod: &PodCtx, target: &Target) -> Result<BoxIo, Unopened> {
    let dst = target.dst;
    if target.refused {
        count(&inputs.stats.contested_refused);
        debug!(%dst, "passthrough to a contested pod address refused");
        return Err(Unopened::Refused);
    }
    if let Some(service) = &target.hop {
        let endpoint = Endpoint {
            address: dst.ip(),
            pod: None,
            node: None,
            mesh_service: service.clone(),
        };
        return match hop::connect(inputs, pod, &endpoint, dst.port(), ALPN_L4).await {
            Ok(tls) => Ok(Box::new(tls)),
            Err(e) => {
                debug!(error = %crate::DisplayChain(&e), %dst, "l4 hop failed");
                Err(if e.not_connected() {
                    Unopened::NotConnected
                } else {
                    Unopened::Refused
                })
            }
        };
    }
    let connect = tokio::time::timeout(
        inputs.settings.connect_timeout,
        pod.net.connect(dst, Source::PodIp),
    )
    .await;
    match connect {
        Ok(Ok(tcp)) => Ok(Box::new(tcp)),
        _ => {
            debug!(%dst, "passthrough destination unreachable");
            Err(Unopened::NotConnected)
        }
    }
}
