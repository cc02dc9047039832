//! The reference evaluator: addressing.md §13 read row by row, straight from a [`Snapshot`].
//!
//! This is the second reading that spec/model.md §13 item 5 asks for. It is deliberately
//! plain: every question ("which rows are served?", "who owns this name?", "which routes are
//! attached to this port?") is answered by a linear scan of the snapshot at the moment it is
//! asked. It never calls [`crate::model::compile()`], never reads a [`crate::model::Model`], and
//! reuses none of the compiler's helpers. It does reuse these separately unit-tested pieces,
//! which both sides must agree on anyway:
//! - [`split_authority`], [`effective_authority`] and [`read_name`] (addressing.md §4.1, §4.2);
//! - [`row_problem`] and [`served_protocols`] (spec/model.md §3.3);
//! - [`Tally`] (the class vote of spec/model.md §6.1).
//!
//! Scope. The reference transcribes what the property tests generate: rows, pods, user and
//! generated Services with their EndpointSlices, retained entries, and HTTPRoutes whose
//! attached rule matches every request (one rule, no match or prefix `/`, one backend). It does not
//! transcribe Gateway API match precedence (the route matcher's own tests do), TLSRoute or
//! TCPRoute (steps 2 and 3 of §3), or route filters; snapshots that use
//! them are outside its domain.
//!
//! Readings of the spec where the text leaves a choice (each also marked where it is used):
//! - R1. Duplicate rows of one (namespace, service, address): the first served one in snapshot
//!   order is kept (spec/model.md §3.4 says only "de-duplicate"). The generators never produce
//!   duplicates with different contents.
//! - R2. A mesh-domain name whose (namespace, name) is held by an unrelated user Service (or a
//!   headless one with no mesh service) is category (e), not (d): §4.5 (d) and the last row of
//!   §4.3 both require "no user Service of that name". §7.2's row "node holds no row of M" is
//!   read as the meshOnly case the node cannot yet tell apart, so it is not transcribed.
//! - R3. A retained entry (spec/model.md §10) counts only while the service has no served row,
//!   its generated Service (if any) has no real port, and its grace (90 s) has not run out at
//!   the compile time `NodeContext::now_ms`.
//! - R4. An address that served rows of more than one mesh service claim (docs/decisions.md,
//!   "An address two rows claim"; issue #35 item 5) is no claimant's: a captured dial to it on
//!   a port other than 18081 and 18082 is closed at accept, and a request on a pod-IP
//!   connection to it is answered `503 upstream-unreachable`. Every claimant is a pod behind a
//!   user Service that lists the address.
//! - R5. A row whose namespace is not an RFC 1123 label or whose ServiceAccount is not an RFC
//!   1123 subdomain (issue #35 item 5) is not served, as a RowProblem is not.

use crate::prelude::*;

use std::net::{IpAddr, SocketAddr};

use super::{ConnVerdict, EntryKind, FallbackVerdict, HoldKind, Key, RequestVerdict, TcpVerdict};
use crate::model::NodeContext;
use crate::model::names::{
    Family, HostPort, NameForm, effective_authority, read_name, split_authority,
};
use crate::model::port::{PortProtocol, Transport};
use crate::model::rows::{row_problem, served_protocols};
use crate::model::snapshot::{
    HttpRoute, ObjectRef, Row, Service, ServicePort, Snapshot, TargetPort,
};
use crate::model::vote::Tally;
use crate::resolve::decision::{Caller, CaptureMode, HttpEntry, RequestFacts};

/// The proxy port (addressing.md §6).
const PROXY: u16 = 18081;
/// The legacy raw-TCP port (addressing.md §9).
const LEGACY: u16 = 18082;
/// The reserved ports (spec/model.md §5), written out again on purpose.
const RESERVED: [u16; 4] = [18001, 18008, 18081, 18082];
/// The grace of a retained entry (spec/model.md §10).
const GRACE_MS: u64 = 90_000;

// === Rows (spec/model.md §3, §5, §6, §7) ===

/// One served row and the ports it serves (reserved ports left out, spec/model.md §5).
struct Served<'s> {
    row: &'s Row,
    ports: Vec<(u16, PortProtocol)>,
}

impl Served<'_> {
    fn declares(&self, p: u16) -> Option<PortProtocol> {
        self.ports.iter().find(|(q, _)| *q == p).map(|(_, c)| *c)
    }
}

