//! `ninefold top --connect ADDR[:PORT]`: a live view of a running appliance (or `ninefold
//! serve --stats`), refreshed every interval from its counters port's `/metrics`: 9P
//! requests per second by type and their latency, bytes read and written, the fsync
//! log's commits and how many fsyncs each carried, device flushes, node writes by cause,
//! the caches, each tenant and each CPU.
//!
//! It reads the Prometheus text the counters port serves (`net/metrics`), so it shows
//! what a monitoring system would, under the same names; rates are differences between
//! two samples, latency quantiles come from the histogram buckets' differences (the
//! interval's requests only, not the whole uptime's).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use clap::Args;

/// The counters port when `--connect` names none (the appliance's `stats=` default).
pub const DEFAULT_STATS_PORT: u16 = 5641;

/// Arguments of `ninefold top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// The counters port of the appliance (or `ninefold serve --stats`): ADDR[:PORT],
    /// port 5641 unless given.
    #[arg(long, value_name = "ADDR[:PORT]")]
    pub connect: String,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Stop after this many refreshes (0: until interrupted).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
}

/// Runs `top`.
pub fn run(args: TopArgs) -> Result<(), String> {
    if !(0.1..=3600.0).contains(&args.interval) {
        return Err("--interval: from 0.1 to 3600 seconds".into());
    }
    let addrs = crate::remote::resolve(&args.connect, DEFAULT_STATS_PORT)?;
    let interval = Duration::from_secs_f64(args.interval);
    let terminal = std::io::stdout().is_terminal();
    let mut previous = (Instant::now(), Sample::parse(&fetch(&addrs)?)?);
    let mut shown = 0u64;
    while args.count == 0 || shown < args.count {
        std::thread::sleep(interval);
        let now = Instant::now();
        let sample = Sample::parse(&fetch(&addrs)?)?;
        let secs = now.duration_since(previous.0).as_secs_f64();
        let frame = render(&args.connect, &previous.1, &sample, secs);
        let mut out = std::io::stdout().lock();
        // A terminal gets the frame in place; a pipe gets frames one after another.
        let written = match terminal {
            true => write!(out, "\x1b[H\x1b[2J{frame}"),
            false => writeln!(out, "{frame}"),
        };
        written
            .and_then(|()| out.flush())
            .map_err(|e| format!("writing: {e}"))?;
        previous = (now, sample);
        shown += 1;
    }
    Ok(())
}

/// `GET /metrics` from the counters port: the body.
pub(crate) fn fetch(addrs: &[std::net::SocketAddr]) -> Result<String, String> {
    let mut stream =
        TcpStream::connect_timeout(&addrs[0], Duration::from_secs(10)).map_err(|e| {
            format!(
                "cannot reach the counters port at {} ({e}); the appliance serves it on stats= \
             (default {DEFAULT_STATS_PORT}) to the addresses stats_allow= lists",
                addrs[0]
            )
        })?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .map_err(|e| format!("{}: {e}", addrs[0]))?;
    let mut reply = Vec::new();
    // A bound on what is kept: the document of a large appliance is some hundred KB.
    stream
        .take(64 << 20)
        .read_to_end(&mut reply)
        .map_err(|e| format!("{}: {e}", addrs[0]))?;
    let reply = String::from_utf8_lossy(&reply);
    match reply.split_once("\r\n\r\n") {
        Some((head, body))
            if head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200") =>
        {
            Ok(body.to_string())
        }
        _ => Err(format!(
            "{}: not a counters port (the reply starts {:?})",
            addrs[0],
            reply.chars().take(40).collect::<String>()
        )),
    }
}

/// One series: its labels (`k="v"` pairs, sorted) and value.
type Labels = BTreeMap<String, String>;

/// The samples of one `/metrics` answer, by metric name.
#[derive(Debug, Default)]
pub struct Sample {
    series: BTreeMap<String, Vec<(Labels, f64)>>,
}

impl Sample {
    /// The samples of a `/metrics` answer (`metrics::parse`: strictly, a malformed
    /// line is an error).
    pub fn parse(text: &str) -> Result<Sample, String> {
        let mut series: BTreeMap<String, Vec<(Labels, f64)>> = BTreeMap::new();
        for s in metrics::parse::parse(text)? {
            series.entry(s.name).or_default().push((s.labels, s.value));
        }
        Ok(Sample { series })
    }

