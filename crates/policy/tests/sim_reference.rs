//! The simulator's reference policies: LRU and Belady on hand-checked traces, Belady's optimality
//! against brute force, and the expected ordering on Zipf traces.

use std::collections::HashMap;
use std::sync::Arc;

use gleaner_policy::evict::{Belady, EvictKind, EvictPolicy, Fifo, Future, Lru, Visibility};
use gleaner_policy::prefetch::NoPrefetch;
use gleaner_policy::sim::{simulate, SimConfig};
use gleaner_policy::trace::synth::{generate, Pattern, SplitMix64, SynthConfig};
use gleaner_policy::trace::{Kind, Record};

fn refs(pages: &[u64]) -> Vec<Record> {
    pages
        .iter()
        .enumerate()
        .map(|(i, &page)| Record {
            time_ns: i as u64,
            page,
            tid: 1,
            kind: Kind::Access,
        })
        .collect()
}

fn misses(t: &[Record], kind: EvictKind, capacity: usize, vis: Visibility) -> u64 {
    let future = Arc::new(Future::new(t.iter().map(|r| r.page)));
    let mut p = kind.build(capacity, vis, Some(&future)).unwrap();
    simulate(t, &mut NoPrefetch, p.as_mut(), &SimConfig::new(capacity)).misses
}

fn run(t: &[Record], p: &mut dyn EvictPolicy, capacity: usize) -> u64 {
    simulate(t, &mut NoPrefetch, p, &SimConfig::new(capacity)).misses
}

/// The textbook reference string (Silberschatz et al.), 3 frames.
const TEXTBOOK: [u64; 20] = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1];

#[test]
fn lru_by_hand() {
    // LRU, 3 frames, listed least to most recently used after each reference (m = miss):
    //  1  7 m [7]        2  0 m [7 0]      3  1 m [7 0 1]    4  2 m -7 [0 1 2]
    //  5  0   [1 2 0]    6  3 m -1 [2 0 3] 7  0   [2 3 0]    8  4 m -2 [3 0 4]
    //  9  2 m -3 [0 4 2] 10 3 m -0 [4 2 3] 11 0 m -4 [2 3 0] 12 3   [2 0 3]
    // 13  2   [0 3 2]    14 1 m -0 [3 2 1] 15 2   [3 1 2]    16 0 m -3 [1 2 0]
    // 17  1   [2 0 1]    18 7 m -2 [0 1 7] 19 0   [1 7 0]    20 1   [7 0 1]
    // Misses at 1 2 3 4 6 8 9 10 11 14 16 18: 12.
    let t = refs(&TEXTBOOK);
    assert_eq!(run(&t, &mut Lru::new(), 3), 12);
    // Belady's anomaly string: 1 2 3 4 1 2 5 1 2 3 4 5.
    // 3 frames: 1 2 3 4(-1) 1(-2) 2(-3) 5(-4) 1 2 hit, 3(-5) 4(-1) 5(-2): 10 misses.
    // 4 frames: 1 2 3 4, 1 2 hit, 5(-3) 1 2 hit, 3(-4) 4(-5) 5(-1): 8 misses.
    let a = refs(&[1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5]);
    assert_eq!(run(&a, &mut Lru::new(), 3), 10);
    assert_eq!(run(&a, &mut Lru::new(), 4), 8);
}

