//! A small sorted set of disjoint address ranges, usable before the heap exists.

use core::fmt;
use core::ops::Range;

/// Up to `N` disjoint, sorted, non-adjacent half-open ranges. Inserting merges; removing
/// splits. Operations that would need more than `N` ranges drop the smallest-address excess
/// and count it in [`RangeSet::overflowed`] (callers treat that as lost memory, never as
/// memory gained).
#[derive(Clone)]
pub struct RangeSet<const N: usize> {
    ranges: [Range<u64>; N],
    len: usize,
    overflowed: usize,
}

impl<const N: usize> Default for RangeSet<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> RangeSet<N> {
    /// The empty set.
    pub const fn new() -> Self {
        RangeSet {
            ranges: [const { 0..0 }; N],
            len: 0,
            overflowed: 0,
        }
    }

    /// The ranges, sorted.
    pub fn as_slice(&self) -> &[Range<u64>] {
        &self.ranges[..self.len]
    }

    /// Ranges that could not be stored.
    pub fn overflowed(&self) -> usize {
        self.overflowed
    }

    /// Total bytes covered.
    pub fn total(&self) -> u64 {
        self.as_slice().iter().map(|r| r.end - r.start).sum()
    }

    /// Adds `r`, merging with overlapping or adjacent ranges.
    pub fn insert(&mut self, r: Range<u64>) {
        if r.is_empty() {
            return;
        }
        let (mut start, mut end) = (r.start, r.end);
        // Absorb every range that overlaps or touches [start, end).
        let mut i = 0;
        while i < self.len {
            let cur = self.ranges[i].clone();
            if cur.end >= start && cur.start <= end {
                start = start.min(cur.start);
                end = end.max(cur.end);
                self.remove_at(i);
            } else {
                i += 1;
            }
        }
        let pos = self.as_slice().partition_point(|x| x.start < start);
        self.insert_at(pos, start..end);
    }

    /// Removes `r` from the set.
    pub fn remove(&mut self, r: Range<u64>) {
        if r.is_empty() {
            return;
        }
        let mut i = 0;
        while i < self.len {
            let cur = self.ranges[i].clone();
            if cur.end <= r.start || cur.start >= r.end {
                i += 1;
                continue;
            }
            self.remove_at(i);
            if cur.start < r.start {
                self.insert_at(i, cur.start..r.start);
                i += 1;
            }
            if cur.end > r.end {
                self.insert_at(i, r.end..cur.end);
                i += 1;
            }
        }
    }

    /// Shrinks every range inward to multiples of `align`, dropping those that vanish.
    pub fn align_inward(&mut self, align: u64) {
        let mut out = RangeSet::<N>::new();
        for r in self.as_slice() {
            let start = r.start.div_ceil(align).saturating_mul(align);
            let end = r.end / align * align;
            if start < end {
                out.insert(start..end);
            }
        }
        out.overflowed += self.overflowed;
        *self = out;
    }

    fn remove_at(&mut self, i: usize) {
        self.ranges[i..self.len].rotate_left(1);
        self.len -= 1;
    }

    fn insert_at(&mut self, i: usize, r: Range<u64>) {
        if self.len == N {
            self.overflowed += 1;
            return;
        }
        self.ranges[self.len] = r;
        self.ranges[i..=self.len].rotate_right(1);
        self.len += 1;
    }
}

impl<const N: usize> fmt::Debug for RangeSet<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        for r in self.as_slice() {
            list.entry(&format_args!("{:#x}..{:#x}", r.start, r.end));
        }
        list.finish()
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // ranges, not vectors of numbers
mod tests {
    use super::*;

    #[test]
    fn insert_merges_and_remove_splits() {
        let mut s = RangeSet::<8>::new();
        s.insert(10..20);
        s.insert(30..40);
        s.insert(20..25); // adjacent: merges
        assert_eq!(s.as_slice(), [10..25, 30..40]);
        s.insert(5..35);
        assert_eq!(s.as_slice(), [5..40]);
        s.remove(10..12);
        s.remove(38..50);
        s.remove(0..6);
        assert_eq!(s.as_slice(), [6..10, 12..38]);
        assert_eq!(s.total(), 30);
        s.remove(0..100);
        assert!(s.as_slice().is_empty());
    }

    #[test]
    fn align_inward_drops_partial_pages() {
        let mut s = RangeSet::<8>::new();
        s.insert(0x1..0x3000);
        s.insert(0x5010..0x5ff0);
        s.align_inward(0x1000);
        assert_eq!(s.as_slice(), [0x1000..0x3000]);
    }

    #[test]
    fn overflow_is_counted_not_invented() {
        let mut s = RangeSet::<2>::new();
        s.insert(0..10);
        s.insert(20..30);
        s.insert(40..50);
        assert_eq!(s.as_slice().len(), 2);
        assert_eq!(s.overflowed(), 1);
        assert!(s.total() <= 20);
    }
}
