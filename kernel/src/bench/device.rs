//! The device benchmark (`bench=dev`): the workloads of the Linux guest's fio job
//! (`tests/guest/job/devbench.sh`), run by the appliance's own drivers on the same kind
//! of emulated device, so `make bench-dev` can compare the two.
//!
//! | workload | what | reported |
//! |---|---|---|
//! | `randwrite-4k-qd1` | 4 KiB writes at random 4 KiB-aligned offsets, one at a time | IOPS, mean latency |
//! | `randwrite-4k-qd32` | the same with 32 in flight | IOPS, mean latency |
//! | `write-128k` | 128 KiB sequential writes, one at a time | MiB/s |
//! | `write-flush-4k` | 4 KiB sequential write, then a flush, repeated | iterations/s, mean write and flush latency |
//!
//! Offsets stay within the first [`SPAN`] bytes of the device (fio's `--size=1g`), each
//! workload runs for `benchtime=` seconds (10), and buffers are page-aligned (as fio's
//! `direct=1` buffers are); the drivers copy them through their DMA streams (see
//! `drivers::bounce`), as they do every buffer.

use alloc::format;
use alloc::rc::Rc;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::time::Duration;

use block::{BlockDevice, WriteFlags};

use crate::config::Config;
use crate::drivers::disk::{open, open_at, Disk, DiskOptions, IoCounters};
use crate::drivers::select::DiskKind;
use crate::exit::ExitCode;
use crate::pci::device;
use crate::task;
use crate::time::Instant;

/// Bytes of the device the workloads use (fio `--size=1g`).
const SPAN: u64 = 1 << 30;
/// Random writes in flight in the QD32 workload.
const DEPTH: usize = 32;

/// Runs every workload on the disk `disk=` names, or on every NVMe and virtio-blk
/// device when none is named.
pub async fn run(config: &Config) -> ExitCode {
    let runtime = Duration::from_secs(u64::from(config.bench_seconds));
    let options = DiskOptions::for_config(config);
    let disks: Vec<Result<Disk, String>> = match config.disk {
        Some(sel) => vec![open(Some(sel), options).await.map_err(|e| format!("{e}"))],
        None => {
            let mut v = Vec::new();
            for f in device::functions() {
                if let Some(kind) = DiskKind::of(f) {
                    let pci = device::at(f.addr).expect("enumerated");
                    v.push(
                        open_at(pci, kind, options)
                            .await
                            .map_err(|e| format!("{e}")),
                    );
                }
            }
            v
        }
    };
    if disks.is_empty() {
        log::error!("bench: no disk to benchmark");
        return ExitCode::SelftestFailed;
    }
    let mut ok = true;
    for disk in disks {
        match disk {
            Ok(d) => bench_disk(Rc::new(d), runtime).await,
            Err(e) => {
                log::error!("bench: {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::Success
    } else {
        ExitCode::SelftestFailed
    }
}

/// What one workload measured.
#[derive(Debug, Default)]
struct Outcome {
    /// Writes completed (iterations, for write + flush).
    ops: u64,
    /// Bytes written.
    bytes: u64,
    /// Wall time.
    elapsed: Duration,
    /// Sum of write latencies.
    write_ns: u64,
    /// Sum of flush latencies and how many.
    flush_ns: u64,
    flushes: u64,
    /// The slowest write and flush.
    write_max_ns: u64,
    flush_max_ns: u64,
    /// The first error, if any.
    error: Option<String>,
    /// Device interaction during the workload.
    counters: IoCounters,
}

fn name(kind: DiskKind) -> &'static str {
    match kind {
        DiskKind::Nvme => "nvme",
        DiskKind::VirtioBlk => "virtio-blk",
    }
}

async fn bench_disk(disk: Rc<Disk>, runtime: Duration) {
    let g = disk.geometry();
    let device = name(disk.kind());
    let span = SPAN.min(g.capacity_bytes());
    log::info!(
        "bench: {device} at {}: {} MiB, span {} MiB, {} s per workload",
        disk.pci().address(),
        g.capacity_bytes() >> 20,
        span >> 20,
        runtime.as_secs()
    );
    if let Some(ns) = disk.time_register_reads(10_000) {
        log::info!("bench: {device}: one register read (an MMIO exit) takes {ns} ns");
    }
    for workload in [
        "randwrite-4k-qd1",
        "randwrite-4k-qd32",
        "write-128k",
        "write-flush-4k",
    ] {
        let before = disk.io_counters();
        let mut outcome = match workload {
            "randwrite-4k-qd1" => random_writes(&disk, span, 1, runtime).await,
            "randwrite-4k-qd32" => random_writes(&disk, span, DEPTH, runtime).await,
            "write-128k" => sequential(&disk, span, 128 << 10, false, runtime).await,
            _ => sequential(&disk, span, 4096, true, runtime).await,
        };
        let after = disk.io_counters();
        outcome.counters = IoCounters {
            requests: after.requests - before.requests,
            doorbell_writes: after.doorbell_writes - before.doorbell_writes,
            interrupts: after.interrupts - before.interrupts,
            reaps: after.reaps - before.reaps,
        };
        report(device, workload, &outcome);
    }
    log::info!("bench: {device} counters {}", disk.stats_line());
}

fn report(device: &str, workload: &str, o: &Outcome) {
    let secs = o.elapsed.as_secs_f64().max(1e-9);
    let per_op_us = |ns: u64, n: u64| {
        if n == 0 {
            0.0
        } else {
            ns as f64 / n as f64 / 1000.0
        }
    };
    let c = &o.counters;
    let per_request = |n: u64| n as f64 / c.requests.max(1) as f64;
    let result = crate::event::BenchResult {
        device,
        workload,
        ops: o.ops,
        seconds: secs,
        iops: o.ops as f64 / secs,
        mib_s: o.bytes as f64 / secs / (1 << 20) as f64,
        write_lat_us: per_op_us(o.write_ns, o.ops),
        flush_lat_us: per_op_us(o.flush_ns, o.flushes),
        write_lat_max_us: o.write_max_ns as f64 / 1000.0,
        flush_lat_max_us: o.flush_max_ns as f64 / 1000.0,
        iteration_us: if o.ops == 0 {
            0.0
        } else {
            secs * 1e6 / o.ops as f64
        },
        requests: c.requests,
        doorbells_per_request: per_request(c.doorbell_writes),
        interrupts_per_request: per_request(c.interrupts),
        reaps_per_request: per_request(c.reaps),
        error: o.error.as_deref(),
    };
    // One event per workload, for tests/bench/device.py.
    crate::event::emit(crate::event::Event::BenchResult(result));
}

/// A page-aligned buffer of `len` bytes filled with non-zero data.
struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize, seed: u8) -> AlignedBuf {
        let mut storage = vec![0u8; len + 4096];
        let start = (4096 - storage.as_ptr() as usize % 4096) % 4096;
        for (i, b) in storage.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(seed) | 1;
        }
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    fn get(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
}

/// xorshift64*: the random offsets.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn since(t: Instant) -> u64 {
    task::now().saturating_duration_since(t).as_nanos() as u64
}

