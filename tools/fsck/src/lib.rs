//! The consistency checker. Reads an unmounted image (any [`BlockDevice`]) and checks:
//!
//! - superblocks: both copies valid (a torn copy is only a warning after a crash);
//! - every node of every tree: checksums, identity, key order, keys within the bounds
//!   its parent gives it, levels, fill;
//! - the fs tree: inode items, directory entries against the directory index and the
//!   inodes' back-references, link counts, directory sizes, orphans, symlinks, xattrs,
//!   file extents (no overlaps, within their data extent);
//! - data extents: reference counts against the file extents pointing into them, a
//!   checksum item of the right length for each, and (optionally) every data block
//!   against its checksum;
//! - allocation: the bitmap against the blocks actually used (fixed regions, nodes, data
//!   extents), the free counts, overlaps.
//!
//! It never changes the image. Problems are reported as errors (the image is damaged)
//! or warnings (harmless leftovers, such as extents past the end of a file after a crash
//! interrupted a truncation).
//!
//! [`inspect`] reads an image's superblocks, nodes and items for the checker and for
//! `ninefold dump`. The offline tools of the filesystem, kept out of the filesystem crate
//! itself (the appliance does not carry them); built on its public format and btree
//! modules. `no_std + alloc`.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]

extern crate alloc;

pub mod inspect;

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use crate::inspect::{describe_item, Image, NodeError};
use block::BlockDevice;
use ninefs::format::bitmap::{test_bit, BLOCKS_PER_GROUP};
use ninefs::format::bset::HEADER_LEN;
use ninefs::format::items::{
    decode_csums, decode_dir_entries, decode_inode_refs, decode_xattrs, DirIndexRec, ExtentItem,
    FileExtent, InodeItem, XATTR_CHUNK_LEN,
};
use ninefs::format::key::kind;
use ninefs::format::layout::Layout;
use ninefs::format::superblock::NodePtr;
use ninefs::format::{Key, TreeId, BLOCK_SIZE};
use ninefs::util::crc::crc32c;
use ninefs::util::hash::name_ref_hash;
use vfs::{FileType, ROOT_INO};

/// What to check.
#[derive(Clone, Copy, Debug)]
pub struct FsckOptions {
    /// Read every data block and verify its checksum.
    pub check_data: bool,
}

impl Default for FsckOptions {
    fn default() -> FsckOptions {
        FsckOptions { check_data: true }
    }
}

/// Totals found by a check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsckStats {
    /// Nodes read.
    pub nodes: u64,
    /// Items read (all trees).
    pub items: u64,
    /// Inodes.
    pub inodes: u64,
    /// Directories.
    pub dirs: u64,
    /// Data extents.
    pub extents: u64,
    /// Data blocks in use.
    pub data_blocks: u64,
    /// Free blocks according to the bitmap.
    pub free_blocks: u64,
}

/// The result of a check.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Damage found.
    pub errors: Vec<String>,
    /// Harmless findings.
    pub warnings: Vec<String>,
    /// Totals.
    pub stats: FsckStats,
    /// Blocks holding live metadata (superblocks, bitmap slots, committed node blocks):
    /// `(first block, count)`.
    pub metadata_blocks: Vec<(u64, u64)>,
    /// Blocks holding referenced data: `(first block, count)`.
    pub data_blocks: Vec<(u64, u64)>,
}

impl Report {
    /// Whether no errors were found.
    pub fn is_clean(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Why a check could not run at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FsckError {
    /// No valid superblock, unusable device, ...
    Open(ninefs::volume::MountError),
}

impl core::fmt::Display for FsckError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FsckError::Open(e) => write!(f, "cannot open the filesystem: {e}"),
        }
    }
}

/// Most errors of one kind listed before they are only counted.
const MAX_LISTED: usize = 50;

struct Checker<D> {
    img: Image<D>,
    report: Report,
    /// Blocks in use, one bit each.
    used: Vec<u64>,
    fs_items: BTreeMap<Key, Vec<u8>>,
    extent_items: BTreeMap<Key, Vec<u8>>,
    csum_items: BTreeMap<Key, Vec<u8>>,
    overlaps: usize,
}

