//! Root-only: `aether demo` takes everything down on SIGTERM as it does on Ctrl-C, in whichever
//! phase the signal finds it, and a second signal does not cut the cleanup short. Each test runs
//! `aether demo --no-legs` on `tests/fixtures/lab-hairpin` (one node, one daemon, one echo) with
//! its own prefixes and run directory, signals it, and checks that its namespaces, `/etc/netns`
//! entries, state file and child processes are gone and that it exits as docs/demo.md says: 0
//! when the mesh was up (a signal is how `--no-legs` ends), 128 + the signal's number when the
//! signal came while it was still building.
//!
//! Without root, `ip`, `nft` or `nsenter` it prints SKIPPED, or fails under
//! `AETHER_REQUIRE_NETNS=1` (`src/test_util/needs_root.rs`).

#![allow(clippy::unwrap_used)] // Tests unwrap: a panic is the failure report (STYLE.md §6.4).

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use aether::test_util::needs_root;

const PROGRAMS: &[&str] = &["ip", "nft", "nsenter"];

/// A running `aether demo --no-legs`, signalled (and so cleaned up) on drop if a test fails.
struct Demo {
    child: Child,
    prefix: String,
    run_dir: PathBuf,
    lines: mpsc::Receiver<String>,
    stdout: Vec<String>,
    /// Every process the state file recorded while the demo ran, as (pid, start time).
    recorded: mpsc::Receiver<(i32, u64)>,
}

impl Demo {
    fn start(prefix: &str) -> Self {
        let run_dir = std::env::temp_dir().join(format!("aether-{prefix}-run"));
        // What a failed earlier run left: its state file would look like this run's start.
        aether_lab::lab::Lab::cleanup_stale(&run_dir, Duration::from_secs(1)).unwrap();
        let _ = std::fs::create_dir_all(&run_dir);
        let stderr = std::fs::File::create(run_dir.with_extension("stderr")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_aether"))
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .args([
                "demo",
                "--no-legs",
                "--registry",
                "tests/fixtures/lab-hairpin",
            ])
            .args(["--prefix", prefix, "--netns-prefix", &format!("{prefix}-")])
            .arg("--run-dir")
            .arg(&run_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start aether demo");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // The state file is rewritten the moment a process starts; polling it catches every
        // process the demo started, also those of a build that a signal cut short.
        let (tx, recorded) = mpsc::channel();
        let state = run_dir.join("lab-state.json");
        let pid = child.id();
        std::thread::spawn(move || {
            let mut seen = std::collections::BTreeSet::new();
            while Path::new(&format!("/proc/{pid}")).exists() {
                for p in recorded_processes(&state) {
                    if seen.insert(p) && tx.send(p).is_err() {
                        return;
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Self {
            child,
            prefix: prefix.to_owned(),
            run_dir,
            lines,
            stdout: Vec::new(),
            recorded,
        }
    }

    /// The processes the demo recorded so far.
    fn processes(&self) -> Vec<(i32, u64)> {
        self.recorded.try_iter().collect()
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap())
    }

    /// Reads stdout until a line contains `text` (at most `bound`).
    fn wait_for_line(&mut self, text: &str, bound: Duration) {
        let deadline = aether::time::now() + bound;
        loop {
            let left = deadline.saturating_duration_since(aether::time::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(text);
                    self.stdout.push(line);
                    if found {
                        return;
                    }
                }
                Err(e) => panic!(
                    "no {text:?} on stdout ({e}); so far:\n{}\nstderr: {}",
                    self.stdout.join("\n"),
                    self.stderr()
                ),
            }
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.run_dir.with_extension("stderr")).unwrap_or_default()
    }

    /// Waits for the demo to exit (at most 30 s) and collects the rest of its stdout.
    fn wait(&mut self) -> ExitStatus {
        let deadline = aether::time::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                aether::time::now() < deadline,
                "the demo did not exit within 30 s of the signal"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(1)) {
            self.stdout.push(line);
        }
        status
    }

    /// Asserts that nothing of this run is left: namespaces and `/etc/netns` entries with its
    /// prefix, its state file, and the processes in `processes`.
    fn assert_nothing_left(&self, processes: &[(i32, u64)]) {
        let ours = |dir: &str| -> Vec<String> {
            std::fs::read_dir(dir)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n.starts_with(&format!("{}-", self.prefix)))
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(
            ours(aether::netns::NETNS_DIR),
            Vec::<String>::new(),
            "namespaces left"
        );
        assert_eq!(
            ours("/etc/netns"),
            Vec::<String>::new(),
            "/etc/netns entries left"
        );
        assert!(
            !self.run_dir.join("lab-state.json").exists(),
            "the state file is left"
        );
        for &(pid, start) in processes {
            assert_ne!(
                start_time(pid),
                Some(start),
                "process {pid} outlived the demo"
            );
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        // A failed test must not leave a mesh up: SIGTERM is the path under test, and the
        // demo's own cleanup is the one that knows what it made.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = kill(self.pid(), Signal::SIGTERM);
            let _ = self.child.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.run_dir);
            let _ = std::fs::remove_file(self.run_dir.with_extension("stderr"));
        }
    }
}

/// The processes the state file at `path` records: (pid, start time); none when it is absent
/// or half-written.
fn recorded_processes(path: &Path) -> Vec<(i32, u64)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let Ok(state) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    state["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some((
                i32::try_from(p["pid"].as_i64()?).ok()?,
                p["start_time"].as_u64()?,
            ))
        })
        .collect()
}

