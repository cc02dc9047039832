//! `aether explain`: answer one connection or request exactly as the daemon would, from a
//! loaded registry, and say what decided it.
//!
//! Everything here is a pure function of the snapshot, the compiled model and the question;
//! reading the registry and printing happen in `main.rs`. The daemon's debug endpoint will call
//! [`explain`] too, so the offline and the live answers cannot drift apart.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::model::names::{AuthorityInput, Family, HttpVersion, NameForm, read_name};
use crate::model::port::{LEGACY_PORT, PROXY_PORT};
use crate::model::{Model, Snapshot};
use crate::resolve::answer::{MeshAnswer, Reason};
use crate::resolve::decision::{
    AfterSniff, Caller, CaptureMode, ConnDecision, Endpoint, HttpEntry, RequestDecision,
    RequestFacts, Sniffed, TcpBackend, TcpChoice, UdpDecision, Why,
};
use crate::resolve::{classify_connection, resolve_request, resolve_sniffed, resolve_udp};

/// What the client sends first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bytes {
    /// An HTTP/1.1 request.
    Http,
    /// An HTTP/1.0 request.
    Http10,
    /// An HTTP/2 prior-knowledge (h2c) request.
    H2c,
    /// A TLS ClientHello with this SNI (empty: none).
    Tls(String),
    /// Bytes that are not HTTP.
    Raw,
    /// Nothing: the client waits for the server.
    Silent,
    /// One UDP datagram.
    Udp,
}

impl std::str::FromStr for Bytes {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "http" => Ok(Self::Http),
            "http1.0" => Ok(Self::Http10),
            "h2c" => Ok(Self::H2c),
            "raw" => Ok(Self::Raw),
            "udp" => Ok(Self::Udp),
            "none" | "silent" => Ok(Self::Silent),
            _ => match s.strip_prefix("tls:") {
                Some(sni) => Ok(Self::Tls(sni.to_owned())),
                None if s == "tls" => Ok(Self::Tls(String::new())),
                None => Err(format!(
                    "--bytes {s:?}: expected http, http1.0, h2c, tls:<sni>, raw, none or udp"
                )),
            },
        }
    }
}

/// One question for [`explain`].
#[derive(Clone, Debug)]
pub struct Question {
    /// The caller pod, `<namespace>/<name>`.
    pub from: String,
    /// What the client dials: `<name-or-ip>:<port>`; `127.0.0.1:18081` is the loopback listener.
    pub dial: String,
    /// `Host` fields to send; `None` sends the dial's authority (port omitted for 80).
    pub hosts: Option<Vec<String>>,
    /// Send the request line in absolute form with this authority (an `http_proxy` client).
    pub absolute: Option<String>,
    /// The method.
    pub method: String,
    /// The path and query.
    pub path: String,
    /// Extra request headers.
    pub headers: Vec<(String, String)>,
    /// What the client sends first.
    pub bytes: Bytes,
    /// Entropy for the weighted choice of a backend (the daemon draws one per request).
    pub entropy: u64,
}

/// Why a question cannot be asked.
#[derive(Debug, thiserror::Error)]
pub enum InvalidQuestion {
    /// `--from` does not name a pod of the registry.
    #[error("--from {0:?}: no such pod in the registry (expected <namespace>/<pod>)")]
    UnknownPod(String),
    /// `--dial` is not `<name-or-ip>:<port>`.
    #[error("--dial {0:?}: expected <name-or-ip>:<port> with a port in 1-65535")]
    BadDial(String),
    /// The dialled name has no DNS answer.
    #[error(
        "--dial {0:?}: the name resolves to no address (mesh DNS and the cluster's Service names were tried)"
    )]
    NoAddress(String),
    /// The pod is not managed, so nothing of its traffic is the mesh's.
    #[error("--from {0:?}: the pod is not managed by the mesh; its traffic is never captured")]
    Unmanaged(String),
}

