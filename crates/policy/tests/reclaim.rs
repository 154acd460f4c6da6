//! Hermit's reclaim scheduler against scripted feedback: charges at chosen rates with explicit
//! timestamps, reclaim-batch reports, re-fault turnarounds and resident levels, checking the
//! thread count and the watermarks after each step (Hermit, NSDI 2023, its scheduler and the public code's watermark probe; Fastswap, EuroSys 2020).
//!
//! Conventions used in the hand computations below:
//! * `free = budget - resident`; `H` / `L` are the high / low watermarks as free pages, and the
//!   resident-page levels are `budget - H` / `budget - L`.
//! * Every check is 128 charges (`CHECK_EVERY`); `check_at` drives exactly one check, so the
//!   rate of a 1 ms window holding `k` checks is `k * 128` pages/ms = `k * 128_000` pages/s.
//! * `S_out` is set by one thread-0 batch of 128 pages in 1 ms = 128,000 pages/s, so
//!   `SI = S_in / S_out = k`.

use gleaner_policy::reclaim::{
    headroom_cap, Decision, ProbeRule, RateEstimate, ReclaimMode, ReclaimParams, ReclaimScheduler,
    ReclaimSnapshot, ALPHA, BETA, BOOTSTRAP_FREE, CHECK_EVERY, GAMMA, HEADROOM_CAP_DIVISOR,
    MAX_RECLAIMERS, MIN_HEADROOM_CAP, RATE_WINDOW_NS, STATIC_START_FREE,
};

const MS: u64 = 1_000_000;

/// The parameters with the headroom cap at a quarter of the budget (the default is 1/64): the
/// published constants' arithmetic, on budgets the quarter does not reach (100,000 pages and
/// more), or the cap's own arithmetic on small ones.
fn quarter_cap() -> ReclaimParams {
    ReclaimParams {
        headroom_cap_divisor: 4,
        ..ReclaimParams::default()
    }
}

fn hermit() -> ReclaimMode {
    ReclaimMode::Hermit {
        probe: ProbeRule::Code,
    }
}

fn paper() -> ReclaimMode {
    ReclaimMode::Hermit {
        probe: ProbeRule::Paper,
    }
}

/// Drives one check: `check_every - 1` fast-path charges, then the checking charge, all with
/// `resident` pages resident at time `now`. Asserts the fast path neither checks nor wakes.
fn check_at(s: &mut ReclaimScheduler, resident: u64, now: u64) -> Decision {
    let before = s.target();
    for _ in 1..s.params().check_every {
        let d = s.on_charge(resident, now);
        assert_eq!(
            d,
            Decision {
                threads: before,
                wake: false,
                checked: false
            },
            "fast path must only repeat the last target"
        );
    }
    let d = s.on_charge(resident, now);
    assert!(d.checked, "the check_every-th charge must check");
    assert_eq!(
        d.wake,
        d.threads > 0,
        "a check wakes exactly when threads run"
    );
    assert_eq!(d.threads, s.threads_for(resident));
    d
}

/// Runs `windows` rate windows of exactly 1 ms starting at `start` (the current window start),
/// each with `k` checks evenly spaced and the last at the window's end, at `resident` pages.
/// Returns the time of the last check, which is the new window start. `k` must divide 1 ms.
fn run_windows(s: &mut ReclaimScheduler, resident: u64, start: u64, k: u64, windows: u64) -> u64 {
    assert_eq!(MS % k, 0);
    let mut t = start;
    for _ in 0..windows {
        for i in 1..=k {
            check_at(s, resident, t + i * MS / k);
        }
        t += MS;
    }
    t
}

/// Thread 0 reclaims 128 pages in 1 ms: S_out = 128,000 pages/s.
fn report_s_out(s: &mut ReclaimScheduler) {
    s.on_reclaimed(0, 128, MS);
}

/// A Hermit scheduler whose rates are known and give swap intensity `k`; returns it and the
/// current window start. All checks so far ran at `quiet` resident pages.
fn with_intensity(
    budget: u64,
    mode: ReclaimMode,
    params: ReclaimParams,
    k: u64,
    quiet: u64,
) -> (ReclaimScheduler, u64) {
    let mut s = ReclaimScheduler::new(budget, mode, params);
    report_s_out(&mut s);
    check_at(&mut s, quiet, 0); // opens the first window at t = 0
    let t = run_windows(&mut s, quiet, 0, k, 1);
    let snap = s.snapshot();
    assert!(snap.rates_known);
    assert_eq!(snap.s_out_pages_per_s, 128_000);
    assert_eq!(snap.s_in_pages_per_s, k * 128_000);
    assert_eq!(snap.swap_intensity, k);
    (s, t)
}

#[test]
fn published_constants() {
    assert_eq!(ALPHA, 128);
    assert_eq!(CHECK_EVERY, 128);
    assert_eq!(RATE_WINDOW_NS, 1_000_000);
    assert_eq!(MAX_RECLAIMERS, 16);
    assert_eq!(BETA, 16);
    assert_eq!(GAMMA, 2000);
    assert_eq!(BOOTSTRAP_FREE, 2048);
    assert_eq!(STATIC_START_FREE, 2048);
    let p = ReclaimParams::default();
    assert_eq!(p.alpha, ALPHA);
    assert_eq!(p.check_every, CHECK_EVERY);
    assert_eq!(p.max_reclaimers, MAX_RECLAIMERS);
    assert_eq!(p.s_in_estimate, RateEstimate::RunningMax);
    assert_eq!(ReclaimMode::default(), hermit());
}

