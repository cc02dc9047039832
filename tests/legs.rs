//! The golden legs: every leg of spec/legs.md that can be stated without sockets, run against
//! the example registry (`config/examples/mp`, with the overlays of `config/examples/variants`)
//! through the same resolvers the daemon uses (`aether::explain::decide`).
//!
//! Each row states the dial, the authority and the bytes, and asserts what a client sees: the
//! status and `x-aether-error` reason with the exact `ports:` line, or the delivery (service,
//! port, pod port, and which pods), or raw TCP at accept, or a passthrough.
#![allow(clippy::unwrap_used)] // Tests unwrap: a panic is the failure report (STYLE.md §6.4).

use std::collections::BTreeSet;
use std::path::Path;

use aether::explain::{Bytes, ConnOutcome, Decided, Question, decide};
use aether::model::snapshot::Snapshot;
use aether::model::{Model, NodeContext, compile, registrar};
use aether::resolve::decision::{RequestDecision, TcpBackend, TcpChoice, UdpDecision};

const MESH: &str = "aether.internal";

struct World {
    snapshot: Snapshot,
    model: Model,
}

fn load(dir: &str) -> Snapshot {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let load = aether::registry::file::load_dir(&path).expect("the example registry loads");
    assert!(load.problems.is_empty(), "{dir}: {:?}", load.problems);
    load.snapshot
}

/// The base registry, with each variant's objects added or replacing those of the same kind,
/// namespace and name.
fn world(variants: &[&str]) -> World {
    let mut snapshot = load("config/examples/mp");
    for v in variants {
        let extra = load(&format!("config/examples/variants/{v}"));
        for r in extra.http_routes {
            snapshot
                .http_routes
                .retain(|b| (&b.namespace, &b.name) != (&r.namespace, &r.name));
            snapshot.http_routes.push(r);
        }
        for f in extra.mesh_filters {
            snapshot
                .mesh_filters
                .retain(|b| (&b.namespace, &b.name) != (&f.namespace, &f.name));
            snapshot.mesh_filters.push(f);
        }
    }
    registrar::complete_snapshot(&mut snapshot, "10.96.0.0/16".parse().unwrap());
    let model = compile(&snapshot, &NodeContext::default());
    World { snapshot, model }
}

/// What a client sees, reduced to what a leg asserts.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Got {
    /// A delivery: backend service `ns/name`, front port, pod port, the pods it may reach.
    Deliver {
        svc: String,
        port: Option<u16>,
        pod_port: u16,
        pods: BTreeSet<String>,
    },
    /// A mesh answer: status, reason, and the `ports:` line of a 421.
    Answer {
        status: u16,
        reason: &'static str,
        ports: Option<String>,
    },
    /// Raw TCP: service, port the client reached, pod port, pods.
    Tcp {
        svc: String,
        port: u16,
        pod_port: u16,
        pods: BTreeSet<String>,
    },
    /// Passed through outside the mesh (or never captured).
    Pass,
    /// Closed.
    Close,
    /// A route's redirect.
    Redirect { status: u16, location: String },
    /// A datagram forwarded: service, pod port, pods.
    Udp {
        svc: String,
        pod_port: u16,
        pods: BTreeSet<String>,
    },
    /// A datagram dropped.
    Dropped,
}

fn pods<'a>(
    eps: impl IntoIterator<Item = &'a aether::resolve::decision::Endpoint>,
) -> BTreeSet<String> {
    eps.into_iter()
        .map(|e| e.pod.as_deref().unwrap_or("?").to_owned())
        .collect()
}

fn tcp(c: &TcpChoice) -> Got {
    assert_eq!(c.backends.len(), 1, "one default destination: {c:?}");
    match &c.backends[0].1 {
        TcpBackend::Target(t) => Got::Tcp {
            svc: t.service.to_string(),
            port: t.port,
            pod_port: t.pod_port,
            pods: pods(t.endpoints.iter()),
        },
        TcpBackend::Invalid(_) => Got::Close,
    }
}

fn request(d: &RequestDecision) -> Got {
    match d {
        RequestDecision::Answer(a, _) => Got::Answer {
            status: a.reason.status(),
            reason: a.reason.code(),
            ports: a.service.as_ref().map(|s| s.ports.to_string()),
        },
        RequestDecision::Passthrough(_) => Got::Pass,
        RequestDecision::Hold(..) => panic!("a hold is resolved again after it expires"),
        RequestDecision::Redirect {
            status, location, ..
        } => Got::Redirect {
            status: *status,
            location: location.clone(),
        },
        RequestDecision::Deliver(d) => Got::Deliver {
            svc: d.backend.service.to_string(),
            port: d.backend.port,
            pod_port: d.backend.pod_port,
            pods: pods(d.backend.endpoints.iter()),
        },
    }
}

fn got(d: &Decided) -> Got {
    match &d.connection {
        ConnOutcome::NotCaptured(_) | ConnOutcome::Passthrough(_) => Got::Pass,
        ConnOutcome::LoopbackNotHttp => Got::Answer {
            status: 400,
            reason: "not-http",
            ports: None,
        },
        ConnOutcome::Tcp(c, _) => tcp(c),
        ConnOutcome::Close(_) => Got::Close,
        ConnOutcome::Udp(UdpDecision::Forward(t)) => Got::Udp {
            svc: t.service.to_string(),
            pod_port: t.pod_port,
            pods: pods(t.endpoints.iter()),
        },
        ConnOutcome::Udp(UdpDecision::Drop(_)) => Got::Dropped,
        ConnOutcome::Udp(UdpDecision::NotCaptured(_)) => Got::Pass,
        ConnOutcome::Http(..) => request(
            d.after_hold
                .as_ref()
                .or(d.request.as_ref())
                .expect("an HTTP connection answers its request"),
        ),
    }
}

