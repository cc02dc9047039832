//! The pods of this node: which are local, their capture rules and listeners, reconciled with
//! every published model (present = desired).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use tokio::task::AbortHandle;
use tracing::{info, warn};

use crate::capture::nft;
use crate::capture::plan::{Mode, PodCapture, plan};
use crate::model::Model;
use crate::netns::Netns;
use crate::node::handoff::{Inherited, ListenerId};
use crate::proxy::socket::{PodNet, SocketFactory};
use crate::proxy::{CAPTURE_PORT, HOP_PORT, Inputs, LEGACY_PORT, PROXY_PORT, PodCtx};
use crate::resolve::decision::CaptureMode;

/// Where mesh DNS listens inside each pod.
pub const DNS_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 53)), 53);

/// A local pod the daemon should serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    /// Its capture settings.
    pub capture: PodCapture,
    /// Its ServiceAccount.
    pub service_account: String,
    /// Its network namespace.
    pub netns: PathBuf,
}

impl Desired {
    /// Whether `other` differs from this at most in its inbound rules, so that the pod's
    /// listeners stay as they are.
    fn same_listeners(&self, other: &Self) -> bool {
        let strip = |d: &Self| {
            let mut d = d.clone();
            d.capture.inbound_refused_ports.clear();
            d.capture.inbound_trusted.clear();
            d
        };
        strip(self) == strip(other)
    }
}

/// Program a served pod's capture for `d`: its plan, with the pod's gateways trusted where
/// plaintext is refused (kubelet probes on a bridge network come from there, §12.5 item 3).
async fn program(shared: &Shared, pod: &PodCtx, d: &Desired) -> Result<(), PodError> {
    let mut spec = d.capture.clone();
    if !spec.inbound_refused_ports.is_empty()
        && let SocketFactory::Netns(net) = &pod.net
    {
        spec.inbound_trusted
            .extend(crate::capture::gateways(&net.netns, &shared.home));
    }
    nft::apply(&d.netns, &plan(&spec)).await?;
    Ok(())
}

/// What the daemon made for one pod.
#[derive(Debug)]
struct Served {
    desired: Desired,
    tasks: Vec<AbortHandle>,
    pod: Arc<PodCtx>,
    /// Its network namespace (no other pod may be served in it).
    netns: Arc<Netns>,
    /// Its listening sockets (duplicates), for a successor daemon ([`super::handoff`]).
    listeners: Vec<(ListenerId, OwnedFd)>,
}

