//! A mounted ninefold filesystem: [`NineFs`], which implements
//! [`FileSystem`](vfs::FileSystem).
//!
//! Concurrency: one handle serves every CPU — `NineFs<D>` is `Send + Sync` when `D` is
//! (checked below); the futures of its operations are not `Send` (a request runs to
//! completion on the CPU that issued it). All metadata lives in [`Core`] behind one lock
//! that is only ever held by synchronous code — never across an `await`, never for I/O.
//! Operations run as retry loops: try the operation on the cached state; if it needs a
//! node or bitmap group that is not cached, release the lock, read it, and try again (see
//! [`core`]). File data is read and written with no lock held; writers of one inode's
//! data are serialised by a per-inode async mutex, which readers and other inodes never
//! wait for.
//!
//! Lock order: per-inode async mutexes (ascending inode numbers), then the checkpoint
//! lock; the log's commit lock is taken with neither. Of the spin locks, `core` comes
//! before `log` and `discard`; every other one is taken alone. The core lock counts its
//! use ([`FsStats::core_lock`]: takes, contended takes, and with
//! [`MountOptions::hold_clock`] the time held; `core/lock.rs`).

use ::core::ops::Range;
use ::core::time::Duration;
use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use hashbrown::HashMap;
use spin::Mutex;

use crate::btree::cache::is_temp_addr;
use crate::btree::{Node, NodeCache};
use crate::format::bitmap::GroupBlock;
use crate::format::bset::NodeId;
use crate::format::layout::SUPERBLOCK_BLOCKS;
use crate::format::superblock::{next_seq, state, NodePtr, Superblock};
use crate::format::{features, Corrupt, Key, TreeId, BLOCK_SIZE};
use crate::io::{Dev, DevError};
use crate::util::check::ensure;
use block::{BlockDevice, WriteFlags};
use vfs::{Clock, Errno, FsResult, Ino};

use crate::core::counters as stats;
use crate::core::{checkpoint, checks, dir, file, mkfs, readahead};
use crate::features::grow;
use crate::features::redundancy::{legs, rebuild, scrub};
use crate::features::snapshots as snapshot;
use crate::features::streams::jobs as streamjob;
use crate::io::node_read;
use crate::synclog;

pub use crate::core::txn::InodeState;
pub use checkpoint::{
    CheckpointCause, DirtyThresholdPolicy, Pressure, PressurePolicy, WritePolicy,
};
pub use dir::check_name;
pub use grow::Growth;
pub use mkfs::{format, FormatError, FormatOptions};
pub use readahead::DEFAULT_READAHEAD;

pub use scrub::{DataOwner, ScrubError, ScrubProgress, ScrubReport};
pub use stats::{FsStats, LockStats};

use crate::core::lock::CoreLock;
use crate::core::txn::{fresh_core, Core, Step, Stop};
use crate::io::node_read::NodeReadError;
use crate::synclog::LogState;

pub use crate::core::inode::{MAX_FILE_SIZE, MAX_LINKS};

/// Retries of one operation before giving up (each retry loads something).
pub(crate) const MAX_RETRIES: usize = 10_000;

/// Mount options.
pub struct MountOptions {
    /// Memory the node cache may use, in bytes. Dirty nodes are never evicted; when the
    /// cache is over the limit with nothing clean to evict, a checkpoint runs.
    pub cache_limit: usize,
    /// Most bitmap groups (4 KiB each, 127 MiB of disk each) kept in memory.
    pub max_groups: usize,
    /// Mount read-only: nothing is ever written.
    pub read_only: bool,
    /// Most snapshots that may exist (default [`snapshot::MAX_SNAPSHOTS`]); creating
    /// one more fails with `ENOSPC` (counted in [`FsStats::snapshot_limit_hits`]).
    pub max_snapshots: usize,
    /// Most links an inode may have (default [`MAX_LINKS`]); `link`, `mkdir` and a
    /// directory `rename` past it fail with `EMLINK` (counted in
    /// [`FsStats::link_limit_hits`]).
    pub max_links: u32,
    /// When checkpoints run.
    pub policy: Box<dyn WritePolicy>,
    /// Give freed blocks back to the device (discard) once their release is durable,
    /// committing it at most this long after the first of them was freed (a `Discard`
    /// checkpoint, started by [`NineFs::housekeeping`]); `None`: never discard.
    pub discard: Option<Duration>,
    /// A monotonic clock in nanoseconds that times every hold of the core lock
    /// ([`FsStats::core_lock`]: total and longest hold); `None`: holds are counted,
    /// not timed. Read twice per hold, so it must be cheap (a TSC, `Instant`).
    pub hold_clock: Option<fn() -> u64>,
    /// Refuse to mount a mirrored volume with a leg out of service (missing, failed
    /// or stale) instead of serving from the others.
    pub refuse_degraded: bool,
    /// Most bytes the buffer of each stream job (`send`, `receive` of the
    /// administration tree) holds (default [`streamjob::DEFAULT_STREAM_BUFFER`]).
    pub stream_buffer: usize,
    /// Blocks a rebuild copies between two records of its cursor in the superblock
    /// (default [`rebuild::CURSOR_EVERY_BLOCKS`]): what a crash makes it copy again.
    pub rebuild_record_blocks: u64,
    /// Memory the data cache may use, in bytes, besides what the node cache leaves
    /// unused of `cache_limit` (0: no data cache; `cache::data`). Default
    /// [`DEFAULT_DATA_CACHE`].
    pub data_cache: usize,
    /// The largest readahead window of a sequential reader, in bytes (0: no
    /// readahead). Default [`DEFAULT_READAHEAD`].
    pub readahead: u64,
}

