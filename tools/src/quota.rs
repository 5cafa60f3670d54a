//! `ninefold quota IMAGE [PATH [--bytes SIZE] [--inodes N]]`: project quotas of an image
//! on the host (the image must not be in use). Without `PATH`, lists every quota root;
//! with it, shows the quota `PATH` is charged to, or with a limit makes `PATH` (a
//! directory) a quota root with those limits or changes them. With `--connect ADDR`
//! instead of the image, the same on a running appliance (its `quota list`, `quota show`
//! and `quota set` commands).

use std::path::PathBuf;

use clap::Args;
use ninefs::volume::{MountOptions, NineFs};
use vfs::{lookup_path, parse_limit, FileSystem, LimitChange};

use crate::image;
use crate::remote::Remote;
use crate::serve::SystemClock;

/// Arguments of `ninefold quota`.
#[derive(Debug, Args)]
pub struct QuotaArgs {
    /// The running appliance at ADDR[:PORT] instead of an image (then the first
    /// argument is the path).
    #[arg(long, value_name = "ADDR[:PORT]")]
    pub connect: Option<String>,
    /// The image file.
    #[arg(required_unless_present = "connect")]
    pub image: Option<PathBuf>,
    /// A directory of the filesystem (`/` is its root; `a/b` and `/a/b` are the same).
    pub path: Option<String>,
    /// Most bytes of file data under `PATH` (`1G`, `512M`, ...; `none`: no limit).
    #[arg(long)]
    pub bytes: Option<String>,
    /// Most inodes under `PATH` (`none`: no limit).
    #[arg(long)]
    pub inodes: Option<String>,
}

pub use ninefs::features::quota::{describe, describe_info};

/// The limit change the command line asks for (empty: none).
fn change(args: &QuotaArgs) -> Result<LimitChange, String> {
    Ok(LimitChange {
        bytes: args
            .bytes
            .as_deref()
            .map(|s| parse_limit(s, true))
            .transpose()?,
        inodes: args
            .inodes
            .as_deref()
            .map(|s| parse_limit(s, false))
            .transpose()?,
    })
}

/// Runs `quota` against the running appliance at `addr`: `path` is the first argument.
fn run_remote(addr: &str, path: Option<&str>, change: LimitChange) -> Result<(), String> {
    let line = match path {
        None if change.is_empty() => "quota list".to_string(),
        None => return Err("--bytes and --inodes need a PATH".into()),
        Some(path) if path.split_whitespace().count() != 1 => {
            return Err(format!(
                "{path:?}: a path with white space cannot be named in a command"
            ))
        }
        Some(path) if change.is_empty() => format!("quota show {path}"),
        Some(path) => {
            let word = |name: &str, l: Option<Option<u64>>| {
                l.map(|l| {
                    format!(
                        " {name}={}",
                        l.map_or("none".to_string(), |v| v.to_string())
                    )
                })
                .unwrap_or_default()
            };
            format!(
                "quota set {path}{}{}",
                word("bytes", change.bytes),
                word("inodes", change.inodes)
            )
        }
    };
    println!("{}", Remote::connect(addr)?.command(&line)?);
    Ok(())
}

/// Runs `quota`.
pub fn run(args: QuotaArgs) -> Result<(), String> {
    let change = change(&args)?;
    let image = match (&args.image, &args.connect) {
        (_, Some(addr)) => {
            // The path comes first when there is no image.
            let path = match (&args.image, &args.path) {
                (Some(_), Some(_)) => return Err("--connect takes a PATH, not an image".into()),
                (Some(p), None) => Some(p.to_string_lossy().into_owned()),
                (None, p) => p.clone(),
            };
            return run_remote(addr, path.as_deref(), change);
        }
        (Some(image), None) => image.clone(),
        (None, None) => return Err("expected IMAGE or --connect ADDR[:PORT]".into()),
    };
    let set = !change.is_empty();
    if set && args.path.is_none() {
        return Err("--bytes and --inodes need a PATH".into());
    }
    let disk = image::open_volume(std::slice::from_ref(&image), set)?;
    let opts = MountOptions {
        read_only: !set,
        ..MountOptions::default()
    };
    pollster::block_on(async {
        let fs = NineFs::mount(&disk, opts, Box::new(SystemClock))
            .await
            .map_err(|e| e.to_string())?;
        let done = async {
            let Some(path) = &args.path else {
                for (root, q) in fs.quotas().await.map_err(|e| e.to_string())? {
                    println!("{}", describe(root, &q));
                }
                return Ok(());
            };
            let ino = lookup_path(&fs, path)
                .await
                .map_err(|e| format!("{path}: {e}"))?;
            if set {
                // A limit not given keeps its value on a quota root that exists.
                let old = fs.quota(ino).await.map_err(|e| e.to_string())?;
                let old = old.filter(|q| q.root == ino).map(|q| q.limits);
                fs.set_quota(ino, change.applied_to(old))
                    .await
                    .map_err(|e| format!("{path}: {e}"))?;
            }
            match fs.quota(ino).await.map_err(|e| e.to_string())? {
                Some(q) => println!("{path}: {}", describe_info(&q)),
                None => println!("{path}: no quota"),
            }
            Ok::<(), String>(())
        }
        .await;
        let unmounted = fs.unmount().await.map(|_| ()).map_err(|e| e.to_string());
        done.and(unmounted)
    })
}