impl Drop for Served {
    fn drop(&mut self) {
        // Only the accept loops stop; connections already accepted run to their end.
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The pods this node serves.
#[derive(Debug, Default)]
pub struct Pods {
    served: BTreeMap<(String, String), Served>,
    /// The local pods the last reconcile could not serve (or re-program), with why.
    not_served: BTreeMap<(String, String), String>,
    /// Listening sockets a predecessor daemon handed over, used instead of binding.
    inherited: Inherited,
}

/// What a CNI ADD told the daemon about a pod: its network namespace and the addresses the
/// primary CNI gave it (checked to be in that namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniPod {
    /// The pod's network namespace.
    pub netns: PathBuf,
    /// Its addresses, as the ADD named them (possibly none).
    pub ips: Vec<IpAddr>,
}

impl From<PathBuf> for CniPod {
    fn from(netns: PathBuf) -> Self {
        Self {
            netns,
            ips: Vec::new(),
        }
    }
}

/// The pods the CNI API told the daemon about, by (namespace, pod).
pub type CniPods = BTreeMap<(String, String), CniPod>;

/// The local pods a model asks for.
pub fn desired(
    model: &Model,
    node: &str,
    netns_prefix: &str,
    cni: &CniPods,
    trusted: &[ipnet::IpNet],
) -> BTreeMap<(String, String), Desired> {
    let udp = model.has_udp_routes();
    let mut out = BTreeMap::new();
    for p in model.pods() {
        if !p.managed || p.node.as_deref() != Some(node) {
            continue;
        }
        let key = (p.namespace.clone(), p.name.clone());
        let from_cni = cni.get(&key);
        let netns = match (from_cni, &p.netns) {
            (Some(c), _) => c.netns.clone(),
            // Served from the CNI ADD that names its namespace, not before (docs/node.md).
            (None, _) if p.netns_from_cni => continue,
            (None, Some(name)) if name.contains('/') => PathBuf::from(name),
            (None, Some(name)) => {
                PathBuf::from(crate::netns::NETNS_DIR).join(format!("{netns_prefix}{name}"))
            }
            (None, None) => continue,
        };
        // On Kubernetes the pod's IPs reach the API only after the ADD (kubelet reports them
        // once the sandbox is up): until then the ADD's own addresses, which the daemon checked
        // in the pod's namespace, are what it captures with, so the pod never runs uncaptured.
        let ips: &[IpAddr] = match from_cni {
            Some(c) if p.ips.is_empty() => &c.ips,
            _ => &p.ips,
        };
        let ipv4 = ips.iter().find_map(|ip| match ip {
            IpAddr::V4(v) => Some(*v),
            IpAddr::V6(_) => None,
        });
        let ipv6: Option<Ipv6Addr> = ips.iter().find_map(|ip| match ip {
            IpAddr::V6(v) => Some(*v),
            IpAddr::V4(_) => None,
        });
        if ipv4.is_none() && ipv6.is_none() {
            continue;
        }
        out.insert(
            key,
            Desired {
                capture: PodCapture {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    ipv4,
                    ipv6,
                    mode: match p.capture {
                        CaptureMode::RedirectAll => Mode::RedirectAll,
                        CaptureMode::Scoped => Mode::Scoped,
                    },
                    exclude_ports: p.exclude_outbound_ports.clone(),
                    exclude_ranges: p.exclude_outbound_ip_ranges.clone(),
                    udp,
                    inbound_refused_ports: p.inbound.refused_ports.clone(),
                    inbound_trusted: p
                        .inbound
                        .host_ips
                        .iter()
                        .map(|&ip| ipnet::IpNet::from(ip))
                        .chain(trusted.iter().copied())
                        .collect(),
                },
                service_account: p.service_account.clone(),
                netns,
            },
        );
    }
    out
}

/// Everything a pod's listeners need besides the pod.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The data plane's inputs.
    pub inputs: Arc<Inputs>,
    /// The daemon's own namespace.
    pub home: Arc<Netns>,
    /// Mesh DNS.
    pub dns: crate::node::dns::DnsShared,
    /// The control side's counters (capture programming, pods served).
    pub stats: Arc<crate::node::stats::NodeStats>,
    /// The pods not served, as last logged.
    pub not_served: Arc<parking_lot::Mutex<crate::node::NotServedLog>>,
}

