//! Structured events: what the appliance did, for programs (the QEMU tests, the
//! benchmarks) rather than people, as one JSON object per line behind a fixed prefix, on
//! the event channel — the second serial port (COM2, QEMU's second `-serial`), not the
//! console:
//!
//! ```text
//! EVENT {"event":"ready","serving":true,"port":564,"time_ms":812}
//! ```
//!
//! Every kind of event is a variant of [`Event`], defined here and nowhere else; the
//! `event` key names the kind (snake case), the other keys are its fields, and every
//! event has `time_ms`, the milliseconds since boot when it was emitted. A program
//! waits for an event and reads its fields instead of matching sentences of the log,
//! which stay for people and may be reworded freely. `docs/testing.md` ("Events") lists
//! every event, its fields and when it is emitted; keep it in step.
//!
//! Events go to the event channel whatever `log=` says, each line written in one piece
//! under the channel's lock (lines from different CPUs never mix). Without an event
//! channel (a boot with one `-serial`) they are dropped — or written on the console
//! when `log=debug` or `log=trace` asks for everything. Emitting one never panics; it
//! allocates the JSON text, bounded by the event: texts are cut at [`MAX_TEXT`] bytes
//! and lists at [`MAX_LIST`] entries (the `stats` event's counters document is bounded
//! by its fixed layout and the CPUs and devices it lists). An event that cannot be
//! encoded is dropped and counted ([`dropped`]); none can be, as defined here (a JSON
//! object's keys are all strings).

use alloc::borrow::Cow;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering};

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use crate::clock::skew::TscCheck;
use crate::exec::WakeStats;
use crate::report::Snapshot;

/// What every event line starts with (then the JSON object, then the end of the line).
pub const PREFIX: &str = "EVENT ";
/// Most bytes of one text field (longer texts are cut at a character boundary).
pub const MAX_TEXT: usize = 512;
/// Most entries of one list field.
pub const MAX_LIST: usize = 64;

