//! `aether debug` and `aether explain --config-dump` as an operator runs them, without a mesh:
//! the errors when no daemon answers, when the socket is root's, and when a file is not a dump.
//! (The answers of a running daemon are tested in `src/node/debug.rs`, and through the local
//! lab by the EXPLAIN and DUMP legs of the e2e suite.)
#![allow(clippy::unwrap_used)] // Tests unwrap: a panic is the failure report (STYLE.md §6.4).

use aether::test_util::needs_root;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn aether(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aether"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .args(args)
        .env_remove("AETHER_STATE_DIR")
        .output()
        .unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("aether-debug-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn without_a_daemon_every_command_says_it_is_not_running_and_exits_2() {
    let dir = scratch("none");
    let state = dir.to_str().unwrap();
    for cmd in [
        vec!["pods"],
        vec!["services", "mp-multi"],
        vec!["routes"],
        vec!["certs"],
        vec!["config-dump"],
        vec!["log-level", "debug"],
        vec!["stats"],
        vec!["capture", "mp/mp-client"],
        vec![
            "explain",
            "--from",
            "mp/mp-client",
            "--dial",
            "mp-multi:8080",
        ],
    ] {
        let mut args = vec!["debug", "--state-dir", state];
        args.extend(&cmd);
        let out = aether(&args);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}");
        let err = stderr(&out);
        assert!(
            err.contains("the daemon is not running: no admin socket at")
                && err.contains(&format!("{state}/admin.sock")),
            "{cmd:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{cmd:?}");
    }
    // A socket nobody listens on any more.
    drop(std::os::unix::net::UnixListener::bind(dir.join("admin.sock")).unwrap());
    let out = aether(&["debug", "pods", "--state-dir", state]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("refuses connections"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn malformed_questions_are_refused_before_the_daemon_is_asked() {
    let out = aether(&[
        "debug",
        "--state-dir",
        "/nonexistent",
        "explain",
        "--from",
        "mp/mp-client",
        "--dial",
        "mp-multi:8080",
        "--bytes",
        "smtp",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--bytes \"smtp\""),
        "{}",
        stderr(&out)
    );
    let out = aether(&[
        "debug",
        "--state-dir",
        "/nonexistent",
        "capture",
        "mp-client",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("<namespace>/<name>"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn explain_from_a_file_that_is_not_a_config_dump_says_so() {
    let dir = scratch("dump");
    let not_json = dir.join("a.txt");
    std::fs::write(&not_json, "hello").unwrap();
    let not_dump = dir.join("b.json");
    std::fs::write(&not_dump, r#"{"node": "a"}"#).unwrap();
    let q = [
        "--from",
        "mp/mp-client",
        "--dial",
        "mp-multi.mp.aether.internal:8080",
    ];
    for (file, want) in [
        (&not_json, "is not JSON"),
        (&not_dump, "not an `aether debug config-dump` document"),
        (&dir.join("missing.json"), "read "),
    ] {
        let mut args = vec!["explain", "--config-dump", file.to_str().unwrap()];
        args.extend(q);
        let out = aether(&args);
        assert_eq!(out.status.code(), Some(2), "{}", file.display());
        assert!(
            stderr(&out).contains(want),
            "{}: {}",
            file.display(),
            stderr(&out)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A copy of the binary that another user may run (the build directory need not be theirs).
fn binary_for_anyone(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("aether");
    std::fs::copy(env!("CARGO_BIN_EXE_aether"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

#[test]
fn a_user_who_may_not_open_the_socket_is_told_it_is_roots() {
    use std::os::unix::process::CommandExt;
    let test = "a_user_who_may_not_open_the_socket_is_told_it_is_roots";
    if needs_root::cannot_run(test, &[]) {
        return;
    }
    let dir = scratch("perm");
    let bin = binary_for_anyone(&dir);
    // Bound by root with the default mode: others may not write to it, so may not connect.
    let _listener = std::os::unix::net::UnixListener::bind(dir.join("admin.sock")).unwrap();
    // The copy was written by this process: a test thread that forks meanwhile holds its
    // write descriptor until that child execs, and running the copy then fails with
    // ETXTBSY. Asked again until the child has exec'd (bounded).
    let deadline = aether::time::now() + std::time::Duration::from_secs(30);
    let out = loop {
        match Command::new(&bin)
            .args(["debug", "pods", "--state-dir", dir.to_str().unwrap()])
            .uid(65534)
            .gid(65534)
            .output()
        {
            Err(e)
                if e.kind() == std::io::ErrorKind::ExecutableFileBusy
                    && aether::time::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => break other.unwrap(),
        }
    };
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("permission denied on") && err.contains("kubectl exec"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
