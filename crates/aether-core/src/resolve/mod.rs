//! Request and connection facts to decisions: the resolvers.
//!
//! Purity contract: every function here is a synchronous, total function of one loaded
//! [`Model`] and the facts it is given; no IO, no clock, no globals. The daemon and
//! `aether explain` call the same functions.
//!
//! Three questions, in the order a connection asks them:
//! 1. [`classify_connection`]: a captured TCP connection at accept (addressing.md §3);
//! 2. [`resolve_sniffed`]: the same connection once its first bytes are known (§3.1);
//! 3. [`resolve_request`]: each HTTP request on it, or on the loopback proxy port (§4–§8).
#![warn(missing_docs)]

use crate::prelude::*;

pub mod answer;
pub mod decision;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::model::attach::TlsRule;
use crate::model::filters;
use crate::model::names::{HostPort, NameForm, effective_authority, read_name, split_authority};
use crate::model::port::{
    CAPTURE_PORT, LEGACY_PORT, MESH_HOP_PORT, PORTLESS_PROXY_PORT, PROXY_PORT, PortClass,
    PortProtocol,
};
use crate::model::route_match::RequestView;
use crate::model::snapshot::FilterConfig;
use crate::model::{FrontPort, Model, NameEntry, NameKind, NamedFilter};
use answer::{MeshAnswer, Reason};
use decision::{
    AfterSniff, Caller, CaptureMode, ConnDecision, Delivery, Fallback, HoldFor, HttpBackend,
    HttpEntry, RequestDecision, RequestFacts, RouteRun, RuleRef, ServiceKey, SniffPlan, Sniffed,
    TcpBackend, TcpChoice, Why,
};

/// Classifies a captured TCP connection when it is accepted (addressing.md §3, steps 0–5).
pub fn classify_connection(model: &Model, caller: &Caller, dialled: SocketAddr) -> ConnDecision {
    let (a, d) = (dialled.ip(), dialled.port());
    if d == CAPTURE_PORT || d == MESH_HOP_PORT {
        // A connection the capture rules sent never dialled the daemon's own listeners: one
        // that did is a direct connection to the capture listener (or a pod dialling a
        // reserved port), and passing it through would dial the daemon itself.
        return ConnDecision::Close(Why::new(
            "model.md §12.5 item 4",
            format!("{d} is a reserved port of the daemon: never dialled for a pod"),
        ));
    }
    let cluster = model.cluster_ips.get(&a);
    if d == PROXY_PORT {
        // §9: the proxy port; TLS to a service without HTTP ports may take a TLSRoute.
        let tls = cluster
            .filter(|t| t.http.is_empty())
            .map(|t| tls_rules(&t.tls.rules_for(d)))
            .unwrap_or_default();
        return ConnDecision::Sniff(SniffPlan {
            http: Some(HttpEntry::ProxyCaptured { dialled }),
            tls,
            otherwise: Fallback::Passthrough,
            why: Why::new(
                "addressing.md §9",
                "a captured dial to port 18081 is the proxy port",
            ),
        });
    }
    // Step 0: a pod-IP dial; the address decides.
    if d != LEGACY_PORT
        && let Some(pod) = model.pod_ips.get(&a)
    {
        if pod.contested.is_some() {
            // docs/decisions.md, "An address two rows claim": no claimant owns it, so nothing
            // is sent to it, over the hop or in plaintext, until the conflict ends.
            return ConnDecision::Close(Why::new(
                "addressing.md §3 step 0",
                "a pod-IP dial to an address that rows of more than one service claim: refused until one goes",
            ));
        }
        return match pod.declared.get(&d) {
            Some(PortProtocol::Tcp) => match pod.tcp.get(&d) {
                Some(choice) => ConnDecision::Tcp(choice.clone()),
                None => ConnDecision::Passthrough(Why::new(
                    "addressing.md §3 step 0",
                    "no raw-TCP entry",
                )),
            },
            Some(PortProtocol::Http) => ConnDecision::Sniff(SniffPlan {
                http: Some(HttpEntry::PodIp { dialled }),
                tls: Vec::new(),
                otherwise: Fallback::Passthrough,
                why: Why::new(
                    "addressing.md §3 step 0",
                    "a pod-IP dial to a port the pod declares HTTP: that pod, by its address",
                ),
            }),
            Some(PortProtocol::Udp) | None => ConnDecision::Passthrough(Why::new(
                "addressing.md §3 step 0",
                "a pod-IP dial to a port the pod does not declare: passthrough at once",
            )),
        };
    }
    if let Some(t) = cluster {
        let raw = if d == LEGACY_PORT {
            t.legacy.as_ref().map(|c| (c, "legacy target"))
        } else {
            t.tcp.get(&d).map(|c| (c, "raw-TCP port"))
        };
        if let Some((choice, what)) = raw {
            if t.tls.is_empty() {
                // Step 1: decided at accept; the choice carries its own reason.
                return ConnDecision::Tcp(choice.clone());
            }
            let why = Why::new(
                "addressing.md §3 step 2",
                format!("{a}:{d} is the {what} of {}, which has TLSRoutes", t.key),
            );
            return ConnDecision::Sniff(SniffPlan {
                http: None,
                tls: tls_rules(&t.tls.rules_for(d)),
                otherwise: Fallback::Tcp(choice.clone()),
                why,
            });
        }
        let rules = t.tls.rules_for(d);
        if !rules.is_empty() && !t.http.contains(&d) {
            let scoped_legacy = caller.capture == CaptureMode::Scoped && d == LEGACY_PORT;
            return ConnDecision::Sniff(SniffPlan {
                http: (!scoped_legacy).then_some(HttpEntry::Captured { dialled }),
                tls: tls_rules(&rules),
                otherwise: if scoped_legacy {
                    Fallback::Close
                } else {
                    Fallback::Passthrough
                },
                why: Why::new(
                    "addressing.md §3 step 3",
                    format!(
                        "{} has TLSRoutes and {d} is not one of its HTTP ports",
                        t.key
                    ),
                ),
            });
        }
    }
    if caller.capture == CaptureMode::Scoped && d == LEGACY_PORT {
        return ConnDecision::Close(Why::new(
            "addressing.md §3 step 4",
            "scoped capture: 18082 to an address that is no raw-TCP legacy target",
        ));
    }
    ConnDecision::Sniff(SniffPlan {
        http: Some(HttpEntry::Captured { dialled }),
        tls: Vec::new(),
        otherwise: Fallback::Passthrough,
        why: Why::new(
            "addressing.md §3 step 5",
            "sniff: HTTP is handled, anything else passes through",
        ),
    })
}

