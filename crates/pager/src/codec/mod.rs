//! The page codec: what a far page looks like once it leaves this process.
//!
//! Every page written to a memnode (shared memory or socket) is encoded here into a *blob* and
//! every fetched blob decoded back, so a memnode stores opaque blobs of variable size and learns
//! nothing from them but their length.
//!
//! # Blob format
//!
//! ```text
//! byte 0     kind: 0 raw page, 1 LZ4 block, 2 zstd frame, 3 same-filled page (8-byte word)
//! bytes 1..  body: the page, the compressed page or the word; when sealed, encrypted in place
//!            and followed by the 16-byte AEAD tag
//! ```
//!
//! # Sealing
//!
//! AES-256-GCM (ring's implementation, measured here faster than ChaCha20-Poly1305 and than the
//! pure-Rust `aes-gcm` crate, for small blobs and whole pages alike:
//! `docs/decisions/0004-page-codec-libraries.md`). The key is the region's own: random per
//! region, or derived from a key file and a random per-region salt (HMAC-SHA256), and never leaves
//! this process. The nonce is the blob's *version*, a 64-bit counter unique for the key (every
//! encoding takes the next), and the associated data is the page number and the kind byte. The
//! client remembers each page's version, so a memnode that flips a bit, returns another page's
//! blob or an older version of the same page fails authentication, and the program stops with
//! exit 86 rather than read wrong data.
//!
//! # Compression
//!
//! `auto` by default: LZ4 (the reference C library through the `lz4` crate, which decompresses a
//! page faster than `lz4_flex`: `docs/decisions/0004-page-codec-libraries.md`), or zstd level 1 for
//! the write-back batches over a link where it is measured cheaper per page (a better ratio at
//! several times the decompression cost: worth it where the link is slow per byte,
//! `codec/choice.rs`); `lz4` or `zstd` when asked for. A page whose compressed form saves nothing
//! is stored raw, and a page made of one repeated 8-byte word (most often zeros) as that word
//! alone. Decompression's cost depends on the data (a page of 8-byte counters takes several times
//! as long as a page of text: `bench/results/DETAILS.md`, "(b) The codec's cost on the fault
//! path"), so its mean per page is kept within a budget (1.5 µs with LZ4 by default): the codec
//! learns which chunks of neighbouring pages decode slower, and stores their pages raw when the
//! mean has no room left for them (`codec/decode_budget.rs`).

pub(crate) mod choice;
pub mod decode_budget;
pub(crate) mod versions;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use serde::Serialize;

use crate::codec::decode_budget::{Choice, DecodeBudget, SpeedMap, DEFAULT_MAX_DECODE_NS};
use crate::{PagerError, PAGE_SIZE};

/// Bytes the AEAD tag adds to a sealed blob.
pub const TAG_LEN: usize = 16;
/// The largest blob the codec produces: a raw page, its kind byte and the tag.
pub const MAX_BLOB_LEN: usize = 1 + PAGE_SIZE + TAG_LEN;
/// The room [`CodecCtx::encode_or_word`] needs in its output: the largest blob, and what a
/// compressor may write past it before the page is found incompressible.
pub const ENCODE_ROOM: usize = MAX_BLOB_LEN + 64;

/// One blob opened in this many (per decoding context, the first included) has its copy and
/// its opening timed (`CodecStats::blobs_open_timed`).
pub const TIMED_OPEN_EVERY: u32 = 8;

const KIND_RAW: u8 = 0;
const KIND_LZ4: u8 = 1;
const KIND_ZSTD: u8 = 2;
const KIND_SAME: u8 = 3;

/// How pages are compressed before they leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Stored as they are (same-filled pages are still reduced to their word).
    Off,
    /// LZ4: the fastest to decompress on the fault path.
    Lz4,
    /// zstd at level 1: smaller, slower to decompress.
    Zstd,
    /// LZ4, or zstd where it is measured cheaper over the link to the store (the bytes it saves
    /// are worth its CPU there: `codec/choice.rs`); default.
    #[default]
    Auto,
}

impl Compression {
    /// The decode budget `--max-decode-us auto` stands for with this compressor, in ns (`None`:
    /// no bound): LZ4, chosen for speed on the fault path, keeps its mean per page within
    /// [`DEFAULT_MAX_DECODE_NS`]; zstd, chosen for memory, is not bounded.
    pub fn auto_decode_budget_ns(self) -> Option<u64> {
        match self {
            Compression::Lz4 | Compression::Auto => Some(DEFAULT_MAX_DECODE_NS),
            Compression::Zstd | Compression::Off => None,
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" | "none" => Ok(Compression::Off),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            "auto" => Ok(Compression::Auto),
            _ => Err(format!(
                "`{s}` is not a compression: use auto (default: lz4, or zstd where a link makes \
                 it cheaper), lz4 (fastest), zstd (smaller) or off"
            )),
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Compression::Off => "off",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
            Compression::Auto => "auto",
        })
    }
}

/// How far pages are protected from the memnode.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Encryption {
    /// AES-256-GCM with a random key made for the region (default).
    #[default]
    On,
    /// AES-256-GCM with a key derived from this key file (64 hex digits, mode 0600).
    KeyFile(PathBuf),
    /// Pages leave in the clear and a tampering memnode goes unnoticed (to measure the cost).
    Off,
}

impl std::str::FromStr for Encryption {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "on" => Ok(Encryption::On),
            "off" => Ok(Encryption::Off),
            _ => Err(format!(
                "`{s}` is not an encryption setting: use on (default) or off; a key file is \
                 given with --key-file"
            )),
        }
    }
}

impl Encryption {
    /// The setting from an on/off switch and an optional key file.
    pub fn with_key_file(self, key_file: Option<PathBuf>) -> Result<Encryption, String> {
        match (self, key_file) {
            (e, None) => Ok(e),
            (Encryption::Off, Some(_)) => {
                Err("a page-key file was given but encryption is off".into())
            }
            (_, Some(p)) => Ok(Encryption::KeyFile(p)),
        }
    }

    /// Whether pages are sealed.
    pub fn is_on(&self) -> bool {
        *self != Encryption::Off
    }

    /// `on`, `off` or the key file's path, for stats.
    pub fn describe(&self) -> String {
        match self {
            Encryption::On => "aes-256-gcm".into(),
            Encryption::KeyFile(p) => format!("aes-256-gcm (key file {})", p.display()),
            Encryption::Off => "off".into(),
        }
    }
}

