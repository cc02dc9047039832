//! `aether cni install`: put the plugin binary in the node's CNI `bin` directory and
//! `aether-cni` at the end of the node's primary conflist; with `--watch`, keep it there while
//! the primary CNI rewrites its file, and at SIGTERM take it out only when aether is being
//! uninstalled ([`super::owner`]; docs/cni.md, "Install").
//!
//! IO module (Layer 2): the file edits are decided by [`super::conflist`] (pure) and written
//! here, each by a temporary file in the same directory and a rename, so that the runtime reads
//! the old file or the new one, never a part.

use std::future::Future;
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::conflist::{self, Edit, InvalidConf};
use super::owner::AtStop;

/// A configuration file larger than this is not read (a real one is a few KiB).
pub const MAX_CONF: u64 = 1 << 20;

/// How long the directory must be quiet after a change before it is read again.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// How often the watch re-checks the file with no event (a missed event, an overlay
/// filesystem that reports none).
pub const RECHECK: Duration = Duration::from_secs(30);

/// Installing failed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// A file or directory could not be read.
    #[error("read {path}")]
    Read {
        /// What was read.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A file could not be written, renamed or removed.
    #[error("write {path}")]
    Write {
        /// What was written.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The directory holds no network configuration yet.
    #[error(
        "no network configuration in {dir} (no *.conf, *.conflist or *.json): hint: has the primary CNI started?"
    )]
    NoPrimary {
        /// The configuration directory.
        dir: PathBuf,
    },
    /// The primary configuration is larger than [`MAX_CONF`].
    #[error("{path} is larger than {MAX_CONF} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The primary configuration cannot be edited.
    #[error(transparent)]
    Invalid(#[from] InvalidConf),
    /// The directory cannot be watched.
    #[error("watch {dir}")]
    Watch {
        /// The configuration directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: notify::Error,
    },
}

/// What [`apply`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    /// The file was already right.
    Unchanged(PathBuf),
    /// The file was written.
    Written(PathBuf),
}

/// Write `bytes` to `dir/name` by a temporary file in `dir` and a rename, with `mode`.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<(), InstallError> {
    let path = dir.join(name);
    // Hidden and ending in `.tmp`: never a network file, never a plugin the runtime runs.
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    })();
    written.map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        InstallError::Write { path, source }
    })
}

/// Copy the binary at `exe` to `<bin_dir>/aether-cni` (mode 0755), unless the same bytes are
/// there. Returns whether it wrote.
pub fn install_binary(exe: &Path, bin_dir: &Path) -> Result<bool, InstallError> {
    let bytes = std::fs::read(exe).map_err(|source| InstallError::Read {
        path: exe.to_path_buf(),
        source,
    })?;
    let target = bin_dir.join(conflist::PLUGIN_TYPE);
    let same = std::fs::metadata(&target)
        .is_ok_and(|m| m.len() == bytes.len() as u64 && m.permissions().mode() & 0o777 == 0o755)
        && std::fs::read(&target).is_ok_and(|t| t == bytes);
    if same {
        return Ok(false);
    }
    std::fs::create_dir_all(bin_dir).map_err(|source| InstallError::Write {
        path: bin_dir.to_path_buf(),
        source,
    })?;
    write_atomic(bin_dir, conflist::PLUGIN_TYPE, &bytes, 0o755)?;
    Ok(true)
}

/// The primary network file of `conf_dir` and its text.
fn read_primary(conf_dir: &Path) -> Result<(String, String), InstallError> {
    let entries = std::fs::read_dir(conf_dir).map_err(|source| InstallError::Read {
        path: conf_dir.to_path_buf(),
        source,
    })?;
    let names: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    let name = conflist::primary(names.iter().map(String::as_str))
        .ok_or_else(|| InstallError::NoPrimary {
            dir: conf_dir.to_path_buf(),
        })?
        .to_owned();
    let path = conf_dir.join(&name);
    let read_err = |source| InstallError::Read {
        path: path.clone(),
        source,
    };
    let mut text = String::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(MAX_CONF + 1).read_to_string(&mut text))
        .map_err(read_err)?;
    if text.len() as u64 > MAX_CONF {
        return Err(InstallError::TooLarge { path });
    }
    Ok((name, text))
}

/// Carry out `edit` in `conf_dir`.
fn carry_out(conf_dir: &Path, name: &str, edit: Edit) -> Result<Applied, InstallError> {
    match edit {
        Edit::Unchanged => Ok(Applied::Unchanged(conf_dir.join(name))),
        Edit::Write {
            file,
            content,
            remove,
        } => {
            write_atomic(conf_dir, &file, content.as_bytes(), 0o644)?;
            if let Some(old) = remove {
                let path = conf_dir.join(old);
                std::fs::remove_file(&path)
                    .map_err(|source| InstallError::Write { path, source })?;
            }
            Ok(Applied::Written(conf_dir.join(file)))
        }
    }
}

