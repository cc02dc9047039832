//! Property tests of the compiler and the resolvers (STYLE.md §6.6; spec/model.md §13 item 5;
//! legs.md U9): the compiled answers equal the reference evaluator's
//! ([`crate::test_util::reference`]) over random snapshots shaped like the spec's world, and
//! compile is deterministic, order independent and total.
//!
//! Each case draws one world and then enumerates the facts exhaustively: every service name in
//! every spelling, crossed with every port of the world plus an undeclared one, no port, a
//! malformed port, 18081 and 18082, crossed with every entry path, with the callers and the
//! expired hold rotated.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use http::HeaderMap;
use proptest::prelude::*;

use crate::model::names::{AuthorityInput, HttpVersion};
use crate::model::port::{PortProtocol, Transport};
use crate::model::registrar::complete_snapshot;
use crate::model::snapshot::{
    EndpointSlice, HttpBackendRef, HttpRoute, HttpRouteKind, HttpRule, ObjectRef, ParentRef, Pod,
    ProtocolValue, RetainedPort, Row, Service, ServicePort, SliceEndpoint, SlicePort, Snapshot,
    TargetPort,
};
use crate::model::{NodeContext, compile};
use crate::reference::evaluator::{reference_connection, reference_request};
use crate::reference::{
    HoldKind, Mix, RequestVerdict, conn_verdict_of, model_difference, verdict_of,
};
use crate::resolve::answer::HEADER_ERROR;
use crate::resolve::decision::{Caller, CaptureMode, HttpEntry, RequestDecision, RequestFacts};
use crate::resolve::{classify_connection, resolve_request};

const NAMESPACES: [&str; 3] = ["ns-a", "ns-b", "ns-c"];
const NAMES: [&str; 4] = ["alpha", "beta", "gamma", "delta"];
/// Ports pods declare.
const POOL: [u16; 5] = [80, 8080, 9000, 9090, 5353];
/// Front ports of user Services.
const FRONTS: [u16; 5] = [80, 8080, 9000, 9090, 7070];
/// A port nothing declares.
const UNDECLARED: u16 = 7777;
const RESERVED: [u16; 4] = [18001, 18008, 18081, 18082];
/// Neither a ClusterIP nor a pod.
const OTHER: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
const NOW_MS: u64 = 200_000;

// === The world generator ===

#[derive(Clone, Debug)]
struct PodGen {
    /// (index into POOL, protocol 0..3)
    ports: Vec<(usize, u8)>,
    live: usize,
    ready: bool,
    /// A RowProblem to inflict (0..5), if any.
    problem: Option<u8>,
    /// A reserved port also declared, if any.
    reserved: Option<usize>,
    tier: u8,
}

#[derive(Clone, Debug)]
struct UserGen {
    routed: bool,
    headless: bool,
    /// (index into FRONTS, target kind 0 same / 1 number / 2 name, index into POOL)
    ports: Vec<(usize, u8, usize)>,
    udp: bool,
    /// Select by the pods' service (`false`) or by a tier shared across services (`true`).
    by_tier: bool,
    tier: u8,
    /// 0: no slices read; 1: slices; 2: slices that disagree on named ports.
    slices: u8,
    /// The backendRef port: an index into the Service's ports, or past it (a missing port).
    backend_port: usize,
}

#[derive(Clone, Debug)]
struct SvcGen {
    ns: usize,
    name: usize,
    pods: Vec<PodGen>,
    user: Option<UserGen>,
    /// With no pods and no user Service: 0 no Service, 1 anchors only, 2 real ports.
    cold: u8,
    cold_ports: Vec<(usize, u8)>,
    /// A retained entry: (index into POOL, expired).
    retained: Option<(usize, bool)>,
    /// An HTTPRoute on the generated Service, backend itself on POOL[i].
    route_on_generated: Option<usize>,
}

fn pod_gen() -> impl Strategy<Value = PodGen> {
    (
        prop::collection::vec((0..POOL.len(), 0u8..3), 1..4),
        0usize..4,
        prop::bool::weighted(0.8),
        prop::option::weighted(0.15, 0u8..5),
        prop::option::weighted(0.15, 0..RESERVED.len()),
        0u8..2,
    )
        .prop_map(|(ports, live, ready, problem, reserved, tier)| PodGen {
            ports,
            live,
            ready,
            problem,
            reserved,
            tier,
        })
}

fn user_gen() -> impl Strategy<Value = UserGen> {
    (
        prop::bool::weighted(0.5),
        prop::bool::weighted(0.15),
        prop::collection::vec((0..FRONTS.len(), 0u8..3, 0..POOL.len()), 1..4),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.3),
        0u8..2,
        0u8..3,
        0usize..4,
    )
        .prop_map(
            |(routed, headless, ports, udp, by_tier, tier, slices, backend_port)| UserGen {
                routed,
                headless,
                ports,
                udp,
                by_tier,
                tier,
                slices,
                backend_port,
            },
        )
}

fn svc_gen() -> impl Strategy<Value = SvcGen> {
    (
        0..NAMESPACES.len(),
        0..NAMES.len(),
        prop::collection::vec(pod_gen(), 0..4),
        prop::option::weighted(0.35, user_gen()),
        0u8..3,
        prop::collection::vec((0..POOL.len(), 0u8..3), 1..3),
        prop::option::weighted(0.25, (0..POOL.len(), prop::bool::weighted(0.3))),
        prop::option::weighted(0.2, 0..POOL.len()),
    )
        .prop_map(
            |(ns, name, pods, user, cold, cold_ports, retained, route_on_generated)| SvcGen {
                ns,
                name,
                pods,
                user,
                cold,
                cold_ports,
                retained,
                route_on_generated,
            },
        )
}

/// An extra HTTPRoute between the world's names: consumer routes from another namespace,
/// parentRef ports, backends in other Services and namespaces, GRPCRoutes.
#[derive(Clone, Debug)]
struct RouteGen {
    /// The route's namespace; `usize::MAX` for the parent's (a producer route).
    route_ns: usize,
    /// The parent and the backend: indices into the world's services (modulo its length).
    parent: usize,
    /// An index into POOL ∪ FRONTS, or none.
    parent_port: Option<usize>,
    /// A sectionName: 0 the parent's ServicePort name for POOL ∪ FRONTS\[i\], 1 a name no
    /// ServicePort has.
    section: Option<(u8, usize)>,
    backend: usize,
    backend_port: usize,
    grpc: bool,
}

fn route_gen() -> impl Strategy<Value = RouteGen> {
    (
        (prop::bool::weighted(0.6), 0..NAMESPACES.len()),
        0usize..6,
        prop::option::weighted(0.4, 0..POOL.len() + FRONTS.len()),
        0usize..6,
        0..POOL.len() + FRONTS.len(),
        (
            prop::bool::weighted(0.2),
            prop::option::weighted(0.3, (0u8..2, 0..POOL.len() + FRONTS.len())),
        ),
    )
        .prop_map(
            |(
                (producer, route_ns),
                parent,
                parent_port,
                backend,
                backend_port,
                (grpc, section),
            )| RouteGen {
                section,
                // A producer route, or a consumer route from another namespace (§2.3).
                route_ns: if producer { usize::MAX } else { route_ns },
                parent,
                parent_port,
                backend,
                backend_port,
                grpc,
            },
        )
}

/// A world: its services and, sometimes, extra routes between them.
#[derive(Clone, Debug)]
struct World {
    services: Vec<SvcGen>,
    routes: Vec<RouteGen>,
}

fn world() -> impl Strategy<Value = World> {
    (
        prop::collection::vec(svc_gen(), 1..7),
        prop::collection::vec(route_gen(), 0..3),
    )
        .prop_map(|(services, routes)| World { services, routes })
}

fn any_port(i: usize) -> u16 {
    POOL.iter()
        .chain(FRONTS.iter())
        .copied()
        .nth(i)
        .unwrap_or(UNDECLARED)
}

fn proto(p: u8) -> PortProtocol {
    PortProtocol::ALL[usize::from(p) % 3]
}

