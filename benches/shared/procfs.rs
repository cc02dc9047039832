//! What the benchmarks read of a process from `/proc`: its resident set and open descriptors
//! (the memory benchmark's method), and its CPU time and context switches (the data-plane
//! benchmark's cost per request). Included by both with `#[path]`.

use anyhow::{Context, Result};

/// A process's memory, at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Memory {
    /// `VmRSS` of `/proc/<pid>/status`.
    pub(crate) rss_kib: u64,
    /// Entries of `/proc/<pid>/fd`.
    #[allow(
        dead_code,
        reason = "the data-plane benchmark reads the resident set only"
    )]
    pub(crate) fds: usize,
}

/// `VmRSS` and the open descriptors of `pid`.
pub(crate) fn memory(pid: u32) -> Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    Ok(Memory { rss_kib, fds })
}

/// A process's work so far: CPU time and context switches, summed over its threads.
#[allow(dead_code, reason = "the memory benchmark reads memory only")]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Work {
    /// `utime + stime` of `/proc/<pid>/stat`, in clock ticks (every thread, live or gone).
    pub(crate) ticks: u64,
    /// `voluntary_ctxt_switches + nonvoluntary_ctxt_switches` of every live thread's
    /// `/proc/<pid>/task/<tid>/status` (a thread that has exited takes its count with it).
    pub(crate) switches: u64,
}

#[allow(dead_code, reason = "the memory benchmark reads memory only")]
impl Work {
    /// What `later` did since `self`.
    pub(crate) fn since(self, earlier: Self) -> Self {
        Self {
            ticks: self.ticks.saturating_sub(earlier.ticks),
            switches: self.switches.saturating_sub(earlier.switches),
        }
    }

    /// The sum of two processes' work.
    pub(crate) fn plus(self, other: Self) -> Self {
        Self {
            ticks: self.ticks + other.ticks,
            switches: self.switches + other.switches,
        }
    }
}

/// The work of `pid` so far.
#[allow(dead_code, reason = "the memory benchmark reads memory only")]
pub(crate) fn work(pid: u32) -> Result<Work> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    // The fields after the command (which is in parentheses and may hold spaces): state is
    // field 3, utime 14 and stime 15.
    let rest = stat.rsplit_once(')').context("no ')' in stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| -> Result<u64> {
        fields
            .get(i - 3)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("field {i} of /proc/{pid}/stat"))
    };
    let ticks = tick(14)? + tick(15)?;
    let mut switches = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        // A thread may exit between the listing and the read.
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        switches += status
            .lines()
            .filter_map(|l| {
                l.strip_prefix("voluntary_ctxt_switches:")
                    .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            })
            .filter_map(|v| v.trim().parse::<u64>().ok())
            .sum::<u64>();
    }
    Ok(Work { ticks, switches })
}

/// Microseconds per clock tick of `/proc/<pid>/stat` (`getconf CLK_TCK`; 100 per second when
/// that cannot be read, Linux's `USER_HZ` on every common architecture).
#[allow(dead_code, reason = "the memory benchmark reads memory only")]
pub(crate) fn tick_us() -> f64 {
    let hz = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|&hz| hz > 0.0)
        .unwrap_or(100.0);
    1e6 / hz
}
