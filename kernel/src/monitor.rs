//! Counters for the operator: builds [`Snapshot`]s of the running appliance (devices,
//! filesystem, 9P service, heap) for the counters service (`net::stats_port`); emits one
//! as a `stats` event ([`crate::event`]) every [`EVENT_INTERVAL`] when something
//! happened, and logs the console's status line (`serving: N ops/s, ...`) at most every
//! [`STATUS_INTERVAL`], when clients did work; logs what changed (a quota full) and
//! what was refused (connections, quota writes, tenants over their share) as
//! [`crate::alerts`] reads them from the snapshots. The whole document goes to the
//! console only under `log=debug`.

use alloc::rc::Rc;
use alloc::string::String;
use core::time::Duration;

use ninep::admin::AdminFs;
use ninep::server::export;

use crate::alerts::{self, Alerts, Line};
use crate::net::listener::Listener;
use crate::net::stats_port::{PortStats, Source};
use crate::report::{
    AccessReport, CpuReport, FsReport, HeapReport, NicReport, NinepReport, PowerReport,
    ServingReport, Snapshot, Work,
};
use crate::storage::ServedVolume;
use crate::{clock, hal, smp, task};
use alloc::string::ToString;

/// How often the `stats` event is emitted (when something happened).
pub const EVENT_INTERVAL: Duration = Duration::from_secs(10);
/// How often the status line may be logged (when clients did work); a multiple of
/// [`EVENT_INTERVAL`].
pub const STATUS_INTERVAL: Duration = Duration::from_secs(60);

/// The appliance's counters, as served and logged.
pub struct Monitor<V: ServedVolume> {
    listener: Rc<Listener<AdminFs<V>>>,
    cache_limit: u64,
    port_stats: Rc<PortStats>,
}

impl<V: ServedVolume> core::fmt::Debug for Monitor<V> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Monitor").finish_non_exhaustive()
    }
}

impl<V: ServedVolume> Monitor<V> {
    /// A monitor of `listener`'s service, the filesystem it serves (whose node cache is limited
    /// to `cache_limit` bytes, 0 if it has none) and the counters port (`port_stats`).
    pub fn new(
        listener: Rc<Listener<AdminFs<V>>>,
        cache_limit: usize,
        port_stats: Rc<PortStats>,
    ) -> Rc<Self> {
        Rc::new(Monitor {
            listener,
            cache_limit: cache_limit as u64,
            port_stats,
        })
    }

    /// Every [`EVENT_INTERVAL`] when something happened ([`Snapshot::activity_key`]):
    /// emits a `stats` event and logs the counters as a `stats:` line at debug level.
    /// Every [`STATUS_INTERVAL`] when clients did work ([`Work`]): logs the status line.
    /// A quota that became full, or is no longer, is logged at the next snapshot; what
    /// was refused, once per [`STATUS_INTERVAL`] ([`crate::alerts`]). An idle appliance
    /// logs and emits nothing.
    pub async fn log_periodically(self: Rc<Self>) {
        let mut last = String::new();
        let first = self.snapshot().await;
        let mut alerts = Alerts::new();
        alerts.changes(&first).iter().for_each(Line::log);
        let mut status_at = Work::of(&first);
        let mut refusals_since = first;
        let ticks_per_status = (STATUS_INTERVAL.as_secs() / EVENT_INTERVAL.as_secs()).max(1);
        let mut ticks: u64 = 0;
        loop {
            task::sleep(EVENT_INTERVAL).await;
            let s = self.snapshot().await;
            let key = s.activity_key();
            if key != last {
                log::debug!("stats: {}", s.json());
                crate::event::emit(crate::event::Event::Stats { counters: &s });
                last = key;
            }
            alerts.changes(&s).iter().for_each(Line::log);
            ticks += 1;
            if ticks.is_multiple_of(ticks_per_status) {
                alerts::refusals(&refusals_since, &s)
                    .iter()
                    .for_each(Line::log);
                let now = Work::of(&s);
                if let Some(line) = now.status_line(&status_at) {
                    log::info!("{line}");
                }
                status_at = now;
                refusals_since = s;
            }
        }
    }
}

impl<V: ServedVolume> Source for Monitor<V> {
    async fn snapshot(&self) -> Snapshot {
        let fs = self.listener.server().fs().inner();
        let conns = self.listener.service().stats();
        let heap = hal::heap::stats();
        let mut fs_report = FsReport {
            cache_limit: self.cache_limit,
            ..fs.fs_report().await
        };
        let exports = &self.listener.server().config().exports;
        fs_report.name_projects(|root| export::of_project(exports, root).map(|e| e.name.clone()));
        let server = self.listener.server();
        fs_report
            .data_cache
            .name_tenants(|id| server.tenant_name(id));
        Snapshot {
            uptime_ms: clock::uptime().as_millis() as u64,
            idle_ms: task::idle_time().as_millis() as u64,
            cpus: smp::states()
                .enumerate()
                .map(|(cpu, s)| CpuReport {
                    cpu: cpu.to_string(),
                    apic_id: s.apic_id,
                    idle_ms: task::idle_time_of(cpu).as_millis() as u64,
                    remote_tasks: s.remote_tasks,
                    tsc: s.tsc,
                    wakes: s.wakes,
                    serving: {
                        let c = conns.worker(cpu);
                        ServingReport {
                            connections: c.active(),
                            accepted: c.accepted.get(),
                            rx_bytes: c.rx_bytes.get(),
                            tx_bytes: c.tx_bytes.get(),
                        }
                    },
                })
                .collect(),
            nic: {
                let (notifications, notifications_suppressed) = hal::virtio::kick_counts();
                let stack = self.listener.stack();
                NicReport {
                    counts: stack.nic_counters().counts(),
                    offloads: stack.nic_offloads(),
                    notifications,
                    notifications_suppressed,
                }
            },
            devices: fs.devices(),
            fs: Some(fs_report),
            ninep: Some(NinepReport {
                syns_held: self.listener.stack().syn_gate().held(),
                ..self.listener.service().report()
            }),
            listener: self.listener.stack().syn_gate().report(),
            heap: HeapReport {
                bytes: heap.claimed,
                allocated: heap.allocated,
                recycled: heap.recycled,
                cpu_cached: heap.cpu_cached,
                cpu_refills: heap.cpu_refills,
                cpu_flushes: heap.cpu_flushes,
                drains: heap.drains,
            },
            access: AccessReport {
                refused_stats: self.port_stats.refused.get(),
            },
            power: PowerReport {
                shutdown: crate::shutdown::report(conns),
                ..crate::power::report()
            },
        }
    }
}
