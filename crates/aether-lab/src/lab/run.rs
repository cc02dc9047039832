//! Carrying a [`LabPlan`] out on this machine (root): namespaces, links, addresses, routes,
//! sysctls and the kube-proxy stand-in, then the daemons and the pods' commands.
//!
//! Everything is done with `ip`, `sysctl` (through `ip netns exec`) and `nft -f`. Every link
//! lives inside a namespace the lab made (veths are created in the node namespace with their
//! peer placed straight into the pod or underlay namespace), so deleting the namespaces removes
//! every link, and nothing is ever created in the caller's own namespace.
//!
//! Every namespace, `/etc/netns/<pod>` directory and process is recorded in a state file under
//! the run directory the moment it exists, so that [`Lab::down`] removes exactly what
//! [`Lab::up`] made, and [`Lab::cleanup_stale`] removes the leftovers of a run that crashed.
//! A [`Lab`] that is dropped without `down` runs it from its `Drop` (best effort).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::net::TcpSocket;

use crate::lab::plan::{
    AETHER_ARGV0, APISERVER_IP, InvalidLab, LabPlan, NODE_BRIDGE, NODE_UNDERLAY_IF, POD_IF,
    UNDERLAY_BRIDGE, UNDERLAY_SUBNET,
};
use aether::netns::{NETNS_DIR, Netns, NetnsError};
use aether::registry::file::FileError;
use aether::time;

/// The state file's name under the run directory.
pub const STATE_FILE: &str = "lab-state.json";
/// Where `ip netns exec` finds per-namespace files (`/etc/netns/<name>/resolv.conf`).
pub const ETC_NETNS: &str = "/etc/netns";
/// The `PATH` of the pods' commands (their environment is their manifest's, not the caller's).
pub const POD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How [`Lab::up`] runs.
#[derive(Clone, Debug)]
pub struct UpOptions {
    /// The run directory: the state file, the rendered ruleset, `logs/`.
    pub run_dir: PathBuf,
    /// How long a started process gets between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// Variables added to every pod command's environment (after the manifest's), e.g. `RUST_LOG`.
    pub extra_pod_env: Vec<(String, String)>,
    /// Set from elsewhere (a signal handler) to make [`Lab::up`] stop building: it removes what
    /// it made and returns [`LabError::Interrupted`]. Checked before every namespace, every pod
    /// and the ruleset.
    pub interrupt: Arc<AtomicBool>,
}