#[test]
fn bootstrap_runs_one_thread_below_2048_free_until_both_rates_are_known() {
    // budget 100,000 (headroom cap 25,000 does not bite): bootstrap L = 2048 free pages.
    let b = 100_000;
    let mut s = ReclaimScheduler::new(b, hermit(), quarter_cap());
    let snap = s.snapshot();
    assert!(!snap.rates_known);
    assert_eq!(snap.target_threads, 0);
    assert_eq!(snap.low_watermark_free, 2048);
    assert_eq!(snap.low_watermark_pages, 97_952);
    assert_eq!(snap.high_watermark_pages, b);

    // free 2048 is not below 2048: no thread; free 2047: one.
    assert_eq!(check_at(&mut s, b - 2048, 0).threads, 0);
    let d = check_at(&mut s, b - 2047, 0);
    assert_eq!((d.threads, d.wake), (1, true));
    // Even at (and past) the budget, only one thread while bootstrapping.
    assert_eq!(check_at(&mut s, b, 0).threads, 1);
    assert_eq!(check_at(&mut s, b + 50, 0).threads, 1);

    // S_in becomes known but S_out is not: still bootstrap. The first window holds the 3 checks
    // above after the one that opened it, plus 8: 11 * 128 pages in 1 ms = 1,408,000 pages/s.
    let t = run_windows(&mut s, b, 0, 8, 1);
    let snap = s.snapshot();
    assert_eq!(snap.s_in_pages_per_s, 1_408_000);
    assert!(!snap.rates_known);
    assert_eq!(snap.target_threads, 1);

    // Batches of threads other than 0 do not make S_out known.
    s.on_reclaimed(3, 1000, MS);
    assert_eq!(s.snapshot().s_out_pages_per_s, 0);
    assert_eq!(check_at(&mut s, b, t).threads, 1);
    assert_eq!(s.snapshot().reclaimed_pages, 1000);

    // Thread 0's batch: S_out = 128,000 pages/s, used from the next check on.
    report_s_out(&mut s);
    assert!(!s.snapshot().rates_known);
    assert_eq!(s.threads_for(b), 1);
    // Next check: SI = 1,408,000 / 128,000 = 11, n_max = 11, H = 128 * 11 = 1408,
    // L = 16 * 1408 = 22,528; at the budget all 11 threads run.
    let d = check_at(&mut s, b, t);
    assert_eq!(d.threads, 11);
    let snap = s.snapshot();
    assert!(snap.rates_known);
    assert_eq!(snap.swap_intensity, 11);
    assert_eq!(snap.high_watermark_free, 1408);
    assert_eq!(snap.low_watermark_free, 22_528);
    // Out of bootstrap, free 3000 (not below 2048, but <= L = 22,528) now gets one thread.
    assert_eq!(check_at(&mut s, b - 3000, t).threads, 1);
}

#[test]
fn ramp_zero_then_one_then_proportional_reaching_n_max_at_the_budget() {
    // SI = 4: H = 128 * 4 = 512, L = max(16 * 512, probe 0) = 8192.
    let b = 1_000_000;
    let (mut s, t) = with_intensity(b, hermit(), ReclaimParams::default(), 4, 500_000);
    let snap = s.snapshot();
    assert_eq!(snap.high_watermark_free, 512);
    assert_eq!(snap.low_watermark_free, 8192);
    assert_eq!(snap.high_watermark_pages, 999_488);
    assert_eq!(snap.low_watermark_pages, 991_808);
    assert_eq!(snap.max_threads, 4);

    // (free, threads). Phase 3: n = 4 * (512 - free) / 512, at least 1.
    let expected = [
        (500_000, 0),
        (8193, 0), // free > L: phase 1
        (8192, 1), // free == L: phase 2
        (513, 1),
        (512, 1), // free == H: still phase 2
        (511, 1), // 4 * 1 / 512 = 0 -> clamped to 1
        (384, 1), // 4 * 128 / 512 = 1
        (256, 2), // 4 * 256 / 512 = 2
        (255, 2), // 4 * 257 / 512 = 2.007
        (128, 3), // 4 * 384 / 512 = 3
        (1, 3),   // 4 * 511 / 512 = 3.99
        (0, 4),   // at the budget: n_max
    ];
    for (free, threads) in expected {
        let d = check_at(&mut s, b - free, t);
        assert_eq!(d.threads, threads, "free = {free}");
        assert_eq!(s.snapshot().target_threads, threads);
    }
    // Over the budget (the engine's overflow allowance) counts as free = 0.
    assert_eq!(check_at(&mut s, b + 100, t).threads, 4);
    // The watermarks did not move: all these checks were at t, inside the current window.
    assert_eq!(s.snapshot().high_watermark_free, 512);

    // Monotone in the resident level, never more than n_max.
    let mut last = 0;
    for free in (0..=9000u64).rev() {
        let n = s.threads_for(b - free);
        assert!(n >= last && n <= 4, "free = {free}: {n} after {last}");
        last = n;
    }
}

