//! Every leg of spec/legs.md that one machine can show, in the spec's order.

use std::time::Duration;

use super::{
    Check, Env, Leg, NO_APP_WAIT, addr, answer, authz_count, ctx, echo, get, get_host, headers,
    http, loopback, mp_authz_counter, name, no_app, probe, with_headers, within,
};
use crate::workload::probe::{
    Host, HttpRequest, HttpVersion, Many, Outcome, ReadUntil, Send, Target,
};

/// The catalogue.
pub static LEGS: &[Leg] = &[
    leg!("A1", "every HTTP port by mesh name", None, a1),
    leg!("A2", "every HTTP port by both Kubernetes names", None, a2),
    leg!("A3", "every HTTP port on loopback", None, a3),
    leg!(
        "A4",
        "a port-less route's rule applies (captured, loopback)",
        Some("a4"),
        a4
    ),
    leg!(
        "A5",
        "Host port differs from the dialled port: 421 port-mismatch",
        None,
        a5
    ),
    leg!(
        "A6",
        "a raw-TCP port on loopback: 421 port-not-http",
        None,
        a6
    ),
    leg!("A7", "an undeclared port: 421 port-not-declared", None, a7),
    leg!(
        "A8",
        "raw bytes to an undeclared port: no application",
        None,
        a8
    ),
    leg!(
        "A9",
        "port-less Host on a captured dial means the dialled port",
        None,
        a9
    ),
    leg!(
        "A10",
        "mp-nine's HTTP 9000 beside mp-mixed's raw-TCP 9000",
        None,
        a10
    ),
    leg!(
        "A11",
        "a raw-TCP port forwards HTTP bytes as bytes",
        None,
        a11
    ),
    leg!("A13", "server-first greeting under 200 ms", None, a13),
    leg!("R1", "port 80 of mp-eighty (captured, loopback)", None, r1),
    leg!(
        "R2",
        "a dial to 80 of the others: 421 port-not-declared",
        None,
        r2
    ),
    leg!(
        "R3",
        "port-less Host on loopback: 421 port-not-declared",
        None,
        r3
    ),
    leg!("R4", "Host :18081: 421 port-not-declared", None, r4),
    leg!(
        "R5",
        "18082 reaches mp-tcpfirst's raw-TCP legacy target",
        None,
        r5
    ),
    leg!(
        "R5c",
        "18082 with an HTTP legacy target: no application",
        None,
        r5c
    ),
    leg!("M4", "raw TCP to mp-mixed:9000 (also X2, X3)", None, m4),
    leg!("N1", "short name from the caller's namespace", None, n1),
    leg!(
        "N2",
        "a short name from another namespace is not the mesh's",
        None,
        n2
    ),
    leg!("N3", "Kubernetes names on loopback", None, n3),
    leg!(
        "N4",
        "a captured dial to 18081: the Host names the port",
        None,
        n4
    ),
    leg!("N5", "upper-case Host is kept", None, n5),
    leg!("N6", "h2c prior knowledge", None, n6),
    leg!(
        "N7",
        "a TLS ClientHello to an HTTP port: passthrough",
        None,
        n7
    ),
    leg!(
        "N8",
        "non-HTTP bytes to an HTTP port: passthrough",
        None,
        n8
    ),
    leg!("N9", "an application's 421/503 pass unchanged", None, n9),
    leg!("N10", "x-echo-host keeps the port", None, n10),
    leg!(
        "N11",
        "weighted backends, one invalid: half 500 invalid-backend",
        Some("n11-unsupported"),
        n11
    ),
    leg!(
        "N12",
        "a route on a raw-TCP parent port changes nothing",
        Some("n12"),
        n12
    ),
    leg!("N13", "route parent port: none vs 9090", Some("a4"), n13),
    leg!(
        "N14",
        "refusals run no filter; deliveries run both",
        None,
        n14
    ),
    leg!(
        "N15",
        "a meshOnly user-owned service, then routed",
        Some("n15-routed"),
        n15
    ),
    leg!(
        "N16",
        "unknown mesh name: hold then 404; :18081 at once",
        None,
        n16
    ),
    leg!("N17", "absolute form wins over Host", None, n17),
    leg!(
        "N18",
        "the address decides the service of a shared port number",
        None,
        n18
    ),
    leg!("N19", "UDP through 18082 and a UDPRoute", None, n19),
    leg!(
        "N20",
        "raw TCP to a pod IP reaches the dialled pod",
        None,
        n20
    ),
    leg!(
        "N21",
        "HTTP to a pod IP: the dialled pod, its service filters, no route",
        Some("a4"),
        n21
    ),
    leg!(
        "N22",
        "an undeclared pod port passes through; the ClusterIP refuses",
        None,
        n22
    ),
    leg!(
        "N23",
        "malformed authorities: 400 bad-authority; not-http",
        None,
        n23
    ),
    leg!(
        "N24",
        "x-aether- request headers never reach the application",
        None,
        n24
    ),
    leg!(
        "N25",
        "an application's x-aether-error is removed",
        None,
        n25
    ),
    leg!(
        "N26",
        "a route on port 9090 only; route-not-matched",
        Some("n26"),
        n26
    ),
    leg!(
        "N27",
        "names that are not the mesh's; trailing dots; CONNECT",
        None,
        n27
    ),
    leg!(
        "N28",
        "the proxy port is not an open forward proxy",
        None,
        n28
    ),
    leg!(
        "UPG",
        "Upgrade: a 101 through the mesh, then bytes both ways",
        None,
        upg
    ),
    leg!(
        "MIR",
        "RequestMirror: the mirror receives a copy of each request",
        Some("mirror"),
        mir
    ),
];

