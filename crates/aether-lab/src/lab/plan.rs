//! The lab's plan: which namespaces, links, addresses, routes, processes and kube-proxy rules a
//! manifest directory calls for, as plain data.
//!
//! Pure: no IO, no clock. [`LabPlan::from_snapshot`] reads a completed [`Snapshot`] (the
//! registrar's generated Services included) and the pods' environment ([`PodEnv`]); the IO side
//! ([`crate::lab::run`]) carries the plan out.
//!
//! The shape, per node `<n>` (every distinct `spec.nodeName` of a pod with an IP):
//! - a namespace `<prefix>-<n>` with IP forwarding on, a bridge [`NODE_BRIDGE`] holding `.1` of
//!   the node's pod /24, and a veth [`NODE_UNDERLAY_IF`] into the shared underlay bridge (in the
//!   namespace `<prefix>-underlay`) with an address in [`UNDERLAY_SUBNET`], plus a route for
//!   every other node's pod /24 via that node's underlay address;
//! - per pod, a namespace named by its `aether.io/netns` annotation, a veth whose pod end is
//!   `eth0` (the pod IP with a /24 mask but no on-link subnet route, so every packet, to a pod of
//!   the same node too, is routed by the node and passes its kube-proxy rules and conntrack);
//! - the same kube-proxy stand-in ruleset in every node namespace: a user Service's ClusterIP
//!   ports are DNATed to the Ready pods its EndpointSlices list; a generated Service gets no rule;
//!   a pod that reaches its own Service and is chosen as the endpoint (hairpin) is masqueraded to
//!   the node's bridge address, and every pod's bridge port is in hairpin mode (see
//!   [`LabPlan::render_kube_proxy`] and [`crate::lab::run`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;

use ipnet::Ipv4Net;

use aether_core::model::Snapshot;
use aether_core::model::port::Transport;
use aether_core::model::snapshot::{Pod, Service, ServicePort, TargetPort};

use render::proto_word;

/// The default prefix of the lab's own namespaces.
pub const DEFAULT_PREFIX: &str = "aen";
/// The bridge of a node namespace that its pods' veths join.
pub const NODE_BRIDGE: &str = "br0";
/// The node namespace's end of its link into the underlay.
pub const NODE_UNDERLAY_IF: &str = "ul0";
/// The bridge in the underlay namespace that links the nodes.
pub const UNDERLAY_BRIDGE: &str = "ul0";
/// The pod end of a pod's veth.
pub const POD_IF: &str = "eth0";
/// The addresses of the nodes on the underlay: node `i` (sorted by name) gets `.(i + 1)`.
pub const UNDERLAY_SUBNET: &str = "192.168.244.0/24";
/// The lab's API server on the underlay (`aether lab-apiserver`, Kubernetes-source runs): the
/// last address of [`UNDERLAY_SUBNET`], which no node gets (at most 253 nodes).
pub const APISERVER_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 244, 254);
/// The lab's API server's port.
pub const APISERVER_PORT: u16 = 6443;
/// The namespace the daemons run in on the Kubernetes source (`AETHER_RELEASE_NAMESPACE`):
/// the registrar's Lease is there.
pub const RELEASE_NAMESPACE: &str = "aether-system";
/// Where the daemon serves mesh DNS inside each managed pod.
pub const MESH_DNS: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 53);
/// The argv\[0\] that [`LabOptions::binary`] replaces.
pub const AETHER_ARGV0: &str = "aether";
/// The packet-mark bit with which the kube-proxy stand-in marks hairpin traffic for masquerade
/// (kube-proxy's default, `--masquerade-bit=14`). It is set and cleared in the node namespaces
/// only, and shares no bit with the daemon's [`aether_core::marks`].
pub const MASQUERADE_MARK: u32 = 0x4000;
/// Linux's limit on an interface name, in bytes.
pub const IFNAME_MAX: usize = 15;