fn service_ref(name: &str, port: Option<u16>) -> (ObjectRef, Option<u16>) {
    (
        ObjectRef {
            group: String::new(),
            kind: "Service".into(),
            namespace: None,
            name: name.into(),
        },
        port,
    )
}

fn http_route(ns: &str, name: &str, backend_port: Option<u16>) -> HttpRoute {
    let (target, _) = service_ref(name, None);
    HttpRoute {
        kind: HttpRouteKind::Http,
        namespace: ns.into(),
        name: format!("{name}-route"),
        generation: 1,
        created: None,
        parents: vec![ParentRef {
            target: target.clone(),
            port: None,
            section_name: None,
        }],
        hostnames: vec![],
        rules: vec![HttpRule {
            name: None,
            matches: vec![],
            filters: vec![],
            backends: vec![HttpBackendRef {
                target,
                port: backend_port,
                weight: 1,
                filters: vec![],
            }],
            request_timeout_ms: None,
            backend_request_timeout_ms: None,
        }],
    }
}

/// Builds the snapshot a world describes, completed by the registrar (ClusterIPs included).
fn build(w: &World) -> Snapshot {
    let world = &w.services;
    let mut s = Snapshot {
        namespaces: NAMESPACES.iter().map(|n| (*n).to_owned()).collect(),
        ..Snapshot::default()
    };
    let mut seen: BTreeSet<(usize, usize)> = BTreeSet::new();
    let mut users: Vec<(String, String, UserGen)> = Vec::new();
    for (i, g) in world.iter().enumerate() {
        if !seen.insert((g.ns, g.name)) {
            continue;
        }
        let (ns, name) = (NAMESPACES[g.ns], NAMES[g.name]);
        for (j, p) in g.pods.iter().enumerate() {
            let ip = IpAddr::V4(Ipv4Addr::new(
                10,
                1,
                u8::try_from(i).unwrap(),
                u8::try_from(j + 1).unwrap(),
            ));
            let mut protocols: BTreeMap<u32, ProtocolValue> = BTreeMap::new();
            for &(k, pr) in &p.ports {
                protocols
                    .entry(u32::from(POOL[k]))
                    .or_insert(ProtocolValue::Known(proto(pr)));
            }
            let live = *protocols.keys().nth(p.live % protocols.len()).unwrap();
            if let Some(r) = p.reserved {
                protocols.insert(
                    u32::from(RESERVED[r]),
                    ProtocolValue::Known(PortProtocol::Http),
                );
            }
            let mut row = Row {
                namespace: ns.into(),
                service: name.into(),
                address: ip,
                port: live,
                ports: protocols.keys().copied().collect(),
                port_protocols: Some(protocols),
                ready: p.ready,
                pod: Some(format!("{name}-{j}")),
                node: Some("node-1".into()),
            };
            match p.problem {
                Some(0) => row.port_protocols = None,
                Some(1) => row.ports.push(7001),
                Some(2) => {
                    if let Some(m) = &mut row.port_protocols {
                        m.insert(7002, ProtocolValue::Known(PortProtocol::Http));
                    }
                }
                Some(3) => {
                    if let Some(m) = &mut row.port_protocols {
                        m.insert(live, ProtocolValue::Unknown("grpc".into()));
                    }
                }
                Some(_) => row.ports.push(0),
                None => {}
            }
            s.rows.push(Arc::new(row));
            s.pods.push(Arc::new(Pod {
                namespace: ns.into(),
                name: format!("{name}-{j}"),
                service_account: name.into(),
                node: Some("node-1".into()),
                ips: vec![ip],
                labels: [
                    ("app".to_owned(), name.to_owned()),
                    ("tier".to_owned(), format!("t{}", p.tier)),
                ]
                .into_iter()
                .collect(),
                managed: true,
                redirect_all: None,
                exclude_outbound_ports: vec![],
                exclude_outbound_ip_ranges: vec![],
                ready: p.ready,
                netns: None,
                netns_from_cni: false,
                command: vec![],
                inbound_mode: None,
                host_ips: Vec::new(),
            }));
        }
        if let Some(u) = &g.user {
            users.push((ns.into(), name.into(), u.clone()));
        } else if g.pods.is_empty() && g.cold > 0 {
            let mut ports: Vec<ServicePort> = Vec::new();
            if g.cold == 2 {
                for &(k, pr) in &g.cold_ports {
                    let port = POOL[k];
                    if ports.iter().any(|p| p.port == port) {
                        continue;
                    }
                    let (transport, app) = match proto(pr) {
                        PortProtocol::Http => (Transport::Tcp, Some("http".to_owned())),
                        PortProtocol::Tcp => (Transport::Tcp, Some("tcp".to_owned())),
                        PortProtocol::Udp => (Transport::Udp, None),
                    };
                    ports.push(ServicePort {
                        name: Some(format!("p{port}-tcp")),
                        port,
                        target: TargetPort::Number(port),
                        transport,
                        app_protocol: app,
                    });
                }
            }
            for (anchor, port) in [("mesh", 18081), ("mesh-tcp", 18082)] {
                ports.push(ServicePort {
                    name: Some(anchor.into()),
                    port,
                    target: TargetPort::Number(port),
                    transport: Transport::Tcp,
                    app_protocol: None,
                });
            }
            s.services.push(Service {
                namespace: ns.into(),
                name: name.into(),
                cluster_ips: vec![],
                headless: false,
                generated: true,
                selector: None,
                ports,
            });
        }
        if let Some((k, expired)) = g.retained {
            s.retained.push(RetainedPort {
                namespace: ns.into(),
                service: name.into(),
                port: POOL[k],
                since_ms: if expired { 10_000 } else { 150_000 },
            });
        }
        if let Some(k) = g.route_on_generated
            && g.user.is_none()
            && !g.pods.is_empty()
        {
            s.http_routes.push(http_route(ns, name, Some(POOL[k])));
        }
    }
    for (ns, name, u) in users {
        let mut ports: Vec<ServicePort> = Vec::new();
        // The number each named targetPort resolves to, per ServicePort name.
        let mut named: Vec<(String, u16)> = Vec::new();
        for &(f, kind, k) in &u.ports {
            let port = FRONTS[f];
            if ports.iter().any(|p| p.port == port) {
                continue;
            }
            let sp_name = format!("http-{port}");
            let target = match kind {
                0 => TargetPort::Same,
                1 => TargetPort::Number(POOL[k]),
                _ => {
                    named.push((sp_name.clone(), POOL[k]));
                    TargetPort::Name("web".into())
                }
            };
            ports.push(ServicePort {
                name: Some(sp_name),
                port,
                target,
                transport: Transport::Tcp,
                app_protocol: None,
            });
        }
        if u.udp {
            ports.push(ServicePort {
                name: Some("dns".into()),
                port: 5353,
                target: TargetPort::Same,
                transport: Transport::Udp,
                app_protocol: None,
            });
        }
        let selector: BTreeMap<String, String> = if u.by_tier {
            [("tier".to_owned(), format!("t{}", u.tier))].into()
        } else {
            [("app".to_owned(), name.clone())].into()
        };
        if u.slices > 0 {
            let addrs: Vec<IpAddr> = s
                .pods
                .iter()
                .filter(|p| {
                    p.namespace == ns && selector.iter().all(|(k, v)| p.labels.get(k) == Some(v))
                })
                .flat_map(|p| p.ips.iter().copied())
                .collect();
            let slice_ports = |shift: bool| -> Vec<SlicePort> {
                ports
                    .iter()
                    .filter(|p| p.transport == Transport::Tcp)
                    .map(|p| {
                        let n = match &p.target {
                            TargetPort::Same => p.port,
                            TargetPort::Number(n) => *n,
                            TargetPort::Name(_) => {
                                let n = named
                                    .iter()
                                    .find(|(sp, _)| Some(sp) == p.name.as_ref())
                                    .map_or(8080, |(_, n)| *n);
                                if shift { n + 1 } else { n }
                            }
                        };
                        SlicePort {
                            name: p.name.clone(),
                            port: Some(n),
                            transport: Transport::Tcp,
                        }
                    })
                    .collect()
            };
            let (first, second) = addrs.split_at(addrs.len() / 2);
            for (idx, part) in [second, first].into_iter().enumerate() {
                if idx == 1 && part.is_empty() && u.slices != 2 {
                    continue;
                }
                s.endpoint_slices.push(EndpointSlice {
                    namespace: ns.clone(),
                    service: name.clone(),
                    name: format!("{name}-{idx}"),
                    ports: slice_ports(idx == 1 && u.slices == 2),
                    endpoints: part
                        .iter()
                        .map(|a| SliceEndpoint {
                            addresses: vec![*a],
                            pod: None,
                            ready: true,
                        })
                        .collect(),
                });
            }
        }
        if u.routed {
            let backend = ports.get(u.backend_port).map_or(UNDECLARED, |p| p.port);
            s.http_routes.push(http_route(&ns, &name, Some(backend)));
        }
        s.services.push(Service {
            namespace: ns,
            name,
            cluster_ips: vec![],
            headless: u.headless,
            generated: false,
            selector: Some(selector),
            ports,
        });
    }
    for (i, r) in w.routes.iter().enumerate() {
        let pick = |k: usize| {
            let g = &world[k % world.len()];
            (g.ns, g.name)
        };
        let obj = |(ns, name): (usize, usize)| ObjectRef {
            group: String::new(),
            kind: "Service".into(),
            namespace: Some(NAMESPACES[ns].into()),
            name: NAMES[name].into(),
        };
        let parent = pick(r.parent);
        // Mostly a backend beside the parent; one in another namespace needs no ReferenceGrant.
        let beside: Vec<&SvcGen> = world.iter().filter(|g| g.ns == parent.0).collect();
        let backend_gen = if r.backend % 4 == 0 {
            &world[r.backend % world.len()]
        } else {
            beside[r.backend % beside.len()]
        };
        let backend = (backend_gen.ns, backend_gen.name);
        let route_ns = NAMESPACES
            .get(r.route_ns)
            .copied()
            .unwrap_or(NAMESPACES[parent.0]);
        let mut route = http_route(route_ns, "extra", None);
        route.name = format!("extra-{i}");
        if r.grpc {
            route.kind = HttpRouteKind::Grpc;
        }
        let user_parent = world
            .iter()
            .any(|g| (g.ns, g.name) == parent && g.user.is_some());
        let section_name = r.section.map(|(kind, i)| match kind {
            0 if user_parent => format!("http-{}", any_port(i)),
            0 => format!("p{}-tcp", any_port(i)),
            _ => "nope".to_owned(),
        });
        route.parents = vec![ParentRef {
            target: obj(parent),
            port: r.parent_port.map(any_port),
            section_name,
        }];
        route.rules[0].backends[0].target = obj(backend);
        // Mostly a port the backend declares, so that valid backends are common.
        let declared = backend_gen
            .user
            .as_ref()
            .and_then(|u| u.ports.first().map(|&(f, _, _)| FRONTS[f]))
            .or_else(|| backend_gen.pods.first().map(|p| POOL[p.ports[0].0]));
        let port = match declared {
            Some(p) if r.backend_port % 3 != 0 => p,
            _ => any_port(r.backend_port),
        };
        route.rules[0].backends[0].port = Some(port);
        s.http_routes.push(route);
    }
    complete_snapshot(&mut s, "10.96.0.0/16".parse().unwrap());
    s
}

