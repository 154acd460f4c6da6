//! The floors a remote fault is compared against, measured in the same run on the same memnode:
//!
//! * `uffd_round_trip`: a thread touches a registered missing page; a bare handler installs it
//!   with `UFFDIO_COPY` from a local buffer; the time the toucher sees.
//! * `transport_round_trip`: one single-page read from the memnode.
//! * `raw_remote_fault`: the two combined with no pager logic at all (bare handler that reads the
//!   page from the memnode and installs it), as the toucher sees it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use gleaner_pager::{LatencySummary, PAGE_SIZE};
use gleaner_proto::{ConnectOptions, Connection, Endpoint, Token};
use gleaner_sys::anon::AnonMapping;
use gleaner_uffd::{Event, Uffd, UffdOptions};
use serde::Serialize;

use super::new_hist;

/// The floor measurements.
#[derive(Debug, Clone, Serialize)]
pub struct FloorReport {
    /// Fault + `UFFDIO_COPY` from a local buffer, as the faulting thread sees it.
    pub uffd_round_trip: LatencySummary,
    /// One single-page read request to the memnode and its reply.
    pub transport_round_trip: LatencySummary,
    /// A bare remote fault: fault, single-page read from the memnode, `UFFDIO_COPY`.
    pub raw_remote_fault: LatencySummary,
}

/// Measures the floors against the memnode at `endpoint` (which must be reachable now).
pub fn measure(endpoint: &Endpoint, token: &Token, samples: usize) -> Result<FloorReport, String> {
    let mut conn = Connection::connect(endpoint, token, None, &ConnectOptions::default())
        .map_err(|e| e.to_string())?;
    // Populate the pages the raw remote fault will read.
    let page = vec![0x5au8; PAGE_SIZE];
    for chunk in (0..samples as u64)
        .collect::<Vec<_>>()
        .chunks(gleaner_proto::MAX_BATCH_PAGES)
    {
        conn.write_pages(chunk.iter().map(|&id| (id, &page[..])))
            .map_err(|e| e.to_string())?;
    }
    let mut transport = new_hist();
    for i in 0..samples {
        let t = Instant::now();
        conn.read_pages(&[i as u64]).map_err(|e| e.to_string())?;
        transport.saturating_record(t.elapsed().as_nanos() as u64);
    }
    let uffd_rt = touch_with_handler(samples, None)?;
    let raw = touch_with_handler(samples, Some(&mut conn))?;
    let _ = conn.goodbye();
    Ok(FloorReport {
        uffd_round_trip: uffd_rt,
        transport_round_trip: LatencySummary::of(&transport),
        raw_remote_fault: raw,
    })
}

/// Touches `samples` missing pages of a fresh registered mapping while a bare handler serves
/// them, from a local buffer or (with `conn`) by reading each page from the memnode.
fn touch_with_handler(
    samples: usize,
    conn: Option<&mut Connection>,
) -> Result<LatencySummary, String> {
    let len = samples * PAGE_SIZE;
    let mapping = AnonMapping::new(len, libc::MAP_NORESERVE).map_err(|e| format!("mmap: {e}"))?;
    let base = mapping.addr();
    let result = (|| {
        let uffd = Arc::new(Uffd::open(UffdOptions::default()).map_err(|e| e.to_string())?);
        uffd.register(base, len, false).map_err(|e| e.to_string())?;
        let done = Arc::new(AtomicBool::new(false));
        let toucher = {
            let done = done.clone();
            std::thread::spawn(move || {
                let mut h = new_hist();
                for i in 0..samples {
                    let t = Instant::now();
                    // SAFETY: page i of the live mapping; the handler installs it.
                    unsafe { std::ptr::read_volatile((base + i * PAGE_SIZE) as *const u8) };
                    h.saturating_record(t.elapsed().as_nanos() as u64);
                }
                done.store(true, Ordering::Release);
                h
            })
        };
        let local = vec![0x33u8; PAGE_SIZE];
        let mut events = Vec::new();
        let mut conn = conn;
        while !done.load(Ordering::Acquire) {
            let mut pfd = libc::pollfd {
                fd: uffd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll on one valid pollfd living across the call.
            unsafe { libc::poll(&mut pfd, 1, 5) };
            uffd.read_events(&mut events, 16)
                .map_err(|e| e.to_string())?;
            for ev in events.drain(..) {
                let Event::Fault { addr, .. } = ev else {
                    continue;
                };
                let page = (addr - base) / PAGE_SIZE;
                let src = match conn.as_deref_mut() {
                    Some(c) => c
                        .read_pages(&[page as u64])
                        .map_err(|e| e.to_string())?
                        .get(0)
                        .2
                        .as_ptr(),
                    None => local.as_ptr(),
                };
                // SAFETY: `src` is one page of heap memory outside the registered mapping (the
                // local buffer or the connection's receive buffer, not touched until the copy
                // returns); the destination is an aligned page of the registered mapping.
                unsafe { uffd.copy(base + page * PAGE_SIZE, src, PAGE_SIZE, false, true) }
                    .map_err(|e| e.to_string())?;
            }
        }
        let h = toucher
            .join()
            .map_err(|_| "toucher thread panicked".to_string())?;
        Ok(LatencySummary::of(&h))
    })();
    // The toucher has finished (or never started): the mapping goes.
    drop(mapping);
    result
}