/// One question.
#[derive(Clone)]
struct Q {
    from: &'static str,
    dial: String,
    hosts: Option<Vec<String>>,
    absolute: Option<String>,
    method: &'static str,
    path: String,
    bytes: Bytes,
    entropy: u64,
}

fn q(from: &'static str, dial: impl Into<String>) -> Q {
    Q {
        from,
        dial: dial.into(),
        hosts: None,
        absolute: None,
        method: "GET",
        path: "/".into(),
        bytes: Bytes::Http,
        entropy: 0,
    }
}

impl Q {
    fn host(mut self, h: impl Into<String>) -> Self {
        self.hosts.get_or_insert_with(Vec::new).push(h.into());
        self
    }
    fn no_host(mut self) -> Self {
        self.hosts = Some(Vec::new());
        self
    }
    fn bytes(mut self, b: Bytes) -> Self {
        self.bytes = b;
        self
    }
    fn path(mut self, p: &str) -> Self {
        self.path = p.into();
        self
    }
    fn method(mut self, m: &'static str) -> Self {
        self.method = m;
        self
    }
    fn absolute(mut self, a: &str) -> Self {
        self.absolute = Some(a.into());
        self
    }
    fn entropy(mut self, e: u64) -> Self {
        self.entropy = e;
        self
    }
}

impl World {
    fn decide(&self, q: &Q) -> Decided {
        let question = Question {
            from: q.from.into(),
            dial: q.dial.clone(),
            hosts: q.hosts.clone(),
            absolute: q.absolute.clone(),
            method: q.method.into(),
            path: q.path.clone(),
            headers: Vec::new(),
            bytes: q.bytes.clone(),
            entropy: q.entropy,
        };
        decide(&self.snapshot, &self.model, &question).unwrap_or_else(|e| panic!("{}: {e}", q.dial))
    }

    #[track_caller]
    #[allow(clippy::needless_pass_by_value)] // Rows read as `check(leg, question, answer)`.
    fn check(&self, leg: &str, q: Q, want: Got) {
        let d = self.decide(&q);
        assert_eq!(
            got(&d),
            want,
            "leg {leg}: dial {} hosts {:?} bytes {:?}",
            q.dial,
            q.hosts,
            q.bytes
        );
    }

    fn pod_ip(&self, ns: &str, pod: &str) -> String {
        self.model.pod(ns, pod).expect("the pod exists").ips[0].to_string()
    }

    fn vip(&self, ns: &str, svc: &str) -> String {
        self.snapshot
            .services
            .iter()
            .find(|s| s.namespace == ns && s.name == svc)
            .expect("the Service exists")
            .cluster_ips[0]
            .to_string()
    }
}

const CLIENT: &str = "mp/mp-client";
const NOCAPTURE: &str = "mp/mp-client-nocapture";
const OTHER: &str = "mp-other/mp-client-other";
const LOOPBACK: &str = "127.0.0.1:18081";

fn mesh(wl: &str) -> String {
    format!("{wl}.mp.{MESH}")
}

fn echo(wl: &str, p: u16) -> Got {
    Got::Deliver {
        svc: format!("mp/{wl}"),
        port: Some(p),
        pod_port: p,
        pods: [format!("{wl}-0"), format!("{wl}-1")].into_iter().collect(),
    }
}

fn refused(reason: &'static str, ports: &str) -> Got {
    Got::Answer {
        status: 421,
        reason,
        ports: Some(ports.into()),
    }
}

fn answer(status: u16, reason: &'static str) -> Got {
    Got::Answer {
        status,
        reason,
        ports: None,
    }
}

fn raw_tcp(wl: &str, port: u16, pod_port: u16) -> Got {
    Got::Tcp {
        svc: format!("mp/{wl}"),
        port,
        pod_port,
        pods: [format!("{wl}-0"), format!("{wl}-1")].into_iter().collect(),
    }
}

/// The six workloads: name, HTTP ports, raw-TCP ports, `ports:` line (legs.md §1.5).
const SIX: [(&str, &[u16], &[u16], &str); 6] = [
    ("mp-httponly", &[8080], &[], "8080/http"),
    ("mp-multi", &[8080, 9090], &[], "8080/http 9090/http"),
    (
        "mp-eighty",
        &[80, 8080, 9090],
        &[],
        "80/http 8080/http 9090/http",
    ),
    ("mp-mixed", &[8080], &[9000], "8080/http 9000/tcp"),
    ("mp-tcpfirst", &[8080], &[9000], "8080/http 9000/tcp"),
    ("mp-nine", &[9000], &[], "9000/http"),
];

#[test]
fn a1_a2_a3_every_http_port_answers_on_every_family_and_path() {
    let w = world(&[]);
    for (wl, http, _, _) in SIX {
        for &p in http {
            w.check("A1", q(CLIENT, format!("{}:{p}", mesh(wl))), echo(wl, p));
            for k8s in [
                format!("{wl}.mp.svc.cluster.local"),
                format!("{wl}.mp"),
                format!("{wl}.mp.svc"),
            ] {
                w.check("A2", q(CLIENT, format!("{k8s}:{p}")), echo(wl, p));
            }
            w.check(
                "A3",
                q(NOCAPTURE, LOOPBACK).host(format!("{}:{p}", mesh(wl))),
                echo(wl, p),
            );
        }
    }
}

