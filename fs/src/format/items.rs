//! Item values. Each item type has a plain struct with `encode` and `decode`; decoding
//! returns `None` on any malformation (the caller reports corruption).

use alloc::vec::Vec;

use crate::format::superblock::{NodePtr, Root};
use crate::format::TreeId;
use crate::util::bytes::{Reader, Writer};
use vfs::{FileType, Timespec};

/// Encoded size of an [`InodeItem`].
pub const INODE_ITEM_LEN: usize = 128;

/// `(ino, INODE, 0)`: an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct InodeItem {
    /// Full mode (type and permission bits).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Link count (directories: 2 + subdirectories).
    pub nlink: u32,
    /// Device number of device nodes.
    pub rdev: u64,
    /// Size in bytes.
    pub size: u64,
    /// Bytes of data extents referenced (for `st_blocks`).
    pub bytes: u64,
    /// Access time.
    pub atime: Timespec,
    /// Modification time.
    pub mtime: Timespec,
    /// Status change time.
    pub ctime: Timespec,
    /// Creation time.
    pub btime: Timespec,
    /// Generation (checkpoint sequence at creation).
    pub generation: u64,
    /// Flags (none defined yet).
    pub flags: u64,
    /// Next per-inode sequence number: directory indexes and xattr ids.
    pub next_seq: u64,
    /// Checkpoint sequence in which the inode last changed.
    pub transid: u64,
    /// The project (quota root directory) the inode is charged to; 0: none. Stored in
    /// the last 8 bytes, zero in images made before quotas.
    pub project: u64,
}

/// Writes a time as seconds (i64) and nanoseconds (u32).
pub(crate) fn put_time(w: &mut Writer, t: Timespec) {
    w.i64(t.sec).u32(t.nsec);
}

/// Reads a time written by [`put_time`] (nanoseconds below one second).
pub(crate) fn get_time(r: &mut Reader<'_>) -> Option<Timespec> {
    let t = Timespec {
        sec: r.i64()?,
        nsec: r.u32()?,
    };
    (t.nsec < 1_000_000_000).then_some(t)
}

impl InodeItem {
    /// The inode's type, if its mode names one.
    pub fn file_type(&self) -> Option<FileType> {
        FileType::from_mode(self.mode)
    }

    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        self.file_type() == Some(FileType::Directory)
    }

    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(INODE_ITEM_LEN);
        w.u32(self.mode).u32(self.uid).u32(self.gid).u32(self.nlink);
        w.u64(self.rdev).u64(self.size).u64(self.bytes);
        for t in [self.atime, self.mtime, self.ctime, self.btime] {
            put_time(&mut w, t);
        }
        w.u64(self.generation)
            .u64(self.flags)
            .u64(self.next_seq)
            .u64(self.transid)
            .u64(self.project);
        w.zeros(INODE_ITEM_LEN - w.buf.len());
        w.finish()
    }

    /// Decodes.
    pub fn decode(b: &[u8]) -> Option<InodeItem> {
        if b.len() != INODE_ITEM_LEN {
            return None;
        }
        let mut r = Reader::new(b);
        let item = InodeItem {
            mode: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            nlink: r.u32()?,
            rdev: r.u64()?,
            size: r.u64()?,
            bytes: r.u64()?,
            atime: get_time(&mut r)?,
            mtime: get_time(&mut r)?,
            ctime: get_time(&mut r)?,
            btime: get_time(&mut r)?,
            generation: r.u64()?,
            flags: r.u64()?,
            next_seq: r.u64()?,
            transid: r.u64()?,
            project: r.u64()?,
        };
        item.file_type()?;
        Some(item)
    }
}

/// The `DT_*` byte stored in directory items, back to a type.
pub fn file_type_from_dt(dt: u8) -> Option<FileType> {
    use FileType::*;
    [
        Fifo,
        CharDevice,
        Directory,
        BlockDevice,
        Regular,
        Symlink,
        Socket,
    ]
    .into_iter()
    .find(|t| t.dirent_type() == dt)
}

fn put_name(w: &mut Writer, name: &[u8]) {
    w.u8(name.len() as u8).bytes(name);
}

fn get_name(r: &mut Reader<'_>) -> Option<Vec<u8>> {
    let n = r.u8()? as usize;
    if n == 0 {
        return None;
    }
    Some(r.bytes(n)?.to_vec())
}

