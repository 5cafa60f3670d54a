//! Size-class free lists: freed small heap blocks kept by exact size class.
//!
//! `talc` finds a free chunk by walking the list of a size bin, and a bin spans a range
//! of sizes: a request just above the 4 KiB buffers the appliance frees all the time
//! walks past every one of them. Under TCG every step of that walk is a load through
//! the soft TLB, and it was the appliance's largest single cost (profile in
//! docs/benchmarks.md, "The heap's free lists"). A [`Recycler`] keeps freed small blocks
//! per exact size [`Class`] and hands them back in O(1). The heap (`mm::heap`) keeps one
//! per CPU and one shared by all CPUs (its depot).
//!
//! It only holds addresses: the heap does the allocating. Every small request is backed
//! by a block of its class's size ([`backing`]), so any block of a class can serve any
//! request of that class. What a recycler keeps is bounded by the [`Limits`] its owner
//! passes, and by its number of slots.

use core::alloc::Layout;
use core::num::NonZeroU16;

/// Class sizes step by this much (and every heap block is at least this aligned).
pub const GRANULE: usize = 16;
/// Blocks larger than this have no class: they are not kept.
pub const MAX_CLASS_SIZE: usize = 16 << 10;

/// The heap's natural alignment: every block is at least word-aligned.
const MIN_ALIGN: usize = core::mem::align_of::<usize>();
/// Per alignment (word, 16 bytes), one class per granule up to the largest.
const CLASSES_PER_ALIGN: usize = MAX_CLASS_SIZE / GRANULE;
const CLASSES: usize = 2 * CLASSES_PER_ALIGN;

/// The size class of a small block: its size rounded up to a [`GRANULE`], and whether it
/// must be 16-byte aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Class(u16);

impl Class {
    /// The class of a request, or `None` for one too large or too aligned to be kept.
    pub fn of(layout: Layout) -> Option<Class> {
        if layout.size() > MAX_CLASS_SIZE || layout.align() > GRANULE {
            return None;
        }
        let by_size = layout.size().max(1).div_ceil(GRANULE) - 1;
        let aligned = usize::from(layout.align() > MIN_ALIGN);
        Some(Class((aligned * CLASSES_PER_ALIGN + by_size) as u16))
    }

    /// The backing layout of every block of the class.
    pub fn layout(self) -> Layout {
        let align = if self.index() >= CLASSES_PER_ALIGN {
            GRANULE
        } else {
            MIN_ALIGN
        };
        Layout::from_size_align(self.size(), align).expect("class layouts are valid")
    }

    /// The size of every block of the class.
    pub const fn size(self) -> usize {
        (self.index() % CLASSES_PER_ALIGN + 1) * GRANULE
    }

    const fn index(self) -> usize {
        self.0 as usize
    }
}

/// The layout the allocator beneath backs `layout` with: at least word-aligned, and a
/// small request rounded up to its class's size. Every allocation, free and resize must
/// go through this, so a block's backing layout is a function of what the caller asked
/// for.
pub fn backing(layout: Layout) -> Layout {
    match Class::of(layout) {
        Some(class) => class.layout(),
        None => Layout::from_size_align(layout.size(), layout.align().max(MIN_ALIGN))
            .expect("a valid layout stays valid at a larger power-of-two alignment"),
    }
}

/// What a [`Recycler`] may hold, besides its slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes in all.
    pub bytes: usize,
    /// Blocks of one class: as many as fit in this many bytes...
    pub class_bytes: usize,
    /// ... but at least this many ...
    pub class_min: u16,
    /// ... and at most this many.
    pub class_max: u16,
}

impl Limits {
    /// The most blocks of `class` the lists may hold.
    pub fn blocks_per_class(&self, class: Class) -> u16 {
        let fit = (self.class_bytes / class.size()).min(usize::from(u16::MAX)) as u16;
        fit.clamp(self.class_min, self.class_max)
    }

    /// Whether `count` blocks of `class` are fewer than [`Limits::blocks_per_class`]:
    /// the same answer without its division, for every free.
    fn below_class_limit(&self, class: Class, count: u16) -> bool {
        count < self.class_max
            && (count < self.class_min
                || (usize::from(count) + 1) * class.size() <= self.class_bytes)
    }
}

/// A slot's number plus one; `None` ends a list. Empty lists are all zeroes, so a static
/// recycler lives in `.bss`, not in the image.
type Link = Option<NonZeroU16>;

fn link(slot: usize) -> Link {
    NonZeroU16::new(slot as u16 + 1)
}

fn slot(link: NonZeroU16) -> usize {
    usize::from(link.get()) - 1
}

