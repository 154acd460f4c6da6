//! Peeking at a descriptor that arrives while the process has no number free: the descriptor
//! stays queued, a later peek gets it, and reading the frame afterwards leaves no second copy.
//! Its own test binary (its own process): it lowers the process's descriptor limit.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;

use gleaner_proto::fdpass::{peek_fd, read_frame_dropping_fds, write_frame_with_fd, Peeked};
use gleaner_proto::MessageKind;

fn set_soft_limit(soft: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write one rlimit in the live local.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = soft;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count() - 1 // read_dir's own
}

#[test]
fn a_peek_with_no_number_free_leaves_the_descriptor_queued() {
    let (a, b) = UnixStream::pair().unwrap();
    let (mut r, w) = std::io::pipe().unwrap();
    write_frame_with_fd(&a, MessageKind::Grant, 7, &[4, 5], w.as_fd()).unwrap();
    drop(w);

    // Take every number below a low limit.
    let highest = [a.as_raw_fd(), b.as_raw_fd(), r.as_raw_fd()]
        .into_iter()
        .max()
        .unwrap() as u64;
    set_soft_limit(highest + 4);
    let mut fillers = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        fillers.push(f);
    }
    assert!(matches!(peek_fd(&b).unwrap(), Peeked::NoNumber));
    assert!(
        matches!(peek_fd(&b).unwrap(), Peeked::NoNumber),
        "still queued"
    );

    // A number frees: the peek gets a copy, and the frame is still there to read.
    fillers.pop();
    let Peeked::Fd(copy) = peek_fd(&b).unwrap() else {
        panic!("the peek got no descriptor once a number was free");
    };
    drop(fillers);
    let before = open_descriptors();
    let mut payload = Vec::new();
    let h = read_frame_dropping_fds(&b, &mut payload).unwrap();
    assert_eq!((h.kind, h.req_id), (MessageKind::Grant, 7));
    assert_eq!(payload, [4, 5]);
    assert_eq!(
        open_descriptors(),
        before,
        "the read installed no second copy"
    );

    // The copy is the pipe's write end, and the only one left: writing through it reaches `r`,
    // and closing it ends the pipe.
    let mut w2 = std::fs::File::from(copy);
    w2.write_all(b"ok").unwrap();
    drop(w2);
    let mut got = String::new();
    r.read_to_string(&mut got).unwrap();
    assert_eq!(got, "ok");

    // A frame without a descriptor peeks as such.
    gleaner_proto::write_frame(&mut &a, MessageKind::Ack, 8, &[]).unwrap();
    assert!(matches!(peek_fd(&b).unwrap(), Peeked::NoFd));
}