/// Default of [`MountOptions::data_cache`] (the appliance sizes it from its memory).
pub const DEFAULT_DATA_CACHE: usize = 16 << 20;

/// Default of [`MountOptions::discard`]: freed blocks go back to the device within
/// about this long (plus the housekeeping interval).
pub const DEFAULT_DISCARD_DELAY: Duration = Duration::from_secs(20);

/// Most discard requests one checkpoint sends; blocks beyond them are freed without
/// being discarded (bounded checkpoint time; counted as skipped blocks in the log).
pub(crate) const MAX_DISCARDS_PER_CHECKPOINT: usize = 4096;

impl Default for MountOptions {
    fn default() -> MountOptions {
        MountOptions {
            cache_limit: 16 << 20,
            max_groups: 256,
            read_only: false,
            max_links: MAX_LINKS,
            max_snapshots: snapshot::MAX_SNAPSHOTS,
            policy: Box::new(PressurePolicy),
            discard: Some(DEFAULT_DISCARD_DELAY),
            hold_clock: None,
            refuse_degraded: false,
            stream_buffer: streamjob::DEFAULT_STREAM_BUFFER,
            rebuild_record_blocks: rebuild::CURSOR_EVERY_BLOCKS,
            data_cache: DEFAULT_DATA_CACHE,
            readahead: readahead::DEFAULT_READAHEAD,
        }
    }
}

impl ::core::fmt::Debug for MountOptions {
    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
        f.debug_struct("MountOptions")
            .field("cache_limit", &self.cache_limit)
            .field("max_groups", &self.max_groups)
            .field("read_only", &self.read_only)
            .field("max_links", &self.max_links)
            .field("stream_buffer", &self.stream_buffer)
            .field("data_cache", &self.data_cache)
            .field("readahead", &self.readahead)
            .finish()
    }
}

/// Why a mount failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MountError {
    /// The device cannot hold a filesystem.
    Device(DevError),
    /// Reading the superblocks failed.
    Io(block::IoError),
    /// Neither superblock copy is valid.
    /// No superblock copy is valid; with why the last one read was refused (a checksum,
    /// a field out of its bounds).
    NoSuperblock(Option<Corrupt>),
    /// The filesystem uses features this code does not know.
    Features(u64),
    /// The device is smaller than the filesystem.
    TooSmall,
    /// Something else failed while mounting (recovery, orphan cleanup).
    Errno(Errno),
    /// The superblock names this many legs, not as many as the device has copies.
    Legs(usize),
    /// Legs are out of service (bit `i`: leg `i`) and
    /// [`MountOptions::refuse_degraded`] is set.
    Degraded(u64),
    /// The superblock a writable mount writes would take this field (a sequence or
    /// counter) to its bound
    /// ([`MAX_SEQ`](crate::format::superblock::MAX_SEQ)); nothing was written. The filesystem
    /// can still be mounted read-only.
    Exhausted(Corrupt),
}

impl ::core::fmt::Display for MountError {
    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
        match self {
            MountError::Device(e) => write!(f, "unusable device: {e:?}"),
            MountError::Io(e) => write!(f, "reading the superblocks: {e}"),
            MountError::NoSuperblock(None) => f.write_str("no valid superblock"),
            MountError::NoSuperblock(Some(why)) => write!(f, "no valid superblock ({why})"),
            MountError::Features(bits) => write!(f, "unknown incompatible features {bits:#x}"),
            MountError::TooSmall => f.write_str("device smaller than the filesystem"),
            MountError::Errno(e) => write!(f, "mount failed: {e}"),
            MountError::Legs(n) => write!(f, "the volume has {n} legs, not as many as given"),
            MountError::Degraded(mask) => {
                write!(f, "legs out of service (mask {mask:#x}): refused")
            }
            MountError::Exhausted(what) => write!(
                f,
                "{what}: at its bound (2^62), no superblock can be written; mount read-only"
            ),
        }
    }
}

