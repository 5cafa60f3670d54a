//! The filesystem's in-memory state and the transaction discipline every operation
//! follows.
//!
//! An operation is a synchronous function on [`Core`] that first *reads* (which may stop
//! with [`Stop::Node`] or [`Stop::Group`] — the driver loads what is missing, with no
//! lock held, and runs the operation again from the start) and collects its changes in a
//! [`Txn`]. [`Core::commit`] makes sure every leaf the transaction touches is cached and
//! only then applies it, so an operation is applied whole or not at all.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::ops::Range;
use hashbrown::HashMap;

use crate::btree::Need;
use crate::btree::Trees;
use crate::core::track::LogTrack;
use crate::format::items::InodeItem;
use crate::format::key::kind;
use crate::format::superblock::{NodePtr, Superblock};
use crate::format::{Key, TreeId, BLOCK_SIZE};
use crate::space::{AllocNeed, Allocator};
use crate::util::check::Violation;
use vfs::{Attr, Errno, FileType, Ino};

use crate::core::counters::FsStats;

/// Why an operation stopped before finishing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// It failed with this errno (nothing was changed).
    Errno(Errno),
    /// A btree node must be read first.
    Node {
        /// Tree.
        tree: TreeId,
        /// Level.
        level: u8,
        /// Location.
        ptr: NodePtr,
    },
    /// A bitmap group must be read first.
    Group(u32),
    /// Not enough space; a checkpoint may free some.
    NoSpace,
    /// Metadata is inconsistent: EIO.
    Corrupt(&'static str),
}

impl From<Errno> for Stop {
    fn from(e: Errno) -> Stop {
        Stop::Errno(e)
    }
}

impl From<Need> for Stop {
    fn from(n: Need) -> Stop {
        match n {
            Need::Node { tree, level, ptr } => Stop::Node { tree, level, ptr },
            Need::Corrupt(what) => Stop::Corrupt(what),
        }
    }
}

impl From<AllocNeed> for Stop {
    fn from(n: AllocNeed) -> Stop {
        match n {
            AllocNeed::Group(g) => Stop::Group(g),
            AllocNeed::NoSpace => Stop::NoSpace,
        }
    }
}

/// Result of an operation step.
pub type Step<T> = Result<T, Stop>;

/// Per-inode in-memory state: open counts, and what the fsync log needs to decide how
/// much to log. Kept while an inode is open, or changed or logged since the committed
/// checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InodeState {
    /// Outstanding `open`s.
    pub open: u32,
    /// Checkpoint interval in which the inode last changed.
    pub last_trans: u64,
    /// Interval in which it was last logged (set by the fsync log).
    pub logged_trans: u64,
    /// Interval in which one of its extents last became shared (clone).
    pub last_reflink_trans: u64,
    /// Interval in which one of its names was last removed or renamed.
    pub last_unlink_trans: u64,
    /// Known to have no xattrs (cleared when one is set).
    pub no_xattrs: bool,
    /// What the log still has to carry for this inode.
    pub log: LogTrack,
}

/// A set of changes applied atomically by [`Core::commit`].
#[derive(Debug, Default)]
pub struct Txn {
    /// Puts (`Some`) and deletes (`None`), applied in order.
    ops: Vec<(TreeId, Key, Option<Vec<u8>>)>,
    /// The last op of each key (an index into `ops`), so reading back through a large
    /// transaction (log replay of an inode's 65,000 names) stays cheap.
    last_op: BTreeMap<(TreeId, Key), usize>,
    /// Blocks no longer referenced once this commits.
    pub frees: Vec<Range<u64>>,
    /// Reserved blocks that this transaction makes referenced.
    pub claims: Vec<Range<u64>>,
    /// Change in the number of inodes.
    pub inode_delta: i64,
    /// Inodes changed (for [`InodeState::last_trans`]).
    pub touched: Vec<Ino>,
    /// File blocks whose mapping changes: `(inode, blocks)` (for the log).
    pub extent_marks: Vec<(Ino, Range<u64>)>,
    /// Directory entries removed: `(directory, name hash, child)` (for the log).
    pub removals: Vec<(Ino, u64, Ino)>,
    /// Charged to projects without their limits checked ([`Txn::unlimited`]).
    pub unlimited: bool,
}

