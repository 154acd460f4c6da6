//! The live counters the fault, eviction and prefetch paths bump, and the remote-fault latency
//! histogram: what `observe/stats.rs` reports from.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Live counters, updated with relaxed atomics from handler and evictor threads.
#[derive(Default)]
pub(crate) struct RegionCounters {
    pub zero_fills: AtomicU64,
    pub zero_filled_ahead: AtomicU64,
    pub remote_faults: AtomicU64,
    pub duplicate_faults: AtomicU64,
    pub wp_faults: AtomicU64,
    pub waited_on_eviction: AtomicU64,
    pub waited_on_budget: AtomicU64,
    pub evicted_clean: AtomicU64,
    pub evicted_dirty: AtomicU64,
    pub evict_batches: AtomicU64,
    /// Runs of consecutive pages in the batches (each costs the drop its own TLB flush).
    pub evict_runs: AtomicU64,
    pub evict_aborted: AtomicU64,
    /// Victims seen unwritten by the scan but written before the drop (asynchronous tracking).
    pub evict_raced: AtomicU64,
    /// Victims a fault waited for, handed back by their batch from what it captured.
    pub evict_handed_back: AtomicU64,
    /// Runs of victims scanned with `PAGEMAP_SCAN`.
    pub evict_scanned_runs: AtomicU64,
    /// Resident pages found dropped behind the pager's back (evicted or touched).
    pub dropped_behind_back: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub evict_protect_ns: AtomicU64,
    pub evict_read_ns: AtomicU64,
    pub evict_send_ns: AtomicU64,
    pub evict_drop_ns: AtomicU64,
    pub discarded: AtomicU64,
    /// Pages of freed blocks the allocator took back for new ones ([`crate::Region::reuse`]).
    pub reused: AtomicU64,
    /// Of those, pages held only far, discarded rather than fetched.
    pub reused_far: AtomicU64,
    pub surrendered: AtomicU64,
    pub prefetch_hit_faults: AtomicU64,
    /// Remote faults whose steps were timed (one in [`crate::fault::resolve::TIMED_INSTALL_EVERY`]), and
    /// the time each step took in all.
    pub timed_faults: AtomicU64,
    pub lookup_ns: AtomicU64,
    /// Handler wake-ups that found no message.
    pub handler_empty_wakeups: AtomicU64,
    pub fetch_ns: AtomicU64,
    /// Of those, the faults whose install was timed too (all of them), and its time in all.
    pub timed_installs: AtomicU64,
    pub install_ns: AtomicU64,
    /// Handler wake-ups with at least one message, and the messages they read.
    pub handler_wakeups: AtomicU64,
    pub handler_messages: AtomicU64,
}

impl RegionCounters {
    pub(crate) fn add(counter: &AtomicU64, v: u64) {
        counter.fetch_add(v, Ordering::Relaxed);
    }

    /// Adds one to `counter`; returns whether it was the first.
    pub(crate) fn add_first(counter: &AtomicU64) -> bool {
        counter.fetch_add(1, Ordering::Relaxed) == 0
    }

    /// Where remote faults' time went, from the counters; handlers block in `read` or not.
    pub(crate) fn breakdown(&self, blocking_reads: bool) -> FaultBreakdown {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let n = get(&self.timed_faults);
        let mean_us = |ns: u64| {
            if n == 0 {
                0.0
            } else {
                ns as f64 / n as f64 / 1000.0
            }
        };
        let wakeups = get(&self.handler_wakeups);
        let installs = get(&self.timed_installs);
        FaultBreakdown {
            timed_faults: n,
            lookup_mean_us: mean_us(get(&self.lookup_ns)),
            fetch_mean_us: mean_us(get(&self.fetch_ns)),
            timed_installs: installs,
            install_mean_us: if installs == 0 {
                0.0
            } else {
                get(&self.install_ns) as f64 / installs as f64 / 1000.0
            },
            handler_wakeups: wakeups,
            handler_empty_wakeups: get(&self.handler_empty_wakeups),
            messages_per_wakeup: if wakeups == 0 {
                0.0
            } else {
                get(&self.handler_messages) as f64 / wakeups as f64
            },
            handlers_wait_in: if blocking_reads { "read" } else { "poll" },
        }
    }
}