/// One name in a `(dir, DIR_ENTRY, hash)` item. The item holds every name of the
/// directory with that hash (normally one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntryRec {
    /// The child.
    pub ino: u64,
    /// The child's type.
    pub file_type: FileType,
    /// The entry's `DIR_INDEX` (readdir position).
    pub index: u64,
    /// The name.
    pub name: Vec<u8>,
}

/// Encodes a list of directory entries (one `DIR_ENTRY` item).
pub fn encode_dir_entries(list: &[DirEntryRec]) -> Vec<u8> {
    let mut w = Writer::new();
    for e in list {
        w.u64(e.ino).u8(e.file_type.dirent_type()).u64(e.index);
        put_name(&mut w, &e.name);
    }
    w.finish()
}

/// Decodes a `DIR_ENTRY` item.
pub fn decode_dir_entries(b: &[u8]) -> Option<Vec<DirEntryRec>> {
    let mut r = Reader::new(b);
    let mut out = Vec::new();
    while r.remaining() > 0 {
        out.push(DirEntryRec {
            ino: r.u64()?,
            file_type: file_type_from_dt(r.u8()?)?,
            index: r.u64()?,
            name: get_name(&mut r)?,
        });
    }
    (!out.is_empty()).then_some(out)
}

/// `(dir, DIR_INDEX, index)`: an entry in readdir order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirIndexRec {
    /// The child.
    pub ino: u64,
    /// The child's type.
    pub file_type: FileType,
    /// The name.
    pub name: Vec<u8>,
}

impl DirIndexRec {
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u64(self.ino).u8(self.file_type.dirent_type());
        put_name(&mut w, &self.name);
        w.finish()
    }

    /// Decodes.
    pub fn decode(b: &[u8]) -> Option<DirIndexRec> {
        let mut r = Reader::new(b);
        let rec = DirIndexRec {
            ino: r.u64()?,
            file_type: file_type_from_dt(r.u8()?)?,
            name: get_name(&mut r)?,
        };
        (r.remaining() == 0).then_some(rec)
    }
}

/// One name of an inode: an entry of `(ino, INODE_REF, hash(parent, name))`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InodeRefRec {
    /// The directory holding the name.
    pub parent: u64,
    /// The name's `DIR_INDEX` in the parent.
    pub index: u64,
    /// The name.
    pub name: Vec<u8>,
}

/// Encodes an `INODE_REF` item.
pub fn encode_inode_refs(list: &[InodeRefRec]) -> Vec<u8> {
    let mut w = Writer::new();
    for e in list {
        w.u64(e.parent).u64(e.index);
        put_name(&mut w, &e.name);
    }
    w.finish()
}

/// Decodes an `INODE_REF` item.
pub fn decode_inode_refs(b: &[u8]) -> Option<Vec<InodeRefRec>> {
    let mut r = Reader::new(b);
    let mut out = Vec::new();
    while r.remaining() > 0 {
        out.push(InodeRefRec {
            parent: r.u64()?,
            index: r.u64()?,
            name: get_name(&mut r)?,
        });
    }
    (!out.is_empty()).then_some(out)
}

/// `(ino, EXTENT_DATA, file_offset)`: `num_blocks` blocks of the file, starting at byte
/// `file_offset` (block aligned), stored at blocks `offset_blocks..` of the data extent
/// that starts at `disk_block` and is `disk_blocks` long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileExtent {
    /// First block of the data extent.
    pub disk_block: u64,
    /// Length of the whole data extent.
    pub disk_blocks: u32,
    /// Where in the data extent this piece starts.
    pub offset_blocks: u32,
    /// Length of this piece.
    pub num_blocks: u32,
}

impl FileExtent {
    /// Encoded size.
    pub const LEN: usize = 24;

    /// First disk block this piece uses.
    pub fn first_block(&self) -> u64 {
        self.disk_block + u64::from(self.offset_blocks)
    }

    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(Self::LEN);
        w.u64(self.disk_block)
            .u32(self.disk_blocks)
            .u32(self.offset_blocks)
            .u32(self.num_blocks)
            .u32(0);
        w.finish()
    }

    /// Decodes (and checks the piece lies within its extent, and the extent is no
    /// longer than [`MAX_EXTENT_BLOCKS`](super::MAX_EXTENT_BLOCKS) and ends before the
    /// last block number: where on the device it may lie is the reader's to check).
    pub fn decode(b: &[u8]) -> Option<FileExtent> {
        if b.len() != Self::LEN {
            return None;
        }
        let mut r = Reader::new(b);
        let e = FileExtent {
            disk_block: r.u64()?,
            disk_blocks: r.u32()?,
            offset_blocks: r.u32()?,
            num_blocks: r.u32()?,
        };
        let end = e.offset_blocks.checked_add(e.num_blocks)?;
        e.disk_block.checked_add(u64::from(e.disk_blocks))?;
        (e.num_blocks > 0
            && e.disk_block > 0
            && end <= e.disk_blocks
            && e.disk_blocks <= super::MAX_EXTENT_BLOCKS)
            .then_some(e)
    }
}

