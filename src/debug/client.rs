//! The `aether debug` client: one request to the daemon's admin socket per command, the answer
//! printed as a table, JSON or YAML. What it prints is returned to `main.rs`, which writes it.
//!
//! Errors name what to do: no socket (the daemon is not running, or `--state-dir` is not
//! its), a refused connection (a socket a stopped daemon left), no permission (the socket is
//! root's), an answer of the daemon's own (an unknown pod or service, a malformed question).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::ExplainRequest;
use crate::explain::{Explanation, render_table};

/// How answers are printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns for people.
    #[default]
    Table,
    /// The daemon's JSON, pretty-printed.
    Json,
    /// The same as YAML.
    Yaml,
}

/// `aether debug`'s arguments.
#[derive(Debug, clap::Args)]
pub struct DebugArgs {
    /// The daemon's state directory, where its admin socket `admin.sock` is.
    #[arg(
        long,
        env = "AETHER_STATE_DIR",
        default_value = "/var/run/aether",
        global = true
    )]
    pub state_dir: PathBuf,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table", global = true)]
    pub output: Output,
    /// What to show.
    #[command(subcommand)]
    pub command: DebugCommand,
}

/// One `aether debug` command.
#[derive(Debug, clap::Subcommand)]
pub enum DebugCommand {
    /// The pods this node serves: capture mode, listeners, identity.
    Pods,
    /// The mesh services of the live model: ports with class and votes, endpoints, retained
    /// entries, routes. NAME is `<name>` or `<namespace>/<name>`.
    Services {
        /// One service.
        name: Option<String>,
    },
    /// `aether explain`, answered by the running daemon's live model.
    Explain(ExplainFlags),
    /// Every route the node holds: its parents and the status the node computes.
    Routes,
    /// What the compiler of the live model refused, dropped or flagged (a row refused, an
    /// address two rows claim, a MeshFilter it cannot read, ...), each with its stable kind.
    Diagnostics,
    /// Everything in one JSON document (for bug reports; no private key). `aether explain
    /// --config-dump FILE` answers from it offline.
    ConfigDump,
    /// The workload certificates: identity, serial, validity, rotation.
    Certs,
    /// Show the log filter, or set it (`LEVEL[,target=LEVEL...]`, e.g. `info,aether::proxy=debug`).
    LogLevel {
        /// The new filter.
        filter: Option<String>,
    },
    /// Show the access log's mode, or set it: `off`, `on` or `sample=N` (one request in N).
    AccessLog {
        /// The new mode.
        mode: Option<String>,
    },
    /// The daemon's metrics whose name contains FILTER, as a table.
    Stats {
        /// A part of the metric name (`refus`, `aether_dns`); all when absent.
        filter: Option<String>,
    },
    /// The nftables table installed in a pod's network namespace, as installed.
    Capture {
        /// The pod, `<namespace>/<name>`.
        pod: String,
    },
}

/// The question flags `aether explain` and `aether debug explain` share.
#[derive(Debug, Clone, clap::Args)]
pub struct ExplainFlags {
    /// The calling pod, `<namespace>/<pod>`.
    #[arg(long)]
    pub from: String,
    /// What the client dials: `<name-or-ip>:<port>` (`127.0.0.1:18081` is the loopback proxy).
    #[arg(long)]
    pub dial: String,
    /// A `Host` field to send (repeat for several; default: the dialled name and port, the
    /// port left out for 80). An empty value sends no Host field.
    #[arg(long)]
    pub host: Vec<String>,
    /// Send the request in absolute form (`GET http://<authority>/path`), as an http_proxy does.
    #[arg(long)]
    pub absolute: Option<String>,
    /// The request path (and query).
    #[arg(long, default_value = "/")]
    pub path: String,
    /// The request method.
    #[arg(long, default_value = "GET")]
    pub method: String,
    /// A request header, `name:value` (repeatable).
    #[arg(long = "header")]
    pub headers: Vec<String>,
    /// What the client sends first: `http`, `http1.0`, `h2c`, `tls:<sni>`, `raw`, `none`; or `udp`
    /// (one datagram).
    #[arg(long, default_value = "http")]
    pub bytes: String,
    /// Entropy for the weighted choice of a route backend (vary it to see each share).
    #[arg(long, default_value_t = 0)]
    pub entropy: u64,
}

