//! The trace file format: round trip, and rejection of truncated or garbage files.

use std::io::Cursor;
use std::path::PathBuf;

use gleaner_policy::trace::synth::{generate, Pattern, SynthConfig};
use gleaner_policy::trace::{
    read_file, write_file, Header, Kind, Record, TraceError, TraceReader, TraceWriter, HEADER_LEN,
    RECORD_LEN,
};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gleaner-policy-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn sample() -> Vec<Record> {
    let kinds = [
        Kind::MissingRead,
        Kind::MissingWrite,
        Kind::WriteProtect,
        Kind::PrefetchHit,
        Kind::Refault,
        Kind::Access,
    ];
    (0..1000u64)
        .map(|i| Record {
            time_ns: i * 1_234 + u64::from(i == 999) * (u64::MAX - 2_000_000),
            page: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            tid: (i % 7) as u32 + u32::from(i == 3) * (u32::MAX - 10),
            kind: kinds[(i % 6) as usize],
        })
        .collect()
}

#[test]
fn round_trip_through_a_file() {
    let path = tmp("round.trace");
    let header = Header {
        page_size: 16384,
        region_base: 0x7f00_0000_0000,
    };
    let records = sample();
    write_file(&path, header, &records).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    assert_eq!(len, (HEADER_LEN + records.len() * RECORD_LEN) as u64);
    let (h, back) = read_file(&path).unwrap();
    assert_eq!(h, header);
    assert_eq!(back, records);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn writer_counts_and_streams() {
    let mut w = TraceWriter::with_capacity(64, Vec::new(), Header::default()).unwrap();
    for r in &sample()[..10] {
        w.record(r).unwrap();
    }
    w.record_fault(5, 6, 7, Kind::PrefetchHit).unwrap();
    assert_eq!(w.records(), 11);
    let bytes = w.finish().unwrap();
    let reader = TraceReader::new(Cursor::new(bytes)).unwrap();
    assert_eq!(reader.header().page_size, 4096);
    let back: Vec<Record> = reader.map(Result::unwrap).collect();
    assert_eq!(back.len(), 11);
    assert_eq!(
        back[10],
        Record {
            time_ns: 5,
            page: 6,
            tid: 7,
            kind: Kind::PrefetchHit
        }
    );
}

#[test]
fn synthetic_trace_round_trip() {
    let path = tmp("synth.trace");
    let records = generate(&SynthConfig::new(Pattern::Interleave(1, 10), 100, 500));
    write_file(&path, Header::default(), &records).unwrap();
    assert_eq!(read_file(&path).unwrap().1, records);
    std::fs::remove_file(&path).unwrap();
}

fn bytes_of(records: &[Record]) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), Header::default()).unwrap();
    for r in records {
        w.record(r).unwrap();
    }
    w.finish().unwrap()
}

#[test]
fn truncated_files_are_rejected() {
    let full = bytes_of(&sample()[..5]);
    let path = tmp("trunc.trace");
    // Cut inside the last record.
    std::fs::write(&path, &full[..full.len() - 3]).unwrap();
    let e = read_file(&path).unwrap_err();
    assert!(
        matches!(
            e,
            TraceError::Truncated {
                records: 4,
                trailing: 21
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("truncated"), "{e}");
    // The same through a stream: the four whole records, then the error.
    let mut it = TraceReader::new(Cursor::new(full[..full.len() - 3].to_vec())).unwrap();
    for _ in 0..4 {
        assert!(it.next().unwrap().is_ok());
    }
    assert!(matches!(
        it.next(),
        Some(Err(TraceError::Truncated { records: 4, .. }))
    ));
    assert!(it.next().is_none(), "the iterator ends after an error");
    // Cut inside the header.
    std::fs::write(&path, &full[..20]).unwrap();
    let e = read_file(&path).unwrap_err();
    assert!(matches!(e, TraceError::TooShort(20)), "{e:?}");
    assert!(e.to_string().contains("shorter than"), "{e}");
    // An empty file.
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(
        read_file(&path).unwrap_err(),
        TraceError::TooShort(0)
    ));
    // A header alone is a valid, empty trace.
    std::fs::write(&path, &full[..HEADER_LEN]).unwrap();
    assert!(read_file(&path).unwrap().1.is_empty());
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn garbage_is_rejected() {
    let path = tmp("garbage.trace");
    let good = bytes_of(&sample()[..3]);
    // Bad magic (also for a file shorter than a header).
    let mut b = good.clone();
    b[0] = b'X';
    std::fs::write(&path, &b).unwrap();
    let e = read_file(&path).unwrap_err();
    assert!(matches!(e, TraceError::BadMagic), "{e:?}");
    assert!(e.to_string().contains("bad magic"), "{e}");
    std::fs::write(&path, b"#!/bin/sh\necho hi\n").unwrap();
    assert!(matches!(
        read_file(&path).unwrap_err(),
        TraceError::BadMagic
    ));
    // Unknown version.
    let mut b = good.clone();
    b[8] = 9;
    assert!(matches!(
        TraceReader::new(Cursor::new(b)).unwrap_err(),
        TraceError::UnsupportedVersion(9)
    ));
    // Record length and page size.
    let mut b = good.clone();
    b[12] = 16;
    let e = TraceReader::new(Cursor::new(b)).unwrap_err();
    assert!(e.to_string().contains("record length 16"), "{e}");
    let mut b = good.clone();
    b[16..20].copy_from_slice(&3000u32.to_le_bytes());
    let e = TraceReader::new(Cursor::new(b)).unwrap_err();
    assert!(e.to_string().contains("page size 3000"), "{e}");
    // Unknown kind and nonzero padding in record 1.
    let mut b = good.clone();
    b[HEADER_LEN + RECORD_LEN + 20] = 200;
    std::fs::write(&path, &b).unwrap();
    let e = read_file(&path).unwrap_err();
    assert!(matches!(e, TraceError::BadRecord { index: 1, .. }), "{e:?}");
    assert!(e.to_string().contains("record 1: unknown kind 200"), "{e}");
    let mut b = good.clone();
    b[HEADER_LEN + 2 * RECORD_LEN + 23] = 1;
    let e = TraceReader::new(Cursor::new(b))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap_err();
    assert!(e.to_string().contains("record 2: nonzero padding"), "{e}");
    // A missing file.
    let e = read_file(tmp("does-not-exist.trace")).unwrap_err();
    assert!(matches!(e, TraceError::Io(_)), "{e:?}");
    std::fs::remove_file(&path).unwrap();
}
