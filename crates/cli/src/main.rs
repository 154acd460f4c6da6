//! `gleaner`: far memory for unmodified programs.
//!
//! Subcommands: `memnode` (the memory node daemon and its stats), `bench` (micro-benchmarks with
//! their same-run floors), `trace` (offline replay of fault traces under every policy), `run` (an
//! unmodified program with its heap on far memory, through the LD_PRELOAD library), `status`
//! (the programs running on far memory on this machine), `node` (the soft-memory coordinator).
#![deny(missing_docs)]

mod node;
mod prometheus;
mod run;
mod status;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// gleaner: keep a bounded working set in local RAM, the rest on memory nodes over TCP.
#[derive(Parser, Debug)]
#[command(name = "gleaner", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run an unmodified program with its heap on far memory.
    ///
    /// Runs CMD with libgleaner_preload.so, which puts its heap (malloc and friends, C++ new) and
    /// its private anonymous mappings in far memory: at most the local budget stays in RAM, the
    /// rest lives on a memnode. With no --memnode, a private memnode is started on a Unix socket
    /// and stopped at the end.
    ///
    /// Each process of the run (the program and any program it execs or spawns) gets its own
    /// budget. A fork child sees the parent's memory as it was at the fork, as plain memory.
    /// Static binaries and Go programs do not use the C library's allocator and so are not
    /// affected (see docs/compatibility.md).
    ///
    /// Exit status: the program's own; 128+N if it was killed by signal N; 127 if CMD was not
    /// found; 126 if it cannot be executed; 2 if gleaner could not set the run up; 86 if far
    /// memory failed during the run (e.g. the memnode died).
    Run(Box<run::RunArgs>),
    /// Run a memory node (pages for far-memory clients), or query one with `memnode stats`.
    Memnode(gleaner_memnode::cli::MemnodeCommand),
    /// Benchmarks that report numbers beside their same-run floors.
    #[command(subcommand)]
    Bench(gleaner_bench::BenchCommand),
    /// The programs running on far memory on this machine: budget, residency, fault rates,
    /// and their memnodes (for a pool: each memnode's state, extents and pages). Your own
    /// programs; run as root, every user's.
    Status(status::StatusArgs),
    /// The node coordinator: one daemon per machine that grants soft-memory pools idle memory
    /// by marginal utility and takes it back under pressure (`gleaner node status` shows it).
    ///
    /// Runs in the foreground. Soft pools (the gleaner-soft runtime, its C and Python APIs)
    /// register on its Unix socket and start one on demand when none answers.
    Node(node::NodeArgs),
    /// Fault traces: replay one offline under every prefetcher and eviction policy (with exact
    /// LRU and Belady's optimum as references), or synthesise one.
    Trace(gleaner_policy::cli::TraceCommand),
}

fn main() -> ExitCode {
    gleaner_sys::panic::abort_on_panic();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_target(false)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run::main(*args),
        Command::Memnode(cmd) => gleaner_memnode::cli::main(cmd),
        Command::Bench(cmd) => gleaner_bench::main(cmd),
        Command::Trace(cmd) => gleaner_policy::cli::main(cmd),
        Command::Status(args) => status::main(args),
        Command::Node(args) => node::main(args),
    }
}
