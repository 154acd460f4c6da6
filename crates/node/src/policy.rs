//! How the node daemon divides soft memory between pools: pure decisions, no system calls, so
//! each rule is unit-tested against scripted observations.
//!
//! Every `interval` the daemon hands each policy one [`PoolView`] per registered pool (its
//! grant, what it really holds, its counters over the round) and the soft-memory budget `M`
//! (idle memory, or less under pressure); the policy returns every pool's next grant, which
//! always sums to at most `M` (pressure permitting, floors too: see [`fit`]).
//!
//! * [`Midas`] with [`Estimator::Rebuild`]: the dissertation's policy (Midas, NSDI 2024,
//!   section 4.3; Qiao's dissertation, chapter 3): maximise `sum w_i * Gamma_i(m_i)` with
//!   `Gamma_i = -(CPU time in reconstructors)`. Each round the full pools are probed by
//!   `+-probe` bytes, each alternately up and down, in pairs (one up, one down by the same
//!   bytes: [`crate::probes`]) so that a round's probes never leave part of the budget idle;
//!   the slope of a pool's rebuild cost per access against what it held, times its accesses
//!   per second, is its marginal utility `u_i` (per access, so that a closed-loop program
//!   starved into rebuilding all the time still shows what memory saves; only the rebuilds of
//!   victim hits count, not first requests, which memory cannot save). Memory moves (up to
//!   `move_max`) from the lowest `w*u` to the highest that can use it: a pool that used what
//!   it was granted last round (anti-oscillation) and is not saturated, both estimates fresh
//!   (measured within one move of where the pool is). A pool is saturated when it did not
//!   fill an up-probe, or left its grant unused two rounds without growing: it keeps the whole
//!   segments of what it holds, is not probed for itself (only as a spare, down, for a pool
//!   whose pair is stuck) nor given more, until it fills every segment of its grant and misses
//!   what it evicted. What pressure takes (the
//!   budget falls) is given back at once when memory is free again, and a pool refilling it
//!   is not judged until it holds it or stops growing.
//! * [`Midas`] with [`Estimator::VictimPenalty`]: the released code's estimator,
//!   `gain = w * miss_penalty * victim_hits` (penalty = rebuild ns per byte), EWMA-smoothed
//!   (0.3 old + 0.7 new), active above 1; inactive pools give first, active ones grow in
//!   proportion to `log2(gain)`.
//! * [`Static`]: an equal partition (a baseline).
//! * [`Cliffhanger`]: hill-climbing on the hit-ratio gradient measured by victim hits per
//!   ghost byte, fixed steps (a baseline; it maximises hits and ignores what a miss costs).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::shared::{PoolCounters, SEGMENT_BYTES};

/// A pool as a policy sees it for one round.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolView {
    /// The registration's id.
    pub id: u64,
    /// Relative weight (default 1).
    pub weight: f64,
    /// The least it should keep, bytes.
    pub floor: u64,
    /// The most it may get, bytes.
    pub ceiling: u64,
    /// Its grant during the round that just ended.
    pub limit: u64,
    /// What its data segments held at the end of the round (measured from its memfd; the
    /// control area's pages not counted), bytes.
    pub resident: u64,
    /// Its counters over the round.
    pub delta: PoolCounters,
    /// The round's length, seconds.
    pub secs: f64,
    /// Its ghost (victim cache) size, bytes.
    pub ghost_bytes: u64,
}

impl PoolView {
    /// Whether it used (nearly) all of its grant: the anti-oscillation test. A pool holds whole
    /// segments, so only the whole segments of its grant count: a grant of 5.99 MiB lets it
    /// hold 4 MiB, and judged against 5.99 it looked short of its grant for good (it was then
    /// never given more).
    pub fn full(&self, p: &Params) -> bool {
        self.resident as f64 >= p.full_fraction * usable(self.limit) as f64
    }
}

/// What a grant of `bytes` lets a pool hold: its whole segments.
pub fn usable(bytes: u64) -> u64 {
    bytes / SEGMENT_BYTES * SEGMENT_BYTES
}

/// `bytes` rounded up to whole segments.
fn whole_segments(bytes: u64) -> u64 {
    bytes.div_ceil(SEGMENT_BYTES) * SEGMENT_BYTES
}

/// Which policy the daemon runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// Marginal utility, the dissertation's rebuild-cost estimator.
    Midas,
    /// Marginal utility, the released code's victim-hits x miss-penalty estimator.
    MidasVictim,
    /// An equal partition.
    Static,
    /// Cliffhanger: hit-ratio gradient hill-climbing.
    Cliffhanger,
}

impl std::str::FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "midas" => Ok(PolicyKind::Midas),
            "midas-victim" => Ok(PolicyKind::MidasVictim),
            "static" => Ok(PolicyKind::Static),
            "cliffhanger" => Ok(PolicyKind::Cliffhanger),
            _ => Err(format!(
                "unknown policy {s:?}: give midas, midas-victim, static or cliffhanger"
            )),
        }
    }
}

/// The marginal-utility estimator of [`Midas`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Estimator {
    /// Rebuild CPU time, by probing (the dissertation's).
    Rebuild,
    /// Victim hits x miss penalty (the released code's).
    VictimPenalty,
}

/// Tunables shared by the policies.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Probe size (the dissertation: 64 MiB).
    pub probe: u64,
    /// The most one round moves between two pools (the dissertation: 256 MiB).
    pub move_max: u64,
    /// Cliffhanger's step (32 MiB: 16 regions).
    pub step: u64,
    /// A pool holding at least this fraction of its grant used it.
    pub full_fraction: f64,
    /// A pool's first grant when memory is free, bytes (the released code: 100 MB).
    pub initial: u64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            probe: 64 << 20,
            move_max: 256 << 20,
            step: 32 << 20,
            full_fraction: 0.9,
            initial: 100 << 20,
        }
    }
}

/// One pool's next grant, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// The pool.
    pub id: u64,
    /// Its next grant, bytes.
    pub limit: u64,
    /// The reason, in words (for `gleaner node status`).
    pub why: String,
}

/// A policy: called once per round.
pub trait Policy: Send {
    /// Next grants for `pools` within `budget` bytes.
    fn round(&mut self, pools: &[PoolView], budget: u64) -> Vec<Decision>;
    /// The grant a newly registered pool gets, given what is granted already.
    fn admit(&mut self, granted: u64, budget: u64, want: u64, p: &Params) -> u64 {
        budget.saturating_sub(granted).min(want.max(p.initial))
    }
    /// The policy's current utility estimate for pool `id`, if it keeps one.
    fn utility(&self, _id: u64) -> Option<f64> {
        None
    }
}

/// Builds the policy `kind`.
pub fn build(kind: PolicyKind, params: Params) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Midas => Box::new(Midas::new(Estimator::Rebuild, params)),
        PolicyKind::MidasVictim => Box::new(Midas::new(Estimator::VictimPenalty, params)),
        PolicyKind::Static => Box::new(Static { params }),
        PolicyKind::Cliffhanger => Box::new(Cliffhanger { params }),
    }
}

fn clamp(p: &PoolView, v: u64) -> u64 {
    v.min(p.ceiling).max(p.floor.min(p.ceiling))
}

/// Makes `limits` sum to at most `budget`, taking from pools in `order` (first gives first):
/// first down to their floors, then, if that is not enough (pressure), below them.
pub fn fit(pools: &[PoolView], limits: &mut [u64], budget: u64, order: &[usize]) {
    let mut over = limits.iter().sum::<u64>().saturating_sub(budget);
    for pass in 0..2 {
        for &i in order {
            if over == 0 {
                return;
            }
            let keep = if pass == 0 { pools[i].floor } else { 0 };
            let give = limits[i].saturating_sub(keep).min(over);
            limits[i] -= give;
            over -= give;
        }
    }
}

