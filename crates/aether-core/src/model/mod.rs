//! The compiled per-port model and its compiler.
//!
//! Purity contract: nothing in this module performs IO, reads a clock, spawns a task or touches
//! a global; time arrives as an argument. [`compile()`] is a deterministic, order-independent
//! function of a [`Snapshot`] and a [`NodeContext`], and the resulting [`Model`] is immutable:
//! the daemon swaps a whole new one in.
//!
//! Everything a resolver needs is indexed for O(1) lookups: names by (namespace, name) whatever
//! the spelling's family, ClusterIPs and pod IPs by address, and per front port the class, the
//! endpoints and the attached rules.
#![warn(missing_docs)]

use crate::prelude::*;

pub mod attach;
pub mod compile;
pub mod diag;
pub mod filters;
pub mod live;
pub mod names;
pub mod path;
pub mod port;
#[cfg(test)]
pub(crate) mod proptests;
pub mod registrar;
pub mod retention;
pub mod route_match;
pub mod rows;
pub mod snapshot;
pub mod split;
pub mod synth;
pub mod table;
pub mod target;
pub mod vote;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use compile::compile;
pub use diag::Diagnostic;
pub use snapshot::Snapshot;

use crate::model::attach::{PortRoutes, RouteStatus, TlsTable};
use crate::model::names::Domains;
use crate::model::port::{PortClass, PortProtocol};
use crate::model::snapshot::FilterConfig;
use crate::model::table::{Sorted, Table};
use crate::model::target::{CaptureMode, Endpoint, L4Endpoint, ServiceKey, ServiceLine, TcpChoice};

/// The node's settings that the model depends on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeContext {
    /// The mesh and cluster domains.
    pub domains: Domains,
    /// The SPIFFE trust domain.
    pub trust_domain: String,
    /// This node's name; `None` compiles for every node (explain).
    pub node: Option<String>,
    /// `capture_redirect_all_default`: the capture mode of a pod without the annotation.
    pub capture_redirect_all_default: bool,
    /// Namespaces whose pods are unmanaged, as if `aether.io/managed: "false"` (model.md §2):
    /// no capture, no listeners, not registered.
    pub ignored_namespaces: BTreeSet<String>,
    /// The compile time, in milliseconds of the caller's clock (retained entries).
    pub now_ms: u64,
    /// The inbound mode of a pod without `inbound.aether.io/mode`: `true` is `strict`
    /// (model.md §12.5 item 3).
    pub inbound_strict_default: bool,
}

impl Default for NodeContext {
    fn default() -> Self {
        Self {
            domains: Domains {
                mesh: "aether.internal".into(),
                cluster: "cluster.local".into(),
            },
            trust_domain: "cluster.local".into(),
            node: None,
            capture_redirect_all_default: true,
            ignored_namespaces: BTreeSet::new(),
            now_ms: 0,
            inbound_strict_default: false,
        }
    }
}

/// The compiled model: immutable, compared whole for determinism.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    /// The settings it was compiled with.
    pub context: NodeContext,
    /// Names by namespace, then name, lower case: two lookups by `&str`, no allocation.
    pub(crate) names: Table<Box<str>, Table<Box<str>, Arc<NameEntry>>>,
    /// Generated Services' ClusterIPs.
    pub(crate) cluster_ips: Table<IpAddr, Arc<ClusterIpEntry>>,
    /// Served pods by IP.
    pub(crate) pod_ips: Table<IpAddr, Arc<PodIpEntry>>,
    /// Every pod, sorted by (namespace, name) without repeats, for callers: a lookup is a binary
    /// search, and the list costs no key of its own (a map keyed by (namespace, name) held a
    /// second copy of both strings per pod).
    pub(crate) pods: Sorted<Arc<PodFacts>>,
    /// Passthroughs carried over the mesh hop: a user Service's (ClusterIP, TCP port) with a
    /// mesh pod among its endpoints, and those endpoints (model.md §12.5 item 1).
    pub(crate) l4: Table<SocketAddr, Arc<[L4Endpoint]>>,
    /// Service-level filters by the Service they target.
    pub(crate) service_filters: Table<ServiceKey, Arc<[NamedFilter]>>,
    /// The one-truth class of each mesh service's ports.
    pub(crate) classes: Table<ServiceKey, Arc<BTreeMap<u16, PortProtocol>>>,
    /// Route status entries, by (kind, namespace, name, ...).
    pub(crate) statuses: Sorted<RouteStatus>,
    /// What the compiler refused or dropped, sorted, each once.
    pub diagnostics: Sorted<Diagnostic>,
}

