//! RackMem against exact LRU (and FIFO, Belady) on a Zipf trace and on a loop larger than the
//! cache. The numbers are printed (`--nocapture`); the assertions are what must hold, plus the
//! issue's target on the deterministic Zipf trace.

use gleaner_policy::evict::{EvictKind, Visibility};
use gleaner_policy::prefetch::PrefetcherKind;
use gleaner_policy::sim::{self, SimConfig, SimResult};
use gleaner_policy::trace::synth::{generate, Pattern, SynthConfig};

fn rows(pattern: Pattern, pages: u64, accesses: u64, capacity: usize) -> Vec<SimResult> {
    let t = generate(&SynthConfig::new(pattern, pages, accesses));
    let combos = sim::combos(
        &[PrefetcherKind::None],
        &EvictKind::all(),
        &[Visibility::Fault, Visibility::Oracle],
    );
    let rows = sim::run_all(&t, &SimConfig::new(capacity), &combos, 4);
    for r in &rows {
        println!(
            "{pattern} cap {capacity}: {:<8} {:<6} misses {:>7} minor {:>6}",
            r.evict,
            r.visibility.to_string(),
            r.misses,
            r.minor_faults
        );
    }
    rows
}

fn get<'a>(rows: &'a [SimResult], evict: &str, vis: Visibility) -> &'a SimResult {
    rows.iter()
        .find(|r| r.evict == evict && (r.visibility == vis || evict != "rackmem"))
        .expect("row present")
}

#[test]
fn rackmem_vs_lru_on_zipf() {
    let rows = rows(Pattern::Zipf(0.99), 20_000, 200_000, 7_000);
    let lru = get(&rows, "lru", Visibility::Oracle).misses;
    let fifo = get(&rows, "fifo", Visibility::Fault).misses;
    let belady = get(&rows, "belady", Visibility::Oracle).misses;
    for vis in [Visibility::Fault, Visibility::Oracle] {
        let r = get(&rows, "rackmem", vis);
        println!(
            "zipf: rackmem/{vis} = {:.3} x LRU, FIFO = {:.3} x LRU",
            r.misses as f64 / lru as f64,
            fifo as f64 / lru as f64
        );
        assert!(r.misses >= belady && r.misses >= r.cold_misses);
        // The free list's second chance must beat plain insertion order.
        assert!(r.misses < fifo, "{vis}: {} vs FIFO {fifo}", r.misses);
    }
    // The target, on this deterministic trace, for what user space can see.
    let fault = get(&rows, "rackmem", Visibility::Fault).misses;
    assert!(
        fault as f64 <= 1.10 * lru as f64,
        "rackmem {fault} vs LRU {lru}"
    );
    // Sampling accesses through the free list costs minor faults, but far fewer than hits.
    let r = get(&rows, "rackmem", Visibility::Fault);
    assert!(r.minor_faults > 0 && r.minor_faults < r.hits / 4, "{r:?}");
}

#[test]
fn rackmem_vs_lru_on_a_loop() {
    // 3,000 pages looped through a 2,000-page cache: LRU misses on every reference.
    let rows = rows(Pattern::Seq, 3_000, 60_000, 2_000);
    let lru = get(&rows, "lru", Visibility::Oracle);
    assert_eq!(lru.misses, 60_000);
    let belady = get(&rows, "belady", Visibility::Oracle).misses;
    // After the 3,000 cold misses, MIN on a cyclic loop of n pages in k frames misses at the
    // rate (n - k) / (n - 1): here 1,000 / 2,999 of the remaining 57,000 references.
    let expect = 3_000.0 + 57_000.0 * 1_000.0 / 2_999.0;
    assert!(
        (belady as f64 - expect).abs() < 0.01 * expect,
        "{belady} vs {expect}"
    );
    for vis in [Visibility::Fault, Visibility::Oracle] {
        let r = get(&rows, "rackmem", vis);
        println!(
            "loop: rackmem/{vis} misses {} ({:.3} x LRU)",
            r.misses,
            r.misses as f64 / lru.misses as f64
        );
        assert!(r.misses >= belady && r.misses <= 60_000);
    }
}

#[test]
fn published_min_free_on_a_large_cache_and_a_scaled_one() {
    // 60,000 pages of cache: the published min_free = 512 gives a second-chance window of
    // ~2,048 pages (3% of the cache); min_free = 6% of the cache widens it to ~24%.
    let t = generate(&SynthConfig::new(Pattern::Zipf(0.99), 200_000, 2_000_000));
    let combos = sim::combos(
        &[PrefetcherKind::None],
        &[
            EvictKind::Lru,
            EvictKind::Fifo,
            "rackmem".parse().unwrap(),
            "rackmem:6%".parse().unwrap(),
        ],
        &[Visibility::Fault],
    );
    let rows = sim::run_all(&t, &SimConfig::new(60_000), &combos, 4);
    let lru = rows[0].misses as f64;
    let (fifo, published, scaled) = (rows[1].misses, rows[2].misses, rows[3].misses);
    println!(
        "zipf, 60,000 pages: FIFO {:.3}, rackmem {:.3}, {} {:.3} x LRU",
        fifo as f64 / lru,
        published as f64 / lru,
        rows[3].evict,
        scaled as f64 / lru
    );
    assert_eq!(rows[3].evict, "rackmem:3600");
    assert!(published < fifo, "{published} vs FIFO {fifo}");
    assert!(scaled < published, "{scaled} vs {published}");
    assert!(scaled as f64 <= 1.10 * lru, "{scaled} vs LRU {lru}");
}
