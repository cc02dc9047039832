//! Legs of issue #8: traffic an attacker or a bad day sends, through real sockets and the
//! real capture rules. Each leg checks what the peer gets and that the daemon is still whole
//! afterwards (its admin socket answers, its open connections are back near zero).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::overload::overload;
use super::traffic::{load_until, one_request, raw_stream, read_echo};
use super::{Check, Env, Leg, Need, admin_get, echo, name, probe};
use crate::workload::probe::{Connector, HttpRequest, Send};

/// The hostile-traffic legs, run after the rule legs.
pub static HOSTILE: &[Leg] = &[
    leg!(
        "SELFDIAL",
        "a connection to a pod's 18001 or 18008 is refused or closed; the daemon never dials itself",
        None,
        self_dial
    ),
    leg!(
        "ZT-PLAIN",
        "plaintext around the mesh is refused where service-level rbac applies, served where none does",
        Some("deny-rbac"),
        zt_plain
    ),
    leg!(
        "ZT-TCP",
        "service-level rbac decides raw TCP over the hop at connection level",
        Some("deny-rbac-tcp"),
        zt_tcp
    ),
    leg!(
        "ZT-L4",
        "a passthrough to a mesh pod crosses the hop as bytes, and the destination's rbac decides",
        Some("deny-rbac"),
        zt_l4
    ),
    leg!(
        "UPGRADE",
        "a daemon upgraded under load hands its sockets over: no new connection fails, raw streams run to the drain",
        None,
        upgrade
    ),
    leg!(
        "ZT-STRICT",
        "a strict pod refuses plaintext from outside the mesh; the mesh and its node still reach it",
        None,
        zt_strict
    ),
    leg!(
        "SAME-MODEL",
        "a registry change the mesh does not read (an annotation of another tool) is read by every daemon and publishes no new model",
        None,
        same_model
    ),
    leg!(
        "POLICY",
        "an ext_authz the daemon cannot read: its Service refuses 403 authz-unavailable on every path, plaintext too, with a diagnostic",
        None,
        policy
    ),
    leg!(
        "OVERLOAD",
        "a daemon in a 256 MiB memory cgroup, flooded with held HTTP/2 streams and 8,000 half-written heads: not killed, sheds by its counters, its pods' established traffic served throughout",
        None,
        overload
    ),
    leg!(
        "DUP-ADDR",
        "a row of another service claiming a pod's address: every claimant's inbound protection kept, pod-IP dials refused until it goes",
        None,
        dup_addr
    ),
];

const CLIENT: &str = "mp-client";
const OUTSIDE: &str = "ext-http-0";
/// How long the connections a leg opened may take to close once it is done with them.
const WHOLE_BOUND: Duration = Duration::from_secs(10);

/// Connect from `pod` to `dst`, send `bytes`, and say how the connection ended: `Ok` with the
/// bytes read before the end, or `Err` when it was still open after `within`.
async fn ends(env: &Env, pod: &str, dst: SocketAddr, bytes: &[u8], within: Duration) -> Check {
    let netns = env.client_netns(pod)?;
    let socket = Connector::in_netns(netns.clone(), env.home.clone())
        .tcp_socket(dst)
        .map_err(|e| e.to_string())?;
    let mut s: TcpStream = match tokio::time::timeout(within, socket.connect(dst)).await {
        Err(_) => return Err(format!("{pod} → {dst}: connect hung")),
        Ok(Err(e)) => return Ok(format!("refused ({})", e.kind())),
        Ok(Ok(s)) => s,
    };
    let _ = s.write_all(bytes).await;
    let mut got = Vec::new();
    match tokio::time::timeout(within, s.read_to_end(&mut got)).await {
        Err(_) => Err(format!("{pod} → {dst}: still open after {within:?}")),
        Ok(Err(e)) => Ok(format!("reset ({})", e.kind())),
        Ok(Ok(_)) if got.is_empty() => Ok("closed".into()),
        // The hop speaks only TLS: bytes that are not get a TLS alert record, then the end.
        Ok(Ok(_)) if dst.port() == aether_core::wire::HOP_PORT && got[0] == 0x15 => {
            Ok("TLS alert, closed".into())
        }
        Ok(Ok(_)) => Err(format!(
            "{pod} → {dst}: answered {:?}",
            String::from_utf8_lossy(&got)
        )),
    }
}