impl ExplainFlags {
    /// The request these flags ask.
    pub fn request(&self) -> ExplainRequest {
        ExplainRequest {
            from: self.from.clone(),
            dial: self.dial.clone(),
            host: self.host.clone(),
            absolute: self.absolute.clone(),
            path: Some(self.path.clone()),
            method: Some(self.method.clone()),
            headers: self.headers.clone(),
            bytes: Some(self.bytes.clone()),
            entropy: self.entropy,
        }
    }
}

/// Why a debug command got no answer.
#[derive(Debug, thiserror::Error)]
pub enum DebugError {
    /// No socket at the path.
    #[error(
        "the daemon is not running: no admin socket at {0} (is --state-dir, or AETHER_STATE_DIR, the daemon's state directory?)"
    )]
    NoSocket(PathBuf),
    /// A socket, with nobody listening.
    #[error(
        "the daemon is not running: {0} refuses connections (a socket left by a daemon that stopped)"
    )]
    Refused(PathBuf),
    /// Not allowed to connect.
    #[error(
        "permission denied on {0}: the admin socket is root's (run as root; in Kubernetes, through `kubectl exec -n <namespace> ds/aether -- aether debug ...`)"
    )]
    Permission(PathBuf),
    /// Another failure talking to the socket.
    #[error("talking to {path}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error("talking to {path}: {detail}")]
    Protocol {
        /// The socket.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// No answer in time.
    #[error("{0} did not answer within {1:?}")]
    Timeout(PathBuf, Duration),
    /// The daemon answered with an error of its own.
    #[error("{message}")]
    Daemon {
        /// The HTTP status.
        status: u16,
        /// The daemon's text.
        message: String,
    },
    /// The answer is not what this command expects.
    #[error("the daemon's answer does not read: {0}")]
    Answer(String),
    /// An argument of the command is wrong.
    #[error("{0}")]
    Usage(String),
}

/// How long one request may take (a capture listing is bounded by the daemon itself).
const CALL_BOUND: Duration = Duration::from_secs(30);

/// One HTTP/1.1 request to the admin socket at `socket`; the status and body.
pub async fn call(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<(u16, Bytes), DebugError> {
    tokio::time::timeout(CALL_BOUND, call_unbounded(socket, method, path, body))
        .await
        .map_err(|_| DebugError::Timeout(socket.to_path_buf(), CALL_BOUND))?
}

async fn call_unbounded(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<(u16, Bytes), DebugError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => DebugError::NoSocket(socket.to_path_buf()),
            std::io::ErrorKind::ConnectionRefused => DebugError::Refused(socket.to_path_buf()),
            std::io::ErrorKind::PermissionDenied => DebugError::Permission(socket.to_path_buf()),
            _ => DebugError::Io {
                path: socket.to_path_buf(),
                source: e,
            },
        })?;
    let protocol = |e: hyper::Error| DebugError::Protocol {
        path: socket.to_path_buf(),
        detail: e.to_string(),
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(protocol)?;
    tokio::spawn(conn);
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, "admin")
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| DebugError::Usage(format!("{path}: {e}")))?;
    let response = sender.send_request(request).await.map_err(protocol)?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(protocol)?
        .to_bytes();
    Ok((status, body))
}

/// What a command prints: its output, and notes for stderr (a daemon not ready).
#[derive(Debug, Default)]
pub struct Printed {
    /// For stdout.
    pub out: String,
    /// For stderr.
    pub notes: Vec<String>,
}