/// What the plan is built with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabOptions {
    /// The prefix of the node and underlay namespaces and of the nftables table.
    pub prefix: String,
    /// Prepended to every pod's netns annotation. Empty for a lab that runs daemons (a daemon
    /// opens the namespace its registry names); tests without daemons use it to stay apart.
    pub pod_netns_prefix: String,
    /// The binary that replaces an argv\[0\] of `aether`.
    pub binary: PathBuf,
    /// The cluster domain of the pods' DNS search list.
    pub cluster_domain: String,
}

impl Default for LabOptions {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
            pod_netns_prefix: String::new(),
            binary: PathBuf::from(AETHER_ARGV0),
            cluster_domain: "cluster.local".to_owned(),
        }
    }
}

/// One environment variable of a pod's container, as the manifest writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvValue {
    /// `value`.
    Literal(String),
    /// `valueFrom.fieldRef.fieldPath`.
    FieldRef(String),
}

/// The first container's `env` of every pod, keyed by (namespace, pod name). A pod missing here
/// gets `POD_NAME` and `POD_NAMESPACE` (the fixture's downward-API pair).
pub type PodEnv = BTreeMap<(String, String), Vec<(String, EnvValue)>>;

/// The plan of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePlan {
    /// `spec.nodeName`.
    pub name: String,
    /// Its network namespace, `<prefix>-<name>`.
    pub netns: String,
    /// The pods' /24.
    pub pod_subnet: Ipv4Net,
    /// `.1` of the pods' /24, on [`NODE_BRIDGE`]: every pod's gateway.
    pub bridge_addr: Ipv4Addr,
    /// Its address on the underlay ([`NODE_UNDERLAY_IF`]).
    pub underlay_addr: Ipv4Addr,
    /// The underlay end of its link (in the underlay namespace, on [`UNDERLAY_BRIDGE`]).
    pub underlay_peer: String,
    /// Every other node's pod /24 and that node's underlay address.
    pub routes: Vec<(Ipv4Net, Ipv4Addr)>,
}

/// The plan of one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodPlan {
    /// Its Kubernetes namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its node.
    pub node: String,
    /// Its network namespace: the annotation, after [`LabOptions::pod_netns_prefix`].
    pub netns: String,
    /// The pod IP (the mask is /24).
    pub ip: Ipv4Addr,
    /// Its default gateway: the node's bridge address.
    pub gateway: Ipv4Addr,
    /// The node end of its veth (≤ 15 bytes, unique in the node namespace).
    pub host_if: String,
    /// The command, argv\[0\] `aether` replaced; empty when the manifest gives none.
    pub argv: Vec<String>,
    /// Its environment, fieldRefs resolved.
    pub env: Vec<(String, String)>,
    /// The text of its `/etc/netns/<netns>/resolv.conf`.
    pub resolv_conf: String,
    /// The file name of its log under `<run>/logs`.
    pub log_name: String,
    /// Managed by the mesh (`aether.io/managed` is not `"false"`).
    pub managed: bool,
    /// Its `Ready` condition.
    pub ready: bool,
}

/// One kube-proxy rule: a user Service's front port and the endpoints it is DNATed to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRule {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// Its IPv4 ClusterIP.
    pub cluster_ip: Ipv4Addr,
    /// The front port.
    pub port: u16,
    /// TCP or UDP.
    pub transport: Transport,
    /// Ready endpoints, sorted; empty means the rule is left out (nothing to translate to).
    pub endpoints: Vec<SocketAddrV4>,
}

/// Everything the lab creates, in the order it creates it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabPlan {
    /// The prefix of the lab's own names.
    pub prefix: String,
    /// The underlay namespace, `<prefix>-underlay`.
    pub underlay_netns: String,
    /// The nodes, sorted by name.
    pub nodes: Vec<NodePlan>,
    /// The pods, sorted by (node, namespace, name).
    pub pods: Vec<PodPlan>,
    /// The kube-proxy rules, sorted by (namespace, name, transport, port).
    pub services: Vec<ServiceRule>,
    /// Pods of the snapshot that are not part of the lab (no node or no IP): (namespace, name).
    pub left_out: Vec<(String, String)>,
    /// The binary that replaced argv\[0\] `aether`.
    pub binary: PathBuf,
}