#[test]
fn max_reclaimers_caps_the_ramp_and_the_high_watermark() {
    // Raw SI = 4 but the engine allows 2 threads: n_max = 2, H = 256, L = 4096.
    let b = 1_000_000;
    let params = ReclaimParams {
        max_reclaimers: 2,
        ..quarter_cap()
    };
    let (mut s, t) = with_intensity(b, hermit(), params, 4, 500_000);
    assert_eq!(s.pool_size(), 2);
    let snap = s.snapshot();
    assert_eq!(snap.swap_intensity, 4);
    assert_eq!(snap.max_threads, 2);
    assert_eq!(snap.high_watermark_free, 256);
    assert_eq!(snap.low_watermark_free, 4096);
    // n = 2 * (256 - free) / 256.
    for (free, threads) in [
        (4097, 0),
        (4096, 1),
        (256, 1),
        (128, 1),
        (127, 1),
        (1, 1),
        (0, 2),
    ] {
        assert_eq!(
            check_at(&mut s, b - free, t).threads,
            threads,
            "free = {free}"
        );
    }

    // Default cap 16: SI = 32 (32 checks per ms: 4,096,000 pages/s) gives n_max = 16,
    // H = 2048, L = 32768; at free 1024: 16 * 1024 / 2048 = 8.
    let (mut s, t) = with_intensity(b, hermit(), quarter_cap(), 32, 500_000);
    let snap = s.snapshot();
    assert_eq!(snap.max_threads, 16);
    assert_eq!(snap.high_watermark_free, 2048);
    assert_eq!(snap.low_watermark_free, 32_768);
    assert_eq!(check_at(&mut s, b - 1024, t).threads, 8);
    assert_eq!(check_at(&mut s, b, t).threads, 16);
}

#[test]
fn high_watermark_moves_with_swap_intensity() {
    let b = 1_000_000;
    let quiet = 500_000;
    // SI = 2: H = 256, level 999,744; L = 4096.
    let (mut s, t) = with_intensity(b, hermit(), quarter_cap(), 2, quiet);
    let h2 = s.snapshot().high_watermark_pages;
    assert_eq!(h2, 999_744);
    assert_eq!(s.snapshot().low_watermark_free, 4096);

    // Double the fault-in rate: 4 checks per ms -> S_in 512,000, SI = 4, H = 512.
    // The high watermark drops by ALPHA * (4 - 2) = 256 pages.
    let t = run_windows(&mut s, quiet, t, 4, 1);
    let snap = s.snapshot();
    assert_eq!(snap.swap_intensity, 4);
    assert_eq!(snap.high_watermark_pages, 999_488);
    assert_eq!(h2 - snap.high_watermark_pages, ALPHA * 2);
    assert_eq!(snap.low_watermark_free, 8192);
    // At free 700: SI 4 puts it in phase 2 (700 >= 512): one thread. (`threads_for`, not a
    // check, so that no extra charges land in the next window.)
    assert_eq!(s.threads_for(b - 700), 1);

    // Double again: SI = 8, H = 1024, level 998,976 = 999,488 - 128 * 4.
    let t = run_windows(&mut s, quiet, t, 8, 1);
    let snap = s.snapshot();
    assert_eq!(snap.swap_intensity, 8);
    assert_eq!(snap.high_watermark_pages, 998_976);
    assert_eq!(snap.low_watermark_free, 16_384);
    // The same free 700 is now in phase 3: 8 * (1024 - 700) / 1024 = 2.53 -> 2 threads.
    assert_eq!(s.threads_for(b - 700), 2);

    // Slow down to SI 2: the public code's running maximum keeps SI = 8.
    run_windows(&mut s, quiet, t, 2, 1);
    let snap = s.snapshot();
    assert_eq!(snap.s_in_pages_per_s, 1_024_000);
    assert_eq!(snap.high_watermark_pages, 998_976);

    // With the last-window estimate the high watermark rises back to SI 2's.
    let params = ReclaimParams {
        s_in_estimate: RateEstimate::LastWindow,
        ..quarter_cap()
    };
    let (mut s, t) = with_intensity(b, hermit(), params, 8, quiet);
    assert_eq!(s.snapshot().high_watermark_pages, 998_976);
    run_windows(&mut s, quiet, t, 2, 1);
    let snap = s.snapshot();
    assert_eq!(snap.swap_intensity, 2);
    assert_eq!(snap.high_watermark_pages, 999_744);
}

#[test]
fn s_out_is_the_running_average_of_thread_zero() {
    let mut s = ReclaimScheduler::new(1_000_000, hermit(), ReclaimParams::default());
    // 128 pages / 1 ms, then 384 pages / 1 ms: (128 + 384) / 2 ms = 256,000 pages/s.
    s.on_reclaimed(0, 128, MS);
    assert_eq!(s.snapshot().s_out_pages_per_s, 128_000);
    s.on_reclaimed(0, 384, MS);
    assert_eq!(s.snapshot().s_out_pages_per_s, 256_000);
    // Other threads are counted as reclaimed pages only.
    s.on_reclaimed(1, 10_000, 1);
    let snap = s.snapshot();
    assert_eq!(snap.s_out_pages_per_s, 256_000);
    assert_eq!(snap.reclaimed_pages, 128 + 384 + 10_000);
}

/// One probe window: report the re-faults, then one check at `t + 1 ms` that closes the window.
fn probe_window(s: &mut ReclaimScheduler, resident: u64, t: u64, turnarounds: &[u64]) -> u64 {
    for &ns in turnarounds {
        s.on_refault(ns);
    }
    check_at(s, resident, t + MS);
    t + MS
}

