//! The kernel heap's policy: per-CPU caches of small blocks in front of one global
//! allocator, so that most allocations and frees take no lock another CPU wants.
//!
//! Three layers, after Bonwick's magazines and depot (slab allocator, 2001):
//! - **each CPU's cache**: size-class free lists ([`Recycler`]) under the CPU's own lock.
//!   A small allocation (one with a [`Class`]) is served from the running CPU's cache; a
//!   free goes to the running CPU's cache, whichever CPU allocated the block;
//! - **the depot**: free lists shared by every CPU, under the global lock with the
//!   allocator. When a CPU's list for a class is empty, one acquisition of the global
//!   lock refills it with a [`batch`] (from the depot, then the allocator); when the list
//!   is full, one acquisition gives a batch back (to the depot, or the allocator when the
//!   depot is full). Blocks freed on one CPU and allocated on another flow through it;
//! - **the allocator** ([`Backing`]: `talc` in the kernel), which alone serves larger
//!   blocks.
//!
//! What the caches may hold is bounded ([`CPU_CACHE`], [`DEPOT`]), and it is all counted
//! as free ([`HeapStats`]). Before an allocation fails, every CPU's cache and the depot
//! go back to the allocator and it is tried once more: caching never turns a satisfiable
//! request into a failure.
//!
//! Why each CPU's cache is behind a lock (an [`IrqLock`]) rather than reachable by its
//! CPU alone:
//! - its CPU takes it uncontended: one atomic operation on a cache line only that CPU
//!   writes. The lock also keeps interrupts off while the lists change, which they need
//!   anyway: an interrupt handler that allocated in the middle of an update would
//!   corrupt them;
//! - another CPU can take it: to drain the cache before an allocation fails (a "drain
//!   requested" flag would wait for its owner, which may be halted, or busy without
//!   allocating), and to read every cache at one instant, so the counters are exact;
//! - nothing depends on the caller passing the CPU it runs on: code that used another
//!   CPU's cache would only contend.
//!
//! Lock order: at most one CPU's cache lock, then the global lock; only [`Heap::stats`]
//! holds several caches' locks, taken in index order. The allocator takes no lock.

use core::alloc::Layout;

use super::recycle::{backing, Class, Limits, Recycler};
use crate::sync::IrqLock;

/// The allocator behind the caches. Its addresses are plain numbers here: only the
/// implementation (in `hal`) turns them into memory.
///
/// The heap keeps its side of the contract: it frees, grows and shrinks only blocks the
/// allocator handed out, not freed since, with the layout they were handed out for; and
/// it never holds on to a block the allocator has back. Its host tests check this
/// against a fake allocator that verifies every call.
pub trait Backing {
    /// A free block for `layout` (of non-zero size), or `None` when there is no room.
    fn malloc(&mut self, layout: Layout) -> Option<usize>;
    /// Takes back the block at `addr`, handed out for `layout`.
    fn free(&mut self, addr: usize, layout: Layout);
    /// The block at `addr` (handed out for `layout`) grown to `new_size` bytes, in
    /// place or moved with its contents; `None` (the block unchanged) when there is no
    /// room.
    fn grow(&mut self, addr: usize, layout: Layout, new_size: usize) -> Option<usize>;
    /// Shrinks the block at `addr` (handed out for `layout`) in place to `new_size`
    /// bytes; it is then handed out for `layout` with that size.
    fn shrink(&mut self, addr: usize, layout: Layout, new_size: usize);
    /// What the allocator holds.
    fn counters(&self) -> BackingCounters;
}

/// An allocator's own counters: every block the caches hold is handed out, to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackingCounters {
    /// Bytes it manages.
    pub claimed: u64,
    /// Bytes in blocks handed out.
    pub allocated: u64,
    /// Bytes free for allocation.
    pub available: u64,
    /// Blocks handed out.
    pub blocks: u64,
}

/// What one CPU's cache may hold: per class, two batches' worth (at most 64 KiB, at least
/// two blocks); 512 KiB in all, so with 16 CPUs at most 8 MiB sits in CPU caches.
pub const CPU_CACHE: Limits = Limits {
    bytes: 512 << 10,
    class_bytes: 2 * BATCH_BYTES,
    class_min: 2,
    class_max: 2 * MAX_BATCH as u16,
};