impl Txn {
    /// An empty transaction.
    pub fn new() -> Txn {
        Txn::default()
    }

    /// An empty transaction whose charges never fail on a quota limit: log replay (which
    /// restores what was charged before a crash) and labeling a new quota root's subtree.
    pub fn unlimited() -> Txn {
        Txn {
            unlimited: true,
            ..Txn::default()
        }
    }

    /// The inode items this transaction changes: `(ino, final value)`, `None` for a
    /// deleted one.
    pub fn inode_changes(&self) -> impl Iterator<Item = (Ino, Option<&[u8]>)> {
        self.last_op
            .iter()
            .filter(|((tree, key), _)| {
                *tree == TreeId::Fs && key.kind == kind::INODE && key.offset == 0
            })
            .map(|((_, key), &i)| (key.objectid, self.ops[i].2.as_deref()))
    }

    /// Puts `val` at `key`.
    pub fn put(&mut self, tree: TreeId, key: Key, val: Vec<u8>) {
        self.push(tree, key, Some(val));
    }

    /// Deletes `key`.
    pub fn del(&mut self, tree: TreeId, key: Key) {
        self.push(tree, key, None);
    }

    fn push(&mut self, tree: TreeId, key: Key, val: Option<Vec<u8>>) {
        self.last_op.insert((tree, key), self.ops.len());
        self.ops.push((tree, key, val));
    }

    /// The value this transaction last gave `key`: `None` if it does not change it,
    /// `Some(None)` if it deletes it.
    fn latest(&self, tree: TreeId, key: &Key) -> Option<&Option<Vec<u8>>> {
        self.last_op.get(&(tree, *key)).map(|&i| &self.ops[i].2)
    }

    /// Number of changes.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there are no changes.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.frees.is_empty() && self.claims.is_empty()
    }

    /// The value of `key` as this transaction would leave it.
    pub fn get(&self, c: &mut Core, tree: TreeId, key: &Key) -> Step<Option<Vec<u8>>> {
        if let Some(v) = self.latest(tree, key) {
            return Ok(v.clone());
        }
        Ok(c.trees.get(tree, key)?)
    }

    /// Entries with `from <= key <= to` as this transaction would leave them.
    pub fn range(
        &self,
        c: &mut Core,
        tree: TreeId,
        from: Key,
        to: Key,
    ) -> Step<Vec<(Key, Vec<u8>)>> {
        let mut out: BTreeMap<Key, Vec<u8>> = BTreeMap::new();
        c.trees.range(tree, from, to, |k, v| {
            out.insert(k, v.to_vec());
            true
        })?;
        if from <= to {
            for (&(_, k), &i) in self.last_op.range((tree, from)..=(tree, to)) {
                match &self.ops[i].2 {
                    Some(v) => out.insert(k, v.clone()),
                    None => out.remove(&k),
                };
            }
        }
        Ok(out.into_iter().collect())
    }

    /// The inode item of `ino` as this transaction would leave it.
    pub fn inode(&self, c: &mut Core, ino: Ino) -> Step<InodeItem> {
        match self.get(c, TreeId::Fs, &inode_key(ino))? {
            Some(b) => InodeItem::decode(&b).ok_or(Stop::Corrupt("undecodable inode item")),
            None => Err(Stop::Errno(Errno::ENOENT)),
        }
    }

    /// Writes `item` as `ino`'s inode.
    pub fn put_inode(&mut self, ino: Ino, item: &InodeItem) {
        self.put(TreeId::Fs, inode_key(ino), item.encode());
        self.touched.push(ino);
    }

    /// Records that the mapping of file blocks `blocks` of `ino` changes.
    pub fn mark_extents(&mut self, ino: Ino, blocks: Range<u64>) {
        self.extent_marks.push((ino, blocks));
    }
}

/// The key of `ino`'s inode item.
pub fn inode_key(ino: Ino) -> Key {
    Key::new(ino, kind::INODE, 0)
}