fn decisions(pools: &[PoolView], limits: &[u64], why: &[String]) -> Vec<Decision> {
    pools
        .iter()
        .zip(limits)
        .zip(why)
        .map(|((p, &l), w)| Decision {
            id: p.id,
            limit: l,
            why: w.clone(),
        })
        .collect()
}

/// An equal partition of the budget (clamped to floors and ceilings).
#[derive(Debug)]
pub struct Static {
    /// Tunables.
    pub params: Params,
}

impl Policy for Static {
    fn round(&mut self, pools: &[PoolView], budget: u64) -> Vec<Decision> {
        if pools.is_empty() {
            return Vec::new();
        }
        let share = budget / pools.len() as u64;
        let mut limits: Vec<u64> = pools.iter().map(|p| clamp(p, share)).collect();
        let order: Vec<usize> = (0..pools.len()).collect();
        fit(pools, &mut limits, budget, &order);
        let why = vec![format!("equal share {share}"); pools.len()];
        decisions(pools, &limits, &why)
    }

    fn admit(&mut self, _granted: u64, budget: u64, _want: u64, _p: &Params) -> u64 {
        // The next round re-partitions; until then the newcomer waits with nothing.
        let _ = budget;
        0
    }
}

/// Cliffhanger: moves `step` bytes a round from the pool with the lowest hit-ratio gradient
/// (victim hits per ghost byte) to the one with the highest.
#[derive(Debug)]
pub struct Cliffhanger {
    /// Tunables.
    pub params: Params,
}

fn gradient(p: &PoolView) -> f64 {
    p.delta.vhits as f64 / p.ghost_bytes.max(1) as f64 / p.secs.max(1e-3)
}

impl Policy for Cliffhanger {
    fn round(&mut self, pools: &[PoolView], budget: u64) -> Vec<Decision> {
        let n = pools.len();
        let mut limits: Vec<u64> = pools.iter().map(|p| clamp(p, p.limit)).collect();
        let mut why = vec![String::from("kept"); n];
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| gradient(&pools[a]).total_cmp(&gradient(&pools[b])));
        let granted: u64 = limits.iter().sum();
        if granted < budget {
            // Free memory goes to the steepest pools that used their grant.
            let mut free = budget - granted;
            for &i in order.iter().rev() {
                if free == 0 {
                    break;
                }
                if pools[i].full(&self.params) {
                    let add = self.params.step.min(free).min(pools[i].ceiling - limits[i]);
                    limits[i] += add;
                    free -= add;
                    why[i] = format!("free memory, gradient {:.3e}", gradient(&pools[i]));
                }
            }
        } else if n >= 2 && granted == budget {
            // (Over the budget, `fit` below takes from the flattest first: no move on top.)
            let (lo, hi) = (order[0], order[n - 1]);
            if gradient(&pools[hi]) > gradient(&pools[lo]) && pools[hi].full(&self.params) {
                let mv = self
                    .params
                    .step
                    .min(limits[lo].saturating_sub(pools[lo].floor))
                    .min(pools[hi].ceiling - limits[hi]);
                limits[lo] -= mv;
                limits[hi] += mv;
                why[lo] = format!("gave {mv} (lowest hit gradient)");
                why[hi] = format!("took {mv} (highest hit gradient)");
            }
        }
        fit(pools, &mut limits, budget, &order);
        decisions(pools, &limits, &why)
    }
}

#[derive(Debug, Default, Clone)]
struct ProbeState {
    /// The grant before probing.
    base: u64,
    /// The grant the policy gave for the round that just ended (probe included): a pool found
    /// holding a lower grant was cut by the daemon between rounds (pressure).
    decided: u64,
    /// The probe in effect during the round that just ended (+1, -1, or 0 for none).
    phase: i8,
    /// (resident, rebuild ns per access, accesses per second) measured at +probe and -probe.
    up: Option<(u64, f64, f64)>,
    down: Option<(u64, f64, f64)>,
    /// The marginal utility: rebuild ns/s saved per byte.
    utility: f64,
    /// The released code's smoothed gain.
    gain: f64,
    /// Whether `utility` comes from a probe pair (else it is the prior).
    measured: bool,
    /// The base its utility was measured around (when the last pair completed).
    measured_at: u64,
    /// The slopes of its last pairs (at most [`SLOPES_KEPT`]) and the base each was measured
    /// around: `utility` is their median (see [`smoothed`]).
    slopes: Vec<(f64, u64)>,
    /// The probe size last used.
    probe: u64,
    /// It did not fill its last up-probe, or left its grant unused two rounds without
    /// growing: it holds all it can use (its working set), so more memory would sit idle in
    /// it. Cleared when it fills every segment of its grant and misses what it evicted (its
    /// working set grew).
    saturated: bool,
    /// What a saturated pool holds (not counting a round in which it refilled).
    held: u64,
    /// It became saturated at an up-probe in the round that just ended: its grant becomes the
    /// whole segments of what it holds, which may be above its base (within the probe).
    saturated_up: bool,
    /// Rounds in a row it held less than its grant (not [`PoolView::full`]) and did not grow.
    unused_rounds: u32,
    /// What it held at the end of the last round, bytes.
    last_resident: u64,
    /// The grant it had before the budget (pressure) took from it; 0 when none. Given back at
    /// once when memory is free again.
    before_cut: u64,
    /// Rounds since it last probed.
    waited: u32,
    /// Rounds its pair of measurements has been open (one taken, the other not yet).
    open_rounds: u32,
    /// Refilling a grant given back after pressure (or kept through a cut): not probed, given
    /// no more and not judged until it holds its grant or stops growing.
    refilling: bool,
}

/// Rounds a pool's pair may wait for an up-probe (after the spares' chance at 4) before its
/// upper point is taken where it is.
const STUCK_AT_BASE: u32 = 6;

/// Slopes a pool needs near where it is before memory moves on its estimate (one wild pair
/// alone moves nothing).
const SLOPES_TO_MOVE: usize = 2;

/// How many probe pairs' slopes a pool's utility is the median of.
pub const SLOPES_KEPT: usize = 3;

/// Adds `slope`, measured around `at`, to a pool's last `slopes` and returns its utility: the
/// median of those measured within `move_max` of `at` (the same part of its curve), at most
/// [`SLOPES_KEPT`] (of two, their mean).
///
/// One pair measures two points 2-4 MiB apart over one round each; on a busy machine the
/// bench's storage pool read 3.5 then 107 then 7 from consecutive pairs
/// (`bench/results/midas/README.md`), and each swing moved memory to it and back. A median of
/// three ignores one wild pair; the window keeps a slope measured far down (or up) the curve
/// from standing for where the pool is now.
pub fn smoothed(slopes: &mut Vec<(f64, u64)>, slope: f64, at: u64, move_max: u64) -> f64 {
    slopes.retain(|&(_, a)| a.abs_diff(at) <= move_max);
    slopes.push((slope, at));
    if slopes.len() > SLOPES_KEPT {
        slopes.remove(0);
    }
    let mut v: Vec<f64> = slopes.iter().map(|s| s.0).collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        2 => (v[0] + v[1]) / 2.0,
        n => v[n / 2],
    }
}

/// Marginal-utility allocation (Midas) with either estimator.
#[derive(Debug)]
pub struct Midas {
    estimator: Estimator,
    params: Params,
    state: HashMap<u64, ProbeState>,
    rounds: u64,
}

impl Midas {
    /// A Midas policy with `estimator`.
    pub fn new(estimator: Estimator, params: Params) -> Midas {
        Midas {
            estimator,
            params,
            state: HashMap::new(),
            rounds: 0,
        }
    }

