//! Test-only: a fresh directory under the system's temp dir, removed when the
//! test drops it (the unit tests of every module that writes files share it).

use std::ops::Deref;
use std::path::{Path, PathBuf};

/// A directory the test owns; `Deref` to its path.
pub(crate) struct TestDir(PathBuf);

impl TestDir {
    /// `$TMPDIR/podnet-TAG-PID-UUID`, created empty.
    pub(crate) fn new(tag: &str) -> TestDir {
        let dir = std::env::temp_dir().join(format!(
            "podnet-{tag}-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4()
        ));
        TestDir::at(dir)
    }

    /// `path` (with its parents) created, and removed on drop like any other.
    pub(crate) fn at(path: PathBuf) -> TestDir {
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("creating test dir {}: {e}", path.display()));
        TestDir(path)
    }
}

/// Writes an executable shell script `dir/name` running `body`. The file is
/// written by a child shell, so no write descriptor of this (multi-threaded)
/// test process can leak into a concurrent fork and make the script's exec fail
/// with "text file busy" (ETXTBSY).
pub(crate) fn shell_script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    let status = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(r#"printf '%s\n' "$1" > "$2" && chmod 755 "$2""#)
        .arg("sh")
        .arg(format!("#!/bin/sh\n{body}"))
        .arg(&path)
        .status()
        .unwrap_or_else(|e| panic!("running /bin/sh to write {}: {e}", path.display()));
    assert!(status.success(), "writing {}: {status}", path.display());
    path
}

impl Deref for TestDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TestDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_dir_is_fresh_and_gone_after_the_drop() {
        let (a, b) = (TestDir::new("t"), TestDir::new("t"));
        assert_ne!(a.to_path_buf(), b.to_path_buf());
        std::fs::write(a.join("f"), "x").unwrap();
        let path = a.to_path_buf();
        drop(a);
        assert!(!path.exists());
        assert!(b.is_dir());
    }
}
