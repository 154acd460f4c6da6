//! Hermit's feedback-directed reclaim scheduler (Hermit, NSDI 2023, its reclaim scheduler, and the public code's probe of the low watermark), with the
//! static "Hermit\*" / Fastswap ablation (§1.3, §8.3) and a Linux-like direct-reclaim ablation
//! (§8.1).
//!
//! The scheduler is pure: no threads, no clock, no system call. The engine calls
//! [`ReclaimScheduler::on_charge`] inline wherever a page is charged to the local budget (every
//! fault-in or first touch), passing the resident page count and a timestamp; every
//! [`CHECK_EVERY`] charges the scheduler re-reads its feedback and answers how many reclaim threads
//! should run. There is no thread spinning to watch memory: this is Hermit's *decentralised*
//! scheduler, "inlined in the budget-charge step of every swap-in" (§1.3).
//!
//! # Feedback signals (Hermit, NSDI 2023, feedback signals)
//!
//! * **S_in**, the fault-in rate (pages/s): charges counted over windows of at least
//!   [`RATE_WINDOW_NS`]; by default the running maximum over windows, like the public code.
//! * **S_out**, the per-thread reclaim rate (pages/s): the running average over the batches of
//!   reclaim thread 0, reported through [`ReclaimScheduler::on_reclaimed`] (public code).
//! * **Swap intensity** `SI = floor(S_in / S_out)`: how many reclaim threads are needed to keep
//!   up with the faults.
//! * **Average page turnaround (APT)**: time from a page's eviction to its next fault, reported
//!   through [`ReclaimScheduler::on_refault`] and averaged per rate window.
//!
//! # Watermarks and the thread ramp (Hermit, NSDI 2023, its reclaim scheduler)
//!
//! Watermarks are kept as *free pages* (`free = budget - resident`), like the pseudo-code:
//!
//! ```text
//! n_max  = clamp(SI, min_intensity, max_reclaimers)    # threads at the budget
//! H_free = ALPHA * n_max                                # high watermark: resident = budget - ALPHA*SI
//! L_free = max(BETA * H_free, probe)                    # low watermark (public code's probe rule)
//! free >  L_free          -> 0 threads                  # phase 1: enough memory
//! L_free >= free >= H_free -> 1 thread                  # phase 2: light pressure
//! free <  H_free          -> n_max * (H_free - free) / H_free, clamped to [1, n_max]
//!                                                       # phase 3: RED-style proportional ramp
//! ```
//!
//! Phase 3 is the pseudo-code's `(H_free - free) / ALPHA` written proportionally: the two are equal
//! whenever `H_free = ALPHA * n_max`, and the proportional form still reaches `n_max` at the budget
//! when the headroom cap (below) shortens `H_free` on a small budget.
//!
//! # gleaner adaptations (each documented where it is implemented)
//!
//! * `n_max` has a floor, [`MIN_INTENSITY`] = 1, once the rates are known: with the literal
//!   `n_max = min(MAX, SI)`, an application that faults more slowly than one thread reclaims has
//!   `SI = 0`, hence `H_free = L_free = 0`, and reclaim would only start once the budget is already
//!   full. With the floor, the headroom right after the bootstrap (`BETA * ALPHA * 1 = 2048`
//!   pages) equals the bootstrap threshold ([`BOOTSTRAP_FREE`]). Set it to 0 for the literal rule.
//! * Every free-page threshold is capped at `budget / headroom_cap_divisor` (default
//!   [`HEADROOM_CAP_DIVISOR`] = 64), but never below the smaller of a quarter of the budget and
//!   [`MIN_HEADROOM_CAP`] pages ([`headroom_cap`]): the published constants assume budgets of
//!   gigabytes, where 2048 pages are under 1%; on a budget of 174 MiB they kept 4.6% of it free,
//!   memory Linux in a cgroup (which reclaims at its limit) gives the program. Each free page is
//!   a page of the program's working set paged out: memcached at 50% local memory took 5% fewer
//!   far faults per request with the cap at 1/64 than at 1/4, with throughput, `bench micro` and
//!   the demo job unchanged or better (`bench/results/access-scan/two-lists/README.md`). The
//!   floor keeps small budgets where they were: with a headroom of a page or two, the fault
//!   handlers would reclaim nearly every fault themselves instead of a reclaim thread ahead of
//!   them.
//! * The probe step `resident / GAMMA` is at least one page, so the probe moves on budgets under
//!   [`GAMMA`] pages.
//!
//! # Example
//!
//! ```
//! use gleaner_policy::reclaim::{ReclaimMode, ReclaimParams, ReclaimScheduler};
//!
//! let mode: ReclaimMode = "hermit".parse().unwrap();
//! let params = ReclaimParams { max_reclaimers: 4, ..ReclaimParams::default() };
//! let mut s = ReclaimScheduler::new(100_000, mode, params);
//! // Before both rates are known: one thread once fewer than 2048 pages are free.
//! let mut last = None;
//! for i in 0..128u64 {
//!     last = Some(s.on_charge(99_000, i * 1_000));
//! }
//! assert_eq!(last.unwrap().threads, 1);
//! assert_eq!(s.snapshot().target_threads, 1);
//! ```

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// Pages of high-watermark headroom per unit of swap intensity: the high watermark is
/// `budget - ALPHA * SI`. Published value (Hermit, NSDI 2023, §4.2: "α = 128 works well in
/// practice"); Hermit, NSDI 2023, its reclaim scheduler.
pub const ALPHA: u64 = 128;