#[test]
fn belady_by_hand() {
    // OPT, 3 frames; on a miss, evict the page used furthest ahead (reference numbers):
    //  1-3  7 0 1 m               4  2 m: 7@18 0@5 1@14 -> -7   {0 1 2}
    //  5  0                       6  3 m: 0@7 1@14 2@9 -> -1    {0 2 3}
    //  7  0                       8  4 m: 0@11 2@9 3@10 -> -0   {2 3 4}
    //  9  2, 10 3                11  0 m: 2@13 3@12 4 never -> -4 {2 3 0}
    // 12  3, 13 2                14  1 m: 2@15 3 never 0@16 -> -3 {2 0 1}
    // 15  2, 16 0, 17 1          18  7 m: 2 never 0@19 1@20 -> -2 {0 1 7}
    // 19  0, 20 1. Misses at 1 2 3 4 6 8 11 14 18: 9.
    let t = refs(&TEXTBOOK);
    assert_eq!(misses(&t, EvictKind::Belady, 3, Visibility::Oracle), 9);
    // Anomaly string. 3 frames: 1 2 3, 4 m (3@10 furthest) {1 2 4}, 1 2 hit, 5 m (4@11) {1 2 5},
    // 1 2 hit, 3 m (1, 2 never) , 4 m (never-used page), 5 hit: 7 misses.
    // 4 frames: 1 2 3 4, 1 2 hit, 5 m (4@11) {1 2 3 5}, 1 2 3 hit, 4 m, 5 hit: 6 misses.
    let a = refs(&[1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5]);
    assert_eq!(misses(&a, EvictKind::Belady, 3, Visibility::Oracle), 7);
    assert_eq!(misses(&a, EvictKind::Belady, 4, Visibility::Oracle), 6);
}

#[test]
fn fifo_by_hand_including_beladys_anomaly() {
    // FIFO, 3 frames, textbook string (queue oldest first):
    //  1-3 7 0 1 m   4 2 m -7 [0 1 2]   5 0        6 3 m -0 [1 2 3]  7 0 m -1 [2 3 0]
    //  8 4 m -2 [3 0 4]  9 2 m -3 [0 4 2]  10 3 m -0 [4 2 3]  11 0 m -4 [2 3 0]  12 3, 13 2
    // 14 1 m -2 [3 0 1]  15 2 m -3 [0 1 2]  16 0, 17 1  18 7 m -0 [1 2 7]  19 0 m -1 [2 7 0]
    // 20 1 m -2 [7 0 1]. 15 misses.
    assert_eq!(run(&refs(&TEXTBOOK), &mut Fifo::new(), 3), 15);
    // Belady's anomaly: more frames, more misses (9 with 3 frames, 10 with 4).
    let a = refs(&[1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5]);
    assert_eq!(run(&a, &mut Fifo::new(), 3), 9);
    assert_eq!(run(&a, &mut Fifo::new(), 4), 10);
}

/// The fewest misses any demand policy can get: search over every victim choice, memoised on
/// (position, resident set).
fn brute_force_min(pages: &[u64], capacity: usize) -> u64 {
    fn go(
        pages: &[u64],
        i: usize,
        cache: Vec<u64>,
        cap: usize,
        memo: &mut HashMap<(usize, Vec<u64>), u64>,
    ) -> u64 {
        if i == pages.len() {
            return 0;
        }
        if let Some(&v) = memo.get(&(i, cache.clone())) {
            return v;
        }
        let p = pages[i];
        let best = if cache.contains(&p) {
            go(pages, i + 1, cache.clone(), cap, memo)
        } else if cache.len() < cap {
            let mut c = cache.clone();
            c.push(p);
            c.sort_unstable();
            1 + go(pages, i + 1, c, cap, memo)
        } else {
            (0..cache.len())
                .map(|k| {
                    let mut c = cache.clone();
                    c[k] = p;
                    c.sort_unstable();
                    1 + go(pages, i + 1, c, cap, memo)
                })
                .min()
                .expect("cache is full, so not empty")
        };
        memo.insert((i, cache), best);
        best
    }
    go(pages, 0, Vec::new(), capacity, &mut HashMap::new())
}

#[test]
fn belady_is_optimal_against_brute_force() {
    let mut rng = SplitMix64::new(11);
    for _ in 0..400 {
        let len = 1 + rng.below(14) as usize;
        let distinct = 2 + rng.below(4);
        let cap = 1 + rng.below(3) as usize;
        let pages: Vec<u64> = (0..len).map(|_| rng.below(distinct)).collect();
        let t = refs(&pages);
        let opt = brute_force_min(&pages, cap);
        let belady = misses(&t, EvictKind::Belady, cap, Visibility::Oracle);
        assert_eq!(belady, opt, "{pages:?} with {cap} frames");
        // And no online policy beats it.
        for k in [EvictKind::Fifo, EvictKind::Clock, EvictKind::Lru] {
            assert!(
                misses(&t, k, cap, Visibility::Fault) >= opt,
                "{k} {pages:?}"
            );
        }
    }
}

