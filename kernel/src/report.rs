//! The operator's view of a running appliance: a [`Snapshot`] of the counters that say
//! what it did — device requests (bytes, writes, FUA writes, flushes), filesystem work
//! (commits, checkpoints and node writes per cause), 9P requests (fsyncs acknowledged),
//! memory — and its formats:
//!
//! - one JSON document (the counters service, the `stats` event, and the `stats:` line
//!   at `log=debug`);
//! - `/sys/block/DEV/stat`-style lines (its 17 fields and an 18th, FUA writes, as the
//!   guest harness reports Linux disks), so scripts that judge Linux disks by their
//!   block-layer counters read the appliance's the same way;
//! - the Prometheus text format, made from the JSON document by the walk of
//!   [`metrics::document`] and the rules of [`METRICS`] (so every counter of the
//!   document is a metric, with no second list of fields).
//!
//! The counters service (`stats=PORT`, `kernel/src/net/stats_port.rs`) answers one
//! request per connection in the protocol of `metrics::endpoint` (shared with
//! `ninefold serve --stats`), for which a [`Snapshot`] is a `Report`.
//!
//! Pure (host-tested); the appliance fills the snapshot.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;

use metrics::document::{Rule, Schema};
pub use ninefs::surface::report::FsReport;
pub use ninep::service::report::NinepReport;
use serde::Serialize;

use block::{DeviceCounters, FaultCounters};

/// Everything the appliance counts, at one moment.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Snapshot {
    /// Milliseconds since boot.
    pub uptime_ms: u64,
    /// Milliseconds the boot CPU (which runs the network stack, and serves 9P connections
    /// as the others do) was idle (halted) since boot: `1 - idle/uptime` is how busy it
    /// was; each CPU's is under `cpus`.
    pub idle_ms: u64,
    /// Every CPU online, by index.
    pub cpus: Vec<CpuReport>,
    /// The network interface: frames, offloads, queue notifications.
    pub nic: NicReport,
    /// The block devices in use.
    pub devices: Vec<DeviceReport>,
    /// The mounted filesystem (absent when none is mounted, e.g. `fs=memory`).
    pub fs: Option<FsReport>,
    /// The 9P service (absent before it starts).
    #[serde(rename = "9p")]
    pub ninep: Option<NinepReport>,
    /// The 9P listener's pool and the SYN gate in front of it (`9p.syns_held` counts
    /// the requests it held back).
    pub listener: ListenerReport,
    /// The kernel heap.
    pub heap: HeapReport,
    /// Clients refused by the allow-lists.
    pub access: AccessReport,
    /// The ACPI power button and the shutdown it starts.
    pub power: PowerReport,
}

/// The virtio-net device: its frame counters (`net::stats`), the offloads negotiated
/// (`net::offload`) and its queue notifications (`hal/virtio/event_idx.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NicReport {
    /// Frames and bytes each way, checksums and segmentation.
    #[serde(flatten)]
    pub counts: crate::net::stats::NicCounts,
    /// The checksum and segmentation offloads in effect (`offload=`).
    pub offloads: crate::net::offload::Offloads,
    /// Notifications (trapped MMIO writes) sent to the device.
    pub notifications: u64,
    /// Notifications skipped because the device had not asked for them
    /// (`VIRTIO_F_EVENT_IDX`).
    pub notifications_suppressed: u64,
}

/// One CPU (`kernel/src/smp`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CpuReport {
    /// Its index (0: the boot CPU), the label of its metrics.
    pub cpu: String,
    /// Its local APIC id.
    pub apic_id: u8,
    /// Milliseconds it was idle (halted) since boot.
    pub idle_ms: u64,
    /// Tasks other CPUs sent it (`smp::spawn_on`).
    pub remote_tasks: u64,
    /// Its TSC against CPU 0's, checked when it came up (`clock::skew`).
    pub tsc: crate::clock::skew::TscCheck,
    /// How wakes from other CPUs reached it: IPIs sent, and not needed because it was
    /// running (`exec::HaltGate`).
    pub wakes: crate::exec::WakeStats,
    /// The 9P connections it serves (`serve_cpus=`).
    pub serving: ServingReport,
}

/// The 9P connections one CPU serves (`ninep::service::stats::WorkerServing`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ServingReport {
    /// Connections it serves now.
    pub connections: u64,
    /// Connections handed to it since boot.
    pub accepted: u64,
    /// Bytes its connections received from their clients.
    pub rx_bytes: u64,
    /// Bytes its connections sent to their clients.
    pub tx_bytes: u64,
}

/// The ACPI power button and the clean shutdown it starts (`kernel/src/power`,
/// `kernel/src/shutdown.rs`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct PowerReport {
    /// The power button is armed (ACPI fixed hardware found, SCI routed).
    pub button_armed: bool,
    /// SCIs taken.
    pub sci_interrupts: u64,
    /// Power-button presses seen; the first starts the shutdown.
    pub button_presses: u64,
    /// The shutdown.
    pub shutdown: ShutdownReport,
}

