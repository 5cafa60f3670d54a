//! A mounted ninefold filesystem: [`NineFs`], which implements
//! [`FileSystem`](vfs::FileSystem).
//!
//! The handle is the assembly: the [`Engine`] (device, core, log, locks; the operation
//! driver, checkpoints, the data path) and the feature services over it (`Snapshots`,
//! `Quotas`, `Grow`, `Redundancy`, `Streams`, which runs on the handle as its
//! `StreamHost`), with their public methods forwarded here so callers keep one type.
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

use crate::cache::{ReadaheadCounters, Who};
use crate::engine::{Engine, EngineOptions};
use crate::format::bitmap::GroupBlock;
use crate::format::items::QuotaItem;
use crate::format::superblock::{state, Superblock};
use crate::format::{features, BLOCK_SIZE};
use crate::io::Dev;
use crate::synclog::replay::RefusedCommit;
use alloc::string::String;
use block::{BlockDevice, WriteFlags};
use vfs::{Clock, Errno, FsResult, Ino};

use crate::core::counters as stats;
use crate::core::{checkpoint, dir, mkfs};
use crate::engine::readahead;
use crate::features::grow::{self, Grow};
use crate::features::quota::Quotas;
use crate::features::redundancy::rebuild::{Rebuild, RebuildStep};
use crate::features::redundancy::{rebuild, scrub, Redundancy};
use crate::features::snapshots::{self as snapshot, SnapshotInfo, Snapshots};
use crate::features::streams::host::StreamHost;
use crate::features::streams::jobs::{self as streamjob, StreamCounters};
use crate::features::streams::receive::{ReceiveError, StreamSource};
use crate::features::streams::send::{self as send, SendStats, Sink, StreamSink};
use crate::features::streams::Streams;
use crate::synclog;

pub use crate::core::txn::InodeState;
pub use crate::engine::mount::{choose_group, MountError};
pub use crate::features::redundancy::legs::read_superblock;
pub use checkpoint::{
    CheckpointCause, DirtyThresholdPolicy, Pressure, PressurePolicy, WritePolicy,
};
pub use dir::check_name;
pub use grow::Growth;
pub use mkfs::{format, FormatError, FormatOptions};
pub use readahead::DEFAULT_READAHEAD;

pub use scrub::{DataOwner, ScrubError, ScrubProgress, ScrubReport};
pub use stats::{FsStats, LockStats};

use crate::engine::mount::next_epoch;

pub use crate::core::inode::{MAX_FILE_SIZE, MAX_LINKS};

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

/// A mounted filesystem on a block device: the [`Engine`] and the features' state.
pub struct NineFs<D: BlockDevice> {
    /// The device, the core, the log and the locks every feature works with.
    pub(crate) engine: Arc<Engine<D>>,
    /// Snapshots, their views and the `.snapshots` directory.
    pub(crate) snaps: Snapshots<D>,
    /// Project quotas.
    pub(crate) quota: Quotas<D>,
    /// Growing onto a larger device.
    pub(crate) grower: Grow<D>,
    /// The send and receive jobs and the receive lock.
    pub(crate) streams: Streams,
    /// Rebuild and scrub.
    pub(crate) redundancy: Redundancy<D>,
}

