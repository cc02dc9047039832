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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use crate::model::attach::{
    AttachedRoute, CompiledBackend, CompiledRule, Condition, InvalidRef, PortRoutes, RefReason,
    RouteStatus, RuleSet, TlsRule, TlsTable, describe_parent,
};
use crate::model::diag::{Diagnostic, DiagnosticKind};
use crate::model::names::mesh_name;
use crate::model::port::{
    LEGACY_PORT, PROXY_PORT, PortClass, PortProtocol, Transport, is_reserved,
};
use crate::model::retention::GRACE_MS;
use crate::model::route_match::{RouteInput, RouteTable};
use crate::model::rows::{row_problem, served_protocols};
use crate::model::snapshot::{
    FilterConfig, HttpFilter, HttpRoute, HttpRouteKind, L4Route, ObjectRef, ParentRef,
    ProtocolValue, Row, Service, Snapshot, TargetPort,
};
use crate::model::vote::{Tally, legacy_target, vote};
use crate::model::{
    ClusterIpEntry, FrontPort, Model, NameEntry, NameKind, NamedFilter, NodeContext, PodFacts,
    PodIpEntry,
};
use crate::resolve::answer::ServiceLine;
use crate::resolve::decision::{
    CaptureMode, Endpoint, HttpBackend, ServiceKey, TcpBackend, TcpChoice, TcpTarget, Why,
};

const H2C: &str = "kubernetes.io/h2c";

/// A backendRef resolved to a front port of its Service.
struct BackendPort<'n> {
    service: ServiceKey,
    port: u16,
    pod_port: u16,
    front: &'n FrontPort,
}

impl BackendPort<'_> {
    /// The reference is invalid for the class of its pod port (routes.md §3).
    fn wrong_class(&self, class: PortClass) -> InvalidRef {
        let (svc, port, pod_port) = (&self.service, self.port, self.pod_port);
        match class {
            PortClass::Known(c) => InvalidRef {
                reason: RefReason::UnsupportedProtocol,
                message: format!("Service {svc} port {port}: pod port {pod_port} is {c}"),
            },
            PortClass::None | PortClass::Unknown => InvalidRef {
                reason: RefReason::BackendNotFound,
                message: format!("Service {svc} port {port}: no pod declares pod port {pod_port}"),
            },
        }
    }
}

/// One served row, its ports read (reserved ports left out).
#[derive(Debug)]
struct Served<'s> {
    row: &'s Row,
    protocols: BTreeMap<u16, PortProtocol>,
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

fn key(ns: &str, name: &str) -> ServiceKey {
    ServiceKey {
        namespace: ns.into(),
        name: name.into(),
    }
}

fn is_service_ref(r: &ObjectRef) -> bool {
    (r.group.is_empty() || r.group == "core") && r.kind == "Service"
}

