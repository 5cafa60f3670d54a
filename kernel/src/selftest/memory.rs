//! Heap, frame allocator and page-table checks.

use alloc::boxed::Box;
use alloc::format;
use alloc::vec::Vec;

use super::{ensure, Verdict};
use crate::hal::{gdt, heap, memory, paging};
use crate::mm::setup::MemorySummary;
use crate::mm::{phys_addr_of, DmaBuffer, PAGE_SIZE};

const MIB: u64 = 1 << 20;

fn pattern(seed: usize, i: usize) -> u8 {
    (seed.wrapping_mul(31) ^ i.wrapping_mul(7)) as u8
}

/// Many small allocations of varied sizes with patterns, interleaved frees, and one large
/// allocation of a quarter of the free heap; afterwards the heap is back where it was.
pub fn heap(mem: &MemorySummary) -> Verdict {
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
        let addr = phys_addr_of(big.as_ptr());
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
    Verdict::Pass(format!(
        "heap {} MiB, {} allocations made, largest {} MiB",
        mem.heap / MIB,
        after.total_allocations - before.total_allocations,
        large as u64 / MIB
    ))
}

/// Contiguous DMA buffers: zeroed, aligned, distinct, and returned on drop.
pub fn frames() -> Verdict {
    let before = memory::stats();
    {
        let mut bufs = Vec::new();
        for i in 0..64usize {
            let len = (1 + i % 16) * PAGE_SIZE as usize;
            let Ok(mut b) = DmaBuffer::new(len) else {
                return Verdict::Fail(format!("DmaBuffer::new({len}) failed"));
            };
            ensure!(b.phys_addr() % PAGE_SIZE == 0, "unaligned DMA buffer {b:?}");
            ensure!(
                b.as_slice().iter().all(|x| *x == 0),
                "DMA buffer {b:?} not zeroed"
            );
            b.as_mut_slice().fill(i as u8);
            bufs.push(b);
        }
        bufs.sort_by_key(|b| b.phys_addr());
        for w in bufs.windows(2) {
            ensure!(
                w[0].phys_addr() + w[0].len() as u64 <= w[1].phys_addr(),
                "DMA buffers overlap: {:?} {:?}",
                w[0],
                w[1]
            );
        }
        for b in &bufs {
            let v = b.as_slice()[0];
            ensure!(
                b.as_slice().iter().all(|x| *x == v),
                "DMA buffer {b:?} corrupted"
            );
        }
        let Ok(aligned) = DmaBuffer::with_alignment(PAGE_SIZE as usize, 2 * MIB as usize) else {
            return Verdict::Fail("2 MiB-aligned buffer failed".into());
        };
        ensure!(
            aligned.phys_addr() % (2 * MIB) == 0,
            "{aligned:?} not 2 MiB-aligned"
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
    let stacks = gdt::stacks();
    for s in &stacks {
        ensure!(
            paging::translate(s.guard.start).is_none(),
            "guard page of the {} stack is mapped",
            s.name
        );
        ensure!(
            paging::translate(s.stack.start).is_some_and(|m| m.writable),
            "the {} stack is not writable",
            s.name
        );
    }
    let heap_byte = Box::new(7u8);
    let addr = phys_addr_of(&*heap_byte);
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