    /// The current utility estimate of pool `id` (for status output and tests).
    pub fn utility(&self, id: u64) -> Option<f64> {
        self.state.get(&id).map(|s| match self.estimator {
            Estimator::Rebuild => s.utility,
            Estimator::VictimPenalty => s.gain,
        })
    }

    fn observe(&mut self, p: &PoolView) {
        let params = self.params.clone();
        let st = self.state.entry(p.id).or_insert_with(|| ProbeState {
            base: p.limit,
            decided: p.limit,
            last_resident: p.resident,
            ..Default::default()
        });
        // The daemon lowered its grant between rounds (pressure): the round measured the
        // pressure, not the pool. Its probe says nothing and it is not judged for what it left
        // unused; its grant before the cut is remembered by the round's fit, if still short.
        let cut = p.limit < st.decided;
        // Refilling (after a cut, or a new grant it is still filling): not unused.
        let growing = p.resident >= st.last_resident.saturating_add(SEGMENT_BYTES);
        st.last_resident = p.resident;
        st.waited = if st.phase != 0 {
            0
        } else {
            st.waited.saturating_add(1)
        };
        if cut {
            st.refilling = true;
        } else if st.refilling
            && (p.resident as f64 >= params.full_fraction * usable(st.base) as f64 || !growing)
        {
            st.refilling = false;
        }
        if cut || st.refilling {
            st.phase = 0;
            st.unused_rounds = 0;
        } else if p.full(&params) || growing {
            st.unused_rounds = 0;
        } else {
            st.unused_rounds = st.unused_rounds.saturating_add(1);
        }
        match self.estimator {
            Estimator::Rebuild => {
                // Rebuild cost per access, and accesses per second: their product is the
                // dissertation's Gamma (rebuild CPU per second) under the pool's current load.
                // The slope is taken per access and then scaled by the load, because a program
                // in a closed loop that is starved of memory spends all its time rebuilding: its
                // rebuild CPU per second is flat in memory until its cache is nearly whole, and
                // the raw slope would send memory away from the very pool that needs it most.
                //
                // Only the rebuilds memory could have saved count: those of victim hits (misses
                // of what the pool evicted), not first requests. While a pool fills (at start,
                // after a grant grows) first requests dominate its misses whatever it holds, and
                // the slope measured then came out near zero: the 1 ms pool was judged the least
                // valuable and starved (bench/results/midas/README.md).
                let accesses = (p.delta.hits + p.delta.misses).max(1) as f64;
                let avoidable = if p.delta.misses == 0 {
                    0.0
                } else {
                    p.delta.rebuild_ns as f64 * p.delta.vhits.min(p.delta.misses) as f64
                        / p.delta.misses as f64
                };
                let per_access = avoidable / accesses;
                let rate = accesses / p.secs.max(1e-3);
                // (A saturated pool probed down as a spare measures nothing for itself.)
                match st.phase {
                    1 if !st.saturated => st.up = Some((p.resident, per_access, rate)),
                    -1 if !st.saturated => st.down = Some((p.resident, per_access, rate)),
                    _ => {}
                }
                st.saturated_up = false;
                if cut || st.refilling {
                    // Judged on nothing: the round measured the pressure, or the refill.
                } else if st.saturated {
                    // (A grant the budget cut below what it held says nothing of the kind.)
                    // Misses of what it evicted (victim hits), not first requests: at least one
                    // access in a thousand.
                    if p.resident + SEGMENT_BYTES / 8 >= usable(p.limit)
                        && usable(p.limit) >= whole_segments(st.held)
                        && p.delta.vhits * 1000 >= p.delta.hits + p.delta.misses
                        && p.delta.vhits > 0
                    {
                        // It fills every segment of its grant and misses what it evicted: its
                        // working set grew. Probed again, and given memory, from now on.
                        st.saturated = false;
                    } else if !growing && st.phase == 0 {
                        st.held = p.resident;
                    }
                } else if (st.phase == 1 && p.resident < usable(st.base) + st.probe / 4)
                    || st.unused_rounds >= 2
                {
                    // It did not fill the memory of its up-probe (or left its grant unused two
                    // rounds and did not grow): what it holds is all it uses.
                    st.saturated_up = st.phase == 1;
                    st.saturated = true;
                    st.held = p.resident;
                    st.up = None;
                    st.down = None;
                }
                if let (Some((ru, cu, qu)), Some((rd, cd, qd))) = (st.up, st.down) {
                    // The slope of rebuild cost against the memory the pool really held: a probe
                    // the pool did not fill (or give back) says nothing, and keeps the old slope.
                    if ru > rd + st.probe.min(params.probe) / 4 {
                        let slope = ((cd - cu) / (ru - rd) as f64 * (qu + qd) / 2.0).max(0.0);
                        st.utility = smoothed(&mut st.slopes, slope, st.base, params.move_max);
                        st.measured_at = st.base;
                    }
                    st.up = None;
                    st.down = None;
                    st.measured = true;
                }
                st.open_rounds = if st.up.is_some() != st.down.is_some() {
                    st.open_rounds.saturating_add(1)
                } else {
                    0
                };
                if !st.measured {
                    // Until a probe pair has measured a slope: the rebuild CPU it spends per
                    // byte it holds (as much memory again would save at most all of it).
                    st.utility = p.delta.rebuild_ns as f64
                        / p.secs.max(1e-3)
                        / p.resident.max(params.probe) as f64;
                }
            }
            Estimator::VictimPenalty => {
                let penalty = p.delta.rebuild_ns as f64 / p.delta.miss_bytes.max(1) as f64;
                let sample = p.weight * penalty * p.delta.vhits as f64;
                st.gain = 0.3 * st.gain + 0.7 * sample;
            }
        }
    }

    fn score(&self, p: &PoolView) -> f64 {
        let s = &self.state[&p.id];
        match self.estimator {
            Estimator::Rebuild => p.weight * s.utility,
            Estimator::VictimPenalty => s.gain,
        }
    }

    /// The round's probes (the rebuild estimator): full pools, in pairs that move memory from
    /// one to another ([`crate::probes::pair`]), so that the sum of the grants stays the
    /// budget; saturated pools only as spares; a pool at its floor (ceiling) that needs a
    /// point below (above) its grant measures it where it is.
    fn probe(&mut self, pools: &[PoolView], base: &[u64], limits: &mut [u64]) {
        use crate::probes::{pair, Prober, Want};
        let n = pools.len();
        let prm = &self.params;
        let mut probers = Vec::new();
        for k in (0..n).map(|k| (k + self.rounds as usize) % n) {
            let p = &pools[k];
            let st = self.state.get_mut(&p.id).unwrap();
            if !p.full(prm) || st.refilling {
                continue;
            }
            // A probe is at most a quarter of the pool's grant (at least one segment): a
            // 64 MiB probe of a 48 MiB pool would empty it every other round.
            let size = usable(prm.probe.min((base[k] / 4).max(SEGMENT_BYTES))).max(SEGMENT_BYTES);
            let up_room = usable(size.min(p.ceiling.saturating_sub(base[k])));
            let down_room = usable(size.min(base[k].saturating_sub(p.floor)));
            if st.saturated {
                // Not probed for itself; a spare for a stuck pool.
                probers.push(Prober {
                    index: k,
                    want: Want::Down,
                    up_room: 0,
                    down_room,
                    waited: st.waited,
                    stuck: false,
                    spare: true,
                });
                continue;
            }
            let want = match (st.up.is_some(), st.down.is_some()) {
                (true, false) => Want::Down,
                (false, true) => Want::Up,
                _ => Want::Either,
            };
            match want {
                Want::Down if down_room == 0 => {
                    // At its floor: the lower point is where it is.
                    st.phase = -1;
                    continue;
                }
                Want::Up if up_room == 0 => {
                    // At its ceiling: it can have no more, and the pair will say so.
                    st.phase = 1;
                    continue;
                }
                Want::Up if st.open_rounds >= STUCK_AT_BASE => {
                    // Its pair has waited for an up-probe that nobody gave (every other pool at
                    // its floor, no spare): the upper point is where it is. Without this a pool
                    // holding the whole budget measured only down, round after round; its
                    // estimate went stale and no memory moved back to a starved pool whose
                    // utility was 100x higher.
                    st.phase = 1;
                    // (No probe: not judged on filling one.)
                    st.probe = 0;
                    continue;
                }
                _ => {}
            }
            probers.push(Prober {
                index: k,
                want,
                up_room,
                down_room,
                waited: st.waited,
                // Open four rounds: about two chances to be paired the way it wants, missed.
                stuck: st.open_rounds >= 4,
                spare: false,
            });
        }
        for x in pair(&probers) {
            limits[x.up] += x.bytes;
            limits[x.down] -= x.bytes;
            for (k, phase) in [(x.up, 1), (x.down, -1)] {
                let st = self.state.get_mut(&pools[k].id).unwrap();
                st.phase = phase;
                st.probe = x.bytes;
            }
        }
    }
}

