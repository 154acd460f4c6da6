//! The evacuator's decisions, pure so they are unit-tested apart from the memory they move:
//! which segments a shrink compacts or releases, which a compaction pass empties, and the cold
//! order the runtime publishes for the daemon's direct shrink (Midas, NSDI 2024, section 4.2:
//! scan, compact by live ratio, sort by hotness; release cold first).

/// What the evacuator knows of one used segment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SegInfo {
    /// The segment's number.
    pub seg: u32,
    /// Bytes of live objects in it (headers included).
    pub live: u64,
    /// Bytes written into it (its bump pointer).
    pub used: u64,
    /// Its hotness: the sum over live objects of size x hotness.
    pub hotness: u64,
}

impl SegInfo {
    /// Live bytes over the segment's size.
    pub fn live_ratio(&self, segment_bytes: u64) -> f64 {
        self.live as f64 / segment_bytes as f64
    }
}

/// What to do with one segment while shrinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Move its live objects elsewhere, then release it (nothing is lost).
    Compact(u32),
    /// Drop its objects (they become misses) and release it.
    Release(u32),
}

/// The live-ratio cutoff: segments at or above it are never compacted (the released code's 0.9).
pub const COMPACT_BELOW: f64 = 0.9;

/// Segments coldest first (ties: fewer live bytes first, then the lower number).
pub fn cold_order(segs: &[SegInfo]) -> Vec<u32> {
    let mut v: Vec<&SegInfo> = segs.iter().collect();
    v.sort_by(|a, b| {
        a.hotness
            .cmp(&b.hotness)
            .then(a.live.cmp(&b.live))
            .then(a.seg.cmp(&b.seg))
    });
    v.into_iter().map(|s| s.seg).collect()
}

/// How to give back `need` segments: coldest first; a segment whose live objects fit in `room`
/// bytes (free space in segments that stay) and whose live ratio is below [`COMPACT_BELOW`] is
/// compacted (its objects survive), any other is released (its objects become misses).
/// Segments in `keep` (the open one) are never picked.
pub fn shrink(
    segs: &[SegInfo],
    need: usize,
    mut room: u64,
    keep: &[u32],
    segment_bytes: u64,
) -> Vec<Action> {
    let mut out = Vec::new();
    let order = cold_order(segs);
    for seg in order {
        if out.len() >= need {
            break;
        }
        if keep.contains(&seg) {
            continue;
        }
        let s = segs.iter().find(|s| s.seg == seg).unwrap();
        if s.live_ratio(segment_bytes) < COMPACT_BELOW && s.live <= room {
            room -= s.live;
            out.push(Action::Compact(seg));
        } else {
            out.push(Action::Release(seg));
        }
    }
    out
}

/// Segments worth compacting when the pool is short of free space (fewer than `headroom` free
/// segments within its grant): lowest live ratio first, only below half live (each frees more
/// than it fills), at most as many as `free_segments` can absorb.
pub fn compaction(segs: &[SegInfo], keep: &[u32], free_bytes: u64, segment_bytes: u64) -> Vec<u32> {
    let mut v: Vec<&SegInfo> = segs
        .iter()
        .filter(|s| !keep.contains(&s.seg) && s.used > 0 && s.live_ratio(segment_bytes) < 0.5)
        .collect();
    v.sort_by(|a, b| a.live.cmp(&b.live).then(a.seg.cmp(&b.seg)));
    let mut room = free_bytes;
    let mut out = Vec::new();
    for s in v {
        if s.live > room {
            break;
        }
        room -= s.live;
        out.push(s.seg);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: u64 = 2 << 20;

    fn s(seg: u32, live: u64, hot: u64) -> SegInfo {
        SegInfo {
            seg,
            live,
            used: SEG,
            hotness: hot,
        }
    }

    #[test]
    fn cold_first_with_ties_broken_by_live_bytes() {
        let segs = [s(1, 100, 50), s(2, 10, 5), s(3, 5, 5), s(4, 1, 900)];
        assert_eq!(cold_order(&segs), vec![3, 2, 1, 4]);
    }

    #[test]
    fn shrink_compacts_what_fits_and_releases_the_rest_coldest_first() {
        let segs = [
            s(1, SEG / 4, 10),
            s(2, SEG, 1),
            s(3, SEG / 2, 20),
            s(4, SEG / 8, 0),
        ];
        // 4 is the open segment: kept. Room for 1/4 + 1/2 segment.
        let a = shrink(&segs, 3, SEG * 3 / 4, &[4], SEG);
        assert_eq!(
            a,
            vec![Action::Release(2), Action::Compact(1), Action::Compact(3)]
        );
        // No room: every pick is a release.
        let a = shrink(&segs, 2, 0, &[], SEG);
        assert_eq!(a, vec![Action::Release(4), Action::Release(2)]);
    }

    #[test]
    fn compaction_takes_the_emptiest_that_fit() {
        let segs = [
            s(1, SEG / 3, 0),
            s(2, SEG / 10, 0),
            s(3, SEG * 6 / 10, 0),
            s(5, SEG / 5, 0),
        ];
        assert_eq!(compaction(&segs, &[5], SEG, SEG), vec![2, 1]);
        assert_eq!(compaction(&segs, &[], SEG / 10, SEG), vec![2]);
        assert!(compaction(&segs, &[], 0, SEG).is_empty());
    }
}