fn context() -> NodeContext {
    NodeContext {
        now_ms: NOW_MS,
        ..NodeContext::default()
    }
}

// === Facts ===

/// Every (namespace, name) the world mentions, plus one the node knows nothing of.
fn all_names(s: &Snapshot) -> BTreeSet<(String, String)> {
    let mut out: BTreeSet<(String, String)> = s
        .services
        .iter()
        .map(|x| (x.namespace.clone(), x.name.clone()))
        .chain(
            s.rows
                .iter()
                .map(|r| (r.namespace.clone(), r.service.clone())),
        )
        .chain(
            s.retained
                .iter()
                .map(|r| (r.namespace.clone(), r.service.clone())),
        )
        .collect();
    out.insert(("ns-a".into(), "ghost".into()));
    out
}

fn mixed_case(s: &str) -> String {
    s.chars()
        .enumerate()
        .map(|(i, c)| {
            if i % 2 == 0 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect()
}

/// Every spelling of a name (addressing.md §4.1, §4.2), plus a partial one with a dot.
fn spellings(ctx: &NodeContext, ns: &str, name: &str) -> Vec<String> {
    let mesh = format!("{name}.{ns}.{}", ctx.domains.mesh);
    let full = format!("{name}.{ns}.svc.{}", ctx.domains.cluster);
    vec![
        mesh.clone(),
        full.clone(),
        format!("{name}.{ns}.svc"),
        format!("{name}.{ns}"),
        name.to_owned(),
        format!("{mesh}."),
        format!("{full}."),
        mesh.to_ascii_uppercase(),
        mixed_case(name),
        format!("{name}."),
    ]
}

/// Every port of the world plus an undeclared one, none, a malformed one, 18081 and 18082.
fn port_suffixes() -> Vec<String> {
    let mut ports: BTreeSet<u16> = POOL.iter().chain(FRONTS.iter()).copied().collect();
    ports.insert(UNDECLARED);
    ports.insert(18081);
    ports.insert(18082);
    let mut out: Vec<String> = ports.iter().map(|p| format!(":{p}")).collect();
    out.push(String::new());
    out.push(":08080".into());
    out
}

/// The dialled ports of the world, an undeclared one, and 18082.
fn dial_ports() -> Vec<u16> {
    let mut ports: BTreeSet<u16> = POOL.iter().chain(FRONTS.iter()).copied().collect();
    ports.insert(UNDECLARED);
    ports.insert(18082);
    ports.into_iter().collect()
}

/// Every entry path a request to `(ns, name)` can take.
fn entries(s: &Snapshot, ns: &str, name: &str) -> Vec<HttpEntry> {
    let mut out = vec![
        HttpEntry::Loopback,
        HttpEntry::ProxyCaptured {
            dialled: SocketAddr::new(OTHER, 18081),
        },
        HttpEntry::Captured {
            dialled: SocketAddr::new(OTHER, 8080),
        },
        HttpEntry::Captured {
            dialled: SocketAddr::new(OTHER, UNDECLARED),
        },
    ];
    let vip = s
        .services
        .iter()
        .find(|x| x.namespace == ns && x.name == name)
        .and_then(|x| x.cluster_ips.first().copied());
    if let Some(vip) = vip {
        out.push(HttpEntry::ProxyCaptured {
            dialled: SocketAddr::new(vip, 18081),
        });
        for d in dial_ports() {
            out.push(HttpEntry::Captured {
                dialled: SocketAddr::new(vip, d),
            });
        }
    }
    if let Some(row) = s
        .rows
        .iter()
        .find(|r| r.namespace == ns && r.service == name)
    {
        for d in dial_ports().into_iter().filter(|&d| d != 18082) {
            out.push(HttpEntry::PodIp {
                dialled: SocketAddr::new(row.address, d),
            });
        }
    }
    out
}

fn callers(ns: &str) -> [Caller; 4] {
    let other = NAMESPACES.iter().find(|n| **n != ns).unwrap_or(&"ns-b");
    let c = |namespace: Option<&str>, capture| Caller {
        namespace: namespace.map(str::to_owned),
        pod: None,
        service_account: None,
        capture,
    };
    [
        c(Some(ns), CaptureMode::RedirectAll),
        c(Some(other), CaptureMode::RedirectAll),
        c(Some(ns), CaptureMode::Scoped),
        c(None, CaptureMode::RedirectAll),
    ]
}

/// Whether a scoped pod can reach this entry at all (it captures only 18081 and 18082).
fn reachable(caller: &Caller, entry: &HttpEntry) -> bool {
    match (caller.capture, entry) {
        (CaptureMode::RedirectAll, _) => true,
        (CaptureMode::Scoped, HttpEntry::Loopback | HttpEntry::ProxyCaptured { .. }) => true,
        (CaptureMode::Scoped, HttpEntry::Captured { .. } | HttpEntry::PodIp { .. }) => false,
    }
}

/// The ways a request can carry an authority (addressing.md §2), rotated.
fn authority_input<'a>(
    form: usize,
    authority: &'a str,
    decoy: &'a [&'a str],
    hosts: &'a [&'a str],
) -> AuthorityInput<'a> {
    match form % 4 {
        // An HTTP/1.1 Host header.
        0 => AuthorityInput {
            version: HttpVersion::Http11,
            absolute: None,
            h2_authority: None,
            hosts,
        },
        // An absolute-form request whose Host says something else: the request-target wins.
        1 => AuthorityInput {
            version: HttpVersion::Http11,
            absolute: Some(authority),
            h2_authority: None,
            hosts: decoy,
        },
        // HTTP/2 :authority alone.
        2 => AuthorityInput {
            version: HttpVersion::H2,
            absolute: None,
            h2_authority: Some(authority),
            hosts: &[],
        },
        // HTTP/2 :authority with an agreeing Host.
        _ => AuthorityInput {
            version: HttpVersion::H2,
            absolute: None,
            h2_authority: Some(authority),
            hosts,
        },
    }
}

