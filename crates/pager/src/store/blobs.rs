//! Where blobs go in the shared-memory store's far arena: a size-class allocator over byte
//! offsets, in the manner of Linux's zsmalloc (which backs zram).
//!
//! Blobs are rounded up to a multiple of [`GRANULE`] bytes; each size *class* carves *chunks*
//! of 1 to 32 pages into equal objects. Objects may straddle page boundaries (the arena is one
//! contiguous range), so a class wastes only its chunk's tail: the chunk size is the smallest
//! that wastes at most 1/32 of it. A chunk's pages cost memory only while an object on them is
//! live (shared memory is allocated on first touch): the allocator tracks which pages of each
//! chunk live objects reach, and a free that leaves a page with no live object on it hands that
//! page back (the caller punches it out of the slab, giving the memory to the host), even while
//! the rest of the chunk is in use. A new blob goes to the fullest chunk of its class that has
//! room (zsmalloc's fullness groups), so that emptier chunks drain; a chunk whose last object is
//! freed is released and its pages reused by the next chunk of the same size.
//!
//! Pages handed back are not punched at once: they wait as *slack* until more than the caller's
//! bound of them has gathered, and a page a new object reaches meanwhile is used again without
//! being punched and faulted back in. Under steady churn (a page fetched, its blob freed, another
//! page evicted into the hole) that saved a `fallocate` and a shared-memory fault per page, and
//! punching had been a sizeable share of `bench micro --pattern seq`'s CPU time. Slack counts as
//! resident.
//!
//! What it does not do: compaction. A page with one live object on it stays resident; the stats
//! report how much of the resident memory blobs fill.
//!
//! This module only does arithmetic: it never touches the arena.

use crate::PAGE_SIZE;

/// Blob sizes are rounded up to this.
pub(crate) const GRANULE: usize = 32;
/// Chunk sizes, in pages, a class may use.
const CHUNK_PAGES: [u32; 6] = [1, 2, 4, 8, 16, 32];
/// The most pages one chunk spans.
pub(crate) const MAX_CHUNK_PAGES: u64 = 32;

/// A blob's place: byte offset in the arena and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    /// Byte offset from the arena's start.
    pub offset: u64,
    /// The blob's length in bytes.
    pub len: u32,
}

struct Class {
    /// Object size (a multiple of GRANULE).
    size: u32,
    /// Index into CHUNK_PAGES of this class's chunk size.
    chunk_kind: usize,
    /// Objects per chunk.
    per_chunk: u32,
    /// Chunks of this class with a free object, by fullness (group g holds chunks at least
    /// g/GROUPS full).
    groups: [Vec<u32>; GROUPS],
}

/// Fullness groups per class.
const GROUPS: usize = 4;
/// A chunk in no group (it is full).
const NO_GROUP: u8 = u8::MAX;

struct Chunk {
    class: u16,
    first_page: u64,
    live: u32,
    /// Objects below this were handed out at least once.
    fresh: u32,
    /// Objects given back, reused first.
    free: Vec<u32>,
    /// Which objects are live, a bit each.
    live_bits: Vec<u64>,
    /// Which of its pages hold memory (a live object reached them since they were last
    /// handed back), a bit each.
    resident: u32,
    /// Its fullness group ([`NO_GROUP`] when full) and its place there.
    group: u8,
    at: u32,
}

/// The allocator.
pub(crate) struct Blobs {
    classes: Vec<Class>,
    chunks: Vec<Chunk>,
    free_chunk_ids: Vec<u32>,
    /// Per chunk size: first pages of released chunks, reusable by a chunk of that size.
    free_runs: [Vec<u64>; CHUNK_PAGES.len()],
    /// Per arena page below `next_page`: the chunk that holds it (u32::MAX: none).
    chunk_of_page: Vec<u32>,
    /// Pages below this were carved into chunks at least once.
    next_page: u64,
    /// Pages the arena has (granted by the memnode).
    granted_pages: u64,
    /// Pages of live chunks that objects reach.
    reached_pages: u64,
    /// Pages handed back but not yet punched (see the module's doc), a bit per arena page and
    /// in the order they were handed back (pages reused since are skipped when taken).
    in_slack: Vec<u64>,
    slack: Vec<u64>,
    slack_pages: u64,
    /// The most pages ever resident (reached or slack) at once.
    peak_resident_pages: u64,
    /// Bytes of live blobs, and how many, when the peak was reached.
    blob_bytes_at_peak: u64,
    blobs_at_peak: u64,
    /// Live blobs and their bytes.
    blobs: u64,
    blob_bytes: u64,
    /// Pages handed back by [`Blobs::take_punch`], in all.
    punched: u64,
    /// Pages new objects reached that held no memory (neither reached nor slack), in all: what
    /// the host had to provide again (a shared-memory fault each).
    fresh_pages: u64,
}

