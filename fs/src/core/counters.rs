//! Counters of a mounted filesystem, per cause where there is one (as bcachefs keeps
//! them), so policies can be compared by what they cost.
//!
//! With the `serde` feature they serialise as the appliance reports them: per-cause
//! arrays as maps from the cause's name (`checkpoints: {"sync": 3, ...}`), node writes
//! as `node_writes: {cause: {writes, bytes}}` with `node_appends`/`node_rewrites` beside.

use crate::btree::{NodeWriteCounters, WriteCause};

/// Filesystem counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FsStats {
    /// Transactions committed.
    pub commits: u64,
    /// Checkpoints committed, indexed like [`CheckpointCause::ALL`].
    #[cfg_attr(feature = "serde", serde(serialize_with = "by_cause::checkpoints"))]
    pub checkpoints: [u64; CheckpointCause::ALL.len()],
    /// Node writes and bytes per cause.
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub node_writes: NodeWriteCounters,
    /// Bitmap group blocks written.
    pub group_writes: u64,
    /// Superblock writes.
    pub superblock_writes: u64,
    /// Device flushes issued.
    pub flushes: u64,
    /// Btree nodes read from the device.
    pub node_loads: u64,
    /// Bytes of btree nodes read.
    pub node_load_bytes: u64,
    /// Bitmap groups read.
    pub group_loads: u64,
    /// Data bytes written to the device.
    pub data_bytes_written: u64,
    /// Data bytes read from the device.
    pub data_bytes_read: u64,
    /// Nodes evicted from the cache.
    pub evictions: u64,
    /// Checksum or decoding failures seen (each also logged).
    pub corruptions: u64,
    /// `link`, `mkdir` and directory `rename` refused with `EMLINK` at the link limit.
    pub link_limit_hits: u64,
    /// Writes, clones and creates refused with `EDQUOT` at a project's limit.
    pub quota_exceeded: u64,
    /// Discard requests sent to the device for freed blocks.
    pub discards: u64,
    /// Blocks discarded.
    pub discarded_blocks: u64,
    /// Discards the device failed (the blocks are free all the same; logged).
    pub discard_errors: u64,
    /// Times the filesystem grew to a larger device.
    pub grows: u64,
    /// Blocks added by growth.
    pub grown_blocks: u64,
    /// Replacements of a mirrored volume's leg started (`replace`).
    pub rebuild_starts: u64,
    /// Rebuilds completed: the replaced leg in service.
    pub rebuilds: u64,
    /// Rebuilds ended by the new leg failing.
    pub rebuild_failures: u64,
    /// Blocks copied to a leg being rebuilt.
    pub rebuild_blocks: u64,
    /// Copies done again, or put off, because a write over the same blocks was in
    /// flight or started meanwhile.
    pub rebuild_retries: u64,
    /// Blocks copied although they failed their checksum (or a read) on every leg in
    /// service (each also logged).
    pub rebuild_unverified: u64,
    /// 1 while a leg is being rebuilt.
    pub rebuild_running: u64,
    /// Where the rebuild's copy is (a block number; of `rebuild_total`).
    pub rebuild_cursor: u64,
    /// Blocks of the filesystem, the rebuild cursor's end.
    pub rebuild_total: u64,
    /// Scrub passes completed.
    pub scrub_runs: u64,
    /// Bytes of nodes and data read and verified by scrub.
    pub scrub_bytes: u64,
    /// Blocks scrub found failing their checksum or unreadable (each also logged).
    pub scrub_errors: u64,
    /// 1 while a scrub pass is running, else 0.
    pub scrub_running: u64,
    /// 1 once a failed write or FLUSH, or a commit that failed its checks, made the
    /// filesystem refuse every request with `EIO` (logged when it happens;
    /// docs/durability.md, "Device errors" and "Broken invariants"), else 0.
    pub failed: u64,
    /// Devices of a mirrored volume (a gauge; 0 on a single device).
    pub legs: u64,
    /// Devices of a mirrored volume out of service: failed, missing or stale (a gauge;
    /// the volume serves from the others). Per-leg errors and repairs are the mirror's.
    pub failed_legs: u64,
    /// Snapshots taken.
    pub snapshots_created: u64,
    /// Snapshots deleted.
    pub snapshots_deleted: u64,
    /// Snapshot creations refused with `ENOSPC` at the snapshot limit.
    pub snapshot_limit_hits: u64,
    /// Snapshots that exist (a gauge).
    pub snapshots: u64,
    /// Snapshot views closed to open another (at most `snapshot::MAX_OPEN_VIEWS` are
    /// open; a closed one is opened again, with a cold cache, when next read).
    pub snapshot_views_closed: u64,
    /// Blocks snapshots hold that the live filesystem no longer references, as far as
    /// this mount has seen (a gauge: the space snapshots pin).
    pub snapshot_held_blocks: u64,
    /// Use of the one lock around the filesystem's state.
    pub core_lock: LockStats,
    /// The fsync log.
    pub log: LogStats,
}

