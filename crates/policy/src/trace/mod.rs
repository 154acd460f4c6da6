//! Fault traces: a compact binary file of page-fault records, its writer (cheap enough for a fault
//! handler thread), a validating reader, and synthetic traces ([`synth`]).
//!
//! # File format, version 1 (all integers little-endian)
//!
//! Header, [`HEADER_LEN`] = 32 bytes:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `GLNTRACE` |
//! | 8 | 2 | version (1) |
//! | 10 | 2 | header length (32) |
//! | 12 | 2 | record length (24) |
//! | 14 | 2 | reserved, 0 |
//! | 16 | 4 | page size in bytes (a power of two, at least 512) |
//! | 20 | 4 | reserved, 0 |
//! | 24 | 8 | region base address; record pages are relative to it (0: absolute page numbers) |
//!
//! Then records of [`RECORD_LEN`] = 24 bytes, until the end of the file:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | `time_ns`: nanoseconds since an arbitrary origin (the writer's start) |
//! | 8 | 8 | `page`: `(address - region base) / page size` |
//! | 16 | 4 | `tid`: faulting thread id (0 if unknown) |
//! | 20 | 1 | `kind`: [`Kind`] |
//! | 21 | 3 | padding, 0 |
//!
//! A file whose length is not the header plus a whole number of records is *truncated* and is
//! rejected, as are an unknown magic, version, kind or nonzero padding.
//!
//! # What a trace recorded by the engine contains
//!
//! Only faults: accesses to mapped pages are invisible. Such a trace is the reference string
//! filtered by the cache it was recorded with, which limits what a replay can say:
//!
//! * **Eviction** comparisons need a replay capacity *larger* than the recording one. Below it,
//!   the fault stream has no reuse the smaller cache could exploit (under FIFO recording, a page
//!   faults again only after at least `recording capacity` other faults), so every online policy
//!   misses on every record and only Belady differs. Above it, hits the recording cache absorbed
//!   are missing, so results are approximate. Traces recorded with access sampling (the
//!   [`Kind::Refault`] faults of a policy that unmaps pages to watch them) carry more reuse.
//! * **Prefetcher** comparisons are closer to the engine's view, since prefetchers only ever see
//!   faults; the fault stream itself still depends on the recording's eviction order.
//!
//! Synthetic traces ([`Kind::Access`]) record every access and have none of these limits.
//!
//! A trace recorded with the access scan on (the default under asynchronous dirty tracking)
//! also holds [`Kind::Referenced`] records: the pages each scan saw written, the information the
//! engine's eviction order had beyond faults. They are not references.

pub mod synth;

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;

/// The file magic.
pub const MAGIC: [u8; 8] = *b"GLNTRACE";
/// The format version this module writes and reads.
pub const VERSION: u16 = 1;
/// Header size in bytes.
pub const HEADER_LEN: usize = 32;
/// Record size in bytes.
pub const RECORD_LEN: usize = 24;
/// The default page size.
pub const DEFAULT_PAGE_SIZE: u32 = 4096;

/// What a record reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum Kind {
    /// A read of a page that was not present (remote or never touched).
    MissingRead = 0,
    /// A write to a page that was not present.
    MissingWrite = 1,
    /// A write to a present, write-protected (clean) page.
    WriteProtect = 2,
    /// The first use of a prefetched page waiting unmapped.
    PrefetchHit = 3,
    /// A fault on a page unmapped by the eviction policy but kept locally (no I/O).
    Refault = 4,
    /// A plain access (synthetic traces record every access, not only faults).
    Access = 5,
    /// Not a reference: the engine's access scan saw this resident page written since its
    /// previous scan (a reference bit). A replay hands it to the eviction policy as
    /// [`Touch::Scanned`](crate::evict::Touch::Scanned) when the page is resident, and does not
    /// count it as a reference.
    Referenced = 6,
}

impl Kind {
    /// The kind with this code, if any.
    pub fn from_code(code: u8) -> Option<Kind> {
        Some(match code {
            0 => Kind::MissingRead,
            1 => Kind::MissingWrite,
            2 => Kind::WriteProtect,
            3 => Kind::PrefetchHit,
            4 => Kind::Refault,
            5 => Kind::Access,
            6 => Kind::Referenced,
            _ => return None,
        })
    }
}

/// One fault (or access).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Nanoseconds since the trace's origin.
    pub time_ns: u64,
    /// Page number, relative to the header's region base.
    pub page: u64,
    /// Faulting thread id (0 if unknown).
    pub tid: u32,
    /// What happened.
    pub kind: Kind,
}

