//! Which pools probe this round, and in which direction: pure decisions for the Midas policy
//! ([`crate::policy::Midas`]).
//!
//! The dissertation probes every pool by `+-probe` bytes each round, alternately, to measure
//! the slope of its rebuild cost. Probing every pool independently lets the probes of a round
//! add up to anything between `-n * probe` and `+n * probe`: with an odd number of pools one
//! probe in every other round has no counterpart, and the budget is then either overrun (and
//! the policy's fit cuts some pool's probe, which then measures nothing) or left partly idle.
//! Here probes come in pairs instead: one pool up by `s` bytes and another down by the same
//! `s`, so a round's probes move memory between pools and never change the sum of the grants.
//! A pool left without a partner (an odd count) sits the round out; the pools that waited
//! longest are paired first, so each is probed at least every other round.

use crate::shared::SEGMENT_BYTES;

/// The direction a pool's estimate needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// It has a measurement below its grant and needs one above.
    Up,
    /// It has a measurement above its grant and needs one below.
    Down,
    /// It needs both (a new pair of measurements).
    Either,
}

/// A pool that may probe this round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prober {
    /// The caller's index of the pool.
    pub index: usize,
    /// What its estimate needs.
    pub want: Want,
    /// How far it may go up (its probe size, its ceiling permitting), whole segments.
    pub up_room: u64,
    /// How far it may go down (its probe size, its floor permitting), whole segments.
    pub down_room: u64,
    /// Rounds since it last probed: the longest waiting are paired first.
    pub waited: u32,
    /// Its pair of measurements has been open for a while: if nothing else pairs it the way it
    /// wants, a spare goes down for it.
    pub stuck: bool,
    /// A pool that is not probed for itself (it holds all it uses: saturated), which may go
    /// down by a probe for a stuck pool that needs an up-probe and has no other partner.
    pub spare: bool,
}

/// One pair of probes: `up` gains `bytes`, `down` loses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair {
    /// The index of the pool probed up.
    pub up: usize,
    /// The index of the pool probed down.
    pub down: usize,
    /// The probe, bytes (whole segments, at least one).
    pub bytes: u64,
}

fn can_up(p: &Prober, strict: bool) -> bool {
    !(strict && p.want == Want::Down) && p.up_room >= SEGMENT_BYTES
}

fn can_down(p: &Prober, strict: bool) -> bool {
    !(strict && p.want == Want::Up) && p.down_room >= SEGMENT_BYTES
}

