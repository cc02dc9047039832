//! A real etcd for the lab, the demo and the tests (Debian's `etcd-server`, v3 API): one member,
//! or three on their own ports, each with its data directory under the run's directory, stopped
//! (and its directory removed by the caller) when dropped.
//!
//! Members listen on 127.0.0.1 by default; the lab passes the address its daemons reach (the
//! underlay's host side), since the daemons run in their own network namespaces.

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The program this module runs.
pub const ETCD: &str = "etcd";

/// The daemons' lease TTL in the lab (the default): a killed daemon's rows leave within it (leg
/// EKILL). It must outlast the daemons' longest reconnection wait (5 s): after an outage etcd
/// gives every lease its whole TTL again, and a daemon renews at its next attempt.
pub const LAB_LEASE_TTL_SECS: u64 = 10;

/// Why etcd could not be started.
#[derive(Debug, thiserror::Error)]
pub enum EtcdServerError {
    /// `etcd` is not installed.
    #[error("`etcd` is not installed (Debian: apt-get install etcd-server)")]
    Missing,
    /// A port or directory could not be had, or the process not started.
    #[error("cannot start etcd member {member}")]
    Start {
        /// The member's name.
        member: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It did not answer in time.
    #[error("etcd member {member} did not answer on {url} within {after:?}; its log: {log}")]
    NotReady {
        /// The member's name.
        member: String,
        /// Its client URL.
        url: String,
        /// How long it was given.
        after: Duration,
        /// Its log file.
        log: String,
    },
}

/// One member.
#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A running etcd: one or more members.
#[derive(Debug)]
pub struct EtcdServer {
    dir: PathBuf,
    host: IpAddr,
    members: Vec<Member>,
}

/// Whether `etcd` can be run here.
pub fn installed() -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|d| d.join(ETCD).is_file())
}

fn free_port(host: IpAddr) -> std::io::Result<u16> {
    Ok(TcpListener::bind((host, 0))?.local_addr()?.port())
}

impl EtcdServer {
    /// Starts `members` members (1 or 3) listening on `host` (127.0.0.1 when `None`), with their
    /// data under `dir`, and waits until each answers.
    pub fn start(
        dir: &Path,
        members: usize,
        host: Option<IpAddr>,
    ) -> Result<Self, EtcdServerError> {
        if !installed() {
            return Err(EtcdServerError::Missing);
        }
        let host = host.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let mut list = Vec::new();
        for i in 0..members {
            let name = format!("m{i}");
            let port = || {
                free_port(host).map_err(|source| EtcdServerError::Start {
                    member: name.clone(),
                    source,
                })
            };
            list.push(Member {
                client_port: port()?,
                peer_port: port()?,
                name: name.clone(),
                child: None,
            });
        }
        let mut server = Self {
            dir: dir.to_owned(),
            host,
            members: list,
        };
        for i in 0..members {
            server.spawn(i)?;
        }
        for i in 0..members {
            server.wait_ready(i, Duration::from_secs(20))?;
        }
        Ok(server)
    }

    fn url(&self, port: u16) -> String {
        match self.host {
            IpAddr::V4(a) => format!("http://{a}:{port}"),
            IpAddr::V6(a) => format!("http://[{a}]:{port}"),
        }
    }