/// A JSON answer of the daemon; an error answer becomes [`DebugError::Daemon`].
async fn json_call(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<Value, DebugError> {
    let (status, body) = call(socket, method, path, body).await?;
    let value: Option<Value> = serde_json::from_slice(&body).ok();
    if status != 200 {
        let message = value
            .as_ref()
            .and_then(|v| v["error"].as_str())
            .map_or_else(
                || String::from_utf8_lossy(&body).trim().to_owned(),
                str::to_owned,
            );
        let mut message = format!("the daemon answered {status}: {message}");
        if value.as_ref().and_then(|v| v["ready"].as_bool()) == Some(false) {
            message.push_str(" (and it is not ready)");
        }
        return Err(DebugError::Daemon { status, message });
    }
    value.ok_or_else(|| DebugError::Answer(String::from_utf8_lossy(&body).into_owned()))
}

/// The note for an answer from a daemon that is not ready: which pods it could not serve,
/// when the answer says (`aether debug pods`).
fn readiness(v: &Value) -> Vec<String> {
    let node = v["node"].as_str().unwrap_or("?");
    let stale = stale_kinds(v);
    let mut notes = Vec::new();
    if !stale.is_empty() {
        notes.push(format!(
            "warning: the daemon of node {node} is degraded: the API server refuses to let it read {} (403); it serves its last store of them, and their changes are not seen until it may read them again",
            stale.join(", ")
        ));
    }
    if v["ready"].as_bool() != Some(false) {
        return notes;
    }
    let failed: Vec<String> = v["not_served"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| format!("{}/{}", s(&p["namespace"]), s(&p["pod"])))
        .collect();
    let unlisted: Vec<String> = v["registry"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|k| k["state"] != "forbidden-stale")
        .map(|k| s(&k["detail"]))
        .collect();
    notes.push(if !unlisted.is_empty() {
        format!(
            "warning: the daemon of node {node} is not ready: its registry is not read whole ({}); this is what it holds now",
            unlisted.join("; ")
        )
    } else if failed.is_empty() {
        format!(
            "warning: the daemon of node {node} is not ready (a pod is not served yet, or the registry is not read whole); this is what it holds now"
        )
    } else {
        format!(
            "warning: the daemon of node {node} is not ready: it could not serve {} (the NOT SERVED rows, or `not_served` in -o json, say why); this is what it holds now",
            failed.join(", ")
        )
    });
    notes
}

fn structured(v: &Value, output: Output) -> Result<String, DebugError> {
    match output {
        Output::Yaml => crate::yaml::to_string(v).map_err(|e| DebugError::Answer(e.to_string())),
        _ => serde_json::to_string_pretty(v)
            .map(|s| s + "\n")
            .map_err(|e| DebugError::Answer(e.to_string())),
    }
}

/// Run one `aether debug` command against the daemon of `args.state_dir`.
pub async fn run(args: &DebugArgs) -> Result<Printed, DebugError> {
    let socket = args.state_dir.join("admin.sock");
    let socket = socket.as_path();
    let (value, render): (Value, fn(&Value) -> String) = match &args.command {
        DebugCommand::Pods => (json_call(socket, "GET", "/debug/pods", None).await?, pods),
        DebugCommand::Services { name } => {
            let path = match name {
                Some(n) => format!(
                    "/debug/services?{}",
                    form_urlencoded::Serializer::new(String::new())
                        .append_pair("name", n)
                        .finish()
                ),
                None => "/debug/services".into(),
            };
            (json_call(socket, "GET", &path, None).await?, services)
        }
        DebugCommand::Explain(flags) => {
            let request = flags.request();
            // Asked here first: a malformed question is refused before the daemon is called.
            request.question().map_err(DebugError::Usage)?;
            let body =
                serde_json::to_vec(&request).map_err(|e| DebugError::Usage(e.to_string()))?;
            (
                json_call(socket, "POST", "/debug/explain", Some(body)).await?,
                explanation,
            )
        }
        DebugCommand::Routes => (
            json_call(socket, "GET", "/debug/routes", None).await?,
            routes,
        ),
        DebugCommand::Diagnostics => (
            json_call(socket, "GET", "/debug/diagnostics", None).await?,
            diagnostics,
        ),
        DebugCommand::ConfigDump => {
            let v = json_call(socket, "GET", "/config_dump", None).await?;
            // A dump is a document for a file: JSON whatever -o says, unless YAML is asked.
            let out = structured(
                &v,
                if args.output == Output::Yaml {
                    Output::Yaml
                } else {
                    Output::Json
                },
            )?;
            return Ok(Printed {
                notes: readiness(&v),
                out,
            });
        }
        DebugCommand::Certs => (json_call(socket, "GET", "/debug/certs", None).await?, certs),
        DebugCommand::LogLevel { filter } => {
            let v = match filter {
                Some(f) => {
                    json_call(
                        socket,
                        "POST",
                        "/debug/log-level",
                        Some(f.clone().into_bytes()),
                    )
                    .await?
                }
                None => json_call(socket, "GET", "/debug/log-level", None).await?,
            };
            (v, log_level)
        }
        DebugCommand::AccessLog { mode } => {
            let (status, body) = match mode {
                Some(m) => call(socket, "PUT", "/access-log", Some(m.clone().into_bytes())).await?,
                None => call(socket, "GET", "/access-log", None).await?,
            };
            let text = String::from_utf8_lossy(&body).trim().to_owned();
            if status != 200 {
                return Err(DebugError::Daemon {
                    status,
                    message: text,
                });
            }
            (serde_json::json!({ "access_log": text }), access_log)
        }
        DebugCommand::Stats { filter } => {
            let (status, body) = call(socket, "GET", "/metrics", None).await?;
            if status != 200 {
                return Err(DebugError::Daemon {
                    status,
                    message: String::from_utf8_lossy(&body).trim().to_owned(),
                });
            }
            let v = stats(&String::from_utf8_lossy(&body), filter.as_deref());
            (v, stats_table)
        }
        DebugCommand::Capture { pod } => {
            if pod
                .split_once('/')
                .is_none_or(|(n, p)| n.is_empty() || p.is_empty())
            {
                return Err(DebugError::Usage(format!(
                    "capture {pod:?}: name the pod as <namespace>/<name>"
                )));
            }
            let path = format!(
                "/debug/capture?{}",
                form_urlencoded::Serializer::new(String::new())
                    .append_pair("pod", pod)
                    .finish()
            );
            (json_call(socket, "GET", &path, None).await?, capture)
        }
    };
    let out = match args.output {
        Output::Table => render(&value),
        Output::Json | Output::Yaml => structured(&value, args.output)?,
    };
    Ok(Printed {
        notes: readiness(&value),
        out,
    })
}

// === Tables ===

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// Columns padded to their widest cell; the last column is not padded.
fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                let _ = write!(line, "{c:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn header(v: &Value) -> String {
    format!(
        "node {}  generation {}{}{}\n",
        s(&v["node"]),
        s(&v["generation"]),
        if v["ready"].as_bool() == Some(false) {
            "  NOT READY"
        } else {
            ""
        },
        if stale_kinds(v).is_empty() {
            ""
        } else {
            "  DEGRADED"
        }
    )
}

/// The kinds whose last store the daemon serves while the API server refuses it them (403).
fn stale_kinds(v: &Value) -> Vec<String> {
    v["registry"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|k| k["state"] == "forbidden-stale")
        .map(|k| s(&k["kind"]))
        .collect()
}

fn pods(v: &Value) -> String {
    let mut rows = vec![vec![
        "POD".to_owned(),
        "CAPTURE".into(),
        "IDENTITY".into(),
        "LISTENERS".into(),
    ]];
    for p in v["pods"].as_array().into_iter().flatten() {
        let listeners: Vec<String> = p["listeners"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| format!("{} {}", s(&l["kind"]), s(&l["addr"])))
            .collect();
        rows.push(vec![
            format!("{}/{}", s(&p["namespace"]), s(&p["pod"])),
            s(&p["mode"]),
            s(&p["identity"]),
            listeners.join(", "),
        ]);
    }
    let mut out = header(v) + &columns(&rows);
    let failed = v["not_served"].as_array().into_iter().flatten();
    let mut rows = vec![vec!["NOT SERVED".to_owned(), "WHY".into()]];
    rows.extend(failed.map(|p| {
        vec![
            format!("{}/{}", s(&p["namespace"]), s(&p["pod"])),
            s(&p["error"]),
        ]
    }));
    if rows.len() > 1 {
        out.push('\n');
        out.push_str(&columns(&rows));
    }
    out
}

fn services(v: &Value) -> String {
    let mut out = header(v);
    for svc in v["services"].as_array().into_iter().flatten() {
        let ips: Vec<String> = svc["cluster_ips"]
            .as_array()
            .into_iter()
            .flatten()
            .map(s)
            .collect();
        let _ = writeln!(
            out,
            "\n{}/{}  clusterIP {}{}",
            s(&svc["namespace"]),
            s(&svc["name"]),
            if ips.is_empty() {
                "-".to_owned()
            } else {
                ips.join(",")
            },
            if svc["generated"].as_bool() == Some(true) {
                "  (generated)"
            } else {
                ""
            }
        );
        let mut rows = vec![vec![
            "  PORT".to_owned(),
            "CLASS".into(),
            "VOTES".into(),
            "RETAINED SINCE (ms)".into(),
        ]];
        for p in svc["ports"].as_array().into_iter().flatten() {
            let votes: Vec<String> = p["votes"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, n)| format!("{k}={n}"))
                .collect();
            rows.push(vec![
                format!("  {}", s(&p["port"])),
                s(&p["class"]),
                votes.join(" "),
                s(&p["retained_since_ms"]),
            ]);
        }
        out.push_str(&columns(&rows));
        let mut rows = vec![vec![
            "  ENDPOINT".to_owned(),
            "ADDRESS".into(),
            "NODE".into(),
            "READY".into(),
        ]];
        for e in svc["endpoints"].as_array().into_iter().flatten() {
            rows.push(vec![
                format!("  {}", s(&e["pod"])),
                s(&e["address"]),
                s(&e["node"]),
                s(&e["ready"]),
            ]);
        }
        out.push_str(&columns(&rows));
        for r in svc["routes"].as_array().into_iter().flatten() {
            let _ = writeln!(out, "  route {}", s(r));
        }
        for f in svc["filters"].as_array().into_iter().flatten() {
            let _ = writeln!(out, "  filter {}", s(f));
        }
    }
    out
}

