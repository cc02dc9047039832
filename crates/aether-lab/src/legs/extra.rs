//! Legs of issue #3 beyond spec/legs.md: a model swap under load, the CNI socket, and bad input
//! on the wire (an unknown SNI on 18008, a peer of another trust domain or another CA, a request
//! head the parser rejects); and source binding on the hop (issue #35 item 3).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Check, Env, Leg, Need, answer, echo, loopback, name, probe};
use crate::workload::probe::{Connector, HttpRequest, Send};
use aether::identity::{Ca, Identities, IdentitySettings, client_config};

/// The extra legs, run after the catalogue.
pub static EXTRA: &[Leg] = &[
    leg!(
        "SWAP",
        "model swaps of kept connections' own services drop none; new requests follow",
        None,
        swap
    ),
    leg!(
        "RET",
        "a service whose rows vanish is retained: 503 no-endpoints, not 404",
        None,
        retained
    ),
    leg!(
        "RESTART",
        "a restarted daemon serves its pods again; meanwhile 503 upstream-unreachable, never a hang",
        None,
        restart
    ),
    leg!(
        "CNI",
        "CNI ADD serves a pod only it brings in; DEL removes it",
        None,
        cni
    ),
    leg!(
        "BADSNI",
        "18008: an SNI the pod does not serve closes the handshake",
        None,
        bad_sni
    ),
    leg!(
        "BADPEER",
        "18008: another CA is refused in the handshake; another trust domain closed after it",
        None,
        bad_peer
    ),
    leg!(
        "BADHTTP",
        "a head the parser rejects: 400 bad-request; oversized: 431",
        None,
        bad_http
    ),
    leg!(
        "BINDING",
        "18008: a valid certificate is served only from a pod of its own identity (source binding)",
        None,
        binding
    ),
];

const CLIENT: &str = "mp-client";
const OUTSIDE: &str = "ext-http-0";

async fn connect(env: &Env, pod: &str, dst: SocketAddr) -> Result<TcpStream, String> {
    let netns = env.client_netns(pod)?;
    let socket = Connector::in_netns(netns.clone(), env.home.clone())
        .tcp_socket(dst)
        .map_err(|e| e.to_string())?;
    tokio::time::timeout(Duration::from_secs(3), socket.connect(dst))
        .await
        .map_err(|_| format!("connect to {dst} timed out"))?
        .map_err(|e| format!("connect to {dst}: {e}"))
}

/// Read until `want` has arrived (bounded).
async fn read_until(s: &mut TcpStream, want: &str) -> Result<String, String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = aether::time::now() + Duration::from_secs(3);
    while !String::from_utf8_lossy(&got).contains(want) {
        let n = tokio::time::timeout_at(deadline.into(), s.read(&mut buf))
            .await
            .map_err(|_| {
                format!(
                    "waited for {want:?}, got {:?}",
                    String::from_utf8_lossy(&got)
                )
            })?
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err(format!(
                "closed before {want:?}; got {:?}",
                String::from_utf8_lossy(&got)
            ));
        }
        got.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&got).into_owned())
}

/// One request on SWAP's kept HTTP/1.1 connection: whether its answer carried `x-swap: 1`.
async fn kept_request(http: &mut TcpStream, request: &str) -> Result<bool, String> {
    http.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let answer = read_until(http, "mp-multi:8080\n").await?;
    if !answer.starts_with("HTTP/1.1 200") {
        return Err(format!("want 200 mp-multi:8080, got {answer:?}"));
    }
    Ok(answer.lines().any(|l| l.eq_ignore_ascii_case("x-swap: 1")))
}