/// The scheduler re-reads its counters every this many charges; the charges in between take the
/// fast path. Published value (Hermit §4.2); Hermit, NSDI 2023, its reclaim scheduler.
pub const CHECK_EVERY: u64 = 128;

/// Minimum length of a fault-in rate window, in nanoseconds (1 ms). The low-watermark probe also
/// runs once per window. From the public code; Hermit, NSDI 2023, its reclaim scheduler.
pub const RATE_WINDOW_NS: u64 = 1_000_000;

/// Maximum number of reclaim threads. From the public code; Hermit, NSDI 2023, its reclaim scheduler. The engine passes
/// a smaller cap in [`ReclaimParams::max_reclaimers`] on small machines.
pub const MAX_RECLAIMERS: usize = 16;

/// The public code's low watermark, as free pages, is at least `BETA * H_free`. From the public
/// code; Hermit's scheduler and the public code's watermark probe.
pub const BETA: u64 = 16;

/// The low-watermark probe grows by `resident / GAMMA` pages per window in which the turnaround
/// did not move the wrong way. From the public code; Hermit's public code, its probe of the low watermark.
pub const GAMMA: u64 = 2000;

/// Until both rates are known, the public code runs one thread when fewer than this many pages
/// (8 MiB) are free, and none otherwise. Hermit's scheduler, the last line of its pseudo-code.
pub const BOOTSTRAP_FREE: u64 = 2048;

/// The static ablation starts all its threads when fewer than this many pages (8 MiB) are free:
/// Fastswap's `MAX_RECLAIM_OFFLOAD` and the public code's `reclaim_mode` 1. Hermit, NSDI 2023, its reclaim scheduler
/// ("Static ablation") and §8.3. The direct ablation uses the same threshold as its low watermark,
/// so the two ablations differ only in who reclaims.
pub const STATIC_START_FREE: u64 = 2048;

/// gleaner's floor on the swap intensity used for `n_max` and `H_free` once both rates are known
/// (the raw `floor(S_in / S_out)` is still reported). Not from the paper: see the module
/// documentation ("gleaner adaptations").
pub const MIN_INTENSITY: u64 = 1;

/// gleaner's cap on every free-page threshold: at most `budget / HEADROOM_CAP_DIVISOR` pages
/// (1.6% of the budget), within [`headroom_cap`]'s floor. Not from the paper: see the module
/// documentation ("gleaner adaptations"). It was 4 (a quarter) until measured.
pub const HEADROOM_CAP_DIVISOR: u64 = 64;

/// The cap never goes below this many pages (2 MiB), or a quarter of the budget if that is less.
pub const MIN_HEADROOM_CAP: u64 = 512;

/// The cap on every free-page threshold for a budget of `budget_pages`:
/// `max(budget / divisor, min(budget / 4, MIN_HEADROOM_CAP))`.
pub fn headroom_cap(budget_pages: u64, divisor: u64) -> u64 {
    (budget_pages / divisor.max(1)).max((budget_pages / 4).min(MIN_HEADROOM_CAP))
}

