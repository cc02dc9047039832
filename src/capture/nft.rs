//! Applying a [`CapturePlan`] inside a pod's network namespace (spec/model.md §12.1).
//!
//! Every command runs as `nsenter --net=<netns> <program> ...`: the daemon's threads never
//! change namespace here (only `crate::netns` calls `setns`), and no `unsafe` `pre_exec` is
//! needed. The ruleset goes to `nft -f -` on stdin, so it is applied in one transaction.
//! Everything is idempotent: applying twice replaces, removing twice is not an error.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use super::plan::{self, CapturePlan, Family, IpAction, IpCommand, TABLE};

/// Programming capture in a namespace failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The command could not be started (for example `nsenter` or `nft` is not installed).
    #[error("start `{command}` in network namespace {netns}")]
    Spawn {
        /// The namespace.
        netns: PathBuf,
        /// The command line, without `nsenter`.
        command: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The command ran and failed.
    #[error("`{command}` in network namespace {netns} failed ({status}): {stderr}")]
    Failed {
        /// The namespace.
        netns: PathBuf,
        /// The command line, without `nsenter`.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it wrote to stderr, trimmed.
        stderr: String,
    },
}

impl ApplyError {
    /// The namespace the failure happened in.
    pub fn netns(&self) -> &Path {
        match self {
            Self::Spawn { netns, .. } | Self::Failed { netns, .. } => netns,
        }
    }
}

/// The outcome of one command that ran.
struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

async fn run(
    netns: &Path,
    program: &str,
    args: &[String],
    stdin: Option<&str>,
) -> Result<Ran, ApplyError> {
    let command = std::iter::once(program)
        .chain(args.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ");
    let spawn_err = |source: io::Error| ApplyError::Spawn {
        netns: netns.to_path_buf(),
        command: command.clone(),
        source,
    };
    let mut net = std::ffi::OsString::from("--net=");
    net.push(netns.as_os_str());
    let mut child = Command::new("nsenter")
        .arg(net)
        .arg("--")
        .arg(program)
        .args(args)
        // Failures are recognised by their English text (see `already_done`).
        .env("LC_ALL", "C")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(spawn_err)?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).await.map_err(spawn_err)?;
        pipe.shutdown().await.map_err(spawn_err)?;
        drop(pipe);
    }
    let out = child.wait_with_output().await.map_err(spawn_err)?;
    Ok(Ran {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
}

/// Run a command that must succeed.
async fn must(
    netns: &Path,
    program: &str,
    args: &[String],
    stdin: Option<&str>,
) -> Result<(), ApplyError> {
    let ran = run(netns, program, args, stdin).await?;
    if ran.status.success() {
        Ok(())
    } else {
        Err(failed(netns, program, args, ran))
    }
}

fn failed(netns: &Path, program: &str, args: &[String], ran: Ran) -> ApplyError {
    let mut command = program.to_owned();
    for a in args {
        command.push(' ');
        command.push_str(a);
    }
    ApplyError::Failed {
        netns: netns.to_path_buf(),
        command,
        status: ran.status,
        stderr: ran.stderr,
    }
}

/// Whether a failed `ip` command's stderr means its work was already done: the object exists
/// (add) or is missing (del). On removal, a family the namespace does not support has nothing
/// to remove either.
fn already_done(cmd: &IpCommand, stderr: &str) -> bool {
    if nsenter_failed(stderr) {
        return false;
    }
    match cmd.action {
        IpAction::Add => stderr.contains("File exists"),
        IpAction::Del => {
            stderr.contains("No such file or directory")
                || stderr.contains("No such process")
                || stderr.contains("Address family not supported")
                // The routing table was never made (an IPv4-only pod's IPv6 table).
                || stderr.contains("FIB table does not exist")
        }
    }
}

/// Whether `nsenter` itself failed (the namespace or the program is missing): its messages
/// would otherwise read like "already missing".
fn nsenter_failed(stderr: &str) -> bool {
    stderr.starts_with("nsenter:")
}

async fn ip(netns: &Path, cmd: &IpCommand) -> Result<(), ApplyError> {
    let ran = run(netns, "ip", &cmd.args, None).await?;
    if ran.status.success() || already_done(cmd, &ran.stderr) {
        Ok(())
    } else {
        Err(failed(netns, "ip", &cmd.args, ran))
    }
}

/// Program `plan` in the namespace at `netns` (`/var/run/netns/<name>` or
/// `/proc/<pid>/ns/net`): the ruleset in one `nft -f` transaction, then the policy routing.
/// Applying again replaces the ruleset and leaves the routing as it is.
pub async fn apply(netns: &Path, plan: &CapturePlan) -> Result<(), ApplyError> {
    must(
        netns,
        "nft",
        &["-f".to_owned(), "-".to_owned()],
        Some(&plan.ruleset()),
    )
    .await?;
    for cmd in plan.route_commands() {
        ip(netns, &cmd).await?;
    }
    tracing::debug!(
        netns = %netns.display(),
        pod = %format_args!("{}/{}", plan.pod().namespace, plan.pod().name),
        mode = %plan.pod().mode,
        "capture applied"
    );
    Ok(())
}

/// Remove capture from the namespace at `netns`: the table and the policy routing of both
/// families. It needs no plan, since the routing entries are the same for every pod; what is
/// already missing is not an error.
pub async fn remove(netns: &Path) -> Result<(), ApplyError> {
    for cmd in [Family::V4, Family::V6]
        .into_iter()
        .flat_map(plan::route_dels)
    {
        ip(netns, &cmd).await?;
    }
    must(
        netns,
        "nft",
        &["-f".to_owned(), "-".to_owned()],
        Some(&plan::removal_ruleset()),
    )
    .await
}

/// `table inet aether` of the namespace at `netns`, as `nft list table` prints it (what is
/// installed, not what was planned); `None` when there is no such table. The caller bounds the
/// time: the child is killed when the future is dropped.
pub async fn list(netns: &Path) -> Result<Option<String>, ApplyError> {
    let args = ["list", "table", "inet", TABLE].map(str::to_owned);
    let ran = run(netns, "nft", &args, None).await?;
    if ran.status.success() {
        Ok(Some(ran.stdout))
    } else if !nsenter_failed(&ran.stderr) && ran.stderr.contains("No such file or directory") {
        Ok(None)
    } else {
        Err(failed(netns, "nft", &args, ran))
    }
}

/// Whether `table inet aether` exists in the namespace at `netns`.
pub async fn is_applied(netns: &Path) -> Result<bool, ApplyError> {
    let args = ["list", "table", "inet", TABLE].map(str::to_owned);
    let ran = run(netns, "nft", &args, None).await?;
    if ran.status.success() {
        Ok(true)
    } else if !nsenter_failed(&ran.stderr) && ran.stderr.contains("No such file or directory") {
        Ok(false)
    } else {
        Err(failed(netns, "nft", &args, ran))
    }
}
