//! The exported `execve`, `execv`, `execvpe`, `execvp`, `posix_spawn` and `posix_spawnp`: a
//! process of the run that starts a program which will come up **without a pager** tells
//! `gleaner run` so, which names it in its summary with the reason.
//!
//! A statically linked program (no `PT_INTERP`: the dynamic loader, and so `LD_PRELOAD`, never
//! runs), a set-user-ID or set-group-ID one (the loader ignores `LD_PRELOAD` for it), or one
//! started with an environment that lost gleaner's library from `LD_PRELOAD` keeps all of its
//! memory local and reports nothing; until this module a run of `sh -c ./static_program` that
//! filled 64 MiB said only "no process reported far-memory stats". The report is a file
//! `nopager-PID-N.json` in `$GLEANER_REPORT_DIR`, written before the `exec` (and removed if the
//! `exec` fails) or after the spawn.
//!
//! These wrappers may run in the child of a `vfork`, which shares its parent's memory: they
//! allocate nothing and call only system calls (`open`, `pread`, `fstat`, `write`, `unlink`),
//! with their buffers on the stack. The C library's own `execvp`, `system` and `popen` call its
//! internal `execve` and are not seen; shells and Python's `subprocess` call the exported ones.

// The exported functions replace C library calls: their contract is the C library's (its manual
// pages), the same for every caller, so no `# Safety` section is repeated on each.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use crate::real::next;

type ExecveFn =
    unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
type SpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const c_void,
    *const c_void,
    *const *mut c_char,
    *const *mut c_char,
) -> c_int;

extern "C" {
    static environ: *const *const c_char;
}

/// Why a program will run without a pager, or `None` when it will have one (or cannot be
/// read: the `exec` then reports its own error).
fn without_pager(path: &CStr, envp: *const *const c_char) -> Option<&'static str> {
    // Open for a moment at the lowest free number, so inside a window the program's `dup2`
    // waits for (`gleaner_fds::making`).
    let making = gleaner_fds::making();
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let kind = classify(fd);
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    drop(making);
    match kind? {
        Binary::Static => Some(
            "statically linked: no dynamic loader runs, so LD_PRELOAD cannot reach it and all \
             of its memory stays local",
        ),
        Binary::SetId => Some(
            "set-user-ID or set-group-ID: the dynamic loader ignores LD_PRELOAD for it, so all \
             of its memory stays local",
        ),
        Binary::Dynamic if !preload_kept(envp) => Some(
            "started with an environment whose LD_PRELOAD no longer names gleaner's library, \
             so all of its memory stays local",
        ),
        Binary::Dynamic => None,
    }
}

/// What an executable file is, as far as `LD_PRELOAD` is concerned.
enum Binary {
    /// Has a dynamic loader (`PT_INTERP`), or is a script (its interpreter runs).
    Dynamic,
    /// An ELF file without `PT_INTERP`.
    Static,
    /// Set-user-ID or set-group-ID (secure-execution mode).
    SetId,
}

/// Reads the file at `fd`: `None` when it is neither ELF nor a script, or unreadable.
fn classify(fd: c_int) -> Option<Binary> {
    // SAFETY: `st` is written by fstat on success only, and read only then.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a stat buffer of the right type.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    let mut hdr = [0u8; 64];
    if pread_full(fd, &mut hdr, 0) < 4 {
        return None;
    }
    if hdr.starts_with(b"#!") {
        return Some(Binary::Dynamic);
    }
    // ELF, 64-bit, little endian (x86-64, AArch64).
    if &hdr[..4] != b"\x7fELF" || hdr[4] != 2 || hdr[5] != 1 {
        return None;
    }
    if st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
        return Some(Binary::SetId);
    }
    let phoff = u64::from_le_bytes(hdr[32..40].try_into().ok()?);
    let phentsize = u16::from_le_bytes([hdr[54], hdr[55]]) as usize;
    let phnum = u16::from_le_bytes([hdr[56], hdr[57]]) as usize;
    if phentsize < 4 {
        return None;
    }
    const PT_INTERP: u32 = 3;
    let mut table = [0u8; 4096];
    let want = (phentsize * phnum).min(table.len());
    let got = pread_full(fd, &mut table[..want], phoff as libc::off_t);
    let has_interp = table[..got]
        .chunks_exact(phentsize)
        .any(|ph| u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]) == PT_INTERP);
    Some(if has_interp {
        Binary::Dynamic
    } else {
        Binary::Static
    })
}

