//! The fs tree's checks: every item decodes and belongs to an inode; directory entries,
//! the directory index and the inodes' back-references agree; link counts, directory
//! sizes, orphans, symlinks and xattr chunks match; file extents do not overlap and
//! account for the inodes' bytes. The data extents they point into are counted for the
//! extent tree's reference counts ([`Checker::check_refs`]).

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::inspect::describe_item;
use crate::{Checker, MAX_LISTED};
use block::BlockDevice;
use ninefs::features::snapshots::check_items;
use ninefs::features::snapshots::snapdir::SNAPSHOTS_DIR;
use ninefs::format::items::{
    decode_dir_entries, decode_inode_refs, decode_xattrs, DirIndexRec, FileExtent, InodeItem,
    QuotaItem, SnapshotItem, XATTR_CHUNK_LEN,
};
use ninefs::format::key::kind;
use ninefs::format::{Key, TreeId, BLOCK_SIZE};
use ninefs::util::hash::{domain, keyed_hash, name_ref_hash};
use ninefs::volume::{check_name, MAX_FILE_SIZE};
use vfs::{FileType, ROOT_INO};

/// A directory entry as the checker compares them: `(dir, name) -> (ino, dirent type,
/// readdir index)`.
type Names = BTreeMap<(u64, Vec<u8>), (u64, u8, u64)>;

/// The fs tree's items, decoded and grouped for cross-checking.
#[derive(Default)]
struct FsTree {
    inodes: BTreeMap<u64, InodeItem>,
    /// From the hashed directory entries.
    by_name: Names,
    /// From the directory index.
    by_index: Names,
    /// Back-references: `(ino, parent, index, name)`.
    refs: BTreeSet<(u64, u64, u64, Vec<u8>)>,
    orphans: BTreeSet<u64>,
    /// Symlink target bytes, by inode.
    symlinks: BTreeMap<u64, u64>,
    /// `(ino, chunk key offset)` of every xattr chunk item.
    xattr_chunks: BTreeSet<(u64, u64)>,
    /// `(ino, xattr id, value length)` of every xattr stored in chunks.
    xattr_needs: Vec<(u64, u64, u32)>,
    /// `(file block, extent)` by inode, in key order.
    file_extents: BTreeMap<u64, Vec<(u64, FileExtent)>>,
    /// Quota items by project.
    quotas: BTreeMap<u64, QuotaItem>,
}

/// What the names say about each inode and directory.
#[derive(Default)]
struct NameCounts {
    /// Names of each inode.
    names: BTreeMap<u64, u32>,
    /// Subdirectories of each directory.
    subdirs: BTreeMap<u64, u32>,
    /// Entries of each directory.
    entries: BTreeMap<u64, u64>,
    /// Highest readdir index of each directory.
    max_index: BTreeMap<u64, u64>,
}

impl<D: BlockDevice> Checker<D> {
    /// Checks the fs tree's items (collected by the walk), then the extent tree's
    /// reference counts against the file extents.
    pub(crate) fn check_fs_tree(&mut self) {
        let items = core::mem::take(&mut self.fs_items);
        let mut t = FsTree::default();
        for (k, v) in &items {
            self.collect_item(&mut t, k, v);
        }
        self.check_inode_table(&items, &t.inodes);
        self.check_names(&t);
        let counts = self.count_names(&t);
        self.check_links(&t, &counts);
        self.check_tree_shape(&t);
        self.check_orphans(&t);
        self.check_xattr_chunks(&mut t);
        self.check_quotas(&t);
        let counted = self.check_file_extents(&t);
        self.check_refs(counted);
    }