/// What the depot may hold: 32 blocks per class, enough for the churn of requests in
/// flight, so that a burst of one size freed at once cannot fill it for every other
/// size; 2 MiB in all.
pub const DEPOT: Limits = Limits {
    bytes: 2 << 20,
    class_bytes: 0,
    class_min: 32,
    class_max: 32,
};

/// Slots of one CPU's cache: a third bound, in blocks (full lists of 32 small classes);
/// a cache out of slots gives blocks back like a full one.
const CPU_SLOTS: usize = 1024;
/// Slots of the depot: 32 blocks of 128 classes.
const DEPOT_SLOTS: usize = 4096;

/// A batch moved between a CPU's cache and the depot is about this many bytes...
const BATCH_BYTES: usize = 32 << 10;
/// ... and at most this many blocks.
const MAX_BATCH: usize = 16;

/// How many blocks of `class` one acquisition of the global lock moves between a CPU's
/// cache and the depot: 16 of up to 2 KiB, 8 of 4 KiB, 2 of 16 KiB.
pub fn batch(class: Class) -> usize {
    (BATCH_BYTES / class.size()).clamp(1, MAX_BATCH)
}

/// One CPU's cache and what it has done.
#[derive(Debug)]
struct CpuCache {
    lists: Recycler<CPU_SLOTS>,
    /// Allocations it served (refilled or not).
    allocations: u64,
    /// Allocations that found its list empty and refilled it.
    refills: u64,
    /// Frees that found it full and gave blocks back.
    flushes: u64,
}

/// A CPU's cache on cache lines of its own: its lock is written by that CPU alone.
#[derive(Debug)]
#[repr(align(64))]
struct CpuSlot(IrqLock<CpuCache>);

/// The allocator and the depot, under the global lock.
#[derive(Debug)]
struct Global<B> {
    backing: B,
    depot: Recycler<DEPOT_SLOTS>,
    /// Allocations served by the allocator itself (large blocks, and after a drain).
    direct_allocations: u64,
    /// Times every cache was drained because an allocation would have failed.
    drains: u64,
}

/// The heap: per-CPU caches for `CPUS` CPUs and the depot in front of the allocator `B`;
/// see the module documentation. Callers pass the index of the CPU they run on.
pub struct Heap<B, const CPUS: usize> {
    cpus: [CpuSlot; CPUS],
    global: IrqLock<Global<B>>,
}

/// The heap's counters. Every block a cache holds is free: `allocated` and `allocations`
/// leave them out, and `available` counts them in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Bytes handed to the heap.
    pub claimed: u64,
    /// Bytes in live allocations (as backed: small ones rounded up to their class).
    pub allocated: u64,
    /// Bytes free for allocation (the caches' blocks included).
    pub available: u64,
    /// Live allocations.
    pub allocations: u64,
    /// Allocations ever made.
    pub total_allocations: u64,
    /// Bytes of freed small blocks in the depot, the free lists all CPUs share.
    pub recycled: u64,
    /// Bytes of freed small blocks in the CPUs' caches.
    pub cpu_cached: u64,
    /// Allocations that found their CPU's list for their class empty and refilled it
    /// from the depot and the allocator (each one acquisition of the global lock).
    pub cpu_refills: u64,
    /// Frees that found their CPU's cache full and gave a batch back (each one
    /// acquisition of the global lock).
    pub cpu_flushes: u64,
    /// Times every cache went back to the allocator because an allocation would
    /// otherwise have failed.
    pub drains: u64,
}

/// The CPU caches' counters, summed.
#[derive(Clone, Copy, Debug, Default)]
struct CacheTotals {
    bytes: u64,
    blocks: u64,
    allocations: u64,
    refills: u64,
    flushes: u64,
}

impl<B: Backing, const CPUS: usize> Heap<B, CPUS> {
    /// Empty caches in front of `backing`.
    pub const fn new(backing: B) -> Self {
        Heap {
            cpus: [const {
                CpuSlot(IrqLock::new(CpuCache {
                    lists: Recycler::new(),
                    allocations: 0,
                    refills: 0,
                    flushes: 0,
                }))
            }; CPUS],
            global: IrqLock::new(Global {
                backing,
                depot: Recycler::new(),
                direct_allocations: 0,
                drains: 0,
            }),
        }
    }