async fn swap(env: &Env) -> Check {
    if env.registry.is_none() {
        return Err(env.not_here(Need::RegistryControl));
    }
    // Two established connections: raw TCP over the hop to mp-mixed:9000, and HTTP/1.1
    // keep-alive to mp-multi:8080. The overlay `swap` changes both services' tables.
    let mixed = env.cluster_ip("mp", "mp-mixed")?;
    let mut raw = connect(env, CLIENT, SocketAddr::new(mixed, 9000)).await?;
    raw.write_all(b"one\n").await.map_err(|e| e.to_string())?;
    read_until(&mut raw, "one").await?;
    let multi = env.cluster_ip("mp", "mp-multi")?;
    let mut http = connect(env, CLIENT, SocketAddr::new(multi, 8080)).await?;
    let request = format!(
        "GET / HTTP/1.1\r\nHost: {}:8080\r\n\r\n",
        env.mesh("mp-multi")
    );
    if kept_request(&mut http, &request).await? {
        return Err("x-swap before any swap".into());
    }
    // Load on new connections while the daemons publish four new models.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = async {
        let (mut ok, mut failed) = (0u32, Vec::new());
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let p = probe(
                name(&env.mesh("mp-multi"), 8080),
                Send::Http(HttpRequest::get("/")),
            );
            match env.probe(CLIENT, &p).await {
                Ok(o) if echo(&o, "mp-multi", 8080).is_ok() => ok += 1,
                Ok(o) => failed.push(o.summary()),
                Err(e) => failed.push(e),
            }
        }
        (ok, failed)
    };
    // After each swap, the kept HTTP connection's next request is answered from the new
    // model (model.md §13 item 4), and the raw stream still reaches its endpoint.
    let swaps = async {
        let result = async {
            for (i, variant) in [Some("swap"), None, Some("swap"), None]
                .into_iter()
                .enumerate()
            {
                env.overlay(variant).await?;
                let routed = kept_request(&mut http, &request)
                    .await
                    .map_err(|e| format!("keep-alive after swap {}: {e}", i + 1))?;
                if routed != variant.is_some() {
                    return Err(format!(
                        "swap {}: the kept connection's request {} x-swap",
                        i + 1,
                        if routed { "has" } else { "lacks" }
                    ));
                }
                let line = format!("after-{i}\n");
                raw.write_all(line.as_bytes())
                    .await
                    .map_err(|e| e.to_string())?;
                read_until(&mut raw, line.trim())
                    .await
                    .map_err(|e| format!("raw tcp after swap {}: {e}", i + 1))?;
            }
            Ok::<_, String>(())
        }
        .await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        result
    };
    let ((ok, failed), swapped) = tokio::join!(load, swaps);
    swapped?;
    if !failed.is_empty() {
        return Err(format!(
            "{} of {} requests failed during swaps: {}",
            failed.len(),
            ok as usize + failed.len(),
            failed[0]
        ));
    }
    Ok(format!(
        "4 swaps of the kept connections' own services, {ok} requests under load, 0 failed; the kept HTTP connection follows each model, the raw stream runs on"
    ))
}

/// The pod leg CNI adds and deletes: the daemon learns its namespace from the ADD alone.
pub(super) const CNI_POD: &str = "mp-cni-0";

/// Whether the pod's namespace holds the daemon's capture table (`table inet aether`).
async fn has_capture_table(netns: &std::path::Path) -> Result<bool, String> {
    let out = tokio::process::Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["nft", "list", "table", "inet", "aether"])
        .output()
        .await
        .map_err(|e| format!("nsenter nft: {e}"))?;
    Ok(out.status.success())
}

/// What a served pod has and an unserved one lacks: the daemon's capture table, its loopback
/// listener, its mesh hop. `Ok(true)` when all answer, `Ok(false)` when none does.
pub(super) async fn cni_served(env: &Env, netns: &std::path::Path) -> Result<bool, String> {
    let table = has_capture_table(netns).await?;
    let multi = format!("{}:8080", env.mesh("mp-multi"));
    let lb = env
        .probe(CNI_POD, &probe(loopback(), super::get_host("/", &multi)))
        .await?;
    // Its hop: mp-client delivers to it by its mesh name (an echo, or the mesh's 503).
    let hop = env
        .probe(
            CLIENT,
            &probe(name(&env.mesh("mp-cni"), 8080), super::get("/")),
        )
        .await?;
    match (table, lb.connected, hop.status) {
        (true, true, Some(200)) => {
            echo(&lb, "mp-multi", 8080).map_err(|e| format!("its loopback: {e}"))?;
            echo(&hop, "mp-cni", 8080).map_err(|e| format!("its hop: {e}"))?;
            // Its capture: a dial with another port in the Host gets the mesh's 421.
            let ip = env.cluster_ip("mp", "mp-multi")?;
            let o = env
                .probe(
                    CNI_POD,
                    &probe(super::addr(ip, 9090), super::get_host("/", &multi)),
                )
                .await?;
            answer(&o, 421, "port-mismatch", Some("8080/http 9090/http"))
                .map_err(|e| format!("its capture: {e}"))?;
            Ok(true)
        }
        (false, false, Some(503)) if hop.reason() == Some("upstream-unreachable") => Ok(false),
        // On etcd its node cannot probe a pod it does not serve: the pod is not Ready, so it
        // is no endpoint at all (spec/model.md §3.5, §14).
        (false, false, Some(503))
            if hop.reason() == Some("no-endpoints")
                && env.registry.as_ref().is_some_and(|r| r.etcd.is_some()) =>
        {
            Ok(false)
        }
        _ => Err(format!(
            "half served: capture table {table}, loopback listener {}, hop answer {}",
            lb.connected,
            hop.summary()
        )),
    }
}