/// The mutable state of a mounted filesystem (behind one short-held lock).
pub struct Core {
    /// The superblock as last written (roots and counters are refreshed by checkpoints).
    pub sb: Superblock,
    /// The trees and their node cache.
    pub trees: Trees,
    /// Block allocation.
    pub space: Allocator,
    /// The checkpoint interval in progress: the next checkpoint commits `seq`.
    pub seq: u64,
    /// The last committed checkpoint.
    pub committed_seq: u64,
    /// Next inode number.
    pub next_ino: u64,
    /// Number of inodes.
    pub inode_count: u64,
    /// Per-inode state.
    pub inodes: HashMap<Ino, InodeState>,
    /// Something changed since the last checkpoint.
    pub changed: bool,
    /// A commit failed (a device error, or a broken invariant): everything fails with
    /// EIO from now on.
    pub failed: bool,
    /// The invariant whose check failed the filesystem, if one did ([`crate::core::checks`]).
    pub broken: Option<Violation>,
    /// Mounted read-only.
    pub read_only: bool,
    /// Most links an inode may have.
    pub max_links: u32,
    /// Counters.
    pub stats: FsStats,
    /// Snapshots that exist (their items are in the fs tree; the allocator holds what
    /// the newest references, see [`crate::features::snapshots`]).
    pub snapshots: u64,
}

impl core::fmt::Debug for Core {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Core")
            .field("seq", &self.seq)
            .field("trees", &self.trees)
            .field("space", &self.space)
            .finish()
    }
}

/// Commits between full invariant checks (every cached node, every tracked block);
/// the commits in between check what they touched ([`Core::check_invariants`]).
pub const FULL_CHECK_EVERY: u64 = 1024;

/// Largest [`Core::user_reserve`], in blocks (32 MiB).
const USER_RESERVE_MAX: u64 = 8192;

/// Blocks a btree node occupies.
pub fn node_blocks(sb: &Superblock) -> u64 {
    u64::from(sb.node_size) / BLOCK_SIZE as u64
}

impl Core {
    /// The state for a filesystem whose committed superblock is `sb`.
    pub fn new(sb: Superblock, read_only: bool, max_links: u32) -> Core {
        // A decoded superblock's sequence is below `MAX_SEQ`; a checkpoint at the
        // bound is refused (`checks::superblock`).
        let seq = sb.checkpoint_seq.saturating_add(1);
        Core {
            trees: Trees::new(sb.roots, sb.node_size, sb.secret, seq),
            space: Allocator::new(sb.layout, sb.node_size, sb.free_blocks),
            seq,
            committed_seq: sb.checkpoint_seq,
            next_ino: sb.next_ino,
            inode_count: sb.inode_count,
            inodes: HashMap::new(),
            changed: false,
            failed: false,
            broken: None,
            read_only,
            max_links,
            stats: FsStats::default(),
            snapshots: 0,
            sb,
        }
    }

    /// A production check failed ([`crate::core::checks`]): logs what failed, fails the
    /// filesystem as a failed device write does (every request from now on gets `EIO`)
    /// and stops the operation with `EIO`, before anything of its commit is written.
    pub fn fail(&mut self, v: Violation) -> Stop {
        log::error!(
            "invariant broken: {v}; nothing of this commit is written, filesystem is now failed"
        );
        self.failed = true;
        self.broken.get_or_insert(v);
        Stop::Errno(Errno::EIO)
    }

    /// [`Core::fail`]s on a failed check.
    pub fn check(&mut self, checked: Result<(), Violation>) -> Step<()> {
        checked.map_err(|v| self.fail(v))
    }

    /// [`Core::fail`]s if a change broke the allocator's books since this was last asked.
    pub fn check_space(&mut self) -> Step<()> {
        match self.space.take_violation() {
            Some(v) => Err(self.fail(v)),
            None => Ok(()),
        }
    }

    /// Fails with `EROFS` on a read-only mount.
    pub fn writable(&self) -> Step<()> {
        if self.read_only {
            Err(Stop::Errno(Errno::EROFS))
        } else {
            Ok(())
        }
    }

    /// The inode item of `ino`.
    pub fn inode(&mut self, ino: Ino) -> Step<InodeItem> {
        Txn::new().inode(self, ino)
    }

    /// Blocks kept free for metadata: enough for the next checkpoint to place every
    /// node it may write, plus slack for the operations before it.
    pub fn meta_reserve(&self) -> u64 {
        let nodes = self.trees.flush_bound() as u64 + 64;
        let pooled = self.space.pool_len() as u64;
        nodes.saturating_sub(pooled) * node_blocks(&self.sb)
    }