#[test]
fn a4_a_port_less_parent_ref_applies_its_rule_on_both_paths() {
    let w = world(&["a4"]);
    let status = w.model.route_statuses().find(|s| s.name == "a4").unwrap();
    let conditions: Vec<(&str, &str, &str, &str)> = status
        .conditions
        .iter()
        .map(|c| {
            (
                c.type_.as_str(),
                c.status.as_str(),
                c.reason.as_str(),
                c.message.as_str(),
            )
        })
        .collect();
    assert_eq!(
        conditions,
        vec![
            ("Accepted", "True", "Accepted", ""),
            ("ResolvedRefs", "True", "ResolvedRefs", ""),
            (
                "gateway.aether.io/PodPortsJudged",
                "True",
                "PodPortsHTTP",
                "mp/mp-multi:9090->9090=http"
            ),
        ]
    );
    for question in [
        q(CLIENT, format!("{}:9090", mesh("mp-multi"))),
        q(NOCAPTURE, LOOPBACK).host(format!("{}:9090", mesh("mp-multi"))),
    ] {
        let d = w.decide(&question);
        assert_eq!(got(&d), echo("mp-multi", 9090));
        let Some(RequestDecision::Deliver(del)) = &d.request else {
            panic!("A4 delivers")
        };
        let rule = del.rule.as_ref().expect("A4's rule chose the delivery");
        assert_eq!(&*rule.route, "a4");
        assert!(
            aether::resolve::describe_route_filters(del)
                .iter()
                .any(|f| f.contains("x-a4")),
            "the rule's response header x-a4 runs: {:?}",
            aether::resolve::describe_route_filters(del)
        );
    }
}

#[test]
fn a5_a7_r2_r3_r4_refusals_carry_the_reason_and_the_ports() {
    let w = world(&[]);
    let multi = mesh("mp-multi");
    w.check(
        "A5",
        q(CLIENT, format!("{multi}:8080")).host(format!("{multi}:9090")),
        refused("port-mismatch", "8080/http 9090/http"),
    );
    for wl in ["mp-mixed", "mp-tcpfirst"] {
        w.check(
            "A6",
            q(NOCAPTURE, LOOPBACK).host(format!("{}:9000", mesh(wl))),
            refused("port-not-http", "8080/http 9000/tcp"),
        );
    }
    w.check(
        "A7",
        q(CLIENT, format!("{multi}:7777")),
        refused("port-not-declared", "8080/http 9090/http"),
    );
    w.check(
        "A7",
        q(CLIENT, "mp-multi.mp.svc.cluster.local:7777"),
        refused("port-not-declared", "8080/http 9090/http"),
    );
    w.check(
        "A7",
        q(NOCAPTURE, LOOPBACK).host(format!("{multi}:7777")),
        refused("port-not-declared", "8080/http 9090/http"),
    );
    for (wl, http, _, ports) in SIX {
        if http.contains(&80) {
            continue;
        }
        for name in [mesh(wl), format!("{wl}.mp.svc.cluster.local")] {
            w.check(
                "R2",
                q(CLIENT, format!("{name}:80")),
                refused("port-not-declared", ports),
            );
        }
        w.check(
            "R3",
            q(NOCAPTURE, LOOPBACK).host(mesh(wl)),
            refused("port-not-declared", ports),
        );
    }
    let httponly = mesh("mp-httponly");
    w.check(
        "R4",
        q(CLIENT, format!("{httponly}:18081")),
        refused("port-not-declared", "8080/http"),
    );
    w.check(
        "R4",
        q(NOCAPTURE, LOOPBACK).host(format!("{httponly}:18081")),
        refused("port-not-declared", "8080/http"),
    );
}

#[test]
fn a8_a11_r5_raw_tcp_is_decided_by_the_address_before_any_byte() {
    let w = world(&[]);
    w.check(
        "A8",
        q(CLIENT, format!("{}:7777", mesh("mp-mixed"))).bytes(Bytes::Raw),
        Got::Pass,
    );
    w.check(
        "A11 (i)",
        q(CLIENT, format!("{}:9000", w.vip("mp", "mp-mixed"))),
        raw_tcp("mp-mixed", 9000, 9000),
    );
    w.check(
        "A11 (ii)",
        q(CLIENT, format!("{}:9000", w.vip("mp", "mp-nine"))).bytes(Bytes::Raw),
        Got::Pass,
    );
    w.check(
        "A13",
        q(CLIENT, format!("{}:3306", w.vip("mp", "mp-serverfirst"))).bytes(Bytes::Silent),
        raw_tcp("mp-serverfirst", 3306, 3306),
    );
    w.check(
        "R5 (i)",
        q(CLIENT, format!("{}:18082", mesh("mp-tcpfirst"))).bytes(Bytes::Raw),
        raw_tcp("mp-tcpfirst", 18082, 9000),
    );
    w.check(
        "R5 (ii)",
        q(CLIENT, format!("{}:7777", mesh("mp-tcpfirst"))).bytes(Bytes::Raw),
        Got::Pass,
    );
    w.check(
        "R5c",
        q(CLIENT, format!("{}:18082", mesh("mp-mixed"))).bytes(Bytes::Raw),
        Got::Pass,
    );
    w.check(
        "M4",
        q(CLIENT, format!("{}:9000", mesh("mp-mixed"))).bytes(Bytes::Raw),
        raw_tcp("mp-mixed", 9000, 9000),
    );
    w.check(
        "X2",
        q(CLIENT, format!("{}:9000", mesh("mp-tcpfirst"))).bytes(Bytes::Raw),
        raw_tcp("mp-tcpfirst", 9000, 9000),
    );
    w.check(
        "N18 (ii)",
        q(CLIENT, format!("{}:9090", w.vip("mp", "mp-serverfirst"))).bytes(Bytes::Silent),
        raw_tcp("mp-serverfirst", 9090, 9090),
    );
}

