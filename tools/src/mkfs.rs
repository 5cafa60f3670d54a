//! `ninefold mkfs`: make a filesystem on an image file.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use ninefs::format::DEFAULT_NODE_SIZE;
use ninefs::volume::{format, FormatOptions};
use vfs::Timespec;

use crate::image;

/// Arguments of `ninefold mkfs`.
#[derive(Debug, Args)]
pub struct MkfsArgs {
    /// The image file (created if it does not exist); several: the legs of a mirrored
    /// volume, each holding a copy of every block.
    #[arg(required = true, num_args = 1..)]
    pub images: Vec<PathBuf>,
    /// Size of the image, e.g. `1G` (required when creating it). On an image that holds
    /// a filesystem it grows both (never shrinks: a smaller size is refused).
    #[arg(long)]
    pub size: Option<String>,
    /// Filesystem label (at most 64 bytes).
    #[arg(long, default_value = "")]
    pub label: String,
    /// Btree node size in bytes or with a suffix (16K to 256K, a power of two).
    #[arg(long, default_value_t = DEFAULT_NODE_SIZE.to_string())]
    pub node_size: String,
}

fn random<const N: usize>() -> Result<[u8; N], String> {
    let mut buf = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    Ok(buf)
}

/// Runs `mkfs`.
pub fn run(args: MkfsArgs) -> Result<(), String> {
    let size = args.size.as_deref().map(image::parse_size).transpose()?;
    let first = &args.images[0];
    if let (true, Some(size)) = (first.exists(), size) {
        if crate::ctl::holds_filesystem(first)? {
            if args.images.len() > 1 {
                return Err("growing a mirrored volume is not supported yet".into());
            }
            return crate::ctl::grow_image(first, size);
        }
    }
    let node_size = image::parse_size(&args.node_size)?;
    let node_size = u32::try_from(node_size).map_err(|_| "node size too large".to_string())?;
    let mut disks = Vec::new();
    for path in &args.images {
        make_image(path, size)?;
        disks.push(image::open(path, true)?);
    }
    let legs =
        block::MirrorDisk::new(disks.iter().map(Some).collect()).map_err(|e| e.to_string())?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let opts = FormatOptions {
        label: args.label.clone().into_bytes(),
        node_size,
        uuid: random()?,
        secret: u64::from_le_bytes(random()?),
        now: Timespec {
            sec: now.as_secs() as i64,
            nsec: now.subsec_nanos(),
        },
        blocks: None,
    };
    pollster::block_on(format(&legs, &opts)).map_err(|e| e.to_string())?;
    if disks.len() > 1 {
        image::write_labels(&disks, opts.uuid)?;
    }
    let report =
        pollster::block_on(fsck::inspect::Image::open(&legs)).map_err(|e| e.to_string())?;
    let l = report.sb.layout;
    println!(
        "{}: {} MiB, {} blocks of 4 KiB, {} allocation groups, node size {} KiB, log {} KiB, {} blocks free",
        args.images
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" + "),
        (l.total_blocks * 4096) >> 20,
        l.total_blocks,
        l.groups,
        node_size / 1024,
        l.log_blocks * 4,
        report.sb.free_blocks
    );
    Ok(())
}

/// Creates `path` of `size` bytes (rounded down to 4 KiB), or sets an existing image's
/// size to it; without a size the image must exist.
fn make_image(path: &Path, size: Option<u64>) -> Result<(), String> {
    match (path.exists(), size) {
        (false, None) => Err(format!("{} does not exist: give --size", path.display())),
        (_, Some(size)) => std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .and_then(|file| file.set_len(size / 4096 * 4096))
            .map_err(|e| format!("{}: {e}", path.display())),
        (true, None) => Ok(()),
    }
}