/// Every daemon's open connections (`aether_active_connections`), after checking that its
/// admin socket answers `/live`.
async fn open_connections(env: &Env) -> Result<Vec<i64>, String> {
    let Some(reg) = &env.registry else {
        return Err(env.not_here(Need::RegistryControl));
    };
    let mut out = Vec::new();
    for socket in &reg.admin_sockets {
        admin_get(socket, "/live").await?;
        let metrics = admin_get(socket, "/metrics").await?;
        let active = metrics
            .lines()
            .find_map(|l| l.strip_prefix("aether_active_connections "))
            .and_then(|v| v.trim().parse::<i64>().ok())
            .ok_or("no aether_active_connections on /metrics")?;
        out.push(active);
    }
    Ok(out)
}

/// Every daemon is live and holds at most `slack` more connections than `before` (kept
/// connections of earlier legs are allowed to stay; a loop or a leak is not).
async fn daemons_whole(env: &Env, before: &[i64], slack: i64) -> Check {
    // The leg's own connections close as their peers see the end: waited for, with a bound a
    // machine four times slower keeps, rather than read once after a pause.
    let deadline = aether::time::now() + WHOLE_BOUND;
    let after = loop {
        let after = open_connections(env).await?;
        let over = before
            .iter()
            .zip(&after)
            .find(|(b, a)| **a > **b + slack)
            .map(|(b, a)| (*b, *a));
        match over {
            None => break after,
            Some((b, a)) if aether::time::now() > deadline => {
                return Err(format!(
                    "open connections went from {b} to {a} during the leg, and were still {a} after {WHOLE_BOUND:?}"
                ));
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let show = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join("/");
    Ok(format!(
        "daemons live, open connections {} before, {} after",
        show(before),
        show(&after)
    ))
}

async fn self_dial(env: &Env) -> Check {
    let client_ip = env.pod_ip("mp", "mp-client")?;
    let multi_ip = env.pod_ip("mp", "mp-multi-0")?;
    let within = Duration::from_secs(3);
    let before = open_connections(env).await?;
    let mut seen = Vec::new();
    // From outside the mesh, to a managed pod's capture port and hop; from a mesh pod, to its
    // own capture port and another pod's hop (both captured dials).
    for (pod, dst, bytes) in [
        (
            OUTSIDE,
            SocketAddr::new(client_ip, 18001),
            &b"GET / HTTP/1.1\r\n\r\n"[..],
        ),
        (OUTSIDE, SocketAddr::new(multi_ip, 18001), b"hello\n"),
        (
            OUTSIDE,
            SocketAddr::new(multi_ip, 18008),
            b"GET / HTTP/1.1\r\n\r\n",
        ),
        (CLIENT, SocketAddr::new(client_ip, 18001), b"hello\n"),
        (CLIENT, SocketAddr::new(multi_ip, 18008), b"hello\n"),
    ] {
        let how = ends(env, pod, dst, bytes, within).await?;
        seen.push(format!("{pod}→{dst}: {how}"));
    }
    // The daemon is still whole: no connection left behind, and it still serves.
    let whole = daemons_whole(env, &before, 3).await?;
    let o = env
        .probe(
            CLIENT,
            &probe(
                name(&env.mesh("mp-multi"), 8080),
                Send::Http(HttpRequest::get("/")),
            ),
        )
        .await?;
    echo(&o, "mp-multi", 8080)?;
    Ok(format!(
        "{}; {whole}; mp-multi:8080 still 200",
        seen.join(", ")
    ))
}

/// One plaintext HTTP/1.1 GET from `pod` straight to `dst` (no mesh on the way unless the
/// client's capture takes it): `Ok(Some(first line and body))`, or `Ok(None)` when the
/// connection was refused or reset before an answer.
async fn plaintext_get(env: &Env, pod: &str, dst: SocketAddr) -> Result<Option<String>, String> {
    let netns = env.client_netns(pod)?;
    let socket = Connector::in_netns(netns.clone(), env.home.clone())
        .tcp_socket(dst)
        .map_err(|e| e.to_string())?;
    let mut s = match tokio::time::timeout(Duration::from_secs(3), socket.connect(dst)).await {
        Err(_) => return Err(format!("{pod} → {dst}: connect hung")),
        Ok(Err(_)) => return Ok(None),
        Ok(Ok(s)) => s,
    };
    let req = format!("GET / HTTP/1.1\r\nHost: {dst}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return Ok(None);
    }
    let mut got = Vec::new();
    match tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut got)).await {
        Err(_) => Err(format!("{pod} → {dst}: no answer within 3 s")),
        Ok(Err(_)) => Ok(None),
        Ok(Ok(_)) if got.is_empty() => Ok(None),
        Ok(Ok(_)) => {
            let text = String::from_utf8_lossy(&got);
            let first = text.lines().next().unwrap_or("").to_owned();
            let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).trim();
            Ok(Some(format!("{first} {body}")))
        }
    }
}

