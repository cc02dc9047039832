//! The leg catalogue of spec/legs.md, run through real sockets from inside client pods: the
//! local e2e suite and `aether demo` both run it against a topology of network namespaces.
//!
//! A leg sends what the spec says a client sends and checks what the spec says the client
//! sees: the status, the `x-aether-error` reason, the `ports:` line, the echo's own identity
//! string, and the time bounds.

/// One leg of the catalogue.
pub struct Leg {
    /// Its id (spec/legs.md, or one of the extra legs).
    pub id: &'static str,
    /// What it checks.
    pub title: &'static str,
    /// The registry overlay it needs (`config/examples/variants/<name>`).
    pub overlay: Option<&'static str>,
    /// The leg.
    pub run: for<'a> fn(
        &'a Env,
    )
        -> std::pin::Pin<Box<dyn Future<Output = Check> + std::marker::Send + 'a>>,
}

impl std::fmt::Debug for Leg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Leg({})", self.id)
    }
}

macro_rules! leg {
    ($id:literal, $title:literal, $overlay:expr, $f:ident) => {
        Leg {
            id: $id,
            title: $title,
            overlay: $overlay,
            run: |e| Box::pin($f(e)),
        }
    };
}

mod balance;
mod catalogue;
mod etcd;
mod explain;
mod extra;
mod hostile;
mod kube;
mod metrics;
mod overload;
mod rollout;
mod rules;
mod traffic;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::workload::probe::{
    Connector, Dial, Host, HttpRequest, Many, Outcome, Probe, Resolver, Send, Summary,
};
use aether::netns::Netns;
use aether_core::model::Snapshot;

pub use balance::BALANCE;
pub use catalogue::LEGS;
pub use etcd::ETCD;
pub use explain::EXPLAIN;
pub use extra::EXTRA;
pub use hostile::HOSTILE;
pub use kube::KUBE;
pub use metrics::{METRICS, parse_exposition, sum as sum_samples};
pub use rules::RULES;

/// Where the legs run.
#[derive(Debug)]
pub struct Env {
    /// The runner's own namespace.
    pub home: Arc<Netns>,
    /// Each client pod's namespace, by pod name (`mp-client`, `mp-client-nocapture`,
    /// `mp-client-other`).
    pub clients: BTreeMap<String, Arc<Netns>>,
    /// The completed registry snapshot (ClusterIPs, pod IPs).
    pub snapshot: Snapshot,
    /// The mesh domain.
    pub mesh_domain: String,
    /// Registry control, for the legs that need a route overlay (None skips them).
    pub registry: Option<RegistryControl>,
    /// The mesh's CA directory (the bad-peer legs issue their own certificates from it).
    pub ca_dir: Option<PathBuf>,
    /// Restarts a node's daemon and waits for its `/ready` (the RESTART leg).
    pub restart: Option<RestartHook>,
    /// Upgrades a node's daemon: starts a new one beside it, which takes its listening sockets;
    /// resolves once the new one serves (the UPGRADE leg).
    pub upgrade: Option<RestartHook>,
    /// Kills a node's daemon at once (SIGKILL), as a crash would, and leaves it dead; `restart`
    /// starts it again (the EKILL leg).
    pub kill: Option<RestartHook>,
    /// Stops every daemon of a node but the newest (SIGTERM, not waited for: it drains), as the
    /// DaemonSet controller deletes the old pod once the new one is Ready (the UPGRADE and
    /// K-ROLLOUT legs).
    pub retire: Option<RestartHook>,
    /// Starts and stops a node's CNI installer, as the DaemonSet's `cni` container runs it
    /// (the K-ROLLOUT leg).
    pub installers: Option<Installers>,
    /// What the running leg found missing ([`Env::not_here`]); the runner takes it.
    pub missing: arc_swap::ArcSwapOption<Need>,
}

/// Restarts the daemon of a node (by name).
#[derive(Clone)]
pub struct RestartHook(pub Arc<dyn Fn(String) -> RestartFuture + std::marker::Send + Sync>);

/// What a [`RestartHook`] returns.
pub type RestartFuture =
    std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + std::marker::Send>>;

impl std::fmt::Debug for RestartHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RestartHook")
    }
}

/// What an [`Installers`] hook returns.
pub type InstallerFuture<T> =
    std::pin::Pin<Box<dyn Future<Output = Result<T, String>> + std::marker::Send>>;

