//! The pods this daemon accepted a CNI ADD for, kept under `<state_dir>/cni-pods/` so that a
//! restarted daemon finds them again without a new ADD (issue #9 §4).
//!
//! Kubernetes sends ADD once per pod sandbox. A daemon that restarts (an upgrade, a crash, an
//! OOM kill) would otherwise no longer know the network namespace of any pod that started before
//! it, and a pod served from its ADD alone would stay unserved, its capture still programmed and
//! nothing listening behind it. So each accepted ADD is written here, one file per pod, by a
//! write to a temporary file and a rename; a DEL removes the file. At start the daemon reads
//! them all back and keeps a record only when its namespace still exists, is the same namespace
//! (device and inode, so a path reused by another sandbox does not count) and holds every address
//! the ADD named. Every other record is stale, and removed.
//!
//! Recording was chosen over scanning `/var/run/netns`: a scan can match a namespace to a pod
//! only by its addresses, it misses runtimes that name namespaces by `/proc/<pid>/ns/net`, and a
//! record says exactly what the runtime said. The state directory is normally a tmpfs
//! (`/var/run/aether`), which is right: it is lost on a reboot, and so are the namespaces.
//!
//! IO module (Layer 2): files and the namespace checks of [`Netns`]; the file name encoding
//! ([`file_name`]) is pure.

use std::io::{self, Read as _, Write as _};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::netns::Netns;

/// The directory under the state directory.
pub const DIR: &str = "cni-pods";

/// A record file larger than this is not a record (it is dropped unread).
const MAX_RECORD: u64 = 64 * 1024;

/// One accepted ADD.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CniRecord {
    /// The pod's Kubernetes namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// Its network namespace, as the ADD named it.
    pub netns: PathBuf,
    /// The addresses the ADD named (possibly none).
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    /// Device and inode of the namespace when the ADD was accepted.
    pub netns_id: (u64, u64),
}

