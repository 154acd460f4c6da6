//! Aborting on a panic, on any thread, in the binaries and libraries gleaner ships.
//!
//! The workspace builds with `panic = "unwind"`, so that `cargo test` (whose harness needs
//! unwinding) reuses the release build's libraries instead of compiling every crate a second
//! time. What a shipped program needs is what `panic = "abort"` gave it: a panic anywhere (a
//! pager or memnode thread, a launcher's helper) ends the process at once and loudly, never a
//! thread gone quietly while the program waits on it. [`abort_on_panic`] restores that: every
//! entry point calls it first (`gleaner`'s and `gleaner-memnode`'s `main`, the preload library's
//! constructor, the C APIs' create functions). A panic still prints its message (the default
//! hook runs first), then the process aborts (`SIGABRT`). A cdylib links its own copy of the
//! standard library, so the hook a library installs is its own and no program's hook replaces it.

use std::sync::Once;

/// Makes any later panic in this process (in this copy of the standard library) print its
/// message and abort the process. Idempotent.
pub fn abort_on_panic() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            report(info);
            std::process::abort();
        }));
    });
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    use super::abort_on_panic;

    const CHILD: &str = "GLEANER_SYS_PANIC_CHILD";
    const NAME: &str = "panic::tests::a_panic_on_another_thread_aborts_the_process";

    /// This test's binary run again, as a child that panics on a thread of its own, with the
    /// hook (`hook`) or without it.
    fn child(hook: bool) -> std::process::Output {
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env(CHILD, if hook { "hook" } else { "none" })
            .output()
            .unwrap()
    }

    #[test]
    fn a_panic_on_another_thread_aborts_the_process() {
        if let Ok(mode) = std::env::var(CHILD) {
            if mode == "hook" {
                abort_on_panic();
                abort_on_panic(); // a second call changes nothing
            }
            let joined = std::thread::spawn(|| panic!("a deliberate panic")).join();
            // Reached only if the panic did not abort: the thread is gone, the process runs on.
            assert!(joined.is_err());
            std::process::exit(7);
        }
        let with = child(true);
        let stderr = String::from_utf8_lossy(&with.stderr);
        assert_eq!(with.status.signal(), Some(libc::SIGABRT), "{stderr}");
        assert!(
            stderr.contains("a deliberate panic"),
            "the message is printed: {stderr}"
        );
        // Without the hook an unwinding build loses the thread and goes on: what it prevents.
        assert_eq!(child(false).status.code(), Some(7));
    }
}