/// The shutdown after a power-button press.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ShutdownReport {
    /// A shutdown is under way.
    pub started: bool,
    /// Presses while it was under way (ignored).
    pub ignored_presses: u64,
    /// 9P connections it closed politely (their requests in flight answered first).
    pub connections_closed: u64,
    /// 9P connections it shed because they had not finished within the grace time.
    pub connections_reset: u64,
    /// It ran out of time (`shutdown_timeout=`) and powered off anyway.
    pub timed_out: bool,
}

/// One block device: what it is and what was asked of it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DeviceReport {
    /// Short name, no spaces: kind and PCI address, e.g. `nvme@00:04.0`.
    pub name: String,
    /// Logical block size in bytes.
    pub block_size: u32,
    /// Capacity in logical blocks.
    pub blocks: u64,
    /// The device does FUA itself (else a FUA write costs a write and a flush).
    pub native_fua: bool,
    /// The device has a volatile write cache (flushes do work).
    pub volatile_cache: bool,
    /// Requests as issued by the filesystem.
    pub counters: DeviceCounters,
    /// Flushes the device performs: `counters.flushes`, plus one per FUA write when FUA
    /// is emulated.
    pub device_flushes: u64,
    /// What the fault injector did (`fault=` on the command line); absent when unarmed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub injected_faults: Option<FaultCounters>,
    /// A mirror's legs (`disk=A,B`), in their places; absent for a single device.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub legs: Vec<LegReport>,
}

/// One leg of a mirrored volume.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LegReport {
    /// Its place in the volume (`0`, `1`, ...): the metrics' `leg` label.
    pub leg: String,
    /// The device in that place (`nvme@00:04.0`), `missing` when none came up.
    pub device: String,
    /// `active`, `rebuilding` (written, not read: being copied onto after `ctl
    /// replace`), `failed` (taken out of service) or `missing`.
    pub state: &'static str,
    /// 1 while the leg is in service (every write reaches it), else 0.
    pub in_service: u64,
    /// Reads that failed on it.
    pub read_errors: u64,
    /// Writes and flushes that failed on it.
    pub write_errors: u64,
    /// Blocks read bad from it (an error or a wrong checksum) and rewritten with a good
    /// copy from another leg.
    pub repairs: u64,
}

/// The 9P listener's pool of listening sockets and its SYN gate (`net/listener.rs`,
/// `net/syn_gate.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ListenerReport {
    /// Sockets in the pool when the listener last armed the gate.
    pub pool: u64,
    /// Of them, those listening (the others are mid-handshake).
    pub listening: u64,
    /// Connection requests the gate keeps now, waiting for a listening socket.
    pub backlog: u64,
    /// Connection requests (SYN without ACK) that reached the 9P port.
    pub syns: u64,
    /// Requests held back and kept that went in later, once a socket listened.
    pub syns_replayed: u64,
    /// Requests held back but not kept (the backlog full, or a SYN carrying data): their
    /// clients retransmit.
    pub syns_dropped: u64,
    /// Requests the stack found no listening socket for, answered with a reset (none
    /// while a pool exists: the gate holds them back).
    pub syns_refused: u64,
}

/// Clients refused by the allow-lists (`allow=`, an export's `allow=`, `stats_allow=`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct AccessReport {
    /// Counters-port connections reset: the client is not in `stats_allow=`. (The 9P
    /// service's refusals, `refused_connections` and `refused_attaches`, are counters of
    /// the 9P server: see [`NinepReport`].)
    pub refused_stats: u64,
}

/// The kernel heap.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct HeapReport {
    /// Bytes the heap manages.
    pub bytes: u64,
    /// Bytes in live allocations.
    pub allocated: u64,
    /// Bytes of freed small blocks in the free lists all CPUs share (`mm::heap`'s
    /// depot); free for allocation.
    pub recycled: u64,
    /// Bytes of freed small blocks in the CPUs' own caches; free for allocation.
    pub cpu_cached: u64,
    /// Allocations that refilled their CPU's cache (each one take of the global heap lock).
    pub cpu_refills: u64,
    /// Frees that found their CPU's cache full and gave blocks back (each one take of
    /// the global heap lock).
    pub cpu_flushes: u64,
    /// Times every cache went back to the allocator because an allocation would
    /// otherwise have failed.
    pub drains: u64,
}

impl Snapshot {
    /// The snapshot as one line of JSON.
    pub fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The snapshot without what moves on an idle appliance — the clock, idle times and
    /// per-CPU counters, the NIC's frames (DHCP renewals, ARP), the heap, the filesystem
    /// lock's takes (housekeeping takes it every few seconds) — as JSON: when it differs
    /// from an earlier one, something happened (a request, a connection, a refusal, a
    /// device request, a scrub step).
    pub fn activity_key(&self) -> String {
        let mut quiet = Snapshot {
            uptime_ms: 0,
            idle_ms: 0,
            cpus: Vec::new(),
            nic: NicReport::default(),
            heap: HeapReport::default(),
            ..self.clone()
        };
        if let Some(fs) = &mut quiet.fs {
            fs.stats.core_lock = Default::default();
        }
        quiet.json()
    }