/// Why a snapshot cannot become a lab.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidLab {
    /// A pod with a node and an IP has no `aether.io/netns` annotation.
    #[error(
        "pod {namespace}/{pod} has no aether.io/netns annotation: the lab cannot know its network namespace"
    )]
    MissingNetns {
        /// The pod's namespace.
        namespace: String,
        /// The pod.
        pod: String,
    },
    /// Two pods name the same network namespace.
    #[error("pods {first} and {second} both name the network namespace {netns}")]
    SharedNetns {
        /// The namespace.
        netns: String,
        /// The first pod, `<ns>/<name>`.
        first: String,
        /// The second pod.
        second: String,
    },
    /// A pod's IP is IPv6 (the lab is IPv4 only).
    #[error(
        "pod {namespace}/{pod} has the IPv6 address {ip}: the lab builds IPv4 pod networks only"
    )]
    Ipv6PodIp {
        /// The pod's namespace.
        namespace: String,
        /// The pod.
        pod: String,
        /// The address.
        ip: IpAddr,
    },
    /// A node's pods are in more than one /24.
    #[error("the pods of node {node} span {first} and {second}: a node's pods must share one /24")]
    NodeSpansSubnets {
        /// The node.
        node: String,
        /// One /24.
        first: Ipv4Net,
        /// Another.
        second: Ipv4Net,
    },
    /// Two nodes' pods are in the same /24.
    #[error("nodes {first} and {second} both hold pods of {subnet}: each node needs its own /24")]
    SharedSubnet {
        /// The /24.
        subnet: Ipv4Net,
        /// One node.
        first: String,
        /// The other.
        second: String,
    },
    /// A pod uses `.1` of its /24, which is its node's bridge.
    #[error(
        "pod {namespace}/{pod} has the address {ip}, which the lab gives to node {node}'s bridge"
    )]
    GatewayAddress {
        /// The pod's namespace.
        namespace: String,
        /// The pod.
        pod: String,
        /// The address.
        ip: Ipv4Addr,
        /// The node.
        node: String,
    },
    /// More nodes than the underlay has addresses.
    #[error(
        "{0} nodes: the underlay {UNDERLAY_SUBNET} has room for 253 (.254 is the lab's API server)"
    )]
    TooManyNodes(usize),
    /// A `fieldRef` the lab cannot resolve.
    #[error(
        "pod {namespace}/{pod}: env {var} refers to {field_path}, which the lab does not resolve"
    )]
    UnsupportedFieldRef {
        /// The pod's namespace.
        namespace: String,
        /// The pod.
        pod: String,
        /// The variable.
        var: String,
        /// The field path.
        field_path: String,
    },
    /// A name the lab would give a namespace is not a plain file name.
    #[error(
        "{what} {name:?} cannot name a network namespace: use letters, digits, '.', '_' and '-', not first"
    )]
    BadName {
        /// Where the name comes from.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// No pod has a node and an IP.
    #[error("no pod has both spec.nodeName and an IP: there is nothing to build")]
    NoPods,
}

/// Whether `name` can name a network namespace here: a plain file name of letters, digits, `.`,
/// `_` and `-`, not starting with `.` or `-`, at most 200 bytes. `ip` takes such a name as one
/// word, and it never reaches outside `/var/run/netns` or `/etc/netns`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn check_name(what: &'static str, name: &str) -> Result<(), InvalidLab> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(InvalidLab::BadName {
            what,
            name: name.to_owned(),
        })
    }
}

fn subnet_of(ip: Ipv4Addr) -> Ipv4Net {
    // A /24 is always a valid prefix length.
    Ipv4Net::new(ip, 24).map_or_else(|_| Ipv4Net::default(), |n| n.trunc())
}

fn first_host(net: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(net.network()) + 1)
}

/// A name cut to at most `max` bytes (names here are ASCII: Kubernetes names are DNS labels).
fn cut(name: &str, max: usize) -> String {
    name.chars().take(max).collect()
}

pub(super) fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

