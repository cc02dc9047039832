//! The in-process data-plane world of `tests/direct.rs` (STYLE.md §6.6 "whole daemon in-process",
//! §9 lesson 2): one daemon's data plane (`aether::proxy`) over a model compiled from a small
//! registry, with every pod on a 127/8 address of its own, so that nothing needs root or a
//! network namespace.
//!
//! - Each world takes a block `127.<a>.<b>.0/24` no other world of this process (or, by the
//!   process id in `<a>`, of another run) uses, so that worlds run in parallel with the fixed
//!   hop port 18008.
//! - The registry ([`MANIFESTS`]) is written to a temporary directory with the block's addresses
//!   as pod IPs and loaded like the daemon loads it (`registry::file::load_dir`, then the
//!   registrar's generated Services), then compiled.
//! - Pods get [`SocketFactory::Loopback`]: plain sockets on their own address. The client's
//!   capture listeners each stand for one dialled address (a ClusterIP and port).
//! - Identities come from a fresh CA (`Ca::generate`), as the daemon's own.
//! - Applications are `aether_lab::workload::echo` listeners on their pod's address.
#![allow(dead_code)] // Each test uses part of the world.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use aether::identity::{Ca, Identities, IdentitySettings};
use aether::model::snapshot::Snapshot;
use aether::model::{NodeContext, compile, registrar};
use aether::node::tls::IdentityTls;
use aether::proxy::socket::{LoopbackNet, SocketFactory};
use aether::proxy::{HOP_PORT, Inputs, PodCtx, ProxySettings, Stats};
use aether::resolve::decision::CaptureMode;
use aether::state::ModelHandle;
use aether_lab::workload::echo::{Echo, EchoOptions, ListenerKind};
use tokio::net::TcpListener;

/// The mesh domain of the world (the default).
pub(crate) const MESH: &str = "aether.internal";

/// Host octet of each pod in the world's block.
pub(crate) const CLIENT: u8 = 1;
/// `mp-multi-0`: 8080 and 9090 HTTP, the echo on both.
pub(crate) const MULTI: u8 = 2;
/// `mp-locked-0`: 8080 HTTP, a service-level rbac that allows only `mp-other/nobody`.
pub(crate) const LOCKED: u8 = 3;
/// `mp-slow-0`: 9191 HTTP, the echo's authz listener (answers a check after `x-authz-delay-ms`).
pub(crate) const SLOW: u8 = 4;
/// `mp-guarded-0`: 8080 HTTP, the echo; its Service has a service-level `ext_authz` whose server
/// is mp-slow's authz listener (a check is denied when the request carries `x-authz-deny`), and
/// an HTTPRoute whose rule `/via-multi` sends its requests to mp-multi:8080 (so the addressed
/// Service is not the endpoint's own mesh service).
pub(crate) const GUARDED: u8 = 5;
/// `mp-pair-0`: 8080 HTTP and 9000 raw TCP, one of mp-pair's two endpoints. Not started by
/// the world: a test serves it with [`World::serve_pair`].
pub(crate) const PAIR_0: u8 = 6;
/// `mp-pair-1`: mp-pair's other endpoint, the one a test leaves dead (nothing on its hop port,
/// or a hop port that never answers a SYN).
pub(crate) const PAIR_1: u8 = 7;
/// An address outside the mesh (no pod has it): a passthrough's destination.
pub(crate) const OUTSIDE: u8 = 50;

/// The registry: `{B}` is the world's block (`127.a.b`).
const MANIFESTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: mp
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: mp-client, namespace: mp}
---
apiVersion: v1
kind: Pod
metadata: {name: mp-client, namespace: mp}
spec: {serviceAccountName: mp-client, nodeName: node-a}
status:
  podIP: {B}.1
  podIPs: [{ip: {B}.1}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: mp-multi, namespace: mp}
---
apiVersion: v1
kind: Pod
metadata:
  name: mp-multi-0
  namespace: mp
  labels: {app: mp-multi}
  annotations:
    endpoint.aether.io/port: "8080"
    endpoint.aether.io/protocol: "http"
    endpoint.aether.io/ports: "9090"
spec: {serviceAccountName: mp-multi, nodeName: node-a}
status:
  podIP: {B}.2
  podIPs: [{ip: {B}.2}]
  conditions: [{type: Ready, status: "True"}]