static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Events that could not be encoded.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// An event. The variant names the kind (`"event"`, in snake case); its fields are the
/// event's. See the module documentation.
#[derive(Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event<'a> {
    /// The boot is complete: the executor is about to run the appliance. Once per boot.
    Booted {
        /// Milliseconds since the clock started.
        ms: u64,
        /// RAM the firmware reported, MiB.
        ram_mib: u64,
        /// RAM the kernel manages, MiB.
        managed_mib: u64,
        /// The heap, MiB, and the pieces it is made of.
        heap_mib: u64,
        /// See `heap_mib`.
        heap_pieces: usize,
        /// Frames free for DMA, MiB.
        frames_free_mib: u64,
        /// Every PCI function found.
        pci: Vec<Pci>,
    },
    /// The effective configuration, once parsed (before the CPUs and devices start).
    Config {
        /// The options in effect, in command-line syntax (as the `config:` line).
        effective: Text<'a>,
        /// The options ignored.
        ignored: Vec<IgnoredOption<'a>>,
    },
    /// The CPUs, once every CPU but the first was started and sent a task (before any
    /// self-test or service).
    Cpus {
        /// CPUs the firmware reports (ACPI MADT).
        reported: usize,
        /// CPUs online, the boot CPU included.
        online: usize,
        /// Each CPU online: its index, local APIC id and TSC check (none for CPU 0).
        cpus: Vec<Cpu>,
        /// Local APIC ids left halted (`cpus=`, or the kernel's limit).
        skipped: Vec<u8>,
        /// Local APIC ids that did not come up.
        failed: Vec<u8>,
        /// Local APIC ids of the CPUs that ran the task CPU 0 sent them.
        ran_task: Vec<u8>,
        /// CPUs (indices) that did not run it within 5 s.
        no_answer: Vec<usize>,
    },
    /// An NVMe controller is up (opened by the storage, a self-test or a benchmark).
    Nvme {
        /// Its PCI address.
        device: Text<'a>,
        /// Identify data.
        model: Text<'a>,
        /// See `model`.
        serial: Text<'a>,
        /// See `model`.
        firmware: Text<'a>,
        /// Blocks of the namespace, and their size in bytes.
        blocks: u64,
        /// See `blocks`.
        block_size: u32,
        /// Largest transfer, KiB.
        max_transfer_kib: u32,
        /// `"interrupt"` or `"poll"`.
        completions: &'static str,
        /// I/O queue pairs created, asked for and granted by the controller.
        pairs: usize,
        /// See `pairs`.
        requested: u16,
        /// See `pairs`.
        granted: u32,
        /// Each pair's MSI-X entry (none when polled; an entry twice: shared).
        msix_entries: Vec<u16>,
        /// Each pair's CPU (pair 1 first).
        cpus: Vec<usize>,
    },
    /// One self-test check's verdict (`selftest`, `selftest=block`).
    Selftest {
        /// The check (`msix`, `spread`, ...).
        check: Text<'a>,
        /// Block checks: the device's kind (`nvme`, `virtio`), PCI address and
        /// completion mode (`irq`, `poll`).
        #[serde(skip_serializing_if = "Option::is_none")]
        kind: Option<&'a str>,
        /// See `kind`.
        #[serde(skip_serializing_if = "Option::is_none")]
        device: Option<Text<'a>>,
        /// See `kind`.
        #[serde(skip_serializing_if = "Option::is_none")]
        mode: Option<&'a str>,
        /// `"ok"`, `"failed"` or `"skipped"`.
        result: &'static str,
        /// What was measured, why it failed or why it was skipped (prose).
        detail: Text<'a>,
        /// Figures of a passed check that programs read (e.g. `in_flight`).
        #[serde(skip_serializing_if = "Facts::is_empty")]
        facts: Facts,
    },
    /// The self-test run is over (the machine powers off next).
    SelftestDone {
        /// Checks passed, failed, skipped.
        passed: usize,
        /// See `passed`.
        failed: usize,
        /// See `passed`.
        skipped: usize,
    },
    /// The per-CPU block check's measurements: every CPU did I/O at once through an NVMe
    /// disk; per I/O queue pair, the changes of its per-CPU counters.
    BlockCpus {
        /// The device and mode checked (`block nvme 00:04.0 irq`).
        check: Text<'a>,
        /// CPUs online.
        cpus: usize,
        /// Each queue pair (a controller has at most 64).
        pairs: &'a [PairOnCpus],
        /// How wakes from other CPUs reached each CPU meanwhile (IPIs sent, and skipped
        /// because it was running).
        wakes: &'a [WakeStats],
    },
    /// One workload of the device benchmark (`bench=dev`), as `make bench-dev` reads it.
    BenchResult(BenchResult<'a>),
    /// `mkfs` on the command line met the disk: formatted it, or kept the filesystem
    /// it holds.
    Mkfs {
        /// The device's name (`nvme@00:04.0`, `ram`).
        device: Text<'a>,
        /// `true`: formatted now; `false`: it held a ninefold filesystem, kept as is.
        formatted: bool,
    },
    /// The filesystem is mounted (after replaying its log if it was not cleanly
    /// unmounted).
    Mounted {
        /// The device's name.
        device: Text<'a>,
        /// The filesystem's label.
        label: Text<'a>,
        /// Its size and free space, MiB.
        size_mib: u64,
        /// See `size_mib`.
        free_mib: u64,
        /// Whether it had been cleanly unmounted (nothing to replay).
        clean: bool,
        /// Mounts so far, this one included; the checkpoint mounted.
        mount_count: u64,
        /// See `mount_count`.
        checkpoint: u64,
        /// Log replay: commits and records replayed, commits dropped (their data never
        /// reached the disk) and replayed without their data verified (unreadable).
        replayed_commits: u64,
        /// See `replayed_commits`.
        replayed_records: u64,
        /// See `replayed_commits`.
        dropped_commits: u64,
        /// See `replayed_commits`.
        unverified_commits: u64,
        /// How long the mount took.
        ms: u64,
    },
    /// There is no filesystem to serve (the appliance then idles: `ready`, not
    /// serving).
    MountFailed {
        /// `"no_disk"`, `"no_filesystem"` (blank or foreign disk), `"damaged"` (no
        /// valid superblock), `"mkfs_failed"` or `"mount_failed"`.
        reason: &'static str,
        /// The device's name, if one was opened.
        #[serde(skip_serializing_if = "Option::is_none")]
        device: Option<Text<'a>>,
        /// The error, as the log says it.
        error: Text<'a>,
        /// Requests the device failed, and of those the fault injector's (`fault=`).
        device_errors: u64,
        /// See `device_errors`.
        injected_errors: u64,
    },
    /// A service listens.
    Listening {
        /// `"9p"` or `"stats"` (the counters service).
        service: &'static str,
        /// Its IPv4 address (9P only) and TCP port.
        #[serde(skip_serializing_if = "Option::is_none")]
        address: Option<Text<'a>>,
        /// See `address`.
        port: u16,
        /// 9P: the connection limit.
        #[serde(skip_serializing_if = "Option::is_none")]
        max_conns: Option<usize>,
        /// 9P: every export, as `export=` says it, and the clients it admits.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        exports: Vec<Export<'a>>,
        /// The counters service: the clients it admits (`stats_allow=`).
        #[serde(skip_serializing_if = "Option::is_none")]
        clients: Option<Text<'a>>,
    },
    /// The appliance is up: serving 9P, or idle (nothing to serve) until the power
    /// button.
    Ready {
        /// Whether it serves 9P.
        serving: bool,
        /// The 9P port, when serving.
        #[serde(skip_serializing_if = "Option::is_none")]
        port: Option<u16>,
        /// Why not, when idle: `"no_filesystem"` or `"no_network"`.
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<&'static str>,
    },
    /// A 9P connection is over (its socket released).
    ConnClosed {
        /// The connection's number (as the log names it: `9p: conn N`).
        conn: u64,
        /// The CPU that served it.
        cpu: usize,
        /// How it ended: `closed_by_peer`, `reset` (by the peer, or timed out),
        /// `socket_error`, `protocol_violation`, `shed` (by the server),
        /// `shutdown` (closed politely for a shutdown), `shutdown_reset` (not finished
        /// within the shutdown's grace time).
        how: &'static str,
        /// The server's reason, when it closed the connection: `bad_frame_size`,
        /// `duplicate_tag`, `handshake_timeout`, `idle_timeout`, `slot_reclaimed`,
        /// `memory_reclaimed`, `shutdown`, `shutdown_now`.
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<&'static str>,
        /// Bytes received and sent.
        rx: u64,
        /// See `rx`.
        tx: u64,
        /// Connections still open.
        active: u64,
    },
    /// The counters, every 10 s while serving when something happened
    /// (`Snapshot::activity_key`; with the `stats:` line at `log=debug`).
    Stats {
        /// The counters document (what the counters service answers; the NIC's
        /// counters under `nic`).
        counters: &'a Snapshot,
    },
    /// The filesystem failed (a write or FLUSH the device failed: it refuses changes
    /// from now on); seen within 0.1 s (`storage::FAILURE_CHECK`; a failure without a
    /// device error by the housekeeping, within 5 s). Once.
    FsFailed {
        /// Requests the device failed so far, and of those the fault injector's.
        device_errors: u64,
        /// See `device_errors`.
        injected_errors: u64,
    },
    /// A scrub pass finished.
    Scrub {
        /// The checkpoint whose trees it verified.
        checkpoint: u64,
        /// Nodes, data blocks and bytes verified.
        nodes: u64,
        /// See `nodes`.
        data_blocks: u64,
        /// See `nodes`.
        bytes: u64,
        /// Blocks that failed verification; failures not counted (a newer checkpoint
        /// freed the block).
        errors: u64,
        /// See `errors`.
        skipped: u64,
    },
    /// A rebuild after `ctl replace` ended: leg `leg` holds every block and serves.
    Rebuilt {
        /// The leg's place in the mirror.
        leg: u64,
        /// Blocks of the filesystem its copy passed (its size in 4 KiB blocks).
        blocks: u64,
        /// Bytes rebuilds copied since the mount (the blocks in use, and those copied
        /// again after a write over them).
        copied_bytes: u64,
        /// Time from the rebuild's start in this mount (`ctl replace`, or the mount
        /// that took it up) to its end.
        ms: u64,
    },
    /// The ACPI power button: armed (a press starts the clean shutdown), or not.
    PowerButton {
        /// Whether it is armed.
        armed: bool,
        /// Why not.
        #[serde(skip_serializing_if = "Option::is_none")]
        why: Option<Text<'a>>,
    },
    /// A step of the clean shutdown.
    Shutdown(Shutdown),
    /// The machine turns itself off (ACPI soft-off; the debug-exit device if that
    /// fails).
    PowerOff,
}