impl Record {
    /// The record's 24 bytes.
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut b = [0u8; RECORD_LEN];
        b[0..8].copy_from_slice(&self.time_ns.to_le_bytes());
        b[8..16].copy_from_slice(&self.page.to_le_bytes());
        b[16..20].copy_from_slice(&self.tid.to_le_bytes());
        b[20] = self.kind as u8;
        b
    }

    /// Decodes 24 bytes; `index` only labels errors.
    pub fn decode(b: &[u8; RECORD_LEN], index: u64) -> Result<Record, TraceError> {
        let kind = Kind::from_code(b[20]).ok_or(TraceError::BadRecord {
            index,
            reason: format!("unknown kind {}", b[20]),
        })?;
        if b[21..24] != [0, 0, 0] {
            return Err(TraceError::BadRecord {
                index,
                reason: "nonzero padding".into(),
            });
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        Ok(Record {
            time_ns: u64_at(0),
            page: u64_at(8),
            tid: u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")),
            kind,
        })
    }
}

/// The trace header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Header {
    /// Page size in bytes.
    pub page_size: u32,
    /// Base address the record pages are relative to (0: absolute page numbers).
    pub region_base: u64,
}

impl Default for Header {
    fn default() -> Self {
        Header {
            page_size: DEFAULT_PAGE_SIZE,
            region_base: 0,
        }
    }
}

impl Header {
    /// The header's 32 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&VERSION.to_le_bytes());
        b[10..12].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
        b[12..14].copy_from_slice(&(RECORD_LEN as u16).to_le_bytes());
        b[16..20].copy_from_slice(&self.page_size.to_le_bytes());
        b[24..32].copy_from_slice(&self.region_base.to_le_bytes());
        b
    }

    /// Decodes and validates 32 header bytes.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, TraceError> {
        if b[0..8] != MAGIC {
            return Err(TraceError::BadMagic);
        }
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let version = u16_at(8);
        if version != VERSION {
            return Err(TraceError::UnsupportedVersion(version));
        }
        let bad = |reason: String| Err(TraceError::BadHeader(reason));
        if usize::from(u16_at(10)) != HEADER_LEN {
            return bad(format!(
                "header length {} (expected {HEADER_LEN})",
                u16_at(10)
            ));
        }
        if usize::from(u16_at(12)) != RECORD_LEN {
            return bad(format!(
                "record length {} (expected {RECORD_LEN})",
                u16_at(12)
            ));
        }
        let page_size = u32::from_le_bytes(b[16..20].try_into().expect("4 bytes"));
        if !page_size.is_power_of_two() || page_size < 512 {
            return bad(format!(
                "page size {page_size} is not a power of two >= 512"
            ));
        }
        Ok(Header {
            page_size,
            region_base: u64::from_le_bytes(b[24..32].try_into().expect("8 bytes")),
        })
    }
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// Shorter than a header.
    #[error("not a gleaner trace: {0} bytes, shorter than the {HEADER_LEN}-byte header")]
    TooShort(u64),
    /// The magic is wrong.
    #[error("not a gleaner trace: bad magic (expected `GLNTRACE`)")]
    BadMagic,
    /// A version this build does not read.
    #[error("unsupported trace version {0} (this build reads version {VERSION})")]
    UnsupportedVersion(u16),
    /// A header field is invalid.
    #[error("corrupt trace header: {0}")]
    BadHeader(String),
    /// The file ends inside a record.
    #[error(
        "truncated trace: {trailing} stray bytes after record {records} (records are \
         {RECORD_LEN} bytes)"
    )]
    Truncated {
        /// Whole records before the stray bytes.
        records: u64,
        /// Bytes of the incomplete record.
        trailing: usize,
    },
    /// A record is invalid.
    #[error("corrupt trace record {index}: {reason}")]
    BadRecord {
        /// Index of the record (0-based).
        index: u64,
        /// What is wrong.
        reason: String,
    },
}

/// Appends records to a trace.
///
/// Built for a fault-handler thread: the buffer is allocated once at creation and
/// [`record`](Self::record) only copies 24 bytes into it (a write system call happens when it
/// fills, every ~43,000 records with the default 1 MiB buffer). Call [`flush`](Self::flush) or
/// [`finish`](Self::finish) at the end; a writer dropped without either flushes on a best-effort
/// basis (errors are lost), like [`BufWriter`]. One writer per thread, or one behind a lock.
#[derive(Debug)]
pub struct TraceWriter<W: Write> {
    out: BufWriter<W>,
    records: u64,
}

/// The default buffer of [`TraceWriter::create`].
pub const WRITER_BUFFER: usize = 1 << 20;