#[test]
fn code_probe_grows_while_turnaround_does_not_decrease_and_resets_when_it_does() {
    // budget 1,200,000 (cap 300,000); checks at resident 1,000,000: step = 1e6 / 2000 = 500.
    // SI = 1: H = 128, L = max(16 * 128, probe) = max(2048, probe).
    let b = 1_200_000;
    let r = 1_000_000;
    let mut s = ReclaimScheduler::new(b, hermit(), ReclaimParams::default());
    report_s_out(&mut s);
    check_at(&mut s, r, 0);
    // w1: first turnaround average, 1000 ns: only the reference.
    let t = probe_window(&mut s, r, 0, &[1000]);
    let snap = s.snapshot();
    assert_eq!(snap.swap_intensity, 1);
    assert_eq!(snap.turnaround_avg_ns, Some(1000));
    assert_eq!(snap.probe_pages, 0);
    assert_eq!(snap.low_watermark_free, 2048);
    // w2: average 1000, equal (not decreased): probe 500; L still max(2048, 500).
    let t = probe_window(&mut s, r, t, &[1000, 1000]);
    assert_eq!(s.snapshot().probe_pages, 500);
    assert_eq!(s.snapshot().low_watermark_free, 2048);
    // w3..w5: 2000, avg(1500, 2500) = 2000, 2600: all non-decreasing -> 1000, 1500, 2000.
    let t = probe_window(&mut s, r, t, &[2000]);
    assert_eq!(s.snapshot().probe_pages, 1000);
    let t = probe_window(&mut s, r, t, &[1500, 2500]);
    assert_eq!(s.snapshot().turnaround_avg_ns, Some(2000));
    assert_eq!(s.snapshot().probe_pages, 1500);
    let t = probe_window(&mut s, r, t, &[2600]);
    assert_eq!(s.snapshot().probe_pages, 2000);
    assert_eq!(s.snapshot().low_watermark_free, 2048);
    // Free 2400 is above L = 2048: no thread yet.
    assert_eq!(s.threads_for(b - 2400), 0);
    // w6: 2600 again -> probe 2500 > 2048: L = 2500, the low watermark moves down to
    // 1,197,500 resident pages and free 2400 now runs one thread (reclaim starts earlier).
    let t = probe_window(&mut s, r, t, &[2600]);
    let snap = s.snapshot();
    assert_eq!(snap.probe_pages, 2500);
    assert_eq!(snap.low_watermark_free, 2500);
    assert_eq!(snap.low_watermark_pages, 1_197_500);
    // (`threads_for` rather than a check: extra charges would raise S_in in the next window.)
    assert_eq!(s.threads_for(b - 2400), 1);
    // w7: pages come back sooner (100 < 2600): back off at once, L = 2048 again.
    let t = probe_window(&mut s, r, t, &[100]);
    let snap = s.snapshot();
    assert_eq!(snap.probe_pages, 0);
    assert_eq!(snap.low_watermark_free, 2048);
    assert_eq!(s.threads_for(b - 2400), 0);
    // w8: no re-fault: no information, probe and reference unchanged.
    let t = probe_window(&mut s, r, t, &[]);
    assert_eq!(s.snapshot().probe_pages, 0);
    assert_eq!(s.snapshot().turnaround_avg_ns, Some(100));
    // w9: 100 again: not a decrease -> grows.
    probe_window(&mut s, r, t, &[100]);
    assert_eq!(s.snapshot().probe_pages, 500);
    assert_eq!(s.snapshot().refaults, 10); // 1 + 2 + 1 + 2 + 1 + 1 + 1 + 0 + 1
}

#[test]
fn paper_probe_starts_at_the_high_watermark_and_backs_off_when_turnaround_increases() {
    // Same feedback as above; paper rule: L = H + probe = 128 + probe.
    let b = 1_200_000;
    let r = 1_000_000;
    let mut s = ReclaimScheduler::new(b, paper(), ReclaimParams::default());
    assert_eq!(s.mode().to_string(), "hermit:paper");
    report_s_out(&mut s);
    check_at(&mut s, r, 0);
    let t = probe_window(&mut s, r, 0, &[1000]);
    let snap = s.snapshot();
    assert_eq!(snap.low_watermark_free, 128);
    assert_eq!(snap.low_watermark_free, snap.high_watermark_free);
    // Free 500 > L = 128: no thread.
    assert_eq!(s.threads_for(b - 500), 0);
    // w2: equal (not increased): probe 500, L = 628; free 500 now runs one thread.
    let t = probe_window(&mut s, r, t, &[1000]);
    assert_eq!(s.snapshot().probe_pages, 500);
    assert_eq!(s.snapshot().low_watermark_free, 628);
    assert_eq!(s.threads_for(b - 500), 1);
    // w3: decreased (800 < 1000): the paper keeps lowering the low watermark -> probe 1000.
    // (The code rule would have reset here.)
    let t = probe_window(&mut s, r, t, &[800]);
    assert_eq!(s.snapshot().probe_pages, 1000);
    assert_eq!(s.snapshot().low_watermark_free, 1128);
    // w4: increased (900 > 800): raised back at once to L = H.
    let t = probe_window(&mut s, r, t, &[900]);
    assert_eq!(s.snapshot().probe_pages, 0);
    assert_eq!(s.snapshot().low_watermark_free, 128);
    assert_eq!(s.threads_for(b - 500), 0);
    // w5: equal again: grows.
    probe_window(&mut s, r, t, &[900]);
    assert_eq!(s.snapshot().probe_pages, 500);

    // The code rule on the w3 feedback (a decrease) resets instead.
    let mut c = ReclaimScheduler::new(b, hermit(), ReclaimParams::default());
    report_s_out(&mut c);
    check_at(&mut c, r, 0);
    let t = probe_window(&mut c, r, 0, &[1000]);
    let t = probe_window(&mut c, r, t, &[1000]);
    assert_eq!(c.snapshot().probe_pages, 500);
    probe_window(&mut c, r, t, &[800]);
    assert_eq!(c.snapshot().probe_pages, 0);
}