/// `pod` reaches `dst` in plaintext and the echo `identity` answers.
async fn plaintext_served(env: &Env, pod: &str, dst: SocketAddr, identity: &str) -> Check {
    match plaintext_get(env, pod, dst).await? {
        Some(a) if a.starts_with("HTTP/1.1 200") && a.contains(identity) => {
            Ok(format!("{pod}→{dst} served"))
        }
        Some(a) => Err(format!("{pod} → {dst}: want 200 {identity}, got {a:?}")),
        None => Err(format!("{pod} → {dst}: refused, want it served")),
    }
}

/// `pod`'s plaintext to `dst` is refused before any answer.
async fn plaintext_refused(env: &Env, pod: &str, dst: SocketAddr) -> Check {
    match plaintext_get(env, pod, dst).await? {
        None => Ok(format!("{pod}→{dst} refused")),
        Some(a) => Err(format!("{pod} → {dst}: want refused, got {a:?}")),
    }
}

async fn zt_plain(env: &Env) -> Check {
    let httponly = SocketAddr::new(env.pod_ip("mp", "mp-httponly-0")?, 8080);
    let eighty = SocketAddr::new(env.pod_ip("mp", "mp-eighty-0")?, 8080);
    let mut seen = Vec::new();
    // Permissive and unguarded: plaintext from outside the mesh is the application's business.
    env.overlay(None).await?;
    seen.push(plaintext_served(env, OUTSIDE, httponly, "mp-httponly:8080").await?);
    // A service-level rbac guards mp-httponly: plaintext from an unmanaged pod and from a
    // scoped pod (its dial is not captured) would skip it, so both are refused.
    env.overlay(Some("deny-rbac")).await?;
    seen.push(plaintext_refused(env, OUTSIDE, httponly).await?);
    seen.push(plaintext_refused(env, "mp-client-nocapture", httponly).await?);
    // An unguarded pod next to it is still served, and the node (kubelet) still reaches the
    // guarded one.
    seen.push(plaintext_served(env, OUTSIDE, eighty, "mp-eighty:8080").await?);
    seen.push(plaintext_served(env, "node:node-a", httponly, "mp-httponly:8080").await?);
    // Through the mesh the rbac decides: the allowed identity is delivered.
    let o = env
        .probe(
            "mp-client-other",
            &probe(
                name(&env.mesh("mp-httponly"), 8080),
                Send::Http(HttpRequest::get("/")),
            ),
        )
        .await?;
    echo(&o, "mp-httponly", 8080)?;
    // The filter gone, plaintext is served again.
    env.overlay(None).await?;
    seen.push(plaintext_served(env, OUTSIDE, httponly, "mp-httponly:8080").await?);
    Ok(format!(
        "{}; mp-client-other through the mesh 200",
        seen.join(", ")
    ))
}

/// The annotation that makes mp-nine-0 strict, added in its own manifest.
const STRICT_NINE: (&str, &str) = (
    "    aether.io/netns: \"mp-nine-0\"\n",
    "    aether.io/netns: \"mp-nine-0\"\n    inbound.aether.io/mode: \"strict\"\n",
);

/// Rewrite the watched registry's `file` (by an atomic rename, as docs/node.md asks of
/// generators) with `from` replaced by `to`, and wait until every daemon published it.
async fn rewrite_registry(env: &Env, file: &str, from: &str, to: &str) -> Result<(), String> {
    let Some(reg) = &env.registry else {
        return Err(env.not_here(Need::RegistryControl));
    };
    let path = reg.dir.join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !text.contains(from) {
        return Err(format!("{}: {from:?} not found", path.display()));
    }
    let tmp = reg.dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text.replacen(from, to, 1)).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, &path).map_err(|e| e.to_string())?;
    env.settle().await
}

/// An annotation of another tool, which aether does not read, added to mp-nine-0's manifest.
const FOREIGN_ANNOTATION: (&str, &str) = (
    STRICT_NINE.0,
    "    aether.io/netns: \"mp-nine-0\"\n    example.com/owner: \"team-a\"\n",
);

/// Every daemon's model generation (`/model`).
async fn generations(env: &Env) -> Result<Vec<u64>, String> {
    let Some(reg) = &env.registry else {
        return Err(env.not_here(Need::RegistryControl));
    };
    let mut out = Vec::new();
    for socket in &reg.admin_sockets {
        let body = admin_get(socket, "/model").await?;
        let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        out.push(v["generation"].as_u64().ok_or("no generation on /model")?);
    }
    Ok(out)
}

