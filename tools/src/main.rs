//! `ninefold`: the host-side command-line tool.
//!
//! Each subcommand lives in its own module; this file only parses the command line and
//! dispatches.
#![forbid(unsafe_code)]

mod crash_trace;
mod ctl;
mod dump;
mod fsck;
mod image;
mod mkfs;
mod quota;
mod receive;
mod remote;
mod replay_trace;
mod send;
mod serve;
mod snapshot;
mod status;
mod top;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Host tools for the ninefold storage appliance: make, check and inspect images, serve
/// one over 9P, and administer an image or (with --connect) a running appliance.
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
    /// Make a filesystem on an image file.
    Mkfs(mkfs::MkfsArgs),
    /// Check an image (exit 0 clean, 4 errors, 8 operational error).
    Fsck(fsck::FsckArgs),
    /// Print the superblock, a tree, or an inode's items.
    Dump(dump::DumpArgs),
    /// Run an administration command on an image or a running appliance (--connect).
    Ctl(ctl::CtlArgs),
    /// Verify every checksum of an image or a running appliance (exit 0 clean, 4 errors,
    /// 8 operational error).
    Scrub(ctl::ScrubArgs),
    /// Show the state of an image or a running appliance (--connect) and its quotas.
    Status(status::StatusArgs),
    /// A live view of a running appliance from its counters port, refreshed each second.
    Top(top::TopArgs),
    /// Serve a filesystem over 9P2000.L on TCP.
    Serve(Box<serve::ServeArgs>),
    /// Enumerate, mount, fsck and check the crash states of recorded block traces.
    CrashTrace(crash_trace::CrashTraceArgs),
    /// Write the disk a recorded block trace leaves at a power cut (or at any entry).
    ReplayTrace(replay_trace::ReplayTraceArgs),
    /// Create, list or delete snapshots of an image or a running appliance (--connect).
    Snapshot(snapshot::SnapshotArgs),
    /// List project quotas, show the one of a path, or set a directory's limits (an
    /// image; --connect: list those of a running appliance).
    Quota(quota::QuotaArgs),
    /// Write a snapshot of an image or a running appliance (--connect) as a stream, in
    /// full or as the changes since an older one.
    Send(send::SendArgs),
    /// Apply a snapshot stream to an image or a running appliance (--connect): the result
    /// is a snapshot, whole or not at all.
    Receive(receive::ReceiveArgs),
}

/// Prints an error from subcommand `name` and fails.
fn report<E: std::fmt::Display>(name: &str, r: Result<(), E>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ninefold {name}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("ninefold {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Mkfs(args) => report("mkfs", mkfs::run(args)),
        Command::Fsck(args) => fsck::run(args),
        Command::Dump(args) => report("dump", dump::run(args)),
        Command::Ctl(args) => report("ctl", ctl::run(args)),
        Command::Scrub(args) => ctl::scrub(args),
        Command::Status(args) => report("status", status::run(args)),
        Command::Top(args) => report("top", top::run(args)),
        Command::Serve(args) => report("serve", serve::run(*args)),
        Command::CrashTrace(args) => crash_trace::run(args),
        Command::ReplayTrace(args) => report("replay-trace", replay_trace::run(args)),
        Command::Snapshot(args) => report("snapshot", snapshot::run(args)),
        Command::Quota(args) => report("quota", quota::run(args)),
        Command::Send(args) => report("send", send::run(args)),
        Command::Receive(args) => report("receive", receive::run(args)),
    }
}