/// The whole answer, for the table and for `-o json` (read back by `aether debug explain`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Explanation {
    /// The caller.
    pub from: String,
    /// The caller's capture mode.
    pub capture: Cow<'static, str>,
    /// What was dialled, after DNS.
    pub dialled: String,
    /// How DNS answered, when a name was dialled.
    pub dns: Option<String>,
    /// The entry path (captured dial, pod-IP dial, loopback, proxy port).
    pub path: String,
    /// The connection-level decision.
    pub connection: Step,
    /// The request-level decision, when the connection carries HTTP.
    pub request: Option<Step>,
    /// The answer after the discovery hold, when the first answer was a hold.
    pub after_hold: Option<Step>,
}

/// One decision, in words and in data.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Step {
    /// `deliver`, `refuse`, `answer`, `passthrough`, `tcp`, `close`, `hold`, `redirect`, `http`.
    pub outcome: Cow<'static, str>,
    /// The HTTP status, when the mesh answers or redirects.
    pub status: Option<u16>,
    /// The `x-aether-error` reason.
    pub reason: Option<Cow<'static, str>>,
    /// The answer's body (mesh answers).
    pub body: Option<String>,
    /// Where the traffic goes.
    pub target: Vec<String>,
    /// Filters that run.
    pub filters: Vec<String>,
    /// The declaration that was read: the addressed service's ports and classes.
    pub declared: Option<String>,
    /// The rule of the spec that decided it.
    pub rule: String,
    /// The facts behind it.
    pub detail: String,
    /// A delivery's pod port (the application's own port).
    #[serde(default)]
    pub pod_port: Option<u16>,
    /// A delivery's pods, any of which may answer.
    #[serde(default)]
    pub pods: Vec<String>,
}

/// Resolves `dial` the way a pod's resolver would: IP literals as they are; mesh names through
/// mesh DNS (the generated Service's ClusterIP); Kubernetes and short names through the
/// cluster's DNS (any Service's ClusterIP), short names in the caller's namespace.
fn resolve_dial(
    snapshot: &Snapshot,
    model: &Model,
    caller_ns: &str,
    name: &str,
) -> Option<(IpAddr, String)> {
    if let Ok(ip) = name
        .trim_matches(|c| c == '[' || c == ']')
        .parse::<IpAddr>()
    {
        return Some((ip, format!("{name} is an address")));
    }
    if name.eq_ignore_ascii_case("localhost") {
        return Some((IpAddr::V4(Ipv4Addr::LOCALHOST), "localhost".into()));
    }
    let form = read_name(name, &model.context.domains);
    let (family, ns, svc) = match &form {
        NameForm::Named {
            family,
            service,
            namespace,
        } => (*family, namespace.to_string(), service.to_string()),
        NameForm::Short(s) => (Family::Short, caller_ns.to_owned(), s.to_string()),
        NameForm::Foreign => return None,
    };
    let service = snapshot
        .services
        .iter()
        .find(|s| s.namespace == ns && s.name == svc && !s.headless)?;
    if family == Family::Mesh && !service.generated {
        // A mesh service whose name a user Service owns has no mesh-DNS record (model.md §11).
        return None;
    }
    let ip = *service.cluster_ips.first()?;
    let via = if family == Family::Mesh {
        "mesh DNS"
    } else {
        "cluster DNS"
    };
    Some((ip, format!("{name} -> {ip} ({via}: Service {ns}/{svc})")))
}

