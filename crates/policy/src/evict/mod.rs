//! Eviction policies as the simulator drives them: which resident page leaves when room is
//! needed.
//!
//! # What a policy can see
//!
//! In far memory, user space sees *faults*, not accesses: a mapped page is read and written
//! without the handler knowing, and hardware accessed bits need privileges (RackMem, PACT 2020).
//! The simulator therefore offers two [`Visibility`] levels, and every policy states which one
//! it was built for:
//!
//! * [`Visibility::Fault`] — what gleaner's engine can do. The policy is told about demand misses
//!   ([`EvictPolicy::insert`] with [`Insert::Demand`]), the first use of a prefetched page
//!   ([`Touch::PrefetchHit`]) and re-faults on pages it chose to *unmap while keeping their data*
//!   ([`Touch::Refault`]; a policy reports such pages through [`EvictPolicy::is_mapped`]).
//!   Unmapping is how a user-space policy samples accesses: CLOCK and RackMem unmap pages to
//!   learn whether they are still used, at the price of a minor fault per sampled access, which
//!   the simulator counts.
//! * [`Visibility::Oracle`] — additionally every access to a mapped page ([`Touch::Hit`]), as a
//!   kernel with accessed bits (or a trace of every access) would give.
//!
//! [`Lru`] and [`Belady`] are reference points and always use oracle information (Belady also the
//! future); FIFO ignores accesses, so its visibility does not matter.
//!
//! # Calls the simulator makes
//!
//! For reference number `at` (0, 1, 2, …) to a page: a miss makes room with
//! [`victim`](EvictPolicy::victim) until a slot is free, then [`insert`](EvictPolicy::insert)s the
//! page as [`Insert::Demand`]; a hit calls [`touch`](EvictPolicy::touch) as described above.
//! Prefetched pages are inserted as [`Insert::Prefetch`] with the `at` of the fault that
//! triggered them; they count against the capacity like any resident page.

mod active;
mod belady;
mod clock;
mod fifo;
mod frequency;
mod ghosts;
mod lru;
mod rackmem;
mod recency;
mod refault;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::str::FromStr;
use std::sync::Arc;

pub use active::{ActiveInactive, ActiveInactiveStats};
pub use belady::{Belady, Future};
pub use clock::Clock;
pub use fifo::Fifo;
pub use frequency::{Frequency, FrequencyStats, LEVELS as FREQUENCY_LEVELS};
pub use lru::Lru;
pub use rackmem::{MinFree, RackMem, RackMemConfig, RackMemStats};
pub use recency::{Recency, DEFAULT_PROBATION_PCT};
pub use refault::Refault;

/// How much of the access stream a policy is given (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Visibility {
    /// Faults only: misses, prefetch hits, and re-faults on pages the policy unmapped.
    Fault,
    /// Every access, including hits on mapped pages.
    Oracle,
}

impl fmt::Display for Visibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Visibility::Fault => "fault",
            Visibility::Oracle => "oracle",
        })
    }
}

impl FromStr for Visibility {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fault" => Ok(Visibility::Fault),
            "oracle" => Ok(Visibility::Oracle),
            _ => Err(format!(
                "invalid visibility `{s}` (expected fault or oracle)"
            )),
        }
    }
}

/// Why a page becomes resident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insert {
    /// Fetched for a demand miss; the faulting access uses it now.
    Demand,
    /// Fetched by the prefetcher; not used yet (it waits unmapped).
    Prefetch,
}

/// An access to a resident page that the policy is told about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touch {
    /// An access to a mapped page: only delivered to [`Visibility::Oracle`] policies.
    Hit,
    /// The first use of a prefetched page (a fault: always delivered).
    PrefetchHit,
    /// A fault on a page the policy unmapped but kept ([`EvictPolicy::is_mapped`] was false):
    /// always delivered. The page is mapped again afterwards.
    Refault,
    /// A periodic scan saw the resident page written since the previous scan (the engine's
    /// access scan: a reference bit, not a reference): always delivered. The page stays as
    /// mapped as it was.
    Scanned,
}

