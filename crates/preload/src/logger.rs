//! Warnings and errors of the pager, printed to the program's standard error.
//!
//! A minimal `log` backend: the program under `LD_PRELOAD` has no logger of gleaner's, and the
//! pager's warnings (a fault outside the region, a refused write) must not vanish. The level is
//! `GLEANER_LOG` (`error`, `warn`, `info`, `debug`, `trace`; default `warn`).

use log::{LevelFilter, Log, Metadata, Record};

struct StderrLogger;

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if self.enabled(record.metadata()) {
            eprintln!(
                "gleaner[{}]: {}: {}",
                std::process::id(),
                record.level(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

static LOGGER: StderrLogger = StderrLogger;

/// Installs the logger (once; later calls are ignored).
pub(crate) fn install() {
    let level = match std::env::var("GLEANER_LOG").ok().as_deref() {
        Some("error") => LevelFilter::Error,
        Some("info") => LevelFilter::Info,
        Some("debug") => LevelFilter::Debug,
        Some("trace") => LevelFilter::Trace,
        Some("off") => LevelFilter::Off,
        _ => LevelFilter::Warn,
    };
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
}
