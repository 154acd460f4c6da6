//! Small safe wrappers for the system calls several gleaner crates make, each in one place:
//! CPU affinity ([`affinity`]), a thread's CPU time ([`cputime`]), anonymous mappings
//! ([`anon`]), eventfds ([`eventfd`]); the string arguments of the C APIs ([`ffi`]); aborting on
//! a panic in what gleaner ships ([`panic`]); and for tests and benchmarks the one pseudo-random
//! generator ([`rng`]) and a scratch memory cgroup ([`cgroup`]). The crate sits at the bottom of
//! the workspace: it depends on `libc` only.

pub mod affinity;
pub mod anon;
pub mod cgroup;
pub mod cputime;
pub mod eventfd;
pub mod ffi;
pub mod panic;
pub mod rng;