/// A simulator-facing eviction policy. `at` is the index of the current reference in the trace.
pub trait EvictPolicy: Send {
    /// A short name, e.g. `clock`.
    fn name(&self) -> String;
    /// The information this policy was built for.
    fn visibility(&self) -> Visibility;
    /// `page` became resident (the simulator guarantees room and that it was not resident).
    fn insert(&mut self, page: u64, how: Insert, at: usize);
    /// An access to resident `page` (see [`Touch`] for which ones are delivered).
    fn touch(&mut self, page: u64, how: Touch, at: usize);
    /// Whether resident `page` is mapped. `false` means the policy unmapped it while keeping its
    /// data, so the next access is a (minor) fault delivered as [`Touch::Refault`].
    fn is_mapped(&self, page: u64) -> bool {
        let _ = page;
        true
    }
    /// Chooses a resident page to evict and forgets it; `None` when nothing is resident.
    fn victim(&mut self, at: usize) -> Option<u64>;
    /// A page [`victim`](EvictPolicy::victim) chose could not be evicted and stays resident
    /// (the engine's evictor found it busy). Default: inserted again as a demand page. An order
    /// that remembers evicted pages forgets this one first: it never left, so it is no refault.
    fn reinsert(&mut self, page: u64, at: usize) {
        self.insert(page, Insert::Demand, at);
    }
    /// Forgets `page` (it left for another reason); no effect if it is not resident.
    fn remove(&mut self, page: u64);
    /// Resident pages tracked.
    fn len(&self) -> usize;
    /// The cache now holds `capacity` pages (a budget that grew mid-run): a policy whose
    /// parameters follow the capacity sizes them anew, as [`EvictKind::build`] would have.
    /// Default: nothing follows it.
    fn set_capacity(&mut self, capacity: usize) {
        let _ = capacity;
    }
    /// Whether no page is resident.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An eviction policy choice, as written on a command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EvictKind {
    /// `fifo`.
    Fifo,
    /// `clock` (second chance).
    Clock,
    /// `refault`: segmented FIFO whose pages that refault soon after eviction are protected
    /// ([`Refault`]).
    Refault,
    /// `rackmem` (RackMem, PACT 2020, with the published parameters), `rackmem:N` (`min_free`
    /// = N pages) or `rackmem:N%` (`min_free` = N% of the capacity).
    RackMem(MinFree),
    /// `recency` or `recency:N%`: the page seen used longest ago leaves first, pages seen only
    /// at their fault from a probation of at most N% of the resident pages (default
    /// [`DEFAULT_PROBATION_PCT`]; 0: plain LRU over what is seen) ([`Recency`]).
    Recency(u8),
    /// `active`: active and inactive lists with reference bits and refault activation, as
    /// Linux orders anonymous memory ([`ActiveInactive`]).
    Active,
    /// `frequency`: queues by how often a page was seen used, with the counts of evicted pages
    /// remembered (Multi-Queue, USENIX ATC 2001) ([`Frequency`]).
    Frequency,
    /// `lru` (exact; reference).
    Lru,
    /// `belady` (optimal; reference, needs the future).
    Belady,
}

impl EvictKind {
    /// Every policy, in table order.
    pub fn all() -> Vec<EvictKind> {
        vec![
            EvictKind::Fifo,
            EvictKind::Clock,
            EvictKind::Refault,
            EvictKind::RackMem(MinFree::Published),
            EvictKind::Recency(DEFAULT_PROBATION_PCT),
            EvictKind::Active,
            EvictKind::Frequency,
            EvictKind::Lru,
            EvictKind::Belady,
        ]
    }

    /// Whether this is a reference policy (always oracle): LRU and Belady.
    pub fn is_reference(&self) -> bool {
        matches!(self, EvictKind::Lru | EvictKind::Belady)
    }