fn diagnostics(v: &Value) -> String {
    let mut rows = vec![vec!["KIND".to_owned(), "SUBJECT".into(), "DETAIL".into()]];
    for d in v["diagnostics"].as_array().into_iter().flatten() {
        rows.push(vec![s(&d["kind"]), s(&d["subject"]), s(&d["detail"])]);
    }
    header(v) + &columns(&rows)
}

fn explanation(v: &Value) -> String {
    match serde_json::from_value::<Explanation>(v["explanation"].clone()) {
        Ok(e) => header(v) + &render_table(&e),
        Err(e) => format!("{}the explanation does not read: {e}\n", header(v)),
    }
}

fn routes(v: &Value) -> String {
    let mut rows = vec![vec![
        "ROUTE".to_owned(),
        "PARENT".into(),
        "ACCEPTED".into(),
        "RESOLVED REFS".into(),
        "WHY".into(),
    ]];
    for r in v["routes"].as_array().into_iter().flatten() {
        let name = format!("{} {}/{}", s(&r["kind"]), s(&r["namespace"]), s(&r["name"]));
        let status = r["status"].as_array().cloned().unwrap_or_default();
        if status.is_empty() {
            for p in r["parents"].as_array().into_iter().flatten() {
                rows.push(vec![
                    name.clone(),
                    s(p),
                    "-".into(),
                    "-".into(),
                    "no status: the parent is not a mesh service of this model".into(),
                ]);
            }
        }
        for st in status {
            let conds = st["conditions"].as_array().cloned().unwrap_or_default();
            let of = |t: &str| {
                conds
                    .iter()
                    .find(|c| c["type"] == t)
                    .map_or("-".to_owned(), |c| {
                        format!("{} {}", s(&c["status"]), s(&c["reason"]))
                    })
            };
            let why: Vec<String> = conds
                .iter()
                .filter(|c| c["status"] != "True")
                .map(|c| s(&c["message"]))
                .collect();
            rows.push(vec![
                name.clone(),
                s(&st["parent"]),
                of("Accepted"),
                of("ResolvedRefs"),
                why.join("; "),
            ]);
        }
    }
    header(v) + &columns(&rows)
}