const NS_PER_SEC: u128 = 1_000_000_000;

/// How the low watermark is probed from the average page turnaround (Hermit's public code, its probe of the low watermark).
///
/// Both rules grow a probe by `max(1, resident / GAMMA)` pages per window in which the turnaround
/// did not move the wrong way, and reset it to 0 at once when it did; they differ in which way is
/// wrong and in where the low watermark starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProbeRule {
    /// The public code, gleaner's default: the probe grows while the turnaround does not
    /// *decrease* and resets when evicted pages come back sooner. The low watermark, as free
    /// pages, is `max(BETA * H_free, probe)`.
    #[default]
    Code,
    /// The paper's literal rule (an ablation): the low watermark starts equal to the high one and
    /// is lowered while the turnaround does not *increase*; when it increases the low watermark is
    /// raised back to the high one at once. As free pages: `H_free + probe`.
    Paper,
}

/// Which reclaim policy the scheduler applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReclaimMode {
    /// Hermit's feedback-directed scheduler (Hermit, NSDI 2023, its reclaim scheduler); `hermit` or `hermit:paper`.
    Hermit {
        /// How the low watermark is probed.
        probe: ProbeRule,
    },
    /// "Hermit\*" / Fastswap (Hermit, NSDI 2023; Fastswap, EuroSys 2020): all `N` threads run while fewer than
    /// [`STATIC_START_FREE`] pages are free, none otherwise; `static:N`.
    Static(usize),
    /// Linux-like (the kernel's own reclaim): no reclaim thread; a faulting thread reclaims
    /// synchronously whenever fewer than [`STATIC_START_FREE`] pages are free; `direct`.
    Direct,
}

impl Default for ReclaimMode {
    fn default() -> Self {
        ReclaimMode::Hermit {
            probe: ProbeRule::Code,
        }
    }
}

impl fmt::Display for ReclaimMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReclaimMode::Hermit {
                probe: ProbeRule::Code,
            } => f.write_str("hermit"),
            ReclaimMode::Hermit {
                probe: ProbeRule::Paper,
            } => f.write_str("hermit:paper"),
            ReclaimMode::Static(n) => write!(f, "static:{n}"),
            ReclaimMode::Direct => f.write_str("direct"),
        }
    }
}

/// A reclaim mode string that is none of `hermit`, `hermit:code`, `hermit:paper`, `static:N`
/// (N ≥ 1) or `direct`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid reclaim mode `{input}`: {reason} (expected hermit, hermit:paper, static:N with N >= 1, \
     or direct)"
)]
pub struct ParseReclaimModeError {
    input: String,
    reason: &'static str,
}

impl FromStr for ReclaimMode {
    type Err = ParseReclaimModeError;

    /// Parses `hermit` (= `hermit:code`), `hermit:paper`, `static:N` with N ≥ 1, or `direct`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParseReclaimModeError {
            input: s.to_string(),
            reason,
        };
        match s {
            "hermit" | "hermit:code" => Ok(ReclaimMode::Hermit {
                probe: ProbeRule::Code,
            }),
            "hermit:paper" => Ok(ReclaimMode::Hermit {
                probe: ProbeRule::Paper,
            }),
            "direct" => Ok(ReclaimMode::Direct),
            _ => {
                if let Some(n) = s.strip_prefix("static:") {
                    match n.parse::<usize>() {
                        Ok(0) => Err(err("a static pool needs at least one thread")),
                        Ok(n) => Ok(ReclaimMode::Static(n)),
                        Err(_) => Err(err("the thread count is not a number")),
                    }
                } else if s.starts_with("hermit:") {
                    Err(err("unknown probe rule"))
                } else {
                    Err(err("unknown mode"))
                }
            }
        }
    }
}

/// How S_in, the fault-in rate, is estimated from the per-window rates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateEstimate {
    /// The running maximum over all windows, as the public code keeps it (Hermit's public code:
    /// `S_in = max(S_in, rate)`). Swap intensity then never falls after a burst.
    #[default]
    RunningMax,
    /// The last window's rate, so the high watermark rises again when faults slow down, as the
    /// paper's text describes (Hermit §4.2).
    LastWindow,
}