    /// The series of `name`.
    fn all(&self, name: &str) -> &[(Labels, f64)] {
        self.series.get(name).map_or(&[], Vec::as_slice)
    }

    /// The sum of the series of `name` (0 if none).
    fn sum(&self, name: &str) -> f64 {
        // Folded from +0: an empty `sum` of floats is -0, which prints as "-0".
        self.all(name).iter().fold(0.0, |sum, (_, v)| sum + v)
    }

    /// The value of `name` with label `key` = `value` (summed over the other labels).
    pub(crate) fn with(&self, name: &str, key: &str, value: &str) -> f64 {
        self.all(name)
            .iter()
            .filter(|(l, _)| l.get(key).map(String::as_str) == Some(value))
            .fold(0.0, |sum, (_, v)| sum + v)
    }

    /// The values of label `key` among the series of `name`, in order.
    pub(crate) fn label_values(&self, name: &str, key: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .all(name)
            .iter()
            .filter_map(|(l, _)| l.get(key).cloned())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Metric names that start with `prefix`.
    fn names_with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.series
            .range(prefix.to_string()..)
            .map(|(k, _)| k.as_str())
            .take_while(move |k| k.starts_with(prefix))
    }
}

/// Per-second rate of counter `name` between two samples (never negative: a restart
/// in between reads as 0).
fn rate(a: &Sample, b: &Sample, secs: f64, f: impl Fn(&Sample) -> f64) -> f64 {
    ((f(b) - f(a)) / secs).max(0.0)
}

/// Quantile `q` (0..1) of the requests a histogram counted between the samples, in
/// seconds: the upper bound of the bucket it falls in (None when nothing was counted).
fn quantile(a: &Sample, b: &Sample, name: &str, key: &str, value: &str, q: f64) -> Option<f64> {
    let buckets = |s: &Sample| -> Vec<(f64, f64)> {
        let mut v: Vec<(f64, f64)> = s
            .all(&format!("{name}_bucket"))
            .iter()
            .filter(|(l, _)| key.is_empty() || l.get(key).map(String::as_str) == Some(value))
            .filter_map(|(l, v)| {
                let le = l.get("le")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, *v))
            })
            .collect();
        v.sort_by(|x, y| x.0.total_cmp(&y.0));
        // Several series with the same bound (other labels): summed.
        v.dedup_by(|x, y| {
            if x.0 == y.0 {
                y.1 += x.1;
                true
            } else {
                false
            }
        });
        v
    };
    let (before, after) = (buckets(a), buckets(b));
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let old = before
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0.0, |(_, v)| *v);
            (*le, (n - old).max(0.0))
        })
        .collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    delta
        .iter()
        .find(|(_, n)| *n >= q * total)
        .map(|(le, _)| *le)
}

fn ms(seconds: Option<f64>) -> String {
    match seconds {
        None => "-".into(),
        Some(s) if s.is_infinite() => ">max".into(),
        Some(s) if s < 0.001 => format!("{:.3}", s * 1e3),
        Some(s) => format!("{:.1}", s * 1e3),
    }
}

fn mib(bytes: f64) -> String {
    format!("{:.1}", bytes / (1 << 20) as f64)
}

