//! The daemon's CNI handling over a real CNI socket (issue #8, finding 11): an ADD is answered
//! once its pod is served, or with the reason it is not; a namespace that does not exist, or
//! the daemon's own, is refused before anything is programmed.

use std::path::{Path, PathBuf};

use super::*;
use crate::capture::cni::CniError;
use crate::proxy::{Counter, Stats};
use crate::test_util::{NoTls, needs_root};

/// A node-a pod served only from a CNI ADD; its IP is on no interface anywhere.
const MANIFESTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: mp}
---
apiVersion: v1
kind: Pod
metadata:
  name: mp-cni-0
  namespace: mp
  annotations: {aether.io/netns-from: cni}
spec: {serviceAccountName: mp-cni, nodeName: node-a}
status: {podIP: 10.255.0.7}
"#;

/// The daemon's CNI side: its socket, served by the daemon's own handler.
struct Daemon {
    socket: PathBuf,
    state_dir: PathBuf,
    pods: Arc<Mutex<Pods>>,
    cni_pods: Arc<Mutex<CniPods>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

fn shared() -> (NodeConfig, Shared) {
    let dir = std::env::temp_dir().join(format!(
        "aether-node-cni-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("pods.yaml"), MANIFESTS).unwrap();
    // The CNI records go to a state directory of the test's own, never /var/run/aether.
    let state_dir = std::env::temp_dir().join(format!(
        "aether-node-cni-state-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    let config = NodeConfig {
        node_name: "node-a".into(),
        registry: dir.clone(),
        state_dir,
        ..NodeConfig::default()
    };
    let source = Source::File(parking_lot::Mutex::new(LastGood::default()));
    let loaded = load(&config, &source, &NodeStats::default(), None).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let shared = Shared {
        inputs: Arc::new(Inputs {
            model: Arc::new(ModelHandle::new(loaded.model)),
            tls: Arc::new(NoTls),
            settings: ProxySettings::default(),
            pool: crate::proxy::hop::Pool::default(),
            apps: crate::proxy::app_pool::AppPool::default(),
            drain: watch::Sender::new(false),
            stats: Stats::default(),
        }),
        home: Arc::new(Netns::current().unwrap()),
        dns: dns::DnsShared {
            table: Arc::new(ArcSwap::from_pointee(loaded.dns)),
            upstreams: Vec::new(),
            accept_errors: Counter::default(),
            tcp: crate::dns::TcpLimits::default(),
        },
    };
    (config, shared)
}

fn start() -> Daemon {
    let (config, shared) = shared();
    let state_dir = config.state_dir.clone();
    let socket = std::env::temp_dir().join(format!(
        "aether-node-cni-{}-{}.sock",
        std::process::id(),
        fastrand::u64(..)
    ));
    let listener = cni::bind(&socket).unwrap();
    let (tx, mut rx) = mpsc::channel::<CniRequest>(8);
    let pods = Arc::new(Mutex::new(Pods::default()));
    let cni_pods = Arc::new(Mutex::new(CniPods::new()));
    let (p, c) = (pods.clone(), cni_pods.clone());
    let handler = tokio::spawn(async move {
        while let Some(req) = rx.recv().await {
            let (outcome, _) = handle_cni(
                &req.command,
                &config,
                &shared,
                &p,
                &c,
                &NodeStats::default(),
            )
            .await;
            let _ = req.reply.send(outcome);
        }
    });
    let server = tokio::spawn(cni::serve(listener, tx, Counter::default()));
    Daemon {
        socket,
        state_dir,
        pods,
        cni_pods,
        tasks: vec![handler, server],
    }
}

fn add(netns: &Path) -> CniCommand {
    CniCommand::Add {
        namespace: "mp".into(),
        pod: "mp-cni-0".into(),
        netns: netns.to_path_buf(),
        ips: Vec::new(),
    }
}

/// The daemon's reply to `command`: `Ok` or its reason.
async fn ask(d: &Daemon, command: &CniCommand) -> Result<(), String> {
    match cni::send(&d.socket, command).await {
        Ok(()) => Ok(()),
        Err(CniError::Refused { error }) => Err(error),
        Err(e) => panic!("the CNI socket failed: {e}"),
    }
}

#[tokio::test]
async fn an_add_naming_a_namespace_that_does_not_exist_is_refused_and_not_recorded() {
    let d = start();
    let missing = PathBuf::from(format!("/var/run/netns/aether-none-{}", std::process::id()));
    let reply = ask(&d, &add(&missing)).await;
    let reason = reply.expect_err("an ADD for a namespace that does not exist was answered ok");
    assert!(
        reason.contains(&missing.display().to_string()) && reason.contains("No such file"),
        "{reason}"
    );
    assert!(
        d.cni_pods.lock().await.is_empty(),
        "the refused ADD was recorded"
    );
    assert!(d.pods.lock().await.list().is_empty());
}

#[tokio::test]
async fn an_add_naming_the_daemons_own_namespace_is_refused() {
    let d = start();
    let reply = ask(&d, &add(Path::new("/proc/self/ns/net"))).await;
    let reason = reply.expect_err("an ADD naming the daemon's own namespace was answered ok");
    assert!(
        reason.contains("the daemon's own network namespace"),
        "{reason}"
    );
    assert!(
        d.cni_pods.lock().await.is_empty(),
        "the refused ADD was recorded"
    );
}

#[tokio::test]
async fn a_pod_annotated_with_the_daemons_own_namespace_is_not_served() {
    let (_, shared) = shared();
    let model = shared.inputs.model.load();
    let mut cni = CniPods::new();
    cni.insert(
        ("mp".into(), "mp-cni-0".into()),
        "/proc/thread-self/ns/net".into(),
    );
    let want = pods::desired(&model, "node-a", "", &cni, &[]);
    assert_eq!(want.len(), 1);
    let failed = Pods::default().reconcile(&shared, want).await;
    let reasons: Vec<String> = failed
        .iter()
        .map(|(_, e)| crate::DisplayChain(e).to_string())
        .collect();
    assert!(
        matches!(&reasons[..], [r] if r.contains("the daemon's own network namespace")),
        "{reasons:?}"
    );
}

#[tokio::test]
async fn an_add_is_answered_once_its_pod_is_served_or_with_the_reason_it_is_not() {
    const TEST: &str = "an_add_is_answered_once_its_pod_is_served_or_with_the_reason_it_is_not";
    if needs_root::cannot_run(TEST, &["ip", "nft", "nsenter"]) {
        return;
    }
    let name = format!("aecni{}", std::process::id() % 100_000);
    let made = std::process::Command::new("ip")
        .args(["netns", "add", &name])
        .status()
        .unwrap();
    assert!(made.success(), "ip netns add {name}");
    struct Del(String);
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.0])
                .status();
        }
    }
    let _del = Del(name.clone());
    let path = Path::new(crate::netns::NETNS_DIR).join(&name);
    let d = start();
    // Something in the pod already listens on the proxy port: the pod cannot be served.
    let home = Netns::current().unwrap();
    let blocker = Netns::open(&path)
        .unwrap()
        .run(&home, || std::net::TcpListener::bind("127.0.0.1:18081"))
        .unwrap()
        .unwrap();
    let reply = ask(&d, &add(&path)).await;
    let reason = reply.expect_err("an ADD whose pod is not served was answered ok");
    assert!(
        reason.contains("pod mp/mp-cni-0 is not served") && reason.contains("18081"),
        "{reason}"
    );
    assert!(d.pods.lock().await.list().is_empty());
    assert!(
        d.cni_pods.lock().await.is_empty(),
        "the failed ADD was recorded"
    );
    let records = cni_records::Records::new(&d.state_dir);
    assert_eq!(
        records.read("mp", "mp-cni-0"),
        None,
        "the failed ADD left a record"
    );
    // The port is free again: the retried ADD is answered once the pod is served.
    drop(blocker);
    assert_eq!(ask(&d, &add(&path)).await, Ok(()));
    let served = d.pods.lock().await.list();
    assert_eq!(served.len(), 1, "{served:?}");
    assert_eq!(served[0]["netns"], path.display().to_string());
    let record = records
        .read("mp", "mp-cni-0")
        .expect("the served pod has no record");
    assert_eq!(record.netns, path);
    let del = CniCommand::Del {
        namespace: "mp".into(),
        pod: "mp-cni-0".into(),
        netns: None,
    };
    assert_eq!(ask(&d, &del).await, Ok(()));
    assert!(d.pods.lock().await.list().is_empty());
    assert_eq!(records.read("mp", "mp-cni-0"), None, "DEL left the record");
}