/// Checks the filesystem on `dev`.
pub async fn fsck<D: BlockDevice>(dev: D, opts: &FsckOptions) -> Result<Report, FsckError> {
    let img = Image::open(dev).await.map_err(FsckError::Open)?;
    let total = img.sb.layout.total_blocks;
    let mut c = Checker {
        img,
        report: Report::default(),
        used: vec![0; total.div_ceil(64) as usize],
        fs_items: BTreeMap::new(),
        extent_items: BTreeMap::new(),
        csum_items: BTreeMap::new(),
        overlaps: 0,
    };
    c.check_superblocks();
    if !c.img.clean() {
        let commits = c.img.log_commits().await;
        if !commits.is_empty() {
            let records: usize = commits.iter().map(|c| c.records.len()).sum();
            c.warn(format!(
                "the fsync log holds {} commits ({records} records) that mount will replay; this check covers the checkpoint only",
                commits.len()
            ));
        }
    }
    for tree in TreeId::ALL {
        let root = c.img.sb.root(tree);
        if root.ptr.addr == 0 {
            if tree != TreeId::Log {
                c.error(format!("{} tree has no root", tree.name()));
            }
            continue;
        }
        c.walk(tree, root.level, root.ptr, Key::MIN, None).await;
    }
    c.check_fs_tree();
    c.check_extents(opts).await;
    c.check_bitmap().await;
    Ok(c.report)
}

impl<D: BlockDevice> Checker<D> {
    fn error(&mut self, msg: String) {
        if self.report.errors.len() < MAX_LISTED * 4 {
            self.report.errors.push(msg);
        } else if self.report.errors.len() == MAX_LISTED * 4 {
            self.report
                .errors
                .push(String::from("(more errors not listed)"));
        }
    }

    fn warn(&mut self, msg: String) {
        if self.report.warnings.len() < MAX_LISTED {
            self.report.warnings.push(msg);
        }
    }

    /// Marks `[start, start + n)` used by `what`; reports blocks outside the device or
    /// already used.
    fn mark(&mut self, start: u64, n: u64, what: &str) {
        let total = self.img.sb.layout.total_blocks;
        if start.checked_add(n).is_none_or(|e| e > total) {
            self.error(format!(
                "{what} at blocks {start}..+{n} lies outside the filesystem"
            ));
            return;
        }
        for b in start..start + n {
            let (w, bit) = ((b / 64) as usize, b % 64);
            if self.used[w] & (1 << bit) != 0 {
                self.overlaps += 1;
                if self.overlaps <= MAX_LISTED {
                    self.error(format!(
                        "block {b} of {what} is also used by something else"
                    ));
                }
            }
            self.used[w] |= 1 << bit;
        }
    }

    fn check_superblocks(&mut self) {
        let sb = self.img.sb.clone();
        for (i, valid) in self.img.sb_valid.into_iter().enumerate() {
            if !valid {
                let msg = format!("superblock copy {i} is invalid");
                if self.img.clean() {
                    self.error(msg);
                } else {
                    self.warn(format!("{msg} (the filesystem was not unmounted cleanly)"));
                }
            }
        }
        if !self.img.clean() {
            self.warn(String::from("the filesystem was not unmounted cleanly"));
        }
        let l = sb.layout;
        self.mark(0, 1, "reserved block 0");
        self.mark(1, 2, "superblocks");
        self.mark(l.bitmap_block(0, 0), 2 * u64::from(l.groups), "bitmap");
        self.mark(l.log_start, l.log_blocks, "log region");
        self.report.metadata_blocks.push((1, 2));
        self.report
            .metadata_blocks
            .push((l.bitmap_block(0, 0), 2 * u64::from(l.groups)));
    }