/// Reads both superblock copies and returns the valid one with the highest generation,
/// with the validity of each copy. On a mirror, of every leg in service; legs found
/// stale are taken out of service ([`legs`]).
pub async fn read_superblock<D: BlockDevice>(
    dev: &Dev<D>,
) -> Result<(Superblock, [bool; 2]), MountError> {
    if dev.copies() > 1 {
        return legs::choose(dev).await;
    }
    read_superblock_copy(dev, None).await
}

/// [`read_superblock`] of the device (`None`) or of one copy.
pub(crate) async fn read_superblock_copy<D: BlockDevice>(
    dev: &Dev<D>,
    copy: Option<usize>,
) -> Result<(Superblock, [bool; 2]), MountError> {
    let mut best: Option<Superblock> = None;
    let mut valid = [false; 2];
    let mut refused = None;
    for (i, &b) in SUPERBLOCK_BLOCKS.iter().enumerate() {
        let mut buf = vec![0u8; BLOCK_SIZE];
        match copy {
            None => dev.read(b, &mut buf).await,
            Some(c) => dev.read_copy(c, b, &mut buf).await,
        }
        .map_err(MountError::Io)?;
        match Superblock::decode(&buf) {
            Ok(sb) => {
                valid[i] = true;
                if best.as_ref().is_none_or(|x| sb.generation > x.generation) {
                    best = Some(sb);
                }
            }
            Err(e) => {
                log::warn!("superblock copy {i} at block {b}: {e}");
                refused = Some(e);
            }
        }
    }
    best.map(|sb| (sb, valid))
        .ok_or(MountError::NoSuperblock(refused))
}

/// Chooses the committed version of a bitmap group from its two slots: the valid one
/// with the highest sequence not above `committed`. With `strict`, an invalid slot is
/// corruption (after a clean shutdown or recovery both slots are always valid).
pub fn choose_group(
    slots: &[u8],
    group: u32,
    committed: u64,
    strict: bool,
) -> Result<(GroupBlock, usize), &'static str> {
    let mut best: Option<(GroupBlock, usize)> = None;
    for slot in 0..2 {
        match GroupBlock::decode(&slots[slot * BLOCK_SIZE..(slot + 1) * BLOCK_SIZE], group) {
            Ok(g) if g.seq <= committed => {
                if best.as_ref().is_none_or(|(b, _)| g.seq > b.seq) {
                    best = Some((g, slot));
                }
            }
            Ok(_) => {}
            // A checksum, the group number or a free count its bits do not show.
            Err(_) if strict => return Err("bitmap slot invalid"),
            Err(_) => {}
        }
    }
    best.ok_or("no committed bitmap slot")
}

/// A mounted filesystem on a block device.
pub struct NineFs<D: BlockDevice> {
    /// Shared with the snapshot views.
    pub(crate) dev: Arc<Dev<D>>,
    /// This is a snapshot's view: it has no `.snapshots` of its own (those of the
    /// snapshot's time may be gone).
    pub(crate) is_view: bool,
    /// Snapshot views open now, by snapshot id (see [`snapdir`]).
    pub(crate) views: Mutex<snapshot::OpenViews<D>>,
    pub(crate) core: CoreLock,
    /// The fsync log's ring and batches (taken after `core` when both are needed).
    pub(crate) log: Mutex<LogState>,
    pub(crate) checkpoint_lock: async_lock::Mutex<()>,
    /// [`MountOptions::max_snapshots`].
    pub(crate) max_snapshots: usize,
    /// Held by a receive or a rollback (`receive`): one changes the live tree at a time.
    pub(crate) receive_lock: async_lock::Mutex<()>,
    /// Serialises `set_quota` (one labeling walk at a time).
    pub(crate) quota_lock: async_lock::Mutex<()>,
    /// Held by the log committer across one commit's I/O.
    pub(crate) commit_lock: async_lock::Mutex<()>,
    pub(crate) inode_locks: Mutex<HashMap<Ino, Arc<async_lock::Mutex<()>>>>,
    /// Inodes known to hold nothing past their end of file (see [`file::TrimmedInodes`]).
    pub(crate) trimmed: Mutex<file::TrimmedInodes>,
    pub(crate) clock: Box<dyn Clock + Send + Sync>,
    pub(crate) cache_limit: usize,
    pub(crate) max_groups: usize,
    pub(crate) policy: Box<dyn WritePolicy>,
    /// [`MountOptions::discard`], until the device says it cannot discard.
    pub(crate) discard: Mutex<Option<Duration>>,
    /// When (wall-clock seconds) freed blocks were first seen waiting for a checkpoint.
    pub(crate) freed_since: Mutex<Option<i64>>,
    /// The running or last scrub pass.
    pub(crate) scrub: Mutex<scrub::ScrubState>,
    /// The send and receive jobs of the administration tree.
    pub(crate) jobs: streamjob::StreamJobs,
    /// The rebuild of a replaced leg going on ([`rebuild`]).
    pub(crate) rebuild: Mutex<Option<rebuild::Rebuild>>,
    /// [`MountOptions::rebuild_record_blocks`].
    pub(crate) rebuild_record_blocks: u64,
    /// Readahead asked for by readers, for the readahead workers ([`readahead`]).
    pub(crate) readahead: crate::cache::ReadaheadQueue,
    /// [`MountOptions::readahead`].
    pub(crate) readahead_max: u64,
}