/// The CNI leg: also run by K-FORBID while a kind is refused (a synced node serves ADDs).
pub(super) async fn cni(env: &Env) -> Check {
    let Some(reg) = &env.registry else {
        return Err(env.not_here(Need::DaemonSockets));
    };
    let sock = reg.admin_sockets[0].with_file_name("cni.sock");
    let netns = env.client_netns(CNI_POD)?.path().to_path_buf();
    use aether::capture::cni::{CniCommand, send};
    let pods = || super::admin_get(&reg.admin_sockets[0], "/pods");
    let listed = format!("\"{CNI_POD}\"");
    if pods().await?.contains(&listed) || cni_served(env, &netns).await? {
        return Err(format!("{CNI_POD} is served before its ADD"));
    }
    let add = CniCommand::Add {
        namespace: "mp".into(),
        pod: CNI_POD.into(),
        netns: netns.clone(),
        ips: Vec::new(),
    };
    tokio::time::timeout(Duration::from_secs(10), send(&sock, &add))
        .await
        .map_err(|_| "ADD not answered".to_owned())?
        .map_err(|e| format!("ADD: {e}"))?;
    if !pods().await?.contains(&listed) {
        return Err(format!("after ADD, /pods lacks {CNI_POD}"));
    }
    if !cni_served(env, &netns)
        .await
        .map_err(|e| format!("after ADD: {e}"))?
    {
        return Err(format!("after ADD, {CNI_POD} is not served"));
    }
    let del = CniCommand::Del {
        namespace: "mp".into(),
        pod: CNI_POD.into(),
        netns: None,
    };
    tokio::time::timeout(Duration::from_secs(10), send(&sock, &del))
        .await
        .map_err(|_| "DEL not answered".to_owned())?
        .map_err(|e| format!("DEL: {e}"))?;
    if pods().await?.contains(&listed) {
        return Err(format!("after DEL, /pods still lists {CNI_POD}"));
    }
    if cni_served(env, &netns)
        .await
        .map_err(|e| format!("after DEL: {e}"))?
    {
        return Err(format!("after DEL, {CNI_POD} is still served"));
    }
    Ok(format!(
        "{CNI_POD}: not served; ADD → capture, loopback and hop answer; DEL → all gone"
    ))
}

fn identities(env: &Env, trust_domain: &str, ca: Option<Ca>) -> Result<Arc<Identities>, String> {
    let ca = match ca {
        Some(ca) => ca,
        None => {
            let dir = env
                .ca_dir
                .as_ref()
                .ok_or_else(|| env.not_here(Need::MeshCa))?;
            Ca::load_or_create(dir).map_err(|e| e.to_string())?
        }
    };
    Identities::new(
        Arc::new(ca),
        IdentitySettings {
            trust_domain: trust_domain.into(),
            mesh_domain: env.mesh_domain.clone(),
            ..IdentitySettings::default()
        },
    )
    .map(Arc::new)
    .map_err(|e| e.to_string())
}

/// Where a hand-made hop goes: from `from`'s network namespace and address, to `to`'s hop.
#[derive(Clone, Copy, Debug)]
struct HopPath<'a> {
    /// The pod it leaves from. A managed pod's connection carries the daemon's socket mark, as
    /// the daemon's own hops do, or its capture would take it: what root on the pod's node can
    /// send ([`connect_marked`]).
    from: &'a str,
    /// The pod whose hop it reaches.
    to: &'a str,
}

/// The path of the bad-input legs: from mp-client's own pod (whose identity their good
/// certificate proves, model.md §14 source binding) to mp-multi-1, on the other node.
const FROM_CLIENT: HopPath<'static> = HopPath {
    from: CLIENT,
    to: "mp-multi-1",
};