    /// Checks the subtree at `ptr` whose keys must lie in `[lower, upper)`.
    async fn walk(
        &mut self,
        tree: TreeId,
        level: u8,
        ptr: NodePtr,
        lower: Key,
        upper: Option<Key>,
    ) {
        // Iterative depth-first walk (async recursion would need boxing).
        let mut stack = vec![(level, ptr, lower, upper)];
        let node_blocks = u64::from(self.img.sb.node_size) / BLOCK_SIZE as u64;
        let data_start = self.img.sb.layout.data_start();
        while let Some((level, ptr, lower, upper)) = stack.pop() {
            let at = format!(
                "{} tree node at block {} (level {level})",
                tree.name(),
                ptr.addr
            );
            if ptr.addr < data_start {
                self.error(format!("{at}: inside the fixed regions"));
                continue;
            }
            self.mark(ptr.addr, node_blocks, &at);
            let node = match self.img.read_node(tree, level, ptr).await {
                Ok(n) => n,
                Err(NodeError::Io(e)) | Err(NodeError::Corrupt(e)) => {
                    self.error(format!("{at}: {e}"));
                    continue;
                }
            };
            self.report.stats.nodes += 1;
            self.report
                .metadata_blocks
                .push((ptr.addr, u64::from(ptr.blocks)));
            if node.live_bytes() + HEADER_LEN > self.img.sb.node_size as usize {
                self.error(format!(
                    "{at}: {} bytes of keys overflow the node",
                    node.live_bytes()
                ));
            }
            let entries: Vec<(Key, Vec<u8>)> = node
                .iter_from(&Key::MIN)
                .map(|(k, v)| (k, v.to_vec()))
                .collect();
            for (k, _) in &entries {
                if *k < lower || upper.is_some_and(|u| *k >= u) {
                    self.error(format!(
                        "{at}: key {k:?} outside the node's range {lower:?}..{upper:?}"
                    ));
                }
            }
            if level == 0 {
                self.report.stats.items += entries.len() as u64;
                let map = match tree {
                    TreeId::Fs => &mut self.fs_items,
                    TreeId::Extent => &mut self.extent_items,
                    TreeId::Csum => &mut self.csum_items,
                    TreeId::Log => continue,
                };
                map.extend(entries);
                continue;
            }
            if entries.is_empty() {
                self.error(format!("{at}: interior node without children"));
                continue;
            }
            if entries[0].0 != lower {
                self.error(format!(
                    "{at}: first separator {:?} is not the node's lower bound {lower:?}",
                    entries[0].0
                ));
            }
            for (i, (sep, val)) in entries.iter().enumerate().rev() {
                let next = entries.get(i + 1).map(|e| e.0).or(upper);
                match NodePtr::from_bytes(val) {
                    Some(child) => stack.push((level - 1, child, *sep, next)),
                    None => self.error(format!("{at}: bad child pointer under {sep:?}")),
                }
            }
        }
    }