    /// The address of a block for `layout` (of non-zero size), allocated on CPU `cpu`;
    /// `None` when the heap has no room for it even with every cache drained.
    // Inlined into the caller (the global allocator), the slow paths not: under TCG every
    // call and return is a lookup of translated code, and this made an allocation and
    // its free ~20% cheaper (the heap self-test's timing).
    #[inline(always)]
    pub fn alloc(&self, cpu: usize, layout: Layout) -> Option<usize> {
        let Some(class) = Class::of(layout) else {
            return self.alloc_large(layout);
        };
        let cached = self.cpus[cpu].0.lock(|c| {
            let addr = match c.lists.take(class) {
                Some(addr) => addr,
                None => self.refill(c, class)?,
            };
            c.allocations += 1;
            Some(addr)
        });
        cached.or_else(|| self.alloc_after_drain(layout))
    }

    /// A block of `class` for a caller whose CPU's cache `c` has none, and a batch for
    /// the cache, under one take of the global lock; `None` when the allocator has no
    /// room.
    #[inline(never)]
    fn refill(&self, c: &mut CpuCache, class: Class) -> Option<usize> {
        c.refills += 1;
        self.global.lock(|g| g.refill(&mut c.lists, class))
    }

    /// A block for `layout`, which has no class, from the allocator.
    #[inline(never)]
    fn alloc_large(&self, layout: Layout) -> Option<usize> {
        self.global
            .lock(|g| g.alloc_direct(layout))
            .or_else(|| self.alloc_after_drain(layout))
    }

    /// A block for `layout` from the allocator, once every cache has gone back to it.
    #[cold]
    fn alloc_after_drain(&self, layout: Layout) -> Option<usize> {
        self.drain();
        self.global.lock(|g| g.alloc_direct(layout))
    }

    /// Frees the block at `addr`, allocated for `layout` (on any CPU), on CPU `cpu`.
    #[inline(always)] // as `alloc`
    pub fn dealloc(&self, cpu: usize, addr: usize, layout: Layout) {
        let Some(class) = Class::of(layout) else {
            return self.global.lock(|g| g.backing.free(addr, backing(layout)));
        };
        self.cpus[cpu].0.lock(|c| {
            if !c.lists.keep(addr, class, &CPU_CACHE) {
                self.flush(c, addr, class);
            }
        });
    }

    /// Frees the block `addr` of `class` for a caller whose CPU's cache `c` is full: it
    /// and a batch of its class go back under one take of the global lock, or the whole
    /// cache when it is full of other sizes.
    #[inline(never)]
    fn flush(&self, c: &mut CpuCache, addr: usize, class: Class) {
        c.flushes += 1;
        self.global.lock(|g| {
            g.give_back(addr, class);
            if usize::from(c.lists.count(class)) + 1 >= batch(class) {
                // The class's list is full: a batch of it goes back.
                for _ in 1..batch(class) {
                    let addr = c.lists.take(class).expect("counted");
                    g.give_back(addr, class);
                }
            } else {
                // The cache is full of other sizes, which this CPU may not use any
                // more: all of it goes back (what it uses comes back in batches).
                c.lists.drain(|addr, class| g.give_back(addr, class));
            }
        });
    }

    /// Resizes the block at `addr`, allocated for `layout`, to `new_size` bytes (the same
    /// alignment) on CPU `cpu`; `None` (the block unchanged) when there is no room. When
    /// the block moves to a new address `to`, `copy(to)` must first copy its contents
    /// there (the smaller of both sizes).
    pub fn realloc(
        &self,
        cpu: usize,
        addr: usize,
        layout: Layout,
        new_size: usize,
        copy: impl FnOnce(usize),
    ) -> Option<usize> {
        let new_layout = Layout::from_size_align(new_size, layout.align()).ok()?;
        let (old, new) = (backing(layout), backing(new_layout));
        if old == new {
            return Some(addr); // the same class: the block already fits
        }
        if Class::of(layout).is_some() && Class::of(new_layout).is_some() {
            // Both small: through this CPU's cache, without the global lock unless it
            // refills or gives back.
            let to = self.alloc(cpu, new_layout)?;
            copy(to);
            self.dealloc(cpu, addr, layout);
            return Some(to);
        }
        if new.size() < old.size() {
            self.global
                .lock(|g| g.backing.shrink(addr, old, new.size()));
            return Some(addr);
        }
        let grow = |g: &mut Global<B>| g.backing.grow(addr, old, new.size());
        self.global.lock(grow).or_else(|| {
            self.drain();
            self.global.lock(grow)
        })
    }