#[test]
fn a9_a10_r1_a_port_less_host_is_the_dialled_port() {
    let w = world(&[]);
    for wl in ["mp-multi", "mp-eighty", "mp-mixed"] {
        let (_, http, _, _) = SIX.iter().find(|s| s.0 == wl).copied().unwrap();
        for &p in http.iter().filter(|&&p| p != 80) {
            for name in [mesh(wl), format!("{wl}.mp.svc.cluster.local")] {
                w.check(
                    "A9",
                    q(CLIENT, format!("{name}:{p}")).host(name.clone()),
                    echo(wl, p),
                );
            }
        }
    }
    w.check(
        "A10",
        q(CLIENT, format!("{}:9000", mesh("mp-nine"))),
        echo("mp-nine", 9000),
    );
    for name in [
        mesh("mp-eighty"),
        "mp-eighty.mp.svc.cluster.local".to_owned(),
    ] {
        w.check("R1", q(CLIENT, format!("{name}:80")), echo("mp-eighty", 80));
    }
    w.check(
        "R1",
        q(NOCAPTURE, LOOPBACK).host(mesh("mp-eighty")),
        echo("mp-eighty", 80),
    );
    w.check(
        "R1",
        q(NOCAPTURE, LOOPBACK).host(format!("{}:80", mesh("mp-eighty"))),
        echo("mp-eighty", 80),
    );
}

#[test]
fn worked_answers_of_addressing_15_for_the_six_workloads() {
    let w = world(&[]);
    let ports = [80u16, 8080, 9000, 9090, 7777, 18082];
    for (wl, http, tcp, line) in SIX {
        for d in ports {
            let want = if http.contains(&d) {
                echo(wl, d)
            } else if tcp.contains(&d) {
                raw_tcp(wl, d, d)
            } else if d == 18082 && wl == "mp-tcpfirst" {
                raw_tcp(wl, 18082, 9000)
            } else {
                refused("port-not-declared", line)
            };
            w.check(
                "§15 captured",
                q(CLIENT, format!("{}:{d}", mesh(wl))).host(mesh(wl)),
                want.clone(),
            );
            w.check(
                "§15 captured",
                q(CLIENT, format!("{}:{d}", mesh(wl))),
                want.clone(),
            );
            // Host :P with P != D: every echo becomes port-mismatch, pnd stays, TCP unchanged.
            let other = if d == 8080 { 9090 } else { 8080 };
            let want_other = match &want {
                Got::Deliver { .. } => refused("port-mismatch", line),
                w => w.clone(),
            };
            w.check(
                "§15 captured P!=D",
                q(CLIENT, format!("{}:{d}", mesh(wl))).host(format!("{}:{other}", mesh(wl))),
                want_other,
            );
        }
        for q_port in [
            None,
            Some(80u16),
            Some(8080),
            Some(9000),
            Some(9090),
            Some(7777),
            Some(18081),
            Some(18082),
        ] {
            let p = q_port.unwrap_or(80);
            let want = if p == 18081 || p == 18082 {
                refused("port-not-declared", line)
            } else if http.contains(&p) {
                echo(wl, p)
            } else if tcp.contains(&p) {
                refused("port-not-http", line)
            } else {
                refused("port-not-declared", line)
            };
            let host = q_port.map_or_else(|| mesh(wl), |p| format!("{}:{p}", mesh(wl)));
            w.check(
                "§15 proxy",
                q(NOCAPTURE, LOOPBACK).host(host.clone()),
                want.clone(),
            );
            w.check(
                "§15 proxy upper",
                q(NOCAPTURE, LOOPBACK).host(host.to_uppercase()),
                want.clone(),
            );
            let k8s = host.replace(&format!(".mp.{MESH}"), ".mp.svc.cluster.local");
            w.check(
                "§15 proxy k8s",
                q(NOCAPTURE, LOOPBACK).host(k8s),
                want.clone(),
            );
            let short = host.replace(&format!(".mp.{MESH}"), "");
            w.check(
                "§15 proxy short",
                q(NOCAPTURE, LOOPBACK).host(short),
                want.clone(),
            );
            w.check(
                "§15 captured 18081",
                q(CLIENT, format!("{}:18081", w.vip("mp", wl))).host(host),
                want,
            );
        }
    }
}

#[test]
fn worked_answers_of_addressing_15_on_a_pods_own_ip() {
    let w = world(&[]);
    for (wl, http, tcp, _) in SIX {
        let pod = format!("{wl}-0");
        let ip = w.pod_ip("mp", &pod);
        for d in [80u16, 8080, 9000, 9090, 7777] {
            let only_this = [pod.clone()].into_iter().collect::<BTreeSet<_>>();
            let want = if http.contains(&d) {
                Got::Deliver {
                    svc: format!("mp/{wl}"),
                    port: None,
                    pod_port: d,
                    pods: only_this,
                }
            } else if tcp.contains(&d) {
                Got::Tcp {
                    svc: format!("mp/{wl}"),
                    port: d,
                    pod_port: d,
                    pods: only_this,
                }
            } else {
                Got::Pass
            };
            // Whatever the Host names: another service, another port, or nothing.
            for host in [
                format!("{}:8080", mesh("mp-eighty")),
                format!("{}:9090", mesh("mp-multi")),
                "mp-multi".to_owned(),
            ] {
                w.check(
                    "§15 pod IP",
                    q(CLIENT, format!("{ip}:{d}")).host(host),
                    want.clone(),
                );
            }
        }
    }
}

