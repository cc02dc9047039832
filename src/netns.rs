//! Network namespaces: the one place that calls `setns` (STYLE.md §6.2, ztunnel's
//! `InpodNetns::run`).
//!
//! A [`Netns`] is an open handle on a network namespace (a bind mount under `/var/run/netns`,
//! or `/proc/<pid>/ns/net`). [`Netns::run`] enters it on the calling thread, runs a closure that
//! opens sockets, and returns to the daemon's own namespace before it returns. A socket keeps
//! the namespace it was created in for its whole life, so the closure only creates and binds;
//! the socket is then used from any task.

use std::fmt;
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};

/// Where named network namespaces live (`ip netns add <name>`).
pub const NETNS_DIR: &str = "/var/run/netns";

/// An open network namespace, identified by (device, inode).
pub struct Netns {
    file: File,
    path: PathBuf,
    dev: u64,
    inode: u64,
}

impl fmt::Debug for Netns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Netns({}, {}:{})",
            self.path.display(),
            self.dev,
            self.inode
        )
    }
}

impl PartialEq for Netns {
    fn eq(&self, other: &Self) -> bool {
        self.dev == other.dev && self.inode == other.inode
    }
}

impl Eq for Netns {}

/// Entering or opening a namespace failed. (Failing to return to the daemon's namespace is not
/// an error: it aborts, see [`Netns::run`].)
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The namespace file could not be opened.
    #[error("open network namespace {path}")]
    Open {
        /// The path tried.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// `setns` refused.
    #[error("enter network namespace {path}")]
    Enter {
        /// The namespace.
        path: PathBuf,
        /// The cause.
        #[source]
        source: nix::Error,
    },
    /// The path is not a network namespace.
    #[error("{path} is not a network namespace")]
    NotANamespace {
        /// The path.
        path: PathBuf,
    },
    /// The namespace's addresses could not be listed.
    #[error("list the addresses of network namespace {path}")]
    Addresses {
        /// The namespace.
        path: PathBuf,
        /// The cause.
        #[source]
        source: nix::Error,
    },
    /// The path names a namespace a pod never has: capture is never programmed there.
    #[error("{path} is {whose} network namespace, not a pod's")]
    NotAPod {
        /// The path.
        path: PathBuf,
        /// `the daemon's own` or `the host's`.
        whose: &'static str,
    },
}

impl Netns {
    /// Open a namespace file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, NetnsError> {
        let path = path.as_ref().to_path_buf();
        let open = |path: &Path| -> io::Result<(File, u64, u64)> {
            let file = File::open(path)?;
            let meta = file.metadata()?;
            Ok((file, meta.dev(), meta.ino()))
        };
        let (file, dev, inode) = open(&path).map_err(|source| NetnsError::Open {
            path: path.clone(),
            source,
        })?;
        Ok(Self {
            file,
            path,
            dev,
            inode,
        })
    }

    /// Open a named namespace (`/var/run/netns/<name>`); a value with a `/` is taken as a path.
    pub fn named(name: &str) -> Result<Self, NetnsError> {
        if name.contains('/') {
            Self::open(name)
        } else {
            Self::open(Path::new(NETNS_DIR).join(name))
        }
    }

    /// Open a pod's namespace: the path must be a network namespace, and neither `home` (the
    /// daemon's own) nor the host's (that of PID 1, when the daemon can see it). Capture
    /// programmed in either would take over the node's own traffic (issue #8, finding 11).
    pub fn open_pod(path: impl AsRef<Path>, home: &Self) -> Result<Self, NetnsError> {
        use nix::sys::statfs::{NSFS_MAGIC, fstatfs};
        let ns = Self::open(path)?;
        match fstatfs(&ns.file) {
            Ok(fs) if fs.filesystem_type() == NSFS_MAGIC => {}
            Ok(_) => {
                return Err(NetnsError::NotANamespace { path: ns.path });
            }
            Err(e) => {
                return Err(NetnsError::Open {
                    path: ns.path,
                    source: e.into(),
                });
            }
        }
        // Without permission to see PID 1's namespace (another PID namespace, no
        // CAP_SYS_PTRACE), only the daemon's own is compared.
        let host = Self::open("/proc/1/ns/net").ok();
        let known = std::iter::once((home, "the daemon's own"))
            .chain(host.iter().map(|h| (h, "the host's")));
        ns.refuse(known)
    }

    /// `self`, unless it is one of `known` (namespace, whose).
    fn refuse<'a>(
        self,
        mut known: impl Iterator<Item = (&'a Self, &'static str)>,
    ) -> Result<Self, NetnsError> {
        match known.find(|(k, _)| *k == &self) {
            Some((_, whose)) => Err(NetnsError::NotAPod {
                path: self.path,
                whose,
            }),
            None => Ok(self),
        }
    }

    /// The namespace of the calling thread.
    pub fn current() -> Result<Self, NetnsError> {
        Self::open("/proc/thread-self/ns/net")
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What identifies the namespace: (device, inode) of its file. A namespace made later at
    /// the same path has another.
    pub fn id(&self) -> (u64, u64) {
        (self.dev, self.inode)
    }

    /// The addresses of `ips` that no interface of this namespace holds (empty: it holds them
    /// all). Read with `getifaddrs` from inside the namespace, then back to `home`.
    pub fn missing_addresses(
        &self,
        home: &Self,
        ips: &[IpAddr],
    ) -> Result<Vec<IpAddr>, NetnsError> {
        if ips.is_empty() {
            return Ok(Vec::new());
        }
        let held = self
            .run(home, nix::ifaddrs::getifaddrs)?
            .map_err(|source| NetnsError::Addresses {
                path: self.path.clone(),
                source,
            })?
            .filter_map(|a| {
                let addr = a.address?;
                match (addr.as_sockaddr_in(), addr.as_sockaddr_in6()) {
                    (Some(v4), _) => Some(IpAddr::V4(v4.ip())),
                    (None, Some(v6)) => Some(IpAddr::V6(v6.ip())),
                    (None, None) => None,
                }
            })
            .collect::<Vec<_>>();
        Ok(ips
            .iter()
            .filter(|ip| !held.contains(ip))
            .copied()
            .collect())
    }

    /// Run `f` inside this namespace on the calling thread, then return to `home` (the daemon's
    /// own namespace). `f` must not block or await: it opens sockets.
    ///
    /// The return is made by a guard, so it happens however `f` ends, a panic included. A
    /// thread that cannot return would open the next sockets in a pod's namespace (a runtime
    /// worker serving every pod), so a failed return aborts the process (STYLE.md §9 lesson 6).
    pub fn run<R>(&self, home: &Self, f: impl FnOnce() -> R) -> Result<R, NetnsError> {
        if self == home {
            return Ok(f());
        }
        setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
            path: self.path.clone(),
            source,
        })?;
        let _home = ReturnHome { from: self, home };
        Ok(f())
    }
}

