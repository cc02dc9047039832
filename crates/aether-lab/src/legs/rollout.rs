//! Leg K-ROLLOUT (issue #35 item 4): a DaemonSet rollout of node-a played on the lab's API
//! server, through real sockets. node-a's daemon and its CNI installer are the old pod; the DaemonSet
//! they belong to (`config/examples/kube/daemonset.yaml`, copied into the lab API server's
//! directory) is there for the installers to ask for.
//!
//! 1. The old installer chains `aether-cni` into node-a's conflist (the lab's own).
//! 2. Under load (new connections, captured and on the loopback proxy port), with a raw stream
//!    open through the old daemon and node-a's probe port polled as kubelet polls it, the old
//!    installer is stopped (the window a rollout without surge opens between the installers,
//!    the worst case): the entry must still be there. The API server is then held stopped,
//!    standing in for a new daemon's first list that takes long (seconds in a large cluster),
//!    and the new daemon starts beside the old one and takes its sockets. A pod created now
//!    (mp-cni-0's ADD, run through the conflist's own `aether-cni` entry as the runtime runs
//!    it) reaches the new daemon, which cannot serve it yet: CNI error 11. The API server
//!    starts again, the ADD is retried as kubelet retries a sandbox, and it succeeds once the
//!    pod is served. Then the new installer starts. From the new daemon's start marker (it has
//!    taken the sockets) to the API server's start (before which it cannot serve), every probe
//!    of node-a's port must say 503: the old daemon never answers "ready" for the new one.
//! 3. Once the new daemon serves, the raw stream still echoes; the old daemon is stopped (its
//!    pod deleted) and the stream still echoes while it drains.
//! 4. No request failed, every probe was answered, and mp-cni-0 is captured (its capture table,
//!    loopback listener and hop answer). Its DEL restores it.
//! 5. The uninstall: the DaemonSet deleted, the new installer stopped: the entry goes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::extra::{CNI_POD, cni_served};
use super::traffic::{load_until, one_request, raw_stream, read_echo};
use super::{Check, Env, Installer, Need, control_request, probe_status};
use crate::workload::probe::Connector;
use aether::cni::conflist::PLUGIN_TYPE;
use aether::node::STARTED_MARKER;
use aether::node::listeners::file_id;

const NODE: &str = "node-a";

/// How long the waits of this leg may take (a 4× slower machine included).
const BOUND: Duration = Duration::from_secs(60);

/// How an installer that stopped by itself on SIGTERM ended ([`super::Installers::stop`]).
const EXITED_CLEANLY: &str = "exit status: 0";

/// How often a CNI ADD answered "try again" is retried (kubelet backs off from about this).
const ADD_RETRY: Duration = Duration::from_millis(500);