impl TraceWriter<File> {
    /// Creates (truncates) `path` and writes the header.
    pub fn create(path: impl AsRef<Path>, header: Header) -> io::Result<Self> {
        TraceWriter::new(File::create(path)?, header)
    }
}

impl<W: Write> TraceWriter<W> {
    /// A writer over `inner` with a [`WRITER_BUFFER`] buffer; writes the header.
    pub fn new(inner: W, header: Header) -> io::Result<Self> {
        Self::with_capacity(WRITER_BUFFER, inner, header)
    }

    /// A writer with a buffer of `capacity` bytes; writes the header.
    pub fn with_capacity(capacity: usize, inner: W, header: Header) -> io::Result<Self> {
        let mut out = BufWriter::with_capacity(capacity.max(RECORD_LEN), inner);
        out.write_all(&header.encode())?;
        Ok(TraceWriter { out, records: 0 })
    }

    /// Appends one record.
    #[inline]
    pub fn record(&mut self, r: &Record) -> io::Result<()> {
        self.out.write_all(&r.encode())?;
        self.records += 1;
        Ok(())
    }

    /// Appends one record from its fields.
    #[inline]
    pub fn record_fault(
        &mut self,
        time_ns: u64,
        page: u64,
        tid: u32,
        kind: Kind,
    ) -> io::Result<()> {
        self.record(&Record {
            time_ns,
            page,
            tid,
            kind,
        })
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Writes buffered records to the underlying writer and flushes it.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Flushes and returns the underlying writer.
    pub fn finish(self) -> io::Result<W> {
        self.out.into_inner().map_err(|e| e.into_error())
    }
}

/// Reads a trace: validates the header, then yields records (an iterator of results).
///
/// After the first error the iterator ends.
#[derive(Debug)]
pub struct TraceReader<R: Read> {
    inner: R,
    header: Header,
    index: u64,
    done: bool,
}

impl TraceReader<BufReader<File>> {
    /// Opens `path`, validating the header and that the length is a whole number of records.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        if len < HEADER_LEN as u64 {
            // Still check the magic first when there is one, for the clearer error.
            let mut b = Vec::new();
            file.take(HEADER_LEN as u64).read_to_end(&mut b)?;
            if b.len() >= 8 && b[0..8] != MAGIC {
                return Err(TraceError::BadMagic);
            }
            return Err(TraceError::TooShort(len));
        }
        let reader = TraceReader::new(BufReader::with_capacity(1 << 20, file))?;
        let body = len - HEADER_LEN as u64;
        let trailing = (body % RECORD_LEN as u64) as usize;
        if trailing != 0 {
            return Err(TraceError::Truncated {
                records: body / RECORD_LEN as u64,
                trailing,
            });
        }
        Ok(reader)
    }
}

impl<R: Read> TraceReader<R> {
    /// Reads and validates the header from `inner`.
    pub fn new(mut inner: R) -> Result<Self, TraceError> {
        let mut b = [0u8; HEADER_LEN];
        let n = read_full(&mut inner, &mut b)?;
        if n < HEADER_LEN {
            if n >= 8 && b[0..8] != MAGIC {
                return Err(TraceError::BadMagic);
            }
            return Err(TraceError::TooShort(n as u64));
        }
        let header = Header::decode(&b)?;
        Ok(TraceReader {
            inner,
            header,
            index: 0,
            done: false,
        })
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<Record, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let mut b = [0u8; RECORD_LEN];
        let result = match read_full(&mut self.inner, &mut b) {
            Ok(0) => {
                self.done = true;
                return None;
            }
            Ok(n) if n < RECORD_LEN => Err(TraceError::Truncated {
                records: self.index,
                trailing: n,
            }),
            Ok(_) => Record::decode(&b, self.index),
            Err(e) => Err(TraceError::Io(e)),
        };
        match result {
            Ok(r) => {
                self.index += 1;
                Some(Ok(r))
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Reads a whole trace file into memory.
pub fn read_file(path: impl AsRef<Path>) -> Result<(Header, Vec<Record>), TraceError> {
    let reader = TraceReader::open(path)?;
    let header = *reader.header();
    let records = reader.collect::<Result<Vec<_>, _>>()?;
    Ok((header, records))
}

/// Writes `records` to a new trace file at `path`.
pub fn write_file(path: impl AsRef<Path>, header: Header, records: &[Record]) -> io::Result<()> {
    let mut w = TraceWriter::create(path, header)?;
    for r in records {
        w.record(r)?;
    }
    w.finish().map(drop)
}
