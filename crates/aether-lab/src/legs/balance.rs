//! Legs of the endpoint choice (issue #38 part 3; docs/decisions.md, "Endpoint choice"): one
//! of mp-mixed's two pods stops taking mesh hops while it stays in the registry, and the load
//! from mp-client (HTTP to mp-mixed:8080 and raw TCP to mp-mixed:9000, alternately, a new
//! client connection each) must not see a single failure.
//!
//! - **EP-KILL**: between two requests of the load, once an HTTP request has reached
//!   mp-mixed-1 over a pooled hop connection, mp-mixed-1 is killed as the mesh sees a pod die:
//!   its established hop connections are reset (`ss -K` in its namespace) and every new one is
//!   refused. No request fails afterwards: the pooled connection is gone, so the next request
//!   to it connects, is refused, and goes to mp-mixed-0. (A request in flight at the instant of
//!   a kill is not retried: bytes of it may have been processed. The kill falls between two
//!   requests so that the leg asserts what the mesh promises, not a race.)
//! - **EP-APPKILL**: mp-mixed-1's application dies (its connections on 8080 reset, new ones
//!   refused) while the pod and its hop stay: its daemon cannot connect, refuses each stream
//!   unprocessed, and the source tries mp-mixed-0. HTTP only: a raw-TCP connection's bytes
//!   flow as soon as the hop is up, so one to a dead application is closed (docs/decisions.md,
//!   "Endpoint choice").
//! - **EP-REFUSE**: for 10 s mp-mixed-1 refuses every new hop connection (a reset, inside its
//!   network namespace, for each SYN to 18008). The client's daemon ejects it
//!   (`aether_endpoint_ejections_total`) and tries the other pod; once the refusal ends it
//!   returns (`aether_endpoint_returns_total`) and serves again.
//! - **EP-BLACKHOLE**: mp-mixed-1 drops every SYN to 18008. No request fails, and no more
//!   requests wait the connect timeout (slower than 0.8 s, the default being 1 s) than the
//!   ejections counted.
//!
//! Hop connections already open to mp-mixed-1 (the pooled HTTP/2 one) keep working: the rules
//! stop new connections only. Raw TCP opens a hop per client connection, so it meets the dead
//! pod every time it is chosen.

use std::time::Duration;

use super::metrics::{parse_exposition, sum};
use super::{Check, Env, Leg, Need, admin_get, echo, get, name, probe};
use crate::workload::probe::{ReadUntil, Send};

/// The legs of the endpoint choice.
pub static BALANCE: &[Leg] = &[
    leg!(
        "EP-KILL",
        "one of two endpoints killed under load (its hop connections reset, new ones refused): no HTTP or raw-TCP request fails",
        None,
        kill
    ),
    leg!(
        "EP-APPKILL",
        "one of two endpoints' application killed (its connections reset, new ones refused), the pod still served: no HTTP request fails",
        None,
        app_kill
    ),
    leg!(
        "EP-REFUSE",
        "one of two endpoints refuses hop connections for 10 s: no request fails; it is ejected, and returns",
        None,
        refuse
    ),
    leg!(
        "EP-BLACKHOLE",
        "one of two endpoints drops SYNs: no request fails, at most one waits the connect timeout per ejection",
        None,
        black_hole
    ),
];

const CLIENT: &str = "mp-client";
/// The pod that stops taking hops.
const DEAD: &str = "mp-mixed-1";
/// The pod that keeps serving.
const LIVE: &str = "mp-mixed-0";
/// The dead pod's hop port.
const HOP: u16 = 18008;
/// The dead pod's application port that EP-APPKILL stops (HTTP).
const APP: u16 = 8080;
/// How long EP-APPKILL's load runs: less than three delegated probes (2 s apart) on the etcd
/// source, so that the pod stays Ready and the choice, not readiness, is what is tested.
const APP_LOAD: Duration = Duration::from_secs(3);
/// How long EP-REFUSE refuses.
const REFUSING: Duration = Duration::from_secs(10);
/// How long EP-BLACKHOLE's load runs.
const HOLE_LOAD: Duration = Duration::from_secs(8);
/// A request slower than this waited for the hole (0.8× the default connect timeout, 1 s).
const WAITED: Duration = Duration::from_millis(800);
/// The bound on waiting for the dead pod to serve again once the rule is gone: past the
/// longest ejection (30 s), on a slow machine.
const RETURN_BOUND: Duration = Duration::from_secs(90);

