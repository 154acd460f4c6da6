//! Linux VMA-based swap readahead (Linux's `swap_vma_readahead`), the rule RackMem
//! starts from (§3.6) and Leap's "Linux Read-Ahead" baseline in its VMA form.
//!
//! State per process (the region plays the VMA): the previous fault page, the previous window and
//! the hits (prefetched pages used) since the last decision. As in the kernel, a prefetch hit only
//! counts and moves the previous-fault address (`lookup_swap_cache` does both); decisions happen
//! on misses:
//!
//! ```text
//! pages = hits + 2
//! if pages == 2: pages = 1 unless the fault is adjacent (prev ± 1) to the previous one
//! else:          pages = next_pow2(pages), at least 4
//! pages = min(pages, 8);  pages = max(pages, prev_win / 2)
//! ```
//!
//! With fault `f` after `p`, the window is `[f, f+win)` if `f == p+1`, `[f−win+1, f]` if
//! `f == p−1`, else centred `[f−(win−1)/2, …)`; it is clipped to the 2 MiB block (512 pages)
//! containing `f` and to optional region bounds; `win == 1` means no readahead. The faulting page
//! is part of the window but never a candidate.

use super::{Fault, Prefetcher};

/// `1 << page_cluster` with the default `page_cluster = 3`.
pub const READAHEAD_MAX_PAGES: u64 = 8;

/// Pages per 2 MiB PMD with 4 KiB pages: the window never crosses this aligned block.
const PMD_PAGES: u64 = 512;

/// The kernel's `__swapin_nr_pages`: the readahead window for a fault at `cur` after one at
/// `prev`, given the `hits` since the last decision and the previous window.
pub fn linux_nr_pages(prev: u64, cur: u64, hits: u64, prev_win: u64, max_pages: u64) -> u64 {
    let mut pages = hits.saturating_add(2);
    if pages == 2 {
        if cur != prev.wrapping_add(1) && cur != prev.wrapping_sub(1) {
            pages = 1;
        }
    } else {
        pages = pages.next_power_of_two().max(4);
    }
    pages.min(max_pages).max(prev_win / 2)
}

/// Linux VMA readahead; see the module documentation.
#[derive(Debug, Clone)]
pub struct Readahead {
    prev: Option<u64>,
    win: u64,
    hits: u64,
    max_pages: u64,
    bounds: Option<(u64, u64)>,
}

impl Default for Readahead {
    fn default() -> Self {
        Self::new()
    }
}

impl Readahead {
    /// Readahead with the default 8-page cap and no region bounds.
    pub fn new() -> Self {
        Readahead {
            prev: None,
            win: 0,
            hits: 0,
            max_pages: READAHEAD_MAX_PAGES,
            bounds: None,
        }
    }

    /// Clips windows to pages `first..=last` (the VMA).
    pub fn with_bounds(mut self, first: u64, last: u64) -> Self {
        self.bounds = Some((first.min(last), first.max(last)));
        self
    }

    /// The last window decided.
    pub fn window(&self) -> u64 {
        self.win
    }
}

impl Prefetcher for Readahead {
    fn name(&self) -> String {
        "readahead".into()
    }

    fn on_fault(&mut self, fault: Fault, out: &mut Vec<u64>) {
        let f = fault.page;
        let prev = self.prev.replace(f);
        if fault.prefetch_hit {
            self.hits = self.hits.saturating_add(1);
            return;
        }
        let p = prev.unwrap_or(f);
        let win = linux_nr_pages(
            p,
            f,
            std::mem::take(&mut self.hits),
            self.win,
            self.max_pages,
        );
        self.win = win;
        if win <= 1 {
            return;
        }
        let (start, end) = if prev.is_some() && f == p.wrapping_add(1) {
            (u128::from(f), u128::from(f) + u128::from(win) - 1)
        } else if prev.is_some() && f == p.wrapping_sub(1) {
            (
                u128::from(f).saturating_sub(u128::from(win) - 1),
                u128::from(f),
            )
        } else {
            let s = u128::from(f).saturating_sub(u128::from((win - 1) / 2));
            (s, s + u128::from(win) - 1)
        };
        let block = f - f % PMD_PAGES;
        let mut lo = start.max(u128::from(block));
        let mut hi = end.min(u128::from(block) + u128::from(PMD_PAGES) - 1);
        if let Some((a, b)) = self.bounds {
            lo = lo.max(u128::from(a));
            hi = hi.min(u128::from(b));
        }
        let mut p = lo;
        while p <= hi {
            let page = p as u64; // p <= hi <= block + 511 <= u64::MAX
            if page != f {
                out.push(page);
            }
            p += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nr_pages_follows_the_kernel_rule() {
        assert_eq!(linux_nr_pages(10, 11, 0, 0, 8), 2, "adjacent, no hits");
        assert_eq!(linux_nr_pages(10, 9, 0, 0, 8), 2, "adjacent backwards");
        assert_eq!(linux_nr_pages(10, 20, 0, 0, 8), 1, "not adjacent: none");
        assert_eq!(
            linux_nr_pages(10, 20, 1, 0, 8),
            4,
            "3 rounds up to the minimum 4"
        );
        assert_eq!(linux_nr_pages(10, 20, 3, 0, 8), 8, "5 -> 8");
        assert_eq!(linux_nr_pages(10, 20, 100, 0, 8), 8, "capped");
        assert_eq!(
            linux_nr_pages(10, 20, 0, 8, 8),
            4,
            "never below half the previous"
        );
    }
}
