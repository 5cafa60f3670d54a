//! A set of disjoint half-open `u64` ranges (block numbers), merged on insert.

use alloc::collections::BTreeMap;
use core::ops::Range;

/// Disjoint, non-adjacent ranges, keyed by start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start -> end (exclusive).
    map: BTreeMap<u64, u64>,
    len: u64,
}

impl RangeSet {
    /// An empty set.
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// Number of values (blocks) in the set.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Number of disjoint ranges.
    pub fn range_count(&self) -> usize {
        self.map.len()
    }

    /// Adds `r`; returns false (and changes nothing) if it overlaps the set.
    pub fn insert(&mut self, r: Range<u64>) -> bool {
        if r.is_empty() {
            return true;
        }
        if self.overlaps(r.clone()) {
            return false;
        }
        let (mut start, mut end) = (r.start, r.end);
        if let Some((&s, &e)) = self.map.range(..=start).next_back() {
            if e == start {
                start = s;
                self.map.remove(&s);
            }
        }
        if let Some(&e) = self.map.get(&end) {
            self.map.remove(&end);
            end = e;
        }
        self.map.insert(start, end);
        self.len += r.end - r.start;
        true
    }

    /// Removes every value of `r` that is in the set; returns how many were removed.
    pub fn remove(&mut self, r: Range<u64>) -> u64 {
        if r.is_empty() {
            return 0;
        }
        let mut removed = 0;
        let hits: alloc::vec::Vec<(u64, u64)> = self
            .map
            .range(..r.end)
            .rev()
            .take_while(|(_, &e)| e > r.start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in hits {
            if e <= r.start {
                continue;
            }
            self.map.remove(&s);
            if s < r.start {
                self.map.insert(s, r.start);
            }
            if e > r.end {
                self.map.insert(r.end, e);
            }
            removed += e.min(r.end) - s.max(r.start);
        }
        self.len -= removed;
        removed
    }

    /// Whether any value of `r` is in the set.
    pub fn overlaps(&self, r: Range<u64>) -> bool {
        if r.is_empty() {
            return false;
        }
        self.map
            .range(..r.end)
            .next_back()
            .is_some_and(|(_, &e)| e > r.start)
    }

    /// Whether `v` is in the set.
    pub fn contains(&self, v: u64) -> bool {
        self.overlaps(v..v + 1)
    }

    /// The first value at or after `v` that is *not* in the set.
    pub fn next_gap(&self, v: u64) -> u64 {
        match self.map.range(..=v).next_back() {
            Some((_, &e)) if e > v => e,
            _ => v,
        }
    }

    /// The start of the first range that begins after `v`, if any.
    pub fn next_start_after(&self, v: u64) -> Option<u64> {
        self.map.range(v + 1..).next().map(|(&s, _)| s)
    }

    /// The ranges, in order.
    pub fn iter(&self) -> impl Iterator<Item = Range<u64>> + '_ {
        self.map.iter().map(|(&s, &e)| s..e)
    }

    /// Moves everything out, leaving the set empty.
    pub fn take(&mut self) -> RangeSet {
        core::mem::take(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;
    use proptest::prelude::*;

    #[test]
    fn merge_and_split() {
        let mut s = RangeSet::new();
        assert!(s.insert(10..20));
        assert!(s.insert(20..25));
        assert!(s.insert(5..10));
        assert_eq!(s.iter().collect::<Vec<_>>(), alloc::vec![5u64..25]);
        assert!(!s.insert(24..30));
        assert_eq!(s.remove(8..12), 4);
        assert_eq!(s.iter().collect::<Vec<_>>(), [5..8, 12..25]);
        assert!(s.contains(7) && !s.contains(8) && s.contains(12));
        assert_eq!(s.next_gap(13), 25);
        assert_eq!(s.next_gap(9), 9);
        assert_eq!(s.next_start_after(8), Some(12));
        assert_eq!(s.len(), 16);
    }

    proptest! {
        #[test]
        fn matches_a_bitmap(ops in proptest::collection::vec((any::<bool>(), 0u64..64, 1u64..8), 0..64)) {
            let mut s = RangeSet::new();
            let mut bits = [false; 80];
            for (add, start, len) in ops {
                let r = start..start + len;
                if add {
                    let overlap = r.clone().any(|i| bits[i as usize]);
                    prop_assert_eq!(s.insert(r.clone()), !overlap);
                    if !overlap {
                        r.for_each(|i| bits[i as usize] = true);
                    }
                } else {
                    let n = r.clone().filter(|&i| bits[i as usize]).count() as u64;
                    prop_assert_eq!(s.remove(r.clone()), n);
                    r.for_each(|i| bits[i as usize] = false);
                }
                for i in 0..80u64 {
                    prop_assert_eq!(s.contains(i), bits[i as usize]);
                }
                prop_assert_eq!(s.len(), bits.iter().filter(|&&b| b).count() as u64);
                let v: Vec<_> = s.iter().collect();
                for w in v.windows(2) {
                    prop_assert!(w[0].end < w[1].start);
                }
            }
        }
    }
}