    /// Gives every block the caches hold, every CPU's and the depot's, back to the
    /// allocator (which can then merge them with their neighbours), because an
    /// allocation would otherwise fail (counted in `drains`).
    fn drain(&self) {
        for cpu in &self.cpus {
            cpu.0.lock(|c| {
                self.global.lock(|g| {
                    c.lists
                        .drain(|addr, class| g.backing.free(addr, class.layout()))
                })
            });
        }
        self.global.lock(|g| {
            g.drains += 1;
            g.depot
                .drain(|addr, class| g.backing.free(addr, class.layout()));
        });
    }

    /// Runs `f` on the allocator, under the global lock (to give it memory).
    pub fn with_backing<R>(&self, f: impl FnOnce(&mut B) -> R) -> R {
        self.global.lock(|g| f(&mut g.backing))
    }

    /// The counters now: every cache and the allocator read at one instant, so a block
    /// moving between them is counted once.
    pub fn stats(&self) -> HeapStats {
        let mut stats = HeapStats::default();
        self.with_caches_locked(0, &mut CacheTotals::default(), &mut |caches| {
            stats = self.global.lock(|g| g.stats(caches));
        });
        stats
    }

    /// Runs `f` with the caches of CPUs `first..` locked, in index order, their counters
    /// added to `totals`.
    fn with_caches_locked(
        &self,
        first: usize,
        totals: &mut CacheTotals,
        f: &mut dyn FnMut(&CacheTotals),
    ) {
        match self.cpus.get(first) {
            None => f(totals),
            Some(cpu) => cpu.0.lock(|c| {
                totals.bytes += c.lists.bytes() as u64;
                totals.blocks += c.lists.blocks() as u64;
                totals.allocations += c.allocations;
                totals.refills += c.refills;
                totals.flushes += c.flushes;
                self.with_caches_locked(first + 1, totals, f);
            }),
        }
    }
}

impl<B: Backing> Global<B> {
    /// A block of `class`: the depot's, or a new one.
    fn take(&mut self, class: Class) -> Option<usize> {
        self.depot
            .take(class)
            .or_else(|| self.backing.malloc(class.layout()))
    }

    /// A block of `class` for a caller, and up to a batch less one more kept in a CPU's
    /// `lists` (as many as it has room for); `None` when the allocator has no room.
    fn refill(&mut self, lists: &mut Recycler<CPU_SLOTS>, class: Class) -> Option<usize> {
        let first = self.take(class)?;
        for _ in 1..batch(class) {
            if !lists.has_room(class, &CPU_CACHE) {
                break;
            }
            let Some(addr) = self.take(class) else {
                break; // no more room: only the caller's block matters
            };
            let kept = lists.keep(addr, class, &CPU_CACHE);
            assert!(kept, "room was checked");
        }
        Some(first)
    }

    /// Takes back a free block of `class` from a CPU's cache: into the depot, or the
    /// allocator when the depot is full.
    fn give_back(&mut self, addr: usize, class: Class) {
        if !self.depot.keep(addr, class, &DEPOT) {
            self.backing.free(addr, class.layout());
        }
    }

    /// A block for `layout` from the allocator itself.
    fn alloc_direct(&mut self, layout: Layout) -> Option<usize> {
        let addr = self.backing.malloc(backing(layout))?;
        self.direct_allocations += 1;
        Some(addr)
    }

    /// The heap's counters, with the CPU caches' `caches`.
    fn stats(&self, caches: &CacheTotals) -> HeapStats {
        let c = self.backing.counters();
        let (depot_bytes, depot_blocks) = (self.depot.bytes() as u64, self.depot.blocks() as u64);
        let cached = depot_bytes + caches.bytes;
        HeapStats {
            claimed: c.claimed,
            allocated: c.allocated - cached,
            available: c.available + cached,
            allocations: c.blocks - depot_blocks - caches.blocks,
            total_allocations: caches.allocations + self.direct_allocations,
            recycled: depot_bytes,
            cpu_cached: caches.bytes,
            cpu_refills: caches.refills,
            cpu_flushes: caches.flushes,
            drains: self.drains,
        }
    }
}

