//! Leg OVERLOAD (issue #36 item 4): node-a's daemon in a memory cgroup of 256 MiB that the leg
//! makes itself (v1's memory controller where it is mounted, else v2), flooded as an attacker
//! would: HTTP/2 streams with 16 KB header lists, more than one peer may hold, then thousands of
//! half-written 25 KB request heads. The daemon must not be killed (the cgroup's OOM count stays
//! 0, its process is the same), must shed by its counters (the memory levels', or the partial
//! heads' budget, `max_pending_head_bytes`), and must serve its pods' established
//! traffic (a kept HTTP/1.1 connection and a raw stream) throughout; once out of the cgroup it
//! takes new connections again.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::traffic::{raw_stream, read_echo_within};
use super::{Check, Env, Need, admin_get};
use crate::workload::probe::{Connector, HttpRequest, Send};
use aether::node::memory::{parse_mountinfo, parse_proc_cgroup};

/// The cgroup's limit: the figure of the report the issue answers.
const LIMIT: u64 = 256 << 20;
/// Half-written heads at most; the flood stops earlier once the daemon refuses at accept.
const HEADS: usize = 8000;
/// Bytes of each half-written head.
const HEAD_BYTES: usize = 25_000;
/// Bytes each held head grows by once the daemon refuses new connections.
const DRIP_BYTES: usize = 20_000;
/// HTTP/2 connections of the stream flood, each with the daemon's stream limit per connection.
const H2_CONNECTIONS: usize = 12;
/// Streams per HTTP/2 connection (`http2_max_concurrent_streams`' default).
const H2_STREAMS: usize = 200;
/// Bytes of each stream's header list.
const H2_HEADER_BYTES: usize = 16 * 1024;

const CLIENT: &str = "mp-client";
const FLOODER: &str = "mp-client-other";

/// A memory cgroup of the leg's own, holding one process; the process goes back to where it
/// was, and the cgroup is removed, when it drops.
struct MemoryCgroup {
    dir: PathBuf,
    v1: bool,
    pid: u32,
    home: PathBuf,
}

impl MemoryCgroup {
    /// Move `pid` into a new memory cgroup limited to `limit` bytes.
    fn enter(pid: u32, limit: u64) -> Result<Self, String> {
        let mountinfo =
            std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
        let cgroup =
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(|e| e.to_string())?;
        let (v2_mount, v1_mount) = parse_mountinfo(&mountinfo);
        let (v2_path, v1_path) = parse_proc_cgroup(&cgroup);
        let (mount, path, v1) = match (v1_mount, v1_path, v2_mount, v2_path) {
            (Some((point, _)), Some(path), _, _) => (point, path, true),
            (_, _, Some((point, _)), Some(path)) => (point, path, false),
            _ => return Err("no memory cgroup controller is mounted here".into()),
        };
        let mount = PathBuf::from(mount);
        let home = mount.join(path.trim_start_matches('/'));
        if !v1 {
            // v2: the root hands the memory controller down (no-op when it already does).
            let control = mount.join("cgroup.subtree_control");
            let enabled = std::fs::read_to_string(&control).unwrap_or_default();
            if !enabled.split_whitespace().any(|c| c == "memory") {
                write(&control, "+memory")?;
            }
        }
        remove_stale(&mount);
        let dir = mount.join(format!("aether-overload-{pid}"));
        if dir.exists() {
            let _ = std::fs::remove_dir(&dir);
        }
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let made = Self { dir, v1, pid, home };
        let limit_file = if v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        write(&made.dir.join(limit_file), &limit.to_string())?;
        write(&made.dir.join("cgroup.procs"), &pid.to_string())?;
        Ok(made)
    }

    /// Times the kernel's OOM killer acted in the cgroup.
    fn oom_kills(&self) -> Result<u64, String> {
        let file = if self.v1 {
            "memory.oom_control"
        } else {
            "memory.events"
        };
        let text = std::fs::read_to_string(self.dir.join(file)).map_err(|e| e.to_string())?;
        Ok(aether::node::memory::stat_value(&text, "oom_kill").unwrap_or(0))
    }

    fn name(&self) -> String {
        format!(
            "{} ({})",
            self.dir.display(),
            if self.v1 { "cgroup v1" } else { "cgroup v2" }
        )
    }
}