/// A blob size the allocator cannot place.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NoRoom {
    /// Pages the arena would need beyond what it has.
    pub more_pages: u64,
}

impl Blobs {
    /// An allocator for blobs of up to `max_len` bytes over an arena that has no pages yet.
    pub(crate) fn new(max_len: usize) -> Blobs {
        let n = max_len.div_ceil(GRANULE);
        let classes = (1..=n)
            .map(|g| {
                let size = (g * GRANULE) as u32;
                let chunk_kind = best_chunk(size);
                Class {
                    size,
                    chunk_kind,
                    per_chunk: CHUNK_PAGES[chunk_kind] * PAGE_SIZE as u32 / size,
                    groups: Default::default(),
                }
            })
            .collect();
        Blobs {
            classes,
            chunks: Vec::new(),
            free_chunk_ids: Vec::new(),
            free_runs: Default::default(),
            chunk_of_page: Vec::new(),
            next_page: 0,
            granted_pages: 0,
            reached_pages: 0,
            in_slack: Vec::new(),
            slack: Vec::new(),
            slack_pages: 0,
            peak_resident_pages: 0,
            blob_bytes_at_peak: 0,
            blobs_at_peak: 0,
            blobs: 0,
            blob_bytes: 0,
            punched: 0,
            fresh_pages: 0,
        }
    }

    /// Like [`Blobs::new`], for an arena whose first `pages` pages belong to someone else (a
    /// fork child's, whose parent's slabs come first): nothing is ever placed below them.
    pub(crate) fn above(max_len: usize, pages: u64) -> Blobs {
        let mut b = Blobs::new(max_len);
        b.next_page = pages;
        b.granted_pages = pages;
        b.chunk_of_page = vec![u32::MAX; pages as usize];
        b
    }

    /// The arena grew to `pages` pages.
    pub(crate) fn set_granted(&mut self, pages: u64) {
        debug_assert!(pages >= self.granted_pages);
        self.granted_pages = pages;
    }

    /// Places a blob of `len` bytes. Fails, changing nothing, when a new chunk is needed and the
    /// arena has no room for it.
    pub(crate) fn alloc(&mut self, len: usize) -> Result<Loc, NoRoom> {
        assert!(len > 0, "empty blob");
        let c = len.div_ceil(GRANULE) - 1;
        assert!(c < self.classes.len(), "blob of {len} bytes is too large");
        let fullest = self.classes[c]
            .groups
            .iter()
            .rev()
            .find_map(|g| g.last().copied());
        let chunk_id = match fullest {
            Some(id) => id,
            None => self.new_chunk(c)?,
        };
        let size = u64::from(self.classes[c].size);
        let chunk = &mut self.chunks[chunk_id as usize];
        let obj = match chunk.free.pop() {
            Some(o) => o,
            None => {
                chunk.fresh += 1;
                chunk.fresh - 1
            }
        };
        chunk.live += 1;
        chunk.live_bits[obj as usize / 64] |= 1 << (obj % 64);
        // The pages it reaches start (or go on) costing memory.
        let (p0, p1) = pages_of(obj, size);
        let mut touched = 0;
        let mut from_slack = 0;
        let first_page = chunk.first_page;
        for p in p0..=p1 {
            if chunk.resident & (1 << p) == 0 {
                chunk.resident |= 1 << p;
                touched += 1;
                let abs = first_page + u64::from(p);
                let (word, bit) = ((abs / 64) as usize, 1u64 << (abs % 64));
                if self.in_slack.get(word).is_some_and(|w| w & bit != 0) {
                    self.in_slack[word] &= !bit;
                    from_slack += 1;
                }
            }
        }
        self.regroup(chunk_id);
        self.blobs += 1;
        self.blob_bytes += len as u64;
        self.reached_pages += touched;
        self.slack_pages -= from_slack;
        self.fresh_pages += touched - from_slack;
        if self.resident_pages() > self.peak_resident_pages {
            self.peak_resident_pages = self.resident_pages();
            self.blob_bytes_at_peak = self.blob_bytes;
            self.blobs_at_peak = self.blobs;
        }
        Ok(Loc {
            offset: first_page * PAGE_SIZE as u64 + u64::from(obj) * size,
            len: len as u32,
        })
    }

