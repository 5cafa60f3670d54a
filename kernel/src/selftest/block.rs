//! Block-device self-checks (`selftest=block`).
//!
//! Every NVMe controller and virtio-blk device on the bus is opened twice, with interrupt
//! and then with polled completions (and otherwise the command line's driver options,
//! e.g. `nvme_queues=`), and put through the checks below; each logs
//! `selftest: block KIND ADDR MODE: CHECK: ok (...)` (or `FAILED`) and emits its
//! `selftest` event; the per-CPU check also emits what it measured, a `block_cpus`
//! event ([`crate::event`]). Data is patterned by
//! position and run, so a read-back proves this run's writes landed where they should.

use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::future::{poll_fn, Future};
use core::pin::pin;
use core::task::Poll;
use core::time::Duration;

use block::{BlockDevice, IoError, WriteFlags};

use super::{ensure, Subject, Tally, Verdict};
use crate::config::Config;
use crate::drivers::disk::{open_at, Disk, DiskOptions};
use crate::drivers::nvme::{NvmeDisk, QueueStats};
use crate::drivers::select::DiskKind;
use crate::drivers::{join_all, CompletionMode};
use crate::event::{self, Event, Fact, Facts, PairOnCpus};
use crate::exec::WakeStats;
use crate::exit::ExitCode;
use crate::pci::device;
use crate::{smp, task};

/// Concurrent requests in the spread-pattern check.
const SPREAD_REQUESTS: usize = 256;
/// Requests issued at once in the back-pressure check (more than any queue holds).
const FLOOD_REQUESTS: usize = 320;
/// The request timeout of the recovery check.
const RECOVERY_TIMEOUT: Duration = Duration::from_millis(300);
/// Writes (and reads back) each CPU issues at once in the per-CPU check.
const PER_CPU_REQUESTS: u64 = 32;

/// Runs the checks on every block device, opened with the driver options `config` asks
/// for; returns the exit code for the result.
pub async fn run(config: &Config) -> ExitCode {
    let mut tally = Tally::default();
    let disks: Vec<_> = device::functions()
        .iter()
        .filter_map(|f| DiskKind::of(f).map(|k| (f.addr, k)))
        .collect();
    if disks.is_empty() {
        tally.record("block", Verdict::Skip("no NVMe or virtio-blk device"));
    }
    let mut seed = 0x6e66_0000;
    for (addr, kind) in disks {
        for (mode, mode_name) in [
            (CompletionMode::Interrupt, "irq"),
            (CompletionMode::Poll, "poll"),
        ] {
            seed += 1;
            let name = format!("block {kind} {addr} {mode_name}");
            tally.subject(Some(Subject {
                kind: match kind {
                    DiskKind::Nvme => "nvme",
                    DiskKind::VirtioBlk => "virtio",
                },
                device: format!("{addr}"),
                mode: mode_name,
            }));
            let mut options = DiskOptions::for_config(config);
            options.nvme.mode = mode;
            options.virtio.mode = mode;
            let pci = device::at(addr).expect("enumerated");
            let disk = match open_at(pci, kind, options).await {
                Ok(d) => Arc::new(d),
                Err(e) => {
                    tally.record("open", Verdict::Fail(format!("{e}")));
                    continue;
                }
            };
            let g = disk.geometry();
            tally.record(
                "open",
                Verdict::Pass(format!(
                    "{} blocks of {} B, max transfer {} KiB, FUA {}, cache {}, discard {}",
                    g.num_blocks,
                    g.block_size,
                    g.max_transfer / 1024,
                    if g.native_fua { "native" } else { "emulated" },
                    g.volatile_cache,
                    g.discard
                )),
            );
            let mut record = |check: &str, v| tally.record(check, v);
            record("queues", queues(&disk, seed, mode).await);
            record("cpus", every_cpu(&disk, &name, seed, mode).await);
            record("spread", spread(&disk, seed).await);
            record("fua", fua(&disk, seed).await);
            record("large", large(&disk, seed).await);
            record("unaligned", unaligned(&disk, seed).await);
            record("errors", errors(&disk, seed).await);
            record("discard", discard(&disk, seed).await);
            record("drop", dropped(&disk, seed).await);
            record("forget", forgotten(&disk, seed).await);
            record("backpressure", backpressure(&disk, seed).await);
            log::info!("selftest: {name}: counters {}", disk.stats_line());
            drop(disk);
            // Recovery from a request the device never completes, with a short timeout.
            options.nvme.timeout = RECOVERY_TIMEOUT;
            options.virtio.timeout = RECOVERY_TIMEOUT;
            let verdict = match open_at(pci, kind, options).await {
                Ok(disk) => recovery(&disk, seed).await,
                Err(e) => Verdict::Fail(format!("reopening with a short timeout: {e}")),
            };
            tally.record("timeout", verdict);
        }
    }
    tally.subject(None);
    tally.finish()
}

