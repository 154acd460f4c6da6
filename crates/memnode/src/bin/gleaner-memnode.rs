//! `gleaner-memnode`: the memory node as a standalone binary, identical to `gleaner memnode`.
//!
//! It exists so that the memnode's process-level tests (and minimal deployments) do not need the
//! whole `gleaner` binary.
#![deny(missing_docs)]

use std::process::ExitCode;

use clap::{Args, Command, FromArgMatches};
use gleaner_memnode::cli::MemnodeCommand;

fn main() -> ExitCode {
    gleaner_sys::panic::abort_on_panic();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_target(false)
        .init();
    let command = MemnodeCommand::augment_args(
        Command::new("gleaner-memnode")
            .version(env!("CARGO_PKG_VERSION"))
            .about("gleaner memory node: run one, or query one with `stats`"),
    );
    let parsed =
        MemnodeCommand::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit());
    gleaner_memnode::cli::main(parsed)
}