    /// Moves a chunk to the fullness group its live count calls for.
    fn regroup(&mut self, id: u32) {
        let chunk = &self.chunks[id as usize];
        let class = &mut self.classes[chunk.class as usize];
        let want = if chunk.live == class.per_chunk || chunk.live == 0 {
            NO_GROUP
        } else {
            (chunk.live as usize * GROUPS / class.per_chunk as usize) as u8
        };
        let (old, at) = (chunk.group, chunk.at);
        if want == old {
            return;
        }
        if old != NO_GROUP {
            let g = &mut class.groups[old as usize];
            g.swap_remove(at as usize);
            if let Some(&moved) = g.get(at as usize) {
                self.chunks[moved as usize].at = at;
            }
        }
        let mut at = 0;
        if want != NO_GROUP {
            let g = &mut class.groups[want as usize];
            at = g.len() as u32;
            g.push(id);
        }
        let chunk = &mut self.chunks[id as usize];
        chunk.group = want;
        chunk.at = at;
    }

    /// Gives `loc` back. The arena pages no live object reaches any more become slack, to be
    /// taken by [`Blobs::take_punch`].
    pub(crate) fn free(&mut self, loc: Loc) {
        let page = loc.offset / PAGE_SIZE as u64;
        let chunk_id = self.chunk_of_page[page as usize];
        assert_ne!(chunk_id, u32::MAX, "freeing a blob outside any chunk");
        let chunk = &mut self.chunks[chunk_id as usize];
        let class = &self.classes[chunk.class as usize];
        let size = u64::from(class.size);
        let obj = ((loc.offset - chunk.first_page * PAGE_SIZE as u64) / size) as u32;
        debug_assert!(
            loc.len.div_ceil(GRANULE as u32) * GRANULE as u32 == class.size,
            "a blob freed with a length of another class"
        );
        let bit = 1u64 << (obj % 64);
        assert!(
            chunk.live_bits[obj as usize / 64] & bit != 0,
            "freeing a blob that is not live"
        );
        chunk.live_bits[obj as usize / 64] &= !bit;
        chunk.free.push(obj);
        chunk.live -= 1;
        // Hand back the pages it reached that no other live object does.
        let (p0, p1) = pages_of(obj, size);
        let mut released = 0;
        for p in p0..=p1 {
            let (o0, o1) = objects_on(p, size, class.per_chunk);
            let busy = (o0..=o1).any(|o| chunk.live_bits[o as usize / 64] & (1 << (o % 64)) != 0);
            if !busy && chunk.resident & (1 << p) != 0 {
                chunk.resident &= !(1 << p);
                let abs = chunk.first_page + u64::from(p);
                let word = (abs / 64) as usize;
                if self.in_slack.len() <= word {
                    self.in_slack.resize(word + 1, 0);
                }
                self.in_slack[word] |= 1 << (abs % 64);
                self.slack.push(abs);
                released += 1;
            }
        }
        let (live, kind, first) = (chunk.live, class.chunk_kind, chunk.first_page);
        self.reached_pages -= released;
        self.slack_pages += released;
        if self.slack.len() as u64 > 2 * self.slack_pages + 1024 {
            // Most entries are pages used again since: keep one entry per slack page.
            let in_slack = &self.in_slack;
            self.slack.sort_unstable();
            self.slack.dedup();
            self.slack
                .retain(|&p| in_slack[(p / 64) as usize] & (1 << (p % 64)) != 0);
        }
        self.blobs -= 1;
        self.blob_bytes -= u64::from(loc.len);
        self.regroup(chunk_id);
        if live > 0 {
            return;
        }
        // Release the chunk (every page of it was handed back above).
        debug_assert_eq!(self.chunks[chunk_id as usize].resident, 0);
        let pages = u64::from(CHUNK_PAGES[kind]);
        self.free_runs[kind].push(first);
        for p in first..first + pages {
            self.chunk_of_page[p as usize] = u32::MAX;
        }
        self.chunks[chunk_id as usize].free = Vec::new();
        self.free_chunk_ids.push(chunk_id);
    }

