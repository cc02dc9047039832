//! The local lab's stand-in for a Kubernetes API server (`aether lab-apiserver`): enough of the
//! protocol for the daemon's Kubernetes source, its registrar and its route-status writer to
//! run against it on one machine. It is a test fixture, **not for production**: no
//! authentication, no admission, no RBAC, no persistence.
//!
//! What it serves (loopback or a lab namespace, plain HTTP/1.1):
//! - the types of [`resources::RESOURCES`], at `/api/v1/...` and `/apis/<group>/<version>/...`,
//!   stored by (group, plural), namespace and name, at whatever version a client asks for;
//! - list (`limit`/`continue`, `labelSelector`, `fieldSelector`), watch (chunked events from a
//!   resourceVersion, `410 Gone` as an `ERROR` event when the history no longer reaches back,
//!   `allowWatchBookmarks`, `sendInitialEvents`, `timeoutSeconds` capped by
//!   [`Settings::watch_timeout_cap`]);
//! - get, create, replace (`PUT`, the body's resourceVersion a precondition), merge patch (RFC
//!   7386), server-side apply, delete (an object with finalizers, or deleted with
//!   `propagationPolicy: Foreground`, is only marked with `deletionTimestamp`: no garbage
//!   collector runs); `/status` writes change only the status, main writes keep
//!   it. **Server-side apply merges the applied fields into the object; field ownership and
//!   conflicts between managers are NOT modelled** (only the kind suite proves that part);
//! - the manifest directory, loaded at start and, with `--watch-dir`, reconciled as `kubectl
//!   apply` would on every change ([`store::Store::reconcile`]);
//! - a control API on a unix socket ([`control`]) for tests: reload, fingerprint, expire every
//!   watch, stop and start serving, refuse the reads of a resource (`403 Forbidden`, as a
//!   ClusterRole without them gets) and lift that, end a resource's open watches (as the
//!   server's watch timeout does), the stored objects, the write counts.
//!
//! Every peer is treated as hostile: each connection must send its request head within
//! [`Settings::head_timeout`], a body over [`Settings::max_body`] is refused (413), and at most
//! [`Settings::max_connections`] connections are served at once (more are closed at accept).
//!
//! Layer 2 (IO): hyper, tokio, the manifest directory. The stored objects are plain
//! `serde_json::Value`s; nothing here interprets them beyond metadata, a Service's ClusterIP and
//! the selector fields.

pub mod api;
pub mod control;
pub mod dir;
pub mod http;
pub mod resources;
pub mod select;
pub mod store;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use parking_lot::Mutex;
use tokio::sync::watch;

use self::resources::ResourceType;
use self::store::{ApiError, ClusterIps, Store};
use aether::registry::kube::objects::{WATCHED_KINDS, fingerprint_keys};

/// The body of every answer the stand-in server gives.
pub type Body = http_body_util::combinators::BoxBody<bytes::Bytes, BoxError>;

/// A boxed error of an answer's body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A whole body of `bytes`.
fn full(bytes: impl Into<bytes::Bytes>) -> Body {
    use http_body_util::BodyExt;
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// Events the history keeps for watches to resume from (the real server keeps a window of a
/// few minutes; a watch from before it gets `410 Gone`).
pub const HISTORY_EVENTS: usize = 10_000;
/// How often an idle watch that asked for bookmarks gets one.
pub const BOOKMARK_EVERY: Duration = Duration::from_secs(5);
/// The longest a watch is served before the server ends it (a client's `timeoutSeconds` is
/// honoured below this; kube-rs asks for 290 s).
pub const WATCH_TIMEOUT_CAP: Duration = Duration::from_secs(600);
/// How long a connection may take to send a request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request body read (the real server's limit is 3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 256;

/// How the server runs: every limit is a named setting.
#[derive(Clone, Debug)]
pub struct Settings {
    /// [`HISTORY_EVENTS`].
    pub history_events: usize,
    /// [`BOOKMARK_EVERY`].
    pub bookmark_every: Duration,
    /// [`WATCH_TIMEOUT_CAP`].
    pub watch_timeout_cap: Duration,
    /// [`HEAD_TIMEOUT`].
    pub head_timeout: Duration,
    /// [`MAX_BODY`], in bytes.
    pub max_body: usize,
    /// [`MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// The range Services without a given ClusterIP get theirs from
    /// ([`crate::lab::DEFAULT_SERVICE_CIDR`] by default).
    pub service_cidr: IpNet,
    /// ClusterIPs to give, by `namespace/name` (`--cluster-ips`).
    pub cluster_ips: BTreeMap<String, IpAddr>,
    /// Refuse to create an object in a namespace that does not exist (`404`, as the real
    /// server's admission does). Off by default: the lab's fixtures write the release
    /// namespace's Lease without a Namespace object for it.
    pub namespaces_must_exist: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            history_events: HISTORY_EVENTS,
            bookmark_every: BOOKMARK_EVERY,
            watch_timeout_cap: WATCH_TIMEOUT_CAP,
            head_timeout: HEAD_TIMEOUT,
            max_body: MAX_BODY,
            max_connections: MAX_CONNECTIONS,
            service_cidr: crate::lab::DEFAULT_SERVICE_CIDR
                .parse()
                .expect("the default service CIDR is a valid literal"),
            cluster_ips: BTreeMap::new(),
            namespaces_must_exist: false,
        }
    }
}