    /// Whether results depend on [`Visibility`]: CLOCK, RackMem, recency, active and frequency.
    pub fn depends_on_visibility(&self) -> bool {
        matches!(
            self,
            EvictKind::Clock
                | EvictKind::RackMem(_)
                | EvictKind::Recency(_)
                | EvictKind::Active
                | EvictKind::Frequency
        )
    }

    /// A fresh policy for a cache of `capacity` pages. `future` is needed for Belady and ignored
    /// otherwise; `visibility` is ignored by FIFO, LRU and Belady.
    pub fn build(
        &self,
        capacity: usize,
        visibility: Visibility,
        future: Option<&Arc<Future>>,
    ) -> Result<Box<dyn EvictPolicy>, BuildError> {
        Ok(match self {
            EvictKind::Fifo => Box::new(Fifo::new()),
            EvictKind::Clock => Box::new(Clock::new(visibility)),
            EvictKind::Refault => Box::new(Refault::new(capacity)),
            EvictKind::RackMem(min_free) => Box::new(RackMem::new(
                capacity,
                visibility,
                RackMemConfig::with_min_free(capacity, *min_free),
            )),
            EvictKind::Recency(pct) => Box::new(Recency::new(visibility, *pct)),
            EvictKind::Active => Box::new(ActiveInactive::new(capacity, visibility)),
            EvictKind::Frequency => Box::new(Frequency::new(capacity, visibility)),
            EvictKind::Lru => Box::new(Lru::new()),
            EvictKind::Belady => {
                Box::new(Belady::new(future.ok_or(BuildError::NeedsFuture)?.clone()))
            }
        })
    }
}

/// A policy could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// Belady was asked for without the trace's future.
    #[error("belady needs the whole trace in advance (a Future)")]
    NeedsFuture,
}

impl fmt::Display for EvictKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvictKind::Fifo => f.write_str("fifo"),
            EvictKind::Clock => f.write_str("clock"),
            EvictKind::Refault => f.write_str("refault"),
            EvictKind::RackMem(MinFree::Published) => f.write_str("rackmem"),
            EvictKind::RackMem(MinFree::Pages(n)) => write!(f, "rackmem:{n}"),
            EvictKind::RackMem(MinFree::Percent(p)) => write!(f, "rackmem:{p}%"),
            EvictKind::Recency(DEFAULT_PROBATION_PCT) => f.write_str("recency"),
            EvictKind::Recency(p) => write!(f, "recency:{p}%"),
            EvictKind::Active => f.write_str("active"),
            EvictKind::Frequency => f.write_str("frequency"),
            EvictKind::Lru => f.write_str("lru"),
            EvictKind::Belady => f.write_str("belady"),
        }
    }
}

/// An eviction policy name that is none of `fifo`, `clock`, `refault`, `rackmem[:N|:N%]`,
/// `recency[:N%]`, `active`, `frequency`, `lru`, `belady`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid eviction policy `{0}` (expected fifo, clock, refault, rackmem, rackmem:N with \
     N >= 1 pages, rackmem:N% with 1 <= N <= 50, recency, recency:N% with 0 <= N <= 90, active, frequency, lru or belady)"
)]
pub struct ParseEvictError(String);

