//! `compile(&Snapshot, &NodeContext) -> Model`: the one computation per snapshot.
//!
//! Order of work, each step reading only what the steps before it built:
//! 1. served rows (RowProblem, de-duplication, reserved ports) grouped by mesh service;
//! 2. the class vote per (service, port), endpoint sets, pod-IP entries, legacy targets;
//! 3. which user Services are routed, then one name entry per (namespace, name);
//! 4. route attachment and strict backends (see [`crate::model::attach`]), route status;
//! 5. generated Services' ClusterIPs for raw TCP, TLSRoute and TCPRoute.
//!
//! Cost: O(rows + services + routes · attached ports), every index a hash or B-tree map; no
//! step compares every service with every other. Deterministic: inputs are sorted before use.
//!
//! Layer 0 (pure).

use crate::prelude::*;

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Arc;

use crate::model::attach::{
    AttachedRoute, CompiledBackend, CompiledRule, Condition, InvalidRef, PortRoutes, RefReason,
    RouteStatus, RuleSet, TlsRule, TlsTable,
};
use crate::model::diag::{Diagnostic, DiagnosticKind};
use crate::model::names::mesh_name;
use crate::model::port::{
    LEGACY_PORT, PROXY_PORT, PortClass, PortProtocol, Transport, is_reserved, push_decimal,
};
use crate::model::retention::GRACE_MS;
use crate::model::route_match::{RouteInput, RouteTable};
use crate::model::rows::{PortProtocols, row_problem, served_protocols};
use crate::model::snapshot::{
    FilterConfig, HttpFilter, HttpRoute, HttpRouteKind, L4Route, ObjectRef, ParentRef,
    ProtocolValue, Row, Service, Snapshot, TargetPort,
};
use crate::model::table::{Sorted, Table};
use crate::model::target::{
    CaptureMode, Endpoint, HttpBackend, ServiceKey, ServiceLine, TcpBackend, TcpChoice, TcpTarget,
    Why,
};
use crate::model::vote::{Tally, legacy_target, vote};
use crate::model::{
    Claim, ClusterIpEntry, FrontPort, InboundFacts, Model, NameEntry, NameKind, NamedFilter,
    NodeContext, PodFacts, PodIpEntry,
};

mod l4;
mod routes;

const H2C: &str = "kubernetes.io/h2c";

/// One served row, its ports read (reserved ports left out).
#[derive(Debug)]
struct Served<'s> {
    row: &'s Row,
    protocols: PortProtocols,
    /// The row as an endpoint, built once and shared by every endpoint set it joins.
    endpoint: Endpoint,
}

/// A mesh service's rows and what follows from them.
#[derive(Debug, Default)]
struct MeshService<'s> {
    /// The service's key, allocated once.
    key: Option<ServiceKey>,
    rows: Vec<Served<'s>>,
    classes: BTreeMap<u16, PortProtocol>,
    endpoints: BTreeMap<u16, Arc<[Endpoint]>>,
    legacy: Option<u16>,
}

impl MeshService<'_> {
    /// Its key, sharing the strings of the one its endpoints hold (set with its first row).
    fn key(&self, ns: &str, name: &str) -> ServiceKey {
        self.key.clone().unwrap_or_else(|| key(ns, name))
    }
}

/// What plaintext from outside the mesh gets at a pod (model.md §12.5 item 3): refused on every
/// TCP port it declares when it is `strict`, or when a Service that guards it has a
/// service-level `rbac` or `ext_authz`.
fn inbound_facts(
    pod: &crate::model::snapshot::Pod,
    ctx: &NodeContext,
    pod_ips: &HashMap<IpAddr, Arc<PodIpEntry>>,
    filters: &BTreeMap<ServiceKey, Arc<[NamedFilter]>>,
) -> InboundFacts {
    let strict = match pod.inbound_mode.as_deref() {
        None => ctx.inbound_strict_default,
        Some("permissive") => false,
        // `strict`, and any value that is not a mode: fail closed (a diagnostic says so).
        Some(_) => true,
    };
    let entry = pod.ips.iter().find_map(|ip| pod_ips.get(ip));
    let mut authorized_by = Vec::new();
    let mut ports = Vec::new();
    if let Some(e) = entry {
        for k in e.guarded_by.iter() {
            let authz = filters.get(k).is_some_and(|fs| {
                fs.iter().any(|f| {
                    matches!(
                        f.config,
                        FilterConfig::Rbac(_)
                            | FilterConfig::ExtAuthz(_)
                            | FilterConfig::Unreadable(_)
                    )
                })
            });
            if authz {
                authorized_by.push(format!("{}/{}", k.namespace, k.name));
            }
        }
        if strict || !authorized_by.is_empty() {
            ports = e
                .declared
                .iter()
                .filter(|(_, p)| matches!(p, PortProtocol::Http | PortProtocol::Tcp))
                .map(|(&p, _)| p)
                .collect();
        }
    }
    InboundFacts {
        strict,
        authorized_by,
        refused_ports: ports,
        host_ips: pod.host_ips.clone(),
    }
}

fn key(ns: &str, name: &str) -> ServiceKey {
    ServiceKey {
        namespace: ns.into(),
        name: name.into(),
    }
}

fn is_service_ref(r: &ObjectRef) -> bool {
    (r.group.is_empty() || r.group == "core") && r.kind == "Service"
}

/// The order of two objects by (namespace, name), and of two of one name (a file registry can
/// hold both) by what they say: the order a source gave them in never decides (issue #37's
/// property test found four places where it did, since the kept model compiles a component's
/// objects in an order of its own). The content is formatted only on a tie.
pub(crate) fn named_order<T: std::fmt::Debug>(
    a: (&str, &str),
    b: (&str, &str),
    x: &T,
    y: &T,
) -> std::cmp::Ordering {
    a.cmp(&b)
        .then_with(|| format!("{x:?}").cmp(&format!("{y:?}")))
}

/// Compiles a snapshot into a model: deterministic and independent of input order.
pub fn compile(snapshot: &Snapshot, ctx: &NodeContext) -> Model {
    Model::from_entries(ctx, compile_entries(snapshot, ctx))
}

impl Model {
    /// The model of `e`, its tables cut for their size and filled at once.
    pub(crate) fn from_entries(ctx: &NodeContext, e: Entries) -> Self {
        Self::from_many(ctx, vec![e])
    }

