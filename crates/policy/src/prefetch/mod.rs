//! Prefetchers: given the stream of page-in faults, which pages to fetch ahead of demand.
//!
//! Every prefetcher implements [`Prefetcher`], which the simulator ([`crate::sim`]) drives offline
//! and the engine can drive online from its fault handlers. The interface is built around what
//! user space actually sees with userfaultfd:
//!
//! * a **fault** on a page that is not mapped: either a *miss* (the page is remote or never
//!   touched), or a *prefetch hit* (the page was prefetched and waits, unmapped, in a staging
//!   buffer; installing it is the first use). Both are reported through
//!   [`Prefetcher::on_fault`], with [`Fault::prefetch_hit`] telling them apart;
//! * accesses to mapped pages are invisible, so no prefetcher is told about them.
//!
//! Prefetchers return *candidates*: pages they would like fetched. They do not know what is
//! resident; the caller drops candidates that are already resident or in flight (the simulator
//! counts only the pages it really fetched as "issued").
//!
//! | name | rule | acts on |
//! |---|---|---|
//! | `none` | nothing | — |
//! | `next:N` | the N pages after the faulting one | every fault |
//! | `stride` | constant stride of the last two deltas, depth from past accuracy ([`Stride`]) | every fault |
//! | `readahead` | Linux VMA swap readahead, Linux's swap readahead ([`Readahead`]) | misses |
//! | `leap` / `leap:PWMAX` | Leap's majority trend and hit-sized window, Leap, USENIX ATC 2020 ([`Leap`]) | misses and window markers |

mod leap;
mod readahead;
mod stride;

use std::fmt;
use std::str::FromStr;

pub use leap::{delta, find_trend, History, Leap, LeapConfig, RECENT_FAULTS};
pub use readahead::{linux_nr_pages, Readahead, READAHEAD_MAX_PAGES};
pub use stride::Stride;

/// One page-in fault, as a fault handler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The faulting page number (an address divided by the page size, possibly relative to a
    /// region base: prefetchers only use differences and `page + k`).
    pub page: u64,
    /// The faulting thread (`uffd_msg` thread id); 0 when unknown.
    pub tid: u32,
    /// The page had been prefetched and had not been used yet: this fault is its first use (a
    /// prefetch hit). `false` for a miss that must fetch the page on demand.
    pub prefetch_hit: bool,
}

/// A prefetch policy.
///
/// Contract for callers (simulator or engine):
/// 1. Call [`on_fault`](Self::on_fault) for every page-in fault, misses and prefetch hits alike,
///    in the order the faults are handled. Set [`Fault::prefetch_hit`] when the faulting page was
///    a prefetched page not used before; such a fault already counts as a hit.
/// 2. Fetch the candidates appended to `out` that are neither resident nor in flight. The
///    faulting page is never among them, and no candidate is outside `0..=u64::MAX` (arithmetic
///    is checked, never wrapped). The caller clears `out`; a prefetcher only appends.
/// 3. Call [`on_prefetch_hit`](Self::on_prefetch_hit) only for a prefetched page found used
///    *without* a fault reporting it (for example a page installed mapped and later seen
///    accessed). Never report the same use both ways.
///
/// Implementations allocate only when they see a new thread; the per-fault path reuses its state.
pub trait Prefetcher: Send {
    /// A short name for tables and stats, e.g. `leap` or `next:8`.
    fn name(&self) -> String;
    /// A page-in fault; appends the pages to prefetch to `out`.
    fn on_fault(&mut self, fault: Fault, out: &mut Vec<u64>);
    /// A prefetched page was used without [`on_fault`](Self::on_fault) reporting it (see the
    /// trait documentation). The default ignores it.
    fn on_prefetch_hit(&mut self, page: u64, tid: u32) {
        let _ = (page, tid);
    }
}

/// Never prefetches.
#[derive(Debug, Default, Clone)]
pub struct NoPrefetch;

impl Prefetcher for NoPrefetch {
    fn name(&self) -> String {
        "none".into()
    }

    fn on_fault(&mut self, _fault: Fault, _out: &mut Vec<u64>) {}
}

/// Next-N-line: on every page-in fault, the `n` pages after the faulting one (Leap's baseline,
/// Linux's swap readahead). Acting on prefetch hits too keeps it `n` pages ahead of a sequential scan
/// once the caller drops the candidates already resident.
#[derive(Debug, Clone)]
pub struct NextN {
    n: usize,
}

impl NextN {
    /// A next-N prefetcher (`n` = 0 prefetches nothing).
    pub fn new(n: usize) -> Self {
        NextN { n }
    }
}

impl Prefetcher for NextN {
    fn name(&self) -> String {
        format!("next:{}", self.n)
    }

    fn on_fault(&mut self, fault: Fault, out: &mut Vec<u64>) {
        for i in 1..=self.n as u64 {
            match fault.page.checked_add(i) {
                Some(p) => out.push(p),
                None => break,
            }
        }
    }
}

/// Default depth of `next` when no `:N` is given, and the default Leap/stride window cap.
pub const DEFAULT_DEPTH: usize = 8;

/// Largest accepted `next:N` / `leap:PWMAX` / stride depth.
pub const MAX_DEPTH: usize = 4096;

/// A prefetcher choice, as written on a command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefetcherKind {
    /// `none`.
    None,
    /// `next:N` (`next` alone is `next:8`).
    Next(usize),
    /// `stride`.
    Stride,
    /// `readahead` (Linux VMA readahead).
    Readahead,
    /// `leap` (PW_max 8) or `leap:PWMAX`.
    Leap {
        /// The window cap PW_max.
        pw_max: usize,
    },
}

