//! UDP on port 18082 (addressing.md §10.2): datagrams TPROXYed to a transparent listener are
//! forwarded in plaintext to the UDPRoute's backend from the client pod's own address; replies
//! go back from `<parent address>:18082`.

use std::cell::RefCell;
use std::io::IoSliceMut;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use nix::sys::socket::{
    ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg, setsockopt, sockopt,
};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::time::Instant;
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

/// One flow: datagrams from one client address to one dialled address, forwarded from a
/// socket of its own (connected to the chosen backend).
#[derive(Debug)]
struct Flow {
    up: UdpSocket,
    /// Its backend pod's unit of load, while the flow lives.
    _load: super::balance::Load,
    /// The last datagram either way, in milliseconds since the listener's `epoch`.
    last: AtomicU64,
}

impl Flow {
    fn touch(&self, epoch: Instant) {
        let ms = u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }

    /// When the flow is idle if nothing else passes.
    fn idle_at(&self, epoch: Instant, idle: Duration) -> Instant {
        epoch + Duration::from_millis(self.last.load(Ordering::Relaxed)) + idle
    }
}

/// The flows of one pod's listener, by (client, dialled address).
type Flows = Arc<DashMap<(SocketAddr, SocketAddr), Arc<Flow>>>;

thread_local! {
    /// The buffer every flow of this runtime thread reads replies into: a reply is read and
    /// sent on without an await in between, so one buffer per thread serves every flow, and
    /// an idle flow holds none (issue #8, finding 10).
    static REPLY_BUF: RefCell<Vec<u8>> = RefCell::new(vec![0; 65536]);
}