---
# A user Service in front of mp-multi under another name, named by no route: a dial to it is a
# passthrough that crosses the hop as bytes (model.md §12.5 item 1).
apiVersion: v1
kind: Service
metadata: {name: multi-front, namespace: mp}
spec:
  clusterIP: 10.96.100.12
  selector: {app: mp-multi}
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: mp-locked, namespace: mp}
---
apiVersion: v1
kind: Pod
metadata:
  name: mp-locked-0
  namespace: mp
  annotations:
    endpoint.aether.io/port: "8080"
    endpoint.aether.io/protocol: "http"
spec: {serviceAccountName: mp-locked, nodeName: node-a}
status:
  podIP: {B}.3
  podIPs: [{ip: {B}.3}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: aether.io/v1alpha1
kind: MeshFilter
metadata: {name: mp-locked-rbac, namespace: mp}
spec:
  targetRefs: [{group: "", kind: Service, name: mp-locked}]
  rbac:
    action: Allow
    principals: [{namespace: mp-other, serviceAccount: nobody}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: mp-slow, namespace: mp}
---
apiVersion: v1
kind: Pod
metadata:
  name: mp-slow-0
  namespace: mp
  annotations:
    endpoint.aether.io/port: "9191"
    endpoint.aether.io/protocol: "http"
spec: {serviceAccountName: mp-slow, nodeName: node-a}
status:
  podIP: {B}.4
  podIPs: [{ip: {B}.4}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: mp-guarded, namespace: mp}
---
apiVersion: v1
kind: Pod
metadata:
  name: mp-guarded-0
  namespace: mp
  annotations:
    endpoint.aether.io/port: "8080"
    endpoint.aether.io/protocol: "http"
spec: {serviceAccountName: mp-guarded, nodeName: node-a}
status:
  podIP: {B}.5
  podIPs: [{ip: {B}.5}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: aether.io/v1alpha1
kind: MeshFilter
metadata: {name: mp-guarded-ext-authz, namespace: mp}
spec:
  targetRefs: [{group: "", kind: Service, name: mp-guarded}]
  extAuthz: {server: "mp-slow.mp.aether.internal:9191", timeout: "2s"}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: mp-guarded, namespace: mp}
spec:
  parentRefs: [{group: "", kind: Service, name: mp-guarded, port: 8080}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /via-multi}}]
    backendRefs: [{group: "", kind: Service, name: mp-multi, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /}}]
    backendRefs: [{group: "", kind: Service, name: mp-guarded, port: 8080}]
---
# Two endpoints of one service, for the endpoint choice (issue #38): a test serves one and
# leaves the other dead.
apiVersion: v1
kind: ServiceAccount
metadata: {name: mp-pair, namespace: mp}
---
apiVersion: v1
kind: Pod
metadata:
  name: mp-pair-0
  namespace: mp
  annotations:
    endpoint.aether.io/port: "8080"
    endpoint.aether.io/protocol: "http"
    endpoint.aether.io/ports: "9000=tcp"
spec: {serviceAccountName: mp-pair, nodeName: node-a}
status:
  podIP: {B}.6
  podIPs: [{ip: {B}.6}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Pod
metadata:
  name: mp-pair-1
  namespace: mp
  annotations:
    endpoint.aether.io/port: "8080"
    endpoint.aether.io/protocol: "http"
    endpoint.aether.io/ports: "9000=tcp"
spec: {serviceAccountName: mp-pair, nodeName: node-a}
status:
  podIP: {B}.7
  podIPs: [{ip: {B}.7}]
  conditions: [{type: Ready, status: "True"}]
"#;

/// One daemon's data plane and its pods.
pub(crate) struct World {
    /// What every proxy task shares (the drain switch included).
    pub(crate) inputs: Arc<Inputs>,
    /// The client pod `mp/mp-client`.
    pub(crate) client: Arc<PodCtx>,
    /// The mesh's identities (its CA): a test can make any workload's certificate.
    pub(crate) identities: Arc<Identities>,
    client_net: LoopbackNet,
    /// The registry as compiled (generated Services included).
    pub(crate) snapshot: Snapshot,
    block: [u8; 3],
    loopback: SocketAddr,
}

/// A block no other world uses: this process's worlds count up the third octet; another
/// process (a second run) starts elsewhere by its id, and a block whose hop port is taken is
/// skipped.
fn block() -> [u8; 3] {
    static NEXT: AtomicU8 = AtomicU8::new(1);
    let a = u8::try_from(std::process::id() % 150).unwrap() + 100;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < 250, "too many worlds in one process");
        let probe = std::net::TcpListener::bind((Ipv4Addr::new(127, a, n, MULTI), HOP_PORT));
        if probe.is_ok() {
            return [127, a, n];
        }
    }
}