impl Policy for Midas {
    fn round(&mut self, pools: &[PoolView], budget: u64) -> Vec<Decision> {
        self.state.retain(|id, _| pools.iter().any(|p| p.id == *id));
        for p in pools {
            self.observe(p);
        }
        self.rounds += 1;
        let n = pools.len();
        let prm = self.params.clone();
        let mut base: Vec<u64> = pools
            .iter()
            .map(|p| clamp(p, self.state[&p.id].base))
            .collect();
        let mut why = vec![String::from("kept"); n];
        // Memory a pool does not use goes back to the idle memory (the rebuild estimator): a
        // saturated pool keeps the whole segments of what it holds and is given no more.
        // Without this the pool that valued memory most kept what it was given past its
        // working set, idle, while the others went short (bench/results/midas/README.md).
        let mut saturated = vec![false; n];
        if self.estimator == Estimator::Rebuild {
            for (k, p) in pools.iter().enumerate() {
                let st = self.state.get_mut(&p.id).unwrap();
                saturated[k] = st.saturated;
                if st.refilling {
                    continue;
                }
                if !st.saturated {
                    continue;
                }
                // In whole segments: the one it is filling counts whole.
                let keep = clamp(p, whole_segments(st.held.max(p.resident)));
                if st.saturated_up && keep > base[k] && keep <= p.limit {
                    // Saturated at its up-probe, holding more than its base allows (32.08
                    // MiB at a base of 32): it keeps the whole segments it used, or it would
                    // miss at its base, leave saturation and probe up again, round after
                    // round.
                    why[k] = format!("saturated: keeps {keep}");
                    base[k] = keep;
                    continue;
                }
                if keep < base[k] {
                    why[k] = format!("unused {} returned", base[k] - keep);
                    base[k] = keep;
                    st.before_cut = 0;
                }
            }
        }
        let score: Vec<f64> = pools.iter().map(|p| self.score(p)).collect();
        let mut order: Vec<usize> = (0..n).collect();
        // Lowest utility first; among equals, the one holding least of its grant.
        order.sort_by(|&a, &b| {
            score[a].total_cmp(&score[b]).then(
                (pools[a].resident as f64 / pools[a].limit.max(1) as f64)
                    .total_cmp(&(pools[b].resident as f64 / pools[b].limit.max(1) as f64)),
            )
        });
        let active = |i: usize| match self.estimator {
            Estimator::Rebuild => true,
            Estimator::VictimPenalty => score[i] > 1.0,
        };
        // Memory free again after pressure: a pool the budget cut gets its grant back at once,
        // best utility first (it used that grant before the cut), not a step per round.
        let mut free = budget.saturating_sub(base.iter().sum());
        for &i in order.iter().rev() {
            let st = self.state.get_mut(&pools[i].id).unwrap();
            if free == 0 || st.before_cut <= base[i] {
                continue;
            }
            let add = (clamp(&pools[i], st.before_cut) - base[i].min(st.before_cut)).min(free);
            base[i] += add;
            free -= add;
            why[i] = format!("restored +{add} after pressure");
            st.refilling = true;
            if base[i] >= st.before_cut {
                st.before_cut = 0;
            }
        }
        let granted: u64 = base.iter().sum();
        // Whom memory may go to: a pool that used what it was given (anti-oscillation) and is
        // not saturated, below its ceiling.
        let refilling: Vec<bool> = pools.iter().map(|p| self.state[&p.id].refilling).collect();
        let can_take = |i: usize, base: &[u64]| {
            pools[i].full(&prm)
                && !saturated[i]
                && !refilling[i]
                && base[i] < pools[i].ceiling
                && active(i)
        };
        if granted < budget {
            // Idle memory: to the pools that used their grant, best first.
            let mut free = budget - granted;
            let max_score = score.iter().cloned().fold(0.0, f64::max).max(2.0);
            for &i in order.iter().rev() {
                if free == 0 {
                    break;
                }
                if !can_take(i, &base) {
                    continue;
                }
                let mut add = prm.move_max.min(free).min(pools[i].ceiling - base[i]);
                if self.estimator == Estimator::VictimPenalty {
                    // In proportion to log2(gain), at most half the old grant (and 1 step).
                    let f = score[i].log2().max(1.0) / max_score.log2();
                    add = add
                        .min(((prm.move_max as f64 * f) as u64).max(prm.step))
                        .min((base[i] / 2).max(prm.step));
                }
                base[i] += add;
                free -= add;
                why[i] = format!("idle memory +{add} (utility {:.3e})", score[i]);
            }
        } else if n >= 2 {
            // A full budget: move from the lowest utility to the highest that can take it (a
            // saturated pool, however valuable, would leave it idle). Both estimates must be
            // fresh (the rebuild estimator): measured within one move of where the pool is.
            // A slope measured low on a pool's curve is steeper than where a few moves have
            // taken it, and one measured at the top of its working set flatter than below it:
            // stale, they moved a whole working set from the 1 ms pool to the 100 us one,
            // 8 MiB a round (`midas-quick-harvest-d.json`). Each moved pool is probed again
            // where it is before it moves further.
            let fresh = |i: usize| {
                self.estimator != Estimator::Rebuild || {
                    let st = &self.state[&pools[i].id];
                    st.measured
                        && base[i].abs_diff(st.measured_at) < prm.move_max
                        && st.slopes.len() >= SLOPES_TO_MOVE
                }
            };
            let hi_i = order
                .iter()
                .rev()
                .copied()
                .find(|&i| can_take(i, &base) && fresh(i));
            let lo_i = hi_i.and_then(|hi| {
                order.iter().copied().find(|&i| {
                    i != hi && base[i] > pools[i].floor && (fresh(i) || !pools[i].full(&prm))
                })
            });
            // The rebuild estimator moves memory only when the two pools' recent slopes do not
            // overlap: the lowest of the taker's above the highest of the giver's (one that
            // does not use its grant, by its estimate). Each pair's slope is noisy on a busy
            // machine (3.5 to 107 for one pool between consecutive pairs), and a median alone
            // still moved memory between two pools of the same worth round after round.
            let separated = |hi: usize, lo: usize| {
                if self.estimator != Estimator::Rebuild {
                    return true;
                }
                let (sh, sl) = (&self.state[&pools[hi].id], &self.state[&pools[lo].id]);
                let hi_low = sh.slopes.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
                let lo_high = if pools[lo].full(&prm) {
                    sl.slopes.iter().map(|s| s.0).fold(sl.utility, f64::max)
                } else {
                    sl.utility
                };
                pools[hi].weight * hi_low > pools[lo].weight * lo_high * 1.1 + 1e-12
            };
            if let (Some(hi), Some(lo)) = (hi_i, lo_i) {
                if score[hi] > score[lo] * 1.1 + 1e-12 && separated(hi, lo) {
                    let mut mv = prm
                        .move_max
                        .min(base[lo] - pools[lo].floor)
                        .min(pools[hi].ceiling - base[hi]);
                    if !pools[lo].full(&prm) {
                        // From a pool not using its grant, only what it does not use.
                        mv = mv.min(base[lo].saturating_sub(pools[lo].resident).max(prm.step));
                    }
                    if self.estimator == Estimator::Rebuild {
                        // A slope is measured within a probe of where the pool is; a small
                        // pool's is its curve's steepest part. The taker grows by at most half
                        // its grant (the released code's cap on an expansion), and by a probe
                        // at least: a whole `move_max` took the bench's storage pool from 0 to
                        // 10 MiB on a slope measured between 0 and 2, where it found a slope a
                        // tenth as steep and gave it all back, every 12-16 s for a whole run
                        // (`bench/results/midas/midas-before-cap.json`). In whole segments: a
                        // grant of 4.8 MiB holds 4 (`usable`), and the rest sat idle.
                        mv = mv.min(usable(base[hi] / 2).max(prm.probe));
                    }
                    if self.estimator == Estimator::VictimPenalty && active(lo) {
                        let f = (score[hi].log2() / score[lo].max(2.0).log2()).clamp(0.0, 1.0);
                        mv = (mv as f64 * (1.0 - f).max(0.25)) as u64;
                    }
                    mv = mv.min(base[lo] - pools[lo].floor);
                    base[lo] -= mv;
                    base[hi] += mv;
                    why[lo] = format!("gave {mv} (utility {:.3e}, lowest)", score[lo]);
                    why[hi] = format!("took {mv} (utility {:.3e}, highest)", score[hi]);
                }
            }
        }
        // Pressure: the budget takes from the lowest utility first; what it takes is given back
        // at once when memory is free again (above).
        let wanted = base.clone();
        fit(pools, &mut base, budget, &order);
        for (k, p) in pools.iter().enumerate() {
            let st = self.state.get_mut(&p.id).unwrap();
            if base[k] < wanted[k] {
                st.before_cut = st.before_cut.max(wanted[k]);
                why[k] = format!("budget {budget}: cut by {}", wanted[k] - base[k]);
            }
            st.base = base[k];
            st.phase = 0;
        }
        let mut limits = base.clone();
        if self.estimator == Estimator::Rebuild {
            self.probe(pools, &base, &mut limits);
        }
        fit(pools, &mut limits, budget, &order);
        for (k, p) in pools.iter().enumerate() {
            self.state.get_mut(&p.id).unwrap().decided = limits[k];
        }
        decisions(pools, &limits, &why)
    }

