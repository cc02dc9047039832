//! Tests that run out of file descriptors (issue #8, finding 5): the test runs again in a child
//! copy of the test binary, where it may lower `RLIMIT_NOFILE` and take every descriptor
//! without starving the other tests of the process.
//!
//! Use, in a `#[test]` function (not `#[tokio::test]`: the child builds its own runtime):
//!
//! ```ignore
//! if !fds::in_child(concat!(module_path!(), "::this_test_name")) {
//!     return; // the parent: the child ran the test and passed
//! }
//! // the child: the test's body, with `fds::exhaust()` where descriptors must run out
//! ```

use std::fs::File;
use std::io;
use std::process::Command;

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Set in the child's environment.
pub const CHILD_VAR: &str = "AETHER_TEST_FD_CHILD";

/// In the child, true: run the test's body. In the parent, runs `test` (a full path from
/// `module_path!()`, crate name included) alone in a child process, asserts that it ran and
/// passed, and returns false.
pub fn in_child(test: &str) -> bool {
    if std::env::var_os(CHILD_VAR).is_some() {
        return true;
    }
    let name = test.split_once("::").map_or(test, |(_, rest)| rest);
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, "1")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run the test in a child process");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{name} failed in its child process:\n{text}"
    );
    assert!(
        text.contains("1 passed"),
        "{name} did not run in its child process:\n{text}"
    );
    false
}

/// Every descriptor the process may still open, held until dropped.
#[derive(Debug)]
pub struct Exhausted {
    _held: Vec<File>,
}

/// Lower the soft descriptor limit to a little above the highest one open (so that taking them
/// all is quick), then open `/dev/null` until the kernel says `EMFILE`. Only in a child
/// ([`in_child`]).
pub fn exhaust() -> Exhausted {
    assert!(
        std::env::var_os(CHILD_VAR).is_some(),
        "exhaust() only runs in a child process"
    );
    let highest = std::fs::read_dir("/proc/self/fd")
        .expect("list /proc/self/fd")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    setrlimit(Resource::RLIMIT_NOFILE, (highest + 32).min(hard), hard).expect("setrlimit");
    let mut held = Vec::new();
    loop {
        match File::open("/dev/null") {
            Ok(f) => held.push(f),
            Err(e) if e.raw_os_error() == Some(nix::libc::EMFILE) => break,
            Err(e) => panic!("open /dev/null: {e}"),
        }
    }
    assert_eq!(
        File::open("/dev/null").map_err(|e| e.kind()).err(),
        Some(io::Error::from_raw_os_error(nix::libc::EMFILE).kind()),
        "descriptors are exhausted"
    );
    Exhausted { _held: held }
}