impl PrefetcherKind {
    /// Every prefetcher with its default parameters, in table order.
    pub fn all() -> Vec<PrefetcherKind> {
        vec![
            PrefetcherKind::None,
            PrefetcherKind::Next(DEFAULT_DEPTH),
            PrefetcherKind::Stride,
            PrefetcherKind::Readahead,
            PrefetcherKind::Leap {
                pw_max: DEFAULT_DEPTH,
            },
        ]
    }

    /// A fresh prefetcher of this kind.
    pub fn build(&self) -> Box<dyn Prefetcher> {
        match *self {
            PrefetcherKind::None => Box::new(NoPrefetch),
            PrefetcherKind::Next(n) => Box::new(NextN::new(n)),
            PrefetcherKind::Stride => Box::new(Stride::new(DEFAULT_DEPTH)),
            PrefetcherKind::Readahead => Box::new(Readahead::new()),
            PrefetcherKind::Leap { pw_max } => Box::new(Leap::new(LeapConfig {
                pw_max,
                ..LeapConfig::default()
            })),
        }
    }
}

impl fmt::Display for PrefetcherKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrefetcherKind::None => f.write_str("none"),
            PrefetcherKind::Next(n) => write!(f, "next:{n}"),
            PrefetcherKind::Stride => f.write_str("stride"),
            PrefetcherKind::Readahead => f.write_str("readahead"),
            PrefetcherKind::Leap { pw_max } if *pw_max == DEFAULT_DEPTH => f.write_str("leap"),
            PrefetcherKind::Leap { pw_max } => write!(f, "leap:{pw_max}"),
        }
    }
}

/// A prefetcher name that is none of `none`, `next[:N]`, `stride`, `readahead`, `leap[:PWMAX]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid prefetcher `{input}`: {reason} (expected none, next:N, stride, readahead, leap or \
     leap:PWMAX, with 1 <= N, PWMAX <= 4096)"
)]
pub struct ParsePrefetcherError {
    input: String,
    reason: &'static str,
}

impl FromStr for PrefetcherKind {
    type Err = ParsePrefetcherError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParsePrefetcherError {
            input: s.to_string(),
            reason,
        };
        let depth = |n: &str| match n.parse::<usize>() {
            Ok(n) if (1..=MAX_DEPTH).contains(&n) => Ok(n),
            Ok(_) => Err(err("the depth is out of range")),
            Err(_) => Err(err("the depth is not a number")),
        };
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "none" => Ok(PrefetcherKind::None),
            "next" => Ok(PrefetcherKind::Next(DEFAULT_DEPTH)),
            "stride" => Ok(PrefetcherKind::Stride),
            "readahead" => Ok(PrefetcherKind::Readahead),
            "leap" => Ok(PrefetcherKind::Leap {
                pw_max: DEFAULT_DEPTH,
            }),
            _ => {
                if let Some(n) = t.strip_prefix("next:") {
                    Ok(PrefetcherKind::Next(depth(n)?))
                } else if let Some(n) = t.strip_prefix("leap:") {
                    Ok(PrefetcherKind::Leap { pw_max: depth(n)? })
                } else {
                    Err(err("unknown prefetcher"))
                }
            }
        }
    }
}

/// Parses a comma-separated list such as `none,leap,next:4` (`all` for every prefetcher).
pub fn parse_list(s: &str) -> Result<Vec<PrefetcherKind>, ParsePrefetcherError> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(PrefetcherKind::all());
    }
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(str::parse)
        .collect()
}

/// `page + i * step` for `i` in `from..=to`, skipping nothing but stopping at the first value
/// outside `0..=u64::MAX`. Shared by the stride walkers.
pub(crate) fn walk(page: u64, step: i64, from: u64, to: u64, out: &mut Vec<u64>) {
    if step == 0 {
        return;
    }
    for i in from..=to {
        let off = i128::from(step) * i128::from(i);
        let target = i128::from(page) + off;
        match u64::try_from(target) {
            Ok(p) => out.push(p),
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_and_round_trip() {
        for s in ["none", "next:3", "stride", "readahead", "leap", "leap:16"] {
            let k: PrefetcherKind = s.parse().unwrap();
            assert_eq!(k.to_string(), s);
        }
        assert_eq!(
            "next".parse::<PrefetcherKind>().unwrap(),
            PrefetcherKind::Next(8)
        );
        assert_eq!(
            "leap:8".parse::<PrefetcherKind>().unwrap().to_string(),
            "leap"
        );
        let e = "next:0".parse::<PrefetcherKind>().unwrap_err().to_string();
        assert!(e.contains("out of range"), "{e}");
        let e = "bogus".parse::<PrefetcherKind>().unwrap_err().to_string();
        assert!(e.contains("unknown prefetcher"), "{e}");
        assert_eq!(parse_list("all").unwrap().len(), 5);
        assert_eq!(parse_list("none, leap").unwrap().len(), 2);
        for k in PrefetcherKind::all() {
            assert_eq!(k.build().name(), k.to_string());
        }
    }

    #[test]
    fn walk_stops_at_the_ends_of_the_page_space() {
        let mut out = Vec::new();
        walk(u64::MAX - 2, 1, 1, 8, &mut out);
        assert_eq!(out, vec![u64::MAX - 1, u64::MAX]);
        out.clear();
        walk(3, -2, 1, 8, &mut out);
        assert_eq!(out, vec![1]);
        out.clear();
        walk(0, i64::MIN, 1, 4, &mut out);
        assert!(out.is_empty());
        out.clear();
        walk(5, 0, 1, 4, &mut out);
        assert!(out.is_empty());
    }
}
