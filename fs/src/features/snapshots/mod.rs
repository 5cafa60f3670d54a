//! Snapshots: read-only, point-in-time copies of the whole filesystem (`format.md`,
//! "Snapshots").
//!
//! A snapshot is the roots of one committed checkpoint, kept as a `(0, SNAPSHOT, id)`
//! item in the fs tree. Copy-on-write does the rest: nothing a committed checkpoint
//! references is overwritten, and the allocator never frees a block a snapshot
//! references — the live filesystem's frees of such blocks only mark them dead. The
//! snapshots referencing a block are consecutive in time ([`Neighbours`]), so the
//! allocator need only hold what the newest references
//! ([`Allocator::hold_newest`](crate::space::Allocator::hold_newest), one walk of its
//! trees at create and at mount), and a delete need only compare the snapshot with its
//! two neighbours: no cost grows with the number of snapshots.

pub mod snapdir;

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use spin::Mutex;

use crate::core::checkpoint::{CheckpointCause, PressurePolicy};
use crate::core::counters::FsStats;
use crate::core::inode::MAX_SNAPSHOT_ID;
use crate::core::txn::{Core, Step, Stop, Txn};
use crate::engine::{Engine, EngineOptions};
use crate::format::items::{SnapshotItem, MAX_SNAPSHOT_NAME, SNAPSHOT_TREES};
use crate::format::key::kind;
use crate::format::superblock::{NodePtr, Root, Superblock, MAX_INO};
use crate::format::{features, Key, TreeId, BLOCK_SIZE, MAX_EXTENT_BLOCKS};
use crate::util::ranges::RangeSet;
use block::BlockDevice;
use vfs::{Errno, FsResult, Timespec};

/// Default of [`MountOptions::max_snapshots`](crate::volume::MountOptions::max_snapshots).
///
/// Nothing in memory grows with the number of snapshots, and mount, create and delete
/// read the trees of at most three of them (see [`Neighbours`]), so the limit only bounds
/// what a listing returns and the items a create or delete reads: a thousand cost little
/// (`fs/tests/snapshots.rs` mounts a thousand with less than twice the reads of one).
pub const MAX_SNAPSHOTS: usize = 1024;

/// Most snapshot views open at once; opening one more closes the least recently used
/// (it is opened again, with a cold cache, when next used). With each view's node cache
/// a [`VIEW_CACHE_SHARE`]th of the live one's, views never take more than twice the live
/// cache's memory, however many snapshots clients read.
pub const MAX_OPEN_VIEWS: usize = 8;

/// A snapshot view's node cache limit is the live filesystem's divided by this.
pub const VIEW_CACHE_SHARE: usize = 4;

/// The snapshot views open now ([`MAX_OPEN_VIEWS`] at most), by snapshot id.
pub(crate) struct OpenViews<D: BlockDevice> {
    /// Each view with the tick it was last used at.
    views: BTreeMap<u64, (Arc<Engine<D>>, u64)>,
    tick: u64,
}

impl<D: BlockDevice> Default for OpenViews<D> {
    fn default() -> Self {
        OpenViews {
            views: BTreeMap::new(),
            tick: 0,
        }
    }
}

impl<D: BlockDevice> OpenViews<D> {
    /// The view of snapshot `id`, if open (now its most recently used).
    pub(crate) fn get(&mut self, id: u64) -> Option<Arc<Engine<D>>> {
        self.tick += 1;
        let (view, used) = self.views.get_mut(&id)?;
        *used = self.tick;
        Some(view.clone())
    }

    /// Keeps `view` open as snapshot `id`'s, closing the least recently used view if
    /// [`MAX_OPEN_VIEWS`] are open (counted in `views_closed`).
    pub(crate) fn insert(&mut self, id: u64, view: Arc<Engine<D>>, stats: &mut FsStats) {
        if self.views.len() >= MAX_OPEN_VIEWS {
            let coldest = self.views.iter().min_by_key(|(_, (_, used))| *used);
            if let Some((&old, _)) = coldest {
                self.views.remove(&old);
                stats.snapshot_views_closed += 1;
            }
        }
        self.tick += 1;
        self.views.insert(id, (view, self.tick));
    }

