//! Where things are on the device. Fixed regions come first; the rest is allocated
//! through the bitmap:
//!
//! ```text
//! block 0        unused (left for boot loaders and partition tools)
//! block 1, 2     superblock copies A and B (written alternately)
//! 3 ..           allocation bitmap: two slots per group
//! then           log region (reserved for the fsync log)
//! then           data and btree nodes
//! ```
//!
//! A filesystem that grew ([`Layout::grown`]) keeps its fixed regions: the bitmap region
//! holds the groups it was made with, and each group added later keeps its two bitmap
//! slots in its own first two blocks (feature [`super::features::INCOMPAT_GROWN`]).

use super::bitmap::BLOCKS_PER_GROUP;

/// Block numbers of the two superblock copies.
pub const SUPERBLOCK_BLOCKS: [u64; 2] = [1, 2];
/// First block of the bitmap region.
pub const BITMAP_START: u64 = 3;
/// Smallest filesystem, in blocks (4 MiB).
pub const MIN_BLOCKS: u64 = 1024;

/// The fixed layout of a filesystem of a given size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Total size in blocks.
    pub total_blocks: u64,
    /// Number of allocation groups.
    pub groups: u32,
    /// First block of the log region.
    pub log_start: u64,
    /// Length of the log region in blocks.
    pub log_blocks: u64,
}

impl Layout {
    /// The default layout for `total_blocks`.
    pub fn for_size(total_blocks: u64) -> Layout {
        let groups = total_blocks.div_ceil(BLOCKS_PER_GROUP) as u32;
        // 1/64 of the device, between 64 KiB and 64 MiB.
        let log_blocks = (total_blocks / 64).clamp(16, 16 * 1024);
        Layout {
            total_blocks,
            groups,
            log_start: BITMAP_START + 2 * u64::from(groups),
            log_blocks,
        }
    }

    /// Groups whose bitmap slots are in the bitmap region (those the filesystem was
    /// made with); later groups hold theirs in their own first two blocks.
    pub fn fixed_groups(&self) -> u32 {
        ((self.log_start - BITMAP_START) / 2) as u32
    }

    /// Block of slot `slot` (0 or 1) of group `group`'s bitmap.
    pub fn bitmap_block(&self, group: u32, slot: usize) -> u64 {
        if group < self.fixed_groups() {
            BITMAP_START + 2 * u64::from(group) + slot as u64
        } else {
            u64::from(group) * BLOCKS_PER_GROUP + slot as u64
        }
    }

    /// The blocks holding bitmap slots: `(first block, count)`, the bitmap region first.
    pub fn bitmap_extents(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let fixed = self.fixed_groups();
        core::iter::once((BITMAP_START, 2 * u64::from(fixed)))
            .chain((fixed..self.groups).map(|g| (self.bitmap_block(g, 0), 2)))
    }

    /// Whether `block` holds a bitmap slot of a group added by growth.
    pub fn is_grown_bitmap_block(&self, block: u64) -> bool {
        let (g, bit) = Self::group_of(block);
        g >= self.fixed_groups() && g < self.groups && bit < 2
    }

    /// This layout grown to (at most) `total_blocks`: same fixed regions, groups added
    /// as needed. A last group too short to hold its own bitmap and a block of data is
    /// left out. `None` when that is not larger than now.
    pub fn grown(&self, total_blocks: u64) -> Option<Layout> {
        let mut total = total_blocks;
        let groups = total.div_ceil(BLOCKS_PER_GROUP) as u32;
        if groups > self.groups.max(self.fixed_groups()) && !total.is_multiple_of(BLOCKS_PER_GROUP)
        {
            let tail = total % BLOCKS_PER_GROUP;
            if tail < 3 {
                total -= tail;
            }
        }
        (total > self.total_blocks).then(|| Layout {
            total_blocks: total,
            groups: total.div_ceil(BLOCKS_PER_GROUP) as u32,
            ..*self
        })
    }

