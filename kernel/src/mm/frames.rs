//! The physical frame allocator: one bit per 4 KiB frame.
//!
//! Single frames and physically contiguous runs (for DMA rings, the heap, page tables) come
//! from the same bitmap. Searching is next-fit from where the last allocation ended, which
//! keeps allocation cheap and frees old neighbourhoods time to coalesce.

use core::ops::Range;

use super::PAGE_SIZE;

/// Allocation failed: no run of free frames large (and aligned) enough.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfFrames;

/// Counters of a [`FrameAllocator`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameStats {
    /// Frames ever made available (the managed total).
    pub managed: u64,
    /// Frames free now.
    pub free: u64,
    /// Successful allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// Allocations that failed.
    pub failures: u64,
}

/// A bitmap frame allocator over physical addresses `0..bits.len() * 64 * 4096`. Bit set
/// means free. The bitmap memory is borrowed (at boot it is carved from RAM itself).
#[derive(Debug)]
pub struct FrameAllocator<'a> {
    bits: &'a mut [u64],
    next: usize,
    stats: FrameStats,
}

impl<'a> FrameAllocator<'a> {
    /// Words of bitmap needed to cover physical addresses below `end`.
    pub fn words_for(end: u64) -> usize {
        end.div_ceil(PAGE_SIZE).div_ceil(64) as usize
    }

    /// An allocator with every frame in use; add memory with [`FrameAllocator::add_free`].
    pub fn new(bits: &'a mut [u64]) -> Self {
        bits.fill(0);
        FrameAllocator {
            bits,
            next: 0,
            stats: FrameStats::default(),
        }
    }

    fn frames(&self) -> usize {
        self.bits.len() * 64
    }

    fn is_free(&self, frame: usize) -> bool {
        self.bits[frame / 64] & (1 << (frame % 64)) != 0
    }

    fn set(&mut self, frame: usize, free: bool) {
        let (w, b) = (frame / 64, frame % 64);
        if free {
            self.bits[w] |= 1 << b;
        } else {
            self.bits[w] &= !(1 << b);
        }
    }

    /// Makes the whole pages inside `range` available. Ranges beyond the bitmap are cut.
    pub fn add_free(&mut self, range: Range<u64>) {
        let first = range.start.div_ceil(PAGE_SIZE) as usize;
        let end = ((range.end / PAGE_SIZE) as usize).min(self.frames());
        for frame in first..end {
            if !self.is_free(frame) {
                self.set(frame, true);
                self.stats.managed += 1;
                self.stats.free += 1;
            }
        }
    }

    /// Allocates `count` contiguous frames whose first frame is a multiple of
    /// `align_frames` (a power of two); returns the physical address.
    pub fn alloc(&mut self, count: usize, align_frames: usize) -> Result<u64, OutOfFrames> {
        assert!(count > 0 && align_frames.is_power_of_two());
        let total = self.frames();
        let found = self
            .search(self.next, total, count, align_frames)
            .or_else(|| self.search(0, self.next.min(total), count, align_frames));
        let Some(start) = found else {
            self.stats.failures += 1;
            return Err(OutOfFrames);
        };
        for f in start..start + count {
            self.set(f, false);
        }
        self.next = start + count;
        self.stats.free -= count as u64;
        self.stats.allocs += 1;
        Ok(start as u64 * PAGE_SIZE)
    }

    /// First fit for a run starting in `from..to`.
    fn search(&self, from: usize, to: usize, count: usize, align: usize) -> Option<usize> {
        let total = self.frames();
        let mut start = from.next_multiple_of(align);
        while start < to && start + count <= total {
            // Skip whole words without a free frame.
            if start.is_multiple_of(64) && self.bits[start / 64] == 0 {
                start = (start + 64).next_multiple_of(align);
                continue;
            }
            match (start..start + count).find(|&f| !self.is_free(f)) {
                None => return Some(start),
                Some(used) => start = (used + 1).next_multiple_of(align),
            }
        }
        None
    }

    /// Returns `count` frames starting at `addr` (as returned by [`FrameAllocator::alloc`]).
    ///
    /// # Panics
    /// If a frame is already free (a double free), or `addr` is not page-aligned.
    pub fn free(&mut self, addr: u64, count: usize) {
        assert_eq!(addr % PAGE_SIZE, 0, "freeing an unaligned frame address");
        let first = (addr / PAGE_SIZE) as usize;
        for f in first..first + count {
            assert!(
                !self.is_free(f),
                "double free of frame {:#x}",
                f as u64 * PAGE_SIZE
            );
            self.set(f, true);
        }
        self.stats.free += count as u64;
        self.stats.frees += 1;
    }

    /// The counters.
    pub fn stats(&self) -> FrameStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;

    const MIB: u64 = 1 << 20;

    #[test]
    fn allocates_contiguous_aligned_runs_and_frees() {
        let mut bits = vec![0u64; FrameAllocator::words_for(64 * MIB)];
        let mut fa = FrameAllocator::new(&mut bits);
        fa.add_free(MIB + 100..8 * MIB); // the partial first page is not usable
        fa.add_free(16 * MIB..64 * MIB);
        let managed = fa.stats().managed;
        assert_eq!(managed, (7 * MIB - 4096) / 4096 + 48 * MIB / 4096);
        let a = fa.alloc(1, 1).unwrap();
        assert_eq!(a, MIB + 4096);
        // 2 MiB-aligned run of 2 MiB.
        let b = fa.alloc(512, 512).unwrap();
        assert_eq!(b % (2 * MIB), 0);
        // A run bigger than the low range must come from the high one.
        let c = fa.alloc(8 * MIB as usize / 4096, 1).unwrap();
        assert!(c >= 16 * MIB);
        fa.free(b, 512);
        fa.free(a, 1);
        fa.free(c, 2048);
        assert_eq!(fa.stats().free, managed);
        // Everything can be handed out again, frame by frame, then it runs dry.
        for _ in 0..managed {
            fa.alloc(1, 1).unwrap();
        }
        assert_eq!(fa.alloc(1, 1), Err(OutOfFrames));
        assert_eq!(fa.stats().failures, 1);
    }

    #[test]
    fn never_hands_out_a_frame_twice() {
        let mut bits = vec![0u64; FrameAllocator::words_for(4 * MIB)];
        let mut fa = FrameAllocator::new(&mut bits);
        fa.add_free(0..4 * MIB);
        let mut seen = std::collections::BTreeSet::new();
        let mut held = std::vec::Vec::new();
        for i in 0..400usize {
            let n = 1 + i % 5;
            let a = fa.alloc(n, 1).unwrap();
            for k in 0..n as u64 {
                assert!(seen.insert(a + k * 4096), "frame handed out twice");
            }
            held.push((a, n));
            if i % 3 == 0 {
                let (a, n) = held.remove(held.len() / 2);
                fa.free(a, n);
                for k in 0..n as u64 {
                    seen.remove(&(a + k * 4096));
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_panics() {
        let mut bits = vec![0u64; 1];
        let mut fa = FrameAllocator::new(&mut bits);
        fa.add_free(0..64 * 4096);
        let a = fa.alloc(2, 1).unwrap();
        fa.free(a, 2);
        fa.free(a, 1);
    }
}
