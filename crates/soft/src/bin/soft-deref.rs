//! `soft-deref`: what a soft read costs beside a plain copy (Midas's dereference cost). For an
//! object of 32 bytes and one of 4 MiB it times, in the same run and alternately, a hit through
//! a [`SoftBox`] (`read_into`, reusing the output's allocation) and a plain copy of the same
//! bytes from an ordinary heap object into a reused buffer, and prints one JSON line: the
//! medians of `--rounds` rounds in ns per read, and their ratios. Every read is checked against
//! the object's bytes; a wrong read exits 3.
//!
//! Like with like: the plain side is a [`PlainBox`], the bytes in a heap allocation (a `Vec`)
//! whose handle sits where the program keeps it, as a [`SoftBox`]'s does (a value in an
//! ordinary cache). It is read the way a soft read delivers its copy: the output cleared, then
//! the bytes appended to it (`extend_from_slice`: a capacity check, one `memcpy`, the new
//! length; the soft read's `Piece::append_payload_to` in `crates/node/src/map.rs` does the same
//! from the mapping). Both loops inline their read and pass the handle through `black_box` on
//! every read, so neither can hoist the finding of its object out of the loop, and both reuse
//! the output's allocation. What the ratio measures is the soft read's own work: its seqlock
//! snapshot, the bounds and header checks, the re-checks after the copy and the hit counting.
//! The 4 MiB object is in three pieces (a piece is at most a segment, 2 MiB, less its header),
//! so its read takes the pool's lock.
//!
//! A soft read copies a payload of 8 to 32 bytes inline (two pairs of unaligned words), where
//! `extend_from_slice` calls the C library's `memcpy`; so a stricter plain side is timed too, a
//! copy of the 32 bytes as two 16-byte words (what a program that knows its object's size
//! could write), and its ratio printed beside the first (`deref_ratio_32b_vs_inline`).
//!
//! `soft-deref [--rounds R] [--reads-small N] [--reads-large N]`

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use gleaner_soft::{Pool, PoolConfig, SoftBox};

/// A value of `len` bytes that depends on `seed`.
fn value(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// The plain baseline: bytes in an ordinary heap object.
struct PlainBox(Vec<u8>);

impl PlainBox {
    /// A copy of the bytes into `out`, the way [`SoftBox::read_into`] delivers one.
    #[inline]
    fn read_into(&self, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.0);
    }

    /// A copy of exactly 32 bytes into `out` as two 16-byte words, no `memcpy` call.
    #[inline]
    fn read_32_inline(&self, out: &mut Vec<u8>) {
        out.clear();
        let head: [u8; 16] = self.0[..16].try_into().expect("32 bytes");
        let tail: [u8; 16] = self.0[16..32].try_into().expect("32 bytes");
        out.extend_from_slice(&head);
        out.extend_from_slice(&tail);
    }
}

/// A hit of `obj` into `out`; a read that finds nothing ends the run (exit 3).
#[inline(always)]
fn soft_read(obj: &SoftBox, out: &mut Vec<u8>) {
    if !obj.read_into(&[], out) {
        eprintln!("soft-deref: a read found nothing");
        std::process::exit(3);
    }
}

/// ns per read of `obj` into `out` by `read`, `reads` times (inlined where it is called, with
/// `read` in it).
#[inline(always)]
fn time_reads<T>(obj: &T, reads: u64, out: &mut Vec<u8>, read: impl Fn(&T, &mut Vec<u8>)) -> f64 {
    let t = Instant::now();
    for _ in 0..reads {
        read(black_box(obj), out);
        black_box(&out);
    }
    t.elapsed().as_nanos() as f64 / reads as f64
}

/// ns per hit of `obj` into `out`, `reads` times: a function of its own, so that a profile
/// (callgrind's inclusive count of `time_soft`) tells the soft loop from the plain ones.
#[inline(never)]
fn time_soft(obj: &SoftBox, reads: u64, out: &mut Vec<u8>) -> f64 {
    time_reads(obj, reads, out, soft_read)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    match args.iter().position(|a| a == name) {
        None => default,
        Some(i) => match args.get(i + 1).and_then(|v| v.parse().ok()) {
            Some(v) => v,
            None => {
                eprintln!("soft-deref: {name} takes a number");
                std::process::exit(2);
            }
        },
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("usage: soft-deref [--rounds R] [--reads-small N] [--reads-large N]");
        return;
    }
    let rounds = arg(&args, "--rounds", 7).max(1);
    let reads_small = arg(&args, "--reads-small", 2_000_000).max(1);
    let reads_large = arg(&args, "--reads-large", 200).max(1);
    let small = value(7, 32);
    let large = value(9, 4 << 20);
    let cfg = PoolConfig {
        name: "deref".into(),
        capacity: 64 << 20,
        limit: 32 << 20,
        ..PoolConfig::default()
    };
    let pool = Pool::new(cfg, Arc::new(|_: &[u8]| None)).unwrap_or_else(|e| {
        eprintln!("soft-deref: opening the pool: {e}");
        std::process::exit(1);
    });
    let (a, b) = (pool.new_unique(), pool.new_unique());
    assert!(a.write(&small) && b.write(&large), "the pool had no room");
    let plain_small = PlainBox(small.clone());
    let plain_large = PlainBox(large.clone());
    let mut out = Vec::new();
    let mut rows: [Vec<f64>; 5] = Default::default();
    for _ in 0..rounds {
        rows[0].push(time_soft(&a, reads_small, &mut out));
        if out != small {
            std::process::exit(3);
        }
        rows[1].push(time_reads(
            &plain_small,
            reads_small,
            &mut out,
            PlainBox::read_into,
        ));
        if out != small {
            std::process::exit(3);
        }
        rows[2].push(time_soft(&b, reads_large, &mut out));
        if out != large {
            std::process::exit(3);
        }
        rows[3].push(time_reads(
            &plain_large,
            reads_large,
            &mut out,
            PlainBox::read_into,
        ));
        if out != large {
            std::process::exit(3);
        }
        rows[4].push(time_reads(
            &plain_small,
            reads_small,
            &mut out,
            PlainBox::read_32_inline,
        ));
        if out != small {
            std::process::exit(3);
        }
    }
    let [soft_small, plain_small, soft_large, plain_large, inline_small] = rows.map(median);
    println!(
        "{}",
        serde_json::json!({
            "soft_32b_ns": soft_small,
            "plain_32b_ns": plain_small,
            "deref_ratio_32b": soft_small / plain_small,
            "plain_32b_inline_ns": inline_small,
            "deref_ratio_32b_vs_inline": soft_small / inline_small,
            "soft_4m_ns": soft_large,
            "plain_4m_ns": plain_large,
            "deref_ratio_4m": soft_large / plain_large,
            "rounds": rounds,
        })
    );
}