    /// The model of the entries of disjoint components (no key of one is another's), each
    /// table cut once for all of them and filled from each in turn: what the kept model makes
    /// when it compiled every component at once (`live::Live`), without gathering the entries
    /// into maps first.
    pub(crate) fn from_many(ctx: &NodeContext, mut many: Vec<Entries>) -> Self {
        fn table<K: Hash + Eq + Clone, V: Clone, M: IntoIterator<Item = (K, V)>>(
            many: &mut [Entries],
            size: impl Fn(&Entries) -> usize,
            take: impl Fn(&mut Entries) -> M,
        ) -> Table<K, V> {
            let mut t = Table::with_capacity(many.iter().map(&size).sum());
            for e in many {
                t.extend(take(e));
            }
            t
        }
        // The names of each namespace, from every component that has some.
        let mut by_ns: HashMap<Box<str>, Vec<NamesOf>> = HashMap::new();
        for e in &mut many {
            for (ns, names) in std::mem::take(&mut e.names) {
                by_ns.entry(ns).or_default().push(names);
            }
        }
        let names = by_ns
            .into_iter()
            .map(|(ns, parts)| {
                let mut t = Table::with_capacity(parts.iter().map(HashMap::len).sum());
                for p in parts {
                    t.extend(p);
                }
                (ns, t)
            })
            .collect();
        let cluster_ips = table(
            &mut many,
            |e| e.cluster_ips.len(),
            |e| std::mem::take(&mut e.cluster_ips),
        );
        let l4 = table(&mut many, |e| e.l4.len(), |e| std::mem::take(&mut e.l4));
        let pod_ips = table(
            &mut many,
            |e| e.pod_ips.len(),
            |e| std::mem::take(&mut e.pod_ips),
        );
        let service_filters = table(
            &mut many,
            |e| e.service_filters.len(),
            |e| std::mem::take(&mut e.service_filters),
        );
        let classes = table(
            &mut many,
            |e| e.classes.len(),
            |e| {
                std::mem::take(&mut e.classes)
                    .into_iter()
                    .map(|(k, v)| (k, Arc::new(v)))
            },
        );
        let mut pods = Vec::with_capacity(many.iter().map(|e| e.pods.len()).sum());
        let mut statuses = Vec::with_capacity(many.iter().map(|e| e.statuses.len()).sum());
        let mut diagnostics = Vec::with_capacity(many.iter().map(|e| e.diagnostics.len()).sum());
        for e in many {
            pods.extend(e.pods);
            statuses.extend(e.statuses);
            diagnostics.extend(e.diagnostics);
        }
        Self {
            context: ctx.clone(),
            names,
            cluster_ips,
            l4,
            pod_ips,
            pods: Sorted::from_vec(pods),
            service_filters,
            classes,
            statuses: Sorted::from_vec(statuses),
            diagnostics: Sorted::from_vec(diagnostics),
        }
    }
}

/// What a compile puts in a model's tables, before it is put there: the kept model
/// (`live::Live`) takes a component's entries from here into its own tables, without making
/// tables for the component first. Statuses and diagnostics may repeat.
#[derive(Default)]
pub(crate) struct Entries {
    /// Names by namespace, then name.
    pub(crate) names: Vec<(Box<str>, NamesOf)>,
    pub(crate) cluster_ips: HashMap<IpAddr, Arc<ClusterIpEntry>>,
    pub(crate) l4: HashMap<std::net::SocketAddr, Arc<[crate::model::target::L4Endpoint]>>,
    pub(crate) pod_ips: HashMap<IpAddr, Arc<PodIpEntry>>,
    pub(crate) pods: Vec<Arc<PodFacts>>,
    pub(crate) service_filters: BTreeMap<ServiceKey, Arc<[NamedFilter]>>,
    pub(crate) classes: BTreeMap<ServiceKey, BTreeMap<u16, PortProtocol>>,
    pub(crate) statuses: Vec<RouteStatus>,
    pub(crate) diagnostics: Vec<Diagnostic>,
}

/// The names of one namespace, by name.
pub(crate) type NamesOf = HashMap<Box<str>, Arc<NameEntry>>;

/// The entries [`compile`] puts in its model.
pub(crate) fn compile_entries(snapshot: &Snapshot, ctx: &NodeContext) -> Entries {
    let mut c = Compiler {
        snapshot,
        ctx,
        diagnostics: Vec::new(),
        services: HashMap::new(),
        classes: BTreeMap::new(),
        by_address: BTreeMap::new(),
    };
    c.serve_rows();
    c.finish()
}

struct Compiler<'s> {
    snapshot: &'s Snapshot,
    ctx: &'s NodeContext,
    diagnostics: Vec<Diagnostic>,
    services: HashMap<(&'s str, &'s str), MeshService<'s>>,
    /// The one-truth class of each mesh service's ports (the model's `classes`).
    classes: BTreeMap<ServiceKey, BTreeMap<u16, PortProtocol>>,
    /// Served rows by pod address: every row that claims it, (mesh service, row), in row
    /// order. More than one is a conflict (issue #35 item 5): no claimant owns the address.
    by_address: BTreeMap<IpAddr, Vec<(&'s str, &'s str, &'s Row)>>,
}

