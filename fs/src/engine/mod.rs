//! The engine: the state and the operations every feature needs — the device, the core
//! lock, the fsync log, the checkpoint and commit locks, the per-inode locks, the write
//! policy and discard, readahead — in one type, [`Engine`], below the features (which
//! hold it) and above the layers it drives (`core`, `synclog`, `io`).
//!
//! Why the engine's module holds the operations over those parts (the data path, the
//! readahead workers' reads, fsync through the log, replay at mount) rather than the
//! layers below: each of them needs several parts at once (the core lock, the log, the
//! device, the inode locks, the checkpoint run when space or the log runs short), so
//! written in `core` or `synclog` they would have to import the type holding them, a
//! higher layer. Here they are `impl Engine` blocks over those parts, and `core` and
//! `synclog` keep what they own (the transaction core's steps, building and scanning the
//! log, the replay rules) and import nothing above them.
//!
//! Lock order: per-inode async mutexes (ascending inode numbers), then the checkpoint
//! lock; the log's commit lock is taken with neither. Of the spin locks, `core` comes
//! before `log` and `discard`; every other one is taken alone. The core lock counts its
//! use ([`FsStats::core_lock`]: takes, contended takes, and with a hold clock the time
//! held; `core/lock.rs`).

pub mod checkpoint;
pub mod file;
pub mod fsync;
pub mod legs;
pub mod mount;
pub mod readahead;
pub mod replay;

use ::core::time::Duration;
use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec;
use hashbrown::HashMap;
use spin::Mutex;

use crate::btree::cache::is_temp_addr;
use crate::btree::{Node, NodeCache};
use crate::core::checkpoint::{CheckpointCause, WritePolicy};
use crate::core::counters::FsStats;
use crate::core::file::TrimmedInodes;
use crate::core::lock::CoreLock;
use crate::core::txn::{fresh_core, Core, InodeState, Step, Stop};
use crate::format::bset::NodeId;
use crate::format::superblock::{NodePtr, Superblock};
use crate::format::{Key, TreeId, BLOCK_SIZE};
use crate::io::node_read::{self, NodeReadError};
use crate::io::Dev;
use crate::synclog::LogState;
use block::BlockDevice;
use vfs::{Clock, Errno, FsResult, Ino};

pub use mount::{choose_group, MountError};

/// Retries of one operation before giving up (each retry loads something).
pub(crate) const MAX_RETRIES: usize = 10_000;

/// What an engine keeps of the mount options (`volume::MountOptions`).
pub(crate) struct EngineOptions {
    pub cache_limit: usize,
    pub max_groups: usize,
    /// Mounted read-only (asked for, or forced).
    pub read_only: bool,
    pub max_links: u32,
    pub policy: Box<dyn WritePolicy>,
    pub discard: Option<Duration>,
    pub hold_clock: Option<fn() -> u64>,
    pub readahead: u64,
}

/// The state every feature works on: the device, the core behind its lock, the fsync
/// log, the locks that order checkpoints, commits and data changes, and the write
/// policy. A mounted filesystem has one, and so has each snapshot view.
pub struct Engine<D: BlockDevice> {
    /// Shared with the snapshot views.
    pub(crate) dev: Arc<Dev<D>>,
    pub(crate) core: CoreLock,
    /// The fsync log's ring and batches (taken after `core` when both are needed).
    pub(crate) log: Mutex<LogState>,
    pub(crate) checkpoint_lock: async_lock::Mutex<()>,
    /// Held by the log committer across one commit's I/O.
    pub(crate) commit_lock: async_lock::Mutex<()>,
    pub(crate) inode_locks: Mutex<HashMap<Ino, Arc<async_lock::Mutex<()>>>>,
    /// Inodes known to hold nothing past their end of file (see [`TrimmedInodes`]).
    pub(crate) trimmed: Mutex<TrimmedInodes>,
    pub(crate) clock: Box<dyn Clock + Send + Sync>,
    pub(crate) cache_limit: usize,
    pub(crate) max_groups: usize,
    pub(crate) policy: Box<dyn WritePolicy>,
    /// The mount's discard delay, until the device says it cannot discard.
    pub(crate) discard: Mutex<Option<Duration>>,
    /// When (wall-clock seconds) freed blocks were first seen waiting for a checkpoint.
    pub(crate) freed_since: Mutex<Option<i64>>,
    /// Readahead asked for by readers, for the readahead workers ([`readahead`]).
    pub(crate) readahead: crate::cache::ReadaheadQueue,
    /// The largest readahead window (0: no readahead).
    pub(crate) readahead_max: u64,
}

impl<D: BlockDevice> ::core::fmt::Debug for Engine<D> {
    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
        f.debug_struct("Engine")
            .field("core", &*self.core.lock())
            .finish()
    }
}