/// A TCP connection to `dst` from `pod`'s namespace and address, with the daemon's socket mark
/// (`aether_core::marks::SOCKET_MARK`): capture lets it out unmarked by TPROXY, as it does the
/// daemon's own hops (model.md §12.4).
async fn connect_marked(env: &Env, pod: &str, dst: SocketAddr) -> Result<TcpStream, String> {
    let netns = env.client_netns(pod)?;
    let make = || -> std::io::Result<socket2::Socket> {
        let s = socket2::Socket::new(
            socket2::Domain::for_address(dst),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        s.set_mark(aether_core::marks::SOCKET_MARK)?;
        s.set_nonblocking(true)?;
        Ok(s)
    };
    let socket = netns
        .run(&env.home, make)
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("a marked socket in {pod}: {e}"))?;
    let socket = tokio::net::TcpSocket::from_std_stream(socket.into());
    tokio::time::timeout(Duration::from_secs(3), socket.connect(dst))
        .await
        .map_err(|_| format!("connect to {dst} from {pod} timed out"))?
        .map_err(|e| format!("connect to {dst} from {pod}: {e}"))
}

/// How one attempt on a pod's hop ended, as its client sees it.
#[derive(Debug)]
enum HopAttempt {
    /// The handshake and an HTTP/2 request completed: the status and the body's first line.
    Answered(u16, String),
    /// The TLS handshake failed.
    HandshakeRefused(String),
    /// The handshake completed, then the request got no answer.
    ClosedAfterHandshake(String),
}

/// A TCP connection along `path` (marked when it leaves a managed pod; the unmanaged pod's is
/// not captured) and a TLS handshake under `config` and `sni`. `Err` only when the attempt
/// could not be made (the connect failed or timed out, or the handshake hung): that is a leg's
/// failure, never a refusal.
async fn hop_tls(
    env: &Env,
    path: HopPath<'_>,
    config: Arc<rustls::ClientConfig>,
    sni: &str,
) -> Result<Result<tokio_rustls::client::TlsStream<TcpStream>, String>, String> {
    let to = env.pod_ip("mp", path.to)?;
    let dst = SocketAddr::new(to, 18008);
    let tcp = if path.from == OUTSIDE {
        connect(env, OUTSIDE, dst).await?
    } else {
        connect_marked(env, path.from, dst).await?
    };
    let name =
        rustls::pki_types::ServerName::try_from(sni.to_owned()).map_err(|e| e.to_string())?;
    match tokio::time::timeout(
        Duration::from_secs(3),
        tokio_rustls::TlsConnector::from(config).connect(name, tcp),
    )
    .await
    {
        Err(_) => Err("the TLS handshake timed out".into()),
        Ok(r) => Ok(r.map_err(|e| e.to_string())),
    }
}