fn certs(v: &Value) -> String {
    let mut rows = vec![vec![
        "IDENTITY".to_owned(),
        "SERIAL".into(),
        "NOT BEFORE".into(),
        "NOT AFTER".into(),
        "ROTATES AT".into(),
    ]];
    for c in v["certs"].as_array().into_iter().flatten() {
        rows.push(vec![
            s(&c["identity"]),
            s(&c["serial"]),
            s(&c["not_before"]),
            s(&c["not_after"]),
            s(&c["rotates_at"]),
        ]);
    }
    header(v) + &columns(&rows)
}

fn access_log(v: &Value) -> String {
    format!("access log: {}\n", s(&v["access_log"]))
}

fn log_level(v: &Value) -> String {
    match v.get("previous") {
        Some(p) => format!(
            "node {}: log filter {} (was {})\n",
            s(&v["node"]),
            s(&v["filter"]),
            s(p)
        ),
        None => format!("node {}: log filter {}\n", s(&v["node"]), s(&v["filter"])),
    }
}

/// The samples of a Prometheus text exposition whose metric name contains `filter`, as
/// `{"metrics": [{"name", "labels", "value"}]}`.
pub fn stats(text: &str, filter: Option<&str>) -> Value {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        if filter.is_some_and(|f| !name.contains(f)) {
            continue;
        }
        out.push(serde_json::json!({ "name": name, "labels": labels, "value": value }));
    }
    serde_json::json!({ "metrics": out })
}

