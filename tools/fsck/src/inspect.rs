//! Read-only access to an unmounted image: superblocks, nodes, bitmap groups, decoded
//! items. Shared by `fsck` and `dump`.

use alloc::collections::BTreeSet;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use block::BlockDevice;
use ninefs::btree::Node;
use ninefs::format::bitmap::GroupBlock;
use ninefs::format::bset::{check_written_by, parse_node, NodeId};
use ninefs::format::items::{
    decode_csums, decode_dir_entries, decode_inode_refs, decode_xattrs, DirIndexRec, ExtentItem,
    FileExtent, InodeItem, SnapshotItem,
};
use ninefs::format::key::kind;
use ninefs::format::superblock::{state, NodePtr, Superblock};
use ninefs::format::{Key, TreeId, BLOCK_SIZE};
use ninefs::io::Dev;
use ninefs::volume::{choose_group, read_superblock, MountError};

/// An image opened for inspection.
#[derive(Debug)]
pub struct Image<D> {
    dev: Dev<D>,
    /// The current superblock.
    pub sb: Superblock,
    /// Which superblock copies decoded.
    pub sb_valid: [bool; 2],
}

/// Why reading a node failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeError {
    /// The device failed.
    Io(String),
    /// The node is corrupt.
    Corrupt(String),
}

impl<D: BlockDevice> Image<D> {
    /// Opens `dev`, reading the superblocks.
    pub async fn open(dev: D) -> Result<Image<D>, MountError> {
        let dev = Dev::new(dev).map_err(MountError::Device)?;
        let (sb, sb_valid) = read_superblock(&dev).await?;
        if sb.layout.total_blocks > dev.blocks() {
            return Err(MountError::TooSmall);
        }
        Ok(Image { dev, sb, sb_valid })
    }

    /// The snapshot items of the fs tree, by id (reads only the nodes that can hold
    /// objectid 0).
    pub async fn snapshots(&self) -> Result<Vec<(u64, SnapshotItem)>, String> {
        let root = self.sb.root(TreeId::Fs);
        let mut out = Vec::new();
        let mut stack = vec![(root.level, root.ptr)];
        // Each node once, however often a forged tree points to it.
        let mut seen = BTreeSet::new();
        while let Some((level, ptr)) = stack.pop() {
            if !seen.insert(ptr.addr) {
                continue;
            }
            let node = self
                .read_node(TreeId::Fs, level, ptr)
                .await
                .map_err(|e| format!("fs tree node at block {}: {e:?}", ptr.addr))?;
            for (k, v) in node.iter_from(&Key::MIN) {
                if k.objectid > 0 {
                    break;
                }
                if level > 0 {
                    let child = NodePtr::from_bytes(v).ok_or("bad child pointer")?;
                    stack.push((level - 1, child));
                } else if k.kind == kind::SNAPSHOT {
                    let item = SnapshotItem::decode(v)
                        .ok_or_else(|| format!("undecodable snapshot item {k:?}"))?;
                    out.push((k.offset, item));
                }
            }
        }
        out.sort_by_key(|(id, _)| *id);
        Ok(out)
    }

    /// Superblock copy `i` (0 or 1) decoded, or why it is refused.
    pub async fn superblock_copy(&self, i: usize) -> Result<Superblock, String> {
        let block = ninefs::format::layout::SUPERBLOCK_BLOCKS[i];
        let buf = self.read_blocks(block, 1).await?;
        Superblock::decode(&buf).map_err(|e| e.to_string())
    }

    /// Whether the image was unmounted cleanly.
    pub fn clean(&self) -> bool {
        self.sb.state & state::CLEAN != 0
    }

    /// The commits the log holds past the checkpoint (what mount would replay, before
    /// it checks the last commit's data) and a commit that does not decode after them,
    /// or the log block the device failed to read.
    pub async fn log_commits(
        &self,
    ) -> Result<ninefs::synclog::replay::LogScan, ninefs::synclog::replay::UnreadableLog> {
        let l = self.sb.layout;
        ninefs::synclog::replay::scan(
            &self.dev,
            l.log_start,
            l.log_blocks,
            self.sb.log_epoch,
            self.sb.log_tail,
        )
        .await
    }

    /// The device.
    pub fn device(&self) -> &D {
        self.dev.inner()
    }

    /// Reads `blocks` blocks at `block`.
    pub async fn read_blocks(&self, block: u64, blocks: u64) -> Result<Vec<u8>, String> {
        let end = block.saturating_add(blocks);
        if end > self.dev.blocks() {
            return Err(format!(
                "blocks {block}..{end} lie past the end of the device"
            ));
        }
        let mut buf = vec![0u8; (blocks as usize) * BLOCK_SIZE];
        self.dev
            .read(block, &mut buf)
            .await
            .map_err(|e| format!("read of blocks {block}..{end}: {e}"))?;
        Ok(buf)
    }

