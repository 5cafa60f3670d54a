//! The console's lines for what changed and what was refused, read from two counters
//! snapshots ([`Snapshot`]) rather than logged where it happens: a client that
//! reconnects in a loop, or a tenant writing into a full quota, would otherwise print a
//! line per attempt. The monitor (`monitor.rs`) asks for [`Alerts::changes`] every
//! time it takes a snapshot and for [`refusals`] once per status interval; the
//! per-connection detail stays in the debug log.
//!
//! - A quota root that reaches its byte or inode limit is reported full once, and once
//!   more when it is below its limits again ([`Alerts::changes`]).
//! - Writes refused for a quota, connections the 9P service refused or shed (by cause),
//!   and what each tenant was refused for its share are summed over the interval
//!   ([`refusals`]): at most one line each per interval, none when nothing was refused.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;

use crate::report::Snapshot;

/// How serious a console line is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Something an operator should act on.
    Warn,
    /// Back to normal.
    Info,
}

/// One console line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// How serious it is.
    pub level: Level,
    /// The text (no newline).
    pub text: String,
}

impl Line {
    fn warn(text: String) -> Line {
        Line {
            level: Level::Warn,
            text,
        }
    }

    fn info(text: String) -> Line {
        Line {
            level: Level::Info,
            text,
        }
    }

    /// Logs the line at its level.
    pub fn log(&self) {
        match self.level {
            Level::Warn => log::warn!("{}", self.text),
            Level::Info => log::info!("{}", self.text),
        }
    }
}

/// The state the console last reported: which quota roots were full.
#[derive(Debug, Default)]
pub struct Alerts {
    /// Full quota roots (by root inode) and how they were named.
    full: BTreeMap<u64, String>,
}

impl Alerts {
    /// No quota reported full yet.
    pub fn new() -> Alerts {
        Alerts::default()
    }

    /// The lines for what changed since the last call: quota roots now at a limit
    /// (warn) and those below their limits again or gone (info).
    pub fn changes(&mut self, s: &Snapshot) -> Vec<Line> {
        let mut lines = Vec::new();
        let Some(fs) = &s.fs else {
            return lines;
        };
        let mut full = BTreeMap::new();
        for q in &fs.quotas {
            let bytes = q.byte_limit.filter(|&l| q.bytes >= l);
            let inodes = q.inode_limit.filter(|&l| q.inodes >= l);
            if bytes.is_none() && inodes.is_none() {
                continue;
            }
            full.insert(q.root, q.name.clone());
            if self.full.contains_key(&q.root) {
                continue;
            }
            let what = match (bytes, inodes) {
                (Some(l), _) => format!("{} of {} MiB", q.bytes >> 20, l >> 20),
                (None, Some(l)) => format!("{} of {} inodes", q.inodes, l),
                (None, None) => unreachable!("skipped above"),
            };
            lines.push(Line::warn(format!(
                "quota: {} full ({what}): writes and creates get EDQUOT",
                q.name
            )));
        }
        for (root, name) in &self.full {
            if !full.contains_key(root) {
                lines.push(Line::info(format!("quota: {name} below its limits again")));
            }
        }
        self.full = full;
        lines
    }
}

/// The lines for what was refused between `earlier` and `now` (one per kind, none if
/// nothing was): writes refused for quotas, connections refused and shed by the 9P
/// service, and each tenant's refusals for its share.
pub fn refusals(earlier: &Snapshot, now: &Snapshot) -> Vec<Line> {
    let mut lines = Vec::new();
    let secs = now.uptime_ms.saturating_sub(earlier.uptime_ms) / 1000;
    if let (Some(a), Some(b)) = (&earlier.fs, &now.fs) {
        let refused = b
            .stats
            .quota_exceeded
            .saturating_sub(a.stats.quota_exceeded);
        if refused > 0 {
            lines.push(Line::warn(format!(
                "quota: {refused} operations refused (EDQUOT) in {secs} s"
            )));
        }
    }
    let (Some(a), Some(b)) = (&earlier.ninep, &now.ninep) else {
        return lines;
    };
    let (sa, sb) = (&a.server, &b.server);
    let d = |x: u64, y: u64| y.saturating_sub(x);
    // Every refusal at the door, by its reason; the sum is what clients saw.
    let refused = [
        (
            "not in an allow-list",
            d(sa.refused_connections, sb.refused_connections),
        ),
        (
            "per-client limit",
            d(sa.client_conn_limit_hits, sb.client_conn_limit_hits),
        ),
        ("tenant's share", d(a.tenant_refused, b.tenant_refused)),
        ("server full", d(a.refused, b.refused)),
    ];
    if let Some(line) = summary("refused", &refused, secs) {
        lines.push(Line::warn(line));
    }
    let shed = [
        (
            "handshake timeout",
            d(sa.handshake_timeouts, sb.handshake_timeouts),
        ),
        ("idle", d(sa.idle_timeouts, sb.idle_timeouts)),
        (
            "slot for another tenant",
            d(sa.slot_reclaims, sb.slot_reclaims),
        ),
        ("memory", d(sa.memory_reclaims, sb.memory_reclaims)),
    ];
    if let Some(line) = summary("closed", &shed, secs) {
        lines.push(Line::warn(line));
    }
    for t in &b.tenants {
        let before = a.tenants.iter().find(|x| x.tenant == t.tenant);
        let was = |f: fn(&ninep::server::TenantStats) -> u64| before.map_or(0, f);
        let what = [
            ("connections", d(was(|x| x.refused_conns), t.refused_conns)),
            ("fids", d(was(|x| x.refused_fids), t.refused_fids)),
            ("locks", d(was(|x| x.refused_locks), t.refused_locks)),
        ];
        if what.iter().all(|&(_, n)| n == 0) {
            continue;
        }
        let mut line = format!("tenant {}: over its share, refused", t.tenant);
        for (i, (name, n)) in what.iter().filter(|&&(_, n)| n > 0).enumerate() {
            let _ = write!(line, "{} {n} {name}", if i == 0 { "" } else { "," });
        }
        let _ = write!(line, " in {secs} s");
        lines.push(Line::warn(line));
    }
    lines
}

