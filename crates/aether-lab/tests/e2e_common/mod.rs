//! What the local e2e runs share: `aether demo --check` with the run's own prefixes and run
//! directory, the leg table shown, and every leg's result checked.

use std::process::Command;

/// Runs `aether demo --check` with `args` in a run directory of its own, prints the leg table,
/// and asserts that the demo succeeded, that at least `min_legs` legs ran, that every leg passed
/// and none was skipped, and that each of `ids` ran.
#[allow(clippy::print_stdout)] // The leg table is what the run shows (with --nocapture).
pub(crate) fn demo_check(run_name: &str, args: &[&str], min_legs: usize, ids: &[&str]) {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    // One run directory per suite, the same every run: a run that was killed (CI's timeout, a
    // machine restart) left its state file there, and this run's start removes what it
    // recorded (namespaces, `/etc/netns` entries, processes) instead of failing on it. The
    // suites' prefixes differ, and cargo runs them one at a time.
    let run_dir = std::env::temp_dir().join(run_name);
    let json = run_dir.with_extension("json");
    let out = Command::new(env!("CARGO_BIN_EXE_aether"))
        .current_dir(root)
        .args(["demo", "--check"])
        .args(args)
        .arg("--run-dir")
        .arg(&run_dir)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run aether demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "aether demo --check {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // The table must really list the legs, all passed, none skipped.
    let results: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("leg results"))
            .expect("leg results are JSON");
    assert!(results.len() >= min_legs, "only {} legs ran", results.len());
    for r in &results {
        assert_eq!(r["ok"], true, "{r}");
        assert!(r["skipped"].is_null(), "{r}");
    }
    for id in ids {
        assert!(results.iter().any(|r| r["id"] == *id), "leg {id} missing");
    }
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_dir_all(&run_dir);
}
