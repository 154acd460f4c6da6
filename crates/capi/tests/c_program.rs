//! Compiles `tests/c/region_test.c` against `include/gleaner.h` and `libgleaner.so`, and runs it
//! with a real embedded memnode, then with a pool of two real memnode processes.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A `gleaner memnode` on loopback with `token`; its process (killed by the caller) and address.
fn memnode(gleaner: &Path, token: &Path) -> (Child, String) {
    let mut child = Command::new(gleaner)
        .args([
            "memnode",
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "256M",
            "--token-file",
        ])
        .arg(token)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("gleaner memnode");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("memnode printed {line:?}"))
        .to_string();
    (child, addr)
}

#[test]
fn c_program_uses_a_region_through_the_c_api() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    // target/<profile>/deps/c_program-HASH → target/<profile>
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let lib = profile_dir.join("libgleaner.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    let gleaner = profile_dir.join("gleaner");
    assert!(
        gleaner.exists(),
        "{} is needed for the embedded memnode: build the workspace first (cargo build)",
        gleaner.display()
    );
    let out_bin = profile_dir.join("gleaner_c_region_test");
    let cc = Command::new("cc")
        .arg("-O1")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(root.join("include"))
        .arg(root.join("tests/c/region_test.c"))
        .arg("-L")
        .arg(&profile_dir)
        .arg("-lgleaner")
        .arg("-o")
        .arg(&out_bin)
        .output()
        .expect("a C compiler (cc)");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let token = profile_dir.join(format!("gleaner_c_test_token_{}", std::process::id()));
    gleaner_proto::write_token_file(&token, &gleaner_proto::generate_token()).unwrap();
    let nodes = [memnode(&gleaner, &token), memnode(&gleaner, &token)];
    let pool = format!("{},{}", nodes[0].1, nodes[1].1);
    let run = Command::new(&out_bin)
        .env("GLEANER_TEST_TOKEN_FILE", &token)
        .env("GLEANER_TEST_POOL", &pool)
        .env("LD_LIBRARY_PATH", &profile_dir)
        .env("GLEANER_BIN", &gleaner)
        .output()
        .unwrap();
    for (mut child, _) in nodes {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = std::fs::remove_file(&token);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("c api ok"), "{stdout}");
    assert!(stdout.contains("\"remote\""), "{stdout}");
    assert!(
        stdout.contains("\"replicas\": 2"),
        "the pool region has two replicas: {stdout}"
    );
}