/// `9p: N connections VERB in S s (reason n, ...)`, or `None` if all are 0.
fn summary(verb: &str, by_reason: &[(&str, u64)], secs: u64) -> Option<String> {
    let total: u64 = by_reason.iter().map(|&(_, n)| n).sum();
    if total == 0 {
        return None;
    }
    let mut line = format!(
        "9p: {total} connection{} {verb} in {secs} s (",
        if total == 1 { "" } else { "s" }
    );
    for (i, (reason, n)) in by_reason.iter().filter(|&&(_, n)| n > 0).enumerate() {
        let _ = write!(line, "{}{reason} {n}", if i == 0 { "" } else { ", " });
    }
    line.push(')');
    Some(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;
    use ninefs::surface::report::{FsReport, QuotaReport};
    use ninep::service::report::NinepReport;

    fn quota(bytes: u64, limit: u64) -> QuotaReport {
        QuotaReport {
            name: "vm".to_string(),
            root: 7,
            bytes,
            inodes: 3,
            byte_limit: Some(limit),
            inode_limit: None,
        }
    }

    fn with_quota(q: QuotaReport) -> Snapshot {
        Snapshot {
            fs: Some(FsReport {
                quotas: vec![q],
                ..FsReport::default()
            }),
            ..Snapshot::default()
        }
    }

    #[test]
    fn a_quota_is_reported_full_once_and_again_when_below_its_limit() {
        let mut alerts = Alerts::new();
        assert!(alerts
            .changes(&with_quota(quota(5 << 20, 10 << 20)))
            .is_empty());
        let full = alerts.changes(&with_quota(quota(10 << 20, 10 << 20)));
        assert_eq!(
            full,
            vec![Line::warn(
                "quota: vm full (10 of 10 MiB): writes and creates get EDQUOT".to_string()
            )]
        );
        assert!(alerts
            .changes(&with_quota(quota(11 << 20, 10 << 20)))
            .is_empty());
        let below = alerts.changes(&with_quota(quota(1 << 20, 10 << 20)));
        assert_eq!(
            below,
            vec![Line::info("quota: vm below its limits again".to_string())]
        );
        assert!(alerts
            .changes(&with_quota(quota(1 << 20, 10 << 20)))
            .is_empty());
    }

    #[test]
    fn an_inode_limit_makes_a_quota_full_too_and_a_removed_root_is_no_longer_full() {
        let mut alerts = Alerts::new();
        let q = QuotaReport {
            inode_limit: Some(3),
            byte_limit: None,
            ..quota(0, 0)
        };
        let lines = alerts.changes(&with_quota(q));
        assert_eq!(lines.len(), 1);
        assert!(lines[0].text.contains("3 of 3 inodes"), "{:?}", lines[0]);
        let gone = alerts.changes(&Snapshot {
            fs: Some(FsReport::default()),
            ..Snapshot::default()
        });
        assert_eq!(gone[0].level, Level::Info);
    }

    fn ninep(uptime_ms: u64, f: impl FnOnce(&mut NinepReport)) -> Snapshot {
        let mut p = NinepReport::default();
        f(&mut p);
        Snapshot {
            uptime_ms,
            ninep: Some(p),
            fs: Some(FsReport::default()),
            ..Snapshot::default()
        }
    }

    #[test]
    fn nothing_refused_prints_nothing() {
        let a = ninep(0, |p| p.server.client_conn_limit_hits = 4);
        let b = ninep(60_000, |p| p.server.client_conn_limit_hits = 4);
        assert!(refusals(&a, &b).is_empty());
    }

    #[test]
    fn refusals_and_sheds_are_summed_by_reason_in_one_line_each() {
        let a = ninep(0, |p| p.server.client_conn_limit_hits = 4);
        let b = ninep(60_000, |p| {
            p.server.client_conn_limit_hits = 1004;
            p.tenant_refused = 2;
            p.server.memory_reclaims = 1;
            p.tenants = vec![ninep::server::TenantStats {
                tenant: "export:vm".to_string(),
                refused_conns: 2,
                refused_fids: 5,
                ..Default::default()
            }];
        });
        let lines: Vec<String> = refusals(&a, &b).into_iter().map(|l| l.text).collect();
        assert_eq!(
            lines,
            vec![
                "9p: 1002 connections refused in 60 s (per-client limit 1000, tenant's share 2)",
                "9p: 1 connection closed in 60 s (memory 1)",
                "tenant export:vm: over its share, refused 2 connections, 5 fids in 60 s",
            ]
        );
    }

    #[test]
    fn quota_refusals_are_counted_over_the_interval() {
        let mut a = with_quota(quota(0, 1));
        let mut b = a.clone();
        a.fs.as_mut().unwrap().stats.quota_exceeded = 3;
        b.fs.as_mut().unwrap().stats.quota_exceeded = 10;
        b.uptime_ms = 60_000;
        let lines = refusals(&a, &b);
        assert_eq!(
            lines,
            vec![Line::warn(
                "quota: 7 operations refused (EDQUOT) in 60 s".to_string()
            )]
        );
    }
}
