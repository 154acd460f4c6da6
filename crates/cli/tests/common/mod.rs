//! Helpers shared by the end-to-end tests: real memnode processes, temp dirs, the binary.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub mod proxy;

use gleaner_proto::Endpoint;

/// The `gleaner` binary under test; also exported as GLEANER_BIN for embedded memnodes.
pub fn gleaner_bin() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_gleaner"));
    std::env::set_var("GLEANER_BIN", &p);
    p
}

/// Compiles the C file `src` to `out` with `cc` and `flags`; a compiler error fails the test
/// with the compiler's message.
pub fn compile_c(flags: &[&str], src: &Path, out: &Path) {
    compile_c_linking(flags, src, out, &[]);
}

/// As [`compile_c`], with `libs` (`-lNAME`) after the source, where the linker wants them.
pub fn compile_c_linking(flags: &[&str], src: &Path, out: &Path, libs: &[&str]) {
    let cc = Command::new("cc")
        .args(flags)
        .arg(src)
        .arg("-o")
        .arg(out)
        .args(libs)
        .output()
        .expect("a C compiler (cc)");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
}

/// tests/c/preload_program.c (a C program that knows nothing of gleaner and checks its own
/// data), compiled once per test binary; its path.
pub fn preload_program() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| build_c_program("preload_program", "gleaner_preload_program"))
}

/// Compiles `tests/c/NAME.c` (-O1, warnings are errors, pthreads) beside the gleaner binary as
/// `out_name`; its path. Built beside it and renamed into place: another test binary running at
/// the same time may be executing the one there, and one half written failed its exec
/// ("Permission denied", seen with two test binaries at once). Callers keep the path in a
/// `OnceLock`, so each test binary compiles a program once.
pub fn build_c_program(name: &str, out_name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = gleaner_bin().parent().unwrap().join(out_name);
    let building = out.with_extension(format!("building-{}", std::process::id()));
    compile_c(
        &["-O1", "-Wall", "-Werror", "-pthread"],
        &root.join(format!("tests/c/{name}.c")),
        &building,
    );
    std::fs::rename(&building, &out).expect("renaming the test program into place");
    out.to_string_lossy().into_owned()
}

/// The Python interpreter itself (`sys.executable`), not a version manager's shim, which would
/// start more processes under the preload library; found once per test binary.
pub fn real_python() -> &'static str {
    static PYTHON: OnceLock<String> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 (scripts/setup.sh installs it)");
        assert!(out.status.success(), "python3 does not run");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    })
}

