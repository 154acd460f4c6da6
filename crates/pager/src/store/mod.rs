//! Where a region's far pages live, in two layers.
//!
//! * What the engine sees: a [`PageStore`] per region (session-wide operations) and a
//!   [`StoreHandle`] per thread (reads and writes), through which pages pass as plain 4 KiB
//!   pages. Their one implementation is [`coded`]: the page codec (compression, sealing) and the
//!   page-version table, owned in one place, over a blob store.
//! * What a store is: a [`BlobStore`] per region and a [`BlobHandle`] per thread, which move
//!   opaque blobs (what the codec made of the pages) to and from the far side and never look
//!   inside them. Three of them:
//!   * [`shm::ShmStore`]: the memnode runs on this host (a Unix socket). It grants the session
//!     shared-memory slabs; the client maps them and keeps its own index of which page's blob
//!     lives where. A fetch is a decode out of the client's own mapping and a write-back an
//!     encode into it: no request, no memnode wake-up on the data path.
//!   * [`socket::SocketStore`]: any memnode, over TCP or a Unix socket: batched `Read` and
//!     `Write` requests, one connection per thread that uses the store.
//!   * [`pool::PoolStore`]: several memnodes, each extent of pages replicated on some of them.

mod arena;
mod blobs;
pub(crate) mod coded;
pub(crate) mod embedded;
pub(crate) mod pool;
pub(crate) mod shm;
pub(crate) mod socket;

use std::sync::Arc;

use gleaner_proto::{ConnectOptions, Endpoint, Token};
use serde::Serialize;

pub(crate) use crate::codec::versions::zeroed_atomics;
use crate::codec::versions::Versions;
use crate::codec::{Codec, CodecStats};
use crate::{PagerError, PAGE_SIZE};

/// How a region reaches its memnode's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataPath {
    /// Shared memory when the memnode is on this host (a Unix socket), else the socket.
    #[default]
    Auto,
    /// Shared-memory slabs (refused for a memnode reached over TCP).
    Shm,
    /// `Read`/`Write` requests over the socket, even to a memnode on this host.
    Socket,
}

impl std::str::FromStr for DataPath {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(DataPath::Auto),
            "shm" => Ok(DataPath::Shm),
            "socket" => Ok(DataPath::Socket),
            _ => Err(format!(
                "`{s}` is not a data path: use auto (shared memory for a memnode on this host), \
                 shm or socket"
            )),
        }
    }
}

impl std::fmt::Display for DataPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DataPath::Auto => "auto",
            DataPath::Shm => "shm",
            DataPath::Socket => "socket",
        })
    }
}

/// Why a store operation failed.
#[derive(Debug)]
pub(crate) enum StoreError {
    /// No room on the far side: nothing of the write was stored.
    Full(String),
    /// The data cannot be had or kept: the memnode is unreachable, refused, or lost a page.
    Lost(String),
    /// A prefetch waited past its deadline at the memnode and was dropped: nothing was read,
    /// nothing is lost (the pages are still there for a demand read).
    Late(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Full(why) | StoreError::Lost(why) | StoreError::Late(why) => {
                f.write_str(why)
            }
        }
    }
}

/// What the stats JSON says about the store.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StoreStats {
    /// `shm` or `socket`.
    pub data_path: &'static str,
    /// Shared-memory slabs mapped (shm).
    pub slabs: u64,
    /// Pages of those slabs.
    pub slab_pages: u64,
    /// Pages with a far copy (shm; same-filled pages are kept in the index, without a blob).
    pub pages_stored: u64,
    /// Far copies dropped while their pages were resident (`PageStore::forget`; over a socket,
    /// those the memnode confirmed).
    pub copies_dropped: u64,
    /// Bytes of slab memory holding blobs now: what the host spends on this region's far pages
    /// (shm).
    pub resident_bytes: u64,
    /// The most `resident_bytes` ever was (shm).
    pub peak_resident_bytes: u64,
    /// `blob_bytes` when `resident_bytes` peaked (shm): the allocator's slack then.
    pub blob_bytes_at_peak: u64,
    /// Blobs (far pages other than same-filled ones) held when `resident_bytes` peaked (shm).
    pub blobs_at_peak: u64,
    /// Bytes of the blobs themselves (shm): `resident_bytes` less the allocator's slack.
    pub blob_bytes: u64,
    /// Slab pages no blob reached any more, punched out to give their memory back (shm), in
    /// all.
    pub pages_punched: u64,
    /// Slab pages new blobs reached that held no memory (shm), in all: each costs the host a
    /// fresh page (a shared-memory fault). Beside `pages_punched`, the churn the allocator
    /// causes.
    pub pages_fresh: u64,
    /// Grant requests that found the memnode full (shm).
    pub grants_refused: u64,
    /// Blobs freed but kept because a fork child may still read them (shm).
    pub blobs_held_for_children: u64,
    /// Broken or unresponsive connections replaced by new ones to the same session (socket).
    pub reconnects: u64,
    /// The memnodes of a pool and their replicas (a pool only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<pool::PoolStats>,
    /// What the page codec did.
    pub codec: CodecStats,
}