/// Field 22 of `/proc/<pid>/stat`, `None` when the process is gone or a zombie.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

#[test]
fn sigterm_takes_a_running_demo_down_and_a_second_signal_does_not_cut_the_cleanup_short() {
    if needs_root::cannot_run(
        "sigterm_takes_a_running_demo_down_and_a_second_signal_does_not_cut_the_cleanup_short",
        PROGRAMS,
    ) {
        return;
    }
    let mut demo = Demo::start("labsigup");
    demo.wait_for_line("The mesh is up", Duration::from_secs(60));
    let processes = recorded_processes(&demo.run_dir.join("lab-state.json"));
    assert_eq!(processes.len(), 2, "the daemon of node-h and hp-echo-0");
    for &(pid, start) in &processes {
        assert_eq!(start_time(pid), Some(start), "process {pid} is not running");
    }

    kill(demo.pid(), Signal::SIGTERM).unwrap();
    // A second signal while the first one's cleanup runs (stopping the processes alone takes
    // a few milliseconds): it must be ignored, not end the demo halfway.
    std::thread::sleep(Duration::from_millis(5));
    let second = kill(demo.pid(), Signal::SIGINT);
    let status = demo.wait();
    let stdout = demo.stdout.join("\n");
    assert_eq!(
        status.code(),
        Some(0),
        "{status}\n{stdout}\nstderr: {}",
        demo.stderr()
    );
    assert!(
        stdout.contains("Removed everything the demo made"),
        "{stdout}"
    );
    if second.is_ok() {
        assert!(
            demo.stderr().contains("already stopping"),
            "the second signal was not reported: {}",
            demo.stderr()
        );
    }
    let mut processes = processes;
    processes.extend(demo.processes());
    demo.assert_nothing_left(&processes);
}

#[test]
fn sigterm_while_the_demo_builds_removes_what_it_made_and_exits_143() {
    if needs_root::cannot_run(
        "sigterm_while_the_demo_builds_removes_what_it_made_and_exits_143",
        PROGRAMS,
    ) {
        return;
    }
    let mut demo = Demo::start("labsigbuild");
    // The state file is written as the build starts, before the first namespace.
    let state = demo.run_dir.join("lab-state.json");
    let deadline = aether::time::now() + Duration::from_secs(60);
    while !state.exists() {
        assert!(aether::time::now() < deadline, "the build never started");
        assert!(demo.child.try_wait().unwrap().is_none(), "the demo exited");
        std::thread::sleep(Duration::from_millis(1));
    }
    kill(demo.pid(), Signal::SIGTERM).unwrap();
    let status = demo.wait();
    let stdout = demo.stdout.join("\n");
    let processes = demo.processes();
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "{status}\n{stdout}\nstderr: {}",
        demo.stderr()
    );
    assert!(
        stdout.contains("Stopped by SIGTERM while building"),
        "{stdout}"
    );
    assert!(!stdout.contains("The mesh is up"), "{stdout}");
    demo.assert_nothing_left(&processes);
}