    fn check_fs_tree(&mut self) {
        let items = core::mem::take(&mut self.fs_items);
        let mut inodes: BTreeMap<u64, InodeItem> = BTreeMap::new();
        // (dir, name) -> (ino, type, index) from DIR_ENTRY; and from DIR_INDEX.
        let mut by_name: BTreeMap<(u64, Vec<u8>), (u64, u8, u64)> = BTreeMap::new();
        let mut by_index: BTreeMap<(u64, Vec<u8>), (u64, u8, u64)> = BTreeMap::new();
        let mut refs: BTreeSet<(u64, u64, u64, Vec<u8>)> = BTreeSet::new(); // (ino, parent, index, name)
        let mut orphans: BTreeSet<u64> = BTreeSet::new();
        let mut symlinks: BTreeMap<u64, u64> = BTreeMap::new();
        let mut xattr_chunks: BTreeSet<(u64, u64)> = BTreeSet::new();
        let mut xattr_needs: Vec<(u64, u64, u32)> = Vec::new();
        let mut file_extents: BTreeMap<u64, Vec<(u64, FileExtent)>> = BTreeMap::new();
        for (k, v) in &items {
            let bad =
                |what: &str| format!("{}: undecodable {what}", describe_item(TreeId::Fs, k, v));
            if k.objectid == 0 {
                if k.kind == kind::ORPHAN {
                    orphans.insert(k.offset);
                } else {
                    self.error(format!("unexpected item {k:?}"));
                }
                continue;
            }
            match k.kind {
                kind::INODE => match InodeItem::decode(v) {
                    Some(i) if k.offset == 0 => {
                        inodes.insert(k.objectid, i);
                    }
                    _ => self.error(bad("inode")),
                },
                kind::INODE_REF => match decode_inode_refs(v) {
                    Some(list) => {
                        let secret = self.img.sb.secret;
                        for r in list {
                            if name_ref_hash(secret, r.parent, &r.name) != k.offset {
                                self.error(format!(
                                    "{}: name {:?} in dir {} is in the wrong hash bucket",
                                    describe_item(TreeId::Fs, k, v),
                                    r.name.escape_ascii().to_string(),
                                    r.parent
                                ));
                            }
                            refs.insert((k.objectid, r.parent, r.index, r.name));
                        }
                    }
                    None => self.error(bad("inode ref")),
                },
                kind::DIR_ENTRY => match decode_dir_entries(v) {
                    Some(list) => {
                        for e in list {
                            by_name.insert(
                                (k.objectid, e.name),
                                (e.ino, e.file_type.dirent_type(), e.index),
                            );
                        }
                    }
                    None => self.error(bad("directory entry")),
                },
                kind::DIR_INDEX => match DirIndexRec::decode(v) {
                    Some(e) => {
                        by_index.insert(
                            (k.objectid, e.name),
                            (e.ino, e.file_type.dirent_type(), k.offset),
                        );
                    }
                    None => self.error(bad("directory index")),
                },
                kind::SYMLINK => {
                    *symlinks.entry(k.objectid).or_default() += v.len() as u64;
                }
                kind::XATTR => match decode_xattrs(v) {
                    Some(list) => {
                        for x in list {
                            if x.inline.is_none() {
                                xattr_needs.push((k.objectid, x.id, x.value_len));
                            }
                        }
                    }
                    None => self.error(bad("xattr")),
                },
                kind::XATTR_CHUNK => {
                    xattr_chunks.insert((k.objectid, k.offset));
                }
                kind::EXTENT_DATA => match FileExtent::decode(v) {
                    Some(e) if k.offset.is_multiple_of(BLOCK_SIZE as u64) => {
                        file_extents
                            .entry(k.objectid)
                            .or_default()
                            .push((k.offset / BLOCK_SIZE as u64, e));
                    }
                    _ => self.error(bad("file extent")),
                },
                _ => self.error(format!("unknown item {k:?}")),
            }
        }
        // Every item belongs to an existing inode.
        let owners: BTreeSet<u64> = items
            .keys()
            .filter(|k| k.objectid != 0)
            .map(|k| k.objectid)
            .collect();
        for ino in owners {
            if !inodes.contains_key(&ino) {
                self.error(format!("items of inode {ino}, which has no inode item"));
            }
        }
        self.report.stats.inodes = inodes.len() as u64;
        match inodes.get(&ROOT_INO) {
            Some(root) if root.is_dir() => {}
            _ => self.error(String::from("the root directory is missing")),
        }
        if let Some((&max, _)) = inodes.last_key_value() {
            if max >= self.img.sb.next_ino {
                self.error(format!(
                    "inode {max} is not below next_ino {}",
                    self.img.sb.next_ino
                ));
            }
        }
        if self.img.sb.inode_count != inodes.len() as u64 {
            self.error(format!(
                "superblock counts {} inodes, the tree holds {}",
                self.img.sb.inode_count,
                inodes.len()
            ));
        }
        // Names: the hashed entries, the index and the back-references agree.
        if by_name != by_index {
            let a: BTreeSet<_> = by_name.iter().collect();
            let b: BTreeSet<_> = by_index.iter().collect();
            for x in a.symmetric_difference(&b).take(MAX_LISTED) {
                self.error(format!(
                    "directory entry and index disagree: dir {} name {:?} -> {:?}",
                    x.0 .0,
                    x.0 .1.escape_ascii().to_string(),
                    x.1
                ));
            }
        }
        let expected_refs: BTreeSet<(u64, u64, u64, Vec<u8>)> = by_name
            .iter()
            .map(|((dir, name), (ino, _, idx))| (*ino, *dir, *idx, name.clone()))
            .collect();
        for x in expected_refs.symmetric_difference(&refs).take(MAX_LISTED) {
            self.error(format!(
                "inode back-reference and directory entry disagree: inode {} in dir {} name {:?}",
                x.0,
                x.1,
                x.3.escape_ascii().to_string()
            ));
        }
        // Link counts, types, directory sizes.
        let mut names: BTreeMap<u64, u32> = BTreeMap::new();
        let mut subdirs: BTreeMap<u64, u32> = BTreeMap::new();
        let mut entries: BTreeMap<u64, u64> = BTreeMap::new();
        let mut max_index: BTreeMap<u64, u64> = BTreeMap::new();
        for ((dir, name), (ino, ft, idx)) in &by_name {
            *names.entry(*ino).or_default() += 1;
            *entries.entry(*dir).or_default() += 1;
            let m = max_index.entry(*dir).or_default();
            *m = (*m).max(*idx);
            match inodes.get(ino) {
                None => self.error(format!(
                    "entry {:?} in dir {dir} points to missing inode {ino}",
                    name.escape_ascii().to_string()
                )),
                Some(i) => {
                    if i.file_type().map(FileType::dirent_type) != Some(*ft) {
                        self.error(format!(
                            "entry {:?} in dir {dir} has the wrong type for inode {ino}",
                            name.escape_ascii().to_string()
                        ));
                    }
                    if i.is_dir() {
                        *subdirs.entry(*dir).or_default() += 1;
                    }
                }
            }
            match inodes.get(dir) {
                Some(d) if d.is_dir() => {}
                _ => self.error(format!(
                    "entry {:?} in {dir}, which is not a directory",
                    name.escape_ascii().to_string()
                )),
            }
        }
        for (ino, item) in &inodes {
            let n = names.get(ino).copied().unwrap_or(0);
            if item.is_dir() {
                self.report.stats.dirs += 1;
                let expect = if item.nlink == 0 {
                    0
                } else {
                    2 + subdirs.get(ino).copied().unwrap_or(0)
                };
                if item.nlink != expect || (n != 1 && *ino != ROOT_INO && item.nlink != 0) {
                    self.error(format!(
                        "directory {ino}: nlink {} but {n} names and {} subdirectories",
                        item.nlink,
                        subdirs.get(ino).copied().unwrap_or(0)
                    ));
                }
                if item.size != entries.get(ino).copied().unwrap_or(0) {
                    self.error(format!(
                        "directory {ino}: size {} but {} entries",
                        item.size,
                        entries.get(ino).copied().unwrap_or(0)
                    ));
                }
                if max_index.get(ino).is_some_and(|&m| m >= item.next_seq) {
                    self.error(format!(
                        "directory {ino}: entry index not below next_seq {}",
                        item.next_seq
                    ));
                }
            } else if item.nlink != n {
                self.error(format!("inode {ino}: nlink {} but {n} names", item.nlink));
            }
            if item.nlink == 0 && !orphans.contains(ino) {
                self.error(format!("inode {ino} has no links and no orphan item"));
            }
            if item.file_type() == Some(FileType::Symlink)
                && symlinks.get(ino).copied().unwrap_or(0) != item.size
            {
                self.error(format!(
                    "symlink {ino}: target length differs from size {}",
                    item.size
                ));
            }
        }
        for ino in &orphans {
            match inodes.get(ino) {
                Some(i) if i.nlink == 0 => {}
                Some(_) => self.error(format!("orphan item for linked inode {ino}")),
                None => self.warn(format!("orphan item for missing inode {ino}")),
            }
        }
        for (ino, id, len) in xattr_needs {
            for chunk in 0..(len as usize).div_ceil(XATTR_CHUNK_LEN) {
                if !xattr_chunks.remove(&(ino, (id << 8) | chunk as u64)) {
                    self.error(format!("inode {ino}: xattr {id} is missing chunk {chunk}"));
                }
            }
        }
        for (ino, off) in xattr_chunks.into_iter().take(MAX_LISTED) {
            self.error(format!(
                "inode {ino}: xattr chunk {off:#x} belongs to no xattr"
            ));
        }
        // File extents: no overlaps, bytes count, references.
        let mut counted: BTreeMap<(u64, u32), u32> = BTreeMap::new();
        for (ino, list) in file_extents {
            let item = inodes.get(&ino);
            if item.is_some_and(|i| i.file_type() != Some(FileType::Regular)) {
                self.error(format!(
                    "inode {ino} has file extents but is not a regular file"
                ));
            }
            let mut end = 0;
            let mut blocks = 0u64;
            for (fb, e) in &list {
                if *fb < end {
                    self.error(format!("inode {ino}: file extents overlap at block {fb}"));
                }
                end = fb + u64::from(e.num_blocks);
                blocks += u64::from(e.num_blocks);
                *counted.entry((e.disk_block, e.disk_blocks)).or_default() += 1;
            }
            if let Some(i) = item {
                if end * BLOCK_SIZE as u64 > i.size.next_multiple_of(BLOCK_SIZE as u64) {
                    self.warn(format!(
                        "inode {ino}: extents past the end of file (an interrupted truncation)"
                    ));
                }
                if i.bytes != blocks * BLOCK_SIZE as u64 {
                    self.error(format!(
                        "inode {ino}: records {} bytes of extents, has {}",
                        i.bytes,
                        blocks * BLOCK_SIZE as u64
                    ));
                }
            }
        }
        self.check_refs(counted);
    }