/// What a UDP datagram from a managed pod to `dialled` gets (addressing.md §10.2, rows 29–31).
pub fn resolve_udp(model: &Model, dialled: SocketAddr) -> decision::UdpDecision {
    use decision::UdpDecision;
    if dialled.port() != LEGACY_PORT {
        return UdpDecision::NotCaptured(Why::new(
            "addressing.md §10.2",
            "UDP is captured on port 18082 only; the cluster's own routing decides",
        ));
    }
    let route = model
        .cluster_ips
        .get(&dialled.ip())
        .and_then(|t| t.udp.as_ref());
    match route.and_then(|c| c.backends.first()) {
        Some((_, TcpBackend::Target(t))) => UdpDecision::Forward(t.clone()),
        Some((_, TcpBackend::Invalid(why))) => UdpDecision::Drop(why.clone()),
        None => UdpDecision::Drop(Why::new(
            "addressing.md §10.2",
            "no UDPRoute has this address as its parent",
        )),
    }
}

fn tls_rules(rules: &[TlsRule]) -> Vec<(Vec<Arc<str>>, TcpChoice)> {
    rules
        .iter()
        .map(|r| (r.hostnames.clone(), r.choice.clone()))
        .collect()
}

/// Whether a TLSRoute hostname matches an SNI (exact, or `*.` matching one or more labels).
fn sni_matches(pattern: &str, sni: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => sni
            .strip_suffix(suffix)
            .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        None => pattern.eq_ignore_ascii_case(sni),
    }
}

/// What a sniffed connection becomes (addressing.md §3.1, §3.3).
pub fn resolve_sniffed(plan: &SniffPlan, sniffed: &Sniffed) -> AfterSniff {
    if let Sniffed::Tls(Some(sni)) = sniffed {
        let sni = sni.to_ascii_lowercase();
        for (hostnames, choice) in &plan.tls {
            if hostnames.is_empty() || hostnames.iter().any(|h| sni_matches(h, &sni)) {
                return AfterSniff::Tcp(choice.clone());
            }
        }
    }
    if let (Sniffed::Http, Some(entry)) = (sniffed, plan.http) {
        return AfterSniff::Http(entry);
    }
    match &plan.otherwise {
        Fallback::Passthrough => AfterSniff::Passthrough,
        Fallback::Tcp(c) => AfterSniff::Tcp(c.clone()),
        Fallback::Close => AfterSniff::Close,
    }
}