impl LabPlan {
    /// The plan for `snapshot`, with the default environment (`POD_NAME`, `POD_NAMESPACE`).
    pub fn from_snapshot(snapshot: &Snapshot, opts: &LabOptions) -> Result<Self, InvalidLab> {
        Self::from_snapshot_with_env(snapshot, &PodEnv::new(), opts)
    }

    /// The plan for `snapshot`, each pod's environment taken from `env` (see [`PodEnv`]).
    pub fn from_snapshot_with_env(
        snapshot: &Snapshot,
        env: &PodEnv,
        opts: &LabOptions,
    ) -> Result<Self, InvalidLab> {
        check_name("the prefix", &opts.prefix)?;
        let mut placed: Vec<(&Pod, &str, Ipv4Addr)> = Vec::new();
        let mut left_out = Vec::new();
        for pod in &snapshot.pods {
            let (Some(node), Some(&ip)) = (pod.node.as_deref(), pod.ips.first()) else {
                left_out.push((pod.namespace.clone(), pod.name.clone()));
                continue;
            };
            let ip = match ip {
                IpAddr::V4(v4) => v4,
                IpAddr::V6(_) => {
                    return Err(InvalidLab::Ipv6PodIp {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        ip,
                    });
                }
            };
            placed.push((pod, node, ip));
        }
        if placed.is_empty() {
            return Err(InvalidLab::NoPods);
        }
        placed.sort_by(|a, b| {
            (a.1, &a.0.namespace, &a.0.name).cmp(&(b.1, &b.0.namespace, &b.0.name))
        });
        left_out.sort();

        let nodes = plan_nodes(&placed, opts)?;
        let pods = plan_pods(&placed, &nodes, env, opts)?;
        let services = plan_services(snapshot);
        Ok(Self {
            prefix: opts.prefix.clone(),
            underlay_netns: format!("{}-underlay", opts.prefix),
            nodes,
            pods,
            services,
            left_out,
            binary: opts.binary.clone(),
        })
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&NodePlan> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The pod `namespace/name`.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodPlan> {
        self.pods
            .iter()
            .find(|p| p.namespace == namespace && p.name == name)
    }
}

fn plan_nodes(
    placed: &[(&Pod, &str, Ipv4Addr)],
    opts: &LabOptions,
) -> Result<Vec<NodePlan>, InvalidLab> {
    let mut subnets: BTreeMap<&str, Ipv4Net> = BTreeMap::new();
    for (_, node, ip) in placed {
        let net = subnet_of(*ip);
        match subnets.get(node) {
            Some(&first) if first != net => {
                return Err(InvalidLab::NodeSpansSubnets {
                    node: (*node).to_owned(),
                    first,
                    second: net,
                });
            }
            Some(_) => {}
            None => {
                subnets.insert(node, net);
            }
        }
    }
    let mut owner: BTreeMap<Ipv4Net, &str> = BTreeMap::new();
    for (node, net) in &subnets {
        if let Some(first) = owner.insert(*net, node) {
            return Err(InvalidLab::SharedSubnet {
                subnet: *net,
                first: first.to_owned(),
                second: (*node).to_owned(),
            });
        }
    }
    if subnets.len() > 253 {
        return Err(InvalidLab::TooManyNodes(subnets.len()));
    }
    let underlay: Ipv4Net = UNDERLAY_SUBNET.parse().unwrap_or_default();
    let underlay_addr = |i: usize| Ipv4Addr::from(u32::from(underlay.network()) + 1 + i as u32);
    let all: Vec<(&str, Ipv4Net, Ipv4Addr)> = subnets
        .iter()
        .enumerate()
        .map(|(i, (node, net))| (*node, *net, underlay_addr(i)))
        .collect();
    for (node, _, _) in &all {
        check_name("the node name", &format!("{}-{node}", opts.prefix))?;
    }
    Ok(all
        .iter()
        .enumerate()
        .map(|(i, (node, net, addr))| NodePlan {
            name: (*node).to_owned(),
            netns: format!("{}-{node}", opts.prefix),
            pod_subnet: *net,
            bridge_addr: first_host(*net),
            underlay_addr: *addr,
            underlay_peer: cut(&format!("n{i}-{node}"), IFNAME_MAX),
            routes: all
                .iter()
                .filter(|(other, _, _)| other != node)
                .map(|(_, net, addr)| (*net, *addr))
                .collect(),
        })
        .collect())
}

fn plan_pods(
    placed: &[(&Pod, &str, Ipv4Addr)],
    nodes: &[NodePlan],
    env: &PodEnv,
    opts: &LabOptions,
) -> Result<Vec<PodPlan>, InvalidLab> {
    let mut netns_owner: BTreeMap<String, String> = BTreeMap::new();
    let mut name_count: BTreeMap<&str, usize> = BTreeMap::new();
    for (pod, _, _) in placed {
        *name_count.entry(pod.name.as_str()).or_default() += 1;
    }
    let mut out = Vec::with_capacity(placed.len());
    for (i, (pod, node, ip)) in placed.iter().enumerate() {
        let Some(annotation) = pod.netns.as_deref().filter(|n| !n.is_empty()) else {
            return Err(InvalidLab::MissingNetns {
                namespace: pod.namespace.clone(),
                pod: pod.name.clone(),
            });
        };
        let netns = format!("{}{annotation}", opts.pod_netns_prefix);
        check_name("the pod's netns annotation", &netns)?;
        let me = key(&pod.namespace, &pod.name);
        if let Some(first) = netns_owner.insert(netns.clone(), me.clone()) {
            return Err(InvalidLab::SharedNetns {
                netns,
                first,
                second: me,
            });
        }
        // Every placed pod's node has a plan: plan_nodes made one per node of `placed`.
        let Some(node_plan) = nodes.iter().find(|n| n.name == *node) else {
            continue;
        };
        if *ip == node_plan.bridge_addr {
            return Err(InvalidLab::GatewayAddress {
                namespace: pod.namespace.clone(),
                pod: pod.name.clone(),
                ip: *ip,
                node: (*node).to_owned(),
            });
        }
        let argv = pod
            .command
            .iter()
            .enumerate()
            .map(|(j, a)| {
                if j == 0 && a == AETHER_ARGV0 {
                    opts.binary.display().to_string()
                } else {
                    a.clone()
                }
            })
            .collect();
        let log_name = if name_count.get(pod.name.as_str()).copied().unwrap_or(0) > 1 {
            format!("{}.{}.log", pod.namespace, pod.name)
        } else {
            format!("{}.log", pod.name)
        };
        out.push(PodPlan {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            node: (*node).to_owned(),
            netns,
            ip: *ip,
            gateway: node_plan.bridge_addr,
            host_if: cut(&format!("v{i}-{}", pod.name), IFNAME_MAX),
            argv,
            env: resolve_env(pod, node, *ip, env)?,
            resolv_conf: render_resolv_conf(&pod.namespace, &opts.cluster_domain),
            log_name,
            managed: pod.managed,
            ready: pod.ready,
        });
    }
    Ok(out)
}

fn resolve_env(
    pod: &Pod,
    node: &str,
    ip: Ipv4Addr,
    env: &PodEnv,
) -> Result<Vec<(String, String)>, InvalidLab> {
    let default = [
        (
            "POD_NAME".to_owned(),
            EnvValue::FieldRef("metadata.name".to_owned()),
        ),
        (
            "POD_NAMESPACE".to_owned(),
            EnvValue::FieldRef("metadata.namespace".to_owned()),
        ),
    ];
    let vars = env
        .get(&(pod.namespace.clone(), pod.name.clone()))
        .map_or(&default[..], Vec::as_slice);
    vars.iter()
        .map(|(name, value)| {
            let v = match value {
                EnvValue::Literal(v) => v.clone(),
                EnvValue::FieldRef(path) => match path.as_str() {
                    "metadata.name" => pod.name.clone(),
                    "metadata.namespace" => pod.namespace.clone(),
                    "spec.nodeName" => node.to_owned(),
                    "spec.serviceAccountName" => pod.service_account.clone(),
                    "status.podIP" => ip.to_string(),
                    _ => {
                        return Err(InvalidLab::UnsupportedFieldRef {
                            namespace: pod.namespace.clone(),
                            pod: pod.name.clone(),
                            var: name.clone(),
                            field_path: path.clone(),
                        });
                    }
                },
            };
            Ok((name.clone(), v))
        })
        .collect()
}

/// The resolv.conf of a pod in `namespace`: the daemon's mesh DNS, the cluster's search list.
pub fn render_resolv_conf(namespace: &str, cluster_domain: &str) -> String {
    format!(
        "nameserver {MESH_DNS}\nsearch {namespace}.svc.{cluster_domain} svc.{cluster_domain} {cluster_domain}\noptions ndots:5\n"
    )
}

fn plan_services(snapshot: &Snapshot) -> Vec<ServiceRule> {
    let mut out = Vec::new();
    for svc in &snapshot.services {
        if svc.generated || svc.headless || svc.selector.is_none() {
            continue;
        }
        let Some(cluster_ip) = svc.cluster_ips.iter().find_map(|ip| match ip {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        }) else {
            continue;
        };
        for port in &svc.ports {
            if !matches!(port.transport, Transport::Tcp | Transport::Udp) {
                continue;
            }
            out.push(ServiceRule {
                namespace: svc.namespace.clone(),
                name: svc.name.clone(),
                cluster_ip,
                port: port.port,
                transport: port.transport,
                endpoints: endpoints_of(snapshot, svc, port),
            });
        }
    }
    out.sort_by(|a, b| {
        (&a.namespace, &a.name, proto_word(a.transport), a.port).cmp(&(
            &b.namespace,
            &b.name,
            proto_word(b.transport),
            b.port,
        ))
    });
    out
}

/// Ready pods of the Service's namespace, by name and by IP.
fn ready_pods<'a>(snapshot: &'a Snapshot, namespace: &str) -> Vec<&'a Pod> {
    snapshot
        .pods
        .iter()
        .filter(|p| p.namespace == namespace && p.ready)
        .map(|p| &**p)
        .collect()
}

