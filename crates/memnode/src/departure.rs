//! When a reply held for the emulated link leaves (`--bandwidth`, `sched.rs`).
//!
//! A transfer holds its lane for `bytes / rate`, and its reply (or, for a write-back, its
//! acknowledgement) leaves when those bytes are through: the connection thread sleeps until then.
//! On the 2-vCPU test VM a timed sleep ends tens of microseconds after the time asked for (the
//! timer and the wake-up go through the hypervisor; `bench/results/link-departures/README.md`), so
//! sleeping until the due time would add that to every reply, as if the link were slower per
//! request than its rate: a 4 KiB page on a 32 MB/s link is due after 128 µs and left a sizeable
//! fraction later. So a sleep is cut short by how late sleeps have been ending (a moving average),
//! and replies leave when they are due on average. A reply due sooner than that lateness can only
//! leave at once (early) or sleep (late): it does whichever keeps the running sum of departure
//! errors nearer zero.
//!
//! What this moves is only when replies leave: the lane's account of when it is free (`free_at`
//! in `sched.rs`) is exact whatever the sleeps do, so the link never carries more than its rate.
//! Connection threads share one [`Departures`] per link; their updates race (a plain load and
//! store), which can lose a sample now and then and never more.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The shortest sleep asked for (a zero-length sleep may not sleep at all).
const MIN_SLEEP: Duration = Duration::from_micros(1);
/// How far the running sum of departure errors may go either way, ns.
const MAX_DEBT_NS: i64 = 1_000_000;
/// The most one sleep's lateness counts in the moving average, ns: one preemption must not
/// make replies leave a whole page early for long.
const MAX_LATENESS_NS: u64 = 100_000;
/// The moving average's weight: about the last 16 sleeps.
const AVERAGE_OVER: u64 = 16;

/// The timing state, as one thread sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Timing {
    /// How late sleeps have been ending (moving average), ns.
    late_ns: u64,
    /// The running sum of departure errors, ns (positive: late), bounded by [`MAX_DEBT_NS`].
    debt_ns: i64,
}

/// What a reply due in some time does.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Plan {
    /// Leave now.
    Leave,
    /// Sleep this long, then leave.
    Sleep(Duration),
}

impl Timing {
    /// The plan for a reply due in `left_ns`.
    fn plan(&self, left_ns: u64) -> Plan {
        if left_ns == 0 {
            Plan::Leave
        } else if left_ns > self.late_ns {
            Plan::Sleep(Duration::from_nanos(left_ns - self.late_ns))
        } else {
            // Leaving now is `left` early; the shortest sleep about `late - left` late.
            let early = self.debt_ns - left_ns as i64;
            let late = self.debt_ns + self.late_ns as i64 - left_ns as i64;
            if early.abs() <= late.abs() {
                Plan::Leave
            } else {
                Plan::Sleep(Duration::ZERO)
            }
        }
    }

    /// Notes how a reply left: `error_ns` after its due time (negative: before), and, if it
    /// slept, how long after the asked time its sleep ended.
    fn record(&mut self, error_ns: i64, slept_late_ns: Option<u64>) {
        if let Some(l) = slept_late_ns {
            self.late_ns =
                (self.late_ns * (AVERAGE_OVER - 1) + l.min(MAX_LATENESS_NS)) / AVERAGE_OVER;
        }
        self.debt_ns = (self.debt_ns + error_ns).clamp(-MAX_DEBT_NS, MAX_DEBT_NS);
    }
}

/// The departures of one link's replies (shared by its connection threads).
#[derive(Debug, Default)]
pub(crate) struct Departures {
    late_ns: AtomicU64,
    debt_ns: AtomicI64,
    /// Replies held, and the sum of their departure errors (ns), for the stats.
    held: AtomicU64,
    error_sum_ns: AtomicI64,
    /// Replies that left at once, ahead of their due time.
    left_at_once: AtomicU64,
    /// Replies already due when their thread got to them (after a wait for the lane).
    already_due: AtomicU64,
}

/// How the link's replies left, for the stats.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DepartureStats {
    /// Replies held until their bytes were through.
    pub replies_held: u64,
    /// Their mean departure error, µs (positive: after their due time): near zero when the
    /// emulation holds replies as long as the link's rate says.
    pub mean_error_us: f64,
    /// How late a timed sleep has been ending lately, µs (which the sleeps are cut short by).
    pub sleep_lateness_us: f64,
    /// Replies due sooner than that lateness that left at once.
    pub left_at_once: u64,
    /// Replies already due when their thread got to them, after waiting for the lane (not
    /// held, and not in the mean).
    #[serde(default)]
    pub already_due: u64,
}

