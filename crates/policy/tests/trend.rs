//! Leap's trend detector (FINDTREND, Leap's FINDTREND) on the paper's worked example and on
//! adversarial histories.

use gleaner_policy::prefetch::{delta, find_trend, Fault, History, Leap, LeapConfig, Prefetcher};
use gleaner_policy::trace::synth::SplitMix64;

/// The faults of the worked example (t0 … t15).
const EXAMPLE: [u64; 16] = [
    0x48, 0x45, 0x42, 0x3F, 0x3C, 0x02, 0x04, 0x06, 0x08, 0x0A, 0x0C, 0x10, 0x39, 0x12, 0x14, 0x16,
];

fn miss(page: u64) -> Fault {
    Fault {
        page,
        tid: 7,
        prefetch_hit: false,
    }
}

#[test]
fn worked_example_deltas_and_trends() {
    // H_size = 8, N_split = 2: windows of 4, then 8.
    let mut h = History::new(8);
    let mut last = None;
    let mut deltas = Vec::new();
    let mut trends = Vec::new();
    for &p in &EXAMPLE {
        let d = last.map_or(0, |l| delta(l, p));
        last = Some(p);
        h.push(d);
        deltas.push(d);
        trends.push(h.find_trend(2));
    }
    assert_eq!(
        deltas,
        vec![0, -3, -3, -3, -3, -58, 2, 2, 2, 2, 2, 4, 41, -39, 2, 2],
        "the deltas of Leap's worked example"
    );
    // The outcomes of Leap's worked example:
    assert_eq!(trends[3], Some(-3), "t3: window t0-t3 -> majority -3");
    assert_eq!(
        trends[7], None,
        "t7: t4-t7 and t0-t7 have no majority (-3 four times, 5 needed)"
    );
    assert_eq!(trends[8], Some(2), "t8: t5-t8 -> +2");
    assert_eq!(
        trends[15],
        Some(2),
        "t15: t12-t15 has none; t8-t15 -> +2 (5 of 8)"
    );
    // Every other step, worked by hand (a window longer than the history is not examined):
    //   t0-t2: fewer than 4 deltas                                  -> none
    //   t4: [-3 -3 -3 -3] -> -3;  t5: [-58 -3 -3 -3] -> -3
    //   t6: [+2 -58 -3 -3] none; only 7 deltas, so no 8-window      -> none
    //   t9, t10: 4-window all/mostly +2 -> +2;  t11: [+4 +2 +2 +2] -> +2
    //   t12: [+41 +4 +2 +2] none; t5-t12 has +2 at t6..t10 (5)      -> +2
    //   t13: [-39 +41 +4 +2] none; t6-t13: +2 ×5                    -> +2
    //   t14: [+2 -39 +41 +4] none; t7-t14: +2 at t7..t10, t14 (5)   -> +2
    let expect = [
        None,
        None,
        None,
        Some(-3),
        Some(-3),
        Some(-3),
        None,
        None,
        Some(2),
        Some(2),
        Some(2),
        Some(2),
        Some(2),
        Some(2),
        Some(2),
        Some(2),
    ];
    assert_eq!(trends, expect);
    // The slice form (most recent first) agrees at t15.
    let recent: Vec<i64> = deltas.iter().rev().copied().collect();
    assert_eq!(find_trend(&recent, 8, 2), Some(2));
    assert_eq!(find_trend(&recent[8..], 8, 2), None, "t7's history");
}

#[test]
fn worked_example_through_leap_keeps_and_replaces_the_trend() {
    let mut leap = Leap::new(LeapConfig {
        h_size: 8,
        n_split: 2,
        ..LeapConfig::default()
    });
    let mut out = Vec::new();
    let mut trend = Vec::new();
    let mut prefetched = Vec::new();
    for &p in &EXAMPLE {
        out.clear();
        leap.on_fault(miss(p), &mut out);
        trend.push(leap.trend(7));
        prefetched.push(out.clone());
    }
    // Δ_trend is kept while no majority exists (t6, t7) and replaced at t8.
    assert_eq!(trend[3], Some(-3));
    assert_eq!(
        trend[7],
        Some(-3),
        "no majority at t7: the previous trend stays"
    );
    assert_eq!(trend[8], Some(2));
    assert_eq!(trend[15], Some(2));
    // No prefetch hits are reported, so the window is 1 exactly when the last delta is the trend:
    // t3 and t4 prefetch one page along -3; t5 (delta -58) suspends; t8 restarts along +2.
    assert_eq!(prefetched[3], vec![0x3C]);
    assert_eq!(prefetched[4], vec![0x39]);
    assert!(prefetched[5..8].iter().all(Vec::is_empty), "{prefetched:?}");
    assert_eq!(prefetched[8], vec![0x0A]);
    assert!(
        prefetched[12].is_empty(),
        "t12 (+41): off trend, no hits: suspended"
    );
    assert_eq!(prefetched[15], vec![0x18]);
}