/// issue #36 item 6: a reload whose model serves as the published one publishes nothing. The
/// settle waits until every daemon holds the changed registry (its fingerprint), so each has
/// read and compiled it.
async fn same_model(env: &Env) -> Check {
    env.settle().await?;
    let before = generations(env).await?;
    let (plain, annotated) = FOREIGN_ANNOTATION;
    rewrite_registry(env, "10-mp-nine.yaml", plain, annotated).await?;
    let annotated_at = generations(env).await;
    rewrite_registry(env, "10-mp-nine.yaml", annotated, plain).await?;
    let annotated_at = annotated_at?;
    let restored = generations(env).await?;
    if annotated_at != before || restored != before {
        return Err(format!(
            "model generations {before:?} before, {annotated_at:?} with the annotation, {restored:?} without it again: a model that serves alike was published again"
        ));
    }
    Ok(format!(
        "the annotation added and removed, each read by all {} daemons; generations {before:?} kept",
        before.len()
    ))
}

async fn zt_strict(env: &Env) -> Check {
    let (plain, strict) = STRICT_NINE;
    rewrite_registry(env, "10-mp-nine.yaml", plain, strict).await?;
    let out = zt_strict_checks(env).await;
    rewrite_registry(env, "10-mp-nine.yaml", strict, plain).await?;
    out
}

async fn zt_strict_checks(env: &Env) -> Check {
    let nine = SocketAddr::new(env.pod_ip("mp", "mp-nine-0")?, 9000);
    let mut seen = vec![
        plaintext_refused(env, OUTSIDE, nine).await?,
        plaintext_refused(env, "mp-client-nocapture", nine).await?,
        plaintext_served(env, "node:node-a", nine, "mp-nine:9000").await?,
    ];
    // A mesh pod's dial of the same address is captured and crosses the hop: served.
    let o = env
        .probe(
            CLIENT,
            &probe(
                super::addr(nine.ip(), 9000),
                Send::Http(HttpRequest::get("/")),
            ),
        )
        .await?;
    echo(&o, "mp-nine", 9000)?;
    seen.push("mp-client pod-IP dial over the hop served".into());
    Ok(seen.join(", "))
}

/// Send `line` on a raw TCP connection from `pod` to `dst` and read what comes back until the
/// peer closes or 2 s pass: the bytes, and whether the peer closed.
async fn raw_exchange(
    env: &Env,
    pod: &str,
    dst: SocketAddr,
    line: &[u8],
) -> Result<(Vec<u8>, bool), String> {
    let netns = env.client_netns(pod)?;
    let socket = Connector::in_netns(netns.clone(), env.home.clone())
        .tcp_socket(dst)
        .map_err(|e| e.to_string())?;
    let mut s = tokio::time::timeout(Duration::from_secs(3), socket.connect(dst))
        .await
        .map_err(|_| format!("{pod} → {dst}: connect hung"))?
        .map_err(|e| format!("{pod} → {dst}: {e}"))?;
    let _ = s.write_all(line).await;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return Ok((got, false)),
            Ok(Ok(0) | Err(_)) => return Ok((got, true)),
            Ok(Ok(n)) => {
                got.extend_from_slice(&buf[..n]);
                if got.ends_with(b"\n") {
                    return Ok((got, false));
                }
            }
        }
    }
}

/// The sum of one counter over every daemon's `/metrics`.
async fn counter_sum(env: &Env, name: &str) -> Result<u64, String> {
    let Some(reg) = &env.registry else {
        return Err(env.not_here(Need::RegistryControl));
    };
    let mut sum = 0;
    for socket in &reg.admin_sockets {
        let metrics = admin_get(socket, "/metrics").await?;
        sum += metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}_total ")))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| format!("no {name}_total on /metrics"))?;
    }
    Ok(sum)
}

