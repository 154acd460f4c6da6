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

/// The sqlite query cache (`python/sqlite_query_cache.py`) under a real node daemon whose soft
/// budget is smaller than the cache's results: it registers, keeps part of them (hits), rebuilds
/// the rest (misses), and every result it returns, checked against sqlite's after each of its
/// writes too, is right (its exit status says so).
#[test]
fn sqlite_query_cache_is_right_under_a_real_daemon() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::current_exe().unwrap();
    let profile = dir.parent().unwrap().parent().unwrap();
    let (lib, gleaner) = (profile.join("libgleaner_soft.so"), profile.join("gleaner"));
    assert!(
        gleaner.exists(),
        "{} is needed for the daemon: build the workspace first",
        gleaner.display()
    );
    let tmp = std::env::temp_dir().join(format!("gleaner-sqlite-cache-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let sock = tmp.join("node.sock");
    let mut daemon = Command::new(&gleaner)
        .arg("node")
        .arg("--socket")
        .arg(&sock)
        .args(["--soft-budget", "2M", "--interval", "0.2"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(daemon.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("listening on"), "daemon printed {line:?}");
    let out = Command::new("python3")
        .arg(root.join("python/sqlite_query_cache.py"))
        .args(["--rows", "60000", "--customers", "400", "--queries", "3000"])
        .args(["--write-every", "500", "--check-every", "1", "--node"])
        .arg(&sock)
        .env("GLEANER_SOFT_LIB", &lib)
        .output()
        .expect("python3");
    let _ = daemon.kill();
    let _ = daemon.wait();
    let _ = std::fs::remove_dir_all(&tmp);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(report["bad"], 0, "{report}");
    assert_eq!(report["checked"], 3000, "{report}");
    let (hits, misses) = (
        report["hits"].as_u64().unwrap(),
        report["misses"].as_u64().unwrap(),
    );
    assert!(hits > 0 && misses > 0, "{report}");
    assert!(
        report["pool"]["limit"].as_u64().unwrap() <= 2 << 20,
        "the daemon's budget did not bound the cache: {report}"
    );
}
