//! (tests) A scratch directory of one test, removed when dropped, also when the test fails:
//! the workspace's one ([`test_kit::TestDir`]), named as the daemon's tests name it.

pub use test_kit::TestDir;
