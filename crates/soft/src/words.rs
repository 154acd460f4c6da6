//! Read words: what a read needs of one object, readable without the pool's lock.
//!
//! Each object has a small seqlock ([`Word`]): a sequence number and four words (where the
//! object lies and its length, packed in one; the piece's header as it is in memory, two words;
//! the generation its segment had when it was placed). Only the holder of the pool's lock writes
//! them ([`Word::publish`]), whenever the object's place changes, and only with a place it
//! checked lies inside the pool's mapping; a read takes a snapshot without the lock
//! ([`Word::snapshot`] then [`Word::still`]), copies the object out, and trusts the copy only
//! if the sequence number did not move meanwhile, the segment's generation is the one recorded
//! (the daemon bumps it before it punches) and the piece's header is the one written. Anything
//! else sends the read to the locked path, which decides. The copy may overlap the lock
//! holder's writes to the same bytes (a seqlock's reader always may): it is a raw copy out of
//! the shared mapping (`Piece::append_payload_to`), which other processes write as well, and
//! its bytes are used only once the checks above have passed.
//!
//! What a hit computes is kept to nothing the lock holder could compute once: the place and the
//! length share one word, so a snapshot whose other words come from different writes (which
//! the re-check after the copy rejects) still copies from a piece that lies inside the mapping,
//! with no bounds check of its own; the header is stored as the two words to compare.
//!
//! The words are shared (`Arc`) between the pool's record of the object and its soft pointer,
//! which keeps them for its life: a read goes straight to them, with no lookup, and never
//! follows a pointer into freed memory.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Bits of [`Word`]'s place word that hold the payload length (below them, the header's
/// offset in the mapping).
const LEN_BITS: u32 = 22;
/// The largest payload length a place word can hold.
pub(crate) const MAX_LEN: u32 = (1 << LEN_BITS) - 1;
/// The largest offset in the mapping a place word can hold.
pub(crate) const MAX_AT: u64 = (1 << (64 - LEN_BITS)) - 1;

/// One object's read words: 40 bytes, 56 with the `Arc`'s counts, so one allocation of 64
/// bytes per object as before the header words were added (aligning it to a cache line would
/// double that for small objects).
#[derive(Default, Debug)]
pub(crate) struct Word {
    /// Even while the words are stable; odd while the lock holder changes them.
    seq: AtomicU32,
    /// Hits taken without the lock since the evacuator last folded them into the object's
    /// hotness (lossy under concurrent readers, capped at 15: a hint).
    hits: AtomicU32,
    /// `at << LEN_BITS | len`: the byte offset in the pool's mapping of the object's one piece
    /// (its header) and its payload length, in one word so that a read never pairs an offset
    /// with another write's length; 0 when it must be read under the lock (no place, or in
    /// several pieces; offset 0 is the control area, never a piece).
    place: AtomicU64,
    /// The piece's header, its two words as they are in memory (so that a read compares them
    /// as loaded, with nothing to compute).
    head: [AtomicU64; 2],
    /// The segment's generation when the object was placed there.
    gen: AtomicU64,
}

/// Where an object lies, as the lock holder publishes it ([`Word::publish`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    /// Byte offset of the piece's header in the pool's mapping (not 0, at most [`MAX_AT`]).
    pub(crate) at: u64,
    /// Payload length (at most [`MAX_LEN`]).
    pub(crate) len: u32,
    /// The header's two words as they are in memory.
    pub(crate) head: [u64; 2],
    /// The segment's generation when the object was placed.
    pub(crate) gen: u64,
}

/// Where one object lies, as a read without the lock saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Snapshot {
    seq: u32,
    /// Byte offset of the piece's header in the mapping; consistent with `len` (one word), and
    /// a value the lock holder published.
    pub(crate) at: u64,
    /// Payload length.
    pub(crate) len: u32,
    /// The header's two words as they are in memory.
    pub(crate) head: [u64; 2],
    /// The segment's generation when the object was placed.
    pub(crate) gen: u64,
}

