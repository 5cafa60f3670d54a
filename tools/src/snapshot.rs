//! `ninefold snapshot create|list|delete IMAGE [NAME]`: snapshots of an image on the host
//! (the image must not be in use: it is mounted, changed and unmounted cleanly).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use ninefs::volume::{MountOptions, NineFs};

use crate::image;
use crate::serve::SystemClock;

/// Arguments of `ninefold snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    pub action: Action,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Action {
    /// Take a snapshot of the filesystem as it is now.
    Create {
        /// The image file.
        image: PathBuf,
        /// The snapshot's name: 1-64 of A-Z a-z 0-9 - _ . (not starting with `.`).
        name: String,
    },
    /// List the snapshots: id, name, checkpoint, creation time (Unix seconds), inodes.
    List {
        /// The image file.
        image: PathBuf,
    },
    /// Delete a snapshot, freeing the space only it held.
    Delete {
        /// The image file.
        image: PathBuf,
        /// The snapshot's name.
        name: String,
    },
}

/// Runs `snapshot`.
pub fn run(args: SnapshotArgs) -> Result<(), String> {
    let (path, writable) = match &args.action {
        Action::Create { image, .. } | Action::Delete { image, .. } => (image, true),
        Action::List { image } => (image, false),
    };
    let disk = image::open_volume(std::slice::from_ref(path), writable)?;
    let opts = MountOptions {
        read_only: !writable,
        ..MountOptions::default()
    };
    pollster::block_on(async {
        let fs = NineFs::mount(&disk, opts, Box::new(SystemClock))
            .await
            .map_err(|e| e.to_string())?;
        let done = match &args.action {
            Action::Create { name, .. } => fs.snapshot_create(name).await.map(|s| {
                println!(
                    "created snapshot {} {:?} (checkpoint {})",
                    s.id, s.name, s.seq
                );
            }),
            Action::Delete { name, .. } => fs.snapshot_delete(name).await,
            Action::List { .. } => fs.snapshots().await.map(|list| {
                for s in list {
                    println!(
                        "{}\t{}\tcheckpoint {}\tcreated {}\tinodes {}",
                        s.id, s.name, s.seq, s.created.sec, s.inode_count
                    );
                }
            }),
        };
        let unmounted = fs.unmount().await.map(|_| ());
        done.and(unmounted).map_err(|e| e.to_string())
    })
}
