//! `ninefold quota IMAGE [PATH [--bytes SIZE] [--inodes N]]`: project quotas of an image
//! on the host (the image must not be in use). Without `PATH`, lists every quota root;
//! with it, shows the quota `PATH` is charged to, or with a limit makes `PATH` (a
//! directory) a quota root with those limits or changes them. `ninefold quota --connect
//! ADDR` lists the quota roots of a running appliance (its `quota list` command; its
//! limits are the exports' `quota=` and `inodes=`).

use std::path::PathBuf;

use clap::Args;
use ninefs::format::items::QuotaItem;
use ninefs::volume::{MountOptions, NineFs};
use vfs::{FileSystem, Ino, QuotaLimits, ROOT_INO};

use crate::image;
use crate::remote::Remote;
use crate::serve::SystemClock;

/// Arguments of `ninefold quota`.
#[derive(Debug, Args)]
pub struct QuotaArgs {
    /// List the quota roots of the running appliance at ADDR[:PORT] instead of an image.
    #[arg(long, value_name = "ADDR[:PORT]", conflicts_with_all = ["image", "path"])]
    pub connect: Option<String>,
    /// The image file.
    #[arg(required_unless_present = "connect")]
    pub image: Option<PathBuf>,
    /// A directory of the filesystem (`/` is its root; `a/b` and `/a/b` are the same).
    pub path: Option<String>,
    /// Most bytes of file data under `PATH` (`1G`, `512M`, ...; `none`: no limit).
    #[arg(long, requires = "path")]
    pub bytes: Option<String>,
    /// Most inodes under `PATH` (`none`: no limit).
    #[arg(long, requires = "path")]
    pub inodes: Option<String>,
}

pub use ninefs::features::quota::describe;

/// A limit from the command line: a size (or count), or `none`.
fn parse_limit(s: &str, size: bool) -> Result<Option<u64>, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    if size {
        return image::parse_size(s).map(Some);
    }
    s.parse()
        .map(Some)
        .map_err(|_| format!("bad inode count {s:?}"))
}

/// The inode `path` names, from the root.
async fn resolve<F: FileSystem>(fs: &F, path: &str) -> Result<Ino, String> {
    let mut ino = ROOT_INO;
    for name in path.split('/').filter(|n| !n.is_empty()) {
        ino = fs
            .lookup(ino, name.as_bytes())
            .await
            .map_err(|e| format!("{path}: {name}: {e}"))?
            .ino;
    }
    Ok(ino)
}

/// Runs `quota`.
pub fn run(args: QuotaArgs) -> Result<(), String> {
    let image = match (&args.image, &args.connect) {
        (Some(image), _) => image.clone(),
        (None, Some(addr)) => {
            println!("{}", Remote::connect(addr)?.command("quota list")?);
            return Ok(());
        }
        (None, None) => return Err("expected IMAGE or --connect ADDR[:PORT]".into()),
    };
    let set = args.bytes.is_some() || args.inodes.is_some();
    let limits = QuotaLimits {
        bytes: args
            .bytes
            .as_deref()
            .map(|s| parse_limit(s, true))
            .transpose()?
            .flatten(),
        inodes: args
            .inodes
            .as_deref()
            .map(|s| parse_limit(s, false))
            .transpose()?
            .flatten(),
    };
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
            let ino = resolve(&fs, path).await?;
            if set {
                // A limit not given keeps its value on a quota root that exists.
                let old = fs.quota(ino).await.map_err(|e| e.to_string())?;
                let old = old.filter(|q| q.root == ino).map(|q| q.limits);
                let limits = QuotaLimits {
                    bytes: match &args.bytes {
                        Some(_) => limits.bytes,
                        None => old.and_then(|l| l.bytes),
                    },
                    inodes: match &args.inodes {
                        Some(_) => limits.inodes,
                        None => old.and_then(|l| l.inodes),
                    },
                };
                fs.set_quota(ino, limits)
                    .await
                    .map_err(|e| format!("{path}: {e}"))?;
            }
            match fs.quota(ino).await.map_err(|e| e.to_string())? {
                Some(q) => {
                    let item = QuotaItem {
                        byte_limit: q.limits.bytes,
                        inode_limit: q.limits.inodes,
                        bytes: q.bytes,
                        inodes: q.inodes,
                        flags: 0,
                        from: 0,
                    };
                    println!("{path}: {}", describe(q.root, &item));
                }
                None => println!("{path}: no quota"),
            }
            Ok::<(), String>(())
        }
        .await;
        let unmounted = fs.unmount().await.map(|_| ()).map_err(|e| e.to_string());
        done.and(unmounted)
    })
}