#[test]
fn n1_n2_n3_short_names_stay_in_the_callers_namespace() {
    let w = world(&[]);
    w.check("N1 (i)", q(CLIENT, "mp-multi:9090"), echo("mp-multi", 9090));
    w.check(
        "N1 (ii)",
        q(CLIENT, "mp-multi:9090").host("mp-multi"),
        echo("mp-multi", 9090),
    );
    w.check(
        "N2 captured",
        q(OTHER, format!("{}:8080", w.vip("mp", "mp-multi"))).host("mp-multi:8080"),
        Got::Pass,
    );
    w.check(
        "N2 loopback",
        q(OTHER, LOOPBACK).host("mp-multi:8080"),
        answer(404, "not-a-mesh-name"),
    );
    for host in [
        "mp-multi.mp.svc.cluster.local:9090",
        "mp-multi.mp.svc:9090",
        "mp-multi.mp:9090",
        "MP-MULTI.MP.SVC.CLUSTER.LOCAL:9090",
        "mp-multi:9090",
    ] {
        w.check(
            "N3",
            q(NOCAPTURE, LOOPBACK).host(host),
            echo("mp-multi", 9090),
        );
    }
    w.check(
        "N3 port-less",
        q(NOCAPTURE, LOOPBACK).host("mp-multi.mp.svc.cluster.local"),
        refused("port-not-declared", "8080/http 9090/http"),
    );
}

#[test]
fn n4_a_captured_dial_to_18081_is_the_proxy_port() {
    let w = world(&[]);
    let vip = w.vip("mp", "mp-multi");
    w.check(
        "N4 (i)",
        q(CLIENT, format!("{vip}:18081")).host(format!("{}:9090", mesh("mp-multi"))),
        echo("mp-multi", 9090),
    );
    w.check(
        "N4 (ii)",
        q(CLIENT, format!("{vip}:18081")).host("mp-multi.mp.svc.cluster.local:8080"),
        echo("mp-multi", 8080),
    );
    w.check(
        "N4 (iii)",
        q(CLIENT, format!("{vip}:18081")).host("MP-MULTI.MP.SVC.CLUSTER.LOCAL:8080"),
        echo("mp-multi", 8080),
    );
    w.check(
        "N4 (iv)",
        q(CLIENT, format!("{vip}:18081")).host(mesh("mp-multi")),
        refused("port-not-declared", "8080/http 9090/http"),
    );
    w.check(
        "N4 (iv)",
        q(CLIENT, format!("{vip}:18081")).host(mesh("mp-eighty")),
        echo("mp-eighty", 80),
    );
}

#[test]
fn n5_to_n8_case_h2c_and_bytes_that_are_not_http() {
    let w = world(&[]);
    let multi = mesh("mp-multi");
    w.check(
        "N5",
        q(CLIENT, format!("{multi}:9090")).host(format!("{}:9090", multi.to_uppercase())),
        echo("mp-multi", 9090),
    );
    w.check(
        "N6",
        q(CLIENT, format!("{multi}:8080")).bytes(Bytes::H2c),
        echo("mp-multi", 8080),
    );
    w.check(
        "N7",
        q(CLIENT, format!("{multi}:8080")).bytes(Bytes::Tls(multi.clone())),
        Got::Pass,
    );
    w.check(
        "N8",
        q(CLIENT, format!("{multi}:8080")).bytes(Bytes::Raw),
        Got::Pass,
    );
}

#[test]
fn n11_an_invalid_backend_share_is_answered_500_and_reported() {
    for (variant, reason, names) in [
        (
            "n11-unsupported",
            "UnsupportedProtocol",
            "mp/mp-mixed port 9000",
        ),
        ("n11-notfound", "BackendNotFound", "mp/mp-multi port 7777"),
    ] {
        let w = world(&[variant]);
        let mut delivered = 0;
        let mut invalid = 0;
        for e in 0..200 {
            match got(&w.decide(&q(CLIENT, format!("{}:8080", mesh("mp-multi"))).entropy(e))) {
                g if g == echo("mp-multi", 9090) => delivered += 1,
                g if g == answer(500, "invalid-backend") => invalid += 1,
                other => panic!("N11 {variant}: unexpected {other:?}"),
            }
        }
        assert!(
            (85..=115).contains(&delivered),
            "{variant}: {delivered} of 200 delivered"
        );
        assert_eq!(delivered + invalid, 200);
        let status = w
            .model
            .route_statuses()
            .find(|s| s.name == "a4")
            .expect("the route has a status");
        let refs = status
            .conditions
            .iter()
            .find(|c| c.type_ == "ResolvedRefs")
            .unwrap();
        assert_eq!(
            (refs.status.as_str(), refs.reason.as_str()),
            ("False", reason)
        );
        assert!(refs.message.contains(names), "{}", refs.message);
        let judged = status
            .conditions
            .iter()
            .find(|c| c.type_ == "gateway.aether.io/PodPortsJudged")
            .unwrap();
        assert_eq!(
            (judged.status.as_str(), judged.reason.as_str()),
            ("False", "PodPortNotHTTP")
        );
    }
}

#[test]
fn n12_a_parent_ref_to_a_raw_tcp_port_attaches_nothing() {
    let w = world(&["n12"]);
    let st = w
        .model
        .route_statuses()
        .find(|s| s.parent.contains("mp/mp-mixed:9000"))
        .expect("the n12 route has a status");
    let accepted = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Accepted")
        .unwrap();
    assert_eq!(
        (accepted.status.as_str(), accepted.reason.as_str()),
        ("False", "NoMatchingParent")
    );
    w.check(
        "N12",
        q(CLIENT, format!("{}:8080", mesh("mp-mixed"))),
        echo("mp-mixed", 8080),
    );
    w.check(
        "N12",
        q(CLIENT, format!("{}:9000", mesh("mp-mixed"))).bytes(Bytes::Raw),
        raw_tcp("mp-mixed", 9000, 9000),
    );
}