/// A node's CNI installer (`aether cni install --watch --daemonset aether`) on a conflist of the
/// lab's own: 1. [`Installers::start`] runs one for a node; 2. the leg reads `conf_dir` and runs
/// the installed plugin from `bin_dir`, as the container runtime does; 3. [`Installers::stop`]
/// sends it SIGTERM, as kubelet does when its pod goes.
#[derive(Clone)]
pub struct Installers {
    /// Starts one for a node (by name).
    pub start: Arc<dyn Fn(String) -> InstallerFuture<Installer> + std::marker::Send + Sync>,
    /// Stops one (by PID) and waits (bounded) for it to exit; how it ended.
    pub stop: Arc<dyn Fn(u32) -> InstallerFuture<String> + std::marker::Send + Sync>,
}

impl std::fmt::Debug for Installers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Installers")
    }
}

/// A running CNI installer of the lab.
#[derive(Clone, Debug)]
pub struct Installer {
    /// Its PID.
    pub pid: u32,
    /// The CNI configuration directory it keeps the entry in.
    pub conf_dir: PathBuf,
    /// Where it installed the plugin (`aether-cni`).
    pub bin_dir: PathBuf,
}

/// How the runner changes the registry the daemons watch.
#[derive(Debug, Clone)]
pub struct RegistryControl {
    /// The directory the daemons watch.
    pub dir: PathBuf,
    /// The overlays (`config/examples/variants`).
    pub variants: PathBuf,
    /// Each daemon's admin socket.
    pub admin_sockets: Vec<PathBuf>,
    /// The lab API server's control socket when the daemons run on the Kubernetes source: the
    /// directory is loaded into that server, and [`Env::settle`] waits for its objects.
    pub apiserver: Option<PathBuf>,
    /// The lab's etcd when the daemons run on the etcd source: the rows are etcd's, each pod's
    /// readiness its node's delegated probe (spec/model.md §3.5); the etcd legs read and write
    /// its keys and stop, kill and restart its members.
    pub etcd: Option<Arc<crate::lab::etcd::EtcdControl>>,
}

/// What one leg got.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LegResult {
    /// The leg (`A1`, `N23`, ...).
    pub id: &'static str,
    /// What it checks, in short.
    pub title: &'static str,
    /// Passed.
    pub ok: bool,
    /// Skipped, with why (e.g. no registry control).
    pub skipped: Option<String>,
    /// What each request got, or the first failure.
    pub detail: String,
    /// Wall time of the leg, in milliseconds.
    pub ms: u64,
}

/// A leg's own failure text.
pub type Check = Result<String, String>;

/// What a leg needs that a runner may not have (`aether probe --legs` runs inside one pod,
/// with no registry control and no daemons of its own). A leg that finds one missing reports
/// it through [`Env::not_here`] and is reported as skipped, by this kind, not as failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// A client pod, by name.
    Pod(String),
    /// Control of the registry the daemons watch.
    RegistryControl,
    /// The mesh's CA.
    MeshCa,
    /// The daemons' admin and CNI sockets.
    DaemonSockets,
    /// The daemons' processes (to restart one).
    DaemonProcesses,
}

impl std::fmt::Display for Need {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pod(p) => write!(f, "needs client pod {p}"),
            Self::RegistryControl => f.write_str("needs registry control"),
            Self::MeshCa => f.write_str("needs the mesh CA"),
            Self::DaemonSockets => f.write_str("needs the daemons' sockets"),
            Self::DaemonProcesses => f.write_str("needs the daemons' processes"),
        }
    }
}

/// The workload identity strings: a byte containing any of them is an application's answer.
pub const WORKLOADS: &[&str] = &[
    "mp-httponly:",
    "mp-multi:",
    "mp-eighty:",
    "mp-mixed:",
    "mp-tcpfirst:",
    "mp-nine:",
    "mp-serverfirst:",
    "mp-owned:",
    "mp-udp:",
    "ext-http:",
];

impl Env {
    /// Record that the running leg cannot run here for want of `need`; the failure text to
    /// return. The runner reports the leg as skipped.
    pub fn not_here(&self, need: Need) -> String {
        let text = need.to_string();
        self.missing.store(Some(Arc::new(need)));
        text
    }