impl UpOptions {
    /// Options with the run directory `run_dir`, a 3 s stop grace, no extra environment and an
    /// interrupt flag nobody else holds.
    pub fn new(run_dir: impl Into<PathBuf>) -> Self {
        Self {
            run_dir: run_dir.into(),
            stop_grace: Duration::from_secs(3),
            extra_pod_env: Vec::new(),
            interrupt: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// A lab operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The lab's etcd could not be started.
    #[error(transparent)]
    Etcd(#[from] crate::lab::etcd::EtcdServerError),
    /// The manifests do not make a lab.
    #[error(transparent)]
    Invalid(#[from] InvalidLab),
    /// The manifest directory could not be read.
    #[error(transparent)]
    Load(#[from] FileError),
    /// A file or directory operation failed.
    #[error("{}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A command could not be started.
    #[error("cannot run `{command}`")]
    Spawn {
        /// The command line.
        command: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A command failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// A namespace the lab would create exists already: it is not the lab's to take over.
    #[error(
        "network namespace {0} exists already; remove it, or run the lab's cleanup if a crashed run of this lab made it"
    )]
    NetnsExists(String),
    /// `/etc/netns/<name>` exists already.
    #[error("{} exists already; it is not the lab's to overwrite", .0.display())]
    EtcNetnsExists(PathBuf),
    /// The run directory holds the state of another run.
    #[error(
        "{} records a run that was not taken down; clean it up first (Lab::cleanup_stale)",
        .0.display()
    )]
    StaleState(PathBuf),
    /// The state file cannot be read or written.
    #[error("state file {}", path.display())]
    State {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// No such node in the plan.
    #[error("no node {0} in the lab")]
    UnknownNode(String),
    /// No such pod in the plan.
    #[error("no pod {namespace}/{pod} in the lab")]
    UnknownPod {
        /// Its namespace.
        namespace: String,
        /// Its name.
        pod: String,
    },
    /// An empty argv.
    #[error("an empty command line for {0}")]
    EmptyCommand(String),
    /// Entering a namespace failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// [`UpOptions::interrupt`] was set while the lab was being built; what was made is removed.
    #[error("interrupted while building the lab")]
    Interrupted,
    /// A port did not accept in time.
    #[error("{addr} in pod {namespace}/{pod} did not accept a connection within {timeout:?}")]
    Timeout {
        /// The pod's namespace.
        namespace: String,
        /// The pod.
        pod: String,
        /// The address dialled.
        addr: SocketAddr,
        /// The bound.
        timeout: Duration,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LabError + '_ {
    move |source| LabError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A process the lab started, as the state file records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct ProcessRecord {
    /// Its PID (and process group: each is started as a group leader).
    pid: i32,
    /// Its start time (`/proc/<pid>/stat` field 22), so a reused PID is never signalled.
    start_time: u64,
    /// What it is (`node node-a`, `pod mp/mp-client`).
    what: String,
}

/// What the lab made, in creation order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct LabState {
    namespaces: Vec<String>,
    etc_netns: Vec<PathBuf>,
    processes: Vec<ProcessRecord>,
}

#[derive(Debug)]
struct Started {
    record: ProcessRecord,
    child: Child,
    log: PathBuf,
    reported: bool,
}

/// A process the lab started that has exited on its own.
#[derive(Debug)]
pub struct Exited {
    /// What it was (`node node-a`, `pod mp/mp-client`).
    pub what: String,
    /// How it ended.
    pub status: ExitStatus,
    /// Its log.
    pub log: PathBuf,
}

/// A running lab. Dropping it takes it down (best effort); [`Lab::down`] reports errors.
#[derive(Debug)]
pub struct Lab {
    plan: LabPlan,
    opts: UpOptions,
    state: LabState,
    started: Vec<Started>,
    home: Arc<Netns>,
    pods: BTreeMap<(String, String), Arc<Netns>>,
    finished: bool,
}

fn render(program: &str, args: &[&str]) -> String {
    let mut s = program.to_owned();
    for a in args {
        s.push(' ');
        s.push_str(a);
    }
    s
}

/// Runs a command to completion; a non-zero exit is an error carrying its stderr.
fn run_cmd(program: &str, args: &[&str]) -> Result<(), LabError> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LabError::Spawn {
            command: render(program, args),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(LabError::Command {
            command: render(program, args),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

fn ip(args: &[&str]) -> Result<(), LabError> {
    run_cmd("ip", args)
}

/// `ip` with the words of `line`. Only for lines whose every value is a name the plan checked
/// ([`crate::lab::plan::valid_name`]) or an address: none holds white space.
fn ip_line(line: &str) -> Result<(), LabError> {
    ip(&line.split_whitespace().collect::<Vec<_>>())
}

fn netns_exists(name: &str) -> bool {
    Path::new(NETNS_DIR).join(name).exists()
}

/// Field 22 of `/proc/<pid>/stat`: the start time in clock ticks since boot; `None` when the
/// process is gone or a zombie.
fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after the last ')'.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

fn signal_group(pid: i32, signal: Signal) {
    // Each process the lab starts leads its own group; the group is gone once all of it exits.
    let _ = kill(Pid::from_raw(-pid), signal);
}

impl Lab {
    /// Creates everything `plan` says, records it under `opts.run_dir`, and returns the lab.
    ///
    /// Refuses to start when a namespace or `/etc/netns` entry it would create exists already,
    /// or when the run directory records a run that was not taken down. On an error halfway, or
    /// when [`UpOptions::interrupt`] is set, what was made is removed before the error is
    /// returned.
    pub fn up(plan: LabPlan, opts: UpOptions) -> Result<Self, LabError> {
        let logs = opts.run_dir.join("logs");
        fs::create_dir_all(&logs).map_err(io_err(&logs))?;
        let state_path = opts.run_dir.join(STATE_FILE);
        if state_path.exists() {
            return Err(LabError::StaleState(state_path));
        }
        let names = std::iter::once(plan.underlay_netns.as_str())
            .chain(plan.nodes.iter().map(|n| n.netns.as_str()))
            .chain(plan.pods.iter().map(|p| p.netns.as_str()));
        for name in names {
            if netns_exists(name) {
                return Err(LabError::NetnsExists(name.to_owned()));
            }
        }
        for pod in &plan.pods {
            let dir = Path::new(ETC_NETNS).join(&pod.netns);
            if dir.exists() {
                return Err(LabError::EtcNetnsExists(dir));
            }
        }
        let home = Arc::new(Netns::current()?);
        let mut lab = Self {
            plan,
            opts,
            state: LabState::default(),
            started: Vec::new(),
            home,
            pods: BTreeMap::new(),
            finished: false,
        };
        lab.save()?;
        // On an error the lab is dropped here, and its Drop removes what was made.
        lab.build()?;
        Ok(lab)
    }

    /// The plan the lab was built from.
    pub fn plan(&self) -> &LabPlan {
        &self.plan
    }

    /// The run directory.
    pub fn run_dir(&self) -> &Path {
        &self.opts.run_dir
    }

    /// The log file of pod `namespace/pod`.
    pub fn pod_log(&self, namespace: &str, pod: &str) -> Option<PathBuf> {
        let p = self.plan.pod(namespace, pod)?;
        Some(self.opts.run_dir.join("logs").join(&p.log_name))
    }

    fn state_path(&self) -> PathBuf {
        self.opts.run_dir.join(STATE_FILE)
    }

    fn save(&self) -> Result<(), LabError> {
        let path = self.state_path();
        let text = serde_json::to_string_pretty(&self.state).map_err(|source| LabError::State {
            path: path.clone(),
            source,
        })?;
        let tmp = path.with_extension("json.tmp");
        fs::write(&tmp, text).map_err(io_err(&tmp))?;
        fs::rename(&tmp, &path).map_err(io_err(&path))
    }

    fn check_interrupt(&self) -> Result<(), LabError> {
        if self.opts.interrupt.load(Ordering::SeqCst) {
            Err(LabError::Interrupted)
        } else {
            Ok(())
        }
    }

    fn add_netns(&mut self, name: &str) -> Result<(), LabError> {
        self.check_interrupt()?;
        ip(&["netns", "add", name])?;
        self.state.namespaces.push(name.to_owned());
        self.save()?;
        ip(&["-n", name, "link", "set", "lo", "up"])
    }

    fn build(&mut self) -> Result<(), LabError> {
        let plan = self.plan.clone();
        let ul = plan.underlay_netns.as_str();
        self.add_netns(ul)?;
        ip_line(&format!("-n {ul} link add {UNDERLAY_BRIDGE} type bridge"))?;
        ip_line(&format!("-n {ul} link set {UNDERLAY_BRIDGE} up"))?;
        let underlay_len = UNDERLAY_SUBNET.rsplit_once('/').map_or("24", |(_, l)| l);

        for node in &plan.nodes {
            let ns = node.netns.as_str();
            self.add_netns(ns)?;
            // Forwarding on; no ICMP redirects, so that pods keep sending same-node traffic
            // through the node (its conntrack must see both directions of a DNATed flow).
            ip_line(&format!(
                "netns exec {ns} sysctl -q -w net.ipv4.ip_forward=1 \
                 net.ipv4.conf.all.send_redirects=0 net.ipv4.conf.default.send_redirects=0"
            ))?;
            let (br, uif, peer) = (NODE_BRIDGE, NODE_UNDERLAY_IF, &node.underlay_peer);
            let len = node.pod_subnet.prefix_len();
            ip_line(&format!("-n {ns} link add {br} type bridge"))?;
            ip_line(&format!(
                "-n {ns} addr add {}/{len} dev {br}",
                node.bridge_addr
            ))?;
            ip_line(&format!("-n {ns} link set {br} up"))?;
            ip_line(&format!(
                "-n {ns} link add {uif} type veth peer name {peer} netns {ul}"
            ))?;
            ip_line(&format!(
                "-n {ul} link set {peer} master {UNDERLAY_BRIDGE} up"
            ))?;
            let addr = node.underlay_addr;
            ip_line(&format!("-n {ns} addr add {addr}/{underlay_len} dev {uif}"))?;
            ip_line(&format!("-n {ns} link set {uif} up"))?;
        }
        for node in &plan.nodes {
            for (net, via) in &node.routes {
                let ns = &node.netns;
                ip_line(&format!(
                    "-n {ns} route add {net} via {via} dev {NODE_UNDERLAY_IF}"
                ))?;
            }
        }

        for pod in &plan.pods {
            self.check_interrupt()?;
            let node = plan
                .node(&pod.node)
                .ok_or_else(|| LabError::UnknownNode(pod.node.clone()))?;
            let (nns, pns, hif) = (node.netns.as_str(), pod.netns.as_str(), &pod.host_if);
            self.add_netns(pns)?;
            ip_line(&format!(
                "-n {nns} link add {hif} type veth peer name {POD_IF} netns {pns}"
            ))?;
            ip_line(&format!("-n {nns} link set {hif} master {NODE_BRIDGE} up"))?;
            // Hairpin mode, as the CNI bridge plugin's `hairpinMode` and kubelet's hairpin-veth
            // set it: where br_netfilter hands the bridge's traffic to the node's nftables
            // (`net.bridge.bridge-nf-call-iptables=1`), a frame DNATed back to the pod that
            // sent it is bridged, not routed, and must leave by the port it came in on.
            ip_line(&format!(
                "-n {nns} link set dev {hif} type bridge_slave hairpin on"
            ))?;
            // The /24 mask without its on-link route: every packet goes through the node.
            let (addr, len, gw) = (pod.ip, node.pod_subnet.prefix_len(), pod.gateway);
            ip_line(&format!(
                "-n {pns} addr add {addr}/{len} dev {POD_IF} noprefixroute"
            ))?;
            ip_line(&format!("-n {pns} link set {POD_IF} up"))?;
            ip_line(&format!("-n {pns} route add {gw} dev {POD_IF} scope link"))?;
            ip_line(&format!("-n {pns} route add default via {gw} dev {POD_IF}"))?;
            ip_line(&format!(
                "netns exec {pns} sysctl -q -w net.ipv4.conf.all.accept_redirects=0 \
                 net.ipv4.conf.default.accept_redirects=0"
            ))?;
            self.write_resolv_conf(pns, &pod.resolv_conf)?;
            let handle = Arc::new(Netns::named(pns)?);
            self.pods
                .insert((pod.namespace.clone(), pod.name.clone()), handle);
        }

        self.check_interrupt()?;
        let rules = self.opts.run_dir.join("kubeproxy.nft");
        fs::write(&rules, plan.render_kube_proxy()).map_err(io_err(&rules))?;
        for node in &plan.nodes {
            ip(&[
                "netns",
                "exec",
                &node.netns,
                "nft",
                "-f",
                &rules.display().to_string(),
            ])?;
        }
        Ok(())
    }

    fn write_resolv_conf(&mut self, netns: &str, text: &str) -> Result<(), LabError> {
        let root = Path::new(ETC_NETNS);
        fs::create_dir_all(root).map_err(io_err(root))?;
        let dir = root.join(netns);
        fs::create_dir(&dir).map_err(io_err(&dir))?;
        self.state.etc_netns.push(dir.clone());
        self.save()?;
        let file = dir.join("resolv.conf");
        fs::write(&file, text).map_err(io_err(&file))
    }

    /// Starts `argv` in `netns`. `env`: the whole environment (a pod's), else the caller's;
    /// `add_env` is added on top either way.
    #[allow(clippy::too_many_arguments)] // One private spawner, every caller names each.
    fn spawn(
        &mut self,
        what: String,
        netns: &str,
        enter: Enter,
        argv: &[String],
        env: Option<&[(String, String)]>,
        add_env: &[(String, String)],
        log: PathBuf,
    ) -> Result<u32, LabError> {
        let out = File::create(&log).map_err(io_err(&log))?;
        let err = out.try_clone().map_err(io_err(&log))?;
        let (mut cmd, how) = match enter {
            Enter::Pod => {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", netns]);
                (cmd, format!("ip netns exec {netns}"))
            }
            Enter::Node => {
                let path = Path::new(NETNS_DIR).join(netns);
                let mut cmd = Command::new("nsenter");
                cmd.arg(format!("--net={}", path.display())).arg("--");
                (cmd, format!("nsenter --net={} --", path.display()))
            }
        };
        cmd.args(argv)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        if let Some(env) = env {
            cmd.env_clear().env("PATH", POD_PATH);
            cmd.envs(env.iter().map(|(k, v)| (k, v)));
            cmd.envs(self.opts.extra_pod_env.iter().map(|(k, v)| (k, v)));
        }
        cmd.envs(add_env.iter().map(|(k, v)| (k, v)));
        let child = cmd.spawn().map_err(|source| LabError::Spawn {
            command: format!("{how} {}", argv.join(" ")),
            source,
        })?;
        let pid = child.id();
        let pid_i32 = i32::try_from(pid).unwrap_or(i32::MAX);
        let record = ProcessRecord {
            pid: pid_i32,
            start_time: start_time(pid_i32).unwrap_or(0),
            what,
        };
        self.state.processes.push(record.clone());
        self.started.push(Started {
            record,
            child,
            log,
            reported: false,
        });
        self.save()?;
        Ok(pid)
    }

    /// An argv whose argv\[0\] `aether` is replaced by the plan's binary.
    fn resolve_argv(&self, what: &str, argv: &[String]) -> Result<Vec<String>, LabError> {
        let mut argv = argv.to_vec();
        match argv.first_mut() {
            None => return Err(LabError::EmptyCommand(what.to_owned())),
            Some(first) if first == AETHER_ARGV0 => {
                *first = self.plan.binary.display().to_string();
            }
            Some(_) => {}
        }
        Ok(argv)
    }

    /// The name of node `node`'s namespace.
    fn node_netns(&self, node: &str) -> Result<String, LabError> {
        Ok(self
            .plan
            .node(node)
            .ok_or_else(|| LabError::UnknownNode(node.to_owned()))?
            .netns
            .clone())
    }

    /// Starts `argv` in node `node`'s namespace (`nsenter --net=<node-ns> argv...`: the host's
    /// mounts, its cgroup file system included), with the
    /// caller's environment plus `env`, output to `<run>/logs/node-<node>.log`. An argv\[0\] of
    /// `aether` is replaced by the plan's binary. Returns the PID.
    pub fn start_daemon(
        &mut self,
        node: &str,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<u32, LabError> {
        let netns = self.node_netns(node)?;
        let argv = self.resolve_argv(&format!("node {node}"), argv)?;
        let log = self
            .opts
            .run_dir
            .join("logs")
            .join(format!("node-{node}.log"));
        self.spawn(
            format!("node {node}"),
            &netns,
            Enter::Node,
            &argv,
            None,
            env,
            log,
        )
    }

    /// Gives the underlay bridge the address [`APISERVER_IP`] and starts `argv` (the lab's API
    /// server, which listens there) in the underlay namespace, with the caller's environment,
    /// output to `<run>/logs/apiserver.log`; every node reaches it over its underlay link. The
    /// address goes with the namespace when the lab is taken down. Returns the PID.
    pub fn start_apiserver(&mut self, argv: &[String]) -> Result<u32, LabError> {
        let underlay = self.registry_address()?;
        let argv = self.resolve_argv("the lab's API server", argv)?;
        let log = self.opts.run_dir.join("logs").join("apiserver.log");
        self.spawn(
            "apiserver".to_owned(),
            &underlay,
            Enter::Pod,
            &argv,
            None,
            &[],
            log,
        )
    }

    /// Gives the underlay bridge the address [`APISERVER_IP`], where the nodes reach the
    /// lab's registry (its API server or its etcd). Returns the underlay's namespace.
    fn registry_address(&mut self) -> Result<String, LabError> {
        let underlay = self.plan.underlay_netns.clone();
        let len = UNDERLAY_SUBNET.split_once('/').map_or("24", |(_, len)| len);
        ip_line(&format!(
            "-n {underlay} addr add {APISERVER_IP}/{len} dev {UNDERLAY_BRIDGE}"
        ))?;
        Ok(underlay)
    }

    /// Starts etcd (`etcd` on `PATH`: Debian's etcd-server) in the underlay's namespace on
    /// [`APISERVER_IP`], `members` members (1 or 3) on ports of their own, their data and logs
    /// under `<run>/etcd`, for daemons on the etcd source. The members are the returned
    /// control's: the fault legs stop, kill and restart them through it, and dropping it stops
    /// them.
    pub fn start_etcd(
        &mut self,
        members: usize,
    ) -> Result<crate::lab::etcd::EtcdControl, LabError> {
        let underlay = self.registry_address()?;
        let data = self.opts.run_dir.join("etcd");
        let _ = fs::remove_dir_all(&data);
        Ok(crate::lab::etcd::EtcdControl::start(
            &underlay,
            &data,
            members,
            std::net::IpAddr::V4(APISERVER_IP),
        )?)
    }

    /// Kills node `node`'s daemon at once (SIGKILL), as a crash would; its exit is expected
    /// (never reported by [`Lab::exited`]). [`Lab::restart_daemon`] starts it again.
    pub fn kill_daemon(&mut self, node: &str) {
        let what = format!("node {node}");
        for s in &mut self.started {
            if s.record.what == what && matches!(s.child.try_wait(), Ok(None)) {
                s.reported = true;
                signal_group(s.record.pid, Signal::SIGKILL);
                let _ = s.child.wait();
            }
        }
    }

    /// Stops node `node`'s daemon (SIGTERM, SIGKILL after the stop grace) and starts `argv` in
    /// its place; the old log is kept as `node-<node>.log.<n>`. Returns the new PID.
    pub fn restart_daemon(
        &mut self,
        node: &str,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<u32, LabError> {
        let what = format!("node {node}");
        let mut old: Vec<Started> = Vec::new();
        let mut kept = Vec::new();
        for s in self.started.drain(..) {
            if s.record.what == what {
                old.push(s);
            } else {
                kept.push(s);
            }
        }
        self.started = kept;
        for s in &mut old {
            if matches!(s.child.try_wait(), Ok(None)) {
                signal_group(s.record.pid, Signal::SIGTERM);
            }
        }
        let deadline = time::now() + self.opts.stop_grace;
        for s in &mut old {
            while matches!(s.child.try_wait(), Ok(None)) && time::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(s.child.try_wait(), Ok(None)) {
                signal_group(s.record.pid, Signal::SIGKILL);
                let _ = s.child.wait();
            }
        }
        self.state.processes.retain(|p| p.what != what);
        self.save()?;
        let logs = self.opts.run_dir.join("logs");
        let log = logs.join(format!("node-{node}.log"));
        let n = (1..)
            .find(|n| !logs.join(format!("node-{node}.log.{n}")).exists())
            .unwrap_or(1);
        let _ = fs::rename(&log, logs.join(format!("node-{node}.log.{n}")));
        self.start_daemon(node, argv, env)
    }

    /// Starts `argv` as node `node`'s daemon **beside** the running one, which hands its
    /// listening sockets over, drains and exits by itself (`node::handoff`): an upgrade. The
    /// running daemon's log is kept as `node-<node>.log.<n>`, and its exit is expected (never
    /// reported by [`Lab::exited`]). Returns the new PID.
    pub fn upgrade_daemon(
        &mut self,
        node: &str,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<u32, LabError> {
        let what = format!("node {node}");
        for s in &mut self.started {
            if s.record.what == what {
                s.reported = true;
            }
        }
        let logs = self.opts.run_dir.join("logs");
        let log = logs.join(format!("node-{node}.log"));
        let n = (1..)
            .find(|n| !logs.join(format!("node-{node}.log.{n}")).exists())
            .unwrap_or(1);
        let _ = fs::rename(&log, logs.join(format!("node-{node}.log.{n}")));
        self.start_daemon(node, argv, env)
    }

    /// Sends SIGTERM to every daemon of node `node` but the newest (the one an upgrade started
    /// last), as the DaemonSet controller deletes the old pod once the new one is Ready; does not
    /// wait for them (an old daemon drains first). Returns how many were signalled.
    pub fn retire_daemons(&mut self, node: &str) -> usize {
        let what = format!("node {node}");
        let mut running: Vec<&mut Started> = self
            .started
            .iter_mut()
            .filter_map(|s| {
                let alive = s.record.what == what && matches!(s.child.try_wait(), Ok(None));
                alive.then_some(s)
            })
            .collect();
        running.pop();
        for s in &mut running {
            s.reported = true;
            signal_group(s.record.pid, Signal::SIGTERM);
        }
        running.len()
    }

    /// Starts `argv` in node `node`'s namespace as `what` (e.g. `cni node-a`), with the caller's
    /// environment plus `env`, output to `<run>/logs/<what>.log` (or `.log.<n>` when that
    /// exists). An argv\[0\] of `aether` is replaced by the plan's binary. Returns the PID.
    pub fn start_node_process(
        &mut self,
        node: &str,
        what: &str,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<u32, LabError> {
        let netns = self.node_netns(node)?;
        let argv = self.resolve_argv(what, argv)?;
        let logs = self.opts.run_dir.join("logs");
        let base = what.replace(' ', "-");
        let log = std::iter::once(logs.join(format!("{base}.log")))
            .chain((1..).map(|n| logs.join(format!("{base}.log.{n}"))))
            .find(|p| !p.exists())
            .unwrap_or_else(|| logs.join(format!("{base}.log")));
        self.spawn(what.to_owned(), &netns, Enter::Node, &argv, None, env, log)
    }

    /// Stops the process `pid` the lab started (SIGTERM, SIGKILL after `grace`) and waits for
    /// it; its exit is expected (never reported by [`Lab::exited`]). Returns how it ended, or
    /// `None` when the lab started no running process with that PID.
    pub fn stop_process(&mut self, pid: u32, grace: Duration) -> Option<ExitStatus> {
        let pid = i32::try_from(pid).ok()?;
        let s = self.started.iter_mut().find(|s| s.record.pid == pid)?;
        s.reported = true;
        if matches!(s.child.try_wait(), Ok(None)) {
            signal_group(pid, Signal::SIGTERM);
        }
        let deadline = time::now() + grace;
        while matches!(s.child.try_wait(), Ok(None)) && time::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(s.child.try_wait(), Ok(None)) {
            signal_group(pid, Signal::SIGKILL);
        }
        s.child.wait().ok()
    }

    /// Starts every pod's command in its namespace with its manifest's environment (plus
    /// [`UpOptions::extra_pod_env`]), output to `<run>/logs/<pod>.log`. Pods without a command
    /// are left idle. Returns how many were started.
    pub fn start_pods(&mut self) -> Result<usize, LabError> {
        let pods = self.plan.pods.clone();
        let mut n = 0;
        for pod in pods.iter().filter(|p| !p.argv.is_empty()) {
            let log = self.opts.run_dir.join("logs").join(&pod.log_name);
            let what = format!("pod {}/{}", pod.namespace, pod.name);
            self.spawn(
                what,
                &pod.netns,
                Enter::Pod,
                &pod.argv,
                Some(&pod.env),
                &[],
                log,
            )?;
            n += 1;
        }
        Ok(n)
    }

    /// The network namespace of pod `namespace/pod`, to open sockets in it.
    pub fn pod_netns(&self, namespace: &str, pod: &str) -> Option<Arc<Netns>> {
        self.pods
            .get(&(namespace.to_owned(), pod.to_owned()))
            .cloned()
    }

    /// The namespace the lab was brought up from (what [`Netns::run`] returns to).
    pub fn home(&self) -> Arc<Netns> {
        self.home.clone()
    }

    /// The PID of node `node`'s running daemon (`nsenter` execs it, so the PID the lab
    /// started is the daemon's own), to read its `/proc` figures.
    pub fn daemon_pid(&self, node: &str) -> Option<u32> {
        let what = format!("node {node}");
        self.started
            .iter()
            .rev()
            .find(|s| s.record.what == what)
            .and_then(|s| u32::try_from(s.record.pid).ok())
    }
    /// Waits until pod `namespace/pod` accepts TCP on `port` of its own IP, connecting from
    /// inside its namespace.
    pub async fn wait_tcp(
        &self,
        namespace: &str,
        pod: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<(), LabError> {
        let unknown = || LabError::UnknownPod {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
        };
        let plan = self.plan.pod(namespace, pod).ok_or_else(unknown)?;
        let netns = self.pod_netns(namespace, pod).ok_or_else(unknown)?;
        let addr = SocketAddr::V4(SocketAddrV4::new(plan.ip, port));
        let deadline = time::now() + timeout;
        loop {
            let socket = netns
                .run(&self.home, TcpSocket::new_v4)?
                .map_err(io_err(Path::new("socket")))?;
            let attempt = tokio::time::timeout(Duration::from_millis(250), socket.connect(addr));
            if let Ok(Ok(_)) = attempt.await {
                return Ok(());
            }
            if time::now() >= deadline {
                return Err(LabError::Timeout {
                    namespace: namespace.to_owned(),
                    pod: pod.to_owned(),
                    addr,
                    timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Processes the lab started that have exited since the last call (each reported once).
    pub fn exited(&mut self) -> Vec<Exited> {
        let mut out = Vec::new();
        for s in &mut self.started {
            if s.reported {
                continue;
            }
            if let Ok(Some(status)) = s.child.try_wait() {
                s.reported = true;
                out.push(Exited {
                    what: s.record.what.clone(),
                    status,
                    log: s.log.clone(),
                });
            }
        }
        out
    }

    /// Stops every process the lab started (SIGTERM, SIGKILL after the grace), deletes every
    /// namespace and `/etc/netns` entry it made, and removes the state file. Nothing else is
    /// touched. The first error is returned after every step was tried.
    pub fn down(mut self) -> Result<(), LabError> {
        self.finished = true;
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), LabError> {
        self.stop_processes();
        self.pods.clear();
        let result = remove_recorded(&self.state);
        if result.is_ok() {
            let path = self.state_path();
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(LabError::Io { path, source }),
            }
        }
        result
    }

    fn stop_processes(&mut self) {
        for s in &mut self.started {
            if matches!(s.child.try_wait(), Ok(None)) {
                signal_group(s.record.pid, Signal::SIGTERM);
            }
        }
        let deadline = time::now() + self.opts.stop_grace;
        loop {
            let running = self
                .started
                .iter_mut()
                .map(|s| usize::from(matches!(s.child.try_wait(), Ok(None))))
                .sum::<usize>();
            if running == 0 || time::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for s in &mut self.started {
            if matches!(s.child.try_wait(), Ok(None)) {
                signal_group(s.record.pid, Signal::SIGKILL);
                let _ = s.child.wait();
            }
        }
        self.started.clear();
    }

    /// Removes what a crashed run recorded under `run_dir`: its processes (when their PID still
    /// names the same process), its namespaces and its `/etc/netns` entries; then the state
    /// file. Returns `false` when there was no state to clean.
    pub fn cleanup_stale(run_dir: &Path, grace: Duration) -> Result<bool, LabError> {
        let path = run_dir.join(STATE_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(source) => return Err(LabError::Io { path, source }),
        };
        let state: LabState = serde_json::from_str(&text).map_err(|source| LabError::State {
            path: path.clone(),
            source,
        })?;
        let alive =
            |p: &ProcessRecord| p.start_time != 0 && start_time(p.pid) == Some(p.start_time);
        let ours: Vec<&ProcessRecord> = state.processes.iter().filter(|p| alive(p)).collect();
        for p in &ours {
            signal_group(p.pid, Signal::SIGTERM);
        }
        let deadline = time::now() + grace;
        while ours.iter().any(|p| alive(p)) && time::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        for p in &ours {
            if alive(p) {
                signal_group(p.pid, Signal::SIGKILL);
            }
        }
        remove_recorded(&state)?;
        fs::remove_file(&path).map_err(io_err(&path))?;
        Ok(true)
    }
}

/// Deletes the recorded namespaces (newest first) and `/etc/netns` entries; keeps going after
/// an error and returns the first.
fn remove_recorded(state: &LabState) -> Result<(), LabError> {
    let mut first = None;
    for name in state.namespaces.iter().rev() {
        if netns_exists(name)
            && let Err(e) = ip(&["netns", "del", name])
        {
            tracing::warn!(netns = %name, error = %e, "lab: cannot delete a namespace");
            first.get_or_insert(e);
        }
    }
    for dir in state.etc_netns.iter().rev() {
        let file = dir.join("resolv.conf");
        let removed = match fs::remove_file(&file) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(LabError::Io {
                path: file,
                source: e,
            }),
            _ => match fs::remove_dir(dir) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(LabError::Io {
                    path: dir.clone(),
                    source: e,
                }),
                _ => Ok(()),
            },
        };
        if let Err(e) = removed {
            tracing::warn!(error = %e, "lab: cannot remove an /etc/netns entry");
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        if let Err(e) = self.teardown() {
            tracing::warn!(error = %e, "lab: taking the lab down on drop failed");
        }
    }
}

#[cfg(test)]
mod tests;

/// How a process enters its network namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Enter {
    /// `ip netns exec`: also a mount namespace of its own, with a sysfs of the network
    /// namespace and `/etc/netns/<name>` files over `/etc` (a pod's `resolv.conf`).
    Pod,
    /// `nsenter --net`: the network namespace only. A node's processes (the daemon, the CNI
    /// installer) see the host's mounts as a DaemonSet's containers see theirs, the cgroup file
    /// system included (the daemon reads its memory limit there); `ip netns exec` mounts a
    /// fresh sysfs over `/sys`, which hides it.
    Node,
}
