//! `ninefold fsck`: check an image (read-only; nothing is repaired). Exit codes follow
//! e2fsck: 0 clean, 4 errors left uncorrected, 8 operational error.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use fsck::{fsck, FsckOptions};

use crate::image;

/// Arguments of `ninefold fsck`.
#[derive(Debug, Args)]
pub struct FsckArgs {
    /// The image file, or the legs of a mirrored volume (any order; legs may be missing).
    #[arg(required = true, num_args = 1..)]
    pub images: Vec<PathBuf>,
    /// Make no changes (the checker never changes anything; accepted for e2fsck habits).
    #[arg(short = 'n')]
    pub no_changes: bool,
    /// Skip reading and verifying every data block.
    #[arg(long)]
    pub no_data: bool,
}

/// Exit code: no errors.
pub const CLEAN: u8 = 0;
/// Exit code: errors found (and not corrected).
pub const ERRORS: u8 = 4;
/// Exit code: the check could not run.
pub const OPERATIONAL: u8 = 8;

/// Runs `fsck`.
pub fn run(args: FsckArgs) -> ExitCode {
    let disk = match image::open_volume(&args.images, false) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("ninefold fsck: {e}");
            return ExitCode::from(OPERATIONAL);
        }
    };
    let opts = FsckOptions {
        check_data: !args.no_data,
    };
    let report = match pollster::block_on(fsck(&disk, &opts)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ninefold fsck: {}: {e}", args.images[0].display());
            return ExitCode::from(OPERATIONAL);
        }
    };
    for w in &report.warnings {
        println!("warning: {w}");
    }
    for e in &report.errors {
        println!("error: {e}");
    }
    for (root, q) in &report.quotas {
        println!("quota {}", crate::quota::describe(*root, q));
    }
    print!("{}", image::describe_legs(&disk));
    let s = report.stats;
    println!(
        "{}: {} inodes ({} directories), {} data extents ({} blocks), {} nodes, {} items, {} snapshots ({} blocks only they hold), {} blocks free: {}",
        args.images[0].display(),
        s.inodes,
        s.dirs,
        s.extents,
        s.data_blocks,
        s.nodes,
        s.items,
        s.snapshots,
        s.snapshot_blocks,
        s.free_blocks,
        if report.is_clean() { "clean" } else { "ERRORS" }
    );
    ExitCode::from(if report.is_clean() { CLEAN } else { ERRORS })
}