    fn utility(&self, id: u64) -> Option<f64> {
        Midas::utility(self, id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    fn pool(id: u64, limit: u64, resident: u64, rebuild_ns: u64, vhits: u64) -> PoolView {
        PoolView {
            id,
            weight: 1.0,
            floor: 0,
            ceiling: 1 << 40,
            limit,
            resident,
            delta: PoolCounters {
                hits: 1000,
                misses: 100,
                vhits,
                rebuild_ns,
                miss_bytes: 100 * 16384,
            },
            secs: 1.0,
            ghost_bytes: 64 * MB,
        }
    }

    fn params() -> Params {
        Params {
            probe: 8 * MB,
            move_max: 32 * MB,
            step: 8 * MB,
            full_fraction: 0.9,
            initial: 16 * MB,
        }
    }

    fn limit(d: &[Decision], id: u64) -> u64 {
        d.iter().find(|x| x.id == id).unwrap().limit
    }

    #[test]
    fn a_pool_is_full_by_the_whole_segments_of_its_grant() {
        // 5.99 MiB granted lets it hold two segments: holding them, it is full.
        let p = pool(1, 6 * MB - 40 * 1024, 4 * MB - 8 * 1024, 0, 0);
        assert!(p.full(&params()));
        let p = pool(1, 6 * MB - 40 * 1024, 2 * MB, 0, 0);
        assert!(!p.full(&params()));
        assert_eq!(usable(6 * MB - 1), 4 * MB);
        assert_eq!(whole_segments(4 * MB - 8 * 1024), 4 * MB);
    }

    #[test]
    fn a_grant_given_back_keeps_whole_segments() {
        // Below its grant two rounds, holding 3.99 MiB (its open segment not all touched): it
        // keeps the two whole segments it holds (counted whole), not 3.99 MiB, which would
        // let it hold only one and look short of its grant for good. (Before the saturated
        // rule it kept a probe of room above them: 6 MiB.)
        let prm = Params {
            probe: 2 * MB,
            ..params()
        };
        let mut m = Midas::new(Estimator::Rebuild, prm);
        let a = pool(1, 16 * MB, 4 * MB - 8 * 1024, 1_000_000, 0);
        let mut d = Vec::new();
        for _ in 0..3 {
            d = m.round(std::slice::from_ref(&a), 16 * MB);
        }
        assert_eq!(limit(&d, 1) % SEGMENT_BYTES, 0, "{d:?}");
        assert_eq!(limit(&d, 1), 4 * MB, "{d:?}");
    }

    #[test]
    fn static_splits_equally_within_floors_and_ceilings() {
        let mut s = Static { params: params() };
        let mut a = pool(1, 0, 0, 0, 0);
        a.ceiling = 10 * MB;
        let b = pool(2, 0, 0, 0, 0);
        let d = s.round(&[a, b], 100 * MB);
        assert_eq!(limit(&d, 1), 10 * MB);
        assert_eq!(limit(&d, 2), 50 * MB);
    }

    #[test]
    fn fit_takes_from_the_first_in_order_and_floors_last() {
        let mut a = pool(1, 0, 0, 0, 0);
        a.floor = 20 * MB;
        let b = pool(2, 0, 0, 0, 0);
        let ps = [a, b];
        let mut l = [50 * MB, 50 * MB];
        fit(&ps, &mut l, 90 * MB, &[0, 1]);
        assert_eq!(l, [40 * MB, 50 * MB]);
        let mut l = [50 * MB, 50 * MB];
        fit(&ps, &mut l, 10 * MB, &[0, 1]);
        assert_eq!(l.iter().sum::<u64>(), 10 * MB);
        assert_eq!(
            l[1], 0,
            "the first pool keeps its floor until the others are empty"
        );
    }

    /// The rebuild estimator: two full pools with the same hit behaviour but rebuild costs 100x
    /// apart; whatever the probes measure, memory must end up with the expensive one and the
    /// sum must never pass the budget.
    #[test]
    fn midas_moves_memory_to_the_expensive_pool() {
        let mut m = Midas::new(Estimator::Rebuild, params());
        let budget = 128 * MB;
        let mut limits = [64 * MB, 64 * MB];
        // Rebuild cost per second as a function of what the pool holds: misses fall linearly.
        let cost = |per_miss: f64, held: u64| (200.0 - held as f64 / MB as f64).max(0.0) * per_miss;
        for _ in 0..40 {
            let views: Vec<PoolView> = [(1u64, 10_000.0), (2, 1_000_000.0)]
                .iter()
                .enumerate()
                .map(|(k, &(id, per))| {
                    let mut v = pool(id, limits[k], limits[k], cost(per, limits[k]) as u64, 100);
                    v.delta.rebuild_ns = cost(per, limits[k]) as u64;
                    v
                })
                .collect();
            let d = m.round(&views, budget);
            assert!(d.iter().map(|x| x.limit).sum::<u64>() <= budget);
            limits = [limit(&d, 1), limit(&d, 2)];
        }
        assert!(
            limits[1] > 100 * MB,
            "expensive pool has {} MiB",
            limits[1] / MB
        );
        assert!(m.utility(2).unwrap() > m.utility(1).unwrap());
    }

    #[test]
    fn midas_gives_nothing_more_to_a_pool_that_did_not_use_its_grant() {
        let mut m = Midas::new(Estimator::Rebuild, params());
        // Pool 2 is expensive but holds a quarter of its grant: idle memory goes to pool 1.
        let a = pool(1, 32 * MB, 32 * MB, 1000, 0);
        let b = pool(2, 32 * MB, 8 * MB, 1_000_000_000, 0);
        let d = m.round(&[a, b], 96 * MB);
        assert!(limit(&d, 1) >= 32 * MB + 16 * MB);
        assert!(limit(&d, 2) <= 32 * MB, "{}", limit(&d, 2) / MB);
    }

    /// Harvesting: an expensive pool whose working set (34 MiB) is smaller than what it is
    /// offered must not keep the rest idle; a cheap pool that can use it gets it, and the
    /// pools end up holding (nearly) the whole budget.
    #[test]
    fn midas_returns_what_a_pool_cannot_use_to_the_pools_that_can() {
        // The bench's settings (bench/midas.py): small probes and moves.
        let prm = Params {
            probe: 2 * MB,
            move_max: 8 * MB,
            step: 4 * MB,
            full_fraction: 0.9,
            initial: 8 * MB,
        };
        let mut m = Midas::new(Estimator::Rebuild, prm);
        let budget = 96 * MB;
        let ws = [200 * MB, 34 * MB];
        let per_miss = [10_000.0, 1_000_000.0];
        let mut limits = [8 * MB, 8 * MB];
        let (mut over, mut harvested) = (0.0, 0.0);
        for round in 0..80 {
            let held = [limits[0].min(ws[0]), limits[1].min(ws[1])];
            if round >= 40 {
                // Averaged over the last 40 rounds: probes move grants by a step each round.
                over += (limits[1] as f64 - ws[1] as f64) / MB as f64 / 40.0;
                harvested += (held[0] + held[1]) as f64 / budget as f64 / 40.0;
            }
            let views: Vec<PoolView> = (0..2)
                .map(|k| {
                    // Rebuild cost falls linearly until the working set is held.
                    let cost = ((ws[k] - held[k]) as f64 / MB as f64) * per_miss[k];
                    // Below its working set its misses are of what it evicted.
                    let vhits = if held[k] < ws[k] { 100 } else { 0 };
                    pool(k as u64 + 1, limits[k], held[k], cost as u64, vhits)
                })
                .collect();
            let d = m.round(&views, budget);
            assert!(d.iter().map(|x| x.limit).sum::<u64>() <= budget);
            limits = [limit(&d, 1), limit(&d, 2)];
        }
        assert!(
            over <= 4.0,
            "the expensive pool's grant passes its working set by {over:.1} MiB on average"
        );
        assert!(
            harvested >= 0.95,
            "the pools hold {harvested:.3} of the budget on average"
        );
    }

    /// A program as the policy tests see it: it holds what its grant lets it (whole
    /// segments) up to its working set, refilling at most `refill` bytes a round and giving
    /// back at once; its misses (and their rebuild cost) fall linearly until it holds its
    /// working set.
    struct Sim {
        id: u64,
        ws: u64,
        per_miss_ns: f64,
        refill: u64,
        limit: u64,
        held: u64,
    }

    impl Sim {
        fn new(id: u64, ws: u64, per_miss_ns: f64, limit: u64) -> Sim {
            Sim {
                id,
                ws,
                per_miss_ns,
                refill: 64 * MB,
                limit,
                held: 0,
            }
        }

        /// The round passes under grant `limit`.
        fn run(&mut self, limit: u64) {
            self.limit = limit;
            let room = usable(limit).min(self.ws);
            self.held = if self.held > room {
                room
            } else {
                (self.held + self.refill).min(room)
            };
        }

        fn view(&self) -> PoolView {
            let accesses = 10_000u64;
            let misses = (accesses as f64 * (self.ws - self.held) as f64 / self.ws as f64) as u64;
            let mut v = pool(self.id, self.limit, self.held, 0, 0);
            v.delta.hits = accesses - misses;
            v.delta.misses = misses;
            // Below its working set its misses are of what it evicted.
            v.delta.vhits = if self.held < self.ws { misses } else { 0 };
            v.delta.rebuild_ns = (misses as f64 * self.per_miss_ns) as u64;
            v
        }
    }

    /// One round of `m` over `sims` with `budget`: returns the grants.
    fn step(m: &mut Midas, sims: &mut [Sim], budget: u64) -> Vec<u64> {
        let views: Vec<PoolView> = sims.iter().map(Sim::view).collect();
        let d = m.round(&views, budget);
        assert!(
            d.iter().map(|x| x.limit).sum::<u64>() <= budget,
            "over the budget: {d:?}"
        );
        let limits: Vec<u64> = sims.iter().map(|s| limit(&d, s.id)).collect();
        eprintln!(
            "DBG {:?} held {:?} {:?}",
            limits.iter().map(|l| l / MB).collect::<Vec<_>>(),
            sims.iter()
                .map(|s| s.held as f64 / MB as f64)
                .collect::<Vec<_>>(),
            d.iter()
                .map(|x| (
                    x.why.clone(),
                    m.state[&x.id].utility as u64,
                    m.state[&x.id].measured_at / MB,
                    m.state[&x.id].saturated
                ))
                .collect::<Vec<_>>()
        );
        for (s, &l) in sims.iter_mut().zip(&limits) {
            s.run(l);
        }
        limits
    }

    /// The bench's settings (bench/midas.py): small probes and moves.
    fn bench_params() -> Params {
        Params {
            probe: 2 * MB,
            move_max: 8 * MB,
            step: 4 * MB,
            full_fraction: 0.9,
            initial: 8 * MB,
        }
    }

    /// Harvesting with three pools, as in the bench: 48 MiB for three working sets of about
    /// 32 MiB, rebuild costs 100x apart. The 1 ms pool holds its working set (32 MiB and a
    /// few objects) and keeps no idle probe of room above it; the probes of the other two
    /// come in pairs, so no round leaves part of the budget ungranted: the pools hold >= 95%
    /// of it. (Before: the 1 ms pool kept 36 MiB for 32.08, and with three pools every other
    /// round left a probe ungranted: 0.92.)
    #[test]
    fn midas_with_three_pools_hands_out_all_idle_memory() {
        let mut m = Midas::new(Estimator::Rebuild, bench_params());
        let budget = 48 * MB;
        let ws = 32 * MB + 80 * 1024;
        let mut sims = vec![
            Sim::new(1, ws, 15_000.0, 8 * MB),
            Sim::new(2, ws, 110_000.0, 8 * MB),
            Sim::new(3, ws, 1_000_000.0, 8 * MB),
        ];
        let mut held = 0.0;
        let mut ungranted = 0u64;
        let mut cheap_vs_100us = [0u64; 2];
        let (mut whole_ws, mut most) = (0, 0);
        for round in 0..80 {
            let limits = step(&mut m, &mut sims, budget);
            if round >= 40 {
                whole_ws += u32::from(sims[2].held == ws);
                most = most.max(sims[2].limit);
                held += sims.iter().map(|s| s.held).sum::<u64>() as f64 / budget as f64 / 40.0;
                ungranted = ungranted.max(budget - limits.iter().sum::<u64>());
                cheap_vs_100us[0] += limits[0];
                cheap_vs_100us[1] += limits[1];
            }
        }
        // What the saturated 1 ms pool does not take goes to the better of the other two (a
        // move to a saturated pool would leave it idle; before, none was made at all).
        assert!(
            cheap_vs_100us[1] > 2 * cheap_vs_100us[0],
            "the 100 us pool had {} MiB-rounds, the cheap one {}",
            cheap_vs_100us[1] / MB,
            cheap_vs_100us[0] / MB
        );
        assert!(
            held >= 0.95,
            "the pools hold {held:.3} of the budget on average"
        );
        assert!(
            ungranted <= SEGMENT_BYTES,
            "a round left {} MiB ungranted",
            ungranted / MB
        );
        // (It is probed down, as a spare, one round in three: the 100 us pool needs an
        // up-probe that the cheap pool at its floor of 0 cannot give.)
        assert!(
            whole_ws >= 24,
            "the 1 ms pool held its working set {whole_ws} rounds of 40"
        );
        assert!(
            most <= whole_segments(ws),
            "the 1 ms pool's grant reached {} MiB, above the whole segments of its working set",
            most / MB
        );
    }

    /// Memory free again after pressure goes back at once to the pools the pressure cut, and
    /// they keep it while they refill; likewise after the daemon cut grants between rounds
    /// (that round measures the pressure, not the pools: no pool is judged saturated by it).
    /// Before: the grants climbed back by one move (8 MiB here) per pool per round, and a
    /// pool refilling below 90% of its grant for two rounds lost the rest.
    #[test]
    fn grants_climb_back_at_once_when_pressure_goes() {
        let mut m = Midas::new(Estimator::Rebuild, bench_params());
        let budget = 96 * MB;
        let mut sims = vec![
            Sim::new(1, 64 * MB, 20_000.0, 8 * MB),
            Sim::new(2, 64 * MB, 1_000_000.0, 8 * MB),
        ];
        for _ in 0..40 {
            step(&mut m, &mut sims, budget);
        }
        let before: u64 = sims.iter().map(|s| s.limit).sum();
        assert!(
            before >= budget - 2 * SEGMENT_BYTES,
            "settled at {}",
            before / MB
        );
        let expensive = sims[1].limit;
        for s in &mut sims {
            s.refill = 8 * MB;
        }
        // Pressure through the budget for three rounds, then gone.
        for _ in 0..3 {
            step(&mut m, &mut sims, 16 * MB);
        }
        let limits = step(&mut m, &mut sims, budget);
        assert!(
            limits.iter().sum::<u64>() >= before - 2 * SEGMENT_BYTES,
            "one round after the pressure: {:?} MiB",
            limits.iter().map(|l| l / MB).collect::<Vec<_>>()
        );
        for _ in 0..8 {
            step(&mut m, &mut sims, budget);
        }
        assert!(
            sims[1].limit >= expensive - 2 * SEGMENT_BYTES && sims[1].held >= sims[1].ws - 4 * MB,
            "refilled: the expensive pool holds {} MiB of a {} MiB grant (had {})",
            sims[1].held / MB,
            sims[1].limit / MB,
            expensive / MB
        );
        // The daemon cuts both grants between rounds (the budget the round sees is whole
        // again): the next round gives them back, and refilling they keep it.
        for s in &mut sims {
            s.run(4 * MB);
        }
        let limits = step(&mut m, &mut sims, budget);
        assert!(
            limits.iter().sum::<u64>() >= before - 2 * SEGMENT_BYTES,
            "one round after a cut: {:?} MiB",
            limits.iter().map(|l| l / MB).collect::<Vec<_>>()
        );
        for _ in 0..8 {
            step(&mut m, &mut sims, budget);
        }
        assert!(
            sims[1].limit >= expensive - 2 * SEGMENT_BYTES && sims[1].held >= sims[1].ws - 4 * MB,
            "after a cut: the expensive pool holds {} MiB of a {} MiB grant (had {})",
            sims[1].held / MB,
            sims[1].limit / MB,
            expensive / MB
        );
    }

    /// A saturated pool (it did not fill its up-probe) whose working set then grows fills
    /// the whole segments of its grant and misses: it is probed again and given more.
    #[test]
    fn a_saturated_pool_whose_working_set_grows_is_given_more() {
        let mut m = Midas::new(Estimator::Rebuild, bench_params());
        let budget = 96 * MB;
        let mut sims = vec![
            Sim::new(1, 200 * MB, 10_000.0, 8 * MB),
            Sim::new(2, 20 * MB, 1_000_000.0, 8 * MB),
        ];
        for _ in 0..40 {
            step(&mut m, &mut sims, budget);
        }
        assert!(sims[1].limit <= 22 * MB, "{} MiB", sims[1].limit / MB);
        sims[1].ws = 40 * MB;
        for _ in 0..30 {
            step(&mut m, &mut sims, budget);
        }
        assert!(
            sims[1].held >= 38 * MB,
            "the grown pool holds {} MiB of its 40 MiB working set",
            sims[1].held / MB
        );
    }

    /// A pool still filling (its first requests falling round by round) measured at its up
    /// point early and its down point later: counted in full, its rebuild cost fell although
    /// it held less, the slope came out negative and its utility zero (the 1 ms pool, starved
    /// in bench/midas.py). Only the rebuilds of what it evicted (victim hits) count: it values
    /// memory.
    #[test]
    fn first_requests_do_not_hide_what_memory_saves() {
        let mut m = Midas::new(Estimator::Rebuild, bench_params());
        let mut limits = [32 * MB, 32 * MB];
        for round in 0..6u64 {
            let views: Vec<PoolView> = (0..2)
                .map(|k| {
                    let mut v = pool(k as u64 + 1, limits[k], limits[k], 0, 0);
                    // First requests: 1000 in the first round, 200 fewer each round after.
                    let first = 1000u64.saturating_sub(200 * round);
                    // Misses of what it evicted: 10 fewer per MiB it holds.
                    let victims = 1000 - 10 * (limits[k] / MB);
                    v.delta.misses = first + victims;
                    v.delta.vhits = victims;
                    v.delta.hits = 10_000 - v.delta.misses;
                    v.delta.rebuild_ns = v.delta.misses * 1_000_000;
                    v
                })
                .collect();
            let d = m.round(&views, 64 * MB);
            limits = [limit(&d, 1), limit(&d, 2)];
        }
        assert!(
            m.utility(1).unwrap() > 0.0 && m.utility(2).unwrap() > 0.0,
            "utilities {:?} {:?}",
            m.utility(1),
            m.utility(2)
        );
    }

    /// A pool's utility is the median of its last three slopes near where it is: one wild pair
    /// does not move it, and slopes measured more than a move away are forgotten.
    #[test]
    fn the_utility_is_the_median_of_the_last_slopes_near_the_pool() {
        let mut v = Vec::new();
        assert_eq!(smoothed(&mut v, 10.0, 16 * MB, 8 * MB), 10.0);
        assert_eq!(smoothed(&mut v, 20.0, 16 * MB, 8 * MB), 15.0);
        assert_eq!(
            smoothed(&mut v, 1000.0, 18 * MB, 8 * MB),
            20.0,
            "one wild pair"
        );
        assert_eq!(
            smoothed(&mut v, 12.0, 16 * MB, 8 * MB),
            20.0,
            "the oldest went"
        );
        assert_eq!(v.len(), SLOPES_KEPT);
        // Far down the curve: the slopes measured up there no longer count.
        assert_eq!(smoothed(&mut v, 50.0, 4 * MB, 8 * MB), 50.0);
        assert_eq!(v, vec![(50.0, 4 * MB)]);
    }

    /// Two pools of the same worth whose measured rebuild cost per access is off by up to 30%
    /// either way each round (log-uniform in [1/1.3, 1.3]): the slope of a pair, a difference
    /// of two such points 4 MiB apart, swings by more than 10x, as the bench's storage pool's
    /// did (3.5 to 107 between consecutive pairs on a busy machine). Memory should stay about
    /// where it is, not go back and forth on each wild pair. Each pair's slope taken alone
    /// (the rule before): 264 MiB moved in 120 rounds, 21 reversals of direction.
    #[test]
    fn a_noisy_utility_series_does_not_move_memory_back_and_forth() {
        let mut m = Midas::new(Estimator::Rebuild, bench_params());
        let budget = 48 * MB;
        let ws = 64 * MB;
        let mut sims = [
            Sim::new(1, ws, 100_000.0, 24 * MB),
            Sim::new(2, ws, 100_000.0, 24 * MB),
        ];
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut noise = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let u = (rng >> 11) as f64 / (1u64 << 53) as f64;
            1.3f64.powf(2.0 * u - 1.0)
        };
        let (mut moved, mut reversals, mut last_dir) = (0u64, 0u32, 0i64);
        let mut prev = 24 * MB;
        for _ in 0..120 {
            let views: Vec<PoolView> = sims
                .iter()
                .map(|s| {
                    let mut v = s.view();
                    v.delta.rebuild_ns = (v.delta.rebuild_ns as f64 * noise()) as u64;
                    v
                })
                .collect();
            let d = m.round(&views, budget);
            let base = m.state[&1].base;
            let dir = (base as i64 - prev as i64).signum();
            if dir != 0 {
                moved += base.abs_diff(prev);
                if last_dir != 0 && dir != last_dir {
                    reversals += 1;
                }
                last_dir = dir;
            }
            prev = base;
            for s in sims.iter_mut() {
                s.run(limit(&d, s.id));
            }
        }
        eprintln!("moved {} MiB, {reversals} reversals", moved / MB);
        assert!(
            reversals <= 3 && moved <= 64 * MB,
            "memory went back and forth: {reversals} reversals, {} MiB moved in 120 rounds",
            moved / MB
        );
    }

    /// A utility measured more than one move away from where the pool is now is stale: no
    /// memory moves on it until the pool is probed again where it is.
    #[test]
    fn a_stale_estimate_moves_no_memory() {
        let decide = |measured_at: u64| {
            let mut m = Midas::new(Estimator::Rebuild, bench_params());
            let views = [
                pool(1, 24 * MB, 24 * MB, 1_000_000, 100),
                pool(2, 24 * MB, 24 * MB, 1_000_000, 100),
            ];
            m.round(&views, 48 * MB);
            for (id, utility, at) in [(1, 100.0, measured_at), (2, 10.0, 24 * MB)] {
                let st = m.state.get_mut(&id).unwrap();
                st.utility = utility;
                st.slopes = vec![(utility, at); SLOPES_TO_MOVE];
                st.measured = true;
                st.measured_at = at;
                st.base = 24 * MB;
                st.phase = 0;
                st.decided = 24 * MB;
            }
            let d = m.round(&views, 48 * MB);
            d.iter().find(|x| x.id == 1).unwrap().why.clone()
        };
        // Measured at 8 MiB, two moves below: nothing moves.
        assert!(!decide(8 * MB).starts_with("took"), "{}", decide(8 * MB));
        // Measured where it is: it takes from the other.
        assert!(decide(24 * MB).starts_with("took"), "{}", decide(24 * MB));
    }

    /// A slope measured at a small pool is its curve's steepest part: the pool grows by at
    /// most half its grant (a probe at least) per move, where a whole `move_max` once took the
    /// bench's storage pool from 0 to 10 MiB and back, again and again. A large pool still
    /// takes a whole move.
    #[test]
    fn a_small_pool_grows_by_half_its_grant_a_move() {
        let taken = |small: u64| {
            let mut m = Midas::new(Estimator::Rebuild, bench_params());
            let budget = 48 * MB;
            let views = [
                pool(1, small, small, 1_000_000, 100),
                pool(2, budget - small, budget - small, 1_000_000, 100),
            ];
            m.round(&views, budget);
            for (id, utility, at) in [(1, 100.0, small), (2, 10.0, budget - small)] {
                let st = m.state.get_mut(&id).unwrap();
                st.utility = utility;
                st.slopes = vec![(utility, at); SLOPES_TO_MOVE];
                st.measured = true;
                st.measured_at = at;
                st.base = at;
                st.phase = 0;
                st.decided = at;
            }
            let d = m.round(&views, budget);
            let why = d.iter().find(|x| x.id == 1).unwrap().why.clone();
            assert!(why.starts_with("took"), "{why}");
            m.state[&1].base - small
        };
        // At 4 MiB: half its grant, 2 MiB (not the 8 of a whole move).
        assert_eq!(taken(4 * MB), 2 * MB);
        // At 6 MiB: half is 3 MiB, in whole segments 2 (a grant of 9 MiB would hold 8).
        assert_eq!(taken(6 * MB), 2 * MB);
        // At 12 MiB: 6.
        assert_eq!(taken(12 * MB), 6 * MB);
        // At 2 MiB (and below): a probe, 2 MiB.
        assert_eq!(taken(2 * MB), 2 * MB);
        // At 24 MiB: a whole move.
        assert_eq!(taken(24 * MB), 8 * MB);
    }

    #[test]
    fn victim_penalty_grows_the_pool_with_costly_victim_hits() {
        let mut m = Midas::new(Estimator::VictimPenalty, params());
        let mut limits = [48 * MB, 48 * MB];
        for _ in 0..10 {
            let a = pool(1, limits[0], limits[0], 1_000_000, 500); // cheap misses
            let b = pool(2, limits[1], limits[1], 100_000_000, 500); // 100x the penalty
            let d = m.round(&[a, b], 96 * MB);
            limits = [limit(&d, 1), limit(&d, 2)];
            assert!(limits.iter().sum::<u64>() <= 96 * MB);
        }
        assert!(limits[1] > limits[0], "{limits:?}");
    }

    #[test]
    fn cliffhanger_follows_hit_gradient_not_cost() {
        let mut c = Cliffhanger { params: params() };
        let mut limits = [48 * MB, 48 * MB];
        for _ in 0..4 {
            // Pool 1: many cheap victim hits; pool 2: few, expensive ones.
            let a = pool(1, limits[0], limits[0], 1_000, 5000);
            let b = pool(2, limits[1], limits[1], 1_000_000_000, 50);
            let d = c.round(&[a, b], 96 * MB);
            limits = [limit(&d, 1), limit(&d, 2)];
        }
        assert_eq!(limits, [80 * MB, 16 * MB]);
    }

    #[test]
    fn a_shrinking_budget_is_taken_from_the_lowest_utility_first() {
        let mut c = Cliffhanger { params: params() };
        let a = pool(1, 64 * MB, 64 * MB, 0, 10);
        let b = pool(2, 64 * MB, 64 * MB, 0, 1000);
        let d = c.round(&[a, b], 80 * MB);
        assert_eq!(limit(&d, 1), 16 * MB);
        assert_eq!(limit(&d, 2), 64 * MB);
    }

    #[test]
    fn policy_names_parse_with_a_clear_error() {
        assert_eq!("midas".parse::<PolicyKind>(), Ok(PolicyKind::Midas));
        let e = "lru".parse::<PolicyKind>().unwrap_err();
        assert!(e.contains("midas-victim"), "{e}");
    }
}