fn stats_table(v: &Value) -> String {
    let mut rows = vec![vec!["METRIC".to_owned(), "LABELS".into(), "VALUE".into()]];
    for m in v["metrics"].as_array().into_iter().flatten() {
        rows.push(vec![s(&m["name"]), s(&m["labels"]), s(&m["value"])]);
    }
    columns(&rows)
}

fn capture(v: &Value) -> String {
    match v["table"].as_str() {
        Some(t) => format!(
            "node {}  pod {}  netns {}\n{t}",
            s(&v["node"]),
            s(&v["pod"]),
            s(&v["netns"])
        ),
        None => format!(
            "node {}  pod {}: no aether table is installed in {}\n",
            s(&v["node"]),
            s(&v["pod"]),
            s(&v["netns"])
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_keep_the_samples_whose_name_matches_and_tabulate_them() {
        let text = "# HELP aether_dns_answers_total x\n# TYPE aether_dns_answers_total counter\n\
                    aether_dns_answers_total{kind=\"mesh\"} 4\naether_model_generation 7\n";
        let v = stats(text, Some("dns"));
        assert_eq!(
            v["metrics"],
            serde_json::json!([{"name": "aether_dns_answers_total", "labels": "kind=\"mesh\"", "value": "4"}])
        );
        let all = stats(text, None);
        assert_eq!(all["metrics"].as_array().unwrap().len(), 2);
        let table = stats_table(&all);
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("aether_model_generation") && l.ends_with(" 7")),
            "{table}"
        );
    }

    #[test]
    fn a_daemon_that_could_not_serve_a_pod_names_it_with_why() {
        let v = serde_json::json!({
            "node": "node-x", "generation": 1, "ready": false, "pods": [],
            "not_served": [{"namespace": "shop", "pod": "web-0", "error": "open network namespace /var/run/netns/x: No such file or directory (os error 2)"}],
        });
        let table = pods(&v);
        assert!(
            table.starts_with("node node-x  generation 1  NOT READY\n"),
            "{table}"
        );
        assert!(
            table.lines().any(|l| l.starts_with("shop/web-0")
                && l.ends_with("open network namespace /var/run/netns/x: No such file or directory (os error 2)")),
            "{table}"
        );
        let notes = readiness(&v);
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("could not serve shop/web-0"), "{notes:?}");
        // Every pod served, the daemon still not ready (the registry not read whole): no
        // NOT SERVED rows, the general warning.
        let v = serde_json::json!({"node": "node-x", "generation": 1, "ready": false, "pods": [], "not_served": []});
        assert!(!pods(&v).contains("NOT SERVED"));
        assert!(readiness(&v)[0].contains("registry is not read whole"));
    }

    /// A kind refused after its list: every answer's header says DEGRADED and a note names
    /// the kind; a kind not listed yet is named in the not-ready note.
    #[test]
    fn a_degraded_daemon_says_so_and_names_the_kinds() {
        let v = serde_json::json!({
            "node": "node-x", "generation": 4, "ready": true, "pods": [], "not_served": [],
            "registry": [{"kind": "HTTPRoute", "state": "forbidden-stale", "detail": "HTTPRoute: may not be read (403) for 9 s"}],
        });
        assert!(
            pods(&v).starts_with("node node-x  generation 4  DEGRADED\n"),
            "{}",
            pods(&v)
        );
        let notes = readiness(&v);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("degraded") && notes[0].contains("read HTTPRoute (403)"),
            "{notes:?}"
        );
        let v = serde_json::json!({
            "node": "node-x", "generation": 1, "ready": false, "pods": [], "not_served": [],
            "registry": [{"kind": "MeshFilter", "state": "forbidden-unlisted", "detail": "MeshFilter: may not be read (403) and was never listed: no pod is served until it is"}],
        });
        assert!(pods(&v).starts_with("node node-x  generation 1  NOT READY\n"));
        let notes = readiness(&v);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0]
                .contains("not read whole (MeshFilter: may not be read (403) and was never listed"),
            "{notes:?}"
        );
    }

    #[tokio::test]
    async fn no_socket_and_a_dead_socket_say_the_daemon_is_not_running() {
        let dir = std::env::temp_dir().join(format!("aether-debug-client-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let args = |d: &Path| DebugArgs {
            state_dir: d.to_path_buf(),
            output: Output::Table,
            command: DebugCommand::Pods,
        };
        let err = run(&args(&dir.join("none"))).await.unwrap_err();
        assert!(matches!(err, DebugError::NoSocket(_)), "{err}");
        assert!(err.to_string().contains("not running"), "{err}");
        // A socket whose listener is gone refuses.
        let sock = dir.join("admin.sock");
        let _ = std::fs::remove_file(&sock);
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        let err = run(&args(&dir)).await.unwrap_err();
        assert!(matches!(err, DebugError::Refused(_)), "{err}");
        assert!(err.to_string().contains("refuses connections"), "{err}");
        // A malformed question is refused before any socket is tried.
        let explain = DebugArgs {
            state_dir: dir.join("none"),
            output: Output::Json,
            command: DebugCommand::Explain(ExplainFlags {
                from: "mp/mp-client".into(),
                dial: "x:1".into(),
                host: Vec::new(),
                absolute: None,
                path: "/".into(),
                method: "GET".into(),
                headers: vec!["no-colon".into()],
                bytes: "http".into(),
                entropy: 0,
            }),
        };
        let err = run(&explain).await.unwrap_err();
        assert!(matches!(err, DebugError::Usage(_)), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
