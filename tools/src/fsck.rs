//! `ninefold fsck`: check an image (read-only; nothing is repaired). Exit codes follow
//! e2fsck: 0 clean, 4 errors left uncorrected, 8 operational error.

use std::path::PathBuf;
use std::process::ExitCode;

use block::BlockDevice;
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

/// Runs `fsck`. A mirrored volume is checked leg by leg (each leg in service is a
/// whole filesystem; a bad copy on one is an error there, which scrub mends).
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
    let checked = if disk.copies() < 2 {
        check(&args.images[0].display().to_string(), &disk, &opts)
    } else {
        check_legs(&disk, &opts)
    };
    match checked {
        Ok(clean) => ExitCode::from(if clean { CLEAN } else { ERRORS }),
        Err(e) => {
            eprintln!("ninefold fsck: {}: {e}", args.images[0].display());
            ExitCode::from(OPERATIONAL)
        }
    }
}

/// Checks every leg in service of a mirrored volume alone (the volume's superblocks
/// say which are: stale ones are left out); whether all are clean.
fn check_legs(disk: &image::Volume, opts: &FsckOptions) -> Result<bool, String> {
    let dev = ninefs::io::Dev::new(disk).map_err(|e| format!("{e:?}"))?;
    pollster::block_on(ninefs::volume::read_superblock(&dev)).map_err(|e| e.to_string())?;
    print!("{}", image::describe_legs(disk));
    let mut clean = true;
    for i in 0..disk.copies() {
        match disk.leg(i) {
            Some(leg) if disk.failed_copies() & 1 << i == 0 => {
                clean &= check(&format!("leg {i}"), &*leg, opts)?;
            }
            _ => println!("leg {i}: out of service, not checked"),
        }
    }
    Ok(clean)
}

/// Checks one device and prints the report under `name`; whether it is clean.
fn check<D: BlockDevice>(name: &str, disk: &D, opts: &FsckOptions) -> Result<bool, String> {
    let report = pollster::block_on(fsck(disk, opts)).map_err(|e| e.to_string())?;
    for w in &report.warnings {
        println!("warning: {w}");
    }
    for e in &report.errors {
        println!("error: {e}");
    }
    for (root, q) in &report.quotas {
        println!("quota {}", crate::quota::describe(*root, q));
    }
    let s = report.stats;
    println!(
        "{name}: {} inodes ({} directories), {} data extents ({} blocks), {} nodes, {} items, {} snapshots ({} blocks only they hold), {} blocks free: {}",
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
    Ok(report.is_clean())
}
