//! `ninefold ctl` and `ninefold scrub`: the administration commands of the appliance's
//! `ctl` file, run on an image on the host or, with `--connect`, on a running appliance
//! (`crate::remote`); and growing an image (`ninefold mkfs --size` on an existing one).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use ninefs::surface::control::Command;
use ninefs::volume::{MountOptions, NineFs};

use crate::fsck::{ERRORS, OPERATIONAL};
use crate::image;
use crate::remote::{self, Remote, Target};
use crate::serve::SystemClock;

/// Arguments of `ninefold ctl`.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// Run the command on the running appliance at ADDR[:PORT] (port 564 by default;
    /// this host must be in its admin_allow=) instead of on an image.
    #[arg(long, value_name = "ADDR[:PORT]")]
    pub connect: Option<String>,
    /// The image file (not with --connect), then the command, as written to the
    /// appliance's `ctl` file: `sync`, `scrub start` (or `scrub`: on an image the pass
    /// runs to its end), `scrub stop`, `grow`, `snapshot create NAME`, `snapshot delete
    /// NAME`, `snapshot list`, `quota list`, `receive rollback` (streams: `ninefold send`,
    /// `ninefold receive`), `replace LEG DEVICE` (a leg of a mirrored volume rebuilt onto
    /// DEVICE: on an image to its end, on an appliance in the background).
    #[arg(required = true, num_args = 1.., value_name = "[IMAGE] COMMAND")]
    pub words: Vec<String>,
}

/// Arguments of `ninefold scrub`.
#[derive(Debug, Args)]
pub struct ScrubArgs {
    /// Run a whole pass on the running appliance at ADDR[:PORT] and print its report.
    #[arg(long, value_name = "ADDR[:PORT]", conflicts_with = "images")]
    pub connect: Option<String>,
    /// The image file (opened read-only), or the legs of a mirrored volume (opened for
    /// writing, so that bad copies are mended; the filesystem is mounted read-only).
    #[arg(required_unless_present = "connect", num_args = 1..)]
    pub images: Vec<PathBuf>,
}

fn mount(paths: &[PathBuf], read_only: bool) -> Result<NineFs<image::Volume>, String> {
    mount_volume(paths, read_only, !read_only)
}

/// Mounts the volume of `paths`, its devices opened for writing if `writable`.
fn mount_volume(
    paths: &[PathBuf],
    read_only: bool,
    writable: bool,
) -> Result<NineFs<image::Volume>, String> {
    let disk = image::open_volume(paths, writable)?.with_opener(image::leg_opener(paths));
    let opts = MountOptions {
        read_only,
        ..MountOptions::default()
    };
    pollster::block_on(NineFs::mount(disk, opts, Box::new(SystemClock)))
        .map_err(|e| format!("{}: mount: {e}", paths[0].display()))
}

/// Runs `ctl`: on an image, mounts it, runs the command, unmounts cleanly; on an
/// appliance, writes the command to its `ctl` file and prints the reply.
pub fn run(args: CtlArgs) -> Result<(), String> {
    let (target, words) = remote::target(args.connect.as_deref(), args.words, "IMAGE COMMAND")?;
    let mut line = words.join(" ");
    if line.trim() == "scrub" {
        line = "scrub start".into();
    }
    // Parsed here too, so that a mistyped command is refused before anything connects.
    let cmd = Command::parse(&line).map_err(|e| e.to_string())?;
    let image = match target {
        Target::Image(image) => image,
        Target::Appliance(addr) => return on_appliance(&addr, &line, &cmd),
    };
    // The stream jobs need a client at the other end of the appliance's `send` or
    // `receive` file; on an image the tools do it in one go.
    match cmd {
        Command::SendStart(..) | Command::SendStop => {
            return Err("on an image, use ninefold send IMAGE NAME [--from BASE] -o FILE".into())
        }
        Command::ReceiveStart | Command::ReceiveStop => {
            return Err("on an image, use ninefold receive IMAGE -i FILE".into())
        }
        _ => {}
    }
    let fs = mount(std::slice::from_ref(&image), false)?;
    let result = pollster::block_on(async {
        let reply = fs.execute(&cmd).await?;
        println!("{reply}");
        if cmd == Command::ScrubStart {
            let report = fs.scrub_all_started().await.map_err(|e| e.to_string())?;
            print!("{report}");
        }
        if let Command::Replace { place, .. } = cmd {
            // Offline, the rebuild runs to its end before the image is let go.
            fs.rebuild_all()
                .await
                .map_err(|e| format!("rebuild: {e}"))?;
            println!("leg {place} rebuilt");
        }
        Ok::<(), String>(())
    });
    pollster::block_on(fs.unmount()).map_err(|e| format!("unmount: {e}"))?;
    result
}