const CLIENT: &str = "mp-client";
const NOCAP: &str = "mp-client-nocapture";
const OTHER: &str = "mp-client-other";
const SECOND: Duration = Duration::from_secs(1);
/// In flight at once for a weighted leg, each on its kept connection.
pub(super) const WEIGHTED_CONCURRENCY: usize = 10;

/// The six workloads and their HTTP ports and `ports:` lines (legs.md §1.2, §1.5).
const SIX: &[(&str, &[u16], &str)] = &[
    ("mp-httponly", &[8080], "8080/http"),
    ("mp-multi", &[8080, 9090], "8080/http 9090/http"),
    (
        "mp-eighty",
        &[80, 8080, 9090],
        "80/http 8080/http 9090/http",
    ),
    ("mp-mixed", &[8080], "8080/http 9000/tcp"),
    ("mp-tcpfirst", &[8080], "8080/http 9000/tcp"),
    ("mp-nine", &[9000], "9000/http"),
];

fn ports_line(wl: &str) -> &'static str {
    SIX.iter()
        .find(|(w, _, _)| *w == wl)
        .map_or("", |(_, _, l)| l)
}

async fn raw(
    env: &Env,
    client: &str,
    dial: super::Dial,
    send: Send,
    until: ReadUntil,
) -> Result<Outcome, String> {
    let mut p = probe(dial, send);
    p.until = until;
    env.probe(client, &p).await
}

/// Send raw bytes (or a ClientHello) from mp-client and check that no application answers
/// (legs.md §1.5): nothing with an identity for [`NO_APP_WAIT`] of silence.
async fn nothing_answers(env: &Env, dial: super::Dial, send: Send) -> Check {
    let mut p = probe(dial, send);
    p.until = ReadUntil::Idle(NO_APP_WAIT);
    p.timeout = NO_APP_WAIT + SECOND;
    let o = env.probe(CLIENT, &p).await?;
    no_app(&o, None)
}

fn has(o: &Outcome, text: &str) -> Check {
    if o.body_text().contains(text) {
        Ok(text.to_owned())
    } else {
        Err(format!("want {text:?}, got {}", o.summary()))
    }
}

async fn a1(env: &Env) -> Check {
    let mut n = 0;
    for (wl, ports, _) in SIX {
        for &p in *ports {
            http(env, CLIENT, name(&env.mesh(wl), p), get("/"), |o| {
                echo(o, wl, p)
            })
            .await?;
            n += 1;
        }
    }
    Ok(format!("{n} ports echo themselves"))
}

async fn a2(env: &Env) -> Check {
    let mut n = 0;
    for (wl, ports, _) in SIX {
        for &p in *ports {
            for n_ in [format!("{wl}.mp.svc.cluster.local"), format!("{wl}.mp")] {
                http(env, CLIENT, name(&n_, p), get("/"), |o| echo(o, wl, p)).await?;
                n += 1;
            }
        }
    }
    Ok(format!("{n} requests echo their port"))
}

async fn a3(env: &Env) -> Check {
    let mut n = 0;
    for (wl, ports, _) in SIX {
        for &p in *ports {
            let host = format!("{}:{p}", env.mesh(wl));
            http(env, NOCAP, loopback(), get_host("/", &host), |o| {
                echo(o, wl, p)
            })
            .await?;
            n += 1;
        }
    }
    Ok(format!("{n} ports via 127.0.0.1:18081"))
}

fn with_a4(o: &Outcome, port: u16) -> Check {
    echo(o, "mp-multi", port)?;
    headers(o, &[("x-a4", Some("1"))])?;
    Ok(format!("mp-multi:{port} + x-a4"))
}

async fn a4(env: &Env) -> Check {
    env.overlay(Some("a4")).await?;
    let host = format!("{}:9090", env.mesh("mp-multi"));
    http(
        env,
        CLIENT,
        name(&env.mesh("mp-multi"), 9090),
        get("/"),
        |o| with_a4(o, 9090),
    )
    .await?;
    http(env, NOCAP, loopback(), get_host("/", &host), |o| {
        with_a4(o, 9090)
    })
    .await
}

async fn a5(env: &Env) -> Check {
    let host = format!("{}:9090", env.mesh("mp-multi"));
    http(
        env,
        CLIENT,
        name(&env.mesh("mp-multi"), 8080),
        get_host("/", &host),
        |o| answer(o, 421, "port-mismatch", Some("8080/http 9090/http")),
    )
    .await
}

async fn a6(env: &Env) -> Check {
    for wl in ["mp-mixed", "mp-tcpfirst"] {
        let host = format!("{}:9000", env.mesh(wl));
        http(env, NOCAP, loopback(), get_host("/", &host), |o| {
            answer(o, 421, "port-not-http", Some(ports_line(wl)))?;
            within(o, SECOND)
        })
        .await?;
    }
    Ok("421 port-not-http for both".into())
}

async fn a7(env: &Env) -> Check {
    let ports = Some("8080/http 9090/http");
    for n_ in [env.mesh("mp-multi"), "mp-multi.mp.svc.cluster.local".into()] {
        http(env, CLIENT, name(&n_, 7777), get("/"), |o| {
            answer(o, 421, "port-not-declared", ports)?;
            within(o, SECOND)
        })
        .await?;
    }
    let host = format!("{}:7777", env.mesh("mp-multi"));
    http(env, NOCAP, loopback(), get_host("/", &host), |o| {
        answer(o, 421, "port-not-declared", ports)?;
        within(o, SECOND)
    })
    .await
}

async fn a8(env: &Env) -> Check {
    nothing_answers(
        env,
        name(&env.mesh("mp-mixed"), 7777),
        Send::Raw(b"\x00\x01binary\n".to_vec()),
    )
    .await
}

