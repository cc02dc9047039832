//! The overload manager's eyes (issue #36 item 4): the memory limit of the daemon's cgroup
//! (v2, or v1's memory controller), what the daemon uses against it, and the task that sets the
//! data plane's level ([`crate::proxy::overload`]) from the two.
//!
//! What is used is the cgroup's charge less its inactive file cache, the kubelet's "working
//! set": page cache the kernel can drop is charged to the cgroup but never kills it. The
//! limit is the smallest one on the way from the daemon's cgroup to the hierarchy's root, so a
//! limit set on a pod's cgroup above the container's is seen.
//!
//! The parsing is pure and tested on text; [`Meter::discover`] reads `/proc/self/mountinfo`,
//! `/proc/self/cgroup` and the cgroup files under a root that tests replace.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::proxy::overload::{HYSTERESIS_PERCENT, Level, Overload, Thresholds, next_level};

/// A limit at or over this is no limit (v1 writes about 2^63 for "unlimited").
const UNLIMITED: u64 = 1 << 60;

/// Which interface the cgroup speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// The unified hierarchy: `memory.max`, `memory.current`, `inactive_file`.
    V2,
    /// v1's memory controller: `memory.limit_in_bytes`, `memory.usage_in_bytes`,
    /// `total_inactive_file`.
    V1,
}

/// Where the daemon's memory is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meter {
    /// The cgroup's directory.
    pub dir: PathBuf,
    /// Its interface.
    pub version: Version,
    /// The limit in bytes; `None`: the cgroup has none.
    pub limit: Option<u64>,
}

/// A cgroup mount: its mount point and the path of the hierarchy mounted there.
pub type Mount = (String, String);

/// The mount points of the memory hierarchies, from `/proc/self/mountinfo`: (v2, v1's memory
/// controller). Pure.
pub fn parse_mountinfo(text: &str) -> (Option<Mount>, Option<Mount>) {
    let (mut v2, mut v1) = (None, None);
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(point), Some(fstype)) = (left.get(3), left.get(4), right.first())
        else {
            continue;
        };
        let options = right.get(2).copied().unwrap_or("");
        match *fstype {
            "cgroup2" if v2.is_none() => v2 = Some(((*point).to_owned(), (*root).to_owned())),
            "cgroup" if v1.is_none() && options.split(',').any(|o| o == "memory") => {
                v1 = Some(((*point).to_owned(), (*root).to_owned()));
            }
            _ => {}
        }
    }
    (v2, v1)
}

/// The daemon's cgroup paths from `/proc/self/cgroup`: (v2 path, v1 memory path). Pure.
pub fn parse_proc_cgroup(text: &str) -> (Option<String>, Option<String>) {
    let (mut v2, mut v1) = (None, None);
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2 = Some(path.to_owned());
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_owned());
        }
    }
    (v2, v1)
}

/// A limit file's value: `None` for `max` or v1's "unlimited". Pure.
pub fn parse_limit(text: &str) -> Option<u64> {
    let text = text.trim();
    if text == "max" {
        return None;
    }
    text.parse::<u64>().ok().filter(|&v| v < UNLIMITED)
}

/// The value of `key` in a `memory.stat`. Pure.
pub fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// `path` (from `/proc/self/cgroup`) under the mount `point` whose hierarchy root is `root`.
fn under(sys: &Path, point: &str, root: &str, path: &str) -> PathBuf {
    let rel = if root == "/" {
        path
    } else {
        path.strip_prefix(root).unwrap_or(path)
    };
    let mut dir = sys.join(point.trim_start_matches('/'));
    for part in rel.split('/').filter(|p| !p.is_empty()) {
        dir.push(part);
    }
    dir
}

