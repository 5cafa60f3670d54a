//! The on-disk format: layout, superblock, keys and items, bsets, allocation bitmaps and
//! the fsync log.
//!
//! Everything here is pure encoding and decoding (no I/O, no state), so that the
//! filesystem, `fsck`, `dump` and tests share one definition. `docs/format.md` is the
//! prose description; keep the two in step.
//!
//! All integers are little-endian. Disk addresses are in 4 KiB filesystem blocks
//! ([`BLOCK_SIZE`]), whatever the device's logical block size.

pub mod bitmap;
pub mod bset;
pub mod items;
pub mod key;
pub mod label;
pub mod layout;
pub mod log;
pub mod stream;
pub mod superblock;

pub use key::{Key, TreeId};
pub use layout::Layout;
pub use superblock::Superblock;

/// Filesystem block size: the unit of data, allocation and metadata I/O.
pub const BLOCK_SIZE: usize = 4096;
/// `log2(BLOCK_SIZE)`.
pub const BLOCK_SHIFT: u32 = 12;

/// On-disk format version this code reads and writes (2: one back-reference item per
/// name hash, `docs/format.md`; version 1 images are refused).
pub const FORMAT_VERSION: u32 = 2;

/// Smallest btree node size.
pub const MIN_NODE_SIZE: u32 = 16 * 1024;
/// Largest btree node size.
pub const MAX_NODE_SIZE: u32 = 256 * 1024;
/// Default btree node size.
pub const DEFAULT_NODE_SIZE: u32 = 64 * 1024;

/// Largest item value. Every node size can hold several of the largest items, so a
/// two-way split always makes room.
pub const MAX_VALUE_LEN: usize = 3 * 1024;

/// Largest data extent, in blocks (1 MiB): bounds checksum items to 1 KiB.
pub const MAX_EXTENT_BLOCKS: u32 = 256;

/// Feature flags. A filesystem with an unknown `incompat` bit is not mounted; with an
/// unknown `ro_compat` bit it is mounted read-only; unknown `compat` bits are ignored.
pub mod features {
    /// Compatible features this code knows (none yet).
    pub const COMPAT_SUPPORTED: u64 = 0;
    /// Quotas exist: inodes carry a project and `QUOTA` items keep each project's usage
    /// in step with them. Code that does not know quotas can read the image but would
    /// let the usage drift if it wrote (set once the first quota root is made).
    pub const RO_COMPAT_QUOTA: u64 = 1;
    /// Read-only-compatible features this code knows.
    pub const RO_COMPAT_SUPPORTED: u64 = RO_COMPAT_QUOTA;
    /// The log region holds an fsync log that must be replayed at mount (set by mkfs
    /// and by every mount; code that does not know the log must not mount the image).
    pub const INCOMPAT_LOG: u64 = 1;
    /// The filesystem grew past the groups its bitmap region holds: later groups keep
    /// their bitmap slots in their own first two blocks (`Layout::bitmap_block`).
    pub const INCOMPAT_GROWN: u64 = 2;
    /// Snapshots exist: blocks they hold must not be freed by the live filesystem, which
    /// code that does not know snapshots would do (set while any snapshot exists).
    pub const INCOMPAT_SNAPSHOTS: u64 = 4;
    /// The volume is mirrored over several devices (legs): the superblock's leg table
    /// says which are in service and each device's block 0 holds its label (code that
    /// does not know mirrors would write one leg alone and let it pass for current).
    pub const INCOMPAT_MIRROR: u64 = 8;
    /// Incompatible features this code knows.
    pub const INCOMPAT_SUPPORTED: u64 =
        INCOMPAT_LOG | INCOMPAT_GROWN | INCOMPAT_SNAPSHOTS | INCOMPAT_MIRROR;
}

/// Why an on-disk structure failed to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corrupt {
    /// Wrong magic number.
    Magic,
    /// Checksum mismatch.
    Checksum,
    /// A field is out of range or inconsistent.
    Field(&'static str),
    /// The structure is truncated.
    Truncated,
}

impl core::fmt::Display for Corrupt {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Corrupt::Magic => f.write_str("bad magic"),
            Corrupt::Checksum => f.write_str("checksum mismatch"),
            Corrupt::Field(name) => write!(f, "bad field {name}"),
            Corrupt::Truncated => f.write_str("truncated"),
        }
    }
}