/// Freed small blocks by size class, in at most `SLOTS` slots; see the module
/// documentation. Each class's list is last in, first out (the block freed last is the
/// one most likely still in the CPU's cache).
pub struct Recycler<const SLOTS: usize> {
    /// First slot of each class's list.
    heads: [Link; CLASSES],
    /// Blocks in each class's list.
    counts: [u16; CLASSES],
    /// The slot after each slot in its list (a class's, or the unused slots').
    next: [Link; SLOTS],
    /// The block address each slot holds.
    addr: [usize; SLOTS],
    /// Slots given back, reused before fresh ones.
    unused: Link,
    /// Slots `fresh..` have never been used.
    fresh: u16,
    bytes: usize,
    blocks: usize,
}

impl<const SLOTS: usize> Recycler<SLOTS> {
    /// Empty lists.
    pub const fn new() -> Self {
        const { assert!(SLOTS < u16::MAX as usize, "slot numbers plus one fit a u16") };
        Recycler {
            heads: [None; CLASSES],
            counts: [0; CLASSES],
            next: [None; SLOTS],
            addr: [0; SLOTS],
            unused: None,
            fresh: 0,
            bytes: 0,
            blocks: 0,
        }
    }

    /// The block of `class` kept last, unlinked, if there is one.
    #[inline]
    pub fn take(&mut self, class: Class) -> Option<usize> {
        let head = self.heads[class.index()]?;
        let s = slot(head);
        self.heads[class.index()] = self.next[s];
        self.counts[class.index()] -= 1;
        self.next[s] = self.unused;
        self.unused = Some(head);
        self.bytes -= class.size();
        self.blocks -= 1;
        Some(self.addr[s])
    }

    /// Whether one more block of `class` may be kept within `limits` (and a slot).
    pub fn has_room(&self, class: Class, limits: &Limits) -> bool {
        self.bytes + class.size() <= limits.bytes
            && limits.below_class_limit(class, self.counts[class.index()])
            && (self.unused.is_some() || usize::from(self.fresh) < SLOTS)
    }

    /// Keeps the free block `addr` of `class`; false when that would break `limits` or
    /// no slot is left (then the caller keeps the block).
    #[inline]
    pub fn keep(&mut self, addr: usize, class: Class, limits: &Limits) -> bool {
        if !self.has_room(class, limits) {
            return false;
        }
        let s = match self.unused {
            Some(unused) => {
                self.unused = self.next[slot(unused)];
                slot(unused)
            }
            None => {
                self.fresh += 1;
                usize::from(self.fresh) - 1
            }
        };
        self.addr[s] = addr;
        self.next[s] = self.heads[class.index()];
        self.heads[class.index()] = link(s);
        self.counts[class.index()] += 1;
        self.bytes += class.size();
        self.blocks += 1;
        true
    }

    /// Blocks of `class` kept.
    pub fn count(&self, class: Class) -> u16 {
        self.counts[class.index()]
    }

    /// Empties every list, handing each block to `free` with its class.
    pub fn drain(&mut self, mut free: impl FnMut(usize, Class)) {
        for class in (0..CLASSES).map(|i| Class(i as u16)) {
            while let Some(addr) = self.take(class) {
                free(addr, class);
            }
        }
        debug_assert!(self.bytes == 0 && self.blocks == 0);
    }

    /// Bytes in blocks kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Blocks kept.
    pub fn blocks(&self) -> usize {
        self.blocks
    }
}

impl<const SLOTS: usize> core::fmt::Debug for Recycler<SLOTS> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Recycler")
            .field("bytes", &self.bytes)
            .field("blocks", &self.blocks)
            .finish()
    }
}

