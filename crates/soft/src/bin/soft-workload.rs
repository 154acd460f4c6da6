//! `soft-workload`: a small real application on soft memory, for the tests and
//! `bench/midas.py`. It serves requests for `--objects` items of `--size` bytes from a
//! [`SoftArray`], Zipf-distributed (`--zipf S`, 0 for uniform), each request costing `--base-us`
//! of work, each miss rebuilding the item:
//!
//! * `--kind memo`: a memoised computation costing `--cost-us` of CPU;
//! * `--kind file --file PATH`: a storage server's block cache, rebuilt by reading the block
//!   from the file (plus `--cost-us`, default 0).
//!
//! Reports carry the process's CPU seconds (`cpu_s`), so throughput can be taken per CPU
//! second on a machine whose CPUs others share. Every value read is checked in full against what it must be (a torn or foreign read would
//! count in `bad`). Prints one JSON line of counters every `--report-ms` and at the end; exits
//! 0 if every read was right, 3 otherwise, 2 on bad flags. With `--node SOCKET` the pool
//! registers with the node daemon (`--autostart` starts one if none answers).

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gleaner_soft::{Pool, PoolConfig, SoftArray};

const USAGE: &str =
    "usage: soft-workload [--name N] [--objects K] [--size BYTES] [--kind memo|file] \
[--file PATH] [--cost-us C] [--base-us B] [--zipf S] [--secs T] [--limit BYTES] [--capacity BYTES] \
[--node SOCKET] [--autostart] [--weight W] [--report-ms MS] [--verify] [--threads N]";

