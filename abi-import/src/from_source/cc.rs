//! Running the system C compiler and the tools that read its output.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

pub(crate) struct Cc {
    pub cc: String,
    pub work: PathBuf,
}

fn run(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {what} ({:?})", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}",
            out.status,
            truncate(&String::from_utf8_lossy(&out.stderr), 4000)
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{what} printed non-UTF-8 output"))
}

pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[... {} more bytes]", &s[..end], s.len() - end)
}

impl Cc {
    /// Finds the compiler (`$CC`, else `cc`) and makes a private work folder.
    pub(crate) fn new() -> Result<Cc> {
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
        let ok = Command::new(&cc).arg("--version").output();
        match ok {
            Ok(o) if o.status.success() => {}
            _ => bail!(
                "no working C compiler `{cc}` (set CC, or install one: `apt-get install gcc`)"
            ),
        }
        for tool in ["readelf"] {
            if Command::new(tool).arg("--version").output().is_err() {
                bail!("`{tool}` not found (install binutils: `apt-get install binutils`)");
            }
        }
        let work = std::env::temp_dir().join(format!(
            "abi-import-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        Ok(Cc { cc, work })
    }

    /// The compiler as the `abi` field names it: `gcc 12.2.0`, or for clang the first line of
    /// `cc --version`.
    pub(crate) fn version(&self) -> Result<String> {
        let banner = run(Command::new(&self.cc).arg("--version"), "cc --version")?;
        let first = banner.lines().next().unwrap_or("").trim().to_owned();
        if !first.contains("clang")
            && let Ok(v) = run(
                Command::new(&self.cc).arg("-dumpfullversion"),
                "cc -dumpfullversion",
            )
        {
            return Ok(format!("gcc {}", v.trim()));
        }
        Ok(first)
    }

    fn base(&self, includes: &[PathBuf]) -> Command {
        let mut c = Command::new(&self.cc);
        c.args(["-std=gnu11", "-w"]);
        for i in includes {
            c.arg("-I").arg(i);
        }
        c
    }

    /// Compiles `source` to an object with full debugging information; returns the object path.
    pub(crate) fn object(&self, name: &str, source: &str, includes: &[PathBuf]) -> Result<PathBuf> {
        let src = self.work.join(format!("{name}.c"));
        std::fs::write(&src, source)?;
        let obj = self.work.join(format!("{name}.o"));
        run(
            self.base(includes)
                .args(["-g", "-fno-eliminate-unused-debug-types", "-c", "-o"])
                .arg(&obj)
                .arg(&src),
            &format!("compiling {}", src.display()),
        )?;
        Ok(obj)
    }

    /// Compiles `source` (no link); returns the compiler's diagnostics instead of failing.
    pub(crate) fn diagnostics(
        &self,
        name: &str,
        source: &str,
        includes: &[PathBuf],
    ) -> Result<(bool, String)> {
        let src = self.work.join(format!("{name}.c"));
        std::fs::write(&src, source)?;
        let out = self
            .base(includes)
            .args(["-fsyntax-only", "-fmax-errors=0"])
            .arg(&src)
            .output()
            .with_context(|| format!("cannot run {}", self.cc))?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }

    /// Compiles, links and runs `source`; returns what it printed.
    pub(crate) fn run_program(
        &self,
        name: &str,
        source: &str,
        includes: &[PathBuf],
    ) -> Result<String> {
        let src = self.work.join(format!("{name}.c"));
        std::fs::write(&src, source)?;
        let exe = self.work.join(name);
        run(
            self.base(includes).arg("-O0").arg("-o").arg(&exe).arg(&src),
            &format!("compiling {}", src.display()),
        )?;
        run(
            &mut Command::new(&exe),
            &format!("running {}", exe.display()),
        )
    }

    pub(crate) fn readelf(&self, obj: &Path, dump: &str) -> Result<String> {
        run(
            Command::new("readelf")
                .arg(format!("--debug-dump={dump}"))
                .arg(obj),
            "readelf",
        )
    }
}

impl Drop for Cc {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}
