//! The kernel heap: `talc` over memory carved from the frame allocator at boot.
//!
//! Every allocator call runs in a critical section, so interrupt handlers could allocate
//! without deadlock (they should not need to). The heap is identity-mapped RAM, so a heap
//! buffer's address is its physical address (see `mm`).

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::{null_mut, NonNull};

use talc::{ErrOnOom, Span, Talc};

use crate::sync::IrqLock;

struct KernelHeap(IrqLock<Talc<ErrOnOom>>);

#[global_allocator]
static HEAP: KernelHeap = KernelHeap(IrqLock::new(Talc::new(ErrOnOom)));

// SAFETY: talc implements a correct allocator over the memory it was given; the lock
// serialises all access to it.
unsafe impl GlobalAlloc for KernelHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: layout has non-zero size (GlobalAlloc contract).
        self.0
            .lock(|t| unsafe { t.malloc(layout) })
            .map_or(null_mut(), |p| p.as_ptr())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller passes a pointer this allocator returned, with its layout.
        self.0
            .lock(|t| unsafe { t.free(NonNull::new_unchecked(ptr), layout) });
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator, so it is not null.
        let ptr = unsafe { NonNull::new_unchecked(ptr) };
        // SAFETY: as for dealloc; talc's grow/shrink take the same contract as realloc.
        self.0.lock(|t| unsafe {
            if new_size > layout.size() {
                t.grow(ptr, layout, new_size)
                    .map_or(null_mut(), |p| p.as_ptr())
            } else {
                t.shrink(ptr, layout, new_size);
                ptr.as_ptr()
            }
        })
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
        .lock(|t| unsafe { t.claim(span) })
        .expect("heap rejected its memory");
}

/// Heap counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Bytes handed to the heap.
    pub claimed: u64,
    /// Bytes in live allocations.
    pub allocated: u64,
    /// Bytes free for allocation.
    pub available: u64,
    /// Live allocations.
    pub allocations: u64,
    /// Allocations ever made.
    pub total_allocations: u64,
}

/// The heap's counters now.
pub fn stats() -> HeapStats {
    HEAP.0.lock(|t| {
        let c = t.get_counters();
        HeapStats {
            claimed: c.claimed_bytes as u64,
            allocated: c.allocated_bytes as u64,
            available: c.available_bytes as u64,
            allocations: c.allocation_count as u64,
            total_allocations: c.total_allocation_count,
        }
    })
}
