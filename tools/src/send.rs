//! `ninefold send IMAGE NAME [--from BASE] [-o FILE]`: a snapshot of an image as a stream
//! (`docs/format.md`, "Snapshot streams"), in full or as the changes since `BASE`; with
//! `--connect ADDR` instead of `IMAGE`, a snapshot of a running appliance (its send job,
//! read through the `ctl` export's `send` file).

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use ninefs::volume::{MountOptions, NineFs};
use vfs::Errno;

use crate::image;
use crate::remote::{self, File, Remote, Target};
use crate::serve::SystemClock;

/// Arguments of `ninefold send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// Send from the running appliance at ADDR[:PORT] instead of an image.
    #[arg(long, value_name = "ADDR[:PORT]")]
    pub connect: Option<String>,
    /// The image file (not in use: it is mounted read-only; not with --connect), then
    /// the snapshot to send.
    #[arg(required = true, num_args = 1..=2, value_name = "[IMAGE] NAME")]
    pub operands: Vec<String>,
    /// Send only the changes since this older snapshot (the receiver must hold it).
    #[arg(long)]
    pub from: Option<String>,
    /// Write the stream to this file instead of standard output.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// Runs `send`.
pub fn run(args: SendArgs) -> Result<(), String> {
    let (target, rest) =
        remote::target(args.connect.as_deref(), args.operands.clone(), "IMAGE NAME")?;
    let [name] = rest.as_slice() else {
        return Err("expected one snapshot NAME".into());
    };
    let mut out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let sent = match target {
        Target::Image(image) => on_image(&image, name, args.from.as_deref(), &mut out),
        Target::Appliance(addr) => on_appliance(&addr, name, args.from.as_deref(), &mut out),
    };
    let flushed = out.flush().map_err(|e| e.to_string());
    match sent.and_then(|s| flushed.map(|()| s)) {
        Ok(summary) => {
            eprintln!(
                "sent {name} ({}): {summary}",
                args.from
                    .as_deref()
                    .map_or("full".to_string(), |b| format!("from {b}")),
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

/// Sends snapshot `name` of the appliance at `addr` into `out`, with progress on
/// standard error; returns what to say of it.
fn on_appliance(
    addr: &str,
    name: &str,
    from: Option<&str>,
    out: &mut dyn Write,
) -> Result<String, String> {
    let mut remote = Remote::connect(addr)?;
    let line = match from {
        Some(base) => format!("send start {name} from {base}"),
        None => format!("send start {name}"),
    };
    remote.command(&line)?;
    let mut progress = Progress::new("sent");
    let read = remote.read_stream(File::Send, &mut |chunk| {
        out.write_all(chunk)
            .map_err(|e| format!("writing the stream: {e}"))?;
        progress.add(chunk.len() as u64);
        Ok(())
    });
    progress.end();
    // The job's own account: why it failed, or that it ended whole.
    let status = match (remote.read_all(File::Status), &read) {
        (Ok(status), _) => String::from_utf8_lossy(&status).into_owned(),
        // Gone: what the stream's read found says it best.
        (Err(_), Err(e)) => return Err(e.clone()),
        (Err(e), Ok(_)) => return Err(e),
    };
    let result = remote::status_value(&status, "send_result").unwrap_or("");
    match (read, remote::status_value(&status, "send")) {
        (Ok(bytes), Some(s)) if s.starts_with("done") => Ok(format!("{bytes} bytes; {result}")),
        (Ok(_), state) | (Err(_), state @ Some(_)) if !result.is_empty() => Err(format!(
            "the send {}: {result}",
            state
                .and_then(|s| s.split_whitespace().next())
                .unwrap_or("ended")
        )),
        (Err(e), _) => Err(e),
        (Ok(_), state) => Err(format!("the send ended {}", state.unwrap_or("unseen"))),
    }
}

/// Bytes moved, said on standard error every few seconds while a stream runs.
pub struct Progress {
    what: &'static str,
    bytes: u64,
    start: std::time::Instant,
    said: std::time::Instant,
}

impl Progress {
    /// Progress of a stream being `what` (`sent`, `received`).
    pub fn new(what: &'static str) -> Progress {
        let now = std::time::Instant::now();
        Progress {
            what,
            bytes: 0,
            start: now,
            said: now,
        }
    }

    /// `n` more bytes.
    pub fn add(&mut self, n: u64) {
        self.bytes += n;
        if self.said.elapsed().as_secs() >= 5 {
            self.said = std::time::Instant::now();
            self.say();
        }
    }

    fn say(&self) {
        let secs = self.start.elapsed().as_secs_f64().max(0.001);
        eprintln!(
            "{} {} MiB ({:.1} MiB/s)",
            self.what,
            self.bytes >> 20,
            self.bytes as f64 / secs / (1 << 20) as f64
        );
    }

    /// The end: said once more if anything was said before.
    pub fn end(&self) {
        if self.said != self.start {
            self.say();
        }
    }
}

/// Sends snapshot `name` of the image at `path` into `out`; returns what to say of it.
fn on_image(
    path: &std::path::Path,
    name: &str,
    from: Option<&str>,
    out: &mut dyn Write,
) -> Result<String, String> {
    let disk = image::open(path, false)?;
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
        let sent = fs.send(name, from, &mut sink).await;
        let unmounted = fs.unmount().await.map(|_| ());
        sent.and_then(|s| unmounted.map(|()| s))
            .map_err(|e| failed_write.clone().unwrap_or_else(|| e.to_string()))
    });
    sent.map(|s| {
        format!(
            "{} inodes, {} bytes, {} btree nodes read",
            s.inodes, s.bytes, s.nodes_read
        )
    })
}
