//! `MADV_WIPEONFORK` on managed memory: which pages a fork child must see as zeros.
//!
//! The kernel keeps the advice as a flag of the mapping, and a fork child finds those pages
//! empty. Managed memory is the pager's (its pages may be far, where the kernel cannot wipe
//! them), so the preload library keeps the advice itself: the ranges the program marked, until
//! it marks them `MADV_KEEPONFORK`, unmaps them or maps something else over them; a fork child
//! discards them before the program goes on, and keeps the marks for its own children, as the
//! kernel would. Programs rely on it for secrets and for fork detection (BoringSSL and AWS-LC
//! keep their random generators' fork generation in such a page: a child that read the
//! parent's would repeat its random numbers). Until 2026-11-28 the advice was accepted and
//! ignored, so a child read the parent's data there.

use std::collections::BTreeMap;

/// The marked page ranges, in pages from the arena's start: first page -> page count, disjoint
/// and not touching.
#[derive(Default)]
pub(crate) struct WipeRanges {
    ranges: BTreeMap<usize, usize>,
}

impl WipeRanges {
    /// Marks `[first, first+pages)`.
    pub(crate) fn mark(&mut self, first: usize, pages: usize) {
        if pages == 0 {
            return;
        }
        self.clear(first, pages);
        let (mut start, mut len) = (first, pages);
        if let Some((&s, &l)) = self.ranges.range(..start).next_back() {
            if s + l == start {
                self.ranges.remove(&s);
                start = s;
                len += l;
            }
        }
        if let Some(l) = self.ranges.remove(&(start + len)) {
            len += l;
        }
        self.ranges.insert(start, len);
    }

    /// The marked ranges that overlap `[first, first+pages)`, whole, last first.
    fn overlapping(&self, first: usize, pages: usize) -> Vec<(usize, usize)> {
        self.ranges
            .range(..first + pages)
            .rev()
            .take_while(|&(&s, &l)| s + l > first)
            .map(|(&s, &l)| (s, l))
            .collect()
    }

    /// Unmarks `[first, first+pages)`.
    pub(crate) fn clear(&mut self, first: usize, pages: usize) {
        let end = first + pages;
        for (s, l) in self.overlapping(first, pages) {
            self.ranges.remove(&s);
            if s < first {
                self.ranges.insert(s, first - s);
            }
            if s + l > end {
                self.ranges.insert(end, s + l - end);
            }
        }
    }

    /// The marked parts of `[first, first+pages)`, as `(first page, count)`.
    pub(crate) fn within(&self, first: usize, pages: usize) -> Vec<(usize, usize)> {
        let end = first + pages;
        self.overlapping(first, pages)
            .into_iter()
            .rev()
            .map(|(s, l)| {
                let (a, b) = (s.max(first), (s + l).min(end));
                (a, b - a)
            })
            .collect()
    }

    /// Every marked range, in order.
    pub(crate) fn all(&self) -> Vec<(usize, usize)> {
        self.ranges.iter().map(|(&s, &l)| (s, l)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_merge_split_and_clear_as_the_kernels_flag_would() {
        let mut w = WipeRanges::default();
        w.mark(10, 5);
        w.mark(15, 5);
        w.mark(30, 2);
        assert_eq!(w.all(), vec![(10, 10), (30, 2)]);
        // KEEPONFORK in the middle splits the range.
        w.clear(12, 3);
        assert_eq!(w.all(), vec![(10, 2), (15, 5), (30, 2)]);
        assert_eq!(w.within(11, 20), vec![(11, 1), (15, 5), (30, 1)]);
        assert_eq!(w.within(0, 10), vec![]);
        // Marking over marks and gaps leaves one range.
        w.mark(9, 25);
        assert_eq!(w.all(), vec![(9, 25)]);
        w.clear(0, 100);
        assert!(w.all().is_empty());
        w.mark(5, 0);
        assert!(w.all().is_empty());
    }
}
