//! `cni`: the daemon's CNI socket (src/capture/cni.rs), one JSON request per line.
//!
//! The request parse is not a public function, so the target drives the real server: `bind`
//! and `serve` on a socket of its own with a stand-in daemon that accepts every request except
//! for the pod `bad`. Each input is written on a fresh connection, which is then half-closed;
//! the replies are read to the end.
//!
//! Properties, beyond "no panic":
//! - every non-blank line gets exactly one reply line, in order, and nothing else is sent;
//! - each reply parses as a `CniReply`; it is `ok` exactly when the line parses as a
//!   `CniCommand` (serde_json, the server's own parse) naming a pod other than `bad`, and an
//!   error reply says why;
//! - a parsed request serialises and parses back to itself (what `aether cni` sends).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use aether::capture::cni::{CniCommand, CniRefusal, CniReply, CniRequest, bind, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;

use crate::engine::Target;
use crate::outcome;

pub(crate) const TARGET: Target = Target {
    name: "cni",
    max_len: 4096,
    dict: &[
        b"{\"op\":\"add\",",
        b"{\"op\":\"del\",",
        b"\"op\":\"ADD\"",
        b"\"namespace\":\"mp\"",
        b"\"pod\":\"mp-client\"",
        b"\"pod\":\"bad\"",
        b"\"netns\":\"/var/run/netns/mp-client\"",
        b"\"netns\":null",
        b"\"netns\":\"/proc/1/ns/net\"",
        b"\"extra\":1",
        b"\\u0000",
        b"\\ud800",
        b"\\n",
        b"}\n",
        b"\n",
        b"[",
        b"1e999",
        b"true",
        b"null",
    ],
    run,
};

struct Server {
    runtime: Runtime,
    path: PathBuf,
}

fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("a runtime: {e}"));
        let path =
            std::env::temp_dir().join(format!("aether-fuzz-cni-{}.sock", std::process::id()));
        runtime.block_on(async {
            let listener = bind(&path).unwrap_or_else(|e| panic!("bind {}: {e}", path.display()));
            let (tx, mut rx) = mpsc::channel::<CniRequest>(8);
            tokio::spawn(async move {
                while let Some(req) = rx.recv().await {
                    let outcome = match &req.command {
                        CniCommand::Add { pod, .. } | CniCommand::Del { pod, .. }
                            if pod == "bad" =>
                        {
                            Err(CniRefusal::Refused(format!("cannot capture {pod}")))
                        }
                        _ => Ok(()),
                    };
                    let _ = req.reply.send(outcome);
                }
            });
            tokio::spawn(serve(
                listener,
                tx,
                prometheus_client::metrics::counter::Counter::default(),
            ));
        });
        Server { runtime, path }
    })
}

/// The lines the server answers: split at `\n`, the last one unterminated, blank ones skipped.
fn lines(input: &[u8]) -> Vec<&[u8]> {
    input
        .split(|&b| b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .collect()
}

fn run(input: &[u8]) -> u64 {
    let s = server();
    let expected: Vec<Option<CniCommand>> = lines(input)
        .into_iter()
        .map(|l| serde_json::from_slice::<CniCommand>(l).ok())
        .collect();
    for command in expected.iter().flatten() {
        let bytes = serde_json::to_vec(command).unwrap_or_else(|e| panic!("serialise: {e}"));
        let back: CniCommand =
            serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("parse back: {e}"));
        assert_eq!(
            &back,
            command,
            "serialised as {:?}",
            String::from_utf8_lossy(&bytes)
        );
    }
    let replies = s.runtime.block_on(async {
        let exchange = async {
            let mut stream = UnixStream::connect(&s.path).await?;
            stream.write_all(input).await?;
            stream.shutdown().await?;
            let mut out = Vec::new();
            stream.read_to_end(&mut out).await?;
            Ok::<_, std::io::Error>(out)
        };
        tokio::time::timeout(Duration::from_secs(10), exchange).await
    });
    let replies = match replies {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => panic!("the connection failed: {e}"),
        Err(_) => panic!("no end of replies within 10 s"),
    };
    let replies: Vec<&[u8]> = replies
        .strip_suffix(b"\n")
        .map(|r| r.split(|&b| b == b'\n').collect())
        .unwrap_or_default();
    assert_eq!(
        replies.len(),
        expected.len(),
        "{} request lines, {} replies: {:?}",
        expected.len(),
        replies.len(),
        replies
            .iter()
            .map(|r| String::from_utf8_lossy(r))
            .collect::<Vec<_>>()
    );
    let mut sig = Vec::new();
    for (reply, command) in replies.iter().zip(&expected) {
        let reply: CniReply = serde_json::from_slice(reply)
            .unwrap_or_else(|e| panic!("a reply that is not a reply ({e}): {reply:?}"));
        let bad = matches!(command, Some(CniCommand::Add { pod, .. } | CniCommand::Del { pod, .. }) if pod == "bad");
        assert_eq!(
            reply.ok,
            command.is_some() && !bad,
            "{reply:?} to {command:?}"
        );
        assert_eq!(reply.ok, reply.error.is_none(), "{reply:?}");
        sig.push(reply.error.map(|e| e.chars().take(24).collect::<String>()));
    }
    outcome(&sig)
}