    /// A client pod's network namespace.
    pub fn client_netns(&self, pod: &str) -> Result<&Arc<Netns>, String> {
        self.clients
            .get(pod)
            .ok_or_else(|| self.not_here(Need::Pod(pod.to_owned())))
    }

    /// A client's connector and resolver.
    fn client(&self, pod: &str) -> Result<(Connector, Resolver), String> {
        let netns = self.client_netns(pod)?;
        let ns = self
            .snapshot
            .pods
            .iter()
            .find(|p| p.name == pod)
            .map_or("mp", |p| p.namespace.as_str());
        Ok((
            Connector::in_netns(netns.clone(), self.home.clone()),
            Resolver::cluster(ns),
        ))
    }

    /// Run one probe from a client pod. Every answer an echo gives is checked for invariant
    /// I3 here, so that no leg can forget it (legs.md §1.5).
    pub async fn probe(&self, pod: &str, probe: &Probe) -> Result<Outcome, String> {
        let (connector, resolver) = self.client(pod)?;
        let o = probe
            .run(&connector, &resolver)
            .await
            .map_err(|e| format!("{pod}: {}", aether::DisplayChain(&e)))?;
        authority_kept(probe, &o)?;
        Ok(o)
    }

    /// Run `many` requests of one probe from a client pod (`aether probe --count N
    /// --concurrency C --keep-alive`), checking invariant I3 and `check` on every answer; the
    /// first failure is the error.
    pub async fn probe_many(
        &self,
        pod: &str,
        probe: &Probe,
        many: Many,
        check: impl Fn(&Outcome) -> Check + std::marker::Send + Sync,
    ) -> Result<Summary, String> {
        let (connector, resolver) = self.client(pod)?;
        let mut broken = None;
        let summary = probe
            .run_many_each(&connector, &resolver, many, |i, o| {
                if broken.is_none() {
                    broken = authority_kept(probe, o)
                        .and_then(|()| check(o).map(drop))
                        .err()
                        .map(|e| format!("request {i}: {e}"));
                }
            })
            .await
            .map_err(|e| format!("{pod}: {}", aether::DisplayChain(&e)))?;
        match broken {
            Some(e) => Err(e),
            None => Ok(summary),
        }
    }

    /// The ClusterIP of a Service.
    pub fn cluster_ip(&self, ns: &str, name: &str) -> Result<IpAddr, String> {
        self.snapshot
            .services
            .iter()
            .find(|s| s.namespace == ns && s.name == name)
            .and_then(|s| s.cluster_ips.first().copied())
            .ok_or_else(|| format!("no ClusterIP for {ns}/{name}"))
    }

    /// The IP of a pod.
    pub fn pod_ip(&self, ns: &str, name: &str) -> Result<IpAddr, String> {
        self.snapshot
            .pods
            .iter()
            .find(|p| p.namespace == ns && p.name == name)
            .and_then(|p| p.ips.first().copied())
            .ok_or_else(|| format!("no IP for pod {ns}/{name}"))
    }

    /// `<wl>.mp.<mesh-domain>`.
    pub fn mesh(&self, wl: &str) -> String {
        format!("{wl}.mp.{}", self.mesh_domain)
    }