/// Log counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LogStats {
    /// `fsync` calls on files.
    pub fsyncs: u64,
    /// `fdatasync` calls on files.
    pub fdatasyncs: u64,
    /// `fsync`/`fdatasync` calls on directories.
    pub dir_fsyncs: u64,
    /// Syncs that found nothing to log or wait for.
    pub clean: u64,
    /// Syncs whose record another sync's commit made durable.
    pub joined: u64,
    /// Log commits (each one device FLUSH).
    pub commits: u64,
    /// Log blocks written.
    pub blocks: u64,
    /// Record bytes written (payload, without block headers and padding).
    pub record_bytes: u64,
    /// Records written.
    pub records: u64,
    /// Inodes logged (an inode can be logged as the target or for another's path).
    pub inodes: u64,
    /// Syncs served by a checkpoint instead of the log, per [`Fallback`] reason.
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "crate::core::counters::by_cause::fallbacks")
    )]
    pub fallbacks: [u64; Fallback::ALL.len()],
    /// Syncs that waited for a checkpoint in flight (their changes were in it).
    pub checkpoint_waits: u64,
    /// Commits that found the log full and ran a checkpoint first.
    pub full: u64,
    /// Extents whose checksums were checked against the log's index of checksums already
    /// logged (inodes with extents shared since the last checkpoint).
    pub csum_lookups: u64,
    /// Extents whose checksums were logged without that check (no new shared extents:
    /// `last_reflink_trans`).
    pub csum_lookups_skipped: u64,
    /// Checksum records left out because the log already had them.
    pub csum_dedups: u64,
    /// Xattr searches made while logging.
    pub xattr_searches: u64,
    /// Xattr searches skipped because the inode is known to have none (`no_xattrs`).
    pub xattr_searches_skipped: u64,
    /// Record buffers taken from the pool (no allocation).
    pub scratch_reused: u64,
    /// Record buffers allocated (always before any lock is taken).
    pub scratch_allocated: u64,
    /// Record builds retried because the reserved buffer was too small.
    pub scratch_regrown: u64,
    /// Commits that reused the commit buffer.
    pub commit_buffer_reused: u64,
    /// Commits replayed at mount.
    pub replayed_commits: u64,
    /// Records replayed.
    pub replayed_records: u64,
    /// Distinct inodes replayed.
    pub replayed_inodes: u64,
    /// Record bytes replayed.
    pub replayed_bytes: u64,
    /// Complete commits not replayed because their data did not reach the disk.
    pub dropped_commits: u64,
    /// Commits replayed although the device could not read some of their data blocks.
    pub unverified_commits: u64,
    /// Commits replay refused (1 at most: replay stops there; the filesystem is then
    /// read-only), see [`LogState::refused`].
    pub refused_commits: u64,
}

/// Why a sync is served by a checkpoint instead of the log (the "trouble cases").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// A directory lost more names since the last checkpoint than are remembered, so a
    /// new name in it or a directory fsync cannot be logged safely.
    RemovedOverflow,
    /// The sync would log more than [`MAX_INODES`] inodes.
    TooManyInodes,
    /// The records would take more than a quarter of the log.
    RecordTooLarge,
}

impl Fallback {
    /// All reasons, in counter order.
    pub const ALL: [Fallback; 3] = [
        Fallback::RemovedOverflow,
        Fallback::TooManyInodes,
        Fallback::RecordTooLarge,
    ];

    /// Index in the counters.
    pub fn index(self) -> usize {
        Fallback::ALL
            .iter()
            .position(|&f| f == self)
            .expect("listed")
    }

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            Fallback::RemovedOverflow => "removed_overflow",
            Fallback::TooManyInodes => "too_many_inodes",
            Fallback::RecordTooLarge => "record_too_large",
        }
    }
}

