//! Pure arbitration of local memory between far-memory programs with elastic budgets (`gleaner
//! run --local-mem FLOOR..CEILING`) and the soft pools taken together (issue 46, "one arbiter
//! for local memory").
//!
//! Every claimant's utility is the time it loses per second for want of memory: for a program,
//! its far-fault rate times its mean fault cost; for the soft pools, the time their
//! reconstructors spent per second. Both are nanoseconds lost per second, so they compare
//! directly. Each round:
//!
//! 1. every grant is clamped to its claimant's floor..ceiling;
//! 2. if the grants exceed the total (pressure, or a new floor), the claimants losing least give
//!    first, down to their floors (floors are the user's promise and stay, even over the total);
//! 3. memory left over goes to the claimants that lose time, the one losing most first, up to
//!    its ceiling;
//! 4. then memory moves from the claimant losing least to the one losing most, at most `step`
//!    bytes per pair, only where the gainer loses at least `gap` times as much as the giver and
//!    at least `min_loss` ns/s more (anti-oscillation: noise and near-equal losses move nothing).
//!
//! A claimant whose grant was lowered gives its memory back over time (a pager evicts in the
//! background): until then it still `holds` more than its grant. Growth (steps 3 and 4) comes
//! only out of memory nobody holds, `total - sum(max(grant, holds))`, so the grants and what is
//! really held never exceed the total together; a giver's grant falls at once, and the gainer's
//! rises as the memory comes free, at the next rounds.
//!
//! No I/O here: the daemon (`daemon.rs`) gathers the counters and applies the grants.

use serde::Serialize;

/// One claimant's state at the end of a round.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimant {
    /// Who (a registration id; the daemon uses 0 for the soft pools taken together).
    pub id: u64,
    /// The least it is granted (bytes), whatever the pressure.
    pub floor: u64,
    /// The most it may be granted (bytes).
    pub ceiling: u64,
    /// Its grant during the round that ended (bytes).
    pub grant: u64,
    /// What it may still hold (bytes): its grant, or more while it shrinks to a lowered one.
    pub holds: u64,
    /// Time it lost per second for want of memory over the round, ns/s.
    pub loss: f64,
}

/// The arbitration's tunables.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// The most one round moves between two claimants, bytes.
    pub step: u64,
    /// The gainer must lose at least this many times as much as the giver.
    pub gap: f64,
    /// ... and at least this many ns/s more (10 ms/s: a program stalled 1% of its time; at
    /// 1 ms/s, a program whose working set fitted took memory from a busy one on noise, which
    /// then lost far more than it had gained: `bench/results/elastic/README.md`).
    pub min_loss: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            step: 256 << 20,
            gap: 1.5,
            min_loss: 1e7,
        }
    }
}

/// One claimant's next grant and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Grant {
    /// Who.
    pub id: u64,
    /// The next grant, bytes.
    pub grant: u64,
    /// Why it changed (empty when it did not).
    pub why: String,
}

/// A far-memory program's utility over a round: `faults` far faults in `secs` seconds at a mean
/// cost of `cost_ns` each, in ns lost per second.
pub fn fault_loss(faults: u64, cost_ns: f64, secs: f64) -> f64 {
    if secs <= 0.0 || !cost_ns.is_finite() {
        return 0.0;
    }
    faults as f64 * cost_ns.max(0.0) / secs
}

/// The claimants' indices, the one losing least first.
fn by_loss_asc(claimants: &[Claimant]) -> Vec<usize> {
    let mut o: Vec<usize> = (0..claimants.len()).collect();
    o.sort_by(|&a, &b| claimants[a].loss.total_cmp(&claimants[b].loss));
    o
}

/// Steps 1 and 2 of a round: grants clamped to floor..ceiling, then, over `total`, the
/// claimants losing least give first, down to their floors. Returns the grants and why each
/// changed.
fn clamp_and_shed(claimants: &[Claimant], total: u64, order: &[usize]) -> (Vec<u64>, Vec<String>) {
    let mut g: Vec<u64> = claimants
        .iter()
        .map(|c| c.grant.clamp(c.floor, c.ceiling.max(c.floor)))
        .collect();
    let mut why: Vec<String> = vec![String::new(); claimants.len()];
    let mut over = g.iter().sum::<u64>().saturating_sub(total);
    for &i in order {
        if over == 0 {
            break;
        }
        let give = (g[i] - claimants[i].floor).min(over);
        if give > 0 {
            g[i] -= give;
            over -= give;
            why[i] = format!("over the total by {} MiB: gave back", give >> 20);
        }
    }
    (g, why)
}

/// Between rounds, under pressure: only steps 1 and 2 (nothing grows), so that grants over
/// `total` come down at once rather than at the next round. Same order and form as
/// [`arbitrate`].
pub fn shed(claimants: &[Claimant], total: u64) -> Vec<Grant> {
    let (g, why) = clamp_and_shed(claimants, total, &by_loss_asc(claimants));
    grants(claimants, g, why)
}