impl<const SLOTS: usize> Default for Recycler<SLOTS> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Like the heap's depot: 32 blocks per class, 2 MiB.
    const LIMITS: Limits = Limits {
        bytes: 2 << 20,
        class_bytes: 0,
        class_min: 32,
        class_max: 32,
    };
    const SLOTS: usize = 4096;

    fn l(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    fn c(size: usize, align: usize) -> Class {
        Class::of(l(size, align)).unwrap()
    }

    fn recycler() -> Box<Recycler<SLOTS>> {
        Box::default()
    }

    #[test]
    fn a_kept_block_serves_its_class_only() {
        let mut r = recycler();
        assert!(r.keep(0x1000, c(4368, 8), &LIMITS));
        assert_eq!(r.take(c(4384, 8)), None, "next class up");
        assert_eq!(r.take(c(4352, 8)), None, "next class down");
        assert_eq!(r.take(c(4368, 16)), None, "more aligned");
        assert_eq!(r.take(c(4353, 1)), Some(0x1000), "same class, less aligned");
        assert_eq!(r.take(c(4368, 8)), None, "taken once");
        assert_eq!((r.bytes(), r.blocks()), (0, 0));
    }

    #[test]
    fn lists_are_last_in_first_out() {
        let mut r = recycler();
        for a in [0x10, 0x20, 0x30] {
            assert!(r.keep(a, c(24, 8), &LIMITS));
        }
        let got: Vec<_> = (0..4).map(|_| r.take(c(32, 8))).collect();
        assert_eq!(got, [Some(0x30), Some(0x20), Some(0x10), None]);
    }

    #[test]
    fn large_and_overaligned_blocks_have_no_class() {
        assert_eq!(Class::of(l(MAX_CLASS_SIZE + 1, 8)), None);
        assert_eq!(Class::of(l(64, 32)), None);
        assert!(Class::of(l(MAX_CLASS_SIZE, 16)).is_some());
        assert_eq!(backing(l(MAX_CLASS_SIZE + 1, 1)), l(MAX_CLASS_SIZE + 1, 8));
        assert_eq!(backing(l(64, 32)), l(64, 32));
    }

    #[test]
    fn limits_scale_blocks_per_class_by_size() {
        let limits = Limits {
            bytes: 1 << 20,
            class_bytes: 64 << 10,
            class_min: 2,
            class_max: 32,
        };
        assert_eq!(limits.blocks_per_class(c(16, 8)), 32, "at most class_max");
        assert_eq!(limits.blocks_per_class(c(4096, 8)), 16, "64 KiB of them");
        assert_eq!(limits.blocks_per_class(c(MAX_CLASS_SIZE, 8)), 4);
        let tiny = Limits {
            class_bytes: 1024,
            ..limits
        };
        assert_eq!(tiny.blocks_per_class(c(4096, 8)), 2, "at least class_min");
        for limits in [limits, tiny, LIMITS] {
            for size in (1..=MAX_CLASS_SIZE / GRANULE).map(|n| n * GRANULE) {
                let class = c(size, 8);
                for count in 0..40 {
                    assert_eq!(
                        limits.below_class_limit(class, count),
                        count < limits.blocks_per_class(class),
                        "{limits:?} {size} {count}"
                    );
                }
            }
        }
    }

    #[test]
    fn bytes_and_slots_are_bounded() {
        // Per class.
        let mut r = recycler();
        let mut kept = 0;
        while r.keep(kept * 16, c(16, 8), &LIMITS) {
            kept += 1;
        }
        assert_eq!(kept, 32);
        assert_eq!(r.count(c(16, 8)), 32);
        assert!(!r.has_room(c(16, 8), &LIMITS));
        assert!(r.keep(0, c(32, 8), &LIMITS), "another class has room");
        // A taken slot is reused.
        assert!(r.take(c(16, 8)).is_some());
        assert!(r.keep(1, c(16, 8), &LIMITS));
        assert!(!r.keep(2, c(16, 8), &LIMITS));
        // In bytes, over the largest classes.
        let mut r = recycler();
        let mut bytes = 0;
        'full: for size in (1..=MAX_CLASS_SIZE / GRANULE).rev().map(|n| n * GRANULE) {
            for _ in 0..32 {
                if !r.keep(bytes, c(size, 8), &LIMITS) {
                    break 'full;
                }
                bytes += size;
            }
        }
        assert!(
            bytes <= LIMITS.bytes && bytes + MAX_CLASS_SIZE > LIMITS.bytes,
            "{bytes}"
        );
        assert_eq!(r.bytes(), bytes);
        // In slots, over the smallest classes of both alignments: the table never overflows.
        let mut r: Box<Recycler<100>> = Box::default();
        let mut kept = 0;
        'slots: for size in (1..=MAX_CLASS_SIZE / GRANULE).map(|n| n * GRANULE) {
            for class in [c(size, 8), c(size, 16)] {
                for _ in 0..32 {
                    if !r.keep(kept, class, &LIMITS) {
                        break 'slots;
                    }
                    kept += 1;
                }
            }
        }
        assert_eq!((kept, r.blocks()), (100, 100));
        assert!(!r.has_room(c(4096, 8), &LIMITS), "no slot left");
    }

    #[test]
    fn drain_gives_back_every_block_with_its_class() {
        let mut r = recycler();
        let asked = [
            l(1, 1),
            l(100, 8),
            l(100, 16),
            l(4368, 8),
            l(MAX_CLASS_SIZE, 16),
        ];
        for (i, &layout) in asked.iter().enumerate() {
            assert!(r.keep(i, Class::of(layout).unwrap(), &LIMITS));
        }
        let mut freed = Vec::new();
        r.drain(|addr, class| freed.push((addr, class.layout())));
        freed.sort_by_key(|&(addr, _)| addr);
        let want: Vec<_> = asked
            .iter()
            .enumerate()
            .map(|(i, &layout)| (i, backing(layout)))
            .collect();
        assert_eq!(freed, want);
        assert_eq!((r.bytes(), r.blocks()), (0, 0));
    }

    #[test]
    fn backing_covers_the_request_and_is_the_same_across_a_class() {
        for align in [1, 2, 4, 8, 16, 32] {
            for size in (1..=MAX_CLASS_SIZE + 64).step_by(7) {
                let asked = l(size, align);
                let b = backing(asked);
                assert!(b.size() >= size && b.align() >= align && b.align() >= MIN_ALIGN);
                if let Some(class) = Class::of(asked) {
                    assert_eq!(b, class.layout(), "{asked:?}");
                    assert_eq!(class.size(), b.size());
                }
            }
        }
    }
}