/// The category of an authority's name (addressing.md §4.5).
enum Category<'m> {
    /// (a) a mesh name; (b) a meshOnly mesh name.
    Mesh(&'m NameEntry),
    /// (c) a short name with no caller namespace.
    CallerUnknown,
    /// (d) an unknown name of the mesh-name shape.
    UnknownMeshName,
    /// (e) not the mesh's.
    Foreign,
}

fn categorise<'m>(model: &'m Model, caller: &Caller, name: &str) -> Category<'m> {
    let lookup = |ns: &str, svc: &str| model.name(ns, svc);
    match read_name(name, &model.context.domains) {
        NameForm::Named {
            family,
            service,
            namespace,
        } => {
            let found = lookup(&namespace, &service);
            if found.is_some_and(|e| e.kind == NameKind::Unrelated) {
                // addressing.md §4.3 row 5, §4.5 (d): a user Service of the name is not unknown.
                return Category::Foreign;
            }
            let entry = found.filter(|e| e.known);
            match (family, entry) {
                (crate::model::names::Family::Mesh, Some(e)) => Category::Mesh(e),
                (crate::model::names::Family::Mesh, None) => Category::UnknownMeshName,
                (_, Some(e)) if e.kind != NameKind::MeshOnly => Category::Mesh(e),
                _ => Category::Foreign,
            }
        }
        NameForm::Short(service) => match &caller.namespace {
            None => Category::CallerUnknown,
            Some(ns) => match lookup(ns, &service).filter(|e| e.known) {
                Some(e) if e.kind != NameKind::MeshOnly => Category::Mesh(e),
                _ => Category::Foreign,
            },
        },
        NameForm::Foreign => Category::Foreign,
    }
}

/// The words of a [`Why`] that are formatted for one request: written only when the caller
/// asks for the explanation ([`RequestFacts::explain`]), empty otherwise, so that the data plane
/// formats nothing per request (issue #38).
fn words(explain: bool, detail: impl FnOnce() -> String) -> Cow<'static, str> {
    if explain {
        Cow::Owned(detail())
    } else {
        Cow::Borrowed("")
    }
}

fn refuse(
    reason: Reason,
    entry: Option<&NameEntry>,
    rule: &'static str,
    detail: impl Into<Cow<'static, str>>,
) -> RequestDecision {
    let answer = match entry {
        Some(e) => MeshAnswer::about(reason, e.line.clone()),
        None => MeshAnswer::bare(reason),
    };
    RequestDecision::Answer(answer, Why::new(rule, detail))
}