async fn a9(env: &Env) -> Check {
    let mut n = 0;
    for (wl, ports, _) in SIX
        .iter()
        .filter(|(w, _, _)| ["mp-multi", "mp-eighty", "mp-mixed"].contains(w))
    {
        for &p in ports.iter().filter(|p| **p != 80) {
            for n_ in [env.mesh(wl), format!("{wl}.mp.svc.cluster.local")] {
                http(env, CLIENT, name(&n_, p), get_host("/", &n_), |o| {
                    echo(o, wl, p)
                })
                .await?;
                n += 1;
            }
        }
    }
    Ok(format!("{n} port-less requests reach the dialled port"))
}

async fn a10(env: &Env) -> Check {
    http(
        env,
        CLIENT,
        name(&env.mesh("mp-nine"), 9000),
        get("/"),
        |o| echo(o, "mp-nine", 9000),
    )
    .await
}

async fn a11(env: &Env) -> Check {
    let mixed = env.cluster_ip("mp", "mp-mixed")?;
    let o = raw(
        env,
        CLIENT,
        addr(mixed, 9000),
        Send::Raw(b"GET / HTTP/1.1\r\nHost: anything\r\n\r\n".to_vec()),
        ReadUntil::Text("GET /".into()),
    )
    .await?;
    has(&o, "mp-mixed:9000")?;
    let nine = env.cluster_ip("mp", "mp-nine")?;
    nothing_answers(
        env,
        addr(nine, 9000),
        Send::Raw(b"\x00raw bytes\n".to_vec()),
    )
    .await
    .map(|d| format!("mp-mixed:9000 as bytes; mp-nine raw: {d}"))
}

async fn greeting(env: &Env, dial: super::Dial, wl: &str, port: u16) -> Result<Outcome, String> {
    let o = raw(env, CLIENT, dial, Send::Nothing, ReadUntil::Lines(2)).await?;
    has(&o, &format!("{wl}:{port} ready"))?;
    within(&o, Duration::from_millis(200))?;
    Ok(o)
}

async fn a13(env: &Env) -> Check {
    let ip = env.cluster_ip("mp", "mp-serverfirst")?;
    let o = greeting(env, addr(ip, 3306), "mp-serverfirst", 3306).await?;
    within(&o, Duration::from_millis(200)).map(|t| format!("greeting after {t}"))
}

async fn r1(env: &Env) -> Check {
    for n_ in [
        env.mesh("mp-eighty"),
        "mp-eighty.mp.svc.cluster.local".into(),
    ] {
        http(env, CLIENT, name(&n_, 80), get("/"), |o| {
            echo(o, "mp-eighty", 80)
        })
        .await?;
    }
    for host in [
        env.mesh("mp-eighty"),
        format!("{}:80", env.mesh("mp-eighty")),
    ] {
        http(env, NOCAP, loopback(), get_host("/", &host), |o| {
            echo(o, "mp-eighty", 80)
        })
        .await?;
    }
    Ok("echo 80 on both paths".into())
}

async fn r2(env: &Env) -> Check {
    for (wl, _, line) in SIX.iter().filter(|(w, _, _)| *w != "mp-eighty") {
        for n_ in [env.mesh(wl), format!("{wl}.mp.svc.cluster.local")] {
            http(env, CLIENT, name(&n_, 80), get("/"), |o| {
                answer(o, 421, "port-not-declared", Some(line))?;
                within(o, SECOND)
            })
            .await?;
        }
    }
    Ok("421 port-not-declared for five".into())
}

async fn r3(env: &Env) -> Check {
    for (wl, _, line) in SIX.iter().filter(|(w, _, _)| *w != "mp-eighty") {
        http(env, NOCAP, loopback(), get_host("/", &env.mesh(wl)), |o| {
            answer(o, 421, "port-not-declared", Some(line))?;
            within(o, SECOND)
        })
        .await?;
    }
    Ok("421 port-not-declared for five".into())
}

async fn r4(env: &Env) -> Check {
    let host = format!("{}:18081", env.mesh("mp-httponly"));
    http(
        env,
        CLIENT,
        name(&env.mesh("mp-httponly"), 18081),
        get_host("/", &host),
        |o| answer(o, 421, "port-not-declared", Some("8080/http")),
    )
    .await?;
    http(env, NOCAP, loopback(), get_host("/", &host), |o| {
        answer(o, 421, "port-not-declared", Some("8080/http"))
    })
    .await
}

async fn r5(env: &Env) -> Check {
    let o = raw(
        env,
        CLIENT,
        name(&env.mesh("mp-tcpfirst"), 18082),
        Send::Raw(b"hello\n".to_vec()),
        ReadUntil::Text("hello".into()),
    )
    .await?;
    has(&o, "mp-tcpfirst:9000")?;
    nothing_answers(
        env,
        name(&env.mesh("mp-tcpfirst"), 7777),
        Send::Raw(b"hello\n".to_vec()),
    )
    .await
    .map(|d| format!("18082 → mp-tcpfirst:9000; 7777: {d}"))
}

async fn r5c(env: &Env) -> Check {
    nothing_answers(
        env,
        name(&env.mesh("mp-mixed"), 18082),
        Send::Raw(b"hello\n".to_vec()),
    )
    .await
}

async fn m4(env: &Env) -> Check {
    for wl in ["mp-mixed", "mp-tcpfirst"] {
        let ip = env.cluster_ip("mp", wl)?;
        let o = raw(
            env,
            CLIENT,
            addr(ip, 9000),
            Send::Raw(b"ping\n".to_vec()),
            ReadUntil::Text("ping".into()),
        )
        .await?;
        has(&o, &format!("{wl}:9000")).map_err(ctx(wl))?;
    }
    http(
        env,
        CLIENT,
        name(&env.mesh("mp-tcpfirst"), 8080),
        get("/"),
        |o| echo(o, "mp-tcpfirst", 8080),
    )
    .await?;
    Ok("raw 9000 of both mixed shapes; X3 HTTP 8080".into())
}

