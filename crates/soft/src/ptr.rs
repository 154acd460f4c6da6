//! Soft pointers: a unique owner of one soft object, and a shared (reference-counted) one.
//! Their reads return copies: the memory behind them can be taken at any moment, so no
//! reference into it ever leaves the runtime.

use std::sync::Arc;

use crate::pool::Pool;
use crate::words::Word;

impl Pool {
    /// A new soft unique pointer (empty: its first read runs the reconstructor).
    pub fn new_unique(&self) -> SoftBox {
        let (slot, words) = self.inner.new_slot();
        SoftBox {
            pool: self.clone(),
            slot,
            words,
        }
    }
}

/// A soft unique pointer (Midas's `SoftUniquePtr`): one object in a [`Pool`]. Dropping it frees
/// the object.
pub struct SoftBox {
    pub(crate) pool: Pool,
    pub(crate) slot: u32,
    /// Its read words, shared with the pool's record of the object: a read goes straight to
    /// them.
    words: Arc<Word>,
}

impl std::fmt::Debug for SoftBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftBox").field("slot", &self.slot).finish()
    }
}

impl SoftBox {
    /// A copy of the object; on a miss the pool's reconstructor runs with `args` and its
    /// result is cached. `None` only if the reconstructor gives nothing.
    pub fn read(&self, args: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        self.read_into(args, &mut out).then_some(out)
    }

    /// As [`SoftBox::read`], into `out` (reusing its allocation); false if nothing was read.
    /// A hit is inlined into the caller: no lock, no shared atomic write.
    #[inline]
    pub fn read_into(&self, args: &[u8], out: &mut Vec<u8>) -> bool {
        self.pool.inner.read_hit(&self.words, args, out) || self.read_locked(args, out)
    }

    /// The read's locked path (a hit the unlocked path could not take, or a miss), out of line.
    #[cold]
    #[inline(never)]
    fn read_locked(&self, args: &[u8], out: &mut Vec<u8>) -> bool {
        self.pool.inner.read_locked(self.slot, args, out)
    }

    /// Replaces the object's value (no reconstruction needed). False if the grant had no room
    /// for it (the next read is then a miss).
    pub fn write(&self, value: &[u8]) -> bool {
        self.pool.inner.write(self.slot, value)
    }

    /// Writes `new` only if the object is present and equals `old`.
    pub fn cmpxchg(&self, old: &[u8], new: &[u8]) -> bool {
        self.pool.inner.cmpxchg(self.slot, old, new)
    }

    /// Whether the object is in soft memory now (a read would hit, barring a punch meanwhile).
    pub fn is_present(&self) -> bool {
        self.pool.inner.present(self.slot)
    }

    /// The pool it lives in.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }
}

impl Drop for SoftBox {
    fn drop(&mut self) {
        self.pool.inner.free_slot(self.slot);
    }
}

/// A soft shared pointer (Midas's `SoftSharedPtr`): clones share one object, freed with the
/// last clone.
#[derive(Clone, Debug)]
pub struct SoftShared(Arc<SoftBox>);

impl SoftShared {
    /// A new shared pointer in `pool`.
    pub fn new(pool: &Pool) -> SoftShared {
        SoftShared(Arc::new(pool.new_unique()))
    }

    /// How many clones share the object.
    pub fn count(&self) -> usize {
        Arc::strong_count(&self.0)
    }
}

impl std::ops::Deref for SoftShared {
    type Target = SoftBox;
    fn deref(&self) -> &SoftBox {
        &self.0
    }
}