/// The handle is shared by every CPU: over a device that is `Send + Sync`, a mounted
/// filesystem (and so a snapshot view, an `Arc<NineFs<D>>` of its own) is too. Checked
/// here at compile time for every such device, so a field that is not (an `Rc`, a
/// `RefCell`, a boxed trait object without the bounds) fails the build, not a CPU.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    const fn every_device<D: BlockDevice + Send + Sync>() {
        shared::<NineFs<D>>();
        shared::<Arc<NineFs<D>>>();
    }
    every_device::<block::MemDisk>();
};

impl<D: BlockDevice> ::core::fmt::Debug for NineFs<D> {
    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
        f.debug_struct("NineFs")
            .field("core", &*self.core.lock())
            .finish()
    }
}

/// What this code can do with a filesystem of the feature bits of `sb`: `Err` when it
/// uses an incompatible feature this code does not know (never mounted), `Ok(true)`
/// when only read (an unknown read-only-compatible feature), else `Ok(false)`. The
/// mount decides by it, and fsck reports what it refuses.
pub fn check_features(sb: &Superblock) -> Result<bool, MountError> {
    if sb.incompat & !features::INCOMPAT_SUPPORTED != 0 {
        return Err(MountError::Features(
            sb.incompat & !features::INCOMPAT_SUPPORTED,
        ));
    }
    Ok(sb.ro_compat & !features::RO_COMPAT_SUPPORTED != 0)
}

/// The mount count and log epoch (the next generation) a writable mount of `sb`
/// writes: each one more, and neither may reach its bound
/// ([`MAX_SEQ`](crate::format::superblock::MAX_SEQ)), since a superblock that did
/// would be refused by every later mount. `Exhausted` then: the filesystem can still
/// be mounted read-only.
pub(crate) fn next_epoch(sb: &Superblock) -> Result<(u64, u64), MountError> {
    let exhausted = |field| MountError::Exhausted(Corrupt::Field(field));
    let mount_count = next_seq(sb.mount_count).ok_or(exhausted("mount_count"))?;
    let epoch = next_seq(sb.generation).ok_or(exhausted("generation"))?;
    Ok((mount_count, epoch))
}

/// Whether the filesystem of `sb` on `dev` mounts read-only (asked for, or features this
/// code can only read); refuses what cannot be mounted at all.
pub(crate) fn mount_read_only<D: BlockDevice>(
    sb: &Superblock,
    dev: &Dev<D>,
    opts: &MountOptions,
) -> Result<bool, MountError> {
    let read_only = check_features(sb)?;
    if sb.layout.total_blocks > dev.blocks() {
        return Err(MountError::TooSmall);
    }
    Ok(opts.read_only || read_only)
}

impl<D: BlockDevice> NineFs<D> {
    /// Puts a mounted filesystem together: the one place a [`NineFs`] is built, for a
    /// mount and for a snapshot view (`is_view`). `sb` is what it starts from (its log
    /// where `sb` says), `opts` what it keeps of the mount options (`opts.read_only`:
    /// whether it is mounted read-only, asked for or not); every lock, cache and
    /// counter starts empty.
    pub(crate) fn assemble(
        dev: Arc<Dev<D>>,
        sb: Superblock,
        is_view: bool,
        opts: MountOptions,
        clock: Box<dyn Clock + Send + Sync>,
    ) -> NineFs<D> {
        let layout = sb.layout;
        let log = LogState::new(
            layout.log_start,
            layout.log_blocks,
            sb.log_epoch,
            sb.log_tail,
        );
        let core = fresh_core(&dev, sb, opts.read_only, opts.max_links);
        NineFs {
            dev,
            is_view,
            views: Mutex::new(snapshot::OpenViews::default()),
            core: CoreLock::new(core, opts.hold_clock),
            log: Mutex::new(log),
            checkpoint_lock: async_lock::Mutex::new(()),
            max_snapshots: opts.max_snapshots,
            receive_lock: async_lock::Mutex::new(()),
            quota_lock: async_lock::Mutex::new(()),
            commit_lock: async_lock::Mutex::new(()),
            inode_locks: Mutex::new(HashMap::new()),
            trimmed: Mutex::new(file::TrimmedInodes::default()),
            clock,
            cache_limit: opts.cache_limit,
            max_groups: opts.max_groups.max(4),
            policy: opts.policy,
            discard: Mutex::new(opts.discard),
            freed_since: Mutex::new(None),
            scrub: Mutex::new(scrub::ScrubState::default()),
            jobs: streamjob::StreamJobs::new(opts.stream_buffer),
            rebuild: Mutex::new(None),
            rebuild_record_blocks: opts.rebuild_record_blocks.max(1),
            readahead: crate::cache::ReadaheadQueue::new(),
            readahead_max: opts.readahead,
        }
    }

