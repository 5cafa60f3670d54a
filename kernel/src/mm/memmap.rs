//! From the loader's memory map to the memory the kernel may allocate.

use core::ops::Range;

use boot::{MemoryKind, MemoryRegion};

use super::ranges::RangeSet;
use super::PAGE_SIZE;

/// Below this address, memory is left alone: real-mode leftovers, the loader's data and
/// BIOS areas live there, and it is too little to matter.
pub const LOW_MEMORY_END: u64 = 0x10_0000;

/// Enough ranges for any memory map we accept (boot keeps at most 128 entries).
pub type PhysRanges = RangeSet<160>;

/// The RAM the kernel may allocate: every `Ram` region, minus anything that any other
/// entry also claims (overlapping entries are resolved against RAM), minus `reserved`
/// (the kernel image) and low memory, shrunk to whole pages.
pub fn usable_ram(map: &[MemoryRegion], reserved: &[Range<u64>]) -> PhysRanges {
    let mut usable = PhysRanges::new();
    for r in map.iter().filter(|r| r.kind == MemoryKind::Ram) {
        usable.insert(r.start..r.end());
    }
    for r in map.iter().filter(|r| r.kind != MemoryKind::Ram) {
        usable.remove(r.start..r.end());
    }
    usable.remove(0..LOW_MEMORY_END);
    for r in reserved {
        usable.remove(r.clone());
    }
    usable.align_inward(PAGE_SIZE);
    usable
}

/// Every range the loader calls RAM (ACPI-reclaimable and NVS included), page-aligned
/// outward: what the kernel identity-maps as cached, read-write memory, and what device
/// MMIO must never overlap.
pub fn all_ram(map: &[MemoryRegion]) -> PhysRanges {
    let mut ram = PhysRanges::new();
    for r in map.iter().filter(|r| {
        matches!(
            r.kind,
            MemoryKind::Ram | MemoryKind::AcpiReclaimable | MemoryKind::AcpiNvs
        )
    }) {
        let start = r.start / PAGE_SIZE * PAGE_SIZE;
        let end = r.end().div_ceil(PAGE_SIZE) * PAGE_SIZE;
        ram.insert(start..end);
    }
    ram
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // ranges, not vectors of numbers
mod tests {
    use super::*;

    fn region(start: u64, len: u64, kind: MemoryKind) -> MemoryRegion {
        MemoryRegion { start, len, kind }
    }

    /// What QEMU's PVH boot passes for `-m 128M`.
    fn qemu_128m() -> [MemoryRegion; 5] {
        [
            region(0, 0x9fc00, MemoryKind::Ram),
            region(0x9fc00, 0x400, MemoryKind::Reserved),
            region(0xf0000, 0x10000, MemoryKind::Reserved),
            region(0x100000, 0x7ee0000, MemoryKind::Ram),
            region(0x7fe0000, 0x20000, MemoryKind::Reserved),
        ]
    }

    #[test]
    fn qemu_map_minus_kernel() {
        let usable = usable_ram(&qemu_128m(), &[0x100000..0x14d000]);
        assert_eq!(usable.as_slice(), [0x14d000..0x7fe0000]);
        let ram = all_ram(&qemu_128m());
        assert_eq!(ram.as_slice(), [0..0xa0000, 0x100000..0x7fe0000]);
    }

    #[test]
    fn overlapping_reserved_entry_wins_and_edges_are_page_aligned() {
        let map = [
            region(0x100000, 0x1000_0000, MemoryKind::Ram),
            region(0x200800, 0x1000, MemoryKind::Reserved),
            region(0x1_0000_0000, 0x1000_0123, MemoryKind::Ram),
        ];
        let usable = usable_ram(&map, &[]);
        assert_eq!(
            usable.as_slice(),
            [
                0x100000..0x200000,
                0x202000..0x10100000,
                0x1_0000_0000..0x1_1000_0000
            ]
        );
    }
}