/// The scheduler's tunables. [`Default`] gives the published values (see each constant).
///
/// [`ReclaimScheduler::new`] normalises values that would divide by zero or make no sense: a
/// zero `check_every`, `rate_window_ns`, `gamma`, `max_reclaimers` or `headroom_cap_divisor` is
/// taken as 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReclaimParams {
    /// High-watermark pages per unit of swap intensity ([`ALPHA`]).
    pub alpha: u64,
    /// Low-watermark multiple of the high headroom under [`ProbeRule::Code`] ([`BETA`]).
    pub beta: u64,
    /// The probe step is `resident / gamma` pages ([`GAMMA`]).
    pub gamma: u64,
    /// Charges between two checks ([`CHECK_EVERY`]).
    pub check_every: u64,
    /// Minimum rate-window length in nanoseconds ([`RATE_WINDOW_NS`]).
    pub rate_window_ns: u64,
    /// The most reclaim threads Hermit mode asks for ([`MAX_RECLAIMERS`]; the engine passes e.g. 4
    /// on a 2-CPU machine).
    pub max_reclaimers: usize,
    /// Free pages under which one thread runs before both rates are known ([`BOOTSTRAP_FREE`]).
    pub bootstrap_free: u64,
    /// Free pages under which the static pool starts, and under which `direct` mode reclaims
    /// synchronously ([`STATIC_START_FREE`]).
    pub static_start_free: u64,
    /// Floor on the swap intensity used for `n_max` once rates are known ([`MIN_INTENSITY`]; 0
    /// gives the literal pseudo-code).
    pub min_intensity: u64,
    /// Every free-page threshold is capped at `budget / headroom_cap_divisor` (within
    /// [`headroom_cap`]'s floor)
    /// ([`HEADROOM_CAP_DIVISOR`]; 1 means no cap).
    pub headroom_cap_divisor: u64,
    /// How S_in is estimated from the windows.
    pub s_in_estimate: RateEstimate,
}

impl Default for ReclaimParams {
    fn default() -> Self {
        ReclaimParams {
            alpha: ALPHA,
            beta: BETA,
            gamma: GAMMA,
            check_every: CHECK_EVERY,
            rate_window_ns: RATE_WINDOW_NS,
            max_reclaimers: MAX_RECLAIMERS,
            bootstrap_free: BOOTSTRAP_FREE,
            static_start_free: STATIC_START_FREE,
            min_intensity: MIN_INTENSITY,
            headroom_cap_divisor: HEADROOM_CAP_DIVISOR,
            s_in_estimate: RateEstimate::RunningMax,
        }
    }
}

impl ReclaimParams {
    fn normalised(mut self) -> Self {
        self.gamma = self.gamma.max(1);
        self.check_every = self.check_every.max(1);
        self.rate_window_ns = self.rate_window_ns.max(1);
        self.max_reclaimers = self.max_reclaimers.max(1);
        self.headroom_cap_divisor = self.headroom_cap_divisor.max(1);
        self
    }
}

/// What the engine should do after a charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// How many reclaim threads should run: threads `0..threads`. On the fast path this is the
    /// target set at the last check.
    pub threads: usize,
    /// Whether the engine should wake reclaim threads `0..threads` now (at a check, when
    /// `threads > 0`, as the pseudo-code's "wake reclaimers 0..n-1").
    pub wake: bool,
    /// Whether this charge ran a check (every `check_every` charges) rather than the fast path.
    pub checked: bool,
}

