//! Keys: every item in every tree is addressed by `(objectid, kind, offset)`, ordered
//! in that order, as in btrfs. In the fs tree `objectid` is the inode number, so all of
//! one inode's items (inode, names, xattrs, extents) are adjacent.

use core::fmt;

/// A btree key.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key {
    /// Inode number (fs tree) or disk block (extent and checksum trees).
    pub objectid: u64,
    /// Item type ([`kind`]).
    pub kind: u8,
    /// Type-specific: name hash, directory index, file offset, ...
    pub offset: u64,
}

impl Key {
    /// Encoded size in bytes.
    pub const ENCODED_LEN: usize = 17;
    /// The smallest key.
    pub const MIN: Key = Key::new(0, 0, 0);
    /// The largest key.
    pub const MAX: Key = Key::new(u64::MAX, u8::MAX, u64::MAX);

    /// A key.
    pub const fn new(objectid: u64, kind: u8, offset: u64) -> Key {
        Key {
            objectid,
            kind,
            offset,
        }
    }

    /// The next key in order, or `None` for [`Key::MAX`].
    pub fn successor(self) -> Option<Key> {
        if let Some(offset) = self.offset.checked_add(1) {
            return Some(Key { offset, ..self });
        }
        if let Some(kind) = self.kind.checked_add(1) {
            return Some(Key::new(self.objectid, kind, 0));
        }
        self.objectid.checked_add(1).map(|o| Key::new(o, 0, 0))
    }

    /// The previous key in order, or `None` for [`Key::MIN`].
    pub fn predecessor(self) -> Option<Key> {
        if let Some(offset) = self.offset.checked_sub(1) {
            return Some(Key { offset, ..self });
        }
        if let Some(kind) = self.kind.checked_sub(1) {
            return Some(Key::new(self.objectid, kind, u64::MAX));
        }
        self.objectid
            .checked_sub(1)
            .map(|o| Key::new(o, u8::MAX, u64::MAX))
    }

    /// Encodes into 17 bytes.
    pub fn encode(&self, out: &mut crate::util::bytes::Writer) {
        out.bytes(&self.to_bytes());
    }

    /// The 17 encoded bytes: objectid, kind, offset, little-endian.
    pub fn to_bytes(&self) -> [u8; Key::ENCODED_LEN] {
        let mut b = [0u8; Key::ENCODED_LEN];
        b[..8].copy_from_slice(&self.objectid.to_le_bytes());
        b[8] = self.kind;
        b[9..].copy_from_slice(&self.offset.to_le_bytes());
        b
    }

    /// Decodes 17 bytes.
    pub fn decode(r: &mut crate::util::bytes::Reader<'_>) -> Option<Key> {
        Some(Key::new(r.u64()?, r.u8()?, r.u64()?))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "({} {} {})",
            self.objectid,
            kind::name(self.kind),
            self.offset
        )
    }
}

/// Item types. The numbers order an inode's items: inode first, then names, xattrs,
/// directory entries, data.
pub mod kind {
    /// Inode item `(ino, INODE, 0)`.
    pub const INODE: u8 = 1;
    /// Back-references `(ino, INODE_REF, hash(parent, name))`: the names of `ino` with
    /// that hash, each with its parent (one item per name, so an inode may have as many
    /// names in one directory as its link limit allows).
    pub const INODE_REF: u8 = 12;
    /// Xattr names `(ino, XATTR, hash(name))`.
    pub const XATTR: u8 = 24;
    /// Xattr value chunk `(ino, XATTR_CHUNK, id << 8 | chunk)` for large values.
    pub const XATTR_CHUNK: u8 = 25;
    /// Orphan `(0, ORPHAN, ino)`: an inode with no links still to be freed.
    pub const ORPHAN: u8 = 48;
    /// Snapshot `(0, SNAPSHOT, id)`: a read-only point-in-time root set
    /// ([`SnapshotItem`](crate::format::items::SnapshotItem)).
    pub const SNAPSHOT: u8 = 56;
    /// Quota root `(0, QUOTA, project)`: limits and usage of a project
    /// ([`QuotaItem`](crate::format::items::QuotaItem)).
    pub const QUOTA: u8 = 64;
    /// Directory entries by name hash `(dir, DIR_ENTRY, hash(name))`.
    pub const DIR_ENTRY: u8 = 84;
    /// Directory entries by index `(dir, DIR_INDEX, index)`: readdir order.
    pub const DIR_INDEX: u8 = 96;
    /// Symlink target `(ino, SYMLINK, 0)`.
    pub const SYMLINK: u8 = 104;
    /// File extent `(ino, EXTENT_DATA, file_offset)`.
    pub const EXTENT_DATA: u8 = 108;
    /// Data checksums `(disk_block, CSUM, 0)` (checksum tree).
    pub const CSUM: u8 = 128;
    /// Data extent and its reference count `(disk_block, EXTENT, blocks)` (extent tree).
    pub const EXTENT: u8 = 168;

    /// A short name for dumps.
    pub fn name(kind: u8) -> &'static str {
        match kind {
            INODE => "INODE",
            INODE_REF => "INODE_REF",
            XATTR => "XATTR",
            XATTR_CHUNK => "XATTR_CHUNK",
            ORPHAN => "ORPHAN",
            SNAPSHOT => "SNAPSHOT",
            QUOTA => "QUOTA",
            DIR_ENTRY => "DIR_ENTRY",
            DIR_INDEX => "DIR_INDEX",
            SYMLINK => "SYMLINK",
            EXTENT_DATA => "EXTENT_DATA",
            CSUM => "CSUM",
            EXTENT => "EXTENT",
            _ => "?",
        }
    }
}

/// The trees. Each has a root in the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum TreeId {
    /// Inodes, names, xattrs, file extents, orphans.
    Fs = 0,
    /// Data extent reference counts.
    Extent = 1,
    /// Data checksums.
    Csum = 2,
    /// The fsync log (reserved; written by the durability layer).
    Log = 3,
}

impl TreeId {
    /// Number of trees (and root slots in the superblock).
    pub const COUNT: usize = 4;
    /// All trees.
    pub const ALL: [TreeId; 4] = [TreeId::Fs, TreeId::Extent, TreeId::Csum, TreeId::Log];

    /// The tree with on-disk id `v`.
    pub fn from_u8(v: u8) -> Option<TreeId> {
        TreeId::ALL.get(v as usize).copied()
    }

    /// A short name for dumps and the command line.
    pub fn name(self) -> &'static str {
        match self {
            TreeId::Fs => "fs",
            TreeId::Extent => "extent",
            TreeId::Csum => "csum",
            TreeId::Log => "log",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_successor() {
        assert!(Key::new(1, 2, 3) < Key::new(1, 3, 0));
        assert!(Key::new(1, 255, u64::MAX) < Key::new(2, 0, 0));
        assert_eq!(Key::new(1, 2, 3).successor(), Some(Key::new(1, 2, 4)));
        assert_eq!(
            Key::new(1, 2, u64::MAX).successor(),
            Some(Key::new(1, 3, 0))
        );
        assert_eq!(Key::MAX.successor(), None);
        for k in [
            Key::new(1, 2, 3),
            Key::new(1, 2, 0),
            Key::new(1, 0, 0),
            Key::MAX,
        ] {
            assert_eq!(k.predecessor().unwrap().successor(), Some(k));
        }
        assert_eq!(Key::MIN.predecessor(), None);
    }
}