    fn new_chunk(&mut self, c: usize) -> Result<u32, NoRoom> {
        let kind = self.classes[c].chunk_kind;
        let pages = u64::from(CHUNK_PAGES[kind]);
        let first = match self.free_runs[kind].pop() {
            Some(p) => p,
            None => {
                if self.next_page + pages > self.granted_pages {
                    return Err(NoRoom {
                        more_pages: self.next_page + pages - self.granted_pages,
                    });
                }
                self.next_page += pages;
                self.chunk_of_page.resize(self.next_page as usize, u32::MAX);
                self.next_page - pages
            }
        };
        let chunk = Chunk {
            class: c as u16,
            first_page: first,
            live: 0,
            fresh: 0,
            free: Vec::new(),
            live_bits: vec![0; (self.classes[c].per_chunk as usize).div_ceil(64)],
            resident: 0,
            group: NO_GROUP,
            at: 0,
        };
        let id = match self.free_chunk_ids.pop() {
            Some(id) => {
                self.chunks[id as usize] = chunk;
                id
            }
            None => {
                self.chunks.push(chunk);
                (self.chunks.len() - 1) as u32
            }
        };
        for p in first..first + pages {
            self.chunk_of_page[p as usize] = id;
        }
        // Listed in the lowest group until its first object is handed out.
        let g = &mut self.classes[c].groups[0];
        self.chunks[id as usize].group = 0;
        self.chunks[id as usize].at = g.len() as u32;
        g.push(id);
        Ok(id)
    }

    /// Once more than `max_slack` pages are slack, appends them all to `punch` (sorted): the
    /// caller must punch them out of the arena's memory before anything is placed there again
    /// (their contents are dead).
    pub(crate) fn take_punch(&mut self, max_slack: u64, punch: &mut Vec<u64>) {
        if self.slack_pages <= max_slack {
            return;
        }
        let start = punch.len();
        for p in self.slack.drain(..) {
            let (word, bit) = ((p / 64) as usize, 1u64 << (p % 64));
            if self.in_slack[word] & bit != 0 {
                self.in_slack[word] &= !bit;
                punch.push(p);
            }
        }
        punch[start..].sort_unstable();
        debug_assert_eq!((punch.len() - start) as u64, self.slack_pages);
        self.punched += self.slack_pages;
        self.slack_pages = 0;
    }

    /// Pages of live chunks that objects reach.
    pub(crate) fn reached_pages(&self) -> u64 {
        self.reached_pages
    }

    /// The arena memory the host holds: pages objects reach and slack.
    pub(crate) fn resident_pages(&self) -> u64 {
        self.reached_pages + self.slack_pages
    }

    /// The most pages resident at once.
    pub(crate) fn peak_resident_pages(&self) -> u64 {
        self.peak_resident_pages
    }

    /// Bytes of live blobs when the resident peak was reached.
    pub(crate) fn blob_bytes_at_peak(&self) -> u64 {
        self.blob_bytes_at_peak
    }

    /// Live blobs when the resident peak was reached.
    pub(crate) fn blobs_at_peak(&self) -> u64 {
        self.blobs_at_peak
    }

    /// Live blobs.
    #[cfg(test)]
    pub(crate) fn blobs(&self) -> u64 {
        self.blobs
    }

    /// Bytes of live blobs.
    pub(crate) fn blob_bytes(&self) -> u64 {
        self.blob_bytes
    }

    /// Pages handed back to be punched, in all.
    pub(crate) fn punched_pages(&self) -> u64 {
        self.punched
    }

    /// Pages placed objects reached that held no memory, in all.
    pub(crate) fn fresh_pages(&self) -> u64 {
        self.fresh_pages
    }
}

/// The pages (relative to its chunk) object `obj` of `size` bytes reaches, first and last.
fn pages_of(obj: u32, size: u64) -> (u32, u32) {
    let start = u64::from(obj) * size;
    let end = start + size - 1;
    (
        (start / PAGE_SIZE as u64) as u32,
        (end / PAGE_SIZE as u64) as u32,
    )
}

/// The objects of `size` bytes (of a chunk holding `per_chunk`) that reach page `p` of the chunk,
/// first and last.
fn objects_on(p: u32, size: u64, per_chunk: u32) -> (u32, u32) {
    let start = u64::from(p) * PAGE_SIZE as u64;
    let end = start + PAGE_SIZE as u64 - 1;
    let first = (start / size) as u32;
    let last = ((end / size) as u32).min(per_chunk - 1);
    (first, last.max(first))
}

