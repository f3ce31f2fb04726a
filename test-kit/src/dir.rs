//! A scratch directory of one test.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A directory of one test, created empty and removed with what is left in it when dropped,
/// also when the test fails: a test run leaves nothing behind.
pub struct TestDir(PathBuf);

impl TestDir {
    /// `<tmp>/nvproxy-test-<tag>-<pid>-<n>` (the system's temp directory, `TMPDIR`).
    pub fn new(tag: &str) -> TestDir {
        Self::new_in(&std::env::temp_dir(), &format!("nvproxy-test-{tag}"))
    }

    /// `<base>/<name>-<pid>-<n>`: a short name under a base of the test's choice (socket
    /// paths must stay under 108 bytes).
    pub fn new_in(base: &Path, name: &str) -> TestDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating a test directory");
        TestDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
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
    fn two_dirs_of_one_tag_differ_and_go_when_dropped() {
        let (a, b) = (TestDir::new("kit"), TestDir::new("kit"));
        assert_ne!(a.path(), b.path());
        std::fs::write(a.path().join("f"), "x").unwrap();
        let p = a.path().to_path_buf();
        drop(a);
        assert!(!p.exists());
        assert!(b.path().is_dir());
    }
}