/// Returns the thread to the daemon's namespace when dropped ([`Netns::run`]).
struct ReturnHome<'a> {
    from: &'a Netns,
    home: &'a Netns,
}

impl Drop for ReturnHome<'_> {
    fn drop(&mut self) {
        if let Err(error) = setns(self.home.file.as_fd(), CloneFlags::CLONE_NEWNET) {
            tracing::error!(%error, from = %self.from.path.display(), home = %self.home.path.display(),
                "cannot return to the daemon's network namespace; aborting");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::needs_root;

    #[test]
    fn a_pod_namespace_is_never_the_daemons_own_the_hosts_or_not_a_namespace() {
        let home = Netns::current().unwrap();
        match Netns::open_pod("/proc/self/ns/net", &home) {
            Err(NetnsError::NotAPod { whose, .. }) => assert_eq!(whose, "the daemon's own"),
            other => panic!("{other:?}"),
        }
        // PID 1's namespace may be hidden from this test: the comparison itself, with the
        // daemon's own namespace standing in for the host's.
        let host = Netns::open("/proc/self/ns/net").unwrap();
        let err = Netns::current()
            .unwrap()
            .refuse([(&host, "the host's")].into_iter())
            .unwrap_err();
        assert!(
            err.to_string()
                .ends_with("is the host's network namespace, not a pod's"),
            "{err}"
        );
        match Netns::open_pod("/proc/self/status", &home) {
            Err(NetnsError::NotANamespace { path }) => {
                assert_eq!(path, Path::new("/proc/self/status"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_closure_that_panics_inside_a_pod_namespace_leaves_the_thread_at_home() {
        const TEST: &str = "a_closure_that_panics_inside_a_pod_namespace_leaves_the_thread_at_home";
        if needs_root::cannot_run(TEST, &["ip"]) {
            return;
        }
        let name = format!("aens{}", std::process::id() % 100_000);
        let made = std::process::Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(made.success(), "ip netns add {name}");
        let pod = Netns::named(&name);
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &name])
            .status();
        let pod = pod.unwrap();
        // A thread of its own: on failure, the one left in the pod's namespace is this one.
        let at_home = std::thread::spawn(move || {
            let home = Netns::current().unwrap();
            let inside = std::panic::catch_unwind(|| {
                pod.run(&home, || {
                    assert_eq!(Netns::current().unwrap(), pod, "run entered the namespace");
                    panic!("the closure panics inside the pod's namespace");
                })
            });
            assert!(inside.is_err());
            Netns::current().unwrap() == home
        })
        .join()
        .unwrap();
        assert!(
            at_home,
            "the thread stayed in the pod's namespace after the closure panicked"
        );
    }
}
