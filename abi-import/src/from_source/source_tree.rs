//! The driver source tree `from-source` reads: where its SDK, Unix, UVM and kernel-common headers
//! live, and the two translation units built from them.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub(crate) const SDK: &str = "src/common/sdk/nvidia/inc";
pub(crate) const UNIX: &str = "src/nvidia/arch/nvalloc/unix/include";
pub(crate) const UVM: &str = "kernel-open/nvidia-uvm";
pub(crate) const KCOMMON: &str = "kernel-open/common/inc";

/// The Unix ioctl headers, in include order, looked up in [`UNIX`] and then in [`KCOMMON`]
/// (535 keeps `nv-ioctl-numa.h`, with `NV_ESC_NUMA_INFO`, only there); those missing from a
/// version are skipped.
const UNIX_HEADERS: &[&str] = &[
    "nv-ioctl.h",
    "nv-ioctl-numbers.h",
    "nv-ioctl-numa.h",
    "nv_escape.h",
    "nv-unix-nvos-params-wrappers.h",
    "nv-ioctl-lockless-diag.h",
    "nv-ioctl-nvlog.h",
];
const UVM_HEADERS: &[&str] = &["uvm_ioctl.h", "uvm_linux_ioctl.h", "uvm_types.h"];

pub(crate) struct Tree {
    pub root: PathBuf,
}

impl Tree {
    pub(crate) fn open(dir: &Path) -> Result<Tree> {
        if !dir.is_dir() {
            bail!("{} is not a folder", dir.display());
        }
        let root = dir
            .canonicalize()
            .with_context(|| format!("resolving {}", dir.display()))?;
        let tree = Tree { root };
        for need in [
            format!("{SDK}/nvos.h"),
            format!("{UNIX}/nv_escape.h"),
            format!("{UVM}/uvm_ioctl.h"),
        ] {
            if !tree.path(&need).is_file() {
                bail!(
                    "{} does not look like an open-gpu-kernel-modules tree: {need} is missing",
                    dir.display()
                );
            }
        }
        Ok(tree)
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub(crate) fn read(&self, rel: &str) -> Result<String> {
        let p = self.path(rel);
        let bytes = fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    pub(crate) fn exists(&self, rel: &str) -> bool {
        self.path(rel).is_file()
    }

    /// Files (relative paths) matching `dir/*suffix`, sorted.
    pub(crate) fn list(&self, dir: &str, prefix: &str, suffix: &str) -> Result<Vec<String>> {
        let p = self.path(dir);
        let mut out = Vec::new();
        for e in fs::read_dir(&p).with_context(|| format!("listing {}", p.display()))? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if e.file_type()?.is_file() && name.starts_with(prefix) && name.ends_with(suffix) {
                out.push(format!("{dir}/{name}"));
            }
        }
        out.sort();
        Ok(out)
    }

    /// The SDK headers of translation unit 1, relative to `SDK`, in include order.
    fn sdk_headers(&self) -> Result<Vec<String>> {
        let strip = |v: Vec<String>| -> Vec<String> {
            v.into_iter()
                .map(|s| s[SDK.len() + 1..].to_owned())
                .collect()
        };
        let mut h = vec!["nvos.h".to_owned()];
        h.extend(strip(self.list(&format!("{SDK}/class"), "cl", ".h")?));
        h.extend(strip(self.list(&format!("{SDK}/alloc"), "", ".h")?));
        h.extend(strip(self.list(&format!("{SDK}/ctrl"), "ctrl", ".h")?));
        let mut subdirs: Vec<String> = fs::read_dir(self.path(&format!("{SDK}/ctrl")))?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("ctrl"))
            .collect();
        subdirs.sort();
        for d in subdirs {
            h.extend(strip(self.list(&format!("{SDK}/ctrl/{d}"), "", ".h")?));
        }
        Ok(h)
    }

    /// The Unix ioctl headers this version has, as paths relative to the tree.
    pub(crate) fn unix_headers(&self) -> Vec<String> {
        UNIX_HEADERS
            .iter()
            .filter_map(|h| {
                [UNIX, KCOMMON]
                    .iter()
                    .map(|dir| format!("{dir}/{h}"))
                    .find(|rel| self.exists(rel))
            })
            .collect()
    }

    pub(crate) fn includes1(&self) -> Vec<PathBuf> {
        vec![self.path(SDK), self.path(UNIX)]
    }

    pub(crate) fn includes_uvm(&self) -> Vec<PathBuf> {
        vec![self.path(KCOMMON), self.path(UVM)]
    }

    pub(crate) fn tu1(&self) -> Result<String> {
        let mut s = String::new();
        for h in self.sdk_headers()? {
            s.push_str(&format!("#include \"{h}\"\n"));
        }
        // Unix headers by name from the include path, or by full path where only
        // kernel-open/common/inc has them (its other headers stay off the include path).
        for rel in self.unix_headers() {
            match rel.strip_prefix(&format!("{UNIX}/")) {
                Some(name) => s.push_str(&format!("#include \"{name}\"\n")),
                None => s.push_str(&format!("#include \"{}\"\n", self.path(&rel).display())),
            }
        }
        Ok(s)
    }

    pub(crate) fn tu_uvm(&self) -> String {
        UVM_HEADERS
            .iter()
            .map(|h| format!("#include \"{h}\"\n"))
            .collect()
    }

    /// The commit checked out, when the tree is a git work tree.
    pub(crate) fn git_head(&self) -> Option<String> {
        if !self.root.join(".git").exists() {
            return None;
        }
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(&self.root)
            .args(["rev-parse", "HEAD"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// The driver version from `version.mk`, if the tree has it.
    pub(crate) fn version(&self) -> Option<String> {
        let text = self.read("version.mk").ok()?;
        text.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "NVIDIA_VERSION").then(|| v.trim().to_owned())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 535 keeps `nv-ioctl-numa.h` (`NV_ESC_NUMA_INFO`) only in kernel-open/common/inc; a
    /// header of the Unix directory wins where both have it.
    #[test]
    fn unix_headers_fall_back_to_kernel_open_common() {
        let dir = std::env::temp_dir().join(format!("abi-import-unix-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for d in [UNIX, KCOMMON] {
            fs::create_dir_all(dir.join(d)).unwrap();
        }
        fs::write(dir.join(UNIX).join("nv-ioctl.h"), "").unwrap();
        fs::write(dir.join(KCOMMON).join("nv-ioctl.h"), "").unwrap();
        fs::write(dir.join(KCOMMON).join("nv-ioctl-numa.h"), "").unwrap();
        let tree = Tree {
            root: dir.canonicalize().unwrap(),
        };
        let got = tree.unix_headers();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            got,
            [
                format!("{UNIX}/nv-ioctl.h"),
                format!("{KCOMMON}/nv-ioctl-numa.h")
            ]
        );
    }
}
