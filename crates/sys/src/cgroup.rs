//! A memory cgroup made for a test or a benchmark: v2 where the unified hierarchy has the memory
//! controller, else v1's memory hierarchy; processes are started inside it through a shell that
//! moves itself in, and what is left in it is killed and the group removed when it is dropped.
//! Making one needs root (or a delegated hierarchy).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// See the module documentation.
#[derive(Debug)]
pub struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    /// A new group named `gleaner-test-NAME-PID`; the error says why it could not be made.
    pub fn new(name: &str) -> Result<MemoryCgroup, String> {
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"));
        let base = if v2 {
            "/sys/fs/cgroup"
        } else {
            "/sys/fs/cgroup/memory"
        };
        let dir = Path::new(base).join(format!("gleaner-test-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| {
            format!(
                "cannot make a memory cgroup at {} ({e}): this needs root and a cgroup hierarchy",
                dir.display()
            )
        })?;
        Ok(MemoryCgroup { dir, v2 })
    }

    /// A new group limited to `bytes` of memory.
    pub fn limited(name: &str, bytes: u64) -> Result<MemoryCgroup, String> {
        let cg = MemoryCgroup::new(name)?;
        let file = if cg.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(cg.dir.join(file), bytes.to_string())
            .map_err(|e| format!("limiting {} to {bytes} bytes: {e}", cg.dir.display()))?;
        Ok(cg)
    }

    /// The group's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// `program args`, to be run inside the group (a shell moves itself in, then execs it).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Command {
        let procs = self.dir.join("cgroup.procs");
        let mut c = Command::new("sh");
        c.args([
            "-c",
            &format!("echo $$ > {} && exec \"$@\"", procs.display()),
            "sh",
        ])
        .arg(program)
        .args(args);
        c
    }

    /// The OOM kills in the group so far (v2's `memory.events`, v1's `memory.oom_control`).
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: kill(2) has no memory-safety preconditions; the processes are the
                // ones left in this group, which its maker started (a stopped one is let go
                // first).
                unsafe {
                    libc::kill(pid, libc::SIGCONT);
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
