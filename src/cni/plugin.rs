//! The IO of `aether cni`: read the CNI environment and a bounded stdin, ask the daemon when
//! [`protocol::plan`] says so, and hand back the [`Output`] for `main` to print. Every read has
//! a bound: stdin in size ([`protocol::MAX_STDIN`]) and in time ([`STDIN_TIMEOUT`]), the daemon
//! in time (`timeoutSecs`).

use std::time::Duration;

use tokio::io::AsyncReadExt as _;

use super::protocol::{self, Ask, AskError, CniEnv, Output, Plan};
use crate::capture::cni::{self, CniError};

/// How long the runtime has to write the configuration and close stdin.
pub const STDIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long VERSION waits for the runtime to close stdin before it answers anyway.
const VERSION_STDIN_WAIT: Duration = Duration::from_secs(1);

/// Run one invocation with the process's environment and stdin.
pub fn run() -> Output {
    let env = CniEnv::from_lookup(|k| std::env::var(k).ok());
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return protocol::finish(
                &io_ask(),
                Err(AskError::Io(format!("start the runtime: {e}"))),
            );
        }
    };
    let out = runtime.block_on(async {
        // VERSION needs no configuration and a runtime may send none; what it sends (libcni
        // sends `{"cniVersion": …}`) is still read, briefly, so that its write does not fail on
        // a closed pipe when the plugin exits first.
        let stdin = if env.command.as_deref() == Some("VERSION") {
            let mut sink = Vec::new();
            let mut stdin = tokio::io::stdin().take(protocol::MAX_STDIN as u64);
            let _ = tokio::time::timeout(VERSION_STDIN_WAIT, stdin.read_to_end(&mut sink)).await;
            Vec::new()
        } else {
            match read_stdin().await {
                Ok(bytes) => bytes,
                Err(why) => {
                    return protocol::finish(&io_ask(), Err(AskError::Io(why)));
                }
            }
        };
        match protocol::plan(&env, &stdin) {
            Plan::Done(out) => out,
            Plan::Ask(ask) => {
                let outcome = ask_daemon(&ask).await;
                protocol::finish(&ask, outcome)
            }
        }
    });
    // A read of stdin that timed out is still blocked on its thread: do not wait for it.
    runtime.shutdown_background();
    out
}

/// A stand-in question for failures before the configuration is read: its answer is an IO
/// error in the newest version.
fn io_ask() -> Ask {
    Ask {
        socket: protocol::DEFAULT_SOCKET.into(),
        timeout: protocol::DEFAULT_TIMEOUT,
        command: None,
        version: protocol::LATEST.to_owned(),
        prev_result: None,
        verb: protocol::Verb::Check,
    }
}

/// At most [`protocol::MAX_STDIN`] + 1 bytes of stdin (one more tells the plan it was too
/// large), within [`STDIN_TIMEOUT`].
async fn read_stdin() -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    let limit = u64::try_from(protocol::MAX_STDIN).unwrap_or(u64::MAX) + 1;
    let mut stdin = tokio::io::stdin().take(limit);
    match tokio::time::timeout(STDIN_TIMEOUT, stdin.read_to_end(&mut bytes)).await {
        Ok(Ok(_)) => Ok(bytes),
        Ok(Err(e)) => Err(format!("read the network configuration from stdin: {e}")),
        Err(_) => Err(format!(
            "stdin was not closed within {STDIN_TIMEOUT:?}: no network configuration"
        )),
    }
}

/// Ask the daemon `ask`, within its bound. STATUS only connects.
pub async fn ask_daemon(ask: &Ask) -> Result<(), AskError> {
    let exchange = async {
        match &ask.command {
            Some(command) => cni::send(&ask.socket, command).await.map_err(|e| match e {
                CniError::Connect { source, .. } => AskError::NotReady(source.to_string()),
                CniError::Refused { error } => AskError::Refused(error),
                CniError::TryAgain { error } => AskError::TryAgain(error),
                other => AskError::Io(crate::DisplayChain(&other).to_string()),
            }),
            None => tokio::net::UnixStream::connect(&ask.socket)
                .await
                .map(drop)
                .map_err(|e| AskError::NotReady(e.to_string())),
        }
    };
    tokio::time::timeout(ask.timeout, exchange)
        .await
        .unwrap_or(Err(AskError::Timeout(ask.timeout)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::cni::{CniCommand, CniRequest};
    use tokio::sync::mpsc;

    fn ask(socket: std::path::PathBuf, command: Option<CniCommand>) -> Ask {
        Ask {
            socket,
            timeout: Duration::from_millis(300),
            command,
            version: "1.0.0".into(),
            prev_result: Some("{}".into()),
            verb: protocol::Verb::Add,
        }
    }

    #[tokio::test]
    async fn a_missing_socket_is_not_ready_a_silent_daemon_a_timeout_and_a_refusal_is_passed_on() {
        let dir = std::env::temp_dir().join(format!(
            "aether-cni-plugin-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("cni.sock");
        let add = CniCommand::Add {
            namespace: "mp".into(),
            pod: "p".into(),
            netns: "/var/run/netns/p".into(),
            ips: Vec::new(),
        };
        assert!(matches!(
            ask_daemon(&ask(socket.clone(), Some(add.clone()))).await,
            Err(AskError::NotReady(_))
        ));
        assert!(matches!(
            ask_daemon(&ask(socket.clone(), None)).await,
            Err(AskError::NotReady(_))
        ));

        // A daemon that takes requests and never answers.
        let listener = cni::bind(&socket).unwrap();
        let (tx, mut rx) = mpsc::channel::<CniRequest>(4);
        let server = tokio::spawn(cni::serve(listener, tx, Default::default()));
        let held = tokio::spawn(async move {
            let mut kept = Vec::new();
            while let Some(req) = rx.recv().await {
                if matches!(&req.command, CniCommand::Add { pod, .. } if pod == "refused") {
                    let _ = req
                        .reply
                        .send(Err("pod mp/refused is not served".to_owned().into()));
                } else {
                    kept.push(req);
                }
            }
        });
        assert_eq!(
            ask_daemon(&ask(socket.clone(), Some(add))).await,
            Err(AskError::Timeout(Duration::from_millis(300)))
        );
        let refused = CniCommand::Add {
            namespace: "mp".into(),
            pod: "refused".into(),
            netns: "/var/run/netns/p".into(),
            ips: Vec::new(),
        };
        assert_eq!(
            ask_daemon(&ask(socket.clone(), Some(refused))).await,
            Err(AskError::Refused("pod mp/refused is not served".into()))
        );
        assert_eq!(ask_daemon(&ask(socket.clone(), None)).await, Ok(()));
        server.abort();
        held.abort();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