/// What the engine sees of a region's far pages, session-wide: pages in, pages out. Implemented
/// once, by [`coded::CodedStore`] (the codec over a [`BlobStore`]).
pub(crate) trait PageStore: Send + Sync {
    /// A handle for one thread (each fault handler and reclaim thread owns one).
    fn handle(&self) -> Result<Box<dyn StoreHandle>, PagerError>;
    /// Forgets `(first page, count)` ranges the program discarded. Only space is at stake: a
    /// failure is logged, not fatal.
    fn release(&self, ranges: &[(u64, u32)]);
    /// Drops the far copy of `page`, which the caller owns (FETCHING, MARKING or EVICTING) and
    /// which is resident, to save the memory it takes while the page is: the page is dirty (its
    /// copy stale), or the region tracks writes asynchronously (eviction then finds the far
    /// copy missing, [`StoreHandle::far_copy_matches`] says so, and writes the page back). See
    /// `Engine::drop_far_copy`. Shared memory drops it at once; a socket notes the page and the
    /// version fetched, and drops them on the memnode (a pool: on every member holding it) in
    /// batches.
    fn forget(&self, page: u64);
    /// Ends the session (the region is going away).
    fn close(&self);
    /// Whether a fork child can be given the far pages as they are at the fork, without
    /// bringing them home: see [`PageStore::hold_for_child`] and [`PageStore::fork_child`].
    fn can_share_with_child(&self) -> bool;
    /// Keeps every far copy stored now readable as it is for the child about to be forked,
    /// whatever this process writes or frees later: shared memory holds the blobs it frees until
    /// `alive` (the read end of a pipe whose write end only the child holds) reports the end of
    /// file (the child has exited or exec'd); a socket asks the memnode for a copy of the
    /// session. On an error nothing is held and the fork must bring the pages home.
    fn hold_for_child(&self, alive: std::os::fd::OwnedFd) -> Result<(), StoreError>;
    /// In a fork child, before the program goes on: the child's store on the snapshot its
    /// parent holds for it, with a session of its own (client `client_name`) for what it
    /// writes.
    fn fork_child(&self, client_name: &str) -> Result<Box<dyn PageStore>, PagerError>;
    /// The memnode's address, for stats and messages.
    fn describe(&self) -> String;
    /// The memnode's total capacity in pages (shared with its other sessions).
    fn capacity_pages(&self) -> u64;
    /// What the store holds, for the stats JSON.
    fn stats(&self) -> StoreStats;
}

/// What a commit watches while the memnode has its write ([`StoreHandle::commit_watching`]):
/// a file that becomes readable when the caller has something to do meanwhile (a fault waits
/// for a page of the batch being written back), and what to do then.
pub(crate) struct Bell<'a> {
    /// Readable when `on_ring` should be called (an eventfd; `on_ring` resets it).
    pub(crate) fd: std::os::fd::BorrowedFd<'a>,
    /// Called on the committing thread while the write is in flight; it must not use the
    /// store handle.
    pub(crate) on_ring: &'a mut dyn FnMut(),
}

impl Bell<'_> {
    /// The same bell, borrowed for one more commit (a pool's, member after member).
    pub(crate) fn reborrow(&mut self) -> Bell<'_> {
        Bell {
            fd: self.fd,
            on_ring: &mut *self.on_ring,
        }
    }
}