/// What watches and connections follow: the resourceVersion, how many times the history was
/// expired, and whether the server is stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Signal {
    /// The store's resourceVersion.
    pub rv: u64,
    /// Bumped by [`ApiServer::expire`]: every open watch gets `410 Gone`.
    pub expired: u64,
    /// Set by [`ApiServer::stop`]: connections close and new ones are refused.
    pub stopped: bool,
    /// Bumped by [`ApiServer::end_watches`]: the open watches of that resource end.
    pub watches_ended: u64,
}

/// A read an API client may be refused, as RBAC names its verbs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ReadVerb {
    /// One object by name.
    Get,
    /// A collection.
    List,
    /// A collection's changes.
    Watch,
}

impl ReadVerb {
    /// Every read verb: what a ClusterRole rule without the resource leaves out.
    pub const ALL: &[Self] = &[Self::Get, Self::List, Self::Watch];

    /// The verb as RBAC spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
        }
    }

    /// `get`, `list` or `watch`.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.as_str() == text)
    }
}

/// What the lab's authorization refuses, and how many times each resource's open watches were
/// ended: set through the control API.
#[derive(Debug, Default)]
struct Access {
    refused: BTreeMap<ResourceType, Vec<ReadVerb>>,
    watches_ended: BTreeMap<ResourceType, u64>,
}

