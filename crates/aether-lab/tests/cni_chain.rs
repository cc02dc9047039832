//! Root-only: `aether-cni` chained after Debian's `containernetworking-plugins` (bridge +
//! host-local), driven the way libcni drives a conflist, against a real `aether node` (issue #9
//! §4). Each test builds its own node and pod network namespaces, a conflist written by
//! `aether cni install`, a registry with one pod served from its CNI ADD, and a daemon in the
//! node's namespace; the plugins run inside the node's namespace, so the bridge is made there.
//!
//! The plugin binary is `$AETHER_CNI_PLUGIN_BIN` when set (the static build, README.md), else
//! the test build of `aether`; `aether cni install` copies it as `aether-cni`, which the harness
//! runs from `CNI_PATH` like the runtime does.
//!
//! Debian's plugins (1.1.1) speak CNI up to 1.0.0, so the chain runs at 1.0.0 and 0.3.1; the
//! 1.1.0 commands (ADD, CHECK, STATUS) are sent to `aether-cni` alone with the bridge's result as
//! `prevResult`. Without root, `ip`, `nft` or the plugins this prints SKIPPED, or fails under
//! `AETHER_REQUIRE_NETNS=1` (`src/test_util/needs_root.rs`).

#![allow(clippy::unwrap_used)] // Tests unwrap: a panic is the failure report (STYLE.md §6.4).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use aether::test_util::needs_root;

/// Where Debian's `containernetworking-plugins` puts the plugins.
const DEBIAN_CNI: &str = "/usr/lib/cni";

const POD: &str = "cni-pod-0";

fn daemon_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_aether"))
}

fn plugin_binary() -> PathBuf {
    std::env::var_os("AETHER_CNI_PLUGIN_BIN")
        .filter(|v| !v.is_empty())
        .map_or_else(daemon_binary, PathBuf::from)
}

/// True when the test must return (SKIPPED), per the crate's one rule.
fn cannot_run(test: &str) -> bool {
    if needs_root::cannot_run(test, &["ip", "nft"]) {
        return true;
    }
    for plugin in ["bridge", "host-local"] {
        if !Path::new(DEBIAN_CNI).join(plugin).is_file() {
            return needs_root::skip(
                test,
                &format!(
                    "{DEBIAN_CNI}/{plugin} is missing (apt-get install containernetworking-plugins)"
                ),
            );
        }
    }
    false
}

/// One test's lab: a node and a pod network namespace, a directory, and the daemon when it runs.
struct Lab {
    version: &'static str,
    node: String,
    pod: String,
    dir: PathBuf,
    subnet: u8,
    daemon: Option<Child>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop_daemon();
        for ns in [&self.pod, &self.node] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What one plugin said.
#[derive(Debug)]
struct Ran {
    plugin: String,
    ok: bool,
    stdout: String,
}

impl Lab {
    fn new(version: &'static str, subnet: u8) -> Self {
        let tag = format!("{}{}", subnet, std::process::id() % 10_000);
        let dir = std::env::temp_dir().join(format!("aether-cni-chain-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["bin", "net.d", "state", "registry", "ipam"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let lab = Self {
            version,
            node: format!("aecn-n{tag}"),
            pod: format!("aecn-p{tag}"),
            dir,
            subnet,
            daemon: None,
        };
        for ns in [&lab.node, &lab.pod] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
            assert!(
                Command::new("ip")
                    .args(["netns", "add", ns])
                    .status()
                    .unwrap()
                    .success()
            );
            assert!(
                Command::new("ip")
                    .args(["netns", "exec", ns, "ip", "link", "set", "lo", "up"])
                    .status()
                    .unwrap()
                    .success()
            );
        }
        lab
    }

    fn pod_ip(&self) -> String {
        format!("10.250.{}.10", self.subnet)
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("state/cni.sock")
    }

    fn netns_path(&self) -> PathBuf {
        Path::new("/var/run/netns").join(&self.pod)
    }

