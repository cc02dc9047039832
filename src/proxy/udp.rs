//! UDP on port 18082 (addressing.md §10.2): datagrams TPROXYed to a transparent listener are
//! forwarded in plaintext to the UDPRoute's backend from the client pod's own address; replies
//! go back from `<parent address>:18082`.

use std::collections::HashMap;
use std::io::IoSliceMut;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use dashmap::DashMap;
use nix::sys::socket::{
    ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg, setsockopt, sockopt,
};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tracing::{debug, warn};

use super::{Inputs, PodCtx};
use crate::resolve::decision::UdpDecision;
use crate::resolve::resolve_udp;

/// Ask the kernel for each datagram's original destination.
pub fn want_original_destination(sock: &UdpSocket, ipv6: bool) -> std::io::Result<()> {
    if ipv6 {
        setsockopt(sock, sockopt::Ipv6OrigDstAddr, &true).map_err(std::io::Error::from)
    } else {
        setsockopt(sock, sockopt::Ipv4OrigDstAddr, &true).map_err(std::io::Error::from)
    }
}

fn recv_with_dst(
    sock: &UdpSocket,
    buf: &mut [u8],
) -> std::io::Result<(usize, SocketAddr, Option<SocketAddr>)> {
    let mut cmsg = nix::cmsg_space!(nix::libc::sockaddr_in6);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<SockaddrStorage>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::empty(),
    )
    .map_err(std::io::Error::from)?;
    let mut dst = None;
    for c in msg.cmsgs().map_err(std::io::Error::from)? {
        match c {
            ControlMessageOwned::Ipv4OrigDstAddr(a) => {
                let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                dst = Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(a.sin_port)));
            }
            ControlMessageOwned::Ipv6OrigDstAddr(a) => {
                let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
                dst = Some(SocketAddr::new(IpAddr::V6(ip), u16::from_be(a.sin6_port)));
            }
            _ => {}
        }
    }
    let src = msg
        .address
        .and_then(|a| {
            a.as_sockaddr_in()
                .map(|s| SocketAddr::new(IpAddr::V4(s.ip()), s.port()))
                .or_else(|| {
                    a.as_sockaddr_in6()
                        .map(|s| SocketAddr::new(IpAddr::V6(s.ip()), s.port()))
                })
        })
        .ok_or_else(|| std::io::Error::other("datagram without a source address"))?;
    Ok((msg.bytes, src, dst))
}

/// Serve the UDP listener of one pod.
pub async fn serve_udp(inputs: Arc<Inputs>, pod: Arc<PodCtx>, sock: UdpSocket) {
    let mut flows: HashMap<(SocketAddr, SocketAddr), Arc<UdpSocket>> = HashMap::new();
    let replies: Arc<DashMap<SocketAddr, Arc<UdpSocket>>> = Arc::default();
    let mut buf = vec![0u8; 65536];
    loop {
        let got = sock
            .async_io(Interest::READABLE, || recv_with_dst(&sock, &mut buf))
            .await;
        let (n, client, dst) = match got {
            Ok((n, client, Some(dst))) => (n, client, dst),
            Ok(_) => continue,
            Err(e) => {
                warn!(error = %e, pod = %pod.name, "udp receive failed");
                continue;
            }
        };
        flows.retain(|_, up| Arc::strong_count(up) > 1);
        if let Some(up) = flows.get(&(client, dst)) {
            let _ = up.send(&buf[..n]).await;
            continue;
        }
        let model = inputs.model.load();
        let target = match resolve_udp(&model, dst) {
            UdpDecision::Forward(t) => t,
            UdpDecision::Drop(why) | UdpDecision::NotCaptured(why) => {
                debug!(rule = why.rule, %dst, "udp datagram dropped");
                continue;
            }
        };
        if target.endpoints.is_empty() {
            continue;
        }
        let ep = &target.endpoints[fastrand::usize(..target.endpoints.len())];
        let backend = SocketAddr::new(ep.address, target.pod_port);
        let Ok(local) = pod.net.ip_for(backend) else {
            continue;
        };
        let up = match pod.net.udp_socket(SocketAddr::new(local, 0), false) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                warn!(error = %e, "udp forward socket");
                continue;
            }
        };
        if up.connect(backend).await.is_err() {
            continue;
        }
        let reply = match replies.get(&dst).map(|r| r.clone()) {
            Some(r) => r,
            None => match pod.net.udp_socket(dst, true) {
                Ok(s) => {
                    let s = Arc::new(s);
                    replies.insert(dst, s.clone());
                    s
                }
                Err(e) => {
                    warn!(error = %e, %dst, "udp reply socket");
                    continue;
                }
            },
        };
        let _ = up.send(&buf[..n]).await;
        flows.insert((client, dst), up.clone());
        let idle = inputs.settings.udp_idle;
        let pod = pod.clone();
        tokio::spawn(async move {
            let flow = async {
                let mut rbuf = vec![0u8; 65536];
                while let Ok(Ok(m)) = tokio::time::timeout(idle, up.recv(&mut rbuf)).await {
                    let _ = reply.send_to(&rbuf[..m], client).await;
                }
            };
            pod.until_retired(flow).await;
        });
    }
}