/// A `GET /` with no other header than its authority's, explained (the data plane's unexplained
/// form is compared with it in [`compare_request`]).
fn facts<'a>(
    entry: HttpEntry,
    authority: AuthorityInput<'a>,
    hold_expired: bool,
    headers: &'a HeaderMap,
) -> RequestFacts<'a> {
    RequestFacts {
        entry,
        authority,
        method: "GET",
        path_and_query: Some("/"),
        headers,
        hold_expired,
        entropy: 0,
        explain: true,
    }
}

/// One compared request; on a hold, the same request again once the hold has run out.
fn compare_request(
    s: &Snapshot,
    ctx: &NodeContext,
    model: &crate::model::Model,
    caller: &Caller,
    f: &RequestFacts<'_>,
) -> Result<RequestDecision, TestCaseError> {
    let compiled = resolve_request(model, caller, f);
    let reference = reference_request(s, ctx, caller, f);
    // Explaining changes the words of a decision, never the decision (issue #38).
    let unexplained = resolve_request(
        model,
        caller,
        &RequestFacts {
            explain: !f.explain,
            ..*f
        },
    );
    prop_assert_eq!(verdict_of(&unexplained), verdict_of(&compiled));
    prop_assert_eq!(
        &verdict_of(&compiled),
        &reference,
        "caller {:?} facts {:?}",
        caller,
        f
    );
    if matches!(reference, RequestVerdict::Hold(_)) && !f.hold_expired {
        let again = RequestFacts {
            hold_expired: true,
            ..*f
        };
        prop_assert_eq!(
            verdict_of(&resolve_request(model, caller, &again)),
            reference_request(s, ctx, caller, &again),
            "after the hold: caller {:?} facts {:?}",
            caller,
            again
        );
    }
    Ok(compiled)
}

/// STYLE.md §6.6 "port truth" and "Host never overrides the dial", addressing.md I1 and I13.
fn check_invariants(
    model: &crate::model::Model,
    ctx: &NodeContext,
    caller: &Caller,
    f: &RequestFacts<'_>,
    authority: &str,
    d: &RequestDecision,
) -> Result<(), TestCaseError> {
    let auth = crate::model::names::split_authority(authority);
    let form = crate::model::names::read_name(auth.name, &ctx.domains);
    let names_mesh_service = match &form {
        crate::model::names::NameForm::Named {
            service, namespace, ..
        } => model.classes(namespace, service).is_some(),
        crate::model::names::NameForm::Short(service) => caller
            .namespace
            .as_deref()
            .is_some_and(|ns| model.classes(ns, service).is_some()),
        crate::model::names::NameForm::Foreign => false,
    };
    match d {
        RequestDecision::Deliver(del) => {
            // Port truth: on a captured dial the front port is the dialled port.
            if let HttpEntry::Captured { dialled } | HttpEntry::PodIp { dialled } = f.entry {
                prop_assert_eq!(del.front_port, dialled.port());
            }
            // Host never overrides the dial (a pod-IP delivery never reads the Host).
            if let (HttpEntry::Captured { dialled }, Some(p)) = (f.entry, auth.port.port()) {
                prop_assert!(del.addressed.is_none() || p == dialled.port());
            }
            // I1: the addressed Service's filters run.
            if let Some(a) = &del.addressed {
                let mut all: Vec<_> = del.filter_services.clone();
                all.extend(del.backend.endpoints.iter().map(|e| e.mesh_service.clone()));
                prop_assert!(all.contains(a), "I1: {:?} not in {:?}", a, all);
            }
        }
        RequestDecision::Answer(a, _) => {
            // I13: every 4xx and 5xx mesh answer carries exactly one reason.
            let r = a.render();
            let reasons: Vec<_> = r
                .headers
                .iter()
                .filter(|(k, _)| *k == HEADER_ERROR)
                .collect();
            prop_assert_eq!(reasons.len(), 1);
            prop_assert_eq!(reasons[0].1.as_str(), a.reason.code());
            prop_assert!(r.body.starts_with(a.reason.code()));
        }
        RequestDecision::Redirect { .. } => {
            // I1: a name of a mesh service gets a delivery, an answer, a passthrough or a hold.
            prop_assert!(!names_mesh_service, "a redirect without a route rule");
        }
        RequestDecision::Passthrough(_) | RequestDecision::Hold(..) => {}
    }
    Ok(())
}

/// Compares every request of the enumeration for one snapshot.
fn check_requests(s: &Snapshot) -> Result<usize, TestCaseError> {
    let ctx = context();
    let model = compile(s, &ctx);
    let no_headers = HeaderMap::new();
    let mut n = 0usize;
    let suffixes = port_suffixes();
    for (ns, name) in all_names(s) {
        let callers = callers(&ns);
        let entries = entries(s, &ns, &name);
        for spelling in spellings(&ctx, &ns, &name) {
            for suffix in &suffixes {
                let authority = format!("{spelling}{suffix}");
                let hosts = [authority.as_str()];
                let decoy = ["decoy.example:1"];
                for entry in &entries {
                    n += 1;
                    let caller = &callers[n % callers.len()];
                    if !reachable(caller, entry) {
                        continue;
                    }
                    let input = authority_input(n / 4, &authority, &decoy, &hosts);
                    let f = facts(*entry, input, n.is_multiple_of(7), &no_headers);
                    let d = compare_request(s, &ctx, &model, caller, &f)?;
                    check_invariants(&model, &ctx, caller, &f, &authority, &d)?;
                }
            }
        }
        // Malformed authorities and a request without a name, on every entry (rows 43, 48).
        let mesh = format!("{name}.{ns}.{}", ctx.domains.mesh);
        let userinfo = format!("user@{mesh}:8080");
        let other = format!("{mesh}:9090");
        let two = [mesh.as_str(), mesh.as_str()];
        let one = [mesh.as_str()];
        let ui = [userinfo.as_str()];
        let odd: [AuthorityInput<'_>; 6] = [
            AuthorityInput {
                version: HttpVersion::Http11,
                absolute: None,
                h2_authority: None,
                hosts: &[],
            },
            AuthorityInput {
                version: HttpVersion::Http11,
                absolute: None,
                h2_authority: None,
                hosts: &two,
            },
            AuthorityInput {
                version: HttpVersion::H2,
                absolute: None,
                h2_authority: Some(&other),
                hosts: &one,
            },
            AuthorityInput {
                version: HttpVersion::Http11,
                absolute: None,
                h2_authority: None,
                hosts: &ui,
            },
            AuthorityInput {
                version: HttpVersion::Http10,
                absolute: None,
                h2_authority: None,
                hosts: &[],
            },
            AuthorityInput {
                version: HttpVersion::Http11,
                absolute: None,
                h2_authority: None,
                hosts: &[""],
            },
        ];
        for input in odd {
            for entry in &entries {
                for caller in &callers {
                    if !reachable(caller, entry) {
                        continue;
                    }
                    let f = facts(*entry, input, false, &no_headers);
                    compare_request(s, &ctx, &model, caller, &f)?;
                    let connect = RequestFacts {
                        path_and_query: None,
                        ..f
                    };
                    compare_request(s, &ctx, &model, caller, &connect)?;
                }
            }
        }
    }
    Ok(n)
}

