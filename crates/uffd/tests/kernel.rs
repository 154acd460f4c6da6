//! Drives real userfaultfd on this kernel: missing faults, write-protect faults, EEXIST races,
//! and how kernel-side reads of a missing page behave.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use gleaner_uffd::{features, Event, FaultKind, Installed, Uffd, UffdOptions};

const PAGE: usize = 4096;

struct Map {
    addr: usize,
    len: usize,
}

impl Map {
    fn new(pages: usize) -> Map {
        let len = pages * PAGE;
        // SAFETY: anonymous private mapping with no address hint; checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Map {
            addr: p as usize,
            len,
        }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping created in `new`.
        unsafe { libc::munmap(self.addr as *mut _, self.len) };
    }
}

fn uffd(extra: u64) -> Uffd {
    Uffd::open(UffdOptions {
        features: features::PAGEFAULT_FLAG_WP | features::THREAD_ID | extra,
        allow_user_mode_only: false,
    })
    .expect("these tests run as root on a kernel with userfaultfd")
}

fn wait_event(u: &Uffd) -> Event {
    let mut evs = Vec::new();
    for _ in 0..2000 {
        let mut pfd = libc::pollfd {
            fd: u.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one valid pollfd that lives across the call.
        unsafe { libc::poll(&mut pfd, 1, 10) };
        if u.read_events(&mut evs, 1).unwrap() == 1 {
            return evs[0];
        }
    }
    panic!("no userfaultfd event within 20 s");
}

#[test]
fn missing_fault_is_served_by_copy_and_wp_fault_by_unprotect() {
    let u = Arc::new(uffd(0));
    let m = Map::new(4);
    u.register(m.addr, m.len, true).unwrap();
    let addr = m.addr + PAGE;
    let reader = thread::spawn(move || {
        // SAFETY: the page is registered; this read blocks until the handler installs it.
        let v = unsafe { std::ptr::read_volatile(addr as *const u64) };
        // SAFETY: same page, now installed write-protected: the write faults until unprotected.
        unsafe { std::ptr::write_volatile(addr as *mut u64, v + 1) };
        v
    });
    match wait_event(&u) {
        Event::Fault { kind, addr: a, tid } => {
            assert_eq!(kind, FaultKind::MissingRead);
            assert_eq!(a, addr);
            assert_ne!(tid, 0, "THREAD_ID was requested");
        }
        other => panic!("unexpected {other:?}"),
    }
    let src = vec![0x2au8; PAGE];
    // SAFETY: src is a heap buffer outside any registered range; dst is registered and aligned.
    let r = unsafe { u.copy(addr, src.as_ptr(), PAGE, true, true) }.unwrap();
    assert_eq!(r, Installed::Done);
    match wait_event(&u) {
        Event::Fault { kind, addr: a, .. } => {
            assert_eq!(kind, FaultKind::WriteProtect);
            assert_eq!(a, addr);
        }
        other => panic!("unexpected {other:?}"),
    }
    u.write_protect(addr, PAGE, false, true).unwrap();
    let v = reader.join().unwrap();
    assert_eq!(v, 0x2a2a_2a2a_2a2a_2a2a);
    assert_eq!(
        // SAFETY: the page is present and writable now.
        unsafe { std::ptr::read_volatile(addr as *const u64) },
        v + 1
    );
    // A second install on a present page reports EEXIST as AlreadyPresent.
    // SAFETY: as above.
    let r = unsafe { u.copy(addr, src.as_ptr(), PAGE, false, true) }.unwrap();
    assert_eq!(r, Installed::AlreadyPresent);
    assert_eq!(
        u.zeropage(addr, PAGE, true).unwrap(),
        Installed::AlreadyPresent
    );
}

/// The pager's evictor reads managed pages through /proc/self/mem so that a page that is
/// unexpectedly missing yields an error instead of blocking the evictor on its own fault.
#[test]
fn proc_self_mem_read_of_missing_page_fails_instead_of_blocking() {
    let u = uffd(0);
    let m = Map::new(2);
    u.register(m.addr, m.len, true).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let addr = m.addr;
    let t = thread::spawn(move || {
        let f = std::fs::File::open("/proc/self/mem").unwrap();
        let mut buf = vec![0u8; PAGE];
        let r = std::os::unix::fs::FileExt::read_at(&f, &mut buf, addr as u64);
        d2.store(true, Ordering::SeqCst);
        r.map_err(|e| e.raw_os_error())
    });
    for _ in 0..200 {
        if done.load(Ordering::SeqCst) {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    if !done.load(Ordering::SeqCst) {
        // Unblock it so the test ends, then fail.
        let src = vec![0u8; PAGE];
        // SAFETY: heap source, registered aligned destination.
        unsafe { u.copy(addr, src.as_ptr(), PAGE, false, true) }.unwrap();
        t.join().unwrap().ok();
        panic!("a /proc/self/mem read of a missing page blocked on the userfaultfd");
    }
    let r = t.join().unwrap();
    assert!(r.is_err(), "expected an error, got {r:?}");
    // Once present (installed write-protected), the same read succeeds.
    let src = vec![7u8; PAGE];
    // SAFETY: heap source, registered aligned destination.
    unsafe { u.copy(addr, src.as_ptr(), PAGE, true, true) }.unwrap();
    let f = std::fs::File::open("/proc/self/mem").unwrap();
    let mut buf = vec![0u8; PAGE];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, addr as u64).unwrap();
    assert!(buf.iter().all(|&b| b == 7));
}

#[test]
fn kernel_offers_the_features_the_pager_relies_on() {
    let f = Uffd::available_features(false).unwrap();
    for (bit, name) in [
        (features::PAGEFAULT_FLAG_WP, "WP"),
        (features::THREAD_ID, "THREAD_ID"),
        (features::MOVE, "MOVE"),
        (features::WP_ASYNC, "WP_ASYNC"),
    ] {
        assert!(f & bit != 0, "kernel lacks {name}");
    }
}

#[test]
fn a_blocking_descriptor_waits_in_read_and_a_nowait_read_still_returns_at_once() {
    let u = Arc::new(uffd(0));
    assert!(
        u.nowait_reads(),
        "this kernel cannot tell one userfaultfd read not to block (preadv2 with RWF_NOWAIT): \
         the pager's handlers fall back to poll, and this test cannot check the blocking path"
    );
    let m = Map::new(2);
    u.register(m.addr, m.len, false).unwrap();
    u.set_blocking(true).unwrap();
    let mut evs = Vec::new();
    // Nothing pending: a nowait read returns empty at once, on the blocking descriptor.
    assert_eq!(u.read_events_nowait(&mut evs, 4).unwrap(), 0);
    // A reader blocked in read gets the fault that comes later, and only then returns.
    let reading = Arc::clone(&u);
    let got = Arc::new(AtomicBool::new(false));
    let got_r = Arc::clone(&got);
    let handler = thread::spawn(move || {
        let mut evs = Vec::new();
        let n = reading.read_events(&mut evs, 4).unwrap();
        got_r.store(true, Ordering::SeqCst);
        (n, evs)
    });
    thread::sleep(Duration::from_millis(100));
    assert!(
        !got.load(Ordering::SeqCst),
        "a blocking read returned with nothing pending"
    );
    let addr = m.addr + PAGE;
    let reader = thread::spawn(move || {
        // SAFETY: the page is registered; this read blocks until the handler installs it.
        unsafe { std::ptr::read_volatile(addr as *const u64) }
    });
    let (n, fault) = handler.join().unwrap();
    assert_eq!(n, 1);
    match fault[0] {
        Event::Fault { addr: a, .. } => assert_eq!(a & !(PAGE - 1), addr),
        other => panic!("expected a fault, got {other:?}"),
    }
    let src = [7u8; PAGE];
    // SAFETY: `src` is one readable page; `addr` is a page of the registered range.
    unsafe { u.copy(addr, src.as_ptr(), PAGE, false, true) }.unwrap();
    assert_eq!(reader.join().unwrap(), u64::from_ne_bytes([7; 8]));
    // Made non-blocking again, a plain read returns empty.
    u.set_blocking(false).unwrap();
    assert_eq!(u.read_events(&mut evs, 4).unwrap(), 0);
}