/// `ctl --connect`: the command `line` on the appliance at `addr`.
fn on_appliance(addr: &str, line: &str, cmd: &Command) -> Result<(), String> {
    match cmd {
        Command::SendStart(..) | Command::SendStop => {
            return Err(format!(
                "a send needs a reader: ninefold send --connect {addr} NAME [--from BASE] > FILE"
            ))
        }
        Command::ReceiveStart | Command::ReceiveStop => {
            return Err(format!(
                "a receive needs a writer: ninefold receive --connect {addr} < FILE"
            ))
        }
        _ => {}
    }
    let reply = Remote::connect(addr)?.command(line)?;
    println!("{reply}");
    Ok(())
}

/// `scrub --connect`: starts a pass on the appliance at `addr`, waits for its end and
/// prints its report; exit 4 when it found errors.
fn scrub_appliance(addr: &str) -> Result<ExitCode, String> {
    let mut remote = Remote::connect(addr)?;
    remote.command("scrub start")?;
    let status = remote::wait_while(
        &mut remote,
        "scrub",
        &["running"],
        std::time::Duration::from_millis(500),
    )?;
    let report = remote.read_all(remote::File::Scrub)?;
    print!("{}", String::from_utf8_lossy(&report));
    let state = remote::status_value(&status, "scrub").unwrap_or("");
    let errors = state
        .split_whitespace()
        .skip_while(|w| *w != "errors")
        .nth(1)
        .and_then(|n| n.parse::<u64>().ok());
    match (state.split_whitespace().next(), errors) {
        (Some("complete"), Some(0)) => Ok(ExitCode::SUCCESS),
        (Some("complete"), Some(_)) => Ok(ExitCode::from(ERRORS)),
        _ => Err(format!("the pass did not complete: scrub {state}")),
    }
}

/// Runs `scrub`: a whole pass over a read-only mount; exit 4 when it finds errors.
pub fn scrub(args: ScrubArgs) -> ExitCode {
    if let Some(addr) = &args.connect {
        return scrub_appliance(addr).unwrap_or_else(|e| {
            eprintln!("ninefold scrub: {e}");
            ExitCode::from(OPERATIONAL)
        });
    }
    // A mirror's legs are opened for writing: scrub mends what it can.
    let mirrored = args.images.len() > 1;
    let result = mount_volume(&args.images, true, mirrored).and_then(|fs| {
        let report = pollster::block_on(fs.scrub_all()).map_err(|e| format!("scrub: {e}"))?;
        Ok((report, image::describe_legs(fs.device())))
    });
    match result {
        Ok((report, legs)) => {
            print!("{report}{legs}");
            if report.error_count > 0 {
                ExitCode::from(ERRORS)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("ninefold scrub: {e}");
            ExitCode::from(OPERATIONAL)
        }
    }
}

/// Whether `path` starts with a ninefold superblock.
pub fn holds_filesystem(path: &Path) -> Result<bool, String> {
    let disk = image::open(path, false)?;
    let dev = ninefs::io::Dev::new(disk).map_err(|e| format!("{e:?}"))?;
    Ok(pollster::block_on(ninefs::volume::read_superblock(&dev)).is_ok())
}

/// Grows the image at `path` to `size` bytes and its filesystem with it.
pub fn grow_image(path: &Path, size: u64) -> Result<(), String> {
    let size = size / 4096 * 4096;
    let len = std::fs::metadata(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    if size < len {
        return Err(format!(
            "{}: {size} bytes is smaller than the image ({len} bytes): filesystems never shrink",
            path.display()
        ));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(size))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // The mount grows the filesystem to the device.
    let fs = mount(&[path.to_path_buf()], false)?;
    let grown = fs.stats().grown_blocks;
    let total = fs.superblock().layout.total_blocks;
    pollster::block_on(fs.unmount()).map_err(|e| format!("unmount: {e}"))?;
    println!(
        "{}: {} MiB, {total} blocks of 4 KiB ({grown} blocks added)",
        path.display(),
        (total * 4096) >> 20
    );
    Ok(())
}