/// Compares every captured connection for one snapshot.
fn check_connections(s: &Snapshot) -> Result<(), TestCaseError> {
    let ctx = context();
    let model = compile(s, &ctx);
    let mut addresses: BTreeSet<IpAddr> = s
        .services
        .iter()
        .flat_map(|x| x.cluster_ips.iter().copied())
        .chain(s.rows.iter().map(|r| r.address))
        .collect();
    addresses.insert(OTHER);
    let mut ports = dial_ports();
    ports.push(18081);
    for a in addresses {
        for &d in &ports {
            for caller in callers("ns-a") {
                if caller.capture == CaptureMode::Scoped && d != 18081 && d != 18082 {
                    continue;
                }
                let dialled = SocketAddr::new(a, d);
                prop_assert_eq!(
                    conn_verdict_of(&classify_connection(&model, &caller, dialled)),
                    reference_connection(s, &ctx, &caller, dialled),
                    "caller {:?} dialled {}",
                    caller,
                    dialled
                );
            }
        }
    }
    Ok(())
}

// === Shuffling and garbage ===

/// Fisher-Yates.
fn shuffle<T>(v: &mut [T], rng: &mut Mix) {
    for i in (1..v.len()).rev() {
        let j = usize::try_from(rng.next() % (i as u64 + 1)).unwrap();
        v.swap(i, j);
    }
}

/// Shuffles every list of the snapshot whose order carries no meaning (a pod's IPs and a
/// route's rules keep their order: both are ordered by the spec).
fn shuffled(s: &Snapshot, rng: &mut Mix) -> Snapshot {
    let mut s = s.clone();
    shuffle(&mut s.rows, rng);
    for r in &mut s.rows {
        shuffle(&mut Arc::make_mut(r).ports, rng);
    }
    shuffle(&mut s.refused_pods, rng);
    shuffle(&mut s.pods, rng);
    shuffle(&mut s.services, rng);
    for x in &mut s.services {
        shuffle(&mut x.ports, rng);
        shuffle(&mut x.cluster_ips, rng);
    }
    shuffle(&mut s.endpoint_slices, rng);
    for e in &mut s.endpoint_slices {
        shuffle(&mut e.ports, rng);
        shuffle(&mut e.endpoints, rng);
    }
    shuffle(&mut s.namespaces, rng);
    shuffle(&mut s.http_routes, rng);
    for r in &mut s.http_routes {
        shuffle(&mut r.parents, rng);
    }
    shuffle(&mut s.tls_routes, rng);
    shuffle(&mut s.tcp_routes, rng);
    shuffle(&mut s.udp_routes, rng);
    shuffle(&mut s.reference_grants, rng);
    shuffle(&mut s.mesh_filters, rng);
    shuffle(&mut s.retained, rng);
    s
}

fn garbage_row() -> impl Strategy<Value = Row> {
    (
        0..NAMESPACES.len(),
        0..NAMES.len(),
        0u8..8,
        prop::collection::vec(0u32..70_000, 0..4),
        prop::collection::vec((0u32..70_000, 0u8..5), 0..4),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(ns, name, host, ports, map, has_map, ready)| {
            let port = ports.first().copied().unwrap_or(8080);
            Row {
                namespace: NAMESPACES[ns].into(),
                service: NAMES[name].into(),
                address: IpAddr::V4(Ipv4Addr::new(10, 9, 0, host)),
                port,
                ports,
                port_protocols: has_map.then(|| {
                    map.into_iter()
                        .map(|(p, v)| {
                            let v = match v {
                                0..=2 => ProtocolValue::Known(proto(v)),
                                3 => ProtocolValue::Unspecified,
                                _ => ProtocolValue::Unknown("sctp".into()),
                            };
                            (p, v)
                        })
                        .collect()
                }),
                ready,
                pod: None,
                node: None,
            }
        })
}

// === The properties ===

/// The case count: `PROPTEST_CASES` for a deeper run, otherwise a count that keeps the suite
/// well under a minute in a debug build. A test's own knob: the crate's library reads no
/// environment.
#[allow(clippy::disallowed_methods)]
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(64), ..ProptestConfig::default() })]

    /// U9: the compiled answer to every request equals the reference evaluator's.
    #[test]
    fn compiled_requests_equal_the_reference(w in world()) {
        let s = build(&w);
        check_requests(&s)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(64), ..ProptestConfig::default() })]

    /// U9: the compiled classification of every captured connection equals the reference's.
    #[test]
    fn compiled_connections_equal_the_reference(w in world()) {
        let s = build(&w);
        check_connections(&s)?;
    }

    /// issue #35 item 5 (reference R4): a row of another mesh service at a served pod's
    /// address (a document that claims another pod's IP). Every connection and request equals
    /// the reference's: no pod-IP dial to the address, whichever claimant sorts first.
    #[test]
    fn a_contested_address_compiles_as_the_reference_says(
        w in world(),
        which in any::<prop::sample::Index>(),
        before in any::<bool>(),
    ) {
        let mut s = build(&w);
        if !s.rows.is_empty() {
            let mut claim = Row::clone(&s.rows[which.index(s.rows.len())]);
            // A name that sorts before or after the claimed row's own.
            claim.service = if before {
                format!("a-{}", claim.service)
            } else {
                format!("{}-z", claim.service)
            };
            claim.pod = Some("claimant".into());
            s.rows.push(Arc::new(claim));
            complete_snapshot(&mut s, "10.96.0.0/16".parse().unwrap());
        }
        check_connections(&s)?;
        check_requests(&s)?;
    }

    /// Determinism and order independence (STYLE.md §6.6).
    #[test]
    fn compile_is_deterministic_and_order_independent(
        w in world(),
        garbage in prop::collection::vec(garbage_row(), 0..4),
        duplicates in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3), 0..3),
        seed in any::<u64>(),
    ) {
        let mut s = build(&w);
        s.rows.extend(garbage.into_iter().map(Arc::new));
        // Rows listed twice (one pod in two protocol listings), the copy disagreeing.
        for (i, how) in duplicates {
            if s.rows.is_empty() {
                break;
            }
            let mut copy = Row::clone(&s.rows[i.index(s.rows.len())]);
            match how {
                0 => copy.ready = !copy.ready,
                1 => copy.pod = Some("other".into()),
                _ => {
                    if let Some(m) = &mut copy.port_protocols {
                        for v in m.values_mut() {
                            *v = ProtocolValue::Known(PortProtocol::Tcp);
                        }
                    }
                }
            }
            s.rows.push(Arc::new(copy));
        }
        let ctx = context();
        let once = compile(&s, &ctx);
        prop_assert_eq!(&once, &compile(&s, &ctx));
        let mut rng = Mix(seed);
        for _ in 0..3 {
            prop_assert_eq!(&once, &compile(&shuffled(&s, &mut rng), &ctx));
        }
    }

    /// Totality: no panic on arbitrary snapshots, garbage rows included.
    #[test]
    fn compile_and_resolve_are_total(
        w in world(),
        garbage in prop::collection::vec(garbage_row(), 0..8),
    ) {
        let mut s = build(&w);
        s.rows.extend(garbage.into_iter().map(Arc::new));
        let ctx = context();
        let model = compile(&s, &ctx);
        let caller = callers("ns-a")[0].clone();
        let no_headers = HeaderMap::new();
        for row in &s.rows {
            for d in [0u16, 80, 8080, 9000, 18081, 18082, 65535] {
                let dialled = SocketAddr::new(row.address, d);
                let _ = classify_connection(&model, &caller, dialled);
                let hosts = ["alpha.ns-a.aether.internal:8080"];
                for entry in [HttpEntry::PodIp { dialled }, HttpEntry::Captured { dialled }] {
                    let f = facts(entry, authority_input(0, hosts[0], &[], &hosts), true, &no_headers);
                    let _ = resolve_request(&model, &caller, &f);
                }
            }
        }
    }
}

// === Regressions: the disagreements the properties found, as plain tests ===