impl<D: BlockDevice> Engine<D> {
    /// Builds the engine of a mount or of a snapshot view: `sb` is what it starts from
    /// (its log where `sb` says); every lock, cache and counter starts empty.
    pub(crate) fn assemble(
        dev: Arc<Dev<D>>,
        sb: Superblock,
        opts: EngineOptions,
        clock: Box<dyn Clock + Send + Sync>,
    ) -> Engine<D> {
        let layout = sb.layout;
        let log = LogState::new(
            layout.log_start,
            layout.log_blocks,
            sb.log_epoch,
            sb.log_tail,
        );
        let core = fresh_core(&dev, sb, opts.read_only, opts.max_links);
        Engine {
            dev,
            core: CoreLock::new(core, opts.hold_clock),
            log: Mutex::new(log),
            checkpoint_lock: async_lock::Mutex::new(()),
            commit_lock: async_lock::Mutex::new(()),
            inode_locks: Mutex::new(HashMap::new()),
            trimmed: Mutex::new(TrimmedInodes::default()),
            clock,
            cache_limit: opts.cache_limit,
            max_groups: opts.max_groups.max(4),
            policy: opts.policy,
            discard: Mutex::new(opts.discard),
            freed_since: Mutex::new(None),
            readahead: crate::cache::ReadaheadQueue::new(),
            readahead_max: opts.readahead,
        }
    }

    /// The block device.
    pub fn device(&self) -> &D {
        self.dev.inner()
    }

    /// The data cache over the device (shared with the snapshot views).
    pub fn data_cache(&self) -> &crate::cache::DataCache {
        self.dev.cache()
    }

    /// Counters.
    pub fn stats(&self) -> FsStats {
        let mut s = {
            let c = self.core.lock();
            let mut s = c.stats;
            s.group_loads = c.space.stats.group_loads;
            s.snapshots = c.snapshots;
            s.snapshot_held_blocks = c.space.held_dead().len();
            s.failed = u64::from(c.failed);
            s
        };
        if self.dev.copies() > 1 {
            s.legs = self.dev.copies() as u64;
            s.failed_legs = u64::from(self.dev.failed_copies().count_ones());
        }
        s.log = self.log.lock().stats;
        s
    }

    /// Log blocks in use and the log region's size.
    pub fn log_usage(&self) -> (u64, u64) {
        let l = self.log.lock();
        (l.used(), l.capacity)
    }

    /// Memory used by cached btree nodes, and the number of cached nodes.
    pub fn cache_usage(&self) -> (usize, usize) {
        let c = self.core.lock();
        (c.trees.cache.mem(), c.trees.cache.len())
    }

    /// The per-inode in-memory state (for the fsync log and tests).
    pub fn inode_state(&self, ino: Ino) -> Option<InodeState> {
        self.core.lock().inodes.get(&ino).cloned()
    }

    /// The superblock as last written.
    pub fn superblock(&self) -> Superblock {
        self.core.lock().sb.clone()
    }

    /// Now, by the clock the filesystem was mounted with (its timestamps').
    pub fn now(&self) -> vfs::Timespec {
        self.clock.now()
    }

    /// Runs `f` until it no longer needs anything loaded; when it runs out of space and
    /// a checkpoint would release freed blocks, checkpoints and tries once more.
    pub(crate) async fn run<T>(&self, mut f: impl FnMut(&mut Core) -> Step<T>) -> FsResult<T> {
        match self.run_loads(&mut f).await? {
            Ok(v) => Ok(v),
            Err(()) => {
                if self.core.lock().space.reclaimable() == 0 {
                    return Err(Errno::ENOSPC);
                }
                self.checkpoint(CheckpointCause::Space).await?;
                self.run_loads(&mut f).await?.map_err(|()| Errno::ENOSPC)
            }
        }
    }

    /// Runs `f`, loading what it needs, until it finishes; `Ok(Err(()))` if it ran out of
    /// space.
    pub(crate) async fn run_loads<T>(
        &self,
        f: &mut impl FnMut(&mut Core) -> Step<T>,
    ) -> FsResult<Result<T, ()>> {
        let r = self.settle(f).await;
        // The node cache may have grown into memory the data cache borrowed.
        self.dev.cache().trim();
        r
    }

    /// [`Engine::run_loads`]' loop: runs `f` and loads what it stops for.
    async fn settle<T>(&self, f: &mut impl FnMut(&mut Core) -> Step<T>) -> FsResult<Result<T, ()>> {
        let mut failed_load: Option<NodePtr> = None;
        for _ in 0..MAX_RETRIES {
            let r = {
                let mut c = self.core.lock();
                if c.failed {
                    return Err(Errno::EIO);
                }
                let r = f(&mut c);
                // Whatever broke the allocator's books (an operation, or something done
                // since under the lock) fails the filesystem before its next commit.
                c.check_space().and(r)
            };
            match r {
                Ok(v) => return Ok(Ok(v)),
                Err(Stop::Errno(e)) => return Err(e),
                Err(Stop::NoSpace) => return Ok(Err(())),
                Err(Stop::Corrupt(what)) => {
                    log::error!("filesystem metadata inconsistent: {what}");
                    self.core.lock().stats.corruptions += 1;
                    return Err(Errno::EIO);
                }
                Err(Stop::Node { tree, level, ptr }) => {
                    let last_try = failed_load == Some(ptr);
                    match self.load_node(tree, level, ptr, last_try).await {
                        Ok(()) => {}
                        // The pointer may have gone stale while we read (the node moved
                        // and its old place was reused): look again before failing.
                        Err(Errno::EAGAIN) if !last_try => failed_load = Some(ptr),
                        Err(Errno::EAGAIN) => return Err(Errno::EIO),
                        Err(e) => return Err(e),
                    }
                }
                Err(Stop::Group(g)) => self.load_group(g).await?,
            }
        }
        log::error!("operation did not settle after {MAX_RETRIES} retries");
        Err(Errno::EIO)
    }

