//! The descriptors gleaner holds inside a program's process, and how they are kept from it.
//!
//! A pager lives in the program's process and shares its descriptor table: its userfaultfd, its
//! memnode connection, the slabs' memfds, eviction pipes, eventfds. Programs close descriptors
//! they never opened: a daemon or a fork child about to exec closes "everything above 2"
//! (`close_range`, `closefrom`, a loop of `close`; Python's `subprocess` does it in every
//! child), and a shell script's `exec 3>file` makes descriptor 3 its own with `dup2`. Closing
//! the userfaultfd would unregister the far-memory region, and the kernel would then hand the
//! program zeros for every page it had evicted. So:
//!
//! * [`adopt`] moves each descriptor the pager keeps to a high number, out of the range where
//!   programs name descriptors themselves, and records it;
//! * the interposed `close`, `close_range`, `closefrom`, `dup2` and `dup3` (in the preload
//!   library) ask [`is_held`] and [`held_in`] and leave recorded descriptors alone, unless
//!   gleaner's own code is the caller, which then [`forget`]s one before closing it.
//!
//! The record is a bitmap of atomics over the first [`TRACKED`] descriptor numbers: reading it
//! takes no lock, so an interposed call costs one load per descriptor it asks about.
//!
//! Until it is adopted, a descriptor gleaner has just made sits at the lowest free number, which
//! may be one the program closed and is about to fill by number (`dup2`): gleaner makes and
//! adopts (or closes) each inside a [`Making`] window, and the interposed calls take turns
//! with it ([`program_call`]; the `making` module says why and how).
//!
//! A server at its descriptor limit (`EMFILE`) handles that itself, but the pager would fail a
//! write-back or a fetch for want of one descriptor (a shared-memory grant's memfd, an
//! eviction pipe) and stop the program. So a pager keeps spare descriptors, as many as it may
//! make mid-run ([`keep_spares`]), and gives some up just before it makes descriptors of its
//! own ([`with_room`]; [`with_room_retrying`] where the program may take the freed number
//! first).

#![deny(missing_docs)]

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

mod connect;
mod limit;
mod making;

pub use connect::connect_unix;
pub use limit::{confined, headroom, Headroom};
pub use making::{making, program_call, Making, ProgramCall, GLEANER_PATIENCE, PROGRAM_PATIENCE};

/// For a fork child's first moments (the preload library's fork handler): a descriptor limit
/// its parent had raised at the fork goes back to the program's, and the windows in which the
/// parent's other threads were making descriptors ([`Making`]) are not the child's.
pub fn after_fork_in_child() {
    making::after_fork_in_child();
    limit::after_fork_in_child();
}

/// Makes a descriptor with `make` and adopts it ([`adopt`]), in one [`Making`] window: `make`
/// must not block (no connection's handshake, no wait for a peer).
pub fn make_held<T, E>(make: impl FnOnce() -> Result<T, E>) -> Result<T, E>
where
    T: Into<OwnedFd> + From<OwnedFd>,
{
    let _making = making();
    Ok(T::from(adopt(make()?.into())))
}

/// `std::fs::write`, in a [`Making`] window (the file's descriptor is open for the write): for
/// the reports gleaner writes while the program runs.
pub fn write(path: impl AsRef<std::path::Path>, contents: impl AsRef<[u8]>) -> std::io::Result<()> {
    let _making = making();
    std::fs::write(path, contents)
}

/// `std::fs::read_to_string`, in a [`Making`] window (the file's descriptor is open for the
/// read): for the small files of `/proc` and `/sys` gleaner reads while the program runs.
pub fn read_to_string(path: impl AsRef<std::path::Path>) -> std::io::Result<String> {
    let _making = making();
    std::fs::read_to_string(path)
}

/// Descriptor numbers below this are recorded; one above it cannot be (it is left where it is,
/// unprotected, which only a program with this many descriptors open would meet).
pub const TRACKED: usize = 1 << 16;

/// The lowest number [`adopt`] moves a descriptor to: above a soft `RLIMIT_NOFILE` lower than
/// this, which is raised while gleaner makes descriptors ([`headroom`]), or, where no limit can
/// be raised that far ([`confined`]), half the soft limit instead.
pub const PREFERRED_FLOOR: RawFd = 1024;

const WORDS: usize = TRACKED / 64;

#[allow(clippy::declare_interior_mutable_const)] // Used only to initialize the array below.
const EMPTY: AtomicU64 = AtomicU64::new(0);
static HELD: [AtomicU64; WORDS] = [EMPTY; WORDS];