    /// One `/sys/block/DEV/stat`-style line per device: the name, then the 17 fields of
    /// Linux's file (read I/Os, merges, sectors, ms; write I/Os, merges, sectors, ms; in
    /// flight, I/O ms, queue ms; discard I/Os, merges, sectors, ms; flushes, flush ms)
    /// and an 18th, FUA writes (the guest harness appends the same for Linux disks).
    /// Sectors are 512 bytes; merges and queue times are 0 (there is no merging block
    /// layer); flushes are those the device performs (emulated FUA included, as Linux
    /// counts them).
    pub fn sysfs_lines(&self) -> String {
        let mut out = String::new();
        for d in &self.devices {
            let c = &d.counters;
            let ms = |ns: u64| ns / 1_000_000;
            let discard_sectors = c.blocks_discarded * u64::from(d.block_size) / 512;
            let _ = writeln!(
                out,
                "{} {} 0 {} {} {} 0 {} {} 0 0 0 {} 0 {} {} {} {} {}",
                d.name,
                c.reads,
                c.bytes_read / 512,
                ms(c.read_ns),
                c.writes,
                c.bytes_written / 512,
                ms(c.write_ns),
                c.discards,
                discard_sectors,
                ms(c.discard_ns),
                d.device_flushes,
                ms(c.flush_ns),
                c.fua_writes,
            );
        }
        out
    }
}

/// The work counters: what clients asked of the appliance, as the status line reports
/// it. Only 9P requests served, bytes received from and sent to clients, and fsyncs
/// acknowledged count as work; what the appliance does on its own (housekeeping
/// commits, the filesystem lock's takes, timer ticks, DHCP, scrub) does not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// When it was read, milliseconds since boot.
    pub uptime_ms: u64,
    /// 9P requests received.
    pub requests: u64,
    /// Bytes received from 9P clients.
    pub rx_bytes: u64,
    /// Bytes sent to 9P clients.
    pub tx_bytes: u64,
    /// `Tfsync`s acknowledged.
    pub fsyncs: u64,
    /// The latencies of the `Tfsync`s answered.
    pub fsync_latency: metrics::LatencyHistogram,
    /// 9P connections open (a gauge: not work).
    pub connections: u64,
}

impl Work {
    /// The work counters of `s`.
    pub fn of(s: &Snapshot) -> Work {
        let Some(p) = &s.ninep else {
            return Work {
                uptime_ms: s.uptime_ms,
                ..Work::default()
            };
        };
        Work {
            uptime_ms: s.uptime_ms,
            requests: p.server.requests,
            rx_bytes: p.rx_bytes,
            tx_bytes: p.tx_bytes,
            fsyncs: p.server.fsyncs,
            fsync_latency: *p.requests.latency(ninep::wire::TmsgType::Fsync as u8),
            connections: p.connections,
        }
    }

    /// Whether clients asked for anything since `earlier`.
    pub fn changed_since(&self, earlier: &Work) -> bool {
        (self.requests, self.rx_bytes, self.tx_bytes, self.fsyncs)
            != (
                earlier.requests,
                earlier.rx_bytes,
                earlier.tx_bytes,
                earlier.fsyncs,
            )
    }

    /// The console's status line for the work done since `earlier` (one line, under 160
    /// characters), or `None` if there was none:
    ///
    /// `serving: 120 ops/s, in 1.5 MiB/s, out 0.2 MiB/s, 3 fsyncs/s (p99 <= 10 ms), 2 connections`
    ///
    /// Rates are over the time between the two; "in" is what clients sent (writes),
    /// "out" what they were sent (reads); the fsync p99 is the bucket bound of the
    /// latency histogram (`metrics::histogram::BOUNDS_NS`) at or below which 99 % of the
    /// fsyncs answered in between took, and is left out when there were none.
    pub fn status_line(&self, earlier: &Work) -> Option<String> {
        if !self.changed_since(earlier) {
            return None;
        }
        let ms = self.uptime_ms.saturating_sub(earlier.uptime_ms).max(1);
        let per_s = |n: u64| n as f64 * 1000.0 / ms as f64;
        let mib_s = |b: u64| per_s(b) / (1u64 << 20) as f64;
        let mut line = format!(
            "serving: {:.0} ops/s, in {:.1} MiB/s, out {:.1} MiB/s",
            per_s(self.requests.saturating_sub(earlier.requests)),
            mib_s(self.rx_bytes.saturating_sub(earlier.rx_bytes)),
            mib_s(self.tx_bytes.saturating_sub(earlier.tx_bytes)),
        );
        let fsyncs = self.fsyncs.saturating_sub(earlier.fsyncs);
        if fsyncs > 0 {
            let _ = write!(line, ", {:.1} fsyncs/s", per_s(fsyncs));
            if let Some(p99) = p99_ns(&self.fsync_latency, &earlier.fsync_latency) {
                let _ = write!(line, " (p99 {})", bound_text(p99));
            }
        }
        let _ = write!(
            line,
            ", {} connection{}",
            self.connections,
            if self.connections == 1 { "" } else { "s" }
        );
        Some(line)
    }
}