/// What the codec did, for the stats JSON.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CodecStats {
    /// `auto`, `lz4`, `zstd` or `off`.
    pub compression: String,
    /// `aes-256-gcm` or `off`.
    pub encryption: String,
    /// Pages encoded (written back).
    pub pages_encoded: u64,
    /// Bytes of the blobs those pages became.
    pub blob_bytes: u64,
    /// `pages_encoded * 4096 / blob_bytes`.
    pub compression_ratio: f64,
    /// Bytes the encoding saved (`pages_encoded * 4096 - blob_bytes`).
    pub bytes_saved: u64,
    /// Pages stored as one repeated word.
    pub same_filled: u64,
    /// Pages stored raw because compression saved nothing.
    pub incompressible: u64,
    /// The decode budget in nanoseconds (0: none): what decompression may cost per page on
    /// average; pages whose compressed form decodes slower are stored raw when the mean has no
    /// room for them.
    pub max_decode_ns: u64,
    /// Pages stored raw, without a compression attempt, because pages of their chunk decode
    /// slower than the budget and the mean had no room for them.
    pub raw_for_speed: u64,
    /// Pages of chunks that decode slower than the budget, compressed all the same because the
    /// mean of the decompressions so far had room for them.
    pub compressed_on_credit: u64,
    /// Pages compressed with LZ4's fast mode because their chunk's last compressed page saved
    /// less than a fifth (with a decode budget only).
    pub compressed_fast: u64,
    /// Pages compressed with zstd instead of LZ4 because it was measured cheaper over the link
    /// to the store (`auto` only).
    pub zstd_for_link: u64,
    /// What that mean leaves to spend now, in nanoseconds (the budget less each decompression's
    /// time, summed, kept within 256 pages' worth of budget either way).
    pub decode_credit_ns: i64,
    /// Trial decodes the reclaim path timed to learn which chunks decode slowly.
    pub decode_trials: u64,
    /// Decodes on the fault path slower than the budget.
    pub slow_decodes: u64,
    /// Chunks (of 64 pages) now learnt to decode slower than the budget.
    pub slow_chunks: u64,
    /// Pages stored raw, without a compression attempt, because a page of their chunk did not
    /// compress at all (with a decode budget only).
    pub raw_not_compressible: u64,
    /// Chunks now stored raw because they do not compress.
    pub incompressible_chunks: u64,
    /// Pages decoded (fetched or compared).
    pub pages_decoded: u64,
    /// Bytes of the blobs those pages were decoded from (with `blob_bytes`, what crossed the
    /// wire to a socket memnode, less the protocol's framing).
    pub blob_bytes_decoded: u64,
    /// Pages compressed (all but the same-filled ones), and the nanoseconds it took in all.
    pub pages_compressed: u64,
    /// See `pages_compressed`.
    pub compress_ns_total: u64,
    /// Nanoseconds spent decompressing the `pages_decoded`.
    pub decompress_ns_total: u64,
    /// Blobs sealed, and the nanoseconds it took in all.
    pub blobs_sealed: u64,
    /// See `blobs_sealed`.
    pub seal_ns_total: u64,
    /// Blobs opened (authenticated and decrypted).
    pub blobs_opened: u64,
    /// Of those, the blobs whose copy and opening were timed: one in [`TIMED_OPEN_EVERY`]
    /// (timing every fault's steps, these included, cost a fault handler a measurable share of
    /// each fault: `bench/results/sampled-timing/README.md`).
    pub blobs_open_timed: u64,
    /// Nanoseconds the `blobs_open_timed` took to open, in all.
    pub open_ns_total: u64,
    /// Nanoseconds spent copying the `blobs_open_timed` out of the store's buffer into the
    /// codec's before opening them (the AEAD opens in place). Timed apart from `open_ns_total`
    /// because the first read of a blob pays for bringing it into the cache: several times more
    /// for a blob in shared memory than for one a socket read has just written (the copy-out
    /// column of `bench/results/DETAILS.md`, "(b) The codec's cost on the fault path"), a cost
    /// any reader of the blob pays (unsealed, the decode's own copy of a raw page out of
    /// shared memory takes as long, and is counted as decompression).
    pub blob_copy_ns_total: u64,
    /// Mean nanoseconds to compress one page.
    pub compress_ns_per_page: f64,
    /// Mean nanoseconds to decompress one page.
    pub decompress_ns_per_page: f64,
    /// Mean nanoseconds to seal one blob.
    pub seal_ns_per_blob: f64,
    /// Mean nanoseconds to open one blob.
    pub open_ns_per_blob: f64,
    /// Mean nanoseconds to copy one blob out before opening it (`blob_copy_ns_total`).
    pub blob_copy_ns_per_blob: f64,
    /// Blobs that failed authentication (each one stops the program).
    pub auth_failures: u64,
}

/// Why a blob could not be decoded: the memnode returned something this region never wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tampered(pub String);

impl std::fmt::Display for Tampered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Default)]
struct CodecCounters {
    encoded: AtomicU64,
    blob_bytes: AtomicU64,
    same: AtomicU64,
    raw: AtomicU64,
    raw_for_speed: AtomicU64,
    on_credit: AtomicU64,
    compressed_fast: AtomicU64,
    zstd_for_link: AtomicU64,
    raw_unattempted: AtomicU64,
    trials: AtomicU64,
    slow_decodes: AtomicU64,
    decoded: AtomicU64,
    decoded_bytes: AtomicU64,
    compress_ns: AtomicU64,
    decompress_ns: AtomicU64,
    sealed: AtomicU64,
    seal_ns: AtomicU64,
    opened: AtomicU64,
    open_timed: AtomicU64,
    open_ns: AtomicU64,
    copy_ns: AtomicU64,
    auth_failures: AtomicU64,
}

/// A region's codec: its settings, key, version counter and counters. Shared by every thread;
/// each thread encodes and decodes through its own [`CodecCtx`].
pub struct Codec {
    compression: Compression,
    encryption: Encryption,
    key: Option<LessSafeKey>,
    /// In a fork child: the parent's key, which sealed every blob of the snapshot the child
    /// inherited (versions below [`FORK_CHILD_VERSIONS`]).
    inherited_key: Option<LessSafeKey>,
    next_version: AtomicU64,
    counters: CodecCounters,
    /// Which chunks decode slowly, and the credit the mean decode leaves them (`None`: no
    /// decode budget).
    speed: Option<SpeedMap>,
}

/// The versions a fork child's codec gives its own blobs start here: the parent's never reach
/// it, so a version says which key sealed the blob (the child's own, or the parent's for a page
/// of the snapshot), and the child's writes are always newer than the snapshot's.
pub const FORK_CHILD_VERSIONS: u64 = 1 << 63;

impl std::fmt::Debug for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Codec")
            .field("compression", &self.compression)
            .field("encryption", &self.encryption.describe())
            .finish()
    }
}

impl Codec {
    /// A codec without a decode budget (every page that compresses is stored compressed).
    pub fn new(compression: Compression, encryption: Encryption) -> Result<Arc<Codec>, PagerError> {
        Codec::for_region(compression, encryption, DecodeBudget::Off, 0)
    }

