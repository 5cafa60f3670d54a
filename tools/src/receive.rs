//! `ninefold receive IMAGE [-i FILE] [--size SIZE]`: applies a snapshot stream to an
//! image (made with `--size` if it does not exist); the result is a snapshot, whole or
//! not at all (`docs/format.md`, "Snapshot streams"). `ninefold receive IMAGE
//! --rollback`: makes the live tree the last received snapshot again (after a receive
//! that stopped half way, or local changes), so the next incremental applies. With
//! `--connect ADDR` instead of `IMAGE`: into a running appliance (its receive job, the
//! stream written twice to the `ctl` export's `receive` file).

use std::fs::File;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

use clap::Args;
use ninefs::features::streams::receive::StreamSource;
use ninefs::volume::{MountOptions, NineFs};
use vfs::Errno;

use crate::image;
use crate::mkfs::{self, MkfsArgs};
use crate::remote::{self, Remote};
use crate::send::Progress;
use crate::serve::SystemClock;

/// Arguments of `ninefold receive`.
#[derive(Debug, Args)]
pub struct ReceiveArgs {
    /// Receive into the running appliance at ADDR[:PORT] instead of an image.
    #[arg(long, value_name = "ADDR[:PORT]", conflicts_with_all = ["image", "size"])]
    pub connect: Option<String>,
    /// The image file (not in use: it is mounted, changed and unmounted cleanly).
    #[arg(required_unless_present = "connect")]
    pub image: Option<PathBuf>,
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
    let image = match (&args.image, &args.connect) {
        (Some(image), _) => image.clone(),
        (None, Some(addr)) => return on_appliance(addr, &args),
        (None, None) => return Err("expected IMAGE or --connect ADDR[:PORT]".into()),
    };
    if args.rollback {
        return on_image(&image, None);
    }
    // The stream is read twice (checked whole, then applied): standard input is kept
    // in a temporary file meanwhile, unlinked at once.
    let mut file = match &args.input {
        Some(path) => File::open(path).map_err(|e| format!("{}: {e}", path.display()))?,
        None => spool_stdin().map_err(|e| format!("reading the stream: {e}"))?,
    };
    if !image.exists() {
        if args.size.is_none() {
            return Err(format!("{} does not exist: give --size", image.display()));
        }
        mkfs::run(MkfsArgs {
            images: vec![image.clone()],
            size: args.size.clone(),
            label: String::new(),
            node_size: ninefs::format::DEFAULT_NODE_SIZE.to_string(),
        })?;
    }
    on_image(&image, Some(&mut FileSource(&mut file)))
}

/// `receive --connect`: the stream (or a rollback) into the appliance at `addr`.
fn on_appliance(addr: &str, args: &ReceiveArgs) -> Result<(), String> {
    // Read before connecting: a stream that cannot be read costs the appliance nothing.
    let mut file = match (&args.input, args.rollback) {
        (_, true) => None,
        (Some(path), false) => {
            Some(File::open(path).map_err(|e| format!("{}: {e}", path.display()))?)
        }
        (None, false) => Some(spool_stdin().map_err(|e| format!("reading the stream: {e}"))?),
    };
    let mut remote = Remote::connect(addr)?;
    let Some(file) = &mut file else {
        println!("{}", remote.command("receive rollback")?);
        return Ok(());
    };
    remote.command("receive start")?;
    // Twice: the first pass is checked whole, the second applied.
    let mut progress = Progress::new("received");
    let mut passes = || -> Result<(), String> {
        for _ in 0..2 {
            file.rewind()
                .map_err(|e| format!("rewinding the stream: {e}"))?;
            let mut counted = Counted(&mut *file, &mut progress);
            remote.write_stream(remote::File::Receive, &mut counted)?;
        }
        Ok(())
    };
    let written = passes();
    progress.end();
    let status = remote::wait_while(
        &mut remote,
        "receive",
        &["checking", "applying", "waiting"],
        std::time::Duration::from_millis(200),
    )?;
    let result = remote::status_value(&status, "receive_result").unwrap_or("");
    match remote::status_value(&status, "receive") {
        Some(s) if s.starts_with("done") && written.is_ok() => {
            println!("{result}");
            Ok(())
        }
        // The appliance's reason first: a refused first pass ends the writes too.
        _ if !result.is_empty() => Err(result.to_string()),
        state => Err(written
            .err()
            .unwrap_or_else(|| format!("the receive ended {}", state.unwrap_or("unseen")))),
    }
}

/// A reader that tells `Progress` what passes through it.
struct Counted<'a>(&'a mut File, &'a mut Progress);

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.read(buf)?;
        self.1.add(n as u64);
        Ok(n)
    }
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
fn on_image(path: &Path, stream: Option<&mut FileSource<'_>>) -> Result<(), String> {
    let disk = image::open(path, true)?;
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
