//! The fault's way: a handler thread reads a fault message ([`handler`]), the page-state machine
//! resolves it ([`resolve`] over [`state`]), a missing page is fetched from the store and
//! installed ([`fetch`]), with the prefetcher's pages ([`prefetch`]), pages predicted to be written
//! installed writable ([`predict`]), and a program's own hints fetched by the hint thread
//! ([`hint`], [`hint_thread`]). [`doorbell`] stops handlers blocked in `read`.

pub(crate) mod doorbell;
pub(crate) mod fetch;
pub(crate) mod handler;
pub(crate) mod hint;
pub(crate) mod hint_thread;
pub(crate) mod predict;
pub(crate) mod prefetch;
pub(crate) mod resolve;
pub(crate) mod state;