fn one_pod(ports: &[(usize, u8)], ready: bool) -> PodGen {
    PodGen {
        ports: ports.to_vec(),
        live: 0,
        ready,
        problem: None,
        reserved: None,
        tier: 0,
    }
}

fn svc(pods: Vec<PodGen>, user: Option<UserGen>) -> SvcGen {
    SvcGen {
        ns: 0,
        name: 0,
        pods,
        user,
        cold: 0,
        cold_ports: vec![],
        retained: None,
        route_on_generated: None,
    }
}

fn user(ports: Vec<(usize, u8, usize)>, slices: u8) -> UserGen {
    UserGen {
        routed: false,
        headless: false,
        ports,
        udp: false,
        by_tier: false,
        tier: 0,
        slices,
        backend_port: 0,
    }
}

fn loopback(s: &Snapshot, host: &str) -> (RequestVerdict, RequestVerdict) {
    let ctx = context();
    let model = compile(s, &ctx);
    let caller = callers("ns-a")[0].clone();
    let hosts = [host];
    let no_headers = HeaderMap::new();
    let f = facts(
        HttpEntry::Loopback,
        authority_input(0, host, &[], &hosts),
        false,
        &no_headers,
    );
    (
        verdict_of(&resolve_request(&model, &caller, &f)),
        reference_request(s, &ctx, &caller, &f),
    )
}

/// spec/model.md §10: a generated Service's real ports are evidence; a retained port it does
/// not declare is gone in the same refresh.
#[test]
fn a_retained_entry_yields_to_the_generated_services_real_ports() {
    let mut g = svc(vec![], None);
    g.cold = 2;
    g.cold_ports = vec![(2, 0)]; // 9000/http
    g.retained = Some((0, false)); // 80
    let s = build(&World {
        services: vec![g],
        routes: vec![],
    });
    let (compiled, reference) = loopback(&s, "alpha.ns-a.aether.internal:80");
    assert_eq!(compiled, reference);
    assert_eq!(
        compiled,
        RequestVerdict::Answer {
            status: 421,
            reason: "port-not-declared".into(),
            service: Some(("alpha.ns-a.aether.internal".into(), "9000/http".into())),
        }
    );
}

/// spec/model.md §10: a retained entry is removed at 90 s.
#[test]
fn a_retained_entry_ends_with_its_grace() {
    let mut g = svc(vec![], None);
    g.retained = Some((0, true));
    let s = build(&World {
        services: vec![g],
        routes: vec![],
    });
    let (compiled, reference) = loopback(&s, "alpha.ns-a.aether.internal:80");
    assert_eq!(compiled, reference);
    assert_eq!(compiled, RequestVerdict::Hold(HoldKind::UnknownName));
}

/// addressing.md §4.3, §4.5 (d): a user Service of the name makes its mesh name (e), at once.
#[test]
fn an_unrelated_user_services_mesh_name_is_never_held() {
    let s = build(&World {
        services: vec![svc(vec![], Some(user(vec![(0, 0, 0)], 0)))],
        routes: vec![],
    });
    let (compiled, reference) = loopback(&s, "alpha.ns-a.aether.internal:80");
    assert_eq!(compiled, reference);
    assert_eq!(
        compiled,
        RequestVerdict::Answer {
            status: 404,
            reason: "not-a-mesh-name".into(),
            service: None,
        }
    );
}

/// spec/model.md §9.2: the slice port carrying the ServicePort's name gives the number.
#[test]
fn a_named_target_port_resolves_through_the_service_ports_name() {
    // meshOnly alpha: user Service 80 -> targetPort "web", slices say http-80 = 9000.
    let s = build(&World {
        services: vec![svc(
            vec![one_pod(&[(2, 0)], true)],
            Some(user(vec![(0, 2, 2)], 1)),
        )],
        routes: vec![],
    });
    let (compiled, reference) = loopback(&s, "alpha.ns-a.aether.internal:80");
    assert_eq!(compiled, reference);
    assert!(
        matches!(compiled, RequestVerdict::Deliver { pod_port: 9000, .. }),
        "{compiled:?}"
    );
}

/// spec/model.md §3.4, §6.1: a pod listed twice compiles the same in any order.
#[test]
fn duplicate_rows_compile_the_same_in_any_order() {
    let mut s = build(&World {
        services: vec![svc(vec![one_pod(&[(0, 0)], true)], None)],
        routes: vec![],
    });
    let mut copy = Row::clone(&s.rows[0]);
    if let Some(m) = &mut copy.port_protocols {
        for v in m.values_mut() {
            *v = ProtocolValue::Known(PortProtocol::Tcp);
        }
    }
    s.rows.push(Arc::new(copy));
    let ctx = context();
    let forward = compile(&s, &ctx);
    s.rows.reverse();
    assert_eq!(forward, compile(&s, &ctx));
}

/// routes.md §2.1: a sectionName names the ServicePort of that name, on a user Service too.
#[test]
fn a_section_name_attaches_to_a_user_services_named_port() {
    // Routed user Service alpha: 8080 -> 8080, ServicePort "http-8080"; the route's parentRef
    // names that section and sends everything to beta:8080.
    let mut u = user(vec![(1, 0, 0)], 1);
    u.routed = false;
    let mut b = svc(vec![one_pod(&[(1, 0)], true)], None);
    b.name = 1;
    let s = build(&World {
        services: vec![svc(vec![one_pod(&[(1, 0)], true)], Some(u)), b],
        routes: vec![RouteGen {
            route_ns: usize::MAX,
            parent: 0,
            parent_port: None,
            section: Some((0, 6)), // FRONTS[1] = 8080
            backend: 1,
            backend_port: 1,
            grpc: false,
        }],
    });
    assert_eq!(
        s.http_routes[0].parents[0].section_name.as_deref(),
        Some("http-8080")
    );
    let (compiled, reference) = loopback(&s, "alpha.ns-a.aether.internal:8080");
    assert_eq!(compiled, reference);
    assert!(
        matches!(&compiled, RequestVerdict::Deliver { backend, .. } if backend.1 == "beta"),
        "{compiled:?}"
    );
}

// === Components (crate::model::split) ===

/// Objects the world generator has none of: MeshFilters (with their targets), L4 routes,
/// refused pods, and a route rule's ExtensionRef to a filter.
#[derive(Clone, Debug)]
enum Extra {
    Filter {
        ns: usize,
        name: usize,
        targets: Vec<usize>,
        kind: u8,
    },
    L4 {
        kind: u8,
        ns: usize,
        parent: usize,
        port: Option<u16>,
        backend_ns: Option<usize>,
        backend: usize,
        backend_port: u16,
    },
    Refused {
        ns: usize,
        name: usize,
    },
    ExtensionRef {
        route: prop::sample::Index,
        filter: usize,
    },
}

fn extra() -> impl Strategy<Value = Extra> {
    prop_oneof![
        (
            0..NAMESPACES.len(),
            0..2usize,
            prop::collection::vec(0..NAMES.len(), 1..3),
            0u8..5
        )
            .prop_map(|(ns, name, targets, kind)| Extra::Filter {
                ns,
                name,
                targets,
                kind
            }),
        (
            0u8..3,
            0..NAMESPACES.len(),
            0..NAMES.len(),
            prop::option::of(prop::sample::select(FRONTS.to_vec())),
            prop::option::of(0..NAMESPACES.len()),
            0..NAMES.len(),
            prop::sample::select(POOL.to_vec()),
        )
            .prop_map(
                |(kind, ns, parent, port, backend_ns, backend, backend_port)| Extra::L4 {
                    kind,
                    ns,
                    parent,
                    port,
                    backend_ns,
                    backend,
                    backend_port
                }
            ),
        (0..NAMESPACES.len(), 0..NAMES.len()).prop_map(|(ns, name)| Extra::Refused { ns, name }),
        (any::<prop::sample::Index>(), 0..2usize)
            .prop_map(|(route, filter)| Extra::ExtensionRef { route, filter }),
    ]
}