async fn zt_tcp(env: &Env) -> Check {
    env.overlay(Some("deny-rbac-tcp")).await?;
    let mixed = SocketAddr::new(env.cluster_ip("mp", "mp-mixed")?, 9000);
    let before = counter_sum(env, "aether_l4_denied").await?;
    // Denied: closed at the destination, nothing echoed.
    let (got, closed) = raw_exchange(env, CLIENT, mixed, b"denied\n").await?;
    if !got.is_empty() || !closed {
        return Err(format!(
            "mp-client → mp-mixed:9000: want closed with nothing echoed, got {:?} (closed: {closed})",
            String::from_utf8_lossy(&got)
        ));
    }
    let after = counter_sum(env, "aether_l4_denied").await?;
    if after != before + 1 {
        return Err(format!(
            "aether_l4_denied went from {before} to {after}, want +1"
        ));
    }
    // The one identity the rule allows gets its bytes back.
    let (got, _) = raw_exchange(env, "mp-client-other", mixed, b"allowed\n").await?;
    if !String::from_utf8_lossy(&got).contains("allowed") {
        return Err(format!(
            "mp-client-other → mp-mixed:9000: want the echo of its bytes, got {:?}",
            String::from_utf8_lossy(&got)
        ));
    }
    // And plaintext around the mesh to the guarded raw port is refused (item 3).
    let pod = SocketAddr::new(env.pod_ip("mp", "mp-mixed-0")?, 9000);
    let refused = ends(env, OUTSIDE, pod, b"plain\n", Duration::from_secs(3)).await?;
    if !refused.starts_with("refused") && !refused.starts_with("reset") {
        return Err(format!("{OUTSIDE} → {pod}: want refused, got {refused}"));
    }
    Ok(format!(
        "mp-client closed before a byte (aether_l4_denied +1), mp-client-other echoed, {OUTSIDE}→{pod} {refused}"
    ))
}

async fn zt_l4(env: &Env) -> Check {
    env.overlay(None).await?;
    // mp-owned's user Service names no route: its ClusterIP is not the mesh's, and bytes that
    // are not HTTP would be passed through the cluster. Its endpoints are mesh pods, so the
    // bytes cross the hop (model.md §12.5 item 1); the application answers them as before.
    let owned = SocketAddr::new(env.cluster_ip("mp", "mp-owned")?, 80);
    let hops = counter_sum(env, "aether_l4_hops").await?;
    let (got, _) = raw_exchange(env, CLIENT, owned, b"hello there\r\n\r\n").await?;
    let text = String::from_utf8_lossy(&got).into_owned();
    if !text.starts_with("HTTP/1.1 400") || text.to_ascii_lowercase().contains("x-aether-error") {
        return Err(format!(
            "mp-client → mp-owned:80 (not HTTP): want the application's own 400, got {text:?}"
        ));
    }
    let after = counter_sum(env, "aether_l4_hops").await?;
    if after != hops + 1 {
        return Err(format!(
            "aether_l4_hops went from {hops} to {after}, want +1"
        ));
    }
    // An HTTP request passed through (the Kubernetes name of a meshOnly service is not the
    // mesh's, N15) goes over the hop too, on a kept connection to the endpoint picked.
    let o = env
        .probe(
            CLIENT,
            &probe(
                name("mp-owned.mp.svc.cluster.local", 80),
                Send::Http(HttpRequest::get("/")),
            ),
        )
        .await?;
    echo(&o, "mp-owned", 8080)?;
    let http_hops = counter_sum(env, "aether_l4_hops").await?;
    if http_hops <= after {
        return Err(format!(
            "an HTTP passthrough to mp-owned left aether_l4_hops at {http_hops}: it went in plaintext"
        ));
    }
    // A pod-IP dial to a declared HTTP port with bytes that are not HTTP: carried over the hop
    // too, so mp-httponly's service-level rbac decides at connection level.
    env.overlay(Some("deny-rbac")).await?;
    let pod = SocketAddr::new(env.pod_ip("mp", "mp-httponly-0")?, 8080);
    let denied = counter_sum(env, "aether_l4_denied").await?;
    let (got, closed) = raw_exchange(env, CLIENT, pod, b"hello there\r\n\r\n").await?;
    if !got.is_empty() || !closed {
        return Err(format!(
            "mp-client → {pod} (not HTTP): want closed by the rbac, got {:?}",
            String::from_utf8_lossy(&got)
        ));
    }
    let after = counter_sum(env, "aether_l4_denied").await?;
    if after != denied + 1 {
        return Err(format!(
            "aether_l4_denied went from {denied} to {after}, want +1"
        ));
    }
    let (got, _) = raw_exchange(env, "mp-client-other", pod, b"hello there\r\n\r\n").await?;
    if !String::from_utf8_lossy(&got).starts_with("HTTP/1.1 400") {
        return Err(format!(
            "mp-client-other → {pod}: want the application's 400, got {:?}",
            String::from_utf8_lossy(&got)
        ));
    }
    Ok("mp-owned's ClusterIP over the hop (aether_l4_hops +1, bytes and HTTP); pod-IP non-HTTP bytes refused by rbac (aether_l4_denied +1), allowed caller reaches the app".into())
}

