//! `gleaner`: far memory for unmodified programs.
//!
//! Subcommands: `memnode` (the memory node daemon and its stats), `bench` (micro-benchmarks with
//! their same-run floors), `trace` (offline replay of fault traces under every policy). `run` (unmodified programs under LD_PRELOAD) comes with the preload crate.
#![deny(missing_docs)]

mod bench;

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
    /// Run a memory node (pages for far-memory clients), or query one with `memnode stats`.
    Memnode(gleaner_memnode::cli::MemnodeCommand),
    /// Benchmarks that report numbers beside their same-run floors.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Fault traces: replay one offline under every prefetcher and eviction policy (with exact
    /// LRU and Belady's optimum as references), or synthesise one.
    Trace(gleaner_policy::cli::TraceCommand),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_target(false)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Memnode(cmd) => gleaner_memnode::cli::main(cmd),
        Command::Bench(cmd) => bench::main(cmd),
        Command::Trace(cmd) => gleaner_policy::cli::main(cmd),
    }
}
