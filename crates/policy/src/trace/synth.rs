//! Synthetic reference strings for tests, the simulator and benchmarks.
//!
//! Every pattern touches a footprint of `pages` distinct pages (fewer only if `accesses` is too
//! short to reach them all) and records one [`Kind::Access`] per access, `gap_ns` apart.
//!
//! | pattern | access `k` goes to |
//! |---|---|
//! | `seq` | page `k mod pages` (a loop over the footprint) |
//! | `stride:N` | page `(k mod pages) · N` (every N-th page, looping) |
//! | `interleave:A,B` (or `two:A,B`) | alternately thread 1 on `(j mod pages/2) · A` and thread 2 on `2^32 + (j mod pages/2) · B` |
//! | `random` | a uniformly random page of `0..pages` |
//! | `zipf` / `zipf:S` | rank `r` drawn with probability ∝ `1/(r+1)^S` (S = 0.99), ranks placed on pages by a random permutation |
//!
//! This is the workspace's one pattern grammar: `gleaner bench micro` parses its `--pattern`
//! with it too (and runs the patterns it can drive on a real region).
//!
//! All randomness comes from a seeded SplitMix64, so a (pattern, pages, accesses, seed) tuple
//! always gives the same trace.

use std::fmt;
use std::str::FromStr;

use super::{Kind, Record};

/// Where thread 2 of `interleave` starts (far from thread 1's pages).
pub const INTERLEAVE_SECOND_BASE: u64 = 1 << 32;

/// A synthetic access pattern.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pattern {
    /// A loop over the footprint.
    Seq,
    /// Every N-th page, looping.
    Stride(u64),
    /// Two threads, alternating, with strides A and B.
    Interleave(u64, u64),
    /// Uniformly random pages.
    Random,
    /// Zipf-distributed pages with exponent S.
    Zipf(f64),
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Seq => f.write_str("seq"),
            Pattern::Stride(n) => write!(f, "stride:{n}"),
            Pattern::Interleave(a, b) => write!(f, "interleave:{a},{b}"),
            Pattern::Random => f.write_str("random"),
            Pattern::Zipf(s) => write!(f, "zipf:{s}"),
        }
    }
}

impl FromStr for Pattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!(
                "invalid pattern `{s}` (expected seq, stride:N, interleave:A,B (or two:A,B), \
                 random, zipf or zipf:S; N, A, B >= 1, S > 0)"
            )
        };
        let t = s.trim().to_ascii_lowercase();
        let step = |v: &str| v.trim().parse::<u64>().ok().filter(|&n| n >= 1);
        Ok(match t.as_str() {
            "seq" => Pattern::Seq,
            "random" => Pattern::Random,
            "zipf" => Pattern::Zipf(0.99),
            "interleave" => Pattern::Interleave(1, 10),
            _ => {
                if let Some(n) = t.strip_prefix("stride:") {
                    Pattern::Stride(step(n).ok_or_else(bad)?)
                } else if let Some(ab) = t
                    .strip_prefix("interleave:")
                    .or_else(|| t.strip_prefix("two:"))
                {
                    let (a, b) = ab.split_once(',').ok_or_else(bad)?;
                    Pattern::Interleave(step(a).ok_or_else(bad)?, step(b).ok_or_else(bad)?)
                } else if let Some(v) = t.strip_prefix("zipf:") {
                    let e: f64 = v.parse().map_err(|_| bad())?;
                    if !(e.is_finite() && e > 0.0) {
                        return Err(bad());
                    }
                    Pattern::Zipf(e)
                } else {
                    return Err(bad());
                }
            }
        })
    }
}

/// Parameters of a synthetic trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SynthConfig {
    /// The pattern.
    pub pattern: Pattern,
    /// Footprint in distinct pages (at least 1; `interleave` gives each thread half).
    pub pages: u64,
    /// Number of accesses (records).
    pub accesses: u64,
    /// Time between consecutive accesses, in nanoseconds.
    pub gap_ns: u64,
    /// Random seed.
    pub seed: u64,
}

impl SynthConfig {
    /// `accesses` accesses of `pattern` over `pages` pages, 1 µs apart, seed 1.
    pub fn new(pattern: Pattern, pages: u64, accesses: u64) -> Self {
        SynthConfig {
            pattern,
            pages,
            accesses,
            gap_ns: 1_000,
            seed: 1,
        }
    }
}

