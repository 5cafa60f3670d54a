//! `ninefold status IMAGE` or `ninefold status --connect ADDR`: the state of a filesystem
//! (health, space, log, checkpoint, mirror legs and rebuild, scrub, stream jobs) and its
//! quota roots, as the appliance's `status` file and `quota list` command give them; on
//! a running appliance also its tenants, from its counters port.

use std::path::PathBuf;

use clap::Args;
use ninefs::surface::control::Command;
use ninefs::volume::{MountOptions, NineFs};

use std::net::SocketAddr;

use crate::image;
use crate::remote::{resolve, Remote, Target};
use crate::serve::SystemClock;
use crate::top::{Sample, DEFAULT_STATS_PORT};

/// Arguments of `ninefold status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The running appliance at ADDR[:PORT] instead of an image.
    #[arg(long, value_name = "ADDR[:PORT]", conflicts_with = "image")]
    pub connect: Option<String>,
    /// Its counters port, for the tenants (default: the `--connect` address, port 5641).
    #[arg(long, value_name = "ADDR[:PORT]", requires = "connect")]
    pub stats: Option<String>,
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
            let tenants = tenants_of(addr, args.stats.as_deref());
            print!(
                "{}{}",
                describe(
                    &Target::Appliance(addr.clone()),
                    &String::from_utf8_lossy(&status),
                    &quotas
                ),
                tenants
            );
            return Ok(());
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

/// The tenants section of a running appliance's report, from its counters port (`stats`,
/// else `connect`'s address at port 5641): one line per tenant, or why there are none.
fn tenants_of(connect: &str, stats: Option<&str>) -> String {
    let sample = stats_addrs(connect, stats)
        .and_then(|addrs| crate::top::fetch(&addrs))
        .and_then(|text| Sample::parse(&text));
    match sample {
        Ok(sample) => describe_tenants(&sample),
        Err(e) => format!("\n  tenants: not known ({e})\n"),
    }
}

/// Where the counters port is.
fn stats_addrs(connect: &str, stats: Option<&str>) -> Result<Vec<SocketAddr>, String> {
    match stats {
        Some(stats) => resolve(stats, DEFAULT_STATS_PORT),
        None => Ok(resolve(connect, crate::remote::DEFAULT_PORT)?
            .into_iter()
            .map(|a| SocketAddr::new(a.ip(), DEFAULT_STATS_PORT))
            .collect()),
    }
}

/// The tenants section: each tenant with what it holds of its shares and what it was
/// refused.
pub fn describe_tenants(sample: &Sample) -> String {
    let tenants = sample.label_values("ninefold_9p_tenant_connections", "tenant");
    let mut out = format!("\n  tenants: {}\n", tenants.len());
    for t in tenants {
        let v = |name: &str| sample.with(name, "tenant", &t);
        out.push_str(&format!(
            "    {t}: conns {:.0}, memory {:.0} KiB, fids {:.0}, locks {:.0}, in flight {:.0}; \
             refused conns {:.0}, fids {:.0}, locks {:.0}\n",
            v("ninefold_9p_tenant_connections"),
            v("ninefold_9p_tenant_memory_bytes") / 1024.0,
            v("ninefold_9p_tenant_fids"),
            v("ninefold_9p_tenant_locks"),
            v("ninefold_9p_tenant_requests_in_flight"),
            v("ninefold_9p_tenant_connections_refused_total"),
            v("ninefold_9p_tenant_fids_refused_total"),
            v("ninefold_9p_tenant_locks_refused_total"),
        ));
    }
    out
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
    fn tenants_are_listed_with_their_holdings_and_refusals() {
        let sample = Sample::parse(
            "ninefold_9p_tenant_connections{tenant=\"export:a\"} 2\n\
             ninefold_9p_tenant_memory_bytes{tenant=\"export:a\"} 4096\n\
             ninefold_9p_tenant_fids{tenant=\"export:a\"} 7\n\
             ninefold_9p_tenant_locks_refused_total{tenant=\"export:a\"} 3\n\
             ninefold_9p_tenant_connections{tenant=\"local\"} 0\n",
        )
        .unwrap();
        assert_eq!(
            describe_tenants(&sample),
            "\n  tenants: 2\n    export:a: conns 2, memory 4 KiB, fids 7, locks 0, in flight 0; \
             refused conns 0, fids 0, locks 3\n    local: conns 0, memory 0 KiB, fids 0, locks 0, \
             in flight 0; refused conns 0, fids 0, locks 0\n"
        );
    }

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