/// One PCI function ([`Event::Booted`]).
#[derive(Debug, Serialize)]
pub struct Pci {
    /// `BB:DD.F`.
    pub addr: String,
    /// `vvvv:dddd` (vendor and device ids, hex).
    pub id: String,
    /// `cc.ss` (base class and subclass, hex).
    pub class: String,
    /// The device's name if known, else the class's.
    pub name: &'static str,
}

/// An option of the command line that was ignored ([`Event::Config`]).
#[derive(Debug, Serialize)]
pub struct IgnoredOption<'a> {
    /// The option as written.
    pub option: Text<'a>,
    /// `"unknown"`, or what is wrong with its value.
    pub why: Text<'a>,
}

impl<'a> From<crate::config::Ignored<'a>> for IgnoredOption<'a> {
    fn from(i: crate::config::Ignored<'a>) -> Self {
        use crate::config::Ignored;
        match i {
            Ignored::Unknown(option) => IgnoredOption {
                option: option.into(),
                why: "unknown".into(),
            },
            Ignored::Malformed { option, reason } => IgnoredOption {
                option: option.into(),
                why: reason.into(),
            },
        }
    }
}

/// One CPU online ([`Event::Cpus`]).
#[derive(Debug, Serialize)]
pub struct Cpu {
    /// Its index.
    pub cpu: usize,
    /// Its local APIC id.
    pub apic_id: u8,
    /// Its TSC against CPU 0's (none for CPU 0, or if it did not answer the check).
    pub tsc: Option<TscCheck>,
}

