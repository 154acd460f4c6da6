//! `gleaner node` ends when asked even where its socket's file is gone (a test's temporary
//! directory removed under it): it used to wake its accept loop by connecting to that path, and
//! hung for good, holding its lock and a thread per client.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{gleaner_bin, TempDir};

#[test]
fn a_daemon_whose_socket_file_was_removed_still_exits_when_idle() {
    let dir = TempDir::new("node-gone");
    let socket = dir.path().join("node.sock");
    let mut node = Command::new(gleaner_bin())
        .args([
            "node",
            "--tick-ms",
            "20",
            "--exit-when-idle",
            "0.5",
            "--socket",
        ])
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "gleaner node did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::remove_file(&socket).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(st) = node.try_wait().unwrap() {
            assert!(st.success(), "gleaner node exited with {st}");
            break;
        }
        if Instant::now() > deadline {
            let _ = node.kill();
            let _ = node.wait();
            panic!("gleaner node did not exit when idle after its socket file was removed");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