/// The handle is shared by every CPU: over a device that is `Send + Sync`, a mounted
/// filesystem (and so a snapshot view, an `Arc<NineFs<D>>` over an engine of its own) is too. Checked
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
            .field("core", &*self.engine.core.lock())
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
    /// Puts a mounted filesystem together: its engine (`sb` is what it starts from, its
    /// log where `sb` says; `opts.read_only`: whether it is mounted read-only, asked for
    /// or not) and the services over it. Every lock, cache and counter starts empty.
    pub(crate) fn assemble(
        dev: Arc<Dev<D>>,
        sb: Superblock,
        opts: MountOptions,
        clock: Box<dyn Clock + Send + Sync>,
    ) -> NineFs<D> {
        let engine = EngineOptions {
            cache_limit: opts.cache_limit,
            max_groups: opts.max_groups,
            read_only: opts.read_only,
            max_links: opts.max_links,
            policy: opts.policy,
            discard: opts.discard,
            hold_clock: opts.hold_clock,
            readahead: opts.readahead,
        };
        let engine = Arc::new(Engine::assemble(dev, sb, engine, clock));
        NineFs::of_engine(
            engine,
            false,
            opts.max_snapshots,
            opts.stream_buffer,
            opts.rebuild_record_blocks,
        )
    }

    /// The handle over `engine`: the one place a [`NineFs`] is built, for a mount and
    /// for a snapshot view (`is_view`, which has no snapshots and runs no stream job).
    fn of_engine(
        engine: Arc<Engine<D>>,
        is_view: bool,
        max_snapshots: usize,
        stream_buffer: usize,
        rebuild_record_blocks: u64,
    ) -> NineFs<D> {
        NineFs {
            snaps: Snapshots::new(engine.clone(), is_view, max_snapshots),
            quota: Quotas::new(engine.clone()),
            grower: Grow {
                engine: engine.clone(),
            },
            streams: Streams::new(stream_buffer),
            redundancy: Redundancy::new(engine.clone(), rebuild_record_blocks),
            engine,
        }
    }

    /// A read-only handle over a snapshot view's engine.
    fn view_handle(&self, view: Arc<Engine<D>>) -> Arc<NineFs<D>> {
        // A view runs no stream job and has no snapshots of its own.
        let record = self.redundancy.rebuild_record_blocks;
        Arc::new(NineFs::of_engine(view, true, 0, 0, record))
    }

    /// The snapshot `name` as a read-only filesystem: every read works as on the live
    /// filesystem at the snapshot's checkpoint, every change fails with `EROFS`. It
    /// shares this filesystem's device; its blocks stay valid while the snapshot exists
    /// (deleting a snapshot that is being read makes its readers fail with `EIO`).
    pub async fn snapshot_view(&self, name: &str) -> FsResult<Arc<NineFs<D>>> {
        let view = self.snaps.snapshot_view(name).await?;
        Ok(self.view_handle(view))
    }

    /// The snapshots, by id.
    pub async fn snapshots(&self) -> FsResult<Vec<SnapshotInfo>> {
        self.snaps.snapshots().await
    }

    /// Takes a snapshot named `name` of the filesystem as it is now: commits a
    /// checkpoint, keeps its roots, and commits that with a second checkpoint (a crash
    /// before it leaves no snapshot). `EINVAL`: bad name; `EEXIST`: the name is taken;
    /// `ENOSPC`: at the snapshot limit or no room for the item; `EROFS`: read-only.
    pub async fn snapshot_create(&self, name: &str) -> FsResult<SnapshotInfo> {
        self.snaps.snapshot_create(name).await
    }

    /// Deletes the snapshot `name`: the blocks only it referenced, and that the live
    /// filesystem no longer references, are freed by the checkpoint that commits the
    /// deletion (a crash before leaves the snapshot whole). `ENOENT`: no such snapshot.
    ///
    /// Reads the trees of the snapshot and of its two neighbours in time (the live
    /// filesystem standing in for the newer one when it is the newest), whatever the
    /// number of snapshots: see [`Neighbours`].
    pub async fn snapshot_delete(&self, name: &str) -> FsResult<()> {
        self.snaps.snapshot_delete(name).await
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
        let fs = NineFs::assemble(Arc::new(dev), sb, opts, clock);
        // Replay and orphan cleanup free blocks: what snapshots hold must be known first.
        fs.snaps.load_snapshots().await.map_err(MountError::Errno)?;
        // A cleanly unmounted image has an empty log (its tail is the head).
        let (replayed, refused) = if clean {
            (synclog::replay::ReplaySummary::default(), None)
        } else {
            fs.engine
                .replay(async || fs.snaps.load_snapshots().await)
                .await
                .map_err(MountError::Errno)?
        };
        // A refused commit leaves the filesystem read-only (docs/durability.md, "Log
        // commits as input"): nothing is written, so the whole log stays on the disk.
        let read_only = read_only || refused.is_some();
        {
            let mut l = fs.engine.log.lock();
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
            fs.engine.log.lock().replayed_extents = Vec::new();
            let end = if clean {
                fs.engine.log.lock().head
            } else {
                replayed.end
            };
            fs.engine.start_epoch(end, replayed.commits > 0).await?;
            fs.engine.clean_orphans().await.map_err(MountError::Errno)?;
            fs.quota
                .finish_labeling()
                .await
                .map_err(MountError::Errno)?;
            // A device that got bigger is used at once.
            fs.grow().await.map_err(MountError::Errno)?;
            // A leg being rebuilt when the volume went down goes on being rebuilt.
            fs.redundancy.resume_rebuild(clean);
        }
        Ok(fs)
    }

    /// Unmounts cleanly ([`NineFs::remount_read_only`]) and returns the device.
    /// `EBUSY` if a snapshot view handed out by [`NineFs::snapshot_view`] is still held.
    pub async fn unmount(self) -> FsResult<D> {
        self.remount_read_only().await?;
        self.snaps.views.lock().clear();
        // The services hold the engine too: they go first.
        let NineFs {
            engine,
            snaps,
            quota,
            grower,
            redundancy,
            ..
        } = self;
        drop((snaps, quota, grower, redundancy));
        let engine = Arc::try_unwrap(engine).map_err(|_| Errno::EBUSY)?;
        Arc::try_unwrap(engine.dev)
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
        self.engine.remount_read_only().await
    }

    /// Periodic work, for the owner to call every few seconds: gives the node cache back
    /// the memory the data cache borrowed from it, if it grew into it; commits the
    /// release of blocks freed more than [`MountOptions::discard`](crate::volume::MountOptions::discard) ago (a `Discard`
    /// checkpoint), so deleted files give their space back to the device even when
    /// nothing else checkpoints.
    pub async fn housekeeping(&self) -> FsResult<()> {
        self.engine.housekeeping().await
    }

    /// Runs a checkpoint now (if anything changed, or to mark an unmount clean).
    pub async fn checkpoint(&self, cause: CheckpointCause) -> FsResult<()> {
        self.engine.checkpoint(cause).await
    }

    /// The block device.
    pub fn device(&self) -> &D {
        self.engine.device()
    }

    /// The data cache over the device (shared with the snapshot views).
    pub fn data_cache(&self) -> &crate::cache::DataCache {
        self.engine.data_cache()
    }

    /// Counters.
    pub fn stats(&self) -> FsStats {
        self.engine.stats()
    }

    /// Log blocks in use and the log region's size.
    pub fn log_usage(&self) -> (u64, u64) {
        self.engine.log_usage()
    }

    /// Memory used by cached btree nodes, and the number of cached nodes.
    pub fn cache_usage(&self) -> (usize, usize) {
        self.engine.cache_usage()
    }

    /// The per-inode in-memory state (for the fsync log and tests).
    pub fn inode_state(&self, ino: Ino) -> Option<InodeState> {
        self.engine.inode_state(ino)
    }

    /// The superblock as last written.
    pub fn superblock(&self) -> Superblock {
        self.engine.superblock()
    }

    /// Now, by the clock the filesystem was mounted with (its timestamps').
    pub fn now(&self) -> vfs::Timespec {
        self.engine.now()
    }

    /// Readahead's counters.
    pub fn readahead_counters(&self) -> ReadaheadCounters {
        self.engine.readahead_counters()
    }

    /// The log commit replay refused at mount, if it refused one (the filesystem is then
    /// read-only, as the commits before it left it).
    pub fn refused_log_commit(&self) -> Option<RefusedCommit> {
        self.engine.refused_log_commit()
    }

    /// The data extents log replay added at this mount (written and fsynced since the
    /// checkpoint, which does not have them), each with the checksums the log gave it:
    /// `(first block, one checksum per block)`. Replay verified only the last commit's
    /// data (whose FLUSH may not have completed); the earlier commits' data was on the
    /// disk before the next commit was written, so a block of theirs that no longer
    /// matches is damage, which reading it reports (`EIO`). fsck checks these blocks as
    /// it checks the checkpoint's (`tools/fsck/src/log.rs`). Kept by a read-only mount
    /// only: a writable one commits them with its first checkpoint, and then they are
    /// the checkpoint's. Empty without replay.
    pub async fn replayed_extents(&self) -> FsResult<Vec<(u64, Vec<u32>)>> {
        self.engine.replayed_extents().await
    }

    /// Every quota root with its limits, usage and flags, in project (root inode) order.
    pub async fn quotas(&self) -> FsResult<Vec<(Ino, QuotaItem)>> {
        self.quota.quotas().await
    }

    /// Grows the filesystem to the device's size; `None` when the device is not larger
    /// (or the filesystem is read-only).
    pub async fn grow(&self) -> FsResult<Option<Growth>> {
        self.grower.grow().await
    }

    /// Puts the device in place `place` (out of service, or taken out for this; the
    /// caller has put the new device there: `block::MirrorDisk::attach`, or the
    /// volume was assembled with it) into the volume as the leg being rebuilt, and
    /// records that; [`NineFs::rebuild_step`] then copies the volume to it.
    /// `EINVAL`: not a mirror or no such place; `EBUSY`: a rebuild is going on, or the
    /// leg is the last in service; `ENOENT`: no device in that place.
    pub async fn replace(&self, place: usize) -> FsResult<()> {
        self.redundancy.replace(place).await
    }

    /// `ctl replace PLACE DEVICE`: opens `device` (named as the volume's owner names
    /// devices: [`BlockDevice::attach_named`]), puts it in place `place` — the leg
    /// there taken out of service — and starts its rebuild ([`NineFs::replace`]).
    pub async fn replace_named(
        &self,
        place: usize,
        device: &str,
    ) -> Result<(), alloc::string::String> {
        self.redundancy.replace_named(place, device).await
    }

    /// The rebuild going on, if any.
    pub fn rebuild_progress(&self) -> Option<Rebuild> {
        self.redundancy.rebuild_progress()
    }

    /// Copies blocks of the rebuild going on until about `budget` bytes were copied
    /// (blocks not in use cost nothing but the look), recording the cursor every
    /// `MountOptions::rebuild_record_blocks`; at the end, puts the leg in service.
    pub async fn rebuild_step(&self, budget: u64) -> FsResult<RebuildStep> {
        self.redundancy.rebuild_step(budget).await
    }

    /// Runs the rebuild going on to its end now (for tools and tests).
    pub async fn rebuild_all(&self) -> FsResult<()> {
        self.redundancy.rebuild_all().await
    }

    /// Starts a scrub pass over the committed checkpoint; false if one is running.
    pub async fn scrub_start(&self) -> FsResult<bool> {
        self.redundancy.scrub_start().await
    }

    /// Stops the running pass (its report stays readable); false if none was running.
    pub fn scrub_stop(&self) -> bool {
        self.redundancy.scrub_stop()
    }

    /// The running pass's report so far, or the last pass's; `None` before the first.
    pub fn scrub_report(&self) -> Option<ScrubReport> {
        self.redundancy.scrub_report()
    }

    /// Whether a pass is running.
    pub fn scrub_running(&self) -> bool {
        self.redundancy.scrub_running()
    }

    /// Verifies pieces of the running pass until about `budget` bytes were read (at
    /// least one piece: a node, or a data extent of up to 1 MiB).
    pub async fn scrub_step(&self, budget: u64) -> FsResult<ScrubProgress> {
        self.redundancy.scrub_step(budget).await
    }

    /// Runs a whole pass now and returns its report (for tools and tests).
    pub async fn scrub_all(&self) -> FsResult<ScrubReport> {
        self.redundancy.scrub_all().await
    }

    /// Runs the started pass to its end now and returns its report.
    pub async fn scrub_all_started(&self) -> FsResult<ScrubReport> {
        self.redundancy.scrub_all_started().await
    }

    /// Carries out readahead requests, for ever. The host runs a few of these as tasks
    /// (each has one device read in flight at a time); with none running, requests wait
    /// in the bounded queue and readers read for themselves.
    pub async fn readahead_worker(&self) {
        loop {
            let r = self.engine.readahead.pop().await;
            // A failure is the reader's to meet and report, when it gets there.
            let _ = self.prefetch(r.ino, r.range, r.who).await;
        }
    }

    /// Carries out the readahead requests waiting now, here; returns how many (for
    /// tests and tools that run no workers).
    pub async fn readahead_now(&self) -> usize {
        let mut done = 0;
        while let Some(r) = self.engine.readahead.try_pop() {
            let _ = self.prefetch(r.ino, r.range, r.who).await;
            done += 1;
        }
        done
    }

    /// Reads bytes `range` of `ino` (a snapshot's file too) into the data cache for
    /// `who`.
    pub async fn prefetch(&self, ino: Ino, range: Range<u64>, who: Who) -> FsResult<()> {
        if let Some((view, ino)) = self.in_snapshot(ino, Errno::EISDIR).await? {
            return view.prefetch_data(ino, range, who).await;
        }
        self.engine.prefetch_data(ino, range, who).await
    }
}