/// One thread's access to the far pages (each fault handler and reclaim thread owns one).
/// Implemented once, by [`coded::CodedHandle`] (the codec over a [`BlobHandle`]).
pub(crate) trait StoreHandle: Send {
    /// Starts fetching `pages` (at most [`gleaner_proto::MAX_BATCH_PAGES`]): over a socket the
    /// request leaves now, so the caller can do other work while the memnode answers. Complete
    /// it with [`StoreHandle::receive`] before any other call.
    fn request(&mut self, pages: &[u64]) -> Result<(), StoreError>;
    /// Like [`StoreHandle::request`], for pages fetched ahead of demand: a memnode that
    /// schedules its link may drop the request if it waits longer than `deadline` (its
    /// [`StoreHandle::receive`] then fails with [`StoreError::Late`], having read nothing).
    fn request_prefetch(
        &mut self,
        pages: &[u64],
        deadline: std::time::Duration,
    ) -> Result<(), StoreError>;
    /// Completes the last request: calls `f(i, data)` for each page, in request order, with its
    /// 4 KiB of data (valid only during the call).
    fn receive(&mut self, f: &mut dyn FnMut(usize, &[u8])) -> Result<(), StoreError>;
    /// Makes sure `pages` (at most [`gleaner_proto::MAX_BATCH_PAGES`]) can be staged without
    /// running out of room, all or nothing. No store promises anything here today: blob sizes
    /// are known only once the pages are encoded, so shared memory finds room at commit (and
    /// undoes the whole batch when the memnode has none to grant), and a socket's memnode
    /// reports a lack of room at [`StoreHandle::commit`].
    fn reserve(&mut self, pages: &[u64]) -> Result<(), StoreError>;
    /// Encodes the contents of `pages` (some or all of those last reserved) for the next commit:
    /// `data(i)` is the i-th page's 4 KiB, read where the caller holds it (the codec is the first
    /// to read it: no copy is made before). The codec layer encodes each page into the room the
    /// blob store offers: shared memory's batch, a socket's scratch beside its send buffer.
    fn stage<'d>(
        &mut self,
        pages: &[u64],
        data: &mut dyn FnMut(usize) -> &'d [u8],
    ) -> Result<(), StoreError>;
    /// Under `--compress auto`, asks the pages staged next to be compressed with zstd (`true`)
    /// or LZ4 (`codec/choice.rs`); returns whether the store follows such choices: only one
    /// with a link whose time the bytes make (a socket), not shared memory (always LZ4).
    fn choose_compressor(&mut self, zstd: bool) -> bool;
    /// Makes the staged pages durable on the far side. On [`StoreError::Full`] (a socket only)
    /// nothing was stored.
    fn commit(&mut self) -> Result<(), StoreError>;
    /// Like [`StoreHandle::commit`], answering `bell` while it waits for the far side: a socket
    /// (and a pool, for each member in turn) calls its `on_ring` whenever its file becomes
    /// readable until the memnode acknowledges the write; shared memory, which does not wait
    /// long, does not watch it.
    fn commit_watching(&mut self, bell: Option<Bell<'_>>) -> Result<(), StoreError>;
    /// Whether the far copy of `page` (which the caller owns) equals `data`: shared memory
    /// decodes the page's blob and compares; `None` when there is no far copy to compare (none
    /// is kept, or a socket, which cannot tell).
    fn far_copy_matches(&mut self, page: u64, data: &[u8]) -> Option<bool>;
    /// Whether [`StoreHandle::far_copy_matches`] could compare `page` (which the caller owns)
    /// with a far copy: false when none is kept, or the store cannot tell (a socket).
    fn has_far_copy(&self, page: u64) -> bool;
    /// Stores `pages`: reserve, stage and commit at once. All or nothing on
    /// [`StoreError::Full`].
    #[cfg(test)]
    fn write<'d>(
        &mut self,
        pages: &[u64],
        data: &mut dyn FnMut(usize) -> &'d [u8],
    ) -> Result<(), StoreError> {
        self.reserve(pages)?;
        self.stage(pages, data)?;
        self.commit()
    }
}

/// A far copy as a store holds it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FarCopy<'a> {
    /// The blob the codec made of the page, as stored (valid only during the call that hands
    /// it out).
    Blob(&'a [u8]),
    /// The page is one repeated word, which the store did not keep: the codec layer's table
    /// holds it (only a store whose [`BlobHandle::keeps_words`] says so hands these out).
    Word,
}