impl Departures {
    /// Holds the calling thread until about `done` (see the module's doc).
    pub(crate) fn hold_until(&self, done: Instant) {
        let mut t = Timing {
            late_ns: self.late_ns.load(Ordering::Relaxed),
            debt_ns: self.debt_ns.load(Ordering::Relaxed),
        };
        let now = Instant::now();
        let left_ns = done.saturating_duration_since(now).as_nanos() as u64;
        if left_ns == 0 {
            self.already_due.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let (error_ns, slept_late_ns) = match t.plan(left_ns) {
            Plan::Leave => {
                self.left_at_once.fetch_add(1, Ordering::Relaxed);
                (-(left_ns as i64), None)
            }
            Plan::Sleep(d) => {
                std::thread::sleep(d.max(MIN_SLEEP));
                let woke = Instant::now();
                let asked = now + d;
                let error = if woke >= done {
                    (woke - done).as_nanos() as i64
                } else {
                    -((done - woke).as_nanos() as i64)
                };
                (
                    error,
                    Some(woke.saturating_duration_since(asked).as_nanos() as u64),
                )
            }
        };
        t.record(error_ns, slept_late_ns);
        self.late_ns.store(t.late_ns, Ordering::Relaxed);
        self.debt_ns.store(t.debt_ns, Ordering::Relaxed);
        self.held.fetch_add(1, Ordering::Relaxed);
        self.error_sum_ns.fetch_add(error_ns, Ordering::Relaxed);
    }

    /// The stats so far.
    pub(crate) fn stats(&self) -> DepartureStats {
        let held = self.held.load(Ordering::Relaxed);
        let sum = self.error_sum_ns.load(Ordering::Relaxed);
        DepartureStats {
            replies_held: held,
            mean_error_us: if held == 0 {
                0.0
            } else {
                sum as f64 / held as f64 / 1000.0
            },
            sleep_lateness_us: self.late_ns.load(Ordering::Relaxed) as f64 / 1000.0,
            left_at_once: self.left_at_once.load(Ordering::Relaxed),
            already_due: self.already_due.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1000;

    #[test]
    fn a_reply_due_later_than_the_lateness_sleeps_that_much_less() {
        let t = Timing {
            late_ns: 25 * US,
            debt_ns: 0,
        };
        assert_eq!(t.plan(128 * US), Plan::Sleep(Duration::from_micros(103)));
        assert_eq!(t.plan(0), Plan::Leave);
        // Due sooner than the lateness: leaving now (10 µs early) beats sleeping (15 µs late)...
        assert_eq!(t.plan(10 * US), Plan::Leave);
        // ...and sleeping (5 µs late) beats leaving now (20 µs early).
        assert_eq!(t.plan(20 * US), Plan::Sleep(Duration::ZERO));
        // Replies that left early lately tip the choice to sleeping.
        let behind = Timing {
            debt_ns: -30 * (US as i64),
            ..t
        };
        assert_eq!(behind.plan(10 * US), Plan::Sleep(Duration::ZERO));
    }

    /// Against a sleeper whose sleeps end 25-35 µs late, replies due 1-200 µs ahead leave on
    /// time on average once the lateness is learnt, where sleeping until the due time would
    /// make them 30 µs late on average.
    #[test]
    fn replies_leave_on_time_on_average_against_a_sleeper_that_wakes_late() {
        let mut t = Timing::default();
        let (mut sum, mut naive, mut n) = (0i64, 0i64, 0i64);
        for i in 0..5000u64 {
            let left = (1 + (i * 7919) % 200) * US;
            let lateness = (25 + (i * 31) % 11) * US;
            let (error, slept) = match t.plan(left) {
                Plan::Leave => (-(left as i64), None),
                Plan::Sleep(d) => {
                    let woke = d.as_nanos() as u64 + lateness;
                    (woke as i64 - left as i64, Some(lateness))
                }
            };
            t.record(error, slept);
            if i >= 1000 {
                sum += error;
                naive += lateness as i64;
                n += 1;
            }
        }
        let mean_us = sum as f64 / n as f64 / US as f64;
        let naive_us = naive as f64 / n as f64 / US as f64;
        assert!(mean_us.abs() < 3.0, "mean departure error {mean_us:.1} µs");
        assert!(
            naive_us > 25.0,
            "the uncompensated error would be {naive_us:.1} µs"
        );
        assert!((25 * US..=35 * US).contains(&t.late_ns), "{t:?}");
    }

    #[test]
    fn the_lateness_learnt_is_bounded_and_so_is_the_debt() {
        let mut t = Timing::default();
        for _ in 0..1000 {
            t.record(10_000_000, Some(10_000_000));
        }
        assert!(t.late_ns <= MAX_LATENESS_NS);
        assert_eq!(t.debt_ns, MAX_DEBT_NS);
    }
}
