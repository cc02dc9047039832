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

/// Entering or opening a namespace failed.
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
    /// Returning to the daemon's namespace failed: the thread is unusable.
    #[error("return to the daemon's network namespace from {path}")]
    Return {
        /// The namespace that was entered.
        path: PathBuf,
        /// The cause.
        #[source]
        source: nix::Error,
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

    /// The namespace of the calling thread.
    pub fn current() -> Result<Self, NetnsError> {
        Self::open("/proc/thread-self/ns/net")
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Run `f` inside this namespace on the calling thread, then return to `home` (the daemon's
    /// own namespace). `f` must not block or await: it opens sockets.
    pub fn run<R>(&self, home: &Self, f: impl FnOnce() -> R) -> Result<R, NetnsError> {
        if self == home {
            return Ok(f());
        }
        setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
            path: self.path.clone(),
            source,
        })?;
        let out = f();
        setns(home.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|source| {
            NetnsError::Return {
                path: self.path.clone(),
                source,
            }
        })?;
        Ok(out)
    }
}
