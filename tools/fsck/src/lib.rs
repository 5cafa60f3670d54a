//! The consistency checker. Reads an unmounted image (any [`BlockDevice`]) and checks:
//!
//! - superblocks: both copies valid (a torn copy is only a warning after a crash);
//! - every node of every tree: checksums, identity, key order, keys within the bounds
//!   its parent gives it, levels, fill;
//! - the fs tree: inode items, directory entries against the directory index and the
//!   inodes' back-references, link counts, directory sizes, orphans, symlinks, xattrs,
//!   file extents (no overlaps, within their data extent), project quotas (each
//!   project's usage recomputed from its inodes);
//! - data extents: reference counts against the file extents pointing into them, a
//!   checksum item of the right length for each, and (optionally) every data block
//!   against its checksum;
//! - snapshots: each one's trees as above (its own reference counts and checksums); a
//!   block may be shared between the live trees and any number of snapshots;
//! - allocation: the bitmap against the blocks actually used by the live trees or a
//!   snapshot (fixed regions, nodes, data extents), the free counts, overlaps;
//! - the fsync log of an image not unmounted cleanly: every commit the mount would
//!   replay, replayed in memory by the filesystem's own replay, which must accept it,
//!   and (optionally) every block of the data extents it adds against the checksum the
//!   log gave it ([`log`]).
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

mod fs_tree;
pub mod inspect;
mod log;

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use crate::inspect::{Image, NodeError};
use block::BlockDevice;
use ninefs::format::bitmap::{test_bit, BLOCKS_PER_GROUP};
use ninefs::format::bset::HEADER_LEN;
use ninefs::format::items::{decode_csums, ExtentItem, QuotaItem, SnapshotItem, SNAPSHOT_TREES};
use ninefs::format::key::kind;
use ninefs::format::layout::Layout;
use ninefs::format::superblock::NodePtr;
use ninefs::format::{Key, TreeId, BLOCK_SIZE};
use ninefs::util::crc::crc32c;

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
    /// Snapshots checked.
    pub snapshots: u64,
    /// Blocks only snapshots reference (the space they pin).
    pub snapshot_blocks: u64,
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
    /// The quota items of the live filesystem, by project (root inode); their usage is
    /// checked against the inodes.
    pub quotas: Vec<(u64, QuotaItem)>,
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
    /// The snapshot items of the fs tree checked last, by id.
    snapshots: BTreeMap<u64, SnapshotItem>,
    /// Blocks some snapshot references, one bit each.
    snap_used: Vec<u64>,
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
        snapshots: BTreeMap::new(),
        snap_used: vec![0; total.div_ceil(64) as usize],
    };
    c.check_superblocks().await;
    if !c.img.clean() {
        c.check_log(opts).await;
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
    c.check_snapshot_items();
    c.check_extents(opts).await;
    for (id, snap) in core::mem::take(&mut c.snapshots) {
        c.check_snapshot(id, &snap, opts).await;
    }
    c.check_bitmap().await;
    Ok(c.report)
}

impl<D: BlockDevice> Checker<D> {
    /// Checks snapshot `id` as a filesystem of its own (its trees, names, reference
    /// counts, checksums), and records the blocks it references. Blocks it shares with
    /// the live filesystem or other snapshots are expected; within it, the same rules as
    /// for the live trees hold.
    async fn check_snapshot(&mut self, id: u64, snap: &SnapshotItem, opts: &FsckOptions) {
        let name = String::from_utf8_lossy(&snap.name).into_owned();
        let (live_roots, live_inodes) = (self.img.sb.roots, self.img.sb.inode_count);
        self.img.sb.inode_count = snap.inode_count;
        self.fs_items.clear();
        self.extent_items.clear();
        self.csum_items.clear();
        let live_used = core::mem::replace(&mut self.used, vec![0; self.snap_used.len()]);
        let live_report = core::mem::take(&mut self.report);
        let live_overlaps = core::mem::replace(&mut self.overlaps, 0);
        for (tree, root) in SNAPSHOT_TREES.iter().zip(snap.roots) {
            self.img.sb.roots[*tree as usize] = root;
            if root.ptr.addr == 0 {
                self.error(format!("{} tree has no root", tree.name()));
                continue;
            }
            Box::pin(self.walk(*tree, root.level, root.ptr, Key::MIN, None)).await;
        }
        self.check_fs_tree();
        // Snapshots are not nested: a snapshot's own snapshot items are history.
        self.snapshots.clear();
        Box::pin(self.check_extents(opts)).await;
        self.extent_items.clear();
        self.img.sb.roots = live_roots;
        self.img.sb.inode_count = live_inodes;
        let snap_report = core::mem::replace(&mut self.report, live_report);
        self.overlaps = live_overlaps;
        let snap_used = core::mem::replace(&mut self.used, live_used);
        for (all, mine) in self.snap_used.iter_mut().zip(snap_used) {
            *all |= mine;
        }
        for e in snap_report.errors {
            self.error(format!("snapshot {id} ({name}): {e}"));
        }
        for w in snap_report.warnings {
            self.warn(format!("snapshot {id} ({name}): {w}"));
        }
        self.report.stats.snapshots += 1;
    }

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

    async fn check_superblocks(&mut self) {
        let sb = self.img.sb.clone();
        // What the mount refuses outright; the rest is still checked.
        match ninefs::volume::check_features(&sb) {
            Err(e) => self.error(format!("{e}: the mount refuses the filesystem")),
            Ok(true) => self.warn(format!(
                "unknown read-only compatible features {:#x}: the mount is read-only",
                sb.ro_compat & !ninefs::format::features::RO_COMPAT_SUPPORTED
            )),
            Ok(false) => {}
        }
        if let Some((field, value)) = sb.exhausted() {
            self.error(format!(
                "superblock {field} {value} is within 2^32 of its bound (2^62): no real \
                 filesystem gets there, and a writable mount refuses it"
            ));
        }
        for (i, valid) in self.img.sb_valid.into_iter().enumerate() {
            if !valid {
                let why = self.img.superblock_copy(i).await.err().unwrap_or_default();
                let msg = format!("superblock copy {i} is invalid ({why})");
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
        for (start, n) in l.bitmap_extents() {
            self.mark(start, n, "bitmap");
        }
        self.mark(l.log_start, l.log_blocks, "log region");
        self.report.metadata_blocks.push((1, 2));
        self.report.metadata_blocks.extend(l.bitmap_extents());
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
        // Each node once: a forged tree whose nodes point to one child many times
        // over would otherwise be walked exponentially often.
        let mut seen = BTreeSet::new();
        while let Some((level, ptr, lower, upper)) = stack.pop() {
            let at = format!(
                "{} tree node at block {} (level {level})",
                tree.name(),
                ptr.addr
            );
            if !ptr.is_valid(&self.img.sb.layout, self.img.sb.node_size) {
                self.error(format!(
                    "{at}: pointer to {} blocks outside the data area, or of another size",
                    ptr.blocks
                ));
                continue;
            }
            if !seen.insert(ptr.addr) {
                self.error(format!("{at}: referenced twice"));
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
                || start
                    .checked_add(len)
                    .is_none_or(|end| !self.img.sb.layout.is_data_area(start, end))
            {
                self.error(format!(
                    "data extent {start}+{len} is too long or outside the data area"
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
                let (w, bit) = ((b / 64) as usize, 1u64 << (b % 64));
                let live = self.used[w] & bit != 0;
                let held = self.snap_used[w] & bit != 0;
                if held && !live {
                    self.report.stats.snapshot_blocks += 1;
                }
                let used = live || held;
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