#[test]
fn static_pool_starts_all_threads_below_2048_free_and_none_above() {
    let b = 100_000;
    let mut s = ReclaimScheduler::new(b, ReclaimMode::Static(3), quarter_cap());
    assert_eq!(s.pool_size(), 3);
    let snap = s.snapshot();
    assert_eq!(snap.mode, "static:3");
    assert_eq!(snap.low_watermark_free, 2048);
    assert_eq!(snap.max_threads, 3);
    assert_eq!(check_at(&mut s, 50_000, 0).threads, 0);
    assert_eq!(check_at(&mut s, b - 2048, 0).threads, 0);
    let d = check_at(&mut s, b - 2047, 0);
    assert_eq!((d.threads, d.wake), (3, true));
    assert_eq!(check_at(&mut s, b, 0).threads, 3);
    // Feedback changes nothing: high fault rate, known S_out, re-faults.
    report_s_out(&mut s);
    let t = run_windows(&mut s, b - 1000, 0, 16, 2);
    s.on_refault(5);
    // The first window held the 3 checks after the one opening it at t = 0, plus 16: SI 19.
    assert_eq!(s.snapshot().swap_intensity, 19);
    assert_eq!(check_at(&mut s, b - 1000, t).threads, 3);
    assert_eq!(check_at(&mut s, b - 3000, t).threads, 0);
    assert_eq!(s.snapshot().probe_pages, 0);
    // Direct reclaim only at the budget.
    assert!(!s.must_reclaim_directly(b - 1));
    assert!(s.must_reclaim_directly(b));

    // On a small budget the 2048-page threshold is capped at budget / 4: 4000 / 4 = 1000.
    let mut s = ReclaimScheduler::new(4000, ReclaimMode::Static(2), quarter_cap());
    assert_eq!(check_at(&mut s, 3000, 0).threads, 0);
    assert_eq!(check_at(&mut s, 3001, 0).threads, 2);
}

#[test]
fn direct_mode_never_asks_for_threads_and_reclaims_synchronously_over_the_watermark() {
    let b = 100_000;
    let mut s = ReclaimScheduler::new(b, ReclaimMode::Direct, quarter_cap());
    assert_eq!(s.pool_size(), 0);
    report_s_out(&mut s);
    let t = run_windows(&mut s, b, 0, 16, 2);
    for resident in [0, 50_000, b - 2047, b, b + 10] {
        let d = check_at(&mut s, resident, t);
        assert_eq!((d.threads, d.wake), (0, false), "resident {resident}");
    }
    assert_eq!(s.snapshot().low_watermark_free, 2048);
    // Over the low watermark (fewer than 2048 free), every charge reclaims directly.
    assert!(!s.must_reclaim_directly(b - 2048));
    assert!(s.must_reclaim_directly(b - 2047));
    assert!(s.must_reclaim_directly(b));
    assert!(s.must_reclaim_directly(b + 10));
    // Enough to get back to 2048 free: 2048 - 2047 = 1; 2048 - 1000; 2048 + 10 over the budget.
    assert_eq!(s.direct_reclaim_pages(b - 2048), 0);
    assert_eq!(s.direct_reclaim_pages(b - 2047), 1);
    assert_eq!(s.direct_reclaim_pages(b - 1000), 1048);
    assert_eq!(s.direct_reclaim_pages(b + 10), 2058);

    let charges = s.snapshot().charges;
    s.record_direct_reclaim(1);
    s.record_direct_reclaim(1048);
    let snap = s.snapshot();
    assert_eq!(snap.direct_reclaims, 2);
    assert_eq!(snap.direct_reclaimed_pages, 1049);
    assert_eq!(snap.direct_reclaim_ratio, 2.0 / charges as f64);
}

#[test]
fn hermit_reclaims_directly_only_at_the_budget() {
    let b = 1_000_000;
    let (mut s, t) = with_intensity(b, hermit(), ReclaimParams::default(), 4, 500_000);
    // Deep in phase 3, threads run but the faulting thread does not reclaim.
    assert_eq!(check_at(&mut s, b - 1, t).threads, 3);
    assert!(!s.must_reclaim_directly(b - 1));
    assert_eq!(s.direct_reclaim_pages(b - 1), 0);
    // No free slot: last resort, one slot's worth (plus any overflow).
    assert!(s.must_reclaim_directly(b));
    assert_eq!(s.direct_reclaim_pages(b), 1);
    assert_eq!(s.direct_reclaim_pages(b + 5), 6);
    assert_eq!(s.snapshot().direct_reclaims, 0);
    s.record_direct_reclaim(1);
    assert_eq!(s.snapshot().direct_reclaims, 1);
    assert_eq!(s.snapshot().direct_reclaimed_pages, 1);
}

#[test]
fn fast_path_does_nothing_between_checks() {
    let b = 1_000_000;
    let (mut s, t) = with_intensity(b, hermit(), ReclaimParams::default(), 4, 500_000);
    assert_eq!(check_at(&mut s, b, t).threads, 4);
    let before = s.snapshot();
    // 127 charges with nothing resident, far in the future: the target must not move and no
    // rate window may close.
    let later = t + 1000 * MS;
    for _ in 0..CHECK_EVERY - 1 {
        let d = s.on_charge(0, later);
        assert_eq!(
            d,
            Decision {
                threads: 4,
                wake: false,
                checked: false
            }
        );
    }
    let mid = s.snapshot();
    assert_eq!(
        mid,
        ReclaimSnapshot {
            charges: before.charges + CHECK_EVERY - 1,
            ..before.clone()
        }
    );
    // The 128th charge checks: nothing is resident, so no thread.
    let d = s.on_charge(0, later);
    assert_eq!(
        d,
        Decision {
            threads: 0,
            wake: false,
            checked: true
        }
    );
    assert_eq!(s.snapshot().checks, before.checks + 1);

    // A smaller check interval checks more often.
    let params = ReclaimParams {
        check_every: 4,
        ..ReclaimParams::default()
    };
    let mut s = ReclaimScheduler::new(100_000, hermit(), params);
    let checked: Vec<bool> = (0..8).map(|_| s.on_charge(100_000, 0).checked).collect();
    assert_eq!(
        checked,
        [false, false, false, true, false, false, false, true]
    );
}

