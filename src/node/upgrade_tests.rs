//! Whole daemons (`run_until`) handing over on one state directory and one metrics port, as the
//! old and the new pod of a DaemonSet rollout do with `hostNetwork: true` (issue #35 item 4):
//! what the kubelet's probe sees on the shared port, and that the old daemon waits to be stopped.
//! No pod is served (no network namespace is made), so no root is needed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::sync::oneshot;

use super::*;

/// Generous: a 4× slower machine still answers well within it.
const BOUND: Duration = Duration::from_secs(30);

/// A node-a registry with no local pod: a daemon on it is ready at once.
const NO_LOCAL_POD: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: mp}\n";

/// A node-a pod whose network namespace does not exist: a daemon on it is never ready.
fn unservable(tag: &str) -> String {
    format!(
        "{NO_LOCAL_POD}---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: stuck-0\n  namespace: mp\n  \
         annotations: {{aether.io/netns: \"aether-test-none-{tag}\", endpoint.aether.io/port: \"8080\"}}\n\
         spec: {{serviceAccountName: stuck, nodeName: node-a}}\nstatus: {{podIP: 10.255.0.9}}\n"
    )
}

struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), NodeError>>,
}

impl Running {
    /// Stop it (SIGTERM's part) and wait until it has returned.
    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        tokio::time::timeout(BOUND, &mut self.task)
            .await
            .expect("the daemon returns once stopped")
            .expect("the daemon's task")
            .expect("the daemon ran without error");
    }
}

fn start(root: &Path, name: &str, registry: &str, metrics: SocketAddr) -> Running {
    let dir = root.join(format!("registry-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("pods.yaml"), registry).unwrap();
    let config = NodeConfig {
        node_name: "node-a".into(),
        registry: dir,
        state_dir: root.join("state"),
        pod_dir: Some(root.join(format!("pod-{name}"))),
        ca_dir: Some(root.join("ca")),
        metrics_addr: Some(metrics),
        drain_timeout_secs: 1,
        ..NodeConfig::default()
    };
    let (tx, rx) = oneshot::channel::<()>();
    let logs = crate::log_filter::LogFilter::detached("warn");
    let task = tokio::spawn(run_until(config, logs, async {
        let _ = rx.await;
    }));
    Running {
        stop: Some(tx),
        task,
    }
}

/// The status of `GET path` on `addr`, as the kubelet's probe sees it (`None`: no answer).
async fn status(addr: SocketAddr, path: &str) -> Option<u16> {
    let exchange = async {
        let s = tokio::net::TcpStream::connect(addr).await.ok()?;
        aether_lab::legs::probe_status(s, path).await
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// Wait (bounded) until `GET path` on `addr` answers `want`.
async fn until_status(addr: SocketAddr, path: &str, want: u16, what: &str) {
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let got = status(addr, path).await;
        if got == Some(want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {path} answered {got:?}, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn until_file(path: &Path, what: &str) {
    let deadline = tokio::time::Instant::now() + BOUND;
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: no {path:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn temp_root() -> PathBuf {
    let root = std::env::temp_dir().join(format!(
        "aether-upgrade-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&root).unwrap();
    root
}

/// The probe of a new daemon pod lands on the node's metrics port, which both daemons share:
/// once the new daemon has taken the sockets (its start marker), no answer there says "ready"
/// before the new daemon serves; a successor that goes away leaves the old one serving and
/// ready again; one that serves takes the port, and the old daemon, handed over, returns only
/// once it is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_probe_port_says_ready_only_for_a_daemon_that_serves() {
    let root = temp_root();
    let metrics = free_port();
    let old = start(&root, "old", NO_LOCAL_POD, metrics);
    until_status(metrics, "/ready", 200, "the first daemon").await;
    until_file(
        &root.join("pod-old").join(STARTED_MARKER),
        "the first daemon",
    )
    .await;

    // A successor that never serves (its pod's namespace does not exist).
    let stuck = start(
        &root,
        "stuck",
        &unservable(&fastrand::u64(..).to_string()),
        metrics,
    );
    until_file(
        &root.join("pod-stuck").join(STARTED_MARKER),
        "the stuck successor",
    )
    .await;
    for i in 0..20 {
        assert_eq!(
            status(metrics, "/ready").await,
            Some(503),
            "probe {i} after the successor took the sockets"
        );
    }
    assert_eq!(status(metrics, "/live").await, Some(200));
    // It goes away: the old daemon serves on, and is ready again.
    stuck.stop().await;
    until_status(
        metrics,
        "/ready",
        200,
        "the old daemon after a failed handoff",
    )
    .await;

    // A successor that serves: the port answers "ready" (the successor, the old daemon having
    // stopped accepting on it) ...
    let new = start(&root, "new", NO_LOCAL_POD, metrics);
    until_file(&root.join("pod-new").join(STARTED_MARKER), "the successor").await;
    let deadline = tokio::time::Instant::now() + BOUND;
    let mut in_a_row = 0;
    while in_a_row < 10 {
        in_a_row = if status(metrics, "/ready").await == Some(200) {
            in_a_row + 1
        } else {
            0
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "the successor never answered the probes alone"
        );
    }
    // ... and the old daemon, handed over, waits to be stopped.
    assert!(
        !old.task.is_finished(),
        "the old daemon returned before it was stopped"
    );
    old.stop().await;
    for _ in 0..10 {
        assert_eq!(
            status(metrics, "/ready").await,
            Some(200),
            "the successor serves the port the old daemon passed on"
        );
    }
    new.stop().await;
    let _ = std::fs::remove_dir_all(&root);
}
