//! Route attachment inside the compiler: which (Service, port) each rule attaches to, strict
//! backendRefs, TLS/TCP/UDP route tables, and the route status that follows from the same facts
//! (routes.md §2, §3, §6, §9). Part of [`super::compile`]; Layer 0 (pure).

use crate::prelude::*;

use super::*;

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

impl<'s> Compiler<'s> {
    fn extension(&mut self, route_ns: &str, r: &ObjectRef) -> Option<(String, FilterConfig)> {
        let ns = r.namespace.as_deref().unwrap_or(route_ns);
        let mut named = self
            .snapshot
            .mesh_filters
            .iter()
            .filter(|f| f.namespace == ns && f.name == r.name && r.kind == "MeshFilter");
        // Two of one name (a file registry can hold both): the first by `named_order`, not by
        // the source's order.
        let first = named.next()?;
        let f = named.fold(first, |a, b| {
            if format!("{a:?}") <= format!("{b:?}") {
                a
            } else {
                b
            }
        });
        Some((format!("{}/{}", f.namespace, f.name), f.config.clone()))
    }

    /// Resolves a backendRef to its Service's front port, strictly (routes.md §3): the kind,
    /// the port, the port map. The class check is the caller's, since HTTP and L4 routes want
    /// different classes. A backend in another namespace needs no ReferenceGrant: every route
    /// the mesh attaches has a Service parent, and ReferenceGrant governs Gateway parents only
    /// (routes.md §3, GEP-1294).
    fn backend_port<'n>(
        &self,
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
        let b = self.backend_port(&route.namespace, target, port, names, services)?;
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
    pub(super) fn attach_http_routes(
        &mut self,
        names: &mut HashMap<(&'s str, &'s str), NameEntry>,
        services: &HashMap<(&str, &str), &Service>,
    ) -> Vec<RouteStatus> {
        let mut routes: Vec<&HttpRoute> = self.snapshot.http_routes.iter().collect();
        routes.sort_by(|a, b| {
            (&a.namespace, &a.name, a.kind)
                .cmp(&(&b.namespace, &b.name, b.kind))
                .then_with(|| format!("{a:?}").cmp(&format!("{b:?}")))
        });
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
                            HttpFilter::Unsupported(t)
                                if t.starts_with(crate::model::snapshot::UNREADABLE_ROUTE) =>
                            {
                                self.diagnostics.push(Diagnostic::new(
                                    DiagnosticKind::RouteUnreadable,
                                    format!("{kind} {}/{}", route.namespace, route.name),
                                    format!(
                                        "{t}; every request it would route on its parents is answered 500 invalid-backend until it is fixed"
                                    ),
                                ));
                                unsupported = Some(t.clone());
                            }
                            HttpFilter::Unsupported(t) => {
                                unsupported = Some(format!("filter {t} is not supported"))
                            }
                            _ => {}
                        }
                    }
                    CompiledRule {
                        name: rule.name.as_deref().map(Arc::from),
                        plan: Arc::new(crate::model::filters::FilterPlan::for_rule(rule)),
                        extension_filters: extension_filters.into(),
                        backends: rule
                            .backends
                            .iter()
                            .map(|b| CompiledBackend {
                                weight: b.weight,
                                target: self
                                    .http_backend(route, &b.target, b.port, names, services),
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
                statuses.push(RouteStatus::of(
                    kind,
                    &route.namespace,
                    &route.name,
                    route.generation,
                    parent,
                    vec![accepted_condition(accepted), refs.clone(), judged.clone()],
                ));
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
    pub(super) fn l4_tables<'n>(
        &self,
        routes: &'s [L4Route],
        kind: &str,
        names: &'n HashMap<(&'s str, &'s str), NameEntry>,
        services: &HashMap<(&str, &str), &Service>,
        statuses: &mut Vec<RouteStatus>,
    ) -> BTreeMap<((&'s str, &'s str), Option<u16>), Vec<TlsRule>> {
        let mut out: BTreeMap<((&str, &str), Option<u16>), Vec<TlsRule>> = BTreeMap::new();
        let mut sorted: Vec<&L4Route> = routes.iter().collect();
        sorted.sort_by(|a, b| named_order((&a.namespace, &a.name), (&b.namespace, &b.name), a, b));
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
                statuses.push(RouteStatus::of(
                    kind,
                    &route.namespace,
                    &route.name,
                    route.generation,
                    parent,
                    vec![accepted_cond, refs],
                ));
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
        let b = self.backend_port(&route.namespace, target, port, names, services)?;
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