/// The floor [`adopt`] moves descriptors to (0: not computed yet).
static FLOOR: AtomicI32 = AtomicI32::new(0);

/// The most spare descriptors a process keeps ([`keep_spares`]).
pub const MAX_SPARES: usize = 32;

#[allow(clippy::declare_interior_mutable_const)] // Used only to initialize the array below.
const NO_SPARE: AtomicI32 = AtomicI32::new(-1);
static SPARE: [AtomicI32; MAX_SPARES] = [NO_SPARE; MAX_SPARES];
/// How many spares this process keeps ([`keep_spares`]; 0: none).
static SPARES: AtomicUsize = AtomicUsize::new(0);

/// Starts keeping `n` spare descriptors (at most [`MAX_SPARES`]; held, like the pager's own), for
/// [`with_room`]: as many as the pager may make mid-run and keep (three per evicting thread
/// that opens its evictor late) plus what one operation makes for a while (a grant's two).
pub fn keep_spares(n: usize) {
    SPARES.store(n.min(MAX_SPARES), Ordering::Relaxed);
    refill();
}

/// Makes up the spares given up by [`make_room`], as far as the descriptor limit allows now
/// (nothing unless [`keep_spares`] was called).
pub fn refill() {
    let _room = headroom();
    for spare in &SPARE[..SPARES.load(Ordering::Relaxed)] {
        if spare.load(Ordering::Acquire) >= 0 {
            continue;
        }
        let made = make_held(|| {
            // SAFETY: eventfd(2) returns a new descriptor or -1 (an eventfd: no file system
            // needed).
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
            if fd < 0 {
                return Err(());
            }
            // SAFETY: the kernel just made `fd`; nothing else owns it.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        });
        let Ok(fd) = made else {
            return; // At the limit: later.
        };
        let fd = fd.into_raw_fd();
        if spare
            .compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            forget(fd);
            // SAFETY: `fd` is ours alone, just made above.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
}

/// Gives up to `n` spare descriptors back, so that the next `n` descriptors the caller makes
/// find a free number even where the program holds all the others. Returns how many it gave.
pub fn make_room(n: usize) -> usize {
    let mut given = 0;
    for spare in &SPARE {
        if given == n {
            break;
        }
        let fd = spare.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            forget(fd);
            // SAFETY: the spare was ours alone (taken out of its slot above).
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
            given += 1;
        }
    }
    given
}

/// Runs `make`, which makes up to `n` descriptors, with room made for them first
/// ([`make_room`]), and makes up the spares afterwards ([`refill`]). One at a time: two
/// threads making room at once could take more spares than there are.
pub fn with_room<T>(n: usize, make: impl FnOnce() -> T) -> T {
    let _turn = Turn::take();
    let _room = headroom();
    make_room(n);
    let made = make();
    refill();
    made
}

/// How long [`with_room_retrying`] keeps trying to find a number for a new descriptor.
pub const NUMBER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether `e` says the process has no descriptor number free (`EMFILE`).
pub fn is_out_of_numbers(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EMFILE)
}

/// As [`with_room`], but tried again while `make` fails for want of a descriptor number
/// (`out_of_numbers`), for up to [`NUMBER_PATIENCE`], with pauses growing from 50 us to 20 ms
/// and room made again each time. Giving a spare up and making a descriptor are two system
/// calls: a program thread that opens descriptors in a loop can take the freed number in
/// between (where the limit could not be raised, [`confined`], the spares lie in its range),
/// and at its limit it gives numbers back only now and then. Returns `make`'s last result.
pub fn with_room_retrying<T, E>(
    n: usize,
    mut make: impl FnMut() -> Result<T, E>,
    out_of_numbers: impl Fn(&E) -> bool,
) -> Result<T, E> {
    let started = std::time::Instant::now();
    let mut pause = std::time::Duration::from_micros(50);
    loop {
        match with_room(n, &mut make) {
            Err(e) if out_of_numbers(&e) && started.elapsed() < NUMBER_PATIENCE => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(20));
            }
            made => return made,
        }
    }
}

/// The pid of the process one of whose threads is inside [`with_room`] (0: nobody). Not a
/// mutex: a fork child inherits the value of a parent's thread that was inside, a thread the
/// child does not have, and takes the turn over instead of waiting for it forever.
static TURN: AtomicI32 = AtomicI32::new(0);