/// A fresh private directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let suffix: [u8; 4] = gleaner_proto::random_bytes();
        let p = std::env::temp_dir().join(format!(
            "gleaner-test-{tag}-{}-{:02x}{:02x}{:02x}{:02x}",
            std::process::id(),
            suffix[0],
            suffix[1],
            suffix[2],
            suffix[3]
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `gleaner memnode` process with its own token, killed on drop.
pub struct MemnodeProc {
    pub child: Child,
    pub endpoint: Endpoint,
    pub token_file: PathBuf,
    pub stderr_file: PathBuf,
    pub dir: TempDir,
}

/// A new random token in `<dir>/token`, in a directory of its own (removed with the TempDir).
pub fn token_file(tag: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new(tag);
    let token_file = dir.path().join("token");
    gleaner_proto::write_token_file(&token_file, &gleaner_proto::generate_token()).unwrap();
    (dir, token_file)
}

/// The memnode lease (seconds) the tests' memnodes get unless they ask otherwise (the memnode's
/// own default).
pub const DEFAULT_LEASE_SECS: &str = "10";

/// The memnode lease (seconds) of [`MemnodeProc::start_short_lease`].
pub const SHORT_LEASE_SECS: &str = "2";

/// `n` memnodes of `capacity` on TCP loopback sharing one token (`<dir>/token`), for a pool.
pub fn memnodes_sharing_a_token(n: usize, capacity: &str) -> (Vec<MemnodeProc>, TempDir) {
    memnodes_sharing_a_token_with_lease(n, capacity, DEFAULT_LEASE_SECS)
}

/// As [`memnodes_sharing_a_token`], with the memnodes' `--lease` in seconds.
pub fn memnodes_sharing_a_token_with_lease(
    n: usize,
    capacity: &str,
    lease_secs: &str,
) -> (Vec<MemnodeProc>, TempDir) {
    let (dir, token) = token_file("pool-token");
    let nodes = (0..n)
        .map(|_| {
            let node_dir = TempDir::new("pool-node");
            MemnodeProc::start_with_lease(
                "127.0.0.1:0",
                capacity,
                node_dir,
                token.clone(),
                lease_secs,
            )
        })
        .collect();
    (nodes, dir)
}

impl MemnodeProc {
    /// Starts a memnode listening on `listen` (`127.0.0.1:0` or `unix` for a socket in its dir).
    pub fn start(listen: &str, capacity: &str) -> MemnodeProc {
        let (dir, token_file) = token_file("memnode");
        Self::start_with_token(listen, capacity, dir, token_file)
    }

    /// As [`MemnodeProc::start`], with a lease of [`SHORT_LEASE_SECS`]: for a test that kills
    /// the memnode or its client, whose clients then give up reconnecting (and whose memnode
    /// ends a gone client's session) after that long rather than the default's 10 s, which
    /// such a test would otherwise spend waiting.
    pub fn start_short_lease(listen: &str, capacity: &str) -> MemnodeProc {
        let (dir, token_file) = token_file("memnode");
        Self::start_with_lease(listen, capacity, dir, token_file, SHORT_LEASE_SECS)
    }

    pub fn start_with_token(
        listen: &str,
        capacity: &str,
        dir: TempDir,
        token_file: PathBuf,
    ) -> MemnodeProc {
        Self::start_with_lease(listen, capacity, dir, token_file, DEFAULT_LEASE_SECS)
    }

    /// As [`MemnodeProc::start_with_token`], with the memnode's `--lease` in seconds.
    pub fn start_with_lease(
        listen: &str,
        capacity: &str,
        dir: TempDir,
        token_file: PathBuf,
        lease_secs: &str,
    ) -> MemnodeProc {
        Self::start_with_args(listen, capacity, dir, token_file, &["--lease", lease_secs])
    }

    /// As [`MemnodeProc::start_with_token`], with more `gleaner memnode` arguments.
    pub fn start_with_args(
        listen: &str,
        capacity: &str,
        dir: TempDir,
        token_file: PathBuf,
        extra: &[&str],
    ) -> MemnodeProc {
        let listen = if listen == "unix" {
            format!("unix:{}", dir.path().join("m.sock").display())
        } else {
            listen.to_string()
        };
        let stderr_file = dir.path().join("memnode.stderr");
        let mut child = Command::new(gleaner_bin())
            .args(["memnode", "--listen", &listen, "--capacity", capacity])
            .args(extra)
            .arg("--token-file")
            .arg(&token_file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_file).unwrap())
            .spawn()
            .expect("spawn gleaner memnode");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let endpoint = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| {
                panic!(
                    "memnode printed {line:?}; stderr: {}",
                    std::fs::read_to_string(&stderr_file).unwrap_or_default()
                )
            })
            .parse()
            .unwrap();
        MemnodeProc {
            child,
            endpoint,
            token_file,
            stderr_file,
            dir,
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_file).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops the memnode with SIGSTOP: it serves nothing more, but its connections stay open
    /// until [`MemnodeProc::kill`]. Freezing several before killing any makes them fail
    /// together, with no moment when one is dead and another still answers.
    pub fn freeze(&self) {
        // SAFETY: kill(2) on a child we spawned and have not reaped (kill() reaps it).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGSTOP) };
    }
}

impl Drop for MemnodeProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `gleaner` with `args`, waiting at most `limit`; returns (status code, stdout, stderr).
pub fn run_gleaner(args: &[&str], limit: Duration) -> (Option<i32>, String, String) {
    // A group of its own: past the limit, the program is killed with the launcher (a hung
    // program that outlived its killed launcher held the output open, and the test, for good).
    let mut child = Command::new(gleaner_bin())
        .process_group(0)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_output(&mut child, limit)
}

/// Waits for `child` at most `limit` (killing it after) and collects its output. A child that
/// leads a process group of its own (`CommandExt::process_group(0)`) is killed with its group:
/// a process under it that hangs holding the output open would hold the readers, and the
/// test, for good.
pub fn wait_output(child: &mut Child, limit: Duration) -> (Option<i32>, String, String) {
    let deadline = Instant::now() + limit;
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).ok();
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).ok();
        s
    });
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let pid = child.id() as i32;
            // SAFETY: getpgid on the child we spawned, not yet reaped (its pid is still its own).
            if unsafe { libc::getpgid(pid) } == pid {
                // SAFETY: kill on the group that child leads; no memory is touched.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            let _ = child.kill();
            let s = child.wait().unwrap();
            let (o, e) = (t_out.join().unwrap(), t_err.join().unwrap());
            panic!("command ran past {limit:?} (status {s:?})\nstdout:\n{o}\nstderr:\n{e}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), t_out.join().unwrap(), t_err.join().unwrap())
}

/// A memory cgroup made for a test ([`gleaner_sys::cgroup::MemoryCgroup`]); a test that cannot
/// make one fails saying why.
pub fn test_cgroup(name: &str) -> gleaner_sys::cgroup::MemoryCgroup {
    gleaner_sys::cgroup::MemoryCgroup::new(name).unwrap_or_else(|e| panic!("{e}"))
}

/// As [`test_cgroup`], limited to `bytes` of memory.
pub fn limited_cgroup(name: &str, bytes: u64) -> gleaner_sys::cgroup::MemoryCgroup {
    gleaner_sys::cgroup::MemoryCgroup::limited(name, bytes).unwrap_or_else(|e| panic!("{e}"))
}