/// Answers one HTTP request (addressing.md §4–§8, §13).
pub fn resolve_request(model: &Model, caller: &Caller, req: &RequestFacts<'_>) -> RequestDecision {
    let authority = match effective_authority(&req.authority) {
        Ok(a) => a,
        Err(m) => {
            return refuse(
                Reason::BadAuthority,
                None,
                "addressing.md §4.1 item 6",
                m.describe(),
            );
        }
    };
    let Some(path_and_query) = req.path_and_query else {
        return refuse(
            Reason::NoPath,
            None,
            "addressing.md §6.2",
            "a request without a path",
        );
    };
    let mut entry = req.entry;
    if let HttpEntry::PodIp { dialled } = entry {
        match model.pod_ips.get(&dialled.ip()) {
            Some(pod) if pod.contested.is_some() => {
                // A later request on a connection to an address that became contested: it
                // goes nowhere (docs/decisions.md, "An address two rows claim").
                return refuse(
                    Reason::UpstreamUnreachable,
                    None,
                    "addressing.md §5.1 Q3",
                    "the dialled address is claimed by rows of more than one service: refused until one goes",
                );
            }
            Some(pod) if pod.declared.get(&dialled.port()) == Some(&PortProtocol::Http) => {
                let backend = HttpBackend {
                    service: pod.endpoint.mesh_service.clone(),
                    port: None,
                    pod_port: dialled.port(),
                    endpoints: Arc::from([pod.endpoint.clone()]),
                    h2c: false,
                };
                return deliver_to(
                    model,
                    None,
                    dialled.port(),
                    backend,
                    None,
                    None,
                    None,
                    false,
                    req.explain,
                    Why::new(
                        "addressing.md §5.1 Q3",
                        "a pod-IP dial to a port the pod declares HTTP: that pod, no route",
                    ),
                );
            }
            // The model no longer holds the pod so: answered as on any other address.
            _ => entry = HttpEntry::Captured { dialled },
        }
    }
    let proxy = matches!(entry, HttpEntry::Loopback | HttpEntry::ProxyCaptured { .. });
    let floor = |detail: Cow<'static, str>| -> RequestDecision {
        match entry {
            HttpEntry::ProxyCaptured { .. } if caller.capture == CaptureMode::RedirectAll => {
                RequestDecision::Passthrough(Why::new("addressing.md §6.3", detail))
            }
            HttpEntry::Captured { .. } | HttpEntry::PodIp { .. } => {
                RequestDecision::Passthrough(Why::new("addressing.md §5 C8", detail))
            }
            HttpEntry::Loopback | HttpEntry::ProxyCaptured { .. } => {
                refuse(Reason::NotAMeshName, None, "addressing.md §6.3", detail)
            }
        }
    };
    let Some(authority) = authority else {
        return floor("the request names nothing (addressing.md §4.1 item 5)".into());
    };
    let auth = split_authority(authority);
    let category = categorise(model, caller, auth.name);
    let anchor_port = matches!(auth.port, HostPort::Port(PROXY_PORT | LEGACY_PORT));

    if proxy {
        let q = match auth.port {
            HostPort::None => Some(PORTLESS_PROXY_PORT),
            HostPort::Port(p) => Some(p),
            HostPort::Malformed => None,
        };
        return match category {
            Category::Mesh(e) => {
                if anchor_port {
                    return refuse(
                        Reason::PortNotDeclared,
                        Some(e),
                        "addressing.md §6 P1",
                        "18081 and 18082 are no service's ports",
                    );
                }
                match q.and_then(|q| e.ports.get(&q).map(|f| (q, f))) {
                    Some((q, f)) if f.class.serves_http() && f.pod_port.is_some() => deliver(
                        model,
                        caller,
                        req,
                        path_and_query,
                        e,
                        q,
                        f,
                        &Why::new(
                            "addressing.md §6 P2",
                            "the authority's port is a port of the name that serves HTTP",
                        ),
                    ),
                    Some((_, f))
                        if matches!(
                            f.class,
                            PortClass::Known(PortProtocol::Tcp | PortProtocol::Udp)
                        ) =>
                    {
                        refuse(
                            Reason::PortNotHttp,
                            Some(e),
                            "addressing.md §6 P3",
                            "the authority's port is a raw-TCP or UDP port of the name",
                        )
                    }
                    _ => refuse(
                        Reason::PortNotDeclared,
                        Some(e),
                        "addressing.md §6 P4",
                        "the authority's port is not a port of the name",
                    ),
                }
            }
            Category::CallerUnknown => refuse(
                Reason::CallerNamespaceUnknown,
                None,
                "addressing.md §6 P5",
                "a short name and no caller namespace",
            ),
            Category::UnknownMeshName if anchor_port => refuse(
                Reason::PortNotDeclared,
                None,
                "addressing.md §6 P1",
                "an unknown mesh name with port 18081 or 18082",
            ),
            Category::UnknownMeshName if !req.hold_expired => RequestDecision::Hold(
                HoldFor::UnknownName,
                Why::new(
                    "addressing.md §6 P6",
                    "a mesh-domain name the node knows no ports of",
                ),
            ),
            Category::UnknownMeshName => {
                floor("a mesh-domain name still unknown after the hold".into())
            }
            Category::Foreign => floor(words(req.explain, || {
                format!("{:?} is not a mesh name", auth.name)
            })),
        };
    }

    // A captured dial (addressing.md §5).
    let dialled = match entry {
        HttpEntry::Captured { dialled }
        | HttpEntry::PodIp { dialled }
        | HttpEntry::ProxyCaptured { dialled } => dialled,
        HttpEntry::Loopback => return floor("unreachable: loopback is the proxy port".into()),
    };
    let d = dialled.port();
    let same_port = match auth.port {
        HostPort::None => true,
        HostPort::Port(p) => p == d,
        HostPort::Malformed => false,
    };
    match category {
        Category::Mesh(e) if e.kind == NameKind::MeshOnly => {
            let own = e.own_ports.as_ref().and_then(|m| m.get(&d));
            match own {
                Some(f) if same_port && f.class == PortClass::Known(PortProtocol::Http) => deliver(
                    model,
                    caller,
                    req,
                    path_and_query,
                    e,
                    d,
                    f,
                    &Why::new(
                        "addressing.md §7.2",
                        words(req.explain, || {
                            format!("meshOnly {}: its own rows declare {d}/http", e.key)
                        }),
                    ),
                ),
                _ => RequestDecision::Passthrough(Why::new(
                    "addressing.md §7.2",
                    words(req.explain, || {
                        format!(
                            "meshOnly {}: not served on {d} with this authority; never refused",
                            e.key
                        )
                    }),
                )),
            }
        }
        Category::Mesh(e) => match e.ports.get(&d) {
            Some(f) if f.class.serves_http() && f.pod_port.is_some() => {
                if same_port {
                    deliver(
                        model,
                        caller,
                        req,
                        path_and_query,
                        e,
                        d,
                        f,
                        &Why::new(
                            "addressing.md §5 C1",
                            "the name is served as HTTP on the dialled port",
                        ),
                    )
                } else {
                    refuse(
                        Reason::PortMismatch,
                        Some(e),
                        "addressing.md §5 C2",
                        "the name is served on the dialled port, and the authority names another port",
                    )
                }
            }
            _ => refuse(
                Reason::PortNotDeclared,
                Some(e),
                "addressing.md §5 C3",
                "the name is not served as HTTP on the dialled port",
            ),
        },
        Category::CallerUnknown => refuse(
            Reason::CallerNamespaceUnknown,
            None,
            "addressing.md §5 C5",
            "a short name and no caller namespace",
        ),
        Category::UnknownMeshName if anchor_port => refuse(
            Reason::PortNotDeclared,
            None,
            "addressing.md §5 C6",
            "an unknown mesh name with port 18081 or 18082",
        ),
        Category::UnknownMeshName if !req.hold_expired => RequestDecision::Hold(
            HoldFor::UnknownName,
            Why::new(
                "addressing.md §5 C7",
                "a mesh-domain name the node knows no ports of",
            ),
        ),
        Category::UnknownMeshName => RequestDecision::Passthrough(Why::new(
            "addressing.md §5 C7",
            "still unknown after the hold",
        )),
        Category::Foreign => RequestDecision::Passthrough(Why::new(
            "addressing.md §5 C8",
            words(req.explain, || {
                format!("{:?} is not a mesh name", auth.name)
            }),
        )),
    }
}