    /// Closes snapshot `id`'s view (the snapshot is gone).
    pub(crate) fn remove(&mut self, id: u64) {
        self.views.remove(&id);
    }

    /// Closes every view.
    pub(crate) fn clear(&mut self) {
        self.views.clear();
    }
}

/// A snapshot, as [`NineFs::snapshots`](crate::volume::NineFs::snapshots) lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Its id (unique among existing snapshots; reused only after every other id was,
    /// [`next_id`]).
    pub id: u64,
    /// Its name.
    pub name: String,
    /// When it was taken.
    pub created: Timespec,
    /// The checkpoint whose state it keeps.
    pub seq: u64,
    /// Inodes it holds.
    pub inode_count: u64,
}

/// Whether `name` may name a snapshot: 1 to [`MAX_SNAPSHOT_NAME`] bytes of ASCII
/// letters, digits, `-`, `_` and `.`, not starting with `.` (so it is a safe file name
/// and 9P aname, and never `.` or `..`).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SNAPSHOT_NAME
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The id for a new snapshot, given the ids in use (ascending) and the largest an id may
/// be: the one after the highest in use, or once that passes `max`, the lowest free —
/// so an id is reused only after every other has been (a client's cached inode numbers
/// of a deleted snapshot, which carry its id, stay unambiguous as long as possible), and
/// snapshots can be rotated forever. `None`: every id is in use.
pub fn next_id(used: impl Iterator<Item = u64> + Clone, max: u64) -> Option<u64> {
    let after_highest = used.clone().last().map_or(1, |id| id + 1);
    if after_highest <= max {
        return Some(after_highest);
    }
    let mut want = 1;
    for id in used {
        if id > want {
            break;
        }
        want = id + 1;
    }
    (want <= max).then_some(want)
}

fn snapshot_key(id: u64) -> Key {
    Key::new(0, kind::SNAPSHOT, id)
}

/// Whether the snapshot items `items` (by id, ascending) of a filesystem whose last
/// checkpoint is `checkpoint_seq` can be served: ids that fit the snapshot inode space
/// (1 to [`MAX_SNAPSHOT_ID`]), valid names ([`valid_name`]), each used once, a
/// checkpoint no later than the filesystem's, an inode count of the live inode space.
/// The mount (whenever it reads them) and fsck check the same: `Err` names the first
/// item that fails, and why.
pub fn check_items(
    items: &[(u64, SnapshotItem)],
    checkpoint_seq: u64,
) -> Result<(), (u64, &'static str)> {
    let mut names = BTreeMap::new();
    for (id, item) in items {
        let what = if !(1..=MAX_SNAPSHOT_ID).contains(id) {
            "snapshot id out of range"
        } else if !core::str::from_utf8(&item.name).is_ok_and(valid_name) {
            "snapshot name invalid"
        } else if names.insert(&item.name, id).is_some() {
            "snapshot name used twice"
        } else if item.seq > checkpoint_seq {
            "snapshot of a later checkpoint than the filesystem's"
        } else if item.inode_count == 0 || item.inode_count >= MAX_INO {
            "snapshot inode count out of range"
        } else {
            continue;
        };
        return Err((*id, what));
    }
    Ok(())
}

/// The snapshot items of the fs tree, by id: checked ([`check_items`]), so a forged
/// item is corruption (`EIO`, counted) rather than served.
pub(crate) fn read_items(c: &mut Core) -> Step<Vec<(u64, SnapshotItem)>> {
    let items = Txn::new()
        .range(c, TreeId::Fs, snapshot_key(0), snapshot_key(u64::MAX))?
        .into_iter()
        .map(|(k, v)| {
            SnapshotItem::decode(&v)
                .map(|item| (k.offset, item))
                .ok_or(Stop::Corrupt("undecodable snapshot item"))
        })
        .collect::<Step<Vec<_>>>()?;
    check_items(&items, c.sb.checkpoint_seq).map_err(|(_, what)| Stop::Corrupt(what))?;
    Ok(items)
}

