//! Root-only: the `mp` fixture's lab, without daemons and without the pods' commands, seen from
//! inside its pods. Without root, `ip`, `nft` or `sysctl` it is skipped, or fails under
//! `AETHER_REQUIRE_NETNS=1` ([`aether::test_util::needs_root`]).

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use socket2::{Domain, Protocol, Socket, Type};

use super::*;
use crate::lab::{DEFAULT_SERVICE_CIDR, LabOptions, plan_dir};

/// True when the test must return early (after saying so); fails under `AETHER_REQUIRE_NETNS=1`.
fn skip(test: &str) -> bool {
    aether::test_util::needs_root::cannot_run(test, &["ip", "nft", "sysctl"])
}

/// A listener in `netns` on `0.0.0.0:port` that writes `reply` to every connection.
struct Listener {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    fn start(netns: &Netns, home: &Netns, port: u16, reply: &str) -> Self {
        let listener = netns
            .run(home, || TcpListener::bind(("0.0.0.0", port)))
            .unwrap()
            .unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let reply = reply.to_owned();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        let _ = conn.write_all(reply.as_bytes());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connects from inside `netns` to `dst` and reads what the server writes (within 1 s).
fn fetch(netns: &Netns, home: &Netns, dst: SocketAddr) -> io::Result<String> {
    let socket = netns
        .run(home, || {
            Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))
        })
        .map_err(io::Error::other)??;
    socket.connect_timeout(&dst.into(), Duration::from_secs(1))?;
    let mut stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut out = String::new();
    stream.read_to_string(&mut out)?;
    Ok(out)
}

