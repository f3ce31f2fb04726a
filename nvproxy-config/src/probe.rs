//! What the configuration's checks ask of the host, answered by the caller: the daemon passes
//! its probes (`worker/src/host.rs`), tests pass fixed answers. Imports nothing of the crate.

/// The host facts a config check needs, asked only when that check runs.
pub trait HostProbe {
    /// The host driver's version (`/proc/driver/nvidia/version`), `None` without a driver.
    fn driver_version(&self) -> Option<String>;
    /// The minors of the host's GPUs, `None` when they cannot be listed.
    fn gpu_minors(&self) -> Option<Vec<u32>>;
    /// Whether `/dev/cuse` can be opened (what `transport = "auto"` settles on).
    fn cuse_usable(&self) -> bool;
}