/// The bound (ns; `None`: above the last bound) at or below which 99 % of the
/// observations of `now` that `earlier` did not have fell; `None` as well if there were
/// none.
fn p99_ns(
    now: &metrics::LatencyHistogram,
    earlier: &metrics::LatencyHistogram,
) -> Option<Option<u64>> {
    let mut buckets = [0u64; metrics::histogram::BUCKETS];
    for (i, b) in buckets.iter_mut().enumerate() {
        *b = now.buckets[i].saturating_sub(earlier.buckets[i]);
    }
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    // The smallest bucket whose cumulative count reaches 99 % (rounded up).
    let want = (total * 99).div_ceil(100);
    let mut seen = 0;
    for (i, b) in buckets.iter().enumerate() {
        seen += b;
        if seen >= want {
            return Some(metrics::histogram::BOUNDS_NS.get(i).copied());
        }
    }
    Some(None)
}

/// `<= 10 ms`, `<= 250 us`, `<= 2.5 s`, or `> 10 s` (past the last bound).
fn bound_text(bound: Option<u64>) -> String {
    match bound {
        Some(ns) if ns < 1_000_000 => format!("<= {} us", ns / 1_000),
        Some(ns) if ns < 1_000_000_000 => format!("<= {} ms", fmt_decimal(ns, 1_000_000)),
        Some(ns) => format!("<= {} s", fmt_decimal(ns, 1_000_000_000)),
        None => format!(
            "> {} s",
            metrics::histogram::BOUNDS_NS[metrics::histogram::BOUNDS_NS.len() - 1] / 1_000_000_000
        ),
    }
}

/// `ns / unit` with one decimal when it has one (`2.5`, `10`).
fn fmt_decimal(ns: u64, unit: u64) -> String {
    let tenths = ns * 10 / unit;
    if tenths.is_multiple_of(10) {
        format!("{}", tenths / 10)
    } else {
        format!("{}.{}", tenths / 10, tenths % 10)
    }
}

/// How the metrics of `/metrics` are named from the JSON document (see
/// [`metrics::document`]): what the paths alone do not say — gauges, labels, names in
/// the node_exporter style, help texts. A counter without a rule is still exposed, as
/// `ninefold_<path>_total`.
pub const METRICS: Schema<'static> = Schema {
    prefix: "ninefold",
    rules: &[
        KERNEL_RULES,
        ninefs::surface::report::METRIC_RULES,
        ninep::service::report::METRIC_RULES,
    ],
};

