//! The access scan's reference bits in the simulator: `referenced` records (what the engine's
//! scan saw written) reach the eviction policy as `Touch::Scanned`, are not references, and let
//! an order that uses them keep a hot set resident under a stream of pages used once.

use gleaner_policy::evict::{EvictKind, Visibility};
use gleaner_policy::prefetch::NoPrefetch;
use gleaner_policy::sim::{simulate, SimConfig, SimResult};
use gleaner_policy::trace::{Kind, Record};

const CAPACITY: usize = 400;
const HOT: u64 = 100;
const STREAM_PER_ROUND: u64 = 150;
const ROUNDS: u64 = 40;

/// Each round: every hot page accessed, then (with `scans`) a scan reporting the hot pages
/// written, then `STREAM_PER_ROUND` pages never seen before.
fn trace(scans: bool) -> Vec<Record> {
    let mut out = Vec::new();
    let mut t = 0;
    let mut push = |page, kind| {
        t += 1;
        out.push(Record {
            time_ns: t,
            page,
            tid: 1,
            kind,
        });
    };
    let mut cold = 1_000_000;
    for _ in 0..ROUNDS {
        for p in 0..HOT {
            push(p, Kind::Access);
        }
        if scans {
            for p in 0..HOT {
                push(p, Kind::Referenced);
            }
        }
        for _ in 0..STREAM_PER_ROUND {
            push(cold, Kind::Access);
            cold += 1;
        }
    }
    out
}

fn replay(kind: EvictKind, scans: bool) -> SimResult {
    let records = trace(scans);
    let mut p = kind.build(CAPACITY, Visibility::Fault, None).unwrap();
    simulate(
        &records,
        &mut NoPrefetch,
        p.as_mut(),
        &SimConfig::new(CAPACITY),
    )
}

#[test]
fn referenced_records_are_reference_bits_not_references() {
    let with = replay(EvictKind::Fifo, true);
    let without = replay(EvictKind::Fifo, false);
    assert_eq!(with.references, without.references);
    assert_eq!(with.references, ROUNDS * (HOT + STREAM_PER_ROUND));
    // FIFO ignores them: the same misses either way.
    assert_eq!(with.misses, without.misses);
    assert!(with.scan_referenced > 0 && without.scan_referenced == 0);
}

/// `kind`, given the scan's bits, keeps the hot pages resident: at most two misses per hot page
/// beyond the misses no order avoids, where an order blind to accesses (FIFO) shows what the
/// stream does to them: pushed out round after round.
fn keeps_the_hot_set_with_the_scans_bits(kind: EvictKind) {
    let cold_misses = ROUNDS * STREAM_PER_ROUND + HOT;
    let blind = replay(EvictKind::Fifo, true);
    assert!(
        blind.misses >= cold_misses + (ROUNDS / 4) * HOT,
        "fifo: {} misses",
        blind.misses
    );
    let with = replay(kind, true);
    assert!(with.scan_referenced >= (ROUNDS - 2) * HOT);
    assert!(
        with.misses <= cold_misses + 2 * HOT,
        "{kind} with the bits: {} misses against {cold_misses} that no order avoids",
        with.misses
    );
}

#[test]
fn clock_keeps_a_hot_set_resident_with_the_scans_reference_bits() {
    // (The simulator's clock without the bits would sample accesses by unmapping pages, at a
    // minor fault each: the engine does not unmap.)
    keeps_the_hot_set_with_the_scans_bits(EvictKind::Clock);
}

#[test]
fn active_inactive_keeps_a_hot_set_resident_with_the_scans_reference_bits() {
    // The hot pages are seen written at every scan: activated after two, they stay.
    keeps_the_hot_set_with_the_scans_bits(EvictKind::Active);
}

#[test]
fn frequency_keeps_a_hot_set_resident_with_the_scans_reference_bits() {
    // The hot pages are seen written at every scan: counted each time, they climb above the
    // stream's level and stay.
    keeps_the_hot_set_with_the_scans_bits(EvictKind::Frequency);
}