pub(super) async fn rollout(env: &Env) -> Check {
    let (Some(upgrade), Some(retire), Some(installers)) =
        (&env.upgrade, &env.retire, &env.installers)
    else {
        return Err(env.not_here(Need::DaemonProcesses));
    };
    let reg = env
        .registry
        .as_ref()
        .ok_or_else(|| env.not_here(Need::RegistryControl))?;
    let control = reg
        .apiserver
        .clone()
        .ok_or_else(|| env.not_here(Need::RegistryControl))?;
    let cni_sock = reg
        .admin_sockets
        .first()
        .ok_or_else(|| env.not_here(Need::DaemonSockets))?
        .with_file_name("cni.sock");
    let marker = cni_sock
        .parent()
        .and_then(Path::parent)
        .map(|run| run.join(format!("node-{NODE}-pod")).join(STARTED_MARKER))
        .ok_or_else(|| env.not_here(Need::DaemonSockets))?;
    let netns = env.client_netns(CNI_POD)?.path().to_path_buf();
    let node_ns = env.client_netns(&format!("node:{NODE}"))?.clone();
    // The DaemonSet the installers belong to.
    daemonset(env, true).await?;
    if cni_served(env, &netns).await? {
        return Err(format!("{CNI_POD} is served before its ADD"));
    }
    let old = (installers.start)(NODE.to_owned()).await?;
    let mut started = vec![old.pid];
    let outcome = async {
        until_chained(&old.conf_dir, true).await?;
        let mut raw = raw_stream(env).await?;
        let stop = AtomicBool::new(false);
        // 0 before the new daemon's take, 1 from it until the API server starts again (no
        // daemon on node-a can be ready then), 2 after.
        let phase = AtomicU8::new(0);
        let load = load_until(env, &stop, Duration::ZERO, 20);
        let probes = async {
            let connector = Connector::in_netns(node_ns.clone(), env.home.clone());
            let (mut answers, mut held) = (Vec::new(), Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let before = phase.load(Ordering::SeqCst);
                let answer = ready_status(&connector).await;
                if before == 1 && phase.load(Ordering::SeqCst) == 1 {
                    held.push(answer);
                }
                answers.push(answer);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (answers, held)
        };
        let rollout = async {
            // The installers change places; the new daemon starts beside the old one, the API
            // server held stopped until a pod created meanwhile has been told to wait.
            let stopped = (installers.stop)(old.pid).await;
            let kept = stopped.and_then(|stopped| match chained(&old.conf_dir) {
                // It stopped by itself (its decision made), not killed at the bound.
                Ok(true) if stopped == EXITED_CLEANLY => Ok(()),
                Ok(true) => Err(format!("the old installer's stop: {stopped}")),
                Ok(false) => Err(format!(
                    "the old installer's stop ({stopped}) took the entry out while its DaemonSet is there"
                )),
                Err(e) => Err(e),
            });
            let before = file_id(&cni_sock);
            let marked = file_id(&marker);
            let held = match kept {
                Ok(()) => control_request(&control, "POST", "/lab/stop").await,
                Err(e) => Err(e),
            };
            let window = async {
                // The new daemon binds cni.sock before it asks for the old one's sockets.
                let deadline = tokio::time::Instant::now() + BOUND;
                while file_id(&cni_sock) == before {
                    if tokio::time::Instant::now() > deadline {
                        return Err(format!("the new daemon did not bind {}", cni_sock.display()));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                // ... and writes its start marker once it has taken them.
                while file_id(&marker).is_none_or(|id| Some(id) == marked) {
                    if tokio::time::Instant::now() > deadline {
                        return Err(format!("the new daemon wrote no {}", marker.display()));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                phase.store(1, Ordering::SeqCst);
                let tries = add_through_chain(env, &old, &netns, &control, &phase).await?;
                let new = (installers.start)(NODE.to_owned()).await?;
                until_chained(&new.conf_dir, true).await?;
                Ok::<_, String>((tries, new))
            };
            let (up, window) = match held {
                Err(e) => (Err(e.clone()), Err(e)),
                Ok(_) => tokio::join!((upgrade.0)(NODE.to_owned()), window),
            };
            // Whatever happened, the API server serves again.
            let _ = control_request(&control, "POST", "/lab/start").await;
            let served = up.map_err(|e| format!("the upgrade: {e}"));
            let result = async {
                served?;
                raw.write_all(b"after\n").await.map_err(|e| e.to_string())?;
                read_echo(&mut raw, "after")
                    .await
                    .map_err(|e| format!("the raw stream after the hand-off: {e}"))?;
                (retire.0)(NODE.to_owned()).await?;
                raw.write_all(b"draining\n")
                    .await
                    .map_err(|e| e.to_string())?;
                read_echo(&mut raw, "draining")
                    .await
                    .map_err(|e| format!("the raw stream while the old daemon drains: {e}"))
            }
            .await;
            stop.store(true, Ordering::Relaxed);
            (result, window)
        };
        let ((ok, failed), (answers, held), (result, window)) =
            tokio::join!(load, probes, rollout);
        let (tries, new) = window?;
        started.push(new.pid);
        result?;
        if let Some(first) = failed.first() {
            return Err(format!(
                "{} of {} requests failed during the rollout; first: {first}",
                failed.len(),
                ok as usize + failed.len()
            ));
        }
        if ok < 20 {
            return Err(format!("only {ok} requests during the rollout"));
        }
        probes_answered(&answers)?;
        if held.is_empty() || held.iter().any(|a| *a != Some(503)) {
            return Err(format!(
                "while the new daemon held the sockets and could not serve, node-a's port answered {held:?}, want only 503"
            ));
        }
        // The pod created in the window is captured.
        if !cni_served(env, &netns)
            .await
            .map_err(|e| format!("{CNI_POD} after the rollout: {e}"))?
        {
            return Err(format!("{CNI_POD}'s ADD succeeded but it is not served"));
        }
        run_plugin(env, &new, &netns, "DEL").await?;
        // At the old daemon's drain deadline the raw stream ends.
        let mut rest = Vec::new();
        if tokio::time::timeout(Duration::from_secs(15), raw.read_to_end(&mut rest))
            .await
            .is_err()
        {
            return Err("the raw stream outlived the old daemon's drain deadline".into());
        }
        // The uninstall: the DaemonSet goes, then its installer stops.
        daemonset(env, false).await?;
        let stopped = (installers.stop)(new.pid).await?;
        started.retain(|p| *p != new.pid);
        if stopped != EXITED_CLEANLY || chained(&new.conf_dir)? {
            return Err(format!(
                "the installer's stop ({stopped}) left the entry after its DaemonSet was deleted"
            ));
        }
        one_request(env, true)
            .await
            .map_err(|e| format!("after the rollout: {e}"))?;
        Ok(format!(
            "{ok} requests (captured and loopback), 0 failed; {} probes of node-a's port, all answered, {} of them 503 while the new daemon held the sockets and could not serve, the last ready; the raw stream echoed across the hand-off and the old daemon's drain; the entry stayed through the installers' stop, {CNI_POD} created meanwhile {}; the uninstall took the entry out",
            answers.len(),
            held.len(),
            match tries {
                0 => "captured at once".to_owned(),
                n => format!("waited ({n} × CNI error 11), then captured"),
            }
        ))
    }
    .await;
    // A failed leg leaves no installer behind (the first one is stopped already when it got
    // that far; a second stop only says so).
    if outcome.is_err() {
        for pid in started {
            let _ = (installers.stop)(pid).await;
        }
        let _ = daemonset(env, false).await;
    }
    outcome
}

/// Put the DaemonSet the installers belong to into the lab API server's directory, or take it
/// out, and wait until the server holds the directory as it is.
async fn daemonset(env: &Env, present: bool) -> Result<(), String> {
    let reg = env
        .registry
        .as_ref()
        .ok_or_else(|| env.not_here(Need::RegistryControl))?;
    let placed = reg.dir.join("zz-kube-daemonset.yaml");
    if present {
        let from = reg
            .variants
            .parent()
            .map(|examples| examples.join("kube").join("daemonset.yaml"))
            .ok_or_else(|| format!("no examples directory above {}", reg.variants.display()))?;
        std::fs::copy(&from, &placed).map_err(|e| format!("{}: {e}", from.display()))?;
    } else if let Err(e) = std::fs::remove_file(&placed)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        return Err(format!("{}: {e}", placed.display()));
    }
    env.settle().await
}

/// The primary conflist of `conf_dir` (the lab's has one file).
fn primary(conf_dir: &Path) -> Result<(PathBuf, serde_json::Value), String> {
    let path = conf_dir.join("10-lab.conflist");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((path, v))
}

/// Whether the conflist ends with the `aether-cni` entry.
fn chained(conf_dir: &Path) -> Result<bool, String> {
    let (_, v) = primary(conf_dir)?;
    Ok(v["plugins"]
        .as_array()
        .and_then(|p| p.last())
        .is_some_and(|p| p["type"] == PLUGIN_TYPE))
}

async fn until_chained(conf_dir: &Path, want: bool) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        // A file half written by the installer's rename never shows: read errors are retried.
        if chained(conf_dir).ok() == Some(want) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "{}: aether-cni {} within {BOUND:?}",
                conf_dir.display(),
                if want { "not chained" } else { "still chained" }
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// mp-cni-0's ADD through the conflist, retried on CNI error 11 as kubelet retries a sandbox;
/// how many times it was answered 11 before it succeeded. The lab's API server (`control`),
/// held stopped until then, starts again after the first attempt.
async fn add_through_chain(
    env: &Env,
    installer: &Installer,
    netns: &Path,
    control: &Path,
    phase: &AtomicU8,
) -> Result<u32, String> {
    let deadline = tokio::time::Instant::now() + BOUND;
    let mut waited = 0;
    loop {
        let attempt = run_plugin(env, installer, netns, "ADD").await;
        if waited == 0 {
            phase.store(2, Ordering::SeqCst);
            control_request(control, "POST", "/lab/start").await?;
        }
        match attempt {
            Ok(()) => return Ok(waited),
            Err(e) if e.contains("\"code\":11") && tokio::time::Instant::now() < deadline => {
                waited += 1;
                tokio::time::sleep(ADD_RETRY).await;
            }
            Err(e) => return Err(format!("{CNI_POD}'s ADD: {e}")),
        }
    }
}

/// Runs the conflist's `aether-cni` entry as the container runtime runs the last plugin of a
/// chain: the installed binary, the CNI environment, the entry with the list's `cniVersion` and
/// `name` and the primary's result (`prevResult`) on stdin. `Err` holds its stdout.
async fn run_plugin(
    env: &Env,
    installer: &Installer,
    netns: &Path,
    command: &str,
) -> Result<(), String> {
    let (path, list) = primary(&installer.conf_dir)?;
    let entry = list["plugins"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["type"] == PLUGIN_TYPE))
        .ok_or_else(|| format!("{}: no {PLUGIN_TYPE} entry", path.display()))?;
    let mut conf = entry.clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    conf["name"] = list["name"].clone();
    let ip = env.pod_ip("mp", CNI_POD)?;
    conf["prevResult"] = serde_json::json!({
        "cniVersion": list["cniVersion"],
        "interfaces": [{"name": "eth0", "sandbox": netns}],
        "ips": [{"address": format!("{ip}/24"), "interface": 0}],
    });
    let mut child = tokio::process::Command::new(installer.bin_dir.join(PLUGIN_TYPE))
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", "k-rollout")
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", &installer.bin_dir)
        .env(
            "CNI_ARGS",
            format!("K8S_POD_NAMESPACE=mp;K8S_POD_NAME={CNI_POD}"),
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("run the installed plugin: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(conf.to_string().as_bytes())
            .await
            .map_err(|e| e.to_string())?;
    }
    // The plugin's own bound is `timeoutSecs` (20 s); this one is above it.
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .map_err(|_| format!("the plugin's {command} did not end within 30 s"))?
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}

/// `GET /ready` on node-a's probe port from node-a's namespace, as kubelet probes a
/// host-network pod: the status, or `None` when nothing answered within 2 s.
async fn ready_status(connector: &Connector) -> Option<u16> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], crate::demo::LAB_METRICS_PORT));
    let exchange = async {
        let socket = connector.tcp_socket(addr).ok()?;
        probe_status(socket.connect(addr).await.ok()?, "/ready").await
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
}

/// Every probe was answered (the port was never without a listener), and the last said ready.
fn probes_answered(answers: &[Option<u16>]) -> Result<(), String> {
    if let Some(i) = answers.iter().position(Option::is_none) {
        return Err(format!(
            "probe {i} of {} on node-a's port got no answer: {answers:?}",
            answers.len()
        ));
    }
    match answers.last() {
        Some(Some(200)) => Ok(()),
        last => Err(format!(
            "the last probe got {last:?}, want 200: {answers:?}"
        )),
    }
}