#[test]
fn the_fixture_lab_routes_across_nodes_translates_user_services_only_and_leaves_nothing_behind() {
    if skip(
        "lab::run::tests::the_fixture_lab_routes_across_nodes_translates_user_services_only_and_leaves_nothing_behind",
    ) {
        return;
    }
    let run_dir = std::env::temp_dir().join("aether-lab-test-wt-lab");
    Lab::cleanup_stale(&run_dir, Duration::from_secs(1)).unwrap();
    let opts = LabOptions {
        prefix: "aelt".to_owned(),
        pod_netns_prefix: "aelt-".to_owned(),
        ..LabOptions::default()
    };
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("config/examples/mp");
    let planned = plan_dir(&dir, DEFAULT_SERVICE_CIDR.parse().unwrap(), &opts).unwrap();
    let names: Vec<String> = std::iter::once(planned.plan.underlay_netns.clone())
        .chain(planned.plan.nodes.iter().map(|n| n.netns.clone()))
        .chain(planned.plan.pods.iter().map(|p| p.netns.clone()))
        .collect();
    let generated_multi = planned
        .snapshot
        .services
        .iter()
        .find(|s| s.generated && s.namespace == "mp" && s.name == "mp-multi")
        .and_then(|s| s.cluster_ips.first().copied())
        .unwrap();

    let lab = Lab::up(planned.plan, UpOptions::new(&run_dir)).unwrap();
    for name in &names {
        assert!(
            Path::new(NETNS_DIR).join(name).exists(),
            "{name} was not made"
        );
    }
    let resolv = fs::read_to_string(Path::new(ETC_NETNS).join("aelt-mp-client/resolv.conf"));
    assert!(resolv.unwrap().starts_with("nameserver 127.0.0.53\n"));

    let home = lab.home();
    let ns = |pod: &str| lab.pod_netns("mp", pod).unwrap();
    let owned0 = Listener::start(&ns("mp-owned-0"), &home, 8080, "mp-owned-0");
    let owned1 = Listener::start(&ns("mp-owned-1"), &home, 8080, "mp-owned-1");
    let multi1 = Listener::start(&ns("mp-multi-1"), &home, 8080, "mp-multi-1");
    let client = ns("mp-client");

    // The pods' own addresses answer from the other node (node-a -> node-b over the underlay).
    let multi1_ip = lab.plan().pod("mp", "mp-multi-1").unwrap().ip;
    let got = fetch(&client, &home, SocketAddr::from((multi1_ip, 8080)));
    assert_eq!(got.unwrap(), "mp-multi-1", "cross-node pod IP");

    // The user Service's ClusterIP reaches its pods, on the client's node and on the other.
    let vip = SocketAddr::from((Ipv4Addr::new(10, 96, 100, 10), 80));
    let mut seen = BTreeSet::new();
    for _ in 0..40 {
        let got = fetch(&client, &home, vip).unwrap();
        assert!(got == "mp-owned-0" || got == "mp-owned-1", "{got:?}");
        seen.insert(got);
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(
        seen.len(),
        2,
        "both mp-owned pods are reached through 10.96.100.10:80"
    );

    // The runtime runs the same wait the demo uses.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(lab.wait_tcp("mp", "mp-owned-1", 8080, Duration::from_secs(2)))
        .unwrap();
    let err = rt
        .block_on(lab.wait_tcp("mp", "mp-client", 8080, Duration::from_millis(300)))
        .unwrap_err();
    assert!(matches!(err, LabError::Timeout { .. }), "{err}");

    // A generated Service has no rule: its ClusterIP reaches nothing, even with mp-multi-1
    // listening on 8080.
    assert!(matches!(generated_multi, IpAddr::V4(_)));
    // No wall-clock bound on this: `fetch` is bounded by its own socket deadlines (1 s to
    // connect, 1 s to read), so the test cannot hang, and whether nothing answers is the
    // behaviour under test, not how fast the kernel says so.
    let got = fetch(&client, &home, SocketAddr::new(generated_multi, 8080));
    assert!(
        got.as_deref().map_or(true, str::is_empty),
        "the generated Service {generated_multi}:8080 answered {got:?}"
    );

    drop((owned0, owned1, multi1, client, home));
    lab.down().unwrap();
    for name in &names {
        assert!(
            !Path::new(NETNS_DIR).join(name).exists(),
            "{name} is left behind"
        );
    }
    assert!(!Path::new(ETC_NETNS).join("aelt-mp-client").exists());
    assert!(!run_dir.join(STATE_FILE).exists());
    fs::remove_dir_all(&run_dir).unwrap();
}

fn pid_alive(pid: u32) -> bool {
    start_time(i32::try_from(pid).unwrap()).is_some()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = time::now() + Duration::from_secs(5);
    while !f() {
        assert!(time::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const TWO_PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: one, namespace: shop, annotations: {aether.io/netns: one}}
spec:
  nodeName: n1
  containers:
  - name: app
    image: x
    command: ["sh", "-c", "echo pod=$POD_NAME ns=$POD_NAMESPACE mode=$MODE; cat /etc/resolv.conf; exec sleep 60"]
    env:
    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
    - {name: MODE, value: lab}
status: {podIP: 10.244.7.5}
---
apiVersion: v1
kind: Pod
metadata: {name: two, namespace: shop, annotations: {aether.io/netns: two}}
spec: {nodeName: n2, containers: [{name: app, image: x}]}
status: {podIP: 10.244.8.5}
"#;

/// A scratch directory holding [`TWO_PODS`], its run directory (anything a killed earlier run
/// left there cleaned up), and lab options with node and pod namespaces under `prefix`.
fn two_pod_lab(tag: &str, prefix: &str) -> (PathBuf, PathBuf, PathBuf, LabOptions) {
    let base = std::env::temp_dir().join(format!("aether-lab-test-{tag}"));
    let manifests = base.join("manifests");
    let run_dir = base.join("run");
    Lab::cleanup_stale(&run_dir, Duration::from_secs(1)).unwrap();
    fs::create_dir_all(&manifests).unwrap();
    fs::write(manifests.join("pods.yaml"), TWO_PODS).unwrap();
    let opts = LabOptions {
        prefix: prefix.to_owned(),
        pod_netns_prefix: format!("{prefix}-"),
        ..LabOptions::default()
    };
    (base, manifests, run_dir, opts)
}

#[test]
fn started_processes_see_their_env_and_resolv_conf_and_are_stopped_by_down_or_stale_cleanup() {
    if skip(
        "lab::run::tests::started_processes_see_their_env_and_resolv_conf_and_are_stopped_by_down_or_stale_cleanup",
    ) {
        return;
    }
    let (base, manifests, run_dir, opts) = two_pod_lab("procs", "aelu");
    let plan = || {
        plan_dir(&manifests, DEFAULT_SERVICE_CIDR.parse().unwrap(), &opts)
            .unwrap()
            .plan
    };
    let names: Vec<String> = [
        "aelu-underlay",
        "aelu-n1",
        "aelu-n2",
        "aelu-one",
        "aelu-two",
    ]
    .map(str::to_owned)
    .to_vec();
    let gone = |names: &[String]| names.iter().all(|n| !Path::new(NETNS_DIR).join(n).exists());

    // up, start, down: the processes end with the lab.
    let mut lab = Lab::up(plan(), UpOptions::new(&run_dir)).unwrap();
    assert!(matches!(
        Lab::up(plan(), UpOptions::new(base.join("other-run"))),
        Err(LabError::NetnsExists(_))
    ));
    assert_eq!(lab.start_pods().unwrap(), 1);
    let daemon = lab
        .start_daemon("n1", &["sleep".to_owned(), "60".to_owned()], &[])
        .unwrap();
    let log = lab.pod_log("shop", "one").unwrap();
    wait_for("the pod's log", || {
        fs::read_to_string(&log).is_ok_and(|t| t.contains("options ndots:5"))
    });
    let text = fs::read_to_string(&log).unwrap();
    assert!(text.starts_with("pod=one ns=shop mode=lab\n"), "{text}");
    assert!(
        text.contains(
            "nameserver 127.0.0.53\nsearch shop.svc.cluster.local svc.cluster.local cluster.local\n"
        ),
        "{text}"
    );
    assert!(pid_alive(daemon));
    assert!(lab.exited().is_empty());
    lab.down().unwrap();
    assert!(!pid_alive(daemon), "the daemon outlived down");
    assert!(gone(&names));

    // A crashed run (never taken down): cleanup_stale removes its processes and namespaces.
    let mut lab = Lab::up(plan(), UpOptions::new(&run_dir)).unwrap();
    let daemon = lab
        .start_daemon("n2", &["sleep".to_owned(), "60".to_owned()], &[])
        .unwrap();
    std::mem::forget(lab);
    assert!(matches!(
        Lab::up(plan(), UpOptions::new(&run_dir)),
        Err(LabError::StaleState(_))
    ));
    assert!(Lab::cleanup_stale(&run_dir, Duration::from_secs(1)).unwrap());
    assert!(
        !pid_alive(daemon),
        "the crashed run's daemon survived cleanup"
    );
    assert!(gone(&names));
    assert!(!Lab::cleanup_stale(&run_dir, Duration::from_secs(1)).unwrap());

    // Dropping a lab takes it down too.
    let lab = Lab::up(plan(), UpOptions::new(&run_dir)).unwrap();
    drop(lab);
    assert!(gone(&names));
    fs::remove_dir_all(&base).unwrap();
}

#[test]
fn an_interrupted_build_returns_interrupted_and_leaves_nothing_not_even_its_state_file() {
    if skip(
        "lab::run::tests::an_interrupted_build_returns_interrupted_and_leaves_nothing_not_even_its_state_file",
    ) {
        return;
    }
    let (base, manifests, run_dir, opts) = two_pod_lab("interrupt", "aeli");
    let plan = plan_dir(&manifests, DEFAULT_SERVICE_CIDR.parse().unwrap(), &opts)
        .unwrap()
        .plan;
    let up = UpOptions::new(&run_dir);
    up.interrupt.store(true, Ordering::SeqCst);
    let err = Lab::up(plan.clone(), up).unwrap_err();
    assert!(matches!(err, LabError::Interrupted), "{err}");
    for name in ["aeli-underlay", "aeli-n1", "aeli-one"] {
        assert!(!Path::new(NETNS_DIR).join(name).exists(), "{name}");
    }
    // Nothing is left to clean, so the next run starts.
    assert!(!run_dir.join(STATE_FILE).exists());
    Lab::up(plan, UpOptions::new(&run_dir))
        .unwrap()
        .down()
        .unwrap();
    fs::remove_dir_all(&base).unwrap();
}