/// A TLS handshake along `path`, then one HTTP/2 request for `authority`.
async fn hop_attempt(
    env: &Env,
    path: HopPath<'_>,
    config: Arc<rustls::ClientConfig>,
    sni: &str,
    authority: &str,
) -> Result<HopAttempt, String> {
    let tls = match hop_tls(env, path, config, sni).await? {
        Ok(tls) => tls,
        Err(e) => return Ok(HopAttempt::HandshakeRefused(e)),
    };
    let request = async {
        let (mut sender, conn) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .handshake(hyper_util::rt::TokioIo::new(tls))
                .await?;
        tokio::spawn(conn);
        let req = http::Request::builder()
            .uri(format!("http://{authority}/"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await?
            .to_bytes();
        let first = String::from_utf8_lossy(&body)
            .lines()
            .next()
            .unwrap_or("")
            .to_owned();
        Ok::<_, Box<dyn std::error::Error + std::marker::Send + Sync>>((status, first))
    };
    // Generous: a hop from an address the destination holds no row of is waited on for the
    // discovery hold (2 s) before it is closed.
    let Ok(answered) = tokio::time::timeout(Duration::from_secs(10), request).await else {
        return Err("the request after the handshake timed out".into());
    };
    Ok(match answered {
        Ok((status, first)) => HopAttempt::Answered(status, first),
        Err(e) => HopAttempt::ClosedAfterHandshake(aether::DisplayChain(&*e).to_string()),
    })
}

/// What the hop does with a peer once the client's side of the handshake is done, read
/// before the client writes anything (TLS 1.3: the server judges the client's certificate
/// after the client's last handshake message, and a write could meet a reset before the
/// server's alert is read).
#[derive(Debug)]
enum AfterHandshake {
    /// The TLS layer refused it: the handshake failed, or a TLS alert arrived (tokio-rustls
    /// reports an alert as an IO error of kind `InvalidData`).
    Refused(String),
    /// The connection closed with no alert: the peer was judged after the handshake.
    Closed(String),
    /// The hop kept the connection: it spoke or waited.
    Open,
}

async fn after_handshake(
    env: &Env,
    path: HopPath<'_>,
    config: Arc<rustls::ClientConfig>,
    sni: &str,
) -> Result<AfterHandshake, String> {
    after_handshake_within(env, path, config, sni, Duration::from_secs(2)).await
}

/// [`after_handshake`], a connection still open after `patience` counting as kept.
async fn after_handshake_within(
    env: &Env,
    path: HopPath<'_>,
    config: Arc<rustls::ClientConfig>,
    sni: &str,
    patience: Duration,
) -> Result<AfterHandshake, String> {
    let mut tls = match hop_tls(env, path, config, sni).await? {
        Ok(tls) => tls,
        Err(e) => return Ok(AfterHandshake::Refused(e)),
    };
    let mut buf = [0u8; 256];
    Ok(
        match tokio::time::timeout(patience, tls.read(&mut buf)).await {
            Err(_) | Ok(Ok(1..)) => AfterHandshake::Open,
            Ok(Ok(0)) => AfterHandshake::Closed("end of stream".into()),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                AfterHandshake::Refused(e.to_string())
            }
            Ok(Err(e)) => AfterHandshake::Closed(e.to_string()),
        },
    )
}

/// Handshake from mp-client's pod with mp-multi-1's hop as mp-client; then one HTTP/2 request.
/// `Ok` is the status, `Err` says where it stopped.
async fn hop_request(env: &Env, ids: &Arc<Identities>, sni: &str) -> Result<u16, String> {
    let config = client_config(ids, "mp", "mp-client", &[aether_core::wire::ALPN_HTTP])
        .map_err(|e| e.to_string())?;
    let authority = format!("{}:8080", env.mesh("mp-multi"));
    match hop_attempt(env, FROM_CLIENT, config, sni, &authority).await? {
        HopAttempt::Answered(status, _) => Ok(status),
        HopAttempt::HandshakeRefused(e) => Err(format!("handshake: {e}")),
        HopAttempt::ClosedAfterHandshake(e) => Err(format!("closed: {e}")),
    }
}

/// A client certificate of `ids` (mp/mp-client), whoever's CA signed it.
#[derive(Debug)]
struct FixedCert(Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for FixedCert {
    fn resolve(
        &self,
        _hints: &[&[u8]],
        _schemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

async fn bad_sni(env: &Env) -> Check {
    let ids = identities(env, "cluster.local", None)?;
    let good = format!("8080.mp-multi.mp.{}", env.mesh_domain);
    let status = hop_request(env, &ids, &good)
        .await
        .map_err(|e| format!("control {good}: {e}"))?;
    if status != 200 {
        return Err(format!("control {good}: status {status}"));
    }
    for sni in [
        format!("7777.mp-multi.mp.{}", env.mesh_domain),
        format!("9000.mp-multi.mp.{}", env.mesh_domain),
        format!("8080.mp-eighty.mp.{}", env.mesh_domain),
        "unknown.example".to_owned(),
    ] {
        match hop_request(env, &ids, &sni).await {
            Err(e) if e.starts_with("handshake") => {}
            other => {
                return Err(format!(
                    "SNI {sni}: want the handshake closed, got {other:?}"
                ));
            }
        }
    }
    Ok("control 200; 4 unknown SNIs: handshake closed".into())
}

async fn bad_peer(env: &Env) -> Check {
    let good = format!("8080.mp-multi.mp.{}", env.mesh_domain);
    let mesh = identities(env, "cluster.local", None)?;
    let hop = [aether_core::wire::ALPN_HTTP];
    // Control, on connections of its own: the mesh's own identity is kept open and answered,
    // so what follows is the peer's doing.
    let own = client_config(&mesh, "mp", "mp-client", &hop).map_err(|e| e.to_string())?;
    match after_handshake(env, FROM_CLIENT, own.clone(), &good).await? {
        AfterHandshake::Open => {}
        other => return Err(format!("control: want the connection kept, got {other:?}")),
    }
    let authority = format!("{}:8080", env.mesh("mp-multi"));
    match hop_attempt(env, FROM_CLIENT, own, &good, &authority).await? {
        HopAttempt::Answered(200, _) => {}
        other => return Err(format!("control: want 200, got {other:?}")),
    }
    // Another trust domain, the same CA: the chain verifies, so the handshake completes; the
    // hop then refuses the SPIFFE ID and closes, with no alert and nothing answered.
    let foreign_td = identities(env, "evil.example", None)?;
    let config = client_config(&foreign_td, "mp", "mp-client", &hop).map_err(|e| e.to_string())?;
    let td = match after_handshake(env, FROM_CLIENT, config, &good).await? {
        AfterHandshake::Closed(e) => e,
        other => {
            return Err(format!(
                "another trust domain: want closed after the handshake, got {other:?}"
            ));
        }
    };
    // Another CA: the client trusts the mesh's CA (so it accepts the hop's certificate) and
    // shows a certificate another CA signed; the hop refuses it in the handshake.
    let other_ca = Ca::generate(aether::time::wall()).map_err(|e| e.to_string())?;
    let foreign = identities(env, "cluster.local", Some(other_ca))?;
    let cert = foreign
        .certificate("mp", "mp-client", aether::time::wall())
        .map_err(|e| e.to_string())?;
    let mut roots = rustls::RootCertStore::empty();
    for c in mesh.bundle() {
        roots.add(c).map_err(|e| e.to_string())?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(mesh.provider().clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_client_cert_resolver(Arc::new(FixedCert(cert.key.clone())));
    config.alpn_protocols = vec![aether_core::wire::ALPN_HTTP.to_vec()];
    let ca = match after_handshake(env, FROM_CLIENT, Arc::new(config), &good).await? {
        AfterHandshake::Refused(e) => e,
        other => {
            return Err(format!(
                "another CA: want the handshake refused, got {other:?}"
            ));
        }
    };
    Ok(format!(
        "control kept and 200; other trust domain: closed after the handshake ({td}); other CA: handshake refused ({ca})"
    ))
}

/// The hop refusals for source binding of every daemon, by reason
/// (`aether_hop_source_refused_total`).
async fn unbound_refusals(env: &Env, reason: &str) -> Result<f64, String> {
    super::balance::metric_sum(
        env,
        "aether_hop_source_refused_total",
        &[("reason", reason)],
    )
    .await
}

/// issue #35 item 3, model.md §14 "Source binding": a certificate the mesh's CA issued for
/// mp-multi, shown from a pod that is not mp-multi's, is closed after the handshake and
/// nothing reaches the application; the same certificate from mp-multi's own pod is served.
/// Both to a pod of the same node and to one across nodes, as HTTP/2 and as an L4 hop.
async fn binding(env: &Env) -> Check {
    let mesh = identities(env, "cluster.local", None)?;
    let as_multi =
        |alpn: &[u8]| client_config(&mesh, "mp", "mp-multi", &[alpn]).map_err(|e| e.to_string());
    let sni = format!("8080.mp-httponly.mp.{}", env.mesh_domain);
    let authority = format!("{}:8080", env.mesh("mp-httponly"));
    let mismatch = unbound_refusals(env, "source-identity-mismatch").await?;
    let not_a_pod = unbound_refusals(env, "source-not-a-pod").await?;
    let mut refused = Vec::new();
    // From mp-client's pod (node-a), as mp-multi: to mp-httponly-0 on its own node and
    // mp-httponly-1 across; from the unmanaged ext-http-0 (no served row).
    for (from, to) in [
        (CLIENT, "mp-httponly-0"),
        (CLIENT, "mp-httponly-1"),
        (OUTSIDE, "mp-httponly-0"),
    ] {
        let path = HopPath { from, to };
        for alpn in [aether_core::wire::ALPN_HTTP, aether_core::wire::ALPN_L4] {
            // The unmanaged pod's address is no row's: the destination waits one discovery
            // hold (2 s) for a model that holds it before it closes.
            let patience = Duration::from_secs(10);
            match after_handshake_within(env, path, as_multi(alpn)?, &sni, patience).await? {
                AfterHandshake::Closed(_) => {}
                other => {
                    return Err(format!(
                        "{from} → {to} as mp-multi ({}): want closed after the handshake, got {other:?}",
                        String::from_utf8_lossy(alpn)
                    ));
                }
            }
        }
        match hop_attempt(
            env,
            path,
            as_multi(aether_core::wire::ALPN_HTTP)?,
            &sni,
            &authority,
        )
        .await?
        {
            HopAttempt::ClosedAfterHandshake(_) => {}
            other => {
                return Err(format!(
                    "{from} → {to} as mp-multi: want no answer (closed after the handshake), got {other:?}"
                ));
            }
        }
        refused.push(format!("{from} → {to}"));
    }
    // Counted by reason on the destinations' daemons: 2 × 3 attempts from mp-client's pod, 3
    // from the unmanaged pod.
    let mismatch = unbound_refusals(env, "source-identity-mismatch").await? - mismatch;
    let not_a_pod = unbound_refusals(env, "source-not-a-pod").await? - not_a_pod;
    if mismatch < 6.0 || not_a_pod < 3.0 {
        return Err(format!(
            "want the refusals counted (≥ 6 source-identity-mismatch, ≥ 3 source-not-a-pod), got {mismatch} and {not_a_pod}"
        ));
    }
    // The same certificate from mp-multi's own pod (mp-multi-1, node-b): served, on its node
    // and across.
    for to in ["mp-httponly-1", "mp-httponly-0"] {
        let path = HopPath {
            from: "mp-multi-1",
            to,
        };
        match hop_attempt(
            env,
            path,
            as_multi(aether_core::wire::ALPN_HTTP)?,
            &sni,
            &authority,
        )
        .await?
        {
            HopAttempt::Answered(200, first) if first == "mp-httponly:8080" => {}
            other => {
                return Err(format!(
                    "mp-multi-1 → {to} as mp-multi: want 200 from mp-httponly:8080, got {other:?}"
                ));
            }
        }
    }
    Ok(format!(
        "as mp-multi: {} closed after the handshake (HTTP/2 and L4), counted {mismatch} identity-mismatch, {not_a_pod} not-a-pod; from mp-multi-1: 200 mp-httponly:8080 on both nodes",
        refused.join(", ")
    ))
}

async fn bad_http(env: &Env) -> Check {
    let host = format!("{}:8080", env.mesh("mp-multi"));
    let broken = format!("GET / HTTP/1.1\r\nHost: {host}\r\nthis is not a header\r\n\r\n");
    for (client, dial) in [
        (CLIENT, name(&env.mesh("mp-multi"), 8080)),
        ("mp-client-nocapture", loopback()),
    ] {
        let mut p = probe(dial, Send::Raw(broken.clone().into_bytes()));
        p.until = crate::workload::probe::ReadUntil::Close;
        let o = env.probe(client, &p).await?;
        let text = o.body_text();
        if !(text.starts_with("HTTP/1.1 400") && text.contains("x-aether-error: bad-request")) {
            return Err(format!("{client}: want 400 bad-request, got {text:?}"));
        }
    }
    let big = Send::Http(HttpRequest {
        headers: vec![("x-big".into(), "a".repeat(70 * 1024))],
        host: crate::workload::probe::Host::Values(vec![host]),
        ..HttpRequest::get("/")
    });
    let o = env
        .probe("mp-client-nocapture", &probe(loopback(), big))
        .await?;
    answer(&o, 431, "headers-too-large", None)?;
    Ok("400 bad-request on both paths; 431 headers-too-large".into())
}

async fn retained(env: &Env) -> Check {
    let Some(reg) = &env.registry else {
        return Err(env.not_here(Need::RegistryControl));
    };
    let file = reg.dir.join("10-mp-nine.yaml");
    let aside = reg.dir.with_file_name("10-mp-nine.yaml.aside");
    std::fs::rename(&file, &aside).map_err(|e| format!("{}: {e}", file.display()))?;
    let result = async {
        env.settle().await?;
        let host = format!("{}:9000", env.mesh("mp-nine"));
        let mut p = probe(
            loopback(),
            Send::Http(HttpRequest {
                host: crate::workload::probe::Host::Values(vec![host]),
                ..HttpRequest::get("/")
            }),
        );
        p.timeout = Duration::from_secs(5);
        let o = env.probe("mp-client-nocapture", &p).await?;
        answer(&o, 503, "no-endpoints", None)
    }
    .await;
    std::fs::rename(&aside, &file).map_err(|e| format!("{}: {e}", file.display()))?;
    env.settle().await?;
    let o = env
        .probe(
            CLIENT,
            &probe(
                name(&env.mesh("mp-nine"), 9000),
                Send::Http(HttpRequest::get("/")),
            ),
        )
        .await?;
    echo(&o, "mp-nine", 9000).map_err(|e| format!("after restoring: {e}"))?;
    result.map(|d| format!("rows gone: {d} after the hold; restored: echo 9000"))
}

async fn restart(env: &Env) -> Check {
    let Some(hook) = &env.restart else {
        return Err(env.not_here(Need::DaemonProcesses));
    };
    // A pod on node-b, reached from node-a over the hop: the request before the restart leaves a
    // pooled hop connection to node-b behind, which the restart kills.
    let ip = env.pod_ip("mp", "mp-httponly-1")?;
    let host = format!("{}:8080", env.mesh("mp-httponly"));
    let send = || {
        Send::Http(HttpRequest {
            host: crate::workload::probe::Host::Values(vec![host.clone()]),
            ..HttpRequest::get("/")
        })
    };
    let o = env
        .probe(CLIENT, &probe(super::addr(ip, 8080), send()))
        .await?;
    echo(&o, "mp-httponly", 8080).map_err(|e| format!("before: {e}"))?;
    // While node-b's daemon is down and starting, requests keep coming. addressing.md §5.1 and
    // §8 promise each an answer: a delivery, or, while the pod's hop does not answer, the
    // source's own 503 upstream-unreachable at once (a pod-IP dial is never held). Never a
    // hang, never another answer.
    let started = aether::time::now();
    let restarted = std::sync::atomic::AtomicBool::new(false);
    let during = async {
        let (mut delivered, mut refused, mut wrong) = (0u32, 0u32, Vec::new());
        while !restarted.load(std::sync::atomic::Ordering::Relaxed) {
            match env
                .probe(CLIENT, &probe(super::addr(ip, 8080), send()))
                .await
            {
                Ok(o) if echo(&o, "mp-httponly", 8080).is_ok() => delivered += 1,
                Ok(o) if answer(&o, 503, "upstream-unreachable", Some("")).is_ok() => {
                    refused += 1;
                }
                Ok(o) => wrong.push(o.summary()),
                Err(e) => wrong.push(e),
            }
        }
        (delivered, refused, wrong)
    };
    let restart = async {
        let r = (hook.0)("node-b".to_owned()).await;
        restarted.store(true, std::sync::atomic::Ordering::Relaxed);
        r
    };
    let ((delivered, refused, wrong), restarted_ok) = tokio::join!(during, restart);
    restarted_ok?;
    let took = started.elapsed();
    if let Some(w) = wrong.first() {
        return Err(format!(
            "{} of the requests sent during the restart got neither a delivery nor 503 upstream-unreachable: {w}",
            wrong.len()
        ));
    }
    if refused == 0 {
        return Err(format!(
            "no request met the daemon down ({delivered} delivered): the restart was not seen"
        ));
    }
    // Every request after /ready is answered: the source replaces its dead hop connection.
    for i in 0..20 {
        let o = env
            .probe(CLIENT, &probe(super::addr(ip, 8080), send()))
            .await?;
        echo(&o, "mp-httponly", 8080).map_err(|e| format!("request {i} after: {e}"))?;
    }
    // And the new daemon serves node-b's pods again (capture re-applied, listeners re-bound).
    if let Some(reg) = &env.registry
        && let Some(sock) = reg
            .admin_sockets
            .iter()
            .find(|s| s.to_string_lossy().contains("node-node-b"))
    {
        let pods = super::admin_get(sock, "/pods").await?;
        if !pods.contains("\"mp-httponly-1\"") {
            return Err(format!("after the restart node-b serves {pods}"));
        }
    }
    Ok(format!(
        "node-b restarted and ready in {} ms; during it {refused} × 503 upstream-unreachable and {delivered} delivered; 20 requests to its pod after, 0 failed",
        took.as_millis()
    ))
}
