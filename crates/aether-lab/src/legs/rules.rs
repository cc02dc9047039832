//! Legs for rules of the spec that spec/legs.md does not number (issue #7): consumer routes
//! without a ReferenceGrant (routes.md §2.3, §3), authorization denials on every HTTP path
//! (routes.md §5.2, §5.5; addressing.md §11.1), weights per request over kept connections,
//! and gRPC through the mesh (GRPCRoute, routes.md §1); and HTTP/2 with no route to an
//! endpoint on the caller's own node (issue #35, item 6).
//!
//! Every denial leg fails when its filter is skipped: a skipped filter delivers, and the echo's
//! `200` is never a denial.

use super::{
    Check, Env, Leg, addr, answer, authz_count, echo, get, get_host, headers, http, loopback, name,
    probe, with_headers,
};
use crate::workload::echo::{AUTHZ_DELAY_HEADER, AUTHZ_DENY_HEADER};
use crate::workload::grpc::EchoReply;
use crate::workload::probe::{
    GrpcRequest, HttpRequest, HttpVersion, Many, Outcome, ReadUntil, Send, Summary,
};
use aether_core::resolve::answer::grpc_code;

/// The legs, run after the extra legs.
pub static RULES: &[Leg] = &[
    leg!(
        "CONSUMER",
        "a consumer route (backend across namespaces, no grant) for its namespace only",
        Some("consumer"),
        consumer
    ),
    leg!(
        "DENY-RBAC",
        "service-level rbac denies by the hop's identity on every path",
        Some("deny-rbac"),
        deny_rbac
    ),
    leg!(
        "DENY-EXT",
        "an ext_authz denial: the server's status and body, 403 authz-denied's reason",
        None,
        deny_ext
    ),
    leg!(
        "AUTHZ-SLOW",
        "an ext_authz server slower than its timeout: 403 authz-unavailable",
        None,
        authz_slow
    ),
    leg!(
        "AUTHZ-DOWN",
        "an ext_authz server that does not answer: 403 authz-unavailable",
        Some("authz-down"),
        authz_down
    ),
    leg!(
        "DENY-LEVELS",
        "route-level and service-level authorization: a deny at either wins",
        Some("deny-levels"),
        deny_levels
    ),
    leg!(
        "WEIGHTS",
        "weighted backends split per request over kept HTTP/1.1 and h2c connections",
        Some("weights"),
        weights
    ),
    leg!(
        "GRPC-ROUTE",
        "GRPCRoute by method and header, a header modifier, a method no rule matches",
        Some("grpc"),
        grpc_route
    ),
    leg!(
        "GRPC-WEIGHT",
        "GRPCRoute weights split per call on one kept HTTP/2 connection",
        Some("grpc"),
        grpc_weight
    ),
    leg!(
        "GRPC-TCP",
        "gRPC to a raw-TCP port: bytes on a captured dial, 421 port-not-http on the proxy port",
        None,
        grpc_tcp
    ),
    leg!(
        "H2C-SAME",
        "h2c with no route to a same-node endpoint: own Service, own pod IP, another Service",
        None,
        h2c_same_node
    ),
    leg!(
        "GRPC-SAME",
        "gRPC with no route to a same-node endpoint: own Service, own pod IP, another Service",
        None,
        grpc_same_node
    ),
];

/// Requests of a weighted leg: each share within ±5 percentage points of its weight misses in
/// under 0.1 % of runs at this count (one standard deviation of a 25 % share is 1.4 points).
const WEIGHTED_COUNT: usize = 1000;
/// In flight at once in a weighted leg.
const WEIGHTED_IN_FLIGHT: usize = 20;

const CLIENT: &str = "mp-client";
const NOCAP: &str = "mp-client-nocapture";
const OTHER: &str = "mp-client-other";

