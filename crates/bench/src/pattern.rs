//! Access patterns and the deterministic page contents they verify.

use std::fmt;
use std::str::FromStr;

use gleaner_pager::PAGE_SIZE;
use gleaner_policy::trace::synth::Pattern as Grammar;
use gleaner_sys::rng::XorShift64;

/// Which pages a pass visits, in which order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// 0, 1, 2, ...
    Seq,
    /// 0, N, 2N, ... then 1, N+1, ... so every page is visited once per pass.
    Stride(usize),
    /// Pages drawn uniformly at random (as many as there are pages), seeded per pass.
    Random,
    /// Two threads at once: one strides by A over the first half of the region, the other by B
    /// over the second half (`two:A,B`); each visits its half once per pass.
    Two(usize, usize),
}

impl FromStr for Pattern {
    type Err = String;

    /// Parsed by the workspace's one pattern grammar (the simulator's, `gleaner_policy`'s
    /// `trace::synth::Pattern`); `zipf` is refused here, as a pass must visit every page once.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let size = |n: u64| usize::try_from(n).map_err(|_| format!("`{s}`: {n} is too large"));
        match s.parse::<Grammar>()? {
            Grammar::Seq => Ok(Pattern::Seq),
            Grammar::Stride(n) => Ok(Pattern::Stride(size(n)?)),
            Grammar::Random => Ok(Pattern::Random),
            Grammar::Interleave(a, b) => Ok(Pattern::Two(size(a)?, size(b)?)),
            Grammar::Zipf(_) => Err(format!(
                "`{s}`: bench micro visits every page once a pass, so it runs seq, stride:N, \
                 random and two:A,B; zipf is for traces (`gleaner-policy sim`)"
            )),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Seq => write!(f, "seq"),
            Pattern::Stride(n) => write!(f, "stride:{n}"),
            Pattern::Random => write!(f, "random"),
            Pattern::Two(a, b) => write!(f, "two:{a},{b}"),
        }
    }
}

impl Pattern {
    /// The streams of pass `pass`, one per thread: two for `two:A,B`, else one.
    pub fn streams(&self, pages: usize, pass: u32) -> Vec<Box<dyn Iterator<Item = usize> + Send>> {
        match *self {
            Pattern::Two(a, b) => {
                let half = pages / 2;
                vec![strided(0, half, a), strided(half, pages, b)]
            }
            _ => vec![self.pages(pages, pass)],
        }
    }

    /// The pages of pass `pass` over `pages` pages (for `two:A,B`, both streams one after the
    /// other).
    pub fn pages(&self, pages: usize, pass: u32) -> Box<dyn Iterator<Item = usize> + Send> {
        match *self {
            Pattern::Two(..) => Box::new(self.streams(pages, pass).into_iter().flatten()),
            Pattern::Seq => Box::new(0..pages),
            Pattern::Stride(n) => {
                let n = n.min(pages.max(1));
                Box::new((0..n).flat_map(move |start| (start..pages).step_by(n)))
            }
            Pattern::Random => {
                let mut rng = XorShift64::from_state(splitmix(0xC0FFEE ^ pass as u64) | 1);
                Box::new((0..pages).map(move |_| rng.below(pages as u64) as usize))
            }
        }
    }

    /// The sum of the words `passes` passes read, for checking the run end to end.
    pub fn expected_checksum(&self, pages: usize, passes: u32) -> u64 {
        (0..passes)
            .flat_map(|pass| self.pages(pages, pass))
            .fold(0u64, |acc, p| {
                acc.wrapping_add(expected_word(p, p % (PAGE_SIZE / 8)))
            })
    }
}

/// Pages `lo..hi`, every `n`-th, then shifted by one, ... so each is visited once.
fn strided(lo: usize, hi: usize, n: usize) -> Box<dyn Iterator<Item = usize> + Send> {
    let n = n.min((hi - lo).max(1));
    Box::new((0..n).flat_map(move |start| (lo + start..hi).step_by(n)))
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The value word `word` of page `page` holds after [`fill_page`].
pub fn expected_word(page: usize, word: usize) -> u64 {
    splitmix(page as u64).wrapping_add(word as u64)
}

/// Writes page `page`'s deterministic contents at `dst`.
///
/// # Safety
/// `dst` must point to `PAGE_SIZE` writable bytes, 8-byte aligned.
pub unsafe fn fill_page(dst: *mut u8, page: usize) {
    let words = dst as *mut u64;
    let seed = splitmix(page as u64);
    for w in 0..PAGE_SIZE / 8 {
        // SAFETY: w < PAGE_SIZE / 8, so the write stays inside the page the caller vouched for.
        unsafe { words.add(w).write_volatile(seed.wrapping_add(w as u64)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_and_cover_pages() {
        assert_eq!("seq".parse::<Pattern>().unwrap(), Pattern::Seq);
        assert_eq!("stride:10".parse::<Pattern>().unwrap(), Pattern::Stride(10));
        assert!("stride:0".parse::<Pattern>().is_err());
        assert!("zigzag".parse::<Pattern>().is_err());
        let mut v: Vec<usize> = Pattern::Stride(10).pages(25, 0).collect();
        assert_eq!(&v[..3], &[0, 10, 20]);
        v.sort();
        assert_eq!(v, (0..25).collect::<Vec<_>>());
        assert!(Pattern::Random.pages(100, 0).all(|p| p < 100));
        let two: Pattern = "two:3,5".parse().unwrap();
        assert_eq!(two.to_string(), "two:3,5");
        assert!("two:3".parse::<Pattern>().is_err());
        assert!("two:0,5".parse::<Pattern>().is_err());
        // One grammar with the simulator's: its names parse here, zipf is refused by name.
        assert_eq!("interleave:3,5".parse::<Pattern>().unwrap(), two);
        assert_eq!(" Stride:4".parse::<Pattern>().unwrap(), Pattern::Stride(4));
        let e = "zipf".parse::<Pattern>().unwrap_err();
        assert!(e.contains("zipf is for traces"), "{e}");
        let s = two.streams(20, 0);
        assert_eq!(s.len(), 2);
        let mut all: Vec<usize> = two.pages(20, 0).collect();
        assert_eq!(&all[..4], &[0, 3, 6, 9]);
        all.sort();
        assert_eq!(all, (0..20).collect::<Vec<_>>());
        assert_ne!(
            Pattern::Random.pages(100, 0).collect::<Vec<_>>(),
            Pattern::Random.pages(100, 1).collect::<Vec<_>>()
        );
    }
}