/// A serialisable view of the scheduler, for stats and `--json` output.
///
/// Watermarks are given both as resident-page levels (`*_watermark_pages`: the scheduler reacts
/// when the resident count passes them) and as free pages (`*_watermark_free`, what the
/// pseudo-code computes); `level = budget - free`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReclaimSnapshot {
    /// The mode, as [`ReclaimMode`]'s `Display` writes it (`hermit`, `static:4`, ...).
    pub mode: String,
    /// The local budget, in pages.
    pub budget_pages: u64,
    /// Charges seen.
    pub charges: u64,
    /// Checks run (one every `check_every` charges).
    pub checks: u64,
    /// Whether both S_in and S_out are known (otherwise Hermit mode runs its bootstrap rule).
    pub rates_known: bool,
    /// S_in, the fault-in rate estimate, in pages per second (0 until a window closes).
    pub s_in_pages_per_s: u64,
    /// S_out, reclaim thread 0's average reclaim rate, in pages per second (0 until known).
    pub s_out_pages_per_s: u64,
    /// The raw swap intensity `floor(S_in / S_out)` (0 until both rates are known).
    pub swap_intensity: u64,
    /// The thread count at the budget under the current watermarks: `n_max` in Hermit mode
    /// (1 while bootstrapping), `N` in `static:N`, 0 in `direct`.
    pub max_threads: usize,
    /// The thread count set at the last check.
    pub target_threads: usize,
    /// High watermark as a resident-page level: above it the thread ramp is proportional.
    pub high_watermark_pages: u64,
    /// Low watermark as a resident-page level: reclaim threads run once the resident count
    /// reaches it (Hermit, rates known) or passes it (bootstrap, `static:N`); in `direct` mode
    /// faulting threads reclaim synchronously above it.
    pub low_watermark_pages: u64,
    /// High watermark as free pages (`H_free`).
    pub high_watermark_free: u64,
    /// Low watermark as free pages (`L_free`).
    pub low_watermark_free: u64,
    /// The low-watermark probe, in pages (Hermit's public code, its probe of the low watermark).
    pub probe_pages: u64,
    /// Average page turnaround of the last window that had re-faults, in nanoseconds.
    pub turnaround_avg_ns: Option<u64>,
    /// Re-faults reported (turnaround samples).
    pub refaults: u64,
    /// Pages reported reclaimed by reclaim threads.
    pub reclaimed_pages: u64,
    /// Direct reclaims recorded (a faulting thread reclaiming synchronously).
    pub direct_reclaims: u64,
    /// Pages reclaimed by direct reclaims.
    pub direct_reclaimed_pages: u64,
    /// Direct reclaims per charge (Hermit's "direct-reclamation ratio", Hermit, NSDI 2023).
    pub direct_reclaim_ratio: f64,
}

/// Hermit's reclaim scheduler and its ablations, as a pure state machine (see the module
/// documentation for the formulas).
///
/// Call [`on_charge`](Self::on_charge) on every page charge, [`on_reclaimed`](Self::on_reclaimed)
/// after every reclaim batch, [`on_refault`](Self::on_refault) on every fault of a page that was
/// evicted, and [`record_direct_reclaim`](Self::record_direct_reclaim) whenever a faulting thread
/// reclaims synchronously. A reclaim thread `i` keeps reclaiming while
/// `i < threads_for(resident)`.
#[derive(Debug, Clone)]
pub struct ReclaimScheduler {
    budget: u64,
    mode: ReclaimMode,
    p: ReclaimParams,
    /// Cap on every free-page threshold: [`headroom_cap`].
    cap: u64,

    charges: u64,
    /// Charges left before the next check (1..=check_every).
    until_check: u64,
    checks: u64,

    /// Start of the current rate window (set at the first check).
    win_start: Option<u64>,
    win_charges: u64,
    s_in: u64,
    s_in_known: bool,

    t0_pages: u64,
    t0_busy_ns: u64,
    s_out: u64,
    reclaimed_pages: u64,

    apt_sum: u128,
    apt_count: u64,
    apt_last: Option<u64>,
    refaults: u64,
    probe: u64,

    rates_known: bool,
    si: u64,
    n_max: usize,
    high_free: u64,
    low_free: u64,
    target: usize,

    direct_reclaims: u64,
    direct_pages: u64,
}

impl ReclaimScheduler {
    /// A scheduler for a local budget of `budget_pages` pages. Until the first check it asks for
    /// no thread.
    pub fn new(budget_pages: u64, mode: ReclaimMode, params: ReclaimParams) -> Self {
        let p = params.normalised();
        let mut s = ReclaimScheduler {
            budget: budget_pages,
            mode,
            p,
            cap: headroom_cap(budget_pages, p.headroom_cap_divisor),
            charges: 0,
            until_check: p.check_every,
            checks: 0,
            win_start: None,
            win_charges: 0,
            s_in: 0,
            s_in_known: false,
            t0_pages: 0,
            t0_busy_ns: 0,
            s_out: 0,
            reclaimed_pages: 0,
            apt_sum: 0,
            apt_count: 0,
            apt_last: None,
            refaults: 0,
            probe: 0,
            rates_known: false,
            si: 0,
            n_max: 0,
            high_free: 0,
            low_free: 0,
            target: 0,
            direct_reclaims: 0,
            direct_pages: 0,
        };
        s.recompute_watermarks();
        s
    }