#[tokio::test]
async fn a_check_is_refused_for_a_pod_with_no_add_known() {
    let d = start();
    let check = CniCommand::Check {
        namespace: "mp".into(),
        pod: "mp-cni-0".into(),
        netns: None,
    };
    let reason = ask(&d, &check)
        .await
        .expect_err("CHECK of a pod never added was ok");
    assert_eq!(reason, "no CNI ADD is known for pod mp/mp-cni-0");
}

#[tokio::test]
async fn an_add_naming_addresses_its_namespace_does_not_hold_is_refused_and_not_recorded() {
    const TEST: &str =
        "an_add_naming_addresses_its_namespace_does_not_hold_is_refused_and_not_recorded";
    if needs_root::cannot_run(TEST, &["ip"]) {
        return;
    }
    let name = format!("aecnip{}", std::process::id() % 100_000);
    let made = std::process::Command::new("ip")
        .args(["netns", "add", &name])
        .status()
        .unwrap();
    assert!(made.success(), "ip netns add {name}");
    let path = Path::new(crate::netns::NETNS_DIR).join(&name);
    let d = start();
    let add = CniCommand::Add {
        namespace: "mp".into(),
        pod: "mp-cni-0".into(),
        netns: path.clone(),
        ips: vec!["10.255.0.7".parse().unwrap()],
    };
    let reply = ask(&d, &add).await;
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", &name])
        .status();
    let reason = reply.expect_err("an ADD whose namespace lacks its address was answered ok");
    assert!(reason.contains("does not hold [10.255.0.7]"), "{reason}");
    assert!(d.cni_pods.lock().await.is_empty());
    let records = cni_records::Records::new(&d.state_dir);
    assert_eq!(
        records.read("mp", "mp-cni-0"),
        None,
        "the refused ADD was recorded"
    );
}