/// Make the primary conflist of `conf_dir` end with `entry` ([`conflist::insert`]).
pub fn apply(conf_dir: &Path, entry: &Value) -> Result<Applied, InstallError> {
    let (name, text) = read_primary(conf_dir)?;
    let edit = conflist::insert(&name, &text, entry)?;
    carry_out(conf_dir, &name, edit)
}

/// Take `aether-cni` out of the primary conflist of `conf_dir` ([`conflist::remove`]).
pub fn uninstall(conf_dir: &Path) -> Result<Applied, InstallError> {
    let (name, text) = read_primary(conf_dir)?;
    let edit = conflist::remove(&name, &text)?;
    carry_out(conf_dir, &name, edit)
}

fn log_applied(result: &Result<Applied, InstallError>) {
    match result {
        Ok(Applied::Written(path)) => {
            info!(file = %path.display(), "aether-cni inserted into the CNI configuration")
        }
        Ok(Applied::Unchanged(path)) => {
            tracing::debug!(file = %path.display(), "the CNI configuration already chains aether-cni")
        }
        Err(e) => {
            warn!(error = %crate::DisplayChain(e), "the CNI configuration could not be edited; retrying on the next change")
        }
    }
}

/// Keep `entry` at the end of the primary conflist of `conf_dir` until `stop` completes, then
/// do what `at_stop` says with it ([`super::owner::at_stop`]; polled only once `stop` has
/// completed). Every change in the directory (the primary CNI rewriting its file, a new file
/// sorting first) is answered by [`apply`] after [`DEBOUNCE`], and the file is re-checked every
/// [`RECHECK`] besides. An edit that fails (no file yet, a file half written) is retried then.
/// Returns what was done at stop.
pub async fn watch(
    conf_dir: &Path,
    entry: &Value,
    stop: impl Future<Output = ()>,
    at_stop: impl Future<Output = AtStop>,
) -> Result<AtStop, InstallError> {
    use notify::Watcher as _;
    let (tx, mut changed) = mpsc::channel::<()>(1);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Reads (the runtime's, and this watch's own) are not changes.
        if event.is_ok_and(|e| !matches!(e.kind, notify::EventKind::Access(_))) {
            let _ = tx.try_send(());
        }
    })
    .map_err(|source| InstallError::Watch {
        dir: conf_dir.to_path_buf(),
        source,
    })?;
    watcher
        .watch(conf_dir, notify::RecursiveMode::NonRecursive)
        .map_err(|source| InstallError::Watch {
            dir: conf_dir.to_path_buf(),
            source,
        })?;
    log_applied(&apply(conf_dir, entry));
    let mut recheck = tokio::time::interval(RECHECK);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    recheck.tick().await;
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            Some(()) = changed.recv() => {
                tokio::time::sleep(DEBOUNCE).await;
                while changed.try_recv().is_ok() {}
                log_applied(&apply(conf_dir, entry));
            }
            _ = recheck.tick() => log_applied(&apply(conf_dir, entry)),
        }
    }
    drop(watcher);
    let decision = at_stop.await;
    match &decision {
        // Uninstalled, the daemon no longer answers: an entry left behind would fail every ADD
        // on this node, and no pod could start (docs/cni.md, "Install").
        AtStop::Remove(why) => match uninstall(conf_dir)? {
            Applied::Written(path) => {
                info!(file = %path.display(), reason = %why, "aether-cni removed from the CNI configuration")
            }
            Applied::Unchanged(path) => {
                info!(file = %path.display(), reason = %why, "aether-cni was not in the CNI configuration")
            }
        },
        // Fail closed: a pod created before a daemon serves this node waits (CNI error 11)
        // instead of starting without capture.
        AtStop::Keep(why) => warn!(
            reason = %why,
            "aether-cni stays in the CNI configuration: pods created on this node wait (CNI error 11) until a daemon serves them; after an uninstall, remove it with `aether cni uninstall`"
        ),
    }
    Ok(decision)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "aether-cni-install-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entry() -> Value {
        conflist::entry(&serde_json::Map::new())
    }

    const PRIMARY: &str =
        r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"bridge","bridge":"cni0"}]}"#;

    fn chain(path: &Path) -> Vec<String> {
        let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        v["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["type"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_binary_is_copied_with_mode_0755_once() {
        let dir = temp("bin");
        let exe = dir.join("aether");
        std::fs::write(&exe, b"\x7fELF not really").unwrap();
        let bin = dir.join("opt-cni-bin");
        assert!(install_binary(&exe, &bin).unwrap());
        let target = bin.join("aether-cni");
        assert_eq!(std::fs::read(&target).unwrap(), b"\x7fELF not really");
        assert_eq!(
            std::fs::metadata(&target).unwrap().permissions().mode() & 0o777,
            0o755
        );
        assert!(
            !install_binary(&exe, &bin).unwrap(),
            "the same binary was written again"
        );
        std::fs::write(&exe, b"\x7fELF newer").unwrap();
        assert!(install_binary(&exe, &bin).unwrap());
        assert_eq!(std::fs::read(&target).unwrap(), b"\x7fELF newer");
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(&bin).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn apply_edits_the_first_network_file_once_and_uninstall_takes_it_out() {
        let dir = temp("apply");
        assert!(matches!(
            apply(&dir, &entry()),
            Err(InstallError::NoPrimary { .. })
        ));
        std::fs::write(dir.join("20-other.conflist"), PRIMARY).unwrap();
        std::fs::write(dir.join("10-net.conflist"), PRIMARY).unwrap();
        let first = dir.join("10-net.conflist");
        assert_eq!(
            apply(&dir, &entry()).unwrap(),
            Applied::Written(first.clone())
        );
        assert_eq!(chain(&first), ["bridge", "aether-cni"]);
        let modified = std::fs::metadata(&first).unwrap().modified().unwrap();
        assert_eq!(
            apply(&dir, &entry()).unwrap(),
            Applied::Unchanged(first.clone())
        );
        assert_eq!(
            std::fs::metadata(&first).unwrap().modified().unwrap(),
            modified
        );
        assert_eq!(
            chain(&dir.join("20-other.conflist")),
            ["bridge"],
            "only the primary is edited"
        );
        assert_eq!(uninstall(&dir).unwrap(), Applied::Written(first.clone()));
        assert_eq!(chain(&first), ["bridge"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn the_watch_re_inserts_after_the_primary_rewrites_and_removes_at_stop() {
        let dir = temp("watch");
        let conf = dir.join("10-net.conflist");
        std::fs::write(&conf, PRIMARY).unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let watching = {
            let dir = dir.clone();
            tokio::spawn(async move {
                watch(
                    &dir,
                    &entry(),
                    async {
                        let _ = stop_rx.await;
                    },
                    async { AtStop::Remove("uninstalled".into()) },
                )
                .await
            })
        };
        let wait_for = |want: &'static [&'static str]| {
            let conf = conf.clone();
            async move {
                for _ in 0..100 {
                    if std::fs::read(&conf).is_ok_and(|t| {
                        serde_json::from_slice::<Value>(&t).is_ok_and(|v| {
                            v["plugins"].as_array().is_some_and(|p| {
                                p.iter()
                                    .map(|p| p["type"].as_str().unwrap_or(""))
                                    .eq(want.iter().copied())
                            })
                        })
                    }) {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                false
            }
        };
        assert!(
            wait_for(&["bridge", "aether-cni"]).await,
            "not inserted at start"
        );
        // The primary CNI rewrites its file (in place, as some do).
        std::fs::write(&conf, PRIMARY).unwrap();
        assert!(
            wait_for(&["bridge", "aether-cni"]).await,
            "not re-inserted after a rewrite"
        );
        stop_tx.send(()).unwrap();
        watching.await.unwrap().unwrap();
        assert_eq!(chain(&conf), ["bridge"], "the entry was left at stop");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue #35 item 4: an installer stopped while its DaemonSet is there (a rollout) leaves
    /// the entry, so a pod created before the next daemon serves waits instead of starting
    /// uncaptured; one stopped once the DaemonSet is gone (an uninstall) takes it out. Asked
    /// through the lab's API server, as the chart's installer asks the cluster's.
    #[tokio::test]
    async fn the_watch_keeps_the_entry_at_stop_while_its_daemonset_is_there() {
        use super::super::owner::{DaemonSetRef, at_stop};
        use aether_lab::lab::apiserver::{Settings, serve_on_loopback};
        let (_server, _, client) = serve_on_loopback(Settings::default(), None).await;
        let ds = DaemonSetRef {
            namespace: "aether-system".into(),
            name: "aether".into(),
        };
        let api: kube::Api<k8s_openapi::api::apps::v1::DaemonSet> =
            kube::Api::namespaced(client.clone(), &ds.namespace);
        let object = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "aether", "namespace": "aether-system"},
            "spec": {"selector": {"matchLabels": {"app": "aether"}},
                     "template": {"metadata": {"labels": {"app": "aether"}},
                                  "spec": {"containers": [{"name": "aether", "image": "aether:1"}]}}}
        }))
        .unwrap();
        api.create(&kube::api::PostParams::default(), &object)
            .await
            .unwrap();
        let dir = temp("rollout");
        let conf = dir.join("10-net.conflist");
        std::fs::write(&conf, PRIMARY).unwrap();
        // Stopped at once: the insertion at start is synchronous, the stop comes after it.
        let decided = watch(
            &dir,
            &entry(),
            async {},
            at_stop(Ok(client.clone()), Some(&ds)),
        )
        .await
        .unwrap();
        assert!(matches!(decided, AtStop::Keep(_)), "{decided:?}");
        assert_eq!(
            chain(&conf),
            ["bridge", "aether-cni"],
            "a rollout's stop took the entry out"
        );
        api.delete("aether", &kube::api::DeleteParams::default())
            .await
            .unwrap();
        let decided = watch(&dir, &entry(), async {}, at_stop(Ok(client), Some(&ds)))
            .await
            .unwrap();
        assert!(matches!(decided, AtStop::Remove(_)), "{decided:?}");
        assert_eq!(chain(&conf), ["bridge"], "an uninstall left the entry");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