/// Delivers on (name, front port): the attached rules, or the default delivery (routes.md §4).
#[allow(clippy::too_many_arguments)] // One call site per path; the facts are all distinct.
fn deliver(
    model: &Model,
    caller: &Caller,
    req: &RequestFacts<'_>,
    path_and_query: &str,
    e: &NameEntry,
    port: u16,
    f: &FrontPort,
    why: &Why,
) -> RequestDecision {
    let rules = f
        .routes
        .as_ref()
        .and_then(|r| r.for_caller(caller.namespace.as_deref()));
    let Some(set) = rules else {
        let Some(pod_port) = f.pod_port else {
            return refuse(
                Reason::PortNotDeclared,
                Some(e),
                "addressing.md §6 P4",
                "the port names nothing",
            );
        };
        let backend = HttpBackend {
            service: e.key.clone(),
            port: Some(port),
            pod_port,
            endpoints: f.endpoints.clone(),
            h2c: f.h2c,
        };
        // Default delivery (no rule attached): the facts are in the delivery itself.
        let why = if f.retained {
            Why::new(
                why.rule,
                words(req.explain, || {
                    format!("{}; a retained entry (spec/model.md §10)", why.detail)
                }),
            )
        } else {
            why.clone()
        };
        return deliver_to(
            model,
            Some(&e.key),
            port,
            backend,
            None,
            None,
            None,
            req.hold_expired,
            req.explain,
            why,
        );
    };
    let (path, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    };
    let view = RequestView {
        caller_namespace: caller.namespace.as_deref(),
        method: req.method,
        path,
        query,
        headers: req.headers,
    };
    let Some(selected) = set.table.select(&view) else {
        return refuse(
            Reason::RouteNotMatched,
            None,
            "routes.md §4",
            words(req.explain, || {
                format!(
                    "{}; rules are attached to port {port} and none matches",
                    why.detail
                )
            }),
        );
    };
    let Some(route) = set.routes.get(selected.route) else {
        return refuse(
            Reason::RouteNotMatched,
            None,
            "routes.md §4",
            "no such route",
        );
    };
    let Some(rule) = route.rules.get(selected.rule) else {
        return refuse(
            Reason::RouteNotMatched,
            None,
            "routes.md §4",
            "no such rule",
        );
    };
    let rule_ref = RuleRef {
        kind: match route.kind {
            crate::model::snapshot::HttpRouteKind::Http => "HTTPRoute",
            crate::model::snapshot::HttpRouteKind::Grpc => "GRPCRoute",
        },
        namespace: route.namespace.clone(),
        route: route.name.clone(),
        index: selected.rule,
        name: rule.name.clone(),
    };
    // The route rule's words; `detail` is called only when they are written.
    let rule_why = |detail: &dyn Fn() -> Cow<'static, str>| {
        Why::new(
            "routes.md §4",
            words(req.explain, || {
                format!(
                    "{}; {} {}/{} rule {}: {}",
                    why.detail,
                    rule_ref.kind,
                    rule_ref.namespace,
                    rule_ref.route,
                    rule_ref.index,
                    detail()
                )
            }),
        )
    };
    if let Some(problem) = &rule.unsupported {
        return RequestDecision::Answer(
            MeshAnswer::bare(Reason::InvalidBackend),
            rule_why(&|| problem.clone().into()),
        );
    }
    if let filters::RuleAnswer::Redirect(r) = &rule.plan.answer {
        {
            let authority = effective_authority(&req.authority)
                .ok()
                .flatten()
                .unwrap_or("");
            let answer = filters::redirect(
                r,
                filters::RedirectInput {
                    scheme: "http",
                    authority,
                    listener_port: port,
                    path,
                    query,
                    matched_prefix: selected.matched_prefix(),
                },
            );
            return RequestDecision::Redirect {
                status: answer.status,
                location: answer.location,
                why: rule_why(&|| "RequestRedirect".into()),
            };
        }
    }
    let weights: Vec<u32> = rule.backends.iter().map(|b| b.weight).collect();
    let chosen_index = filters::pick_weighted(&weights, req.entropy);
    let Some(chosen) = chosen_index.and_then(|i| rule.backends.get(i)) else {
        return RequestDecision::Answer(
            MeshAnswer::bare(Reason::InvalidBackend),
            rule_why(&|| "no backend and no filter that answers".into()),
        );
    };
    let backend = match &chosen.target {
        Ok(b) => b.clone(),
        Err(invalid) => {
            return RequestDecision::Answer(
                MeshAnswer::bare(Reason::InvalidBackend),
                rule_why(&|| format!("{}: {}", invalid.reason.as_str(), invalid.message).into()),
            );
        }
    };
    let run = RouteRun {
        plan: rule.plan.clone(),
        backend_index: chosen_index.unwrap_or_default(),
        matched_prefix: selected
            .matched_prefix()
            .filter(|_| rule.plan.uses_prefix())
            .map(Arc::from),
        route_level: rule.extension_filters.clone(),
    };
    let why = rule_why(&|| {
        format!(
            "backend {}:{}",
            backend.service,
            backend.port.unwrap_or(backend.pod_port)
        )
        .into()
    });
    deliver_to(
        model,
        Some(&e.key),
        port,
        backend,
        Some(rule_ref),
        Some(run),
        rule.timeout_ms,
        req.hold_expired,
        req.explain,
        why,
    )
}