/// The three HTTP paths to port 8080 of a workload: a captured dial by mesh name (from
/// mp-client), the loopback proxy port (from mp-client-nocapture), and a pod-IP dial to its
/// first pod (from mp-client). Each with its client, dial and `Host`.
fn three_paths(env: &Env, wl: &str) -> Result<Vec<(&'static str, super::Dial, String)>, String> {
    let host = format!("{}:8080", env.mesh(wl));
    let pod = env.pod_ip("mp", &format!("{wl}-0"))?;
    Ok(vec![
        (CLIENT, name(&env.mesh(wl), 8080), host.clone()),
        (NOCAP, loopback(), host),
        (CLIENT, addr(pod, 8080), format!("{pod}:8080")),
    ])
}

/// A denial the authorization server wrote: its status, its body, the mesh's reason.
fn server_denied(o: &Outcome, status: u16) -> Check {
    if o.status != Some(status)
        || o.reason() != Some("authz-denied")
        || o.first_line() != "denied by mp-authz"
    {
        return Err(format!(
            "want {status} authz-denied with the server's body, got {}",
            o.summary()
        ));
    }
    Ok(format!("{status} authz-denied"))
}

async fn consumer(env: &Env) -> Check {
    env.overlay(Some("consumer")).await?;
    let mesh = env.mesh("mp-multi");
    let consumer = |o: &Outcome| {
        echo(o, "mp-multi", 9090)?;
        headers(o, &[("x-consumer", Some("mp-other"))])
    };
    for p in [8080, 9090] {
        for n in [mesh.clone(), "mp-multi.mp.svc.cluster.local".to_owned()] {
            http(env, OTHER, name(&n, p), get("/"), consumer).await?;
        }
        let host = format!("{mesh}:{p}");
        http(env, OTHER, loopback(), get_host("/", &host), consumer).await?;
        // Callers of the parent's namespace get the producer routes: none, so port p.
        http(env, CLIENT, name(&mesh, p), get("/"), |o| {
            echo(o, "mp-multi", p)?;
            headers(o, &[("x-consumer", None)])
        })
        .await?;
        http(env, NOCAP, loopback(), get_host("/", &host), |o| {
            echo(o, "mp-multi", p)?;
            headers(o, &[("x-consumer", None)])
        })
        .await?;
    }
    Ok(
        "mp-other: mp-multi:9090 + x-consumer on 8080 and 9090; mp: each port, no x-consumer"
            .into(),
    )
}

async fn deny_rbac(env: &Env) -> Check {
    env.overlay(Some("deny-rbac")).await?;
    for (client, dial, host) in three_paths(env, "mp-httponly")? {
        http(env, client, dial, get_host("/", &host), |o| {
            answer(o, 403, "authz-denied", Some(""))
        })
        .await?;
    }
    // The one identity the rule allows is delivered: the rule reads the caller, it does not
    // refuse everything.
    let host = format!("{}:8080", env.mesh("mp-httponly"));
    http(
        env,
        OTHER,
        name(&env.mesh("mp-httponly"), 8080),
        get("/"),
        |o| echo(o, "mp-httponly", 8080),
    )
    .await?;
    http(env, OTHER, loopback(), get_host("/", &host), |o| {
        echo(o, "mp-httponly", 8080)
    })
    .await?;
    Ok("403 authz-denied on 3 paths; mp-client-other delivered".into())
}

async fn deny_ext(env: &Env) -> Check {
    let before = authz_count(env).await?;
    for (client, dial, host) in three_paths(env, "mp-multi")? {
        let send = with_headers("/", Some(&host), &[(AUTHZ_DENY_HEADER, "401")]);
        http(env, client, dial, send, |o| server_denied(o, 401)).await?;
    }
    let after = authz_count(env).await?;
    if after != before + 3 {
        return Err(format!(
            "3 denied requests made {} authorization checks, want 3",
            after - before
        ));
    }
    Ok("401 authz-denied with the server's body on 3 paths, one check each".into())
}