    /// The primary network (bridge + host-local, one address: the pod's) as the primary CNI
    /// writes it, then `aether cni install`.
    fn install(&self) -> Value {
        let primary = json!({
            "cniVersion": self.version,
            "name": format!("aether-lab-{}", self.subnet),
            "plugins": [{
                "type": "bridge",
                "bridge": format!("aecnibr{}", self.subnet),
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "dataDir": self.dir.join("ipam"),
                    "ranges": [[{
                        "subnet": format!("10.250.{}.0/24", self.subnet),
                        "rangeStart": self.pod_ip(),
                        "rangeEnd": self.pod_ip(),
                    }]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }],
        });
        let conf = self.dir.join("net.d/10-lab.conflist");
        std::fs::write(&conf, serde_json::to_vec_pretty(&primary).unwrap()).unwrap();
        let plugin_config = json!({"socket": self.socket(), "timeoutSecs": 10}).to_string();
        let out = Command::new(plugin_binary())
            .args(["cni", "install", "--bin-dir"])
            .arg(self.dir.join("bin"))
            .arg("--conf-dir")
            .arg(self.dir.join("net.d"))
            .args(["--plugin-config", &plugin_config])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "aether cni install: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let installed = self.dir.join("bin/aether-cni");
        let mode = std::fs::metadata(&installed).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(
            std::fs::read(&installed).unwrap(),
            std::fs::read(plugin_binary()).unwrap()
        );
        let list: Value = serde_json::from_slice(&std::fs::read(&conf).unwrap()).unwrap();
        let types: Vec<&str> = list["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["bridge", "aether-cni"], "{list}");
        assert_eq!(
            list["plugins"][0], primary["plugins"][0],
            "the primary plugin was changed"
        );
        list
    }

    /// Run one plugin of `list` as libcni does: the list's name and version injected, the
    /// previous result as `prevResult`, inside the node's namespace.
    fn run_plugin(
        &self,
        list: &Value,
        plugin: &Value,
        command: &str,
        k8s_ns: &str,
        prev: Option<&Value>,
    ) -> Ran {
        let mut conf = plugin.as_object().unwrap().clone();
        conf.insert("cniVersion".into(), list["cniVersion"].clone());
        conf.insert("name".into(), list["name"].clone());
        if let Some(p) = prev {
            conf.insert("prevResult".into(), p.clone());
        }
        self.exec(
            plugin["type"].as_str().unwrap(),
            command,
            k8s_ns,
            serde_json::to_string(&conf).unwrap().as_bytes(),
        )
    }

    /// Run the plugin `kind` from CNI_PATH with `stdin`.
    fn exec(&self, kind: &str, command: &str, k8s_ns: &str, stdin: &[u8]) -> Ran {
        let cni_path = [self.dir.join("bin"), PathBuf::from(DEBIAN_CNI)];
        let binary = cni_path
            .iter()
            .map(|d| d.join(kind))
            .find(|p| p.is_file())
            .unwrap();
        let path = std::env::join_paths(&cni_path).unwrap();
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.node])
            .arg(&binary)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", format!("cid{}", self.subnet))
            .env("CNI_NETNS", self.netns_path())
            .env("CNI_IFNAME", "eth0")
            .env(
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={k8s_ns};K8S_POD_NAME={POD};K8S_POD_INFRA_CONTAINER_ID=cid"),
            )
            .env("CNI_PATH", path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        Ran {
            plugin: kind.to_owned(),
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        }
    }

    /// ADD through the list, in order; every plugin's run (the chain stops at a failure).
    fn add(&self, list: &Value, k8s_ns: &str) -> Vec<Ran> {
        let mut prev: Option<Value> = None;
        let mut ran = Vec::new();
        for plugin in list["plugins"].as_array().unwrap() {
            let r = self.run_plugin(list, plugin, "ADD", k8s_ns, prev.as_ref());
            let ok = r.ok;
            if ok {
                prev = Some(
                    serde_json::from_str(&r.stdout)
                        .unwrap_or_else(|e| panic!("{}: {e}: {}", r.plugin, r.stdout)),
                );
            }
            ran.push(r);
            if !ok {
                break;
            }
        }
        ran
    }

    /// DEL through the list in reverse, with the cached result from 0.4.0 on (libcni).
    fn del(&self, list: &Value, k8s_ns: &str, cached: Option<&Value>) -> Vec<Ran> {
        let prev = cached.filter(|_| self.version != "0.3.1");
        list["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .map(|p| self.run_plugin(list, p, "DEL", k8s_ns, prev))
            .collect()
    }

    fn start_daemon(&mut self) {
        let _ = std::fs::remove_file(self.socket());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("daemon.log"))
            .unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.node])
            .arg(daemon_binary())
            .args(["node", "--node-name", "node-a", "--registry"])
            .arg(self.dir.join("registry"))
            .arg("--state-dir")
            .arg(self.dir.join("state"))
            .args(["--log-level", "info"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.daemon = Some(child);
        // The CNI socket comes first (before a running daemon's sockets are taken over), the
        // admin socket after the first reconcile.
        let up = wait_until(Duration::from_secs(30), || {
            self.socket().exists() && self.dir.join("state/admin.sock").exists()
        });
        assert!(
            up,
            "the daemon did not bind its CNI and admin sockets: {}",
            self.daemon_log()
        );
    }

    fn stop_daemon(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            // The daemon is our own child (`ip netns exec` execs it): stopped by its pid.
            let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            if !wait_until(Duration::from_secs(15), || {
                child.try_wait().ok().flatten().is_some()
            }) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }

    fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// `/pods` from the daemon's admin socket.
    fn served(&self) -> Vec<Value> {
        let mut s =
            std::os::unix::net::UnixStream::connect(self.dir.join("state/admin.sock")).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /pods HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b)
            .unwrap_or_default();
        serde_json::from_str::<Value>(body)
            .unwrap_or_else(|e| panic!("/pods: {e}: {text}"))
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    fn serves_pod(&self) -> bool {
        self.served().iter().any(|p| p["pod"] == POD)
    }

    /// Whether the pod's loopback proxy listener (127.0.0.1:18081, opened by the daemon inside
    /// the pod's namespace) accepts a connection.
    fn proxy_port_answers(&self) -> bool {
        let home = aether::netns::Netns::current().unwrap();
        let pod = aether::netns::Netns::named(&self.pod).unwrap();
        let addr: SocketAddr = "127.0.0.1:18081".parse().unwrap();
        // Its own thread: the test's threads stay in their namespace whatever happens.
        std::thread::spawn(move || {
            pod.run(&home, || {
                TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
            })
            .unwrap()
        })
        .join()
        .unwrap()
    }

    fn capture_programmed(&self) -> bool {
        Command::new("ip")
            .args([
                "netns", "exec", &self.pod, "nft", "list", "table", "inet", "aether",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    fn write_registry(&self) {
        let manifests = format!(
            r#"apiVersion: v1
kind: Namespace
metadata: {{name: mp}}
---
apiVersion: v1
kind: Pod
metadata:
  name: {POD}
  namespace: mp
  annotations: {{aether.io/netns-from: cni, endpoint.aether.io/port: "8080"}}
spec: {{serviceAccountName: cni-app, nodeName: node-a}}
status: {{podIP: {ip}}}
"#,
            ip = self.pod_ip()
        );
        std::fs::write(self.dir.join("registry/pods.yaml"), manifests).unwrap();
    }

    fn records(&self) -> usize {
        std::fs::read_dir(self.dir.join("state/cni-pods")).map_or(0, |d| d.count())
    }
}

fn wait_until(bound: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = aether::time::now() + bound;
    loop {
        if f() {
            return true;
        }
        if aether::time::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn all_ok(ran: &[Ran]) -> bool {
    ran.iter().all(|r| r.ok)
}

fn error_code(ran: &Ran) -> Option<u64> {
    serde_json::from_str::<Value>(&ran.stdout).ok()?["code"].as_u64()
}

/// The whole story at one version: see the module's opening.
fn chain_story(version: &'static str, subnet: u8) {
    let mut lab = Lab::new(version, subnet);
    let list = lab.install();
    lab.write_registry();

    // VERSION, from the installed binary.
    let v = lab.exec("aether-cni", "VERSION", "mp", br#"{"cniVersion":"1.0.0"}"#);
    assert!(v.ok);
    assert_eq!(
        v.stdout.trim_end(),
        r#"{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}"#
    );

    // No daemon: the bridge sets the pod up, aether-cni fails the ADD (try again later), and
    // the runtime's DEL then succeeds through the whole list.
    let ran = lab.add(&list, "mp");
    assert_eq!(ran.len(), 2, "{ran:?}");
    assert!(ran[0].ok, "bridge: {:?}", ran[0]);
    assert!(!ran[1].ok, "ADD succeeded with no daemon: {:?}", ran[1]);
    assert_eq!(error_code(&ran[1]), Some(11), "{:?}", ran[1]);
    let err: Value = serde_json::from_str(&ran[1].stdout).unwrap();
    assert_eq!(err["cniVersion"], version);
    assert!(err["msg"].as_str().unwrap().contains("not ready"), "{err}");
    let bridge: Value = serde_json::from_str(&ran[0].stdout).unwrap();
    let del = lab.del(&list, "mp", Some(&bridge));
    assert!(all_ok(&del), "DEL with no daemon: {del:?}");

    // An ignored namespace passes through with no daemon: the result is the bridge's.
    let ran = lab.add(&list, "kube-system");
    assert!(all_ok(&ran), "{ran:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&ran[1].stdout).unwrap(),
        serde_json::from_str::<Value>(&ran[0].stdout).unwrap()
    );
    let cached: Value = serde_json::from_str(&ran[1].stdout).unwrap();
    assert!(all_ok(&lab.del(&list, "kube-system", Some(&cached))));

    // With the daemon: ADD succeeds once the pod is served, and hands the bridge's result on
    // byte for byte.
    lab.start_daemon();
    assert!(!lab.serves_pod(), "served before its ADD");
    let ran = lab.add(&list, "mp");
    assert!(all_ok(&ran), "{ran:?}\n{}", lab.daemon_log());
    let bridge: Value = serde_json::from_str(&ran[0].stdout).unwrap();
    assert_eq!(
        ran[1].stdout,
        format!("{}\n", serde_json::to_string(&bridge).unwrap())
    );
    let ips: Vec<&str> = bridge["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["address"].as_str().unwrap())
        .collect();
    assert!(
        ips.contains(&format!("{}/24", lab.pod_ip()).as_str()),
        "{bridge}"
    );
    assert!(lab.serves_pod(), "{:?}", lab.served());
    assert!(
        lab.capture_programmed(),
        "no capture table in the pod's namespace"
    );
    assert!(
        lab.proxy_port_answers(),
        "the pod's 127.0.0.1:18081 does not answer"
    );
    assert_eq!(lab.records(), 1);
    let cached: Value = serde_json::from_str(&ran[1].stdout).unwrap();

    // CHECK: the whole list from 0.4.0; at 0.3.1 aether-cni refuses it (error 1), as the
    // specification says.
    if version == "0.3.1" {
        let check = lab.run_plugin(&list, &list["plugins"][1], "CHECK", "mp", Some(&cached));
        assert_eq!(error_code(&check), Some(1), "{check:?}");
    } else {
        for p in list["plugins"].as_array().unwrap() {
            let r = lab.run_plugin(&list, p, "CHECK", "mp", Some(&cached));
            assert!(r.ok, "CHECK {}: {r:?}", r.plugin);
        }
        // 1.1.0, which Debian's bridge does not speak, to aether-cni alone: ADD hands the
        // result on, CHECK and STATUS answer ok.
        let mut prev = cached.clone();
        prev["cniVersion"] = "1.1.0".into();
        let mut one_one = list.clone();
        one_one["cniVersion"] = "1.1.0".into();
        let mine = &one_one["plugins"][1];
        let add = lab.run_plugin(&one_one, mine, "ADD", "mp", Some(&prev));
        assert!(add.ok, "{add:?}");
        assert_eq!(
            add.stdout,
            format!("{}\n", serde_json::to_string(&prev).unwrap())
        );
        assert!(
            lab.run_plugin(&one_one, mine, "CHECK", "mp", Some(&prev))
                .ok
        );
        assert!(lab.run_plugin(&one_one, mine, "STATUS", "mp", None).ok);
    }

    // The daemon restarts: the pod is served again from its record, with no new ADD.
    lab.stop_daemon();
    assert!(
        !lab.proxy_port_answers(),
        "the stopped daemon's listener still answers"
    );
    assert_eq!(lab.records(), 1, "the record did not survive the daemon");
    lab.start_daemon();
    assert!(
        wait_until(Duration::from_secs(10), || lab.serves_pod()),
        "not served again after the restart: {:?}\n{}",
        lab.served(),
        lab.daemon_log()
    );
    assert!(
        lab.proxy_port_answers(),
        "after the restart, 127.0.0.1:18081 does not answer"
    );
    assert!(
        lab.daemon_log()
            .contains("CNI pods of an earlier run found again")
    );

    // DEL: the pod is no longer served and its record is gone.
    let del = lab.del(&list, "mp", Some(&cached));
    assert!(all_ok(&del), "{del:?}");
    assert!(!lab.serves_pod());
    assert_eq!(lab.records(), 0);
    assert!(!lab.proxy_port_answers());
    if version != "0.3.1" {
        let mut one_one = list.clone();
        one_one["cniVersion"] = "1.1.0".into();
        let check = lab.run_plugin(
            &one_one,
            &one_one["plugins"][1],
            "CHECK",
            "mp",
            Some(&cached),
        );
        assert_eq!(
            error_code(&check),
            Some(100),
            "CHECK of a deleted pod: {check:?}"
        );
    }

    // The daemon gone, DEL again: idempotent and successful; STATUS says not available.
    lab.stop_daemon();
    let del = lab.del(&list, "mp", Some(&cached));
    assert!(all_ok(&del), "{del:?}");
    let mut one_one = list;
    one_one["cniVersion"] = "1.1.0".into();
    let status = lab.run_plugin(&one_one, &one_one["plugins"][1], "STATUS", "mp", None);
    assert_eq!(error_code(&status), Some(50), "{status:?}");
}

#[test]
fn aether_cni_chained_after_bridge_and_host_local_at_cni_1_0_0() {
    if cannot_run("aether_cni_chained_after_bridge_and_host_local_at_cni_1_0_0") {
        return;
    }
    chain_story("1.0.0", 61);
}

#[test]
fn aether_cni_chained_after_bridge_and_host_local_at_cni_0_3_1() {
    if cannot_run("aether_cni_chained_after_bridge_and_host_local_at_cni_0_3_1") {
        return;
    }
    chain_story("0.3.1", 62);
}