#[test]
fn mode_strings_parse_and_print() {
    let cases = [
        ("hermit", hermit()),
        ("hermit:paper", paper()),
        ("static:4", ReclaimMode::Static(4)),
        ("direct", ReclaimMode::Direct),
    ];
    for (text, mode) in cases {
        assert_eq!(text.parse::<ReclaimMode>().unwrap(), mode);
        assert_eq!(mode.to_string(), text);
    }
    assert_eq!("hermit:code".parse::<ReclaimMode>().unwrap(), hermit());
    for bad in [
        "",
        "hermit:",
        "hermit:x",
        "static",
        "static:",
        "static:0",
        "static:-1",
        "static:x",
        "linux",
        "Direct",
    ] {
        let e = bad.parse::<ReclaimMode>().unwrap_err();
        assert!(e.to_string().contains("static:N"), "{bad}: {e}");
    }
}

#[test]
fn snapshot_serialises_every_signal() {
    let b = 1_200_000;
    let mut s = ReclaimScheduler::new(b, paper(), ReclaimParams::default());
    report_s_out(&mut s);
    check_at(&mut s, 1_000_000, 0);
    let t = probe_window(&mut s, 1_000_000, 0, &[1000]);
    let t = probe_window(&mut s, 1_000_000, t, &[1000]);
    check_at(&mut s, b - 100, t);
    s.record_direct_reclaim(1);
    let v = serde_json::to_value(s.snapshot()).unwrap();
    // SI 1: H = 128; paper L = 128 + 500.
    assert_eq!(v["mode"], "hermit:paper");
    assert_eq!(v["budget_pages"], b);
    assert_eq!(v["charges"], 4 * 128);
    assert_eq!(v["checks"], 4);
    assert_eq!(v["rates_known"], true);
    assert_eq!(v["s_in_pages_per_s"], 128_000);
    assert_eq!(v["s_out_pages_per_s"], 128_000);
    assert_eq!(v["swap_intensity"], 1);
    assert_eq!(v["max_threads"], 1);
    assert_eq!(v["target_threads"], 1);
    assert_eq!(v["high_watermark_free"], 128);
    assert_eq!(v["high_watermark_pages"], b - 128);
    assert_eq!(v["low_watermark_free"], 628);
    assert_eq!(v["low_watermark_pages"], b - 628);
    assert_eq!(v["probe_pages"], 500);
    assert_eq!(v["turnaround_avg_ns"], 1000);
    assert_eq!(v["refaults"], 2);
    assert_eq!(v["reclaimed_pages"], 128);
    assert_eq!(v["direct_reclaims"], 1);
    assert_eq!(v["direct_reclaimed_pages"], 1);
    assert_eq!(v["direct_reclaim_ratio"], 1.0 / 512.0);
    // Before any re-fault the turnaround is null.
    let v = serde_json::to_value(
        ReclaimScheduler::new(10, hermit(), ReclaimParams::default()).snapshot(),
    )
    .unwrap();
    assert!(v["turnaround_avg_ns"].is_null());
    assert_eq!(v["direct_reclaim_ratio"], 0.0);
}

#[test]
fn small_budgets_cap_every_threshold_at_a_quarter() {
    // budget 4000, the cap at a quarter: 1000. Bootstrap threshold min(2048, 1000) = 1000.
    let b = 4000;
    let mut s = ReclaimScheduler::new(b, hermit(), quarter_cap());
    assert_eq!(s.snapshot().low_watermark_free, 1000);
    assert_eq!(check_at(&mut s, 3000, 0).threads, 0);
    assert_eq!(check_at(&mut s, 3001, 0).threads, 1);
    // The window opened by the first check holds the second one and 16 more: SI = 17,
    // n_max = 16, H = min(128 * 16, 1000) = 1000, L = min(16 * 1000, 1000) = 1000.
    report_s_out(&mut s);
    let t = run_windows(&mut s, 0, 0, 16, 1);
    let snap = s.snapshot();
    assert_eq!(snap.swap_intensity, 17);
    assert_eq!(snap.high_watermark_free, 1000);
    assert_eq!(snap.low_watermark_free, 1000);
    // Proportional over the shortened H: 16 * (1000 - 500) / 1000 = 8; 16 at the budget.
    assert_eq!(check_at(&mut s, 3000, t).threads, 1);
    assert_eq!(check_at(&mut s, 3500, t).threads, 8);
    assert_eq!(check_at(&mut s, 4000, t).threads, 16);
    // The probe is capped too (gamma 1: the step is the whole resident count).
    let params = ReclaimParams {
        gamma: 1,
        ..quarter_cap()
    };
    let mut s = ReclaimScheduler::new(b, paper(), params);
    report_s_out(&mut s);
    check_at(&mut s, 3000, 0);
    let t = probe_window(&mut s, 3000, 0, &[1]);
    probe_window(&mut s, 3000, t, &[1]);
    assert_eq!(s.snapshot().probe_pages, 1000);
    assert_eq!(s.snapshot().low_watermark_free, 1000);
    // Under GAMMA resident pages, resident / 2000 = 0: the step is floored at one page.
    let mut s = ReclaimScheduler::new(1000, paper(), quarter_cap());
    report_s_out(&mut s);
    check_at(&mut s, 900, 0);
    let t = probe_window(&mut s, 900, 0, &[1]);
    let t = probe_window(&mut s, 900, t, &[1]);
    assert_eq!(s.snapshot().probe_pages, 1);
    probe_window(&mut s, 900, t, &[1]);
    assert_eq!(s.snapshot().probe_pages, 2);
    // Without a cap (divisor 1) the bootstrap threshold is the published 2048 pages.
    let params = ReclaimParams {
        headroom_cap_divisor: 1,
        ..ReclaimParams::default()
    };
    let s = ReclaimScheduler::new(b, hermit(), params);
    assert_eq!(s.snapshot().low_watermark_free, 2048);
}

