//! Replacing a file atomically: the content goes to a temporary file beside the
//! target, is synced, renamed over the target, and the directory is synced, so a
//! reader (a container runtime, a starting daemon) sees the old file or the new
//! one, never half of one, also across a crash. Used for DEL queue entries, the
//! CNI config the daemon writes, and `podnet install`.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Writes `body` to `tmp` with `mode`, then renames it to `dest`. `tmp` must be in
/// `dest`'s directory; it is removed when anything fails.
pub fn replace(dest: &Path, tmp: &Path, body: &[u8], mode: u32) -> io::Result<()> {
    let write = || -> io::Result<()> {
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(mode)
            .open(tmp)?;
        f.write_all(body)?;
        f.sync_all()?;
        std::fs::rename(tmp, dest)?;
        let dir = dest.parent().filter(|d| !d.as_os_str().is_empty());
        File::open(dir.unwrap_or(Path::new(".")))?.sync_all()
    };
    let written = write();
    if written.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::replace;
    use crate::test_dir::TestDir;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_the_content_with_the_mode_and_leaves_no_temporary_file() {
        let dir = TestDir::new("atomic");
        let dest = dir.join("conf");
        let tmp = dir.join(".conf.tmp");
        std::fs::write(&dest, b"old").expect("seed");
        replace(&dest, &tmp, b"new", 0o600).expect("replace");
        assert_eq!(std::fs::read(&dest).expect("read"), b"new");
        let mode = std::fs::metadata(&dest).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!tmp.exists());
    }

    #[test]
    fn a_failed_write_removes_the_temporary_file_and_keeps_the_target() {
        let dir = TestDir::new("atomic");
        let dest = dir.join("sub");
        std::fs::create_dir(&dest).expect("a directory where the file should go");
        let tmp = dir.join(".sub.tmp");
        assert!(replace(&dest, &tmp, b"x", 0o600).is_err());
        assert!(!tmp.exists());
        assert!(dest.is_dir());
    }
}