/// `(disk_block, EXTENT, disk_blocks)` in the extent tree: a data extent and the number
/// of file extent items that reference it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentItem {
    /// Number of `EXTENT_DATA` items pointing into the extent.
    pub refs: u32,
    /// The inode that first wrote it (a hint for tools).
    pub owner: u64,
}

impl ExtentItem {
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(16);
        w.u32(self.refs).u32(0).u64(self.owner);
        w.finish()
    }

    /// Decodes.
    pub fn decode(b: &[u8]) -> Option<ExtentItem> {
        if b.len() != 16 {
            return None;
        }
        let mut r = Reader::new(b);
        let refs = r.u32()?;
        r.u32()?;
        let owner = r.u64()?;
        (refs > 0).then_some(ExtentItem { refs, owner })
    }
}

/// Encodes a `CSUM` item: one crc32c per block of the extent.
pub fn encode_csums(csums: &[u32]) -> Vec<u8> {
    let mut w = Writer::with_capacity(csums.len() * 4);
    for &c in csums {
        w.u32(c);
    }
    w.finish()
}

/// Decodes a `CSUM` item.
pub fn decode_csums(b: &[u8]) -> Option<Vec<u32>> {
    if b.is_empty() || !b.len().is_multiple_of(4) {
        return None;
    }
    Some(
        b.chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect(),
    )
}

/// Largest xattr value stored inline in its name item; longer values go to
/// `XATTR_CHUNK` items of [`XATTR_CHUNK_LEN`] bytes.
pub const XATTR_INLINE_MAX: usize = 1024;
/// Size of an xattr value chunk.
pub const XATTR_CHUNK_LEN: usize = 2048;

/// One xattr in an `(ino, XATTR, hash(name))` item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XattrRec {
    /// Per-inode id (keys its chunks).
    pub id: u64,
    /// The name.
    pub name: Vec<u8>,
    /// Length of the value.
    pub value_len: u32,
    /// The value if it is stored inline.
    pub inline: Option<Vec<u8>>,
}

/// Encodes an `XATTR` item.
pub fn encode_xattrs(list: &[XattrRec]) -> Vec<u8> {
    let mut w = Writer::new();
    for x in list {
        w.u64(x.id);
        put_name(&mut w, &x.name);
        w.u32(x.value_len);
        match &x.inline {
            Some(v) => w.u8(1).bytes(v),
            None => w.u8(0),
        };
    }
    w.finish()
}

/// Decodes an `XATTR` item.
pub fn decode_xattrs(b: &[u8]) -> Option<Vec<XattrRec>> {
    let mut r = Reader::new(b);
    let mut out = Vec::new();
    while r.remaining() > 0 {
        let id = r.u64()?;
        let name = get_name(&mut r)?;
        let value_len = r.u32()?;
        let inline = match r.u8()? {
            0 => None,
            1 => Some(r.bytes(value_len as usize)?.to_vec()),
            _ => return None,
        };
        if inline.is_none() && (value_len as usize) <= XATTR_INLINE_MAX {
            return None;
        }
        out.push(XattrRec {
            id,
            name,
            value_len,
            inline,
        });
    }
    (!out.is_empty()).then_some(out)
}

/// Longest snapshot name, in bytes.
pub const MAX_SNAPSHOT_NAME: usize = 64;

/// Trees a snapshot keeps a root of: everything a checkpoint commits (the log "tree" is
/// not a tree).
pub const SNAPSHOT_TREES: [TreeId; 3] = [TreeId::Fs, TreeId::Extent, TreeId::Csum];