/// A store, session-wide: where a region's blobs live. It moves opaque blobs and never looks
/// inside one; [`coded::CodedStore`] makes pages of them. The methods mean what
/// [`PageStore`]'s do.
pub(crate) trait BlobStore: Send + Sync {
    /// A handle for one thread.
    fn handle(&self) -> Result<Box<dyn BlobHandle>, PagerError>;
    /// Forgets `(first page, count)` ranges the program discarded (see [`PageStore::release`]).
    fn release(&self, ranges: &[(u64, u32)]);
    /// Drops the far copy of `page`, which the caller owns and which is resident (see
    /// [`PageStore::forget`]).
    fn forget(&self, _page: u64) {}
    /// Ends the session.
    fn close(&self);
    /// Whether the blobs stored now can be given to a fork child as they are (see
    /// [`PageStore::can_share_with_child`]).
    fn can_share_with_child(&self) -> bool {
        false
    }
    /// Keeps every blob stored now readable for the child about to be forked (see
    /// [`PageStore::hold_for_child`]).
    fn hold_for_child(&self, _alive: std::os::fd::OwnedFd) -> Result<(), StoreError> {
        Err(StoreError::Lost(format!(
            "far memory cannot be shared with a fork child over {}",
            self.describe()
        )))
    }
    /// In a fork child: the child's store on the snapshot its parent holds for it.
    fn fork_child(&self, _client_name: &str) -> Result<Box<dyn BlobStore>, PagerError> {
        Err(PagerError::Config(format!(
            "far memory cannot be shared with a fork child over {}",
            self.describe()
        )))
    }
    /// The memnode's address, for stats and messages.
    fn describe(&self) -> String;
    /// The memnode's total capacity in pages.
    fn capacity_pages(&self) -> u64;
    /// What the store holds, for the stats JSON (its `codec` part is the layer's to fill).
    fn stats(&self) -> StoreStats;
}

