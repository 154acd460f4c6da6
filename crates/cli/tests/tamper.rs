//! A memnode that lies, end to end: a real `gleaner memnode` process, a real `gleaner run` of an
//! unmodified program (python3), and between them on TCP loopback a man-in-the-middle proxy that
//! parses every frame and tampers with the memnode's `Pages` replies: one flipped bit, another
//! page's blob, or an older version of the same page. Each time the program must stop with exit
//! status 86 and a message saying the memnode returned data it never wrote, and must never print
//! a result computed from what the memnode made up. The proxy in pass-through mode is the
//! control: the same run completes with the all-local checksum.
//!
//! Also through the CLI: the page-key file (`--key-file`: permissions, contents, with
//! `--encrypt off`), and the codec settings (`--encrypt off --compress off`, `--compress zstd`)
//! reported in the stats and giving the same checksum.

mod common;

use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use common::{real_python, run_gleaner, MemnodeProc, TempDir};
use gleaner_pager::FATAL_EXIT_CODE;
use gleaner_proto::{read_frame, write_frame, Message, MessageKind, PageBatch};

const LIMIT: Duration = Duration::from_secs(180);

/// The Pages replies the proxy lets through untouched before it tampers, so that the program is
/// well under way (Python's start-up alone takes a few dozen). A whole run takes about 24 000;
/// the control test checks that it takes several times this many, so the tampering always
/// falls inside the run.
const UNTOUCHED_REPLIES: u64 = 1000;

/// The program: builds `mb` MiB of bytearrays (text: compressible, every page different),
/// rewrites one byte of every page twice (so the memnode holds newer versions of pages it held
/// before), then reads everything back into one checksum.
const JOB: &str = r#"
import hashlib, sys
mb = int(sys.argv[1])
blocks = []
for i in range(mb):
    text = b"".join(b"block %6d line %8d gleaner far memory\n" % (i, k) for k in range(22800))
    blocks.append(bytearray(text[: 1 << 20]))
for rnd in range(2):
    for b in blocks:
        for off in range(rnd * 64, len(b), 4096):
            b[off] = 65 + rnd
h = hashlib.sha256()
for b in blocks:
    h.update(b)
print("checksum", h.hexdigest())
"#;

/// MiB the job allocates: six times the 8 MiB budget, so most of it lives on the memnode.
const JOB_MB: &str = "48";

/// The job's checksum line without gleaner.
fn local_checksum() -> &'static str {
    static SUM: OnceLock<String> = OnceLock::new();
    SUM.get_or_init(|| {
        let out = Command::new(real_python())
            .args(["-c", JOB, JOB_MB])
            .output();
        let out = out.expect("python3 runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "the job fails without gleaner: {stderr}"
        );
        let sum = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(sum.starts_with("checksum "), "{sum}");
        sum
    })
}

/// `gleaner run --local-mem 8M --stats FILE ARGS -- python3 -c JOB 48`; returns (status,
/// stdout, stderr, stats JSON: null where the launcher refused to start).
fn run_job(args: &[&str]) -> (Option<i32>, String, String, serde_json::Value) {
    let dir = TempDir::new("tamper-run");
    let stats = dir.path().join("stats.json");
    let stats_s = stats.to_string_lossy().into_owned();
    let mut all = vec!["run", "--local-mem", "8M", "--stats", &stats_s];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--", real_python(), "-c", JOB, JOB_MB]);
    let (code, out, err) = run_gleaner(&all, LIMIT);
    let json = match std::fs::read_to_string(&stats) {
        Ok(text) => serde_json::from_str(&text).expect("the stats file is JSON"),
        Err(_) => serde_json::Value::Null,
    };
    (code, out, err, json)
}

/// Asserts a run completed with the all-local checksum; returns its stats.
fn assert_correct(
    run: (Option<i32>, String, String, serde_json::Value),
) -> (String, serde_json::Value) {
    let (code, out, err, stats) = run;
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert_eq!(
        out.trim(),
        local_checksum(),
        "the checksum under far memory differs from the all-local one\nstderr: {err}"
    );
    (err, stats)
}

