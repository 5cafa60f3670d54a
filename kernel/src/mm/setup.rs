//! Boot-time memory setup: frame allocator, page tables, heap.

use core::ops::Range;

use boot::BootInfo;

use super::memmap;
use super::PAGE_SIZE;
use crate::hal::{gdt, heap, memory, paging};

/// Share of the free frames (after page tables) that goes to the heap; the rest stays in
/// the frame allocator for DMA buffers, MMIO page tables and later growth.
const HEAP_SHARE_PERCENT: u64 = 75;
/// The smallest heap chunk worth claiming when RAM is fragmented.
const MIN_HEAP_CHUNK: u64 = 1 << 20;

/// What [`init`] set up, for the log and the self-test.
#[derive(Clone, Copy, Debug)]
pub struct MemorySummary {
    /// RAM the loader reported (type RAM), in bytes.
    pub ram_reported: u64,
    /// Frames the frame allocator manages, in bytes.
    pub managed: u64,
    /// Bytes given to the heap.
    pub heap: u64,
    /// Pieces the heap was given in.
    pub heap_chunks: usize,
    /// Frames left for DMA and page tables, in bytes.
    pub frames_free: u64,
    /// Page mapping statistics.
    pub map: paging::MapSummary,
}

/// Sets up physical memory management from the loader's memory map.
pub fn init(info: &BootInfo) -> MemorySummary {
    let layout = boot::layout::kernel_layout();
    let map = info.memory_map();
    let usable = memmap::usable_ram(map, core::slice::from_ref(&layout.image));
    let bitmap = memory::init(&usable);
    log::debug!(
        "frame bitmap at {:#x} ({} KiB)",
        bitmap.addr,
        bitmap.bytes / 1024
    );
    let mut stacks = gdt::stacks();
    let guards: [Range<u64>; gdt::STACK_COUNT] =
        core::array::from_fn(|_| stacks.next().expect("STACK_COUNT stacks").guard);
    let map_summary = paging::init(&memmap::all_ram(map), &layout, &guards);

    let free = memory::stats().free * PAGE_SIZE;
    let mut want = free * HEAP_SHARE_PERCENT / 100 / PAGE_SIZE * PAGE_SIZE;
    let mut heap_bytes = 0;
    let mut chunks = 0;
    let mut chunk = want;
    while want >= MIN_HEAP_CHUNK && chunk >= MIN_HEAP_CHUNK {
        match memory::alloc_frames((chunk / PAGE_SIZE) as usize, 1) {
            Ok(addr) => {
                heap::add_memory(addr, chunk);
                heap_bytes += chunk;
                chunks += 1;
                want -= chunk;
                chunk = chunk.min(want);
            }
            Err(_) => chunk = (chunk / 2).next_multiple_of(PAGE_SIZE),
        }
    }
    let ram_reported = map
        .iter()
        .filter(|r| r.kind == boot::MemoryKind::Ram)
        .map(|r| r.len)
        .sum();
    let stats = memory::stats();
    MemorySummary {
        ram_reported,
        managed: stats.managed * PAGE_SIZE,
        heap: heap_bytes,
        heap_chunks: chunks,
        frames_free: stats.free * PAGE_SIZE,
        map: map_summary,
    }
}
