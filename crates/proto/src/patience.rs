//! Waiting for a memnode that does not answer, out loud.
//!
//! A connection's socket times out every [`Patient::notice_every`] instead of once after the
//! whole reply timeout; each time the wait goes on, one line on standard error (a `log`
//! warning) says which memnode, what was asked, how long it has waited and how long it will
//! still wait. Only a read or write that has already timed out takes this path: an answer that
//! comes in time costs nothing more than before (no clock read, no extra system call), so the
//! fault path keeps its timing.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use crate::kind::MessageKind;

/// A byte stream whose reads and writes time out (a socket: `SO_RCVTIMEO`, `SO_SNDTIMEO`).
pub(crate) trait TimedStream: Read + Write {
    /// Sets the read and write timeouts.
    fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()>;
}

/// The longest silence between two notices.
pub const NOTICE_EVERY_MAX: Duration = Duration::from_secs(5);

/// How often a wait of `reply_timeout` in all is announced: a third of it, between 1 s and
/// [`NOTICE_EVERY_MAX`], and never more than the timeout itself (then nothing is announced).
pub fn notice_every(reply_timeout: Duration) -> Duration {
    (reply_timeout / 3)
        .clamp(Duration::from_secs(1), NOTICE_EVERY_MAX)
        .min(reply_timeout)
}

/// Whether `e` is a socket timeout (`SO_RCVTIMEO`/`SO_SNDTIMEO` report `EAGAIN`).
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A connection's stream that announces long waits (see the module documentation).
#[derive(Debug)]
pub(crate) struct Patient<S> {
    pub(crate) stream: S,
    /// Whom the notices name.
    endpoint: String,
    /// How long a reply may take in all; `None` until the handshake is done (the handshake's
    /// own timeout then applies, without notices).
    reply_timeout: Option<Duration>,
    /// The socket's timeout once patient.
    every: Duration,
    /// The request whose answer is awaited, for the notices.
    pub(crate) waiting_for: MessageKind,
}

impl<S: TimedStream> Patient<S> {
    pub(crate) fn new(stream: S, endpoint: String) -> Patient<S> {
        Patient {
            stream,
            endpoint,
            reply_timeout: None,
            every: Duration::MAX,
            waiting_for: MessageKind::Ping,
        }
    }

    /// From now on, waits up to `reply_timeout` for each read or write, announcing the wait
    /// every [`notice_every`]`(reply_timeout)`.
    pub(crate) fn set_reply_timeout(&mut self, reply_timeout: Duration) -> io::Result<()> {
        self.every = notice_every(reply_timeout);
        self.reply_timeout = Some(reply_timeout);
        self.stream.set_timeouts(Some(self.every))
    }

    /// Runs `op` again and again after a first timeout, announcing the wait, until it succeeds,
    /// fails otherwise, or the reply timeout has passed (then the timeout error is returned).
    #[cold]
    fn keep_waiting<T>(
        &mut self,
        first: io::Error,
        mut op: impl FnMut(&mut S) -> io::Result<T>,
    ) -> io::Result<T> {
        let Some(total) = self.reply_timeout else {
            return Err(first);
        };
        let started = Instant::now()
            .checked_sub(self.every)
            .unwrap_or_else(Instant::now);
        let mut last = first;
        let result = loop {
            let waited = started.elapsed();
            let Some(left) = total.checked_sub(waited).filter(|l| !l.is_zero()) else {
                break Err(last);
            };
            log::warn!(
                "the memnode at {} has not answered a {:?} request for {:.0} s; waiting {:.0} s \
                 more before the connection counts as broken (reply timeout {:.0} s: gleaner \
                 run --memnode-timeout, GLEANER_MEMNODE_TIMEOUT)",
                self.endpoint,
                self.waiting_for,
                waited.as_secs_f64(),
                left.as_secs_f64(),
                total.as_secs_f64()
            );
            let _ = self.stream.set_timeouts(Some(self.every.min(left)));
            match op(&mut self.stream) {
                Err(e) if is_timeout(&e) => last = e,
                other => break other,
            }
        };
        let _ = self.stream.set_timeouts(Some(self.every));
        result
    }
}

impl<S: TimedStream> Read for Patient<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.stream.read(buf) {
            Err(e) if is_timeout(&e) => self.keep_waiting(e, |s| s.read(buf)),
            other => other,
        }
    }
}

impl<S: TimedStream> Write for Patient<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.stream.write(buf) {
            Err(e) if is_timeout(&e) => self.keep_waiting(e, |s| s.write(buf)),
            other => other,
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self.stream.write_vectored(bufs) {
            Err(e) if is_timeout(&e) => self.keep_waiting(e, |s| s.write_vectored(bufs)),
            other => other,
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_come_every_third_of_the_timeout_within_bounds() {
        let s = Duration::from_secs;
        assert_eq!(notice_every(s(30)), s(5));
        assert_eq!(notice_every(s(6)), s(2));
        assert_eq!(notice_every(s(2)), s(1));
        assert_eq!(
            notice_every(Duration::from_millis(500)),
            Duration::from_millis(500)
        );
    }

    impl TimedStream for std::os::unix::net::UnixStream {
        fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
            self.set_read_timeout(t)?;
            self.set_write_timeout(t)
        }
    }

    #[test]
    fn a_silent_peer_is_announced_then_timed_out_after_the_whole_timeout() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut p = Patient::new(a, "unix:/test".into());
        p.set_reply_timeout(Duration::from_millis(1500)).unwrap();
        assert_eq!(p.every, Duration::from_millis(1000));
        let t = Instant::now();
        let e = p.read(&mut [0u8; 8]).unwrap_err();
        let took = t.elapsed();
        assert!(is_timeout(&e), "{e}");
        assert!(
            took >= Duration::from_millis(1450) && took < Duration::from_millis(3000),
            "{took:?}"
        );
    }
}