    /// The members' client URLs.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| self.url(m.client_port))
            .collect()
    }

    /// The client URLs of the members running now.
    pub fn running_endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| self.url(m.client_port))
            .collect()
    }

    /// The client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        self.url(self.members[i].client_port)
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether it has no member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    fn spawn(&mut self, i: usize) -> Result<(), EtcdServerError> {
        let cluster: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, self.url(m.peer_port)))
            .collect();
        let m = &self.members[i];
        let data = self.dir.join(&m.name);
        let start = |source| EtcdServerError::Start {
            member: m.name.clone(),
            source,
        };
        std::fs::create_dir_all(&data).map_err(start)?;
        let log = std::fs::File::create(self.dir.join(format!("{}.log", m.name))).map_err(start)?;
        let err = log.try_clone().map_err(start)?;
        let child = Command::new(ETCD)
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&data)
            .arg("--listen-client-urls")
            .arg(self.url(m.client_port))
            .arg("--advertise-client-urls")
            .arg(self.url(m.client_port))
            .arg("--listen-peer-urls")
            .arg(self.url(m.peer_port))
            .arg("--initial-advertise-peer-urls")
            .arg(self.url(m.peer_port))
            .arg("--initial-cluster")
            .arg(cluster.join(","))
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--initial-cluster-token")
            .arg("aether-lab")
            // Quick elections for the fault legs: a leader lost is replaced within a second.
            .arg("--heartbeat-interval")
            .arg("100")
            .arg("--election-timeout")
            .arg("1000")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(start)?;
        self.members[i].child = Some(child);
        Ok(())
    }

    fn wait_ready(&self, i: usize, after: Duration) -> Result<(), EtcdServerError> {
        let m = &self.members[i];
        let until = aether::time::now() + after;
        // The member serves `/health` once it has joined a cluster with a leader.
        while aether::time::now() < until {
            if health(self.host, m.client_port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(EtcdServerError::NotReady {
            member: m.name.clone(),
            url: self.url(m.client_port),
            after,
            log: self
                .dir
                .join(format!("{}.log", m.name))
                .display()
                .to_string(),
        })
    }

    /// Stops member `i` (SIGTERM, then SIGKILL after 5 s), keeping its data.
    pub fn stop(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            stop_child(&mut child, Signal::SIGTERM);
        }
    }

    /// Kills member `i` at once (SIGKILL), keeping its data.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            stop_child(&mut child, Signal::SIGKILL);
        }
    }

    /// Starts member `i` again on its data, and waits until it answers.
    pub fn restart(&mut self, i: usize) -> Result<(), EtcdServerError> {
        self.stop(i);
        // `--initial-cluster-state` is ignored once the data directory holds a member.
        self.spawn(i)?;
        self.wait_ready(i, Duration::from_secs(20))
    }

    /// Stops every member (SIGTERM, then SIGKILL after 5 s each), keeping their data.
    pub fn stop_all(&mut self) {
        for i in 0..self.members.len() {
            self.stop(i);
        }
    }

    /// Starts every stopped member again on its data, then waits until each answers (a member
    /// alone cannot answer before a quorum has a leader, so they start together).
    pub fn start_stopped(&mut self) -> Result<(), EtcdServerError> {
        let stopped: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].child.is_none())
            .collect();
        for &i in &stopped {
            self.spawn(i)?;
        }
        for &i in &stopped {
            self.wait_ready(i, Duration::from_secs(20))?;
        }
        Ok(())
    }

    /// The leader's index: each running member is asked over etcd's JSON gateway
    /// (`/v3/maintenance/status`) whether it leads.
    pub fn leader(&self) -> Option<usize> {
        self.members.iter().position(|m| {
            m.child.is_some()
                && post_json(self.host, m.client_port, "/v3/maintenance/status", "{}").is_some_and(
                    |body| {
                        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                        let leader = v["leader"].as_str().unwrap_or_default().to_owned();
                        let me = v["header"]["member_id"].as_str().unwrap_or_default();
                        !leader.is_empty() && leader == me
                    },
                )
        })
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

fn stop_child(child: &mut Child, signal: Signal) {
    let Ok(pid) = i32::try_from(child.id()) else {
        return;
    };
    let _ = kill(Pid::from_raw(pid), signal);
    let until = aether::time::now() + Duration::from_secs(5);
    while aether::time::now() < until {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// `GET /health` answers `{"health":"true"}`.
fn health(host: IpAddr, port: u16) -> bool {
    http(host, port, "GET /health HTTP/1.0\r\n\r\n").is_some_and(|b| b.contains("\"true\""))
}

fn post_json(host: IpAddr, port: u16, path: &str, body: &str) -> Option<String> {
    let request = format!(
        "POST {path} HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    http(host, port, &request)
}

/// One plain HTTP/1.0 exchange, bounded by a second: the body, or `None`.
fn http(host: IpAddr, port: u16, request: &str) -> Option<String> {
    use std::io::{Read, Write};
    let timeout = Duration::from_secs(1);
    let mut s = std::net::TcpStream::connect_timeout(&(host, port).into(), timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    s.write_all(request.as_bytes()).ok()?;
    let mut out = String::new();
    s.take(1 << 20).read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| body.to_owned())
}

/// A job run on an [`EtcdControl`]'s thread, with its members and its runtime.
type Job = Box<dyn FnOnce(&mut EtcdServer, &tokio::runtime::Runtime) + Send>;

/// An etcd whose members live in another network namespace (the lab's underlay), run by a thread
/// of its own that entered it: the members are started there, and every job (a stop, a restart,
/// a client call on the thread's own runtime) runs there, so its sockets are the namespace's.
/// Dropping it stops the members.
#[derive(Debug)]
pub struct EtcdControl {
    jobs: Option<std::sync::mpsc::Sender<Job>>,
    endpoints: Vec<String>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EtcdControl {
    /// Starts `members` members on `host` inside the namespace `netns` (a name under
    /// `/var/run/netns` or a path), their data and logs under `dir`.
    pub fn start(
        netns: &str,
        dir: &Path,
        members: usize,
        host: IpAddr,
    ) -> Result<Self, EtcdServerError> {
        let start = |source: std::io::Error| EtcdServerError::Start {
            member: "(all)".into(),
            source,
        };
        let there = aether::netns::Netns::named(netns)
            .map_err(|e| start(std::io::Error::other(aether::DisplayChain(&e).to_string())))?;
        let home = aether::netns::Netns::current()
            .map_err(|e| start(std::io::Error::other(aether::DisplayChain(&e).to_string())))?;
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let dir = dir.to_owned();
        let thread = std::thread::Builder::new()
            .name("lab-etcd".into())
            .spawn(move || {
                let entered = there.run(&home, || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(start);
                    let server = runtime.and_then(|rt| {
                        EtcdServer::start(&dir, members, Some(host)).map(|s| (s, rt))
                    });
                    let (mut server, runtime) = match server {
                        Ok(s) => {
                            let _ = ready_tx.send(Ok(s.0.endpoints()));
                            s
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    for job in queue {
                        job(&mut server, &runtime);
                    }
                });
                if let Err(e) = entered {
                    let _ = ready_tx.send(Err(start(std::io::Error::other(
                        aether::DisplayChain(&e).to_string(),
                    ))));
                }
            })
            .map_err(start)?;
        let endpoints = ready_rx
            .recv()
            .map_err(|_| start(std::io::Error::other("the etcd thread ended")))??;
        Ok(Self {
            jobs: Some(jobs),
            endpoints,
            thread: Some(thread),
        })
    }

    /// The members' client URLs.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Runs `f` on the control thread (inside the namespace) and returns what it returned.
    pub async fn with<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut EtcdServer, &tokio::runtime::Runtime) -> R + Send + 'static,
    ) -> Result<R, String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |server, runtime| {
            let _ = tx.send(f(server, runtime));
        });
        self.jobs
            .as_ref()
            .ok_or("the lab's etcd is stopped")?
            .send(job)
            .map_err(|_| "the lab's etcd thread has ended")?;
        rx.await
            .map_err(|_| "the lab's etcd job did not finish".to_owned())
    }

    /// Runs `f` with a client of the running members, on the control thread's runtime. A call
    /// that fails is made again on a new client, for up to 10 s (a member killed a moment ago,
    /// a leader being elected), so `f` must be safe to repeat.
    pub async fn client<R, F>(
        &self,
        f: impl Fn(etcd_client::Client) -> F + Send + 'static,
    ) -> Result<R, String>
    where
        R: Send + 'static,
        F: Future<Output = Result<R, etcd_client::Error>>,
    {
        self.with(move |server, runtime| {
            let endpoints = server.running_endpoints();
            runtime.block_on(async move {
                let until = aether::time::now() + Duration::from_secs(10);
                loop {
                    let options = etcd_client::ConnectOptions::new()
                        .with_connect_timeout(Duration::from_secs(2))
                        .with_timeout(Duration::from_secs(5));
                    let done = match etcd_client::Client::connect(&endpoints, Some(options)).await {
                        Ok(client) => f(client).await,
                        Err(e) => Err(e),
                    };
                    match done {
                        Ok(r) => return Ok(r),
                        Err(e) if aether::time::now() > until => return Err(e),
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
            })
        })
        .await?
        .map_err(|e| format!("etcd: {e}"))
    }
}

impl Drop for EtcdControl {
    fn drop(&mut self) {
        // The thread ends with its queue, dropping the members (which kills them).
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
