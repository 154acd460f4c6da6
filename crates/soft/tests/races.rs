//! Reads racing evacuation (compaction, release, shrinking grants) and direct punches of the
//! pool's memfd (exactly as the daemon does them: generation first, then `fallocate`) must
//! never return torn or foreign bytes; and the debug mode's comparison catches a reconstructor
//! that is not a function of its arguments.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gleaner_soft::{Pool, PoolConfig, SoftArray, SoftBox, SoftHashMap, SoftQueue, SoftShared};

fn value(key: &[u8], len: usize) -> Vec<u8> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key {
        h = (h ^ *b as u64).wrapping_mul(0x100_0000_01b3);
    }
    (0..len)
        .map(|i| (h.rotate_left((i % 61) as u32) as u8) ^ i as u8)
        .collect()
}

fn pool(limit: u64, verify: bool) -> Pool {
    let cfg = PoolConfig {
        name: "race".into(),
        capacity: 64 << 20,
        limit,
        verify,
        tick: Duration::from_millis(2),
        ..Default::default()
    };
    Pool::new(cfg, Arc::new(|k: &[u8]| Some(value(k, 3000)))).unwrap()
}

/// What the daemon and the grant do to a pool while readers race: every `punch.0`-th step a
/// used segment (picked by a stride of `punch.1`) punched as the daemon does, every 10th the
/// grant moved between 2 and `1 + grants` segments; a step every 3 ms, for at least 2.5 s and
/// until `seen_enough` (at most 30 s).
fn disturb(
    pool: &Pool,
    t0: Instant,
    punch: (u64, usize),
    grants: u64,
    seen_enough: impl Fn() -> bool,
) {
    let mut n = 0u64;
    while t0.elapsed() < Duration::from_millis(2500)
        || (t0.elapsed() < Duration::from_secs(30) && !seen_enough())
    {
        let used = pool.used_segments();
        if n.is_multiple_of(punch.0) && !used.is_empty() {
            pool.punch_as_daemon(used[(n as usize * punch.1) % used.len()])
                .unwrap();
        }
        if n.is_multiple_of(10) {
            pool.set_limit(((n / 10) % grants + 2) * (2 << 20));
        }
        n += 1;
        std::thread::sleep(Duration::from_millis(3));
    }
}

#[test]
fn reads_racing_evacuation_and_direct_punches_never_see_torn_data() {
    let pool = pool(12 << 20, false);
    let map = Arc::new(SoftHashMap::new(&pool));
    let stop = Arc::new(AtomicBool::new(false));
    let bad = Arc::new(AtomicU64::new(0));
    let reads = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for t in 0..2u64 {
        let (map, stop, bad, reads) = (map.clone(), stop.clone(), bad.clone(), reads.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = gleaner_sys::rng::XorShift64::from_state(88172645463325252 ^ t);
            let mut out = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let key = format!("k{}", rng.below(6000));
                assert!(map.get_into(key.as_bytes(), &mut out));
                if out != value(key.as_bytes(), 3000) {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
                reads.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // A writer rewriting values (same bytes, new places): dead bytes for compaction.
    {
        let (map, stop) = (map.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("k{}", i % 6000);
                map.insert(key.as_bytes(), &value(key.as_bytes(), 3000));
                i += 7;
                if i.is_multiple_of(64) {
                    std::thread::yield_now();
                }
            }
        }));
    }
    // Chaos: punch used segments as the daemon would, and move the grant up and down: for
    // 2.5 s, and on (up to 30 s, on a loaded machine) until every kind of event below was seen.
    let t0 = Instant::now();
    let seen_enough = |reads: u64| {
        let s = pool.stats();
        reads > 1000
            && s.revoked_segments > 10
            && s.hits > 0
            && s.misses > 0
            && s.released_segments > 0
    };
    disturb(&pool, t0, (3, 7919), 4, || {
        seen_enough(reads.load(Ordering::Relaxed))
    });
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let s = pool.stats();
    assert_eq!(
        bad.load(Ordering::Relaxed),
        0,
        "torn or foreign reads: {s:?}"
    );
    assert!(reads.load(Ordering::Relaxed) > 1000, "{s:?}");
    assert!(s.revoked_segments > 10, "the punches were noticed: {s:?}");
    assert!(s.hits > 0 && s.misses > 0, "{s:?}");
    assert!(
        s.released_segments > 0,
        "shrinking grants released segments: {s:?}"
    );
}

