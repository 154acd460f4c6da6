//! Runs the Python binding's tests (`python/test_gleaner_soft.py`) against the
//! `libgleaner_soft.so` this build made.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn python_binding_tests_pass() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let exe = std::env::current_exe().unwrap();
    let lib = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("libgleaner_soft.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    let out = Command::new("python3")
        .arg(root.join("python/test_gleaner_soft.py"))
        .env("GLEANER_SOFT_LIB", &lib)
        .output()
        .expect("python3 is needed for the binding's tests");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("OK"), "{err}");
}