#[test]
fn no_majority_in_distinct_or_random_deltas() {
    // 32 distinct deltas: no window can have a majority.
    let mut rng = SplitMix64::new(42);
    let mut d: Vec<i64> = (1..=32).collect();
    for i in (1..d.len()).rev() {
        d.swap(i, rng.below(i as u64 + 1) as usize);
    }
    assert_eq!(find_trend(&d, 32, 4), None);
    // Random pages over a large space: Leap never finds a trend.
    let mut leap = Leap::new(LeapConfig::default());
    let mut out = Vec::new();
    for _ in 0..10_000 {
        leap.on_fault(miss(rng.below(1 << 30)), &mut out);
    }
    assert_eq!(leap.trend(7), None);
    assert!(out.is_empty(), "issued {} candidates", out.len());
}

#[test]
fn alternating_deltas_have_no_majority_but_two_to_one_does() {
    let alt: Vec<i64> = (0..32).map(|i| if i % 2 == 0 { 1 } else { -1 }).collect();
    assert_eq!(
        find_trend(&alt, 32, 4),
        None,
        "exactly half is not a majority"
    );
    let two_one: Vec<i64> = (0..32).map(|i| if i % 3 == 2 { -1 } else { 1 }).collect();
    assert_eq!(find_trend(&two_one, 32, 4), Some(1));
}

#[test]
fn trend_change_mid_history() {
    // Most recent first: k deltas of -7 after 28 of +3, windows 8, 16, 32.
    let hist = |k: usize| -> Vec<i64> {
        let mut v = vec![-7; k];
        v.extend(vec![3; 32 - k]);
        v
    };
    assert_eq!(
        find_trend(&hist(4), 32, 4),
        Some(3),
        "8-window tied 4/4; the 16-window has +3 ×12"
    );
    assert_eq!(find_trend(&hist(5), 32, 4), Some(-7), "5 of 8 is enough");
    assert_eq!(
        find_trend(&hist(8), 32, 4),
        Some(-7),
        "the smallest window decides first"
    );
    // Leap follows the change once the new delta holds a majority of the first window.
    let mut leap = Leap::new(LeapConfig::default());
    let mut out = Vec::new();
    let mut p = 1_000_000u64;
    for _ in 0..32 {
        p += 3;
        leap.on_fault(miss(p), &mut out);
    }
    assert_eq!(leap.trend(7), Some(3));
    for i in 1..=5 {
        p -= 7;
        leap.on_fault(miss(p), &mut out);
        let expect = if i < 5 { Some(3) } else { Some(-7) };
        assert_eq!(leap.trend(7), expect, "after {i} deltas of -7");
    }
}

#[test]
fn huge_and_negative_deltas() {
    assert_eq!(delta(0, u64::MAX), i64::MAX, "clamped, not wrapped to -1");
    assert_eq!(delta(u64::MAX, 0), i64::MIN);
    assert_eq!(delta(10, 3), -7);
    // Jumps across the whole page space alternate ±huge: no trend, nothing prefetched.
    let mut leap = Leap::new(LeapConfig::default());
    let mut out = Vec::new();
    for i in 0..64 {
        leap.on_fault(miss(if i % 2 == 0 { 0 } else { u64::MAX }), &mut out);
    }
    assert!(out.is_empty(), "{out:?}");
    // A huge negative stride is a valid trend; candidates stop at page 0.
    let step = 1u64 << 40;
    let mut leap = Leap::new(LeapConfig::default());
    for k in (1..=20u64).rev() {
        out.clear();
        leap.on_fault(miss(k * step), &mut out);
    }
    assert_eq!(leap.trend(7), Some(-(step as i64)));
    assert_eq!(out, vec![0], "from page 2^40 one step down is page 0");
    out.clear();
    leap.on_fault(miss(0), &mut out);
    assert!(out.is_empty(), "nothing below page 0: {out:?}");
}

