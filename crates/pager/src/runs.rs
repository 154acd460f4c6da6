//! Runs of consecutive pages: what one system call (a drop, a punch, a protection change) can
//! cover at once.

/// Groups ascending page numbers into `(first, count)` runs of consecutive pages.
pub(crate) fn runs(pages: impl Iterator<Item = usize>) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for p in pages {
        match out.last_mut() {
            Some((start, len)) if *start + *len == p => *len += 1,
            _ => out.push((p, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_group_consecutive_pages() {
        assert_eq!(
            super::runs([1, 2, 3, 7, 9, 10].into_iter()),
            vec![(1, 3), (7, 1), (9, 2)]
        );
        assert!(super::runs(std::iter::empty()).is_empty());
    }
}