/// Why a checkpoint runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointCause {
    /// `sync`.
    Sync,
    /// An fsync the log does not handle (a trouble case, see `log::Fallback`).
    Fsync,
    /// Clean unmount.
    Unmount,
    /// The node cache is over its limit with nothing clean left to evict.
    CacheReclaim,
    /// The log needs its space back (more than half used, or full).
    LogReclaim,
    /// An operation ran out of space; a checkpoint releases freed blocks.
    Space,
    /// Too much metadata is dirty for the metadata reserve.
    Reserve,
    /// Mount replayed the log: commit what it recovered and start a new log epoch.
    Replay,
    /// Blocks were freed a while ago and nothing else committed their release: commit it,
    /// so they are given back to the device (discarded) soon after the deletion.
    Discard,
    /// The filesystem grew to a larger device.
    Grow,
    /// A snapshot is taken or deleted: it starts from, and is committed by, a checkpoint.
    Snapshot,
    /// A quota root is made or its limits change (`set_quota`): committed by a checkpoint.
    Quota,
}

impl CheckpointCause {
    /// All causes, in counter order.
    pub const ALL: [CheckpointCause; 12] = [
        CheckpointCause::Sync,
        CheckpointCause::Fsync,
        CheckpointCause::Unmount,
        CheckpointCause::CacheReclaim,
        CheckpointCause::LogReclaim,
        CheckpointCause::Space,
        CheckpointCause::Reserve,
        CheckpointCause::Replay,
        CheckpointCause::Discard,
        CheckpointCause::Grow,
        CheckpointCause::Snapshot,
        CheckpointCause::Quota,
    ];

    /// The cause counted for leaf writes of such a checkpoint.
    pub fn leaf_cause(self) -> WriteCause {
        match self {
            CheckpointCause::CacheReclaim | CheckpointCause::Reserve => WriteCause::CacheReclaim,
            CheckpointCause::LogReclaim | CheckpointCause::Replay => WriteCause::LogReclaim,
            _ => WriteCause::Sync,
        }
    }

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            CheckpointCause::Sync => "sync",
            CheckpointCause::Fsync => "fsync_fallback",
            CheckpointCause::Unmount => "unmount",
            CheckpointCause::CacheReclaim => "cache_reclaim",
            CheckpointCause::LogReclaim => "log_reclaim",
            CheckpointCause::Space => "space",
            CheckpointCause::Reserve => "reserve",
            CheckpointCause::Replay => "replay",
            CheckpointCause::Discard => "discard",
            CheckpointCause::Grow => "grow",
            CheckpointCause::Snapshot => "snapshot",
            CheckpointCause::Quota => "quota",
        }
    }

    /// Index in the counters ([`CheckpointCause::ALL`] order).
    pub fn index(self) -> usize {
        CheckpointCause::ALL
            .iter()
            .position(|&c| c == self)
            .expect("listed")
    }
}

/// How the one lock around the filesystem's state (`Core`) is used: every operation
/// takes it, so these say whether it is what limits the CPUs serving the filesystem.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LockStats {
    /// Times the lock was taken.
    pub acquisitions: u64,
    /// Acquisitions that found it held (by another CPU) and had to spin.
    pub contended: u64,
    /// Nanoseconds it was held, in total; 0 unless holds are timed
    /// ([`MountOptions::hold_clock`](crate::volume::MountOptions::hold_clock)).
    pub hold_ns: u64,
    /// The longest single hold so far, in nanoseconds (timed as `hold_ns`).
    pub max_hold_ns: u64,
}

impl LockStats {
    /// Mean hold in nanoseconds (0 before the first acquisition, or untimed).
    pub fn mean_hold_ns(&self) -> u64 {
        self.hold_ns.checked_div(self.acquisitions).unwrap_or(0)
    }
}

impl FsStats {
    /// Total checkpoints.
    pub fn total_checkpoints(&self) -> u64 {
        self.checkpoints.iter().sum()
    }
}

/// Per-cause arrays as maps from the cause's name.
#[cfg(feature = "serde")]
pub(crate) mod by_cause {
    use serde::ser::Serializer;

    use crate::util::by_name::map;

    use super::CheckpointCause;
    use super::Fallback;

    pub(crate) fn checkpoints<S: Serializer>(
        v: &[u64; CheckpointCause::ALL.len()],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        map(CheckpointCause::ALL.iter().map(|c| c.name()), v, s)
    }

    pub(crate) fn fallbacks<S: Serializer>(
        v: &[u64; Fallback::ALL.len()],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        map(Fallback::ALL.iter().map(|f| f.name()), v, s)
    }
}
