//! `ninefold replay-trace`: the disk a recorded block trace leaves behind, written out as
//! an image: the base image with the trace's entries applied up to the last completed
//! FLUSH (what a power cut leaves when the device's volatile cache is lost), or up to
//! any entry.

use std::path::PathBuf;

use clap::Args;
use logwrites::replay::apply;
use logwrites::Trace;

/// Arguments of `ninefold replay-trace`.
#[derive(Debug, Args)]
pub struct ReplayTraceArgs {
    /// The image when recording started.
    #[arg(long)]
    pub base: PathBuf,
    /// The dm-log-writes log.
    #[arg(long)]
    pub trace: PathBuf,
    /// Where to write the result.
    #[arg(long)]
    pub out: PathBuf,
    /// Consider only the entries complete within the first this many log bytes (the
    /// log's length at the moment of the power cut; default: the whole log).
    #[arg(long)]
    pub log_bytes: Option<u64>,
    /// Apply every considered entry, not only those up to the last FLUSH.
    #[arg(long)]
    pub all: bool,
}

/// Runs `replay-trace`.
pub fn run(args: ReplayTraceArgs) -> Result<(), String> {
    let trace = Trace::open(&args.trace)?;
    let mut image =
        std::fs::read(&args.base).map_err(|e| format!("{}: {e}", args.base.display()))?;
    let considered = trace.entries_within(args.log_bytes.unwrap_or(u64::MAX));
    let applied = if args.all {
        considered
    } else {
        trace.durable_prefix(considered)
    };
    apply(&trace, &mut image, applied)?;
    std::fs::write(&args.out, &image).map_err(|e| format!("{}: {e}", args.out.display()))?;
    println!(
        "{}: {} of {} entries applied ({}; {} considered)",
        args.out.display(),
        applied,
        trace.entries().len(),
        if args.all {
            "all considered"
        } else {
            "up to the last FLUSH"
        },
        considered
    );
    Ok(())
}