/// One 9P export ([`Event::Listening`]).
#[derive(Debug, Serialize)]
pub struct Export<'a> {
    /// As `export=` says it (`name:/path:options`).
    pub export: Text<'a>,
    /// The clients it admits.
    pub clients: Text<'a>,
}

/// One NVMe I/O queue pair in the per-CPU block check ([`Event::BlockCpus`]): the
/// changes of its per-CPU counters.
#[derive(Debug, Serialize)]
pub struct PairOnCpus {
    /// Its queue identifier (1 first).
    pub qid: u16,
    /// The CPU it belongs to.
    pub cpu: usize,
    /// Commands submitted, completions consumed, interrupts taken, by CPU.
    pub submitted_by_cpu: Vec<u64>,
    /// See `submitted_by_cpu`.
    pub completed_by_cpu: Vec<u64>,
    /// See `submitted_by_cpu`.
    pub interrupts_by_cpu: Vec<u64>,
}

/// One workload of the device benchmark ([`Event::BenchResult`]).
#[derive(Debug, Serialize)]
pub struct BenchResult<'a> {
    /// `nvme` or `virtio-blk`.
    pub device: &'a str,
    /// The workload's name (`randwrite-4k-qd1`, ...).
    pub workload: &'a str,
    /// Operations done, in how long.
    pub ops: u64,
    /// See `ops`.
    pub seconds: f64,
    /// Operations per second, MiB per second.
    pub iops: f64,
    /// See `iops`.
    pub mib_s: f64,
    /// Mean and longest write and flush latencies, and the mean time of one iteration.
    pub write_lat_us: f64,
    /// See `write_lat_us`.
    pub flush_lat_us: f64,
    /// See `write_lat_us`.
    pub write_lat_max_us: f64,
    /// See `write_lat_us`.
    pub flush_lat_max_us: f64,
    /// See `write_lat_us`.
    pub iteration_us: f64,
    /// Device requests, and per request: doorbell writes, interrupts, reaps.
    pub requests: u64,
    /// See `requests`.
    pub doorbells_per_request: f64,
    /// See `requests`.
    pub interrupts_per_request: f64,
    /// See `requests`.
    pub reaps_per_request: f64,
    /// What went wrong, if the workload failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a str>,
}