/// The streams run on the mounted handle: its live tree and its snapshot views (handles
/// of their own) as `vfs::FileSystem`s.
impl<D: BlockDevice> StreamHost for NineFs<D> {
    type Device = D;

    fn engine(&self) -> &Arc<Engine<D>> {
        &self.engine
    }

    fn snaps(&self) -> &Snapshots<D> {
        &self.snaps
    }

    fn view(&self, view: Arc<Engine<D>>) -> Arc<NineFs<D>> {
        self.view_handle(view)
    }
}

/// The snapshot streams (`features::streams`): send, receive, and the jobs of the
/// administration tree that run them.
impl<D: BlockDevice> NineFs<D> {
    /// Writes snapshot `name` as a stream to `out`: in full, or with `base` only what
    /// changed since that snapshot (of this filesystem). `ENOENT`: no such snapshot.
    pub async fn send(
        &self,
        name: &str,
        base: Option<&str>,
        out: &mut Sink<'_>,
    ) -> FsResult<SendStats> {
        send::send(self, name, base, out).await
    }

    /// [`NineFs::send`] to a sink that may wait.
    pub async fn send_to<S: StreamSink>(
        &self,
        name: &str,
        base: Option<&str>,
        out: &mut S,
    ) -> FsResult<SendStats> {
        send::send_to(self, name, base, out).await
    }

