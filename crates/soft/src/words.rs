//! Read words: what a read needs of one object, readable without the pool's lock.
//!
//! Each object has a small seqlock ([`Word`]): a sequence number and three words (where the
//! object lies, its version and length, the generation its segment had when it was placed). Only
//! the holder of the pool's lock writes them ([`Word::publish`]), whenever the object's place
//! changes; a read takes a consistent snapshot without the lock ([`Word::snapshot`] then
//! [`Word::still`]), copies the object out, and trusts the copy only if the sequence number did
//! not move meanwhile, the segment's generation is the one recorded (the daemon bumps it before
//! it punches) and the piece's header is the one written. Anything else sends the read to the
//! locked path, which decides. The copy may overlap the lock holder's writes to the same bytes
//! (a seqlock's reader always may): it is a raw copy out of the shared mapping
//! (`Mapping::append_to`), which other processes write as well, and its bytes are used only once
//! the checks above have passed.
//!
//! The words are shared (`Arc`) between the pool's record of the object and its soft pointer,
//! which keeps them for its life: a read goes straight to them, with no lookup, and never
//! follows a pointer into freed memory.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// One object's read words.
#[derive(Default, Debug)]
pub(crate) struct Word {
    /// Even while the words are stable; odd while the lock holder changes them.
    seq: AtomicU32,
    /// Hits taken without the lock since the evacuator last folded them into the object's
    /// hotness (lossy under concurrent readers, capped at 15: a hint).
    hits: AtomicU32,
    /// `seg << 32 | off` of the object's one piece; 0 when it must be read under the lock (no
    /// place, or in several pieces).
    at: AtomicU64,
    /// `version << 32 | len`.
    meta: AtomicU64,
    /// The segment's generation when the object was placed there.
    gen: AtomicU64,
}

/// Where one object lies, as a read without the lock saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Snapshot {
    seq: u32,
    /// Segment (1-based).
    pub(crate) seg: u32,
    /// Offset of the piece's header in the segment.
    pub(crate) off: u32,
    /// Payload length.
    pub(crate) len: u32,
    /// Version written in the header.
    pub(crate) version: u32,
    /// The segment's generation when the object was placed.
    pub(crate) gen: u64,
}

impl Word {
    /// Records where the object lies now (`None`: read it under the lock). The caller holds
    /// the pool's lock, so there is one writer at a time.
    pub(crate) fn publish(&self, place: Option<(u32, u32, u32, u32, u64)>) {
        let w = self;
        let (at, meta, gen) = match place {
            Some((seg, off, len, version, gen)) => (
                (u64::from(seg) << 32) | u64::from(off),
                (u64::from(version) << 32) | u64::from(len),
                gen,
            ),
            None => (0, 0, 0),
        };
        // A seqlock writer: odd, then the words, then even. The release fence keeps the word
        // stores after the odd number for a reader that sees any of them.
        let s = w.seq.load(Ordering::Relaxed);
        w.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        w.at.store(at, Ordering::Relaxed);
        w.meta.store(meta, Ordering::Relaxed);
        w.gen.store(gen, Ordering::Relaxed);
        w.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// The hits taken without the lock since the last call, reset to 0.
    pub(crate) fn take_hits(&self) -> u8 {
        self.hits.swap(0, Ordering::Relaxed).min(15) as u8
    }

    /// Where the object lies, if it can be read without the lock now; to be confirmed after
    /// the copy with [`Word::still`]. Each field is one the lock holder wrote, but until
    /// confirmed they may come from different writes: the caller checks their ranges.
    #[inline(always)]
    pub(crate) fn snapshot(&self) -> Option<Snapshot> {
        let w = self;
        let seq = w.seq.load(Ordering::Acquire);
        if seq & 1 == 1 {
            return None;
        }
        let at = w.at.load(Ordering::Relaxed);
        if at >> 32 == 0 {
            return None; // no place (segments count from 1)
        }
        let meta = w.meta.load(Ordering::Relaxed);
        Some(Snapshot {
            seq,
            seg: (at >> 32) as u32,
            off: at as u32,
            len: meta as u32,
            version: (meta >> 32) as u32,
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

    #[test]
    fn a_snapshot_holds_until_the_words_are_published_again() {
        let w = Word::default();
        assert_eq!(w.snapshot(), None, "no place yet: the locked path");
        w.publish(Some((2, 64, 32, 7, 5)));
        let s = w.snapshot().unwrap();
        assert_eq!((s.seg, s.off, s.len, s.version, s.gen), (2, 64, 32, 7, 5));
        assert!(w.still(&s));
        w.publish(Some((2, 128, 32, 8, 5)));
        assert!(!w.still(&s), "a move or a rewrite invalidates it");
        w.publish(None);
        assert_eq!(w.snapshot(), None, "no place: the locked path");
    }

    #[test]
    fn a_snapshot_is_refused_while_a_write_is_under_way() {
        let w = Word::default();
        w.publish(Some((1, 0, 8, 1, 0)));
        w.seq.fetch_add(1, Ordering::Relaxed); // a writer between its two stores
        assert_eq!(w.snapshot(), None);
    }

    #[test]
    fn hits_are_capped_and_taken_once() {
        let w = Word::default();
        w.publish(Some((1, 0, 8, 1, 0)));
        for _ in 0..20 {
            w.hit();
        }
        assert_eq!(w.take_hits(), 15);
        assert_eq!(w.take_hits(), 0);
    }
}