impl Word {
    /// Records where the object lies now (`None`: read it under the lock). The caller holds
    /// the pool's lock, so there is one writer at a time, and has checked that the piece lies
    /// inside the mapping: a read copies `len` bytes after `at`'s header with no further check.
    pub(crate) fn publish(&self, place: Option<Placed>) {
        let w = self;
        let (packed, head, gen) = match place {
            Some(p) => {
                assert!(
                    p.at != 0 && p.at <= MAX_AT && p.len <= MAX_LEN,
                    "a place a read word cannot hold"
                );
                ((p.at << LEN_BITS) | u64::from(p.len), p.head, p.gen)
            }
            None => (0, [0, 0], 0),
        };
        // A seqlock writer: odd, then the words, then even. The release fence keeps the word
        // stores after the odd number for a reader that sees any of them.
        let s = w.seq.load(Ordering::Relaxed);
        w.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        w.place.store(packed, Ordering::Relaxed);
        w.head[0].store(head[0], Ordering::Relaxed);
        w.head[1].store(head[1], Ordering::Relaxed);
        w.gen.store(gen, Ordering::Relaxed);
        w.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// The hits taken without the lock since the last call, reset to 0.
    pub(crate) fn take_hits(&self) -> u8 {
        self.hits.swap(0, Ordering::Relaxed).min(15) as u8
    }

    /// Where the object lies, if it can be read without the lock now; to be confirmed after
    /// the copy with [`Word::still`]. Until confirmed the fields may come from different
    /// writes, but the offset and the length always come from the same one (one word), so the
    /// piece they name is one the lock holder checked lies inside the mapping.
    #[inline(always)]
    pub(crate) fn snapshot(&self) -> Option<Snapshot> {
        let w = self;
        let seq = w.seq.load(Ordering::Acquire);
        if seq & 1 == 1 {
            return None;
        }
        let packed = w.place.load(Ordering::Relaxed);
        if packed == 0 {
            return None; // no place, or in pieces
        }
        Some(Snapshot {
            seq,
            at: packed >> LEN_BITS,
            len: (packed as u32) & MAX_LEN,
            head: [
                w.head[0].load(Ordering::Relaxed),
                w.head[1].load(Ordering::Relaxed),
            ],
            gen: w.gen.load(Ordering::Relaxed),
        })
    }

    /// Whether `snap` still holds: no write changed the words since it was taken. Call after
    /// the copy (the acquire fence keeps the copy's loads before this one).
    #[inline(always)]
    pub(crate) fn still(&self, snap: &Snapshot) -> bool {
        fence(Ordering::Acquire);
        self.seq.load(Ordering::Relaxed) == snap.seq
    }

    /// Counts a hit taken without the lock (a hint for the object's hotness): a relaxed load,
    /// and a relaxed store only below the cap, so a hot object's hits write nothing shared.
    #[inline(always)]
    pub(crate) fn hit(&self) {
        let h = self.hits.load(Ordering::Relaxed);
        if h < 15 {
            self.hits.store(h + 1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(at: u64, len: u32, version: u64, gen: u64) -> Placed {
        Placed {
            at,
            len,
            head: [version, u64::from(len)],
            gen,
        }
    }

    #[test]
    fn the_words_take_no_more_room_than_one_small_allocation() {
        // With the `Arc`'s two counts: 56 bytes, one 64-byte allocation.
        assert_eq!(std::mem::size_of::<Word>(), 40);
    }

    #[test]
    fn the_largest_place_and_length_survive_packing() {
        let w = Word::default();
        w.publish(Some(placed(MAX_AT & !15, MAX_LEN, 1, 9)));
        let s = w.snapshot().unwrap();
        assert_eq!((s.at, s.len, s.gen), (MAX_AT & !15, MAX_LEN, 9));
    }

    #[test]
    fn a_snapshot_holds_until_the_words_are_published_again() {
        let w = Word::default();
        assert_eq!(w.snapshot(), None, "no place yet: the locked path");
        w.publish(Some(placed(2 * 4096 + 64, 32, 7, 5)));
        let s = w.snapshot().unwrap();
        assert_eq!(
            (s.at, s.len, s.head, s.gen),
            (2 * 4096 + 64, 32, [7, 32], 5)
        );
        assert!(w.still(&s));
        w.publish(Some(placed(2 * 4096 + 128, 32, 8, 5)));
        assert!(!w.still(&s), "a move or a rewrite invalidates it");
        w.publish(None);
        assert_eq!(w.snapshot(), None, "no place: the locked path");
    }

    #[test]
    fn a_snapshot_is_refused_while_a_write_is_under_way() {
        let w = Word::default();
        w.publish(Some(placed(4096, 8, 1, 0)));
        w.seq.fetch_add(1, Ordering::Relaxed); // a writer between its two stores
        assert_eq!(w.snapshot(), None);
    }

    #[test]
    fn hits_are_capped_and_taken_once() {
        let w = Word::default();
        w.publish(Some(placed(4096, 8, 1, 0)));
        for _ in 0..20 {
            w.hit();
        }
        assert_eq!(w.take_hits(), 15);
        assert_eq!(w.take_hits(), 0);
    }
}
