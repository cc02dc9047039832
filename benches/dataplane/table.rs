//! The report: the median round of every figure as one markdown table with its ratio to
//! direct, the proxies' cost per unit as a second, the machine, the load and the commit; and
//! its place in docs/performance.md.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};

use crate::load::Sample;
use crate::procfs;
use crate::{CLIENT_LIMIT, Kind, Row, Settings};

const BEGIN: &str = "<!-- dataplane-table:begin -->";
const END: &str = "<!-- dataplane-table:end -->";

/// What the report says of the run besides the figures.
pub(crate) struct Run {
    pub(crate) binary: PathBuf,
    pub(crate) load_before: String,
    pub(crate) load_after: String,
}

/// The 1, 5 and 15 minute load averages.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// One sample as the progress lines show it.
pub(crate) fn line(kind: Kind, s: &Sample) -> String {
    let rate = match kind {
        Kind::Tcp => format!("{:>8.1} MiB/s", s.rate),
        Kind::NewConn => format!("{:>8.0} conn/s", s.rate),
        _ => format!("{:>8.0} req/s", s.rate),
    };
    let lat = if kind == Kind::Sequential {
        format!("  p50 {:>6.1} µs  p99 {:>6.1} µs", s.p50_us, s.p99_us)
    } else {
        String::new()
    };
    let cost = cost(s).map_or(String::new(), |(us, sw)| {
        format!(
            "  proxy {us:.1} µs CPU, {sw:.2} switches per {}",
            kind.unit()
        )
    });
    format!("{rate}{lat}  client CPU {:.2}{cost}", s.client_cpu)
}

/// The metered processes' CPU µs and context switches per unit; `None` for no process.
fn cost(s: &Sample) -> Option<(f64, f64)> {
    if s.units <= 0.0 || (s.work.ticks == 0 && s.work.switches == 0) {
        return None;
    }
    thread_local! {
        static TICK_US: f64 = procfs::tick_us();
    }
    let tick = TICK_US.with(|t| *t);
    Some((
        s.work.ticks as f64 * tick / s.units,
        s.work.switches as f64 / s.units,
    ))
}

fn median(xs: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = xs.collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// `12345.6` as `12,346`.
fn thousands(x: f64) -> String {
    let n = x.round() as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_default();
    format!("{cores} cores ({cpu}), kernel {}", kernel.trim())
}

fn command(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "?".into())
}