    /// Receives `stream` (checked whole first): makes the live tree the sent snapshot's
    /// tree and takes it as a snapshot of the sent name, which it returns.
    pub async fn receive(&self, stream: &[u8]) -> Result<SnapshotInfo, ReceiveError> {
        self.streams.receive(self, stream).await
    }

    /// [`NineFs::receive`] from a source read twice: once checked whole, once applied
    /// (the memory a receive takes is one record's, whatever the stream's size, plus
    /// what the check keeps of the inodes and entries the stream touches). A stream
    /// refused by the check changes nothing; one that fails while it is applied is
    /// rolled back ([`ReceiveError::RolledBack`]) before this returns.
    pub async fn receive_from(
        &self,
        src: &mut impl StreamSource,
    ) -> Result<SnapshotInfo, ReceiveError> {
        self.streams.receive_from(self, src).await
    }

    /// Rolls the live tree back to the last received snapshot, after local changes or
    /// a receive that stopped half way (a crash), so that the next incremental applies.
    /// Returns that snapshot's name. With none received, a full receive that stopped
    /// half way (its staging directory is there) is undone by emptying the live tree
    /// (`None`), as it was before; without one, there is nothing to roll back
    /// ([`ReceiveError::NothingToRollBack`]).
    pub async fn receive_rollback(&self) -> Result<Option<String>, ReceiveError> {
        self.streams.receive_rollback(self).await
    }

