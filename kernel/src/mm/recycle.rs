//! Size-class free lists in front of the heap allocator.
//!
//! `talc` finds a free chunk by walking the list of a size bin, and a bin spans a range
//! of sizes: a request just above the 4 KiB buffers the appliance frees all the time
//! walks past every one of them. Under TCG every step of that walk is a load through
//! the soft TLB, and it was the appliance's largest single cost (profile in
//! docs/benchmarks.md, "The heap's free lists"). The [`Recycler`] keeps recently freed
//! small blocks per exact size class and hands them back in O(1).
//!
//! It only holds addresses: the heap (`hal::heap`) does the allocating, and asks here
//! first. Every small request is backed by a block of its class's size
//! ([`Recycler::backing`]), so any block of a class can serve any request of that class.
//! What it keeps is bounded ([`MAX_CACHED_BYTES`], [`SLOTS`]) and is given back to the
//! allocator when an allocation fails ([`Recycler::drain`]), so it never turns a
//! satisfiable request into an out-of-memory.

use core::alloc::Layout;

/// Class sizes step by this much (and every heap block is at least this aligned).
pub const GRANULE: usize = 16;
/// Blocks larger than this are not kept.
pub const MAX_CLASS_SIZE: usize = 16 << 10;
/// At most this many bytes sit in the free lists.
pub const MAX_CACHED_BYTES: usize = 2 << 20;
/// At most this many blocks sit in the free lists (the table's size).
pub const SLOTS: usize = 4096;
/// At most this many blocks of one class: enough for the churn of requests in flight,
/// and a burst of one size freed at once cannot fill the lists for every other size.
pub const MAX_PER_CLASS: u16 = 32;

/// The heap's natural alignment: every block is at least word-aligned.
const MIN_ALIGN: usize = core::mem::align_of::<usize>();
/// Per alignment (word, 16 bytes), one class per granule up to the largest.
const CLASSES_PER_ALIGN: usize = MAX_CLASS_SIZE / GRANULE;
const CLASSES: usize = 2 * CLASSES_PER_ALIGN;
/// The end of a list.
const NONE: u16 = u16::MAX;

const _: () = assert!(SLOTS < NONE as usize);

/// Recently freed small blocks by size class; see the module documentation.
pub struct Recycler {
    /// First slot of each class's list.
    heads: [u16; CLASSES],
    /// Blocks in each class's list.
    counts: [u16; CLASSES],
    /// The slot after each slot in its list (a class's, or the unused slots').
    next: [u16; SLOTS],
    /// The block address each slot holds.
    addr: [usize; SLOTS],
    /// Slots given back, reused before fresh ones.
    unused: u16,
    /// Slots `fresh..` have never been used.
    fresh: u16,
    bytes: usize,
    blocks: usize,
    hits: u64,
}

/// What the free lists hold and have served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecyclerStats {
    /// Bytes in blocks kept for reuse (counted as allocated by the allocator beneath).
    pub bytes: u64,
    /// Blocks kept for reuse.
    pub blocks: u64,
    /// Allocations served from the lists.
    pub hits: u64,
}

impl Recycler {
    /// Empty lists.
    pub const fn new() -> Self {
        Recycler {
            heads: [NONE; CLASSES],
            counts: [0; CLASSES],
            next: [NONE; SLOTS],
            addr: [0; SLOTS],
            unused: NONE,
            fresh: 0,
            bytes: 0,
            blocks: 0,
            hits: 0,
        }
    }

    /// The layout the allocator beneath backs `layout` with: at least word-aligned, and a
    /// small request rounded up to its class's size. Every allocation, free and resize
    /// must go through this, so a block's backing layout is a function of what the caller
    /// asked for.
    pub fn backing(layout: Layout) -> Layout {
        let align = layout.align().max(MIN_ALIGN);
        let size = match class_of(layout) {
            Some(_) => layout.size().max(1).next_multiple_of(GRANULE),
            None => layout.size(),
        };
        Layout::from_size_align(size, align).expect("a valid layout rounded up stays valid")
    }