/// Why a record was not taken back at start.
#[derive(Debug, thiserror::Error)]
pub enum StaleRecord {
    /// The file could not be read, or is not a record.
    #[error("unreadable record {path}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The namespace is gone, or is not a pod's.
    #[error("the pod's network namespace is gone")]
    Gone(#[source] crate::netns::NetnsError),
    /// Another namespace is at the path now.
    #[error("{path} is another network namespace now")]
    Replaced {
        /// The namespace's path.
        path: PathBuf,
    },
    /// The namespace no longer holds an address the ADD named.
    #[error("the network namespace no longer holds {missing:?}")]
    Readdressed {
        /// The addresses missing.
        missing: Vec<IpAddr>,
    },
}

/// The file name of a pod's record: `<namespace>_<pod>.json`, every byte outside
/// `[A-Za-z0-9.-]` written `%XX`, so that no name (a `/`, `..`, a NUL) leaves the directory or
/// meets another pod's file.
pub fn file_name(namespace: &str, pod: &str) -> String {
    fn encode(out: &mut String, s: &str) {
        for b in s.bytes() {
            if b.is_ascii_alphanumeric() || b == b'-' || (b == b'.' && !out.ends_with('_')) {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    let mut out = String::new();
    encode(&mut out, namespace);
    out.push('_');
    encode(&mut out, pod);
    out.push_str(".json");
    // A leading dot would make a hidden file; a name of dots would climb.
    if out.starts_with('.') {
        out.replace_range(0..1, "%2E");
    }
    out
}

/// The records of one state directory.
#[derive(Clone, Debug)]
pub struct Records {
    dir: PathBuf,
}

impl Records {
    /// The records under `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            dir: state_dir.join(DIR),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, namespace: &str, pod: &str) -> PathBuf {
        self.dir.join(file_name(namespace, pod))
    }

    /// Write (or replace) a pod's record: a temporary file, flushed, then renamed over the
    /// record, so that a reader sees the old record or the new one, never a part.
    pub fn save(&self, record: &CniRecord) -> io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(&record.namespace, &record.pod);
        let tmp = self.dir.join(format!(
            ".{}.{}.tmp",
            file_name(&record.namespace, &record.pod),
            std::process::id()
        ));
        let text = serde_json::to_vec(record).map_err(io::Error::other)?;
        let written = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&text)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    /// A pod's record, if there is a readable one.
    pub fn read(&self, namespace: &str, pod: &str) -> Option<CniRecord> {
        read_record(&self.path(namespace, pod)).ok()
    }

    /// Remove a pod's record; a record that is not there is not an error.
    pub fn remove(&self, namespace: &str, pod: &str) -> io::Result<()> {
        match std::fs::remove_file(self.path(namespace, pod)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every record whose pod is still there (see the module's opening), and what was dropped
    /// and why; dropped records' files are removed. `home` is the daemon's own namespace.
    pub fn reload(&self, home: &Netns) -> (Vec<CniRecord>, Vec<(PathBuf, StaleRecord)>) {
        let mut kept = Vec::new();
        let mut dropped = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return (kept, dropped);
        };
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            // A temporary file of a save that did not finish.
            if name.starts_with('.') && name.ends_with(".tmp") {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            match read_record(&path).and_then(|r| {
                // A file renamed by hand under another pod's name is not that pod's record.
                if file_name(&r.namespace, &r.pod) == name {
                    Ok(r)
                } else {
                    Err(StaleRecord::Unreadable {
                        path: path.clone(),
                        source: io::Error::new(
                            io::ErrorKind::InvalidData,
                            "the record names another pod than its file",
                        ),
                    })
                }
            }) {
                Ok(record) => match still_there(&record, home) {
                    Ok(()) => kept.push(record),
                    Err(why) => {
                        let _ = std::fs::remove_file(&path);
                        dropped.push((path, why));
                    }
                },
                Err(why) => {
                    let _ = std::fs::remove_file(&path);
                    dropped.push((path, why));
                }
            }
        }
        (kept, dropped)
    }
}

fn read_record(path: &Path) -> Result<CniRecord, StaleRecord> {
    let unreadable = |source| StaleRecord::Unreadable {
        path: path.to_path_buf(),
        source,
    };
    let mut text = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_RECORD + 1).read_to_end(&mut text))
        .map_err(unreadable)?;
    if text.len() as u64 > MAX_RECORD {
        return Err(unreadable(io::Error::new(
            io::ErrorKind::InvalidData,
            "larger than a record",
        )));
    }
    serde_json::from_slice(&text)
        .map_err(|e| unreadable(io::Error::new(io::ErrorKind::InvalidData, e)))
}

/// Whether the record's pod is still there: its namespace exists, is a pod's, is the one the ADD
/// named, and holds the ADD's addresses.
pub fn still_there(record: &CniRecord, home: &Netns) -> Result<(), StaleRecord> {
    let ns = Netns::open_pod(&record.netns, home).map_err(StaleRecord::Gone)?;
    if ns.id() != record.netns_id {
        return Err(StaleRecord::Replaced {
            path: record.netns.clone(),
        });
    }
    let missing = ns
        .missing_addresses(home, &record.ips)
        .map_err(StaleRecord::Gone)?;
    if missing.is_empty() {
        Ok(())
    } else {
        Err(StaleRecord::Readdressed { missing })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_file_name_stays_in_its_directory_and_names_one_pod() {
        assert_eq!(file_name("mp", "mp-client-0"), "mp_mp-client-0.json");
        assert_eq!(file_name("mp", "a.b"), "mp_a.b.json");
        assert_eq!(file_name("..", "x"), "%2E._x.json");
        assert_eq!(file_name("a/b", "../c"), "a%2Fb_%2E.%2Fc.json");
        assert_eq!(file_name("a_b", "c"), "a%5Fb_c.json");
        // Distinct pods, distinct files: the separator cannot be forged.
        assert_ne!(file_name("a_b", "c"), file_name("a", "b_c"));
        for (ns, pod) in [("", ""), ("\0", "x"), (".", "."), ("ns", "p\n")] {
            let name = file_name(ns, pod);
            assert!(!name.contains('/') && !name.starts_with('.'), "{name}");
            assert!(name.bytes().all(|b| b.is_ascii_graphic()), "{name:?}");
        }
    }

    #[test]
    fn records_are_saved_read_and_removed_and_unreadable_ones_are_dropped_at_reload() {
        let dir = std::env::temp_dir().join(format!(
            "aether-cni-records-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let records = Records::new(&dir);
        let home = Netns::current().unwrap();
        let record = CniRecord {
            namespace: "mp".into(),
            pod: "p".into(),
            netns: "/var/run/netns/aether-cni-records-none".into(),
            ips: vec!["10.1.2.3".parse().unwrap()],
            netns_id: (1, 2),
        };
        records.save(&record).unwrap();
        assert_eq!(records.read("mp", "p"), Some(record.clone()));
        // A record whose namespace is gone, a damaged one, one under another pod's name and a
        // leftover temporary file: all dropped, none kept.
        std::fs::write(records.dir().join("mp_bad.json"), b"{not json").unwrap();
        std::fs::write(
            records.dir().join("mp_other.json"),
            serde_json::to_vec(&record).unwrap(),
        )
        .unwrap();
        std::fs::write(records.dir().join(".mp_x.json.1.tmp"), b"{").unwrap();
        let (kept, dropped) = records.reload(&home);
        assert!(kept.is_empty(), "{kept:?}");
        let mut why: Vec<String> = dropped
            .iter()
            .map(|(p, e)| {
                format!(
                    "{}: {}",
                    p.file_name().unwrap().to_string_lossy(),
                    crate::DisplayChain(e)
                )
            })
            .collect();
        why.sort();
        assert_eq!(why.len(), 3, "{why:?}");
        assert!(
            why[0].starts_with("mp_bad.json: unreadable record"),
            "{why:?}"
        );
        assert!(why[1].contains("names another pod"), "{why:?}");
        assert!(
            why[2].starts_with("mp_p.json: the pod's network namespace is gone"),
            "{why:?}"
        );
        assert_eq!(std::fs::read_dir(records.dir()).unwrap().count(), 0);
        records.remove("mp", "p").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_daemons_own_namespace_is_never_taken_back() {
        let home = Netns::current().unwrap();
        let record = CniRecord {
            namespace: "mp".into(),
            pod: "p".into(),
            netns: "/proc/self/ns/net".into(),
            ips: Vec::new(),
            netns_id: home.id(),
        };
        assert!(matches!(
            still_there(&record, &home),
            Err(StaleRecord::Gone(crate::netns::NetnsError::NotAPod { .. }))
        ));
    }
}