#[test]
fn the_default_cap_keeps_a_174_mib_budget_within_696_free_pages() {
    // 174 MiB (memcached at half its footprint): 44,544 pages, cap 44,544 / 64 = 696, where
    // the published bootstrap threshold (2,048 pages) kept 4.6% of the budget free.
    let mut s = ReclaimScheduler::new(44_544, hermit(), ReclaimParams::default());
    assert_eq!(HEADROOM_CAP_DIVISOR, 64);
    assert_eq!(s.snapshot().low_watermark_free, 696);
    assert_eq!(check_at(&mut s, 44_544 - 696, 0).threads, 0);
    assert_eq!(check_at(&mut s, 44_544 - 695, 0).threads, 1);
    // A GiB budget (262,144 pages) keeps the published threshold whole.
    let s = ReclaimScheduler::new(262_144, hermit(), ReclaimParams::default());
    assert_eq!(s.snapshot().low_watermark_free, 2_048);
    // Small budgets keep at least 512 pages or a quarter: 16 MiB, 4,000 pages, 100 pages.
    for (budget, cap) in [(4_096, 512), (4_000, 512), (100, 25)] {
        let s = ReclaimScheduler::new(budget, hermit(), ReclaimParams::default());
        assert_eq!(s.snapshot().low_watermark_free, cap, "budget {budget}");
        assert_eq!(headroom_cap(budget, HEADROOM_CAP_DIVISOR), cap);
    }
    assert_eq!(headroom_cap(44_544, 4), 11_136);
    assert_eq!(MIN_HEADROOM_CAP, 512);
}

#[test]
fn zero_rates_do_not_divide_by_zero() {
    let b = 1_000_000;
    let mut s = ReclaimScheduler::new(b, hermit(), ReclaimParams::default());
    // Batches with no pages or no time.
    s.on_reclaimed(0, 0, 0);
    s.on_reclaimed(0, 100, 0);
    assert_eq!(s.snapshot().s_out_pages_per_s, 0);
    s.on_refaults(0, 0);
    assert_eq!(s.snapshot().refaults, 0);
    // 128 charges over ~9.2e18 ns: S_in = 0 pages/s, known.
    check_at(&mut s, 0, 0);
    check_at(&mut s, 0, u64::MAX / 2);
    assert_eq!(s.snapshot().s_in_pages_per_s, 0);
    assert!(!s.snapshot().rates_known, "S_out is still unknown");
    // Time is reported later: S_out = 100 pages / 1 ms = 100,000 pages/s.
    s.on_reclaimed(0, 0, MS);
    assert_eq!(s.snapshot().s_out_pages_per_s, 100_000);
    // SI = 0 / 100,000 = 0, floored to 1: H = 128, L = 2048.
    check_at(&mut s, 0, u64::MAX / 2);
    let snap = s.snapshot();
    assert!(snap.rates_known);
    assert_eq!(snap.swap_intensity, 0);
    assert_eq!(snap.max_threads, 1);
    assert_eq!(
        (snap.high_watermark_free, snap.low_watermark_free),
        (128, 2048)
    );

    // The literal pseudo-code (no floor): SI = 0 gives H = L = 0, one thread only when full.
    let params = ReclaimParams {
        min_intensity: 0,
        ..ReclaimParams::default()
    };
    let mut s = ReclaimScheduler::new(b, hermit(), params);
    report_s_out(&mut s);
    check_at(&mut s, 0, 0);
    check_at(&mut s, 0, u64::MAX / 2);
    let snap = s.snapshot();
    assert_eq!((snap.high_watermark_free, snap.low_watermark_free), (0, 0));
    assert_eq!(check_at(&mut s, b - 1, u64::MAX / 2).threads, 0);
    assert_eq!(check_at(&mut s, b, u64::MAX / 2).threads, 1);
    assert_eq!(check_at(&mut s, b + 1, u64::MAX / 2).threads, 1);

    // Zero-valued parameters are normalised instead of dividing by zero.
    let params = ReclaimParams {
        check_every: 0,
        rate_window_ns: 0,
        gamma: 0,
        max_reclaimers: 0,
        headroom_cap_divisor: 0,
        alpha: 0,
        beta: 0,
        ..ReclaimParams::default()
    };
    let mut s = ReclaimScheduler::new(0, hermit(), params);
    assert_eq!(s.params().check_every, 1);
    assert_eq!(s.params().max_reclaimers, 1);
    report_s_out(&mut s);
    for i in 0..10 {
        s.on_refault(i);
        let d = s.on_charge(i, i);
        assert!(d.checked);
        assert!(d.threads <= 1);
    }
    assert!(s.snapshot().rates_known);
}

