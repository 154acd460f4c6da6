//! Write prediction: which pages fetched for a read should be installed writable at once.
//!
//! Dirty tracking installs a page fetched for a read write-protected, so its first write costs a
//! second fault (a write-protect fault, a full userfaultfd round trip). Some programs write almost
//! every page they read: memcached updates an item's access time and LRU links on every GET, and at
//! 70% local memory took nearly as many write-protect faults as remote faults under synchronous
//! tracking (`bench/results/reclaim/README.md`, "Write prediction"). A page that was rewritten
//! after coming back from the memnode (a write-protect fault while tracked, or a fetch for a write)
//! is therefore likely to be rewritten again: its next [`PREDICTED_RESIDENCIES`] read fetches
//! install it writable and dirty (no second fault on the program's critical path; the price of a
//! wrong guess is one unneeded write-back at eviction, tens of microseconds of a reclaim thread).
//! Then it is tracked again for one residency, so a page that stopped being written stops being
//! predicted after at most that many needless write-backs. Known weakness: one rewrite is enough
//! evidence, so a read-mostly program that rewrites a page once (Python reusing a freed chunk) pays
//! those write-backs for nothing (measured in `bench/results/reclaim/README.md`, "Phases job"; the
//! tables in `bench/results/DETAILS.md`, "Batch job with phases").
//!
//! With prediction off the same bookkeeping runs in shadow: installs that *would* have been
//! predicted are counted and so are those the program then wrote, which measures the
//! predictor's precision on the real fault stream without changing what the program sees.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use serde::Serialize;

/// Whether pages seen rewritten are installed writable on their next read fetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WritePrediction {
    /// Predict (the default).
    #[default]
    On,
    /// Track every read fetch; the predictor runs in shadow and reports its precision.
    Off,
}

impl std::str::FromStr for WritePrediction {
    type Err = String;

    fn from_str(s: &str) -> Result<WritePrediction, String> {
        match s {
            "on" => Ok(WritePrediction::On),
            "off" => Ok(WritePrediction::Off),
            _ => Err(format!("`{s}`: expected `on` or `off`")),
        }
    }
}

impl std::fmt::Display for WritePrediction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WritePrediction::On => "on",
            WritePrediction::Off => "off",
        })
    }
}

/// Read fetches installed writable after a tracked write, before the page is tracked again.
pub const PREDICTED_RESIDENCIES: u8 = 3;

/// Set in a page's entry (shadow mode only) while a would-be-predicted install is resident.
const SHADOW_PREDICTED: u8 = 0x80;

/// Per-page prediction state and counters.
pub(crate) struct WritePredictor {
    enabled: bool,
    /// Per page: predicted residencies left (low bits) and, in shadow mode, [`SHADOW_PREDICTED`].
    /// Only the handler that owns the page (installing it, or serving its write-protect fault)
    /// touches its entry.
    left: Box<[AtomicU8]>,
    predicted: AtomicU64,
    confirmed: AtomicU64,
}

/// The predictor's counters for the stats JSON.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct WritePredictionStats {
    /// Whether read fetches may be installed writable (`false`: shadow mode, counting only).
    pub enabled: bool,
    /// Read fetches installed writable (enabled), or that would have been (shadow).
    pub predicted: u64,
    /// Shadow mode: of those, the pages the program then wrote (each a write-protect fault that
    /// prediction would have saved). Always 0 when enabled (a predicted page takes no fault).
    pub shadow_confirmed: u64,
    /// Shadow mode: `shadow_confirmed / predicted`, the predictor's precision.
    pub shadow_precision: Option<f64>,
}

impl WritePredictor {
    /// A predictor for `pages` pages; `enabled: false` runs it in shadow.
    pub(crate) fn new(pages: usize, enabled: bool) -> WritePredictor {
        let left = Box::<[AtomicU8]>::new_zeroed_slice(pages);
        // SAFETY: an all-zero u8 is a valid AtomicU8 holding 0 ("no prediction").
        let left = unsafe { left.assume_init() };
        WritePredictor {
            enabled,
            left,
            predicted: AtomicU64::new(0),
            confirmed: AtomicU64::new(0),
        }
    }