/// A step of the clean shutdown ([`Event::Shutdown`]): `step` says which, the other
/// fields (present only where they apply) what it found.
#[derive(Debug, Default, Serialize)]
pub struct Shutdown {
    /// `started` (the power button was pressed; `limit_secs`, `serving`),
    /// `press_ignored` (pressed again while shutting down), `listener_closed` (no new
    /// connection; `open`), `connections_closed` (`asked`, `reset`, `grace_secs`),
    /// `unmounted` (everything durable, marked clean; `ms`), and the end: `done`
    /// (`ms`), `failed` (`error`) or `timed_out` (`during`, `limit_secs`). The machine
    /// powers off after the end (`power_off`).
    pub step: &'static str,
    /// The whole shutdown's limit (`shutdown_timeout=`), seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_secs: Option<u64>,
    /// Whether 9P was being served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serving: Option<bool>,
    /// 9P connections open when the listener closed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open: Option<u64>,
    /// Connections asked to close politely, and of those reset after `grace_secs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asked: Option<u64>,
    /// See `asked`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reset: Option<u64>,
    /// See `asked`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace_secs: Option<u64>,
    /// How long the step (`unmounted`) or the whole shutdown (`done`) took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ms: Option<u64>,
    /// The step under way when the limit passed: `listener`, `connections`, `unmount`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub during: Option<&'static str>,
    /// Why the unmount failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Text<'static>>,
}

/// A text field: at most [`MAX_TEXT`] bytes of it are encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Text<'a>(Cow<'a, str>);

impl<'a> From<&'a str> for Text<'a> {
    fn from(s: &'a str) -> Self {
        Text(Cow::Borrowed(s))
    }
}

impl From<String> for Text<'static> {
    fn from(s: String) -> Self {
        Text(Cow::Owned(s))
    }
}

impl Text<'static> {
    /// `value` as displayed, cut at [`MAX_TEXT`] bytes (no more is formatted).
    pub fn display(value: impl fmt::Display) -> Self {
        let mut out = Bounded(String::new());
        // Err only when the bound is reached: what was written is kept.
        let _ = fmt::write(&mut out, format_args!("{value}"));
        Text(Cow::Owned(out.0))
    }
}

impl Serialize for Text<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(cut(&self.0, MAX_TEXT))
    }
}

/// `s`, cut to at most `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A string that takes at most [`MAX_TEXT`] bytes.
struct Bounded(String);

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = MAX_TEXT - self.0.len();
        let part = cut(s, room);
        self.0.push_str(part);
        if part.len() < s.len() {
            Err(fmt::Error)
        } else {
            Ok(())
        }
    }
}

/// The first [`MAX_LIST`] items of `items`.
pub fn list<T>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    items.into_iter().take(MAX_LIST).collect()
}

/// Figures of a self-test check ([`Event::Selftest`]), by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Facts(Vec<(&'static str, Fact)>);

/// One figure of [`Facts`].
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Fact {
    /// A number.
    Number(u64),
    /// A list of numbers.
    Numbers(Vec<u64>),
    /// A text.
    Text(Text<'static>),
}

impl Facts {
    /// No figures.
    pub fn new() -> Facts {
        Facts::default()
    }

    /// With `name` = `value` too.
    pub fn with(mut self, name: &'static str, value: Fact) -> Facts {
        if self.0.len() < MAX_LIST {
            self.0.push((name, value));
        }
        self
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Facts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

/// The event kind of a 9P connection's end ([`Event::ConnClosed`]'s `how`).
pub fn closed_how(how: ninep::service::Closed) -> &'static str {
    use ninep::service::Closed;
    match how {
        Closed::ByPeer => "closed_by_peer",
        Closed::Reset => "reset",
        Closed::SocketError => "socket_error",
        Closed::ProtocolViolation => "protocol_violation",
        Closed::Shed => "shed",
        Closed::Shutdown => "shutdown",
        Closed::ShutdownReset => "shutdown_reset",
    }
}

/// The server's reason for closing a connection ([`Event::ConnClosed`]'s `reason`).
pub fn close_reason(reason: ninep::conn::CloseReason) -> &'static str {
    use ninep::conn::CloseReason;
    match reason {
        CloseReason::BadFrameSize(_) => "bad_frame_size",
        CloseReason::DuplicateTag(_) => "duplicate_tag",
        CloseReason::HandshakeTimeout => "handshake_timeout",
        CloseReason::IdleTimeout => "idle_timeout",
        CloseReason::SlotReclaimed => "slot_reclaimed",
        CloseReason::MemoryReclaimed => "memory_reclaimed",
        CloseReason::Shutdown => "shutdown",
        CloseReason::ShutdownNow => "shutdown_now",
    }
}

/// The [`Event::ConnClosed`] of what `Service::serve` said.
pub fn conn_closed(served: &ninep::service::Served) -> Event<'static> {
    Event::ConnClosed {
        conn: served.conn,
        cpu: served.worker,
        how: closed_how(served.how),
        reason: served.reason.map(close_reason),
        rx: served.rx,
        tx: served.tx,
        active: served.active,
    }
}