    /// A kept block that can back `layout`, if there is one.
    pub fn take(&mut self, layout: Layout) -> Option<usize> {
        let addr = self.pop(class_of(layout)?)?;
        self.hits += 1;
        Some(addr)
    }

    /// The first block of `class`'s list, unlinked.
    fn pop(&mut self, class: usize) -> Option<usize> {
        let slot = self.heads[class];
        if slot == NONE {
            return None;
        }
        self.heads[class] = self.next[slot as usize];
        self.counts[class] -= 1;
        self.next[slot as usize] = self.unused;
        self.unused = slot;
        self.bytes -= class_layout(class).size();
        self.blocks -= 1;
        Some(self.addr[slot as usize])
    }

    /// Keeps the freed block `addr`, allocated for `layout`, for reuse; false when it is
    /// not small or the lists are full (then the caller frees it).
    pub fn keep(&mut self, addr: usize, layout: Layout) -> bool {
        let Some(class) = class_of(layout) else {
            return false;
        };
        let size = class_layout(class).size();
        if self.bytes + size > MAX_CACHED_BYTES || self.counts[class] == MAX_PER_CLASS {
            return false;
        }
        let slot = if self.unused != NONE {
            let s = self.unused;
            self.unused = self.next[s as usize];
            s
        } else if (self.fresh as usize) < SLOTS {
            self.fresh += 1;
            self.fresh - 1
        } else {
            return false;
        };
        self.addr[slot as usize] = addr;
        self.next[slot as usize] = self.heads[class];
        self.heads[class] = slot;
        self.counts[class] += 1;
        self.bytes += size;
        self.blocks += 1;
        true
    }

    /// Empties every list, handing each block to `free` with its backing layout.
    pub fn drain(&mut self, mut free: impl FnMut(usize, Layout)) {
        for class in 0..CLASSES {
            while let Some(addr) = self.pop(class) {
                free(addr, class_layout(class));
            }
        }
        debug_assert!(self.bytes == 0 && self.blocks == 0);
    }

    /// What the lists hold and have served.
    pub fn stats(&self) -> RecyclerStats {
        RecyclerStats {
            bytes: self.bytes as u64,
            blocks: self.blocks as u64,
            hits: self.hits,
        }
    }
}

impl core::fmt::Debug for Recycler {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Recycler")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for Recycler {
    fn default() -> Self {
        Self::new()
    }
}

/// The class of a request that is kept, or `None` for one too large or too aligned.
fn class_of(layout: Layout) -> Option<usize> {
    if layout.size() > MAX_CLASS_SIZE || layout.align() > GRANULE {
        return None;
    }
    let by_size = layout.size().max(1).div_ceil(GRANULE) - 1;
    let aligned = usize::from(layout.align() > MIN_ALIGN);
    Some(aligned * CLASSES_PER_ALIGN + by_size)
}