/// Reads up to `buf.len()` bytes at `off`; returns how many came.
fn pread_full(fd: c_int, buf: &mut [u8], off: libc::off_t) -> usize {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes at most the rest of `buf`.
        let n = unsafe {
            libc::pread(
                fd,
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                off + done as libc::off_t,
            )
        };
        if n <= 0 {
            break;
        }
        done += n as usize;
    }
    done
}

/// Whether `envp` has an `LD_PRELOAD` naming gleaner's library.
fn preload_kept(envp: *const *const c_char) -> bool {
    if envp.is_null() {
        return false;
    }
    let mut i = 0;
    loop {
        // SAFETY: `envp` is a NULL-terminated array of NUL-terminated strings (exec's contract).
        let entry = unsafe { *envp.add(i) };
        if entry.is_null() {
            return false;
        }
        // SAFETY: as above.
        let bytes = unsafe { CStr::from_ptr(entry) }.to_bytes();
        if let Some(value) = bytes.strip_prefix(b"LD_PRELOAD=") {
            if value
                .windows(b"libgleaner_preload".len())
                .any(|w| w == b"libgleaner_preload")
            {
                return true;
            }
        }
        i += 1;
    }
}

/// A small text buffer on the stack (no allocation).
struct StackText<const N: usize> {
    buf: [u8; N],
    len: usize,
    /// Whether something did not fit.
    overflow: bool,
}