fn info(id: u64, item: &SnapshotItem) -> SnapshotInfo {
    SnapshotInfo {
        id,
        name: String::from_utf8_lossy(&item.name).into_owned(),
        created: item.created,
        seq: item.seq,
        inode_count: item.inode_count,
    }
}

/// The blocks the trees under `roots` reference on `dev`: every node, and every data
/// extent the extent tree lists. Reads each node once (a snapshot's create and delete
/// cost, and its share of the mount time).
pub async fn referenced_blocks<D: BlockDevice>(
    dev: &crate::io::Dev<D>,
    node_size: u32,
    roots: &[(TreeId, Root)],
) -> FsResult<RangeSet> {
    let node_blocks = u64::from(node_size) / BLOCK_SIZE as u64;
    let mut set = RangeSet::new();
    let mut stack: Vec<(TreeId, u8, NodePtr)> = roots
        .iter()
        .filter(|(_, r)| r.ptr.addr != 0)
        .map(|&(t, r)| (t, r.level, r.ptr))
        .collect();
    while let Some((tree, level, ptr)) = stack.pop() {
        let node = crate::io::node_read::read_checked(dev, node_size, tree, level, ptr).await?;
        // Read whole, so its blocks are on the device: no wrap.
        if !set.insert(ptr.addr..ptr.addr + node_blocks) {
            log::error!(
                "{} tree: node at {} referenced twice",
                tree.name(),
                ptr.addr
            );
            return Err(Errno::EIO);
        }
        for (k, v) in node.iter_from(&Key::MIN) {
            if level > 0 {
                let child = NodePtr::from_bytes(v).ok_or(Errno::EIO)?;
                stack.push((tree, level - 1, child));
            } else if tree == TreeId::Extent && k.kind == kind::EXTENT {
                let end = k.objectid.checked_add(k.offset);
                let long = k.offset > u64::from(MAX_EXTENT_BLOCKS);
                if long || !end.is_some_and(|end| set.insert(k.objectid..end)) {
                    log::error!(
                        "data extent {}+{} overlaps another, or is no extent",
                        k.objectid,
                        k.offset
                    );
                    return Err(Errno::EIO);
                }
            }
        }
    }
    Ok(set)
}

/// The roots a snapshot item or a superblock keeps, with their trees.
fn tree_roots(roots: impl Fn(TreeId) -> Root) -> Vec<(TreeId, Root)> {
    SNAPSHOT_TREES.iter().map(|&t| (t, roots(t))).collect()
}

/// The roots a snapshot item keeps, with their trees.
fn item_roots(roots: [Root; 3]) -> Vec<(TreeId, Root)> {
    SNAPSHOT_TREES.iter().copied().zip(roots).collect()
}

/// A snapshot and the snapshots taken just before and just after it.
///
/// Why these are all a delete needs: a block is referenced by the live filesystem from
/// the checkpoint that writes it to the one that frees it, and a held block is never
/// freed, so the snapshots referencing a block are consecutive in time, and so are
/// they with the live filesystem when it still references it. A block of this snapshot
/// that another snapshot or the live filesystem references is therefore referenced by
/// the one just before or the one just after (the live filesystem, for the newest).
#[derive(Clone, Copy, Debug)]
struct Neighbours<'a> {
    this: &'a (u64, SnapshotItem),
    older: Option<&'a (u64, SnapshotItem)>,
    newer: Option<&'a (u64, SnapshotItem)>,
}

