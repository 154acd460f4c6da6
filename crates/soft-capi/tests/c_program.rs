//! Compiles `tests/c/soft_test.c` against `include/gleaner_soft.h` and `libgleaner_soft.so`,
//! and runs it alone, then registered with a real `gleaner node` process.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn build() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = profile_dir();
    assert!(
        dir.join("libgleaner_soft.so").exists(),
        "libgleaner_soft.so was not built"
    );
    let bin = dir.join("gleaner_c_soft_test");
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join("tests/c/soft_test.c"))
        .arg("-L")
        .arg(&dir)
        .arg("-lgleaner_soft")
        .arg("-o")
        .arg(&bin)
        .output()
        .expect("a C compiler (cc)");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    bin
}

#[test]
fn c_program_uses_soft_memory_through_the_c_api() {
    let bin = build();
    let out = Command::new(&bin)
        .env("LD_LIBRARY_PATH", profile_dir())
        .env_remove("GLEANER_NODE_SOCKET")
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && so.starts_with("ok"),
        "{so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Registered with a real daemon.
    let gleaner = profile_dir().join("gleaner");
    assert!(
        gleaner.exists(),
        "{} is needed: build the workspace first",
        gleaner.display()
    );
    let sock = std::env::temp_dir().join(format!("gleaner-c-soft-{}.sock", std::process::id()));
    let mut node = Command::new(&gleaner)
        .arg("node")
        .arg("--socket")
        .arg(&sock)
        .args(["--soft-budget", "32M", "--interval", "0.2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(node.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("listening on"), "{line}");
    let out = Command::new(&bin)
        .env("LD_LIBRARY_PATH", profile_dir())
        .env("GLEANER_NODE_SOCKET", &sock)
        .output()
        .unwrap();
    let _ = node.kill();
    let _ = node.wait();
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_file(format!("{}.lock", sock.display()));
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