fn snapshot(block: [u8; 3]) -> Snapshot {
    let b = format!("{}.{}.{}", block[0], block[1], block[2]);
    let dir = std::env::temp_dir().join(format!("aether-direct-{}-{b}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("registry.yaml"), MANIFESTS.replace("{B}", &b)).unwrap();
    let load = aether::registry::file::load_dir(&dir).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(load.problems.is_empty(), "{:?}", load.problems);
    let mut snapshot = load.snapshot;
    registrar::complete_snapshot(&mut snapshot, "10.96.0.0/16".parse().unwrap());
    snapshot
}

/// Start an echo on `ip`; the port of its first listener (port 0 binds any free port).
fn echo(workload: &str, pod: &str, ip: Ipv4Addr, listeners: &[(ListenerKind, u16)]) -> u16 {
    let mut opts = EchoOptions::new(workload);
    for (kind, port) in listeners {
        opts = opts.with(*kind, *port);
    }
    opts.pod = pod.into();
    opts.namespace = "mp".into();
    opts.addrs = vec![IpAddr::V4(ip)];
    let echo = Echo::bind(&opts).expect("bind the echo");
    let port = echo.bound()[0].addr.port();
    tokio::spawn(echo.run());
    port
}

impl World {
    /// The world with the default settings.
    pub(crate) async fn start() -> Self {
        Self::with_settings(ProxySettings::default()).await
    }

    /// The world: model, identities, the data plane's inputs, every pod's listeners and
    /// applications. Everything is bound before this returns.
    pub(crate) async fn with_settings(settings: ProxySettings) -> Self {
        let block = block();
        let snapshot = snapshot(block);
        let model = compile(&snapshot, &NodeContext::default());
        let ca = Arc::new(Ca::generate(aether::time::wall()).unwrap());
        let identities = Arc::new(Identities::new(ca, IdentitySettings::default()).unwrap());
        let metrics = Arc::new(aether::proxy::metrics::DataPlane::default());
        metrics.rebuild(&model);
        let max_streams_per_peer = settings.max_streams_per_peer;
        let inputs = Arc::new(Inputs {
            model: Arc::new(ModelHandle::new(model)),
            tls: Arc::new(IdentityTls::new(identities.clone())),
            settings,
            pool: aether::proxy::hop::Pool::default(),
            balance: Default::default(),
            drain: tokio::sync::watch::Sender::new(false),
            stats: Stats::default(),
            metrics,
            access: aether::proxy::access::AccessLog::default(),
            overload: Arc::new(aether::proxy::overload::Overload::new(max_streams_per_peer)),
        });
        let ip = |host: u8| Ipv4Addr::new(block[0], block[1], block[2], host);
        let pod = |name: &str, sa: &str, net: &LoopbackNet| {
            Arc::new(PodCtx::new(
                "mp".into(),
                name.into(),
                sa.into(),
                SocketFactory::Loopback(net.clone()),
                CaptureMode::RedirectAll,
            ))
        };
        // Destinations: the inbound hop on <pod IP>:18008, the application on its ports.
        for (host, name, sa, listeners) in [
            (
                MULTI,
                "mp-multi-0",
                "mp-multi",
                &[(ListenerKind::Http, 8080), (ListenerKind::Http, 9090)][..],
            ),
            (
                LOCKED,
                "mp-locked-0",
                "mp-locked",
                &[(ListenerKind::Http, 8080)][..],
            ),
            (
                SLOW,
                "mp-slow-0",
                "mp-slow",
                &[(ListenerKind::Authz, 9191)][..],
            ),
            (
                GUARDED,
                "mp-guarded-0",
                "mp-guarded",
                &[(ListenerKind::Http, 8080)][..],
            ),
        ] {
            let net = LoopbackNet::new(ip(host));
            let hop = bind(&net, SocketAddr::new(IpAddr::V4(ip(host)), HOP_PORT));
            tokio::spawn(aether::proxy::inbound::serve_inbound(
                inputs.clone(),
                pod(name, sa, &net),
                hop,
            ));
            echo(sa, name, ip(host), listeners);
        }
        // The client: its loopback proxy port; capture listeners come with `capture`.
        let client_net = LoopbackNet::new(ip(CLIENT));
        let client = pod("mp-client", "mp-client", &client_net);
        let loopback_listener = bind(&client_net, SocketAddr::new(IpAddr::V4(ip(CLIENT)), 0));
        let loopback = loopback_listener.local_addr().unwrap();
        tokio::spawn(aether::proxy::outbound::serve_loopback(
            inputs.clone(),
            client.clone(),
            loopback_listener,
        ));
        Self {
            inputs,
            client,
            identities,
            client_net,
            snapshot,
            block,
            loopback,
        }
    }

    /// Serve mp-pair's pod at `host` ([`PAIR_0`] or [`PAIR_1`]): its inbound hop, and with
    /// `app` the echo on 8080 (HTTP) and 9000 (raw TCP); without, nothing listens there (its
    /// application is dead while its pod is served).
    pub(crate) fn serve_pair(&self, host: u8, app: bool) {
        let name = format!("mp-pair-{}", host - PAIR_0);
        let net = LoopbackNet::new(self.ip(host));
        let hop = bind(&net, SocketAddr::new(IpAddr::V4(self.ip(host)), HOP_PORT));
        tokio::spawn(aether::proxy::inbound::serve_inbound(
            self.inputs.clone(),
            Arc::new(PodCtx::new(
                "mp".into(),
                name.clone(),
                "mp-pair".into(),
                SocketFactory::Loopback(net),
                CaptureMode::RedirectAll,
            )),
            hop,
        ));
        if app {
            echo(
                "mp-pair",
                &name,
                self.ip(host),
                &[(ListenerKind::Http, 8080), (ListenerKind::Tcp, 9000)],
            );
        }
    }

    /// The address of pod `host` of the block.
    pub(crate) fn ip(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(self.block[0], self.block[1], self.block[2], host)
    }

    /// The ClusterIP of a Service in `mp`.
    pub(crate) fn cluster_ip(&self, service: &str) -> IpAddr {
        self.snapshot
            .services
            .iter()
            .find(|s| s.namespace == "mp" && s.name == service)
            .and_then(|s| s.cluster_ips.first().copied())
            .unwrap_or_else(|| panic!("no ClusterIP for {service}"))
    }

    /// The client pod's loopback proxy port (what `127.0.0.1:18081` is in a pod).
    pub(crate) fn loopback(&self) -> SocketAddr {
        self.loopback
    }

    /// A capture listener of the client that stands for a dial to `dialled`: connecting to the
    /// returned address is the client dialling `dialled`, captured.
    pub(crate) fn capture(&self, dialled: SocketAddr) -> SocketAddr {
        let listener = bind(
            &self.client_net,
            SocketAddr::new(IpAddr::V4(self.ip(CLIENT)), 0),
        );
        let addr = listener.local_addr().unwrap();
        self.client_net.stand_for(addr, dialled);
        tokio::spawn(aether::proxy::outbound::serve_capture(
            self.inputs.clone(),
            self.client.clone(),
            listener,
        ));
        addr
    }

    /// A capture listener standing for a dial to `service`'s ClusterIP on `port`.
    pub(crate) fn capture_service(&self, service: &str, port: u16) -> SocketAddr {
        self.capture(SocketAddr::new(self.cluster_ip(service), port))
    }

    /// Connections from the client to `dialled` (a passthrough's) really go to `to`.
    pub(crate) fn reach(&self, dialled: SocketAddr, to: SocketAddr) {
        self.client_net.reach(dialled, to);
    }

    /// An HTTP echo outside the mesh (workload `outside`) on the [`OUTSIDE`] address: what a
    /// passthrough reaches when [`World::reach`] points a dialled address at it.
    pub(crate) fn outside_echo(&self) -> SocketAddr {
        let port = echo(
            "outside",
            "outside-0",
            self.ip(OUTSIDE),
            &[(ListenerKind::Http, 0)],
        );
        SocketAddr::new(IpAddr::V4(self.ip(OUTSIDE)), port)
    }

    /// The daemon drains (SIGTERM): HTTP connections close once idle, requests in flight
    /// finish.
    pub(crate) fn drain(&self) {
        self.inputs.drain.send_replace(true);
    }
}

fn bind(net: &LoopbackNet, addr: SocketAddr) -> TcpListener {
    SocketFactory::Loopback(net.clone())
        .tcp_listener(addr, false)
        .unwrap_or_else(|e| panic!("bind {addr}: {e}"))
}
