//! Which segments a direct shrink punches: a pure pick, so it is tested apart from `fallocate`.
//!
//! The runtime publishes its used segments coldest first; that order is only a hint (the
//! runtime is not trusted): entries out of range, repeated, or naming a segment with no memory
//! are skipped, and if the hint does not free enough, the daemon goes on with any segment that
//! has memory, highest number first.

/// Up to `count` segments to punch: first the valid entries of `cold_hint` (in order), then the
/// rest of `has_data` from the highest number down. Segments are 1..=`nseg`.
pub fn pick(
    cold_hint: &[u32],
    nseg: u32,
    count: usize,
    has_data: &dyn Fn(u32) -> bool,
) -> Vec<u32> {
    let mut out = Vec::with_capacity(count);
    let mut taken = std::collections::HashSet::new();
    for &s in cold_hint {
        if out.len() >= count {
            return out;
        }
        if s >= 1 && s <= nseg && taken.insert(s) && has_data(s) {
            out.push(s);
        }
    }
    let mut s = nseg;
    while out.len() < count && s >= 1 {
        if !taken.contains(&s) && has_data(s) {
            out.push(s);
        }
        s -= 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hint_goes_first_and_bad_entries_are_skipped() {
        let data = |s: u32| s != 4;
        // 0 and 99 are out of range, 3 repeats, 4 has no memory.
        let p = pick(&[3, 0, 99, 3, 4, 2], 8, 4, &data);
        assert_eq!(p, vec![3, 2, 8, 7]);
    }

    #[test]
    fn no_more_than_there_is() {
        let p = pick(&[], 3, 10, &|s| s == 2);
        assert_eq!(p, vec![2]);
    }
}
