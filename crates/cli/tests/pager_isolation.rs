//! A pager lives inside the program's process and must never wait on the program's memory, nor
//! take what is the program's: these tests drive real programs (tests/c/preload_program.c, a
//! shared library with thread-local storage, Python) under `gleaner run` through each way a
//! pager thread used to end up reading managed memory, or the program losing a descriptor or a
//! file to the pager, and the watchers that end a process whose pager waits for itself anyway.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{
    compile_c, gleaner_bin, preload_program as program, real_python, run_gleaner, TempDir,
};

const LIMIT: Duration = Duration::from_secs(120);

/// Runs tests/c/preload_program.c with `args` under `gleaner run --local-mem 8M`, and checks
/// that it exits 0 and prints `ok_line`; returns its (stdout, stderr).
fn program_ok_at_8m(args: &[&str], ok_line: &str) -> (String, String) {
    let mut all = vec!["run", "--local-mem", "8M", "--", program()];
    all.extend_from_slice(args);
    let (code, out, err) = run_gleaner(&all, LIMIT);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains(ok_line), "{out}");
    (out, err)
}

/// A directory holding `tls_0.so` .. `tls_{N-1}.so`, copies of tests/c/tls_module.c built once
/// per test binary (each copy is a module of its own to the dynamic linker). One directory beside
/// the gleaner binary, whatever the process (a directory per process left one behind per run);
/// each file is written under a name of this process's and renamed into place, as
/// `build_c_program` does, so a test binary running at the same time never loads half a file.
fn tls_modules(n: usize) -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = gleaner_bin().parent().unwrap().join("gleaner-tls-modules");
        std::fs::create_dir_all(&dir).unwrap();
        let building = dir.join(format!("tls.so.building-{}", std::process::id()));
        compile_c(
            &["-O1", "-Wall", "-Werror", "-shared", "-fPIC"],
            &root.join("tests/c/tls_module.c"),
            &building,
        );
        for i in 1..n {
            let copy = dir.join(format!("tls_{i}.so.building-{}", std::process::id()));
            std::fs::copy(&building, &copy).unwrap();
            std::fs::rename(&copy, dir.join(format!("tls_{i}.so"))).unwrap();
        }
        std::fs::rename(&building, dir.join("tls_0.so")).unwrap();
        dir
    })
}

/// A fork child starts its pager's threads, and every pager thread uses its thread-local
/// storage, after the program has loaded 90 modules with thread-local storage (as CPython loads
/// extension modules) and filled 48 MiB over an 8 MiB budget, so that the dynamic linker's
/// records of those modules would be far had they stayed in the program's heap: the C library's
/// thread start-up reads every one (`_dl_allocate_tls_init`), and so does a pager thread's next
/// use of its thread-local storage after one more module is loaded. Before, the fork child's
/// start hung for good (CPython's `test_random.test_after_fork`), and then the parent's own
/// fault handlers did.
#[test]
fn pager_threads_start_and_run_after_the_program_loads_modules_with_thread_local_storage() {
    let modules = 90;
    let dir = tls_modules(modules + 1).to_string_lossy().into_owned();
    let n = modules.to_string();
    let (_, err) = program_ok_at_8m(&["dlopen-tls", "48", &dir, &n], "dlopen-tls ok");
    // It did page: most of the 3 x 48 MiB went far.
    assert!(err.contains("dirty"), "{err}");
}

/// `setgroups` with a list in the program's heap that has gone far, on a process with threads
/// of its own: the C library has every thread, the pager's too, repeat the call with the same
/// list, which the kernel reads; then `initgroups`, whose list the C library allocates. Before,
/// every pager thread waited in the kernel for the list's page (CPython's
/// `test_subprocess.test_extra_groups` hung).
#[test]
fn setgroups_with_a_far_list_does_not_hang_the_pager() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test needs root (scripts/test.sh runs as root): setgroups is privileged");
    }
    program_ok_at_8m(&["setgroups", "48"], "setgroups ok");
}

/// A signal every thread of the program blocks stays pending (no pager thread takes it and
/// runs the program's handler, which touches far memory), and runs on the program's thread
/// once that thread unblocks it.
#[test]
fn a_signal_the_program_blocks_never_runs_on_a_pager_thread() {
    program_ok_at_8m(&["signal-blocked", "32"], "signal-blocked ok");
}

/// `(below, opened)` of `preload_program low-limit MB`: the descriptors open below the limit of
/// 29 when the exec'd program starts, and how many more it could open.
fn low_limit_counts(out: &str) -> (u32, u32) {
    let line = out
        .lines()
        .find(|l| l.starts_with("below "))
        .unwrap_or_else(|| panic!("no count in: {out}"));
    let n: Vec<u32> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[0], n[1])
}