    /// Mounts the filesystem on `dev`. After an unclean shutdown this first rewrites every
    /// bitmap group's stale slot (so torn or uncommitted slot writes can never be taken
    /// for current), then replays the fsync log (committing the result with a
    /// checkpoint), then frees orphans (inodes unlinked while open). Every writable
    /// mount starts a new log epoch before anything is logged.
    pub async fn mount(
        dev: D,
        opts: MountOptions,
        clock: Box<dyn Clock + Send + Sync>,
    ) -> Result<NineFs<D>, MountError> {
        let dev = Dev::new(dev).map_err(MountError::Device)?;
        let (sb, _) = read_superblock(&dev).await?;
        let read_only = mount_read_only(&sb, &dev, &opts)?;
        if !read_only {
            // Refused before anything is written, not at the superblock write.
            next_epoch(&sb)?;
        }
        let out = dev.failed_copies();
        if out != 0 {
            if opts.refuse_degraded {
                return Err(MountError::Degraded(out));
            }
            log::warn!("mounting degraded: legs out of service (mask {out:#x}); the others serve");
        }
        let clean = sb.state & state::CLEAN != 0;
        if !read_only && !clean {
            scrub_groups(&dev, &sb).await.map_err(MountError::Errno)?;
        }
        let opts = MountOptions { read_only, ..opts };
        dev.cache().set_limits(opts.data_cache, opts.cache_limit);
        let fs = NineFs::assemble(Arc::new(dev), sb, false, opts, clock);
        // Replay and orphan cleanup free blocks: what snapshots hold must be known first.
        fs.load_snapshots().await.map_err(MountError::Errno)?;
        // A cleanly unmounted image has an empty log (its tail is the head).
        let (replayed, refused) = if clean {
            (synclog::replay::ReplaySummary::default(), None)
        } else {
            fs.replay().await.map_err(MountError::Errno)?
        };
        // A refused commit leaves the filesystem read-only (docs/durability.md, "Log
        // commits as input"): nothing is written, so the whole log stays on the disk.
        let read_only = read_only || refused.is_some();
        {
            let mut l = fs.log.lock();
            let s = &mut l.stats;
            s.replayed_commits = replayed.commits;
            s.replayed_records = replayed.records;
            s.replayed_inodes = replayed.inodes;
            s.replayed_bytes = replayed.bytes;
            s.dropped_commits = replayed.dropped;
            s.unverified_commits = replayed.unverified;
            s.refused_commits = u64::from(refused.is_some());
            l.refused = refused;
        }
        if !read_only {
            // Committed by the checkpoint that starts the epoch: from then on the
            // checkpoint's extents ([`NineFs::replayed_extents`] is for read-only mounts).
            fs.log.lock().replayed_extents = Vec::new();
            let end = if clean {
                fs.log.lock().head
            } else {
                replayed.end
            };
            fs.start_epoch(end, replayed.commits > 0).await?;
            fs.clean_orphans().await.map_err(MountError::Errno)?;
            fs.finish_labeling().await.map_err(MountError::Errno)?;
            // A device that got bigger is used at once.
            fs.grow().await.map_err(MountError::Errno)?;
            // A leg being rebuilt when the volume went down goes on being rebuilt.
            fs.resume_rebuild(clean);
        }
        Ok(fs)
    }