async fn authz_slow(env: &Env) -> Check {
    for (client, dial, host) in three_paths(env, "mp-multi")? {
        // The base filter's timeout is 200 ms; the server waits 1 s.
        let send = with_headers("/", Some(&host), &[(AUTHZ_DELAY_HEADER, "1000")]);
        http(env, client, dial, send, |o| {
            answer(o, 403, "authz-unavailable", Some(""))
        })
        .await?;
    }
    Ok("403 authz-unavailable on 3 paths".into())
}

async fn authz_down(env: &Env) -> Check {
    env.overlay(Some("authz-down")).await?;
    for (client, dial, host) in three_paths(env, "mp-multi")? {
        http(env, client, dial, get_host("/", &host), |o| {
            answer(o, 403, "authz-unavailable", Some(""))
        })
        .await?;
    }
    Ok("403 authz-unavailable on 3 paths".into())
}

async fn deny_levels(env: &Env) -> Check {
    env.overlay(Some("deny-levels")).await?;
    let mesh = env.mesh("mp-multi");
    let host = format!("{mesh}:9090");
    // Both levels allow.
    http(env, CLIENT, name(&mesh, 9090), get("/"), |o| {
        echo(o, "mp-multi", 8080)?;
        headers(o, &[("x-svc", Some("1"))])
    })
    .await?;
    // The service level (destination) denies; the route level allowed.
    let deny = [(AUTHZ_DENY_HEADER, "1")];
    http(
        env,
        CLIENT,
        name(&mesh, 9090),
        with_headers("/", None, &deny),
        |o| server_denied(o, 403),
    )
    .await?;
    http(
        env,
        NOCAP,
        loopback(),
        with_headers("/", Some(&host), &deny),
        |o| server_denied(o, 403),
    )
    .await?;
    // The route level (source) denies mp-other's caller: the request ends at the source, so
    // the service level's server is never asked.
    let before = authz_count(env).await?;
    http(env, OTHER, name(&mesh, 9090), get("/"), |o| {
        answer(o, 403, "authz-denied", Some(""))
    })
    .await?;
    http(env, OTHER, loopback(), get_host("/", &host), |o| {
        answer(o, 403, "authz-denied", Some(""))
    })
    .await?;
    let after = authz_count(env).await?;
    if after != before {
        return Err(format!(
            "a route-level denial made {} service-level checks, want 0",
            after - before
        ));
    }
    Ok(
        "both allow: delivered; service level denies: 403; route level denies: 403, no check"
            .into(),
    )
}

/// Each `(ident, weight share in percent)` within ±5 percentage points of the answers, and
/// nothing else answered.
fn split(s: &Summary, want: &[(&str, usize)]) -> Check {
    let total: usize = s.by_ident.values().sum();
    if total != s.requests || s.failed != 0 || s.by_ident.len() != want.len() {
        return Err(format!("want only {want:?}: {}", s.render()));
    }
    let mut got = Vec::new();
    for (ident, pct) in want {
        let n = s.by_ident.get(*ident).copied().unwrap_or(0);
        let share = n * 100 / total.max(1);
        if share.abs_diff(*pct) > 5 {
            return Err(format!(
                "{ident}: {share} % of {total}, want {pct} % ± 5: {}",
                s.render()
            ));
        }
        got.push(format!("{ident} {share} %"));
    }
    Ok(got.join(", "))
}

async fn weights(env: &Env) -> Check {
    env.overlay(Some("weights")).await?;
    let many = Many {
        count: WEIGHTED_COUNT,
        concurrency: WEIGHTED_IN_FLIGHT,
        keep_alive: true,
    };
    let mut out = Vec::new();
    for version in [HttpVersion::Http11, HttpVersion::H2c] {
        let req = HttpRequest {
            version,
            ..HttpRequest::get("/")
        };
        let p = probe(name(&env.mesh("mp-multi"), 8080), Send::Http(req));
        let s = env
            .probe_many(CLIENT, &p, many, |o| {
                if o.status == Some(200) {
                    Ok(String::new())
                } else {
                    Err(o.summary())
                }
            })
            .await?;
        let most = match version {
            HttpVersion::H2c => 1,
            HttpVersion::Http10 | HttpVersion::Http11 => WEIGHTED_IN_FLIGHT,
        };
        if s.connections > most {
            return Err(format!(
                "{version:?}: {} connections, want at most {most}",
                s.connections
            ));
        }
        let got = split(&s, &[("mp-multi:8080", 25), ("mp-multi:9090", 75)])?;
        out.push(format!(
            "{version:?} on {} connections: {got}",
            s.connections
        ));
    }
    Ok(out.join("; "))
}