    /// A codec for a region of `pages` pages: makes (or derives) the region's key; pages whose
    /// compressed form decodes slower than `max_decode` are stored raw when the mean decode
    /// leaves no room for them (`codec/decode_budget.rs`).
    pub fn for_region(
        compression: Compression,
        encryption: Encryption,
        max_decode: DecodeBudget,
        pages: u64,
    ) -> Result<Arc<Codec>, PagerError> {
        let key = match &encryption {
            Encryption::Off => None,
            Encryption::On => Some(random_bytes()?),
            Encryption::KeyFile(path) => {
                let master = read_key_file(path)?;
                let salt: [u8; 32] = random_bytes()?;
                let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &master);
                let mut ctx = ring::hmac::Context::with_key(&k);
                ctx.update(b"gleaner far-page key v1");
                ctx.update(&salt);
                let tag = ctx.sign();
                let mut out = [0u8; 32];
                out.copy_from_slice(tag.as_ref());
                Some(out)
            }
        };
        let key = key.map(|k| {
            LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &k).expect("a 32-byte AES-256 key"))
        });
        Ok(Arc::new(Codec {
            compression,
            encryption,
            key,
            inherited_key: None,
            next_version: AtomicU64::new(1),
            counters: CodecCounters::default(),
            speed: match compression {
                Compression::Off => None,
                c => max_decode.nanos(c.auto_decode_budget_ns()),
            }
            .map(|ns| SpeedMap::new(pages, ns)),
        }))
    }

    /// The codec of a fork child: same settings, a new random key for the blobs the child
    /// writes (so the child and the parent, which go on counting versions from the same number,
    /// never seal two blobs under one key and nonce), and this codec's key to open the blobs of
    /// the snapshot the child inherited. Refused for a codec that is itself a fork child's (a
    /// grandchild would need a third key).
    pub fn for_fork_child(&self) -> Result<Arc<Codec>, PagerError> {
        if self.inherited_key.is_some() {
            return Err(PagerError::Config(
                "a fork child's far memory cannot be handed down to its own children".into(),
            ));
        }
        let key = match self.key {
            None => None,
            Some(_) => {
                let k: [u8; 32] = random_bytes()?;
                Some(LessSafeKey::new(
                    UnboundKey::new(&AES_256_GCM, &k).expect("a 32-byte AES-256 key"),
                ))
            }
        };
        Ok(Arc::new(Codec {
            compression: self.compression,
            encryption: self.encryption.clone(),
            key,
            inherited_key: self.key.clone(),
            next_version: AtomicU64::new(FORK_CHILD_VERSIONS | 1),
            counters: CodecCounters::default(),
            speed: self.speed.as_ref().map(SpeedMap::fresh),
        }))
    }

    /// Whether the compressor is chosen per batch (`auto`).
    pub fn chooses_compressor(&self) -> bool {
        self.compression == Compression::Auto
    }

    /// Whether this is a fork child's codec.
    pub fn is_fork_child(&self) -> bool {
        self.next_version.load(Ordering::Relaxed) >= FORK_CHILD_VERSIONS
    }

    /// The key that sealed a blob of `version`.
    fn key_for(&self, version: u64) -> Option<&LessSafeKey> {
        match &self.inherited_key {
            Some(parent) if version < FORK_CHILD_VERSIONS => Some(parent),
            _ => self.key.as_ref(),
        }
    }

    /// A per-thread context (scratch buffers and compressor state).
    pub fn ctx(self: &Arc<Codec>) -> CodecCtx {
        CodecCtx {
            codec: self.clone(),
            scratch: vec![0u8; ENCODE_ROOM],
            trial: vec![0u8; PAGE_SIZE],
            zstd: false,
            zstd_ctx: None,
            unzstd: None,
            opens: 0,
        }
    }

    /// Whether blobs are sealed.
    pub fn sealed(&self) -> bool {
        self.key.is_some()
    }

    /// Records that a blob failed authentication.
    fn note_tamper(&self) {
        self.counters.auth_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters, for the stats JSON.
    pub fn stats(&self) -> CodecStats {
        let c = &self.counters;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mean = |ns: u64, n: u64| if n == 0 { 0.0 } else { ns as f64 / n as f64 };
        let encoded = ld(&c.encoded);
        let blob_bytes = ld(&c.blob_bytes);
        let raw_chunks = self.speed.as_ref().map_or((0, 0), SpeedMap::raw_chunks);
        let skipped = ld(&c.same) + ld(&c.raw_for_speed) + ld(&c.raw_unattempted);
        let logical = encoded * PAGE_SIZE as u64;
        CodecStats {
            compression: self.compression.to_string(),
            encryption: if self.sealed() { "aes-256-gcm" } else { "off" }.into(),
            pages_encoded: encoded,
            blob_bytes,
            compression_ratio: if blob_bytes == 0 {
                0.0
            } else {
                logical as f64 / blob_bytes as f64
            },
            bytes_saved: logical.saturating_sub(blob_bytes),
            same_filled: ld(&c.same),
            incompressible: ld(&c.raw),
            max_decode_ns: self.speed.as_ref().map_or(0, SpeedMap::budget_ns),
            raw_for_speed: ld(&c.raw_for_speed),
            compressed_on_credit: ld(&c.on_credit),
            compressed_fast: ld(&c.compressed_fast),
            zstd_for_link: ld(&c.zstd_for_link),
            decode_credit_ns: self.speed.as_ref().map_or(0, SpeedMap::credit_ns),
            decode_trials: ld(&c.trials),
            slow_decodes: ld(&c.slow_decodes),
            slow_chunks: raw_chunks.0,
            raw_not_compressible: ld(&c.raw_unattempted),
            incompressible_chunks: raw_chunks.1,
            pages_decoded: ld(&c.decoded),
            blob_bytes_decoded: ld(&c.decoded_bytes),
            // Counters read while pages are being encoded may run a little ahead of `encoded`.
            pages_compressed: encoded.saturating_sub(skipped),
            compress_ns_total: ld(&c.compress_ns),
            decompress_ns_total: ld(&c.decompress_ns),
            blobs_sealed: ld(&c.sealed),
            seal_ns_total: ld(&c.seal_ns),
            blobs_opened: ld(&c.opened),
            blobs_open_timed: ld(&c.open_timed),
            open_ns_total: ld(&c.open_ns),
            blob_copy_ns_total: ld(&c.copy_ns),
            compress_ns_per_page: mean(ld(&c.compress_ns), encoded.saturating_sub(skipped)),
            decompress_ns_per_page: mean(ld(&c.decompress_ns), ld(&c.decoded)),
            seal_ns_per_blob: mean(ld(&c.seal_ns), ld(&c.sealed)),
            open_ns_per_blob: mean(ld(&c.open_ns), ld(&c.open_timed)),
            blob_copy_ns_per_blob: mean(ld(&c.copy_ns), ld(&c.open_timed)),
            auth_failures: ld(&c.auth_failures),
        }
    }
}

/// What [`CodecCtx::encode_or_word`] made of a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoded {
    /// The page is this 8-byte word over and over; nothing was written.
    Word(u64),
    /// The page's blob is the first `len` bytes of the output; decode it with `version`.
    Blob {
        /// The blob's length in bytes.
        len: usize,
        /// The version it was sealed with.
        version: u64,
    },
}

/// How one page is to be compressed: what [`CodecCtx::choose`] decides.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// The compressor (`auto` resolved to LZ4 or zstd).
    compression: Compression,
    /// What the decode budget allows.
    choice: Choice,
    /// Whether zstd was chosen for the link (`auto`), not for the page.
    for_link: bool,
}

/// One thread's codec: encodes pages into blobs and decodes them back.
pub struct CodecCtx {
    codec: Arc<Codec>,
    /// Where blobs are built (compression output) and opened.
    scratch: Vec<u8>,
    /// Where trial decodes go (one page).
    trial: Vec<u8>,
    /// Under `auto`: whether pages encoded now use zstd (the batch's choice,
    /// [`CodecCtx::use_zstd`]).
    zstd: bool,
    /// zstd's compression and decompression contexts, made on first use (making one per page
    /// costs more than the decompression).
    zstd_ctx: Option<zstd::bulk::Compressor<'static>>,
    unzstd: Option<zstd::bulk::Decompressor<'static>>,
    /// Blobs this context opened: the first and every [`TIMED_OPEN_EVERY`]-th are timed.
    opens: u32,
}

impl CodecCtx {
    /// Under `auto`, makes the pages encoded from now on use zstd (`true`) or LZ4: the choice
    /// of the batch being encoded (`codec/choice.rs`). Blobs of either kind decode alike,
    /// whenever they were written. Ignored with any other compression.
    pub fn use_zstd(&mut self, zstd: bool) {
        self.zstd = zstd;
    }

    /// The shared codec.
    pub fn codec(&self) -> &Arc<Codec> {
        &self.codec
    }

    /// Encodes `page` (4 KiB), the contents of region page `page_no`, into a blob; returns the
    /// blob (valid until the next call) and the version it must be decoded with.
    pub fn encode(&mut self, page_no: u64, page: &[u8]) -> (&[u8], u64) {
        let same = same_filled(page);
        self.encode_checked(page_no, page, same)
    }