thread_local! {
    /// Whether this thread holds the turn: a `with_room` inside another (a reconnection while a
    /// grant makes room, say) goes on within it rather than wait for itself.
    static HOLDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A turn at [`with_room`] (or, `nested`, the turn this thread already holds), given back when
/// dropped.
struct Turn {
    nested: bool,
}

impl Turn {
    fn take() -> Turn {
        if HOLDING.with(|h| h.get()) {
            return Turn { nested: true };
        }
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        loop {
            let taken = match TURN.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => true,
                Err(holder) => {
                    holder != me
                        && TURN
                            .compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed)
                            .is_ok()
                }
            };
            if taken {
                HOLDING.with(|h| h.set(true));
                return Turn { nested: false };
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if !self.nested {
            HOLDING.with(|h| h.set(false));
            TURN.store(0, Ordering::Release);
        }
    }
}

fn slot(fd: RawFd) -> Option<(usize, u64)> {
    let i = usize::try_from(fd).ok().filter(|&i| i < TRACKED)?;
    Some((i / 64, 1 << (i % 64)))
}

/// The number descriptors are moved above: [`PREFERRED_FLOOR`], where the soft limit reaches
/// past it or can be raised to ([`headroom`]); else half the soft descriptor limit, so that the
/// moved descriptors stay below the limit ([`confined`]).
pub fn floor() -> RawFd {
    let known = FLOOR.load(Ordering::Relaxed);
    if known > 0 {
        return known;
    }
    if limit::floor_reachable() {
        FLOOR.store(PREFERRED_FLOOR, Ordering::Relaxed);
        return PREFERRED_FLOOR;
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the live local.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        1024
    };
    let floor = (soft / 2).clamp(3, PREFERRED_FLOOR as u64) as RawFd;
    FLOOR.store(floor, Ordering::Relaxed);
    floor
}

/// Moves `fd` to the lowest free number at or above [`floor`] (close-on-exec, as gleaner's
/// descriptors all are) and records it as gleaner's. Where no number there is free (the limit
/// reached), or the number would be beyond what is recorded, it is recorded where it is, if it
/// can be.
///
/// Called inside the [`Making`] window in which `fd` was made ([`make_held`]); it opens one of
/// its own as well, for the moment the old number is closed.
pub fn adopt(fd: OwnedFd) -> OwnedFd {
    let _making = making();
    let _room = headroom();
    // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor for the same file or returns -1; `fd` is
    // live for the call.
    let moved = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor()) };
    let fd = if moved >= 0 && slot(moved).is_some() {
        // SAFETY: the kernel just made `moved`; nothing else owns it. The old number is closed
        // when `fd` drops (not recorded yet, so the interposed close lets it go).
        unsafe { OwnedFd::from_raw_fd(moved) }
    } else {
        if moved >= 0 {
            // SAFETY: `moved` is ours and unused.
            unsafe { libc::close(moved) };
        }
        fd
    };
    if let Some((w, bit)) = slot(fd.as_raw_fd()) {
        HELD[w].fetch_or(bit, Ordering::AcqRel);
    }
    fd
}

/// Whether `fd` is one gleaner holds.
pub fn is_held(fd: RawFd) -> bool {
    slot(fd).is_some_and(|(w, bit)| HELD[w].load(Ordering::Acquire) & bit != 0)
}

/// Stops recording `fd`: gleaner is about to close it.
pub fn forget(fd: RawFd) {
    if let Some((w, bit)) = slot(fd) {
        HELD[w].fetch_and(!bit, Ordering::AcqRel);
    }
}