    /// The mode this scheduler applies.
    pub fn mode(&self) -> ReclaimMode {
        self.mode
    }

    /// The (normalised) parameters in use.
    pub fn params(&self) -> &ReclaimParams {
        &self.p
    }

    /// The local budget, in pages.
    pub fn budget_pages(&self) -> u64 {
        self.budget
    }

    /// The budget is now `budget_pages` (it grew mid-run): the caps on the free-page thresholds
    /// follow it, and the watermarks are set again from what the scheduler has learnt.
    pub fn set_budget(&mut self, budget_pages: u64) {
        self.budget = budget_pages;
        self.cap = headroom_cap(budget_pages, self.p.headroom_cap_divisor);
        self.recompute_watermarks();
    }

    /// How many reclaim threads the engine should create: `max_reclaimers` in Hermit mode, `N` in
    /// `static:N`, 0 in `direct`. No decision ever asks for more.
    pub fn pool_size(&self) -> usize {
        match self.mode {
            ReclaimMode::Hermit { .. } => self.p.max_reclaimers,
            ReclaimMode::Static(n) => n,
            ReclaimMode::Direct => 0,
        }
    }

    /// The thread count set at the last check.
    pub fn target(&self) -> usize {
        self.target
    }

    /// Called on every page charge (fault-in or first touch), with the resident page count
    /// including the page just charged and the current time.
    ///
    /// Fast path: all but every `check_every`-th call only count the charge and return the last
    /// target with `wake: false`. A check (Hermit's scheduler, `on_charge`):
    /// 1. if at least `rate_window_ns` passed since the window started, closes the window:
    ///    `rate = charges in window / elapsed`, `S_in = max(S_in, rate)` (or the last rate, per
    ///    [`RateEstimate`]), and runs the low-watermark probe (§1.3.1);
    /// 2. recomputes `SI`, `n_max`, `H_free` and `L_free` from the current rates and probe;
    /// 3. sets the target to [`threads_for`](Self::threads_for)`(resident_pages)`.
    ///
    /// The first check only opens the first window. A timestamp earlier than the window start
    /// (a clock that went backwards) restarts the window.
    pub fn on_charge(&mut self, resident_pages: u64, now_ns: u64) -> Decision {
        self.charges = self.charges.saturating_add(1);
        // `until_check` is in 1..=check_every here, so this never underflows.
        self.until_check -= 1;
        if self.until_check != 0 {
            return Decision {
                threads: self.target,
                wake: false,
                checked: false,
            };
        }
        self.until_check = self.p.check_every;
        self.check(resident_pages, now_ns);
        Decision {
            threads: self.target,
            wake: self.target > 0,
            checked: true,
        }
    }

    fn check(&mut self, resident: u64, now: u64) {
        self.checks = self.checks.saturating_add(1);
        match self.win_start {
            Some(start) if now >= start => {
                let elapsed = now - start;
                if elapsed >= self.p.rate_window_ns {
                    let n = self.charges.saturating_sub(self.win_charges);
                    let rate = per_second(n, elapsed);
                    self.s_in = match self.p.s_in_estimate {
                        RateEstimate::RunningMax => self.s_in.max(rate),
                        RateEstimate::LastWindow => rate,
                    };
                    self.s_in_known = true;
                    self.close_turnaround_window(resident);
                    self.win_start = Some(now);
                    self.win_charges = self.charges;
                }
            }
            _ => {
                self.win_start = Some(now);
                self.win_charges = self.charges;
            }
        }
        self.recompute_watermarks();
        self.target = self.threads_for(resident);
    }

