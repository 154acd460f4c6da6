//! Signals sent to `gleaner run` go on to the program it runs; and a signal's name, for the
//! summary of a program a signal ended.

use std::sync::atomic::{AtomicI32, Ordering};

use super::SetupError;

/// The running child's pid (0 when none), for the signal thread.
pub(super) static CHILD_PID: AtomicI32 = AtomicI32::new(0);

/// Forwards termination and user signals sent to the launcher on to the program.
///
/// A signal from the terminal (Ctrl-C, Ctrl-\) already reaches the program, which is in the
/// same process group; only signals another process sent to the launcher (`kill PID`) are
/// forwarded, so the program never receives one twice.
pub(super) struct SignalForwarder {
    handle: signal_hook::iterator::Handle,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The signals forwarded to the program.
const FORWARDED: [i32; 7] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
];

impl SignalForwarder {
    /// Starts forwarding, on a thread of its own, to the pid in [`CHILD_PID`].
    pub(super) fn install() -> Result<SignalForwarder, SetupError> {
        use signal_hook::iterator::exfiltrator::WithOrigin;
        use signal_hook::iterator::SignalsInfo;
        let mut signals = SignalsInfo::<WithOrigin>::new(FORWARDED)
            .map_err(|e| SetupError::new(format!("installing signal handlers: {e}")))?;
        let handle = signals.handle();
        let thread = std::thread::Builder::new()
            .name("gleaner-signals".into())
            .spawn(move || {
                for origin in signals.forever() {
                    let from_terminal = origin.process.is_none()
                        && matches!(origin.signal, libc::SIGINT | libc::SIGQUIT | libc::SIGWINCH);
                    let pid = CHILD_PID.load(Ordering::SeqCst);
                    if pid > 0 && !from_terminal {
                        // SAFETY: kill(2) with a pid we spawned and have not yet reaped.
                        unsafe { libc::kill(pid, origin.signal) };
                    }
                }
            })
            .map_err(|e| SetupError::new(format!("starting the signal thread: {e}")))?;
        Ok(SignalForwarder {
            handle,
            thread: Some(thread),
        })
    }

    /// Stops forwarding and joins the thread.
    pub(super) fn stop(mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The name of signal `sig`, for the summary of a program it ended.
pub(super) fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        _ => "see kill -l",
    }
}
