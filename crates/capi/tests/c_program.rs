//! Compiles `tests/c/region_test.c` against `include/gleaner.h` and `libgleaner.so`, and runs it
//! with a real embedded memnode.

use std::path::PathBuf;
use std::process::Command;

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
    let run = Command::new(&out_bin)
        .env("GLEANER_TEST_TOKEN_FILE", &token)
        .env("LD_LIBRARY_PATH", &profile_dir)
        .env("GLEANER_BIN", &gleaner)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&token);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("c api ok"), "{stdout}");
    assert!(stdout.contains("\"remote\""), "{stdout}");
}