/// LRU misses from stack distances: a reference hits iff fewer than `cap` distinct other pages
/// were referenced since the previous reference to the same page.
fn lru_by_stack_distance(pages: &[u64], cap: usize) -> u64 {
    let mut misses = 0;
    for (i, p) in pages.iter().enumerate() {
        match pages[..i].iter().rposition(|q| q == p) {
            None => misses += 1,
            Some(j) => {
                let mut between: Vec<u64> = pages[j + 1..i].to_vec();
                between.sort_unstable();
                between.dedup();
                if between.len() >= cap {
                    misses += 1;
                }
            }
        }
    }
    misses
}

#[test]
fn lru_matches_stack_distances() {
    let mut rng = SplitMix64::new(5);
    for _ in 0..200 {
        let len = 1 + rng.below(300) as usize;
        let distinct = 1 + rng.below(40);
        let cap = 1 + rng.below(20) as usize;
        let pages: Vec<u64> = (0..len).map(|_| rng.below(distinct)).collect();
        assert_eq!(
            run(&refs(&pages), &mut Lru::new(), cap),
            lru_by_stack_distance(&pages, cap),
            "{cap} frames"
        );
    }
}

#[test]
fn belady_le_lru_le_fifo_on_zipf() {
    for seed in 1..=4 {
        for s in [0.8, 0.99, 1.2] {
            let mut cfg = SynthConfig::new(Pattern::Zipf(s), 5_000, 50_000);
            cfg.seed = seed;
            let t = generate(&cfg);
            for cap in [250, 1_000, 2_500] {
                let b = misses(&t, EvictKind::Belady, cap, Visibility::Oracle);
                let l = misses(&t, EvictKind::Lru, cap, Visibility::Oracle);
                let f = misses(&t, EvictKind::Fifo, cap, Visibility::Fault);
                assert!(b <= l && l <= f, "seed {seed} s {s} cap {cap}: {b} {l} {f}");
                // Every policy, under either visibility, is at least Belady.
                for k in [
                    EvictKind::Clock,
                    EvictKind::RackMem(gleaner_policy::evict::MinFree::Published),
                ] {
                    for v in [Visibility::Fault, Visibility::Oracle] {
                        assert!(misses(&t, k, cap, v) >= b);
                    }
                }
            }
        }
    }
}

#[test]
fn fault_sampled_clock_equals_clock_with_accessed_bits() {
    // Clearing a reference bit also unmaps the page, so the next access is seen as a fault:
    // the bit is the same as with every access visible, only paid for in minor faults.
    for pattern in ["zipf", "random"] {
        let t = generate(&SynthConfig::new(pattern.parse().unwrap(), 3_000, 40_000));
        let cfg = SimConfig::new(1_000);
        let f = simulate(
            &t,
            &mut NoPrefetch,
            EvictKind::Clock
                .build(1_000, Visibility::Fault, None)
                .unwrap()
                .as_mut(),
            &cfg,
        );
        let o = simulate(
            &t,
            &mut NoPrefetch,
            EvictKind::Clock
                .build(1_000, Visibility::Oracle, None)
                .unwrap()
                .as_mut(),
            &cfg,
        );
        assert_eq!(f.misses, o.misses, "{pattern}");
        assert!(f.minor_faults > 0 && o.minor_faults == 0, "{pattern}");
    }
}

#[test]
fn belady_with_prefetched_pages_keeps_consistent_counts() {
    // Prefetched pages are inserted with their own next use; the replay must stay consistent.
    let t = generate(&SynthConfig::new(Pattern::Seq, 1_000, 10_000));
    let future = Arc::new(Future::new(t.iter().map(|r| r.page)));
    let r = simulate(
        &t,
        &mut gleaner_policy::prefetch::NextN::new(4),
        &mut Belady::new(future),
        &SimConfig::new(500),
    );
    assert_eq!(r.hits + r.misses + r.prefetch_hits, 10_000);
    assert!(r.misses < 100, "{r:?}");
}