/// The codec stats of every process of a run (at least one).
fn codec_stats(stats: &serde_json::Value) -> Vec<&serde_json::Value> {
    let procs: Vec<_> = stats["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("no processes in the stats: {stats}"))
        .iter()
        .map(|p| &p["stats"]["store"]["codec"])
        .collect();
    assert!(!procs.is_empty(), "{stats}");
    procs
}

// ---- the proxy ---------------------------------------------------------------------------

/// What the proxy does to the memnode's `Pages` replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Forwards every frame as it came.
    PassThrough,
    /// Flips one bit in the middle of one blob of one reply.
    FlipBit,
    /// Replaces one page's blob with the latest blob the client wrote for another page.
    OtherPage,
    /// Replaces one page's blob with an older blob the client wrote for that same page.
    Replay,
}

/// Blobs the client wrote, per (session, page).
#[derive(Default)]
struct Written {
    /// The first and the latest blob written for each page.
    versions: HashMap<(u64, u64), (Vec<u8>, Vec<u8>)>,
    /// Per session, the pages of its last two writes to distinct pages, latest last.
    recent: HashMap<u64, Vec<u64>>,
}

impl Written {
    fn record(&mut self, session: u64, page: u64, blob: &[u8]) {
        self.versions
            .entry((session, page))
            .and_modify(|(_, latest)| *latest = blob.to_vec())
            .or_insert_with(|| (blob.to_vec(), blob.to_vec()));
        let recent = self.recent.entry(session).or_default();
        recent.retain(|&p| p != page);
        recent.push(page);
        if recent.len() > 2 {
            recent.remove(0);
        }
    }

    /// The blob `mode` puts in place of `blob`, the memnode's answer for `page`, if any.
    fn forgery(&self, mode: Mode, session: u64, page: u64, blob: &[u8]) -> Option<Vec<u8>> {
        match mode {
            Mode::PassThrough => None,
            Mode::FlipBit => {
                let mut b = blob.to_vec();
                b[blob.len() / 2] ^= 0x10;
                Some(b)
            }
            Mode::OtherPage => {
                let other = self
                    .recent
                    .get(&session)?
                    .iter()
                    .rev()
                    .find(|&&p| p != page)?;
                Some(self.versions[&(session, *other)].1.clone())
            }
            // The first blob written for the page, if the memnode now holds a later one (the
            // proxy saw every write of the session, so a blob other than the first is newer).
            Mode::Replay => {
                let (first, _) = self.versions.get(&(session, page))?;
                (first.as_slice() != blob).then(|| first.clone())
            }
        }
    }
}

/// What the proxy saw and did, shared by its threads.
struct ProxyState {
    mode: Mode,
    /// Welcome frames forwarded (sessions created or attached through the proxy).
    welcomes: AtomicU64,
    /// Write requests forwarded.
    writes: AtomicU64,
    /// Pages replies forwarded.
    replies: AtomicU64,
    /// Replies tampered with (at most one).
    tampered: AtomicU64,
    /// What the tampering did, for failure messages.
    forged: Mutex<String>,
    written: Mutex<Written>,
    /// Every socket the proxy opened, shut down when it stops.
    sockets: Mutex<Vec<TcpStream>>,
    stop: AtomicBool,
}