fn add_extra(s: &mut Snapshot, e: &Extra) {
    use crate::model::snapshot::{
        ExtAuthz, FilterConfig, HeaderMutation, HttpFilter, L4BackendRef, L4Route, L4Rule,
        MeshFilter, Principal, Rbac, RbacAction, RefusedPod,
    };
    const FILTERS: [&str; 2] = ["guard", "authz"];
    match e {
        Extra::Filter {
            ns,
            name,
            targets,
            kind,
        } => s.mesh_filters.push(MeshFilter {
            namespace: NAMESPACES[*ns].into(),
            name: FILTERS[*name].into(),
            target_refs: targets.iter().map(|t| NAMES[*t].to_owned()).collect(),
            config: match kind {
                0 => FilterConfig::Rbac(Rbac {
                    action: RbacAction::Allow,
                    principals: vec![Principal {
                        namespace: Some("ns-a".into()),
                        service_account: None,
                    }],
                }),
                1 => FilterConfig::ExtAuthz(ExtAuthz {
                    server: Some("alpha".into()),
                    timeout_ms: 100,
                }),
                // Unreadable (issue #35 item 1): with its targets, or of its whole namespace.
                3 | 4 => FilterConfig::Unreadable(crate::model::snapshot::Unreadable {
                    why: "extAuthz.server has no port".into(),
                    whole_namespace: *kind == 4,
                }),
                _ => FilterConfig::HeaderMutation(HeaderMutation::default()),
            },
        }),
        Extra::L4 {
            kind,
            ns,
            parent,
            port,
            backend_ns,
            backend,
            backend_port,
        } => {
            let (parent_ref, _) = service_ref(NAMES[*parent], None);
            let (mut backend_ref, _) = service_ref(NAMES[*backend], None);
            backend_ref.namespace = backend_ns.map(|n| NAMESPACES[n].to_owned());
            let route = L4Route {
                namespace: NAMESPACES[*ns].into(),
                name: format!(
                    "l4-{}-{}",
                    NAMES[*parent],
                    s.tcp_routes.len() + s.tls_routes.len()
                ),
                generation: 1,
                created: None,
                parents: vec![ParentRef {
                    target: parent_ref,
                    port: *port,
                    section_name: None,
                }],
                hostnames: if *kind == 1 {
                    vec![format!("{}.example", NAMES[*parent])]
                } else {
                    vec![]
                },
                rules: vec![L4Rule {
                    name: None,
                    backends: vec![L4BackendRef {
                        target: backend_ref,
                        port: Some(*backend_port),
                        weight: 1,
                        weight_given: false,
                    }],
                }],
            };
            match kind {
                0 => s.tcp_routes.push(route),
                1 => s.tls_routes.push(route),
                _ => s.udp_routes.push(route),
            }
        }
        Extra::Refused { ns, name } => s.refused_pods.push(RefusedPod {
            namespace: NAMESPACES[*ns].into(),
            name: format!("{}-9", NAMES[*name]),
            detail: "endpoint.aether.io/port: not a number".into(),
        }),
        Extra::ExtensionRef { route, filter } => {
            if s.http_routes.is_empty() {
                return;
            }
            let i = route.index(s.http_routes.len());
            if let Some(rule) = s.http_routes[i].rules.first_mut() {
                rule.filters.push(HttpFilter::ExtensionRef(ObjectRef {
                    group: "aether.io".into(),
                    kind: "MeshFilter".into(),
                    namespace: None,
                    name: FILTERS[*filter].into(),
                }));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(128), ..ProptestConfig::default() })]

    /// The components of a snapshot compile alone: the merge of their models is the model of
    /// the whole, and so is the merge with one component recompiled from a changed snapshot
    /// (what an incremental compile does).
    #[test]
    fn the_merge_of_the_components_models_is_the_model(
        w in world(),
        garbage in prop::collection::vec(garbage_row(), 0..4),
        extras in prop::collection::vec(extra(), 0..6),
        changed in any::<prop::sample::Index>(),
        how in 0u8..3,
    ) {
        use crate::model::split::{Compiled, merge, partition, restrict};
        let mut s = build(&w);
        s.rows.extend(garbage.into_iter().map(Arc::new));
        for e in &extras {
            add_extra(&mut s, e);
        }
        let ctx = context();
        let whole = compile(&s, &ctx);
        let p = partition(&s);
        let parts: Vec<_> = (0..p.count)
            .map(|c| compile(&restrict(&s, &p, |x| x == c), &ctx))
            .collect();
        prop_assert_eq!(&merge(&ctx, &parts), &whole);

        // One row changed in what it says, not in what it names: only its component is
        // compiled again.
        if s.rows.is_empty() {
            return Ok(());
        }
        let i = changed.index(s.rows.len());
        let mut next = s.clone();
        let row = Arc::make_mut(&mut next.rows[i]);
        match how {
            0 => row.ready = !row.ready,
            1 => {
                if let Some(m) = &mut row.port_protocols {
                    for v in m.values_mut() {
                        *v = ProtocolValue::Known(PortProtocol::Tcp);
                    }
                }
            }
            _ => row.port_protocols = None,
        }
        prop_assert_eq!(&partition(&next), &p);
        let dirty = p.row(i);
        let mut parts = parts;
        parts[dirty as usize] = compile(&restrict(&next, &p, |x| x == dirty), &ctx);
        let expected = compile(&next, &ctx);
        prop_assert_eq!(&merge(&ctx, &parts), &expected);

        // The same through the kept parts: the first update compiles every component, the
        // next one only the changed row's (when the row changed at all).
        let mut kept = Compiled::default();
        let (first, stats) = kept.update(&s, &ctx);
        prop_assert_eq!(&first, &whole);
        prop_assert_eq!(stats.compiled, p.count as usize);
        let (second, stats) = kept.update(&next, &ctx);
        prop_assert_eq!(&second, &expected);
        prop_assert!(stats.compiled <= 1, "{:?}", stats);
        prop_assert_eq!(stats.compiled + stats.reused, p.count as usize);
        // A change of what objects name: rows and routes gone, the parts reshaped.
        let mut third = next.clone();
        third.rows.retain(|r| r.address != next.rows[i].address);
        third.http_routes.truncate(third.http_routes.len() / 2);
        let (model, _) = kept.update(&third, &ctx);
        prop_assert_eq!(&model, &compile(&third, &ctx));
        // The clock moved: parts with retained ports are compiled again.
        let later = NodeContext { now_ms: NOW_MS + 100_000, ..ctx };
        let (model, _) = kept.update(&third, &later);
        prop_assert_eq!(&model, &compile(&third, &later));
    }
}

// === The model kept by changes (issue #37) ===