impl<const N: usize> StackText<N> {
    fn new() -> Self {
        StackText {
            buf: [0; N],
            len: 0,
            overflow: false,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.len + bytes.len() > N {
            self.overflow = true;
            return;
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    fn push_u64(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }

    /// `s` as the inside of a JSON string.
    fn push_json_str(&mut self, s: &[u8]) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for &b in s {
            match b {
                b'"' => self.push(b"\\\""),
                b'\\' => self.push(b"\\\\"),
                0..=0x1f | 0x7f.. => {
                    // Control bytes and non-ASCII as \u00XX (a path is bytes, not UTF-8).
                    self.push(b"\\u00");
                    self.push(&[HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
                }
                _ => self.push(&[b]),
            }
        }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Which report of this process's this is (`nopager-PID-N.json`).
static SEQ: AtomicU32 = AtomicU32::new(0);

/// Writes `nopager-PID-N.json` for `pid` starting `program` without a pager because of
/// `reason`; returns the file's path (NUL-terminated) to remove should the start fail.
fn report(pid: libc::pid_t, program: &CStr, reason: &str) -> Option<StackText<4200>> {
    let dir = crate::report_dir_known()?;
    let mut path = StackText::<4200>::new();
    path.push(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()));
    path.push(b"/nopager-");
    path.push_u64(pid as u64);
    path.push(b"-");
    path.push_u64(u64::from(SEQ.fetch_add(1, Ordering::Relaxed)));
    path.push(b".json\0");
    let mut text = StackText::<8192>::new();
    text.push(b"{\"pid\":");
    text.push_u64(pid as u64);
    text.push(b",\"parent_pid\":");
    // SAFETY: getppid has no preconditions.
    text.push_u64(unsafe { libc::getppid() } as u64);
    text.push(b",\"program\":\"");
    text.push_json_str(program.to_bytes());
    text.push(b"\",\"reason\":\"");
    text.push_json_str(reason.as_bytes());
    text.push(b"\"}\n");
    if path.overflow || text.overflow {
        return None;
    }
    // As in `without_pager`: inside a window, dropped before the exec.
    let _making = gleaner_fds::making();
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe {
        libc::open(
            path.as_bytes().as_ptr().cast(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: writes the text's bytes to our descriptor, then closes it.
    unsafe {
        libc::write(fd, text.as_bytes().as_ptr().cast(), text.len);
        libc::close(fd);
    }
    Some(path)
}

/// After an exec that returned (so failed): its report withdrawn, and the exec's `errno` kept for
/// the caller (the unlink may change it); returns `rc`.
fn failed_exec(reported: Option<StackText<4200>>, rc: c_int) -> c_int {
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    withdraw(reported);
    // SAFETY: restores the exec's errno for the caller.
    unsafe { *libc::__errno_location() = errno };
    rc
}

/// Removes a report whose `exec` failed.
fn withdraw(path: Option<StackText<4200>>) {
    if let Some(p) = path {
        // SAFETY: the NUL-terminated path written by `report`.
        unsafe { libc::unlink(p.as_bytes().as_ptr().cast()) };
    }
}

/// Finds `file` as `execvp` does: as given when it contains a `/`, else the first executable
/// match in `$PATH` (default `/bin:/usr/bin`); the result in `out`.
fn search_path<'a>(file: &CStr, out: &'a mut StackText<4200>) -> Option<&'a CStr> {
    let name = file.to_bytes();
    if name.is_empty() {
        return None;
    }
    if name.contains(&b'/') {
        out.push(name);
        out.push(b"\0");
    } else {
        // SAFETY: getenv returns a pointer into the environment or NULL; read before any change.
        let path = unsafe { libc::getenv(c"PATH".as_ptr()) };
        let dirs: &[u8] = if path.is_null() {
            b"/bin:/usr/bin"
        } else {
            // SAFETY: a NUL-terminated environment value.
            unsafe { CStr::from_ptr(path) }.to_bytes()
        };
        let found = dirs.split(|&b| b == b':').any(|dir| {
            out.len = 0;
            out.overflow = false;
            out.push(if dir.is_empty() { b"." } else { dir });
            out.push(b"/");
            out.push(name);
            out.push(b"\0");
            // SAFETY: a NUL-terminated candidate path.
            !out.overflow
                && unsafe { libc::access(out.as_bytes().as_ptr().cast(), libc::X_OK) } == 0
        });
        if !found {
            return None;
        }
    }
    if out.overflow {
        return None;
    }
    CStr::from_bytes_with_nul(out.as_bytes()).ok()
}

/// Reports `path` before an `exec` in this process, if it will run without a pager.
fn before_exec(path: *const c_char, envp: *const *const c_char) -> Option<StackText<4200>> {
    if path.is_null() {
        return None;
    }
    // SAFETY: exec's contract: a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(path) };
    let reason = without_pager(path, envp)?;
    // SAFETY: getpid has no preconditions.
    report(unsafe { libc::getpid() }, path, reason)
}

fn real_execve() -> ExecveFn {
    static SLOT: AtomicUsize = AtomicUsize::new(0);
    // SAFETY: the C library's execve has this type.
    unsafe { std::mem::transmute::<*mut c_void, ExecveFn>(next(&SLOT, b"execve\0")) }
}

fn real_spawn(name: &'static [u8], slot: &'static AtomicUsize) -> SpawnFn {
    // SAFETY: posix_spawn and posix_spawnp have this type.
    unsafe { std::mem::transmute::<*mut c_void, SpawnFn>(next(slot, name)) }
}

/// `execve(2)`.
#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let reported = before_exec(path, envp);
    // SAFETY: forwarding the caller's arguments; returns only on failure.
    let rc = unsafe { real_execve()(path, argv, envp) };
    failed_exec(reported, rc)
}

/// `execv(3)`.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the process's environment, as execv passes it.
    unsafe { execve(path, argv, environ) }
}

/// `execvpe(3)`: the `PATH` search, then [`execve`]; the C library's own search for its
/// errors (`ENOENT`, `EACCES`) and scripts without `#!`.
#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    static SLOT: AtomicUsize = AtomicUsize::new(0);
    let mut found = StackText::<4200>::new();
    let reported = if file.is_null() {
        None
    } else {
        // SAFETY: exec's contract: a NUL-terminated name.
        search_path(unsafe { CStr::from_ptr(file) }, &mut found)
            .and_then(|p| before_exec(p.as_ptr(), envp))
    };
    // SAFETY: the C library's execvpe has the type of execve.
    let real = unsafe { std::mem::transmute::<*mut c_void, ExecveFn>(next(&SLOT, b"execvpe\0")) };
    // SAFETY: forwarding the caller's arguments; returns only on failure.
    let rc = unsafe { real(file, argv, envp) };
    failed_exec(reported, rc)
}

/// `execvp(3)`.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the process's environment, as execvp passes it.
    unsafe { execvpe(file, argv, environ) }
}

/// After a spawn of `program` that succeeded, as child `pid`: reported if it came up without a
/// pager.
fn after_spawn(pid: libc::pid_t, program: &CStr, envp: *const *mut c_char) {
    if let Some(reason) = without_pager(program, envp.cast()) {
        report(pid, program, reason);
    }
}

/// `posix_spawn(3)`: reported after the spawn, with the child's pid.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const c_void,
    attr: *const c_void,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    static SLOT: AtomicUsize = AtomicUsize::new(0);
    let mut child: libc::pid_t = 0;
    let out = if pid.is_null() { &mut child } else { pid };
    // SAFETY: forwarding the caller's arguments (the pid to our variable when it gave none).
    let rc = unsafe { real_spawn(b"posix_spawn\0", &SLOT)(out, path, actions, attr, argv, envp) };
    if rc == 0 && !path.is_null() {
        // SAFETY: posix_spawn's contract: a NUL-terminated path; the spawn succeeded, so `out`
        // holds the child's pid.
        unsafe { after_spawn(*out, CStr::from_ptr(path), envp) };
    }
    rc
}

/// `posix_spawnp(3)`: reported after the spawn, with the child's pid.
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const c_void,
    attr: *const c_void,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    static SLOT: AtomicUsize = AtomicUsize::new(0);
    let mut child: libc::pid_t = 0;
    let out = if pid.is_null() { &mut child } else { pid };
    // SAFETY: forwarding the caller's arguments (the pid to our variable when it gave none).
    let rc = unsafe { real_spawn(b"posix_spawnp\0", &SLOT)(out, file, actions, attr, argv, envp) };
    if rc == 0 && !file.is_null() {
        let mut found = StackText::<4200>::new();
        // SAFETY: posix_spawnp's contract: a NUL-terminated name.
        if let Some(p) = search_path(unsafe { CStr::from_ptr(file) }, &mut found) {
            // SAFETY: the spawn succeeded, so `out` holds the child's pid.
            after_spawn(unsafe { *out }, p, envp);
        }
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify_path(p: &str) -> Option<&'static str> {
        let c = std::ffi::CString::new(p).unwrap();
        // SAFETY: a NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY) };
        assert!(fd >= 0, "{p}");
        let k = classify(fd);
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        k.map(|b| match b {
            Binary::Dynamic => "dynamic",
            Binary::Static => "static",
            Binary::SetId => "setid",
        })
    }