    /// Starts this mount's log epoch with the log empty at `end` (where replay stopped),
    /// and commits it: with a checkpoint when replay changed the trees, else with a
    /// superblock write.
    pub(crate) async fn start_epoch(&self, end: u64, replayed: bool) -> Result<(), MountError> {
        // The next superblock written gets generation + 1: that is the new epoch,
        // unique to this mount, so no block written to the log before (by an
        // earlier mount, torn or not) is ever taken for one of this mount's.
        let epoch = {
            let mut c = self.core.lock();
            let (mount_count, epoch) = next_epoch(&c.sb)?;
            c.sb.mount_count = mount_count;
            c.sb.state = 0;
            c.sb.incompat |= features::INCOMPAT_LOG;
            c.sb.log_epoch = epoch;
            c.sb.log_tail = end;
            epoch
        };
        {
            let mut l = self.log.lock();
            l.epoch = epoch;
            l.head = end;
            l.tail = end;
        }
        if replayed {
            return self
                .checkpoint(CheckpointCause::Replay)
                .await
                .map_err(MountError::Errno);
        }
        let mut sb = {
            let mut c = self.core.lock();
            c.sb.generation = epoch;
            c.sb.clone()
        };
        self.stamp_legs(&mut sb);
        self.dev
            .write(sb.slot(), &sb.encode(), WriteFlags::FUA)
            .await
            .map_err(MountError::Io)
    }

    /// Unmounts cleanly ([`NineFs::remount_read_only`]) and returns the device.
    /// `EBUSY` if a snapshot view handed out by [`NineFs::snapshot_view`] is still held.
    pub async fn unmount(self) -> FsResult<D> {
        self.remount_read_only().await?;
        self.views.lock().clear();
        Arc::try_unwrap(self.dev)
            .map(Dev::into_inner)
            .map_err(|_| Errno::EBUSY)
    }