impl<'a> Neighbours<'a> {
    /// The snapshot named `name` among `items`, with its neighbours in the order the
    /// checkpoints were taken (ids are reused, so they do not tell the order).
    fn of(items: &'a [(u64, SnapshotItem)], name: &str) -> Option<Neighbours<'a>> {
        let mut by_time: Vec<&(u64, SnapshotItem)> = items.iter().collect();
        by_time.sort_by_key(|(id, i)| (i.seq, *id));
        let at = by_time
            .iter()
            .position(|(_, i)| i.name == name.as_bytes())?;
        Some(Neighbours {
            this: by_time[at],
            older: at.checked_sub(1).map(|o| by_time[o]),
            newer: by_time.get(at + 1).copied(),
        })
    }
}

/// `a` without the blocks of `b`.
fn difference(a: &RangeSet, b: &RangeSet) -> RangeSet {
    let mut out = a.clone();
    for r in b.iter() {
        out.remove(r);
    }
    out
}

/// A snapshot view's clock: the time it was taken (a view changes nothing, so the clock
/// is only ever shown, never stored).
struct TakenAt(Timespec);

impl vfs::Clock for TakenAt {
    fn now(&self) -> Timespec {
        self.0
    }
}

/// Snapshots, the service: taking, deleting and listing snapshots, their read-only views
/// (each an [`Engine`] of its own over the same device), and the `.snapshots` directory
/// ([`snapdir`]).
pub(crate) struct Snapshots<D: BlockDevice> {
    pub(crate) engine: Arc<Engine<D>>,
    /// This is a snapshot's view: it has no `.snapshots` of its own (those of the
    /// snapshot's time may be gone).
    pub(crate) is_view: bool,
    /// Snapshot views open now, by snapshot id (see [`snapdir`]).
    pub(crate) views: Mutex<OpenViews<D>>,
    /// Most snapshots that may exist
    /// ([`MountOptions::max_snapshots`](crate::volume::MountOptions::max_snapshots)).
    pub(crate) max_snapshots: usize,
}

impl<D: BlockDevice> Snapshots<D> {
    pub(crate) fn new(engine: Arc<Engine<D>>, is_view: bool, max_snapshots: usize) -> Snapshots<D> {
        Snapshots {
            engine,
            is_view,
            views: Mutex::new(OpenViews::default()),
            max_snapshots,
        }
    }

    /// The snapshots, by id.
    pub async fn snapshots(&self) -> FsResult<Vec<SnapshotInfo>> {
        let items = self.engine.run(read_items).await?;
        Ok(items.iter().map(|(id, item)| info(*id, item)).collect())
    }

    /// With the checkpoint lock held: refuses a read-only filesystem (`EROFS`), commits
    /// a checkpoint (every live node placed and committed, so a walk of the live trees
    /// sees them and the committed roots stay put until the lock is released) and reads
    /// the snapshot items.
    async fn checkpointed_items(&self) -> FsResult<Vec<(u64, SnapshotItem)>> {
        if self.engine.core.lock().read_only {
            return Err(Errno::EROFS);
        }
        self.engine
            .checkpoint_locked(CheckpointCause::Snapshot)
            .await?;
        self.engine
            .run_loads(&mut read_items)
            .await?
            .map_err(|()| Errno::ENOSPC)
    }

    /// Takes a snapshot named `name` of the filesystem as it is now: commits a
    /// checkpoint, keeps its roots, and commits that with a second checkpoint (a crash
    /// before it leaves no snapshot). `EINVAL`: bad name; `EEXIST`: the name is taken;
    /// `ENOSPC`: at the snapshot limit or no room for the item; `EROFS`: read-only.
    pub async fn snapshot_create(&self, name: &str) -> FsResult<SnapshotInfo> {
        if !valid_name(name) {
            return Err(Errno::EINVAL);
        }
        let created = self.engine.now();
        let info = {
            let _guard = self.engine.checkpoint_lock.lock().await;
            let items = self.checkpointed_items().await?;
            if items.iter().any(|(_, i)| i.name == name.as_bytes()) {
                return Err(Errno::EEXIST);
            }
            let id = next_id(items.iter().map(|(id, _)| *id), MAX_SNAPSHOT_ID);
            let Some(id) = id.filter(|_| items.len() < self.max_snapshots) else {
                self.engine.core.lock().stats.snapshot_limit_hits += 1;
                return Err(Errno::ENOSPC);
            };
            // No checkpoint runs while we hold its lock: the committed roots stay put.
            let sb = self.engine.core.lock().sb.clone();
            let roots = tree_roots(|t| sb.root(t));
            let blocks = referenced_blocks(&self.engine.dev, sb.node_size, &roots).await?;
            let item = SnapshotItem {
                name: name.as_bytes().to_vec(),
                created,
                seq: sb.checkpoint_seq,
                inode_count: sb.inode_count,
                roots: [
                    sb.root(TreeId::Fs),
                    sb.root(TreeId::Extent),
                    sb.root(TreeId::Csum),
                ],
            };
            self.engine
                .run_loads(&mut |c: &mut Core| {
                    let mut tx = Txn::new();
                    tx.put(TreeId::Fs, snapshot_key(id), item.encode());
                    c.commit(tx)?;
                    // The new snapshot is the newest: the allocator holds what it references
                    // (frees pending since the checkpoint become dead, so none is cleared).
                    c.space.hold_newest(blocks.clone());
                    c.snapshots += 1;
                    c.sb.incompat |= features::INCOMPAT_SNAPSHOTS;
                    c.stats.snapshots_created += 1;
                    c.changed = true;
                    Ok(())
                })
                .await?
                .map_err(|()| Errno::ENOSPC)?;
            info(id, &item)
        };
        self.engine.checkpoint(CheckpointCause::Snapshot).await?;
        Ok(info)
    }