fn grants(claimants: &[Claimant], g: Vec<u64>, why: Vec<String>) -> Vec<Grant> {
    claimants
        .iter()
        .zip(g)
        .zip(why)
        .map(|((c, grant), why)| Grant {
            id: c.id,
            grant,
            why: if grant == c.grant { String::new() } else { why },
        })
        .collect()
}

/// The next grants for `claimants` (in the same order) within `total` bytes.
pub fn arbitrate(claimants: &[Claimant], total: u64, p: &Params) -> Vec<Grant> {
    let n = claimants.len();
    let by_loss_asc = by_loss_asc(claimants);
    // 1, 2. Clamped; over the total, the cheapest give first, down to their floors.
    let (mut g, mut why) = clamp_and_shed(claimants, total, &by_loss_asc);
    // What nobody holds: growth comes only out of it.
    let held = |i: usize, gi: u64| gi.max(claimants[i].holds);
    let mut free = total.saturating_sub((0..n).map(|i| held(i, g[i])).sum());
    // 3. Idle memory to those losing time, most first.
    for &i in by_loss_asc.iter().rev() {
        if free == 0 || claimants[i].loss < p.min_loss {
            break;
        }
        let take = claimants[i].ceiling.saturating_sub(g[i]).min(free);
        if take > 0 {
            g[i] += take;
            free -= take;
            why[i] = format!(
                "idle memory: +{} MiB (losing {:.1} ms/s)",
                take >> 20,
                claimants[i].loss / 1e6
            );
        }
    }
    // 4. Moves from the least to the most losing, pairwise.
    let mut gainers: Vec<usize> = by_loss_asc.iter().rev().copied().collect();
    gainers.retain(|&i| g[i] < claimants[i].ceiling);
    let mut givers: Vec<usize> = by_loss_asc.clone();
    givers.retain(|&i| g[i] > claimants[i].floor);
    let mut used = vec![false; n];
    for &hi in &gainers {
        if used[hi] {
            continue;
        }
        let Some(&lo) = givers
            .iter()
            .find(|&&lo| lo != hi && !used[lo] && claimants[lo].loss < claimants[hi].loss)
        else {
            break;
        };
        let (h, l) = (&claimants[hi], &claimants[lo]);
        if h.loss < l.loss * p.gap || h.loss - l.loss < p.min_loss {
            continue;
        }
        let m = p.step.min(h.ceiling - g[hi]).min(g[lo] - l.floor);
        if m == 0 {
            continue;
        }
        let before = held(lo, g[lo]);
        g[lo] -= m;
        free += before - held(lo, g[lo]);
        // The gainer gets what is free now; the rest comes free as the giver shrinks.
        let got = m.min(free);
        g[hi] += got;
        free -= got;
        used[hi] = true;
        used[lo] = true;
        why[hi] = format!(
            "+{} MiB from {} (losing {:.1} ms/s vs {:.1})",
            got >> 20,
            l.id,
            h.loss / 1e6,
            l.loss / 1e6
        );
        why[lo] = format!(
            "-{} MiB to {} (losing {:.1} ms/s vs {:.1})",
            m >> 20,
            h.id,
            l.loss / 1e6,
            h.loss / 1e6
        );
    }
    grants(claimants, g, why)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn c(id: u64, floor: u64, ceiling: u64, grant: u64, loss_ms: f64) -> Claimant {
        Claimant {
            id,
            floor: floor * MIB,
            ceiling: ceiling * MIB,
            grant: grant * MIB,
            holds: grant * MIB,
            loss: loss_ms * 1e6,
        }
    }

    fn grants(cs: &[Claimant], total: u64, p: &Params) -> Vec<u64> {
        arbitrate(cs, total * MIB, p)
            .iter()
            .map(|g| g.grant / MIB)
            .collect()
    }

    fn step(mib: u64) -> Params {
        Params {
            step: mib * MIB,
            ..Params::default()
        }
    }

    #[test]
    fn the_one_faulting_more_is_granted_more() {
        let cs = [c(1, 64, 512, 256, 200.0), c(2, 64, 512, 256, 5.0)];
        // The giver's grant falls at once; the gainer's rises once the giver let the memory go.
        let g = arbitrate(&cs, 512 * MIB, &step(64));
        assert_eq!((g[0].grant / MIB, g[1].grant / MIB), (256, 192));
        assert!(g[1].why.contains("-64 MiB to 1"), "{:?}", g[1]);
        let mut next = cs.clone();
        next[1].grant = 192 * MIB;
        next[1].holds = 192 * MIB;
        assert_eq!(grants(&next, 512, &step(64)), vec![320, 128]);
        // Repeated rounds with the same losses end at the floor and the ceiling's bounds.
        let mut cs = cs.to_vec();
        for _ in 0..20 {
            let g = arbitrate(&cs, 512 * MIB, &step(64));
            for (c, g) in cs.iter_mut().zip(g) {
                c.grant = g.grant;
                c.holds = g.grant;
            }
        }
        assert_eq!((cs[0].grant / MIB, cs[1].grant / MIB), (448, 64));
    }

    #[test]
    fn grants_stay_within_floor_and_ceiling() {
        // A grant outside its range (a stale one) is clamped; nothing goes above a ceiling even
        // with idle memory, nor below a floor even over the total.
        let cs = [c(1, 100, 200, 300, 500.0), c(2, 100, 200, 10, 500.0)];
        let g = grants(&cs, 1000, &step(64));
        assert_eq!(g, vec![200, 200]);
        let g = grants(&cs, 50, &step(64));
        assert_eq!(g, vec![100, 100], "floors stay even over the total");
    }

    #[test]
    fn over_the_total_the_least_losing_give_first() {
        let cs = [c(1, 0, 512, 300, 100.0), c(2, 0, 512, 300, 1.0)];
        assert_eq!(grants(&cs, 400, &step(0)), vec![300, 100]);
    }

    #[test]
    fn idle_memory_goes_to_the_most_losing_first_and_none_to_the_idle() {
        let cs = [
            c(1, 64, 256, 64, 10.0),
            c(2, 64, 256, 64, 100.0),
            c(3, 64, 256, 64, 0.0),
        ];
        assert_eq!(grants(&cs, 512, &step(0)), vec![192, 256, 64]);
    }

    #[test]
    fn near_equal_or_tiny_losses_move_nothing() {
        let p = step(64);
        // 1.2x apart: under the gap.
        let cs = [c(1, 0, 512, 256, 120.0), c(2, 0, 512, 256, 100.0)];
        assert_eq!(grants(&cs, 512, &p), vec![256, 256]);
        // Far apart in ratio but both under 10 ms a second: noise.
        let cs = [c(1, 0, 512, 256, 0.5), c(2, 0, 512, 256, 0.001)];
        assert_eq!(grants(&cs, 512, &p), vec![256, 256]);
        for g in arbitrate(&cs, 512 * MIB, &p) {
            assert!(g.why.is_empty(), "{g:?}");
        }
    }

    #[test]
    fn a_giver_at_its_floor_gives_nothing_and_each_pair_moves_once() {
        let p = step(64);
        let cs = [
            c(1, 0, 512, 128, 300.0),
            c(2, 0, 512, 128, 200.0),
            c(3, 128, 512, 128, 0.0),
            c(4, 0, 512, 128, 1.0),
        ];
        // 3 is at its floor: 4 gives (to 1, as it lets the memory go); 2 finds no other giver.
        let g = arbitrate(&cs, 512 * MIB, &p);
        assert_eq!(
            g.iter().map(|g| g.grant / MIB).collect::<Vec<_>>(),
            vec![128, 128, 128, 64]
        );
        assert!(g[3].why.contains("to 1"), "{:?}", g[3]);
    }

    #[test]
    fn a_giver_still_shrinking_gives_only_what_it_let_go() {
        let p = step(64);
        // 2 was lowered from 256 to 192 MiB but still holds 256: 1 gets nothing yet, 2's grant
        // falls on, and grants plus holdings stay within 512.
        let mut cs = [c(1, 0, 512, 256, 300.0), c(2, 0, 512, 192, 1.0)];
        cs[1].holds = 256 * MIB;
        assert_eq!(grants(&cs, 512, &p), vec![256, 128]);
        // Once it holds its grant, the memory it let go goes to 1 (as idle memory), and the
        // next step moves what is free at once.
        cs[1].holds = 192 * MIB;
        assert_eq!(grants(&cs, 512, &p), vec![320, 128]);
        // Part of it let go: 1 gets that part now.
        cs[1].holds = 224 * MIB;
        assert_eq!(grants(&cs, 512, &p), vec![288, 128]);
    }

    #[test]
    fn shedding_between_rounds_only_lowers_the_least_losing_first() {
        // 700 MiB granted, 400 allowed: the least losing (2) gives down to its floor (100),
        // then the next (1) gives the rest; the most losing keeps its grant.
        let cs = [
            c(1, 100, 400, 300, 5.0),
            c(2, 100, 400, 300, 1.0),
            c(3, 50, 200, 100, 50.0),
        ];
        let g: Vec<u64> = shed(&cs, 400 * MIB).iter().map(|g| g.grant / MIB).collect();
        assert_eq!(g, [200, 100, 100]);
        let why = shed(&cs, 400 * MIB);
        assert!(why[1].why.contains("gave back"), "{why:?}");
        assert_eq!(why[2].why, "");
        // Under the total nothing moves, losses or not (growth waits for a round).
        let g: Vec<u64> = shed(&cs, 2000 * MIB)
            .iter()
            .map(|g| g.grant / MIB)
            .collect();
        assert_eq!(g, [300, 300, 100]);
        // Floors stay even over the total.
        let g: Vec<u64> = shed(&cs, 10 * MIB).iter().map(|g| g.grant / MIB).collect();
        assert_eq!(g, [100, 100, 50]);
    }

    #[test]
    fn fault_loss_is_rate_times_cost() {
        assert_eq!(fault_loss(1000, 50_000.0, 2.0), 25e6);
        assert_eq!(fault_loss(1000, 50_000.0, 0.0), 0.0);
        assert_eq!(fault_loss(10, f64::NAN, 1.0), 0.0);
    }
}