async fn n1(env: &Env) -> Check {
    http(
        env,
        CLIENT,
        name("mp-multi", 9090),
        get_host("/", "mp-multi:9090"),
        |o| echo(o, "mp-multi", 9090),
    )
    .await?;
    http(
        env,
        CLIENT,
        name("mp-multi", 9090),
        get_host("/", "mp-multi"),
        |o| echo(o, "mp-multi", 9090),
    )
    .await
}

async fn n2(env: &Env) -> Check {
    let ip = env.cluster_ip("mp", "mp-multi")?;
    let o = env
        .probe(
            OTHER,
            &probe(addr(ip, 8080), get_host("/", "mp-multi:8080")),
        )
        .await?;
    // An HTTP request passed through to a ClusterIP with no endpoints: the mesh's own 503 if
    // its connect fails within the wait.
    let captured = no_app(&o, Some("upstream-unreachable"))?;
    http(
        env,
        OTHER,
        loopback(),
        get_host("/", "mp-multi:8080"),
        |o| answer(o, 404, "not-a-mesh-name", None),
    )
    .await?;
    Ok(format!("captured: {captured}; loopback 404"))
}

async fn n3(env: &Env) -> Check {
    for host in [
        "mp-multi.mp.svc.cluster.local:9090",
        "mp-multi.mp.svc:9090",
        "mp-multi.mp:9090",
        "MP-MULTI.MP.SVC.CLUSTER.LOCAL:9090",
        "mp-multi:9090",
    ] {
        http(env, NOCAP, loopback(), get_host("/", host), |o| {
            echo(o, "mp-multi", 9090)
        })
        .await?;
    }
    http(
        env,
        NOCAP,
        loopback(),
        get_host("/", "mp-multi.mp.svc.cluster.local"),
        |o| answer(o, 421, "port-not-declared", Some("8080/http 9090/http")),
    )
    .await
}

async fn n4(env: &Env) -> Check {
    let ip = env.cluster_ip("mp", "mp-multi")?;
    let mesh = env.mesh("mp-multi");
    http(
        env,
        CLIENT,
        addr(ip, 18081),
        get_host("/", &format!("{mesh}:9090")),
        |o| echo(o, "mp-multi", 9090),
    )
    .await?;
    for host in [
        "mp-multi.mp.svc.cluster.local:8080",
        "MP-MULTI.MP.SVC.CLUSTER.LOCAL:8080",
    ] {
        http(env, CLIENT, addr(ip, 18081), get_host("/", host), |o| {
            echo(o, "mp-multi", 8080)
        })
        .await?;
    }
    http(env, CLIENT, addr(ip, 18081), get_host("/", &mesh), |o| {
        answer(o, 421, "port-not-declared", Some("8080/http 9090/http"))
    })
    .await?;
    let eighty = env.cluster_ip("mp", "mp-eighty")?;
    http(
        env,
        CLIENT,
        addr(eighty, 18081),
        get_host("/", &env.mesh("mp-eighty")),
        |o| echo(o, "mp-eighty", 80),
    )
    .await
}

async fn n5(env: &Env) -> Check {
    let host = format!("{}:9090", env.mesh("mp-multi").to_uppercase());
    http(
        env,
        CLIENT,
        name(&env.mesh("mp-multi"), 9090),
        get_host("/", &host),
        |o| echo(o, "mp-multi", 9090),
    )
    .await
}

async fn n6(env: &Env) -> Check {
    let send = Send::Http(HttpRequest {
        version: HttpVersion::H2c,
        ..HttpRequest::get("/")
    });
    http(env, CLIENT, name(&env.mesh("mp-multi"), 8080), send, |o| {
        echo(o, "mp-multi", 8080)?;
        match o.version.as_deref() {
            Some(v) if v.contains('2') => Ok("echo 8080 over HTTP/2".into()),
            v => Err(format!("answered over {v:?}, not HTTP/2")),
        }
    })
    .await
}

async fn n7(env: &Env) -> Check {
    nothing_answers(
        env,
        name(&env.mesh("mp-multi"), 8080),
        Send::TlsClientHello {
            sni: env.mesh("mp-multi"),
        },
    )
    .await
}

async fn n8(env: &Env) -> Check {
    nothing_answers(
        env,
        name(&env.mesh("mp-multi"), 8080),
        Send::Raw(b"GET mykey\r\n".to_vec()),
    )
    .await
}

async fn n9(env: &Env) -> Check {
    for code in [421, 503] {
        http(
            env,
            CLIENT,
            name(&env.mesh("mp-multi"), 8080),
            get(&format!("/status/{code}")),
            |o| {
                if o.status == Some(code)
                    && o.first_line() == "mp-multi:8080"
                    && o.reason().is_none()
                {
                    Ok(String::new())
                } else {
                    Err(format!("want the echo's own {code}, got {}", o.summary()))
                }
            },
        )
        .await?;
    }
    Ok("421 and 503 unchanged".into())
}

async fn n10(env: &Env) -> Check {
    let host = format!("{}:8080", env.mesh("mp-multi"));
    http(
        env,
        CLIENT,
        name(&env.mesh("mp-multi"), 8080),
        get_host("/", &host),
        |o| echo(o, "mp-multi", 8080),
    )
    .await
}