/// The frame for the interval from sample `a` to sample `b`, `secs` apart.
pub fn render(target: &str, a: &Sample, b: &Sample, secs: f64) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(s.trim_end());
        out.push('\n');
    };
    let up = b.sum("ninefold_uptime_seconds") as u64;
    line(format!(
        "ninefold top  {target}  up {}h{:02}m{:02}s  every {secs:.1} s",
        up / 3600,
        up / 60 % 60,
        up % 60
    ));

    // 9P: requests by type, bytes, latency.
    let requests = "ninefold_9p_requests_total";
    let total = rate(a, b, secs, |s| s.sum(requests));
    let mut types: Vec<(String, f64)> = b
        .label_values(requests, "type")
        .into_iter()
        .map(|t| {
            let r = rate(a, b, secs, |s| s.with(requests, "type", &t));
            (t, r)
        })
        .filter(|(_, r)| *r > 0.0)
        .collect();
    types.sort_by(|x, y| y.1.total_cmp(&x.1));
    line(format!(
        "9p       conns {:.0}  requests/s {total:.0}  MiB/s in {} out {}",
        b.sum("ninefold_9p_connections"),
        mib(rate(a, b, secs, |s| s.sum("ninefold_9p_rx_bytes_total"))),
        mib(rate(a, b, secs, |s| s.sum("ninefold_9p_tx_bytes_total"))),
    ));
    if !types.is_empty() {
        let by: Vec<String> = types
            .iter()
            .take(8)
            .map(|(t, r)| format!("{t} {r:.0}"))
            .collect();
        line(format!("         by type/s: {}", by.join("  ")));
        let latency = "ninefold_9p_request_duration_seconds";
        let lat: Vec<String> = types
            .iter()
            .take(5)
            .map(|(t, _)| {
                format!(
                    "{t} {}/{}",
                    ms(quantile(a, b, latency, "type", t, 0.5)),
                    ms(quantile(a, b, latency, "type", t, 0.99))
                )
            })
            .collect();
        line(format!("         latency ms p50/p99: {}", lat.join("  ")));
    }

    // The fsync log and the device.
    let commits = rate(a, b, secs, |s| s.sum("ninefold_fs_log_commits_total"));
    let fsyncs = rate(a, b, secs, |s| {
        s.sum("ninefold_fs_log_fsyncs_total") + s.sum("ninefold_fs_log_fdatasyncs_total")
    });
    line(format!(
        "log      commits/s {commits:.0}  fsyncs/s {fsyncs:.0}  fsyncs per commit {}  checkpoints/s {:.1}",
        if commits > 0.0 { format!("{:.2}", fsyncs / commits) } else { "-".into() },
        rate(a, b, secs, |s| s.sum("ninefold_fs_checkpoints_total")),
    ));
    let flush_hist = b
        .names_with_prefix("ninefold_device_")
        .find(|n| n.contains("flush") && n.ends_with("_seconds_bucket"))
        .map(|n| n.trim_end_matches("_bucket").to_string());
    let flush_latency = flush_hist.map_or(String::new(), |h| {
        format!(
            "  flush ms p50/p99 {}/{}",
            ms(quantile(a, b, &h, "", "", 0.5)),
            ms(quantile(a, b, &h, "", "", 0.99))
        )
    });
    line(format!(
        "device   flushes/s {:.0}{flush_latency}  data MiB/s written {} read {}",
        rate(a, b, secs, |s| s.sum("ninefold_fs_flushes_total")),
        mib(rate(a, b, secs, |s| s
            .sum("ninefold_fs_data_written_bytes_total"))),
        mib(rate(a, b, secs, |s| s.sum("ninefold_fs_data_read_bytes_total"))),
    ));
    let writes = "ninefold_fs_node_writes_total";
    let causes: Vec<String> = b
        .label_values(writes, "cause")
        .into_iter()
        .filter_map(|c| {
            let r = rate(a, b, secs, |s| s.with(writes, "cause", &c));
            (r > 0.0).then(|| format!("{c} {r:.1}"))
        })
        .collect();
    line(format!(
        "nodes    writes/s {:.1} ({})  loads/s {:.1}",
        rate(a, b, secs, |s| s.sum(writes)),
        if causes.is_empty() {
            "none".into()
        } else {
            causes.join(", ")
        },
        rate(a, b, secs, |s| s.sum("ninefold_fs_node_loads_total")),
    ));

    // Caches.
    let hits = rate(a, b, secs, |s| s.sum("ninefold_fs_data_cache_hits_total"));
    let misses = rate(a, b, secs, |s| s.sum("ninefold_fs_data_cache_misses_total"));
    line(format!(
        "cache    nodes {}/{} MiB  data {}/{} MiB  data hits {}",
        mib(b.sum("ninefold_fs_cache_bytes")),
        mib(b.sum("ninefold_fs_cache_limit_bytes")),
        mib(b.sum("ninefold_fs_data_cache_bytes")),
        mib(b.sum("ninefold_fs_data_cache_limit_bytes")),
        if hits + misses > 0.0 {
            format!("{:.1}%", 100.0 * hits / (hits + misses))
        } else {
            "-".into()
        },
    ));

    // Tenants: connections, requests in flight, CPU.
    for tenant in b.label_values("ninefold_9p_tenant_connections", "tenant") {
        let cpu = rate(a, b, secs, |s| {
            s.with("ninefold_9p_tenant_cpu_seconds_total", "tenant", &tenant)
        });
        line(format!(
            "tenant   {tenant}: conns {:.0}  in flight {:.0}  cpu {:.0}%",
            b.with("ninefold_9p_tenant_connections", "tenant", &tenant),
            b.with("ninefold_9p_tenant_requests_in_flight", "tenant", &tenant),
            100.0 * cpu
        ));
    }
    // CPUs (the appliance's): busy share and connections served.
    for cpu in b.label_values("ninefold_cpu_idle_seconds_total", "cpu") {
        let idle = rate(a, b, secs, |s| {
            s.with("ninefold_cpu_idle_seconds_total", "cpu", &cpu)
        });
        line(format!(
            "cpu {cpu:<4} busy {:.0}%  conns {:.0}",
            (100.0 * (1.0 - idle)).clamp(0.0, 100.0),
            b.with("ninefold_cpu_9p_connections", "cpu", &cpu)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counters of a fixture sample, all the tests' figures: [`Fixture::sample`]
    /// writes them as `/metrics` does (with a comment line the parser skips).
    struct Fixture {
        uptime: u64,
        conns: u64,
        reads: u64,
        /// Fsync requests: the log's fsyncs too, and the latency histogram's count.
        fsyncs: u64,
        /// Of them, those that took at most 1 ms and at most 10 ms (the others longer).
        fsyncs_within: [u64; 2],
        commits: u64,
        reclaim_writes: u64,
        tenant_conns: u64,
    }

    impl Fixture {
        fn sample(&self) -> Sample {
            let Fixture {
                uptime,
                conns,
                reads,
                fsyncs,
                fsyncs_within: [ms1, ms10],
                commits,
                reclaim_writes,
                tenant_conns,
            } = self;
            let fsync_le = "ninefold_9p_request_duration_seconds_bucket{type=\"fsync\",le=";
            Sample::parse(&format!(
                "# HELP x\n\
                 ninefold_uptime_seconds {uptime}\n\
                 ninefold_9p_connections {conns}\n\
                 ninefold_9p_requests_total{{type=\"read\"}} {reads}\n\
                 ninefold_9p_requests_total{{type=\"fsync\"}} {fsyncs}\n\
                 {fsync_le}\"0.001\"}} {ms1}\n\
                 {fsync_le}\"0.01\"}} {ms10}\n\
                 {fsync_le}\"+Inf\"}} {fsyncs}\n\
                 ninefold_fs_log_commits_total {commits}\n\
                 ninefold_fs_log_fsyncs_total {fsyncs}\n\
                 ninefold_fs_node_writes_total{{cause=\"reclaim\"}} {reclaim_writes}\n\
                 ninefold_9p_tenant_connections{{tenant=\"a \\\"b\\\"\"}} {tenant_conns}\n"
            ))
            .unwrap()
        }
    }

    const A: Fixture = Fixture {
        uptime: 10,
        conns: 2,
        reads: 100,
        fsyncs: 10,
        fsyncs_within: [5, 10],
        commits: 4,
        reclaim_writes: 1,
        tenant_conns: 1,
    };

    /// Two seconds after [`A`].
    const B: Fixture = Fixture {
        uptime: 12,
        conns: 3,
        reads: 300,
        fsyncs: 30,
        fsyncs_within: [6, 28],
        commits: 14,
        reclaim_writes: 5,
        tenant_conns: 2,
    };

    #[test]
    fn rates_and_quantiles_cover_the_interval_only() {
        let frame = render("h:5641", &A.sample(), &B.sample(), 2.0);
        assert!(frame.contains("requests/s 110"), "{frame}");
        assert!(frame.contains("by type/s: read 100  fsync 10"), "{frame}");
        // Of the interval's 20 fsyncs, 1 took at most 1 ms, 17 more at most 10: p50
        // is in the 10 ms bucket; 2 took longer than every bound.
        assert!(frame.contains("fsync 10.0/>max"), "{frame}");
        assert!(
            frame.contains("commits/s 5  fsyncs/s 10  fsyncs per commit 2.00"),
            "{frame}"
        );
        assert!(frame.contains("writes/s 2.0 (reclaim 2.0)"), "{frame}");
        assert!(frame.contains("tenant   a \"b\": conns 2"), "{frame}");
        assert!(
            frame.starts_with("ninefold top  h:5641  up 0h00m12s"),
            "{frame}"
        );
    }

    #[test]
    fn a_counter_that_went_back_reads_as_zero() {
        let frame = render("h", &B.sample(), &A.sample(), 1.0);
        assert!(frame.contains("requests/s 0"), "{frame}");
    }
}