/// The cgroups an earlier run of this leg left when it was killed before its drop, whose
/// process is gone: removed (a cgroup that still holds a process is not: `rmdir` refuses it).
fn remove_stale(mount: &Path) {
    let Ok(entries) = std::fs::read_dir(mount) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("aether-overload-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = write(&self.home.join("cgroup.procs"), &self.pid.to_string());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("write {text} to {}: {e}", path.display()))
}

/// The pid of the process serving a unix socket (its peer credentials).
fn serving_pid(socket: &Path) -> Result<u32, String> {
    let s = std::os::unix::net::UnixStream::connect(socket)
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    let cred = nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| format!("{}: peer credentials: {e}", socket.display()))?;
    u32::try_from(cred.pid()).map_err(|_| "no pid".to_owned())
}

/// A sample of node-a's `/metrics`: `name` exactly (labels included), or 0.
fn sample(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn shed(metrics: &str, reason: &str) -> u64 {
    sample(
        metrics,
        &format!("aether_shed_total{{reason=\"{reason}\"}}"),
    )
}

/// What the established traffic saw: answered, and the failures.
#[derive(Default)]
struct Served {
    answered: u32,
    failed: Vec<String>,
}

/// A kept HTTP/1.1 connection from mp-client to mp-httponly:8080 and a raw stream to mp-mixed:9000,
/// both opened and used once before `ready` is sent (the flood waits for it), then used in turn
/// until `stop`.
async fn established(
    env: &Env,
    ready: tokio::sync::oneshot::Sender<()>,
    stop: Arc<AtomicBool>,
) -> Result<Served, String> {
    let mesh = &env.mesh_domain;
    // A service without ext_authz: mp-multi's check has a 200 ms timeout, which a daemon kept
    // busy by the flood may miss, and then refuses as it must (authz-unavailable).
    let multi = SocketAddr::new(env.pod_ip("mp", "mp-httponly-0")?, 8080);
    let connector = Connector::in_netns(env.client_netns(CLIENT)?.clone(), env.home.clone());
    let socket = connector.tcp_socket(multi).map_err(|e| e.to_string())?;
    let mut http = tokio::time::timeout(Duration::from_secs(3), socket.connect(multi))
        .await
        .map_err(|_| "kept connection: connect hung".to_owned())?
        .map_err(|e| format!("kept connection: {e}"))?;
    let mut raw = raw_stream(env).await?;
    let request = format!("GET / HTTP/1.1\r\nhost: mp-httponly.mp.{mesh}:8080\r\n\r\n");
    one_answer(&mut http, &request).await?;
    let _ = ready.send(());
    let mut served = Served::default();
    let mut i = 0u32;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let outcome = if i.is_multiple_of(2) {
            let line = format!("line {i}\n");
            match raw.write_all(line.as_bytes()).await {
                Ok(()) => read_echo_within(&mut raw, line.trim_end(), ANSWER_BOUND)
                    .await
                    .map_err(|e| format!("raw stream: {e}")),
                Err(e) => Err(format!("raw stream: {e}")),
            }
        } else {
            one_answer(&mut http, &request).await
        };
        match outcome {
            Ok(()) => served.answered += 1,
            Err(e) => {
                served.failed.push(e);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(served)
}

/// How long an answer on an established connection may take while the flood keeps the daemon's
/// one thread busy (on a machine four times slower, under two busy processes, a raw stream's
/// echo took more than 3 s): late is served, closed or wrong is failed.
const ANSWER_BOUND: Duration = Duration::from_secs(30);

/// One request on the kept connection, its answer `200 mp-httponly:8080`.
async fn one_answer(s: &mut TcpStream, request: &str) -> Result<(), String> {
    s.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("kept connection: {e}"))?;
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    let deadline = tokio::time::Instant::now() + ANSWER_BOUND;
    loop {
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .map_err(|_| format!("kept connection: no answer within {ANSWER_BOUND:?}"))?
            .map_err(|e| format!("kept connection: {e}"))?;
        if n == 0 {
            return Err("kept connection: closed".into());
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())
                        .flatten()
                })
                .unwrap_or(0);
            if body.len() >= len {
                return if head.starts_with("HTTP/1.1 200") && body.starts_with("mp-httponly:8080") {
                    Ok(())
                } else {
                    Err(format!("kept connection: answered {head:?} {body:?}"))
                };
            }
        }
    }
}

