//! Legs of issue #8: traffic an attacker or a bad day sends, through real sockets and the
//! real capture rules. Each leg checks what the peer gets and that the daemon is still whole
//! afterwards (its admin socket answers, its open connections are back near zero).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Check, Env, Leg, Need, admin_get, echo, name, probe};
use crate::workload::probe::{Connector, HttpRequest, Send};

/// The hostile-traffic legs, run after the rule legs.
pub static HOSTILE: &[Leg] = &[leg!(
    "SELFDIAL",
    "a connection to a pod's 18001 or 18008 is refused or closed; the daemon never dials itself",
    None,
    self_dial
)];

const CLIENT: &str = "mp-client";
const OUTSIDE: &str = "ext-http-0";

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
        Ok(Ok(_)) if dst.port() == crate::proxy::HOP_PORT && got[0] == 0x15 => {
            Ok("TLS alert, closed".into())
        }
        Ok(Ok(_)) => Err(format!(
            "{pod} → {dst}: answered {:?}",
            String::from_utf8_lossy(&got)
        )),
    }
}

/// Every daemon's admin socket answers `/live`, and its open connections are at most `max`.
async fn daemons_whole(env: &Env, max: i64) -> Check {
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
        if active > max {
            return Err(format!(
                "{}: {active} connections open after the leg",
                socket.display()
            ));
        }
        out.push(active.to_string());
    }
    Ok(format!("daemons live, open connections {}", out.join("/")))
}

async fn self_dial(env: &Env) -> Check {
    let client_ip = env.pod_ip("mp", "mp-client")?;
    let multi_ip = env.pod_ip("mp", "mp-multi-0")?;
    let within = Duration::from_secs(3);
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
    tokio::time::sleep(Duration::from_millis(200)).await;
    let whole = daemons_whole(env, 20).await?;
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