impl Meter {
    /// The daemon's memory cgroup, with `sys` as the file system's root (`/` on a node);
    /// `None` when no memory controller is found.
    pub fn discover(sys: &Path, mountinfo: &str, proc_cgroup: &str) -> Option<Self> {
        let (v2_mount, v1_mount) = parse_mountinfo(mountinfo);
        let (v2_path, v1_path) = parse_proc_cgroup(proc_cgroup);
        let candidates = [
            v1_mount.zip(v1_path).map(|((point, root), path)| {
                (
                    under(sys, &point, &root, &path),
                    sys.join(point.trim_start_matches('/')),
                    Version::V1,
                )
            }),
            v2_mount.zip(v2_path).map(|((point, root), path)| {
                (
                    under(sys, &point, &root, &path),
                    sys.join(point.trim_start_matches('/')),
                    Version::V2,
                )
            }),
        ];
        for (dir, top, version) in candidates.into_iter().flatten() {
            // A cgroup namespace can hide the path: the mount's top is then the cgroup.
            let dir = if dir.join(version.usage_file()).exists() {
                dir
            } else if top.join(version.usage_file()).exists() {
                top.clone()
            } else {
                continue;
            };
            let mut limit: Option<u64> = None;
            let mut at = Some(dir.as_path());
            while let Some(d) = at {
                if let Some(l) = std::fs::read_to_string(d.join(version.limit_file()))
                    .ok()
                    .as_deref()
                    .and_then(parse_limit)
                {
                    limit = Some(limit.map_or(l, |m| m.min(l)));
                }
                if d == top {
                    break;
                }
                at = d.parent().filter(|p| p.starts_with(&top));
            }
            return Some(Self {
                dir,
                version,
                limit,
            });
        }
        None
    }

    /// The memory in use now: the charge less the inactive file cache.
    pub fn used(&self) -> std::io::Result<u64> {
        let usage = std::fs::read_to_string(self.dir.join(self.version.usage_file()))?;
        let usage: u64 = usage
            .trim()
            .parse()
            .map_err(|e| std::io::Error::other(format!("{}: {e}", self.version.usage_file())))?;
        let stat = std::fs::read_to_string(self.dir.join("memory.stat")).unwrap_or_default();
        let inactive = stat_value(&stat, self.version.inactive_key()).unwrap_or(0);
        Ok(usage.saturating_sub(inactive))
    }
}

impl Version {
    fn limit_file(self) -> &'static str {
        match self {
            Self::V2 => "memory.max",
            Self::V1 => "memory.limit_in_bytes",
        }
    }

    fn usage_file(self) -> &'static str {
        match self {
            Self::V2 => "memory.current",
            Self::V1 => "memory.usage_in_bytes",
        }
    }

    fn inactive_key(self) -> &'static str {
        match self {
            Self::V2 => "inactive_file",
            Self::V1 => "total_inactive_file",
        }
    }
}

/// The process's resident memory, for a limit given by setting where no cgroup is read.
fn resident() -> std::io::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| std::io::Error::other("/proc/self/statm: no resident field"))?;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
        .unwrap_or(4096);
    Ok(pages * page)
}

/// What the monitor measures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// The cgroup, if one was found.
    pub meter: Option<Meter>,
    /// The limit in bytes: the setting's, else the cgroup's; `None`: nothing is shed by memory.
    pub limit: Option<u64>,
}

impl Source {
    /// The daemon's own: `configured` (`overload_memory_limit_bytes`, 0: the cgroup's).
    pub fn of_this_process(configured: u64) -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let meter = Meter::discover(
            Path::new("/"),
            &read("/proc/self/mountinfo"),
            &read("/proc/self/cgroup"),
        );
        let limit = if configured > 0 {
            Some(configured)
        } else {
            meter.as_ref().and_then(|m| m.limit)
        };
        Self { meter, limit }
    }

    fn used(&self) -> std::io::Result<u64> {
        match &self.meter {
            Some(m) => m.used(),
            None => resident(),
        }
    }
}

/// How often the monitor looks again for its cgroup and limit: a process can be moved to
/// another cgroup, and a limit changed in place (a pod resized).
pub const REDISCOVER: Duration = Duration::from_secs(2);

/// How often the memory is read while over the refuse threshold: a flood grows fast.
pub const PRESSED_INTERVAL: Duration = Duration::from_millis(20);