/// The backing layout of every block of `class`.
fn class_layout(class: usize) -> Layout {
    let align = if class >= CLASSES_PER_ALIGN {
        GRANULE
    } else {
        MIN_ALIGN
    };
    let size = (class % CLASSES_PER_ALIGN + 1) * GRANULE;
    Layout::from_size_align(size, align).expect("class layouts are valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn a_kept_block_serves_its_class_only() {
        let mut r = Recycler::new();
        assert!(r.keep(0x1000, l(4368, 8)));
        assert_eq!(r.take(l(4384, 8)), None, "next class up");
        assert_eq!(r.take(l(4352, 8)), None, "next class down");
        assert_eq!(r.take(l(4368, 16)), None, "more aligned");
        assert_eq!(r.take(l(4353, 1)), Some(0x1000), "same class, less aligned");
        assert_eq!(r.take(l(4368, 8)), None, "taken once");
        assert_eq!(
            r.stats(),
            RecyclerStats {
                bytes: 0,
                blocks: 0,
                hits: 1
            }
        );
    }

    #[test]
    fn lists_are_last_in_first_out() {
        let mut r = Recycler::new();
        for a in [0x10, 0x20, 0x30] {
            assert!(r.keep(a, l(24, 8)));
        }
        let got: Vec<_> = (0..4).map(|_| r.take(l(32, 8))).collect();
        assert_eq!(got, [Some(0x30), Some(0x20), Some(0x10), None]);
    }

    #[test]
    fn large_and_overaligned_blocks_are_not_kept() {
        let mut r = Recycler::new();
        assert!(!r.keep(0x1000, l(MAX_CLASS_SIZE + 1, 8)));
        assert!(!r.keep(0x1000, l(64, 32)));
        assert!(r.keep(0x1000, l(MAX_CLASS_SIZE, 8)));
        assert_eq!(
            Recycler::backing(l(MAX_CLASS_SIZE + 1, 1)),
            l(MAX_CLASS_SIZE + 1, 8)
        );
    }

    #[test]
    fn bytes_and_slots_are_bounded() {
        // Per class.
        let mut r = Recycler::new();
        let mut kept = 0;
        while r.keep(kept * 16, l(16, 8)) {
            kept += 1;
        }
        assert_eq!(kept, MAX_PER_CLASS as usize);
        assert!(r.keep(0, l(32, 8)), "another class has room");
        // A taken slot is reused.
        assert!(r.take(l(16, 8)).is_some());
        assert!(r.keep(1, l(16, 8)));
        assert!(!r.keep(2, l(16, 8)));
        // In bytes, over the largest classes.
        let mut r = Recycler::new();
        let mut bytes = 0;
        'full: for class in (0..CLASSES_PER_ALIGN).rev() {
            let layout = class_layout(class);
            for _ in 0..MAX_PER_CLASS {
                if !r.keep(bytes, layout) {
                    break 'full;
                }
                bytes += layout.size();
            }
        }
        assert!(
            bytes <= MAX_CACHED_BYTES && bytes + MAX_CLASS_SIZE > MAX_CACHED_BYTES,
            "{bytes}"
        );
        assert_eq!(r.stats().bytes, bytes as u64);
        // In slots, over the smallest classes of both alignments: the table never overflows.
        let mut r = Recycler::new();
        let mut kept = 0;
        'slots: for class in 0..CLASSES_PER_ALIGN {
            for layout in [class_layout(class), class_layout(class + CLASSES_PER_ALIGN)] {
                for _ in 0..MAX_PER_CLASS {
                    if !r.keep(kept, layout) {
                        break 'slots;
                    }
                    kept += 1;
                }
            }
        }
        assert!(
            kept <= SLOTS && r.stats().bytes <= MAX_CACHED_BYTES as u64,
            "{kept}"
        );
    }

    #[test]
    fn drain_gives_back_every_block_with_its_backing_layout() {
        let mut r = Recycler::new();
        let asked = [
            l(1, 1),
            l(100, 8),
            l(100, 16),
            l(4368, 8),
            l(MAX_CLASS_SIZE, 16),
        ];
        for (i, &layout) in asked.iter().enumerate() {
            assert!(r.keep(i, layout));
        }
        let mut freed = Vec::new();
        r.drain(|addr, layout| freed.push((addr, layout)));
        freed.sort_by_key(|&(addr, _)| addr);
        let want: Vec<_> = asked
            .iter()
            .enumerate()
            .map(|(i, &layout)| (i, Recycler::backing(layout)))
            .collect();
        assert_eq!(freed, want);
        assert_eq!(r.stats(), RecyclerStats::default());
    }

    #[test]
    fn backing_covers_the_request_and_is_the_same_across_a_class() {
        for align in [1, 2, 4, 8, 16, 32] {
            for size in (1..=MAX_CLASS_SIZE + 64).step_by(7) {
                let asked = l(size, align);
                let b = Recycler::backing(asked);
                assert!(b.size() >= size && b.align() >= align && b.align() >= MIN_ALIGN);
                if let Some(class) = class_of(asked) {
                    assert_eq!(b, class_layout(class), "{asked:?}");
                }
            }
        }
    }
}
