//! Heap, frame allocator and page-table checks.

use alloc::boxed::Box;
use alloc::format;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use core::time::Duration;

use super::{ensure, Verdict};
use crate::hal::{gdt, heap, memory, paging};
use crate::mm::setup::MemorySummary;
use crate::mm::PAGE_SIZE;
use crate::{clock, smp, task};

const MIB: u64 = 1 << 20;

fn pattern(seed: usize, i: usize) -> u8 {
    (seed.wrapping_mul(31) ^ i.wrapping_mul(7)) as u8
}

/// Many small allocations of varied sizes with patterns, interleaved frees, and one large
/// allocation of a quarter of the free heap; afterwards the heap is back where it was.
/// Then what an allocation costs, on one CPU and on all at once.
pub async fn heap(mem: &MemorySummary) -> Verdict {
    // The other CPUs first finish what the boot sent them: their frees would count here.
    task::sleep(Duration::from_millis(10)).await;
    let before = heap::stats();
    ensure!(
        before.claimed == mem.heap,
        "heap claims {} bytes, setup gave it {}",
        before.claimed,
        mem.heap
    );
    {
        // (seed, block): every block keeps the pattern of its seed while others come and go.
        let mut blocks: Vec<(usize, Box<[u8]>)> = Vec::new();
        let mut next_seed = 0;
        for round in 0..3 {
            for i in 0..600usize {
                let size = 1 + (i * 97 + round * 13) % 5000;
                let seed = next_seed;
                next_seed += 1;
                blocks.push((seed, (0..size).map(|k| pattern(seed, k)).collect()));
            }
            let mut k = 0;
            blocks.retain(|_| {
                k += 1;
                k % 3 != 0
            });
            for (seed, block) in &blocks {
                let intact = block
                    .iter()
                    .enumerate()
                    .all(|(k, b)| *b == pattern(*seed, k));
                ensure!(intact, "block {seed} ({} bytes) corrupted", block.len());
            }
        }
    }
    let large = (heap::stats().available / 4) as usize;
    {
        let mut big: Vec<u8> = Vec::new();
        ensure!(
            big.try_reserve_exact(large).is_ok(),
            "allocating {} MiB failed",
            large as u64 / MIB
        );
        big.resize(large, 0);
        for (i, b) in big.iter_mut().enumerate().step_by(4093) {
            *b = pattern(1, i);
        }
        let addr = big.as_ptr() as u64;
        ensure!(
            big.iter()
                .enumerate()
                .step_by(4093)
                .all(|(i, b)| *b == pattern(1, i)),
            "large allocation at {addr:#x} lost its pattern"
        );
    }
    // Too large must fail cleanly, not crash.
    let mut impossible: Vec<u8> = Vec::new();
    ensure!(
        impossible.try_reserve_exact(mem.heap as usize * 2).is_err(),
        "allocating twice the heap succeeded"
    );
    let after = heap::stats();
    ensure!(
        after.allocated == before.allocated && after.allocations == before.allocations,
        "leak: {} bytes in {} allocations before, {} in {} after",
        before.allocated,
        before.allocations,
        after.allocated,
        after.allocations
    );
    // Last: work sent to other CPUs leaves its task to be freed there after it answers.
    let cost = Cost::measure().await;
    Verdict::Pass(format!(
        "heap {} MiB, {} allocations made, largest {} MiB; {cost}",
        mem.heap / MIB,
        after.total_allocations - before.total_allocations,
        large as u64 / MIB
    ))
}

/// What an allocation and its free cost, timed (reported, never judged: the figures
/// depend on the host and the accelerator). Each figure is the fastest of
/// [`Cost::ROUNDS`] rounds: the cost itself, without the rounds in which the host ran
/// something else.
struct Cost {
    /// Nanoseconds per allocation and free of a 64-byte block, one at a time.
    small_ns: u64,
    /// Nanoseconds per allocation and free of a 4 KiB block, one at a time.
    page_ns: u64,
    /// Nanoseconds per allocation and free when 64 blocks of 64 bytes to 4 KiB are
    /// allocated and then freed together (a burst, like a batch of requests).
    burst_ns: u64,
    /// `small_ns` on each CPU, every CPU allocating at the same time (empty with one).
    small_ns_every_cpu: Vec<u64>,
}

impl Cost {
    const ROUNDS: usize = 25;
    const PER_ROUND: usize = 4096;
    const BURST: usize = 64;

    async fn measure() -> Cost {
        Cost {
            small_ns: Self::small(),
            page_ns: Self::per_block(|_| 4096, 1),
            burst_ns: Self::per_block(|i| 64 << (i % 7), Self::BURST),
            small_ns_every_cpu: Self::small_on_every_cpu().await,
        }
    }

    fn small() -> u64 {
        Self::per_block(|_| 64, 1)
    }

    /// Nanoseconds per allocation and free, `depth` blocks held at a time, the `i`th of
    /// each go `size(i)` bytes.
    fn per_block(size: impl Fn(usize) -> usize, depth: usize) -> u64 {
        let mut held: Vec<Vec<u8>> = Vec::with_capacity(depth);
        let mut rounds = [0; Self::ROUNDS];
        for round in &mut rounds {
            let start = clock::now();
            for _ in 0..Self::PER_ROUND / depth {
                for i in 0..depth {
                    held.push(core::hint::black_box(Vec::with_capacity(size(i))));
                }
                held.clear();
            }
            let elapsed = clock::now().saturating_duration_since(start);
            *round = elapsed.as_nanos() as u64 / (Self::PER_ROUND / depth * depth) as u64;
        }
        rounds.into_iter().min().unwrap_or_default()
    }