/// The Ready endpoints of one front port: from the Service's EndpointSlices (named targetPorts
/// resolved per pod, as Kubernetes does); without slices, from the selector and a numeric
/// targetPort.
fn endpoints_of(snapshot: &Snapshot, svc: &Service, port: &ServicePort) -> Vec<SocketAddrV4> {
    let ready = ready_pods(snapshot, &svc.namespace);
    let is_ready = |pod: Option<&str>, ip: Ipv4Addr| {
        ready.iter().any(|p| match pod {
            Some(name) => p.name == name,
            None => p.ips.contains(&IpAddr::V4(ip)),
        })
    };
    let slices: Vec<_> = snapshot
        .endpoint_slices
        .iter()
        .filter(|s| s.namespace == svc.namespace && s.service == svc.name)
        .collect();
    let mut out = BTreeSet::new();
    if slices.is_empty() {
        let target = match &port.target {
            TargetPort::Same => port.port,
            TargetPort::Number(n) => *n,
            TargetPort::Name(_) => return Vec::new(),
        };
        let selector = svc.selector.as_ref();
        for pod in &ready {
            let selected = selector.is_some_and(|sel| {
                !sel.is_empty() && sel.iter().all(|(k, v)| pod.labels.get(k) == Some(v))
            });
            if !selected {
                continue;
            }
            if let Some(IpAddr::V4(ip)) = pod.ips.first() {
                out.insert(SocketAddrV4::new(*ip, target));
            }
        }
        return out.into_iter().collect();
    }
    for slice in slices {
        let Some(number) = slice
            .ports
            .iter()
            .find(|sp| sp.name == port.name && sp.transport == port.transport)
            .and_then(|sp| sp.port)
        else {
            continue;
        };
        for ep in &slice.endpoints {
            for ip in &ep.addresses {
                if let IpAddr::V4(v4) = ip
                    && is_ready(ep.pod.as_deref(), *v4)
                {
                    out.insert(SocketAddrV4::new(*v4, number));
                }
            }
        }
    }
    out.into_iter().collect()
}

mod render;

#[cfg(test)]
mod tests;
