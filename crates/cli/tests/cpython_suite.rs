//! CPython's own regression suite, a large subset (`tests/cpython/modules.txt`: the modules
//! that fork, spawn subprocesses, use threads, signals, memory maps and resource limits, and the
//! containers' and serializers'), run under `gleaner run` at a 32 MiB budget, where the
//! interpreter's pages go far, with `-j 2` and (the process, thread and signal modules of
//! `tests/cpython/sequential.txt`) sequentially, in one long-lived interpreter, the two runs
//! side by side; a module that does not pass under gleaner is run all-local too, to compare. A
//! test suite nobody here wrote: it found the fork child that deadlocked starting its pager, the
//! hangs in `setgroups` and in the C library's fork, the pager taking the program's last
//! descriptors, and the status files left in the program's `$TMPDIR`. `tests/cpython/suite.py`
//! does the work and says what differed; this test holds it to its verdict.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{gleaner_bin, real_python};

#[test]
fn cpythons_regression_suite_has_the_same_outcomes_under_gleaner_run_and_leaves_nothing_running() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(real_python())
        .arg(root.join("tests/cpython/suite.py"))
        .arg("--gleaner")
        .arg(gleaner_bin())
        .output()
        .expect("python3 runs tests/cpython/suite.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The runs' closing lines and wall times, in the test's output.
    println!("{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    let verdict: serde_json::Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("no verdict ({e}):\n{stdout}\n{stderr}"));
    let passed = |run: &str| verdict["counts"][run]["passed"].as_u64().unwrap_or(0);
    let modules = verdict["modules"].as_u64().unwrap();
    assert!(modules >= 30, "{verdict}");
    assert!(
        verdict["sequential_modules"].as_u64().unwrap() >= 15,
        "{verdict}"
    );
    // The interpreter's own suite passes here (or nearly), under gleaner as all-local.
    assert!(passed("gleaner -j2") + 2 >= modules, "{verdict}");
    assert_eq!(verdict["timed_out"], serde_json::json!([]), "{verdict}");
    assert_eq!(verdict["same_outcomes"], true, "{verdict}");
    assert_eq!(
        verdict["extra_left_running"],
        serde_json::json!({}),
        "{verdict}"
    );
    assert_eq!(verdict["ok"], true, "{verdict}");
    assert!(out.status.success(), "{stderr}");
}
