//! The one rule for tests that need root, network namespaces and nftables (STYLE.md §6.6).
//!
//! When this machine cannot run such a test: with `AETHER_REQUIRE_NETNS=1` (set by `.ci/run`) the
//! test **fails** and says why; otherwise it prints `SKIPPED: <test>: <why>` to stderr, appends
//! the same line to the file named by `AETHER_SKIP_LOG` (set by `scripts/test`, which counts the
//! lines in its closing summary, since cargo captures a passing test's output), and the test
//! returns. A test never passes silently without running. Nothing else (`CI`, for instance) is
//! read.
//!
//! Self-contained (std and nix only): `tests/e2e_local.rs` includes this file by path, so that the
//! integration test needs no `testing` feature.

use std::io::Write as _;

/// Set to `1` to make a test that cannot get root, namespaces or its programs fail.
pub const REQUIRE_VAR: &str = "AETHER_REQUIRE_NETNS";
/// A file to which each skip appends its `SKIPPED: ...` line.
pub const SKIP_LOG_VAR: &str = "AETHER_SKIP_LOG";

/// Why this machine cannot run a test that needs root and `programs` (looked up on `PATH`), or
/// `None` when it can.
pub fn missing(programs: &[&str]) -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root (network namespaces, nftables)".to_owned());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    programs
        .iter()
        .find(|p| !std::env::split_paths(&path).any(|dir| dir.join(p).is_file()))
        .map(|p| format!("`{p}` is not installed"))
}

/// Reports that `test` cannot run because of `why`: panics when `AETHER_REQUIRE_NETNS=1`,
/// otherwise records the skip. Returns true, for `if skip(..) { return; }`.
#[allow(clippy::print_stderr)] // The harness's skip notice (STYLE.md §6.8).
pub fn skip(test: &str, why: &str) -> bool {
    let required = std::env::var_os(REQUIRE_VAR).is_some_and(|v| v == "1");
    assert!(!required, "{test} cannot run and {REQUIRE_VAR}=1: {why}");
    let line = format!("SKIPPED: {test}: {why}");
    eprintln!("{line}");
    if let Some(log) = std::env::var_os(SKIP_LOG_VAR).filter(|v| !v.is_empty()) {
        // One short append per skip: O_APPEND keeps parallel tests' lines whole.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = written {
            eprintln!("cannot record the skip in {}: {e}", log.to_string_lossy());
        }
    }
    true
}

/// True when `test` must return because root or one of `programs` is missing (after
/// [`skip`]); panics instead under `AETHER_REQUIRE_NETNS=1`.
pub fn cannot_run(test: &str, programs: &[&str]) -> bool {
    missing(programs).is_some_and(|why| skip(test, &why))
}
