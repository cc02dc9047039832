//! The unix-socket API between the `aether cni` entry point (run by the container runtime when
//! a pod's network is set up or torn down) and the daemon.
//!
//! One JSON object per line in each direction. A request is a [`CniCommand`]:
//!
//! ```text
//! {"op":"add","namespace":"mp","pod":"mp-client","netns":"/var/run/netns/mp-client"}
//! {"op":"add","namespace":"mp","pod":"mp-client","netns":"/var/run/netns/mp-client","ips":["10.244.1.5"]}
//! {"op":"check","namespace":"mp","pod":"mp-client"}
//! {"op":"del","namespace":"mp","pod":"mp-client"}
//! ```
//!
//! `ips` (the pod's addresses, from the primary CNI's result) is optional: a request without it
//! is read as it was before the field existed.
//!
//! and its reply, sent once the daemon has handled it, is `{"ok":true}`, `{"ok":false,"error":"..."}`
//! or, when the daemon cannot serve the pod yet and asking again later may succeed,
//! `{"ok":false,"error":"...","try_again":true}` (the CNI plugin answers the runtime error 11 then,
//! [`CniRefusal::TryAgain`]). A line that is not a valid request gets an error reply and the
//! connection stays usable. The server does not program capture itself: it hands each request,
//! with a reply channel, to the daemon's wiring through an `mpsc` channel ([`CniRequest`]).

use std::io;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

use crate::accept::Acceptor;
use prometheus_client::metrics::counter::Counter;

/// The longest request line accepted, in bytes; a longer one closes the connection.
pub const MAX_LINE: u64 = 64 * 1024;

/// What the CNI entry point asks of the daemon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum CniCommand {
    /// The pod's network was set up: program its capture.
    Add {
        /// The pod's Kubernetes namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
        /// Its network namespace (`/var/run/netns/<name>` or `/proc/<pid>/ns/net`).
        netns: PathBuf,
        /// The pod's addresses as the primary CNI assigned them; when given, the daemon
        /// refuses the ADD unless the namespace holds every one of them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        ips: Vec<IpAddr>,
    },
    /// Is the pod served? (CNI CHECK.) Answered ok only when it is, or when the daemon knows
    /// the pod from an ADD and the registry does not ask for it to be served here.
    Check {
        /// The pod's Kubernetes namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
        /// Its network namespace, as the runtime gave it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        netns: Option<PathBuf>,
    },
    /// The pod's network is being torn down.
    Del {
        /// The pod's Kubernetes namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
        /// Its network namespace, when the runtime still knows it (CNI DEL may omit it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        netns: Option<PathBuf>,
    },
}

/// The reply to one request line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniReply {
    /// Whether the request was handled.
    pub ok: bool,
    /// Why not, when `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With `ok` false: the daemon cannot do it yet, and the same request later may succeed
    /// ([`CniRefusal::TryAgain`]). Absent means false, as before the field existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub try_again: bool,
}

impl CniReply {
    fn from_result(r: Result<(), CniRefusal>) -> Self {
        let (error, try_again) = match r {
            Ok(()) => {
                return Self {
                    ok: true,
                    error: None,
                    try_again: false,
                };
            }
            Err(CniRefusal::Refused(e)) => (e, false),
            Err(CniRefusal::TryAgain(e)) => (e, true),
        };
        Self {
            ok: false,
            error: Some(error),
            try_again,
        }
    }
}

/// Why the daemon did not do what a request asked, and whether asking again may succeed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CniRefusal {
    /// It cannot be done as asked (the namespace is gone or not a pod's, the pod could not be
    /// served): the runtime gets CNI error 100 with this reason.
    Refused(String),
    /// Not yet: the daemon's registry is not read whole, or does not hold the pod yet. The
    /// runtime gets CNI error 11 ("try again later") and retries the ADD.
    TryAgain(String),
}

impl From<String> for CniRefusal {
    fn from(reason: String) -> Self {
        Self::Refused(reason)
    }
}

/// One request handed to the daemon: it handles `command`, then answers on `reply` with `Ok` or
/// its refusal (whose text is sent to the caller as is).
#[derive(Debug)]
pub struct CniRequest {
    /// What was asked.
    pub command: CniCommand,
    /// Where the outcome goes.
    pub reply: oneshot::Sender<Result<(), CniRefusal>>,
}