/// A named service-level filter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedFilter {
    /// `<namespace>/<name>` of the MeshFilter.
    pub name: String,
    /// The filter.
    pub config: FilterConfig,
}

/// Why a byte stream over the hop may not reach the application ([`Model::connection_verdict`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionDenied {
    /// An `rbac` of a Service that guards the pod refuses the caller.
    #[error("rbac {filter} of {service} denies the caller")]
    Rbac {
        /// The MeshFilter, `<namespace>/<name>`.
        filter: String,
        /// The Service it targets.
        service: ServiceKey,
    },
    /// A Service that guards the pod has an `ext_authz`, which a byte stream cannot pass.
    #[error("ext_authz {filter} of {service} applies per HTTP request: a byte stream is refused")]
    ExtAuthz {
        /// The MeshFilter, `<namespace>/<name>`.
        filter: String,
        /// The Service it targets.
        service: ServiceKey,
    },
    /// A Service that guards the pod is named by a MeshFilter the source could not read.
    #[error("MeshFilter {filter} of {service} cannot be read: a byte stream is refused")]
    Unreadable {
        /// The MeshFilter, `<namespace>/<name>`.
        filter: String,
        /// The Service it targets.
        service: ServiceKey,
    },
}

/// What a name (in one namespace) is to the mesh (addressing.md §4.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NameEntry {
    /// The Service (or mesh service) the name refers to.
    pub(crate) key: ServiceKey,
    /// Its mesh name and `ports:` line.
    pub(crate) line: ServiceLine,
    /// Which row of addressing.md §4.3 applies.
    pub(crate) kind: NameKind,
    /// The node knows ports of the name (otherwise a mesh-name spelling is category (d)).
    pub(crate) known: bool,
    /// Front ports (TCP entries; a UDP-only front port appears with class UDP).
    pub(crate) ports: BTreeMap<u16, FrontPort>,
    /// meshOnly: the mesh service's own ports, for its mesh name on a captured dial (§7.2).
    pub(crate) own_ports: Option<BTreeMap<u16, FrontPort>>,
}

/// Which row of addressing.md §4.3 a name entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum NameKind {
    /// A generated Service, or a mesh service with no Service object yet.
    Generated,
    /// A routed user Service (fronting a mesh service or not).
    Routed,
    /// A mesh service whose name an unrouted (or headless) user Service owns.
    MeshOnly,
    /// An unrelated user Service (§4.3 row 5): none of its names is the mesh's, and its
    /// mesh-domain spelling is category (e), never (d). It has no ports and is never known.
    Unrelated,
}

/// One front port of a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FrontPort {
    /// The pod port it maps to; `None` while a named targetPort does not resolve.
    pub(crate) pod_port: Option<u16>,
    /// Its class (spec/model.md §9.3).
    pub(crate) class: PortClass,
    /// Ready endpoints declaring the pod port with the winning protocol.
    pub(crate) endpoints: Arc<[Endpoint]>,
    /// Rules attached to it (producer and consumer routes).
    pub(crate) routes: Option<Arc<PortRoutes>>,
    /// Reach the application as h2c (`appProtocol: kubernetes.io/h2c`).
    pub(crate) h2c: bool,
    /// Kept as a retained entry (spec/model.md §10).
    pub(crate) retained: bool,
}

/// A generated Service's ClusterIP: what raw TCP and TLS to it mean (addressing.md §3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClusterIpEntry {
    /// The mesh service behind it.
    pub(crate) key: ServiceKey,
    /// Raw-TCP ports: the default destination or a TCPRoute's backends.
    pub(crate) tcp: BTreeMap<u16, TcpChoice>,
    /// The legacy target, when its class is raw TCP.
    pub(crate) legacy: Option<TcpChoice>,
    /// The HTTP ports (class HTTP) of the service.
    pub(crate) http: BTreeSet<u16>,
    /// TLSRoutes, per port and for any port.
    pub(crate) tls: TlsTable,
    /// The UDPRoute backend for datagrams to port 18082.
    pub(crate) udp: Option<TcpChoice>,
}