/// N11's 200 requests, at most [`WEIGHTED_CONCURRENCY`] in flight over kept connections, so
/// that the shares are per request, not per connection.
async fn shares(env: &Env, bad: &str) -> Check {
    let p = probe(name(&env.mesh("mp-multi"), 8080), get("/"));
    let many = Many {
        count: 200,
        concurrency: WEIGHTED_CONCURRENCY,
        keep_alive: true,
    };
    let s = env
        .probe_many(CLIENT, &p, many, |_| Ok(String::new()))
        .await?;
    let good = s.by_ident.get("mp-multi:9090").copied().unwrap_or(0);
    let invalid = s.by_reason.get("invalid-backend").copied().unwrap_or(0);
    let statuses = (
        s.by_status.get(&200).copied().unwrap_or(0),
        s.by_status.get(&500).copied().unwrap_or(0),
    );
    if good + invalid != 200 || statuses != (good, invalid) || s.by_ident.len() != 1 {
        return Err(format!(
            "{bad}: want only echo 9090 and 500 invalid-backend: {}",
            s.render()
        ));
    }
    if s.connections > WEIGHTED_CONCURRENCY {
        return Err(format!(
            "{bad}: {} connections for {WEIGHTED_CONCURRENCY} kept ones",
            s.connections
        ));
    }
    // "Both shares within ±15 %": each share is 50 % ± 15 percentage points of the 200
    // requests (70..=130). Read as ±15 % of 100 instead, a fair coin would miss the band in
    // about 3 % of runs.
    if !(70..=130).contains(&good) {
        return Err(format!(
            "{bad}: {good} echo / {invalid} invalid-backend, not about half"
        ));
    }
    Ok(format!(
        "{bad}: {good} echo 9090, {invalid} invalid-backend on {} connections",
        s.connections
    ))
}

async fn n11(env: &Env) -> Check {
    env.overlay(Some("n11-unsupported")).await?;
    let a = shares(env, "mp-mixed:9000").await?;
    env.overlay(Some("n11-notfound")).await?;
    let b = shares(env, "mp-multi:7777").await?;
    Ok(format!("{a}; {b}"))
}

async fn n12(env: &Env) -> Check {
    env.overlay(Some("n12")).await?;
    http(
        env,
        CLIENT,
        name(&env.mesh("mp-mixed"), 8080),
        get("/"),
        |o| echo(o, "mp-mixed", 8080),
    )
    .await?;
    let ip = env.cluster_ip("mp", "mp-mixed")?;
    let o = raw(
        env,
        CLIENT,
        addr(ip, 9000),
        Send::Raw(b"ping\n".to_vec()),
        ReadUntil::Text("ping".into()),
    )
    .await?;
    has(&o, "mp-mixed:9000")
}

async fn n13(env: &Env) -> Check {
    env.overlay(Some("a4")).await?;
    for n_ in [
        env.mesh("mp-multi"),
        "mp-multi.mp.svc.cluster.local".into(),
        "mp-multi".into(),
    ] {
        for p in [8080, 9090] {
            http(env, CLIENT, name(&n_, p), get("/"), |o| with_a4(o, 9090)).await?;
            let host = format!("{n_}:{p}");
            http(env, NOCAP, loopback(), get_host("/", &host), |o| {
                with_a4(o, 9090)
            })
            .await?;
        }
    }
    env.overlay(Some("n13-port")).await?;
    for n_ in [
        env.mesh("mp-multi"),
        "mp-multi.mp.svc.cluster.local".into(),
        "mp-multi".into(),
    ] {
        let host = format!("{n_}:9090");
        http(env, CLIENT, name(&n_, 9090), get("/"), |o| with_a4(o, 9090)).await?;
        http(env, NOCAP, loopback(), get_host("/", &host), |o| {
            with_a4(o, 9090)
        })
        .await?;
        let no_rule = |o: &Outcome| {
            echo(o, "mp-multi", 8080)?;
            headers(o, &[("x-a4", None)])
        };
        let host = format!("{n_}:8080");
        http(env, CLIENT, name(&n_, 8080), get("/"), no_rule).await?;
        http(env, NOCAP, loopback(), get_host("/", &host), no_rule).await?;
    }
    Ok(
        "(i) every name, port and path → 9090 + x-a4; (ii) only 9090, on every name and path"
            .into(),
    )
}

async fn n14(env: &Env) -> Check {
    let before = authz_count(env).await?;
    http(
        env,
        CLIENT,
        name(&env.mesh("mp-multi"), 7777),
        get("/"),
        |o| {
            answer(o, 421, "port-not-declared", Some("8080/http 9090/http"))?;
            headers(o, &[("x-svc", None)])
        },
    )
    .await?;
    let mid = authz_count(env).await?;
    if mid != before {
        return Err(format!(
            "a refusal made {} authorization checks",
            mid - before
        ));
    }
    http(
        env,
        CLIENT,
        name(&env.mesh("mp-multi"), 8080),
        get("/"),
        |o| svc_echo(o, 8080),
    )
    .await?;
    let after = authz_count(env).await?;
    if after != mid + 1 {
        return Err(format!(
            "a delivery made {} authorization checks, want 1",
            after - mid
        ));
    }
    Ok("421 without filters; 8080 with x-svc and one check".into())
}

fn svc(o: &Outcome, want: bool) -> Check {
    echo(o, "mp-owned", 8080)?;
    headers(o, &[("x-svc", want.then_some("1"))])
}

async fn n15(env: &Env) -> Check {
    let mesh = env.mesh("mp-owned");
    http(
        env,
        CLIENT,
        name("mp-owned.mp.svc.cluster.local", 80),
        get("/"),
        |o| svc(o, false),
    )
    .await?;
    http(
        env,
        NOCAP,
        loopback(),
        get_host("/", &format!("{mesh}:80")),
        |o| svc(o, true),
    )
    .await?;
    http(
        env,
        NOCAP,
        loopback(),
        get_host("/", &format!("{mesh}:8080")),
        |o| answer(o, 421, "port-not-declared", None),
    )
    .await?;
    http(
        env,
        NOCAP,
        loopback(),
        get_host("/", "mp-owned.mp.svc.cluster.local:80"),
        |o| answer(o, 404, "not-a-mesh-name", None),
    )
    .await?;
    env.overlay(Some("n15-routed")).await?;
    http(
        env,
        CLIENT,
        name("mp-owned.mp.svc.cluster.local", 80),
        get("/"),
        |o| svc(o, true),
    )
    .await?;
    http(
        env,
        NOCAP,
        loopback(),
        get_host("/", "mp-owned.mp.svc.cluster.local:80"),
        |o| echo(o, "mp-owned", 8080),
    )
    .await?;
    Ok("meshOnly then routed".into())
}