    /// Like [`CodecCtx::encode`], but a page of one repeated word is not made into a blob (the
    /// caller keeps the word itself: the shared-memory store, in its index), and the blob is
    /// written at the start of `out` (at least [`ENCODE_ROOM`] bytes), where the caller keeps
    /// it: the shared-memory store encodes straight into its batch, a copy of every page it
    /// writes back saved.
    pub fn encode_or_word(&mut self, page_no: u64, page: &[u8], out: &mut [u8]) -> Encoded {
        match same_filled(page) {
            Some(word) => {
                let c = &self.codec.counters;
                c.encoded.fetch_add(1, Ordering::Relaxed);
                c.same.fetch_add(1, Ordering::Relaxed);
                Encoded::Word(word)
            }
            None => {
                let (len, version) = self.encode_to(page_no, page, None, out);
                Encoded::Blob { len, version }
            }
        }
    }

    /// Like [`CodecCtx::encode`], the blob written at the start of `out` (at least
    /// [`ENCODE_ROOM`] bytes), where the caller keeps it: always [`Encoded::Blob`] (a page of
    /// one repeated word becomes a small sealed blob).
    pub fn encode_blob(&mut self, page_no: u64, page: &[u8], out: &mut [u8]) -> Encoded {
        let same = same_filled(page);
        let (len, version) = self.encode_to(page_no, page, same, out);
        Encoded::Blob { len, version }
    }

    /// Encodes `page`, whose repeated word (if any) the caller found: `same`, into the scratch
    /// buffer.
    fn encode_checked(&mut self, page_no: u64, page: &[u8], same: Option<u64>) -> (&[u8], u64) {
        let mut out = std::mem::take(&mut self.scratch);
        let (len, version) = self.encode_to(page_no, page, same, &mut out);
        self.scratch = out;
        (&self.scratch[..len], version)
    }

    /// Encodes `page`, whose repeated word (if any) the caller found: `same`, into the start of
    /// `out` (at least [`ENCODE_ROOM`] bytes); returns the blob's length and its version. Three
    /// steps: choose how to compress ([`CodecCtx::choose`]), compress ([`CodecCtx::compress`]),
    /// seal ([`CodecCtx::seal`]).
    fn encode_to(
        &mut self,
        page_no: u64,
        page: &[u8],
        same: Option<u64>,
        out: &mut [u8],
    ) -> (usize, u64) {
        assert_eq!(page.len(), PAGE_SIZE, "the codec encodes whole pages");
        assert!(out.len() >= ENCODE_ROOM, "too little room to encode a page");
        let c = &self.codec.counters;
        let version = self.codec.next_version.fetch_add(1, Ordering::Relaxed);
        let len = match same {
            Some(word) => {
                out[0] = KIND_SAME;
                out[1..9].copy_from_slice(&word.to_le_bytes());
                c.same.fetch_add(1, Ordering::Relaxed);
                9
            }
            None => {
                let plan = self.choose(page_no);
                self.compress(page_no, page, plan, out)
            }
        };
        let len = self.seal(page_no, version, len, out);
        let c = &self.codec.counters;
        c.encoded.fetch_add(1, Ordering::Relaxed);
        c.blob_bytes.fetch_add(len as u64, Ordering::Relaxed);
        (len, version)
    }

    /// Step 1, choose: the compressor for `page_no` and whether the decode budget lets it be
    /// compressed at all.
    fn choose(&self, page_no: u64) -> Plan {
        let codec = &*self.codec;
        // `auto`: zstd where this context was told to use it (the batch's choice), else LZ4
        // (and its decode budget).
        let for_link = codec.compression == Compression::Auto && self.zstd;
        let compression = match codec.compression {
            Compression::Auto if for_link => Compression::Zstd,
            Compression::Auto => Compression::Lz4,
            c => c,
        };
        // The decode budget is the compressor's own, so `auto`'s is LZ4's: its zstd pages,
        // which would all be over it, are not judged by it.
        let choice = match &codec.speed {
            Some(map) if !for_link => map.choose(page_no),
            _ => Choice::Compress,
        };
        Plan {
            compression,
            choice,
            for_link,
        }
    }