/// The rules of the appliance's own parts of the document (clock, NIC, CPUs, devices,
/// heap, access, power); the filesystem's and the 9P service's are defined beside their
/// counters.
const KERNEL_RULES: &[Rule] = &[
    Rule::gauge("uptime_ms")
        .named("uptime_seconds")
        .help("Time since boot."),
    Rule::counter("idle_ms")
        .named("idle_seconds")
        .help("Time the boot CPU was idle (halted): 1 - rate() of it is how busy it is (every CPU: cpu_idle_seconds)."),
    Rule::gauge("nic.rx_longest")
        .named("nic_rx_longest_frame_bytes")
        .help("Longest frame the NIC received (above 1514: jumbo frames)."),
    Rule::gauge("nic.offloads.csum")
        .named("nic_offload_tx_checksum")
        .help("1 if the NIC completes the TCP checksums of frames sent (VIRTIO_NET_F_CSUM)."),
    Rule::gauge("nic.offloads.guest_csum")
        .named("nic_offload_rx_checksum")
        .help("1 if the NIC may vouch for the checksums of frames received (VIRTIO_NET_F_GUEST_CSUM)."),
    Rule::gauge("nic.offloads.tso4")
        .named("nic_offload_tso")
        .help("1 if the NIC segments large TCP/IPv4 frames sent (VIRTIO_NET_F_HOST_TSO4)."),
    Rule::counter("nic.notifications")
        .named("nic_notifications")
        .help("Queue notifications written to the virtio-net device (each a trapped MMIO write)."),
    Rule::counter("nic.notifications_suppressed")
        .named("nic_notifications_suppressed")
        .help("Queue notifications skipped because the device had not asked for them (event index)."),
    // The 9P listener and its SYN gate.
    Rule::gauge("listener.pool")
        .named("9p_listen_pool_sockets")
        .help("Sockets in the 9P listener's pool (listening or mid-handshake)."),
    Rule::gauge("listener.listening")
        .named("9p_listen_pool_listening")
        .help("Sockets of the 9P listener's pool waiting for a client."),
    Rule::gauge("listener.backlog")
        .named("9p_syn_backlog")
        .help("Connection requests to the 9P port kept until a socket listens for them."),
    Rule::counter("listener.syns")
        .named("9p_syns")
        .help("Connection requests (SYN) that reached the 9P port."),
    Rule::counter("listener.syns_replayed")
        .named("9p_syns_replayed")
        .help("Connection requests to the 9P port held back, kept, and let in once a socket listened."),
    Rule::counter("listener.syns_dropped")
        .named("9p_syns_dropped")
        .help("Connection requests to the 9P port held back but not kept (backlog full): their clients retransmit."),
    Rule::counter("listener.syns_refused")
        .named("9p_syns_refused")
        .help("Connection requests to the 9P port answered with a reset: no socket listened."),
    // CPUs, labelled by index.
    Rule::elements("cpus", "cpu", "cpu").named("cpu"),
    Rule::gauge("cpus.*.apic_id")
        .named("cpu_apic_id")
        .help("Local APIC id of the CPU."),
    Rule::counter("cpus.*.idle_ms")
        .named("cpu_idle_seconds")
        .help("Time the CPU was idle (halted): 1 - rate() of it is how busy it is."),
    Rule::counter("cpus.*.remote_tasks")
        .named("cpu_remote_tasks")
        .help("Tasks other CPUs sent this CPU to run."),
    Rule::gauge("cpus.*.tsc.bound_ns")
        .named("cpu_tsc_skew_bound_seconds")
        .help("How far the CPU's clock may be from CPU 0's (the TSC check at its bring-up, after any correction)."),
    Rule::gauge("cpus.*.tsc.corrected")
        .named("cpu_tsc_corrected")
        .help("1 if the CPU's TSC was found offset from CPU 0's and is corrected in the clock."),
    Rule::counter("cpus.*.wakes.ipis")
        .named("cpu_wake_ipis")
        .help("Wake-up IPIs sent to the CPU (it was halted when another CPU gave it work)."),
    Rule::counter("cpus.*.wakes.ipis_skipped")
        .named("cpu_wake_ipis_skipped")
        .help("Wakes from other CPUs that needed no IPI (the CPU was running)."),
    Rule::gauge("cpus.*.serving.connections")
        .named("cpu_9p_connections")
        .help("9P connections the CPU serves now."),
    Rule::counter("cpus.*.serving.accepted")
        .named("cpu_9p_accepted")
        .help("9P connections handed to the CPU since boot."),
    Rule::counter("cpus.*.serving.rx_bytes")
        .named("cpu_9p_received_bytes")
        .help("Bytes the CPU's 9P connections received from their clients."),
    Rule::counter("cpus.*.serving.tx_bytes")
        .named("cpu_9p_sent_bytes")
        .help("Bytes the CPU's 9P connections sent to their clients."),
    // Devices, labelled by name (`nvme@00:04.0`, `virtio@00:05.0`, `ram`).
    Rule::elements("devices", "device", "name").named("device"),
    Rule::rename("devices.*.counters", ""),
    Rule::gauge("devices.*.block_size")
        .named("device_block_size_bytes")
        .help("Logical block size of the device."),
    Rule::gauge("devices.*.blocks")
        .named("device_blocks")
        .help("Capacity of the device in logical blocks."),
    Rule::counter("devices.*.device_flushes")
        .named("device_flushes")
        .help("Cache flushes the device performed: FLUSH requests, plus one per FUA write where FUA is emulated."),
    Rule::counter("devices.*.counters.flushes")
        .named("device_flush_requests")
        .help("FLUSH requests the filesystem issued to the device."),
    Rule::histogram("devices.*.counters.flush_latency")
        .named("device_flush_duration_seconds")
        .help("Time from submission to completion of the device's FLUSH requests."),
    Rule::counter("devices.*.counters.errors").help("Device requests that failed."),
    // A mirror's legs, labelled by place (`leg="0"`) within the mirror's device.
    Rule::elements("devices.*.legs", "leg", "leg").named("leg"),
    Rule::gauge("devices.*.legs.*.in_service")
        .named("device_leg_in_service")
        .help("1 while the mirror's leg is in service (every write reaches it); 0 once failed or missing."),
    Rule::counter("devices.*.legs.*.read_errors")
        .named("device_leg_read_errors")
        .help("Reads that failed on the mirror's leg (served from another leg)."),
    Rule::counter("devices.*.legs.*.write_errors")
        .named("device_leg_write_errors")
        .help("Writes and flushes that failed on the mirror's leg (it is taken out of service)."),
    Rule::counter("devices.*.legs.*.repairs")
        .named("device_leg_repairs")
        .help("Blocks read bad from the mirror's leg and rewritten with a good copy from another."),
    // The kernel.
    Rule::gauge("heap.bytes")
        .named("heap_size_bytes")
        .help("Bytes the kernel heap manages."),
    Rule::gauge("heap.allocated")
        .named("heap_allocated_bytes")
        .help("Bytes in live kernel heap allocations."),
    Rule::gauge("heap.recycled")
        .named("heap_recycled_bytes")
        .help("Bytes of freed small blocks in the kernel heap's shared free lists (free for allocation)."),
    Rule::gauge("heap.cpu_cached")
        .named("heap_cpu_cached_bytes")
        .help("Bytes of freed small blocks in the kernel heap's per-CPU caches (free for allocation)."),
    Rule::counter("heap.cpu_refills")
        .named("heap_cpu_refills")
        .help("Allocations that refilled their CPU's heap cache: takes of the global heap lock."),
    Rule::counter("heap.cpu_flushes")
        .named("heap_cpu_flushes")
        .help("Frees that found their CPU's heap cache full and gave blocks back: takes of the global heap lock."),
    Rule::counter("heap.drains")
        .named("heap_drains")
        .help("Times every heap cache went back to the allocator because an allocation would have failed."),
    Rule::counter("access.refused_stats")
        .named("stats_connections_refused")
        .help("Counters-port connections reset: the client is not in stats_allow=."),

];