/// `(0, SNAPSHOT, id)` in the fs tree: a snapshot — the roots of checkpoint `seq`, kept
/// read-only under `name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotItem {
    /// The name (1..=[`MAX_SNAPSHOT_NAME`] bytes, see `features::snapshots::valid_name`).
    pub name: Vec<u8>,
    /// When it was taken.
    pub created: Timespec,
    /// The checkpoint whose state it keeps.
    pub seq: u64,
    /// Inodes then, and the next inode number (for `statfs` and tools).
    pub inode_count: u64,
    /// Roots of [`SNAPSHOT_TREES`], in that order.
    pub roots: [Root; 3],
}

impl SnapshotItem {
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(128 + self.name.len());
        put_time(&mut w, self.created);
        w.u64(self.seq).u64(self.inode_count);
        for r in &self.roots {
            w.bytes(&r.ptr.to_bytes()).u8(r.level);
        }
        w.u16(self.name.len() as u16).bytes(&self.name);
        w.finish()
    }

    /// Decodes.
    pub fn decode(b: &[u8]) -> Option<SnapshotItem> {
        let mut r = Reader::new(b);
        let created = get_time(&mut r)?;
        let seq = r.u64()?;
        let inode_count = r.u64()?;
        let mut roots = [Root::default(); 3];
        for root in &mut roots {
            root.ptr = NodePtr::from_bytes(r.bytes(NodePtr::ENCODED_LEN)?)?;
            root.level = r.u8()?;
        }
        let len = r.u16()? as usize;
        let name = r.bytes(len)?.to_vec();
        (r.remaining() == 0 && !name.is_empty() && len <= MAX_SNAPSHOT_NAME).then_some(
            SnapshotItem {
                name,
                created,
                seq,
                inode_count,
                roots,
            },
        )
    }
}

/// `(0, QUOTA, project)`: a quota root's limits and usage. The project's id is the root
/// directory's inode number; every inode whose [`InodeItem::project`] is that id is
/// charged to it: one inode, and its [`InodeItem::bytes`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaItem {
    /// Most bytes (`None`: no limit; stored as `u64::MAX`).
    pub byte_limit: Option<u64>,
    /// Most inodes (`None`: no limit; stored as `u64::MAX`).
    pub inode_limit: Option<u64>,
    /// Bytes charged now.
    pub bytes: u64,
    /// Inodes charged now.
    pub inodes: u64,
    /// [`QuotaItem::LABELING`].
    pub flags: u64,
    /// While labeling: the project the subtree is taken from (the root's before it was
    /// made one). Only inodes of that project are relabeled; those of other projects
    /// (nested quota roots, reached through hard links) keep theirs.
    pub from: u64,
}