    /// [`Cost::small`] on every online CPU at once: CPU 0 sends the loop to the others
    /// and starts them together once all are ready (or after a second).
    async fn small_on_every_cpu() -> Vec<u64> {
        let ready = Arc::new(AtomicUsize::new(0));
        let go = Arc::new(AtomicBool::new(false));
        let mut others = Vec::new();
        for cpu in 1..smp::online() {
            let (ready, go) = (ready.clone(), go.clone());
            let job = move || async move {
                ready.fetch_add(1, Ordering::AcqRel);
                while !go.load(Ordering::Acquire) {
                    core::hint::spin_loop();
                }
                Self::small()
            };
            if let Ok(remote) = smp::spawn_on(cpu, job) {
                others.push(remote);
            }
        }
        if others.is_empty() {
            return Vec::new();
        }
        let deadline = clock::now() + Duration::from_secs(1);
        while ready.load(Ordering::Acquire) < others.len() && clock::now() < deadline {
            core::hint::spin_loop();
        }
        go.store(true, Ordering::Release);
        let mut ns = alloc::vec![Self::small()];
        for remote in others {
            if let Ok(other) = task::timeout(Duration::from_secs(5), remote).await {
                ns.push(other);
            }
        }
        ns
    }
}

impl core::fmt::Display for Cost {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "alloc+free {} ns (64 B), {} ns (4 KiB), {} ns (bursts of {})",
            self.small_ns,
            self.page_ns,
            self.burst_ns,
            Self::BURST
        )?;
        if !self.small_ns_every_cpu.is_empty() {
            write!(
                f,
                ", {:?} ns (64 B, on {} CPUs at once)",
                self.small_ns_every_cpu,
                self.small_ns_every_cpu.len()
            )?;
        }
        Ok(())
    }
}

/// A run of frames from the allocator, returned when dropped.
struct Run {
    addr: u64,
    pages: usize,
}

impl Run {
    fn alloc(pages: usize, align_frames: usize) -> Option<Run> {
        let addr = memory::alloc_zeroed_frames(pages, align_frames).ok()?;
        Some(Run { addr, pages })
    }

    fn end(&self) -> u64 {
        self.addr + self.pages as u64 * PAGE_SIZE
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        memory::free_frames(self.addr, self.pages);
    }
}

/// The frame allocator (where DMA memory comes from): contiguous runs, aligned, distinct,
/// and every frame returned. (Their contents are checked with a device: `dma`.)
pub fn frames() -> Verdict {
    let before = memory::stats();
    {
        let mut runs = Vec::new();
        for i in 0..64usize {
            let pages = 1 + i % 16;
            let Some(run) = Run::alloc(pages, 1) else {
                return Verdict::Fail(format!("allocating {pages} frames failed"));
            };
            ensure!(
                run.addr % PAGE_SIZE == 0,
                "unaligned run at {:#x}",
                run.addr
            );
            runs.push(run);
        }
        runs.sort_by_key(|r| r.addr);
        for w in runs.windows(2) {
            ensure!(
                w[0].end() <= w[1].addr,
                "runs overlap: {:#x}..{:#x} and {:#x}",
                w[0].addr,
                w[0].end(),
                w[1].addr
            );
        }
        let frames_per_2mib = (2 * MIB / PAGE_SIZE) as usize;
        let Some(aligned) = Run::alloc(1, frames_per_2mib) else {
            return Verdict::Fail("2 MiB-aligned frame failed".into());
        };
        ensure!(
            aligned.addr % (2 * MIB) == 0,
            "{:#x} not 2 MiB-aligned",
            aligned.addr
        );
    }
    let after = memory::stats();
    ensure!(
        after.free == before.free,
        "frames leaked: {} free before, {} after",
        before.free,
        after.free
    );
    Verdict::Pass(format!(
        "{} MiB managed, {} MiB free",
        after.managed * PAGE_SIZE / MIB,
        after.free * PAGE_SIZE / MIB
    ))
}

/// Permissions of the kernel image, guard pages and page 0.
pub fn paging() -> Verdict {
    let layout = boot::layout::kernel_layout();
    let text = paging::translate(layout.text.start);
    ensure!(
        text.is_some_and(|m| m.executable && !m.writable),
        "text mapped as {text:?}"
    );
    let rodata = paging::translate(layout.rodata.start);
    ensure!(
        rodata.is_some_and(|m| !m.executable && !m.writable),
        "rodata mapped as {rodata:?}"
    );
    let data = paging::translate(layout.data.start);
    ensure!(
        data.is_some_and(|m| !m.executable && m.writable && m.phys == layout.data.start),
        "data mapped as {data:?}"
    );
    ensure!(paging::translate(0).is_none(), "page 0 is mapped");
    let stacks: Vec<_> = gdt::stacks().collect();
    for s in &stacks {
        ensure!(
            paging::translate(s.guard.start).is_none(),
            "guard page of the {s} is mapped"
        );
        ensure!(
            paging::translate(s.stack.start).is_some_and(|m| m.writable),
            "the {s} is not writable"
        );
    }
    let heap_byte = Box::new(7u8);
    let addr = &*heap_byte as *const u8 as u64;
    let heap_map = paging::translate(addr);
    ensure!(
        heap_map.is_some_and(|m| m.phys == addr && !m.executable),
        "heap at {addr:#x} mapped as {heap_map:?}"
    );
    Verdict::Pass(format!(
        "W^X image, {} guard pages unmapped, page 0 unmapped",
        stacks.len()
    ))
}
