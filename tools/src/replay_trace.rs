//! `ninefold replay-trace`: the disk a recorded block trace leaves behind, written out as
//! an image: the base image with the trace's entries applied up to the last completed
//! FLUSH and the FUA writes after it (what a power cut leaves when the device's volatile
//! cache is lost), or every entry up to a point.

use std::path::PathBuf;

use clap::Args;
use logwrites::replay::{apply, apply_durable};
use logwrites::Trace;
use ninefs::format::layout::SUPERBLOCK_BLOCKS;

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
    /// Apply every considered entry, not only the durable ones.
    #[arg(long)]
    pub all: bool,
    /// Blocks the filesystem only ever writes with FUA (see `ninefold crash-trace`).
    #[arg(long, value_delimiter = ',', default_values_t = SUPERBLOCK_BLOCKS)]
    pub fua_blocks: Vec<u64>,
}

/// Runs `replay-trace`.
pub fn run(args: ReplayTraceArgs) -> Result<(), String> {
    let trace = Trace::open(&args.trace)?;
    let mut image =
        std::fs::read(&args.base).map_err(|e| format!("{}: {e}", args.base.display()))?;
    let considered = trace.entries_within(args.log_bytes.unwrap_or(u64::MAX));
    let applied = if args.all {
        apply(&trace, &mut image, considered)?;
        considered
    } else {
        apply_durable(&trace, &mut image, considered, 4096, &args.fua_blocks)?
    };
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
