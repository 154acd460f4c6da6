//! Small safe wrappers for the system calls several gleaner crates make, each in one place:
//! CPU affinity ([`affinity`]), anonymous mappings ([`anon`]), eventfds ([`eventfd`]); the string
//! arguments of the C APIs ([`ffi`]); and the one pseudo-random generator that tests and
//! benchmarks use ([`rng`]). The crate sits at the bottom
//! of the workspace: it depends on `libc` only.

pub mod affinity;
pub mod anon;
pub mod eventfd;
pub mod ffi;
pub mod rng;