/// Events made from the running appliance's state.
#[cfg(target_os = "none")]
pub mod appliance {
    use alloc::format;
    use alloc::vec::Vec;

    use super::{list, Cpu, Event, Pci};
    use crate::mm::setup::MemorySummary;
    use crate::{pci, smp};

    const MIB: u64 = 1 << 20;

    /// [`Event::Booted`], `ms` after the clock started.
    pub fn booted(mem: &MemorySummary, ms: u64) -> Event<'static> {
        Event::Booted {
            ms,
            ram_mib: mem.ram_reported / MIB,
            managed_mib: mem.managed / MIB,
            heap_mib: mem.heap / MIB,
            heap_pieces: mem.heap_chunks,
            frames_free_mib: mem.frames_free / MIB,
            pci: list(pci::device::functions().iter().map(|f| {
                Pci {
                    addr: format!("{}", f.addr),
                    id: format!("{:04x}:{:04x}", f.vendor, f.device),
                    class: format!("{:02x}.{:02x}", f.class, f.subclass),
                    name: f
                        .name()
                        .unwrap_or_else(|| pci::ids::class_name(f.class, f.subclass)),
                }
            })),
        }
    }

    /// [`Event::Cpus`]: the CPUs started, of which those (local APIC ids) that ran the
    /// task sent to them and those (indices) that did not.
    pub fn cpus(ran_task: Vec<u8>, no_answer: Vec<usize>) -> Event<'static> {
        let start = smp::start_report().cloned().unwrap_or_default();
        Event::Cpus {
            reported: start.reported,
            online: smp::online(),
            cpus: list(smp::states().enumerate().map(|(cpu, s)| Cpu {
                cpu,
                apic_id: s.apic_id,
                tsc: smp::tsc_check(cpu),
            })),
            skipped: list(start.skipped),
            failed: list(start.failed),
            ran_task: list(ran_task),
            no_answer: list(no_answer),
        }
    }
}

/// An event and when it was emitted: what is encoded.
#[derive(Serialize)]
struct Stamped<'e, 'a> {
    #[serde(flatten)]
    event: &'e Event<'a>,
    /// Milliseconds since boot.
    time_ms: u64,
}

