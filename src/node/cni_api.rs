//! The daemon's side of the CNI API: the socket, each request's answer, and the pods a CNI ADD
//! told an earlier run about (issue #8, finding 11; issue #9 §4).

use std::path::Path;
use std::sync::Arc;

use tokio::sync::{Mutex, mpsc};
use tracing::{info, warn};

use super::pods::{CniPods, Pods, Shared};
use super::stats::NodeStats;
use super::{NodeConfig, NodeError};
use super::{cni_records, listeners, pods, reconcile};
use crate::capture::cni::{self, CniCommand, CniRefusal, CniRequest};
use crate::netns::Netns;
use crate::proxy::Inputs;

/// Bind `<state_dir>/cni.sock` (replacing whatever is there) and serve the CNI API on it, into
/// `requests`; the serving task and the file bound.
pub(super) fn serve_cni(
    path: &Path,
    requests: &mpsc::Sender<CniRequest>,
    inputs: &Inputs,
) -> Result<(tokio::task::AbortHandle, listeners::OwnedPath), NodeError> {
    let listener = cni::bind(path)?;
    let owned = listeners::OwnedPath::bound(path);
    let task = tokio::spawn(cni::serve(
        listener,
        requests.clone(),
        inputs.stats.accept_errors("cni"),
    ));
    Ok((task.abort_handle(), owned))
}

/// The recorded CNI pods of `state_dir` that are still there; stale records are removed.
pub(super) fn rediscover(state_dir: &Path, home: &Netns) -> CniPods {
    let (kept, dropped) = cni_records::Records::new(state_dir).reload(home);
    for (path, why) in &dropped {
        info!(record = %path.display(), reason = %crate::DisplayChain(why), "stale CNI record dropped");
    }
    if !kept.is_empty() || !dropped.is_empty() {
        info!(
            pods = kept.len(),
            stale = dropped.len(),
            "CNI pods of an earlier run found again"
        );
    }
    kept.into_iter()
        .map(|r| {
            (
                (r.namespace, r.pod),
                pods::CniPod {
                    netns: r.netns,
                    ips: r.ips,
                },
            )
        })
        .collect()
}

/// One CNI request while a successor takes over (`handoff`): an ADD is answered "try again"
/// (the runtime retries it, and the retry reaches the successor, which holds `cni.sock` now); a
/// DEL only forgets the pod, so that the sockets handed over stay as they are; a CHECK as ever.
pub(super) async fn cni_while_handing_over(
    req: CniRequest,
    config: &NodeConfig,
    shared: &Shared,
    pods: &Arc<Mutex<Pods>>,
    cni_pods: &Arc<Mutex<CniPods>>,
    stats: &NodeStats,
) {
    let outcome = match &req.command {
        CniCommand::Add { .. } => {
            stats.cni_try_again.inc();
            let reason = "a successor daemon is taking over this node";
            warn!(reason, "CNI ADD refused");
            Err(CniRefusal::TryAgain(reason.to_owned()))
        }
        CniCommand::Del { namespace, pod, .. } => {
            cni_pods
                .lock()
                .await
                .remove(&(namespace.clone(), pod.clone()));
            if let Err(e) = cni_records::Records::new(&config.state_dir).remove(namespace, pod) {
                warn!(namespace = %namespace, pod = %pod, error = %e, "removing the CNI record");
            }
            Ok(())
        }
        CniCommand::Check { .. } => {
            let (outcome, _) =
                handle_cni(&req.command, config, shared, pods, cni_pods, stats).await;
            outcome.map_err(CniRefusal::Refused)
        }
    };
    let _ = req.reply.send(outcome);
}