/// A man-in-the-middle between clients and a memnode on TCP, stopped (every socket shut down)
/// on drop.
struct Proxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    fn start(memnode: SocketAddr, mode: Mode) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ProxyState {
            mode,
            welcomes: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            replies: AtomicU64::new(0),
            tampered: AtomicU64::new(0),
            forged: Mutex::new(String::new()),
            written: Mutex::new(Written::default()),
            sockets: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let st = state.clone();
        let acceptor = std::thread::spawn(move || {
            for client in listener.incoming() {
                if st.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(memnode) else {
                    continue;
                };
                let mut sockets = st.sockets.lock().unwrap();
                for s in [&client, &server] {
                    s.set_nodelay(true).unwrap();
                    sockets.push(s.try_clone().unwrap());
                }
                drop(sockets);
                let session = Arc::new(AtomicU64::new(0));
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (st1, st2, ses2) = (st.clone(), st.clone(), session.clone());
                std::thread::spawn(move || to_memnode(&st1, client, server, &session));
                std::thread::spawn(move || to_client(&st2, s2, c2, &ses2));
            }
        });
        Proxy {
            addr,
            state,
            acceptor: Some(acceptor),
        }
    }

    fn count(&self, c: &AtomicU64) -> u64 {
        c.load(Ordering::SeqCst)
    }

    /// A summary of what the proxy saw, for failure messages.
    fn report(&self) -> String {
        let s = &self.state;
        format!(
            "proxy ({:?}): {} welcomes, {} writes, {} Pages replies, {} tampered: {}",
            s.mode,
            self.count(&s.welcomes),
            self.count(&s.writes),
            self.count(&s.replies),
            self.count(&s.tampered),
            s.forged.lock().unwrap()
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        // Wakes the acceptor, which sees the flag and ends.
        let _ = TcpStream::connect(self.addr);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for s in self.state.sockets.lock().unwrap().iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Client → memnode: forwards every frame, recording the blobs of `Write` requests.
fn to_memnode(st: &ProxyState, mut from: TcpStream, mut to: TcpStream, session: &AtomicU64) {
    let mut payload = Vec::new();
    while let Ok(h) = read_frame(&mut from, &mut payload) {
        if h.kind == MessageKind::Write {
            st.writes.fetch_add(1, Ordering::SeqCst);
            if matches!(st.mode, Mode::OtherPage | Mode::Replay) {
                if let Ok(Message::Write { batch }) = Message::decode(h.kind, &payload) {
                    let ses = session.load(Ordering::SeqCst);
                    let mut w = st.written.lock().unwrap();
                    for (page, _, blob) in batch.iter() {
                        w.record(ses, page, blob);
                    }
                }
            }
        }
        if write_frame(&mut to, h.kind, h.req_id, &payload).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Memnode → client: forwards every frame, tampering with one `Pages` reply after
/// [`UNTOUCHED_REPLIES`] (the first one in which the mode finds something to forge).
fn to_client(st: &ProxyState, mut from: TcpStream, mut to: TcpStream, session: &AtomicU64) {
    let mut payload = Vec::new();
    let mut forged_payload = Vec::new();
    while let Ok(h) = read_frame(&mut from, &mut payload) {
        let mut out = &payload;
        match h.kind {
            MessageKind::Welcome => {
                // Stored before the client can see the Welcome, so before any Write of its.
                if let Ok(Message::Welcome { session_id, .. }) = Message::decode(h.kind, &payload) {
                    session.store(session_id, Ordering::SeqCst);
                }
                st.welcomes.fetch_add(1, Ordering::SeqCst);
            }
            MessageKind::Pages => {
                let n = st.replies.fetch_add(1, Ordering::SeqCst);
                if n >= UNTOUCHED_REPLIES
                    && st.tampered.load(Ordering::SeqCst) == 0
                    && tamper(
                        st,
                        session.load(Ordering::SeqCst),
                        &payload,
                        &mut forged_payload,
                    )
                {
                    out = &forged_payload;
                }
            }
            _ => {}
        }
        if write_frame(&mut to, h.kind, h.req_id, out).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Rebuilds the `Pages` payload `reply` into `out` with one blob forged; false if the mode finds
/// nothing to forge in it (or another thread tampered first).
fn tamper(st: &ProxyState, session: u64, reply: &[u8], out: &mut Vec<u8>) -> bool {
    let Ok(Message::Pages { batch }) = Message::decode(MessageKind::Pages, reply) else {
        return false;
    };
    let written = st.written.lock().unwrap();
    let Some((victim, forged)) = batch.iter().find_map(|(page, _, blob)| {
        written
            .forgery(st.mode, session, page, blob)
            .map(|f| (page, f))
    }) else {
        return false;
    };
    // One reply only, whichever connection's thread gets here first (a plain increment would
    // count the losers too).
    if st
        .tampered
        .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return false;
    }
    PageBatch::begin(out);
    // The version field is left as the memnode sent it: the client opens every blob with the
    // version it recorded itself, never the one that comes back.
    for (page, version, blob) in batch.iter() {
        let blob = if page == victim { &forged[..] } else { blob };
        PageBatch::push(out, page, version, blob);
    }
    *st.forged.lock().unwrap() = format!(
        "session {session}: page {victim}'s blob replaced ({:?}) in a reply of {} pages",
        st.mode,
        batch.len()
    );
    true
}

// ---- tampering ---------------------------------------------------------------------------

/// A memnode process on TCP loopback and the proxy in front of it.
fn memnode_behind_proxy(mode: Mode) -> (MemnodeProc, Proxy) {
    let node = MemnodeProc::start("127.0.0.1:0", "1G");
    let addr: SocketAddr = node
        .endpoint
        .to_string()
        .parse()
        .unwrap_or_else(|e| panic!("memnode endpoint {}: {e}", node.endpoint));
    let proxy = Proxy::start(addr, mode);
    (node, proxy)
}

/// `gleaner run` of the job against the memnode through the proxy.
fn run_through(
    node: &MemnodeProc,
    proxy: &Proxy,
) -> (Option<i32>, String, String, serde_json::Value) {
    let addr = proxy.addr.to_string();
    let token = node.token_file.to_string_lossy().into_owned();
    run_job(&["--memnode", &addr, "--token-file", &token])
}

fn tampering_stops_the_program(mode: Mode) {
    let expected = local_checksum();
    let (node, proxy) = memnode_behind_proxy(mode);
    let (code, out, err, _) = run_through(&node, &proxy);
    let report = proxy.report();
    assert_eq!(
        proxy.count(&proxy.state.tampered),
        1,
        "the proxy never tampered with a reply (the run must fault and rewrite far pages): \
         {report}\nstatus {code:?}\nstderr: {err}"
    );
    assert!(
        !out.contains(expected),
        "the program completed on data the memnode forged: {report}\nstdout: {out}\nstderr: {err}"
    );
    assert!(
        !out.contains("checksum"),
        "the program printed a result computed from forged data: {report}\nstdout: {out}\n\
         expected (all local): {expected}\nstderr: {err}"
    );
    assert_eq!(
        code,
        Some(FATAL_EXIT_CODE),
        "{report}\nstdout: {out}\nstderr: {err}"
    );
    assert!(err.contains("gleaner: FATAL"), "{report}\n{err}");
    assert!(
        err.contains("the memnode returned data this program never wrote there"),
        "{report}\n{err}"
    );
}

/// The control: through the proxy forwarding everything as it came (handshakes included), the
/// run completes with the all-local checksum, so the failures below come from the tampering.
#[test]
fn the_proxy_passing_everything_through_changes_nothing() {
    let (node, proxy) = memnode_behind_proxy(Mode::PassThrough);
    let (err, stats) = assert_correct(run_through(&node, &proxy));
    let report = proxy.report();
    assert!(proxy.count(&proxy.state.welcomes) >= 2, "{report}\n{err}");
    assert!(
        proxy.count(&proxy.state.replies) > 4 * UNTOUCHED_REPLIES,
        "the pages came back through the proxy: {report}"
    );
    assert!(proxy.count(&proxy.state.writes) > 0, "{report}");
    assert_eq!(proxy.count(&proxy.state.tampered), 0, "{report}");
    assert_eq!(
        stats["processes"][0]["stats"]["store"]["data_path"], "socket",
        "{stats}"
    );
    for c in codec_stats(&stats) {
        assert_eq!(c["auth_failures"], 0, "{stats}");
    }
}

#[test]
fn a_flipped_bit_in_a_far_page_stops_the_program() {
    tampering_stops_the_program(Mode::FlipBit);
}

#[test]
fn another_pages_blob_stops_the_program() {
    tampering_stops_the_program(Mode::OtherPage);
}

#[test]
fn an_older_version_of_the_page_stops_the_program() {
    tampering_stops_the_program(Mode::Replay);
}

// ---- key files ---------------------------------------------------------------------------

/// A page-key file in `dir` holding `text`, with `mode`.
fn key_file(dir: &Path, text: &str, mode: u32) -> String {
    let path = dir.join("page.key");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path.to_string_lossy().into_owned()
}

const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";

/// Runs the job with a key file holding `text` with `mode`, and `extra` flags: the launcher must
/// refuse it (exit 2) before the program starts. Returns the file's path and the stderr.
fn refused_key_file(text: &str, mode: u32, extra: &[&str]) -> (String, String) {
    let dir = TempDir::new("key-refused");
    let key = key_file(dir.path(), text, mode);
    let mut args = vec!["--key-file", key.as_str()];
    args.extend_from_slice(extra);
    let (code, out, err, _) = run_job(&args);
    assert_eq!(code, Some(2), "stdout: {out}\nstderr: {err}");
    assert!(!out.contains("checksum"), "the program must not run: {out}");
    (key, err)
}

#[test]
fn a_key_file_others_can_read_is_refused() {
    let (key, err) = refused_key_file(KEY, 0o644, &[]);
    assert!(err.contains(&format!("chmod 600 {key}")), "{err}");
}

#[test]
fn a_key_file_without_a_key_is_refused() {
    let (key, err) = refused_key_file("0123456789\n", 0o600, &[]);
    assert!(err.contains(&key), "the file is named: {err}");
    assert!(err.contains("64 hex digits"), "{err}");
}

#[test]
fn a_key_file_with_encryption_off_is_refused() {
    let (_, err) = refused_key_file(KEY, 0o600, &["--encrypt", "off"]);
    assert!(err.contains("--key-file"), "{err}");
    assert!(err.contains("encryption is off"), "{err}");
}

/// A valid key file: the pages are sealed with the key derived from it and the run is correct.
#[test]
fn a_valid_key_file_seals_the_pages_and_the_run_is_correct() {
    let dir = TempDir::new("key-ok");
    let key = key_file(dir.path(), KEY, 0o600);
    let (_, stats) = assert_correct(run_job(&["--key-file", &key]));
    for c in codec_stats(&stats) {
        assert_eq!(c["encryption"], "aes-256-gcm", "{stats}");
    }
    let t = &stats["total"]["store"]["codec"];
    assert!(t["pages_decoded"].as_u64().unwrap() > 1000, "{stats}");
    assert!(t["blobs_opened"].as_u64().unwrap() > 1000, "{stats}");
    assert_eq!(t["auth_failures"], 0, "{stats}");
}

// ---- codec settings ----------------------------------------------------------------------

/// Neither encrypted nor compressed, over the socket to a memnode process: same checksum, and the
/// stats say so.
#[test]
fn encryption_and_compression_off_run_correctly() {
    let node = MemnodeProc::start("127.0.0.1:0", "1G");
    let addr = node.endpoint.to_string();
    let token = node.token_file.to_string_lossy().into_owned();
    let (_, stats) = assert_correct(run_job(&[
        "--memnode",
        &addr,
        "--token-file",
        &token,
        "--encrypt",
        "off",
        "--compress",
        "off",
    ]));
    for c in codec_stats(&stats) {
        assert_eq!(c["encryption"], "off", "{stats}");
        assert_eq!(c["compression"], "off", "{stats}");
    }
    let t = &stats["total"]["store"]["codec"];
    assert!(t["pages_decoded"].as_u64().unwrap() > 1000, "{stats}");
    assert_eq!(t["blobs_sealed"], 0, "{stats}");
    assert_eq!(t["blobs_opened"], 0, "{stats}");
    assert_eq!(
        stats["processes"][0]["stats"]["store"]["data_path"], "socket",
        "{stats}"
    );
}

/// zstd, on the embedded memnode (shared memory): same checksum, and the pages really were
/// compressed.
#[test]
fn zstd_compression_runs_correctly() {
    let (_, stats) = assert_correct(run_job(&["--compress", "zstd"]));
    for c in codec_stats(&stats) {
        assert_eq!(c["compression"], "zstd", "{stats}");
        assert_eq!(c["encryption"], "aes-256-gcm", "{stats}");
    }
    let t = &stats["total"]["store"]["codec"];
    assert!(t["pages_decoded"].as_u64().unwrap() > 1000, "{stats}");
    let (pages, bytes) = (
        t["pages_encoded"].as_u64().unwrap(),
        t["blob_bytes"].as_u64().unwrap(),
    );
    assert!(
        pages > 1000 && bytes < pages * 4096 / 2,
        "text pages shrink to less than half: {stats}"
    );
}