/// HTTP/2 connections from the flooder to mp-authz:9191 (on node-a, which answers after the
/// `x-authz-delay-ms` it is asked for, 5 s at most), each with its streams opened with a 16 KB
/// header list and a body that never comes: held open for seconds, more than a peer may hold.
async fn stream_flood(
    env: &Env,
) -> Result<
    (
        Vec<hyper::client::conn::http2::SendRequest<FloodBody>>,
        Vec<tokio::task::JoinHandle<bool>>,
    ),
    String,
> {
    let mesh = &env.mesh_domain;
    let dst = SocketAddr::new(env.pod_ip("mp", "mp-authz-0")?, 9191);
    let connector = Connector::in_netns(env.client_netns(FLOODER)?.clone(), env.home.clone());
    let pad = "p".repeat(H2_HEADER_BYTES);
    let (mut senders, mut streams) = (Vec::new(), Vec::new());
    for _ in 0..H2_CONNECTIONS {
        let socket = connector.tcp_socket(dst).map_err(|e| e.to_string())?;
        let tcp = tokio::time::timeout(Duration::from_secs(3), socket.connect(dst))
            .await
            .map_err(|_| "h2 flood: connect hung".to_owned())?
            .map_err(|e| format!("h2 flood: {e}"))?;
        let (send, conn) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .map_err(|e| format!("h2 flood: {e}"))?;
        tokio::spawn(conn);
        for _ in 0..H2_STREAMS {
            let req = http::Request::post(format!("http://mp-authz.mp.{mesh}:9191/"))
                .header("x-pad", pad.as_str())
                .header(crate::workload::echo::AUTHZ_DELAY_HEADER, "5000")
                .body(FloodBody)
                .map_err(|e| e.to_string())?;
            let mut send = send.clone();
            // `true`: the daemon refused the stream.
            streams.push(tokio::spawn(async move {
                send.send_request(req).await.is_err()
            }));
        }
        senders.push(send);
    }
    Ok((senders, streams))
}

/// A request body that never sends a byte nor ends.
#[derive(Default)]
struct FloodBody;

impl http_body::Body for FloodBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Pending
    }
}

/// Half-written heads from the flooder to mp-multi-0:8080 until `HEADS` or until the daemon
/// has refused connections at accept for a while; the connections held, and how many were
/// refused.
async fn head_flood(env: &Env) -> Result<(Vec<TcpStream>, usize), String> {
    let mesh = &env.mesh_domain;
    let dst = SocketAddr::new(env.pod_ip("mp", "mp-multi-0")?, 8080);
    let connector = Connector::in_netns(env.client_netns(FLOODER)?.clone(), env.home.clone());
    let head = format!(
        "GET / HTTP/1.1\r\nhost: mp-multi.mp.{mesh}:8080\r\nx-pad: {}\r\n",
        "h".repeat(HEAD_BYTES)
    );
    let (mut held, mut refused) = (Vec::new(), 0usize);
    for _ in 0..HEADS {
        let socket = connector.tcp_socket(dst).map_err(|e| e.to_string())?;
        let Ok(Ok(mut s)) = tokio::time::timeout(Duration::from_secs(2), socket.connect(dst)).await
        else {
            refused += 1;
            continue;
        };
        if tokio::time::timeout(Duration::from_secs(2), s.write_all(head.as_bytes()))
            .await
            .map_or(true, |w| w.is_err())
        {
            refused += 1;
            continue;
        }
        held.push(s);
        // Once a few hundred in a row are refused, more would only be refused too.
        if refused > 500 {
            break;
        }
    }
    // Then the heads the daemon holds grow (still under `max_header_bytes`): the daemon takes
    // no new connection, so the attack goes on through the ones it has.
    let more = vec![b'h'; DRIP_BYTES];
    let mut kept = Vec::with_capacity(held.len());
    for mut s in held {
        let wrote = tokio::time::timeout(Duration::from_secs(2), s.write_all(&more)).await;
        if matches!(wrote, Ok(Ok(()))) {
            kept.push(s);
        } else {
            refused += 1;
        }
    }
    Ok((kept, refused))
}