impl QuotaItem {
    /// Encoded size.
    pub const LEN: usize = 48;
    /// Flag: the subtree is still being labeled with the project (set when the root is
    /// made, cleared when every inode under it is charged; a mount that finds it set
    /// finishes the labeling).
    pub const LABELING: u64 = 1;

    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(Self::LEN);
        w.u64(self.byte_limit.unwrap_or(u64::MAX))
            .u64(self.inode_limit.unwrap_or(u64::MAX))
            .u64(self.bytes)
            .u64(self.inodes)
            .u64(self.flags)
            .u64(self.from);
        w.finish()
    }

    /// Decodes.
    pub fn decode(b: &[u8]) -> Option<QuotaItem> {
        if b.len() != Self::LEN {
            return None;
        }
        let mut r = Reader::new(b);
        let limit = |v: u64| (v != u64::MAX).then_some(v);
        let item = QuotaItem {
            byte_limit: limit(r.u64()?),
            inode_limit: limit(r.u64()?),
            bytes: r.u64()?,
            inodes: r.u64()?,
            flags: r.u64()?,
            from: r.u64()?,
        };
        (item.flags & !Self::LABELING == 0).then_some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_round_trip() {
        let q = QuotaItem {
            byte_limit: Some(1 << 30),
            inode_limit: None,
            bytes: 4096,
            inodes: 3,
            flags: QuotaItem::LABELING,
            from: 1,
        };
        assert_eq!(QuotaItem::decode(&q.encode()), Some(q));
        assert_eq!(QuotaItem::decode(&q.encode()[1..]), None);
        let unknown = QuotaItem { flags: 2, ..q };
        assert_eq!(QuotaItem::decode(&unknown.encode()), None);
    }

    #[test]
    fn inode_project_is_stored_in_the_last_bytes() {
        let i = InodeItem {
            mode: 0o100644,
            project: 0x0102_0304,
            ..Default::default()
        };
        let b = i.encode();
        assert_eq!(&b[120..128], &0x0102_0304u64.to_le_bytes());
        assert_eq!(InodeItem::decode(&b), Some(i));
    }

    #[test]
    fn inode_round_trip() {
        let i = InodeItem {
            mode: 0o100644,
            nlink: 1,
            size: 12345,
            mtime: Timespec { sec: -5, nsec: 7 },
            next_seq: 9,
            ..Default::default()
        };
        let b = i.encode();
        assert_eq!(b.len(), INODE_ITEM_LEN);
        assert_eq!(InodeItem::decode(&b), Some(i));
        assert_eq!(InodeItem::decode(&b[1..]), None);
        let mut bad = b.clone();
        bad[0] = 0; // no type bits
        bad[1] = 0;
        bad[2] = 0;
        assert_eq!(InodeItem::decode(&bad), None);
    }

    #[test]
    fn lists_round_trip() {
        let d = alloc::vec![
            DirEntryRec {
                ino: 5,
                file_type: FileType::Regular,
                index: 2,
                name: b"a".to_vec()
            },
            DirEntryRec {
                ino: 6,
                file_type: FileType::Directory,
                index: 3,
                name: b"bb".to_vec()
            },
        ];
        assert_eq!(decode_dir_entries(&encode_dir_entries(&d)), Some(d));
        let r = alloc::vec![InodeRefRec {
            parent: 9,
            index: 4,
            name: b"x".to_vec()
        }];
        assert_eq!(decode_inode_refs(&encode_inode_refs(&r)), Some(r));
        let x = alloc::vec![
            XattrRec {
                id: 1,
                name: b"user.a".to_vec(),
                value_len: 2,
                inline: Some(b"hi".to_vec())
            },
            XattrRec {
                id: 2,
                name: b"user.b".to_vec(),
                value_len: 5000,
                inline: None
            },
        ];
        assert_eq!(decode_xattrs(&encode_xattrs(&x)), Some(x));
        let di = DirIndexRec {
            ino: 9,
            file_type: FileType::Symlink,
            name: b"l".to_vec(),
        };
        assert_eq!(DirIndexRec::decode(&di.encode()), Some(di));
        assert_eq!(decode_dir_entries(&[]), None);
        assert_eq!(
            decode_csums(&encode_csums(&[1, 2, 3])),
            Some(alloc::vec![1, 2, 3])
        );
    }

    #[test]
    fn extents_checked() {
        let e = FileExtent {
            disk_block: 100,
            disk_blocks: 8,
            offset_blocks: 2,
            num_blocks: 6,
        };
        assert_eq!(FileExtent::decode(&e.encode()), Some(e));
        let over = FileExtent { num_blocks: 7, ..e };
        assert_eq!(FileExtent::decode(&over.encode()), None);
        // Extents longer than the largest, or running past the last block number.
        let long = FileExtent {
            disk_blocks: crate::format::MAX_EXTENT_BLOCKS + 1,
            ..e
        };
        assert_eq!(FileExtent::decode(&long.encode()), None);
        let wraps = FileExtent {
            disk_block: u64::MAX - 4,
            ..e
        };
        assert_eq!(FileExtent::decode(&wraps.encode()), None);
        let x = ExtentItem { refs: 2, owner: 7 };
        assert_eq!(ExtentItem::decode(&x.encode()), Some(x));
        assert_eq!(
            ExtentItem::decode(&ExtentItem { refs: 0, owner: 1 }.encode()),
            None
        );
    }

    #[test]
    fn snapshot_item_round_trips_and_rejects_garbage() {
        let item = SnapshotItem {
            name: b"nightly".to_vec(),
            created: Timespec {
                sec: 1_700_000_000,
                nsec: 5,
            },
            seq: 42,
            inode_count: 7,
            roots: [
                Root {
                    ptr: NodePtr {
                        addr: 100,
                        nonce: 1,
                        blocks: 2,
                    },
                    level: 1,
                },
                Root {
                    ptr: NodePtr {
                        addr: 200,
                        nonce: 2,
                        blocks: 1,
                    },
                    level: 0,
                },
                Root {
                    ptr: NodePtr {
                        addr: 300,
                        nonce: 3,
                        blocks: 3,
                    },
                    level: 0,
                },
            ],
        };
        let b = item.encode();
        assert_eq!(SnapshotItem::decode(&b), Some(item));
        assert_eq!(SnapshotItem::decode(&b[..b.len() - 1]), None);
        let mut long = b.clone();
        long.push(0);
        assert_eq!(SnapshotItem::decode(&long), None);
    }
}
