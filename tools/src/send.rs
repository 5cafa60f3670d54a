//! `ninefold send IMAGE NAME [--from BASE] [-o FILE]`: a snapshot of an image as a stream
//! (`docs/format.md`, "Snapshot streams"), in full or as the changes since `BASE`.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use ninefs::volume::{MountOptions, NineFs};
use vfs::Errno;

use crate::image;
use crate::serve::SystemClock;

/// Arguments of `ninefold send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// The image file (not in use: it is mounted read-only).
    pub image: PathBuf,
    /// The snapshot to send.
    pub name: String,
    /// Send only the changes since this older snapshot (the receiver must hold it).
    #[arg(long)]
    pub from: Option<String>,
    /// Write the stream to this file instead of standard output.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// Runs `send`.
pub fn run(args: SendArgs) -> Result<(), String> {
    let disk = image::open(&args.image, false)?;
    let mut out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let opts = MountOptions {
        read_only: true,
        ..MountOptions::default()
    };
    let mut failed_write = None;
    let sent = pollster::block_on(async {
        let fs = NineFs::mount(&disk, opts, Box::new(SystemClock))
            .await
            .map_err(|e| e.to_string())?;
        let mut sink = |b: &[u8]| {
            out.write_all(b).map_err(|e| {
                failed_write = Some(e.to_string());
                Errno::EIO
            })
        };
        let sent = fs.send(&args.name, args.from.as_deref(), &mut sink).await;
        let unmounted = fs.unmount().await.map(|_| ());
        sent.and_then(|s| unmounted.map(|()| s))
            .map_err(|e| failed_write.clone().unwrap_or_else(|| e.to_string()))
    });
    let flushed = out.flush().map_err(|e| e.to_string());
    match sent.and_then(|s| flushed.map(|()| s)) {
        Ok(s) => {
            eprintln!(
                "sent {} ({}): {} inodes, {} bytes, {} btree nodes read",
                args.name,
                args.from
                    .as_deref()
                    .map_or("full".to_string(), |b| format!("from {b}")),
                s.inodes,
                s.bytes,
                s.nodes_read
            );
            Ok(())
        }
        Err(e) => {
            // A partial stream would be refused anyway; leave none behind.
            if let Some(path) = &args.output {
                let _ = std::fs::remove_file(path);
            }
            Err(e)
        }
    }
}
