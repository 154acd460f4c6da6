//! `gleaner bench`: micro-benchmarks (filled in by the pager work).

use std::process::ExitCode;

/// Benchmark subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {}

/// Runs a benchmark subcommand.
pub fn main(cmd: BenchCommand) -> ExitCode {
    match cmd {}
}
