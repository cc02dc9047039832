//! nginx and haproxy as single plaintext hops, the references of issue #11: installed when
//! missing (as root, with `apt-get`), configured from a file generated in the run directory,
//! started in the direct client's namespace (listening on its loopback, proxying to the server
//! pods' IPs with kept upstream connections), and stopped by PID.
//!
//! Each gets one worker (nginx: `worker_processes 1`, haproxy: `nbthread 1`), as an aether
//! daemon runs on one thread by default ([`WORKERS`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The workers each reference proxy gets: one, as an aether daemon runs on one thread by
/// default (`worker_threads`).
pub(crate) const WORKERS: usize = 1;
/// nginx's stream module (raw TCP), a separate package on Debian (`libnginx-mod-stream`).
const NGINX_STREAM: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// Where a proxy listens, per kind of load (on the client namespace's loopback).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ports {
    pub(crate) http: u16,
    pub(crate) h2c: u16,
    pub(crate) grpc: u16,
    /// `None`: this proxy cannot relay raw TCP here.
    pub(crate) tcp: Option<u16>,
}

/// The server pods the proxies forward to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Upstreams {
    pub(crate) http: SocketAddr,
    pub(crate) grpc: SocketAddr,
    pub(crate) tcp: SocketAddr,
}

/// A running reference proxy; stopped (by its PID) when dropped.
pub(crate) struct Proxy {
    pub(crate) name: &'static str,
    pub(crate) ports: Ports,
    child: Child,
}

impl Proxy {
    /// The proxy's processes: the one started and its children (nginx's workers).
    pub(crate) fn pids(&self) -> Vec<u32> {
        let me = self.child.id();
        let mut pids = vec![me];
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return pids;
        };
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // Field 4, the parent, after the parenthesised command.
            let parent = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if parent == Some(me) {
                pids.push(pid);
            }
        }
        pids
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX));
        let _ = kill(pid, Signal::SIGTERM);
        for _ in 0..50 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn on_path(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Installs Debian's `packages` unless `ready` already holds; `Err` says why not.
fn install(ready: &dyn Fn() -> bool, packages: &[&str]) -> Result<(), String> {
    if ready() {
        return Ok(());
    }
    println!("installing {} (apt-get)", packages.join(" "));
    let out = Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .map_err(|e| format!("apt-get: {e}"))?;
    if !out.status.success() || !ready() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "apt-get install {} failed: {}",
            packages.join(" "),
            err.lines().last().unwrap_or("")
        ));
    }
    Ok(())
}

/// nginx (with its stream module when it can be had), started; `Err` says why not.
pub(crate) fn nginx(
    run_dir: &Path,
    netns: &str,
    ports: Ports,
    up: Upstreams,
) -> Result<Proxy, String> {
    install(&|| on_path("nginx"), &["nginx-light"])?;
    let stream = install(
        &|| Path::new(NGINX_STREAM).exists(),
        &["libnginx-mod-stream"],
    );
    if let Err(why) = &stream {
        println!("nginx: no raw TCP figure: {why}");
    }
    let ports = Ports {
        tcp: ports.tcp.filter(|_| stream.is_ok()),
        ..ports
    };
    let dir = run_dir.join("nginx");
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).map_err(|e| format!("create {}: {e}", tmp.display()))?;
    let d = dir.display();
    let t = tmp.display();
    let keep = "keepalive 64; keepalive_requests 100000000;";
    let mut conf = format!(
        "daemon off;\nworker_processes {WORKERS};\n\
         pid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n"
    );
    if ports.tcp.is_some() {
        conf += &format!("load_module {NGINX_STREAM};\n");
    }
    conf += &format!(
        "events {{ worker_connections 8192; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 100000000;\n  keepalive_timeout 300s;\n\
         \x20 client_body_temp_path {t}/body; proxy_temp_path {t}/proxy;\n\
         \x20 fastcgi_temp_path {t}/fastcgi; uwsgi_temp_path {t}/uwsgi; scgi_temp_path {t}/scgi;\n\
         \x20 upstream echo {{ server {http}; {keep} }}\n\
         \x20 upstream grpc_echo {{ server {grpc}; {keep} }}\n\
         \x20 server {{ listen 127.0.0.1:{ph}; location / {{ proxy_pass http://echo; \
         proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_set_header Host $host; }} }}\n\
         \x20 server {{ listen 127.0.0.1:{p2} http2; location / {{ proxy_pass http://echo; \
         proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_set_header Host $host; }} }}\n\
         \x20 server {{ listen 127.0.0.1:{pg} http2; location / {{ grpc_pass grpc://grpc_echo; }} }}\n\
         }}\n",
        http = up.http,
        grpc = up.grpc,
        ph = ports.http,
        p2 = ports.h2c,
        pg = ports.grpc,
    );
    if let Some(p) = ports.tcp {
        conf += &format!(
            "stream {{ server {{ listen 127.0.0.1:{p}; proxy_pass {}; }} }}\n",
            up.tcp
        );
    }
    let file = dir.join("nginx.conf");
    std::fs::write(&file, conf).map_err(|e| format!("write {}: {e}", file.display()))?;
    let argv = [
        "nginx",
        "-c",
        &file.to_string_lossy(),
        "-p",
        &dir.to_string_lossy(),
    ];
    start("nginx", netns, &argv, &dir, ports).map_err(|e| format!("{e:#}"))
}