/// One thread's access to a [`BlobStore`]. A write-back is [`BlobHandle::reserve`], then
/// [`BlobHandle::begin_stage`] and, per page, [`BlobHandle::room`] (the codec encodes the page
/// there) and [`BlobHandle::push`], then [`BlobHandle::commit_watching`].
pub(crate) trait BlobHandle: Send {
    /// Starts fetching the blobs of `pages` (see [`StoreHandle::request`]).
    fn request(&mut self, pages: &[u64]) -> Result<(), StoreError>;
    /// Like [`BlobHandle::request`], for pages fetched ahead of demand (see
    /// [`StoreHandle::request_prefetch`]).
    fn request_prefetch(
        &mut self,
        pages: &[u64],
        _deadline: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.request(pages)
    }
    /// Completes the last request: calls `f(i, page, copy)` for each page, in request order (a
    /// page may come more than once, read again from another replica after an error; `f`
    /// tolerates that).
    fn receive(
        &mut self,
        f: &mut dyn FnMut(usize, u64, FarCopy<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError>;
    /// Makes sure `pages` can be staged without running out of room (see
    /// [`StoreHandle::reserve`]).
    fn reserve(&mut self, _pages: &[u64]) -> Result<(), StoreError> {
        Ok(())
    }
    /// Whether the store keeps a page of one repeated word as no blob at all (shared memory,
    /// whose index is in this process): the codec layer then pushes [`Encoded::Word`] for such
    /// pages and keeps the word in its table. A store that sends its blobs away says no: every
    /// page leaves sealed.
    ///
    /// [`Encoded::Word`]: crate::codec::Encoded::Word
    fn keeps_words(&self) -> bool {
        false
    }
    /// Starts the batch of the next commit.
    fn begin_stage(&mut self);
    /// Where the codec encodes the next page's blob: at least
    /// [`ENCODE_ROOM`](crate::codec::ENCODE_ROOM) bytes; the blob lies at its start.
    fn room(&mut self) -> &mut [u8];
    /// Stages `page`'s far copy for the next commit: the blob just encoded at the start of
    /// [`BlobHandle::room`] (its length and the version it carries in the clear), or a word
    /// (only where [`BlobHandle::keeps_words`]).
    fn push(&mut self, page: u64, copy: crate::codec::Encoded) -> Result<(), StoreError>;
    /// Whether a link's time depends on the bytes sent (a socket), so that the codec should
    /// follow `--compress auto`'s choice of compressor for it (`codec/choice.rs`).
    fn follows_compressor_choice(&self) -> bool {
        false
    }
    /// Makes the staged blobs durable on the far side (see [`StoreHandle::commit_watching`]).
    fn commit_watching(&mut self, bell: Option<Bell<'_>>) -> Result<(), StoreError>;
    /// The far copy of `page` (which the caller owns), where the store can show it without a
    /// request (shared memory); `None` when there is none or the store cannot tell (a socket).
    fn far_copy(&mut self, _page: u64) -> Option<FarCopy<'_>> {
        None
    }
    /// Whether [`BlobHandle::far_copy`] would find a far copy of `page`.
    fn has_far_copy(&self, _page: u64) -> bool {
        false
    }
}

/// Reads `pages` through `h` and returns copies (tests and slow paths).
#[cfg(test)]
pub(crate) fn read_copies(
    h: &mut dyn StoreHandle,
    pages: &[u64],
) -> Result<Vec<Vec<u8>>, StoreError> {
    h.request(pages)?;
    let mut out = vec![Vec::new(); pages.len()];
    h.receive(&mut |i, data| out[i] = data.to_vec())?;
    Ok(out)
}

/// Opens the session on `endpoint` and the store for it: shared memory or the socket, as
/// `path` says, its pages encoded by `codec`. `region_pages` bounds the pages the session can
/// ever hold.
pub(crate) fn open(
    endpoint: Endpoint,
    token: Token,
    opts: ConnectOptions,
    path: DataPath,
    region_pages: usize,
    codec: Arc<Codec>,
) -> Result<Box<dyn PageStore>, PagerError> {
    let local = matches!(endpoint, Endpoint::Unix(_));
    let use_shm = match path {
        DataPath::Auto => local,
        DataPath::Shm if !local => {
            return Err(PagerError::Config(format!(
                "--data-path shm needs a memnode on this host reached through a Unix socket \
                 (unix:PATH); {endpoint} is a TCP address"
            )))
        }
        DataPath::Shm => true,
        DataPath::Socket => false,
    };
    let session = socket::MemnodeSession::open(endpoint, token, opts)?;
    let versions = Versions::new(region_pages);
    let blobs: Box<dyn BlobStore> = if use_shm {
        Box::new(shm::ShmStore::new(session, region_pages)?)
    } else {
        Box::new(socket::SocketStore::new(session, versions.clone()))
    };
    Ok(Box::new(coded::CodedStore::new(blobs, codec, versions)))
}

/// A page-sized scratch buffer.
pub(crate) type PageBuf = Box<[u8; PAGE_SIZE]>;

/// A zeroed page-sized buffer on the heap.
pub(crate) fn page_buf() -> PageBuf {
    Box::new([0u8; PAGE_SIZE])
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use gleaner_memnode::{Server, ServerConfig, ShutdownHandle};
    use gleaner_proto::{generate_token, ConnectOptions, Endpoint};

    use super::*;
    use crate::codec::{Compression, Encryption};

    /// A memnode on its own thread, on a Unix socket or TCP loopback.
    struct Node {
        endpoint: Endpoint,
        token: gleaner_proto::Token,
        stop: ShutdownHandle,
        _dir: Option<std::path::PathBuf>,
    }

    impl Node {
        fn start(unix: bool, capacity_pages: u64) -> Node {
            let dir = std::env::temp_dir().join(format!(
                "gleaner-store-test-{}-{}",
                std::process::id(),
                u64::from_le_bytes(gleaner_proto::random_bytes())
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let listen = if unix {
                format!("unix:{}", dir.join("m.sock").display())
            } else {
                "127.0.0.1:0".into()
            };
            let token = generate_token();
            let server = Server::bind(ServerConfig::new(
                listen.parse().unwrap(),
                capacity_pages * PAGE_SIZE as u64,
                token,
            ))
            .unwrap();
            let endpoint = server.local_endpoint().clone();
            let stop = server.shutdown_handle();
            std::thread::spawn(move || server.run());
            Node {
                endpoint,
                token,
                stop,
                _dir: Some(dir),
            }
        }

        fn store(&self, path: DataPath, pages: usize) -> Result<Box<dyn PageStore>, PagerError> {
            let codec = Codec::new(Compression::Lz4, Encryption::On).unwrap();
            open(
                self.endpoint.clone(),
                self.token,
                opts(),
                path,
                pages,
                codec,
            )
        }

        /// A shared-memory store (to tamper with) and the codec layer over it.
        fn shm(&self, pages: usize) -> (shm::ShmStore, coded::CodedStore) {
            let session =
                socket::MemnodeSession::open(self.endpoint.clone(), self.token, opts()).unwrap();
            let codec = Codec::new(Compression::Lz4, Encryption::On).unwrap();
            let shm = shm::ShmStore::new(session, pages).unwrap();
            let coded = coded::CodedStore::new(Box::new(shm.clone()), codec, Versions::new(pages));
            (shm, coded)
        }
    }

    fn opts() -> ConnectOptions {
        ConnectOptions {
            reply_timeout: Duration::from_secs(10),
            ..ConnectOptions::default()
        }
    }

    impl Drop for Node {
        fn drop(&mut self) {
            self.stop.shutdown();
            if let Some(d) = &self._dir {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }

    fn page(seed: u64) -> Vec<u8> {
        (0..PAGE_SIZE)
            .map(|i| (seed as usize * 31 + i) as u8)
            .collect()
    }

    /// Writes `ids` (contents from their id plus `version`), then reads them back.
    fn round_trip(store: &dyn PageStore, ids: &[u64], version: u64) {
        let mut h = store.handle().unwrap();
        let pages: Vec<Vec<u8>> = ids.iter().map(|&id| page(id + version)).collect();
        h.write(ids, &mut |i| &pages[i]).unwrap();
        let mut other = store.handle().unwrap();
        let got = read_copies(&mut *other, ids).unwrap();
        for (i, data) in got.iter().enumerate() {
            assert_eq!(data, &page(ids[i] + version), "page {}", ids[i]);
        }
    }

    #[test]
    fn both_data_paths_keep_pages_and_rewrite_them_in_place() {
        let node = Node::start(true, 100_000);
        for path in [DataPath::Shm, DataPath::Socket] {
            let store = node.store(path, 50_000).unwrap();
            let expect = if path == DataPath::Shm {
                "shm"
            } else {
                "socket"
            };
            assert_eq!(store.stats().data_path, expect);
            let ids: Vec<u64> = (0..200).map(|i| i * 7).collect();
            round_trip(&*store, &ids, 0);
            round_trip(&*store, &ids[..50], 1);
            let mut h = store.handle().unwrap();
            let got = read_copies(&mut *h, &ids[50..60]).unwrap();
            assert_eq!(
                got[0],
                page(ids[50]),
                "an untouched page keeps its first version"
            );
            let s = store.stats();
            assert_eq!(s.codec.pages_encoded, 250);
            assert!(s.codec.compression_ratio > 4.0, "{:?}", s.codec);
            if path == DataPath::Shm {
                assert_eq!(s.pages_stored, 200, "rewrites replace their pages' blobs");
                assert!(s.blob_bytes < 200 * PAGE_SIZE as u64 / 4, "{s:?}");
                assert!(s.resident_bytes >= s.blob_bytes);
            }
            store.close();
        }
    }

    #[test]
    fn released_pages_give_their_memory_back_and_read_back_as_lost_not_zero() {
        let node = Node::start(true, 100_000);
        let store = node.store(DataPath::Shm, 10_000).unwrap();
        let ids: Vec<u64> = (0..100).collect();
        round_trip(&*store, &ids, 3);
        let full = store.stats();
        store.release(&[(0, 40)]);
        let s = store.stats();
        assert_eq!(s.pages_stored, 60);
        assert!(s.blob_bytes < full.blob_bytes);
        let mut h = store.handle().unwrap();
        match read_copies(&mut *h, &[5]) {
            Err(StoreError::Lost(why)) => assert!(why.contains("no far copy"), "{why}"),
            other => panic!("a released page read back as {other:?}"),
        }
        round_trip(&*store, &(1000..1040).collect::<Vec<_>>(), 0);
        let s = store.stats();
        assert_eq!(s.pages_stored, 100);
        assert_eq!(s.slabs, 1, "freed room was reused before asking for more");
        store.release(&[(0, 2000)]);
        let s = store.stats();
        assert_eq!((s.pages_stored, s.blob_bytes, s.resident_bytes), (0, 0, 0));
    }

    #[test]
    fn a_full_memnode_refuses_the_whole_write_and_recovers_once_room_is_freed() {
        // 20 MiB: the first grant cannot be the usual 64 MiB.
        let node = Node::start(true, 5 * 1024);
        let store = node.store(DataPath::Shm, 100_000).unwrap();
        let mut h = store.handle().unwrap();
        let mut written = 0u64;
        let refused = loop {
            let ids: Vec<u64> = (written..written + 64).collect();
            let pages: Vec<Vec<u8>> = ids.iter().map(|&id| crate::noise_page(id)).collect();
            let r = h.write(&ids, &mut |i| &pages[i]);
            match r {
                Ok(()) => written += 64,
                Err(e) => break e,
            }
            assert!(written < 100_000, "the memnode never filled up");
        };
        assert!(matches!(refused, StoreError::Full(_)), "{refused:?}");
        let s = store.stats();
        assert_eq!(
            s.pages_stored, written,
            "nothing of the refused batch was stored"
        );
        assert!(s.grants_refused >= 1);
        let got = read_copies(&mut *h, &[0, written - 1]).unwrap();
        assert_eq!(
            (got[0].clone(), got[1].clone()),
            (crate::noise_page(0), crate::noise_page(written - 1))
        );
        // Free room, then the same write goes through.
        store.release(&[(0, 512)]);
        let ids: Vec<u64> = (written..written + 64).collect();
        let pages: Vec<Vec<u8>> = ids.iter().map(|&id| crate::noise_page(id)).collect();
        h.write(&ids, &mut |i| &pages[i]).unwrap();
        assert_eq!(
            read_copies(&mut *h, &[written]).unwrap()[0],
            crate::noise_page(written)
        );
    }

    #[test]
    fn a_memnode_that_changes_swaps_or_replays_a_blob_is_caught() {
        let node = Node::start(true, 100_000);
        let (shm, store) = node.shm(1000);
        let mut h = store.handle().unwrap();
        let write = |h: &mut dyn StoreHandle, ids: &[u64], v: u64| {
            let pages: Vec<Vec<u8>> = ids.iter().map(|&id| page(id * 1000 + v)).collect();
            h.write(ids, &mut |i| &pages[i]).unwrap()
        };
        write(&mut *h, &[1, 2, 3], 0);
        // A flipped bit in page 1's blob.
        shm.tamper_flip(1);
        // Page 2 handed page 3's blob.
        shm.tamper_swap(2, 3);
        // Page 3 handed back an older version of itself.
        let old = shm.tamper_save(3);
        write(&mut *h, &[3], 1);
        shm.tamper_restore(3, old);
        for p in [1, 2, 3] {
            match read_copies(&mut *h, &[p]) {
                Err(StoreError::Lost(why)) => {
                    assert!(why.contains(&format!("page {p}")), "{why}");
                    assert!(why.contains("never wrote"), "{why}");
                }
                other => panic!("tampered page {p} read back as {other:?}"),
            }
        }
        assert_eq!(store.stats().codec.auth_failures, 3);
    }

    #[test]
    fn blobs_freed_while_a_fork_child_lives_are_held_until_it_is_gone() {
        let node = Node::start(true, 100_000);
        let store = node.store(DataPath::Shm, 10_000).unwrap();
        assert!(store.can_share_with_child());
        let ids: Vec<u64> = (0..100).collect();
        round_trip(&*store, &ids, 0);
        let (alive, child_end) = {
            let mut fds = [0; 2];
            // SAFETY: pipe writes two descriptors into the live array.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            use std::os::fd::FromRawFd;
            // SAFETY: both were just made and are owned by nothing else.
            unsafe {
                (
                    std::os::fd::OwnedFd::from_raw_fd(fds[0]),
                    std::os::fd::OwnedFd::from_raw_fd(fds[1]),
                )
            }
        };
        store.hold_for_child(alive).unwrap();
        let before = store.stats();
        // Rewritten and released pages: their old blobs stay where the child would read them.
        round_trip(&*store, &ids[..50], 1);
        store.release(&[(50, 50)]);
        let held = store.stats();
        assert_eq!(held.blobs_held_for_children, 100, "{held:?}");
        assert!(held.blob_bytes > before.blob_bytes, "{held:?}");
        // The child is gone: the next free gives everything back.
        drop(child_end);
        store.release(&[(0, 1)]);
        let after = store.stats();
        assert_eq!(after.blobs_held_for_children, 0, "{after:?}");
        assert_eq!(after.pages_stored, 49);
        assert!(after.blob_bytes < before.blob_bytes, "{after:?}");
    }

    #[test]
    fn shared_memory_needs_a_memnode_on_this_host() {
        let node = Node::start(false, 1000);
        let err = node.store(DataPath::Shm, 100).err().expect("refused");
        assert!(err.to_string().contains("Unix socket"), "{err}");
        let auto = node.store(DataPath::Auto, 100).unwrap();
        assert_eq!(auto.stats().data_path, "socket");
        round_trip(&*auto, &[1, 2, 3], 0);
    }
}