/// Reads of one 1 MiB object while a writer rewrites it with ever larger counters, in a pool of
/// three segments, so that the place a read copies from is soon reused by a later write (the
/// reads go without the pool's lock, as a one-piece object's do): each read sees one whole value, never a mix of two, never one older than
/// the last write completed before the read began, nor than one the same thread saw before.
#[test]
fn reads_see_whole_values_never_older_than_one_seen_before() {
    let cfg = PoolConfig {
        name: "fresh".into(),
        capacity: 64 << 20,
        limit: 6 << 20,
        tick: Duration::from_millis(2),
        ..Default::default()
    };
    let pool = Pool::new(cfg, Arc::new(|_: &[u8]| None)).unwrap();
    let obj = Arc::new(pool.new_unique());
    const WORDS: usize = 1 << 18;
    let stamp = |n: u32| -> Vec<u8> { n.to_le_bytes().repeat(WORDS) };
    assert!(obj.write(&stamp(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for _ in 0..2 {
        let (obj, stop, done) = (obj.clone(), stop.clone(), done.clone());
        readers.push(std::thread::spawn(move || {
            let (mut out, mut last, mut reads) = (Vec::new(), 0u32, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let floor = done.load(Ordering::Acquire) as u32;
                assert!(obj.read_into(&[], &mut out), "the object was dropped");
                assert_eq!(out.len(), 4 * WORDS);
                let n = u32::from_le_bytes(out[..4].try_into().unwrap());
                assert!(
                    out.chunks(4).all(|w| w == n.to_le_bytes()),
                    "a torn read: it starts with {n}"
                );
                assert!(n >= last, "read {n} after {last}");
                assert!(n >= floor, "read {n} after {floor} was written");
                last = n;
                reads += 1;
            }
            (reads, last)
        }));
    }
    let t0 = Instant::now();
    let mut n = 0u32;
    while t0.elapsed() < Duration::from_millis(1500) {
        n += 1;
        assert!(obj.write(&stamp(n)));
        done.store(u64::from(n), Ordering::Release);
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        let (reads, last) = r.join().unwrap();
        assert!(
            reads > 100 && last > 0,
            "{reads} reads, the last saw {last}"
        );
    }
    let s = pool.stats();
    assert_eq!(s.misses, 0, "{s:?}");
    assert!(n > 100, "only {n} writes: {s:?}");
}

#[test]
fn a_punch_between_copy_and_check_is_a_miss_not_zeros() {
    let pool = pool(8 << 20, false);
    let b = pool.new_unique();
    assert!(b.write(&[7u8; 5000]));
    let seg = pool.used_segments()[0];
    pool.punch_as_daemon(seg).unwrap();
    // The bytes are zeros now; the read must not return them, but the reconstruction.
    assert_eq!(b.read(b"abc").unwrap(), value(b"abc", 3000));
    assert_eq!(pool.stats().revoked_segments, 1);
    // The revoked segment's memory was given back (and punched again after the read).
    assert!(
        pool.resident_bytes() <= 2 << 20,
        "{}",
        pool.resident_bytes()
    );
}

#[test]
fn compaction_keeps_live_objects_and_frees_dead_space() {
    let pool = pool(8 << 20, false);
    let boxes: Vec<SoftBox> = (0..2000).map(|_| pool.new_unique()).collect();
    for (i, b) in boxes.iter().enumerate() {
        assert!(b.write(&value(&(i as u64).to_le_bytes(), 4000)));
    }
    // Free three objects in four: the pool is at its grant, its segments mostly dead.
    let keep: Vec<(usize, SoftBox)> = boxes
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % 4 == 0)
        .collect();
    let before = pool.stats().resident_segments;
    for _ in 0..20 {
        pool.evacuate_now();
    }
    let s = pool.stats();
    assert!(s.resident_segments <= 2, "{before} -> {s:?}");
    assert!(s.compacted_segments >= 2 && s.moved_objects > 0, "{s:?}");
    for (i, b) in &keep {
        assert!(b.is_present(), "compaction lost object {i}");
        assert_eq!(
            b.read(&[]).unwrap(),
            value(&(*i as u64).to_le_bytes(), 4000)
        );
    }
}

#[test]
fn big_objects_span_segments_and_survive_a_punch_as_a_miss() {
    let pool = pool(16 << 20, false);
    let b = pool.new_unique();
    let big = value(b"big", 5 << 20);
    assert!(b.write(&big));
    assert_eq!(b.read(&[]).unwrap(), big);
    assert!(pool.used_segments().len() >= 3);
    pool.punch_as_daemon(pool.used_segments()[1]).unwrap();
    assert_eq!(
        b.read(b"k").unwrap(),
        value(b"k", 3000),
        "the whole object is a miss"
    );
}

#[test]
fn pointers_collections_and_cmpxchg() {
    let pool = pool(8 << 20, false);
    let b = pool.new_unique();
    assert!(!b.cmpxchg(b"x", b"y"), "absent: no swap");
    b.write(b"x");
    assert!(!b.cmpxchg(b"z", b"y"));
    assert!(b.cmpxchg(b"x", b"y"));
    assert_eq!(b.read(&[]).unwrap(), b"y");
    let s1 = SoftShared::new(&pool);
    let s2 = s1.clone();
    s1.write(b"shared");
    assert_eq!(s2.read(&[]).unwrap(), b"shared");
    assert_eq!(s2.count(), 2);
    let arr = SoftArray::new(&pool, 10);
    assert_eq!(arr.get(3).unwrap(), value(&3u64.to_le_bytes(), 3000));
    assert!(arr.get(10).is_none());
    let q = SoftQueue::new(&pool);
    q.push(b"a", b"first");
    q.push(b"b", b"second");
    pool.set_limit(0);
    pool.evacuate_now();
    assert_eq!(
        q.pop().unwrap(),
        value(b"a", 3000),
        "taken: rebuilt from its args"
    );
    assert_eq!(q.len(), 1);
}

#[test]
fn debug_mode_compares_hits_with_their_reconstruction() {
    // A correct reconstructor under a shrinking grant: no mismatch.
    let pool = pool(4 << 20, true);
    let map = SoftHashMap::new(&pool);
    for round in 0..3 {
        for i in 0..3000 {
            let k = format!("{i}");
            assert_eq!(map.get(k.as_bytes()).unwrap(), value(k.as_bytes(), 3000));
        }
        pool.set_limit((3 - round) << 20);
    }
    let s = pool.stats();
    assert!(s.hits > 0);
    assert_eq!(s.verify_mismatches, 0, "{s:?}");
    // A reconstructor that is not a function of its arguments is caught.
    let n = Arc::new(AtomicU64::new(0));
    let n2 = n.clone();
    let cfg = PoolConfig {
        verify: true,
        capacity: 8 << 20,
        ..Default::default()
    };
    let bad = Pool::new(
        cfg,
        Arc::new(move |_: &[u8]| Some(n2.fetch_add(1, Ordering::Relaxed).to_le_bytes().to_vec())),
    )
    .unwrap();
    let b = bad.new_unique();
    b.read(&[]).unwrap();
    b.read(&[]).unwrap();
    assert_eq!(bad.stats().verify_mismatches, 1);
}

/// Object `i`'s 32 bytes: four words that all depend on `i`, so a copy torn between two objects
/// or two places, or one of zeros, never matches.
fn small_value(i: u64) -> [u8; 32] {
    let mut v = [0u8; 32];
    let words = [
        i,
        i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        !i,
        i ^ 0x5555_aaaa_5555_aaaa,
    ];
    for (k, w) in words.iter().enumerate() {
        v[8 * k..8 * k + 8].copy_from_slice(&w.to_le_bytes());
    }
    v
}

/// The lean hit path (32-byte objects read through their own `SoftBox`, without the lock) from
/// four threads at once, against everything that takes memory: a writer rewriting objects in
/// place (dead bytes: compaction moves the rest), grants moving up and down (releases) and
/// punches as the daemon does them. Every value read is checked, and every read is counted
/// exactly once, as a hit or a miss (the per-thread hit counters lose nothing).
#[test]
fn small_reads_from_many_threads_racing_moves_releases_and_punches_are_right() {
    const N: u64 = 120_000; // 48 bytes each with its header: about 5.5 MiB, three segments
    let cfg = PoolConfig {
        name: "race-small".into(),
        capacity: 64 << 20,
        limit: 8 << 20,
        tick: Duration::from_millis(2),
        ..Default::default()
    };
    let recon = |args: &[u8]| Some(small_value(u64::from_le_bytes(args.try_into().ok()?)).to_vec());
    let pool = Pool::new(cfg, Arc::new(recon)).unwrap();
    let boxes: Arc<Vec<SoftBox>> = Arc::new((0..N).map(|_| pool.new_unique()).collect());
    for (i, b) in boxes.iter().enumerate() {
        assert!(b.write(&small_value(i as u64)));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let bad = Arc::new(AtomicU64::new(0));
    let reads = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for t in 0..4u64 {
        let (boxes, stop, bad, reads) = (boxes.clone(), stop.clone(), bad.clone(), reads.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = gleaner_sys::rng::XorShift64::from_state(0x2545_f491_4f6c_dd1d ^ t);
            let mut out = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Mostly a hot tenth (hits), sometimes anywhere (misses after releases).
                let i = if rng.below(8) == 0 {
                    rng.below(N)
                } else {
                    rng.below(N / 10)
                };
                let ok = boxes[i as usize].read_into(&i.to_le_bytes(), &mut out);
                if !ok || out != small_value(i) {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
                n += 1;
            }
            reads.fetch_add(n, Ordering::Relaxed);
        }));
    }
    {
        let (boxes, stop) = (boxes.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let k = (i * 7919) % N;
                boxes[k as usize].write(&small_value(k));
                i += 1;
                if i.is_multiple_of(256) {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        }));
    }
    let t0 = Instant::now();
    let seen_enough = || {
        let s = pool.stats();
        s.revoked_segments > 5
            && s.released_segments > 0
            && s.compacted_segments > 0
            && s.hits > 10_000
            && s.misses > 0
    };
    disturb(&pool, t0, (4, 31), 3, seen_enough);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let s = pool.stats();
    let reads = reads.load(Ordering::Relaxed);
    assert_eq!(bad.load(Ordering::Relaxed), 0, "wrong reads: {s:?}");
    assert!(seen_enough(), "every kind of event happened: {s:?}");
    assert_eq!(
        s.hits + s.misses,
        reads,
        "every read counted once, as a hit or a miss: {s:?}"
    );
}