    /// Ends a turnaround window: the window's APT is compared with the previous window's and the
    /// probe moves (Hermit mode only). A window without re-faults carries no information and
    /// leaves both the probe and the reference unchanged; the first window with re-faults only
    /// sets the reference.
    fn close_turnaround_window(&mut self, resident: u64) {
        if self.apt_count == 0 {
            return;
        }
        // Each sample is at most u64::MAX, so the average is too.
        let apt = (self.apt_sum / u128::from(self.apt_count)) as u64;
        self.apt_sum = 0;
        self.apt_count = 0;
        if let (ReclaimMode::Hermit { probe }, Some(prev)) = (self.mode, self.apt_last) {
            let grow = match probe {
                // Public code: grow while turnaround did not decrease (pages stay away as long).
                ProbeRule::Code => apt >= prev,
                // Paper: lower the low watermark (grow the probe) while APT does not increase.
                ProbeRule::Paper => apt <= prev,
            };
            if grow {
                let step = (resident / self.p.gamma).max(1);
                self.probe = self.probe.saturating_add(step).min(self.cap);
            } else {
                self.probe = 0;
            }
        }
        self.apt_last = Some(apt);
    }

    fn recompute_watermarks(&mut self) {
        self.rates_known = self.s_in_known && self.s_out > 0;
        self.si = if self.rates_known {
            self.s_in / self.s_out
        } else {
            0
        };
        match self.mode {
            ReclaimMode::Hermit { probe } => {
                if !self.rates_known {
                    // Bootstrap (public code): 1 thread when free < BOOTSTRAP_FREE.
                    self.n_max = 1;
                    self.high_free = 0;
                    self.low_free = self.p.bootstrap_free.min(self.cap);
                    return;
                }
                let n = self
                    .si
                    .max(self.p.min_intensity)
                    .min(self.p.max_reclaimers as u64);
                self.n_max = n as usize;
                // H_free = ALPHA * n_max: high watermark at budget - ALPHA * SI.
                self.high_free = self.p.alpha.saturating_mul(n).min(self.cap);
                let low = match probe {
                    ProbeRule::Code => self.p.beta.saturating_mul(self.high_free).max(self.probe),
                    ProbeRule::Paper => self.high_free.saturating_add(self.probe),
                };
                self.low_free = low.min(self.cap);
            }
            ReclaimMode::Static(n) => {
                self.n_max = n;
                self.low_free = self.p.static_start_free.min(self.cap);
                self.high_free = self.low_free;
            }
            ReclaimMode::Direct => {
                self.n_max = 0;
                self.low_free = self.p.static_start_free.min(self.cap);
                self.high_free = 0;
            }
        }
    }

    /// The thread count the current watermarks give for `resident_pages` resident pages, without
    /// changing any state. Checks set the target with it; a reclaim thread `i` should stop once
    /// `i >= threads_for(resident)`, so reclaim stops even if no charge comes.
    ///
    /// With `free = budget - resident` (0 when over the budget):
    /// * Hermit, rates known (§1.3): `free > L_free` → 0; `free >= H_free` → 1; otherwise
    ///   `n_max * (H_free - free) / H_free` clamped to `[1, n_max]` (`n_max` at the budget).
    /// * Hermit, bootstrap: 1 if `free < L_free` (= `bootstrap_free`), else 0.
    /// * `static:N` (§8.3): N if `free < static_start_free`, else 0.
    /// * `direct`: always 0.
    pub fn threads_for(&self, resident_pages: u64) -> usize {
        let free = self.budget.saturating_sub(resident_pages);
        match self.mode {
            ReclaimMode::Direct => 0,
            ReclaimMode::Static(n) => {
                if free < self.low_free {
                    n
                } else {
                    0
                }
            }
            ReclaimMode::Hermit { .. } if !self.rates_known => usize::from(free < self.low_free),
            ReclaimMode::Hermit { .. } => {
                if free > self.low_free {
                    0
                } else if free >= self.high_free {
                    1
                } else {
                    // free < high_free, so high_free > 0.
                    let n_max = self.n_max.max(1);
                    let n = (n_max as u128 * u128::from(self.high_free - free))
                        / u128::from(self.high_free);
                    (n as usize).clamp(1, n_max)
                }
            }
        }
    }

    /// Whether a faulting thread must reclaim synchronously before taking a slot, with
    /// `resident_pages` resident (not counting the page being faulted in).
    ///
    /// Hermit and `static:N`: only as the last resort, when the budget has no free slot
    /// (`resident >= budget`). `direct`: whenever fewer than the low watermark's free pages are
    /// free (every charge over the low watermark), and at the budget.
    pub fn must_reclaim_directly(&self, resident_pages: u64) -> bool {
        let at_budget = resident_pages >= self.budget;
        match self.mode {
            ReclaimMode::Direct => {
                at_budget || self.budget.saturating_sub(resident_pages) < self.low_free
            }
            _ => at_budget,
        }
    }