/// 4 KiB writes at random aligned offsets in `span`, `depth` at a time, for `runtime`.
async fn random_writes(disk: &Rc<Disk>, span: u64, depth: usize, runtime: Duration) -> Outcome {
    let start = task::now();
    let end = start + runtime;
    let workers: Vec<_> = (0..depth)
        .map(|i| {
            let disk = disk.clone();
            task::spawn(async move {
                let bs = u64::from(disk.geometry().block_size);
                let slots = span / 4096;
                let buf = AlignedBuf::new(4096, i as u8);
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1) << 32);
                let mut o = Outcome::default();
                while task::now() < end {
                    let lba = rng.next() % slots * 4096 / bs;
                    let t = task::now();
                    if let Err(e) = disk.write(lba, buf.get(), WriteFlags::NONE).await {
                        o.error = Some(format!("{e}"));
                        break;
                    }
                    let ns = since(t);
                    o.write_ns += ns;
                    o.write_max_ns = o.write_max_ns.max(ns);
                    o.ops += 1;
                }
                o
            })
        })
        .collect();
    let mut total = Outcome::default();
    for w in workers {
        let o = w.await;
        total.ops += o.ops;
        total.write_ns += o.write_ns;
        total.write_max_ns = total.write_max_ns.max(o.write_max_ns);
        total.error = total.error.or(o.error);
    }
    total.bytes = total.ops * 4096;
    total.elapsed = task::now().saturating_duration_since(start);
    total
}

/// `size`-byte sequential writes through `span` (wrapping), each followed by a flush
/// when `flush`, one at a time, for `runtime`.
async fn sequential(
    disk: &Disk,
    span: u64,
    size: usize,
    flush: bool,
    runtime: Duration,
) -> Outcome {
    let bs = u64::from(disk.geometry().block_size);
    let buf = AlignedBuf::new(size, 7);
    let start = task::now();
    let end = start + runtime;
    let mut o = Outcome::default();
    let mut offset = 0;
    while task::now() < end {
        if offset + size as u64 > span {
            offset = 0;
        }
        let t = task::now();
        if let Err(e) = disk.write(offset / bs, buf.get(), WriteFlags::NONE).await {
            o.error = Some(format!("{e}"));
            break;
        }
        let ns = since(t);
        o.write_ns += ns;
        o.write_max_ns = o.write_max_ns.max(ns);
        if flush {
            let t = task::now();
            if let Err(e) = disk.flush().await {
                o.error = Some(format!("flush: {e}"));
                break;
            }
            let ns = since(t);
            o.flush_ns += ns;
            o.flush_max_ns = o.flush_max_ns.max(ns);
            o.flushes += 1;
        }
        o.ops += 1;
        offset += size as u64;
    }
    o.bytes = o.ops * size as u64;
    o.elapsed = task::now().saturating_duration_since(start);
    o
}