    /// Does what a clean unmount does on disk, but keeps the filesystem mounted,
    /// read-only from then on (`mount -o remount,ro`; for a holder that cannot give the
    /// filesystem up, such as the appliance's 9P server at shutdown): frees inodes that
    /// were unlinked while open, writes a final checkpoint marked clean (the log is then
    /// empty: the next mount replays nothing), and refuses every later change with
    /// `EROFS`, so nothing can make the image unclean again. Every open file counts as
    /// closed: call it once no operation is running and no client holds a file.
    pub async fn remount_read_only(&self) -> FsResult<()> {
        if self.core.lock().read_only {
            return Ok(());
        }
        let open: Vec<Ino> = {
            let mut c = self.core.lock();
            c.inodes.values_mut().for_each(|s| s.open = 0);
            c.inodes.keys().copied().collect()
        };
        for ino in open {
            self.free_if_unlinked(ino).await?;
        }
        self.checkpoint(CheckpointCause::Unmount).await?;
        // No await since the checkpoint: nothing changed in between.
        self.core.lock().read_only = true;
        Ok(())
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

    /// Discards `freed` (blocks whose release a checkpoint just made durable, still
    /// pinned). Errors are logged and counted, never fatal: the blocks are free either
    /// way; a device that cannot discard turns discarding off.
    pub(crate) async fn discard_freed(&self, freed: Vec<Range<u64>>) {
        let skipped: u64 = freed
            .iter()
            .skip(MAX_DISCARDS_PER_CHECKPOINT)
            .map(|r| r.end - r.start)
            .sum();
        if skipped > 0 {
            log::warn!("discard: {skipped} freed blocks left undiscarded (too many ranges)");
        }
        for r in freed.into_iter().take(MAX_DISCARDS_PER_CHECKPOINT) {
            let blocks = r.end - r.start;
            let result = self.dev.discard(r.start, blocks).await;
            let mut c = self.core.lock();
            match result {
                Ok(()) => {
                    c.stats.discards += 1;
                    c.stats.discarded_blocks += blocks;
                }
                Err(block::IoError::Unsupported) => {
                    drop(c);
                    log::info!(
                        "discard: the device cannot discard; freed blocks stay allocated on it"
                    );
                    *self.discard.lock() = None;
                    return;
                }
                Err(e) => {
                    c.stats.discard_errors += 1;
                    drop(c);
                    log::warn!("discard of blocks {}..{}: {e}", r.start, r.end);
                }
            }
        }
    }

    /// Periodic work, for the owner to call every few seconds: gives the node cache back
    /// the memory the data cache borrowed from it, if it grew into it; commits the
    /// release of blocks freed more than [`MountOptions::discard`] ago (a `Discard`
    /// checkpoint), so deleted files give their space back to the device even when
    /// nothing else checkpoints.
    pub async fn housekeeping(&self) -> FsResult<()> {
        self.dev.cache().trim();
        let Some(delay) = *self.discard.lock() else {
            return Ok(());
        };
        let waiting = {
            let c = self.core.lock();
            !c.read_only && !c.failed && c.space.reclaimable() > 0
        };
        let now = self.now().sec;
        let due = {
            let mut since = self.freed_since.lock();
            match (*since, waiting) {
                (_, false) => {
                    *since = None;
                    false
                }
                (None, true) => {
                    *since = Some(now);
                    false
                }
                (Some(t), true) => now.saturating_sub(t) >= delay.as_secs() as i64,
            }
        };
        if due {
            *self.freed_since.lock() = None;
            self.checkpoint(CheckpointCause::Discard).await?;
        }
        Ok(())
    }

    /// Runs a checkpoint now (if anything changed, or to mark an unmount clean).
    pub async fn checkpoint(&self, cause: CheckpointCause) -> FsResult<()> {
        let _guard = self.checkpoint_lock.lock().await;
        self.checkpoint_locked(cause).await
    }

    /// [`NineFs::checkpoint`] with the checkpoint lock already held.
    pub(crate) async fn checkpoint_locked(&self, cause: CheckpointCause) -> FsResult<()> {
        if self.core.lock().read_only {
            return Ok(());
        }
        let prepared = self
            .run_loads(&mut |c: &mut Core| {
                let mut plan = c.prepare_checkpoint(cause)?;
                if let Some(p) = plan.as_mut() {
                    // Every record built so far describes state this checkpoint holds:
                    // the log after it starts at the head, and the open batch is covered.
                    let (tail, absorbed) = self.log.lock().absorb();
                    let before = c.sb.log_tail;
                    c.check(ensure(tail >= before, "log tail moves backwards", || {
                        alloc::format!("from {before} to {tail}")
                    }))?;
                    p.sb.log_tail = tail;
                    c.sb.log_tail = tail;
                    p.log_absorbed = absorbed;
                }
                Ok(plan)
            })
            .await?;
        let Some(mut plan) = prepared.map_err(|()| Errno::ENOSPC)? else {
            return Ok(());
        };
        let written: Result<(), block::IoError> = async {
            // Sealed here, with no lock held: checksumming is most of encoding a node.
            for (block, bset) in ::core::mem::take(&mut plan.nodes) {
                self.dev
                    .write(block, &bset.seal(), WriteFlags::NONE)
                    .await?;
            }
            for (block, data) in &plan.groups {
                self.dev.write(*block, data, WriteFlags::NONE).await?;
            }
            self.dev.flush().await?;
            // Legs that failed up to here are out of what this checkpoint committed.
            self.stamp_legs(&mut plan.sb);
            self.dev
                .write(plan.sb.slot(), &plan.sb.encode(), WriteFlags::FUA)
                .await?;
            if cause == CheckpointCause::Unmount {
                // Both copies clean and current: on a cleanly unmounted image a damaged
                // copy is then detectably damage, not a torn last write. (Not past the
                // generations' bound: then the other copy stays one generation older.)
                let mut other = plan.sb.clone();
                if other.next_generation().is_ok() {
                    self.dev
                        .write(other.slot(), &other.encode(), WriteFlags::FUA)
                        .await?;
                    self.core.lock().sb.generation = other.generation;
                }
            }
            Ok(())
        }
        .await;
        let mut c = self.core.lock();
        match written {
            Ok(()) => {
                // The release of the freed blocks is durable: give them back to the
                // device before they can be reused (they stay pinned meanwhile).
                if self.discard.lock().is_some() {
                    let freed = c.space.pinned_ranges();
                    drop(c);
                    self.discard_freed(freed).await;
                    c = self.core.lock();
                }
                c.checkpoint_committed(&plan);
                drop(c);
                self.log
                    .lock()
                    .checkpoint_committed(plan.sb.log_tail, plan.log_absorbed);
                Ok(())
            }
            Err(e) => {
                log::error!(
                    "checkpoint {} failed: {e}; filesystem is now failed",
                    plan.seq
                );
                c.failed = true;
                Err(Errno::EIO)
            }
        }
    }

    /// Evicts clean nodes over the cache limit and runs a checkpoint if the policy asks.
    pub(crate) async fn maintain(&self) -> FsResult<()> {
        let due = {
            let mut c = self.core.lock();
            if c.read_only || c.failed {
                return Ok(());
            }
            self.evict(&mut c);
            let log_used = self.log.lock().used();
            self.policy
                .checkpoint_due(&c.pressure(self.cache_limit, log_used))
        };
        if let Some(cause) = due {
            self.checkpoint(cause).await?;
            let mut c = self.core.lock();
            self.evict(&mut c);
        }
        if self.policy.writes_early() {
            self.write_early().await?;
        }
        Ok(())
    }

    /// Writes the nodes the policy wants written ahead of the next checkpoint. Holds the
    /// checkpoint lock across the writes, so no checkpoint commits a length these
    /// writes have not reached yet.
    pub(crate) async fn write_early(&self) -> FsResult<()> {
        let _guard = self.checkpoint_lock.lock().await;
        let prepared = self
            .run_loads(&mut |c: &mut Core| {
                // Locations for nodes that need one (new, or too full to append).
                let want = c
                    .trees
                    .cache
                    .nodes()
                    .filter(|n| n.is_dirty() && self.policy.node_write_due(n.pending_bytes()))
                    .count();
                c.space.fill_pool(want)?;
                let mut pool = Vec::new();
                while let Some(a) = c.space.take_node() {
                    pool.push(a);
                }
                let seq = c.seq;
                let res = c
                    .trees
                    .write_early(seq, |p| self.policy.node_write_due(p), &mut pool);
                for a in pool {
                    c.space.return_node(a);
                }
                let nb = crate::core::txn::node_blocks(&c.sb);
                for w in &res.writes {
                    let layout = c.sb.layout;
                    c.check(checks::node_write(w, &layout, nb))?;
                }
                for &a in &res.placed {
                    c.space.commit_reserved(a..a + nb);
                }
                c.space.stats.node_allocs += res.placed.len() as u64;
                for &a in &res.freed {
                    c.space.free(a..a + nb);
                }
                c.check_space()?;
                for w in &res.writes {
                    c.stats.node_writes.count(w);
                }
                if !res.writes.is_empty() {
                    c.changed = true;
                }
                Ok(res.writes)
            })
            .await?;
        // Out of space for locations: the next checkpoint writes them.
        let writes = prepared.unwrap_or_default();
        for w in writes {
            if let Err(e) = self
                .dev
                .write(w.block, &w.bset.seal(), WriteFlags::NONE)
                .await
            {
                log::error!(
                    "early write of a node at block {}: {e}; filesystem is now failed",
                    w.block
                );
                self.core.lock().failed = true;
                return Err(Errno::EIO);
            }
        }
        Ok(())
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

/// After an unclean shutdown: rewrites each bitmap group's other slot with its committed
/// version, so a slot written by a checkpoint that never committed (possibly torn) is
/// gone before anything reads it as current. On a mirror the legs may differ in either
/// slot (a write torn on one leg, a bad block on another): every leg gets the committed
/// version in both slots.
pub(crate) async fn scrub_groups<D: BlockDevice>(
    dev: &Dev<D>,
    sb: &Superblock,
) -> Result<(), Errno> {
    let mut buf = vec![0u8; 2 * BLOCK_SIZE];
    for g in 0..sb.layout.groups {
        let block = sb.layout.bitmap_block(g, 0);
        let (grp, slot) = committed_group(dev, g, block, sb.checkpoint_seq, &mut buf)
            .await
            .map_err(|what| {
                log::error!("bitmap group {g} at block {block}: {what}");
                Errno::EIO
            })?;
        let encoded = grp.encode();
        if dev.copies() > 1 {
            let both = [&encoded[..], &encoded[..]].concat();
            dev.write(block, &both, WriteFlags::NONE)
                .await
                .map_err(|_| Errno::EIO)?;
            continue;
        }
        let other = 1 - slot;
        if buf[other * BLOCK_SIZE..(other + 1) * BLOCK_SIZE]
            != buf[slot * BLOCK_SIZE..(slot + 1) * BLOCK_SIZE]
        {
            dev.write(block + other as u64, &encoded, WriteFlags::NONE)
                .await
                .map_err(|_| Errno::EIO)?;
        }
    }
    dev.flush().await.map_err(|_| Errno::EIO)
}

/// The committed version of bitmap group `g` (its two slots at `block`, read into
/// `buf`) and its slot. On a mirror, the newest valid slot at or below `committed` of
/// every leg: a leg's bad copy of the committed slot looks like a slot torn by an
/// uncommitted checkpoint, and would let the older slot win if that leg were read alone.
pub(crate) async fn committed_group<D: BlockDevice>(
    dev: &Dev<D>,
    g: u32,
    block: u64,
    committed: u64,
    buf: &mut [u8],
) -> Result<(GroupBlock, usize), &'static str> {
    if dev.copies() < 2 {
        dev.read(block, buf).await.map_err(|_| "read error")?;
        return choose_group(buf, g, committed, false);
    }
    let mut best: Option<(GroupBlock, usize)> = None;
    for copy in 0..dev.copies() {
        if dev.failed_copies() & 1 << copy != 0 || dev.read_copy(copy, block, buf).await.is_err() {
            continue;
        }
        if let Ok((grp, slot)) = choose_group(buf, g, committed, false) {
            if best.as_ref().is_none_or(|(b, _)| grp.seq > b.seq) {
                best = Some((grp, slot));
            }
        }
    }
    best.ok_or("no leg holds a committed bitmap slot")
}