/// The chunk size (an index into CHUNK_PAGES) for objects of `size` bytes: the smallest that
/// wastes at most 1/32 of the chunk, else the one that wastes least.
fn best_chunk(size: u32) -> usize {
    let waste = |k: usize| {
        let bytes = CHUNK_PAGES[k] * PAGE_SIZE as u32;
        f64::from(bytes % size) / f64::from(bytes)
    };
    (0..CHUNK_PAGES.len())
        .find(|&k| waste(k) <= 1.0 / 32.0)
        .unwrap_or_else(|| {
            (0..CHUNK_PAGES.len())
                .min_by(|&a, &b| waste(a).total_cmp(&waste(b)))
                .expect("chunk sizes")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 4113;

    #[test]
    fn every_class_wastes_little_and_fits_its_largest_blob() {
        let b = Blobs::new(MAX);
        for c in &b.classes {
            let bytes = CHUNK_PAGES[c.chunk_kind] * PAGE_SIZE as u32;
            assert!(c.per_chunk >= 1 && c.per_chunk * c.size <= bytes);
            let waste = f64::from(bytes - c.per_chunk * c.size) / f64::from(bytes);
            assert!(waste < 0.06, "class {} wastes {waste:.3}", c.size);
        }
        assert!(b.classes.last().unwrap().size as usize >= MAX);
    }

    #[test]
    fn blobs_never_overlap_and_no_live_blob_is_on_a_page_handed_back() {
        let mut b = Blobs::new(MAX);
        b.set_granted(100_000);
        let mut rng = gleaner_sys::rng::XorShift64::from_state(12345);
        let mut live: Vec<Loc> = Vec::new();
        let mut punch = Vec::new();
        let page = PAGE_SIZE as u64;
        for round in 0..20_000 {
            let x = rng.next_u64();
            if live.len() > 2000 || (round % 3 == 0 && !live.is_empty()) {
                let i = (x as usize / 7) % live.len();
                punch.clear();
                b.free(live.swap_remove(i));
                // Slack is taken now and then (bound 0: whenever there is some).
                b.take_punch(if round % 5 == 0 { 0 } else { 40 }, &mut punch);
                for &p in &punch {
                    let on_it = live.iter().any(|l| {
                        l.offset < (p + 1) * page && l.offset + u64::from(l.len) > p * page
                    });
                    assert!(!on_it, "page {p} handed back under a live blob");
                }
            } else {
                let len = 1 + (x as usize % MAX);
                live.push(b.alloc(len).unwrap());
            }
        }
        let mut spans: Vec<(u64, u64)> = live
            .iter()
            .map(|l| (l.offset, l.offset + u64::from(l.len)))
            .collect();
        spans.sort_unstable();
        for w in spans.windows(2) {
            assert!(w[0].1 <= w[1].0, "overlap {w:?}");
        }
        assert_eq!(b.blobs(), live.len() as u64);
        assert_eq!(
            b.blob_bytes(),
            live.iter().map(|l| u64::from(l.len)).sum::<u64>()
        );
        // Resident pages are exactly those live blobs reach.
        let mut reached: Vec<u64> = spans
            .iter()
            .flat_map(|&(a, e)| a / page..=(e - 1) / page)
            .collect();
        reached.sort_unstable();
        reached.dedup();
        assert_eq!(b.reached_pages(), reached.len() as u64);
        assert!(b.resident_pages() >= b.reached_pages());
        let resident = b.resident_pages();
        assert!(b.peak_resident_pages() >= resident);
        for l in live.drain(..) {
            b.free(l);
        }
        assert_eq!(b.resident_pages(), resident, "slack stays resident");
        punch.clear();
        b.take_punch(0, &mut punch);
        assert_eq!(
            punch.len() as u64,
            resident,
            "every page is handed back once its blobs are gone"
        );
        assert!(punch.windows(2).all(|w| w[0] < w[1]), "sorted, once each");
        assert_eq!((b.resident_pages(), b.reached_pages()), (0, 0));
    }

    #[test]
    fn freeing_most_blobs_of_a_chunk_hands_back_their_pages() {
        let mut b = Blobs::new(MAX);
        b.set_granted(1000);
        // 3 KiB blobs: a chunk of several pages, each page reached by one or two blobs.
        let locs: Vec<Loc> = (0..40).map(|_| b.alloc(3000).unwrap()).collect();
        let full = b.resident_pages();
        let mut punch = Vec::new();
        for l in &locs[1..] {
            b.free(*l);
        }
        b.take_punch(full, &mut punch);
        assert!(
            punch.is_empty(),
            "within the slack bound nothing is punched"
        );
        assert_eq!(b.resident_pages(), full);
        b.take_punch(1, &mut punch);
        assert!(
            b.resident_pages() <= 2,
            "{} of {full} pages stay",
            b.resident_pages()
        );
        assert_eq!(punch.len() as u64, full - b.resident_pages());
    }

    #[test]
    fn a_slack_page_used_again_is_not_punched_and_costs_nothing_more() {
        let mut b = Blobs::new(MAX);
        b.set_granted(1000);
        // Whole-page blobs (as raw pages are): each reaches a page or two of its own.
        let mut locs: Vec<Loc> = (0..64).map(|_| b.alloc(4113).unwrap()).collect();
        let full = b.resident_pages();
        let peak = b.peak_resident_pages();
        for round in 0..1000 {
            // Churn: free eight, place eight (into the holes, without new memory).
            let mut freed: Vec<Loc> = locs.drain(8..16).collect();
            for l in &freed {
                b.free(*l);
            }
            let mut punch = Vec::new();
            if round % 2 == 0 {
                b.take_punch(64, &mut punch);
                assert!(punch.is_empty(), "round {round}: {punch:?}");
            }
            let mut placed: Vec<Loc> = (0..8).map(|_| b.alloc(4113).unwrap()).collect();
            placed.sort_by_key(|l| l.offset);
            freed.sort_by_key(|l| l.offset);
            assert_eq!(placed, freed, "the holes are reused");
            locs.extend(placed);
            assert_eq!(b.resident_pages(), full);
        }
        assert_eq!(b.peak_resident_pages(), peak, "reuse adds no memory");
        assert!(
            b.slack.len() < 2000,
            "slack list compacted: {}",
            b.slack.len()
        );
    }

    /// Uniform steady churn (a page fetched frees its blob, a page evicted places one, sizes
    /// spread over many classes): holes are mostly filled where memory already is, so few pages
    /// are punched and faulted back in per blob placed. (A real run churns more: redis at 50%
    /// punched 0.09 pages per blob placed, its placements coming in batches of 128.)
    #[test]
    fn steady_churn_reuses_memory_instead_of_punching_and_faulting_it_back() {
        let mut b = Blobs::new(MAX);
        b.set_granted(1_000_000);
        let mut rng = gleaner_sys::rng::XorShift64::from_state(99);
        let mut rnd = move || rng.next_u64();
        // Sizes like redis's pages under LZ4: 2800..4113 bytes.
        let mut live: Vec<Loc> = (0..20_000)
            .map(|_| b.alloc(2800 + (rnd() % 1314) as usize).unwrap())
            .collect();
        let (punched0, fresh0) = (b.punched_pages(), b.fresh_pages());
        let rounds = 200_000;
        let mut punch = Vec::new();
        for _ in 0..rounds {
            let i = rnd() as usize % live.len();
            b.free(live.swap_remove(i));
            // The store's bound: a sixty-fourth of what blobs reach, at most 256 pages.
            punch.clear();
            b.take_punch((b.reached_pages() / 64).min(256), &mut punch);
            live.push(b.alloc(2800 + (rnd() % 1314) as usize).unwrap());
        }
        let punched = (b.punched_pages() - punched0) as f64 / rounds as f64;
        let fresh = (b.fresh_pages() - fresh0) as f64 / rounds as f64;
        eprintln!("per blob placed: {punched:.3} pages punched, {fresh:.3} fresh");
        assert!(punched < 0.05, "{punched:.3} pages punched per blob placed");
        assert!(fresh < 0.05, "{fresh:.3} fresh pages per blob placed");
    }

    #[test]
    fn small_blobs_pack_densely() {
        let mut b = Blobs::new(MAX);
        b.set_granted(10_000);
        for _ in 0..10_000 {
            b.alloc(500).unwrap();
        }
        let used = b.resident_pages() * PAGE_SIZE as u64;
        let ideal = 10_000 * 512;
        assert!(
            used as f64 <= ideal as f64 * 1.04,
            "{used} bytes for {ideal}"
        );
    }

    #[test]
    fn no_room_changes_nothing_and_a_grant_lets_it_continue() {
        let mut b = Blobs::new(MAX);
        b.set_granted(1);
        let a = b.alloc(100).unwrap();
        let e = b.alloc(MAX).unwrap_err();
        assert!(e.more_pages >= 1);
        assert_eq!((b.blobs(), b.resident_pages()), (1, 1));
        b.set_granted(1 + MAX_CHUNK_PAGES);
        b.alloc(MAX).unwrap();
        let mut punch = Vec::new();
        b.free(a);
        b.take_punch(0, &mut punch);
        assert_eq!(punch, vec![0]);
        // The released page is reused by the next chunk of its size.
        assert_eq!(b.alloc(100).unwrap().offset, 0);
    }
}