#[test]
fn n13_n26_rules_attach_per_parent_port() {
    let w = world(&["a4"]);
    for name in [
        mesh("mp-multi"),
        "mp-multi.mp.svc.cluster.local".to_owned(),
        "mp-multi".to_owned(),
    ] {
        for p in [8080, 9090] {
            w.check(
                "N13 (i)",
                q(CLIENT, format!("{name}:{p}")),
                echo("mp-multi", 9090),
            );
            w.check(
                "N13 (i) loopback",
                q(NOCAPTURE, LOOPBACK).host(format!("{name}:{p}")),
                echo("mp-multi", 9090),
            );
        }
    }
    let w = world(&["n13-port"]);
    w.check(
        "N13 (ii)",
        q(CLIENT, format!("{}:9090", mesh("mp-multi"))),
        echo("mp-multi", 9090),
    );
    let d = w.decide(&q(CLIENT, format!("{}:8080", mesh("mp-multi"))));
    assert_eq!(got(&d), echo("mp-multi", 8080));
    let Some(RequestDecision::Deliver(del)) = &d.request else {
        panic!("delivers")
    };
    assert!(
        del.rule.is_none(),
        "8080 has no rule attached: default delivery"
    );

    let w = world(&["n26"]);
    let multi = mesh("mp-multi");
    w.check(
        "N26",
        q(CLIENT, format!("{multi}:9090")).path("/only/x"),
        echo("mp-multi", 9090),
    );
    w.check(
        "N26",
        q(CLIENT, format!("{multi}:9090")).path("/other"),
        answer(404, "route-not-matched"),
    );
    w.check(
        "N26",
        q(NOCAPTURE, LOOPBACK)
            .host(format!("{multi}:9090"))
            .path("/other"),
        answer(404, "route-not-matched"),
    );
    w.check(
        "N26",
        q(CLIENT, format!("{multi}:8080")).path("/other"),
        echo("mp-multi", 8080),
    );
    w.check(
        "N26",
        q(CLIENT, format!("{multi}:8080")).path("/only/x"),
        echo("mp-multi", 8080),
    );
}

#[test]
fn n14_n21_service_level_filters_run_on_deliveries_and_never_on_refusals() {
    let w = world(&["a4"]);
    let multi = mesh("mp-multi");
    let d = w.decide(&q(CLIENT, format!("{multi}:8080")));
    let Some(RequestDecision::Deliver(del)) = &d.request else {
        panic!("delivers")
    };
    assert!(
        aether::resolve::describe_service_filters(del)
            .iter()
            .any(|f| f.contains("x-svc")),
        "{:?}",
        del.service_filters
    );
    assert!(
        aether::resolve::describe_service_filters(del)
            .iter()
            .any(|f| f.contains("ext_authz")),
        "{:?}",
        del.service_filters
    );
    w.check(
        "N14",
        q(CLIENT, format!("{multi}:7777")),
        refused("port-not-declared", "8080/http 9090/http"),
    );

    let ip = w.pod_ip("mp", "mp-multi-0");
    for host in [
        format!("{}:8080", mesh("mp-eighty")),
        format!("{multi}:9090"),
        "mp-multi".to_owned(),
    ] {
        let d = w.decide(&q(CLIENT, format!("{ip}:8080")).host(host));
        let Some(RequestDecision::Deliver(del)) = &d.request else {
            panic!("N21 delivers")
        };
        assert!(
            del.rule.is_none(),
            "N21: no Service route applies on a pod-IP dial"
        );
        assert_eq!(
            pods(del.backend.endpoints.iter()),
            ["mp-multi-0".to_owned()].into_iter().collect()
        );
        assert_eq!(del.backend.pod_port, 8080);
        assert!(
            aether::resolve::describe_service_filters(del)
                .iter()
                .any(|f| f.contains("x-svc")),
            "N21: {:?}",
            del.service_filters
        );
    }
}

#[test]
fn n15_a_user_service_owning_a_mesh_name() {
    let w = world(&[]);
    let owned = mesh("mp-owned");
    let both = |pp| Got::Deliver {
        svc: "mp/mp-owned".into(),
        port: Some(80),
        pod_port: pp,
        pods: ["mp-owned-0".to_owned(), "mp-owned-1".to_owned()]
            .into_iter()
            .collect(),
    };
    w.check(
        "N15 (i)",
        q(CLIENT, "mp-owned.mp.svc.cluster.local:80"),
        Got::Pass,
    );
    w.check(
        "N15 (ii)",
        q(NOCAPTURE, LOOPBACK).host(format!("{owned}:80")),
        both(8080),
    );
    w.check(
        "N15 (iii)",
        q(NOCAPTURE, LOOPBACK).host(format!("{owned}:8080")),
        refused("port-not-declared", "80/http"),
    );
    w.check(
        "N15 (iv)",
        q(NOCAPTURE, LOOPBACK).host("mp-owned.mp.svc.cluster.local:80"),
        answer(404, "not-a-mesh-name"),
    );
    let w = world(&["n15-routed"]);
    w.check(
        "N15 routed (i)",
        q(CLIENT, "mp-owned.mp.svc.cluster.local:80"),
        both(8080),
    );
    w.check(
        "N15 routed (iv)",
        q(NOCAPTURE, LOOPBACK).host("mp-owned.mp.svc.cluster.local:80"),
        both(8080),
    );
}

