//! `ninefold receive IMAGE [-i FILE] [--size SIZE]`: applies a snapshot stream to an
//! image (made with `--size` if it does not exist); the result is a snapshot, whole or
//! not at all (`docs/format.md`, "Snapshot streams"). `ninefold receive IMAGE
//! --rollback`: makes the live tree the last received snapshot again (after a receive
//! that stopped half way, or local changes), so the next incremental applies.

use std::fs::File;
use std::io::{Read, Seek};
use std::path::PathBuf;

use clap::Args;
use ninefs::features::streams::receive::StreamSource;
use ninefs::volume::{MountOptions, NineFs};
use vfs::Errno;

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
    // The stream is read twice (checked whole, then applied): standard input is kept
    // in a temporary file meanwhile, unlinked at once.
    let mut file = match &args.input {
        Some(path) => File::open(path).map_err(|e| format!("{}: {e}", path.display()))?,
        None => spool_stdin().map_err(|e| format!("reading the stream: {e}"))?,
    };
    if !args.image.exists() {
        if args.size.is_none() {
            return Err(format!(
                "{} does not exist: give --size",
                args.image.display()
            ));
        }
        mkfs::run(MkfsArgs {
            images: vec![args.image.clone()],
            size: args.size.clone(),
            label: String::new(),
            node_size: ninefs::format::DEFAULT_NODE_SIZE.to_string(),
        })?;
    }
    on_image(&args, Some(&mut FileSource(&mut file)))
}

/// Standard input copied into an anonymous temporary file.
fn spool_stdin() -> std::io::Result<File> {
    let path = std::env::temp_dir().join(format!("ninefold-receive-{}", std::process::id()));
    let mut file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    std::io::copy(&mut std::io::stdin().lock(), &mut file)?;
    Ok(file)
}

/// A stream in a file.
struct FileSource<'a>(&'a mut File);

impl StreamSource for FileSource<'_> {
    async fn rewind(&mut self) -> Result<(), Errno> {
        self.0.rewind().map_err(|e| {
            log::error!("rewinding the stream: {e}");
            Errno::EIO
        })
    }

    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Errno> {
        self.0.read(buf).map_err(|e| {
            log::error!("reading the stream: {e}");
            Errno::EIO
        })
    }
}

/// Mounts the image, receives `stream` (or rolls back without one), unmounts cleanly.
fn on_image(args: &ReceiveArgs, stream: Option<&mut FileSource<'_>>) -> Result<(), String> {
    let disk = image::open(&args.image, true)?;
    pollster::block_on(async {
        let fs = NineFs::mount(&disk, MountOptions::default(), Box::new(SystemClock))
            .await
            .map_err(|e| e.to_string())?;
        let done = match stream {
            Some(stream) => fs.receive_from(stream).await.map(|info| {
                format!(
                    "received snapshot {} ({} inodes)",
                    info.name, info.inode_count
                )
            }),
            None => fs.receive_rollback().await.map(|name| match name {
                Some(name) => format!("live tree rolled back to snapshot {name}"),
                None => "nothing was received: the live tree emptied, as before the full \
                    receive that stopped half way"
                    .to_string(),
            }),
        };
        let unmounted = fs.unmount().await.map(|_| ());
        println!("{}", done.map_err(|e| e.to_string())?);
        unmounted.map_err(|e| e.to_string())
    })
}