#[test]
fn huge_values_saturate_without_panicking() {
    // Huge S_in against a tiny S_out: SI = 128e9, n_max capped at 16.
    let params = ReclaimParams {
        rate_window_ns: 1,
        ..ReclaimParams::default()
    };
    let b = 1_000_000;
    let mut s = ReclaimScheduler::new(b, hermit(), params);
    s.on_reclaimed(0, 1, 1_000_000_000); // 1 page/s
    check_at(&mut s, 0, 0);
    check_at(&mut s, 0, 1); // 128 pages in 1 ns = 128e9 pages/s
    let snap = s.snapshot();
    assert_eq!(snap.s_in_pages_per_s, 128_000_000_000);
    assert_eq!(snap.swap_intensity, 128_000_000_000);
    assert_eq!(snap.max_threads, 16);
    assert_eq!(snap.high_watermark_free, 2048);
    assert_eq!(check_at(&mut s, b, 1).threads, 16);

    // Everything at u64::MAX.
    let params = ReclaimParams {
        alpha: u64::MAX,
        beta: u64::MAX,
        check_every: 1,
        rate_window_ns: 1,
        max_reclaimers: usize::MAX,
        bootstrap_free: u64::MAX,
        static_start_free: u64::MAX,
        min_intensity: u64::MAX,
        headroom_cap_divisor: 1,
        gamma: 1,
        s_in_estimate: RateEstimate::RunningMax,
    };
    for mode in [
        hermit(),
        paper(),
        ReclaimMode::Static(usize::MAX),
        ReclaimMode::Direct,
    ] {
        let mut s = ReclaimScheduler::new(u64::MAX, mode, params);
        s.on_reclaimed(0, u64::MAX, 1);
        s.on_reclaimed(0, u64::MAX, 1);
        s.on_reclaimed(7, u64::MAX, u64::MAX);
        assert_eq!(s.snapshot().s_out_pages_per_s, u64::MAX);
        for _ in 0..3 {
            s.on_refault(u64::MAX);
            s.on_refaults(u64::MAX, u64::MAX);
        }
        for now in [0, 1, u64::MAX, u64::MAX, 0, 5, u64::MAX] {
            for resident in [0, u64::MAX - 1, u64::MAX] {
                let d = s.on_charge(resident, now);
                assert!(d.threads <= s.pool_size());
                s.record_direct_reclaim(u64::MAX);
            }
            let snap = s.snapshot();
            assert!(snap.low_watermark_pages <= snap.high_watermark_pages);
            assert!(snap.high_watermark_pages <= snap.budget_pages);
        }
        let _ = s.direct_reclaim_pages(u64::MAX);
        let v = serde_json::to_value(s.snapshot()).unwrap();
        assert_eq!(v["direct_reclaimed_pages"], u64::MAX);
    }
}

/// A deterministic pseudo-random script: whatever the feedback, the decisions stay within the
/// pool, the low watermark never sits above the high one, and the ramp is monotone.
#[test]
fn invariants_hold_under_random_feedback() {
    let mut rng = gleaner_sys::rng::XorShift64::from_state(0x9E37_79B9_7F4A_7C15);
    let mut next = move || rng.next_u64();
    for mode in [
        hermit(),
        paper(),
        ReclaimMode::Static(3),
        ReclaimMode::Direct,
    ] {
        for budget in [100u64, 5000, 1_000_000] {
            let params = ReclaimParams {
                max_reclaimers: 4,
                ..ReclaimParams::default()
            };
            let mut s = ReclaimScheduler::new(budget, mode, params);
            let mut now = 0u64;
            for _ in 0..20_000 {
                now += next() % 20_000;
                let resident = next() % (budget + budget / 8 + 1);
                match next() % 16 {
                    0 => s.on_reclaimed((next() % 4) as usize, next() % 64, next() % 2_000_000),
                    1 => s.on_refault(next() % 10_000_000),
                    _ => {}
                }
                let d = s.on_charge(resident, now);
                assert!(d.threads <= s.pool_size());
                assert_eq!(d.wake, d.checked && d.threads > 0);
                if mode == ReclaimMode::Direct {
                    assert_eq!(d.threads, 0);
                }
            }
            let snap = s.snapshot();
            assert!(snap.low_watermark_pages <= snap.high_watermark_pages);
            assert!(snap.high_watermark_free <= budget / 4);
            assert!(snap.low_watermark_free <= budget / 4);
            let mut last = 0;
            for resident in 0..=budget + 2 {
                let n = s.threads_for(resident);
                assert!(n >= last, "{mode}: ramp not monotone at {resident}");
                last = n;
            }
        }
    }
}

#[test]
fn a_grown_budget_moves_the_watermarks_and_lifts_the_headroom_cap() {
    // Budget 4,000, the headroom cap at a quarter (1,000): it bites the bootstrap 2,048.
    let mut s = ReclaimScheduler::new(4_000, hermit(), quarter_cap());
    assert_eq!(s.snapshot().low_watermark_free, 1_000);
    assert_eq!(
        check_at(&mut s, 3_500, 0).threads,
        1,
        "500 free, under 1,000"
    );
    // Grown to 100,000 (a fork child that took over its parent's budget): the bootstrap
    // threshold applies whole, against the new budget.
    s.set_budget(100_000);
    let snap = s.snapshot();
    assert_eq!(snap.budget_pages, 100_000);
    assert_eq!(snap.low_watermark_free, 2_048);
    assert_eq!(snap.low_watermark_pages, 97_952);
    assert_eq!(s.threads_for(3_500), 0, "96,500 free: nothing to reclaim");
    assert_eq!(s.threads_for(98_000), 1, "2,000 free");
}