/// The least time between two sheds: what one freed must show in the reading before the next
/// decides (read every 20 ms, a level that lags its shed closed every idle connection).
pub const SHED_SPACING: Duration = Duration::from_millis(250);

/// Start the monitor on a thread of its own: it must act while the runtime's thread is busiest
/// (a flood keeps it so), so it is never queued behind the work it sheds.
pub fn spawn_monitor(
    overload: Arc<Overload>,
    configured: u64,
    th: Thresholds,
    interval: Duration,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("aether-memory".into())
        .spawn(move || monitor(&overload, configured, th, interval))
        .map(drop)
}

/// Read the memory every `interval` (every [`PRESSED_INTERVAL`] over the refuse threshold)
/// and set `overload`'s level; at the critical level, shed what brings the use back under the
/// refuse threshold. The cgroup and its limit are looked up again every [`REDISCOVER`]. A
/// change of level or of limit is logged once with its figures; a memory file that stops
/// reading is logged once and leaves the level where it was.
fn monitor(overload: &Overload, configured: u64, th: Thresholds, interval: Duration) {
    let mut source = Source::of_this_process(configured);
    announce(overload, &source, th);
    let mut found_at = crate::time::now();
    let mut failing = false;
    let mut last_shed: Option<std::time::Instant> = None;
    loop {
        let pause = if overload.level() > Level::Normal {
            PRESSED_INTERVAL.min(interval)
        } else {
            interval
        };
        std::thread::sleep(pause);
        if found_at.elapsed() >= REDISCOVER {
            found_at = crate::time::now();
            let fresh = Source::of_this_process(configured);
            if fresh != source {
                source = fresh;
                announce(overload, &source, th);
            }
        }
        let Some(limit) = source.limit else {
            overload.set_level(Level::Normal);
            continue;
        };
        let used = match source.used() {
            Ok(u) => {
                if failing {
                    tracing::info!("overload manager: the memory in use reads again");
                    failing = false;
                }
                u
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "overload manager: the memory in use does not read; the level stays as it was");
                    failing = true;
                }
                continue;
            }
        };
        overload
            .used_bytes
            .set(i64::try_from(used).unwrap_or(i64::MAX));
        let was = overload.level();
        let level = next_level(used, limit, th, was);
        if level != was {
            overload.set_level(level);
            let percent = used.saturating_mul(100) / limit.max(1);
            if level > was {
                tracing::warn!(
                    used,
                    limit,
                    percent,
                    level = level.as_str(),
                    from = was.as_str(),
                    "memory over the overload threshold: shedding"
                );
            } else {
                tracing::info!(
                    used,
                    limit,
                    percent,
                    level = level.as_str(),
                    from = was.as_str(),
                    "memory under the overload threshold again"
                );
            }
        }
        if level == Level::Critical && last_shed.is_none_or(|t| t.elapsed() >= SHED_SPACING) {
            last_shed = Some(crate::time::now());
            // What is over the line where new connections are taken again.
            let line = limit / 100 * th.refuse_percent.saturating_sub(HYSTERESIS_PERCENT);
            let (partial, idle) = overload.shed_some(used.saturating_sub(line));
            tracing::debug!(partial, idle, used, "memory critical: connections shed");
        }
    }
}