    /// Reads a node into the cache. A corrupt node gives `EAGAIN` the first time (the
    /// caller looks again) and EIO with a log line when `last_try`.
    pub(crate) async fn load_node(
        &self,
        tree: TreeId,
        level: u8,
        ptr: NodePtr,
        last_try: bool,
    ) -> FsResult<()> {
        // The latest checkpoint written (committed or being written) wrote the newest
        // bset any node may hold.
        let (valid, last_seq) = {
            let c = self.core.lock();
            (
                ptr.is_valid(&c.sb.layout, c.sb.node_size),
                c.seq.saturating_sub(1),
            )
        };
        if is_temp_addr(ptr.addr) || !valid {
            log::error!("{} tree: invalid node pointer {ptr:?}", tree.name());
            return Err(Errno::EIO);
        }
        let id = NodeId {
            tree,
            level,
            nonce: ptr.nonce,
        };
        match node_read::read_node(&self.dev, id, ptr, last_seq).await {
            Ok(node) => {
                let mut c = self.core.lock();
                c.stats.node_loads += 1;
                c.stats.node_load_bytes += u64::from(ptr.blocks) * BLOCK_SIZE as u64;
                let committed = c.committed_seq;
                c.trees.cache.insert_loaded(node, committed);
                Ok(())
            }
            Err(NodeReadError::Io(e)) => {
                log::error!(
                    "{} tree: reading node at block {}: {e}",
                    tree.name(),
                    ptr.addr
                );
                Err(Errno::EIO)
            }
            // The pointer may have been read while its node was being replaced: the
            // caller looks again before calling it corrupt.
            Err(NodeReadError::Corrupt(_)) if !last_try => Err(Errno::EAGAIN),
            Err(NodeReadError::Corrupt(corrupt)) => {
                log::error!(
                    "{} tree: corrupt node at block {} (bset at block {}): {}",
                    tree.name(),
                    ptr.addr,
                    ptr.addr + u64::from(corrupt.offset_blocks),
                    corrupt.what
                );
                self.core.lock().stats.corruptions += 1;
                Err(Errno::EIO)
            }
        }
    }

    pub(crate) async fn load_group(&self, g: u32) -> FsResult<()> {
        let (block, committed) = {
            let c = self.core.lock();
            if c.space.has_group(g) {
                return Ok(());
            }
            (c.sb.layout.bitmap_block(g, 0), c.committed_seq)
        };
        let mut buf = vec![0u8; 2 * BLOCK_SIZE];
        let good = |b: &[u8]| choose_group(b, g, committed, true).is_ok();
        if let Err(e) = self.dev.read_verified(block, &mut buf, good).await {
            log::error!("reading bitmap group {g} at block {block}: {e}");
            return Err(Errno::EIO);
        }
        match choose_group(&buf, g, committed, true) {
            Ok((grp, slot)) => {
                self.core.lock().space.insert_group(grp, slot);
                Ok(())
            }
            Err(what) => {
                log::error!("bitmap group {g} at block {block}: {what}");
                self.core.lock().stats.corruptions += 1;
                Err(Errno::EIO)
            }
        }
    }

    pub(crate) fn evict(&self, c: &mut Core) {
        if c.trees.cache.mem() > self.cache_limit {
            let committed = c.committed_seq;
            let n = c.trees.cache.evict(self.cache_limit * 3 / 4, |n, cache| {
                evictable(n, cache, committed)
            });
            c.stats.evictions += n as u64;
        }
        let committed = c.committed_seq;
        c.space.evict(self.max_groups, committed);
    }

    /// The async mutex serialising data changes of `ino`.
    pub(crate) fn inode_lock(&self, ino: Ino) -> Arc<async_lock::Mutex<()>> {
        let mut locks = self.inode_locks.lock();
        if locks.len() > 1024 {
            locks.retain(|_, l| Arc::strong_count(l) > 1);
        }
        locks
            .entry(ino)
            .or_insert_with(|| Arc::new(async_lock::Mutex::new(())))
            .clone()
    }
}

/// Whether a cached node may be dropped: it is clean, its last write is committed, and
/// (for interior nodes) none of its children are cached, so every cached node's
/// ancestors stay cached.
pub(crate) fn evictable(n: &Node, cache: &NodeCache, committed: u64) -> bool {
    if n.is_dirty() || is_temp_addr(n.addr) || n.written_seq > committed {
        return false;
    }
    n.is_leaf()
        || n.iter_from(&Key::MIN)
            .all(|(_, v)| NodePtr::from_bytes(v).is_none_or(|p| !cache.contains(&p)))
}