/// A gRPC call of `method` with `metadata`; `authority` for the proxy port.
fn grpc(method: &str, authority: Option<&str>, metadata: &[(&str, &str)]) -> Send {
    Send::Grpc(GrpcRequest {
        authority: authority.map(str::to_owned),
        headers: metadata
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..GrpcRequest::new(method)
    })
}

/// The echo's reply to a call that succeeded, from `ident`.
fn grpc_reply<'o>(o: &'o Outcome, ident: &str) -> Result<&'o EchoReply, String> {
    let reply = o
        .grpc
        .as_ref()
        .filter(|g| g.code == 0)
        .and_then(|g| g.reply.as_ref())
        .ok_or_else(|| format!("want a gRPC reply from {ident}, got {}", o.summary()))?;
    if reply.ident != ident {
        return Err(format!("want {ident}, got {}", reply.ident));
    }
    Ok(reply)
}

/// A mesh answer to a gRPC call (docs/decisions.md): the HTTP status, reason and body of
/// addressing.md §11, plus `grpc-status` (the code gRPC derives from that status) and
/// `grpc-message` (the reason).
fn grpc_refused(o: &Outcome, status: u16, reason: &str, ports: Option<&str>) -> Check {
    answer(o, status, reason, ports)?;
    let want = i32::from(grpc_code(status));
    match &o.grpc {
        Some(g) if g.status_sent && g.code == want && g.message == reason => {
            Ok(format!("{status} {reason}, grpc-status {}", g.code_name))
        }
        other => Err(format!(
            "{status} {reason}: want grpc-status {want} and grpc-message {reason}, got {other:?}"
        )),
    }
}