/// Bytes that depend on the run, the block address and the offset.
fn pattern(lba: u64, len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(&mut v, lba, seed);
    v
}

fn fill(buf: &mut [u8], lba: u64, seed: u64) {
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let mut x = seed ^ lba.rotate_left(24) ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        // splitmix64's finaliser.
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// Where `got` first differs from `want`, and how many bytes differ.
fn mismatch(got: &[u8], want: &[u8]) -> Option<(usize, usize)> {
    let first = got.iter().zip(want).position(|(a, b)| a != b)?;
    let count = got.iter().zip(want).filter(|(a, b)| a != b).count();
    Some((first, count))
}

/// A zeroed buffer of `len` bytes whose data starts `offset` bytes past a page boundary.
struct Placed {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl Placed {
    fn new(len: usize, offset: usize) -> Placed {
        let storage = vec![0u8; len + offset + 4096];
        let misalign = storage.as_ptr() as usize % 4096;
        let start = (4096 - misalign) % 4096 + offset;
        Placed {
            storage,
            start,
            len,
        }
    }

    fn get(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// Every I/O queue pair carries I/O: a block written through each pair reads back through
/// the next one, each pair's counters advanced (and, with interrupts, its MSI-X vector
/// fired), and the disk's totals are the sum of the pairs'. NVMe only: virtio-blk has one
/// queue.
async fn queues(disk: &Disk, seed: u64, mode: CompletionMode) -> Verdict {
    let Some(nvme) = disk.as_nvme() else {
        return Verdict::Skip("virtio-blk has one queue");
    };
    let g = disk.geometry();
    let bs = g.block_size as usize;
    let n = nvme.io_queues();
    let base = g.num_blocks * 3 / 4;
    let before = nvme.queue_stats();
    if let Err(why) = every_queue(nvme, base, bs, seed ^ 0x9e).await {
        return Verdict::Fail(why);
    }
    let after = nvme.queue_stats();
    ensure!(
        after.len() == n,
        "{} queues' counters for {n} queues",
        after.len()
    );
    for (b, a) in before.iter().zip(&after) {
        let submitted = a.doorbells.submitted - b.doorbells.submitted;
        let completed = a.doorbells.completed - b.doorbells.completed;
        ensure!(
            submitted >= 2 && completed >= 2,
            "queue {}: {submitted} commands submitted, {completed} completed (a write and a read expected)",
            a.qid
        );
        if mode == CompletionMode::Interrupt {
            ensure!(
                a.msix_entry.is_some() && a.interrupts > b.interrupts,
                "queue {}: no interrupt on MSI-X entry {:?}",
                a.qid,
                a.msix_entry
            );
        }
    }
    let totals = nvme.stats();
    let submitted: u64 = after.iter().map(|q| q.doorbells.submitted).sum();
    ensure!(
        totals.doorbells.submitted == submitted && totals.io_queues == n,
        "totals say {} commands on {} queues, the queues {submitted} on {n}",
        totals.doorbells.submitted,
        totals.io_queues
    );
    let mut buf = vec![0u8; bs];
    let beyond = nvme.read_on_queue(n, base, &mut buf).await;
    ensure!(
        beyond == Err(IoError::Unsupported),
        "a read through queue {} of {n} gave {beyond:?}",
        n + 1
    );
    let entries: Vec<_> = after.iter().filter_map(|q| q.msix_entry).collect();
    let commands: Vec<u64> = after.iter().map(|q| q.doorbells.submitted).collect();
    Verdict::Measured(
        format!(
            "{n} I/O queue pair{}: a block written through each read back through the next, commands per queue {commands:?}, MSI-X entries {entries:?}",
            if n == 1 { "" } else { "s" },
        ),
        Facts::new()
            .with("pairs", Fact::Number(n as u64))
            .with("commands", Fact::Numbers(event::list(commands)))
            .with(
                "msix_entries",
                Fact::Numbers(event::list(entries.iter().map(|&e| u64::from(e)))),
            ),
    )
}

/// Every CPU does I/O through the disk at once (each through the pair it is routed to):
/// every byte reads back, and each pair's commands were submitted only from the CPUs
/// routed to it, completed on the CPU it belongs to, and (with interrupts, each pair on
/// its own MSI-X entry) interrupted only that CPU. NVMe with several CPUs only.
async fn every_cpu(disk: &Arc<Disk>, name: &str, seed: u64, mode: CompletionMode) -> Verdict {
    let Some(nvme) = disk.as_nvme() else {
        return Verdict::Skip("virtio-blk has one queue");
    };
    let cpus = smp::online();
    if cpus < 2 {
        return Verdict::Skip("one CPU");
    }
    let before = nvme.queue_stats();
    let wakes_before: Vec<WakeStats> = (0..cpus).map(task::wake_stats_of).collect();
    let mut remotes = Vec::new();
    for cpu in 0..cpus {
        let disk = disk.clone();
        let base = disk.geometry().num_blocks / 8 + cpu as u64 * PER_CPU_REQUESTS * 16;
        match smp::spawn_on(cpu, move || async move {
            io_from_this_cpu(&disk, base, seed ^ cpu as u64).await
        }) {
            Ok(r) => remotes.push((cpu, r)),
            Err(e) => return Verdict::Fail(format!("CPU {cpu}: {e:?}")),
        }
    }
    for (cpu, remote) in remotes {
        match task::timeout(Duration::from_secs(60), remote).await {
            Ok(Ok(())) => {}
            Ok(Err(why)) => return Verdict::Fail(format!("CPU {cpu}: {why}")),
            Err(_) => return Verdict::Fail(format!("CPU {cpu}: its I/O did not finish in 60 s")),
        }
    }
    let pairs: Vec<PairOnCpus> = before
        .iter()
        .zip(nvme.queue_stats())
        .map(|(b, a)| {
            let delta = |a: &[u64], b: &[u64]| a.iter().zip(b).map(|(x, y)| x - y).collect();
            PairOnCpus {
                qid: a.qid,
                cpu: a.cpu,
                submitted_by_cpu: delta(&a.submitted_by_cpu, &b.submitted_by_cpu),
                completed_by_cpu: delta(&a.completed_by_cpu, &b.completed_by_cpu),
                interrupts_by_cpu: delta(&a.interrupts_by_cpu, &b.interrupts_by_cpu),
            }
        })
        .collect();
    let wakes: Vec<WakeStats> = wakes_before
        .iter()
        .enumerate()
        .map(|(cpu, b)| {
            let a = task::wake_stats_of(cpu);
            WakeStats {
                ipis: a.ipis - b.ipis,
                ipis_skipped: a.ipis_skipped - b.ipis_skipped,
            }
        })
        .collect();
    event::emit(Event::BlockCpus {
        check: name.into(),
        cpus,
        pairs: &pairs,
        wakes: &wakes,
    });
    let n = pairs.len();
    let own_entries = shared_entries(&before) == 0;
    for p in &pairs {
        let pair = usize::from(p.qid) - 1;
        for cpu in 0..cpus {
            let routed_here = cpu % n == pair;
            ensure!(
                (p.submitted_by_cpu[cpu] > 0) == routed_here,
                "queue {}: {} commands submitted from CPU {cpu}, which {} routed to it",
                p.qid,
                p.submitted_by_cpu[cpu],
                if routed_here { "is" } else { "is not" }
            );
            let home = cpu == p.cpu;
            let busy = (0..cpus).any(|c| c % n == pair);
            ensure!(
                p.completed_by_cpu[cpu] == 0 || home,
                "queue {} (CPU {}'s): {} completions consumed on CPU {cpu}",
                p.qid,
                p.cpu,
                p.completed_by_cpu[cpu]
            );
            ensure!(
                !home || !busy || p.completed_by_cpu[cpu] > 0,
                "queue {} (CPU {}'s): no completion consumed there",
                p.qid,
                p.cpu
            );
            if mode == CompletionMode::Interrupt && own_entries {
                ensure!(
                    p.interrupts_by_cpu[cpu] == 0 || home,
                    "queue {} (CPU {}'s): {} interrupts delivered to CPU {cpu}",
                    p.qid,
                    p.cpu,
                    p.interrupts_by_cpu[cpu]
                );
                ensure!(
                    !home || !busy || p.interrupts_by_cpu[cpu] > 0,
                    "queue {} (CPU {}'s): no interrupt delivered there",
                    p.qid,
                    p.cpu
                );
            }
        }
    }
    Verdict::Pass(format!(
        "{cpus} CPUs, {PER_CPU_REQUESTS} writes and reads each at once through {n} I/O queue pair{}: every byte read back, each pair's commands completed{} on the CPU it belongs to",
        if n == 1 { "" } else { "s" },
        if mode == CompletionMode::Interrupt && own_entries { " and interrupting" } else { "" }
    ))
}

/// I/O queue pairs whose MSI-X entry another pair shares.
fn shared_entries(stats: &[QueueStats]) -> usize {
    stats
        .iter()
        .filter(|a| {
            a.msix_entry.is_some()
                && stats
                    .iter()
                    .any(|b| b.qid != a.qid && b.msix_entry == a.msix_entry)
        })
        .count()
}

/// From the CPU it runs on: [`PER_CPU_REQUESTS`] patterned writes at once from `base`,
/// then as many reads at once, every byte compared.
async fn io_from_this_cpu(disk: &Disk, base: u64, seed: u64) -> Result<(), String> {
    let bs = disk.geometry().block_size as usize;
    let per = (4096 / bs).max(1);
    let lbas: Vec<u64> = (0..PER_CPU_REQUESTS)
        .map(|i| base + i * per as u64)
        .collect();
    let data: Vec<Vec<u8>> = lbas.iter().map(|&l| pattern(l, per * bs, seed)).collect();
    let writes = lbas
        .iter()
        .zip(&data)
        .map(|(&l, d)| disk.write(l, d, WriteFlags::NONE))
        .collect();
    for r in join_all(writes).await {
        r.map_err(|e| format!("write: {e}"))?;
    }
    let mut back: Vec<Vec<u8>> = lbas.iter().map(|_| vec![0u8; per * bs]).collect();
    let reads = lbas
        .iter()
        .zip(back.iter_mut())
        .map(|(&l, b)| disk.read(l, b))
        .collect();
    for r in join_all(reads).await {
        r.map_err(|e| format!("read: {e}"))?;
    }
    for ((lba, got), want) in lbas.iter().zip(&back).zip(&data) {
        if let Some((at, count)) = mismatch(got, want) {
            return Err(format!(
                "block {lba}: {count} bytes differ, first at offset {at}"
            ));
        }
    }
    Ok(())
}

/// Writes a block through each I/O queue pair of `nvme` (at `base`, 8 blocks apart) and
/// reads it back through the next pair.
async fn every_queue(nvme: &NvmeDisk, base: u64, bs: usize, seed: u64) -> Result<(), String> {
    let n = nvme.io_queues();
    for q in 0..n {
        let lba = base + q as u64 * 8;
        let want = pattern(lba, bs, seed);
        nvme.write_on_queue(q, lba, &want, WriteFlags::NONE)
            .await
            .map_err(|e| format!("write through queue {}: {e}", q + 1))?;
        let other = (q + 1) % n;
        let mut got = vec![0u8; bs];
        nvme.read_on_queue(other, lba, &mut got)
            .await
            .map_err(|e| format!("read through queue {}: {e}", other + 1))?;
        if got != want {
            return Err(format!(
                "block {lba} written through queue {} did not read back through queue {}",
                q + 1,
                other + 1
            ));
        }
    }
    Ok(())
}

/// `SPREAD_REQUESTS` patterned writes spread from the first to the last block, all in
/// flight together, then a flush, then every byte read back (concurrently too).
async fn spread(disk: &Disk, seed: u64) -> Verdict {
    let g = disk.geometry();
    let bs = g.block_size as usize;
    let per = (8192 / bs).max(1);
    let n = SPREAD_REQUESTS as u64;
    if g.num_blocks < n * per as u64 * 2 {
        return Verdict::Skip("disk too small");
    }
    let span = g.num_blocks - per as u64;
    let lbas: Vec<u64> = (0..n).map(|i| i * span / (n - 1)).collect();
    let data: Vec<Vec<u8>> = lbas.iter().map(|&l| pattern(l, per * bs, seed)).collect();
    let peak_before = disk.slot_stats().peak_in_device;
    let writes = lbas
        .iter()
        .zip(&data)
        .map(|(&l, d)| disk.write(l, d, WriteFlags::NONE))
        .collect();
    let failed: Vec<_> = join_all(writes)
        .await
        .into_iter()
        .filter(|r| r.is_err())
        .collect();
    ensure!(
        failed.is_empty(),
        "{} writes failed: {:?}",
        failed.len(),
        failed[0]
    );
    let peak = disk.slot_stats().peak_in_device;
    ensure!(
        peak >= 32,
        "only {peak} requests were in flight at once (before: {peak_before})"
    );
    if let Err(e) = disk.flush().await {
        return Verdict::Fail(format!("flush: {e}"));
    }
    let mut back: Vec<Vec<u8>> = lbas.iter().map(|_| vec![0u8; per * bs]).collect();
    let reads = lbas
        .iter()
        .zip(back.iter_mut())
        .map(|(&l, b)| disk.read(l, b))
        .collect();
    for r in join_all(reads).await {
        if let Err(e) = r {
            return Verdict::Fail(format!("read back: {e}"));
        }
    }
    for ((lba, got), want) in lbas.iter().zip(&back).zip(&data) {
        if let Some((at, count)) = mismatch(got, want) {
            return Verdict::Fail(format!(
                "block {lba}: {count} bytes differ, first at offset {at}"
            ));
        }
    }
    Verdict::Measured(
        format!(
            "{n} writes of {} KiB from block 0 to {}, up to {peak} in flight, flushed, every byte read back",
            per * bs / 1024,
            span + per as u64 - 1
        ),
        Facts::new().with("in_flight", Fact::Number(peak as u64)),
    )
}

/// 32 concurrent FUA writes, read back.
async fn fua(disk: &Disk, seed: u64) -> Verdict {
    let g = disk.geometry();
    let bs = g.block_size as usize;
    let per = (4096 / bs).max(1) as u64;
    let lbas: Vec<u64> = (0..32).map(|i| g.num_blocks / 3 + i * 7 * per).collect();
    let data: Vec<Vec<u8>> = lbas
        .iter()
        .map(|&l| pattern(l, per as usize * bs, !seed))
        .collect();
    let writes = lbas
        .iter()
        .zip(&data)
        .map(|(&l, d)| disk.write(l, d, WriteFlags::FUA))
        .collect();
    for r in join_all(writes).await {
        if let Err(e) = r {
            return Verdict::Fail(format!("FUA write: {e}"));
        }
    }
    for (&lba, want) in lbas.iter().zip(&data) {
        let mut got = vec![0u8; want.len()];
        if let Err(e) = disk.read(lba, &mut got).await {
            return Verdict::Fail(format!("read back: {e}"));
        }
        ensure!(got == *want, "FUA write at block {lba} did not read back");
    }
    Verdict::Pass(format!(
        "32 FUA writes ({}) read back",
        if g.native_fua {
            "native"
        } else {
            "write + flush"
        }
    ))
}

/// Transfers of the largest size (PRP lists for NVMe), page-aligned and not, at both
/// ends of the disk; one block more is refused.
async fn large(disk: &Disk, seed: u64) -> Verdict {
    let g = disk.geometry();
    let max = g.max_transfer as usize;
    let blocks = (max / g.block_size as usize) as u64;
    let cases = [(0, 0), (g.num_blocks - blocks, 4), (g.num_blocks / 2, 512)];
    for (lba, offset) in cases {
        let want = pattern(lba, max, seed ^ 0x1a);
        let mut buf = Placed::new(max, offset);
        buf.get().copy_from_slice(&want);
        if let Err(e) = disk.write(lba, buf.get(), WriteFlags::NONE).await {
            return Verdict::Fail(format!("{max}-byte write at block {lba}: {e}"));
        }
        let mut back = Placed::new(max, (offset + 2048) % 4096);
        if let Err(e) = disk.read(lba, back.get()).await {
            return Verdict::Fail(format!("{max}-byte read at block {lba}: {e}"));
        }
        if let Some((at, count)) = mismatch(back.get(), &want) {
            return Verdict::Fail(format!(
                "{max}-byte transfer at block {lba} (buffer offset {offset}): {count} bytes differ, first at {at}"
            ));
        }
    }
    let mut too_big = vec![0u8; max + g.block_size as usize];
    let r = disk.read(0, &mut too_big).await;
    ensure!(
        r == Err(IoError::BadLength),
        "a transfer above the maximum gave {r:?}"
    );
    Verdict::Measured(
        format!(
            "{} KiB transfers at blocks 0, {} and {} with page offsets 0, 4, 512; {} KiB + 1 block refused",
            max / 1024,
            g.num_blocks - blocks,
            g.num_blocks / 2,
            max / 1024
        ),
        Facts::new().with("transfer_kib", Fact::Number(max as u64 / 1024)),
    )
}

/// Buffers at odd addresses write and read back.
async fn unaligned(disk: &Disk, seed: u64) -> Verdict {
    let g = disk.geometry();
    let len = 3 * g.block_size as usize + 8192;
    let len = len - len % g.block_size as usize;
    for (i, offset) in [1usize, 3, 6].into_iter().enumerate() {
        let lba = g.num_blocks / 4 + i as u64 * 64;
        let want = pattern(lba, len, seed ^ 0x0dd);
        let mut buf = Placed::new(len, offset);
        buf.get().copy_from_slice(&want);
        if let Err(e) = disk.write(lba, buf.get(), WriteFlags::NONE).await {
            return Verdict::Fail(format!("write from offset {offset}: {e}"));
        }
        let mut back = Placed::new(len, 4096 - offset);
        if let Err(e) = disk.read(lba, back.get()).await {
            return Verdict::Fail(format!("read to offset {}: {e}", 4096 - offset));
        }
        ensure!(
            back.get() == want.as_slice(),
            "unaligned transfer at block {lba} (offset {offset}) did not read back"
        );
    }
    Verdict::Pass(format!(
        "{len}-byte transfers from page offsets 1, 3, 6 to 4095, 4093, 4090"
    ))
}

/// Out-of-range and bad-length requests fail (before the device and in it), and the
/// driver keeps working afterwards.
async fn errors(disk: &Disk, seed: u64) -> Verdict {
    let g = disk.geometry();
    let bs = g.block_size as usize;
    let end = g.num_blocks;
    let mut one = vec![0u8; bs];
    let mut two = vec![0u8; 2 * bs];
    let checks: [(&str, Result<(), IoError>, IoError); 6] = [
        (
            "read at the end",
            disk.read(end, &mut one).await,
            IoError::OutOfRange,
        ),
        (
            "write across the end",
            disk.write(end - 1, &two, WriteFlags::NONE).await,
            IoError::OutOfRange,
        ),
        (
            "read at u64::MAX",
            disk.read(u64::MAX, &mut one).await,
            IoError::OutOfRange,
        ),
        (
            "empty read",
            disk.read(0, &mut []).await,
            IoError::BadLength,
        ),
        (
            "partial-block write",
            disk.write(0, &two[..bs / 2], WriteFlags::NONE).await,
            IoError::BadLength,
        ),
        (
            "discard past the end",
            disk.discard(end, 1).await,
            if g.discard {
                IoError::OutOfRange
            } else {
                IoError::Unsupported
            },
        ),
    ];
    for (what, got, want) in checks {
        ensure!(got == Err(want), "{what}: expected {want:?}, got {got:?}");
    }
    // Past the driver's checks, the device itself must refuse, with an error status.
    let device = disk.read_unchecked(end, &mut two).await;
    ensure!(
        matches!(device, Err(IoError::Device(_))),
        "a read past the end sent to the device gave {device:?}"
    );
    let want = pattern(7, 2 * bs, seed ^ 0xe);
    if let Err(e) = disk.write(7, &want, WriteFlags::NONE).await {
        return Verdict::Fail(format!("write after the errors: {e}"));
    }
    if let Err(e) = disk.read(7, &mut two).await {
        return Verdict::Fail(format!("read after the errors: {e}"));
    }
    ensure!(
        two == want,
        "data written after the errors did not read back"
    );
    Verdict::Pass(format!(
        "out of range and bad lengths refused, device refused block {end} with {device:?}, still working"
    ))
}

/// A discard succeeds and the range stays usable.
async fn discard(disk: &Disk, seed: u64) -> Verdict {
    let g = disk.geometry();
    if !g.discard {
        return Verdict::Skip("device does not support discard");
    }
    let lba = g.num_blocks / 8;
    let blocks = (65536 / g.block_size) as u64;
    let want = pattern(lba, 65536, seed ^ 0xd15c);
    let steps = async {
        disk.write(lba, &want, WriteFlags::NONE).await?;
        disk.discard(lba, blocks).await?;
        disk.discard(0, g.num_blocks).await?;
        disk.write(lba, &want, WriteFlags::NONE).await?;
        let mut back = vec![0u8; want.len()];
        disk.read(lba, &mut back).await?;
        Ok::<_, IoError>(back)
    };
    match steps.await {
        Ok(back) if back == want => Verdict::Pass(format!(
            "{blocks} blocks, then the whole disk, discarded; rewritten and read back"
        )),
        Ok(_) => Verdict::Fail("data written after a discard did not read back".into()),
        Err(e) => Verdict::Fail(format!("{e}")),
    }
}

/// Polls `f` once (so a request gets submitted) and reports whether it finished.
async fn poll_once<F: Future>(f: core::pin::Pin<&mut F>) -> bool {
    let mut f = Some(f);
    poll_fn(|cx| Poll::Ready(f.take().expect("polled once").poll(cx).is_ready())).await
}

/// Dropping in-flight requests: the device must not write into the buffer after the
/// drop, and the driver keeps working.
async fn dropped(disk: &Disk, seed: u64) -> Verdict {
    let g = disk.geometry();
    let max = g.max_transfer as usize;
    let lba = g.num_blocks / 2 + 1024;
    let on_disk = pattern(lba, max, seed ^ 0xd0);
    if let Err(e) = disk.write(lba, &on_disk, WriteFlags::NONE).await {
        return Verdict::Fail(format!("setup write: {e}"));
    }
    let abandoned_before = disk.slot_stats().abandoned;
    for offset in [0usize, 1] {
        let mut buf = Placed::new(max, offset);
        {
            let mut read = pin!(disk.read(lba, buf.get()));
            if poll_once(read.as_mut()).await {
                continue; // finished at once: nothing to drop
            }
        }
        // The request is gone. Whatever the device still does must not reach `buf`.
        buf.get().fill(0x5a);
        task::sleep(Duration::from_millis(20)).await;
        ensure!(
            buf.get().iter().all(|&b| b == 0x5a),
            "the device wrote into a buffer after its request was dropped (offset {offset})"
        );
    }
    let abandoned = disk.slot_stats().abandoned - abandoned_before;
    let mut back = vec![0u8; max];
    if let Err(e) = disk.read(lba, &mut back).await {
        return Verdict::Fail(format!("read after the drops: {e}"));
    }
    ensure!(back == on_disk, "data did not read back after the drops");
    Verdict::Pass(format!(
        "{abandoned} in-flight reads dropped (aligned and unaligned), buffers untouched afterwards"
    ))
}

/// Forgetting an in-flight request's future (`mem::forget` runs no destructor): the
/// device must not write into the caller's buffer afterwards, and the driver keeps
/// working. (The request's slot and memory stay taken until the disk is dropped.)
async fn forgotten(disk: &Disk, seed: u64) -> Verdict {
    let g = disk.geometry();
    let max = g.max_transfer as usize;
    let lba = g.num_blocks / 2 + 2048;
    let on_disk = pattern(lba, max, seed ^ 0xf0);
    if let Err(e) = disk.write(lba, &on_disk, WriteFlags::NONE).await {
        return Verdict::Fail(format!("setup write: {e}"));
    }
    let mut buf = vec![0u8; max];
    let mut read = Box::pin(disk.read(lba, &mut buf));
    if poll_once(read.as_mut()).await {
        return Verdict::Skip("the read finished at once: nothing to forget");
    }
    core::mem::forget(read);
    // The caller's buffer is the caller's again; the device must not reach it.
    buf.fill(0x5a);
    task::sleep(Duration::from_millis(20)).await;
    ensure!(
        buf.iter().all(|&b| b == 0x5a),
        "the device wrote into a buffer after its request's future was forgotten"
    );
    let mut back = vec![0u8; max];
    if let Err(e) = disk.read(lba, &mut back).await {
        return Verdict::Fail(format!("read after the forgotten one: {e}"));
    }
    ensure!(
        back == on_disk,
        "data did not read back after the forgotten read"
    );
    Verdict::Pass(format!(
        "an in-flight {} KiB read forgotten, its buffer untouched afterwards",
        max / 1024
    ))
}

/// More requests than the queue holds: the rest wait for slots, all complete.
async fn backpressure(disk: &Disk, seed: u64) -> Verdict {
    let g = disk.geometry();
    let bs = g.block_size as usize;
    let waited_before = disk.slot_stats().waited;
    let base = g.num_blocks / 2 + 4096;
    let data: Vec<Vec<u8>> = (0..FLOOD_REQUESTS as u64)
        .map(|i| pattern(base + i, bs, seed ^ 0xf100d))
        .collect();
    let writes = data
        .iter()
        .enumerate()
        .map(|(i, d)| disk.write(base + i as u64, d, WriteFlags::NONE))
        .collect();
    for r in join_all(writes).await {
        if let Err(e) = r {
            return Verdict::Fail(format!("write: {e}"));
        }
    }
    let waited = disk.slot_stats().waited - waited_before;
    ensure!(
        waited > 0,
        "{FLOOD_REQUESTS} concurrent requests never had to wait for a slot"
    );
    let checked = (g.max_transfer as usize / bs).min(FLOOD_REQUESTS);
    let mut back = vec![0u8; checked * bs];
    if let Err(e) = disk.read(base, &mut back).await {
        return Verdict::Fail(format!("read back: {e}"));
    }
    for (i, want) in data.iter().take(checked).enumerate() {
        ensure!(
            back[i * bs..(i + 1) * bs] == want[..],
            "block {} of the flood did not read back",
            base + i as u64
        );
    }
    Verdict::Pass(format!(
        "{FLOOD_REQUESTS} concurrent writes, {waited} waited for a free slot, {checked} read back"
    ))
}

/// A request whose completion is lost fails with [`IoError::Timeout`] (after the driver
/// aborted it and reset the device), requests in flight with it fail the same way, and
/// the device works again afterwards (NVMe: through every I/O queue pair, which the reset
/// recreated).
async fn recovery(disk: &Disk, seed: u64) -> Verdict {
    let g = disk.geometry();
    let bs = g.block_size as usize;
    let lba = g.num_blocks / 3;
    let want = pattern(lba, 8 * bs, seed ^ 0x713e);
    if let Err(e) = disk.write(lba, &want, WriteFlags::NONE).await {
        return Verdict::Fail(format!("setup write: {e}"));
    }
    disk.inject_lost_completion();
    let started = task::now();
    let mut lost = vec![0u8; 8 * bs];
    let r = disk.read(lba, &mut lost).await;
    let took = task::now().saturating_duration_since(started);
    ensure!(
        r == Err(IoError::Timeout),
        "a request whose completion was lost gave {r:?} after {took:?}"
    );
    // Never before its deadline; the upper bound only catches a recovery that never
    // ends before the harness's own timeout does (it is not a performance check).
    ensure!(
        took >= RECOVERY_TIMEOUT && took < Duration::from_secs(60),
        "the lost request failed after {took:?} (timeout {RECOVERY_TIMEOUT:?})"
    );
    let mut back = vec![0u8; 8 * bs];
    if let Err(e) = disk.read(lba, &mut back).await {
        return Verdict::Fail(format!("read after the recovery: {e}"));
    }
    ensure!(back == want, "data did not read back after the recovery");
    let next = pattern(lba, 8 * bs, !seed);
    if let Err(e) = disk.write(lba, &next, WriteFlags::FUA).await {
        return Verdict::Fail(format!("write after the recovery: {e}"));
    }
    if let Some(nvme) = disk.as_nvme() {
        if let Err(why) = every_queue(nvme, g.num_blocks * 3 / 4, bs, seed ^ 0x713f).await {
            return Verdict::Fail(format!("after the recovery: {why}"));
        }
    }
    Verdict::Pass(format!(
        "lost completion: Timeout after {} ms, device reset and working again ({})",
        took.as_millis(),
        disk.stats_line()
    ))
}
