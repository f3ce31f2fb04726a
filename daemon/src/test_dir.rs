//! (tests) A scratch directory of one test, removed when dropped, also when the test fails:
//! a test run leaves nothing in the system's temp directory.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// `<tmp>/nvproxy-test-<tag>-<pid>-<n>`, created empty; removed on drop.
pub struct TestDir(PathBuf);

impl TestDir {
    /// A fresh directory for `tag`.
    pub fn new(tag: &str) -> TestDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("nvproxy-test-{tag}-{}-{n}", std::process::id()));
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
