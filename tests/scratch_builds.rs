//! aether-core's fence is the compiler's (issue #38): a scratch copy of the crate, given one file
//! that reaches for IO, must not build. Each case writes `src/scratch.rs` into the copy, declares
//! it from `lib.rs`, and runs `cargo check` (or `cargo clippy`, for what only clippy refuses) on
//! the copy alone, offline, against this workspace's lock; the build must fail, and say why.
//! A clean scratch file must build, so a failure is the trick's and not the harness's.
//!
//! The copy has its own target directory under this workspace's `target/` (the outer `cargo test`
//! may hold the main one's lock), so the first run checks the core's dependencies once.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the scratch directory");
    for entry in std::fs::read_dir(from).expect("read the crate") {
        let entry = entry.expect("a directory entry");
        let path = entry.path();
        let dest = to.join(entry.file_name());
        if path.is_dir() {
            copy_dir(&path, &dest);
        } else {
            std::fs::copy(&path, &dest).expect("copy a file of the crate");
        }
    }
}

/// The lines of the workspace's `Cargo.toml` from `[workspace.package]` on to the next table
/// that is not a `[workspace.*]` one: what the crate inherits.
fn workspace_tables() -> String {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).expect("read Cargo.toml");
    let mut out = String::new();
    let mut keep = false;
    for line in text.lines() {
        if line.starts_with('[') {
            keep = line.starts_with("[workspace.");
        }
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(
        out.contains("[workspace.package]") && out.contains("[workspace.lints.rust]"),
        "the workspace's tables were not found in Cargo.toml:\n{out}"
    );
    out
}

/// A scratch workspace holding a copy of aether-core (fresh each run).
fn scratch() -> PathBuf {
    let dir = root().join("target/scratch-builds");
    let _ = std::fs::remove_dir_all(dir.join("aether-core"));
    copy_dir(&root().join("crates/aether-core"), &dir.join("aether-core"));
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[workspace]\nmembers = [\"aether-core\"]\nresolver = \"3\"\n\n{}",
            workspace_tables()
        ),
    )
    .expect("write the scratch workspace");
    std::fs::copy(root().join("Cargo.lock"), dir.join("Cargo.lock")).expect("copy the lock");
    let lib = dir.join("aether-core/src/lib.rs");
    let text = std::fs::read_to_string(&lib).expect("read lib.rs");
    std::fs::write(&lib, format!("{text}\npub mod scratch;\n")).expect("declare the scratch file");
    dir
}

/// Builds the scratch crate with `scratch.rs` holding `body`: (success, what cargo printed).
fn build(dir: &Path, tool: &str, body: &str) -> (bool, String) {
    let file = format!("//! A scratch file.\n\nuse crate::prelude::*;\n\n{body}\n");
    std::fs::write(dir.join("aether-core/src/scratch.rs"), file).expect("write scratch.rs");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut cmd = Command::new(cargo);
    cmd.arg(tool)
        .args(["--offline", "--quiet", "-p", "aether-core"]);
    if tool == "clippy" {
        cmd.args(["--", "-D", "warnings"]);
    }
    let out = cmd
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo on the scratch crate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn aether_core_refuses_io_at_build_time() {
    let dir = scratch();
    // The control: allowed code builds, so each failure below is its trick's.
    let (ok, text) = build(
        &dir,
        "check",
        "#[allow(dead_code)]\nfn fine() -> std::collections::BTreeMap<String, u8> {\n    \
         let _ = std::time::Duration::from_secs(1);\n    std::collections::BTreeMap::new()\n}",
    );
    assert!(ok, "the clean scratch file must build:\n{text}");

    let cases: [(&str, &str, &str); 6] = [
        (
            "check",
            "pub fn f() -> usize { std::fs::read_to_string(\"/etc/hostname\").map_or(0, |s| s.len()) }",
            "`fs` in `std`",
        ),
        (
            "check",
            "pub fn f(p: &str) -> bool { std::path::Path::new(p).exists() }",
            "`path` in `std`",
        ),
        (
            "check",
            "pub fn f() -> u64 { std::time::Instant::now().elapsed().as_secs() }",
            "`Instant`",
        ),
        (
            "check",
            "pub fn f() -> &'static str { include!(\"io.in\") }",
            "`include!` is not allowed here",
        ),
        (
            "check",
            "pub fn f() -> &'static str { env!(\"HOME\") }",
            "`env!` is not allowed here",
        ),
        // Written with its full path, the macro is not shadowed: clippy refuses it.
        (
            "clippy",
            "pub fn f() -> &'static str { core::include_str!(\"lib.rs\") }",
            "disallowed macro",
        ),
    ];
    for (tool, body, expected) in cases {
        let (ok, text) = build(&dir, tool, body);
        assert!(
            !ok,
            "`cargo {tool}` built aether-core with:\n{body}\n{text}"
        );
        assert!(
            text.contains(expected),
            "`cargo {tool}` failed on:\n{body}\nbut not with `{expected}`:\n{text}"
        );
        eprintln!("refused as expected ({tool}): {body}");
    }
}