/// haproxy, started; `Err` says why not.
pub(crate) fn haproxy(
    run_dir: &Path,
    netns: &str,
    ports: Ports,
    up: Upstreams,
) -> Result<Proxy, String> {
    install(&|| on_path("haproxy"), &["haproxy"])?;
    let dir = run_dir.join("haproxy");
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let mut conf = format!(
        "global\n  nbthread {WORKERS}\n  maxconn 8000\n\
         defaults\n  mode http\n  timeout connect 5s\n  timeout client 300s\n  timeout server 300s\n\
         \x20 http-reuse always\n\
         frontend http\n  bind 127.0.0.1:{}\n  default_backend echo\n\
         frontend h2c\n  bind 127.0.0.1:{} proto h2\n  default_backend echo\n\
         frontend grpc\n  bind 127.0.0.1:{} proto h2\n  default_backend grpc\n\
         backend echo\n  server echo {}\n\
         backend grpc\n  server grpc {} proto h2\n",
        ports.http, ports.h2c, ports.grpc, up.http, up.grpc
    );
    if let Some(p) = ports.tcp {
        conf += &format!(
            "listen tcp\n  mode tcp\n  bind 127.0.0.1:{p}\n  server echo {}\n",
            up.tcp
        );
    }
    let file = dir.join("haproxy.cfg");
    std::fs::write(&file, conf).map_err(|e| format!("write {}: {e}", file.display()))?;
    let argv = ["haproxy", "-db", "-f", &file.to_string_lossy()];
    start("haproxy", netns, &argv, &dir, ports).map_err(|e| format!("{e:#}"))
}

/// Starts `argv` in the named namespace (`ip netns exec` execs it: the PID is the proxy's),
/// its output to `<dir>/out.log`, and waits until its HTTP port accepts.
fn start(
    name: &'static str,
    netns: &str,
    argv: &[&str],
    dir: &Path,
    ports: Ports,
) -> Result<Proxy> {
    let log = dir.join("out.log");
    let out = std::fs::File::create(&log)?;
    let child = Command::new("ip")
        .args(["netns", "exec", netns])
        .args(argv)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("start {name}"))?;
    let mut proxy = Proxy { name, ports, child };
    for _ in 0..50 {
        if let Some(status) = proxy.child.try_wait()? {
            bail!("{name} exited ({status}): see {}", log.display());
        }
        if listening(netns, ports.http) {
            return Ok(proxy);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "{name} not listening on 127.0.0.1:{} after 5 s: see {}",
        ports.http,
        log.display()
    )
}

/// Whether something in namespace `netns` listens on TCP `127.0.0.1:port`.
fn listening(netns: &str, port: u16) -> bool {
    let path = PathBuf::from("/run/netns").join(netns);
    let Ok(out) = Command::new("nsenter")
        .arg(format!("--net={}", path.display()))
        .args(["ss", "-Hltn", &format!("sport = :{port}")])
        .output()
    else {
        return false;
    };
    !String::from_utf8_lossy(&out.stdout).trim().is_empty()
}