fn served_rows(s: &Snapshot) -> Vec<Served<'_>> {
    let mut out: Vec<Served<'_>> = Vec::new();
    for row in &s.rows {
        // spec/model.md §3.3: a row with a RowProblem is not served at all; R5.
        if row_problem(row).is_some()
            || crate::model::names::identity_problem(&row.namespace, &row.service).is_some()
        {
            continue;
        }
        // §3.4: de-duplicate per (namespace, service, address); R1: the first is kept.
        if out.iter().any(|o| {
            o.row.namespace == row.namespace
                && o.row.service == row.service
                && o.row.address == row.address
        }) {
            continue;
        }
        let ports = served_protocols(row)
            .into_iter()
            .filter(|(p, _)| !RESERVED.contains(p))
            .collect();
        out.push(Served { row, ports });
    }
    out
}

/// R4: served rows of more than one mesh service claim `a`.
fn contested(served: &[Served<'_>], a: IpAddr) -> bool {
    let mut claims = served.iter().filter(|r| r.row.address == a);
    claims.next().is_some_and(|first| {
        claims.any(|r| {
            (&r.row.namespace, &r.row.service) != (&first.row.namespace, &first.row.service)
        })
    })
}

fn rows_of<'a, 's>(served: &'a [Served<'s>], ns: &str, svc: &str) -> Vec<&'a Served<'s>> {
    served
        .iter()
        .filter(|r| r.row.namespace == ns && r.row.service == svc)
        .collect()
}