/// A failure of the CNI socket, on either side.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// The socket could not be bound.
    #[error("bind the cni socket {path}")]
    Bind {
        /// The socket's path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The daemon's socket could not be reached.
    #[error("connect to the cni socket {path}")]
    Connect {
        /// The socket's path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Reading or writing the connection failed.
    #[error("talk to the cni socket {path}")]
    Io {
        /// The socket's path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The daemon closed the connection without a reply.
    #[error("the daemon at {path} closed the connection without a reply")]
    NoReply {
        /// The socket's path.
        path: PathBuf,
    },
    /// The daemon's reply was not a reply.
    #[error("the daemon at {path} sent an unreadable reply")]
    BadReply {
        /// The socket's path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The daemon handled the request and refused it.
    #[error("the daemon refused the request: {error}")]
    Refused {
        /// The daemon's reason.
        error: String,
    },
    /// The daemon cannot do it yet; the same request later may succeed.
    #[error("the daemon cannot do it yet: {error}")]
    TryAgain {
        /// The daemon's reason.
        error: String,
    },
}

/// Bind the daemon's CNI socket at `path`, replacing a stale socket file left by an earlier run,
/// readable and writable by its owner only.
pub fn bind(path: &Path) -> Result<UnixListener, CniError> {
    let err = |source| CniError::Bind {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    Ok(listener)
}

/// Serve the CNI API on `listener`, handing requests to `daemon`, until the task is aborted.
/// Each connection is served on its own task. Accept errors (out of descriptors) are waited out
/// with a backoff and counted in `accept_errors` ([`crate::accept`]): the server never exits.
pub async fn serve(
    listener: UnixListener,
    daemon: mpsc::Sender<CniRequest>,
    accept_errors: Counter,
) {
    let mut acceptor = Acceptor::new(listener, "cni", accept_errors);
    loop {
        let (stream, _) = acceptor.accept().await;
        let daemon = daemon.clone();
        tokio::spawn(async move {
            if let Err(error) = serve_connection(stream, daemon).await {
                tracing::debug!(%error, "cni connection ended");
            }
        });
    }
}

/// Read one line of at most [`MAX_LINE`] bytes; `None` at the end of the stream.
async fn read_line<R: AsyncRead + Unpin>(reader: &mut BufReader<R>) -> io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let n = (&mut *reader)
        .take(MAX_LINE)
        .read_until(b'\n', &mut line)
        .await?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') && n as u64 == MAX_LINE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "request line too long",
        ));
    }
    Ok(Some(line))
}

async fn serve_connection(stream: UnixStream, daemon: mpsc::Sender<CniRequest>) -> io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    while let Some(line) = read_line(&mut reader).await? {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let outcome = match serde_json::from_slice::<CniCommand>(&line) {
            Err(e) => Err(CniRefusal::Refused(format!("bad request: {e}"))),
            Ok(command) => handle(command, &daemon).await,
        };
        let mut out = serde_json::to_vec(&CniReply::from_result(outcome))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        out.push(b'\n');
        write.write_all(&out).await?;
    }
    Ok(())
}

async fn handle(command: CniCommand, daemon: &mpsc::Sender<CniRequest>) -> Result<(), CniRefusal> {
    let (reply, outcome) = oneshot::channel();
    if daemon.send(CniRequest { command, reply }).await.is_err() {
        return Err(CniRefusal::Refused(
            "the daemon is shutting down".to_owned(),
        ));
    }
    outcome.await.unwrap_or_else(|_| {
        Err(CniRefusal::Refused(
            "the daemon dropped the request".to_owned(),
        ))
    })
}

