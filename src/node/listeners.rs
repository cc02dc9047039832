//! The daemon's node-wide TCP listeners, the metrics endpoint (`metrics_addr`, the DaemonSet's
//! probes) and the admin endpoint (`admin_addr`), across an upgrade (issue #35 item 4).
//!
//! With `hostNetwork: true` the old and the new daemon pod of a rollout share the node's ports.
//! So these listeners are passed over the hand-off like the pods' ([`super::handoff`], kinds
//! `metrics` and `admin`, no pod): the new daemon serves on the socket it was given, and the
//! old one stops accepting on it once the new one serves every pod ([`NodeListeners::stop`]).
//! Both accept from the same socket meanwhile; the old answers `/ready` 503 from the moment a
//! successor takes its sockets, so a probe of the new pod that the old daemon accepts is never
//! answered "ready". A listener no predecessor handed over (a first start, or a predecessor that
//! does not hand these over) is bound, and the bind is retried every second while the address
//! is in use, so a new daemon never fails because the old one still holds the port.
//!
//! The state directory's unix sockets are shared the same way, by path: a daemon removes one at
//! exit only while the file is still the one it bound ([`OwnedPath`]).
//!
//! IO (Layer 2): sockets and tasks; the accept loops are the admin module's.

use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::AbortHandle;
use tracing::{info, warn};

use super::handoff::ListenerId;

/// How often a bind of an address in use is tried again.
pub const BIND_RETRY: Duration = Duration::from_secs(1);

/// The node-wide listeners: a duplicate of each socket (offered to a successor) and the tasks
/// that accept on them.
#[derive(Debug, Default)]
pub struct NodeListeners {
    offered: Vec<(ListenerId, OwnedFd)>,
    tasks: Vec<AbortHandle>,
    stopped: bool,
}

/// Shared between the accept tasks (which record their socket once they have one) and the
/// daemon's loop (which offers them and stops them).
pub type SharedListeners = Arc<parking_lot::Mutex<NodeListeners>>;

impl NodeListeners {
    /// Duplicates of the sockets, for a successor.
    pub fn offer(&self) -> Vec<(ListenerId, OwnedFd)> {
        self.offered
            .iter()
            .filter_map(|(id, fd)| Some((id.clone(), fd.try_clone().ok()?)))
            .collect()
    }

    /// Stop accepting (a successor serves): the accept tasks end and this process's copies
    /// close; the successor's stay open, so nothing waiting in a queue is lost.
    pub fn stop(&mut self) {
        self.stopped = true;
        for t in self.tasks.drain(..) {
            t.abort();
        }
        self.offered.clear();
    }
}

/// Serve `kind` on `addr` with `serve`: on the socket a predecessor handed over when there is
/// one (`inherited`), else on a new bind, retried every [`BIND_RETRY`] while it fails (logged
/// once). The socket is recorded in `shared` for a successor.
pub fn spawn<F, Fut>(
    shared: &SharedListeners,
    kind: &'static str,
    addr: SocketAddr,
    inherited: Option<OwnedFd>,
    serve: F,
) where
    F: FnOnce(TcpListener) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let record = shared.clone();
    let task = tokio::spawn(async move {
        let listener = match inherited.map(adopt) {
            Some(Ok(l)) => {
                info!(%addr, kind, "listener taken over from the previous daemon");
                l
            }
            other => {
                if let Some(Err(e)) = other {
                    warn!(%addr, kind, error = %e, "the previous daemon's listener cannot be used; binding anew");
                }
                bind_retrying(kind, addr).await
            }
        };
        match listener.as_fd().try_clone_to_owned() {
            Ok(fd) => record
                .lock()
                .offered
                .push((ListenerId::node(kind, addr), fd)),
            Err(e) => {
                warn!(%addr, kind, error = %e, "listener not offered to a successor: it will bind anew")
            }
        }
        serve(listener).await;
    });
    let mut s = shared.lock();
    if s.stopped {
        task.abort();
    } else {
        s.tasks.push(task.abort_handle());
    }
}

/// A listening socket handed over, as a tokio listener.
fn adopt(fd: OwnedFd) -> std::io::Result<TcpListener> {
    let std = std::net::TcpListener::from(fd);
    std.set_nonblocking(true)?;
    TcpListener::from_std(std)
}

async fn bind_retrying(kind: &'static str, addr: SocketAddr) -> TcpListener {
    let mut logged = false;
    loop {
        match TcpListener::bind(addr).await {
            Ok(l) => {
                info!(%addr, kind, "listener bound");
                return l;
            }
            Err(e) => {
                if !logged {
                    warn!(error = %e, %addr, kind, "listener: retrying every second");
                    logged = true;
                }
                tokio::time::sleep(BIND_RETRY).await;
            }
        }
    }
}

/// A unix socket this daemon bound in the state directory, known by the file it made, so that
/// it is removed at exit only while it is still this daemon's: a successor's own `cni.sock`
/// is not, nor the predecessor's `handoff.sock` that a successor which never served leaves.
#[derive(Debug, Clone)]
pub struct OwnedPath {
    path: PathBuf,
    /// Device, inode and change time of the file bound (an inode number can be reused, the
    /// change time with it cannot).
    id: Option<(u64, u64, i64, i64)>,
}

/// Device, inode and change time of the file at `path`: a file made again at the same path
/// differs (an inode number can be reused, the change time with it cannot).
pub fn file_id(path: &Path) -> Option<(u64, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::symlink_metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

impl OwnedPath {
    /// The socket file just bound at `path`.
    pub fn bound(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            id: file_id(path),
        }
    }

    /// Whether `path` is still the file this daemon bound.
    pub fn is_ours(&self) -> bool {
        self.id.is_some() && file_id(&self.path) == self.id
    }

    /// Remove the file if it is still this daemon's.
    pub fn remove_if_ours(&self) {
        if self.is_ours() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