    fn check_refs(&mut self, counted: BTreeMap<(u64, u32), u32>) {
        let items = core::mem::take(&mut self.extent_items);
        let mut seen = BTreeSet::new();
        for (k, v) in &items {
            if k.kind != kind::EXTENT || k.offset == 0 || k.offset > u64::from(u32::MAX) {
                self.error(format!("extent tree: unexpected item {k:?}"));
                continue;
            }
            let Some(e) = ExtentItem::decode(v) else {
                self.error(format!("extent tree: undecodable item {k:?}"));
                continue;
            };
            let id = (k.objectid, k.offset as u32);
            seen.insert(id);
            let refs = counted.get(&id).copied().unwrap_or(0);
            if refs != e.refs {
                self.error(format!(
                    "data extent {}+{}: reference count {} but {refs} file extents",
                    k.objectid, k.offset, e.refs
                ));
            }
            self.report.stats.extents += 1;
            self.report.stats.data_blocks += k.offset;
            self.mark(k.objectid, k.offset, "data extent");
            self.report.data_blocks.push((k.objectid, k.offset));
        }
        for (id, n) in counted {
            if !seen.contains(&id) {
                self.error(format!(
                    "{n} file extents point into {}+{}, which has no extent item",
                    id.0, id.1
                ));
            }
        }
        self.extent_items = items;
    }

