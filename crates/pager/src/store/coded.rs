//! The page codec as one layer over the blob stores: the only place that encodes, decodes and
//! keeps the page-version table.
//!
//! Every store below ([`shm`](super::shm), [`socket`](super::socket), [`pool`](super::pool))
//! moves opaque blobs; this layer turns the engine's pages into blobs on the way out
//! ([`crate::codec::CodecCtx`]: choose, compress, seal) and back on the way in, and records per
//! page the version its blob was sealed with ([`Versions`]). A blob is always opened with the
//! version recorded here when it was written, never one the far side reports, so a memnode that
//! hands back an older copy of a page, or another page's, is caught when the blob is opened.
//!
//! Where a store keeps a page of one repeated word as no blob at all (shared memory, whose index
//! is in this process: [`BlobHandle::keeps_words`]), the table holds the word in the version's
//! place, and the store hands back [`FarCopy::Word`] for it.
//!
//! The stores read the table (a socket names a far copy to drop by its version,
//! [`PageStore::forget`]) but only this layer writes it: after a commit the far side
//! acknowledged, and when the program releases pages.
//!
//! A fork child's layer opens its parent's blobs with the parent's key and seals its own with a
//! key of its own ([`Codec::for_fork_child`]); its table is this process's copy of the
//! parent's, made by the fork.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::{
    page_buf, Bell, BlobHandle, BlobStore, FarCopy, PageBuf, PageStore, StoreError, StoreHandle,
    StoreStats,
};
use crate::codec::versions::Versions;
use crate::codec::{fill_word, same_filled, Codec, CodecCtx, Encoded};
use crate::PagerError;

/// A region's far pages: the codec and the version table over a [`BlobStore`].
pub(crate) struct CodedStore {
    blobs: Box<dyn BlobStore>,
    codec: Arc<Codec>,
    versions: Versions,
}

impl CodedStore {
    /// The layer over `blobs`, its pages encoded by `codec`; `versions` is the table the store
    /// was given to read (a new one, none with a far copy, for a new session).
    pub(crate) fn new(blobs: Box<dyn BlobStore>, codec: Arc<Codec>, versions: Versions) -> Self {
        CodedStore {
            blobs,
            codec,
            versions,
        }
    }
}

impl PageStore for CodedStore {
    fn handle(&self) -> Result<Box<dyn StoreHandle>, PagerError> {
        Ok(Box::new(CodedHandle {
            blobs: self.blobs.handle()?,
            ctx: self.codec.ctx(),
            versions: self.versions.clone(),
            page: page_buf(),
            staged: Vec::new(),
        }))
    }

    fn release(&self, ranges: &[(u64, u32)]) {
        let held = self.versions.len() as u64;
        for &(first, count) in ranges {
            for page in first.min(held)..first.saturating_add(u64::from(count)).min(held) {
                // Reading first leaves the table's untouched pages untouched.
                if self.versions.get(page) != 0 {
                    self.versions.record(page, 0);
                }
            }
        }
        self.blobs.release(ranges);
    }

    fn forget(&self, page: u64) {
        self.blobs.forget(page);
    }

    fn close(&self) {
        self.blobs.close();
    }

    fn can_share_with_child(&self) -> bool {
        // A child's codec has no third key: it cannot hand its own snapshot down again.
        !self.codec.is_fork_child() && self.blobs.can_share_with_child()
    }

    fn hold_for_child(&self, alive: OwnedFd) -> Result<(), StoreError> {
        self.blobs.hold_for_child(alive)
    }

    fn fork_child(&self, client_name: &str) -> Result<Box<dyn PageStore>, PagerError> {
        Ok(Box::new(CodedStore {
            blobs: self.blobs.fork_child(client_name)?,
            codec: self.codec.for_fork_child()?,
            // This process's copy of the parent's table: the versions of the snapshot.
            versions: self.versions.clone(),
        }))
    }

    fn describe(&self) -> String {
        self.blobs.describe()
    }

    fn capacity_pages(&self) -> u64 {
        self.blobs.capacity_pages()
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            codec: self.codec.stats(),
            ..self.blobs.stats()
        }
    }
}