    /// Decodes one item into `t`; reports what does not decode.
    fn collect_item(&mut self, t: &mut FsTree, k: &Key, v: &[u8]) {
        let bad = |what: &str| format!("{}: undecodable {what}", describe_item(TreeId::Fs, k, v));
        if k.objectid == 0 {
            if k.kind == kind::ORPHAN {
                t.orphans.insert(k.offset);
            } else if k.kind == kind::QUOTA {
                match QuotaItem::decode(v) {
                    Some(q) => {
                        t.quotas.insert(k.offset, q);
                    }
                    None => self.error(bad("quota item")),
                }
            } else if k.kind == kind::SNAPSHOT {
                match SnapshotItem::decode(v) {
                    Some(s) => {
                        self.snapshots.insert(k.offset, s);
                    }
                    None => self.error(bad("snapshot")),
                }
            } else {
                self.error(format!("unexpected item {k:?}"));
            }
            return;
        }
        match k.kind {
            kind::INODE => match InodeItem::decode(v) {
                Some(i) if k.offset == 0 => {
                    t.inodes.insert(k.objectid, i);
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
                        t.refs.insert((k.objectid, r.parent, r.index, r.name));
                    }
                }
                None => self.error(bad("inode ref")),
            },
            kind::DIR_ENTRY => match decode_dir_entries(v) {
                Some(list) => {
                    // A lookup finds a name in its hash's bucket only: one elsewhere is
                    // listed by readdir but never found (as for xattrs, below).
                    let secret = self.img.sb.secret;
                    for e in list
                        .iter()
                        .filter(|e| keyed_hash(secret, domain::DIR_NAME, &e.name) != k.offset)
                    {
                        self.error(format!(
                            "{}: name {:?} is in the wrong hash bucket",
                            describe_item(TreeId::Fs, k, v),
                            e.name.escape_ascii().to_string()
                        ));
                    }
                    for e in list {
                        t.by_name.insert(
                            (k.objectid, e.name),
                            (e.ino, e.file_type.dirent_type(), e.index),
                        );
                    }
                }
                None => self.error(bad("directory entry")),
            },
            kind::DIR_INDEX => match DirIndexRec::decode(v) {
                Some(e) => {
                    t.by_index.insert(
                        (k.objectid, e.name),
                        (e.ino, e.file_type.dirent_type(), k.offset),
                    );
                }
                None => self.error(bad("directory index")),
            },
            kind::SYMLINK => {
                *t.symlinks.entry(k.objectid).or_default() += v.len() as u64;
            }
            kind::XATTR => match decode_xattrs(v) {
                Some(list) => {
                    let secret = self.img.sb.secret;
                    for x in list
                        .iter()
                        .filter(|x| keyed_hash(secret, domain::XATTR_NAME, &x.name) != k.offset)
                    {
                        self.error(format!(
                            "{}: xattr {:?} is in the wrong hash bucket",
                            describe_item(TreeId::Fs, k, v),
                            x.name.escape_ascii().to_string()
                        ));
                    }
                    let chunked = list.into_iter().filter(|x| x.inline.is_none());
                    t.xattr_needs
                        .extend(chunked.map(|x| (k.objectid, x.id, x.value_len)));
                }
                None => self.error(bad("xattr")),
            },
            kind::XATTR_CHUNK => {
                t.xattr_chunks.insert((k.objectid, k.offset));
            }
            kind::EXTENT_DATA => match FileExtent::decode(v) {
                Some(e) if k.offset.is_multiple_of(BLOCK_SIZE as u64) => {
                    t.file_extents
                        .entry(k.objectid)
                        .or_default()
                        .push((k.offset / BLOCK_SIZE as u64, e));
                }
                _ => self.error(bad("file extent")),
            },
            _ => self.error(format!("unknown item {k:?}")),
        }
    }

    /// The snapshot items of the live fs tree: what the mount checks when it reads
    /// them (`features::snapshots::check_items`), and the feature bit that makes it read
    /// them (without it, a mount would free the blocks they hold).
    pub(crate) fn check_snapshot_items(&mut self) {
        let items: Vec<(u64, SnapshotItem)> = self
            .snapshots
            .iter()
            .map(|(id, item)| (*id, item.clone()))
            .collect();
        if let Err((id, what)) = check_items(&items, self.img.sb.checkpoint_seq) {
            self.error(format!("snapshot item {id}: {what}"));
        }
        let feature = ninefs::format::features::INCOMPAT_SNAPSHOTS;
        if !items.is_empty() && self.img.sb.incompat & feature == 0 {
            self.error(String::from(
                "snapshot items exist but the superblock lacks the SNAPSHOTS feature",
            ));
        }
    }

    /// Quotas: every project's usage is what its inodes add up to (one inode each, and
    /// their bytes), every charged inode's project has a quota item whose root is a
    /// directory of that project, and the feature bit is set if any exists. The usage
    /// is listed in the report.
    fn check_quotas(&mut self, t: &FsTree) {
        let mut usage: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for (&ino, i) in &t.inodes {
            if i.project == 0 {
                continue;
            }
            if !t.quotas.contains_key(&i.project) {
                self.error(format!(
                    "inode {ino} is charged to project {}, which has no quota item",
                    i.project
                ));
                continue;
            }
            let u = usage.entry(i.project).or_default();
            u.0 = u.0.saturating_add(i.bytes);
            u.1 += 1;
        }
        let feature = ninefs::format::features::RO_COMPAT_QUOTA;
        if !t.quotas.is_empty() && self.img.sb.ro_compat & feature == 0 {
            self.error(String::from(
                "quota items exist but the superblock lacks the QUOTA feature",
            ));
        }
        for (&project, q) in &t.quotas {
            let (bytes, inodes) = usage.get(&project).copied().unwrap_or_default();
            match t.inodes.get(&project) {
                Some(root) if root.is_dir() && root.project == project => {}
                Some(root) if root.is_dir() && q.flags & QuotaItem::LABELING != 0 => {}
                // A removed root's item stays while files linked elsewhere are charged.
                None if inodes > 0 => {}
                _ => self.error(format!(
                    "quota item of project {project}: its root is not a directory of the project"
                )),
            }
            if (q.bytes, q.inodes) != (bytes, inodes) {
                self.error(format!(
                    "project {project}: quota item records {} bytes and {} inodes, its inodes hold {bytes} bytes and {inodes} inodes",
                    q.bytes, q.inodes
                ));
            }
            if q.flags & QuotaItem::LABELING != 0 {
                self.warn(format!(
                    "project {project}: its subtree is not labeled yet (the next writable mount finishes it)"
                ));
            }
            self.report.quotas.push((project, *q));
        }
    }

    /// Every item belongs to an existing inode; the root is a directory; the
    /// superblock's inode count and next inode number agree with the tree.
    fn check_inode_table(
        &mut self,
        items: &BTreeMap<Key, Vec<u8>>,
        inodes: &BTreeMap<u64, InodeItem>,
    ) {
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
    }

    /// The hashed entries, the index and the back-references agree.
    fn check_names(&mut self, t: &FsTree) {
        if t.by_name != t.by_index {
            let a: BTreeSet<_> = t.by_name.iter().collect();
            let b: BTreeSet<_> = t.by_index.iter().collect();
            for x in a.symmetric_difference(&b).take(MAX_LISTED) {
                self.error(format!(
                    "directory entry and index disagree: dir {} name {:?} -> {:?}",
                    x.0 .0,
                    x.0 .1.escape_ascii().to_string(),
                    x.1
                ));
            }
        }
        let expected_refs: BTreeSet<(u64, u64, u64, Vec<u8>)> = t
            .by_name
            .iter()
            .map(|((dir, name), (ino, _, idx))| (*ino, *dir, *idx, name.clone()))
            .collect();
        for x in expected_refs.symmetric_difference(&t.refs).take(MAX_LISTED) {
            self.error(format!(
                "inode back-reference and directory entry disagree: inode {} in dir {} name {:?}",
                x.0,
                x.1,
                x.3.escape_ascii().to_string()
            ));
        }
    }

    /// Counts names, subdirectories and entries; every entry is a name an operation
    /// would take, and points to an inode of its type, inside a directory.
    fn count_names(&mut self, t: &FsTree) -> NameCounts {
        let mut c = NameCounts::default();
        for ((dir, name), (ino, ft, idx)) in &t.by_name {
            if check_name(name).is_err() || *dir == ROOT_INO && name[..] == *SNAPSHOTS_DIR {
                self.error(format!(
                    "entry {:?} in dir {dir}: a name the filesystem never makes",
                    name.escape_ascii().to_string()
                ));
            }
            *c.names.entry(*ino).or_default() += 1;
            *c.entries.entry(*dir).or_default() += 1;
            let m = c.max_index.entry(*dir).or_default();
            *m = (*m).max(*idx);
            let shown = name.escape_ascii().to_string();
            match t.inodes.get(ino) {
                None => self.error(format!(
                    "entry {shown:?} in dir {dir} points to missing inode {ino}"
                )),
                Some(i) => {
                    if i.file_type().map(FileType::dirent_type) != Some(*ft) {
                        self.error(format!(
                            "entry {shown:?} in dir {dir} has the wrong type for inode {ino}"
                        ));
                    }
                    if i.is_dir() {
                        *c.subdirs.entry(*dir).or_default() += 1;
                    }
                }
            }
            match t.inodes.get(dir) {
                Some(d) if d.is_dir() => {}
                _ => self.error(format!(
                    "entry {shown:?} in {dir}, which is not a directory"
                )),
            }
        }
        c
    }

    /// Link counts, directory sizes and indexes, unlinked inodes' orphan items, symlink
    /// sizes.
    fn check_links(&mut self, t: &FsTree, c: &NameCounts) {
        for (ino, item) in &t.inodes {
            if item.size > MAX_FILE_SIZE {
                self.error(format!(
                    "inode {ino}: size {} is larger than the largest file ({MAX_FILE_SIZE})",
                    item.size
                ));
            }
            let n = c.names.get(ino).copied().unwrap_or(0);
            if item.is_dir() {
                self.check_directory(*ino, item, n, c);
            } else if item.nlink != n {
                self.error(format!("inode {ino}: nlink {} but {n} names", item.nlink));
            }
            if item.nlink == 0 && !t.orphans.contains(ino) {
                self.error(format!("inode {ino} has no links and no orphan item"));
            }
            if item.file_type() == Some(FileType::Symlink)
                && t.symlinks.get(ino).copied().unwrap_or(0) != item.size
            {
                self.error(format!(
                    "symlink {ino}: target length differs from size {}",
                    item.size
                ));
            }
        }
    }

    /// A directory of `names` names: its link count, size and next index.
    fn check_directory(&mut self, ino: u64, item: &InodeItem, names: u32, c: &NameCounts) {
        self.report.stats.dirs += 1;
        let subdirs = c.subdirs.get(&ino).copied().unwrap_or(0);
        let expect = if item.nlink == 0 { 0 } else { 2 + subdirs };
        if item.nlink != expect || (names != 1 && ino != ROOT_INO && item.nlink != 0) {
            self.error(format!(
                "directory {ino}: nlink {} but {names} names and {subdirs} subdirectories",
                item.nlink
            ));
        }
        let entries = c.entries.get(&ino).copied().unwrap_or(0);
        if item.size != entries {
            self.error(format!(
                "directory {ino}: size {} but {entries} entries",
                item.size
            ));
        }
        if c.max_index.get(&ino).is_some_and(|&m| m >= item.next_seq) {
            self.error(format!(
                "directory {ino}: entry index not below next_seq {}",
                item.next_seq
            ));
        }
    }

    /// The directories form one tree under the root: no entry names the root, and every
    /// linked directory reaches the root through its parents (its one name each), so
    /// no path loops (`dir/loop/loop/...`).
    fn check_tree_shape(&mut self, t: &FsTree) {
        let is_dir = |ino: &u64| t.inodes.get(ino).is_some_and(InodeItem::is_dir);
        let mut parent: BTreeMap<u64, u64> = BTreeMap::new();
        for ((dir, name), (ino, _, _)) in &t.by_name {
            if *ino == ROOT_INO {
                self.error(format!(
                    "entry {:?} in dir {dir} names the root",
                    name.escape_ascii().to_string()
                ));
            } else if is_dir(ino) {
                parent.insert(*ino, *dir);
            }
        }
        // Directories known to reach the root, or not to: each walk up stops at one of
        // them, so every directory is walked over once.
        let mut reached = BTreeSet::from([ROOT_INO]);
        let mut stranded = BTreeSet::new();
        for (&ino, item) in &t.inodes {
            if !item.is_dir() || item.nlink == 0 || reached.contains(&ino) {
                continue;
            }
            let mut path = BTreeSet::new();
            let mut at = ino;
            let ok = loop {
                if reached.contains(&at) {
                    break true;
                }
                if stranded.contains(&at) || !path.insert(at) {
                    break false;
                }
                match parent.get(&at) {
                    Some(&p) => at = p,
                    None => break false,
                }
            };
            if ok {
                reached.extend(path);
            } else {
                if stranded.len() < MAX_LISTED {
                    self.error(format!(
                        "directory {ino} does not reach the root (its parents loop or end)"
                    ));
                }
                stranded.extend(path);
            }
        }
    }

    /// Orphan items name existing, unlinked inodes (the filesystem removes an inode and
    /// its orphan item in one transaction).
    fn check_orphans(&mut self, t: &FsTree) {
        for ino in &t.orphans {
            match t.inodes.get(ino) {
                Some(i) if i.nlink == 0 => {}
                Some(_) => self.error(format!("orphan item for linked inode {ino}")),
                // An inode and its orphan item go in one transaction: never left so.
                None => self.error(format!("orphan item for missing inode {ino}")),
            }
        }
    }

    /// Every chunked xattr has all its chunks, and every chunk an xattr.
    fn check_xattr_chunks(&mut self, t: &mut FsTree) {
        for &(ino, id, len) in &t.xattr_needs {
            for chunk in 0..(len as usize).div_ceil(XATTR_CHUNK_LEN) {
                if !t.xattr_chunks.remove(&(ino, (id << 8) | chunk as u64)) {
                    self.error(format!("inode {ino}: xattr {id} is missing chunk {chunk}"));
                }
            }
        }
        for &(ino, off) in t.xattr_chunks.iter().take(MAX_LISTED) {
            self.error(format!(
                "inode {ino}: xattr chunk {off:#x} belongs to no xattr"
            ));
        }
    }

    /// File extents: regular files only, no overlaps, the inode's bytes. Returns the
    /// number of file extents pointing into each data extent `(disk block, blocks)`.
    fn check_file_extents(&mut self, t: &FsTree) -> BTreeMap<(u64, u32), u32> {
        let mut counted: BTreeMap<(u64, u32), u32> = BTreeMap::new();
        for (&ino, list) in &t.file_extents {
            let item = t.inodes.get(&ino);
            if item.is_some_and(|i| i.file_type() != Some(FileType::Regular)) {
                self.error(format!(
                    "inode {ino} has file extents but is not a regular file"
                ));
            }
            let mut end = 0;
            let mut blocks = 0u64;
            for (fb, e) in list {
                if *fb < end {
                    self.error(format!("inode {ino}: file extents overlap at block {fb}"));
                }
                // A key's file block is at most 2^52: no wrap below.
                end = fb + u64::from(e.num_blocks);
                blocks += u64::from(e.num_blocks);
                let refs = counted.entry((e.disk_block, e.disk_blocks)).or_default();
                *refs = refs.saturating_add(1);
            }
            if let Some(i) = item {
                let size_blocks = i.size.div_ceil(BLOCK_SIZE as u64);
                if end > size_blocks {
                    self.warn(format!(
                        "inode {ino}: extents past the end of file (an interrupted truncation)"
                    ));
                }
                if u128::from(i.bytes) != u128::from(blocks) * BLOCK_SIZE as u128 {
                    self.error(format!(
                        "inode {ino}: records {} bytes of extents, has {}",
                        i.bytes,
                        blocks * BLOCK_SIZE as u64
                    ));
                }
            }
        }
        counted
    }
}