    /// `send start`: streams snapshot `name` (with `base`, the changes since that one)
    /// through the `send` file, replacing the send running.
    pub(crate) async fn send_start(
        &self,
        name: &str,
        base: Option<&str>,
    ) -> Result<String, String> {
        self.streams.send_start(self, name, base).await
    }

    /// `send stop`: whether a send was running.
    pub(crate) fn send_stop(&self) -> bool {
        self.streams.send_stop()
    }

    /// `receive start`: takes a stream through the `receive` file. Refused while one
    /// runs (stopping one half applied leaves the live tree for `receive rollback`, so
    /// that takes `receive stop`).
    pub(crate) fn receive_start(&self) -> Result<String, String> {
        self.streams.receive_start()
    }

    /// `receive stop`: whether a receive was running.
    pub(crate) fn receive_stop(&self) -> bool {
        self.streams.receive_stop()
    }

    /// Whether the running send reads snapshot `name` (which may not be deleted).
    pub(crate) fn sending(&self, name: &str) -> bool {
        self.streams.sending(name)
    }

    /// Lets each job's worker move `budget` more bytes (the owner calls it every tick,
    /// `stream_rate=`); what a tick leaves unused is not kept.
    pub fn stream_grant(&self, budget: u64) {
        self.streams.stream_grant(budget)
    }

    /// Runs the send jobs `send start` asks for, one at a time, for ever (the owner
    /// spawns it once).
    pub async fn send_worker(&self) {
        self.streams.send_worker(self).await
    }

    /// Runs the receive jobs `receive start` asks for, one at a time, for ever (the owner
    /// spawns it once).
    pub async fn receive_worker(&self) {
        self.streams.receive_worker(self).await
    }

    /// The `send` file: the next bytes of the stream at `offset` (read in order), waiting
    /// while none are ready; 0 at its end or with no send running; `EIO` if the send
    /// failed (`status` says why), `EINVAL` out of order.
    pub async fn send_read(&self, offset: u64, buf: &mut [u8]) -> FsResult<usize> {
        self.streams.send_read(offset, buf).await
    }

    /// The `receive` file: takes the stream's bytes at `offset` (in order; offset 0
    /// again starts the second pass once the first is checked), as many as the buffer
    /// has room for, waiting while it has none. `EINVAL` with no receive running (or it
    /// failed: `status` says why), out of order, or past the second pass.
    pub async fn receive_write(&self, offset: u64, data: &[u8]) -> FsResult<usize> {
        self.streams.receive_write(offset, data).await
    }

    /// The writer of `receive` closed it: the pass it wrote ends.
    pub fn receive_closed(&self) {
        self.streams.receive_closed()
    }

    /// The jobs' `status` lines.
    pub(crate) fn stream_status(&self, out: &mut String) {
        self.streams.stream_status(out)
    }

    /// The stream jobs' counters since the mount.
    pub fn stream_counters(&self) -> StreamCounters {
        self.streams.stream_counters()
    }
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