impl<'s> Compiler<'s> {
    /// Step 1 and 2: served rows, votes, endpoints.
    fn serve_rows(&mut self) {
        let mut rows: Vec<&Row> = self.snapshot.rows.iter().map(|r| &**r).collect();
        // A total order, so that de-duplication keeps the same row of a pod listed twice
        // whatever order the rows arrive in (spec/model.md §3.4, §6.1).
        rows.sort_by(|a, b| row_order(a, b));
        for p in &self.snapshot.refused_pods {
            self.diagnostics.push(Diagnostic::new(
                DiagnosticKind::PodRefused,
                format!("{}/{}", p.namespace, p.name),
                format!("annotation-unparseable: {}", p.detail),
            ));
        }
        // The last row kept: rows of one (namespace, service, address) are adjacent in this
        // order, so a row with its key is a duplicate.
        let mut kept: Option<(&str, &str, IpAddr)> = None;
        let mut nodes: BTreeMap<&str, Arc<str>> = BTreeMap::new();
        // The mesh service whose rows are being read: its rows are adjacent in this order too,
        // so each service goes into the map once.
        let mut current: Option<((&'s str, &'s str), MeshService<'s>)> = None;
        // Gathered in a list, then built into the map at its final size (no rehash as it grows).
        let mut gathered: Vec<((&'s str, &'s str), MeshService<'s>)> = Vec::new();
        for row in rows {
            if self.ctx.ignored_namespaces.contains(&row.namespace) {
                // An ignored namespace's pods are not registered (model.md §2).
                continue;
            }
            if let Some(why) = crate::model::names::identity_problem(&row.namespace, &row.service) {
                self.diagnostics.push(Diagnostic::new(
                    DiagnosticKind::InvalidName,
                    format!("{}/{} {}", row.namespace, row.service, row.address),
                    format!("{why}: the row is not served"),
                ));
                continue;
            }
            if let Some(problem) = row_problem(row) {
                self.diagnostics.push(Diagnostic::new(
                    DiagnosticKind::RowRefused,
                    format!("{}/{} {}", row.namespace, row.service, row.address),
                    problem.as_str(),
                ));
                continue;
            }
            let k = (row.namespace.as_str(), row.service.as_str(), row.address);
            if kept == Some(k) {
                // A consumer de-duplicates rows per (namespace, service, address) (§3.4).
                continue;
            }
            kept = Some(k);
            let mut protocols = served_protocols(row);
            let reserved: Vec<u16> = protocols
                .keys()
                .copied()
                .filter(|&p| is_reserved(u32::from(p)))
                .collect();
            for p in reserved {
                protocols.remove(&p);
                self.diagnostics.push(Diagnostic::new(
                    DiagnosticKind::ReservedPort,
                    format!("{}/{}", row.namespace, row.service),
                    format!("port {p} is reserved and is not served"),
                ));
            }
            match self.by_address.entry(row.address) {
                Entry::Occupied(mut e) => {
                    let (ns, svc, _) = e.get()[0];
                    self.diagnostics.push(Diagnostic::new(
                        DiagnosticKind::DuplicateAddress,
                        row.address.to_string(),
                        format!(
                            "claimed by rows of {ns}/{svc} and {}/{}: until one goes, pod-IP dials to it are refused, hops from it are refused, and every claimant's inbound protection applies to it",
                            row.namespace, row.service
                        ),
                    ));
                    e.get_mut().push((&row.namespace, &row.service, row));
                }
                Entry::Vacant(e) => {
                    e.insert(vec![(&row.namespace, &row.service, row)]);
                }
            }
            let sk = (row.namespace.as_str(), row.service.as_str());
            if current.as_ref().is_some_and(|(k, _)| *k != sk)
                && let Some(done) = current.take()
            {
                gathered.push(done);
            }
            let (_, m) = current.get_or_insert_with(|| (sk, MeshService::default()));
            let mesh_service = m
                .key
                .get_or_insert_with(|| key(&row.namespace, &row.service))
                .clone();
            let node = row
                .node
                .as_deref()
                .map(|n| nodes.entry(n).or_insert_with(|| Arc::from(n)).clone());
            let endpoint = Endpoint {
                address: row.address,
                pod: row.pod.as_deref().map(Arc::from),
                node,
                mesh_service,
            };
            m.rows.push(Served {
                row,
                protocols,
                endpoint,
            });
        }
        gathered.extend(current);
        for ((ns, svc), m) in &mut gathered {
            let tallies = vote(m.rows.iter().map(|r| &r.protocols));
            for (&port, tally) in &tallies {
                if tally.disagrees() {
                    self.diagnostics.push(Diagnostic::new(
                        DiagnosticKind::ClassDisagreement,
                        format!("{ns}/{svc}:{port}"),
                        format!("http={} tcp={} udp={}", tally.http, tally.tcp, tally.udp),
                    ));
                }
                if let Some(w) = tally.winner() {
                    m.classes.insert(port, w);
                }
            }
            for (&port, &class) in &m.classes {
                let eps: Vec<Endpoint> = m
                    .rows
                    .iter()
                    .filter(|r| r.row.ready && r.protocols.get(&port) == Some(&class))
                    .map(|r| r.endpoint.clone())
                    .collect();
                m.endpoints.insert(port, eps.into());
            }
            m.legacy = legacy_target(m.rows.iter().filter_map(|r| u16::try_from(r.row.port).ok()));
        }
        // The services were gathered in (namespace, name) order, the order of `ServiceKey`: the
        // map's build finds its input sorted (collected from the hash map, it sorted it again).
        self.classes = gathered
            .iter()
            .map(|((ns, svc), m)| (m.key(ns, svc), m.classes.clone()))
            .collect();
        self.services = gathered.into_iter().collect();
    }

    fn finish(mut self) -> Entries {
        let snapshot = self.snapshot;
        let ctx = self.ctx;
        let services: HashMap<(&str, &str), &Service> = snapshot
            .services
            .iter()
            .map(|s| ((s.namespace.as_str(), s.name.as_str()), s))
            .collect();

        // Rows by address, and the pods behind each user Service (its EndpointSlices).
        let mut behind: HashMap<(&str, &str), BTreeSet<IpAddr>> = HashMap::new();
        let mut slice_ports: HashMap<(&str, &str), BTreeMap<&str, BTreeSet<u16>>> = HashMap::new();
        let mut slices_read: BTreeSet<(&str, &str)> = BTreeSet::new();
        for s in &snapshot.endpoint_slices {
            let k = (s.namespace.as_str(), s.service.as_str());
            slices_read.insert(k);
            behind
                .entry(k)
                .or_default()
                .extend(s.endpoints.iter().flat_map(|e| e.addresses.iter().copied()));
            for p in &s.ports {
                // A slice port carries the ServicePort's name ("" for an unnamed one).
                if let Some(port) = p.port {
                    slice_ports
                        .entry(k)
                        .or_default()
                        .entry(p.name.as_deref().unwrap_or(""))
                        .or_default()
                        .insert(port);
                }
            }
        }

        // Step 3: which user Services routes name (HTTPRoute and GRPCRoute, routes.md §1).
        let mut routed: BTreeSet<(&str, &str)> = BTreeSet::new();
        for r in &snapshot.http_routes {
            let refs = r.parents.iter().map(|p| &p.target).chain(
                r.rules
                    .iter()
                    .flat_map(|rule| rule.backends.iter().map(|b| &b.target)),
            );
            for t in refs.filter(|t| is_service_ref(t)) {
                let ns = t.namespace.as_deref().unwrap_or(&r.namespace);
                if let Some(s) = services.get(&(ns, t.name.as_str()))
                    && !s.generated
                    && !s.headless
                {
                    routed.insert((&s.namespace, &s.name));
                }
            }
        }

        // Sized for the larger of its two main sources (mesh services and Services, which mostly
        // name the same services): it grows once at most, retained entries aside.
        let mut names: HashMap<(&str, &str), NameEntry> =
            HashMap::with_capacity(self.services.len().max(snapshot.services.len()));
        // Mesh services.
        for (&(ns, svc), m) in &self.services {
            let own = own_ports(m);
            match services.get(&(ns, svc)) {
                Some(u) if !u.generated && routed.contains(&(ns, svc)) => {
                    // Built with the routed user Services below.
                }
                Some(u) if !u.generated => {
                    // meshOnly: the user Service's port map, M's own rows (§7.2, §9.3).
                    let ports =
                        user_ports(u, &slice_ports, |pod_port| match m.classes.get(&pod_port) {
                            Some(&c) => (
                                PortClass::Known(c),
                                m.endpoints
                                    .get(&pod_port)
                                    .cloned()
                                    .unwrap_or_else(|| Arc::from([])),
                            ),
                            None => (PortClass::None, Arc::from([])),
                        });
                    names.insert(
                        (ns, svc),
                        self.entry(m.key(ns, svc), NameKind::MeshOnly, ports, Some(own)),
                    );
                }
                _ => {
                    names.insert(
                        (ns, svc),
                        self.entry(m.key(ns, svc), NameKind::Generated, own, None),
                    );
                }
            }
        }
        // Routed user Services.
        for &(ns, name) in &routed {
            let Some(u) = services.get(&(ns, name)) else {
                continue;
            };
            let pods: Vec<&Served<'_>> = behind
                .get(&(ns, name))
                .into_iter()
                .flatten()
                .filter_map(|ip| self.by_address.get(ip))
                // Every row at a listed address, a contested one's claimants each: the hop to
                // the address is accepted only for the identity of the pod that holds it.
                .flatten()
                .filter_map(|(mns, msvc, row)| {
                    self.services
                        .get(&(*mns, *msvc))
                        .and_then(|m| m.rows.iter().find(|r| std::ptr::eq(r.row, *row)))
                })
                .collect();
            let known = slices_read.contains(&(ns, name)) && !pods.is_empty();
            let ports = user_ports(u, &slice_ports, |pod_port| {
                if !known {
                    return (PortClass::Unknown, Arc::from([]));
                }
                let mut tally = Tally::default();
                for r in &pods {
                    if let Some(&p) = r.protocols.get(&pod_port) {
                        tally.add(p);
                    }
                }
                match tally.winner() {
                    Some(w) => {
                        let eps: Vec<Endpoint> = pods
                            .iter()
                            .filter(|r| r.row.ready && r.protocols.get(&pod_port) == Some(&w))
                            .map(|r| r.endpoint.clone())
                            .collect();
                        (PortClass::Known(w), eps.into())
                    }
                    None => (PortClass::None, Arc::from([])),
                }
            });
            names.insert(
                (ns, name),
                self.entry(key(ns, name), NameKind::Routed, ports, None),
            );
        }
        // Unrelated user Services (and headless ones with no mesh service): a user Service of
        // the name makes its mesh-domain spelling (e), not (d) (addressing.md §4.3, §4.5).
        for s in snapshot.services.iter().filter(|s| !s.generated) {
            let k = (s.namespace.as_str(), s.name.as_str());
            names.entry(k).or_insert_with(|| {
                self.entry(key(k.0, k.1), NameKind::Unrelated, BTreeMap::new(), None)
            });
        }
        // Generated Services with no served row: cold, from their real ports (§9.3).
        for s in snapshot.services.iter().filter(|s| s.generated) {
            let k = (s.namespace.as_str(), s.name.as_str());
            if names.contains_key(&k) {
                continue;
            }
            let mut ports = BTreeMap::new();
            for p in &s.ports {
                if p.port == PROXY_PORT || p.port == LEGACY_PORT || is_reserved(u32::from(p.port)) {
                    continue;
                }
                let class = match (p.transport, p.app_protocol.as_deref()) {
                    (Transport::Udp, _) => PortProtocol::Udp,
                    (Transport::Tcp, Some("tcp")) => PortProtocol::Tcp,
                    (Transport::Tcp, Some("http")) => PortProtocol::Http,
                    _ => continue,
                };
                ports.insert(
                    p.port,
                    front(Some(p.port), PortClass::Known(class), Arc::from([])),
                );
            }
            names.insert(
                k,
                self.entry(key(k.0, k.1), NameKind::Generated, ports, None),
            );
        }
        // Retained HTTP entries (spec/model.md §10): kept empty with their names.
        for r in &snapshot.retained {
            let k = (r.namespace.as_str(), r.service.as_str());
            if self.services.contains_key(&k) {
                continue;
            }
            if let Some(user) = services.get(&k)
                && !user.generated
            {
                continue;
            }
            // spec/model.md §10: a generated Service with real ports is evidence of the
            // service's shape (the port is then cold or gone), and a retained entry is removed
            // at the end of its grace.
            if let Some(g) = services.get(&k)
                && g.ports
                    .iter()
                    .any(|p| p.port != PROXY_PORT && p.port != LEGACY_PORT)
            {
                continue;
            }
            if ctx.now_ms.saturating_sub(r.since_ms) >= GRACE_MS {
                continue;
            }
            let e = names.entry(k).or_insert_with(|| {
                self.entry(key(k.0, k.1), NameKind::Generated, BTreeMap::new(), None)
            });
            e.ports.entry(r.port).or_insert_with(|| {
                let mut f = front(
                    Some(r.port),
                    PortClass::Known(PortProtocol::Http),
                    Arc::from([]),
                );
                f.retained = true;
                f
            });
            e.known = true;
        }
        for e in names.values_mut() {
            e.line.ports = ports_line(&e.ports);
        }

        // Step 4: routes.
        let filters = self.mesh_filters();
        let statuses = self.attach_http_routes(&mut names, &services);
        let mut statuses = statuses;

        // Step 5: generated Services' ClusterIPs.
        let mut cluster_ips = HashMap::with_capacity(
            snapshot
                .services
                .iter()
                .filter(|s| s.generated && !s.headless)
                .map(|s| s.cluster_ips.len())
                .sum(),
        );
        let mut l4_status = Vec::new();
        let tls = self.l4_tables(
            &snapshot.tls_routes,
            "TLSRoute",
            &names,
            &services,
            &mut l4_status,
        );
        let tcp = self.l4_tables(
            &snapshot.tcp_routes,
            "TCPRoute",
            &names,
            &services,
            &mut l4_status,
        );
        let udp = self.l4_tables(
            &snapshot.udp_routes,
            "UDPRoute",
            &names,
            &services,
            &mut l4_status,
        );
        statuses.extend(l4_status);
        // Two generated Services that claim one ClusterIP (a registry written by hand): the
        // first by (namespace, name) has it, whatever order the source gave them in.
        let mut generated: Vec<&Service> = snapshot
            .services
            .iter()
            .filter(|s| s.generated && !s.headless)
            .collect();
        generated
            .sort_by(|a, b| named_order((&a.namespace, &a.name), (&b.namespace, &b.name), a, b));
        for s in generated {
            let k = (s.namespace.as_str(), s.name.as_str());
            let Some(entry) = names.get(&k) else { continue };
            if entry.kind != NameKind::Generated {
                continue;
            }
            let skey = entry.key.clone();
            let mut tcp_ports = BTreeMap::new();
            let mut http = BTreeSet::new();
            for (&p, f) in &entry.ports {
                match f.class {
                    PortClass::Known(PortProtocol::Tcp) => {
                        let choice = tcp
                            .get(&(k, Some(p)))
                            .or_else(|| tcp.get(&(k, None)))
                            .and_then(|rules| rules.first())
                            .map(|rule| rule.choice.clone())
                            .unwrap_or_else(|| default_tcp(&skey, p, p, f.endpoints.clone()));
                        tcp_ports.insert(p, choice);
                    }
                    PortClass::Known(PortProtocol::Http) => {
                        http.insert(p);
                    }
                    _ => {}
                }
            }
            let legacy = self
                .services
                .get(&k)
                .and_then(|m| m.legacy)
                .filter(|l| !is_reserved(u32::from(*l)))
                .and_then(|l| {
                    tcp_ports.get(&l).map(|_| {
                        default_tcp(&skey, LEGACY_PORT, l, entry.ports[&l].endpoints.clone())
                    })
                });
            let mut table = TlsTable::default();
            for ((tk, port), rules) in &tls {
                if *tk != k {
                    continue;
                }
                match port {
                    Some(p) => table
                        .by_port
                        .entry(*p)
                        .or_default()
                        .extend(rules.iter().cloned()),
                    None => table.any_port.extend(rules.iter().cloned()),
                }
            }
            // routes.md §9.3: one rule, one backend; several UDPRoutes on one parent, the first
            // by (namespace, name).
            let udp_choice = udp
                .get(&(k, None))
                .and_then(|rules| rules.first())
                .map(|r| r.choice.clone());
            let e = Arc::new(ClusterIpEntry {
                key: skey,
                tcp: tcp_ports,
                legacy,
                http,
                tls: table,
                udp: udp_choice,
            });
            for ip in &s.cluster_ips {
                cluster_ips.entry(*ip).or_insert_with(|| e.clone());
            }
        }

        // Pod IPs. The user Services each address backs (its EndpointSlices), for the filters
        // of deliveries that name no Service (model.md §12.5 item 2).
        let mut backs: HashMap<IpAddr, BTreeSet<ServiceKey>> = HashMap::new();
        for (&(ns, svc), ips) in &behind {
            for ip in ips {
                backs.entry(*ip).or_default().insert(key(ns, svc));
            }
        }
        let mut pod_ips = HashMap::with_capacity(self.by_address.len());
        for (&ip, claims) in &self.by_address {
            // Each claimant's row as served, with the ports it declares with its service's
            // winning protocol.
            let mut served_claims = Vec::with_capacity(claims.len());
            for &(ns, svc, row) in claims {
                let Some(m) = self.services.get(&(ns, svc)) else {
                    continue;
                };
                let Some(served) = m.rows.iter().find(|r| std::ptr::eq(r.row, row)) else {
                    continue;
                };
                // Filled by insertion: these maps hold a few ports, and `collect` into a
                // B-tree buffers and sorts its input first, which costs more than the inserts.
                let mut declared = BTreeMap::new();
                for (&p, &proto) in &served.protocols {
                    if m.classes.get(&p) == Some(&proto) {
                        declared.insert(p, proto);
                    }
                }
                served_claims.push((&served.endpoint, declared));
            }
            let Some((first, _)) = served_claims.first() else {
                continue;
            };
            let ep = (*first).clone();
            // Its own mesh service (every claimant's), then the user Services whose slices
            // hold the address.
            let guarded_by: Vec<ServiceKey> = served_claims
                .iter()
                .map(|(e, _)| e.mesh_service.clone())
                .chain(backs.get(&ip).into_iter().flatten().cloned())
                .fold(Vec::new(), |mut v, k| {
                    if !v.contains(&k) {
                        v.push(k);
                    }
                    v
                });
            let entry = if served_claims.len() == 1 {
                let declared = served_claims.pop().map(|(_, d)| d).unwrap_or_default();
                let tcp = declared
                    .iter()
                    .filter(|(_, proto)| **proto == PortProtocol::Tcp)
                    .map(|(&p, _)| (p, pod_tcp(&ep, p)))
                    .collect();
                PodIpEntry {
                    endpoint: ep,
                    declared,
                    tcp,
                    guarded_by: guarded_by.into(),
                    contested: None,
                }
            } else {
                // Every claimant's ports, so that plaintext to any of them is refused where
                // one claimant's protection asks it; no raw-TCP entry: a pod-IP dial to a
                // contested address is refused (issue #35 item 5).
                let mut declared = BTreeMap::new();
                for (_, d) in &served_claims {
                    for (&p, &proto) in d {
                        declared.entry(p).or_insert(proto);
                    }
                }
                let claims: Vec<Claim> = served_claims
                    .into_iter()
                    .map(|(e, d)| Claim {
                        service: e.mesh_service.clone(),
                        declared: d,
                    })
                    .collect();
                PodIpEntry {
                    endpoint: ep,
                    declared,
                    tcp: BTreeMap::new(),
                    guarded_by: guarded_by.into(),
                    contested: Some(claims.into()),
                }
            };
            pod_ips.insert(ip, Arc::new(entry));
        }

        self.ext_authz_on_tcp(&pod_ips, &filters);
        let l4 = l4::passthrough_targets(snapshot, &pod_ips);
        for p in &snapshot.pods {
            if let Some(v) = p.inbound_mode.as_deref()
                && v != "strict"
                && v != "permissive"
            {
                self.diagnostics.push(Diagnostic::new(
                    DiagnosticKind::InboundMode,
                    format!("{}/{}", p.namespace, p.name),
                    format!(
                        "inbound.aether.io/mode {v:?} is neither \"strict\" nor \"permissive\": the pod is strict"
                    ),
                ));
            }
        }
        // Sorted by reference (moving a whole pod is a copy of some hundred bytes), stably: of
        // two pods with one (namespace, name), the later in the input is the one kept.
        // A pod whose namespace, name or ServiceAccount Kubernetes would refuse is left out, with
        // a diagnostic: the node serves it not at all (its CNI ADD waits, error 11), never
        // uncaptured.
        let mut by_name: Vec<&crate::model::snapshot::Pod> =
            Vec::with_capacity(snapshot.pods.len());
        for p in &snapshot.pods {
            let why = crate::model::names::identity_problem(&p.namespace, &p.service_account)
                .or_else(|| {
                    (!crate::model::names::is_dns_subdomain(&p.name)).then(|| {
                        format!(
                            "pod name {:?} is not an RFC 1123 subdomain (lower case, digits, '-', '.', at most 253)",
                            p.name
                        )
                    })
                });
            match why {
                Some(why) => self.diagnostics.push(Diagnostic::new(
                    DiagnosticKind::InvalidName,
                    format!("{}/{}", p.namespace, p.name),
                    format!("{why}: the pod is not served"),
                )),
                None => by_name.push(p),
            }
        }
        by_name.sort_by(|a, b| named_order((&a.namespace, &a.name), (&b.namespace, &b.name), a, b));
        by_name.dedup_by(|later, earlier| {
            let same = (&later.namespace, &later.name) == (&earlier.namespace, &earlier.name);
            if same {
                *earlier = *later;
            }
            same
        });
        // Pods of one node whose `aether.io/netns` names one network namespace: none of them is
        // served (issue #35 item 5): one could be a document pointing at another pod's namespace,
        // and serving it would hand that namespace's capture to the wrong identity. (The node
        // also compares the namespaces themselves, which two names can share.)
        let mut netns_of: BTreeMap<(&str, &str), Vec<(&str, &str)>> = BTreeMap::new();
        for p in &by_name {
            if let (Some(node), Some(netns)) = (p.node.as_deref(), p.netns.as_deref())
                && !p.netns_from_cni
            {
                netns_of
                    .entry((node, netns))
                    .or_default()
                    .push((&p.namespace, &p.name));
            }
        }
        let mut shared_netns: BTreeSet<(&str, &str)> = BTreeSet::new();
        for ((node, netns), pods) in &netns_of {
            if pods.len() < 2 {
                continue;
            }
            let names: Vec<String> = pods.iter().map(|(ns, n)| format!("{ns}/{n}")).collect();
            for &(ns, n) in pods {
                shared_netns.insert((ns, n));
                self.diagnostics.push(Diagnostic::new(
                    DiagnosticKind::NetnsShared,
                    format!("{ns}/{n}"),
                    format!(
                        "aether.io/netns {netns:?} on {node} is named by {}: none of them is served",
                        names.join(", ")
                    ),
                ));
            }
        }
        by_name.retain(|p| !shared_netns.contains(&(p.namespace.as_str(), p.name.as_str())));
        let pods = by_name
            .into_iter()
            .map(|p| {
                let redirect_all = p.redirect_all.unwrap_or(ctx.capture_redirect_all_default);
                Arc::new(PodFacts {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    service_account: p.service_account.clone(),
                    ips: p.ips.clone(),
                    managed: p.managed && !ctx.ignored_namespaces.contains(&p.namespace),
                    capture: if redirect_all {
                        CaptureMode::RedirectAll
                    } else {
                        CaptureMode::Scoped
                    },
                    node: p.node.clone(),
                    netns: p.netns.clone(),
                    netns_from_cni: p.netns_from_cni,
                    exclude_outbound_ports: p.exclude_outbound_ports.clone(),
                    exclude_outbound_ip_ranges: p.exclude_outbound_ip_ranges.clone(),
                    inbound: inbound_facts(p, ctx, &pod_ips, &filters),
                })
            })
            .collect();

        Entries {
            names: {
                // Keyed by the borrowed namespace while filling: one key allocated per namespace.
                let mut by_ns: HashMap<&str, HashMap<Box<str>, Arc<NameEntry>>> = HashMap::new();
                for ((ns, n), e) in names {
                    by_ns.entry(ns).or_default().insert(n.into(), Arc::new(e));
                }
                by_ns.into_iter().map(|(ns, t)| (ns.into(), t)).collect()
            },
            cluster_ips,
            l4,
            pod_ips,
            pods,
            service_filters: filters,
            classes: self.classes,
            statuses,
            diagnostics: self.diagnostics,
        }
    }

    /// The entry of `key`: a mesh service's own key is passed in, so that the model shares its
    /// strings instead of holding another copy.
    fn entry(
        &self,
        key: ServiceKey,
        kind: NameKind,
        ports: BTreeMap<u16, FrontPort>,
        own_ports: Option<BTreeMap<u16, FrontPort>>,
    ) -> NameEntry {
        NameEntry {
            line: ServiceLine {
                name: mesh_name(&key.name, &key.namespace, &self.ctx.domains).into(),
                ports: Arc::from(""),
            },
            key,
            kind,
            known: !ports.is_empty(),
            ports,
            own_ports,
        }
    }

    /// model.md §12.5 item 2: `ext_authz` is defined per HTTP request, so a byte stream to a
    /// raw-TCP port of a pod it guards is refused. Said once per filter and Service, with the
    /// ports, so that the refusal is not a surprise at run time.
    fn ext_authz_on_tcp(
        &mut self,
        pod_ips: &HashMap<IpAddr, Arc<PodIpEntry>>,
        filters: &BTreeMap<ServiceKey, Arc<[NamedFilter]>>,
    ) {
        let mut refused: BTreeMap<(&str, &ServiceKey), BTreeSet<u16>> = BTreeMap::new();
        for entry in pod_ips.values() {
            let tcp: Vec<u16> = entry
                .declared
                .iter()
                .filter(|(_, p)| **p == PortProtocol::Tcp)
                .map(|(&p, _)| p)
                .collect();
            if tcp.is_empty() {
                continue;
            }
            for k in entry.guarded_by.iter() {
                for f in filters.get(k).into_iter().flat_map(|fs| fs.iter()) {
                    if matches!(f.config, FilterConfig::ExtAuthz(_)) {
                        refused
                            .entry((f.name.as_str(), k))
                            .or_default()
                            .extend(tcp.iter().copied());
                    }
                }
            }
        }
        for ((filter, service), ports) in refused {
            let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
            self.diagnostics.push(Diagnostic::new(
                DiagnosticKind::ExtAuthzOnTcp,
                filter,
                format!(
                    "ext_authz applies per HTTP request: connections to the raw-TCP port(s) {} of the pods {service} guards are refused (model.md §12.5 item 2)",
                    ports.join(", ")
                ),
            ));
        }
    }

    /// Service-level filters by the Service they target; route-level ones are read by name.
    /// A filter that could not be read (issue #35 item 1) targets what it names, or, when not
    /// even its targets could be read, every Service and mesh service of its namespace; each is
    /// a diagnostic that names what it refuses.
    fn mesh_filters(&mut self) -> BTreeMap<ServiceKey, Arc<[NamedFilter]>> {
        let mut out: BTreeMap<ServiceKey, Vec<NamedFilter>> = BTreeMap::new();
        let mut filters: Vec<_> = self.snapshot.mesh_filters.iter().collect();
        filters.sort_by(|a, b| named_order((&a.namespace, &a.name), (&b.namespace, &b.name), a, b));
        for f in filters {
            let named = format!("{}/{}", f.namespace, f.name);
            let targets: Vec<&str> = match &f.config {
                FilterConfig::Unreadable(u) if u.whole_namespace => {
                    let mut all: BTreeSet<&str> = self
                        .services
                        .keys()
                        .filter(|(ns, _)| *ns == f.namespace)
                        .map(|&(_, svc)| svc)
                        .chain(
                            self.snapshot
                                .services
                                .iter()
                                .filter(|s| s.namespace == f.namespace)
                                .map(|s| s.name.as_str()),
                        )
                        .collect();
                    all.extend(f.target_refs.iter().map(String::as_str));
                    all.into_iter().collect()
                }
                _ => f.target_refs.iter().map(String::as_str).collect(),
            };
            if let FilterConfig::Unreadable(u) = &f.config {
                let refused = if u.whole_namespace {
                    format!(
                        "its targets cannot be read either, so every Service of namespace {} refuses ({})",
                        f.namespace,
                        targets.join(", ")
                    )
                } else {
                    format!("the Services it names refuse: {}", targets.join(", "))
                };
                self.diagnostics.push(Diagnostic::new(
                    DiagnosticKind::FilterUnreadable,
                    named.clone(),
                    format!(
                        "{}; until it is fixed every request to them is answered 403 authz-unavailable, every byte stream to their pods is closed and plaintext to their pods is refused; {refused}",
                        u.why
                    ),
                ));
            }
            for target in targets {
                out.entry(key(&f.namespace, target))
                    .or_default()
                    .push(NamedFilter {
                        name: named.clone(),
                        config: f.config.clone(),
                    });
            }
        }
        out.into_iter().map(|(k, v)| (k, v.into())).collect()
    }
}

/// A total order on rows: identity first, then every other field.
fn row_order(a: &Row, b: &Row) -> std::cmp::Ordering {
    fn value(v: &ProtocolValue) -> (u8, Option<PortProtocol>, &str) {
        match v {
            ProtocolValue::Known(p) => (0, Some(*p), ""),
            ProtocolValue::Unspecified => (1, None, ""),
            ProtocolValue::Unknown(s) => (2, None, s),
        }
    }
    (&a.namespace, &a.service, a.address, &a.pod)
        .cmp(&(&b.namespace, &b.service, b.address, &b.pod))
        .then_with(|| (&a.node, a.ready, a.port).cmp(&(&b.node, b.ready, b.port)))
        .then_with(|| {
            // The listed ports as a set: their order carries no meaning.
            let sorted = |r: &Row| {
                let mut v = r.ports.clone();
                v.sort_unstable();
                v
            };
            sorted(a).cmp(&sorted(b))
        })
        .then_with(|| match (&a.port_protocols, &b.port_protocols) {
            (None, None) => std::cmp::Ordering::Equal,
            (None, Some(_)) => std::cmp::Ordering::Less,
            (Some(_), None) => std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => x
                .iter()
                .map(|(k, v)| (*k, value(v)))
                .cmp(y.iter().map(|(k, v)| (*k, value(v)))),
        })
}

fn front(pod_port: Option<u16>, class: PortClass, endpoints: Arc<[Endpoint]>) -> FrontPort {
    FrontPort {
        pod_port,
        class,
        endpoints,
        routes: None,
        h2c: false,
        retained: false,
    }
}

/// A mesh service's own ports: pod port = front port, its one-truth class.
fn own_ports(m: &MeshService<'_>) -> BTreeMap<u16, FrontPort> {
    // Inserted one by one, as the pod-IP entries' maps: a service has a few ports.
    let mut out = BTreeMap::new();
    for (&p, &c) in &m.classes {
        let endpoints = m
            .endpoints
            .get(&p)
            .cloned()
            .unwrap_or_else(|| Arc::from([]));
        out.insert(p, front(Some(p), PortClass::Known(c), endpoints));
    }
    out
}

/// A user Service's front ports through its port map (spec/model.md §9.2). `class_of` gives the
/// class and endpoints of a resolved pod port.
fn user_ports(
    u: &Service,
    slice_ports: &HashMap<(&str, &str), BTreeMap<&str, BTreeSet<u16>>>,
    class_of: impl Fn(u16) -> (PortClass, Arc<[Endpoint]>),
) -> BTreeMap<u16, FrontPort> {
    let mut out = BTreeMap::new();
    let mut ports: Vec<_> = u.ports.iter().collect();
    // TCP entries first: a UDP entry only fills a number the Service has no TCP entry for.
    ports.sort_by_key(|p| (p.transport != Transport::Tcp, p.port));
    for p in ports {
        if p.transport == Transport::Sctp || out.contains_key(&p.port) {
            continue;
        }
        if p.transport == Transport::Udp {
            out.insert(
                p.port,
                front(None, PortClass::Known(PortProtocol::Udp), Arc::from([])),
            );
            continue;
        }
        let pod_port = match &p.target {
            TargetPort::Same => Some(p.port),
            TargetPort::Number(n) => Some(*n),
            // spec/model.md §9.2: the slice port that carries the ServicePort's name gives the
            // number of a named targetPort.
            TargetPort::Name(_) => slice_ports
                .get(&(u.namespace.as_str(), u.name.as_str()))
                .and_then(|m| m.get(p.name.as_deref().unwrap_or("")))
                .filter(|nums| nums.len() == 1)
                .and_then(|nums| nums.first().copied()),
        };
        let mut f = match pod_port {
            Some(pp) => {
                let (class, eps) = class_of(pp);
                front(Some(pp), class, eps)
            }
            None => front(None, PortClass::None, Arc::from([])),
        };
        f.h2c = p.app_protocol.as_deref() == Some(H2C);
        out.insert(p.port, f);
    }
    out
}

/// The `ports:` line of a refusal body (addressing.md §11.2).
fn ports_line(ports: &BTreeMap<u16, FrontPort>) -> Arc<str> {
    // Written into one buffer: the `format!` of each port alone cost some 900 instructions
    // (callgrind, docs/performance.md), and a join followed.
    let mut line = String::with_capacity(ports.len() * 10);
    for (&p, f) in ports {
        if is_reserved(u32::from(p)) {
            continue;
        }
        let Some(class) = f.class.listed_as() else {
            continue;
        };
        if !line.is_empty() {
            line.push(' ');
        }
        push_decimal(&mut line, p);
        line.push('/');
        line.push_str(class);
    }
    line.into()
}

/// Raw TCP to one pod's port, for a pod-IP dial (addressing.md §3 step 0).
fn pod_tcp(ep: &Endpoint, port: u16) -> TcpChoice {
    TcpChoice {
        backends: vec![(
            1,
            TcpBackend::Target(TcpTarget {
                service: ep.mesh_service.clone(),
                port,
                pod_port: port,
                endpoints: Arc::from([ep.clone()]),
                why: Why::new(
                    "addressing.md §3 step 0",
                    "a pod-IP dial to a port the pod declares raw TCP: that pod, at once",
                ),
            }),
        )]
        .into(),
    }
}

fn default_tcp(
    service: &ServiceKey,
    port: u16,
    pod_port: u16,
    endpoints: Arc<[Endpoint]>,
) -> TcpChoice {
    TcpChoice {
        backends: vec![(
            1,
            TcpBackend::Target(TcpTarget {
                service: service.clone(),
                port,
                pod_port,
                endpoints,
                why: Why::new(
                    "addressing.md §3 step 1",
                    format!("{service} declares {pod_port}/tcp"),
                ),
            }),
        )]
        .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_number_is_spelled_as_display_spells_it() {
        for n in [0u16, 7, 10, 80, 443, 8080, 9999, 10000, 15001, 65535] {
            let mut s = String::from("x");
            push_decimal(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
    }

    #[test]
    fn pods_are_found_by_name_whatever_the_input_order_and_a_repeated_name_keeps_one_by_content() {
        let mut s = crate::model::synth::scaled(30);
        s.pods.reverse();
        let mut again = (*s.pods[4]).clone();
        again.service_account = "zz-other".into();
        let (ns, name) = (again.namespace.clone(), again.name.clone());
        s.pods.push(Arc::new(again));
        let m = compile(&s, &NodeContext::default());
        assert_eq!(m.pods().count(), 60);
        let names: Vec<(&str, &str)> = m
            .pods()
            .map(|p| (p.namespace.as_str(), p.name.as_str()))
            .collect();
        assert!(names.windows(2).all(|w| w[0] < w[1]), "{names:?}");
        for p in &s.pods {
            let found = m.pod(&p.namespace, &p.name).expect("every pod is found");
            assert_eq!(found.ips, p.ips);
        }
        // Of two pods of one name, the one `named_order` puts last, wherever the source put
        // it: the kept model (issue #37) compiles a component in an order of its own.
        let kept = |m: &Model| m.pod(&ns, &name).map(|p| p.service_account.clone());
        assert_eq!(kept(&m).as_deref(), Some("zz-other"));
        s.pods.rotate_right(1);
        assert_eq!(
            kept(&compile(&s, &NodeContext::default())).as_deref(),
            Some("zz-other")
        );
        assert!(m.pod("ns-0", "svc-0-9").is_none());
        assert!(m.pod("ns-99", "svc-0-0").is_none());
    }

    #[test]
    fn the_ports_line_lists_known_and_unknown_ports_ascending_and_skips_the_rest() {
        let known = |p: u16, proto| front(Some(p), PortClass::Known(proto), Arc::from([]));
        let ports = BTreeMap::from([
            (9090, known(9090, PortProtocol::Tcp)),
            (80, known(80, PortProtocol::Http)),
            (81, front(None, PortClass::None, Arc::from([]))),
            (82, front(None, PortClass::Unknown, Arc::from([]))),
            (PROXY_PORT, known(PROXY_PORT, PortProtocol::Http)),
        ]);
        assert_eq!(&*ports_line(&ports), "80/http 82/unknown 9090/tcp");
        assert_eq!(&*ports_line(&BTreeMap::new()), "");
    }
}
