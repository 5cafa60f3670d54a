//! `ninefold`: the host-side command-line tool.
//!
//! Each subcommand lives in its own module; this file only parses the command line and
//! dispatches.

mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Host tools for the ninefold storage appliance.
#[derive(Debug, Parser)]
#[command(name = "ninefold", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the on-disk format version this build reads and writes.
    Version,
    /// Serve a filesystem over 9P2000.L on TCP.
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("ninefold {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Serve(args) => match serve::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ninefold serve: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