    /// Fails with `EMLINK` (and counts it) if an inode with `nlink` links may not get
    /// another.
    pub fn check_link_limit(&mut self, nlink: u32) -> Step<()> {
        if nlink >= self.max_links {
            self.stats.link_limit_hits += 1;
            return Err(Errno::EMLINK.into());
        }
        Ok(())
    }

    /// Blocks kept back from what users add (data written, inodes and xattrs created),
    /// on top of [`Core::meta_reserve`]: what deletes, renames, truncations and the
    /// checkpoints and log reclaim they cause may still use when users have filled the
    /// disk, so one tenant filling it never makes another's delete or fsync fail. 1/64
    /// of the data area, at least 4 nodes, at most 32 MiB.
    pub fn user_reserve(&self) -> u64 {
        let nb = node_blocks(&self.sb);
        (self.sb.layout.data_blocks() / 64).clamp(4 * nb, USER_RESERVE_MAX.max(4 * nb))
    }

    /// Blocks a data write must leave free: both reserves.
    pub fn data_keep(&self) -> u64 {
        self.meta_reserve() + self.user_reserve()
    }

    /// Fails with `NoSpace` unless metadata may grow by a few nodes: for changes that
    /// add nothing users keep (rename), which may use the user reserve.
    pub fn check_meta_space(&self) -> Step<()> {
        if self.space.available() < self.meta_reserve() + 4 * node_blocks(&self.sb) {
            return Err(Stop::NoSpace);
        }
        Ok(())
    }

    /// Fails with `NoSpace` unless metadata may grow by a few nodes and the user reserve
    /// stays free: for what adds inodes, names, xattrs or extents (create, link,
    /// setxattr, clone).
    pub fn check_user_space(&self) -> Step<()> {
        let need = self.data_keep() + 4 * node_blocks(&self.sb);
        if self.space.available() < need {
            return Err(Stop::NoSpace);
        }
        Ok(())
    }

    /// Applies `tx` atomically.
    pub fn commit(&mut self, mut tx: Txn) -> Step<()> {
        // Every check comes before the first change. The projects' usage follows the
        // inode items changed, in the same transaction (`quota.rs`); it may refuse.
        self.charge_quotas(&mut tx)?;
        // An item too large for a node can only
        // come from a pile of hash collisions in one directory or xattr bucket.
        if tx.ops.iter().any(|(_, _, v)| {
            v.as_ref()
                .is_some_and(|v| v.len() > crate::format::MAX_VALUE_LEN)
        }) {
            return Err(Stop::Errno(Errno::ENOSPC));
        }
        // The inode count cannot go below zero (or past `u64`): only a superblock that
        // understates the inodes the tree holds would take it there.
        let inode_count = self
            .inode_count
            .checked_add_signed(tx.inode_delta)
            .ok_or(Stop::Corrupt("inode count out of range"))?;
        // Make sure every leaf the transaction touches is cached, so that applying it
        // cannot stop half way.
        for (tree, key, _) in &tx.ops {
            self.trees.ensure(*tree, key)?;
        }
        // The keys changed, for the invariant checks after the commit.
        let touched: Vec<(TreeId, Key)> = if cfg!(debug_assertions) {
            tx.ops.iter().map(|(tree, key, _)| (*tree, *key)).collect()
        } else {
            Vec::new()
        };
        // What the log has to carry, from the keys changed.
        let marks: Vec<(Ino, u8, u64, bool)> = tx
            .ops
            .iter()
            .filter(|(tree, key, _)| *tree == TreeId::Fs && key.objectid != 0)
            .map(|(_, key, val)| (key.objectid, key.kind, key.offset, val.is_some()))
            .collect();
        for (tree, key, val) in tx.ops {
            let r = match val {
                Some(v) => self.trees.insert(tree, key, v),
                None => self.trees.remove(tree, &key).map(|_| ()),
            };
            if let Err(need) = r {
                // Unreachable by construction; never leave a half-applied change to be
                // checkpointed.
                self.failed = true;
                log::error!("transaction stopped half way ({need:?}); filesystem failed");
                return Err(Stop::Corrupt("transaction stopped half way"));
            }
        }
        for r in tx.claims {
            self.space.commit_reserved(r);
        }
        for r in tx.frees {
            self.space.free(r);
        }
        let nb = node_blocks(&self.sb);
        for a in core::mem::take(&mut self.trees.freed_nodes) {
            self.space.free(a..a + nb);
        }
        self.check_space()?;
        self.inode_count = inode_count;
        let (cur, committed) = (self.seq, self.committed_seq);
        for ino in tx.touched {
            self.inodes.entry(ino).or_default().last_trans = cur;
        }
        for (ino, k, offset, put) in marks {
            let track = &mut self.inodes.entry(ino).or_default().log;
            match k {
                kind::INODE => track.changes.mark(cur, committed).inode = true,
                kind::INODE_REF => track.changes.mark(cur, committed).names = true,
                kind::XATTR | kind::XATTR_CHUNK => {
                    track.changes.mark(cur, committed).xattrs = true;
                }
                kind::DIR_INDEX if put => {
                    let first = &mut track.entries.mark(cur, committed).first_index;
                    *first = Some(first.map_or(offset, |f| f.min(offset)));
                }
                _ => {}
            }
        }
        for (ino, blocks) in tx.extent_marks {
            let st = self.inodes.entry(ino).or_default();
            st.log.mark_extents(blocks, cur, committed);
        }
        for (dir, hash, child) in tx.removals {
            let st = self.inodes.entry(dir).or_default();
            st.log.removed.push(hash, child, cur, committed);
            let st = self.inodes.entry(child).or_default();
            st.log.lost.push(hash, dir, cur, committed);
        }
        self.changed = true;
        self.stats.commits += 1;
        debug_assert_eq!(
            self.check_invariants(&touched),
            Ok(()),
            "invariants after commit {}",
            self.stats.commits
        );
        Ok(())
    }

