//! Read words: what a read needs of one object, readable without the pool's lock.
//!
//! Each object slot has a small seqlock: a sequence number and three words (where the object
//! lies, its version and length, the generation its segment had when it was placed). Only the
//! holder of the pool's lock writes them ([`ReadWords::publish`]), whenever the object's place
//! changes; a read takes a consistent snapshot without the lock
//! ([`ReadWords::snapshot`] then [`ReadWords::still`]), copies the object out, and trusts the
//! copy only if the sequence number did not move meanwhile, the segment's generation is the one
//! recorded (the daemon bumps it before it punches) and the piece's header is the one written.
//! Anything else sends the read to the locked path, which decides. The copy may overlap the lock
//! holder's writes to the same bytes (a seqlock's reader always may): it is a raw copy out of
//! the shared mapping (`Mapping::copy_out`, `append_to`), which other processes write as well,
//! and its bytes are used only once the checks above have passed.
//!
//! The words live in chunks of [`CHUNK`] slots made on first use and kept for the pool's life,
//! so a reader never follows a pointer into freed memory; slots beyond `CHUNK * CHUNKS` (16 Mi)
//! have none and always take the locked path.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

/// Slots per chunk.
const CHUNK: usize = 4096;
/// Chunks a pool can have: slots beyond `CHUNK * CHUNKS` read under the lock.
const CHUNKS: usize = 4096;

/// One object's read words.
#[derive(Default)]
struct Word {
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

/// The read words of every slot of one pool.
pub(crate) struct ReadWords {
    chunks: Box<[OnceLock<Box<[Word]>>]>,
}

impl Default for ReadWords {
    fn default() -> Self {
        ReadWords {
            chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect(),
        }
    }
}

impl ReadWords {
    #[inline]
    fn word(&self, slot: u32) -> Option<&Word> {
        let slot = slot as usize;
        let chunk = self.chunks.get(slot / CHUNK)?.get()?;
        Some(&chunk[slot % CHUNK])
    }

    /// The slot's words, made if need be (called under the pool's lock); `None` past
    /// [`MAX_SLOTS`].
    fn word_or_make(&self, slot: u32) -> Option<&Word> {
        let slot = slot as usize;
        let chunk = self
            .chunks
            .get(slot / CHUNK)?
            .get_or_init(|| (0..CHUNK).map(|_| Word::default()).collect());
        Some(&chunk[slot % CHUNK])
    }

    /// Records where `slot`'s object lies now (`None`: read it under the lock). The caller
    /// holds the pool's lock, so there is one writer at a time.
    pub(crate) fn publish(&self, slot: u32, place: Option<(u32, u32, u32, u32, u64)>) {
        let Some(w) = self.word_or_make(slot) else {
            return;
        };
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

    /// Where `slot`'s object lies, if it can be read without the lock now; to be confirmed
    /// after the copy with [`ReadWords::still`]. Each field is one the lock holder wrote, but
    /// until confirmed they may come from different writes: the caller checks their ranges.
    #[inline]
    pub(crate) fn snapshot(&self, slot: u32) -> Option<Snapshot> {
        let w = self.word(slot)?;
        let seq = w.seq.load(Ordering::Acquire);
        if seq & 1 == 1 {
            return None;
        }
        let at = w.at.load(Ordering::Relaxed);
        if at == 0 {
            return None;
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

    /// Whether `snap` still holds: no write changed the slot's words since it was taken. Call
    /// after the copy (the acquire fence keeps the copy's loads before this one).
    #[inline]
    pub(crate) fn still(&self, slot: u32, snap: &Snapshot) -> bool {
        fence(Ordering::Acquire);
        self.word(slot)
            .is_some_and(|w| w.seq.load(Ordering::Relaxed) == snap.seq)
    }

    /// Counts a hit taken without the lock (a hint for the object's hotness).
    #[inline]
    pub(crate) fn hit(&self, slot: u32) {
        if let Some(w) = self.word(slot) {
            let h = w.hits.load(Ordering::Relaxed);
            if h < 15 {
                w.hits.store(h + 1, Ordering::Relaxed);
            }
        }
    }

    /// The hits taken without the lock since the last call, reset to 0.
    pub(crate) fn take_hits(&self, slot: u32) -> u8 {
        self.word(slot)
            .map_or(0, |w| w.hits.swap(0, Ordering::Relaxed).min(15) as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX_SLOTS: usize = CHUNK * CHUNKS;

    #[test]
    fn a_snapshot_holds_until_the_slot_is_published_again() {
        let w = ReadWords::default();
        assert_eq!(w.snapshot(3), None, "no words yet: the locked path");
        w.publish(3, Some((2, 64, 32, 7, 5)));
        let s = w.snapshot(3).unwrap();
        assert_eq!((s.seg, s.off, s.len, s.version, s.gen), (2, 64, 32, 7, 5));
        assert!(w.still(3, &s));
        w.publish(3, Some((2, 128, 32, 8, 5)));
        assert!(!w.still(3, &s), "a move or a rewrite invalidates it");
        w.publish(3, None);
        assert_eq!(w.snapshot(3), None, "no place: the locked path");
        assert_eq!(w.snapshot(MAX_SLOTS as u32), None);
        w.publish(MAX_SLOTS as u32, Some((1, 0, 1, 1, 1)));
        assert_eq!(
            w.snapshot(MAX_SLOTS as u32),
            None,
            "past the chunks: always locked"
        );
    }

    #[test]
    fn hits_are_capped_and_taken_once() {
        let w = ReadWords::default();
        w.publish(0, Some((1, 0, 8, 1, 0)));
        for _ in 0..20 {
            w.hit(0);
        }
        assert_eq!(w.take_hits(0), 15);
        assert_eq!(w.take_hits(0), 0);
    }
}