/// Compiles a snapshot into a model: deterministic and independent of input order.
pub fn compile(snapshot: &Snapshot, ctx: &NodeContext) -> Model {
    let mut c = Compiler {
        snapshot,
        ctx,
        diagnostics: Vec::new(),
        services: HashMap::new(),
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
    /// Served rows by pod address: (mesh service, protocols, row).
    by_address: BTreeMap<IpAddr, (&'s str, &'s str, &'s Row)>,
}

impl<'s> Compiler<'s> {
    /// Step 1 and 2: served rows, votes, endpoints.
    fn serve_rows(&mut self) {
        let mut rows: Vec<&Row> = self.snapshot.rows.iter().collect();
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
        let mut seen: BTreeSet<(&str, &str, IpAddr)> = BTreeSet::new();
        let mut nodes: BTreeMap<&str, Arc<str>> = BTreeMap::new();
        for row in rows {
            if let Some(problem) = row_problem(row) {
                self.diagnostics.push(Diagnostic::new(
                    DiagnosticKind::RowRefused,
                    format!("{}/{} {}", row.namespace, row.service, row.address),
                    problem.as_str(),
                ));
                continue;
            }
            if !seen.insert((&row.namespace, &row.service, row.address)) {
                // A consumer de-duplicates rows per (namespace, service, address) (§3.4).
                continue;
            }
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
            match self.by_address.get(&row.address) {
                Some((ns, svc, _)) => self.diagnostics.push(Diagnostic::new(
                    DiagnosticKind::DuplicateAddress,
                    row.address.to_string(),
                    format!(
                        "already a row of {ns}/{svc}; {}/{} ignored for pod-IP dials",
                        row.namespace, row.service
                    ),
                )),
                None => {
                    self.by_address
                        .insert(row.address, (&row.namespace, &row.service, row));
                }
            }
            let m = self
                .services
                .entry((&row.namespace, &row.service))
                .or_default();
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
        for ((ns, svc), m) in &mut self.services {
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
    }

    fn finish(mut self) -> Model {
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

        let mut names: HashMap<(&str, &str), NameEntry> = HashMap::new();
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
                        self.entry(ns, svc, NameKind::MeshOnly, ports, Some(own)),
                    );
                }
                _ => {
                    names.insert(
                        (ns, svc),
                        self.entry(ns, svc, NameKind::Generated, own, None),
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
                self.entry(ns, name, NameKind::Routed, ports, None),
            );
        }
        // Unrelated user Services (and headless ones with no mesh service): a user Service of
        // the name makes its mesh-domain spelling (e), not (d) (addressing.md §4.3, §4.5).
        for s in snapshot.services.iter().filter(|s| !s.generated) {
            let k = (s.namespace.as_str(), s.name.as_str());
            names.entry(k).or_insert_with(|| {
                self.entry(k.0, k.1, NameKind::Unrelated, BTreeMap::new(), None)
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
            names.insert(k, self.entry(k.0, k.1, NameKind::Generated, ports, None));
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
                self.entry(k.0, k.1, NameKind::Generated, BTreeMap::new(), None)
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
        let mut cluster_ips = HashMap::new();
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
        for s in snapshot
            .services
            .iter()
            .filter(|s| s.generated && !s.headless)
        {
            let k = (s.namespace.as_str(), s.name.as_str());
            let Some(entry) = names.get(&k) else { continue };
            if entry.kind != NameKind::Generated {
                continue;
            }
            let skey = key(k.0, k.1);
            let mut tcp_ports = BTreeMap::new();
            let mut http = BTreeSet::new();
            for (&p, f) in &entry.ports {
                match f.class {
                    PortClass::Known(PortProtocol::Tcp) => {
                        let choice = tcp
                            .get(&(k, Some(p)))
                            .or_else(|| tcp.get(&(k, None)))
                            .map(|rules| rules[0].choice.clone())
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
                cluster_ips.insert(*ip, e.clone());
            }
        }

        // Pod IPs.
        let mut pod_ips = HashMap::new();
        for (&ip, &(ns, svc, row)) in &self.by_address {
            let Some(m) = self.services.get(&(ns, svc)) else {
                continue;
            };
            let Some(served) = m.rows.iter().find(|r| std::ptr::eq(r.row, row)) else {
                continue;
            };
            let declared: BTreeMap<u16, PortProtocol> = served
                .protocols
                .iter()
                .filter(|(p, proto)| m.classes.get(p) == Some(proto))
                .map(|(&p, &proto)| (p, proto))
                .collect();
            let ep = served.endpoint.clone();
            let tcp = declared
                .iter()
                .filter(|(_, proto)| **proto == PortProtocol::Tcp)
                .map(|(&p, _)| (p, pod_tcp(&ep, p)))
                .collect();
            pod_ips.insert(
                ip,
                Arc::new(PodIpEntry {
                    endpoint: ep,
                    declared,
                    tcp,
                }),
            );
        }

        let pods = snapshot
            .pods
            .iter()
            .map(|p| {
                let redirect_all = p.redirect_all.unwrap_or(ctx.capture_redirect_all_default);
                (
                    (p.namespace.clone(), p.name.clone()),
                    PodFacts {
                        namespace: p.namespace.clone(),
                        name: p.name.clone(),
                        service_account: p.service_account.clone(),
                        ips: p.ips.clone(),
                        managed: p.managed,
                        capture: if redirect_all {
                            CaptureMode::RedirectAll
                        } else {
                            CaptureMode::Scoped
                        },
                        node: p.node.clone(),
                    },
                )
            })
            .collect();
        let classes = self
            .services
            .iter()
            .map(|(&(ns, svc), m)| (key(ns, svc), m.classes.clone()))
            .collect();

        let mut diagnostics = self.diagnostics;
        diagnostics.sort();
        diagnostics.dedup();
        statuses.sort();
        Model {
            context: ctx.clone(),
            names: {
                let mut by_ns: HashMap<Box<str>, HashMap<Box<str>, Arc<NameEntry>>> =
                    HashMap::new();
                for ((ns, n), e) in names {
                    by_ns
                        .entry(ns.into())
                        .or_default()
                        .insert(n.into(), Arc::new(e));
                }
                by_ns
            },
            cluster_ips,
            pod_ips,
            pods,
            service_filters: filters,
            classes,
            statuses,
            diagnostics,
        }
    }

    fn entry(
        &self,
        ns: &str,
        name: &str,
        kind: NameKind,
        ports: BTreeMap<u16, FrontPort>,
        own_ports: Option<BTreeMap<u16, FrontPort>>,
    ) -> NameEntry {
        NameEntry {
            key: key(ns, name),
            line: ServiceLine {
                name: mesh_name(name, ns, &self.ctx.domains).into(),
                ports: Arc::from(""),
            },
            kind,
            known: !ports.is_empty(),
            ports,
            own_ports,
        }
    }

    /// Service-level filters by the Service they target; route-level ones are read by name.
    fn mesh_filters(&mut self) -> BTreeMap<ServiceKey, Arc<[NamedFilter]>> {
        let mut out: BTreeMap<ServiceKey, Vec<NamedFilter>> = BTreeMap::new();
        let mut filters: Vec<_> = self.snapshot.mesh_filters.iter().collect();
        filters.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        for f in filters {
            for target in &f.target_refs {
                out.entry(key(&f.namespace, target))
                    .or_default()
                    .push(NamedFilter {
                        name: format!("{}/{}", f.namespace, f.name),
                        config: f.config.clone(),
                    });
            }
        }
        out.into_iter().map(|(k, v)| (k, v.into())).collect()
    }

    fn extension(&mut self, route_ns: &str, r: &ObjectRef) -> Option<(String, FilterConfig)> {
        let ns = r.namespace.as_deref().unwrap_or(route_ns);
        let found = self
            .snapshot
            .mesh_filters
            .iter()
            .find(|f| f.namespace == ns && f.name == r.name && r.kind == "MeshFilter");
        found.map(|f| (format!("{}/{}", f.namespace, f.name), f.config.clone()))
    }

    /// Whether a reference from `from_ns` (of kind `from_kind`) to a Service in `to_ns` is
    /// permitted (same namespace, or a ReferenceGrant).
    fn permitted(&self, from_kind: &str, from_ns: &str, to_ns: &str, to_name: &str) -> bool {
        from_ns == to_ns
            || self.snapshot.reference_grants.iter().any(|g| {
                g.namespace == to_ns
                    && g.from.iter().any(|(grp, kind, ns)| {
                        grp == "gateway.networking.k8s.io" && kind == from_kind && ns == from_ns
                    })
                    && g.to.iter().any(|(grp, kind, name)| {
                        grp.is_empty()
                            && kind == "Service"
                            && name.as_deref().is_none_or(|n| n == to_name)
                    })
            })
    }

    /// Resolves a backendRef to its Service's front port, strictly (routes.md §3): the kind,
    /// the ReferenceGrant, the port, the port map. The class check is the caller's, since HTTP
    /// and L4 routes want different classes.
    #[allow(clippy::too_many_arguments)] // One call per route kind; every argument is a fact of the ref.
    fn backend_port<'n>(
        &self,
        route_kind: &str,
        route_ns: &'n str,
        target: &'n ObjectRef,
        port: Option<u16>,
        names: &'n HashMap<(&str, &str), NameEntry>,
        services: &HashMap<(&str, &str), &Service>,
    ) -> Result<BackendPort<'n>, InvalidRef> {
        let invalid = |reason, message: String| Err(InvalidRef { reason, message });
        if !is_service_ref(target) {
            return invalid(
                RefReason::InvalidKind,
                format!(
                    "backendRef {}/{} is not a Service",
                    target.group, target.kind
                ),
            );
        }
        let ns = target.namespace.as_deref().unwrap_or(route_ns);
        if !self.permitted(route_kind, route_ns, ns, &target.name) {
            return invalid(
                RefReason::RefNotPermitted,
                format!(
                    "Service {ns}/{} is in another namespace and no ReferenceGrant allows it",
                    target.name
                ),
            );
        }
        let svc = format!("{ns}/{}", target.name);
        let Some(port) = port else {
            return invalid(
                RefReason::BackendNotFound,
                format!("Service {svc}: backendRef has no port"),
            );
        };
        // The ports of the backend as a Service: a generated Service's are its mesh service's
        // ports; a user Service's are its front ports through its port map.
        let Some(entry) = names.get(&(ns, target.name.as_str())) else {
            return invalid(
                RefReason::BackendNotFound,
                format!(
                    "Service {svc} port {port}: the Service does not exist or has no such port"
                ),
            );
        };
        let ports = match entry.kind {
            NameKind::MeshOnly => entry.own_ports.as_ref().unwrap_or(&entry.ports),
            NameKind::Generated | NameKind::Routed | NameKind::Unrelated => &entry.ports,
        };
        let Some(front) = ports.get(&port) else {
            return invalid(
                RefReason::BackendNotFound,
                format!("Service {svc} port {port}: not a port of the Service"),
            );
        };
        let Some(pod_port) = front.pod_port else {
            let name = services
                .get(&(ns, target.name.as_str()))
                .and_then(|s| s.ports.iter().find(|p| p.port == port))
                .and_then(|p| match &p.target {
                    TargetPort::Name(n) => Some(n.clone()),
                    TargetPort::Same | TargetPort::Number(_) => None,
                })
                .unwrap_or_default();
            return invalid(
                RefReason::BackendNotFound,
                format!("Service {svc} port {port}: targetPort {name:?} does not resolve"),
            );
        };
        Ok(BackendPort {
            service: key(ns, &target.name),
            port,
            pod_port,
            front,
        })
    }

    /// Resolves one HTTP backendRef strictly (routes.md §3): the pod port must be HTTP, or
    /// unknown because no node can know.
    fn http_backend(
        &self,
        route: &HttpRoute,
        target: &ObjectRef,
        port: Option<u16>,
        names: &HashMap<(&str, &str), NameEntry>,
        services: &HashMap<(&str, &str), &Service>,
    ) -> Result<HttpBackend, InvalidRef> {
        let kind = match route.kind {
            HttpRouteKind::Http => "HTTPRoute",
            HttpRouteKind::Grpc => "GRPCRoute",
        };
        let b = self.backend_port(kind, &route.namespace, target, port, names, services)?;
        match b.front.class {
            PortClass::Known(PortProtocol::Http) | PortClass::Unknown => Ok(HttpBackend {
                port: Some(b.port),
                pod_port: b.pod_port,
                endpoints: b.front.endpoints.clone(),
                h2c: b.front.h2c,
                service: b.service,
            }),
            other => Err(b.wrong_class(other)),
        }
    }

    /// The `gateway.aether.io/PodPortsJudged` condition (routes.md §6.3): one verdict per
    /// (Service, Service port, pod port) of the route's backendRefs that this node can judge.
    fn pod_ports_judged(
        &self,
        route: &HttpRoute,
        names: &HashMap<(&str, &str), NameEntry>,
    ) -> Condition {
        let mut verdicts = BTreeSet::new();
        for b in route.rules.iter().flat_map(|r| r.backends.iter()) {
            if !is_service_ref(&b.target) {
                continue;
            }
            let ns = b.target.namespace.as_deref().unwrap_or(&route.namespace);
            let Some(port) = b.port else { continue };
            let Some(e) = names.get(&(ns, b.target.name.as_str())) else {
                continue;
            };
            let ports = match e.kind {
                NameKind::MeshOnly => e.own_ports.as_ref().unwrap_or(&e.ports),
                NameKind::Generated | NameKind::Routed | NameKind::Unrelated => &e.ports,
            };
            let Some(f) = ports.get(&port) else {
                // A generated Service's port is its pod port: no served row declares it.
                if e.kind == NameKind::Generated
                    && self.services.contains_key(&(ns, b.target.name.as_str()))
                {
                    verdicts.insert(format!("{ns}/{}:{port}->{port}=none", b.target.name));
                }
                continue;
            };
            let (Some(pod_port), Some(verdict)) = (
                f.pod_port,
                match f.class {
                    PortClass::Known(p) => Some(p.as_str()),
                    PortClass::None => Some("none"),
                    PortClass::Unknown => None,
                },
            ) else {
                continue;
            };
            verdicts.insert(format!(
                "{ns}/{}:{port}->{pod_port}={verdict}",
                b.target.name
            ));
        }
        const TYPE: &str = "gateway.aether.io/PodPortsJudged";
        if verdicts.is_empty() {
            return cond(TYPE, "Unknown", "NotChecked", String::new());
        }
        let all_http = verdicts.iter().all(|v| v.ends_with("=http"));
        let message = verdicts.into_iter().collect::<Vec<_>>().join("; ");
        if all_http {
            cond(TYPE, "True", "PodPortsHTTP", message)
        } else {
            cond(TYPE, "False", "PodPortNotHTTP", message)
        }
    }

    /// Attaches HTTPRoutes and GRPCRoutes to their parents' ports (routes.md §2) and returns
    /// their status entries.
    fn attach_http_routes(
        &mut self,
        names: &mut HashMap<(&'s str, &'s str), NameEntry>,
        services: &HashMap<(&str, &str), &Service>,
    ) -> Vec<RouteStatus> {
        let mut routes: Vec<&HttpRoute> = self.snapshot.http_routes.iter().collect();
        routes
            .sort_by(|a, b| (&a.namespace, &a.name, a.kind).cmp(&(&b.namespace, &b.name, b.kind)));
        // (parent ns, parent name, port, audience) -> routes, in sorted order.
        type Audience = Option<Arc<str>>;
        type Attached<'r> = Vec<(&'r HttpRoute, AttachedRoute)>;
        let mut attached: BTreeMap<((&str, &str), u16, Audience), Attached<'_>> = BTreeMap::new();
        let mut statuses = Vec::new();
        for route in routes {
            let kind = match route.kind {
                HttpRouteKind::Http => "HTTPRoute",
                HttpRouteKind::Grpc => "GRPCRoute",
            };
            // Backends and filters, compiled once per route.
            let rules: Vec<CompiledRule> = route
                .rules
                .iter()
                .map(|rule| {
                    let mut extension_filters = Vec::new();
                    let check = crate::model::filters::check_rule(rule);
                    let mut unsupported = (!check.faults.is_empty()).then(|| {
                        check
                            .faults
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join("; ")
                    });
                    for f in &rule.filters {
                        match f {
                            HttpFilter::ExtensionRef(r) => {
                                match self.extension(&route.namespace, r) {
                                    Some(x) => extension_filters.push(x),
                                    None => {
                                        unsupported = Some(format!(
                                            "ExtensionRef {}/{} not found",
                                            r.kind, r.name
                                        ))
                                    }
                                }
                            }
                            HttpFilter::Unsupported(t) => {
                                unsupported = Some(format!("filter {t} is not supported"))
                            }
                            _ => {}
                        }
                    }
                    CompiledRule {
                        source: rule.clone(),
                        name: rule.name.as_deref().map(Arc::from),
                        filters: rule.filters.clone(),
                        extension_filters,
                        backends: rule
                            .backends
                            .iter()
                            .map(|b| CompiledBackend {
                                weight: b.weight,
                                target: self
                                    .http_backend(route, &b.target, b.port, names, services),
                                filters: b.filters.clone(),
                            })
                            .collect(),
                        timeout_ms: rule.request_timeout_ms,
                        unsupported,
                    }
                })
                .collect();
            let refs = resolved_refs_condition(&rules);
            let judged = self.pod_ports_judged(route, names);
            let compiled = AttachedRoute {
                kind: route.kind,
                namespace: route.namespace.as_str().into(),
                name: route.name.as_str().into(),
                rules,
            };
            for parent in &route.parents {
                let accepted = if is_service_ref(&parent.target) {
                    let ns = parent
                        .target
                        .namespace
                        .as_deref()
                        .unwrap_or(&route.namespace);
                    match (
                        services.get(&(ns, parent.target.name.as_str())),
                        names.get_key_value(&(ns, parent.target.name.as_str())),
                    ) {
                        (Some(s), _) if s.headless => {
                            Err("the parent Service is headless".to_owned())
                        }
                        (s, Some((&k, e))) => match attach_ports(e, s.copied(), parent) {
                            Ok(ports) => {
                                let audience: Audience = (ns != route.namespace)
                                    .then(|| Arc::from(route.namespace.as_str()));
                                for p in ports {
                                    attached
                                        .entry((k, p, audience.clone()))
                                        .or_default()
                                        .push((route, compiled.clone()));
                                }
                                Ok(())
                            }
                            Err(e) => Err(e),
                        },
                        _ => Err(format!(
                            "Service {ns}/{} does not exist",
                            parent.target.name
                        )),
                    }
                } else {
                    Err(format!(
                        "parent {}/{} is not a Service",
                        parent.target.group, parent.target.kind
                    ))
                };
                statuses.push(RouteStatus {
                    kind: kind.to_owned(),
                    namespace: route.namespace.clone(),
                    name: route.name.clone(),
                    generation: route.generation,
                    parent: describe_parent(&route.namespace, parent),
                    conditions: vec![accepted_condition(accepted), refs.clone(), judged.clone()],
                });
            }
        }
        for ((k, port, audience), list) in attached {
            let inputs: Vec<RouteInput<'_>> = list
                .iter()
                .map(|(r, _)| RouteInput {
                    namespace: &r.namespace,
                    name: &r.name,
                    created: r.created.as_deref(),
                    kind: r.kind,
                    parent_namespace: k.0,
                    rules: &r.rules,
                })
                .collect();
            let (table, problems) = RouteTable::build(&inputs);
            for p in problems {
                self.diagnostics.push(Diagnostic::new(
                    DiagnosticKind::Route,
                    format!("{}/{}:{port}", k.0, k.1),
                    p.to_string(),
                ));
            }
            let set = RuleSet {
                routes: list.into_iter().map(|(_, a)| a).collect(),
                table,
            };
            let Some(entry) = names.get_mut(&k) else {
                continue;
            };
            let Some(fp) = entry.ports.get_mut(&port) else {
                continue;
            };
            let routes = Arc::make_mut(fp.routes.get_or_insert_with(|| {
                Arc::new(PortRoutes {
                    producer: None,
                    consumers: BTreeMap::new(),
                })
            }));
            match audience {
                None => routes.producer = Some(set),
                Some(ns) => {
                    routes.consumers.insert(ns, set);
                }
            }
        }
        statuses
    }

    /// L4 routes by (parent, port or any): the compiled rules, and their status entries.
    #[allow(clippy::type_complexity)] // A local index, used in one place.
    fn l4_tables<'n>(
        &self,
        routes: &'s [L4Route],
        kind: &str,
        names: &'n HashMap<(&'s str, &'s str), NameEntry>,
        services: &HashMap<(&str, &str), &Service>,
        statuses: &mut Vec<RouteStatus>,
    ) -> BTreeMap<((&'s str, &'s str), Option<u16>), Vec<TlsRule>> {
        let mut out: BTreeMap<((&str, &str), Option<u16>), Vec<TlsRule>> = BTreeMap::new();
        let mut sorted: Vec<&L4Route> = routes.iter().collect();
        sorted.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        let wanted = match kind {
            "TLSRoute" => None,
            "TCPRoute" => Some(PortProtocol::Tcp),
            _ => Some(PortProtocol::Udp),
        };
        for route in sorted {
            let hostnames: Vec<Arc<str>> = route
                .hostnames
                .iter()
                .map(|h| Arc::from(h.to_ascii_lowercase().as_str()))
                .collect();
            let mut backend_problems = Vec::new();
            let choices: Vec<TcpChoice> = route
                .rules
                .iter()
                .map(|rule| TcpChoice {
                    backends: rule
                        .backends
                        .iter()
                        .map(|b| {
                            let t = self.l4_backend(
                                route, kind, &b.target, b.port, wanted, names, services,
                            );
                            if let Err(e) = &t {
                                backend_problems.push(e.clone());
                            }
                            (
                                b.weight,
                                match t {
                                    Ok(t) => TcpBackend::Target(t),
                                    Err(e) => {
                                        TcpBackend::Invalid(Why::new("routes.md §3", e.message))
                                    }
                                },
                            )
                        })
                        .collect(),
                })
                .collect();
            let unsupported_shape = kind == "UDPRoute"
                && (route.rules.len() != 1
                    || route.rules[0].backends.len() != 1
                    || route.rules[0].backends.iter().any(|b| b.weight_given));
            for parent in &route.parents {
                let ns = parent
                    .target
                    .namespace
                    .as_deref()
                    .unwrap_or(&route.namespace);
                let target = (ns, parent.target.name.as_str());
                let accepted: Result<Vec<Option<u16>>, String> = if !is_service_ref(&parent.target)
                {
                    Err("the parent is not a Service".into())
                } else if unsupported_shape {
                    Err("UnsupportedValue: a UDPRoute carries one rule with one backend and no weight".into())
                } else {
                    match (services.get(&target), names.get_key_value(&target)) {
                        (Some(s), _) if !s.generated => Err("the parent is a user Service".into()),
                        (_, Some((_, e))) if e.kind == NameKind::Generated => {
                            l4_ports(e, parent, wanted)
                        }
                        _ => Err("the parent is not a mesh service's generated Service".into()),
                    }
                };
                let ok = accepted.is_ok();
                if let Ok(ports) = &accepted
                    && let Some((&k, _)) = names.get_key_value(&target)
                {
                    for p in ports {
                        for choice in &choices {
                            out.entry((k, *p)).or_default().push(TlsRule {
                                hostnames: hostnames.clone(),
                                choice: choice.clone(),
                            });
                        }
                    }
                }
                let accepted_cond = if unsupported_shape && is_service_ref(&parent.target) {
                    cond(
                        "Accepted",
                        "False",
                        "UnsupportedValue",
                        accepted.err().unwrap_or_default(),
                    )
                } else {
                    accepted_condition(accepted.map(|_| ()))
                };
                let refs = match backend_problems.first() {
                    Some(p) => cond(
                        "ResolvedRefs",
                        "False",
                        p.reason.as_str(),
                        p.message.clone(),
                    ),
                    None => cond("ResolvedRefs", "True", "ResolvedRefs", String::new()),
                };
                let _ = ok;
                statuses.push(RouteStatus {
                    kind: kind.to_owned(),
                    namespace: route.namespace.clone(),
                    name: route.name.clone(),
                    generation: route.generation,
                    parent: describe_parent(&route.namespace, parent),
                    conditions: vec![accepted_cond, refs],
                });
            }
        }
        out
    }

    /// Resolves one L4 backendRef strictly: TLSRoute and TCPRoute backends are raw-TCP pod
    /// ports, UDPRoute backends UDP pod ports (routes.md §9).
    #[allow(clippy::too_many_arguments)] // Mirrors http_backend with the L4 kind and class.
    fn l4_backend(
        &self,
        route: &L4Route,
        kind: &str,
        target: &ObjectRef,
        port: Option<u16>,
        wanted: Option<PortProtocol>,
        names: &HashMap<(&str, &str), NameEntry>,
        services: &HashMap<(&str, &str), &Service>,
    ) -> Result<TcpTarget, InvalidRef> {
        let b = self.backend_port(kind, &route.namespace, target, port, names, services)?;
        let want = wanted.unwrap_or(PortProtocol::Tcp);
        match b.front.class {
            PortClass::Known(c) if c == want => {}
            PortClass::Unknown => {}
            other => return Err(b.wrong_class(other)),
        }
        Ok(TcpTarget {
            why: Why::new(
                "routes.md §9",
                format!(
                    "{kind} {}/{} backend {}:{}",
                    route.namespace, route.name, b.service, b.port
                ),
            ),
            port: b.port,
            pod_port: b.pod_port,
            endpoints: b.front.endpoints.clone(),
            service: b.service,
        })
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
    m.classes
        .iter()
        .map(|(&p, &c)| {
            (
                p,
                front(
                    Some(p),
                    PortClass::Known(c),
                    m.endpoints
                        .get(&p)
                        .cloned()
                        .unwrap_or_else(|| Arc::from([])),
                ),
            )
        })
        .collect()
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
    let parts: Vec<String> = ports
        .iter()
        .filter(|(p, _)| !is_reserved(u32::from(**p)))
        .filter_map(|(p, f)| f.class.listed_as().map(|c| format!("{p}/{c}")))
        .collect();
    parts.join(" ").into()
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

/// The front ports an HTTP parentRef attaches to (routes.md §2.1).
fn attach_ports(
    e: &NameEntry,
    service: Option<&Service>,
    parent: &ParentRef,
) -> Result<Vec<u16>, String> {
    let http = |f: &FrontPort| f.class.serves_http() && f.pod_port.is_some();
    let by_section = |name: &str| -> Option<u16> {
        // routes.md §2.1: the front port whose ServicePort is named n; a generated Service's
        // ports are named p<port>-tcp, also before its Service object exists.
        let named = service.and_then(|s| {
            s.ports
                .iter()
                .find(|p| p.transport == Transport::Tcp && p.name.as_deref() == Some(name))
                .map(|p| p.port)
        });
        let generated = || {
            name.strip_prefix('p')
                .and_then(|r| r.strip_suffix("-tcp"))
                .and_then(|n| n.parse::<u16>().ok())
        };
        named
            .or_else(|| service.is_none().then(generated).flatten())
            .filter(|p| e.ports.contains_key(p))
    };
    let port = match (&parent.port, &parent.section_name) {
        (Some(p), Some(s)) => {
            if by_section(s) != Some(*p) {
                return Err(format!(
                    "port {p} and sectionName {s} do not name the same ServicePort"
                ));
            }
            Some(*p)
        }
        (Some(p), None) => Some(*p),
        (None, Some(s)) => {
            Some(by_section(s).ok_or_else(|| format!("sectionName {s} names no port"))?)
        }
        (None, None) => None,
    };
    match port {
        Some(p) => match e.ports.get(&p) {
            Some(f) if http(f) => Ok(vec![p]),
            Some(_) => Err(format!("port {p} is not an HTTP port of the Service")),
            None => Err(format!("port {p} is not a port of the Service")),
        },
        None => {
            let ports: Vec<u16> = e
                .ports
                .iter()
                .filter(|(_, f)| http(f))
                .map(|(&p, _)| p)
                .collect();
            if ports.is_empty() {
                Err("the Service has no HTTP port".into())
            } else {
                Ok(ports)
            }
        }
    }
}

/// The ports an L4 parentRef attaches to (routes.md §9); `None` means any eligible port.
fn l4_ports(
    e: &NameEntry,
    parent: &ParentRef,
    wanted: Option<PortProtocol>,
) -> Result<Vec<Option<u16>>, String> {
    let port = parent.port.or_else(|| {
        parent.section_name.as_deref().and_then(|s| {
            s.strip_prefix('p')
                .and_then(|r| r.split_once('-'))
                .and_then(|(n, _)| n.parse::<u16>().ok())
        })
    });
    let ok = |f: &FrontPort| match wanted {
        None => !f.class.serves_http(),
        Some(w) => f.class == PortClass::Known(w),
    };
    match (wanted, port) {
        // A UDPRoute acts on datagrams to 18082 of its parent, whatever ports it names.
        (Some(PortProtocol::Udp), _) => Ok(vec![None]),
        (None, Some(p)) => match e.ports.get(&p) {
            Some(f) if f.class.serves_http() => {
                Err(format!("port {p} is an HTTP port of the Service"))
            }
            _ => Ok(vec![Some(p)]),
        },
        (None, None) => Ok(vec![None]),
        (Some(_), Some(p)) => match e.ports.get(&p) {
            Some(f) if ok(f) => Ok(vec![Some(p)]),
            _ => Err(format!("port {p} is not a raw-TCP port of the Service")),
        },
        (Some(_), None) => {
            let ports: Vec<Option<u16>> = e
                .ports
                .iter()
                .filter(|(_, f)| ok(f))
                .map(|(&p, _)| Some(p))
                .collect();
            if ports.is_empty() {
                Err("the Service has no raw-TCP port".into())
            } else {
                Ok(ports)
            }
        }
    }
}

fn cond(t: &str, status: &str, reason: &str, message: String) -> Condition {
    Condition {
        type_: t.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
    }
}

fn accepted_condition(r: Result<(), String>) -> Condition {
    match r {
        Ok(()) => cond("Accepted", "True", "Accepted", String::new()),
        Err(m) => cond("Accepted", "False", "NoMatchingParent", m),
    }
}

fn resolved_refs_condition(rules: &[CompiledRule]) -> Condition {
    let mut problems: Vec<&InvalidRef> = rules
        .iter()
        .flat_map(|r| r.backends.iter())
        .filter_map(|b| b.target.as_ref().err())
        .collect();
    problems.sort_by(|a, b| (a.reason, &a.message).cmp(&(b.reason, &b.message)));
    match problems.first() {
        None => cond("ResolvedRefs", "True", "ResolvedRefs", String::new()),
        Some(first) => cond(
            "ResolvedRefs",
            "False",
            first.reason.as_str(),
            problems
                .iter()
                .map(|p| p.message.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        ),
    }
}
