//! `ninefold snapshot create|list|delete IMAGE [NAME]`: snapshots of an image on the host
//! (the image must not be in use: it is mounted, changed and unmounted cleanly), or with
//! `--connect ADDR` instead of `IMAGE`, of a running appliance (its `ctl` commands).

use std::path::Path;

use clap::{Args, Subcommand};
use ninefs::volume::{MountOptions, NineFs};

use crate::image;
use crate::remote::{self, Remote, Target};
use crate::serve::SystemClock;

/// Arguments of `ninefold snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// Act on the running appliance at ADDR[:PORT] instead of an image.
    #[arg(long, global = true, value_name = "ADDR[:PORT]")]
    pub connect: Option<String>,
    #[command(subcommand)]
    pub action: Action,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Action {
    /// Take a snapshot of the filesystem as it is now.
    Create {
        /// The image file (not with --connect), then the snapshot's name: 1-64 of
        /// A-Z a-z 0-9 - _ . (not starting with `.`).
        #[arg(required = true, num_args = 1..=2, value_name = "[IMAGE] NAME")]
        operands: Vec<String>,
    },
    /// List the snapshots: id, name, checkpoint, creation time (Unix seconds), inodes.
    List {
        /// The image file (not with --connect).
        #[arg(num_args = 0..=1, value_name = "IMAGE")]
        operands: Vec<String>,
    },
    /// Delete a snapshot, freeing the space only it held.
    Delete {
        /// The image file (not with --connect), then the snapshot's name.
        #[arg(required = true, num_args = 1..=2, value_name = "[IMAGE] NAME")]
        operands: Vec<String>,
    },
}

/// Runs `snapshot`.
pub fn run(args: SnapshotArgs) -> Result<(), String> {
    let (verb, operands, usage) = match args.action {
        Action::Create { operands } => ("create", operands, "IMAGE NAME"),
        Action::List { operands } => ("list", operands, "IMAGE"),
        Action::Delete { operands } => ("delete", operands, "IMAGE NAME"),
    };
    let (target, rest) = remote::target(args.connect.as_deref(), operands, usage)?;
    let name = match (verb, rest.as_slice()) {
        ("list", []) => None,
        ("create" | "delete", [name]) => Some(name.as_str()),
        _ => return Err(format!("expected {usage}")),
    };
    match target {
        Target::Image(path) => on_image(&path, verb, name),
        Target::Appliance(addr) => {
            let line = match name {
                Some(name) => format!("snapshot {verb} {name}"),
                None => format!("snapshot {verb}"),
            };
            println!("{}", Remote::connect(&addr)?.command(&line)?);
            Ok(())
        }
    }
}

/// `snapshot VERB [NAME]` on the image at `path`.
fn on_image(path: &Path, verb: &str, name: Option<&str>) -> Result<(), String> {
    let writable = verb != "list";
    let disk = image::open_volume(&[path.to_path_buf()], writable)?;
    let opts = MountOptions {
        read_only: !writable,
        ..MountOptions::default()
    };
    pollster::block_on(async {
        let fs = NineFs::mount(&disk, opts, Box::new(SystemClock))
            .await
            .map_err(|e| e.to_string())?;
        let done = match (verb, name) {
            ("create", Some(name)) => fs.snapshot_create(name).await.map(|s| {
                println!(
                    "created snapshot {} {:?} (checkpoint {})",
                    s.id, s.name, s.seq
                );
            }),
            ("delete", Some(name)) => fs.snapshot_delete(name).await,
            _ => fs.snapshots().await.map(|list| {
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