    /// How many pages a faulting thread should reclaim synchronously (0 when it need not): in
    /// `direct` mode enough to bring the free pages back to the low watermark (as Linux reclaims
    /// until above its low watermark); otherwise enough to free one slot.
    pub fn direct_reclaim_pages(&self, resident_pages: u64) -> u64 {
        if !self.must_reclaim_directly(resident_pages) {
            return 0;
        }
        let want_free = match self.mode {
            ReclaimMode::Direct => self.low_free.max(1),
            _ => 1,
        };
        want_free
            .saturating_add(resident_pages)
            .saturating_sub(self.budget)
            .max(1)
    }

    /// Records a direct reclaim of `pages` pages by a faulting thread (counted in the snapshot).
    pub fn record_direct_reclaim(&mut self, pages: u64) {
        self.direct_reclaims = self.direct_reclaims.saturating_add(1);
        self.direct_pages = self.direct_pages.saturating_add(pages);
    }

    /// Reports a reclaim batch: reclaim thread `thread_id` evicted `pages` pages in `busy_ns`
    /// nanoseconds of work. S_out is the running average over thread 0's batches,
    /// `S_out = Σ pages / Σ busy time` (Hermit's public code); other threads' batches
    /// only count towards `reclaimed_pages`. Batches with no time contribute pages but no rate
    /// until some time is reported. The new S_out is used from the next check.
    pub fn on_reclaimed(&mut self, thread_id: usize, pages: u64, busy_ns: u64) {
        self.reclaimed_pages = self.reclaimed_pages.saturating_add(pages);
        if thread_id != 0 {
            return;
        }
        self.t0_pages = self.t0_pages.saturating_add(pages);
        self.t0_busy_ns = self.t0_busy_ns.saturating_add(busy_ns);
        if self.t0_busy_ns > 0 {
            self.s_out = per_second(self.t0_pages, self.t0_busy_ns);
        }
    }

    /// Reports one re-fault: a page evicted `turnaround_ns` nanoseconds ago was faulted in again
    /// (turnaround = time of the fault - time of the eviction). Averaged per rate window into the
    /// APT that drives the low-watermark probe (Hermit's public code, its probe of the low watermark).
    pub fn on_refault(&mut self, turnaround_ns: u64) {
        self.on_refaults(1, turnaround_ns);
    }

    /// Reports `count` re-faults whose turnarounds sum to `total_turnaround_ns` nanoseconds.
    pub fn on_refaults(&mut self, count: u64, total_turnaround_ns: u64) {
        if count == 0 {
            return;
        }
        self.apt_sum = self.apt_sum.saturating_add(u128::from(total_turnaround_ns));
        self.apt_count = self.apt_count.saturating_add(count);
        self.refaults = self.refaults.saturating_add(count);
    }

    /// The current state, for stats.
    pub fn snapshot(&self) -> ReclaimSnapshot {
        ReclaimSnapshot {
            mode: self.mode.to_string(),
            budget_pages: self.budget,
            charges: self.charges,
            checks: self.checks,
            rates_known: self.rates_known,
            s_in_pages_per_s: self.s_in,
            s_out_pages_per_s: self.s_out,
            swap_intensity: self.si,
            max_threads: self.n_max,
            target_threads: self.target,
            high_watermark_pages: self.budget - self.high_free,
            low_watermark_pages: self.budget - self.low_free,
            high_watermark_free: self.high_free,
            low_watermark_free: self.low_free,
            probe_pages: self.probe,
            turnaround_avg_ns: self.apt_last,
            refaults: self.refaults,
            reclaimed_pages: self.reclaimed_pages,
            direct_reclaims: self.direct_reclaims,
            direct_reclaimed_pages: self.direct_pages,
            direct_reclaim_ratio: if self.charges == 0 {
                0.0
            } else {
                self.direct_reclaims as f64 / self.charges as f64
            },
        }
    }
}

/// `count` events over `ns` nanoseconds, in events per second, saturating; `ns` must be > 0.
fn per_second(count: u64, ns: u64) -> u64 {
    let r = u128::from(count) * NS_PER_SEC / u128::from(ns);
    u64::try_from(r).unwrap_or(u64::MAX)
}
