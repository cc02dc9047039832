//! Where a passthrough goes (addressing.md C8, §7.2; model.md §12.5 item 1): to the dialled
//! address as the client asked, unless the destination is a mesh pod, whose bytes then cross
//! the mesh hop instead of the network in plaintext. Used by the byte-level passthrough of a
//! captured connection and by each HTTP request passed through.
//!
//! May import: `hop`, `socket`, the proxy's shared types; never `http` or the filters.
//! Invariant: a destination the model says is a mesh pod is never reached in plaintext.

use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncWrite};
use tracing::debug;

use super::socket::Source;
use super::{ALPN_L4, Inputs, PodCtx, count, hop};
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
/// endpoints behind it at random (as kube-proxy would) when one of them is a mesh pod
/// ([`crate::model::Model::passthrough_over_hop`]), else `dialled` itself.
pub fn pick(inputs: &Inputs, dialled: SocketAddr) -> Target {
    let Some(endpoints) = inputs.model.load().passthrough_over_hop(dialled) else {
        return Target {
            dst: dialled,
            hop: None,
            refused: false,
        };
    };
    match endpoints.get(fastrand::usize(..endpoints.len().max(1))) {
        Some(e) => {
            if e.mesh.is_some() {
                count(&inputs.stats.l4_hops);
            }
            Target {
                dst: SocketAddr::new(e.address, e.port),
                hop: e.mesh.clone(),
                refused: false,
            }
        }
        // The model lists no endpoint only for a contested pod address.
        None => Target {
            dst: dialled,
            hop: None,
            refused: true,
        },
    }
}

/// Open the stream to `target` for `pod`: an L4 mesh hop (ALPN `aether-l4/1`) to a mesh pod,
/// otherwise a TCP connection from the pod's own address.
pub async fn open(inputs: &Inputs, pod: &PodCtx, target: &Target) -> Option<BoxIo> {
    let dst = target.dst;
    if target.refused {
        count(&inputs.stats.contested_refused);
        debug!(%dst, "passthrough to a contested pod address refused");
        return None;
    }
    if let Some(service) = &target.hop {
        let endpoint = Endpoint {
            address: dst.ip(),
            pod: None,
            node: None,
            mesh_service: service.clone(),
        };
        return match hop::connect(inputs, pod, &endpoint, dst.port(), ALPN_L4).await {
            Ok(tls) => Some(Box::new(tls)),
            Err(e) => {
                debug!(error = %crate::DisplayChain(&e), %dst, "l4 hop failed");
                None
            }
        };
    }
    let connect = tokio::time::timeout(
        inputs.settings.connect_timeout,
        pod.net.connect(dst, Source::PodIp),
    )
    .await;
    match connect {
        Ok(Ok(tcp)) => Some(Box::new(tcp)),
        _ => {
            debug!(%dst, "passthrough destination unreachable");
            None
        }
    }
}