impl FromStr for EvictKind {
    type Err = ParseEvictError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseEvictError(s.to_string());
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "fifo" => Ok(EvictKind::Fifo),
            "clock" => Ok(EvictKind::Clock),
            "refault" => Ok(EvictKind::Refault),
            "rackmem" => Ok(EvictKind::RackMem(MinFree::Published)),
            "recency" => Ok(EvictKind::Recency(DEFAULT_PROBATION_PCT)),
            "active" => Ok(EvictKind::Active),
            "frequency" => Ok(EvictKind::Frequency),
            "lru" => Ok(EvictKind::Lru),
            "belady" | "opt" | "min" => Ok(EvictKind::Belady),
            _ => {
                if let Some(arg) = t.strip_prefix("recency:") {
                    return match arg.strip_suffix('%').map(str::parse::<u8>) {
                        Some(Ok(p)) if p <= 90 => Ok(EvictKind::Recency(p)),
                        _ => Err(err()),
                    };
                }
                let arg = t.strip_prefix("rackmem:").ok_or_else(err)?;
                if let Some(p) = arg.strip_suffix('%') {
                    match p.parse::<u8>() {
                        Ok(p) if (1..=50).contains(&p) => {
                            Ok(EvictKind::RackMem(MinFree::Percent(p)))
                        }
                        _ => Err(err()),
                    }
                } else {
                    match arg.parse::<usize>() {
                        Ok(n) if n >= 1 => Ok(EvictKind::RackMem(MinFree::Pages(n))),
                        _ => Err(err()),
                    }
                }
            }
        }
    }
}

/// Parses a comma-separated list such as `fifo,lru` (`all` for every policy).
pub fn parse_list(s: &str) -> Result<Vec<EvictKind>, ParseEvictError> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(EvictKind::all());
    }
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(str::parse)
        .collect()
}

/// A fast hasher for page numbers (the simulator hashes one per reference): the state is mixed
/// with the 64-bit murmur3 finaliser, so sequential pages spread over all bits.
#[derive(Debug, Default, Clone, Copy)]
pub struct PageHasher(u64);

impl Hasher for PageHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = self.0.rotate_left(32) ^ n;
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// A hash map keyed by page number, with [`PageHasher`].
pub type PageMap<V> = HashMap<u64, V, BuildHasherDefault<PageHasher>>;

/// A hash set of page numbers, with [`PageHasher`].
pub type PageSet = HashSet<u64, BuildHasherDefault<PageHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_and_print() {
        for k in EvictKind::all() {
            assert_eq!(k.to_string().parse::<EvictKind>().unwrap(), k);
        }
        assert_eq!("OPT".parse::<EvictKind>().unwrap(), EvictKind::Belady);
        for s in ["rackmem:4096", "rackmem:6%"] {
            assert_eq!(s.parse::<EvictKind>().unwrap().to_string(), s);
        }
        for bad in [
            "rackmem:0",
            "rackmem:0%",
            "rackmem:60%",
            "rackmem:x",
            "clock:3",
        ] {
            assert!(bad.parse::<EvictKind>().is_err(), "{bad}");
        }
        assert!("lfu"
            .parse::<EvictKind>()
            .unwrap_err()
            .to_string()
            .contains("lfu"));
        assert_eq!(parse_list("all").unwrap().len(), 9);
        assert_eq!(
            parse_list("fifo,lru").unwrap(),
            vec![EvictKind::Fifo, EvictKind::Lru]
        );
        assert_eq!(
            EvictKind::Belady.build(4, Visibility::Fault, None).err(),
            Some(BuildError::NeedsFuture)
        );
        assert_eq!("oracle".parse::<Visibility>(), Ok(Visibility::Oracle));
        assert!("x".parse::<Visibility>().is_err());
    }

    #[test]
    fn every_policy_evicts_what_it_holds() {
        let future = Arc::new(Future::new([1u64, 2, 3, 1, 2, 3]));
        for k in EvictKind::all() {
            for vis in [Visibility::Fault, Visibility::Oracle] {
                let mut p = k.build(3, vis, Some(&future)).unwrap();
                for (i, page) in [1u64, 2, 3].into_iter().enumerate() {
                    p.insert(page, Insert::Demand, i);
                }
                assert_eq!(p.len(), 3);
                p.remove(2);
                assert_eq!(p.len(), 2, "{k}");
                let mut out = vec![p.victim(3).unwrap(), p.victim(3).unwrap()];
                out.sort_unstable();
                assert_eq!(out, vec![1, 3], "{k} {vis}");
                assert_eq!(p.victim(3), None);
                assert!(p.is_empty());
            }
        }
    }
}