impl Snapshot {
    /// The snapshot in the Prometheus text format (version 0.0.4).
    pub fn metrics(&self) -> String {
        let document = match serde_json::to_value(self) {
            Ok(v) => v,
            Err(e) => return format!("# the counters could not be serialised: {e}\n"),
        };
        let walk = METRICS.walk(&document);
        for refused in &walk.refused {
            log::warn!("stats: metric left out: {refused}");
        }
        walk.exposition.render()
    }
}

impl metrics::endpoint::Report for Snapshot {
    fn json(&self) -> String {
        Snapshot::json(self)
    }

    fn stat_lines(&self) -> String {
        self.sysfs_lines()
    }

    fn prometheus(&self) -> String {
        self.metrics()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(uptime_ms: u64, requests: u64, rx: u64, tx: u64, fsync_ms: &[u64]) -> Work {
        let mut fsync_latency = metrics::LatencyHistogram::default();
        for ms in fsync_ms {
            fsync_latency.record(ms * 1_000_000);
        }
        Work {
            uptime_ms,
            requests,
            rx_bytes: rx,
            tx_bytes: tx,
            fsyncs: fsync_ms.len() as u64,
            fsync_latency,
            connections: 2,
        }
    }

    #[test]
    fn no_status_line_without_work() {
        let before = work(60_000, 100, 4096, 8192, &[3]);
        let mut after = before;
        after.uptime_ms = 120_000;
        after.connections = 5;
        assert_eq!(
            after.status_line(&before),
            None,
            "connections alone are not work"
        );
    }

    #[test]
    fn the_status_line_is_short_and_says_the_rates() {
        let before = work(60_000, 0, 0, 0, &[]);
        let fsyncs: Vec<u64> = (0..99).map(|_| 1).chain([40]).collect();
        let after = work(120_000, 6_000, 120 << 20, 6 << 20, &fsyncs);
        let line = after.status_line(&before).unwrap();
        assert_eq!(
            line,
            "serving: 100 ops/s, in 2.0 MiB/s, out 0.1 MiB/s, 1.7 fsyncs/s (p99 <= 1 ms), 2 connections"
        );
        assert!(line.len() < 160 && !line.contains('\n'));
        let slow = work(120_000, 10, 0, 0, &[3_000, 20_000]);
        let line = slow.status_line(&before).unwrap();
        assert!(line.contains("(p99 > 10 s)"), "{line}");
        let reads = work(61_000, 1, 0, 100, &[]);
        let line = reads.status_line(&before).unwrap();
        assert!(!line.contains("fsync"), "{line}");
        assert_eq!(bound_text(Some(2_500_000)), "<= 2.5 ms");
        assert_eq!(bound_text(Some(250_000)), "<= 250 us");
        assert_eq!(bound_text(Some(2_500_000_000)), "<= 2.5 s");
    }

    #[test]
    fn the_activity_key_ignores_what_moves_when_idle() {
        let mut fs = FsReport::default();
        let a = Snapshot {
            fs: Some(fs.clone()),
            ..Snapshot::default()
        };
        fs.stats.core_lock.acquisitions = 7;
        let b = Snapshot {
            uptime_ms: 10_000,
            idle_ms: 9_000,
            fs: Some(fs),
            ..Snapshot::default()
        };
        assert_eq!(a.activity_key(), b.activity_key());
        let c = Snapshot {
            access: AccessReport { refused_stats: 1 },
            ..Snapshot::default()
        };
        assert_ne!(Snapshot::default().activity_key(), c.activity_key());
    }
    use alloc::string::ToString;
    use ninefs::core::counters::FsStats;
    use ninefs::synclog::build::Fallback;
    use ninefs::volume::CheckpointCause;

    fn snapshot() -> Snapshot {
        let mut stats = FsStats::default();
        stats.checkpoints[1] = 7;
        stats.log.commits = 3;
        stats.node_writes.writes[3] = 5;
        stats.node_writes.bytes[3] = 20480;
        Snapshot {
            uptime_ms: 1234,
            idle_ms: 1000,
            nic: NicReport {
                counts: crate::net::stats::NicCounts {
                    tx_frames: 20,
                    tx_bytes: 1 << 20,
                    tx_gso_frames: 16,
                    tx_gso_segments: 719,
                    rx_longest: 1514,
                    ..Default::default()
                },
                offloads: crate::net::offload::Offloads {
                    csum: true,
                    guest_csum: true,
                    tso4: false,
                },
                notifications: 10,
                notifications_suppressed: 30,
            },
            cpus: alloc::vec![
                CpuReport {
                    cpu: "0".to_string(),
                    apic_id: 0,
                    idle_ms: 1000,
                    remote_tasks: 0,
                    ..CpuReport::default()
                },
                CpuReport {
                    cpu: "1".to_string(),
                    apic_id: 2,
                    idle_ms: 2500,
                    remote_tasks: 1,
                    tsc: crate::clock::skew::TscCheck {
                        offset_ns: -40,
                        bound_ns: 1500,
                        corrected: false,
                    },
                    wakes: crate::exec::WakeStats {
                        ipis: 3,
                        ipis_skipped: 9,
                    },
                    serving: ServingReport {
                        connections: 2,
                        accepted: 5,
                        rx_bytes: 700,
                        tx_bytes: 900,
                    },
                },
            ],
            devices: alloc::vec![DeviceReport {
                name: "nvme@00:04.0".to_string(),
                block_size: 512,
                blocks: 1 << 21,
                native_fua: true,
                volatile_cache: true,
                counters: DeviceCounters {
                    reads: 3,
                    bytes_read: 3 * 4096,
                    writes: 10,
                    bytes_written: 10 * 4096,
                    fua_writes: 2,
                    flushes: 4,
                    discards: 1,
                    blocks_discarded: 16,
                    write_ns: 5_000_000,
                    ..DeviceCounters::default()
                },
                device_flushes: 4,
                injected_faults: None,
                legs: alloc::vec![
                    LegReport {
                        leg: "0".to_string(),
                        device: "nvme@00:04.0".to_string(),
                        state: "active",
                        in_service: 1,
                        repairs: 5,
                        ..LegReport::default()
                    },
                    LegReport {
                        leg: "1".to_string(),
                        device: "missing".to_string(),
                        state: "missing",
                        ..LegReport::default()
                    },
                ],
            }],
            fs: Some(FsReport {
                label: "data".to_string(),
                stats,
                ..FsReport::default()
            }),
            ninep: Some(NinepReport {
                server: ninep::server::Stats {
                    fsyncs: 7,
                    ..Default::default()
                },
                ..NinepReport::default()
            }),
            listener: ListenerReport {
                pool: 6,
                listening: 2,
                backlog: 3,
                syns: 9,
                syns_replayed: 4,
                syns_dropped: 0,
                syns_refused: 1,
            },
            heap: HeapReport::default(),
            access: AccessReport { refused_stats: 2 },
            power: PowerReport {
                button_armed: true,
                sci_interrupts: 2,
                button_presses: 2,
                shutdown: ShutdownReport {
                    started: true,
                    ignored_presses: 1,
                    connections_closed: 3,
                    ..ShutdownReport::default()
                },
            },
        }
    }

    #[test]
    fn json_names_every_cause() {
        let j = snapshot().json();
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["devices"][0]["counters"]["bytes_written"], 40960);
        assert_eq!(v["devices"][0]["device_flushes"], 4);
        assert_eq!(v["devices"][0]["legs"][1]["state"], "missing");
        assert_eq!(v["fs"]["checkpoints"]["fsync_fallback"], 7);
        assert_eq!(v["fs"]["checkpoints"]["sync"], 0);
        assert_eq!(v["fs"]["node_writes"]["sync"]["bytes"], 20480);
        assert_eq!(v["9p"]["fsyncs"], 7);
        assert_eq!(v["9p"]["write_ns"], 0);
        assert_eq!(v["9p"]["memory"]["charged"]["fids"], 0);
        assert_eq!(v["access"]["refused_stats"], 2);
        assert_eq!(v["listener"]["syns_refused"], 1);
        assert_eq!(v["power"]["button_presses"], 2);
        assert_eq!(v["power"]["shutdown"]["ignored_presses"], 1);
        assert_eq!(v["power"]["shutdown"]["connections_closed"], 3);
        assert_eq!(v["power"]["shutdown"]["timed_out"], false);
        assert_eq!(v["9p"]["refused_attaches"], 0);
        assert_eq!(
            v["fs"]["checkpoints"].as_object().unwrap().len(),
            CheckpointCause::ALL.len()
        );
        assert_eq!(v["fs"]["log"]["commits"], 3);
        assert_eq!(
            v["fs"]["log"]["fallbacks"].as_object().unwrap().len(),
            Fallback::ALL.len()
        );
        // The seed refinements' counters reach the document.
        assert_eq!(v["fs"]["log"]["csum_lookups_skipped"], 0);
        assert_eq!(v["fs"]["log"]["xattr_searches_skipped"], 0);
        assert_eq!(v["fs"]["log"]["scratch_reused"], 0);
        assert_eq!(v["fs"]["node_appends"], 0);
        assert!(!j.contains('\n'), "one log line");
    }