    /// Reads the node `ptr` points to.
    pub async fn read_node(
        &self,
        tree: TreeId,
        level: u8,
        ptr: NodePtr,
    ) -> Result<Node, NodeError> {
        if !ptr.is_valid(&self.sb.layout, self.sb.node_size) {
            return Err(NodeError::Corrupt(format!(
                "pointer to {} blocks outside the data area, or of another size",
                ptr.blocks
            )));
        }
        let buf = self
            .read_blocks(ptr.addr, u64::from(ptr.blocks))
            .await
            .map_err(NodeError::Io)?;
        let id = NodeId {
            tree,
            level,
            nonce: ptr.nonce,
        };
        // No bset is newer than the checkpoint the superblock commits: the mount's next
        // append would follow it with a lower sequence.
        let sets = parse_node(&buf, id, ptr.blocks)
            .and_then(|sets| check_written_by(&sets, self.sb.checkpoint_seq).map(|()| sets))
            .map_err(|e| {
                NodeError::Corrupt(format!(
                    "bset at block {}: {}",
                    ptr.addr + u64::from(e.offset_blocks),
                    e.what
                ))
            })?;
        Ok(Node::from_disk(id, ptr.addr, ptr.blocks, &sets))
    }

    /// Reads bitmap group `g`: the committed version, or why there is none. With
    /// `strict`, a slot that fails its checksum is an error even if the other is good.
    pub async fn read_group(&self, g: u32, strict: bool) -> Result<(GroupBlock, usize), String> {
        let block = self.sb.layout.bitmap_block(g, 0);
        let buf = self.read_blocks(block, 2).await?;
        choose_group(&buf, g, self.sb.checkpoint_seq, strict)
            .map_err(|e| format!("bitmap group {g} at block {block}: {e}"))
    }
}

/// One line about snapshot `id`: name, checkpoint, time, inodes, roots.
pub fn describe_snapshot(id: u64, s: &SnapshotItem) -> String {
    format!(
        "snapshot {id} {:?}: checkpoint {} created {}.{:09} inodes {} roots fs {} extent {} csum {}",
        String::from_utf8_lossy(&s.name),
        s.seq,
        s.created.sec,
        s.created.nsec,
        s.inode_count,
        s.roots[0].ptr.addr,
        s.roots[1].ptr.addr,
        s.roots[2].ptr.addr
    )
}

/// A one-line description of an item, for dumps and error messages.
pub fn describe_item(tree: TreeId, key: &Key, val: &[u8]) -> String {
    let body = match (tree, key.kind) {
        (TreeId::Fs, kind::INODE) => match InodeItem::decode(val) {
            Some(i) => format!(
                "mode {:o} nlink {} uid {} gid {} size {} bytes {} gen {} next_seq {} mtime {}.{:09}",
                i.mode, i.nlink, i.uid, i.gid, i.size, i.bytes, i.generation, i.next_seq, i.mtime.sec, i.mtime.nsec
            ),
            None => String::from("<undecodable inode>"),
        },
        (TreeId::Fs, kind::DIR_ENTRY) => match decode_dir_entries(val) {
            Some(list) => list
                .iter()
                .map(|e| format!("{:?} -> {} ({:?}, index {})", e.name.escape_ascii().to_string(), e.ino, e.file_type, e.index))
                .collect::<Vec<_>>()
                .join(", "),
            None => String::from("<undecodable dir entry>"),
        },
        (TreeId::Fs, kind::SNAPSHOT) => match SnapshotItem::decode(val) {
            Some(s) => describe_snapshot(key.offset, &s),
            None => String::from("<undecodable snapshot>"),
        },
        (TreeId::Fs, kind::DIR_INDEX) => match DirIndexRec::decode(val) {
            Some(e) => format!("{:?} -> {} ({:?})", e.name.escape_ascii().to_string(), e.ino, e.file_type),
            None => String::from("<undecodable dir index>"),
        },
        (TreeId::Fs, kind::INODE_REF) => match decode_inode_refs(val) {
            Some(list) => list
                .iter()
                .map(|r| format!("{:?} in {} (index {})", r.name.escape_ascii().to_string(), r.parent, r.index))
                .collect::<Vec<_>>()
                .join(", "),
            None => String::from("<undecodable inode ref>"),
        },
        (TreeId::Fs, kind::XATTR) => match decode_xattrs(val) {
            Some(list) => list
                .iter()
                .map(|x| format!("{:?} ({} bytes{})", x.name.escape_ascii().to_string(), x.value_len, if x.inline.is_some() { ", inline" } else { "" }))
                .collect::<Vec<_>>()
                .join(", "),
            None => String::from("<undecodable xattr>"),
        },
        (TreeId::Fs, kind::EXTENT_DATA) => match FileExtent::decode(val) {
            Some(e) => format!(
                "disk {}+{} (extent {}..{}) {} blocks",
                e.disk_block,
                e.offset_blocks,
                e.disk_block,
                e.disk_block.saturating_add(u64::from(e.disk_blocks)),
                e.num_blocks
            ),
            None => String::from("<undecodable file extent>"),
        },
        (TreeId::Extent, kind::EXTENT) => match ExtentItem::decode(val) {
            Some(e) => format!("refs {} owner {}", e.refs, e.owner),
            None => String::from("<undecodable extent item>"),
        },
        (TreeId::Csum, kind::CSUM) => match decode_csums(val) {
            Some(c) => format!("{} checksums, first {:08x}", c.len(), c[0]),
            None => String::from("<undecodable checksums>"),
        },
        _ => format!("{} bytes", val.len()),
    };
    format!("{key:?} {body}")
}