pub(super) async fn overload(env: &Env) -> Check {
    let Some(reg) = &env.registry else {
        return Err(env.not_here(Need::RegistryControl));
    };
    let admin = reg
        .admin_sockets
        .first()
        .ok_or_else(|| env.not_here(Need::DaemonSockets))?
        .clone();
    let pid = serving_pid(&admin)?;
    let cgroup = MemoryCgroup::enter(pid, LIMIT)?;
    // The daemon finds its new limit (it looks again every 2 s).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while sample(
        &admin_get(&admin, "/metrics").await?,
        "aether_memory_limit_bytes",
    ) != LIMIT
    {
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "the daemon did not see its limit in {}",
                cgroup.name()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = admin_get(&admin, "/metrics").await?;

    let stop = Arc::new(AtomicBool::new(false));
    let (ready, warm) = tokio::sync::oneshot::channel();
    // The established traffic runs beside the flood on this task (the leg's env is borrowed).
    let traffic = established(env, ready, stop.clone());
    let flood = async {
        if warm.await.is_err() {
            return (
                Err("no established traffic".to_owned()),
                Ok((Vec::new(), 0)),
                Ok(String::new()),
            );
        }
        let streams = stream_flood(env).await;
        let heads = head_flood(env).await;
        // The daemon holds what it kept of the flood for a moment, then everything is released.
        let during = admin_get(&admin, "/metrics").await;
        stop.store(true, Ordering::Relaxed);
        (streams, heads, during)
    };
    let (served, (streams, heads, during)) = tokio::join!(traffic, flood);
    let served = served?;
    let (senders, streams) = streams?;
    let (held, refused_heads) = heads?;
    let during = during?;
    let peak = sample(&during, "aether_memory_used_bytes");
    drop(held);
    drop(senders);
    let mut refused_streams = 0;
    for s in streams {
        s.abort();
        if let Ok(true) = s.await {
            refused_streams += 1;
        }
    }
    let oom = cgroup.oom_kills()?;
    let name = cgroup.name();
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok();
    let after = admin_get(&admin, "/metrics").await?;
    drop(cgroup);

    if !alive || serving_pid(&admin)? != pid {
        return Err(format!(
            "node-a's daemon (pid {pid}) did not survive the flood in {name}"
        ));
    }
    if oom > 0 {
        return Err(format!("the OOM killer acted {oom} times in {name}"));
    }
    if let Some(first) = served.failed.first() {
        return Err(format!(
            "established traffic failed during the flood after {} answers: {first}",
            served.answered
        ));
    }
    if served.answered < 4 {
        return Err(format!(
            "only {} answers on established connections during the flood",
            served.answered
        ));
    }
    let delta = |reason: &str| shed(&after, reason).saturating_sub(shed(&before, reason));
    let (accept, partial, idle, peer, stream, budget) = (
        delta("accept-refused"),
        delta("partial-head-closed"),
        delta("idle-closed"),
        delta("peer-streams"),
        delta("stream-refused"),
        delta("head-budget"),
    );
    // The heads are shed by the memory levels, or before them by the partial heads' budget
    // (`max_pending_head_bytes`), which keeps their growth from outrunning the levels' checks.
    if accept + partial + budget == 0 {
        return Err(format!(
            "no head was shed: peak {} MiB of {} MiB, {} heads held",
            peak >> 20,
            LIMIT >> 20,
            HEADS - refused_heads
        ));
    }
    if peer + stream == 0 {
        return Err(format!(
            "no stream of the {} the flooder opened was refused",
            H2_CONNECTIONS * H2_STREAMS
        ));
    }
    // Out of the cgroup, the daemon measures no limit and takes new connections again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let m = admin_get(&admin, "/metrics").await?;
        if sample(&m, "aether_overload_level") == 0 && sample(&m, "aether_memory_limit_bytes") == 0
        {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err("the daemon kept its overload level after leaving the cgroup".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fresh = env
        .probe(
            CLIENT,
            &super::probe(
                super::name(&env.mesh("mp-httponly"), 8080),
                Send::Http(HttpRequest::get("/")),
            ),
        )
        .await?;
    super::echo(&fresh, "mp-httponly", 8080)?;
    Ok(format!(
        "{name}, 256 MiB: peak {} MiB; daemon alive (pid {pid}), 0 OOM kills; shed: {accept} accept-refused, {partial} partial-head-closed, {budget} head-budget, {idle} idle-closed, {peer} peer-streams, {stream} stream-refused ({refused_streams} streams and {refused_heads} heads refused as the client saw it); {} answers on established connections, 0 failed",
        peak >> 20,
        served.answered
    ))
}