    #[test]
    fn metrics_name_every_counter_in_base_units() {
        let mut s = snapshot();
        s.devices[0].counters.flush_latency.record(120_000);
        s.devices[0].counters.flush_latency.record(3_000_000);
        let document = serde_json::to_value(&s).unwrap();
        let walk = METRICS.walk(&document);
        assert_eq!(walk.refused, [], "every rule names a distinct metric");
        let text = walk.exposition.render();
        let dev = "device=\"nvme@00:04.0\"";
        for line in [
            "ninefold_uptime_seconds 1.234".to_string(),
            "ninefold_idle_seconds_total 1".to_string(),
            "ninefold_cpu_idle_seconds_total{cpu=\"1\"} 2.5".to_string(),
            "ninefold_nic_notifications_suppressed_total 30".to_string(),
            "ninefold_nic_tx_frames_total 20".to_string(),
            "ninefold_nic_tx_bytes_total 1048576".to_string(),
            "ninefold_nic_tx_gso_segments_total 719".to_string(),
            "ninefold_nic_rx_longest_frame_bytes 1514".to_string(),
            "ninefold_nic_offload_tx_checksum 1".to_string(),
            "ninefold_nic_offload_tso 0".to_string(),
            "ninefold_cpu_apic_id{cpu=\"1\"} 2".to_string(),
            "ninefold_cpu_remote_tasks_total{cpu=\"1\"} 1".to_string(),
            "ninefold_cpu_tsc_skew_bound_seconds{cpu=\"1\"} 0.0000015".to_string(),
            "ninefold_cpu_tsc_corrected{cpu=\"1\"} 0".to_string(),
            "ninefold_cpu_wake_ipis_total{cpu=\"1\"} 3".to_string(),
            "ninefold_cpu_wake_ipis_skipped_total{cpu=\"1\"} 9".to_string(),
            format!("ninefold_device_written_bytes_total{{{dev}}} 40960"),
            format!("ninefold_device_write_seconds_total{{{dev}}} 0.005"),
            format!("ninefold_device_flushes_total{{{dev}}} 4"),
            format!("ninefold_device_flush_requests_total{{{dev}}} 4"),
            format!("ninefold_device_fua_writes_total{{{dev}}} 2"),
            format!("ninefold_device_native_fua{{{dev}}} 1"),
            format!("ninefold_device_leg_repairs_total{{{dev},leg=\"0\"}} 5"),
            format!("ninefold_device_leg_in_service{{{dev},leg=\"1\"}} 0"),
            format!("ninefold_device_flush_duration_seconds_bucket{{{dev},le=\"0.00025\"}} 1"),
            format!("ninefold_device_flush_duration_seconds_bucket{{{dev},le=\"+Inf\"}} 2"),
            format!("ninefold_device_flush_duration_seconds_sum{{{dev}}} 0.00312"),
            "ninefold_fsyncs_total 7".to_string(),
            "ninefold_fs_checkpoints_total{cause=\"fsync_fallback\"} 7".to_string(),
            "ninefold_fs_node_written_bytes_total{cause=\"sync\"} 20480".to_string(),
            "ninefold_fs_log_commits_total 3".to_string(),
            "ninefold_fs_log_fallbacks_total{reason=\"too_many_inodes\"} 0".to_string(),
            "ninefold_fs_corruptions_total 0".to_string(),
            "ninefold_fs_core_lock_acquisitions_total 0".to_string(),
            "ninefold_fs_core_lock_hold_seconds_total 0".to_string(),
            "# TYPE ninefold_fs_core_lock_max_hold_seconds gauge".to_string(),
            "ninefold_9p_memory_charged_bytes{use=\"fids\"} 0".to_string(),
            "ninefold_9p_memory_refused_total{use=\"locks\"} 0".to_string(),
            "ninefold_stats_connections_refused_total 2".to_string(),
            "ninefold_9p_listen_pool_listening 2".to_string(),
            "ninefold_9p_syns_total 9".to_string(),
            "ninefold_9p_syn_backlog 3".to_string(),
            "ninefold_9p_syns_replayed_total 4".to_string(),
            "ninefold_9p_syns_refused_total 1".to_string(),
            "# TYPE ninefold_9p_connections gauge".to_string(),
            "# TYPE ninefold_fs_free_bytes gauge".to_string(),
            "# TYPE ninefold_heap_allocated_bytes gauge".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        // Each family once, its samples right after its HELP and TYPE lines.
        let mut families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let n = families.len();
        families.dedup();
        assert_eq!(families.len(), n);
        assert!(n > 100, "{n} families");
    }

    #[test]
    fn sysfs_lines_have_linux_fields_in_order_then_fua() {
        let s = snapshot().sysfs_lines();
        let f: Vec<&str> = s.trim().split(' ').collect();
        assert_eq!(f.len(), 19, "{s}");
        assert_eq!(f[0], "nvme@00:04.0");
        let n: Vec<u64> = f[1..].iter().map(|x| x.parse().unwrap()).collect();
        assert_eq!((n[0], n[2]), (3, 24), "read I/Os and sectors");
        assert_eq!((n[4], n[6], n[7]), (10, 80, 5), "write I/Os, sectors, ms");
        assert_eq!((n[11], n[13]), (1, 16), "discard I/Os and sectors");
        assert_eq!(n[15], 4, "flushes");
        assert_eq!(n[17], 2, "FUA writes");
    }

    #[test]
    fn a_snapshot_answers_every_request() {
        use metrics::endpoint::Request;
        let s = snapshot();
        let http = String::from_utf8(Request::parse(b"GET / HTTP/1.1").answer(&s)).unwrap();
        let (head, body) = http.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.0 200 OK"));
        assert!(head.contains(&alloc::format!("Content-Length: {}", body.len())));
        assert!(serde_json::from_str::<serde_json::Value>(body).is_ok());
        assert!(String::from_utf8(Request::parse(b"stat").answer(&s))
            .unwrap()
            .starts_with("nvme@00:04.0 3 0 24 "));
        let metrics =
            String::from_utf8(Request::parse(b"GET /metrics HTTP/1.1").answer(&s)).unwrap();
        assert!(
            metrics.contains("Content-Type: text/plain; version=0.0.4"),
            "{metrics}"
        );
    }
}