/// Serve the UDP listener of one pod.
///
/// Each (client, dialled address) is a flow with a socket and a task of its own. A flow with
/// no datagram either way for `udp_idle` is closed by its own timer, releasing both; at most
/// `udp_max_flows_per_pod` are open at once, and a datagram that would open another is dropped
/// and counted, so the open flows keep working.
pub async fn serve_udp(inputs: Arc<Inputs>, pod: Arc<PodCtx>, sock: UdpSocket) {
    let flows: Flows = Arc::default();
    let replies: Arc<DashMap<SocketAddr, Arc<UdpSocket>>> = Arc::default();
    let epoch = Instant::now();
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
        if let Some(flow) = flows.get(&(client, dst)).map(|f| f.clone()) {
            flow.touch(epoch);
            if flow.up.send(&buf[..n]).await.is_ok() {
                inputs.metrics.udp_datagram(true);
            }
            continue;
        }
        if flows.len() >= inputs.settings.udp_max_flows_per_pod {
            super::count(&inputs.stats.udp_flows_refused);
            debug!(pod = %pod.name, %client, %dst, "udp flow refused: the pod has udp_max_flows_per_pod open");
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
        // The flow's backend pod is chosen by `balance` (issue #38); the flow holds its load.
        let Some(chosen) = super::balance::choose(&inputs, &target.endpoints, target.pod_port)
        else {
            continue;
        };
        let ep = &target.endpoints[chosen.index];
        let backend = SocketAddr::new(ep.address, target.pod_port);
        drop(model);
        let Ok(local) = pod.net.ip_for(backend) else {
            continue;
        };
        let up = match pod.net.udp_socket(SocketAddr::new(local, 0), false) {
            Ok(s) => s,
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
        let flow = Arc::new(Flow {
            up,
            last: AtomicU64::new(0),
            _load: chosen.load,
        });
        flow.touch(epoch);
        if flow.up.send(&buf[..n]).await.is_ok() {
            inputs.metrics.udp_datagram(true);
        }
        flows.insert((client, dst), flow.clone());
        inputs.stats.udp_flows.inc();
        let run = FlowRun {
            flows: flows.clone(),
            replies: replies.clone(),
            key: (client, dst),
            flow,
            reply,
            epoch,
            idle: inputs.settings.udp_idle,
            gauge: inputs.stats.udp_flows.clone(),
            metrics: inputs.metrics.clone(),
        };
        let pod = pod.clone();
        tokio::spawn(async move { pod.clone().until_retired(Box::pin(run.relay())).await });
    }
}

/// One flow's task: relays replies until the flow is idle, then removes it.
struct FlowRun {
    flows: Flows,
    replies: Arc<DashMap<SocketAddr, Arc<UdpSocket>>>,
    key: (SocketAddr, SocketAddr),
    flow: Arc<Flow>,
    reply: Arc<UdpSocket>,
    epoch: Instant,
    idle: Duration,
    gauge: super::Gauge,
    metrics: Arc<super::metrics::DataPlane>,
}

impl FlowRun {
    async fn relay(self) {
        let client = self.key.0;
        loop {
            let idle_at = self.flow.idle_at(self.epoch, self.idle);
            tokio::select! {
                ready = self.flow.up.readable() => {
                    if ready.is_err() {
                        return;
                    }
                    // Read and send on in one step: the thread's buffer is never held across
                    // an await. A reply the client's socket cannot take now is dropped, as UDP
                    // may.
                    let sent = REPLY_BUF.with_borrow_mut(|buf| {
                        let n = self.flow.up.try_recv(buf)?;
                        self.reply.try_send_to(&buf[..n], client)
                    });
                    match sent {
                        Ok(_) => {
                            self.flow.touch(self.epoch);
                            self.metrics.udp_datagram(false);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => debug!(error = %e, %client, "udp reply not relayed"),
                    }
                }
                () = tokio::time::sleep_until(idle_at) => {
                    // A datagram from the client may have moved the deadline meanwhile.
                    if Instant::now() >= self.flow.idle_at(self.epoch, self.idle) {
                        return;
                    }
                }
            }
        }
    }
}

impl Drop for FlowRun {
    /// However the task ends (idle, retired pod, aborted), the flow is forgotten: its socket is
    /// closed with the last reference, and the reply socket too when no other flow uses it.
    fn drop(&mut self) {
        self.flows
            .remove_if(&self.key, |_, f| Arc::ptr_eq(f, &self.flow));
        self.gauge.dec();
        let dst = self.key.1;
        // This task's own reference, plus the map's: nobody else uses it.
        self.replies.remove_if(&dst, |_, r| {
            Arc::ptr_eq(r, &self.reply) && Arc::strong_count(r) <= 2
        });
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, UdpSocket as StdUdpSocket};
    use std::time::Duration;

    use tokio::sync::watch;

    use super::*;
    use crate::model::{NodeContext, compile, registrar};
    use crate::proxy::socket::{LoopbackNet, SocketFactory};
    use crate::proxy::{HopTls, Peer, ProxySettings, Stats, hop::Pool};
    use crate::resolve::decision::CaptureMode;
    use crate::state::ModelHandle;

    #[derive(Debug)]
    struct NoTls;

    impl HopTls for NoTls {
        fn client(&self, _: &str, _: &str, _: &[u8]) -> Arc<rustls::ClientConfig> {
            unreachable!("UDP opens no hop")
        }
        fn server(&self, _: &str, _: &str) -> Option<Arc<rustls::ServerConfig>> {
            None
        }
        fn peer(&self, _: &[rustls::pki_types::CertificateDer<'_>]) -> Option<Peer> {
            None
        }
    }

    /// A registry whose UDP service `mp-udp` (5353/udp on pod `.2`) is the parent and backend
    /// of a UDPRoute; `{B}` is the test's own `127.a.b` block, the ClusterIPs come from the
    /// next block.
    const MANIFESTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: mp}
---
apiVersion: v1
kind: Pod
metadata: {name: mp-client, namespace: mp}
spec: {serviceAccountName: mp-client, nodeName: node-a}
status: {podIP: "{B}.1"}
---
apiVersion: v1
kind: Pod
metadata:
  name: mp-udp-0
  namespace: mp
  annotations: {endpoint.aether.io/port: "5353", endpoint.aether.io/protocol: udp}
spec: {serviceAccountName: mp-udp, nodeName: node-a}
status: {podIP: "{B}.2"}
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: UDPRoute
metadata: {name: mp-udp, namespace: mp}
spec:
  parentRefs: [{group: "", kind: Service, name: mp-udp}]
  rules: [{backendRefs: [{group: "", kind: Service, name: mp-udp, port: 5353}]}]
"#;

    /// One client pod's UDP listener on 18082 serving flows to the `mp-udp` backend.
    struct Udp {
        inputs: Arc<Inputs>,
        /// The UDPRoute's parent address, where the listener is bound.
        vip: SocketAddr,
        /// The backend application: every datagram it gets, with its source.
        backend: StdUdpSocket,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Udp {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    fn block() -> (u8, u8) {
        (fastrand::u8(20..250), fastrand::u8(0..254))
    }

    async fn start(settings: ProxySettings) -> Udp {
        let (a, b) = block();
        let base = format!("127.{a}.{b}");
        let dir = std::env::temp_dir().join(format!("aether-udp-{}-{a}-{b}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("r.yaml"), MANIFESTS.replace("{B}", &base)).unwrap();
        let mut snapshot = crate::registry::file::load_dir(&dir).unwrap().snapshot;
        std::fs::remove_dir_all(&dir).unwrap();
        let cidr = format!("127.{a}.{}.0/24", b + 1).parse().unwrap();
        registrar::complete_snapshot(&mut snapshot, cidr);
        let ctx = NodeContext {
            node: Some("node-a".into()),
            ..NodeContext::default()
        };
        let vip_ip = snapshot
            .services
            .iter()
            .find(|s| s.name == "mp-udp")
            .unwrap()
            .cluster_ips[0];
        let vip = SocketAddr::new(vip_ip, super::super::LEGACY_PORT);
        let backend = StdUdpSocket::bind(format!("{base}.2:5353")).unwrap();
        backend
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let inputs = Arc::new(Inputs {
            model: Arc::new(ModelHandle::new(compile(&snapshot, &ctx))),
            tls: Arc::new(NoTls),
            settings,
            pool: Pool::default(),
            balance: Default::default(),
            drain: watch::Sender::new(false),
            stats: Stats::default(),
            metrics: Arc::default(),
            access: crate::proxy::access::AccessLog::default(),
            overload: Arc::default(),
        });
        let ip: Ipv4Addr = format!("{base}.1").parse().unwrap();
        let net = LoopbackNet::new(ip);
        // Replies leave from the dialled address; here that is the listener's own, so the
        // reply socket binds another address of the block.
        net.reach(vip, format!("{base}.9:18082").parse().unwrap());
        let pod = Arc::new(PodCtx::new(
            "mp".into(),
            "mp-client".into(),
            "mp-client".into(),
            SocketFactory::Loopback(net),
            CaptureMode::RedirectAll,
        ));
        let listener = UdpSocket::bind(vip).await.unwrap();
        want_original_destination(&listener, false).unwrap();
        let task = tokio::spawn(serve_udp(inputs.clone(), pod, listener));
        Udp {
            inputs,
            vip,
            backend,
            task,
        }
    }

    fn client() -> StdUdpSocket {
        let c = StdUdpSocket::bind("127.0.0.1:0").unwrap();
        c.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        c
    }

    /// The next datagram the backend got, and its source: `None` when nothing came.
    async fn at_backend(u: &Udp) -> Option<(String, SocketAddr)> {
        let b = u.backend.try_clone().unwrap();
        tokio::task::spawn_blocking(move || {
            let mut buf = [0u8; 64];
            let (n, from) = b.recv_from(&mut buf).ok()?;
            Some((String::from_utf8_lossy(&buf[..n]).into_owned(), from))
        })
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn an_idle_flow_releases_its_socket_without_another_datagram() {
        let u = start(ProxySettings {
            udp_idle: Duration::from_millis(200),
            ..ProxySettings::default()
        })
        .await;
        let c = client();
        c.send_to(b"ping", u.vip).unwrap();
        let (got, flow) = at_backend(&u)
            .await
            .expect("the datagram reached the backend");
        assert_eq!(got, "ping");
        // The reply goes back to the client, from the dialled address's stand-in.
        u.backend.send_to(b"pong", flow).unwrap();
        let mut buf = [0u8; 16];
        let c2 = c.try_clone().unwrap();
        let (n, _) = tokio::task::spawn_blocking(move || c2.recv_from(&mut buf))
            .await
            .unwrap()
            .expect("the reply reached the client");
        assert_eq!(n, 4);
        // No datagram either way: the flow closes on its own timer, and its socket is free.
        let deadline = crate::time::now() + Duration::from_secs(5);
        let released = loop {
            if StdUdpSocket::bind(flow).is_ok() {
                break true;
            }
            if crate::time::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            released,
            "the idle flow's socket {flow} is still open 5 s after udp_idle (200 ms)"
        );
        assert_eq!(u.inputs.stats.udp_flows.get(), 0);
    }

    #[tokio::test]
    async fn a_pod_over_its_flow_cap_drops_new_flows_and_keeps_the_open_ones() {
        let u = start(ProxySettings {
            udp_max_flows_per_pod: 2,
            ..ProxySettings::default()
        })
        .await;
        let (c1, c2, c3) = (client(), client(), client());
        c1.send_to(b"c1-a", u.vip).unwrap();
        assert_eq!(at_backend(&u).await.map(|g| g.0).as_deref(), Some("c1-a"));
        c2.send_to(b"c2-a", u.vip).unwrap();
        assert_eq!(at_backend(&u).await.map(|g| g.0).as_deref(), Some("c2-a"));
        // A third flow: over the cap, dropped and counted.
        c3.send_to(b"c3-a", u.vip).unwrap();
        // The open flows keep working.
        c1.send_to(b"c1-b", u.vip).unwrap();
        assert_eq!(
            at_backend(&u).await.map(|g| g.0).as_deref(),
            Some("c1-b"),
            "a flow over udp_max_flows_per_pod (2) was forwarded"
        );
        assert_eq!(u.inputs.stats.udp_flows_refused.get(), 1);
        assert_eq!(u.inputs.stats.udp_flows.get(), 2);
    }
}
