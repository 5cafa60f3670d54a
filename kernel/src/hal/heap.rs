//! The kernel heap: `talc` over memory carved from the frame allocator at boot, with
//! size-class free lists in front of it (`mm::recycle`: O(1) reuse of small blocks).
//!
//! Every allocator call runs in a critical section, so interrupt handlers could allocate
//! without deadlock (they should not need to). The heap is identity-mapped RAM, so a heap
//! buffer's address is its physical address (see `mm`).

use core::alloc::{GlobalAlloc, Layout};
use core::ptr::{null_mut, NonNull};

use talc::{ErrOnOom, Span, Talc};

use crate::mm::recycle::Recycler;
use crate::sync::IrqLock;

/// The allocator and the free lists in front of it, under one lock.
struct Heap {
    talc: Talc<ErrOnOom>,
    recycler: Recycler,
}

struct KernelHeap(IrqLock<Heap>);

#[global_allocator]
static HEAP: KernelHeap = KernelHeap(IrqLock::new(Heap {
    talc: Talc::new(ErrOnOom),
    recycler: Recycler::new(),
}));

impl Heap {
    /// A block for `layout` (its backing layout: `Recycler::backing`) from talc; when talc
    /// has none, the kept blocks go back to it first, so keeping never causes a failure.
    fn talc_malloc(&mut self, layout: Layout) -> *mut u8 {
        let backing = Recycler::backing(layout);
        // SAFETY: layout has non-zero size (GlobalAlloc contract), and so has its backing.
        if let Ok(p) = unsafe { self.talc.malloc(backing) } {
            return p.as_ptr();
        }
        self.drain();
        // SAFETY: as above.
        unsafe { self.talc.malloc(backing) }.map_or(null_mut(), |p| p.as_ptr())
    }

    /// Gives every kept block back to talc.
    fn drain(&mut self) {
        let talc = &mut self.talc;
        self.recycler.drain(|addr, backing| {
            // SAFETY: the recycler holds only blocks talc returned for this backing
            // layout, each freed by its owner and kept once.
            unsafe { talc.free(NonNull::new_unchecked(addr as *mut u8), backing) }
        });
    }
}

// SAFETY: talc implements a correct allocator over the memory it was given; the lock
// serialises all access to it. Every talc call passes the backing layout of what the
// caller asked for (`Recycler::backing`), so a block is freed with the layout it was
// allocated with, and a kept block is only handed out for a request of its class, which
// its backing size covers.
unsafe impl GlobalAlloc for KernelHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.0.lock(|h| match h.recycler.take(layout) {
            Some(addr) => addr as *mut u8,
            None => h.talc_malloc(layout),
        })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.0.lock(|h| {
            if !h.recycler.keep(ptr as usize, layout) {
                // SAFETY: the caller passes a pointer this allocator returned for `layout`,
                // so talc returned it for the backing layout.
                unsafe {
                    h.talc
                        .free(NonNull::new_unchecked(ptr), Recycler::backing(layout))
                }
            }
        });
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator, so it is not null.
        let ptr = unsafe { NonNull::new_unchecked(ptr) };
        // The GlobalAlloc contract: `new_size`, rounded up to `layout.align()`, is valid.
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return null_mut();
        };
        let (old, new) = (Recycler::backing(layout), Recycler::backing(new_layout));
        if old == new {
            return ptr.as_ptr(); // the same class: the block already fits
        }
        self.0.lock(|h| {
            if new.size() < old.size() {
                // SAFETY: talc allocated `ptr` for `old`; it shrinks in place.
                unsafe { h.talc.shrink(ptr, old, new.size()) };
                return ptr.as_ptr();
            }
            // SAFETY: talc allocated `ptr` for `old` (the same alignment as `new`).
            if let Ok(p) = unsafe { h.talc.grow(ptr, old, new.size()) } {
                return p.as_ptr();
            }
            h.drain();
            // SAFETY: as above; a failed grow leaves the block as it was.
            unsafe { h.talc.grow(ptr, old, new.size()) }.map_or(null_mut(), |p| p.as_ptr())
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
        .lock(|h| unsafe { h.talc.claim(span) })
        .expect("heap rejected its memory");
}

/// Heap counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Bytes handed to the heap.
    pub claimed: u64,
    /// Bytes in live allocations.
    pub allocated: u64,
    /// Bytes free for allocation (the free lists' blocks included).
    pub available: u64,
    /// Live allocations.
    pub allocations: u64,
    /// Allocations ever made.
    pub total_allocations: u64,
    /// Bytes of freed blocks kept in the size-class free lists for reuse.
    pub recycled: u64,
}

/// The heap's counters now.
pub fn stats() -> HeapStats {
    HEAP.0.lock(|h| {
        let c = h.talc.get_counters();
        // talc counts the kept blocks as allocated.
        let kept = h.recycler.stats();
        HeapStats {
            claimed: c.claimed_bytes as u64,
            allocated: c.allocated_bytes as u64 - kept.bytes,
            available: c.available_bytes as u64 + kept.bytes,
            allocations: c.allocation_count as u64 - kept.blocks,
            total_allocations: c.total_allocation_count + kept.hits,
            recycled: kept.bytes,
        }
    })
}