/// The final step of every delivery: the hold for endpoints and the service-level filters.
#[allow(clippy::too_many_arguments)] // Internal; each argument is one fact of the delivery.
fn deliver_to(
    model: &Model,
    addressed: Option<&ServiceKey>,
    port: u16,
    backend: HttpBackend,
    rule: Option<RuleRef>,
    route: Option<RouteRun>,
    timeout_ms: Option<u64>,
    hold_expired: bool,
    explain: bool,
    why: Why,
) -> RequestDecision {
    if backend.endpoints.is_empty() {
        if !hold_expired {
            return RequestDecision::Hold(
                HoldFor::Endpoints,
                Why::new(
                    "addressing.md §8",
                    words(explain, || format!("{}; no endpoint yet", why.detail)),
                ),
            );
        }
        return RequestDecision::Answer(
            MeshAnswer::bare(Reason::NoEndpoints),
            Why::new(
                "addressing.md §8",
                words(explain, || {
                    format!("{}; no endpoint after the hold", why.detail)
                }),
            ),
        );
    }
    // routes.md §5.5: item 1, the addressed Service; item 2, the rule's backend Service;
    // item 3, each endpoint's own mesh service (the destination adds it too).
    let mut filter_services: Vec<ServiceKey> = Vec::new();
    for k in addressed
        .into_iter()
        .chain(rule.as_ref().map(|_| &backend.service))
    {
        if !filter_services.contains(k) {
            filter_services.push(k.clone());
        }
    }
    // Only Services that have filters are listed, so a delivery without any allocates nothing.
    let mut service_filters: Vec<(ServiceKey, Arc<[NamedFilter]>)> = Vec::new();
    let keys = filter_services
        .iter()
        .chain(backend.endpoints.iter().map(|ep| &ep.mesh_service));
    for k in keys {
        if let Some(f) = model.service_filters.get(k)
            && !service_filters.iter().any(|(seen, _)| seen == k)
        {
            service_filters.push((k.clone(), f.clone()));
        }
    }
    RequestDecision::Deliver(Box::new(Delivery {
        addressed: addressed.cloned(),
        front_port: port,
        backend,
        rule,
        route,
        filter_services,
        service_filters,
        timeout_ms,
        why,
    }))
}