/// Handle one CNI request (issue #8, finding 11; issue #9 §4). An ADD's namespace must exist
/// and be a pod's ([`Netns::open_pod`]) and hold the addresses the ADD names; it is recorded
/// ([`cni_records`]) and the reply waits for the reconcile: an error with the reason when the
/// pod is then not served (the ADD and its record are then forgotten, as the runtime will retry
/// or tear down). A DEL forgets the pod and its record. A CHECK is answered ok when the pod is
/// served, or when its ADD is known and the registry does not ask for the pod to be served here
/// (an unmanaged pod). Returns the reply and, when it reconciled, whether every local pod is
/// served.
pub(super) async fn handle_cni(
    command: &CniCommand,
    config: &NodeConfig,
    shared: &Shared,
    pods: &Arc<Mutex<Pods>>,
    cni_pods: &Arc<Mutex<CniPods>>,
    stats: &NodeStats,
) -> (Result<(), String>, Option<bool>) {
    let records = cni_records::Records::new(&config.state_dir);
    match command {
        CniCommand::Add {
            namespace,
            pod,
            netns,
            ips,
        } => {
            let refuse = |reason: String| {
                stats.cni_refused.inc();
                warn!(namespace = %namespace, pod = %pod, %reason, "CNI ADD refused");
                reason
            };
            let ns = match Netns::open_pod(netns, &shared.home) {
                Ok(ns) => ns,
                Err(e) => {
                    let reason = refuse(crate::DisplayChain(&e).to_string());
                    return (Err(reason), None);
                }
            };
            match ns.missing_addresses(&shared.home, ips) {
                Ok(missing) if missing.is_empty() => {}
                Ok(missing) => {
                    let reason = refuse(format!(
                        "{} does not hold {missing:?}, which the ADD names",
                        netns.display()
                    ));
                    return (Err(reason), None);
                }
                Err(e) => {
                    let reason = refuse(crate::DisplayChain(&e).to_string());
                    return (Err(reason), None);
                }
            }
            let record = cni_records::CniRecord {
                namespace: namespace.clone(),
                pod: pod.clone(),
                netns: netns.clone(),
                ips: ips.clone(),
                netns_id: ns.id(),
            };
            // Recorded before it is served: a pod served without a record would be lost by a
            // restart, its capture programmed and nothing listening behind it.
            let earlier = records.read(namespace, pod);
            if let Err(e) = records.save(&record) {
                let reason = refuse(format!(
                    "record the pod in {}: {e}",
                    records.dir().display()
                ));
                return (Err(reason), None);
            }
            let key = (namespace.clone(), pod.clone());
            let before = cni_pods.lock().await.insert(
                key.clone(),
                pods::CniPod {
                    netns: netns.clone(),
                    ips: ips.clone(),
                },
            );
            let failed = reconcile(config, shared, pods, cni_pods).await;
            match failed.get(&key) {
                Some(reason) => {
                    let mut known = cni_pods.lock().await;
                    match before {
                        Some(earlier) => known.insert(key, earlier),
                        None => known.remove(&key),
                    };
                    drop(known);
                    let restored = match &earlier {
                        Some(r) => records.save(r),
                        None => records.remove(namespace, pod),
                    };
                    if let Err(e) = restored {
                        warn!(namespace = %namespace, pod = %pod, error = %e, "restoring the CNI record");
                    }
                    let reason = refuse(format!("pod {namespace}/{pod} is not served: {reason}"));
                    (Err(reason), Some(false))
                }
                None => (Ok(()), Some(failed.is_empty())),
            }
        }
        CniCommand::Del { namespace, pod, .. } => {
            cni_pods
                .lock()
                .await
                .remove(&(namespace.clone(), pod.clone()));
            if let Err(e) = records.remove(namespace, pod) {
                warn!(namespace = %namespace, pod = %pod, error = %e, "removing the CNI record");
            }
            let failed = reconcile(config, shared, pods, cni_pods).await;
            (Ok(()), Some(failed.is_empty()))
        }
        CniCommand::Check { namespace, pod, .. } => {
            let key = (namespace.clone(), pod.clone());
            if pods.lock().await.is_served(&key) {
                return (Ok(()), None);
            }
            let known = cni_pods.lock().await.clone();
            let wanted = pods::desired(
                &shared.inputs.model.load(),
                &config.node_name,
                &config.netns_prefix,
                &known,
                &config.inbound_trusted_sources,
            )
            .contains_key(&key);
            let outcome = match (wanted, known.contains_key(&key)) {
                (true, _) => Err(format!("pod {namespace}/{pod} is not served")),
                (false, true) => Ok(()),
                (false, false) => Err(format!("no CNI ADD is known for pod {namespace}/{pod}")),
            };
            (outcome, None)
        }
    }
}
