//! Mesh DNS in each pod: one server per pod on 127.0.0.53:53, answering from the table that is
//! swapped with every model, forwarding the rest from the pod's own namespace.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::AbortHandle;

use crate::dns::server::DnsServer;
use crate::dns::table::DnsTable;
use crate::proxy::PodCtx;

/// The table every pod's server reads, and the upstreams.
#[derive(Debug, Clone)]
pub struct DnsShared {
    /// The current table.
    pub table: Arc<ArcSwap<DnsTable>>,
    /// Where names that are not the mesh's go.
    pub upstreams: Vec<SocketAddr>,
    /// Failed TCP accepts of every pod's server (`aether_accept_errors{listener="dns"}`).
    pub accept_errors: crate::proxy::Counter,
    /// Each pod's server's TCP limits, with the daemon's counters (shared by every pod).
    pub tcp: crate::dns::TcpLimits,
    /// The daemon's DNS counters, shared by every pod's server (`aether_dns_queries_total`).
    pub stats: Arc<crate::dns::server::DnsStats>,
}

/// Start the DNS server of one pod.
pub fn serve(
    shared: &DnsShared,
    pod: &Arc<PodCtx>,
    udp: UdpSocket,
    tcp: TcpListener,
) -> Vec<AbortHandle> {
    let net = pod.net.clone();
    let factory: crate::dns::server::ForwardSocketFactory =
        Arc::new(move |upstream: SocketAddr| {
            let any = if upstream.is_ipv4() {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            } else {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            };
            net.udp_socket(SocketAddr::new(any, 0), false)
                .map_err(std::io::Error::other)
        });
    let server = DnsServer::new(shared.table.clone(), shared.upstreams.clone(), factory)
        .with_accept_errors(shared.accept_errors.clone())
        .with_tcp_limits(shared.tcp.clone())
        .with_stats(shared.stats.clone());
    vec![tokio::spawn(server.run(udp, tcp)).abort_handle()]
}