/// One line describing a service- or route-level filter configuration.
pub fn describe_filter(c: &FilterConfig) -> String {
    match c {
        FilterConfig::HeaderMutation(m) => {
            let mut parts = Vec::new();
            let mut modifier = |side: &str, h: &crate::model::snapshot::HeaderModifier| {
                for (k, v) in &h.set {
                    parts.push(format!("{side} set {k}={v}"));
                }
                for (k, v) in &h.add {
                    parts.push(format!("{side} add {k}={v}"));
                }
                for k in &h.remove {
                    parts.push(format!("{side} remove {k}"));
                }
            };
            modifier("request", &m.request);
            modifier("response", &m.response);
            for q in &m.query {
                parts.push(format!("query {q:?}"));
            }
            format!("header_mutation {}", parts.join(", "))
        }
        FilterConfig::Rbac(r) => format!(
            "rbac {:?} [{}] (destination node)",
            r.action,
            r.principals
                .iter()
                .map(|p| format!(
                    "{}/{}",
                    p.namespace.as_deref().unwrap_or("*"),
                    p.service_account.as_deref().unwrap_or("*")
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        FilterConfig::ExtAuthz(x) => format!(
            "ext_authz {} timeout {} ms (destination node)",
            x.server.as_deref().unwrap_or("<node default>"),
            x.timeout_ms
        ),
        FilterConfig::Unreadable(u) => format!(
            "unreadable ({}): refuses 403 authz-unavailable on both nodes",
            u.why
        ),
    }
}

/// The service-level filters of a delivery, one line each, for explain and logs.
pub fn describe_service_filters(d: &Delivery) -> Vec<String> {
    d.service_filters
        .iter()
        .flat_map(|(k, filters)| {
            filters.iter().map(move |f| {
                format!(
                    "service-level {k} ({}): {}",
                    f.name,
                    describe_filter(&f.config)
                )
            })
        })
        .collect()
}

/// The route-level steps of a delivery, one line each, for explain and logs.
pub fn describe_route_filters(d: &Delivery) -> Vec<String> {
    let Some(run) = &d.route else {
        return Vec::new();
    };
    let plan = &run.plan;
    let mut out: Vec<String> = plan
        .request
        .iter()
        .map(|f| format!("request: {f}"))
        .collect();
    if let Some(b) = plan.backends.get(run.backend_index) {
        out.extend(b.request.iter().map(|f| format!("backend request: {f}")));
        out.extend(b.mirrors.iter().map(|m| format!("backend mirror: {m}")));
        out.extend(b.response.iter().map(|f| format!("backend response: {f}")));
    }
    out.extend(plan.mirrors.iter().map(|m| format!("mirror: {m}")));
    out.extend(plan.response.iter().map(|f| format!("response: {f}")));
    out.extend(
        run.route_level
            .iter()
            .map(|(n, c)| format!("route-level {n}: {}", describe_filter(c))),
    );
    out
}