    /// Whether the fields are consistent: the groups cover the size, the bitmap region
    /// holds at most that many groups, and data fits after the fixed regions.
    pub fn is_consistent(&self) -> bool {
        // In this order: each test keeps the arithmetic of the next from overflowing
        // on a forged superblock.
        self.log_start >= BITMAP_START
            && (self.log_start - BITMAP_START).is_multiple_of(2)
            && self.groups == self.total_blocks.div_ceil(BLOCKS_PER_GROUP) as u32
            && (self.log_start - BITMAP_START) / 2 <= u64::from(self.groups)
            && self
                .log_start
                .checked_add(self.log_blocks)
                .is_some_and(|data_start| data_start < self.total_blocks)
    }

    /// Whether `start..end` lies where nodes and data extents may: after the fixed
    /// regions (superblocks, bitmap region, log), inside the filesystem, off the bitmap
    /// slots of groups added by growth (their first two blocks). Empty or reversed
    /// ranges do not.
    pub fn is_data_area(&self, start: u64, end: u64) -> bool {
        if start >= end || start < self.data_start() || end > self.total_blocks {
            return false;
        }
        let (first, _) = Self::group_of(start);
        let (last, _) = Self::group_of(end - 1);
        (first..=last)
            .filter(|&g| g >= self.fixed_groups())
            .all(|g| {
                let slots = u64::from(g) * BLOCKS_PER_GROUP;
                end <= slots || start >= slots + 2
            })
    }

    /// First block after the fixed regions.
    pub fn data_start(&self) -> u64 {
        self.log_start + self.log_blocks
    }

    /// Blocks available for data and nodes.
    pub fn data_blocks(&self) -> u64 {
        self.total_blocks.saturating_sub(self.data_start())
    }

    /// The group holding `block`, and the bit within it.
    pub fn group_of(block: u64) -> (u32, usize) {
        (
            (block / BLOCKS_PER_GROUP) as u32,
            (block % BLOCKS_PER_GROUP) as usize,
        )
    }

    /// Number of blocks group `group` covers (the last may be short).
    pub fn group_len(&self, group: u32) -> u64 {
        let start = u64::from(group) * BLOCKS_PER_GROUP;
        (self.total_blocks - start).min(BLOCKS_PER_GROUP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap() {
        for total in [MIN_BLOCKS, 262_144, 10_000_000] {
            let l = Layout::for_size(total);
            assert!(l.log_start >= BITMAP_START + 2 * u64::from(l.groups));
            assert!(l.data_start() < total);
            let covered = u64::from(l.groups) * BLOCKS_PER_GROUP;
            assert!(covered >= total && covered - total < BLOCKS_PER_GROUP);
            assert_eq!((0..l.groups).map(|g| l.group_len(g)).sum::<u64>(), total);
            assert!(l.is_consistent());
            assert_eq!(l.bitmap_extents().count(), 1);
        }
    }

    #[test]
    fn growth_keeps_the_fixed_regions_and_puts_new_bitmaps_in_their_groups() {
        let l = Layout::for_size(40_000); // two groups
        assert_eq!(l.grown(40_000), None);
        assert_eq!(l.grown(30_000), None);
        // Filling the last group adds no group.
        let g = l.grown(2 * BLOCKS_PER_GROUP).unwrap();
        assert_eq!((g.groups, g.fixed_groups()), (2, 2));
        // Past it, new groups keep their slots at their start.
        let g = l.grown(5 * BLOCKS_PER_GROUP + 100).unwrap();
        assert!(g.is_consistent());
        assert_eq!((g.groups, g.fixed_groups()), (6, 2));
        assert_eq!((g.log_start, g.log_blocks), (l.log_start, l.log_blocks));
        assert_eq!(g.bitmap_block(1, 1), l.bitmap_block(1, 1));
        assert_eq!(g.bitmap_block(4, 1), 4 * BLOCKS_PER_GROUP + 1);
        assert!(g.is_grown_bitmap_block(4 * BLOCKS_PER_GROUP));
        assert!(!g.is_grown_bitmap_block(BLOCKS_PER_GROUP));
        let blocks: u64 = g.bitmap_extents().map(|(_, n)| n).sum();
        assert_eq!(blocks, 2 * 6);
        // A tail too short for its own bitmap is left out.
        let g = l.grown(5 * BLOCKS_PER_GROUP + 2).unwrap();
        assert_eq!((g.total_blocks, g.groups), (5 * BLOCKS_PER_GROUP, 5));
    }
}
