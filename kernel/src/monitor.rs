//! Counters for the operator: builds [`Snapshot`]s of the running appliance (devices,
//! filesystem, 9P service, heap) for the counters service (`net::stats_port`) and logs
//! one as a `stats: {json}` line, and a `stats` event with the NIC's counters too
//! ([`crate::event`]), every [`LOG_INTERVAL`] when the work counters changed.

use alloc::rc::Rc;
use alloc::string::String;
use alloc::vec::Vec;
use core::time::Duration;

use block::BlockDevice;
use vfs::FileSystem;

use crate::net::listener::Listener;
use crate::net::stats_port::{PortStats, Source};
use crate::report::{
    AccessReport, CpuReport, DeviceReport, FsReport, HeapReport, NicReport, NinepReport,
    PowerReport, ServingReport, Snapshot,
};
use crate::storage::{DeviceName, InjectedFaults, ServedFs};
use crate::{clock, hal, smp, task};
use alloc::string::ToString;

/// How often the `stats:` line is logged (when something changed).
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// What a served filesystem adds to a snapshot.
#[allow(async_fn_in_trait)]
pub trait Reporting {
    /// The block devices it uses.
    fn devices(&self) -> Vec<DeviceReport>;
    /// Its counters and state, if it keeps any.
    async fn fs_report(&self) -> Option<FsReport>;
}

impl<F: Reporting> Reporting for ninep::admin::AdminFs<F> {
    fn devices(&self) -> Vec<DeviceReport> {
        self.inner().devices()
    }

    async fn fs_report(&self) -> Option<FsReport> {
        self.inner().fs_report().await
    }
}

impl<D: BlockDevice + DeviceName + InjectedFaults> Reporting for ServedFs<D> {
    fn devices(&self) -> Vec<DeviceReport> {
        let disk = *self.device();
        let g = disk.geometry();
        let counters = disk.counters();
        alloc::vec![DeviceReport {
            name: disk.inner().device_name(),
            block_size: g.block_size,
            blocks: g.num_blocks,
            native_fua: g.native_fua,
            volatile_cache: g.volatile_cache,
            counters,
            device_flushes: counters.device_flushes(&g),
            injected_faults: disk.inner().injected_faults(),
        }]
    }

    async fn fs_report(&self) -> Option<FsReport> {
        let sb = self.superblock();
        let label_end = sb
            .label
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(sb.label.len());
        let statfs = self.statfs().await.ok();
        let (cache_bytes, cache_nodes) = self.cache_usage();
        Some(FsReport {
            label: String::from_utf8_lossy(&sb.label[..label_end]).into(),
            size_bytes: sb.layout.total_blocks * ninefs::format::BLOCK_SIZE as u64,
            free_bytes: statfs.map_or(0, |s| s.blocks_free * u64::from(s.block_size)),
            cache_bytes: cache_bytes as u64,
            cache_nodes: cache_nodes as u64,
            // The monitor knows the limit it mounted with.
            cache_limit: 0,
            stats: self.stats(),
        })
    }
}

/// The appliance's counters, as served and logged.
pub struct Monitor<F: FileSystem + Reporting + 'static> {
    listener: Rc<Listener<F>>,
    cache_limit: u64,
    port_stats: Rc<PortStats>,
}

impl<F: FileSystem + Reporting + 'static> core::fmt::Debug for Monitor<F> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Monitor").finish_non_exhaustive()
    }
}

impl<F: FileSystem + Reporting + 'static> Monitor<F> {
    /// A monitor of `service`, the filesystem it serves (whose node cache is limited
    /// to `cache_limit` bytes, 0 if it has none) and the counters port (`port_stats`).
    pub fn new(
        listener: Rc<Listener<F>>,
        cache_limit: usize,
        port_stats: Rc<PortStats>,
    ) -> Rc<Self> {
        Rc::new(Monitor {
            listener,
            cache_limit: cache_limit as u64,
            port_stats,
        })
    }

    /// Logs a `stats:` line and emits a `stats` event every [`LOG_INTERVAL`] when a
    /// counter changed.
    pub async fn log_periodically(self: Rc<Self>) {
        let mut last = String::new();
        loop {
            task::sleep(LOG_INTERVAL).await;
            let s = self.snapshot().await;
            // Logged when the work counters changed; the clock and the heap always do.
            let key = Snapshot {
                uptime_ms: 0,
                idle_ms: 0,
                cpus: Vec::new(),
                nic: NicReport::default(),
                heap: HeapReport::default(),
                ..s.clone()
            }
            .json();
            if key != last {
                log::info!("stats: {}", s.json());
                crate::event::emit(crate::event::Event::Stats {
                    counters: &s,
                    nic: self.listener.stack().nic_counters().counts(),
                });
                last = key;
            }
        }
    }
}

impl<F: FileSystem + Reporting + 'static> Source for Monitor<F> {
    async fn snapshot(&self) -> Snapshot {
        let fs = self.listener.server().fs();
        let conns = self.listener.service().stats();
        let heap = hal::heap::stats();
        let mut fs_report = fs.fs_report().await;
        if let Some(r) = fs_report.as_mut() {
            r.cache_limit = self.cache_limit;
        }
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
                NicReport {
                    notifications,
                    notifications_suppressed,
                }
            },
            devices: fs.devices(),
            fs: fs_report,
            ninep: Some(NinepReport {
                connections: conns.active(),
                accepted: conns.accepted.get(),
                shed: conns.shed.get(),
                refused: conns.refused.get(),
                syns_held: self.listener.stack().syn_gate().held(),
                rx_bytes: conns.rx_bytes(),
                tx_bytes: conns.tx_bytes(),
                server: self.listener.server().stats(),
                timings: self.listener.server().timings(),
                requests: self.listener.server().request_stats(),
                memory: self.listener.server().memory(),
            }),
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