    /// Step 2, compress: the page's body into `out[1..]` as `plan` says (raw where compressing
    /// does not pay, or decoding it would cost over the budget), its kind into `out[0]`; returns
    /// the unsealed blob's length.
    fn compress(&mut self, page_no: u64, page: &[u8], plan: Plan, out: &mut [u8]) -> usize {
        let Plan {
            compression,
            choice,
            ..
        } = plan;
        let t = Instant::now();
        let body = &mut out[1..1 + PAGE_SIZE + 64];
        let mut compressed = self
            .compress_body(page_no, page, plan, body)
            .filter(|&n| n + 1 < PAGE_SIZE);
        let kind = if compression == Compression::Zstd {
            KIND_ZSTD
        } else {
            KIND_LZ4
        };
        let mut for_speed = choice == Choice::Raw;
        if let (Some(n), Choice::Learn) = (compressed, choice) {
            if !self.decodes_within_budget(page_no, kind, &body[..n]) {
                compressed = None;
                for_speed = true;
            }
        }
        let codec = &*self.codec;
        let c = &codec.counters;
        if for_speed {
            c.raw_for_speed.fetch_add(1, Ordering::Relaxed);
        }
        match (choice, compressed, &codec.speed) {
            (Choice::Incompressible, ..) => {
                c.raw_unattempted.fetch_add(1, Ordering::Relaxed);
            }
            (Choice::OnCredit, Some(_), _) => {
                c.on_credit.fetch_add(1, Ordering::Relaxed);
            }
            // (A map exists only when compression is on.)
            (Choice::Learn | Choice::Compress, None, Some(map)) if !for_speed => {
                map.incompressible(page_no, choice == Choice::Learn);
            }
            _ => {}
        }
        if !matches!(choice, Choice::Raw | Choice::Incompressible) {
            c.compress_ns
                .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        match compressed {
            Some(n) => {
                out[0] = kind;
                1 + n
            }
            None => {
                out[0] = KIND_RAW;
                out[1..1 + PAGE_SIZE].copy_from_slice(page);
                if compression != Compression::Off && !for_speed && choice != Choice::Incompressible
                {
                    c.raw.fetch_add(1, Ordering::Relaxed);
                }
                1 + PAGE_SIZE
            }
        }
    }

    /// The compressor's output for `page` in `body`, or `None` where `plan` says raw (or the
    /// compressor failed to fit).
    fn compress_body(
        &mut self,
        page_no: u64,
        page: &[u8],
        plan: Plan,
        body: &mut [u8],
    ) -> Option<usize> {
        let codec = &*self.codec;
        let c = &codec.counters;
        match (plan.compression, plan.choice) {
            (_, Choice::Raw | Choice::Incompressible) | (Compression::Off, _) => None,
            (Compression::Lz4, _) => {
                let fast = codec
                    .speed
                    .as_ref()
                    .is_some_and(|map| map.compress_fast(page_no));
                if fast {
                    c.compressed_fast.fetch_add(1, Ordering::Relaxed);
                }
                let mode = fast.then_some(lz4::block::CompressionMode::FAST(
                    crate::codec::decode_budget::LZ4_FAST_ACCELERATION,
                ));
                let n = lz4::block::compress_to_buffer(page, mode, false, body).ok();
                if let Some(map) = &codec.speed {
                    map.compressed(page_no, n.filter(|&n| n + 1 < PAGE_SIZE));
                }
                n
            }
            (Compression::Zstd, _) => {
                let z = self.zstd_ctx.get_or_insert_with(|| {
                    zstd::bulk::Compressor::new(1).expect("a zstd level-1 context")
                });
                let n = z.compress_to_buffer(page, body).ok();
                if plan.for_link && n.is_some_and(|n| n + 1 < PAGE_SIZE) {
                    c.zstd_for_link.fetch_add(1, Ordering::Relaxed);
                }
                n
            }
            (Compression::Auto, _) => unreachable!("resolved by choose"),
        }
    }

    /// Under the decode budget's `Learn`: times a trial decode of the blob body just compressed
    /// (twice if slow, keeping the faster: a preemption must not condemn the chunk) so the map
    /// learns whether pages here decode within the budget; `false` when this page must go raw.
    fn decodes_within_budget(&mut self, page_no: u64, kind: u8, compressed: &[u8]) -> bool {
        let Some(map) = &self.codec.speed else {
            return true;
        };
        let mut best = u64::MAX;
        for _ in 0..2 {
            let t = Instant::now();
            let ok = decompress(kind, compressed, &mut self.trial, &mut self.unzstd).is_ok();
            debug_assert!(ok, "a page just compressed decompresses");
            best = best.min(t.elapsed().as_nanos() as u64);
            if !map.over(best) {
                break;
            }
        }
        let c = &self.codec.counters;
        c.trials.fetch_add(1, Ordering::Relaxed);
        if map.learned(page_no, best) {
            if map.credit_ns() > 0 {
                c.on_credit.fetch_add(1, Ordering::Relaxed);
            } else {
                return false;
            }
        }
        true
    }

    /// Step 3, seal: with encryption on, seals the `len`-byte blob at the start of `out` in
    /// place (AES-256-GCM, the nonce from `version`, the page number and kind authenticated)
    /// and appends the tag; returns the blob's final length.
    fn seal(&self, page_no: u64, version: u64, len: usize, out: &mut [u8]) -> usize {
        let Some(key) = &self.codec.key else {
            return len;
        };
        let c = &self.codec.counters;
        let t = Instant::now();
        let (kind, body) = out.split_at_mut(1);
        let tag = key
            .seal_in_place_separate_tag(
                nonce(version),
                Aad::from(aad(page_no, kind[0])),
                &mut body[..len - 1],
            )
            .expect("sealing a blob shorter than the AEAD limit");
        out[len..len + TAG_LEN].copy_from_slice(tag.as_ref());
        c.seal_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        c.sealed.fetch_add(1, Ordering::Relaxed);
        len + TAG_LEN
    }

    /// Decodes `blob`, which the memnode returned for region page `page_no` last written with
    /// `version`, into `dst` (4 KiB). Fails, writing nothing the caller may use, if the blob was
    /// not written by this region for that page and version, or is malformed.
    pub fn decode(
        &mut self,
        page_no: u64,
        version: u64,
        blob: &[u8],
        dst: &mut [u8],
    ) -> Result<(), Tampered> {
        assert_eq!(dst.len(), PAGE_SIZE, "the codec decodes whole pages");
        let codec = &*self.codec;
        let c = &codec.counters;
        let tampered = |why: &str| {
            codec.note_tamper();
            Tampered(format!(
                "the far copy of page {page_no} (version {version}) {why}: the memnode returned \
                 data this program never wrote there (corrupted, another page's, or an older \
                 version)"
            ))
        };
        if blob.is_empty() || blob.len() > MAX_BLOB_LEN {
            return Err(tampered(&format!(
                "has an impossible length ({} bytes)",
                blob.len()
            )));
        }
        let body: &[u8] = match codec.key_for(version) {
            None => &blob[1..],
            Some(key) => {
                if blob.len() < 1 + TAG_LEN {
                    return Err(tampered("is too short to be sealed"));
                }
                let timed = self.opens.is_multiple_of(TIMED_OPEN_EVERY);
                self.opens = self.opens.wrapping_add(1);
                let t = timed.then(Instant::now);
                let buf = &mut self.scratch[..blob.len() - 1];
                buf.copy_from_slice(&blob[1..]);
                let copied = timed.then(Instant::now);
                let opened =
                    key.open_in_place(nonce(version), Aad::from(aad(page_no, blob[0])), buf);
                if let (Some(t), Some(copied)) = (t, copied) {
                    c.copy_ns
                        .fetch_add((copied - t).as_nanos() as u64, Ordering::Relaxed);
                    c.open_ns
                        .fetch_add(copied.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    c.open_timed.fetch_add(1, Ordering::Relaxed);
                }
                c.opened.fetch_add(1, Ordering::Relaxed);
                match opened {
                    Ok(plain) => plain,
                    Err(_) => return Err(tampered("fails authentication")),
                }
            }
        };
        let t = Instant::now();
        match blob[0] {
            KIND_RAW if body.len() == PAGE_SIZE => dst.copy_from_slice(body),
            KIND_SAME if body.len() == 8 => {
                let word = u64::from_le_bytes(body.try_into().expect("8 bytes"));
                fill_word(dst, word);
            }
            kind @ (KIND_LZ4 | KIND_ZSTD) => {
                decompress(kind, body, dst, &mut self.unzstd).map_err(&tampered)?;
            }
            kind => return Err(tampered(&format!("has an unknown kind {kind}"))),
        }
        let ns = t.elapsed().as_nanos() as u64;
        c.decompress_ns.fetch_add(ns, Ordering::Relaxed);
        if let (KIND_LZ4 | KIND_ZSTD, Some(map)) = (blob[0], &codec.speed) {
            if map.observed(page_no, ns) {
                c.slow_decodes.fetch_add(1, Ordering::Relaxed);
            }
        }
        c.decoded.fetch_add(1, Ordering::Relaxed);
        c.decoded_bytes
            .fetch_add(blob.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Decompresses `body`, an LZ4 block or a zstd frame (`kind`), into `dst` (one page); the error
/// says what was wrong with it.
fn decompress(
    kind: u8,
    body: &[u8],
    dst: &mut [u8],
    unzstd: &mut Option<zstd::bulk::Decompressor<'static>>,
) -> Result<(), &'static str> {
    if kind == KIND_LZ4 {
        match lz4::block::decompress_to_buffer(body, Some(PAGE_SIZE as i32), dst) {
            Ok(PAGE_SIZE) => Ok(()),
            _ => Err("does not decompress to one page (LZ4)"),
        }
    } else {
        match unzstd
            .get_or_insert_with(|| {
                zstd::bulk::Decompressor::new().expect("a zstd decompression context")
            })
            .decompress_to_buffer(body, dst)
        {
            Ok(PAGE_SIZE) => Ok(()),
            _ => Err("does not decompress to one page (zstd)"),
        }
    }
}

/// The 96-bit nonce of a blob: its version, unique for the key.
fn nonce(version: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&version.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

/// The associated data binding a blob to its page and kind.
fn aad(page_no: u64, kind: u8) -> [u8; 9] {
    let mut a = [0u8; 9];
    a[..8].copy_from_slice(&page_no.to_le_bytes());
    a[8] = kind;
    a
}

/// The word `page` repeats, if it is one 8-byte word over and over: a page equals itself shifted
/// by 8 bytes exactly when its period divides 8 (one `memcmp`).
pub fn same_filled(page: &[u8]) -> Option<u64> {
    (page[8..] == page[..page.len() - 8])
        .then(|| u64::from_le_bytes(page[..8].try_into().expect("8 bytes")))
}

/// Fills `dst` with `word` repeated (little-endian, as `same_filled` read it).
pub fn fill_word(dst: &mut [u8], word: u64) {
    let bytes = word.to_le_bytes();
    for c in dst.chunks_exact_mut(8) {
        c.copy_from_slice(&bytes);
    }
}

fn random_bytes<const N: usize>() -> Result<[u8; N], PagerError> {
    let mut out = [0u8; N];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut out).map_err(|_| {
        PagerError::Os {
            op: "drawing a random page key",
            source: io::Error::other("the system's random source failed"),
        }
    })?;
    Ok(out)
}

/// Reads a page-key file: 64 hex digits, readable by its owner only.
pub fn read_key_file(path: &Path) -> Result<[u8; 32], PagerError> {
    gleaner_proto::read_secret_file(path, "page-key").map_err(|e| {
        PagerError::Config(format!(
            "cannot use the page-key file {}: {e}",
            path.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_page(seed: u64) -> Vec<u8> {
        let words = ["far ", "memory ", "page ", "gleaner ", "zipf ", "value "];
        let mut s = String::new();
        let mut i = seed;
        while s.len() < PAGE_SIZE {
            s.push_str(words[(i % 6) as usize]);
            s.push_str(&format!("{} ", i % 1000));
            i = i
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407)
                >> 7;
        }
        s.into_bytes()[..PAGE_SIZE].to_vec()
    }

    fn round_trip(c: Compression, e: Encryption, page: &[u8]) -> usize {
        let codec = Codec::new(c, e.clone()).unwrap();
        let mut ctx = codec.ctx();
        let (blob, v) = ctx.encode(42, page);
        let blob = blob.to_vec();
        let mut out = vec![0u8; PAGE_SIZE];
        ctx.decode(42, v, &blob, &mut out).unwrap();
        assert_eq!(out, page, "{c} {e:?}");
        blob.len()
    }

    #[test]
    fn every_setting_round_trips_text_random_zero_and_same_filled_pages() {
        let mut same = vec![0u8; PAGE_SIZE];
        fill_word(&mut same, 0xdead_beef_0123_4567);
        for c in [Compression::Off, Compression::Lz4, Compression::Zstd] {
            for e in [Encryption::On, Encryption::Off] {
                let tag = if e == Encryption::On { TAG_LEN } else { 0 };
                let t = round_trip(c, e.clone(), &text_page(1));
                if c != Compression::Off {
                    assert!(t < PAGE_SIZE * 3 / 4, "{c}: text compressed to {t} bytes");
                }
                let r = round_trip(c, e.clone(), &crate::noise_page(7));
                assert_eq!(r, 1 + PAGE_SIZE + tag, "{c}: random pages are stored raw");
                assert_eq!(round_trip(c, e.clone(), &vec![0u8; PAGE_SIZE]), 9 + tag);
                assert_eq!(round_trip(c, e, &same), 9 + tag);
            }
        }
    }

    /// `auto` compresses with LZ4 unless the context is told to use zstd (a batch's choice), and
    /// back; blobs of both kinds decode whenever they were written.
    #[test]
    fn auto_compresses_with_zstd_while_told_to() {
        let codec =
            Codec::for_region(Compression::Auto, Encryption::On, DecodeBudget::Auto, 64).unwrap();
        assert!(codec.chooses_compressor());
        let mut ctx = codec.ctx();
        let page = text_page(3);
        let mut encode = |n: u64, zstd: bool| {
            ctx.use_zstd(zstd);
            let (blob, v) = ctx.encode(n, &page);
            (blob.to_vec(), v)
        };
        let (lz4, zstd, lz4_again) = (encode(1, false), encode(2, true), encode(3, false));
        // (The kind byte is sealed with the rest.) zstd's entropy coding makes text smaller.
        assert!(
            zstd.0.len() < lz4.0.len(),
            "{} {}",
            zstd.0.len(),
            lz4.0.len()
        );
        assert_eq!(lz4.0.len(), lz4_again.0.len());
        assert_eq!(codec.stats().zstd_for_link, 1);
        assert_eq!(codec.stats().compression, "auto");
        let mut out = vec![0u8; PAGE_SIZE];
        for (n, (blob, v)) in [(1, lz4), (2, zstd), (3, lz4_again)] {
            ctx.decode(n, v, &blob, &mut out).unwrap();
            assert_eq!(out, page, "page {n}");
        }
        let lz4_only =
            Codec::for_region(Compression::Lz4, Encryption::On, DecodeBudget::Auto, 64).unwrap();
        assert!(!lz4_only.chooses_compressor());
        let mut ctx = lz4_only.ctx();
        ctx.use_zstd(true);
        ctx.encode(1, &page);
        assert_eq!(lz4_only.stats().zstd_for_link, 0, "only auto switches");
    }

    /// `--max-decode-us auto` bounds LZ4's decodes at 1.5 µs and leaves zstd's unbounded; a
    /// number bounds either; with compression off there is nothing to bound.
    #[test]
    fn the_decode_budget_applies_per_compressor() {
        let bound = |c: Compression, b: DecodeBudget| {
            let codec = Codec::for_region(c, Encryption::Off, b, 64).unwrap();
            codec.speed.as_ref().map(|_| ())
        };
        assert_eq!(Compression::Lz4.auto_decode_budget_ns(), Some(1500));
        assert_eq!(bound(Compression::Lz4, DecodeBudget::Auto), Some(()));
        assert_eq!(bound(Compression::Zstd, DecodeBudget::Auto), None);
        assert_eq!(
            bound(Compression::Zstd, DecodeBudget::Micros(2.5)),
            Some(())
        );
        assert_eq!(bound(Compression::Off, DecodeBudget::Micros(2.5)), None);
        assert_eq!(bound(Compression::Lz4, DecodeBudget::Off), None);
        // A budget no decode meets stores an explicit zstd's pages raw, but not the pages
        // `auto` sends to zstd: its budget is LZ4's.
        let first_blob = |c: Compression, zstd: bool| {
            let codec = Codec::for_region(c, Encryption::Off, DecodeBudget::Micros(0.001), 64);
            let mut ctx = codec.unwrap().ctx();
            ctx.use_zstd(zstd);
            ctx.encode(0, &text_page(5)).0.len()
        };
        assert_eq!(first_blob(Compression::Zstd, false), 1 + PAGE_SIZE);
        assert!(first_blob(Compression::Auto, true) < PAGE_SIZE / 2);
        assert_eq!(first_blob(Compression::Auto, false), 1 + PAGE_SIZE);
    }

    /// The copy out of the store's buffer and the open are timed apart, on one blob opened in
    /// [`TIMED_OPEN_EVERY`]; with encryption off neither happens.
    #[test]
    fn opening_and_the_copy_before_it_are_counted_apart() {
        for e in [Encryption::On, Encryption::Off] {
            let codec = Codec::new(Compression::Lz4, e.clone()).unwrap();
            let mut ctx = codec.ctx();
            for p in 0..50u64 {
                encode_checked(&mut ctx, p, &crate::noise_page(p));
            }
            let s = codec.stats();
            if e == Encryption::On {
                assert_eq!(s.blobs_opened, 50);
                // The 1st, 9th, ... 49th.
                assert_eq!(s.blobs_open_timed, 7);
                assert!(s.open_ns_total > 0 && s.blob_copy_ns_total > 0, "{s:?}");
                assert!(s.blob_copy_ns_per_blob > 0.0 && s.open_ns_per_blob > 0.0);
            } else {
                assert_eq!(
                    (s.blobs_opened, s.open_ns_total, s.blob_copy_ns_total),
                    (0, 0, 0)
                );
            }
        }
    }

    #[test]
    fn blobs_encoded_in_place_one_after_another_each_decode_to_their_page() {
        let codec = Codec::new(Compression::Lz4, Encryption::On).unwrap();
        let mut ctx = codec.ctx();
        let mut same = vec![0u8; PAGE_SIZE];
        fill_word(&mut same, 7);
        let pages = [
            text_page(1),
            crate::noise_page(2),
            same.clone(),
            text_page(3),
        ];
        // As the shared-memory store batches them: each blob right after the previous one.
        let mut batch = vec![0xaau8; 4 * ENCODE_ROOM];
        let mut used = 0;
        let mut placed = Vec::new();
        for (no, page) in pages.iter().enumerate() {
            match ctx.encode_or_word(no as u64, page, &mut batch[used..]) {
                Encoded::Word(w) => {
                    assert_eq!(no, 2, "only the same-filled page is a word");
                    assert_eq!(w, 7);
                }
                Encoded::Blob { len, version } => {
                    placed.push((no, used, len, version));
                    used += len;
                }
            }
        }
        assert_eq!(placed.len(), 3);
        assert!(placed[0].2 < PAGE_SIZE * 3 / 4, "text compressed");
        assert_eq!(placed[1].2, MAX_BLOB_LEN, "noise stored raw");
        for (no, start, len, version) in placed {
            let mut out = vec![0u8; PAGE_SIZE];
            ctx.decode(no as u64, version, &batch[start..start + len], &mut out)
                .unwrap();
            assert_eq!(out, pages[no], "page {no}");
        }
    }

    #[test]
    fn a_flipped_bit_another_pages_blob_or_an_older_version_is_refused() {
        let codec = Codec::new(Compression::Lz4, Encryption::On).unwrap();
        let mut ctx = codec.ctx();
        let mut out = vec![0u8; PAGE_SIZE];
        let (b, v1) = ctx.encode(5, &text_page(1));
        let old = b.to_vec();
        let (b, v2) = ctx.encode(5, &text_page(2));
        let new = b.to_vec();
        let (b, v9) = ctx.encode(9, &text_page(2));
        let other = b.to_vec();
        ctx.decode(5, v2, &new, &mut out).unwrap();
        assert_eq!(out, text_page(2));
        for i in [0, 1, new.len() / 2, new.len() - 1] {
            let mut bad = new.clone();
            bad[i] ^= 0x10;
            let e = ctx.decode(5, v2, &bad, &mut out).unwrap_err();
            assert!(e.0.contains("page 5"), "{e}");
        }
        assert!(
            ctx.decode(5, v2, &old, &mut out).is_err(),
            "replayed version"
        );
        assert!(
            ctx.decode(5, v1, &new, &mut out).is_err(),
            "version mismatch"
        );
        assert!(
            ctx.decode(5, v2, &other, &mut out).is_err(),
            "another page's blob"
        );
        assert!(ctx.decode(5, v2, &[], &mut out).is_err());
        assert!(ctx.decode(5, v2, &new[..10], &mut out).is_err());
        ctx.decode(9, v9, &other, &mut out).unwrap();
        assert_eq!(codec.stats().auth_failures, 9);
        // Another region's codec (another key) cannot open this one's blobs.
        let stranger = Codec::new(Compression::Lz4, Encryption::On).unwrap();
        assert!(stranger.ctx().decode(5, v2, &new, &mut out).is_err());
    }

    #[test]
    fn a_fork_child_opens_the_snapshot_and_seals_its_own_blobs_under_a_new_key() {
        let parent = Codec::new(Compression::Lz4, Encryption::On).unwrap();
        let mut pctx = parent.ctx();
        let mut out = vec![0u8; PAGE_SIZE];
        let (b, v_snap) = pctx.encode(5, &text_page(1));
        let snap = b.to_vec();
        let child = parent.for_fork_child().unwrap();
        assert!(child.is_fork_child() && !parent.is_fork_child());
        let mut cctx = child.ctx();
        cctx.decode(5, v_snap, &snap, &mut out).unwrap();
        assert_eq!(out, text_page(1), "the child reads the parent's blob");
        // Both go on encoding: the same page, and versions that could meet, under two keys.
        let (b, v_parent) = pctx.encode(5, &text_page(2));
        let from_parent = b.to_vec();
        let (b, v_child) = cctx.encode(5, &text_page(3));
        let from_child = b.to_vec();
        assert!(v_child >= FORK_CHILD_VERSIONS && v_child > v_parent);
        cctx.decode(5, v_child, &from_child, &mut out).unwrap();
        assert_eq!(out, text_page(3));
        // The parent cannot open the child's blobs; the child is not fooled by the parent's
        // later version of a page in place of its snapshot's. A grandchild is refused.
        assert!(pctx.decode(5, v_child, &from_child, &mut out).is_err());
        assert!(cctx.decode(5, v_snap, &from_parent, &mut out).is_err());
        assert!(child.for_fork_child().is_err());
    }

    #[test]
    fn without_sealing_a_malformed_blob_is_still_refused_not_zero_filled() {
        let codec = Codec::new(Compression::Lz4, Encryption::Off).unwrap();
        let mut ctx = codec.ctx();
        let mut out = vec![0xAAu8; PAGE_SIZE];
        let (b, v) = ctx.encode(1, &text_page(3));
        let mut bad = b.to_vec();
        bad.truncate(bad.len() / 2);
        assert!(ctx.decode(1, v, &bad, &mut out).is_err());
        assert!(ctx.decode(1, v, &[KIND_RAW, 1, 2], &mut out).is_err());
        assert!(ctx.decode(1, v, &[9; 20], &mut out).is_err());
    }

    /// A page of 8-byte counters (as `gleaner bench micro` writes): LZ4 halves it but decodes it
    /// slowly (one short match per word).
    fn counter_page(seed: u64) -> Vec<u8> {
        (0..PAGE_SIZE as u64 / 8)
            .flat_map(|w| (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) + w).to_le_bytes())
            .collect()
    }

    /// An LZ4 and AES codec for a region of `pages` pages with a decode budget of `budget_us`.
    fn lz4_region_codec(budget_us: f64, pages: u64) -> Arc<Codec> {
        Codec::for_region(
            Compression::Lz4,
            Encryption::On,
            DecodeBudget::Micros(budget_us),
            pages,
        )
        .unwrap()
    }

    /// Encodes `page` as page `p`, checks that it decodes back, and returns the blob's length.
    fn encode_checked(ctx: &mut CodecCtx, p: u64, page: &[u8]) -> usize {
        let (blob, v) = ctx.encode(p, page);
        let blob = blob.to_vec();
        let mut out = vec![0u8; PAGE_SIZE];
        ctx.decode(p, v, &blob, &mut out).unwrap();
        assert_eq!(out, page, "page {p}");
        blob.len()
    }

    /// Like memcached's slab pages in the harness: four 1 KiB items, each a fixed 64-byte header
    /// and random letters. LZ4 saves a few percent of it (the repeated headers).
    fn items_page(seed: u64) -> Vec<u8> {
        let mut rng = gleaner_sys::rng::XorShift64::from_state(seed | 1);
        let mut page = Vec::with_capacity(PAGE_SIZE);
        for _ in 0..4 {
            page.extend(b"item header: flags 0, exptime 0, nkey 16, nbytes 1024, cas 7... ");
            while page.len() % 1024 != 0 {
                page.push(b'a' + rng.below(26) as u8);
            }
        }
        page
    }

    #[test]
    fn pages_of_a_chunk_whose_pages_save_little_are_compressed_in_lz4s_fast_mode() {
        use crate::codec::decode_budget::CHUNK_PAGES;
        // A budget every decode meets: only the compression's outcome steers the mode.
        let codec = lz4_region_codec(1e6, 4 * CHUNK_PAGES);
        let mut ctx = codec.ctx();
        let mut encode = |p: u64, page: &[u8]| encode_checked(&mut ctx, p, page);
        let n = encode(0, &items_page(0));
        assert!(
            n > PAGE_SIZE * 4 / 5,
            "an items page saves little: {n} bytes"
        );
        assert_eq!(codec.stats().compressed_fast, 0, "the first page learns it");
        // The rest of chunk 0 saves as little: compressed fast. Chunk 1's text compresses well:
        // never.
        for p in 1..CHUNK_PAGES {
            encode(p, &items_page(p));
            encode(CHUNK_PAGES + p, &text_page(p));
        }
        assert_eq!(codec.stats().compressed_fast, CHUNK_PAGES - 1);
        // A page of chunk 0 that compresses well (in fast mode, as the chunk was poor) makes the
        // chunk ordinary again.
        assert!(encode(2, &text_page(2)) <= PAGE_SIZE * 4 / 5);
        assert_eq!(codec.stats().compressed_fast, CHUNK_PAGES);
        encode(3, &text_page(3));
        assert_eq!(codec.stats().compressed_fast, CHUNK_PAGES);
        // No decode budget, no map: LZ4's default mode throughout.
        let codec = Codec::new(Compression::Lz4, Encryption::On).unwrap();
        let mut ctx = codec.ctx();
        for p in 0..4 {
            ctx.encode(p, &items_page(p));
        }
        assert_eq!(codec.stats().compressed_fast, 0);
    }

    #[test]
    fn pages_of_a_chunk_that_decodes_over_the_budget_are_stored_raw_and_still_round_trip() {
        use crate::codec::decode_budget::CHUNK_PAGES;
        // A budget no decode can meet (1 ns), then one every decode meets (1 s): the decision
        // is the trial's, whatever this machine's speed.
        for (budget_us, expect_raw) in [(0.001, true), (1e6, false)] {
            let codec = lz4_region_codec(budget_us, 4 * CHUNK_PAGES);
            let mut ctx = codec.ctx();
            let mut sizes = vec![];
            for p in 0..2 * CHUNK_PAGES {
                let page = if p < CHUNK_PAGES {
                    counter_page(p)
                } else {
                    text_page(p)
                };
                sizes.push(encode_checked(&mut ctx, p, &page));
            }
            let s = codec.stats();
            // One trial per chunk (each chunk's first page), then the decision holds.
            assert_eq!(s.decode_trials, 2, "{s:?}");
            assert_eq!(s.max_decode_ns, (budget_us * 1000.0).round() as u64);
            if expect_raw {
                assert!(sizes.iter().all(|&n| n == MAX_BLOB_LEN), "{sizes:?}");
                assert_eq!(s.raw_for_speed, 2 * CHUNK_PAGES, "{s:?}");
                assert_eq!(s.slow_chunks, 2);
                assert_eq!(s.incompressible, 0);
                assert_eq!(s.pages_compressed, 0);
            } else {
                assert!(sizes.iter().all(|&n| n < PAGE_SIZE * 3 / 4), "{sizes:?}");
                assert_eq!((s.raw_for_speed, s.slow_chunks), (0, 0), "{s:?}");
            }
        }
        // No budget: no trials, the counters compress.
        let codec = Codec::new(Compression::Lz4, Encryption::On).unwrap();
        let mut ctx = codec.ctx();
        assert!(ctx.encode(0, &counter_page(1)).0.len() < PAGE_SIZE * 3 / 4);
        assert_eq!(codec.stats().decode_trials, 0);
    }

    #[test]
    fn a_slow_chunk_is_compressed_on_credit_and_stored_raw_once_the_credit_is_spent() {
        use crate::codec::decode_budget::CHUNK_PAGES;
        // A budget every decode misses (1 ns): the chunk is learnt slow whatever this machine's
        // speed, and every decompression spends credit.
        let codec = lz4_region_codec(0.001, CHUNK_PAGES);
        let mut ctx = codec.ctx();
        let encode_and_check =
            |ctx: &mut CodecCtx, p: u64| encode_checked(ctx, p, &counter_page(p));
        // No credit: the trial page and the next are stored raw.
        assert_eq!(encode_and_check(&mut ctx, 0), MAX_BLOB_LEN);
        assert_eq!(encode_and_check(&mut ctx, 1), MAX_BLOB_LEN);
        let s = codec.stats();
        assert_eq!(
            (s.raw_for_speed, s.compressed_on_credit, s.slow_chunks),
            (2, 0, 1)
        );
        // With credit (as fast pages elsewhere would leave), its pages are compressed; decoding
        // one spends more than the 1 ns of budget it adds, so the credit ends up spent.
        codec.speed.as_ref().unwrap().add_credit(1);
        let n = encode_and_check(&mut ctx, 2);
        assert!(n < PAGE_SIZE * 3 / 4, "compressed on credit: {n} bytes");
        let s = codec.stats();
        assert_eq!(s.compressed_on_credit, 1, "{s:?}");
        assert!(s.decode_credit_ns <= 0, "{s:?}");
        assert_eq!(encode_and_check(&mut ctx, 3), MAX_BLOB_LEN);
        assert_eq!(codec.stats().raw_for_speed, 3);
    }

    #[test]
    fn a_chunk_of_pages_that_do_not_compress_is_stored_raw_without_attempts() {
        use crate::codec::decode_budget::CHUNK_PAGES;
        // A budget no decode misses, even on a loaded machine (the test suite runs tests side
        // by side): what is tested is the incompressible chunk, not the speed of a trial.
        let codec = lz4_region_codec(1000.0, 2 * CHUNK_PAGES);
        let mut ctx = codec.ctx();
        for p in 0..CHUNK_PAGES {
            assert_eq!(
                encode_checked(&mut ctx, p, &crate::noise_page(p)),
                MAX_BLOB_LEN
            );
        }
        let s = codec.stats();
        // The first page found out; the others were not tried.
        assert_eq!(
            (
                s.incompressible,
                s.raw_not_compressible,
                s.incompressible_chunks
            ),
            (1, CHUNK_PAGES - 1, 1),
            "{s:?}"
        );
        assert_eq!(s.pages_compressed, 1);
        // The next chunk still compresses its text.
        let n = ctx.encode(CHUNK_PAGES, &text_page(1)).0.len();
        assert!(n < PAGE_SIZE * 3 / 4, "{n} {:?}", codec.stats());
    }

    #[test]
    fn stats_count_ratio_and_kinds() {
        let codec = Codec::new(Compression::Lz4, Encryption::On).unwrap();
        let mut ctx = codec.ctx();
        ctx.encode(0, &text_page(1));
        ctx.encode(1, &vec![0u8; PAGE_SIZE]);
        ctx.encode(2, &crate::noise_page(3));
        let s = codec.stats();
        assert_eq!(
            (s.pages_encoded, s.same_filled, s.incompressible),
            (3, 1, 1)
        );
        assert!(s.compression_ratio > 1.3, "{s:?}");
        assert_eq!(s.bytes_saved, 3 * PAGE_SIZE as u64 - s.blob_bytes);
        assert_eq!(s.encryption, "aes-256-gcm");
    }

    #[test]
    fn key_files_must_be_private_and_hold_a_key() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("gleaner-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("k");
        std::fs::write(&path, format!("{}\n", "ab".repeat(32))).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Codec::new(Compression::Lz4, Encryption::KeyFile(path.clone())).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let a = Codec::new(Compression::Lz4, Encryption::KeyFile(path.clone())).unwrap();
        round_trip(
            Compression::Lz4,
            Encryption::KeyFile(path.clone()),
            &text_page(4),
        );
        // The same key file still gives every region its own key (a random salt).
        let b = Codec::new(Compression::Lz4, Encryption::KeyFile(path.clone())).unwrap();
        let mut a_ctx = a.ctx();
        let (blob, v) = a_ctx.encode(3, &text_page(5));
        let blob = blob.to_vec();
        assert!(b
            .ctx()
            .decode(3, v, &blob, &mut vec![0u8; PAGE_SIZE])
            .is_err());
        std::fs::write(&path, "abcd\n").unwrap();
        let e = Codec::new(Compression::Lz4, Encryption::KeyFile(path)).unwrap_err();
        assert!(e.to_string().contains("64 hex digits"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