/// A pod could not be served.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// Its namespace could not be opened.
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    /// Capture could not be programmed.
    #[error(transparent)]
    Capture(#[from] nft::ApplyError),
    /// A listener could not be opened.
    #[error(transparent)]
    Socket(#[from] crate::proxy::socket::SocketError),
    /// Its network namespace is another served pod's (issue #35 item 5): neither is captured or
    /// listened for in it on this pod's behalf.
    #[error("its network namespace {path} is pod {namespace}/{pod}'s")]
    NetnsTaken {
        /// The namespace's path, as this pod names it.
        path: PathBuf,
        /// The pod that is served in it.
        namespace: String,
        /// Its name.
        pod: String,
    },
}

impl Pods {
    /// Reconcile: serve every desired pod, change those whose settings changed, and remove
    /// the rules and listeners of pods that are gone. Returns the pods that failed.
    pub async fn reconcile(
        &mut self,
        shared: &Shared,
        want: BTreeMap<(String, String), Desired>,
    ) -> Vec<((String, String), PodError)> {
        let gone: Vec<_> = self
            .served
            .keys()
            .filter(|k| !want.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            if let Some(served) = self.served.remove(&key) {
                served.pod.retire();
                if let Err(e) = nft::remove(&served.desired.netns).await {
                    shared.stats.capture_programmed("remove-failed");
                    warn!(error = %e, pod = %key.1, "removing capture");
                } else {
                    shared.stats.capture_programmed("removed");
                }
                info!(namespace = %key.0, pod = %key.1, "pod no longer served");
            }
        }
        let mut failed = Vec::new();
        let mut want = want;
        // Pods that name one network namespace (the same file, or two names of one namespace):
        // none of them is served (issue #35 item 5). One could be another's document pointing at
        // its namespace; serving either would hand the namespace's capture to the wrong pod.
        let mut by_ns: BTreeMap<(u64, u64), Vec<(String, String)>> = BTreeMap::new();
        for (key, d) in &want {
            if let Ok(m) = std::fs::metadata(&d.netns) {
                use std::os::unix::fs::MetadataExt;
                by_ns
                    .entry((m.dev(), m.ino()))
                    .or_default()
                    .push(key.clone());
            }
        }
        for keys in by_ns.into_values().filter(|k| k.len() > 1) {
            for (i, key) in keys.iter().enumerate() {
                let other = &keys[if i == 0 { 1 } else { 0 }];
                if let Some(d) = want.remove(key) {
                    warn!(namespace = %key.0, pod = %key.1, netns = %d.netns.display(),
                        other = %format!("{}/{}", other.0, other.1),
                        "pod not served: another pod names its network namespace");
                    failed.push((
                        key.clone(),
                        PodError::NetnsTaken {
                            path: d.netns,
                            namespace: other.0.clone(),
                            pod: other.1.clone(),
                        },
                    ));
                }
                // A pod served before the conflict stops being served, but its capture table
                // stays: its connections then meet no listener (closed), never the network
                // uncaptured.
                if let Some(served) = self.served.remove(key) {
                    served.pod.retire();
                    info!(namespace = %key.0, pod = %key.1, "pod no longer served; its capture rules stay");
                }
            }
        }
        for (key, d) in want {
            if self.served.get(&key).is_some_and(|s| s.desired == d) {
                continue;
            }
            // Only the inbound rules changed (a service-level filter came or went, the
            // inbound mode changed): program them again, keep the listeners and connections.
            if let Some(s) = self.served.get_mut(&key)
                && s.desired.same_listeners(&d)
            {
                match program(shared, &s.pod, &d).await {
                    Ok(()) => {
                        shared.stats.capture_programmed("rules-changed");
                        info!(namespace = %key.0, pod = %key.1,
                            refused = ?d.capture.inbound_refused_ports, "inbound rules changed");
                        s.desired = d;
                    }
                    Err(e) => {
                        shared.stats.capture_programmed("failed");
                        failed.push((key, e));
                    }
                }
                continue;
            }
            // Changed settings: the pod is served again on its own listening sockets (binding
            // them anew would race the old accept loops' teardown), so no connection waiting
            // in their queues is refused.
            if let Some(mut old) = self.served.remove(&key) {
                for (id, fd) in std::mem::take(&mut old.listeners) {
                    self.inherited.insert(id, fd);
                }
            }
            let others: Vec<(&(String, String), &Netns)> = self
                .served
                .iter()
                .filter(|(k, _)| **k != key)
                .map(|(k, s)| (k, &*s.netns))
                .collect();
            let served = serve_pod(shared, &d, &mut self.inherited, &others).await;
            if served.is_ok() {
                // Sockets the new settings do not use (a UDP listener no UDPRoute needs now).
                self.inherited.drop_pod(&key.0, &key.1);
            }
            match served {
                Ok((tasks, pod, listeners, netns)) => {
                    shared.stats.capture_programmed("served");
                    info!(namespace = %key.0, pod = %key.1, netns = %d.netns.display(),
                        mode = d.capture.mode.as_str(), "pod served");
                    self.served.insert(
                        key,
                        Served {
                            desired: d,
                            tasks,
                            pod,
                            netns,
                            listeners,
                        },
                    );
                }
                Err(e) => {
                    shared.stats.capture_programmed("failed");
                    failed.push((key, e));
                }
            }
        }
        shared
            .stats
            .pods_served
            .set(i64::try_from(self.served.len()).unwrap_or(i64::MAX));
        self.not_served = failed
            .iter()
            .map(|(k, e)| (k.clone(), crate::DisplayChain(e).to_string()))
            .collect();
        failed
    }

    /// The local pods the last reconcile could not serve, with why (`aether debug pods`).
    pub fn not_served(&self) -> Vec<serde_json::Value> {
        self.not_served
            .iter()
            .map(|((ns, name), error)| {
                serde_json::json!({ "namespace": ns, "pod": name, "error": error })
            })
            .collect()
    }

    /// Serve pods on the sockets a predecessor handed over where they match (pod, kind,
    /// address), instead of binding.
    pub fn inherit(&mut self, inherited: Inherited) {
        self.inherited = inherited;
    }

    /// Sockets inherited and not used by any pod (their pods are gone): closed.
    pub fn drop_unused_inherited(&mut self) -> usize {
        let n = self.inherited.len();
        self.inherited = Inherited::default();
        n
    }

    /// Duplicates of every served pod's listening sockets, for a successor daemon.
    pub fn handoff_listeners(&self) -> Vec<(ListenerId, OwnedFd)> {
        self.served
            .values()
            .flat_map(|s| &s.listeners)
            .filter_map(|(id, fd)| Some((id.clone(), fd.try_clone().ok()?)))
            .collect()
    }

    /// Whether the pod (namespace, name) is served.
    pub fn is_served(&self, key: &(String, String)) -> bool {
        self.served.contains_key(key)
    }

    /// The served pods, for the admin endpoint.
    pub fn list(&self) -> Vec<serde_json::Value> {
        self.served
            .iter()
            .map(|((ns, name), s)| {
                serde_json::json!({
                    "namespace": ns,
                    "pod": name,
                    "netns": s.desired.netns.display().to_string(),
                    "ipv4": s.desired.capture.ipv4,
                    "ipv6": s.desired.capture.ipv6,
                    "mode": s.desired.capture.mode.as_str(),
                    "udp": s.desired.capture.udp,
                    "service_account": s.desired.service_account,
                    "listeners": s.listeners.iter().map(|(id, _)| serde_json::json!({
                        "kind": id.kind,
                        "addr": id.addr.to_string(),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect()
    }

    /// The sockets of a served pod: delegated liveness probes leave from its namespace.
    pub fn net_of(&self, namespace: &str, pod: &str) -> Option<SocketFactory> {
        self.served
            .get(&(namespace.to_owned(), pod.to_owned()))
            .map(|s| s.pod.net.clone())
    }

    /// The network namespace of a served pod.
    pub fn netns_of(&self, namespace: &str, pod: &str) -> Option<PathBuf> {
        self.served
            .get(&(namespace.to_owned(), pod.to_owned()))
            .map(|s| s.desired.netns.clone())
    }
}

/// What serving one pod made: its accept loops, its context, its listening sockets, and its
/// network namespace.
type ServedParts = (
    Vec<AbortHandle>,
    Arc<PodCtx>,
    Vec<(ListenerId, OwnedFd)>,
    Arc<Netns>,
);

/// Program one pod's capture and open its listeners (model.md §12), unless its namespace is one
/// of `others`' (the served pods'), which is refused before anything is done in it.
async fn serve_pod(
    shared: &Shared,
    d: &Desired,
    inherited: &mut Inherited,
    others: &[(&(String, String), &Netns)],
) -> Result<ServedParts, PodError> {
    // Never the daemon's or the host's own namespace, whatever the CNI ADD or the
    // `aether.io/netns` annotation says.
    let netns = Arc::new(Netns::open_pod(&d.netns, &shared.home)?);
    // Never another pod's either (issue #35 item 5): its capture table and listeners are that
    // pod's, and a second pod served in it would take them over. Compared by the namespace's
    // identity (device and inode), so two names of one namespace are one.
    if let Some(((ns, pod), _)) = others.iter().find(|(_, n)| **n == *netns) {
        return Err(PodError::NetnsTaken {
            path: d.netns.clone(),
            namespace: ns.clone(),
            pod: pod.clone(),
        });
    }
    let net_handle = netns.clone();
    let net = PodNet {
        netns,
        home: shared.home.clone(),
        ipv4: d.capture.ipv4,
        ipv6: d.capture.ipv6,
    };
    let any4 = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
    let any6 = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
    let mut sockets = Sockets {
        net: &net,
        namespace: &d.capture.namespace,
        pod: &d.capture.name,
        inherited,
        kept: Vec::new(),
    };
    let mut capture = vec![sockets.tcp("capture", SocketAddr::new(any4, CAPTURE_PORT), true)?];
    let mut loopback = vec![sockets.tcp(
        "loopback",
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), PROXY_PORT),
        false,
    )?];
    let mut hop = Vec::new();
    if let Some(v4) = d.capture.ipv4 {
        hop.push(sockets.tcp("hop", SocketAddr::new(IpAddr::V4(v4), HOP_PORT), false)?);
    }
    if let Some(v6) = d.capture.ipv6 {
        capture.push(sockets.tcp("capture", SocketAddr::new(any6, CAPTURE_PORT), true)?);
        loopback.push(sockets.tcp(
            "loopback",
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), PROXY_PORT),
            false,
        )?);
        hop.push(sockets.tcp("hop", SocketAddr::new(IpAddr::V6(v6), HOP_PORT), false)?);
    }
    // The UDP listener of each family the pod has, only while a UDPRoute exists (§12.3).
    let mut udp = Vec::new();
    if d.capture.udp {
        for (has, any) in [
            (d.capture.ipv4.is_some(), any4),
            (d.capture.ipv6.is_some(), any6),
        ] {
            if !has {
                continue;
            }
            let addr = SocketAddr::new(any, LEGACY_PORT);
            let s = sockets.udp("udp", addr, true)?;
            crate::proxy::udp::want_original_destination(&s, addr.is_ipv6()).map_err(|source| {
                crate::proxy::socket::SocketError::Io {
                    what: "IP_RECVORIGDSTADDR on",
                    addr,
                    source,
                }
            })?;
            udp.push(s);
        }
    }
    let dns_udp = sockets.udp("dns-udp", DNS_ADDR, false)?;
    let dns_tcp = sockets.tcp("dns-tcp", DNS_ADDR, false)?;
    let kept = sockets.kept;
    let pod = Arc::new(PodCtx::new(
        d.capture.namespace.clone(),
        d.capture.name.clone(),
        d.service_account.clone(),
        SocketFactory::Netns(net),
        match d.capture.mode {
            Mode::RedirectAll => CaptureMode::RedirectAll,
            Mode::Scoped => CaptureMode::Scoped,
        },
    ));
    // Listeners are open: now capture may send traffic to them.
    program(shared, &pod, d).await?;
    let inputs = &shared.inputs;
    let mut tasks = Vec::new();
    for l in capture {
        tasks.push(
            tokio::spawn(crate::proxy::outbound::serve_capture(
                inputs.clone(),
                pod.clone(),
                l,
            ))
            .abort_handle(),
        );
    }
    for l in loopback {
        tasks.push(
            tokio::spawn(crate::proxy::outbound::serve_loopback(
                inputs.clone(),
                pod.clone(),
                l,
            ))
            .abort_handle(),
        );
    }
    for l in hop {
        tasks.push(
            tokio::spawn(crate::proxy::inbound::serve_inbound(
                inputs.clone(),
                pod.clone(),
                l,
            ))
            .abort_handle(),
        );
    }
    for s in udp {
        tasks.push(
            tokio::spawn(crate::proxy::udp::serve_udp(inputs.clone(), pod.clone(), s))
                .abort_handle(),
        );
    }
    tasks.extend(crate::node::dns::serve(&shared.dns, &pod, dns_udp, dns_tcp));
    Ok((tasks, pod, kept, net_handle))
}

/// A pod's listening sockets: taken from a predecessor's handoff where one matches, bound
/// otherwise; a duplicate of each is kept for a successor.
struct Sockets<'a> {
    net: &'a PodNet,
    namespace: &'a str,
    pod: &'a str,
    inherited: &'a mut Inherited,
    kept: Vec<(ListenerId, OwnedFd)>,
}

impl Sockets<'_> {
    fn id(&self, kind: &str, addr: SocketAddr) -> ListenerId {
        ListenerId {
            namespace: self.namespace.to_owned(),
            pod: self.pod.to_owned(),
            kind: kind.to_owned(),
            addr,
        }
    }

    fn keep(&mut self, id: ListenerId, fd: BorrowedFd<'_>) {
        if let Ok(dup) = fd.try_clone_to_owned() {
            self.kept.push((id, dup));
        }
    }

    fn tcp(
        &mut self,
        kind: &str,
        addr: SocketAddr,
        transparent: bool,
    ) -> Result<tokio::net::TcpListener, crate::proxy::socket::SocketError> {
        let id = self.id(kind, addr);
        let listener = match self.inherited.take(&id) {
            Some(fd) => {
                let std = std::net::TcpListener::from(fd);
                std.set_nonblocking(true)
                    .and_then(|()| tokio::net::TcpListener::from_std(std))
                    .map_err(|source| crate::proxy::socket::SocketError::Io {
                        what: "register inherited listener",
                        addr,
                        source,
                    })?
            }
            None => self.net.tcp_listener(addr, transparent)?,
        };
        self.keep(id, listener.as_fd());
        Ok(listener)
    }

    fn udp(
        &mut self,
        kind: &str,
        addr: SocketAddr,
        transparent: bool,
    ) -> Result<tokio::net::UdpSocket, crate::proxy::socket::SocketError> {
        let id = self.id(kind, addr);
        let socket = match self.inherited.take(&id) {
            Some(fd) => {
                let std = std::net::UdpSocket::from(fd);
                std.set_nonblocking(true)
                    .and_then(|()| tokio::net::UdpSocket::from_std(std))
                    .map_err(|source| crate::proxy::socket::SocketError::Io {
                        what: "register inherited UDP socket",
                        addr,
                        source,
                    })?
            }
            None => self.net.udp_socket(addr, transparent)?,
        };
        self.keep(id, socket.as_fd());
        Ok(socket)
    }
}