/// A program exec'd under a soft descriptor limit of 29 (CPython's
/// `test_close_fds_when_max_fd_is_lowered` does this) finds the same descriptors open at its
/// start, and can open as many more, as without gleaner: the pager's descriptors are made above
/// the limit, which is raised only while the pager starts. Then it fills memory at its limit.
/// Before, the pager took the program's last numbers and the program could not start ("Too
/// many open files").
#[test]
fn a_program_under_a_low_descriptor_limit_keeps_every_number_below_it() {
    let alone = Command::new(program())
        .args(["low-limit", "16"])
        .output()
        .unwrap();
    let alone_out = String::from_utf8_lossy(&alone.stdout).into_owned();
    assert!(alone.status.success(), "{alone_out}");
    let (out, err) = program_ok_at_8m(&["low-limit", "48"], "count-fds ok");
    assert_eq!(
        low_limit_counts(&out),
        low_limit_counts(&alone_out),
        "under gleaner: {out}\nalone: {alone_out}"
    );
    assert!(!err.contains("Too many open files"), "{err}");
}

/// The pager writes nothing into the program's `$TMPDIR`: a process that runs long enough to
/// publish its live status does so in the system's place for it, where `gleaner status` finds
/// it. Before, `gleaner-status-UID` appeared in `$TMPDIR`, which a test runner that gives each
/// worker a `$TMPDIR` of its own and checks it (CPython's `regrtest -j`) reported as leaked.
#[test]
fn the_pager_writes_nothing_into_the_programs_tmpdir() {
    let tmp = TempDir::new("program-tmpdir");
    let tmp_s = tmp.path().to_string_lossy().into_owned();
    let script = "import os, subprocess, sys, time\n\
                  x = bytearray(40 << 20)\n\
                  time.sleep(1.5)\n\
                  st = subprocess.run([sys.argv[1], 'status'], capture_output=True, text=True)\n\
                  print('status-sees-me', str(os.getpid()) in st.stdout)\n\
                  print('tmpdir', sorted(os.listdir(os.environ['TMPDIR'])))\n";
    let gleaner = gleaner_bin().to_string_lossy().into_owned();
    let (code, out, err) = run_gleaner(
        &[
            "run",
            "--local-mem",
            "16M",
            "--",
            "env",
            &format!("TMPDIR={tmp_s}"),
            real_python(),
            "-c",
            script,
            &gleaner,
        ],
        LIMIT,
    );
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("status-sees-me True"), "{out}");
    assert!(out.contains("tmpdir []"), "{out}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left in the program's TMPDIR: {left:?}");
}

/// Runs a Python program that holds 50 MiB and sleeps 30 s under `gleaner run` with the test
/// hook `GLEANER_TEST_HANG=MODE`; returns (status, stderr, seconds it took).
fn run_with_test_hang(mode: &str) -> (Option<i32>, String, f64) {
    let started = Instant::now();
    let out = Command::new(gleaner_bin())
        .args(["run", "--local-mem", "8M", "--", real_python(), "-c"])
        .arg("import time; x = bytearray(50 << 20); time.sleep(30)")
        .env("GLEANER_TEST_HANG", mode)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed().as_secs_f64(),
    )
}

/// Fault handlers that all wait for a page of their own process's far memory (the test hook
/// leaves one page unserved and has every handler read it, as handlers that broke the rule
/// would) are found by the process's watchdog within seconds: the process stops with exit 86
/// and a message naming the threads, instead of hanging with no handler left to serve faults.
#[test]
fn fault_handlers_waiting_for_themselves_stop_the_process_with_86() {
    let (code, err, secs) = run_with_test_hang("handlers");
    assert_eq!(code, Some(86), "{err}");
    assert!(
        err.contains("gleaner: FATAL: every fault handler has waited"),
        "{err}"
    );
    assert!(err.contains("(waiting: gleaner-fault0"), "{err}");
    assert!(secs < 20.0, "took {secs:.1} s (the program sleeps 30 s)");
}

/// Where the watchdog waits too (the test hook has it read the unserved page), `gleaner run`
/// ends the process itself: a message naming the process and the threads, and exit 86.
#[test]
fn a_process_whose_watchdog_waits_too_is_ended_by_gleaner_run() {
    let (code, err, secs) = run_with_test_hang("all");
    assert_eq!(code, Some(86), "{err}");
    assert!(
        err.contains(") hung: every fault handler has waited"),
        "{err}"
    );
    assert!(
        err.contains("gleaner-watch"),
        "the watchdog waits too: {err}"
    );
    assert!(err.contains("ended by gleaner run"), "{err}");
    assert!(secs < 25.0, "took {secs:.1} s (the program sleeps 30 s)");
}

/// A program that used the name service and has a stdio stream open forks after both went far.
/// The C library's fork reads and locks the name service's state after the fork handlers ran
/// (the fault handlers then held back for the fork), and resets every stream's lock in the child
/// before the child's pager starts. Before, the fork hung for good (`test_fork1` and others in
/// CPython's suite); then the child crashed on its stream, which it had read as zeros.
#[test]
fn a_fork_after_the_c_librarys_own_records_went_far_keeps_them() {
    let dir = TempDir::new("fork-libc-state");
    let path = dir.path().join("out.txt").to_string_lossy().into_owned();
    for _ in 0..3 {
        program_ok_at_8m(&["fork-libc-state", "48", &path], "fork-libc-state ok");
    }
}
