//! Golden files: a test's rendered text against the file kept in the repository.

use std::path::Path;

/// Compare `actual` with the golden file at `path`; rewrite the file instead when the test runs
/// with `UPDATE_GOLDEN=1` (its directory is created when missing).
pub fn assert_golden(path: &Path, actual: &str) {
    if std::env::var("UPDATE_GOLDEN").as_deref() == Ok("1") {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        }
        std::fs::write(path, actual).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        return;
    }
    let expected = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
    assert_eq!(
        actual,
        expected,
        "{} differs from the rendered text (run with UPDATE_GOLDEN=1 to accept)",
        path.display()
    );
}