fn spin(us: f64) {
    if us <= 0.0 {
        return;
    }
    let end = Instant::now() + Duration::from_secs_f64(us / 1e6);
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// The value item `i` must have (memo kind): 8-byte words derived from `i` and their index.
fn pattern(i: u64, size: usize, out: &mut Vec<u8>) {
    out.clear();
    let mut w = 0u64;
    while out.len() < size {
        let v = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ w.wrapping_mul(0xD1B5_4A32_D192_ED03);
        let b = v.to_le_bytes();
        let n = (size - out.len()).min(8);
        out.extend_from_slice(&b[..n]);
        w += 1;
    }
}

struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Zipf {
        let mut acc = 0.0;
        let mut cdf = Vec::with_capacity(n);
        for k in 1..=n {
            acc += 1.0 / (k as f64).powf(s);
            cdf.push(acc);
        }
        for c in cdf.iter_mut() {
            *c /= acc;
        }
        Zipf { cdf }
    }
    fn sample(&self, u: f64) -> usize {
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

/// This process's CPU time (user + system), seconds, from `/proc/self/stat`.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat(5): 12 and 13 after the state field.
    (ticks(11) + ticks(12)) / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut flags: HashMap<String, String> = HashMap::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let Some(k) = a.strip_prefix("--") else {
            eprintln!("soft-workload: unexpected argument {a:?}\n{USAGE}");
            std::process::exit(2);
        };
        if k == "help" {
            println!("{USAGE}");
            return;
        }
        if k == "autostart" || k == "verify" {
            flags.insert(k.into(), "1".into());
            i += 1;
            continue;
        }
        let Some(v) = args.get(i + 1) else {
            eprintln!("soft-workload: --{k} needs a value\n{USAGE}");
            std::process::exit(2);
        };
        flags.insert(k.into(), v.clone());
        i += 2;
    }
    fn get<T: std::str::FromStr>(f: &HashMap<String, String>, k: &str, d: T) -> T {
        match f.get(k) {
            None => d,
            Some(v) => v.parse().unwrap_or_else(|_| {
                eprintln!("soft-workload: --{k} {v:?} is not valid\n{USAGE}");
                std::process::exit(2);
            }),
        }
    }
    let name: String = get(&flags, "name", "workload".to_string());
    let objects: usize = get(&flags, "objects", 4096usize).max(1);
    let size: usize = get(&flags, "size", 16384usize).max(1);
    let kind: String = get(&flags, "kind", "memo".to_string());
    let cost_us: f64 = get(&flags, "cost-us", if kind == "file" { 0.0 } else { 100.0 });
    let base_us: f64 = get(&flags, "base-us", 0.0);
    let zipf: f64 = get(&flags, "zipf", 0.9);
    let secs: f64 = get(&flags, "secs", 10.0);
    let report_ms: u64 = get(&flags, "report-ms", 1000u64);
    let threads: usize = get(&flags, "threads", 1usize).max(1);
    let mut cfg = PoolConfig {
        name: name.clone(),
        capacity: get(
            &flags,
            "capacity",
            (objects as u64 * (size as u64 + 64)) * 2 + (8 << 20),
        ),
        limit: get(&flags, "limit", 64u64 << 20),
        weight: get(&flags, "weight", 1.0),
        verify: flags.contains_key("verify"),
        ..Default::default()
    };
    if let Some(n) = flags.get("node") {
        if n != "off" {
            cfg.node = Some(PathBuf::from(n));
            cfg.autostart = flags.contains_key("autostart");
        }
    }
    let file = match kind.as_str() {
        "memo" => None,
        "file" => {
            let Some(p) = flags.get("file") else {
                eprintln!("soft-workload: --kind file needs --file PATH");
                std::process::exit(2);
            };
            match std::fs::File::open(p) {
                Ok(f) => Some(Arc::new(f)),
                Err(e) => {
                    eprintln!("soft-workload: {p}: {e}");
                    std::process::exit(2);
                }
            }
        }
        k => {
            eprintln!("soft-workload: --kind {k:?}: give memo or file");
            std::process::exit(2);
        }
    };
    let rf = file.clone();
    let recon = Arc::new(move |args: &[u8]| -> Option<Vec<u8>> {
        let i = u64::from_le_bytes(args.try_into().ok()?);
        let mut v = Vec::new();
        match &rf {
            None => pattern(i, size, &mut v),
            Some(f) => {
                v.resize(size, 0);
                f.read_exact_at(&mut v, i * size as u64).ok()?;
            }
        }
        spin(cost_us);
        Some(v)
    });
    let pool = match Pool::new(cfg, recon) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("soft-workload: creating the pool: {e}");
            std::process::exit(2);
        }
    };
    let arr = Arc::new(SoftArray::new(&pool, objects));
    let dist = Arc::new(Zipf::new(objects, zipf));
    let ops = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let bad = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut workers = Vec::new();
    for t in 0..threads {
        let (arr, dist, ops, bad, file) = (
            arr.clone(),
            dist.clone(),
            ops.clone(),
            bad.clone(),
            file.clone(),
        );
        workers.push(std::thread::spawn(move || {
            let mut rng = gleaner_sys::rng::XorShift64::new(
                0x2545_F491_4F6C_DD1D ^ (t as u64 + 1) ^ u64::from(std::process::id()),
            );
            let mut got = Vec::new();
            let mut want = Vec::new();
            // A permutation, so the hot items are spread over the array (and its segments).
            while Instant::now() < end {
                for _ in 0..16 {
                    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                    let k = dist.sample(u);
                    let idx = (k as u64).wrapping_mul(2_654_435_761) as usize % arr.len();
                    if !arr.get_into(idx, &mut got) {
                        bad.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        continue;
                    }
                    match &file {
                        None => pattern(idx as u64, size, &mut want),
                        Some(f) => {
                            want.resize(size, 0);
                            let _ = f.read_exact_at(&mut want, (idx * size) as u64);
                        }
                    }
                    if got != want {
                        bad.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    spin(base_us);
                    ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }));
    }
    let report = |final_: bool| {
        let s = pool.stats();
        let line = serde_json::json!({
            "name": name, "pid": std::process::id(), "t": start.elapsed().as_secs_f64(),
            "cpu_s": cpu_seconds(),
            "ops": ops.load(std::sync::atomic::Ordering::Relaxed),
            "bad": bad.load(std::sync::atomic::Ordering::Relaxed),
            "hits": s.hits, "misses": s.misses, "victim_hits": s.victim_hits,
            "rebuild_ns": s.rebuild_ns, "torn_caught": s.torn_caught,
            "revoked_segments": s.revoked_segments, "released_segments": s.released_segments,
            "compacted_segments": s.compacted_segments, "verify_mismatches": s.verify_mismatches,
            "resident": pool.resident_bytes(), "limit": s.limit,
            "registrations": s.registrations, "registered": s.registered, "final": final_,
        });
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    while Instant::now() < end {
        std::thread::sleep(
            Duration::from_millis(report_ms).min(end.saturating_duration_since(Instant::now())),
        );
        report(false);
    }
    for w in workers {
        let _ = w.join();
    }
    report(true);
    let b = bad.load(std::sync::atomic::Ordering::Relaxed) + pool.stats().verify_mismatches;
    std::process::exit(if b == 0 { 0 } else { 3 });
}