/// The two ways into mp-grpc:50051: a captured dial by mesh name (mp-client) and the proxy
/// port (mp-client-nocapture).
fn grpc_paths(env: &Env) -> [(&'static str, super::Dial, Option<String>); 2] {
    let mesh = env.mesh("mp-grpc");
    [
        (CLIENT, name(&mesh, 50051), None),
        (NOCAP, loopback(), Some(format!("{mesh}:50051"))),
    ]
}

async fn grpc_route(env: &Env) -> Check {
    env.overlay(Some("grpc")).await?;
    for (client, dial, authority) in grpc_paths(env) {
        let a = authority.as_deref();
        let label = format!("{client} → {}", dial.authority());
        let call = |method: &str, md: &[(&str, &str)]| probe(dial.clone(), grpc(method, a, md));
        // By method and header, with the rule's header modifier seen by the backend.
        let o = env
            .probe(
                client,
                &call("aether.echo.v1.Echo/Echo", &[("x-tier", "gold")]),
            )
            .await?;
        let r = grpc_reply(&o, "mp-grpc:50052").map_err(|e| format!("{label} gold: {e}"))?;
        if r.metadata_all("x-grpc-route") != ["gold"] {
            return Err(format!(
                "{label} gold: x-grpc-route {:?}",
                r.metadata_all("x-grpc-route")
            ));
        }
        // By method alone.
        let o = env
            .probe(client, &call("aether.echo.v1.Echo/Other", &[]))
            .await?;
        let r = grpc_reply(&o, "mp-grpc:50052").map_err(|e| format!("{label} Other: {e}"))?;
        if !r.metadata_all("x-grpc-route").is_empty() {
            return Err(format!("{label} Other: a modifier of another rule ran"));
        }
        // A method no rule matches: the mesh's 404, as a gRPC client reads it.
        let o = env
            .probe(client, &call("aether.echo.v1.Echo/Missing", &[]))
            .await?;
        grpc_refused(&o, 404, "route-not-matched", Some(""))
            .map_err(|e| format!("{label} Missing: {e}"))?;
    }
    Ok("both paths: gold → 50052 + x-grpc-route; Other → 50052; Missing → 404 route-not-matched, UNIMPLEMENTED".into())
}

async fn grpc_weight(env: &Env) -> Check {
    env.overlay(Some("grpc")).await?;
    let many = Many {
        count: WEIGHTED_COUNT,
        concurrency: WEIGHTED_IN_FLIGHT,
        keep_alive: true,
    };
    let p = probe(
        name(&env.mesh("mp-grpc"), 50051),
        grpc("aether.echo.v1.Echo/Echo", None, &[]),
    );
    let s = env
        .probe_many(CLIENT, &p, many, |o| {
            let modified = o
                .grpc
                .as_ref()
                .and_then(|g| g.reply.as_ref())
                .is_some_and(|r| r.metadata_all("x-grpc-route") == ["weighted"]);
            if modified {
                Ok(String::new())
            } else {
                Err(format!("no x-grpc-route: weighted: {}", o.summary()))
            }
        })
        .await?;
    if s.connections != 1 {
        return Err(format!(
            "{} connections, want one kept HTTP/2 connection",
            s.connections
        ));
    }
    let got = split(&s, &[("mp-grpc:50051", 25), ("mp-grpc:50052", 75)])?;
    Ok(format!("{WEIGHTED_COUNT} calls on 1 connection: {got}"))
}

async fn grpc_tcp(env: &Env) -> Check {
    // (i) A captured dial to a raw-TCP port: the call's bytes reach mp-mixed:9000 as bytes (the
    // raw echo names itself and echoes the HTTP/2 preface); the mesh answers nothing itself.
    let ip = env.cluster_ip("mp", "mp-mixed")?;
    let mut p = probe(
        addr(ip, 9000),
        Send::Raw(aether_core::proxy::sniff::H2_PREFACE.to_vec()),
    );
    p.until = ReadUntil::Text("SM".into());
    let o = env.probe(CLIENT, &p).await?;
    if !o.body_text().starts_with("mp-mixed:9000\n") || !o.body_text().contains("PRI * HTTP/2.0") {
        return Err(format!(
            "(i) bytes: want the raw echo of the preface, got {}",
            o.summary()
        ));
    }
    let o = env
        .probe(
            CLIENT,
            &probe(addr(ip, 9000), grpc("aether.echo.v1.Echo/Echo", None, &[])),
        )
        .await?;
    if o.status.is_some() || o.reason().is_some() {
        return Err(format!(
            "(i) a gRPC call: the mesh answered as HTTP: {}",
            o.summary()
        ));
    }
    // (ii) The proxy port names the raw-TCP port: 421 port-not-http, with grpc-status.
    let host = format!("{}:9000", env.mesh("mp-mixed"));
    let o = env
        .probe(
            NOCAP,
            &probe(
                loopback(),
                grpc("aether.echo.v1.Echo/Echo", Some(&host), &[]),
            ),
        )
        .await?;
    grpc_refused(&o, 421, "port-not-http", Some("8080/http 9000/tcp"))
        .map_err(|e| format!("(ii) {e}"))?;
    // The same refusal to a request that is not gRPC carries no gRPC status.
    http(env, NOCAP, loopback(), get_host("/", &host), |o| {
        answer(o, 421, "port-not-http", Some("8080/http 9000/tcp"))?;
        headers(o, &[("grpc-status", None), ("grpc-message", None)])
    })
    .await?;
    Ok("(i) bytes to mp-mixed:9000; (ii) 421 port-not-http, grpc-status UNKNOWN; HTTP: no grpc-status".into())
}

/// New connections, one request each, to a user Service's ClusterIP with two endpoints (one
/// on each node): every pick is fresh, so the same-node endpoint is picked at least once with
/// probability 1 - 2^-24.
const PICKS: Many = Many {
    count: 24,
    concurrency: 1,
    keep_alive: false,
};

/// Every answer checked by `check`, and `pod` among the pods that answered.
async fn answered_by(
    env: &Env,
    client: &str,
    p: &super::Probe,
    many: Many,
    pod: &str,
    check: impl Fn(&Outcome) -> Check + std::marker::Send + Sync,
) -> Result<Summary, String> {
    let s = env.probe_many(client, p, many, check).await?;
    if s.answered != s.requests || !s.by_pod.contains_key(pod) {
        return Err(format!(
            "{client} → {}: want every request answered and {pod} among the pods, got {:?} by pod, {:?} failed",
            p.dial.authority(),
            s.by_pod,
            s.by_error
        ));
    }
    Ok(s)
}

/// issue #35 item 6: h2c on a declared HTTP port, no route, to an endpoint on the caller's own
/// node. A user Service that no route names is a passthrough, carried over the hop as bytes
/// (model.md §12.5 item 1) and served as HTTP by the destination; a pod-IP dial is a delivery
/// (addressing.md §5.1). Both ends are one daemon's, and the passthrough's kept connection
/// must not be taken for the delivery's (it sent the request round the hop for ever).
async fn h2c_same_node(env: &Env) -> Check {
    const OWNED: &str = "mp-owned-0";
    let front = env.cluster_ip("mp", "mp-owned")?;
    let own = env.pod_ip("mp", OWNED)?;
    let h2c = |dial| {
        let req = HttpRequest {
            version: HttpVersion::H2c,
            ..HttpRequest::get("/")
        };
        probe(dial, Send::Http(req))
    };
    let ok = |o: &Outcome| echo(o, "mp-owned", 8080);
    // (i) Its own Service, from one of its pods: the pick lands on the caller itself too.
    answered_by(env, OWNED, &h2c(addr(front, 80)), PICKS, OWNED, ok).await?;
    // (ii) Its own pod IP: a delivery to itself over the hop.
    let once = Many { count: 4, ..PICKS };
    answered_by(env, OWNED, &h2c(addr(own, 8080)), once, OWNED, ok).await?;
    // (iii) Another Service from another pod of the node, and on one kept connection.
    answered_by(env, CLIENT, &h2c(addr(front, 80)), PICKS, OWNED, ok).await?;
    let kept = Many {
        keep_alive: true,
        ..PICKS
    };
    let s = answered_by(env, OWNED, &h2c(addr(own, 8080)), kept, OWNED, ok).await?;
    Ok(format!(
        "{OWNED} → its Service and its pod IP, mp-client → mp-owned: every request answered, \
         mp-owned-0 among them; {} requests on {} kept connection",
        s.requests, s.connections
    ))
}

/// issue #35 item 6: gRPC (h2c) on a declared HTTP port, no route, to an endpoint on the
/// caller's own node: the user Service `mp-grpc-front` (no route names it) and the pod IP.
async fn grpc_same_node(env: &Env) -> Check {
    const GRPC: &str = "mp-grpc-0";
    let front = env.cluster_ip("mp", "mp-grpc-front")?;
    let own = env.pod_ip("mp", GRPC)?;
    let call = |dial| probe(dial, grpc("aether.echo.v1.Echo/Echo", None, &[]));
    let ok = |o: &Outcome| grpc_reply(o, "mp-grpc:50051").map(|_| String::new());
    answered_by(env, GRPC, &call(addr(front, 50051)), PICKS, GRPC, ok).await?;
    let kept = Many {
        count: 4,
        concurrency: 1,
        keep_alive: true,
    };
    answered_by(env, GRPC, &call(addr(own, 50051)), kept, GRPC, ok).await?;
    answered_by(env, CLIENT, &call(addr(front, 50051)), PICKS, GRPC, ok).await?;
    Ok("mp-grpc-0 → mp-grpc-front and its pod IP, mp-client → mp-grpc-front: every call answered, mp-grpc-0 among them".into())
}