/// A served pod, by its IP (addressing.md §3 step 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PodIpEntry {
    /// The pod as an endpoint.
    pub(crate) endpoint: Endpoint,
    /// Ports its row declares with its service's winning protocol (reserved ports left out).
    pub(crate) declared: BTreeMap<u16, PortProtocol>,
    /// Raw TCP to each of its raw-TCP ports, built once.
    pub(crate) tcp: BTreeMap<u16, TcpChoice>,
    /// Every Service whose service-level filters apply to a connection the hop delivers to
    /// this pod without naming one (raw TCP and L4, model.md §12.5 item 2): its own mesh
    /// service, then the user Services whose EndpointSlices hold its address. For a contested
    /// address, every claimant's mesh service.
    pub(crate) guarded_by: Arc<[ServiceKey]>,
    /// Set when rows of more than one mesh service claim the address (issue #35 item 5): every
    /// claimant with the ports it declares. Until the conflict ends, no claimant owns the
    /// address: a pod-IP dial to it is refused, a hop from it proves no one, and `declared`
    /// and `guarded_by` hold every claimant's ports and Services, so that each claimant's
    /// inbound protection applies.
    pub(crate) contested: Option<Arc<[Claim]>>,
}

/// One of the rows that claim a contested address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    /// Its mesh service.
    pub(crate) service: ServiceKey,
    /// Ports its row declares with its service's winning protocol.
    pub(crate) declared: BTreeMap<u16, PortProtocol>,
}

/// Why the source address of a mesh hop does not prove the identity of its certificate
/// (model.md §14, "Source binding"). Each has a stable code, the label of
/// `aether_hop_source_refused_total` and the access log's reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unbound {
    /// The address is no served row's.
    NotAPod,
    /// Rows of more than one mesh service claim the address (issue #35 item 5).
    Contested,
    /// The address is a served pod of another identity.
    OtherIdentity(ServiceKey),
}

impl Unbound {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotAPod => "source-not-a-pod",
            Self::Contested => "source-contested",
            Self::OtherIdentity(_) => "source-identity-mismatch",
        }
    }

    /// Every code, for the metric's series.
    pub const CODES: [&'static str; 3] = [
        "source-not-a-pod",
        "source-contested",
        "source-identity-mismatch",
    ];
}

impl std::fmt::Display for Unbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotAPod => f.write_str("the source address is no served pod's"),
            Self::Contested => {
                f.write_str("the source address is claimed by rows of more than one service")
            }
            Self::OtherIdentity(k) => write!(
                f,
                "the source address is a pod of {}/{}",
                k.namespace, k.name
            ),
        }
    }
}

/// A pod as a caller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodFacts {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// ServiceAccount.
    pub service_account: String,
    /// Addresses.
    pub ips: Vec<IpAddr>,
    /// Managed by the mesh.
    pub managed: bool,
    /// Its capture mode.
    pub capture: CaptureMode,
    /// Its node.
    pub node: Option<String>,
    /// The network namespace it lives in (`aether.io/netns`, file mode).
    pub netns: Option<String>,
    /// Its namespace is learned from a CNI ADD alone (`aether.io/netns-from: cni`).
    pub netns_from_cni: bool,
    /// `capture.aether.io/exclude-outbound-ports`.
    pub exclude_outbound_ports: Vec<u16>,
    /// `capture.aether.io/exclude-outbound-ip-ranges`.
    pub exclude_outbound_ip_ranges: Vec<ipnet::IpNet>,
    /// What plaintext from outside the mesh gets (model.md §12.5 item 3).
    pub inbound: InboundFacts,
}

impl PodFacts {
    /// (namespace, name): the order of [`Model::pods`].
    pub fn by_name(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }
}