async fn upgrade(env: &Env) -> Check {
    let (Some(hook), Some(retire)) = (&env.upgrade, &env.retire) else {
        return Err(env.not_here(Need::DaemonProcesses));
    };
    // Every daemon serves the registry as it is (on etcd: every pod's row written), so that
    // the leg holds wherever it runs in the order, first included (`--leg UPGRADE --repeat`).
    if env.registry.is_some() {
        env.settle().await?;
    }
    // A raw stream through node-a's daemon, open across the upgrade.
    let mut raw = raw_stream(env).await?;
    // Load: new connections, captured and loopback, while node-a's daemon is upgraded.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let load = load_until(env, &stop, Duration::ZERO, 20);
    let upgrade = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let up = (hook.0)("node-a".to_owned()).await;
        // The old daemon has stopped accepting: the raw stream it carries still runs. Then it
        // is stopped (its pod deleted), and drains.
        let after = match &up {
            Ok(()) => {
                let sent = raw.write_all(b"after\n").await.map_err(|e| e.to_string());
                match sent {
                    Ok(()) => match read_echo(&mut raw, "after").await {
                        Ok(()) => (retire.0)("node-a".to_owned()).await,
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e.clone()),
        };
        tokio::time::sleep(Duration::from_millis(700)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (up, after)
    };
    let ((ok, failed), (up, after)) = tokio::join!(load, upgrade);
    up.map_err(|e| format!("upgrade: {e}"))?;
    after.map_err(|e| format!("the raw stream after the handoff: {e}"))?;
    if !failed.is_empty() {
        return Err(format!(
            "{} of {} requests failed during the upgrade; first: {}",
            failed.len(),
            ok as usize + failed.len(),
            failed[0]
        ));
    }
    if ok < 20 {
        return Err(format!("only {ok} requests during the upgrade"));
    }
    // At the old daemon's drain deadline (after its SIGTERM) the raw stream ends.
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(15), raw.read_to_end(&mut rest)).await;
    if ended.is_err() {
        return Err("the raw stream outlived the old daemon's drain deadline".into());
    }
    one_request(env, true)
        .await
        .map_err(|e| format!("after the upgrade: {e}"))?;
    Ok(format!(
        "{ok} requests on new connections (captured and loopback), 0 failed; the raw stream echoed across the handoff and ended at the drain deadline"
    ))
}

/// The address the intruder's row claims: mp-multi-0's.
const CLAIMED_POD: &str = "mp-multi-0";

/// Whether every daemon's `/model` lists a `duplicate-address` diagnostic for `ip`.
async fn claimed_everywhere(env: &Env, ip: std::net::IpAddr, want: bool) -> Result<(), String> {
    diagnosed_everywhere(env, "duplicate-address", &ip.to_string(), want).await
}

/// Wait (30 s at most) until every daemon's `/model` does (or does not) list a diagnostic of
/// `kind` about `subject`.
pub(super) async fn diagnosed_everywhere(
    env: &Env,
    kind: &str,
    subject: &str,
    want: bool,
) -> Result<(), String> {
    let Some(reg) = &env.registry else {
        return Err(env.not_here(Need::RegistryControl));
    };
    let deadline = aether::time::now() + Duration::from_secs(30);
    loop {
        let mut agree = true;
        for socket in &reg.admin_sockets {
            let body = admin_get(socket, "/model").await?;
            let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            let listed = v["diagnostics"].as_array().is_some_and(|ds| {
                ds.iter()
                    .any(|d| d["kind"] == kind && d["subject"] == subject)
            });
            agree &= listed == want;
        }
        if agree {
            return Ok(());
        }
        if aether::time::now() > deadline {
            return Err(format!(
                "the daemons did not {} the {kind} diagnostic for {subject} within 30 s",
                if want { "list" } else { "drop" }
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The row that claims mp-multi-0's address: a pod of mp-eighty (which sorts before mp-multi,
/// so the first row in sort order would have taken the address), on a node no daemon runs. An
/// existing service, so that no service appears and vanishes with the claim (a vanished one is
/// retained for 90 s, and the node recompiles meanwhile).
fn intruder_row(ip: std::net::IpAddr) -> aether_core::model::snapshot::Row {
    use aether_core::model::port::PortProtocol;
    use aether_core::model::snapshot::ProtocolValue;
    aether_core::model::snapshot::Row {
        namespace: "mp".into(),
        service: INTRUDER.into(),
        address: ip,
        port: 8080,
        ports: vec![8080],
        port_protocols: Some(std::collections::BTreeMap::from([(
            8080,
            ProtocolValue::Known(PortProtocol::Http),
        )])),
        ready: true,
        pod: Some("mp-eighty-9".into()),
        node: Some("node-c".into()),
    }
}

/// The service whose row claims mp-multi-0's address.
const INTRUDER: &str = "mp-eighty";

/// Make the claim (or take it away): on the etcd source a row written by hand, elsewhere the
/// overlay `variants/dup-addr` (the same row as a Pod document); then wait until every daemon
/// (does not) list the conflict.
async fn claim(env: &Env, on: bool, keys: &mut Option<Vec<String>>) -> Result<(), String> {
    let ip = env.pod_ip("mp", CLAIMED_POD)?;
    if on {
        *keys = super::etcd::put_row(env, &intruder_row(ip)).await?;
        if keys.is_none() {
            env.overlay(Some("dup-addr")).await?;
        }
    } else {
        match keys.take() {
            Some(written) => super::etcd::delete_keys(env, written).await?,
            None => env.overlay(None).await?,
        }
    }
    claimed_everywhere(env, ip, on).await
}

/// A pod-IP dial from mp-client to `dst` over HTTP: `Ok(true)` when mp-multi answered,
/// `Ok(false)` when the connection was closed with no answer at all (refused at accept).
async fn pod_ip_dial(env: &Env, dst: SocketAddr) -> Result<bool, String> {
    // mp-multi's ext_authz has a 200 ms timeout: its first check after a leg that flooded the
    // daemon (OVERLOAD sheds the pooled connections) opens a new hop, which a loaded machine
    // may not finish in time, and the answer is `403 authz-unavailable`: fail closed, rightly,
    // but not what this leg looks at. Asked again, within a bound; any other answer decides.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let o = loop {
        let o = env
            .probe(
                CLIENT,
                &probe(
                    super::addr(dst.ip(), dst.port()),
                    Send::Http(HttpRequest::get("/")),
                ),
            )
            .await?;
        if o.status == Some(403)
            && o.reason() == Some("authz-unavailable")
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        break o;
    };
    if o.status == Some(200) && o.ident().as_deref() == Some(&format!("mp-multi:{}", dst.port())) {
        return Ok(true);
    }
    if o.status.is_none() && o.ident().is_none() && !o.timed_out && o.connected {
        return Ok(false);
    }
    Err(format!(
        "{CLIENT} → {dst}: want mp-multi's answer or the connection closed, got {}",
        o.summary()
    ))
}

/// issue #35 item 5: a registry row of another service that claims mp-multi-0's address (a Pod
/// document, or on etcd a row written by hand). Before, the first row in sort order took the
/// address: mp-multi's ext_authz no longer refused plaintext to mp-multi-0, and the pod-IP
/// dial went to whoever sorted first. Now every claimant's protection applies, nothing is
/// dialled at the address, the intruder's name never reaches mp-multi-0's application, and
/// all of it ends with the claim.
async fn dup_addr(env: &Env) -> Check {
    let ip = env.pod_ip("mp", CLAIMED_POD)?;
    let http = SocketAddr::new(ip, 8080);
    let mut keys = None;
    env.overlay(None).await?;
    // Before: a pod-IP dial is delivered; plaintext from outside the mesh is refused
    // (mp-multi's service-level ext_authz guards the pod).
    if !pod_ip_dial(env, http).await? {
        return Err(format!("before the claim: {http} refused"));
    }
    plaintext_refused(env, OUTSIDE, http).await?;
    claim(env, true, &mut keys).await?;
    let during = async {
        plaintext_refused(env, OUTSIDE, http)
            .await
            .map_err(|e| format!("during the claim: {e}"))?;
        for port in [8080, 9090] {
            if pod_ip_dial(env, SocketAddr::new(ip, port)).await? {
                return Err(format!("during the claim: {ip}:{port} was delivered"));
            }
        }
        // The intruder's own name sends some of its hops to the address (one endpoint of
        // three); the pod there is mp-multi's and refuses a hop for another service (its TLS
        // handshake): the source takes the address out of the choice and tries one of
        // mp-eighty's own pods instead (issue #38; a 503 only when that fails too). None
        // reaches mp-multi-0's application.
        let ejected_before =
            super::balance::metric_sum(env, "aether_endpoint_ejections_total", &[]).await?;
        let host = format!("{}:8080", env.mesh(INTRUDER));
        let p = probe(
            super::loopback(),
            Send::Http(HttpRequest {
                host: crate::workload::probe::Host::Values(vec![host.clone()]),
                ..HttpRequest::get("/")
            }),
        );
        let many = crate::workload::probe::Many {
            count: 40,
            concurrency: 1,
            keep_alive: false,
        };
        let s = env
            .probe_many("mp-client-nocapture", &p, many, |o| {
                if super::answer(o, 503, "upstream-unreachable", Some("")).is_ok()
                    || echo(o, INTRUDER, 8080).is_ok()
                {
                    Ok(String::new())
                } else {
                    Err(format!("want mp-eighty's echo or 503 upstream-unreachable, got {}", o.summary()))
                }
            })
            .await
            .map_err(|e| format!("during the claim: {host}: {e}"))?;
        let ejected =
            super::balance::metric_sum(env, "aether_endpoint_ejections_total", &[]).await?
                - ejected_before;
        if s.by_reason.get("upstream-unreachable").copied().unwrap_or(0) == 0 && ejected < 1.0 {
            return Err(format!(
                "during the claim: {host}: the claimed address was never picked (no 503, no ejection) in 40 requests: {:?}",
                s.by_ident
            ));
        }
        Ok::<_, String>(())
    }
    .await;
    // The claim goes whatever the checks said, so that the next legs see the fixture.
    let ended = claim(env, false, &mut keys).await;
    during?;
    ended?;
    if !pod_ip_dial(env, http).await? {
        return Err(format!("after the claim: {http} still refused"));
    }
    plaintext_refused(env, OUTSIDE, http)
        .await
        .map_err(|e| format!("after the claim: {e}"))?;
    Ok(format!(
        "claimed by a row of {INTRUDER}: plaintext from {OUTSIDE} still refused, pod-IP dials to {ip}:8080 and :9090 closed, {INTRUDER}'s requests to the address refused at the hop (the address ejected and another endpoint tried, or 503), never mp-multi's application; claim gone: delivered again"
    ))
}

/// The MeshFilter of `variants/policy-unreadable`, as the diagnostics name it.
pub(super) const UNREADABLE_FILTER: &str = "mp/mp-nine-ext-authz";

/// mp-nine on the three HTTP paths (a captured dial by name, the proxy port, a pod-IP dial),
/// each answer checked by `check`.
async fn nine_on_every_path(env: &Env, check: impl Fn(&super::Outcome) -> Check) -> Check {
    let mesh = env.mesh("mp-nine");
    let host = format!("{mesh}:9000");
    let pod = env.pod_ip("mp", "mp-nine-0")?;
    for (client, dial, host) in [
        (CLIENT, name(&mesh, 9000), None),
        ("mp-client-nocapture", super::loopback(), Some(host)),
        (CLIENT, super::addr(pod, 9000), None),
    ] {
        let req = match host {
            Some(h) => super::get_host("/", &h),
            None => super::get("/"),
        };
        let label = format!("{client} → {}", dial.authority());
        let o = env.probe(client, &probe(dial, req)).await?;
        check(&o).map_err(|e| format!("{label}: {e}"))?;
    }
    Ok("captured, proxy port, pod IP".into())
}

/// issue #35 item 1: a service-level ext_authz whose server has no port (variants
/// `policy-unreadable`). Before, the converter dropped it and mp-nine was served without it,
/// with no diagnostic. Now mp-nine refuses on every path with the reason an authorization that
/// cannot decide gives, plaintext to its pods is refused, the diagnostic names the filter, and
/// all of it ends when the filter goes.
pub(super) async fn policy_refuses(env: &Env) -> Check {
    let nine = SocketAddr::new(env.pod_ip("mp", "mp-nine-0")?, 9000);
    env.overlay(None).await?;
    nine_on_every_path(env, |o| echo(o, "mp-nine", 9000)).await?;
    plaintext_served(env, OUTSIDE, nine, "mp-nine:9000").await?;
    env.overlay(Some("policy-unreadable")).await?;
    diagnosed_everywhere(env, "filter-unreadable", UNREADABLE_FILTER, true).await?;
    let paths =
        nine_on_every_path(env, |o| super::answer(o, 403, "authz-unavailable", None)).await?;
    plaintext_refused(env, OUTSIDE, nine).await?;
    // The other services are served as before.
    let o = env
        .probe(
            CLIENT,
            &probe(name(&env.mesh("mp-eighty"), 8080), super::get("/")),
        )
        .await?;
    echo(&o, "mp-eighty", 8080)?;
    Ok(format!(
        "mp-nine 403 authz-unavailable ({paths}), plaintext from {OUTSIDE} refused, diagnostic filter-unreadable on every daemon"
    ))
}

async fn policy(env: &Env) -> Check {
    let refused = policy_refuses(env).await;
    let nine = SocketAddr::new(env.pod_ip("mp", "mp-nine-0")?, 9000);
    env.overlay(None).await?;
    let refused = refused?;
    diagnosed_everywhere(env, "filter-unreadable", UNREADABLE_FILTER, false).await?;
    nine_on_every_path(env, |o| echo(o, "mp-nine", 9000)).await?;
    plaintext_served(env, OUTSIDE, nine, "mp-nine:9000").await?;
    Ok(format!("{refused}; the filter gone: served again"))
}