/// Calls `f` with each descriptor gleaner holds between `first` and `last` inclusive, in
/// ascending order.
pub fn held_in(first: u32, last: u32, mut f: impl FnMut(RawFd)) {
    let last = (last as usize).min(TRACKED - 1);
    let mut i = first as usize;
    while i <= last {
        let word = HELD[i / 64].load(Ordering::Acquire) >> (i % 64);
        if word == 0 {
            i = (i / 64 + 1) * 64;
            continue;
        }
        let next = i + word.trailing_zeros() as usize;
        if next > last {
            break;
        }
        f(next as RawFd);
        i = next + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spares and the turn are the process's: tests of them take turns.
    static SPARES_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the live array.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both were just made and are owned by nothing else.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    #[test]
    fn an_adopted_descriptor_moves_above_the_floor_is_recorded_and_still_works() {
        let (r, w) = pipe();
        let (r_before, w_before) = (r.as_raw_fd(), w.as_raw_fd());
        let (r, w) = (adopt(r), adopt(w));
        assert!(r.as_raw_fd() >= floor() && w.as_raw_fd() >= floor());
        assert!(is_held(r.as_raw_fd()) && is_held(w.as_raw_fd()));
        assert!(
            !is_held(r_before) && !is_held(w_before),
            "the old numbers are not recorded"
        );
        assert_eq!(
            // SAFETY: F_GETFD on a closed number fails; no memory is touched.
            unsafe { libc::fcntl(r_before, libc::F_GETFD) },
            -1,
            "the old number is closed"
        );
        assert_eq!(
            // SAFETY: F_GETFD reads the live descriptor's flags.
            unsafe { libc::fcntl(r.as_raw_fd(), libc::F_GETFD) },
            libc::FD_CLOEXEC
        );
        let byte = 7u8;
        assert_eq!(
            // SAFETY: one byte from a live local into our pipe.
            unsafe { libc::write(w.as_raw_fd(), (&byte as *const u8).cast(), 1) },
            1
        );
        let mut got = 0u8;
        assert_eq!(
            // SAFETY: one byte into a live local from our pipe.
            unsafe { libc::read(r.as_raw_fd(), (&mut got as *mut u8).cast(), 1) },
            1
        );
        assert_eq!(got, 7);
        let mut seen = Vec::new();
        held_in(0, u32::MAX, |fd| seen.push(fd));
        assert!(
            seen.contains(&r.as_raw_fd()) && seen.contains(&w.as_raw_fd()),
            "{seen:?}"
        );
        assert!(seen.windows(2).all(|p| p[0] < p[1]), "ascending: {seen:?}");
        forget(r.as_raw_fd());
        assert!(!is_held(r.as_raw_fd()));
        forget(w.as_raw_fd());
    }

    #[test]
    fn spares_are_held_given_up_for_room_and_made_up_again() {
        let _one = SPARES_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        keep_spares(4);
        let spares = || {
            SPARE
                .iter()
                .map(|s| s.load(Ordering::Acquire))
                .filter(|&fd| fd >= 0)
                .collect::<Vec<_>>()
        };
        let before = spares();
        assert_eq!(before.len(), 4);
        assert!(
            before.iter().all(|&fd| is_held(fd) && fd >= floor()),
            "{before:?}"
        );
        assert_eq!(make_room(2), 2);
        assert_eq!(spares().len(), 2);
        let given: Vec<_> = before.iter().filter(|fd| !spares().contains(fd)).collect();
        for &&fd in &given {
            assert!(!is_held(fd));
            assert_eq!(
                // SAFETY: F_GETFD on a closed number fails; no memory is touched.
                unsafe { libc::fcntl(fd, libc::F_GETFD) },
                -1,
                "{fd} was closed"
            );
        }
        let made = with_room(4, || spares().len());
        assert_eq!(made, 0, "all given up for the call");
        assert_eq!(spares().len(), 4, "and made up after it");
    }

    #[test]
    fn a_turn_left_by_a_thread_of_another_process_is_taken_over() {
        // What a fork child sees when a thread of its parent was inside `with_room` at the
        // fork: the turn held by a pid that is not its own, and no thread to give it back.
        let _one = SPARES_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        TURN.store(1, Ordering::Release);
        assert_eq!(with_room(0, || 42), 42);
        assert_eq!(TURN.load(Ordering::Acquire), 0, "given back");
        // A thread that holds the turn goes on within it; the turn is given back once.
        assert_eq!(with_room(0, || with_room(0, || 7)), 7);
        assert_eq!(TURN.load(Ordering::Acquire), 0, "given back");
    }

    #[test]
    fn held_in_reports_only_the_range_asked_for() {
        for fd in [3, 63, 64, 65, 200, TRACKED as RawFd - 1] {
            let (w, bit) = slot(fd).unwrap();
            HELD[w].fetch_or(bit, Ordering::AcqRel);
        }
        let mut seen = Vec::new();
        held_in(63, 65, |fd| seen.push(fd));
        assert_eq!(seen, vec![63, 64, 65]);
        seen.clear();
        held_in(66, 199, |fd| seen.push(fd));
        assert!(seen.iter().all(|&fd| (66..=199).contains(&fd)), "{seen:?}");
        seen.clear();
        held_in(TRACKED as u32 - 1, u32::MAX, |fd| seen.push(fd));
        assert_eq!(seen, vec![TRACKED as RawFd - 1]);
        assert!(slot(TRACKED as RawFd).is_none() && slot(-1).is_none());
        for fd in [3, 63, 64, 65, 200, TRACKED as RawFd - 1] {
            forget(fd);
        }
    }
}