/// The pods a decision may reach, `<pod> <address>` each.
fn endpoint_list(eps: &[Endpoint]) -> String {
    eps.iter()
        .map(|e| match &e.pod {
            Some(p) => format!("{p} {}", e.address),
            None => e.address.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn choice_targets(c: &TcpChoice) -> Vec<String> {
    c.backends
        .iter()
        .map(|(w, b)| match b {
            TcpBackend::Target(t) => format!(
                "weight {w}: {} port {} -> pod port {} [{}]",
                t.service,
                t.port,
                t.pod_port,
                endpoint_list(&t.endpoints)
            ),
            TcpBackend::Invalid(why) => format!(
                "weight {w}: invalid backend ({}), connection closed",
                why.detail
            ),
        })
        .collect()
}

fn step(outcome: &'static str, rule: &str, detail: &str) -> Step {
    Step {
        outcome: Cow::Borrowed(outcome),
        status: None,
        reason: None,
        body: None,
        target: Vec::new(),
        filters: Vec::new(),
        declared: None,
        rule: rule.to_owned(),
        detail: detail.to_owned(),
        pod_port: None,
        pods: Vec::new(),
    }
}

fn answer_step(a: &MeshAnswer, rule: &str, detail: &str) -> Step {
    let status = a.reason.status();
    Step {
        status: Some(status),
        reason: Some(Cow::Borrowed(a.reason.code())),
        body: Some(a.body()),
        ..step(
            if status == 421 { "refuse" } else { "answer" },
            rule,
            detail,
        )
    }
}

/// Where a passthrough of a dial to `dialled` goes (model.md §12.5 item 1): the endpoints
/// behind it when one is a mesh pod, each over the mesh hop or directly; empty for the dialled
/// address itself.
fn passthrough_targets(model: &Model, dialled: SocketAddr) -> Vec<String> {
    model
        .passthrough_over_hop(dialled)
        .map(|eps| {
            eps.iter()
                .map(|e| match &e.mesh {
                    Some(svc) => format!(
                        "{}:{} ({svc}) over the mesh hop as bytes (model.md §12.5 item 1)",
                        e.address, e.port
                    ),
                    None => format!("{}:{} directly (not a mesh pod)", e.address, e.port),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The connection-level authorization a byte stream meets at its destination (model.md §12.5
/// item 2), for each pod at `ips`: what every `rbac` and `ext_authz` of the Services that guard
/// the pod does with this caller, through the daemon's own verdict
/// ([`Model::connection_verdict`]). Empty where no authorization applies.
fn connection_checks(
    model: &Model,
    caller: &Caller,
    ips: impl IntoIterator<Item = IpAddr>,
) -> Vec<String> {
    let ns = caller.namespace.as_deref().unwrap_or_default();
    let sa = caller.service_account.as_deref().unwrap_or_default();
    // Verdict text -> the pods it holds for, in the order first met.
    let mut verdicts: Vec<(String, Vec<IpAddr>)> = Vec::new();
    for ip in ips {
        let guards: Vec<String> = model
            .guarded_by(ip)
            .iter()
            .filter(|k| {
                model.filters_of(k).iter().any(|f| {
                    matches!(
                        f.config,
                        crate::model::snapshot::FilterConfig::Rbac(_)
                            | crate::model::snapshot::FilterConfig::ExtAuthz(_)
                            | crate::model::snapshot::FilterConfig::Unreadable(_)
                    )
                })
            })
            .map(ToString::to_string)
            .collect();
        if guards.is_empty() {
            continue;
        }
        let text = match model.connection_verdict(ip, ns, sa) {
            Ok(()) => format!(
                "the service-level rbac of {} lets {ns}/{sa} through",
                guards.join(", ")
            ),
            Err(denied) => format!(
                "{denied}; closed before a byte reaches the application (model.md §12.5 item 2)"
            ),
        };
        match verdicts.iter_mut().find(|(t, _)| *t == text) {
            Some((_, at)) if !at.contains(&ip) => at.push(ip),
            Some(_) => {}
            None => verdicts.push((text, vec![ip])),
        }
    }
    verdicts
        .into_iter()
        .map(|(text, at)| {
            let at: Vec<String> = at.iter().map(ToString::to_string).collect();
            format!("per connection at {}: {text}", at.join(", "))
        })
        .collect()
}

fn request_step(model: &Model, d: &RequestDecision, dialled: SocketAddr) -> Step {
    match d {
        RequestDecision::Answer(a, why) => answer_step(a, why.rule, &why.detail),
        RequestDecision::Passthrough(why) => Step {
            target: passthrough_targets(model, dialled),
            ..step("passthrough", why.rule, &why.detail)
        },
        RequestDecision::Hold(what, why) => step(
            "hold",
            why.rule,
            &format!("{}; waits up to 2 s for {what:?}", why.detail),
        ),
        RequestDecision::Redirect {
            status,
            location,
            why,
        } => Step {
            status: Some(*status),
            target: vec![format!("Location: {location}")],
            ..step("redirect", why.rule, &why.detail)
        },
        RequestDecision::Deliver(d) => Step {
            declared: d
                .addressed
                .as_ref()
                .and_then(|k| model.declared(&k.namespace, &k.name))
                .map(|l| format!("{} declares: {}", l.name, l.ports)),
            target: vec![format!(
                "{} port {} -> pod port {}{} [{}]",
                d.backend.service,
                d.backend
                    .port
                    .map_or_else(|| "-".to_owned(), |p| p.to_string()),
                d.backend.pod_port,
                if d.backend.h2c { " (h2c)" } else { "" },
                endpoint_list(&d.backend.endpoints)
            )],
            filters: crate::resolve::describe_route_filters(d)
                .into_iter()
                .chain(crate::resolve::describe_service_filters(d))
                .collect(),
            pod_port: Some(d.backend.pod_port),
            pods: d
                .backend
                .endpoints
                .iter()
                .filter_map(|e| e.pod.as_deref().map(str::to_owned))
                .collect(),
            ..step("deliver", d.why.rule, &d.why.detail)
        },
    }
}

/// How the connection was decided, before any request.
#[derive(Clone, Debug)]
pub enum ConnOutcome {
    /// The mesh does not see the connection (a loopback port other than 18081, or a port that
    /// scoped capture does not take).
    NotCaptured(Why),
    /// The loopback listener read bytes that are not HTTP: `400 not-http`, then closed.
    LoopbackNotHttp,
    /// Raw TCP.
    Tcp(TcpChoice, Why),
    /// Passthrough to the dialled address.
    Passthrough(Why),
    /// Closed.
    Close(Why),
    /// HTTP on this entry: each request is answered on its own.
    Http(HttpEntry, Why),
    /// A UDP datagram.
    Udp(UdpDecision),
}

/// What the resolvers decided for a question.
#[derive(Clone, Debug)]
pub struct Decided {
    /// The caller, as the connection gives it.
    pub caller: Caller,
    /// The address dialled, after DNS.
    pub dialled: SocketAddr,
    /// How DNS answered, when a name was dialled.
    pub dns: Option<String>,
    /// The connection's fate.
    pub connection: ConnOutcome,
    /// The request's answer, when the connection carries HTTP.
    pub request: Option<RequestDecision>,
    /// The answer once the discovery hold has run out, when the first answer was a hold.
    pub after_hold: Option<RequestDecision>,
}

/// Runs the resolvers for a question: the same functions the daemon calls.
pub fn decide(
    snapshot: &Snapshot,
    model: &Model,
    q: &Question,
) -> Result<Decided, InvalidQuestion> {
    let (ns, caller) = caller_of(model, &q.from)?;
    let (name, port) = q
        .dial
        .rsplit_once(':')
        .and_then(|(n, p)| Some((n, p.parse::<u16>().ok().filter(|p| *p > 0)?)))
        .ok_or_else(|| InvalidQuestion::BadDial(q.dial.clone()))?;
    let (ip, dns) = resolve_dial(snapshot, model, ns, name)
        .ok_or_else(|| InvalidQuestion::NoAddress(q.dial.clone()))?;
    let dialled = SocketAddr::new(ip, port);
    let connection = decide_connection(model, &caller, dialled, &q.bytes);
    let (request, after_hold) = match &connection {
        ConnOutcome::Http(entry, _) => {
            let (first, after_hold) = decide_request(model, &caller, q, (name, port), *entry);
            (Some(first), after_hold)
        }
        _ => (None, None),
    };
    Ok(Decided {
        caller,
        dialled,
        dns: (name
            .trim_matches(|c| c == '[' || c == ']')
            .parse::<IpAddr>()
            .is_err())
        .then_some(dns),
        connection,
        request,
        after_hold,
    })
}

/// The caller pod `from` (`<namespace>/<name>`) as a connection gives it, with its namespace
/// as written; refused when the registry does not hold it or the mesh does not manage it.
fn caller_of<'q>(model: &Model, from: &'q str) -> Result<(&'q str, Caller), InvalidQuestion> {
    let (ns, pod_name) = from
        .split_once('/')
        .ok_or_else(|| InvalidQuestion::UnknownPod(from.to_owned()))?;
    let pod = model
        .pod(ns, pod_name)
        .ok_or_else(|| InvalidQuestion::UnknownPod(from.to_owned()))?;
    if !pod.managed {
        return Err(InvalidQuestion::Unmanaged(from.to_owned()));
    }
    let caller = Caller {
        namespace: Some(pod.namespace.clone()),
        pod: Some(pod.name.clone()),
        service_account: Some(pod.service_account.clone()),
        capture: pod.capture,
    };
    Ok((ns, caller))
}

/// How `caller`'s connection to `dialled` is decided when the client sends `bytes` first,
/// before any request: [`ConnOutcome::Http`] when each request is answered on its own.
fn decide_connection(
    model: &Model,
    caller: &Caller,
    dialled: SocketAddr,
    bytes: &Bytes,
) -> ConnOutcome {
    let sniffed = match bytes {
        Bytes::Http | Bytes::Http10 | Bytes::H2c => Sniffed::Http,
        Bytes::Tls(sni) => Sniffed::Tls((!sni.is_empty()).then(|| sni.clone())),
        Bytes::Raw => Sniffed::Other,
        Bytes::Silent | Bytes::Udp => Sniffed::Timeout,
    };
    if *bytes == Bytes::Udp {
        return ConnOutcome::Udp(resolve_udp(model, dialled));
    }
    let entry = if dialled.ip().is_loopback() {
        if dialled.port() != PROXY_PORT {
            return ConnOutcome::NotCaptured(Why::new(
                "spec/model.md §12.1",
                "loopback destinations are never captured; the mesh plays no part",
            ));
        }
        if sniffed != Sniffed::Http {
            return ConnOutcome::LoopbackNotHttp;
        }
        HttpEntry::Loopback
    } else {
        match captured_entry(model, caller, dialled, &sniffed) {
            Ok(entry) => entry,
            Err(decided) => return decided,
        }
    };
    ConnOutcome::Http(
        entry,
        Why::new(
            "addressing.md §2",
            "HTTP: each request is answered on its own",
        ),
    )
}

/// The HTTP entry of a connection to a non-loopback `dialled` whose first bytes are `sniffed`;
/// otherwise how the connection is decided (not captured, raw TCP, passthrough, closed).
fn captured_entry(
    model: &Model,
    caller: &Caller,
    dialled: SocketAddr,
    sniffed: &Sniffed,
) -> Result<HttpEntry, ConnOutcome> {
    let port = dialled.port();
    if caller.capture == CaptureMode::Scoped && port != PROXY_PORT && port != LEGACY_PORT {
        return Err(ConnOutcome::NotCaptured(Why::new(
            "spec/model.md §12.2",
            "scoped capture takes only 18081 and 18082: not captured",
        )));
    }
    match classify_connection(model, caller, dialled) {
        ConnDecision::Tcp(c) => {
            // The choice carries the reason its destination was chosen for.
            let why = match c.backends.first() {
                Some((_, TcpBackend::Target(t))) => Why::new(
                    t.why.rule,
                    format!(
                        "{}; decided at accept: no byte is read, nothing is waited for",
                        t.why.detail
                    ),
                ),
                _ => Why::new(
                    "addressing.md §3",
                    "raw TCP at accept: no byte is read, nothing is waited for",
                ),
            };
            Err(ConnOutcome::Tcp(c, why))
        }
        ConnDecision::Passthrough(why) => Err(ConnOutcome::Passthrough(why)),
        ConnDecision::Close(why) => Err(ConnOutcome::Close(why)),
        ConnDecision::Sniff(plan) => match resolve_sniffed(&plan, sniffed) {
            AfterSniff::Http(entry) => Ok(entry),
            AfterSniff::Tcp(c) => Err(ConnOutcome::Tcp(c, plan.why)),
            AfterSniff::Passthrough => {
                let why = Why::new(
                    plan.why.rule,
                    format!("{}; the first bytes are {sniffed:?}", plan.why.detail),
                );
                Err(ConnOutcome::Passthrough(why))
            }
            AfterSniff::Close => Err(ConnOutcome::Close(plan.why)),
        },
    }
}

/// The answer to `q`'s request on `entry`, sent to the dialled `(name, port)`, and the answer
/// once the discovery hold has run out when the first is a hold.
fn decide_request(
    model: &Model,
    caller: &Caller,
    q: &Question,
    (name, port): (&str, u16),
    entry: HttpEntry,
) -> (RequestDecision, Option<RequestDecision>) {
    let default_host = if port == 80 {
        name.to_owned()
    } else {
        format!("{name}:{port}")
    };
    let hosts: Vec<String> = q.hosts.clone().unwrap_or_else(|| vec![default_host]);
    let host_refs: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let (version, h2_authority, host_fields): (HttpVersion, Option<&str>, &[&str]) = match q.bytes {
        Bytes::H2c => (
            HttpVersion::H2,
            host_refs.first().copied(),
            host_refs.get(1..).unwrap_or(&[]),
        ),
        Bytes::Http10 => (HttpVersion::Http10, None, &host_refs),
        _ => (HttpVersion::Http11, None, &host_refs),
    };
    let method = q.method.to_ascii_uppercase();
    // The header map a request with these headers arrives with: names lower case; a field that
    // no request can carry (an invalid name or value) is not in it.
    let mut headers = http::HeaderMap::new();
    for (name, value) in &q.headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(value),
        ) {
            headers.append(name, value);
        }
    }
    let facts = |hold_expired| RequestFacts {
        entry,
        authority: AuthorityInput {
            version,
            absolute: q.absolute.as_deref(),
            h2_authority,
            hosts: host_fields,
        },
        method: &method,
        path_and_query: (method != "CONNECT").then_some(q.path.as_str()),
        headers: &headers,
        hold_expired,
        entropy: q.entropy,
        explain: true,
    };
    let first = resolve_request(model, caller, &facts(false));
    let after_hold = matches!(first, RequestDecision::Hold(..))
        .then(|| resolve_request(model, caller, &facts(true)));
    (first, after_hold)
}

/// Answers a question (see the module doc).
pub fn explain(
    snapshot: &Snapshot,
    model: &Model,
    q: &Question,
) -> Result<Explanation, InvalidQuestion> {
    let d = decide(snapshot, model, q)?;
    let capture = match d.caller.capture {
        CaptureMode::RedirectAll => "redirect-all",
        CaptureMode::Scoped => "scoped",
    };
    let path = match &d.connection {
        ConnOutcome::Http(HttpEntry::Loopback, _) | ConnOutcome::LoopbackNotHttp => {
            "loopback listener (the proxy port)".to_owned()
        }
        ConnOutcome::Http(HttpEntry::PodIp { .. }, _) => format!("pod-IP dial to {}", d.dialled),
        ConnOutcome::Http(HttpEntry::ProxyCaptured { .. }, _) => {
            format!("captured dial to {}: the proxy port", d.dialled)
        }
        ConnOutcome::NotCaptured(_) => format!("dial to {}, not captured", d.dialled),
        _ => format!("captured dial to {}", d.dialled),
    };
    let http_bytes = matches!(q.bytes, Bytes::Http | Bytes::Http10 | Bytes::H2c);
    let connection = match &d.connection {
        ConnOutcome::NotCaptured(why) => step("passthrough", why.rule, &why.detail),
        ConnOutcome::Passthrough(why) => Step {
            target: passthrough_targets(model, d.dialled),
            filters: connection_checks(
                model,
                &d.caller,
                model
                    .passthrough_over_hop(d.dialled)
                    .iter()
                    .flat_map(|eps| eps.iter())
                    // An HTTP port serves HTTP bytes as HTTP, its filters per request; any
                    // other byte stream meets the connection-level verdict.
                    .filter(|e| {
                        let tcp_port = e
                            .mesh
                            .as_ref()
                            .and_then(|m| model.hop_ports(e.address, &m.namespace, &m.name))
                            .and_then(|declared| declared.get(&e.port).copied())
                            == Some(crate::model::port::PortProtocol::Tcp);
                        e.mesh.is_some() && (tcp_port || !http_bytes)
                    })
                    .map(|e| e.address),
            ),
            ..step("passthrough", why.rule, &why.detail)
        },
        ConnOutcome::LoopbackNotHttp => answer_step(
            &MeshAnswer::bare(Reason::NotHttp),
            "addressing.md §6.2",
            "the loopback listener read bytes that are not HTTP; then closed",
        ),
        ConnOutcome::Tcp(c, why) => Step {
            target: choice_targets(c),
            filters: connection_checks(
                model,
                &d.caller,
                c.backends.iter().flat_map(|(_, b)| match b {
                    TcpBackend::Target(t) => t.endpoints.iter().map(|e| e.address).collect(),
                    TcpBackend::Invalid(_) => Vec::new(),
                }),
            ),
            ..step("tcp", why.rule, &why.detail)
        },
        ConnOutcome::Close(why) => step("close", why.rule, &why.detail),
        ConnOutcome::Http(_, why) => step("http", why.rule, &why.detail),
        ConnOutcome::Udp(UdpDecision::Forward(t)) => Step {
            target: vec![format!(
                "{} port {} -> pod port {} [{}] (plaintext; replies from {}:18082)",
                t.service,
                t.port,
                t.pod_port,
                t.endpoints
                    .iter()
                    .map(|e| e.address.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                d.dialled.ip()
            )],
            ..step("udp", t.why.rule, &t.why.detail)
        },
        ConnOutcome::Udp(UdpDecision::Drop(why)) => step("drop", why.rule, &why.detail),
        ConnOutcome::Udp(UdpDecision::NotCaptured(why)) => {
            step("passthrough", why.rule, &why.detail)
        }
    };
    Ok(Explanation {
        from: q.from.clone(),
        capture: Cow::Borrowed(capture),
        dialled: d.dialled.to_string(),
        dns: d.dns.clone(),
        path,
        connection,
        request: d
            .request
            .as_ref()
            .map(|r| request_step(model, r, d.dialled)),
        after_hold: d
            .after_hold
            .as_ref()
            .map(|r| request_step(model, r, d.dialled)),
    })
}

/// Renders an explanation as an aligned table.
pub fn render_table(e: &Explanation) -> String {
    let mut s = String::new();
    let mut line = |k: &str, v: &str| {
        for (i, part) in v.lines().enumerate() {
            s.push_str(&format!("{:<12}{}\n", if i == 0 { k } else { "" }, part));
        }
    };
    line("from", &format!("{} ({})", e.from, e.capture));
    if let Some(d) = &e.dns {
        line("dns", d);
    }
    line("path", &e.path);
    let show = |title: &str, st: &Step, line: &mut dyn FnMut(&str, &str)| {
        let mut head = st.outcome.to_string();
        if let Some(status) = st.status {
            head.push_str(&format!(" {status}"));
        }
        if let Some(r) = &st.reason {
            head.push_str(&format!("  x-aether-error: {r}"));
        }
        line(title, &head);
        if let Some(b) = &st.body {
            line("  body", b.trim_end());
        }
        for t in &st.target {
            line("  to", t);
        }
        for f in &st.filters {
            line("  filter", f);
        }
        if let Some(d) = &st.declared {
            line("  declared", d);
        }
        if !st.rule.is_empty() {
            line("  because", &format!("{}: {}", st.rule, st.detail));
        }
    };
    show("connection", &e.connection, &mut line);
    if let Some(r) = &e.request {
        show("request", r, &mut line);
    }
    if let Some(r) = &e.after_hold {
        show("after hold", r, &mut line);
    }
    s
}