/// The fake API server could not start or reload.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// The manifest directory does not load.
    #[error(transparent)]
    Dir(#[from] dir::DirError),
    /// The directory's objects were refused (a Service ClusterIP change, ...).
    #[error("manifest directory {}: {source}", dir.display())]
    Refused {
        /// The directory.
        dir: PathBuf,
        /// What the store said.
        #[source]
        source: ApiError,
    },
    /// A listener could not be bound.
    #[error("listen on {what}")]
    Listen {
        /// The address or socket path.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The ClusterIP map cannot be read.
    #[error("ClusterIP map {}", path.display())]
    ClusterIps {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A reload task failed to run.
    #[error("reload task")]
    Task(#[source] tokio::task::JoinError),
}

/// The server's shared state: the store, the signal watches follow, the settings and the
/// manifest directory.
#[derive(Debug)]
pub struct ApiServer {
    store: Mutex<Store>,
    signal: watch::Sender<Signal>,
    settings: Settings,
    dir: Option<PathBuf>,
    /// Held through a whole reload, so that two reloads never apply their reads out of order.
    reloading: Mutex<()>,
    /// The reads refused, the watches ended.
    access: Mutex<Access>,
}

impl ApiServer {
    /// A server with an empty store; `dir` is what [`ApiServer::reload`] reads.
    pub fn new(settings: Settings, dir: Option<PathBuf>) -> Arc<Self> {
        let mut store = Store::new(
            settings.history_events,
            ClusterIps {
                given: settings.cluster_ips.clone(),
                cidr: settings.service_cidr,
            },
        );
        store.namespaces_must_exist = settings.namespaces_must_exist;
        Arc::new(Self {
            store: Mutex::new(store),
            signal: watch::Sender::new(Signal::default()),
            settings,
            dir,
            reloading: Mutex::new(()),
            access: Mutex::new(Access::default()),
        })
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Runs `f` on the store, then tells the watches the new resourceVersion.
    pub fn write<T>(&self, f: impl FnOnce(&mut Store) -> T) -> T {
        let (out, rv) = {
            let mut store = self.store.lock();
            let out = f(&mut store);
            (out, store.rv())
        };
        self.signal.send_if_modified(|s| {
            let changed = s.rv != rv;
            s.rv = rv;
            changed
        });
        out
    }

    /// Runs `f` on the store without writing.
    pub fn read<T>(&self, f: impl FnOnce(&Store) -> T) -> T {
        f(&self.store.lock())
    }

    /// A receiver of the signal.
    pub fn subscribe(&self) -> watch::Receiver<Signal> {
        self.signal.subscribe()
    }

    /// Rereads the manifest directory and reconciles the store with it (blocking: call it off
    /// the runtime's threads). Returns the new fingerprint.
    pub fn reload(&self) -> Result<u64, ApiServerError> {
        if let Some(dir) = &self.dir {
            let _one_at_a_time = self.reloading.lock();
            let desired = dir::load(dir)?;
            self.write(|s| s.reconcile(desired))
                .map_err(|source| ApiServerError::Refused {
                    dir: dir.clone(),
                    source,
                })?;
        }
        Ok(self.fingerprint())
    }

    /// The fingerprint a daemon reports (`/model` `registry_fingerprint`) when its stores hold
    /// exactly this server's objects of the watched kinds.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint_of(|_, _| true)
    }

    /// [`ApiServer::fingerprint`] of the objects `keep` keeps (a test's stores leave out an
    /// object that does not deserialize).
    pub fn fingerprint_of(&self, keep: impl Fn(&store::Key, &serde_json::Value) -> bool) -> u64 {
        self.read(|s| {
            let keys: Vec<(String, String, String, String)> = s
                .all()
                .filter(|(k, v)| WATCHED_KINDS.contains(&k.resource.kind) && keep(k, v))
                .map(|(k, v)| {
                    (
                        k.resource.kind.to_owned(),
                        k.namespace.clone(),
                        k.name.clone(),
                        v["metadata"]["resourceVersion"]
                            .as_str()
                            .unwrap_or("")
                            .to_owned(),
                    )
                })
                .collect();
            fingerprint_keys(
                keys.iter()
                    .map(|(a, b, c, d)| (a.as_str(), b.as_str(), c.as_str(), d.as_str())),
            )
        })
    }

    /// Every open watch gets `410 Gone` and the history is dropped: the next watch relists.
    pub fn expire(&self) {
        self.store.lock().expire();
        self.signal.send_modify(|s| s.expired += 1);
    }

    /// Closes every connection (and so every watch) and refuses new ones until
    /// [`ApiServer::start`].
    pub fn stop(&self) {
        self.signal.send_modify(|s| s.stopped = true);
    }

    /// Serves again after [`ApiServer::stop`].
    pub fn start(&self) {
        self.signal.send_modify(|s| s.stopped = false);
    }

    /// From now on, `verbs` of `resource` are answered `403 Forbidden`, as the real server
    /// answers a client whose roles grant none of them: a list or a new watch gets the `Status`
    /// at once, and its body says who may not do what. As on the real server, a watch already
    /// open goes on (authorization is checked when a request arrives): [`ApiServer::end_watches`]
    /// ends it, as its timeout would.
    pub fn forbid(&self, resource: ResourceType, verbs: &[ReadVerb]) {
        self.access.lock().refused.insert(resource, verbs.to_vec());
    }

    /// Lifts [`ApiServer::forbid`] for `resource`.
    pub fn allow(&self, resource: ResourceType) {
        self.access.lock().refused.remove(&resource);
    }

    /// `403 Forbidden` when `verb` of `resource` is refused, worded as the real server words
    /// it (the lab authenticates nobody: its clients are anonymous).
    pub fn authorize(
        &self,
        resource: ResourceType,
        verb: ReadVerb,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> Result<(), ApiError> {
        let refused = self
            .access
            .lock()
            .refused
            .get(&resource)
            .is_some_and(|verbs| verbs.contains(&verb));
        if !refused {
            return Ok(());
        }
        let subject = match name {
            Some(n) => format!("{resource} \"{n}\""),
            None => resource.to_string(),
        };
        let scope = match namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_owned(),
        };
        Err(ApiError::new(
            403,
            "Forbidden",
            format!(
                "{subject} is forbidden: User \"system:anonymous\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
                verb.as_str(),
                resource.plural,
                resource.group
            ),
        ))
    }

    /// Ends every open watch of `resource` the way the server's watch timeout ends one: the
    /// response ends cleanly, and the client watches again from the last version it saw.
    pub fn end_watches(&self, resource: ResourceType) {
        *self
            .access
            .lock()
            .watches_ended
            .entry(resource)
            .or_default() += 1;
        self.signal.send_modify(|s| s.watches_ended += 1);
    }

    /// How many times the open watches of `resource` were ended (a watch notes it when it
    /// starts, and ends when it changes).
    pub fn watches_ended(&self, resource: ResourceType) -> u64 {
        self.access
            .lock()
            .watches_ended
            .get(&resource)
            .copied()
            .unwrap_or(0)
    }
}

/// What `aether lab-apiserver` was asked to do.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The API's address.
    pub listen: SocketAddr,
    /// The manifest directory loaded at start.
    pub dir: Option<PathBuf>,
    /// Reconcile the directory on every change.
    pub watch_dir: bool,
    /// The control API's unix socket.
    pub control: Option<PathBuf>,
    /// The settings.
    pub settings: Settings,
}

/// Reads a `--cluster-ips` file: a JSON object `{"namespace/name": "address"}`.
pub fn read_cluster_ips(path: &Path) -> Result<BTreeMap<String, IpAddr>, ApiServerError> {
    let err = |source: Box<dyn std::error::Error + Send + Sync>| ApiServerError::ClusterIps {
        path: path.to_path_buf(),
        source,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(Box::new(e)))?;
    serde_json::from_str(&text).map_err(|e| err(Box::new(e)))
}

/// Loads the directory, binds the API and the control socket, and serves until `stop` resolves.
pub async fn run(opts: RunOptions, stop: impl Future<Output = ()>) -> Result<(), ApiServerError> {
    let server = ApiServer::new(opts.settings.clone(), opts.dir.clone());
    let loader = server.clone();
    let fingerprint = tokio::task::spawn_blocking(move || loader.reload())
        .await
        .map_err(ApiServerError::Task)??;
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|source| ApiServerError::Listen {
            what: opts.listen.to_string(),
            source,
        })?;
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(http::serve(server.clone(), listener));
    if let Some(path) = &opts.control {
        let _ = std::fs::remove_file(path);
        let control =
            tokio::net::UnixListener::bind(path).map_err(|source| ApiServerError::Listen {
                what: path.display().to_string(),
                source,
            })?;
        tasks.spawn(control::serve(server.clone(), control));
    }
    let mut _watcher = None;
    if let (true, Some(dir)) = (opts.watch_dir, &opts.dir) {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        _watcher = aether::registry::file::watch_dir(dir, tx);
        tasks.spawn(reload_on_change(server.clone(), rx));
    }
    tracing::info!(listen = %opts.listen, fingerprint, "lab API server serving");
    stop.await;
    tasks.abort_all();
    if let Some(path) = &opts.control {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// How long a change of the directory is let settle before it is read (several files are
/// usually written together).
const RELOAD_DEBOUNCE: Duration = Duration::from_millis(100);

/// Reconciles the directory after every change; a directory that does not load is logged and
/// the objects stay as they were (as a failed `kubectl apply` leaves them).
async fn reload_on_change(server: Arc<ApiServer>, mut changed: tokio::sync::mpsc::Receiver<()>) {
    while changed.recv().await.is_some() {
        tokio::time::sleep(RELOAD_DEBOUNCE).await;
        while changed.try_recv().is_ok() {}
        let s = server.clone();
        match tokio::task::spawn_blocking(move || s.reload()).await {
            Ok(Ok(fingerprint)) => tracing::info!(fingerprint, "manifest directory reconciled"),
            Ok(Err(e)) => {
                tracing::warn!(error = %aether::DisplayChain(&e), "manifest directory not reconciled; the objects stay as they were");
            }
            Err(e) => tracing::warn!(error = %e, "reload task failed"),
        }
    }
}

/// A server on an ephemeral loopback port, loaded from `dir`, its address, and a
/// `kube::Client` of it: what the tests of the daemon's Kubernetes parts run against (the
/// `testing` feature).
///
/// # Panics
/// When the server cannot start (a test helper).
#[cfg(any(test, feature = "testing"))]
pub async fn serve_on_loopback(
    settings: Settings,
    dir: Option<PathBuf>,
) -> (Arc<ApiServer>, SocketAddr, kube::Client) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = ApiServer::new(settings, dir);
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.reload())
        .await
        .expect("the reload task runs")
        .expect("the directory loads");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("a bound address");
    tokio::spawn(http::serve(server.clone(), listener));
    let config = kube::Config::new(
        format!("http://{addr}")
            .parse()
            .expect("a loopback URL parses"),
    );
    let client = kube::Client::try_from(config).expect("a client of the loopback server");
    (server, addr, client)
}

#[cfg(test)]
mod tests;