    /// Deletes the snapshot `name`: the blocks only it referenced, and that the live
    /// filesystem no longer references, are freed by the checkpoint that commits the
    /// deletion (a crash before leaves the snapshot whole). `ENOENT`: no such snapshot.
    ///
    /// Reads the trees of the snapshot and of its two neighbours in time (the live
    /// filesystem standing in for the newer one when it is the newest), whatever the
    /// number of snapshots: see [`Neighbours`].
    pub async fn snapshot_delete(&self, name: &str) -> FsResult<()> {
        {
            let _guard = self.engine.checkpoint_lock.lock().await;
            let items = self.checkpointed_items().await?;
            let Some(n) = Neighbours::of(&items, name) else {
                return Err(Errno::ENOENT);
            };
            let node_size = self.engine.core.lock().sb.node_size;
            let walk = |roots: Option<[Root; 3]>| async move {
                match roots {
                    Some(r) => referenced_blocks(&self.engine.dev, node_size, &item_roots(r)).await,
                    None => Ok(RangeSet::new()),
                }
            };
            let mine = walk(Some(n.this.1.roots)).await?;
            let older = walk(n.older.map(|(_, i)| i.roots)).await?;
            // The newer side: the next snapshot, or the committed live trees.
            let newer = match n.newer {
                Some((_, i)) => walk(Some(i.roots)).await?,
                None => {
                    let sb = self.engine.core.lock().sb.clone();
                    referenced_blocks(&self.engine.dev, node_size, &tree_roots(|t| sb.root(t)))
                        .await?
                }
            };
            let id = n.this.0;
            let newest = n.newer.is_none();
            let last = items.len() == 1;
            self.engine
                .run_loads(&mut |c: &mut Core| {
                    let mut tx = Txn::new();
                    tx.del(TreeId::Fs, snapshot_key(id));
                    c.commit(tx)?;
                    let mut freed = difference(&mine, &older);
                    if newest {
                        // Live at the walk but freed since: held, so only noted dead. Those
                        // are this snapshot's to free too.
                        freed = difference(&freed, &difference(&newer, c.space.held_dead()));
                        c.space.release(Some(older.clone()), &freed);
                    } else {
                        freed = difference(&freed, &newer);
                        c.space.release(None, &freed);
                    }
                    c.snapshots -= 1;
                    if last {
                        c.sb.incompat &= !features::INCOMPAT_SNAPSHOTS;
                    }
                    c.stats.snapshots_deleted += 1;
                    self.views.lock().remove(id);
                    c.changed = true;
                    Ok(())
                })
                .await?
                .map_err(|()| Errno::ENOSPC)?;
        }
        self.engine.checkpoint(CheckpointCause::Snapshot).await
    }