/// A pod's inbound side toward plaintext from outside the mesh (model.md §12.5 item 3).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct InboundFacts {
    /// `strict`, by its annotation or the node default.
    pub strict: bool,
    /// The Services with a service-level `rbac` or `ext_authz` that guard the pod (its mesh
    /// service, or a Service it backs), `ns/name`.
    pub authorized_by: Vec<String>,
    /// The TCP ports on which plaintext from outside the pod is refused: every raw-TCP and
    /// HTTP port the pod declares when it is `strict` or authorized, else none.
    pub refused_ports: Vec<u16>,
    /// The node's addresses (`status.hostIPs`), let through in both modes (kubelet probes).
    pub host_ips: Vec<IpAddr>,
}

impl table::Order for Arc<PodFacts> {
    /// By (namespace, name): the model's list of pods holds each name once.
    fn order(&self, other: &Self) -> std::cmp::Ordering {
        self.by_name().cmp(&other.by_name())
    }
}

impl table::Order for RouteStatus {
    fn order(&self, other: &Self) -> std::cmp::Ordering {
        self.cmp(other)
    }
}

impl table::Order for Diagnostic {
    fn order(&self, other: &Self) -> std::cmp::Ordering {
        self.cmp(other)
    }
}

impl Model {
    /// Whether `other` answers every question as this model does: equal in everything but the
    /// clock it was compiled at (`context.now_ms`, read only to expire retained ports while
    /// compiling). A reload whose model serves like the published one publishes nothing
    /// (issue #36 item 6).
    pub fn serves_like(&self, other: &Self) -> bool {
        // Named field by field, so that a field added to the model is compared here too.
        let Self {
            context,
            names,
            cluster_ips,
            pod_ips,
            pods,
            l4,
            service_filters,
            classes,
            statuses,
            diagnostics,
        } = self;
        let clockless = |c: &NodeContext| NodeContext {
            now_ms: 0,
            ..c.clone()
        };
        clockless(context) == clockless(&other.context)
            && *names == other.names
            && *cluster_ips == other.cluster_ips
            && *pod_ips == other.pod_ips
            && *pods == other.pods
            && *l4 == other.l4
            && *service_filters == other.service_filters
            && *classes == other.classes
            && *statuses == other.statuses
            && *diagnostics == other.diagnostics
    }

    /// The ports the row of the pod at `ip` of the mesh service `namespace`/`service_account`
    /// declares, with their protocol: the mesh hop's check at the destination (model.md §14),
    /// asked with the identity of the local pod that holds the address. `None` when no such
    /// row claims the address: the model does not hold the pod as that service's.
    pub fn hop_ports(
        &self,
        ip: IpAddr,
        namespace: &str,
        service_account: &str,
    ) -> Option<&BTreeMap<u16, PortProtocol>> {
        let e = self.pod_ips.get(&ip)?;
        let is = |k: &ServiceKey| &*k.namespace == namespace && &*k.name == service_account;
        match &e.contested {
            Some(claims) => claims.iter().find(|c| is(&c.service)).map(|c| &c.declared),
            None => is(&e.endpoint.mesh_service).then_some(&e.declared),
        }
    }

    /// Source binding (model.md §14): whether a hop from `ip` may speak as
    /// `namespace`/`service_account`, the identity its certificate proves. Only when `ip` is
    /// the address of a served row (in any state) of that mesh service, and of no other.
    pub fn source_binding(
        &self,
        ip: IpAddr,
        namespace: &str,
        service_account: &str,
    ) -> Result<(), Unbound> {
        let Some(e) = self.pod_ips.get(&ip) else {
            return Err(Unbound::NotAPod);
        };
        if e.contested.is_some() {
            return Err(Unbound::Contested);
        }
        let k = &e.endpoint.mesh_service;
        if &*k.namespace == namespace && &*k.name == service_account {
            Ok(())
        } else {
            Err(Unbound::OtherIdentity(k.clone()))
        }
    }

    /// Whether rows of more than one mesh service claim `ip` (issue #35 item 5).
    pub fn contested(&self, ip: IpAddr) -> bool {
        self.pod_ips.get(&ip).is_some_and(|e| e.contested.is_some())
    }

