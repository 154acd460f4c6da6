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
//!
//! The message goes to descriptor 2, which in a program's process is the program's: it may have
//! closed it or pointed it at a file of its own (CPython's tests swap it for a temporary file),
//! and a panic then went unexplained. [`report_panics_to`] hands each message to a reporter as
//! well (the preload library writes it where `gleaner run` reads it, through a descriptor the
//! program cannot touch).

use std::sync::{Once, OnceLock};

/// Where each panic's message goes besides descriptor 2 ([`report_panics_to`]).
static REPORTER: OnceLock<fn(&str)> = OnceLock::new();

/// Makes any later panic in this process (in this copy of the standard library) print its
/// message and abort the process. Idempotent.
pub fn abort_on_panic() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            report(info);
            if let Some(reporter) = REPORTER.get() {
                let thread = std::thread::current();
                let name = thread.name().unwrap_or("<unnamed>");
                reporter(&format!("thread '{name}' {info}"));
            }
            std::process::abort();
        }));
    });
}

/// Also hands each panic's message (`thread 'NAME' panicked at FILE:LINE:COL:` and the
/// message) to `report`, after it is printed and before the process aborts. The first call's
/// reporter stays; it must not panic (a panic inside the hook aborts at once).
pub fn report_panics_to(report: fn(&str)) {
    let _ = REPORTER.set(report);
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    use super::{abort_on_panic, report_panics_to};

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
                report_panics_to(|message| eprintln!("REPORTED: {message}"));
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
        let reported = stderr
            .lines()
            .find(|l| l.starts_with("REPORTED: thread '<unnamed>' panicked at"))
            .unwrap_or_else(|| panic!("handed to the reporter: {stderr}"));
        assert!(reported.contains("panic.rs"), "{reported}");
        assert!(
            stderr.contains("REPORTED") && stderr.matches("a deliberate panic").count() == 2,
            "the message with it: {stderr}"
        );
        // Without the hook an unwinding build loses the thread and goes on: what it prevents.
        assert_eq!(child(false).status.code(), Some(7));
    }
}