    /// `page` is about to be installed for a read: whether to install it writable and dirty.
    pub(crate) fn install_writable(&self, page: usize) -> bool {
        let e = &self.left[page];
        let v = e.load(Ordering::Relaxed);
        let n = v & !SHADOW_PREDICTED;
        if n == 0 {
            e.store(0, Ordering::Relaxed);
            return false;
        }
        self.predicted.fetch_add(1, Ordering::Relaxed);
        if self.enabled {
            e.store(n - 1, Ordering::Relaxed);
            true
        } else {
            e.store((n - 1) | SHADOW_PREDICTED, Ordering::Relaxed);
            false
        }
    }

    /// The program wrote `page` while it was tracked (a write-protect fault on a clean page).
    pub(crate) fn on_tracked_write(&self, page: usize) {
        let e = &self.left[page];
        if e.load(Ordering::Relaxed) & SHADOW_PREDICTED != 0 {
            self.confirmed.fetch_add(1, Ordering::Relaxed);
        }
        e.store(PREDICTED_RESIDENCIES, Ordering::Relaxed);
    }

    /// `page` came back from the memnode for a write (installed writable and dirty): it is
    /// rewritten, so predict its next read fetches too. Not a confirmation: this residency was
    /// not a predicted one. (A first-touch write arms nothing: initialising a page says nothing
    /// about rewriting it, and arming there would cost needless write-backs to every page a
    /// program fills once and then only reads.)
    pub(crate) fn on_write_fetch(&self, page: usize) {
        self.left[page].store(PREDICTED_RESIDENCIES, Ordering::Relaxed);
    }

    /// `page` was discarded by the program: forget what was known about it.
    pub(crate) fn forget(&self, page: usize) {
        self.left[page].store(0, Ordering::Relaxed);
    }

    /// A snapshot for the stats JSON.
    pub(crate) fn stats(&self) -> WritePredictionStats {
        let predicted = self.predicted.load(Ordering::Relaxed);
        let confirmed = self.confirmed.load(Ordering::Relaxed);
        WritePredictionStats {
            enabled: self.enabled,
            predicted,
            shadow_confirmed: confirmed,
            shadow_precision: (!self.enabled && predicted > 0)
                .then(|| confirmed as f64 / predicted as f64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tracked_write_predicts_the_next_residencies_then_tracking_resumes() {
        let p = WritePredictor::new(4, true);
        assert!(!p.install_writable(1), "nothing known yet");
        p.on_tracked_write(1);
        for _ in 0..PREDICTED_RESIDENCIES {
            assert!(p.install_writable(1));
        }
        assert!(
            !p.install_writable(1),
            "tracked again after the predicted residencies"
        );
        assert!(!p.install_writable(2), "other pages unaffected");
        let s = p.stats();
        assert_eq!(s.predicted, u64::from(PREDICTED_RESIDENCIES));
        assert_eq!(s.shadow_precision, None);
    }

    #[test]
    fn shadow_mode_never_predicts_but_measures_precision() {
        let p = WritePredictor::new(4, false);
        p.on_tracked_write(0);
        p.on_tracked_write(3);
        // Page 0 is written in its would-be-predicted residency, page 3 is not.
        assert!(!p.install_writable(0));
        p.on_tracked_write(0);
        assert!(!p.install_writable(3));
        let s = p.stats();
        assert!(!s.enabled);
        assert_eq!((s.predicted, s.shadow_confirmed), (2, 1));
        assert_eq!(s.shadow_precision, Some(0.5));
        // Page 3 stays predicted (in shadow) for its remaining residencies, then stops.
        for _ in 1..PREDICTED_RESIDENCIES {
            assert!(!p.install_writable(3));
        }
        assert_eq!(p.stats().predicted, 1 + u64::from(PREDICTED_RESIDENCIES));
        assert!(!p.install_writable(3));
        assert_eq!(p.stats().predicted, 1 + u64::from(PREDICTED_RESIDENCIES));
    }
}
