//! The kernel heap: `talc` over memory carved from the frame allocator at boot, with
//! per-CPU caches and shared free lists of small blocks in front of it (`mm::heap`: the
//! policy, host-tested; here only the wiring and the `unsafe` calls).
//!
//! Every allocator call runs with interrupts off on its CPU (the caches' and the global
//! lock are `IrqLock`s), so interrupt handlers could allocate without deadlock (they
//! should not need to). The heap is identity-mapped RAM, so a heap buffer's address is
//! its physical address (see `mm`).

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::{null_mut, NonNull};

use talc::{ErrOnOom, Span, Talc};

use super::percpu::{self, MAX_CPUS};
use crate::mm::heap::{Backing, BackingCounters, Heap};

pub use crate::mm::heap::HeapStats;

/// talc as the heap's allocator.
struct TalcBacking(Talc<ErrOnOom>);

/// A pointer from talc, as the address `mm::heap` keeps.
fn addr(p: NonNull<u8>) -> usize {
    p.as_ptr() as usize
}

/// An address `mm::heap` had from talc, as the pointer it was.
fn ptr(addr: usize) -> NonNull<u8> {
    NonNull::new(addr as *mut u8).expect("talc hands out no null block")
}

// Every `unsafe` call below relies on `mm::heap`'s side of the `Backing` contract: it
// passes only blocks talc handed out and has not taken back, with the layout they were
// handed out for (the backing layout of the caller's request, `mm::recycle::backing`),
// and sizes that are not zero (the `GlobalAlloc` contract; a class's size is at least 16).
impl Backing for TalcBacking {
    fn malloc(&mut self, layout: Layout) -> Option<usize> {
        // SAFETY: `layout` has a non-zero size (above).
        unsafe { self.0.malloc(layout) }.ok().map(addr)
    }

    fn free(&mut self, addr: usize, layout: Layout) {
        // SAFETY: talc handed out `addr` for `layout` (above).
        unsafe { self.0.free(ptr(addr), layout) }
    }

    fn grow(&mut self, addr: usize, layout: Layout, new_size: usize) -> Option<usize> {
        // SAFETY: talc handed out `addr` for `layout` (above), and `mm::heap` grows only
        // to a larger size; a failed grow leaves the block as it was.
        unsafe { self.0.grow(ptr(addr), layout, new_size) }
            .ok()
            .map(self::addr)
    }

    fn shrink(&mut self, addr: usize, layout: Layout, new_size: usize) {
        // SAFETY: talc handed out `addr` for `layout` (above), and `mm::heap` shrinks
        // only to a smaller, non-zero size.
        unsafe { self.0.shrink(ptr(addr), layout, new_size) }
    }

    fn counters(&self) -> BackingCounters {
        let c = self.0.get_counters();
        BackingCounters {
            claimed: c.claimed_bytes as u64,
            allocated: c.allocated_bytes as u64,
            available: c.available_bytes as u64,
            blocks: c.allocation_count as u64,
        }
    }
}

struct KernelHeap(Heap<TalcBacking, MAX_CPUS>);

#[global_allocator]
static HEAP: KernelHeap = KernelHeap(Heap::new(TalcBacking(Talc::new(ErrOnOom))));

// SAFETY: talc is a correct allocator over the memory it was given, and `mm::heap` (its
// host tests check this against a fake allocator) hands a block out only once until it
// is freed, only for a request its backing layout covers (its class's size and
// alignment, or the request's own), and gives talc back exactly what talc handed out.
// `percpu::index()` is valid on every CPU from its first instruction in Rust (`kmain`
// and `ap_main` set it up before anything allocates), and is only a hint: a wrong index
// would contend for another CPU's cache, not corrupt it.
unsafe impl GlobalAlloc for KernelHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.0
            .alloc(percpu::index(), layout)
            .map_or(null_mut(), |a| a as *mut u8)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.0.dealloc(percpu::index(), ptr as usize, layout);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let copy = |to: usize| {
            // SAFETY: `ptr` is a live block of `layout.size()` bytes (the caller's
            // contract), `to` a new block of at least `new_size`, distinct from it.
            unsafe {
                core::ptr::copy_nonoverlapping(ptr, to as *mut u8, layout.size().min(new_size))
            }
        };
        self.0
            .realloc(percpu::index(), ptr as usize, layout, new_size, copy)
            .map_or(null_mut(), |a| a as *mut u8)
    }
}

/// Hands `base..base + len` to the heap.
///
/// # Panics
/// If talc rejects the span (too small to hold its metadata).
pub fn add_memory(base: u64, len: u64) {
    let span = Span::from_base_size(base as *mut u8, len as usize);
    // SAFETY: callers pass frames they allocated from the frame allocator for the heap:
    // identity-mapped RAM that nothing else uses, for the rest of the kernel's life.
    HEAP.0
        .with_backing(|t| unsafe { t.0.claim(span) })
        .expect("heap rejected its memory");
}

/// The heap's counters now.
pub fn stats() -> HeapStats {
    HEAP.0.stats()
}
