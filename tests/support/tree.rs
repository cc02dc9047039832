//! The source files of a tree, for the checks that read them (tests/purity.rs, tests/arrows.rs).

use std::path::{Path, PathBuf};

/// Test-only files: `tests.rs`, `proptests.rs`, `*_tests.rs`.
pub(crate) fn is_test_file(path: &Path) -> bool {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    name == "tests.rs" || name == "proptests.rs" || name.ends_with("_tests.rs")
}

/// Every `.rs` file under `dir` (none when it does not read), appended to `out`.
pub(crate) fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}