    /// Whether any UDPRoute has a parent address (the UDP listener on 18082 is opened only
    /// then, model.md §12.3).
    pub fn has_udp_routes(&self) -> bool {
        self.cluster_ips.values().any(|e| e.udp.is_some())
    }

    /// A pod by namespace and name.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodFacts> {
        self.pods
            .find(|p| p.by_name().cmp(&(namespace, name)))
            .map(Arc::as_ref)
    }

    /// Every pod the model knows.
    pub fn pods(&self) -> impl Iterator<Item = &PodFacts> {
        self.pods.iter().map(Arc::as_ref)
    }

    /// The ClusterIP(s) of a Service, when the model holds it as a mesh VIP.
    pub fn mesh_vips(&self, namespace: &str, name: &str) -> Vec<IpAddr> {
        let mut v: Vec<IpAddr> = self
            .cluster_ips
            .iter()
            .filter(|(_, e)| &*e.key.namespace == namespace && &*e.key.name == name)
            .map(|(ip, _)| *ip)
            .collect();
        v.sort();
        v
    }

    /// The one-truth class of every port of a mesh service.
    pub fn classes(&self, namespace: &str, name: &str) -> Option<&BTreeMap<u16, PortProtocol>> {
        self.classes
            .get(&ServiceKey {
                namespace: namespace.into(),
                name: name.into(),
            })
            .map(Arc::as_ref)
    }

    /// Every mesh service with the class of each of its ports, in no particular order.
    pub fn every_class(&self) -> impl Iterator<Item = (&ServiceKey, &BTreeMap<u16, PortProtocol>)> {
        self.classes
            .iter()
            .map(|(key, classes)| (key, classes.as_ref()))
    }

    /// Every (namespace, service, port) served as HTTP (input to [`retention::advance`]), in no
    /// particular order, borrowed from the model.
    pub fn http_ports(&self) -> Vec<(&str, &str, u16)> {
        let mut out = Vec::new();
        for e in self.names.values().flat_map(Table::values) {
            if e.kind != NameKind::Generated {
                continue;
            }
            for (&p, fp) in &e.ports {
                if fp.class == PortClass::Known(PortProtocol::Http) {
                    out.push((&*e.key.namespace, &*e.key.name, p));
                }
            }
        }
        out
    }

    /// The ports the mesh service `name` in `namespace` serves as HTTP: [`Model::http_ports`] of
    /// one service, by one lookup.
    pub fn http_ports_of(&self, namespace: &str, name: &str) -> Vec<u16> {
        self.name(namespace, name)
            .filter(|e| {
                e.kind == NameKind::Generated
                    && &*e.key.namespace == namespace
                    && &*e.key.name == name
            })
            .map(|e| {
                e.ports
                    .iter()
                    .filter(|(_, fp)| fp.class == PortClass::Known(PortProtocol::Http))
                    .map(|(&p, _)| p)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every (service, port) a request or connection can be labelled with in the data plane's
    /// metrics: each name's front ports (generated and user Services) and each mesh service's
    /// own ports. Sorted, no duplicates; O(service ports).
    pub fn service_ports(&self) -> BTreeSet<(ServiceKey, u16)> {
        let mut out = BTreeSet::new();
        for e in self.names.values().flat_map(Table::values) {
            for &p in e.ports.keys() {
                out.insert((e.key.clone(), p));
            }
        }
        for (key, ports) in &self.classes {
            for &p in ports.keys() {
                out.insert((key.clone(), p));
            }
        }
        out
    }

    /// Every (namespace, mesh service) a request or connection can come from, as the data
    /// plane's metrics label it: each mesh service's, and each known pod's ServiceAccount (a
    /// client pod need not serve a port). O(mesh services + pods).
    pub fn sources(&self) -> std::collections::HashSet<(&str, &str)> {
        self.classes
            .keys()
            .map(|k| (&*k.namespace, &*k.name))
            .chain(
                self.pods
                    .iter()
                    .map(|p| (p.namespace.as_str(), p.service_account.as_str())),
            )
            .collect()
    }

    /// Route status entries, one per (route, parentRef).
    pub fn route_statuses(&self) -> impl Iterator<Item = &RouteStatus> {
        self.statuses.iter()
    }

    /// Where a captured connection to `dialled` that would be passed through goes instead
    /// (model.md §12.5 item 1): the endpoints to pick from, a mesh pod's bytes carried over the
    /// hop. A user Service's ClusterIP and port with a mesh pod behind it gives its Ready
    /// endpoints; a served pod's IP on a port it declares gives that pod; the IP of a pod that
    /// rows of more than one service claim gives no endpoint at all: nothing may go there.
    /// `None` is the plain passthrough to `dialled`.
    pub fn passthrough_over_hop(&self, dialled: SocketAddr) -> Option<Arc<[L4Endpoint]>> {
        if let Some(eps) = self.l4.get(&dialled) {
            return Some(eps.clone());
        }
        let pod = self.pod_ips.get(&dialled.ip())?;
        if pod.contested.is_some() {
            // No claimant owns the address: nothing goes to it (the caller refuses).
            return Some(Arc::from([]));
        }
        matches!(
            pod.declared.get(&dialled.port()),
            Some(PortProtocol::Http | PortProtocol::Tcp)
        )
        .then(|| {
            Arc::from([L4Endpoint {
                address: dialled.ip(),
                port: dialled.port(),
                mesh: Some(pod.endpoint.mesh_service.clone()),
            }])
        })
    }

    /// The Services whose service-level filters guard a connection the hop delivers to the
    /// pod at `ip` without naming a Service (raw TCP and L4 deliveries, model.md §12.5 item 2).
    pub fn guarded_by(&self, ip: IpAddr) -> &[ServiceKey] {
        self.pod_ips.get(&ip).map_or(&[], |e| &e.guarded_by)
    }

    /// Whether a connection the hop delivers as bytes (raw TCP, or an L4 hop's bytes) from the
    /// caller `namespace`/`service_account` may reach the application of the pod at `pod_ip`
    /// (model.md §12.5 item 2): every `rbac` of the Services that guard the pod must let the
    /// caller through, and none of them may have an `ext_authz`, which is defined per request
    /// only (a byte stream under one is refused: fail closed). The daemon's verdict and
    /// explain's are this one function.
    pub fn connection_verdict(
        &self,
        pod_ip: IpAddr,
        namespace: &str,
        service_account: &str,
    ) -> Result<(), ConnectionDenied> {
        for key in self.guarded_by(pod_ip) {
            for f in self.filters_of(key) {
                let denied = match &f.config {
                    FilterConfig::Rbac(rbac) if !rbac.allows(namespace, service_account) => {
                        ConnectionDenied::Rbac {
                            filter: f.name.clone(),
                            service: key.clone(),
                        }
                    }
                    FilterConfig::ExtAuthz(_) => ConnectionDenied::ExtAuthz {
                        filter: f.name.clone(),
                        service: key.clone(),
                    },
                    FilterConfig::Unreadable(_) => ConnectionDenied::Unreadable {
                        filter: f.name.clone(),
                        service: key.clone(),
                    },
                    _ => continue,
                };
                return Err(denied);
            }
        }
        Ok(())
    }

    /// The service-level filters that target a Service.
    pub fn filters_of(&self, key: &ServiceKey) -> &[NamedFilter] {
        self.service_filters.get(key).map_or(&[], |f| f)
    }

    /// How many mesh services the model holds (for metrics).
    pub fn mesh_service_count(&self) -> usize {
        self.classes.len()
    }

    /// How many names the model answers (for dumps and benchmarks).
    pub fn name_count(&self) -> usize {
        self.names.values().map(Table::len).sum()
    }

    /// The mesh name and `ports:` line of the Service `name` in `namespace`, as a refusal body
    /// would list them (for explain and the debug CLI).
    pub fn declared(&self, namespace: &str, name: &str) -> Option<&ServiceLine> {
        self.name(namespace, name).map(|e| &e.line)
    }

    /// The name entry of `name` in `namespace` (both lower case).
    pub(crate) fn name(&self, namespace: &str, name: &str) -> Option<&NameEntry> {
        self.names.get(namespace)?.get(name).map(Arc::as_ref)
    }
}