    async fn check_extents(&mut self, opts: &FsckOptions) {
        let csums = core::mem::take(&mut self.csum_items);
        let extents: Vec<(u64, u64)> = self
            .extent_items
            .keys()
            .map(|k| (k.objectid, k.offset))
            .collect();
        let mut by_block: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
        for (k, v) in &csums {
            match decode_csums(v) {
                Some(c) if k.kind == kind::CSUM && k.offset == 0 => {
                    by_block.insert(k.objectid, c);
                }
                _ => self.error(format!("checksum tree: bad item {k:?}")),
            }
        }
        for (start, len) in extents {
            let Some(sums) = by_block.remove(&start) else {
                self.error(format!("data extent {start}+{len} has no checksums"));
                continue;
            };
            if sums.len() as u64 != len {
                self.error(format!(
                    "data extent {start}+{len} has {} checksums",
                    sums.len()
                ));
                continue;
            }
            if len > u64::from(ninefs::format::MAX_EXTENT_BLOCKS)
                || start + len > self.img.sb.layout.total_blocks
            {
                self.error(format!(
                    "data extent {start}+{len} is too long or outside the filesystem"
                ));
                continue;
            }
            if !opts.check_data {
                continue;
            }
            match self.img.read_blocks(start, len).await {
                Ok(data) => {
                    for (i, block) in data.chunks(BLOCK_SIZE).enumerate() {
                        if crc32c(block) != sums[i] {
                            self.error(format!(
                                "data block {} fails its checksum",
                                start + i as u64
                            ));
                        }
                    }
                }
                Err(e) => self.error(e),
            }
        }
        for (start, _) in by_block.into_iter().take(MAX_LISTED) {
            self.error(format!(
                "checksums for block {start}, which starts no data extent"
            ));
        }
    }

    async fn check_bitmap(&mut self) {
        let layout: Layout = self.img.sb.layout;
        let strict = self.img.clean();
        let mut free_total = 0u64;
        let mut leaked = 0u64;
        let mut lost = 0u64;
        for g in 0..layout.groups {
            let grp = match self.img.read_group(g, strict).await {
                Ok((grp, _)) => grp,
                Err(e) => {
                    self.error(e);
                    continue;
                }
            };
            let start = u64::from(g) * BLOCKS_PER_GROUP;
            let mut free = 0u32;
            for i in 0..BLOCKS_PER_GROUP {
                let b = start + i;
                let allocated = test_bit(&grp.bits, i as usize);
                if b >= layout.total_blocks {
                    if !allocated {
                        self.error(format!(
                            "bitmap group {g}: block {b} past the end is marked free"
                        ));
                    }
                    continue;
                }
                if !allocated {
                    free += 1;
                }
                let used = self.used[(b / 64) as usize] & (1 << (b % 64)) != 0;
                match (allocated, used) {
                    (true, false) => {
                        leaked += 1;
                        if leaked <= 10 {
                            self.error(format!("block {b} is allocated but not used"));
                        }
                    }
                    (false, true) => {
                        lost += 1;
                        if lost <= 10 {
                            self.error(format!("block {b} is used but marked free"));
                        }
                    }
                    _ => {}
                }
            }
            if free != grp.free {
                self.error(format!(
                    "bitmap group {g}: header says {} free, bitmap has {free}",
                    grp.free
                ));
            }
            free_total += u64::from(free);
        }
        if leaked > 10 || lost > 10 {
            self.error(format!(
                "in all {leaked} blocks allocated but unused, {lost} used but free"
            ));
        }
        self.report.stats.free_blocks = free_total;
        if free_total != self.img.sb.free_blocks {
            self.error(format!(
                "superblock says {} blocks free, the bitmap has {free_total}",
                self.img.sb.free_blocks
            ));
        }
    }
}
