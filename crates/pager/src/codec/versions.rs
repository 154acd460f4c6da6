//! The page-version table: per region page, the version its far blob was sealed with (0: no far
//! copy), or, for a page a store keeps as one repeated word, that word. The codec layer over the
//! stores (`store/coded.rs`) keeps it and alone writes it, so that every store's blobs are opened
//! the same way: with the version this client recorded when the blob was written, never one a
//! memnode reports, so a memnode that hands back an older copy of a page, or another page's, is
//! caught when the blob is opened.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The versions of a region's far blobs, shared by the store's handles (cheap to clone).
#[derive(Clone)]
pub(crate) struct Versions(Arc<Box<[AtomicU64]>>);

impl Versions {
    /// A table for `pages` region pages, none with a far copy.
    pub(crate) fn new(pages: usize) -> Versions {
        Versions(Arc::new(zeroed_atomics(pages)))
    }

    /// The version `page`'s far blob was sealed with; 0 for none (or a page past the table).
    pub(crate) fn get(&self, page: u64) -> u64 {
        self.0
            .get(page as usize)
            .map_or(0, |v| v.load(Ordering::Relaxed))
    }

    /// Records that `page`'s far blob is now the one sealed with `version` (0: none).
    pub(crate) fn record(&self, page: u64, version: u64) {
        if let Some(v) = self.0.get(page as usize) {
            v.store(version, Ordering::Relaxed);
        }
    }

    /// How many pages the table covers.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

/// `n` atomics holding 0, from zeroed memory (untouched pages of a large index cost nothing).
pub(crate) fn zeroed_atomics(n: usize) -> Box<[AtomicU64]> {
    let v = Box::<[AtomicU64]>::new_zeroed_slice(n);
    // SAFETY: an all-zero u64 is a valid AtomicU64 holding 0.
    unsafe { v.assume_init() }
}