/// Send `command` to the daemon's CNI socket at `path` and wait for its reply. The caller
/// bounds the wait (for example with `tokio::time::timeout`).
pub async fn send(path: &Path, command: &CniCommand) -> Result<(), CniError> {
    let stream = UnixStream::connect(path)
        .await
        .map_err(|source| CniError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
    let io_err = |source| CniError::Io {
        path: path.to_path_buf(),
        source,
    };
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_vec(command)
        .map_err(|e| io_err(io::Error::new(io::ErrorKind::InvalidData, e)))?;
    line.push(b'\n');
    write.write_all(&line).await.map_err(io_err)?;
    let mut reader = BufReader::new(read);
    let reply = read_line(&mut reader)
        .await
        .map_err(io_err)?
        .ok_or_else(|| CniError::NoReply {
            path: path.to_path_buf(),
        })?;
    let reply: CniReply = serde_json::from_slice(&reply).map_err(|source| CniError::BadReply {
        path: path.to_path_buf(),
        source,
    })?;
    match reply {
        CniReply { ok: true, .. } => Ok(()),
        CniReply {
            error,
            try_again: true,
            ..
        } => Err(CniError::TryAgain {
            error: error.unwrap_or_default(),
        }),
        CniReply { error, .. } => Err(CniError::Refused {
            error: error.unwrap_or_default(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket_path(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "aether-cni-{tag}-{}-{}.sock",
            std::process::id(),
            fastrand::u64(..)
        ))
    }

    /// A daemon stand-in: refuses pods named `bad`, accepts the rest, and reports what it saw.
    fn fake_daemon() -> (
        mpsc::Sender<CniRequest>,
        mpsc::UnboundedReceiver<CniCommand>,
    ) {
        let (tx, mut rx) = mpsc::channel::<CniRequest>(8);
        let (seen_tx, seen) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(req) = rx.recv().await {
                let outcome = match &req.command {
                    CniCommand::Add { pod, .. } | CniCommand::Del { pod, .. } if pod == "bad" => {
                        Err(CniRefusal::Refused(format!("cannot capture {pod}")))
                    }
                    CniCommand::Add { pod, .. } if pod == "later" => {
                        Err(CniRefusal::TryAgain(format!("{pod} is not known yet")))
                    }
                    _ => Ok(()),
                };
                let _ = seen_tx.send(req.command);
                let _ = req.reply.send(outcome);
            }
        });
        (tx, seen)
    }

    #[tokio::test]
    async fn add_and_del_round_trip_through_the_socket() {
        let path = socket_path("rt");
        let listener = bind(&path).unwrap();
        let (tx, mut seen) = fake_daemon();
        let server = tokio::spawn(serve(listener, tx, Counter::default()));

        let add = CniCommand::Add {
            namespace: "mp".into(),
            pod: "mp-client".into(),
            netns: "/var/run/netns/mp-client".into(),
            ips: vec!["10.244.1.5".parse().unwrap()],
        };
        send(&path, &add).await.unwrap();
        assert_eq!(seen.recv().await.unwrap(), add);

        let del = CniCommand::Del {
            namespace: "mp".into(),
            pod: "mp-client".into(),
            netns: None,
        };
        send(&path, &del).await.unwrap();
        assert_eq!(seen.recv().await.unwrap(), del);

        let bad = CniCommand::Add {
            namespace: "mp".into(),
            pod: "bad".into(),
            netns: "/proc/1/ns/net".into(),
            ips: Vec::new(),
        };
        match send(&path, &bad).await {
            Err(CniError::Refused { error }) => assert_eq!(error, "cannot capture bad"),
            other => panic!("expected a refusal, got {other:?}"),
        }

        let later = CniCommand::Add {
            namespace: "mp".into(),
            pod: "later".into(),
            netns: "/proc/1/ns/net".into(),
            ips: Vec::new(),
        };
        match send(&path, &later).await {
            Err(CniError::TryAgain { error }) => assert_eq!(error, "later is not known yet"),
            other => panic!("expected try-again, got {other:?}"),
        }

        server.abort();
        let _ = std::fs::remove_file(&path);
    }

    #[tokio::test]
    async fn the_wire_format_is_one_json_object_per_line_and_bad_json_keeps_the_connection() {
        let path = socket_path("wire");
        let listener = bind(&path).unwrap();
        let (tx, mut seen) = fake_daemon();
        let server = tokio::spawn(serve(listener, tx, Counter::default()));

        let stream = UnixStream::connect(&path).await.unwrap();
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();

        write.write_all(b"{not json\n").await.unwrap();
        let reply: serde_json::Value =
            serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(reply["ok"], false);
        assert!(reply["error"].as_str().unwrap().starts_with("bad request"));

        write
            .write_all(b"{\"op\":\"frobnicate\",\"namespace\":\"mp\",\"pod\":\"x\"}\n")
            .await
            .unwrap();
        let reply: serde_json::Value =
            serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(reply["ok"], false);

        // The same connection still works, in the exact format of the brief.
        write
            .write_all(
                b"{\"op\":\"add\",\"namespace\":\"mp\",\"pod\":\"mp-client\",\"netns\":\"/var/run/netns/mp-client\"}\n",
            )
            .await
            .unwrap();
        assert_eq!(lines.next_line().await.unwrap().unwrap(), r#"{"ok":true}"#);
        assert_eq!(
            seen.recv().await.unwrap(),
            CniCommand::Add {
                namespace: "mp".into(),
                pod: "mp-client".into(),
                netns: "/var/run/netns/mp-client".into(),
                ips: Vec::new(),
            }
        );

        write
            .write_all(b"{\"op\":\"del\",\"namespace\":\"mp\",\"pod\":\"bad\"}\n")
            .await
            .unwrap();
        assert_eq!(
            lines.next_line().await.unwrap().unwrap(),
            r#"{"ok":false,"error":"cannot capture bad"}"#
        );

        write
            .write_all(
                b"{\"op\":\"add\",\"namespace\":\"mp\",\"pod\":\"later\",\"netns\":\"/x\"}\n",
            )
            .await
            .unwrap();
        assert_eq!(
            lines.next_line().await.unwrap().unwrap(),
            r#"{"ok":false,"error":"later is not known yet","try_again":true}"#
        );

        server.abort();
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn the_cni_socket_answers_again_after_the_process_ran_out_of_descriptors() {
        use crate::test_util::fds;
        use socket2::{Domain, SockAddr, Socket, Type};
        if !fds::in_child(concat!(
            module_path!(),
            "::the_cni_socket_answers_again_after_the_process_ran_out_of_descriptors"
        )) {
            return;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let path = socket_path("emfile");
            let listener = bind(&path).unwrap();
            let (tx, mut seen) = fake_daemon();
            let _server = tokio::spawn(serve(listener, tx, Counter::default()));
            // The client's socket exists before the descriptors run out; its connection then
            // waits in the backlog, which the server cannot take it from.
            let client = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
            let exhausted = fds::exhaust();
            client.connect(&SockAddr::unix(&path).unwrap()).unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            drop(exhausted);
            client.set_nonblocking(true).unwrap();
            let stream = UnixStream::from_std(std::os::unix::net::UnixStream::from(
                std::os::fd::OwnedFd::from(client),
            ))
            .unwrap();
            let (read, mut write) = stream.into_split();
            let line = b"{\"op\":\"del\",\"namespace\":\"mp\",\"pod\":\"p\"}\n";
            let wrote = write.write_all(line).await;
            let mut lines = BufReader::new(read).lines();
            let reply = match wrote {
                Ok(()) => {
                    tokio::time::timeout(std::time::Duration::from_secs(5), lines.next_line())
                        .await
                        .map_or_else(|_| "no reply within 5 s".to_owned(), |r| format!("{r:?}"))
                }
                Err(e) => format!("write: {e}"),
            };
            assert_eq!(
                reply,
                format!(
                    "{:?}",
                    Ok::<_, io::Error>(Some(r#"{"ok":true}"#.to_owned()))
                ),
                "the CNI socket no longer answers once descriptors are free again"
            );
            assert!(matches!(seen.recv().await, Some(CniCommand::Del { .. })));
            let _ = std::fs::remove_file(&path);
        });
    }

    #[tokio::test]
    async fn a_closed_daemon_is_an_error_reply_and_a_missing_socket_a_connect_error() {
        let path = socket_path("closed");
        let listener = bind(&path).unwrap();
        let (tx, rx) = mpsc::channel::<CniRequest>(1);
        drop(rx);
        let server = tokio::spawn(serve(listener, tx, Counter::default()));
        let del = CniCommand::Del {
            namespace: "mp".into(),
            pod: "p".into(),
            netns: None,
        };
        match send(&path, &del).await {
            Err(CniError::Refused { error }) => assert!(error.contains("shutting down"), "{error}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        server.abort();
        let _ = std::fs::remove_file(&path);

        match send(&path, &del).await {
            Err(CniError::Connect { .. }) => {}
            other => panic!("expected a connect error, got {other:?}"),
        }
    }
}