#[test]
fn history_shorter_than_the_window() {
    let five = [5i64; 7];
    assert_eq!(find_trend(&five, 32, 4), None, "7 deltas < first window 8");
    assert_eq!(find_trend(&[5i64; 8], 32, 4), Some(5));
    assert_eq!(find_trend(&[], 32, 4), None);
    assert_eq!(find_trend(&[9], 1, 1), Some(9), "degenerate H_size = 1");
    let mut h = History::new(32);
    for _ in 0..7 {
        h.push(5);
    }
    assert_eq!(h.find_trend(4), None);
    h.push(5);
    assert_eq!(h.find_trend(4), Some(5));
}

#[test]
fn page_arithmetic_never_wraps() {
    // Ascending to the top of the page space.
    let mut leap = Leap::new(LeapConfig::default());
    let mut out = Vec::new();
    let mut all = Vec::new();
    for p in u64::MAX - 40..=u64::MAX {
        out.clear();
        leap.on_fault(miss(p), &mut out);
        assert!(out.iter().all(|&c| c > p), "page {p}: {out:?}");
        all.extend_from_slice(&out);
    }
    assert!(!all.is_empty());
    assert!(out.is_empty(), "nothing after u64::MAX");
    // Descending to page 0.
    let mut leap = Leap::new(LeapConfig::default());
    for p in (0..=40u64).rev() {
        out.clear();
        leap.on_fault(miss(p), &mut out);
        assert!(out.iter().all(|&c| c < p), "page {p}: {out:?}");
    }
    assert!(out.is_empty(), "nothing before page 0");
}

#[test]
fn boyer_moore_matches_brute_force() {
    let mut rng = SplitMix64::new(7);
    for _ in 0..5_000 {
        let len = rng.below(40) as usize;
        let hist: Vec<i64> = (0..len).map(|_| rng.below(3) as i64 - 1).collect();
        let n_split = [1usize, 2, 4, 8][rng.below(4) as usize];
        let mut expect = None;
        let mut w = 32 / n_split;
        while w <= 32 && w <= len {
            let win = &hist[..w];
            if let Some(&m) = win
                .iter()
                .find(|&&x| win.iter().filter(|&&y| y == x).count() > w / 2)
            {
                expect = Some(m);
                break;
            }
            w *= 2;
        }
        assert_eq!(find_trend(&hist, 32, n_split), expect, "{hist:?} {n_split}");
    }
}

/// FINDTREND by its definition: the first window (`h_size / n_split`, doubling up to `h_size`)
/// whose most common delta occurs more than half the time, counted directly.
fn trend_by_counting(hist: &[i64], h_size: usize, n_split: usize) -> Option<i64> {
    let len = hist.len().min(h_size);
    let mut w = (h_size / n_split.max(1)).max(1);
    while w <= h_size && w <= len {
        let window = &hist[..w];
        if let Some(&d) = window
            .iter()
            .find(|&&d| window.iter().filter(|&&e| e == d).count() > w / 2)
        {
            return Some(d);
        }
        w *= 2;
    }
    None
}

#[test]
fn the_vote_finds_exactly_the_majorities_counting_finds() {
    let mut rng = SplitMix64::new(7);
    let mut found = 0;
    for round in 0..20_000 {
        // Few distinct deltas, so that majorities, near-majorities and even votes all occur.
        let alphabet = 1 + rng.below(4) as i64;
        let len = rng.below(40) as usize;
        let bias = rng.below(100);
        let hist: Vec<i64> = (0..len)
            .map(|_| {
                if rng.below(100) < bias {
                    1
                } else {
                    rng.below(alphabet as u64) as i64 - 1
                }
            })
            .collect();
        for (h_size, n_split) in [(32, 4), (8, 2), (16, 1), (32, 32)] {
            let want = trend_by_counting(&hist, h_size, n_split);
            assert_eq!(
                find_trend(&hist, h_size, n_split),
                want,
                "round {round}: {hist:?}, h_size {h_size}, n_split {n_split}"
            );
            found += usize::from(want.is_some());
        }
    }
    assert!(
        found > 10_000,
        "the histories must hold majorities too: {found}"
    );
}