    /// The invariants every commit leaves true, asserted after each one in builds with
    /// debug assertions (tests, the crash suite): the tree paths of the keys it changed
    /// and the allocator's books; every [`FULL_CHECK_EVERY`] commits, every cached node
    /// of every tree and every block the allocator tracks.
    pub fn check_invariants(&self, touched: &[(TreeId, Key)]) -> Result<(), &'static str> {
        let full = self.stats.commits.is_multiple_of(FULL_CHECK_EVERY);
        if full {
            for tree in TreeId::ALL {
                self.trees.check(tree)?;
            }
        } else {
            for tree in TreeId::ALL {
                let keys = touched.iter().filter(|(t, _)| *t == tree).map(|(_, k)| k);
                self.trees.check_paths(tree, keys)?;
            }
        }
        self.space.check_invariants(full)
    }

    /// Attributes of `ino` from its inode item.
    pub fn attr(&self, ino: Ino, item: &InodeItem) -> Attr {
        let size = match item.file_type() {
            Some(FileType::Regular | FileType::Directory | FileType::Symlink) => item.size,
            _ => 0,
        };
        Attr {
            ino,
            generation: item.generation,
            mode: item.mode,
            nlink: item.nlink,
            uid: item.uid,
            gid: item.gid,
            rdev: item.rdev,
            size,
            blocks: item.bytes / 512,
            blksize: BLOCK_SIZE as u32,
            atime: item.atime,
            mtime: item.mtime,
            ctime: item.ctime,
            btime: item.btime,
        }
    }

    /// The in-memory state of `ino`.
    pub fn state(&mut self, ino: Ino) -> &mut InodeState {
        self.inodes.entry(ino).or_default()
    }

    /// Whether `ino` is open.
    pub fn is_open(&self, ino: Ino) -> bool {
        self.inodes.get(&ino).is_some_and(|s| s.open > 0)
    }

    /// Forgets per-inode state nobody needs any more (closed and unchanged since the
    /// last committed checkpoint).
    pub fn prune_inode_states(&mut self) {
        let committed = self.committed_seq;
        self.inodes
            .retain(|_, s| s.open > 0 || s.last_trans > committed || s.logged_trans > committed);
    }
}

/// The in-memory state of a filesystem on `dev` as its committed superblock `sb`
/// leaves it, before anything is read (its node cache counted in `dev`'s cache).
pub(crate) fn fresh_core<D: block::BlockDevice>(
    dev: &crate::io::Dev<D>,
    sb: Superblock,
    read_only: bool,
    max_links: u32,
) -> Core {
    let mut core = Core::new(sb, read_only, max_links);
    core.trees.cache.publish_to(dev.cache().node_gauge());
    core
}