/// `git rev-parse --short HEAD`, with `-dirty` when the tree has changes.
fn commit() -> String {
    let head = command("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = command("git", &["status", "--porcelain", "--untracked-files=no"]);
    if dirty.is_empty() {
        head
    } else {
        format!("{head}-dirty")
    }
}

/// The median of `f` over a row's samples of `kind`.
fn med(row: &Row, kind: Kind, f: impl Fn(&Sample) -> f64) -> Option<f64> {
    median(row.samples[kind.index()].iter().map(f))
}

/// The report, as markdown.
pub(crate) fn render(rows: &[Row], skipped: &[String], s: &Settings, run: &Run) -> String {
    let mut out = String::new();
    let own = run.binary == Path::new(env!("CARGO_BIN_EXE_aether"));
    let binary = if own {
        "this tree's, bench profile".to_owned()
    } else {
        format!("`{}` (`AETHER_BENCH_BINARY`)", run.binary.display())
    };
    let _ = writeln!(
        out,
        "Run {} UTC on {}; commit `{}`; daemon binary: {binary}; load average {} before, {} \
         after (1, 5, 15 min).",
        command("date", &["-u", "+%Y-%m-%d %H:%M"]),
        machine(),
        commit(),
        run.load_before,
        run.load_after
    );
    let idle = if s.memory_connections == 0 {
        "idle memory: not measured (`AETHER_BENCH_MEMORY_CONNECTIONS=0`)".to_owned()
    } else {
        format!(
            "idle memory: {} connections held, RSS growth of the proxy's processes (both daemons \
             for aether) per connection, and the share returned {} s after the close",
            s.memory_connections,
            s.settle.as_secs()
        )
    };
    let _ = writeln!(
        out,
        "\nMedian of {} rounds (every figure on every row back to back, the order reversed every \
         other round); in parentheses the ratio to direct to the same pod. Raw TCP: {} MiB \
         written and read back; {} conns: keep-alive HTTP/1.1 for {} s; 1 conn: {} sequential \
         requests; h2c and gRPC: {} concurrent streams on one HTTP/2 connection; new conn: \
         connect, one GET, close, {} at a time; {idle}.\n",
        s.rounds,
        s.bulk_bytes >> 20,
        s.connections,
        s.rate_time.as_secs(),
        s.sequential,
        s.streams,
        s.new_conn_parallel,
    );
    let _ = writeln!(
        out,
        "| path | raw TCP stream | req/s, {c} conns | req/s, 1 conn | added p50, 1 conn | added \
         p99, 1 conn | h2c req/s, {st} streams | gRPC req/s, {st} streams | new conn/s | KiB per \
         idle connection (returned after close) |",
        c = s.connections,
        st = s.streams
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let base = row.base.and_then(|b| rows.get(b));
        let rate = |kind: Kind| -> String {
            let Some(v) = med(row, kind, |x| x.rate) else {
                return "—".into();
            };
            let shown = if kind == Kind::Tcp {
                format!("{v:.0} MiB/s")
            } else {
                thousands(v)
            };
            match base.and_then(|b| med(b, kind, |x| x.rate)) {
                Some(d) if d > 0.0 => format!("{shown} ({:.2}×)", v / d),
                _ => shown,
            }
        };
        let lat = |f: fn(&Sample) -> f64| -> String {
            let Some(v) = med(row, Kind::Sequential, f) else {
                return "—".into();
            };
            match base.and_then(|b| med(b, Kind::Sequential, f)) {
                Some(d) => format!("{:+.0} µs", v - d),
                None => format!("{v:.0} µs (itself)"),
            }
        };
        let idle = row.idle.map_or("—".into(), |i| {
            format!(
                "{:.1}, {:.0} % returned",
                i.kib_per_conn,
                i.returned * 100.0
            )
        });
        let cells = [
            row.name.clone(),
            rate(Kind::Tcp),
            rate(Kind::Conns),
            rate(Kind::Sequential),
            lat(|x| x.p50_us),
            lat(|x| x.p99_us),
            rate(Kind::H2c),
            rate(Kind::Grpc),
            rate(Kind::NewConn),
            idle,
        ];
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }

    let _ = writeln!(
        out,
        "\nThe proxy's cost (median): CPU time (`utime + stime` of `/proc/<pid>/stat`) and context \
         switches (every thread's `voluntary_ctxt_switches + nonvoluntary_ctxt_switches`) of both \
         aether daemons, or of nginx's or haproxy's processes, per request (per connection, per \
         MiB for raw TCP), as µs / switches. CPU time is counted in clock ticks of {:.0} µs, so \
         a figure is good to about two ticks over its units (the 1-conn figure: {:.0} µs per \
         request).\n",
        procfs::tick_us(),
        2.0 * procfs::tick_us() / s.sequential as f64
    );
    let _ = writeln!(
        out,
        "| path | raw TCP, per MiB | {c} conns, per req | 1 conn, per req | h2c, per req | gRPC, \
         per req | new conn, per conn |",
        c = s.connections
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for row in rows.iter().filter(|r| r.base.is_some()) {
        let cell = |kind: Kind| -> String {
            let us = med(row, kind, |x| cost(x).map_or(f64::NAN, |c| c.0));
            let sw = med(row, kind, |x| cost(x).map_or(f64::NAN, |c| c.1));
            match (us, sw) {
                (Some(us), Some(sw)) if us.is_finite() => format!("{us:.1} µs / {sw:.2}"),
                _ => "—".into(),
            }
        };
        let cells: Vec<String> = std::iter::once(row.name.clone())
            .chain(Kind::ALL.map(cell))
            .collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }

    // The load generator: its share of a core on each direct figure.
    let mut shares = Vec::new();
    let mut near = Vec::new();
    for kind in Kind::ALL {
        let share = rows
            .iter()
            .filter(|r| r.base.is_none())
            .filter_map(|r| med(r, kind, |x| x.client_cpu))
            .fold(0.0, f64::max);
        shares.push(format!("{} {share:.2}", name(kind, s)));
        if share > CLIENT_LIMIT {
            near.push(name(kind, s));
        }
    }
    let _ = writeln!(
        out,
        "\nThe client (one thread) used, of one core, on the direct rows (the busier of the two): \
         {}.",
        shares.join(", ")
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let busiest_load = [&run.load_before, &run.load_after]
        .iter()
        .filter_map(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .fold(0.0, f64::max);
    let busy = busiest_load > cores as f64 + 1.0;
    if near.is_empty() && !busy {
        let _ = writeln!(
            out,
            "It stayed below {CLIENT_LIMIT:.2} of a core on every kind of load: it is not what \
             limits the direct figures."
        );
    } else if near.is_empty() {
        let _ = writeln!(
            out,
            "It stayed below {CLIENT_LIMIT:.2} of a core on every kind of load, but the machine \
             was busy (load average {busiest_load:.1} on {cores} cores, the benchmark itself \
             accounting for about 2): a share below the limit may be CPU the client waited \
             for, and every figure is noisier than on an idle machine."
        );
    } else {
        let _ = writeln!(
            out,
            "**Near its limit** (above {CLIENT_LIMIT:.2} of a core) on: {}. There the direct \
             figures (and the ratios to them) are lower bounds for the direct path.",
            near.join(", ")
        );
    }
    for n in rows.iter().flat_map(|r| &r.notes) {
        let _ = writeln!(out, "\n{n}.");
    }
    for n in skipped {
        let _ = writeln!(out, "\n`{n}`");
    }
    out
}

fn name(kind: Kind, s: &Settings) -> String {
    match kind {
        Kind::Tcp => "raw TCP".into(),
        Kind::Conns => format!("{} conns", s.connections),
        Kind::Sequential => "1 conn".into(),
        Kind::H2c => "h2c".into(),
        Kind::Grpc => "gRPC".into(),
        Kind::NewConn => "new conn".into(),
    }
}

/// Replaces what lies between the markers of `docs` with `text`.
pub(crate) fn write_docs(docs: &Path, text: &str) -> Result<()> {
    let old = std::fs::read_to_string(docs).with_context(|| format!("read {}", docs.display()))?;
    let (Some(begin), Some(end)) = (old.find(BEGIN), old.find(END)) else {
        anyhow::bail!("{} lacks the markers {BEGIN} and {END}", docs.display());
    };
    ensure!(begin < end, "{END} before {BEGIN} in {}", docs.display());
    let new = format!("{}{BEGIN}\n{}\n{}", &old[..begin], text.trim(), &old[end..]);
    std::fs::write(docs, new).with_context(|| format!("write {}", docs.display()))
}
