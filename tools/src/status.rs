//! `ninefold status IMAGE` or `ninefold status --connect ADDR`: the state of a filesystem
//! (health, space, log, checkpoint, mirror legs and rebuild, scrub, stream jobs) and its
//! quota roots, as the appliance's `status` file and `quota list` command give them.

use std::path::PathBuf;

use clap::Args;
use ninefs::surface::control::Command;
use ninefs::volume::{MountOptions, NineFs};

use crate::image;
use crate::remote::{Remote, Target};
use crate::serve::SystemClock;

/// Arguments of `ninefold status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The running appliance at ADDR[:PORT] instead of an image.
    #[arg(long, value_name = "ADDR[:PORT]", conflicts_with = "image")]
    pub connect: Option<String>,
    /// The image file (mounted read-only), or the legs of a mirrored volume.
    #[arg(required_unless_present = "connect", num_args = 1..)]
    pub image: Vec<PathBuf>,
}

/// Runs `status`.
pub fn run(args: StatusArgs) -> Result<(), String> {
    let (target, status, quotas) = match &args.connect {
        Some(addr) => {
            let mut remote = Remote::connect(addr)?;
            let status = remote.read_all(crate::remote::File::Status)?;
            let quotas = remote.command("quota list")?;
            (
                Target::Appliance(addr.clone()),
                String::from_utf8_lossy(&status).into_owned(),
                quotas,
            )
        }
        None => {
            let disk = image::open_volume(&args.image, false)?;
            let opts = MountOptions {
                read_only: true,
                ..MountOptions::default()
            };
            let (status, quotas) = pollster::block_on(async {
                let fs = NineFs::mount(&disk, opts, Box::new(SystemClock))
                    .await
                    .map_err(|e| e.to_string())?;
                let status = fs.status_text();
                let quotas = fs.execute(&Command::QuotaList).await;
                let unmounted = fs.unmount().await.map(|_| ());
                unmounted.map_err(|e| e.to_string())?;
                Ok::<_, String>((status, quotas?))
            })?;
            (Target::Image(args.image[0].clone()), status, quotas)
        }
    };
    print!("{}", describe(&target, &status, &quotas));
    Ok(())
}

/// The report: where, then the `status` lines indented under it (the shape of `zpool
/// status`: a name, then what it is made of and how it is), then the quota roots.
pub fn describe(target: &Target, status: &str, quotas: &str) -> String {
    let mut out = match target {
        Target::Image(path) => format!("  image: {}\n", path.display()),
        Target::Appliance(addr) => format!("  appliance: {addr}\n"),
    };
    let width = status
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(k, _)| k.len()))
        .max()
        .unwrap_or(0);
    for line in status.lines() {
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        out.push_str(&format!("  {key:>width$}  {value}\n"));
    }
    out.push_str("\n  quotas:\n");
    for line in quotas.lines() {
        out.push_str(&format!("    {line}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_line_up_under_their_target() {
        let s = describe(
            &Target::Appliance("10.0.2.15".into()),
            "state read-write\nlog_used_bytes 1 of 2\n",
            "0 quota root(s)",
        );
        assert_eq!(
            s,
            "  appliance: 10.0.2.15\n           state  read-write\n  log_used_bytes  1 of 2\n\n  quotas:\n    0 quota root(s)\n"
        );
    }
}