#[test]
fn n16_n17_n27_unknown_names_absolute_form_and_trailing_dots() {
    let w = world(&[]);
    let d = w.decide(&q(NOCAPTURE, LOOPBACK).host(format!("nosuch.mp.{MESH}:8080")));
    assert!(
        matches!(d.request, Some(RequestDecision::Hold(..))),
        "N16 (i) holds first"
    );
    assert_eq!(got(&d), answer(404, "not-a-mesh-name"));
    let d = w.decide(&q(NOCAPTURE, LOOPBACK).host(format!("nosuch.mp.{MESH}:18081")));
    assert!(
        !matches!(d.request, Some(RequestDecision::Hold(..))),
        "N16 (ii) is never held"
    );
    assert_eq!(
        got(&d),
        Got::Answer {
            status: 421,
            reason: "port-not-declared",
            ports: None
        }
    );
    w.check(
        "N17",
        q(NOCAPTURE, LOOPBACK)
            .absolute(&format!("{}:9090", mesh("mp-multi")))
            .host(format!("{}:8080", mesh("mp-multi")))
            .path("/x"),
        echo("mp-multi", 9090),
    );
    for host in ["example.invalid:8080", "mp-multi.mp.:8080"] {
        let d = w.decide(&q(NOCAPTURE, LOOPBACK).host(host));
        assert!(
            !matches!(d.request, Some(RequestDecision::Hold(..))),
            "N27: {host} is not held"
        );
        assert_eq!(got(&d), answer(404, "not-a-mesh-name"), "N27 {host}");
    }
    for host in [
        format!("mp-multi.mp.{MESH}.:8080"),
        "mp-multi.mp.svc.cluster.local.:8080".to_owned(),
    ] {
        w.check(
            "N27 (iii)",
            q(NOCAPTURE, LOOPBACK).host(host),
            echo("mp-multi", 8080),
        );
    }
    w.check(
        "N27 (iv)",
        q(NOCAPTURE, LOOPBACK)
            .method("CONNECT")
            .host(format!("{}:8080", mesh("mp-multi"))),
        answer(404, "no-path"),
    );
}

#[test]
fn n22_n20_a_pods_ip_names_that_pod() {
    let w = world(&[]);
    let ip = w.pod_ip("mp", "mp-mixed-0");
    w.check(
        "N22 (i)",
        q(CLIENT, format!("{ip}:7070")).host(format!("{}:7070", mesh("mp-mixed"))),
        Got::Pass,
    );
    w.check(
        "N22 (ii)",
        q(CLIENT, format!("{}:7070", w.vip("mp", "mp-mixed")))
            .host(format!("{}:7070", mesh("mp-mixed"))),
        refused("port-not-declared", "8080/http 9000/tcp"),
    );
    let sf = w.pod_ip("mp", "mp-serverfirst-1");
    w.check(
        "N20 (i)",
        q(CLIENT, format!("{sf}:3306")).bytes(Bytes::Silent),
        Got::Tcp {
            svc: "mp/mp-serverfirst".into(),
            port: 3306,
            pod_port: 3306,
            pods: ["mp-serverfirst-1".to_owned()].into_iter().collect(),
        },
    );
    w.check(
        "N20 (ii)",
        q(CLIENT, format!("{ip}:9000")).bytes(Bytes::Raw),
        Got::Tcp {
            svc: "mp/mp-mixed".into(),
            port: 9000,
            pod_port: 9000,
            pods: ["mp-mixed-0".to_owned()].into_iter().collect(),
        },
    );
}

#[test]
fn n23_malformed_authorities_are_400_bad_authority_on_both_paths() {
    let w = world(&[]);
    let multi = format!("{}:8080", mesh("mp-multi"));
    let paths = [q(CLIENT, multi.clone()), q(NOCAPTURE, LOOPBACK)];
    for base in paths {
        w.check(
            "N23 (i)",
            base.clone().no_host(),
            answer(400, "bad-authority"),
        );
        w.check(
            "N23 (ii)",
            base.clone().host(multi.clone()).host(multi.clone()),
            answer(400, "bad-authority"),
        );
        w.check(
            "N23 (iii)",
            base.clone()
                .bytes(Bytes::H2c)
                .host(multi.clone())
                .host(format!("{}:8080", mesh("mp-eighty"))),
            answer(400, "bad-authority"),
        );
        w.check(
            "N23 (iv)",
            base.clone().host(format!("user@{multi}")),
            answer(400, "bad-authority"),
        );
    }
    w.check(
        "N23 (v)",
        q(NOCAPTURE, LOOPBACK).bytes(Bytes::Raw),
        answer(400, "not-http"),
    );
    w.check(
        "N23 (vi)",
        q(CLIENT, multi).bytes(Bytes::Http10).no_host(),
        Got::Pass,
    );
}

#[test]
fn n28_names_outside_the_mesh_take_the_floor() {
    let w = world(&[]);
    let ext = "ext-http.mp-ext.svc.cluster.local";
    for host in [
        format!("{ext}:18081"),
        ext.to_owned(),
        format!("{ext}:18082"),
    ] {
        w.check(
            "N28 (i)",
            q(CLIENT, format!("{ext}:18081")).host(host),
            Got::Pass,
        );
    }
    w.check(
        "N28 (ii)",
        q(NOCAPTURE, format!("{ext}:18081")).host(format!("{ext}:18081")),
        answer(404, "not-a-mesh-name"),
    );
    w.check(
        "N28 (iii)",
        q(NOCAPTURE, LOOPBACK).host(format!("{ext}:18081")),
        answer(404, "not-a-mesh-name"),
    );
}

#[test]
fn m7_x5_generated_services_carry_the_real_ports_and_the_two_anchors() {
    let w = world(&[]);
    let ports = |svc: &str| -> Vec<(String, u16, Option<String>)> {
        w.snapshot
            .services
            .iter()
            .find(|s| s.namespace == "mp" && s.name == svc)
            .unwrap()
            .ports
            .iter()
            .map(|p| (p.name.clone().unwrap(), p.port, p.app_protocol.clone()))
            .collect()
    };
    let anchors = [
        ("mesh".to_owned(), 18081, None),
        ("mesh-tcp".to_owned(), 18082, None),
    ];
    let mut want = vec![
        ("p8080-tcp".to_owned(), 8080, Some("http".to_owned())),
        ("p9000-tcp".to_owned(), 9000, Some("tcp".to_owned())),
    ];
    want.extend(anchors.iter().cloned());
    assert_eq!(ports("mp-tcpfirst"), want, "X5");
    let mut want = vec![
        ("p80-tcp".to_owned(), 80, Some("http".to_owned())),
        ("p8080-tcp".to_owned(), 8080, Some("http".to_owned())),
        ("p9090-tcp".to_owned(), 9090, Some("http".to_owned())),
    ];
    want.extend(anchors.iter().cloned());
    assert_eq!(ports("mp-eighty"), want, "M7");
    assert!(
        w.snapshot
            .services
            .iter()
            .all(|s| s.name != "mp-owned" || !s.generated),
        "a user Service of the name is never replaced"
    );
}