/// One request of the load, on a new client connection: HTTP to mp-mixed:8080 or raw TCP to
/// mp-mixed:9000. The pod that answered and how long it took.
async fn one(env: &Env, http: bool) -> Result<(String, Duration), String> {
    let mixed = env.mesh("mp-mixed");
    let mut p = if http {
        probe(name(&mixed, 8080), get("/"))
    } else {
        let mut p = probe(name(&mixed, 9000), Send::Raw(b"ping\n".to_vec()));
        p.until = ReadUntil::Text("ping".into());
        p
    };
    // Generous: a request that waits the connect timeout once still fits on a slow machine.
    p.timeout = Duration::from_secs(15);
    let started = aether::time::now();
    let o = env.probe(CLIENT, &p).await?;
    let took = started.elapsed();
    let pod = if http {
        echo(&o, "mp-mixed", 8080).map_err(|e| format!("http: {e}"))?;
        o.header("x-echo-pod").unwrap_or_default().to_owned()
    } else {
        let text = o.body_text();
        if !(text.starts_with("mp-mixed:9000\npod ") && text.ends_with("ping\n")) {
            return Err(format!(
                "raw tcp: want the echo of mp-mixed:9000, got {}",
                o.summary()
            ));
        }
        text.lines()
            .nth(1)
            .and_then(|l| l.strip_prefix("pod "))
            .unwrap_or_default()
            .to_owned()
    };
    Ok((pod, took))
}

/// What a run of the load saw.
#[derive(Debug, Default)]
struct Seen {
    requests: usize,
    /// Requests slower than [`WAITED`].
    waited: usize,
    /// Requests that reached [`DEAD`].
    dead: usize,
    /// HTTP requests that reached [`DEAD`] (over its pooled hop connection).
    dead_http: usize,
    /// Raw-TCP connections that reached [`DEAD`] (each over a new hop connection).
    dead_tcp: usize,
}

/// The load, HTTP and raw TCP in turn (with `http_only`, HTTP alone), until `stop` says so;
/// the first failure ends it.
async fn load(
    env: &Env,
    http_only: bool,
    mut stop: impl FnMut(&Seen) -> bool,
) -> Result<Seen, String> {
    let mut seen = Seen::default();
    while !stop(&seen) {
        let http = http_only || seen.requests.is_multiple_of(2);
        let (pod, took) = one(env, http)
            .await
            .map_err(|e| format!("request {} failed: {e}", seen.requests))?;
        seen.requests += 1;
        if took > WAITED {
            seen.waited += 1;
        }
        if pod == DEAD {
            seen.dead += 1;
            seen.dead_http += usize::from(http);
            seen.dead_tcp += usize::from(!http);
        } else if pod != LIVE {
            return Err(format!("request {} answered by {pod:?}", seen.requests));
        }
    }
    Ok(seen)
}

/// The sum over every daemon of the samples of `metric` with `labels` (all of them: none, the
/// whole metric).
pub(super) async fn metric_sum(
    env: &Env,
    metric: &str,
    labels: &[(&str, &str)],
) -> Result<f64, String> {
    let reg = env
        .registry
        .as_ref()
        .ok_or_else(|| env.not_here(Need::DaemonSockets))?;
    let mut total = 0.0;
    for s in &reg.admin_sockets {
        let samples = parse_exposition(&admin_get(s, "/metrics").await?)?;
        total += sum(&samples, metric, labels);
    }
    Ok(total)
}

/// Ejections and returns counted so far, over every daemon.
async fn ejections_and_returns(env: &Env) -> Result<(f64, f64), String> {
    Ok((
        metric_sum(env, "aether_endpoint_ejections_total", &[]).await?,
        metric_sum(env, "aether_endpoint_returns_total", &[]).await?,
    ))
}

