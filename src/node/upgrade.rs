//! Changing places with a successor daemon (an upgrade; issue #8 §4, issue #35 item 4): the start
//! marker, the hand-off socket, and telling the predecessor that every pod is served.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, mpsc};
use tracing::{error, info, warn};

use super::NodeConfig;
use super::pods::Pods;
use super::{handoff, listeners};

/// Where the daemon says it has started (`pod_dir`): written once it has taken its
/// predecessor's sockets or found none, so that a predecessor answers `/ready` 503 from then on.
/// The chart's startup probe waits for it, so that no readiness probe of the new pod runs
/// while the old daemon could still answer it as if it were the new one (issue #35 item 4).
pub const STARTED_MARKER: &str = "started";

pub(super) fn mark_started(config: &NodeConfig) {
    let Some(dir) = &config.pod_dir else { return };
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(dir.join(STARTED_MARKER), b"started\n"));
    if let Err(e) = written {
        error!(dir = %dir.display(), error = %e, "the start marker cannot be written: the startup probe will fail");
    }
}

/// A successor daemon's hand-off, as the task serving `handoff.sock` tells the daemon's loop.
#[derive(Debug)]
pub(super) enum Handing {
    /// A successor asks for the sockets: stop accepting ADDs and reconciling, and send them.
    Taking(tokio::sync::oneshot::Sender<Vec<(handoff::ListenerId, std::os::fd::OwnedFd)>>),
    /// It did not take over: serve on.
    Failed,
    /// It serves every pod: stop accepting.
    Done,
}

/// Every pod is served on the predecessor's sockets: tell it, so that it stops accepting and
/// drains; sockets no pod took are closed.
pub(super) async fn hand_over_done(
    predecessor: &mut Option<handoff::Taken>,
    pods: &Arc<Mutex<Pods>>,
) {
    let Some(taken) = predecessor.take() else {
        return;
    };
    let unused = pods.lock().await.drop_unused_inherited();
    match tokio::task::spawn_blocking(move || taken.ready()).await {
        Ok(Ok(())) => info!(
            unused,
            "the previous daemon hands over: it drains and exits"
        ),
        Ok(Err(e)) => warn!(error = %crate::DisplayChain(&e), "telling the previous daemon failed"),
        Err(e) => warn!(error = %e, "telling the previous daemon failed"),
    }
}

/// Offer this daemon's listening sockets on `path` to a successor: each connection asks the
/// daemon's loop for them ([`Handing::Taking`]), then passes them; the loop hears how it ended.
/// The file bound, or `None` (logged) when it could not be.
pub(super) fn serve_handoff(
    path: &Path,
    handing: mpsc::Sender<Handing>,
) -> Option<listeners::OwnedPath> {
    let _ = std::fs::remove_file(path);
    let listener = match tokio::net::UnixListener::bind(path) {
        Ok(l) => l,
        Err(e) => {
            error!(error = %e, path = %path.display(), "handoff socket: upgrades will drop connections");
            return None;
        }
    };
    let owned = listeners::OwnedPath::bound(path);
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    warn!(error = %e, "handoff accept failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let Ok(stream) = stream.into_std().and_then(|s| {
                s.set_nonblocking(false)?;
                Ok(s)
            }) else {
                continue;
            };
            let (reply, offered) = tokio::sync::oneshot::channel();
            if handing.send(Handing::Taking(reply)).await.is_err() {
                return;
            }
            let Ok(listeners) = offered.await else {
                return;
            };
            let n = listeners.len();
            let outcome = match tokio::task::spawn_blocking(move || {
                handoff::give(&stream, listeners)
            })
            .await
            {
                Ok(Ok(())) => {
                    info!(sockets = n, "handed the listening sockets to a successor");
                    Handing::Done
                }
                Ok(Err(e)) => {
                    warn!(error = %crate::DisplayChain(&e), "handoff to a successor failed; still serving");
                    Handing::Failed
                }
                Err(e) => {
                    warn!(error = %e, "handoff task failed; still serving");
                    Handing::Failed
                }
            };
            let done = matches!(outcome, Handing::Done);
            if handing.send(outcome).await.is_err() || done {
                return;
            }
        }
    });
    Some(owned)
}