    /// At mount: counts the snapshots and holds every block the newest references (all
    /// the allocator needs, see the module documentation). One walk, however many
    /// snapshots there are.
    pub(crate) async fn load_snapshots(&self) -> FsResult<()> {
        // Without the feature bit there are none: no tree is read at mount (a damaged
        // node then fails only what reads it, and scrub can still name it).
        if self.engine.core.lock().sb.incompat & features::INCOMPAT_SNAPSHOTS == 0 {
            return Ok(());
        }
        let items = self.engine.run(read_items).await?;
        let node_size = self.engine.core.lock().sb.node_size;
        let newest = items.iter().max_by_key(|(id, i)| (i.seq, *id));
        let blocks = match newest {
            Some((_, item)) => {
                referenced_blocks(&self.engine.dev, node_size, &item_roots(item.roots)).await?
            }
            None => RangeSet::new(),
        };
        let mut c = self.engine.core.lock();
        c.space.hold_newest(blocks);
        c.snapshots = items.len() as u64;
        Ok(())
    }

    /// The snapshot `name` as a read-only filesystem: every read works as on the live
    /// filesystem at the snapshot's checkpoint, every change fails with `EROFS`. It
    /// shares this filesystem's device; its blocks stay valid while the snapshot exists
    /// (deleting a snapshot that is being read makes its readers fail with `EIO`).
    pub(crate) async fn snapshot_view(&self, name: &str) -> FsResult<Arc<Engine<D>>> {
        let items = self.engine.run(read_items).await?;
        let (id, item) = items
            .into_iter()
            .find(|(_, i)| i.name == name.as_bytes())
            .ok_or(Errno::ENOENT)?;
        Ok(self.view_of(id, &item))
    }

    /// The view of snapshot `id` (opened once, then shared).
    pub(crate) fn view_of(&self, id: u64, item: &SnapshotItem) -> Arc<Engine<D>> {
        if let Some(v) = self.views.lock().get(id) {
            return v;
        }
        let sb: Superblock = {
            let c = self.engine.core.lock();
            let mut sb = c.sb.clone();
            for (t, r) in SNAPSHOT_TREES.iter().zip(item.roots) {
                sb.roots[*t as usize] = r;
            }
            sb.checkpoint_seq = item.seq;
            sb.inode_count = item.inode_count;
            sb.free_blocks = c.space.free_after_checkpoint();
            sb
        };
        let opts = EngineOptions {
            cache_limit: self.engine.cache_limit / VIEW_CACHE_SHARE,
            max_groups: self.engine.max_groups,
            read_only: true,
            max_links: self.engine.core.lock().max_links,
            policy: alloc::boxed::Box::new(PressurePolicy),
            discard: None,
            hold_clock: self.engine.core.clock(),
            // It shares the device's data cache; the live filesystem reads ahead for it.
            readahead: 0,
        };
        let clock = alloc::boxed::Box::new(TakenAt(item.created));
        let view = Arc::new(Engine::assemble(self.engine.dev.clone(), sb, opts, clock));
        self.views
            .lock()
            .insert(id, view.clone(), &mut self.engine.core.lock().stats);
        view
    }
}

#[cfg(test)]
mod tests {
    use super::next_id;

    #[test]
    fn ids_grow_then_wrap_to_the_lowest_free() {
        assert_eq!(next_id([].into_iter(), 5), Some(1));
        assert_eq!(next_id([1, 2].into_iter(), 5), Some(3));
        // A rotation that keeps one snapshot: ids go up to the maximum, then start over.
        assert_eq!(next_id([5].into_iter(), 5), Some(1));
        assert_eq!(next_id([1, 5].into_iter(), 5), Some(2));
        assert_eq!(next_id([1, 2, 4, 5].into_iter(), 5), Some(3));
        assert_eq!(next_id([1, 2, 3, 4, 5].into_iter(), 5), None);
        // Rotating forever never runs out.
        let mut kept = 1;
        for _ in 0..22 {
            kept = next_id([kept].into_iter(), 5).unwrap();
        }
        assert_eq!(kept, 3, "22 steps round a cycle of five from 1");
    }
}