async fn n16(env: &Env) -> Check {
    let host = format!("nosuch.mp.{}:8080", env.mesh_domain);
    let mut p = probe(loopback(), get_host("/", &host));
    p.timeout = Duration::from_secs(5);
    let o = env.probe(NOCAP, &p).await?;
    answer(&o, 404, "not-a-mesh-name", None)?;
    within(&o, Duration::from_secs(3))?;
    let host = format!("nosuch.mp.{}:18081", env.mesh_domain);
    http(env, NOCAP, loopback(), get_host("/", &host), |o| {
        answer(o, 421, "port-not-declared", None)?;
        within(o, SECOND)
    })
    .await
}

async fn n17(env: &Env) -> Check {
    let mesh = env.mesh("mp-multi");
    let send = Send::Http(HttpRequest {
        target: Target::Absolute(format!("http://{mesh}:9090/x")),
        host: Host::Values(vec![format!("{mesh}:8080")]),
        ..HttpRequest::get("/x")
    });
    http(env, NOCAP, loopback(), send, |o| echo(o, "mp-multi", 9090)).await
}

async fn n18(env: &Env) -> Check {
    http(
        env,
        CLIENT,
        name(&env.mesh("mp-multi"), 9090),
        get("/"),
        |o| echo(o, "mp-multi", 9090),
    )
    .await?;
    let ip = env.cluster_ip("mp", "mp-serverfirst")?;
    greeting(env, addr(ip, 9090), "mp-serverfirst", 9090).await?;
    Ok("9090 by address: mp-multi HTTP, mp-serverfirst greeting".into())
}

async fn n19(env: &Env) -> Check {
    let ip = env.cluster_ip("mp", "mp-udp")?;
    let mut p = probe(addr(ip, 18082), Send::Udp(b"hello".to_vec()));
    p.timeout = Duration::from_secs(2);
    let o = env.probe(CLIENT, &p).await?;
    has(&o, "mp-udp:5353")?;
    if o.udp_from != Some(std::net::SocketAddr::new(ip, 18082)) {
        return Err(format!("reply from {:?}, want {ip}:18082", o.udp_from));
    }
    // (ii): no reply at all, from anyone, for the whole wait.
    let mut p = probe(addr(ip, 5353), Send::Udp(b"hello".to_vec()));
    p.timeout = NO_APP_WAIT;
    let o = env.probe(CLIENT, &p).await?;
    if !o.body.is_empty() || o.udp_from.is_some() {
        return Err(format!(
            "(ii) a reply on the real UDP port of a generated Service: {}",
            o.summary()
        ));
    }
    Ok("18082 → mp-udp:5353 from the ClusterIP; 5353: no reply".into())
}

async fn n20(env: &Env) -> Check {
    for pod in ["mp-serverfirst-0", "mp-serverfirst-1"] {
        let ip = env.pod_ip("mp", pod)?;
        for _ in 0..20 {
            let o = greeting(env, addr(ip, 3306), "mp-serverfirst", 3306).await?;
            has(&o, &format!("pod {pod}\n"))?;
        }
    }
    for pod in ["mp-mixed-0", "mp-mixed-1"] {
        let ip = env.pod_ip("mp", pod)?;
        for _ in 0..20 {
            let o = raw(
                env,
                CLIENT,
                addr(ip, 9000),
                Send::Raw(b"ping\n".to_vec()),
                ReadUntil::Text("ping".into()),
            )
            .await?;
            has(&o, &format!("mp-mixed:9000\npod {pod}\nping"))?;
        }
    }
    Ok("80 connections, each to the dialled pod".into())
}

async fn n21(env: &Env) -> Check {
    env.overlay(Some("a4")).await?;
    let before = authz_count(env).await?;
    let pod = "mp-multi-1";
    let ip = env.pod_ip("mp", pod)?;
    let hosts = [
        format!("{}:8080", env.mesh("mp-eighty")),
        format!("{}:9090", env.mesh("mp-multi")),
        "mp-multi".to_owned(),
    ];
    for host in &hosts {
        for _ in 0..20 {
            http(env, CLIENT, addr(ip, 8080), get_host("/", host), |o| {
                echo(o, "mp-multi", 8080)?;
                headers(
                    o,
                    &[
                        ("x-echo-pod", Some(pod)),
                        ("x-svc", Some("1")),
                        ("x-a4", None),
                    ],
                )
            })
            .await?;
        }
    }
    let after = authz_count(env).await?;
    if after != before + 60 {
        return Err(format!(
            "{} authorization checks for 60 requests",
            after - before
        ));
    }
    Ok("60 requests: the dialled pod, x-svc, no x-a4, one check each".into())
}

async fn n22(env: &Env) -> Check {
    let pod = "mp-mixed-1";
    let ip = env.pod_ip("mp", pod)?;
    let client_ip = env.pod_ip("mp", CLIENT)?.to_string();
    let host = format!("{}:7070", env.mesh("mp-mixed"));
    http(env, CLIENT, addr(ip, 7070), get_host("/", &host), |o| {
        echo(o, "mp-mixed", 7070)?;
        // Passed through outside the mesh, from the client pod's own address.
        headers(
            o,
            &[
                ("x-echo-pod", Some(pod)),
                ("x-svc", None),
                ("x-echo-peer", Some(&client_ip)),
            ],
        )
    })
    .await?;
    let cip = env.cluster_ip("mp", "mp-mixed")?;
    http(env, CLIENT, addr(cip, 7070), get_host("/", &host), |o| {
        answer(o, 421, "port-not-declared", Some("8080/http 9000/tcp"))
    })
    .await
}