/// The JSON object of `event` emitted `time_ms` after boot (one line: JSON strings
/// escape newlines); `None` if it cannot be encoded (counted).
fn encode(event: &Event<'_>, time_ms: u64) -> Option<String> {
    let json = serde_json::to_string(&Stamped { event, time_ms }).ok();
    if json.is_none() {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
    json
}

/// The line of `event` emitted `time_ms` after boot: [`PREFIX`], the JSON object, a
/// newline.
pub fn line(event: &Event<'_>, time_ms: u64) -> Option<String> {
    encode(event, time_ms).map(|json| alloc::format!("{PREFIX}{json}\n"))
}

/// Writes `event` on the event channel (see the module documentation).
#[cfg(target_os = "none")]
pub fn emit(event: Event<'_>) {
    use crate::hal::console;
    let on_console = log::max_level() >= log::LevelFilter::Debug;
    if !console::has_event_channel() && !on_console {
        return;
    }
    let time_ms = crate::clock::uptime().as_millis() as u64;
    if let Some(json) = encode(&event, time_ms) {
        if !console::write_event_fmt(format_args!("{PREFIX}{json}\n")) && on_console {
            console::write_fmt(format_args!("{PREFIX}{json}\n"));
        }
    }
}

/// Host builds (unit tests) have no serial ports: the event is encoded and dropped.
#[cfg(not(target_os = "none"))]
pub fn emit(event: Event<'_>) {
    let _ = encode(&event, 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn json(e: &Event<'_>) -> serde_json::Value {
        let l = line(e, 7).unwrap();
        let body = l.strip_prefix(PREFIX).unwrap().strip_suffix('\n').unwrap();
        assert!(!body.contains('\n'), "one line: {l:?}");
        serde_json::from_str(body).unwrap()
    }

    #[test]
    fn an_event_is_one_prefixed_json_line_named_by_its_kind() {
        let e = Event::Ready {
            serving: true,
            port: Some(564),
            reason: None,
        };
        assert_eq!(
            line(&e, 1234).unwrap(),
            "EVENT {\"event\":\"ready\",\"serving\":true,\"port\":564,\"time_ms\":1234}\n"
        );
        let v = json(&Event::Shutdown(Shutdown {
            step: "connections_closed",
            asked: Some(2),
            reset: Some(1),
            grace_secs: Some(4),
            ..Shutdown::default()
        }));
        assert_eq!(v["event"], "shutdown");
        assert_eq!(v["step"], "connections_closed");
        assert_eq!(
            (v["asked"].as_u64(), v["reset"].as_u64()),
            (Some(2), Some(1))
        );
        assert!(v.get("ms").is_none(), "absent fields are left out: {v}");
        assert_eq!(v["time_ms"], 7, "every event says when: {v}");
        let off = json(&Event::PowerOff);
        assert_eq!(
            (&off["event"], &off["time_ms"]),
            (&"power_off".into(), &7.into())
        );
    }

    #[test]
    fn texts_and_lists_are_bounded_and_newlines_escaped() {
        let long = "é".repeat(MAX_TEXT);
        let v = json(&Event::MountFailed {
            reason: "mount_failed",
            device: Some("nvme@00:04.0".into()),
            error: Text::display(format_args!("a\nb {long}")),
            device_errors: 1,
            injected_errors: 1,
        });
        let error = v["error"].as_str().unwrap();
        assert!(
            error.starts_with("a\nb é") && error.len() <= MAX_TEXT,
            "{error}"
        );
        let v = json(&Event::Config {
            effective: long.as_str().into(),
            ignored: list((0..1000).map(|_| crate::config::Ignored::Unknown("x").into())),
        });
        assert!(v["effective"].as_str().unwrap().len() <= MAX_TEXT);
        assert_eq!(v["ignored"].as_array().unwrap().len(), MAX_LIST);
    }

    #[test]
    fn facts_are_an_object_and_left_out_when_there_are_none() {
        let e = |facts| Event::Selftest {
            check: "spread".into(),
            kind: Some("nvme"),
            device: Some("00:04.0".into()),
            mode: Some("irq"),
            result: "ok",
            detail: "fine".into(),
            facts,
        };
        let v = json(&e(Facts::new()
            .with("in_flight", Fact::Number(256))
            .with("entries", Fact::Numbers(vec![1, 2]))
            .with("serial", Fact::Text("nf".into()))));
        assert_eq!(v["facts"]["in_flight"], 256);
        assert_eq!(v["facts"]["entries"], serde_json::json!([1, 2]));
        assert_eq!(v["facts"]["serial"], "nf");
        assert!(json(&e(Facts::new())).get("facts").is_none());
    }

    #[test]
    fn connection_ends_have_stable_names() {
        use ninep::conn::CloseReason;
        use ninep::service::{Closed, Served};
        let served = Served {
            conn: 3,
            worker: 1,
            how: Closed::ProtocolViolation,
            reason: Some(CloseReason::BadFrameSize(u32::MAX)),
            rx: 7,
            tx: 0,
            active: 2,
        };
        let v = json(&conn_closed(&served));
        assert_eq!(v["event"], "conn_closed");
        assert_eq!(v["how"], "protocol_violation");
        assert_eq!(v["reason"], "bad_frame_size");
        assert_eq!((v["conn"].as_u64(), v["cpu"].as_u64()), (Some(3), Some(1)));
    }
}
