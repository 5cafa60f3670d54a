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

    /// Block of slot `slot` (0 or 1) of group `group`'s bitmap.
    pub fn bitmap_block(&self, group: u32, slot: usize) -> u64 {
        BITMAP_START + 2 * u64::from(group) + slot as u64
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
        }
    }
}