    /// Wait until every daemon has published a model of the watched directory as it is now.
    ///
    /// On the Kubernetes source: the lab's API server rereads the directory, then every daemon
    /// must hold exactly the server's objects (its fingerprint) with no write of its own still
    /// to make (`kube_writes_pending`: the registrar's Services, the route statuses, which
    /// change the server's objects in turn), seen twice 200 ms apart.
    pub async fn settle(&self) -> Result<(), String> {
        let Some(reg) = &self.registry else {
            return Err("no registry control".into());
        };
        if let Some(control) = &reg.apiserver {
            return settle_kube(control, &reg.admin_sockets).await;
        }
        let want = aether::registry::file::fingerprint(&reg.dir)
            .map_err(|e| aether::DisplayChain(&e).to_string())?
            .to_string();
        // A daemon on etcd that has just been restarted probes its pods before it settles.
        let bound = Duration::from_secs(if reg.etcd.is_some() { 30 } else { 10 });
        let deadline = aether::time::now() + bound;
        // On the etcd source the directory is not all: every daemon must also have written its
        // own pods' rows (each probed once) and hold the same store revision with nothing newer
        // seen, twice 200 ms apart.
        let mut agreed_on: Option<i64> = None;
        loop {
            let mut all = true;
            let mut revisions = std::collections::BTreeSet::new();
            let mut on_etcd = false;
            for s in &reg.admin_sockets {
                let body = admin_get(s, "/model").await?;
                let v: serde_json::Value =
                    serde_json::from_str(&body).map_err(|e| e.to_string())?;
                all &= v["registry_fingerprint"].as_str() == Some(want.as_str());
                if let Some(etcd) = v["etcd"].as_object() {
                    on_etcd = true;
                    all &= etcd["settled"].as_bool() == Some(true);
                    revisions.insert(etcd["revision_compiled"].as_i64().unwrap_or(-1));
                }
            }
            if !on_etcd && all {
                return Ok(());
            }
            let revision = revisions.first().copied().filter(|_| revisions.len() == 1);
            match (all, revision, agreed_on) {
                (true, Some(r), Some(before)) if r == before => return Ok(()),
                (true, Some(r), _) => agreed_on = Some(r),
                _ => agreed_on = None,
            }
            if aether::time::now() > deadline {
                return Err(format!(
                    "daemons did not publish the registry within {bound:?}"
                ));
            }
            let pause = if on_etcd { 200 } else { 50 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    /// Swap the overlay files in the watched directory (see [`Env::overlay`]) without waiting;
    /// whether anything changed.
    pub fn swap_overlay_files(&self, variant: Option<&str>) -> Result<bool, String> {
        self.swap_overlays_files(variant.as_slice())
    }

    /// As [`Env::swap_overlay_files`], with the files of every one of `variants` (which must
    /// not replace each other's manifests).
    pub fn swap_overlays_files(&self, variants: &[&str]) -> Result<bool, String> {
        let Some(reg) = &self.registry else {
            return Err("no registry control".into());
        };
        let mut changed = false;
        let entries = std::fs::read_dir(&reg.dir).map_err(|e| e.to_string())?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("zz-variant-") {
                std::fs::remove_file(e.path()).map_err(|e| e.to_string())?;
                changed = true;
            }
        }
        for v in variants {
            let dir = reg.variants.join(v);
            let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.ends_with(".yaml") {
                    std::fs::copy(e.path(), reg.dir.join(format!("zz-variant-{v}-{name}")))
                        .map_err(|e| e.to_string())?;
                    changed = true;
                }
            }
        }
        Ok(changed)
    }

    /// Replace the overlay: remove every earlier variant's files from the watched registry,
    /// copy `variant`'s (none for `None`), and wait until every daemon published exactly that.
    pub async fn overlay(&self, variant: Option<&str>) -> Result<(), String> {
        if !self.swap_overlay_files(variant)? {
            return Ok(());
        }
        // Done when every daemon has published a model of exactly this directory's content.
        self.settle()
            .await
            .map_err(|e| format!("overlay {variant:?}: {e}"))
    }
}

/// How long the daemons get to hold the lab API server's objects after a change.
const KUBE_SETTLE: Duration = Duration::from_secs(30);

/// [`Env::settle`] on the Kubernetes source.
async fn settle_kube(control: &std::path::Path, sockets: &[PathBuf]) -> Result<(), String> {
    control_request(control, "POST", "/lab/reload").await?;
    let deadline = aether::time::now() + KUBE_SETTLE;
    let mut agreed_on: Option<String> = None;
    loop {
        let want = apiserver_fingerprint(control).await?;
        let mut all = true;
        for s in sockets {
            let body = admin_get(s, "/model").await?;
            let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            let pending = v["kube_writes_pending"].as_bool().unwrap_or(false);
            all &= !pending && v["registry_fingerprint"].as_str() == Some(want.as_str());
        }
        match (all, &agreed_on) {
            (true, Some(before)) if *before == want => return Ok(()),
            (true, _) => agreed_on = Some(want.clone()),
            (false, _) => agreed_on = None,
        }
        if aether::time::now() > deadline {
            let have = fingerprints(sockets).await.unwrap_or_default();
            return Err(format!(
                "daemons did not hold the lab API server's objects within {KUBE_SETTLE:?} (server {want}, daemons {have:?})"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The lab API server's fingerprint (`GET /lab/fingerprint`).
pub async fn apiserver_fingerprint(control: &std::path::Path) -> Result<String, String> {
    let body = control_request(control, "GET", "/lab/fingerprint").await?;
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    v["fingerprint"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no fingerprint in {body:?}"))
}

/// Invariant I3 (addressing.md §12, legs.md §1.5): an answer from an echo (it carries
/// `x-echo-pod`) reports exactly one received authority, the one the request named.
pub fn authority_kept(probe: &Probe, o: &Outcome) -> Result<(), String> {
    let want = match &probe.send {
        Send::Http(req) => req.authority(&probe.dial.authority()),
        Send::Grpc(req) => Some(
            req.authority
                .clone()
                .unwrap_or_else(|| probe.dial.authority()),
        ),
        Send::Raw(_) | Send::Nothing | Send::TlsClientHello { .. } | Send::Udp(_) => {
            return Ok(());
        }
    };
    if o.header("x-echo-pod").is_none() {
        return Ok(());
    }
    let got = o.header_all("x-echo-host");
    match (&want, got.as_slice()) {
        (Some(w), [g]) if w == g => Ok(()),
        _ => Err(format!(
            "I3: the echo received authority {got:?}, the request named {want:?}"
        )),
    }
}

/// The registry fingerprint of each daemon's published model, from its admin socket.
pub async fn fingerprints(sockets: &[PathBuf]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for s in sockets {
        let body = admin_get(s, "/model").await?;
        let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        out.push(v["registry_fingerprint"].as_str().unwrap_or("").to_owned());
    }
    Ok(out)
}

/// GET a path on a daemon's admin unix socket; the body.
pub async fn admin_get(socket: &std::path::Path, path: &str) -> Result<String, String> {
    control_request(socket, "GET", path).await
}

/// One request without a body on a unix socket that speaks HTTP/1.1 (a daemon's admin socket,
/// the lab API server's control socket); the body of a 200, else an error naming the status.
pub async fn control_request(
    socket: &std::path::Path,
    method: &str,
    path: &str,
) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    let length = if method == "GET" {
        ""
    } else {
        "Content-Length: 0\r\n"
    };
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: admin\r\n{length}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .map_err(|_| format!("{} timed out", socket.display()))?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "{method} {path}: {} {}",
            head.lines().next().unwrap_or(""),
            body.trim()
        ));
    }
    Ok(body.to_owned())
}

/// `GET path` on `stream` (HTTP/1.1, `Connection: close`), as kubelet's HTTP probe asks: the
/// answer's status, or `None` when no whole answer came. Unbounded: the caller bounds it.
pub async fn probe_status<S>(mut stream: S, path: &str) -> Option<u16>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
    let mut got = Vec::new();
    stream.read_to_end(&mut got).await.ok()?;
    String::from_utf8_lossy(&got)
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Run the legs whose id matches `filter` (all for `None`), in catalogue order.
pub async fn run(env: &Env, filter: Option<&[String]>) -> Vec<LegResult> {
    let mut out = Vec::new();
    // The Kubernetes source's own legs are listed only where the daemons are on it.
    let kube: &[Leg] = match &env.registry {
        Some(RegistryControl {
            apiserver: Some(_), ..
        }) => KUBE,
        _ => &[],
    };
    // So are the etcd source's.
    let etcd: &[Leg] = match &env.registry {
        Some(RegistryControl { etcd: Some(_), .. }) => ETCD,
        _ => &[],
    };
    for leg in LEGS
        .iter()
        .chain(EXTRA)
        .chain(METRICS)
        .chain(RULES)
        .chain(HOSTILE)
        .chain(BALANCE)
        .chain(EXPLAIN)
        .chain(kube)
        .chain(etcd)
    {
        if let Some(f) = filter
            && !f.iter().any(|id| id.eq_ignore_ascii_case(leg.id))
        {
            continue;
        }
        let started = aether::time::now();
        env.missing.store(None);
        let (ok, skipped, detail) = if leg.overlay.is_some() && env.registry.is_none() {
            (true, Some(Need::RegistryControl.to_string()), String::new())
        } else {
            let outcome = (leg.run)(env).await;
            // A leg's overlay never outlives it.
            let reset = match leg.overlay {
                Some(_) => env.overlay(None).await,
                None => Ok(()),
            };
            match (outcome, reset, env.missing.swap(None)) {
                (Err(_), _, Some(need)) => (true, Some(need.to_string()), String::new()),
                (Ok(d), Ok(()), _) => (true, None, d),
                (Err(d), _, None) => (false, None, d),
                (Ok(_), Err(e), _) => (false, None, format!("removing the overlay: {e}")),
            }
        };
        out.push(LegResult {
            id: leg.id,
            title: leg.title,
            ok,
            skipped,
            detail,
            ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        });
    }
    if env.registry.is_some() {
        let _ = env.overlay(None).await;
    }
    out
}

/// The results as a table, one line per leg, and a closing count.
pub fn table(results: &[LegResult]) -> String {
    let mut s = String::new();
    for r in results {
        let verdict = match (&r.skipped, r.ok) {
            (Some(_), _) => "SKIP",
            (None, true) => "ok",
            (None, false) => "FAIL",
        };
        let detail = r.skipped.as_deref().unwrap_or(&r.detail);
        s.push_str(&format!(
            "{:<11} {:<4} {:>6}ms  {}  {}\n",
            r.id, verdict, r.ms, r.title, detail
        ));
    }
    let passed = results
        .iter()
        .filter(|r| r.ok && r.skipped.is_none())
        .count();
    let failed = results.iter().filter(|r| !r.ok).count();
    let skipped = results.iter().filter(|r| r.skipped.is_some()).count();
    // The failures again just above the count, so a log cut to its head and tail still shows
    // which legs failed and why.
    for r in results.iter().filter(|r| !r.ok) {
        s.push_str(&format!("failed: {}: {}\n", r.id, r.detail));
    }
    s.push_str(&format!(
        "legs: {passed} passed, {failed} failed, {skipped} skipped\n"
    ));
    s
}

// === Building blocks for the catalogue ===

/// A dial by name.
pub fn name(n: &str, port: u16) -> Dial {
    Dial::Name {
        name: n.to_owned(),
        port,
    }
}

/// A dial by address.
pub fn addr(ip: IpAddr, port: u16) -> Dial {
    Dial::Addr(SocketAddr::new(ip, port))
}

/// The loopback proxy port.
pub fn loopback() -> Dial {
    addr(IpAddr::from([127, 0, 0, 1]), 18081)
}

/// A probe.
pub fn probe(dial: Dial, send: Send) -> Probe {
    Probe::new(dial, send)
}

/// Status 200, body `<wl>:<port>`, no reason. (`x-echo-host` is checked for every answer an
/// echo gives, in [`Env::probe`].)
pub fn echo(o: &Outcome, wl: &str, port: u16) -> Check {
    let want = format!("{wl}:{port}");
    if o.status != Some(200) || o.first_line() != want || o.reason().is_some() {
        return Err(format!("want echo {want}, got {}", o.summary()));
    }
    Ok(want)
}

/// Response headers: each `(name, Some(value))` present with exactly that value, each
/// `(name, None)` absent.
pub fn headers(o: &Outcome, want: &[(&str, Option<&str>)]) -> Check {
    for (name, value) in want {
        let got = o.header(name);
        if got != *value {
            return Err(match value {
                Some(v) => format!("{name}: {got:?}, want {v:?}"),
                None => format!("{name}: {got:?}, want none"),
            });
        }
    }
    Ok(String::new())
}

/// A mesh answer: the status, the reason, the body's first line, and (when given) exactly the
/// `ports:` line.
pub fn answer(o: &Outcome, status: u16, reason: &str, ports: Option<&str>) -> Check {
    if o.status != Some(status) || o.reason() != Some(reason) || o.first_line() != reason {
        return Err(format!("want {status} {reason}, got {}", o.summary()));
    }
    if let Some(p) = ports {
        let want = if p.is_empty() {
            "ports:".to_owned()
        } else {
            format!("ports: {p}")
        };
        if !o.body_text().lines().any(|l| l == want) {
            return Err(format!(
                "{status} {reason}: want {want:?} in {:?}",
                o.body_text()
            ));
        }
    }
    Ok(format!("{status} {reason}"))
}

/// How long "no application answers" listens (legs.md §1.5).
pub const NO_APP_WAIT: Duration = Duration::from_secs(3);

/// "No application answers" (legs.md §1.5): no byte received holds a workload's identity, and
/// what came back is silence, a close or a reset, or (for an HTTP request the mesh passes
/// through, when `mesh_503` names it) the mesh's `503` with exactly that reason. Any other
/// status, a mesh answer with another reason included, is a failure.
pub fn no_app(o: &Outcome, mesh_503: Option<&str>) -> Check {
    let text = o.body_text();
    if let Some(w) = WORKLOADS.iter().find(|w| text.contains(*w)) {
        return Err(format!("an application answered ({w}): {}", o.summary()));
    }
    match (o.status, mesh_503) {
        (None, _) => Ok(if o.connected {
            "no answer".into()
        } else {
            "refused".into()
        }),
        (Some(503), Some(r)) if o.reason() == Some(r) => Ok(format!("mesh 503 {r}")),
        (Some(_), _) => Err(format!(
            "want no answer{}, got {}",
            mesh_503.map_or(String::new(), |r| format!(" or 503 {r}")),
            o.summary()
        )),
    }
}

/// Under a bound, from send to the status line (or first byte).
pub fn within(o: &Outcome, bound: Duration) -> Check {
    match o.timings.first_byte {
        Some(t) if t <= bound => Ok(format!("{:.1}ms", t.as_secs_f64() * 1000.0)),
        Some(t) => Err(format!(
            "took {:.1}ms, bound {bound:?}",
            t.as_secs_f64() * 1000.0
        )),
        None => Err(format!("no answer within {bound:?}: {}", o.summary())),
    }
}

pub(super) fn get(path: &str) -> Send {
    Send::Http(HttpRequest::get(path))
}

pub(super) fn get_host(path: &str, host: &str) -> Send {
    Send::Http(HttpRequest {
        host: Host::Values(vec![host.to_owned()]),
        ..HttpRequest::get(path)
    })
}

fn with_headers(path: &str, host: Option<&str>, headers: &[(&str, &str)]) -> Send {
    Send::Http(HttpRequest {
        host: host.map_or(Host::Default, |h| Host::Values(vec![h.to_owned()])),
        headers: headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..HttpRequest::get(path)
    })
}

fn ctx(what: impl std::fmt::Display) -> impl FnOnce(String) -> String {
    move |e| format!("{what}: {e}")
}

/// Run one HTTP probe from a client and check it.
async fn http(
    env: &Env,
    client: &str,
    dial: Dial,
    send: Send,
    check: impl FnOnce(&Outcome) -> Check,
) -> Check {
    let label = format!("{client} → {}", dial.authority());
    let o = env
        .probe(client, &probe(dial, send))
        .await
        .map_err(ctx(&label))?;
    check(&o).map_err(ctx(&label))
}

/// A counter of mp-authz (`/count`: the checks it answered; `/echo-count`: the requests it echoed), read from mp-client.
async fn mp_authz_counter(env: &Env, path: &str) -> Result<u64, String> {
    let o = env
        .probe(
            "mp-client",
            &probe(name(&env.mesh("mp-authz"), 9191), get(path)),
        )
        .await?;
    o.first_line()
        .trim()
        .parse()
        .map_err(|_| format!("mp-authz {path}: {}", o.summary()))
}

async fn authz_count(env: &Env) -> Result<u64, String> {
    mp_authz_counter(env, "/count").await
}

#[cfg(test)]
mod tests {
    use super::{LegResult, table};

    fn result(id: &'static str, ok: bool, detail: &str) -> LegResult {
        LegResult {
            id,
            title: "a leg",
            ok,
            skipped: None,
            detail: detail.into(),
            ms: 1,
        }
    }

    /// A failed leg is named with its reason again just above the count, so the tail of a long
    /// run's log says which leg failed.
    #[test]
    fn the_table_ends_with_the_failures_and_the_count() {
        let t = table(&[
            result("A1", true, "200"),
            result("N7", false, "got 200, want 400 bad-request"),
            result("A2", true, "200"),
        ]);
        let tail: Vec<&str> = t.lines().rev().take(2).collect();
        assert_eq!(
            tail,
            [
                "legs: 2 passed, 1 failed, 0 skipped",
                "failed: N7: got 200, want 400 bad-request"
            ]
        );
        let clean = table(&[result("A1", true, "200")]);
        assert!(!clean.contains("failed:"), "{clean}");
    }
}