/// The class vote of port `p` over some rows (spec/model.md §6.1).
fn vote(rows: &[&Served<'_>], p: u16) -> Option<PortProtocol> {
    let mut t = Tally::default();
    for r in rows {
        if let Some(c) = r.declares(p) {
            t.add(c);
        }
    }
    t.winner()
}

/// Ready rows declaring `p` with the winning protocol (spec/model.md §6.2, §3.5).
fn endpoints(rows: &[&Served<'_>], p: u16, winner: PortProtocol) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = rows
        .iter()
        .filter(|r| r.row.ready && r.declares(p) == Some(winner))
        .map(|r| r.row.address)
        .collect();
    v.sort();
    v
}

/// The legacy target (spec/model.md §7): the most carried `port`; a tie goes to the lowest.
fn legacy_target(rows: &[&Served<'_>]) -> Option<u16> {
    let mut best: Option<(usize, u16)> = None;
    for r in rows {
        let Ok(p) = u16::try_from(r.row.port) else {
            continue;
        };
        let n = rows.iter().filter(|o| o.row.port == r.row.port).count();
        let better = match best {
            None => true,
            Some((bn, bp)) => n > bn || (n == bn && p < bp),
        };
        if better {
            best = Some((n, p));
        }
    }
    best.map(|(_, p)| p)
}

// === Names and their ports (addressing.md §4.3, spec/model.md §9) ===

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Known(PortProtocol),
    Unknown,
    None,
}

impl Class {
    fn serves_http(self) -> bool {
        matches!(self, Self::Known(PortProtocol::Http) | Self::Unknown)
    }
}

#[derive(Clone, Debug)]
struct Front {
    port: u16,
    pod_port: Option<u16>,
    class: Class,
    endpoints: Vec<IpAddr>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// §4.3 row 1: a generated Service, or a mesh service with no Service object yet.
    Generated,
    /// §4.3 rows 2 and 3: a routed user Service.
    Routed,
    /// §4.3 row 4: meshOnly.
    MeshOnly,
}

#[derive(Clone, Debug)]
struct Name {
    ns: String,
    name: String,
    owner: Owner,
    /// The ports of the name: front ports through the port map.
    ports: Vec<Front>,
    /// meshOnly: the mesh service's own ports (§7.2, captured dials).
    own: Vec<Front>,
}

impl Name {
    fn key(&self) -> Key {
        (self.ns.clone(), self.name.clone())
    }

    fn port(&self, p: u16) -> Option<&Front> {
        self.ports.iter().find(|f| f.port == p)
    }

    fn own_port(&self, p: u16) -> Option<&Front> {
        self.own.iter().find(|f| f.port == p)
    }

    /// The body's `service:` and `ports:` lines (addressing.md §11.2).
    fn line(&self, ctx: &NodeContext) -> (String, String) {
        let mut listed: Vec<(u16, &'static str)> = self
            .ports
            .iter()
            .filter(|f| !RESERVED.contains(&f.port))
            .filter_map(|f| {
                let c = match f.class {
                    Class::Known(p) => p.as_str(),
                    Class::Unknown => "unknown",
                    // Front ports that name nothing are never listed.
                    Class::None => return None,
                };
                Some((f.port, c))
            })
            .collect();
        listed.sort();
        let ports: Vec<String> = listed.iter().map(|(p, c)| format!("{p}/{c}")).collect();
        (
            format!("{}.{}.{}", self.name, self.ns, ctx.domains.mesh),
            ports.join(" "),
        )
    }
}

/// Who holds a (namespace, name).
enum Holder {
    /// A name the mesh answers (categories (a) and (b) of §4.5).
    Name(Name),
    /// An unrelated user Service (or a headless one with no mesh service): never the mesh's.
    UserUnrelated,
    /// Nothing the node knows ports of.
    Nothing,
}

fn is_service(r: &ObjectRef) -> bool {
    (r.group.is_empty() || r.group == "core") && r.kind == "Service"
}

fn names_service(route: &HttpRoute, r: &ObjectRef, ns: &str, name: &str) -> bool {
    is_service(r) && r.namespace.as_deref().unwrap_or(&route.namespace) == ns && r.name == name
}

/// spec/model.md §9.1: an HTTPRoute names `u` (as parentRef or backendRef) and `u` is not
/// headless.
fn routed(s: &Snapshot, u: &Service) -> bool {
    !u.generated
        && !u.headless
        && s.http_routes.iter().any(|r| {
            r.parents
                .iter()
                .any(|p| names_service(r, &p.target, &u.namespace, &u.name))
                || r.rules.iter().any(|rule| {
                    rule.backends
                        .iter()
                        .any(|b| names_service(r, &b.target, &u.namespace, &u.name))
                })
        })
}

/// spec/model.md §9.2: the pod port of a TCP ServicePort, `None` while a named targetPort
/// does not resolve.
fn pod_port(s: &Snapshot, u: &Service, sp: &ServicePort) -> Option<u16> {
    match &sp.target {
        TargetPort::Same => Some(sp.port),
        TargetPort::Number(n) => Some(*n),
        TargetPort::Name(_) => {
            // The slice port that carries the ServicePort's name gives the number; every slice
            // that names it must agree.
            // An unnamed ServicePort's slice port has the empty name; a slice port without a
            // number tells nothing.
            let name = sp.name.as_deref().unwrap_or("");
            let mut found: Option<u16> = None;
            for slice in s
                .endpoint_slices
                .iter()
                .filter(|e| e.namespace == u.namespace && e.service == u.name)
            {
                for p in slice
                    .ports
                    .iter()
                    .filter(|p| p.name.as_deref().unwrap_or("") == name)
                {
                    let Some(n) = p.port else { continue };
                    match found {
                        Some(f) if f != n => return None,
                        _ => found = Some(n),
                    }
                }
            }
            found
        }
    }
}

/// A user Service's front ports through its port map (spec/model.md §9.2), each with the class
/// and endpoints `class_of` gives its pod port.
fn user_ports(
    s: &Snapshot,
    u: &Service,
    class_of: &dyn Fn(u16) -> (Class, Vec<IpAddr>),
) -> Vec<Front> {
    let mut out: Vec<Front> = Vec::new();
    for sp in u.ports.iter().filter(|p| p.transport == Transport::Tcp) {
        if out.iter().any(|f| f.port == sp.port) {
            continue;
        }
        let pp = pod_port(s, u, sp);
        let (class, eps) = match pp {
            Some(p) => class_of(p),
            None => (Class::None, Vec::new()),
        };
        out.push(Front {
            port: sp.port,
            pod_port: pp,
            class,
            endpoints: eps,
        });
    }
    // A front port the Service has only as UDP is a port of the name with class UDP.
    for sp in u.ports.iter().filter(|p| p.transport == Transport::Udp) {
        if out.iter().any(|f| f.port == sp.port) {
            continue;
        }
        out.push(Front {
            port: sp.port,
            pod_port: None,
            class: Class::Known(PortProtocol::Udp),
            endpoints: Vec::new(),
        });
    }
    out
}

/// A mesh service's own ports: every port a served row declares, with its vote.
fn own_ports(rows: &[&Served<'_>]) -> Vec<Front> {
    let mut out: Vec<Front> = Vec::new();
    for r in rows {
        for &(p, _) in &r.ports {
            if out.iter().any(|f| f.port == p) {
                continue;
            }
            if let Some(w) = vote(rows, p) {
                out.push(Front {
                    port: p,
                    pod_port: Some(p),
                    class: Class::Known(w),
                    endpoints: endpoints(rows, p, w),
                });
            }
        }
    }
    out
}

/// Who holds `<name>` in `<ns>` (addressing.md §4.3; spec/model.md §9, §10).
fn holder(s: &Snapshot, ctx: &NodeContext, served: &[Served<'_>], ns: &str, name: &str) -> Holder {
    let user = s
        .services
        .iter()
        .find(|x| !x.generated && x.namespace == ns && x.name == name);
    let generated = s
        .services
        .iter()
        .find(|x| x.generated && x.namespace == ns && x.name == name);
    let rows = rows_of(served, ns, name);
    let mk = |owner, ports, own| {
        Holder::Name(Name {
            ns: ns.to_owned(),
            name: name.to_owned(),
            owner,
            ports,
            own,
        })
    };
    if let Some(u) = user {
        if routed(s, u) {
            // §9.1 "Routed": the pods behind U are the served rows its EndpointSlices list.
            let read = s
                .endpoint_slices
                .iter()
                .any(|e| e.namespace == ns && e.service == name);
            let behind: Vec<&Served<'_>> = served
                .iter()
                .filter(|r| {
                    s.endpoint_slices
                        .iter()
                        .filter(|e| e.namespace == ns && e.service == name)
                        .flat_map(|e| e.endpoints.iter())
                        .any(|ep| ep.addresses.contains(&r.row.address))
                })
                .collect();
            let class_of = |p: u16| {
                // §9.3: unknown until the slices are read and some pod behind U is served.
                if !read || behind.is_empty() {
                    return (Class::Unknown, Vec::new());
                }
                match vote(&behind, p) {
                    Some(w) => (Class::Known(w), endpoints(&behind, p, w)),
                    None => (Class::None, Vec::new()),
                }
            };
            return mk(Owner::Routed, user_ports(s, u, &class_of), Vec::new());
        }
        if !rows.is_empty() {
            // §9.3 meshOnly: U's port map, the class and endpoints from M's own rows.
            let class_of = |p: u16| match vote(&rows, p) {
                Some(w) => (Class::Known(w), endpoints(&rows, p, w)),
                None => (Class::None, Vec::new()),
            };
            return mk(
                Owner::MeshOnly,
                user_ports(s, u, &class_of),
                own_ports(&rows),
            );
        }
        return Holder::UserUnrelated;
    }
    if !rows.is_empty() {
        return mk(Owner::Generated, own_ports(&rows), Vec::new());
    }
    // No served row: the generated Service's real ports (§9.3 row 2).
    let mut ports: Vec<Front> = Vec::new();
    if let Some(g) = generated {
        for sp in &g.ports {
            if RESERVED.contains(&sp.port) || ports.iter().any(|f| f.port == sp.port) {
                continue;
            }
            let class = match (sp.transport, sp.app_protocol.as_deref()) {
                (Transport::Udp, _) => PortProtocol::Udp,
                (Transport::Tcp, Some("http")) => PortProtocol::Http,
                (Transport::Tcp, Some("tcp")) => PortProtocol::Tcp,
                // Anchor ports (no appProtocol) give no class.
                _ => continue,
            };
            ports.push(Front {
                port: sp.port,
                pod_port: Some(sp.port),
                class: Class::Known(class),
                endpoints: Vec::new(),
            });
        }
    }
    // spec/model.md §10, evidence 2: the generated Service's real ports, if it has any.
    let evidence =
        generated.is_some_and(|g| g.ports.iter().any(|p| p.port != PROXY && p.port != LEGACY));
    if !evidence {
        // R3, spec/model.md §10: no evidence, so retained entries within their grace count.
        for r in s.retained.iter().filter(|r| {
            r.namespace == ns
                && r.service == name
                && ctx.now_ms.saturating_sub(r.since_ms) < GRACE_MS
        }) {
            if !ports.iter().any(|f| f.port == r.port) {
                ports.push(Front {
                    port: r.port,
                    pod_port: Some(r.port),
                    class: Class::Known(PortProtocol::Http),
                    endpoints: Vec::new(),
                });
            }
        }
    }
    if ports.is_empty() {
        return Holder::Nothing;
    }
    mk(Owner::Generated, ports, Vec::new())
}

/// The categories of addressing.md §4.5.
enum Category {
    /// (a) or (b).
    Mesh(Name),
    /// (c).
    CallerUnknown,
    /// (d).
    UnknownMeshName,
    /// (e).
    Foreign,
}

fn categorise(
    s: &Snapshot,
    ctx: &NodeContext,
    served: &[Served<'_>],
    caller: &Caller,
    name: &str,
) -> Category {
    // Kubernetes and short names of a meshOnly service are not the mesh's (§4.3 row 4).
    let not_mesh_only = |h: Holder| match h {
        Holder::Name(n) if n.owner != Owner::MeshOnly => Category::Mesh(n),
        Holder::Name(_) | Holder::UserUnrelated | Holder::Nothing => Category::Foreign,
    };
    match read_name(name, &ctx.domains) {
        NameForm::Named {
            family: Family::Mesh,
            service,
            namespace,
        } => match holder(s, ctx, served, &namespace, &service) {
            Holder::Name(n) => Category::Mesh(n),
            // R2: a user Service of the name makes it (e), never (d).
            Holder::UserUnrelated => Category::Foreign,
            Holder::Nothing => Category::UnknownMeshName,
        },
        NameForm::Named {
            family: Family::Kubernetes | Family::Short,
            service,
            namespace,
        } => not_mesh_only(holder(s, ctx, served, &namespace, &service)),
        NameForm::Short(service) => match &caller.namespace {
            // §4.4: no caller namespace, every dotless name is refused.
            None => Category::CallerUnknown,
            // §4.4: never resolved in another namespace.
            Some(ns) => not_mesh_only(holder(s, ctx, served, ns, &service)),
        },
        NameForm::Foreign => Category::Foreign,
    }
}

// === Answers ===

fn answer(status: u16, reason: &str, service: Option<(String, String)>) -> RequestVerdict {
    RequestVerdict::Answer {
        status,
        reason: reason.to_owned(),
        service,
    }
}

fn refuse_about(reason: &str, name: &Name, ctx: &NodeContext) -> RequestVerdict {
    answer(421, reason, Some(name.line(ctx)))
}

// === Connections (addressing.md §3; §13 rows 1, 2, 28, 44–47) ===

/// How a captured connection to `dialled` is handled at accept (addressing.md §3).
pub fn reference_connection(
    s: &Snapshot,
    ctx: &NodeContext,
    caller: &Caller,
    dialled: SocketAddr,
) -> ConnVerdict {
    let (a, d) = (dialled.ip(), dialled.port());
    let served = served_rows(s);
    let sniff = |http| ConnVerdict::Sniff {
        http: Some(http),
        tls_rules: 0,
        fallback: FallbackVerdict::Passthrough,
    };
    // C81: a captured dial to port 18081 of any address is the proxy port (§9).
    if d == PROXY {
        return sniff(EntryKind::ProxyCaptured);
    }
    // R4: an address more than one service claims is no pod-IP dial's to make.
    if d != LEGACY && contested(&served, a) {
        return ConnVerdict::Close;
    }
    // Step 0: a pod-IP dial (rows 44–47).
    if d != LEGACY
        && let Some(pod) = served.iter().find(|r| r.row.address == a)
    {
        let svc = rows_of(&served, &pod.row.namespace, &pod.row.service);
        return match pod.declares(d) {
            // Row 44: D ∈ R_T, raw TCP to that pod's D at once.
            Some(PortProtocol::Tcp) if vote(&svc, d) == Some(PortProtocol::Tcp) => {
                ConnVerdict::Tcp(
                    [TcpVerdict::Target {
                        service: (pod.row.namespace.clone(), pod.row.service.clone()),
                        port: d,
                        pod_port: d,
                        endpoints: vec![a],
                    }]
                    .into(),
                )
            }
            // Rows 45 and 46: D ∈ R_H, sniff; HTTP to §5.1, anything else passes through.
            Some(PortProtocol::Http) if vote(&svc, d) == Some(PortProtocol::Http) => {
                sniff(EntryKind::PodIp)
            }
            // Row 47: D ∉ R_H ∪ R_T (undeclared, UDP, or a losing protocol).
            _ => ConnVerdict::Passthrough,
        };
    }
    // Step 1: (A, D) is a raw-TCP port of a mesh service's generated Service (rows 1, 2).
    if let Some(t) = s
        .services
        .iter()
        .find(|x| x.generated && !x.headless && x.cluster_ips.contains(&a))
        && let Holder::Name(name) = holder(s, ctx, &served, &t.namespace, &t.name)
        && name.owner == Owner::Generated
    {
        let tcp = |port: u16, pod_port: u16| {
            name.port(pod_port)
                .filter(|f| f.class == Class::Known(PortProtocol::Tcp))
                .map(|f| {
                    ConnVerdict::Tcp(
                        [TcpVerdict::Target {
                            service: name.key(),
                            port,
                            pod_port,
                            endpoints: f.endpoints.clone(),
                        }]
                        .into(),
                    )
                })
        };
        if d == LEGACY {
            // Row 2: the legacy target, when its class is raw TCP.
            let rows = rows_of(&served, &t.namespace, &t.name);
            if let Some(l) = legacy_target(&rows).filter(|l| !RESERVED.contains(l))
                && let Some(v) = tcp(LEGACY, l)
            {
                return v;
            }
        } else if let Some(v) = tcp(d, d) {
            // Row 1.
            return v;
        }
    }
    // Step 4 (row 28): scoped capture, 18082, no raw-TCP match.
    if caller.capture == CaptureMode::Scoped && d == LEGACY {
        return ConnVerdict::Close;
    }
    // Step 5: sniff; HTTP to §5, anything else passes through (rows 7, 8, 27).
    sniff(EntryKind::Captured)
}

// === Requests (addressing.md §4–§8; §13 rows 3–6, 11–26, 32–43, 45, 48) ===

/// What one HTTP request gets (addressing.md §13).
pub fn reference_request(
    s: &Snapshot,
    ctx: &NodeContext,
    caller: &Caller,
    f: &RequestFacts<'_>,
) -> RequestVerdict {
    // Row 48: a malformed authority, before anything else.
    let Ok(authority) = effective_authority(&f.authority) else {
        return answer(400, "bad-authority", None);
    };
    // Row 43: a request without a path.
    if f.path_and_query.is_none() {
        return answer(404, "no-path", None);
    }
    let served = served_rows(s);
    let mut entry = f.entry;
    if let HttpEntry::PodIp { dialled } = entry {
        let d = dialled.port();
        if contested(&served, dialled.ip()) {
            // R4.
            return answer(503, "upstream-unreachable", None);
        }
        if let Some(pod) = served.iter().find(|r| r.row.address == dialled.ip()) {
            let svc = rows_of(&served, &pod.row.namespace, &pod.row.service);
            if pod.declares(d) == Some(PortProtocol::Http)
                && vote(&svc, d) == Some(PortProtocol::Http)
            {
                // Row 45 (§5.1 Q3): that pod's D, whatever the authority, never held.
                return RequestVerdict::Deliver {
                    addressed: None,
                    front_port: d,
                    backend: (pod.row.namespace.clone(), pod.row.service.clone()),
                    pod_port: d,
                    endpoints: vec![dialled.ip()],
                };
            }
        }
        // §5.1: no longer a served pod declaring D as HTTP: answered as on any other address.
        entry = HttpEntry::Captured { dialled };
    }
    // The floor (§6.3) and C8 for a name that is not the mesh's.
    let floor = || match entry {
        // Rows 11, 12: passthrough to the dialled address.
        HttpEntry::Captured { .. } | HttpEntry::PodIp { .. } => RequestVerdict::Passthrough,
        // Row 22: C81 from a redirect-all pod.
        HttpEntry::ProxyCaptured { .. } if caller.capture == CaptureMode::RedirectAll => {
            RequestVerdict::Passthrough
        }
        // Rows 21, 23.
        HttpEntry::Loopback | HttpEntry::ProxyCaptured { .. } => {
            answer(404, "not-a-mesh-name", None)
        }
    };
    // §4.1 item 5: a request with no name is never the mesh's.
    let Some(authority) = authority else {
        return floor();
    };
    let auth = split_authority(authority);
    let anchor = matches!(auth.port, HostPort::Port(PROXY | LEGACY));
    let category = categorise(s, ctx, &served, caller, auth.name);
    match entry {
        HttpEntry::Loopback | HttpEntry::ProxyCaptured { .. } => {
            // §6: q is the authority's port, or 80 when it has none.
            let q = match auth.port {
                HostPort::None => Some(80),
                HostPort::Port(p) => Some(p),
                HostPort::Malformed => None,
            };
            match category {
                // Row 20 (P1).
                Category::Mesh(n) if anchor => refuse_about("port-not-declared", &n, ctx),
                Category::Mesh(n) => match q.and_then(|q| n.port(q)) {
                    // Rows 14, 15, 35, 41 (P2).
                    Some(fp) if fp.class.serves_http() && fp.pod_port.is_some() => {
                        deliver(s, ctx, &served, caller, &n, fp, f.hold_expired)
                    }
                    // Rows 17, 18, 36 (P3).
                    Some(fp)
                        if matches!(
                            fp.class,
                            Class::Known(PortProtocol::Tcp | PortProtocol::Udp)
                        ) =>
                    {
                        refuse_about("port-not-http", &n, ctx)
                    }
                    // Rows 16, 19, 37 (P4).
                    _ => refuse_about("port-not-declared", &n, ctx),
                },
                // Row 13 (P5).
                Category::CallerUnknown => answer(421, "caller-namespace-unknown", None),
                // Row 26 (P1).
                Category::UnknownMeshName if anchor => answer(421, "port-not-declared", None),
                // Row 25 (P6).
                Category::UnknownMeshName if !f.hold_expired => {
                    RequestVerdict::Hold(HoldKind::UnknownName)
                }
                // Rows 21–24 (P7), and row 25 once the hold has run out.
                Category::UnknownMeshName | Category::Foreign => floor(),
            }
        }
        HttpEntry::Captured { dialled } | HttpEntry::PodIp { dialled } => {
            let d = dialled.port();
            let same_port = match auth.port {
                HostPort::None => true,
                HostPort::Port(p) => p == d,
                HostPort::Malformed => false,
            };
            match category {
                Category::Mesh(n) if n.owner == Owner::MeshOnly => match n.own_port(d) {
                    // Row 38: M's own rows declare D as HTTP.
                    Some(fp) if same_port && fp.class == Class::Known(PortProtocol::Http) => {
                        deliver(s, ctx, &served, caller, &n, fp, f.hold_expired)
                    }
                    // Row 39: never refused.
                    _ => RequestVerdict::Passthrough,
                },
                Category::Mesh(n) => match n.port(d) {
                    Some(fp) if fp.class.serves_http() && fp.pod_port.is_some() => {
                        if same_port {
                            // Rows 3, 4, 32 (C1).
                            deliver(s, ctx, &served, caller, &n, fp, f.hold_expired)
                        } else {
                            // Rows 5, 33 (C2).
                            refuse_about("port-mismatch", &n, ctx)
                        }
                    }
                    // Rows 6, 34 (C3).
                    _ => refuse_about("port-not-declared", &n, ctx),
                },
                // Row 13 (C5).
                Category::CallerUnknown => answer(421, "caller-namespace-unknown", None),
                // Row 26 (C6).
                Category::UnknownMeshName if anchor => answer(421, "port-not-declared", None),
                // Row 25 (C7).
                Category::UnknownMeshName if !f.hold_expired => {
                    RequestVerdict::Hold(HoldKind::UnknownName)
                }
                // Rows 11, 12, 40 (C8).
                Category::UnknownMeshName | Category::Foreign => RequestVerdict::Passthrough,
            }
        }
    }
}

// === Delivery (routes.md §2–§4; addressing.md §8) ===

/// The rule attached to (name, front port) for this caller (routes.md §2.1, §2.3): the first
/// rule of the first attached route, in (namespace, name) order. Only rules that match every
/// request are in the reference's domain (module doc).
fn attached_rule<'s>(
    s: &'s Snapshot,
    caller: &Caller,
    name: &Name,
    fp: &Front,
) -> Option<(&'s HttpRoute, usize)> {
    let headless = s
        .services
        .iter()
        .any(|x| x.namespace == name.ns && x.name == name.name && x.headless);
    if headless {
        // A headless parent attaches nothing (routes.md §2.1).
        return None;
    }
    let http = |f: &Front| f.class.serves_http() && f.pod_port.is_some();
    let mut producer: Vec<&HttpRoute> = Vec::new();
    let mut consumer: Vec<&HttpRoute> = Vec::new();
    for r in &s.http_routes {
        // A sectionName names the front port whose ServicePort carries that name; where the
        // name has no Service object yet, its generated Service's name for the port,
        // `p<port>-tcp` (routes.md §2.1).
        let section = |n: &str| {
            let mut objects = s
                .services
                .iter()
                .filter(|x| x.namespace == name.ns && x.name == name.name)
                .peekable();
            if objects.peek().is_none() {
                return n
                    .strip_prefix('p')
                    .and_then(|r| r.strip_suffix("-tcp"))
                    .and_then(|p| p.parse::<u16>().ok());
            }
            objects
                .flat_map(|x| x.ports.iter())
                .find(|p| p.transport == Transport::Tcp && p.name.as_deref() == Some(n))
                .map(|p| p.port)
        };
        let attaches = r.parents.iter().any(|p| {
            names_service(r, &p.target, &name.ns, &name.name)
                && http(fp)
                && match (p.port, p.section_name.as_deref()) {
                    // A port-less parentRef attaches to every HTTP port...
                    (None, None) => true,
                    // ...a port to that port only, if it is HTTP...
                    (Some(q), None) => q == fp.port,
                    // ...a sectionName to the port it names...
                    (None, Some(n)) => section(n) == Some(fp.port),
                    // ...and both to one ServicePort that has both.
                    (Some(q), Some(n)) => q == fp.port && section(n) == Some(q),
                }
        });
        if !attaches {
            continue;
        }
        if r.namespace == name.ns {
            producer.push(r);
        } else if caller.namespace.as_deref() == Some(r.namespace.as_str()) {
            // §2.3: a consumer route applies to callers of its own namespace only.
            consumer.push(r);
        }
    }
    let mut set = if consumer.is_empty() {
        producer
    } else {
        consumer
    };
    set.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    set.into_iter()
        .find(|r| !r.rules.is_empty())
        .map(|r| (r, 0))
}

/// routes.md §3: a backendRef's target, or `None` when the reference is invalid.
fn backend(
    s: &Snapshot,
    ctx: &NodeContext,
    served: &[Served<'_>],
    route: &HttpRoute,
    target: &ObjectRef,
    port: Option<u16>,
) -> Option<(Key, Front)> {
    if !is_service(target) {
        return None;
    }
    // A mesh route's backend in another namespace needs no ReferenceGrant (routes.md §3).
    let ns = target.namespace.as_deref().unwrap_or(&route.namespace);
    let port = port?;
    let Holder::Name(n) = holder(s, ctx, served, ns, &target.name) else {
        return None;
    };
    let ports = if n.owner == Owner::MeshOnly {
        &n.own
    } else {
        &n.ports
    };
    let f = ports.iter().find(|f| f.port == port)?;
    f.pod_port?;
    f.class.serves_http().then(|| (n.key(), f.clone()))
}

/// Delivers on (name, front port): an attached rule, or the default delivery (routes.md §4),
/// then the hold for endpoints (addressing.md §8).
fn deliver(
    s: &Snapshot,
    ctx: &NodeContext,
    served: &[Served<'_>],
    caller: &Caller,
    name: &Name,
    fp: &Front,
    hold_expired: bool,
) -> RequestVerdict {
    let (backend_key, target) = match attached_rule(s, caller, name, fp) {
        Some((route, i)) => {
            let rule = &route.rules[i];
            // Gateway API weights; a rule without a positive weight answers as invalid.
            let total: u32 = rule.backends.iter().map(|b| b.weight).sum();
            let Some(b) = rule
                .backends
                .iter()
                .find(|b| b.weight > 0)
                .filter(|_| total > 0)
            else {
                return answer(500, "invalid-backend", None);
            };
            match backend(s, ctx, served, route, &b.target, b.port) {
                Some(t) => t,
                // routes.md §3 item 4: the share of an invalid backend is answered 500.
                None => return answer(500, "invalid-backend", None),
            }
        }
        None => (name.key(), fp.clone()),
    };
    let Some(pod_port) = target.pod_port else {
        return answer(421, "port-not-declared", Some(name.line(ctx)));
    };
    if target.endpoints.is_empty() {
        // §8: hold for an endpoint, then 503.
        return if hold_expired {
            answer(503, "no-endpoints", None)
        } else {
            RequestVerdict::Hold(HoldKind::Endpoints)
        };
    }
    RequestVerdict::Deliver {
        addressed: Some(name.key()),
        front_port: fp.port,
        backend: backend_key,
        pod_port,
        endpoints: target.endpoints,
    }
}