/// One thread's layer: its codec context over its store handle.
pub(crate) struct CodedHandle {
    blobs: Box<dyn BlobHandle>,
    ctx: CodecCtx,
    versions: Versions,
    /// Where a page is decoded into.
    page: PageBuf,
    /// The pages staged since the last commit, with their blobs' versions (or words), recorded
    /// once the commit succeeds.
    staged: Vec<(u64, u64)>,
}

/// Decodes `copy`, the far copy of region page `page`, into `dst`, opened with what `versions`
/// records for it.
fn decode(
    ctx: &mut CodecCtx,
    versions: &Versions,
    page: u64,
    copy: FarCopy<'_>,
    dst: &mut [u8],
) -> Result<(), StoreError> {
    match copy {
        FarCopy::Word => {
            fill_word(dst, versions.get(page));
            Ok(())
        }
        FarCopy::Blob(blob) => ctx
            .decode(page, versions.get(page), blob, dst)
            .map_err(|t| StoreError::Lost(t.to_string())),
    }
}

impl StoreHandle for CodedHandle {
    fn request(&mut self, pages: &[u64]) -> Result<(), StoreError> {
        self.blobs.request(pages)
    }

    fn request_prefetch(
        &mut self,
        pages: &[u64],
        deadline: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.blobs.request_prefetch(pages, deadline)
    }

    fn receive(&mut self, f: &mut dyn FnMut(usize, &[u8])) -> Result<(), StoreError> {
        let (ctx, versions, buf) = (&mut self.ctx, &self.versions, &mut self.page);
        self.blobs.receive(&mut |i, page, copy| {
            decode(ctx, versions, page, copy, &mut buf[..])?;
            f(i, &buf[..]);
            Ok(())
        })
    }

    fn reserve(&mut self, pages: &[u64]) -> Result<(), StoreError> {
        self.blobs.reserve(pages)
    }

    fn stage<'d>(
        &mut self,
        pages: &[u64],
        data: &mut dyn FnMut(usize) -> &'d [u8],
    ) -> Result<(), StoreError> {
        self.blobs.begin_stage();
        self.staged.clear();
        let words = self.blobs.keeps_words();
        for (i, &page) in pages.iter().enumerate() {
            // Encoded straight into the store's room: no copy of the page is made before.
            let out = self.blobs.room();
            let encoded = if words {
                self.ctx.encode_or_word(page, data(i), out)
            } else {
                self.ctx.encode_blob(page, data(i), out)
            };
            self.blobs.push(page, encoded)?;
            self.staged.push((
                page,
                match encoded {
                    Encoded::Word(word) => word,
                    Encoded::Blob { version, .. } => version,
                },
            ));
        }
        Ok(())
    }

    fn choose_compressor(&mut self, zstd: bool) -> bool {
        if !self.blobs.follows_compressor_choice() {
            return false;
        }
        self.ctx.use_zstd(zstd);
        self.ctx.codec().chooses_compressor()
    }

    fn commit(&mut self) -> Result<(), StoreError> {
        self.commit_watching(None)
    }

    fn commit_watching(&mut self, bell: Option<Bell<'_>>) -> Result<(), StoreError> {
        let result = self.blobs.commit_watching(bell);
        if result.is_ok() {
            // Stored: the far side now holds these versions (a refused batch stored nothing,
            // and its pages stay local until written back again).
            for &(page, version) in &self.staged {
                self.versions.record(page, version);
            }
        }
        self.staged.clear();
        result
    }

    fn far_copy_matches(&mut self, page: u64, data: &[u8]) -> Option<bool> {
        let (ctx, versions, buf) = (&mut self.ctx, &self.versions, &mut self.page);
        match self.blobs.far_copy(page)? {
            FarCopy::Word => Some(same_filled(data) == Some(versions.get(page))),
            // A far copy that cannot be decoded is not equal: the page is written back again.
            copy => {
                Some(decode(ctx, versions, page, copy, &mut buf[..]).is_ok() && buf[..] == *data)
            }
        }
    }

    fn has_far_copy(&self, page: u64) -> bool {
        self.blobs.has_far_copy(page)
    }
}