    #[test]
    fn binaries_are_told_apart() {
        assert_eq!(classify_path("/bin/sh"), Some("dynamic"));
        assert_eq!(classify_path("/etc/passwd"), None);
        if std::path::Path::new("/usr/bin/passwd").exists() {
            assert_eq!(classify_path("/usr/bin/passwd"), Some("setid"));
        }
    }

    #[test]
    fn json_text_is_escaped_without_allocating() {
        let mut t = StackText::<64>::new();
        t.push_json_str(b"a\"b\\c\n\xff");
        assert_eq!(t.as_bytes(), b"a\\\"b\\\\c\\u000a\\u00ff");
        t.push_u64(1234567);
        assert!(t.as_bytes().ends_with(b"1234567"));
        let mut small = StackText::<4>::new();
        small.push(b"12345");
        assert!(small.overflow);
    }

    #[test]
    fn the_path_is_searched_like_execvp() {
        let mut out = StackText::<4200>::new();
        let p = search_path(c"sh", &mut out).expect("sh on PATH");
        assert!(p.to_bytes().ends_with(b"/sh"), "{p:?}");
        let mut out = StackText::<4200>::new();
        assert!(search_path(c"no-such-program-gleaner", &mut out).is_none());
    }

    #[test]
    fn the_preload_is_found_in_the_environment() {
        let with = [
            c"A=1".as_ptr(),
            c"LD_PRELOAD=/x/libgleaner_preload.so".as_ptr(),
            std::ptr::null(),
        ];
        let without = [c"LD_PRELOAD=/x/other.so".as_ptr(), std::ptr::null()];
        assert!(preload_kept(with.as_ptr()));
        assert!(!preload_kept(without.as_ptr()));
        assert!(!preload_kept(std::ptr::null()));
    }
}