/// Where a remote fault's time goes inside the handler, on average. The wait before it (from
/// the fault to the handler reading its message) is not visible from inside the process, since
/// the kernel does not timestamp fault messages: `gleaner bench micro` reports it as the fault
/// time the program saw minus this service time.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct FaultBreakdown {
    /// Remote faults timed: one in 8 (reading the clock at each step of every fault cost a
    /// handler a measurable share of each fault: `bench/results/sampled-timing/README.md`). The
    /// means below are over these.
    pub timed_faults: u64,
    /// Claiming the page, finding its data and charging the budget, µs.
    pub lookup_mean_us: f64,
    /// Getting the data: a copy's source in shared memory (nearly nothing), or the round trip
    /// to the memnode over a socket, µs.
    pub fetch_mean_us: f64,
    /// Remote faults whose install was timed: the timed faults, whose thread is woken by a
    /// system call of its own after the clock is read, since a thread woken on its handler's CPU
    /// may run at once in the handler's place, and the clock read after a waking install then
    /// counts its run.
    pub timed_installs: u64,
    /// `UFFDIO_COPY` of the page until it is mapped, µs, over the timed installs: the thread's
    /// wake-up and the page's publication (after the wake) are not in it.
    pub install_mean_us: f64,
    /// Handler wake-ups that found messages.
    pub handler_wakeups: u64,
    /// Handler wake-ups that found no message (another handler read it first). A lower bound:
    /// a handler woken after another took the message usually goes back to sleep inside
    /// `poll` without returning, which only a scheduler trace sees; a handler blocked in `read`
    /// always does (this then counts only reads a signal ended).
    pub handler_empty_wakeups: u64,
    /// Fault messages read per such wake-up.
    pub messages_per_wakeup: f64,
    /// Where handlers wait for fault messages: `read` (a blocking userfaultfd, one system call
    /// a fault) or `poll` (then a read: kernels that cannot tell one read not to block).
    pub handlers_wait_in: &'static str,
}

/// A latency histogram in nanoseconds (1 µs .. 60 s, 3 significant digits), made at its first
/// sample: each takes 136 KiB of zeroed counts, which a short-lived process (a shell's fork
/// child, `/bin/true`) would pay for at start and never use.
#[derive(Default)]
pub(crate) struct LatencyHistogram(Mutex<Option<Histogram<u64>>>);

impl LatencyHistogram {
    pub(crate) fn record(&self, d: Duration) {
        let ns = (d.as_nanos() as u64).clamp(1_000, 60_000_000_000);
        self.0
            .lock()
            .expect("histogram lock")
            .get_or_insert_with(|| {
                Histogram::new_with_bounds(1_000, 60_000_000_000, 3).expect("valid bounds")
            })
            .saturating_record(ns);
    }

    pub(crate) fn summary(&self) -> LatencySummary {
        let h = self.0.lock().expect("histogram lock");
        h.as_ref().map(LatencySummary::of).unwrap_or_default()
    }

    /// The `q` quantile in microseconds, or None without samples.
    pub(crate) fn quantile_us(&self, q: f64) -> Option<f64> {
        let h = self.0.lock().expect("histogram lock");
        h.as_ref()
            .filter(|h| !h.is_empty())
            .map(|h| h.value_at_quantile(q) as f64 / 1000.0)
    }

    pub(crate) fn reset(&self) {
        if let Some(h) = self.0.lock().expect("histogram lock").as_mut() {
            h.reset();
        }
    }
}

/// Percentiles of a latency distribution, in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct LatencySummary {
    /// Number of samples.
    pub count: u64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest sample.
    pub max_us: f64,
    /// Mean.
    pub mean_us: f64,
}

impl LatencySummary {
    /// Summarises a nanosecond histogram.
    pub fn of(h: &Histogram<u64>) -> LatencySummary {
        if h.is_empty() {
            return LatencySummary::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        LatencySummary {
            count: h.len(),
            p50_us: us(h.value_at_quantile(0.50)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
            mean_us: h.mean() / 1000.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_latency_histogram_is_made_at_its_first_sample_and_summarises_like_one() {
        let h = LatencyHistogram::default();
        assert!(h.0.lock().unwrap().is_none(), "no counts before a sample");
        assert_eq!(h.summary(), LatencySummary::default());
        assert_eq!(h.quantile_us(0.5), None);
        h.reset();
        assert!(h.0.lock().unwrap().is_none(), "a reset makes none either");
        for us in [10, 20, 30, 40, 1000] {
            h.record(Duration::from_micros(us));
        }
        let s = h.summary();
        assert_eq!(s.count, 5);
        // Within the histogram's resolution (a bucket's highest value is reported).
        let near = |got: f64, want: f64| (got - want).abs() <= want / 100.0;
        assert!(near(s.p50_us, 30.0), "{s:?}");
        assert!(near(s.max_us, 1000.0), "{s:?}");
        assert!(near(h.quantile_us(0.99).unwrap(), 1000.0));
        h.reset();
        assert_eq!(h.summary().count, 0);
        assert_eq!(h.quantile_us(0.5), None);
    }
}