/// Say what the overload manager measures against, and show the limit on `/metrics`.
fn announce(overload: &Overload, source: &Source, th: Thresholds) {
    let cgroup = source.meter.as_ref().map(|m| m.dir.display().to_string());
    overload.limit_bytes.set(
        source
            .limit
            .map_or(0, |l| i64::try_from(l).unwrap_or(i64::MAX)),
    );
    match source.limit {
        Some(limit) => tracing::info!(
            limit,
            ?cgroup,
            refuse_percent = th.refuse_percent,
            shed_percent = th.shed_percent,
            "overload manager: memory measured against its limit"
        ),
        None => tracing::info!(
            ?cgroup,
            "overload manager: no memory limit (cgroup or overload_memory_limit_bytes): nothing is shed by memory"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO_V1: &str = "\
24 30 0:22 / /sys type sysfs rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 24 0:26 / /sys/fs/cgroup type tmpfs ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
36 31 0:31 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
37 31 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,cpu,cpuacct
";

    const MOUNTINFO_V2: &str = "\
29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
";

    #[test]
    fn the_files_of_both_versions_parse() {
        assert_eq!(
            parse_mountinfo(MOUNTINFO_V1),
            (
                Some(("/sys/fs/cgroup/unified".into(), "/".into())),
                Some(("/sys/fs/cgroup/memory".into(), "/".into()))
            )
        );
        assert_eq!(
            parse_proc_cgroup("4:memory:/kubepods/pod1/c1\n2:cpu,cpuacct:/x\n0::/\n"),
            (Some("/".into()), Some("/kubepods/pod1/c1".into()))
        );
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("268435456\n"), Some(268_435_456));
        assert_eq!(parse_limit("lots"), None);
        let stat = "anon 100\nfile 50\ninactive_file 30\ntotal_inactive_file 40\n";
        assert_eq!(stat_value(stat, "inactive_file"), Some(30));
        assert_eq!(stat_value(stat, "total_inactive_file"), Some(40));
        assert_eq!(stat_value(stat, "inactive_anon"), None);
    }

    /// A directory of its own under the temporary directory, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("aether-memory-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn write(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    #[test]
    fn v2_takes_the_smallest_limit_on_the_way_up_and_subtracts_inactive_file() {
        let sys = Scratch::new("v2");
        let top = sys.path().join("sys/fs/cgroup");
        write(&top, &[("memory.max", "max\n")]);
        write(&top.join("kubepods"), &[("memory.max", "1073741824\n")]);
        let pod = top.join("kubepods/pod1");
        write(&pod, &[("memory.max", "268435456\n")]);
        let c = pod.join("c1");
        write(
            &c,
            &[
                ("memory.max", "max\n"),
                ("memory.current", "200000000\n"),
                ("memory.stat", "anon 150000000\ninactive_file 50000000\n"),
            ],
        );
        let m = Meter::discover(sys.path(), MOUNTINFO_V2, "0::/kubepods/pod1/c1\n").unwrap();
        assert_eq!(m.version, Version::V2);
        assert_eq!(m.dir, c);
        assert_eq!(m.limit, Some(268_435_456));
        assert_eq!(m.used().unwrap(), 150_000_000);
    }

    #[test]
    fn v1_memory_controller_is_read_where_it_is_mounted_and_a_hidden_path_falls_back_to_the_mount()
    {
        let sys = Scratch::new("v1");
        let top = sys.path().join("sys/fs/cgroup/memory");
        write(&top, &[("memory.limit_in_bytes", "9223372036854771712\n")]);
        let c = top.join("aether-overload");
        write(
            &c,
            &[
                ("memory.limit_in_bytes", "268435456\n"),
                ("memory.usage_in_bytes", "100000000\n"),
                ("memory.stat", "cache 10\ntotal_inactive_file 1000000\n"),
            ],
        );
        let m = Meter::discover(
            sys.path(),
            MOUNTINFO_V1,
            "4:memory:/aether-overload\n0::/\n",
        )
        .unwrap();
        assert_eq!((m.version, m.limit), (Version::V1, Some(268_435_456)));
        assert_eq!(m.used().unwrap(), 99_000_000);
        // A cgroup namespace shows a path the mount does not have: the mount's top is the cgroup.
        write(
            &top,
            &[
                ("memory.usage_in_bytes", "5\n"),
                ("memory.stat", "total_inactive_file 1\n"),
            ],
        );
        let m = Meter::discover(sys.path(), MOUNTINFO_V1, "4:memory:/elsewhere\n").unwrap();
        assert_eq!((m.dir, m.limit), (top, None));
        // No memory controller at all.
        assert_eq!(Meter::discover(sys.path(), "", "0::/\n"), None);
    }
}
