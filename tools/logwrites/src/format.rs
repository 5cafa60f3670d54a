//! The dm-log-writes layouts (little-endian, packed), as QEMU's `blklogwrites` writes
//! them.
//!
//! ```text
//! log sector 0        super entry, zero-padded to the log sector size
//! log sector 1        entry 0 header, zero-padded
//! log sectors 2..     entry 0 data: nr_sectors log sectors (none for FLUSH, DISCARD)
//! next log sector     entry 1 header ...
//! ```

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `magic` of the super entry ("rhswfsj" in little-endian bytes).
pub const MAGIC: u64 = 0x006a_7366_7773_6872;
/// The only `version` there is.
pub const VERSION: u64 = 1;

/// The entry is a cache FLUSH (no data; `nr_sectors` 0).
pub const FLAG_FLUSH: u64 = 1 << 0;
/// The write had FUA set: durable on completion.
pub const FLAG_FUA: u64 = 1 << 1;
/// A discard of `nr_sectors` sectors (no data in the log).
pub const FLAG_DISCARD: u64 = 1 << 2;
/// A mark (the kernel's `dmsetup message ... mark`): a named point, data is the name.
pub const FLAG_MARK: u64 = 1 << 3;
/// The kernel's REQ_META hint (ignored here).
pub const FLAG_METADATA: u64 = 1 << 4;
/// Every flag this reader knows.
pub const KNOWN_FLAGS: u64 = FLAG_FLUSH | FLAG_FUA | FLAG_DISCARD | FLAG_MARK | FLAG_METADATA;

/// Log sector 0: what the log is. Rewritten (with the entry count) at every FLUSH.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SuperEntry {
    /// [`MAGIC`].
    pub magic: U64,
    /// [`VERSION`].
    pub version: U64,
    /// Entries logged up to the last FLUSH.
    pub nr_entries: U64,
    /// Log sector size in bytes (a power of two).
    pub sectorsize: U32,
}

/// The first bytes of every entry's log sector.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct EntryHeader {
    /// First sector written (QEMU: in log sectors).
    pub sector: U64,
    /// Sectors written or discarded (QEMU: in log sectors).
    pub nr_sectors: U64,
    /// `FLAG_*` bits.
    pub flags: U64,
    /// Bytes of data for marks (the kernel); QEMU always writes 0.
    pub data_len: U64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_the_c_sizes() {
        // QEMU_PACKED structs of 3 x u64 + u32 and 4 x u64.
        assert_eq!(core::mem::size_of::<SuperEntry>(), 28);
        assert_eq!(core::mem::size_of::<EntryHeader>(), 32);
        assert_eq!(&MAGIC.to_le_bytes()[..7], b"rhswfsj");
    }
}
