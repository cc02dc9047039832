//! The local e2e suite (issue #3): the fixture of spec/legs.md as network namespaces on two
//! node bridges, two `aether node` daemons, every pod running its manifest's command, and every
//! leg of the catalogue through real sockets. It runs `aether demo --check`, which prints the
//! leg table and exits non-zero when a leg fails.
//!
//! It needs root, `ip`, `nft` and `nsenter`. Without them it prints SKIPPED, except under
//! `AETHER_REQUIRE_NETNS=1` (set by `.ci/run`), where it fails: the suite must never pass without
//! running (`src/test_util/needs_root.rs`).

use std::process::Command;

// The one skip rule of the crate's tests, included by path so that no feature is needed.
#[path = "../src/test_util/needs_root.rs"]
#[allow(dead_code, unreachable_pub)] // Only `cannot_run` is used, from this one crate.
mod needs_root;

#[test]
fn every_leg_through_real_sockets() {
    if needs_root::cannot_run("every_leg_through_real_sockets", &["ip", "nft", "nsenter"]) {
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let run_dir = std::env::temp_dir().join(format!("aether-e2e-{}", std::process::id()));
    let json = run_dir.with_extension("json");
    let out = Command::new(env!("CARGO_BIN_EXE_aether"))
        .current_dir(root)
        .args([
            "demo",
            "--check",
            "--prefix",
            "aee",
            "--netns-prefix",
            "e2e-",
        ])
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
        "aether demo --check failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // The table must really list the legs, all passed, none skipped.
    let results: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("leg results")).unwrap();
    assert!(results.len() >= 56, "only {} legs ran", results.len());
    for r in &results {
        assert_eq!(r["ok"], true, "{r}");
        assert!(r["skipped"].is_null(), "{r}");
    }
    for id in [
        "A1", "A13", "N19", "N23", "N28", "SWAP", "RET", "RESTART", "CNI", "BADSNI", "BADPEER",
        "BADHTTP",
    ] {
        assert!(results.iter().any(|r| r["id"] == id), "leg {id} missing");
    }
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_dir_all(&run_dir);
}
