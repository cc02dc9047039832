//! The unit-level legs of spec/legs.md §6 that need a compiled model: U1, U4, U5, U6, U10, U11,
//! U13, plus determinism. Snapshots are built by hand, small enough to read.
#![allow(clippy::unwrap_used)] // Tests unwrap: a panic is the failure report (STYLE.md §6.4).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use aether::model::names::{AuthorityInput, HttpVersion};
use aether::model::port::Transport;
use aether::model::rows::{
    ANNOTATION_PORT, ANNOTATION_PORTS, ANNOTATION_PROTOCOL, parse_declared_ports,
};
use aether::model::snapshot::{
    EndpointSlice, HttpBackendRef, HttpRoute, HttpRouteKind, HttpRule, L4BackendRef, L4Route,
    L4Rule, ObjectRef, ParentRef, RetainedPort, Row, Service, ServicePort, SliceEndpoint,
    SlicePort, Snapshot, TargetPort,
};
use aether::model::{Model, NodeContext, compile, registrar, retention};
use aether::resolve::decision::{Caller, CaptureMode, HttpEntry, RequestDecision, RequestFacts};
use aether::resolve::resolve_request;

fn row(ns: &str, sa: &str, ip: &str, ann: &[(&str, &str)], ready: bool) -> Arc<Row> {
    let a = ann
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let mut r = parse_declared_ports(&a)
        .unwrap()
        .to_row(ns, sa, ip.parse().unwrap(), ready);
    r.pod = Some(format!("{sa}-{ip}"));
    Arc::new(r)
}

fn service_ref(name: &str) -> ObjectRef {
    ObjectRef {
        group: String::new(),
        kind: "Service".into(),
        namespace: None,
        name: name.into(),
    }
}

fn user_service(ns: &str, name: &str, ip: &str, ports: &[(u16, TargetPort)]) -> Service {
    Service {
        namespace: ns.into(),
        name: name.into(),
        cluster_ips: vec![ip.parse().unwrap()],
        headless: false,
        generated: false,
        selector: Some(BTreeMap::from([("app".to_owned(), name.to_owned())])),
        ports: ports
            .iter()
            .map(|(p, t)| ServicePort {
                name: Some(format!("port-{p}")),
                port: *p,
                target: t.clone(),
                transport: Transport::Tcp,
                app_protocol: None,
            })
            .collect(),
    }
}

fn route(ns: &str, name: &str, parent: &str, port: Option<u16>, backend: (&str, u16)) -> HttpRoute {
    HttpRoute {
        kind: HttpRouteKind::Http,
        namespace: ns.into(),
        name: name.into(),
        generation: 3,
        created: None,
        parents: vec![ParentRef {
            target: service_ref(parent),
            port,
            section_name: None,
        }],
        hostnames: Vec::new(),
        rules: vec![HttpRule {
            name: None,
            matches: Vec::new(),
            filters: Vec::new(),
            backends: vec![HttpBackendRef {
                target: service_ref(backend.0),
                port: Some(backend.1),
                weight: 1,
                filters: Vec::new(),
            }],
            request_timeout_ms: None,
            backend_request_timeout_ms: None,
        }],
    }
}

fn build(mut s: Snapshot) -> Model {
    registrar::complete_snapshot(&mut s, "10.96.0.0/16".parse().unwrap());
    compile(&s, &NodeContext::default())
}

fn caller(ns: Option<&str>) -> Caller {
    Caller {
        namespace: ns.map(str::to_owned),
        pod: None,
        service_account: None,
        capture: CaptureMode::RedirectAll,
    }
}

fn ask(
    model: &Model,
    c: &Caller,
    entry: HttpEntry,
    host: &str,
    hold_expired: bool,
) -> RequestDecision {
    let hosts = [host];
    resolve_request(
        model,
        c,
        &RequestFacts {
            entry,
            authority: AuthorityInput {
                version: HttpVersion::Http11,
                absolute: None,
                h2_authority: None,
                hosts: &hosts,
            },
            method: "GET",
            path_and_query: Some("/"),
            headers: &http::HeaderMap::new(),
            hold_expired,
            entropy: 0,
            explain: true,
        },
    )
}

fn reason(d: &RequestDecision) -> Option<&'static str> {
    match d {
        RequestDecision::Answer(a, _) => Some(a.reason.code()),
        _ => None,
    }
}

