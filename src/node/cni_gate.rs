//! Holds a CNI ADD until a published model knows its pod (issue #9 §4). On Kubernetes the runtime
//! calls ADD moments after the API server made the pod, and the daemon's pod watch may not have
//! brought it yet. Answered at once, such an ADD would let the pod run uncaptured until the watch
//! brings it. Instead it waits, up to `cni_add_wait_ms`, for a model that holds the pod, and then
//! goes on to the daemon as any ADD does; past the bound it is answered "try again"
//! ([`CniRefusal::TryAgain`], CNI error 11), so the runtime retries it. An ADD whose pod the model
//! knows, and every DEL and CHECK, pass at once.
//!
//! Glue of the daemon, between the CNI socket's server ([`crate::capture::cni::serve`]) and the
//! daemon's loop, which handles what passes. Each held ADD waits on a task of its own, on the
//! model's generation ([`ModelHandle::published_after`]): it holds no lock and polls nothing, so
//! a held ADD delays no other request. Held ADDs are bounded in time (`cni_add_wait_ms`) and in
//! number (`cni_add_waiters_max`): one more than that is answered "try again" at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::stats::NodeStats;
use crate::capture::cni::{CniCommand, CniRefusal, CniRequest};
use crate::state::ModelHandle;

/// What an ADD waits on, and for how long.
#[derive(Debug, Clone)]
pub(super) struct AddGate {
    /// The published model.
    pub(super) model: Arc<ModelHandle>,
    /// The longest wait of one ADD (`cni_add_wait_ms`).
    pub(super) bound: Duration,
    /// The most ADDs held at once (`cni_add_waiters_max`).
    pub(super) waiters_max: usize,
    /// Where held and refused ADDs are counted.
    pub(super) stats: Arc<NodeStats>,
}

impl AddGate {
    /// Pass every request of `requests` on to `daemon`, an ADD whose pod the model does not know
    /// only once it does (or answer it "try again" at the bound). Runs until `requests` closes.
    pub(super) async fn run(
        self,
        mut requests: mpsc::Receiver<CniRequest>,
        daemon: mpsc::Sender<CniRequest>,
    ) {
        while let Some(req) = requests.recv().await {
            let unknown = match &req.command {
                CniCommand::Add { namespace, pod, .. } => {
                    (!self.knows(namespace, pod)).then(|| (namespace.clone(), pod.clone()))
                }
                CniCommand::Check { .. } | CniCommand::Del { .. } => None,
            };
            match unknown {
                // A request the daemon cannot take any more is dropped: its caller is told
                // that the daemon dropped it.
                None => drop(daemon.send(req).await),
                Some((namespace, pod)) if self.held() >= self.waiters_max => {
                    self.stats.cni_try_again.inc();
                    let max = self.waiters_max;
                    warn!(
                        namespace,
                        pod, max, "CNI ADD answered try again: too many ADDs waiting"
                    );
                    let _ = req.reply.send(Err(CniRefusal::TryAgain(format!(
                        "pod {namespace}/{pod} is not in the node's registry yet and {max} ADDs \
                         wait for theirs already (cni_add_waiters_max)"
                    ))));
                }
                Some((namespace, pod)) => {
                    // Counted here, before the task runs, so the next request sees it.
                    self.stats.cni_adds_waiting.inc();
                    let (gate, daemon) = (self.clone(), daemon.clone());
                    tokio::spawn(async move { gate.hold(req, &namespace, &pod, daemon).await });
                }
            }
        }
    }

    /// How many ADDs are held now.
    fn held(&self) -> usize {
        usize::try_from(self.stats.cni_adds_waiting.get()).unwrap_or(0)
    }

    /// Whether the current model holds the pod.
    fn knows(&self, namespace: &str, pod: &str) -> bool {
        self.model.load().pod(namespace, pod).is_some()
    }

    /// Wait for a model that holds the pod, at most the bound; then hand `req` on, or answer it.
    async fn hold(
        &self,
        req: CniRequest,
        namespace: &str,
        pod: &str,
        daemon: mpsc::Sender<CniRequest>,
    ) {
        debug!(namespace, pod, "cni add waits for its pod in the registry");
        let known = tokio::time::timeout(self.bound, async {
            loop {
                // The generation first: a model published after it wakes the wait below.
                let seen = self.model.generation();
                if self.knows(namespace, pod) {
                    return;
                }
                self.model.published_after(seen).await;
            }
        })
        .await
        .is_ok();
        self.stats.cni_adds_waiting.dec();
        if known {
            drop(daemon.send(req).await);
            return;
        }
        self.stats.cni_try_again.inc();
        let waited_ms = u64::try_from(self.bound.as_millis()).unwrap_or(u64::MAX);
        warn!(
            namespace,
            pod, waited_ms, "CNI ADD refused: pod not in the registry yet"
        );
        let _ = req.reply.send(Err(CniRefusal::TryAgain(format!(
            "pod {namespace}/{pod} is not in the node's registry yet (waited {waited_ms} ms for the \
             pod watch to bring it)"
        ))));
    }
}