/// One small change to the objects `now` holds, as a registry makes them: a pod or row added,
/// moved to another's address, made Ready or not, removed; a Service's ClusterIP moved onto
/// another's; a route or filter retargeted or removed. `None` when `now` is empty.
fn small_change(
    now: &BTreeMap<crate::model::live::ObjectKey, crate::model::live::Object>,
    rng: &mut Mix,
) -> Option<crate::model::live::Change> {
    use crate::model::live::{Change, Object};
    if now.is_empty() {
        return None;
    }
    let pick = |rng: &mut Mix| {
        let i = usize::try_from(rng.next() % now.len() as u64).unwrap();
        now.iter().nth(i).unwrap()
    };
    let (key, object) = pick(rng);
    let (_, other) = pick(rng);
    // An address another object holds, or a new one.
    let address = match other {
        Object::Row(r) => r.address,
        Object::Pod(p) if !p.ips.is_empty() => p.ips[0],
        Object::Service(v) if !v.cluster_ips.is_empty() => v.cluster_ips[0],
        _ => IpAddr::V4(Ipv4Addr::new(10, 77, 0, (rng.next() % 200) as u8)),
    };
    let how = rng.next() % 4;
    if how == 0 {
        return Some(Change::delete(key.kind, key.name.clone()));
    }
    let changed = match object.clone() {
        Object::Row(mut r) => {
            let row = Arc::make_mut(&mut r);
            match how {
                1 => row.ready = !row.ready,
                2 => row.address = address,
                _ => {
                    // A new pod of the same service, elsewhere.
                    row.address = IpAddr::V4(Ipv4Addr::new(10, 78, 0, (rng.next() % 200) as u8));
                    return Some(Change::put(
                        format!("{}/new-{}", key.name, rng.next() % 1000),
                        Object::Row(r),
                    ));
                }
            }
            Object::Row(r)
        }
        Object::Pod(mut p) => {
            let pod = Arc::make_mut(&mut p);
            match how {
                1 => pod.ips = vec![address],
                2 => pod.ips.clear(),
                _ => {
                    pod.name = format!("{}-new{}", pod.name, rng.next() % 1000);
                    return Some(Change::put(
                        format!("{}/{}", pod.namespace, pod.name),
                        Object::Pod(p),
                    ));
                }
            }
            Object::Pod(p)
        }
        Object::Service(mut v) => {
            match how {
                1 => v.cluster_ips = vec![address],
                2 => {
                    v.ports.pop();
                }
                _ => v.ports.reverse(),
            }
            Object::Service(v)
        }
        Object::HttpRoute(mut r) => {
            let other = NAMES[(rng.next() % NAMES.len() as u64) as usize];
            match how {
                1 => {
                    if let Some(b) = r
                        .rules
                        .first_mut()
                        .and_then(|rule| rule.backends.first_mut())
                    {
                        b.target.name = other.into();
                    }
                }
                2 => {
                    if let Some(p) = r.parents.first_mut() {
                        p.target.name = other.into();
                    }
                }
                _ => r.generation += 1,
            }
            Object::HttpRoute(r)
        }
        Object::MeshFilter(mut f) => {
            match how {
                1 => f.target_refs = vec![NAMES[(rng.next() % NAMES.len() as u64) as usize].into()],
                _ => f.target_refs.clear(),
            }
            Object::MeshFilter(f)
        }
        Object::EndpointSlice(mut e) => {
            match how {
                1 => {
                    for ep in &mut e.endpoints {
                        ep.ready = !ep.ready;
                    }
                }
                _ => {
                    e.endpoints.pop();
                }
            }
            Object::EndpointSlice(e)
        }
        // Anything else: removed.
        _ => return Some(Change::delete(key.kind, key.name.clone())),
    };
    Some(Change::put(key.name.clone(), changed))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(48), ..ProptestConfig::default() })]

    /// The model kept by changes is, after every change, the model `compile` gives for the
    /// objects it holds: through small changes (pods added, moved, made Ready or not, removed;
    /// ClusterIPs moved onto another's; routes and filters retargeted or removed, splitting
    /// and joining components), through the jump from one random world to the next in random
    /// batches, and when the clock moves. On failure proptest prints the case and `seed`, the
    /// seed of the changes' order; `PROPTEST_CASES=10000` runs the longer check.
    #[test]
    fn the_kept_model_is_the_compile_of_its_objects_after_every_change(
        worlds in prop::collection::vec(
            (world(), prop::collection::vec(extra(), 0..6), prop::collection::vec(garbage_row(), 0..3)),
            2..4,
        ),
        seed in any::<u64>(),
    ) {
        use crate::model::live::{Change, Live, Object, ObjectKey, keyed};
        let ctx = context();
        let mut rng = Mix(seed);
        let snapshots: Vec<Snapshot> = worlds
            .iter()
            .map(|(w, extras, garbage)| {
                let mut s = build(w);
                s.rows.extend(garbage.iter().cloned().map(Arc::new));
                for e in extras {
                    add_extra(&mut s, e);
                }
                s
            })
            .collect();
        let held = |changes: Vec<Change>| -> BTreeMap<ObjectKey, Object> {
            changes.into_iter().filter_map(|c| Some((c.key, c.object?))).collect()
        };
        let mut live = Live::new(ctx.clone());
        live.resync(keyed(&snapshots[0]));
        let expected = compile(&snapshots[0], &ctx);
        if let Some(d) = model_difference(live.model(), &expected) {
            prop_assert!(false, "seed {}: {}", seed, d);
        }
        let mut now = held(keyed(&snapshots[0]));
        let mut follower = Live::new(ctx.clone());
        let first = follower.update_to(&snapshots[0], &ctx);
        prop_assert!(first.full, "seed {}: the first fill is full: {:?}", seed, first);
        for (step, next) in snapshots[1..].iter().enumerate() {
            for small in 0..8 {
                let Some(change) = small_change(&now, &mut rng) else { break };
                match &change.object {
                    Some(o) => now.insert(change.key.clone(), o.clone()),
                    None => now.remove(&change.key),
                };
                let described = format!("{:?} {:?}", change.key, change.object.as_ref().map(Object::kind));
                let before = live.model().clone();
                let applied = live.apply([change]);
                let s = live.snapshot();
                let expected = compile(&s, &ctx);
                if let Some(d) = model_difference(live.model(), &expected) {
                    prop_assert!(false, "seed {}, world {}, small change {}: {}: {}", seed, step, small, described, d);
                }
                series_said(&before, live.model(), &applied).map_err(|e| {
                    TestCaseError::fail(format!("seed {seed}, world {step}, small change {small}: {described}: {e}"))
                })?;
            }
            // The jump: what differs, in random batches.
            let target = held(keyed(next));
            let mut diff: Vec<Change> = now
                .keys()
                .filter(|k| !target.contains_key(k))
                .map(|k| Change::delete(k.kind, k.name.clone()))
                .chain(
                    target
                        .iter()
                        .filter(|(k, o)| now.get(k) != Some(o))
                        .map(|(k, o)| Change { key: k.clone(), object: Some(o.clone()) }),
                )
                .collect();
            shuffle(&mut diff, &mut rng);
            while !diff.is_empty() {
                let n = 1 + usize::try_from(rng.next() % diff.len() as u64).unwrap();
                let batch: Vec<Change> = diff.drain(..n).collect();
                let before = live.model().clone();
                let applied = live.apply(batch);
                let expected = compile(&live.snapshot(), &ctx);
                if let Some(d) = model_difference(live.model(), &expected) {
                    prop_assert!(false, "seed {}, jump to world {}: {}", seed, step + 1, d);
                }
                series_said(&before, live.model(), &applied).map_err(|e| {
                    TestCaseError::fail(format!("seed {seed}, jump to world {}: {e}", step + 1))
                })?;
            }
            let expected = compile(next, &ctx);
            if let Some(d) = model_difference(live.model(), &expected) {
                prop_assert!(false, "seed {}, world {}: {}", seed, step + 1, d);
            }
            // A node whose source gives whole snapshots follows by comparing (`update_to`):
            // the same model, compiled incrementally.
            let was_empty = follower.is_empty();
            let applied = follower.update_to(next, &ctx);
            prop_assert!(!applied.full || was_empty, "seed {}: {:?}", seed, applied);
            if let Some(d) = model_difference(follower.model(), &expected) {
                prop_assert!(false, "seed {}, world {}, followed by snapshots: {}", seed, step + 1, d);
            }
            now = target;
        }
        // The clock moves: retained ports expire as `compile` says.
        let later = NodeContext { now_ms: NOW_MS + 100_000, ..ctx };
        live.set_context(later.clone());
        let expected = compile(&live.snapshot(), &later);
        if let Some(d) = model_difference(live.model(), &expected) {
            prop_assert!(false, "seed {}, the clock moved: {}", seed, d);
        }
        // Another setting: everything compiled again.
        let other = NodeContext { trust_domain: "example.org".into(), ..later };
        live.set_context(other.clone());
        let expected = compile(&live.snapshot(), &other);
        if let Some(d) = model_difference(live.model(), &expected) {
            prop_assert!(false, "seed {}, a new setting: {}", seed, d);
        }
    }
}

/// Whether `applied` says the metric series' keys changed exactly when they did: the service
/// ports or the sources of `after` are not those of `before`.
fn series_said(
    before: &crate::model::Model,
    after: &crate::model::Model,
    applied: &crate::model::live::Applied,
) -> Result<(), String> {
    let changed =
        before.service_ports() != after.service_ports() || before.sources() != after.sources();
    if applied.full || applied.series_changed == changed {
        Ok(())
    } else {
        Err(format!(
            "the series' keys changed: {changed}; the kept model said {}",
            applied.series_changed
        ))
    }
}