/// The `ports:` line of a 421 refusal.
fn ports_line(d: &RequestDecision) -> String {
    match d {
        RequestDecision::Answer(a, _) => a
            .service
            .as_ref()
            .expect("a 421 names its service")
            .ports
            .to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// An L4 route with one rule and one backend.
fn l4(
    name: &str,
    parent: &str,
    port: Option<u16>,
    hostnames: &[&str],
    backend: (&str, u16),
) -> L4Route {
    L4Route {
        namespace: "mp".into(),
        name: name.into(),
        generation: 1,
        created: None,
        parents: vec![ParentRef {
            target: service_ref(parent),
            port,
            section_name: None,
        }],
        hostnames: hostnames.iter().map(|h| (*h).to_owned()).collect(),
        rules: vec![L4Rule {
            name: None,
            backends: vec![L4BackendRef {
                target: service_ref(backend.0),
                port: Some(backend.1),
                weight: 1,
                weight_given: false,
            }],
        }],
    }
}

fn delivered_to(d: &RequestDecision) -> Vec<IpAddr> {
    match d {
        RequestDecision::Deliver(d) => d.backend.endpoints.iter().map(|e| e.address).collect(),
        other => panic!("expected a delivery, got {other:?}"),
    }
}

#[test]
fn u1_a_short_name_without_a_caller_namespace_is_refused_on_both_paths() {
    let model = build(Snapshot {
        rows: vec![row("mp", "web", "10.0.0.1", &[], true)],
        ..Snapshot::default()
    });
    let vip = model.mesh_vips("mp", "web")[0];
    let nobody = caller(None);
    for entry in [
        HttpEntry::Loopback,
        HttpEntry::Captured {
            dialled: SocketAddr::new(vip, 8080),
        },
    ] {
        for host in ["web:8080", "nosuch", "WEB"] {
            assert_eq!(
                reason(&ask(&model, &nobody, entry, host, false)),
                Some("caller-namespace-unknown"),
                "{host}"
            );
        }
        // Other families do not need the caller.
        assert_eq!(
            delivered_to(&ask(
                &model,
                &nobody,
                entry,
                "web.mp.aether.internal:8080",
                false
            ))
            .len(),
            1
        );
    }
}

#[test]
fn u4_a_reserved_port_is_served_without_it() {
    let model = build(Snapshot {
        rows: vec![row(
            "mp",
            "web",
            "10.0.0.1",
            &[(ANNOTATION_PORTS, "18081,9090")],
            true,
        )],
        ..Snapshot::default()
    });
    let c = caller(Some("mp"));
    let d = ask(
        &model,
        &c,
        HttpEntry::Loopback,
        "web.mp.aether.internal:7777",
        false,
    );
    assert_eq!(ports_line(&d), "8080/http 9090/http");
    let RequestDecision::Answer(a, _) = &d else {
        panic!("{d:?}")
    };
    assert!(!a.body().contains("18081"));
    assert_eq!(
        delivered_to(&ask(
            &model,
            &c,
            HttpEntry::Loopback,
            "web.mp.aether.internal:9090",
            false
        ))
        .len(),
        1
    );
    assert!(model.diagnostics.iter().any(|d| d.detail.contains("18081")));
}

#[test]
fn u5_retained_entries_hold_90_seconds_and_vanish_on_evidence() {
    let c = caller(Some("mp"));
    let with_rows = Snapshot {
        rows: vec![row("mp", "web", "10.0.0.1", &[], true)],
        ..Snapshot::default()
    };
    let first = build(with_rows);
    // Every row vanishes, and no generated Service remains as evidence.
    let empty = Snapshot::default();
    let kept = retention::advance(&first.http_ports(), &[], &empty, 1_000);
    assert_eq!(
        kept,
        vec![RetainedPort {
            namespace: "mp".into(),
            service: "web".into(),
            port: 8080,
            since_ms: 1_000
        }]
    );
    let held = build(Snapshot {
        retained: kept.clone(),
        ..Snapshot::default()
    });
    let d = ask(
        &held,
        &c,
        HttpEntry::Loopback,
        "web.mp.aether.internal:8080",
        false,
    );
    assert!(
        matches!(d, RequestDecision::Hold(..)),
        "held for endpoints: {d:?}"
    );
    let d = ask(
        &held,
        &c,
        HttpEntry::Loopback,
        "web.mp.aether.internal:8080",
        true,
    );
    assert_eq!(reason(&d), Some("no-endpoints"));
    assert!(
        retention::advance(&held.http_ports(), &kept, &empty, 91_000).is_empty(),
        "removed at 90 s"
    );

    // HTTP rows vanish while raw-TCP rows remain: removed in the same refresh.
    let tcp_only = Snapshot {
        rows: vec![row(
            "mp",
            "web",
            "10.0.0.1",
            &[(ANNOTATION_PORT, "9000"), (ANNOTATION_PROTOCOL, "tcp")],
            true,
        )],
        ..Snapshot::default()
    };
    assert!(retention::advance(&first.http_ports(), &[], &tcp_only, 2_000).is_empty());
    let replaced = build(tcp_only);
    assert_eq!(
        reason(&ask(
            &replaced,
            &c,
            HttpEntry::Loopback,
            "web.mp.aether.internal:8080",
            false
        )),
        Some("port-not-declared")
    );
}

#[test]
fn u6_a_named_target_port_is_refused_until_a_slice_resolves_it() {
    let c = caller(Some("mp"));
    let mut s = Snapshot {
        rows: vec![row("mp", "web", "10.0.0.1", &[], true)],
        services: vec![user_service(
            "mp",
            "front",
            "10.96.9.9",
            &[(80, TargetPort::Name("http".into()))],
        )],
        http_routes: vec![route("mp", "r", "front", None, ("front", 80))],
        ..Snapshot::default()
    };
    let model = build(s.clone());
    let d = ask(
        &model,
        &c,
        HttpEntry::Loopback,
        "front.mp.aether.internal:80",
        true,
    );
    assert_eq!(
        reason(&d),
        Some("port-not-declared"),
        "the front port names nothing"
    );
    let refs = model
        .route_statuses()
        .next()
        .expect("a status")
        .conditions
        .iter()
        .find(|c| c.type_ == "ResolvedRefs")
        .unwrap()
        .clone();
    assert_eq!(
        (refs.status.as_str(), refs.reason.as_str()),
        ("False", "BackendNotFound")
    );
    assert!(
        refs.message.contains("\"http\""),
        "names the targetPort: {}",
        refs.message
    );

    let slice = |port| EndpointSlice {
        namespace: "mp".into(),
        service: "front".into(),
        name: format!("front-{port}"),
        ports: vec![SlicePort {
            name: Some("port-80".into()),
            port: Some(port),
            transport: Transport::Tcp,
        }],
        endpoints: vec![SliceEndpoint {
            addresses: vec!["10.0.0.1".parse().unwrap()],
            pod: None,
            ready: true,
        }],
    };
    s.endpoint_slices.push(slice(8080));
    let resolved = build(s.clone());
    assert_eq!(
        delivered_to(&ask(
            &resolved,
            &c,
            HttpEntry::Loopback,
            "front.mp.aether.internal:80",
            false
        )),
        vec!["10.0.0.1".parse::<IpAddr>().unwrap()]
    );
    s.endpoint_slices.push(slice(9090));
    let disagree = build(s);
    assert_eq!(
        reason(&ask(
            &disagree,
            &c,
            HttpEntry::Loopback,
            "front.mp.aether.internal:80",
            true
        )),
        Some("port-not-declared")
    );
}

#[test]
fn u10_readiness_decides_delivery_and_nothing_else() {
    let c = caller(Some("mp"));
    let model = build(Snapshot {
        rows: vec![
            row("mp", "web", "10.0.0.1", &[], true),
            row("mp", "web", "10.0.0.2", &[], false),
        ],
        ..Snapshot::default()
    });
    assert_eq!(
        delivered_to(&ask(
            &model,
            &c,
            HttpEntry::Loopback,
            "web.mp.aether.internal:8080",
            false
        )),
        vec!["10.0.0.1".parse::<IpAddr>().unwrap()]
    );
    let none_ready = build(Snapshot {
        rows: vec![row(
            "mp",
            "web",
            "10.0.0.2",
            &[(ANNOTATION_PORTS, "9090")],
            false,
        )],
        ..Snapshot::default()
    });
    assert!(matches!(
        ask(
            &none_ready,
            &c,
            HttpEntry::Loopback,
            "web.mp.aether.internal:8080",
            false
        ),
        RequestDecision::Hold(..)
    ));
    assert_eq!(
        reason(&ask(
            &none_ready,
            &c,
            HttpEntry::Loopback,
            "web.mp.aether.internal:8080",
            true
        )),
        Some("no-endpoints")
    );
    // The unready pod keeps its ports: 7777 is still refused with them listed.
    let d = ask(
        &none_ready,
        &c,
        HttpEntry::Loopback,
        "web.mp.aether.internal:7777",
        false,
    );
    assert_eq!(ports_line(&d), "8080/http 9090/http");
    // A pod-IP dial to the unready pod is delivered to it.
    let pod = SocketAddr::new("10.0.0.2".parse().unwrap(), 8080);
    assert_eq!(
        delivered_to(&ask(
            &none_ready,
            &c,
            HttpEntry::PodIp { dialled: pod },
            "anything",
            false
        )),
        vec![pod.ip()]
    );
}

#[test]
fn u11_a_user_service_over_two_mesh_services_votes_over_its_pods() {
    let c = caller(Some("mp"));
    let http = [(ANNOTATION_PORT, "8080")];
    let tcp = [(ANNOTATION_PORT, "8080"), (ANNOTATION_PROTOCOL, "tcp")];
    let rows = [
        row("mp", "v1", "10.0.0.1", &http, true),
        row("mp", "v2", "10.0.0.2", &http, true),
        row("mp", "v3", "10.0.0.3", &tcp, true),
    ];
    let slice = EndpointSlice {
        namespace: "mp".into(),
        service: "echo".into(),
        name: "echo-1".into(),
        ports: vec![SlicePort {
            name: Some("port-80".into()),
            port: Some(8080),
            transport: Transport::Tcp,
        }],
        endpoints: ["10.0.0.3", "10.0.0.1", "10.0.0.2"]
            .iter()
            .map(|a| SliceEndpoint {
                addresses: vec![a.parse().unwrap()],
                pod: None,
                ready: true,
            })
            .collect(),
    };
    for order in [[0usize, 1, 2], [2, 1, 0], [1, 2, 0]] {
        let model = build(Snapshot {
            rows: order.iter().map(|&i| rows[i].clone()).collect(),
            services: vec![user_service(
                "mp",
                "echo",
                "10.96.5.5",
                &[(80, TargetPort::Number(8080))],
            )],
            endpoint_slices: vec![slice.clone()],
            http_routes: vec![route("mp", "r", "echo", None, ("echo", 80))],
            ..Snapshot::default()
        });
        let mut got = delivered_to(&ask(&model, &c, HttpEntry::Loopback, "echo:80", false));
        got.sort();
        assert_eq!(
            got,
            vec![
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "10.0.0.2".parse().unwrap()
            ]
        );
    }
    // A meshOnly service's mesh name on the proxy port reaches its own pods, not the selected ones.
    let model = build(Snapshot {
        rows: vec![
            row("mp", "owned", "10.0.0.1", &http, true),
            row("mp", "other", "10.0.0.9", &http, true),
        ],
        services: vec![user_service(
            "mp",
            "owned",
            "10.96.5.6",
            &[(80, TargetPort::Number(8080))],
        )],
        endpoint_slices: vec![EndpointSlice {
            namespace: "mp".into(),
            service: "owned".into(),
            name: "owned-1".into(),
            ports: vec![],
            endpoints: vec![SliceEndpoint {
                addresses: vec!["10.0.0.9".parse().unwrap()],
                pod: None,
                ready: true,
            }],
        }],
        ..Snapshot::default()
    });
    assert_eq!(
        delivered_to(&ask(
            &model,
            &c,
            HttpEntry::Loopback,
            "owned.mp.aether.internal:80",
            false
        )),
        vec!["10.0.0.1".parse::<IpAddr>().unwrap()]
    );
}

#[test]
fn u13_route_status_for_parents_that_take_nothing() {
    let rows = vec![row(
        "mp",
        "web",
        "10.0.0.1",
        &[(ANNOTATION_PORTS, "9000=tcp")],
        true,
    )];
    let mut hostnames = route("mp", "with-hostnames", "web", None, ("web", 8080));
    hostnames.hostnames = vec!["example.com".into()];
    let mut headless = user_service("mp", "headless", "10.96.7.7", &[(80, TargetPort::Same)]);
    headless.headless = true;
    headless.cluster_ips.clear();
    let model = build(Snapshot {
        rows,
        services: vec![
            user_service("mp", "user", "10.96.7.8", &[(80, TargetPort::Same)]),
            headless,
        ],
        http_routes: vec![
            hostnames,
            route("mp", "to-headless", "headless", None, ("web", 8080)),
        ],
        tls_routes: vec![
            l4("tls-user", "user", None, &[], ("web", 9000)),
            l4("tls-http", "web", Some(8080), &[], ("web", 9000)),
        ],
        tcp_routes: vec![
            l4("tcp-user", "user", None, &[], ("web", 9000)),
            l4("tcp-http", "web", Some(8080), &[], ("web", 9000)),
            l4("tcp-ok", "web", Some(9000), &[], ("web", 9000)),
        ],
        udp_routes: vec![l4("udp-user", "user", None, &[], ("web", 9000))],
        ..Snapshot::default()
    });
    let accepted = |name: &str| {
        let st = model
            .route_statuses()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{name} has a status"));
        let c = st
            .conditions
            .iter()
            .find(|c| c.type_ == "Accepted")
            .unwrap();
        (c.status.clone(), c.reason.clone())
    };
    assert_eq!(
        accepted("with-hostnames"),
        ("True".into(), "Accepted".into())
    );
    assert_eq!(accepted("tcp-ok"), ("True".into(), "Accepted".into()));
    for name in [
        "to-headless",
        "tls-user",
        "tls-http",
        "tcp-user",
        "tcp-http",
        "udp-user",
    ] {
        assert_eq!(
            accepted(name),
            ("False".into(), "NoMatchingParent".into()),
            "{name}"
        );
    }
}

#[test]
fn compile_is_deterministic_and_independent_of_input_order() {
    let mut s = aether::model::synth::scaled(60);
    let a = compile(&s, &NodeContext::default());
    assert_eq!(a, compile(&s, &NodeContext::default()));
    s.rows.reverse();
    s.services.reverse();
    s.pods.reverse();
    s.http_routes.reverse();
    assert_eq!(a, compile(&s, &NodeContext::default()));
}

#[test]
fn u2_u3_refused_rows_and_disagreeing_votes_are_reported_once() {
    use aether::model::diag::DiagnosticKind;
    use aether::model::port::PortProtocol;
    use aether::model::rows::RowProblem;
    use aether::model::snapshot::ProtocolValue;

    let good = row("mp", "web", "10.0.0.1", &[], true);
    let mut bad_rows = Vec::new();
    for (i, problem) in RowProblem::ALL.into_iter().enumerate() {
        let mut r = Row::clone(&good);
        r.address = format!("10.0.1.{i}").parse().unwrap();
        match problem {
            RowProblem::PortProtocolsMissing => r.port_protocols = None,
            RowProblem::PortWithoutProtocol => r.ports.push(9090),
            RowProblem::ProtocolForUnlistedPort => {
                r.port_protocols
                    .as_mut()
                    .unwrap()
                    .insert(7070, ProtocolValue::Known(PortProtocol::Http));
            }
            RowProblem::InvalidPort => r.ports.push(70_000),
            // The Kubernetes backend refuses such a pod before it is a row.
            RowProblem::AnnotationUnparseable => continue,
        }
        bad_rows.push((problem, r));
    }
    let mut rows: Vec<Arc<Row>> = bad_rows.iter().map(|(_, r)| Arc::new(r.clone())).collect();
    // One more pod of web votes 8080 raw TCP: 1 HTTP against 1 TCP is HTTP, and is reported.
    rows.push(good);
    rows.push(row(
        "mp",
        "web",
        "10.0.0.2",
        &[(ANNOTATION_PROTOCOL, "tcp")],
        true,
    ));
    let model = build(Snapshot {
        rows,
        ..Snapshot::default()
    });
    let c = caller(Some("mp"));
    // Refused rows contribute nothing: no endpoint, no port (9090, 7070 stay undeclared).
    let d = ask(
        &model,
        &c,
        HttpEntry::Loopback,
        "web.mp.aether.internal:9090",
        false,
    );
    assert_eq!(ports_line(&d), "8080/http");
    let to = delivered_to(&ask(
        &model,
        &c,
        HttpEntry::Loopback,
        "web.mp.aether.internal:8080",
        false,
    ));
    assert_eq!(
        to,
        vec!["10.0.0.1".parse::<IpAddr>().unwrap()],
        "only the HTTP row of the winning protocol"
    );
    for (problem, r) in &bad_rows {
        let n = model
            .diagnostics
            .iter()
            .filter(|d| {
                d.kind == DiagnosticKind::RowRefused && d.subject.ends_with(&r.address.to_string())
            })
            .filter(|d| d.detail == problem.as_str())
            .count();
        assert_eq!(n, 1, "{problem} is reported once");
    }
    let votes: Vec<_> = model
        .diagnostics
        .iter()
        .filter(|d| d.kind == DiagnosticKind::ClassDisagreement)
        .collect();
    assert_eq!(votes.len(), 1);
    assert_eq!(votes[0].subject, "mp/web:8080");
    assert_eq!(votes[0].detail, "http=1 tcp=1 udp=0");
}

#[test]
fn tls_and_tcp_routes_on_a_generated_services_cluster_ip() {
    use aether::resolve::decision::{AfterSniff, ConnDecision, Sniffed, TcpBackend};
    use aether::resolve::{classify_connection, resolve_sniffed};

    // db: raw TCP 5432 and 443, HTTP 8080. A TLSRoute for db.example on any port, and a
    // TCPRoute sending 5432 to replica:5432.
    let l4 =
        |name: &str, parent: &str, port: Option<u16>, hostnames: &[&str], backend: (&str, u16)| {
            L4Route {
                namespace: "mp".into(),
                name: name.into(),
                generation: 1,
                created: None,
                parents: vec![ParentRef {
                    target: service_ref(parent),
                    port,
                    section_name: None,
                }],
                hostnames: hostnames.iter().map(|h| (*h).to_owned()).collect(),
                rules: vec![L4Rule {
                    name: None,
                    backends: vec![L4BackendRef {
                        target: service_ref(backend.0),
                        port: Some(backend.1),
                        weight: 1,
                        weight_given: false,
                    }],
                }],
            }
        };
    let model = build(Snapshot {
        rows: vec![
            row(
                "mp",
                "db",
                "10.0.0.1",
                &[(ANNOTATION_PORTS, "5432=tcp,443=tcp")],
                true,
            ),
            row(
                "mp",
                "replica",
                "10.0.0.2",
                &[(ANNOTATION_PORT, "5432"), (ANNOTATION_PROTOCOL, "tcp")],
                true,
            ),
        ],
        tls_routes: vec![l4("tls", "db", None, &["db.example"], ("replica", 5432))],
        tcp_routes: vec![l4("tcp", "db", Some(5432), &[], ("replica", 5432))],
        ..Snapshot::default()
    });
    let vip = model.mesh_vips("mp", "db")[0];
    let c = caller(Some("mp"));
    let target_of = |a: &AfterSniff| match a {
        AfterSniff::Tcp(choice) => match &choice.backends[0].1 {
            TcpBackend::Target(t) => format!("{}:{}", t.service, t.pod_port),
            TcpBackend::Invalid(_) => "invalid".into(),
        },
        AfterSniff::Http(_) => "http".into(),
        AfterSniff::Passthrough => "passthrough".into(),
        AfterSniff::Close => "close".into(),
    };
    let sniffed =
        |port: u16, s: Sniffed| match classify_connection(&model, &c, SocketAddr::new(vip, port)) {
            ConnDecision::Sniff(plan) => target_of(&resolve_sniffed(&plan, &s)),
            other => format!("at accept: {other:?}"),
        };
    let tls = |sni: &str| Sniffed::Tls(Some(sni.into()));
    // Step 2: a raw-TCP port of a service with TLSRoutes waits for a ClientHello.
    assert_eq!(sniffed(443, tls("db.example")), "mp/replica:5432");
    assert_eq!(sniffed(443, tls("other.example")), "mp/db:443");
    assert_eq!(sniffed(443, Sniffed::Timeout), "mp/db:443");
    // The TCPRoute replaced 5432's default destination.
    assert_eq!(sniffed(5432, Sniffed::Other), "mp/replica:5432");
    // Step 3: an undeclared port takes the TLSRoute, HTTP is handled, the rest passes through.
    assert_eq!(sniffed(9443, tls("DB.EXAMPLE")), "mp/replica:5432");
    assert_eq!(sniffed(9443, Sniffed::Http), "http");
    assert_eq!(sniffed(9443, Sniffed::Other), "passthrough");
    // Row 10: TLS with the route's name to an HTTP port is passed through, never routed.
    assert_eq!(sniffed(8080, tls("db.example")), "passthrough");
    // 18081 of a service that serves HTTP: passthrough, not the TLSRoute (addressing.md §9).
    assert_eq!(sniffed(18081, tls("db.example")), "passthrough");
}

#[test]
fn a_rules_filters_travel_with_the_delivery_as_data() {
    use aether::model::filters::FilterStep;
    use aether::model::snapshot::{HttpFilter, HttpMatch, PathMatch, PathModifier, UrlRewrite};

    let mut r = route("mp", "rewrite", "web", Some(8080), ("web", 8080));
    r.rules[0].matches = vec![HttpMatch {
        path: Some(PathMatch::Prefix("/api".into())),
        ..HttpMatch::default()
    }];
    r.rules[0].filters = vec![HttpFilter::UrlRewrite(UrlRewrite {
        hostname: None,
        path: Some(PathModifier::ReplacePrefixMatch("/v2".into())),
    })];
    let model = build(Snapshot {
        rows: vec![row("mp", "web", "10.0.0.1", &[], true)],
        http_routes: vec![r],
        ..Snapshot::default()
    });
    let c = caller(Some("mp"));
    let hosts = ["web.mp.aether.internal:8080"];
    let d = resolve_request(
        &model,
        &c,
        &RequestFacts {
            entry: HttpEntry::Loopback,
            authority: AuthorityInput {
                version: HttpVersion::Http11,
                absolute: None,
                h2_authority: None,
                hosts: &hosts,
            },
            method: "GET",
            path_and_query: Some("/api/users?x=1"),
            headers: &http::HeaderMap::new(),
            hold_expired: false,
            entropy: 0,
            explain: true,
        },
    );
    let RequestDecision::Deliver(del) = d else {
        panic!("{d:?}")
    };
    let run = del.route.as_ref().expect("the rule chose the delivery");
    assert_eq!(run.matched_prefix.as_deref(), Some("/api"));
    assert!(
        matches!(run.plan.request.as_slice(), [FilterStep::Rewrite(_)]),
        "{:?}",
        run.plan.request
    );
    assert_eq!(run.backend_index, 0);
    // The same path outside the prefix matches no rule.
    assert_eq!(
        reason(&ask(
            &model,
            &c,
            HttpEntry::Loopback,
            "web.mp.aether.internal:8080",
            false
        )),
        Some("route-not-matched")
    );
}

#[test]
fn pods_of_an_ignored_namespace_are_neither_managed_nor_registered() {
    use aether::model::snapshot::Pod;
    let mut s = Snapshot {
        rows: vec![
            row("kube-system", "dns", "10.0.0.53", &[], true),
            row("mp", "web", "10.0.0.1", &[], true),
        ],
        pods: vec![Arc::new(Pod {
            namespace: "kube-system".into(),
            name: "dns-0".into(),
            service_account: "dns".into(),
            node: None,
            ips: vec!["10.0.0.53".parse().unwrap()],
            labels: BTreeMap::new(),
            managed: true,
            redirect_all: None,
            exclude_outbound_ports: Vec::new(),
            exclude_outbound_ip_ranges: Vec::new(),
            ready: true,
            netns: None,
            netns_from_cni: false,
            command: Vec::new(),
            inbound_mode: None,
            host_ips: Vec::new(),
        })],
        ..Snapshot::default()
    };
    let mut ctx = NodeContext::default();
    ctx.ignored_namespaces.insert("kube-system".into());
    registrar::complete_snapshot_except(
        &mut s,
        "10.96.0.0/16".parse().unwrap(),
        &ctx.ignored_namespaces,
    );
    assert!(
        s.services.iter().all(|svc| svc.namespace != "kube-system"),
        "no generated Service"
    );
    let model = compile(&s, &ctx);
    assert!(!model.pod("kube-system", "dns-0").unwrap().managed);
    assert!(
        model.classes("kube-system", "dns").is_none(),
        "not registered"
    );
    let c = caller(Some("mp"));
    assert_eq!(
        delivered_to(&ask(
            &model,
            &c,
            HttpEntry::Loopback,
            "web.mp.aether.internal:8080",
            false
        ))
        .len(),
        1
    );
    // A dial to the ignored pod's IP is not a pod-IP dial: it is answered by the name rules.
    let pod = SocketAddr::new("10.0.0.53".parse().unwrap(), 8080);
    let d = ask(
        &model,
        &c,
        HttpEntry::PodIp { dialled: pod },
        "example.com",
        false,
    );
    assert!(matches!(d, RequestDecision::Passthrough(_)), "{d:?}");
}

#[test]
fn a_cross_namespace_backend_of_a_mesh_route_needs_no_reference_grant() {
    // routes.md §3 (changed 2026-12-01): a Service-parent route's backend in another namespace
    // is valid without a ReferenceGrant (GEP-1294); the status says ResolvedRefs=True.
    let mut r = route("mp", "to-other", "web", None, ("api", 8080));
    r.rules[0].backends[0].target.namespace = Some("other".into());
    let model = build(Snapshot {
        rows: vec![
            row("mp", "web", "10.0.0.1", &[], true),
            row("other", "api", "10.0.0.2", &[], true),
        ],
        http_routes: vec![r],
        ..Snapshot::default()
    });
    let refs = model
        .route_statuses()
        .next()
        .expect("a status")
        .conditions
        .iter()
        .find(|c| c.type_ == "ResolvedRefs")
        .unwrap()
        .clone();
    assert_eq!(
        (refs.status.as_str(), refs.reason.as_str()),
        ("True", "ResolvedRefs")
    );
    assert_eq!(
        delivered_to(&ask(
            &model,
            &caller(Some("mp")),
            HttpEntry::Loopback,
            "web.mp.aether.internal:8080",
            false
        )),
        vec!["10.0.0.2".parse::<IpAddr>().unwrap()]
    );
}

#[test]
fn a_consumer_route_applies_to_its_namespaces_callers_only() {
    // routes.md §2.3: a route in the caller's namespace, parented to a Service of another
    // namespace, takes precedence for that caller; every other caller sees the producer routes.
    // Its backend in the parent's namespace needs no ReferenceGrant (routes.md §3).
    let mut consumer = route("client", "consumer", "web", None, ("other", 8080));
    consumer.parents[0].target.namespace = Some("mp".into());
    consumer.rules[0].backends[0].target.namespace = Some("mp".into());
    let model = build(Snapshot {
        rows: vec![
            row("mp", "web", "10.0.0.1", &[], true),
            row("mp", "other", "10.0.0.2", &[], true),
        ],
        http_routes: vec![consumer],
        ..Snapshot::default()
    });
    let host = "web.mp.aether.internal:8080";
    let from_client = delivered_to(&ask(
        &model,
        &caller(Some("client")),
        HttpEntry::Loopback,
        host,
        false,
    ));
    assert_eq!(
        from_client,
        vec!["10.0.0.2".parse::<IpAddr>().unwrap()],
        "the consumer route's backend"
    );
    let from_mp = delivered_to(&ask(
        &model,
        &caller(Some("mp")),
        HttpEntry::Loopback,
        host,
        false,
    ));
    assert_eq!(
        from_mp,
        vec!["10.0.0.1".parse::<IpAddr>().unwrap()],
        "default delivery for other callers"
    );
}

/// The fixture with `variants/<variant>` on top and `edit` applied to one file, compiled.
fn fixture_model(variant: Option<&str>, edit: Option<(&str, &str, &str)>) -> (Snapshot, Model) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/examples");
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("aether-units-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(root.join("mp")).unwrap().flatten() {
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    if let Some(v) = variant {
        for e in std::fs::read_dir(root.join("variants").join(v))
            .unwrap()
            .flatten()
        {
            std::fs::copy(
                e.path(),
                dir.join(format!("zz-{}", e.file_name().to_string_lossy())),
            )
            .unwrap();
        }
    }
    if let Some((file, from, to)) = edit {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        assert!(text.contains(from), "{file}: {from:?}");
        std::fs::write(dir.join(file), text.replacen(from, to, 1)).unwrap();
    }
    let mut snapshot = aether::registry::file::load_dir(&dir).unwrap().snapshot;
    std::fs::remove_dir_all(&dir).unwrap();
    registrar::complete_snapshot(&mut snapshot, "10.96.0.0/16".parse().unwrap());
    let model = compile(&snapshot, &NodeContext::default());
    (snapshot, model)
}

#[test]
fn plaintext_is_refused_on_the_declared_ports_of_pods_a_service_level_authorization_guards() {
    // model.md §12.5 item 3: mp-multi has an ext_authz in the fixture; with deny-rbac,
    // mp-httponly has an rbac; mp-eighty has neither and stays open (permissive).
    let (_, base) = fixture_model(None, None);
    let refused = |m: &Model, pod: &str| m.pod("mp", pod).unwrap().inbound.refused_ports.clone();
    assert_eq!(refused(&base, "mp-multi-0"), vec![8080, 9090]);
    assert_eq!(
        base.pod("mp", "mp-multi-0").unwrap().inbound.authorized_by,
        vec!["mp/mp-multi".to_owned()]
    );
    assert!(refused(&base, "mp-httponly-0").is_empty());
    assert!(refused(&base, "mp-eighty-0").is_empty());
    // A pod that declares nothing has nothing to refuse.
    assert!(refused(&base, "mp-client").is_empty());
    let (_, rbac) = fixture_model(Some("deny-rbac"), None);
    assert_eq!(refused(&rbac, "mp-httponly-0"), vec![8080]);
    assert!(refused(&rbac, "mp-httponly-1").iter().eq([8080].iter()));
    assert!(refused(&rbac, "mp-eighty-0").is_empty());
    // strict refuses without any filter; an unknown mode is strict too, with a diagnostic.
    let ann = "    aether.io/netns: \"mp-nine-0\"\n";
    for (mode, strict) in [("strict", true), ("permissive", false), ("strcit", true)] {
        let with = format!("{ann}    inbound.aether.io/mode: \"{mode}\"\n");
        let (_, m) = fixture_model(None, Some(("10-mp-nine.yaml", ann, &with)));
        let nine = m.pod("mp", "mp-nine-0").unwrap();
        assert_eq!(nine.inbound.strict, strict, "{mode}");
        assert_eq!(
            refused(&m, "mp-nine-0"),
            if strict { vec![9000] } else { vec![] }
        );
        let flagged = m
            .diagnostics
            .iter()
            .any(|d| d.kind.as_str() == "inbound-mode" && d.subject == "mp/mp-nine-0");
        assert_eq!(flagged, mode == "strcit", "{mode}");
    }
}

#[test]
fn a_passthrough_to_a_mesh_pod_is_carried_over_the_hop_to_one_of_its_ready_endpoints() {
    // model.md §12.5 item 1.
    let (snapshot, m) = fixture_model(None, None);
    let vip = |name: &str| {
        snapshot
            .services
            .iter()
            .find(|s| s.name == name)
            .and_then(|s| s.cluster_ips.first().copied())
            .unwrap()
    };
    let pod_ip = |name: &str| {
        snapshot
            .pods
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| p.ips.first().copied())
            .unwrap()
    };
    // mp-owned's user Service (80 → 8080) selects two mesh pods.
    let owned = m
        .passthrough_over_hop(SocketAddr::new(vip("mp-owned"), 80))
        .unwrap();
    let mut got: Vec<(IpAddr, u16, Option<String>)> = owned
        .iter()
        .map(|e| (e.address, e.port, e.mesh.as_ref().map(ToString::to_string)))
        .collect();
    got.sort();
    let mut want = vec![
        (pod_ip("mp-owned-0"), 8080, Some("mp/mp-owned".to_owned())),
        (pod_ip("mp-owned-1"), 8080, Some("mp/mp-owned".to_owned())),
    ];
    want.sort();
    assert_eq!(got, want);
    // ext-http's Service selects an unmanaged pod: a plain passthrough.
    assert!(
        m.passthrough_over_hop(SocketAddr::new(vip("ext-http"), 18081))
            .is_none()
    );
    // A served pod's declared port is that pod; an undeclared one is a plain passthrough.
    let one = m
        .passthrough_over_hop(SocketAddr::new(pod_ip("mp-httponly-0"), 8080))
        .unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(
        one[0].mesh.as_ref().map(ToString::to_string).as_deref(),
        Some("mp/mp-httponly")
    );
    assert!(
        m.passthrough_over_hop(SocketAddr::new(pod_ip("mp-httponly-0"), 7777))
            .is_none()
    );
}

#[test]
fn a_byte_stream_meets_the_rbac_of_the_services_that_guard_its_pod_and_never_an_ext_authz() {
    // model.md §12.5 item 2, the one verdict the daemon and explain use. deny-rbac-tcp: the rbac
    // of mp-mixed lets only mp-other/mp-client-other through.
    let (snapshot, m) = fixture_model(Some("deny-rbac-tcp"), None);
    let ip = |pod: &str| {
        snapshot
            .pods
            .iter()
            .find(|p| p.name == pod)
            .and_then(|p| p.ips.first().copied())
            .unwrap()
    };
    let mixed = ip("mp-mixed-0");
    assert_eq!(
        m.connection_verdict(mixed, "mp-other", "mp-client-other"),
        Ok(())
    );
    let denied = m.connection_verdict(mixed, "mp", "mp-client").unwrap_err();
    assert_eq!(
        denied.to_string(),
        "rbac mp/mp-mixed-rbac of mp/mp-mixed denies the caller"
    );
    // A pod no authorization guards lets every caller through.
    assert_eq!(
        m.connection_verdict(ip("mp-eighty-0"), "mp", "mp-client"),
        Ok(())
    );
    assert!(
        !m.diagnostics
            .iter()
            .any(|d| d.kind.as_str() == "ext-authz-on-tcp"),
        "no ext_authz guards a raw-TCP port in the fixture"
    );
}

#[test]
fn an_ext_authz_over_raw_tcp_ports_is_flagged_and_refuses_their_byte_streams() {
    // The fixture's mp-multi ext_authz, pointed at mp-mixed (8080 HTTP, 9000 raw TCP).
    let edit = (
        "40-filters.yaml",
        "    name: mp-multi\n  extAuthz:",
        "    name: mp-mixed\n  extAuthz:",
    );
    let (snapshot, m) = fixture_model(None, Some(edit));
    let flagged: Vec<_> = m
        .diagnostics
        .iter()
        .filter(|d| d.kind.as_str() == "ext-authz-on-tcp")
        .collect();
    assert_eq!(flagged.len(), 1, "{flagged:?}");
    assert_eq!(flagged[0].subject, "mp/mp-multi-ext-authz");
    assert!(
        flagged[0].detail.contains("raw-TCP port(s) 9000 ")
            && flagged[0].detail.contains("mp/mp-mixed"),
        "{}",
        flagged[0].detail
    );
    let mixed = snapshot
        .pods
        .iter()
        .find(|p| p.name == "mp-mixed-1")
        .and_then(|p| p.ips.first().copied())
        .unwrap();
    let denied = m
        .connection_verdict(mixed, "mp-other", "mp-client-other")
        .unwrap_err();
    assert!(
        matches!(denied, aether::model::ConnectionDenied::ExtAuthz { .. }),
        "{denied}"
    );
}

#[test]
fn the_fixture_and_each_variant_compile_alike_whole_and_by_components() {
    // crate::model::split: the fixture holds what the property test's worlds lack in number
    // (filters on Services and routes, TLS, TCP and UDP routes, a consumer route across
    // namespaces, mirrors, user Services over mesh pods): the merge of its components' models
    // is the model of the whole, with every variant on top.
    use aether::model::split::{merge, partition, restrict};
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/examples/variants");
    let mut variants: Vec<Option<String>> = vec![None];
    for e in std::fs::read_dir(root).unwrap().flatten() {
        if e.path().is_dir() {
            variants.push(Some(e.file_name().to_string_lossy().into_owned()));
        }
    }
    assert!(variants.len() > 10, "the variants are read");
    let ctx = NodeContext::default();
    for v in variants {
        let (snapshot, whole) = fixture_model(v.as_deref(), None);
        let p = partition(&snapshot);
        // The fixture's mesh services do not all hang together: more than one part.
        assert!(p.count > 5, "{v:?}: {} components", p.count);
        let parts: Vec<Model> = (0..p.count)
            .map(|c| compile(&restrict(&snapshot, &p, |x| x == c), &ctx))
            .collect();
        assert!(merge(&ctx, &parts) == whole, "{v:?}");
    }
}

/// A Pod of another service that claims mp-multi-0's address (issue #35 item 5), as a document
/// put before the clients' file.
const INTRUDER: &str = r#"---
apiVersion: v1
kind: Pod
metadata:
  name: mp-a-intruder-0
  namespace: mp
spec:
  serviceAccountName: mp-a-intruder
  nodeName: node-a
status:
  podIP: 10.244.1.12
  podIPs:
  - ip: 10.244.1.12
  conditions:
  - type: Ready
    status: "True"
---
"#;

#[test]
fn an_address_two_rows_claim_keeps_every_claimants_protection_and_is_nobodys() {
    use aether::model::Unbound;
    use aether::resolve::classify_connection;
    use aether::resolve::decision::ConnDecision;
    let multi: IpAddr = "10.244.1.12".parse().unwrap();
    let client: IpAddr = "10.244.1.101".parse().unwrap();
    let from = caller(Some("mp"));
    let pod_ip_dial =
        |m: &Model, port: u16| classify_connection(m, &from, SocketAddr::new(multi, port));
    // Without the claim: mp-multi-0's address is a pod-IP dial's, and proves mp-multi.
    let (_, base) = fixture_model(None, None);
    assert!(matches!(pod_ip_dial(&base, 8080), ConnDecision::Sniff(_)));
    assert_eq!(base.source_binding(multi, "mp", "mp-multi"), Ok(()));
    assert!(matches!(
        base.source_binding(client, "mp", "mp-multi"),
        Err(Unbound::OtherIdentity(k)) if &*k.name == "mp-client"
    ));
    assert_eq!(
        base.source_binding("10.9.9.9".parse().unwrap(), "mp", "mp-multi"),
        Err(Unbound::NotAPod)
    );
    // A Pod of mp-a-intruder (which sorts first) at the same address.
    let first = "# aether acceptance fixture: the clients";
    let claimed = format!("{INTRUDER}{first}");
    let (_, m) = fixture_model(None, Some(("20-clients.yaml", first, &claimed)));
    // Every claimant's inbound protection: mp-multi's ext_authz still refuses plaintext.
    assert_eq!(
        m.pod("mp", "mp-multi-0").unwrap().inbound.refused_ports,
        vec![8080, 9090]
    );
    // Nobody's address: no pod-IP dial to it on any port, no hop from it proves anyone.
    for port in [8080, 9090, 7777] {
        assert!(
            matches!(pod_ip_dial(&m, port), ConnDecision::Close(_)),
            "{port}: {:?}",
            pod_ip_dial(&m, port)
        );
    }
    for sa in ["mp-multi", "mp-a-intruder"] {
        assert_eq!(m.source_binding(multi, "mp", sa), Err(Unbound::Contested));
    }
    // The pod that holds the address still takes hops for its own identity and ports.
    let ports = m.hop_ports(multi, "mp", "mp-multi").unwrap();
    assert_eq!(ports.keys().copied().collect::<Vec<_>>(), vec![8080, 9090]);
    assert!(m.hop_ports(multi, "mp", "mp-httponly").is_none());
    assert!(
        m.diagnostics
            .iter()
            .any(|d| d.kind.as_str() == "duplicate-address"
                && d.subject == "10.244.1.12"
                && d.detail.contains("mp/mp-a-intruder")
                && d.detail.contains("mp/mp-multi"))
    );
}

#[test]
fn a_policy_the_daemon_cannot_read_makes_the_services_it_names_refuse() {
    // issue #35 item 1: an ext_authz whose server has no port. Before, the converter dropped it
    // and mp-nine was served without it, plaintext to its pods included, with no diagnostic.
    let (_, base) = fixture_model(None, None);
    assert!(
        base.pod("mp", "mp-nine-0")
            .unwrap()
            .inbound
            .refused_ports
            .is_empty()
    );
    let (_, m) = fixture_model(Some("policy-unreadable"), None);
    let filters = m.filters_of(&aether::resolve::decision::ServiceKey {
        namespace: "mp".into(),
        name: "mp-nine".into(),
    });
    assert!(
        filters.iter().any(|f| f.name == "mp/mp-nine-ext-authz"
            && matches!(
                f.config,
                aether::model::snapshot::FilterConfig::Unreadable(_)
            )),
        "{filters:?}"
    );
    // Plaintext to its pods is refused, a byte stream over the hop too.
    assert_eq!(
        m.pod("mp", "mp-nine-0").unwrap().inbound.refused_ports,
        vec![9000]
    );
    let nine: IpAddr = "10.244.1.16".parse().unwrap();
    assert!(m.connection_verdict(nine, "mp", "mp-client").is_err());
    // A request by name is a delivery that carries the filter (the data plane refuses it
    // 403 authz-unavailable on both nodes; explain says so).
    let d = ask(
        &m,
        &caller(Some("mp")),
        HttpEntry::Loopback,
        "mp-nine.mp.aether.internal:9000",
        true,
    );
    let RequestDecision::Deliver(d) = d else {
        panic!("{d:?}")
    };
    assert!(
        aether::resolve::describe_service_filters(&d)
            .iter()
            .any(|l| l.contains("unreadable") && l.contains("authz-unavailable")),
        "{:?}",
        aether::resolve::describe_service_filters(&d)
    );
    // The diagnostic names the filter and what it refuses.
    assert!(
        m.diagnostics
            .iter()
            .any(|d| d.kind.as_str() == "filter-unreadable"
                && d.subject == "mp/mp-nine-ext-authz"
                && d.detail.contains("extAuthz.server")
                && d.detail.contains("mp-nine"))
    );
    // The other services are untouched.
    assert!(
        m.pod("mp", "mp-eighty-0")
            .unwrap()
            .inbound
            .refused_ports
            .is_empty()
    );
}

#[test]
fn a_route_the_daemon_cannot_read_answers_500_on_its_parents_and_never_the_default() {
    use aether::resolve::decision::RequestDecision;
    // issue #35 item 1: an HTTPRoute whose backend weight is out of range. Before, the
    // converter dropped it and mp-multi's requests went to the default delivery (9090's route
    // gone, 8080 to 8080), with no diagnostic.
    let (_, m) = fixture_model(
        Some("a4"),
        Some((
            "zz-httproute-a4.yaml",
            "      port: 9090",
            "      port: 9090\n      weight: 5000000",
        )),
    );
    for port in [8080, 9090] {
        let d = ask(
            &m,
            &caller(Some("mp")),
            HttpEntry::Loopback,
            &format!("mp-multi.mp.aether.internal:{port}"),
            true,
        );
        assert!(
            matches!(&d, RequestDecision::Answer(a, _) if a.reason.code() == "invalid-backend"),
            "{port}: {d:?}"
        );
    }
    assert!(
        m.diagnostics
            .iter()
            .any(|d| d.kind.as_str() == "route-unreadable"
                && d.subject == "HTTPRoute mp/a4"
                && d.detail.contains("weight"))
    );
}

#[test]
fn names_kubernetes_would_refuse_and_a_shared_netns_are_refused_with_a_diagnostic() {
    // issue #35 item 5: before, both entered the model silently (the file registry checks no
    // name, and the second pod of one namespace was refused only by a port already taken).
    let bad = r#"---
apiVersion: v1
kind: Pod
metadata:
  name: mp-upper-0
  namespace: mp
  annotations: {aether.io/netns: "mp-upper-0"}
spec:
  serviceAccountName: "Mp-Upper/x"
  nodeName: node-a
status:
  podIP: 10.244.1.200
  podIPs: [{ip: 10.244.1.200}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Pod
metadata:
  name: mp-twin-0
  namespace: mp
  annotations: {aether.io/netns: "mp-multi-0"}
spec:
  serviceAccountName: mp-twin
  nodeName: node-a
status:
  podIP: 10.244.1.201
  podIPs: [{ip: 10.244.1.201}]
  conditions: [{type: Ready, status: "True"}]
---
"#;
    let first = "# aether acceptance fixture: the clients";
    let edited = format!("{bad}{first}");
    let (_, m) = fixture_model(None, Some(("20-clients.yaml", first, &edited)));
    let diag = |kind: &str, subject: &str| {
        m.diagnostics
            .iter()
            .find(|d| d.kind.as_str() == kind && d.subject == subject)
            .map(|d| d.detail.clone())
    };
    // The ServiceAccount with an upper-case letter and a '/': its row and its pod are refused.
    let detail = diag("invalid-name", "mp/Mp-Upper/x 10.244.1.200").expect("row refused");
    assert!(detail.contains("RFC 1123"), "{detail}");
    assert!(diag("invalid-name", "mp/mp-upper-0").is_some());
    assert!(m.pod("mp", "mp-upper-0").is_none());
    assert!(m.classes("mp", "Mp-Upper/x").is_none());
    // A pod naming mp-multi-0's network namespace: neither is served.
    for pod in ["mp-twin-0", "mp-multi-0"] {
        let detail = diag("netns-shared", &format!("mp/{pod}")).expect("netns-shared");
        assert!(detail.contains("none of them is served"), "{detail}");
        assert!(m.pod("mp", pod).is_none(), "{pod} served");
    }
    // Everything else is as before.
    assert!(m.pod("mp", "mp-multi-1").is_some());
}

/// issue #36 item 6: a reload that compiles the same registry again, later, has a model that
/// serves like the published one (the compile clock aside) and is not published again; one that
/// changes what is served is. The handle keeps the generation on a refresh and wakes nobody.
#[test]
fn a_model_compiled_again_later_serves_alike_and_keeps_its_generation() {
    let (snapshot, model) = fixture_model(None, None);
    let later = compile(
        &snapshot,
        &NodeContext {
            now_ms: model.context.now_ms + 60_000,
            ..model.context.clone()
        },
    );
    assert!(later != model, "the compile clock is part of the model");
    assert!(later.serves_like(&model));
    let (_, changed) = fixture_model(
        None,
        Some((
            "10-mp-nine.yaml",
            "    aether.io/netns: \"mp-nine-0\"\n",
            "    aether.io/netns: \"mp-nine-0\"\n    inbound.aether.io/mode: \"strict\"\n",
        )),
    );
    assert!(
        !changed.serves_like(&model),
        "a strict pod serves otherwise"
    );
    // An annotation the mesh does not read changes nothing it serves.
    let (_, annotated) = fixture_model(
        None,
        Some((
            "10-mp-nine.yaml",
            "    aether.io/netns: \"mp-nine-0\"\n",
            "    aether.io/netns: \"mp-nine-0\"\n    example.com/owner: \"team-a\"\n",
        )),
    );
    assert!(annotated.serves_like(&model));

    let handle = aether::state::ModelHandle::new(model);
    let replaced = handle.refresh(later, Some(Arc::new(snapshot)));
    assert_eq!(replaced.generation, 1);
    assert_eq!(handle.generation(), 1, "refreshed, not published");
    assert_eq!(handle.published().generation, 1);
    assert!(
        handle.published().source().is_some(),
        "the new snapshot beside it"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    assert!(
        !rt.block_on(handle.newer_than(1, std::time::Duration::from_secs(5))),
        "nobody waiting for a new model is woken"
    );
    handle.publish(changed);
    assert_eq!(handle.generation(), 2);
}