/// Pairs `probers` (in the order given, which breaks ties; the caller rotates it round by
/// round) so that every pair moves memory from one pool to another: the pool that waited
/// longest first, with the first later one that can go the other way. A pool that wants
/// either direction goes the way its partner does not need. Then a stuck pool that needs an
/// up-probe is paired with a spare going down (spares pair with nothing else). Pools still
/// left without a partner are then paired against what they want (the measurement they have
/// in that direction is taken again): two pools that both need an up-probe, where no pool can
/// go down for them, would otherwise wait for each other for good. The probe of a pair is the
/// smaller of the two rooms, in whole segments.
pub fn pair(probers: &[Prober]) -> Vec<Pair> {
    let mut order: Vec<usize> = (0..probers.len()).collect();
    // Stable: among equal waits the caller's order stands.
    order.sort_by_key(|&i| std::cmp::Reverse(probers[i].waited));
    // Spares are never paired among the others.
    let mut taken: Vec<bool> = probers.iter().map(|p| p.spare).collect();
    let mut spare_used = vec![false; probers.len()];
    let mut pairs = Vec::new();
    let make = |up: usize, down: usize| Pair {
        up: probers[up].index,
        down: probers[down].index,
        bytes: probers[up].up_room.min(probers[down].down_room) / SEGMENT_BYTES * SEGMENT_BYTES,
    };
    for pass in 0..3 {
        if pass == 1 {
            // A stuck pool that needs an up-probe, with a spare going down.
            for &i in &order {
                let a = &probers[i];
                if taken[i] || !a.stuck || a.want != Want::Up || a.up_room < SEGMENT_BYTES {
                    continue;
                }
                let spare = order.iter().copied().find(|&j| {
                    probers[j].spare && !spare_used[j] && probers[j].down_room >= SEGMENT_BYTES
                });
                if let Some(j) = spare {
                    taken[i] = true;
                    spare_used[j] = true;
                    pairs.push(make(i, j));
                }
            }
            continue;
        }
        let strict = pass == 0;
        for (pos, &i) in order.iter().enumerate() {
            if taken[i] {
                continue;
            }
            let a = &probers[i];
            let partner = order[pos + 1..].iter().copied().find_map(|j| {
                if taken[j] {
                    return None;
                }
                let b = &probers[j];
                // The first goes up if it can and its partner can go down; else down.
                if can_up(a, strict) && can_down(b, strict) {
                    Some((j, true))
                } else if can_down(a, strict) && can_up(b, strict) {
                    Some((j, false))
                } else {
                    None
                }
            });
            let Some((j, a_up)) = partner else { continue };
            taken[i] = true;
            taken[j] = true;
            pairs.push(if a_up { make(i, j) } else { make(j, i) });
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: u64 = SEGMENT_BYTES;

    fn p(index: usize, want: Want, waited: u32) -> Prober {
        Prober {
            index,
            want,
            up_room: 2 * SEG,
            down_room: 2 * SEG,
            waited,
            stuck: false,
            spare: false,
        }
    }

    fn net(pairs: &[Pair], n: usize) -> Vec<i64> {
        let mut d = vec![0i64; n];
        for x in pairs {
            d[x.up] += x.bytes as i64;
            d[x.down] -= x.bytes as i64;
        }
        d
    }

    #[test]
    fn three_pools_make_one_pair_and_the_probes_sum_to_zero() {
        let pairs = pair(&[
            p(0, Want::Either, 0),
            p(1, Want::Either, 0),
            p(2, Want::Either, 0),
        ]);
        assert_eq!(pairs.len(), 1, "{pairs:?}");
        assert_eq!(net(&pairs, 3).iter().sum::<i64>(), 0);
        assert_eq!(pairs[0].bytes, 2 * SEG);
    }

    #[test]
    fn each_pool_gets_the_direction_it_needs() {
        // 0 needs down, 1 needs up: 1 goes up and 0 down, whatever the order.
        let pairs = pair(&[p(0, Want::Down, 0), p(1, Want::Up, 0)]);
        assert_eq!(
            pairs,
            vec![Pair {
                up: 1,
                down: 0,
                bytes: 2 * SEG
            }]
        );
        // An either-way pool goes the way its partner does not need.
        let pairs = pair(&[p(0, Want::Either, 0), p(1, Want::Down, 0)]);
        assert_eq!(
            pairs,
            vec![Pair {
                up: 0,
                down: 1,
                bytes: 2 * SEG
            }]
        );
        let pairs = pair(&[p(0, Want::Either, 0), p(1, Want::Up, 0)]);
        assert_eq!(
            pairs,
            vec![Pair {
                up: 1,
                down: 0,
                bytes: 2 * SEG
            }]
        );
    }

    #[test]
    fn two_pools_that_need_the_same_direction_still_pair() {
        // Both need an up-probe: one of them goes down (taking its lower point again), or
        // neither would ever probe again (seen in bench/midas.py: a pool at its floor of 0,
        // which cannot go down, and another that needed its up-probe).
        let pairs = pair(&[p(0, Want::Up, 0), p(1, Want::Up, 0)]);
        assert_eq!(pairs.len(), 1, "{pairs:?}");
        let mut floor = p(0, Want::Either, 0);
        floor.down_room = 0;
        assert_eq!(
            pair(&[floor, p(1, Want::Up, 0)]),
            vec![Pair {
                up: 0,
                down: 1,
                bytes: 2 * SEG
            }]
        );
        // A pair that fits what both want is still preferred.
        let pairs = pair(&[p(0, Want::Up, 0), p(1, Want::Up, 0), p(2, Want::Down, 0)]);
        assert_eq!(
            pairs,
            vec![Pair {
                up: 0,
                down: 2,
                bytes: 2 * SEG
            }]
        );
    }

    #[test]
    fn the_longest_waiting_pool_is_paired_first() {
        // Pool 2 sat out last round: it is paired now, and one of the others waits.
        let pairs = pair(&[
            p(0, Want::Down, 0),
            p(1, Want::Up, 0),
            p(2, Want::Either, 1),
        ]);
        assert_eq!(pairs.len(), 1);
        assert!(pairs[0].up == 2 || pairs[0].down == 2, "{pairs:?}");
    }

    #[test]
    fn a_pair_probes_by_the_smaller_room_in_whole_segments() {
        let mut a = p(0, Want::Either, 0);
        a.up_room = 3 * SEG;
        let mut b = p(1, Want::Either, 0);
        b.down_room = SEG;
        assert_eq!(
            pair(&[a, b]),
            vec![Pair {
                up: 0,
                down: 1,
                bytes: SEG
            }]
        );
        // A pool that cannot go down (at its floor) goes up, or does not pair.
        b.down_room = 0;
        assert_eq!(
            pair(&[a, b]),
            vec![Pair {
                up: 1,
                down: 0,
                bytes: 2 * SEG
            }]
        );
        a.down_room = 0;
        assert!(pair(&[a, b]).is_empty());
    }

    /// Rounds of the policy's rotation: with three pools every pool completes probe pairs
    /// (an up and a down) regularly, and no round moves the sum of the grants.
    #[test]
    fn over_rounds_every_pool_is_probed_both_ways() {
        let n = 3;
        let mut up = [false; 3];
        let mut down = [false; 3];
        let mut waited = [0u32; 3];
        let mut completed = [0u32; 3];
        for round in 0..12 {
            let probers: Vec<Prober> = (0..n)
                .map(|k| (k + round) % n)
                .map(|k| {
                    let want = match (up[k], down[k]) {
                        (true, false) => Want::Down,
                        (false, true) => Want::Up,
                        _ => Want::Either,
                    };
                    p(k, want, waited[k])
                })
                .collect();
            let pairs = pair(&probers);
            assert_eq!(net(&pairs, n).iter().sum::<i64>(), 0);
            let mut probed = [false; 3];
            for x in &pairs {
                up[x.up] = true;
                down[x.down] = true;
                probed[x.up] = true;
                probed[x.down] = true;
            }
            for k in 0..n {
                waited[k] = if probed[k] { 0 } else { waited[k] + 1 };
                assert!(waited[k] <= 1, "pool {k} waited {} rounds", waited[k]);
                if up[k] && down[k] {
                    completed[k] += 1;
                    up[k] = false;
                    down[k] = false;
                }
            }
        }
        assert!(completed.iter().all(|&c| c >= 3), "{completed:?}");
    }

    /// Seen in bench/midas.py: the 1 ms pool needed an up-probe, its only partner was a pool
    /// at its floor of 0 (which can only go up) and the third pool was saturated: the 1 ms
    /// pool was probed down again and again, never up, and its estimate never changed. Stuck,
    /// it is paired with the saturated pool going down.
    #[test]
    fn a_stuck_pool_gets_its_up_probe_from_a_spare() {
        let mut floor = p(0, Want::Either, 0);
        floor.down_room = 0;
        let mut stuck = p(1, Want::Up, 0);
        stuck.stuck = true;
        let mut spare = p(2, Want::Down, 3);
        spare.spare = true;
        let pairs = pair(&[floor, stuck, spare]);
        assert_eq!(
            pairs,
            vec![Pair {
                up: 1,
                down: 2,
                bytes: 2 * SEG
            }]
        );
        // Not stuck yet: the spare stays out of it (the pool takes its lower point again).
        stuck.stuck = false;
        let pairs = pair(&[floor, stuck, spare]);
        assert_eq!(
            pairs,
            vec![Pair {
                up: 0,
                down: 1,
                bytes: 2 * SEG
            }]
        );
        // A spare never pairs with a pool that is not stuck, nor goes up.
        let pairs = pair(&[p(0, Want::Either, 0), spare]);
        assert!(pairs.is_empty(), "{pairs:?}");
    }
}