impl<B, const CPUS: usize> core::fmt::Debug for Heap<B, CPUS> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Not the counters: formatting must not take the heap's locks.
        f.debug_struct("Heap")
            .field("cpus", &CPUS)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashSet};
    use std::sync::{Barrier, Mutex};

    /// An allocator that checks every call against what it handed out. Addresses are
    /// never reused, so a block handed out twice can only come from the caches.
    #[derive(Debug)]
    struct Fake {
        capacity: usize,
        used: usize,
        next: usize,
        live: BTreeMap<usize, Layout>,
        mallocs: u64,
    }

    impl Fake {
        fn new(capacity: usize) -> Fake {
            Fake {
                capacity,
                used: 0,
                next: 0x10_0000,
                live: BTreeMap::new(),
                mallocs: 0,
            }
        }
    }

    impl Backing for Fake {
        fn malloc(&mut self, layout: Layout) -> Option<usize> {
            assert!(layout.size() > 0, "zero-sized malloc");
            if self.used + layout.size() > self.capacity {
                return None;
            }
            let addr = self.next.next_multiple_of(layout.align());
            self.next = addr + layout.size();
            self.used += layout.size();
            self.live.insert(addr, layout);
            self.mallocs += 1;
            Some(addr)
        }

        fn free(&mut self, addr: usize, layout: Layout) {
            let had = self.live.remove(&addr);
            assert_eq!(had, Some(layout), "{addr:#x} freed as {layout:?}");
            self.used -= layout.size();
        }

        fn grow(&mut self, addr: usize, layout: Layout, new_size: usize) -> Option<usize> {
            assert!(new_size >= layout.size());
            assert_eq!(self.live.get(&addr), Some(&layout), "{addr:#x} grown");
            if self.used - layout.size() + new_size > self.capacity {
                return None;
            }
            self.free(addr, layout);
            let grown = Layout::from_size_align(new_size, layout.align()).unwrap();
            Some(self.malloc(grown).expect("room was checked"))
        }

        fn shrink(&mut self, addr: usize, layout: Layout, new_size: usize) {
            assert!(new_size > 0 && new_size <= layout.size());
            let block = self.live.get_mut(&addr).expect("shrinking a live block");
            assert_eq!(*block, layout, "{addr:#x} shrunk");
            *block = Layout::from_size_align(new_size, layout.align()).unwrap();
            self.used -= layout.size() - new_size;
        }

        fn counters(&self) -> BackingCounters {
            BackingCounters {
                claimed: self.capacity as u64,
                allocated: self.used as u64,
                available: (self.capacity - self.used) as u64,
                blocks: self.live.len() as u64,
            }
        }
    }

    const CPUS: usize = 4;
    type TestHeap = Heap<Fake, CPUS>;

    fn heap(capacity: usize) -> Box<TestHeap> {
        Box::new(Heap::new(Fake::new(capacity)))
    }

    fn l(size: usize) -> Layout {
        Layout::from_size_align(size, 8).unwrap()
    }

    fn class(size: usize) -> Class {
        Class::of(l(size)).unwrap()
    }

    impl TestHeap {
        fn mallocs(&self) -> u64 {
            self.with_backing(|b| b.mallocs)
        }

        /// (bytes, blocks of `size`'s class) in CPU `cpu`'s cache.
        fn cached(&self, cpu: usize, size: usize) -> (usize, u16) {
            self.cpus[cpu]
                .0
                .lock(|c| (c.lists.bytes(), c.lists.count(class(size))))
        }

        /// Panics unless CPU `cpu`'s cache is within its bounds.
        fn check_bounds(&self, cpu: usize) {
            self.cpus[cpu].0.lock(|c| {
                assert!(c.lists.bytes() <= CPU_CACHE.bytes, "{}", c.lists.bytes());
                for size in (1..=MAX_CLASS_SIZE / 16).map(|n| n * 16) {
                    let class = class(size);
                    assert!(c.lists.count(class) <= CPU_CACHE.blocks_per_class(class));
                }
            });
            self.global
                .lock(|g| assert!(g.depot.bytes() <= DEPOT.bytes));
        }

        /// Panics unless the counters agree with the allocator: every cached block is
        /// free, everything else is in `live`.
        fn check_counters(&self, live: &[(usize, Layout)]) {
            let s = self.stats();
            let (used, blocks) = self.with_backing(|b| (b.used, b.live.len()));
            let live_bytes: usize = live.iter().map(|&(_, l)| backing(l).size()).sum();
            assert_eq!(s.allocated as usize, live_bytes);
            assert_eq!(s.allocations as usize, live.len());
            assert_eq!((s.recycled + s.cpu_cached) as usize, used - live_bytes);
            assert_eq!(s.allocated + s.available, s.claimed);
            assert!(blocks >= live.len());
        }
    }

    use super::super::recycle::MAX_CLASS_SIZE;

    #[test]
    fn a_refill_brings_a_batch_and_frees_stay_with_the_cpu() {
        let h = heap(1 << 20);
        let a = h.alloc(0, l(64)).unwrap();
        assert_eq!(h.mallocs(), batch(class(64)) as u64, "one batch of 16");
        assert_eq!(h.cached(0, 64), (15 * 64, 15));
        h.dealloc(0, a, l(64));
        assert_eq!(
            h.alloc(0, l(50)),
            Some(a),
            "the block freed last, same class"
        );
        let more: Vec<_> = (0..15).map(|_| h.alloc(0, l(64)).unwrap()).collect();
        assert_eq!(h.mallocs(), 16, "served by the cache");
        assert_eq!(h.stats().cpu_refills, 1);
        h.alloc(0, l(64)).unwrap();
        assert_eq!(h.stats().cpu_refills, 2, "empty again: a second batch");
        assert_eq!(h.mallocs(), 32);
        let mut all = more.clone();
        all.push(a);
        assert_eq!(
            all.iter().collect::<HashSet<_>>().len(),
            16,
            "distinct blocks"
        );
    }

    #[test]
    fn blocks_freed_on_another_cpu_join_its_cache() {
        let h = heap(1 << 20);
        let a = h.alloc(0, l(4096)).unwrap();
        h.dealloc(1, a, l(4096));
        assert_eq!(h.cached(1, 4096), (4096, 1));
        let mallocs = h.mallocs();
        assert_eq!(h.alloc(1, l(4096)), Some(a));
        assert_eq!(h.mallocs(), mallocs);
        assert_eq!(h.stats().cpu_refills, 1, "only CPU 0's first allocation");
    }

    #[test]
    fn a_full_class_gives_a_batch_back_that_other_cpus_refill_from() {
        let h = heap(4 << 20);
        let cap = usize::from(CPU_CACHE.blocks_per_class(class(4096)));
        let blocks: Vec<_> = (0..3 * cap).map(|_| h.alloc(0, l(4096)).unwrap()).collect();
        let mallocs = h.mallocs();
        for &a in &blocks {
            h.dealloc(0, a, l(4096));
            h.check_bounds(0);
        }
        let (_, kept) = h.cached(0, 4096);
        assert!(usize::from(kept) <= cap && kept > 0, "{kept}");
        let s = h.stats();
        assert!(s.cpu_flushes > 0 && s.recycled > 0, "{s:?}");
        // CPU 1 refills from the depot, not the allocator.
        for _ in 0..batch(class(4096)) {
            h.alloc(1, l(4096)).unwrap();
        }
        assert_eq!(h.mallocs(), mallocs);
        assert_eq!(h.stats().cpu_refills, s.cpu_refills + 1);
    }

    #[test]
    fn caches_are_bounded_per_class_and_per_cpu() {
        let h = heap(64 << 20);
        // Many blocks of many sizes allocated on CPU 0, freed on CPU 1.
        let sizes: Vec<usize> = (1..=32).map(|n| n * 512).collect();
        let mut blocks = Vec::new();
        for &size in &sizes {
            for _ in 0..40 {
                blocks.push((h.alloc(0, l(size)).unwrap(), l(size)));
            }
        }
        for &(a, layout) in &blocks {
            h.dealloc(1, a, layout);
            h.check_bounds(1);
        }
        h.check_counters(&[]);
        // A cache full of other sizes gives them all back for a size it has none of.
        let h = heap(64 << 20);
        for size in (1..=MAX_CLASS_SIZE / 16).rev().map(|n| n * 16) {
            while h.cached(1, size).1 < CPU_CACHE.blocks_per_class(class(size))
                && h.cached(1, size).0 + size <= CPU_CACHE.bytes
            {
                let a = h.alloc(0, l(size)).unwrap();
                h.dealloc(1, a, l(size));
            }
        }
        assert_eq!(h.cached(1, 16).0, CPU_CACHE.bytes, "full");
        let flushes = h.stats().cpu_flushes;
        let aligned = Layout::from_size_align(16, 16).unwrap();
        let b = h.alloc(0, aligned).unwrap();
        h.dealloc(1, b, aligned);
        assert_eq!(h.cached(1, 16).0, 0, "everything went back");
        assert_eq!(h.stats().cpu_flushes, flushes + 1);
        h.check_counters(&[]);
    }

    #[test]
    fn large_blocks_bypass_the_caches() {
        let h = heap(1 << 20);
        let a = h.alloc(0, l(MAX_CLASS_SIZE + 1)).unwrap();
        assert_eq!(h.mallocs(), 1);
        h.check_counters(&[(a, l(MAX_CLASS_SIZE + 1))]);
        h.dealloc(0, a, l(MAX_CLASS_SIZE + 1));
        assert_eq!(h.with_backing(|b| b.live.len()), 0);
        let s = h.stats();
        assert_eq!((s.cpu_cached, s.total_allocations), (0, 1));
    }

    #[test]
    fn an_allocation_drains_every_cache_before_it_fails() {
        const CAPACITY: usize = 4 << 20;
        let h = heap(CAPACITY);
        // CPUs 1-3 each allocate and free blocks of several sizes: they stay cached.
        for cpu in 1..CPUS {
            let blocks: Vec<_> = (0..64)
                .map(|i| (h.alloc(cpu, l(64 << (i % 8))).unwrap(), l(64 << (i % 8))))
                .collect();
            for (a, layout) in blocks {
                h.dealloc(cpu, a, layout);
            }
        }
        let s = h.stats();
        assert!(s.cpu_cached + s.recycled > 256 << 10, "{s:?}");
        // The whole heap, asked for on CPU 0: it fits once the caches are given back.
        let all = h.alloc(0, l(CAPACITY)).expect("the caches were drained");
        let s = h.stats();
        assert_eq!((s.drains, s.cpu_cached, s.recycled), (1, 0, 0));
        h.check_counters(&[(all, l(CAPACITY))]);
        // A small block now fails cleanly (after another drain), and the caches work on.
        assert_eq!(h.alloc(1, l(64)), None);
        assert_eq!(h.stats().drains, 2);
        h.dealloc(0, all, l(CAPACITY));
        let a = h.alloc(1, l(64)).unwrap();
        h.check_counters(&[(a, l(64))]);
        // A small allocation drains too: the heap full but for blocks cached elsewhere.
        let h = heap(CAPACITY);
        let small = h.alloc(1, l(1024)).unwrap();
        h.dealloc(1, small, l(1024));
        let (cached, _) = h.cached(1, 1024);
        let rest = h.alloc(0, l(CAPACITY - cached)).unwrap();
        assert_eq!(h.stats().drains, 0);
        let b = h.alloc(0, l(2048)).expect("CPU 1's blocks went back");
        assert_eq!(h.stats().drains, 1);
        h.check_counters(&[(rest, l(CAPACITY - cached)), (b, l(2048))]);
    }

    #[test]
    fn other_cpus_caches_are_drained_while_they_wait() {
        const CAPACITY: usize = 2 << 20;
        let h = heap(CAPACITY);
        let filled = Barrier::new(CPUS);
        let drained = Barrier::new(CPUS);
        std::thread::scope(|s| {
            for cpu in 1..CPUS {
                let (h, filled, drained) = (&h, &filled, &drained);
                s.spawn(move || {
                    let blocks: Vec<_> = (0..32).map(|_| h.alloc(cpu, l(4096)).unwrap()).collect();
                    for a in blocks {
                        h.dealloc(cpu, a, l(4096));
                    }
                    filled.wait();
                    drained.wait();
                    assert_eq!(h.cached(cpu, 4096), (0, 0), "drained by CPU 0");
                    let a = h.alloc(cpu, l(4096)).unwrap();
                    h.dealloc(cpu, a, l(4096));
                });
            }
            filled.wait();
            let all = h.alloc(0, l(CAPACITY));
            if let Some(all) = all {
                h.dealloc(0, all, l(CAPACITY));
            }
            drained.wait(); // before asserting: a failure must not leave the others waiting
            assert!(all.is_some(), "every cache drained");
        });
        h.check_counters(&[]);
        assert_eq!(h.stats().drains, 1);
    }

    #[test]
    fn realloc_moves_small_blocks_through_the_caches_and_resizes_large_ones_in_place() {
        let h = heap(1 << 20);
        let a = h.alloc(0, l(100)).unwrap();
        let same = h.realloc(0, a, l(100), 110, |_| panic!("the class fits"));
        assert_eq!(same, Some(a));
        let mut copied = None;
        let b = h
            .realloc(0, a, l(110), 1000, |to| copied = Some(to))
            .unwrap();
        assert_eq!(copied, Some(b));
        assert_eq!(
            h.cached(0, 110).1,
            batch(class(110)) as u16,
            "the old block is cached"
        );
        let mallocs = h.mallocs();
        let large = MAX_CLASS_SIZE * 2;
        let c = h.realloc(0, b, l(1000), large, |_| panic!("talc copies"));
        let c = c.unwrap();
        assert_eq!(h.mallocs(), mallocs + 1, "grown by the allocator");
        h.check_counters(&[(c, l(large))]);
        let d = h.realloc(0, c, l(large), 200, |_| panic!("shrunk in place"));
        assert_eq!(d, Some(c));
        h.check_counters(&[(c, l(200))]);
        h.dealloc(0, c, l(200));
        h.drain();
        assert_eq!(
            h.with_backing(|b| b.used),
            0,
            "everything went back with its layout"
        );
    }

    /// Four threads stand in for CPUs: each allocates blocks of random sizes, frees some
    /// itself and hands others to the other CPUs to free; one drains now and then.
    #[test]
    fn cpus_hammering_with_cross_cpu_frees_never_share_a_block() {
        const CAPACITY: usize = 64 << 20;
        const OPS: usize = 40_000;
        let h = heap(CAPACITY);
        let live = Mutex::new(HashSet::new());
        let handed = Mutex::new(Vec::new());
        let allocations = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for cpu in 0..CPUS {
                let (h, live, handed, allocations) = (&h, &live, &handed, &allocations);
                s.spawn(move || {
                    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ cpu as u64;
                    let mut rand = move || {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        seed as usize
                    };
                    let mut held: Vec<(usize, Layout)> = Vec::new();
                    for op in 0..OPS {
                        if cpu == 0 && op % 5000 == 0 {
                            h.drain();
                        }
                        let r = rand();
                        if r % 2 == 0 || held.is_empty() {
                            let size = match r % 97 {
                                0 => MAX_CLASS_SIZE + 1 + rand() % 60_000,
                                _ => 1 + (rand() >> 3) % (r % 4 + 1).pow(5) * 16,
                            };
                            let layout = Layout::from_size_align(size, 1 << (rand() % 5)).unwrap();
                            let a = h.alloc(cpu, layout).expect("the heap has room");
                            allocations.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            assert!(live.lock().unwrap().insert(a), "{a:#x} handed out twice");
                            if r % 3 == 0 {
                                handed.lock().unwrap().push((a, layout));
                            } else {
                                held.push((a, layout));
                            }
                        } else {
                            let block = if r % 4 == 1 {
                                handed.lock().unwrap().pop()
                            } else {
                                None
                            };
                            let (a, layout) =
                                block.unwrap_or_else(|| held.swap_remove(rand() % held.len()));
                            assert!(live.lock().unwrap().remove(&a));
                            h.dealloc(cpu, a, layout);
                        }
                        if op % 64 == 0 {
                            h.check_bounds(cpu);
                        }
                    }
                    for (a, layout) in held {
                        assert!(live.lock().unwrap().remove(&a));
                        h.dealloc(cpu, a, layout);
                    }
                });
            }
        });
        let left = handed.into_inner().unwrap();
        h.check_counters(&left);
        for (a, layout) in left {
            h.dealloc(1, a, layout);
        }
        let s = h.stats();
        assert_eq!(s.total_allocations, allocations.into_inner());
        assert!(s.cpu_refills > 0 && s.cpu_flushes > 0, "{s:?}");
        h.check_counters(&[]);
        h.drain();
        assert_eq!(h.with_backing(|b| (b.used, b.live.len())), (0, 0));
    }
}