#[test]
fn n19_udp_reaches_its_udproute_backend_on_18082_only() {
    let w = world(&[]);
    let vip = w.vip("mp", "mp-udp");
    w.check(
        "N19 (i)",
        q(CLIENT, format!("{vip}:18082")).bytes(Bytes::Udp),
        Got::Udp {
            svc: "mp/mp-udp".into(),
            pod_port: 5353,
            pods: ["mp-udp-0".to_owned(), "mp-udp-1".to_owned()]
                .into_iter()
                .collect(),
        },
    );
    w.check(
        "N19 (ii)",
        q(CLIENT, format!("{vip}:5353")).bytes(Bytes::Udp),
        Got::Pass,
    );
    w.check(
        "row 30",
        q(CLIENT, format!("{}:18082", w.vip("mp", "mp-multi"))).bytes(Bytes::Udp),
        Got::Dropped,
    );
    let status = w
        .model
        .route_statuses()
        .find(|s| s.kind == "UDPRoute")
        .unwrap();
    assert!(
        status.conditions.iter().all(|c| c.status == "True"),
        "{:?}",
        status.conditions
    );
}

#[test]
fn consumer_a_route_in_the_callers_namespace_applies_to_its_callers_only() {
    // routes.md §2.3 and §3: a consumer route in mp-other, parented to mp/mp-multi, with its
    // backend in mp and no ReferenceGrant. Callers in mp-other get its rule on every name and
    // path; callers in mp get the producer routes (none: the default delivery).
    let w = world(&["consumer"]);
    let status = w
        .model
        .route_statuses()
        .find(|s| s.namespace == "mp-other" && s.name == "consumer")
        .expect("the consumer route has a status");
    let cond = |t: &str| {
        let c = status.conditions.iter().find(|c| c.type_ == t).unwrap();
        (c.status.clone(), c.reason.clone())
    };
    assert_eq!(cond("Accepted"), ("True".into(), "Accepted".into()));
    assert_eq!(cond("ResolvedRefs"), ("True".into(), "ResolvedRefs".into()));
    for name in [mesh("mp-multi"), "mp-multi.mp.svc.cluster.local".to_owned()] {
        for p in [8080, 9090] {
            let host = format!("{name}:{p}");
            w.check(
                "CONSUMER captured",
                q(OTHER, host.clone()),
                echo("mp-multi", 9090),
            );
            w.check(
                "CONSUMER loopback",
                q(OTHER, LOOPBACK).host(host.clone()),
                echo("mp-multi", 9090),
            );
            w.check(
                "CONSUMER, caller in mp",
                q(CLIENT, host),
                echo("mp-multi", p),
            );
        }
    }
}

#[test]
fn grpc_a_grpcroute_matches_by_method_on_its_parent_port_only() {
    // routes.md §1: a GRPCRoute attaches and matches as an HTTPRoute (its method is the path).
    let w = world(&["grpc"]);
    let m = format!("{}:50051", mesh("mp-grpc"));
    let to = |port: u16| Got::Deliver {
        svc: "mp/mp-grpc".into(),
        port: Some(port),
        pod_port: port,
        pods: ["mp-grpc-0", "mp-grpc-1"].map(str::to_owned).into(),
    };
    for from in [q(CLIENT, m.clone()), q(NOCAPTURE, LOOPBACK).host(m)] {
        let other = from
            .clone()
            .method("POST")
            .path("/aether.echo.v1.Echo/Other");
        w.check("GRPC-ROUTE by method", other, to(50052));
        let missing = from
            .clone()
            .method("POST")
            .path("/aether.echo.v1.Echo/Missing");
        w.check(
            "GRPC-ROUTE no rule",
            missing,
            Got::Answer {
                status: 404,
                reason: "route-not-matched",
                ports: None,
            },
        );
    }
    // Port 50052 has no rule attached: the default delivery, whatever the method.
    let plain = q(CLIENT, format!("{}:50052", mesh("mp-grpc")))
        .method("POST")
        .path("/aether.echo.v1.Echo/Missing");
    w.check("GRPC-ROUTE other port", plain, to(50052));
}

/// The variant whose MeshFilter the daemon cannot read, on purpose (legs POLICY and K-POLICY).
const UNREADABLE_VARIANT: &str = "policy-unreadable";

#[test]
fn every_variant_loads_without_a_problem() {
    // An overlay the daemons skip a document of would leave a leg testing the base registry.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/variants");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let e = e.unwrap();
        if e.path().is_dir() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == UNREADABLE_VARIANT {
                // Its one document is refused on purpose, and kept as a filter that refuses.
                let load = aether::registry::file::load_dir(&e.path()).unwrap();
                assert_eq!(load.problems.len(), 1, "{:?}", load.problems);
                assert!(matches!(
                    &load.snapshot.mesh_filters[..],
                    [f] if matches!(f.config, aether::model::snapshot::FilterConfig::Unreadable(_))
                ));
                n += 1;
                continue;
            }
            let s = load(&format!("config/examples/variants/{name}"));
            let objects = s.http_routes.len()
                + s.tcp_routes.len()
                + s.tls_routes.len()
                + s.udp_routes.len()
                + s.mesh_filters.len()
                + s.rows.len();
            assert!(
                objects > 0,
                "variant {name} holds nothing the registry reads"
            );
            n += 1;
        }
    }
    assert!(n >= 15, "{n} variants");
}