/// Stop (with `verdict` None: take back) new connections to `port` of [`DEAD`] (its hop,
/// [`HOP`], or its application, [`APP`]): inside its network namespace, each SYN is reset
/// (`reject`) or dropped (`drop`).
async fn syns(env: &Env, port: u16, verdict: Option<&str>) -> Result<(), String> {
    let netns = env.client_netns(DEAD)?.path().to_owned();
    let ip = env.pod_ip("mp", DEAD)?;
    let script = match verdict {
        Some(v) => format!(
            "table inet aether_lab_balance {{\n  chain input {{\n    type filter hook input priority -300; policy accept;\n    ip daddr {ip} tcp dport {port} tcp flags & (syn | ack) == syn {v}\n  }}\n}}\n"
        ),
        None => "delete table inet aether_lab_balance\n".to_owned(),
    };
    tokio::task::spawn_blocking(move || {
        let mut enter = std::process::Command::new("nsenter");
        enter.arg(format!("--net={}", netns.display())).arg("nft");
        super::etcd::nft(enter, &script)
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Runs `f` with [`DEAD`]'s hop SYNs met by `verdict`, and takes the rule back however `f`
/// ends.
async fn with_rule<T>(
    env: &Env,
    port: u16,
    verdict: &str,
    f: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    // A rule an earlier run left (killed before its end) goes first.
    let _ = syns(env, port, None).await;
    syns(env, port, Some(verdict)).await?;
    let out = f.await;
    syns(env, port, None).await?;
    out
}

/// Reset every established connection to `port` of [`DEAD`] (the sockets on its side, in its
/// namespace): its hop's, as its daemon does when the pod goes, or its application's, as when
/// the application's process dies.
async fn reset_established(env: &Env, port: u16) -> Result<(), String> {
    let netns = env.client_netns(DEAD)?.path().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .args([
                "ss",
                "-K",
                "-t",
                "state",
                "established",
                &format!("( sport = :{port} )"),
            ])
            .output()
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("ss -K: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ss -K: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The load for `during` while [`DEAD`]'s hop SYNs are met by `verdict` (its established hop
/// connections reset first, with `reset`): what it saw, and the ejections counted meanwhile
/// (at least one, or the error says none was counted `what`).
async fn ejecting_load(
    env: &Env,
    port: u16,
    verdict: &str,
    reset: bool,
    during: Duration,
    what: &str,
) -> Result<(Seen, f64), String> {
    let (ejected_before, _) = ejections_and_returns(env).await?;
    let seen = with_rule(env, port, verdict, async {
        if reset {
            reset_established(env, port).await?;
        }
        let started = aether::time::now();
        load(env, port == APP, |_| started.elapsed() >= during).await
    })
    .await?;
    let (ejected, _) = ejections_and_returns(env).await?;
    let ejected = ejected - ejected_before;
    if ejected < 1.0 {
        return Err(format!(
            "no ejection of {DEAD} counted in {} requests {what}",
            seen.requests
        ));
    }
    Ok((seen, ejected))
}

async fn kill(env: &Env) -> Check {
    // Until an HTTP request has reached the pod over its pooled hop connection.
    let before = until_dead_serves(env, false, true).await?;
    let (after, ejected) = ejecting_load(
        env,
        HOP,
        "reject with tcp reset",
        true,
        HOLE_LOAD,
        "after the kill",
    )
    .await?;
    if after.dead > 0 {
        return Err(format!(
            "{} requests reached {DEAD} after its kill",
            after.dead
        ));
    }
    Ok(format!(
        "{} requests before the kill ({} reached {DEAD}), {} after it (HTTP and raw TCP), 0 failed; {ejected} ejections",
        before.requests, before.dead, after.requests
    ))
}

/// Load (HTTP alone with `http_only`) until an HTTP request (with `http_only`, or `by_http`)
/// or a raw-TCP connection has reached [`DEAD`]: it may still be out of the choice after an
/// earlier leg, and the leg must start with it in. What the load saw.
async fn until_dead_serves(env: &Env, http_only: bool, by_http: bool) -> Result<Seen, String> {
    let started = aether::time::now();
    let reached = |s: &Seen| if by_http { s.dead_http } else { s.dead_tcp };
    let before = load(env, http_only, |s| {
        reached(s) > 0 || started.elapsed() > RETURN_BOUND
    })
    .await?;
    if reached(&before) == 0 {
        return Err(format!(
            "{DEAD} was not reached in {} requests",
            before.requests
        ));
    }
    Ok(before)
}

async fn app_kill(env: &Env) -> Check {
    until_dead_serves(env, true, true).await?;
    let (after, ejected) = ejecting_load(
        env,
        APP,
        "reject with tcp reset",
        true,
        APP_LOAD,
        "after its application's kill",
    )
    .await?;
    if after.dead > 0 {
        return Err(format!(
            "{} requests reached {DEAD}'s application after its kill",
            after.dead
        ));
    }
    Ok(format!(
        "{} HTTP requests after {DEAD}'s application was killed, 0 failed (its daemon refused the streams unprocessed, the source tried {LIVE}); {ejected} ejections",
        after.requests
    ))
}

async fn refuse(env: &Env) -> Check {
    until_dead_serves(env, false, false).await?;
    let (_, returned_before) = ejections_and_returns(env).await?;
    let (refusing, ejected) = ejecting_load(
        env,
        HOP,
        "reject with tcp reset",
        false,
        REFUSING,
        "while it refused",
    )
    .await?;
    // The refusal is over: the load goes on until the dead pod serves again.
    let started = aether::time::now();
    let after = load(env, false, |s| {
        s.dead > 0 || started.elapsed() > RETURN_BOUND
    })
    .await?;
    if after.dead == 0 {
        return Err(format!(
            "{DEAD} did not serve again within {RETURN_BOUND:?} of the end of its refusal"
        ));
    }
    let (_, returned) = ejections_and_returns(env).await?;
    let returned = returned - returned_before;
    if returned < 1.0 {
        return Err(format!("{DEAD} serves again but no return was counted"));
    }
    Ok(format!(
        "{} requests while {DEAD} refused (HTTP and raw TCP), 0 failed, {} reached it (kept connections); {ejected} ejections; then {} requests until it served again, {returned} returns",
        refusing.requests, refusing.dead, after.requests
    ))
}

async fn black_hole(env: &Env) -> Check {
    until_dead_serves(env, false, false).await?;
    let (seen, ejected) =
        ejecting_load(env, HOP, "drop", false, HOLE_LOAD, "while it dropped SYNs").await?;
    if seen.waited as f64 > ejected {
        return Err(format!(
            "{} of {} requests waited the connect timeout, for {ejected} ejections",
            seen.waited, seen.requests
        ));
    }
    Ok(format!(
        "{} requests (HTTP and raw TCP), 0 failed; {} waited the connect timeout, {ejected} ejections",
        seen.requests, seen.waited
    ))
}