/// SplitMix64: a small, fast, seedable generator (not for cryptography).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform value in `0..n` (`n > 0`), by 128-bit multiplication.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A uniform float in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Draws Zipf-distributed ranks `0..n` by inverting the cumulative distribution.
#[derive(Debug, Clone)]
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: u64, s: f64) -> Self {
        let mut cdf = Vec::with_capacity(n as usize);
        let mut acc = 0.0;
        for r in 0..n {
            acc += 1.0 / ((r + 1) as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut SplitMix64) -> u64 {
        let u = rng.unit();
        (self.cdf.partition_point(|&c| c < u) as u64).min(self.cdf.len() as u64 - 1)
    }
}

/// Generates the trace (all records in memory).
pub fn generate(cfg: &SynthConfig) -> Vec<Record> {
    let pages = cfg.pages.max(1);
    let mut rng = SplitMix64::new(cfg.seed);
    let zipf = match cfg.pattern {
        Pattern::Zipf(s) => {
            let mut perm: Vec<u64> = (0..pages).collect();
            for i in (1..perm.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                perm.swap(i, j);
            }
            Some((Zipf::new(pages, s), perm))
        }
        _ => None,
    };
    let half = (pages / 2).max(1);
    let mut out = Vec::with_capacity(cfg.accesses as usize);
    for k in 0..cfg.accesses {
        let (page, tid) = match cfg.pattern {
            Pattern::Seq => (k % pages, 1),
            Pattern::Stride(n) => ((k % pages).saturating_mul(n), 1),
            Pattern::Interleave(a, b) => {
                let j = (k / 2) % half;
                if k % 2 == 0 {
                    (j.saturating_mul(a), 1)
                } else {
                    (
                        INTERLEAVE_SECOND_BASE.saturating_add(j.saturating_mul(b)),
                        2,
                    )
                }
            }
            Pattern::Random => (rng.below(pages), 1),
            Pattern::Zipf(_) => {
                let (z, perm) = zipf.as_ref().expect("built for zipf");
                (perm[z.sample(&mut rng) as usize], 1)
            }
        };
        out.push(Record {
            time_ns: k.saturating_mul(cfg.gap_ns),
            page,
            tid,
            kind: Kind::Access,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_and_generate() {
        for s in ["seq", "stride:10", "interleave:1,10", "random", "zipf:0.99"] {
            let p: Pattern = s.parse().unwrap();
            assert_eq!(p.to_string(), s);
        }
        assert!("stride:0".parse::<Pattern>().is_err());
        assert!("zipf:-1".parse::<Pattern>().is_err());
        // bench micro's name for two strided threads is the same pattern.
        assert_eq!("two:2,5".parse::<Pattern>(), Ok(Pattern::Interleave(2, 5)));
        assert!("two:2".parse::<Pattern>().is_err());
        let t = generate(&SynthConfig::new(Pattern::Stride(10), 4, 6));
        let pages: Vec<u64> = t.iter().map(|r| r.page).collect();
        assert_eq!(pages, vec![0, 10, 20, 30, 0, 10]);
        assert_eq!(t[5].time_ns, 5_000);
        let t = generate(&SynthConfig::new(Pattern::Interleave(1, 10), 8, 6));
        let got: Vec<(u64, u32)> = t.iter().map(|r| (r.page, r.tid)).collect();
        let b = INTERLEAVE_SECOND_BASE;
        assert_eq!(
            got,
            vec![(0, 1), (b, 2), (1, 1), (b + 10, 2), (2, 1), (b + 20, 2)]
        );
        let z = generate(&SynthConfig::new(Pattern::Zipf(0.99), 1000, 20_000));
        assert!(z.iter().all(|r| r.page < 1000));
        let mut counts = vec![0u32; 1000];
        for r in &z {
            counts[r.page as usize] += 1;
        }
        counts.sort_unstable();
        // The hottest page gets ~1/H(1000) ≈ 13% of the accesses; uniform would be 0.1%.
        assert!(counts[999] > 1500, "{}", counts[999]);
        let r = generate(&SynthConfig::new(Pattern::Random, 50, 5000));
        assert!(r.iter().all(|x| x.page < 50));
        assert_eq!(
            generate(&SynthConfig::new(Pattern::Random, 50, 100)),
            generate(&SynthConfig::new(Pattern::Random, 50, 100)),
            "deterministic"
        );
    }
}
