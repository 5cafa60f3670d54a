//! `ninefold receive IMAGE [-i FILE] [--size SIZE]`: applies a snapshot stream to an
//! image (made with `--size` if it does not exist); the result is a snapshot, whole or
//! not at all (`docs/format.md`, "Snapshot streams"). `ninefold receive IMAGE
//! --rollback`: makes the live tree the last received snapshot again (after a receive
//! that stopped half way, or local changes), so the next incremental applies.

use std::io::Read;
use std::path::PathBuf;

use clap::Args;
use ninefs::volume::{MountOptions, NineFs};

use crate::image;
use crate::mkfs::{self, MkfsArgs};
use crate::serve::SystemClock;

/// Arguments of `ninefold receive`.
#[derive(Debug, Args)]
pub struct ReceiveArgs {
    /// The image file (not in use: it is mounted, changed and unmounted cleanly).
    pub image: PathBuf,
    /// Read the stream from this file instead of standard input.
    #[arg(short, long)]
    pub input: Option<PathBuf>,
    /// Make the image with this size (e.g. `1G`) if it does not exist.
    #[arg(long)]
    pub size: Option<String>,
    /// Instead of receiving: roll the live tree back to the last received snapshot.
    #[arg(long, conflicts_with_all = ["input", "size"])]
    pub rollback: bool,
}

/// Runs `receive`.
pub fn run(args: ReceiveArgs) -> Result<(), String> {
    if args.rollback {
        return on_image(&args, None);
    }
    // The stream is read whole first: it is checked before anything is applied.
    let mut stream = Vec::new();
    match &args.input {
        Some(path) => std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut stream)),
        None => std::io::stdin().lock().read_to_end(&mut stream),
    }
    .map_err(|e| format!("reading the stream: {e}"))?;
    if !args.image.exists() {
        if args.size.is_none() {
            return Err(format!(
                "{} does not exist: give --size",
                args.image.display()
            ));
        }
        mkfs::run(MkfsArgs {
            image: args.image.clone(),
            size: args.size.clone(),
            label: String::new(),
            node_size: ninefs::format::DEFAULT_NODE_SIZE.to_string(),
        })?;
    }
    on_image(&args, Some(&stream))
}

/// Mounts the image, receives `stream` (or rolls back without one), unmounts cleanly.
fn on_image(args: &ReceiveArgs, stream: Option<&[u8]>) -> Result<(), String> {
    let disk = image::open(&args.image, true)?;
    pollster::block_on(async {
        let fs = NineFs::mount(&disk, MountOptions::default(), Box::new(SystemClock))
            .await
            .map_err(|e| e.to_string())?;
        let done = match stream {
            Some(stream) => fs.receive(stream).await.map(|info| {
                format!(
                    "received snapshot {} ({} inodes)",
                    info.name, info.inode_count
                )
            }),
            None => fs
                .receive_rollback()
                .await
                .map(|name| format!("live tree rolled back to snapshot {name}")),
        };
        let unmounted = fs.unmount().await.map(|_| ());
        println!("{}", done.map_err(|e| e.to_string())?);
        unmounted.map_err(|e| e.to_string())
    })
}