async fn n23(env: &Env) -> Check {
    let mesh = env.mesh("mp-multi");
    let host = format!("{mesh}:8080");
    let eighty = format!("{}:8080", env.mesh("mp-eighty"));
    let cases = [
        HttpRequest {
            host: Host::None,
            ..HttpRequest::get("/")
        },
        HttpRequest {
            host: Host::Values(vec![host.clone(), host.clone()]),
            ..HttpRequest::get("/")
        },
        HttpRequest {
            version: HttpVersion::H2c,
            target: Target::Absolute(format!("http://{host}/")),
            host: Host::Values(vec![eighty]),
            ..HttpRequest::get("/")
        },
        HttpRequest {
            host: Host::Values(vec![format!("user@{host}")]),
            ..HttpRequest::get("/")
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        for (client, dial) in [(CLIENT, name(&mesh, 8080)), (NOCAP, loopback())] {
            http(env, client, dial, Send::Http(case.clone()), |o| {
                answer(o, 400, "bad-authority", None)?;
                within(o, SECOND)
            })
            .await
            .map_err(ctx(format!("case {}", i + 1)))?;
        }
    }
    let o = raw(
        env,
        NOCAP,
        loopback(),
        Send::Raw(b"hello\r\n\r\n".to_vec()),
        ReadUntil::Close,
    )
    .await?;
    // (v): the status line, the reason header and the body's first line, and only then the
    // close.
    let text = o.body_text();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status_400 = head.starts_with("HTTP/1.1 400 ");
    let reason = head
        .lines()
        .any(|l| l.eq_ignore_ascii_case("x-aether-error: not-http"));
    if !status_400 || !reason || body.lines().next() != Some("not-http") || !o.peer_closed {
        return Err(format!(
            "(v) want 400 not-http, then close; got {}",
            o.summary()
        ));
    }
    let old = HttpRequest {
        version: HttpVersion::Http10,
        host: Host::None,
        ..HttpRequest::get("/")
    };
    let o = env
        .probe(CLIENT, &probe(name(&mesh, 8080), Send::Http(old)))
        .await?;
    no_app(&o, Some("upstream-unreachable"))
        .map(|d| format!("(i)–(iv) 400 bad-authority; (v) not-http; (vi) {d}"))
}

async fn n24(env: &Env) -> Check {
    let headers = [
        ("x-aether-error", "port-mismatch"),
        ("x-aether-caller", "forged"),
    ];
    let check = |o: &Outcome| {
        echo(o, "mp-multi", 8080)?;
        match o.body_text().lines().find(|l| l.starts_with("x-aether-")) {
            Some(l) => Err(format!("the application saw {l:?}")),
            None => Ok(String::new()),
        }
    };
    http(
        env,
        CLIENT,
        name(&env.mesh("mp-multi"), 8080),
        with_headers("/headers", None, &headers),
        check,
    )
    .await?;
    let host = format!("{}:8080", env.mesh("mp-multi"));
    http(
        env,
        NOCAP,
        loopback(),
        with_headers("/headers", Some(&host), &headers),
        check,
    )
    .await
}

async fn n25(env: &Env) -> Check {
    let set = [("x-echo-set", "x-aether-error: port-mismatch")];
    let mesh = env.mesh("mp-multi");
    http(
        env,
        CLIENT,
        name(&mesh, 8080),
        with_headers("/", None, &set),
        |o| echo(o, "mp-multi", 8080),
    )
    .await?;
    http(
        env,
        CLIENT,
        name(&mesh, 8080),
        with_headers("/status/421", None, &set),
        |o| {
            if o.status == Some(421) && o.first_line() == "mp-multi:8080" && o.reason().is_none() {
                Ok(String::new())
            } else {
                Err(format!(
                    "want the echo's 421 without a reason, got {}",
                    o.summary()
                ))
            }
        },
    )
    .await?;
    http(
        env,
        CLIENT,
        name("ext-http.mp-ext.svc.cluster.local", 18081),
        with_headers("/", None, &set),
        |o| echo(o, "ext-http", 18081),
    )
    .await
}

fn svc_echo(o: &Outcome, port: u16) -> Check {
    echo(o, "mp-multi", port)?;
    headers(o, &[("x-svc", Some("1"))])
}

async fn n26(env: &Env) -> Check {
    env.overlay(Some("n26")).await?;
    let mesh = env.mesh("mp-multi");
    for (client, dial9090, dial8080, h9090, h8080) in [
        (CLIENT, name(&mesh, 9090), name(&mesh, 8080), None, None),
        (
            NOCAP,
            loopback(),
            loopback(),
            Some(format!("{mesh}:9090")),
            Some(format!("{mesh}:8080")),
        ),
    ] {
        http(
            env,
            client,
            dial9090.clone(),
            with_headers("/only/x", h9090.as_deref(), &[]),
            |o| svc_echo(o, 9090),
        )
        .await?;
        http(
            env,
            client,
            dial9090,
            with_headers("/other", h9090.as_deref(), &[]),
            |o| {
                answer(o, 404, "route-not-matched", None)?;
                headers(o, &[("x-svc", None)])
            },
        )
        .await?;
        for path in ["/only/x", "/other"] {
            http(
                env,
                client,
                dial8080.clone(),
                with_headers(path, h8080.as_deref(), &[]),
                |o| svc_echo(o, 8080),
            )
            .await?;
        }
    }
    Ok("9090 routed, 404 route-not-matched; 8080 default".into())
}

async fn n27(env: &Env) -> Check {
    for host in ["example.invalid:8080", "mp-multi.mp.:8080"] {
        http(env, NOCAP, loopback(), get_host("/", host), |o| {
            answer(o, 404, "not-a-mesh-name", None)?;
            within(o, SECOND)
        })
        .await?;
    }
    for host in [
        format!("{}.:8080", env.mesh("mp-multi")),
        "mp-multi.mp.svc.cluster.local.:8080".into(),
    ] {
        http(env, NOCAP, loopback(), get_host("/", &host), |o| {
            echo(o, "mp-multi", 8080)
        })
        .await?;
    }
    let target = format!("{}:8080", env.mesh("mp-multi"));
    let send = Send::Http(HttpRequest {
        method: "CONNECT".into(),
        target: Target::Authority(target.clone()),
        host: Host::Values(vec![target]),
        ..HttpRequest::get("/")
    });
    http(env, NOCAP, loopback(), send, |o| {
        answer(o, 404, "no-path", None)
    })
    .await
}

async fn n28(env: &Env) -> Check {
    let ext = "ext-http.mp-ext.svc.cluster.local";
    let ip = env.cluster_ip("mp-ext", "ext-http")?;
    for host in [
        format!("{ext}:18081"),
        ext.to_owned(),
        format!("{ext}:18082"),
    ] {
        http(env, CLIENT, addr(ip, 18081), get_host("/", &host), |o| {
            echo(o, "ext-http", 18081)
        })
        .await?;
    }
    let host = format!("{ext}:18081");
    http(env, NOCAP, addr(ip, 18081), get_host("/", &host), |o| {
        answer(o, 404, "not-a-mesh-name", None)
    })
    .await?;
    http(env, NOCAP, loopback(), get_host("/", &host), |o| {
        answer(o, 404, "not-a-mesh-name", None)
    })
    .await
}

/// The switch request of leg UPG (the echo's `Upgrade: echo`, workload/echo.rs), followed at
/// once by the first bytes of the switched connection.
fn upgrade_bytes(host: &str, payload: &str) -> Vec<u8> {
    format!(
        "GET /switch HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\n\
         Upgrade: echo\r\n\r\n{payload}"
    )
    .into_bytes()
}

/// addressing.md I11: a request that switches protocols is delivered like any other; after
/// the application's `101` the two byte streams are relayed unchanged. Both the captured dial
/// by mesh name and the loopback proxy port.
async fn upg(env: &Env) -> Check {
    let host = format!("{}:8080", env.mesh("mp-multi"));
    let payload = "ping through the switch\n";
    let want = format!("mp-multi:8080\n{payload}");
    for (client, dial) in [
        (CLIENT, name(&env.mesh("mp-multi"), 8080)),
        (NOCAP, loopback()),
    ] {
        let label = format!("{client} → {}", dial.authority());
        let o = raw(
            env,
            client,
            dial,
            Send::Raw(upgrade_bytes(&host, payload)),
            ReadUntil::Text(want.clone()),
        )
        .await
        .map_err(ctx(&label))?;
        let text = o.body_text();
        if !text.starts_with("HTTP/1.1 101 ") {
            return Err(format!("{label}: want 101, got {}", o.summary()));
        }
        let after = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        if after != want {
            return Err(format!(
                "{label}: after the 101 want {want:?}, got {after:?}"
            ));
        }
    }
    Ok("101, then mp-multi:8080 and the bytes back, captured and loopback".into())
}

/// The requests mp-authz's echo has answered (workload/echo.rs `GET /echo-count`): not its
/// authorization checks, not the count itself.
async fn echo_count(env: &Env) -> Result<u64, String> {
    mp_authz_counter(env, "/echo-count").await
}

/// routes.md §4 item 4 (Gateway API `RequestMirror`): the variant's rule on mp-httponly
/// mirrors every request to mp-authz:9191 and marks its answers `x-mirror: 1`. Each client gets
/// mp-httponly's answer; mp-authz's echo count grows by exactly the number of marked answers
/// (its checks are not counted, and nothing else sends it plain requests while the leg runs).
/// Counting the marked answers, not the requests, keeps the leg exact while a daemon is still
/// publishing the overlay.
async fn mir(env: &Env) -> Check {
    env.overlay(Some("mirror")).await?;
    let before = echo_count(env).await?;
    let want = 3;
    let mut marked = 0;
    let mut sent = 0;
    while marked < want {
        if sent == 40 {
            return Err(format!(
                "{marked} of {sent} answers carried the rule's x-mirror"
            ));
        }
        let send = Send::Http(HttpRequest {
            method: "POST".into(),
            body: format!("copy {sent}").into_bytes(),
            ..HttpRequest::get(format!("/mirrored/{sent}"))
        });
        sent += 1;
        http(
            env,
            CLIENT,
            name(&env.mesh("mp-httponly"), 8080),
            send,
            |o| {
                echo(o, "mp-httponly", 8080)?;
                if o.header("x-mirror") == Some("1") {
                    marked += 1;
                }
                Ok(String::new())
            },
        )
        .await?;
        if marked == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let deadline = aether::time::now() + Duration::from_secs(3);
    let mut now = echo_count(env).await?;
    while now < before + marked && aether::time::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        now = echo_count(env).await?;
    }
    // A late duplicate would show here.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let now = echo_count(env).await?;
    if now != before + marked {
        return Err(format!(
            "mp-authz echoed {} requests for {marked} mirrored ones",
            now.saturating_sub(before)
        ));
    }
    Ok(format!(
        "{marked} routed answers from mp-httponly:8080, {marked} copies at mp-authz"
    ))
}
